//! Shared-memory links between the tasks of a [`crate::CollectiveGroup`] that all run on
//! one host (Linux): the ring's messages go through memory both processes map instead of
//! loopback gRPC, as Open MPI's shared-memory transport and NCCL's do for local ranks.
//!
//! # Layout
//! Each task creates one segment in `/dev/shm` (mode 0600, its pages reserved up front so
//! a full `/dev/shm` is an error at setup, never a `SIGBUS` later): a header with the
//! task's doorbell, then one inbox channel per other task (1 MiB from the previous task of
//! the ring, which carries the ring algorithms' data; 128 KiB from each other task, for
//! short all-reduces' direct exchanges: 4 tasks take 5 MiB in all). A channel is a single-producer
//! single-consumer byte ring: the sender advances `head`, the receiver `tail`, both only
//! forward, every position a multiple of 16. A message is a 16-byte header (a hash of its
//! key, its length) and its payload padded to 16 bytes, written and read in pieces as room
//! and data appear, so a message longer than the ring streams through it.
//!
//! # Waiting
//! A task waits for data or room on its own doorbell (a futex word in its segment) that
//! every sender and receiver it deals with rings after moving a position: an event count,
//! so a ring between the task's check and its sleep is never lost. While it waits it
//! pushes the messages it has queued for others (a send never blocks: what does not fit
//! waits in a queue), so two tasks sending to each other at once cannot deadlock. Every
//! 10 ms without an event it checks that the peer it waits for is alive (its `/proc`
//! entry, with its start time against a reused pid): a dead peer is an error at once, a
//! hung one after the collective timeout.
//!
//! # Setup
//! [`ShmLinks::connect`] runs over the group's gRPC mailboxes at its first collective:
//! the tasks compare their hosts' boot ids; if all match, each creates its segment and
//! sends its path, a random nonce and its process; each maps the others' (their processes
//! seen in its own `/proc`, else it could not tell them dead) and says whether it could; the
//! links are used only when every task could map every other's (all or none, so the ring
//! never mixes transports). The segment files are unlinked once all have answered: a
//! crash later leaves nothing behind in `/dev/shm`.

#[cfg(target_os = "linux")]
mod linux;
#[cfg(not(target_os = "linux"))]
mod unsupported;

#[cfg(target_os = "linux")]
pub(crate) use linux::ShmLinks;
#[cfg(not(target_os = "linux"))]
pub(crate) use unsupported::ShmLinks;

use bytes::Bytes;
use ferroflow_tensor::Result;

/// What [`ShmLinks::receive`] hands its sink: the message's length first, then its
/// payload in consecutive pieces (each a multiple of 16 bytes long but the last).
/// (Never made where there are no links.)
#[cfg_attr(not(target_os = "linux"), allow(dead_code))]
pub(crate) enum Piece<'a> {
    /// The payload's length in bytes.
    Length(usize),
    /// The payload's bytes from `offset`.
    Bytes { offset: usize, bytes: &'a [u8] },
}

/// How the setup reaches the other tasks: over the group's gRPC mailboxes.
pub(crate) trait Rendezvous {
    /// Delivers `payload` to task `to` under `key`.
    fn send(&self, to: usize, key: &str, payload: Vec<u8>) -> Result<()>;
    /// What task `from` delivered under `key` (waiting up to the collective timeout).
    fn receive(&self, from: usize, key: &str) -> Result<Bytes>;
}
