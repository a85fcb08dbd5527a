//! The shared-memory links on Linux: segments in `/dev/shm`, futex doorbells, `/proc` for
//! a peer's liveness (see the parent module for the design).

use super::{Piece, Rendezvous};
use bytes::Bytes;
use ferroflow_tensor::{Error, Result};
use std::collections::VecDeque;
use std::fs::OpenOptions;
use std::os::unix::fs::OpenOptionsExt;
use std::os::unix::io::AsRawFd;
use std::sync::atomic::{AtomicU32, AtomicU64, Ordering};
use std::sync::Mutex;
use std::time::{Duration, Instant};

/// The segment header's first word ("ffshm", version 1).
const MAGIC: u64 = u64::from_le_bytes(*b"ffshm\0\x01\0");
/// Bytes of the ring of the inbox channel from the previous task of the ring, which carries
/// the ring algorithms' data.
const CHANNEL_BYTES: usize = 1 << 20;
/// Bytes of the ring of every other inbox channel: only short all-reduces' direct exchanges
/// use them (longer messages stream through a ring in pieces all the same).
const SIDE_CHANNEL_BYTES: usize = 128 << 10;
/// The segment header: magic, nonce, sizes; the doorbell and the sleeping flag on cache
/// lines of their own.
const SEGMENT_HEADER: usize = 4096;
const NONCE_AT: usize = 8;
const WORLD_AT: usize = 16;
const CHANNEL_BYTES_AT: usize = 24;
const SIDE_CHANNEL_BYTES_AT: usize = 32;
const DOORBELL_AT: usize = 128;
const SLEEPING_AT: usize = 256;
/// A channel's `head` and `tail` on cache lines of their own, then its ring.
const CHANNEL_HEADER: usize = 256;
const TAIL_AT: usize = 128;
/// A message's header: the key's hash and the payload's length.
const MESSAGE_HEADER: usize = 16;
/// How long a wait sleeps before it checks the peer and the deadline again.
const POLL: Duration = Duration::from_millis(10);
/// How many times a wait looks at the doorbell before it sleeps.
const SPINS: u32 = 64;

/// A shared mapping, unmapped when dropped.
struct Mapping {
    ptr: *mut u8,
    len: usize,
}

// SAFETY: the mapping is plain memory; every access to the words other processes write goes
// through atomics, and the rings' bytes are handed over by the atomics' release/acquire.
unsafe impl Send for Mapping {}
unsafe impl Sync for Mapping {}

impl Mapping {
    /// Maps `len` bytes of `file`, shared, read and write.
    fn map(file: &std::fs::File, len: usize) -> std::io::Result<Mapping> {
        // SAFETY: a fresh mapping of a file this process opened; checked for failure.
        let ptr = unsafe {
            libc::mmap(
                std::ptr::null_mut(),
                len,
                libc::PROT_READ | libc::PROT_WRITE,
                libc::MAP_SHARED,
                file.as_raw_fd(),
                0,
            )
        };
        if ptr == libc::MAP_FAILED {
            return Err(std::io::Error::last_os_error());
        }
        Ok(Mapping {
            ptr: ptr.cast(),
            len,
        })
    }

    /// The 64-bit word at `offset` (8-aligned, inside the mapping).
    fn word(&self, offset: usize) -> &AtomicU64 {
        debug_assert!(offset.is_multiple_of(8) && offset + 8 <= self.len);
        // SAFETY: in bounds and aligned (the mapping is page-aligned); AtomicU64 has u64's
        // layout and the memory lives as long as `self`.
        unsafe { AtomicU64::from_ptr(self.ptr.add(offset).cast()) }
    }

    /// The 32-bit word at `offset` (4-aligned, inside the mapping).
    fn word32(&self, offset: usize) -> &AtomicU32 {
        debug_assert!(offset.is_multiple_of(4) && offset + 4 <= self.len);
        // SAFETY: as in `word`.
        unsafe { AtomicU32::from_ptr(self.ptr.add(offset).cast()) }
    }
}

