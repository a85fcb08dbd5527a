//! NVIDIA's NCCL: all-reduce, all-gather and broadcast of tensors on CUDA devices across
//! processes, the `Nccl` implementation of the distribution crate's collectives (TF's
//! `CommunicationImplementation.NCCL`).
//!
//! `libnccl.so.2` is loaded at run time like the backend's other libraries (the pip wheel
//! `nvidia-nccl-cu12` has it; put its `lib` folder on `LD_LIBRARY_PATH`), through bindings
//! of our own to the few functions used, so that a missing library or symbol is an error,
//! never a panic. One process makes a [`NcclId`] (NCCL's `ncclUniqueId`: the address of its
//! bootstrap listener), the others receive it by any channel (the distribution crate sends
//! it over its gRPC ring), and each rank builds a [`NcclCommunicator`] for its device. The
//! communicators are NCCL's non-blocking kind: the host waits for each collective with the
//! communicator's timeout, checking NCCL's asynchronous error meanwhile, and a collective
//! that does not finish in time aborts the communicator and returns
//! [`Error::Unavailable`], so a dead peer is an error, not a hang. The collectives run on the
//! device's stream, in order with every other op.
//!
//! On the host emulation ([`crate::emulation`]) a stand-in takes NCCL's place: the id holds
//! the loopback address of a hub thread in the process that made it, each rank connects to
//! it over TCP and the hub combines the ranks' bytes (sums in float64 in rank order, then
//! rounded to the dtype; integers wrap). Processes with emulated devices thus run the
//! distribution crate's NCCL path, its id exchange and its tensor handling, for real across
//! processes, without a GPU; what only a GPU can check is NCCL itself.
//!
//! ```no_run
//! use ferroflow_cuda::nccl::{NcclCommunicator, NcclId};
//! use ferroflow_tensor::distribution::ReduceOp;
//! use ferroflow_tensor::{Device, Tensor};
//! use std::time::Duration;
//! // A communicator of one rank on /GPU:0 (ranks of several processes share the id).
//! let gpu = Device::gpu(0);
//! let id = NcclId::new(gpu)?;
//! let comm = NcclCommunicator::new(gpu, &id, 0, 1, Duration::from_secs(60))?;
//! let x = Tensor::from_vec(vec![1.0f32, 2.0], &[2])?.to_device(gpu)?;
//! let sum = comm.all_reduce(&[x], ReduceOp::Sum)?;
//! # Ok::<(), ferroflow_tensor::Error>(())
//! ```

mod stand_in;

use std::ffi::{c_char, c_int, c_void};
use std::sync::{Arc, Mutex, OnceLock};
use std::time::{Duration, Instant};

use ferroflow_tensor::distribution::{
    DeviceCollectives, DeviceCommunicator, LocalDeviceGroup, ReduceOp,
};
use ferroflow_tensor::{BufferBox, DType, Device, Error, Result, Tensor};

use crate::exec::Gpu;
use crate::{output, Cuda, CudaBuffer, DenseOperand, BACKEND};

/// The bytes of a [`NcclId`] (NCCL's `NCCL_UNIQUE_ID_BYTES`).
pub const NCCL_ID_BYTES: usize = 128;

/// What every rank of one communicator shares (NCCL's `ncclUniqueId`): made by one process
/// ([`NcclId::new`]) and sent to the others as bytes ([`NcclId::as_bytes`],
/// [`NcclId::from_bytes`]).
///
/// ```no_run
/// # use ferroflow_cuda::nccl::NcclId;
/// let id = NcclId::new(ferroflow_tensor::Device::gpu(0))?;
/// assert_eq!(NcclId::from_bytes(id.as_bytes())?, id);
/// # Ok::<(), ferroflow_tensor::Error>(())
/// ```
#[derive(Clone, PartialEq, Eq)]
pub struct NcclId([u8; NCCL_ID_BYTES]);

impl std::fmt::Debug for NcclId {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "NcclId(")?;
        for b in &self.0[..16] {
            write!(f, "{b:02x}")?;
        }
        write!(f, "..)")
    }
}

impl NcclId {
    /// A new id for the communicators of `device`'s kind: NCCL's (`ncclGetUniqueId`, which
    /// starts its bootstrap listener in this process) for a GPU, the stand-in's (its hub,
    /// in this process) for the emulated device. An error naming the library when NCCL does
    /// not load, or the device when it is not a CUDA device.
    pub fn new(device: Device) -> Result<NcclId> {
        let cuda = crate::serving(device, "NcclId::new")?;
        let gpu = cuda.gpu(device.index())?;
        match gpu.context_and_stream() {
            None => stand_in::new_id(),
            Some(_) => NcclId::from_library(),
        }
    }

    /// NCCL's `ncclGetUniqueId` (no device needed).
    fn from_library() -> Result<NcclId> {
        let nccl = library()?;
        let mut id = RawId([0; NCCL_ID_BYTES]);
        // SAFETY: NCCL writes the 128 bytes of `id`.
        nccl.check("ncclGetUniqueId", unsafe { (nccl.get_unique_id)(&mut id) })?;
        Ok(NcclId(id.0))
    }

    /// The id from the bytes another process sent; an error unless they are 128.
    pub fn from_bytes(bytes: &[u8]) -> Result<NcclId> {
        let id: [u8; NCCL_ID_BYTES] = bytes.try_into().map_err(|_| {
            Error::invalid(
                "NcclId::from_bytes",
                format!("an NCCL id has {NCCL_ID_BYTES} bytes, not {}", bytes.len()),
            )
        })?;
        Ok(NcclId(id))
    }

    /// The id's bytes, to send to the other ranks.
    pub fn as_bytes(&self) -> &[u8; NCCL_ID_BYTES] {
        &self.0
    }
}

