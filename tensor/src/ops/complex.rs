//! Complex numbers: building them (`tf.complex`), their parts (`real`, `imag`, `conj`,
//! `angle`; `abs` is the modulus) and the discrete Fourier transforms of `tf.signal`
//! (`fft`, `ifft` primitives; `rfft`, `irfft` composed from them).
//!
//! complex64 and complex128 have kernels on the CPU backend; elsewhere the backend's error
//! names the op and the dtype.

use crate::dispatch::dispatch;
use crate::error::{Error, Result};
use crate::op::{BinaryOp, Op, UnaryOp};
use crate::tensor::Tensor;

impl Tensor {
    /// `re + im·i` elementwise from two float32 (complex64) or float64 (complex128)
    /// tensors of one dtype, broadcast together (`tf.complex`).
    ///
    /// ```no_run
    /// // A backend registered first: `ferroflow::init()` (the facade).
    /// use ferroflow_tensor::{Complex32, Tensor};
    /// let z = Tensor::complex(&Tensor::from_slice(&[1.0f32, 2.0])?, &Tensor::scalar(-1.0f32)?)?;
    /// assert_eq!(z.to_vec::<Complex32>()?, [Complex32::new(1.0, -1.0), Complex32::new(2.0, -1.0)]);
    /// # Ok::<(), ferroflow_tensor::Error>(())
    /// ```
    pub fn complex(re: &Tensor, im: &Tensor) -> Result<Tensor> {
        re.binary(BinaryOp::Complex, im)
    }

    /// The complex conjugate (`tf.math.conj`); real tensors are returned as they are.
    pub fn conj(&self) -> Result<Tensor> {
        if self.dtype().is_complex() {
            self.unary(UnaryOp::Conj)
        } else {
            Ok(self.clone())
        }
    }

    /// The real part (`tf.math.real`): float32 for complex64, float64 for complex128; real
    /// tensors are returned as they are.
    pub fn real(&self) -> Result<Tensor> {
        if self.dtype().is_complex() {
            self.unary(UnaryOp::Real)
        } else {
            Ok(self.clone())
        }
    }

    /// The imaginary part (`tf.math.imag`); zeros for real tensors.
    pub fn imag(&self) -> Result<Tensor> {
        if self.dtype().is_complex() {
            self.unary(UnaryOp::Imag)
        } else {
            self.zeros_like()
        }
    }

    /// The argument `atan2(im, re)` in (-π, π] (`tf.math.angle`); for real tensors π where
    /// negative and 0 elsewhere, as TF's.
    pub fn angle(&self) -> Result<Tensor> {
        if self.dtype().is_complex() {
            return self.unary(UnaryOp::Angle);
        }
        let negative = self.less(&self.scalar_like(0.0)?)?;
        Tensor::select(
            &negative,
            &self.full_like(std::f64::consts::PI)?,
            &self.zeros_like()?,
        )
    }

    /// The discrete Fourier transform over the last axis (`tf.signal.fft`: unscaled,
    /// `X[k] = Σ x[j]·e^(-2πi·jk/n)`) of a complex tensor.
    ///
    /// ```no_run
    /// // A backend registered first: `ferroflow::init()` (the facade).
    /// use ferroflow_tensor::{Complex64, Tensor};
    /// let x = Tensor::from_vec(vec![Complex64::new(1.0, 0.0); 4], &[4])?;
    /// let y = x.fft()?.to_vec::<Complex64>()?;
    /// assert!((y[0].re - 4.0).abs() < 1e-12 && y[1].norm() < 1e-12);
    /// # Ok::<(), ferroflow_tensor::Error>(())
    /// ```
    pub fn fft(&self) -> Result<Tensor> {
        self.fourier(false)
    }

    /// The inverse transform over the last axis (`tf.signal.ifft`: scaled by 1/n).
    pub fn ifft(&self) -> Result<Tensor> {
        self.fourier(true)
    }

    fn fourier(&self, inverse: bool) -> Result<Tensor> {
        let name = if inverse { "ifft" } else { "fft" };
        if !self.dtype().is_complex() {
            return Err(Error::UnsupportedDType {
                op: name,
                dtype: self.dtype(),
                expected: "complex64 or complex128 (cast, or use rfft for real input)",
            });
        }
        if self.rank() == 0 {
            return Err(Error::invalid(
                name,
                "needs at least one axis: the transform runs over the last",
            ));
        }
        dispatch(
            || Op::Fft { inverse },
            &[self],
            |p| {
                if self.num_elements() == 0 {
                    return p.empty(self.shape(), self.dtype());
                }
                let buf = p.backend.fft(self.operand(), inverse)?;
                Ok(Tensor::from_buffer(
                    buf,
                    self.shape(),
                    self.dtype(),
                    p.backend,
                    p.device,
                ))
            },
        )
    }

