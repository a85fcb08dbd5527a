//! complex64 and complex128 against a reference in f64 pairs with its own arithmetic (the
//! textbook formulas, not the kernels' library): elementwise math with broadcasting and
//! views, building and taking apart, sums, products, scans, matmul, the FFT against the
//! plain DFT, casts. A backend without complex numbers must refuse them with an error that
//! names the dtype.

use super::elementwise::broadcast_pair;
use super::harness::*;
use super::reference::{unravel, RefArray};
use crate::{Axes, BinaryOp, Complex32, Complex64, DType, Device, HostData, Tensor, UnaryOp};
use proptest::prelude::*;
use proptest::test_runner::TestCaseError;
use std::f64::consts::PI;

const COMPLEX: [DType; 2] = [DType::C64, DType::C128];

/// A complex number of the reference.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct C {
    /// Real part.
    pub re: f64,
    /// Imaginary part.
    pub im: f64,
}

fn c(re: f64, im: f64) -> C {
    C { re, im }
}

impl C {
    fn add(self, o: C) -> C {
        c(self.re + o.re, self.im + o.im)
    }
    fn sub(self, o: C) -> C {
        c(self.re - o.re, self.im - o.im)
    }
    fn mul(self, o: C) -> C {
        c(
            self.re * o.re - self.im * o.im,
            self.re * o.im + self.im * o.re,
        )
    }
    fn div(self, o: C) -> C {
        let d = o.re * o.re + o.im * o.im;
        c(
            (self.re * o.re + self.im * o.im) / d,
            (self.im * o.re - self.re * o.im) / d,
        )
    }
    fn neg(self) -> C {
        c(-self.re, -self.im)
    }
    fn conj(self) -> C {
        c(self.re, -self.im)
    }
    fn abs(self) -> f64 {
        self.re.hypot(self.im)
    }
    fn exp(self) -> C {
        let r = self.re.exp();
        c(r * self.im.cos(), r * self.im.sin())
    }
    fn ln(self) -> C {
        c(self.abs().ln(), self.im.atan2(self.re))
    }
    /// The principal square root without cancellation: the larger part from `(|z| ± re)/2`,
    /// the other as `im / 2t` (the naive `√((|z| - re)/2)` loses every digit when `im` is
    /// tiny next to `re`, which made the asin reference wrong for small real parts).
    fn sqrt(self) -> C {
        let r = self.abs();
        if r == 0.0 {
            return c(0.0, self.im);
        }
        if self.re >= 0.0 {
            let t = ((r + self.re) / 2.0).sqrt();
            c(t, self.im / (2.0 * t))
        } else {
            let t = ((r - self.re) / 2.0).sqrt();
            c(
                self.im.abs() / (2.0 * t),
                if self.im < 0.0 { -t } else { t },
            )
        }
    }
    fn sin(self) -> C {
        c(
            self.re.sin() * self.im.cosh(),
            self.re.cos() * self.im.sinh(),
        )
    }
    fn cos(self) -> C {
        c(
            self.re.cos() * self.im.cosh(),
            -self.re.sin() * self.im.sinh(),
        )
    }
    fn sinh(self) -> C {
        c(
            self.re.sinh() * self.im.cos(),
            self.re.cosh() * self.im.sin(),
        )
    }
    fn cosh(self) -> C {
        c(
            self.re.cosh() * self.im.cos(),
            self.re.sinh() * self.im.sin(),
        )
    }
    /// -i·ln(iz + √(1 - z²))
    fn asin(self) -> C {
        let i = c(0.0, 1.0);
        let one = c(1.0, 0.0);
        i.mul(self)
            .add(one.sub(self.mul(self)).sqrt())
            .ln()
            .mul(i.neg())
    }
}

const ONE: C = C { re: 1.0, im: 0.0 };

/// (math, input range of both parts, tolerance multiplier) of a complex unary op.
type ComplexReference = (fn(C) -> C, (f64, f64), f64);

