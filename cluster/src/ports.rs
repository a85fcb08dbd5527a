//! Loopback ports handed from a launcher to the tasks it starts, already listening.
//!
//! A launcher that writes `TF_CONFIG` must know every task's address before any task runs.
//! Picking a free port and releasing it for the task to bind later races with every other
//! socket on the machine: an outgoing connection takes its local port from the same
//! ephemeral range, so a peer's connection can take the port first ("Address already in
//! use"). Here the launcher keeps the socket the OS bound ([`ReservedPort`]) and the task
//! inherits it, listening, as systemd's socket activation hands sockets to services: the
//! port is never free between the launcher's choice and the task's server.
//!
//! - The launcher: [`reserve_loopback_ports`], then [`hand_over`] on each task's
//!   [`Command`] (which names the sockets in [`LISTEN_FDS_ENV`] and keeps them open across
//!   `exec` in that child only), then drops its own copies.
//! - The task: [`bind_listener`] (what [`crate::TaskServer::start`] and the profiler server
//!   call) takes the inherited socket for its address if the launcher handed one over, and
//!   binds the address itself otherwise.

use ferroflow_tensor::{Error, Result};
use std::net::TcpListener;
use std::process::Command;
use std::sync::Mutex;

/// The environment variable naming the listening sockets a launcher handed to a task:
/// `address=fd` pairs separated by `,` (`127.0.0.1:40411=5,127.0.0.1:40413=6`).
pub const LISTEN_FDS_ENV: &str = "FERROFLOW_LISTEN_FDS";

/// A loopback port the OS picked, held listening until a task takes it over
/// ([`hand_over`]).
///
/// ```
/// let ports = ferroflow_cluster::reserve_loopback_ports(2)?;
/// assert_ne!(ports[0].address(), ports[1].address());
/// assert!(ports[0].address().starts_with("127.0.0.1:"));
/// # Ok::<(), ferroflow_tensor::Error>(())
/// ```
#[derive(Debug)]
pub struct ReservedPort {
    listener: TcpListener,
    address: String,
}

impl ReservedPort {
    /// Listens on `address` again (a task restarted on the port it had): an error naming the
    /// address if another process took it meanwhile.
    pub fn bind(address: &str) -> Result<ReservedPort> {
        let listener = TcpListener::bind(address)
            .map_err(|e| Error::io(format!("listening on {address} again"), &e))?;
        ReservedPort::from_listener(listener)
    }

    fn from_listener(listener: TcpListener) -> Result<ReservedPort> {
        let address = listener
            .local_addr()
            .map_err(|e| Error::io("reading a bound port", &e))?
            .to_string();
        Ok(ReservedPort { listener, address })
    }

    /// `127.0.0.1:port`.
    pub fn address(&self) -> &str {
        &self.address
    }

    /// The port.
    pub fn port(&self) -> u16 {
        self.listener.local_addr().map_or(0, |a| a.port())
    }
}

/// `n` loopback ports the OS picked, each held listening ([`ReservedPort`]).
pub fn reserve_loopback_ports(n: usize) -> Result<Vec<ReservedPort>> {
    (0..n)
        .map(|_| {
            TcpListener::bind("127.0.0.1:0")
                .map_err(|e| Error::io("binding a free loopback port", &e))
                .and_then(ReservedPort::from_listener)
        })
        .collect()
}

