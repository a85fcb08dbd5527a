//! The [`Strategy`] trait and its strategies: the default one, [`OneDeviceStrategy`],
//! [`MirroredStrategy`] (replicas on this machine's devices) and
//! [`MultiWorkerMirroredStrategy`] (replicas on several processes and machines).

use crate::collective::{CollectiveGroup, CommunicationOptions};
use crate::input::{DistributedDataset, InputContext};
use crate::values::PerReplica;
use crate::ReduceOp;
use ferroflow_cluster::{ClusterResolver, TfConfigClusterResolver};
use ferroflow_data::{Dataset, Structure};
use ferroflow_tensor::distribution::{
    distributed_variables_scope, replica_context, replica_scope, CrossWorkerReduce,
    LocalDeviceGroup, ReplicaInfo, VariableDistribution, VariableDistributionScope,
};
use ferroflow_tensor::{
    device_scope, list_devices, Device, DeviceKind, Error, Result, Tensor, Variable,
};
use std::cell::RefCell;
use std::sync::{Arc, Mutex};

/// A distribution strategy (TF's `tf.distribute.Strategy`): where replicas run, how their
/// variables stay in sync and how their values combine.
///
/// The object-safe methods describe the strategy; the generic ones (`scope`, `run`,
/// `reduce`, the dataset methods) are provided on top of them, for the concrete strategies
/// and for `Arc<dyn Strategy>` ([`get_strategy`]) alike.
///
/// The local replicas of a step run one after another on the calling thread, each in its
/// device's scope; an optimizer's `apply_gradients` gathers their gradients and applies
/// the update once, at the last one, with the gradients summed over every replica of every
/// worker (as TF's `merge_call` does).
///
/// ```no_run
/// ferroflow::init();
/// use ferroflow_distribute::{MirroredStrategy, ReduceOp, Strategy};
/// ferroflow::config::set_logical_device_configuration(ferroflow::DeviceKind::Cpu, 2)?;
/// let strategy = MirroredStrategy::new(&["/CPU:0", "/CPU:1"])?;
/// let per_replica = strategy.run(|ctx| ferroflow::Tensor::scalar(ctx.replica_id_in_sync_group() as f32))?;
/// let total = strategy.reduce(ReduceOp::Sum, &per_replica, None)?;
/// assert_eq!(total.to_vec::<f32>()?, vec![1.0]);
/// # Ok::<(), ferroflow::Error>(())
/// ```
pub trait Strategy: Send + Sync {
    /// The strategy's TF class name (`"MirroredStrategy"`).
    fn name(&self) -> &'static str;
    /// The devices of this process' replicas, in replica order.
    fn local_devices(&self) -> Vec<Device>;
    /// How many worker processes take part (1 but for multi-worker strategies).
    fn num_workers(&self) -> usize {
        1
    }
    /// This process' index among them.
    fn worker_index(&self) -> usize {
        0
    }
    /// Whether this process is the chief (worker 0), the one that writes checkpoints and
    /// summaries.
    fn is_chief(&self) -> bool {
        self.worker_index() == 0
    }
    /// The replicas of all workers (TF's `num_replicas_in_sync`).
    fn num_replicas_in_sync(&self) -> usize {
        self.num_workers() * self.local_devices().len()
    }
    /// Sums across worker processes (absent with one worker).
    fn cross_worker(&self) -> Option<Arc<dyn CrossWorkerReduce>> {
        None
    }
    /// The local replicas' devices reducing together ([`CrossDeviceOps::NcclAllReduce`]);
    /// absent, the local replicas' gradients are summed on each variable's device.
    fn cross_device(&self) -> Option<Arc<dyn LocalDeviceGroup>> {
        None
    }
    /// The chief's `tensors`, on every worker (the tensors themselves with one worker).
    fn broadcast_from_chief(&self, tensors: Vec<Tensor>) -> Result<Vec<Tensor>> {
        Ok(tensors)
    }
    /// Every worker's `tensor` concatenated along axis 0, in worker order.
    fn gather_workers(&self, tensor: &Tensor) -> Result<Tensor> {
        Ok(tensor.clone())
    }
    /// Reports a failure to bring variables created since the last call into agreement
    /// across workers (a multi-worker strategy gives each new variable the chief's value
    /// as it is created).
    fn sync_new_variables(&self) -> Result<()> {
        Ok(())
    }
    /// How variables created in this strategy's scope are distributed (absent: not at all).
    fn variable_distribution(&self) -> Option<Arc<VariableDistribution>>;
    /// This strategy as a shared trait object (strategies are cheap handles).
    fn to_dyn(&self) -> Arc<dyn Strategy>;
    /// The parameter-server strategy this is, if it is one (Keras' `fit` schedules its
    /// steps on the workers then).
    fn as_parameter_server(&self) -> Option<&crate::ParameterServerStrategy> {
        None
    }

