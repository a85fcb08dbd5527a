//! The host emulation's stand-in for NCCL: a hub thread in the process that made the id
//! (NCCL's bootstrap root has one too) and one TCP connection to it per rank, on loopback.
//! Each collective sends every rank's bytes to the hub, which checks that the ranks called
//! the same collective, combines the bytes and answers each rank. A rank that leaves or
//! stays silent past the communicator's timeout fails the collective on every other rank.
//!
//! Wire format (little-endian): the id is `FFNCCLSI`, the hub's port (u16) and a nonce
//! (u64); a rank says hello with the nonce, its rank, the world size (u32 each but the
//! nonce), its timeout in milliseconds (u64) and its process id (u32), and the hub answers
//! `0` once every rank has joined. A request is kind (u8), NCCL data type (u8), two zero bytes, root (u32),
//! byte count (u64) and the bytes; an answer is `0`, a byte count (u64) and the bytes, or
//! `1`, a length (u32) and an error message.

use std::hash::{BuildHasher, Hasher};
use std::io::{Read, Write};
use std::net::{Ipv4Addr, TcpListener, TcpStream};
use std::time::{Duration, Instant};

use ferroflow_tensor::{DType, Element, Error, HostData, Result};

use super::{dtype_of, Call, CallKind, NcclId, ReduceOp, NCCL_ID_BYTES};

const MAGIC: &[u8; 8] = b"FFNCCLSI";

/// How long the hub waits for its first rank (after that, the ranks' own timeout).
const FIRST_RANK_LIMIT: Duration = Duration::from_secs(600);

/// The bytes of a rank's hello.
const HELLO_BYTES: usize = 28;

/// How long a connection may take to say hello.
const HELLO_LIMIT: Duration = Duration::from_secs(10);

/// The largest collective the hub accepts from one rank (a corrupt header is an error,
/// not an allocation of its claimed size).
const MAX_BYTES: u64 = 1 << 34;

/// A new id, its hub listening on loopback in a thread of this process.
pub(super) fn new_id() -> Result<NcclId> {
    let listener = TcpListener::bind((Ipv4Addr::LOCALHOST, 0))
        .and_then(|l| l.local_addr().map(|a| (l, a.port())))
        .map_err(|e| Error::Backend {
            backend: crate::BACKEND,
            msg: format!("NCCL's stand-in: binding its hub on loopback: {e}"),
        })?;
    let (listener, port) = listener;
    let mut hasher = std::collections::hash_map::RandomState::new().build_hasher();
    hasher.write_u32(std::process::id());
    hasher.write_u128(
        std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| d.as_nanos()),
    );
    let nonce = hasher.finish();
    let mut id = [0u8; NCCL_ID_BYTES];
    id[..8].copy_from_slice(MAGIC);
    id[8..10].copy_from_slice(&port.to_le_bytes());
    id[10..18].copy_from_slice(&nonce.to_le_bytes());
    std::thread::Builder::new()
        .name("nccl-stand-in-hub".into())
        .spawn(move || {
            // The ranks see a hub that fails as an error of their own (a closed
            // connection or their timeout).
            let _ = serve(listener, nonce);
        })
        .map_err(|e| Error::Backend {
            backend: crate::BACKEND,
            msg: format!("NCCL's stand-in: starting its hub: {e}"),
        })?;
    Ok(NcclId(id))
}

/// The hub's port and nonce in `id`, or an error when the stand-in did not make it.
fn parse(id: &NcclId) -> Result<(u16, u64)> {
    let b = id.as_bytes();
    if &b[..8] != MAGIC {
        return Err(Error::invalid(
            "NcclCommunicator::new",
            "the id was not made for the emulated device (an NCCL id from a real GPU's \
             process cannot be joined by an emulated one)",
        ));
    }
    let port = u16::from_le_bytes([b[8], b[9]]);
    let mut nonce = [0u8; 8];
    nonce.copy_from_slice(&b[10..18]);
    Ok((port, u64::from_le_bytes(nonce)))
}

