//! The whole backend conformance suite on the CPU with every op replayed as a graph replays
//! it: an observer on the test's thread runs each op the suite dispatches once more through
//! `Op::execute` (what `Graph::run` calls for every op node, with the op and attributes
//! the trace recorded) and checks that the replay gives the eager outputs, dtype, shape
//! and bits. So every conformance op, over the suite's random shapes, broadcasts, views,
//! dtypes and values, computes the same traced and eager.

use ferroflow::tensor::{Op, OpEvent, OpObserver, Tensor};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;

/// Replays each op and compares; counts what it checked.
struct ReplayCheck {
    checked: AtomicUsize,
}

/// A tensor as (dtype, shape, little-endian bytes).
fn content(t: &Tensor) -> (String, Vec<usize>, Vec<u8>) {
    let bytes = t
        .to_host()
        .map(|h| h.to_le_bytes())
        .unwrap_or_else(|e| panic!("reading an output back: {e}"));
    (t.dtype().to_string(), t.shape().to_vec(), bytes)
}

impl OpObserver for ReplayCheck {
    fn on_op(&self, event: &OpEvent<'_>) {
        // Not replayed by value: constants (no inputs), draws from the global generator (a
        // replay draws anew, by design, and would move the eager stream), host reads and
        // host-library functions (a graph refuses those).
        if matches!(
            event.op,
            Op::Constant | Op::RandomStateful { .. } | Op::HostFunction { .. } | Op::ToHost
        ) {
            return;
        }
        let replayed = event
            .op
            .execute(event.inputs)
            .unwrap_or_else(|e| panic!("replaying {:?} failed where eager ran: {e}", event.op));
        assert_eq!(
            replayed.len(),
            event.outputs.len(),
            "replaying {:?}: the number of outputs",
            event.op
        );
        for (k, (r, e)) in replayed.iter().zip(event.outputs).enumerate() {
            assert!(
                content(r) == content(e),
                "replaying {:?} on inputs {:?}: output {k} differs from the eager op's",
                event.op,
                event
                    .inputs
                    .iter()
                    .map(|t| (t.dtype(), t.shape().to_vec()))
                    .collect::<Vec<_>>()
            );
        }
        self.checked.fetch_add(1, Ordering::Relaxed);
    }
}

/// The families with no op to replay by value (libtest names each test's thread after the
/// test): constants and reads back only; bad arguments, every one an error; draws from the
/// global generator.
const NOTHING_TO_REPLAY: [&str; 3] = [
    "creation_and_round_trip",
    "hostile_arguments",
    "random_statistics",
];

impl Drop for ReplayCheck {
    fn drop(&mut self) {
        // A family that dispatched nothing checkable would pass vacuously.
        let family = std::thread::current().name().unwrap_or("").to_string();
        if !std::thread::panicking() && !NOTHING_TO_REPLAY.contains(&family.as_str()) {
            assert!(
                *self.checked.get_mut() > 0,
                "no op of the conformance family {family:?} was replayed"
            );
        }
    }
}

ferroflow_tensor::conformance_tests!(
    observed: {
        ferroflow::init();
        Some(ferroflow::tensor::Device::CPU)
    },
    Arc::new(ReplayCheck {
        checked: AtomicUsize::new(0),
    })
);
