//! TensorFlow's "Multi-worker training with Keras" tutorial: the MNIST MLP trained with
//! `fit` under `MultiWorkerMirroredStrategy`, one process per worker.
//!
//! Run two workers on this machine through the launcher (it fills in `TF_CONFIG`):
//!
//! ```text
//! cargo build --release --example multi_worker_mnist --bin ferroflow
//! target/release/ferroflow launch --workers 2 -- target/release/examples/multi_worker_mnist
//! ```
//!
//! On a real cluster, start the same binary on each machine with `TF_CONFIG` set (Kubeflow's
//! TFJob does), or build it with the `mpi` feature and start it with `mpirun` (the
//! collectives then run over MPI, no `TF_CONFIG` needed):
//!
//! ```text
//! cargo build --release --features mpi --example multi_worker_mnist
//! mpirun -np 2 target/release/examples/multi_worker_mnist
//! ```
//!
//! Without either it trains as a single worker.
//!
//! Profiling on demand (TF 2.4's multi-worker profiling): with `--profile-ports` the
//! launcher gives each worker a port, on which it runs a profiler server; capture 2 s from
//! every worker while they train, then read the Pod viewer:
//!
//! ```text
//! target/release/ferroflow launch --workers 2 --profile-ports -- target/release/examples/multi_worker_mnist
//! # it prints: profiler servers (...): grpc://127.0.0.1:PORT1,grpc://127.0.0.1:PORT2
//! target/release/ferroflow profile capture --workers grpc://127.0.0.1:PORT1,grpc://127.0.0.1:PORT2 --duration 2s logs
//! target/release/ferroflow profile pod logs
//! ```
//!
//! (or give those addresses to TensorBoard's *Capture Profile* dialog).
//!
//! Options: `--epochs N` (2), `--per-worker-batch N` (64; the global batch is N × workers,
//! as in the tutorial), `--steps-per-epoch N`, `--out DIR` (`target/multi_worker_mnist`:
//! the chief writes the weights there), `--timeout S` (60: how long a collective waits for
//! a lost worker before failing). Exits non-zero below 95% test accuracy after 2 epochs.

mod common;

use std::path::PathBuf;
use std::time::Duration;

use ferroflow::distribute::{CommunicationOptions, MultiWorkerMirroredStrategy, Strategy};
use ferroflow::keras::losses::SparseCategoricalCrossentropy;
use ferroflow::keras::{applications, FitConfig, Model};
use ferroflow::optim::Adam;
use ferroflow::{Error, Result};

fn main() -> Result<()> {
    ferroflow::init();
    let (mut epochs, mut per_worker_batch, mut steps, mut timeout) = (2usize, 64usize, None, 60u64);
    let mut out = PathBuf::from("target/multi_worker_mnist");
    let mut it = std::env::args().skip(1);
    let bad = |m: String| Error::invalid("multi_worker_mnist", m);
    while let Some(a) = it.next() {
        let mut number = |name: &str| -> Result<usize> {
            it.next()
                .and_then(|v| v.parse().ok())
                .ok_or_else(|| bad(format!("{name} needs a number")))
        };
        match a.as_str() {
            "--epochs" => epochs = number("--epochs")?,
            "--per-worker-batch" => per_worker_batch = number("--per-worker-batch")?,
            "--steps-per-epoch" => steps = Some(number("--steps-per-epoch")?),
            "--timeout" => timeout = number("--timeout")? as u64,
            "--out" => {
                out = PathBuf::from(
                    it.next()
                        .ok_or_else(|| bad("--out needs a folder".into()))?,
                )
            }
            other => return Err(bad(format!("unknown argument {other:?}"))),
        }
    }
    // Every worker seeds alike (the chief's initial weights are broadcast anyway).
    ferroflow::random::set_seed(1);
    // A profiler server when the launcher gave this worker a port (`--profile-ports`):
    // captures then come on demand, and cost nothing in between.
    let _profiler = ferroflow::profiler::server::start_from_env()?;
    let strategy = MultiWorkerMirroredStrategy::new(CommunicationOptions {
        timeout: Duration::from_secs(timeout),
        ..Default::default()
    })?;
    let (workers, me) = (strategy.num_workers(), strategy.worker_index());
    println!(
        "worker {me} of {workers}, {} replicas in sync",
        strategy.num_replicas_in_sync()
    );
    let (x_train, y_train) = common::load_mnist("train")?;
    let (x_test, y_test) = common::load_mnist("t10k")?;

    // The model and its optimizer are created in the strategy's scope: their variables
    // are mirrored and start from the chief's values.
    let mut model = {
        let _scope = strategy.scope();
        let mut m = Model::from(applications::mnist_mlp());
        m.build(&[28, 28, 1])?;
        m.compile(
            Adam::new(1e-3),
            SparseCategoricalCrossentropy::new(true),
            &["accuracy"],
        )?;
        m
    };
    let global_batch = per_worker_batch * workers;
    let start = std::time::Instant::now();
    let mut config = FitConfig::new()
        .epochs(epochs)
        .batch_size(global_batch)
        .verbose(if me == 0 { 2 } else { 0 });
    if let Some(s) = steps {
        config = config.steps_per_epoch(s);
    }
    println!("worker {me}: training");
    let history = model.fit(&x_train, &y_train, config)?;
    let secs = start.elapsed().as_secs_f64();
    let test = model.evaluate(&x_test, &y_test, 1000)?;
    let acc = test.get("accuracy").unwrap_or(0.0);
    let trained = steps.map_or(x_train.shape()[0], |s| {
        (s * global_batch).min(x_train.shape()[0])
    }) * epochs;
    println!(
        "worker {me}: loss {:.4} → test accuracy {:.2}% after {epochs} epoch(s) ({:.1} s, {:.0} samples/s over all workers)",
        history.get("loss").and_then(|l| l.last().copied()).unwrap_or(f64::NAN),
        acc * 100.0,
        secs,
        trained as f64 / secs
    );
    // Only the chief writes (TF: the others write to temporary places and delete them).
    if strategy.is_chief() {
        let path = out.join("mlp.safetensors");
        model.save_weights(&path)?;
        println!("chief: weights written to {}", path.display());
    }
    if steps.is_none() && epochs >= 2 && acc < 0.95 {
        return Err(bad(format!("test accuracy {:.2}% < 95%", acc * 100.0)));
    }
    Ok(())
}