    /// Enters the strategy's scope until the guard drops (`with strategy.scope():`):
    /// variables created in it are distributed, and [`get_strategy`] returns this strategy.
    fn scope(&self) -> StrategyScope
    where
        Self: Sized,
    {
        enter_scope(self.to_dyn())
    }

    /// Runs `step` once per local replica (TF's `strategy.run`), each in its device's
    /// scope with its [`ReplicaContext`], and returns the replicas' results.
    fn run<T>(&self, step: impl FnMut(&ReplicaContext) -> Result<T>) -> Result<PerReplica<T>>
    where
        Self: Sized,
    {
        run_replicas(&self.to_dyn(), step)
    }

    /// [`Strategy::run`] with each replica's share of a distributed input
    /// (`strategy.run(fn, args=(inputs,))`).
    fn run_with<A, T>(
        &self,
        args: &PerReplica<A>,
        mut step: impl FnMut(&ReplicaContext, &A) -> Result<T>,
    ) -> Result<PerReplica<T>>
    where
        Self: Sized,
    {
        let devices = self.local_devices().len();
        if args.len() != devices {
            return Err(Error::invalid(
                "Strategy.run",
                format!(
                    "the arguments hold {} replicas' values, {} runs {devices} replicas here",
                    args.len(),
                    self.name()
                ),
            ));
        }
        run_replicas(&self.to_dyn(), |ctx| {
            step(ctx, &args.values()[ctx.local_replica()])
        })
    }

    /// Combines a per-replica value across all replicas of all workers (TF's
    /// `strategy.reduce(op, value, axis)`): with `axis`, each replica's tensor is first
    /// summed along it, and `Mean` divides by the global count along that axis; without,
    /// `Mean` divides by the number of replicas.
    fn reduce(
        &self,
        op: ReduceOp,
        value: &PerReplica<Tensor>,
        axis: Option<usize>,
    ) -> Result<Tensor>
    where
        Self: Sized,
    {
        reduce_per_replica(self, op, value, axis)
    }

    /// Distributes a dataset of global batches (TF's `experimental_distribute_dataset`):
    /// each worker keeps its part of the data as its [`crate::AutoShardPolicy`] says, and
    /// each batch is split into one piece per local replica.
    fn experimental_distribute_dataset<T: Structure + Clone>(
        &self,
        dataset: &Dataset<T>,
        options: crate::InputOptions,
    ) -> Result<DistributedDataset<T>>
    where
        Self: Sized,
    {
        DistributedDataset::from_global_batches(self, dataset, options)
    }

    /// Builds each worker's input pipeline with `make` (TF's
    /// `distribute_datasets_from_function`): it gets the [`InputContext`] (which pipeline
    /// of how many, the replicas in sync) and returns batches of the per-replica size; each
    /// local replica takes the next batch.
    fn distribute_datasets_from_function<T: Structure + Clone>(
        &self,
        make: impl FnOnce(&InputContext) -> Result<Dataset<T>>,
    ) -> Result<DistributedDataset<T>>
    where
        Self: Sized,
    {
        let ctx = InputContext {
            num_input_pipelines: self.num_workers(),
            input_pipeline_id: self.worker_index(),
            num_replicas_in_sync: self.num_replicas_in_sync(),
        };
        DistributedDataset::from_per_replica_batches(self, make(&ctx)?)
    }

    /// The values of this process' replicas (`experimental_local_results`).
    fn experimental_local_results<'a, T>(&self, value: &'a PerReplica<T>) -> &'a [T]
    where
        Self: Sized,
    {
        value.values()
    }
}