/// The reference of a complex unary op (`None` for the ops complex numbers do not take).
/// `Abs`, `Real`, `Imag`, `Angle` give a real number as the real part.
fn unary_reference(op: UnaryOp) -> Option<ComplexReference> {
    use UnaryOp::*;
    Some(match op {
        Neg => (|z| z.neg(), (-5.0, 5.0), 1.0),
        Abs => (|z| c(z.abs(), 0.0), (-5.0, 5.0), 1.0),
        Sign => (|z| z.div(c(z.abs(), 0.0)), (-5.0, 5.0), 1.0),
        Exp => (|z| z.exp(), (-3.0, 3.0), 2.0),
        Expm1 => (|z| z.exp().sub(ONE), (-2.0, 2.0), 4.0),
        Log => (|z| z.ln(), (-5.0, 5.0), 2.0),
        Log1p => (|z| ONE.add(z).ln(), (-2.0, 2.0), 4.0),
        Sqrt => (|z| z.sqrt(), (-5.0, 5.0), 2.0),
        Rsqrt => (|z| ONE.div(z.sqrt()), (-5.0, 5.0), 2.0),
        Square => (|z| z.mul(z), (-5.0, 5.0), 1.0),
        Reciprocal => (|z| ONE.div(z), (-5.0, 5.0), 1.0),
        Sin => (|z| z.sin(), (-2.0, 2.0), 2.0),
        Cos => (|z| z.cos(), (-2.0, 2.0), 2.0),
        Tan => (|z| z.sin().div(z.cos()), (-1.0, 1.0), 4.0),
        Asin => (|z| z.asin(), (-0.9, 0.9), 4.0),
        Acos => (|z| c(PI / 2.0, 0.0).sub(z.asin()), (-0.9, 0.9), 4.0),
        // (i/2)·(ln(1 - iz) - ln(1 + iz))
        Atan => (
            |z| {
                let iz = c(0.0, 1.0).mul(z);
                c(0.0, 0.5).mul(ONE.sub(iz).ln().sub(ONE.add(iz).ln()))
            },
            (-0.8, 0.8),
            4.0,
        ),
        Sinh => (|z| z.sinh(), (-2.0, 2.0), 2.0),
        Cosh => (|z| z.cosh(), (-2.0, 2.0), 2.0),
        Tanh => (|z| z.sinh().div(z.cosh()), (-1.0, 1.0), 4.0),
        Sigmoid => (|z| ONE.div(ONE.add(z.neg().exp())), (-1.5, 1.5), 4.0),
        Conj => (|z| z.conj(), (-5.0, 5.0), 1.0),
        Real => (|z| c(z.re, 0.0), (-5.0, 5.0), 1.0),
        Imag => (|z| c(z.im, 0.0), (-5.0, 5.0), 1.0),
        Angle => (|z| c(z.im.atan2(z.re), 0.0), (-5.0, 5.0), 1.0),
        Erf | Floor | Ceil | Round | Relu | IsFinite | IsNan | LogicalNot => return None,
    })
}

/// An imaginary part for each real part: a fixed scramble of it into `lo..hi`, so one
/// drawn array (and its broadcast shape) makes a complex one.
fn imag_of(re: f64, lo: f64, hi: f64) -> f64 {
    let u = ((re * 12.9898 + 0.2).sin() * 43_758.545_3).fract().abs();
    lo + u * (hi - lo)
}

/// The parts rounded to the dtype's part type.
fn rounded(dtype: DType, z: C) -> C {
    if dtype == DType::C64 {
        c(z.re as f32 as f64, z.im as f32 as f64)
    } else {
        z
    }
}

/// A complex array of `a`'s shape: real parts from `a`, imaginary parts scrambled from them.
fn complexify(dtype: DType, a: &RefArray, lo: f64, hi: f64) -> Vec<C> {
    a.data
        .iter()
        .map(|&re| rounded(dtype, c(re, imag_of(re, lo, hi))))
        .collect()
}

fn host_of(dtype: DType, v: &[C]) -> HostData {
    if dtype == DType::C64 {
        HostData::C64(
            v.iter()
                .map(|z| Complex32::new(z.re as f32, z.im as f32))
                .collect(),
        )
    } else {
        HostData::C128(v.iter().map(|z| Complex64::new(z.re, z.im)).collect())
    }
}

/// A complex tensor of `shape` holding `v` on `device` through the layout `view` asks for.
pub fn make_complex(
    device: &Device,
    dtype: DType,
    shape: &[usize],
    v: &[C],
    view: ViewKind,
) -> crate::Result<Tensor> {
    let indices = RefArray::new(shape, (0..v.len()).map(|i| i as f64).collect());
    make_view(&indices, view, -1.0, |s, idx| {
        let data: Vec<C> = idx
            .iter()
            .map(|&i| if i < 0.0 { c(7.0, -7.0) } else { v[i as usize] })
            .collect();
        Tensor::from_host_on(host_of(dtype, &data), s, *device)
    })
}

