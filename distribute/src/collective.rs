//! [`CollectiveGroup`]: all-reduce and barrier across the training tasks of a cluster.

use crate::shm::{Piece, Rendezvous, ShmLinks};
use bytes::Bytes;
use ferroflow_cluster::{ClusterResolver, Delivery, MpiLaunch, Peer, TaskId, TaskServer};
use ferroflow_tensor::distribution::DeviceCommunicator;
use ferroflow_tensor::trace::{StatValue, TraceMe, PEER_WAIT_SPAN};
use ferroflow_tensor::{DType, Device, DeviceKind, Element, Error, HostData, Result, Tensor};
use half::{bf16, f16};
use std::borrow::Cow;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, OnceLock};
use std::time::Duration;

/// How collectives travel (TF's `CommunicationImplementation`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum CommunicationImplementation {
    /// The best available: MPI in a process `mpirun` started without `TF_CONFIG` (with the
    /// `mpi` cargo feature), else the ring.
    Auto,
    /// Ring reduce-scatter and all-gather over gRPC (TF's cross-host path), or over shared
    /// memory when every task runs on this host ([`CommunicationOptions::shared_memory`]).
    Ring,
    /// MPI's own collectives (`MPI_Allreduce`, ...) through the `mpi` crate: the `mpi` cargo
    /// feature, and a program started by `mpirun`; the ranks are the workers.
    Mpi,
    /// NVIDIA's NCCL for tensors on a CUDA device (TF's choice for GPUs), through the
    /// device collectives the CUDA backend registers
    /// ([`ferroflow_tensor::distribution::DeviceCollectives`]: the facade's `cuda` cargo
    /// feature, an NVIDIA GPU and `libnccl.so.2`; an error at the group's creation where no
    /// backend offers them). The first collective on a device makes its communicator (the
    /// chief's id sent over the gRPC ring); tensors on the host, or on different devices,
    /// take the ring, as TF's NCCL implementation leaves host tensors to its ring. Every
    /// task must then pass its tensors on a GPU, or every task on the host.
    Nccl,
}

/// Options of the collectives (TF's `tf.distribute.experimental.CommunicationOptions`).
#[derive(Debug, Clone, PartialEq)]
pub struct CommunicationOptions {
    /// The implementation (`Auto`).
    pub implementation: CommunicationImplementation,
    /// How long a collective waits for a peer before it fails naming it (TF has none by
    /// default; here 5 minutes, so a dead worker is an error, not a hang).
    pub timeout: Duration,
    /// Tensors of one dtype are packed into messages of up to this many bytes (0: one pack
    /// per dtype), as TF's `bytes_per_pack`.
    pub bytes_per_pack: usize,
    /// Whether the ring's messages go through shared memory when every training task runs
    /// on this host (Linux; `true`): written straight into the receiver's inbox and read
    /// in place, as Open MPI and NCCL do for ranks of one host. Tasks on several hosts, or
    /// `false`, keep to gRPC.
    pub shared_memory: bool,
}

impl Default for CommunicationOptions {
    fn default() -> Self {
        CommunicationOptions {
            implementation: CommunicationImplementation::Auto,
            timeout: Duration::from_secs(300),
            bytes_per_pack: 0,
            shared_memory: true,
        }
    }
}

/// How [`CollectiveGroup::all_reduce`] combines the tasks' tensors (defined with the
/// backends' device collectives, which take it too).
pub use ferroflow_tensor::distribution::ReduceOp;

/// The training tasks of a cluster and their collectives.
///
/// Every task builds one group and calls the same collectives in the same order (TF's rule
/// for collective instance keys); each call is one instance, its messages keyed by it.
pub struct CollectiveGroup {
    /// How the messages travel.
    transport: Transport,
    /// This task's place in the group.
    rank: usize,
    world: usize,
    options: CommunicationOptions,
    instance: AtomicU64,
    /// The device collectives' communicators (NCCL's), one per device, each made by the
    /// first collective on it (the `Nccl` implementation).
    device_communicators: Mutex<Vec<Arc<dyn DeviceCommunicator>>>,
}

/// How a group's messages travel.
enum Transport {
    /// A group of one: nothing to send.
    Alone,
    /// The ring: over gRPC, or over shared memory when every task is on this host.
    Ring(Box<Ring>),
    /// MPI's collectives.
    #[cfg(feature = "mpi")]
    Mpi(crate::mpi_transport::MpiTransport),
}

/// This task's part of the ring (its messages over gRPC or shared memory).
struct Ring {
    /// This task's server, its mailbox receiving the previous task's messages.
    server: TaskServer,
    /// Every task's gRPC client by rank (`None`: this one).
    peers: Vec<Option<Arc<Peer>>>,
    /// Every task's name and address by rank, for errors.
    names: Vec<String>,
    rank: usize,
    world: usize,
    /// How long a message may take (the collective timeout).
    timeout: Duration,
    /// Deliveries of finished collectives whose answers were not awaited (the peer has the
    /// message once its own collective ends): the next collective checks those that have
    /// answered, an error there being its error, and dropping the ring waits for the rest.
    unanswered: Mutex<Vec<Delivery>>,
    /// Whether the tasks may talk through shared memory when all are on this host
    /// ([`CommunicationOptions::shared_memory`]).
    shared_memory: bool,
    /// The shared-memory links, once the first collective has looked for them (`None`
    /// inside: the group keeps to gRPC).
    links: OnceLock<Option<ShmLinks>>,
    /// Held while the links are set up.
    setup: Mutex<()>,
}

/// The error for a GPU tensor under the `Nccl` implementation whose device no backend's
/// collectives serve.
fn no_collectives(device: Device) -> Error {
    Error::BackendUnavailable {
        device: format!("NCCL collectives on {device}"),
        hint: "no backend offers NCCL for this device (the CUDA backend does for its \
               devices); copy the tensors to a CUDA device or to the host, or use Ring"
            .into(),
    }
}

/// All-reduces whose data times the other tasks is at most this many bytes exchange the data
/// directly instead of going around the ring (fewer hops; more bytes).
const EXCHANGE_MAX_BYTES: usize = 4 << 20;

/// [`EXCHANGE_MAX_BYTES`] over shared memory, where a hop costs a wake-up rather than a
/// round of HTTP/2 and the ring's fewer bytes per task win sooner (measured on 4 tasks of
/// one host: the ring is ahead from about 256 KiB of data times the other tasks).
const SHARED_MEMORY_EXCHANGE_MAX_BYTES: usize = 256 << 10;

