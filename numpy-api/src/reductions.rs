//! Reductions with NumPy's `axis` (`None` for all, one axis or several) and `keepdims`:
//! `sum`, `prod`, `mean`, `std`, `var`, `average`, `amax`/`amin`, `ptp`, `argmax`,
//! `argmin`, `any`, `all`, `count_nonzero`, `median`, `percentile`, `quantile`, and the
//! NaN-ignoring `nansum`, `nanprod`, `nanmean`, `nanvar`, `nanstd`, `nanmax`, `nanmin`,
//! `nanargmax`, `nanargmin`, `nancumsum`, `nancumprod`, `nanmedian`, `nanpercentile`,
//! `nanquantile`.
//!
//! Dtypes follow NumPy: `sum`/`prod` of booleans and small integers accumulate in int64,
//! `mean`/`var`/`std` of integers are floats, `argmax` gives int64.
//!
//! ```
//! use ferroflow_numpy as np;
//! ferroflow::init();
//! let a = np::asarray([[1.0, 2.0], [3.0, 4.0]])?;
//! assert_eq!(np::sum(&a, None, false)?.item::<f64>()?, 10.0);
//! assert_eq!(np::mean(&a, 0, false)?.to_vec::<f64>()?, vec![2.0, 3.0]);
//! assert_eq!(np::median(&a, None, false)?.item::<f64>()?, 2.5);
//! assert_eq!(np::nanmax(np::asarray([1.0, f64::NAN, 3.0])?, None, false)?.item::<f64>()?, 3.0);
//! # Ok::<(), np::Error>(())
//! ```

use ferroflow_tensor::{Axes, DType, Error, Result, Tensor};

use crate::array::{arr, ArrayLike};
use crate::dtypes::{accumulate_dtype, default_float, float_result};
use crate::util::{axis_error, axis_or_flat, i64_tensor, norm_axis};

/// Axes checked with NumPy's wording, as a list (empty list: nothing reduced).
fn axes_of(op: &'static str, axis: &Axes, ndim: usize) -> Result<Vec<usize>> {
    match axis {
        Axes::All => Ok((0..ndim).collect()),
        Axes::List(l) => {
            let mut out = Vec::new();
            for &a in l {
                let n = ndim as isize;
                if a < -n || a >= n {
                    return Err(axis_error(op, a, ndim));
                }
                let a = if a < 0 { a + n } else { a } as usize;
                if out.contains(&a) {
                    return Err(Error::invalid(op, "duplicate value in 'axis'"));
                }
                out.push(a);
            }
            out.sort_unstable();
            Ok(out)
        }
    }
}

fn as_isize(v: &[usize]) -> Vec<isize> {
    v.iter().map(|a| *a as isize).collect()
}

/// Number of elements reduced over `axes`.
fn count(t: &Tensor, axes: &[usize]) -> usize {
    axes.iter().map(|a| t.shape()[*a]).product()
}

