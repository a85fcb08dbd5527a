//! Direct connections: one request/reply method of a task served over a TCP connection of
//! its own, beside the task's gRPC server, for calls whose cost is their round trip (a
//! parameter-server job's scheduled functions).
//!
//! A gRPC call crosses six threads on its way and back (the caller → the client's runtime,
//! the server's runtime → the thread that answers and back, the client's runtime → the
//! caller): on a 2-vCPU VM each hand-off costs ~20 µs. A direct connection is read by the
//! thread that answers it and by the thread that waits for the answer: two hand-offs.
//!
//! Frames both ways: a little-endian `u32` length, then that many bytes, at most
//! [`MAX_MESSAGE_BYTES`]. A reply frame's first byte says what it is: 0 an answer (the
//! rest), 1 an error (the rest, as text). The first frame a client sends is the cluster
//! token (empty without one); the server answers an empty answer, or an error naming the
//! token and closes. A frame over the limit is an error reply, and the connection closes
//! (its bytes cannot be skipped safely).
//!
//! Both ends poll before they sleep (see [`busy_poll_window`]): on a VM a thread that
//! sleeps in the kernel and is woken by a packet pays the hypervisor's wake-up of an idle
//! vCPU, 40–100 µs on the 2-vCPU VM the benchmarks ran on, twice per round trip.
//!
//! ```
//! use ferroflow_cluster::TaskServer;
//! use std::time::Duration;
//! let server = TaskServer::start("127.0.0.1:0", Some("secret"))?;
//! let listener = server.direct_listener()?;
//! let address = format!("127.0.0.1:{}", listener.port());
//! let answering = std::thread::spawn(move || -> std::io::Result<()> {
//!     // A real server waits with `poll` on `as_raw_fd()`; this one has one client.
//!     let mut connection = loop {
//!         match listener.accept()? {
//!             Some(c) => break c,
//!             None => std::thread::sleep(Duration::from_millis(1)),
//!         }
//!     };
//!     // The token, then one request.
//!     while connection.serve_readable(&mut |request| Ok(request.to_ascii_uppercase()))? {
//!         std::thread::sleep(Duration::from_millis(1));
//!     }
//!     Ok(())
//! });
//! let client = TaskServer::start("127.0.0.1:0", Some("secret"))?;
//! let direct = client.connect_direct("/job:worker/task:0", &address, Duration::from_secs(5))?;
//! direct.send(b"hello")?;
//! assert_eq!(&direct.receive(Duration::from_secs(5))?.unwrap()[..], b"HELLO");
//! drop(direct);
//! answering.join().unwrap().unwrap();
//! # Ok::<(), ferroflow_tensor::Error>(())
//! ```

use crate::MAX_MESSAGE_BYTES;
use bytes::{Bytes, BytesMut};
use ferroflow_tensor::{Error, Result};
use std::io::{ErrorKind, Read, Write};
use std::net::{TcpListener, TcpStream, ToSocketAddrs};
use std::sync::{Arc, Mutex, OnceLock};
use std::time::{Duration, Instant};

/// How long a thread that serves or awaits direct calls keeps polling its sockets
/// (yielding the CPU between polls) before it sleeps in the kernel:
/// `FERROFLOW_BUSY_POLL_MICROS` microseconds, 200 by default, 0 to never poll; read once.
///
/// A worker's function thread polls this long after each request it answered (the next
/// one of a tight schedule/fetch loop comes within a round trip); a [`DirectClient`]
/// polls for a reply when the previous one came within the window, and a parameter-server
/// `RemoteValue::fetch` before it waits. The cost is CPU time: at most the window per
/// request, given up to any other thread that is ready to run on that CPU.
///
/// ```
/// assert!(ferroflow_cluster::busy_poll_window() <= std::time::Duration::from_secs(1));
/// ```
pub fn busy_poll_window() -> Duration {
    static WINDOW: OnceLock<Duration> = OnceLock::new();
    *WINDOW.get_or_init(|| window_from(std::env::var("FERROFLOW_BUSY_POLL_MICROS").ok()))
}

/// The busy-poll window `FERROFLOW_BUSY_POLL_MICROS` set to `value` says: 200 µs when
/// unset or not a whole number, at most a second.
fn window_from(value: Option<String>) -> Duration {
    let micros = value
        .and_then(|v| v.trim().parse::<u64>().ok())
        .unwrap_or(200);
    Duration::from_micros(micros.min(1_000_000))
}

