//! Unary, binary (with broadcasting), cast and `where`, against the f64 reference.

use super::harness::*;
use super::reference::RefArray;
use crate::{BinaryOp, DType, Device, Tensor, UnaryOp};
use proptest::prelude::*;

const FLOATS: [DType; 4] = [DType::F32, DType::F64, DType::F16, DType::BF16];
const INTS: [DType; 8] = [
    DType::I8,
    DType::I16,
    DType::I32,
    DType::I64,
    DType::U8,
    DType::U16,
    DType::U32,
    DType::U64,
];

fn round_half_even(x: f64) -> f64 {
    let r = x.round();
    if (x - x.trunc()).abs() == 0.5 {
        2.0 * (x / 2.0).round()
    } else {
        r
    }
}

/// The math of each float unary op in f64, the input range that keeps it well conditioned,
/// and a tolerance multiplier.
/// (math, input range, tolerance multiplier) of a unary op.
type UnaryReference = (fn(f64) -> f64, (f64, f64), f64);

fn unary_reference(op: UnaryOp) -> UnaryReference {
    use UnaryOp::*;
    match op {
        Neg => (|x| -x, (-10.0, 10.0), 1.0),
        Abs => (|x| x.abs(), (-10.0, 10.0), 1.0),
        Sign => (
            |x| {
                if x > 0.0 {
                    1.0
                } else if x < 0.0 {
                    -1.0
                } else {
                    0.0
                }
            },
            (-3.0, 3.0),
            1.0,
        ),
        Exp => (|x| x.exp(), (-10.0, 10.0), 2.0),
        Expm1 => (|x| x.exp_m1(), (-5.0, 5.0), 2.0),
        Log => (|x| x.ln(), (0.05, 20.0), 2.0),
        Log1p => (|x| x.ln_1p(), (-0.9, 20.0), 2.0),
        Sqrt => (|x| x.sqrt(), (0.0, 50.0), 1.0),
        Rsqrt => (|x| 1.0 / x.sqrt(), (0.05, 50.0), 1.0),
        Square => (|x| x * x, (-10.0, 10.0), 1.0),
        Reciprocal => (|x| 1.0 / x, (0.1, 10.0), 1.0),
        Sin => (|x| x.sin(), (-6.0, 6.0), 2.0),
        Cos => (|x| x.cos(), (-6.0, 6.0), 2.0),
        Tan => (|x| x.tan(), (-1.2, 1.2), 4.0),
        Asin => (|x| x.asin(), (-0.95, 0.95), 2.0),
        Acos => (|x| x.acos(), (-0.95, 0.95), 2.0),
        Atan => (|x| x.atan(), (-10.0, 10.0), 2.0),
        Sinh => (|x| x.sinh(), (-5.0, 5.0), 2.0),
        Cosh => (|x| x.cosh(), (-5.0, 5.0), 2.0),
        Tanh => (|x| x.tanh(), (-5.0, 5.0), 2.0),
        Sigmoid => (|x| 1.0 / (1.0 + (-x).exp()), (-10.0, 10.0), 2.0),
        Erf => (libm::erf, (-3.0, 3.0), 2.0),
        Floor => (|x| x.floor(), (-10.0, 10.0), 1.0),
        Ceil => (|x| x.ceil(), (-10.0, 10.0), 1.0),
        Round => (round_half_even, (-10.0, 10.0), 1.0),
        Relu => (|x| x.max(0.0), (-10.0, 10.0), 1.0),
        IsFinite => (|x| x.is_finite() as u8 as f64, (-10.0, 10.0), 1.0),
        IsNan => (|x| x.is_nan() as u8 as f64, (-10.0, 10.0), 1.0),
        LogicalNot => (|x| (x == 0.0) as u8 as f64, (0.0, 2.0), 1.0),
        // The complex ops on real numbers, through the methods that define them there.
        Conj | Real => (|x| x, (-10.0, 10.0), 1.0),
        Imag => (|_| 0.0, (-10.0, 10.0), 1.0),
        Angle => (
            |x| if x < 0.0 { std::f64::consts::PI } else { 0.0 },
            (-3.0, 3.0),
            1.0,
        ),
    }
}