impl Strategy for Arc<dyn Strategy> {
    fn name(&self) -> &'static str {
        (**self).name()
    }
    fn local_devices(&self) -> Vec<Device> {
        (**self).local_devices()
    }
    fn num_workers(&self) -> usize {
        (**self).num_workers()
    }
    fn worker_index(&self) -> usize {
        (**self).worker_index()
    }
    fn num_replicas_in_sync(&self) -> usize {
        (**self).num_replicas_in_sync()
    }
    fn cross_worker(&self) -> Option<Arc<dyn CrossWorkerReduce>> {
        (**self).cross_worker()
    }
    fn cross_device(&self) -> Option<Arc<dyn LocalDeviceGroup>> {
        (**self).cross_device()
    }
    fn broadcast_from_chief(&self, tensors: Vec<Tensor>) -> Result<Vec<Tensor>> {
        (**self).broadcast_from_chief(tensors)
    }
    fn gather_workers(&self, tensor: &Tensor) -> Result<Tensor> {
        (**self).gather_workers(tensor)
    }
    fn sync_new_variables(&self) -> Result<()> {
        (**self).sync_new_variables()
    }
    fn variable_distribution(&self) -> Option<Arc<VariableDistribution>> {
        (**self).variable_distribution()
    }
    fn to_dyn(&self) -> Arc<dyn Strategy> {
        self.clone()
    }
    fn as_parameter_server(&self) -> Option<&crate::ParameterServerStrategy> {
        (**self).as_parameter_server()
    }
}

thread_local! {
    static STRATEGY_STACK: RefCell<Vec<Arc<dyn Strategy>>> = const { RefCell::new(Vec::new()) };
}

/// The strategy whose scope this thread is in, or the default strategy (TF's
/// `tf.distribute.get_strategy()`: one replica on the current device, no distribution).
pub fn get_strategy() -> Arc<dyn Strategy> {
    STRATEGY_STACK
        .with(|s| s.borrow().last().cloned())
        .unwrap_or_else(|| Arc::new(DefaultStrategy))
}

/// Whether a strategy's scope is open on this thread (`tf.distribute.has_strategy()`).
pub fn has_strategy() -> bool {
    STRATEGY_STACK.with(|s| !s.borrow().is_empty())
}

/// Guard of [`Strategy::scope`]; the scope ends when it drops.
#[must_use = "the strategy's scope ends when the guard is dropped"]
pub struct StrategyScope {
    _variables: Option<VariableDistributionScope>,
    _not_send: std::marker::PhantomData<*const ()>,
}

impl Drop for StrategyScope {
    fn drop(&mut self) {
        STRATEGY_STACK.with(|s| s.borrow_mut().pop());
    }
}

/// Enters `strategy`'s scope (what [`Strategy::scope`] does; for `Arc<dyn Strategy>`).
pub fn enter_scope(strategy: Arc<dyn Strategy>) -> StrategyScope {
    let variables = strategy
        .variable_distribution()
        .map(distributed_variables_scope);
    STRATEGY_STACK.with(|s| s.borrow_mut().push(strategy));
    StrategyScope {
        _variables: variables,
        _not_send: std::marker::PhantomData,
    }
}

/// What a replica's step sees (TF's `tf.distribute.ReplicaContext`).
pub struct ReplicaContext {
    info: ReplicaInfo,
    strategy: Arc<dyn Strategy>,
}

impl ReplicaContext {
    /// This replica's index among all replicas of all workers.
    pub fn replica_id_in_sync_group(&self) -> usize {
        self.info.replica_id_in_sync_group
    }
    /// All replicas of all workers.
    pub fn num_replicas_in_sync(&self) -> usize {
        self.info.num_replicas_in_sync
    }
    /// This replica's index among this process' replicas.
    pub fn local_replica(&self) -> usize {
        self.info.local_replica
    }
    /// The replica's device.
    pub fn device(&self) -> Device {
        self.info.device
    }
    /// The strategy running the replica.
    pub fn strategy(&self) -> &Arc<dyn Strategy> {
        &self.strategy
    }
    /// `value` combined over all replicas, inside the step (TF's
    /// `ReplicaContext.all_reduce`). The replicas of one process run one after another,
    /// so this works when each process runs one replica (`OneDeviceStrategy`, and
    /// `MultiWorkerMirroredStrategy` with one device per worker, its usual form); with
    /// several local replicas it is an error: return the value from `run` and combine it
    /// with [`Strategy::reduce`], or let `apply_gradients` aggregate gradients.
    pub fn all_reduce(&self, op: ReduceOp, value: &Tensor) -> Result<Tensor> {
        if self.info.num_local_replicas > 1 {
            return Err(Error::invalid(
                "ReplicaContext.all_reduce",
                format!(
                    "{} runs its {} local replicas one after another, so they cannot meet inside \
                     a step; return the value from `run` and use `strategy.reduce`, or let \
                     `apply_gradients` aggregate the gradients",
                    self.strategy.name(),
                    self.info.num_local_replicas
                ),
            ));
        }
        let total = match &self.info.cross_worker {
            Some(c) => c
                .all_reduce_sum(vec![value.clone()])?
                .pop()
                .ok_or_else(|| Error::invalid("all_reduce", "the sum returned nothing"))?,
            None => value.clone(),
        };
        match op {
            ReduceOp::Sum => Ok(total),
            ReduceOp::Mean => total.div(&total.scalar_like(self.info.num_replicas_in_sync as f64)?),
        }
    }
}

