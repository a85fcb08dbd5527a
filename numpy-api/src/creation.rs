//! Array creation: `zeros`, `ones`, `full`, `empty` and their `_like`, `eye`, `identity`,
//! `arange`, `linspace`, `logspace`, `geomspace`, `diag`, `diagflat`, `tri`, `tril`,
//! `triu`, `meshgrid`, `indices`. New arrays go to the current device scope
//! (`with_device`); `_like` and functions of arrays follow their argument's device.
//!
//! ```
//! use ferroflow_numpy as np;
//! ferroflow::init();
//! let x = np::linspace(0.0, 1.0, 5)?;
//! assert_eq!(x.to_vec::<f64>()?, vec![0.0, 0.25, 0.5, 0.75, 1.0]);
//! let i = np::arange(0, 6, 2, None)?;
//! assert_eq!((i.dtype(), i.to_vec::<i64>()?), (np::DType::I64, vec![0, 2, 4]));
//! # Ok::<(), np::Error>(())
//! ```

use ferroflow_tensor::{current_device, DType, Error, HostData, Result, Tensor};

use crate::array::{arr, ArrayLike, Scalar, Value};
use crate::dtypes::{default_float, default_int};
use crate::util::{bool_tensor, i64_tensor};

/// Values computed in f64 on the host, converted there to `dtype` (so a device without
/// float64 never receives it) and placed on the current device.
pub(crate) fn host_array(v: &[f64], shape: &[usize], dtype: DType) -> Result<Tensor> {
    Tensor::from_host(HostData::from_f64_slice(dtype, v), shape)
}

fn dtype_or(d: impl Into<Option<DType>>, default: DType) -> DType {
    d.into().unwrap_or(default)
}

/// `numpy.zeros(shape, dtype=float64)`.
pub fn zeros(shape: &[usize], dtype: impl Into<Option<DType>>) -> Result<Tensor> {
    Tensor::zeros(shape, dtype_or(dtype, default_float()))
}
/// `numpy.ones(shape, dtype=float64)`.
pub fn ones(shape: &[usize], dtype: impl Into<Option<DType>>) -> Result<Tensor> {
    Tensor::ones(shape, dtype_or(dtype, default_float()))
}
/// `numpy.empty(shape, dtype=float64)`: ferroflow never hands out uninitialised memory, so
/// the values are zeros.
pub fn empty(shape: &[usize], dtype: impl Into<Option<DType>>) -> Result<Tensor> {
    zeros(shape, dtype)
}
/// `numpy.full(shape, fill_value, dtype=None)`: the dtype defaults to the fill value's
/// (a Rust `f64` gives float64, an `i64` int64); an array fill value broadcasts.
pub fn full(
    shape: &[usize],
    fill_value: impl ArrayLike,
    dtype: impl Into<Option<DType>>,
) -> Result<Tensor> {
    let v = fill_value.to_value()?;
    let dtype = dtype_or(dtype, v.dtype());
    let device = v.device().unwrap_or_else(current_device);
    crate::shape::broadcast_to(v.to_tensor(dtype, device)?, shape)?.contiguous()
}
/// `numpy.zeros_like(a, dtype=None)`.
pub fn zeros_like(a: impl ArrayLike, dtype: impl Into<Option<DType>>) -> Result<Tensor> {
    full_like(a, 0i64, dtype)
}
/// `numpy.ones_like(a, dtype=None)`.
pub fn ones_like(a: impl ArrayLike, dtype: impl Into<Option<DType>>) -> Result<Tensor> {
    full_like(a, 1i64, dtype)
}
/// `numpy.empty_like(a, dtype=None)` (zeros, as [`empty`]).
pub fn empty_like(a: impl ArrayLike, dtype: impl Into<Option<DType>>) -> Result<Tensor> {
    zeros_like(a, dtype)
}
/// `numpy.full_like(a, fill_value, dtype=None)`: `a`'s shape, dtype (unless given) and
/// device; the fill value is converted to that dtype (`full_like(int_array, 2.7)` is 2).
pub fn full_like(
    a: impl ArrayLike,
    fill_value: impl ArrayLike,
    dtype: impl Into<Option<DType>>,
) -> Result<Tensor> {
    let a = arr(a)?;
    let dtype = dtype_or(dtype, a.dtype());
    let v = fill_value.to_value()?.to_tensor(dtype, a.device())?;
    v.broadcast_to(a.shape())?.contiguous()
}

