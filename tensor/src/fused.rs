//! Fused kernels: optional backend kernels that do in one pass what a chain of primitives
//! does in several. They are not part of the primitive op set ([`crate::op`]): a backend
//! declares the ones it has with [`crate::Backend::has_fused`] (per dtype), and the tensor
//! methods and optimizers compose primitives where it has none, so every backend computes
//! every op and a new backend needs none of these.
//!
//! | kernel | tensor method | composed from |
//! |---|---|---|
//! | [`FusedKernel::FusedConv2d`] | [`crate::Tensor::fused_conv2d`] | `conv2d`, `add`, `relu` |
//! | [`FusedKernel::FusedConv2dMaxPool`] | [`crate::Tensor::fused_conv2d_max_pool`] | `fused_conv2d`, then `max_pool2d` |
//! | [`FusedKernel::BiasActivationGrad`] | [`crate::Tensor::bias_activation_grad`] | `relu_grad`, `reduce_sum` |
//! | [`FusedKernel::MaxPoolBiasActivationGrad`] | [`crate::Tensor::max_pool_bias_activation_grad`] | `max_pool_grad`, then `bias_activation_grad` |
//! | [`FusedKernel::ClipScalar`] | [`crate::Tensor::clip_scalar`] | `maximum`, `minimum` |
//! | [`FusedKernel::OptimizerUpdate`] | [`crate::Tensor::optimizer_update`] | the optimizer's rule in primitives (`ferroflow-optim`) |
//! | [`FusedKernel::OptimizerUpdate`] | [`crate::Tensor::optimizer_update_group`] | one `optimizer_update` per variable |
//! | [`FusedKernel::Elementwise`] | [`crate::Tensor::fused_elementwise`] | the program's unary and binary ops |
//! | [`FusedKernel::Elementwise`] | [`crate::Tensor::fused_reduce`] | the program's ops, then `reduce` |
//! | [`FusedKernel::FusedMatMulReduce`] | [`crate::Tensor::fused_matmul_reduce`] | `matmul`, then `fused_reduce` over the rows |

/// The optional fused kernels, as a backend declares them ([`crate::Backend::has_fused`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum FusedKernel {
    /// `activation(conv2d(x, filter) + bias)` ([`crate::Backend::fused_conv2d`]).
    FusedConv2d,
    /// [`FusedKernel::FusedConv2d`] and the max pooling of its output
    /// ([`crate::Backend::fused_conv2d_max_pool`]): both results, each image pooled while
    /// the convolution's output for it is in cache.
    FusedConv2dMaxPool,
    /// The gradients of `activation(x + bias)` ([`crate::Backend::bias_activation_grad`]).
    BiasActivationGrad,
    /// The gradients of `max_pool(activation(x + bias))` from the pooled output's gradient
    /// and the pool's input ([`crate::Backend::max_pool_bias_activation_grad`]): max
    /// pooling's gradient and [`FusedKernel::BiasActivationGrad`] in one pass, the pooling
    /// gradient never stored.
    MaxPoolBiasActivationGrad,
    /// `min(max(x, min), max)` with constant bounds ([`crate::Backend::clip_scalar`]).
    ClipScalar,
    /// One optimizer step by an [`UpdateRule`] ([`crate::Backend::optimizer_update`]).
    OptimizerUpdate,
    /// A program of elementwise ops in one pass ([`crate::Backend::fused_elementwise`]):
    /// what a graph function's fusion pass makes of chains of unary and binary ops; with a
    /// reduction of its result in the same pass too ([`crate::Backend::fused_reduce`],
    /// which backends get from their `fused_elementwise` and `reduce` unless they override
    /// it).
    Elementwise,
    /// Softmax cross-entropy against integer labels with its gradient, one pass per row
    /// ([`crate::Backend::sparse_softmax_cross_entropy`]).
    SparseSoftmaxCrossEntropy,
    /// `activation(a @ b + bias)` with the bias and activation applied as the product is
    /// stored ([`crate::Backend::fused_matmul`]).
    FusedMatMul,
    /// A product run through an elementwise program as it is stored, the program's first
    /// output summed over the rows ([`crate::Backend::fused_matmul_reduce`]).
    FusedMatMulReduce,
}

