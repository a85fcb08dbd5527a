//! Dense, Activation, Dropout, Flatten, Reshape.

use ferroflow_tensor::{random, Error, Result, Tensor, Variable};
use serde_json::{json, Value};

use crate::activations::Activation as Act;
use crate::initializers::Initializer;
use crate::layer::{cfg, cfg_f64, cfg_usize, Layer, LayerBase};
use crate::layers::{add_kernel_and_bias, bias_and_activation, built_weight, expect_inputs};
use crate::regularizers::Regularizer;

/// Implements the three required accessors of [`Layer`] for a struct with a `base` field.
macro_rules! layer_base {
    ($class:literal) => {
        fn base(&self) -> &$crate::layer::LayerBase {
            &self.base
        }
        fn base_mut(&mut self) -> &mut $crate::layer::LayerBase {
            &mut self.base
        }
        fn class_name(&self) -> &'static str {
            $class
        }
    };
}
pub(crate) use layer_base;

fn opt_regularizer(v: &Value) -> Result<Option<Regularizer>> {
    if v.is_null() {
        Ok(None)
    } else {
        Regularizer::from_config(v).map(Some)
    }
}

fn regularizer_config(r: &Option<Regularizer>) -> Value {
    r.map_or(Value::Null, |r| r.to_config())
}

fn activation_from(c: &Value, class: &str) -> Result<Act> {
    match c.get("activation") {
        None | Some(Value::Null) => Ok(Act::Linear),
        Some(v) => Act::parse(v.as_str().ok_or_else(|| {
            Error::format(format!("{class} config"), "activation must be a name")
        })?),
    }
}

/// `tf.keras.layers.Dense`: `activation(x · kernel + bias)` over the last axis.
///
/// ```
/// ferroflow::init();
/// use ferroflow_keras::{activations::Activation, layers::Dense, Layer};
/// let mut d = Dense::new(3).activation(Activation::Relu);
/// let y = d.forward(&ferroflow_tensor::Tensor::ones(&[5, 2, 4], ferroflow_tensor::DType::F32)?, false)?;
/// assert_eq!(y.shape(), &[5, 2, 3]);
/// # Ok::<(), ferroflow_tensor::Error>(())
/// ```
pub struct Dense {
    base: LayerBase,
    /// Output units.
    pub units: usize,
    /// Activation applied to the output.
    pub activation: Act,
    /// Whether to add a bias.
    pub use_bias: bool,
    /// Kernel initializer (default Glorot uniform).
    pub kernel_initializer: Initializer,
    /// Bias initializer (default zeros).
    pub bias_initializer: Initializer,
    /// Kernel penalty.
    pub kernel_regularizer: Option<Regularizer>,
    /// Bias penalty.
    pub bias_regularizer: Option<Regularizer>,
    kernel: Option<Variable>,
    bias: Option<Variable>,
}

impl Dense {
    /// A dense layer with `units` outputs, no activation, a bias, Glorot-uniform kernel.
    pub fn new(units: usize) -> Dense {
        Dense {
            base: LayerBase::new("dense", None),
            units,
            activation: Act::Linear,
            use_bias: true,
            kernel_initializer: Initializer::GlorotUniform { seed: None },
            bias_initializer: Initializer::Zeros,
            kernel_regularizer: None,
            bias_regularizer: None,
            kernel: None,
            bias: None,
        }
    }
    /// Sets the activation.
    pub fn activation(mut self, a: Act) -> Dense {
        self.activation = a;
        self
    }
    /// Sets the layer name.
    pub fn name(mut self, name: &str) -> Dense {
        self.base.set_name(name);
        self
    }
    /// Sets whether a bias is added.
    pub fn use_bias(mut self, b: bool) -> Dense {
        self.use_bias = b;
        self
    }
    /// Sets the kernel initializer.
    pub fn kernel_initializer(mut self, i: Initializer) -> Dense {
        self.kernel_initializer = i;
        self
    }
    /// Sets the kernel regularizer.
    pub fn kernel_regularizer(mut self, r: Regularizer) -> Dense {
        self.kernel_regularizer = Some(r);
        self
    }
    /// Rebuilds from [`Layer::get_config`].
    pub fn from_config(c: &Value) -> Result<Dense> {
        let mut d = Dense::new(cfg_usize(c, "Dense", "units")?);
        d.activation = activation_from(c, "Dense")?;
        d.use_bias = cfg(c, "Dense", "use_bias")?.as_bool().unwrap_or(true);
        d.kernel_initializer = Initializer::from_config(cfg(c, "Dense", "kernel_initializer")?)?;
        d.bias_initializer = Initializer::from_config(cfg(c, "Dense", "bias_initializer")?)?;
        d.kernel_regularizer = opt_regularizer(&c["kernel_regularizer"])?;
        d.bias_regularizer = opt_regularizer(&c["bias_regularizer"])?;
        Ok(d)
    }
}

