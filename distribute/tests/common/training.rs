//! The training both multi-worker suites compare (`multi_worker.rs` over the ring, the facade's
//! `tests/nccl_collectives.rs` through NCCL): a small regression model, its data, and one epoch of `fit` with the
//! global batch, whose weights a run of N workers must reproduce.

use ferroflow::keras::activations::Activation;
use ferroflow::keras::{layers::Dense, losses::MeanSquaredError, sequential, FitConfig, Model};
use ferroflow::optim::Sgd;
use ferroflow::Tensor;

pub const STEPS: usize = 20;
pub const GLOBAL_BATCH: usize = 24;

pub fn data() -> (Tensor, Tensor) {
    let n = STEPS * GLOBAL_BATCH;
    let x: Vec<f32> = (0..n * 5)
        .map(|i| ((i * 53 % 97) as f32) / 48.0 - 1.0)
        .collect();
    let y: Vec<f32> = (0..n)
        .map(|i| (x[5 * i] - 2.0 * x[5 * i + 3]).sin() + 0.1 * x[5 * i + 4])
        .collect();
    (
        Tensor::from_vec(x, &[n, 5]).unwrap(),
        Tensor::from_vec(y, &[n, 1]).unwrap(),
    )
}

pub fn model() -> Model {
    let mut m = Model::from(sequential![
        Dense::new(16).activation(Activation::Tanh),
        Dense::new(1)
    ]);
    m.compile(Sgd::new(0.05), MeanSquaredError::new(), &[])
        .unwrap();
    m
}

/// Trains 20 steps (one epoch, shuffled) and returns the weights.
pub fn train(m: &mut Model) -> Vec<f32> {
    let (x, y) = data();
    m.fit(
        &x,
        &y,
        FitConfig::new()
            .epochs(1)
            .batch_size(GLOBAL_BATCH)
            .verbose(0),
    )
    .unwrap();
    m.weights()
        .iter()
        .flat_map(|v| v.peek().to_vec::<f32>().unwrap())
        .collect()
}

pub fn f32_hex(w: &[f32]) -> String {
    w.iter()
        .map(|v| format!("{:08x}", v.to_bits()))
        .collect::<Vec<_>>()
        .join(",")
}

pub fn from_hex(s: &str) -> Vec<f32> {
    s.split(',')
        .map(|h| f32::from_bits(u32::from_str_radix(h, 16).expect("hex")))
        .collect()
}

/// The largest difference between two weight lists of one model.
pub fn max_difference(a: &[f32], b: &[f32]) -> f32 {
    assert_eq!(a.len(), b.len(), "weights of different models");
    a.iter()
        .zip(b)
        .map(|(x, y)| (x - y).abs())
        .fold(0.0f32, f32::max)
}

/// One process's weights after training with the global batch (seed 3, the chief's).
pub fn reference_weights() -> Vec<f32> {
    ferroflow::init();
    ferroflow::testing::seeded(3, || train(&mut model()))
}
