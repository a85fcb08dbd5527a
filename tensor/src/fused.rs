//! Fused kernels: optional backend kernels that do in one pass what a chain of primitives
//! does in several. They are not part of the primitive op set ([`crate::op`]): a backend
//! declares the ones it has with [`crate::Backend::has_fused`] (per dtype), and the tensor
//! methods and optimizers compose primitives where it has none, so every backend computes
//! every op and a new backend needs none of these.
//!
//! | kernel | tensor method | composed from |
//! |---|---|---|
//! | [`FusedKernel::FusedConv2d`] | [`crate::Tensor::fused_conv2d`] | `conv2d`, `add`, `relu` |
//! | [`FusedKernel::BiasActivationGrad`] | [`crate::Tensor::bias_activation_grad`] | `relu_grad`, `reduce_sum` |
//! | [`FusedKernel::ClipScalar`] | [`crate::Tensor::clip_scalar`] | `maximum`, `minimum` |
//! | [`FusedKernel::OptimizerUpdate`] | [`crate::Tensor::optimizer_update`] | the optimizer's rule in primitives (`ferroflow-optim`) |

/// The optional fused kernels, as a backend declares them ([`crate::Backend::has_fused`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum FusedKernel {
    /// `activation(conv2d(x, filter) + bias)` ([`crate::Backend::fused_conv2d`]).
    FusedConv2d,
    /// The gradients of `activation(x + bias)` ([`crate::Backend::bias_activation_grad`]).
    BiasActivationGrad,
    /// `min(max(x, min), max)` with constant bounds ([`crate::Backend::clip_scalar`]).
    ClipScalar,
    /// One optimizer step by an [`UpdateRule`] ([`crate::Backend::optimizer_update`]).
    OptimizerUpdate,
}

impl FusedKernel {
    /// Every fused kernel.
    pub const ALL: &'static [FusedKernel] = &[
        FusedKernel::FusedConv2d,
        FusedKernel::BiasActivationGrad,
        FusedKernel::ClipScalar,
        FusedKernel::OptimizerUpdate,
    ];
    /// The name of its `Backend` method and tensor method.
    pub fn name(self) -> &'static str {
        match self {
            FusedKernel::FusedConv2d => "fused_conv2d",
            FusedKernel::BiasActivationGrad => "bias_activation_grad",
            FusedKernel::ClipScalar => "clip_scalar",
            FusedKernel::OptimizerUpdate => "optimizer_update",
        }
    }
}

/// The activation a fused convolution applies after its bias ([`crate::Op::FusedConv2d`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
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
