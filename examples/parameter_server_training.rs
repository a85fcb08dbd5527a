//! TensorFlow's "Parameter server training with ParameterServerStrategy" tutorial: the
//! MNIST MLP trained asynchronously by worker processes whose variables live on parameter
//! servers, coordinated by a chief, with Keras' `fit` (`--api fit`, the default) or a custom
//! training loop (`--api custom`) of steps the chief schedules on the workers.
//!
//! Every task runs this same program; its role comes from `TF_CONFIG` (the launcher fills it
//! in): a `ps` serves variables, a `worker` runs the functions the chief schedules by name,
//! the `chief` builds the model (its variables go to the ps), schedules the steps, and
//! evaluates.
//!
//! ```text
//! cargo build --release --example parameter_server_training --bin ferroflow
//! target/release/ferroflow launch --chief --workers 2 --ps 2 -- \
//!     target/release/examples/parameter_server_training --api custom
//! ```
//!
//! Options: `--api fit|custom` (fit), `--epochs N` (3), `--steps-per-epoch N` (469: an
//! epoch of MNIST at batch 128 on one worker), `--batch N` (128 per step). Exits non-zero
//! below 95% test accuracy after at least 3 full epochs.

mod common;

use ferroflow::cluster::{ClusterResolver, TfConfigClusterResolver};
use ferroflow::data::Dataset;
use ferroflow::distribute::{
    ClusterCoordinator, Functions, InputContext, ParameterServerStrategy, PerWorkerIterator, Server,
};
use ferroflow::keras::losses::{Loss, SparseCategoricalCrossentropy};
use ferroflow::keras::{applications, fit_functions, DatasetCreator, FitConfig, Layer, Model};
use ferroflow::optim::{Adam, Optimizer};
use ferroflow::prelude::{GradientTape, Source};
use ferroflow::{DType, Error, Result, Tensor, Variable};

#[derive(Clone, Copy, PartialEq)]
enum Api {
    Fit,
    Custom,
}

struct Options {
    api: Api,
    epochs: usize,
    steps_per_epoch: usize,
    batch: usize,
}

fn bad(m: String) -> Error {
    Error::invalid("parameter_server_training", m)
}

fn options() -> Result<Options> {
    let mut o = Options {
        api: Api::Fit,
        epochs: 3,
        steps_per_epoch: 469,
        batch: 128,
    };
    let mut it = std::env::args().skip(1);
    while let Some(a) = it.next() {
        let mut number = |name: &str| -> Result<usize> {
            it.next()
                .and_then(|v| v.parse().ok())
                .ok_or_else(|| bad(format!("{name} needs a number")))
        };
        match a.as_str() {
            "--epochs" => o.epochs = number("--epochs")?,
            "--steps-per-epoch" => o.steps_per_epoch = number("--steps-per-epoch")?,
            "--batch" => o.batch = number("--batch")?,
            "--api" => {
                o.api = match it.next().as_deref() {
                    Some("fit") => Api::Fit,
                    Some("custom") => Api::Custom,
                    other => return Err(bad(format!("--api takes fit or custom, got {other:?}"))),
                }
            }
            other => return Err(bad(format!("unknown argument {other:?}"))),
        }
    }
    Ok(o)
}

/// Each worker's training data (TF's `dataset_fn(input_context)`): the MNIST training
/// set, shuffled with a seed of the worker's own, in batches, repeated without end.
fn dataset_fn(batch: usize) -> impl Fn(&InputContext) -> Result<Dataset<(Tensor, Tensor)>> {
    move |ctx| {
        let (x, y) = common::load_mnist("train")?;
        Dataset::from_tensor_slices((x, y))?
            .shuffle(60_000, Some(100 + ctx.input_pipeline_id as u64), true)?
            .batch(batch, true)
            .map(|d| d.repeat(None))
    }
}

/// The state of the custom loop: the model, its optimizer, and the training accuracy's
/// counts (variables on the ps, so every worker's steps add to the same counts, as TF's
/// metric in the strategy's scope does).
struct CustomState {
    model: ferroflow::keras::Sequential,
    optimizer: Adam,
    correct: Variable,
    seen: Variable,
}

fn counter(name: &str) -> Result<Variable> {
    Ok(Variable::with_options(
        name,
        Tensor::scalar(0i64)?,
        false,
        Default::default(),
        Default::default(),
    ))
}

/// The custom loop's functions: `train_step` on a batch of the worker's iterator.
fn custom_functions(batch: usize) -> Functions<CustomState> {
    Functions::new(|_ctx| {
        let mut model = applications::mnist_mlp();
        model.forward(&Tensor::zeros(&[1, 28, 28, 1], DType::F32)?, false)?; // build
        Ok(CustomState {
            model,
            optimizer: Adam::new(1e-3),
            correct: counter("train_correct")?,
            seen: counter("train_seen")?,
        })
    })
    .dataset("mnist_train", dataset_fn(batch))
    .function(
        "train_step",
        |s: &mut CustomState, ctx, iterator: PerWorkerIterator| {
            let (x, y): (Tensor, Tensor) = ctx
                .next(&iterator)?
                .ok_or_else(|| bad("the training data ended".into()))?;
            let loss_object = SparseCategoricalCrossentropy::new(true);
            let tape = GradientTape::new();
            let logits = s.model.forward(&x, true)?;
            let loss = loss_object.call(&y, &logits, None)?;
            let vars = s.model.trainable_weights();
            let sources: Vec<Source> = vars.iter().map(Source::from).collect();
            let grads = tape.gradient(&loss, &sources)?;
            s.optimizer
                .apply_gradients(grads.into_iter().zip(vars).collect(), true)?;
            let predicted = logits.argmax(-1)?.cast(DType::I64)?;
            let correct = predicted.equal(&y.cast(DType::I64)?)?.cast(DType::I64)?;
            s.correct
                .assign_add(&correct.reduce_sum(ferroflow::Axes::All, false)?)?;
            s.seen.assign_add(&Tensor::scalar(y.shape()[0] as i64)?)?;
            loss.item::<f32>()
        },
    )
}

