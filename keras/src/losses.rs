//! Losses (`tf.keras.losses`) with TF's reductions.
//!
//! Each loss computes a per-sample value (the mean over the last axis for the elementwise
//! ones), then reduces: `SumOverBatchSize` (Keras' default: the sum divided by the number of
//! per-sample values), `Sum`, or `None` (the per-sample values).
//!
//! ```
//! ferroflow::init();
//! use ferroflow_keras::losses::{Loss, MeanSquaredError};
//! use ferroflow_tensor::Tensor;
//! let y_true = Tensor::from_vec(vec![0.0f32, 1.0, 1.0, 1.0], &[2, 2])?;
//! let y_pred = Tensor::from_vec(vec![1.0f32, 1.0, 0.0, 0.0], &[2, 2])?;
//! let l = MeanSquaredError::new().call(&y_true, &y_pred, None)?;
//! assert_eq!(l.item::<f32>()?, 0.75);
//! # Ok::<(), ferroflow_tensor::Error>(())
//! ```

use ferroflow_tensor::{Axes, DType, Error, Result, Tensor};
use serde_json::{json, Value};

/// Keras' `epsilon()`, used to clip probabilities.
pub const EPSILON: f64 = 1e-7;

/// How per-sample losses become the loss (`tf.keras.losses.Reduction`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Reduction {
    /// Sum divided by the number of elements (Keras' `AUTO` in a model).
    #[default]
    SumOverBatchSize,
    /// Plain sum.
    Sum,
    /// No reduction: the per-sample losses.
    None,
}

impl Reduction {
    /// Keras' name (`"sum_over_batch_size"`, `"sum"`, `"none"`).
    pub fn name(self) -> &'static str {
        match self {
            Reduction::SumOverBatchSize => "sum_over_batch_size",
            Reduction::Sum => "sum",
            Reduction::None => "none",
        }
    }
    /// Parses Keras' names (`"auto"` is `SumOverBatchSize`).
    pub fn parse(name: &str) -> Result<Reduction> {
        Ok(match name {
            "sum_over_batch_size" | "auto" => Reduction::SumOverBatchSize,
            "sum" => Reduction::Sum,
            "none" => Reduction::None,
            other => {
                return Err(Error::invalid(
                    "Reduction",
                    format!("unknown reduction {other:?} (sum_over_batch_size, sum, none)"),
                ))
            }
        })
    }
}

/// A loss function.
pub trait Loss: Send {
    /// Keras' snake-case name (`"sparse_categorical_crossentropy"`).
    fn name(&self) -> &'static str;
    /// Per-sample losses (shape: `y_pred`'s without its last axis).
    fn per_sample(&self, y_true: &Tensor, y_pred: &Tensor) -> Result<Tensor>;
    /// The reduction.
    fn reduction(&self) -> Reduction {
        Reduction::SumOverBatchSize
    }
    /// Keras' `get_config`: the name, the reduction and the loss's own options;
    /// [`deserialize`] rebuilds the loss from it.
    fn get_config(&self) -> Value {
        json!({"name": self.name(), "reduction": self.reduction().name()})
    }
    /// The reduced loss, optionally weighting each sample (`sample_weight` broadcasts
    /// against the per-sample losses).
    fn call(
        &self,
        y_true: &Tensor,
        y_pred: &Tensor,
        sample_weight: Option<&Tensor>,
    ) -> Result<Tensor> {
        let mut l = self.per_sample(y_true, y_pred)?;
        if let Some(w) = sample_weight {
            let w = if w.rank() > l.rank() && w.shape().last() == Some(&1) {
                w.squeeze(&[-1])?
            } else {
                w.clone()
            };
            l = l.mul(&w.cast(l.dtype())?)?;
        }
        match self.reduction() {
            Reduction::None => Ok(l),
            Reduction::Sum => l.reduce_sum(Axes::All, false),
            // TF's `div_no_nan(sum, n)`: one `Mean`, and 0 for an empty batch.
            Reduction::SumOverBatchSize if l.num_elements() == 0 => l.reduce_sum(Axes::All, false),
            Reduction::SumOverBatchSize => l.reduce_mean(Axes::All, false),
        }
    }
}

fn check_float(name: &str, y_pred: &Tensor) -> Result<()> {
    if !y_pred.dtype().is_float() {
        return Err(Error::invalid(
            "loss",
            format!(
                "{name}: predictions must be floating point, got {}",
                y_pred.dtype()
            ),
        ));
    }
    Ok(())
}

