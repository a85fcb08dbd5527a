//! Reductions with NumPy's `axis` (`None` for all, one axis or several) and `keepdims`:
//! `sum`, `prod`, `mean`, `std`, `var`, `average`, `amax`/`amin`, `ptp`, `argmax`,
//! `argmin`, `any`, `all`, `count_nonzero`, `median`, `percentile`, `quantile`, and the
//! NaN-ignoring `nansum`, `nanprod`, `nanmean`, `nanvar`, `nanstd`, `nanmax`, `nanmin`,
//! `nanargmax`, `nanargmin`, `nancumsum`, `nancumprod`, `nanmedian`, `nanpercentile`,
//! `nanquantile`.
//!
//! Each reduction's short form has NumPy's defaults (`np::sum(&a)`: every axis); its `_with`
//! form takes the keywords from [`ReduceArgs`] (`axis=`, `keepdims=`, and where NumPy has
//! them `initial=`, `where=`, `ddof=`): `np::sum_with(&a, ReduceArgs::new().axis(1))`.
//!
//! Dtypes follow NumPy: `sum`/`prod` of booleans and small integers accumulate in int64,
//! `mean`/`var`/`std` of integers are floats, `argmax` gives int64.
//!
//! ```
//! use ferroflow_numpy as np;
//! ferroflow::init();
//! let a = np::asarray([[1.0, 2.0], [3.0, 4.0]])?;
//! assert_eq!(np::sum(&a)?.item::<f64>()?, 10.0);
//! assert_eq!(np::mean_with(&a, np::ReduceArgs::new().axis(0))?.to_vec::<f64>()?, vec![2.0, 3.0]);
//! assert_eq!(np::median(&a)?.item::<f64>()?, 2.5);
//! assert_eq!(np::nanmax(np::asarray([1.0, f64::NAN, 3.0])?)?.item::<f64>()?, 3.0);
//! # Ok::<(), np::Error>(())
//! ```

use ferroflow_tensor::{Axes, DType, Error, Result, Tensor};

