//! The numeric preprocessing layers of TF 2.4 (`tf.keras.layers.experimental.preprocessing`):
//! Normalization (with `adapt`), Discretization and CategoryEncoding.

use ferroflow_tensor::{Axes, DType, Error, Result, Tensor, Variable};
use serde_json::{json, Value};

use crate::initializers::Initializer;
use crate::layer::{cfg, cfg_usize, Layer, LayerBase};
use crate::layers::core::layer_base;
use crate::layers::expect_inputs;

/// Keras' `backend.epsilon()`: the floor of the standard deviation Normalization divides by.
const EPSILON: f64 = 1e-7;

/// `Normalization`: `(x - mean) / max(√variance, 1e-7)` per feature along `axis`, with the
/// statistics given or learned by [`Normalization::adapt`] (population variance). They are
/// non-trainable weights (`mean`, `variance`, `count`), saved and loaded with the model.
/// An integer input is normalized in the layer's float dtype.
///
/// ```
/// ferroflow::init();
/// use ferroflow_keras::{layers::Normalization, Layer};
/// use ferroflow_tensor::Tensor;
/// let data = Tensor::from_vec(vec![1.0f32, 10.0, 3.0, 30.0], &[2, 2])?;
/// let mut norm = Normalization::new();
/// norm.adapt(&data)?;
/// let y = norm.forward(&data, false)?.to_vec::<f32>()?;
/// assert_eq!(y, vec![-1.0, -1.0, 1.0, 1.0]);
/// # Ok::<(), ferroflow_tensor::Error>(())
/// ```
pub struct Normalization {
    base: LayerBase,
    /// The axes that keep their own statistics (Keras' `axis`, default `[-1]`; empty: one
    /// mean and variance for everything).
    pub axis: Vec<isize>,
    given: Option<(Vec<f64>, Vec<f64>)>,
    state: Option<(Variable, Variable, Variable)>,
}

impl Default for Normalization {
    fn default() -> Self {
        Normalization::new()
    }
}

