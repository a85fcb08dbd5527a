//! The training loop (Keras' `training.py`): [`FitConfig`], the train and test steps,
//! `fit`, `evaluate` and `predict`.

use ferroflow_autodiff::{GradientTape, Source};
use ferroflow_data::{Cardinality, Dataset, DatasetIter};
use ferroflow_distribute::{batch_rows, enter_scope, share_bounds, Strategy};
use ferroflow_function::TraceCache;
use ferroflow_tensor::{device_scope, Error, Result, Tensor};
use std::sync::Arc;

use super::data_adapter::{
    array_batches, batches_of, random_seed, Batch, Data, FitBatch, ValidationData,
};
use super::{Model, ReplicaStep};
use crate::callbacks::{Callback, History, Logs, ProgbarLogger, TrainParams};

/// Options of [`Model::fit`] (Keras' keyword arguments), built with chained setters.
pub struct FitConfig {
    /// Samples per step (32).
    pub batch_size: usize,
    /// Epochs to run up to (1).
    pub epochs: usize,
    /// 0 silent, 1 progress bar (default), 2 one line per epoch.
    pub verbose: u8,
    /// Shuffle the training samples before each epoch (true).
    pub shuffle: bool,
    /// Fraction of the samples (the last ones, before shuffling) held out for validation.
    pub validation_split: f64,
    /// Explicit validation data, arrays or a dataset of batches (takes precedence over the
    /// split).
    pub validation_data: Option<ValidationData>,
    /// Batches per epoch (`steps_per_epoch`): with it, epochs draw from one iterator that
    /// continues across epochs (needed for an endless dataset); training stops when the data
    /// runs out. Without it, each epoch is one full pass.
    pub steps_per_epoch: Option<usize>,
    /// Batches of validation data per evaluation (`validation_steps`); all when `None`.
    pub validation_steps: Option<usize>,
    /// Epoch to start at (to resume a run).
    pub initial_epoch: usize,
    /// Callbacks, called in order after the built-in history and progress bar.
    pub callbacks: Vec<Box<dyn Callback>>,
}

impl Default for FitConfig {
    fn default() -> Self {
        FitConfig {
            batch_size: 32,
            epochs: 1,
            verbose: 1,
            shuffle: true,
            validation_split: 0.0,
            validation_data: None,
            steps_per_epoch: None,
            validation_steps: None,
            initial_epoch: 0,
            callbacks: vec![],
        }
    }
}

impl FitConfig {
    /// Keras' defaults.
    pub fn new() -> FitConfig {
        FitConfig::default()
    }
    /// Sets `batch_size`.
    pub fn batch_size(mut self, b: usize) -> Self {
        self.batch_size = b;
        self
    }
    /// Sets `epochs`.
    pub fn epochs(mut self, e: usize) -> Self {
        self.epochs = e;
        self
    }
    /// Sets `verbose`.
    pub fn verbose(mut self, v: u8) -> Self {
        self.verbose = v;
        self
    }
    /// Sets `shuffle`.
    pub fn shuffle(mut self, s: bool) -> Self {
        self.shuffle = s;
        self
    }
    /// Sets `validation_split`.
    pub fn validation_split(mut self, f: f64) -> Self {
        self.validation_split = f;
        self
    }
    /// Sets `validation_data`.
    pub fn validation_data(mut self, x: impl Into<Data>, y: impl Into<Data>) -> Self {
        self.validation_data = Some(ValidationData::Arrays(x.into(), y.into()));
        self
    }
    /// Sets `validation_data` to a dataset of `(x, y)` batches.
    pub fn validation_dataset<B: FitBatch>(mut self, data: &Dataset<B>) -> Self {
        self.validation_data = Some(ValidationData::Batches(batches_of(data)));
        self
    }
    /// Sets `steps_per_epoch`.
    pub fn steps_per_epoch(mut self, steps: usize) -> Self {
        self.steps_per_epoch = Some(steps);
        self
    }
    /// Sets `validation_steps`.
    pub fn validation_steps(mut self, steps: usize) -> Self {
        self.validation_steps = Some(steps);
        self
    }
    /// Sets `initial_epoch`.
    pub fn initial_epoch(mut self, e: usize) -> Self {
        self.initial_epoch = e;
        self
    }
    /// Adds a callback.
    pub fn callback(mut self, c: impl Callback + 'static) -> Self {
        self.callbacks.push(Box::new(c));
        self
    }
}