/// Runs `step` for each local replica of `strategy`, in order.
pub(crate) fn run_replicas<T>(
    strategy: &Arc<dyn Strategy>,
    mut step: impl FnMut(&ReplicaContext) -> Result<T>,
) -> Result<PerReplica<T>> {
    if let Some(r) = replica_context() {
        return Err(Error::invalid(
            "Strategy.run",
            format!("`run` was called inside a replica's step ({r:?}); call it from outside"),
        ));
    }
    strategy.sync_new_variables()?;
    let _scope = enter_scope(strategy.clone());
    let devices = strategy.local_devices();
    let cross_worker = strategy.cross_worker();
    let cross_device = strategy.cross_device();
    let base = strategy.worker_index() * devices.len();
    let mut out = Vec::with_capacity(devices.len());
    for (i, device) in devices.iter().enumerate() {
        let info = ReplicaInfo {
            replica_id_in_sync_group: base + i,
            local_replica: i,
            num_local_replicas: devices.len(),
            num_replicas_in_sync: strategy.num_replicas_in_sync(),
            device: *device,
            cross_worker: cross_worker.clone(),
            cross_device: cross_device.clone(),
        };
        let _device = device_scope(&device.to_string())?;
        let _replica = replica_scope(info.clone());
        out.push(step(&ReplicaContext {
            info,
            strategy: strategy.clone(),
        })?);
    }
    // A variable the step created (a model built by its first call) took the chief's value
    // as it was created; a failure to get it is reported here, not a step later.
    strategy.sync_new_variables()?;
    Ok(PerReplica::new(out))
}

fn reduce_per_replica(
    strategy: &dyn Strategy,
    op: ReduceOp,
    value: &PerReplica<Tensor>,
    axis: Option<usize>,
) -> Result<Tensor> {
    let parts = value.values();
    let first = parts
        .first()
        .ok_or_else(|| Error::invalid("Strategy.reduce", "the per-replica value is empty"))?;
    let device = first.device();
    let mut total: Option<Tensor> = None;
    let mut count = 0usize;
    for p in parts {
        let p = if p.device() == device {
            p.clone()
        } else {
            p.to_device(device)?
        };
        let p = match axis {
            Some(a) => {
                let n = *p.shape().get(a).ok_or_else(|| {
                    Error::invalid(
                        "Strategy.reduce",
                        format!(
                            "axis {a} is out of range for a value of shape {:?}",
                            p.shape()
                        ),
                    )
                })?;
                count += n;
                p.reduce_sum(a as isize, false)?
            }
            None => {
                count += 1;
                p
            }
        };
        total = Some(match total {
            None => p,
            Some(t) => t.add(&p)?,
        });
    }
    let mut total = total.ok_or_else(|| Error::invalid("Strategy.reduce", "no values"))?;
    if let Some(c) = strategy.cross_worker() {
        let count_t = Tensor::scalar(count as f64)?.to_device(device)?;
        let mut r = c.all_reduce_sum(vec![total, count_t])?;
        let count_t = r
            .pop()
            .ok_or_else(|| Error::invalid("Strategy.reduce", "no count"))?;
        total = r
            .pop()
            .ok_or_else(|| Error::invalid("Strategy.reduce", "no sum"))?;
        count = count_t.to_f64_vec()?.first().copied().unwrap_or(0.0) as usize;
    }
    match op {
        ReduceOp::Sum => Ok(total),
        ReduceOp::Mean => total.div(&total.scalar_like(count as f64)?),
    }
}