/// `y_true` cast to the predictions' dtype and shape-checked against them.
fn dense_targets(name: &str, y_true: &Tensor, y_pred: &Tensor) -> Result<Tensor> {
    check_float(name, y_pred)?;
    let y = y_true.cast(y_pred.dtype())?;
    // Keras squeezes or expands a trailing 1 so [n] targets meet [n, 1] predictions.
    let y = if y.rank() + 1 == y_pred.rank() && y_pred.shape().last() == Some(&1) {
        y.expand_dims(-1)?
    } else {
        y
    };
    if y.shape() != y_pred.shape() {
        return Err(Error::ShapeMismatch {
            op: "loss",
            msg: "y_true and y_pred shapes differ",
            lhs: y.shape().to_vec(),
            rhs: y_pred.shape().to_vec(),
        });
    }
    Ok(y)
}

macro_rules! simple_loss {
    ($(#[$m:meta])* $name:ident) => {
        $(#[$m])*
        #[derive(Debug, Clone, Default)]
        pub struct $name {
            /// The reduction.
            pub reduction: Reduction,
        }
        impl $name {
            /// With the default reduction.
            pub fn new() -> $name {
                $name::default()
            }
        }
    };
}

simple_loss!(
    /// Mean of `(y_true - y_pred)²` over the last axis.
    MeanSquaredError
);
simple_loss!(
    /// Mean of `|y_true - y_pred|` over the last axis.
    MeanAbsoluteError
);
simple_loss!(
    /// `Σ y_true · log(y_true / y_pred)` over the last axis, both clipped to `[ε, 1]`.
    KLDivergence
);

impl Loss for MeanSquaredError {
    fn name(&self) -> &'static str {
        "mean_squared_error"
    }
    fn per_sample(&self, y_true: &Tensor, y_pred: &Tensor) -> Result<Tensor> {
        let y = dense_targets(self.name(), y_true, y_pred)?;
        y_pred.squared_difference(&y)?.reduce_mean(-1isize, false)
    }
    fn reduction(&self) -> Reduction {
        self.reduction
    }
}

impl Loss for MeanAbsoluteError {
    fn name(&self) -> &'static str {
        "mean_absolute_error"
    }
    fn per_sample(&self, y_true: &Tensor, y_pred: &Tensor) -> Result<Tensor> {
        let y = dense_targets(self.name(), y_true, y_pred)?;
        y_pred.sub(&y)?.abs()?.reduce_mean(-1isize, false)
    }
    fn reduction(&self) -> Reduction {
        self.reduction
    }
}

impl Loss for KLDivergence {
    fn name(&self) -> &'static str {
        "kl_divergence"
    }
    fn per_sample(&self, y_true: &Tensor, y_pred: &Tensor) -> Result<Tensor> {
        let y = dense_targets(self.name(), y_true, y_pred)?;
        let (lo, hi) = (y.scalar_like(EPSILON)?, y.scalar_like(1.0)?);
        let t = y.clip_by_value(&lo, &hi)?;
        let p = y_pred.clip_by_value(&lo, &hi)?;
        t.mul(&t.div(&p)?.log()?)?.reduce_sum(-1isize, false)
    }
    fn reduction(&self) -> Reduction {
        self.reduction
    }
}

/// Huber loss: `½x²` for `|x| ≤ δ`, `δ|x| - ½δ²` beyond, averaged over the last axis.
#[derive(Debug, Clone)]
pub struct Huber {
    /// The threshold δ (1.0).
    pub delta: f64,
    /// The reduction.
    pub reduction: Reduction,
}

impl Huber {
    /// Huber loss with threshold `delta`.
    pub fn new(delta: f64) -> Huber {
        Huber {
            delta,
            reduction: Reduction::default(),
        }
    }
}

impl Loss for Huber {
    fn name(&self) -> &'static str {
        "huber_loss"
    }
    fn per_sample(&self, y_true: &Tensor, y_pred: &Tensor) -> Result<Tensor> {
        let y = dense_targets(self.name(), y_true, y_pred)?;
        let err = y_pred.sub(&y)?.abs()?;
        let d = err.scalar_like(self.delta)?;
        let quadratic = err.minimum(&d)?;
        let linear = err.sub(&quadratic)?;
        // ½·q² + δ·(|x| - q), with q = min(|x|, δ): TF's formulation, smooth at δ.
        quadratic
            .square()?
            .mul(&err.scalar_like(0.5)?)?
            .add(&linear.mul(&d)?)?
            .reduce_mean(-1isize, false)
    }
    fn reduction(&self) -> Reduction {
        self.reduction
    }
    fn get_config(&self) -> Value {
        json!({"name": self.name(), "reduction": self.reduction.name(), "delta": self.delta})
    }
}