impl Layer for Dense {
    layer_base!("Dense");
    fn build(&mut self, input_shapes: &[Vec<usize>]) -> Result<()> {
        let last = input_shapes
            .first()
            .and_then(|s| s.last().copied())
            .ok_or_else(|| {
                Error::invalid(
                    "Dense",
                    "needs an input of rank ≥ 1 with a known last dimension",
                )
            })?;
        let bias_init = self.bias_initializer.clone();
        (self.kernel, self.bias) = add_kernel_and_bias(
            &mut self.base,
            "kernel",
            &[last, self.units],
            &self.kernel_initializer.clone(),
            self.kernel_regularizer,
            self.use_bias
                .then_some((self.units, &bias_init, self.bias_regularizer)),
        )?;
        Ok(())
    }
    fn call(&mut self, inputs: &[Tensor], _training: bool) -> Result<Vec<Tensor>> {
        expect_inputs(self, inputs, 1)?;
        let x = &inputs[0];
        let kernel = built_weight(&self.kernel, "Dense")?;
        let in_dim = kernel.shape()[0];
        if x.shape().last() != Some(&in_dim) {
            return Err(Error::ShapeMismatch {
                op: "Dense",
                msg: "input's last dimension differs from the kernel's input size",
                lhs: x.shape().to_vec(),
                rhs: kernel.shape().to_vec(),
            });
        }
        let y = if x.rank() == 2 {
            x.matmul(&kernel)?
        } else {
            let mut out_shape = x.shape().to_vec();
            *out_shape.last_mut().expect("rank checked ≥ 1 above") = self.units;
            x.reshape(&[-1, in_dim as isize])?
                .matmul(&kernel)?
                .reshape_to(&out_shape)?
        };
        Ok(vec![bias_and_activation(y, &self.bias, self.activation)?])
    }
    fn get_config(&self) -> Value {
        json!({
            "units": self.units,
            "activation": self.activation.name(),
            "use_bias": self.use_bias,
            "kernel_initializer": self.kernel_initializer.to_config(),
            "bias_initializer": self.bias_initializer.to_config(),
            "kernel_regularizer": regularizer_config(&self.kernel_regularizer),
            "bias_regularizer": regularizer_config(&self.bias_regularizer),
        })
    }
}

/// `tf.keras.layers.Activation`: applies an activation function.
pub struct Activation {
    base: LayerBase,
    /// The function.
    pub activation: Act,
}

impl Activation {
    /// The layer for `activation`.
    pub fn new(activation: Act) -> Activation {
        Activation {
            base: LayerBase::new("activation", None),
            activation,
        }
    }
    /// Rebuilds from [`Layer::get_config`].
    pub fn from_config(c: &Value) -> Result<Activation> {
        Ok(Activation::new(activation_from(c, "Activation")?))
    }
}

