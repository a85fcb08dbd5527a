//! Direct connections (`TaskServer::direct_listener`, `TaskServer::connect_direct`): replies
//! in the order of the requests, the token, frames over the limit, a reply that is late, a
//! server that goes away. The server side is a thread of this test answering with
//! `DirectConnection::serve_readable`, as a parameter-server worker's function thread does.

use ferroflow_cluster::{DirectConnection, DirectListener, TaskServer, MAX_MESSAGE_BYTES};
use ferroflow_tensor::Error;
use std::io::{Read, Write};
use std::net::TcpStream;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

const TOKEN: &str = "direct-test-token";

/// A server thread answering every request with `answer`, until dropped (at most 60 s).
struct Answering {
    stop: Arc<AtomicBool>,
    thread: Option<JoinHandle<()>>,
    port: u16,
    _server: TaskServer,
}

impl Answering {
    fn start(
        answer: impl FnMut(bytes::Bytes) -> Result<Vec<u8>, String> + Send + 'static,
    ) -> Answering {
        let server = TaskServer::start("127.0.0.1:0", Some(TOKEN)).unwrap();
        let listener: DirectListener = server.direct_listener().unwrap();
        let port = listener.port();
        let stop = Arc::new(AtomicBool::new(false));
        let stopping = stop.clone();
        let mut answer = answer;
        let thread = std::thread::spawn(move || {
            let end = Instant::now() + Duration::from_secs(60);
            let mut connections: Vec<DirectConnection> = vec![];
            while !stopping.load(Ordering::Relaxed) && Instant::now() < end {
                while let Ok(Some(c)) = listener.accept() {
                    connections.push(c);
                }
                // Without `poll`, each read waits at most its 100 ms timeout.
                connections.retain_mut(|c| matches!(c.serve_readable(&mut answer), Ok(true)));
                std::thread::sleep(Duration::from_millis(1));
            }
        });
        Answering {
            stop,
            thread: Some(thread),
            port,
            _server: server,
        }
    }

    fn address(&self) -> String {
        format!("127.0.0.1:{}", self.port)
    }
}