/// A unary op on a real tensor: the primitive, or for the complex ops (conj, real, imag,
/// angle) the method that gives them their meaning on real numbers.
fn apply_unary(x: &Tensor, op: UnaryOp) -> crate::Result<Tensor> {
    match op {
        UnaryOp::Conj => x.conj(),
        UnaryOp::Real => x.real(),
        UnaryOp::Imag => x.imag(),
        UnaryOp::Angle => x.angle(),
        _ => x.unary(op),
    }
}

/// Every float unary op, every float dtype, every layout kind.
pub fn unary_float_ops(device: &Device) {
    let floats = supported(device, &FLOATS);
    for &op in UnaryOp::ALL.iter().filter(|&&o| o != UnaryOp::LogicalNot) {
        let (f, (lo, hi), scale) = unary_reference(op);
        let strat = (array(4, 5, lo, hi), 0..floats.len(), view_kind());
        check(op.name(), strat, |(a, di, view)| {
            let dtype = floats[di];
            let mut a = quantized(dtype, &a);
            // Exact ties for round, and special values for the predicates.
            if matches!(op, UnaryOp::Round) && !a.data.is_empty() {
                a.data[0] = 2.5;
            }
            if matches!(op, UnaryOp::IsFinite | UnaryOp::IsNan) && a.data.len() >= 3 {
                a.data[0] = f64::NAN;
                a.data[1] = f64::INFINITY;
                a.data[2] = f64::NEG_INFINITY;
            }
            let x = ok("input", make_tensor(device, dtype, &a, view))?;
            let got = ok(op.name(), apply_unary(&x, op))?;
            // Half types: the op runs in f32 on the rounded input; the result is rounded once.
            let want = a.map(f);
            let want = if got.dtype() == DType::Bool {
                want
            } else {
                RefArray::new(&want.shape, quantize(dtype, &want.data))
            };
            assert_matches(
                &format!("{} {dtype} {view:?}", op.name()),
                &got,
                &want,
                scale,
            )
        });
    }
}

/// neg/abs/sign/square/relu on integers, logical_not on bool.
pub fn unary_int_ops(device: &Device) {
    let ints = supported(device, &INTS);
    for op in [
        UnaryOp::Neg,
        UnaryOp::Abs,
        UnaryOp::Sign,
        UnaryOp::Square,
        UnaryOp::Relu,
    ] {
        let (f, _, _) = unary_reference(op);
        check(
            op.name(),
            (array(3, 5, -11.0, 11.0), 0..ints.len(), view_kind()),
            |(a, di, view)| {
                let dtype = ints[di];
                let a = quantized(dtype, &a);
                let x = ok("input", make_tensor(device, dtype, &a, view))?;
                let got = x.unary(op);
                if !dtype.is_signed() && op == UnaryOp::Neg {
                    prop_assert!(got.is_err(), "neg of {dtype} must be an error");
                    return Ok(());
                }
                let want = a.map(|v| wrap_int(dtype, f(v)));
                assert_matches(
                    &format!("{} {dtype}", op.name()),
                    &ok(op.name(), got)?,
                    &want,
                    1.0,
                )
            },
        );
    }
    check(
        "logical_not",
        (array(3, 5, 0.0, 2.0), view_kind()),
        |(a, view)| {
            let a = quantized(DType::Bool, &a);
            let x = ok("input", make_tensor(device, DType::Bool, &a, view))?;
            assert_matches(
                "logical_not",
                &ok("logical_not", x.logical_not())?,
                &a.map(|v| (v == 0.0) as u8 as f64),
                1.0,
            )
        },
    );
}

/// Two broadcast-compatible arrays: an output shape, and each operand with some axes set to
/// 1 and some leading axes dropped.
pub fn broadcast_pair(lo: f64, hi: f64) -> impl Strategy<Value = (RefArray, RefArray)> {
    (
        shape(4, 4),
        prop::collection::vec(any::<bool>(), 4),
        prop::collection::vec(any::<bool>(), 4),
        0..3usize,
        0..3usize,
    )
        .prop_flat_map(move |(out, ma, mb, da, db)| {
            let mk = |mask: &[bool], drop: usize| -> Vec<usize> {
                let s: Vec<usize> = out
                    .iter()
                    .enumerate()
                    .map(|(i, &d)| if mask[i] { 1 } else { d })
                    .collect();
                s[drop.min(s.len())..].to_vec()
            };
            let (sa, sb) = (mk(&ma, da), mk(&mb, db));
            let (na, nb): (usize, usize) = (sa.iter().product(), sb.iter().product());
            (
                prop::collection::vec(lo..hi, na),
                prop::collection::vec(lo..hi, nb),
            )
                .prop_map(move |(x, y)| (RefArray::new(&sa, x), RefArray::new(&sb, y)))
        })
}

