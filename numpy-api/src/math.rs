//! Elementwise math (NumPy's ufuncs) with NumPy's dtype rules: arithmetic, powers, modulo,
//! the exp/log family, trigonometric and hyperbolic functions, rounding, sign, `clip`,
//! `maximum`/`minimum`/`fmax`/`fmin`; and cumulative sums and differences.
//!
//! Float-only ufuncs compute integers in [`float_result`] (`float16` for
//! `bool`/`int8`/`uint8`, else the default float); `true_divide` of integers is a float.
//! Unlike NumPy (which returns 0 and warns), integer division or modulo by zero is an error.
//!
//! ```
//! use ferroflow_numpy as np;
//! ferroflow::init();
//! let x = np::asarray([1i32, 2, 3])?;
//! let y = np::true_divide(&x, 2)?;            // int / int is float64
//! assert_eq!(y.to_vec::<f64>()?, vec![0.5, 1.0, 1.5]);
//! let z = np::add(&x, 1.5)?;                   // float scalar meets int array: float64
//! assert_eq!(z.dtype(), np::DType::F64);
//! let c = np::clip(&x, 2, 2)?;
//! assert_eq!(c.to_vec::<i32>()?, vec![2, 2, 2]);
//! # Ok::<(), np::Error>(())
//! ```

use ferroflow_tensor::{Axes, BinaryOp, DType, Error, Result, Tensor, UnaryOp};

use crate::array::{arr, cast_all, promote2, ArrayLike, Scalar, Value};
use crate::dtypes::{accumulate_dtype, float_result, inexact_result};
use crate::util::{axis_or_flat, broadcast_shape, norm_axis, one_axis, required_axis};

/// Two arguments promoted, with their broadcast shape checked (NumPy's wording).
fn binary_args(
    op: &'static str,
    a: impl ArrayLike,
    b: impl ArrayLike,
) -> Result<(Tensor, Tensor, DType)> {
    let (a, b, d) = promote2(a, b)?;
    broadcast_shape(op, &[a.shape(), b.shape()])?;
    Ok((a, b, d))
}

fn float_binary(
    op: &'static str,
    a: impl ArrayLike,
    b: impl ArrayLike,
    f: impl FnOnce(&Tensor, &Tensor) -> Result<Tensor>,
) -> Result<Tensor> {
    let (a, b, d) = binary_args(op, a, b)?;
    let fd = float_result(d);
    f(&a.cast(fd)?, &b.cast(fd)?)
}

fn numeric_binary(
    op: &'static str,
    a: impl ArrayLike,
    b: impl ArrayLike,
    bop: BinaryOp,
) -> Result<Tensor> {
    let (a, b, d) = binary_args(op, a, b)?;
    if d == DType::Bool {
        return Err(Error::invalid(
            op,
            format!("ufunc '{op}' not supported for the input types (bool)"),
        ));
    }
    a.binary(bop, &b)
}

/// A ufunc that NumPy defines on booleans as a logical op (`add` is `or`, `multiply` is
/// `and`, `maximum` is `or`, `minimum` is `and`).
fn bool_as(
    op: &'static str,
    a: impl ArrayLike,
    b: impl ArrayLike,
    on_bool: BinaryOp,
    on_numbers: BinaryOp,
) -> Result<Tensor> {
    let (a, b, d) = binary_args(op, a, b)?;
    a.binary(
        if d == DType::Bool {
            on_bool
        } else {
            on_numbers
        },
        &b,
    )
}

