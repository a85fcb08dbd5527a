//! The tf.data service (TF 2.3's `tf.data.experimental.service`): a dispatcher and workers
//! that run input pipelines for trainers, so an input-bound trainer moves its preprocessing
//! onto other processes or machines.
//!
//! # Overview
//! - [`DispatchServer`] ([`DispatcherConfig`]): registers datasets, creates jobs, gives
//!   their tasks to the workers, splits distributed epochs, notices dead workers; with
//!   `work_dir` and `fault_tolerant_mode` it journals its state and resumes after a restart.
//! - [`WorkerServer`] ([`WorkerConfig`]): runs the tasks' pipelines and streams their
//!   elements to the trainers.
//! - Trainers: `dataset.apply(`[`distribute`]`(mode, "grpc://host:port", job_name))`, or
//!   [`register_dataset`] and [`from_dataset_id`]; [`DistributeOptions`] (shared jobs by
//!   name, `max_outstanding_requests`, compression) and [`ServiceStats`] (elements received,
//!   workers and elements lost).
//! - Rust closures cannot travel: a pipeline is registered by name in the program
//!   ([`register_pipeline`]; workers and trainers run the same binary) and built with
//!   serialisable parameters ([`pipeline`]); the dispatcher sends the name and parameters,
//!   and each worker builds the pipeline itself.
//! - [`ProcessingMode::ParallelEpochs`]: every worker produces the whole dataset;
//!   [`ProcessingMode::DistributedEpoch`]: the dispatcher hands the ranges of the pipeline's
//!   one splittable source (`from_tensor_slices`, `range`, `list_files`) out to the workers,
//!   so each element is produced once per epoch when nothing fails. Element order across
//!   workers is not deterministic.
//! - Every call carries the cluster token (`FERROFLOW_CLUSTER_TOKEN`); `ferroflow
//!   data-service dispatcher|worker` runs the servers as processes.
//!
//! ```
//! ferroflow::init();
//! use ferroflow_data::service::{self, DispatchServer, DispatcherConfig, ProcessingMode, WorkerConfig, WorkerServer};
//! use ferroflow_data::Dataset;
//! use ferroflow_tensor::Tensor;
//! service::register_pipeline("tens", |p: &serde_json::Value| {
//!     let n = p["n"].as_i64().unwrap_or(10);
//!     Ok(Dataset::range(0, n, 1).map(|x| x.mul(&x.scalar_like(10.0)?)))
//! });
//! let mut dispatcher = DispatchServer::new(DispatcherConfig::default());
//! dispatcher.start()?;
//! let mut workers: Vec<WorkerServer> = (0..2)
//!     .map(|_| WorkerServer::new(WorkerConfig::new(&dispatcher.target())))
//!     .collect();
//! for w in &mut workers {
//!     w.start()?;
//! }
//! let ds = service::pipeline::<Tensor>("tens", serde_json::json!({"n": 6}))?
//!     .apply(service::distribute(ProcessingMode::DistributedEpoch, &dispatcher.target(), None))?;
//! let mut got: Vec<i64> = ds.iter().map(|x| x?.item::<i64>()).collect::<Result<_, _>>()?;
//! got.sort();
//! assert_eq!(got, vec![0, 10, 20, 30, 40, 50]);
//! # Ok::<(), ferroflow_tensor::Error>(())
//! ```

mod consumer;
mod dispatcher;
pub(crate) mod protocol;
mod registry;
mod worker;

pub use consumer::{
    distribute, distribute_with, from_dataset_id, from_dataset_id_with, register_dataset,
    register_dataset_with, DistributeOptions, ServiceStats,
};
pub use dispatcher::{DispatchServer, DispatcherConfig, StopHandle};
pub use registry::{pipeline, register_builtin_pipelines, register_pipeline, registered_pipelines};
pub use worker::{WorkerConfig, WorkerServer};

use serde::{Deserialize, Serialize};