/// `numpy.sum(a, axis=None, keepdims=False)`.
pub fn sum(a: impl ArrayLike, axis: impl Into<Axes>, keepdims: bool) -> Result<Tensor> {
    let a = arr(a)?;
    let ax = axes_of("sum", &axis.into(), a.rank())?;
    a.cast(accumulate_dtype(a.dtype()))?
        .reduce_sum(as_isize(&ax), keepdims)
}
/// `numpy.prod(a, axis=None, keepdims=False)`.
pub fn prod(a: impl ArrayLike, axis: impl Into<Axes>, keepdims: bool) -> Result<Tensor> {
    let a = arr(a)?;
    let ax = axes_of("prod", &axis.into(), a.rank())?;
    a.cast(accumulate_dtype(a.dtype()))?
        .reduce_prod(as_isize(&ax), keepdims)
}
/// `numpy.mean(a, axis=None, keepdims=False)`: integers average in the default float.
pub fn mean(a: impl ArrayLike, axis: impl Into<Axes>, keepdims: bool) -> Result<Tensor> {
    let a = arr(a)?;
    let ax = axes_of("mean", &axis.into(), a.rank())?;
    let d = if a.dtype().is_float() {
        a.dtype()
    } else {
        default_float()
    };
    a.cast(d)?.reduce_mean(as_isize(&ax), keepdims)
}
/// `numpy.var(a, axis=None, ddof=0, keepdims=False)`: mean squared deviation, divided by
/// `N - ddof`.
pub fn var(
    a: impl ArrayLike,
    axis: impl Into<Axes>,
    ddof: usize,
    keepdims: bool,
) -> Result<Tensor> {
    let a = arr(a)?;
    let ax = axes_of("var", &axis.into(), a.rank())?;
    let d = if a.dtype().is_float() {
        a.dtype()
    } else {
        default_float()
    };
    let x = a.cast(d)?;
    let m = x.reduce_mean(as_isize(&ax), true)?;
    let n = count(&x, &ax) as f64 - ddof as f64;
    let ss = x.sub(&m)?.square()?.reduce_sum(as_isize(&ax), keepdims)?;
    ss.div(&ss.scalar_like(n.max(0.0))?)
}
/// `numpy.std(a, axis=None, ddof=0, keepdims=False)`: `√var`.
pub fn std(
    a: impl ArrayLike,
    axis: impl Into<Axes>,
    ddof: usize,
    keepdims: bool,
) -> Result<Tensor> {
    var(a, axis, ddof, keepdims)?.sqrt()
}
/// `numpy.average(a, axis=None, weights=None)`: the (weighted) mean; 1-D weights apply along
/// the one `axis`, otherwise they have `a`'s shape.
pub fn average(a: impl ArrayLike, axis: Option<isize>, weights: Option<&Tensor>) -> Result<Tensor> {
    let a = arr(a)?;
    let Some(w) = weights else {
        return mean(&a, axis, false);
    };
    let d = crate::promote_types(float_result(a.dtype()), float_result(w.dtype()));
    let (x, mut w) = (a.cast(d)?, w.cast(d)?);
    if w.shape() != x.shape() {
        let Some(ax) = axis else {
            return Err(Error::invalid(
                "average",
                "Axis must be specified when shapes of a and weights differ.",
            ));
        };
        let ax = norm_axis("average", ax, x.rank())?;
        if w.rank() != 1 || w.shape()[0] != x.shape()[ax] {
            return Err(Error::invalid(
                "average",
                "Length of weights not compatible with specified axis.",
            ));
        }
        let mut s = vec![1isize; x.rank()];
        s[ax] = -1;
        w = w.reshape(&s)?;
    }
    let axes: Axes = axis.into();
    let num = crate::math::multiply(&x, &w)?;
    let num = sum(&num, axes.clone(), false)?;
    let den = sum(w.broadcast_to(x.shape())?, axes, false)?;
    if den.to_f64_vec()?.contains(&0.0) {
        return Err(Error::invalid(
            "average",
            "ZeroDivisionError: Weights sum to zero, can't be normalized",
        ));
    }
    num.div(&den)
}

fn check_nonempty(op: &'static str, a: &Tensor, ax: &[usize]) -> Result<()> {
    if count(a, ax) == 0 && a.num_elements() == 0 {
        return Err(Error::invalid(
            op,
            format!("zero-size array to reduction operation {op} which has no identity"),
        ));
    }
    Ok(())
}

/// `numpy.amax(a, axis=None, keepdims=False)` (NaN propagates; empty input is an error).
pub fn amax(a: impl ArrayLike, axis: impl Into<Axes>, keepdims: bool) -> Result<Tensor> {
    let a = arr(a)?;
    let ax = axes_of("maximum", &axis.into(), a.rank())?;
    check_nonempty("maximum", &a, &ax)?;
    if a.dtype() == DType::Bool {
        return a.reduce_any(as_isize(&ax), keepdims);
    }
    // the reduce primitive propagates NaN (backend contract, checked by the conformance suite)
    a.reduce_max(as_isize(&ax), keepdims)
}
/// `numpy.amin(a, axis=None, keepdims=False)`.
pub fn amin(a: impl ArrayLike, axis: impl Into<Axes>, keepdims: bool) -> Result<Tensor> {
    let a = arr(a)?;
    let ax = axes_of("minimum", &axis.into(), a.rank())?;
    check_nonempty("minimum", &a, &ax)?;
    if a.dtype() == DType::Bool {
        return a.reduce_all(as_isize(&ax), keepdims);
    }
    a.reduce_min(as_isize(&ax), keepdims)
}
/// `numpy.max` (same as [`amax`]).
pub fn max(a: impl ArrayLike, axis: impl Into<Axes>, keepdims: bool) -> Result<Tensor> {
    amax(a, axis, keepdims)
}
/// `numpy.min` (same as [`amin`]).
pub fn min(a: impl ArrayLike, axis: impl Into<Axes>, keepdims: bool) -> Result<Tensor> {
    amin(a, axis, keepdims)
}