/// How many unanswered deliveries a ring keeps before it waits for the oldest.
const MAX_UNANSWERED: usize = 4096;

/// The most bytes one message of the ring all-reduce carries: long chunks travel in
/// segments this long, pipelined.
const SEGMENT_BYTES: usize = 1 << 20;

/// The training tasks in ring order: the chief, then the workers by index.
fn training_tasks(resolver: &dyn ClusterResolver) -> Result<Vec<(TaskId, String)>> {
    let spec = resolver.cluster_spec()?;
    let mut tasks = vec![];
    for job in ["chief", "worker"] {
        for i in spec.task_indices(job) {
            let address = spec.task_address(job, i).unwrap_or_default().to_string();
            tasks.push((TaskId::new(job, i), address));
        }
    }
    Ok(tasks)
}

impl CollectiveGroup {
    /// The group of the cluster `resolver` describes, this process being its task: starts
    /// the task's server on its address. A cluster without tasks is a group of one.
    pub fn new(
        resolver: &dyn ClusterResolver,
        options: CommunicationOptions,
    ) -> Result<CollectiveGroup> {
        let tasks = training_tasks(resolver)?;
        let use_mpi = match options.implementation {
            CommunicationImplementation::Nccl => {
                if !ferroflow_tensor::distribution::have_device_collectives() {
                    return Err(Error::BackendUnavailable {
                        device: "NCCL collectives".into(),
                        hint: "no backend offers NCCL here: the CUDA backend does, with the \
                               `cuda` (or `cuda-13`) cargo feature of ferroflow, an NVIDIA GPU \
                               and libnccl.so.2 (`ferroflow::init()` registers it); or use \
                               Ring, Mpi or Auto"
                            .into(),
                    });
                }
                false
            }
            CommunicationImplementation::Mpi => true,
            CommunicationImplementation::Ring => false,
            // `mpirun` started this process and no TF_CONFIG says otherwise.
            CommunicationImplementation::Auto => {
                tasks.is_empty() && MpiLaunch::from_env()?.is_some_and(|l| l.size > 1)
            }
        };
        if use_mpi {
            return CollectiveGroup::over_mpi(tasks.len(), options);
        }
        if tasks.is_empty() {
            return Ok(CollectiveGroup::over(Transport::Alone, 0, 1, options));
        }
        let token = ferroflow_cluster::token_from_env();
        let me = resolver.task().ok_or_else(|| {
            Error::format(
                "TF_CONFIG",
                "the cluster has training tasks but \"task\" does not say which this process is",
            )
        })?;
        let rank = tasks.iter().position(|(t, _)| *t == me).ok_or_else(|| {
            Error::format(
                "TF_CONFIG",
                format!("task {me} takes no part in the collectives (only the chief and the workers do)"),
            )
        })?;
        let world = tasks.len();
        let server = TaskServer::start(&tasks[rank].1, token.as_deref())?;
        let transport = if world > 1 {
            let peers: Vec<Option<Arc<Peer>>> = tasks
                .iter()
                .enumerate()
                .map(|(k, (t, a))| {
                    (k != rank)
                        .then(|| {
                            server
                                .peer(&t.to_string(), a, options.timeout)
                                .map(Arc::new)
                        })
                        .transpose()
                })
                .collect::<Result<_>>()?;
            Transport::Ring(Box::new(Ring {
                peers,
                server,
                names: tasks.iter().map(|(t, a)| format!("{t} ({a})")).collect(),
                rank,
                world,
                timeout: options.timeout,
                unanswered: Mutex::default(),
                shared_memory: options.shared_memory,
                links: OnceLock::new(),
                setup: Mutex::default(),
            }))
        } else {
            Transport::Alone
        };
        Ok(CollectiveGroup::over(transport, rank, world, options))
    }

    /// The group of `world` tasks, this one `rank`, over `transport`.
    fn over(
        transport: Transport,
        rank: usize,
        world: usize,
        options: CommunicationOptions,
    ) -> CollectiveGroup {
        CollectiveGroup {
            transport,
            rank,
            world,
            options,
            instance: AtomicU64::new(0),
            device_communicators: Mutex::default(),
        }
    }

    /// The group of the MPI world's ranks (`cluster_tasks`: the training tasks TF_CONFIG
    /// names, which must then be as many).
    #[cfg(feature = "mpi")]
    fn over_mpi(cluster_tasks: usize, options: CommunicationOptions) -> Result<CollectiveGroup> {
        let mpi = crate::mpi_transport::MpiTransport::new(options.timeout)?;
        let (rank, world) = (mpi.rank(), mpi.world_size());
        if cluster_tasks > 0 && cluster_tasks != world {
            return Err(Error::format(
                "TF_CONFIG",
                format!(
                    "the cluster has {cluster_tasks} training tasks but MPI started {world} ranks"
                ),
            ));
        }
        let transport = if world > 1 {
            Transport::Mpi(mpi)
        } else {
            Transport::Alone
        };
        Ok(CollectiveGroup::over(transport, rank, world, options))
    }

    /// Without the `mpi` feature: an error naming it.
    #[cfg(not(feature = "mpi"))]
    fn over_mpi(_cluster_tasks: usize, _options: CommunicationOptions) -> Result<CollectiveGroup> {
        let started = match MpiLaunch::from_env()? {
            Some(l) => format!(
                "this process is rank {} of {} started by an MPI launcher ({}), but ",
                l.rank, l.size, l.launcher
            ),
            None => String::new(),
        };
        Err(Error::BackendUnavailable {
            device: "MPI collectives".into(),
            hint: format!(
                "{started}ferroflow was built without MPI: enable the `mpi` cargo feature \
                 (of ferroflow or ferroflow-distribute; it needs the MPI library and mpicc, \
                 e.g. Debian's libopenmpi-dev), or start the workers with TF_CONFIG \
                 (`ferroflow launch`) for the gRPC ring"
            ),
        })
    }

