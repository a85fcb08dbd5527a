//! Data shared by the Keras integration tests.

use ferroflow_tensor::{random, DType, Tensor};

/// Three Gaussian blobs in 2-D (centres (0, 3), (3, -2), (-3, -2), σ 0.7), labels 0..3 as
/// int64; the same `seed` gives the same points.
pub fn blobs(n: usize, seed: u64) -> (Tensor, Tensor) {
    ferroflow::init();
    let y = random::stateless_uniform(&[n], [seed, 1], 0.0, 3.0, DType::I64).unwrap();
    let centers = Tensor::from_vec(vec![0.0f32, 3.0, 3.0, -2.0, -3.0, -2.0], &[3, 2]).unwrap();
    let noise = random::stateless_normal(&[n, 2], [seed, 2], 0.0, 0.7, DType::F32).unwrap();
    (centers.gather(&y, 0).unwrap().add(&noise).unwrap(), y)
}
