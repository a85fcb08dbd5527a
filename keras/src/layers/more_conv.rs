//! Embedding, Conv1D, Conv2DTranspose and DepthwiseConv2D.

use ferroflow_tensor::{DType, Error, Padding, Result, SliceSpec, Tensor, Variable};
use serde_json::{json, Value};

use crate::activations::Activation as Act;
use crate::initializers::Initializer;
use crate::layer::{cfg, cfg_pair, cfg_single, cfg_usize, Layer, LayerBase};
use crate::layers::conv::{padding_from, padding_name};
use crate::layers::core::layer_base;
use crate::layers::{add_kernel_and_bias, bias_and_activation, built_weight, expect_inputs};

/// The channel count of an NHWC input shape, or an error naming the layer.
pub(crate) fn nhwc_channels(s: &[Vec<usize>], class: &str) -> Result<usize> {
    match s.first().map(Vec::as_slice) {
        Some(&[_, _, _, c]) => Ok(c),
        other => Err(Error::invalid(
            "Layer.build",
            format!("{class} expects NHWC input (rank 4), got shape {other:?}"),
        )),
    }
}

fn activation_of(c: &Value) -> Result<Act> {
    c["activation"].as_str().map_or(Ok(Act::Linear), Act::parse)
}

/// `tf.keras.layers.Embedding`: integer ids `[..]` to vectors `[.., output_dim]`. An id
/// outside `[0, input_dim)` is an error naming it.
pub struct Embedding {
    base: LayerBase,
    /// Vocabulary size.
    pub input_dim: usize,
    /// Vector size.
    pub output_dim: usize,
    /// Initializer (uniform in ±0.05, as Keras).
    pub embeddings_initializer: Initializer,
    embeddings: Option<Variable>,
}

impl Embedding {
    /// `input_dim` ids mapped to `output_dim`-vectors.
    pub fn new(input_dim: usize, output_dim: usize) -> Embedding {
        Embedding {
            base: LayerBase::new("embedding", None),
            input_dim,
            output_dim,
            embeddings_initializer: Initializer::RandomUniform {
                minval: -0.05,
                maxval: 0.05,
                seed: None,
            },
            embeddings: None,
        }
    }
    /// Rebuilds from [`Layer::get_config`].
    pub fn from_config(c: &Value) -> Result<Embedding> {
        let mut e = Embedding::new(
            cfg_usize(c, "Embedding", "input_dim")?,
            cfg_usize(c, "Embedding", "output_dim")?,
        );
        e.embeddings_initializer =
            Initializer::from_config(cfg(c, "Embedding", "embeddings_initializer")?)?;
        Ok(e)
    }
}

impl Layer for Embedding {
    layer_base!("Embedding");
    fn build(&mut self, _s: &[Vec<usize>]) -> Result<()> {
        let init = self.embeddings_initializer.clone();
        self.embeddings = Some(self.base.add_weight(
            "embeddings",
            &[self.input_dim, self.output_dim],
            &init,
            true,
            None,
        )?);
        Ok(())
    }
    fn call(&mut self, inputs: &[Tensor], _training: bool) -> Result<Vec<Tensor>> {
        expect_inputs(self, inputs, 1)?;
        let ids = match inputs[0].dtype() {
            DType::I32 | DType::I64 => inputs[0].clone(),
            _ => inputs[0].cast(DType::I64)?,
        };
        Ok(vec![
            built_weight(&self.embeddings, "Embedding")?.gather(&ids, 0)?
        ])
    }
    fn get_config(&self) -> Value {
        json!({"input_dim": self.input_dim, "output_dim": self.output_dim, "embeddings_initializer": self.embeddings_initializer.to_config()})
    }
}

/// `tf.keras.layers.Conv1D`: input `[batch, steps, channels]`, kernel `[k, in, filters]`
/// (a one-row Conv2D).
pub struct Conv1D {
    base: LayerBase,
    /// Output channels.
    pub filters: usize,
    /// Window length.
    pub kernel_size: usize,
    /// Stride.
    pub strides: usize,
    /// Padding (`valid` or `same`).
    pub padding: Padding,
    /// Dilation rate.
    pub dilation_rate: usize,
    /// Activation.
    pub activation: Act,
    /// Kernel initializer.
    pub kernel_initializer: Initializer,
    kernel: Option<Variable>,
    bias: Option<Variable>,
}

