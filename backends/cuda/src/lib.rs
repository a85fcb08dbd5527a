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
//! stream-ordered pool (no `cudaMalloc` per op); every op runs in order on the device's
//! stream and the host waits only where it reads a value. Every kernel source compiles with
//! NVRTC for sm_80 and sm_90 and `ptxas` accepts it (the `nvrtc` test, run by CI with
//! NVIDIA's wheels). The optional fused kernels are composed from the primitives, the
//! convolutions are direct loops (no cuDNN, no implicit GEMM yet), and **no run on a real
//! GPU has checked these kernels yet** (`tests/conformance.rs` does, with
//! `FERROFLOW_REQUIRE_CUDA=1`; `cargo xtask gpu` runs it): so `ferroflow::init()` does not
//! register this backend; call [`register`] to use it.
//!
//! ```
//! // Without NVIDIA's driver this registers nothing and returns 0.
//! let gpus = ferroflow_cuda::register();
//! assert!(gpus == ferroflow_cuda::devices().len());
//! ```

pub mod compile;
pub mod source;

use std::collections::HashMap;
use std::sync::{Arc, Mutex, OnceLock};

use cudarc::cublas::{CudaBlas, Gemm, GemmConfig, StridedBatchedConfig};
use cudarc::driver::{
    CudaContext, CudaFunction, CudaSlice, CudaStream, DriverError, LaunchConfig, PushKernelArg,
};
use ferroflow_tensor::backend::{unsupported, BufferBox, DeviceBuffer, Operand};
use ferroflow_tensor::{
    ArgReduceOp, Backend, BinaryOp, CumulativeOp, DType, DeviceKind, Error, HostData, Layout,
    PoolKind, ReduceOp, Result, UnaryOp, Window2d,
};

pub use compile::{compile_ptx, missing_libraries, nvrtc_available, LIBRARIES};
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

/// Threads per block of the elementwise kernels.
const THREADS: u32 = 256;

/// Device memory of one CUDA device.
pub struct CudaBuffer {
    /// At least one byte (CUDA does not allocate zero).
    data: CudaSlice<u8>,
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

/// One CUDA device: its context, the stream every op runs on in order, the compiled kernels.
struct Gpu {
    ordinal: usize,
    name: String,
    /// `compute_XY` for NVRTC.
    arch: &'static str,
    /// Compute capability ≥ 8.0 (TensorFloat-32 tensor cores).
    has_tf32: bool,
    ctx: Arc<CudaContext>,
    stream: Arc<CudaStream>,
    blas: CudaBlas,
    functions: Mutex<HashMap<String, CudaFunction>>,
    /// The data-error word of checked kernels (one at a time: the lock).
    error_word: Mutex<CudaSlice<u32>>,
}

fn driver(what: &str, e: DriverError) -> Error {
    Error::Backend {
        backend: BACKEND,
        msg: format!("{what}: {e}"),
    }
}

impl Gpu {
    fn open(ordinal: usize) -> Result<Gpu> {
        let ctx = CudaContext::new(ordinal).map_err(|e| driver("creating a context", e))?;
        let (major, minor) = ctx
            .compute_capability()
            .map_err(|e| driver("reading the compute capability", e))?;
        let name = ctx
            .name()
            .map_err(|e| driver("reading the device name", e))?;
        let stream = ctx.default_stream();
        let blas = CudaBlas::new(stream.clone()).map_err(|e| Error::Backend {
            backend: BACKEND,
            msg: format!("creating a cuBLAS handle: {e:?}"),
        })?;
        let error_word = stream
            .alloc_zeros::<u32>(4)
            .map_err(|e| driver("allocating the error word", e))?;
        // One leaked string per device for NVRTC's `&'static str` option.
        let arch: &'static str = Box::leak(format!("compute_{major}{minor}").into_boxed_str());
        Ok(Gpu {
            ordinal,
            name: format!("{name} (compute capability {major}.{minor})"),
            arch,
            has_tf32: major >= 8,
            ctx,
            stream,
            blas,
            functions: Mutex::new(HashMap::new()),
            error_word: Mutex::new(error_word),
        })
    }

