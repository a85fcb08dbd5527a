//! Where the kernels run: a CUDA device (cudarc: a context, its stream, cuBLAS), or the
//! host, which compiles the same CUDA C with the system's C++ compiler and runs each launch
//! as a loop (see [`crate::emulation`]). The backend's logic (views, geometry, launch
//! parameters, error words, the GEMM's operand forms) is the same code on both; only this
//! module differs.

use std::cell::UnsafeCell;
use std::collections::HashMap;
use std::path::PathBuf;
use std::sync::{Arc, Mutex, OnceLock};

use cudarc::cublas::{CudaBlas, Gemm, GemmConfig, StridedBatchedConfig};
use cudarc::driver::{
    sys, CudaContext, CudaEvent, CudaFunction, CudaSlice, CudaStream, DevicePtr, DevicePtrMut,
    DriverError, LaunchConfig, PushKernelArg,
};
use ferroflow_tensor::{Error, Result};

use crate::dnn::{Dnn, DnnKey, Plan, PlanOutcome};
use crate::source::{Geo, KernelSource, View};
use crate::BACKEND;

/// Host memory a host-run kernel writes through raw pointers.
pub(crate) struct HostMemory {
    cells: Box<[UnsafeCell<u64>]>,
    len: usize,
}

// SAFETY: a buffer's bytes are written only by the op that creates it (its kernels run to
// completion before the buffer is handed out), and read afterwards: no write is ever
// concurrent with another access.
unsafe impl Send for HostMemory {}
// SAFETY: as above.
unsafe impl Sync for HostMemory {}

impl HostMemory {
    /// `len` zero bytes, or `None` when the allocator refuses (never an abort).
    fn zeroed(len: usize) -> Option<HostMemory> {
        // u64 cells: every dtype's alignment.
        let count = len.div_ceil(8).max(1);
        let mut cells = Vec::new();
        cells.try_reserve_exact(count).ok()?;
        cells.extend((0..count).map(|_| UnsafeCell::new(0)));
        Some(HostMemory {
            cells: cells.into_boxed_slice(),
            len,
        })
    }
    fn ptr(&self) -> *mut u8 {
        self.cells.as_ptr() as *mut u8
    }
    fn bytes(&self) -> &[u8] {
        // SAFETY: `len` ≤ 8 × cells, and no kernel writes while the buffer is read.
        unsafe { std::slice::from_raw_parts(self.ptr(), self.len) }
    }
}

/// A buffer's memory on its device.
pub(crate) enum Memory {
    /// Device memory (at least one byte: CUDA allocates no zero-size buffers).
    Cuda(DeviceBlock),
    /// Host memory of the emulated device.
    Host(HostMemory),
}

impl Memory {
    /// The device address of byte `offset` of this memory, for a library call queued on
    /// `stream` (the memory's device's stream); `None` for the emulation's host memory or
    /// an offset past the end.
    pub(crate) fn device_address(&self, stream: &CudaStream, offset: usize) -> Option<u64> {
        match self {
            Memory::Cuda(block) if offset <= block.len() => {
                let (address, _record) = block.device_ptr(stream);
                Some(address + offset as u64)
            }
            _ => None,
        }
    }
}

/// A block of device memory, handed back to its device's [`BlockCache`] when dropped (when
/// it came from there), else freed to the driver's pool.
pub(crate) struct DeviceBlock {
    slice: std::mem::ManuallyDrop<CudaSlice<u8>>,
    cache: Option<Arc<BlockCache>>,
}

impl DeviceBlock {
    fn uncached(slice: CudaSlice<u8>) -> DeviceBlock {
        DeviceBlock {
            slice: std::mem::ManuallyDrop::new(slice),
            cache: None,
        }
    }
}

impl std::ops::Deref for DeviceBlock {
    type Target = CudaSlice<u8>;
    fn deref(&self) -> &CudaSlice<u8> {
        &self.slice
    }
}

impl std::ops::DerefMut for DeviceBlock {
    fn deref_mut(&mut self) -> &mut CudaSlice<u8> {
        &mut self.slice
    }
}

impl Drop for DeviceBlock {
    fn drop(&mut self) {
        // SAFETY: the slice is taken once, here, and not touched after.
        let slice = unsafe { std::mem::ManuallyDrop::take(&mut self.slice) };
        match &self.cache {
            Some(cache) => cache.put(slice),
            None => drop(slice),
        }
    }
}

/// The size class of a request of `bytes` for the block cache: a power of two from 512
/// bytes to 1 MiB, or `None` (larger requests go to the driver's pool as they are).
pub(crate) fn block_class(bytes: usize) -> Option<usize> {
    (bytes <= 1 << 20).then(|| bytes.max(1).next_power_of_two().max(512))
}

/// Freed small blocks of one device, kept by size class for the next allocation of that
/// class: an op's output then costs no driver call (`cuMemAllocAsync`, and
/// `cuMemFreeAsync` when it is dropped), the per-op host cost that remains being the
/// launch. Every op runs on the device's one stream, so a block freed while kernels that
/// read it are still queued is written again only by work queued after them (PyTorch's
/// caching allocator reuses blocks within a stream alike). At most
/// [`crate::block_cache_limit`] bytes are kept; past it, and when an allocation fails, the
/// blocks go back to the driver.
pub(crate) struct BlockCache {
    free: Mutex<KeptBlocks>,
}

/// The blocks kept by size class, and their bytes.
#[derive(Default)]
struct KeptBlocks {
    by_class: HashMap<usize, Vec<CudaSlice<u8>>>,
    bytes: usize,
}

impl BlockCache {
    fn new() -> BlockCache {
        BlockCache {
            free: Mutex::new(KeptBlocks::default()),
        }
    }

    fn take(&self, class: usize) -> Option<CudaSlice<u8>> {
        let mut free = self.free.lock().unwrap_or_else(|e| e.into_inner());
        let block = free.by_class.get_mut(&class)?.pop()?;
        free.bytes -= class;
        Some(block)
    }

    fn put(&self, block: CudaSlice<u8>) {
        let class = block.len();
        let mut free = self.free.lock().unwrap_or_else(|e| e.into_inner());
        if block_class(class) == Some(class) && free.bytes + class <= crate::block_cache_limit() {
            free.bytes += class;
            free.by_class.entry(class).or_default().push(block);
        }
        // Otherwise `block` is dropped here: freed to the driver's pool.
    }

    /// Hands every kept block back to the driver.
    fn clear(&self) {
        let blocks = {
            let mut free = self.free.lock().unwrap_or_else(|e| e.into_inner());
            free.bytes = 0;
            std::mem::take(&mut free.by_class)
        };
        drop(blocks);
    }
}

/// One kernel parameter.
#[derive(Clone, Copy)]
pub(crate) enum Arg<'a> {
    /// A buffer (the kernel sees its device pointer).
    Buf(&'a Memory),
    I64(i64),
    I32(i32),
    F32(f32),
    F64(f64),
    View(View),
    Geo(Geo),
}

/// How a kernel is launched.
#[derive(Clone, Copy)]
pub(crate) enum Launch {
    /// A grid-stride loop over `n` items (`FF_LOOP`).
    Items(usize),
    /// One block of `threads` per output, `blocks` outputs (the block reductions).
    Blocks { blocks: u32, threads: u32 },
}

/// Threads per block of the grid-stride kernels.
const THREADS: u32 = 256;

pub(crate) fn driver(what: &str, e: DriverError) -> Error {
    Error::Backend {
        backend: BACKEND,
        msg: format!("{what}: {e}"),
    }
}

