//! The seam between a distribution strategy and the crates below it: which replica this
//! thread is running ([`replica_context`]), and how variables created in a strategy's scope
//! are distributed ([`distributed_variables_scope`]).
//!
//! The strategies themselves (`MirroredStrategy`, `MultiWorkerMirroredStrategy`,
//! `ParameterServerStrategy`) are in `ferroflow-distribute`; optimizers (`ferroflow-optim`)
//! read the replica context to aggregate gradients across replicas, and
//! [`crate::Variable`] reads it to pick the replica's copy. Nothing here communicates:
//! cross-process reductions are the strategy's, reached through [`CrossWorkerReduce`], and
//! a variable a parameter server holds is reached through its [`RemoteVariable`] handle.
//!
//! ```no_run
//! use ferroflow_tensor::distribution::replica_context;
//! // Outside a strategy's `run` there is no replica context.
//! assert!(replica_context().is_none());
//! ```

use crate::device::Device;
use crate::error::{Error, Result};
use crate::fused::UpdateRule;
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
    /// The local replicas' devices reducing together (MirroredStrategy's `NcclAllReduce`),
    /// which the gradients of the local replicas are summed through; absent, they are
    /// summed on each variable's device (`ReductionToOneDevice`).
    pub cross_device: Option<Arc<dyn LocalDeviceGroup>>,
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

/// What a write does with its value ([`RemoteVariable::write`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[cfg_attr(feature = "serde", derive(serde::Serialize, serde::Deserialize))]
pub enum VariableWrite {
    /// `v = value`.
    Assign,
    /// `v += value`.
    Add,
    /// `v -= value`.
    Sub,
}

impl VariableWrite {
    /// TF's name of the write (`"assign_add"`).
    pub fn name(self) -> &'static str {
        match self {
            VariableWrite::Assign => "assign",
            VariableWrite::Add => "assign_add",
            VariableWrite::Sub => "assign_sub",
        }
    }
}

/// An optimizer step a parameter server applies to a variable it holds, with the
/// variable's slots, in one go (TF's `ResourceApply*` ops placed on the ps).
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum RemoteUpdate {
    /// `w -= lr·g` (plain SGD: no slots).
    GradientDescent {
        /// Learning rate.
        lr: f64,
    },
    /// The fused rule, slots in the rule's order.
    Rule(UpdateRule),
}

/// The handle of a variable that lives in another process (a parameter server): what
/// [`crate::Variable`] reads, writes and updates through. Implemented by
/// `ferroflow-distribute`'s `ParameterServerStrategy`, which decides when a read is
/// answered from a copy and when it is fetched.
pub trait RemoteVariable: std::any::Any + Send + Sync {
    /// The current value.
    fn read(&self) -> Result<Tensor>;
    /// Writes `value` (shape and dtype already checked against the variable's).
    fn write(&self, kind: VariableWrite, value: &Tensor) -> Result<()>;
    /// Applies an optimizer step with `gradient` where the variable lives; `slots` are
    /// handles made by [`RemoteVariable::slot`] of this one, in the update's order.
    fn apply(
        &self,
        update: &RemoteUpdate,
        gradient: &Tensor,
        slots: &[&dyn RemoteVariable],
    ) -> Result<()>;
    /// The handle of an optimizer slot `name` of this variable, kept next to it and
    /// starting at `initial` (TF colocates slots with their variable).
    fn slot(&self, name: &str, initial: &Tensor) -> Arc<dyn RemoteVariable>;
    /// Where the variable lives, for errors and printing (`/job:ps/task:0`).
    fn location(&self) -> String;
    /// The handle as `Any` (its strategy finds its own type behind a slot's handle).
    fn as_any(&self) -> &dyn std::any::Any;
}

/// What a strategy is told of a variable being created in its scope, to place it.
pub struct VariablePlacement<'a> {
    /// The variable's name.
    pub name: &'a str,
    /// Its initial value.
    pub initial: &'a Tensor,
    /// Whether it is trainable.
    pub trainable: bool,
    /// Its synchronization.
    pub synchronization: crate::VariableSynchronization,
}