    /// The compiled kernel of `source` (compiled and loaded on first use).
    fn function(&self, source: impl FnOnce() -> KernelSource, name: &str) -> Result<CudaFunction> {
        let mut cache = self.functions.lock().unwrap_or_else(|e| e.into_inner());
        if let Some(f) = cache.get(name) {
            return Ok(f.clone());
        }
        let kernel = source();
        let ptx = compile_ptx(&kernel, self.arch)?;
        let module = self
            .ctx
            .load_module(ptx)
            .map_err(|e| driver(&format!("loading kernel {name}"), e))?;
        let f = module
            .load_function(&kernel.name)
            .map_err(|e| driver(&format!("finding kernel {name}"), e))?;
        cache.insert(name.to_string(), f.clone());
        Ok(f)
    }

    /// `bytes` of uninitialised device memory (stream ordered, from the driver's pool).
    fn alloc(&self, bytes: usize) -> Result<CudaBuffer> {
        // SAFETY: every kernel writes each output element before anything reads it.
        let data = unsafe { self.stream.alloc::<u8>(bytes.max(1)) }
            .map_err(|e| driver(&format!("allocating {bytes} bytes"), e))?;
        Ok(CudaBuffer {
            data,
            bytes,
            ordinal: self.ordinal,
        })
    }

    fn config(n: usize) -> LaunchConfig {
        let blocks = n.div_ceil(THREADS as usize).clamp(1, 1 << 20) as u32;
        LaunchConfig {
            grid_dim: (blocks, 1, 1),
            block_dim: (THREADS, 1, 1),
            shared_mem_bytes: 0,
        }
    }

    /// Clears the error word before a checked kernel.
    fn clear_error(&self, word: &mut CudaSlice<u32>) -> Result<()> {
        self.stream
            .memset_zeros(word)
            .map_err(|e| driver("clearing the error word", e))
    }