/// `numpy.add` (booleans: logical or).
pub fn add(a: impl ArrayLike, b: impl ArrayLike) -> Result<Tensor> {
    bool_as("add", a, b, BinaryOp::LogicalOr, BinaryOp::Add)
}
/// `numpy.subtract` (booleans are an error, as in NumPy).
pub fn subtract(a: impl ArrayLike, b: impl ArrayLike) -> Result<Tensor> {
    let (a, b, d) = binary_args("subtract", a, b)?;
    if d == DType::Bool {
        return Err(Error::invalid("subtract", "numpy boolean subtract, the `-` operator, is not supported, use the bitwise_xor, the `^` operator, or the logical_xor function instead."));
    }
    a.sub(&b)
}
/// `numpy.multiply` (booleans: logical and).
pub fn multiply(a: impl ArrayLike, b: impl ArrayLike) -> Result<Tensor> {
    bool_as("multiply", a, b, BinaryOp::LogicalAnd, BinaryOp::Mul)
}
/// `numpy.true_divide` / `numpy.divide`: always a float (integers in the default float).
pub fn true_divide(a: impl ArrayLike, b: impl ArrayLike) -> Result<Tensor> {
    // NumPy divides integers (and booleans) of every width in the default float, not in
    // the float the unary ufuncs pick (`int8 / int8` is float64, `sqrt(int8)` float16).
    let (a, b, d) = binary_args("true_divide", a, b)?;
    let fd = inexact_result(d);
    a.cast(fd)?.div(&b.cast(fd)?)
}
/// `numpy.divide` (same as [`true_divide`]).
pub fn divide(a: impl ArrayLike, b: impl ArrayLike) -> Result<Tensor> {
    true_divide(a, b)
}
/// `numpy.floor_divide`: `⌊a / b⌋`.
pub fn floor_divide(a: impl ArrayLike, b: impl ArrayLike) -> Result<Tensor> {
    numeric_binary("floor_divide", a, b, BinaryOp::FloorDiv)
}
/// `numpy.mod` / `numpy.remainder`: `a - ⌊a/b⌋·b`, with the sign of `b`.
pub fn remainder(a: impl ArrayLike, b: impl ArrayLike) -> Result<Tensor> {
    numeric_binary("remainder", a, b, BinaryOp::FloorMod)
}
/// `numpy.mod` (same as [`remainder`]).
pub fn mod_(a: impl ArrayLike, b: impl ArrayLike) -> Result<Tensor> {
    remainder(a, b)
}
/// `numpy.fmod`: C's remainder, with the sign of `a`.
pub fn fmod(a: impl ArrayLike, b: impl ArrayLike) -> Result<Tensor> {
    let (a, b, d) = binary_args("fmod", a, b)?;
    if d == DType::Bool {
        return Err(Error::invalid(
            "fmod",
            "ufunc 'fmod' not supported for the input types (bool)",
        ));
    }
    if d.is_float() {
        // a - trunc(a / b)·b
        let q = trunc(a.div(&b)?)?;
        return a.sub(&q.mul(&b)?);
    }
    // integers: truncating division
    a.sub(&a.div(&b)?.mul(&b)?)
}
/// `numpy.divmod`: `(floor_divide(a, b), remainder(a, b))`.
pub fn divmod(a: impl ArrayLike, b: impl ArrayLike) -> Result<(Tensor, Tensor)> {
    let (a, b, _) = binary_args("divmod", a, b)?;
    Ok((floor_divide(&a, &b)?, remainder(&a, &b)?))
}
/// `numpy.power`: integers stay integers (a negative integer power is an error, as in NumPy).
pub fn power(a: impl ArrayLike, b: impl ArrayLike) -> Result<Tensor> {
    numeric_binary("power", a, b, BinaryOp::Pow)
}
/// `numpy.float_power`: powers in float64 (or a wider float input type).
pub fn float_power(a: impl ArrayLike, b: impl ArrayLike) -> Result<Tensor> {
    let (a, b, d) = binary_args("float_power", a, b)?;
    let fd = if d == DType::F64 { d } else { DType::F64 };
    a.cast(fd)?.pow(&b.cast(fd)?)
}
/// `numpy.maximum` (NaN propagates).
pub fn maximum(a: impl ArrayLike, b: impl ArrayLike) -> Result<Tensor> {
    bool_as("maximum", a, b, BinaryOp::LogicalOr, BinaryOp::Maximum)
}
/// `numpy.minimum` (NaN propagates).
pub fn minimum(a: impl ArrayLike, b: impl ArrayLike) -> Result<Tensor> {
    bool_as("minimum", a, b, BinaryOp::LogicalAnd, BinaryOp::Minimum)
}
fn nan_ignoring(
    op: &'static str,
    a: impl ArrayLike,
    b: impl ArrayLike,
    max: bool,
) -> Result<Tensor> {
    let (a, b, d) = binary_args(op, a, b)?;
    let m = if max {
        maximum(&a, &b)?
    } else {
        minimum(&a, &b)?
    };
    if !d.is_float() {
        return Ok(m);
    }
    let m = Tensor::select(&b.is_nan()?, &a, &m)?;
    Tensor::select(&a.is_nan()?, &b, &m)
}
/// `numpy.fmax`: the maximum, ignoring a NaN when the other value is not NaN.
pub fn fmax(a: impl ArrayLike, b: impl ArrayLike) -> Result<Tensor> {
    nan_ignoring("fmax", a, b, true)
}
/// `numpy.fmin`: the minimum, ignoring a NaN when the other value is not NaN.
pub fn fmin(a: impl ArrayLike, b: impl ArrayLike) -> Result<Tensor> {
    nan_ignoring("fmin", a, b, false)
}
/// `numpy.arctan2(y, x)`.
pub fn arctan2(y: impl ArrayLike, x: impl ArrayLike) -> Result<Tensor> {
    float_binary("arctan2", y, x, |y, x| y.binary(BinaryOp::Atan2, x))
}
/// `numpy.hypot`: `√(a² + b²)`.
pub fn hypot(a: impl ArrayLike, b: impl ArrayLike) -> Result<Tensor> {
    float_binary("hypot", a, b, |a, b| a.square()?.add(&b.square()?)?.sqrt())
}
/// `numpy.logaddexp`: `ln(eᵃ + eᵇ)` without overflow.
pub fn logaddexp(a: impl ArrayLike, b: impl ArrayLike) -> Result<Tensor> {
    float_binary("logaddexp", a, b, |a, b| {
        let m = a.maximum(b)?;
        m.add(&a.sub(b)?.abs()?.neg()?.exp()?.log1p()?)
    })
}
/// `numpy.logaddexp2`: `log₂(2ᵃ + 2ᵇ)` without overflow.
pub fn logaddexp2(a: impl ArrayLike, b: impl ArrayLike) -> Result<Tensor> {
    float_binary("logaddexp2", a, b, |a, b| {
        let ln2 = a.scalar_like(std::f64::consts::LN_2)?;
        let m = a.maximum(b)?;
        let d = a.sub(b)?.abs()?.neg()?.mul(&ln2)?.exp()?.log1p()?;
        m.add(&d.div(&ln2)?)
    })
}
/// `numpy.heaviside(x1, x2)`: 0 below zero, `x2` at zero, 1 above.
pub fn heaviside(x1: impl ArrayLike, x2: impl ArrayLike) -> Result<Tensor> {
    float_binary("heaviside", x1, x2, |x, h| {
        let zero = x.scalar_like(0.0)?;
        let step = x.greater(&zero)?.cast(x.dtype())?;
        let out = Tensor::select(&x.equal(&zero)?, h, &step)?;
        Tensor::select(&x.is_nan()?, x, &out)
    })
}
/// `numpy.copysign(x1, x2)`: `|x1|` with the sign (bit) of `x2`.
pub fn copysign(x1: impl ArrayLike, x2: impl ArrayLike) -> Result<Tensor> {
    float_binary("copysign", x1, x2, |a, b| {
        let neg = signbit(b)?;
        let m = a.abs()?;
        Tensor::select(&neg, &m.neg()?, &m)
    })
}

