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

/// Radix-2 butterflies of a power-of-two buffer in place: `twiddles[k]` = e^(±2πi·k/m) for
/// k < m/2, m the buffer's length.
fn radix2(buf: &mut [Complex64], twiddles: &[Complex64]) {
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
                let w = twiddles[j * step];
                let u = buf[start + j];
                let v = buf[start + j + len / 2] * w;
                buf[start + j] = u + v;
                buf[start + j + len / 2] = u - v;
            }
        }
        len <<= 1;
    }
}

/// e^(sign·2πi·k/n) for k < count.
fn unit_roots(n: usize, count: usize, sign: f64) -> Vec<Complex64> {
    (0..count)
        .map(|k| {
            Complex64::from_polar(1.0, sign * 2.0 * std::f64::consts::PI * k as f64 / n as f64)
        })
        .collect()
}

/// The largest prime factor the mixed-radix path takes; lengths with a larger one go through
/// Bluestein's algorithm.
const MAX_RADIX: usize = 13;

/// The prime factors of `n` (smallest first), or `None` when one exceeds [`MAX_RADIX`].
fn small_factors(mut n: usize) -> Option<Vec<usize>> {
    let mut out = Vec::new();
    for p in [2, 3, 5, 7, 11, 13] {
        while n.is_multiple_of(p) {
            out.push(p);
            n /= p;
        }
    }
    (n == 1).then_some(out)
}

/// Decimation in time over the factors: the `p` interleaved subsequences of `x` (read with
/// `stride`) transformed into consecutive blocks of `out`, then combined with the twiddles
/// (`roots[t]` = e^(±2πi·t/N), this level's n = N/`root_step`). O(n·Σ factors).
fn mixed_radix(
    x: &[Complex64],
    stride: usize,
    out: &mut [Complex64],
    factors: &[usize],
    roots: &[Complex64],
    root_step: usize,
) {
    let n = out.len();
    let Some((&p, rest)) = factors.split_first() else {
        out[0] = x[0];
        return;
    };
    let m = n / p;
    for q in 0..p {
        mixed_radix(
            &x[q * stride..],
            stride * p,
            &mut out[q * m..(q + 1) * m],
            rest,
            roots,
            root_step * p,
        );
    }
    let big_n = roots.len();
    let mut y = [Complex64::zero(); MAX_RADIX];
    for k in 0..m {
        for q in 0..p {
            y[q] = out[q * m + k] * roots[(q * k * root_step) % big_n];
        }
        for s in 0..p {
            let mut acc = Complex64::zero();
            for (q, &v) in y[..p].iter().enumerate() {
                acc += v * roots[((q * s) % p) * m * root_step];
            }
            out[k + s * m] = acc;
        }
    }
}

/// How rows of one length are transformed (unscaled), computed in f64.
enum Plan {
    /// Powers of two: iterative radix-2; the twiddles of the row length.
    Radix2(Vec<Complex64>),
    /// Lengths whose prime factors are at most [`MAX_RADIX`]: recursive mixed radix; the
    /// factors and every n-th root of unity.
    Mixed(Vec<usize>, Vec<Complex64>),
    /// Other lengths: Bluestein's chirp-z, a convolution of power-of-two size m; the chirp
    /// e^(±πi·k²/n) for k < n, the transformed filter, and the size-m twiddles.
    Bluestein {
        chirp: Vec<Complex64>,
        filter: Vec<Complex64>,
        twiddles: Vec<Complex64>,
    },
}

impl Plan {
    fn new(n: usize, inverse: bool) -> Plan {
        let sign = if inverse { 1.0 } else { -1.0 };
        if n.is_power_of_two() {
            return Plan::Radix2(unit_roots(n, n / 2, sign));
        }
        if let Some(factors) = small_factors(n) {
            return Plan::Mixed(factors, unit_roots(n, n, sign));
        }
        let m = (2 * n - 1).next_power_of_two();
        let twiddles = unit_roots(m, m / 2, sign);
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
        radix2(&mut filter, &twiddles);
        Plan::Bluestein {
            chirp,
            filter,
            twiddles,
        }
    }

    /// The transform of one row of n values (unscaled), in place.
    fn run(&self, row: &mut [Complex64], scratch: &mut Vec<Complex64>) {
        match self {
            Plan::Radix2(twiddles) => radix2(row, twiddles),
            Plan::Mixed(factors, roots) => {
                scratch.clear();
                scratch.resize(row.len(), Complex64::zero());
                mixed_radix(row, 1, scratch, factors, roots, 1);
                row.copy_from_slice(scratch);
            }
            Plan::Bluestein {
                chirp,
                filter,
                twiddles,
            } => {
                let m = filter.len();
                // conv = ifft(fft(a)·fft(b)) = conj(fft(conj(fft(a)·fft(b)))) / m, with the
                // same-direction twiddles.
                scratch.clear();
                scratch.resize(m, Complex64::zero());
                for (s, (&v, &c)) in scratch.iter_mut().zip(row.iter().zip(chirp)) {
                    *s = v * c;
                }
                radix2(scratch, twiddles);
                for (s, f) in scratch.iter_mut().zip(filter) {
                    *s = (*s * f).conj();
                }
                radix2(scratch, twiddles);
                let scale = 1.0 / m as f64;
                for (k, v) in row.iter_mut().enumerate() {
                    *v = scratch[k].conj() * scale * chirp[k];
                }
            }
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
    let mut out = crate::block_cache::filled(x.len(), Complex::<F>::zero());
    // one row buffer and one scratch buffer per thread, reused across its rows
    type Buffers = (Vec<Complex64>, Vec<Complex64>);
    let row = |(buf, scratch): &mut Buffers, (dst, src): (&mut [Complex<F>], &[Complex<F>])| {
        buf.clear();
        buf.extend(src.iter().map(to64));
        plan.run(buf, scratch);
        for (d, &z) in dst.iter_mut().zip(buf.iter()) {
            *d = back(z);
        }
    };
    if x.len() * (usize::BITS - n.leading_zeros()) as usize >= 1 << 16 {
        out.par_chunks_mut(n)
            .zip(x.par_chunks(n))
            .for_each_init(Buffers::default, row);
    } else {
        let mut buffers = Buffers::default();
        out.chunks_mut(n)
            .zip(x.chunks(n))
            .for_each(|pair| row(&mut buffers, pair));
    }
    Complex::<F>::into_host(out)
}

/// Sum, mean or product over `axes` (TF's complex reductions; max and min have no order).
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
        ReduceMean => {
            let count = super::reduce::reduced_count(layout, axes);
            let sums = super::reduce::reduce_with(v, layout, axes, Complex::zero(), |a, b| a + b);
            sums.into_iter()
                .map(|s| s / <F as num_traits::NumCast>::from(count).unwrap_or_else(F::nan))
                .collect()
        }
        ReduceProd => super::reduce::reduce_with(v, layout, axes, Complex::one(), |a, b| a * b),
        _ => return Err(unsupported("cpu", op.name(), <Complex<F>>::DTYPE)),
    };
    Ok(Complex::<F>::into_host(out))
}