/// A device that runs the backend's kernels.
pub(crate) struct Gpu {
    pub(crate) ordinal: usize,
    pub(crate) name: String,
    engine: Engine,
    /// The data-error word of checked kernels (one checked kernel at a time: the lock).
    pub(crate) error_word: Mutex<Memory>,
}

enum Engine {
    Cuda(CudaEngine),
    Host(HostEngine),
}

/// The workspace cuBLAS should have on a device of compute capability `major`.x: NVIDIA's
/// recommendation, 32 MiB on Hopper and later, where cuBLAS's own pool is 4 MiB (enough
/// elsewhere, by the same recommendation).
fn blas_workspace_bytes(major: i32) -> Option<usize> {
    (major >= 9).then_some(32 << 20)
}

/// Gives `blas` a workspace of [`blas_workspace_bytes`] on its stream (cuBLAS uses it for
/// every later call on that stream), or leaves it its own pool where the device needs no
/// more or the memory cannot be had (products stay correct, only possibly slower).
fn blas_workspace(
    blas: &CudaBlas,
    stream: &Arc<CudaStream>,
    major: i32,
) -> Option<Box<CudaSlice<u8>>> {
    let bytes = blas_workspace_bytes(major)?;
    // SAFETY: cuBLAS's scratch: it writes before it reads.
    let workspace = unsafe { stream.alloc::<u8>(bytes) }.ok()?;
    let status = {
        let (ptr, _record) = workspace.device_ptr(stream);
        // SAFETY: the memory is this device's, `bytes` long, and outlives the handle
        // (`CudaEngine` drops `blas` first); the handle's stream was set when it was made
        // (setting a stream again would put cuBLAS back on its own pool).
        unsafe { cudarc::cublas::sys::cublasSetWorkspace_v2(*blas.handle(), ptr as *mut _, bytes) }
    };
    (status == cudarc::cublas::sys::cublasStatus_t::CUBLAS_STATUS_SUCCESS)
        .then(|| Box::new(workspace))
}

struct CudaEngine {
    /// `compute_XY` for NVRTC.
    arch: &'static str,
    /// Compute capability ≥ 8.0 (TensorFloat-32 tensor cores).
    has_tf32: bool,
    /// Its streaming multiprocessors (the reductions size their grids by them).
    multiprocessors: usize,
    ctx: Arc<CudaContext>,
    stream: Arc<CudaStream>,
    blas: CudaBlas,
    /// cuBLAS's workspace where the device wants more than the 4 MiB pool cuBLAS makes for
    /// itself ([`blas_workspace`]); after `blas`, so the handle goes before its memory.
    _blas_workspace: Option<Box<CudaSlice<u8>>>,
    /// Compiled kernels by name, each behind a lock of its own: a kernel is compiled once,
    /// and NVRTC compiles different kernels in parallel (threads wait only for the kernel
    /// they need; under one lock for all, a test suite's threads queued behind each other).
    functions: Mutex<HashMap<String, FunctionSlot>>,
    /// Kernels timed while a profiler listens: start and end events recorded on the stream
    /// around each, with the op it ran for, read when the host next waits for the device.
    timed: Mutex<Vec<(CudaEvent, CudaEvent, Option<&'static str>)>>,
    /// cuDNN's handle, opened at the first convolution (or why there is none).
    dnn: OnceLock<std::result::Result<Dnn, String>>,
    /// Freed small blocks kept for reuse.
    blocks: Arc<BlockCache>,
}

/// One kernel's slot in [`CudaEngine::functions`]: empty until compiled (a failed compile
/// leaves it empty, and the error goes to the caller).
type FunctionSlot = Arc<Mutex<Option<CudaFunction>>>;

/// Timed kernels kept before the host waits for them itself (a profiled run that never
/// reads a value would otherwise keep events without bound).
const MAX_TIMED: usize = 4096;

/// The host's kernels: compiled once into shared libraries (by catalog group or alone).
struct HostEngine {
    libraries: Mutex<HashMap<String, HostLibrary>>,
    dir: PathBuf,
}

impl Gpu {
    /// CUDA device `ordinal`.
    pub(crate) fn cuda(ordinal: usize) -> Result<Gpu> {
        let ctx = CudaContext::new(ordinal).map_err(|e| driver("creating a context", e))?;
        let (major, minor) = ctx
            .compute_capability()
            .map_err(|e| driver("reading the compute capability", e))?;
        let name = ctx
            .name()
            .map_err(|e| driver("reading the device name", e))?;
        let multiprocessors = ctx
            .attribute(
                cudarc::driver::sys::CUdevice_attribute::CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT,
            )
            .map_err(|e| driver("reading the multiprocessor count", e))?;
        if ctx.has_async_alloc() {
            keep_freed_memory(ctx.cu_device());
        }
        // SAFETY: everything on this device runs on one stream, the context's default
        // (kernels, cuBLAS, copies, stream-ordered allocations and frees), so work on a
        // buffer is ordered by the stream alone and the host waits for the stream before it
        // reads. cudarc's per-buffer events would only order work across streams; with them,
        // every allocation created two driver events and every free destroyed them (four
        // driver calls per op on top of the allocation and the launch). Called before any
        // buffer of this context exists.
        unsafe { ctx.disable_event_tracking() };
        let stream = ctx.default_stream();
        let blas = CudaBlas::new(stream.clone()).map_err(|e| Error::Backend {
            backend: BACKEND,
            msg: format!("creating a cuBLAS handle: {e:?}"),
        })?;
        let blas_workspace = blas_workspace(&blas, &stream, major);
        let word = stream
            .alloc_zeros::<u8>(16)
            .map_err(|e| driver("allocating the error word", e))?;
        // One leaked string per device for NVRTC's `&'static str` option.
        let arch: &'static str = Box::leak(format!("compute_{major}{minor}").into_boxed_str());
        Ok(Gpu {
            ordinal,
            name: format!("{name} (compute capability {major}.{minor})"),
            engine: Engine::Cuda(CudaEngine {
                arch,
                has_tf32: major >= 8,
                multiprocessors: usize::try_from(multiprocessors).unwrap_or(1).max(1),
                ctx,
                stream,
                blas,
                _blas_workspace: blas_workspace,
                functions: Mutex::new(HashMap::new()),
                timed: Mutex::new(Vec::new()),
                dnn: OnceLock::new(),
                blocks: Arc::new(BlockCache::new()),
            }),
            error_word: Mutex::new(Memory::Cuda(DeviceBlock::uncached(word))),
        })
    }

    /// The emulated device `ordinal`: kernels compiled by `compiler` into `dir`.
    pub(crate) fn host(ordinal: usize, dir: PathBuf) -> Gpu {
        Gpu {
            ordinal,
            name: "CUDA kernels emulated on the host".to_string(),
            engine: Engine::Host(HostEngine {
                libraries: Mutex::new(HashMap::new()),
                dir,
            }),
            error_word: Mutex::new(Memory::Host(HostMemory {
                cells: (0..2).map(|_| UnsafeCell::new(0)).collect(),
                len: 16,
            })),
        }
    }

    /// The CUDA context (to make current for a library's calls) and the stream every op of
    /// this device runs on, for NCCL; `None` on the host emulation.
    pub(crate) fn context_and_stream(&self) -> Option<(&Arc<CudaContext>, &Arc<CudaStream>)> {
        match &self.engine {
            Engine::Cuda(c) => Some((&c.ctx, &c.stream)),
            Engine::Host(_) => None,
        }
    }