/// NCCL's version where `libnccl.so.2` loads (`NCCL 2.21.5`), or why it does not (no GPU is
/// needed to ask).
///
/// ```
/// match ferroflow_cuda::nccl::nccl_version() {
///     Ok(v) => assert!(v.starts_with("NCCL 2.")),
///     Err(why) => println!("no NCCL: {why}"),
/// }
/// ```
pub fn nccl_version() -> std::result::Result<String, String> {
    let nccl = library().map_err(|e| e.to_string())?;
    let mut code: c_int = 0;
    // SAFETY: NCCL writes one integer.
    nccl.check("ncclGetVersion", unsafe { (nccl.get_version)(&mut code) })
        .map_err(|e| e.to_string())?;
    // NCCL_VERSION(X, Y, Z): X·10000 + Y·100 + Z since 2.9, X·1000 + Y·100 + Z before.
    let (major, minor, patch) = if code >= 10000 {
        (code / 10000, code % 10000 / 100, code % 100)
    } else {
        (code / 1000, code % 1000 / 100, code % 100)
    };
    Ok(format!("NCCL {major}.{minor}.{patch}"))
}

/// One rank's membership of an NCCL communicator on one CUDA device: its collectives take
/// tensors on that device and return tensors there. Every rank calls the same collectives
/// in the same order with tensors of the same shapes and dtypes (NCCL's rule).
///
/// ```no_run
/// # use ferroflow_cuda::nccl::{NcclCommunicator, NcclId};
/// # use ferroflow_tensor::{Device, Tensor};
/// # let (id, rank, world) = (NcclId::new(Device::gpu(0))?, 0, 1);
/// let comm = NcclCommunicator::new(Device::gpu(0), &id, rank, world, std::time::Duration::from_secs(60))?;
/// let x = Tensor::from_vec(vec![1i64, 2], &[1, 2])?.to_device(Device::gpu(0))?;
/// let all = comm.all_gather(&x)?; // [world, 2]
/// let from_root = comm.broadcast(&x, 0)?;
/// # Ok::<(), ferroflow_tensor::Error>(())
/// ```
pub struct NcclCommunicator {
    cuda: Arc<Cuda>,
    device: Device,
    rank: usize,
    world: usize,
    timeout: Duration,
    link: Link,
}

/// How a communicator's collectives travel.
enum Link {
    /// NCCL's communicator (`None` once aborted after a failure).
    Nccl(Mutex<Option<RawComm>>),
    /// The emulation's stand-in.
    StandIn(Mutex<stand_in::Member>),
}

/// NCCL's `ncclComm_t`.
#[derive(Clone, Copy)]
struct RawComm(*mut c_void);

// SAFETY: an NCCL communicator may be used from any thread, one call at a time (the
// `Mutex` around it).
unsafe impl Send for RawComm {}

impl NcclCommunicator {
    /// Joins the communicator of `world` ranks that `id` names as rank `rank`, on `device`
    /// (a CUDA device, or the emulated one with an id the stand-in made). Waits for every
    /// rank to join, at most `timeout`: the ranks call this at about the same time.
    pub fn new(
        device: Device,
        id: &NcclId,
        rank: usize,
        world: usize,
        timeout: Duration,
    ) -> Result<NcclCommunicator> {
        if world == 0 || rank >= world || c_int::try_from(world).is_err() {
            return Err(Error::invalid(
                "NcclCommunicator::new",
                format!("rank {rank} is not a rank of a communicator of {world}"),
            ));
        }
        let cuda = crate::serving(device, "NcclCommunicator::new")?;
        let gpu = cuda.gpu(device.index())?;
        let link = match gpu.context_and_stream() {
            None => Link::StandIn(Mutex::new(stand_in::Member::join(
                id, rank, world, timeout,
            )?)),
            Some((ctx, _)) => {
                let nccl = library()?;
                let raw = nccl.init_rank(ctx, id, rank, world)?;
                let deadline = Instant::now() + timeout;
                if let Err(e) = nccl.wait(&raw, deadline, None) {
                    // SAFETY: the communicator is NCCL's and used nowhere else.
                    unsafe { (nccl.comm_abort)(raw.0) };
                    return Err(unavailable(
                        "NcclCommunicator::new",
                        rank,
                        world,
                        format!("joining: {e}"),
                    ));
                }
                Link::Nccl(Mutex::new(Some(raw)))
            }
        };
        Ok(NcclCommunicator {
            cuda,
            device,
            rank,
            world,
            timeout,
            link,
        })
    }