impl Conv1D {
    /// `filters` outputs over windows of `kernel_size`, stride 1, valid padding.
    pub fn new(filters: usize, kernel_size: usize) -> Conv1D {
        Conv1D {
            base: LayerBase::new("conv1d", None),
            filters,
            kernel_size,
            strides: 1,
            padding: Padding::Valid,
            dilation_rate: 1,
            activation: Act::Linear,
            kernel_initializer: Initializer::GlorotUniform { seed: None },
            kernel: None,
            bias: None,
        }
    }
    /// Rebuilds from [`Layer::get_config`].
    pub fn from_config(c: &Value) -> Result<Conv1D> {
        let mut l = Conv1D::new(
            cfg_usize(c, "Conv1D", "filters")?,
            cfg_single(c, "Conv1D", "kernel_size")?,
        );
        l.strides = cfg_single(c, "Conv1D", "strides")?;
        l.dilation_rate = cfg_single(c, "Conv1D", "dilation_rate")?;
        l.padding = padding_from(c, "Conv1D")?;
        l.activation = activation_of(c)?;
        l.kernel_initializer = Initializer::from_config(cfg(c, "Conv1D", "kernel_initializer")?)?;
        Ok(l)
    }
}

impl Layer for Conv1D {
    layer_base!("Conv1D");
    fn build(&mut self, s: &[Vec<usize>]) -> Result<()> {
        let ch = match s.first().map(Vec::as_slice) {
            Some(&[_, _, c]) => c,
            other => {
                return Err(Error::invalid(
                    "Conv1D",
                    format!("expects [batch, steps, channels], got {other:?}"),
                ))
            }
        };
        (self.kernel, self.bias) = add_kernel_and_bias(
            &mut self.base,
            "kernel",
            &[self.kernel_size, ch, self.filters],
            &self.kernel_initializer.clone(),
            None,
            Some((self.filters, &Initializer::Zeros, None)),
        )?;
        Ok(())
    }
    fn call(&mut self, inputs: &[Tensor], _training: bool) -> Result<Vec<Tensor>> {
        expect_inputs(self, inputs, 1)?;
        let x = &inputs[0];
        if x.rank() != 3 {
            return Err(Error::invalid(
                "Conv1D",
                format!("expects [batch, steps, channels], got {:?}", x.shape()),
            ));
        }
        let k = built_weight(&self.kernel, "Conv1D")?;
        let k4 = k.expand_dims(0)?;
        let y = x
            .expand_dims(1)?
            .conv2d(
                &k4,
                [1, self.strides],
                self.padding,
                [1, self.dilation_rate],
            )?
            .squeeze(&[1])?;
        Ok(vec![bias_and_activation(y, &self.bias, self.activation)?])
    }
    fn get_config(&self) -> Value {
        json!({"filters": self.filters, "kernel_size": self.kernel_size, "strides": self.strides,
               "padding": padding_name(self.padding), "dilation_rate": self.dilation_rate,
               "activation": self.activation.name(), "kernel_initializer": self.kernel_initializer.to_config()})
    }
}

/// `tf.keras.layers.Conv2DTranspose` (NHWC): the gradient of a convolution used forward.
/// Kernel `[kh, kw, filters, in]`; output size `(in - 1)·stride + k` (valid) or
/// `in·stride` (same).
pub struct Conv2DTranspose {
    base: LayerBase,
    /// Output channels.
    pub filters: usize,
    /// Kernel size.
    pub kernel_size: [usize; 2],
    /// Strides.
    pub strides: [usize; 2],
    /// Padding.
    pub padding: Padding,
    /// Activation.
    pub activation: Act,
    /// Kernel initializer.
    pub kernel_initializer: Initializer,
    kernel: Option<Variable>,
    bias: Option<Variable>,
}

