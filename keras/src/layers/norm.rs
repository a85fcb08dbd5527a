//! BatchNormalization and LayerNormalization (normalising the last axis, Keras' default).

use ferroflow_tensor::{Axes, Error, Result, Tensor, Variable};
use serde_json::{json, Value};

use crate::initializers::Initializer;
use crate::layer::{cfg_f64, Layer, LayerBase};
use crate::layers::core::layer_base;
use crate::layers::expect_inputs;

fn check_last_axis(c: &Value, class: &str) -> Result<()> {
    match &c["axis"] {
        Value::Null => Ok(()),
        v if v.as_i64() == Some(-1)
            || v.as_array()
                .is_some_and(|a| a.len() == 1 && a[0].as_i64() == Some(-1)) =>
        {
            Ok(())
        }
        v => Err(Error::format(
            format!("{class} config"),
            format!("axis {v} is not supported: ferroflow normalizes the last axis (-1)"),
        )),
    }
}

/// The learned per-feature scale `gamma` (ones) and shift `beta` (zeros), when wanted.
fn add_scale_and_shift(
    base: &mut LayerBase,
    input_shapes: &[Vec<usize>],
    scale: bool,
    center: bool,
    class: &str,
) -> Result<(Option<Variable>, Option<Variable>, usize)> {
    let c = *input_shapes.first().and_then(|s| s.last()).ok_or_else(|| {
        Error::invalid("Layer.build", format!("{class} needs an input of rank ≥ 1"))
    })?;
    let gamma = if scale {
        Some(base.add_weight("gamma", &[c], &Initializer::Ones, true, None)?)
    } else {
        None
    };
    let beta = if center {
        Some(base.add_weight("beta", &[c], &Initializer::Zeros, true, None)?)
    } else {
        None
    };
    Ok((gamma, beta, c))
}

/// `(x - mean) / sqrt(var + eps) · gamma + beta` with optional gamma/beta, in `x`'s dtype
/// (callers pass half-precision inputs upcast: mixed precision normalizes in float32).
fn normalize(
    x: &Tensor,
    mean: &Tensor,
    var: &Tensor,
    eps: f64,
    gamma: Option<&Variable>,
    beta: Option<&Variable>,
) -> Result<Tensor> {
    let d = x.dtype();
    let mut inv = var.add(&var.scalar_like(eps)?)?.rsqrt()?;
    if let Some(g) = gamma {
        inv = inv.mul(&g.value().cast(d)?)?;
    }
    let mut y = x.sub(&mean.cast(d)?)?.mul(&inv)?;
    if let Some(b) = beta {
        y = y.add(&b.value().cast(d)?)?;
    }
    Ok(y)
}

/// `tf.keras.layers.BatchNormalization` over the last axis. Training normalizes with the
/// batch's statistics and updates the moving ones (`moving = moving·momentum +
/// batch·(1 - momentum)`); inference uses the moving statistics. As TF's fused kernel does
/// for NHWC inputs, the moving variance of a rank-4 input takes the unbiased batch variance.
pub struct BatchNormalization {
    base: LayerBase,
    /// Moving-average momentum (0.99).
    pub momentum: f64,
    /// Added to the variance (1e-3).
    pub epsilon: f64,
    /// Learn a shift `beta`.
    pub center: bool,
    /// Learn a scale `gamma`.
    pub scale: bool,
    gamma: Option<Variable>,
    beta: Option<Variable>,
    moving_mean: Option<Variable>,
    moving_variance: Option<Variable>,
}

impl BatchNormalization {
    /// Keras' defaults: momentum 0.99, epsilon 1e-3, center and scale.
    pub fn new() -> BatchNormalization {
        BatchNormalization {
            base: LayerBase::new("batch_normalization", None),
            momentum: 0.99,
            epsilon: 1e-3,
            center: true,
            scale: true,
            gamma: None,
            beta: None,
            moving_mean: None,
            moving_variance: None,
        }
    }
    /// Rebuilds from [`Layer::get_config`].
    pub fn from_config(c: &Value) -> Result<BatchNormalization> {
        check_last_axis(c, "BatchNormalization")?;
        let mut l = BatchNormalization::new();
        l.momentum = cfg_f64(c, "BatchNormalization", "momentum")?;
        l.epsilon = cfg_f64(c, "BatchNormalization", "epsilon")?;
        l.center = c["center"].as_bool().unwrap_or(true);
        l.scale = c["scale"].as_bool().unwrap_or(true);
        Ok(l)
    }
}

impl Default for BatchNormalization {
    fn default() -> Self {
        BatchNormalization::new()
    }
}