impl Layer for Activation {
    layer_base!("Activation");
    fn call(&mut self, inputs: &[Tensor], _training: bool) -> Result<Vec<Tensor>> {
        expect_inputs(self, inputs, 1)?;
        Ok(vec![self.activation.apply(&inputs[0])?])
    }
    fn get_config(&self) -> Value {
        json!({ "activation": self.activation.name() })
    }
}

/// `tf.keras.layers.Dropout`: in training, zeroes each element with probability `rate` and
/// scales the rest by `1 / (1 - rate)`; at inference, the identity.
pub struct Dropout {
    base: LayerBase,
    /// Drop probability in `[0, 1)`.
    pub rate: f64,
    /// Seed for the masks (`None`: the global generator).
    pub seed: Option<u64>,
}

impl Dropout {
    /// Dropout with drop probability `rate`.
    pub fn new(rate: f64) -> Dropout {
        Dropout {
            base: LayerBase::new("dropout", None),
            rate,
            seed: None,
        }
    }
    /// Rebuilds from [`Layer::get_config`].
    pub fn from_config(c: &Value) -> Result<Dropout> {
        let mut d = Dropout::new(cfg_f64(c, "Dropout", "rate")?);
        d.seed = c["seed"].as_u64();
        Ok(d)
    }
}

/// Inverted dropout (`tf.nn.dropout` as Keras uses it): in training, each element is zeroed
/// with probability `rate` and the rest scaled by `1 / (1 - rate)`; otherwise the identity.
pub(crate) fn dropout(x: &Tensor, rate: f64, seed: Option<u64>, training: bool) -> Result<Tensor> {
    if !training || rate == 0.0 {
        return Ok(x.clone());
    }
    let u = random::uniform(x.shape(), 0.0, 1.0, x.dtype(), seed)?;
    let keep = u.greater_equal(&u.scalar_like(rate)?)?.cast(x.dtype())?;
    x.mul(&keep.mul(&x.scalar_like(1.0 / (1.0 - rate))?)?)
}

impl Layer for Dropout {
    layer_base!("Dropout");
    fn call(&mut self, inputs: &[Tensor], training: bool) -> Result<Vec<Tensor>> {
        expect_inputs(self, inputs, 1)?;
        let x = &inputs[0];
        if !(0.0..1.0).contains(&self.rate) {
            return Err(Error::invalid(
                "Dropout",
                format!("rate must be in [0, 1), got {}", self.rate),
            ));
        }
        Ok(vec![dropout(x, self.rate, self.seed, training)?])
    }
    fn get_config(&self) -> Value {
        json!({ "rate": self.rate, "seed": self.seed })
    }
}

/// `tf.keras.layers.Flatten`: `[batch, ...] -> [batch, product]`.
pub struct Flatten {
    base: LayerBase,
}

impl Flatten {
    /// The layer.
    pub fn new() -> Flatten {
        Flatten {
            base: LayerBase::new("flatten", None),
        }
    }
    /// Rebuilds from [`Layer::get_config`].
    pub fn from_config(_c: &Value) -> Result<Flatten> {
        Ok(Flatten::new())
    }
}

impl Default for Flatten {
    fn default() -> Self {
        Flatten::new()
    }
}

impl Layer for Flatten {
    layer_base!("Flatten");
    fn call(&mut self, inputs: &[Tensor], _training: bool) -> Result<Vec<Tensor>> {
        expect_inputs(self, inputs, 1)?;
        let x = &inputs[0];
        let batch = *x.shape().first().ok_or_else(|| {
            Error::invalid(
                "Flatten",
                "needs an input with a batch dimension (rank ≥ 1)",
            )
        })?;
        let rest: usize = x.shape()[1..].iter().product();
        Ok(vec![x.reshape_to(&[batch, rest])?])
    }
}

