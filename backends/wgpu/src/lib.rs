//! ferroflow's portable GPU backend: the [`Backend`] trait as WGSL compute kernels through
//! wgpu, on Vulkan, Metal, DX12 or OpenGL.
//!
//! # Overview
//! - [`register`] serves `/GPU:0`, `/GPU:1`, ... with the adapters wgpu finds (discrete GPUs
//!   first, software adapters such as Mesa's lavapipe last). `FERROFLOW_WGPU_BACKEND`
//!   (`vulkan`, `metal`, `dx12`, `gl`, comma-separated) chooses the graphics APIs.
//! - [`adapters`] / [`ferroflow_tensor::list_devices`] describe them.
//! - dtypes: float32, int32 and bool everywhere; float16 where the adapter has
//!   `SHADER_F16` (it computes in f32); int64 is stored (argmax results, indices) and moves,
//!   casts and compares, but has no arithmetic; float64, bfloat16, int8 and uint8 are an
//!   error naming the dtype and the device.
//!
//! ```no_run
//! ferroflow_wgpu::register();
//! use ferroflow_tensor::{with_device, Tensor};
//! let y = with_device("/GPU:0", || -> ferroflow_tensor::Result<Vec<f32>> {
//!     let a = Tensor::from_vec(vec![1.0f32, 2.0, 3.0, 4.0], &[2, 2])?;
//!     a.matmul(&a)?.to_vec::<f32>()
//! })??;
//! assert_eq!(y, [7.0, 10.0, 15.0, 22.0]);
//! # Ok::<(), ferroflow_tensor::Error>(())
//! ```
//!
//! # Design
//! - A caching allocator (size-class pool per device), a pipeline cache keyed by kernel and
//!   dtype, parameter blocks cached by content, and batched submission: work is recorded and
//!   submitted every few dozen kernels; the host waits only when it reads data back.
//! - Kernels read inputs through their layouts (no copies for views). Matmul is a
//!   register-tiled GEMM; conv2d and both of its gradients run through the same GEMM as
//!   implicit GEMMs; reductions are workgroup tree reductions (with a split pass for long
//!   reductions into few outputs).
//! - Data-dependent errors (an out-of-range gather index, integer division by zero) are
//!   flagged by the kernel in a device word that the op reads back: those ops wait for the
//!   GPU, so the error is reported by the op that caused it.

#![warn(missing_docs)]

mod buffer;
mod elem;
mod gpu;
mod kernels;
mod shaders;

pub use buffer::WgpuBuffer;

use ferroflow_tensor::{
    ArgReduceOp, Backend, BinaryOp, BufferBox, CumulativeOp, DType, DeviceKind, ElementwiseProgram,
    Error, FusedActivation, FusedKernel, HostData, Operand, PoolKind, ReduceOp, Result, UnaryOp,
    UpdateOperands, UpdateRule, Window2d,
};
use gpu::{backend_error, Gpu};
use kernels::In;
use std::sync::{Arc, OnceLock};

/// One adapter wgpu found, as [`adapters`] lists it (see there for an example).
#[derive(Debug, Clone)]
pub struct AdapterInfo {
    /// The device name (`NVIDIA H200`, `llvmpipe (LLVM 15.0.6, 256 bits)`).
    pub name: String,
    /// The graphics API (`Vulkan`, `Metal`, `Dx12`, `Gl`).
    pub api: String,
    /// Discrete, integrated, virtual or CPU (software).
    pub kind: String,
    /// Driver name and version.
    pub driver: String,
    /// Whether WGSL f16 is available (float16 tensors).
    pub shader_f16: bool,
    /// Whether the adapter has timestamp queries: the profiler then records each kernel's
    /// time on the device (else only its host-side launch).
    pub timestamp_query: bool,
}

struct Slot {
    adapter: wgpu::Adapter,
    info: AdapterInfo,
    gpu: OnceLock<std::result::Result<Arc<Gpu>, String>>,
}