impl Model {
    /// Whether the default steps run eagerly (Keras' `model.run_eagerly`). By default
    /// they run as graphs traced on the first batch of each shape, as TF 2.4's `fit` does.
    pub fn run_eagerly(&self) -> bool {
        self.run_eagerly
    }

    /// Runs the default steps eagerly (`true`: every op dispatched as the Rust code runs,
    /// easier to debug) or as traced graphs (`false`, the default).
    pub fn set_run_eagerly(&mut self, run_eagerly: bool) {
        self.run_eagerly = run_eagerly;
    }

    /// How many graphs the default train and test steps traced since `compile` (TF's
    /// `train_function` and `test_function` tracing counts): one per batch shape met.
    pub fn step_tracing_counts(&self) -> (usize, usize) {
        let count =
            |c: &Option<TraceCache<StepLayout>>| c.as_ref().map_or(0, TraceCache::tracing_count);
        self.compiled
            .as_ref()
            .map_or((0, 0), |c| (count(&c.graphs.train), count(&c.graphs.test)))
    }

    /// Whether the default steps run as graphs now: not when asked to run eagerly, not in
    /// a strategy's replicas (their steps run on several threads), not when a layer computes
    /// on the host ([`crate::Layer::traceable`]).
    fn steps_run_as_graphs(&self) -> bool {
        fn traceable(l: &dyn crate::Layer) -> bool {
            let mut ok = l.traceable();
            l.visit_sublayers(&mut |s| ok &= traceable(s));
            ok
        }
        !self.run_eagerly
            && self.replica_step.is_none()
            && self.strategy.is_none()
            && traceable(self.network.as_ref())
    }

    /// One optimization step on a batch: forward under a tape, loss, gradients,
    /// `apply_gradients`, metrics (Keras' default `train_step`). Forward, loss and gradients
    /// run as a graph traced per batch shape unless [`Model::run_eagerly`]; the optimizer
    /// applies the gradients after it (its step counter lives on the host) and the metrics
    /// are updated eagerly.
    pub fn default_train_step(&mut self, x: &[Tensor], y: &[Tensor]) -> Result<Logs> {
        // The first step of an unbuilt model runs eagerly: the weights it differentiates
        // exist only once the forward pass has built them.
        if self.steps_run_as_graphs() && self.network.base().built() {
            return self.graph_train_step(x, y);
        }
        self.eager_train_step(x, y)
    }

    fn graph_train_step(&mut self, x: &[Tensor], y: &[Tensor]) -> Result<Logs> {
        let vars = self.network.trainable_weights();
        let ids: Vec<u64> = vars.iter().map(|v| v.id()).collect();
        let scale = self.compiled("fit")?.optimizer.loss_scale();
        let mut args: Vec<Tensor> = x.iter().chain(y).cloned().collect();
        if let Some(s) = scale {
            // The loss scale changes between steps: an argument, not a constant.
            args.push(Tensor::scalar(s as f32)?);
        }
        let c = self.compiled("fit")?;
        // Another set of trainable weights (a layer frozen since): new graphs.
        if c.graphs.train_variables != ids {
            c.graphs.train = None;
            c.graphs.train_variables = ids;
        }
        let cache = c
            .graphs
            .train
            .take()
            .unwrap_or_else(|| TraceCache::new("train_step"));
        let (nx, ny) = (x.len(), y.len());
        let traced = cache.call_with(&args, |a| {
            let (xs, ys, scale) = (&a[..nx], &a[nx..nx + ny], a.get(nx + ny));
            let tape = GradientTape::new();
            let y_pred = self.network.apply(xs, true)?;
            let loss = self.compute_loss(ys, &y_pred)?;
            let sources: Vec<Source> = vars.iter().map(Source::from).collect();
            let grads = match scale {
                Some(s) => {
                    let scaled = loss.mul(&s.cast(loss.dtype())?)?;
                    tape.gradient(&scaled, &sources)?
                        .into_iter()
                        .map(|g| g.map(|g| g.div(&s.cast(g.dtype())?)).transpose())
                        .collect::<Result<Vec<_>>>()?
                }
                None => tape.gradient(&loss, &sources)?,
            };
            drop(tape);
            let output_losses = self.compiled("fit")?.last_output_losses.clone();
            let layout = StepLayout {
                predictions: y_pred.len(),
                output_losses: output_losses.len(),
                gradients: grads.iter().map(Option::is_some).collect(),
            };
            let outputs = std::iter::once(loss)
                .chain(y_pred)
                .chain(output_losses)
                .chain(grads.into_iter().flatten())
                .collect();
            Ok((outputs, layout))
        });
        self.compiled("fit")?.graphs.train = Some(cache);
        let (outputs, layout) = traced.map_err(|e| explain_trace_error("train_step", e))?;
        let (loss, y_pred, output_losses, mut grads) = layout.split(outputs)?;
        let grads = layout
            .gradients
            .iter()
            .map(|&some| if some { grads.next() } else { None })
            .collect::<Vec<_>>();
        let c = self.compiled("fit")?;
        c.last_output_losses = output_losses;
        c.optimizer
            .apply_gradients(grads.into_iter().zip(vars).collect(), true)?;
        self.update_metrics(y, &y_pred, &loss)
    }

