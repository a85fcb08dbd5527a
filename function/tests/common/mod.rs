//! Helpers shared by the graph-function tests.

use ferroflow::{DType, Tensor};

/// The values' bit patterns as float64 (equal bits: the same kernels ran).
pub fn bits(t: &Tensor) -> Vec<u64> {
    t.cast(DType::F64)
        .unwrap()
        .to_vec::<f64>()
        .unwrap()
        .iter()
        .map(|v| v.to_bits())
        .collect()
}
