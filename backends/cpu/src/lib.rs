//! ferroflow's CPU backend: the [`Backend`] trait on host memory, multi-threaded with rayon,
//! vectorised (hot loops are compiled for baseline x86-64 and AVX2+FMA and picked at run
//! time), with matmul and convolution on the `gemm` crate.
//!
//! # Overview
//! - [`CpuBackend`]: the backend; [`register`] makes it serve `/CPU:0`.
//! - Storage is a dense typed host vector; kernels read inputs through their layouts, so views
//!   (transposes, slices, broadcasts) are not copied first.
//! - f16 and bf16 are widened to f32 around each kernel: they compute and accumulate in f32.
//!
//! ```
//! ferroflow_cpu::register();
//! use ferroflow_tensor::Tensor;
//! let x = Tensor::from_slice(&[1.0f32, 2.0, 3.0])?;
//! assert_eq!(x.exp()?.log()?.to_vec::<f32>()?.len(), 3);
//! # Ok::<(), ferroflow_tensor::Error>(())
//! ```
//!
//! # Design
//! Kernels are generic over the element type and monomorphised per dtype, not written per
//! dtype: one `apply` loop serves all twenty binary ops. The cost is compile time, paid once.
//! Threads: rayon's global pool (set `RAYON_NUM_THREADS` to limit it). Instruction set: the
//! best the CPU has, capped by `FERROFLOW_CPU_ISA=avx512|avx2|scalar` ([`isa`]).

#![warn(missing_docs)]

mod block_cache;
mod buffer;
mod kernels;
mod lanes;
mod num;
mod simd;

pub use buffer::CpuBuffer;

/// The instruction set the kernels use in this process: `"avx512"` (AVX-512 F, VL and DQ),
/// `"avx2"` (AVX2, FMA and F16C) or `"scalar"` — the best the CPU has, capped by the
/// `FERROFLOW_CPU_ISA` environment variable (same values; read once), so the lower levels'
/// code can be tested anywhere.
///
/// ```
/// assert!(["avx512", "avx2", "scalar"].contains(&ferroflow_cpu::isa()));
/// ```
pub fn isa() -> &'static str {
    match simd::isa() {
        simd::Isa::Avx512 => "avx512",
        simd::Isa::Avx2 => "avx2",
        simd::Isa::Scalar => "scalar",
    }
}

use buffer::out;
use ferroflow_tensor::{
    ArgReduceOp, Backend, BinaryOp, BufferBox, CumulativeOp, DType, DeviceKind, FusedActivation,
    FusedKernel, HostData, Operand, PoolKind, ReduceOp, Result, UnaryOp, UpdateRule, Window2d,
};
use std::sync::Arc;

/// The CPU backend: `/CPU:0`, or the logical devices `/CPU:0`..`/CPU:{n-1}` after
/// [`set_logical_devices`].
#[derive(Debug, Default, Clone, Copy)]
pub struct CpuBackend;

static LOGICAL_DEVICES: std::sync::OnceLock<usize> = std::sync::OnceLock::new();

/// Splits the host CPU into `n` logical devices, `/CPU:0`..`/CPU:{n-1}` (TF's
/// `tf.config.set_logical_device_configuration` on the CPU), so a `MirroredStrategy` can
/// place one replica on each without a GPU. Their tensors are host memory like
/// `/CPU:0`'s, kept apart as TF keeps them (an op takes inputs from one device; `to_device`
/// copies), and they share the host's thread pool, as TF's logical CPUs do: a strategy
/// runs its local replicas one after another, each using every thread.
///
/// Set once, before the devices are used; setting another count later is an error (TF:
/// "Virtual devices cannot be modified after being initialized").
///
/// ```
/// ferroflow_cpu::register();
/// ferroflow_cpu::set_logical_devices(2)?;
/// let t = ferroflow_tensor::with_device("/CPU:1", || ferroflow_tensor::Tensor::from_slice(&[1.0f32]))??;
/// assert_eq!(t.device().index(), 1);
/// # Ok::<(), ferroflow_tensor::Error>(())
/// ```
pub fn set_logical_devices(n: usize) -> Result<()> {
    if n == 0 {
        return Err(ferroflow_tensor::Error::invalid(
            "set_logical_device_configuration",
            "the CPU needs at least one logical device",
        ));
    }
    let set = *LOGICAL_DEVICES.get_or_init(|| n);
    if set != n {
        return Err(ferroflow_tensor::Error::invalid(
            "set_logical_device_configuration",
            format!(
                "the CPU is already split into {set} logical devices; virtual devices cannot \
                 be modified after being initialized"
            ),
        ));
    }
    Ok(())
}

