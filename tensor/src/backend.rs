//! The contract between ferroflow and a compute backend.
//!
//! A backend owns opaque device buffers and runs the primitive ops of [`crate::op`] on
//! them. Every kernel reads its inputs through an [`Operand`] (buffer + [`Layout`] +
//! dtype), so views (transposes, slices, broadcasts with zero strides, reversed axes) never
//! need a copy first. Kernels write a fresh, dense, row-major output buffer.
//!
//! The tensor layer does all checking (shapes, dtypes, devices, axis ranges, output sizes)
//! before calling a kernel, so a backend only computes. What a backend may still refuse
//! (a dtype it has no kernel for) it reports with [`Error::NotSupportedByBackend`]; data
//! dependent failures (an out-of-range gather index, integer division by zero) are errors too.
//!
//! ## Design
//! The trait is object safe and works on `dyn DeviceBuffer`, because the device is chosen
//! at run time (TF's model) rather than by a type parameter on `Tensor`: one `Tensor` type,
//! fast compiles, the cost being one downcast per kernel call.

use crate::dtype::{DType, HostData};
use crate::error::{Error, Result};
use crate::fused::{FusedActivation, FusedKernel, UpdateRule};
use crate::layout::Layout;
use crate::op::{ArgReduceOp, BinaryOp, CumulativeOp, PoolKind, ReduceOp, UnaryOp, Window2d};
use std::any::Any;

/// A buffer owned by a backend (host memory, a GPU allocation, ...).
pub trait DeviceBuffer: Any + Send + Sync {
    /// For the owning backend's downcast.
    fn as_any(&self) -> &dyn Any;
    /// Bytes held (for memory accounting).
    fn size_in_bytes(&self) -> usize;
    /// The elements, when the buffer is host memory the process can read in place (the
    /// CPU backend's); `None` for device memory.
    fn host_data(&self) -> Option<&HostData> {
        None
    }
}

/// One variable's operands of [`Backend::optimizer_update_group`].
#[derive(Clone)]
pub struct UpdateOperands<'a> {
    /// The variable's value.
    pub w: Operand<'a>,
    /// Its gradient.
    pub g: Operand<'a>,
    /// The rule's slots, in the rule's order.
    pub slots: Vec<Operand<'a>>,
}

/// One kernel input: a buffer read through a layout.
#[derive(Clone, Copy)]
pub struct Operand<'a> {
    /// The buffer.
    pub buffer: &'a dyn DeviceBuffer,
    /// How the view's elements sit in it.
    pub layout: &'a Layout,
    /// The element type.
    pub dtype: DType,
}

impl Operand<'_> {
    /// The view's shape.
    pub fn shape(&self) -> &[usize] {
        self.layout.shape()
    }
}

/// A fresh output buffer of a kernel.
pub type BufferBox = Box<dyn DeviceBuffer>;

/// Builds the "not supported" error for a backend.
pub fn unsupported(backend: &'static str, op: &'static str, dtype: DType) -> Error {
    Error::NotSupportedByBackend {
        op,
        backend,
        detail: format!(", no kernel for dtype {dtype}"),
    }
}