/// `numpy.ptp(a, axis=None, keepdims=False)`: max - min.
pub fn ptp(a: impl ArrayLike, axis: impl Into<Axes>, keepdims: bool) -> Result<Tensor> {
    let a = arr(a)?;
    let axis = axis.into();
    crate::math::subtract(amax(&a, axis.clone(), keepdims)?, amin(&a, axis, keepdims)?)
}

fn arg_reduce(
    op: &'static str,
    a: impl ArrayLike,
    axis: Option<isize>,
    max: bool,
) -> Result<Tensor> {
    let (a, ax) = axis_or_flat(op, arr(a)?, axis)?;
    if a.shape()[ax] == 0 {
        return Err(Error::invalid(
            op,
            format!("attempt to get {op} of an empty sequence"),
        ));
    }
    let a = if a.dtype() == DType::Bool {
        a.cast(DType::U8)?
    } else {
        a
    };
    // the first NaN wins, as in NumPy (backend contract, checked by the conformance suite)
    let r = if max {
        a.argmax(ax as isize)?
    } else {
        a.argmin(ax as isize)?
    };
    r.cast(DType::I64)
}
/// `numpy.argmax(a, axis=None)`: int64 positions (of the flattened array for `None`).
pub fn argmax(a: impl ArrayLike, axis: Option<isize>) -> Result<Tensor> {
    arg_reduce("argmax", a, axis, true)
}
/// `numpy.argmin(a, axis=None)`.
pub fn argmin(a: impl ArrayLike, axis: Option<isize>) -> Result<Tensor> {
    arg_reduce("argmin", a, axis, false)
}
/// `numpy.any(a, axis=None, keepdims=False)`: is any element non-zero.
pub fn any(a: impl ArrayLike, axis: impl Into<Axes>, keepdims: bool) -> Result<Tensor> {
    let a = arr(a)?;
    let ax = axes_of("any", &axis.into(), a.rank())?;
    a.cast(DType::Bool)?.reduce_any(as_isize(&ax), keepdims)
}
/// `numpy.all(a, axis=None, keepdims=False)`: is every element non-zero.
pub fn all(a: impl ArrayLike, axis: impl Into<Axes>, keepdims: bool) -> Result<Tensor> {
    let a = arr(a)?;
    let ax = axes_of("all", &axis.into(), a.rank())?;
    a.cast(DType::Bool)?.reduce_all(as_isize(&ax), keepdims)
}
/// `numpy.count_nonzero(a, axis=None, keepdims=False)` (int64).
pub fn count_nonzero(a: impl ArrayLike, axis: impl Into<Axes>, keepdims: bool) -> Result<Tensor> {
    let a = arr(a)?;
    let ax = axes_of("count_nonzero", &axis.into(), a.rank())?;
    a.cast(DType::Bool)?
        .cast(DType::I64)?
        .reduce_sum(as_isize(&ax), keepdims)
}

/// NaNs replaced by `fill` (floats only).
fn nan_to(a: &Tensor, fill: f64) -> Result<Tensor> {
    if !a.dtype().is_float() {
        return Ok(a.clone());
    }
    Tensor::select(&a.is_nan()?, &a.scalar_like(fill)?, a)
}