impl Normalization {
    /// Per-feature statistics along the last axis, to be given or adapted.
    pub fn new() -> Normalization {
        Normalization {
            base: LayerBase::new("normalization", None),
            axis: vec![-1],
            given: None,
            state: None,
        }
    }
    /// Sets the axes that keep their own statistics.
    pub fn axis(mut self, axis: &[isize]) -> Normalization {
        self.axis = axis.to_vec();
        self
    }
    /// Fixed statistics (Keras' `mean=` and `variance=`), one value per feature.
    pub fn with_mean_variance(mut self, mean: &[f64], variance: &[f64]) -> Normalization {
        self.given = Some((mean.to_vec(), variance.to_vec()));
        self
    }
    /// Rebuilds from [`Layer::get_config`] (or Keras' own config).
    pub fn from_config(c: &Value) -> Result<Normalization> {
        if c.get("invert").and_then(Value::as_bool) == Some(true) {
            return Err(Error::format(
                "Normalization config",
                "invert=True is not supported (TF 2.4's Normalization has no such option)",
            ));
        }
        let mut n = Normalization::new();
        n.axis = match c.get("axis") {
            None => vec![-1],
            Some(Value::Null) => vec![],
            Some(v) => match v.as_i64() {
                Some(a) => vec![a as isize],
                None => v
                    .as_array()
                    .and_then(|a| a.iter().map(|x| x.as_i64().map(|x| x as isize)).collect())
                    .ok_or_else(|| {
                        Error::format(
                            "Normalization config",
                            format!("axis must be an integer or a list of them, got {v}"),
                        )
                    })?,
            },
        };
        let list = |k: &str| -> Option<Vec<f64>> {
            let v = c.get(k)?;
            v.as_f64()
                .map(|x| vec![x])
                .or_else(|| v.as_array()?.iter().map(Value::as_f64).collect())
        };
        if let (Some(m), Some(v)) = (list("mean"), list("variance")) {
            n.given = Some((m, v));
        }
        Ok(n)
    }
    /// The kept axes of an input of `rank`, sorted, checked.
    fn kept_axes(&self, rank: usize) -> Result<Vec<usize>> {
        let mut kept = vec![];
        for &a in &self.axis {
            let r = rank as isize;
            if a < -r || a >= r || a == 0 || a == -r {
                return Err(Error::invalid(
                    "Normalization",
                    format!(
                        "axis {a} is not a feature axis of an input of rank {rank} (axis 0 is \
                         the batch)"
                    ),
                ));
            }
            kept.push(if a < 0 { a + r } else { a } as usize);
        }
        kept.sort_unstable();
        kept.dedup();
        Ok(kept)
    }
    /// The statistics' shape for inputs of `shape` (the kept axes' sizes, as Keras stores
    /// them) and the shape they broadcast as (1 on the other axes).
    fn stat_shape(&self, shape: &[usize]) -> Result<(Vec<usize>, Vec<usize>)> {
        let kept = self.kept_axes(shape.len())?;
        let stored = kept.iter().map(|&i| shape[i]).collect();
        let broadcast = (0..shape.len())
            .map(|i| if kept.contains(&i) { shape[i] } else { 1 })
            .collect();
        Ok((stored, broadcast))
    }
    /// Learns the mean and (population) variance of `data` over every axis but `axis`
    /// (Keras' `adapt`), building the layer for data of that shape.
    pub fn adapt(&mut self, data: &Tensor) -> Result<()> {
        self.adapt_batches(std::iter::once(Ok(data.clone())))
    }
    /// [`Normalization::adapt`] over batches (a `Dataset`'s iterator), the statistics
    /// merged as they come (Chan's parallel formula).
    pub fn adapt_batches(
        &mut self,
        batches: impl IntoIterator<Item = Result<Tensor>>,
    ) -> Result<()> {
        let mut acc: Option<(f64, Tensor, Tensor)> = None; // (count, mean, M2)
        for batch in batches {
            let x = batch?.cast(DType::F64)?;
            let kept = self.kept_axes(x.rank())?;
            let reduced: Vec<isize> = (0..x.rank())
                .filter(|i| !kept.contains(i))
                .map(|i| i as isize)
                .collect();
            let n = reduced
                .iter()
                .map(|&i| x.shape()[i as usize])
                .product::<usize>() as f64;
            if n == 0.0 {
                continue;
            }
            let mean = x.reduce_mean(Axes::from(&reduced[..]), true)?;
            let m2 = x
                .sub(&mean)?
                .square()?
                .reduce_sum(Axes::from(&reduced[..]), true)?;
            acc = Some(match acc {
                None => (n, mean, m2),
                Some((na, ma, m2a)) => {
                    if ma.shape() != mean.shape() {
                        return Err(Error::invalid(
                            "Normalization.adapt",
                            format!(
                                "batches disagree on the feature shape: {:?} then {:?}",
                                ma.shape(),
                                mean.shape()
                            ),
                        ));
                    }
                    let total = na + n;
                    let delta = mean.sub(&ma)?;
                    let merged_mean = ma.add(&delta.mul(&delta.scalar_like(n / total)?)?)?;
                    let merged_m2 = m2a
                        .add(&m2)?
                        .add(&delta.square()?.mul(&delta.scalar_like(na * n / total)?)?)?;
                    (total, merged_mean, merged_m2)
                }
            });
        }
        let Some((count, mean, m2)) = acc else {
            return Err(Error::invalid("Normalization.adapt", "no data to adapt to"));
        };
        let variance = m2.div(&m2.scalar_like(count)?)?;
        let (stored, _) = self.stat_shape(mean.shape())?;
        let (m, v, c) = self.weights_for(&stored)?;
        m.assign(&mean.reshape_to(&stored)?.cast(m.dtype())?)?;
        v.assign(&variance.reshape_to(&stored)?.cast(v.dtype())?)?;
        c.assign(&Tensor::scalar_of(count, c.dtype())?)?;
        Ok(())
    }
    /// The (created on first use) statistics weights for statistics of `shape`.
    fn weights_for(&mut self, shape: &[usize]) -> Result<(Variable, Variable, Variable)> {
        if let Some((m, v, c)) = &self.state {
            if m.shape() != shape {
                return Err(Error::invalid(
                    "Normalization",
                    format!(
                        "the statistics have shape {:?}, the input needs {shape:?}",
                        m.shape()
                    ),
                ));
            }
            return Ok((m.clone(), v.clone(), c.clone()));
        }
        let m = self
            .base
            .add_weight("mean", shape, &Initializer::Zeros, false, None)?;
        let v = self
            .base
            .add_weight("variance", shape, &Initializer::Ones, false, None)?;
        // The number of samples adapted to (TF keeps an int64; a float weight here, so it
        // saves with the others).
        let c = self
            .base
            .add_weight("count", &[], &Initializer::Zeros, false, None)?;
        self.base.mark_built();
        self.state = Some((m.clone(), v.clone(), c.clone()));
        if let Some((mean, variance)) = &self.given {
            let n: usize = shape.iter().product();
            let expand = |what: &str, values: &[f64]| -> Result<Tensor> {
                let values = match values.len() {
                    1 => vec![values[0]; n],
                    k if k == n => values.to_vec(),
                    k => {
                        return Err(Error::invalid(
                            "Normalization",
                            format!("{what} has {k} values, the features need {n} (or 1)"),
                        ))
                    }
                };
                Tensor::from_vec(values, shape)?.cast(m.dtype())
            };
            m.assign(&expand("mean", mean)?)?;
            v.assign(&expand("variance", variance)?)?;
        }
        Ok((m, v, c))
    }
}