    /// Reads the error word after a checked kernel (waits for it): the code and, for an
    /// index out of range, the index.
    fn read_error(&self, word: &CudaSlice<u32>) -> Result<(u32, i64)> {
        let v = self
            .stream
            .clone_dtoh(word)
            .map_err(|e| driver("reading the error word", e))?;
        let at = |i: usize| v.get(i).copied().unwrap_or(0);
        Ok((at(0), ((at(3) as u64) << 32 | at(2) as u64) as i64))
    }
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
        let count = match CudaContext::device_count() {
            Ok(n) => n.max(0) as usize,
            // The driver loads but finds no device (CUDA_ERROR_NO_DEVICE) or none usable.
            Err(_) => 0,
        };
        let gpus = (0..count).map(Gpu::open).collect::<Result<Vec<_>>>()?;
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
    let mut v = View {
        offset: offset as i64,
        rank: dims.len() as i32,
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

fn boxed(b: CudaBuffer) -> Result<BufferBox> {
    Ok(Box::new(b))
}

impl Cuda {
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
        name: &str,
        source: impl FnOnce() -> KernelSource,
    ) -> Result<CudaBuffer> {
        let (gpu, a) = self.gpu_of(&x, op)?;
        let n = x.layout.num_elements();
        let y = gpu.alloc(n * out.dtype().size_in_bytes())?;
        if n == 0 {
            return Ok(y);
        }
        let f = gpu.function(source, name)?;
        let va = view(x.layout, op)?;
        let n64 = n as i64;
        let mut b = gpu.stream.launch_builder(&f);
        b.arg(&a.data).arg(&va).arg(&y.data).arg(&n64);
        // SAFETY: the kernel's parameters are (A, View, Y, n) as pushed; `va` stays inside
        // `a` (the tensor layer checked the layout) and `y` holds n outputs.
        unsafe { b.launch(Gpu::config(n)) }.map_err(|e| driver(op, e))?;
        Ok(y)
    }

    /// A dense copy of `x` in its own dtype.
    fn dense(&self, x: Operand<'_>) -> Result<CudaBuffer> {
        let e = elem(x.dtype, "copy")?;
        self.map_one(x, e, "copy", &format!("cast_{0}_{0}", e.tag()), || {
            source::cast(e, e)
        })
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

    /// Runs a gather-like kernel `(A, va, B, vb, Y, n, inner, ni, bound, E)`: `a` read through
    /// its view, `indices` checked against `bound`.
    fn indexed(
        &self,
        op: &'static str,
        kernel: KernelSource,
        a: Operand<'_>,
        indices: Operand<'_>,
        n: usize,
        (inner, ni, bound): (usize, usize, usize),
    ) -> Result<CudaBuffer> {
        let (gpu, abuf) = self.gpu_of(&a, op)?;
        let ibuf = ours(&indices, op)?;
        let y = gpu.alloc(n * a.dtype.size_in_bytes())?;
        if n == 0 {
            return Ok(y);
        }
        let name = kernel.name.clone();
        let f = gpu.function(|| kernel, &name)?;
        let (va, vb) = (view(a.layout, op)?, view(indices.layout, op)?);
        let (n64, inner64, ni64, bound64) = (n as i64, inner as i64, ni as i64, bound as i64);
        let mut word = gpu.error_word.lock().unwrap_or_else(|e| e.into_inner());
        gpu.clear_error(&mut word)?;
        let mut l = gpu.stream.launch_builder(&f);
        l.arg(&abuf.data)
            .arg(&va)
            .arg(&ibuf.data)
            .arg(&vb)
            .arg(&y.data)
            .arg(&n64)
            .arg(&inner64)
            .arg(&ni64)
            .arg(&bound64)
            .arg(&*word);
        // SAFETY: parameters as declared; every read of `a` is at a checked index inside its
        // view, `y` holds n values.
        unsafe { l.launch(Gpu::config(n)) }.map_err(|e| driver(op, e))?;
        Self::data_error(op, gpu.read_error(&word)?, bound)?;
        Ok(y)
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
        let f = gpu.function(|| source::copy_into(e), &format!("copy_into_{}", e.tag()))?;
        let va = view(x.layout, op)?;
        let vy = view_of(x.layout.shape(), strides, offset, op)?;
        let n64 = n as i64;
        let mut l = gpu.stream.launch_builder(&f);
        l.arg(&a.data).arg(&va).arg(&y.data).arg(&vy).arg(&n64);
        // SAFETY: parameters (A, va, Y, vy, n) as declared; `vy` addresses x's shape inside
        // the output (the caller's offset and the output's strides).
        unsafe { l.launch(Gpu::config(n)) }.map_err(|e| driver(op, e))?;
        Ok(())
    }

    /// Runs a window kernel `(A, [B,] Y, n_out, Geo)` into a fresh buffer of `n_out` values.
    fn window(
        &self,
        op: &'static str,
        kernel: KernelSource,
        a: Operand<'_>,
        b: Option<Operand<'_>>,
        n_out: usize,
        g: source::Geo,
    ) -> Result<CudaBuffer> {
        let (gpu, abuf) = self.gpu_of(&a, op)?;
        let bbuf = b.as_ref().map(|b| ours(b, op)).transpose()?;
        let y = gpu.alloc(n_out * a.dtype.size_in_bytes())?;
        if n_out == 0 {
            return Ok(y);
        }
        let name = kernel.name.clone();
        let f = gpu.function(|| kernel, &name)?;
        let n64 = n_out as i64;
        let mut l = gpu.stream.launch_builder(&f);
        l.arg(&abuf.data);
        if let Some(bbuf) = bbuf {
            l.arg(&bbuf.data);
        }
        l.arg(&y.data).arg(&n64).arg(&g);
        // SAFETY: parameters (A, [B,] Y, n_out, Geo) as the kernel declares them; the
        // geometry was resolved and checked by the tensor layer (`Window2d`), so every tap
        // read lies inside its operand; `y` holds n_out values.
        unsafe { l.launch(Gpu::config(n_out)) }.map_err(|e| driver(op, e))?;
        Ok(y)
    }

    /// `kept` and `red` views of `x` for a reduction over `axes`.
    fn split_views(
        x: &Operand<'_>,
        axes: &[usize],
        op: &'static str,
    ) -> Result<(View, View, usize)> {
        let (shape, strides) = (x.layout.shape(), x.layout.strides());
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
            view_of(&ks, &kst, x.layout.offset(), op)?,
            view_of(&rs, &rst, 0, op)?,
            m,
        ))
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
        let mut y = gpu.alloc(batch * m * n * size)?;
        if k == 0 {
            // An empty sum: zeros (cuBLAS would scale the uninitialised output by beta = 0,
            // and 0 · NaN is NaN).
            gpu.stream
                .memset_zeros(&mut y.data)
                .map_err(|e| driver("matmul", e))?;
            return Ok(y);
        }
        let op = |t: bool| {
            if t {
                cudarc::cublas::sys::cublasOperation_t::CUBLAS_OP_T
            } else {
                cudarc::cublas::sys::cublasOperation_t::CUBLAS_OP_N
            }
        };
        // Row-major C = A·B is column-major Cᵀ = Bᵀ·Aᵀ: B goes first.
        let cfg = StridedBatchedConfig {
            gemm: GemmConfig {
                transa: op(form_b.0),
                transb: op(form_a.0),
                m: n as i32,
                n: m as i32,
                k: k as i32,
                alpha: T::ONE,
                lda: form_b.1 as i32,
                ldb: form_a.1 as i32,
                beta: T::ZERO,
                ldc: n.max(1) as i32,
            },
            batch_size: batch as i32,
            stride_a: form_b.2,
            stride_b: form_a.2,
            stride_c: (m * n) as i64,
        };
        fn typed(
            buf: &CudaBuffer,
            offset: usize,
            size: usize,
        ) -> Result<cudarc::driver::CudaView<'_, u8>> {
            buf.data
                .try_slice(offset * size..)
                .ok_or_else(|| gemm_refused("an operand's offset"))
        }
        // TensorFloat-32 for float32 where allowed and present; full float32 otherwise.
        let mode = if T::IS_F32 && gpu.has_tf32 && tensor_float_32_execution_enabled() {
            cudarc::cublas::sys::cublasMath_t::CUBLAS_TF32_TENSOR_OP_MATH
        } else {
            cudarc::cublas::sys::cublasMath_t::CUBLAS_DEFAULT_MATH
        };
        // SAFETY: the handle is this device's, alive as long as `gpu`.
        let status = unsafe { cudarc::cublas::sys::cublasSetMathMode(*gpu.blas.handle(), mode) };
        if status != cudarc::cublas::sys::cublasStatus_t::CUBLAS_STATUS_SUCCESS {
            return Err(Error::Backend {
                backend: BACKEND,
                msg: format!("matmul: cuBLAS refused the math mode: {status:?}"),
            });
        }
        let va = typed(a, form_a.3, size)?;
        let vb = typed(b, form_b.3, size)?;
        // SAFETY: the views are reinterpreted as T over whole elements of their bytes; the
        // strides and leading dimensions above keep every read inside the tensors'
        // layouts (checked by the tensor layer), and `y` holds batch·m·n values.
        unsafe {
            let va = va
                .transmute::<T>(va.len() / size)
                .ok_or_else(|| gemm_refused("lhs"))?;
            let vb = vb
                .transmute::<T>(vb.len() / size)
                .ok_or_else(|| gemm_refused("rhs"))?;
            let len = y.data.len() / size;
            let mut vy = y
                .data
                .transmute_mut::<T>(len)
                .ok_or_else(|| gemm_refused("the output"))?;
            gpu.blas
                .gemm_strided_batched(cfg, &vb, &va, &mut vy)
                .map_err(|e| Error::Backend {
                    backend: BACKEND,
                    msg: format!("matmul: cuBLAS: {e:?}"),
                })?;
        }
        Ok(y)
    }
}

