//! Input under a strategy: [`DistributedDataset`], [`InputContext`], [`AutoShardPolicy`].

use crate::strategy::Strategy;
use crate::values::PerReplica;
use ferroflow_data::{Dataset, DatasetIter, Structure};
use ferroflow_tensor::{Device, Error, Result, Tensor};

/// How a dataset of global batches is divided among the workers (TF's
/// `tf.data.experimental.AutoShardPolicy`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum AutoShardPolicy {
    /// `Data` here: ferroflow's datasets do not expose the files they read, so sharding by
    /// file is asked for explicitly (TF falls back the same way when it finds no files).
    #[default]
    Auto,
    /// Shard the input files: build each worker's pipeline with
    /// `distribute_datasets_from_function`, sharding `Dataset::list_files` by the
    /// [`InputContext`]; asking for it here is an error that says so.
    File,
    /// Every worker reads every batch and keeps its part of the rows: worker `w` of `W`
    /// takes rows `[w·n/W, (w+1)·n/W)` of each global batch of `n`. Needs the same batches
    /// in the same order on every worker (a seeded shuffle).
    Data,
    /// No sharding: every worker trains on every batch, split only among its replicas.
    Off,
}

/// Options of a distributed dataset (TF's `tf.data.Options().experimental_distribute`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct InputOptions {
    /// How the workers share the data.
    pub auto_shard_policy: AutoShardPolicy,
}

/// What a worker's input function is told (TF's `tf.distribute.InputContext`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct InputContext {
    /// How many input pipelines (one per worker).
    pub num_input_pipelines: usize,
    /// This worker's pipeline.
    pub input_pipeline_id: usize,
    /// All replicas of all workers.
    pub num_replicas_in_sync: usize,
}

impl InputContext {
    /// The per-replica batch of a global batch (an error when it does not divide).
    pub fn get_per_replica_batch_size(&self, global_batch_size: usize) -> Result<usize> {
        if !global_batch_size.is_multiple_of(self.num_replicas_in_sync) {
            return Err(Error::invalid(
                "get_per_replica_batch_size",
                format!(
                    "the global batch size {global_batch_size} is not divisible by the {} \
                     replicas in sync",
                    self.num_replicas_in_sync
                ),
            ));
        }
        Ok(global_batch_size / self.num_replicas_in_sync)
    }
}

/// Where a part of `n` rows starts when they are divided into `parts` (the first parts are
/// one shorter when it does not divide).
pub fn share_bounds(n: usize, parts: usize, i: usize) -> (usize, usize) {
    (i * n / parts, (i + 1) * n / parts)
}

/// Rows `[start, end)` of `t` along its batch dimension (a view); an error for a scalar.
pub fn batch_rows(t: &Tensor, start: usize, end: usize) -> Result<Tensor> {
    if t.rank() == 0 {
        return Err(Error::invalid(
            "distribute",
            "a scalar in a batch cannot be split among replicas; batch elements need a \
             leading batch dimension",
        ));
    }
    let mut begin = vec![0; t.rank()];
    begin[0] = start;
    let mut size = vec![-1isize; t.rank()];
    size[0] = (end - start) as isize;
    t.slice(&begin, &size)
}

enum Source {
    /// Global batches: take this worker's rows, then split them among the replicas.
    Global { worker: Option<(usize, usize)> },
    /// Per-replica batches: each replica takes the next element (a last group with fewer
    /// elements than replicas is dropped, as a step needs every replica).
    PerReplica,
}

/// A dataset distributed over a strategy's replicas (TF's `DistributedDataset`): each
/// element is a [`PerReplica`] of this process' replicas' parts, placed on their devices.
///
/// ```no_run
/// ferroflow::init();
/// use ferroflow_distribute::{InputOptions, MirroredStrategy, Strategy};
/// use ferroflow::data::Dataset;
/// let strategy = MirroredStrategy::new(&[])?;
/// let ds = Dataset::from_tensor_slices(ferroflow::Tensor::range(0.0, 8.0, 1.0, ferroflow::DType::F32)?)?.batch(4, false)?;
/// for batch in strategy.experimental_distribute_dataset(&ds, InputOptions::default())?.iter() {
///     let per_replica = batch?; // one piece of each global batch per replica
/// }
/// # Ok::<(), ferroflow::Error>(())
/// ```
pub struct DistributedDataset<T> {
    dataset: Dataset<T>,
    devices: Vec<Device>,
    source: Source,
}

