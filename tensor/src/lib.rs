//! ferroflow's tensor core: the types every other ferroflow crate builds on.
//!
//! # Overview
//! - [`Tensor`]: an immutable n-dimensional array of one [`DType`] on one [`Device`];
//!   cheap to clone, views (transpose, slices, broadcasts) share storage through a [`Layout`].
//! - [`Variable`]: named, shared, mutable state (what optimizers update).
//! - [`Backend`]: the small object-safe trait a compute backend implements; backends
//!   register per [`DeviceKind`] ([`register_backend`]) and are chosen at run time from TF
//!   device strings (`"/GPU:0"`) and [`with_device`] scopes.
//! - [`dispatch()`](dispatch::dispatch): the one function every op runs through; it informs
//!   [`OpObserver`]s (gradient tapes, the profiler, tracers) of each op.
//! - [`Op`]: the primitive op vocabulary as data. There are 21 primitive kernels (the
//!   [`Backend`] methods every backend implements) covering 33 unary, 22 binary, 7 reduce,
//!   2 arg-reduce, 2 scan and 2 pool variants; every other op is composed from them. Beside
//!   them, 10 fused kernels ([`fused`]: the fused convolution, the same with the max
//!   pooling of its output, its bias gradient, max pooling's gradient with that bias gradient, `clip_scalar`, the optimizer update, elementwise programs, the sparse softmax cross-entropy, the
//!   product with its bias and activation, and the product through a program summed over
//!   its rows) are optional: a backend declares them with
//!   [`Backend::has_fused`], and callers compose primitives where it has none
//!   (`tests/op_counts.rs` keeps these numbers true).
//!
//! ```no_run
//! // A backend registered first: `ferroflow::init()` (the facade).
//! use ferroflow_tensor::{Tensor, DType};
//! let x = Tensor::from_vec(vec![1.0f32, -2.0, 3.0, -4.0], &[2, 2])?;
//! let y = x.relu()?.reduce_sum(1, false)?;
//! assert_eq!(y.to_vec::<f32>()?, vec![1.0, 3.0]);
//! assert!(x.add(&Tensor::zeros(&[2], DType::F64)?).is_err()); // no implicit promotion
//! # Ok::<(), ferroflow_tensor::Error>(())
//! ```
//!
//! # Features
//! - `conformance`: exports `conformance`, the test suite every backend crate runs.
//!
//! # Design
//! `Tensor` is one concrete type with a run-time device, not generic over a backend: user
//! code and the upper crates compile once and pick devices as TF does. The cost is dynamic
//! dispatch per kernel (measured below 0.5 µs per op in `cargo xtask bench`).
//!
//! Sibling crates: `ferroflow-cpu` (the CPU backend), `ferroflow` (the facade).

#![warn(missing_docs)]

pub mod backend;
#[cfg(feature = "conformance")]
pub mod conformance;
pub mod device;
pub mod dispatch;
pub mod distribution;
mod dtype;
mod error;
pub mod fs;
pub mod fused;
pub mod layout;
pub mod op;
pub mod ops;
pub mod random;
mod tensor;
pub mod testing;
pub mod trace;
mod variable;

pub use backend::{Backend, BufferBox, DeviceBuffer, Operand, UpdateOperands};
pub use device::{
    backend_for, current_device, device_has_fused, device_scope, device_supports, list_devices,
    register_backend, synchronize, with_device, Device, DeviceKind, DeviceSpec,
};
pub use dispatch::{add_observer, push_thread_observer, OpEvent, OpObserver};
pub use dtype::{Complex32, Complex64, DType, Element, HostData};
pub use error::{Error, Result};
pub use fused::{ElementwiseProgram, ElementwiseStep, FusedActivation, FusedKernel, UpdateRule};
pub use layout::Layout;
pub use op::{
    ArgReduceOp, BinaryOp, CumulativeOp, Op, Padding, PoolKind, RandomDistribution, ReduceOp,
    UnaryOp, Window2d,
};
pub use ops::{Axes, SliceSpec};
pub use tensor::{live_tensor_bytes, peak_tensor_bytes, reset_peak_tensor_bytes, Tensor, TensorId};
pub use variable::{Variable, VariableAggregation, VariableSynchronization};

pub use half::{bf16, f16};