    fn eager_train_step(&mut self, x: &[Tensor], y: &[Tensor]) -> Result<Logs> {
        self.compiled("fit")?;
        let tape = GradientTape::new();
        let y_pred = self.network.apply(x, true)?;
        let loss = self.compute_loss(y, &y_pred)?;
        // Under a strategy: this replica's share of the global batch's mean loss.
        let replica = self.replica_step;
        let replica_loss = match replica {
            Some(r) => loss.mul(&loss.scalar_like(r.loss_weight)?)?,
            None => loss.clone(),
        };
        let vars = self.network.trainable_weights();
        let sources: Vec<Source> = vars.iter().map(Source::from).collect();
        // A loss-scaling optimizer: scale the loss on the tape, unscale the gradients.
        let scale = self.compiled("fit")?.optimizer.loss_scale();
        let grads = match scale {
            Some(s) => {
                let scaled = replica_loss.mul(&replica_loss.scalar_like(s)?)?;
                let grads = tape.gradient(&scaled, &sources)?;
                grads
                    .into_iter()
                    .map(|g| g.map(|g| g.div(&g.scalar_like(s)?)).transpose())
                    .collect::<Result<Vec<_>>>()?
            }
            None => tape.gradient(&replica_loss, &sources)?,
        };
        drop(tape);
        let c = self.compiled("fit")?;
        c.optimizer
            .apply_gradients(grads.into_iter().zip(vars).collect(), true)?;
        if replica.is_some_and(|r| !r.count_metrics) {
            return Ok(self.metric_logs());
        }
        self.update_metrics(y, &y_pred, &loss)
    }
    /// Forward in inference mode, loss and metrics (Keras' default `test_step`); forward
    /// and loss as a graph traced per batch shape unless [`Model::run_eagerly`].
    pub fn default_test_step(&mut self, x: &[Tensor], y: &[Tensor]) -> Result<Logs> {
        if !self.steps_run_as_graphs() {
            return self.eager_test_step(x, y);
        }
        let args: Vec<Tensor> = x.iter().chain(y).cloned().collect();
        let cache = self
            .compiled("evaluate")?
            .graphs
            .test
            .take()
            .unwrap_or_else(|| TraceCache::new("test_step"));
        let nx = x.len();
        let traced = cache.call_with(&args, |a| {
            let y_pred = self.network.apply(&a[..nx], false)?;
            let loss = self.compute_loss(&a[nx..], &y_pred)?;
            let output_losses = self.compiled("evaluate")?.last_output_losses.clone();
            let layout = StepLayout {
                predictions: y_pred.len(),
                output_losses: output_losses.len(),
                gradients: vec![],
            };
            let outputs = std::iter::once(loss)
                .chain(y_pred)
                .chain(output_losses)
                .collect();
            Ok((outputs, layout))
        });
        self.compiled("evaluate")?.graphs.test = Some(cache);
        let (outputs, layout) = traced.map_err(|e| explain_trace_error("test_step", e))?;
        let (loss, y_pred, output_losses, _) = layout.split(outputs)?;
        self.compiled("evaluate")?.last_output_losses = output_losses;
        self.update_metrics(y, &y_pred, &loss)
    }