/// Binary cross-entropy over the last axis, on probabilities or (`from_logits`) logits, with
/// label smoothing `y·(1 - s) + s/2`.
#[derive(Debug, Clone, Default)]
pub struct BinaryCrossentropy {
    /// Predictions are logits.
    pub from_logits: bool,
    /// Label smoothing in `[0, 1]`.
    pub label_smoothing: f64,
    /// The reduction.
    pub reduction: Reduction,
}

impl BinaryCrossentropy {
    /// On probabilities (`from_logits = false`) or logits.
    pub fn new(from_logits: bool) -> BinaryCrossentropy {
        BinaryCrossentropy {
            from_logits,
            ..Default::default()
        }
    }
}

impl Loss for BinaryCrossentropy {
    fn name(&self) -> &'static str {
        "binary_crossentropy"
    }
    fn per_sample(&self, y_true: &Tensor, y_pred: &Tensor) -> Result<Tensor> {
        let mut z = dense_targets(self.name(), y_true, y_pred)?;
        if self.label_smoothing != 0.0 {
            let s = self.label_smoothing;
            z = z
                .mul(&z.scalar_like(1.0 - s)?)?
                .add(&z.scalar_like(0.5 * s)?)?;
        }
        let one = y_pred.scalar_like(1.0)?;
        let per_element = if self.from_logits {
            // max(x, 0) - x·z + log(1 + e^-|x|): stable for any logit.
            let x = y_pred;
            x.relu()?
                .sub(&x.mul(&z)?)?
                .add(&x.abs()?.neg()?.exp()?.log1p()?)?
        } else {
            let eps = y_pred.scalar_like(EPSILON)?;
            let p = y_pred.clip_by_value(&eps, &one.sub(&eps)?)?;
            let a = z.mul(&p.add(&eps)?.log()?)?;
            let b = one.sub(&z)?.mul(&one.sub(&p)?.add(&eps)?.log()?)?;
            a.add(&b)?.neg()?
        };
        per_element.reduce_mean(-1isize, false)
    }
    fn reduction(&self) -> Reduction {
        self.reduction
    }
    fn get_config(&self) -> Value {
        json!({"name": self.name(), "reduction": self.reduction.name(), "from_logits": self.from_logits, "label_smoothing": self.label_smoothing})
    }
}

/// Categorical cross-entropy between one-hot (or soft) targets and predictions over the last
/// axis, with label smoothing `y·(1 - s) + s/classes`.
#[derive(Debug, Clone, Default)]
pub struct CategoricalCrossentropy {
    /// Predictions are logits.
    pub from_logits: bool,
    /// Label smoothing in `[0, 1]`.
    pub label_smoothing: f64,
    /// The reduction.
    pub reduction: Reduction,
}

impl CategoricalCrossentropy {
    /// On probabilities (`from_logits = false`) or logits.
    pub fn new(from_logits: bool) -> CategoricalCrossentropy {
        CategoricalCrossentropy {
            from_logits,
            ..Default::default()
        }
    }
}

/// `-Σ y · log p` over the last axis, `log p` from logits or from clipped, renormalised
/// probabilities (as Keras' backend does).
fn crossentropy_with(y: &Tensor, y_pred: &Tensor, from_logits: bool) -> Result<Tensor> {
    let log_p = if from_logits {
        return softmax_crossentropy_with_logits(y, y_pred);
    } else {
        let p = y_pred.div(&y_pred.reduce_sum(-1isize, true)?)?;
        let eps = p.scalar_like(EPSILON)?;
        p.clip_by_value(&eps, &p.scalar_like(1.0 - EPSILON)?)?
            .log()?
    };
    y.mul(&log_p)?.reduce_sum(-1isize, false)?.neg()
}

