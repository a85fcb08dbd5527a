//! The op set as methods on [`crate::Tensor`], one module per family.
//!
//! Each public op checks its inputs (naming itself in the error), computes the output shape
//! and dtype, and runs the kernel through [`crate::dispatch::dispatch`] so observers see it.
//! Composite ops (softmax, one_hot, gather_nd, top_k, tile, ...) call primitives only.

mod complex;
mod elementwise;
mod execute;
mod fused;
mod index;
mod linalg;
mod nn;
mod reduce;
mod shape;
mod sort;

pub use reduce::Axes;
pub use shape::SliceSpec;
