//! ferroflow's native NVIDIA backend (`/GPU:N` through CUDA): CUDA C kernels generated per op
//! and dtype ([`source`]), compiled by NVRTC at run time and cached per device, and cuBLAS for
//! matrix products, through `cudarc` with dynamic loading: the crate builds on machines with
//! no CUDA toolkit or driver, and asking for a device there is an error that names the
//! missing library ([`missing_libraries`]), never a panic.
//!
//! ## State (issue #23)
//! Every primitive of the [`Backend`] trait has a kernel: elementwise unary and binary ops
//! with broadcasting and strides in every real dtype, casts, `select`, reductions and
//! arg-reductions, gather and its adjoint scatter-add (indices checked: an index out of range
//! is the CPU backend's error), concat, pad, cumulative sums and products, a stable sort,
//! direct convolutions and their two gradients, max and average pooling and their gradients
//! (float dtypes), and batched matrix products through cuBLAS (f16, bf16, f32, f64;
//! TensorFloat-32 per [`set_tensor_float_32_execution`]). Memory comes from the driver's
//! stream-ordered pool, its release threshold lifted so that freed blocks are kept for
//! reuse (no `cudaMalloc` per op, nothing handed back at each synchronisation), and blocks
//! of up to 1 MiB are kept by the backend itself once freed, for the next op of their size
//! class with no driver call ([`set_block_cache_limit`]); every op runs in order on the device's
//! stream and the host waits only where it reads a value. Every kernel source compiles with
//! NVRTC for sm_80 and sm_90 and `ptxas` accepts it (the `nvrtc` test, run by CI with
//! NVIDIA's wheels). Of the optional fused kernels it has the optimizer update (every rule,
//! float32 and float64), `fused_conv2d`, `bias_activation_grad`, `clip_scalar`, and a
//! graph's elementwise programs (in the four float types) as one generated kernel each
//! (`source::fused_program`: every step the op's own expression, rounded where the op's
//! kernel stores it, so the bits equal the ops' one by one), with a reduction of the first
//! output inside the reduction kernel's loads (`fused_reduce`). Float convolutions and
//! both their gradients, and pooling (not its gradients), go through cuDNN 9 where
//! `libcudnn.so.9` loads ([`cudnn_version`]; NHWC, the algorithm picked per shape by
//! cuDNN's own timing within [`set_convolution_workspace_limit`], TF32 per the switch;
//! [`set_cudnn_enabled`] turns it off, [`cudnn_plans`] lists what it runs;
//! `TF_DETERMINISTIC_OPS=1` keeps it to deterministic algorithms and
//! `TF_CUDNN_USE_AUTOTUNE=0` ranks them by cuDNN's heuristics instead of timing them, as in
//! TF 2.4). Without cuDNN,
//! or for a shape it refuses, pooling runs the backend's kernels and convolutions run
//! as im2col (a generated kernel) and one cuBLAS GEMM (tensor cores, TF32 per the
//! switch), the input gradient's columns summed back per input element (`col2im`,
//! deterministic; a pointwise window's columns are its input, no workspace); where the
//! batch's column matrix would pass the workspace limit (1 GiB), a chunk of images at a
//! time whose columns fit (outputs copied into place, filter gradients summed), and as
//! direct loops only where one image's columns would pass it. The cuDNN path has **not run on a GPU yet**: its side of the backend (the
//! zeros appended where TF pads one more after, the filter reordered to KRSC, the gradients
//! cut and transposed back) is checked on the host emulation against a stand-in for cuDNN
//! ([`emulation::set_cudnn_stand_in`], `tests/emulated_cudnn_convolutions.rs`).
//! NCCL's collectives ([`nccl`]: `libnccl.so.2` loaded at run time, non-blocking
//! communicators waited for within the collective timeout) serve the distribution crate's
//! `Nccl` implementation and MirroredStrategy's `NcclAllReduce`, registered as the
//! backend's device collectives with its devices; on the emulation a stand-in (a hub over
//! loopback TCP) carries them, so the path runs across processes without a GPU. NCCL
//! itself has **not run on a GPU yet**.
//! Uniform and normal random numbers are generated on the device (`Backend::random`: the
//! host's Philox stream, element `i` from its own words, bit for bit the host's draws).
//! While a profiler listens, every kernel and GEMM is timed on the device (events on the
//! stream, reported when the host next waits) for the profiler's `/device:GPU:N` plane.
//!
//! Without a GPU, [`emulation`] runs the same CUDA C on the host (the system's C++ compiler,
//! CUDA's built-ins shimmed, a launch as a loop) behind the same backend code, and the
//! conformance suite passes there (`tests/emulated.rs`, in CI): the kernels' arithmetic and
//! indexing, the views and launch parameters, the error words and the GEMM operand forms
//! are checked, the block-level reductions included (a block's threads are real threads
//! there). What only a GPU can check (NVRTC's code, cuBLAS, the driver) has **not run
//! yet** (`tests/conformance.rs` does, with `FERROFLOW_REQUIRE_CUDA=1`; `cargo xtask gpu`
//! runs it). `ferroflow::init()` registers it (the facade's `cuda` or `cuda-13` feature),
//! ahead of wgpu, as [`register`] does.
//!
//! ```
//! // Without NVIDIA's driver this registers nothing and returns 0.
//! let gpus = ferroflow_cuda::register();
//! assert!(gpus == ferroflow_cuda::devices().len());
//! ```

#[cfg(all(feature = "cuda-12", feature = "cuda-13"))]
compile_error!(
    "ferroflow-cuda: the features `cuda-12` and `cuda-13` exclude each other (the CUDA API the \
     bindings are built for); enable one (`--no-default-features --features cuda-13`)"
);
#[cfg(not(any(feature = "cuda-12", feature = "cuda-13")))]
compile_error!(
    "ferroflow-cuda: enable the feature `cuda-12` (the default) or `cuda-13`: the CUDA version \
     whose libraries the backend loads"
);

pub mod compile;
mod dnn;
pub mod emulation;
mod exec;
pub mod nccl;
pub mod source;

use std::sync::{Arc, OnceLock};

use cudarc::cublas::{CudaBlas, Gemm};
use ferroflow_tensor::backend::{unsupported, BufferBox, DeviceBuffer, Operand, UpdateOperands};
use ferroflow_tensor::{
    ArgReduceOp, Backend, BinaryOp, CumulativeOp, DType, DeviceKind, ElementwiseProgram,
    ElementwiseStep, Error, FusedActivation, FusedKernel, HostData, Layout, PoolKind, ReduceOp,
    Result, UnaryOp, UpdateRule, Window2d,
};

pub use compile::{
    compile_ptx, missing_libraries, nvrtc_available, versions, CUDA_MAJOR, LIBRARIES,
};
use dnn::{ConvGeometry, DnnKey, DnnOp};
use exec::{Arg, GemmCall, GemmScalar, Gpu, Launch, Memory};
use source::{Elem, KernelSource, View, MAX_RANK};

/// The backend's name in errors and device descriptions.
pub const BACKEND: &str = "cuda";

/// Whether float32 matrix products may use TensorFloat-32 on compute capability ≥ 8.0.
static TF32: std::sync::atomic::AtomicBool = std::sync::atomic::AtomicBool::new(true);

/// Lets float32 matrix products use TensorFloat-32 tensor cores (10-bit mantissa inputs,
/// float32 accumulation) on Ampere and later, or not: TF's
/// `tf.config.experimental.enable_tensor_float_32_execution`. On by default, as in TF 2.4.
///
/// ```
/// ferroflow_cuda::set_tensor_float_32_execution(false);
/// assert!(!ferroflow_cuda::tensor_float_32_execution_enabled());
/// ferroflow_cuda::set_tensor_float_32_execution(true);
/// ```
pub fn set_tensor_float_32_execution(enabled: bool) {
    TF32.store(enabled, std::sync::atomic::Ordering::Relaxed);
}

/// Whether TensorFloat-32 is allowed (see [`set_tensor_float_32_execution`]).
///
/// ```
/// let _ = ferroflow_cuda::tensor_float_32_execution_enabled();
/// ```
pub fn tensor_float_32_execution_enabled() -> bool {
    TF32.load(std::sync::atomic::Ordering::Relaxed)
}

/// The most outputs a reduction runs as blocks on the host emulation (each block is
/// `source::REDUCE_BLOCK` real threads there).
const HOST_BLOCK_OUTPUTS: usize = 3;

/// The most threads (outputs × segments) a split reduction's `_partials` kernel runs on a
/// GPU with `multiprocessors` of them: about half of what they hold at once (2048 threads
/// each), rounded down to a power of two (2^17 on an H200's 132), each thread then
/// combining 32 elements or more; the host emulation's 2^17 too.
fn reduction_threads(multiprocessors: Option<usize>) -> usize {
    match multiprocessors {
        Some(sms) => {
            let half = (sms * 1024).max(1024);
            1 << half.ilog2()
        }
        None => 1 << 17,
    }
}

/// How a reduction runs ([`Cuda::launch_reduction`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum ReductionPlan {
    /// `_rows`: a thread per output.
    Rows,
    /// `_blocks`: a block per output.
    Blocks,
    /// `_partials` over `segments` interleaved segments per output, then `_finish`.
    Split { segments: usize },
}

/// The plan for `outputs` reductions of `m` elements each on a GPU with `multiprocessors`
/// (`None`: the host emulation): short reductions, or very many outputs, a thread per
/// output; long ones along a strided kept axis a block per output when there are enough of
/// them (twice the multiprocessors); the rest (few outputs, or outputs along the contiguous
/// axis) split, unless that leaves one segment each, where a thread per output reads
/// coalesced. On the host emulation, whose blocks are real threads, blocks run for 2 or 3
/// outputs only, so its tests still reach every kernel.
fn reduction_plan(
    m: usize,
    outputs: usize,
    kept_contiguous: bool,
    multiprocessors: Option<usize>,
) -> ReductionPlan {
    let host = multiprocessors.is_none();
    if m <= 64 || outputs > (1 << 20) || (host && outputs > HOST_BLOCK_OUTPUTS) {
        return ReductionPlan::Rows;
    }
    let blocks_enough = multiprocessors.map_or(2, |sms| 2 * sms.max(1));
    if !kept_contiguous && outputs >= blocks_enough {
        return ReductionPlan::Blocks;
    }
    match (m / 32).min(reduction_threads(multiprocessors) / outputs) {
        0 | 1 => ReductionPlan::Rows,
        segments => ReductionPlan::Split { segments },
    }
}

/// The most workspace (bytes) a convolution may take ([`set_convolution_workspace_limit`]).
static CONVOLUTION_WORKSPACE: std::sync::atomic::AtomicUsize =
    std::sync::atomic::AtomicUsize::new(1 << 30);

/// Caps the scratch memory a float convolution (or its gradients) may take: cuDNN's
/// workspace (its algorithms that need more are not picked; TF's
/// `TF_CUDNN_WORKSPACE_LIMIT_IN_MB`) and, without cuDNN, the column matrix of im2col
/// (`batch · out_h · out_w × kh · kw · c` values) that lets a convolution run as one cuBLAS
/// GEMM; a batch needing more runs as GEMMs over chunks of images whose columns fit, and
/// only a window whose one image's columns pass the limit runs the direct loops, which take
/// none (slower). A pointwise window (1×1, stride 1, no padding) needs no workspace. 1 GiB
/// by default; 0 leaves cuDNN its algorithms without workspace and sends the rest to the
/// direct loops. Set it before the first convolution of a shape: cuDNN's plans keep the
/// algorithm they picked.
///
/// ```
/// ferroflow_cuda::set_convolution_workspace_limit(256 << 20);
/// assert_eq!(ferroflow_cuda::convolution_workspace_limit(), 256 << 20);
/// ferroflow_cuda::set_convolution_workspace_limit(1 << 30);
/// ```
pub fn set_convolution_workspace_limit(bytes: usize) {
    CONVOLUTION_WORKSPACE.store(bytes, std::sync::atomic::Ordering::Relaxed);
}

/// The limit [`set_convolution_workspace_limit`] set.
///
/// ```
/// assert!(ferroflow_cuda::convolution_workspace_limit() > 0);
/// ```
pub fn convolution_workspace_limit() -> usize {
    CONVOLUTION_WORKSPACE.load(std::sync::atomic::Ordering::Relaxed)
}

/// The most bytes of freed small blocks a device keeps for reuse ([`set_block_cache_limit`]).
static BLOCK_CACHE: std::sync::atomic::AtomicUsize = std::sync::atomic::AtomicUsize::new(256 << 20);

/// Caps the freed device memory each CUDA device keeps for reuse in blocks of up to 1 MiB
/// (powers of two from 512 bytes): an op whose output fits one takes a kept block with no
/// driver call, and hands it back when dropped, instead of allocating from and freeing to
/// the driver's stream-ordered pool (two driver calls per op, a large part of a small op's
/// host cost). 256 MiB by default; 0 keeps none (every block goes back to the driver, as
/// PyTorch's `PYTORCH_NO_CUDA_MEMORY_CACHING=1`). Kept blocks go back to the driver when an
/// allocation fails, and when the limit is set.
///
/// ```
/// ferroflow_cuda::set_block_cache_limit(0);
/// assert_eq!(ferroflow_cuda::block_cache_limit(), 0);
/// ferroflow_cuda::set_block_cache_limit(256 << 20);
/// ```
pub fn set_block_cache_limit(bytes: usize) {
    BLOCK_CACHE.store(bytes, std::sync::atomic::Ordering::Relaxed);
    // The blocks kept so far go back to the driver; the cache refills under the new limit.
    if let Ok(b) = shared() {
        b.gpus.iter().for_each(Gpu::clear_block_cache);
    }
}

/// The limit [`set_block_cache_limit`] set.
///
/// ```
/// let _ = ferroflow_cuda::block_cache_limit();
/// ```
pub fn block_cache_limit() -> usize {
    BLOCK_CACHE.load(std::sync::atomic::Ordering::Relaxed)
}

/// Whether float convolutions go through cuDNN where it loads ([`set_cudnn_enabled`]).
static CUDNN: std::sync::atomic::AtomicBool = std::sync::atomic::AtomicBool::new(true);