    fn eager_test_step(&mut self, x: &[Tensor], y: &[Tensor]) -> Result<Logs> {
        let y_pred = self.network.apply(x, false)?;
        let loss = self.compute_loss(y, &y_pred)?;
        if self.replica_step.is_some_and(|r| !r.count_metrics) {
            return Ok(self.metric_logs());
        }
        self.update_metrics(y, &y_pred, &loss)
    }

    /// One step under `strategy` (`training`: a train step, else a test step): this
    /// worker's rows of the global batch (worker `w` of `W` takes rows `[w·n/W,
    /// (w+1)·n/W)`), split among its replicas, each replica's step in its device's scope;
    /// the optimizer applies the summed gradients at the last replica.
    fn replica_steps(
        &mut self,
        strategy: &Arc<dyn Strategy>,
        x: &[Tensor],
        y: &[Tensor],
        training: bool,
    ) -> Result<Logs> {
        let n = x
            .first()
            .or(y.first())
            .and_then(|t| t.shape().first().copied())
            .ok_or_else(|| Error::invalid("Model.fit", "a batch without tensors"))?;
        let (lo, hi) = share_bounds(n, strategy.num_workers(), strategy.worker_index());
        let local = strategy.local_devices().len();
        let per_replica = strategy.run(|ctx| {
            let (a, b) = share_bounds(hi - lo, local, ctx.local_replica());
            let empty = a == b;
            let (a, b) = if empty { (0, 1) } else { (lo + a, lo + b) };
            let cut = |ts: &[Tensor]| -> Result<Vec<Tensor>> {
                ts.iter()
                    .map(|t| batch_rows(t, a, b)?.to_device(ctx.device()))
                    .collect()
            };
            let (rx, ry) = (cut(x)?, cut(y)?);
            self.replica_step = Some(ReplicaStep {
                loss_weight: if empty {
                    0.0
                } else {
                    (b - a) as f64 / n as f64
                },
                count_metrics: !empty,
            });
            let logs = if training {
                self.train_step(&rx, &ry)
            } else {
                self.test_step(&rx, &ry)
            };
            self.replica_step = None;
            logs
        })?;
        Ok(per_replica.into_values().pop().unwrap_or_default())
    }
    /// The training step in use (the default or the one set by [`Model::set_train_step`]).
    pub fn train_step(&mut self, x: &[Tensor], y: &[Tensor]) -> Result<Logs> {
        match self.train_step_fn.take() {
            Some(mut f) => {
                let r = f(self, x, y);
                self.train_step_fn = Some(f);
                r
            }
            None => self.default_train_step(x, y),
        }
    }
    /// The test step in use.
    pub fn test_step(&mut self, x: &[Tensor], y: &[Tensor]) -> Result<Logs> {
        match self.test_step_fn.take() {
            Some(mut f) => {
                let r = f(self, x, y);
                self.test_step_fn = Some(f);
                r
            }
            None => self.default_test_step(x, y),
        }
    }

