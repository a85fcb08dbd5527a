//! The [`Layer`] trait and [`LayerBase`], the state every layer shares (name, weights,
//! trainable flag, dtype policy, built flag).
//!
//! A layer builds its weights lazily from the shape of its first input, as in Keras:
//!
//! ```
//! ferroflow::init();
//! use ferroflow_keras::layers::Dense;
//! use ferroflow_keras::Layer;
//! let mut dense = Dense::new(4);
//! assert!(dense.weights().is_empty());
//! let x = ferroflow_tensor::Tensor::ones(&[2, 3], ferroflow_tensor::DType::F32)?;
//! let y = dense.forward(&x, false)?;
//! assert_eq!(y.shape(), &[2, 4]);
//! assert_eq!(dense.count_params(), 3 * 4 + 4);
//! # Ok::<(), ferroflow_tensor::Error>(())
//! ```

use std::collections::HashMap;
use std::sync::{Arc, Mutex, MutexGuard};

use ferroflow_tensor::{DType, Error, Result, Tensor, Variable};
use serde_json::{json, Value};

use crate::initializers::Initializer;
use crate::mixed_precision::Policy;
use crate::regularizers::Regularizer;

/// One weight a layer created with [`LayerBase::add_weight`].
#[derive(Debug, Clone)]
pub struct Weight {
    /// The short name inside the layer (`"kernel"`, `"moving_mean"`).
    pub name: String,
    /// The variable (its own name is `"<layer>/<weight>"`).
    pub variable: Variable,
    /// Whether gradients update it (moving statistics are not trainable).
    pub trainable: bool,
    /// Its penalty, added to the training loss.
    pub regularizer: Option<Regularizer>,
}

/// The state every layer has. Layers embed one and hand it out through [`Layer::base`].
#[derive(Debug, Clone)]
pub struct LayerBase {
    name: String,
    /// Whether the layer's weights are trained (Keras `layer.trainable`); `false` freezes
    /// every weight of the layer and of its sublayers.
    pub trainable: bool,
    built: bool,
    /// The dtype policy: the weights' and the computations' dtypes (the global policy when
    /// the layer was made, see [`crate::mixed_precision`]).
    pub dtype_policy: Policy,
    /// Cast floating inputs to the compute dtype before `call` (Keras' `autocast`, on by
    /// default).
    pub autocast: bool,
    weights: Vec<Weight>,
    output_shapes: Vec<Vec<usize>>,
}

static NAME_COUNTS: Mutex<Option<HashMap<String, usize>>> = Mutex::new(None);

/// A process-unique layer name from a prefix: `dense`, then `dense_1`, `dense_2`, ... (Keras).
pub fn unique_name(prefix: &str) -> String {
    let mut g = NAME_COUNTS.lock().unwrap_or_else(|e| e.into_inner());
    let n = g
        .get_or_insert_with(HashMap::new)
        .entry(prefix.to_string())
        .or_insert(0);
    let name = if *n == 0 {
        prefix.to_string()
    } else {
        format!("{prefix}_{n}")
    };
    *n += 1;
    name
}