    /// The profiler's span of one collective (inert, an atomic load, while none runs):
    /// `<scope>/<type>:<type>` with TF's op type, and what the Pod viewer and the trace show
    /// of it: the algorithm, the transport, the bytes this task contributes, the group's size
    /// and the peers it exchanges with. The group's first collective (`key`) first looks
    /// for shared-memory links, so that its span names the transport it takes.
    fn span(
        &self,
        key: &str,
        scope_and_type: &'static str,
        bytes: usize,
        on_nccl: bool,
    ) -> Result<TraceMe> {
        if let Transport::Ring(ring) = &self.transport {
            ring.links(key)?;
        }
        let mut span = TraceMe::new(scope_and_type);
        if span.is_recording() {
            let (algorithm, peers) = match &self.transport {
                _ if on_nccl => ("nccl", "every rank".to_string()),
                Transport::Alone => ("none", String::new()),
                Transport::Ring(ring) => ring.algorithm_and_peers(bytes),
                #[cfg(feature = "mpi")]
                Transport::Mpi(_) => ("mpi", "every rank".to_string()),
            };
            let transport = if on_nccl { "nccl" } else { self.transport() };
            span.stat("algorithm", StatValue::Str(algorithm.into()))
                .stat("transport", StatValue::Str(transport.into()))
                .stat("bytes", StatValue::U64(bytes as u64))
                .stat("group_size", StatValue::U64(self.world as u64))
                .stat("peers", StatValue::Str(peers.into()));
        }
        Ok(span)
    }

