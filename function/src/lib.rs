//! Graph functions for ferroflow: TensorFlow 2.4's `tf.function`.
//!
//! # Overview
//! - [`Function`] wraps a closure over tensors. Its first call with a new input signature
//!   traces the closure (runs it once while a thread observer of the dispatcher records every
//!   op, variable read and variable write) into a [`Graph`]; later calls run the graph.
//! - Passes: constant folding while tracing (ops on constants made inside the function),
//!   common-subexpression elimination, dead-code elimination, values freed after their last
//!   reader ([`GraphStats::peak_bytes`]).
//! - Graphs run their ops through the dispatcher: a `GradientTape` around a call records
//!   them (gradients and higher-order gradients work unchanged), the profiler sees them.
//! - Control flow that depends on values: [`cond`] and [`while_loop`] (Rust control flow
//!   eagerly, graph nodes choosing per call inside a function, with gradients).
//! - [`vectorized_map`]: a function of one example run on a whole batch by giving each op of
//!   its graph a batch axis (TF's pfor); [`jacobian`] and [`batch_jacobian`] use it.
//! - Host code inside a graph: [`HostCall`] (TF's `tf.numpy_function`) is one node that
//!   runs its Rust closure on every call; an optimizer step inside a function is one
//!   (`ferroflow_optim::SharedOptimizer`).
//! - Graph files: [`ConcreteFunction::save`] writes a traced graph to one file and
//!   [`ConcreteFunction::load`] reads it back without the closure, binding its variables by
//!   name (the basis of an inference runtime).
//!
//! ```
//! ferroflow::init();
//! use ferroflow::{function::Function, Tensor};
//! let gelu = Function::new(|a: &[Tensor]| Ok(vec![a[0].gelu()?]));
//! let x = Tensor::from_vec(vec![-1.0f32, 0.0, 1.0], &[3])?;
//! let y = gelu.call(&[x.clone()])?;
//! assert_eq!(y[0].to_vec::<f32>()?, x.gelu()?.to_vec::<f32>()?);
//! # Ok::<(), ferroflow::Error>(())
//! ```
//!
//! # Design
//! Tracing by execution (the trace is the first call): no symbolic tensor type, so every op
//! (composites, the NumPy API) records itself as the primitives it dispatches, and
//! `ferroflow_tensor::Op::execute` replays each one. What a graph cannot hold is refused
//! while tracing (`Error::NotTraceable`). Sibling crates: `ferroflow-tensor` (ops, the
//! dispatcher's tracing mode), `ferroflow-autodiff` (tapes record replayed graphs).

#![warn(missing_docs)]

mod control;
mod function;
mod graph;
mod passes;
mod polymorphic;
mod saved;
mod tape_op;
mod trace;
mod vectorize;

/// A host computation kept whole as one graph node (re-exported from the dispatcher).
pub use ferroflow_tensor::dispatch::HostCall;

pub use control::{cond, while_loop, while_loop_with, CondOp, WhileOp};
pub use function::{ConcreteFunction, Function, TensorSpec, TraceCache};
pub use graph::{Graph, GraphStats, Node, NodeKind, ValueRef, ValueType};
pub use polymorphic::BatchPolymorphicFunction;
pub use vectorize::{batch_jacobian, jacobian, vectorized_map, vectorized_map_with};
