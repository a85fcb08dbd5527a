//! ferroflow-numpy: TF 2.4's `tf.experimental.numpy` in Rust — NumPy's functions and type
//! promotion over ferroflow tensors, on any device.
//!
//! - NumPy's `ndarray` *is* [`Tensor`] ([`NdArray`]): nothing is copied between this API and
//!   the rest of ferroflow, arrays live on whatever device their tensors do, and
//!   `GradientTape` differentiates through NumPy-API code (everything except the nalgebra
//!   `linalg` functions is made of tensor ops).
//! - Arguments are [`ArrayLike`]: tensors, Rust scalars (promoted by value, like Python
//!   scalars), slices, vectors, nested arrays, `ndarray` arrays and `nalgebra` matrices.
//! - Dtypes follow NumPy 1.16's rules ([`dtypes`]), with [`set_prefer_float32`] for TF's
//!   float32 default.
//! - Files: `.npy`/`.npz` as NumPy writes them ([`io`]); conversions to and from `ndarray`
//!   and `nalgebra` ([`interop`]).
//! - Bad input is an `Err` worded as NumPy words it (`AxisError: axis 2 is out of bounds for
//!   array of dimension 2`, `operands could not be broadcast together with shapes (2,3) (4,)`).
//!
//! Which NumPy names exist here is listed in `NUMPY_COVERAGE.md`, generated from this crate's
//! source by `cargo xtask numpy-coverage`.
//!
//! The seed example: a logistic unit written with NumPy functions, differentiated by a tape.
//!
//! ```
//! use ferroflow_numpy as np;
//! use ferroflow_autodiff::{GradientTape, Source};
//! ferroflow::init();
//! let x = np::asarray([[1.0f32, 2.0], [3.0, 4.0]])?;
//! let w = np::asarray([0.5f32, -0.25])?;
//! let tape = GradientTape::new();
//! tape.watch(&w);
//! let z = np::dot(&x, &w)?;
//! let y = np::sum(np::true_divide(1.0, np::add(1.0, np::exp(np::negative(&z)?)?)?)?)?;
//! let g = tape.gradient(&y, &[Source::from(&w)])?[0].clone().expect("w is watched");
//! // d/dw Σ σ(xw) = xᵀ σ'(xw)
//! let s = np::true_divide(1.0, np::add(1.0, np::exp(np::negative(&z)?)?)?)?;
//! let ds = np::multiply(&s, np::subtract(1.0, &s)?)?;
//! assert!(np::allclose_with(&g, np::dot(np::transpose(&x, None)?, &ds)?, 1e-6, 1e-6, false)?);
//! # Ok::<(), np::Error>(())
//! ```

#![warn(missing_docs)]

mod array;
pub mod creation;
pub mod dtypes;
pub mod fft;
pub mod indexing;
pub mod interop;
pub mod io;
pub mod linalg;
pub mod logic;
pub mod math;
pub mod products;
pub mod random;
pub mod reductions;
pub mod shape;
pub mod sorting;
mod util;

pub use array::{array, asarray, asarray_of, ArrayLike, NdArray, Nested, Scalar, Value};
pub use creation::*;
pub use dtypes::{
    can_cast, default_float, default_int, float_result, prefer_float32, promote_types, result_type,
    set_prefer_float32,
};
pub use indexing::{getitem, step, Index, ELLIPSIS, NEWAXIS};
pub use interop::{from_dmatrix, from_ndarray, to_dmatrix, to_ndarray};
pub use io::{
    load, load_npz, load_npz_with_limit, save, savez, savez_compressed, NpzFile, NPZ_MEMBER_LIMIT,
};
pub use logic::*;
pub use math::*;
pub use products::*;
pub use reductions::*;
pub use shape::*;
pub use sorting::*;

pub use ferroflow_tensor::{Axes, Complex32, Complex64, DType, Error, Result, Tensor};
pub use nalgebra;
pub use ndarray;