impl Drop for Mapping {
    fn drop(&mut self) {
        // SAFETY: the mapping made in `map`, unmapped once.
        unsafe { libc::munmap(self.ptr.cast(), self.len) };
    }
}

/// The bytes of a segment for a group of `world` tasks (at least 2): the channel from the
/// previous task, then one for each other task.
fn segment_bytes(world: usize) -> usize {
    SEGMENT_HEADER
        + (CHANNEL_HEADER + CHANNEL_BYTES)
        + world.saturating_sub(2) * (CHANNEL_HEADER + SIDE_CHANNEL_BYTES)
}

/// One channel of a segment: its positions and its ring.
struct Channel<'a> {
    segment: &'a Mapping,
    /// Where its header starts in the segment.
    at: usize,
    /// Its ring's bytes.
    capacity: usize,
}

impl<'a> Channel<'a> {
    /// The inbox channel for messages from task `from` in `segment`, task `owner`'s of a
    /// group of `world`.
    fn new(segment: &'a Mapping, owner: usize, from: usize, world: usize) -> Channel<'a> {
        let previous = (owner + world - 1) % world;
        if from == previous {
            return Channel {
                segment,
                at: SEGMENT_HEADER,
                capacity: CHANNEL_BYTES,
            };
        }
        // The others in rank order, without the owner and the previous task.
        let slot = from - usize::from(from > owner) - usize::from(from > previous);
        Channel {
            segment,
            at: SEGMENT_HEADER
                + (CHANNEL_HEADER + CHANNEL_BYTES)
                + slot * (CHANNEL_HEADER + SIDE_CHANNEL_BYTES),
            capacity: SIDE_CHANNEL_BYTES,
        }
    }

    fn head(&self) -> &AtomicU64 {
        self.segment.word(self.at)
    }
    fn tail(&self) -> &AtomicU64 {
        self.segment.word(self.at + TAIL_AT)
    }
    /// The ring's bytes from position `pos` (mod its size) up to `len` of them, not past the
    /// ring's end.
    fn span(&self, pos: u64, len: usize) -> (*mut u8, usize) {
        let start = (pos % self.capacity as u64) as usize;
        let n = len.min(self.capacity - start);
        // SAFETY: `start + n <= capacity`, inside the channel's ring.
        let ptr = unsafe { self.segment.ptr.add(self.at + CHANNEL_HEADER + start) };
        (ptr, n)
    }
}

/// The doorbell of a segment: rung after every move of a position the owner may wait for.
fn ring_doorbell(segment: &Mapping) {
    let bell = segment.word32(DOORBELL_AT);
    bell.fetch_add(1, Ordering::SeqCst);
    if segment.word32(SLEEPING_AT).load(Ordering::SeqCst) != 0 {
        // SAFETY: a futex wake on a word of a live shared mapping.
        unsafe {
            libc::syscall(
                libc::SYS_futex,
                bell.as_ptr(),
                libc::FUTEX_WAKE,
                i32::MAX,
                std::ptr::null::<libc::timespec>(),
                std::ptr::null::<u32>(),
                0u32,
            );
        }
    }
}

/// A process as `/proc` knows it: its pid and start time (a reused pid has another).
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
struct ProcessId {
    pid: u32,
    start: u64,
}

impl ProcessId {
    fn current() -> Option<ProcessId> {
        let pid = std::process::id();
        let (_, start) = process_state(pid)?;
        Some(ProcessId { pid, start })
    }

