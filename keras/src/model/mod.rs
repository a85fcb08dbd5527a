//! [`Model`] (`tf.keras.Model`): a network plus what `compile` gives it; the model and
//! compile live here, the rest by concern: [`Sequential`] (`sequential.rs`), the arrays
//! and datasets `fit` accepts (`data_adapter.rs`, Keras' data adapters), the training
//! loop (`training.rs`: `fit`, `evaluate`, `predict`, the steps), and saving and loading
//! (`save.rs`).

mod data_adapter;
mod parameter_server;
mod save;
mod sequential;
mod training;

pub use data_adapter::{Batch, Data, FitBatch, ValidationData};
pub use parameter_server::{fit_functions, DatasetCreator};
pub use sequential::Sequential;
pub use training::FitConfig;

use ferroflow_distribute::{get_strategy, has_strategy, Strategy};
use ferroflow_optim::Optimizer;
use ferroflow_tensor::{current_device, DType, Device, Error, Result, Tensor, Variable};
use std::sync::Arc;

use crate::callbacks::Logs;
use crate::functional::{Functional, KerasTensor};
use crate::layer::Layer;
use crate::losses::Loss;
use crate::metrics::{Mean, Metric};
use crate::saving;

/// A custom training or test step: `(model, x, y) -> logs` (Keras' overridden
/// `train_step`/`test_step`).
pub type StepFn = dyn FnMut(&mut Model, &[Tensor], &[Tensor]) -> Result<Logs> + Send;

struct Compiled {
    optimizer: Box<dyn Optimizer>,
    loss: Box<dyn Loss>,
    metrics: Vec<Box<dyn Metric>>,
    loss_tracker: Mean,
    /// With several outputs: per output, its name, loss tracker and metrics (made from the
    /// compiled metrics' names on the first update), reported as Keras does
    /// (`<output>_loss`, `<output>_<metric>`).
    per_output: Vec<OutputTracker>,
    /// The per-output losses of the last `compute_loss`.
    last_output_losses: Vec<Tensor>,
    /// The default steps traced into graphs (Keras' `train_function`/`test_function`).
    graphs: training::StepGraphs,
}

struct OutputTracker {
    name: String,
    loss: Mean,
    metrics: Vec<Box<dyn Metric>>,
}

/// A trainable network (`tf.keras.Model`): a [`Layer`] (a [`Sequential`], a functional
/// graph, or any custom layer) plus what `compile` gives it.
pub struct Model {
    network: Box<dyn Layer>,
    compiled: Option<Compiled>,
    train_step_fn: Option<Box<StepFn>>,
    test_step_fn: Option<Box<StepFn>>,
    build_input_shapes: Option<Vec<Vec<usize>>>,
    /// Set by a callback (or a custom step) to end `fit` after the current batch.
    pub stop_training: bool,
    /// The strategy whose scope the model was created in (TF's `model.distribute_strategy`).
    strategy: Option<Arc<dyn Strategy>>,
    /// Set by `fit`/`evaluate` around each replica's step under a strategy.
    pub(crate) replica_step: Option<ReplicaStep>,
    /// The epoch `fit` starts at, set by a callback's `on_train_begin` (`BackupAndRestore`
    /// found a backup).
    pub(crate) resume_epoch: Option<usize>,
    /// Run the default steps eagerly instead of as traced graphs (Keras' `run_eagerly`).
    run_eagerly: bool,
}

/// What the default steps need to know of the replica they run as.
#[derive(Debug, Clone, Copy)]
pub(crate) struct ReplicaStep {
    /// The replica's share of the global batch: its mean loss is scaled by it, so the
    /// gradients summed over replicas are those of the global batch's mean loss (TF's
    /// `compute_average_loss`). 0 for a replica left without rows (it runs one row of the
    /// batch so that it still takes part in the gradients' all-reduce).
    pub(crate) loss_weight: f64,
    /// Whether the replica's rows count in the metrics (not for a replica without rows).
    pub(crate) count_metrics: bool,
}

