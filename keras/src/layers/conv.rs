//! Conv2D and the 2-D pooling layers (channels-last, NHWC, as Keras' default).

use ferroflow_tensor::{Axes, Error, FusedActivation, Padding, Result, Tensor, Variable};
use serde_json::{json, Value};

use crate::activations::Activation as Act;
use crate::initializers::Initializer;
use crate::layer::{cfg, cfg_pair, cfg_single, cfg_usize, Layer, LayerBase};
use crate::layers::core::layer_base;
use crate::layers::{add_kernel_and_bias, bias_and_activation, built_weight, expect_inputs};
use crate::regularizers::Regularizer;

pub(crate) fn padding_name(p: Padding) -> &'static str {
    match p {
        Padding::Same => "same",
        Padding::Valid => "valid",
    }
}

pub(crate) fn padding_from(c: &Value, class: &str) -> Result<Padding> {
    match c.get("padding").and_then(Value::as_str) {
        None | Some("valid") => Ok(Padding::Valid),
        Some("same") => Ok(Padding::Same),
        Some(p) => Err(Error::format(
            format!("{class} config"),
            format!("padding must be \"valid\" or \"same\", got {p:?}"),
        )),
    }
}

pub(crate) fn check_channels_last(c: &Value, class: &str) -> Result<()> {
    match c.get("data_format").and_then(Value::as_str) {
        None | Some("channels_last") => Ok(()),
        Some(f) => Err(Error::format(
            format!("{class} config"),
            format!(
                "data_format {f:?} is not supported; ferroflow layers are channels_last (NHWC)"
            ),
        )),
    }
}

/// `tf.keras.layers.Conv2D`: NHWC input, kernel `[kh, kw, in, filters]`.
///
/// ```
/// ferroflow::init();
/// use ferroflow_keras::{layers::Conv2D, Layer};
/// use ferroflow_tensor::{DType, Padding, Tensor};
/// let mut conv = Conv2D::new(8, [3, 3]).padding(Padding::Same);
/// let y = conv.forward(&Tensor::ones(&[2, 5, 5, 3], DType::F32)?, false)?;
/// assert_eq!(y.shape(), &[2, 5, 5, 8]);
/// # Ok::<(), ferroflow_tensor::Error>(())
/// ```
pub struct Conv2D {
    base: LayerBase,
    /// Output channels.
    pub filters: usize,
    /// Kernel height and width.
    pub kernel_size: [usize; 2],
    /// Strides.
    pub strides: [usize; 2],
    /// Padding.
    pub padding: Padding,
    /// Dilation rate.
    pub dilation_rate: [usize; 2],
    /// Activation.
    pub activation: Act,
    /// Whether to add a bias.
    pub use_bias: bool,
    /// Kernel initializer (default Glorot uniform).
    pub kernel_initializer: Initializer,
    /// Bias initializer (default zeros).
    pub bias_initializer: Initializer,
    /// Kernel penalty.
    pub kernel_regularizer: Option<Regularizer>,
    kernel: Option<Variable>,
    bias: Option<Variable>,
}

