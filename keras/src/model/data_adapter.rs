//! What `fit`, `evaluate` and `predict` accept (Keras' data adapters): arrays as [`Data`],
//! datasets of anything [`FitBatch`], both turned into a `Dataset<Batch>`.

use std::sync::{Arc, Mutex};

use ferroflow_data::Dataset;
use ferroflow_tensor::random::Philox;
use ferroflow_tensor::{random, DType, Error, Result, Tensor};

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
    pub(super) fn samples(&self, method: &'static str, what: &str) -> Result<usize> {
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
    pub(super) fn take(&self, idx: &Tensor) -> Result<Vec<Tensor>> {
        take_rows(&self.0, idx)
    }
    pub(super) fn range(&self, start: usize, end: usize) -> Result<Data> {
        let idx = Tensor::from_vec(
            (start as i64..end as i64).collect::<Vec<_>>(),
            &[end - start],
        )?;
        Ok(Data(self.take(&idx)?))
    }
}

/// The rows `idx` selects of each of `arrays`, gathered where each lives: arrays on one
/// device as one `gather_group` (one kernel on a GPU: a batch's inputs and targets).
fn take_rows(arrays: &[Tensor], idx: &Tensor) -> Result<Vec<Tensor>> {
    let Some(first) = arrays.first() else {
        return Ok(vec![]);
    };
    if arrays.iter().all(|t| t.device() == first.device()) {
        return Tensor::gather_group(arrays, &idx.to_device(first.device())?, 0);
    }
    arrays
        .iter()
        .map(|t| t.gather(&idx.to_device(t.device())?, 0))
        .collect()
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

/// Validation data of [`FitConfig`](super::FitConfig): arrays, batched with `fit`'s batch size, or a dataset
/// of batches.
pub enum ValidationData {
    /// Inputs and targets with the samples along dimension 0.
    Arrays(Data, Data),
    /// A dataset of `(x, y)` batches.
    Batches(Dataset<Batch>),
}

pub(super) fn batches_of<B: FitBatch>(data: &Dataset<B>) -> Dataset<Batch> {
    data.map(|b: B| Ok(b.into_batch()))
}

/// Arrays as a dataset of batches (Keras' array data adapter): `batch_size` samples per
/// batch, in a new random order each pass when `shuffle_seed` is given.
pub(super) fn array_batches(
    x: Data,
    y: Data,
    batch_size: usize,
    shuffle_seed: Option<u64>,
) -> Dataset<Batch> {
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
            let arrays: Vec<Tensor> = x.0.iter().chain(&y.0).cloned().collect();
            let mut rows = take_rows(&arrays, &idx)?;
            let targets = rows.split_off(x.0.len());
            Ok((rows, targets))
        })
    })
}

/// A seed from the global stateful generator (so `set_seed` makes shuffling reproducible).
pub(super) fn random_seed() -> Result<u64> {
    let t = random::uniform(&[1], 0.0, i32::MAX as f64, DType::I64, None)?;
    Ok(t.to_vec::<i64>()?[0] as u64)
}