/// `numpy.nansum`: NaNs count as zero.
pub fn nansum(a: impl ArrayLike, axis: impl Into<Axes>, keepdims: bool) -> Result<Tensor> {
    sum(nan_to(&arr(a)?, 0.0)?, axis, keepdims)
}
/// `numpy.nanprod`: NaNs count as one.
pub fn nanprod(a: impl ArrayLike, axis: impl Into<Axes>, keepdims: bool) -> Result<Tensor> {
    prod(nan_to(&arr(a)?, 1.0)?, axis, keepdims)
}
/// Non-NaN count over axes.
fn valid_count(a: &Tensor, ax: &[usize], keepdims: bool) -> Result<Tensor> {
    let valid = if a.dtype().is_float() {
        a.is_nan()?.logical_not()?
    } else {
        a.ones_like()?.cast(DType::Bool)?
    };
    valid.cast(a.dtype())?.reduce_sum(as_isize(ax), keepdims)
}
/// `numpy.nanmean`: the mean of the non-NaN elements (NaN for all-NaN lanes).
pub fn nanmean(a: impl ArrayLike, axis: impl Into<Axes>, keepdims: bool) -> Result<Tensor> {
    let a = arr(a)?;
    let a = a.cast(if a.dtype().is_float() {
        a.dtype()
    } else {
        default_float()
    })?;
    let ax = axes_of("nanmean", &axis.into(), a.rank())?;
    let s = nan_to(&a, 0.0)?.reduce_sum(as_isize(&ax), keepdims)?;
    s.div(&valid_count(&a, &ax, keepdims)?)
}
/// `numpy.nanvar(a, axis=None, ddof=0, keepdims=False)`.
pub fn nanvar(
    a: impl ArrayLike,
    axis: impl Into<Axes>,
    ddof: usize,
    keepdims: bool,
) -> Result<Tensor> {
    let a = arr(a)?;
    let a = a.cast(if a.dtype().is_float() {
        a.dtype()
    } else {
        default_float()
    })?;
    let ax = axes_of("nanvar", &axis.into(), a.rank())?;
    let m = nanmean(&a, ax.iter().map(|x| *x as isize).collect::<Vec<_>>(), true)?;
    let dev = nan_to(&a.sub(&m)?, 0.0)?
        .square()?
        .reduce_sum(as_isize(&ax), keepdims)?;
    let n = valid_count(&a, &ax, keepdims)?.sub(&a.scalar_like(ddof as f64)?)?;
    let n = n.maximum(&n.scalar_like(0.0)?)?;
    dev.div(&n)
}
/// `numpy.nanstd`.
pub fn nanstd(
    a: impl ArrayLike,
    axis: impl Into<Axes>,
    ddof: usize,
    keepdims: bool,
) -> Result<Tensor> {
    nanvar(a, axis, ddof, keepdims)?.sqrt()
}
fn nan_extreme(
    op: &'static str,
    a: impl ArrayLike,
    axis: impl Into<Axes>,
    keepdims: bool,
    max: bool,
) -> Result<Tensor> {
    let a = arr(a)?;
    if !a.dtype().is_float() {
        return if max {
            amax(a, axis, keepdims)
        } else {
            amin(a, axis, keepdims)
        };
    }
    let ax = axes_of(op, &axis.into(), a.rank())?;
    check_nonempty(op, &a, &ax)?;
    let fill = if max {
        f64::NEG_INFINITY
    } else {
        f64::INFINITY
    };
    let filled = nan_to(&a, fill)?;
    let m = if max {
        filled.reduce_max(as_isize(&ax), keepdims)?
    } else {
        filled.reduce_min(as_isize(&ax), keepdims)?
    };
    let all_nan = a.is_nan()?.reduce_all(as_isize(&ax), keepdims)?;
    Tensor::select(&all_nan, &m.scalar_like(f64::NAN)?, &m)
}
/// `numpy.nanmax`: the maximum ignoring NaNs (NaN for all-NaN lanes).
pub fn nanmax(a: impl ArrayLike, axis: impl Into<Axes>, keepdims: bool) -> Result<Tensor> {
    nan_extreme("nanmax", a, axis, keepdims, true)
}
/// `numpy.nanmin`.
pub fn nanmin(a: impl ArrayLike, axis: impl Into<Axes>, keepdims: bool) -> Result<Tensor> {
    nan_extreme("nanmin", a, axis, keepdims, false)
}
fn nan_arg(op: &'static str, a: impl ArrayLike, axis: Option<isize>, max: bool) -> Result<Tensor> {
    let a = arr(a)?;
    if !a.dtype().is_float() {
        return arg_reduce(op, a, axis, max);
    }
    let lanes = match axis {
        None => a.reshape(&[-1])?,
        Some(_) => a.clone(),
    };
    let ax: isize = axis
        .map(|x| norm_axis(op, x, a.rank()).map(|v| v as isize))
        .transpose()?
        .unwrap_or(0);
    if lanes
        .is_nan()?
        .reduce_all(vec![ax], false)?
        .reduce_any(Axes::All, false)?
        .item::<bool>()?
    {
        return Err(Error::invalid(op, "All-NaN slice encountered"));
    }
    let filled = nan_to(
        &lanes,
        if max {
            f64::NEG_INFINITY
        } else {
            f64::INFINITY
        },
    )?;
    let r = if max {
        filled.argmax(ax)?
    } else {
        filled.argmin(ax)?
    };
    r.cast(DType::I64)
}
/// `numpy.nanargmax`: position of the maximum ignoring NaNs (an all-NaN lane is an error).
pub fn nanargmax(a: impl ArrayLike, axis: Option<isize>) -> Result<Tensor> {
    nan_arg("nanargmax", a, axis, true)
}
/// `numpy.nanargmin`.
pub fn nanargmin(a: impl ArrayLike, axis: Option<isize>) -> Result<Tensor> {
    nan_arg("nanargmin", a, axis, false)
}
/// `numpy.nancumsum`: running sums with NaNs as zero.
pub fn nancumsum(a: impl ArrayLike, axis: Option<isize>) -> Result<Tensor> {
    crate::math::cumsum(nan_to(&arr(a)?, 0.0)?, axis)
}
/// `numpy.nancumprod`: running products with NaNs as one.
pub fn nancumprod(a: impl ArrayLike, axis: Option<isize>) -> Result<Tensor> {
    crate::math::cumprod(nan_to(&arr(a)?, 1.0)?, axis)
}

