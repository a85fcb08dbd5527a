//! The op vocabulary: every primitive op as data, with its TensorFlow name.
//!
//! Backends implement these; gradient functions, the profiler and tracers match on [`Op`]
//! (which also names the optional fused kernels of [`crate::fused`], so observers see them).
//! Everything else (softmax, one_hot, top_k, gather_nd, logsumexp, ...) is composed from
//! them in [`crate::ops`]. The primitive count is stated in the crate docs; keep it small.

use crate::dtype::DType;
use crate::error::{Error, Result};
use crate::fused::{FusedActivation, UpdateRule};

macro_rules! op_enum {
    ($(#[$m:meta])* $name:ident { $($(#[$vm:meta])* $v:ident => $s:literal),* $(,)? }) => {
        $(#[$m])*
        #[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
        #[cfg_attr(feature = "serde", derive(serde::Serialize, serde::Deserialize))]
        pub enum $name { $($(#[$vm])* $v),* }
        impl $name {
            /// Every variant.
            pub const ALL: &'static [$name] = &[$($name::$v),*];
            /// TensorFlow's snake_case name.
            pub fn name(self) -> &'static str { match self { $($name::$v => $s),* } }
        }
    };
}

op_enum!(
    /// Elementwise unary primitives.
    UnaryOp {
        /// -x
        Neg => "neg",
        /// |x|
        Abs => "abs",
        /// -1, 0 or 1 (NaN stays NaN)
        Sign => "sign",
        /// e^x
        Exp => "exp",
        /// e^x - 1
        Expm1 => "expm1",
        /// ln x
        Log => "log",
        /// ln(1 + x)
        Log1p => "log1p",
        /// √x
        Sqrt => "sqrt",
        /// 1/√x
        Rsqrt => "rsqrt",
        /// x²
        Square => "square",
        /// 1/x
        Reciprocal => "reciprocal",
        /// sin x
        Sin => "sin",
        /// cos x
        Cos => "cos",
        /// tan x
        Tan => "tan",
        /// asin x
        Asin => "asin",
        /// acos x
        Acos => "acos",
        /// atan x
        Atan => "atan",
        /// sinh x
        Sinh => "sinh",
        /// cosh x
        Cosh => "cosh",
        /// tanh x
        Tanh => "tanh",
        /// 1/(1+e^-x)
        Sigmoid => "sigmoid",
        /// the error function
        Erf => "erf",
        /// ⌊x⌋
        Floor => "floor",
        /// ⌈x⌉
        Ceil => "ceil",
        /// round half to even (TF `round`)
        Round => "round",
        /// max(x, 0)
        Relu => "relu",
        /// finite? (bool output)
        IsFinite => "is_finite",
        /// NaN? (bool output)
        IsNan => "is_nan",
        /// !x (bool)
        LogicalNot => "logical_not",
        /// the complex conjugate (the identity on real numbers)
        Conj => "conj",
        /// the real part (complex in, its float type out; the identity on real numbers)
        Real => "real",
        /// the imaginary part (complex in, its float type out; zeros for real numbers)
        Imag => "imag",
        /// the argument atan2(im, re) (complex in, float out; real numbers: 0, or π where
        /// negative, as TF's `angle`)
        Angle => "angle",
    }
);

impl UnaryOp {
    /// Ops defined on integers too (the rest need a float dtype, or bool for logical_not).
    pub fn accepts_int(self) -> bool {
        matches!(
            self,
            UnaryOp::Neg | UnaryOp::Abs | UnaryOp::Sign | UnaryOp::Square | UnaryOp::Relu
        )
    }
    /// Ops defined on complex numbers (CPU backend). Abs of a complex number is its
    /// modulus (a float), as TF's `ComplexAbs`.
    pub fn accepts_complex(self) -> bool {
        use UnaryOp::*;
        matches!(
            self,
            Neg | Abs
                | Sign
                | Exp
                | Expm1
                | Log
                | Log1p
                | Sqrt
                | Rsqrt
                | Square
                | Reciprocal
                | Sin
                | Cos
                | Tan
                | Asin
                | Acos
                | Atan
                | Sinh
                | Cosh
                | Tanh
                | Sigmoid
                | Conj
                | Real
                | Imag
                | Angle
        )
    }
    /// The output dtype for an input dtype.
    pub fn output_dtype(self, input: DType) -> DType {
        match self {
            UnaryOp::IsFinite | UnaryOp::IsNan => DType::Bool,
            UnaryOp::Abs | UnaryOp::Real | UnaryOp::Imag | UnaryOp::Angle => input.real_dtype(),
            _ => input,
        }
    }
}

op_enum!(
    /// Elementwise binary primitives (inputs broadcast NumPy-style).
    BinaryOp {
        /// a + b
        Add => "add",
        /// a - b
        Sub => "sub",
        /// a · b
        Mul => "mul",
        /// a / b (integers: truncating, TF `truncatediv`)
        Div => "div",
        /// ⌊a / b⌋
        FloorDiv => "floordiv",
        /// a - ⌊a / b⌋·b (sign of b, TF `floormod`)
        FloorMod => "floormod",
        /// a^b
        Pow => "pow",
        /// max(a, b) (NaN propagates)
        Maximum => "maximum",
        /// min(a, b) (NaN propagates)
        Minimum => "minimum",
        /// (a - b)²
        SquaredDifference => "squared_difference",
        /// atan2(a, b)
        Atan2 => "atan2",
        /// a · \[b > 0\]: the gradient `a` of a ReLU whose input was `b` (TF `ReluGrad`), one
        /// pass instead of a comparison, a cast and a product
        ReluGrad => "relu_grad",
        /// a == b
        Equal => "equal",
        /// a != b
        NotEqual => "not_equal",
        /// a < b
        Less => "less",
        /// a <= b
        LessEqual => "less_equal",
        /// a > b
        Greater => "greater",
        /// a >= b
        GreaterEqual => "greater_equal",
        /// a && b
        LogicalAnd => "logical_and",
        /// a || b
        LogicalOr => "logical_or",
        /// a ^ b
        LogicalXor => "logical_xor",
        /// a + bi from two floats of one type (TF's `complex`: float32 parts make complex64)
        Complex => "complex",
    }
);

impl BinaryOp {
    /// Comparison ops (bool output).
    pub fn is_comparison(self) -> bool {
        matches!(
            self,
            BinaryOp::Equal
                | BinaryOp::NotEqual
                | BinaryOp::Less
                | BinaryOp::LessEqual
                | BinaryOp::Greater
                | BinaryOp::GreaterEqual
        )
    }
    /// Logical ops (bool inputs and output).
    pub fn is_logical(self) -> bool {
        matches!(
            self,
            BinaryOp::LogicalAnd | BinaryOp::LogicalOr | BinaryOp::LogicalXor
        )
    }
    /// Ops that need a float dtype.
    pub fn float_only(self) -> bool {
        matches!(self, BinaryOp::Atan2 | BinaryOp::ReluGrad)
    }
    /// Ops defined on complex numbers (CPU backend): arithmetic, powers, equality.
    pub fn accepts_complex(self) -> bool {
        use BinaryOp::*;
        matches!(
            self,
            Add | Sub | Mul | Div | Pow | SquaredDifference | Equal | NotEqual
        )
    }
    /// The output dtype for the input dtype.
    pub fn output_dtype(self, input: DType) -> DType {
        if self.is_comparison() || self.is_logical() {
            DType::Bool
        } else if self == BinaryOp::Complex {
            input.complex_dtype().unwrap_or(input)
        } else {
            input
        }
    }
}

op_enum!(
    /// Reductions over a set of axes.
    ReduceOp {
        /// Σ
        ReduceSum => "reduce_sum",
        /// Π
        ReduceProd => "reduce_prod",
        /// max (NaN propagates; the lowest value for an empty set)
        ReduceMax => "reduce_max",
        /// min (NaN propagates; the highest value for an empty set)
        ReduceMin => "reduce_min",
        /// any (bool)
        ReduceAny => "reduce_any",
        /// all (bool)
        ReduceAll => "reduce_all",
        /// Σ / count (TF's `Mean`: integers divide with truncation; half-precision floats
        /// accumulate and divide in float32; NaN for an empty set of floats)
        ReduceMean => "reduce_mean",
    }
);

op_enum!(
    /// Index of the extreme along one axis (int64 output, first index on ties).
    ArgReduceOp {
        /// index of the maximum
        ArgMax => "argmax",
        /// index of the minimum
        ArgMin => "argmin",
    }
);

op_enum!(
    /// Scans along one axis.
    CumulativeOp {
        /// running sum
        Cumsum => "cumsum",
        /// running product
        Cumprod => "cumprod",
    }
);

op_enum!(
    /// 2-D pooling kinds.
    PoolKind {
        /// max over the window (padding never wins)
        MaxPool2d => "max_pool2d",
        /// mean over the valid part of the window (TF excludes padding)
        AvgPool2d => "avg_pool2d",
    }
);

/// TF's padding modes for convolution and pooling.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[cfg_attr(feature = "serde", derive(serde::Serialize, serde::Deserialize))]
pub enum Padding {
    /// Output size ⌈in / stride⌉, zero padding split with the extra on the bottom/right.
    Same,
    /// No padding: output size ⌈(in - (k-1)·dilation) / stride⌉.
    Valid,
}

/// Geometry of one 2-D window op over NHWC data, resolved by the tensor layer so every
/// backend computes identical output sizes and padding.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
#[cfg_attr(feature = "serde", derive(serde::Serialize, serde::Deserialize))]
pub struct Window2d {
    /// Input [batch, height, width, channels].
    pub input: [usize; 4],
    /// Window (filter) height and width.
    pub kernel: [usize; 2],
    /// Strides along height and width.
    pub strides: [usize; 2],
    /// Dilations along height and width (1 for pooling).
    pub dilations: [usize; 2],
    /// Padding before (top, left).
    pub pad_before: [usize; 2],
    /// Output height and width.
    pub output: [usize; 2],
}

impl Window2d {
    /// Resolves TF padding for an input (NHWC) and a window, checked as TF checks it:
    /// window, strides and dilations positive, no dimension arithmetic that overflows, and a
    /// VALID window no larger than the (dilated) input (TF: "computed output size would be
    /// negative"). `op` names the op in the error.
    pub fn resolve(
        op: &'static str,
        input: [usize; 4],
        kernel: [usize; 2],
        strides: [usize; 2],
        dilations: [usize; 2],
        padding: Padding,
    ) -> Result<Window2d> {
        for (what, v) in [
            ("window", kernel),
            ("strides", strides),
            ("dilations", dilations),
        ] {
            if v.contains(&0) {
                return Err(Error::invalid(
                    op,
                    format!("{what} must be positive, got {v:?}"),
                ));
            }
        }
        let overflow = || {
            Error::invalid(
                op,
                format!("window {kernel:?} with dilations {dilations:?} and strides {strides:?} overflows a dimension"),
            )
        };
        let mut output = [0; 2];
        let mut pad_before = [0; 2];
        for i in 0..2 {
            let n = input[1 + i];
            let eff = (kernel[i] - 1)
                .checked_mul(dilations[i])
                .and_then(|e| e.checked_add(1))
                .ok_or_else(overflow)?;
            match padding {
                Padding::Valid => {
                    if n < eff {
                        return Err(Error::invalid(
                            op,
                            format!(
                                "computed output size would be negative: input {n} is smaller than the effective window {eff} (VALID padding, axis {})",
                                1 + i
                            ),
                        ));
                    }
                    output[i] = (n - eff) / strides[i] + 1;
                }
                Padding::Same => {
                    output[i] = n.div_ceil(strides[i]);
                    let covered = (output[i].max(1) - 1)
                        .checked_mul(strides[i])
                        .and_then(|c| c.checked_add(eff))
                        .ok_or_else(overflow)?;
                    let needed = covered.saturating_sub(n);
                    pad_before[i] = if output[i] == 0 { 0 } else { needed / 2 };
                }
            }
        }
        Ok(Window2d {
            input,
            kernel,
            strides,
            dilations,
            pad_before,
            output,
        })
    }
}

impl Window2d {
    /// The TF padding that resolved to this window: SAME when the output is ⌈in/stride⌉ and
    /// padding was applied or needed, VALID otherwise (the two agree whenever both fit).
    /// Gradients and graph replay call the public ops with it.
    ///
    /// ```
    /// use ferroflow_tensor::{Padding, Window2d};
    /// let w = Window2d::resolve("conv2d", [1, 5, 5, 1], [3, 3], [1, 1], [1, 1], Padding::Same)?;
    /// assert_eq!(w.padding(), Padding::Same);
    /// # Ok::<(), ferroflow_tensor::Error>(())
    /// ```
    pub fn padding(&self) -> Padding {
        let valid = Window2d::resolve(
            "conv2d",
            self.input,
            self.kernel,
            self.strides,
            self.dilations,
            Padding::Valid,
        );
        if valid.is_ok_and(|v| v.output == self.output && v.pad_before == self.pad_before) {
            Padding::Valid
        } else {
            Padding::Same
        }
    }

    /// The smallest pooling window (dilation 1) that covers the same input positions for
    /// every output as this one: taps that can only ever fall into the padding are cut off,
    /// so a window far larger than its input (legal with SAME padding) costs what the input
    /// costs. Pooling ignores padding (max, and the mean without it), so results are equal.
    /// Pooling ops hand this to the kernels and record the window as given.
    ///
    /// Per axis, output `j` covers `[j·s − p, j·s − p + k) ∩ [0, n)`. When `p > (o−1)·s`
    /// every window starts before the input, so `p` can shrink to `(o−1)·s` with `k`
    /// shrinking by as much; then every window ends past the input once `k ≥ n + p`.
    pub fn clipped_for_pooling(&self) -> Window2d {
        let mut w = self.clone();
        for i in 0..2 {
            let (n, o, s) = (self.input[1 + i], self.output[i], self.strides[i]);
            let last_start = (o.max(1) - 1).saturating_mul(s);
            let (mut p, mut k) = (self.pad_before[i], self.kernel[i]);
            if p > last_start {
                k = k.saturating_sub(p - last_start);
                p = last_start;
            }
            w.pad_before[i] = p;
            w.kernel[i] = k.min(n.saturating_add(p)).max(1);
        }
        w
    }
}

/// The distribution of a stateful random op ([`Op::RandomStateful`]).
#[derive(Debug, Clone, Copy, PartialEq)]
#[cfg_attr(feature = "serde", derive(serde::Serialize, serde::Deserialize))]
pub enum RandomDistribution {
    /// Uniform in `[minval, maxval)` (integers: `maxval` exclusive).
    Uniform {
        /// Lower bound.
        minval: f64,
        /// Upper bound (exclusive).
        maxval: f64,
    },
    /// Normal.
    Normal {
        /// Mean.
        mean: f64,
        /// Standard deviation.
        stddev: f64,
    },
    /// Normal with draws beyond two standard deviations redrawn.
    TruncatedNormal {
        /// Mean.
        mean: f64,
        /// Standard deviation.
        stddev: f64,
    },
}

impl RandomDistribution {
    /// TF's op name (`"random_uniform"`).
    pub fn op_name(self) -> &'static str {
        match self {
            RandomDistribution::Uniform { .. } => "random_uniform",
            RandomDistribution::Normal { .. } => "random_normal",
            RandomDistribution::TruncatedNormal { .. } => "truncated_normal",
        }
    }
}

/// One primitive op with its attributes, as observers (tapes, profiler, tracers) see it.
#[derive(Debug, Clone, PartialEq)]
#[cfg_attr(feature = "serde", derive(serde::Serialize, serde::Deserialize))]
#[non_exhaustive]
pub enum Op {
    /// Host data placed on a device (no inputs).
    Constant,
    /// Elementwise unary.
    Unary(UnaryOp),
    /// Elementwise binary with broadcasting.
    Binary(BinaryOp),
    /// Reduction over sorted `axes`.
    Reduce {
        /// Which reduction.
        op: ReduceOp,
        /// The reduced axes (sorted, normalised).
        axes: Vec<usize>,
        /// Whether reduced axes stay as size 1.
        keepdims: bool,
    },
    /// Argmax/argmin along `axis`.
    ArgReduce {
        /// Which.
        op: ArgReduceOp,
        /// The axis.
        axis: usize,
    },
    /// Dtype conversion.
    Cast {
        /// Target dtype.
        to: DType,
    },
    /// Batched matrix product with optional transposes.
    MatMul {
        /// Use aᵀ.
        transpose_a: bool,
        /// Use bᵀ.
        transpose_b: bool,
    },
    /// New shape, same elements.
    Reshape {
        /// The new shape.
        shape: Vec<usize>,
    },
    /// Axis permutation.
    Transpose {
        /// Result axis i is input axis `perm[i]`.
        perm: Vec<usize>,
    },
    /// Strided slice with resolved per-axis begin, length and step.
    StridedSlice {
        /// First index per axis.
        begin: Vec<usize>,
        /// Number of elements per axis.
        len: Vec<usize>,
        /// Step per axis (non-zero).
        step: Vec<isize>,
    },
    /// NumPy broadcast to a shape.
    BroadcastTo {
        /// The target shape.
        shape: Vec<usize>,
    },
    /// `where(cond, x, y)`; inputs are [cond, x, y].
    Select,
    /// Gather along `axis`; inputs are [params, indices].
    Gather {
        /// The axis of params indexed.
        axis: usize,
    },
    /// Gather of several tensors by one index tensor along `axis` (each as
    /// [`Op::Gather`], one kernel where the backend can: a batch's inputs and targets);
    /// inputs `[x0, x1, .., indices]`, outputs `[gathered x0, ..]`.
    GatherGroup {
        /// The axis of each tensor indexed.
        axis: usize,
    },
    /// Adjoint of gather: sums updates into zeros of `shape`; inputs [indices, updates].
    ScatterAdd {
        /// The axis.
        axis: usize,
        /// Output shape.
        shape: Vec<usize>,
    },
    /// Concatenation along `axis`.
    Concat {
        /// The axis.
        axis: usize,
    },
    /// Constant padding.
    Pad {
        /// (before, after) per axis.
        paddings: Vec<(usize, usize)>,
        /// The fill value.
        value: f64,
    },
    /// cumsum/cumprod.
    Cumulative {
        /// Which scan.
        op: CumulativeOp,
        /// The axis.
        axis: usize,
        /// Exclude the current element.
        exclusive: bool,
        /// Scan from the end.
        reverse: bool,
    },
    /// Stable sort along `axis`; outputs [values, indices (int32)].
    Sort {
        /// The axis.
        axis: usize,
        /// Largest first.
        descending: bool,
    },
    /// Dense copy of a view on its device.
    Copy,
    /// The same values under a new identity (a view, nothing copied) that tapes give no
    /// gradient (`tf.stop_gradient`); input `[x]`. A graph function records it like any
    /// op, so it computes its input again on every call.
    StopGradient {
        /// It is an output of `custom_gradient` (whose gradient function a graph cannot
        /// hold: a tape outside a graph function refuses to differentiate through one).
        custom_gradient: bool,
    },
    /// A copy to another device; input `[x]`, the output on `to` (the transfer goes through
    /// the host). Host data reaching a device is [`Op::Constant`].
    ToDevice {
        /// The destination.
        to: crate::device::Device,
    },
    /// A tensor's elements read back to the host; input `[x]`, no tensor output.
    ToHost,
    /// 2-D convolution, NHWC input, HWIO filter; inputs [x, filter].
    Conv2d(Window2d),
    /// `activation(conv2d(x, filter) + bias)` in one kernel (TF's `_FusedConv2D` with
    /// BiasAdd and an optional Relu); inputs [x, filter, bias]. A fused kernel, not a
    /// primitive ([`crate::fused`]).
    FusedConv2d(Window2d, FusedActivation),
    /// `y = activation(conv2d(x, filter) + bias)` and `max_pool(y)`: inputs [x, filter,
    /// bias], outputs [y, pooled]; the convolution's window, its activation, then the
    /// pooling's window (over `y`). A fused kernel, not a primitive ([`crate::fused`]);
    /// graph functions make it of a fused convolution and a max pooling of its output.
    FusedConv2dMaxPool(Window2d, FusedActivation, Box<Window2d>),
    /// The gradients of `activation(x + bias)` (bias along the last axis) from the output's
    /// gradient `g` and the output `y`: inputs [g, y], outputs [dx, dbias] (TF's `ReluGrad`
    /// and `BiasAddGrad` in one pass). A fused kernel, not a primitive ([`crate::fused`]).
    BiasActivationGrad(FusedActivation),
    /// The gradients of `max_pool(activation(x + bias))` (max pooling by the window,
    /// the bias along the last axis) from the pool's input `y` and the pooled output's
    /// gradient `dy`: inputs [y, dy], outputs [dx, dbias], what `MaxPoolGrad` followed by
    /// `BiasActivationGrad` on the same `y` computes, in one pass. A fused kernel, not a
    /// primitive ([`crate::fused`]); graph functions make it of those two nodes.
    MaxPoolBiasActivationGrad(Window2d, FusedActivation),
    /// `activation(a @ b + bias)` (bias along the last axis): inputs [a, b, bias] (TF's
    /// `_FusedMatMul` with `BiasAdd` and an optional `Relu`). A fused kernel, not a
    /// primitive ([`crate::fused`]); graph functions make it of a product, its bias add and
    /// its ReLU.
    FusedMatMul(FusedActivation),
    /// Softmax cross-entropy against integer labels: inputs [logits, labels], outputs
    /// [loss, backprop] (TF's `SparseSoftmaxCrossEntropyWithLogits`). A fused kernel, not a
    /// primitive ([`crate::fused`]).
    SparseSoftmaxCrossEntropy,
    /// Gradient of conv2d w.r.t. its input; inputs [filter, dy].
    Conv2dBackpropInput(Window2d),
    /// Gradient of conv2d w.r.t. its filter; inputs [x, dy].
    Conv2dBackpropFilter(Window2d),
    /// Max or average pooling; input `[x]`.
    Pool2d(PoolKind, Window2d),
    /// Gradient of max pooling; inputs [x, dy].
    MaxPoolGrad(Window2d),
    /// Gradient of average pooling; input `[dy]`.
    AvgPoolGrad(Window2d),
    /// Fused optimizer step; inputs [w, g, slots..], outputs [w', slots'..] (not
    /// differentiable). A fused kernel, not a primitive ([`crate::fused`]).
    OptimizerUpdate(UpdateRule),
    /// Fused optimizer steps of several variables by one rule, one kernel where the backend
    /// can; inputs `[w, g, slots..]` per variable, outputs `[w', slots'..]` per variable
    /// (not differentiable). Declared by [`crate::FusedKernel::OptimizerUpdate`].
    OptimizerUpdateGroup(UpdateRule),
    /// `min(max(x, min), max)` with constant bounds in one pass (`tf.clip_by_value` with
    /// scalar bounds). A fused kernel, not a primitive ([`crate::fused`]).
    ClipScalar {
        /// Lower bound.
        min: f64,
        /// Upper bound.
        max: f64,
    },
    /// An [`crate::ElementwiseProgram`] in one pass over the broadcast shape of its inputs;
    /// outputs as the program lists them. A fused kernel, not a primitive
    /// ([`crate::fused`]): graph functions' fusion makes it.
    FusedElementwise(std::sync::Arc<crate::fused::ElementwiseProgram>),
    /// An [`crate::ElementwiseProgram`] whose first output is reduced over `axes` in the
    /// same pass (`reduce(program(inputs)[0])`); outputs `[the reduction, the program's
    /// other outputs..]`. A fused kernel, not a primitive ([`crate::fused`]): graph
    /// functions' fusion makes it of a chain ending in a reduction.
    FusedReduce {
        /// The elementwise program.
        program: std::sync::Arc<crate::fused::ElementwiseProgram>,
        /// The reduction of its first output (sum, product, max or min).
        reduce: ReduceOp,
        /// The axes reduced (normalised, sorted).
        axes: Vec<usize>,
        /// Keep reduced axes as size 1.
        keepdims: bool,
    },
    /// A matrix product whose result is the first input of an [`crate::ElementwiseProgram`],
    /// the program's first output summed over the rows in the same pass:
    /// `Σ_rows program(a @ b, inputs..)[0]`; inputs `[a, b, the program's other inputs..]`,
    /// outputs `[the column sums, the program's other outputs..]` (a Dense layer's backward:
    /// the product `dy @ wᵀ`, the next layer's ReLU gradient and its bias gradient, as
    /// cuBLASLt's `DRELU_BGRAD` epilogue). A fused kernel, not a primitive
    /// ([`crate::fused`]): graph functions make it of a product read only by a fused
    /// row-sum.
    FusedMatMulReduce {
        /// The elementwise program (register 0: the product).
        program: std::sync::Arc<crate::fused::ElementwiseProgram>,
        /// Transpose `a` before the product.
        transpose_a: bool,
        /// Transpose `b` before the product.
        transpose_b: bool,
    },
    /// The discrete Fourier transform of each vector along the last axis of a complex
    /// tensor (TF's `FFT`, unscaled) or its inverse (`IFFT`, scaled by 1/n); input `[x]`.
    Fft {
        /// The inverse transform.
        inverse: bool,
    },
    /// New numbers from the global random generator (`tf.random.uniform`, `normal`,
    /// `truncated_normal`); no inputs. Drawn on the host and uploaded; a graph function
    /// replays it as a new draw.
    RandomStateful {
        /// What is drawn.
        distribution: RandomDistribution,
        /// Output shape.
        shape: Vec<usize>,
        /// Output dtype.
        dtype: DType,
        /// The op seed (`None`: the global seed and the op counter decide).
        seed: Option<u64>,
    },
    /// A function computed on the host by a library outside the op set (the NumPy API's
    /// `linalg` through nalgebra); tapes record it and report that it has no gradient.
    /// Not serialisable (graphs holding it cannot be saved).
    #[cfg_attr(feature = "serde", serde(skip))]
    HostFunction {
        /// The function's NumPy name (`"linalg.inv"`).
        #[cfg_attr(feature = "serde", serde(skip))]
        name: &'static str,
    },
}

impl Op {
    /// TensorFlow-style name, for profiles and error messages.
    pub fn name(&self) -> &'static str {
        match self {
            Op::Constant => "constant",
            Op::Unary(u) => u.name(),
            Op::Binary(b) => b.name(),
            Op::Reduce { op, .. } => op.name(),
            Op::ArgReduce { op, .. } => op.name(),
            Op::Cast { .. } => "cast",
            Op::MatMul { .. } => "matmul",
            Op::Reshape { .. } => "reshape",
            Op::Transpose { .. } => "transpose",
            Op::StridedSlice { .. } => "strided_slice",
            Op::BroadcastTo { .. } => "broadcast_to",
            Op::Select => "select",
            Op::Gather { .. } => "gather",
            Op::GatherGroup { .. } => "gather_group",
            Op::ScatterAdd { .. } => "scatter_add",
            Op::Concat { .. } => "concat",
            Op::Pad { .. } => "pad",
            Op::Cumulative { op, .. } => op.name(),
            Op::Sort { .. } => "sort",
            Op::Copy => "copy",
            Op::StopGradient { .. } => "stop_gradient",
            Op::ToDevice { .. } => "to_device",
            Op::ToHost => "to_host",
            Op::Conv2d(_) => "conv2d",
            Op::FusedConv2d(..) => "fused_conv2d",
            Op::FusedConv2dMaxPool(..) => "fused_conv2d_max_pool",
            Op::BiasActivationGrad(_) => "bias_activation_grad",
            Op::MaxPoolBiasActivationGrad(..) => "max_pool_bias_activation_grad",
            Op::SparseSoftmaxCrossEntropy => "sparse_softmax_cross_entropy_with_logits",
            Op::FusedMatMul(_) => "fused_matmul",
            Op::Conv2dBackpropInput(_) => "conv2d_backprop_input",
            Op::Conv2dBackpropFilter(_) => "conv2d_backprop_filter",
            Op::Pool2d(k, _) => k.name(),
            Op::MaxPoolGrad(_) => "max_pool_grad",
            Op::AvgPoolGrad(_) => "avg_pool_grad",
            Op::OptimizerUpdate(_) => "optimizer_update",
            Op::OptimizerUpdateGroup(_) => "optimizer_update_group",
            Op::ClipScalar { .. } => "clip_scalar",
            Op::FusedElementwise(_) => "fused_elementwise",
            Op::FusedReduce { .. } => "fused_reduce",
            Op::FusedMatMulReduce { .. } => "fused_matmul_reduce",
            Op::Fft { inverse: false } => "fft",
            Op::Fft { inverse: true } => "ifft",
            Op::RandomStateful { distribution, .. } => distribution.op_name(),
            Op::HostFunction { name } => name,
        }
    }
}
