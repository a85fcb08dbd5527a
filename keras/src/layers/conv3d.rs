//! Conv3D and the 3-D pooling layers (channels-last, NDHWC). There is no 3-D primitive:
//! a 3-D convolution is a sum over the kernel's depth of 2-D convolutions of the input's
//! depth slices (one `conv2d` call per kernel depth, all output depths batched), and 3-D
//! pooling pools height and width with the 2-D kernels, then depth tap by tap. Gradients
//! come from the tape.

use ferroflow_tensor::{Axes, Error, Padding, Result, SliceSpec, Tensor, Variable};
use serde_json::{json, Value};

use crate::activations::Activation as Act;
use crate::initializers::Initializer;
use crate::layer::{cfg, cfg_usize, Layer, LayerBase};
use crate::layers::conv::{check_channels_last, global_pool_layer, padding_from, padding_name};
use crate::layers::core::layer_base;
use crate::layers::{add_kernel_and_bias, bias_and_activation, built_weight, expect_inputs};

/// A triple like `kernel_size` from an integer or a list of three.
fn cfg_triple(c: &Value, class: &str, key: &str) -> Result<[usize; 3]> {
    let v = cfg(c, class, key)?;
    if let Some(n) = v.as_u64() {
        return Ok([n as usize; 3]);
    }
    match v.as_array().map(|a| {
        a.iter()
            .map(|x| x.as_u64().map(|u| u as usize))
            .collect::<Option<Vec<_>>>()
    }) {
        Some(Some(t)) if t.len() == 3 => Ok([t[0], t[1], t[2]]),
        _ => Err(Error::format(
            format!("{class} config"),
            format!("{key:?} must be an integer or three integers, got {v}"),
        )),
    }
}

fn ndhwc(class: &'static str, x: &Tensor) -> Result<[usize; 5]> {
    match *x.shape() {
        [n, d, h, w, c] => Ok([n, d, h, w, c]),
        _ => Err(Error::invalid(
            class,
            format!("expects NDHWC input (rank 5), got shape {:?}", x.shape()),
        )),
    }
}

/// TF's geometry along one axis: (output size, padding before, padding after).
fn geometry(
    class: &'static str,
    padding: Padding,
    n: usize,
    k: usize,
    s: usize,
) -> Result<(usize, usize, usize)> {
    if k == 0 || s == 0 {
        return Err(Error::invalid(
            class,
            format!("window {k} and stride {s} must be positive"),
        ));
    }
    match padding {
        Padding::Valid if n >= k => Ok(((n - k) / s + 1, 0, 0)),
        Padding::Valid => Err(Error::invalid(
            class,
            format!("input size {n} is smaller than the window {k}"),
        )),
        Padding::Same => {
            if n == 0 {
                return Err(Error::invalid(class, "an empty input axis"));
            }
            let o = n.div_ceil(s);
            let total = ((o - 1) * s + k).saturating_sub(n);
            Ok((o, total / 2, total - total / 2))
        }
    }
}

/// Depth slices `start, start + s, ...` (`count` of them) of a padded NDHWC tensor.
fn depth_taps(x: &Tensor, start: usize, count: usize, s: usize) -> Result<Tensor> {
    let all = SliceSpec::Range {
        start: None,
        stop: None,
        step: 1,
    };
    x.strided_slice(&[
        all,
        SliceSpec::Range {
            start: Some(start as isize),
            stop: Some((start + (count - 1) * s + 1) as isize),
            step: s as isize,
        },
        all,
        all,
        all,
    ])
}

/// `tf.keras.layers.Conv3D` (NDHWC), kernel `[kd, kh, kw, in, filters]`.
///
/// ```
/// ferroflow::init();
/// use ferroflow_keras::{layers::Conv3D, Layer};
/// use ferroflow_tensor::{DType, Padding, Tensor};
/// let mut conv = Conv3D::new(4, [2, 3, 3]).padding(Padding::Same);
/// let y = conv.forward(&Tensor::ones(&[1, 3, 5, 5, 2], DType::F32)?, false)?;
/// assert_eq!(y.shape(), &[1, 3, 5, 5, 4]);
/// # Ok::<(), ferroflow_tensor::Error>(())
/// ```
pub struct Conv3D {
    base: LayerBase,
    /// Output channels.
    pub filters: usize,
    /// Kernel size (depth, height, width).
    pub kernel_size: [usize; 3],
    /// Strides.
    pub strides: [usize; 3],
    /// Padding.
    pub padding: Padding,
    /// Activation.
    pub activation: Act,
    /// Whether there is a bias.
    pub use_bias: bool,
    /// Kernel initializer.
    pub kernel_initializer: Initializer,
    kernel: Option<Variable>,
    bias: Option<Variable>,
}