/// Makes the process `command` starts inherit `ports`, listening, and names them in its
/// [`LISTEN_FDS_ENV`] (after those of earlier calls on the same command); its servers take
/// them with [`bind_listener`]. The caller may drop
/// its [`ReservedPort`]s once the process started: the socket lives on in the child (and a
/// dead child's port then refuses connections instead of queueing them).
///
/// Only that child inherits the sockets (they stay close-on-exec everywhere else, other
/// children started meanwhile included). On platforms other than Unix the environment is
/// not set and the task binds its address itself.
///
/// ```no_run
/// let ports = ferroflow_cluster::reserve_loopback_ports(1)?;
/// let mut task = std::process::Command::new("./train");
/// ferroflow_cluster::hand_over(&mut task, &ports.iter().collect::<Vec<_>>());
/// let child = task.spawn();
/// drop(ports);
/// # Ok::<(), ferroflow_tensor::Error>(())
/// ```
pub fn hand_over(command: &mut Command, ports: &[&ReservedPort]) {
    #[cfg(unix)]
    {
        use std::os::unix::io::AsRawFd;
        use std::os::unix::process::CommandExt;
        if ports.is_empty() {
            return;
        }
        let fds: Vec<i32> = ports.iter().map(|p| p.listener.as_raw_fd()).collect();
        // Ports handed over by an earlier call stay named.
        let earlier = command
            .get_envs()
            .find(|(k, _)| *k == LISTEN_FDS_ENV)
            .and_then(|(_, v)| v)
            .and_then(|v| v.to_str())
            .filter(|v| !v.is_empty())
            .map(str::to_string);
        let named: Vec<String> = earlier
            .into_iter()
            .chain(
                ports
                    .iter()
                    .zip(&fds)
                    .map(|(p, fd)| format!("{}={fd}", p.address)),
            )
            .collect();
        command.env(LISTEN_FDS_ENV, named.join(","));
        // SAFETY: runs in the child between fork and exec; it only calls fcntl (which is
        // async-signal-safe) on descriptors this process owns, and does not allocate.
        unsafe {
            command.pre_exec(move || {
                for &fd in &fds {
                    let flags = libc::fcntl(fd, libc::F_GETFD);
                    if flags < 0 || libc::fcntl(fd, libc::F_SETFD, flags & !libc::FD_CLOEXEC) < 0 {
                        return Err(std::io::Error::last_os_error());
                    }
                }
                Ok(())
            });
        }
    }
    #[cfg(not(unix))]
    let _ = (command, ports);
}

/// Descriptors already taken by [`bind_listener`] (each may be owned once).
static TAKEN: Mutex<Vec<i32>> = Mutex::new(Vec::new());

/// The inherited listening socket for `address` named in [`LISTEN_FDS_ENV`], if there is
/// one that is really a socket listening there (and not taken before).
fn take_inherited(address: &str) -> Option<TcpListener> {
    #[cfg(unix)]
    {
        use std::os::unix::io::{FromRawFd, IntoRawFd};
        let named = std::env::var(LISTEN_FDS_ENV).ok()?;
        let fd: i32 = named
            .split(',')
            .filter_map(|pair| pair.rsplit_once('='))
            .find(|(a, _)| *a == address)?
            .1
            .parse()
            .ok()?;
        let mut taken = TAKEN.lock().unwrap_or_else(|e| e.into_inner());
        if taken.contains(&fd) {
            return None;
        }
        // SAFETY: fcntl on any number is harmless; it says whether the descriptor is open.
        if unsafe { libc::fcntl(fd, libc::F_GETFD) } < 0 {
            return None;
        }
        // SAFETY: the descriptor is open; ownership is checked next and given back (not
        // closed) when it is not the socket the launcher named.
        let listener = unsafe { TcpListener::from_raw_fd(fd) };
        if listener.local_addr().ok().map(|a| a.to_string()).as_deref() != Some(address) {
            let _ = listener.into_raw_fd();
            return None;
        }
        // SAFETY: as above; the task's own children must not inherit it.
        unsafe {
            let flags = libc::fcntl(fd, libc::F_GETFD);
            libc::fcntl(fd, libc::F_SETFD, flags | libc::FD_CLOEXEC);
        }
        taken.push(fd);
        Some(listener)
    }
    #[cfg(not(unix))]
    {
        let _ = address;
        None
    }
}

/// A listening socket for `address`: the one the launcher handed over ([`hand_over`]) if it
/// did, else one bound here. Non-blocking, ready for an async runtime.
///
/// ```
/// let listener = ferroflow_cluster::bind_listener("127.0.0.1:0")?;
/// assert_ne!(listener.local_addr().unwrap().port(), 0);
/// # Ok::<(), std::io::Error>(())
/// ```
pub fn bind_listener(address: &str) -> std::io::Result<TcpListener> {
    let listener = match take_inherited(address) {
        Some(l) => l,
        None => TcpListener::bind(address)?,
    };
    listener.set_nonblocking(true)?;
    Ok(listener)
}