    /// One communicator per device of this process, ranks in the order of `devices`
    /// (distinct CUDA devices, or the emulation's), as NCCL's `ncclCommInitAll`: what
    /// MirroredStrategy's local replicas all-reduce through
    /// ([`Self::all_reduce_together`]).
    ///
    /// ```no_run
    /// # use ferroflow_cuda::nccl::NcclCommunicator;
    /// # use ferroflow_tensor::Device;
    /// let gpus = [Device::gpu(0), Device::gpu(1)];
    /// let comms = NcclCommunicator::for_devices(&gpus, std::time::Duration::from_secs(60))?;
    /// assert_eq!(comms[1].rank(), 1);
    /// # Ok::<(), ferroflow_tensor::Error>(())
    /// ```
    pub fn for_devices(devices: &[Device], timeout: Duration) -> Result<Vec<NcclCommunicator>> {
        let Some(&first) = devices.first() else {
            return Err(Error::invalid(
                "NcclCommunicator::for_devices",
                "no devices",
            ));
        };
        for (i, d) in devices.iter().enumerate() {
            if devices[..i].contains(d) {
                return Err(Error::invalid(
                    "NcclCommunicator::for_devices",
                    format!("{d} is listed twice (NCCL runs one rank per device)"),
                ));
            }
        }
        let world = devices.len();
        let id = NcclId::new(first)?;
        let cuda = crate::serving(first, "NcclCommunicator::for_devices")?;
        if cuda.gpu(first.index())?.context_and_stream().is_none() {
            // The stand-in's ranks each wait for every other to join: one thread each.
            return std::thread::scope(|s| {
                let handles: Vec<_> = devices
                    .iter()
                    .enumerate()
                    .map(|(rank, &d)| {
                        let id = &id;
                        s.spawn(move || NcclCommunicator::new(d, id, rank, world, timeout))
                    })
                    .collect();
                handles
                    .into_iter()
                    .map(|h| {
                        h.join().unwrap_or_else(|_| {
                            Err(Error::invalid("for_devices", "a rank's thread panicked"))
                        })
                    })
                    .collect()
            });
        }
        let nccl = library()?;
        let mut comms = Vec::with_capacity(world);
        let mut made = Ok(());
        // SAFETY: no arguments; the group is closed below on every path.
        nccl.check_queued("ncclGroupStart", unsafe { (nccl.group_start)() })?;
        for (rank, &device) in devices.iter().enumerate() {
            let joined = crate::serving(device, "NcclCommunicator::for_devices").and_then(|c| {
                let (ctx, _) = c.gpu(device.index())?.context_and_stream().ok_or_else(|| {
                    Error::invalid("for_devices", "a real GPU and the emulation mixed")
                })?;
                // Inside the group NCCL joins the ranks at its end.
                let raw = nccl.init_rank(ctx, &id, rank, world)?;
                Ok((c, raw))
            });
            match joined {
                Ok(c) => comms.push((device, c)),
                Err(e) => {
                    made = Err(e);
                    break;
                }
            }
        }
        // SAFETY: closes the group opened above.
        let ended = nccl.check_queued("ncclGroupEnd", unsafe { (nccl.group_end)() });
        let deadline = Instant::now() + timeout;
        let ready = made.and(ended).and_then(|()| {
            comms
                .iter()
                .try_for_each(|(_, (_, raw))| nccl.wait(raw, deadline, None))
        });
        if let Err(e) = ready {
            for (_, (_, raw)) in &comms {
                // SAFETY: the communicators are ours and used nowhere else.
                unsafe { (nccl.comm_abort)(raw.0) };
            }
            return Err(unavailable(
                "for_devices",
                0,
                world,
                format!("joining: {e}"),
            ));
        }
        Ok(comms
            .into_iter()
            .enumerate()
            .map(|(rank, (device, (cuda, raw)))| NcclCommunicator {
                cuda,
                device,
                rank,
                world,
                timeout,
                link: Link::Nccl(Mutex::new(Some(raw))),
            })
            .collect())
    }

    /// This rank.
    pub fn rank(&self) -> usize {
        self.rank
    }

    /// How many ranks the communicator has.
    pub fn world_size(&self) -> usize {
        self.world
    }

    /// The device its tensors are on.
    pub fn device(&self) -> Device {
        self.device
    }

    /// Whether NCCL carries the collectives (`false`: the emulation's stand-in).
    pub fn is_nccl(&self) -> bool {
        matches!(self.link, Link::Nccl(_))
    }

    /// Tensor `i` of the result combines tensor `i` of every rank (`ncclAllReduce`, one
    /// group for all): float dtypes, int32 and int64 (which wrap); `Mean` for floats
    /// only. NCCL sums float16 and bfloat16 in their own precision.
    pub fn all_reduce(&self, tensors: &[Tensor], op: ReduceOp) -> Result<Vec<Tensor>> {
        let calls = self.reduce_calls(tensors, op)?;
        let outputs = self.run("all_reduce", tensors, &calls)?;
        self.tensors(outputs, tensors)
    }

    /// The communicators `comms` of this process (one per device, [`Self::for_devices`])
    /// all-reduce `tensors[i]` on `comms[i]` together, in one NCCL group, as TF's
    /// `NcclAllReduce` does for MirroredStrategy's local replicas: result `i` is on
    /// communicator `i`'s device, tensor `j` of it the combination of tensor `j` of every
    /// communicator's list (the lists agree in length, shapes and dtypes).
    pub fn all_reduce_together(
        comms: &[NcclCommunicator],
        tensors: &[Vec<Tensor>],
        op: ReduceOp,
    ) -> Result<Vec<Vec<Tensor>>> {
        if comms.len() != tensors.len() {
            return Err(Error::invalid(
                "all_reduce_together",
                format!(
                    "{} lists of tensors for {} communicators",
                    tensors.len(),
                    comms.len()
                ),
            ));
        }
        let calls = comms
            .iter()
            .zip(tensors)
            .map(|(c, t)| c.reduce_calls(t, op))
            .collect::<Result<Vec<_>>>()?;
        if comms.iter().any(|c| !c.is_nccl()) {
            // The stand-in's members each wait for the hub's answer: one thread each.
            return std::thread::scope(|s| {
                let handles: Vec<_> = comms
                    .iter()
                    .zip(tensors)
                    .map(|(c, t)| s.spawn(move || c.all_reduce(t, op)))
                    .collect();
                handles
                    .into_iter()
                    .map(|h| {
                        h.join().unwrap_or_else(|_| {
                            Err(Error::invalid(
                                "all_reduce_together",
                                "a rank's thread panicked",
                            ))
                        })
                    })
                    .collect()
            });
        }
        let parts: Vec<(&NcclCommunicator, &[Tensor], &[Call])> = comms
            .iter()
            .zip(tensors)
            .zip(&calls)
            .map(|((c, t), k)| (c, t.as_slice(), k.as_slice()))
            .collect();
        let outputs = run_group("all_reduce", &parts)?;
        comms
            .iter()
            .zip(outputs)
            .zip(tensors)
            .map(|((c, out), t)| c.tensors(out, t))
            .collect()
    }