/// The wgpu backend: one device per adapter, opened on first use. [`register`] installs the
/// process-wide one; a second instance is for tools that want their own view of the adapters.
///
/// ```
/// use ferroflow_tensor::Backend;
/// let b = ferroflow_wgpu::WgpuBackend::new()?;
/// assert_eq!(b.name(), "wgpu");
/// assert_eq!(b.device_count(), b.adapters().len());
/// # Ok::<(), ferroflow_tensor::Error>(())
/// ```
pub struct WgpuBackend {
    slots: Vec<Slot>,
}

/// The graphics APIs to search: `FERROFLOW_WGPU_BACKEND` (`vulkan,metal,dx12,gl`), else the
/// primary ones of the platform.
fn requested_backends() -> Result<wgpu::Backends> {
    match std::env::var("FERROFLOW_WGPU_BACKEND") {
        Ok(v) => parse_backends(&v),
        Err(_) => Ok(wgpu::Backends::PRIMARY),
    }
}

/// `vulkan,metal,dx12,gl` (case-insensitive, comma-separated) as wgpu backends.
fn parse_backends(v: &str) -> Result<wgpu::Backends> {
    let mut b = wgpu::Backends::empty();
    for name in v.split(',').map(|s| s.trim().to_ascii_lowercase()) {
        b |= match name.as_str() {
            "vulkan" | "vk" => wgpu::Backends::VULKAN,
            "metal" | "mtl" => wgpu::Backends::METAL,
            "dx12" | "d3d12" => wgpu::Backends::DX12,
            "gl" | "gles" | "opengl" => wgpu::Backends::GL,
            "" => continue,
            other => {
                return Err(Error::InvalidArgument {
                    op: "FERROFLOW_WGPU_BACKEND",
                    msg: format!(
                        "unknown graphics API {other:?}: expected vulkan, metal, dx12 or gl"
                    ),
                })
            }
        };
    }
    Ok(b)
}

impl WgpuBackend {
    /// Finds the adapters (opens no device yet).
    pub fn new() -> Result<WgpuBackend> {
        let backends = requested_backends()?;
        let instance = wgpu::Instance::new(wgpu::InstanceDescriptor {
            backends,
            ..wgpu::InstanceDescriptor::new_without_display_handle()
        });
        let mut adapters = pollster::block_on(instance.enumerate_adapters(backends));
        let rank = |a: &wgpu::Adapter| match a.get_info().device_type {
            wgpu::DeviceType::DiscreteGpu => 0,
            wgpu::DeviceType::IntegratedGpu => 1,
            wgpu::DeviceType::VirtualGpu => 2,
            wgpu::DeviceType::Other => 3,
            wgpu::DeviceType::Cpu => 4,
        };
        adapters.sort_by_key(rank);
        let slots = adapters
            .into_iter()
            .map(|adapter| {
                let i = adapter.get_info();
                let info = AdapterInfo {
                    name: i.name.clone(),
                    api: format!("{:?}", i.backend),
                    kind: format!("{:?}", i.device_type),
                    driver: format!("{} {}", i.driver, i.driver_info).trim().to_string(),
                    shader_f16: adapter.features().contains(wgpu::Features::SHADER_F16),
                    timestamp_query: adapter.features().contains(wgpu::Features::TIMESTAMP_QUERY),
                };
                Slot {
                    adapter,
                    info,
                    gpu: OnceLock::new(),
                }
            })
            .collect();
        Ok(WgpuBackend { slots })
    }

    /// The adapters, in device order (`/GPU:0` first).
    pub fn adapters(&self) -> Vec<AdapterInfo> {
        self.slots.iter().map(|s| s.info.clone()).collect()
    }

    fn gpu(&self, ordinal: usize) -> Result<Arc<Gpu>> {
        let slot = self
            .slots
            .get(ordinal)
            .ok_or_else(|| Error::BackendUnavailable {
                device: format!("/device:GPU:{ordinal}"),
                hint: format!("the wgpu backend found {} adapter(s)", self.slots.len()),
            })?;
        slot.gpu
            .get_or_init(|| {
                Gpu::new(&slot.adapter, ordinal)
                    .map(Arc::new)
                    .map_err(|e| e.to_string())
            })
            .clone()
            .map_err(backend_error)
    }
}

