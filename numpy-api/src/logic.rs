//! Comparisons and logic: `equal` .. `greater_equal`, `isclose`, `allclose`, `array_equal`,
//! `isfinite`, `isinf`, `isnan`, `logical_and/or/xor/not`. Arguments promote first; the
//! logical functions use NumPy truthiness (non-zero is true).
//!
//! ```
//! use ferroflow_numpy as np;
//! ferroflow::init();
//! let a = np::asarray([1.0, 2.0, f64::NAN])?;
//! assert_eq!(np::less(&a, 2)?.to_vec::<bool>()?, vec![true, false, false]);
//! assert_eq!(np::isnan(&a)?.to_vec::<bool>()?, vec![false, false, true]);
//! assert!(np::allclose_with(&a, &a, 1e-5, 1e-8, true)?);
//! # Ok::<(), np::Error>(())
//! ```

use ferroflow_tensor::{BinaryOp, DType, Result, Tensor};

use crate::array::{arr, promote2, ArrayLike};
use crate::shape::truth;
use crate::util::broadcast_shape;

fn compare(
    op: &'static str,
    a: impl ArrayLike,
    b: impl ArrayLike,
    bop: BinaryOp,
) -> Result<Tensor> {
    let (a, b, _) = promote2(a, b)?;
    broadcast_shape(op, &[a.shape(), b.shape()])?;
    let (a, b) = if a.dtype() == DType::Bool && !matches!(bop, BinaryOp::Equal | BinaryOp::NotEqual)
    {
        (a.cast(DType::U8)?, b.cast(DType::U8)?)
    } else {
        (a, b)
    };
    a.binary(bop, &b)
}