    /// The calls of an all-reduce of `tensors`, checked: on this device, dtypes NCCL
    /// reduces.
    fn reduce_calls(&self, tensors: &[Tensor], op: ReduceOp) -> Result<Vec<Call>> {
        tensors
            .iter()
            .map(|t| {
                self.check_device(t, "all_reduce")?;
                let dtype = t.dtype();
                let data_type = data_type(dtype)?;
                if op == ReduceOp::Mean && !dtype.is_float() {
                    return Err(Error::UnsupportedDType {
                        op: "all_reduce (average)",
                        dtype,
                        expected: "a float dtype",
                    });
                }
                let bytes = t.num_elements() * dtype.size_in_bytes();
                Ok(Call {
                    kind: CallKind::AllReduce(op),
                    data_type,
                    count: t.num_elements(),
                    in_bytes: bytes,
                    out_bytes: bytes,
                })
            })
            .collect()
    }

    /// The results over `outputs`, shaped as `like`.
    fn tensors(&self, outputs: Vec<CudaBuffer>, like: &[Tensor]) -> Result<Vec<Tensor>> {
        like.iter()
            .zip(outputs)
            .map(|(t, out)| self.tensor(out, t.shape(), t.dtype()))
            .collect()
    }

    /// Every rank's `tensor` concatenated along axis 0 in rank order (`ncclAllGather`): any
    /// dtype, the same shape on every rank.
    pub fn all_gather(&self, tensor: &Tensor) -> Result<Tensor> {
        self.check_device(tensor, "all_gather")?;
        if tensor.rank() == 0 {
            return Err(Error::invalid(
                "all_gather",
                "a scalar has no axis 0 to gather along: reshape it to [1]",
            ));
        }
        let bytes = tensor.num_elements() * tensor.dtype().size_in_bytes();
        let call = Call {
            kind: CallKind::AllGather,
            data_type: NCCL_INT8,
            count: bytes,
            in_bytes: bytes,
            out_bytes: bytes * self.world,
        };
        let out = self
            .run("all_gather", std::slice::from_ref(tensor), &[call])?
            .pop()
            .ok_or_else(|| Error::invalid("all_gather", "NCCL returned no output"))?;
        let mut shape = tensor.shape().to_vec();
        shape[0] *= self.world;
        self.tensor(out, &shape, tensor.dtype())
    }

    /// Rank `root`'s `tensor` on every rank (`ncclBroadcast`): any dtype, the same shape on
    /// every rank (the others' values are replaced).
    pub fn broadcast(&self, tensor: &Tensor, root: usize) -> Result<Tensor> {
        self.check_device(tensor, "broadcast")?;
        if root >= self.world {
            return Err(Error::invalid(
                "broadcast",
                format!(
                    "root {root} is not a rank of a communicator of {}",
                    self.world
                ),
            ));
        }
        let bytes = tensor.num_elements() * tensor.dtype().size_in_bytes();
        let call = Call {
            kind: CallKind::Broadcast(root),
            data_type: NCCL_INT8,
            count: bytes,
            in_bytes: bytes,
            out_bytes: bytes,
        };
        let out = self
            .run("broadcast", std::slice::from_ref(tensor), &[call])?
            .pop()
            .ok_or_else(|| Error::invalid("broadcast", "NCCL returned no output"))?;
        self.tensor(out, tensor.shape(), tensor.dtype())
    }

    fn check_device(&self, t: &Tensor, op: &'static str) -> Result<()> {
        if t.device() != self.device {
            return Err(Error::DeviceMismatch {
                op,
                lhs: t.device().to_string(),
                rhs: format!("{} (the NCCL communicator's)", self.device),
            });
        }
        Ok(())
    }

    fn gpu(&self) -> Result<&Gpu> {
        self.cuda.gpu(self.device.index())
    }

    /// A result tensor over `out`.
    fn tensor(&self, out: CudaBuffer, shape: &[usize], dtype: DType) -> Result<Tensor> {
        Tensor::from_backend_buffer(Box::new(out) as BufferBox, shape, dtype, self.device)
    }

    /// Runs `calls[i]` on `inputs[i]` (dense first where a view is not), one output each.
    fn run(&self, op: &'static str, inputs: &[Tensor], calls: &[Call]) -> Result<Vec<CudaBuffer>> {
        match &self.link {
            Link::StandIn(member) => {
                let gpu = self.gpu()?;
                let dense = inputs
                    .iter()
                    .map(|t| self.cuda.dense_aligned(t.operand()))
                    .collect::<Result<Vec<DenseOperand<'_>>>>()?;
                let mut member = member.lock().unwrap_or_else(|e| e.into_inner());
                dense
                    .iter()
                    .zip(calls)
                    .map(|(x, call)| {
                        let (mem, offset) = x.at();
                        let mine = gpu.download(mem, offset..offset + call.in_bytes)?;
                        let got = member.call(op, call, &mine)?;
                        if got.len() != call.out_bytes {
                            return Err(Error::invalid(
                                op,
                                format!(
                                    "the stand-in answered {} bytes, {} expected",
                                    got.len(),
                                    call.out_bytes
                                ),
                            ));
                        }
                        Ok(CudaBuffer {
                            mem: gpu.upload(&got)?,
                            bytes: call.out_bytes,
                            ordinal: gpu.ordinal,
                        })
                    })
                    .collect()
            }
            Link::Nccl(_) => run_group(op, &[(self, inputs, calls)])?
                .pop()
                .ok_or_else(|| Error::invalid(op, "NCCL returned no outputs")),
        }
    }
}

/// One communicator's share of an NCCL group: its communicator, context and stream, its
/// dense inputs, its calls and their outputs.
struct GroupPart<'a> {
    comm: RawComm,
    ctx: &'a Arc<cudarc::driver::CudaContext>,
    stream: &'a Arc<cudarc::driver::CudaStream>,
    inputs: Vec<DenseOperand<'a>>,
    calls: &'a [Call],
    outputs: Vec<CudaBuffer>,
    timeout: Duration,
}