    /// Whether the process still runs (not ended, not a zombie, not another with its pid).
    fn alive(&self) -> bool {
        process_state(self.pid)
            .is_some_and(|(state, start)| !matches!(state, 'Z' | 'X') && start == self.start)
    }
}

/// Process `pid`'s state letter and start time (fields 3 and 22 of `/proc/PID/stat`, the
/// start in clock ticks); `None` when there is no such process.
fn process_state(pid: u32) -> Option<(char, u64)> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    // The command name (field 2) is in parentheses and may hold spaces and parentheses.
    let (_, rest) = stat.rsplit_once(')')?;
    let mut fields = rest.split_whitespace();
    let state = fields.next()?.chars().next()?;
    let start = fields.nth(18)?.parse().ok()?;
    Some((state, start))
}

/// FNV-1a of a message key: what a message's header carries to catch a receiver and a
/// sender out of step.
fn key_hash(key: &str) -> u64 {
    key.bytes().fold(0xcbf2_9ce4_8422_2325, |h, b| {
        (h ^ b as u64).wrapping_mul(0x0100_0000_01b3)
    })
}

/// A payload's length padded to whole 16-byte units.
fn padded(len: usize) -> usize {
    len.div_ceil(16) * 16
}

/// A message waiting for room in a peer's inbox: its header and payload, and how many of
/// their (padded) bytes are written.
struct Outgoing {
    header: [u8; MESSAGE_HEADER],
    payload: Bytes,
    written: usize,
}

impl Outgoing {
    fn total(&self) -> usize {
        MESSAGE_HEADER + padded(self.payload.len())
    }
}

/// Another task's segment and process.
struct Peer {
    segment: Mapping,
    process: ProcessId,
}

/// This task's shared-memory links to every other task of the group.
pub(crate) struct ShmLinks {
    rank: usize,
    /// This task's segment (its doorbell and inboxes).
    own: Mapping,
    /// Every other task's segment and process, by rank (`None`: this task).
    peers: Vec<Option<Peer>>,
    /// Every task's name, for errors.
    names: Vec<String>,
    timeout: Duration,
    /// Messages queued for each task, by rank.
    queued: Mutex<Vec<VecDeque<Outgoing>>>,
}

/// Sends `mine` to every other task under `key/RANK` and returns every task's (this one's
/// in its place).
fn exchange(
    rendezvous: &dyn Rendezvous,
    rank: usize,
    world: usize,
    key: &str,
    mine: Vec<u8>,
) -> Result<Vec<Bytes>> {
    for to in (0..world).filter(|&k| k != rank) {
        rendezvous.send(to, &format!("{key}/{rank}"), mine.clone())?;
    }
    (0..world)
        .map(|from| {
            if from == rank {
                Ok(Bytes::from(mine.clone()))
            } else {
                rendezvous.receive(from, &format!("{key}/{from}"))
            }
        })
        .collect()
}

/// This host's boot id (`None` off Linux or without `/proc`).
fn boot_id() -> Option<String> {
    std::fs::read_to_string("/proc/sys/kernel/random/boot_id")
        .ok()
        .map(|s| s.trim().to_string())
}

/// A random 64-bit value (the standard library's per-process random hash keys).
fn random_u64() -> u64 {
    use std::hash::{BuildHasher, Hasher};
    let mut h = std::collections::hash_map::RandomState::new().build_hasher();
    h.write_u128(
        std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| d.as_nanos()),
    );
    h.finish()
}