/// Calls `ready` until it gives a value or `until` has passed, yielding the CPU between
/// calls (it is called at least once): the polling before a sleep that
/// [`busy_poll_window`] bounds. `None` when `until` came first.
///
/// ```
/// use std::time::{Duration, Instant};
/// let mut calls = 0;
/// let third = ferroflow_cluster::busy_wait(Instant::now() + Duration::from_secs(5), || {
///     calls += 1;
///     (calls == 3).then_some("ready")
/// });
/// assert_eq!(third, Some("ready"));
/// assert_eq!(ferroflow_cluster::busy_wait(Instant::now(), || None::<()>), None);
/// ```
pub fn busy_wait<T>(until: Instant, mut ready: impl FnMut() -> Option<T>) -> Option<T> {
    loop {
        if let Some(value) = ready() {
            return Some(value);
        }
        if Instant::now() >= until {
            return None;
        }
        std::thread::yield_now();
    }
}

/// The `poll(2)` entry that asks whether `fd` is readable (for [`poll_readable`]).
///
/// ```
/// use std::os::fd::AsRawFd;
/// let (a, _b) = std::os::unix::net::UnixStream::pair()?;
/// let entry = ferroflow_cluster::readable(a.as_raw_fd());
/// assert_eq!((entry.fd, entry.events, entry.revents), (a.as_raw_fd(), libc::POLLIN, 0));
/// # Ok::<(), std::io::Error>(())
/// ```
#[cfg(unix)]
pub fn readable(fd: std::os::fd::RawFd) -> libc::pollfd {
    libc::pollfd {
        fd,
        events: libc::POLLIN,
        revents: 0,
    }
}

/// Waits until one of `fds` is readable (their `revents` say which) and returns how many
/// are: polls without sleeping, yielding the CPU between polls, until `busy_until`, then
/// sleeps in `poll(2)` for at most `timeout` (`None`: until one is readable). `Ok(0)` when
/// none became readable in that time or a signal interrupted the wait.
///
/// ```
/// use std::os::fd::AsRawFd;
/// use std::time::{Duration, Instant};
/// let (a, mut b) = std::os::unix::net::UnixStream::pair()?;
/// let mut fds = [ferroflow_cluster::readable(a.as_raw_fd())];
/// let soon = Some(Duration::from_millis(1));
/// assert_eq!(ferroflow_cluster::poll_readable(&mut fds, Instant::now(), soon)?, 0);
/// std::io::Write::write_all(&mut b, b"x")?;
/// assert_eq!(ferroflow_cluster::poll_readable(&mut fds, Instant::now(), None)?, 1);
/// # Ok::<(), std::io::Error>(())
/// ```
#[cfg(unix)]
pub fn poll_readable(
    fds: &mut [libc::pollfd],
    busy_until: Instant,
    timeout: Option<Duration>,
) -> std::io::Result<usize> {
    let poll = |fds: &mut [libc::pollfd], millis: libc::c_int| {
        // SAFETY: `fds` is a live, exclusively borrowed array of `fds.len()` pollfd structs.
        let ready = unsafe { libc::poll(fds.as_mut_ptr(), fds.len() as libc::nfds_t, millis) };
        match ready {
            n if n >= 0 => Ok(n as usize),
            _ => match std::io::Error::last_os_error() {
                e if e.kind() == ErrorKind::Interrupted => Ok(0),
                e => Err(e),
            },
        }
    };
    let polled = busy_wait(busy_until, || match poll(fds, 0) {
        Ok(0) => None,
        readable_or_error => Some(readable_or_error),
    });
    match polled {
        Some(readable_or_error) => return readable_or_error,
        None if timeout == Some(Duration::ZERO) => return Ok(0),
        None => {}
    }
    let millis = timeout.map_or(-1, |t| {
        // Rounded up: a wait of 0.4 ms is not a poll that returns at once.
        t.as_micros().div_ceil(1000).min(libc::c_int::MAX as u128) as libc::c_int
    });
    poll(fds, millis)
}

/// A reply frame's first byte: an answer follows.
const ANSWER: u8 = 0;
/// A reply frame's first byte: an error message follows.
const ERROR: u8 = 1;

/// The largest greeting (the token frame) a server reads before the client is known.
const GREETING_LIMIT: usize = 64 << 10;

/// At most this much room is made ahead of the bytes that arrived (a frame's length is
/// the peer's word until its bytes are there).
const READ_AHEAD_LIMIT: usize = 16 << 20;

/// How long a server waits for a client to take a reply (its socket buffers full) before
/// it drops the connection.
const REPLY_WRITE_TIMEOUT: Duration = Duration::from_secs(10);

