//! [`Sequential`] and [`Model`]: compile, fit, evaluate, predict, summary, weights I/O.

use std::path::Path;
use std::sync::{Arc, Mutex};

use ferroflow_autodiff::{GradientTape, Source};
use ferroflow_data::{Cardinality, Dataset, DatasetIter};
use ferroflow_optim::Optimizer;
use ferroflow_tensor::random::Philox;
use ferroflow_tensor::{
    current_device, device_scope, random, DType, Device, Error, Result, Tensor, Variable,
};
use serde_json::{json, Value};

use crate::callbacks::{Callback, History, Logs, ProgbarLogger, TrainParams};
use crate::functional::{Functional, KerasTensor};
use crate::layer::{Layer, LayerBase};
use crate::losses::Loss;
use crate::metrics::{Mean, Metric};
use crate::saving;

/// A stack of layers, each feeding the next (`tf.keras.Sequential`). It is a [`Layer`];
/// wrap it in a [`Model`] (`Model::from(seq)`) to compile and fit it.
///
/// ```
/// ferroflow::init();
/// use ferroflow_keras::{activations::Activation, layers::{Dense, Flatten}, sequential, Model};
/// let mut model = Model::from(sequential![
///     Flatten::new(),
///     Dense::new(16).activation(Activation::Relu),
///     Dense::new(10),
/// ]);
/// model.build(&[28, 28])?;
/// assert_eq!(model.count_params(), 784 * 16 + 16 + 16 * 10 + 10);
/// # Ok::<(), ferroflow_tensor::Error>(())
/// ```
pub struct Sequential {
    base: LayerBase,
    layers: Vec<Box<dyn Layer>>,
}

/// Builds a [`Sequential`] from layers: `sequential![Dense::new(8), Dense::new(1)]`.
#[macro_export]
macro_rules! sequential {
    ($($layer:expr),* $(,)?) => {{
        let mut s = $crate::model::Sequential::new();
        $( s.add($layer); )*
        s
    }};
}

impl Sequential {
    /// An empty stack.
    pub fn new() -> Sequential {
        Sequential {
            base: LayerBase::new("sequential", None),
            layers: vec![],
        }
    }
    /// Appends a layer.
    pub fn add(&mut self, layer: impl Layer + 'static) -> &mut Sequential {
        self.layers.push(Box::new(layer));
        self
    }
    /// Appends a boxed layer.
    pub fn add_boxed(&mut self, layer: Box<dyn Layer>) -> &mut Sequential {
        self.layers.push(layer);
        self
    }
    /// The layers.
    pub fn layers(&self) -> &[Box<dyn Layer>] {
        &self.layers
    }
    /// The layers, mutably (to freeze one: `layers_mut()[0].base_mut().trainable = false`).
    pub fn layers_mut(&mut self) -> &mut [Box<dyn Layer>] {
        &mut self.layers
    }
    /// Rebuilds from [`Layer::get_config`].
    pub fn from_config(c: &Value) -> Result<Sequential> {
        let mut s = Sequential::new();
        let layers = c["layers"]
            .as_array()
            .ok_or_else(|| Error::format("Sequential config", "missing list \"layers\""))?;
        for l in layers {
            s.layers.push(crate::layers::deserialize(l)?);
        }
        Ok(s)
    }
}

impl Default for Sequential {
    fn default() -> Self {
        Sequential::new()
    }
}

impl Layer for Sequential {
    fn base(&self) -> &LayerBase {
        &self.base
    }
    fn base_mut(&mut self) -> &mut LayerBase {
        &mut self.base
    }
    fn class_name(&self) -> &'static str {
        "Sequential"
    }
    fn call(&mut self, inputs: &[Tensor], training: bool) -> Result<Vec<Tensor>> {
        let mut x = inputs.to_vec();
        for l in &mut self.layers {
            x = l.apply(&x, training)?;
        }
        Ok(x)
    }
    fn get_config(&self) -> Value {
        json!({ "layers": self.layers.iter().map(|l| l.config()).collect::<Vec<_>>() })
    }
    fn sublayers(&self) -> Vec<&dyn Layer> {
        self.layers.iter().map(|l| l.as_ref()).collect()
    }
}

/// Inputs or targets for `fit`/`evaluate`/`predict`: one tensor or several (a model with
/// several inputs or outputs), all with the same number of samples in dimension 0.
#[derive(Debug, Clone)]
pub struct Data(pub Vec<Tensor>);

