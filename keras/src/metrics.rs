//! Stateful metrics (`tf.keras.metrics`): `update_state`, `result`, `reset_state`.
//!
//! Metrics accumulate in f64 on the host; each update reads its batch's per-sample values
//! back from the device once.
//!
//! ```
//! ferroflow::init();
//! use ferroflow_keras::metrics::{Metric, SparseCategoricalAccuracy};
//! use ferroflow_tensor::Tensor;
//! let mut m = SparseCategoricalAccuracy::new();
//! let y_true = Tensor::from_vec(vec![2i64, 1], &[2])?;
//! let y_pred = Tensor::from_vec(vec![0.1f32, 0.6, 0.3, 0.05, 0.95, 0.0], &[2, 3])?;
//! m.update_state(&y_true, &y_pred, None)?;
//! assert_eq!(m.result(), 0.5);
//! # Ok::<(), ferroflow_tensor::Error>(())
//! ```

use ferroflow_tensor::{DType, Error, Result, Tensor};

use crate::losses::class_ids;

/// A stateful metric.
pub trait Metric: Send {
    /// The name shown in logs (`"accuracy"`).
    fn name(&self) -> &str;
    /// Accumulates one batch; `sample_weight` (per sample) weights each sample.
    fn update_state(
        &mut self,
        y_true: &Tensor,
        y_pred: &Tensor,
        sample_weight: Option<&Tensor>,
    ) -> Result<()>;
    /// The value so far (0 before any update, as Keras' `div_no_nan`).
    fn result(&self) -> f64;
    /// Forgets everything (start of each epoch).
    fn reset_state(&mut self);
    /// The sums the metric has accumulated, so that the states of several workers add up
    /// to the state of all their data (a distribution strategy sums them across workers);
    /// `None` for a metric whose state does not add up that way.
    fn state(&self) -> Option<Vec<f64>> {
        None
    }
    /// Replaces the state with one [`Metric::state`] gave (summed across workers).
    fn set_state(&mut self, state: &[f64]) -> Result<()> {
        let _ = state;
        Err(Error::invalid(
            "Metric.set_state",
            format!("metric {:?} does not expose its state", self.name()),
        ))
    }
}

fn check_state_len(name: &str, want: usize, got: &[f64]) -> Result<()> {
    if want != got.len() {
        return Err(Error::invalid(
            "Metric.set_state",
            format!(
                "metric {name:?} holds {want} numbers, the state given has {}",
                got.len()
            ),
        ));
    }
    Ok(())
}

/// Weighted running mean of per-sample values: the state of every mean-style metric.
#[derive(Debug, Clone, Default)]
struct MeanState {
    total: f64,
    count: f64,
}

impl MeanState {
    fn update(&mut self, values: &[f64], weights: Option<&[f64]>) -> Result<()> {
        match weights {
            None => {
                self.total += values.iter().sum::<f64>();
                self.count += values.len() as f64;
            }
            Some(w) if w.len() == values.len() => {
                self.total += values.iter().zip(w).map(|(v, w)| v * w).sum::<f64>();
                self.count += w.iter().sum::<f64>();
            }
            Some(w) => {
                return Err(Error::invalid(
                    "Metric.update_state",
                    format!("{} sample weights for {} samples", w.len(), values.len()),
                ))
            }
        }
        Ok(())
    }
    fn result(&self) -> f64 {
        if self.count == 0.0 {
            0.0
        } else {
            self.total / self.count
        }
    }
    fn state(&self) -> Option<Vec<f64>> {
        Some(vec![self.total, self.count])
    }
    fn set_state(&mut self, name: &str, state: &[f64]) -> Result<()> {
        check_state_len(name, 2, state)?;
        (self.total, self.count) = (state[0], state[1]);
        Ok(())
    }
}

fn weights_of(sample_weight: Option<&Tensor>) -> Result<Option<Vec<f64>>> {
    sample_weight.map(|w| w.to_f64_vec()).transpose()
}