/// Runs each part's calls (a communicator of this process, its inputs, its calls) in one
/// NCCL group on the devices' streams and waits for them, at most each communicator's
/// timeout; one list of outputs per part. A failure aborts every communicator of the group
/// (NCCL's peers of a failed group may wait forever otherwise).
fn run_group(
    op: &'static str,
    parts: &[(&NcclCommunicator, &[Tensor], &[Call])],
) -> Result<Vec<Vec<CudaBuffer>>> {
    let nccl = library()?;
    let (first_rank, world) = parts.first().map_or((0, 0), |(c, _, _)| (c.rank, c.world));
    let mut slots = Vec::with_capacity(parts.len());
    for (c, _, _) in parts {
        let Link::Nccl(slot) = &c.link else {
            return Err(Error::invalid(
                op,
                "an NCCL group cannot take the emulation's stand-in",
            ));
        };
        slots.push(slot.lock().unwrap_or_else(|e| e.into_inner()));
    }
    let mut group = Vec::with_capacity(parts.len());
    for ((c, inputs, calls), slot) in parts.iter().zip(&slots) {
        let comm = (*slot).ok_or_else(|| {
            unavailable(
                op,
                c.rank,
                c.world,
                "the communicator was aborted after an earlier collective failed".into(),
            )
        })?;
        let gpu = c.gpu()?;
        let (ctx, stream) = gpu
            .context_and_stream()
            .ok_or_else(|| Error::invalid(op, "an NCCL communicator's device is not a GPU"))?;
        group.push(GroupPart {
            comm,
            ctx,
            stream,
            inputs: inputs
                .iter()
                .map(|t| c.cuda.dense_aligned(t.operand()))
                .collect::<Result<_>>()?,
            calls,
            outputs: calls
                .iter()
                .map(|k| output(gpu, k.out_bytes))
                .collect::<Result<_>>()?,
            timeout: c.timeout,
        });
    }
    match queue_group(nccl, &mut group).and_then(|()| wait_group(nccl, &group)) {
        Ok(()) => Ok(group.into_iter().map(|p| p.outputs).collect()),
        Err(e) => {
            for slot in &mut slots {
                if let Some(comm) = slot.take() {
                    // SAFETY: the communicator is ours and dropped here (aborting stops
                    // its queued work, so the buffers may be freed after).
                    unsafe { (nccl.comm_abort)(comm.0) };
                }
            }
            Err(unavailable(op, first_rank, world, e.to_string()))
        }
    }
}

/// Queues every part's calls between one `ncclGroupStart` and its `ncclGroupEnd`.
fn queue_group(nccl: &Nccl, group: &mut [GroupPart<'_>]) -> Result<()> {
    let outside = || Error::invalid("NCCL", "an operand lies outside its buffer");
    // SAFETY: no arguments; the group is closed below on every path.
    let mut queued = nccl.check_queued("ncclGroupStart", unsafe { (nccl.group_start)() });
    'parts: for part in group.iter_mut() {
        if let Err(e) = part.ctx.bind_to_thread() {
            queued = Err(crate::exec::driver(
                "making the context current for NCCL",
                e,
            ));
            break;
        }
        let s = part.stream.cu_stream() as *mut c_void;
        for ((x, call), out) in part.inputs.iter().zip(part.calls).zip(&mut part.outputs) {
            if queued.is_err() {
                break 'parts;
            }
            if call.count == 0 {
                continue;
            }
            let (mem, offset) = x.at();
            let (Some(src), Some(dst)) = (
                mem.device_address(part.stream, offset),
                out.mem.device_address(part.stream, 0),
            ) else {
                queued = Err(outside());
                break 'parts;
            };
            let (src, dst, c) = (src as *const c_void, dst as *mut c_void, part.comm.0);
            // SAFETY: `src` holds `in_bytes` from its offset and `dst` `out_bytes` (both
            // this communicator's device's, alive until its stream has run the call: their
            // frees are queued behind it); `c` is a live communicator of that device.
            let code = unsafe {
                match call.kind {
                    CallKind::AllReduce(op) => {
                        (nccl.all_reduce)(src, dst, call.count, call.data_type, reduction(op), c, s)
                    }
                    CallKind::AllGather => {
                        (nccl.all_gather)(src, dst, call.count, call.data_type, c, s)
                    }
                    CallKind::Broadcast(root) => {
                        (nccl.broadcast)(src, dst, call.count, call.data_type, root as c_int, c, s)
                    }
                }
            };
            queued = nccl.check_queued(call.kind.name(), code);
        }
    }
    // SAFETY: closes the group opened above (also after a failed call).
    let ended = nccl.check_queued("ncclGroupEnd", unsafe { (nccl.group_end)() });
    queued.and(ended)
}