static BACKEND: OnceLock<std::result::Result<Arc<WgpuBackend>, String>> = OnceLock::new();

fn shared() -> Result<Arc<WgpuBackend>> {
    BACKEND
        .get_or_init(|| WgpuBackend::new().map(Arc::new).map_err(|e| e.to_string()))
        .clone()
        .map_err(backend_error)
}

/// Registers the wgpu backend for `/GPU:*` (idempotent) and returns how many adapters it
/// serves (0 when there is no GPU driver: GPU devices then report that as an error).
///
/// ```
/// let n = ferroflow_wgpu::register();
/// assert_eq!(n, ferroflow_wgpu::adapters().len());
/// for a in ferroflow_wgpu::adapters() {
///     println!("{} on {} ({})", a.name, a.api, a.kind);
/// }
/// ```
pub fn register() -> usize {
    match shared() {
        Ok(b) => {
            let n = b.slots.len();
            ferroflow_tensor::register_backend(DeviceKind::Gpu, b);
            n
        }
        Err(_) => 0,
    }
}

/// Kernels dispatched, host read-backs (each one a wait for the GPU) and uploads (each one a
/// new buffer) since the process started, over all wgpu devices: the numbers that decide
/// small-batch speed.
///
/// ```
/// let (kernels, reads, uploads) = ferroflow_wgpu::counters();
/// # let _ = (kernels, reads, uploads);
/// ```
pub fn counters() -> (u64, u64, u64) {
    use std::sync::atomic::Ordering::Relaxed;
    (
        gpu::DISPATCHES.load(Relaxed),
        gpu::READS.load(Relaxed),
        gpu::UPLOADS.load(Relaxed),
    )
}

/// The adapters wgpu finds, `/GPU:0` first.
///
/// ```
/// // Which GPU devices can hold float16 tensors:
/// for (i, a) in ferroflow_wgpu::adapters().iter().enumerate() {
///     println!("/GPU:{i} {}: float16 {}", a.name, a.shader_f16);
/// }
/// ```
pub fn adapters() -> Vec<AdapterInfo> {
    shared().map(|b| b.adapters()).unwrap_or_default()
}

fn boxed(b: WgpuBuffer) -> Result<BufferBox> {
    Ok(Box::new(b))
}