/// A result's values as reference numbers (real results with a zero imaginary part).
fn values(t: &Tensor) -> Result<Vec<C>, TestCaseError> {
    Ok(match ok("download", t.to_host())? {
        HostData::C64(v) => v.iter().map(|z| c(z.re as f64, z.im as f64)).collect(),
        HostData::C128(v) => v.iter().map(|z| c(z.re, z.im)).collect(),
        other => other.to_f64_vec().into_iter().map(|x| c(x, 0.0)).collect(),
    })
}

/// Each element within `atol + rtol·|want|` (as complex numbers), with the tolerances of the
/// part type times `scale` plus `extra_atol[i]`.
fn assert_complex(
    what: &str,
    got: &Tensor,
    shape: &[usize],
    want: &[C],
    scale: f64,
    extra_atol: impl Fn(usize) -> f64,
) -> Result<(), TestCaseError> {
    prop_assert_eq!(got.shape(), shape, "{}: shape", what);
    let (rtol, atol) = tolerance(got.dtype().real_dtype());
    let g = values(got)?;
    for (i, (x, y)) in g.iter().zip(want).enumerate() {
        let err = x.sub(*y).abs();
        let bound = scale * (atol + rtol * y.abs()) + extra_atol(i);
        prop_assert!(
            err <= bound || (x.re.is_nan() && y.re.is_nan()),
            "{}: element {} (index {:?}) is {:?}, reference {:?} ({})",
            what,
            i,
            unravel(i, shape),
            x,
            y,
            got.dtype()
        );
    }
    Ok(())
}

/// Every complex unary op on both complex dtypes and every layout kind.
pub fn complex_unary_ops(device: &Device) {
    let dtypes = supported(device, &COMPLEX);
    if dtypes.is_empty() {
        return refuses_complex(device);
    }
    for &op in UnaryOp::ALL {
        assert_eq!(
            unary_reference(op).is_some(),
            op.accepts_complex(),
            "{}: a reference exactly for the ops that take complex numbers",
            op.name()
        );
    }
    for (op, (f, (lo, hi), scale)) in UnaryOp::ALL
        .iter()
        .filter_map(|&op| Some((op, unary_reference(op)?)))
    {
        let strat = (array(4, 5, lo, hi), 0..dtypes.len(), view_kind());
        check(op.name(), strat, |(a, di, view)| {
            let dtype = dtypes[di];
            let z = complexify(dtype, &a, lo, hi);
            let x = ok("input", make_complex(device, dtype, &a.shape, &z, view))?;
            let got = ok(op.name(), x.unary(op))?;
            prop_assert_eq!(got.dtype(), op.output_dtype(dtype));
            let want: Vec<C> = z.iter().map(|&v| f(v)).collect();
            assert_complex(
                &format!("{} {dtype} {view:?}", op.name()),
                &got,
                &a.shape,
                &want,
                scale,
                |_| 0.0,
            )
        });
    }
    // the ops without a complex kernel are refused with an error naming the dtype
    let x =
        Tensor::from_host_on(host_of(dtypes[0], &[c(1.0, 2.0)]), &[1], *device).expect("upload");
    for &op in UnaryOp::ALL.iter().filter(|o| !o.accepts_complex()) {
        let e = x.unary(op).expect_err("no complex kernel");
        assert!(e.to_string().contains("complex"), "{}: {e}", op.name());
    }
    assert!(x.reduce_max(Axes::All, false).is_err() && x.argmax(0).is_err());
}

fn binary_reference(op: BinaryOp) -> fn(C, C) -> C {
    use BinaryOp::*;
    match op {
        Add => |a, b| a.add(b),
        Sub => |a, b| a.sub(b),
        Mul => |a, b| a.mul(b),
        Div => |a, b| a.div(b),
        Pow => |a, b| b.mul(a.ln()).exp(),
        SquaredDifference => |a, b| {
            let d = a.sub(b);
            d.mul(d.conj())
        },
        Equal => |a, b| c((a == b) as u8 as f64, 0.0),
        NotEqual => |a, b| c((a != b) as u8 as f64, 0.0),
        _ => |a, _| a,
    }
}