/// `tf.keras.metrics.Mean`: the weighted mean of every value passed to
/// [`Mean::update`] (for `Metric::update_state`, of `y_pred`).
#[derive(Debug, Clone)]
pub struct Mean {
    name: String,
    state: MeanState,
}

impl Mean {
    /// A mean called `name`.
    pub fn new(name: &str) -> Mean {
        Mean {
            name: name.into(),
            state: MeanState::default(),
        }
    }
    /// Adds `value` (every element) with weight `weight` each.
    pub fn update(&mut self, value: f64, weight: f64) {
        self.state.total += value * weight;
        self.state.count += weight;
    }
}

impl Metric for Mean {
    fn name(&self) -> &str {
        &self.name
    }
    fn update_state(
        &mut self,
        _y_true: &Tensor,
        y_pred: &Tensor,
        w: Option<&Tensor>,
    ) -> Result<()> {
        self.state
            .update(&y_pred.to_f64_vec()?, weights_of(w)?.as_deref())
    }
    fn result(&self) -> f64 {
        self.state.result()
    }
    fn reset_state(&mut self) {
        self.state = MeanState::default();
    }
    fn state(&self) -> Option<Vec<f64>> {
        self.state.state()
    }
    fn set_state(&mut self, state: &[f64]) -> Result<()> {
        self.state.set_state(&self.name, state)
    }
}