fn float_binary_reference(op: BinaryOp) -> fn(f64, f64) -> f64 {
    use BinaryOp::*;
    match op {
        Add => |a, b| a + b,
        Sub => |a, b| a - b,
        Mul => |a, b| a * b,
        Div => |a, b| a / b,
        FloorDiv => |a, b| (a / b).floor(),
        FloorMod => |a, b| {
            let r = a % b;
            if r != 0.0 && ((r < 0.0) != (b < 0.0)) {
                r + b
            } else {
                r
            }
        },
        Pow => |a, b| a.powf(b),
        Maximum => |a, b| a.max(b),
        Minimum => |a, b| a.min(b),
        SquaredDifference => |a, b| (a - b) * (a - b),
        Atan2 => |a, b| a.atan2(b),
        ReluGrad => |a, b| a * (b > 0.0) as u8 as f64,
        Equal => |a, b| (a == b) as u8 as f64,
        NotEqual => |a, b| (a != b) as u8 as f64,
        Less => |a, b| (a < b) as u8 as f64,
        LessEqual => |a, b| (a <= b) as u8 as f64,
        Greater => |a, b| (a > b) as u8 as f64,
        GreaterEqual => |a, b| (a >= b) as u8 as f64,
        LogicalAnd => |a, b| (a != 0.0 && b != 0.0) as u8 as f64,
        LogicalOr => |a, b| (a != 0.0 || b != 0.0) as u8 as f64,
        LogicalXor => |a, b| ((a != 0.0) != (b != 0.0)) as u8 as f64,
        // complex(a, b) has the real part a (the complex suite checks the rest)
        Complex => |a, _| a,
    }
}

/// Every arithmetic and comparison op on every float dtype, with broadcasting and views.
pub fn binary_float_ops(device: &Device) {
    let floats = supported(device, &FLOATS);
    for &op in BinaryOp::ALL
        .iter()
        .filter(|&&o| !o.is_logical() && o != BinaryOp::Complex)
    {
        let f = float_binary_reference(op);
        // Positive operands keep pow, floordiv and mod well conditioned; comparisons use a
        // coarse grid so that ties occur.
        let (lo, hi) = if matches!(
            op,
            BinaryOp::Pow | BinaryOp::Div | BinaryOp::FloorDiv | BinaryOp::FloorMod
        ) {
            (0.5, 4.0)
        } else {
            (-4.0, 4.0)
        };
        check(
            op.name(),
            (
                broadcast_pair(lo, hi),
                0..floats.len(),
                view_kind(),
                view_kind(),
                any::<bool>(),
                any::<bool>(),
            ),
            |((a, b), di, va, vb, negate, negate_divisor)| {
                let dtype = floats[di];
                let grid = |v: &RefArray| {
                    if op.is_comparison() {
                        v.map(|x| (x * 2.0).round() / 2.0)
                    } else {
                        v.clone()
                    }
                };
                let (mut a, mut b) = (quantized(dtype, &grid(&a)), quantized(dtype, &grid(&b)));
                let floor_op = matches!(op, BinaryOp::FloorDiv | BinaryOp::FloorMod);
                if negate && floor_op {
                    a = a.map(|x| -x);
                }
                // TF's floormod takes the divisor's sign: negative divisors too.
                if negate_divisor && floor_op {
                    b = b.map(|x| -x);
                }
                let (x, y) = (
                    ok("lhs", make_tensor(device, dtype, &a, va))?,
                    ok("rhs", make_tensor(device, dtype, &b, vb))?,
                );
                let got = ok(op.name(), x.binary(op, &y))?;
                let want = a.zip(&b, f);
                let want = if got.dtype() == DType::Bool {
                    want
                } else {
                    RefArray::new(&want.shape, quantize(dtype, &want.data))
                };
                // floordiv/mod sit on discontinuities; pow amplifies rounding of the inputs.
                let scale = match op {
                    BinaryOp::Pow => 8.0,
                    _ => 2.0,
                };
                if floor_op {
                    // Exact where the quotient is clear of an integer by more than the
                    // dtype's rounding of it (there a rounded quotient may fall either
                    // side, and any answer is right): floordiv exactly, mod within a
                    // rounding of |a| + |b|. Elsewhere unchecked.
                    let eps = epsilon(dtype);
                    let q = a.zip(&b, |p, q| p / q);
                    let aa = a.zip(&b, |p, _| p);
                    let bb = a.zip(&b, |_, q| q);
                    let tol: Vec<f64> = q
                        .data
                        .iter()
                        .zip(aa.data.iter().zip(&bb.data))
                        .map(|(&q, (&x, &y))| {
                            if (q - q.round()).abs() <= 4.0 * eps * q.abs().max(1.0) {
                                f64::INFINITY
                            } else if op == BinaryOp::FloorDiv {
                                0.0
                            } else {
                                2.0 * eps * (x.abs() + y.abs())
                            }
                        })
                        .collect();
                    return assert_within(&format!("{} {dtype}", op.name()), &got, &want, &tol);
                }
                assert_matches(&format!("{} {dtype}", op.name()), &got, &want, scale)
            },
        );
    }
}

