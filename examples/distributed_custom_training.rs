//! TensorFlow's "Custom training with tf.distribute.Strategy" tutorial: a training loop
//! written by hand — `strategy.run` of a step that scales its loss by the global batch
//! (`compute_average_loss`) and applies its gradients, `strategy.reduce` of the replicas'
//! losses — on MNIST.
//!
//! Alone it mirrors over two logical CPU devices (`MirroredStrategy`); started by the
//! launcher (or anything that sets `TF_CONFIG`), or by `mpirun` (built with the `mpi`
//! feature), it runs as one worker of a `MultiWorkerMirroredStrategy`:
//!
//! ```text
//! cargo run --release --example distributed_custom_training
//! cargo build --release --example distributed_custom_training --bin ferroflow
//! target/release/ferroflow launch --workers 2 -- target/release/examples/distributed_custom_training
//! cargo build --release --features mpi --example distributed_custom_training
//! mpirun -np 2 target/release/examples/distributed_custom_training
//! ```
//!
//! Options: `--epochs N` (1), `--global-batch N` (128), `--steps N` (all). Exits non-zero
//! below 92% test accuracy after a full epoch.

mod common;

use std::sync::Arc;

use ferroflow::data::Dataset;
use ferroflow::distribute::{
    compute_average_loss, CommunicationOptions, InputOptions, MirroredStrategy,
    MultiWorkerMirroredStrategy, ReduceOp, Strategy,
};
use ferroflow::keras::losses::{Loss, Reduction, SparseCategoricalCrossentropy};
use ferroflow::keras::metrics::{Metric, SparseCategoricalAccuracy};
use ferroflow::keras::{applications, Layer};
use ferroflow::optim::{Adam, Optimizer};
use ferroflow::prelude::{GradientTape, Source};
use ferroflow::{DType, DeviceKind, Error, Result, Tensor};

fn main() -> Result<()> {
    ferroflow::init();
    let (mut epochs, mut global_batch, mut steps) = (1usize, 128usize, usize::MAX);
    let mut it = std::env::args().skip(1);
    let bad = |m: String| Error::invalid("distributed_custom_training", m);
    while let Some(a) = it.next() {
        let mut number = |name: &str| -> Result<usize> {
            it.next()
                .and_then(|v| v.parse().ok())
                .ok_or_else(|| bad(format!("{name} needs a number")))
        };
        match a.as_str() {
            "--epochs" => epochs = number("--epochs")?,
            "--global-batch" => global_batch = number("--global-batch")?,
            "--steps" => steps = number("--steps")?,
            other => return Err(bad(format!("unknown argument {other:?}"))),
        }
    }
    ferroflow::random::set_seed(7);
    let multi_worker = std::env::var_os("TF_CONFIG").is_some()
        || ferroflow::cluster::MpiLaunch::from_env()?.is_some();
    let strategy: Arc<dyn Strategy> = if multi_worker {
        Arc::new(MultiWorkerMirroredStrategy::new(
            CommunicationOptions::default(),
        )?)
    } else {
        ferroflow::config::set_logical_device_configuration(DeviceKind::Cpu, 2)?;
        Arc::new(MirroredStrategy::new(&["/CPU:0", "/CPU:1"])?)
    };
    println!(
        "{}: worker {} of {}, {} replicas in sync",
        strategy.name(),
        strategy.worker_index(),
        strategy.num_workers(),
        strategy.num_replicas_in_sync()
    );
    let (x_train, y_train) = common::load_mnist("train")?;
    let (x_test, y_test) = common::load_mnist("t10k")?;
    // The same shuffle on every worker (each keeps its rows of every global batch).
    let train = Dataset::from_tensor_slices((x_train, y_train))?
        .shuffle(60_000, Some(7), true)?
        .batch(global_batch, true)?;
    let train = strategy.experimental_distribute_dataset(&train, InputOptions::default())?;

    // Created in the scope: mirrored variables.
    let (mut model, mut optimizer) = {
        let _scope = ferroflow::distribute::enter_scope(strategy.clone());
        let mut model = applications::mnist_mlp();
        model.forward(&Tensor::zeros(&[1, 28, 28, 1], DType::F32)?, false)?; // build
        (model, Adam::new(1e-3))
    };
    let loss_object = SparseCategoricalCrossentropy {
        from_logits: true,
        reduction: Reduction::None,
    };
    let mut train_accuracy = SparseCategoricalAccuracy::new();
    let start = std::time::Instant::now();
    for epoch in 0..epochs {
        let (mut total, mut batches) = (0.0f64, 0usize);
        train_accuracy.reset_state();
        for batch in train.iter().take(steps) {
            let batch = batch?;
            let per_replica_losses = strategy.run_with(&batch, |_ctx, (x, y)| {
                let tape = GradientTape::new();
                let logits = model.forward(x, true)?;
                let per_example = loss_object.call(y, &logits, None)?;
                let loss = compute_average_loss(&per_example, Some(global_batch))?;
                let vars = model.trainable_weights();
                let sources: Vec<Source> = vars.iter().map(Source::from).collect();
                let grads = tape.gradient(&loss, &sources)?;
                optimizer.apply_gradients(grads.into_iter().zip(vars).collect(), true)?;
                train_accuracy.update_state(y, &logits, None)?;
                Ok(loss)
            })?;
            total += strategy
                .reduce(ReduceOp::Sum, &per_replica_losses, None)?
                .item::<f32>()? as f64;
            batches += 1;
        }
        println!(
            "epoch {}: loss {:.4}, this worker's training accuracy {:.2}% ({:.1} s)",
            epoch + 1,
            total / batches.max(1) as f64,
            train_accuracy.result() * 100.0,
            start.elapsed().as_secs_f64()
        );
    }
    let logits = model.forward(&x_test, false)?;
    let mut test_accuracy = SparseCategoricalAccuracy::new();
    test_accuracy.update_state(&y_test, &logits, None)?;
    let acc = test_accuracy.result();
    println!("test accuracy {:.2}%", acc * 100.0);
    if steps == usize::MAX && acc < 0.92 {
        return Err(bad(format!("test accuracy {:.2}% < 92%", acc * 100.0)));
    }
    Ok(())
}
