//! TensorFlow's "Writing a training loop from scratch" guide: a Keras model trained by a
//! loop written by hand, its training step — forward pass, loss, gradients and the
//! optimizer's `apply_gradients` — one graph function (TF's `@tf.function`), traced on the
//! first batch and replayed after; metrics updated from what the step returns.
//!
//! The optimizer is a `SharedOptimizer`: inside the graph its step is one host node that
//! runs on every call with that call's gradients (step counter and schedules move as
//! eagerly), where a plain `&mut` optimizer would be refused while tracing.
//!
//! Run: `cargo run --release --example training_loop_from_scratch` (a few seconds).
//! Options: `--epochs N` (2). Exits non-zero below 96.5% test accuracy after 2 epochs or more (97.26% here).

mod common;

use std::sync::Mutex;

use ferroflow::data::Dataset;
use ferroflow::function::Function;
use ferroflow::keras::losses::{Loss, SparseCategoricalCrossentropy};
use ferroflow::keras::metrics::{Metric, SparseCategoricalAccuracy};
use ferroflow::keras::{applications, Layer};
use ferroflow::optim::{Adam, SharedOptimizer};
use ferroflow::prelude::{GradientTape, Source};
use ferroflow::{DType, Error, Result, Tensor};

fn main() -> Result<()> {
    ferroflow::init();
    let bad = |m: String| Error::invalid("training_loop_from_scratch", m);
    let mut epochs = 2usize;
    let mut args = std::env::args().skip(1);
    while let Some(a) = args.next() {
        match a.as_str() {
            "--epochs" => {
                epochs = args
                    .next()
                    .and_then(|v| v.parse().ok())
                    .ok_or_else(|| bad("--epochs needs a number".into()))?
            }
            other => return Err(bad(format!("unknown argument {other:?}"))),
        }
    }
    ferroflow::random::set_seed(7);
    let batch_size = 64;
    let (x_train, y_train) = common::load_mnist("train")?;
    let (x_test, y_test) = common::load_mnist("t10k")?;
    let train = Dataset::from_tensor_slices((x_train, y_train))?
        .shuffle(60_000, Some(7), true)?
        .batch(batch_size, true)?;
    let test = Dataset::from_tensor_slices((x_test, y_test))?.batch(1000, false)?;

    // The model (784-256-128-10, logits out), built by a first call; a step borrows it
    // mutably, so the graph functions share it through a lock.
    let mut mlp = applications::mnist_mlp();
    mlp.forward(&Tensor::zeros(&[1, 28, 28, 1], DType::F32)?, false)?;
    let model = Mutex::new(mlp);
    let optimizer = SharedOptimizer::new(Adam::new(1e-3));
    let loss_fn = SparseCategoricalCrossentropy::new(true);

    // @tf.function def train_step(x, y): ... optimizer.apply_gradients(...)
    let train_step = Function::new(|a: &[Tensor]| {
        let (x, y) = (&a[0], &a[1]);
        let mut model = model.lock().unwrap_or_else(|e| e.into_inner());
        let tape = GradientTape::new();
        let logits = model.forward(x, true)?;
        let loss = loss_fn.call(y, &logits, None)?;
        let vars = model.trainable_weights();
        let sources: Vec<Source> = vars.iter().map(Source::from).collect();
        let grads = tape.gradient(&loss, &sources)?;
        optimizer.apply_gradients(grads.into_iter().zip(vars).collect(), true)?;
        Ok(vec![loss, logits])
    })
    .with_name("train_step");
    // @tf.function def test_step(x): return model(x, training=False)
    let test_step = Function::new(|a: &[Tensor]| {
        let mut model = model.lock().unwrap_or_else(|e| e.into_inner());
        Ok(vec![model.forward(&a[0], false)?])
    })
    .with_name("test_step");

    let mut train_accuracy = SparseCategoricalAccuracy::new();
    let mut test_accuracy = SparseCategoricalAccuracy::new();
    let start = std::time::Instant::now();
    for epoch in 0..epochs {
        println!("Start of epoch {}", epoch + 1);
        for (step, batch) in train.iter().enumerate() {
            let (x, y) = batch?;
            let out = train_step.call(&[x, y.clone()])?;
            train_accuracy.update_state(&y, &out[1], None)?;
            if step % 200 == 0 {
                println!(
                    "  step {step:4}: training loss {:.4} ({} samples seen)",
                    out[0].item::<f32>()?,
                    (step + 1) * batch_size
                );
            }
        }
        println!(
            "  training accuracy over the epoch: {:.2}%",
            train_accuracy.result() * 100.0
        );
        train_accuracy.reset_state();
        for batch in test.iter() {
            let (x, y) = batch?;
            let logits = test_step.call(&[x])?.remove(0);
            test_accuracy.update_state(&y, &logits, None)?;
        }
        println!(
            "  test accuracy: {:.2}% ({:.1} s)",
            test_accuracy.result() * 100.0,
            start.elapsed().as_secs_f64()
        );
        if epoch + 1 < epochs {
            test_accuracy.reset_state();
        }
    }
    let acc = test_accuracy.result();
    println!(
        "{} optimizer steps from {} trace(s) of train_step; test accuracy {:.2}%",
        optimizer.iterations(),
        train_step.tracing_count(),
        acc * 100.0
    );
    let expected_steps = (epochs * (60_000 / batch_size)) as i64;
    if optimizer.iterations() != expected_steps || train_step.tracing_count() != 1 {
        return Err(bad(format!(
            "expected {expected_steps} optimizer steps from one trace, got {} from {}",
            optimizer.iterations(),
            train_step.tracing_count()
        )));
    }
    if epochs >= 2 && acc < 0.965 {
        return Err(bad(format!("test accuracy {:.2}% < 96.5%", acc * 100.0)));
    }
    Ok(())
}