impl Drop for Answering {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

fn client(token: Option<&str>) -> TaskServer {
    TaskServer::start("127.0.0.1:0", token).unwrap()
}

const TIMEOUT: Duration = Duration::from_secs(5);

#[test]
fn replies_come_back_in_the_order_of_the_requests() {
    let answering = Answering::start(|r| {
        let mut reply = b"re: ".to_vec();
        reply.extend_from_slice(&r);
        Ok(reply)
    });
    let c = client(Some(TOKEN));
    let direct = c
        .connect_direct("/job:worker/task:0", &answering.address(), TIMEOUT)
        .unwrap();
    // Several in flight at once, one of them large (read in several pieces).
    let big = vec![7u8; 3 << 20];
    direct.send(b"one").unwrap();
    direct.send(&big).unwrap();
    direct.send(b"").unwrap();
    assert_eq!(&direct.receive(TIMEOUT).unwrap().unwrap()[..], b"re: one");
    let got = direct.receive(TIMEOUT).unwrap().unwrap();
    assert_eq!(got.len(), 4 + big.len());
    assert!(got[4..].iter().all(|&b| b == 7));
    assert_eq!(&direct.receive(TIMEOUT).unwrap().unwrap()[..], b"re: ");
}

#[test]
fn an_error_answer_is_a_remote_error_and_the_connection_goes_on() {
    let answering = Answering::start(|r| {
        if &r[..] == b"bad" {
            Err("that request is malformed".to_string())
        } else {
            Ok(r.to_vec())
        }
    });
    let c = client(Some(TOKEN));
    let direct = c
        .connect_direct("/job:worker/task:3", &answering.address(), TIMEOUT)
        .unwrap();
    direct.send(b"bad").unwrap();
    let e = direct.receive(TIMEOUT).unwrap_err();
    assert!(matches!(e, Error::Remote { .. }), "{e:?}");
    let text = e.to_string();
    assert!(
        text.contains("malformed") && text.contains("/job:worker/task:3"),
        "{text}"
    );
    direct.send(b"good").unwrap();
    assert_eq!(&direct.receive(TIMEOUT).unwrap().unwrap()[..], b"good");
}

#[test]
fn a_wrong_token_is_refused_by_name_and_the_server_goes_on_serving() {
    let answering = Answering::start(|r| Ok(r.to_vec()));
    for token in [Some("wrong"), None] {
        let stranger = client(token);
        let e = match stranger.connect_direct("/job:worker/task:0", &answering.address(), TIMEOUT) {
            Err(e) => e.to_string(),
            Ok(_) => panic!("a client with the token {token:?} was let in"),
        };
        assert!(
            e.contains("FERROFLOW_CLUSTER_TOKEN") && e.contains("/job:worker/task:0"),
            "{e}"
        );
    }
    let friend = client(Some(TOKEN));
    let direct = friend
        .connect_direct("/job:worker/task:0", &answering.address(), TIMEOUT)
        .unwrap();
    direct.send(b"still here").unwrap();
    assert_eq!(
        &direct.receive(TIMEOUT).unwrap().unwrap()[..],
        b"still here"
    );
}

/// Reads one reply frame from a raw connection: its kind byte and the rest.
fn raw_reply(s: &mut TcpStream) -> (u8, Vec<u8>) {
    let mut len = [0u8; 4];
    s.read_exact(&mut len).unwrap();
    let mut frame = vec![0u8; u32::from_le_bytes(len) as usize];
    s.read_exact(&mut frame).unwrap();
    (frame[0], frame[1..].to_vec())
}

#[test]
fn a_frame_over_the_limit_is_an_error_reply_and_the_connection_closes() {
    let answering = Answering::start(|r| Ok(r.to_vec()));
    let mut raw = TcpStream::connect(answering.address()).unwrap();
    raw.set_read_timeout(Some(TIMEOUT)).unwrap();
    let mut greeting = (TOKEN.len() as u32).to_le_bytes().to_vec();
    greeting.extend_from_slice(TOKEN.as_bytes());
    raw.write_all(&greeting).unwrap();
    assert_eq!(raw_reply(&mut raw), (0, vec![]));
    // A length past the limit (no bytes follow: the server must not wait for them).
    let over = (MAX_MESSAGE_BYTES as u32 + 1).to_le_bytes();
    raw.write_all(&over).unwrap();
    let (kind, text) = raw_reply(&mut raw);
    let text = String::from_utf8_lossy(&text).into_owned();
    assert_eq!(kind, 1, "{text}");
    assert!(text.contains("larger than the limit"), "{text}");
    let mut rest = [0u8; 1];
    assert_eq!(
        raw.read(&mut rest).unwrap(),
        0,
        "the server closes the connection"
    );
    // Others are served.
    let c = client(Some(TOKEN));
    let direct = c
        .connect_direct("/job:worker/task:0", &answering.address(), TIMEOUT)
        .unwrap();
    direct.send(b"next").unwrap();
    assert_eq!(&direct.receive(TIMEOUT).unwrap().unwrap()[..], b"next");
}

#[test]
fn a_late_reply_is_not_lost_and_a_server_that_goes_away_is_unavailable() {
    let answering = Answering::start(|r| {
        if &r[..] == b"slow" {
            std::thread::sleep(Duration::from_millis(400));
        }
        Ok(r.to_vec())
    });
    let c = client(Some(TOKEN));
    let direct = c
        .connect_direct("/job:worker/task:1", &answering.address(), TIMEOUT)
        .unwrap();
    direct.send(b"slow").unwrap();
    let t = Instant::now();
    assert!(direct.receive(Duration::from_millis(50)).unwrap().is_none());
    assert!(
        t.elapsed() < Duration::from_millis(300),
        "{:?}",
        t.elapsed()
    );
    assert_eq!(&direct.receive(TIMEOUT).unwrap().unwrap()[..], b"slow");
    drop(answering);
    direct.send(b"anyone?").ok();
    let e = direct.receive(TIMEOUT).unwrap_err();
    assert!(matches!(e, Error::Unavailable { .. }), "{e:?}");
    assert!(e.to_string().contains("/job:worker/task:1"), "{e}");
}

#[test]
fn connecting_to_a_port_nobody_listens_on_is_unavailable_naming_it() {
    let free = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let address = free.local_addr().unwrap().to_string();
    drop(free);
    let c = client(Some(TOKEN));
    let e = match c.connect_direct("/job:worker/task:2", &address, TIMEOUT) {
        Err(e) => e,
        Ok(_) => panic!("connected to {address}, where nobody listens"),
    };
    assert!(matches!(e, Error::Unavailable { .. }), "{e:?}");
    let text = e.to_string();
    assert!(
        text.contains("/job:worker/task:2") && text.contains(&address),
        "{text}"
    );
}

#[test]
fn a_greeting_longer_than_a_token_is_refused_before_any_of_it_is_read() {
    let answering = Answering::start(|r| Ok(r.to_vec()));
    let mut raw = TcpStream::connect(answering.address()).unwrap();
    raw.set_read_timeout(Some(TIMEOUT)).unwrap();
    // A stranger claiming a 512 MiB first frame: answered at once, nothing reserved for it.
    raw.write_all(&(512u32 << 20).to_le_bytes()).unwrap();
    let (kind, text) = raw_reply(&mut raw);
    let text = String::from_utf8_lossy(&text).into_owned();
    assert_eq!(kind, 1, "{text}");
    assert!(text.contains("larger than the limit of 65536"), "{text}");
    let mut rest = [0u8; 1];
    assert_eq!(
        raw.read(&mut rest).unwrap(),
        0,
        "the server closes the connection"
    );
}

#[cfg(unix)]
#[test]
fn poll_readable_polls_until_its_busy_deadline_then_sleeps_until_its_timeout() {
    use std::os::fd::AsRawFd;
    let (a, mut b) = std::os::unix::net::UnixStream::pair().unwrap();
    let mut fds = [ferroflow_cluster::readable(a.as_raw_fd())];
    // Nothing arrives: the busy phase lasts until its deadline, a zero timeout adds nothing.
    let t = Instant::now();
    let busy = Duration::from_millis(30);
    let ready = ferroflow_cluster::poll_readable(&mut fds, t + busy, Some(Duration::ZERO));
    assert_eq!(ready.unwrap(), 0);
    assert!(t.elapsed() >= busy, "{:?}", t.elapsed());
    assert!(t.elapsed() < Duration::from_secs(2), "{:?}", t.elapsed());
    // Nothing arrives: after a short busy phase, it sleeps for the timeout.
    let t = Instant::now();
    let timeout = Duration::from_millis(40);
    let ready = ferroflow_cluster::poll_readable(&mut fds, t, Some(timeout));
    assert_eq!(ready.unwrap(), 0);
    assert!(t.elapsed() >= timeout, "{:?}", t.elapsed());
    assert!(t.elapsed() < Duration::from_secs(2), "{:?}", t.elapsed());
    // A byte that comes during the sleep ends it, and `revents` says which.
    let writer = std::thread::spawn(move || {
        std::thread::sleep(Duration::from_millis(50));
        b.write_all(b"x").unwrap();
        b
    });
    let t = Instant::now();
    let ready = ferroflow_cluster::poll_readable(&mut fds, t, Some(Duration::from_secs(20)));
    assert_eq!(ready.unwrap(), 1);
    assert!(fds[0].revents & libc::POLLIN != 0);
    assert!(t.elapsed() < Duration::from_secs(10), "{:?}", t.elapsed());
    // Already readable: found in the busy phase, at once.
    let t = Instant::now();
    let ready = ferroflow_cluster::poll_readable(
        &mut fds,
        t + Duration::from_secs(5),
        Some(Duration::ZERO),
    );
    assert_eq!(ready.unwrap(), 1);
    assert!(t.elapsed() < Duration::from_secs(2), "{:?}", t.elapsed());
    drop(writer.join().unwrap());
}

#[test]
fn quick_replies_polled_for_and_a_slow_one_waited_for_all_arrive_in_order() {
    let answering = Answering::start(|r| {
        if &r[..] == b"slow" {
            std::thread::sleep(Duration::from_millis(300));
        }
        Ok(r.to_vec())
    });
    let c = client(Some(TOKEN));
    let direct = c
        .connect_direct("/job:worker/task:2", &answering.address(), TIMEOUT)
        .unwrap();
    for round in 0..3 {
        for i in 0..20u8 {
            direct.send(&[round, i]).unwrap();
            assert_eq!(&direct.receive(TIMEOUT).unwrap().unwrap()[..], &[round, i]);
        }
        direct.send(b"slow").unwrap();
        assert_eq!(&direct.receive(TIMEOUT).unwrap().unwrap()[..], b"slow");
    }
}