/// One rank's connection to the hub.
pub(super) struct Member {
    stream: TcpStream,
    hub: String,
}

impl Member {
    /// Joins the communicator of `id` as `rank` of `world`: returns once every rank has.
    pub(super) fn join(
        id: &NcclId,
        rank: usize,
        world: usize,
        timeout: Duration,
    ) -> Result<Member> {
        let (port, nonce) = parse(id)?;
        let hub = format!("the NCCL stand-in's hub (127.0.0.1:{port})");
        let failed = |what: &str, e: std::io::Error| Error::Unavailable {
            op: "NCCL join".into(),
            peer: hub.clone(),
            msg: format!("{what}: {e}"),
        };
        let address = (Ipv4Addr::LOCALHOST, port).into();
        let mut stream =
            TcpStream::connect_timeout(&address, timeout).map_err(|e| failed("connecting", e))?;
        let limit = Some(timeout.max(Duration::from_millis(1)));
        stream
            .set_read_timeout(limit)
            .and_then(|()| stream.set_write_timeout(limit))
            .and_then(|()| stream.set_nodelay(true))
            .map_err(|e| failed("configuring the connection", e))?;
        let mut hello = Vec::with_capacity(HELLO_BYTES);
        hello.extend_from_slice(&nonce.to_le_bytes());
        hello.extend_from_slice(&(rank as u32).to_le_bytes());
        hello.extend_from_slice(&(world as u32).to_le_bytes());
        hello.extend_from_slice(&(timeout.as_millis().min(u64::MAX as u128) as u64).to_le_bytes());
        hello.extend_from_slice(&std::process::id().to_le_bytes());
        stream
            .write_all(&hello)
            .map_err(|e| failed("saying hello", e))?;
        let mut member = Member { stream, hub };
        member.answer("NCCL join")?;
        Ok(member)
    }

    /// Sends this rank's part of `call` and returns the hub's answer.
    pub(super) fn call(&mut self, op: &str, call: &Call, mine: &[u8]) -> Result<Vec<u8>> {
        let (kind, root) = match call.kind {
            CallKind::AllReduce(ReduceOp::Sum) => (0u8, 0u32),
            CallKind::AllReduce(ReduceOp::Mean) => (1, 0),
            CallKind::AllGather => (2, 0),
            CallKind::Broadcast(root) => (3, root as u32),
        };
        let mut header = [0u8; 16];
        header[0] = kind;
        header[1] = call.data_type as u8;
        header[4..8].copy_from_slice(&root.to_le_bytes());
        header[8..16].copy_from_slice(&(mine.len() as u64).to_le_bytes());
        let op = format!("NCCL {op}");
        self.stream
            .write_all(&header)
            .and_then(|()| self.stream.write_all(mine))
            .map_err(|e| Error::Unavailable {
                op: op.clone(),
                peer: self.hub.clone(),
                msg: format!("sending: {e}"),
            })?;
        self.answer(&op)
    }

    /// The hub's answer: its bytes, or its error.
    fn answer(&mut self, op: &str) -> Result<Vec<u8>> {
        let unavailable = |msg: String| Error::Unavailable {
            op: op.to_string(),
            peer: self.hub.clone(),
            msg,
        };
        match read_answer(&mut self.stream) {
            Ok(Ok(bytes)) => Ok(bytes),
            Ok(Err(message)) => Err(unavailable(message)),
            Err(e) => Err(unavailable(format!(
                "no answer (a rank died, or the communicator's timeout passed): {e}"
            ))),
        }
    }
}

fn read_answer(s: &mut TcpStream) -> std::io::Result<std::result::Result<Vec<u8>, String>> {
    let mut status = [0u8; 1];
    s.read_exact(&mut status)?;
    if status[0] == 0 {
        let mut len = [0u8; 8];
        s.read_exact(&mut len)?;
        let len = u64::from_le_bytes(len);
        if len > MAX_BYTES {
            return Ok(Err(format!("the hub announced {len} bytes")));
        }
        let mut bytes = vec![0u8; len as usize];
        s.read_exact(&mut bytes)?;
        return Ok(Ok(bytes));
    }
    let mut len = [0u8; 4];
    s.read_exact(&mut len)?;
    let mut message = vec![0u8; u32::from_le_bytes(len).min(1 << 16) as usize];
    s.read_exact(&mut message)?;
    Ok(Err(String::from_utf8_lossy(&message).into_owned()))
}

