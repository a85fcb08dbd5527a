//! ferroflow's automatic differentiation: [`GradientTape`] with TensorFlow 2.4 semantics.
//!
//! # Overview
//! - [`GradientTape`] subscribes to the tensor dispatcher as a thread observer and records
//!   each op whose inputs depend on a watched tensor or a trainable variable read under it.
//! - `gradient` walks the record backwards, calling one gradient function per primitive
//!   (module `grad`), written with ordinary tensor ops: an outer tape records the backward
//!   pass of an inner one, which gives higher-order gradients (Hessians, jacobians of
//!   gradients).
//! - [`stop_gradient`] and [`custom_gradient`] cut or replace the recorded derivative.
//!
//! ```
//! ferroflow::init();
//! use ferroflow::{Tensor, Variable, autodiff::GradientTape};
//! // The seed example: loss = Σ sigmoid(x · w), gradient with respect to w.
//! let x = Tensor::from_vec(vec![1.0f32, 2.0, 3.0, 4.0], &[2, 2])?;
//! let w = Variable::new("w", Tensor::from_vec(vec![0.1f32, -0.2], &[2, 1])?);
//! let tape = GradientTape::new();
//! let loss = x.matmul(&w.value())?.sigmoid()?.reduce_sum(ferroflow::Axes::All, false)?;
//! let g = tape.gradient(&loss, &[(&w).into()])?;
//! assert_eq!(g[0].as_ref().unwrap().shape(), &[2, 1]);
//! # Ok::<(), ferroflow::Error>(())
//! ```
//!
//! # Design
//! Tapes are per thread, as in TF, and hold the tensors an op used until `gradient` runs
//! (non-persistent tapes free them then). Ops on integer or bool tensors are not recorded;
//! piecewise-constant ops (comparisons, argmax, floor, ...) yield no gradient (`None`).
//! Sibling crates: `ferroflow-tensor` (the ops), `ferroflow` (the facade).

#![warn(missing_docs)]

mod custom;
mod grad;
mod tape;

pub use custom::{custom_gradient, stop_gradient};
pub use tape::{
    is_recording, is_tracked, GradFn, GradientTape, RecordingPause, Source, UnconnectedGradients,
};
