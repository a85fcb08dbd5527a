//! ferroflow's cluster layer: who the tasks of a job are and where they listen, read the way
//! TensorFlow reads it, so the same binary runs as chief, worker or parameter server and the
//! launchers that drive TensorFlow (Kubeflow's TFJob, Slurm) drive it unchanged.
//!
//! # Overview
//! - [`ClusterSpec`] (`tf.train.ClusterSpec`): job names (`"chief"`, `"worker"`, `"ps"`,
//!   `"evaluator"`, or any other) to their tasks' `host:port` addresses, by task index.
//! - [`TaskId`]: this process's job and index.
//! - [`ClusterResolver`] (`tf.distribute.cluster_resolver.ClusterResolver`): where a
//!   cluster description comes from. [`TfConfigClusterResolver`] reads `TF_CONFIG` verbatim
//!   (`{"cluster": {...}, "task": {"type": "worker", "index": 0}}`); [`SlurmClusterResolver`]
//!   derives the cluster from a Slurm job step's `SLURM_*` variables, as TF's does;
//!   [`SimpleClusterResolver`] holds one given in code.
//!
//! A malformed or inconsistent description is an error naming the field (`TF_CONFIG:
//! task.index 2 is out of range: cluster.worker has 2 tasks`), never a guess.
//!
//! ```
//! use ferroflow_cluster::{ClusterResolver, TfConfigClusterResolver};
//! let r = TfConfigClusterResolver::from_json(
//!     r#"{"cluster": {"chief": ["host0:2222"], "worker": ["host1:2222", "host2:2222"]},
//!         "task": {"type": "worker", "index": 1}}"#,
//! )?;
//! let spec = r.cluster_spec()?;
//! assert_eq!(spec.num_tasks("worker"), 2);
//! assert_eq!(r.task().unwrap().to_string(), "/job:worker/task:1");
//! assert_eq!(r.task_address()?.as_deref(), Some("host2:2222"));
//! # Ok::<(), ferroflow_tensor::Error>(())
//! ```
//!
//! - [`TaskServer`]: the gRPC server (tonic; protos compiled by protox in `build.rs`) each
//!   task runs on its address, hosting its services (today the [`Mailbox`] collectives
//!   deliver to); [`Peer`]: a client of another task's server. Calls carry the cluster token
//!   (`FERROFLOW_CLUSTER_TOKEN`) and have deadlines; an unreachable or silent peer is
//!   [`ferroflow_tensor::Error::Unavailable`], naming it. [`DirectListener`] and
//!   [`DirectClient`]: a task's one hot request/reply method on a TCP connection of its
//!   own beside the server (token-checked, framed), read by the threads that answer and
//!   wait, without the gRPC runtime's hand-offs.
//! - [`LocalCluster`]: a job's tasks started as local processes with `TF_CONFIG` filled in
//!   on loopback ports the OS picked, each handed to its task already listening
//!   ([`reserve_loopback_ports`], [`hand_over`], [`bind_listener`]: no other process can
//!   take a port between the launcher's choice and the task's server), their output prefixed with the task's name, the group stopped
//!   when one fails (`ferroflow launch`, and the multi-process tests).
//! - [`MpiLaunch`]: a process `mpirun` started, recognised from the launcher's variables
//!   (the collectives then run over MPI, with no `TF_CONFIG`).

#![warn(missing_docs)]

mod direct;
mod launch;
mod mpi_env;
mod ports;
mod resolver;
mod server;
mod slurm;
mod spec;
mod transport;
mod wire;

pub use direct::{busy_poll_window, busy_wait, DirectClient, DirectConnection, DirectListener};
#[cfg(unix)]
pub use direct::{poll_readable, readable};
pub use launch::{
    free_loopback_addresses, LaunchOutcome, LaunchSpec, LocalCluster, PROFILER_PORT_ENV,
};
pub use mpi_env::MpiLaunch;
pub use ports::{bind_listener, hand_over, reserve_loopback_ports, ReservedPort, LISTEN_FDS_ENV};
pub use resolver::{ClusterResolver, SimpleClusterResolver, TfConfigClusterResolver};
pub use server::{
    seconds_from_env, token_from_env, Connector, DeferredHandler, Delivery, Handler, Mailbox, Peer,
    Pending, PendingCall, Reply, TaskServer, TokenCheck, MAX_MESSAGE_BYTES, TOKEN_KEY,
};
pub use slurm::{expand_hostlist, SlurmClusterResolver};
pub use spec::{check_address, ClusterSpec, TaskId};
pub use transport::keepalive_interval;