    /// How the group's messages travel: `"shared memory"` (every task on this host, found
    /// by the group's first collective), `"grpc"` (also before that first collective),
    /// `"mpi"`, or `"none"` (a group of one). Under the `Nccl` implementation, collectives
    /// of GPU tensors go through NCCL whatever this says (their profiler spans say `nccl`).
    ///
    /// ```no_run
    /// # use ferroflow_distribute::{CollectiveGroup, CommunicationOptions};
    /// # let resolver = ferroflow_cluster::TfConfigClusterResolver::from_env()?;
    /// let group = CollectiveGroup::new(&resolver, CommunicationOptions::default())?;
    /// group.barrier()?;
    /// println!("collectives over {}", group.transport());
    /// # Ok::<(), ferroflow_tensor::Error>(())
    /// ```
    pub fn transport(&self) -> &'static str {
        match &self.transport {
            Transport::Alone => "none",
            Transport::Ring(ring) => match ring.links.get() {
                Some(Some(_)) => "shared memory",
                _ => "grpc",
            },
            #[cfg(feature = "mpi")]
            Transport::Mpi(_) => "mpi",
        }
    }

    /// This task's index among the training tasks (`replica_id_in_sync_group` for one
    /// replica per task).
    pub fn rank(&self) -> usize {
        self.rank
    }

    /// How many training tasks the group has (`num_replicas_in_sync` for one replica per
    /// task).
    pub fn world_size(&self) -> usize {
        self.world
    }

    /// The sum (or mean) of `tensors` over every task of the group, on every task: tensor
    /// `i` of the result combines tensor `i` of each task, which must agree in shape and
    /// dtype. Results keep each input's device. Float dtypes reduce in f32 (f16, bf16, f32)
    /// or f64; int32 and int64 wrap as TF's do; bool and the other integer types are an
    /// error, as in TF.
    ///
    /// Each pack travels the gRPC ring (reduce-scatter then all-gather) or, over MPI, one
    /// `MPI_Allreduce`; either way every task ends with identical bits.
    pub fn all_reduce(&self, tensors: &[Tensor], op: ReduceOp) -> Result<Vec<Tensor>> {
        let instance = self.instance.fetch_add(1, Ordering::SeqCst);
        let name = format!("all_reduce {instance}");
        let bytes = tensors
            .iter()
            .map(|t| t.num_elements() * t.dtype().size_in_bytes())
            .sum();
        let on_nccl = self.nccl_device(tensors.iter().map(Tensor::device));
        let _span = self.span(
            &name,
            "allreduce/CollectiveReduceV2:CollectiveReduceV2",
            bytes,
            on_nccl.is_some(),
        )?;
        for (i, t) in tensors.iter().enumerate() {
            if !(t.dtype().is_float() || matches!(t.dtype(), DType::I32 | DType::I64)) {
                return Err(Error::UnsupportedDType {
                    op: "all_reduce",
                    dtype: t.dtype(),
                    expected: "a float dtype, int32 or int64",
                });
            }
            if op == ReduceOp::Mean && !t.dtype().is_float() {
                return Err(Error::invalid(
                    "all_reduce",
                    format!(
                        "the mean of tensor {i} ({}) needs a float dtype: cast it first",
                        t.dtype()
                    ),
                ));
            }
        }
        if let Some(device) = on_nccl {
            return self.communicator(device, &name)?.all_reduce(tensors, op);
        }
        #[cfg(feature = "mpi")]
        if let Transport::Mpi(mpi) = &self.transport {
            // MPI would mis-sum or wait forever on mismatched buffers: agree first.
            let signature: Vec<i64> = tensors
                .iter()
                .flat_map(|t| [t.num_elements() as i64, t.dtype() as i64])
                .collect();
            mpi.agree("all_reduce", &signature)?;
        }
        // Every tensor is in one pack, which writes its result here.
        let mut reduced: Vec<HostData> = vec![HostData::F32(vec![]); tensors.len()];
        for (pack_index, pack) in self.packs(tensors).into_iter().enumerate() {
            let key = format!("{name}/{pack_index}");
            let pack = Pack {
                tensors,
                indices: &pack,
            };
            reduced = match tensors[pack.indices[0]].dtype() {
                DType::F64 => self.reduce_pack::<f64>(&key, pack, op, reduced)?,
                DType::I32 => self.reduce_pack::<i32>(&key, pack, op, reduced)?,
                DType::I64 => self.reduce_pack::<i64>(&key, pack, op, reduced)?,
                _ => self.reduce_pack::<f32>(&key, pack, op, reduced)?,
            };
        }
        tensors
            .iter()
            .zip(reduced)
            .map(|(t, h)| Tensor::from_host_on(h, t.shape(), t.device()))
            .collect()
    }

    /// Every task's `tensor` concatenated along axis 0 in task order, on every task (TF's
    /// `all_gather(value, axis=0)`): the tensors must agree in dtype and shape. Any dtype.
    pub fn all_gather(&self, tensor: &Tensor) -> Result<Tensor> {
        let instance = self.instance.fetch_add(1, Ordering::SeqCst);
        let name = format!("all_gather {instance}");
        if tensor.rank() == 0 {
            return Err(Error::invalid(
                "all_gather",
                "a scalar has no axis 0 to gather along: reshape it to [1]",
            ));
        }
        let on_nccl = self.nccl_device([tensor.device()]);
        let _span = self.span(
            &name,
            "allgather/CollectiveGatherV2:CollectiveGatherV2",
            tensor.num_elements() * tensor.dtype().size_in_bytes(),
            on_nccl.is_some(),
        )?;
        if let Some(device) = on_nccl {
            return self.communicator(device, &name)?.all_gather(tensor);
        }
        let mine = tensor.to_host()?.to_le_bytes();
        let all = match &self.transport {
            Transport::Alone => mine,
            Transport::Ring(ring) => ring.all_gather(&name, mine)?,
            #[cfg(feature = "mpi")]
            Transport::Mpi(mpi) => {
                mpi.agree("all_gather", &[mine.len() as i64, tensor.dtype() as i64])?;
                mpi.all_gather(&mine)
            }
        };
        let data = HostData::from_le_bytes(tensor.dtype(), &all).ok_or_else(|| {
            Error::invalid(
                "all_gather",
                "the gathered bytes do not fill whole elements",
            )
        })?;
        let mut shape = tensor.shape().to_vec();
        shape[0] *= self.world;
        Tensor::from_host_on(data, &shape, tensor.device())
    }

    /// Task `root`'s `tensor` on every task (TF's `broadcast`): every task passes a tensor of
    /// the same dtype and shape (its values are replaced). On the ring the value travels
    /// from task to task.
    pub fn broadcast(&self, tensor: &Tensor, root: usize) -> Result<Tensor> {
        let instance = self.instance.fetch_add(1, Ordering::SeqCst);
        if root >= self.world {
            return Err(Error::invalid(
                "broadcast",
                format!("root {root} is not a task of a group of {}", self.world),
            ));
        }
        let key = format!("broadcast {instance}/0");
        let on_nccl = self.nccl_device([tensor.device()]);
        let _span = self.span(
            &key,
            if self.rank == root {
                "broadcast/CollectiveBcastSendV2:CollectiveBcastSendV2"
            } else {
                "broadcast/CollectiveBcastRecvV2:CollectiveBcastRecvV2"
            },
            tensor.num_elements() * tensor.dtype().size_in_bytes(),
            on_nccl.is_some(),
        )?;
        if let Some(device) = on_nccl {
            return self.communicator(device, &key)?.broadcast(tensor, root);
        }
        let mine = tensor.to_host()?.to_le_bytes();
        let bytes = match &self.transport {
            Transport::Alone => return Ok(tensor.clone()),
            // One message key: every hop of the chain carries the same value.
            Transport::Ring(ring) => match ring.broadcast(&key, mine.clone(), root)? {
                None => return Ok(tensor.clone()),
                Some(got) => got,
            },
            #[cfg(feature = "mpi")]
            Transport::Mpi(mpi) => {
                mpi.agree("broadcast", &[mine.len() as i64, tensor.dtype() as i64])?;
                let mut bytes = mine.clone();
                mpi.broadcast(&mut bytes, root);
                Bytes::from(bytes)
            }
        };
        if bytes.len() != mine.len() {
            return Err(Error::invalid(
                "broadcast",
                format!(
                    "the root sent {} bytes, this task's tensor has {}: the tasks' tensors differ in shape or dtype",
                    bytes.len(),
                    mine.len()
                ),
            ));
        }
        let data = HostData::from_le_bytes(tensor.dtype(), &bytes)
            .ok_or_else(|| Error::invalid("broadcast", "the bytes do not fill whole elements"))?;
        Tensor::from_host_on(data, tensor.shape(), tensor.device())
    }

    /// Waits until every task of the group has reached its barrier.
    pub fn barrier(&self) -> Result<()> {
        let instance = self.instance.fetch_add(1, Ordering::SeqCst);
        let key = format!("barrier {instance}");
        let _span = self.span(
            &key,
            "barrier/CollectiveReduceV2:CollectiveReduceV2",
            4,
            false,
        )?;
        match &self.transport {
            Transport::Alone => Ok(()),
            Transport::Ring(ring) => {
                let mut count = [1i32];
                ring.all_reduce(&key, &mut count)?;
                let n = count[0];
                if n as usize != self.world {
                    return Err(Error::invalid(
                        "barrier",
                        format!("{n} of {} tasks arrived", self.world),
                    ));
                }
                Ok(())
            }
            #[cfg(feature = "mpi")]
            Transport::Mpi(mpi) => {
                mpi.barrier();
                Ok(())
            }
        }
    }

    /// The device whose NCCL communicator carries a collective of tensors on `devices`:
    /// under the `Nccl` implementation, in a group of several tasks, when every tensor is
    /// on one GPU.
    fn nccl_device(&self, devices: impl IntoIterator<Item = Device>) -> Option<Device> {
        if self.options.implementation != CommunicationImplementation::Nccl || self.world < 2 {
            return None;
        }
        let mut devices = devices.into_iter();
        let first = devices.next()?;
        (first.kind() == DeviceKind::Gpu && devices.all(|d| d == first)).then_some(first)
    }

    /// The device communicator (NCCL's) of `device`, made by the first collective on it
    /// (`name`): the chief makes the id and sends it, or why it could not, over the ring to
    /// every task, and every task joins.
    fn communicator(&self, device: Device, name: &str) -> Result<Arc<dyn DeviceCommunicator>> {
        let mut made = self
            .device_communicators
            .lock()
            .unwrap_or_else(|e| e.into_inner());
        if let Some(c) = made.iter().find(|c| c.device() == device) {
            return Ok(c.clone());
        }
        let Transport::Ring(ring) = &self.transport else {
            return Err(Error::invalid(
                "collectives",
                "NCCL needs the ring to send its id (a group of several tasks)",
            ));
        };
        let collectives = ferroflow_tensor::distribution::device_collectives(device);
        // The chief's answer: 1 and the id, or 0 and its error.
        let chiefs = match (self.rank, &collectives) {
            (0, Some(c)) => match c.new_id(device) {
                Ok(id) => [&[1u8][..], &id].concat(),
                Err(e) => [&[0u8][..], e.to_string().as_bytes()].concat(),
            },
            (0, None) => [&[0u8][..], no_collectives(device).to_string().as_bytes()].concat(),
            _ => vec![],
        };
        let answer = match ring.broadcast(&format!("{name}/nccl id"), chiefs.clone(), 0)? {
            Some(got) => got.to_vec(),
            None => chiefs,
        };
        let id = match answer.split_first() {
            Some((1, id)) => id,
            Some((_, why)) => {
                return Err(Error::Remote {
                    op: format!("{name}: making NCCL's id"),
                    peer: ring.names[0].clone(),
                    msg: String::from_utf8_lossy(why).into_owned(),
                })
            }
            None => return Err(Error::invalid("collectives", "the chief sent no NCCL id")),
        };
        let collectives = collectives.ok_or_else(|| no_collectives(device))?;
        let communicator: Arc<dyn DeviceCommunicator> =
            Arc::from(collectives.join(device, id, self.rank, self.world, self.options.timeout)?);
        made.push(communicator.clone());
        Ok(communicator)
    }

    /// Indices of `tensors` grouped into packs: consecutive tensors of one dtype, up to
    /// `bytes_per_pack` bytes (a larger tensor is a pack of its own).
    fn packs(&self, tensors: &[Tensor]) -> Vec<Vec<usize>> {
        let mut packs: Vec<Vec<usize>> = vec![];
        let mut bytes = 0;
        for (i, t) in tensors.iter().enumerate() {
            let size = t.num_elements() * t.dtype().size_in_bytes();
            let fits = packs.last().is_some_and(|p| {
                tensors[p[0]].dtype() == t.dtype()
                    && (self.options.bytes_per_pack == 0
                        || bytes + size <= self.options.bytes_per_pack)
            });
            if let (true, Some(p)) = (fits, packs.last_mut()) {
                p.push(i);
                bytes += size;
            } else {
                packs.push(vec![i]);
                bytes = size;
            }
        }
        packs
    }

    /// All-reduces the tensors of `pack` (one dtype) as `W` values; `reduced` comes back with
    /// their results filled in.
    fn reduce_pack<W: Wire>(
        &self,
        key: &str,
        pack: Pack<'_>,
        op: ReduceOp,
        mut reduced: Vec<HostData>,
    ) -> Result<Vec<HostData>> {
        let mut flat = pack.values::<W>()?;
        match &self.transport {
            Transport::Alone => {}
            Transport::Ring(ring) => ring.all_reduce(key, &mut flat)?,
            #[cfg(feature = "mpi")]
            Transport::Mpi(mpi) => mpi.sum_in_place(&mut flat)?,
        }
        if op == ReduceOp::Mean {
            let n = self.world as f64;
            for v in &mut flat {
                *v = W::scaled(*v, 1.0 / n);
            }
        }
        if let Some(t) = pack.only() {
            reduced[pack.indices[0]] = W::write_back(flat, t.dtype());
            return Ok(reduced);
        }
        let mut at = 0;
        for &i in pack.indices {
            let t = &pack.tensors[i];
            let len = t.num_elements();
            reduced[i] = W::write_back(flat[at..at + len].to_vec(), t.dtype());
            at += len;
        }
        Ok(reduced)
    }
}