impl LayerBase {
    /// A base named `name`, or a fresh unique name from `prefix` (Keras' snake-case class
    /// name, `"dense"`) when `name` is `None`.
    pub fn new(prefix: &str, name: Option<String>) -> LayerBase {
        LayerBase {
            name: name.unwrap_or_else(|| unique_name(prefix)),
            trainable: true,
            built: false,
            dtype_policy: crate::mixed_precision::global_policy(),
            autocast: true,
            weights: vec![],
            output_shapes: vec![],
        }
    }
    /// The layer's name.
    pub fn name(&self) -> &str {
        &self.name
    }
    /// Renames the layer (only before it is built: the weights carry the name).
    pub fn set_name(&mut self, name: impl Into<String>) {
        self.name = name.into();
    }
    /// Whether `build` ran.
    pub fn built(&self) -> bool {
        self.built
    }
    /// Marks the layer built (containers whose parts were built elsewhere).
    pub(crate) fn mark_built(&mut self) {
        self.built = true;
    }
    /// The dtype of the layer's weights (Keras' `layer.dtype`, the policy's variable dtype).
    pub fn dtype(&self) -> Result<DType> {
        Ok(self.dtype_policy.variable_dtype())
    }
    /// The dtype the layer computes in (Keras' `layer.compute_dtype`).
    pub fn compute_dtype(&self) -> DType {
        self.dtype_policy.compute_dtype()
    }
    /// Creates a weight named `"<layer>/<name>"` from `initializer` (Keras `add_weight`).
    pub fn add_weight(
        &mut self,
        name: &str,
        shape: &[usize],
        initializer: &Initializer,
        trainable: bool,
        regularizer: Option<Regularizer>,
    ) -> Result<Variable> {
        let value = initializer.sample(shape, self.dtype()?)?;
        let variable = Variable::with_options(
            format!("{}/{name}", self.name),
            value,
            trainable,
            ferroflow_tensor::VariableSynchronization::Auto,
            ferroflow_tensor::VariableAggregation::None,
        );
        self.weights.push(Weight {
            name: name.into(),
            variable: variable.clone(),
            trainable,
            regularizer,
        });
        Ok(variable)
    }
    /// The weights in creation order.
    pub fn own_weights(&self) -> &[Weight] {
        &self.weights
    }
    /// Output shapes of the last call (for `summary`).
    pub fn output_shapes(&self) -> &[Vec<usize>] {
        &self.output_shapes
    }
}

/// A Keras layer. Implement `base`, `base_mut`, `class_name`, `call` (and `build` when the
/// layer has weights); everything else is provided. A custom model is a `Layer` too (Keras'
/// subclassing): give it sublayers through [`Layer::sublayers`] and wrap it in
/// [`crate::Model::from_layer`] to `fit` it.
pub trait Layer: Send {
    /// Shared state.
    fn base(&self) -> &LayerBase;
    /// Shared state, mutably.
    fn base_mut(&mut self) -> &mut LayerBase;
    /// Keras class name (`"Dense"`), used in configs and summaries.
    fn class_name(&self) -> &'static str;
    /// Creates the weights for inputs of these shapes (batch dimension included). Called
    /// once, by [`Layer::apply`], before the first `call`.
    fn build(&mut self, _input_shapes: &[Vec<usize>]) -> Result<()> {
        Ok(())
    }
    /// The forward computation. `training` selects training behaviour (dropout on, batch
    /// statistics in batch normalization).
    fn call(&mut self, inputs: &[Tensor], training: bool) -> Result<Vec<Tensor>>;
    /// The layer-specific part of the Keras config (name, trainable and dtype are added by
    /// [`Layer::config`]).
    fn get_config(&self) -> Value {
        json!({})
    }
    /// Names of the outputs when the layer knows them (a functional graph names each output
    /// after the layer that makes it; Keras' per-output loss and metric names use them).
    fn output_names(&self) -> Option<Vec<String>> {
        None
    }
    /// Whether `call` can run inside a traced graph (a model's default steps run as graphs).
    /// Layers that compute on the host (reading tensor values: the random image layers,
    /// lookups) answer false, and a model holding one runs its steps eagerly.
    fn traceable(&self) -> bool {
        true
    }
    /// Layers this one contains (their weights are this layer's weights too).
    fn sublayers(&self) -> Vec<&dyn Layer> {
        vec![]
    }
    /// Calls `f` on each contained layer once, in order. Defaults to [`Layer::sublayers`];
    /// containers whose layers sit behind locks (functional graphs) override this instead.
    fn visit_sublayers(&self, f: &mut dyn FnMut(&dyn Layer)) {
        for l in self.sublayers() {
            f(l);
        }
    }