    /// Hands the blocks kept for reuse back to the driver (none on the host emulation).
    pub(crate) fn clear_block_cache(&self) {
        if let Engine::Cuda(c) = &self.engine {
            c.blocks.clear();
        }
    }

    /// The GPU's streaming multiprocessors; `None` on the host emulation.
    pub(crate) fn multiprocessors(&self) -> Option<usize> {
        match &self.engine {
            Engine::Cuda(c) => Some(c.multiprocessors),
            Engine::Host(_) => None,
        }
    }

    /// `bytes` of device memory (uninitialised on a GPU: every kernel writes its whole output).
    pub(crate) fn alloc(&self, bytes: usize) -> Result<Memory> {
        match &self.engine {
            Engine::Cuda(c) => {
                let class = block_class(bytes);
                if let Some(block) = class.and_then(|k| c.blocks.take(k)) {
                    return Ok(Memory::Cuda(DeviceBlock {
                        slice: std::mem::ManuallyDrop::new(block),
                        cache: Some(c.blocks.clone()),
                    }));
                }
                let size = class.unwrap_or(bytes.max(1));
                // SAFETY: every kernel writes each output element before anything reads it.
                let data = match unsafe { c.stream.alloc::<u8>(size) } {
                    Ok(d) => d,
                    Err(_) => {
                        // Memory kept for reuse goes back to the driver, then one retry.
                        c.blocks.clear();
                        // SAFETY: as above.
                        unsafe { c.stream.alloc::<u8>(size) }
                            .map_err(|e| driver(&format!("allocating {bytes} bytes"), e))?
                    }
                };
                Ok(Memory::Cuda(DeviceBlock {
                    slice: std::mem::ManuallyDrop::new(data),
                    cache: class.map(|_| c.blocks.clone()),
                }))
            }
            Engine::Host(_) => HostMemory::zeroed(bytes)
                .map(Memory::Host)
                .ok_or_else(|| refused_allocation(bytes)),
        }
    }

    /// A buffer holding `bytes`.
    pub(crate) fn upload(&self, bytes: &[u8]) -> Result<Memory> {
        match &self.engine {
            Engine::Cuda(c) => {
                if bytes.is_empty() {
                    return self.alloc(0);
                }
                c.stream
                    .clone_htod(bytes)
                    .map(|s| Memory::Cuda(DeviceBlock::uncached(s)))
                    .map_err(|e| driver("upload", e))
            }
            Engine::Host(_) => {
                let m = HostMemory::zeroed(bytes.len())
                    .ok_or_else(|| refused_allocation(bytes.len()))?;
                // SAFETY: the memory is new and holds at least `bytes.len()` bytes.
                unsafe { std::ptr::copy_nonoverlapping(bytes.as_ptr(), m.ptr(), bytes.len()) };
                Ok(Memory::Host(m))
            }
        }
    }

    /// The bytes `range` of `mem` (waits for the kernels before).
    pub(crate) fn download(&self, mem: &Memory, range: std::ops::Range<usize>) -> Result<Vec<u8>> {
        let outside = || Error::Backend {
            backend: BACKEND,
            msg: "download: the view lies outside its buffer".into(),
        };
        match (&self.engine, mem) {
            (Engine::Cuda(c), Memory::Cuda(s)) => {
                let view = s.try_slice(range).ok_or_else(outside)?;
                let bytes = c
                    .stream
                    .clone_dtoh(&view)
                    .map_err(|e| driver("download", e))?;
                // The copy waited for the stream: the timed kernels have run.
                self.report_timed(c);
                Ok(bytes)
            }
            (Engine::Host(_), Memory::Host(h)) => {
                Ok(h.bytes().get(range).ok_or_else(outside)?.to_vec())
            }
            _ => Err(foreign()),
        }
    }

    /// Sets every byte of `mem` to zero.
    pub(crate) fn zero(&self, mem: &mut Memory) -> Result<()> {
        match (&self.engine, mem) {
            (Engine::Cuda(c), Memory::Cuda(s)) => c
                .stream
                .memset_zeros(&mut **s)
                .map_err(|e| driver("memset", e)),
            (Engine::Host(_), Memory::Host(h)) => {
                // SAFETY: the buffer holds `len` bytes and nothing else accesses it now.
                unsafe { std::ptr::write_bytes(h.ptr(), 0, h.len) };
                Ok(())
            }
            _ => Err(foreign()),
        }
    }

    /// Waits for every kernel launched so far.
    pub(crate) fn synchronize(&self) -> Result<()> {
        match &self.engine {
            Engine::Cuda(c) => {
                c.stream
                    .synchronize()
                    .map_err(|e| driver("synchronize", e))?;
                self.report_timed(c);
                Ok(())
            }
            Engine::Host(_) => Ok(()),
        }
    }

    /// Runs `work` (a kernel or a GEMM queued on the device) and, while a profiler listens
    /// ([`ferroflow_tensor::trace::is_active`]), times it on the device for the profiler's
    /// device plane, labelled with the op being dispatched: on a GPU by events recorded on
    /// the stream around it (reported when the host next waits for the device), on the host
    /// emulation, where the work runs in the call, by the host's clock. Timing is best
    /// effort: an event the driver refuses leaves the work untimed, never failed.
    fn timed(&self, work: impl FnOnce() -> Result<()>) -> Result<()> {
        use ferroflow_tensor::trace;
        if !trace::is_active() {
            return work();
        }
        let op = trace::current_op();
        match &self.engine {
            Engine::Host(_) => {
                let start = std::time::Instant::now();
                work()?;
                trace::record_device_events(&[trace::DeviceEvent {
                    device: ferroflow_tensor::Device::gpu(self.ordinal),
                    op,
                    start,
                    duration: start.elapsed(),
                }]);
                Ok(())
            }
            Engine::Cuda(c) => {
                let timing = Some(sys::CUevent_flags::CU_EVENT_DEFAULT);
                let start = c
                    .ctx
                    .new_event(timing)
                    .ok()
                    .filter(|e| e.record(&c.stream).is_ok());
                work()?;
                let Some(start) = start else {
                    return Ok(());
                };
                let Some(end) = c
                    .ctx
                    .new_event(timing)
                    .ok()
                    .filter(|e| e.record(&c.stream).is_ok())
                else {
                    return Ok(());
                };
                let full = {
                    let mut timed = c.timed.lock().unwrap_or_else(|e| e.into_inner());
                    timed.push((start, end, op));
                    timed.len() >= MAX_TIMED
                };
                if full {
                    self.synchronize()?;
                }
                Ok(())
            }
        }
    }

    /// Tells the profiler the device times of the kernels timed since the last report, on
    /// the host's clock: the host has just waited for the stream, so the last kernel's end
    /// is aligned to now (the device's clock has no defined relation to the host's).
    fn report_timed(&self, c: &CudaEngine) {
        let timed = std::mem::take(&mut *c.timed.lock().unwrap_or_else(|e| e.into_inner()));
        let Some((base, _, _)) = timed.first() else {
            return;
        };
        let done = std::time::Instant::now();
        // Milliseconds from the first kernel's start to each kernel's start and end.
        let spans: Vec<Option<(f32, f32)>> = timed
            .iter()
            .map(|(s, e, _)| Some((base.elapsed_ms(s).ok()?, base.elapsed_ms(e).ok()?)))
            .collect();
        let last = spans
            .iter()
            .flatten()
            .map(|&(_, e)| e)
            .fold(0.0f32, f32::max);
        let ms = |v: f32| std::time::Duration::from_secs_f64(f64::from(v.max(0.0)) / 1e3);
        let events: Vec<ferroflow_tensor::trace::DeviceEvent> = timed
            .iter()
            .zip(&spans)
            .filter_map(|((_, _, op), span)| {
                let (s, e) = (*span)?;
                Some(ferroflow_tensor::trace::DeviceEvent {
                    device: ferroflow_tensor::Device::gpu(self.ordinal),
                    op: *op,
                    start: done.checked_sub(ms(last - s)).unwrap_or(done),
                    duration: ms(e - s),
                })
            })
            .collect();
        ferroflow_tensor::trace::record_device_events(&events);
    }