/// `tf.keras.layers.Rescaling` (TF 2.3's `experimental.preprocessing.Rescaling`):
/// `x · scale + offset` in the layer's compute dtype, so integer images (`u8` pixels) can
/// stay small in memory and become floats batch by batch, inside the model.
///
/// ```
/// ferroflow::init();
/// use ferroflow_keras::layers::Rescaling;
/// use ferroflow_keras::layer::Layer;
/// use ferroflow_tensor::Tensor;
/// let mut r = Rescaling::new(1.0 / 255.0, 0.0);
/// let x = Tensor::from_vec(vec![0u8, 51, 255], &[1, 3])?;
/// let y = r.apply(&[x], false)?.remove(0).to_vec::<f32>()?;
/// for (got, want) in y.iter().zip([0.0, 0.2, 1.0]) {
///     assert!((got - want).abs() < 1e-6);
/// }
/// # Ok::<(), ferroflow_tensor::Error>(())
/// ```
pub struct Rescaling {
    base: LayerBase,
    /// The factor.
    pub scale: f64,
    /// Added after scaling.
    pub offset: f64,
}

impl Rescaling {
    /// `x · scale + offset`.
    pub fn new(scale: f64, offset: f64) -> Rescaling {
        Rescaling {
            base: LayerBase::new("rescaling", None),
            scale,
            offset,
        }
    }
    /// Rebuilds from [`Layer::get_config`].
    pub fn from_config(c: &Value) -> Result<Rescaling> {
        Ok(Rescaling::new(
            cfg_f64(c, "Rescaling", "scale")?,
            cfg_f64(c, "Rescaling", "offset")?,
        ))
    }
}

impl Layer for Rescaling {
    layer_base!("Rescaling");
    fn call(&mut self, inputs: &[Tensor], _training: bool) -> Result<Vec<Tensor>> {
        expect_inputs(self, inputs, 1)?;
        let dtype = self.base.compute_dtype();
        let x = inputs[0].cast(dtype)?;
        let mut y = x.mul(&Tensor::scalar_of(self.scale, dtype)?)?;
        if self.offset != 0.0 {
            y = y.add(&Tensor::scalar_of(self.offset, dtype)?)?;
        }
        Ok(vec![y])
    }
    fn get_config(&self) -> Value {
        json!({ "scale": self.scale, "offset": self.offset })
    }
}

/// `tf.keras.layers.Reshape`: `[batch, ...] -> [batch, target_shape...]` (one `-1` allowed).
pub struct Reshape {
    base: LayerBase,
    /// Target shape without the batch dimension.
    pub target_shape: Vec<isize>,
}

impl Reshape {
    /// Reshapes each sample to `target_shape`.
    pub fn new(target_shape: &[isize]) -> Reshape {
        Reshape {
            base: LayerBase::new("reshape", None),
            target_shape: target_shape.to_vec(),
        }
    }
    /// Rebuilds from [`Layer::get_config`].
    pub fn from_config(c: &Value) -> Result<Reshape> {
        let shape: Option<Vec<isize>> = cfg(c, "Reshape", "target_shape")?
            .as_array()
            .and_then(|a| a.iter().map(|v| v.as_i64().map(|x| x as isize)).collect());
        shape
            .map(|s| Reshape::new(&s))
            .ok_or_else(|| Error::format("Reshape config", "target_shape must be integers"))
    }
}

impl Layer for Reshape {
    layer_base!("Reshape");
    fn call(&mut self, inputs: &[Tensor], _training: bool) -> Result<Vec<Tensor>> {
        expect_inputs(self, inputs, 1)?;
        let x = &inputs[0];
        let batch = *x
            .shape()
            .first()
            .ok_or_else(|| Error::invalid("Reshape", "needs an input with a batch dimension"))?;
        let mut shape = vec![batch as isize];
        shape.extend_from_slice(&self.target_shape);
        Ok(vec![x.reshape(&shape)?])
    }
    fn get_config(&self) -> Value {
        json!({ "target_shape": self.target_shape })
    }
}