impl Conv3D {
    /// `filters` outputs from a `kernel_size` window, stride 1, valid padding.
    pub fn new(filters: usize, kernel_size: [usize; 3]) -> Conv3D {
        Conv3D {
            base: LayerBase::new("conv3d", None),
            filters,
            kernel_size,
            strides: [1, 1, 1],
            padding: Padding::Valid,
            activation: Act::Linear,
            use_bias: true,
            kernel_initializer: Initializer::GlorotUniform { seed: None },
            kernel: None,
            bias: None,
        }
    }
    /// Sets the padding.
    pub fn padding(mut self, p: Padding) -> Conv3D {
        self.padding = p;
        self
    }
    /// Sets the strides.
    pub fn strides(mut self, s: [usize; 3]) -> Conv3D {
        self.strides = s;
        self
    }
    /// Sets the activation.
    pub fn activation(mut self, a: Act) -> Conv3D {
        self.activation = a;
        self
    }
    /// Rebuilds from [`Layer::get_config`] (or Keras' own config; dilation and groups 1).
    pub fn from_config(c: &Value) -> Result<Conv3D> {
        const CLASS: &str = "Conv3D";
        check_channels_last(c, CLASS)?;
        let mut l = Conv3D::new(
            cfg_usize(c, CLASS, "filters")?,
            cfg_triple(c, CLASS, "kernel_size")?,
        );
        l.strides = cfg_triple(c, CLASS, "strides")?;
        l.padding = padding_from(c, CLASS)?;
        if c.get("dilation_rate").is_some() && cfg_triple(c, CLASS, "dilation_rate")? != [1, 1, 1] {
            return Err(Error::format("Conv3D config", "dilation_rate must be 1"));
        }
        if c.get("groups")
            .and_then(Value::as_u64)
            .is_some_and(|g| g != 1)
        {
            return Err(Error::format("Conv3D config", "groups must be 1"));
        }
        l.activation = c["activation"]
            .as_str()
            .map_or(Ok(Act::Linear), Act::parse)?;
        l.use_bias = c["use_bias"].as_bool().unwrap_or(true);
        if let Some(init) = c.get("kernel_initializer").filter(|v| !v.is_null()) {
            l.kernel_initializer = Initializer::from_config(init)?;
        }
        Ok(l)
    }
}

impl Layer for Conv3D {
    layer_base!("Conv3D");
    fn build(&mut self, s: &[Vec<usize>]) -> Result<()> {
        let ch = match s.first().map(Vec::as_slice) {
            Some(&[_, _, _, _, c]) => c,
            other => {
                return Err(Error::invalid(
                    "Layer.build",
                    format!("Conv3D expects NDHWC input (rank 5), got shape {other:?}"),
                ))
            }
        };
        let [kd, kh, kw] = self.kernel_size;
        (self.kernel, self.bias) = add_kernel_and_bias(
            &mut self.base,
            "kernel",
            &[kd, kh, kw, ch, self.filters],
            &self.kernel_initializer.clone(),
            None,
            self.use_bias
                .then_some((self.filters, &Initializer::Zeros, None)),
        )?;
        Ok(())
    }
    fn call(&mut self, inputs: &[Tensor], _training: bool) -> Result<Vec<Tensor>> {
        expect_inputs(self, inputs, 1)?;
        let x = &inputs[0];
        let [n, d, _, _, _] = ndhwc("Conv3D", x)?;
        let k = built_weight(&self.kernel, "Conv3D")?;
        let [kd, _, _] = self.kernel_size;
        let [sd, sh, sw] = self.strides;
        let (od, front, back) = geometry("Conv3D", self.padding, d, kd, sd)?;
        let xp = if front + back > 0 {
            x.pad(&[(0, 0), (front, back), (0, 0), (0, 0), (0, 0)], 0.0)?
        } else {
            x.clone()
        };
        let s = xp.shape().to_vec();
        let mut acc: Option<Tensor> = None;
        for t in 0..kd {
            // Every output depth's slice for kernel depth t, as one batch of images.
            let slices = depth_taps(&xp, t, od, sd)?.reshape_to(&[n * od, s[2], s[3], s[4]])?;
            let wk = k.strided_slice(&[SliceSpec::Index(t as isize)])?;
            let y = slices.conv2d(&wk, [sh, sw], self.padding, [1, 1])?;
            acc = Some(match acc {
                Some(a) => a.add(&y)?,
                None => y,
            });
        }
        let y = acc.ok_or_else(|| Error::invalid("Conv3D", "the kernel depth is 0"))?;
        let (oh, ow) = (y.shape()[1], y.shape()[2]);
        let y = y.reshape_to(&[n, od, oh, ow, self.filters])?;
        Ok(vec![bias_and_activation(y, &self.bias, self.activation)?])
    }
    fn get_config(&self) -> Value {
        json!({"filters": self.filters, "kernel_size": self.kernel_size, "strides": self.strides,
               "padding": padding_name(self.padding), "activation": self.activation.name(),
               "use_bias": self.use_bias, "data_format": "channels_last",
               "kernel_initializer": self.kernel_initializer.to_config()})
    }
}