    /// (free, total) device memory in bytes, where the device says.
    pub(crate) fn memory(&self) -> Option<(u64, u64)> {
        match &self.engine {
            Engine::Cuda(c) => c.ctx.mem_get_info().ok().map(|(f, t)| (f as u64, t as u64)),
            Engine::Host(_) => None,
        }
    }

    /// Launches kernel `name` (its source made by `source` on first use) with `args`.
    pub(crate) fn launch(
        &self,
        name: &str,
        source: impl FnOnce() -> KernelSource,
        how: Launch,
        args: &[Arg<'_>],
    ) -> Result<()> {
        // Compiled (or found compiled) first: a profiler times the kernel, not its build.
        match &self.engine {
            Engine::Cuda(c) => {
                let f = c.function(name, source)?;
                self.timed(|| c.launch(name, &f, how, args))
            }
            Engine::Host(h) => {
                let library = h.library(name, source);
                self.timed(|| h.launch(name, &library, how, args))
            }
        }
    }

    /// cuDNN's plan for `key` on this device (made on first use: cuDNN times a
    /// convolution's algorithms then), or `None` where the backend's own kernels run it:
    /// on the host emulation (unless its stand-in for cuDNN is on), without cuDNN, with it
    /// turned off ([`crate::set_cudnn_enabled`]), or for a shape it refuses (the reason goes
    /// to [`Gpu::cudnn_plans`]).
    pub(crate) fn dnn_plan(&self, key: &DnnKey) -> Option<Arc<Plan>> {
        if !crate::cudnn_enabled() {
            return None;
        }
        let c = match &self.engine {
            Engine::Cuda(c) => c,
            Engine::Host(_) => {
                return crate::emulation::cudnn_stand_in().then(|| Arc::new(Plan::host(*key)))
            }
        };
        let dnn = c.dnn().ok()?;
        // cuDNN's search allocates and runs on the calling thread's current context.
        c.ctx.bind_to_thread().ok()?;
        dnn.plan(key, crate::convolution_workspace_limit()).ok()
    }

    /// Queues cuDNN's `plan` (see `Dnn::run` for the operands; on the emulation its
    /// stand-in runs it at once), with a workspace from the stream's pool.
    pub(crate) fn run_cudnn(
        &self,
        plan: &Plan,
        a: (&Memory, usize),
        b: (&Memory, usize),
        out: &mut Memory,
    ) -> Result<()> {
        self.timed(|| match (&self.engine, a.0, b.0, out) {
            (Engine::Cuda(e), Memory::Cuda(sa), Memory::Cuda(sb), Memory::Cuda(so)) => {
                e.run_cudnn(plan, (sa, a.1), (sb, b.1), so)
            }
            (Engine::Host(_), Memory::Host(ha), Memory::Host(hb), Memory::Host(ho)) => {
                let [na, nb, no] = plan.operand_bytes();
                let short = || Error::Backend {
                    backend: BACKEND,
                    msg: "cuDNN's stand-in: an operand is smaller than the plan".into(),
                };
                let a = ha.bytes().get(a.1..a.1 + na).ok_or_else(short)?;
                let b = hb.bytes().get(b.1..b.1 + nb).ok_or_else(short)?;
                if ho.len < no {
                    return Err(short());
                }
                let mut y = vec![0u8; no];
                crate::dnn::host_stand_in(plan, a, b, &mut y)?;
                // SAFETY: the output holds at least `no` bytes (checked) and is the op's
                // own, new buffer: nothing else accesses it now.
                unsafe { std::ptr::copy_nonoverlapping(y.as_ptr(), ho.ptr(), no) };
                Ok(())
            }
            _ => Err(foreign()),
        })
    }

    /// The convolutions cuDNN planned or refused on this device (none on the emulation or
    /// before cuDNN opened).
    pub(crate) fn cudnn_plans(&self) -> Vec<(DnnKey, PlanOutcome)> {
        match &self.engine {
            Engine::Cuda(c) => match c.dnn.get() {
                Some(Ok(d)) => d.plans(),
                _ => Vec::new(),
            },
            Engine::Host(_) => Vec::new(),
        }
    }

    /// Whether convolutions go through cuDNN on this device, and how many shapes it has
    /// planned or refused; why not where it does not.
    pub(crate) fn cudnn_report(&self) -> String {
        match &self.engine {
            Engine::Host(_) => "the host emulation runs no cuDNN".into(),
            Engine::Cuda(c) => match c.dnn.get() {
                None => "cuDNN: not opened yet (no convolution has run)".into(),
                Some(Ok(d)) => d.report(),
                Some(Err(e)) => format!("no cuDNN: {e}"),
            },
        }
    }

    /// Column-major `C = op(A)·op(B)` for each of `batch` matrices (cuBLAS's strided batched
    /// GEMM), `T` the element type: `a`/`b`/`c` start at their byte offsets.
    pub(crate) fn gemm<T: GemmScalar>(
        &self,
        call: &GemmCall,
        a: (&Memory, usize),
        b: (&Memory, usize),
        c: &mut Memory,
    ) -> Result<()>
    where
        CudaBlas: Gemm<T>,
    {
        self.timed(|| match (&self.engine, a.0, b.0, c) {
            (Engine::Cuda(e), Memory::Cuda(sa), Memory::Cuda(sb), Memory::Cuda(sc)) => {
                e.gemm::<T>(call, (sa, a.1), (sb, b.1), sc)
            }
            (Engine::Host(_), Memory::Host(ha), Memory::Host(hb), Memory::Host(hc)) => {
                host_gemm::<T>(call, (ha, a.1), (hb, b.1), hc);
                Ok(())
            }
            _ => Err(foreign()),
        })
    }
}

fn refused_allocation(bytes: usize) -> Error {
    Error::Backend {
        backend: BACKEND,
        msg: format!("the host emulation could not allocate {bytes} bytes"),
    }
}

fn foreign() -> Error {
    Error::Backend {
        backend: BACKEND,
        msg: "a buffer of another device kind (a GPU's and the host emulation's mixed)".into(),
    }
}

/// A strided batched GEMM in cuBLAS's terms (column-major).
#[derive(Clone, Copy, Debug)]
pub(crate) struct GemmCall {
    pub(crate) transa: bool,
    pub(crate) transb: bool,
    pub(crate) m: usize,
    pub(crate) n: usize,
    pub(crate) k: usize,
    pub(crate) lda: i64,
    pub(crate) ldb: i64,
    pub(crate) ldc: i64,
    pub(crate) stride_a: i64,
    pub(crate) stride_b: i64,
    pub(crate) stride_c: i64,
    pub(crate) batch: usize,
}

/// The element types cuBLAS multiplies, with the scalars of `C = 1·A·B + 0·C` and the
/// conversions the host GEMM uses.
pub(crate) trait GemmScalar: cudarc::driver::DeviceRepr + Copy {
    const ONE: Self;
    const ZERO: Self;
    /// float32, the type TensorFloat-32 applies to.
    const IS_F32: bool = false;
    fn to_f64(self) -> f64;
    fn from_f64(v: f64) -> Self;
}
/// `GemmScalar` for each type: its one and zero, whether it is float32, its f64 conversions.
macro_rules! gemm_scalar {
    ($($t:ty => $one:expr, $zero:expr, $is_f32:expr, $to:expr, $from:expr);* $(;)?) => {$(
        impl GemmScalar for $t {
            const ONE: $t = $one;
            const ZERO: $t = $zero;
            const IS_F32: bool = $is_f32;
            fn to_f64(self) -> f64 {
                ($to)(self)
            }
            fn from_f64(v: f64) -> $t {
                ($from)(v)
            }
        }
    )*};
}

gemm_scalar! {
    f32 => 1.0, 0.0, true, |x: f32| x as f64, |v: f64| v as f32;
    f64 => 1.0, 0.0, false, |x: f64| x, |v: f64| v;
    half::f16 => half::f16::ONE, half::f16::ZERO, false, half::f16::to_f64, half::f16::from_f64;
    half::bf16 => half::bf16::ONE, half::bf16::ZERO, false, half::bf16::to_f64, half::bf16::from_f64;
}

/// The GEMM on the host, by its definition, in f64 (the emulation checks the operand forms
/// and leading dimensions the backend passes, not cuBLAS's rounding).
fn host_gemm<T: GemmScalar>(
    call: &GemmCall,
    a: (&HostMemory, usize),
    b: (&HostMemory, usize),
    c: &HostMemory,
) {
    let size = std::mem::size_of::<T>();
    let read = |m: &HostMemory, byte: usize, i: i64| -> f64 {
        // SAFETY: the index lies inside the operand's layout (checked by the tensor layer);
        // unaligned reads, so any offset works.
        unsafe { (m.ptr().add(byte + i as usize * size) as *const T).read_unaligned() }.to_f64()
    };
    for p in 0..call.batch as i64 {
        for j in 0..call.n as i64 {
            for i in 0..call.m as i64 {
                let mut sum = 0.0;
                for l in 0..call.k as i64 {
                    let ai = if call.transa {
                        l + i * call.lda
                    } else {
                        i + l * call.lda
                    };
                    let bi = if call.transb {
                        j + l * call.ldb
                    } else {
                        l + j * call.ldb
                    };
                    sum += read(a.0, a.1, p * call.stride_a + ai)
                        * read(b.0, b.1, p * call.stride_b + bi);
                }
                let ci = (p * call.stride_c + i + j * call.ldc) as usize;
                // SAFETY: `c` holds batch × ldc × n values.
                unsafe { (c.ptr().add(ci * size) as *mut T).write_unaligned(T::from_f64(sum)) };
            }
        }
    }
}

impl CudaEngine {
    /// cuDNN's handle on this device, opened on first use.
    fn dnn(&self) -> std::result::Result<&Dnn, &String> {
        self.dnn
            .get_or_init(|| {
                self.ctx
                    .bind_to_thread()
                    .map_err(|e| format!("making the context current: {e}"))?;
                Dnn::open(self.stream.cu_stream().cast())
            })
            .as_ref()
    }