    /// The last axis cut or zero-padded to `n` (the `n` / `fft_length` of the FFT
    /// functions).
    ///
    /// ```no_run
    /// // A backend registered first: `ferroflow::init()` (the facade).
    /// let x = ferroflow_tensor::Tensor::from_slice(&[1.0f32, 2.0, 3.0])?;
    /// assert_eq!(x.fit_last_axis(5)?.to_vec::<f32>()?, [1.0, 2.0, 3.0, 0.0, 0.0]);
    /// assert_eq!(x.fit_last_axis(2)?.to_vec::<f32>()?, [1.0, 2.0]);
    /// # Ok::<(), ferroflow_tensor::Error>(())
    /// ```
    pub fn fit_last_axis(&self, n: usize) -> Result<Tensor> {
        let op = "fit_last_axis";
        let Some(&len) = self.shape().last() else {
            return Err(Error::invalid(
                op,
                "needs at least one axis: the transform runs over the last",
            ));
        };
        let rank = self.rank();
        if n < len {
            let mut size: Vec<isize> = self.shape().iter().map(|&d| d as isize).collect();
            size[rank - 1] = n as isize;
            self.slice(&vec![0; rank], &size)
        } else if n > len {
            let mut pads = vec![(0, 0); rank];
            pads[rank - 1] = (0, n - len);
            self.pad(&pads, 0.0)
        } else {
            Ok(self.clone())
        }
    }

    /// The transform of a real float32 / float64 tensor over its last axis, cut or
    /// zero-padded to `fft_length` (default: its length), keeping the `fft_length/2 + 1`
    /// non-negative frequencies (`tf.signal.rfft`; complex64 / complex128 out).
    ///
    /// ```no_run
    /// // A backend registered first: `ferroflow::init()` (the facade).
    /// use ferroflow_tensor::{Complex64, Tensor};
    /// let x = Tensor::from_slice(&[1.0f64, 2.0, 3.0, 4.0])?;
    /// let y = x.rfft(None)?;
    /// assert_eq!(y.shape(), &[3]);
    /// let back = y.irfft(Some(4))?.to_vec::<f64>()?;
    /// assert!(back.iter().zip([1.0, 2.0, 3.0, 4.0]).all(|(a, b)| (a - b).abs() < 1e-12));
    /// # Ok::<(), ferroflow_tensor::Error>(())
    /// ```
    pub fn rfft(&self, fft_length: Option<usize>) -> Result<Tensor> {
        let Some(complex) = self
            .dtype()
            .complex_dtype()
            .filter(|_| self.dtype().is_float())
        else {
            return Err(Error::UnsupportedDType {
                op: "rfft",
                dtype: self.dtype(),
                expected: "float32 or float64",
            });
        };
        let n = fft_length.or(self.shape().last().copied()).unwrap_or(0);
        if n == 0 {
            return Err(Error::invalid("rfft", "fft_length must be at least 1"));
        }
        let spectrum = self.fit_last_axis(n)?.cast(complex)?.fft()?;
        spectrum.fit_last_axis(n / 2 + 1)
    }

    /// The inverse of [`Tensor::rfft`]: a real signal of `fft_length` samples (default
    /// `2·(m - 1)` for `m` frequencies) from the non-negative frequencies along the last
    /// axis, the rest implied by Hermitian symmetry; the imaginary parts of the zero (and,
    /// for even lengths, the Nyquist) frequency are ignored (`tf.signal.irfft`).
    pub fn irfft(&self, fft_length: Option<usize>) -> Result<Tensor> {
        if !self.dtype().is_complex() {
            return Err(Error::UnsupportedDType {
                op: "irfft",
                dtype: self.dtype(),
                expected: "complex64 or complex128",
            });
        }
        let m = self.shape().last().copied().unwrap_or(0);
        let n = match fft_length {
            Some(n) => n,
            None => 2 * m.saturating_sub(1),
        };
        if n == 0 {
            return Err(Error::invalid(
                "irfft",
                format!("fft_length must be at least 1 (from {m} frequencies)"),
            ));
        }
        let half = self.fit_last_axis(n / 2 + 1)?;
        // X[k] for k > n/2 is conj(X[n - k]): indices n - (n/2 + 1) down to 1.
        let mirrored: Vec<i64> = (n / 2 + 1..n).map(|k| (n - k) as i64).collect();
        let full = if mirrored.is_empty() {
            half
        } else {
            let count = mirrored.len();
            let idx =
                Tensor::from_host_on(crate::HostData::I64(mirrored), &[count], self.device())?;
            let rank = half.rank() as isize;
            let tail = half.gather(&idx, rank - 1)?.conj()?;
            Tensor::concat(&[half, tail], rank - 1)?
        };
        full.ifft()?.real()
    }
}
