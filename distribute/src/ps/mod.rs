//! Parameter-server training (TF 2.4's `ParameterServerStrategy` with a
//! `ClusterCoordinator`): variables on `ps` tasks, step functions scheduled by the chief on
//! `worker` tasks, asynchronously, surviving workers that die and come back.
//!
//! - [`ParameterServerStrategy`]: the chief's strategy; variables created in its scope live
//!   on the ps tasks ([`VariablePartitioner`]s shard large ones: [`ShardedVariable`]).
//! - [`Server`]: what ps and worker tasks run; a worker runs the [`Functions`] the chief
//!   schedules by name.
//! - [`ClusterCoordinator`]: `schedule`, `join`, `done`, [`RemoteValue::fetch`],
//!   per-worker datasets and iterators.
//! - [`PsCheckpoint`]: every variable and slot of the ps tasks saved atomically, the last N
//!   kept, restored by the chief.
//!
//! Messages: the ps methods are in `store`, the worker's in `worker`; both ride the
//! cluster's generic `Task.Call` gRPC method with the cluster token.

mod checkpoint;
mod coordinator;
mod store;
mod strategy;
mod variables;
mod wire;
mod worker;

pub use checkpoint::PsCheckpoint;
pub use coordinator::{
    ClusterCoordinator, PerWorkerDataset, PerWorkerIterator, RemoteValue, ScheduleStats,
};
pub use strategy::{ParameterServerStrategy, Server};
pub use variables::{
    FixedShardsPartitioner, MaxSizePartitioner, MinSizePartitioner, ShardedVariable,
    VariablePartitioner,
};
pub use worker::{Functions, WorkerContext};
