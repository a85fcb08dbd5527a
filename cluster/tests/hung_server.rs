//! A server whose process hangs (stopped with SIGSTOP: its TCP connections stay open and
//! no reset ever comes, as when its host vanishes) is found by the client's HTTP/2 pings,
//! not by the call's deadline. This test binary starts itself again running the ignored
//! `server` test.

#![cfg(unix)]

use bytes::Bytes;
use ferroflow_cluster::{Connector, TaskServer};
use ferroflow_tensor::Error;
use std::io::{BufRead, BufReader};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

/// The stopped server is continued and killed on drop (a failing assertion included).
struct Server(Child);

impl Drop for Server {
    fn drop(&mut self) {
        // SAFETY: signals to a child this process started and has not reaped.
        unsafe {
            libc::kill(self.0.id() as libc::pid_t, libc::SIGCONT);
        }
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// The child: serves `echo` on a port the OS picks, says where, and waits (at most 120 s).
#[test]
#[ignore = "run by the test below as a child process"]
fn server() {
    let server = TaskServer::start("127.0.0.1:0", None).unwrap();
    server.handle("echo", Ok);
    println!("server: serving on {}", server.local_addr());
    std::thread::sleep(Duration::from_secs(120));
}

/// Returns once process `pid` is stopped (its state `T` in `/proc`, at most 10 s), or
/// after 300 ms where there is no `/proc`: a signal reaches a process running on another
/// core a moment after `kill` returns, and a call sent in that moment is still answered.
fn wait_until_stopped(pid: u32) {
    let stat = format!("/proc/{pid}/stat");
    if std::fs::metadata(&stat).is_err() {
        std::thread::sleep(Duration::from_millis(300));
        return;
    }
    let end = Instant::now() + Duration::from_secs(10);
    while Instant::now() < end {
        // `pid (comm) state ...`: the state follows the last `)`.
        let text = std::fs::read_to_string(&stat).unwrap_or_default();
        let state = text
            .rsplit_once(')')
            .and_then(|(_, r)| r.trim_start().chars().next());
        if state == Some('T') {
            return;
        }
        std::thread::sleep(Duration::from_millis(5));
    }
    panic!("the server did not stop within 10 s");
}

#[test]
fn a_call_to_a_hung_server_fails_when_its_pings_go_unanswered_not_at_its_deadline() {
    // Pings every 0.5 s, each answered within 0.5 s (the default is 10 s).
    std::env::set_var("FERROFLOW_KEEPALIVE_SECONDS", "0.5");
    let mut child = Server(
        Command::new(std::env::current_exe().unwrap())
            .args(["--ignored", "--exact", "server", "--nocapture"])
            .stdout(Stdio::piped())
            .stderr(Stdio::inherit())
            .spawn()
            .unwrap(),
    );
    let out = child.0.stdout.take().unwrap();
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        for line in BufReader::new(out).lines().map_while(|l| l.ok()) {
            if let Some(at) = line.find("serving on ") {
                let _ = tx.send(line[at + "serving on ".len()..].trim().to_string());
            }
        }
    });
    let address = rx
        .recv_timeout(Duration::from_secs(60))
        .expect("the server said nothing in 60 s");
    let connector = Connector::new(None).unwrap();
    let deadline = Duration::from_secs(60);
    let peer = connector.peer("the server", &address, deadline).unwrap();
    // The connection is up and answers.
    assert_eq!(peer.call("echo", Bytes::from_static(b"hi")).unwrap(), "hi");
    // Idle and alive: the pings are answered and the connection stays.
    std::thread::sleep(Duration::from_secs(2));
    assert_eq!(peer.call("echo", Bytes::from_static(b"hi")).unwrap(), "hi");
    // SAFETY: a signal to the child this test started and has not reaped.
    assert_eq!(
        unsafe { libc::kill(child.0.id() as libc::pid_t, libc::SIGSTOP) },
        0
    );
    wait_until_stopped(child.0.id());
    let started = Instant::now();
    let err = peer
        .start_call("echo", Bytes::from_static(b"hi"), false)
        .wait()
        .unwrap_err();
    let took = started.elapsed();
    assert!(
        matches!(&err, Error::Unavailable { peer, .. } if peer.contains(&address)),
        "{err:?}"
    );
    assert!(
        took < Duration::from_secs(10),
        "the hung server was found after {took:?} (the call's deadline: {deadline:?})"
    );
    eprintln!("a hung server found after {took:?}: {err}");
}