/// Quantiles by NumPy's default ("linear") method along one axis (or all, flattened):
/// sort (NaN last), then interpolate between neighbours at `q·(n-1)`.
fn quantile_impl(
    op: &'static str,
    a: impl ArrayLike,
    q: &[f64],
    q_scalar: bool,
    axis: Option<isize>,
    keepdims: bool,
    ignore_nan: bool,
) -> Result<Tensor> {
    if q.iter().any(|v| !(0.0..=1.0).contains(v)) {
        return Err(Error::invalid(op, "Quantiles must be in the range [0, 1]"));
    }
    let a = arr(a)?;
    let orig_rank = a.rank();
    let (x, ax) = match axis {
        None => (a.reshape(&[-1])?, 0usize),
        Some(ax) => {
            let ax = norm_axis(op, ax, a.rank())?;
            (crate::shape::moveaxis(&a, &[ax as isize], &[-1])?, ax)
        }
    };
    let x = x.cast(float_result(x.dtype()))?;
    let last = x.rank() - 1;
    let n = x.shape()[last];
    if n == 0 {
        return Err(Error::invalid(
            op,
            "cannot compute a quantile of an empty axis",
        ));
    }
    let sorted = x.sort(-1, false)?;
    let lanes = x.num_elements() / n;
    let nan = x.is_nan()?;
    let nvalid: Vec<f64> = if ignore_nan {
        nan.logical_not()?
            .cast(DType::I32)?
            .reduce_sum(vec![-1], false)?
            .to_f64_vec()?
    } else {
        vec![n as f64; lanes]
    };
    let any_nan = nan.reduce_any(vec![-1], false)?;
    let mut results = Vec::new();
    for &qv in q {
        let mut lo = Vec::with_capacity(lanes);
        let mut hi = Vec::with_capacity(lanes);
        let mut frac = Vec::with_capacity(lanes);
        for &nv in &nvalid {
            let nv = nv.max(1.0);
            let pos = qv * (nv - 1.0);
            let l = pos.floor();
            lo.push(l as i64);
            hi.push((l as i64 + 1).min(nv as i64 - 1));
            frac.push(pos - l);
        }
        let lane_shape: Vec<usize> = x.shape()[..last].to_vec();
        let mut ishape = lane_shape.clone();
        ishape.push(1);
        let lo = i64_tensor(lo, &ishape, &x)?;
        let hi = i64_tensor(hi, &ishape, &x)?;
        let vlo = crate::shape::take_along_axis(&sorted, &lo, -1)?.squeeze(&[-1])?;
        let vhi = crate::shape::take_along_axis(&sorted, &hi, -1)?.squeeze(&[-1])?;
        let f = Tensor::from_host_on(
            ferroflow_tensor::HostData::from_f64_slice(x.dtype(), &frac),
            &lane_shape,
            x.device(),
        )?
        .cast(x.dtype())?;
        let mut v = vlo.add(&vhi.sub(&vlo)?.mul(&f)?)?;
        let bad = if ignore_nan {
            nan.reduce_all(vec![-1], false)?
        } else {
            any_nan.clone()
        };
        v = Tensor::select(&bad, &v.scalar_like(f64::NAN)?, &v)?;
        if keepdims {
            v = match axis {
                None => v.reshape(&vec![1isize; orig_rank])?,
                Some(_) => v.expand_dims(ax as isize)?,
            };
        }
        results.push(v);
    }
    if q_scalar {
        return Ok(results.remove(0));
    }
    Tensor::stack(&results, 0)
}