    /// Trains for `config.epochs` epochs (Keras' `fit`), returning the history.
    ///
    /// ```
    /// ferroflow::init();
    /// use ferroflow_keras::{layers::Dense, losses::MeanSquaredError, sequential, FitConfig, Model};
    /// use ferroflow_optim::Sgd;
    /// use ferroflow_tensor::Tensor;
    /// // y = 2x - 1 from four points.
    /// let x = Tensor::from_vec(vec![0.0f32, 1.0, 2.0, 3.0], &[4, 1])?;
    /// let y = Tensor::from_vec(vec![-1.0f32, 1.0, 3.0, 5.0], &[4, 1])?;
    /// let mut model = Model::from(sequential![Dense::new(1)]);
    /// model.compile(Sgd::new(0.05), MeanSquaredError::new(), &[])?;
    /// let h = model.fit(&x, &y, FitConfig::new().epochs(300).batch_size(4).verbose(0))?;
    /// assert!(h.get("loss").unwrap().last().unwrap() < &1e-3);
    /// # Ok::<(), ferroflow_tensor::Error>(())
    /// ```
    pub fn fit(
        &mut self,
        x: impl Into<Data>,
        y: impl Into<Data>,
        mut config: FitConfig,
    ) -> Result<History> {
        let (x, y) = (x.into(), y.into());
        self.compiled("fit")?;
        if config.batch_size == 0 {
            return Err(Error::invalid("Model.fit", "batch_size must be positive"));
        }
        let n = x.samples("Model.fit", "x")?;
        if y.samples("Model.fit", "y")? != n {
            return Err(Error::invalid(
                "Model.fit",
                format!(
                    "x has {n} samples but y has {}",
                    y.samples("Model.fit", "y")?
                ),
            ));
        }
        if !(0.0..1.0).contains(&config.validation_split) {
            return Err(Error::invalid(
                "Model.fit",
                format!(
                    "validation_split must be in [0, 1), got {}",
                    config.validation_split
                ),
            ));
        }
        let (train_x, train_y) = match config.validation_data {
            Some(_) => (x, y),
            None if config.validation_split > 0.0 => {
                let split = n - (n as f64 * config.validation_split) as usize;
                if split == 0 || split == n {
                    return Err(Error::invalid(
                        "Model.fit",
                        format!(
                            "validation_split {} leaves an empty split of {n} samples",
                            config.validation_split
                        ),
                    ));
                }
                config.validation_data = Some(ValidationData::Arrays(
                    x.range(split, n)?,
                    y.range(split, n)?,
                ));
                (x.range(0, split)?, y.range(0, split)?)
            }
            None => (x, y),
        };
        let n = train_x.samples("Model.fit", "x")?;
        self.note_input_shapes(&train_x.0);
        let seed = if config.shuffle {
            Some(self.shared_seed(random_seed()?)?)
        } else {
            None
        };
        let batches = array_batches(train_x, train_y, config.batch_size, seed);
        let steps = config
            .steps_per_epoch
            .unwrap_or(n.div_ceil(config.batch_size));
        self.fit_batches(&batches, Some(steps), config)
    }

    /// Trains on a dataset whose elements are batches `(x, y)` (Keras' `fit(dataset)`): each
    /// epoch is one pass over it (so a `shuffle` in the pipeline reshuffles every epoch),
    /// or `steps_per_epoch` batches from one continuing iterator. `batch_size`, `shuffle` and
    /// `validation_split` do not apply: the pipeline batches and shuffles.
    ///
    /// ```
    /// ferroflow::init();
    /// use ferroflow_data::Dataset;
    /// use ferroflow_keras::{layers::Dense, losses::MeanSquaredError, sequential, FitConfig, Model};
    /// use ferroflow_optim::Sgd;
    /// use ferroflow_tensor::Tensor;
    /// let x = Tensor::from_vec(vec![0.0f32, 1.0, 2.0, 3.0], &[4, 1])?;
    /// let y = Tensor::from_vec(vec![-1.0f32, 1.0, 3.0, 5.0], &[4, 1])?;
    /// let ds = Dataset::from_tensor_slices((x, y))?.shuffle(4, Some(0), true)?.batch(2, false)?;
    /// let mut model = Model::from(sequential![Dense::new(1)]);
    /// model.compile(Sgd::new(0.05), MeanSquaredError::new(), &[])?;
    /// let h = model.fit_dataset(&ds, FitConfig::new().epochs(300).verbose(0))?;
    /// assert!(h.get("loss").unwrap().last().unwrap() < &1e-3);
    /// # Ok::<(), ferroflow_tensor::Error>(())
    /// ```
    pub fn fit_dataset<B: FitBatch>(
        &mut self,
        data: &Dataset<B>,
        config: FitConfig,
    ) -> Result<History> {
        self.compiled("fit")?;
        if config.validation_split > 0.0 {
            return Err(Error::invalid(
                "Model.fit",
                "validation_split is not supported with a dataset: split the dataset \
                 (take/skip) and pass validation_data",
            ));
        }
        let steps = match (config.steps_per_epoch, data.cardinality()) {
            (Some(s), _) => Some(s),
            (None, Cardinality::Infinite) => {
                return Err(Error::invalid(
                    "Model.fit",
                    "the dataset is infinite (repeat without a count): set steps_per_epoch",
                ))
            }
            (None, Cardinality::Finite(n)) => Some(n as usize),
            (None, Cardinality::Unknown) => None,
        };
        self.fit_batches(&batches_of(data), steps, config)
    }