impl FusedKernel {
    /// Every fused kernel.
    pub const ALL: &'static [FusedKernel] = &[
        FusedKernel::FusedConv2d,
        FusedKernel::FusedConv2dMaxPool,
        FusedKernel::BiasActivationGrad,
        FusedKernel::MaxPoolBiasActivationGrad,
        FusedKernel::ClipScalar,
        FusedKernel::OptimizerUpdate,
        FusedKernel::Elementwise,
        FusedKernel::SparseSoftmaxCrossEntropy,
        FusedKernel::FusedMatMul,
        FusedKernel::FusedMatMulReduce,
    ];
    /// The name of its `Backend` method and tensor method.
    pub fn name(self) -> &'static str {
        match self {
            FusedKernel::FusedConv2d => "fused_conv2d",
            FusedKernel::FusedConv2dMaxPool => "fused_conv2d_max_pool",
            FusedKernel::BiasActivationGrad => "bias_activation_grad",
            FusedKernel::MaxPoolBiasActivationGrad => "max_pool_bias_activation_grad",
            FusedKernel::ClipScalar => "clip_scalar",
            FusedKernel::OptimizerUpdate => "optimizer_update",
            FusedKernel::Elementwise => "fused_elementwise",
            FusedKernel::SparseSoftmaxCrossEntropy => "sparse_softmax_cross_entropy",
            FusedKernel::FusedMatMul => "fused_matmul",
            FusedKernel::FusedMatMulReduce => "fused_matmul_reduce",
        }
    }
}

/// One instruction of an [`ElementwiseProgram`]: it reads registers (the program's inputs
/// first, then each earlier step's result) and writes the next one.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[cfg_attr(feature = "serde", derive(serde::Serialize, serde::Deserialize))]
pub enum ElementwiseStep {
    /// A unary op of a register.
    Unary(crate::UnaryOp, usize),
    /// A binary op of two registers.
    Binary(crate::BinaryOp, usize, usize),
}

/// Elementwise ops run in one pass over the broadcast shape of their inputs
/// ([`crate::Tensor::fused_elementwise`]): registers `0..num_inputs` are the inputs, register
/// `num_inputs + i` is step `i`'s result, and `outputs` names the registers returned. Every
/// register has the inputs' float dtype (ops that change the dtype are not fusible).
///
/// ```
/// use ferroflow_tensor::{BinaryOp, ElementwiseProgram, ElementwiseStep, UnaryOp};
/// // tanh(a) * b
/// let p = ElementwiseProgram {
///     num_inputs: 2,
///     steps: vec![
///         ElementwiseStep::Unary(UnaryOp::Tanh, 0),
///         ElementwiseStep::Binary(BinaryOp::Mul, 2, 1),
///     ],
///     outputs: vec![3],
/// };
/// assert!(p.check().is_ok());
/// ```
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
#[cfg_attr(feature = "serde", derive(serde::Serialize, serde::Deserialize))]
pub struct ElementwiseProgram {
    /// How many inputs it reads.
    pub num_inputs: usize,
    /// Its steps, in order.
    pub steps: Vec<ElementwiseStep>,
    /// The registers it returns (each a step's result).
    pub outputs: Vec<usize>,
}