/// Writes one frame: the length, then `parts` one after another.
fn write_frame(stream: &mut TcpStream, parts: &[&[u8]]) -> std::io::Result<()> {
    let len: usize = parts.iter().map(|p| p.len()).sum();
    if len > MAX_MESSAGE_BYTES {
        return Err(std::io::Error::new(
            ErrorKind::InvalidInput,
            format!(
                "a message of {len} bytes is larger than the limit of {MAX_MESSAGE_BYTES} bytes"
            ),
        ));
    }
    let header = (len as u32).to_le_bytes();
    if len <= 64 << 10 {
        // One segment on the wire (the connection sends without delay).
        let mut frame = Vec::with_capacity(4 + len);
        frame.extend_from_slice(&header);
        for p in parts {
            frame.extend_from_slice(p);
        }
        stream.write_all(&frame)
    } else {
        stream.write_all(&header)?;
        parts.iter().try_for_each(|p| stream.write_all(p))
    }
}

/// Bytes read from a connection, cut into frames as they complete (each frame split off
/// the buffer, not copied).
#[derive(Default)]
struct FrameBuffer {
    /// Bytes read and not yet cut into frames.
    bytes: BytesMut,
}

/// What the buffer holds at its front.
enum Next {
    /// A whole frame.
    Frame(Bytes),
    /// Not a whole frame yet.
    Partial,
    /// A frame longer than the limit (its length).
    TooLong(usize),
}

impl FrameBuffer {
    /// Reads once from `stream` into the buffer: `Ok(false)` when the peer closed it.
    fn fill(&mut self, stream: &mut TcpStream) -> std::io::Result<bool> {
        // Room for the rest of the frame begun, when its length is known (one read for a
        // large message, as far as the socket delivers it), else for a few small ones.
        let rest = match self.bytes.first_chunk::<4>() {
            Some(h) if u32::from_le_bytes(*h) as usize <= MAX_MESSAGE_BYTES => {
                (4 + u32::from_le_bytes(*h) as usize).saturating_sub(self.bytes.len())
            }
            _ => 0,
        };
        let old = self.bytes.len();
        self.bytes
            .resize(old + rest.clamp(4096, READ_AHEAD_LIMIT), 0);
        let read = stream.read(&mut self.bytes[old..]);
        self.bytes.truncate(old + *read.as_ref().unwrap_or(&0));
        Ok(read? > 0)
    }

    /// The frame at the front, if whole; frames longer than `limit` are refused.
    fn next(&mut self, limit: usize) -> Next {
        let Some(header) = self.bytes.first_chunk::<4>() else {
            return Next::Partial;
        };
        let len = u32::from_le_bytes(*header) as usize;
        if len > limit {
            return Next::TooLong(len);
        }
        if self.bytes.len() < 4 + len {
            return Next::Partial;
        }
        bytes::Buf::advance(&mut self.bytes, 4);
        Next::Frame(self.bytes.split_to(len).freeze())
    }
}

fn too_long(len: usize, limit: usize) -> String {
    format!("a message of {len} bytes is larger than the limit of {limit} bytes")
}

/// The listening side of a task's direct connections: made by
/// [`crate::TaskServer::direct_listener`], it accepts without blocking, for a thread that
/// waits on it with `poll` beside its other work.
pub struct DirectListener {
    listener: TcpListener,
    token: Option<Arc<str>>,
}

impl DirectListener {
    /// Listens on `ip` at a port the OS picks; clients must send `token`.
    pub(crate) fn bind(ip: std::net::IpAddr, token: Option<Arc<str>>) -> Result<DirectListener> {
        let listener = TcpListener::bind((ip, 0))
            .and_then(|l| l.set_nonblocking(true).map(|()| l))
            .map_err(|e| Error::io("listening for direct connections", &e))?;
        Ok(DirectListener { listener, token })
    }

    /// The port it listens on (a client connects to the task's host at this port).
    pub fn port(&self) -> u16 {
        self.listener.local_addr().map_or(0, |a| a.port())
    }

    /// A client waiting to connect, if one is (`Ok(None)` when none is).
    pub fn accept(&self) -> std::io::Result<Option<DirectConnection>> {
        match self.listener.accept() {
            Ok((stream, _)) => {
                // Requests are read when `poll` says they are there; a reply waits at most
                // REPLY_WRITE_TIMEOUT for a client that does not read.
                stream.set_nonblocking(false)?;
                stream.set_nodelay(true)?;
                stream.set_write_timeout(Some(REPLY_WRITE_TIMEOUT))?;
                // A read never waits long, even when called with nothing there.
                stream.set_read_timeout(Some(Duration::from_millis(100)))?;
                Ok(Some(DirectConnection {
                    stream,
                    frames: FrameBuffer::default(),
                    authenticated: false,
                    token: self.token.clone(),
                }))
            }
            Err(e) if e.kind() == ErrorKind::WouldBlock => Ok(None),
            Err(e) => Err(e),
        }
    }
}

