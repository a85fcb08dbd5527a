//! `numpy.fft`: discrete Fourier transforms along an axis (`fft`, `ifft`, `rfft`, `irfft`,
//! over two axes `fft2`, `ifft2`), the sample frequencies (`fftfreq`, `rfftfreq`) and the
//! zero-frequency shifts (`fftshift`, `ifftshift`).
//!
//! Each transform has NumPy's defaults in its short form (`fft(a)`: the whole last axis,
//! `norm="backward"`) and its keywords in the `_with` form (`n`, `axis`, [`Norm`]). Real
//! input is transformed as complex: float32 (and the half types) as complex64, everything
//! else as complex128, as NumPy 2 does. The transforms are tensor ops (the CPU backend's
//! FFT), so `GradientTape` differentiates through them.
//!
//! ```
//! use ferroflow_numpy as np;
//! ferroflow::init();
//! let x = np::asarray([1.0, 2.0, 3.0, 4.0])?;
//! let y = np::fft::fft(&x)?;
//! assert_eq!(y.dtype(), np::DType::C128);
//! let back = np::real(np::fft::ifft(&y)?)?;
//! assert!(np::allclose(&back, &x)?);
//! let half = np::fft::rfft(&x)?; // the 3 non-negative frequencies
//! assert_eq!(half.shape(), &[3]);
//! assert!(np::allclose(np::fft::irfft(&half)?, &x)?);
//! # Ok::<(), np::Error>(())
//! ```

use ferroflow_tensor::{Axes, DType, Error, Result, Tensor};

use crate::array::{arr, ArrayLike};
use crate::util::norm_axis;

/// NumPy's `norm` argument: which direction carries the 1/n scaling.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Norm {
    /// `"backward"` (NumPy's default): the forward transform unscaled, the inverse by 1/n.
    #[default]
    Backward,
    /// `"ortho"`: both by 1/√n (the transforms are unitary).
    Ortho,
    /// `"forward"`: the forward transform by 1/n, the inverse unscaled.
    Forward,
}

impl Norm {
    /// Parses NumPy's names (`"backward"`, `"ortho"`, `"forward"`).
    ///
    /// ```
    /// use ferroflow_numpy::fft::Norm;
    /// assert_eq!(Norm::parse("ortho")?, Norm::Ortho);
    /// assert!(Norm::parse("unitary").is_err());
    /// # Ok::<(), ferroflow_numpy::Error>(())
    /// ```
    pub fn parse(s: &str) -> Result<Norm> {
        Ok(match s {
            "backward" => Norm::Backward,
            "ortho" => Norm::Ortho,
            "forward" => Norm::Forward,
            _ => {
                return Err(Error::invalid(
                    "fft",
                    format!(
                        "Invalid norm value {s}; should be \"backward\", \"ortho\" or \"forward\"."
                    ),
                ))
            }
        })
    }
    /// The factor on our transform (forward unscaled, inverse by 1/n) for `n` points.
    fn factor(self, n: usize, inverse: bool) -> f64 {
        let n = n as f64;
        match (self, inverse) {
            (Norm::Backward, _) => 1.0,
            (Norm::Ortho, false) => 1.0 / n.sqrt(),
            (Norm::Ortho, true) => n.sqrt(),
            (Norm::Forward, false) => 1.0 / n,
            (Norm::Forward, true) => n,
        }
    }
}

/// The complex dtype NumPy 2 transforms a dtype in.
fn complex_for(d: DType) -> DType {
    match d {
        DType::C64 | DType::C128 => d,
        DType::F32 | DType::F16 | DType::BF16 => DType::C64,
        _ => DType::C128,
    }
}

/// `f` applied with `axis` moved last (and moved back after).
fn along(
    op: &'static str,
    a: &Tensor,
    axis: isize,
    f: impl FnOnce(&Tensor) -> Result<Tensor>,
) -> Result<Tensor> {
    if a.rank() == 0 {
        return Err(Error::invalid(op, "the input must have at least one axis"));
    }
    let ax = norm_axis(op, axis, a.rank())?;
    let last = a.rank() - 1;
    if ax == last {
        return f(a);
    }
    let mut perm: Vec<usize> = (0..a.rank()).collect();
    perm.swap(ax, last);
    f(&a.transpose(&perm)?)?.transpose(&perm)
}