/// Registers the CPU backend for `/CPU:*` (idempotent).
///
/// On Linux with glibc this also raises malloc's mmap and trim thresholds to 1 GiB, so
/// large tensor buffers freed by one step are reused by the next on the main thread instead
/// of being unmapped and faulted in afresh (a 64 MiB output costs ~7 ms of page faults
/// otherwise); other threads' arenas cannot hold such blocks, which the backend's own block
/// cache keeps for them ([`set_block_cache_limit`]). Like TF's and PyTorch's caching
/// allocators, the process keeps its peak heap; set `FERROFLOW_CPU_KEEP_MALLOC=1` to leave
/// malloc's defaults alone.
pub fn register() {
    static TUNE: std::sync::Once = std::sync::Once::new();
    TUNE.call_once(block_cache::tune_malloc);
    ferroflow_tensor::register_backend(DeviceKind::Cpu, Arc::new(CpuBackend));
}

/// Caps the freed host memory the CPU backend keeps for reuse in blocks of 8 MiB or more, on
/// threads other than the main one: a kernel output of such a size takes a kept block of
/// its size, and a tensor's buffer of such a size is kept when dropped. glibc maps every
/// block that does not fit a secondary arena's 64 MiB heaps afresh and unmaps it at its
/// free, so without the cache a thread's every use of a large activation pays its page
/// faults (the MNIST CNN at batch 512 in a spawned thread ran 26% slower than on the main
/// thread). 1 GiB by default; 0 keeps none. A block no request took for a few steps' worth
/// of requests is freed; lowering the limit frees what is over it. On the main thread
/// glibc's main arena keeps large blocks itself ([`register`]), except under
/// `FERROFLOW_CPU_KEEP_MALLOC`, where the cache serves it too.
///
/// ```
/// ferroflow_cpu::set_block_cache_limit(0);
/// assert_eq!(ferroflow_cpu::block_cache_limit(), 0);
/// ferroflow_cpu::set_block_cache_limit(1 << 30);
/// ```
pub fn set_block_cache_limit(bytes: usize) {
    block_cache::set_limit(bytes)
}

/// The limit [`set_block_cache_limit`] set.
///
/// ```
/// println!("the CPU backend keeps up to {} freed bytes", ferroflow_cpu::block_cache_limit());
/// ```
pub fn block_cache_limit() -> usize {
    block_cache::limit()
}