/// Lets float convolutions, their gradients and pooling run through cuDNN 9 where its
/// library loads (`libcudnn.so.9` on the loader's path), or not: then convolutions run as
/// im2col and a cuBLAS GEMM (or direct loops) and pooling on the backend's kernels. On by default; PyTorch's `torch.backends.cudnn.enabled`. Plans
/// already made are kept for when it is turned on again.
///
/// ```
/// ferroflow_cuda::set_cudnn_enabled(false);
/// assert!(!ferroflow_cuda::cudnn_enabled());
/// ferroflow_cuda::set_cudnn_enabled(true);
/// ```
pub fn set_cudnn_enabled(enabled: bool) {
    CUDNN.store(enabled, std::sync::atomic::Ordering::Relaxed);
}

/// Whether cuDNN may run convolutions and pooling (see [`set_cudnn_enabled`]).
///
/// ```
/// let _ = ferroflow_cuda::cudnn_enabled();
/// ```
pub fn cudnn_enabled() -> bool {
    CUDNN.load(std::sync::atomic::Ordering::Relaxed)
}

/// cuDNN's version where its library loads (`cuDNN 9.x.y`), or why it does not (no GPU
/// is needed to ask).
///
/// ```
/// match ferroflow_cuda::cudnn_version() {
///     Ok(v) => assert!(v.starts_with("cuDNN 9.")),
///     Err(why) => println!("convolutions run without cuDNN: {why}"),
/// }
/// ```
pub fn cudnn_version() -> std::result::Result<String, String> {
    dnn::library_version()
}

/// For each CUDA device, whether its convolutions run through cuDNN and how many shapes
/// cuDNN has planned or refused so far (or why there is no cuDNN there), for reports.
///
/// ```
/// for line in ferroflow_cuda::cudnn_report() {
///     println!("{line}");
/// }
/// ```
pub fn cudnn_report() -> Vec<String> {
    shared()
        .map(|b| {
            b.gpus
                .iter()
                .map(|g| format!("/GPU:{}: {}", g.ordinal, g.cudnn_report()))
                .collect()
        })
        .unwrap_or_default()
}

/// One convolution or pooling cuDNN was asked to run on a CUDA device ([`cudnn_plans`]).
#[derive(Clone, Debug, PartialEq)]
pub struct CudnnPlan {
    /// The device's ordinal (`/GPU:N`).
    pub device: usize,
    /// `conv2d`, `conv2d_backprop_input`, `conv2d_backprop_filter`, `max_pool2d` or
    /// `avg_pool2d`.
    pub op: &'static str,
    /// The operands' element type.
    pub dtype: DType,
    /// The input `[n, h, w, c]` as cuDNN runs it (with the zeros appended where TF pads
    /// one more after than before).
    pub input: [usize; 4],
    /// Output channels (pooling: the input's).
    pub filters: usize,
    /// The window's height and width.
    pub kernel: [usize; 2],
    /// The window's strides.
    pub strides: [usize; 2],
    /// The window's dilations (1 for pooling).
    pub dilations: [usize; 2],
    /// cuDNN's algorithm number (its `cudnnConvolution…Algo_t`; 0 for pooling) and the
    /// workspace bytes it takes, or why cuDNN could not run it (the backend's kernels do).
    pub algorithm: std::result::Result<(u32, usize), String>,
}

/// Every convolution and pooling cuDNN was asked to run on the CUDA devices so far, with
/// the algorithm it picked or why it refused (empty without a GPU or cuDNN).
///
/// ```
/// for p in ferroflow_cuda::cudnn_plans() {
///     println!("{} {:?} {:?} -> {:?}", p.op, p.dtype, p.input, p.algorithm);
/// }
/// ```
pub fn cudnn_plans() -> Vec<CudnnPlan> {
    let Ok(b) = shared() else {
        return Vec::new();
    };
    let mut plans = Vec::new();
    for g in &b.gpus {
        for (key, algorithm) in g.cudnn_plans() {
            let geo = key.geometry;
            plans.push(CudnnPlan {
                device: g.ordinal,
                op: key.op.name(),
                dtype: key.dtype,
                input: geo.input,
                filters: geo.filters,
                kernel: geo.kernel,
                strides: geo.strides,
                dilations: geo.dilations,
                algorithm,
            });
        }
    }
    plans
}

/// Memory of one device of this backend (a GPU's, or the host emulation's).
pub struct CudaBuffer {
    mem: Memory,
    /// The bytes the tensor holds.
    bytes: usize,
    ordinal: usize,
}

impl DeviceBuffer for CudaBuffer {
    fn as_any(&self) -> &dyn std::any::Any {
        self
    }
    fn size_in_bytes(&self) -> usize {
        self.bytes
    }
}

/// An operand as cuDNN reads it: dense, in its own buffer at a byte offset or in a copy
/// made for it.
enum DenseOperand<'a> {
    Own(&'a CudaBuffer, usize),
    Made(CudaBuffer),
}

impl DenseOperand<'_> {
    /// The memory and the byte offset the operand starts at.
    fn at(&self) -> (&Memory, usize) {
        match self {
            DenseOperand::Own(b, offset) => (&b.mem, *offset),
            DenseOperand::Made(b) => (&b.mem, 0),
        }
    }
}

/// A fresh buffer of `bytes` on `gpu`.
fn output(gpu: &Gpu, bytes: usize) -> Result<CudaBuffer> {
    Ok(CudaBuffer {
        mem: gpu.alloc(bytes)?,
        bytes,
        ordinal: gpu.ordinal,
    })
}

/// How a kernel pair `[a thread per output, a block of REDUCE_BLOCK threads per output]`
/// runs `outputs` outputs: the block kernel where each output's line is `long` and the grid
/// can hold a block per output (at most 2^31 - 1), else the thread kernel.
fn per_output_launch<'k>(
    kernels: &'k [KernelSource],
    outputs: usize,
    long: bool,
    op: &'static str,
) -> Result<(&'k KernelSource, Launch)> {
    match (kernels, u32::try_from(outputs)) {
        ([_, blocks, ..], Ok(o)) if long && o <= i32::MAX as u32 => Ok((
            blocks,
            Launch::Blocks {
                blocks: o,
                threads: source::REDUCE_BLOCK,
            },
        )),
        ([threads, ..], _) => Ok((threads, Launch::Items(outputs))),
        ([], _) => Err(Error::Backend {
            backend: BACKEND,
            msg: format!("{op}: its kernels are missing"),
        }),
    }
}

/// The error word's code and, for an index out of range, the index (waits for the kernel).
fn read_error(gpu: &Gpu, word: &Memory) -> Result<(u32, i64)> {
    let b = gpu.download(word, 0..16)?;
    let word = |i: usize| u32::from_le_bytes([b[4 * i], b[4 * i + 1], b[4 * i + 2], b[4 * i + 3]]);
    Ok((word(0), ((word(3) as u64) << 32 | word(2) as u64) as i64))
}

/// The CUDA backend: every device the driver lists.
pub struct Cuda {
    gpus: Vec<Gpu>,
}

fn shared() -> std::result::Result<Arc<Cuda>, String> {
    static CUDA: OnceLock<std::result::Result<Arc<Cuda>, String>> = OnceLock::new();
    CUDA.get_or_init(|| Cuda::new().map(Arc::new).map_err(|e| e.to_string()))
        .clone()
}

impl Cuda {
    fn new() -> Result<Cuda> {
        let missing = missing_libraries();
        if !missing.is_empty() {
            return Err(compile::library_missing(&missing.join(", ")));
        }
        let count = match cudarc::driver::CudaContext::device_count() {
            Ok(n) => n.max(0) as usize,
            // The driver loads but finds no device (CUDA_ERROR_NO_DEVICE) or none usable.
            Err(_) => 0,
        };
        let gpus = (0..count).map(Gpu::cuda).collect::<Result<Vec<_>>>()?;
        Ok(Cuda { gpus })
    }

    fn gpu(&self, ordinal: usize) -> Result<&Gpu> {
        self.gpus.get(ordinal).ok_or_else(|| Error::Backend {
            backend: BACKEND,
            msg: format!("no CUDA device {ordinal} ({} found)", self.gpus.len()),
        })
    }
}

/// Registers the CUDA devices as `/GPU:0..` and returns how many there are (0, registering
/// nothing, when the driver or a library is missing or no device is present;
/// [`devices_or_error`] says why).
///
/// ```
/// let n = ferroflow_cuda::register();
/// assert_eq!(n, ferroflow_cuda::devices().len());
/// ```
pub fn register() -> usize {
    match shared() {
        Ok(b) if !b.gpus.is_empty() => {
            let n = b.gpus.len();
            ferroflow_tensor::register_backend(DeviceKind::Gpu, b);
            ferroflow_tensor::distribution::register_device_collectives(Arc::new(
                nccl::NcclCollectives,
            ));
            n
        }
        _ => 0,
    }
}

/// The CUDA devices' descriptions, `/GPU:0` first (empty without a driver or device).
///
/// ```
/// for d in ferroflow_cuda::devices() {
///     println!("{d}");
/// }
/// ```
pub fn devices() -> Vec<String> {
    devices_or_error().unwrap_or_default()
}

/// The CUDA devices' descriptions, or the error that says why there are none to be had (a
/// library that does not load, a driver error).
///
/// ```
/// match ferroflow_cuda::devices_or_error() {
///     Ok(gpus) => println!("{} CUDA devices", gpus.len()),
///     Err(e) => println!("no CUDA: {e}"),
/// }
/// ```
pub fn devices_or_error() -> std::result::Result<Vec<String>, String> {
    shared().map(|b| b.gpus.iter().map(|g| g.name.clone()).collect())
}

/// This crate's backend serving `device` (a GPU's or the emulation's), or an error saying
/// that `op` needs a CUDA device.
fn serving(device: ferroflow_tensor::Device, op: &'static str) -> Result<Arc<Cuda>> {
    let not_cuda = |why: String| {
        Error::invalid(
            op,
            format!("{device} is not a CUDA device ({why}); NCCL runs on CUDA devices"),
        )
    };
    if device.kind() != DeviceKind::Gpu {
        return Err(not_cuda("a host device".into()));
    }
    let backend = ferroflow_tensor::backend_for(device).map_err(|e| not_cuda(e.to_string()))?;
    let ours = |c: &Arc<Cuda>| std::ptr::addr_eq(Arc::as_ptr(&backend), Arc::as_ptr(c));
    if let Some(c) = emulation::emulated().filter(|c| ours(c)) {
        return Ok(c.clone());
    }
    match shared() {
        Ok(c) if ours(&c) => Ok(c),
        _ => Err(not_cuda(format!(
            "the {} backend serves it",
            backend.name()
        ))),
    }
}

fn ours<'a>(x: &Operand<'a>, op: &'static str) -> Result<&'a CudaBuffer> {
    x.buffer
        .as_any()
        .downcast_ref::<CudaBuffer>()
        .ok_or_else(|| Error::Backend {
            backend: BACKEND,
            msg: format!("{op}: an operand is not CUDA memory"),
        })
}

fn elem(dtype: DType, op: &'static str) -> Result<Elem> {
    Elem::of(dtype).ok_or_else(|| unsupported(BACKEND, op, dtype))
}

/// `layout` as a kernel view, with axes of extent 1 dropped and neighbours that step as one
/// merged (the element order is unchanged), refusing more than [`MAX_RANK`] axes after that.
fn view_of(shape: &[usize], strides: &[isize], offset: usize, op: &'static str) -> Result<View> {
    let mut dims: Vec<(i64, i64)> = vec![];
    for (&s, &st) in shape.iter().zip(strides) {
        if s == 1 {
            continue;
        }
        let (s, st) = (s as i64, st as i64);
        match dims.last_mut() {
            Some(last) if last.1 == st * s => {
                last.0 *= s;
                last.1 = st;
            }
            _ => dims.push((s, st)),
        }
    }
    if dims.len() > MAX_RANK {
        return Err(Error::NotSupportedByBackend {
            op,
            backend: BACKEND,
            detail: format!(
                ", a view of {} axes that cannot be merged (the kernels take {MAX_RANK}); \
                 make it contiguous first",
                dims.len()
            ),
        });
    }
    let count: i64 = dims.iter().map(|&(s, _)| s).product();
    let mut v = View {
        offset: offset as i64,
        rank: dims.len() as i32,
        narrow: i32::from(count <= u32::MAX as i64),
        ..View::default()
    };
    for (d, (s, st)) in dims.into_iter().enumerate() {
        v.shape[d] = s;
        v.strides[d] = st;
    }
    Ok(v)
}

fn view(layout: &Layout, op: &'static str) -> Result<View> {
    view_of(layout.shape(), layout.strides(), layout.offset(), op)
}

/// The generated kernels of `key` (made once per process), or the "no kernel for dtype"
/// error naming `op`.
fn kernels(
    key: source::KernelKey,
    op: &'static str,
    dtype: DType,
) -> Result<Arc<source::Generated>> {
    source::generated(key).ok_or_else(|| unsupported(BACKEND, op, dtype))
}

/// An optimizer rule's five scalars `p0..p4` as kernel arguments in the variables' type
/// (the optimizer kernels take them as `e`).
fn rule_scalars(e: Elem, p: &[f64; 5]) -> [Arg<'static>; 5] {
    p.map(|v| {
        if e == Elem::F64 {
            Arg::F64(v)
        } else {
            Arg::F32(v as f32)
        }
    })
}

/// The lines of `x` along `axis` for the scans and the sort: (the input's line starts, its
/// step along the axis, the dense output's line starts, its step).
fn line_views(x: &Operand<'_>, axis: usize, op: &'static str) -> Result<(View, i64, View, i64)> {
    let shape = x.layout.shape();
    let out_strides = ferroflow_tensor::layout::contiguous_strides(shape);
    let others = |strides: &[isize]| -> (Vec<usize>, Vec<isize>) {
        (0..shape.len())
            .filter(|&d| d != axis)
            .map(|d| (shape[d], strides[d]))
            .unzip()
    };
    let (ks, kst) = others(x.layout.strides());
    let (_, ost) = others(&out_strides);
    Ok((
        view_of(&ks, &kst, x.layout.offset(), op)?,
        x.layout.strides()[axis] as i64,
        view_of(&ks, &ost, 0, op)?,
        out_strides[axis] as i64,
    ))
}

fn boxed(b: CudaBuffer) -> Result<BufferBox> {
    Ok(Box::new(b))
}