#[cfg(unix)]
impl std::os::fd::AsRawFd for DirectListener {
    fn as_raw_fd(&self) -> std::os::fd::RawFd {
        self.listener.as_raw_fd()
    }
}

/// A client's connection as its server sees it.
pub struct DirectConnection {
    stream: TcpStream,
    frames: FrameBuffer,
    authenticated: bool,
    token: Option<Arc<str>>,
}

#[cfg(unix)]
impl std::os::fd::AsRawFd for DirectConnection {
    fn as_raw_fd(&self) -> std::os::fd::RawFd {
        self.stream.as_raw_fd()
    }
}

impl DirectConnection {
    /// Reads what has arrived (call it when the connection is readable) and answers each
    /// whole request with `answer` (its `Err` goes back as an error reply). `Ok(false)`:
    /// the connection is over (the client closed it, sent the wrong token or a frame over
    /// the limit); drop it.
    pub fn serve_readable(
        &mut self,
        answer: &mut dyn FnMut(Bytes) -> std::result::Result<Vec<u8>, String>,
    ) -> std::io::Result<bool> {
        match self.frames.fill(&mut self.stream) {
            Ok(true) => {}
            Ok(false) => return Ok(false),
            Err(e) if matches!(e.kind(), ErrorKind::WouldBlock | ErrorKind::TimedOut) => {
                return Ok(true)
            }
            Err(e) if e.kind() == ErrorKind::Interrupted => return Ok(true),
            Err(e) => return Err(e),
        }
        loop {
            let limit = if self.authenticated {
                MAX_MESSAGE_BYTES
            } else {
                GREETING_LIMIT
            };
            match self.frames.next(limit) {
                Next::Partial => return Ok(true),
                Next::TooLong(len) => {
                    let msg = too_long(len, limit);
                    write_frame(&mut self.stream, &[&[ERROR], msg.as_bytes()])?;
                    return Ok(false);
                }
                Next::Frame(frame) if !self.authenticated => {
                    let expected = self.token.as_deref().unwrap_or("");
                    if frame[..] != *expected.as_bytes() {
                        let msg = "this task requires the cluster token (FERROFLOW_CLUSTER_TOKEN)";
                        write_frame(&mut self.stream, &[&[ERROR], msg.as_bytes()])?;
                        return Ok(false);
                    }
                    self.authenticated = true;
                    write_frame(&mut self.stream, &[&[ANSWER]])?;
                }
                Next::Frame(request) => match answer(request) {
                    Ok(reply) => write_frame(&mut self.stream, &[&[ANSWER], &reply])?,
                    Err(msg) => write_frame(&mut self.stream, &[&[ERROR], msg.as_bytes()])?,
                },
            }
        }
    }
}

/// A client's direct connection to a task (made by [`crate::TaskServer::connect_direct`]):
/// requests are sent from any thread, replies come back in the order of the requests, to
/// whichever thread reads them.
pub struct DirectClient {
    peer: String,
    writer: Mutex<TcpStream>,
    reader: Mutex<Reader>,
}

/// A client's reading half.
struct Reader {
    stream: TcpStream,
    frames: FrameBuffer,
    /// How long the last reply took to come, counted from when `receive` began to wait
    /// for it: shorter than the busy-poll window, the next reply is polled for.
    last_wait: Duration,
}

impl DirectClient {
    /// Connects to `address` (`host:port`) within `timeout` and presents `token`.
    pub(crate) fn connect(
        peer: &str,
        address: &str,
        token: Option<&str>,
        timeout: Duration,
    ) -> Result<DirectClient> {
        let unavailable = |msg: String| Error::Unavailable {
            op: "connect directly".into(),
            peer: format!("{peer} ({address})"),
            msg,
        };
        let addresses: Vec<_> = address
            .to_socket_addrs()
            .map_err(|e| unavailable(format!("cannot resolve {address:?}: {e}")))?
            .collect();
        let mut last = None;
        let stream = addresses
            .iter()
            .find_map(|a| {
                TcpStream::connect_timeout(a, timeout)
                    .map_err(|e| last = Some(e))
                    .ok()
            })
            .ok_or_else(|| {
                unavailable(last.map_or("no address to connect to".into(), |e| e.to_string()))
            })?;
        stream
            .set_nodelay(true)
            .and_then(|()| stream.set_write_timeout(Some(timeout)))
            .map_err(|e| unavailable(e.to_string()))?;
        let reader = stream.try_clone().map_err(|e| unavailable(e.to_string()))?;
        let client = DirectClient {
            peer: format!("{peer} ({address})"),
            writer: Mutex::new(stream),
            reader: Mutex::new(Reader {
                stream: reader,
                frames: FrameBuffer::default(),
                // The greeting's answer is polled for like a quick reply.
                last_wait: Duration::ZERO,
            }),
        };
        client.send(token.unwrap_or("").as_bytes())?;
        match client.receive(timeout)? {
            Some(_) => Ok(client),
            None => Err(unavailable(format!(
                "no answer to the greeting within {timeout:?}"
            ))),
        }
    }