/// `-Σ y·log_softmax(logits)` over the last axis, with TF's fused gradient
/// (`SoftmaxCrossEntropyWithLogits`): `(softmax(logits)·Σy - y)·dy` for the logits and
/// `-log_softmax(logits)·dy` for the targets, instead of the gradient of every op of the
/// composition (about a dozen ops fewer per step). The gradient recomputes the log-softmax
/// from the logits, so it is differentiable again (second order), and in a graph it merges
/// with the forward's. (Integer targets have their own fused op,
/// `Tensor::sparse_softmax_cross_entropy_with_logits`.)
fn softmax_crossentropy_with_logits(y: &Tensor, logits: &Tensor) -> Result<Tensor> {
    use ferroflow_autodiff::{custom_gradient, GradFn};
    let loss = custom_gradient(&[logits.clone(), y.clone()], move |xs| {
        let loss = xs[1]
            .mul(&xs[0].log_softmax(-1)?)?
            .reduce_sum(-1isize, false)?
            .neg()?;
        let xs = xs.to_vec();
        let grad: GradFn = std::sync::Arc::new(move |dy: &[Tensor]| {
            let dy = dy[0].expand_dims(-1)?;
            let log_p = xs[0].log_softmax(-1)?;
            let p = log_p.exp()?;
            let y = &xs[1];
            let d_logits = p.mul(&y.reduce_sum(-1isize, true)?)?.sub(y)?.mul(&dy)?;
            Ok(vec![Some(d_logits), Some(log_p.mul(&dy)?.neg()?)])
        });
        Ok((vec![loss], grad))
    })?;
    loss.into_iter()
        .next()
        .ok_or_else(|| Error::invalid("softmax_crossentropy_with_logits", "no loss returned"))
}

impl Loss for CategoricalCrossentropy {
    fn name(&self) -> &'static str {
        "categorical_crossentropy"
    }
    fn per_sample(&self, y_true: &Tensor, y_pred: &Tensor) -> Result<Tensor> {
        let mut y = dense_targets(self.name(), y_true, y_pred)?;
        if self.label_smoothing != 0.0 {
            let s = self.label_smoothing;
            let classes = *y.shape().last().unwrap_or(&1) as f64;
            y = y
                .mul(&y.scalar_like(1.0 - s)?)?
                .add(&y.scalar_like(s / classes)?)?;
        }
        crossentropy_with(&y, y_pred, self.from_logits)
    }
    fn reduction(&self) -> Reduction {
        self.reduction
    }
    fn get_config(&self) -> Value {
        json!({"name": self.name(), "reduction": self.reduction.name(), "from_logits": self.from_logits, "label_smoothing": self.label_smoothing})
    }
}

/// Categorical cross-entropy with integer class targets (`[batch]` or `[batch, 1]`).
/// A target outside `[0, classes)` is an error naming it.
#[derive(Debug, Clone, Default)]
pub struct SparseCategoricalCrossentropy {
    /// Predictions are logits.
    pub from_logits: bool,
    /// The reduction.
    pub reduction: Reduction,
}

impl SparseCategoricalCrossentropy {
    /// On probabilities (`from_logits = false`) or logits.
    pub fn new(from_logits: bool) -> SparseCategoricalCrossentropy {
        SparseCategoricalCrossentropy {
            from_logits,
            ..Default::default()
        }
    }
}

/// Integer class ids from sparse targets: `[batch..]` or `[batch.., 1]`, any numeric dtype,
/// checked to lie in `[0, classes)`.
pub(crate) fn class_ids(y_true: &Tensor, y_pred: &Tensor) -> Result<Tensor> {
    let y = if y_true.rank() == y_pred.rank() && y_true.shape().last() == Some(&1) {
        y_true.squeeze(&[-1])?
    } else {
        y_true.clone()
    };
    if y.shape() != &y_pred.shape()[..y_pred.rank().saturating_sub(1)] {
        return Err(Error::ShapeMismatch {
            op: "sparse categorical targets",
            msg: "targets must have the predictions' shape without the class axis",
            lhs: y_true.shape().to_vec(),
            rhs: y_pred.shape().to_vec(),
        });
    }
    let ids = if y.dtype() == DType::I64 || y.dtype() == DType::I32 {
        y
    } else {
        y.cast(DType::I64)?
    };
    Ok(ids)
}