    fn run_cudnn(
        &self,
        plan: &Plan,
        a: (&CudaSlice<u8>, usize),
        b: (&CudaSlice<u8>, usize),
        out: &mut CudaSlice<u8>,
    ) -> Result<()> {
        let refused = |msg: String| Error::Backend {
            backend: BACKEND,
            msg: format!("cuDNN: {msg}"),
        };
        let dnn = self.dnn().map_err(|e| refused(e.clone()))?;
        let [na, nb, nout] = plan.operand_bytes();
        for (what, have, need) in [
            ("first operand", a.0.len().saturating_sub(a.1), na),
            ("second operand", b.0.len().saturating_sub(b.1), nb),
            ("output", out.len(), nout),
        ] {
            if have < need {
                return Err(refused(format!(
                    "the {what} holds {have} bytes, the plan reads {need}"
                )));
            }
        }
        self.ctx
            .bind_to_thread()
            .map_err(|e| driver("making the context current for cuDNN", e))?;
        // Stream-ordered: freed after the convolution on the same stream.
        let workspace = if plan.workspace > 0 {
            // SAFETY: the workspace is cuDNN's scratch, written before it is read.
            Some(
                unsafe { self.stream.alloc::<u8>(plan.workspace) }.map_err(|e| {
                    driver(
                        &format!("allocating {} bytes of cuDNN workspace", plan.workspace),
                        e,
                    )
                })?,
            )
        } else {
            None
        };
        let (pa, _ra) = a.0.device_ptr(&self.stream);
        let (pb, _rb) = b.0.device_ptr(&self.stream);
        let (po, _ro) = out.device_ptr_mut(&self.stream);
        let pw = workspace
            .as_ref()
            .map_or(0, |w| w.device_ptr(&self.stream).0);
        // SAFETY: every pointer is this device's memory holding at least the bytes the plan
        // touches from its offset (checked above); the buffers and the workspace outlive
        // the queued call in stream order (their frees are queued on the same stream).
        unsafe { dnn.run(plan, pa + a.1 as u64, pb + b.1 as u64, po, pw) }
    }

    fn function(&self, name: &str, source: impl FnOnce() -> KernelSource) -> Result<CudaFunction> {
        let slot = {
            let mut slots = self.functions.lock().unwrap_or_else(|e| e.into_inner());
            match slots.get(name) {
                Some(slot) => slot.clone(),
                None => slots.entry(name.to_string()).or_default().clone(),
            }
        };
        let mut slot = slot.lock().unwrap_or_else(|e| e.into_inner());
        if let Some(f) = slot.as_ref() {
            return Ok(f.clone());
        }
        let kernel = source();
        let ptx = crate::compile_ptx(&kernel, self.arch)?;
        let module = self
            .ctx
            .load_module(ptx)
            .map_err(|e| driver(&format!("loading kernel {name}"), e))?;
        let f = module
            .load_function(&kernel.name)
            .map_err(|e| driver(&format!("finding kernel {name}"), e))?;
        *slot = Some(f.clone());
        Ok(f)
    }