    /// The chief's `seed` on every worker of the model's strategy (so every worker shuffles
    /// the samples alike and takes its rows of the same global batches).
    fn shared_seed(&self, seed: u64) -> Result<u64> {
        let Some(strategy) = self.strategy.as_ref().filter(|s| s.num_workers() > 1) else {
            return Ok(seed);
        };
        let chief = strategy.broadcast_from_chief(vec![Tensor::scalar(seed as i64)?])?;
        Ok(chief[0].item::<i64>()? as u64)
    }

    fn fit_batches(
        &mut self,
        batches: &Dataset<Batch>,
        steps: Option<usize>,
        mut config: FitConfig,
    ) -> Result<History> {
        let strategy = self.strategy.clone();
        if strategy
            .as_ref()
            .is_some_and(|s| s.as_parameter_server().is_some())
        {
            return Err(Error::invalid(
                "Model.fit",
                "under ParameterServerStrategy the workers train: give fit a DatasetCreator \
                 (Model::fit_dataset_creator, with steps_per_epoch) whose dataset function \
                 the workers serve (fit_functions)",
            ));
        }
        let _strategy_scope = strategy.clone().map(enter_scope);
        let _scope = device_scope(&self.device().to_string())?;
        let val = config.validation_data.take().map(|v| match v {
            ValidationData::Arrays(x, y) => array_batches(x, y, config.batch_size.max(1), None),
            ValidationData::Batches(d) => d,
        });
        let mut history = History::default();
        let (mut callbacks, first_epoch) = self.begin_training(&mut config, steps)?;
        let mut last_logs = Logs::new();
        let mut continuing = None;
        let mut global_step = 0i64;
        for epoch in first_epoch..config.epochs {
            self.reset_metrics();
            for cb in &mut callbacks {
                cb.on_epoch_begin(epoch, self)?;
            }
            let mut fresh;
            let it: &mut DatasetIter<Batch> = match config.steps_per_epoch {
                Some(_) => continuing.get_or_insert_with(|| batches.iter()),
                None => {
                    fresh = batches.iter();
                    &mut fresh
                }
            };
            let mut logs = Logs::new();
            let mut step = 0;
            while config.steps_per_epoch.is_none_or(|s| step < s) {
                // The batch is fetched after `on_train_batch_begin` (TF's order: its step
                // function pulls the batch), so where the count is known no callback hears
                // of a batch past the end (as in TF, one does for data of unknown size).
                if config.steps_per_epoch.is_none() && steps.is_some_and(|n| step >= n) {
                    break;
                }
                for cb in &mut callbacks {
                    cb.on_train_batch_begin(step, self)?;
                }
                // The profiler's step marker (TF's `Trace("train", step_num=..., _r=1)`):
                // input, the step and the update inside it, the batch callbacks after.
                let step_span = ferroflow_tensor::trace::TraceMe::step("train", global_step);
                global_step += 1;
                let Some(batch) = it.next() else {
                    if config.steps_per_epoch.is_some() {
                        if config.verbose > 0 {
                            eprintln!(
                                "WARNING: the input ran out of data after {step} steps of epoch {}; \
                                 interrupting training (use repeat() on the dataset)",
                                epoch + 1
                            );
                        }
                        self.stop_training = true;
                    }
                    break;
                };
                let (bx, by) = batch?;
                let (bx, by) = self.placed((bx, by))?;
                if by.is_empty() {
                    return Err(Error::invalid(
                        "Model.fit",
                        "the data holds inputs only; fit needs (x, y) batches",
                    ));
                }
                if step == 0 {
                    self.note_input_shapes(&bx);
                }
                logs = match &strategy {
                    Some(s) => self.replica_steps(s, &bx, &by, true)?,
                    None => self.train_step(&bx, &by)?,
                };
                drop(step_span);
                for cb in &mut callbacks {
                    cb.on_train_batch_end(step, &logs, self)?;
                }
                step += 1;
                if self.stop_training {
                    break;
                }
            }
            if step == 0 && epoch == first_epoch {
                return Err(Error::invalid(
                    "Model.fit",
                    "the training data yielded no batch",
                ));
            }
            if let Some(s) = &strategy {
                self.sync_metrics_across_workers(s.as_ref())?;
                logs = self.metric_logs();
            }
            if let Some(v) = &val {
                let v = self.evaluate_batches(v, config.validation_steps)?;
                for (k, value) in v.iter() {
                    logs.set(&format!("val_{k}"), value);
                }
            }
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

    /// What every `fit` does first: the progress bar and the config's callbacks, told that
    /// training begins; and the epoch to start at (`initial_epoch`, or after a backup a
    /// callback found).
    pub(super) fn begin_training(
        &mut self,
        config: &mut FitConfig,
        steps: Option<usize>,
    ) -> Result<(Vec<Box<dyn Callback>>, usize)> {
        let mut callbacks: Vec<Box<dyn Callback>> = Vec::new();
        if config.verbose > 0 {
            callbacks.push(Box::new(ProgbarLogger::new(config.verbose)));
        }
        callbacks.append(&mut config.callbacks);
        let params = TrainParams {
            epochs: config.epochs,
            steps,
            verbose: config.verbose,
        };
        self.stop_training = false;
        for cb in &mut callbacks {
            cb.on_train_begin(&params, self)?;
        }
        let first_epoch = self
            .resume_epoch
            .take()
            .map_or(config.initial_epoch, |e| e.max(config.initial_epoch));
        Ok((callbacks, first_epoch))
    }

    fn evaluate_batches(&mut self, batches: &Dataset<Batch>, steps: Option<usize>) -> Result<Logs> {
        self.compiled("evaluate")?;
        let strategy = self.strategy.clone();
        let _strategy_scope = strategy.clone().map(enter_scope);
        let _scope = device_scope(&self.device().to_string())?;
        self.reset_metrics();
        let mut logs = Logs::new();
        let mut seen = 0;
        for batch in batches.iter().take(steps.unwrap_or(usize::MAX)) {
            let (bx, by) = batch?;
            let (bx, by) = self.placed((bx, by))?;
            if by.is_empty() {
                return Err(Error::invalid(
                    "Model.evaluate",
                    "the data holds inputs only; evaluate needs (x, y) batches",
                ));
            }
            logs = match &strategy {
                Some(s) => self.replica_steps(s, &bx, &by, false)?,
                None => self.test_step(&bx, &by)?,
            };
            seen += 1;
        }
        if seen == 0 {
            return Err(Error::invalid(
                "Model.evaluate",
                "the data yielded no batch",
            ));
        }
        if let Some(s) = &strategy {
            self.sync_metrics_across_workers(s.as_ref())?;
            logs = self.metric_logs();
        }
        Ok(logs)
    }

    fn evaluate_data(&mut self, x: &Data, y: &Data, batch_size: usize) -> Result<Logs> {
        self.compiled("evaluate")?;
        if batch_size == 0 {
            return Err(Error::invalid(
                "Model.evaluate",
                "batch_size must be positive",
            ));
        }
        let n = x.samples("Model.evaluate", "x")?;
        if y.samples("Model.evaluate", "y")? != n {
            return Err(Error::invalid(
                "Model.evaluate",
                format!(
                    "x has {n} samples but y has {}",
                    y.samples("Model.evaluate", "y")?
                ),
            ));
        }
        self.evaluate_batches(&array_batches(x.clone(), y.clone(), batch_size, None), None)
    }

    /// Loss and metrics over a dataset of `(x, y)` batches in inference mode (Keras'
    /// `evaluate(dataset)`).
    pub fn evaluate_dataset<B: FitBatch>(&mut self, data: &Dataset<B>) -> Result<Logs> {
        self.evaluate_batches(&batches_of(data), None)
    }

    /// The network's first output over a dataset of batches (inputs alone, or `(x, y)` whose
    /// `y` is ignored), concatenated (Keras' `predict(dataset)`).
    pub fn predict_dataset<B: FitBatch>(&mut self, data: &Dataset<B>) -> Result<Tensor> {
        let _strategy_scope = self.strategy.clone().map(enter_scope);
        let _scope = device_scope(&self.device().to_string())?;
        let mut parts = Vec::new();
        for batch in batches_of(data).iter() {
            let (bx, _) = self.placed((batch?.0, vec![]))?;
            self.note_input_shapes(&bx);
            parts.push(self.network.apply(&bx, false)?.remove(0));
        }
        if parts.is_empty() {
            return Err(Error::invalid(
                "Model.predict",
                "the dataset yielded no batch",
            ));
        }
        Tensor::concat(&parts, 0)
    }

    /// Loss and metrics over `(x, y)` in inference mode (Keras' `evaluate`).
    pub fn evaluate(
        &mut self,
        x: impl Into<Data>,
        y: impl Into<Data>,
        batch_size: usize,
    ) -> Result<Logs> {
        let (x, y) = (x.into(), y.into());
        self.evaluate_data(&x, &y, batch_size)
    }

    /// The network's outputs for `x` in inference mode, batch by batch, concatenated
    /// (Keras' `predict`); the first output for multi-output models (see
    /// [`Model::predict_multi`]).
    pub fn predict(&mut self, x: impl Into<Data>, batch_size: usize) -> Result<Tensor> {
        Ok(self.predict_multi(x, batch_size)?.remove(0))
    }
    /// Every output of [`Model::predict`].
    pub fn predict_multi(&mut self, x: impl Into<Data>, batch_size: usize) -> Result<Vec<Tensor>> {
        let x = x.into();
        if batch_size == 0 {
            return Err(Error::invalid(
                "Model.predict",
                "batch_size must be positive",
            ));
        }
        let n = x.samples("Model.predict", "x")?;
        self.note_input_shapes(&x.0);
        let _strategy_scope = self.strategy.clone().map(enter_scope);
        let mut parts: Vec<Vec<Tensor>> = vec![];
        for start in (0..n).step_by(batch_size) {
            let end = (start + batch_size).min(n);
            let _scope = device_scope(&self.device().to_string())?;
            let out = self
                .network
                .apply(&self.placed((x.range(start, end)?.0, vec![]))?.0, false)?;
            if parts.is_empty() {
                parts = vec![vec![]; out.len()];
            }
            for (p, o) in parts.iter_mut().zip(out) {
                p.push(o);
            }
        }
        if parts.is_empty() {
            return Err(Error::invalid("Model.predict", "x has no samples"));
        }
        parts.iter().map(|p| Tensor::concat(p, 0)).collect()
    }
}

/// The default steps' graphs, kept with the compiled model (a new `compile` traces anew).
#[derive(Default)]
pub(crate) struct StepGraphs {
    train: Option<TraceCache<StepLayout>>,
    /// The trainable weights the train graphs differentiate.
    train_variables: Vec<u64>,
    test: Option<TraceCache<StepLayout>>,
}

/// How a step graph's outputs are laid out: the loss, the predictions, the per-output
/// losses (several outputs), then the gradients that exist.
#[derive(Debug, Clone)]
struct StepLayout {
    predictions: usize,
    output_losses: usize,
    /// Per trainable weight: whether it has a gradient (those that do follow in order).
    gradients: Vec<bool>,
}

impl StepLayout {
    /// `(loss, predictions, per-output losses, the rest)`.
    #[allow(clippy::type_complexity)]
    fn split(
        &self,
        outputs: Vec<Tensor>,
    ) -> Result<(Tensor, Vec<Tensor>, Vec<Tensor>, std::vec::IntoIter<Tensor>)> {
        let mut it = outputs.into_iter();
        let loss = it
            .next()
            .ok_or_else(|| Error::invalid("Model", "a step graph returned no loss"))?;
        let y_pred: Vec<Tensor> = it.by_ref().take(self.predictions).collect();
        let output_losses: Vec<Tensor> = it.by_ref().take(self.output_losses).collect();
        Ok((loss, y_pred, output_losses, it))
    }
}

/// A step that cannot be traced: the error, and how to run it anyway.
fn explain_trace_error(step: &str, e: Error) -> Error {
    match e {
        Error::NotTraceable { op, msg } => Error::NotTraceable {
            op,
            msg: format!(
                "{msg} (in the model's {step}, which runs as a graph: call \
                 model.set_run_eagerly(true) to run it eagerly, or have a custom layer that \
                 computes on the host answer false to Layer::traceable)"
            ),
        },
        e => e,
    }
}