fn send_ok(s: &mut TcpStream, bytes: &[u8]) -> std::io::Result<()> {
    let mut head = [0u8; 9];
    head[1..].copy_from_slice(&(bytes.len() as u64).to_le_bytes());
    s.write_all(&head)?;
    s.write_all(bytes)
}

fn send_error(s: &mut TcpStream, message: &str) {
    let mut out = vec![1u8];
    out.extend_from_slice(&(message.len() as u32).to_le_bytes());
    out.extend_from_slice(message.as_bytes());
    // The rank may be gone already: nothing more to tell it.
    let _ = s.write_all(&out);
}

/// One rank's request.
struct Request {
    kind: u8,
    data_type: u8,
    root: u32,
    bytes: Vec<u8>,
}

impl Request {
    fn describe(&self) -> String {
        let what = match self.kind {
            0 => "all_reduce (sum)",
            1 => "all_reduce (average)",
            2 => "all_gather",
            3 => "broadcast",
            _ => "an unknown collective",
        };
        format!(
            "{what} of {} bytes of NCCL data type {} (root {})",
            self.bytes.len(),
            self.data_type,
            self.root
        )
    }
}

/// The next request on `s`, or `None` when the rank closed its connection.
fn read_request(s: &mut TcpStream) -> std::io::Result<Option<Request>> {
    let mut header = [0u8; 16];
    match s.read(&mut header[..1])? {
        0 => return Ok(None),
        _ => s.read_exact(&mut header[1..])?,
    }
    let len = u64::from_le_bytes([
        header[8], header[9], header[10], header[11], header[12], header[13], header[14],
        header[15],
    ]);
    if len > MAX_BYTES {
        return Err(std::io::Error::other(format!("a request of {len} bytes")));
    }
    let mut bytes = vec![0u8; len as usize];
    s.read_exact(&mut bytes)?;
    Ok(Some(Request {
        kind: header[0],
        data_type: header[1],
        root: u32::from_le_bytes([header[4], header[5], header[6], header[7]]),
        bytes,
    }))
}