impl Layer for Normalization {
    layer_base!("Normalization");
    fn build(&mut self, input_shapes: &[Vec<usize>]) -> Result<()> {
        let shape = input_shapes
            .first()
            .ok_or_else(|| Error::invalid("Normalization", "needs an input shape to build"))?;
        let (stored, _) = self.stat_shape(shape)?;
        self.weights_for(&stored).map(|_| ())
    }
    fn call(&mut self, inputs: &[Tensor], _training: bool) -> Result<Vec<Tensor>> {
        expect_inputs(self, inputs, 1)?;
        let x = &inputs[0];
        let (stored, broadcast) = self.stat_shape(x.shape())?;
        let (m, v, _) = self.weights_for(&stored)?;
        let dtype = if x.dtype().is_float() {
            x.dtype()
        } else {
            self.base.compute_dtype()
        };
        let x = x.cast(dtype)?;
        let mean = crate::mixed_precision::read_variable(&m)?
            .cast(dtype)?
            .reshape_to(&broadcast)?;
        let var = crate::mixed_precision::read_variable(&v)?
            .cast(dtype)?
            .reshape_to(&broadcast)?;
        let std = var.sqrt()?.maximum(&var.scalar_like(EPSILON)?)?;
        Ok(vec![x.sub(&mean)?.div(&std)?])
    }
    fn get_config(&self) -> Value {
        let mut c = json!({ "axis": self.axis });
        if let Some((m, v)) = &self.given {
            c["mean"] = json!(m);
            c["variance"] = json!(v);
        }
        c
    }
}

/// `Discretization`: the index of the bucket each value falls in, `bin_boundaries` sorted
/// ascending (`[b0, b1]` gives buckets `x < b0`, `b0 ≤ x < b1`, `b1 ≤ x`), as int32 (TF's
/// `Bucketize`).
///
/// ```
/// ferroflow::init();
/// use ferroflow_keras::{layers::Discretization, Layer};
/// use ferroflow_tensor::Tensor;
/// let mut d = Discretization::new(&[0.0, 1.0, 2.0])?;
/// let x = Tensor::from_vec(vec![-1.5f32, 1.0, 0.4, 5.0], &[1, 4])?;
/// assert_eq!(d.forward(&x, false)?.to_vec::<i32>()?, vec![0, 2, 1, 3]);
/// # Ok::<(), ferroflow_tensor::Error>(())
/// ```
pub struct Discretization {
    base: LayerBase,
    bin_boundaries: Vec<f64>,
}