/// Tensors all-reduced together: `indices` into `tensors`, of one dtype.
#[derive(Clone, Copy)]
struct Pack<'a> {
    tensors: &'a [Tensor],
    indices: &'a [usize],
}

impl Pack<'_> {
    /// The pack's tensor when it has one.
    fn only(&self) -> Option<&Tensor> {
        match self.indices {
            [only] => Some(&self.tensors[*only]),
            _ => None,
        }
    }

    /// The pack's values, end to end, as `W`: one copy of each tensor (a one-tensor pack of
    /// the wire type moves its host copy; several tensors are concatenated, a dense CPU
    /// tensor of the wire type straight from its storage, [`Tensor::host_slice`]).
    fn values<W: Wire>(&self) -> Result<Vec<W>> {
        if let Some(t) = self.only() {
            return Ok(W::take(t.to_host()?).unwrap_or_else(|h| {
                let mut v = vec![];
                W::extend_from(&mut v, &h);
                v
            }));
        }
        let len = self
            .indices
            .iter()
            .map(|&i| self.tensors[i].num_elements())
            .sum();
        let mut v = Vec::with_capacity(len);
        for &i in self.indices {
            let t = &self.tensors[i];
            // A dense CPU tensor of the wire type is copied once, from its storage.
            match t.host_slice::<W>() {
                Some(values) => v.extend_from_slice(values),
                None => W::extend_from(&mut v, &t.to_host()?),
            }
        }
        Ok(v)
    }
}

impl Drop for Ring {
    /// Waits for the answers not yet awaited (each within the timeout), so a task that ends
    /// right after its last collective does not cut its last messages off.
    fn drop(&mut self) {
        let unanswered =
            std::mem::take(&mut *self.unanswered.lock().unwrap_or_else(|e| e.into_inner()));
        for delivery in unanswered {
            let _ = delivery.wait();
        }
    }
}

impl Ring {
    /// How an all-reduce of `bytes` travels (`ring`, or `exchange` for short data) and the
    /// peers it exchanges with, for the profiler.
    fn algorithm_and_peers(&self, bytes: usize) -> (&'static str, String) {
        if self.exchanges(bytes) {
            let others: Vec<&str> = (0..self.world)
                .filter(|&k| k != self.rank)
                .map(|k| self.names[k].as_str())
                .collect();
            ("exchange", others.join(", "))
        } else {
            let left = (self.rank + self.world - 1) % self.world;
            let right = (self.rank + 1) % self.world;
            (
                "ring",
                format!("from {} to {}", self.names[left], self.names[right]),
            )
        }
    }

    /// Whether an all-reduce of `bytes` exchanges the data directly (else it goes around
    /// the ring).
    fn exchanges(&self, bytes: usize) -> bool {
        let max = match self.links.get() {
            Some(Some(_)) => SHARED_MEMORY_EXCHANGE_MAX_BYTES,
            _ => EXCHANGE_MAX_BYTES,
        };
        bytes * (self.world - 1) <= max
    }

    /// The shared-memory links when the group has them: set up by its first collective
    /// (`key` names the setup's messages), `None` when shared memory is off or some task
    /// is on another host.
    fn links(&self, key: &str) -> Result<Option<&ShmLinks>> {
        if !self.shared_memory {
            return Ok(None);
        }
        if let Some(links) = self.links.get() {
            return Ok(links.as_ref());
        }
        let _setup = self.setup.lock().unwrap_or_else(|e| e.into_inner());
        if self.links.get().is_none() {
            let links = ShmLinks::connect(self, self.rank, self.names.clone(), self.timeout, key)?;
            let _ = self.links.set(links);
        }
        Ok(self.links.get().and_then(Option::as_ref))
    }