impl<T: Structure + Clone> DistributedDataset<T> {
    pub(crate) fn from_global_batches<S: Strategy + ?Sized>(
        strategy: &S,
        dataset: &Dataset<T>,
        options: InputOptions,
    ) -> Result<DistributedDataset<T>> {
        let worker = match options.auto_shard_policy {
            AutoShardPolicy::File => {
                return Err(Error::invalid(
                    "experimental_distribute_dataset",
                    "AutoShardPolicy::File: ferroflow's datasets do not expose the files they \
                     read; shard the file list per worker with distribute_datasets_from_function \
                     (Dataset::list_files(..).shard(ctx.num_input_pipelines, ctx.input_pipeline_id)), \
                     or use AutoShardPolicy::Data",
                ))
            }
            AutoShardPolicy::Auto | AutoShardPolicy::Data => {
                Some((strategy.worker_index(), strategy.num_workers()))
            }
            AutoShardPolicy::Off => None,
        };
        Ok(DistributedDataset {
            dataset: dataset.clone(),
            devices: strategy.local_devices(),
            source: Source::Global { worker },
        })
    }

    pub(crate) fn from_per_replica_batches<S: Strategy + ?Sized>(
        strategy: &S,
        dataset: Dataset<T>,
    ) -> Result<DistributedDataset<T>> {
        Ok(DistributedDataset {
            dataset,
            devices: strategy.local_devices(),
            source: Source::PerReplica,
        })
    }

    /// One pass over the data.
    pub fn iter(&self) -> DistributedIter<'_, T> {
        DistributedIter {
            owner: self,
            inner: self.dataset.iter(),
        }
    }
}

/// An iterator over a [`DistributedDataset`].
pub struct DistributedIter<'a, T> {
    owner: &'a DistributedDataset<T>,
    inner: DatasetIter<T>,
}

fn place<T: Structure>(element: &T, device: Device) -> Result<T> {
    element.map_tensors(|t| {
        if t.device() == device {
            Ok(t.clone())
        } else {
            t.to_device(device)
        }
    })
}

impl<T: Structure + Clone> Iterator for DistributedIter<'_, T> {
    type Item = Result<PerReplica<T>>;
    fn next(&mut self) -> Option<Result<PerReplica<T>>> {
        let devices = &self.owner.devices;
        match &self.owner.source {
            Source::Global { worker } => {
                let batch = match self.inner.next()? {
                    Ok(b) => b,
                    Err(e) => return Some(Err(e)),
                };
                Some(split_global(&batch, *worker, devices))
            }
            Source::PerReplica => {
                let mut parts = Vec::with_capacity(devices.len());
                for d in devices {
                    match self.inner.next()? {
                        Ok(b) => parts.push(place(&b, *d)),
                        Err(e) => return Some(Err(e)),
                    }
                }
                Some(
                    parts
                        .into_iter()
                        .collect::<Result<Vec<_>>>()
                        .map(PerReplica::new),
                )
            }
        }
    }
}

/// This worker's rows of a global batch, split among the replicas on `devices`.
fn split_global<T: Structure>(
    batch: &T,
    worker: Option<(usize, usize)>,
    devices: &[Device],
) -> Result<PerReplica<T>> {
    let leaves = batch.flatten();
    let n = leaves
        .first()
        .and_then(|t| t.shape().first().copied())
        .ok_or_else(|| Error::invalid("distribute", "a batch without tensors cannot be split"))?;
    if let Some(t) = leaves.iter().find(|t| t.shape().first() != Some(&n)) {
        return Err(Error::invalid(
            "distribute",
            format!(
                "the batch's tensors disagree on the batch size: {n} and {:?}",
                t.shape()
            ),
        ));
    }
    let (lo, hi) = match worker {
        Some((w, workers)) => share_bounds(n, workers, w),
        None => (0, n),
    };
    let spec = batch.spec();
    let mut out = Vec::with_capacity(devices.len());
    for (r, d) in devices.iter().enumerate() {
        let (a, b) = share_bounds(hi - lo, devices.len(), r);
        let parts = leaves
            .iter()
            .map(|t| batch_rows(t, lo + a, lo + b).and_then(|p| p.to_device(*d)))
            .collect::<Result<Vec<_>>>()?;
        out.push(T::from_parts(&spec, &mut parts.into_iter())?);
    }
    Ok(PerReplica::new(out))
}