/// `numpy.eye(N)`: the `N × N` identity in the default float dtype; [`eye_with`] takes `M`,
/// `k` and `dtype`.
///
/// ```
/// ferroflow::init();
/// use ferroflow_numpy as np;
/// assert_eq!(np::eye(2)?.to_vec::<f64>()?, vec![1.0, 0.0, 0.0, 1.0]);
/// # Ok::<(), np::Error>(())
/// ```
pub fn eye(n: usize) -> Result<Tensor> {
    eye_with(n, None, 0, None)
}

/// `numpy.eye(N, M=None, k=0, dtype=float64)`: ones on the `k`-th diagonal.
pub fn eye_with(
    n: usize,
    m: impl Into<Option<usize>>,
    k: isize,
    dtype: impl Into<Option<DType>>,
) -> Result<Tensor> {
    let m = m.into().unwrap_or(n);
    let mut v = vec![0.0; n * m];
    for i in 0..n {
        let j = i as isize + k;
        if j >= 0 && (j as usize) < m {
            v[i * m + j as usize] = 1.0;
        }
    }
    let dtype = dtype_or(dtype, default_float());
    Tensor::from_host(HostData::from_f64_slice(dtype, &v), &[n, m])
}
/// `numpy.identity(n, dtype=float64)`.
pub fn identity(n: usize, dtype: impl Into<Option<DType>>) -> Result<Tensor> {
    eye_with(n, None, 0, dtype)
}

fn scalar_f64(op: &'static str, v: &Value) -> Result<f64> {
    match v {
        Value::Scalar(Scalar::Bool(b)) => Ok(*b as u8 as f64),
        Value::Scalar(Scalar::Int(i, _)) => Ok(*i as f64),
        Value::Scalar(Scalar::Float(f, _)) => Ok(*f),
        Value::Array(t) if t.rank() == 0 => Ok(t.to_f64_vec()?.first().copied().unwrap_or(0.0)),
        Value::Array(t) => Err(Error::invalid(
            op,
            format!("expected a scalar, got an array of shape {:?}", t.shape()),
        )),
    }
}

/// `numpy.arange(start, stop, step, dtype=None)`: integers when all three are Rust
/// integers (int64), else the default float; `ceil((stop - start)/step)` values
/// `start + i·step`.
pub fn arange(
    start: impl Into<Value>,
    stop: impl Into<Value>,
    step: impl Into<Value>,
    dtype: impl Into<Option<DType>>,
) -> Result<Tensor> {
    let (start, stop, step) = (start.into(), stop.into(), step.into());
    let all_int = [&start, &stop, &step]
        .iter()
        .all(|v| matches!(v.dtype(), d if d.is_int()));
    let (a, b, s) = (
        scalar_f64("arange", &start)?,
        scalar_f64("arange", &stop)?,
        scalar_f64("arange", &step)?,
    );
    if s == 0.0 {
        return Err(Error::invalid("arange", "ZeroDivisionError: step is zero"));
    }
    if !(a.is_finite() && b.is_finite() && s.is_finite()) {
        return Err(Error::invalid(
            "arange",
            "arange: cannot compute length (non-finite bounds)",
        ));
    }
    let len = ((b - a) / s).ceil().max(0.0);
    if len > (1u64 << 40) as f64 {
        return Err(Error::invalid("arange", "Maximum allowed size exceeded"));
    }
    let n = len as usize;
    let dtype = dtype_or(
        dtype,
        if all_int {
            default_int()
        } else {
            default_float()
        },
    );
    if all_int {
        let (a, s) = (a as i64, s as i64);
        let v: Vec<i64> = (0..n as i64).map(|i| a + i * s).collect();
        return Tensor::from_host(HostData::I64(v), &[n])?.cast(dtype);
    }
    let v: Vec<f64> = (0..n).map(|i| a + i as f64 * s).collect();
    host_array(&v, &[n], dtype)
}