    /// Queues compiled kernel `f` (named `name` in errors).
    fn launch(&self, name: &str, f: &CudaFunction, how: Launch, args: &[Arg<'_>]) -> Result<()> {
        let cfg = match how {
            Launch::Items(n) => LaunchConfig {
                grid_dim: (n.div_ceil(THREADS as usize).clamp(1, 1 << 20) as u32, 1, 1),
                block_dim: (THREADS, 1, 1),
                shared_mem_bytes: 0,
            },
            Launch::Blocks { blocks, threads } => LaunchConfig {
                grid_dim: (blocks, 1, 1),
                block_dim: (threads, 1, 1),
                shared_mem_bytes: 0,
            },
        };
        let mut l = self.stream.launch_builder(f);
        for a in args {
            match a {
                Arg::Buf(Memory::Cuda(s)) => l.arg(&**s),
                Arg::Buf(Memory::Host(_)) => return Err(foreign()),
                Arg::I64(v) => l.arg(v),
                Arg::I32(v) => l.arg(v),
                Arg::F32(v) => l.arg(v),
                Arg::F64(v) => l.arg(v),
                Arg::View(v) => l.arg(v),
                Arg::Geo(v) => l.arg(v),
            };
        }
        // SAFETY: the backend passes each kernel the parameters its source declares, in
        // order (the sources and the calls are written together, and the host emulation
        // runs the same calls against the same sources under the conformance suite); every
        // index a kernel forms lies inside its operands' layouts, checked by the tensor layer.
        unsafe { l.launch(cfg) }.map_err(|e| driver(name, e))?;
        Ok(())
    }

    fn gemm<T: GemmScalar>(
        &self,
        call: &GemmCall,
        a: (&CudaSlice<u8>, usize),
        b: (&CudaSlice<u8>, usize),
        c: &mut CudaSlice<u8>,
    ) -> Result<()>
    where
        CudaBlas: Gemm<T>,
    {
        // cuBLAS runs in the calling thread's current context: this device's (an op may
        // come from any thread, e.g. an input pipeline's).
        self.ctx
            .bind_to_thread()
            .map_err(|e| driver("making the context current for cuBLAS", e))?;
        let size = std::mem::size_of::<T>();
        let refused = |what: &str| Error::Backend {
            backend: BACKEND,
            msg: format!("matmul: {what} could not be given to cuBLAS"),
        };
        // TensorFloat-32 for float32 where allowed and present; full float32 otherwise.
        let mode = if T::IS_F32 && self.has_tf32 && crate::tensor_float_32_execution_enabled() {
            cudarc::cublas::sys::cublasMath_t::CUBLAS_TF32_TENSOR_OP_MATH
        } else {
            cudarc::cublas::sys::cublasMath_t::CUBLAS_DEFAULT_MATH
        };
        // SAFETY: the handle is this device's, alive as long as `self`.
        let status = unsafe { cudarc::cublas::sys::cublasSetMathMode(*self.blas.handle(), mode) };
        if status != cudarc::cublas::sys::cublasStatus_t::CUBLAS_STATUS_SUCCESS {
            return Err(Error::Backend {
                backend: BACKEND,
                msg: format!("matmul: cuBLAS refused the math mode: {status:?}"),
            });
        }
        let op = |t: bool| {
            if t {
                cudarc::cublas::sys::cublasOperation_t::CUBLAS_OP_T
            } else {
                cudarc::cublas::sys::cublasOperation_t::CUBLAS_OP_N
            }
        };
        // cuBLAS takes 32-bit sizes: a larger one is an error, never a truncated product.
        let int = |v: i64, what: &str| {
            i32::try_from(v).map_err(|_| Error::NotSupportedByBackend {
                op: "matmul",
                backend: BACKEND,
                detail: format!(", a {what} of {v} (cuBLAS takes at most {})", i32::MAX),
            })
        };
        let cfg = StridedBatchedConfig {
            gemm: GemmConfig {
                transa: op(call.transa),
                transb: op(call.transb),
                m: int(call.m as i64, "matrix dimension")?,
                n: int(call.n as i64, "matrix dimension")?,
                k: int(call.k as i64, "inner dimension")?,
                alpha: T::ONE,
                lda: int(call.lda, "row stride")?,
                ldb: int(call.ldb, "row stride")?,
                beta: T::ZERO,
                ldc: int(call.ldc, "row stride")?,
            },
            batch_size: int(call.batch as i64, "batch")?,
            stride_a: call.stride_a,
            stride_b: call.stride_b,
            stride_c: call.stride_c,
        };
        let va = a.0.try_slice(a.1..).ok_or_else(|| refused("lhs"))?;
        let vb = b.0.try_slice(b.1..).ok_or_else(|| refused("rhs"))?;
        // SAFETY: the views are reinterpreted as T over whole elements of their bytes; the
        // strides and leading dimensions keep every read inside the tensors' layouts
        // (checked by the tensor layer), and `c` holds batch · m · n values.
        unsafe {
            let va = va
                .transmute::<T>(va.len() / size)
                .ok_or_else(|| refused("lhs"))?;
            let vb = vb
                .transmute::<T>(vb.len() / size)
                .ok_or_else(|| refused("rhs"))?;
            let len = c.len() / size;
            let mut vc = c
                .transmute_mut::<T>(len)
                .ok_or_else(|| refused("the output"))?;
            // One product through cuBLAS's plain GEMM (PyTorch's `mm` call), whose
            // heuristics need not be the batched entry point's with a batch of one.
            let done = if cfg.batch_size == 1 {
                self.blas.gemm(cfg.gemm, &va, &vb, &mut vc)
            } else {
                self.blas.gemm_strided_batched(cfg, &va, &vb, &mut vc)
            };
            done.map_err(|e| Error::Backend {
                backend: BACKEND,
                msg: format!("matmul: cuBLAS: {e:?}"),
            })?;
        }
        Ok(())
    }
}

/// Makes the device's stream-ordered memory pool (where every tensor's memory comes from)
/// a caching allocator: its release threshold is 0 by default, so each synchronisation
/// (every value the host reads) would hand freed memory back to the driver and the next
/// step allocate it again; with no threshold, freed blocks stay for reuse (PyTorch's and
/// TF's allocators keep theirs too). A driver that refuses leaves the default.
fn keep_freed_memory(device: sys::CUdevice) {
    let mut pool: sys::CUmemoryPool = std::ptr::null_mut();
    let mut threshold = u64::MAX;
    // SAFETY: the driver is loaded (a context exists); `pool` is written by the first call
    // and used only when it succeeded; the attribute takes a pointer to a u64.
    unsafe {
        if sys::cuDeviceGetDefaultMemPool(&mut pool, device) == sys::CUresult::CUDA_SUCCESS {
            let _ = sys::cuMemPoolSetAttribute(
                pool,
                sys::CUmemPool_attribute::CU_MEMPOOL_ATTR_RELEASE_THRESHOLD,
                (&mut threshold as *mut u64).cast(),
            );
        }
    }
}

/// What the host's C++ compiler sees before a kernel: CUDA's built-ins for one thread at a
/// time (the launch loop sets the indices), the bit casts, an `atomicMax` that needs no
/// atomicity (one thread runs at a time).
const HOST_SHIM: &str = r#"
#include <math.h>
#include <string.h>
#define FF_HOST 1
struct ff_dim3 { unsigned int x, y, z; };
static thread_local ff_dim3 blockIdx, threadIdx, blockDim, gridDim;
#define __global__
#define __device__
#define __forceinline__ inline
static inline float __int_as_float(int i) { float f; memcpy(&f, &i, 4); return f; }
static inline float __uint_as_float(unsigned int i) { float f; memcpy(&f, &i, 4); return f; }
static inline unsigned int __float_as_uint(float f) { unsigned int i; memcpy(&i, &f, 4); return i; }
static inline long long __double_as_longlong(double d) { long long i; memcpy(&i, &d, 8); return i; }
static inline double __longlong_as_double(long long i) { double d; memcpy(&d, &i, 8); return d; }
static inline unsigned int atomicMax(unsigned int* p, unsigned int v) {
    unsigned int old = *p;
    if (v > old) *p = v;
    return old;
}
"#;

/// What block-level kernels (shared memory, `__syncthreads`) need besides [`HOST_SHIM`]: a
/// block's threads are real threads (see the launch wrapper), its shared arrays are
/// statics, its barrier the block's. POSIX threads, not C++'s `<thread>` and `<barrier>`:
/// those headers took a block kernel's library from 0.3 s to 1.2 s to compile.
const HOST_BLOCK_SHIM: &str = r#"
#include <errno.h>
#include <pthread.h>
#include <stdlib.h>
#define __shared__ static
static thread_local pthread_barrier_t* ff_block_barrier = nullptr;
static inline void __syncthreads() { pthread_barrier_wait(ff_block_barrier); }
/* A block's threads wait at this gate until all of them exist (go = 1), or one could not
   be made (go = -1: none runs the kernel, so none waits at a barrier for it). */
struct ff_gate { pthread_mutex_t lock; pthread_cond_t open; int go; };
static int ff_gate_wait(ff_gate* g) {
    pthread_mutex_lock(&g->lock);
    while (g->go == 0) pthread_cond_wait(&g->open, &g->lock);
    int go = g->go;
    pthread_mutex_unlock(&g->lock);
    return go;
}
static void ff_gate_set(ff_gate* g, int go) {
    pthread_mutex_lock(&g->lock);
    g->go = go;
    pthread_cond_broadcast(&g->open);
    pthread_mutex_unlock(&g->lock);
}
"#;

/// The C++ standard the emulation compiles to: enough for the shims (`thread_local`), and
/// a third faster than C++20 through `<math.h>` on every library.
const HOST_CXX_STD: &str = "-std=c++14";

/// Whether a kernel runs as blocks of cooperating threads (and so needs
/// [`HOST_BLOCK_SHIM`]).
fn uses_blocks(kernel: &KernelSource) -> bool {
    kernel.code.contains("__syncthreads") || kernel.code.contains("__shared__")
}

/// Kernels of the catalog compiled together into one library (the compiler's start-up
/// dominates one small kernel).
const HOST_GROUP: usize = 64;

type HostLibrary = Arc<OnceLock<std::result::Result<libloading::Library, String>>>;

impl HostEngine {
    /// The library holding kernel `name`, compiled on first use: with the catalog's group it
    /// belongs to, else alone (or alone when its group does not compile, so the error names
    /// it).
    fn library(&self, name: &str, source: impl FnOnce() -> KernelSource) -> HostLibrary {
        // The catalog and each kernel's place in it, made once.
        type Catalog = (Vec<KernelSource>, HashMap<String, usize>);
        static CATALOG: OnceLock<Catalog> = OnceLock::new();
        let (catalog, index) = CATALOG.get_or_init(|| {
            let all = crate::source::catalog();
            let index = all
                .iter()
                .enumerate()
                .map(|(i, k)| (k.name.clone(), i))
                .collect();
            (all, index)
        });
        if let Some(&at) = index.get(name) {
            let group = at / HOST_GROUP;
            let slot = self.slot(&format!("group {group}"));
            slot.get_or_init(|| {
                let end = ((group + 1) * HOST_GROUP).min(catalog.len());
                self.compile(&format!("group_{group}"), &catalog[group * HOST_GROUP..end])
            });
            if matches!(slot.get(), Some(Ok(_))) {
                return slot;
            }
        }
        let slot = self.slot(name);
        slot.get_or_init(|| self.compile(name, &[source()]));
        slot
    }