/// Waits until every part's communicator has queued its calls and its stream has run
/// them, NCCL's asynchronous errors checked meanwhile.
fn wait_group(nccl: &Nccl, group: &[GroupPart<'_>]) -> Result<()> {
    let started = Instant::now();
    for part in group {
        let deadline = started + part.timeout;
        nccl.wait(&part.comm, deadline, None)?;
        let done = part
            .stream
            .record_event(None)
            .map_err(|e| crate::exec::driver("recording an event after NCCL", e))?;
        nccl.wait(&part.comm, deadline, Some(&done))?;
    }
    Ok(())
}

impl Drop for NcclCommunicator {
    fn drop(&mut self) {
        if let Link::Nccl(comm) = &self.link {
            let slot = comm.lock().unwrap_or_else(|e| e.into_inner()).take();
            if let (Some(raw), Ok(nccl)) = (slot, library()) {
                // SAFETY: the communicator is ours and no call of it is in flight (each
                // collective waited for its work). A non-blocking destroy may return
                // "in progress"; NCCL finishes it on its own.
                unsafe { (nccl.comm_destroy)(raw.0) };
            }
        }
    }
}

/// NCCL as the backend's [`DeviceCollectives`] (registered with the CUDA devices, real or
/// emulated): what the distribution crate's `Nccl` implementation and `NcclAllReduce` use.
///
/// ```
/// use ferroflow_cuda::nccl::NcclCollectives;
/// use ferroflow_tensor::distribution::DeviceCollectives;
/// // It serves no host device.
/// assert!(!NcclCollectives.serves(ferroflow_tensor::Device::CPU));
/// ```
pub struct NcclCollectives;

impl DeviceCollectives for NcclCollectives {
    fn name(&self) -> String {
        "NCCL".into()
    }
    fn serves(&self, device: Device) -> bool {
        crate::serving(device, "NCCL").is_ok()
    }
    fn new_id(&self, device: Device) -> Result<Vec<u8>> {
        Ok(NcclId::new(device)?.as_bytes().to_vec())
    }
    fn join(
        &self,
        device: Device,
        id: &[u8],
        rank: usize,
        world: usize,
        timeout: Duration,
    ) -> Result<Box<dyn DeviceCommunicator>> {
        let id = NcclId::from_bytes(id)?;
        Ok(Box::new(NcclCommunicator::new(
            device, &id, rank, world, timeout,
        )?))
    }
    fn local_group(
        &self,
        devices: &[Device],
        timeout: Duration,
    ) -> Result<Box<dyn LocalDeviceGroup>> {
        Ok(Box::new(NcclLocalGroup(NcclCommunicator::for_devices(
            devices, timeout,
        )?)))
    }
}

impl DeviceCommunicator for NcclCommunicator {
    fn device(&self) -> Device {
        self.device
    }
    fn all_reduce(&self, tensors: &[Tensor], op: ReduceOp) -> Result<Vec<Tensor>> {
        NcclCommunicator::all_reduce(self, tensors, op)
    }
    fn all_gather(&self, tensor: &Tensor) -> Result<Tensor> {
        NcclCommunicator::all_gather(self, tensor)
    }
    fn broadcast(&self, tensor: &Tensor, root: usize) -> Result<Tensor> {
        NcclCommunicator::broadcast(self, tensor, root)
    }
}

/// The communicators of this process's devices, all-reducing together.
struct NcclLocalGroup(Vec<NcclCommunicator>);

impl LocalDeviceGroup for NcclLocalGroup {
    fn devices(&self) -> Vec<Device> {
        self.0.iter().map(|c| c.device).collect()
    }
    fn all_reduce(&self, per_device: &[Vec<Tensor>], op: ReduceOp) -> Result<Vec<Vec<Tensor>>> {
        // TF's op of MirroredStrategy's NCCL all-reduce, for the profiler.
        let mut span =
            ferroflow_tensor::trace::TraceMe::new("allreduce/NcclAllReduce:NcclAllReduce");
        if span.is_recording() {
            use ferroflow_tensor::trace::StatValue;
            let bytes: usize = per_device.first().map_or(0, |ts| {
                ts.iter()
                    .map(|t| t.num_elements() * t.dtype().size_in_bytes())
                    .sum()
            });
            span.stat("algorithm", StatValue::Str("nccl".into()))
                .stat("transport", StatValue::Str("nccl".into()))
                .stat("bytes", StatValue::U64(bytes as u64))
                .stat("group_size", StatValue::U64(self.0.len() as u64));
        }
        NcclCommunicator::all_reduce_together(&self.0, per_device, op)
    }
}

/// The error of a collective that failed or timed out.
fn unavailable(op: &str, rank: usize, world: usize, msg: String) -> Error {
    Error::Unavailable {
        op: format!("NCCL {op}"),
        peer: format!("rank {rank} of a communicator of {world}"),
        msg,
    }
}

/// One NCCL call of a collective.
pub(crate) struct Call {
    kind: CallKind,
    /// NCCL's `ncclDataType_t`.
    data_type: c_int,
    /// Elements sent by this rank.
    count: usize,
    /// Bytes read from the input.
    in_bytes: usize,
    /// Bytes of the output.
    out_bytes: usize,
}

#[derive(Clone, Copy, PartialEq, Eq)]
enum CallKind {
    AllReduce(ReduceOp),
    AllGather,
    Broadcast(usize),
}

impl CallKind {
    fn name(self) -> &'static str {
        match self {
            CallKind::AllReduce(_) => "ncclAllReduce",
            CallKind::AllGather => "ncclAllGather",
            CallKind::Broadcast(_) => "ncclBroadcast",
        }
    }
}

// NCCL's `ncclResult_t`, `ncclDataType_t` and `ncclRedOp_t` values (nccl.h).
const NCCL_SUCCESS: c_int = 0;
const NCCL_IN_PROGRESS: c_int = 7;
const NCCL_INT8: c_int = 0;
const NCCL_INT32: c_int = 2;
const NCCL_INT64: c_int = 4;
const NCCL_FLOAT16: c_int = 6;
const NCCL_FLOAT32: c_int = 7;
const NCCL_FLOAT64: c_int = 8;
const NCCL_BFLOAT16: c_int = 9;
const NCCL_SUM: c_int = 0;
const NCCL_AVG: c_int = 4;

/// NCCL's data type of a dtype all-reduce takes.
fn data_type(dtype: DType) -> Result<c_int> {
    Ok(match dtype {
        DType::I32 => NCCL_INT32,
        DType::I64 => NCCL_INT64,
        DType::F16 => NCCL_FLOAT16,
        DType::F32 => NCCL_FLOAT32,
        DType::F64 => NCCL_FLOAT64,
        DType::BF16 => NCCL_BFLOAT16,
        other => {
            return Err(Error::UnsupportedDType {
                op: "all_reduce",
                dtype: other,
                expected: "a float dtype, int32 or int64",
            })
        }
    })
}

/// The dtype of NCCL's data type `code` (the stand-in's hub decodes requests with it).
fn dtype_of(code: c_int) -> Option<DType> {
    Some(match code {
        NCCL_INT32 => DType::I32,
        NCCL_INT64 => DType::I64,
        NCCL_FLOAT16 => DType::F16,
        NCCL_FLOAT32 => DType::F32,
        NCCL_FLOAT64 => DType::F64,
        NCCL_BFLOAT16 => DType::BF16,
        NCCL_INT8 => DType::I8,
        _ => return None,
    })
}