impl Cuda {
    /// One [`source::optimizer_group`] kernel updating every variable of `group` (dense
    /// operands, one dtype and device, at most [`source::OPTIMIZER_GROUP_MAX`]).
    fn update_in_one_kernel(
        &self,
        rule: &UpdateRule,
        group: &[&UpdateOperands<'_>],
        op: &'static str,
    ) -> Result<Vec<(BufferBox, Vec<BufferBox>)>> {
        let dtype = group[0].w.dtype;
        let e = elem(dtype, op)?;
        let (kind, p) = source::OptimizerKind::of(rule);
        let ns = kind.slots();
        let k = kernels(
            source::KernelKey::OptimizerGroup(kind, e, group.len()),
            op,
            dtype,
        )?;
        let (gpu, _) = self.gpu_of(&group[0].w, op)?;
        let mut outputs = vec![];
        let mut total = 0usize;
        for v in group {
            let bytes = v.w.layout.num_elements() * dtype.size_in_bytes();
            let y = output(gpu, bytes)?;
            let slots = (0..ns)
                .map(|_| output(gpu, bytes))
                .collect::<Result<Vec<_>>>()?;
            total += v.w.layout.num_elements();
            outputs.push((y, slots));
        }
        if total > 0 {
            let mut args = vec![];
            let mut end = 0usize;
            for (v, (y, slots)) in group.iter().zip(&outputs) {
                let inputs: Vec<&Operand<'_>> = [&v.w, &v.g].into_iter().chain(&v.slots).collect();
                for x in &inputs {
                    let (g, buf) = self.gpu_of(x, op)?;
                    if g.ordinal != gpu.ordinal {
                        return Err(Error::DeviceMismatch {
                            op,
                            lhs: format!("/GPU:{}", gpu.ordinal),
                            rhs: format!("/GPU:{}", g.ordinal),
                        });
                    }
                    args.push(Arg::Buf(&buf.mem));
                }
                args.push(Arg::Buf(&y.mem));
                args.extend(slots.iter().map(|s| Arg::Buf(&s.mem)));
                end += v.w.layout.num_elements();
                args.push(Arg::I64(end as i64));
                for x in &inputs {
                    let offset = x.layout.contiguous_range().map_or(0, |(off, _)| off);
                    args.push(Arg::I64(offset as i64));
                }
            }
            args.push(Arg::I64(total as i64));
            args.extend(rule_scalars(e, &p));
            let kernel = &k.kernels[0];
            gpu.launch(&kernel.name, || kernel.clone(), Launch::Items(total), &args)?;
        }
        outputs
            .into_iter()
            .map(|(y, slots)| {
                let slots = slots.into_iter().map(boxed).collect::<Result<Vec<_>>>()?;
                Ok((boxed(y)?, slots))
            })
            .collect()
    }

    fn gpu_of<'a>(&self, x: &Operand<'a>, op: &'static str) -> Result<(&Gpu, &'a CudaBuffer)> {
        let b = ours(x, op)?;
        Ok((self.gpu(b.ordinal)?, b))
    }

    /// Launches a one-input map kernel (unary, cast) over `x`'s elements into a fresh buffer.
    fn map_one(
        &self,
        x: Operand<'_>,
        out: Elem,
        op: &'static str,
        kernel: &KernelSource,
    ) -> Result<CudaBuffer> {
        let (gpu, a) = self.gpu_of(&x, op)?;
        let n = x.layout.num_elements();
        let y = output(gpu, n * out.dtype().size_in_bytes())?;
        if n == 0 {
            return Ok(y);
        }
        let va = view(x.layout, op)?;
        // (A, View, Y, n)
        gpu.launch(
            &kernel.name,
            || kernel.clone(),
            Launch::Items(n),
            &[
                Arg::Buf(&a.mem),
                Arg::View(va),
                Arg::Buf(&y.mem),
                Arg::I64(n as i64),
            ],
        )?;
        Ok(y)
    }

    /// A dense copy of `x` in its own dtype.
    fn dense(&self, x: Operand<'_>) -> Result<CudaBuffer> {
        let e = elem(x.dtype, "copy")?;
        let k = kernels(source::KernelKey::Cast(e, e), "copy", x.dtype)?;
        self.map_one(x, e, "copy", &k.kernels[0])
    }

    /// The (key, index) pairs of `total / m` lines of `m` elements read from `a` (`A[at(kin,
    /// line) + j·sin]`) sorted by [`source::sort`]'s keys kernel and merge passes (`k`: the
    /// element type's sort kernels): `(keys, indices)`, each dense `[lines, m]`.
    fn merge_sorted(
        gpu: &Gpu,
        k: &source::Generated,
        (a, kin, sin): (&Memory, View, i64),
        m: usize,
        total: usize,
        descending: bool,
    ) -> Result<(CudaBuffer, CudaBuffer)> {
        let [_, keys, merge, _] = &k.kernels[..] else {
            return Err(Error::Backend {
                backend: BACKEND,
                msg: "sort: the merge kernels are missing".into(),
            });
        };
        let (n, m64) = (total as i64, m as i64);
        let mut from = (output(gpu, total * 8)?, output(gpu, total * 4)?);
        let mut to = (output(gpu, total * 8)?, output(gpu, total * 4)?);
        gpu.launch(
            &keys.name,
            || keys.clone(),
            Launch::Items(total),
            &[
                Arg::Buf(a),
                Arg::View(kin),
                Arg::I64(sin),
                Arg::Buf(&from.0.mem),
                Arg::Buf(&from.1.mem),
                Arg::I64(m64),
                Arg::I64(n),
                Arg::I32(descending as i32),
            ],
        )?;
        let mut w = 1usize;
        while w < m {
            gpu.launch(
                &merge.name,
                || merge.clone(),
                Launch::Items(total),
                &[
                    Arg::Buf(&from.0.mem),
                    Arg::Buf(&from.1.mem),
                    Arg::Buf(&to.0.mem),
                    Arg::Buf(&to.1.mem),
                    Arg::I64(m64),
                    Arg::I64(n),
                    Arg::I64(w as i64),
                ],
            )?;
            std::mem::swap(&mut from, &mut to);
            w *= 2;
        }
        Ok(from)
    }

    fn data_error(op: &'static str, (code, index): (u32, i64), bound: usize) -> Result<()> {
        match code {
            0 => Ok(()),
            source::error_code::INDEX_OUT_OF_RANGE => {
                Err(Error::IndexOutOfRange { op, index, bound })
            }
            source::error_code::NEGATIVE_POWER => Err(Error::Arithmetic {
                op: "pow",
                msg: "integers to negative integer powers are not allowed",
            }),
            _ => Err(Error::Arithmetic {
                op,
                msg: "integer division by zero",
            }),
        }
    }

    /// Runs a gather-like kernel `(A, va, I0, I1, Y, n, inner, ni, bound, E)`: `a` read
    /// through its view, the indices given as the kernel's two arguments `index` (the
    /// indices and their view, or a scatter-add's sorted keys and positions), checked
    /// against `bound` through the error word.
    fn indexed(
        &self,
        op: &'static str,
        kernel: &KernelSource,
        a: Operand<'_>,
        index: [Arg<'_>; 2],
        n: usize,
        (inner, ni, bound): (usize, usize, usize),
    ) -> Result<CudaBuffer> {
        let (gpu, abuf) = self.gpu_of(&a, op)?;
        let y = output(gpu, n * a.dtype.size_in_bytes())?;
        if n == 0 {
            return Ok(y);
        }
        let [i0, i1] = index;
        let mut word = gpu.error_word.lock().unwrap_or_else(|e| e.into_inner());
        gpu.zero(&mut word)?;
        gpu.launch(
            &kernel.name,
            || kernel.clone(),
            Launch::Items(n),
            &[
                Arg::Buf(&abuf.mem),
                Arg::View(view(a.layout, op)?),
                i0,
                i1,
                Arg::Buf(&y.mem),
                Arg::I64(n as i64),
                Arg::I64(inner as i64),
                Arg::I64(ni as i64),
                Arg::I64(bound as i64),
                Arg::Buf(&word),
            ],
        )?;
        Self::data_error(op, read_error(gpu, &word)?, bound)?;
        Ok(y)
    }

    /// A tensor's indices as the two arguments of [`Cuda::indexed`]'s kernels: its buffer and
    /// its view.
    fn index_args<'a>(indices: &Operand<'a>, op: &'static str) -> Result<[Arg<'a>; 2]> {
        Ok([
            Arg::Buf(&ours(indices, op)?.mem),
            Arg::View(view(indices.layout, op)?),
        ])
    }

    /// `activation(y + bias)` over a dense product `y` of shape `out` (bias along the last
    /// axis) as one elementwise program, each step rounded where the composed ops round:
    /// the fused convolution's and product's epilogue after their GEMM.
    fn bias_activation_epilogue(
        &self,
        op: &'static str,
        y: BufferBox,
        dtype: DType,
        out: &[usize],
        bias: Operand<'_>,
        activation: FusedActivation,
    ) -> Result<BufferBox> {
        let dense = Layout::contiguous(out);
        let mut steps = vec![ElementwiseStep::Binary(BinaryOp::Add, 0, 1)];
        if activation == FusedActivation::Relu {
            steps.push(ElementwiseStep::Unary(UnaryOp::Relu, 2));
        }
        let epilogue = ElementwiseProgram {
            num_inputs: 2,
            outputs: vec![1 + steps.len()],
            steps,
        };
        let mut outputs = self.fused_elementwise(
            &epilogue,
            &[
                Operand {
                    buffer: y.as_ref(),
                    layout: &dense,
                    dtype,
                },
                bias,
            ],
            out,
        )?;
        outputs.pop().ok_or_else(|| Error::Backend {
            backend: BACKEND,
            msg: format!("{op}: the epilogue returned no buffer"),
        })
    }

    /// Copies `x` into the part of `y` that starts at `offset` and steps by `strides` (a
    /// dense output's strides).
    #[allow(clippy::too_many_arguments)]
    fn copy_into(
        &self,
        gpu: &Gpu,
        e: Elem,
        x: &Operand<'_>,
        y: &CudaBuffer,
        strides: &[isize],
        offset: usize,
        op: &'static str,
    ) -> Result<()> {
        let n = x.layout.num_elements();
        if n == 0 {
            return Ok(());
        }
        let a = ours(x, op)?;
        let va = view(x.layout, op)?;
        let vy = view_of(x.layout.shape(), strides, offset, op)?;
        // (A, va, Y, vy, n): `vy` addresses x's shape inside the output.
        let k = kernels(source::KernelKey::CopyInto(e), op, e.dtype())?;
        gpu.launch(
            &k.kernels[0].name,
            || k.kernels[0].clone(),
            Launch::Items(n),
            &[
                Arg::Buf(&a.mem),
                Arg::View(va),
                Arg::Buf(&y.mem),
                Arg::View(vy),
                Arg::I64(n as i64),
            ],
        )
    }

    /// Runs a window kernel `(A, [B,] Y, n_out, Geo)` into a fresh buffer of `n_out` values.
    fn window(
        &self,
        op: &'static str,
        kernel: &KernelSource,
        a: Operand<'_>,
        b: Option<Operand<'_>>,
        n_out: usize,
        g: source::Geo,
    ) -> Result<CudaBuffer> {
        let (gpu, abuf) = self.gpu_of(&a, op)?;
        let bbuf = b.as_ref().map(|b| ours(b, op)).transpose()?;
        let y = output(gpu, n_out * a.dtype.size_in_bytes())?;
        if n_out == 0 {
            return Ok(y);
        }
        let mut args = vec![Arg::Buf(&abuf.mem)];
        if let Some(bbuf) = bbuf {
            args.push(Arg::Buf(&bbuf.mem));
        }
        args.extend([Arg::Buf(&y.mem), Arg::I64(n_out as i64), Arg::Geo(g)]);
        gpu.launch(&kernel.name, || kernel.clone(), Launch::Items(n_out), &args)?;
        Ok(y)
    }

    /// Runs the fused convolution `(A, B, C, vc, Y, n_out, Geo)`: `bias` read through its view.
    #[allow(clippy::too_many_arguments)]
    fn window_with_bias(
        &self,
        op: &'static str,
        kernel: &KernelSource,
        x: Operand<'_>,
        filter: Operand<'_>,
        bias: Operand<'_>,
        n_out: usize,
        g: source::Geo,
    ) -> Result<CudaBuffer> {
        let (gpu, xbuf) = self.gpu_of(&x, op)?;
        let (fbuf, bbuf) = (ours(&filter, op)?, ours(&bias, op)?);
        let y = output(gpu, n_out * x.dtype.size_in_bytes())?;
        if n_out == 0 {
            return Ok(y);
        }
        let args = [
            Arg::Buf(&xbuf.mem),
            Arg::Buf(&fbuf.mem),
            Arg::Buf(&bbuf.mem),
            Arg::View(view(bias.layout, op)?),
            Arg::Buf(&y.mem),
            Arg::I64(n_out as i64),
            Arg::Geo(g),
        ];
        gpu.launch(&kernel.name, || kernel.clone(), Launch::Items(n_out), &args)?;
        Ok(y)
    }

    /// `kept` and `red` views of `x` for a reduction over `axes`.
    fn split_views(
        x: &Operand<'_>,
        axes: &[usize],
        op: &'static str,
    ) -> Result<(View, View, usize)> {
        Self::split_layout(x.layout, axes, op)
    }

    /// [`Cuda::split_views`] of a layout.
    fn split_layout(
        layout: &Layout,
        axes: &[usize],
        op: &'static str,
    ) -> Result<(View, View, usize)> {
        let x = layout;
        let (shape, strides) = (x.shape(), x.strides());
        let pick = |keep: bool| -> (Vec<usize>, Vec<isize>) {
            (0..shape.len())
                .filter(|d| axes.contains(d) != keep)
                .map(|d| (shape[d], strides[d]))
                .unzip()
        };
        let (ks, kst) = pick(true);
        let (rs, rst) = pick(false);
        let m: usize = rs.iter().product();
        Ok((
            view_of(&ks, &kst, x.offset(), op)?,
            view_of(&rs, &rst, 0, op)?,
            m,
        ))
    }