macro_rules! comparisons {
    ($($(#[$m:meta])* $name:ident => $op:ident),* $(,)?) => {$(
        $(#[$m])*
        pub fn $name(a: impl ArrayLike, b: impl ArrayLike) -> Result<Tensor> {
            compare(stringify!($name), a, b, BinaryOp::$op)
        }
    )*};
}
comparisons!(
    /// `numpy.equal`.
    equal => Equal,
    /// `numpy.not_equal`.
    not_equal => NotEqual,
    /// `numpy.less`.
    less => Less,
    /// `numpy.less_equal`.
    less_equal => LessEqual,
    /// `numpy.greater`.
    greater => Greater,
    /// `numpy.greater_equal`.
    greater_equal => GreaterEqual,
);

fn logical(
    op: &'static str,
    a: impl ArrayLike,
    b: impl ArrayLike,
    bop: BinaryOp,
) -> Result<Tensor> {
    let (a, b) = (truth(&arr(a)?)?, truth(&arr(b)?)?);
    broadcast_shape(op, &[a.shape(), b.shape()])?;
    a.binary(bop, &b)
}
/// `numpy.logical_and`.
pub fn logical_and(a: impl ArrayLike, b: impl ArrayLike) -> Result<Tensor> {
    logical("logical_and", a, b, BinaryOp::LogicalAnd)
}
/// `numpy.logical_or`.
pub fn logical_or(a: impl ArrayLike, b: impl ArrayLike) -> Result<Tensor> {
    logical("logical_or", a, b, BinaryOp::LogicalOr)
}
/// `numpy.logical_xor`.
pub fn logical_xor(a: impl ArrayLike, b: impl ArrayLike) -> Result<Tensor> {
    logical("logical_xor", a, b, BinaryOp::NotEqual)
}
/// `numpy.logical_not`.
pub fn logical_not(a: impl ArrayLike) -> Result<Tensor> {
    truth(&arr(a)?)?.logical_not()
}

/// `numpy.isnan` (integers are never NaN).
pub fn isnan(a: impl ArrayLike) -> Result<Tensor> {
    let a = arr(a)?;
    if a.dtype().is_float() {
        a.is_nan()
    } else {
        crate::creation::zeros_like(&a, DType::Bool)
    }
}
/// `numpy.isfinite`.
pub fn isfinite(a: impl ArrayLike) -> Result<Tensor> {
    let a = arr(a)?;
    if a.dtype().is_float() {
        a.is_finite()
    } else {
        crate::creation::ones_like(&a, DType::Bool)
    }
}
/// `numpy.isinf`: ±infinity.
pub fn isinf(a: impl ArrayLike) -> Result<Tensor> {
    let a = arr(a)?;
    if !a.dtype().is_float() {
        return crate::creation::zeros_like(&a, DType::Bool);
    }
    a.is_finite()?.logical_or(&a.is_nan()?)?.logical_not()
}
/// `numpy.isposinf`.
pub fn isposinf(a: impl ArrayLike) -> Result<Tensor> {
    let a = arr(a)?;
    isinf(&a)?.logical_and(&greater(&a, 0)?)
}
/// `numpy.isneginf`.
pub fn isneginf(a: impl ArrayLike) -> Result<Tensor> {
    let a = arr(a)?;
    isinf(&a)?.logical_and(&less(&a, 0)?)
}

/// `numpy.isclose(a, b)` with NumPy's defaults (`rtol=1e-05, atol=1e-08, equal_nan=False`);
/// [`isclose_with`] takes them.
///
/// ```
/// ferroflow::init();
/// use ferroflow_numpy as np;
/// let close = np::isclose(np::asarray([1.0, 2.0])?, np::asarray([1.0 + 1e-9, 2.1])?)?;
/// assert_eq!(close.to_vec::<bool>()?, vec![true, false]);
/// assert!(np::allclose([1.0, 2.0], [1.0, 2.0])?);
/// # Ok::<(), np::Error>(())
/// ```
pub fn isclose(a: impl ArrayLike, b: impl ArrayLike) -> Result<Tensor> {
    isclose_with(a, b, 1e-5, 1e-8, false)
}

/// `numpy.isclose(a, b, rtol, atol, equal_nan)`: `|a - b| <= atol + rtol·|b|`, infinities
/// equal only to themselves.
pub fn isclose_with(
    a: impl ArrayLike,
    b: impl ArrayLike,
    rtol: f64,
    atol: f64,
    equal_nan: bool,
) -> Result<Tensor> {
    let (a, b, d) = promote2(a, b)?;
    broadcast_shape("isclose", &[a.shape(), b.shape()])?;
    let fd = crate::dtypes::float_result(d);
    let fd = if fd == DType::F16 || fd == DType::BF16 {
        DType::F32
    } else {
        fd
    };
    let (a, b) = (a.cast(fd)?, b.cast(fd)?);
    let tol = b
        .abs()?
        .mul(&b.scalar_like(rtol)?)?
        .add(&b.scalar_like(atol)?)?;
    let close = a.sub(&b)?.abs()?.less_equal(&tol)?;
    let finite = a.is_finite()?.logical_and(&b.is_finite()?)?;
    let close = close.logical_and(&finite)?.logical_or(&a.equal(&b)?)?;
    if equal_nan {
        close.logical_or(&a.is_nan()?.logical_and(&b.is_nan()?)?)
    } else {
        Ok(close)
    }
}
/// `numpy.allclose(a, b)` with NumPy's defaults; [`allclose_with`] takes them.
pub fn allclose(a: impl ArrayLike, b: impl ArrayLike) -> Result<bool> {
    allclose_with(a, b, 1e-5, 1e-8, false)
}

/// `numpy.allclose(a, b, rtol, atol, equal_nan)`: whether [`isclose_with`] holds everywhere.
pub fn allclose_with(
    a: impl ArrayLike,
    b: impl ArrayLike,
    rtol: f64,
    atol: f64,
    equal_nan: bool,
) -> Result<bool> {
    isclose_with(a, b, rtol, atol, equal_nan)?
        .reduce_all(ferroflow_tensor::Axes::All, false)?
        .item::<bool>()
}
/// `numpy.array_equal(a1, a2)`: same shape and equal elements (NaN is never equal).
pub fn array_equal(a1: impl ArrayLike, a2: impl ArrayLike) -> Result<bool> {
    let (a, b, _) = promote2(a1, a2)?;
    if a.shape() != b.shape() {
        return Ok(false);
    }
    a.equal(&b)?
        .reduce_all(ferroflow_tensor::Axes::All, false)?
        .item::<bool>()
}
