//! ferroflow's optimizers: TF 2.4's refactored `Optimizer` pipeline, learning-rate schedules,
//! and loss scaling for mixed precision.
//!
//! # Overview
//! - [`Optimizer`]: `minimize(loss, var_list, tape)` and `apply_gradients(grads_and_vars,
//!   aggregate)`; gradients pass the aggregator, then the built-in clipvalue / clipnorm /
//!   global_clipnorm or the user's gradient transformers (TF 2.4 refuses both at once),
//!   then each optimizer's update, whose scalars are computed in the variable's dtype as
//!   TF's are (so float32 slots match TF's to the last bits).
//! - Optimizers: [`Sgd`] (momentum, Nesterov), [`Adam`] (AMSGrad, and AdamW through
//!   `weight_decay`), [`RmsProp`] (momentum, centered), [`Adagrad`], [`Adadelta`],
//!   [`Adamax`], [`Nadam`], [`Ftrl`].
//! - Schedules implement [`LearningRateSchedule`]; every hyperparameter is a [`Hyper`]: a
//!   constant or a schedule of the step (TF accepts a callable for any of them), set by a
//!   builder method of its TF name (`Adam::new(1e-3).beta_1(0.8).amsgrad(true)`); the
//!   options all optimizers share (`clipnorm`, `clipvalue`, `global_clipnorm`, `decay`,
//!   transformers) through [`OptimizerBuilder`]. Slots by TF's names: `get_slot(var, "m")`.
//! - [`LossScaleOptimizer`] wraps any optimizer with TF's dynamic or a fixed loss scale.
//! - [`SharedOptimizer`]: an optimizer with shared ownership (`&self` methods), which a
//!   graph function's closure can step: inside a trace, `apply_gradients` is one host step
//!   of the graph, run with each call's gradients.
//!
//! ```
//! ferroflow::init();
//! use ferroflow::{autodiff::GradientTape, optim::{Adam, Optimizer}, Tensor, Variable};
//! let w = Variable::new("w", Tensor::scalar(2.0f32)?);
//! let mut opt = Adam::new(0.1);
//! for _ in 0..100 {
//!     let tape = GradientTape::new();
//!     let loss = w.value().square()?; // minimum at 0
//!     opt.minimize(&loss, &[w.clone()], &tape)?;
//! }
//! assert!(w.peek().item::<f32>()?.abs() < 0.1);
//! # Ok::<(), ferroflow::Error>(())
//! ```
//!
//! Checkpoints: [`OptimizerCore::weights`] / [`OptimizerCore::set_weights`] (step count and
//! slots; restoring before the slots exist defers, as TF does). Adam/AdamW use the backend's
//! fused update kernel when it has one. [`get_config`] / [`from_config`]
//! round-trip every optimizer and built-in schedule through Keras-style JSON.

#![warn(missing_docs)]

mod config;
mod dtype_scalar;
mod loss_scale;
mod more;
mod optimizer;
mod schedule;
mod shared;

pub use config::{from_config, get_config};
pub use loss_scale::{LossScale, LossScaleOptimizer};
pub use more::{Adadelta, Adamax, Ftrl, Nadam};
pub use optimizer::{
    minimize_fn, Adagrad, Adam, GradientTransformer, Optimizer, OptimizerBuilder, OptimizerCore,
    ReplicaGradients, RmsProp, Sgd,
};
pub use schedule::{
    CosineDecay, CosineDecayRestarts, ExponentialDecay, Hyper, InverseTimeDecay,
    LearningRateSchedule, PiecewiseConstantDecay, PolynomialDecay,
};
pub use shared::SharedOptimizer;