    /// The layer's name.
    fn name(&self) -> &str {
        self.base().name()
    }
    /// Builds on first use, then calls. This is what models and users call.
    fn apply(&mut self, inputs: &[Tensor], training: bool) -> Result<Vec<Tensor>> {
        // The profiler names this layer's ops `<layer>/<Op>` (inert when not profiling).
        let _name_scope = ferroflow_tensor::trace::NameScope::enter(self.name());
        if !self.base().built {
            let shapes: Vec<Vec<usize>> = inputs.iter().map(|t| t.shape().to_vec()).collect();
            // Variables are made once, eagerly, even inside a traced step (TF's init_scope).
            let _init = ferroflow_tensor::dispatch::init_scope();
            self.build(&shapes)?;
            self.base_mut().built = true;
        }
        let (compute, mixed) = {
            let p = &self.base().dtype_policy;
            (p.compute_dtype(), p.is_mixed())
        };
        let cast_inputs = self.base().autocast && compute.is_float();
        let casted: Vec<Tensor>;
        let inputs = if cast_inputs
            && inputs
                .iter()
                .any(|t| t.dtype().is_float() && t.dtype() != compute)
        {
            casted = inputs
                .iter()
                .map(|t| {
                    if t.dtype().is_float() && t.dtype() != compute {
                        t.cast(compute)
                    } else {
                        Ok(t.clone())
                    }
                })
                .collect::<Result<_>>()?;
            &casted[..]
        } else {
            inputs
        };
        let autocast = mixed.then_some(compute);
        let out = crate::mixed_precision::with_autocast(autocast, || self.call(inputs, training))?;
        self.base_mut().output_shapes = out.iter().map(|t| t.shape().to_vec()).collect();
        Ok(out)
    }
    /// Sets the layer's dtype policy (Keras' `dtype=` argument), before it is built.
    fn dtype(mut self, policy: Policy) -> Self
    where
        Self: Sized,
    {
        self.base_mut().dtype_policy = policy;
        self
    }
    /// [`Layer::apply`] for one input and one output.
    fn forward(&mut self, x: &Tensor, training: bool) -> Result<Tensor> {
        let mut out = self.apply(std::slice::from_ref(x), training)?;
        if out.len() != 1 {
            return Err(Error::invalid(
                "Layer.forward",
                format!(
                    "layer {:?} returned {} outputs; use `apply` for several",
                    self.name(),
                    out.len()
                ),
            ));
        }
        Ok(out.remove(0))
    }
    /// Trainable weights: own then sublayers', none when the layer is frozen.
    fn trainable_weights(&self) -> Vec<Variable> {
        if !self.base().trainable {
            return vec![];
        }
        let mut v: Vec<Variable> = self
            .base()
            .own_weights()
            .iter()
            .filter(|w| w.trainable)
            .map(|w| w.variable.clone())
            .collect();
        self.visit_sublayers(&mut |l| v.extend(l.trainable_weights()));
        v
    }
    /// Non-trainable weights (moving statistics; every weight of a frozen layer).
    fn non_trainable_weights(&self) -> Vec<Variable> {
        let frozen = !self.base().trainable;
        let mut v: Vec<Variable> = self
            .base()
            .own_weights()
            .iter()
            .filter(|w| frozen || !w.trainable)
            .map(|w| w.variable.clone())
            .collect();
        self.visit_sublayers(&mut |l| {
            if frozen {
                v.extend(l.weights());
            } else {
                v.extend(l.non_trainable_weights());
            }
        });
        v
    }
    /// Every weight: trainable first, then non-trainable (Keras' `weights`).
    fn weights(&self) -> Vec<Variable> {
        let mut v = self.trainable_weights();
        v.extend(self.non_trainable_weights());
        v
    }
    /// Every weight in creation order with its path, `"<layer>/<weight>"`, nested layers
    /// prefixed by their parents' names: the names `save_weights` writes.
    fn named_weights(&self) -> Vec<(String, Variable)> {
        let mut v: Vec<(String, Variable)> = self
            .base()
            .own_weights()
            .iter()
            .map(|w| (format!("{}/{}", self.name(), w.name), w.variable.clone()))
            .collect();
        let me = self.name().to_string();
        self.visit_sublayers(&mut |l| {
            for (n, var) in l.named_weights() {
                v.push((format!("{me}/{n}"), var));
            }
        });
        v
    }
    /// The regularization penalties of every weight (Keras' `losses`).
    fn regularization_losses(&self) -> Result<Vec<Tensor>> {
        let mut v = vec![];
        for w in self.base().own_weights() {
            if let Some(r) = &w.regularizer {
                v.push(r.penalty(&w.variable.value())?);
            }
        }
        let mut failure = None;
        self.visit_sublayers(&mut |l| match l.regularization_losses() {
            Ok(r) => v.extend(r),
            Err(e) => failure = failure.take().or(Some(e)),
        });
        match failure {
            Some(e) => Err(e),
            None => Ok(v),
        }
    }
    /// Number of scalars in all weights.
    fn count_params(&self) -> usize {
        self.weights()
            .iter()
            .map(|v| v.shape().iter().product::<usize>())
            .sum()
    }
    /// The full Keras config: `{"class_name", "config": {"name", "trainable", "dtype", ..}}`.
    fn config(&self) -> Value {
        let mut c = self.get_config();
        if let Value::Object(m) = &mut c {
            m.insert("name".into(), json!(self.name()));
            m.insert("trainable".into(), json!(self.base().trainable));
            m.insert("dtype".into(), json!(self.base().dtype_policy.name()));
        }
        json!({"class_name": self.class_name(), "config": c})
    }
}

