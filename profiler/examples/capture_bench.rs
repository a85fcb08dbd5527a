//! The worker of `cargo xtask bench profiler`'s capture section: the MNIST MLP trained with
//! `fit` under `MultiWorkerMirroredStrategy` (one process per worker, started by the
//! launcher with profiler ports), serving a profiler server, timing every step. It prints
//! `training` when the first step begins and, at the end, `STEP <end wall-clock ns>
//! <duration ns>` per step, from which the bench tells the steps before, during and after
//! a capture apart.
//!
//! Options: `--steps N` (600: rounded up to whole epochs), `--batch N` per worker (64).

use ferroflow::distribute::{CommunicationOptions, MultiWorkerMirroredStrategy, Strategy};
use ferroflow::keras::callbacks::{Callback, Logs};
use ferroflow::keras::losses::SparseCategoricalCrossentropy;
use ferroflow::keras::{applications, FitConfig, Model};
use ferroflow::optim::Adam;
use ferroflow::{Error, Result};
use std::sync::{Arc, Mutex};
use std::time::{Instant, SystemTime, UNIX_EPOCH};

/// Every step's end (ns since the Unix epoch) and duration (ns).
#[derive(Default)]
struct StepTimes {
    began: Option<Instant>,
    steps: Arc<Mutex<Vec<(u128, u128)>>>,
}

impl Callback for StepTimes {
    fn on_train_batch_begin(&mut self, batch: usize, _: &mut Model) -> Result<()> {
        if batch == 0
            && self
                .steps
                .lock()
                .unwrap_or_else(|e| e.into_inner())
                .is_empty()
        {
            println!("training");
        }
        self.began = Some(Instant::now());
        Ok(())
    }

    fn on_train_batch_end(&mut self, _: usize, _: &Logs, _: &mut Model) -> Result<()> {
        if let Some(b) = self.began.take() {
            let now = SystemTime::now()
                .duration_since(UNIX_EPOCH)
                .map_or(0, |d| d.as_nanos());
            self.steps
                .lock()
                .unwrap_or_else(|e| e.into_inner())
                .push((now, b.elapsed().as_nanos()));
        }
        Ok(())
    }
}

fn main() -> Result<()> {
    ferroflow::init();
    let (mut steps, mut batch) = (600usize, 64usize);
    let mut it = std::env::args().skip(1);
    while let Some(a) = it.next() {
        let v: usize = it
            .next()
            .and_then(|v| v.parse().ok())
            .ok_or_else(|| Error::invalid("capture_bench", format!("{a} needs a number")))?;
        match a.as_str() {
            "--steps" => steps = v,
            "--batch" => batch = v,
            other => return Err(Error::invalid("capture_bench", format!("unknown {other}"))),
        }
    }
    let _server = ferroflow::profiler::server::start_from_env()?;
    ferroflow::random::set_seed(1);
    let strategy = MultiWorkerMirroredStrategy::new(CommunicationOptions::default())?;
    let dir = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../datasets/mnist");
    let (x, y) = ferroflow::data::idx::load_mnist(dir, "train")?;
    let mut model = {
        let _scope = strategy.scope();
        let mut m = Model::from(applications::mnist_mlp());
        m.build(&[28, 28, 1])?;
        m.compile(
            Adam::new(1e-3),
            SparseCategoricalCrossentropy::new(true),
            &[],
        )?;
        m
    };
    let global = batch * strategy.num_workers();
    let per_epoch = x.shape()[0] / global;
    let per_epoch = per_epoch.max(1);
    let epochs = steps.div_ceil(per_epoch);
    let times = StepTimes::default();
    let steps_taken = times.steps.clone();
    model.fit(
        &x,
        &y,
        FitConfig::new()
            .epochs(epochs)
            .batch_size(global)
            .verbose(0)
            .callback(times),
    )?;
    for (end, dur) in steps_taken.lock().unwrap_or_else(|e| e.into_inner()).iter() {
        println!("STEP {end} {dur}");
    }
    Ok(())
}
