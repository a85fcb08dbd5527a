//! complex64 and complex128: elementwise math, sums, products and scans, and the FFT.
//! (Matmul goes through the `gemm` crate's complex kernels in `matmul`; data movement is
//! generic over every element type.)
//!
//! The elementwise functions follow TF's kernels: `sign` is z/|z| (0 at 0), `abs` the
//! modulus, `squared_difference` is (a-b)·conj(a-b), `pow` is exp(b·ln a). `expm1` and
//! `log1p` keep their precision near zero.

use super::binary::apply;
use crate::buffer::dense;
use crate::simd::map;
use ferroflow_tensor::{
    backend::unsupported, BinaryOp, Complex64, Element, HostData, Layout, Result, UnaryOp,
};
use num_complex::Complex;
use num_traits::{Float, FloatConst, One, Zero};
use rayon::prelude::*;

/// The part type of a complex element: f32 for complex64, f64 for complex128.
pub(crate) trait Part: Float + FloatConst + Element + Send + Sync
where
    Complex<Self>: Element,
{
}
impl Part for f32 {}
impl Part for f64 {}

fn sign<F: Part>(z: Complex<F>) -> Complex<F>
where
    Complex<F>: Element,
{
    let r = z.norm();
    if r == F::zero() {
        Complex::zero()
    } else {
        z / r
    }
}

/// e^z - 1 = (expm1(x)·cos y - 2 sin²(y/2)) + i·eˣ sin y, exact near zero.
fn expm1<F: Part>(z: Complex<F>) -> Complex<F>
where
    Complex<F>: Element,
{
    let half = (z.im / (F::one() + F::one())).sin();
    let two = F::one() + F::one();
    Complex::new(
        z.re.exp_m1() * z.im.cos() - two * half * half,
        z.re.exp() * z.im.sin(),
    )
}

/// ln(1 + z) = ½·log1p(2x + x² + y²) + i·atan2(y, 1 + x), exact near zero.
fn log1p<F: Part>(z: Complex<F>) -> Complex<F>
where
    Complex<F>: Element,
{
    let two = F::one() + F::one();
    let t = two * z.re + z.re * z.re + z.im * z.im;
    if t.abs() < <F as Element>::from_f64(0.5) {
        Complex::new(t.ln_1p() / two, z.im.atan2(F::one() + z.re))
    } else {
        (Complex::<F>::one() + z).ln()
    }
}

/// A unary op on complex elements; `Abs`, `Real`, `Imag` and `Angle` give their part type.
pub(crate) fn unary<F: Part>(op: UnaryOp, v: &[Complex<F>], layout: &Layout) -> Result<HostData>
where
    Complex<F>: Element,
{
    use UnaryOp::*;
    let x = dense(v, layout);
    let real = |f: fn(Complex<F>) -> F| Ok(F::into_host(map(&x, f)));
    let one = Complex::<F>::one();
    let out: Vec<Complex<F>> = match op {
        Abs => return real(|z| z.norm()),
        Real => return real(|z| z.re),
        Imag => return real(|z| z.im),
        Angle => return real(|z| z.arg()),
        Neg => map(&x, |z: Complex<F>| -z),
        Conj => map(&x, |z: Complex<F>| z.conj()),
        Sign => map(&x, sign),
        Exp => map(&x, |z: Complex<F>| z.exp()),
        Expm1 => map(&x, expm1),
        Log => map(&x, |z: Complex<F>| z.ln()),
        Log1p => map(&x, log1p),
        Sqrt => map(&x, |z: Complex<F>| z.sqrt()),
        Rsqrt => map(&x, |z: Complex<F>| one / z.sqrt()),
        Square => map(&x, |z: Complex<F>| z * z),
        Reciprocal => map(&x, |z: Complex<F>| one / z),
        Sin => map(&x, |z: Complex<F>| z.sin()),
        Cos => map(&x, |z: Complex<F>| z.cos()),
        Tan => map(&x, |z: Complex<F>| z.tan()),
        Asin => map(&x, |z: Complex<F>| z.asin()),
        Acos => map(&x, |z: Complex<F>| z.acos()),
        Atan => map(&x, |z: Complex<F>| z.atan()),
        Sinh => map(&x, |z: Complex<F>| z.sinh()),
        Cosh => map(&x, |z: Complex<F>| z.cosh()),
        Tanh => map(&x, |z: Complex<F>| z.tanh()),
        Sigmoid => map(&x, |z: Complex<F>| one / (one + (-z).exp())),
        Erf | Floor | Ceil | Round | Relu | IsFinite | IsNan | LogicalNot => {
            return Err(unsupported("cpu", op.name(), <Complex<F>>::DTYPE))
        }
    };
    Ok(Complex::<F>::into_host(out))
}