/// +, -, *, /, pow, squared_difference, ==, != with broadcasting and views.
pub fn complex_binary_ops(device: &Device) {
    let dtypes = supported(device, &COMPLEX);
    if dtypes.is_empty() {
        return;
    }
    for &op in BinaryOp::ALL.iter().filter(|o| o.accepts_complex()) {
        let f = binary_reference(op);
        let (lo, hi) = if op == BinaryOp::Pow {
            (-1.5, 1.5)
        } else {
            (-4.0, 4.0)
        };
        check(
            op.name(),
            (broadcast_pair(lo, hi), 0..dtypes.len(), view_kind()),
            |((a, b), di, view)| {
                let dtype = dtypes[di];
                let mut za = complexify(dtype, &a, lo, hi);
                let zb = complexify(dtype, &b, lo, hi);
                if op.is_comparison() && !za.is_empty() && !zb.is_empty() {
                    za[0] = zb[0]; // one certain tie
                }
                let x = ok("lhs", make_complex(device, dtype, &a.shape, &za, view))?;
                let y = ok(
                    "rhs",
                    make_complex(device, dtype, &b.shape, &zb, ViewKind::Contiguous),
                )?;
                let got = ok(op.name(), x.binary(op, &y))?;
                let shape = got.shape().to_vec();
                let want: Vec<C> = (0..shape.iter().product())
                    .map(|i| {
                        let idx = unravel(i, &shape);
                        let pick = |r: &RefArray, z: &[C]| {
                            let lead = idx.len() - r.shape.len();
                            let at: Vec<usize> = r
                                .shape
                                .iter()
                                .enumerate()
                                .map(|(k, &d)| if d == 1 { 0 } else { idx[lead + k] })
                                .collect();
                            let flat = at.iter().zip(&r.shape).fold(0, |acc, (&j, &d)| acc * d + j);
                            z[flat]
                        };
                        f(pick(&a, &za), pick(&b, &zb))
                    })
                    .collect();
                let scale = if op == BinaryOp::Pow { 8.0 } else { 2.0 };
                assert_complex(
                    &format!("{} {dtype} {view:?}", op.name()),
                    &got,
                    &shape,
                    &want,
                    scale,
                    |_| 0.0,
                )
            },
        );
    }
}

/// complex(re, im) with broadcasting, and real/imag/conj/angle of it back; casts between
/// complex and every real type.
pub fn complex_parts_and_casts(device: &Device) {
    let dtypes = supported(device, &COMPLEX);
    if dtypes.is_empty() {
        return;
    }
    check(
        "complex",
        (broadcast_pair(-3.0, 3.0), 0..dtypes.len(), view_kind()),
        |((a, b), di, view)| {
            let dtype = dtypes[di];
            let part = dtype.real_dtype();
            let (a, b) = (quantized(part, &a), quantized(part, &b));
            let re = ok("re", make_tensor(device, part, &a, view))?;
            let im = ok("im", make_tensor(device, part, &b, ViewKind::Contiguous))?;
            let z = ok("complex", Tensor::complex(&re, &im))?;
            prop_assert_eq!(z.dtype(), dtype);
            let shape = z.shape().to_vec();
            let back_re = ok("real", z.real())?;
            let back_im = ok("imag", z.imag())?;
            let want_re = ok("broadcast", re.broadcast_to(&shape))?;
            let want_im = ok("broadcast", im.broadcast_to(&shape))?;
            prop_assert_eq!(
                ok("re", back_re.to_f64_vec())?,
                ok("re", want_re.to_f64_vec())?
            );
            prop_assert_eq!(
                ok("im", back_im.to_f64_vec())?,
                ok("im", want_im.to_f64_vec())?
            );
            // casts: to the other complex type exactly (both parts), to a real type the real
            // part, to bool `z != 0`
            let other = if dtype == DType::C64 {
                DType::C128
            } else {
                DType::C64
            };
            let there = ok("cast", ok("cast", z.cast(other))?.cast(dtype))?;
            // complex64 holds in complex128; complex128 rounds each part to float32
            let want_there: Vec<C> = values(&z)?
                .iter()
                .map(|&v| rounded(DType::C64, v))
                .collect();
            prop_assert_eq!(values(&there)?, want_there);
            let as_real = ok("cast", z.cast(DType::F64))?;
            prop_assert_eq!(
                ok("re", as_real.to_f64_vec())?,
                ok("re", back_re.to_f64_vec())?
            );
            let nonzero = ok("cast", z.cast(DType::Bool))?;
            let want_nz: Vec<f64> = values(&z)?
                .iter()
                .map(|v| (v.re != 0.0 || v.im != 0.0) as u8 as f64)
                .collect();
            prop_assert_eq!(ok("bool", nonzero.to_f64_vec())?, want_nz);
            // a real tensor cast to complex has a zero imaginary part
            let from_real = ok("cast", want_re.cast(dtype))?;
            prop_assert_eq!(
                ok("re", from_real.real()?.to_f64_vec())?,
                ok("re", want_re.to_f64_vec())?
            );
            prop_assert!(ok("im", from_real.imag()?.to_f64_vec())?
                .iter()
                .all(|&v| v == 0.0));
            Ok(())
        },
    );
    let ints = Tensor::from_host_on(HostData::I32(vec![-3, 0, 7]), &[3], *device).expect("upload");
    let z = ints.cast(DType::C128).expect("int32 -> complex128");
    assert_eq!(
        z.to_vec::<Complex64>().expect("download"),
        [-3.0, 0.0, 7.0].map(|v| Complex64::new(v, 0.0))
    );
}