/// This task's segment: created, its pages reserved, its header written. The file's path
/// comes back with it, to be unlinked once the others have mapped it.
fn create_segment(world: usize, nonce: u64) -> std::io::Result<(Mapping, String)> {
    let path = format!(
        "/dev/shm/ferroflow-collectives-{}-{nonce:016x}",
        std::process::id()
    );
    let file = OpenOptions::new()
        .read(true)
        .write(true)
        .create_new(true)
        .mode(0o600)
        .open(&path)?;
    let len = segment_bytes(world);
    let made = (|| {
        // SAFETY: reserves the file's blocks; fd valid for the call.
        let err = unsafe { libc::posix_fallocate(file.as_raw_fd(), 0, len as libc::off_t) };
        if err != 0 {
            return Err(std::io::Error::from_raw_os_error(err));
        }
        let segment = Mapping::map(&file, len)?;
        segment.word(NONCE_AT).store(nonce, Ordering::Relaxed);
        segment
            .word(WORLD_AT)
            .store(world as u64, Ordering::Relaxed);
        segment
            .word(CHANNEL_BYTES_AT)
            .store(CHANNEL_BYTES as u64, Ordering::Relaxed);
        segment
            .word(SIDE_CHANNEL_BYTES_AT)
            .store(SIDE_CHANNEL_BYTES as u64, Ordering::Relaxed);
        segment.word(0).store(MAGIC, Ordering::SeqCst);
        Ok(segment)
    })();
    match made {
        Ok(segment) => Ok((segment, path)),
        Err(e) => {
            let _ = std::fs::remove_file(&path);
            Err(e)
        }
    }
}

/// Removes a file when dropped.
struct RemoveOnDrop(String);

impl Drop for RemoveOnDrop {
    fn drop(&mut self) {
        let _ = std::fs::remove_file(&self.0);
    }
}

/// Maps another task's segment at `path` and checks it is the one its nonce says.
fn open_segment(path: &str, world: usize, nonce: u64) -> Option<Mapping> {
    if !path.starts_with("/dev/shm/ferroflow-collectives-") || path.contains("..") {
        return None;
    }
    let file = OpenOptions::new().read(true).write(true).open(path).ok()?;
    let len = segment_bytes(world);
    if file.metadata().ok()?.len() != len as u64 {
        return None;
    }
    let segment = Mapping::map(&file, len).ok()?;
    let matches = segment.word(0).load(Ordering::SeqCst) == MAGIC
        && segment.word(NONCE_AT).load(Ordering::Relaxed) == nonce
        && segment.word(WORLD_AT).load(Ordering::Relaxed) == world as u64
        && segment.word(CHANNEL_BYTES_AT).load(Ordering::Relaxed) == CHANNEL_BYTES as u64
        && segment.word(SIDE_CHANNEL_BYTES_AT).load(Ordering::Relaxed) == SIDE_CHANNEL_BYTES as u64;
    matches.then_some(segment)
}

impl ShmLinks {
    /// The links of task `rank` of `world` (`names` by rank) when every task runs on this
    /// host and can map every other's segment; `None` when not (the group then keeps to
    /// gRPC). Every task of the group calls this at the same point; `key` names the
    /// messages of the setup (the collective that runs it).
    pub(crate) fn connect(
        rendezvous: &dyn Rendezvous,
        rank: usize,
        names: Vec<String>,
        timeout: Duration,
        key: &str,
    ) -> Result<Option<ShmLinks>> {
        let world = names.len();
        let host = boot_id().unwrap_or_default();
        let hosts = exchange(
            rendezvous,
            rank,
            world,
            &format!("{key}/shared-memory/host"),
            host.clone().into_bytes(),
        )?;
        if host.is_empty() || hosts.iter().any(|h| h[..] != *host.as_bytes()) {
            return Ok(None);
        }
        let nonce = random_u64();
        let me = ProcessId::current();
        let created = me.and_then(|_| create_segment(world, nonce).ok());
        // The file goes when the setup ends, however it ends: by then every task that could
        // map it has.
        let _unlink = created.as_ref().map(|(_, path)| RemoveOnDrop(path.clone()));
        let offer = match (&created, me) {
            (Some((_, path)), Some(me)) => {
                format!("{path} {nonce} {} {}", me.pid, me.start).into_bytes()
            }
            _ => b"none".to_vec(),
        };
        let offers = exchange(
            rendezvous,
            rank,
            world,
            &format!("{key}/shared-memory/segment"),
            offer,
        )?;
        let peers: Vec<Option<Peer>> = offers
            .iter()
            .enumerate()
            .map(|(k, offer)| {
                if k == rank {
                    return None;
                }
                let offer = std::str::from_utf8(offer).ok()?;
                let [path, nonce, pid, start] = offer.split(' ').collect::<Vec<_>>()[..] else {
                    return None;
                };
                let process = ProcessId {
                    pid: pid.parse().ok()?,
                    start: start.parse().ok()?,
                };
                // Its process must be the one this task's `/proc` shows (not so from
                // another pid namespace sharing the host's `/dev/shm`): a dead peer is
                // told from there.
                if !process.alive() {
                    return None;
                }
                let segment = open_segment(path, world, nonce.parse().ok()?)?;
                Some(Peer { segment, process })
            })
            .collect();
        let mapped_all =
            created.is_some() && peers.iter().filter(|p| p.is_some()).count() + 1 == world;
        let answers = exchange(
            rendezvous,
            rank,
            world,
            &format!("{key}/shared-memory/mapped"),
            vec![u8::from(mapped_all)],
        );
        let all = answers?.iter().all(|a| a[..] == [1]);
        let Some((own, _)) = created.filter(|_| all) else {
            return Ok(None);
        };
        Ok(Some(ShmLinks {
            rank,
            own,
            queued: Mutex::new((0..world).map(|_| VecDeque::new()).collect()),
            peers,
            names,
            timeout,
        }))
    }