impl ElementwiseProgram {
    /// Whether a unary op keeps a float dtype and so may be part of a program.
    pub fn fusible_unary(op: crate::UnaryOp) -> bool {
        use crate::UnaryOp::*;
        !matches!(
            op,
            IsFinite | IsNan | LogicalNot | Conj | Real | Imag | Angle
        )
    }
    /// Whether a binary op of floats gives a float and so may be part of a program.
    pub fn fusible_binary(op: crate::BinaryOp) -> bool {
        use crate::BinaryOp::*;
        matches!(
            op,
            Add | Sub
                | Mul
                | Div
                | Pow
                | Maximum
                | Minimum
                | SquaredDifference
                | Atan2
                | ReluGrad
                | FloorDiv
                | FloorMod
        )
    }
    /// Checks that every step reads registers written before it with a fusible op, and
    /// that the outputs are step results.
    pub fn check(&self) -> crate::Result<()> {
        let bad = |msg: String| Err(crate::Error::invalid("fused_elementwise", msg));
        for (i, step) in self.steps.iter().enumerate() {
            let here = self.num_inputs + i;
            let (ok, reads) = match *step {
                ElementwiseStep::Unary(op, a) => (Self::fusible_unary(op), vec![a]),
                ElementwiseStep::Binary(op, a, b) => (Self::fusible_binary(op), vec![a, b]),
            };
            if !ok {
                return bad(format!("step {i} ({step:?}) is not a fusible float op"));
            }
            if reads.iter().any(|&r| r >= here) {
                return bad(format!(
                    "step {i} ({step:?}) reads a register not yet written"
                ));
            }
        }
        let end = self.num_inputs + self.steps.len();
        if self.outputs.is_empty()
            || self
                .outputs
                .iter()
                .any(|&r| r < self.num_inputs || r >= end)
        {
            return bad(format!(
                "outputs {:?} must be step results (registers {}..{end})",
                self.outputs, self.num_inputs
            ));
        }
        Ok(())
    }
}

impl ElementwiseProgram {
    /// Runs the program through `backend`'s own unary and binary kernels, one step at a
    /// time, each register a dense buffer of `shape` (inputs read through their layouts
    /// broadcast to `shape`, all of the first input's dtype); an output register returned
    /// again later is copied, so each output is a buffer of its own. What a backend's
    /// `fused_elementwise` does with a program it cannot run as one kernel (more operands
    /// than a kernel may bind, a type it generates no code for).
    ///
    /// ```
    /// use ferroflow_tensor::{Backend, BufferBox, ElementwiseProgram, Operand, Result};
    /// // In a backend's `fused_elementwise`, for a program it cannot run as one kernel:
    /// fn fallback(
    ///     backend: &dyn Backend,
    ///     program: &ElementwiseProgram,
    ///     inputs: &[Operand<'_>],
    ///     shape: &[usize],
    /// ) -> Result<Vec<BufferBox>> {
    ///     program.run_op_by_op(backend, inputs, shape)
    /// }
    /// ```
    pub fn run_op_by_op(
        &self,
        backend: &dyn crate::Backend,
        inputs: &[crate::Operand<'_>],
        shape: &[usize],
    ) -> crate::Result<Vec<crate::BufferBox>> {
        const OP: &str = "fused_elementwise";
        self.check()?;
        if inputs.len() != self.num_inputs {
            return Err(crate::Error::invalid(
                OP,
                format!(
                    "the program reads {} inputs, given {}",
                    self.num_inputs,
                    inputs.len()
                ),
            ));
        }
        let layouts = inputs
            .iter()
            .map(|x| x.layout.broadcast_to(OP, shape))
            .collect::<crate::Result<Vec<_>>>()?;
        let dense = crate::Layout::contiguous(shape);
        let dtype = inputs.first().map_or(crate::DType::F32, |x| x.dtype);
        let n_in = self.num_inputs;
        let mut registers: Vec<Option<crate::BufferBox>> = Vec::with_capacity(self.steps.len());
        // (`check` saw to it that every register read is written before.)
        let unwritten =
            |r: usize| crate::Error::invalid(OP, format!("register {r} is not written"));
        for step in &self.steps {
            let operand = |r: usize| -> crate::Result<crate::Operand<'_>> {
                if r < n_in {
                    return Ok(crate::Operand {
                        buffer: inputs[r].buffer,
                        layout: &layouts[r],
                        dtype,
                    });
                }
                let buffer = registers
                    .get(r - n_in)
                    .and_then(Option::as_ref)
                    .ok_or_else(|| unwritten(r))?;
                Ok(crate::Operand {
                    buffer: buffer.as_ref(),
                    layout: &dense,
                    dtype,
                })
            };
            let out = match *step {
                ElementwiseStep::Unary(op, a) => backend.unary(op, operand(a)?)?,
                ElementwiseStep::Binary(op, a, b) => {
                    backend.binary(op, operand(a)?, operand(b)?)?
                }
            };
            registers.push(Some(out));
        }
        let mut outputs = Vec::with_capacity(self.outputs.len());
        for (k, &r) in self.outputs.iter().enumerate() {
            let again = self.outputs[k + 1..].contains(&r);
            let slot = &mut registers[r - n_in];
            let buffer = match (again, slot.as_ref()) {
                (true, Some(b)) => backend.copy(crate::Operand {
                    buffer: b.as_ref(),
                    layout: &dense,
                    dtype,
                })?,
                _ => slot.take().ok_or_else(|| unwritten(r))?,
            };
            outputs.push(buffer);
        }
        Ok(outputs)
    }
}

