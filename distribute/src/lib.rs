//! `tf.distribute` for ferroflow. So far: the collectives multi-worker training runs on,
//! across processes and machines.
//!
//! # Overview
//! - [`CollectiveGroup`]: the training tasks of a cluster (the chief, then the workers, as
//!   TF's `MultiWorkerMirroredStrategy` orders them), each serving on its cluster address
//!   (`ferroflow_cluster::TaskServer`), and their collectives: [`CollectiveGroup::all_reduce`]
//!   (sum or mean of same-shaped tensors on every task, as a ring reduce-scatter then
//!   all-gather over gRPC, tensors packed per [`CommunicationOptions::bytes_per_pack`]) and
//!   [`CollectiveGroup::all_gather`], [`CollectiveGroup::broadcast`] and
//!   [`CollectiveGroup::barrier`].
//! - [`CommunicationOptions`] (TF's `tf.distribute.experimental.CommunicationOptions`): the
//!   implementation (`Ring`; `Nccl` is the CUDA backend's, and an error until it lands), the
//!   timeout, the pack size.
//!
//! A dead or hung peer is an error naming the peer and the collective within the timeout,
//! never a hang. The strategies (`MirroredStrategy`, `MultiWorkerMirroredStrategy`), the
//! distributed values and Keras under a strategy are issue #20's remaining work.
//!
//! ```no_run
//! use ferroflow_cluster::TfConfigClusterResolver;
//! use ferroflow_distribute::{CollectiveGroup, CommunicationOptions, ReduceOp};
//! // Started once per task with TF_CONFIG set (e.g. by a launcher).
//! ferroflow::init();
//! let group = CollectiveGroup::new(&TfConfigClusterResolver::from_env()?, CommunicationOptions::default())?;
//! let g = ferroflow::Tensor::from_vec(vec![1.0f32, 2.0], &[2])?;
//! let mean = group.all_reduce(&[g], ReduceOp::Mean)?; // the same on every task
//! # Ok::<(), ferroflow::Error>(())
//! ```

#![warn(missing_docs)]

mod collective;

pub use collective::{
    CollectiveGroup, CommunicationImplementation, CommunicationOptions, ReduceOp,
};