/// Σ and Π over random axes (and the mean), running sums and products, of complex tensors.
pub fn complex_reductions_and_scans(device: &Device) {
    let dtypes = supported(device, &COMPLEX);
    if dtypes.is_empty() {
        return;
    }
    let strat = (
        nonempty_array(4, 4, -1.2, 1.2),
        0..dtypes.len(),
        view_kind(),
        prop::collection::vec(any::<bool>(), 4),
        any::<(bool, bool)>(),
    );
    check(
        "complex_reductions",
        strat,
        |(a, di, view, mask, (exclusive, reverse))| {
            let dtype = dtypes[di];
            let z = complexify(dtype, &a, -1.2, 1.2);
            let x = ok("input", make_complex(device, dtype, &a.shape, &z, view))?;
            let rank = a.shape.len();
            let axes: Vec<usize> = (0..rank).filter(|&i| mask[i]).collect();
            let kept: Vec<usize> = (0..rank).filter(|i| !axes.contains(i)).collect();
            let out_shape: Vec<usize> = kept.iter().map(|&i| a.shape[i]).collect();
            let n_out: usize = out_shape.iter().product();
            let target = |i: usize| {
                let idx = unravel(i, &a.shape);
                kept.iter().fold(0, |acc, &k| acc * a.shape[k] + idx[k])
            };
            let (mut sum, mut prod) = (vec![c(0.0, 0.0); n_out], vec![ONE; n_out]);
            let mut sum_abs = vec![0.0; n_out];
            for (i, &v) in z.iter().enumerate() {
                let t = target(i);
                sum[t] = sum[t].add(v);
                prod[t] = prod[t].mul(v);
                sum_abs[t] += v.abs();
            }
            let list = Axes::List(axes.iter().map(|&i| i as isize).collect());
            let eps = epsilon(dtype.real_dtype());
            let got = ok("reduce_sum", x.reduce_sum(list.clone(), false))?;
            assert_complex("reduce_sum", &got, &out_shape, &sum, 1.0, |i| {
                4.0 * eps * sum_abs[i]
            })?;
            let got = ok("reduce_prod", x.reduce_prod(list.clone(), false))?;
            let count = (z.len() / n_out.max(1)) as f64;
            assert_complex("reduce_prod", &got, &out_shape, &prod, 4.0 * count, |_| 0.0)?;
            let got = ok("reduce_mean", x.reduce_mean(list, false))?;
            let mean: Vec<C> = sum.iter().map(|s| s.div(c(count, 0.0))).collect();
            assert_complex("reduce_mean", &got, &out_shape, &mean, 2.0, |i| {
                4.0 * eps * sum_abs[i] / count
            })?;
            // scans along the last axis
            let n = a.shape[rank - 1];
            let (mut csum, mut cprod) = (z.clone(), z.clone());
            for row in 0..z.len() / n {
                let (mut s, mut p) = (c(0.0, 0.0), ONE);
                for j in 0..n {
                    let k = if reverse { n - 1 - j } else { j };
                    let v = z[row * n + k];
                    let (s_next, p_next) = (s.add(v), p.mul(v));
                    (csum[row * n + k], cprod[row * n + k]) =
                        if exclusive { (s, p) } else { (s_next, p_next) };
                    (s, p) = (s_next, p_next);
                }
            }
            let last = rank as isize - 1;
            let got = ok("cumsum", x.cumsum(last, exclusive, reverse))?;
            assert_complex("cumsum", &got, &a.shape, &csum, 2.0 * n as f64, |_| {
                4.0 * eps * n as f64
            })?;
            let got = ok("cumprod", x.cumprod(last, exclusive, reverse))?;
            assert_complex("cumprod", &got, &a.shape, &cprod, 4.0 * n as f64, |_| 0.0)
        },
    );
}