/// The activation a fused convolution applies after its bias ([`crate::Op::FusedConv2d`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[cfg_attr(feature = "serde", derive(serde::Serialize, serde::Deserialize))]
pub enum FusedActivation {
    /// None: `conv2d(x, f) + bias`.
    Linear,
    /// `max(conv2d(x, f) + bias, 0)`.
    Relu,
}

/// One optimizer step's rule and scalars for the fused `optimizer_update` kernel: the new
/// variable and slots from the old ones and the gradient, element by element, in one pass.
/// Slots are passed and returned in the order listed per variant.
#[derive(Debug, Clone, Copy, PartialEq)]
#[cfg_attr(feature = "serde", derive(serde::Serialize, serde::Deserialize))]
pub enum UpdateRule {
    /// Slots `[v]`: `v' = m·v - lr·g; w' = w + v'` (nesterov: `w' = w + m·v' - lr·g`).
    SgdMomentum {
        /// Learning rate.
        lr: f64,
        /// Momentum.
        momentum: f64,
        /// Nesterov momentum.
        nesterov: bool,
    },
    /// Slots [m, v]: `m' = β1 m + (1-β1) g; v' = β2 v + (1-β2) g²;
    /// w' = w - decay·w - lr_t·m'/(√v' + ε)` (bias corrections folded into `lr_t`).
    Adam {
        /// `lr·√(1-β2^t)/(1-β1^t)`.
        lr_t: f64,
        /// β1.
        beta_1: f64,
        /// β2.
        beta_2: f64,
        /// ε.
        epsilon: f64,
        /// Decoupled weight decay times the learning rate (0 for Adam).
        decay: f64,
    },
    /// Slots `[ms]` or, centered, `[ms, mg]`: `ms' = ρ ms + (1-ρ) g²` (`mg' = ρ mg + (1-ρ) g`);
    /// `w' = w - lr·g/√(ms' [- mg'²] + ε)`.
    RmsProp {
        /// Learning rate.
        lr: f64,
        /// ρ.
        rho: f64,
        /// ε.
        epsilon: f64,
        /// Centered variant (two slots).
        centered: bool,
    },
    /// Slots `[acc]`: `acc' = acc + g²; w' = w - lr·g/(√acc' + ε)`.
    Adagrad {
        /// Learning rate.
        lr: f64,
        /// ε.
        epsilon: f64,
    },
    /// Slots [acc, acc_u]: `acc' = ρ acc + (1-ρ) g²; u = √(acc_u + ε)/√(acc' + ε)·g;
    /// acc_u' = ρ acc_u + (1-ρ) u²; w' = w - lr·u`.
    Adadelta {
        /// Learning rate.
        lr: f64,
        /// ρ.
        rho: f64,
        /// ε.
        epsilon: f64,
    },
    /// Slots [m, u]: `m' = β1 m + (1-β1) g; u' = max(β2 u, |g|); w' = w - lr_t·m'/(u' + ε)`.
    Adamax {
        /// `lr/(1-β1^t)`.
        lr_t: f64,
        /// β1.
        beta_1: f64,
        /// β2.
        beta_2: f64,
        /// ε.
        epsilon: f64,
    },
}

impl UpdateRule {
    /// How many slot tensors the rule reads and returns.
    pub fn num_slots(&self) -> usize {
        match self {
            UpdateRule::SgdMomentum { .. } | UpdateRule::Adagrad { .. } => 1,
            UpdateRule::RmsProp { centered, .. } => 1 + *centered as usize,
            UpdateRule::Adam { .. } | UpdateRule::Adadelta { .. } | UpdateRule::Adamax { .. } => 2,
        }
    }
}