    /// The messages of one collective (`key` its name): over shared memory when the group
    /// has it, else gRPC. Fails first with the error of an earlier gRPC delivery.
    fn messages<'a>(&'a self, key: &'a str) -> Result<Messages<'a>> {
        self.check_unanswered()?;
        Ok(Messages {
            ring: self,
            key,
            shm: self.links(key)?,
            in_flight: vec![],
        })
    }

    /// The ring all-reduce of `data` (summed over the tasks, on every task): `data` is cut
    /// into one chunk per task; in `n-1` steps every task sends a chunk to the next task and
    /// adds the one it receives (reduce-scatter), then in `n-1` more passes the finished
    /// chunks around (all-gather). Every task ends with identical bits.
    ///
    /// Pipelined: chunks travel in segments of [`SEGMENT_BYTES`], sent without waiting, and
    /// each segment goes on to the next step as soon as it has been added, so sending,
    /// receiving and adding overlap.
    fn all_reduce<W: Wire>(&self, key: &str, data: &mut [W]) -> Result<()> {
        let mut messages = self.messages(key)?;
        let (n, r) = (self.world, self.rank);
        if self.exchanges(std::mem::size_of_val(data)) {
            self.exchange_all_reduce(&mut messages, key, data)?;
            return messages.finish();
        }
        let (left, right) = ((r + n - 1) % n, (r + 1) % n);
        let bounds: Vec<usize> = (0..=n).map(|i| i * data.len() / n).collect();
        let per_segment = (SEGMENT_BYTES / W::BYTES).max(1);
        // The segments of chunk `c`: the same on every task (at least one, maybe empty).
        let segments = |c: usize| -> Vec<std::ops::Range<usize>> {
            let (start, end) = (bounds[c], bounds[c + 1]);
            let count = (end - start).div_ceil(per_segment).max(1);
            (0..count)
                .map(|j| {
                    (start + j * per_segment).min(end)..(start + (j + 1) * per_segment).min(end)
                })
                .collect()
        };
        for (j, range) in segments(r).into_iter().enumerate() {
            messages.send(
                right,
                &format!("{key}/reduce/0/{j}"),
                &W::wire(&data[range]),
            )?;
        }
        for step in 0..n - 1 {
            let recv = (r + 2 * n - step - 1) % n;
            for (j, range) in segments(recv).into_iter().enumerate() {
                let got = format!("{key}/reduce/{step}/{j}");
                messages.receive_values(left, &got, &mut data[range.clone()], Combine::Add)?;
                // The chunk just received goes on: to the next step's sum, or, complete, to
                // the all-gather.
                let next = if step + 1 < n - 1 {
                    format!("{key}/reduce/{}/{j}", step + 1)
                } else {
                    format!("{key}/gather/0/{j}")
                };
                messages.send(right, &next, &W::wire(&data[range]))?;
            }
        }
        for step in 0..n - 1 {
            let recv = (r + n - step) % n;
            for (j, range) in segments(recv).into_iter().enumerate() {
                let got = format!("{key}/gather/{step}/{j}");
                messages.receive_values(left, &got, &mut data[range.clone()], Combine::Copy)?;
                if step + 1 < n - 1 {
                    let next = format!("{key}/gather/{}/{j}", step + 1);
                    messages.send(right, &next, &W::wire(&data[range]))?;
                }
            }
        }
        messages.finish()
    }

    /// The all-reduce of short data in one hop: every task sends its data to every other
    /// and sums all of them in task order, so every task ends with identical bits (latency
    /// bound: one message time instead of the ring's `2(n-1)`).
    fn exchange_all_reduce<W: Wire>(
        &self,
        messages: &mut Messages<'_>,
        key: &str,
        data: &mut [W],
    ) -> Result<()> {
        let (n, r) = (self.world, self.rank);
        {
            let payload = W::wire(data);
            for k in (0..n).filter(|&k| k != r) {
                messages.send(k, &format!("{key}/from/{r}"), &payload)?;
            }
        }
        // This task's values, kept aside unless they start the sum.
        let own = if r == 0 { vec![] } else { data.to_vec() };
        for k in 0..n {
            match (k == r, k == 0) {
                (true, true) => {}
                (true, false) => {
                    for (d, o) in data.iter_mut().zip(&own) {
                        *d = d.add(*o);
                    }
                }
                (false, first) => {
                    let combine = if first { Combine::Copy } else { Combine::Add };
                    messages.receive_values(k, &format!("{key}/from/{k}"), data, combine)?;
                }
            }
        }
        Ok(())
    }

    /// Fails with the error of any earlier delivery that has failed; keeps those still
    /// waiting for their answer.
    fn check_unanswered(&self) -> Result<()> {
        let mut unanswered = self.unanswered.lock().unwrap_or_else(|e| e.into_inner());
        let (done, waiting): (Vec<Delivery>, Vec<Delivery>) = std::mem::take(&mut *unanswered)
            .into_iter()
            .partition(Delivery::is_finished);
        *unanswered = waiting;
        drop(unanswered);
        for delivery in done {
            delivery.wait()?;
        }
        Ok(())
    }

    /// Every task's `mine` (of one length) concatenated in task order: the blocks pass
    /// around the ring.
    fn all_gather(&self, name: &str, mine: Vec<u8>) -> Result<Vec<u8>> {
        let mut messages = self.messages(name)?;
        let (n, r) = (self.world, self.rank);
        let (left, right) = ((r + n - 1) % n, (r + 1) % n);
        let mine = Bytes::from(mine);
        let mut blocks: Vec<Bytes> = vec![Bytes::new(); n];
        let mut passing = mine.clone();
        for step in 0..n - 1 {
            let k = format!("{name}/{step}");
            messages.send_bytes(right, &k, passing)?;
            let got = messages.receive(left, &k)?;
            let from = (r + 2 * n - step - 1) % n;
            if got.len() != mine.len() {
                return Err(Error::invalid(
                    "all_gather",
                    format!(
                        "task {from} sent {} bytes, this task has {}: the tasks' tensors differ in shape or dtype",
                        got.len(),
                        mine.len()
                    ),
                ));
            }
            blocks[from] = got.clone();
            passing = got;
        }
        messages.finish()?;
        blocks[r] = mine;
        Ok(blocks.concat())
    }