use crate::array::{arr, ArrayLike};
use crate::dtypes::{accumulate_dtype, default_float, float_result, inexact_result};
use crate::util::{axis_error, axis_or_flat, i64_tensor, norm_axis, one_axis};

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
fn sum_axes(a: impl ArrayLike, axis: impl Into<Axes>, keepdims: bool) -> Result<Tensor> {
    let a = arr(a)?;
    let ax = axes_of("sum", &axis.into(), a.rank())?;
    a.cast(accumulate_dtype(a.dtype()))?
        .reduce_sum(as_isize(&ax), keepdims)
}
/// `numpy.prod(a, axis=None, keepdims=False)`.
fn prod_axes(a: impl ArrayLike, axis: impl Into<Axes>, keepdims: bool) -> Result<Tensor> {
    let a = arr(a)?;
    let ax = axes_of("prod", &axis.into(), a.rank())?;
    a.cast(accumulate_dtype(a.dtype()))?
        .reduce_prod(as_isize(&ax), keepdims)
}
/// `numpy.mean(a, axis=None, keepdims=False)`: integers average in the default float.
fn mean_axes(a: impl ArrayLike, axis: impl Into<Axes>, keepdims: bool) -> Result<Tensor> {
    let a = arr(a)?;
    let ax = axes_of("mean", &axis.into(), a.rank())?;
    a.cast(inexact_result(a.dtype()))?
        .reduce_mean(as_isize(&ax), keepdims)
}
/// `numpy.var(a, axis=None, ddof=0, keepdims=False)`: mean squared deviation, divided by
/// `N - ddof`.
fn var_axes(
    a: impl ArrayLike,
    axis: impl Into<Axes>,
    ddof: usize,
    keepdims: bool,
) -> Result<Tensor> {
    let a = arr(a)?;
    let ax = axes_of("var", &axis.into(), a.rank())?;
    let x = a.cast(inexact_result(a.dtype()))?;
    let m = x.reduce_mean(as_isize(&ax), true)?;
    let n = count(&x, &ax) as f64 - ddof as f64;
    let dev = x.sub(&m)?;
    // |x - mean|²: a real number for complex input, as NumPy's
    let squared = if dev.dtype().is_complex() {
        dev.mul(&dev.conj()?)?.real()?
    } else {
        dev.square()?
    };
    let ss = squared.reduce_sum(as_isize(&ax), keepdims)?;
    ss.div(&ss.scalar_like(n.max(0.0))?)
}
/// `numpy.std(a, axis=None, ddof=0, keepdims=False)`: `√var`.
fn std_axes(
    a: impl ArrayLike,
    axis: impl Into<Axes>,
    ddof: usize,
    keepdims: bool,
) -> Result<Tensor> {
    var_axes(a, axis, ddof, keepdims)?.sqrt()
}
/// `numpy.average(a, axis=None, weights=None)`: the (weighted) mean; 1-D weights apply along
/// the one `axis`, otherwise they have `a`'s shape.
fn average_full(
    a: impl ArrayLike,
    axis: impl Into<Axes>,
    weights: Option<&Tensor>,
) -> Result<Tensor> {
    let axis = one_axis("average", axis.into())?;
    let a = arr(a)?;
    let Some(w) = weights else {
        return mean_axes(&a, axis, false);
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
    let num = sum_axes(&num, axes.clone(), false)?;
    let den = sum_axes(w.broadcast_to(x.shape())?, axes, false)?;
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
fn amax_axes(a: impl ArrayLike, axis: impl Into<Axes>, keepdims: bool) -> Result<Tensor> {
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
fn amin_axes(a: impl ArrayLike, axis: impl Into<Axes>, keepdims: bool) -> Result<Tensor> {
    let a = arr(a)?;
    let ax = axes_of("minimum", &axis.into(), a.rank())?;
    check_nonempty("minimum", &a, &ax)?;
    if a.dtype() == DType::Bool {
        return a.reduce_all(as_isize(&ax), keepdims);
    }
    a.reduce_min(as_isize(&ax), keepdims)
}
/// `numpy.max` (same as [`amax`]).
fn max_axes(a: impl ArrayLike, axis: impl Into<Axes>, keepdims: bool) -> Result<Tensor> {
    amax_axes(a, axis, keepdims)
}
/// `numpy.min` (same as [`amin`]).
fn min_axes(a: impl ArrayLike, axis: impl Into<Axes>, keepdims: bool) -> Result<Tensor> {
    amin_axes(a, axis, keepdims)
}

/// NumPy's keyword arguments of a reduction: `axis`, `keepdims`, `initial` and `where`,
/// for [`sum_with`], [`prod_with`], [`amax_with`] / [`max_with`], [`amin_with`] /
/// [`min_with`], [`mean_with`], [`any_with`] and [`all_with`]. The defaults are NumPy's:
/// every axis, no kept dimensions, no initial value, no mask.
///
/// ```
/// use ferroflow_numpy as np;
/// ferroflow::init();
/// let a = np::asarray([[1.0, 5.0], [3.0, 2.0]])?;
/// // np.max(a, axis=1, initial=4.0) and np.sum(a, where=[[True, False], [True, True]])
/// let m = np::max_with(&a, np::ReduceArgs::new().axis(1).initial(4.0))?;
/// assert_eq!(m.to_vec::<f64>()?, vec![5.0, 4.0]);
/// let mask = np::asarray([[true, false], [true, true]])?;
/// assert_eq!(np::sum_with(&a, np::ReduceArgs::new().where_(&mask))?.item::<f64>()?, 6.0);
/// // An empty reduction with an initial value is that value.
/// let empty = np::zeros(&[0], None)?;
/// assert_eq!(np::amax_with(&empty, np::ReduceArgs::new().initial(-1.0))?.item::<f64>()?, -1.0);
/// # Ok::<(), np::Error>(())
/// ```
#[derive(Debug, Clone)]
pub struct ReduceArgs {
    /// The axes reduced (`axis=`; default every axis).
    pub axis: Axes,
    /// Keep the reduced axes as length 1 (`keepdims=`).
    pub keepdims: bool,
    /// The reduction's starting value (`initial=`): added for sums, multiplied for products,
    /// the floor or ceiling for max and min. Needed by max and min with a mask.
    pub initial: Option<f64>,
    /// The elements to include (`where=`): a bool array broadcast to the input's shape.
    pub where_: Option<Tensor>,
    /// Delta degrees of freedom (`ddof=`) of [`var_with`], [`std_with`], [`nanvar_with`]
    /// and [`nanstd_with`]: the divisor is `N - ddof`.
    pub ddof: usize,
}

impl Default for ReduceArgs {
    fn default() -> ReduceArgs {
        ReduceArgs {
            axis: Axes::All,
            keepdims: false,
            initial: None,
            where_: None,
            ddof: 0,
        }
    }
}

impl ReduceArgs {
    /// NumPy's defaults.
    pub fn new() -> ReduceArgs {
        ReduceArgs::default()
    }
    /// `axis=`.
    pub fn axis(mut self, axis: impl Into<Axes>) -> ReduceArgs {
        self.axis = axis.into();
        self
    }
    /// `keepdims=`.
    pub fn keepdims(mut self, keepdims: bool) -> ReduceArgs {
        self.keepdims = keepdims;
        self
    }
    /// `initial=`.
    pub fn initial(mut self, initial: f64) -> ReduceArgs {
        self.initial = Some(initial);
        self
    }
    /// `where=`: a bool mask broadcast to the input's shape.
    pub fn where_(mut self, mask: &Tensor) -> ReduceArgs {
        self.where_ = Some(mask.clone());
        self
    }
    /// `ddof=` (variances and standard deviations).
    pub fn ddof(mut self, ddof: usize) -> ReduceArgs {
        self.ddof = ddof;
        self
    }
    /// Refuses the keywords `op` does not take (`initial=` and `where=`; `ddof=` unless
    /// `takes_ddof`), in NumPy's words.
    fn only_axis(&self, op: &'static str, takes_ddof: bool) -> Result<()> {
        let unexpected = if self.initial.is_some() {
            Some("initial")
        } else if self.where_.is_some() {
            Some("where")
        } else if self.ddof != 0 && !takes_ddof {
            Some("ddof")
        } else {
            None
        };
        match unexpected {
            Some(k) => Err(Error::invalid(
                op,
                format!("{op}() got an unexpected keyword argument '{k}'"),
            )),
            None => Ok(()),
        }
    }
}

/// The input with the elements `where=` excludes replaced by `fill` (the reduction's
/// identity); the mask must be bool (NumPy's "safe" casting) and broadcast to the input.
fn masked(op: &'static str, a: &Tensor, args: &ReduceArgs, fill: f64) -> Result<Tensor> {
    let Some(mask) = &args.where_ else {
        return Ok(a.clone());
    };
    if mask.dtype() != DType::Bool {
        return Err(Error::invalid(
            op,
            format!(
                "where= needs a bool array: cannot cast array data from dtype('{}') to \
                 dtype('bool') according to the rule 'safe'",
                mask.dtype()
            ),
        ));
    }
    let mask = mask.broadcast_to(a.shape()).map_err(|_| {
        Error::invalid(
            op,
            format!(
                "where= of shape {:?} does not broadcast to the input's shape {:?}",
                mask.shape(),
                a.shape()
            ),
        )
    })?;
    Tensor::select(&mask, a, &a.scalar_like(fill)?)
}

/// `initial` as a value of `dtype`, refused where NumPy refuses it (out of an integer
/// type's range).
fn initial_in(op: &'static str, initial: f64, dtype: DType) -> Result<f64> {
    if dtype.is_int() {
        let (lo, hi) = int_range(dtype);
        let v = initial.trunc();
        if !(v >= lo && v <= hi) {
            return Err(Error::invalid(
                op,
                format!("initial={initial} is out of bounds for {dtype}"),
            ));
        }
        return Ok(v);
    }
    Ok(initial)
}

/// The smallest and largest value of an integer dtype.
fn int_range(dtype: DType) -> (f64, f64) {
    match dtype {
        DType::I8 => (i8::MIN as f64, i8::MAX as f64),
        DType::U8 => (0.0, u8::MAX as f64),
        DType::I32 => (i32::MIN as f64, i32::MAX as f64),
        _ => (i64::MIN as f64, i64::MAX as f64),
    }
}

/// The shape a reduction over `ax` leaves.
fn reduced_shape(a: &Tensor, ax: &[usize], keepdims: bool) -> Vec<usize> {
    let mut out = vec![];
    for (i, &d) in a.shape().iter().enumerate() {
        if !ax.contains(&i) {
            out.push(d);
        } else if keepdims {
            out.push(1);
        }
    }
    out
}

/// `numpy.sum(a, axis, keepdims, initial, where)`.
pub fn sum_with(a: impl ArrayLike, args: ReduceArgs) -> Result<Tensor> {
    let a = arr(a)?;
    let ax = axes_of("sum", &args.axis, a.rank())?;
    let a = a.cast(accumulate_dtype(a.dtype()))?;
    let total = masked("sum", &a, &args, 0.0)?.reduce_sum(as_isize(&ax), args.keepdims)?;
    match args.initial {
        Some(i) => total.add(&total.scalar_like(initial_in("sum", i, total.dtype())?)?),
        None => Ok(total),
    }
}

/// `numpy.prod(a, axis, keepdims, initial, where)`.
pub fn prod_with(a: impl ArrayLike, args: ReduceArgs) -> Result<Tensor> {
    let a = arr(a)?;
    let ax = axes_of("prod", &args.axis, a.rank())?;
    let a = a.cast(accumulate_dtype(a.dtype()))?;
    let total = masked("prod", &a, &args, 1.0)?.reduce_prod(as_isize(&ax), args.keepdims)?;
    match args.initial {
        Some(i) => total.mul(&total.scalar_like(initial_in("prod", i, total.dtype())?)?),
        None => Ok(total),
    }
}

/// max (`largest`) or min with `initial` and `where`.
fn extreme_with(
    op: &'static str,
    a: impl ArrayLike,
    args: ReduceArgs,
    largest: bool,
) -> Result<Tensor> {
    let a = arr(a)?;
    let ax = axes_of(op, &args.axis, a.rank())?;
    let Some(initial) = args.initial else {
        if args.where_.is_some() {
            return Err(Error::invalid(
                op,
                format!(
                    "reduction operation '{op}' does not have an identity, so to use a where \
                     mask one has to specify 'initial'"
                ),
            ));
        }
        return if largest {
            amax_axes(&a, args.axis, args.keepdims)
        } else {
            amin_axes(&a, args.axis, args.keepdims)
        };
    };
    let initial = initial_in(op, initial, a.dtype())?;
    if count(&a, &ax) == 0 {
        return crate::full(
            &reduced_shape(&a, &ax, args.keepdims),
            a.scalar_like(initial)?,
            Some(a.dtype()),
        );
    }
    // Excluded elements become the identity: the other end of the type's range.
    let identity = match (a.dtype(), largest) {
        (DType::Bool, l) => (!l) as u8 as f64,
        (d, l) if d.is_int() => {
            let (lo, hi) = int_range(d);
            if l {
                lo
            } else {
                hi
            }
        }
        (_, true) => f64::NEG_INFINITY,
        (_, false) => f64::INFINITY,
    };
    let a = masked(op, &a, &args, identity)?;
    let reduced = if largest {
        amax_axes(&a, args.axis.clone(), args.keepdims)?
    } else {
        amin_axes(&a, args.axis.clone(), args.keepdims)?
    };
    let floor = reduced.scalar_like(initial)?;
    if largest {
        crate::maximum(&reduced, &floor)
    } else {
        crate::minimum(&reduced, &floor)
    }
}

/// `numpy.amax(a, axis, keepdims, initial, where)`: `where=` needs `initial=`; an empty
/// reduction with `initial=` is `initial`.
pub fn amax_with(a: impl ArrayLike, args: ReduceArgs) -> Result<Tensor> {
    extreme_with("maximum", a, args, true)
}
/// `numpy.amin(a, axis, keepdims, initial, where)`.
pub fn amin_with(a: impl ArrayLike, args: ReduceArgs) -> Result<Tensor> {
    extreme_with("minimum", a, args, false)
}
/// `numpy.max(a, axis, keepdims, initial, where)` (same as [`amax_with`]).
pub fn max_with(a: impl ArrayLike, args: ReduceArgs) -> Result<Tensor> {
    amax_with(a, args)
}
/// `numpy.min(a, axis, keepdims, initial, where)` (same as [`amin_with`]).
pub fn min_with(a: impl ArrayLike, args: ReduceArgs) -> Result<Tensor> {
    amin_with(a, args)
}

/// Refuses `initial=` for the reductions NumPy gives none (`mean`, `any`, `all`).
fn no_initial(op: &'static str, args: &ReduceArgs) -> Result<()> {
    match args.initial {
        Some(_) => Err(Error::invalid(
            op,
            format!("{op}() got an unexpected keyword argument 'initial'"),
        )),
        None => Ok(()),
    }
}

/// `numpy.mean(a, axis, keepdims, where)`: the mean of the included elements (NaN where a
/// slice includes none, as NumPy's).
pub fn mean_with(a: impl ArrayLike, args: ReduceArgs) -> Result<Tensor> {
    no_initial("mean", &args)?;
    let a = arr(a)?;
    if args.where_.is_none() {
        return mean_axes(&a, args.axis, args.keepdims);
    }
    let ax = axes_of("mean", &args.axis, a.rank())?;
    let a = a.cast(inexact_result(a.dtype()))?;
    let total = masked("mean", &a, &args, 0.0)?.reduce_sum(as_isize(&ax), args.keepdims)?;
    let n =
        masked("mean", &a.ones_like()?, &args, 0.0)?.reduce_sum(as_isize(&ax), args.keepdims)?;
    total.div(&n)
}

/// `numpy.any(a, axis, keepdims, where)`.
pub fn any_with(a: impl ArrayLike, args: ReduceArgs) -> Result<Tensor> {
    no_initial("any", &args)?;
    let a = arr(a)?.cast(DType::Bool)?;
    let a = masked("any", &a, &args, 0.0)?;
    any_axes(&a, args.axis, args.keepdims)
}

/// `numpy.all(a, axis, keepdims, where)`.
pub fn all_with(a: impl ArrayLike, args: ReduceArgs) -> Result<Tensor> {
    no_initial("all", &args)?;
    let a = arr(a)?.cast(DType::Bool)?;
    let a = masked("all", &a, &args, 1.0)?;
    all_axes(&a, args.axis, args.keepdims)
}

/// `numpy.ptp(a, axis=None, keepdims=False)`: max - min.
fn ptp_axes(a: impl ArrayLike, axis: impl Into<Axes>, keepdims: bool) -> Result<Tensor> {
    let a = arr(a)?;
    let axis = axis.into();
    crate::math::subtract(
        amax_axes(&a, axis.clone(), keepdims)?,
        amin_axes(&a, axis, keepdims)?,
    )
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
pub fn argmax(a: impl ArrayLike, axis: impl Into<Axes>) -> Result<Tensor> {
    let axis = one_axis("argmax", axis.into())?;
    arg_reduce("argmax", a, axis, true)
}
/// `numpy.argmin(a, axis=None)`.
pub fn argmin(a: impl ArrayLike, axis: impl Into<Axes>) -> Result<Tensor> {
    let axis = one_axis("argmin", axis.into())?;
    arg_reduce("argmin", a, axis, false)
}
/// `numpy.any(a, axis=None, keepdims=False)`: is any element non-zero.
fn any_axes(a: impl ArrayLike, axis: impl Into<Axes>, keepdims: bool) -> Result<Tensor> {
    let a = arr(a)?;
    let ax = axes_of("any", &axis.into(), a.rank())?;
    a.cast(DType::Bool)?.reduce_any(as_isize(&ax), keepdims)
}
/// `numpy.all(a, axis=None, keepdims=False)`: is every element non-zero.
fn all_axes(a: impl ArrayLike, axis: impl Into<Axes>, keepdims: bool) -> Result<Tensor> {
    let a = arr(a)?;
    let ax = axes_of("all", &axis.into(), a.rank())?;
    a.cast(DType::Bool)?.reduce_all(as_isize(&ax), keepdims)
}
/// `numpy.count_nonzero(a, axis=None, keepdims=False)` (int64).
fn count_nonzero_axes(a: impl ArrayLike, axis: impl Into<Axes>, keepdims: bool) -> Result<Tensor> {
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
fn nansum_axes(a: impl ArrayLike, axis: impl Into<Axes>, keepdims: bool) -> Result<Tensor> {
    sum_axes(nan_to(&arr(a)?, 0.0)?, axis, keepdims)
}
/// `numpy.nanprod`: NaNs count as one.
fn nanprod_axes(a: impl ArrayLike, axis: impl Into<Axes>, keepdims: bool) -> Result<Tensor> {
    prod_axes(nan_to(&arr(a)?, 1.0)?, axis, keepdims)
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
fn nanmean_axes(a: impl ArrayLike, axis: impl Into<Axes>, keepdims: bool) -> Result<Tensor> {
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
fn nanvar_axes(
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
    let m = nanmean_axes(&a, ax.iter().map(|x| *x as isize).collect::<Vec<_>>(), true)?;
    let dev = nan_to(&a.sub(&m)?, 0.0)?
        .square()?
        .reduce_sum(as_isize(&ax), keepdims)?;
    let n = valid_count(&a, &ax, keepdims)?.sub(&a.scalar_like(ddof as f64)?)?;
    let n = n.maximum(&n.scalar_like(0.0)?)?;
    dev.div(&n)
}
/// `numpy.nanstd`.
fn nanstd_axes(
    a: impl ArrayLike,
    axis: impl Into<Axes>,
    ddof: usize,
    keepdims: bool,
) -> Result<Tensor> {
    nanvar_axes(a, axis, ddof, keepdims)?.sqrt()
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
            amax_axes(a, axis, keepdims)
        } else {
            amin_axes(a, axis, keepdims)
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
fn nanmax_axes(a: impl ArrayLike, axis: impl Into<Axes>, keepdims: bool) -> Result<Tensor> {
    nan_extreme("nanmax", a, axis, keepdims, true)
}
/// `numpy.nanmin`.
fn nanmin_axes(a: impl ArrayLike, axis: impl Into<Axes>, keepdims: bool) -> Result<Tensor> {
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
pub fn nanargmax(a: impl ArrayLike, axis: impl Into<Axes>) -> Result<Tensor> {
    let axis = one_axis("nanargmax", axis.into())?;
    nan_arg("nanargmax", a, axis, true)
}
/// `numpy.nanargmin`.
pub fn nanargmin(a: impl ArrayLike, axis: impl Into<Axes>) -> Result<Tensor> {
    let axis = one_axis("nanargmin", axis.into())?;
    nan_arg("nanargmin", a, axis, false)
}
/// `numpy.nancumsum`: running sums with NaNs as zero.
pub fn nancumsum(a: impl ArrayLike, axis: impl Into<Axes>) -> Result<Tensor> {
    let axis = one_axis("nancumsum", axis.into())?;
    crate::math::cumsum(nan_to(&arr(a)?, 0.0)?, axis)
}
/// `numpy.nancumprod`: running products with NaNs as one.
pub fn nancumprod(a: impl ArrayLike, axis: impl Into<Axes>) -> Result<Tensor> {
    let axis = one_axis("nancumprod", axis.into())?;
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
            (crate::shape::moveaxis(&a, [ax as isize], [-1])?, ax)
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
fn quantile_axes(
    a: impl ArrayLike,
    q: impl ArrayLike,
    axis: impl Into<Axes>,
    keepdims: bool,
) -> Result<Tensor> {
    let axis = one_axis("quantile", axis.into())?;
    let (q, s) = q_list(q, 1.0)?;
    quantile_impl("quantile", a, &q, s, axis, keepdims, false)
}
/// `numpy.percentile(a, q, axis=None, keepdims=False)`: quantiles with `q` in percent.
fn percentile_axes(
    a: impl ArrayLike,
    q: impl ArrayLike,
    axis: impl Into<Axes>,
    keepdims: bool,
) -> Result<Tensor> {
    let axis = one_axis("percentile", axis.into())?;
    let (q, s) = q_list(q, 100.0)?;
    quantile_impl("percentile", a, &q, s, axis, keepdims, false)
}
/// `numpy.median(a, axis=None, keepdims=False)`.
fn median_axes(a: impl ArrayLike, axis: impl Into<Axes>, keepdims: bool) -> Result<Tensor> {
    let axis = one_axis("median", axis.into())?;
    quantile_impl("median", a, &[0.5], true, axis, keepdims, false)
}
/// `numpy.nanquantile`: quantiles of the non-NaN elements.
fn nanquantile_axes(
    a: impl ArrayLike,
    q: impl ArrayLike,
    axis: impl Into<Axes>,
    keepdims: bool,
) -> Result<Tensor> {
    let axis = one_axis("nanquantile", axis.into())?;
    let (q, s) = q_list(q, 1.0)?;
    quantile_impl("nanquantile", a, &q, s, axis, keepdims, true)
}
/// `numpy.nanpercentile`.
fn nanpercentile_axes(
    a: impl ArrayLike,
    q: impl ArrayLike,
    axis: impl Into<Axes>,
    keepdims: bool,
) -> Result<Tensor> {
    let axis = one_axis("nanpercentile", axis.into())?;
    let (q, s) = q_list(q, 100.0)?;
    quantile_impl("nanpercentile", a, &q, s, axis, keepdims, true)
}
/// `numpy.nanmedian`.
fn nanmedian_axes(a: impl ArrayLike, axis: impl Into<Axes>, keepdims: bool) -> Result<Tensor> {
    let axis = one_axis("nanmedian", axis.into())?;
    quantile_impl("nanmedian", a, &[0.5], true, axis, keepdims, true)
}

/// `numpy.cov(m, rowvar=True, ddof=None)`: the covariance matrix of the variables (rows, or
/// columns when `rowvar` is false), normalised by `N - ddof` (default `N - 1`).
fn cov_full(m: impl ArrayLike, rowvar: bool, ddof: Option<usize>) -> Result<Tensor> {
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
    let c = cov_full(x, rowvar, None)?;
    if c.rank() == 0 {
        return c.div(&c);
    }
    let d = crate::products::diagonal(&c)?.sqrt()?;
    let r = c.div(&d.reshape(&[-1, 1])?)?.div(&d.reshape(&[1, -1])?)?;
    r.clip_scalar(-1.0, 1.0)
}

/// Each reduction's short form with NumPy's defaults (every axis, no kept dimensions).
macro_rules! short_reductions {
    ($($(#[$m:meta])* $name:ident => $imp:ident),* $(,)?) => {$(
        $(#[$m])*
        pub fn $name(a: impl ArrayLike) -> Result<Tensor> {
            $imp(a, Axes::All, false)
        }
    )*};
}
short_reductions!(
    /// `numpy.sum(a)`: the sum of every element (bools and narrow integers accumulate in
    /// int64, narrow unsigned ones in uint64); `axis=`, `keepdims=`, `initial=`, `where=`
    /// through [`sum_with`].
    ///
    /// ```
    /// use ferroflow_numpy as np;
    /// ferroflow::init();
    /// let a = np::asarray([[1, 2], [3, 4]])?;
    /// assert_eq!(np::sum(&a)?.item::<i64>()?, 10);
    /// let rows = np::sum_with(&a, np::ReduceArgs::new().axis(1))?;
    /// assert_eq!(rows.to_vec::<i64>()?, [3, 7]);
    /// # Ok::<(), np::Error>(())
    /// ```
    sum => sum_axes,
    /// `numpy.prod(a)`; keywords through [`prod_with`].
    prod => prod_axes,
    /// `numpy.mean(a)`: integers average in the default float; keywords through
    /// [`mean_with`].
    mean => mean_axes,
    /// `numpy.amax(a)` (NaN propagates; empty input is an error); keywords through
    /// [`amax_with`].
    amax => amax_axes,
    /// `numpy.amin(a)`; keywords through [`amin_with`].
    amin => amin_axes,
    /// `numpy.max` (same as [`amax`]).
    max => max_axes,
    /// `numpy.min` (same as [`amin`]).
    min => min_axes,
    /// `numpy.any(a)`; keywords through [`any_with`].
    any => any_axes,
    /// `numpy.all(a)`; keywords through [`all_with`].
    all => all_axes,
);

/// Reductions whose keywords are `axis` and `keepdims` only: the short form with NumPy's
/// defaults and the `_with` form taking them from [`ReduceArgs`] (other keywords refused).
macro_rules! axis_reductions {
    ($($(#[$m:meta])* $name:ident / $with:ident => $imp:ident),* $(,)?) => {$(
        $(#[$m])*
        pub fn $name(a: impl ArrayLike) -> Result<Tensor> {
            $imp(a, Axes::All, false)
        }
        #[doc = concat!("[`", stringify!($name), "`] with `axis=` and `keepdims=` from `args`.")]
        pub fn $with(a: impl ArrayLike, args: ReduceArgs) -> Result<Tensor> {
            args.only_axis(stringify!($name), false)?;
            $imp(a, args.axis, args.keepdims)
        }
    )*};
}
axis_reductions!(
    /// `numpy.ptp(a)`: max - min.
    ptp / ptp_with => ptp_axes,
    /// `numpy.count_nonzero(a)` (int64).
    count_nonzero / count_nonzero_with => count_nonzero_axes,
    /// `numpy.nansum(a)`: the sum with NaNs as zero.
    nansum / nansum_with => nansum_axes,
    /// `numpy.nanprod(a)`: the product with NaNs as one.
    nanprod / nanprod_with => nanprod_axes,
    /// `numpy.nanmean(a)`: the mean of the non-NaN elements.
    nanmean / nanmean_with => nanmean_axes,
    /// `numpy.nanmax(a)`: the maximum ignoring NaNs.
    nanmax / nanmax_with => nanmax_axes,
    /// `numpy.nanmin(a)`: the minimum ignoring NaNs.
    nanmin / nanmin_with => nanmin_axes,
    /// `numpy.median(a)` (one axis or every axis).
    median / median_with => median_axes,
    /// `numpy.nanmedian(a)`: the median of the non-NaN elements.
    nanmedian / nanmedian_with => nanmedian_axes,
);

/// Variances and standard deviations: the short form (every axis, `ddof=0`) and the `_with`
/// form taking `axis`, `ddof` and `keepdims` from [`ReduceArgs`].
macro_rules! ddof_reductions {
    ($($(#[$m:meta])* $name:ident / $with:ident => $imp:ident),* $(,)?) => {$(
        $(#[$m])*
        pub fn $name(a: impl ArrayLike) -> Result<Tensor> {
            $imp(a, Axes::All, 0, false)
        }
        #[doc = concat!("[`", stringify!($name), "()`] with `axis=`, `ddof=` and `keepdims=` from `args`.")]
        pub fn $with(a: impl ArrayLike, args: ReduceArgs) -> Result<Tensor> {
            args.only_axis(stringify!($name), true)?;
            $imp(a, args.axis, args.ddof, args.keepdims)
        }
    )*};
}
ddof_reductions!(
    /// `numpy.var(a)`: the mean squared deviation (|x - mean|² for complex input), divided
    /// by `N - ddof`.
    ///
    /// ```
    /// use ferroflow_numpy as np;
    /// ferroflow::init();
    /// let a = np::asarray([1.0, 2.0, 3.0, 4.0])?;
    /// assert_eq!(np::var(&a)?.item::<f64>()?, 1.25);
    /// let sample = np::var_with(&a, np::ReduceArgs::new().ddof(1))?;
    /// assert!((sample.item::<f64>()? - 5.0 / 3.0).abs() < 1e-15);
    /// # Ok::<(), np::Error>(())
    /// ```
    var / var_with => var_axes,
    /// `numpy.std(a)`: `√var`.
    std / std_with => std_axes,
    /// `numpy.nanvar(a)`: the variance of the non-NaN elements.
    nanvar / nanvar_with => nanvar_axes,
    /// `numpy.nanstd(a)`: `√nanvar`.
    nanstd / nanstd_with => nanstd_axes,
);

/// Quantiles: the short form (`q` over every element) and the `_with` form taking `axis`
/// (one) and `keepdims` from [`ReduceArgs`].
macro_rules! quantile_reductions {
    ($($(#[$m:meta])* $name:ident / $with:ident => $imp:ident),* $(,)?) => {$(
        $(#[$m])*
        pub fn $name(a: impl ArrayLike, q: impl ArrayLike) -> Result<Tensor> {
            $imp(a, q, Axes::All, false)
        }
        #[doc = concat!("[`", stringify!($name), "`] with `axis=` and `keepdims=` from `args`.")]
        pub fn $with(a: impl ArrayLike, q: impl ArrayLike, args: ReduceArgs) -> Result<Tensor> {
            args.only_axis(stringify!($name), false)?;
            $imp(a, q, args.axis, args.keepdims)
        }
    )*};
}
quantile_reductions!(
    /// `numpy.quantile(a, q)` (linear interpolation; `q` a scalar or a 1-D list, which
    /// becomes the first axis of the result).
    quantile / quantile_with => quantile_axes,
    /// `numpy.percentile(a, q)`: quantiles with `q` in percent.
    percentile / percentile_with => percentile_axes,
    /// `numpy.nanquantile(a, q)`: quantiles of the non-NaN elements.
    nanquantile / nanquantile_with => nanquantile_axes,
    /// `numpy.nanpercentile(a, q)`.
    nanpercentile / nanpercentile_with => nanpercentile_axes,
);

/// `numpy.average(a)`: the mean of every element; `axis` and `weights` through
/// [`average_with`].
pub fn average(a: impl ArrayLike) -> Result<Tensor> {
    average_full(a, Axes::All, None)
}
/// `numpy.average(a, axis, weights)`: the (weighted) mean; 1-D weights apply along the one
/// `axis`, otherwise they have `a`'s shape.
pub fn average_with(
    a: impl ArrayLike,
    axis: impl Into<Axes>,
    weights: Option<&Tensor>,
) -> Result<Tensor> {
    average_full(a, axis, weights)
}

/// `numpy.cov(m)`: the covariance matrix of the variables in the rows, normalised by
/// `N - 1`; `rowvar` and `ddof` through [`cov_with`].
pub fn cov(m: impl ArrayLike) -> Result<Tensor> {
    cov_full(m, true, None)
}
/// `numpy.cov(m, rowvar, ddof)`: the variables in the columns when `rowvar` is false, the
/// divisor `N - ddof` (default `N - 1`).
pub fn cov_with(m: impl ArrayLike, rowvar: bool, ddof: Option<usize>) -> Result<Tensor> {
    cov_full(m, rowvar, ddof)
}