fn reduction(op: ReduceOp) -> c_int {
    match op {
        ReduceOp::Sum => NCCL_SUM,
        ReduceOp::Mean => NCCL_AVG,
    }
}

/// NCCL's `ncclUniqueId`, passed by value.
#[repr(C)]
struct RawId([u8; NCCL_ID_BYTES]);

/// NCCL's `ncclConfig_t` as NCCL 2.17 defined it: NCCL reads `size` bytes of it and keeps
/// its defaults for the fields later versions added.
#[repr(C)]
struct Config {
    size: usize,
    magic: u32,
    version: u32,
    blocking: c_int,
    cga_cluster_size: c_int,
    min_ctas: c_int,
    max_ctas: c_int,
    net_name: *const c_char,
}

impl Config {
    /// A non-blocking communicator, everything else NCCL's default (`NCCL_CONFIG_UNDEF_*`).
    fn non_blocking() -> Config {
        Config {
            size: std::mem::size_of::<Config>(),
            magic: 0xcafe_beef,
            version: 2_17_00,
            blocking: 0,
            cga_cluster_size: c_int::MIN,
            min_ctas: c_int::MIN,
            max_ctas: c_int::MIN,
            net_name: std::ptr::null(),
        }
    }
}

type Stream = *mut c_void;

/// The NCCL functions the backend calls, from `libnccl.so.2`.
struct Nccl {
    get_version: unsafe extern "C" fn(*mut c_int) -> c_int,
    get_unique_id: unsafe extern "C" fn(*mut RawId) -> c_int,
    comm_init_rank_config:
        unsafe extern "C" fn(*mut *mut c_void, c_int, RawId, c_int, *mut Config) -> c_int,
    comm_get_async_error: unsafe extern "C" fn(*mut c_void, *mut c_int) -> c_int,
    comm_abort: unsafe extern "C" fn(*mut c_void) -> c_int,
    comm_destroy: unsafe extern "C" fn(*mut c_void) -> c_int,
    get_error_string: unsafe extern "C" fn(c_int) -> *const c_char,
    group_start: unsafe extern "C" fn() -> c_int,
    group_end: unsafe extern "C" fn() -> c_int,
    all_reduce: unsafe extern "C" fn(
        *const c_void,
        *mut c_void,
        usize,
        c_int,
        c_int,
        *mut c_void,
        Stream,
    ) -> c_int,
    all_gather: unsafe extern "C" fn(
        *const c_void,
        *mut c_void,
        usize,
        c_int,
        *mut c_void,
        Stream,
    ) -> c_int,
    broadcast: unsafe extern "C" fn(
        *const c_void,
        *mut c_void,
        usize,
        c_int,
        c_int,
        *mut c_void,
        Stream,
    ) -> c_int,
    /// Keeps the functions' code loaded.
    _library: libloading::Library,
}

/// The names `libnccl` is looked for under (the wheels ship `.so.2` only).
const LIBRARY_NAMES: [&str; 2] = ["libnccl.so.2", "libnccl.so"];

/// NCCL, loaded once (or why it does not load).
fn library() -> Result<&'static Nccl> {
    static NCCL: OnceLock<std::result::Result<Nccl, String>> = OnceLock::new();
    NCCL.get_or_init(load)
        .as_ref()
        .map_err(|why| Error::Backend {
            backend: BACKEND,
            msg: why.clone(),
        })
}

fn load() -> std::result::Result<Nccl, String> {
    let mut tried = vec![];
    for name in LIBRARY_NAMES {
        // SAFETY: loading NCCL runs its initialisers, which only set up its own state.
        match unsafe { libloading::Library::new(name) } {
            Ok(library) => return symbols(library, name),
            Err(e) => tried.push(format!("{name}: {e}")),
        }
    }
    Err(format!(
        "NCCL could not be loaded ({}): install NCCL 2.17 or later (the pip wheel \
         nvidia-nccl-cu{} has it) and put its lib folder on LD_LIBRARY_PATH",
        tried.join("; "),
        crate::compile::CUDA_MAJOR
    ))
}

fn symbols(library: libloading::Library, name: &str) -> std::result::Result<Nccl, String> {
    macro_rules! symbol {
        ($symbol:literal) => {
            // SAFETY: the symbol is NCCL's function of this name, whose C signature
            // (nccl.h) the field's type spells out.
            *unsafe { library.get(concat!($symbol, "\0").as_bytes()) }.map_err(|e| {
                format!(
                    "{name} lacks {} (NCCL 2.17 or later is needed): {e}",
                    $symbol
                )
            })?
        };
    }
    Ok(Nccl {
        get_version: symbol!("ncclGetVersion"),
        get_unique_id: symbol!("ncclGetUniqueId"),
        comm_init_rank_config: symbol!("ncclCommInitRankConfig"),
        comm_get_async_error: symbol!("ncclCommGetAsyncError"),
        comm_abort: symbol!("ncclCommAbort"),
        comm_destroy: symbol!("ncclCommDestroy"),
        get_error_string: symbol!("ncclGetErrorString"),
        group_start: symbol!("ncclGroupStart"),
        group_end: symbol!("ncclGroupEnd"),
        all_reduce: symbol!("ncclAllReduce"),
        all_gather: symbol!("ncclAllGather"),
        broadcast: symbol!("ncclBroadcast"),
        _library: library,
    })
}

impl Nccl {
    /// NCCL's error `code` of `call`.
    fn error(&self, call: &str, code: c_int) -> Error {
        // SAFETY: NCCL returns a static string for any code.
        let text = unsafe { (self.get_error_string)(code) };
        let text = if text.is_null() {
            String::new()
        } else {
            // SAFETY: a NUL-terminated static string (checked non-null).
            unsafe { std::ffi::CStr::from_ptr(text) }
                .to_string_lossy()
                .into_owned()
        };
        Error::Backend {
            backend: BACKEND,
            msg: format!("{call} failed: {text} (ncclResult_t {code})"),
        }
    }