/// The strategy in force when none is: one replica on the current device, variables as
/// they are (TF's default strategy).
#[derive(Debug, Clone, Copy, Default)]
pub struct DefaultStrategy;

impl Strategy for DefaultStrategy {
    fn name(&self) -> &'static str {
        "DefaultDistributionStrategy"
    }
    fn local_devices(&self) -> Vec<Device> {
        vec![ferroflow_tensor::current_device()]
    }
    fn variable_distribution(&self) -> Option<Arc<VariableDistribution>> {
        None
    }
    fn to_dyn(&self) -> Arc<dyn Strategy> {
        Arc::new(*self)
    }
}

fn parse_devices(name: &'static str, devices: &[&str]) -> Result<Vec<Device>> {
    let mut out = vec![];
    for d in devices {
        let device = Device::parse(d)?;
        ferroflow_tensor::backend_for(device)?;
        if out.contains(&device) {
            return Err(Error::invalid(
                name,
                format!("device {device} is listed twice; each replica needs its own"),
            ));
        }
        out.push(device);
    }
    Ok(out)
}

/// The devices a strategy uses when given none: every GPU, else the CPU (TF's rule).
fn default_devices() -> Vec<Device> {
    let gpus: Vec<Device> = list_devices()
        .into_iter()
        .map(|(d, _)| d)
        .filter(|d| d.kind() == DeviceKind::Gpu)
        .collect();
    if gpus.is_empty() {
        vec![Device::CPU]
    } else {
        gpus
    }
}

/// One replica on one device (TF's `OneDeviceStrategy`): variables and computation placed
/// there, the same code as under a multi-replica strategy.
#[derive(Clone)]
pub struct OneDeviceStrategy {
    device: Device,
    variables: Arc<VariableDistribution>,
}

impl OneDeviceStrategy {
    /// The strategy on `device` (`"/GPU:0"`); an error naming the device when no backend
    /// serves it.
    pub fn new(device: &str) -> Result<OneDeviceStrategy> {
        let device = parse_devices("OneDeviceStrategy", &[device])?[0];
        Ok(OneDeviceStrategy {
            device,
            variables: Arc::new(VariableDistribution {
                strategy: "OneDeviceStrategy",
                num_local_replicas: 1,
                on_create: None,
                place: None,
            }),
        })
    }
}

impl Strategy for OneDeviceStrategy {
    fn name(&self) -> &'static str {
        "OneDeviceStrategy"
    }
    fn local_devices(&self) -> Vec<Device> {
        vec![self.device]
    }
    fn variable_distribution(&self) -> Option<Arc<VariableDistribution>> {
        Some(self.variables.clone())
    }
    fn to_dyn(&self) -> Arc<dyn Strategy> {
        Arc::new(self.clone())
    }
}

/// Synchronous training on this machine's devices (TF's `MirroredStrategy`): one replica
/// per device, variables mirrored on each, gradients summed over the replicas.
///
/// Without GPUs, split the CPU first
/// (`ferroflow::config::set_logical_device_configuration(DeviceKind::Cpu, n)`) and mirror
/// over `/CPU:0`..`/CPU:{n-1}`.
#[derive(Clone)]
pub struct MirroredStrategy {
    devices: Vec<Device>,
    variables: Arc<VariableDistribution>,
    /// The devices' communicators under [`CrossDeviceOps::NcclAllReduce`].
    cross_device: Option<Arc<dyn LocalDeviceGroup>>,
}

/// How MirroredStrategy sums the local replicas' gradients (TF's `cross_device_ops`).
///
/// ```
/// use ferroflow_distribute::CrossDeviceOps;
/// assert_eq!(CrossDeviceOps::default(), CrossDeviceOps::ReductionToOneDevice);
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum CrossDeviceOps {
    /// Each gradient copied to its variable's device and summed there (TF's
    /// `ReductionToOneDevice`; any devices).
    #[default]
    ReductionToOneDevice,
    /// The replicas' gradients all-reduced by NCCL in one group across the devices (TF's
    /// `NcclAllReduce`, its default for several GPUs): CUDA devices, whose backend offers
    /// NCCL (the facade's `cuda` feature and `libnccl.so.2`).
    NcclAllReduce,
}

/// How long MirroredStrategy's NCCL communicators wait for each other.
const LOCAL_COLLECTIVE_TIMEOUT: std::time::Duration = std::time::Duration::from_secs(300);