/// Integer arithmetic (wrapping like TF), truncating div, floor div/mod, and comparisons.
pub fn binary_int_ops(device: &Device) {
    let ints = supported(device, &INTS);
    use BinaryOp::*;
    for op in [
        Add,
        Sub,
        Mul,
        Div,
        FloorDiv,
        FloorMod,
        Pow,
        Maximum,
        Minimum,
        SquaredDifference,
        Equal,
        NotEqual,
        Less,
        LessEqual,
        Greater,
        GreaterEqual,
    ] {
        let (lo, hi) = if op == Pow { (0.0, 4.0) } else { (-12.0, 12.0) };
        check(
            op.name(),
            (broadcast_pair(lo, hi), 0..ints.len(), view_kind()),
            |((a, b), di, va)| {
                let dtype = ints[di];
                let unsigned = !dtype.is_signed();
                let fix = |v: &RefArray, nonzero: bool| {
                    quantized(
                        dtype,
                        &v.map(|x| {
                            let x = if unsigned { x.abs() } else { x };
                            if nonzero && x.round() == 0.0 {
                                1.0
                            } else {
                                x
                            }
                        }),
                    )
                };
                let divides = matches!(op, Div | FloorDiv | FloorMod);
                let (a, b) = (fix(&a, false), fix(&b, divides));
                let (x, y) = (
                    ok("lhs", make_tensor(device, dtype, &a, va))?,
                    ok("rhs", make_tensor(device, dtype, &b, ViewKind::Contiguous))?,
                );
                let got = ok(op.name(), x.binary(op, &y))?;
                let want = a.zip(&b, |p, q| {
                    let r = match op {
                        Div => (p / q).trunc(),
                        Pow => p.powf(q),
                        _ => float_binary_reference(op)(p, q),
                    };
                    if op.is_comparison() {
                        r
                    } else {
                        wrap_int(dtype, r)
                    }
                });
                assert_matches(&format!("{} {dtype}", op.name()), &got, &want, 1.0)
            },
        );
    }
    // Integer division by zero is an error, as in TF.
    let x = Tensor::from_host_on(crate::HostData::I32(vec![1, 2]), &[2], *device).expect("upload");
    let z = Tensor::from_host_on(crate::HostData::I32(vec![1, 0]), &[2], *device).expect("upload");
    assert!(
        x.div(&z).is_err() && x.floormod(&z).is_err(),
        "integer division by zero must be an error"
    );
}