impl Backend for WgpuBackend {
    fn name(&self) -> &'static str {
        "wgpu"
    }
    fn device_count(&self) -> usize {
        self.slots.len()
    }
    fn device_description(&self, ordinal: usize) -> String {
        match self.slots.get(ordinal) {
            Some(s) => format!(
                "wgpu: {} ({}, {}, {})",
                s.info.name, s.info.api, s.info.kind, s.info.driver
            ),
            None => "wgpu".into(),
        }
    }
    /// The fused optimizer update and elementwise programs (one generated kernel each), for
    /// f32 (the dtype of trainable variables, also under mixed precision); the other fused
    /// kernels are composed from primitives here.
    fn has_fused(&self, _ordinal: usize, kernel: FusedKernel, dtype: DType) -> bool {
        matches!(
            kernel,
            FusedKernel::OptimizerUpdate
                | FusedKernel::Elementwise
                | FusedKernel::SparseSoftmaxCrossEntropy
                | FusedKernel::FusedMatMul
                | FusedKernel::FusedMatMulReduce
        ) && dtype == DType::F32
    }
    fn supports_dtype(&self, ordinal: usize, dtype: DType) -> bool {
        match dtype {
            DType::F32 | DType::I32 | DType::U32 | DType::Bool => true,
            DType::F16 => self.slots.get(ordinal).is_some_and(|s| s.info.shader_f16),
            _ => false,
        }
    }
    fn memory_bytes(&self, ordinal: usize) -> Option<u64> {
        // A tensor is one storage buffer: the binding limit bounds it before memory does.
        self.gpu(ordinal).ok().map(|g| g.max_binding)
    }
    fn upload(&self, ordinal: usize, data: HostData) -> Result<BufferBox> {
        boxed(kernels::movement::upload(&self.gpu(ordinal)?, data)?)
    }
    fn download(&self, x: Operand<'_>) -> Result<HostData> {
        kernels::movement::download(&In::new(x)?)
    }
    fn synchronize(&self, ordinal: usize) -> Result<()> {
        self.gpu(ordinal)?.wait()
    }
    fn copy(&self, x: Operand<'_>) -> Result<BufferBox> {
        boxed(kernels::movement::copy(&In::new(x)?)?)
    }
    fn unary(&self, op: UnaryOp, x: Operand<'_>) -> Result<BufferBox> {
        boxed(kernels::elementwise::unary(op, &In::new(x)?)?)
    }
    fn binary(&self, op: BinaryOp, lhs: Operand<'_>, rhs: Operand<'_>) -> Result<BufferBox> {
        boxed(kernels::elementwise::binary(
            op,
            &In::new(lhs)?,
            &In::new(rhs)?,
        )?)
    }
    fn reduce(&self, op: ReduceOp, x: Operand<'_>, axes: &[usize]) -> Result<BufferBox> {
        boxed(kernels::reduce::reduce(op, &In::new(x)?, axes)?)
    }
    fn arg_reduce(&self, op: ArgReduceOp, x: Operand<'_>, axis: usize) -> Result<BufferBox> {
        boxed(kernels::reduce::arg_reduce(op, &In::new(x)?, axis)?)
    }
    fn cast(&self, x: Operand<'_>, to: DType) -> Result<BufferBox> {
        boxed(kernels::elementwise::cast(&In::new(x)?, to)?)
    }
    fn matmul(&self, lhs: Operand<'_>, rhs: Operand<'_>) -> Result<BufferBox> {
        boxed(kernels::gemm::matmul(&In::new(lhs)?, &In::new(rhs)?)?)
    }
    fn select(
        &self,
        cond: Operand<'_>,
        on_true: Operand<'_>,
        on_false: Operand<'_>,
    ) -> Result<BufferBox> {
        boxed(kernels::movement::select(
            &In::new(cond)?,
            &In::new(on_true)?,
            &In::new(on_false)?,
        )?)
    }
    fn fused_matmul(
        &self,
        a: Operand<'_>,
        b: Operand<'_>,
        bias: Operand<'_>,
        activation: FusedActivation,
    ) -> Result<BufferBox> {
        boxed(kernels::gemm::fused_matmul(
            &In::new(a)?,
            &In::new(b)?,
            &In::new(bias)?,
            activation,
        )?)
    }
    fn fused_matmul_reduce(
        &self,
        a: Operand<'_>,
        b: Operand<'_>,
        program: &ElementwiseProgram,
        inputs: &[Operand<'_>],
    ) -> Result<Vec<BufferBox>> {
        let ins = inputs
            .iter()
            .map(|&x| In::new(x))
            .collect::<Result<Vec<_>>>()?;
        let one_kernel =
            kernels::gemm::fused_matmul_reduce(&In::new(a)?, &In::new(b)?, program, &ins)?;
        match one_kernel {
            Some(outputs) => Ok(outputs
                .into_iter()
                .map(|b| Box::new(b) as BufferBox)
                .collect()),
            None => {
                ferroflow_tensor::backend::matmul_then_fused_reduce(self, a, b, program, inputs)
            }
        }
    }
    fn sparse_softmax_cross_entropy(
        &self,
        logits: Operand<'_>,
        labels: Operand<'_>,
    ) -> Result<(BufferBox, BufferBox)> {
        let (loss, backprop) =
            kernels::index::sparse_softmax_cross_entropy(&In::new(logits)?, &In::new(labels)?)?;
        Ok((boxed(loss)?, boxed(backprop)?))
    }
    fn gather(&self, x: Operand<'_>, indices: Operand<'_>, axis: usize) -> Result<BufferBox> {
        boxed(kernels::index::gather(
            &In::new(x)?,
            &In::new(indices)?,
            axis,
        )?)
    }
    fn gather_group(
        &self,
        xs: &[Operand<'_>],
        indices: Operand<'_>,
        axis: usize,
    ) -> Result<Vec<BufferBox>> {
        let ins = xs.iter().map(|&x| In::new(x)).collect::<Result<Vec<_>>>()?;
        match kernels::index::gather_group(&ins, &In::new(indices)?, axis)? {
            Some(outs) => Ok(outs.into_iter().map(|b| Box::new(b) as BufferBox).collect()),
            None => ferroflow_tensor::backend::gather_each(self, xs, indices, axis),
        }
    }
    fn scatter_add(
        &self,
        indices: Operand<'_>,
        updates: Operand<'_>,
        shape: &[usize],
        axis: usize,
    ) -> Result<BufferBox> {
        boxed(kernels::index::scatter_add(
            &In::new(indices)?,
            &In::new(updates)?,
            shape,
            axis,
        )?)
    }
    fn concat(&self, inputs: &[Operand<'_>], axis: usize) -> Result<BufferBox> {
        let ins = inputs
            .iter()
            .map(|&x| In::new(x))
            .collect::<Result<Vec<_>>>()?;
        boxed(kernels::movement::concat(&ins, axis)?)
    }
    fn pad(&self, x: Operand<'_>, paddings: &[(usize, usize)], value: f64) -> Result<BufferBox> {
        boxed(kernels::movement::pad(&In::new(x)?, paddings, value)?)
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
            // A long line in chunks, not one invocation's walk down it.
            return ferroflow_tensor::backend::chunked_cumulative(
                self, op, x, axis, exclusive, reverse,
            );
        }
        boxed(kernels::scan::cumulative(
            op,
            &In::new(x)?,
            axis,
            exclusive,
            reverse,
        )?)
    }
    fn sort(
        &self,
        x: Operand<'_>,
        axis: usize,
        descending: bool,
    ) -> Result<(BufferBox, BufferBox)> {
        let (v, i) = kernels::scan::sort(&In::new(x)?, axis, descending)?;
        Ok((Box::new(v), Box::new(i)))
    }
    fn conv2d(&self, x: Operand<'_>, filter: Operand<'_>, w: &Window2d) -> Result<BufferBox> {
        boxed(kernels::gemm::conv2d(&In::new(x)?, &In::new(filter)?, w)?)
    }
    fn conv2d_backprop_input(
        &self,
        filter: Operand<'_>,
        dy: Operand<'_>,
        w: &Window2d,
    ) -> Result<BufferBox> {
        boxed(kernels::gemm::conv2d_backprop_input(
            &In::new(filter)?,
            &In::new(dy)?,
            w,
        )?)
    }
    fn conv2d_backprop_filter(
        &self,
        x: Operand<'_>,
        dy: Operand<'_>,
        filter_shape: [usize; 4],
        w: &Window2d,
    ) -> Result<BufferBox> {
        boxed(kernels::gemm::conv2d_backprop_filter(
            &In::new(x)?,
            &In::new(dy)?,
            filter_shape,
            w,
        )?)
    }
    fn pool2d(&self, kind: PoolKind, x: Operand<'_>, w: &Window2d) -> Result<BufferBox> {
        boxed(kernels::pool::pool2d(kind, &In::new(x)?, w)?)
    }
    fn max_pool_grad(&self, x: Operand<'_>, dy: Operand<'_>, w: &Window2d) -> Result<BufferBox> {
        boxed(kernels::pool::max_pool_grad(
            &In::new(x)?,
            &In::new(dy)?,
            w,
        )?)
    }
    fn avg_pool_grad(&self, dy: Operand<'_>, w: &Window2d) -> Result<BufferBox> {
        boxed(kernels::pool::avg_pool_grad(&In::new(dy)?, w)?)
    }
    fn fused_elementwise(
        &self,
        program: &ElementwiseProgram,
        inputs: &[Operand<'_>],
        shape: &[usize],
    ) -> Result<Vec<BufferBox>> {
        let ins = inputs
            .iter()
            .map(|&x| In::new(x))
            .collect::<Result<Vec<_>>>()?;
        match kernels::fused::fused_elementwise(program, &ins, shape)? {
            Some(outputs) => Ok(outputs
                .into_iter()
                .map(|b| Box::new(b) as BufferBox)
                .collect()),
            // More buffers than a kernel may bind: the ops' own kernels, step by step.
            None => program.run_op_by_op(self, inputs, shape),
        }
    }
    fn fused_reduce(
        &self,
        program: &ElementwiseProgram,
        inputs: &[Operand<'_>],
        shape: &[usize],
        op: ReduceOp,
        axes: &[usize],
    ) -> Result<Vec<BufferBox>> {
        let ins = inputs
            .iter()
            .map(|&x| In::new(x))
            .collect::<Result<Vec<_>>>()?;
        if let Some(outputs) = kernels::fused::fused_reduce(program, &ins, shape, op, axes)? {
            return Ok(outputs
                .into_iter()
                .map(|b| Box::new(b) as BufferBox)
                .collect());
        }
        // Too many bindings for one kernel: the program, then the reduction of its first
        // output.
        ferroflow_tensor::backend::program_then_reduce(self, program, inputs, shape, op, axes)
    }
    fn optimizer_update(
        &self,
        rule: &UpdateRule,
        w: Operand<'_>,
        g: Operand<'_>,
        slots: &[Operand<'_>],
    ) -> Result<(BufferBox, Vec<BufferBox>)> {
        let s = slots
            .iter()
            .map(|&x| In::new(x))
            .collect::<Result<Vec<_>>>()?;
        let (nw, ns) = kernels::optimizer::optimizer_update(rule, &In::new(w)?, &In::new(g)?, &s)?;
        Ok((
            Box::new(nw),
            ns.into_iter().map(|b| Box::new(b) as BufferBox).collect(),
        ))
    }
    fn optimizer_update_group(
        &self,
        rule: &UpdateRule,
        variables: &[UpdateOperands<'_>],
    ) -> Result<Vec<(BufferBox, Vec<BufferBox>)>> {
        let ins = variables
            .iter()
            .map(|v| {
                let slots = v
                    .slots
                    .iter()
                    .map(|&s| In::new(s))
                    .collect::<Result<Vec<_>>>()?;
                Ok((In::new(v.w)?, In::new(v.g)?, slots))
            })
            .collect::<Result<Vec<_>>>()?;
        Ok(kernels::optimizer::optimizer_update_group(rule, &ins)?
            .into_iter()
            .map(|(nw, ns)| {
                let slots = ns.into_iter().map(|b| Box::new(b) as BufferBox).collect();
                (Box::new(nw) as BufferBox, slots)
            })
            .collect())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn graphics_apis_parse_from_the_environment_form() {
        assert_eq!(parse_backends("vulkan").ok(), Some(wgpu::Backends::VULKAN));
        assert_eq!(
            parse_backends("Metal, gl").ok(),
            Some(wgpu::Backends::METAL | wgpu::Backends::GL)
        );
        assert_eq!(parse_backends("dx12,").ok(), Some(wgpu::Backends::DX12));
        let e = parse_backends("cuda")
            .expect_err("not a wgpu API")
            .to_string();
        assert!(e.contains("cuda") && e.contains("vulkan"), "{e}");
    }

    #[test]
    fn pool_size_classes_cover_the_request_and_waste_little() {
        for bytes in [
            0u64,
            1,
            15,
            16,
            17,
            4095,
            4096,
            4097,
            100_000,
            1 << 20,
            (1 << 20) + 1,
        ] {
            let c = gpu::size_class(bytes);
            assert!(c >= bytes.max(16) && c.is_multiple_of(16), "{bytes} -> {c}");
            if bytes > 4096 {
                assert!(c as f64 <= bytes as f64 * 1.126, "{bytes} -> {c}");
            }
        }
    }
}