    /// Task `root`'s `mine` along the chain from the root: `None` on the root itself.
    fn broadcast(&self, key: &str, mine: Vec<u8>, root: usize) -> Result<Option<Bytes>> {
        let mut messages = self.messages(key)?;
        let (n, r) = (self.world, self.rank);
        let (left, right) = ((r + n - 1) % n, (r + 1) % n);
        if r == root {
            messages.send_bytes(right, key, Bytes::from(mine))?;
            messages.finish()?;
            return Ok(None);
        }
        let got = messages.receive(left, key)?;
        if right != root {
            messages.send_bytes(right, key, got.clone())?;
        }
        messages.finish()?;
        Ok(Some(got))
    }

    /// The message task `from` delivered to this task's gRPC mailbox under `key`, or an
    /// error naming it after the timeout.
    fn mailbox_take(&self, from: usize, key: &str) -> Result<Bytes> {
        self.server
            .mailbox()
            .take(key, self.timeout)
            .ok_or_else(|| Error::Unavailable {
                op: key.rsplit_once('/').map_or(key, |(k, _)| k).to_string(),
                peer: self.names[from].clone(),
                msg: format!(
                    "no message within {:?}: the task died or hung (the collective timeout)",
                    self.timeout
                ),
            })
    }

    /// The gRPC client of task `k`.
    fn peer(&self, k: usize) -> Result<&Arc<Peer>> {
        self.peers[k]
            .as_ref()
            .ok_or_else(|| Error::invalid("collectives", "a task sent a message to itself"))
    }
}

/// The shared-memory setup's messages travel through the gRPC mailboxes.
impl Rendezvous for Ring {
    fn send(&self, to: usize, key: &str, payload: Vec<u8>) -> Result<()> {
        self.peer(to)?.deliver(key, payload)
    }
    fn receive(&self, from: usize, key: &str) -> Result<Bytes> {
        self.mailbox_take(from, key)
    }
}

/// Whether a received chunk is added to the values or replaces them.
#[derive(Clone, Copy)]
enum Combine {
    Add,
    Copy,
}

/// The messages of one collective: over the group's shared-memory links when it has them
/// (written straight into the peer's inbox, read in place), else over gRPC.
struct Messages<'a> {
    ring: &'a Ring,
    /// The collective's name, for errors.
    key: &'a str,
    shm: Option<&'a ShmLinks>,
    /// The gRPC deliveries sent, their answers not awaited.
    in_flight: Vec<Delivery>,
}

impl Messages<'_> {
    /// Sends `payload` to task `to` under `key` without waiting for it to arrive.
    fn send(&mut self, to: usize, key: &str, payload: &[u8]) -> Result<()> {
        match self.shm {
            Some(shm) => shm.send(to, key, payload),
            None => self.send_bytes(to, key, Bytes::copy_from_slice(payload)),
        }
    }

    /// [`Messages::send`] of a payload already in a buffer of its own.
    fn send_bytes(&mut self, to: usize, key: &str, payload: Bytes) -> Result<()> {
        match self.shm {
            Some(shm) => shm.send(to, key, &payload),
            None => {
                self.in_flight.push(self.ring.peer(to)?.send(key, payload));
                Ok(())
            }
        }
    }

    /// The wait for a message from task `from`, for the profiler.
    fn wait_span(&self, from: usize) -> TraceMe {
        let mut wait = TraceMe::new(PEER_WAIT_SPAN);
        if wait.is_recording() {
            wait.stat("peer", StatValue::Str(self.ring.names[from].clone().into()));
        }
        wait
    }

    /// The message task `from` sent under `key`.
    fn receive(&mut self, from: usize, key: &str) -> Result<Bytes> {
        let _wait = self.wait_span(from);
        let Some(shm) = self.shm else {
            return self.ring.mailbox_take(from, key);
        };
        let mut got = vec![];
        shm.receive(from, key, &mut |piece| {
            match piece {
                Piece::Length(len) => got.reserve_exact(len),
                Piece::Bytes { bytes, .. } => got.extend_from_slice(bytes),
            }
            Ok(())
        })?;
        Ok(Bytes::from(got))
    }

    /// Receives the values task `from` sent under `key` into `dst`: added to it or copied
    /// over it. The message must hold exactly `dst.len()` values.
    fn receive_values<W: Wire>(
        &mut self,
        from: usize,
        key: &str,
        dst: &mut [W],
        combine: Combine,
    ) -> Result<()> {
        let combine_into = |dst: &mut [W], got: &[u8]| match combine {
            Combine::Add => W::add_into(dst, got),
            Combine::Copy => W::copy_into(dst, got),
        };
        let Some(shm) = self.shm else {
            let got = {
                let _wait = self.wait_span(from);
                self.ring.mailbox_take(from, key)?
            };
            return combine_into(dst, &got);
        };
        let _wait = self.wait_span(from);
        shm.receive(from, key, &mut |piece| match piece {
            Piece::Length(len) => W::check(dst, len),
            Piece::Bytes { offset, bytes } => {
                let at = offset / W::BYTES;
                combine_into(&mut dst[at..at + bytes.len() / W::BYTES], bytes)
            }
        })
    }

    /// The collective is over: the shared-memory messages still queued are written out;
    /// the gRPC deliveries' answers are left for the next collective to check.
    fn finish(self) -> Result<()> {
        if let Some(shm) = self.shm {
            return shm.flush(self.key);
        }
        let mut unanswered = self
            .ring
            .unanswered
            .lock()
            .unwrap_or_else(|e| e.into_inner());
        unanswered.extend(self.in_flight);
        while unanswered.len() > MAX_UNANSWERED {
            unanswered.remove(0).wait()?;
        }
        Ok(())
    }
}

/// What MPI needs of a value type: its datatype (nothing without MPI).
#[cfg(feature = "mpi")]
use mpi::datatype::Equivalence as WireEquivalence;
#[cfg(not(feature = "mpi"))]
trait WireEquivalence {}
#[cfg(not(feature = "mpi"))]
impl<T> WireEquivalence for T {}