/// A compute backend. See the module docs for the contract every method follows.
pub trait Backend: Send + Sync + 'static {
    /// Short name (`cpu`, `wgpu`, `cuda`).
    fn name(&self) -> &'static str;
    /// Number of devices this backend serves.
    fn device_count(&self) -> usize;
    /// Copies host data into a new buffer on device `ordinal`.
    fn upload(&self, ordinal: usize, data: HostData) -> Result<BufferBox>;
    /// Reads a view back to the host, dense and in row-major order of the view.
    fn download(&self, x: Operand<'_>) -> Result<HostData>;
    /// What device `ordinal` is, for [`crate::list_devices`] (the adapter, driver, API).
    fn device_description(&self, _ordinal: usize) -> String {
        self.name().to_string()
    }
    /// Whether device `ordinal` stores and computes `dtype` (the conformance suite checks
    /// the dtypes a device supports and that the others fail with a clear error).
    fn supports_dtype(&self, _ordinal: usize, _dtype: DType) -> bool {
        true
    }
    /// Whether device `ordinal` has the fused kernel `kernel` for `dtype` (see
    /// [`crate::fused`]): the tensor methods call a fused kernel only where this says yes and
    /// compose primitives elsewhere, and a fused kernel's errors are then real errors. The
    /// default: no fused kernels.
    fn has_fused(&self, _ordinal: usize, _kernel: FusedKernel, _dtype: DType) -> bool {
        false
    }
    /// The largest tensor, in bytes, device `ordinal` can hold (its memory, or the largest
    /// buffer it can allocate): bigger outputs are refused with
    /// [`Error::ResourceExhausted`] before any kernel runs. `None` leaves only the
    /// address-space bound.
    fn memory_bytes(&self, _ordinal: usize) -> Option<u64> {
        None
    }
    /// Whether device `ordinal` can allocate `bytes` now: asked (after the size passed
    /// [`Backend::memory_bytes`]) before an op's kernel allocates a large output, so an
    /// allocation the allocator would refuse is [`Error::ResourceExhausted`] rather than an
    /// abort inside the kernel. The default says yes.
    fn can_allocate(&self, _ordinal: usize, _bytes: u64) -> bool {
        true
    }
    /// Waits for queued work on device `ordinal` (for timing); a no-op for synchronous backends.
    fn synchronize(&self, _ordinal: usize) -> Result<()> {
        Ok(())
    }

    /// Dense copy of a view.
    fn copy(&self, x: Operand<'_>) -> Result<BufferBox>;
    /// Elementwise unary op; output dtype per [`UnaryOp::output_dtype`].
    fn unary(&self, op: UnaryOp, x: Operand<'_>) -> Result<BufferBox>;
    /// Elementwise binary op; both layouts already have the output shape (broadcast axes
    /// have stride 0) and the same dtype.
    fn binary(&self, op: BinaryOp, lhs: Operand<'_>, rhs: Operand<'_>) -> Result<BufferBox>;
    /// Reduces over sorted, distinct `axes`; the output has the remaining axes.
    fn reduce(&self, op: ReduceOp, x: Operand<'_>, axes: &[usize]) -> Result<BufferBox>;
    /// Index (int64) of the max/min along `axis` (non-empty); the output drops `axis`.
    fn arg_reduce(&self, op: ArgReduceOp, x: Operand<'_>, axis: usize) -> Result<BufferBox>;
    /// Converts every element to `to` (floats to ints truncate toward zero and saturate).
    fn cast(&self, x: Operand<'_>, to: DType) -> Result<BufferBox>;
    /// `[..batch, m, k] x [..batch, k, n]`, both with the same batch shape (broadcast batch
    /// axes have stride 0; transposes are in the layouts).
    fn matmul(&self, lhs: Operand<'_>, rhs: Operand<'_>) -> Result<BufferBox>;
    /// `cond ? on_true : on_false`, all three layouts with the output shape.
    fn select(
        &self,
        cond: Operand<'_>,
        on_true: Operand<'_>,
        on_false: Operand<'_>,
    ) -> Result<BufferBox>;
    /// Output shape `x[..axis] ++ indices ++ x[axis+1..]`; indices are int32/int64.
    fn gather(&self, x: Operand<'_>, indices: Operand<'_>, axis: usize) -> Result<BufferBox>;
    /// [`Backend::gather`] of each of `xs` by the same `indices` along `axis` (every `xs`
    /// as long along it), one kernel where the backend can: what `fit` does to a batch's
    /// inputs and targets. The default gathers them one by one.
    fn gather_group(
        &self,
        xs: &[Operand<'_>],
        indices: Operand<'_>,
        axis: usize,
    ) -> Result<Vec<BufferBox>> {
        gather_each(self, xs, indices, axis)
    }
    /// Adjoint of gather: zeros of `shape`, then `out[.., indices[j], ..] += updates[.., j, ..]`.
    fn scatter_add(
        &self,
        indices: Operand<'_>,
        updates: Operand<'_>,
        shape: &[usize],
        axis: usize,
    ) -> Result<BufferBox>;
    /// Concatenates along `axis` (shapes agree elsewhere, same dtype).
    fn concat(&self, inputs: &[Operand<'_>], axis: usize) -> Result<BufferBox>;
    /// Pads each axis with `value`.
    fn pad(&self, x: Operand<'_>, paddings: &[(usize, usize)], value: f64) -> Result<BufferBox>;
    /// Running sum/product along `axis`.
    fn cumulative(
        &self,
        op: CumulativeOp,
        x: Operand<'_>,
        axis: usize,
        exclusive: bool,
        reverse: bool,
    ) -> Result<BufferBox>;
    /// Stable sort along `axis`: (values, int32 indices). NaNs sort as the largest values.
    fn sort(&self, x: Operand<'_>, axis: usize, descending: bool)
        -> Result<(BufferBox, BufferBox)>;
    /// NHWC conv2d with an HWIO filter.
    fn conv2d(&self, x: Operand<'_>, filter: Operand<'_>, w: &Window2d) -> Result<BufferBox>;
    /// Gradient of conv2d w.r.t. the input (shape `w.input`).
    fn conv2d_backprop_input(
        &self,
        filter: Operand<'_>,
        dy: Operand<'_>,
        w: &Window2d,
    ) -> Result<BufferBox>;
    /// Gradient of conv2d w.r.t. the filter (shape [kh, kw, cin, cout]).
    fn conv2d_backprop_filter(
        &self,
        x: Operand<'_>,
        dy: Operand<'_>,
        filter_shape: [usize; 4],
        w: &Window2d,
    ) -> Result<BufferBox>;
    /// Max/avg pooling (NHWC).
    fn pool2d(&self, kind: PoolKind, x: Operand<'_>, w: &Window2d) -> Result<BufferBox>;
    /// Gradient of max pooling: dy routed to the first maximum of each window.
    fn max_pool_grad(&self, x: Operand<'_>, dy: Operand<'_>, w: &Window2d) -> Result<BufferBox>;
    /// Gradient of average pooling.
    fn avg_pool_grad(&self, dy: Operand<'_>, w: &Window2d) -> Result<BufferBox>;

    /// Fused `activation(conv2d(x, filter) + bias)` (`bias` `[cout]`), called where
    /// [`Backend::has_fused`] says so; elsewhere [`crate::Tensor::fused_conv2d`] composes
    /// `conv2d`, `add` and `relu`.
    fn fused_conv2d(
        &self,
        _x: Operand<'_>,
        _filter: Operand<'_>,
        _bias: Operand<'_>,
        _w: &Window2d,
        _activation: FusedActivation,
    ) -> Result<BufferBox> {
        Err(Error::NotSupportedByBackend {
            op: "fused_conv2d",
            backend: self.name(),
            detail: ", it declares no such fused kernel (`Backend::has_fused`)".into(),
        })
    }

    /// [`Backend::fused_conv2d`] and the max pooling (window `pool`, as
    /// [`Backend::pool2d`] gets it) of its result: `(y, pooled)`, each equal to what those
    /// two kernels give, bit for bit, without reading `y` back from memory for the pooling.
    /// Called where [`Backend::has_fused`] declares [`FusedKernel::FusedConv2dMaxPool`];
    /// elsewhere [`crate::Tensor::fused_conv2d_max_pool`] composes the two. The default runs
    /// the two kernels ([`fused_conv2d_then_max_pool`]).
    fn fused_conv2d_max_pool(
        &self,
        x: Operand<'_>,
        filter: Operand<'_>,
        bias: Operand<'_>,
        w: &Window2d,
        activation: FusedActivation,
        pool: &Window2d,
    ) -> Result<(BufferBox, BufferBox)> {
        fused_conv2d_then_max_pool(self, x, filter, bias, w, activation, pool)
    }

    /// Fused gradients of `activation(x + bias)` from the output gradient `g` and the output
    /// `y` (same shape): `(dx, dbias)` with `dbias` summed over every axis but the last, in
    /// one pass. Called where [`Backend::has_fused`] declares
    /// [`FusedKernel::BiasActivationGrad`]; elsewhere [`crate::Tensor::bias_activation_grad`]
    /// composes `relu_grad` and `reduce_sum`. The default is [`Backend::fused_reduce`] of
    /// the program `relu_grad(g, y)` with its result both stored (dx) and summed (dbias),
    /// which spreads the rows over the device as the reductions do (for
    /// [`FusedActivation::Linear`], dx being `g`, a copy and a reduction): a backend with
    /// [`FusedKernel::Elementwise`] may declare this kernel without writing one.
    fn bias_activation_grad(
        &self,
        g: Operand<'_>,
        y: Operand<'_>,
        activation: FusedActivation,
    ) -> Result<(BufferBox, BufferBox)> {
        let shape = g.layout.shape();
        let lead: Vec<usize> = (0..shape.len().saturating_sub(1)).collect();
        if activation == FusedActivation::Linear {
            let db = self.reduce(ReduceOp::ReduceSum, g, &lead)?;
            return Ok((self.copy(g)?, db));
        }
        let program = crate::fused::ElementwiseProgram {
            num_inputs: 2,
            steps: vec![crate::fused::ElementwiseStep::Binary(
                BinaryOp::ReluGrad,
                0,
                1,
            )],
            outputs: vec![2, 2],
        };
        let mut out = self.fused_reduce(&program, &[g, y], shape, ReduceOp::ReduceSum, &lead)?;
        match (out.pop(), out.pop()) {
            (Some(dx), Some(db)) if out.is_empty() => Ok((dx, db)),
            _ => Err(Error::Backend {
                backend: self.name(),
                msg: "bias_activation_grad: the fused reduction returned no dx or no dbias".into(),
            }),
        }
    }

    /// The gradients of `max_pool(activation(x + bias))`: from the pool's input `y`
    /// (`[n, h, w, c]`, the activation's output) and the pooled output's gradient `dy`,
    /// `(dx, dbias)` equal to [`Backend::max_pool_grad`] followed by
    /// [`Backend::bias_activation_grad`] on the same `y`, bit for bit, without storing the
    /// pooling gradient between them. Called where [`Backend::has_fused`] declares
    /// [`FusedKernel::MaxPoolBiasActivationGrad`]; elsewhere
    /// [`crate::Tensor::max_pool_bias_activation_grad`] composes the two. The default runs
    /// the two kernels ([`max_pool_then_bias_activation_grad`]).
    fn max_pool_bias_activation_grad(
        &self,
        y: Operand<'_>,
        dy: Operand<'_>,
        w: &Window2d,
        activation: FusedActivation,
    ) -> Result<(BufferBox, BufferBox)> {
        max_pool_then_bias_activation_grad(self, y, dy, w, activation)
    }

    /// `activation(a @ b + bias)` for float operands laid out as [`Backend::matmul`] gets
    /// them (batch axes broadcast) and a bias vector along the output's last axis, the bias
    /// and activation applied as the product is stored (ReLU keeps NaN, as the `relu`
    /// kernel). Called where [`Backend::has_fused`] says so; elsewhere
    /// [`crate::Tensor::fused_matmul`] composes `matmul`, `add` and `relu`.
    fn fused_matmul(
        &self,
        _a: Operand<'_>,
        _b: Operand<'_>,
        _bias: Operand<'_>,
        _activation: FusedActivation,
    ) -> Result<BufferBox> {
        Err(Error::NotSupportedByBackend {
            op: "fused_matmul",
            backend: self.name(),
            detail: ", it declares no such fused kernel (`Backend::has_fused`)".into(),
        })
    }

    /// Softmax cross-entropy of `logits` (`[.., classes]`, f32 or f64) against int32 or
    /// int64 `labels` (its shape without the class axis): `(loss, backprop)`, the loss per
    /// row and `softmax(logits) - one_hot(labels)`, in one pass per row; a label outside
    /// `[0, classes)` is [`Error::IndexOutOfRange`] naming
    /// `sparse_softmax_cross_entropy_with_logits`. Called where [`Backend::has_fused`]
    /// says so; elsewhere [`crate::Tensor::sparse_softmax_cross_entropy_with_logits`]
    /// composes `log_softmax`.
    fn sparse_softmax_cross_entropy(
        &self,
        _logits: Operand<'_>,
        _labels: Operand<'_>,
    ) -> Result<(BufferBox, BufferBox)> {
        Err(Error::NotSupportedByBackend {
            op: "sparse_softmax_cross_entropy",
            backend: self.name(),
            detail: ", it declares no such fused kernel (`Backend::has_fused`)".into(),
        })
    }

    /// Fused `min(max(x, min), max)` with constant bounds (NaN stays NaN), called where
    /// [`Backend::has_fused`] says so; elsewhere [`crate::Tensor::clip_scalar`] composes
    /// `maximum` and `minimum`.
    fn clip_scalar(&self, _x: Operand<'_>, _min: f64, _max: f64) -> Result<BufferBox> {
        Err(Error::NotSupportedByBackend {
            op: "clip_scalar",
            backend: self.name(),
            detail: ", it declares no such fused kernel (`Backend::has_fused`)".into(),
        })
    }

    /// The discrete Fourier transform of each row along the last axis of a dense or strided
    /// complex view (TF's `FFT`: unscaled), or with `inverse` its inverse (`IFFT`: scaled
    /// by 1/n). Backends without complex kernels keep this default, an error naming them.
    fn fft(&self, x: Operand<'_>, inverse: bool) -> Result<BufferBox> {
        Err(unsupported(
            self.name(),
            if inverse { "ifft" } else { "fft" },
            x.dtype,
        ))
    }

    /// Runs an elementwise `program` over `inputs` broadcast to `shape` (each input's
    /// dtype the same float dtype), one buffer of `shape` per program output; called where
    /// [`Backend::has_fused`] says so, elsewhere [`crate::Tensor::fused_elementwise`]
    /// composes the program's ops.
    fn fused_elementwise(
        &self,
        _program: &crate::fused::ElementwiseProgram,
        _inputs: &[Operand<'_>],
        _shape: &[usize],
    ) -> Result<Vec<BufferBox>> {
        Err(Error::NotSupportedByBackend {
            op: "fused_elementwise",
            backend: self.name(),
            detail: ", it declares no such fused kernel (`Backend::has_fused`)".into(),
        })
    }

    /// Runs an elementwise `program` over `inputs` broadcast to `shape` and reduces its
    /// first output over `axes` (sorted, in range): `[the reduction (its kept dimensions,
    /// dense), one buffer of `shape` per other program output]`; called where
    /// [`Backend::has_fused`] declares [`crate::FusedKernel::Elementwise`]. The default runs
    /// [`Backend::fused_elementwise`] and then [`Backend::reduce`] on its first output, so a
    /// backend with the fused program has this too; one with a faster pass (the program
    /// inlined into the reduction's loads) overrides it and must give the same bits.
    fn fused_reduce(
        &self,
        program: &crate::fused::ElementwiseProgram,
        inputs: &[Operand<'_>],
        shape: &[usize],
        op: crate::op::ReduceOp,
        axes: &[usize],
    ) -> Result<Vec<BufferBox>> {
        program_then_reduce(self, program, inputs, shape, op, axes)
    }

    /// The product `a @ b` (rank 2, float; operands through their layouts, transposes as
    /// strides) run through `program` as register 0, with `inputs` as registers 1.. (each
    /// broadcast to the product's shape), the program's first output summed over the rows:
    /// `[the column sums ([n]), the program's other outputs ([m, n])..]`. Called only where
    /// [`Backend::has_fused`] declares [`FusedKernel::FusedMatMulReduce`]; the default runs
    /// the product, then [`Backend::fused_reduce`].
    fn fused_matmul_reduce(
        &self,
        a: Operand<'_>,
        b: Operand<'_>,
        program: &crate::fused::ElementwiseProgram,
        inputs: &[Operand<'_>],
    ) -> Result<Vec<BufferBox>> {
        matmul_then_fused_reduce(self, a, b, program, inputs)
    }

    /// Draws `distribution` for `seed` into a new buffer of `dtype` holding `n` values on
    /// device `ordinal`: the numbers the host draws ([`crate::random::Philox`], element `i`
    /// from its own words of the stream), generated where they are used instead of drawn
    /// on the host and uploaded. Called after the distribution and dtype were checked;
    /// `None` (the default) where the backend has no generator for them, and the host draws.
    fn random(
        &self,
        _ordinal: usize,
        _distribution: &crate::op::RandomDistribution,
        _n: usize,
        _seed: [u64; 2],
        _dtype: DType,
    ) -> Option<Result<BufferBox>> {
        None
    }

    /// Fused optimizer step over same-shaped `w`, `g` and the rule's slots (one pass instead
    /// of a chain of temporaries), returning `(w', slots')`; called where
    /// [`Backend::has_fused`] says so, elsewhere optimizers compose primitives.
    fn optimizer_update(
        &self,
        _rule: &UpdateRule,
        _w: Operand<'_>,
        _g: Operand<'_>,
        _slots: &[Operand<'_>],
    ) -> Result<(BufferBox, Vec<BufferBox>)> {
        Err(Error::NotSupportedByBackend {
            op: "optimizer_update",
            backend: self.name(),
            detail: ", it declares no such fused kernel (`Backend::has_fused`)".into(),
        })
    }

    /// [`Backend::optimizer_update`] for several variables by one rule (each variable's
    /// operands one shape, all one dtype and device), in order; declared by
    /// [`crate::FusedKernel::OptimizerUpdate`]. The default updates them one by one; a
    /// backend whose launches cost more than the arithmetic (a GPU, for the small variables
    /// of a model) updates them in one kernel, giving the same bits.
    fn optimizer_update_group(
        &self,
        rule: &UpdateRule,
        variables: &[UpdateOperands<'_>],
    ) -> Result<Vec<(BufferBox, Vec<BufferBox>)>> {
        variables
            .iter()
            .map(|v| self.optimizer_update(rule, v.w, v.g, &v.slots))
            .collect()
    }
}

/// [`Backend::fused_conv2d`], then [`Backend::pool2d`] (max) of its result: the
/// [`Backend::fused_conv2d_max_pool`] default, and the fallback of a backend whose one-pass
/// version does not take these operands.
///
/// ```
/// use ferroflow_tensor::backend::fused_conv2d_then_max_pool;
/// use ferroflow_tensor::{Backend, BufferBox, FusedActivation, Operand, Result, Window2d};
/// fn fallback(
///     backend: &dyn Backend,
///     [x, filter, bias]: [Operand<'_>; 3],
///     w: &Window2d,
///     pool: &Window2d,
/// ) -> Result<(BufferBox, BufferBox)> {
///     fused_conv2d_then_max_pool(backend, x, filter, bias, w, FusedActivation::Relu, pool)
/// }
/// ```
pub fn fused_conv2d_then_max_pool<B: Backend + ?Sized>(
    backend: &B,
    x: Operand<'_>,
    filter: Operand<'_>,
    bias: Operand<'_>,
    w: &Window2d,
    activation: FusedActivation,
    pool: &Window2d,
) -> Result<(BufferBox, BufferBox)> {
    let y = backend.fused_conv2d(x, filter, bias, w, activation)?;
    let pooled = max_pool_stored(backend, &y, x.dtype, pool)?;
    Ok((y, pooled))
}

/// [`Backend::pool2d`] (max, windows `pool`) of `y`, a dense `pool.input`-shaped buffer of
/// `dtype` this backend made: the second half of [`fused_conv2d_then_max_pool`], for a
/// backend whose fused kernel pools only some convolutions as it writes them.
///
/// ```
/// use ferroflow_tensor::backend::max_pool_stored;
/// use ferroflow_tensor::{Backend, BufferBox, DType, Result, Window2d};
/// fn pool(backend: &dyn Backend, y: &BufferBox, w: &Window2d) -> Result<BufferBox> {
///     max_pool_stored(backend, y, DType::F32, w)
/// }
/// ```
pub fn max_pool_stored<B: Backend + ?Sized>(
    backend: &B,
    y: &BufferBox,
    dtype: DType,
    pool: &Window2d,
) -> Result<BufferBox> {
    let layout = Layout::contiguous(&pool.input);
    backend.pool2d(
        PoolKind::MaxPool2d,
        Operand {
            buffer: y.as_ref(),
            layout: &layout,
            dtype,
        },
        pool,
    )
}

/// [`Backend::max_pool_grad`], then [`Backend::bias_activation_grad`] of its result with
/// the same `y`: the [`Backend::max_pool_bias_activation_grad`] default, and the fallback of
/// a backend whose one-pass version does not take these windows or this dtype.
///
/// ```
/// use ferroflow_tensor::backend::max_pool_then_bias_activation_grad;
/// use ferroflow_tensor::{Backend, BufferBox, FusedActivation, Operand, Result, Window2d};
/// fn fallback(
///     backend: &dyn Backend,
///     y: Operand<'_>,
///     dy: Operand<'_>,
///     w: &Window2d,
/// ) -> Result<(BufferBox, BufferBox)> {
///     max_pool_then_bias_activation_grad(backend, y, dy, w, FusedActivation::Relu)
/// }
/// ```
pub fn max_pool_then_bias_activation_grad<B: Backend + ?Sized>(
    backend: &B,
    y: Operand<'_>,
    dy: Operand<'_>,
    w: &Window2d,
    activation: FusedActivation,
) -> Result<(BufferBox, BufferBox)> {
    let g = backend.max_pool_grad(y, dy, w)?;
    let layout = Layout::contiguous(y.shape());
    let g = Operand {
        buffer: g.as_ref(),
        layout: &layout,
        dtype: y.dtype,
    };
    backend.bias_activation_grad(g, y, activation)
}

/// [`Backend::gather`] of each of `xs` in turn: the [`Backend::gather_group`] default, and
/// the fallback of a backend whose one-kernel version cannot take the group.
///
/// ```
/// use ferroflow_tensor::backend::gather_each;
/// use ferroflow_tensor::{Backend, BufferBox, Operand, Result};
/// fn fallback(
///     backend: &dyn Backend,
///     xs: &[Operand<'_>],
///     indices: Operand<'_>,
///     axis: usize,
/// ) -> Result<Vec<BufferBox>> {
///     gather_each(backend, xs, indices, axis)
/// }
/// ```
pub fn gather_each<B: Backend + ?Sized>(
    backend: &B,
    xs: &[Operand<'_>],
    indices: Operand<'_>,
    axis: usize,
) -> Result<Vec<BufferBox>> {
    xs.iter()
        .map(|&x| backend.gather(x, indices, axis))
        .collect()
}

/// The product through [`Backend::matmul`], then [`Backend::fused_reduce`] of the program
/// over its rows with the product as register 0: what [`Backend::fused_matmul_reduce`]
/// returns. The trait's default, and the fallback of a backend whose one-kernel version
/// cannot take a product (a shape or program it has no kernel for).
///
/// ```
/// use ferroflow_tensor::backend::matmul_then_fused_reduce;
/// use ferroflow_tensor::{fused::ElementwiseProgram, Backend, BufferBox, Operand, Result};
/// fn fallback(
///     backend: &dyn Backend,
///     a: Operand<'_>,
///     b: Operand<'_>,
///     program: &ElementwiseProgram,
///     inputs: &[Operand<'_>],
/// ) -> Result<Vec<BufferBox>> {
///     matmul_then_fused_reduce(backend, a, b, program, inputs)
/// }
/// ```
pub fn matmul_then_fused_reduce<B: Backend + ?Sized>(
    backend: &B,
    a: Operand<'_>,
    b: Operand<'_>,
    program: &crate::fused::ElementwiseProgram,
    inputs: &[Operand<'_>],
) -> Result<Vec<BufferBox>> {
    let (&[m, _], &[_, n]) = (a.layout.shape(), b.layout.shape()) else {
        return Err(Error::invalid(
            "fused_matmul_reduce",
            format!(
                "operands of rank 2 needed, got {:?} and {:?}",
                a.layout.shape(),
                b.layout.shape()
            ),
        ));
    };
    let product = backend.matmul(a, b)?;
    let layout = Layout::contiguous(&[m, n]);
    let mut operands = vec![Operand {
        buffer: product.as_ref(),
        layout: &layout,
        dtype: a.dtype,
    }];
    operands.extend_from_slice(inputs);
    backend.fused_reduce(program, &operands, &[m, n], ReduceOp::ReduceSum, &[0])
}

/// Lines longer than this are what [`chunked_cumulative`] is for: a GPU backend scanning
/// such a line in one thread runs it at one thread's speed.
pub const SCAN_LINE_MAX: usize = 4096;

/// A running sum or product along `axis` (`Backend::cumulative`) for backends whose
/// threads are many and slow (GPUs), where one thread per line leaves a long line to one of
/// them: the line is cut into chunks of about √m (a divisor of m where one is near, else
/// ⌈√m⌉ with the last chunk padded with the identity), every chunk is scanned by
/// [`Backend::cumulative`] (`exclusive` and `reverse` as asked), the chunks' totals are
/// reduced ([`Backend::reduce`]) and scanned, exclusively, in the same direction, and each
/// chunk's values are combined with the totals before it ([`Backend::binary`]): about 2√m
/// dependent steps instead of m, in four kernels (six where the input is a strided view or
/// the line needs padding: a dense copy first, the padding cut off last). Integer
/// results are the one-thread scan's (wrapping sums and products are associative); float
/// ones round in another order, within the scan's usual error (TensorFlow's GPU scans do
/// not round as its CPU kernels do either). `x` has elements (an empty tensor is the
/// caller's to answer: this calls the backend's own `cumulative` on shorter lines).
///
/// ```
/// use ferroflow_tensor::backend::{chunked_cumulative, SCAN_LINE_MAX};
/// use ferroflow_tensor::{op::CumulativeOp, Backend, BufferBox, Operand, Result};
/// // A GPU backend's `cumulative`: its one-thread-per-line kernel for short lines.
/// fn cumulative(
///     backend: &dyn Backend,
///     x: Operand<'_>,
///     axis: usize,
///     per_line: impl FnOnce() -> Result<BufferBox>,
/// ) -> Result<BufferBox> {
///     if x.layout.shape()[axis] > SCAN_LINE_MAX && x.layout.num_elements() > 0 {
///         return chunked_cumulative(backend, CumulativeOp::Cumsum, x, axis, false, false);
///     }
///     per_line()
/// }
/// ```
pub fn chunked_cumulative<B: Backend + ?Sized>(
    backend: &B,
    op: CumulativeOp,
    x: Operand<'_>,
    axis: usize,
    exclusive: bool,
    reverse: bool,
) -> Result<BufferBox> {
    let shape = x.layout.shape();
    let m = shape[axis];
    let outer: usize = shape[..axis].iter().product();
    let inner: usize = shape[axis + 1..].iter().product();
    let chunk = scan_chunk(m);
    let chunks = m.div_ceil(chunk);
    let padded_len = chunks * chunk;
    let (identity, reduce, combine) = match op {
        CumulativeOp::Cumsum => (0.0, ReduceOp::ReduceSum, BinaryOp::Add),
        CumulativeOp::Cumprod => (1.0, ReduceOp::ReduceProd, BinaryOp::Mul),
    };
    let dtype = x.dtype;
    fn on<'a>(buffer: &'a dyn DeviceBuffer, layout: &'a Layout, dtype: DType) -> Operand<'a> {
        Operand {
            buffer,
            layout,
            dtype,
        }
    }
    // The lines as [outer, chunks, chunk, inner]: `x` itself where it is dense and the
    // chunks divide its lines, else a dense copy padded with the identity.
    let split_shape = [outer, chunks, chunk, inner];
    let padded;
    let (source, split): (&dyn DeviceBuffer, Layout) = match x.layout.contiguous_range() {
        Some((offset, _)) if padded_len == m => (
            x.buffer,
            Layout::new(
                split_shape.to_vec(),
                crate::layout::contiguous_strides(&split_shape),
                offset,
            ),
        ),
        _ => {
            let mut paddings = vec![(0, 0); shape.len()];
            paddings[axis] = (0, padded_len - m);
            padded = backend.pad(x, &paddings, identity)?;
            (padded.as_ref(), Layout::contiguous(&split_shape))
        }
    };
    let source = on(source, &split, dtype);
    let local = backend.cumulative(op, source, 2, exclusive, reverse)?;
    let totals = backend.reduce(reduce, source, &[2])?;
    let before = backend.cumulative(
        op,
        on(
            totals.as_ref(),
            &Layout::contiguous(&[outer, chunks, inner]),
            dtype,
        ),
        1,
        true,
        reverse,
    )?;
    // The totals before each chunk, spread along it.
    let spread = Layout::new(
        vec![outer, chunks, chunk, inner],
        vec![(chunks * inner) as isize, inner as isize, 0, 1],
        0,
    );
    let combined = backend.binary(
        combine,
        on(before.as_ref(), &spread, dtype),
        on(local.as_ref(), &Layout::contiguous(&split_shape), dtype),
    )?;
    if padded_len == m {
        return Ok(combined);
    }
    let first_m = Layout::contiguous(&[outer, padded_len, inner]).slice_steps(
        &[0, 0, 0],
        &[outer, m, inner],
        &[1, 1, 1],
    );
    backend.copy(on(combined.as_ref(), &first_m, dtype))
}

/// The chunk length [`chunked_cumulative`] cuts a line of `m` into: a divisor of `m` within
/// a factor of two of √m where there is one (no padding, and a dense input is read in
/// place), else ⌈√m⌉ (the last chunk padded).
fn scan_chunk(m: usize) -> usize {
    let root = ((m as f64).sqrt().ceil() as usize).max(1);
    (root.div_ceil(2).max(1)..=root * 2)
        .filter(|&d| m.is_multiple_of(d))
        .min_by_key(|d| d.abs_diff(root))
        .unwrap_or(root)
}

/// `program` through [`Backend::fused_elementwise`], then `op` over `axes` of its first
/// output with [`Backend::reduce`]: `[the reduction, the program's other outputs]`, as
/// [`Backend::fused_reduce`] returns them. The trait's default, and the fallback of a
/// backend whose one-kernel version cannot take a program (too many bindings, a dtype it
/// has no kernel for).
///
/// ```
/// use ferroflow_tensor::backend::program_then_reduce;
/// use ferroflow_tensor::{fused::ElementwiseProgram, op::ReduceOp};
/// use ferroflow_tensor::{Backend, BufferBox, Operand, Result};
/// // A backend's `fused_reduce` where its one-kernel version cannot take the program:
/// fn fallback(
///     backend: &dyn Backend,
///     program: &ElementwiseProgram,
///     inputs: &[Operand<'_>],
///     shape: &[usize],
///     op: ReduceOp,
///     axes: &[usize],
/// ) -> Result<Vec<BufferBox>> {
///     program_then_reduce(backend, program, inputs, shape, op, axes)
/// }
/// ```
pub fn program_then_reduce<B: Backend + ?Sized>(
    backend: &B,
    program: &crate::fused::ElementwiseProgram,
    inputs: &[Operand<'_>],
    shape: &[usize],
    op: crate::op::ReduceOp,
    axes: &[usize],
) -> Result<Vec<BufferBox>> {
    let mut outputs = backend
        .fused_elementwise(program, inputs, shape)?
        .into_iter();
    let first = outputs.next().ok_or_else(|| Error::Backend {
        backend: backend.name(),
        msg: "fused_elementwise returned no buffer".into(),
    })?;
    // A program computes in one dtype, its inputs'.
    let dtype = inputs.first().map_or(DType::F32, |x| x.dtype);
    let layout = crate::Layout::contiguous(shape);
    let reduced = backend.reduce(
        op,
        Operand {
            buffer: first.as_ref(),
            layout: &layout,
            dtype,
        },
        axes,
    )?;
    Ok(std::iter::once(reduced).chain(outputs).collect())
}