impl Loss for SparseCategoricalCrossentropy {
    fn name(&self) -> &'static str {
        "sparse_categorical_crossentropy"
    }
    fn per_sample(&self, y_true: &Tensor, y_pred: &Tensor) -> Result<Tensor> {
        check_float(self.name(), y_pred)?;
        let ids = class_ids(y_true, y_pred)?;
        if self.from_logits {
            // TF's fused kernel: the loss and its gradient in one pass, labels checked.
            return Ok(y_pred.sparse_softmax_cross_entropy_with_logits(&ids)?.0);
        }
        let classes = *y_pred.shape().last().unwrap_or(&0);
        // TF's kernel rejects a label outside [0, classes), where one_hot would silently give
        // a zero row. A gather of the labels from `classes` zeros checks them on the device
        // (no read to the host, so a traced step keeps the check); adding its zeros to the
        // targets keeps it in the graph.
        let check = Tensor::zeros(&[classes], y_pred.dtype())?
            .to_device(ids.device())?
            .gather(&ids, 0)?;
        let y = Tensor::one_hot(&ids, classes, 1.0, 0.0, y_pred.dtype())?
            .add(&check.expand_dims(-1)?)?;
        crossentropy_with(&y, y_pred, false)
    }
    fn reduction(&self) -> Reduction {
        self.reduction
    }
    fn get_config(&self) -> Value {
        json!({"name": self.name(), "reduction": self.reduction.name(), "from_logits": self.from_logits})
    }
}

/// A loss by Keras name or alias (`"mse"`, `"categorical_crossentropy"`, ...), on
/// probabilities, with the default reduction.
pub fn get(name: &str) -> Result<Box<dyn Loss>> {
    Ok(match name {
        "mse" | "mean_squared_error" | "MeanSquaredError" => Box::new(MeanSquaredError::new()),
        "mae" | "mean_absolute_error" | "MeanAbsoluteError" => Box::new(MeanAbsoluteError::new()),
        "huber" | "huber_loss" | "Huber" => Box::new(Huber::new(1.0)),
        "kld" | "kl_divergence" | "kullback_leibler_divergence" | "KLDivergence" => {
            Box::new(KLDivergence::new())
        }
        "binary_crossentropy" | "BinaryCrossentropy" => Box::new(BinaryCrossentropy::new(false)),
        "categorical_crossentropy" | "CategoricalCrossentropy" => {
            Box::new(CategoricalCrossentropy::new(false))
        }
        "sparse_categorical_crossentropy" | "SparseCategoricalCrossentropy" => {
            Box::new(SparseCategoricalCrossentropy::new(false))
        }
        other => {
            return Err(Error::invalid(
                "losses::get",
                format!("unknown loss {other:?}"),
            ))
        }
    })
}

/// Rebuilds a loss from [`Loss::get_config`] (`tf.keras.losses.deserialize`).
///
/// ```
/// use ferroflow_keras::losses::{deserialize, Loss, SparseCategoricalCrossentropy};
/// let cfg = SparseCategoricalCrossentropy::new(true).get_config();
/// assert_eq!(deserialize(&cfg)?.get_config(), cfg);
/// # Ok::<(), ferroflow_tensor::Error>(())
/// ```
pub fn deserialize(config: &Value) -> Result<Box<dyn Loss>> {
    let name = config["name"]
        .as_str()
        .ok_or_else(|| Error::format("loss config", "no \"name\""))?;
    let reduction = match config["reduction"].as_str() {
        Some(r) => Reduction::parse(r)?,
        None => Reduction::default(),
    };
    let from_logits = config["from_logits"].as_bool().unwrap_or(false);
    let label_smoothing = config["label_smoothing"].as_f64().unwrap_or(0.0);
    Ok(match name {
        "mean_squared_error" => Box::new(MeanSquaredError { reduction }),
        "mean_absolute_error" => Box::new(MeanAbsoluteError { reduction }),
        "kl_divergence" => Box::new(KLDivergence { reduction }),
        "huber_loss" | "huber" => Box::new(Huber {
            delta: config["delta"].as_f64().unwrap_or(1.0),
            reduction,
        }),
        "binary_crossentropy" => Box::new(BinaryCrossentropy {
            from_logits,
            label_smoothing,
            reduction,
        }),
        "categorical_crossentropy" => Box::new(CategoricalCrossentropy {
            from_logits,
            label_smoothing,
            reduction,
        }),
        "sparse_categorical_crossentropy" => Box::new(SparseCategoricalCrossentropy {
            from_logits,
            reduction,
        }),
        other => {
            return Err(Error::format(
                "loss config",
                format!("unknown loss {other:?}"),
            ))
        }
    })
}