fn q_list(q: impl ArrayLike, scale: f64) -> Result<(Vec<f64>, bool)> {
    let q = arr(q)?;
    Ok((
        q.to_f64_vec()?.into_iter().map(|v| v / scale).collect(),
        q.rank() == 0,
    ))
}

/// `numpy.quantile(a, q, axis=None, keepdims=False)` (linear interpolation; `q` a scalar
/// or a 1-D list, which becomes the first axis of the result).
pub fn quantile(
    a: impl ArrayLike,
    q: impl ArrayLike,
    axis: Option<isize>,
    keepdims: bool,
) -> Result<Tensor> {
    let (q, s) = q_list(q, 1.0)?;
    quantile_impl("quantile", a, &q, s, axis, keepdims, false)
}
/// `numpy.percentile(a, q, axis=None, keepdims=False)`: quantiles with `q` in percent.
pub fn percentile(
    a: impl ArrayLike,
    q: impl ArrayLike,
    axis: Option<isize>,
    keepdims: bool,
) -> Result<Tensor> {
    let (q, s) = q_list(q, 100.0)?;
    quantile_impl("percentile", a, &q, s, axis, keepdims, false)
}
/// `numpy.median(a, axis=None, keepdims=False)`.
pub fn median(a: impl ArrayLike, axis: Option<isize>, keepdims: bool) -> Result<Tensor> {
    quantile_impl("median", a, &[0.5], true, axis, keepdims, false)
}
/// `numpy.nanquantile`: quantiles of the non-NaN elements.
pub fn nanquantile(
    a: impl ArrayLike,
    q: impl ArrayLike,
    axis: Option<isize>,
    keepdims: bool,
) -> Result<Tensor> {
    let (q, s) = q_list(q, 1.0)?;
    quantile_impl("nanquantile", a, &q, s, axis, keepdims, true)
}
/// `numpy.nanpercentile`.
pub fn nanpercentile(
    a: impl ArrayLike,
    q: impl ArrayLike,
    axis: Option<isize>,
    keepdims: bool,
) -> Result<Tensor> {
    let (q, s) = q_list(q, 100.0)?;
    quantile_impl("nanpercentile", a, &q, s, axis, keepdims, true)
}
/// `numpy.nanmedian`.
pub fn nanmedian(a: impl ArrayLike, axis: Option<isize>, keepdims: bool) -> Result<Tensor> {
    quantile_impl("nanmedian", a, &[0.5], true, axis, keepdims, true)
}

/// `numpy.cov(m, rowvar=True, ddof=None)`: the covariance matrix of the variables (rows, or
/// columns when `rowvar` is false), normalised by `N - ddof` (default `N - 1`).
pub fn cov(m: impl ArrayLike, rowvar: bool, ddof: Option<usize>) -> Result<Tensor> {
    let m = arr(m)?;
    if m.rank() > 2 {
        return Err(Error::invalid("cov", "m has more than 2 dimensions"));
    }
    let m = crate::shape::atleast_2d(&m)?;
    let x = if rowvar { m } else { m.t()? };
    let x = x.cast(if x.dtype().is_float() {
        x.dtype()
    } else {
        default_float()
    })?;
    let n = x.shape()[1] as f64;
    let centred = x.sub(&x.reduce_mean(vec![1], true)?)?;
    let c = crate::products::matmul(&centred, &centred.t()?)?;
    let c = c.div(&c.scalar_like((n - ddof.unwrap_or(1) as f64).max(0.0))?)?;
    if c.shape() == [1, 1] {
        c.reshape(&[])
    } else {
        Ok(c)
    }
}

/// `numpy.corrcoef(x, rowvar=True)`: Pearson correlation coefficients, clipped to [-1, 1].
pub fn corrcoef(x: impl ArrayLike, rowvar: bool) -> Result<Tensor> {
    let c = cov(x, rowvar, None)?;
    if c.rank() == 0 {
        return c.div(&c);
    }
    let d = crate::products::diagonal(&c, 0, 0, 1)?.sqrt()?;
    let r = c.div(&d.reshape(&[-1, 1])?)?.div(&d.reshape(&[1, -1])?)?;
    r.clip_scalar(-1.0, 1.0)
}