/// Max (`max`) or average pooling of NDHWC `x` (padding excluded from averages, as TF).
fn pool3d(
    class: &'static str,
    x: &Tensor,
    pool: [usize; 3],
    strides: [usize; 3],
    padding: Padding,
    max: bool,
) -> Result<Tensor> {
    let [n, d, h, w, c] = ndhwc(class, x)?;
    let (od, front, back) = geometry(class, padding, d, pool[0], strides[0])?;
    // Height and width first, every depth slice as an image.
    let flat = x.reshape_to(&[n * d, h, w, c])?;
    let hw = if max {
        flat.max_pool2d([pool[1], pool[2]], [strides[1], strides[2]], padding)?
    } else {
        flat.avg_pool2d([pool[1], pool[2]], [strides[1], strides[2]], padding)?
    };
    let (oh, ow) = (hw.shape()[1], hw.shape()[2]);
    let hw = hw.reshape_to(&[n, d, oh, ow, c])?;
    // Then depth, tap by tap over the padded depth.
    let fill = if max { f64::NEG_INFINITY } else { 0.0 };
    let padded = if front + back > 0 {
        hw.pad(&[(0, 0), (front, back), (0, 0), (0, 0), (0, 0)], fill)?
    } else {
        hw
    };
    let mut acc: Option<Tensor> = None;
    for t in 0..pool[0] {
        let tap = depth_taps(&padded, t, od, strides[0])?;
        acc = Some(match acc {
            Some(a) if max => a.maximum(&tap)?,
            Some(a) => a.add(&tap)?,
            None => tap,
        });
    }
    let acc = acc.ok_or_else(|| Error::invalid(class, "the pool depth is 0"))?;
    if max {
        return Ok(acc);
    }
    // Each output depth's count of real (unpadded) slices.
    let counts: Vec<f64> = (0..od)
        .map(|o| {
            let start = (o * strides[0]) as isize - front as isize;
            let lo = start.max(0);
            let hi = (start + pool[0] as isize).min(d as isize);
            (hi - lo).max(1) as f64
        })
        .collect();
    let counts = Tensor::from_host(
        ferroflow_tensor::HostData::from_f64_slice(acc.dtype(), &counts),
        &[1, od, 1, 1, 1],
    )?;
    acc.div(&counts)
}

macro_rules! pool3d_layer {
    ($name:ident, $class:literal, $prefix:literal, $max:expr, $doc:literal) => {
        #[doc = $doc]
        pub struct $name {
            base: LayerBase,
            /// Window (depth, height, width).
            pub pool_size: [usize; 3],
            /// Strides (Keras' default: the pool size).
            pub strides: [usize; 3],
            /// Padding.
            pub padding: Padding,
        }

        impl $name {
            /// A `pool_size` window with strides equal to it and valid padding.
            pub fn new(pool_size: [usize; 3]) -> $name {
                $name {
                    base: LayerBase::new($prefix, None),
                    pool_size,
                    strides: pool_size,
                    padding: Padding::Valid,
                }
            }
            /// Sets the strides.
            pub fn strides(mut self, s: [usize; 3]) -> $name {
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
                let mut l = $name::new(cfg_triple(c, $class, "pool_size")?);
                if c.get("strides").is_some_and(|s| !s.is_null()) {
                    l.strides = cfg_triple(c, $class, "strides")?;
                }
                l.padding = padding_from(c, $class)?;
                Ok(l)
            }
        }

        impl Layer for $name {
            layer_base!($class);
            fn call(&mut self, inputs: &[Tensor], _training: bool) -> Result<Vec<Tensor>> {
                expect_inputs(self, inputs, 1)?;
                Ok(vec![pool3d(
                    $class,
                    &inputs[0],
                    self.pool_size,
                    self.strides,
                    self.padding,
                    $max,
                )?])
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

pool3d_layer!(
    MaxPooling3D,
    "MaxPooling3D",
    "max_pooling3d",
    true,
    "`tf.keras.layers.MaxPooling3D` over NDHWC input."
);
pool3d_layer!(
    AveragePooling3D,
    "AveragePooling3D",
    "average_pooling3d",
    false,
    "`tf.keras.layers.AveragePooling3D` over NDHWC input (padding excluded from the mean)."
);

global_pool_layer!(
    GlobalAveragePooling3D,
    "GlobalAveragePooling3D",
    "global_average_pooling3d",
    reduce_mean,
    5,
    [1, 2, 3],
    "NDHWC",
    "`tf.keras.layers.GlobalAveragePooling3D`: the mean over depth, height and width."
);
global_pool_layer!(
    GlobalMaxPooling3D,
    "GlobalMaxPooling3D",
    "global_max_pooling3d",
    reduce_max,
    5,
    [1, 2, 3],
    "NDHWC",
    "`tf.keras.layers.GlobalMaxPooling3D`: the maximum over depth, height and width."
);