/// and/or/xor/equal on bool.
pub fn binary_logical_ops(device: &Device) {
    for op in [
        BinaryOp::LogicalAnd,
        BinaryOp::LogicalOr,
        BinaryOp::LogicalXor,
        BinaryOp::Equal,
        BinaryOp::NotEqual,
    ] {
        check(
            op.name(),
            (broadcast_pair(0.0, 2.0), view_kind()),
            |((a, b), va)| {
                let (a, b) = (
                    quantized(DType::Bool, &a.map(|v| v.floor())),
                    quantized(DType::Bool, &b.map(|v| v.floor())),
                );
                let (x, y) = (
                    ok("lhs", make_tensor(device, DType::Bool, &a, va))?,
                    ok(
                        "rhs",
                        make_tensor(device, DType::Bool, &b, ViewKind::Contiguous),
                    )?,
                );
                assert_matches(
                    op.name(),
                    &ok(op.name(), x.binary(op, &y))?,
                    &a.zip(&b, float_binary_reference(op)),
                    1.0,
                )
            },
        );
    }
}

/// `cast` between every pair of dtypes.
pub fn cast_all_pairs(device: &Device) {
    let dtypes = supported(device, &DType::ALL);
    check(
        "cast",
        (
            array(3, 4, -300.0, 300.0),
            0..dtypes.len(),
            0..dtypes.len(),
            view_kind(),
        ),
        |(a, from, to, view)| {
            let (from, to) = (dtypes[from], dtypes[to]);
            let a = quantized(from, &a);
            let x = ok("input", make_tensor(device, from, &a, view))?;
            let got = ok("cast", x.cast(to))?;
            let want: Vec<f64> = a
                .data
                .iter()
                .map(|&v| {
                    // complex numbers convert through their real part, as floats do
                    let inexact = |d: DType| d.is_float() || d.is_complex();
                    if !inexact(from) && !inexact(to) {
                        wrap_int(to, v)
                    } else {
                        quantize(to, &[v])[0]
                    }
                })
                .collect();
            assert_matches(
                &format!("cast {from} -> {to}"),
                &got,
                &RefArray::new(&a.shape, want),
                1.0,
            )
        },
    );
}

/// `where(cond, x, y)` with three-way broadcasting.
pub fn select(device: &Device) {
    let floats = supported(device, &FLOATS);
    check(
        "select",
        (broadcast_pair(-5.0, 5.0), 0..floats.len(), view_kind()),
        |((c, x), di, view)| {
            let dtype = floats[di];
            let cond = quantized(DType::Bool, &c.map(|v| (v > 0.0) as u8 as f64));
            let x = quantized(dtype, &x);
            let y = RefArray::new(&[], vec![-1.0]);
            let (tc, tx) = (
                ok("cond", make_tensor(device, DType::Bool, &cond, view))?,
                ok("x", make_tensor(device, dtype, &x, ViewKind::Contiguous))?,
            );
            let ty = ok("y", make_tensor(device, dtype, &y, ViewKind::Contiguous))?;
            let got = ok("select", Tensor::select(&tc, &tx, &ty))?;
            let want = cond
                .zip(&x, |c, v| if c != 0.0 { v } else { f64::NAN })
                .map(|v| if v.is_nan() { -1.0 } else { v });
            assert_matches("select", &got, &want, 1.0)
        },
    );
}

/// `clip_scalar` (fused where the backend has it, composed otherwise) over numeric dtypes
/// and layouts, bounds possibly crossed (then everything is `max`, as NumPy's clip), NaN kept.
pub fn clip_scalar(device: &Device) {
    let mut dtypes = supported(device, &FLOATS);
    dtypes.extend(supported(device, &INTS));
    check(
        "clip_scalar",
        (
            array(3, 5, -6.0, 6.0),
            0..dtypes.len(),
            view_kind(),
            -4i32..4,
            -4i32..4,
        ),
        |(a, di, view, lo, hi)| {
            let dtype = dtypes[di];
            let a = if !dtype.is_signed() {
                a.map(|v| v.abs())
            } else {
                a
            };
            let x = quantized(dtype, &a);
            let (lo, hi) = (lo as f64, hi as f64);
            let (lo, hi) = if !dtype.is_signed() {
                (lo.abs(), hi.abs())
            } else {
                (lo, hi)
            };
            let t = ok("x", make_tensor(device, dtype, &x, view))?;
            let got = ok("clip_scalar", t.clip_scalar(lo, hi))?;
            let want = x.map(|v| if v.is_nan() { v } else { v.max(lo).min(hi) });
            assert_matches("clip_scalar", &got, &want, 1.0)
        },
    );
}