impl Discretization {
    /// Buckets split at `bin_boundaries` (finite, ascending).
    pub fn new(bin_boundaries: &[f64]) -> Result<Discretization> {
        if bin_boundaries.iter().any(|b| !b.is_finite())
            || bin_boundaries.windows(2).any(|w| w[0] > w[1])
        {
            return Err(Error::invalid(
                "Discretization",
                format!(
                    "bin_boundaries must be finite and sorted ascending, got {bin_boundaries:?}"
                ),
            ));
        }
        Ok(Discretization {
            base: LayerBase::new("discretization", None),
            bin_boundaries: bin_boundaries.to_vec(),
        })
    }
    /// The boundaries.
    pub fn bin_boundaries(&self) -> &[f64] {
        &self.bin_boundaries
    }
    /// Rebuilds from [`Layer::get_config`] (or Keras' own config; only `output_mode="int"`).
    pub fn from_config(c: &Value) -> Result<Discretization> {
        if let Some(mode) = c.get("output_mode").and_then(Value::as_str) {
            if mode != "int" {
                return Err(Error::format(
                    "Discretization config",
                    format!("output_mode {mode:?} is not supported (ferroflow has \"int\")"),
                ));
            }
        }
        let b = cfg(c, "Discretization", "bin_boundaries")?;
        let bounds: Vec<f64> = b
            .as_array()
            .and_then(|a| a.iter().map(Value::as_f64).collect())
            .ok_or_else(|| {
                Error::format(
                    "Discretization config",
                    format!("bin_boundaries must be a list of numbers, got {b}"),
                )
            })?;
        Discretization::new(&bounds)
    }
}

impl Layer for Discretization {
    layer_base!("Discretization");
    fn call(&mut self, inputs: &[Tensor], _training: bool) -> Result<Vec<Tensor>> {
        expect_inputs(self, inputs, 1)?;
        let x = inputs[0].cast(DType::F64)?;
        let n = self.bin_boundaries.len();
        if n == 0 {
            return x.zeros_like()?.cast(DType::I32).map(|t| vec![t]);
        }
        let mut shape = vec![1usize; x.rank()];
        shape.push(n);
        let bounds = Tensor::from_vec(self.bin_boundaries.clone(), &shape)?;
        let above = x
            .expand_dims(-1)?
            .greater_equal(&bounds)?
            .cast(DType::I32)?
            .reduce_sum(Axes::from(-1), false)?;
        Ok(vec![above])
    }
    fn get_config(&self) -> Value {
        json!({ "bin_boundaries": self.bin_boundaries, "output_mode": "int" })
    }
}

/// What [`CategoryEncoding`] outputs per sample.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum CategoryOutput {
    /// One row per value (`one_hot`; inputs of one value per sample).
    OneHot,
    /// 1 for each token present (`multi_hot`, TF 2.4's `binary`).
    MultiHot,
    /// How often each token occurs (`count`).
    Count,
}

impl CategoryOutput {
    fn name(self) -> &'static str {
        match self {
            CategoryOutput::OneHot => "one_hot",
            CategoryOutput::MultiHot => "multi_hot",
            CategoryOutput::Count => "count",
        }
    }
}

/// `CategoryEncoding`: integer tokens in `[0, num_tokens)` as float32 one-hot, multi-hot or
/// count vectors. A token outside the range is an error naming it.
///
/// ```
/// ferroflow::init();
/// use ferroflow_keras::{layers::{CategoryEncoding, CategoryOutput}, Layer};
/// use ferroflow_tensor::Tensor;
/// let mut e = CategoryEncoding::new(4, CategoryOutput::Count);
/// let x = Tensor::from_vec(vec![0i64, 1, 1, 3, 3, 3], &[2, 3])?;
/// assert_eq!(e.forward(&x, false)?.to_vec::<f32>()?, vec![1.0, 2.0, 0.0, 0.0, 0.0, 0.0, 0.0, 3.0]);
/// # Ok::<(), ferroflow_tensor::Error>(())
/// ```
pub struct CategoryEncoding {
    base: LayerBase,
    /// The number of tokens (the output's last dimension).
    pub num_tokens: usize,
    /// What is output per sample.
    pub output_mode: CategoryOutput,
}