    /// Launches a reduction ([`source::reduce`]'s four kernels, `ks`) of `outputs` outputs
    /// of `m` elements each into `y` by [`reduction_plan`]: `inputs` are the kernels'
    /// arguments before `kept`, `extras` after `Y`; a split reduction's partials (at most
    /// [`reduction_threads`]) go to a temporary.
    fn launch_reduction(
        gpu: &Gpu,
        ks: &[KernelSource],
        inputs: Vec<Arg<'_>>,
        (kept, red, m): (View, View, usize),
        outputs: usize,
        y: &Memory,
        extras: Vec<Arg<'_>>,
    ) -> Result<()> {
        let [rows, blocks, partials, finish] = ks else {
            return Err(Error::Backend {
                backend: BACKEND,
                msg: format!("a reduction has four kernels, this one {}", ks.len()),
            });
        };
        let rank = kept.rank as usize;
        let kept_contiguous = rank > 0 && kept.strides[rank - 1] == 1;
        let mut args = inputs;
        args.extend([Arg::View(kept), Arg::View(red), Arg::I64(m as i64)]);
        match reduction_plan(m, outputs, kept_contiguous, gpu.multiprocessors()) {
            ReductionPlan::Rows => {
                args.push(Arg::Buf(y));
                args.extend(extras);
                args.push(Arg::I64(outputs as i64));
                gpu.launch(&rows.name, || rows.clone(), Launch::Items(outputs), &args)
            }
            ReductionPlan::Blocks => {
                args.push(Arg::Buf(y));
                args.extend(extras);
                gpu.launch(
                    &blocks.name,
                    || blocks.clone(),
                    Launch::Blocks {
                        blocks: outputs as u32,
                        threads: source::REDUCE_BLOCK,
                    },
                    &args,
                )
            }
            ReductionPlan::Split { segments } => {
                // Accumulators are 8 bytes at most (double, 64-bit integers).
                let parts = gpu.alloc(outputs * segments * 8)?;
                args.push(Arg::Buf(&parts));
                args.extend(extras);
                args.extend([Arg::I64(outputs as i64), Arg::I64(segments as i64)]);
                gpu.launch(
                    &partials.name,
                    || partials.clone(),
                    Launch::Items(outputs * segments),
                    &args,
                )?;
                gpu.launch(
                    &finish.name,
                    || finish.clone(),
                    Launch::Blocks {
                        blocks: outputs as u32,
                        threads: source::REDUCE_BLOCK,
                    },
                    &[
                        Arg::Buf(&parts),
                        Arg::I64(outputs as i64),
                        Arg::I64(segments as i64),
                        Arg::I64(m as i64),
                        Arg::Buf(y),
                    ],
                )
            }
        }
    }

    /// The device, element type and views (broadcast to `shape`) of an elementwise
    /// program's inputs: as many as it reads, one float type, one device.
    fn program_operands<'a>(
        &'a self,
        op: &'static str,
        program: &ElementwiseProgram,
        inputs: &[Operand<'_>],
        shape: &[usize],
    ) -> Result<(&'a Gpu, Elem, Vec<View>)> {
        program.check()?;
        let first = inputs.first().ok_or_else(|| Error::Backend {
            backend: BACKEND,
            msg: format!("{op}: a program reads at least one input"),
        })?;
        if inputs.len() != program.num_inputs {
            return Err(Error::Backend {
                backend: BACKEND,
                msg: format!(
                    "{op}: the program reads {} inputs, got {}",
                    program.num_inputs,
                    inputs.len()
                ),
            });
        }
        let (gpu, a) = self.gpu_of(first, op)?;
        let e = float_elem(first.dtype, op)?;
        let mut views = Vec::with_capacity(inputs.len());
        for x in inputs {
            if x.dtype != first.dtype {
                return Err(Error::DTypeMismatch {
                    op,
                    lhs: first.dtype,
                    rhs: x.dtype,
                });
            }
            if ours(x, op)?.ordinal != a.ordinal {
                return Err(Error::Backend {
                    backend: BACKEND,
                    msg: format!("{op}: the inputs are on different GPUs"),
                });
            }
            views.push(view(&x.layout.broadcast_to(op, shape)?, op)?);
        }
        Ok((gpu, e, views))
    }