/// A binary op on complex elements (both operands already broadcast to the output shape).
pub(crate) fn binary<F: Part>(
    op: BinaryOp,
    a: &[Complex<F>],
    la: &Layout,
    b: &[Complex<F>],
    lb: &Layout,
) -> Result<HostData>
where
    Complex<F>: Element,
{
    use BinaryOp::{Add, Div, Equal, Mul, NotEqual, Pow, SquaredDifference, Sub};
    let v: Vec<Complex<F>> = match op {
        Add => apply(a, la, b, lb, |x: Complex<F>, y| x + y),
        Sub => apply(a, la, b, lb, |x: Complex<F>, y| x - y),
        Mul => apply(a, la, b, lb, |x: Complex<F>, y| x * y),
        Div => apply(a, la, b, lb, |x: Complex<F>, y| x / y),
        Pow => apply(a, la, b, lb, |x: Complex<F>, y| (y * x.ln()).exp()),
        SquaredDifference => apply(a, la, b, lb, |x: Complex<F>, y| {
            let d = x - y;
            d * d.conj()
        }),
        Equal => return Ok(HostData::Bool(apply(a, la, b, lb, |x, y| x == y))),
        NotEqual => return Ok(HostData::Bool(apply(a, la, b, lb, |x, y| x != y))),
        _ => return Err(unsupported("cpu", op.name(), <Complex<F>>::DTYPE)),
    };
    Ok(Complex::<F>::into_host(v))
}

/// `tf.complex`: re + im·i from two float operands.
pub(crate) fn make<F: Part>(re: &[F], lre: &Layout, im: &[F], lim: &Layout) -> HostData
where
    Complex<F>: Element,
{
    Complex::<F>::into_host(apply(re, lre, im, lim, |x: F, y: F| Complex::new(x, y)))
}

/// The transform of one row in place: iterative radix-2 for powers of two, Bluestein's
/// chirp-z (three power-of-two transforms) for other lengths; computed in f64.
struct Plan {
    n: usize,
    /// e^(∓2πi·k/m) for k < m/2 of the power-of-two size m the rows run at.
    twiddles: Vec<Complex64>,
    /// Bluestein: the chirp e^(∓πi·k²/n) for k < n, and the transformed filter of size m.
    chirp: Option<(Vec<Complex64>, Vec<Complex64>)>,
}

impl Plan {
    fn new(n: usize, inverse: bool) -> Plan {
        let sign = if inverse { 1.0 } else { -1.0 };
        let m = if n.is_power_of_two() {
            n
        } else {
            (2 * n - 1).next_power_of_two()
        };
        let twiddles = (0..m / 2)
            .map(|k| {
                Complex64::from_polar(1.0, sign * 2.0 * std::f64::consts::PI * k as f64 / m as f64)
            })
            .collect();
        let mut plan = Plan {
            n,
            twiddles,
            chirp: None,
        };
        if m != n {
            // k² mod 2n keeps the angle exact for large k.
            let chirp: Vec<Complex64> = (0..n)
                .map(|k| {
                    let k2 = (k as u128 * k as u128 % (2 * n as u128)) as f64;
                    Complex64::from_polar(1.0, sign * std::f64::consts::PI * k2 / n as f64)
                })
                .collect();
            let mut filter = vec![Complex64::zero(); m];
            filter[0] = chirp[0].conj();
            for k in 1..n {
                filter[k] = chirp[k].conj();
                filter[m - k] = chirp[k].conj();
            }
            plan.radix2(&mut filter);
            plan.chirp = Some((chirp, filter));
        }
        plan
    }

