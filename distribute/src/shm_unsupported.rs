//! Shared-memory links between the tasks of a group exist on Linux only (futexes and
//! `/proc`); elsewhere the group keeps to gRPC: [`ShmLinks::connect`] finds none.

use bytes::Bytes;
use ferroflow_tensor::Result;
use std::time::Duration;

/// What [`ShmLinks::receive`] hands its sink (never, here).
pub(crate) enum Piece<'a> {
    /// The payload's length in bytes.
    Length(usize),
    /// The payload's bytes from `offset`.
    Bytes { offset: usize, bytes: &'a [u8] },
}

/// No links can exist on this platform: a type without values.
pub(crate) enum ShmLinks {}

/// How the setup reaches the other tasks (unused here).
pub(crate) trait Rendezvous {
    /// Delivers `payload` to task `to` under `key`.
    fn send(&self, to: usize, key: &str, payload: Vec<u8>) -> Result<()>;
    /// What task `from` delivered under `key`.
    fn receive(&self, from: usize, key: &str) -> Result<Bytes>;
}

impl ShmLinks {
    /// Never any links on this platform.
    pub(crate) fn connect(
        _rendezvous: &dyn Rendezvous,
        _rank: usize,
        _names: Vec<String>,
        _timeout: Duration,
        _key: &str,
    ) -> Result<Option<ShmLinks>> {
        Ok(None)
    }
    pub(crate) fn send(&self, _to: usize, _key: &str, _payload: &[u8]) -> Result<()> {
        match *self {}
    }
    pub(crate) fn flush(&self) -> Result<()> {
        match *self {}
    }
    pub(crate) fn receive(
        &self,
        _from: usize,
        _key: &str,
        _sink: &mut dyn FnMut(Piece<'_>) -> Result<()>,
    ) -> Result<()> {
        match *self {}
    }
}
