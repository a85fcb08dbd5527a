//! The seam between a distribution strategy and the crates below it: which replica this
//! thread is running ([`replica_context`]), and how variables created in a strategy's scope
//! are distributed ([`distributed_variables_scope`]).
//!
//! The strategies themselves (`MirroredStrategy`, `MultiWorkerMirroredStrategy`) are in
//! `ferroflow-distribute`; optimizers (`ferroflow-optim`) read the replica context to
//! aggregate gradients across replicas, and [`crate::Variable`] reads it to pick the
//! replica's copy. Nothing here communicates: cross-process reductions are the strategy's,
//! reached through [`CrossWorkerReduce`].
//!
//! ```no_run
//! use ferroflow_tensor::distribution::replica_context;
//! // Outside a strategy's `run` there is no replica context.
//! assert!(replica_context().is_none());
//! ```

use crate::device::Device;
use crate::error::Result;
use crate::tensor::Tensor;
use crate::variable::Variable;
use std::cell::RefCell;
use std::sync::Arc;

/// Sums tensors across the worker processes of a strategy (each worker passes its own
/// tensors; every worker gets the sums). Implemented by `ferroflow-distribute` over its
/// collectives; every worker must call it the same number of times in the same order.
pub trait CrossWorkerReduce: Send + Sync {
    /// The element-wise sums over workers of `tensors` (same shapes and dtypes on every
    /// worker), in order.
    fn all_reduce_sum(&self, tensors: Vec<Tensor>) -> Result<Vec<Tensor>>;
}

/// The replica a thread is running, set by a strategy around each replica's step
/// (TF's `tf.distribute.get_replica_context()` within `strategy.run`).
#[derive(Clone)]
pub struct ReplicaInfo {
    /// This replica's index among all replicas of all workers.
    pub replica_id_in_sync_group: usize,
    /// This replica's index among this process' replicas (they run one after another,
    /// in this order).
    pub local_replica: usize,
    /// How many replicas this process runs.
    pub num_local_replicas: usize,
    /// How many replicas all workers run together.
    pub num_replicas_in_sync: usize,
    /// The replica's device.
    pub device: Device,
    /// Reductions across worker processes (absent with a single worker).
    pub cross_worker: Option<Arc<dyn CrossWorkerReduce>>,
}

impl ReplicaInfo {
    /// Whether this is the last local replica of the step (where gathered updates apply).
    pub fn is_last_local(&self) -> bool {
        self.local_replica + 1 == self.num_local_replicas
    }
}

impl std::fmt::Debug for ReplicaInfo {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "replica {} of {} ({} of {} here, on {})",
            self.replica_id_in_sync_group,
            self.num_replicas_in_sync,
            self.local_replica,
            self.num_local_replicas,
            self.device
        )
    }
}

/// Told of each variable created in a strategy's scope.
pub type OnVariableCreated = Arc<dyn Fn(&Variable) + Send + Sync>;

/// How variables created inside a strategy's scope are distributed.
pub struct VariableDistribution {
    /// The strategy's name, for errors (`"MirroredStrategy"`).
    pub strategy: &'static str,
    /// How many replicas this process runs (sync-on-read variables keep one value each).
    pub num_local_replicas: usize,
    /// Told of every variable created in the scope (a multi-worker strategy broadcasts
    /// their initial values from the chief before the next step).
    pub on_create: Option<OnVariableCreated>,
}

thread_local! {
    static REPLICA: RefCell<Option<ReplicaInfo>> = const { RefCell::new(None) };
    static VARIABLE_SCOPE: RefCell<Vec<Arc<VariableDistribution>>> = const { RefCell::new(Vec::new()) };
}

/// The replica this thread is running, if inside a strategy's replica step.
pub fn replica_context() -> Option<ReplicaInfo> {
    REPLICA.with(|r| r.borrow().clone())
}

/// Ends a [`replica_scope`] when dropped (restoring the context before it).
#[must_use = "the replica context ends when the guard is dropped"]
pub struct ReplicaScope {
    previous: Option<ReplicaInfo>,
    _not_send: std::marker::PhantomData<*const ()>,
}

impl Drop for ReplicaScope {
    fn drop(&mut self) {
        let previous = self.previous.take();
        REPLICA.with(|r| *r.borrow_mut() = previous);
    }
}

/// Makes `info` this thread's replica context until the guard drops (strategies call it
/// around each replica's step).
pub fn replica_scope(info: ReplicaInfo) -> ReplicaScope {
    let previous = REPLICA.with(|r| r.borrow_mut().replace(info));
    ReplicaScope {
        previous,
        _not_send: std::marker::PhantomData,
    }
}

/// Leaves the replica context until the guard drops: what an optimizer does once the
/// replicas' gradients are gathered (TF's `merge_call` into the cross-replica context), so
/// its updates of mirrored variables apply once.
pub fn cross_replica_scope() -> ReplicaScope {
    let previous = REPLICA.with(|r| r.borrow_mut().take());
    ReplicaScope {
        previous,
        _not_send: std::marker::PhantomData,
    }
}

/// Ends a [`distributed_variables_scope`] when dropped.
#[must_use = "the scope ends when the guard is dropped"]
pub struct VariableDistributionScope {
    _not_send: std::marker::PhantomData<*const ()>,
}

impl Drop for VariableDistributionScope {
    fn drop(&mut self) {
        VARIABLE_SCOPE.with(|s| s.borrow_mut().pop());
    }
}

/// Until the guard drops, variables created on this thread are distributed as `how` says
/// (a strategy's `scope()`).
pub fn distributed_variables_scope(how: Arc<VariableDistribution>) -> VariableDistributionScope {
    VARIABLE_SCOPE.with(|s| s.borrow_mut().push(how));
    VariableDistributionScope {
        _not_send: std::marker::PhantomData,
    }
}

/// The innermost variable distribution in force on this thread.
pub(crate) fn current_variable_distribution() -> Option<Arc<VariableDistribution>> {
    VARIABLE_SCOPE.with(|s| s.borrow().last().cloned())
}
