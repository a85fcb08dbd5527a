//! Elementwise kernels: unary math, binary arithmetic, comparisons and logic (inputs read
//! through their broadcast layouts), and casts (`wgsl/cast.wgsl`).

use super::{map_one, map_source, output, run_map, same_gpu, In};
use crate::buffer::WgpuBuffer;
use crate::elem::{unsupported_on, Elem, Params};
use crate::shaders::kernel_source;
use ferroflow_tensor::{BinaryOp, DType, Error, Result, UnaryOp};

pub(super) fn unary_expr(op: UnaryOp, e: Elem) -> Option<&'static str> {
    use UnaryOp::*;
    Some(match e {
        Elem::F32 | Elem::F16 => match op {
            Neg => "-x",
            Abs => "abs(x)",
            Sign => "f_sign(x)",
            Exp => "f_exp(x)",
            Expm1 => "f_expm1(x)",
            Log => "f_log(x)",
            Log1p => "f_log1p(x)",
            Sqrt => "f_sqrt(x)",
            Rsqrt => "f_rsqrt(x)",
            Square => "x * x",
            Reciprocal => "f_div(1.0, x)",
            Sin => "f_sin(x)",
            Cos => "f_cos(x)",
            Tan => "f_tan(x)",
            Asin => "f_asin(x)",
            Acos => "f_acos(x)",
            Atan => "f_atan(x)",
            Sinh => "f_sinh(x)",
            Cosh => "f_cosh(x)",
            Tanh => "f_tanh(x)",
            Sigmoid => "f_sigmoid(x)",
            Erf => "f_erf(x)",
            Floor => "floor(x)",
            Ceil => "ceil(x)",
            Round => "round(x)",
            Relu => "select(x, 0.0, x < 0.0)",
            IsFinite => "u32(is_finite(x))",
            IsNan => "u32(is_nan(x))",
            // complex numbers live on the CPU backend; on real ones these are composed
            LogicalNot | Conj | Real | Imag | Angle => return None,
        },
        Elem::I32 => match op {
            Neg => "-x",
            Abs => "i_abs(x)",
            Sign => "sign(x)",
            Square => "x * x",
            Relu => "max(x, 0)",
            _ => return None,
        },
        // Neg is refused above the backend for unsigned types.
        Elem::U32 => match op {
            Abs | Relu => "x",
            Sign => "u32(x > 0u)",
            Square => "x * x",
            _ => return None,
        },
        Elem::Bool => match op {
            LogicalNot => "u32(x == 0u)",
            _ => return None,
        },
        Elem::I64 => return None,
    })
}

/// `op` on storage type `e` into `oe` (its output dtype's), or `None` where the backend has
/// no such kernel.
pub(crate) fn unary_source(op: UnaryOp, e: Elem, oe: Elem) -> Option<String> {
    let expr = unary_expr(op, e)?;
    let body = format!(
        "    let x = {};\n    Y[i] = {};",
        e.load("A[at(P[1], i)]"),
        oe.store_expr(expr)
    );
    Some(map_source(
        &[e, oe],
        &[e.store()],
        &[oe.store()],
        false,
        &body,
    ))
}

pub(crate) fn unary(op: UnaryOp, x: &In<'_>) -> Result<WgpuBuffer> {
    let gpu = x.gpu();
    let e = x.elem();
    if unary_expr(op, e).is_none() {
        return Err(unsupported_on(gpu, op.name(), e.dtype()));
    }
    let oe = Elem::of(gpu, op.output_dtype(e.dtype()), op.name())?;
    let out = output(gpu, oe, x.n())?;
    let k = gpu.kernel(&format!("unary_{}_{:?}", op.name(), e), 1, 1, || {
        unary_source(op, e, oe).unwrap_or_default()
    })?;
    map_one(&k, x, out)
}