impl Conv2DTranspose {
    /// `filters` outputs, a `kernel_size` window, stride 1, valid padding.
    pub fn new(filters: usize, kernel_size: [usize; 2]) -> Conv2DTranspose {
        Conv2DTranspose {
            base: LayerBase::new("conv2d_transpose", None),
            filters,
            kernel_size,
            strides: [1, 1],
            padding: Padding::Valid,
            activation: Act::Linear,
            kernel_initializer: Initializer::GlorotUniform { seed: None },
            kernel: None,
            bias: None,
        }
    }
    /// Sets the strides.
    pub fn strides(mut self, s: [usize; 2]) -> Self {
        self.strides = s;
        self
    }
    /// Sets the padding.
    pub fn padding(mut self, p: Padding) -> Self {
        self.padding = p;
        self
    }
    /// Rebuilds from [`Layer::get_config`].
    pub fn from_config(c: &Value) -> Result<Conv2DTranspose> {
        let mut l = Conv2DTranspose::new(
            cfg_usize(c, "Conv2DTranspose", "filters")?,
            cfg_pair(c, "Conv2DTranspose", "kernel_size")?,
        );
        l.strides = cfg_pair(c, "Conv2DTranspose", "strides")?;
        l.padding = padding_from(c, "Conv2DTranspose")?;
        l.activation = activation_of(c)?;
        l.kernel_initializer =
            Initializer::from_config(cfg(c, "Conv2DTranspose", "kernel_initializer")?)?;
        Ok(l)
    }
}

impl Layer for Conv2DTranspose {
    layer_base!("Conv2DTranspose");
    fn build(&mut self, s: &[Vec<usize>]) -> Result<()> {
        let ch = nhwc_channels(s, "Conv2DTranspose")?;
        let [kh, kw] = self.kernel_size;
        (self.kernel, self.bias) = add_kernel_and_bias(
            &mut self.base,
            "kernel",
            &[kh, kw, self.filters, ch],
            &self.kernel_initializer.clone(),
            None,
            Some((self.filters, &Initializer::Zeros, None)),
        )?;
        Ok(())
    }
    fn call(&mut self, inputs: &[Tensor], _training: bool) -> Result<Vec<Tensor>> {
        expect_inputs(self, inputs, 1)?;
        let x = &inputs[0];
        let [n, h, w, _] = match *x.shape() {
            [n, h, w, c] => [n, h, w, c],
            _ => {
                return Err(Error::invalid(
                    "Conv2DTranspose",
                    format!("expects NHWC input, got {:?}", x.shape()),
                ))
            }
        };
        if h == 0 || w == 0 {
            return Err(Error::invalid(
                "Conv2DTranspose",
                format!("input has an empty spatial dimension: {:?}", x.shape()),
            ));
        }
        let size = |i: usize, k: usize, s: usize| match self.padding {
            Padding::Valid => (i - 1) * s + k,
            Padding::Same => i * s,
        };
        let out = [
            n,
            size(h, self.kernel_size[0], self.strides[0]),
            size(w, self.kernel_size[1], self.strides[1]),
            self.filters,
        ];
        let k = built_weight(&self.kernel, "Conv2DTranspose")?;
        let y = Tensor::conv2d_backprop_input(out, &k, x, self.strides, self.padding, [1, 1])?;
        Ok(vec![bias_and_activation(y, &self.bias, self.activation)?])
    }
    fn get_config(&self) -> Value {
        json!({"filters": self.filters, "kernel_size": self.kernel_size, "strides": self.strides,
               "padding": padding_name(self.padding), "activation": self.activation.name(),
               "kernel_initializer": self.kernel_initializer.to_config()})
    }
}

/// `tf.keras.layers.DepthwiseConv2D` (NHWC): each input channel convolved with its own
/// `depth_multiplier` filters; kernel `[kh, kw, in, multiplier]`, output channels
/// `in · multiplier` (channel-major, as TF). Computed as a sum over the window's taps.
pub struct DepthwiseConv2D {
    base: LayerBase,
    /// Kernel size.
    pub kernel_size: [usize; 2],
    /// Strides.
    pub strides: [usize; 2],
    /// Padding.
    pub padding: Padding,
    /// Filters per input channel.
    pub depth_multiplier: usize,
    /// Activation.
    pub activation: Act,
    /// Kernel initializer.
    pub depthwise_initializer: Initializer,
    kernel: Option<Variable>,
    bias: Option<Variable>,
}