    fn slot(&self, key: &str) -> HostLibrary {
        let mut libs = self.libraries.lock().unwrap_or_else(|e| e.into_inner());
        libs.entry(key.to_string()).or_default().clone()
    }

    /// Compiles `kernels`, each in a namespace of its own with its launch loop
    /// (`ff_host_launch_NAME`), into one shared library.
    fn compile(
        &self,
        stem: &str,
        kernels: &[KernelSource],
    ) -> std::result::Result<libloading::Library, String> {
        let blocks = kernels.iter().any(uses_blocks);
        let wrappers = kernels
            .iter()
            .map(|k| launch_wrapper(k, blocks))
            .collect::<std::result::Result<Vec<_>, _>>()?;
        let mut wrapper = wrappers.into_iter();
        let program = crate::source::grouped(stem, kernels, |_| wrapper.next().unwrap_or_default());
        let block_shim = if blocks { HOST_BLOCK_SHIM } else { "" };
        let code = format!("{HOST_SHIM}{block_shim}{}", program.code);
        let cpp = self.dir.join(format!("{stem}.cpp"));
        let so = self.dir.join(format!("{stem}.so"));
        std::fs::create_dir_all(&self.dir)
            .map_err(|e| format!("creating {}: {e}", self.dir.display()))?;
        // Nothing is left behind: once loaded, the library's mapping outlives its file.
        let cleanup = || {
            let _ = std::fs::remove_file(&cpp);
            let _ = std::fs::remove_file(&so);
            let _ = std::fs::remove_dir(&self.dir);
        };
        std::fs::write(&cpp, code).map_err(|e| format!("writing {}: {e}", cpp.display()))?;
        let out = std::process::Command::new(crate::emulation::compiler())
            .args([
                HOST_CXX_STD,
                "-pthread",
                // Unoptimised: the kernels run on small test data, and the compiler's time
                // dominates (the emulated suite runs in 55 s instead of 78 s at -O1).
                "-O0",
                "-shared",
                "-fPIC",
                "-w",
                "-o",
            ])
            .arg(&so)
            .arg(&cpp)
            .output()
            .map_err(|e| format!("running the C++ compiler: {e}"))?;
        if !out.status.success() {
            cleanup();
            return Err(format!(
                "the host's C++ compiler refused {stem}: {}",
                String::from_utf8_lossy(&out.stderr)
            ));
        }
        // SAFETY: the library is ours, just built; loading runs no initialisers of note.
        let lib = unsafe { libloading::Library::new(&so) }
            .map_err(|e| format!("loading {}: {e}", so.display()));
        cleanup();
        lib
    }