impl From<Sequential> for Model {
    fn from(s: Sequential) -> Model {
        Model::from_layer(s)
    }
}
impl Model {
    /// A functional model from symbolic inputs to outputs (`tf.keras.Model(inputs,
    /// outputs)`); see [`crate::functional`].
    pub fn new(inputs: &[KerasTensor], outputs: &[KerasTensor]) -> Result<Model> {
        let graph = Functional::new(inputs, outputs)?;
        let mut m = Model::from_layer(graph);
        m.build_input_shapes = Some(
            inputs
                .iter()
                .map(|k| k.shape()[1..].iter().map(|d| d.unwrap_or(1)).collect())
                .collect(),
        );
        Ok(m)
    }
    /// Wraps any layer as a model (Keras' subclassed models).
    pub fn from_layer(network: impl Layer + 'static) -> Model {
        Model::from_boxed(Box::new(network))
    }
    /// Wraps a boxed layer as a model.
    pub fn from_boxed(network: Box<dyn Layer>) -> Model {
        Model {
            network,
            compiled: None,
            train_step_fn: None,
            test_step_fn: None,
            build_input_shapes: None,
            stop_training: false,
            strategy: has_strategy().then(get_strategy),
            replica_step: None,
            resume_epoch: None,
            run_eagerly: false,
        }
    }
    /// Whether this process writes the model's files (checkpoints, backups): always, but
    /// under a multi-worker strategy only on the chief (every worker holds the same weights).
    pub fn writes_files(&self) -> bool {
        self.strategy.as_ref().is_none_or(|s| s.is_chief())
    }
    /// The strategy the model was created under (`model.distribute_strategy`): `fit`,
    /// `evaluate` and `predict` run in its scope; `None` when created outside any.
    pub fn distribute_strategy(&self) -> Option<&Arc<dyn Strategy>> {
        self.strategy.as_ref()
    }
    /// The network.
    pub fn network(&self) -> &dyn Layer {
        self.network.as_ref()
    }
    /// The network, mutably.
    pub fn network_mut(&mut self) -> &mut dyn Layer {
        self.network.as_mut()
    }
    /// The model's name.
    pub fn name(&self) -> &str {
        self.network.name()
    }

    /// Builds the weights for samples of `input_shape` (without the batch dimension) by
    /// running one sample of zeros through the network.
    pub fn build(&mut self, input_shape: &[usize]) -> Result<()> {
        self.build_multi(&[input_shape.to_vec()])
    }
    /// [`Model::build`] for a model with several inputs.
    pub fn build_multi(&mut self, input_shapes: &[Vec<usize>]) -> Result<()> {
        // Weights built later are the strategy's too (TF builds in the model's strategy's scope).
        let _strategy_scope = self.strategy.clone().map(ferroflow_distribute::enter_scope);
        let dtype = self.network.base().dtype()?;
        let probes: Vec<Tensor> = input_shapes
            .iter()
            .map(|s| {
                let mut shape = vec![1];
                shape.extend_from_slice(s);
                Tensor::zeros(&shape, dtype)
            })
            .collect::<Result<_>>()?;
        self.network.apply(&probes, false)?;
        self.build_input_shapes = Some(input_shapes.to_vec());
        Ok(())
    }
    fn note_input_shapes(&mut self, x: &[Tensor]) {
        if self.build_input_shapes.is_none() {
            self.build_input_shapes = Some(x.iter().map(|t| t.shape()[1..].to_vec()).collect());
        }
    }

    /// Runs the network (Keras' `model(x, training=...)`), one input and one output.
    pub fn call(&mut self, x: &Tensor, training: bool) -> Result<Tensor> {
        self.note_input_shapes(std::slice::from_ref(x));
        self.network.forward(x, training)
    }
    /// Runs the network on several inputs, giving every output.
    pub fn call_multi(&mut self, x: &[Tensor], training: bool) -> Result<Vec<Tensor>> {
        self.note_input_shapes(x);
        self.network.apply(x, training)
    }