/// A value type collectives send and add: f32, f64, i32, i64 (little-endian on the wire).
trait Wire: Element + WireEquivalence {
    const BYTES: usize;
    fn extend_from(out: &mut Vec<Self>, h: &HostData);
    /// The values of `h` when it holds this type already (moved), else `h` back.
    fn take(h: HostData) -> std::result::Result<Vec<Self>, HostData>;
    /// `values` as host data of `dtype` (moved when `dtype` is this type).
    fn write_back(values: Vec<Self>, dtype: DType) -> HostData;
    fn scaled(v: Self, by: f64) -> Self;
    /// The value's wire bytes (big-endian machines; little-endian ones copy memory).
    #[cfg_attr(target_endian = "little", allow(dead_code))]
    fn to_le(self, out: &mut Vec<u8>);
    fn from_le(b: &[u8]) -> Self;
    fn add(self, o: Self) -> Self;
    /// The values' wire bytes: their memory on a little-endian machine, converted on a
    /// big-endian one.
    fn wire(values: &[Self]) -> Cow<'_, [u8]> {
        #[cfg(target_endian = "little")]
        {
            // SAFETY: the wire types are plain numbers without padding, and on a
            // little-endian machine their bytes are the wire's.
            Cow::Borrowed(unsafe {
                std::slice::from_raw_parts(
                    values.as_ptr().cast::<u8>(),
                    std::mem::size_of_val(values),
                )
            })
        }
        #[cfg(not(target_endian = "little"))]
        {
            let mut out = Vec::with_capacity(values.len() * Self::BYTES);
            for v in values {
                v.to_le(&mut out);
            }
            Cow::Owned(out)
        }
    }
    /// Whether `got_bytes` bytes hold exactly `dst.len()` values.
    fn check(dst: &[Self], got_bytes: usize) -> Result<()> {
        if got_bytes != dst.len() * Self::BYTES {
            return Err(Error::invalid(
                "all_reduce",
                format!(
                    "a peer sent {} bytes for a chunk of {} values: the tasks' tensors differ in shape or dtype",
                    got_bytes,
                    dst.len()
                ),
            ));
        }
        Ok(())
    }
    fn add_into(dst: &mut [Self], got: &[u8]) -> Result<()> {
        Self::check(dst, got.len())?;
        for (d, b) in dst.iter_mut().zip(got.chunks_exact(Self::BYTES)) {
            *d = d.add(Self::from_le(b));
        }
        Ok(())
    }
    fn copy_into(dst: &mut [Self], got: &[u8]) -> Result<()> {
        Self::check(dst, got.len())?;
        for (d, b) in dst.iter_mut().zip(got.chunks_exact(Self::BYTES)) {
            *d = Self::from_le(b);
        }
        Ok(())
    }
}

impl Wire for f32 {
    const BYTES: usize = 4;
    fn extend_from(out: &mut Vec<f32>, h: &HostData) {
        match h {
            HostData::F32(v) => out.extend_from_slice(v),
            HostData::F16(v) => out.extend(v.iter().map(|x| x.to_f32())),
            HostData::BF16(v) => out.extend(v.iter().map(|x| x.to_f32())),
            other => out.extend(other.to_f64_vec().into_iter().map(|x| x as f32)),
        }
    }
    fn take(h: HostData) -> std::result::Result<Vec<f32>, HostData> {
        match h {
            HostData::F32(v) => Ok(v),
            other => Err(other),
        }
    }
    fn write_back(values: Vec<f32>, dtype: DType) -> HostData {
        match dtype {
            DType::F16 => HostData::F16(values.iter().map(|&x| f16::from_f32(x)).collect()),
            DType::BF16 => HostData::BF16(values.iter().map(|&x| bf16::from_f32(x)).collect()),
            _ => HostData::F32(values),
        }
    }
    fn scaled(v: f32, by: f64) -> f32 {
        (v as f64 * by) as f32
    }
    fn to_le(self, out: &mut Vec<u8>) {
        out.extend_from_slice(&self.to_le_bytes());
    }
    fn from_le(b: &[u8]) -> f32 {
        f32::from_le_bytes([b[0], b[1], b[2], b[3]])
    }
    fn add(self, o: f32) -> f32 {
        self + o
    }
}

impl Wire for f64 {
    const BYTES: usize = 8;
    fn extend_from(out: &mut Vec<f64>, h: &HostData) {
        out.extend(h.to_f64_vec());
    }
    fn take(h: HostData) -> std::result::Result<Vec<f64>, HostData> {
        match h {
            HostData::F64(v) => Ok(v),
            other => Err(other),
        }
    }
    fn write_back(values: Vec<f64>, _: DType) -> HostData {
        HostData::F64(values)
    }
    fn scaled(v: f64, by: f64) -> f64 {
        v * by
    }
    fn to_le(self, out: &mut Vec<u8>) {
        out.extend_from_slice(&self.to_le_bytes());
    }
    fn from_le(b: &[u8]) -> f64 {
        let mut a = [0u8; 8];
        a.copy_from_slice(&b[..8]);
        f64::from_le_bytes(a)
    }
    fn add(self, o: f64) -> f64 {
        self + o
    }
}

impl Wire for i32 {
    const BYTES: usize = 4;
    fn extend_from(out: &mut Vec<i32>, h: &HostData) {
        if let HostData::I32(v) = h {
            out.extend_from_slice(v);
        }
    }
    fn take(h: HostData) -> std::result::Result<Vec<i32>, HostData> {
        match h {
            HostData::I32(v) => Ok(v),
            other => Err(other),
        }
    }
    fn write_back(values: Vec<i32>, _: DType) -> HostData {
        HostData::I32(values)
    }
    fn scaled(v: i32, _: f64) -> i32 {
        v // the mean of integers is refused before
    }
    fn to_le(self, out: &mut Vec<u8>) {
        out.extend_from_slice(&self.to_le_bytes());
    }
    fn from_le(b: &[u8]) -> i32 {
        i32::from_le_bytes([b[0], b[1], b[2], b[3]])
    }
    fn add(self, o: i32) -> i32 {
        self.wrapping_add(o)
    }
}

impl Wire for i64 {
    const BYTES: usize = 8;
    fn extend_from(out: &mut Vec<i64>, h: &HostData) {
        if let HostData::I64(v) = h {
            out.extend_from_slice(v);
        }
    }
    fn take(h: HostData) -> std::result::Result<Vec<i64>, HostData> {
        match h {
            HostData::I64(v) => Ok(v),
            other => Err(other),
        }
    }
    fn write_back(values: Vec<i64>, _: DType) -> HostData {
        HostData::I64(values)
    }
    fn scaled(v: i64, _: f64) -> i64 {
        v
    }
    fn to_le(self, out: &mut Vec<u8>) {
        out.extend_from_slice(&self.to_le_bytes());
    }
    fn from_le(b: &[u8]) -> i64 {
        let mut a = [0u8; 8];
        a.copy_from_slice(&b[..8]);
        i64::from_le_bytes(a)
    }
    fn add(self, o: i64) -> i64 {
        self.wrapping_add(o)
    }
}