impl DepthwiseConv2D {
    /// A `kernel_size` window, multiplier 1, stride 1, valid padding.
    pub fn new(kernel_size: [usize; 2]) -> DepthwiseConv2D {
        DepthwiseConv2D {
            base: LayerBase::new("depthwise_conv2d", None),
            kernel_size,
            strides: [1, 1],
            padding: Padding::Valid,
            depth_multiplier: 1,
            activation: Act::Linear,
            depthwise_initializer: Initializer::GlorotUniform { seed: None },
            kernel: None,
            bias: None,
        }
    }
    /// Rebuilds from [`Layer::get_config`].
    pub fn from_config(c: &Value) -> Result<DepthwiseConv2D> {
        let mut l = DepthwiseConv2D::new(cfg_pair(c, "DepthwiseConv2D", "kernel_size")?);
        l.strides = cfg_pair(c, "DepthwiseConv2D", "strides")?;
        l.padding = padding_from(c, "DepthwiseConv2D")?;
        l.depth_multiplier = cfg_usize(c, "DepthwiseConv2D", "depth_multiplier")?;
        l.activation = activation_of(c)?;
        l.depthwise_initializer =
            Initializer::from_config(cfg(c, "DepthwiseConv2D", "depthwise_initializer")?)?;
        Ok(l)
    }
}

impl Layer for DepthwiseConv2D {
    layer_base!("DepthwiseConv2D");
    fn build(&mut self, s: &[Vec<usize>]) -> Result<()> {
        let ch = nhwc_channels(s, "DepthwiseConv2D")?;
        let [kh, kw] = self.kernel_size;
        (self.kernel, self.bias) = add_kernel_and_bias(
            &mut self.base,
            "depthwise_kernel",
            &[kh, kw, ch, self.depth_multiplier],
            &self.depthwise_initializer.clone(),
            None,
            Some((ch * self.depth_multiplier, &Initializer::Zeros, None)),
        )?;
        Ok(())
    }
    fn call(&mut self, inputs: &[Tensor], _training: bool) -> Result<Vec<Tensor>> {
        expect_inputs(self, inputs, 1)?;
        let k = built_weight(&self.kernel, "DepthwiseConv2D")?;
        let y = depthwise_conv2d(
            "DepthwiseConv2D",
            &inputs[0],
            &k,
            self.strides,
            self.padding,
        )?;
        Ok(vec![bias_and_activation(y, &self.bias, self.activation)?])
    }
    fn get_config(&self) -> Value {
        json!({"kernel_size": self.kernel_size, "strides": self.strides, "padding": padding_name(self.padding),
               "depth_multiplier": self.depth_multiplier, "activation": self.activation.name(),
               "depthwise_initializer": self.depthwise_initializer.to_config()})
    }
}