    fn peer(&self, k: usize) -> Result<&Peer> {
        self.peers
            .get(k)
            .and_then(Option::as_ref)
            .ok_or_else(|| Error::invalid("collectives", format!("task {k} has no link")))
    }

    /// Sends `payload` to task `to` under `key`: what fits in its inbox now is written, the
    /// rest is queued and written while this task waits in later receives and flushes.
    pub(crate) fn send(&self, to: usize, key: &str, payload: &[u8]) -> Result<()> {
        let mut queued = self.queued.lock().unwrap_or_else(|e| e.into_inner());
        let mut header = [0u8; MESSAGE_HEADER];
        header[..8].copy_from_slice(&key_hash(key).to_le_bytes());
        header[8..].copy_from_slice(&(payload.len() as u64).to_le_bytes());
        let peer = self.peer(to)?;
        let channel = Channel::new(&peer.segment, to, self.rank, self.peers.len());
        let mut written = 0;
        if queued[to].is_empty() {
            written = write_some(&channel, &header, payload, 0);
            if written > 0 {
                ring_doorbell(&peer.segment);
            }
        }
        let total = MESSAGE_HEADER + padded(payload.len());
        if written < total {
            queued[to].push_back(Outgoing {
                header,
                payload: Bytes::copy_from_slice(payload),
                written,
            });
        }
        Ok(())
    }

    /// Writes what fits of every queued message; whether all are written.
    fn push_queued(&self, queued: &mut [VecDeque<Outgoing>]) -> Result<bool> {
        let mut all = true;
        for (to, queue) in queued.iter_mut().enumerate() {
            if queue.is_empty() {
                continue;
            }
            let peer = self.peer(to)?;
            let channel = Channel::new(&peer.segment, to, self.rank, self.peers.len());
            let mut moved = false;
            while let Some(out) = queue.front_mut() {
                let n = write_some(&channel, &out.header, &out.payload, out.written);
                out.written += n;
                moved |= n > 0;
                if out.written < out.total() {
                    break;
                }
                queue.pop_front();
            }
            if moved {
                ring_doorbell(&peer.segment);
            }
            all &= queue.is_empty();
        }
        Ok(all)
    }

    /// Waits until every queued message is written into its peer's inbox (the end of each
    /// collective `op`, which errors name: a task may leave, or compute for long, after it).
    pub(crate) fn flush(&self, op: &str) -> Result<()> {
        let mut queued = self.queued.lock().unwrap_or_else(|e| e.into_inner());
        if queued.iter().all(VecDeque::is_empty) {
            return Ok(());
        }
        let waiting_for: Vec<usize> = (0..queued.len())
            .filter(|&k| !queued[k].is_empty())
            .collect();
        self.wait(&mut queued, &waiting_for, op, |flushed| flushed)
    }