/// `numpy.clip(a, a_min, a_max)`: `minimum(maximum(a, a_min), a_max)`; dtypes promote as
/// NumPy's do.
pub fn clip(a: impl ArrayLike, a_min: impl ArrayLike, a_max: impl ArrayLike) -> Result<Tensor> {
    let vals = [a.to_value()?, a_min.to_value()?, a_max.to_value()?];
    let refs: Vec<&Value> = vals.iter().collect();
    let dtype = crate::result_type(&refs)?;
    if let (Value::Array(x), Value::Scalar(lo), Value::Scalar(hi)) = (&vals[0], &vals[1], &vals[2])
    {
        // constant bounds that keep the array's dtype: one fused pass
        if let (true, Some(lo), Some(hi)) = (dtype == x.dtype(), scalar_f64(*lo), scalar_f64(*hi)) {
            return x.clip_scalar(lo, hi);
        }
    }
    let t = cast_all(&vals, dtype)?;
    broadcast_shape("clip", &[t[0].shape(), t[1].shape(), t[2].shape()])?;
    t[0].clip_by_value(&t[1], &t[2])
}

/// A numeric scalar as f64 (booleans are not clip bounds here).
fn scalar_f64(s: Scalar) -> Option<f64> {
    match s {
        Scalar::Int(v, _) if v.unsigned_abs() < 1 << 53 => Some(v as f64),
        Scalar::Float(v, _) => Some(v),
        _ => None,
    }
}