/// How a job divides the work among the workers (TF's `processing_mode`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub enum ProcessingMode {
    /// Every worker produces the whole dataset (`"parallel_epochs"`): with 2 workers, each
    /// element arrives twice per epoch.
    ParallelEpochs,
    /// The workers share one pass (`"distributed_epoch"`): the dispatcher hands out the
    /// ranges of the pipeline's source, so each element is produced once when nothing fails
    /// (a worker that dies loses the elements it held: [`ServiceStats::lost_elements`]).
    DistributedEpoch,
}

/// How elements travel from workers to trainers (TF's `compression`).
///
/// ```
/// use ferroflow_data::service::Compression;
/// assert!(Compression::Auto.compresses_for("10.0.0.7:5050"));
/// assert!(!Compression::Auto.compresses_for("127.0.0.1:5050"));
/// assert!(Compression::Snappy.compresses_for("127.0.0.1:5050"));
/// ```
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub enum Compression {
    /// As encoded.
    None,
    /// Snappy, always.
    Snappy,
    /// TF's `"AUTO"` (the default): the service decides. Snappy between hosts; none from a
    /// worker on the consumer's own loopback interface, where compressing costs CPU (more
    /// than making an MNIST batch) and saves nothing.
    Auto,
}

impl Compression {
    /// Whether elements from the worker at `worker_address` (`host:port`) travel
    /// compressed.
    pub fn compresses_for(self, worker_address: &str) -> bool {
        match self {
            Compression::None => false,
            Compression::Snappy => true,
            Compression::Auto => !is_loopback(worker_address),
        }
    }
}

/// Whether `address` (`host:port`, `[v6]:port` or a bare host) names this machine's
/// loopback interface.
fn is_loopback(address: &str) -> bool {
    let address = worker::strip_scheme(address);
    let host = match address.parse::<std::net::SocketAddr>() {
        Ok(a) => return a.ip().is_loopback(),
        Err(_) => address.rsplit_once(':').map_or(address, |(h, _)| h),
    };
    let host = host.trim_start_matches('[').trim_end_matches(']');
    host.eq_ignore_ascii_case("localhost")
        || host
            .parse::<std::net::IpAddr>()
            .is_ok_and(|ip| ip.is_loopback())
}

/// A thread's periodic wait that another thread can end early: the worker's heartbeat
/// loop (woken when a consumer asks for a task the worker has not heard of yet, or has
/// been told a task's end) and a consumer's job-following loop (woken when a reader
/// ends), so a job's start and end cost a round trip instead of a heartbeat interval.
#[derive(Default)]
pub(crate) struct Wakeup {
    woken: std::sync::Mutex<bool>,
    changed: std::sync::Condvar,
}

impl Wakeup {
    /// Ends the current (or the next) [`wait`](Self::wait).
    pub fn wake(&self) {
        *self.woken.lock().unwrap_or_else(|e| e.into_inner()) = true;
        self.changed.notify_all();
    }

    /// Waits until woken or `timeout` has passed; true when woken.
    pub fn wait(&self, timeout: std::time::Duration) -> bool {
        let woken = self.woken.lock().unwrap_or_else(|e| e.into_inner());
        let (mut woken, _) = self
            .changed
            .wait_timeout_while(woken, timeout, |w| !*w)
            .unwrap_or_else(|e| e.into_inner());
        std::mem::take(&mut *woken)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn auto_compresses_for_other_hosts_only() {
        for local in [
            "127.0.0.1:5050",
            "127.3.4.5:1",
            "[::1]:5050",
            "localhost:5050",
            "LOCALHOST:1",
            "grpc://127.0.0.1:7",
        ] {
            assert!(!Compression::Auto.compresses_for(local), "{local}");
            assert!(Compression::Snappy.compresses_for(local), "{local}");
        }
        for remote in [
            "10.0.0.7:5050",
            "[2001:db8::1]:5050",
            "worker-3:5050",
            "example.com:1",
        ] {
            assert!(Compression::Auto.compresses_for(remote), "{remote}");
            assert!(!Compression::None.compresses_for(remote), "{remote}");
        }
    }
}