impl From<Tensor> for Data {
    fn from(t: Tensor) -> Data {
        Data(vec![t])
    }
}
impl From<&Tensor> for Data {
    fn from(t: &Tensor) -> Data {
        Data(vec![t.clone()])
    }
}
impl From<Vec<Tensor>> for Data {
    fn from(v: Vec<Tensor>) -> Data {
        Data(v)
    }
}
impl From<&[Tensor]> for Data {
    fn from(v: &[Tensor]) -> Data {
        Data(v.to_vec())
    }
}

impl Data {
    /// The sample count (the first dimension, shared by every array); errors name `method`.
    fn samples(&self, method: &'static str, what: &str) -> Result<usize> {
        let n = self
            .0
            .first()
            .and_then(|t| t.shape().first().copied())
            .ok_or_else(|| Error::invalid(method, format!("{what} is empty or a scalar")))?;
        if let Some(t) = self.0.iter().find(|t| t.shape().first() != Some(&n)) {
            return Err(Error::invalid(
                method,
                format!(
                    "{what}: all arrays need {n} samples, one has shape {:?}",
                    t.shape()
                ),
            ));
        }
        Ok(n)
    }
    /// The samples `idx`, gathered where each array lives (the batch moves to the model's
    /// device afterwards, not the whole array).
    fn take(&self, idx: &Tensor) -> Result<Vec<Tensor>> {
        self.0
            .iter()
            .map(|t| t.gather(&idx.to_device(t.device())?, 0))
            .collect()
    }
    fn range(&self, start: usize, end: usize) -> Result<Data> {
        let idx = Tensor::from_vec(
            (start as i64..end as i64).collect::<Vec<_>>(),
            &[end - start],
        )?;
        Ok(Data(self.take(&idx)?))
    }
}

/// One batch as `fit` sees it: the inputs and the targets.
pub type Batch = (Vec<Tensor>, Vec<Tensor>);

/// An element of a dataset `fit`, `evaluate` and `predict` accept: a batch of inputs and
/// targets (one tensor or several each), or inputs alone (for `predict`).
pub trait FitBatch: Send + 'static {
    /// The inputs and the targets (empty for inputs alone).
    fn into_batch(self) -> Batch;
}
impl FitBatch for (Tensor, Tensor) {
    fn into_batch(self) -> Batch {
        (vec![self.0], vec![self.1])
    }
}
impl FitBatch for (Vec<Tensor>, Vec<Tensor>) {
    fn into_batch(self) -> Batch {
        self
    }
}
impl FitBatch for (Vec<Tensor>, Tensor) {
    fn into_batch(self) -> Batch {
        (self.0, vec![self.1])
    }
}
impl FitBatch for Tensor {
    fn into_batch(self) -> Batch {
        (vec![self], vec![])
    }
}

/// Validation data of [`FitConfig`]: arrays, batched with `fit`'s batch size, or a dataset
/// of batches.
pub enum ValidationData {
    /// Inputs and targets with the samples along dimension 0.
    Arrays(Data, Data),
    /// A dataset of `(x, y)` batches.
    Batches(Dataset<Batch>),
}

fn batches_of<B: FitBatch>(data: &Dataset<B>) -> Dataset<Batch> {
    data.map(|b: B| Ok(b.into_batch()))
}