    /// The unscaled transform of `buf` (length m, a power of two) with the plan's sign.
    fn radix2(&self, buf: &mut [Complex64]) {
        let m = buf.len();
        if m <= 1 {
            return;
        }
        let bits = m.trailing_zeros();
        for i in 0..m {
            let j = i.reverse_bits() >> (usize::BITS - bits);
            if i < j {
                buf.swap(i, j);
            }
        }
        let mut len = 2;
        while len <= m {
            let step = m / len;
            for start in (0..m).step_by(len) {
                for j in 0..len / 2 {
                    let w = self.twiddles[j * step];
                    let u = buf[start + j];
                    let v = buf[start + j + len / 2] * w;
                    buf[start + j] = u + v;
                    buf[start + j + len / 2] = u - v;
                }
            }
            len <<= 1;
        }
    }

    /// The transform of one row of n values (unscaled).
    fn run(&self, row: &mut [Complex64], scratch: &mut Vec<Complex64>) {
        let Some((chirp, filter)) = &self.chirp else {
            self.radix2(row);
            return;
        };
        let m = filter.len();
        let n = self.n;
        // The transform of the inverse direction reuses the forward twiddles conjugated:
        // conv = ifft(fft(a)·fft(b)) = conj(fft(conj(fft(a)·fft(b)))) / m.
        scratch.clear();
        scratch.resize(m, Complex64::zero());
        for k in 0..n {
            scratch[k] = row[k] * chirp[k];
        }
        self.radix2(scratch);
        for (s, f) in scratch.iter_mut().zip(filter) {
            *s = (*s * f).conj();
        }
        self.radix2(scratch);
        let scale = 1.0 / m as f64;
        for k in 0..n {
            row[k] = scratch[k].conj() * scale * chirp[k];
        }
    }
}

/// `fft` / `ifft` of every row along the last axis (ifft scaled by 1/n), in f64.
pub(crate) fn fft<F: Part>(v: &[Complex<F>], layout: &Layout, inverse: bool) -> HostData
where
    Complex<F>: Element,
{
    let x = dense(v, layout);
    let n = layout.shape().last().copied().unwrap_or(1);
    if n == 0 || x.is_empty() {
        return Complex::<F>::into_host(x.into_owned());
    }
    let plan = Plan::new(n, inverse);
    let scale = if inverse { 1.0 / n as f64 } else { 1.0 };
    let to64 = |z: &Complex<F>| Complex64::new(Element::to_f64(z.re), Element::to_f64(z.im));
    let back = |z: Complex64| {
        Complex::new(
            <F as Element>::from_f64(z.re * scale),
            <F as Element>::from_f64(z.im * scale),
        )
    };
    let mut out = vec![Complex::<F>::zero(); x.len()];
    let row = |(dst, src): (&mut [Complex<F>], &[Complex<F>])| {
        let mut buf: Vec<Complex64> = src.iter().map(to64).collect();
        let mut scratch = Vec::new();
        plan.run(&mut buf, &mut scratch);
        for (d, z) in dst.iter_mut().zip(buf) {
            *d = back(z);
        }
    };
    if x.len() * (usize::BITS - n.leading_zeros()) as usize >= 1 << 16 {
        out.par_chunks_mut(n).zip(x.par_chunks(n)).for_each(row);
    } else {
        out.chunks_mut(n).zip(x.chunks(n)).for_each(row);
    }
    Complex::<F>::into_host(out)
}

/// Sum or product over `axes` (TF's complex reductions; max and min have no order).
pub(crate) fn reduce<F: Part>(
    op: ferroflow_tensor::ReduceOp,
    v: &[Complex<F>],
    layout: &Layout,
    axes: &[usize],
) -> Result<HostData>
where
    Complex<F>: Element,
{
    use ferroflow_tensor::ReduceOp::*;
    let out = match op {
        ReduceSum => super::reduce::reduce_with(v, layout, axes, Complex::zero(), |a, b| a + b),
        ReduceProd => super::reduce::reduce_with(v, layout, axes, Complex::one(), |a, b| a * b),
        _ => return Err(unsupported("cpu", op.name(), <Complex<F>>::DTYPE)),
    };
    Ok(Complex::<F>::into_host(out))
}