fn points(op: &'static str, n: Option<usize>, len: usize) -> Result<usize> {
    let n = n.unwrap_or(len);
    if n == 0 {
        return Err(Error::invalid(
            op,
            format!("Invalid number of FFT data points ({n}) specified."),
        ));
    }
    Ok(n)
}

fn scaled(t: Tensor, factor: f64) -> Result<Tensor> {
    if factor == 1.0 {
        Ok(t)
    } else {
        t.mul(&t.scalar_like(factor)?)
    }
}

fn transform(
    op: &'static str,
    a: impl ArrayLike,
    n: Option<usize>,
    axis: isize,
    norm: Norm,
    inverse: bool,
) -> Result<Tensor> {
    let a = arr(a)?;
    let z = a.cast(complex_for(a.dtype()))?;
    along(op, &z, axis, |z| {
        let len = *z.shape().last().unwrap_or(&0);
        let n = points(op, n, len)?;
        let z = z.fit_last_axis(n)?;
        let y = if inverse { z.ifft()? } else { z.fft()? };
        scaled(y, norm.factor(n, inverse))
    })
}

/// `numpy.fft.fft(a)`: the transform of the last axis, `X[k] = Σ x[j]·e^(-2πi·jk/n)`.
pub fn fft(a: impl ArrayLike) -> Result<Tensor> {
    fft_with(a, None, -1, Norm::Backward)
}
/// `numpy.fft.fft(a, n, axis, norm)`: `axis` cut or zero-padded to `n` points.
pub fn fft_with(a: impl ArrayLike, n: Option<usize>, axis: isize, norm: Norm) -> Result<Tensor> {
    transform("fft", a, n, axis, norm, false)
}
/// `numpy.fft.ifft(a)`: the inverse transform of the last axis (scaled by 1/n).
pub fn ifft(a: impl ArrayLike) -> Result<Tensor> {
    ifft_with(a, None, -1, Norm::Backward)
}
/// `numpy.fft.ifft(a, n, axis, norm)`.
pub fn ifft_with(a: impl ArrayLike, n: Option<usize>, axis: isize, norm: Norm) -> Result<Tensor> {
    transform("ifft", a, n, axis, norm, true)
}

/// `numpy.fft.rfft(a)`: the transform of a real signal's last axis, its `n/2 + 1`
/// non-negative frequencies.
pub fn rfft(a: impl ArrayLike) -> Result<Tensor> {
    rfft_with(a, None, -1, Norm::Backward)
}
/// `numpy.fft.rfft(a, n, axis, norm)`. Complex input is an error (NumPy 2's TypeError).
pub fn rfft_with(a: impl ArrayLike, n: Option<usize>, axis: isize, norm: Norm) -> Result<Tensor> {
    let a = arr(a)?;
    if a.dtype().is_complex() {
        return Err(Error::UnsupportedDType {
            op: "rfft",
            dtype: a.dtype(),
            expected: "real input (rfft drops no imaginary parts: use fft)",
        });
    }
    let x = a.cast(complex_for(a.dtype()).real_dtype())?;
    along("rfft", &x, axis, |x| {
        let n = points("rfft", n, *x.shape().last().unwrap_or(&0))?;
        scaled(x.rfft(Some(n))?, norm.factor(n, false))
    })
}
/// `numpy.fft.irfft(a)`: the real signal of `2·(m - 1)` samples whose [`rfft`] is `a`'s
/// `m` frequencies along the last axis.
pub fn irfft(a: impl ArrayLike) -> Result<Tensor> {
    irfft_with(a, None, -1, Norm::Backward)
}
/// `numpy.fft.irfft(a, n, axis, norm)`: `n` output samples (the input cut or zero-padded to
/// `n/2 + 1` frequencies).
pub fn irfft_with(a: impl ArrayLike, n: Option<usize>, axis: isize, norm: Norm) -> Result<Tensor> {
    let a = arr(a)?;
    let z = a.cast(complex_for(a.dtype()))?;
    along("irfft", &z, axis, |z| {
        let m = *z.shape().last().unwrap_or(&0);
        let n = points("irfft", n.or(Some(2 * m.saturating_sub(1))), m)?;
        scaled(z.irfft(Some(n))?, norm.factor(n, true))
    })
}