/// Places a variable created in a strategy's scope: the handle of its remote home, or
/// `None` to keep it in this process.
pub type PlaceVariable =
    Arc<dyn Fn(&VariablePlacement<'_>) -> Option<Arc<dyn RemoteVariable>> + Send + Sync>;

/// How variables created inside a strategy's scope are distributed.
pub struct VariableDistribution {
    /// The strategy's name, for errors (`"MirroredStrategy"`).
    pub strategy: &'static str,
    /// How many replicas this process runs (sync-on-read variables keep one value each).
    pub num_local_replicas: usize,
    /// Told of every variable created in the scope (a multi-worker strategy broadcasts
    /// their initial values from the chief before the next step).
    pub on_create: Option<OnVariableCreated>,
    /// Places variables in other processes (parameter servers); absent: every variable
    /// stays here.
    pub place: Option<PlaceVariable>,
}

thread_local! {
    static REMOTE_FAILURE: RefCell<Option<Error>> = const { RefCell::new(None) };
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

/// Keeps the first failure of a remote variable's read on this thread (reads cannot fail:
/// they give the last value known here), for [`take_remote_failure`].
pub(crate) fn note_remote_failure(e: Error) {
    REMOTE_FAILURE.with(|f| {
        let mut f = f.borrow_mut();
        if f.is_none() {
            *f = Some(e);
        }
    });
}

/// The first failure to read a remote variable on this thread since the last call: a
/// strategy checks it after each step it runs (and the chief after its reads) and reports
/// it, since `Variable::value` itself cannot fail.
///
/// ```no_run
/// assert!(ferroflow_tensor::distribution::take_remote_failure().is_none());
/// ```
pub fn take_remote_failure() -> Option<Error> {
    REMOTE_FAILURE.with(|f| f.borrow_mut().take())
}

/// How a collective combines its participants' tensors (TF's `tf.distribute.ReduceOp`).
///
/// ```
/// use ferroflow_tensor::distribution::ReduceOp;
/// assert_ne!(ReduceOp::Sum, ReduceOp::Mean);
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ReduceOp {
    /// The sum over participants.
    Sum,
    /// The sum divided by the number of participants (float dtypes).
    Mean,
}

/// A backend's own collectives between its devices, in several processes or in one (the
/// CUDA backend's NCCL): registered by the backend with [`register_device_collectives`],
/// reached by the distribution crate through [`device_collectives`] for tensors on the
/// devices it serves (TF's `CommunicationImplementation.NCCL` and `NcclAllReduce`), so that
/// the distribution crate depends on no backend.
pub trait DeviceCollectives: Send + Sync {
    /// The library's name and version, for reports (`"NCCL 2.21.5"`).
    fn name(&self) -> String;
    /// Whether it serves `device`.
    fn serves(&self, device: Device) -> bool;
    /// A new id for a communicator of `device`'s kind, as bytes to send to the other ranks.
    fn new_id(&self, device: Device) -> Result<Vec<u8>>;
    /// Joins the communicator of `world` ranks that `id` names as `rank`, on `device`,
    /// waiting at most `timeout` for every rank to join.
    fn join(
        &self,
        device: Device,
        id: &[u8],
        rank: usize,
        world: usize,
        timeout: std::time::Duration,
    ) -> Result<Box<dyn DeviceCommunicator>>;
    /// One communicator per device of this process (distinct devices, ranks in their
    /// order), all-reducing together.
    fn local_group(
        &self,
        devices: &[Device],
        timeout: std::time::Duration,
    ) -> Result<Box<dyn LocalDeviceGroup>>;
}

/// One rank's membership of a [`DeviceCollectives`] communicator: its collectives take and
/// return tensors on its device; every rank calls the same ones in the same order.
pub trait DeviceCommunicator: Send + Sync {
    /// The device its tensors are on.
    fn device(&self) -> Device;
    /// Tensor `i` of the result combines tensor `i` of every rank.
    fn all_reduce(&self, tensors: &[Tensor], op: ReduceOp) -> Result<Vec<Tensor>>;
    /// Every rank's `tensor` concatenated along axis 0 in rank order.
    fn all_gather(&self, tensor: &Tensor) -> Result<Tensor>;
    /// Rank `root`'s `tensor` on every rank.
    fn broadcast(&self, tensor: &Tensor, root: usize) -> Result<Tensor>;
}

/// The communicators of one process's devices ([`DeviceCollectives::local_group`]).
pub trait LocalDeviceGroup: Send + Sync {
    /// The devices, in rank order.
    fn devices(&self) -> Vec<Device>;
    /// `per_device[i]`: the tensors on device `i`; returns, for each device, the
    /// combination over devices of each of its tensors, on that device.
    fn all_reduce(&self, per_device: &[Vec<Tensor>], op: ReduceOp) -> Result<Vec<Vec<Tensor>>>;
}

static DEVICE_COLLECTIVES: std::sync::RwLock<Vec<Arc<dyn DeviceCollectives>>> =
    std::sync::RwLock::new(Vec::new());

/// Registers a backend's device collectives (the first registered for a device serves it;
/// registering an implementation of the same name again is a no-op). Backends call it with
/// their devices (`ferroflow_cuda::register()` registers NCCL).
///
/// ```
/// use ferroflow_tensor::distribution::{register_device_collectives, DeviceCollectives};
/// use std::sync::Arc;
/// // What a backend's `register()` does with its implementation:
/// fn register(collectives: Arc<dyn DeviceCollectives>) {
///     register_device_collectives(collectives);
/// }
/// ```
pub fn register_device_collectives(collectives: Arc<dyn DeviceCollectives>) {
    let mut all = DEVICE_COLLECTIVES
        .write()
        .unwrap_or_else(|e| e.into_inner());
    let name = collectives.name();
    if !all.iter().any(|c| c.name() == name) {
        all.push(collectives);
    }
}

/// The device collectives serving `device`, if a backend registered some.
///
/// ```
/// use ferroflow_tensor::{distribution::device_collectives, Device};
/// // The CPU has none (the distribution crate's ring serves host tensors).
/// assert!(device_collectives(Device::CPU).is_none());
/// ```
pub fn device_collectives(device: Device) -> Option<Arc<dyn DeviceCollectives>> {
    DEVICE_COLLECTIVES
        .read()
        .unwrap_or_else(|e| e.into_inner())
        .iter()
        .find(|c| c.serves(device))
        .cloned()
}

/// Whether any backend registered device collectives.
///
/// ```
/// // Without a backend that offers some (the CUDA backend with a GPU): none.
/// let _ = ferroflow_tensor::distribution::have_device_collectives();
/// ```
pub fn have_device_collectives() -> bool {
    !DEVICE_COLLECTIVES
        .read()
        .unwrap_or_else(|e| e.into_inner())
        .is_empty()
}