/// NumPy's linspace values in float64.
pub(crate) fn linspace_f64(start: f64, stop: f64, num: usize, endpoint: bool) -> Vec<f64> {
    let div = if endpoint { num.saturating_sub(1) } else { num };
    let delta = stop - start;
    let mut v: Vec<f64> = if div > 0 {
        let step = delta / div as f64;
        if step == 0.0 {
            (0..num)
                .map(|i| i as f64 / div as f64 * delta + start)
                .collect()
        } else {
            (0..num).map(|i| i as f64 * step + start).collect()
        }
    } else {
        (0..num).map(|i| i as f64 * delta + start).collect()
    };
    if endpoint && num > 1 {
        v[num - 1] = stop;
    }
    v
}

/// Endpoints as array-likes (Rust numbers, 0-d or n-d tensors), broadcast together on the
/// host (exact float64, on any device): their values and the broadcast shape.
fn endpoints(
    op: &'static str,
    start: impl ArrayLike,
    stop: impl ArrayLike,
) -> Result<(Vec<f64>, Vec<f64>, Vec<usize>)> {
    let host = |x: Value| -> Result<(Vec<f64>, Vec<usize>)> {
        Ok(match x {
            Value::Scalar(Scalar::Float(v, _)) => (vec![v], vec![]),
            Value::Scalar(Scalar::Int(v, _)) => (vec![v as f64], vec![]),
            Value::Scalar(Scalar::Bool(v)) => (vec![v as u8 as f64], vec![]),
            Value::Array(t) => (t.to_host()?.to_f64_vec(), t.shape().to_vec()),
        })
    };
    let (a, sa) = host(start.to_value()?)?;
    let (b, sb) = host(stop.to_value()?)?;
    let shape = crate::util::broadcast_shape(op, &[&sa, &sb])?;
    let spread = |v: &[f64], s: &[usize]| -> Vec<f64> {
        let n: usize = shape.iter().product();
        (0..n)
            .map(|mut flat| {
                // The source element of output element `flat` (size-1 axes repeat).
                let (mut src, mut stride) = (0usize, 1usize);
                for (axis, &dim) in shape.iter().enumerate().rev() {
                    let i = flat % dim;
                    flat /= dim;
                    let offset = shape.len() - s.len();
                    if axis >= offset {
                        let d = s[axis - offset];
                        src += if d == 1 { 0 } else { i } * stride;
                        stride *= d;
                    }
                }
                v[src]
            })
            .collect()
    };
    Ok((spread(&a, &sa), spread(&b, &sb), shape))
}

/// `num` samples per pair of endpoints, `f(start, stop)` giving one pair's, laid out as
/// NumPy does: the samples along a new first axis, the endpoints' shape after it.
fn sampled(
    starts: &[f64],
    stops: &[f64],
    shape: &[usize],
    num: usize,
    dtype: DType,
    f: impl Fn(f64, f64) -> Result<Vec<f64>>,
) -> Result<Tensor> {
    let m = starts.len();
    let mut out = vec![0.0; num * m];
    for (j, (&a, &b)) in starts.iter().zip(stops).enumerate() {
        for (i, v) in f(a, b)?.into_iter().enumerate() {
            out[i * m + j] = v;
        }
    }
    let mut full = vec![num];
    full.extend_from_slice(shape);
    host_array(&out, &full, dtype)
}

/// `numpy.linspace(start, stop, num)`: `num` evenly spaced values from `start` to `stop`
/// included, in the default float dtype; the endpoints may be arrays (the samples then run
/// along a new first axis). [`linspace_with`] takes `endpoint` and `dtype`.
///
/// ```
/// ferroflow::init();
/// use ferroflow_numpy as np;
/// assert_eq!(np::linspace(0.0, 1.0, 5)?.to_vec::<f64>()?, vec![0.0, 0.25, 0.5, 0.75, 1.0]);
/// let ends = np::linspace(np::asarray([0.0, 10.0])?, 1.0, 3)?;
/// assert_eq!(ends.shape(), &[3, 2]);
/// # Ok::<(), np::Error>(())
/// ```
pub fn linspace(start: impl ArrayLike, stop: impl ArrayLike, num: usize) -> Result<Tensor> {
    linspace_with(start, stop, num, true, None)
}

/// `numpy.linspace(start, stop, num=50, endpoint=True, dtype=None)`: evenly spaced values
/// (default float dtype).
pub fn linspace_with(
    start: impl ArrayLike,
    stop: impl ArrayLike,
    num: usize,
    endpoint: bool,
    dtype: impl Into<Option<DType>>,
) -> Result<Tensor> {
    let (a, b, shape) = endpoints("linspace", start, stop)?;
    let dtype = dtype_or(dtype, default_float());
    sampled(&a, &b, &shape, num, dtype, |a, b| {
        Ok(linspace_f64(a, b, num, endpoint))
    })
}

