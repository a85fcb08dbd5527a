//! `Model::fit` under `ParameterServerStrategy` (TF 2.6's `model.fit` with a
//! `DatasetCreator`): the chief schedules each training step on the workers through a
//! `ClusterCoordinator`; each worker trains its own copy of the model, whose variables live
//! on the parameter servers, on batches of its own per-worker dataset.
//!
//! Rust cannot ship closures, so every task runs the same program: the workers serve
//! [`fit_functions`] (the model's builder and the dataset creators, registered by name), and
//! the chief builds the same model with them ([`Functions::build_state`]) before it calls
//! [`Model::fit_dataset_creator`].

use std::sync::{Arc, Mutex};

use ferroflow_data::Dataset;
use ferroflow_distribute::{
    ClusterCoordinator, Functions, InputContext, ParameterServerStrategy, PerWorkerIterator,
    WorkerContext,
};
use ferroflow_tensor::{device_scope, Error, Result};
use serde::{Deserialize, Serialize};

use super::data_adapter::{batches_of, Batch, FitBatch};
use super::training::FitConfig;
use super::Model;
use crate::callbacks::{History, Logs};

/// The registered name of the training step `fit` schedules on the workers.
const TRAIN_STEP: &str = "keras.train_step";

type MakeBatches = dyn Fn(&InputContext) -> Result<Dataset<Batch>> + Send + Sync;

/// A dataset function for `fit` (TF's `tf.keras.utils.experimental.DatasetCreator`): each
/// worker calls it with its [`InputContext`] to make its own dataset of `(x, y)` batches.
/// Under `ParameterServerStrategy` it is registered by `name` on the workers
/// ([`fit_functions`]); under any other strategy (or none) `fit_dataset_creator` calls it in
/// this process.
///
/// ```
/// use ferroflow_keras::DatasetCreator;
/// let creator = DatasetCreator::new("squares", |ctx| {
///     let x = ferroflow_tensor::Tensor::from_vec(vec![1.0f32, 2.0, 3.0, 4.0], &[4, 1])?;
///     let y = x.square()?;
///     Ok(ferroflow_data::Dataset::from_tensor_slices((x, y))?
///         .shard(ctx.num_input_pipelines as u64, ctx.input_pipeline_id as u64)?
///         .batch(2, false)?
///         .repeat(None))
/// });
/// assert_eq!(creator.name(), "squares");
/// ```
#[derive(Clone)]
pub struct DatasetCreator {
    name: String,
    make: Arc<MakeBatches>,
}

impl DatasetCreator {
    /// The dataset function `make`, registered on the workers as `name`.
    pub fn new<B: FitBatch>(
        name: &str,
        make: impl Fn(&InputContext) -> Result<Dataset<B>> + Send + Sync + 'static,
    ) -> DatasetCreator {
        DatasetCreator {
            name: name.to_string(),
            make: Arc::new(move |ctx| Ok(batches_of(&make(ctx)?))),
        }
    }
    /// Its registered name.
    pub fn name(&self) -> &str {
        &self.name
    }
}

/// What the chief sends with each scheduled training step.
#[derive(Serialize, Deserialize)]
struct TrainStepArgs {
    iterator: PerWorkerIterator,
    /// The epoch the step belongs to: a worker resets its metrics when a new one starts.
    epoch: usize,
}

/// The functions the workers of a parameter-server job serve for [`Model::fit_dataset_creator`]:
/// `build` makes the compiled model (in the strategy's scope, so its variables live on the
/// parameter servers; it must build the weights, e.g. with [`Model::build`], so that the chief
/// and every worker create the same variables in the same order), and `creators` are the
/// datasets `fit` may ask for.
///
/// A worker runs `build` once; the chief runs it through [`Functions::build_state`] and
/// gets the model it calls `fit_dataset_creator` on.
///
/// ```no_run
/// use ferroflow_keras::{applications, fit_functions, DatasetCreator, Model};
/// use ferroflow_keras::losses::SparseCategoricalCrossentropy;
/// let creator = DatasetCreator::new("mnist_train", |_ctx| {
///     let (x, y) = ferroflow_data::idx::load_mnist("datasets/mnist", "train")?;
///     Ok(ferroflow_data::Dataset::from_tensor_slices((x, y))?.batch(128, true)?.repeat(None))
/// });
/// let functions = fit_functions(
///     |_ctx| {
///         let mut model = Model::from(applications::mnist_mlp());
///         model.build(&[28, 28, 1])?;
///         model.compile(ferroflow_optim::Adam::new(1e-3), SparseCategoricalCrossentropy::new(true), &["accuracy"])?;
///         Ok(model)
///     },
///     &[creator],
/// );
/// ```
pub fn fit_functions(
    build: impl FnOnce(&WorkerContext) -> Result<Model> + Send + 'static,
    creators: &[DatasetCreator],
) -> Functions<Model> {
    let mut functions = Functions::new(move |ctx| {
        let model = build(ctx)?;
        if model.weights().is_empty() {
            return Err(Error::invalid(
                "fit_functions",
                "the model's builder made a model without weights: build them in the \
                 builder (Model::build(input_shape)) so that the chief and every worker \
                 create the same variables on the parameter servers",
            ));
        }
        Ok(model)
    });
    for creator in creators {
        let make = creator.make.clone();
        functions = functions.dataset(&creator.name, move |ctx| make(ctx));
    }
    let epoch_seen: Mutex<Option<usize>> = Mutex::new(None);
    functions.function(
        TRAIN_STEP,
        move |model: &mut Model, ctx, args: TrainStepArgs| {
            let mut seen = epoch_seen.lock().unwrap_or_else(|e| e.into_inner());
            if *seen != Some(args.epoch) {
                model.reset_metrics();
                *seen = Some(args.epoch);
            }
            drop(seen);
            let batch: Batch = ctx.next(&args.iterator)?.ok_or_else(|| {
                Error::invalid(
                    "Model.fit",
                    "a worker's dataset ran out of data: the DatasetCreator's dataset must \
                     repeat (Dataset::repeat(None)) under ParameterServerStrategy",
                )
            })?;
            let _scope = device_scope(&model.device().to_string())?;
            let (x, y) = model.placed(batch)?;
            if y.is_empty() {
                return Err(Error::invalid(
                    "Model.fit",
                    "the DatasetCreator's dataset holds inputs only; fit needs (x, y) batches",
                ));
            }
            let logs = model.train_step(&x, &y)?;
            Ok(logs
                .iter()
                .map(|(k, v)| (k.to_string(), v))
                .collect::<Vec<(String, f64)>>())
        },
    )
}