fn float_unary(a: impl ArrayLike, f: impl FnOnce(&Tensor) -> Result<Tensor>) -> Result<Tensor> {
    let a = arr(a)?;
    f(&a.cast(float_result(a.dtype()))?)
}

macro_rules! float_ufuncs {
    ($($(#[$m:meta])* $name:ident => $op:ident),* $(,)?) => {$(
        $(#[$m])*
        pub fn $name(x: impl ArrayLike) -> Result<Tensor> {
            float_unary(x, |x| x.unary(UnaryOp::$op))
        }
    )*};
}
float_ufuncs!(
    /// `numpy.exp`.
    exp => Exp,
    /// `numpy.expm1`: `eˣ - 1`.
    expm1 => Expm1,
    /// `numpy.log` (natural).
    log => Log,
    /// `numpy.log1p`: `ln(1 + x)`.
    log1p => Log1p,
    /// `numpy.sqrt`.
    sqrt => Sqrt,
    /// `numpy.sin`.
    sin => Sin,
    /// `numpy.cos`.
    cos => Cos,
    /// `numpy.tan`.
    tan => Tan,
    /// `numpy.arcsin`.
    arcsin => Asin,
    /// `numpy.arccos`.
    arccos => Acos,
    /// `numpy.arctan`.
    arctan => Atan,
    /// `numpy.sinh`.
    sinh => Sinh,
    /// `numpy.cosh`.
    cosh => Cosh,
    /// `numpy.tanh`.
    tanh => Tanh,
    /// `numpy.floor` (integers give floats, as in NumPy 1.16).
    floor => Floor,
    /// `numpy.ceil`.
    ceil => Ceil,
    /// `numpy.rint`: round half to even.
    rint => Round,
);

fn scaled(x: &Tensor, k: f64) -> Result<Tensor> {
    x.mul(&x.scalar_like(k)?)
}

/// `numpy.exp2`: `2ˣ`.
pub fn exp2(x: impl ArrayLike) -> Result<Tensor> {
    float_unary(x, |x| scaled(x, std::f64::consts::LN_2)?.exp())
}
/// `numpy.log2`.
pub fn log2(x: impl ArrayLike) -> Result<Tensor> {
    float_unary(x, |x| scaled(&x.log()?, std::f64::consts::LOG2_E))
}
/// `numpy.log10`.
pub fn log10(x: impl ArrayLike) -> Result<Tensor> {
    float_unary(x, |x| scaled(&x.log()?, std::f64::consts::LOG10_E))
}
/// `numpy.cbrt`: the real cube root.
pub fn cbrt(x: impl ArrayLike) -> Result<Tensor> {
    float_unary(x, |x| {
        let r = x.abs()?.pow(&x.scalar_like(1.0 / 3.0)?)?;
        r.mul(&x.sign()?)
    })
}
/// `numpy.reciprocal`: `1/x` (integers divide as integers, as in NumPy).
pub fn reciprocal(x: impl ArrayLike) -> Result<Tensor> {
    let x = arr(x)?;
    if x.dtype().is_float() || x.dtype().is_complex() {
        x.reciprocal()
    } else {
        x.scalar_like(1.0)?.div(&x)
    }
}
/// `numpy.square`.
pub fn square(x: impl ArrayLike) -> Result<Tensor> {
    let x = arr(x)?;
    if x.dtype() == DType::Bool {
        return Ok(x);
    }
    x.square()
}
/// `numpy.arcsinh`.
pub fn arcsinh(x: impl ArrayLike) -> Result<Tensor> {
    float_unary(x, |x| {
        let a = x.abs()?;
        let r = a
            .add(&a.square()?.add(&a.scalar_like(1.0)?)?.sqrt()?)?
            .log()?;
        r.mul(&x.sign()?)
    })
}
/// `numpy.arccosh`.
pub fn arccosh(x: impl ArrayLike) -> Result<Tensor> {
    float_unary(x, |x| {
        x.add(&x.square()?.sub(&x.scalar_like(1.0)?)?.sqrt()?)?
            .log()
    })
}
/// `numpy.arctanh`: `½·ln((1+x)/(1-x))`.
pub fn arctanh(x: impl ArrayLike) -> Result<Tensor> {
    float_unary(x, |x| {
        let one = x.scalar_like(1.0)?;
        scaled(&one.add(x)?.div(&one.sub(x)?)?.log()?, 0.5)
    })
}
/// `numpy.deg2rad` / `numpy.radians`.
pub fn deg2rad(x: impl ArrayLike) -> Result<Tensor> {
    float_unary(x, |x| scaled(x, std::f64::consts::PI / 180.0))
}
/// `numpy.radians` (same as [`deg2rad`]).
pub fn radians(x: impl ArrayLike) -> Result<Tensor> {
    deg2rad(x)
}
/// `numpy.rad2deg` / `numpy.degrees`.
pub fn rad2deg(x: impl ArrayLike) -> Result<Tensor> {
    float_unary(x, |x| scaled(x, 180.0 / std::f64::consts::PI))
}
/// `numpy.degrees` (same as [`rad2deg`]).
pub fn degrees(x: impl ArrayLike) -> Result<Tensor> {
    rad2deg(x)
}
/// `numpy.sinc`: `sin(πx)/(πx)`, 1 at 0.
pub fn sinc(x: impl ArrayLike) -> Result<Tensor> {
    float_unary(x, |x| {
        let zero = x.scalar_like(0.0)?;
        let is0 = x.equal(&zero)?;
        let safe = Tensor::select(&is0, &x.scalar_like(1.0)?, x)?;
        let px = scaled(&safe, std::f64::consts::PI)?;
        let v = px.sin()?.div(&px)?;
        Tensor::select(&is0, &x.scalar_like(1.0)?, &v)
    })
}
/// `numpy.trunc`: rounds toward zero.
pub fn trunc(x: impl ArrayLike) -> Result<Tensor> {
    float_unary(x, |x| x.abs()?.floor()?.mul(&x.sign()?))
}
/// `numpy.fix` (same as [`trunc`]).
pub fn fix(x: impl ArrayLike) -> Result<Tensor> {
    trunc(x)
}
/// `numpy.around(a, decimals)` / `numpy.round_`: half to even at `decimals` places
/// (integers with `decimals >= 0` are returned unchanged).
pub fn around(a: impl ArrayLike, decimals: i32) -> Result<Tensor> {
    let a = arr(a)?;
    if !a.dtype().is_float() && decimals >= 0 {
        return Ok(a);
    }
    let x = a.cast(float_result(a.dtype()))?;
    if decimals == 0 {
        return x.round();
    }
    let s = 10f64.powi(decimals);
    let r = scaled(&x, s)?.round()?.div(&x.scalar_like(s)?)?;
    if a.dtype().is_float() {
        Ok(r)
    } else {
        r.cast(a.dtype())
    }
}
/// `numpy.round_` (same as [`around`]).
pub fn round_(a: impl ArrayLike, decimals: i32) -> Result<Tensor> {
    around(a, decimals)
}
/// `numpy.absolute` / `numpy.abs`.
pub fn absolute(x: impl ArrayLike) -> Result<Tensor> {
    let x = arr(x)?;
    if x.dtype() == DType::Bool || !x.dtype().is_signed() {
        return Ok(x);
    }
    x.abs()
}
/// `numpy.abs` (same as [`absolute`]).
pub fn abs(x: impl ArrayLike) -> Result<Tensor> {
    absolute(x)
}
/// `numpy.fabs`: absolute value as a float.
pub fn fabs(x: impl ArrayLike) -> Result<Tensor> {
    float_unary(x, |x| x.abs())
}
/// `numpy.sign`: -1, 0 or 1 (NaN stays NaN).
pub fn sign(x: impl ArrayLike) -> Result<Tensor> {
    let x = arr(x)?;
    if x.dtype() == DType::Bool {
        return Err(Error::invalid(
            "sign",
            "ufunc 'sign' did not contain a loop with signature matching types bool",
        ));
    }
    if !x.dtype().is_signed() {
        return x.cast(DType::Bool)?.cast(x.dtype());
    }
    x.sign()
}
/// `numpy.signbit`: true where the sign bit is set (negative numbers and -0.0).
pub fn signbit(x: impl ArrayLike) -> Result<Tensor> {
    let x = arr(x)?;
    if !x.dtype().is_float() {
        if !x.dtype().is_signed() {
            return crate::creation::zeros_like(&x, DType::Bool);
        }
        return x.less(&x.scalar_like(0.0)?);
    }
    let zero = x.scalar_like(0.0)?;
    let neg_zero = x.equal(&zero)?.logical_and(&x.reciprocal()?.less(&zero)?)?;
    x.less(&zero)?.logical_or(&neg_zero)
}
/// `numpy.negative`.
pub fn negative(x: impl ArrayLike) -> Result<Tensor> {
    let x = arr(x)?;
    if x.dtype() == DType::Bool {
        return Err(Error::invalid("negative", "The numpy boolean negative, the `-` operator, is not supported, use the `~` operator or the logical_not function instead."));
    }
    if !x.dtype().is_signed() {
        // NumPy wraps: -1 as uint16 is 65535.
        return x.zeros_like()?.sub(&x);
    }
    x.neg()
}
/// `numpy.positive` (a copy).
pub fn positive(x: impl ArrayLike) -> Result<Tensor> {
    arr(x)?.copy()
}

/// `numpy.cumsum(a, axis=None)`: running sums (`None`: over the flattened array); small
/// integers and booleans accumulate in int64.
pub fn cumsum(a: impl ArrayLike, axis: impl Into<Axes>) -> Result<Tensor> {
    let axis = one_axis("cumsum", axis.into())?;
    cumulative("cumsum", a, axis, false)
}
/// `numpy.cumprod(a, axis=None)`.
pub fn cumprod(a: impl ArrayLike, axis: impl Into<Axes>) -> Result<Tensor> {
    let axis = one_axis("cumprod", axis.into())?;
    cumulative("cumprod", a, axis, true)
}
fn cumulative(
    op: &'static str,
    a: impl ArrayLike,
    axis: Option<isize>,
    prod: bool,
) -> Result<Tensor> {
    let (a, ax) = axis_or_flat(op, arr(a)?, axis)?;
    let a = a.cast(accumulate_dtype(a.dtype()))?;
    if prod {
        a.cumprod(ax as isize, false, false)
    } else {
        a.cumsum(ax as isize, false, false)
    }
}

/// `numpy.diff(a, n=1, axis=-1)`: `n`-th differences along `axis` (booleans: `!=`).
pub fn diff(a: impl ArrayLike, n: usize, axis: impl Into<Axes>) -> Result<Tensor> {
    let axis = required_axis("diff", axis.into())?;
    let mut a = arr(a)?;
    if a.rank() == 0 {
        return Err(Error::invalid(
            "diff",
            "diff requires input that is at least one dimensional",
        ));
    }
    let ax = norm_axis("diff", axis, a.rank())?;
    for _ in 0..n {
        let len = a.shape()[ax] as isize;
        if len == 0 {
            break;
        }
        let mut hi = vec![ferroflow_tensor::SliceSpec::ALL; a.rank()];
        let mut lo = hi.clone();
        hi[ax] = ferroflow_tensor::SliceSpec::range(1, len);
        lo[ax] = ferroflow_tensor::SliceSpec::range(0, len - 1);
        let (h, l) = (a.strided_slice(&hi)?, a.strided_slice(&lo)?);
        a = if a.dtype() == DType::Bool {
            h.not_equal(&l)?
        } else {
            h.sub(&l)?
        };
    }
    Ok(a)
}

/// `numpy.nan_to_num(x, nan=0.0, posinf=None, neginf=None)`: NaN and infinities replaced
/// (by default with 0 and the dtype's largest and lowest finite values).
pub fn nan_to_num(
    x: impl ArrayLike,
    nan: f64,
    posinf: Option<f64>,
    neginf: Option<f64>,
) -> Result<Tensor> {
    let x = arr(x)?;
    let d = x.dtype();
    if !d.is_float() {
        return Ok(x);
    }
    let (hi, lo) = match d {
        DType::F16 => (65504.0, -65504.0),
        DType::BF16 => (3.389_531_389_251_535e38, -3.389_531_389_251_535e38),
        DType::F32 => (f32::MAX as f64, f32::MIN as f64),
        _ => (f64::MAX, f64::MIN),
    };
    let y = Tensor::select(&x.is_nan()?, &x.scalar_like(nan)?, &x)?;
    let pos = x.greater(&x.scalar_like(0.0)?)?;
    let inf = x.is_finite()?.logical_or(&x.is_nan()?)?.logical_not()?;
    let y = Tensor::select(
        &inf.logical_and(&pos)?,
        &x.scalar_like(posinf.unwrap_or(hi))?,
        &y,
    )?;
    Tensor::select(
        &inf.logical_and(&pos.logical_not()?)?,
        &x.scalar_like(neginf.unwrap_or(lo))?,
        &y,
    )
}

/// `numpy.ediff1d(ary)`: differences of the flattened array.
pub fn ediff1d(ary: impl ArrayLike) -> Result<Tensor> {
    let a = arr(ary)?.reshape(&[-1])?;
    diff(&a, 1, 0)
}

/// `numpy.trapezoid(y, x=None, dx=1.0, axis=-1)`: the trapezoidal-rule integral along
/// `axis`, at sample points `x` (1-D, or `y`'s shape) or spacing `dx`.
pub fn trapezoid(
    y: impl ArrayLike,
    x: Option<&Tensor>,
    dx: f64,
    axis: impl Into<Axes>,
) -> Result<Tensor> {
    let axis = required_axis("trapezoid", axis.into())?;
    let y = arr(y)?;
    let ax = norm_axis("trapezoid", axis, y.rank())?;
    let n = y.shape()[ax] as isize;
    let part = |t: &Tensor, lo: isize, hi: isize, axis: usize| -> Result<Tensor> {
        let mut s = vec![ferroflow_tensor::SliceSpec::ALL; t.rank()];
        s[axis] = ferroflow_tensor::SliceSpec::range(lo, hi);
        t.strided_slice(&s)
    };
    let pairs = add(part(&y, 1, n, ax)?, part(&y, 0, n - 1, ax)?)?;
    let widths = match x {
        None => Tensor::scalar_of(dx, float_result(pairs.dtype()))?.to_device(y.device())?,
        Some(x) if x.rank() == 1 => {
            let d = diff(x, 1, 0)?;
            let mut shape = vec![1isize; y.rank()];
            shape[ax] = -1;
            d.reshape(&shape)?
        }
        Some(x) => diff(x, 1, axis)?,
    };
    let areas = true_divide(multiply(&pairs, &widths)?, 2.0)?;
    crate::reductions::sum_with(
        &areas,
        crate::reductions::ReduceArgs::new().axis(ax as isize),
    )
}

/// `numpy.modf(x)`: `(fractional part, integral part)`, both with `x`'s sign.
pub fn modf(x: impl ArrayLike) -> Result<(Tensor, Tensor)> {
    let x = arr(x)?;
    let x = x.cast(float_result(x.dtype()))?;
    let i = trunc(&x)?;
    Ok((x.sub(&i)?, i))
}

/// `numpy.ldexp(x1, x2)`: `x1 · 2^x2` (`x2` integers).
pub fn ldexp(x1: impl ArrayLike, x2: impl ArrayLike) -> Result<Tensor> {
    let (m, e) = (arr(x1)?, arr(x2)?);
    if !e.dtype().is_int() {
        return Err(Error::invalid(
            "ldexp",
            format!(
                "ufunc 'ldexp' not supported for exponents of dtype {}",
                e.dtype()
            ),
        ));
    }
    let m = m.cast(float_result(m.dtype()))?;
    let two = m.scalar_like(2.0)?;
    multiply(&m, two.pow(&e.cast(m.dtype())?)?)
}

/// `numpy.real(val)`: the real part; a real array is returned as it is.
///
/// ```
/// use ferroflow_numpy as np;
/// ferroflow::init();
/// let z = np::asarray([np::Complex64::new(1.0, 2.0), np::Complex64::new(-3.0, 0.5)])?;
/// assert_eq!(np::real(&z)?.to_vec::<f64>()?, [1.0, -3.0]);
/// assert_eq!(np::imag(&z)?.to_vec::<f64>()?, [2.0, 0.5]);
/// assert_eq!(np::absolute(np::asarray([np::Complex64::new(3.0, 4.0)])?)?.to_vec::<f64>()?, [5.0]);
/// # Ok::<(), np::Error>(())
/// ```
pub fn real(val: impl ArrayLike) -> Result<Tensor> {
    arr(val)?.real()
}
/// `numpy.imag(val)`: the imaginary part; zeros of the same dtype for a real array.
pub fn imag(val: impl ArrayLike) -> Result<Tensor> {
    arr(val)?.imag()
}
/// `numpy.conjugate(x)`: the complex conjugate (a real array as it is).
pub fn conjugate(x: impl ArrayLike) -> Result<Tensor> {
    arr(x)?.conj()
}
/// `numpy.conj` (same as [`conjugate`]).
pub fn conj(x: impl ArrayLike) -> Result<Tensor> {
    conjugate(x)
}
/// `numpy.angle(z)`: the argument in radians, `arctan2(imag, real)` (float64 for real
/// input, as NumPy: π for negative numbers and for -0.0).
pub fn angle(z: impl ArrayLike) -> Result<Tensor> {
    angle_with(z, false)
}
/// `numpy.angle(z, deg)`: [`angle`], in degrees when `deg`.
pub fn angle_with(z: impl ArrayLike, deg: bool) -> Result<Tensor> {
    let z = arr(z)?;
    let a = if z.dtype().is_complex() {
        z.angle()?
    } else {
        let x = z.cast(float_result(z.dtype()))?;
        x.zeros_like()?.binary(BinaryOp::Atan2, &x)?
    };
    if deg {
        a.mul(&a.scalar_like(180.0 / std::f64::consts::PI)?)
    } else {
        Ok(a)
    }
}
/// `numpy.iscomplex(x)`: where the imaginary part is not zero (all false for real arrays).
pub fn iscomplex(x: impl ArrayLike) -> Result<Tensor> {
    let x = arr(x)?;
    if !x.dtype().is_complex() {
        return Tensor::zeros(x.shape(), DType::Bool);
    }
    let im = x.imag()?;
    im.not_equal(&im.scalar_like(0.0)?)
}
/// `numpy.isreal(x)`: where the imaginary part is zero (all true for real arrays).
pub fn isreal(x: impl ArrayLike) -> Result<Tensor> {
    iscomplex(x)?.logical_not()
}
/// `numpy.iscomplexobj(x)`: whether the dtype is complex.
pub fn iscomplexobj(x: impl ArrayLike) -> Result<bool> {
    Ok(arr(x)?.dtype().is_complex())
}
/// `numpy.isrealobj(x)`: whether the dtype is not complex.
pub fn isrealobj(x: impl ArrayLike) -> Result<bool> {
    Ok(!iscomplexobj(x)?)
}