impl CategoryEncoding {
    /// Encodes tokens in `[0, num_tokens)`.
    pub fn new(num_tokens: usize, output_mode: CategoryOutput) -> CategoryEncoding {
        CategoryEncoding {
            base: LayerBase::new("category_encoding", None),
            num_tokens,
            output_mode,
        }
    }
    /// Rebuilds from [`Layer::get_config`] (or Keras' own config; TF 2.4's `binary` is
    /// `multi_hot`, its `max_tokens` is `num_tokens`).
    pub fn from_config(c: &Value) -> Result<CategoryEncoding> {
        let num_tokens = match c.get("num_tokens").filter(|v| !v.is_null()) {
            Some(_) => cfg_usize(c, "CategoryEncoding", "num_tokens")?,
            None => cfg_usize(c, "CategoryEncoding", "max_tokens")?,
        };
        let mode = match c.get("output_mode").and_then(Value::as_str) {
            None | Some("multi_hot") | Some("binary") => CategoryOutput::MultiHot,
            Some("one_hot") => CategoryOutput::OneHot,
            Some("count") => CategoryOutput::Count,
            Some(other) => {
                return Err(Error::format(
                    "CategoryEncoding config",
                    format!("output_mode {other:?} is not supported (one_hot, multi_hot, count)"),
                ))
            }
        };
        if c.get("sparse").and_then(Value::as_bool) == Some(true) {
            return Err(Error::format(
                "CategoryEncoding config",
                "sparse outputs are not supported (ferroflow tensors are dense)",
            ));
        }
        Ok(CategoryEncoding::new(num_tokens, mode))
    }
}

impl Layer for CategoryEncoding {
    /// Computes on the host (reads its input's values): a model holding it runs eagerly.
    fn traceable(&self) -> bool {
        false
    }
    layer_base!("CategoryEncoding");
    fn call(&mut self, inputs: &[Tensor], _training: bool) -> Result<Vec<Tensor>> {
        expect_inputs(self, inputs, 1)?;
        let x = &inputs[0];
        if x.dtype().is_float() || x.dtype() == DType::Bool {
            return Err(Error::invalid(
                "CategoryEncoding",
                format!("needs integer tokens, got {}", x.dtype()),
            ));
        }
        let x = x.cast(DType::I64)?;
        let values = x.to_vec::<i64>()?;
        if let Some(bad) = values
            .iter()
            .find(|&&v| v < 0 || v as u64 >= self.num_tokens as u64)
        {
            return Err(Error::invalid(
                "CategoryEncoding",
                format!(
                    "input values must be in the range 0 <= values < num_tokens with \
                     num_tokens={}, got {bad}",
                    self.num_tokens
                ),
            ));
        }
        // One value per sample ([batch] or [batch, 1]) or several ([batch, n]).
        let x = match x.rank() {
            0 => x.reshape(&[1, 1])?,
            1 => x.expand_dims(-1)?,
            2 => x,
            r => {
                return Err(Error::invalid(
                    "CategoryEncoding",
                    format!("expects inputs of rank 1 or 2, got rank {r}"),
                ))
            }
        };
        let hot = Tensor::one_hot(&x, self.num_tokens, 1.0, 0.0, DType::F32)?;
        let out = match self.output_mode {
            CategoryOutput::OneHot => {
                if x.shape()[1] != 1 {
                    return Err(Error::invalid(
                        "CategoryEncoding",
                        format!(
                            "one_hot needs one value per sample, got shape {:?}",
                            inputs[0].shape()
                        ),
                    ));
                }
                hot.reshape(&[x.shape()[0] as isize, self.num_tokens as isize])?
            }
            CategoryOutput::MultiHot => hot.reduce_max(Axes::from(1), false)?,
            CategoryOutput::Count => hot.reduce_sum(Axes::from(1), false)?,
        };
        Ok(vec![out])
    }
    fn get_config(&self) -> Value {
        json!({ "num_tokens": self.num_tokens, "output_mode": self.output_mode.name(), "sparse": false })
    }
}