/// The element types cuBLAS multiplies, with the scalars of `C = 1·A·B + 0·C`.
trait GemmScalar: cudarc::driver::DeviceRepr {
    const ONE: Self;
    const ZERO: Self;
    /// float32, the type TensorFloat-32 applies to.
    const IS_F32: bool = false;
}
impl GemmScalar for f32 {
    const IS_F32: bool = true;
    const ONE: f32 = 1.0;
    const ZERO: f32 = 0.0;
}
impl GemmScalar for f64 {
    const ONE: f64 = 1.0;
    const ZERO: f64 = 0.0;
}
impl GemmScalar for half::f16 {
    const ONE: half::f16 = half::f16::ONE;
    const ZERO: half::f16 = half::f16::ZERO;
}
impl GemmScalar for half::bf16 {
    const ONE: half::bf16 = half::bf16::ONE;
    const ZERO: half::bf16 = half::bf16::ZERO;
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
    fn memory_bytes(&self, ordinal: usize) -> Option<u64> {
        self.gpus
            .get(ordinal)
            .and_then(|g| g.ctx.total_mem().ok())
            .map(|b| b as u64)
    }
    fn can_allocate(&self, ordinal: usize, bytes: u64) -> bool {
        self.gpus
            .get(ordinal)
            .and_then(|g| g.ctx.mem_get_info().ok())
            .is_some_and(|(free, _)| bytes <= free as u64)
    }
    fn synchronize(&self, ordinal: usize) -> Result<()> {
        self.gpu(ordinal)?
            .stream
            .synchronize()
            .map_err(|e| driver("synchronize", e))
    }
    fn upload(&self, ordinal: usize, data: HostData) -> Result<BufferBox> {
        if Elem::of(data.dtype()).is_none() {
            return Err(unsupported(BACKEND, "upload", data.dtype()));
        }
        let gpu = self.gpu(ordinal)?;
        let bytes = data.le_bytes();
        if bytes.is_empty() {
            return boxed(gpu.alloc(0)?);
        }
        let slice = gpu
            .stream
            .clone_htod(&bytes[..])
            .map_err(|e| driver("upload", e))?;
        boxed(CudaBuffer {
            data: slice,
            bytes: bytes.len(),
            ordinal,
        })
    }
    fn download(&self, x: Operand<'_>) -> Result<HostData> {
        let (gpu, _) = self.gpu_of(&x, "download")?;
        let size = x.dtype.size_in_bytes();
        let n = x.layout.num_elements();
        let empty = || {
            HostData::from_le_bytes(x.dtype, &[])
                .ok_or_else(|| unsupported(BACKEND, "download", x.dtype))
        };
        if n == 0 {
            return empty();
        }
        let dense;
        let (buf, start) = if x.layout.is_contiguous() {
            (ours(&x, "download")?, x.layout.offset())
        } else {
            dense = self.dense(x)?;
            (&dense, 0)
        };
        let view = buf
            .data
            .try_slice(start * size..(start + n) * size)
            .ok_or_else(|| Error::Backend {
                backend: BACKEND,
                msg: "download: the view lies outside its buffer".into(),
            })?;
        let bytes = gpu
            .stream
            .clone_dtoh(&view)
            .map_err(|e| driver("download", e))?;
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
        let kernel =
            source::unary(op, e, out).ok_or_else(|| unsupported(BACKEND, op.name(), x.dtype))?;
        let name = kernel.name.clone();
        boxed(self.map_one(x, out, op.name(), &name, || kernel)?)
    }
    fn binary(&self, op: BinaryOp, lhs: Operand<'_>, rhs: Operand<'_>) -> Result<BufferBox> {
        let e = elem(lhs.dtype, op.name())?;
        let out = elem(op.output_dtype(lhs.dtype), op.name())?;
        let (kernel, checked) =
            source::binary(op, e, out).ok_or_else(|| unsupported(BACKEND, op.name(), lhs.dtype))?;
        let (gpu, a) = self.gpu_of(&lhs, op.name())?;
        let b = ours(&rhs, op.name())?;
        let n = lhs.layout.num_elements();
        let y = gpu.alloc(n * out.dtype().size_in_bytes())?;
        if n == 0 {
            return boxed(y);
        }
        let name = kernel.name.clone();
        let f = gpu.function(|| kernel, &name)?;
        let (va, vb) = (view(lhs.layout, op.name())?, view(rhs.layout, op.name())?);
        let n64 = n as i64;
        let mut word = gpu.error_word.lock().unwrap_or_else(|e| e.into_inner());
        if checked {
            gpu.clear_error(&mut word)?;
        }
        let mut l = gpu.stream.launch_builder(&f);
        l.arg(&a.data)
            .arg(&va)
            .arg(&b.data)
            .arg(&vb)
            .arg(&y.data)
            .arg(&n64)
            .arg(&*word);
        // SAFETY: parameters (A, View, B, View, Y, n, E) as the kernel declares them; both
        // views have the output's shape (broadcast by the tensor layer) and stay inside
        // their buffers; `y` holds n outputs.
        unsafe { l.launch(Gpu::config(n)) }.map_err(|e| driver(op.name(), e))?;
        if checked {
            Self::data_error(op.name(), gpu.read_error(&word)?, 0)?;
        }
        boxed(y)
    }
    fn reduce(&self, op: ReduceOp, x: Operand<'_>, axes: &[usize]) -> Result<BufferBox> {
        let e = elem(x.dtype, op.name())?;
        let [rows, blocks] =
            source::reduce(op, e).ok_or_else(|| unsupported(BACKEND, op.name(), x.dtype))?;
        let (gpu, a) = self.gpu_of(&x, op.name())?;
        let (kept, red, m) = Self::split_views(&x, axes, op.name())?;
        let outputs: usize = (0..x.layout.rank())
            .filter(|d| !axes.contains(d))
            .map(|d| x.layout.shape()[d])
            .product();
        let y = gpu.alloc(outputs * x.dtype.size_in_bytes())?;
        if outputs == 0 {
            return boxed(y);
        }
        let m64 = m as i64;
        // Short reductions: a thread per output; long ones: a block per output.
        if m <= 64 || outputs > (1 << 20) {
            let name = rows.name.clone();
            let f = gpu.function(|| rows, &name)?;
            let n64 = outputs as i64;
            let mut l = gpu.stream.launch_builder(&f);
            l.arg(&a.data)
                .arg(&kept)
                .arg(&red)
                .arg(&m64)
                .arg(&y.data)
                .arg(&n64);
            // SAFETY: parameters (A, kept, red, m, Y, n) as declared; `kept` enumerates the
            // outputs, `red` the m reduced elements of each, all inside `a`.
            unsafe { l.launch(Gpu::config(outputs)) }.map_err(|e| driver(op.name(), e))?;
        } else {
            let name = blocks.name.clone();
            let f = gpu.function(|| blocks, &name)?;
            let mut l = gpu.stream.launch_builder(&f);
            l.arg(&a.data).arg(&kept).arg(&red).arg(&m64).arg(&y.data);
            let cfg = LaunchConfig {
                grid_dim: (outputs as u32, 1, 1),
                block_dim: (source::REDUCE_BLOCK, 1, 1),
                shared_mem_bytes: 0,
            };
            // SAFETY: as above, one block per output (at most 2^20 blocks).
            unsafe { l.launch(cfg) }.map_err(|e| driver(op.name(), e))?;
        }
        boxed(y)
    }
    fn arg_reduce(&self, op: ArgReduceOp, x: Operand<'_>, axis: usize) -> Result<BufferBox> {
        let e = elem(x.dtype, op.name())?;
        let kernel =
            source::arg_reduce(op, e).ok_or_else(|| unsupported(BACKEND, op.name(), x.dtype))?;
        let (gpu, a) = self.gpu_of(&x, op.name())?;
        let (kept, _, m) = Self::split_views(&x, &[axis], op.name())?;
        let stride = x.layout.strides()[axis] as i64;
        let outputs = x.layout.num_elements() / m.max(1);
        let y = gpu.alloc(outputs * 8)?;
        if outputs == 0 || m == 0 {
            return boxed(y);
        }
        let name = kernel.name.clone();
        let f = gpu.function(|| kernel, &name)?;
        let (m64, n64) = (m as i64, outputs as i64);
        let mut l = gpu.stream.launch_builder(&f);
        l.arg(&a.data)
            .arg(&kept)
            .arg(&stride)
            .arg(&m64)
            .arg(&y.data)
            .arg(&n64);
        // SAFETY: parameters (A, kept, stride, m, Y, n) as declared, inside `a`.
        unsafe { l.launch(Gpu::config(outputs)) }.map_err(|e| driver(op.name(), e))?;
        boxed(y)
    }
    fn cast(&self, x: Operand<'_>, to: DType) -> Result<BufferBox> {
        let from = elem(x.dtype, "cast")?;
        let to = elem(to, "cast")?;
        boxed(self.map_one(
            x,
            to,
            "cast",
            &format!("cast_{}_{}", from.tag(), to.tag()),
            || source::cast(from, to),
        )?)
    }
    fn matmul(&self, lhs: Operand<'_>, rhs: Operand<'_>) -> Result<BufferBox> {
        let (gpu, _) = self.gpu_of(&lhs, "matmul")?;
        boxed(match lhs.dtype {
            DType::F32 => self.matmul_typed::<f32>(gpu, lhs, rhs)?,
            DType::F64 => self.matmul_typed::<f64>(gpu, lhs, rhs)?,
            DType::F16 => self.matmul_typed::<half::f16>(gpu, lhs, rhs)?,
            DType::BF16 => self.matmul_typed::<half::bf16>(gpu, lhs, rhs)?,
            other => return Err(unsupported(BACKEND, "matmul", other)),
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
        let y = gpu.alloc(n * e.dtype().size_in_bytes())?;
        if n == 0 {
            return boxed(y);
        }
        let f = gpu.function(|| source::select(e), &format!("select_{}", e.tag()))?;
        let (vc, va, vb) = (
            view(cond.layout, "select")?,
            view(on_true.layout, "select")?,
            view(on_false.layout, "select")?,
        );
        let n64 = n as i64;
        let mut l = gpu.stream.launch_builder(&f);
        l.arg(&c.data)
            .arg(&vc)
            .arg(&a.data)
            .arg(&va)
            .arg(&b.data)
            .arg(&vb)
            .arg(&y.data)
            .arg(&n64);
        // SAFETY: parameters (C, View, A, View, B, View, Y, n) as declared; the three views
        // have the output's shape and stay inside their buffers.
        unsafe { l.launch(Gpu::config(n)) }.map_err(|e| driver("select", e))?;
        boxed(y)
    }
    fn gather(&self, x: Operand<'_>, indices: Operand<'_>, axis: usize) -> Result<BufferBox> {
        let shape = x.layout.shape();
        let inner: usize = shape[axis + 1..].iter().product();
        let outer: usize = shape[..axis].iter().product();
        let ni = indices.layout.num_elements();
        let e = elem(x.dtype, "gather")?;
        let ie = elem(indices.dtype, "gather")?;
        let kernel =
            source::gather(e, ie).ok_or_else(|| unsupported(BACKEND, "gather", indices.dtype))?;
        boxed(self.indexed(
            "gather",
            kernel,
            x,
            indices,
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
        let kernel = source::scatter_add(e, ie)
            .ok_or_else(|| unsupported(BACKEND, "scatter_add", updates.dtype))?;
        boxed(self.indexed(
            "scatter_add",
            kernel,
            updates,
            indices,
            n,
            (inner, ni, shape[axis]),
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
        let y = gpu.alloc(shape.iter().product::<usize>() * first.dtype.size_in_bytes())?;
        let mut start = 0usize;
        for x in inputs {
            let offset = start * strides[axis] as usize;
            start += x.layout.shape()[axis];
            self.copy_into(gpu, e, x, &y, &strides, offset, "concat")?;
        }
        boxed(y)
    }
    fn pad(&self, x: Operand<'_>, paddings: &[(usize, usize)], value: f64) -> Result<BufferBox> {
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
        let y = gpu.alloc(n * x.dtype.size_in_bytes())?;
        if n == 0 {
            return boxed(y);
        }
        let f = gpu.function(|| source::fill(e), &format!("fill_{}", e.tag()))?;
        let n64 = n as i64;
        let mut l = gpu.stream.launch_builder(&f);
        l.arg(&y.data).arg(&n64).arg(&value);
        // SAFETY: parameters (Y, n, v) as declared; `y` holds n values.
        unsafe { l.launch(Gpu::config(n)) }.map_err(|e| driver("pad", e))?;
        let strides = ferroflow_tensor::layout::contiguous_strides(&shape);
        let offset: usize = paddings
            .iter()
            .zip(&strides)
            .map(|(&(lo, _), &st)| lo * st as usize)
            .sum();
        self.copy_into(gpu, e, &x, &y, &strides, offset, "pad")?;
        boxed(y)
    }
    fn cumulative(
        &self,
        op: CumulativeOp,
        x: Operand<'_>,
        axis: usize,
        exclusive: bool,
        reverse: bool,
    ) -> Result<BufferBox> {
        let (gpu, a) = self.gpu_of(&x, op.name())?;
        let e = elem(x.dtype, op.name())?;
        let kernel =
            source::cumulative(op, e).ok_or_else(|| unsupported(BACKEND, op.name(), x.dtype))?;
        let shape = x.layout.shape();
        let total = x.layout.num_elements();
        let y = gpu.alloc(total * x.dtype.size_in_bytes())?;
        let m = shape[axis];
        if total == 0 {
            return boxed(y);
        }
        let out_strides = ferroflow_tensor::layout::contiguous_strides(shape);
        let others = |strides: &[isize]| -> (Vec<usize>, Vec<isize>) {
            (0..shape.len())
                .filter(|&d| d != axis)
                .map(|d| (shape[d], strides[d]))
                .unzip()
        };
        let (ks, kst) = others(x.layout.strides());
        let (_, ost) = others(&out_strides);
        let kin = view_of(&ks, &kst, x.layout.offset(), op.name())?;
        let kout = view_of(&ks, &ost, 0, op.name())?;
        let (sin, sout) = (x.layout.strides()[axis] as i64, out_strides[axis] as i64);
        let lines = total / m;
        let name = kernel.name.clone();
        let f = gpu.function(|| kernel, &name)?;
        let (m64, n64) = (m as i64, lines as i64);
        let (exclusive, reverse) = (exclusive as i32, reverse as i32);
        let mut l = gpu.stream.launch_builder(&f);
        l.arg(&a.data)
            .arg(&kin)
            .arg(&sin)
            .arg(&y.data)
            .arg(&kout)
            .arg(&sout)
            .arg(&m64)
            .arg(&n64)
            .arg(&exclusive)
            .arg(&reverse);
        // SAFETY: parameters (A, kin, sin, Y, kout, sout, m, n, exclusive, reverse) as
        // declared; line l reads m elements of `a` along the axis and writes m of `y`.
        unsafe { l.launch(Gpu::config(lines)) }.map_err(|e| driver(op.name(), e))?;
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
        let kernel = source::sort(e).ok_or_else(|| unsupported(BACKEND, "sort", x.dtype))?;
        let shape = x.layout.shape();
        let total = x.layout.num_elements();
        let y = gpu.alloc(total * x.dtype.size_in_bytes())?;
        let idx = gpu.alloc(total * 4)?;
        let m = shape[axis];
        if total == 0 {
            return Ok((Box::new(y), Box::new(idx)));
        }
        let out_strides = ferroflow_tensor::layout::contiguous_strides(shape);
        let others = |strides: &[isize]| -> (Vec<usize>, Vec<isize>) {
            (0..shape.len())
                .filter(|&d| d != axis)
                .map(|d| (shape[d], strides[d]))
                .unzip()
        };
        let (ks, kst) = others(x.layout.strides());
        let (_, ost) = others(&out_strides);
        let kin = view_of(&ks, &kst, x.layout.offset(), "sort")?;
        let kout = view_of(&ks, &ost, 0, "sort")?;
        let (sin, sout) = (x.layout.strides()[axis] as i64, out_strides[axis] as i64);
        let name = kernel.name.clone();
        let f = gpu.function(|| kernel, &name)?;
        let (m64, n64, desc) = (m as i64, total as i64, descending as i32);
        let mut l = gpu.stream.launch_builder(&f);
        l.arg(&a.data)
            .arg(&kin)
            .arg(&sin)
            .arg(&y.data)
            .arg(&idx.data)
            .arg(&kout)
            .arg(&sout)
            .arg(&m64)
            .arg(&n64)
            .arg(&desc);
        // SAFETY: parameters (A, kin, sin, Y, I, kout, sout, m, n, descending) as declared;
        // every element is written once, at its rank within its line.
        unsafe { l.launch(Gpu::config(total)) }.map_err(|e| driver("sort", e))?;
        Ok((Box::new(y), Box::new(idx)))
    }
    fn conv2d(&self, x: Operand<'_>, filter: Operand<'_>, w: &Window2d) -> Result<BufferBox> {
        let e = float_elem(x.dtype, "conv2d")?;
        let cout = filter.layout.shape()[3];
        let n = w.input[0] * w.output[0] * w.output[1] * cout;
        let k = source::conv2d(e).ok_or_else(|| unsupported(BACKEND, "conv2d", x.dtype))?;
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
        let cout = filter.layout.shape()[3];
        let n = w.input.iter().product();
        let k =
            source::conv2d_backprop_input(e).ok_or_else(|| unsupported(BACKEND, op, dy.dtype))?;
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
        let n = filter_shape.iter().product();
        let k =
            source::conv2d_backprop_filter(e).ok_or_else(|| unsupported(BACKEND, op, x.dtype))?;
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
        let n = w.input[0] * w.output[0] * w.output[1] * w.input[3];
        let k =
            source::pool2d(kind, e).ok_or_else(|| unsupported(BACKEND, kind.name(), x.dtype))?;
        boxed(self.window(kind.name(), k, x, None, n, geo(w, 0, x.layout, None)?)?)
    }
    fn max_pool_grad(&self, x: Operand<'_>, dy: Operand<'_>, w: &Window2d) -> Result<BufferBox> {
        let op = "max_pool_grad";
        let e = float_elem(x.dtype, op)?;
        let n = w.input.iter().product();
        let k = source::max_pool_grad(e).ok_or_else(|| unsupported(BACKEND, op, x.dtype))?;
        boxed(self.window(op, k, x, Some(dy), n, geo(w, 0, x.layout, Some(dy.layout))?)?)
    }
    fn avg_pool_grad(&self, dy: Operand<'_>, w: &Window2d) -> Result<BufferBox> {
        let op = "avg_pool_grad";
        let e = float_elem(dy.dtype, op)?;
        let n = w.input.iter().product();
        let k = source::avg_pool_grad(e).ok_or_else(|| unsupported(BACKEND, op, dy.dtype))?;
        boxed(self.window(op, k, dy, None, n, geo(w, 0, dy.layout, None)?)?)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

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
