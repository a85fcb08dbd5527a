//! Elementwise unary kernels.

use crate::buffer::{dense, half_chunked, host, narrow, widen, widen_range, Half};
use crate::num::{FloatMath, Num};
use crate::simd::map;
use ferroflow_tensor::{backend::unsupported, Element, HostData, Operand, Result, UnaryOp};

/// A unary op on dense half-precision data, chunk by chunk in f32 (no whole-buffer
/// widening); `None` for views and for ops whose result is not a float.
fn unary_half<H: Half>(op: UnaryOp, v: &[H], x: &Operand<'_>) -> Option<HostData> {
    let (off, n) = x.layout.contiguous_range()?;
    if !matches!(unary_float::<f32>(op, &[0.0]), HostData::F32(_)) {
        return None;
    }
    let src = &v[off..off + n];
    let out = half_chunked::<H>(n, 1, |s, e| {
        match unary_float::<f32>(op, &widen_range(src, s, e)) {
            HostData::F32(v) => v,
            _ => unreachable!("checked above: this op returns floats"),
        }
    });
    Some(H::host(out))
}

pub(crate) fn unary(op: UnaryOp, x: Operand<'_>) -> Result<HostData> {
    let data = host(&x)?;
    match data {
        HostData::C64(v) => return super::complex::unary(op, v, x.layout),
        HostData::C128(v) => return super::complex::unary(op, v, x.layout),
        _ if matches!(
            op,
            UnaryOp::Conj | UnaryOp::Real | UnaryOp::Imag | UnaryOp::Angle
        ) =>
        {
            return Err(unsupported("cpu", op.name(), x.dtype))
        }
        _ => {}
    }
    let chunked = match data {
        HostData::F16(v) => unary_half(op, v, &x),
        HostData::BF16(v) => unary_half(op, v, &x),
        _ => None,
    };
    if let Some(out) = chunked {
        return Ok(out);
    }
    if let Some(w) = widen(data) {
        return Ok(match unary_float::<f32>(op, &dense(&w, x.layout)) {
            HostData::F32(v) => narrow(v, x.dtype),
            other => other,
        });
    }
    Ok(match data {
        HostData::F32(v) => unary_float(op, &dense(v, x.layout)),
        HostData::F64(v) => unary_float(op, &dense(v, x.layout)),
        HostData::I8(v) => HostData::I8(
            unary_int(op, &dense(v, x.layout))
                .ok_or_else(|| unsupported("cpu", op.name(), x.dtype))?,
        ),
        HostData::I32(v) => HostData::I32(
            unary_int(op, &dense(v, x.layout))
                .ok_or_else(|| unsupported("cpu", op.name(), x.dtype))?,
        ),
        HostData::I64(v) => HostData::I64(
            unary_int(op, &dense(v, x.layout))
                .ok_or_else(|| unsupported("cpu", op.name(), x.dtype))?,
        ),
        HostData::U8(v) => HostData::U8(
            unary_int(op, &dense(v, x.layout))
                .ok_or_else(|| unsupported("cpu", op.name(), x.dtype))?,
        ),
        HostData::I16(v) => HostData::I16(
            unary_int(op, &dense(v, x.layout))
                .ok_or_else(|| unsupported("cpu", op.name(), x.dtype))?,
        ),
        HostData::U16(v) => HostData::U16(
            unary_int(op, &dense(v, x.layout))
                .ok_or_else(|| unsupported("cpu", op.name(), x.dtype))?,
        ),
        HostData::U32(v) => HostData::U32(
            unary_int(op, &dense(v, x.layout))
                .ok_or_else(|| unsupported("cpu", op.name(), x.dtype))?,
        ),
        HostData::U64(v) => HostData::U64(
            unary_int(op, &dense(v, x.layout))
                .ok_or_else(|| unsupported("cpu", op.name(), x.dtype))?,
        ),
        HostData::Bool(v) if op == UnaryOp::LogicalNot => {
            HostData::Bool(map(&dense(v, x.layout), |b: bool| !b))
        }
        _ => return Err(unsupported("cpu", op.name(), x.dtype)),
    })
}

/// Round half to even (TF `round`, NumPy `around`).
#[inline(always)]
fn round_half_even<T: FloatMath>(x: T) -> T {
    let half = T::from(0.5).unwrap_or(T::zero());
    let two = T::ONE + T::ONE;
    if (x - x.trunc()).abs() == half {
        two * (x / two).round()
    } else {
        x.round()
    }
}