/// The depthwise convolution of NHWC `x` with kernel `[kh, kw, in, multiplier]` (TF's
/// `depthwise_conv2d`, output channels `in · multiplier`, channel-major), as a sum over the
/// window's taps so gradients come from the tape.
pub(crate) fn depthwise_conv2d(
    class: &'static str,
    x: &Tensor,
    k: &Tensor,
    strides: [usize; 2],
    padding: Padding,
) -> Result<Tensor> {
    let [n, h, w, c] = match *x.shape() {
        [n, h, w, c] => [n, h, w, c],
        _ => {
            return Err(Error::invalid(
                class,
                format!("expects NHWC input, got {:?}", x.shape()),
            ))
        }
    };
    let (kh, kw, kc, m) = match *k.shape() {
        [kh, kw, kc, m] => (kh, kw, kc, m),
        _ => {
            return Err(Error::invalid(
                class,
                format!(
                    "the depthwise kernel must be [kh, kw, in, multiplier], got {:?}",
                    k.shape()
                ),
            ))
        }
    };
    let [sh, sw] = strides;
    if kc != c {
        return Err(Error::invalid(
            class,
            format!("the kernel is for {kc} channels, the input has {c}"),
        ));
    }
    if h == 0 || w == 0 || kh == 0 || kw == 0 || sh == 0 || sw == 0 {
        return Err(Error::invalid(
            class,
            format!(
                "needs non-empty input {:?}, kernel {:?} and strides {:?}",
                x.shape(),
                [kh, kw],
                strides
            ),
        ));
    }
    // TF's geometry: output sizes and the padding split (extra at the bottom/right).
    let geom = |i: usize, k: usize, s: usize| -> Result<(usize, usize, usize)> {
        match padding {
            Padding::Valid if i >= k => Ok(((i - k) / s + 1, 0, 0)),
            Padding::Valid => Err(Error::invalid(
                class,
                format!("input size {i} is smaller than the kernel {k}"),
            )),
            Padding::Same => {
                let o = i.div_ceil(s);
                let total = ((o - 1) * s + k).saturating_sub(i);
                Ok((o, total / 2, total - total / 2))
            }
        }
    };
    let (oh, pt, pb) = geom(h, kh, sh)?;
    let (ow, pl, pr) = geom(w, kw, sw)?;
    let xp = if pt + pb + pl + pr > 0 {
        x.pad(&[(0, 0), (pt, pb), (pl, pr), (0, 0)], 0.0)?
    } else {
        x.clone()
    };
    let mut acc: Option<Tensor> = None;
    for ky in 0..kh {
        for kx in 0..kw {
            let tap = xp.strided_slice(&[
                SliceSpec::Range {
                    start: None,
                    stop: None,
                    step: 1,
                },
                SliceSpec::Range {
                    start: Some(ky as isize),
                    stop: Some((ky + (oh - 1) * sh + 1) as isize),
                    step: sh as isize,
                },
                SliceSpec::Range {
                    start: Some(kx as isize),
                    stop: Some((kx + (ow - 1) * sw + 1) as isize),
                    step: sw as isize,
                },
                SliceSpec::Range {
                    start: None,
                    stop: None,
                    step: 1,
                },
            ])?;
            let wk =
                k.strided_slice(&[SliceSpec::Index(ky as isize), SliceSpec::Index(kx as isize)])?; // [c, m]
            let term = tap.expand_dims(-1)?.mul(&wk)?; // [n, oh, ow, c, m]
            acc = Some(match acc {
                Some(a) => a.add(&term)?,
                None => term,
            });
        }
    }
    acc.ok_or_else(|| Error::invalid(class, "empty kernel"))?
        .reshape_to(&[n, oh, ow, c * m])
}

/// `tf.keras.layers.SeparableConv2D` (NHWC): a depthwise convolution (`depth_multiplier`
/// filters per input channel) followed by a 1×1 convolution to `filters` channels, then
/// bias and activation. Weights `depthwise_kernel [kh, kw, in, multiplier]`,
/// `pointwise_kernel [1, 1, in · multiplier, filters]`, `bias [filters]`, as Keras.
///
/// ```
/// ferroflow::init();
/// use ferroflow_keras::{layers::SeparableConv2D, Layer};
/// use ferroflow_tensor::{DType, Padding, Tensor};
/// let mut conv = SeparableConv2D::new(8, [3, 3]).padding(Padding::Same);
/// let y = conv.forward(&Tensor::ones(&[2, 5, 5, 3], DType::F32)?, false)?;
/// assert_eq!(y.shape(), &[2, 5, 5, 8]);
/// assert_eq!(conv.count_params(), 3 * 3 * 3 + 3 * 8 + 8);
/// # Ok::<(), ferroflow_tensor::Error>(())
/// ```
pub struct SeparableConv2D {
    base: LayerBase,
    /// Output channels.
    pub filters: usize,
    /// Kernel size of the depthwise step.
    pub kernel_size: [usize; 2],
    /// Strides of the depthwise step.
    pub strides: [usize; 2],
    /// Padding of the depthwise step.
    pub padding: Padding,
    /// Depthwise filters per input channel.
    pub depth_multiplier: usize,
    /// Activation.
    pub activation: Act,
    /// Whether there is a bias.
    pub use_bias: bool,
    /// Initializer of both kernels.
    pub kernel_initializer: Initializer,
    depthwise: Option<Variable>,
    pointwise: Option<Variable>,
    bias: Option<Variable>,
}