impl Layer for BatchNormalization {
    layer_base!("BatchNormalization");
    fn build(&mut self, input_shapes: &[Vec<usize>]) -> Result<()> {
        let (gamma, beta, c) = add_scale_and_shift(
            &mut self.base,
            input_shapes,
            self.scale,
            self.center,
            "BatchNormalization",
        )?;
        (self.gamma, self.beta) = (gamma, beta);
        self.moving_mean =
            Some(
                self.base
                    .add_weight("moving_mean", &[c], &Initializer::Zeros, false, None)?,
            );
        self.moving_variance =
            Some(
                self.base
                    .add_weight("moving_variance", &[c], &Initializer::Ones, false, None)?,
            );
        Ok(())
    }
    fn call(&mut self, inputs: &[Tensor], training: bool) -> Result<Vec<Tensor>> {
        expect_inputs(self, inputs, 1)?;
        let x = &inputs[0];
        let (Some(mm), Some(mv)) = (&self.moving_mean, &self.moving_variance) else {
            return Err(Error::invalid(
                "BatchNormalization",
                "call before build: use `apply`",
            ));
        };
        if x.shape().last() != mm.shape().last() {
            return Err(Error::ShapeMismatch {
                op: "BatchNormalization",
                msg: "input's last dimension differs from the one the layer was built for",
                lhs: x.shape().to_vec(),
                rhs: mm.shape(),
            });
        }
        let out_dtype = x.dtype();
        let x = &x.upcast_half()?;
        // Training with a frozen layer runs in inference mode (Keras 2.4 behaviour).
        let y = if training && self.base.trainable {
            let axes: Vec<isize> = (0..x.rank() as isize - 1).collect();
            let mean = x.reduce_mean(Axes::from(axes.clone()), false)?;
            let var = x
                .squared_difference(&mean)?
                .reduce_mean(Axes::from(axes), false)?;
            let n = x.num_elements() / x.shape().last().copied().unwrap_or(1).max(1);
            let moving_var_sample = if x.rank() == 4 && n > 1 {
                var.mul(&var.scalar_like(n as f64 / (n as f64 - 1.0))?)?
            } else {
                var.clone()
            };
            let m = mm.peek();
            let decay = m.scalar_like(1.0 - self.momentum)?;
            mm.assign(&m.sub(&m.sub(&mean.cast(m.dtype())?)?.mul(&decay)?)?)?;
            let v = mv.peek();
            let sample = moving_var_sample.cast(v.dtype())?;
            mv.assign(&v.sub(&v.sub(&sample)?.mul(&decay)?)?)?;
            normalize(
                x,
                &mean,
                &var,
                self.epsilon,
                self.gamma.as_ref(),
                self.beta.as_ref(),
            )?
        } else {
            normalize(
                x,
                &mm.value(),
                &mv.value().cast(x.dtype())?,
                self.epsilon,
                self.gamma.as_ref(),
                self.beta.as_ref(),
            )?
        };
        Ok(vec![y.cast(out_dtype)?])
    }
    fn get_config(&self) -> Value {
        json!({
            "axis": -1,
            "momentum": self.momentum,
            "epsilon": self.epsilon,
            "center": self.center,
            "scale": self.scale,
        })
    }
}

/// `tf.keras.layers.LayerNormalization` over the last axis: each sample is normalized by its
/// own mean and variance, then scaled and shifted per feature.
pub struct LayerNormalization {
    base: LayerBase,
    /// Added to the variance (1e-3).
    pub epsilon: f64,
    /// Learn a shift `beta`.
    pub center: bool,
    /// Learn a scale `gamma`.
    pub scale: bool,
    gamma: Option<Variable>,
    beta: Option<Variable>,
}

impl LayerNormalization {
    /// Keras' defaults: epsilon 1e-3, center and scale.
    pub fn new() -> LayerNormalization {
        LayerNormalization {
            base: LayerBase::new("layer_normalization", None),
            epsilon: 1e-3,
            center: true,
            scale: true,
            gamma: None,
            beta: None,
        }
    }
    /// Rebuilds from [`Layer::get_config`].
    pub fn from_config(c: &Value) -> Result<LayerNormalization> {
        check_last_axis(c, "LayerNormalization")?;
        let mut l = LayerNormalization::new();
        l.epsilon = cfg_f64(c, "LayerNormalization", "epsilon")?;
        l.center = c["center"].as_bool().unwrap_or(true);
        l.scale = c["scale"].as_bool().unwrap_or(true);
        Ok(l)
    }
}

impl Default for LayerNormalization {
    fn default() -> Self {
        LayerNormalization::new()
    }
}

impl Layer for LayerNormalization {
    layer_base!("LayerNormalization");
    fn build(&mut self, input_shapes: &[Vec<usize>]) -> Result<()> {
        let (gamma, beta, _) = add_scale_and_shift(
            &mut self.base,
            input_shapes,
            self.scale,
            self.center,
            "LayerNormalization",
        )?;
        (self.gamma, self.beta) = (gamma, beta);
        Ok(())
    }
    fn call(&mut self, inputs: &[Tensor], _training: bool) -> Result<Vec<Tensor>> {
        expect_inputs(self, inputs, 1)?;
        let out_dtype = inputs[0].dtype();
        let x = &inputs[0].upcast_half()?;
        let mean = x.reduce_mean(-1isize, true)?;
        let var = x.squared_difference(&mean)?.reduce_mean(-1isize, true)?;
        Ok(vec![normalize(
            x,
            &mean,
            &var,
            self.epsilon,
            self.gamma.as_ref(),
            self.beta.as_ref(),
        )?
        .cast(out_dtype)?])
    }
    fn get_config(&self) -> Value {
        json!({"axis": -1, "epsilon": self.epsilon, "center": self.center, "scale": self.scale})
    }
}