    /// Runs kernel `name` from its compiled library `slot` ([`HostEngine::library`]).
    fn launch(&self, name: &str, slot: &HostLibrary, how: Launch, args: &[Arg<'_>]) -> Result<()> {
        let lib = match slot.get() {
            Some(Ok(lib)) => lib,
            Some(Err(msg)) => {
                return Err(Error::Backend {
                    backend: BACKEND,
                    msg: msg.clone(),
                })
            }
            None => {
                return Err(Error::Backend {
                    backend: BACKEND,
                    msg: format!("kernel {name} was not compiled"),
                })
            }
        };
        let (grid, block) = match how {
            // One thread walks the whole grid-stride loop.
            Launch::Items(_) => (1u32, 1u32),
            // Real threads per block, meeting at `__syncthreads`.
            Launch::Blocks { blocks, threads } => (blocks, threads),
        };
        // The values the pointers below point at.
        let ptrs: Vec<*mut u8> = args
            .iter()
            .map(|a| match a {
                Arg::Buf(Memory::Host(h)) => h.ptr(),
                _ => std::ptr::null_mut(),
            })
            .collect();
        let mut params: Vec<*const std::ffi::c_void> = vec![];
        for (a, p) in args.iter().zip(&ptrs) {
            params.push(match a {
                Arg::Buf(Memory::Host(_)) => p as *const *mut u8 as *const _,
                Arg::Buf(Memory::Cuda(_)) => return Err(foreign()),
                Arg::I64(v) => v as *const i64 as *const _,
                Arg::I32(v) => v as *const i32 as *const _,
                Arg::F32(v) => v as *const f32 as *const _,
                Arg::F64(v) => v as *const f64 as *const _,
                Arg::View(v) => v as *const View as *const _,
                Arg::Geo(v) => v as *const Geo as *const _,
            });
        }
        type Entry =
            unsafe extern "C" fn(*const *const std::ffi::c_void, u32, u32) -> std::ffi::c_int;
        let symbol = format!("ff_host_launch_{name}");
        // SAFETY: the symbol is the wrapper `launch_wrapper` wrote: it reads each parameter
        // through its pointer with the type the kernel declares, as CUDA's `cuLaunchKernel`
        // does; the buffers are host memory of the sizes the backend asked for.
        unsafe {
            let entry: libloading::Symbol<Entry> =
                lib.get(symbol.as_bytes()).map_err(|e| Error::Backend {
                    backend: BACKEND,
                    msg: format!("kernel {name}: {e}"),
                })?;
            let started = entry(params.as_ptr(), grid, block);
            if started != 0 {
                return Err(Error::Backend {
                    backend: BACKEND,
                    msg: format!(
                        "kernel {name}: the host could not start a block of {block} threads \
                         ({})",
                        std::io::Error::from_raw_os_error(started)
                    ),
                });
            }
        }
        Ok(())
    }
}

/// `extern "C" int ff_host_launch_NAME(void** params, unsigned grid, unsigned block)`: calls the
/// kernel once per (block, thread) with each parameter read through its pointer as the
/// kernel declares it; without `blocks` (no [`HOST_BLOCK_SHIM`]) only launches of one
/// thread per block, the grid-stride loops'. It returns 0, or `pthread_barrier_init`'s or
/// `pthread_create`'s error when a block's barrier or threads could not all be made (then
/// the kernel ran in none of that block's threads).
fn launch_wrapper(kernel: &KernelSource, blocks: bool) -> std::result::Result<String, String> {
    let head = format!("__global__ void {}(", kernel.name);
    let start = kernel
        .code
        .find(&head)
        .ok_or_else(|| format!("kernel {} has no definition", kernel.name))?
        + head.len();
    let end = start
        + kernel.code[start..]
            .find(')')
            .ok_or_else(|| format!("kernel {}: unterminated parameters", kernel.name))?;
    let mut reads = vec![];
    for (i, param) in kernel.code[start..end].split(',').enumerate() {
        let param = param.trim();
        // The type is all but the last word (the parameter's name).
        let cut = param
            .rfind(|c: char| !(c.is_alphanumeric() || c == '_'))
            .ok_or_else(|| format!("kernel {}: parameter {param:?} has no type", kernel.name))?;
        let ty = &param[..=cut];
        reads.push(format!("*({ty}*)p[{i}]"));
    }
    let reads = reads.join(", ");
    let name = &kernel.name;
    if !blocks {
        // Threads that never meet (no shared memory, no barrier) run one after another.
        return Ok(format!(
            "extern \"C\" int ff_host_launch_{name}(void** p, unsigned int grid, unsigned int block) {{\n\
             gridDim.x = grid; gridDim.y = 1; gridDim.z = 1;\n\
             blockDim.x = block; blockDim.y = 1; blockDim.z = 1;\n\
             for (unsigned int b = 0; b < grid; ++b) for (unsigned int t = 0; t < block; ++t) {{\n\
             blockIdx.x = b; blockIdx.y = 0; blockIdx.z = 0;\n\
             threadIdx.x = t; threadIdx.y = 0; threadIdx.z = 0;\n\
             {name}({reads});\n}}\nreturn 0;\n}}\n"
        ));
    }
    // One thread: the grid-stride loop in order. Several: each block's threads as real
    // threads meeting at a barrier (`__syncthreads`), one block after another, one such
    // launch of this kernel at a time (its `__shared__` arrays are the library's statics).
    // A block's threads start the kernel only once all of them exist.
    Ok(format!(
        "static void ff_run_{name}(void** p, unsigned int grid, unsigned int block, unsigned int b, unsigned int t, \
         pthread_barrier_t* bar) {{\n\
         gridDim.x = grid; gridDim.y = 1; gridDim.z = 1;\n\
         blockDim.x = block; blockDim.y = 1; blockDim.z = 1;\n\
         blockIdx.x = b; blockIdx.y = 0; blockIdx.z = 0;\n\
         threadIdx.x = t; threadIdx.y = 0; threadIdx.z = 0;\n\
         ff_block_barrier = bar;\n\
         {name}({reads});\n}}\n\
         struct ff_thread_{name} {{ void** p; unsigned int grid, block, b, t; pthread_barrier_t* bar; ff_gate* gate; }};\n\
         static void* ff_thread_main_{name}(void* a) {{\n\
         ff_thread_{name}* x = (ff_thread_{name}*)a;\n\
         if (ff_gate_wait(x->gate) > 0) ff_run_{name}(x->p, x->grid, x->block, x->b, x->t, x->bar);\n\
         return nullptr;\n}}\n\
         static pthread_mutex_t ff_lock_{name} = PTHREAD_MUTEX_INITIALIZER;\n\
         extern \"C\" int ff_host_launch_{name}(void** p, unsigned int grid, unsigned int block) {{\n\
         if (block == 1) {{ for (unsigned int b = 0; b < grid; ++b) ff_run_{name}(p, grid, 1, b, 0, nullptr); return 0; }}\n\
         pthread_mutex_lock(&ff_lock_{name});\n\
         pthread_t* threads = (pthread_t*)calloc(block, sizeof(pthread_t));\n\
         ff_thread_{name}* args = (ff_thread_{name}*)calloc(block, sizeof(ff_thread_{name}));\n\
         int failed = (threads == nullptr || args == nullptr) ? ENOMEM : 0;\n\
         for (unsigned int b = 0; b < grid && failed == 0; ++b) {{\n\
         pthread_barrier_t bar;\n\
         failed = pthread_barrier_init(&bar, nullptr, block);\n\
         if (failed != 0) break;\n\
         ff_gate gate = {{PTHREAD_MUTEX_INITIALIZER, PTHREAD_COND_INITIALIZER, 0}};\n\
         unsigned int made = 0;\n\
         for (; made < block; ++made) {{\n\
         args[made] = ff_thread_{name}{{p, grid, block, b, made, &bar, &gate}};\n\
         failed = pthread_create(&threads[made], nullptr, ff_thread_main_{name}, &args[made]);\n\
         if (failed != 0) break;\n}}\n\
         ff_gate_set(&gate, failed == 0 ? 1 : -1);\n\
         for (unsigned int t = 0; t < made; ++t) pthread_join(threads[t], nullptr);\n\
         pthread_barrier_destroy(&bar);\n}}\n\
         free(threads); free(args);\n\
         pthread_mutex_unlock(&ff_lock_{name});\n\
         return failed;\n}}\n"
    ))
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Small requests share power-of-two classes from 512 bytes (a class holds the
    /// request); past 1 MiB they go to the driver as they are.
    #[test]
    fn block_classes_hold_their_requests() {
        assert_eq!(block_class(0), Some(512));
        assert_eq!(block_class(1), Some(512));
        assert_eq!(block_class(512), Some(512));
        assert_eq!(block_class(513), Some(1024));
        assert_eq!(block_class(64 * 4), Some(512));
        assert_eq!(block_class(1 << 20), Some(1 << 20));
        assert_eq!(block_class((1 << 20) + 1), None);
        for bytes in (0..(1 << 20)).step_by(4099) {
            let class = block_class(bytes).expect("a class");
            assert!(class >= bytes && class.is_power_of_two() && class >= 512);
            assert!(class == 512 || class < 2 * bytes, "{bytes} -> {class}");
            assert_eq!(block_class(class), Some(class), "a class is its own class");
        }
    }

    #[test]
    fn the_launch_wrapper_reads_each_parameter_with_its_type() {
        let k = KernelSource {
            name: "k".into(),
            code: "extern \"C\" __global__ void k(const float* __restrict__ A, View va, ff_i64 n, unsigned int* E) {}".into(),
        };
        let w = launch_wrapper(&k, true).expect("a wrapper");
        assert!(
            w.contains("k(*(const float* __restrict__ *)p[0], *(View *)p[1], *(ff_i64 *)p[2], *(unsigned int* *)p[3]);")
                && w.contains("extern \"C\" int ff_host_launch_k(void** p"),
            "{w}"
        );
    }
}