/// Arrays as a dataset of batches (Keras' array data adapter): `batch_size` samples per
/// batch, in a new random order each pass when `shuffle_seed` is given.
fn array_batches(x: Data, y: Data, batch_size: usize, shuffle_seed: Option<u64>) -> Dataset<Batch> {
    let n =
        x.0.first()
            .and_then(|t| t.shape().first().copied())
            .unwrap_or(0);
    let rng = shuffle_seed.map(|s| Arc::new(Mutex::new(Philox::new([s, 0x6669_745f_7368_7566]))));
    Dataset::from_fallible_generator(move || {
        let mut order: Vec<i64> = (0..n as i64).collect();
        if let Some(rng) = &rng {
            let mut rng = rng.lock().unwrap_or_else(|e| e.into_inner());
            for i in (1..n).rev() {
                let j = (rng.next_f64() * (i + 1) as f64) as usize;
                order.swap(i, j.min(i));
            }
        }
        let (x, y) = (x.clone(), y.clone());
        let chunks: Vec<Vec<i64>> = order.chunks(batch_size).map(<[i64]>::to_vec).collect();
        chunks.into_iter().map(move |chunk| {
            let idx = Tensor::from_vec(chunk.clone(), &[chunk.len()])?;
            Ok((x.take(&idx)?, y.take(&idx)?))
        })
    })
}

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
        }
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

    /// One optimization step on a batch: forward under a tape, loss, gradients,
    /// `apply_gradients`, metrics (Keras' default `train_step`).
    pub fn default_train_step(&mut self, x: &[Tensor], y: &[Tensor]) -> Result<Logs> {
        self.compiled("fit")?;
        let tape = GradientTape::new();
        let y_pred = self.network.apply(x, true)?;
        let loss = self.compute_loss(y, &y_pred)?;
        let vars = self.network.trainable_weights();
        let sources: Vec<Source> = vars.iter().map(Source::from).collect();
        // A loss-scaling optimizer: scale the loss on the tape, unscale the gradients.
        let scale = self.compiled("fit")?.optimizer.loss_scale();
        let grads = match scale {
            Some(s) => {
                let scaled = loss.mul(&loss.scalar_like(s)?)?;
                let grads = tape.gradient(&scaled, &sources)?;
                grads
                    .into_iter()
                    .map(|g| g.map(|g| g.div(&g.scalar_like(s)?)).transpose())
                    .collect::<Result<Vec<_>>>()?
            }
            None => tape.gradient(&loss, &sources)?,
        };
        drop(tape);
        let c = self.compiled("fit")?;
        c.optimizer
            .apply_gradients(grads.into_iter().zip(vars).collect(), true)?;
        self.update_metrics(y, &y_pred, &loss)
    }
    /// Forward in inference mode, loss and metrics (Keras' default `test_step`).
    pub fn default_test_step(&mut self, x: &[Tensor], y: &[Tensor]) -> Result<Logs> {
        let y_pred = self.network.apply(x, false)?;
        let loss = self.compute_loss(y, &y_pred)?;
        self.update_metrics(y, &y_pred, &loss)
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
            Some(random_seed()?)
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

    fn fit_batches(
        &mut self,
        batches: &Dataset<Batch>,
        steps: Option<usize>,
        mut config: FitConfig,
    ) -> Result<History> {
        let _scope = device_scope(&self.device().to_string())?;
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
        let val = config.validation_data.take().map(|v| match v {
            ValidationData::Arrays(x, y) => array_batches(x, y, config.batch_size.max(1), None),
            ValidationData::Batches(d) => d,
        });
        let mut history = History::default();
        self.stop_training = false;
        for cb in &mut callbacks {
            cb.on_train_begin(&params, self)?;
        }
        let mut last_logs = Logs::new();
        let mut continuing = None;
        for epoch in config.initial_epoch..config.epochs {
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
                for cb in &mut callbacks {
                    cb.on_train_batch_begin(step, self)?;
                }
                logs = self.train_step(&bx, &by)?;
                for cb in &mut callbacks {
                    cb.on_train_batch_end(step, &logs, self)?;
                }
                step += 1;
                if self.stop_training {
                    break;
                }
            }
            if step == 0 && epoch == config.initial_epoch {
                return Err(Error::invalid(
                    "Model.fit",
                    "the training data yielded no batch",
                ));
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

    fn evaluate_batches(&mut self, batches: &Dataset<Batch>, steps: Option<usize>) -> Result<Logs> {
        self.compiled("evaluate")?;
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
            logs = self.test_step(&bx, &by)?;
            seen += 1;
        }
        if seen == 0 {
            return Err(Error::invalid(
                "Model.evaluate",
                "the data yielded no batch",
            ));
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
    /// Writes every weight to a safetensors file, named by path (`"dense/kernel"`).
    pub fn save_weights(&self, path: impl AsRef<Path>) -> Result<()> {
        self.require_built("save_weights")?;
        let tensors: Vec<(String, Tensor)> = self
            .network
            .named_weights()
            .into_iter()
            .map(|(n, v)| (n, v.peek()))
            .collect();
        saving::save_tensors(path, &tensors)
    }
    /// Loads weights written by [`Model::save_weights`]: all or nothing, the error naming
    /// the first weight that does not match.
    pub fn load_weights(&mut self, path: impl AsRef<Path>) -> Result<()> {
        self.require_built("load_weights")?;
        let path = path.as_ref();
        let saved = saving::load_tensors(path)?;
        saving::assign_weights(
            &path.display().to_string(),
            &self.network.named_weights(),
            saved,
        )
    }
    /// Saves the whole model into folder `dir` (Keras' `model.save`): `config.json` (the
    /// network's Keras config, its input shapes and, once compiled, the training config:
    /// optimizer, loss and metric names), the weights in `model-<generation>.safetensors`,
    /// and the optimizer's state in `optimizer-<generation>.safetensors`, so a loaded model
    /// resumes training where this one stopped.
    ///
    /// Crash-safe, as TF's checkpoints are: the new generation's weight files are written
    /// (each moved into place whole) before `config.json`, which names them, replaces the
    /// old one in one rename; only then are the previous generation's files removed. A
    /// process killed at any moment leaves a folder that loads as the previous save or the
    /// new one, never a mix.
    pub fn save(&self, dir: impl AsRef<Path>) -> Result<()> {
        self.require_built("save")?;
        let dir = dir.as_ref();
        let network_config = self.network.config();
        if let Some(why) = network_config["config"]["unserializable"].as_str() {
            return Err(Error::invalid("Model.save", why.to_string()));
        }
        std::fs::create_dir_all(dir).map_err(|e| Error::io(dir, &e))?;
        let training_config = match &self.compiled {
            Some(c) => json!({
                "optimizer": ferroflow_optim::get_config(c.optimizer.as_ref())?,
                "loss": c.loss.get_config(),
                "metrics": c.metrics.iter().chain(c.per_output.first().map(|o| &o.metrics).into_iter().flatten())
                    .map(|m| m.name().to_string()).collect::<Vec<_>>(),
            }),
            None => Value::Null,
        };
        let config_path = dir.join("config.json");
        let generation = std::fs::read_to_string(&config_path)
            .ok()
            .and_then(|t| serde_json::from_str::<Value>(&t).ok())
            .and_then(|v| v["generation"].as_u64())
            .unwrap_or(0)
            + 1;
        let weights_file = format!("model-{generation}.safetensors");
        self.save_weights(dir.join(&weights_file))?;
        let optimizer_file = match &self.compiled {
            Some(c) => {
                let name = format!("optimizer-{generation}.safetensors");
                saving::save_tensors(dir.join(&name), &c.optimizer.get_weights()?)?;
                Some(name)
            }
            None => None,
        };
        let config = json!({
            "format": "ferroflow-keras-model",
            "version": 2,
            "generation": generation,
            "weights_file": weights_file,
            "optimizer_file": optimizer_file,
            "config": network_config,
            "build_input_shapes": self.build_input_shapes,
            "training_config": training_config,
        });
        let text = serde_json::to_string_pretty(&config).expect("JSON values serialize");
        ferroflow_tensor::fs::write_atomic(&config_path, text.as_bytes())?;
        // The new generation is in place: earlier generations' files (and version 1's
        // fixed names) are garbage now.
        let keep = [Some(weights_file), optimizer_file];
        let entries = std::fs::read_dir(dir).map_err(|e| Error::io(dir, &e))?;
        for entry in entries.flatten() {
            let name = entry.file_name().to_string_lossy().into_owned();
            let ours = ["model", "optimizer"].iter().any(|stem| {
                name.strip_prefix(stem)
                    .and_then(|r| r.strip_suffix(".safetensors"))
                    .is_some_and(|g| {
                        g.is_empty()
                            || g.strip_prefix('-').is_some_and(|d| {
                                !d.is_empty() && d.bytes().all(|b| b.is_ascii_digit())
                            })
                    })
            });
            if ours && !keep.iter().flatten().any(|k| *k == name) {
                let _ = std::fs::remove_file(entry.path());
            }
        }
        Ok(())
    }
    /// The least [`Model::load`] allows one tensor to take while it builds the model from
    /// `config.json` (256 MiB; more when the weight files are larger).
    pub const LOAD_TENSOR_BYTES: u64 = 256 << 20;

    /// Loads a model saved by [`Model::save`] (Keras' `load_model`): compiled with the saved
    /// optimizer (its state restored), loss and metrics when it was saved compiled.
    pub fn load(dir: impl AsRef<Path>) -> Result<Model> {
        Model::load_with(dir, true)
    }

    /// [`Model::load`] with Keras' `compile` flag: `false` ignores the training config and
    /// returns an uncompiled model.
    ///
    /// The config's shapes are claims of a file: while the model is built, no tensor may
    /// be larger than the weight files hold together (or [`Model::LOAD_TENSOR_BYTES`],
    /// whichever is more), so a hostile `config.json` is an error, not an allocation bomb.
    pub fn load_with(dir: impl AsRef<Path>, compile: bool) -> Result<Model> {
        let dir = dir.as_ref();
        let path = dir.join("config.json");
        let text = std::fs::read_to_string(&path).map_err(|e| Error::io(&path, &e))?;
        let v: Value = serde_json::from_str(&text)
            .map_err(|e| Error::format(path.display().to_string(), e.to_string()))?;
        if v["format"] != "ferroflow-keras-model" {
            return Err(Error::format(
                path.display().to_string(),
                "not a ferroflow Keras model config",
            ));
        }
        let network = crate::layers::deserialize(&v["config"])?;
        let shapes: Vec<Vec<usize>> = serde_json::from_value(v["build_input_shapes"].clone())
            .map_err(|e| {
                Error::format(
                    path.display().to_string(),
                    format!("build_input_shapes: {e}"),
                )
            })?;
        // Version 1 folders used fixed names; version 2 names each generation's files.
        let file_named = |key: &str, v1_name: &str| -> Result<Option<std::path::PathBuf>> {
            match &v[key] {
                Value::Null if v["version"] == 1 => Ok(Some(dir.join(v1_name))),
                Value::Null => Ok(None),
                Value::String(name) if is_plain_file_name(name) => Ok(Some(dir.join(name))),
                other => Err(Error::format(
                    path.display().to_string(),
                    format!("{key} must be a file name inside the folder, got {other}"),
                )),
            }
        };
        let weights_path = file_named("weights_file", "model.safetensors")?
            .ok_or_else(|| Error::format(path.display().to_string(), "weights_file is missing"))?;
        let optimizer_path = file_named("optimizer_file", "optimizer.safetensors")?;
        let file_bytes = [Some(&weights_path), optimizer_path.as_ref()]
            .into_iter()
            .flatten()
            .filter_map(|p| std::fs::metadata(p).ok())
            .map(|m| m.len())
            .sum::<u64>();
        let mut model = Model::from_boxed(network);
        {
            let _limit = ferroflow_tensor::device::tensor_limit_scope(
                file_bytes.max(Model::LOAD_TENSOR_BYTES),
            );
            model.build_multi(&shapes)?;
        }
        model.load_weights(&weights_path)?;
        let training = &v["training_config"];
        if compile && !training.is_null() {
            let what = |e: Error| {
                Error::format(path.display().to_string(), format!("training_config: {e}"))
            };
            let optimizer = ferroflow_optim::from_config(&training["optimizer"]).map_err(what)?;
            let loss = crate::losses::deserialize(&training["loss"]).map_err(what)?;
            let metrics = training["metrics"]
                .as_array()
                .map(|names| {
                    names
                        .iter()
                        .map(|n| crate::metrics::get(n.as_str().unwrap_or_default()))
                        .collect::<Result<Vec<_>>>()
                })
                .transpose()
                .map_err(|e| {
                    what(Error::invalid(
                        "Model.load",
                        format!("{e}; load with compile = false and compile the model again"),
                    ))
                })?
                .unwrap_or_default();
            model.compile_with(optimizer, loss, metrics)?;
            let optimizer_path = optimizer_path.ok_or_else(|| {
                Error::format(
                    path.display().to_string(),
                    "the model was saved compiled but optimizer_file is missing",
                )
            })?;
            let state = saving::load_tensors(optimizer_path)?;
            model.compiled("load")?.optimizer.set_weights(state)?;
        }
        Ok(model)
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

/// A name that stays inside the folder it is joined to (no separators, not `.`/`..`).
fn is_plain_file_name(name: &str) -> bool {
    !name.is_empty()
        && name != "."
        && name != ".."
        && !name.contains(['/', '\\', '\0'])
        && Path::new(name).file_name() == Some(std::ffi::OsStr::new(name))
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

/// A seed from the global stateful generator (so `set_seed` makes shuffling reproducible).
fn random_seed() -> Result<u64> {
    let t = random::uniform(&[1], 0.0, i32::MAX as f64, DType::I64, None)?;
    Ok(t.to_vec::<i64>()?[0] as u64)
}