    /// Configures training: the optimizer, the loss, and metrics by Keras name
    /// (`"accuracy"`, `"auc"`, ...).
    pub fn compile(
        &mut self,
        optimizer: impl Optimizer + 'static,
        loss: impl Loss + 'static,
        metrics: &[&str],
    ) -> Result<()> {
        let metrics = metrics
            .iter()
            .map(|m| crate::metrics::get(m))
            .collect::<Result<Vec<_>>>()?;
        self.compile_with(Box::new(optimizer), Box::new(loss), metrics)
    }
    /// [`Model::compile`] with boxed parts and metric objects.
    pub fn compile_with(
        &mut self,
        optimizer: Box<dyn Optimizer>,
        loss: Box<dyn Loss>,
        metrics: Vec<Box<dyn Metric>>,
    ) -> Result<()> {
        // TF 2.4: under "mixed_float16" compile wraps the optimizer in a dynamic loss scale.
        let optimizer = if self.network.base().dtype_policy.name() == "mixed_float16"
            && optimizer.loss_scale().is_none()
        {
            Box::new(ferroflow_optim::LossScaleOptimizer::dynamic(optimizer)?)
        } else {
            optimizer
        };
        self.compiled = Some(Compiled {
            optimizer,
            loss,
            metrics,
            loss_tracker: Mean::new("loss"),
            per_output: Vec::new(),
            last_output_losses: Vec::new(),
            graphs: training::StepGraphs::default(),
        });
        Ok(())
    }
    fn compiled(&mut self, method: &str) -> Result<&mut Compiled> {
        self.compiled.as_mut().ok_or_else(|| {
            Error::invalid(
                "Model",
                format!("you must compile the model before calling `{method}`"),
            )
        })
    }
    /// The optimizer given to `compile`.
    pub fn optimizer_mut(&mut self) -> Option<&mut (dyn Optimizer + 'static)> {
        match &mut self.compiled {
            Some(c) => Some(c.optimizer.as_mut()),
            None => None,
        }
    }
    /// Replaces `train_step` (Keras: overriding `train_step` in a subclass). The closure may
    /// call [`Model::default_train_step`] or do its own thing with [`Model::compute_loss`],
    /// [`Model::update_metrics`] and [`Model::optimizer_mut`].
    pub fn set_train_step(
        &mut self,
        step: impl FnMut(&mut Model, &[Tensor], &[Tensor]) -> Result<Logs> + Send + 'static,
    ) {
        self.train_step_fn = Some(Box::new(step));
    }
    /// Replaces `test_step` (used by `evaluate` and validation).
    pub fn set_test_step(
        &mut self,
        step: impl FnMut(&mut Model, &[Tensor], &[Tensor]) -> Result<Logs> + Send + 'static,
    ) {
        self.test_step_fn = Some(Box::new(step));
    }