/// `numpy.logspace(start, stop, num)`: `10 ** linspace(start, stop, num)`;
/// [`logspace_with`] takes `endpoint`, `base` and `dtype`.
pub fn logspace(start: impl ArrayLike, stop: impl ArrayLike, num: usize) -> Result<Tensor> {
    logspace_with(start, stop, num, true, 10.0, None)
}

/// `numpy.logspace(start, stop, num=50, endpoint=True, base=10.0, dtype=None)`:
/// `base ** linspace(start, stop)`.
pub fn logspace_with(
    start: impl ArrayLike,
    stop: impl ArrayLike,
    num: usize,
    endpoint: bool,
    base: f64,
    dtype: impl Into<Option<DType>>,
) -> Result<Tensor> {
    let (a, b, shape) = endpoints("logspace", start, stop)?;
    let dtype = dtype_or(dtype, default_float());
    sampled(&a, &b, &shape, num, dtype, |a, b| {
        Ok(linspace_f64(a, b, num, endpoint)
            .into_iter()
            .map(|e| base.powf(e))
            .collect())
    })
}

/// `numpy.geomspace(start, stop, num)`: a geometric sequence with the exact endpoints;
/// [`geomspace_with`] takes `endpoint` and `dtype`.
pub fn geomspace(start: impl ArrayLike, stop: impl ArrayLike, num: usize) -> Result<Tensor> {
    geomspace_with(start, stop, num, true, None)
}

/// `numpy.geomspace(start, stop, num=50, endpoint=True, dtype=None)`: a geometric sequence
/// with the exact endpoints; both ends must be non-zero and of one sign.
pub fn geomspace_with(
    start: impl ArrayLike,
    stop: impl ArrayLike,
    num: usize,
    endpoint: bool,
    dtype: impl Into<Option<DType>>,
) -> Result<Tensor> {
    let (a, b, shape) = endpoints("geomspace", start, stop)?;
    let dtype = dtype_or(dtype, default_float());
    sampled(&a, &b, &shape, num, dtype, |start, stop| {
        if start == 0.0 || stop == 0.0 {
            return Err(Error::invalid(
                "geomspace",
                "Geometric sequence cannot include zero",
            ));
        }
        if start.signum() != stop.signum() {
            return Err(Error::invalid(
                "geomspace",
                "geomspace of a negative and a positive end needs complex numbers, which ferroflow does not have",
            ));
        }
        let sign = if start < 0.0 { -1.0 } else { 1.0 };
        let (s, e) = ((start * sign).log10(), (stop * sign).log10());
        let mut v: Vec<f64> = linspace_f64(s, e, num, endpoint)
            .into_iter()
            .map(|x| sign * 10f64.powf(x))
            .collect();
        if num > 0 {
            v[0] = start;
            if endpoint && num > 1 {
                v[num - 1] = stop;
            }
        }
        Ok(v)
    })
}

/// `numpy.diag(v, k=0)`: a 1-D `v` becomes a square matrix with `v` on diagonal `k`; a 2-D
/// `v` gives its `k`-th diagonal. Built from gather/scatter, so it is differentiable.
pub fn diag(v: impl ArrayLike, k: isize) -> Result<Tensor> {
    let v = arr(v)?;
    match v.rank() {
        1 => {
            let len = v.shape()[0];
            let n = len + k.unsigned_abs();
            let idx: Vec<i64> = (0..len)
                .map(|i| {
                    let (r, c) = if k >= 0 {
                        (i, i + k as usize)
                    } else {
                        (i + (-k) as usize, i)
                    };
                    (r * n + c) as i64
                })
                .collect();
            let idx = i64_tensor(idx, &[len], &v)?;
            Tensor::scatter_add(&idx, &v, &[n * n], 0)?.reshape_to(&[n, n])
        }
        2 => {
            let (r, c) = (v.shape()[0] as isize, v.shape()[1] as isize);
            let (r0, c0) = if k >= 0 { (0, k) } else { (-k, 0) };
            let len = (r - r0).min(c - c0).max(0) as usize;
            let idx: Vec<i64> = (0..len as isize)
                .map(|i| ((r0 + i) * c + c0 + i) as i64)
                .collect();
            let flat = v.reshape(&[-1])?;
            flat.gather(&i64_tensor(idx, &[len], &v)?, 0)
        }
        r => Err(Error::invalid(
            "diag",
            format!("Input must be 1- or 2-d., got {r}-d"),
        )),
    }
}