    /// Receives the message task `from` sent under `key`, handing `sink` its length, then
    /// its payload piece by piece as it arrives (read in place, then released to the
    /// sender).
    pub(crate) fn receive(
        &self,
        from: usize,
        key: &str,
        sink: &mut dyn FnMut(Piece<'_>) -> Result<()>,
    ) -> Result<()> {
        let mut queued = self.queued.lock().unwrap_or_else(|e| e.into_inner());
        let peer = self.peer(from)?;
        let channel = Channel::new(&self.own, self.rank, from, self.peers.len());
        let (head, tail) = (channel.head(), channel.tail());
        let op = key.rsplit_once('/').map_or(key, |(k, _)| k);
        // The header.
        self.wait(&mut queued, &[from], op, |_| {
            head.load(Ordering::Acquire) - tail.load(Ordering::Relaxed) >= MESSAGE_HEADER as u64
        })?;
        let start = tail.load(Ordering::Relaxed);
        let mut header = [0u8; MESSAGE_HEADER];
        let (ptr, n) = channel.span(start, MESSAGE_HEADER);
        debug_assert_eq!(n, MESSAGE_HEADER);
        // SAFETY: the sender published these bytes (acquire above) and writes no more there
        // until `tail` passes them.
        unsafe { std::ptr::copy_nonoverlapping(ptr, header.as_mut_ptr(), MESSAGE_HEADER) };
        let hash = u64::from_le_bytes(header[..8].try_into().unwrap_or_default());
        let len = u64::from_le_bytes(header[8..].try_into().unwrap_or_default()) as usize;
        if hash != key_hash(key) {
            return Err(Error::invalid(
                "collectives",
                format!(
                    "{} sent another message than {key:?}: the tasks called the collectives in different orders",
                    self.names[from]
                ),
            ));
        }
        tail.store(start + MESSAGE_HEADER as u64, Ordering::Release);
        ring_doorbell(&peer.segment);
        sink(Piece::Length(len))?;
        let end = padded(len);
        let mut done = 0;
        while done < end {
            self.wait(&mut queued, &[from], op, |_| {
                head.load(Ordering::Acquire) > tail.load(Ordering::Relaxed)
            })?;
            let pos = tail.load(Ordering::Relaxed);
            let available = (head.load(Ordering::Acquire) - pos) as usize;
            let (ptr, n) = channel.span(pos, available.min(end - done));
            let payload = n.min(len.saturating_sub(done));
            if payload > 0 {
                // SAFETY: published by the sender (acquire above), not rewritten until
                // `tail` passes it.
                let bytes = unsafe { std::slice::from_raw_parts(ptr, payload) };
                sink(Piece::Bytes {
                    offset: done,
                    bytes,
                })?;
            }
            done += n;
            tail.store(pos + n as u64, Ordering::Release);
            ring_doorbell(&peer.segment);
        }
        Ok(())
    }

    /// Waits until `ready` holds (told whether every queued message is written), pushing
    /// the queued messages meanwhile; an error naming the first of `waiting_for` that has
    /// died, or that has not moved within the timeout.
    fn wait(
        &self,
        queued: &mut [VecDeque<Outgoing>],
        waiting_for: &[usize],
        op: &str,
        mut ready: impl FnMut(bool) -> bool,
    ) -> Result<()> {
        let deadline = Instant::now() + self.timeout;
        let bell = self.own.word32(DOORBELL_AT);
        let sleeping = self.own.word32(SLEEPING_AT);
        let mut quiet_since = Instant::now();
        loop {
            let seen = bell.load(Ordering::SeqCst);
            if ready(self.push_queued(queued)?) {
                return Ok(());
            }
            let mut spins = 0;
            while spins < SPINS && bell.load(Ordering::Relaxed) == seen {
                std::hint::spin_loop();
                spins += 1;
            }
            if bell.load(Ordering::SeqCst) != seen {
                quiet_since = Instant::now();
                continue;
            }
            let now = Instant::now();
            let nap = POLL.min(deadline.saturating_duration_since(now));
            let ts = libc::timespec {
                tv_sec: nap.as_secs() as libc::time_t,
                tv_nsec: nap.subsec_nanos() as libc::c_long,
            };
            sleeping.store(1, Ordering::SeqCst);
            // SAFETY: a futex wait on a word of this task's live shared mapping, with a
            // timeout; it returns at once if the word is no longer `seen`.
            unsafe {
                libc::syscall(
                    libc::SYS_futex,
                    bell.as_ptr(),
                    libc::FUTEX_WAIT,
                    seen,
                    &ts as *const libc::timespec,
                    std::ptr::null::<u32>(),
                    0u32,
                );
            }
            sleeping.store(0, Ordering::SeqCst);
            let now = Instant::now();
            if bell.load(Ordering::SeqCst) != seen {
                quiet_since = now;
                continue;
            }
            if now.duration_since(quiet_since) >= POLL {
                quiet_since = now;
                for &k in waiting_for {
                    if !self.peer(k)?.process.alive() {
                        return Err(Error::Unavailable {
                            op: op.to_string(),
                            peer: self.names[k].clone(),
                            msg: "the task's process has ended (its shared-memory link is gone)"
                                .into(),
                        });
                    }
                }
            }
            if now >= deadline {
                return Err(Error::Unavailable {
                    op: op.to_string(),
                    peer: waiting_for
                        .first()
                        .map_or_else(String::new, |&k| self.names[k].clone()),
                    msg: format!(
                        "no message within {:?}: the task died or hung (the collective timeout)",
                        self.timeout
                    ),
                });
            }
        }
    }
}

impl Drop for ShmLinks {
    /// Writes what is still queued (each peer within the timeout), so a task that ends
    /// right after its last collective does not cut its last messages off.
    fn drop(&mut self) {
        let _ = self.flush("the collectives' last messages");
    }
}

/// Writes what fits in `channel` of the message `header` + `payload` (padded to 16 bytes)
/// from byte `from` of it; returns how many bytes it wrote (a multiple of 16).
fn write_some(channel: &Channel<'_>, header: &[u8; 16], payload: &[u8], from: usize) -> usize {
    let total = MESSAGE_HEADER + padded(payload.len());
    let head = channel.head().load(Ordering::Relaxed);
    let tail = channel.tail().load(Ordering::Acquire);
    let room = channel.capacity - (head - tail) as usize;
    let n = room.min(total - from);
    let mut done = 0;
    while done < n {
        // Up to the ring's end, then from its start.
        let (ptr, span) = channel.span(head + done as u64, n - done);
        // SAFETY: `span` bytes at `ptr` are inside the ring's free room: the receiver reads
        // none of them until `head` is published below.
        let dst = unsafe { std::slice::from_raw_parts_mut(ptr, span) };
        copy_message_bytes(dst, header, payload, from + done);
        done += span;
    }
    channel.head().store(head + n as u64, Ordering::Release);
    n
}

/// Fills `dst` with the message's bytes from byte `at` on: the header's, the payload's,
/// and the padding (left as it was: the receiver skips it).
fn copy_message_bytes(dst: &mut [u8], header: &[u8; 16], payload: &[u8], at: usize) {
    let mut filled = 0;
    let mut copy = |src: &[u8], from: usize| {
        let rest = dst.len() - filled;
        let len = src.len().saturating_sub(from).min(rest);
        if len > 0 {
            dst[filled..filled + len].copy_from_slice(&src[from..from + len]);
            filled += len;
        }
    };
    copy(header, at.min(MESSAGE_HEADER));
    copy(
        payload,
        at.saturating_sub(MESSAGE_HEADER).min(payload.len()),
    );
}