/// The hub: waits for every rank, then answers their collectives until one leaves.
fn serve(listener: TcpListener, nonce: u64) -> std::io::Result<()> {
    listener.set_nonblocking(true)?;
    let started = Instant::now();
    let mut limit = FIRST_RANK_LIMIT;
    let mut ranks: Vec<Option<TcpStream>> = vec![];
    // The ranks in the hub's own process, told of a failure last: the others must hear of
    // it before that process can end (and the hub with it).
    let mut local: Vec<bool> = vec![];
    while ranks.is_empty() || ranks.iter().any(Option::is_none) {
        if started.elapsed() > limit {
            for s in ranks.iter_mut().flatten() {
                send_error(s, "not every rank joined within the timeout");
            }
            return Ok(());
        }
        let mut s = match listener.accept() {
            Ok((s, _)) => s,
            Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => {
                std::thread::sleep(Duration::from_millis(1));
                continue;
            }
            Err(e) => return Err(e),
        };
        s.set_nonblocking(false)?;
        s.set_read_timeout(Some(HELLO_LIMIT))?;
        s.set_nodelay(true)?;
        let mut hello = [0u8; HELLO_BYTES];
        if s.read_exact(&mut hello).is_err() {
            continue;
        }
        let word = |at: usize| {
            u32::from_le_bytes([hello[at], hello[at + 1], hello[at + 2], hello[at + 3]])
        };
        let long = |at: usize| {
            let mut b = [0u8; 8];
            b.copy_from_slice(&hello[at..at + 8]);
            u64::from_le_bytes(b)
        };
        let (rank, world) = (word(8) as usize, word(12) as usize);
        let timeout = Duration::from_millis(long(16)).max(Duration::from_millis(1));
        let refusal = if long(0) != nonce {
            Some("the id's nonce does not match this hub's".to_string())
        } else if !ranks.is_empty() && world != ranks.len() {
            Some(format!(
                "rank {rank} says the communicator has {world} ranks, others said {}",
                ranks.len()
            ))
        } else if rank >= world {
            Some(format!("rank {rank} is not a rank of {world}"))
        } else if ranks.get(rank).is_some_and(Option::is_some) {
            Some(format!("rank {rank} joined twice"))
        } else {
            None
        };
        if let Some(message) = refusal {
            send_error(&mut s, &message);
            continue;
        }
        if ranks.is_empty() {
            ranks = (0..world).map(|_| None).collect();
            local = vec![false; world];
            limit = started.elapsed() + timeout;
        }
        s.set_read_timeout(Some(timeout))?;
        s.set_write_timeout(Some(timeout))?;
        local[rank] = word(24) == std::process::id();
        ranks[rank] = Some(s);
    }
    let mut ranks: Vec<TcpStream> = ranks.into_iter().flatten().collect();
    for s in &mut ranks {
        send_ok(s, &[])?;
    }
    loop {
        let mut requests = Vec::with_capacity(ranks.len());
        for (r, s) in ranks.iter_mut().enumerate() {
            match read_request(s) {
                Ok(Some(request)) => requests.push(request),
                Ok(None) | Err(_) => {
                    let message =
                        format!("rank {r} left the communicator or stayed silent past its timeout");
                    fail_all(&mut ranks, &local, Some(r), &message);
                    return Ok(());
                }
            }
        }
        match combine(&requests) {
            Ok(answer) => {
                for s in &mut ranks {
                    send_ok(s, &answer)?;
                }
            }
            Err(message) => {
                fail_all(&mut ranks, &local, None, &message);
                return Ok(());
            }
        }
    }
}

/// The ranks' integers summed element by element, wrapping as NCCL's integer sums do.
fn wrapping_sums<T: Element>(parts: &[HostData], add: fn(T, T) -> T) -> HostData {
    let mut sum = vec![T::default(); parts.first().map_or(0, HostData::len)];
    for values in parts.iter().filter_map(T::slice_of) {
        sum.iter_mut()
            .zip(values)
            .for_each(|(s, x)| *s = add(*s, *x));
    }
    T::into_host(sum)
}

/// Sends `message` to every rank but `except`, those of the hub's own process last.
fn fail_all(ranks: &mut [TcpStream], local: &[bool], except: Option<usize>, message: &str) {
    for last in [false, true] {
        for (k, s) in ranks.iter_mut().enumerate() {
            if Some(k) != except && local.get(k).copied().unwrap_or(false) == last {
                send_error(s, message);
            }
        }
    }
}