/// `numpy.fft.fft2(a)`: the transform over the last two axes.
pub fn fft2(a: impl ArrayLike) -> Result<Tensor> {
    fft_with(
        fft_with(a, None, -1, Norm::Backward)?,
        None,
        -2,
        Norm::Backward,
    )
}
/// `numpy.fft.ifft2(a)`: the inverse transform over the last two axes.
pub fn ifft2(a: impl ArrayLike) -> Result<Tensor> {
    ifft_with(
        ifft_with(a, None, -1, Norm::Backward)?,
        None,
        -2,
        Norm::Backward,
    )
}

/// The frequencies of `n` samples spaced `d` apart, in NumPy's order.
fn frequencies(op: &'static str, n: usize, d: f64, whole: bool) -> Result<Tensor> {
    if n == 0 {
        return Err(Error::invalid(op, "n must be a positive integer"));
    }
    let scale = 1.0 / (n as f64 * d);
    let v: Vec<f64> = if whole {
        let positive = n.div_ceil(2);
        (0..n)
            .map(|i| {
                let k = if i < positive {
                    i as f64
                } else {
                    i as f64 - n as f64
                };
                k * scale
            })
            .collect()
    } else {
        (0..=n / 2).map(|i| i as f64 * scale).collect()
    };
    let len = v.len();
    Tensor::from_vec(v, &[len])
}

/// `numpy.fft.fftfreq(n, d)`: `[0, 1, ..., ⌈n/2⌉-1, -⌊n/2⌋, ..., -1] / (d·n)` (float64).
pub fn fftfreq(n: usize, d: f64) -> Result<Tensor> {
    frequencies("fftfreq", n, d, true)
}
/// `numpy.fft.rfftfreq(n, d)`: `[0, 1, ..., ⌊n/2⌋] / (d·n)` (float64).
pub fn rfftfreq(n: usize, d: f64) -> Result<Tensor> {
    frequencies("rfftfreq", n, d, false)
}

fn shift(op: &'static str, x: impl ArrayLike, axes: Axes, inverse: bool) -> Result<Tensor> {
    let mut x = arr(x)?;
    let list: Vec<usize> = match axes {
        Axes::All => (0..x.rank()).collect(),
        Axes::List(v) => v
            .iter()
            .map(|&a| norm_axis(op, a, x.rank()))
            .collect::<Result<_>>()?,
    };
    for ax in list {
        let n = x.shape()[ax] as isize;
        let by = if inverse { -(n / 2) } else { n / 2 };
        x = crate::shape::roll(&x, by, ax as isize)?;
    }
    Ok(x)
}
/// `numpy.fft.fftshift(x)`: the zero frequency moved to the middle of every axis.
pub fn fftshift(x: impl ArrayLike) -> Result<Tensor> {
    shift("fftshift", x, Axes::All, false)
}
/// `numpy.fft.fftshift(x, axes)`: only along `axes`.
pub fn fftshift_with(x: impl ArrayLike, axes: impl Into<Axes>) -> Result<Tensor> {
    shift("fftshift", x, axes.into(), false)
}
/// `numpy.fft.ifftshift(x)`: the inverse of [`fftshift`] (they differ for odd lengths).
pub fn ifftshift(x: impl ArrayLike) -> Result<Tensor> {
    shift("ifftshift", x, Axes::All, true)
}
/// `numpy.fft.ifftshift(x, axes)`: only along `axes`.
pub fn ifftshift_with(x: impl ArrayLike, axes: impl Into<Axes>) -> Result<Tensor> {
    shift("ifftshift", x, axes.into(), true)
}