pub(crate) fn unary_float<T: FloatMath>(op: UnaryOp, x: &[T]) -> HostData {
    use UnaryOp::*;
    let one = T::ONE;
    let zero = T::ZERO;
    let v: Vec<T> = match op {
        Neg => map(x, |v: T| -v),
        Abs => map(x, |v: T| v.abs()),
        Sign => map(x, |v: T| {
            if v > zero {
                one
            } else if v < zero {
                -one
            } else {
                v
            }
        }),
        Exp => map(x, |v: T| v.exp_vec()),
        Expm1 => map(x, |v: T| v.exp_m1()),
        Log => map(x, |v: T| v.ln()),
        Log1p => map(x, |v: T| v.ln_1p()),
        Sqrt => map(x, |v: T| v.sqrt()),
        Rsqrt => map(x, |v: T| one / v.sqrt()),
        Square => map(x, |v: T| v * v),
        Reciprocal => map(x, |v: T| one / v),
        Sin => map(x, |v: T| v.sin()),
        Cos => map(x, |v: T| v.cos()),
        Tan => map(x, |v: T| v.tan()),
        Asin => map(x, |v: T| v.asin()),
        Acos => map(x, |v: T| v.acos()),
        Atan => map(x, |v: T| v.atan()),
        Sinh => map(x, |v: T| v.sinh()),
        Cosh => map(x, |v: T| v.cosh()),
        Tanh => map(x, |v: T| v.tanh()),
        Sigmoid => map(x, |v: T| one / (one + (-v).exp_vec())),
        Erf => map(x, |v: T| v.erf()),
        Floor => map(x, |v: T| v.floor()),
        Ceil => map(x, |v: T| v.ceil()),
        Round => map(x, round_half_even),
        // NaN stays NaN (`NaN > 0` is false, so test it explicitly).
        Relu => map(x, |v: T| if (v > zero) | v.isnan() { v } else { zero }),
        IsFinite => return HostData::Bool(map(x, |v: T| v.is_finite())),
        IsNan => return HostData::Bool(map(x, |v: T| v.isnan())),
        LogicalNot => return HostData::Bool(map(x, |v: T| v == zero)),
        // complex numbers only: refused in `unary` before any real kernel
        Conj | Real | Imag | Angle => x.to_vec(),
    };
    T::into_host(v)
}

fn unary_int<T: Num + Sync + Send>(op: UnaryOp, x: &[T]) -> Option<Vec<T>> {
    use UnaryOp::*;
    let zero = T::ZERO;
    Some(match op {
        Neg => map(x, |v: T| zero.wsub(v)),
        Abs => map(x, |v: T| if v < zero { zero.wsub(v) } else { v }),
        Sign => map(x, |v: T| {
            if v > zero {
                T::ONE
            } else if v < zero {
                zero.wsub(T::ONE)
            } else {
                zero
            }
        }),
        Square => map(x, |v: T| v.wmul(v)),
        Relu => map(x, |v: T| if v > zero { v } else { zero }),
        _ => return None,
    })
}

/// `min(max(x, lo), hi)` with the bounds in the element type (NaN stays NaN: comparisons
/// with it are false). Half-precision data clips in its own type (exact: bounds round to
/// it, and clipping only selects values).
pub(crate) fn clip_scalar(x: Operand<'_>, lo: f64, hi: f64) -> Result<HostData> {
    fn go<T: Element + PartialOrd>(v: &[T], x: &Operand<'_>, lo: f64, hi: f64) -> Vec<T> {
        let (lo, hi) = (T::from_f64(lo), T::from_f64(hi));
        map(&dense(v, x.layout), |v: T| {
            let m = if v < lo { lo } else { v };
            if m > hi {
                hi
            } else {
                m
            }
        })
    }
    let data = host(&x)?;
    Ok(match data {
        HostData::F16(v) => HostData::F16(go(v, &x, lo, hi)),
        HostData::BF16(v) => HostData::BF16(go(v, &x, lo, hi)),
        HostData::F32(v) => HostData::F32(go(v, &x, lo, hi)),
        HostData::F64(v) => HostData::F64(go(v, &x, lo, hi)),
        HostData::I8(v) => HostData::I8(go(v, &x, lo, hi)),
        HostData::I32(v) => HostData::I32(go(v, &x, lo, hi)),
        HostData::I64(v) => HostData::I64(go(v, &x, lo, hi)),
        HostData::U8(v) => HostData::U8(go(v, &x, lo, hi)),
        HostData::I16(v) => HostData::I16(go(v, &x, lo, hi)),
        HostData::U16(v) => HostData::U16(go(v, &x, lo, hi)),
        HostData::U32(v) => HostData::U32(go(v, &x, lo, hi)),
        HostData::U64(v) => HostData::U64(go(v, &x, lo, hi)),
        HostData::Bool(_) | HostData::C64(_) | HostData::C128(_) => {
            return Err(unsupported("cpu", "clip_scalar", x.dtype))
        }
    })
}
