//! `tf.distribute` for ferroflow: synchronous training on several devices and several
//! processes, and the collectives it runs on.
//!
//! # Overview
//! - [`Strategy`]: `scope`, `run`, `reduce`, `experimental_distribute_dataset`,
//!   `distribute_datasets_from_function`, `num_replicas_in_sync`; [`get_strategy`] (the
//!   [`DefaultStrategy`] when no scope is open), [`ReplicaContext`].
//! - The strategies: [`OneDeviceStrategy`], [`MirroredStrategy`] (one replica per local
//!   device: GPUs, or logical CPU devices; the replicas' gradients summed on each variable's
//!   device, or by NCCL across GPUs with [`CrossDeviceOps::NcclAllReduce`]) and
//!   [`MultiWorkerMirroredStrategy`] (the cluster from `TF_CONFIG`, gradients all-reduced
//!   across processes).
//! - Distributed values: [`PerReplica`]; variables created in a scope are distributed
//!   (`Variable::is_distributed`): mirrored, or sync-on-read per their synchronization,
//!   updated per their aggregation (`ferroflow_tensor::distribution` holds the seam).
//! - Input: [`DistributedDataset`], [`InputContext`], [`AutoShardPolicy`].
//! - [`CollectiveGroup`]: the training tasks of a cluster (the chief, then the workers),
//!   each serving on its cluster address, and their collectives: `all_reduce` (a ring
//!   reduce-scatter then all-gather over gRPC, or over shared memory when every task runs
//!   on one host, tensors packed per [`CommunicationOptions::bytes_per_pack`]; or MPI's;
//!   or, for GPU tensors under [`CommunicationImplementation::Nccl`], NCCL through the
//!   device collectives the CUDA backend registers), `all_gather`, `broadcast`, `barrier`.
//!
//! A dead or hung peer is an error naming the peer and the collective within the timeout,
//! never a hang.
//!
//! ```no_run
//! ferroflow::init();
//! use ferroflow_distribute::{CommunicationOptions, MultiWorkerMirroredStrategy, ReduceOp, Strategy};
//! // Started once per worker with TF_CONFIG set (e.g. by `ferroflow launch`).
//! let strategy = MultiWorkerMirroredStrategy::new(CommunicationOptions::default())?;
//! let losses = strategy.run(|ctx| ferroflow::Tensor::scalar(ctx.replica_id_in_sync_group() as f32))?;
//! let mean = strategy.reduce(ReduceOp::Mean, &losses, None)?; // the same on every worker
//! # Ok::<(), ferroflow::Error>(())
//! ```
//!
//! # Design
//! The replicas of one process run one after another on the calling thread, each in its
//! device's scope: Keras layers are `&mut` and hold their state behind locks, so threads
//! would serialise on them anyway, and device work is asynchronous on GPUs. Optimizers
//! gather the replicas' gradients and update once at the last replica (TF's `merge_call`).

#![warn(missing_docs)]

mod collective;
mod input;
#[cfg(feature = "mpi")]
mod mpi_transport;
mod ps;
mod shm;
mod strategy;
mod values;

pub use collective::{
    CollectiveGroup, CommunicationImplementation, CommunicationOptions, ReduceOp,
};
pub use input::{
    batch_rows, share_bounds, AutoShardPolicy, DistributedDataset, DistributedIter, InputContext,
    InputOptions,
};
pub use ps::{
    ClusterCoordinator, FixedShardsPartitioner, Functions, MaxSizePartitioner, MinSizePartitioner,
    ParameterServerStrategy, PerWorkerDataset, PerWorkerIterator, PsCheckpoint, RemoteValue,
    ScheduleStats, Server, ShardedVariable, VariablePartitioner, WorkerContext,
};
pub use strategy::{
    enter_scope, get_strategy, has_strategy, CrossDeviceOps, DefaultStrategy, MirroredStrategy,
    MultiWorkerMirroredStrategy, OneDeviceStrategy, ReplicaContext, Strategy, StrategyScope,
};
pub use values::PerReplica;

/// The loss of a replica scaled for a sum over all replicas (TF's
/// `tf.nn.compute_average_loss`): the sum of the per-example losses divided by the global
/// batch (`global_batch_size`, else the replica's batch times the replicas in sync), so
/// gradients summed over the replicas are the gradients of the global batch's mean loss.
///
/// ```no_run
/// ferroflow::init();
/// let per_example = ferroflow::Tensor::from_slice(&[1.0f32, 3.0])?;
/// let loss = ferroflow_distribute::compute_average_loss(&per_example, Some(4))?;
/// assert_eq!(loss.item::<f32>()?, 1.0);
/// # Ok::<(), ferroflow::Error>(())
/// ```
pub fn compute_average_loss(
    per_example_loss: &ferroflow_tensor::Tensor,
    global_batch_size: Option<usize>,
) -> ferroflow_tensor::Result<ferroflow_tensor::Tensor> {
    let batch = per_example_loss.shape().first().copied().unwrap_or(1);
    let global = match global_batch_size {
        Some(g) => g,
        None => {
            batch
                * ferroflow_tensor::distribution::replica_context()
                    .map_or(1, |r| r.num_replicas_in_sync)
        }
    };
    if global == 0 {
        return Err(ferroflow_tensor::Error::invalid(
            "compute_average_loss",
            "the global batch size is 0",
        ));
    }
    let total = per_example_loss.reduce_sum(ferroflow_tensor::Axes::All, false)?;
    total.div(&total.scalar_like(global as f64)?)
}
