//! Elsewhere than Linux (no futexes, no `/proc`) a group keeps to gRPC:
//! [`ShmLinks::connect`] finds no links, and the type has no values.

use super::{Piece, Rendezvous};
use ferroflow_tensor::Result;
use std::time::Duration;

/// No links can exist on this platform: a type without values.
pub(crate) enum ShmLinks {}

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
    pub(crate) fn flush(&self, _op: &str) -> Result<()> {
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