/// Batched complex matmul with transposed operands against the triple loop.
pub fn complex_matmul(device: &Device) {
    let dtypes = supported(device, &COMPLEX);
    if dtypes.is_empty() {
        return;
    }
    let strat = (
        1..3usize,
        1..6usize,
        1..6usize,
        1..6usize,
        0..dtypes.len(),
        any::<(bool, bool)>(),
    )
        .prop_flat_map(|(b, m, k, n, di, t)| {
            (
                Just((b, m, k, n, di, t)),
                prop::collection::vec(-2.0..2.0f64, b * m * k),
                prop::collection::vec(-2.0..2.0f64, b * k * n),
            )
        });
    check(
        "complex_matmul",
        strat,
        |((b, m, k, n, di, (ta, tb)), ra, rb)| {
            let dtype = dtypes[di];
            let za = complexify(dtype, &RefArray::new(&[b, m, k], ra), -2.0, 2.0);
            let zb = complexify(dtype, &RefArray::new(&[b, k, n], rb), -2.0, 2.0);
            // A transposed operand is stored transposed and read through a transposed view.
            let stored = |z: &[C], r: usize, cols: usize, t: bool| -> crate::Result<Tensor> {
                if !t {
                    return Tensor::from_host_on(host_of(dtype, z), &[b, r, cols], *device);
                }
                let mut tz = z.to_vec();
                for bi in 0..b {
                    for i in 0..r {
                        for j in 0..cols {
                            tz[bi * r * cols + j * r + i] = z[bi * r * cols + i * cols + j];
                        }
                    }
                }
                Tensor::from_host_on(host_of(dtype, &tz), &[b, cols, r], *device)
            };
            let x = ok("lhs", stored(&za, m, k, ta))?;
            let y = ok("rhs", stored(&zb, k, n, tb))?;
            let got = ok("matmul", x.matmul_t(&y, ta, tb))?;
            let mut want = vec![c(0.0, 0.0); b * m * n];
            let mut bound = vec![0.0; b * m * n];
            for bi in 0..b {
                for i in 0..m {
                    for j in 0..n {
                        for p in 0..k {
                            let (u, v) = (za[bi * m * k + i * k + p], zb[bi * k * n + p * n + j]);
                            want[bi * m * n + i * n + j] =
                                want[bi * m * n + i * n + j].add(u.mul(v));
                            bound[bi * m * n + i * n + j] += u.abs() * v.abs();
                        }
                    }
                }
            }
            let eps = epsilon(dtype.real_dtype());
            assert_complex("matmul", &got, &[b, m, n], &want, 1.0, |i| {
                8.0 * eps * bound[i]
            })
        },
    );
}

/// The plain DFT of each row (exact twiddles: the angle from jk mod n).
fn dft(z: &[C], n: usize, inverse: bool) -> Vec<C> {
    let sign = if inverse { 1.0 } else { -1.0 };
    let mut out = vec![c(0.0, 0.0); z.len()];
    for (row_in, row_out) in z.chunks(n).zip(out.chunks_mut(n)) {
        for (k, o) in row_out.iter_mut().enumerate() {
            let mut acc = c(0.0, 0.0);
            for (j, &v) in row_in.iter().enumerate() {
                let angle = sign * 2.0 * PI * ((j * k) % n) as f64 / n as f64;
                acc = acc.add(v.mul(c(angle.cos(), angle.sin())));
            }
            *o = if inverse {
                c(acc.re / n as f64, acc.im / n as f64)
            } else {
                acc
            };
        }
    }
    out
}