/// A layer shared between several places of a functional graph (Keras' shared layers): one
/// set of weights, called from many nodes.
#[derive(Clone)]
pub struct LayerRef(Arc<Mutex<Box<dyn Layer>>>);

impl LayerRef {
    /// Shares `layer`.
    pub fn new(layer: impl Layer + 'static) -> LayerRef {
        LayerRef(Arc::new(Mutex::new(Box::new(layer))))
    }
    /// Shares an already boxed layer.
    pub fn from_boxed(layer: Box<dyn Layer>) -> LayerRef {
        LayerRef(Arc::new(Mutex::new(layer)))
    }
    /// Locks the layer for use.
    pub fn lock(&self) -> MutexGuard<'_, Box<dyn Layer>> {
        self.0.lock().unwrap_or_else(|e| e.into_inner())
    }
    /// Whether both handles share one layer.
    pub fn ptr_eq(&self, other: &LayerRef) -> bool {
        Arc::ptr_eq(&self.0, &other.0)
    }
}

impl std::fmt::Debug for LayerRef {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let l = self.lock();
        write!(f, "LayerRef({} {:?})", l.class_name(), l.name())
    }
}

/// Reads `key` of a config as the given JSON kind, or a format error naming the layer class.
pub(crate) fn cfg<'a>(c: &'a Value, class: &str, key: &str) -> Result<&'a Value> {
    c.get(key)
        .ok_or_else(|| Error::format(format!("{class} config"), format!("missing key {key:?}")))
}

/// `cfg(..).as_u64()` as usize.
pub(crate) fn cfg_usize(c: &Value, class: &str, key: &str) -> Result<usize> {
    cfg(c, class, key)?
        .as_u64()
        .map(|v| v as usize)
        .ok_or_else(|| {
            Error::format(
                format!("{class} config"),
                format!("{key:?} must be a non-negative integer"),
            )
        })
}

/// A 1-D size (`kernel_size`, `strides`, `pool_size` of a 1-D layer): an integer, or the
/// one-element list Keras writes for it.
pub(crate) fn cfg_single(c: &Value, class: &str, key: &str) -> Result<usize> {
    let v = cfg(c, class, key)?;
    v.as_u64()
        .or_else(|| {
            v.as_array()
                .filter(|a| a.len() == 1)
                .and_then(|a| a[0].as_u64())
        })
        .map(|x| x as usize)
        .ok_or_else(|| {
            Error::format(
                format!("{class} config"),
                format!("{key:?} must be an integer or a list of one, got {v}"),
            )
        })
}

/// `cfg(..).as_f64()`.
pub(crate) fn cfg_f64(c: &Value, class: &str, key: &str) -> Result<f64> {
    cfg(c, class, key)?.as_f64().ok_or_else(|| {
        Error::format(
            format!("{class} config"),
            format!("{key:?} must be a number"),
        )
    })
}

/// A pair like `kernel_size` from `[a, b]`.
pub(crate) fn cfg_pair(c: &Value, class: &str, key: &str) -> Result<[usize; 2]> {
    let v = cfg(c, class, key)?;
    let pair = v.as_array().and_then(|a| {
        a.iter()
            .map(|x| x.as_u64().map(|u| u as usize))
            .collect::<Option<Vec<_>>>()
    });
    match pair.as_deref() {
        Some(&[a, b]) => Ok([a, b]),
        _ => Err(Error::format(
            format!("{class} config"),
            format!("{key:?} must be a pair of integers, got {v}"),
        )),
    }
}