impl MirroredStrategy {
    /// Replicas on `devices` (`&["/GPU:0", "/GPU:1"]`); an empty list takes every GPU, or
    /// the CPU when there is none. A device no backend serves is an error naming it.
    pub fn new(devices: &[&str]) -> Result<MirroredStrategy> {
        MirroredStrategy::with_cross_device_ops(devices, CrossDeviceOps::ReductionToOneDevice)
    }

    /// Replicas on `devices` (as [`MirroredStrategy::new`]) whose gradients are summed by
    /// `ops` (TF's `MirroredStrategy(devices, cross_device_ops=tf.distribute.NcclAllReduce())`).
    /// `NcclAllReduce` makes one NCCL communicator per device here; on devices whose
    /// backend offers no NCCL it is an error naming them.
    ///
    /// ```no_run
    /// use ferroflow_distribute::{CrossDeviceOps, MirroredStrategy};
    /// ferroflow::init();
    /// let strategy = MirroredStrategy::with_cross_device_ops(
    ///     &["/GPU:0", "/GPU:1"],
    ///     CrossDeviceOps::NcclAllReduce,
    /// )?;
    /// # Ok::<(), ferroflow::Error>(())
    /// ```
    pub fn with_cross_device_ops(
        devices: &[&str],
        ops: CrossDeviceOps,
    ) -> Result<MirroredStrategy> {
        let devices = if devices.is_empty() {
            default_devices()
        } else {
            parse_devices("MirroredStrategy", devices)?
        };
        let cross_device = match ops {
            CrossDeviceOps::ReductionToOneDevice => None,
            CrossDeviceOps::NcclAllReduce => {
                let offered = devices.first().and_then(|&d| {
                    ferroflow_tensor::distribution::device_collectives(d)
                        .filter(|c| devices.iter().all(|&other| c.serves(other)))
                });
                let Some(collectives) = offered else {
                    let names: Vec<String> = devices.iter().map(|d| d.to_string()).collect();
                    return Err(Error::BackendUnavailable {
                        device: format!("NcclAllReduce over {}", names.join(", ")),
                        hint: "no backend offers NCCL for these devices: NCCL needs CUDA \
                               devices (the `cuda` cargo feature of ferroflow and \
                               libnccl.so.2); use CrossDeviceOps::ReductionToOneDevice"
                            .into(),
                    });
                };
                Some(Arc::from(
                    collectives.local_group(&devices, LOCAL_COLLECTIVE_TIMEOUT)?,
                ))
            }
        };
        Ok(MirroredStrategy {
            variables: Arc::new(VariableDistribution {
                strategy: "MirroredStrategy",
                num_local_replicas: devices.len(),
                on_create: None,
                place: None,
            }),
            devices,
            cross_device,
        })
    }
}

impl Strategy for MirroredStrategy {
    fn name(&self) -> &'static str {
        "MirroredStrategy"
    }
    fn local_devices(&self) -> Vec<Device> {
        self.devices.clone()
    }
    fn cross_device(&self) -> Option<Arc<dyn LocalDeviceGroup>> {
        self.cross_device.clone()
    }
    fn variable_distribution(&self) -> Option<Arc<VariableDistribution>> {
        Some(self.variables.clone())
    }
    fn to_dyn(&self) -> Arc<dyn Strategy> {
        Arc::new(self.clone())
    }
}

/// The collectives as the cross-worker sum the optimizers and variables use.
struct GroupSum(Arc<CollectiveGroup>);

impl CrossWorkerReduce for GroupSum {
    fn all_reduce_sum(&self, tensors: Vec<Tensor>) -> Result<Vec<Tensor>> {
        self.0.all_reduce(&tensors, ReduceOp::Sum)
    }
}