/// A metric that is the mean of a per-sample function (Keras' `MeanMetricWrapper`).
macro_rules! mean_metric {
    ($(#[$m:meta])* $name:ident, $default:literal, |$t:ident, $p:ident| $body:expr) => {
        $(#[$m])*
        #[derive(Debug, Clone)]
        pub struct $name {
            name: String,
            state: MeanState,
        }
        impl $name {
            /// The metric under its Keras name.
            pub fn new() -> $name {
                $name { name: $default.into(), state: MeanState::default() }
            }
            /// The metric under another name.
            pub fn named(name: &str) -> $name {
                $name { name: name.into(), state: MeanState::default() }
            }
        }
        impl Default for $name {
            fn default() -> Self {
                $name::new()
            }
        }
        impl Metric for $name {
            fn name(&self) -> &str {
                &self.name
            }
            fn update_state(&mut self, $t: &Tensor, $p: &Tensor, w: Option<&Tensor>) -> Result<()> {
                let values: Tensor = $body?;
                self.state.update(&values.to_f64_vec()?, weights_of(w)?.as_deref())
            }
            fn result(&self) -> f64 {
                self.state.result()
            }
            fn reset_state(&mut self) {
                self.state = MeanState::default();
            }
            fn state(&self) -> Option<Vec<f64>> {
                self.state.state()
            }
            fn set_state(&mut self, state: &[f64]) -> Result<()> {
                self.state.set_state(&self.name, state)
            }
        }
    };
}

fn same_shape(op: &'static str, a: &Tensor, b: &Tensor) -> Result<()> {
    if a.shape() != b.shape() {
        return Err(Error::ShapeMismatch {
            op,
            msg: "y_true and y_pred shapes differ",
            lhs: a.shape().to_vec(),
            rhs: b.shape().to_vec(),
        });
    }
    Ok(())
}

/// Whether `a` equals `b`, per element (bool; the metric's mean reads it as 1.0 / 0.0,
/// with no cast to a float tensor first: one kernel fewer per step on a GPU).
fn matches(a: &Tensor, b: &Tensor) -> Result<Tensor> {
    a.equal(b)
}

mean_metric!(
    /// `tf.keras.metrics.Accuracy`: how often `y_pred` equals `y_true` exactly.
    Accuracy, "accuracy", |y_true, y_pred| {
        same_shape("Accuracy", y_true, y_pred)?;
        matches(&y_true.cast(y_pred.dtype())?, y_pred)
    }
);

mean_metric!(
    /// `tf.keras.metrics.BinaryAccuracy` (threshold 0.5), averaged over the last axis.
    BinaryAccuracy, "binary_accuracy", |y_true, y_pred| {
        let y = if y_true.rank() + 1 == y_pred.rank() { y_true.expand_dims(-1)? } else { y_true.clone() };
        same_shape("BinaryAccuracy", &y, y_pred)?;
        let pred = y_pred.greater(&y_pred.scalar_like(0.5)?)?.cast(DType::F32)?;
        matches(&y.cast(DType::F32)?, &pred)?.cast(DType::F32)?.reduce_mean(-1isize, false)
    }
);

mean_metric!(
    /// `tf.keras.metrics.CategoricalAccuracy`: `argmax(y_pred) == argmax(y_true)`.
    CategoricalAccuracy, "categorical_accuracy", |y_true, y_pred| {
        same_shape("CategoricalAccuracy", y_true, y_pred)?;
        matches(&y_true.argmax(-1)?, &y_pred.argmax(-1)?)
    }
);

mean_metric!(
    /// `tf.keras.metrics.SparseCategoricalAccuracy`: `argmax(y_pred) == y_true`.
    SparseCategoricalAccuracy, "sparse_categorical_accuracy", |y_true, y_pred| {
        let ids = class_ids(y_true, y_pred)?;
        let am = y_pred.argmax(-1)?;
        matches(&ids.cast(am.dtype())?, &am)
    }
);

mean_metric!(
    /// `tf.keras.metrics.MeanSquaredError`: the mean of `(y_true - y_pred)²` per sample.
    MeanSquaredError, "mean_squared_error", |y_true, y_pred| {
        let y = y_true.cast(y_pred.dtype())?;
        same_shape("MeanSquaredError", &y, y_pred)?;
        y_pred.squared_difference(&y)?.reduce_mean(-1isize, false)
    }
);

mean_metric!(
    /// `tf.keras.metrics.MeanAbsoluteError`: the mean of `|y_true - y_pred|` per sample.
    MeanAbsoluteError, "mean_absolute_error", |y_true, y_pred| {
        let y = y_true.cast(y_pred.dtype())?;
        same_shape("MeanAbsoluteError", &y, y_pred)?;
        y_pred.sub(&y)?.abs()?.reduce_mean(-1isize, false)
    }
);

/// `tf.keras.metrics.TopKCategoricalAccuracy` (`sparse`: `SparseTopKCategoricalAccuracy`):
/// the true class is among the `k` highest predictions (ties at the boundary count as in,
/// as TF's `in_top_k`).
#[derive(Debug, Clone)]
pub struct TopKCategoricalAccuracy {
    name: String,
    /// How many top predictions count.
    pub k: usize,
    /// Integer targets instead of one-hot.
    pub sparse: bool,
    state: MeanState,
}

impl TopKCategoricalAccuracy {
    /// Top-`k` accuracy with one-hot (`sparse = false`) or integer targets.
    pub fn new(k: usize, sparse: bool) -> TopKCategoricalAccuracy {
        TopKCategoricalAccuracy {
            name: if sparse {
                "sparse_top_k_categorical_accuracy"
            } else {
                "top_k_categorical_accuracy"
            }
            .into(),
            k,
            sparse,
            state: MeanState::default(),
        }
    }
}

impl Metric for TopKCategoricalAccuracy {
    fn name(&self) -> &str {
        &self.name
    }
    fn update_state(&mut self, y_true: &Tensor, y_pred: &Tensor, w: Option<&Tensor>) -> Result<()> {
        let ids = if self.sparse {
            class_ids(y_true, y_pred)?
        } else {
            same_shape("TopKCategoricalAccuracy", y_true, y_pred)?;
            y_true.argmax(-1)?
        };
        let classes = *y_pred.shape().last().unwrap_or(&0);
        let onehot = Tensor::one_hot(&ids, classes, 1.0, 0.0, y_pred.dtype())?;
        let true_score = y_pred.mul(&onehot)?.reduce_sum(-1isize, true)?;
        let above = y_pred
            .greater(&true_score)?
            .cast(DType::F32)?
            .reduce_sum(-1isize, false)?;
        let hit = above
            .less(&above.scalar_like(self.k as f64)?)?
            .cast(DType::F32)?;
        self.state
            .update(&hit.to_f64_vec()?, weights_of(w)?.as_deref())
    }
    fn result(&self) -> f64 {
        self.state.result()
    }
    fn reset_state(&mut self) {
        self.state = MeanState::default();
    }
    fn state(&self) -> Option<Vec<f64>> {
        self.state.state()
    }
    fn set_state(&mut self, state: &[f64]) -> Result<()> {
        self.state.set_state(&self.name, state)
    }
}

/// Flattened (y_true as 0/1, y_pred) pairs on the host, checked for matching sizes.
fn binary_pairs(
    op: &'static str,
    y_true: &Tensor,
    y_pred: &Tensor,
) -> Result<(Vec<f64>, Vec<f64>)> {
    let t = y_true.to_f64_vec()?;
    let p = y_pred.to_f64_vec()?;
    if t.len() != p.len() {
        return Err(Error::ShapeMismatch {
            op,
            msg: "y_true and y_pred hold different numbers of values",
            lhs: y_true.shape().to_vec(),
            rhs: y_pred.shape().to_vec(),
        });
    }
    Ok((t, p))
}

/// Calls `f(is_positive, score, weight)` for every (target, prediction) pair of a batch.
fn for_each_pair(
    op: &'static str,
    y_true: &Tensor,
    y_pred: &Tensor,
    w: Option<&Tensor>,
    mut f: impl FnMut(bool, f64, f64),
) -> Result<()> {
    let (t, p) = binary_pairs(op, y_true, y_pred)?;
    let w = weights_of(w)?;
    for (i, (t, p)) in t.iter().zip(&p).enumerate() {
        let wi = w.as_ref().and_then(|w| w.get(i)).copied().unwrap_or(1.0);
        f(*t > 0.5, *p, wi);
    }
    Ok(())
}

/// Which ratio a [`ThresholdRate`] reports.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RateKind {
    /// `tp / (tp + fp)` (`tf.keras.metrics.Precision`).
    Precision,
    /// `tp / (tp + fn)` (`tf.keras.metrics.Recall`).
    Recall,
}

/// `tf.keras.metrics.Precision` and `Recall` at one threshold (0.5): predictions above it
/// count as positive.
#[derive(Debug, Clone)]
pub struct ThresholdRate {
    /// Which ratio.
    pub kind: RateKind,
    /// Predictions above it count as positive.
    pub threshold: f64,
    /// True positives.
    tp: f64,
    /// False positives (precision) or false negatives (recall).
    misses: f64,
}

impl ThresholdRate {
    /// Precision at threshold 0.5.
    pub fn precision() -> ThresholdRate {
        ThresholdRate::new(RateKind::Precision)
    }
    /// Recall at threshold 0.5.
    pub fn recall() -> ThresholdRate {
        ThresholdRate::new(RateKind::Recall)
    }
    fn new(kind: RateKind) -> ThresholdRate {
        ThresholdRate {
            kind,
            threshold: 0.5,
            tp: 0.0,
            misses: 0.0,
        }
    }
}

impl Metric for ThresholdRate {
    fn name(&self) -> &str {
        match self.kind {
            RateKind::Precision => "precision",
            RateKind::Recall => "recall",
        }
    }
    fn update_state(&mut self, y_true: &Tensor, y_pred: &Tensor, w: Option<&Tensor>) -> Result<()> {
        let (th, kind) = (self.threshold, self.kind);
        let (tp, misses) = (&mut self.tp, &mut self.misses);
        for_each_pair("Precision/Recall", y_true, y_pred, w, |positive, p, wi| {
            let predicted = p > th;
            match (kind, positive, predicted) {
                (_, true, true) => *tp += wi,
                (RateKind::Precision, false, true) | (RateKind::Recall, true, false) => {
                    *misses += wi
                }
                _ => {}
            }
        })
    }
    fn result(&self) -> f64 {
        let d = self.tp + self.misses;
        if d == 0.0 {
            0.0
        } else {
            self.tp / d
        }
    }
    fn reset_state(&mut self) {
        self.tp = 0.0;
        self.misses = 0.0;
    }
    fn state(&self) -> Option<Vec<f64>> {
        Some(vec![self.tp, self.misses])
    }
    fn set_state(&mut self, state: &[f64]) -> Result<()> {
        check_state_len(self.name(), 2, state)?;
        (self.tp, self.misses) = (state[0], state[1]);
        Ok(())
    }
}

/// `tf.keras.metrics.AUC`: area under the ROC curve from confusion counts at
/// `num_thresholds` (200) evenly spaced thresholds, summed with the trapezoidal rule
/// (Keras' default `curve="ROC"`, `summation_method="interpolation"`).
#[derive(Debug, Clone)]
pub struct Auc {
    thresholds: Vec<f64>,
    tp: Vec<f64>,
    fp: Vec<f64>,
    tn: Vec<f64>,
    fn_: Vec<f64>,
}

impl Auc {
    /// ROC AUC over `num_thresholds` thresholds (at least 2; Keras uses 200).
    pub fn new(num_thresholds: usize) -> Result<Auc> {
        if num_thresholds < 2 {
            return Err(Error::invalid(
                "AUC",
                format!("num_thresholds must be > 1, got {num_thresholds}"),
            ));
        }
        let n = num_thresholds;
        let eps = 1e-7;
        let thresholds: Vec<f64> = (0..n)
            .map(|i| match i {
                0 => -eps,
                i if i == n - 1 => 1.0 + eps,
                i => i as f64 / (n - 1) as f64,
            })
            .collect();
        Ok(Auc {
            tp: vec![0.0; n],
            fp: vec![0.0; n],
            tn: vec![0.0; n],
            fn_: vec![0.0; n],
            thresholds,
        })
    }
}

impl Metric for Auc {
    fn name(&self) -> &str {
        "auc"
    }
    fn update_state(&mut self, y_true: &Tensor, y_pred: &Tensor, w: Option<&Tensor>) -> Result<()> {
        let Auc {
            thresholds,
            tp,
            fp,
            tn,
            fn_,
        } = self;
        for_each_pair("AUC", y_true, y_pred, w, |positive, p, wi| {
            for (j, th) in thresholds.iter().enumerate() {
                match (positive, p > *th) {
                    (true, true) => tp[j] += wi,
                    (true, false) => fn_[j] += wi,
                    (false, true) => fp[j] += wi,
                    (false, false) => tn[j] += wi,
                }
            }
        })
    }
    fn result(&self) -> f64 {
        let ratio = |a: f64, b: f64| if a + b == 0.0 { 0.0 } else { a / (a + b) };
        let n = self.thresholds.len();
        let x: Vec<f64> = (0..n).map(|i| ratio(self.fp[i], self.tn[i])).collect();
        let y: Vec<f64> = (0..n).map(|i| ratio(self.tp[i], self.fn_[i])).collect();
        (0..n - 1)
            .map(|i| (x[i] - x[i + 1]) * (y[i] + y[i + 1]) / 2.0)
            .sum()
    }
    fn reset_state(&mut self) {
        for v in [&mut self.tp, &mut self.fp, &mut self.tn, &mut self.fn_] {
            v.iter_mut().for_each(|x| *x = 0.0);
        }
    }
    fn state(&self) -> Option<Vec<f64>> {
        Some(
            [&self.tp, &self.fp, &self.tn, &self.fn_]
                .into_iter()
                .flatten()
                .copied()
                .collect(),
        )
    }
    fn set_state(&mut self, state: &[f64]) -> Result<()> {
        let n = self.tp.len();
        check_state_len("auc", 4 * n, state)?;
        for (i, v) in [&mut self.tp, &mut self.fp, &mut self.tn, &mut self.fn_]
            .into_iter()
            .enumerate()
        {
            v.copy_from_slice(&state[i * n..(i + 1) * n]);
        }
        Ok(())
    }
}

/// Keras' `"accuracy"`: becomes binary, categorical or sparse categorical accuracy on the
/// first batch, from the shapes (as `compile` resolves it in TF).
#[derive(Default)]
pub struct AutoAccuracy {
    resolved: Option<Box<dyn Metric>>,
    name: String,
}

impl AutoAccuracy {
    /// `"accuracy"`, resolved on first use.
    pub fn new(name: &str) -> AutoAccuracy {
        AutoAccuracy {
            resolved: None,
            name: name.into(),
        }
    }
}

impl Metric for AutoAccuracy {
    fn name(&self) -> &str {
        &self.name
    }
    fn update_state(&mut self, y_true: &Tensor, y_pred: &Tensor, w: Option<&Tensor>) -> Result<()> {
        if self.resolved.is_none() {
            let p_last = y_pred.shape().last().copied().unwrap_or(1);
            let t_last = y_true.shape().last().copied().unwrap_or(1);
            let sparse = y_true.rank() < y_pred.rank() || (t_last == 1 && p_last > 1);
            self.resolved = Some(if p_last == 1 {
                Box::new(BinaryAccuracy::named(&self.name))
            } else if sparse {
                Box::new(SparseCategoricalAccuracy::named(&self.name))
            } else {
                Box::new(CategoricalAccuracy::named(&self.name))
            });
        }
        self.resolved
            .as_mut()
            .expect("resolved just above")
            .update_state(y_true, y_pred, w)
    }
    fn result(&self) -> f64 {
        self.resolved.as_ref().map_or(0.0, |m| m.result())
    }
    fn reset_state(&mut self) {
        if let Some(m) = &mut self.resolved {
            m.reset_state();
        }
    }
    fn state(&self) -> Option<Vec<f64>> {
        match &self.resolved {
            Some(m) => m.state(),
            None => Some(vec![]),
        }
    }
    fn set_state(&mut self, state: &[f64]) -> Result<()> {
        match &mut self.resolved {
            Some(m) => m.set_state(state),
            None => check_state_len(&self.name, 0, state),
        }
    }
}

/// A metric by Keras name (`"accuracy"`, `"sparse_categorical_accuracy"`, `"auc"`, ...).
pub fn get(name: &str) -> Result<Box<dyn Metric>> {
    Ok(match name {
        "accuracy" | "acc" => Box::new(AutoAccuracy::new(name)),
        "binary_accuracy" => Box::new(BinaryAccuracy::new()),
        "categorical_accuracy" => Box::new(CategoricalAccuracy::new()),
        "sparse_categorical_accuracy" => Box::new(SparseCategoricalAccuracy::new()),
        "top_k_categorical_accuracy" => Box::new(TopKCategoricalAccuracy::new(5, false)),
        "sparse_top_k_categorical_accuracy" => Box::new(TopKCategoricalAccuracy::new(5, true)),
        "precision" => Box::new(ThresholdRate::precision()),
        "recall" => Box::new(ThresholdRate::recall()),
        "auc" => Box::new(Auc::new(200)?),
        "mse" | "mean_squared_error" => Box::new(MeanSquaredError::named(name)),
        "mae" | "mean_absolute_error" => Box::new(MeanAbsoluteError::named(name)),
        other => {
            return Err(Error::invalid(
                "metrics::get",
                format!("unknown metric {other:?}"),
            ))
        }
    })
}