/// The Keras model every task builds (weights built, so the chief and the workers create
/// the same variables on the ps).
fn keras_model() -> Result<Model> {
    let mut model = Model::from(applications::mnist_mlp());
    model.build(&[28, 28, 1])?;
    model.compile(
        Adam::new(1e-3),
        SparseCategoricalCrossentropy::new(true),
        &["accuracy"],
    )?;
    Ok(model)
}

fn test_accuracy(logits: &Tensor, y: &Tensor) -> Result<f64> {
    let predicted = logits.argmax(-1)?.cast(DType::I64)?;
    let correct = predicted.equal(&y.cast(DType::I64)?)?.cast(DType::F64)?;
    correct
        .reduce_mean(ferroflow::Axes::All, false)?
        .item::<f64>()
}

fn main() -> Result<()> {
    ferroflow::init();
    let o = options()?;
    ferroflow::random::set_seed(3);
    let resolver = TfConfigClusterResolver::from_env()?;
    let role = resolver.task().ok_or_else(|| {
        bad(
            "no task in TF_CONFIG: start it with `ferroflow launch --chief --workers N --ps M`"
                .into(),
        )
    })?;
    let creator = DatasetCreator::new("mnist_train", dataset_fn(o.batch));
    match (role.task_type.as_str(), o.api) {
        ("ps", _) => return Server::new(&resolver)?.run(),
        ("worker", Api::Fit) => {
            return Server::new(&resolver)?.run_worker(fit_functions(|_| keras_model(), &[creator]))
        }
        ("worker", Api::Custom) => {
            return Server::new(&resolver)?.run_worker(custom_functions(o.batch))
        }
        _ => {}
    }
    // The chief.
    let strategy = ParameterServerStrategy::new(&resolver, None)?;
    println!(
        "chief: {} workers, {} parameter servers",
        resolver.cluster_spec()?.num_tasks("worker"),
        strategy.num_ps()
    );
    let (x_test, y_test) = common::load_mnist("t10k")?;
    let start = std::time::Instant::now();
    let steps = o.epochs * o.steps_per_epoch;
    let accuracy = match o.api {
        Api::Fit => {
            let mut functions = fit_functions(|_| keras_model(), std::slice::from_ref(&creator));
            let mut model = functions.build_state(&strategy)?;
            let history = model.fit_dataset_creator(
                &creator,
                FitConfig::new()
                    .epochs(o.epochs)
                    .steps_per_epoch(o.steps_per_epoch)
                    .verbose(2),
            )?;
            println!(
                "fit: last step's loss {:.4}",
                history
                    .get("loss")
                    .and_then(|l| l.last().copied())
                    .unwrap_or(f64::NAN)
            );
            test_accuracy(&model.call(&x_test, false)?, &y_test)?
        }
        Api::Custom => {
            let mut functions = custom_functions(o.batch);
            let mut state = functions.build_state(&strategy)?;
            let coordinator = ClusterCoordinator::new(&strategy)?;
            let per_worker_dataset = coordinator.create_per_worker_dataset("mnist_train")?;
            let per_worker_iterator = per_worker_dataset.iter()?;
            for epoch in 0..o.epochs {
                state.correct.assign(&Tensor::scalar(0i64)?)?;
                state.seen.assign(&Tensor::scalar(0i64)?)?;
                let mut losses = vec![];
                for _ in 0..o.steps_per_epoch {
                    losses
                        .push(coordinator.schedule::<_, f32>("train_step", &per_worker_iterator)?);
                }
                coordinator.join()?;
                let last = losses
                    .last()
                    .map(|l| l.fetch())
                    .transpose()?
                    .unwrap_or(f32::NAN);
                let correct = state.correct.value().item::<i64>()?;
                let seen = state.seen.value().item::<i64>()?.max(1);
                println!(
                    "epoch {}: last loss {last:.4}, training accuracy {:.2}% ({:.1} s)",
                    epoch + 1,
                    correct as f64 * 100.0 / seen as f64,
                    start.elapsed().as_secs_f64()
                );
            }
            let stats = coordinator.stats();
            println!(
                "scheduled {} steps, {} sent again after a lost worker",
                stats.scheduled, stats.retried
            );
            test_accuracy(&state.model.forward(&x_test, false)?, &y_test)?
        }
    };
    let secs = start.elapsed().as_secs_f64();
    println!(
        "chief: test accuracy {:.2}% after {steps} steps ({secs:.1} s, {:.0} steps/s)",
        accuracy * 100.0,
        steps as f64 / secs
    );
    strategy.shut_down_cluster()?;
    if o.epochs >= 3 && o.steps_per_epoch >= 469 && accuracy < 0.95 {
        return Err(bad(format!("test accuracy {:.2}% < 95%", accuracy * 100.0)));
    }
    Ok(())
}