    /// The compiled loss of predictions against targets (summed over outputs when there
    /// are several), plus the layers' regularization penalties.
    pub fn compute_loss(&mut self, y: &[Tensor], y_pred: &[Tensor]) -> Result<Tensor> {
        if y.len() != y_pred.len() {
            return Err(Error::invalid(
                "Model.compute_loss",
                format!(
                    "the model has {} outputs but {} targets were given",
                    y_pred.len(),
                    y.len()
                ),
            ));
        }
        let mut total: Option<Tensor> = None;
        {
            let c = self.compiled("fit")?;
            c.last_output_losses.clear();
            for (t, p) in y.iter().zip(y_pred) {
                // Losses run in float32 under mixed precision.
                let l = c.loss.call(t, &p.upcast_half()?, None)?;
                if y_pred.len() > 1 {
                    c.last_output_losses.push(l.clone());
                }
                total = Some(match total {
                    Some(s) => s.add(&l)?,
                    None => l,
                });
            }
        }
        let mut total = total.ok_or_else(|| Error::invalid("Model.compute_loss", "no outputs"))?;
        for r in self.network.regularization_losses()? {
            total = total.add(&r.cast(total.dtype())?)?;
        }
        Ok(total)
    }
    /// Updates the loss tracker (weighted by batch size, as Keras) and the compiled metrics;
    /// returns the running logs.
    pub fn update_metrics(
        &mut self,
        y: &[Tensor],
        y_pred: &[Tensor],
        loss: &Tensor,
    ) -> Result<Logs> {
        let batch = y
            .first()
            .and_then(|t| t.shape().first().copied())
            .unwrap_or(1) as f64;
        let loss_value = loss.to_f64_vec()?.first().copied().unwrap_or(f64::NAN);
        if y_pred.len() > 1 && self.compiled("fit")?.per_output.is_empty() {
            let names = self.output_names(y_pred.len());
            let c = self.compiled("fit")?;
            let mut originals: Vec<Option<Box<dyn Metric>>> = std::mem::take(&mut c.metrics)
                .into_iter()
                .map(Some)
                .collect();
            for (o, name) in names.into_iter().enumerate() {
                let mut metrics = Vec::new();
                for m in originals.iter_mut() {
                    let metric_name = m.as_ref().map(|m| m.name().to_string()).unwrap_or_default();
                    match crate::metrics::get(&metric_name) {
                        Ok(fresh) => metrics.push(fresh),
                        // A metric object that cannot be made again by name stays with the
                        // first output.
                        Err(_) if o == 0 => metrics.extend(m.take()),
                        Err(_) => {}
                    }
                }
                c.per_output.push(OutputTracker {
                    loss: Mean::new(&format!("{name}_loss")),
                    name,
                    metrics,
                });
            }
        }
        let c = self.compiled("fit")?;
        c.loss_tracker.update(loss_value, batch);
        if c.per_output.is_empty() {
            if let (Some(t), Some(p)) = (y.first(), y_pred.first()) {
                let p = p.upcast_half()?;
                for m in &mut c.metrics {
                    m.update_state(t, &p, None)?;
                }
            }
        } else {
            if c.last_output_losses.len() != y_pred.len() {
                // A custom step that did not go through compute_loss.
                c.last_output_losses = y
                    .iter()
                    .zip(y_pred)
                    .map(|(t, p)| c.loss.call(t, &p.upcast_half()?, None))
                    .collect::<Result<_>>()?;
            }
            for (((t, p), l), out) in y
                .iter()
                .zip(y_pred)
                .zip(&c.last_output_losses)
                .zip(&mut c.per_output)
            {
                let value = l.to_f64_vec()?.first().copied().unwrap_or(f64::NAN);
                out.loss.update(value, batch);
                let p = p.upcast_half()?;
                for m in &mut out.metrics {
                    m.update_state(t, &p, None)?;
                }
            }
            c.last_output_losses.clear();
        }
        Ok(self.metric_logs())
    }
    /// Names of the model's `n` outputs for the logs: a functional model's output layers
    /// (Keras), `output_1`, `output_2`, ... otherwise.
    fn output_names(&self, n: usize) -> Vec<String> {
        match self.network.output_names() {
            Some(names) if names.len() == n => names,
            _ => (1..=n).map(|i| format!("output_{i}")).collect(),
        }
    }
    /// The running loss and metric values.
    pub fn metric_logs(&self) -> Logs {
        let mut logs = Logs::new();
        if let Some(c) = &self.compiled {
            logs.set("loss", c.loss_tracker.result());
            for m in &c.metrics {
                logs.set(m.name(), m.result());
            }
            for out in &c.per_output {
                logs.set(&format!("{}_loss", out.name), out.loss.result());
            }
            for out in &c.per_output {
                for m in &out.metrics {
                    logs.set(&format!("{}_{}", out.name, m.name()), m.result());
                }
            }
        }
        logs
    }
    /// Sums the loss trackers' and metrics' states over the workers of `strategy`, so the
    /// logs are those of all workers' data (TF reads its sync-on-read metric variables
    /// across workers). Every worker calls it at the same point.
    pub(crate) fn sync_metrics_across_workers(&mut self, strategy: &dyn Strategy) -> Result<()> {
        let Some(cross) = strategy.cross_worker() else {
            return Ok(());
        };
        let Some(c) = &mut self.compiled else {
            return Ok(());
        };
        let mut metrics: Vec<&mut dyn Metric> = vec![&mut c.loss_tracker];
        metrics.extend(c.metrics.iter_mut().map(|m| m.as_mut() as &mut dyn Metric));
        for out in &mut c.per_output {
            metrics.push(&mut out.loss);
            metrics.extend(
                out.metrics
                    .iter_mut()
                    .map(|m| m.as_mut() as &mut dyn Metric),
            );
        }
        let mut lengths = vec![];
        let mut flat = vec![];
        for m in &metrics {
            let state = m.state().ok_or_else(|| {
                Error::invalid(
                    "fit",
                    format!(
                        "metric {:?} does not expose its state (Metric::state), so it cannot be \
                         summed across the workers of {}",
                        m.name(),
                        strategy.name()
                    ),
                )
            })?;
            lengths.push(state.len());
            flat.extend(state);
        }
        let n = flat.len();
        let summed = cross
            .all_reduce_sum(vec![Tensor::from_vec(flat, &[n])?])?
            .pop()
            .ok_or_else(|| Error::invalid("fit", "the metrics' all-reduce returned nothing"))?
            .cast(DType::F64)?
            .to_vec::<f64>()?;
        let mut at = 0;
        for (m, len) in metrics.iter_mut().zip(lengths) {
            m.set_state(&summed[at..at + len])?;
            at += len;
        }
        Ok(())
    }