/// Synchronous training across processes and machines (TF's
/// `MultiWorkerMirroredStrategy`): every worker runs the same program on its part of the
/// data; variables start from the chief's values and stay identical because every worker
/// applies the same all-reduced gradients.
///
/// The cluster comes from `TF_CONFIG` verbatim (`{"cluster": {"chief": [..], "worker":
/// [..]}, "task": {"type": "worker", "index": 1}}`): launchers that set it (Kubeflow's
/// TFJob, `ferroflow launch`) work unchanged; without TF_CONFIG it is a single worker.
/// Every worker must create the same variables in the same order (the same program does).
///
/// ```no_run
/// ferroflow::init();
/// use ferroflow_distribute::{CommunicationOptions, MultiWorkerMirroredStrategy, Strategy};
/// let strategy = MultiWorkerMirroredStrategy::new(CommunicationOptions::default())?;
/// println!("worker {} of {}", strategy.worker_index(), strategy.num_workers());
/// # Ok::<(), ferroflow::Error>(())
/// ```
#[derive(Clone)]
pub struct MultiWorkerMirroredStrategy {
    group: Arc<CollectiveGroup>,
    devices: Vec<Device>,
    variables: Arc<VariableDistribution>,
    /// The first failure to bring a new variable to the chief's value, reported by the
    /// next step.
    sync_error: Arc<Mutex<Option<Error>>>,
}

impl MultiWorkerMirroredStrategy {
    /// The strategy of the cluster `TF_CONFIG` describes (a single worker without it); a
    /// malformed or inconsistent TF_CONFIG is an error naming the field.
    pub fn new(options: CommunicationOptions) -> Result<MultiWorkerMirroredStrategy> {
        MultiWorkerMirroredStrategy::with_resolver(&TfConfigClusterResolver::from_env()?, options)
    }
    /// The strategy of the cluster `resolver` describes.
    pub fn with_resolver(
        resolver: &dyn ClusterResolver,
        options: CommunicationOptions,
    ) -> Result<MultiWorkerMirroredStrategy> {
        let group = Arc::new(CollectiveGroup::new(resolver, options)?);
        let devices = default_devices();
        let sync_error: Arc<Mutex<Option<Error>>> = Arc::default();
        let (hook_group, hook_error) = (group.clone(), sync_error.clone());
        // Each variable takes the chief's initial value as it is created (every worker
        // creates the same variables in the same order), so even a model built by its
        // first step starts that step from the chief's weights.
        let on_create = move |v: &Variable| {
            if hook_group.world_size() == 1 {
                return;
            }
            let mut error = hook_error.lock().unwrap_or_else(|e| e.into_inner());
            if error.is_some() {
                return;
            }
            let synced = hook_group.broadcast(&v.peek(), 0).and_then(|chief| {
                let _cross_replica = ferroflow_tensor::distribution::cross_replica_scope();
                v.assign(&chief)
            });
            if let Err(e) = synced {
                *error = Some(e);
            }
        };
        let variables = Arc::new(VariableDistribution {
            strategy: "MultiWorkerMirroredStrategy",
            num_local_replicas: devices.len(),
            on_create: Some(Arc::new(on_create)),
            place: None,
        });
        Ok(MultiWorkerMirroredStrategy {
            group,
            devices,
            variables,
            sync_error,
        })
    }
    /// The collectives of the workers (for all-gathers and broadcasts of your own).
    pub fn collectives(&self) -> &CollectiveGroup {
        &self.group
    }
}

impl Strategy for MultiWorkerMirroredStrategy {
    fn name(&self) -> &'static str {
        "MultiWorkerMirroredStrategy"
    }
    fn local_devices(&self) -> Vec<Device> {
        self.devices.clone()
    }
    fn num_workers(&self) -> usize {
        self.group.world_size()
    }
    fn worker_index(&self) -> usize {
        self.group.rank()
    }
    fn cross_worker(&self) -> Option<Arc<dyn CrossWorkerReduce>> {
        (self.group.world_size() > 1).then(|| Arc::new(GroupSum(self.group.clone())) as _)
    }
    fn broadcast_from_chief(&self, tensors: Vec<Tensor>) -> Result<Vec<Tensor>> {
        if self.group.world_size() == 1 {
            return Ok(tensors);
        }
        tensors.iter().map(|t| self.group.broadcast(t, 0)).collect()
    }
    fn gather_workers(&self, tensor: &Tensor) -> Result<Tensor> {
        if self.group.world_size() == 1 {
            return Ok(tensor.clone());
        }
        self.group.all_gather(tensor)
    }
    fn sync_new_variables(&self) -> Result<()> {
        match self
            .sync_error
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .take()
        {
            Some(e) => Err(e),
            None => Ok(()),
        }
    }
    fn variable_distribution(&self) -> Option<Arc<VariableDistribution>> {
        Some(self.variables.clone())
    }
    fn to_dyn(&self) -> Arc<dyn Strategy> {
        Arc::new(self.clone())
    }
}