/// (expression, needs a nonzero divisor check, needs a non-negative exponent check)
pub(super) fn binary_expr(op: BinaryOp, e: Elem) -> Option<(&'static str, bool, bool)> {
    use BinaryOp::*;
    let plain = |s| Some((s, false, false));
    match e {
        Elem::F32 | Elem::F16 => match op {
            Add => plain("a + b"),
            Sub => plain("a - b"),
            Mul => plain("a * b"),
            Div => plain("f_div(a, b)"),
            FloorDiv => plain("f_floordiv(a, b)"),
            FloorMod => plain("f_floormod(a, b)"),
            Pow => plain("f_pow(a, b)"),
            Maximum => plain("f_max(a, b)"),
            Minimum => plain("f_min(a, b)"),
            SquaredDifference => plain("(a - b) * (a - b)"),
            Atan2 => plain("f_atan2(a, b)"),
            ReluGrad => plain("a * select(0.0, 1.0, f_lt(0.0, b))"),
            Equal => plain("u32(f_eq(a, b))"),
            NotEqual => plain("u32(!f_eq(a, b))"),
            Less => plain("u32(f_lt(a, b))"),
            LessEqual => plain("u32(f_le(a, b))"),
            Greater => plain("u32(f_lt(b, a))"),
            GreaterEqual => plain("u32(f_le(b, a))"),
            LogicalAnd | LogicalOr | LogicalXor | Complex => None,
        },
        Elem::I32 => match op {
            Add => plain("a + b"),
            Sub => plain("a - b"),
            Mul => plain("a * b"),
            Div => Some(("a / b", true, false)),
            FloorDiv => Some(("i_floordiv(a, b)", true, false)),
            FloorMod => Some(("i_floormod(a, b)", true, false)),
            Pow => Some(("i_pow(a, b)", false, true)),
            Maximum => plain("max(a, b)"),
            Minimum => plain("min(a, b)"),
            SquaredDifference => plain("(a - b) * (a - b)"),
            Equal => plain("u32(a == b)"),
            NotEqual => plain("u32(a != b)"),
            Less => plain("u32(a < b)"),
            LessEqual => plain("u32(a <= b)"),
            Greater => plain("u32(a > b)"),
            GreaterEqual => plain("u32(a >= b)"),
            Atan2 | ReluGrad | LogicalAnd | LogicalOr | LogicalXor | Complex => None,
        },
        Elem::U32 => match op {
            Add => plain("a + b"),
            Sub => plain("a - b"),
            Mul => plain("a * b"),
            // Unsigned: floor division is truncating division, the modulo is the remainder.
            Div | FloorDiv => Some(("a / b", true, false)),
            FloorMod => Some(("a % b", true, false)),
            Pow => plain("u_pow(a, b)"),
            Maximum => plain("max(a, b)"),
            Minimum => plain("min(a, b)"),
            SquaredDifference => plain("(a - b) * (a - b)"),
            Equal => plain("u32(a == b)"),
            NotEqual => plain("u32(a != b)"),
            Less => plain("u32(a < b)"),
            LessEqual => plain("u32(a <= b)"),
            Greater => plain("u32(a > b)"),
            GreaterEqual => plain("u32(a >= b)"),
            Atan2 | ReluGrad | LogicalAnd | LogicalOr | LogicalXor | Complex => None,
        },
        Elem::Bool => match op {
            LogicalAnd => plain("a & b"),
            LogicalOr => plain("a | b"),
            LogicalXor => plain("a ^ b"),
            Equal => plain("u32(a == b)"),
            NotEqual => plain("u32(a != b)"),
            Less => plain("u32(a < b)"),
            LessEqual => plain("u32(a <= b)"),
            Greater => plain("u32(a > b)"),
            GreaterEqual => plain("u32(a >= b)"),
            Maximum => plain("max(a, b)"),
            Minimum => plain("min(a, b)"),
            _ => None,
        },
        Elem::I64 => match op {
            Equal => plain("u32(all(a == b))"),
            NotEqual => plain("u32(any(a != b))"),
            _ => None,
        },
    }
}

/// `op` on storage type `e` into `oe`, or `None` where the backend has no such kernel. Integer
/// division and powers are checked: a zero divisor or a negative exponent is recorded in
/// the error word.
pub(crate) fn binary_source(op: BinaryOp, e: Elem, oe: Elem) -> Option<String> {
    let (expr, div_check, pow_check) = binary_expr(op, e)?;
    let mut body = format!(
        "    let a = {};\n    let b = {};\n",
        e.load("A[at(P[1], i)]"),
        e.load("B[at(P[2], i)]")
    );
    if div_check {
        body += "    if b == 0 { atomicMax(&E[0], 1u); Y[i] = 0; return; }\n";
    }
    if pow_check {
        body += "    if b < 0 { atomicMax(&E[0], 3u); Y[i] = 0; return; }\n";
    }
    body += &format!("    Y[i] = {};", oe.store_expr(expr));
    Some(map_source(
        &[e, oe],
        &[e.store(), e.store()],
        &[oe.store()],
        div_check || pow_check,
        &body,
    ))
}