    /// The launch arguments reading a program's inputs: `X0, v0, X1, v1, ..`.
    fn program_input_args<'a>(inputs: &[Operand<'a>], views: &[View]) -> Result<Vec<Arg<'a>>> {
        let mut args = Vec::with_capacity(2 * inputs.len());
        for (x, &v) in inputs.iter().zip(views) {
            args.push(Arg::Buf(&ours(x, "fused_elementwise")?.mem));
            args.push(Arg::View(v));
        }
        Ok(args)
    }

    /// `x` with `paddings` (before, after) elements of `value` around each axis.
    fn padded(
        &self,
        x: Operand<'_>,
        paddings: &[(usize, usize)],
        value: f64,
    ) -> Result<CudaBuffer> {
        let (gpu, _) = self.gpu_of(&x, "pad")?;
        let e = elem(x.dtype, "pad")?;
        let shape: Vec<usize> = x
            .layout
            .shape()
            .iter()
            .zip(paddings)
            .map(|(&s, &(lo, hi))| s + lo + hi)
            .collect();
        let n: usize = shape.iter().product();
        let y = output(gpu, n * x.dtype.size_in_bytes())?;
        if n == 0 {
            return Ok(y);
        }
        // (Y, n, v)
        let k = kernels(source::KernelKey::Fill(e), "pad", x.dtype)?;
        gpu.launch(
            &k.kernels[0].name,
            || k.kernels[0].clone(),
            Launch::Items(n),
            &[Arg::Buf(&y.mem), Arg::I64(n as i64), Arg::F64(value)],
        )?;
        let strides = ferroflow_tensor::layout::contiguous_strides(&shape);
        let offset: usize = paddings
            .iter()
            .zip(&strides)
            .map(|(&(lo, _), &st)| lo * st as usize)
            .sum();
        self.copy_into(gpu, e, &x, &y, &strides, offset, "pad")?;
        Ok(y)
    }

    /// cuDNN's plan for `op` of window `w` with `filters` output channels on `gpu`,
    /// with its geometry and the rows and columns of zeros to append to the input; `None`
    /// where the backend's own kernels run it.
    fn cudnn_plan(
        gpu: &Gpu,
        op: DnnOp,
        dtype: DType,
        w: &Window2d,
        filters: usize,
    ) -> Option<(Arc<dnn::Plan>, ConvGeometry, [usize; 2])> {
        let (geometry, extra) = ConvGeometry::of(w, filters)?;
        let pooling = matches!(op, DnnOp::Pool(_));
        if pooling && extra != [0, 0] {
            // Appended zeros would enter a window's maximum or mean (padding never does).
            return None;
        }
        let key = DnnKey {
            op,
            dtype,
            tf32: !pooling && dtype == DType::F32 && tensor_float_32_execution_enabled(),
            deterministic: !pooling && dnn::deterministic_ops(),
            autotune: !pooling && dnn::autotune(),
            geometry,
        };
        gpu.dnn_plan(&key).map(|p| (p, geometry, extra))
    }

    /// `x` dense from a byte offset cuDNN may start at (a multiple of 16): its own buffer
    /// where it is, else a dense copy.
    fn dense_aligned<'a>(&self, x: Operand<'a>) -> Result<DenseOperand<'a>> {
        let offset = x.layout.offset() * x.dtype.size_in_bytes();
        if x.layout.is_contiguous() && offset.is_multiple_of(16) {
            return Ok(DenseOperand::Own(ours(&x, "cuDNN")?, offset));
        }
        Ok(DenseOperand::Made(self.dense(x)?))
    }

    /// `x` as cuDNN's input: dense NHWC with `extra` rows and columns of zeros appended
    /// (see `ConvGeometry::of`).
    fn cudnn_input<'a>(&self, x: Operand<'a>, extra: [usize; 2]) -> Result<DenseOperand<'a>> {
        if extra == [0, 0] {
            return self.dense_aligned(x);
        }
        let paddings = [(0, 0), (0, extra[0]), (0, extra[1]), (0, 0)];
        Ok(DenseOperand::Made(self.padded(x, &paddings, 0.0)?))
    }

    /// The filter `[kh, kw, cin, cout]` as cuDNN's dense `[cout, kh, kw, cin]`.
    fn filter_krsc(&self, filter: Operand<'_>) -> Result<CudaBuffer> {
        let layout = filter.layout.permute(&[3, 0, 1, 2])?;
        self.dense(Operand {
            buffer: filter.buffer,
            layout: &layout,
            dtype: filter.dtype,
        })
    }

    /// `conv2d` through cuDNN, or `None` where the backend's own kernels run it.
    fn conv2d_cudnn(
        &self,
        op: &'static str,
        x: Operand<'_>,
        filter: Operand<'_>,
        w: &Window2d,
    ) -> Result<Option<CudaBuffer>> {
        let (gpu, _) = self.gpu_of(&x, op)?;
        let filters = filter.layout.shape()[3];
        let Some((plan, g, extra)) = Self::cudnn_plan(gpu, DnnOp::Conv2d, x.dtype, w, filters)
        else {
            return Ok(None);
        };
        let input = self.cudnn_input(x, extra)?;
        let f = self.filter_krsc(filter)?;
        let size = x.dtype.size_in_bytes();
        let mut y = output(gpu, g.output_dims().iter().product::<usize>() * size)?;
        gpu.run_cudnn(&plan, input.at(), (&f.mem, 0), &mut y.mem)?;
        Ok(Some(y))
    }

    /// Pooling through cuDNN (where TF's padding is alike on both sides), or `None` where
    /// the backend's own kernel runs it. The gradients stay on the backend's kernels:
    /// TF routes a max-pool gradient to the window's first maximum, which cuDNN does not
    /// promise, and cuDNN's backward pass reads the forward's input and output, which the
    /// gradient ops do not have.
    fn pool2d_cudnn(
        &self,
        kind: PoolKind,
        x: Operand<'_>,
        w: &Window2d,
    ) -> Result<Option<CudaBuffer>> {
        let (gpu, _) = self.gpu_of(&x, kind.name())?;
        let Some((plan, g, _)) = Self::cudnn_plan(gpu, DnnOp::Pool(kind), x.dtype, w, w.input[3])
        else {
            return Ok(None);
        };
        let input = self.dense_aligned(x)?;
        let size = x.dtype.size_in_bytes();
        let mut y = output(gpu, g.output_dims().iter().product::<usize>() * size)?;
        // The second operand is not read by pooling.
        gpu.run_cudnn(&plan, input.at(), input.at(), &mut y.mem)?;
        Ok(Some(y))
    }

    /// `conv2d_backprop_input` through cuDNN, or `None` where the backend's own kernels
    /// run it.
    fn conv2d_backprop_input_cudnn(
        &self,
        filter: Operand<'_>,
        dy: Operand<'_>,
        w: &Window2d,
    ) -> Result<Option<CudaBuffer>> {
        let op = "conv2d_backprop_input";
        let (gpu, _) = self.gpu_of(&dy, op)?;
        let filters = filter.layout.shape()[3];
        let Some((plan, g, extra)) =
            Self::cudnn_plan(gpu, DnnOp::Conv2dBackpropInput, dy.dtype, w, filters)
        else {
            return Ok(None);
        };
        let f = self.filter_krsc(filter)?;
        let grad = self.dense_aligned(dy)?;
        let size = dy.dtype.size_in_bytes();
        let mut dx = output(gpu, g.input.iter().product::<usize>() * size)?;
        gpu.run_cudnn(&plan, (&f.mem, 0), grad.at(), &mut dx.mem)?;
        if extra == [0, 0] {
            return Ok(Some(dx));
        }
        // The gradient of the appended zeros is dropped.
        let kept = Layout::contiguous(&g.input).slice_steps(&[0; 4], &w.input, &[1; 4]);
        Ok(Some(self.dense(Operand {
            buffer: &dx,
            layout: &kept,
            dtype: dy.dtype,
        })?))
    }

    /// `conv2d_backprop_filter` through cuDNN, or `None` where the backend's own kernels
    /// run it.
    fn conv2d_backprop_filter_cudnn(
        &self,
        x: Operand<'_>,
        dy: Operand<'_>,
        filter_shape: [usize; 4],
        w: &Window2d,
    ) -> Result<Option<CudaBuffer>> {
        let op = "conv2d_backprop_filter";
        let (gpu, _) = self.gpu_of(&x, op)?;
        let Some((plan, g, extra)) = Self::cudnn_plan(
            gpu,
            DnnOp::Conv2dBackpropFilter,
            x.dtype,
            w,
            filter_shape[3],
        ) else {
            return Ok(None);
        };
        let (input, grad) = (self.cudnn_input(x, extra)?, self.dense_aligned(dy)?);
        let size = x.dtype.size_in_bytes();
        let mut dw = output(gpu, filter_shape.iter().product::<usize>() * size)?;
        gpu.run_cudnn(&plan, input.at(), grad.at(), &mut dw.mem)?;
        // cuDNN's [cout, kh, kw, cin] back to [kh, kw, cin, cout].
        let hwio = Layout::contiguous(&g.filter_dims()).permute(&[1, 2, 3, 0])?;
        Ok(Some(self.dense(Operand {
            buffer: &dw,
            layout: &hwio,
            dtype: x.dtype,
        })?))
    }

    /// The shape `[batch · oh · ow, kh · kw · c]` of a convolution's column matrix
    /// (`source::im2col`; a pointwise window's is its input, no workspace), when its bytes
    /// fit [`convolution_workspace_limit`] (the convolution then runs as a GEMM); `None`
    /// sends it to [`Cuda::images_per_chunk`] and from there to the direct loops.
    fn columns_shape(w: &Window2d, dtype: DType) -> Option<[usize; 2]> {
        let m = w.input[0]
            .checked_mul(w.output[0])?
            .checked_mul(w.output[1])?;
        let k = w.kernel[0]
            .checked_mul(w.kernel[1])?
            .checked_mul(w.input[3])?;
        let bytes = m.checked_mul(k)?.checked_mul(dtype.size_in_bytes())?;
        (bytes > 0 && (Self::pointwise(w) || bytes <= convolution_workspace_limit()))
            .then_some([m, k])
    }

    /// Images per chunk for a convolution whose whole batch's column matrix would pass
    /// [`convolution_workspace_limit`] while one image's fits: the most whose columns fit,
    /// so that the batch runs as GEMMs chunk by chunk ([`Cuda::by_image_chunks`]) and not
    /// as the direct loops (a thread per output looping over the window, or for the filter
    /// gradient over every image's positions). `None` where the whole batch fits or not one
    /// image does.
    fn images_per_chunk(w: &Window2d, dtype: DType) -> Option<usize> {
        let batch = w.input[0];
        if batch < 2 || Self::columns_shape(w, dtype).is_some() {
            return None;
        }
        let [m, k] = Self::columns_shape(&Self::images_of(w, 1), dtype)?;
        let per_image = m * k * dtype.size_in_bytes();
        Some((convolution_workspace_limit() / per_image).clamp(1, batch - 1))
    }

    /// Window `w` over `count` of its images.
    fn images_of(w: &Window2d, count: usize) -> Window2d {
        let mut chunk = w.clone();
        chunk.input[0] = count;
        chunk
    }

    /// Images `start..start + count` (axis 0) of a `[batch, ..]` view.
    fn batch_slice(layout: &Layout, start: usize, count: usize) -> Layout {
        let rank = layout.rank();
        let mut begin = vec![0; rank];
        begin[0] = start;
        let mut len = layout.shape().to_vec();
        len[0] = count;
        layout.slice_steps(&begin, &len, &vec![1; rank])
    }

    /// A convolution op over `w`'s batch, `images` images at a time: `chunk(start, window)`
    /// runs images `start..start + window.input[0]`. Results that stack along the batch
    /// (`stacked: Some([batch, ..])`, a forward output or an input gradient) are each copied
    /// into their place; others (the filter gradient) are summed.
    fn by_image_chunks(
        &self,
        op: &'static str,
        like: &Operand<'_>,
        w: &Window2d,
        images: usize,
        stacked: Option<[usize; 4]>,
        mut chunk: impl FnMut(usize, &Window2d) -> Result<BufferBox>,
    ) -> Result<BufferBox> {
        let (gpu, _) = self.gpu_of(like, op)?;
        let e = float_elem(like.dtype, op)?;
        let batch = w.input[0];
        let stacked_out = stacked
            .map(|shape| {
                let n: usize = shape.iter().product();
                Ok::<_, Error>((shape, output(gpu, n * like.dtype.size_in_bytes())?))
            })
            .transpose()?;
        let mut sum: Option<BufferBox> = None;
        let mut start = 0;
        while start < batch {
            let count = images.min(batch - start);
            let part = chunk(start, &Self::images_of(w, count))?;
            match &stacked_out {
                Some((shape, y)) => {
                    let mut part_shape = *shape;
                    part_shape[0] = count;
                    let per_image: usize = shape[1..].iter().product();
                    self.copy_into(
                        gpu,
                        e,
                        &Operand {
                            buffer: part.as_ref(),
                            layout: &Layout::contiguous(&part_shape),
                            dtype: like.dtype,
                        },
                        y,
                        &ferroflow_tensor::layout::contiguous_strides(shape),
                        start * per_image,
                        op,
                    )?;
                }
                None => {
                    sum = Some(match sum {
                        None => part,
                        Some(acc) => {
                            let layout = Layout::contiguous(&[
                                part.size_in_bytes() / like.dtype.size_in_bytes()
                            ]);
                            let (lhs, rhs) = (
                                Operand {
                                    buffer: acc.as_ref(),
                                    layout: &layout,
                                    dtype: like.dtype,
                                },
                                Operand {
                                    buffer: part.as_ref(),
                                    layout: &layout,
                                    dtype: like.dtype,
                                },
                            );
                            self.binary(BinaryOp::Add, lhs, rhs)?
                        }
                    });
                }
            }
            start += count;
        }
        match (stacked_out, sum) {
            (Some((_, y)), _) => boxed(y),
            (None, Some(sum)) => Ok(sum),
            (None, None) => Err(Error::Backend {
                backend: BACKEND,
                msg: format!("{op}: a chunked convolution over an empty batch"),
            }),
        }
    }

    /// Whether window `w` is pointwise (1×1, stride 1, no padding): its column matrix is the
    /// input itself, `[batch · h · w, c]`, and its input gradient the columns' gradient.
    fn pointwise(w: &Window2d) -> bool {
        w.kernel == [1, 1]
            && w.strides == [1, 1]
            && w.pad_before == [0, 0]
            && w.output == [w.input[1], w.input[2]]
    }

    /// The column matrix `[m, k]` of `x` for window `w`: for a pointwise window a view of
    /// `x` itself where its layout allows (no copy), else made by `source::im2col`; returned
    /// as (the buffer made, if one was, to be kept alive beside the layout; the layout).
    fn columns(
        &self,
        op: &'static str,
        x: Operand<'_>,
        w: &Window2d,
        [m, k]: [usize; 2],
    ) -> Result<(Option<CudaBuffer>, Layout)> {
        if Self::pointwise(w) {
            return self.matrix(&x, [m, k]);
        }
        let e = float_elem(x.dtype, op)?;
        let g = kernels(source::KernelKey::Im2col(e), op, x.dtype)?;
        let cols = self.window(
            op,
            &g.kernels[0],
            x,
            None,
            m * k,
            geo(w, 0, x.layout, None)?,
        )?;
        Ok((Some(cols), Layout::contiguous(&[m, k])))
    }

    /// `x` as a `[rows, cols]` matrix: a view of its own buffer where its layout allows,
    /// else a dense copy (returned, to be kept alive beside the layout).
    fn matrix(&self, x: &Operand<'_>, shape: [usize; 2]) -> Result<(Option<CudaBuffer>, Layout)> {
        match x.layout.reshape(&shape) {
            Some(l) => Ok((None, l)),
            None => Ok((Some(self.dense(*x)?), Layout::contiguous(&shape))),
        }
    }

    /// A float convolution as im2col and one cuBLAS GEMM: `[m, k] · filter[k, cout]`,
    /// dense `[batch, oh, ow, cout]`.
    fn conv2d_gemm(
        &self,
        op: &'static str,
        x: Operand<'_>,
        filter: Operand<'_>,
        w: &Window2d,
        [m, k]: [usize; 2],
    ) -> Result<BufferBox> {
        let cout = filter.layout.shape()[3];
        let (cols, cols_layout) = self.columns(op, x, w, [m, k])?;
        let (dense_f, f_layout) = self.matrix(&filter, [k, cout])?;
        let f_buffer: &dyn DeviceBuffer = match &dense_f {
            Some(d) => d,
            None => filter.buffer,
        };
        self.matmul(
            Operand {
                buffer: cols.as_ref().map_or(x.buffer, |c| c as &dyn DeviceBuffer),
                layout: &cols_layout,
                dtype: x.dtype,
            },
            Operand {
                buffer: f_buffer,
                layout: &f_layout,
                dtype: filter.dtype,
            },
        )
    }

    /// cuBLAS's view of a row-major `[batch.., rows, cols]` operand: (operation, leading
    /// dimension, batch stride, offset), or `None` when it must be made dense first.
    fn gemm_form(layout: &Layout) -> Option<(bool, i64, i64, usize)> {
        let rank = layout.rank();
        let (shape, strides) = (layout.shape(), layout.strides());
        let (r, c) = (shape[rank - 2], shape[rank - 1]);
        let (sr, sc) = (strides[rank - 2], strides[rank - 1]);
        // Row-major (unit column step) reads as the transpose in column-major: no op.
        let rowmajor = (c == 1 || sc == 1) && (r == 1 || sr >= c as isize);
        let colmajor = (r == 1 || sr == 1) && (c == 1 || sc >= r as isize);
        let (transposed, ld) = if rowmajor {
            (false, if r == 1 { c.max(1) as i64 } else { sr as i64 })
        } else if colmajor {
            (true, if c == 1 { r.max(1) as i64 } else { sc as i64 })
        } else {
            return None;
        };
        // The batch axes must step as one (or not at all).
        let mut batch: Vec<(usize, isize)> = shape[..rank - 2]
            .iter()
            .zip(&strides[..rank - 2])
            .filter(|(&s, _)| s != 1)
            .map(|(&s, &st)| (s, st))
            .collect();
        while batch.len() > 1 {
            let (s1, st1) = batch[batch.len() - 1];
            let (_, st0) = batch[batch.len() - 2];
            if st0 != st1 * s1 as isize {
                return None;
            }
            batch.pop();
            let last = batch.len() - 1;
            batch[last] = (batch[last].0 * s1, st1);
        }
        let stride = batch.first().map_or(0, |&(_, st)| st as i64);
        if stride < 0 || ld < 1 {
            return None;
        }
        Some((transposed, ld, stride, layout.offset()))
    }

    /// Integer products: dense operands, the wrapping kernel of `source::matmul_int`.
    fn matmul_int(
        &self,
        gpu: &Gpu,
        lhs: Operand<'_>,
        rhs: Operand<'_>,
        dtype: DType,
    ) -> Result<CudaBuffer> {
        let e = elem(dtype, "matmul")?;
        let k = kernels(source::KernelKey::MatmulInt(e), "matmul", dtype)?;
        let kernel = &k.kernels[0];
        let (la, lb) = (lhs.layout.shape(), rhs.layout.shape());
        let rank = la.len();
        let (m, k, n) = (la[rank - 2], la[rank - 1], lb[rank - 1]);
        let batch: usize = la[..rank - 2].iter().product();
        let total = batch * m * n;
        let y = output(gpu, total * dtype.size_in_bytes())?;
        if total == 0 {
            return Ok(y);
        }
        let (a, b) = (self.dense(lhs)?, self.dense(rhs)?);
        // (A, B, Y, m, k, n, total) over dense [batch, m, k] and [batch, k, n].
        gpu.launch(
            &kernel.name,
            || kernel.clone(),
            Launch::Items(total),
            &[
                Arg::Buf(&a.mem),
                Arg::Buf(&b.mem),
                Arg::Buf(&y.mem),
                Arg::I64(m as i64),
                Arg::I64(k as i64),
                Arg::I64(n as i64),
                Arg::I64(total as i64),
            ],
        )?;
        Ok(y)
    }

    fn matmul_typed<T>(&self, gpu: &Gpu, lhs: Operand<'_>, rhs: Operand<'_>) -> Result<CudaBuffer>
    where
        T: GemmScalar,
        CudaBlas: Gemm<T>,
    {
        let size = std::mem::size_of::<T>();
        let la = lhs.layout.shape();
        let lb = rhs.layout.shape();
        let rank = la.len();
        let (m, k, n) = (la[rank - 2], la[rank - 1], lb[rank - 1]);
        let batch: usize = la[..rank - 2].iter().product();
        // Operands cuBLAS cannot read as they lie are made dense first.
        let dense_a;
        let dense_b;
        let layout_a;
        let layout_b;
        let (a, form_a) = match Self::gemm_form(lhs.layout) {
            Some(f) => (ours(&lhs, "matmul")?, f),
            None => {
                dense_a = self.dense(lhs)?;
                layout_a = Layout::contiguous(la);
                (
                    &dense_a,
                    Self::gemm_form(&layout_a).ok_or_else(|| gemm_refused("lhs"))?,
                )
            }
        };
        let (b, form_b) = match Self::gemm_form(rhs.layout) {
            Some(f) => (ours(&rhs, "matmul")?, f),
            None => {
                dense_b = self.dense(rhs)?;
                layout_b = Layout::contiguous(lb);
                (
                    &dense_b,
                    Self::gemm_form(&layout_b).ok_or_else(|| gemm_refused("rhs"))?,
                )
            }
        };
        let mut y = output(gpu, batch * m * n * size)?;
        if k == 0 {
            // An empty sum: zeros (cuBLAS would scale the uninitialised output by beta = 0,
            // and 0 · NaN is NaN).
            gpu.zero(&mut y.mem)?;
            return Ok(y);
        }
        // Row-major C = A·B is column-major Cᵀ = Bᵀ·Aᵀ: B goes first.
        let call = GemmCall {
            transa: form_b.0,
            transb: form_a.0,
            m: n,
            n: m,
            k,
            lda: form_b.1,
            ldb: form_a.1,
            ldc: n.max(1) as i64,
            stride_a: form_b.2,
            stride_b: form_a.2,
            stride_c: (m * n) as i64,
            batch,
        };
        gpu.gemm::<T>(
            &call,
            (&b.mem, form_b.3 * size),
            (&a.mem, form_a.3 * size),
            &mut y.mem,
        )?;
        Ok(y)
    }
}

/// The element type of a float dtype (the window ops compute in floats only).
fn float_elem(dtype: DType, op: &'static str) -> Result<Elem> {
    match dtype {
        DType::F16 | DType::BF16 | DType::F32 | DType::F64 => elem(dtype, op),
        other => Err(unsupported(BACKEND, op, other)),
    }
}

/// Offset and the four steps of a rank-4 operand.
fn steps4(l: &Layout, op: &'static str) -> Result<[i64; 5]> {
    match l.strides() {
        &[s0, s1, s2, s3] => Ok([
            l.offset() as i64,
            s0 as i64,
            s1 as i64,
            s2 as i64,
            s3 as i64,
        ]),
        other => Err(Error::Backend {
            backend: BACKEND,
            msg: format!(
                "{op}: an operand of rank {} where 4 was expected",
                other.len()
            ),
        }),
    }
}

/// The kernels' geometry of `w`, with the steps of the operands `a` and `b`.
fn geo(w: &Window2d, cout: usize, a: &Layout, b: Option<&Layout>) -> Result<source::Geo> {
    let i = |v: usize| v as i64;
    Ok(source::Geo {
        n: i(w.input[0]),
        h: i(w.input[1]),
        w: i(w.input[2]),
        c: i(w.input[3]),
        kh: i(w.kernel[0]),
        kw: i(w.kernel[1]),
        oh: i(w.output[0]),
        ow: i(w.output[1]),
        sh: i(w.strides[0]),
        sw: i(w.strides[1]),
        dh: i(w.dilations[0]),
        dw: i(w.dilations[1]),
        ph: i(w.pad_before[0]),
        pw: i(w.pad_before[1]),
        cout: i(cout),
        a: steps4(a, "window")?,
        b: match b {
            Some(b) => steps4(b, "window")?,
            None => [0; 5],
        },
    })
}

fn gemm_refused(what: &str) -> Error {
    Error::Backend {
        backend: BACKEND,
        msg: format!("matmul: {what} could not be given to cuBLAS"),
    }
}