impl Backend for CpuBackend {
    fn name(&self) -> &'static str {
        "cpu"
    }
    fn device_count(&self) -> usize {
        LOGICAL_DEVICES.get().copied().unwrap_or(1)
    }
    /// Every fused kernel: the convolution ones for every float dtype (half precision
    /// computes in f32), `clip_scalar` for every numeric dtype, the optimizer update and
    /// elementwise programs, the sparse softmax cross-entropy and the fused matmuls for f32
    /// and f64 (`fused_matmul_reduce`: the trait's default, the product then the program and
    /// its reduction, one op to the dispatcher; half-precision
    /// variables are rare: mixed precision keeps them in f32; half logits compute in f32).
    fn has_fused(&self, _ordinal: usize, kernel: FusedKernel, dtype: DType) -> bool {
        match kernel {
            FusedKernel::FusedConv2d
            | FusedKernel::FusedConv2dMaxPool
            | FusedKernel::BiasActivationGrad
            | FusedKernel::MaxPoolBiasActivationGrad => dtype.is_float(),
            FusedKernel::ClipScalar => dtype != DType::Bool && !dtype.is_complex(),
            FusedKernel::OptimizerUpdate
            | FusedKernel::Elementwise
            | FusedKernel::SparseSoftmaxCrossEntropy
            | FusedKernel::FusedMatMul
            | FusedKernel::FusedMatMulReduce => {
                matches!(dtype, DType::F32 | DType::F64)
            }
        }
    }
    fn memory_bytes(&self, _ordinal: usize) -> Option<u64> {
        physical_memory_bytes()
    }
    /// Large outputs are probed ([`ferroflow_tensor::device::host_can_allocate`]), so a size
    /// the allocator refuses is an error here, not an abort in the kernel.
    fn can_allocate(&self, _ordinal: usize, bytes: u64) -> bool {
        ferroflow_tensor::device::host_can_allocate(bytes)
    }
    fn upload(&self, _ordinal: usize, data: HostData) -> Result<BufferBox> {
        out(data)
    }
    fn download(&self, x: Operand<'_>) -> Result<HostData> {
        kernels::cast::copy(x)
    }
    fn copy(&self, x: Operand<'_>) -> Result<BufferBox> {
        out(kernels::cast::copy(x)?)
    }
    fn unary(&self, op: UnaryOp, x: Operand<'_>) -> Result<BufferBox> {
        out(kernels::unary::unary(op, x)?)
    }
    fn binary(&self, op: BinaryOp, lhs: Operand<'_>, rhs: Operand<'_>) -> Result<BufferBox> {
        out(kernels::binary::binary(op, lhs, rhs)?)
    }
    fn reduce(&self, op: ReduceOp, x: Operand<'_>, axes: &[usize]) -> Result<BufferBox> {
        out(kernels::reduce::reduce(op, x, axes)?)
    }
    fn arg_reduce(&self, op: ArgReduceOp, x: Operand<'_>, axis: usize) -> Result<BufferBox> {
        out(kernels::reduce::arg_reduce(op, x, axis)?)
    }
    fn cast(&self, x: Operand<'_>, to: DType) -> Result<BufferBox> {
        out(kernels::cast::cast(x, to)?)
    }
    fn matmul(&self, lhs: Operand<'_>, rhs: Operand<'_>) -> Result<BufferBox> {
        out(kernels::matmul::matmul(lhs, rhs)?)
    }
    fn fused_matmul(
        &self,
        a: Operand<'_>,
        b: Operand<'_>,
        bias: Operand<'_>,
        activation: FusedActivation,
    ) -> Result<BufferBox> {
        out(kernels::bias::fused_matmul(a, b, bias, activation)?)
    }
    fn select(
        &self,
        cond: Operand<'_>,
        on_true: Operand<'_>,
        on_false: Operand<'_>,
    ) -> Result<BufferBox> {
        out(kernels::index::select(cond, on_true, on_false)?)
    }
    fn gather(&self, x: Operand<'_>, indices: Operand<'_>, axis: usize) -> Result<BufferBox> {
        out(kernels::index::gather(x, indices, axis)?)
    }
    fn scatter_add(
        &self,
        indices: Operand<'_>,
        updates: Operand<'_>,
        shape: &[usize],
        axis: usize,
    ) -> Result<BufferBox> {
        out(kernels::index::scatter_add(indices, updates, shape, axis)?)
    }
    fn concat(&self, inputs: &[Operand<'_>], axis: usize) -> Result<BufferBox> {
        out(kernels::index::concat(inputs, axis)?)
    }
    fn pad(&self, x: Operand<'_>, paddings: &[(usize, usize)], value: f64) -> Result<BufferBox> {
        out(kernels::index::pad(x, paddings, value)?)
    }
    fn cumulative(
        &self,
        op: CumulativeOp,
        x: Operand<'_>,
        axis: usize,
        exclusive: bool,
        reverse: bool,
    ) -> Result<BufferBox> {
        out(kernels::scan::cumulative(op, x, axis, exclusive, reverse)?)
    }
    fn sort(
        &self,
        x: Operand<'_>,
        axis: usize,
        descending: bool,
    ) -> Result<(BufferBox, BufferBox)> {
        let (v, i) = kernels::scan::sort(x, axis, descending)?;
        Ok((out(v)?, out(i)?))
    }
    fn conv2d(&self, x: Operand<'_>, filter: Operand<'_>, w: &Window2d) -> Result<BufferBox> {
        out(kernels::conv::conv2d(x, filter, w)?)
    }
    fn fused_conv2d(
        &self,
        x: Operand<'_>,
        filter: Operand<'_>,
        bias: Operand<'_>,
        w: &Window2d,
        activation: FusedActivation,
    ) -> Result<BufferBox> {
        out(kernels::conv::fused_conv2d(x, filter, bias, w, activation)?)
    }
    fn fused_conv2d_max_pool(
        &self,
        x: Operand<'_>,
        filter: Operand<'_>,
        bias: Operand<'_>,
        w: &Window2d,
        activation: FusedActivation,
        pool: &Window2d,
    ) -> Result<(BufferBox, BufferBox)> {
        let (y, pooled) =
            kernels::conv::fused_conv2d_max_pool(x, filter, bias, w, activation, pool)?;
        let y = out(y)?;
        let pooled = match pooled {
            Some(p) => out(p)?,
            // Kernels that pool the stored result: this backend's pooling (the same bits).
            None => ferroflow_tensor::backend::max_pool_stored(self, &y, x.dtype, pool)?,
        };
        Ok((y, pooled))
    }
    fn bias_activation_grad(
        &self,
        g: Operand<'_>,
        y: Operand<'_>,
        activation: FusedActivation,
    ) -> Result<(BufferBox, BufferBox)> {
        let (dx, db) = kernels::bias::bias_activation_grad(g, y, activation)?;
        Ok((out(dx)?, out(db)?))
    }
    fn max_pool_bias_activation_grad(
        &self,
        y: Operand<'_>,
        dy: Operand<'_>,
        w: &Window2d,
        activation: FusedActivation,
    ) -> Result<(BufferBox, BufferBox)> {
        match kernels::conv::max_pool_bias_activation_grad(y, dy, w, activation)? {
            Some((dx, db)) => Ok((out(dx)?, out(db)?)),
            // Other windows and types: this backend's two kernels (the same bits).
            None => ferroflow_tensor::backend::max_pool_then_bias_activation_grad(
                self, y, dy, w, activation,
            ),
        }
    }
    fn conv2d_backprop_input(
        &self,
        filter: Operand<'_>,
        dy: Operand<'_>,
        w: &Window2d,
    ) -> Result<BufferBox> {
        out(kernels::conv::conv2d_backprop_input(filter, dy, w)?)
    }
    fn conv2d_backprop_filter(
        &self,
        x: Operand<'_>,
        dy: Operand<'_>,
        filter_shape: [usize; 4],
        w: &Window2d,
    ) -> Result<BufferBox> {
        out(kernels::conv::conv2d_backprop_filter(
            x,
            dy,
            filter_shape,
            w,
        )?)
    }
    fn pool2d(&self, kind: PoolKind, x: Operand<'_>, w: &Window2d) -> Result<BufferBox> {
        out(kernels::conv::pool2d(kind, x, w)?)
    }
    fn max_pool_grad(&self, x: Operand<'_>, dy: Operand<'_>, w: &Window2d) -> Result<BufferBox> {
        out(kernels::conv::max_pool_grad(x, dy, w)?)
    }
    fn avg_pool_grad(&self, dy: Operand<'_>, w: &Window2d) -> Result<BufferBox> {
        out(kernels::conv::avg_pool_grad(dy, w)?)
    }
    fn fft(&self, x: Operand<'_>, inverse: bool) -> Result<BufferBox> {
        out(match buffer::host(&x)? {
            HostData::C64(v) => kernels::complex::fft(v, x.layout, inverse),
            HostData::C128(v) => kernels::complex::fft(v, x.layout, inverse),
            _ => {
                return Err(ferroflow_tensor::backend::unsupported(
                    "cpu",
                    if inverse { "ifft" } else { "fft" },
                    x.dtype,
                ))
            }
        })
    }
    fn sparse_softmax_cross_entropy(
        &self,
        logits: Operand<'_>,
        labels: Operand<'_>,
    ) -> Result<(BufferBox, BufferBox)> {
        let (loss, backprop) = kernels::xent::sparse_softmax_cross_entropy(logits, labels)?;
        Ok((out(loss)?, out(backprop)?))
    }
    fn clip_scalar(&self, x: Operand<'_>, min: f64, max: f64) -> Result<BufferBox> {
        out(kernels::unary::clip_scalar(x, min, max)?)
    }
    fn fused_elementwise(
        &self,
        program: &ferroflow_tensor::ElementwiseProgram,
        inputs: &[Operand<'_>],
        shape: &[usize],
    ) -> Result<Vec<BufferBox>> {
        kernels::program::fused_elementwise(program, inputs, shape)?
            .into_iter()
            .map(out)
            .collect()
    }
    fn optimizer_update(
        &self,
        rule: &UpdateRule,
        w: Operand<'_>,
        g: Operand<'_>,
        slots: &[Operand<'_>],
    ) -> Result<(BufferBox, Vec<BufferBox>)> {
        let (nw, ns) = kernels::fused::optimizer_update(rule, w, g, slots)?;
        Ok((
            out(nw)?,
            ns.into_iter().map(out).collect::<Result<Vec<_>>>()?,
        ))
    }
}

/// The machine's physical memory (`MemTotal` of `/proc/meminfo`), read once; `None` where
/// the platform does not say (then only the address space bounds a tensor).
fn physical_memory_bytes() -> Option<u64> {
    static TOTAL: std::sync::OnceLock<Option<u64>> = std::sync::OnceLock::new();
    *TOTAL.get_or_init(|| {
        let text = std::fs::read_to_string("/proc/meminfo").ok()?;
        let line = text.lines().find(|l| l.starts_with("MemTotal:"))?;
        let kib: u64 = line.split_whitespace().nth(1)?.parse().ok()?;
        kib.checked_mul(1024)
    })
}
