//! `cargo xtask bench mixed`: the MNIST CNN under each dtype policy against float32 in the
//! same run: seconds per epoch (`fit`, batch 128, the second of two epochs on 10k images) and
//! peak activation memory of one training step (the most tensor bytes live at once during
//! forward and backward, minus what was live before: weights, optimizer slots, the batch).

use std::time::Instant;

use ferroflow::keras::losses::SparseCategoricalCrossentropy;
use ferroflow::keras::mixed_precision::{set_global_policy, Policy};
use ferroflow::keras::{applications, FitConfig, Model};
use ferroflow::Tensor;

const POLICIES: [&str; 3] = ["float32", "mixed_float16", "mixed_bfloat16"];
const SAMPLES: usize = 10_000;

fn median(v: &[f64]) -> f64 {
    let mut v = v.to_vec();
    v.sort_by(f64::total_cmp);
    v[v.len() / 2]
}

/// (seconds for the second epoch, peak activation bytes of one step) under `policy`.
fn one(policy: &str, x: &Tensor, y: &Tensor) -> ferroflow::Result<(f64, f64)> {
    set_global_policy(Policy::new(policy)?);
    let mut model = Model::from(applications::mnist_cnn());
    set_global_policy(Policy::default());
    model.compile(
        ferroflow::optim::Adam::new(1e-3),
        SparseCategoricalCrossentropy::new(true),
        &["accuracy"],
    )?;
    let times = std::sync::Arc::new(std::sync::Mutex::new(vec![]));
    model.fit(
        x,
        y,
        FitConfig::new()
            .epochs(2)
            .batch_size(128)
            .verbose(0)
            .callback(crate::bench::EpochTimer(times.clone(), Instant::now())),
    )?;
    let bx = x.slice(&[0, 0, 0, 0], &[128, 28, 28, 1])?.contiguous()?;
    let by = y.slice(&[0], &[128])?.contiguous()?;
    let before = ferroflow::live_tensor_bytes();
    ferroflow::reset_peak_tensor_bytes();
    model.train_step(&[bx], &[by])?;
    let peak = ferroflow::peak_tensor_bytes().saturating_sub(before);
    let epoch = *times
        .lock()
        .expect("timer lock")
        .last()
        .unwrap_or(&f64::NAN);
    Ok((epoch, peak as f64))
}

/// Runs `rounds` interleaved rounds and returns the Markdown table.
/// The table, and into `figures` each policy's `mixed_<policy>_speed` and
/// `mixed_<policy>_memory` (relative to float32) for `bench --check`.
pub(crate) fn run(rounds: usize, figures: &mut crate::bench::Figures) -> String {
    let (x, y) = match crate::bench::mnist_train(SAMPLES) {
        Ok(d) => d,
        Err(e) => return format!("mixed benchmark: cannot read MNIST: {e}\n"),
    };
    let mut epoch: Vec<Vec<f64>> = vec![vec![]; POLICIES.len()];
    let mut memory: Vec<Vec<f64>> = vec![vec![]; POLICIES.len()];
    for r in 0..rounds {
        eprintln!("xtask bench: mixed precision round {}/{rounds}", r + 1);
        for (i, p) in POLICIES.iter().enumerate() {
            match one(p, &x, &y) {
                Ok((t, m)) => {
                    epoch[i].push(t);
                    memory[i].push(m);
                }
                Err(e) => eprintln!("xtask bench: mixed {p}: {e}"),
            }
        }
    }
    let mut md = format!(
        "| MNIST CNN, {SAMPLES} samples, batch 128 | seconds per epoch | speed vs float32 | peak activation memory per step | vs float32 |\n|---|---|---|---|---|\n"
    );
    let median_or_nan = |v: &[f64]| if v.is_empty() { f64::NAN } else { median(v) };
    let (t32, m32) = (median_or_nan(&epoch[0]), median_or_nan(&memory[0]));
    for (i, p) in POLICIES.iter().enumerate() {
        if epoch[i].is_empty() {
            md.push_str(&format!("| {p} | n/a | n/a | n/a | n/a |\n"));
            continue;
        }
        let (t, m) = (median(&epoch[i]), median(&memory[i]));
        figures.insert(format!("mixed_{p}_speed"), t32 / t);
        figures.insert(format!("mixed_{p}_memory"), m / m32);
        md.push_str(&format!(
            "| {p} | {t:.2} s | {:.2}x | {:.1} MiB | {:.2}x |\n",
            t32 / t,
            m / (1 << 20) as f64,
            m / m32
        ));
    }
    md
}