impl Conv2D {
    /// `filters` output channels, a `kernel_size` window, stride 1, valid padding.
    pub fn new(filters: usize, kernel_size: [usize; 2]) -> Conv2D {
        Conv2D {
            base: LayerBase::new("conv2d", None),
            filters,
            kernel_size,
            strides: [1, 1],
            padding: Padding::Valid,
            dilation_rate: [1, 1],
            activation: Act::Linear,
            use_bias: true,
            kernel_initializer: Initializer::GlorotUniform { seed: None },
            bias_initializer: Initializer::Zeros,
            kernel_regularizer: None,
            kernel: None,
            bias: None,
        }
    }
    /// Sets the activation.
    pub fn activation(mut self, a: Act) -> Conv2D {
        self.activation = a;
        self
    }
    /// Sets the padding.
    pub fn padding(mut self, p: Padding) -> Conv2D {
        self.padding = p;
        self
    }
    /// Sets the strides.
    pub fn strides(mut self, s: [usize; 2]) -> Conv2D {
        self.strides = s;
        self
    }
    /// Sets the kernel initializer.
    pub fn kernel_initializer(mut self, i: Initializer) -> Conv2D {
        self.kernel_initializer = i;
        self
    }
    /// Rebuilds from [`Layer::get_config`].
    pub fn from_config(c: &Value) -> Result<Conv2D> {
        check_channels_last(c, "Conv2D")?;
        let mut l = Conv2D::new(
            cfg_usize(c, "Conv2D", "filters")?,
            cfg_pair(c, "Conv2D", "kernel_size")?,
        );
        l.strides = cfg_pair(c, "Conv2D", "strides")?;
        l.dilation_rate = cfg_pair(c, "Conv2D", "dilation_rate")?;
        l.padding = padding_from(c, "Conv2D")?;
        l.activation = match c["activation"].as_str() {
            Some(a) => Act::parse(a)?,
            None => Act::Linear,
        };
        l.use_bias = c["use_bias"].as_bool().unwrap_or(true);
        l.kernel_initializer = Initializer::from_config(cfg(c, "Conv2D", "kernel_initializer")?)?;
        l.bias_initializer = Initializer::from_config(cfg(c, "Conv2D", "bias_initializer")?)?;
        if !c["kernel_regularizer"].is_null() {
            l.kernel_regularizer = Some(Regularizer::from_config(&c["kernel_regularizer"])?);
        }
        Ok(l)
    }
}

impl Layer for Conv2D {
    layer_base!("Conv2D");
    fn build(&mut self, input_shapes: &[Vec<usize>]) -> Result<()> {
        let channels = crate::layers::more_conv::nhwc_channels(input_shapes, "Conv2D")?;
        let [kh, kw] = self.kernel_size;
        let bias_init = self.bias_initializer.clone();
        (self.kernel, self.bias) = add_kernel_and_bias(
            &mut self.base,
            "kernel",
            &[kh, kw, channels, self.filters],
            &self.kernel_initializer.clone(),
            self.kernel_regularizer,
            self.use_bias.then_some((self.filters, &bias_init, None)),
        )?;
        Ok(())
    }
    fn call(&mut self, inputs: &[Tensor], _training: bool) -> Result<Vec<Tensor>> {
        expect_inputs(self, inputs, 1)?;
        let kernel = built_weight(&self.kernel, "Conv2D")?;
        // Bias and a linear or ReLU activation fuse into the convolution (as TF's graph
        // optimizer makes `_FusedConv2D` of Conv2D + BiasAdd + Relu).
        let fused = match self.activation {
            Act::Linear => Some(FusedActivation::Linear),
            Act::Relu => Some(FusedActivation::Relu),
            _ => None,
        };
        if let (Some(bias), Some(activation)) = (&self.bias, fused) {
            let bias = crate::mixed_precision::read_variable(bias)?;
            let y = inputs[0].fused_conv2d(
                &kernel,
                &bias,
                activation,
                self.strides,
                self.padding,
                self.dilation_rate,
            )?;
            return Ok(vec![y]);
        }
        let y = inputs[0].conv2d(&kernel, self.strides, self.padding, self.dilation_rate)?;
        Ok(vec![bias_and_activation(y, &self.bias, self.activation)?])
    }
    fn get_config(&self) -> Value {
        json!({
            "filters": self.filters,
            "kernel_size": self.kernel_size,
            "strides": self.strides,
            "padding": padding_name(self.padding),
            "data_format": "channels_last",
            "dilation_rate": self.dilation_rate,
            "activation": self.activation.name(),
            "use_bias": self.use_bias,
            "kernel_initializer": self.kernel_initializer.to_config(),
            "bias_initializer": self.bias_initializer.to_config(),
            "kernel_regularizer": self.kernel_regularizer.map_or(Value::Null, |r| r.to_config()),
        })
    }
}