/// `numpy.diagflat(v, k=0)`: the flattened input on diagonal `k` of a square matrix.
pub fn diagflat(v: impl ArrayLike, k: isize) -> Result<Tensor> {
    diag(arr(v)?.reshape(&[-1])?, k)
}

fn tri_mask(n: usize, m: usize, k: isize) -> Vec<bool> {
    (0..n * m)
        .map(|p| ((p % m) as isize) <= (p / m) as isize + k)
        .collect()
}

/// `numpy.tri(N, M=None, k=0, dtype=float64)`: ones at and below diagonal `k`.
pub fn tri(
    n: usize,
    m: impl Into<Option<usize>>,
    k: isize,
    dtype: impl Into<Option<DType>>,
) -> Result<Tensor> {
    let m = m.into().unwrap_or(n);
    let v = HostData::Bool(tri_mask(n, m, k));
    Tensor::from_host(v, &[n, m])?.cast(dtype_or(dtype, default_float()))
}

fn triangle(op: &'static str, m: impl ArrayLike, k: isize, lower: bool) -> Result<Tensor> {
    let m = arr(m)?;
    if m.rank() < 2 {
        return Err(Error::invalid(
            op,
            format!("input must be at least 2-d, got shape {:?}", m.shape()),
        ));
    }
    let (r, c) = (m.shape()[m.rank() - 2], m.shape()[m.rank() - 1]);
    // tril keeps j <= i + k; triu keeps j >= i + k, i.e. not (j <= i + k - 1)
    let mut mask = tri_mask(r, c, if lower { k } else { k - 1 });
    if !lower {
        mask.iter_mut().for_each(|b| *b = !*b);
    }
    let mask = bool_tensor(mask, &[r, c], &m)?;
    Tensor::select(&mask, &m, &m.scalar_like(0.0)?)
}

/// `numpy.tril(m, k=0)`: zeros above diagonal `k` (on the last two axes).
pub fn tril(m: impl ArrayLike, k: isize) -> Result<Tensor> {
    triangle("tril", m, k, true)
}
/// `numpy.triu(m, k=0)`: zeros below diagonal `k` (on the last two axes).
pub fn triu(m: impl ArrayLike, k: isize) -> Result<Tensor> {
    triangle("triu", m, k, false)
}

/// `numpy.meshgrid(*xi, indexing='xy')`: coordinate arrays; `indexing` is `"xy"`
/// (Cartesian, the first two axes swapped) or `"ij"` (matrix).
pub fn meshgrid<A: ArrayLike>(xi: &[A], indexing: &str) -> Result<Vec<Tensor>> {
    let xs: Vec<Tensor> = xi
        .iter()
        .map(|x| arr(x)?.reshape(&[-1]))
        .collect::<Result<_>>()?;
    let cartesian = match indexing {
        "xy" => true,
        "ij" => false,
        other => {
            return Err(Error::invalid(
                "meshgrid",
                format!("Valid values for `indexing` are 'xy' and 'ij', got {other:?}"),
            ))
        }
    };
    let n = xs.len();
    let mut shape: Vec<usize> = xs.iter().map(|x| x.shape()[0]).collect();
    let axis_of = |i: usize| -> usize {
        if cartesian && n >= 2 && i < 2 {
            1 - i
        } else {
            i
        }
    };
    if cartesian && n >= 2 {
        shape.swap(0, 1);
    }
    xs.iter()
        .enumerate()
        .map(|(i, x)| {
            let mut s = vec![1isize; n];
            s[axis_of(i)] = -1;
            x.reshape(&s)?.broadcast_to(&shape)?.contiguous()
        })
        .collect()
}