/// fft and ifft over the last axis (powers of two and other lengths, primes among them) of
/// views against the DFT; rfft and irfft against the DFT of the real signal and of the
/// Hermitian extension.
pub fn complex_fft(device: &Device) {
    let dtypes = supported(device, &COMPLEX);
    if dtypes.is_empty() {
        return;
    }
    let strat = (
        1..4usize,
        1..40usize,
        0..dtypes.len(),
        view_kind(),
        1..40usize,
    )
        .prop_flat_map(|(rows, n, di, view, m)| {
            (
                Just((rows, n, di, view, m)),
                prop::collection::vec(-2.0..2.0f64, rows * n),
            )
        });
    check("fft", strat, |((rows, n, di, view, m), data)| {
        let dtype = dtypes[di];
        let a = RefArray::new(&[rows, n], data);
        let z = complexify(dtype, &a, -2.0, 2.0);
        let x = ok("input", make_complex(device, dtype, &[rows, n], &z, view))?;
        let eps = epsilon(dtype.real_dtype());
        let scale_of = |v: &[C]| v.iter().map(|z| z.abs()).sum::<f64>();
        let total = scale_of(&z);
        let log_n = (n as f64).log2().max(1.0);
        let got = ok("fft", x.fft())?;
        assert_complex("fft", &got, &[rows, n], &dft(&z, n, false), 1.0, |_| {
            8.0 * eps * log_n * total
        })?;
        let got = ok("ifft", x.ifft())?;
        assert_complex("ifft", &got, &[rows, n], &dft(&z, n, true), 1.0, |_| {
            8.0 * eps * log_n * total / n as f64
        })?;
        // rfft of the real parts, cut or padded to m
        let part = dtype.real_dtype();
        let re = quantized(part, &a);
        let xr = ok("real input", make_tensor(device, part, &re, view))?;
        let got = ok("rfft", xr.rfft(Some(m)))?;
        let padded: Vec<C> = (0..rows)
            .flat_map(|r| (0..m).map(move |j| (r, j)))
            .map(|(r, j)| c(if j < n { re.data[r * n + j] } else { 0.0 }, 0.0))
            .collect();
        let full = dft(&padded, m, false);
        let half = m / 2 + 1;
        let want: Vec<C> = (0..rows * half)
            .map(|i| full[(i / half) * m + i % half])
            .collect();
        let total_re = scale_of(&padded);
        let log_m = (m as f64).log2().max(1.0);
        assert_complex("rfft", &got, &[rows, half], &want, 1.0, |_| {
            8.0 * eps * log_m * total_re
        })?;
        // irfft of a complex input of n frequencies to m samples: the inverse DFT of the
        // Hermitian extension of its first m/2 + 1 frequencies (imaginary parts of the zero
        // and Nyquist frequencies dropped)
        let got = ok("irfft", x.irfft(Some(m)))?;
        let mut ext = Vec::with_capacity(rows * m);
        for r in 0..rows {
            let f = |k: usize| if k < n { z[r * n + k] } else { c(0.0, 0.0) };
            for k in 0..m {
                let mut v = if k <= m / 2 { f(k) } else { f(m - k).conj() };
                if k == 0 || 2 * k == m {
                    v.im = 0.0;
                }
                ext.push(v);
            }
        }
        let want: Vec<C> = dft(&ext, m, true).iter().map(|v| c(v.re, 0.0)).collect();
        prop_assert_eq!(got.dtype(), part);
        let total_ext = scale_of(&ext);
        assert_complex("irfft", &got, &[rows, m], &want, 1.0, |_| {
            8.0 * eps * log_m * total_ext / m as f64
        })
    });
    // real input to fft, complex input to rfft, and rank 0 are errors
    let r = Tensor::from_host_on(HostData::F32(vec![1.0, 2.0]), &[2], *device).expect("upload");
    assert!(r.fft().is_err() && r.ifft().is_err() && r.irfft(None).is_err());
    let z = r.cast(dtypes[0]).expect("cast");
    assert!(z.rfft(None).is_err());
    assert!(z.reshape_to(&[2]).expect("reshape").irfft(Some(0)).is_err());
}

/// A backend without complex numbers refuses them with an error naming the dtype.
fn refuses_complex(device: &Device) {
    for dtype in COMPLEX {
        let e = Tensor::from_host_on(host_of(dtype, &[c(1.0, -1.0)]), &[1], *device)
            .expect_err("no complex storage on this backend");
        assert!(e.to_string().contains(dtype.as_str()), "{e}");
    }
}