impl SeparableConv2D {
    /// `filters` outputs from a `kernel_size` window, multiplier 1, stride 1, valid padding.
    pub fn new(filters: usize, kernel_size: [usize; 2]) -> SeparableConv2D {
        SeparableConv2D {
            base: LayerBase::new("separable_conv2d", None),
            filters,
            kernel_size,
            strides: [1, 1],
            padding: Padding::Valid,
            depth_multiplier: 1,
            activation: Act::Linear,
            use_bias: true,
            kernel_initializer: Initializer::GlorotUniform { seed: None },
            depthwise: None,
            pointwise: None,
            bias: None,
        }
    }
    /// Sets the padding.
    pub fn padding(mut self, p: Padding) -> SeparableConv2D {
        self.padding = p;
        self
    }
    /// Sets the strides.
    pub fn strides(mut self, s: [usize; 2]) -> SeparableConv2D {
        self.strides = s;
        self
    }
    /// Sets the depth multiplier.
    pub fn depth_multiplier(mut self, m: usize) -> SeparableConv2D {
        self.depth_multiplier = m;
        self
    }
    /// Sets the activation.
    pub fn activation(mut self, a: Act) -> SeparableConv2D {
        self.activation = a;
        self
    }
    /// Rebuilds from [`Layer::get_config`] (or Keras' own config).
    pub fn from_config(c: &Value) -> Result<SeparableConv2D> {
        const CLASS: &str = "SeparableConv2D";
        let mut l = SeparableConv2D::new(
            cfg_usize(c, CLASS, "filters")?,
            cfg_pair(c, CLASS, "kernel_size")?,
        );
        l.strides = cfg_pair(c, CLASS, "strides")?;
        l.padding = padding_from(c, CLASS)?;
        l.depth_multiplier = cfg_usize(c, CLASS, "depth_multiplier")?;
        l.activation = activation_of(c)?;
        l.use_bias = c["use_bias"].as_bool().unwrap_or(true);
        if let Some(d) = c.get("dilation_rate") {
            if cfg_pair(c, CLASS, "dilation_rate")? != [1, 1] {
                return Err(Error::format(
                    "SeparableConv2D config",
                    format!("dilation_rate {d} is not supported (1 only)"),
                ));
            }
        }
        if let Some(init) = c.get("depthwise_initializer").filter(|v| !v.is_null()) {
            l.kernel_initializer = Initializer::from_config(init)?;
        }
        Ok(l)
    }
}

impl Layer for SeparableConv2D {
    layer_base!("SeparableConv2D");
    fn build(&mut self, s: &[Vec<usize>]) -> Result<()> {
        let ch = nhwc_channels(s, "SeparableConv2D")?;
        let [kh, kw] = self.kernel_size;
        let mid = ch * self.depth_multiplier;
        let init = self.kernel_initializer.clone();
        self.depthwise = Some(self.base.add_weight(
            "depthwise_kernel",
            &[kh, kw, ch, self.depth_multiplier],
            &init,
            true,
            None,
        )?);
        self.pointwise = Some(self.base.add_weight(
            "pointwise_kernel",
            &[1, 1, mid, self.filters],
            &init,
            true,
            None,
        )?);
        if self.use_bias {
            self.bias = Some(self.base.add_weight(
                "bias",
                &[self.filters],
                &Initializer::Zeros,
                true,
                None,
            )?);
        }
        Ok(())
    }
    fn call(&mut self, inputs: &[Tensor], _training: bool) -> Result<Vec<Tensor>> {
        expect_inputs(self, inputs, 1)?;
        let dk = built_weight(&self.depthwise, "SeparableConv2D")?;
        let pk = built_weight(&self.pointwise, "SeparableConv2D")?;
        let mid = depthwise_conv2d(
            "SeparableConv2D",
            &inputs[0],
            &dk,
            self.strides,
            self.padding,
        )?;
        let y = mid.conv2d(&pk, [1, 1], Padding::Valid, [1, 1])?;
        Ok(vec![bias_and_activation(y, &self.bias, self.activation)?])
    }
    fn get_config(&self) -> Value {
        json!({"filters": self.filters, "kernel_size": self.kernel_size, "strides": self.strides,
               "padding": padding_name(self.padding), "depth_multiplier": self.depth_multiplier,
               "activation": self.activation.name(), "use_bias": self.use_bias,
               "depthwise_initializer": self.kernel_initializer.to_config()})
    }
}