/// The collective's result from every rank's request (in rank order), or why the ranks'
/// requests do not make one collective.
fn combine(requests: &[Request]) -> std::result::Result<Vec<u8>, String> {
    let first = &requests[0];
    for (r, q) in requests.iter().enumerate() {
        if (q.kind, q.data_type, q.root, q.bytes.len())
            != (first.kind, first.data_type, first.root, first.bytes.len())
        {
            return Err(format!(
                "the ranks called different collectives: rank 0 {}, rank {r} {}",
                first.describe(),
                q.describe()
            ));
        }
    }
    let world = requests.len();
    match first.kind {
        0 | 1 => {
            let dtype = dtype_of(first.data_type as std::ffi::c_int)
                .ok_or_else(|| format!("NCCL data type {} is not reduced", first.data_type))?;
            let parts = requests
                .iter()
                .map(|q| HostData::from_le_bytes(dtype, &q.bytes))
                .collect::<Option<Vec<_>>>()
                .ok_or("the bytes do not fill whole elements")?;
            let sum = match dtype {
                DType::I32 => wrapping_sums(&parts, i32::wrapping_add),
                DType::I64 => wrapping_sums(&parts, i64::wrapping_add),
                _ => {
                    let mut sum = vec![0f64; parts[0].len()];
                    for p in &parts {
                        sum.iter_mut()
                            .zip(p.to_f64_vec())
                            .for_each(|(s, x)| *s += x);
                    }
                    if first.kind == 1 {
                        sum.iter_mut().for_each(|s| *s /= world as f64);
                    }
                    HostData::from_f64_slice(dtype, &sum)
                }
            };
            Ok(sum.to_le_bytes())
        }
        2 => Ok(requests
            .iter()
            .flat_map(|q| q.bytes.iter().copied())
            .collect()),
        3 => requests
            .get(first.root as usize)
            .map(|q| q.bytes.clone())
            .ok_or_else(|| format!("root {} is not a rank of {world}", first.root)),
        other => Err(format!("unknown collective {other}")),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn request(kind: u8, data_type: u8, bytes: Vec<u8>) -> Request {
        Request {
            kind,
            data_type,
            root: 0,
            bytes,
        }
    }

    #[test]
    fn sums_wrap_and_averages_divide() {
        let ints = |v: &[i32]| HostData::I32(v.to_vec()).to_le_bytes();
        let got = combine(&[
            request(0, 2, ints(&[i32::MAX, 1])),
            request(0, 2, ints(&[1, 2])),
        ])
        .unwrap();
        assert_eq!(got, ints(&[i32::MIN, 3]));
        let floats = |v: &[f32]| HostData::F32(v.to_vec()).to_le_bytes();
        let got = combine(&[
            request(1, 7, floats(&[1.0, 4.0])),
            request(1, 7, floats(&[2.0, 8.0])),
        ])
        .unwrap();
        assert_eq!(got, floats(&[1.5, 6.0]));
    }

    #[test]
    fn different_collectives_are_an_error() {
        let e = combine(&[request(0, 7, vec![0; 8]), request(2, 7, vec![0; 8])]).unwrap_err();
        assert!(e.contains("different collectives"), "{e}");
        let e = combine(&[request(0, 7, vec![0; 8]), request(0, 7, vec![0; 4])]).unwrap_err();
        assert!(e.contains("rank 1"), "{e}");
    }

    #[test]
    fn a_foreign_id_is_refused() {
        let e = Member::join(&NcclId([0; NCCL_ID_BYTES]), 0, 1, Duration::from_secs(1));
        assert!(e.is_err());
    }

    #[test]
    fn ranks_meet_at_the_hub() {
        let id = new_id().unwrap();
        let timeout = Duration::from_secs(20);
        let threads: Vec<_> = (0..3)
            .map(|rank| {
                let id = id.clone();
                std::thread::spawn(move || {
                    let mut m = Member::join(&id, rank, 3, timeout).unwrap();
                    let call = Call {
                        kind: CallKind::AllGather,
                        data_type: 0,
                        count: 2,
                        in_bytes: 2,
                        out_bytes: 6,
                    };
                    m.call("all_gather", &call, &[rank as u8, 10 + rank as u8])
                        .unwrap()
                })
            })
            .collect();
        for t in threads {
            assert_eq!(t.join().unwrap(), vec![0, 10, 1, 11, 2, 12]);
        }
    }

    #[test]
    fn a_rank_that_leaves_fails_the_others() {
        let id = new_id().unwrap();
        let timeout = Duration::from_secs(20);
        let leaver = {
            let id = id.clone();
            std::thread::spawn(move || drop(Member::join(&id, 1, 2, timeout).unwrap()))
        };
        let mut m = Member::join(&id, 0, 2, timeout).unwrap();
        leaver.join().unwrap();
        let call = Call {
            kind: CallKind::Broadcast(0),
            data_type: 0,
            count: 1,
            in_bytes: 1,
            out_bytes: 1,
        };
        let e = m.call("broadcast", &call, &[1]).unwrap_err();
        assert!(e.to_string().contains("rank 1 left"), "{e}");
    }
}