    /// Starts joining the communicator `id` names as `rank` of `world` on `ctx`'s device
    /// (non-blocking: [`Nccl::wait`] for it to be ready).
    fn init_rank(
        &self,
        ctx: &cudarc::driver::CudaContext,
        id: &NcclId,
        rank: usize,
        world: usize,
    ) -> Result<RawComm> {
        // NCCL takes the calling thread's current device (the runtime adopts the driver's
        // current context).
        ctx.bind_to_thread()
            .map_err(|e| crate::exec::driver("making the context current for NCCL", e))?;
        let (Ok(world), Ok(rank)) = (c_int::try_from(world), c_int::try_from(rank)) else {
            return Err(Error::invalid("NCCL", "more ranks than a C int counts"));
        };
        let mut config = Config::non_blocking();
        let mut comm: *mut c_void = std::ptr::null_mut();
        // SAFETY: `comm` receives the communicator; `config` is a complete NCCL 2.17
        // configuration (its size first, as NCCL reads it); the id is 128 bytes.
        let code = unsafe {
            (self.comm_init_rank_config)(&mut comm, world, RawId(id.0), rank, &mut config)
        };
        self.check_queued("ncclCommInitRankConfig", code)?;
        Ok(RawComm(comm))
    }

    fn check(&self, call: &str, code: c_int) -> Result<()> {
        match code {
            NCCL_SUCCESS => Ok(()),
            _ => Err(self.error(call, code)),
        }
    }

    /// A call of a non-blocking communicator: done, or still in progress.
    fn check_queued(&self, call: &str, code: c_int) -> Result<()> {
        match code {
            NCCL_SUCCESS | NCCL_IN_PROGRESS => Ok(()),
            _ => Err(self.error(call, code)),
        }
    }

    /// Waits until `comm` has no call in progress and, with `done`, until the stream has
    /// passed that event; fails with NCCL's asynchronous error or at `deadline`.
    fn wait(
        &self,
        comm: &RawComm,
        deadline: Instant,
        done: Option<&cudarc::driver::CudaEvent>,
    ) -> Result<()> {
        let started = Instant::now();
        loop {
            let mut state: c_int = NCCL_SUCCESS;
            // SAFETY: `comm` is a live communicator; NCCL writes one integer.
            let code = unsafe { (self.comm_get_async_error)(comm.0, &mut state) };
            self.check("ncclCommGetAsyncError", code)?;
            match state {
                NCCL_SUCCESS => match done.map(|e| e.try_is_complete()) {
                    None | Some(Ok(true)) => return Ok(()),
                    Some(Ok(false)) => {}
                    Some(Err(e)) => return Err(crate::exec::driver("waiting for NCCL", e)),
                },
                NCCL_IN_PROGRESS => {}
                failed => return Err(self.error("an NCCL collective", failed)),
            }
            if Instant::now() >= deadline {
                return Err(Error::Backend {
                    backend: BACKEND,
                    msg: format!(
                        "not done after {:?} (the collective timeout): a peer died or \
                         called another collective",
                        started.elapsed()
                    ),
                });
            }
            // Spin briefly (a small all-reduce ends in microseconds), then sleep.
            if started.elapsed() < Duration::from_millis(2) {
                std::thread::yield_now();
            } else {
                std::thread::sleep(Duration::from_micros(200));
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use ferroflow_tensor::DeviceKind;

    #[test]
    fn the_configuration_is_nccl_2_17s_layout() {
        // size, magic, version, four ints, a pointer: 40 bytes on 64-bit targets.
        assert_eq!(std::mem::size_of::<Config>(), 40);
        assert_eq!(std::mem::offset_of!(Config, blocking), 16);
        assert_eq!(std::mem::offset_of!(Config, net_name), 32);
        assert_eq!(std::mem::size_of::<RawId>(), 128);
    }

    #[test]
    fn data_types_round_trip() {
        for dtype in [
            DType::I32,
            DType::I64,
            DType::F16,
            DType::F32,
            DType::F64,
            DType::BF16,
        ] {
            assert_eq!(dtype_of(data_type(dtype).unwrap()), Some(dtype));
        }
        assert!(data_type(DType::Bool).is_err());
        assert_eq!(dtype_of(NCCL_INT8), Some(DType::I8));
    }

    #[test]
    fn ids_are_128_bytes() {
        assert!(NcclId::from_bytes(&[0; 127]).is_err());
        let id = NcclId::from_bytes(&[7; 128]).unwrap();
        assert_eq!(id.as_bytes(), &[7; 128]);
    }

    /// Where `libnccl.so.2` loads (`FERROFLOW_REQUIRE_NCCL=1`, as in CI, makes its absence a
    /// failure): its version, and an id (`ncclGetUniqueId` needs no GPU) that differs from
    /// the next; elsewhere the error names the library.
    #[test]
    fn the_library_gives_its_version_and_ids() {
        match nccl_version() {
            Ok(v) => assert!(v.starts_with("NCCL 2."), "{v}"),
            Err(why) => {
                assert!(why.contains("libnccl.so.2"), "{why}");
                ferroflow_tensor::testing::skip("FERROFLOW_REQUIRE_NCCL", &why);
                return;
            }
        }
        let (a, b) = (
            NcclId::from_library().unwrap(),
            NcclId::from_library().unwrap(),
        );
        assert_ne!(a, b);
        assert!(a.as_bytes().iter().any(|&x| x != 0), "{a:?}");
    }

    #[test]
    fn a_host_device_is_refused() {
        let e = NcclId::new(Device::new(DeviceKind::Cpu, 0)).unwrap_err();
        assert!(e.to_string().contains("CUDA"), "{e}");
    }
}