    /// The task it reaches, and the address.
    pub fn peer(&self) -> &str {
        &self.peer
    }

    fn unavailable(&self, op: &str, msg: String) -> Error {
        Error::Unavailable {
            op: op.into(),
            peer: self.peer.clone(),
            msg,
        }
    }

    /// Sends one request (an error when the connection broke or the message is over the
    /// limit).
    pub fn send(&self, request: &[u8]) -> Result<()> {
        let mut stream = self.writer.lock().unwrap_or_else(|e| e.into_inner());
        write_frame(&mut stream, &[request]).map_err(|e| {
            if e.kind() == ErrorKind::InvalidInput {
                Error::invalid("a direct call", e.to_string())
            } else {
                self.unavailable("send a request", e.to_string())
            }
        })
    }

    /// The next reply, waiting at most `timeout`: `Ok(None)` when none came in that time
    /// (nothing is lost: a later call reads it); `Error::Remote` for an error reply (the
    /// server's message), `Error::Unavailable` when the connection broke.
    pub fn receive(&self, timeout: Duration) -> Result<Option<Bytes>> {
        let start = Instant::now();
        let deadline = start + timeout;
        let mut guard = self.reader.lock().unwrap_or_else(|e| e.into_inner());
        let Reader {
            stream,
            frames,
            last_wait,
        } = &mut *guard;
        let window = busy_poll_window();
        let mut busy_until = (*last_wait < window).then(|| (start + window).min(deadline));
        loop {
            match frames.next(MAX_MESSAGE_BYTES) {
                Next::Frame(frame) => {
                    *last_wait = start.elapsed();
                    return match frame.first() {
                        Some(&ANSWER) => Ok(Some(frame.slice(1..))),
                        Some(&ERROR) => Err(Error::Remote {
                            op: "a direct call".into(),
                            peer: self.peer.clone(),
                            msg: String::from_utf8_lossy(&frame[1..]).into_owned(),
                        }),
                        _ => Err(self.unavailable(
                            "receive a reply",
                            "a reply frame without its kind".into(),
                        )),
                    };
                }
                Next::TooLong(len) => {
                    let msg = too_long(len, MAX_MESSAGE_BYTES);
                    return Err(self.unavailable("receive a reply", msg));
                }
                Next::Partial => {}
            }
            #[cfg(unix)]
            if let Some(until) = busy_until.take() {
                use std::os::fd::AsRawFd;
                let mut fds = [readable(stream.as_raw_fd())];
                poll_readable(&mut fds, until, Some(Duration::ZERO))
                    .map_err(|e| self.unavailable("receive a reply", e.to_string()))?;
            }
            #[cfg(not(unix))]
            let _ = busy_until.take();
            let left = deadline.saturating_duration_since(Instant::now());
            if left.is_zero() {
                *last_wait = timeout;
                return Ok(None);
            }
            stream
                .set_read_timeout(Some(left))
                .map_err(|e| self.unavailable("receive a reply", e.to_string()))?;
            match frames.fill(stream) {
                Ok(true) => {}
                Ok(false) => {
                    return Err(
                        self.unavailable("receive a reply", "the connection was closed".into())
                    )
                }
                Err(e) if matches!(e.kind(), ErrorKind::WouldBlock | ErrorKind::TimedOut) => {}
                Err(e) if e.kind() == ErrorKind::Interrupted => {}
                Err(e) => return Err(self.unavailable("receive a reply", e.to_string())),
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_busy_poll_window_is_read_in_microseconds_with_0_turning_it_off() {
        let micros = |v: &str| window_from(Some(v.into())).as_micros();
        assert_eq!(window_from(None), Duration::from_micros(200));
        assert_eq!(micros("0"), 0);
        assert_eq!(micros(" 50 "), 50);
        assert_eq!(micros("5000000"), 1_000_000);
        assert_eq!(micros("fast"), 200);
        assert_eq!(micros("-3"), 200);
    }
}