macro_rules! pool_layer {
    ($name:ident, $class:literal, $prefix:literal, $method:ident, $doc:literal) => {
        #[doc = $doc]
        pub struct $name {
            base: LayerBase,
            /// Window size.
            pub pool_size: [usize; 2],
            /// Strides (Keras' default: the pool size).
            pub strides: [usize; 2],
            /// Padding.
            pub padding: Padding,
        }

        impl $name {
            /// A `pool_size` window with strides equal to it and valid padding.
            pub fn new(pool_size: [usize; 2]) -> $name {
                $name {
                    base: LayerBase::new($prefix, None),
                    pool_size,
                    strides: pool_size,
                    padding: Padding::Valid,
                }
            }
            /// Sets the strides.
            pub fn strides(mut self, s: [usize; 2]) -> $name {
                self.strides = s;
                self
            }
            /// Sets the padding.
            pub fn padding(mut self, p: Padding) -> $name {
                self.padding = p;
                self
            }
            /// Rebuilds from [`Layer::get_config`].
            pub fn from_config(c: &Value) -> Result<$name> {
                check_channels_last(c, $class)?;
                let mut l = $name::new(cfg_pair(c, $class, "pool_size")?);
                l.strides = cfg_pair(c, $class, "strides")?;
                l.padding = padding_from(c, $class)?;
                Ok(l)
            }
        }

        impl Layer for $name {
            layer_base!($class);
            fn call(&mut self, inputs: &[Tensor], _training: bool) -> Result<Vec<Tensor>> {
                expect_inputs(self, inputs, 1)?;
                Ok(vec![inputs[0].$method(self.pool_size, self.strides, self.padding)?])
            }
            fn get_config(&self) -> Value {
                json!({
                    "pool_size": self.pool_size,
                    "strides": self.strides,
                    "padding": padding_name(self.padding),
                    "data_format": "channels_last",
                })
            }
        }
    };
}

pool_layer!(
    MaxPooling2D,
    "MaxPooling2D",
    "max_pooling2d",
    max_pool2d,
    "`tf.keras.layers.MaxPooling2D` over NHWC input."
);
pool_layer!(
    AveragePooling2D,
    "AveragePooling2D",
    "average_pooling2d",
    avg_pool2d,
    "`tf.keras.layers.AveragePooling2D` over NHWC input (padding excluded from the mean)."
);

/// A global pooling layer: `$method` over the `$axes` of a rank-`$rank` input (`$layout`
/// names it in errors), with Keras' `keepdims`. The 1-D, 2-D and 3-D layers are all this.
macro_rules! global_pool_layer {
    ($name:ident, $class:literal, $prefix:literal, $method:ident, $rank:literal, $axes:expr, $layout:literal, $doc:literal) => {
        #[doc = $doc]
        pub struct $name {
            base: LayerBase,
            /// Keep the pooled axes as size 1.
            pub keepdims: bool,
        }

        impl $name {
            /// The layer (`keepdims` false).
            pub fn new() -> $name {
                $name {
                    base: LayerBase::new($prefix, None),
                    keepdims: false,
                }
            }
            /// Rebuilds from [`Layer::get_config`] (or Keras' own config).
            pub fn from_config(c: &Value) -> Result<$name> {
                $crate::layers::conv::check_channels_last(c, $class)?;
                let mut l = $name::new();
                l.keepdims = c["keepdims"].as_bool().unwrap_or(false);
                Ok(l)
            }
        }

        impl Default for $name {
            fn default() -> Self {
                $name::new()
            }
        }

        impl Layer for $name {
            layer_base!($class);
            fn call(&mut self, inputs: &[Tensor], _training: bool) -> Result<Vec<Tensor>> {
                expect_inputs(self, inputs, 1)?;
                let x = &inputs[0];
                if x.rank() != $rank {
                    return Err(Error::invalid(
                        $class,
                        format!(
                            "expects {} input (rank {}), got shape {:?}",
                            $layout,
                            $rank,
                            x.shape()
                        ),
                    ));
                }
                let axes: &[isize] = &$axes;
                Ok(vec![x.$method(Axes::from(axes), self.keepdims)?])
            }
            fn get_config(&self) -> Value {
                json!({ "data_format": "channels_last", "keepdims": self.keepdims })
            }
        }
    };
}
pub(crate) use global_pool_layer;