    fn reset_metrics(&mut self) {
        if let Some(c) = &mut self.compiled {
            c.loss_tracker.reset_state();
            for m in &mut c.metrics {
                m.reset_state();
            }
            for out in &mut c.per_output {
                out.loss.reset_state();
                for m in &mut out.metrics {
                    m.reset_state();
                }
            }
        }
    }

    /// Trainable weights of the network.
    pub fn trainable_weights(&self) -> Vec<Variable> {
        self.network.trainable_weights()
    }
    /// The device the model computes on: where its weights live once it is built (weights
    /// are created in the device scope active at the first batch, as in TF), else the current
    /// device scope. `fit`, `evaluate` and `predict` run in this device's scope and copy each
    /// batch there.
    ///
    /// ```
    /// ferroflow::init();
    /// use ferroflow_keras::{layers::Dense, sequential, Model};
    /// let model = Model::from(sequential![Dense::new(1)]);
    /// assert_eq!(model.device(), ferroflow_tensor::Device::CPU);
    /// ```
    pub fn device(&self) -> Device {
        self.network
            .weights()
            .first()
            .map(|v| v.value().device())
            .unwrap_or_else(current_device)
    }
    /// A batch's inputs and targets on the model's device.
    fn placed(&self, (x, y): Batch) -> Result<Batch> {
        let d = self.device();
        let to = |ts: Vec<Tensor>| -> Result<Vec<Tensor>> {
            ts.into_iter().map(|t| t.to_device(d)).collect()
        };
        Ok((to(x)?, to(y)?))
    }
    /// Every weight of the network.
    pub fn weights(&self) -> Vec<Variable> {
        self.network.weights()
    }
    /// Number of scalars in all weights.
    pub fn count_params(&self) -> usize {
        self.network.count_params()
    }
    /// Copies of every weight's value, in [`Model::weights`] order (Keras' `get_weights`).
    pub fn get_weights(&self) -> Result<Vec<Tensor>> {
        self.weights().iter().map(|v| v.peek().copy()).collect()
    }
    /// Sets every weight from `values` (as [`Model::get_weights`] gives them); all or
    /// nothing.
    pub fn set_weights(&mut self, values: Vec<Tensor>) -> Result<()> {
        let named: Vec<(String, Variable)> = self
            .weights()
            .into_iter()
            .map(|v| (v.name().to_string(), v))
            .collect();
        let saved = values
            .into_iter()
            .enumerate()
            .map(|(i, t)| (format!("#{i}"), t))
            .collect();
        saving::assign_weights("set_weights", &named, saved)
    }