impl Backend for Cuda {
    fn name(&self) -> &'static str {
        BACKEND
    }
    fn device_count(&self) -> usize {
        self.gpus.len()
    }
    fn device_description(&self, ordinal: usize) -> String {
        self.gpus
            .get(ordinal)
            .map_or_else(|| BACKEND.to_string(), |g| g.name.clone())
    }
    fn supports_dtype(&self, _ordinal: usize, dtype: DType) -> bool {
        Elem::of(dtype).is_some()
    }
    fn has_fused(&self, _ordinal: usize, kernel: FusedKernel, dtype: DType) -> bool {
        let float = matches!(dtype, DType::F16 | DType::BF16 | DType::F32 | DType::F64);
        match kernel {
            FusedKernel::OptimizerUpdate => matches!(dtype, DType::F32 | DType::F64),
            FusedKernel::FusedConv2d => float,
            // The trait's default: one fused reduction that also stores dx, its rows spread
            // over the GPU by the reductions' split plan.
            FusedKernel::BiasActivationGrad => float,
            // Composed: the pooling gradient's kernel, then the fused reduction above.
            FusedKernel::MaxPoolBiasActivationGrad => false,
            // Composed: the fused convolution's kernel, then the pooling's.
            FusedKernel::FusedConv2dMaxPool => false,
            FusedKernel::ClipScalar => dtype != DType::Bool && Elem::of(dtype).is_some(),
            FusedKernel::Elementwise => float,
            FusedKernel::SparseSoftmaxCrossEntropy => matches!(dtype, DType::F32 | DType::F64),
            FusedKernel::FusedMatMul => float,
            // The trait's default: cuBLAS, then the fused reduction's kernels.
            FusedKernel::FusedMatMulReduce => float,
        }
    }
    fn fused_conv2d(
        &self,
        x: Operand<'_>,
        filter: Operand<'_>,
        bias: Operand<'_>,
        w: &Window2d,
        activation: FusedActivation,
    ) -> Result<BufferBox> {
        let op = "fused_conv2d";
        let e = float_elem(x.dtype, op)?;
        let cout = filter.layout.shape()[3];
        let out = [w.input[0], w.output[0], w.output[1], cout];
        if let Some(y) = self.conv2d_cudnn(op, x, filter, w)? {
            // cuDNN's product, then the bias and the activation as with cuBLAS's.
            return self.bias_activation_epilogue(op, boxed(y)?, x.dtype, &out, bias, activation);
        }
        if let Some(shape) = Self::columns_shape(w, x.dtype) {
            // The GEMM, then the bias and the activation as one elementwise program (each
            // step rounded where the composed ops round).
            let y = self.conv2d_gemm(op, x, filter, w, shape)?;
            return self.bias_activation_epilogue(op, y, x.dtype, &out, bias, activation);
        }
        if let Some(images) = Self::images_per_chunk(w, x.dtype) {
            return self.by_image_chunks(op, &x, w, images, Some(out), |start, cw| {
                let part = Self::batch_slice(x.layout, start, cw.input[0]);
                self.fused_conv2d(Operand { layout: &part, ..x }, filter, bias, cw, activation)
            });
        }
        let n = w.input[0] * w.output[0] * w.output[1] * cout;
        let g = kernels(source::KernelKey::FusedConv2d(e, activation), op, x.dtype)?;
        let geometry = geo(w, cout, x.layout, Some(filter.layout))?;
        boxed(self.window_with_bias(op, &g.kernels[0], x, filter, bias, n, geometry)?)
    }
    /// cuBLAS's product, then the bias and activation as the fused convolution's epilogue.
    fn fused_matmul(
        &self,
        a: Operand<'_>,
        b: Operand<'_>,
        bias: Operand<'_>,
        activation: FusedActivation,
    ) -> Result<BufferBox> {
        let op = "fused_matmul";
        float_elem(a.dtype, op)?;
        let y = self.matmul(a, b)?;
        let (sa, sb) = (a.layout.shape(), b.layout.shape());
        let mut out = sa[..sa.len() - 2].to_vec();
        out.extend([sa[sa.len() - 2], sb[sb.len() - 1]]);
        self.bias_activation_epilogue(op, y, a.dtype, &out, bias, activation)
    }
    fn sparse_softmax_cross_entropy(
        &self,
        logits: Operand<'_>,
        labels: Operand<'_>,
    ) -> Result<(BufferBox, BufferBox)> {
        let op = "sparse_softmax_cross_entropy_with_logits";
        let e = elem(logits.dtype, op)?;
        let ie = elem(labels.dtype, op)?;
        let k = kernels(
            source::KernelKey::SparseSoftmaxXent(e, ie),
            op,
            logits.dtype,
        )?;
        let (gpu, lbuf) = self.gpu_of(&logits, op)?;
        let ibuf = ours(&labels, op)?;
        let classes = logits.layout.shape().last().copied().unwrap_or(0);
        let rows = labels.layout.num_elements();
        let size = logits.dtype.size_in_bytes();
        let loss = output(gpu, rows * size)?;
        let backprop = output(gpu, logits.layout.num_elements() * size)?;
        if rows > 0 && classes > 0 {
            let (va, vb) = (view(logits.layout, op)?, view(labels.layout, op)?);
            let mut word = gpu.error_word.lock().unwrap_or_else(|e| e.into_inner());
            gpu.zero(&mut word)?;
            let (kernel, how) =
                per_output_launch(&k.kernels, rows, classes > source::SOFTMAX_ROW_MAX, op)?;
            gpu.launch(
                &kernel.name,
                || kernel.clone(),
                how,
                &[
                    Arg::Buf(&lbuf.mem),
                    Arg::View(va),
                    Arg::Buf(&ibuf.mem),
                    Arg::View(vb),
                    Arg::Buf(&loss.mem),
                    Arg::Buf(&backprop.mem),
                    Arg::I64(rows as i64),
                    Arg::I64(classes as i64),
                    Arg::Buf(&word),
                ],
            )?;
            Self::data_error(op, read_error(gpu, &word)?, classes)?;
        }
        Ok((boxed(loss)?, boxed(backprop)?))
    }
    fn fused_elementwise(
        &self,
        program: &ElementwiseProgram,
        inputs: &[Operand<'_>],
        shape: &[usize],
    ) -> Result<Vec<BufferBox>> {
        let (gpu, e, views) = self.program_operands("fused_elementwise", program, inputs, shape)?;
        let Some(k) = source::generated_program(program, e, None) else {
            return program.run_op_by_op(self, inputs, shape);
        };
        let kernel = &k.kernels[0];
        let n: usize = shape.iter().product();
        let outputs = program
            .outputs
            .iter()
            .map(|_| output(gpu, n * e.dtype().size_in_bytes()))
            .collect::<Result<Vec<_>>>()?;
        if n > 0 {
            // (X0, v0, .., O0, .., n)
            let mut args = Self::program_input_args(inputs, &views)?;
            args.extend(outputs.iter().map(|o| Arg::Buf(&o.mem)));
            args.push(Arg::I64(n as i64));
            gpu.launch(&kernel.name, || kernel.clone(), Launch::Items(n), &args)?;
        }
        outputs.into_iter().map(boxed).collect()
    }
    fn fused_reduce(
        &self,
        program: &ElementwiseProgram,
        inputs: &[Operand<'_>],
        shape: &[usize],
        op: ReduceOp,
        axes: &[usize],
    ) -> Result<Vec<BufferBox>> {
        let (gpu, e, views) = self.program_operands("fused_reduce", program, inputs, shape)?;
        let Some(k) = source::generated_program(program, e, Some(op)) else {
            // No kernel for the program with this reduction: the program (one kernel if it
            // has one alone, else op by op), then the reduction (or its refusal, naming a
            // reduction this type has none for).
            return ferroflow_tensor::backend::program_then_reduce(
                self, program, inputs, shape, op, axes,
            );
        };
        let dense = Layout::contiguous(shape);
        let (kept, red, m) = Self::split_layout(&dense, axes, "fused_reduce")?;
        let size = e.dtype().size_in_bytes();
        let n: usize = shape.iter().product();
        let kept_count: usize = (0..shape.len())
            .filter(|d| !axes.contains(d))
            .map(|d| shape[d])
            .product();
        let y = output(gpu, kept_count * size)?;
        let extras = (1..program.outputs.len())
            .map(|_| output(gpu, n * size))
            .collect::<Result<Vec<_>>>()?;
        if kept_count > 0 {
            // (X0, v0, .., kept, red, m, Y, O1, ..[, n]); each element of the program's
            // shape is read once, by one output's loop, which also writes the other outputs.
            Self::launch_reduction(
                gpu,
                &k.kernels,
                Self::program_input_args(inputs, &views)?,
                (kept, red, m),
                kept_count,
                &y.mem,
                extras.iter().map(|o| Arg::Buf(&o.mem)).collect(),
            )?;
        }
        std::iter::once(y).chain(extras).map(boxed).collect()
    }
    fn random(
        &self,
        ordinal: usize,
        distribution: &ferroflow_tensor::RandomDistribution,
        n: usize,
        seed: [u64; 2],
        dtype: DType,
    ) -> Option<Result<BufferBox>> {
        use ferroflow_tensor::RandomDistribution::{Normal, TruncatedNormal, Uniform};
        let e = Elem::of(dtype)?;
        // (key, a, b) of the kernel; a truncated normal redraws, which is sequential: the
        // host draws it.
        let (key, a, b) = match *distribution {
            Uniform { minval, maxval } if dtype.is_int() => {
                let lo = minval.ceil();
                (
                    source::KernelKey::RandomUniform(e),
                    lo,
                    (maxval.ceil() - lo).max(1.0),
                )
            }
            Uniform { minval, maxval } => {
                (source::KernelKey::RandomUniform(e), minval, maxval - minval)
            }
            Normal { mean, stddev } => (source::KernelKey::RandomNormal(e), mean, stddev),
            TruncatedNormal { .. } => return None,
        };
        let g = source::generated(key)?;
        let kernel = &g.kernels[0];
        Some((|| {
            let gpu = self.gpu(ordinal)?;
            let y = output(gpu, n * dtype.size_in_bytes())?;
            // (Y, n, s0, s1, a, b): the seed's words bit for bit.
            gpu.launch(
                &kernel.name,
                || kernel.clone(),
                Launch::Items(n),
                &[
                    Arg::Buf(&y.mem),
                    Arg::I64(n as i64),
                    Arg::I64(seed[0] as i64),
                    Arg::I64(seed[1] as i64),
                    Arg::F64(a),
                    Arg::F64(b),
                ],
            )?;
            boxed(y)
        })())
    }
    fn clip_scalar(&self, x: Operand<'_>, min: f64, max: f64) -> Result<BufferBox> {
        let op = "clip_scalar";
        let e = elem(x.dtype, op)?;
        let k = kernels(source::KernelKey::ClipScalar(e), op, x.dtype)?;
        let (gpu, a) = self.gpu_of(&x, op)?;
        let n = x.layout.num_elements();
        let y = output(gpu, n * x.dtype.size_in_bytes())?;
        if n > 0 {
            let kernel = &k.kernels[0];
            // (A, va, Y, n, lo, hi)
            gpu.launch(
                &kernel.name,
                || kernel.clone(),
                Launch::Items(n),
                &[
                    Arg::Buf(&a.mem),
                    Arg::View(view(x.layout, op)?),
                    Arg::Buf(&y.mem),
                    Arg::I64(n as i64),
                    Arg::F64(min),
                    Arg::F64(max),
                ],
            )?;
        }
        boxed(y)
    }
    fn optimizer_update(
        &self,
        rule: &UpdateRule,
        w: Operand<'_>,
        g: Operand<'_>,
        slots: &[Operand<'_>],
    ) -> Result<(BufferBox, Vec<BufferBox>)> {
        let op = "optimizer_update";
        let e = elem(w.dtype, op)?;
        let (kind, p) = source::OptimizerKind::of(rule);
        let k = kernels(source::KernelKey::Optimizer(kind, e), op, w.dtype)?;
        // (The tensor layer checked the slot count, shapes and dtypes.)
        let (gpu, wbuf) = self.gpu_of(&w, op)?;
        let n = w.layout.num_elements();
        let bytes = n * w.dtype.size_in_bytes();
        let y = output(gpu, bytes)?;
        let new_slots = (0..kind.slots())
            .map(|_| output(gpu, bytes))
            .collect::<Result<Vec<_>>>()?;
        if n > 0 {
            let mut args = vec![
                Arg::Buf(&wbuf.mem),
                Arg::View(view(w.layout, op)?),
                Arg::Buf(&ours(&g, op)?.mem),
                Arg::View(view(g.layout, op)?),
            ];
            for s in slots.iter().take(kind.slots()) {
                args.push(Arg::Buf(&ours(s, op)?.mem));
                args.push(Arg::View(view(s.layout, op)?));
            }
            args.push(Arg::Buf(&y.mem));
            args.extend(new_slots.iter().map(|s| Arg::Buf(&s.mem)));
            args.push(Arg::I64(n as i64));
            args.extend(rule_scalars(e, &p));
            let kernel = &k.kernels[0];
            // (W, vw, G, vg, [S0, v0, [S1, v1]], Y, [Z, [K]], n, p0..p4)
            gpu.launch(&kernel.name, || kernel.clone(), Launch::Items(n), &args)?;
        }
        Ok((
            Box::new(y),
            new_slots
                .into_iter()
                .map(|s| Box::new(s) as BufferBox)
                .collect(),
        ))
    }
    /// Dense variables (every operand one contiguous range) in kernels of up to
    /// [`source::OPTIMIZER_GROUP_MAX`]; a variable read through a view, or alone in its
    /// chunk, by [`Backend::optimizer_update`].
    fn optimizer_update_group(
        &self,
        rule: &UpdateRule,
        variables: &[UpdateOperands<'_>],
    ) -> Result<Vec<(BufferBox, Vec<BufferBox>)>> {
        let op = "optimizer_update_group";
        let dense = |v: &UpdateOperands<'_>| {
            [&v.w, &v.g]
                .into_iter()
                .chain(&v.slots)
                .all(|o| o.layout.contiguous_range().is_some())
        };
        let mut updated: Vec<Option<(BufferBox, Vec<BufferBox>)>> =
            variables.iter().map(|_| None).collect();
        let grouped: Vec<usize> = (0..variables.len())
            .filter(|&i| dense(&variables[i]))
            .collect();
        for chunk in grouped.chunks(source::OPTIMIZER_GROUP_MAX) {
            if let [_, _, ..] = chunk {
                let group: Vec<&UpdateOperands<'_>> =
                    chunk.iter().map(|&i| &variables[i]).collect();
                for (&i, u) in chunk
                    .iter()
                    .zip(self.update_in_one_kernel(rule, &group, op)?)
                {
                    updated[i] = Some(u);
                }
            }
        }
        updated
            .into_iter()
            .zip(variables)
            .map(|(u, v)| match u {
                Some(u) => Ok(u),
                None => self.optimizer_update(rule, v.w, v.g, &v.slots),
            })
            .collect()
    }
    fn memory_bytes(&self, ordinal: usize) -> Option<u64> {
        self.gpus.get(ordinal)?.memory().map(|(_, total)| total)
    }
    /// A GPU's free memory; on the host emulation, the host allocator's answer (the tensor
    /// layer may fill the tensor on the host first).
    fn can_allocate(&self, ordinal: usize, bytes: u64) -> bool {
        self.gpus.get(ordinal).is_some_and(|g| match g.memory() {
            Some((free, _)) => bytes <= free,
            None => ferroflow_tensor::device::host_can_allocate(bytes),
        })
    }
    fn synchronize(&self, ordinal: usize) -> Result<()> {
        self.gpu(ordinal)?.synchronize()
    }
    fn upload(&self, ordinal: usize, data: HostData) -> Result<BufferBox> {
        if Elem::of(data.dtype()).is_none() {
            return Err(unsupported(BACKEND, "upload", data.dtype()));
        }
        let gpu = self.gpu(ordinal)?;
        let bytes = data.le_bytes();
        boxed(CudaBuffer {
            mem: gpu.upload(&bytes)?,
            bytes: bytes.len(),
            ordinal,
        })
    }
    fn download(&self, x: Operand<'_>) -> Result<HostData> {
        let (gpu, _) = self.gpu_of(&x, "download")?;
        let size = x.dtype.size_in_bytes();
        let n = x.layout.num_elements();
        if n == 0 {
            return HostData::from_le_bytes(x.dtype, &[])
                .ok_or_else(|| unsupported(BACKEND, "download", x.dtype));
        }
        let dense;
        let (buf, start) = if x.layout.is_contiguous() {
            (ours(&x, "download")?, x.layout.offset())
        } else {
            dense = self.dense(x)?;
            (&dense, 0)
        };
        let bytes = gpu.download(&buf.mem, start * size..(start + n) * size)?;
        HostData::from_le_bytes(x.dtype, &bytes).ok_or_else(|| Error::Backend {
            backend: BACKEND,
            msg: "download: the bytes do not fill whole elements".into(),
        })
    }
    fn copy(&self, x: Operand<'_>) -> Result<BufferBox> {
        boxed(self.dense(x)?)
    }
    fn unary(&self, op: UnaryOp, x: Operand<'_>) -> Result<BufferBox> {
        let e = elem(x.dtype, op.name())?;
        let out = elem(op.output_dtype(x.dtype), op.name())?;
        let k = kernels(source::KernelKey::Unary(op, e, out), op.name(), x.dtype)?;
        boxed(self.map_one(x, out, op.name(), &k.kernels[0])?)
    }
    fn binary(&self, op: BinaryOp, lhs: Operand<'_>, rhs: Operand<'_>) -> Result<BufferBox> {
        let e = elem(lhs.dtype, op.name())?;
        let out = elem(op.output_dtype(lhs.dtype), op.name())?;
        let k = kernels(source::KernelKey::Binary(op, e, out), op.name(), lhs.dtype)?;
        let (kernel, checked) = (&k.kernels[0], k.checked);
        let (gpu, a) = self.gpu_of(&lhs, op.name())?;
        let b = ours(&rhs, op.name())?;
        let n = lhs.layout.num_elements();
        let y = output(gpu, n * out.dtype().size_in_bytes())?;
        if n == 0 {
            return boxed(y);
        }
        let (va, vb) = (view(lhs.layout, op.name())?, view(rhs.layout, op.name())?);
        // (A, View, B, View, Y, n[, E]): both views have the output's shape (broadcast by
        // the tensor layer); only checked kernels (integer division, powers) take the error
        // word, and only they hold its lock.
        let args = [
            Arg::Buf(&a.mem),
            Arg::View(va),
            Arg::Buf(&b.mem),
            Arg::View(vb),
            Arg::Buf(&y.mem),
            Arg::I64(n as i64),
        ];
        if !checked {
            gpu.launch(&kernel.name, || kernel.clone(), Launch::Items(n), &args)?;
            return boxed(y);
        }
        let mut word = gpu.error_word.lock().unwrap_or_else(|e| e.into_inner());
        gpu.zero(&mut word)?;
        let mut checked_args = args.to_vec();
        checked_args.push(Arg::Buf(&word));
        gpu.launch(
            &kernel.name,
            || kernel.clone(),
            Launch::Items(n),
            &checked_args,
        )?;
        Self::data_error(op.name(), read_error(gpu, &word)?, 0)?;
        boxed(y)
    }
    fn reduce(&self, op: ReduceOp, x: Operand<'_>, axes: &[usize]) -> Result<BufferBox> {
        let e = elem(x.dtype, op.name())?;
        let k = kernels(source::KernelKey::Reduce(op, e), op.name(), x.dtype)?;
        let (gpu, a) = self.gpu_of(&x, op.name())?;
        let (kept, red, m) = Self::split_views(&x, axes, op.name())?;
        let outputs: usize = (0..x.layout.rank())
            .filter(|d| !axes.contains(d))
            .map(|d| x.layout.shape()[d])
            .product();
        let y = output(gpu, outputs * x.dtype.size_in_bytes())?;
        if outputs == 0 {
            return boxed(y);
        }
        // (A, kept, red, m, Y[, n])
        Self::launch_reduction(
            gpu,
            &k.kernels,
            vec![Arg::Buf(&a.mem)],
            (kept, red, m),
            outputs,
            &y.mem,
            vec![],
        )?;
        boxed(y)
    }
    fn arg_reduce(&self, op: ArgReduceOp, x: Operand<'_>, axis: usize) -> Result<BufferBox> {
        let e = elem(x.dtype, op.name())?;
        let k = kernels(source::KernelKey::ArgReduce(op, e), op.name(), x.dtype)?;
        let (gpu, a) = self.gpu_of(&x, op.name())?;
        let (kept, _, m) = Self::split_views(&x, &[axis], op.name())?;
        let stride = x.layout.strides()[axis] as i64;
        let outputs = x.layout.num_elements() / m.max(1);
        let y = output(gpu, outputs * 8)?;
        if outputs == 0 || m == 0 {
            return boxed(y);
        }
        let (kernel, how) = per_output_launch(
            &k.kernels,
            outputs,
            m > source::ARG_REDUCE_ROW_MAX,
            op.name(),
        )?;
        // (A, kept, stride, m, Y, n)
        gpu.launch(
            &kernel.name,
            || kernel.clone(),
            how,
            &[
                Arg::Buf(&a.mem),
                Arg::View(kept),
                Arg::I64(stride),
                Arg::I64(m as i64),
                Arg::Buf(&y.mem),
                Arg::I64(outputs as i64),
            ],
        )?;
        boxed(y)
    }
    fn cast(&self, x: Operand<'_>, to: DType) -> Result<BufferBox> {
        let from = elem(x.dtype, "cast")?;
        let to = elem(to, "cast")?;
        let k = kernels(source::KernelKey::Cast(from, to), "cast", x.dtype)?;
        boxed(self.map_one(x, to, "cast", &k.kernels[0])?)
    }
    fn matmul(&self, lhs: Operand<'_>, rhs: Operand<'_>) -> Result<BufferBox> {
        let (gpu, _) = self.gpu_of(&lhs, "matmul")?;
        boxed(match lhs.dtype {
            DType::F32 => self.matmul_typed::<f32>(gpu, lhs, rhs)?,
            DType::F64 => self.matmul_typed::<f64>(gpu, lhs, rhs)?,
            DType::F16 => self.matmul_typed::<half::f16>(gpu, lhs, rhs)?,
            DType::BF16 => self.matmul_typed::<half::bf16>(gpu, lhs, rhs)?,
            other => self.matmul_int(gpu, lhs, rhs, other)?,
        })
    }
    fn select(
        &self,
        cond: Operand<'_>,
        on_true: Operand<'_>,
        on_false: Operand<'_>,
    ) -> Result<BufferBox> {
        let e = elem(on_true.dtype, "select")?;
        let (gpu, c) = self.gpu_of(&cond, "select")?;
        let (a, b) = (ours(&on_true, "select")?, ours(&on_false, "select")?);
        let n = on_true.layout.num_elements();
        let y = output(gpu, n * e.dtype().size_in_bytes())?;
        if n == 0 {
            return boxed(y);
        }
        let (vc, va, vb) = (
            view(cond.layout, "select")?,
            view(on_true.layout, "select")?,
            view(on_false.layout, "select")?,
        );
        // (C, View, A, View, B, View, Y, n): the three views have the output's shape.
        let k = kernels(source::KernelKey::Select(e), "select", on_true.dtype)?;
        gpu.launch(
            &k.kernels[0].name,
            || k.kernels[0].clone(),
            Launch::Items(n),
            &[
                Arg::Buf(&c.mem),
                Arg::View(vc),
                Arg::Buf(&a.mem),
                Arg::View(va),
                Arg::Buf(&b.mem),
                Arg::View(vb),
                Arg::Buf(&y.mem),
                Arg::I64(n as i64),
            ],
        )?;
        boxed(y)
    }
    fn gather(&self, x: Operand<'_>, indices: Operand<'_>, axis: usize) -> Result<BufferBox> {
        let shape = x.layout.shape();
        let inner: usize = shape[axis + 1..].iter().product();
        let outer: usize = shape[..axis].iter().product();
        let ni = indices.layout.num_elements();
        let e = elem(x.dtype, "gather")?;
        let ie = elem(indices.dtype, "gather")?;
        let k = kernels(source::KernelKey::Gather(e, ie), "gather", indices.dtype)?;
        boxed(self.indexed(
            "gather",
            &k.kernels[0],
            x,
            Self::index_args(&indices, "gather")?,
            outer * ni * inner,
            (inner, ni, shape[axis]),
        )?)
    }
    fn scatter_add(
        &self,
        indices: Operand<'_>,
        updates: Operand<'_>,
        shape: &[usize],
        axis: usize,
    ) -> Result<BufferBox> {
        let inner: usize = shape[axis + 1..].iter().product();
        let n: usize = shape.iter().product();
        let ni = indices.layout.num_elements();
        let e = elem(updates.dtype, "scatter_add")?;
        let ie = elem(indices.dtype, "scatter_add")?;
        let k = kernels(
            source::KernelKey::ScatterAdd(e, ie),
            "scatter_add",
            updates.dtype,
        )?;
        let bound = shape[axis];
        // Few indices, or more than the sort's int32 positions reach, are scanned.
        if ni <= source::SCATTER_SCAN_MAX || ni > i32::MAX as usize || n == 0 {
            return boxed(self.indexed(
                "scatter_add",
                &k.kernels[0],
                updates,
                Self::index_args(&indices, "scatter_add")?,
                n,
                (inner, ni, bound),
            )?);
        }
        // Many indices: sorted (stable) with their positions, then each output sums its
        // row's run, found by a binary search.
        let op = "scatter_add";
        let sorted = k.kernels.get(1).ok_or_else(|| Error::Backend {
            backend: BACKEND,
            msg: format!("{op}: the sorted kernel is missing"),
        })?;
        let ibuf = ours(&indices, op)?;
        // The indices as one line: in place where their view steps as one axis.
        let line = view(indices.layout, op)?;
        let dense;
        let (imem, kin, sin) = if line.rank <= 1 {
            let step = if line.rank == 1 { line.strides[0] } else { 0 };
            let at = view_of(&[], &[], line.offset as usize, op)?;
            (&ibuf.mem, at, step)
        } else {
            dense = self.dense(indices)?;
            (&dense.mem, view_of(&[], &[], 0, op)?, 1)
        };
        let sort_kernels = kernels(source::KernelKey::Sort(ie), op, indices.dtype)?;
        let (gpu, _) = self.gpu_of(&updates, op)?;
        let (keys, order) =
            Self::merge_sorted(gpu, &sort_kernels, (imem, kin, sin), ni, ni, false)?;
        boxed(self.indexed(
            op,
            sorted,
            updates,
            [Arg::Buf(&keys.mem), Arg::Buf(&order.mem)],
            n,
            (inner, ni, bound),
        )?)
    }
    fn concat(&self, inputs: &[Operand<'_>], axis: usize) -> Result<BufferBox> {
        let first = inputs.first().ok_or_else(|| Error::Backend {
            backend: BACKEND,
            msg: "concat: no inputs".into(),
        })?;
        let (gpu, _) = self.gpu_of(first, "concat")?;
        let e = elem(first.dtype, "concat")?;
        let mut shape = first.layout.shape().to_vec();
        shape[axis] = inputs.iter().map(|x| x.layout.shape()[axis]).sum();
        let strides = ferroflow_tensor::layout::contiguous_strides(&shape);
        let y = output(
            gpu,
            shape.iter().product::<usize>() * first.dtype.size_in_bytes(),
        )?;
        let mut start = 0usize;
        for x in inputs {
            let offset = start * strides[axis] as usize;
            start += x.layout.shape()[axis];
            self.copy_into(gpu, e, x, &y, &strides, offset, "concat")?;
        }
        boxed(y)
    }
    fn pad(&self, x: Operand<'_>, paddings: &[(usize, usize)], value: f64) -> Result<BufferBox> {
        boxed(self.padded(x, paddings, value)?)
    }
    fn cumulative(
        &self,
        op: CumulativeOp,
        x: Operand<'_>,
        axis: usize,
        exclusive: bool,
        reverse: bool,
    ) -> Result<BufferBox> {
        if x.layout.shape()[axis] > ferroflow_tensor::backend::SCAN_LINE_MAX
            && x.layout.num_elements() > 0
        {
            // A long line in chunks, not one thread's walk down it.
            return ferroflow_tensor::backend::chunked_cumulative(
                self, op, x, axis, exclusive, reverse,
            );
        }
        let (gpu, a) = self.gpu_of(&x, op.name())?;
        let e = elem(x.dtype, op.name())?;
        let k = kernels(source::KernelKey::Cumulative(op, e), op.name(), x.dtype)?;
        let kernel = &k.kernels[0];
        let shape = x.layout.shape();
        let total = x.layout.num_elements();
        let y = output(gpu, total * x.dtype.size_in_bytes())?;
        let m = shape[axis];
        if total == 0 {
            return boxed(y);
        }
        let (kin, sin, kout, sout) = line_views(&x, axis, op.name())?;
        let lines = total / m;
        // (A, kin, sin, Y, kout, sout, m, n, exclusive, reverse): line l reads m elements of
        // `a` along the axis and writes m of `y`.
        gpu.launch(
            &kernel.name,
            || kernel.clone(),
            Launch::Items(lines),
            &[
                Arg::Buf(&a.mem),
                Arg::View(kin),
                Arg::I64(sin),
                Arg::Buf(&y.mem),
                Arg::View(kout),
                Arg::I64(sout),
                Arg::I64(m as i64),
                Arg::I64(lines as i64),
                Arg::I32(exclusive as i32),
                Arg::I32(reverse as i32),
            ],
        )?;
        boxed(y)
    }
    fn sort(
        &self,
        x: Operand<'_>,
        axis: usize,
        descending: bool,
    ) -> Result<(BufferBox, BufferBox)> {
        let (gpu, a) = self.gpu_of(&x, "sort")?;
        let e = elem(x.dtype, "sort")?;
        let k = kernels(source::KernelKey::Sort(e), "sort", x.dtype)?;
        let shape = x.layout.shape();
        let total = x.layout.num_elements();
        let y = output(gpu, total * x.dtype.size_in_bytes())?;
        let idx = output(gpu, total * 4)?;
        let m = shape[axis];
        if total == 0 {
            return Ok((Box::new(y), Box::new(idx)));
        }
        let (kin, sin, kout, sout) = line_views(&x, axis, "sort")?;
        // Short lines: each element placed at its rank within its line. Long ones: keys
        // and indices merge-sorted in scratch, then the values placed in that order.
        let merged = if m > source::SORT_RANK_MAX {
            Some(Self::merge_sorted(gpu, &k, (&a.mem, kin, sin), m, total, descending)?.1)
        } else {
            None
        };
        let (kernel, last) = match &merged {
            None => (&k.kernels[0], Arg::I32(descending as i32)),
            Some(order) => (&k.kernels[3], Arg::Buf(&order.mem)),
        };
        // (A, kin, sin, Y, I, kout, sout, m, n, descending | P): every element written once.
        gpu.launch(
            &kernel.name,
            || kernel.clone(),
            Launch::Items(total),
            &[
                Arg::Buf(&a.mem),
                Arg::View(kin),
                Arg::I64(sin),
                Arg::Buf(&y.mem),
                Arg::Buf(&idx.mem),
                Arg::View(kout),
                Arg::I64(sout),
                Arg::I64(m as i64),
                Arg::I64(total as i64),
                last,
            ],
        )?;
        Ok((Box::new(y), Box::new(idx)))
    }
    fn conv2d(&self, x: Operand<'_>, filter: Operand<'_>, w: &Window2d) -> Result<BufferBox> {
        let e = float_elem(x.dtype, "conv2d")?;
        if let Some(y) = self.conv2d_cudnn("conv2d", x, filter, w)? {
            return boxed(y);
        }
        if let Some(shape) = Self::columns_shape(w, x.dtype) {
            return self.conv2d_gemm("conv2d", x, filter, w, shape);
        }
        let cout = filter.layout.shape()[3];
        if let Some(images) = Self::images_per_chunk(w, x.dtype) {
            let out = [w.input[0], w.output[0], w.output[1], cout];
            return self.by_image_chunks("conv2d", &x, w, images, Some(out), |start, cw| {
                let part = Self::batch_slice(x.layout, start, cw.input[0]);
                self.conv2d(Operand { layout: &part, ..x }, filter, cw)
            });
        }
        let n = w.input[0] * w.output[0] * w.output[1] * cout;
        let g = kernels(source::KernelKey::Conv2d(e), "conv2d", x.dtype)?;
        let k = &g.kernels[0];
        boxed(self.window(
            "conv2d",
            k,
            x,
            Some(filter),
            n,
            geo(w, cout, x.layout, Some(filter.layout))?,
        )?)
    }
    fn conv2d_backprop_input(
        &self,
        filter: Operand<'_>,
        dy: Operand<'_>,
        w: &Window2d,
    ) -> Result<BufferBox> {
        let op = "conv2d_backprop_input";
        let e = float_elem(dy.dtype, op)?;
        if let Some(dx) = self.conv2d_backprop_input_cudnn(filter, dy, w)? {
            return boxed(dx);
        }
        let cout = filter.layout.shape()[3];
        if let Some([m, k]) = Self::columns_shape(w, dy.dtype) {
            // The columns' gradient dy[m, cout] · filterᵀ[cout, k], then each input element
            // sums the entries of the windows covering it.
            let (dense_f, f_layout) = self.matrix(&filter, [k, cout])?;
            let (dense_dy, dy_layout) = self.matrix(&dy, [m, cout])?;
            let f_t = f_layout.permute(&[1, 0])?;
            let dcols = self.matmul(
                Operand {
                    buffer: dense_dy
                        .as_ref()
                        .map_or(dy.buffer, |d| d as &dyn DeviceBuffer),
                    layout: &dy_layout,
                    dtype: dy.dtype,
                },
                Operand {
                    buffer: dense_f
                        .as_ref()
                        .map_or(filter.buffer, |d| d as &dyn DeviceBuffer),
                    layout: &f_t,
                    dtype: filter.dtype,
                },
            )?;
            if Self::pointwise(w) {
                // Each input element is in one window: the columns' gradient is the input's.
                return Ok(dcols);
            }
            let g = kernels(source::KernelKey::Col2im(e), op, dy.dtype)?;
            let input = Layout::contiguous(&w.input);
            return boxed(self.window(
                op,
                &g.kernels[0],
                Operand {
                    buffer: dcols.as_ref(),
                    layout: &Layout::contiguous(&[m, k]),
                    dtype: dy.dtype,
                },
                None,
                w.input.iter().product(),
                geo(w, cout, &input, None)?,
            )?);
        }
        if let Some(images) = Self::images_per_chunk(w, dy.dtype) {
            return self.by_image_chunks(op, &dy, w, images, Some(w.input), |start, cw| {
                let part = Self::batch_slice(dy.layout, start, cw.input[0]);
                self.conv2d_backprop_input(
                    filter,
                    Operand {
                        layout: &part,
                        ..dy
                    },
                    cw,
                )
            });
        }
        let n = w.input.iter().product();
        let g = kernels(source::KernelKey::Conv2dBackpropInput(e), op, dy.dtype)?;
        let k = &g.kernels[0];
        boxed(self.window(
            op,
            k,
            filter,
            Some(dy),
            n,
            geo(w, cout, filter.layout, Some(dy.layout))?,
        )?)
    }
    fn conv2d_backprop_filter(
        &self,
        x: Operand<'_>,
        dy: Operand<'_>,
        filter_shape: [usize; 4],
        w: &Window2d,
    ) -> Result<BufferBox> {
        let op = "conv2d_backprop_filter";
        let e = float_elem(x.dtype, op)?;
        if let Some(dw) = self.conv2d_backprop_filter_cudnn(x, dy, filter_shape, w)? {
            return boxed(dw);
        }
        if let Some([m, k]) = Self::columns_shape(w, x.dtype) {
            // columnsᵀ[k, m] · dy[m, cout]: the filter gradient as [kh · kw · c, cout].
            let cout = filter_shape[3];
            let (cols, cols_layout) = self.columns(op, x, w, [m, k])?;
            let cols_t = cols_layout.permute(&[1, 0])?;
            let (dense_dy, dy_layout) = self.matrix(&dy, [m, cout])?;
            return self.matmul(
                Operand {
                    buffer: cols.as_ref().map_or(x.buffer, |c| c as &dyn DeviceBuffer),
                    layout: &cols_t,
                    dtype: x.dtype,
                },
                Operand {
                    buffer: dense_dy
                        .as_ref()
                        .map_or(dy.buffer, |d| d as &dyn DeviceBuffer),
                    layout: &dy_layout,
                    dtype: dy.dtype,
                },
            );
        }
        if let Some(images) = Self::images_per_chunk(w, x.dtype) {
            // The filter gradient is a sum over the batch: the chunks' gradients summed.
            return self.by_image_chunks(op, &x, w, images, None, |start, cw| {
                let count = cw.input[0];
                let (xs, dys) = (
                    Self::batch_slice(x.layout, start, count),
                    Self::batch_slice(dy.layout, start, count),
                );
                self.conv2d_backprop_filter(
                    Operand { layout: &xs, ..x },
                    Operand { layout: &dys, ..dy },
                    filter_shape,
                    cw,
                )
            });
        }
        let n = filter_shape.iter().product();
        let g = kernels(source::KernelKey::Conv2dBackpropFilter(e), op, x.dtype)?;
        let k = &g.kernels[0];
        boxed(self.window(
            op,
            k,
            x,
            Some(dy),
            n,
            geo(w, filter_shape[3], x.layout, Some(dy.layout))?,
        )?)
    }
    fn pool2d(&self, kind: PoolKind, x: Operand<'_>, w: &Window2d) -> Result<BufferBox> {
        let e = float_elem(x.dtype, kind.name())?;
        if let Some(y) = self.pool2d_cudnn(kind, x, w)? {
            return boxed(y);
        }
        let n = w.input[0] * w.output[0] * w.output[1] * w.input[3];
        let g = kernels(source::KernelKey::Pool(kind, e), kind.name(), x.dtype)?;
        let k = &g.kernels[0];
        boxed(self.window(kind.name(), k, x, None, n, geo(w, 0, x.layout, None)?)?)
    }
    fn max_pool_grad(&self, x: Operand<'_>, dy: Operand<'_>, w: &Window2d) -> Result<BufferBox> {
        let op = "max_pool_grad";
        let e = float_elem(x.dtype, op)?;
        let n = w.input.iter().product();
        let g = kernels(source::KernelKey::MaxPoolGrad(e), op, x.dtype)?;
        let k = &g.kernels[0];
        boxed(self.window(op, k, x, Some(dy), n, geo(w, 0, x.layout, Some(dy.layout))?)?)
    }
    fn avg_pool_grad(&self, dy: Operand<'_>, w: &Window2d) -> Result<BufferBox> {
        let op = "avg_pool_grad";
        let e = float_elem(dy.dtype, op)?;
        let n = w.input.iter().product();
        let g = kernels(source::KernelKey::AvgPoolGrad(e), op, dy.dtype)?;
        let k = &g.kernels[0];
        boxed(self.window(op, k, dy, None, n, geo(w, 0, dy.layout, None)?)?)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reductions_pick_their_plan_from_the_shapes() {
        use ReductionPlan::*;
        const H200: Option<usize> = Some(132);
        const HOST: Option<usize> = None;
        // Short, or too many outputs: a thread each.
        assert_eq!(reduction_plan(64, 32, true, H200), Rows);
        assert_eq!(reduction_plan(1000, (1 << 20) + 1, false, H200), Rows);
        // Batch norm's moments (32 channels along the contiguous axis) and a full sum: split.
        assert_eq!(
            reduction_plan(262_144, 32, true, H200),
            Split { segments: 4096 }
        );
        assert_eq!(
            reduction_plan(1 << 20, 1, false, H200),
            Split { segments: 32_768 }
        );
        // Rows along the contiguous axis, many of them: a block each; few: split.
        assert_eq!(reduction_plan(1000, 300, false, H200), Blocks);
        assert_eq!(reduction_plan(1000, 3, false, H200), Split { segments: 31 });
        // Many outputs along the contiguous axis: one segment each, a thread each.
        assert_eq!(reduction_plan(256, 100_000, true, H200), Rows);
        // The emulation: blocks for 2 or 3 outputs, a thread each beyond.
        assert_eq!(reduction_plan(1000, 3, false, HOST), Blocks);
        assert_eq!(reduction_plan(1000, 1, false, HOST), Split { segments: 31 });
        assert_eq!(reduction_plan(1000, 4, false, HOST), Rows);
        // The thresholds follow the multiprocessors: 300 rows are not enough blocks for
        // 256 of them (split instead), and half the multiprocessors split a long sum in
        // half as many segments.
        assert_eq!(reduction_threads(H200), 1 << 17);
        assert_eq!(
            reduction_plan(1000, 300, false, Some(256)),
            Split { segments: 31 }
        );
        assert_eq!(
            reduction_plan(1 << 22, 1, false, H200),
            Split { segments: 131_072 }
        );
        assert_eq!(
            reduction_plan(1 << 22, 1, false, Some(66)),
            Split { segments: 65_536 }
        );
    }

    #[test]
    fn views_merge_axes_that_step_as_one_and_drop_unit_axes() {
        // [2, 3, 4] row-major is one axis of 24.
        let v = view_of(&[2, 3, 4], &[12, 4, 1], 5, "t").expect("a view");
        assert_eq!((v.rank, v.shape[0], v.strides[0], v.offset), (1, 24, 1, 5));
        // A transpose does not merge.
        let v = view_of(&[3, 2], &[1, 3], 0, "t").expect("a view");
        assert_eq!(
            (v.rank, &v.shape[..2], &v.strides[..2]),
            (2, &[3, 2][..], &[1, 3][..])
        );
        // Broadcast axes merge with each other (both zero steps), unit axes vanish.
        let v = view_of(&[4, 1, 5, 6], &[0, 7, 0, 0], 0, "t").expect("a view");
        assert_eq!((v.rank, v.shape[0], v.strides[0]), (1, 120, 0));
        // Index arithmetic in 32 bits below 2^32 elements, in 64 above.
        assert_eq!(view_of(&[3, 2], &[1, 3], 0, "t").expect("a view").narrow, 1);
        let huge = view_of(&[1 << 20, 1 << 13], &[0, 1], 0, "t").expect("a view");
        assert_eq!((huge.rank, huge.narrow), (2, 0));
        // Nine axes that cannot merge are refused with the fix.
        let shape = [2usize; 9];
        let strides: Vec<isize> = (0..9).map(|i| 3isize.pow(8 - i as u32)).collect();
        let e = view_of(&shape, &strides, 0, "t").expect_err("too deep");
        assert!(e.to_string().contains("make it contiguous first"), "{e}");
    }

    #[test]
    fn gemm_forms() {
        // Row-major [2, 3, 4] batch: no transpose, ld 4, batch stride 12.
        let l = Layout::contiguous(&[2, 3, 4]);
        assert_eq!(Cuda::gemm_form(&l), Some((false, 4, 12, 0)));
        // Its transpose [2, 4, 3] (strides 12, 1, 4): transposed, ld 4.
        let t = Layout::new(vec![2, 4, 3], vec![12, 1, 4], 0);
        assert_eq!(Cuda::gemm_form(&t), Some((true, 4, 12, 0)));
        // A broadcast batch steps by 0.
        let b = Layout::new(vec![5, 3, 4], vec![0, 4, 1], 0);
        assert_eq!(Cuda::gemm_form(&b), Some((false, 4, 0, 0)));
        // Two batch axes that do not step as one: made dense first.
        let odd = Layout::new(vec![2, 2, 3, 4], vec![100, 12, 4, 1], 0);
        assert_eq!(Cuda::gemm_form(&odd), None);
        // A reversed axis: made dense first.
        let rev = Layout::new(vec![3, 4], vec![-4, 1], 8);
        assert_eq!(Cuda::gemm_form(&rev), None);
    }
}