global_pool_layer!(
    GlobalAveragePooling2D,
    "GlobalAveragePooling2D",
    "global_average_pooling2d",
    reduce_mean,
    4,
    [1, 2],
    "NHWC",
    "`tf.keras.layers.GlobalAveragePooling2D`: the mean over height and width."
);
global_pool_layer!(
    GlobalMaxPooling2D,
    "GlobalMaxPooling2D",
    "global_max_pooling2d",
    reduce_max,
    4,
    [1, 2],
    "NHWC",
    "`tf.keras.layers.GlobalMaxPooling2D`: the maximum over height and width."
);

/// `[batch, steps, channels]`, or an error naming the layer.
fn nwc<'a>(class: &'static str, inputs: &'a [Tensor]) -> Result<&'a Tensor> {
    let x = &inputs[0];
    if x.rank() != 3 {
        return Err(Error::invalid(
            class,
            format!(
                "expects [batch, steps, channels] input (rank 3), got shape {:?}",
                x.shape()
            ),
        ));
    }
    Ok(x)
}

macro_rules! pool1d_layer {
    ($name:ident, $class:literal, $prefix:literal, $method:ident, $doc:literal) => {
        #[doc = $doc]
        pub struct $name {
            base: LayerBase,
            /// Window length.
            pub pool_size: usize,
            /// Stride (Keras' default: the pool size).
            pub strides: usize,
            /// Padding.
            pub padding: Padding,
        }

        impl $name {
            /// A `pool_size` window with a stride equal to it and valid padding.
            pub fn new(pool_size: usize) -> $name {
                $name {
                    base: LayerBase::new($prefix, None),
                    pool_size,
                    strides: pool_size,
                    padding: Padding::Valid,
                }
            }
            /// Sets the stride.
            pub fn strides(mut self, s: usize) -> $name {
                self.strides = s;
                self
            }
            /// Sets the padding.
            pub fn padding(mut self, p: Padding) -> $name {
                self.padding = p;
                self
            }
            /// Rebuilds from [`Layer::get_config`] (or Keras' own config).
            pub fn from_config(c: &Value) -> Result<$name> {
                check_channels_last(c, $class)?;
                let one = |key: &str| cfg_single(c, $class, key);
                let mut l = $name::new(one("pool_size")?);
                l.strides = match c.get("strides") {
                    None | Some(Value::Null) => l.pool_size,
                    Some(_) => one("strides")?,
                };
                l.padding = padding_from(c, $class)?;
                Ok(l)
            }
        }

        impl Layer for $name {
            layer_base!($class);
            fn call(&mut self, inputs: &[Tensor], _training: bool) -> Result<Vec<Tensor>> {
                expect_inputs(self, inputs, 1)?;
                let x = nwc($class, inputs)?;
                // [batch, steps, channels] pooled as an image one row high.
                let y = x.expand_dims(1)?.$method(
                    [1, self.pool_size],
                    [1, self.strides],
                    self.padding,
                )?;
                Ok(vec![y.squeeze(&[1])?])
            }
            fn get_config(&self) -> Value {
                json!({
                    "pool_size": [self.pool_size],
                    "strides": [self.strides],
                    "padding": padding_name(self.padding),
                    "data_format": "channels_last",
                })
            }
        }
    };
}

pool1d_layer!(
    MaxPooling1D,
    "MaxPooling1D",
    "max_pooling1d",
    max_pool2d,
    "`tf.keras.layers.MaxPooling1D` over `[batch, steps, channels]`."
);
pool1d_layer!(
    AveragePooling1D,
    "AveragePooling1D",
    "average_pooling1d",
    avg_pool2d,
    "`tf.keras.layers.AveragePooling1D` over `[batch, steps, channels]` (padding excluded from the mean)."
);

global_pool_layer!(
    GlobalAveragePooling1D,
    "GlobalAveragePooling1D",
    "global_average_pooling1d",
    reduce_mean,
    3,
    [1],
    "[batch, steps, channels]",
    "`tf.keras.layers.GlobalAveragePooling1D`: the mean over the steps."
);
global_pool_layer!(
    GlobalMaxPooling1D,
    "GlobalMaxPooling1D",
    "global_max_pooling1d",
    reduce_max,
    3,
    [1],
    "[batch, steps, channels]",
    "`tf.keras.layers.GlobalMaxPooling1D`: the maximum over the steps."
);