impl Model {
    /// Trains with a [`DatasetCreator`] (TF 2.6's `model.fit(DatasetCreator(dataset_fn),
    /// steps_per_epoch=...)`).
    ///
    /// Under `ParameterServerStrategy` (a model the chief built with
    /// [`Functions::build_state`] of [`fit_functions`]) the workers train: each epoch the
    /// chief schedules `steps_per_epoch` training steps (required) through a
    /// `ClusterCoordinator`, each one batch of the worker's own dataset, applied to the
    /// variables on the parameter servers as it finishes, without waiting for the other
    /// workers; a worker that dies has its steps run again by the others. Batch callbacks see
    /// each step's logs as it finishes, in the order scheduled; an epoch's logs are those of
    /// its last step (the metrics of the worker that ran it, over its steps of the epoch, as
    /// in TF). Validation data is not supported there (an error): evaluate on the chief
    /// afterwards.
    ///
    /// Under any other strategy, or none, the creator makes this worker's dataset and `fit`
    /// runs as [`Model::fit_dataset`].
    ///
    /// ```no_run
    /// # fn f(mut model: ferroflow_keras::Model, creator: ferroflow_keras::DatasetCreator) -> ferroflow_tensor::Result<()> {
    /// use ferroflow_keras::FitConfig;
    /// let history = model.fit_dataset_creator(&creator, FitConfig::new().epochs(3).steps_per_epoch(200))?;
    /// println!("{:?}", history.get("loss"));
    /// # Ok(()) }
    /// ```
    pub fn fit_dataset_creator(
        &mut self,
        creator: &DatasetCreator,
        config: FitConfig,
    ) -> Result<History> {
        self.compiled("fit")?;
        let strategy = self.strategy.clone();
        let Some(ps) = strategy
            .as_ref()
            .and_then(|s| s.as_parameter_server().cloned())
        else {
            let ctx = match &strategy {
                Some(s) => InputContext {
                    num_input_pipelines: s.num_workers(),
                    input_pipeline_id: s.worker_index(),
                    num_replicas_in_sync: s.num_replicas_in_sync(),
                },
                None => InputContext {
                    num_input_pipelines: 1,
                    input_pipeline_id: 0,
                    num_replicas_in_sync: 1,
                },
            };
            let dataset = (creator.make)(&ctx)?;
            return self.fit_dataset(&dataset, config);
        };
        self.fit_on_workers(&ps, creator, config)
    }

    fn fit_on_workers(
        &mut self,
        strategy: &ParameterServerStrategy,
        creator: &DatasetCreator,
        mut config: FitConfig,
    ) -> Result<History> {
        let steps = config.steps_per_epoch.ok_or_else(|| {
            Error::invalid(
                "Model.fit",
                "under ParameterServerStrategy steps_per_epoch is required (the workers' \
                 datasets repeat without end)",
            )
        })?;
        if steps == 0 {
            return Err(Error::invalid(
                "Model.fit",
                "steps_per_epoch must be positive",
            ));
        }
        if config.validation_data.is_some() || config.validation_split > 0.0 {
            return Err(Error::invalid(
                "Model.fit",
                "validation during fit is not supported under ParameterServerStrategy: \
                 evaluate the model on the chief after fit",
            ));
        }
        let coordinator = ClusterCoordinator::new(strategy)?;
        let dataset = coordinator.create_per_worker_dataset(&creator.name)?;
        let iterator = dataset.iter()?;
        let mut history = History::default();
        let (mut callbacks, first_epoch) = self.begin_training(&mut config, Some(steps))?;
        let mut last_logs = Logs::new();
        for epoch in first_epoch..config.epochs {
            for cb in &mut callbacks {
                cb.on_epoch_begin(epoch, self)?;
            }
            let mut scheduled = Vec::with_capacity(steps);
            for step in 0..steps {
                for cb in &mut callbacks {
                    cb.on_train_batch_begin(step, self)?;
                }
                scheduled.push(coordinator.schedule::<_, Vec<(String, f64)>>(
                    TRAIN_STEP,
                    &TrainStepArgs { iterator, epoch },
                )?);
            }
            let mut logs = Logs::new();
            for (step, value) in scheduled.iter().enumerate() {
                logs = Logs::new();
                for (k, v) in value.fetch()? {
                    logs.set(&k, v);
                }
                for cb in &mut callbacks {
                    cb.on_train_batch_end(step, &logs, self)?;
                }
            }
            coordinator.join()?;
            history.record(epoch, &logs);
            for cb in &mut callbacks {
                cb.on_epoch_end(epoch, &logs, self)?;
            }
            last_logs = logs;
            if self.stop_training {
                break;
            }
        }
        for cb in &mut callbacks {
            cb.on_train_end(&last_logs, self)?;
        }
        Ok(history)
    }
}