    fn require_built(&self, what: &str) -> Result<()> {
        if self.network.weights().is_empty() && !self.network.base().built() {
            return Err(Error::invalid(
                "Model",
                format!("{what}: the model has not been built yet; call `build`, call it on data, or `fit` it first"),
            ));
        }
        Ok(())
    }

    /// The Keras summary table: each layer's name, class, output shape (batch as `None`) and
    /// parameter count, then the totals.
    pub fn summary(&self) -> Result<String> {
        self.require_built("summary")?;
        let mut rows: Vec<(String, String, usize)> = vec![];
        let mut listed: Vec<(String, &'static str, Vec<Vec<usize>>, usize)> = vec![];
        self.network.visit_sublayers(&mut |l| {
            listed.push((
                l.name().to_string(),
                l.class_name(),
                l.base().output_shapes().to_vec(),
                l.count_params(),
            ))
        });
        if listed.is_empty() {
            let l = self.network.as_ref();
            listed.push((
                l.name().to_string(),
                l.class_name(),
                l.base().output_shapes().to_vec(),
                l.count_params(),
            ));
        }
        for (name, class, output_shapes, params) in &listed {
            let shapes: Vec<String> = output_shapes
                .iter()
                .map(|s| {
                    let dims: Vec<String> = s
                        .iter()
                        .enumerate()
                        .map(|(i, d)| if i == 0 { "None".into() } else { d.to_string() })
                        .collect();
                    if dims.len() == 1 {
                        format!("({},)", dims[0])
                    } else {
                        format!("({})", dims.join(", "))
                    }
                })
                .collect();
            let shape = match shapes.len() {
                0 => "multiple".to_string(),
                1 => shapes[0].clone(),
                _ => format!("[{}]", shapes.join(", ")),
            };
            rows.push((format!("{name} ({class})"), shape, *params));
        }
        let total = self.count_params();
        let trainable: usize = self
            .trainable_weights()
            .iter()
            .map(|v| v.shape().iter().product::<usize>())
            .sum();
        let line = |c: char| c.to_string().repeat(65);
        let mut s = format!("Model: \"{}\"\n{}\n", self.name(), line('_'));
        s += &format!(
            "{:<29}{:<26}{:<10}\n{}\n",
            "Layer (type)",
            "Output Shape",
            "Param #",
            line('=')
        );
        for (i, (name, shape, params)) in rows.iter().enumerate() {
            s += &format!("{name:<29}{shape:<26}{params:<10}\n");
            s += &format!("{}\n", line(if i + 1 == rows.len() { '=' } else { '_' }));
        }
        s += &format!(
            "Total params: {}\nTrainable params: {}\nNon-trainable params: {}\n{}\n",
            thousands(total),
            thousands(trainable),
            thousands(total - trainable),
            line('_')
        );
        Ok(s)
    }
}

fn thousands(n: usize) -> String {
    let s = n.to_string();
    let mut out = String::new();
    for (i, c) in s.chars().enumerate() {
        if i > 0 && (s.len() - i).is_multiple_of(3) {
            out.push(',');
        }
        out.push(c);
    }
    out
}