/// `numpy.indices(dimensions, dtype=int)`: an array of shape `(len(dimensions), *dimensions)`
/// whose `i`-th entry holds each position's index along axis `i`.
pub fn indices(dimensions: &[usize], dtype: impl Into<Option<DType>>) -> Result<Tensor> {
    let n = dimensions.len();
    let grids: Vec<Tensor> = (0..n)
        .map(|i| {
            let mut s = vec![1isize; n];
            s[i] = -1;
            arange(0i64, dimensions[i] as i64, 1i64, None)?
                .reshape(&s)?
                .broadcast_to(dimensions)
        })
        .collect::<Result<_>>()?;
    let dtype = dtype_or(dtype, default_int());
    if grids.is_empty() {
        return Tensor::zeros(&[0], dtype);
    }
    Tensor::stack(&grids, 0)?.cast(dtype)
}

fn triangle_indices(n: usize, k: isize, m: Option<usize>, lower: bool) -> Result<(Tensor, Tensor)> {
    let m = m.unwrap_or(n);
    let (mut rows, mut cols) = (Vec::new(), Vec::new());
    for i in 0..n {
        for j in 0..m {
            let d = j as isize - i as isize;
            if (lower && d <= k) || (!lower && d >= k) {
                rows.push(i as i64);
                cols.push(j as i64);
            }
        }
    }
    let len = rows.len();
    Ok((
        Tensor::from_host(HostData::I64(rows), &[len])?,
        Tensor::from_host(HostData::I64(cols), &[len])?,
    ))
}

/// `numpy.tril_indices(n, k=0, m=None)`: row and column indices of the lower triangle.
pub fn tril_indices(n: usize, k: isize, m: impl Into<Option<usize>>) -> Result<(Tensor, Tensor)> {
    triangle_indices(n, k, m.into(), true)
}
/// `numpy.triu_indices(n, k=0, m=None)`: row and column indices of the upper triangle.
pub fn triu_indices(n: usize, k: isize, m: impl Into<Option<usize>>) -> Result<(Tensor, Tensor)> {
    triangle_indices(n, k, m.into(), false)
}
fn matrix_dims(op: &'static str, a: &Tensor) -> Result<(usize, usize)> {
    if a.rank() != 2 {
        return Err(Error::invalid(op, "input array must be 2-d"));
    }
    Ok((a.shape()[0], a.shape()[1]))
}
/// `numpy.tril_indices_from(arr, k=0)`.
pub fn tril_indices_from(a: impl ArrayLike, k: isize) -> Result<(Tensor, Tensor)> {
    let (n, m) = matrix_dims("tril_indices_from", &arr(a)?)?;
    tril_indices(n, k, m)
}
/// `numpy.triu_indices_from(arr, k=0)`.
pub fn triu_indices_from(a: impl ArrayLike, k: isize) -> Result<(Tensor, Tensor)> {
    let (n, m) = matrix_dims("triu_indices_from", &arr(a)?)?;
    triu_indices(n, k, m)
}
/// `numpy.diag_indices(n, ndim=2)`: `ndim` copies of `arange(n)` (the main diagonal).
pub fn diag_indices(n: usize, ndim: usize) -> Result<Vec<Tensor>> {
    (0..ndim)
        .map(|_| arange(0i64, n as i64, 1i64, None))
        .collect()
}
/// `numpy.diag_indices_from(arr)`: for an array whose axes all have one length.
pub fn diag_indices_from(a: impl ArrayLike) -> Result<Vec<Tensor>> {
    let a = arr(a)?;
    if a.rank() < 2 {
        return Err(Error::invalid(
            "diag_indices_from",
            "input array must be at least 2-d",
        ));
    }
    if a.shape().iter().any(|d| *d != a.shape()[0]) {
        return Err(Error::invalid(
            "diag_indices_from",
            "All dimensions of input must be of equal length",
        ));
    }
    diag_indices(a.shape()[0], a.rank())
}

/// `numpy.vander(x, N=None, increasing=False)`: columns of powers of `x` (highest first
/// unless `increasing`).
pub fn vander(x: impl ArrayLike, n: impl Into<Option<usize>>, increasing: bool) -> Result<Tensor> {
    let x = arr(x)?;
    if x.rank() != 1 {
        return Err(Error::invalid(
            "vander",
            "x must be a one-dimensional array or sequence.",
        ));
    }
    let n = n.into().unwrap_or(x.shape()[0]);
    let powers: Vec<i64> = if increasing {
        (0..n as i64).collect()
    } else {
        (0..n as i64).rev().collect()
    };
    let p = Tensor::from_host_on(HostData::I64(powers), &[1, n], x.device())?;
    crate::math::power(x.reshape(&[-1, 1])?, p)
}