pub(crate) fn binary(op: BinaryOp, a: &In<'_>, b: &In<'_>) -> Result<WgpuBuffer> {
    same_gpu(op.name(), a, b)?;
    let gpu = a.gpu();
    let e = a.elem();
    let (_, div_check, pow_check) =
        binary_expr(op, e).ok_or_else(|| unsupported_on(gpu, op.name(), e.dtype()))?;
    let oe = Elem::of(gpu, op.output_dtype(e.dtype()), op.name())?;
    let n = a.n();
    let out = output(gpu, oe, n)?;
    let checked = div_check || pow_check;
    let k = gpu.kernel(
        &format!("binary_{}_{:?}", op.name(), e),
        2,
        1 + checked as usize,
        || binary_source(op, e, oe).unwrap_or_default(),
    )?;
    let p = Params::new(n).desc(0, a.desc()).desc(1, b.desc());
    let word = run_map(
        gpu,
        &k,
        p,
        &[a.buf.raw(), b.buf.raw()],
        &[out.raw()],
        checked,
        n,
    )?;
    if let Some(word) = word {
        match gpu.data_error(word)?[0] {
            0 => {}
            3 => {
                return Err(Error::Arithmetic {
                    op: "pow",
                    msg: "integers to negative integer powers are not allowed",
                })
            }
            _ => {
                return Err(Error::Arithmetic {
                    op: op.name(),
                    msg: "integer division by zero",
                })
            }
        }
    }
    Ok(out)
}

/// The WGSL expression converting `v` from storage type `from` to `to` (saturating float to
/// integer, int64 as two words), or `None` for a pair the backend does not convert.
fn cast_expr(from: Elem, to: Elem) -> Option<String> {
    use Elem::*;
    Some(match (from, to) {
        (a, b) if a == b => "v".to_string(),
        (F32 | F16, F32 | F16) => to.store_expr(&from.load("v")),
        (F32 | F16, I32) => format!("f_to_i32({})", from.load("v")),
        (F32 | F16, Bool) => format!("u32(is_nan({0}) || {0} != 0.0)", from.load("v")),
        (F32 | F16, I64) => format!("f_to_i64({})", from.load("v")),
        (I32, F32 | F16) => to.store_expr("f32(v)"),
        (I32, Bool) => "u32(v != 0)".into(),
        (I32, I64) => "vec2<u32>(bitcast<u32>(v), select(0u, 0xffffffffu, v < 0))".into(),
        (F32 | F16, U32) => format!("f_to_u32({})", from.load("v")),
        (U32, F32 | F16) => to.store_expr("f32(v)"),
        (U32, I32) => "bitcast<i32>(v)".into(),
        (I32, U32) => "bitcast<u32>(v)".into(),
        (U32, Bool) => "u32(v != 0u)".into(),
        (U32, I64) => "vec2<u32>(v, 0u)".into(),
        (I64, U32) => "v.x".into(),
        (Bool, U32) => "v".into(),
        (Bool, F32 | F16) => to.store_expr("f32(v)"),
        (Bool, I32) => "i32(v)".into(),
        (Bool, I64) => "vec2<u32>(v, 0u)".into(),
        (I64, I32) => "bitcast<i32>(v.x)".into(),
        (I64, Bool) => "u32(v.x != 0u || v.y != 0u)".into(),
        (I64, F32 | F16) => to.store_expr("i64_to_f32(v)"),
        _ => return None,
    })
}

/// Conversion from storage type `from` to `to` (helpers in `wgsl/cast.wgsl`).
pub(crate) fn cast_source(from: Elem, to: Elem) -> Option<String> {
    use Elem::F16;
    let expr = cast_expr(from, to)?;
    let body = format!("    let v = A[at(P[1], i)];\n    Y[i] = {expr};");
    Some(kernel_source(
        from == F16 || to == F16,
        &format!(
            "{}{}{}{body}\n}}\n",
            include_str!("../wgsl/cast.wgsl"),
            super::bindings(&[from.store()], &[to.store()], false),
            super::MAIN,
        ),
    ))
}

pub(crate) fn cast(x: &In<'_>, to: DType) -> Result<WgpuBuffer> {
    let gpu = x.gpu();
    let from = x.elem();
    let to_elem = Elem::of(gpu, to, "cast")?;
    if cast_expr(from, to_elem).is_none() {
        return Err(unsupported_on(gpu, "cast", to));
    }
    let out = output(gpu, to_elem, x.n())?;
    let k = gpu.kernel(&format!("cast_{from:?}_{to_elem:?}"), 1, 1, || {
        cast_source(from, to_elem).unwrap_or_default()
    })?;
    map_one(&k, x, out)
}
