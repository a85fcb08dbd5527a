//! Sorting and searching: `sort`, `argsort`, `searchsorted`, `unique`, `nonzero`,
//! `argwhere`, `flatnonzero`. Sorts are stable with NaN last, as NumPy's; positions are
//! int64.
//!
//! ```
//! use ferroflow_numpy as np;
//! ferroflow::init();
//! let a = np::asarray([3i64, 1, 2, 1])?;
//! assert_eq!(np::sort(&a, Some(-1))?.to_vec::<i64>()?, vec![1, 1, 2, 3]);
//! assert_eq!(np::argsort(&a, Some(-1))?.to_vec::<i64>()?, vec![1, 3, 2, 0]);
//! assert_eq!(np::unique(&a)?.to_vec::<i64>()?, vec![1, 2, 3]);
//! let s = np::asarray([1.0, 2.0, 3.0])?;
//! assert_eq!(np::searchsorted(&s, [2.0, 2.5], np::Side::Left)?.to_vec::<i64>()?, vec![1, 2]);
//! # Ok::<(), np::Error>(())
//! ```

use std::cmp::Ordering;

use ferroflow_tensor::{Axes, DType, Element, Error, HostData, Result, Tensor};

use crate::array::{arr, promote2, ArrayLike};
use crate::util::i64_tensor;
use crate::util::one_axis;

fn lanes(op: &'static str, a: impl ArrayLike, axis: Option<isize>) -> Result<(Tensor, isize)> {
    let (a, ax) = crate::util::axis_or_flat(op, arr(a)?, axis)?;
    Ok((a, ax as isize))
}

/// Booleans sort as bytes.
fn sortable(a: &Tensor) -> Result<Tensor> {
    if a.dtype() == DType::Bool {
        a.cast(DType::U8)
    } else {
        Ok(a.clone())
    }
}

/// `numpy.sort(a, axis=-1)`: sorted along `axis` (`None`: the flattened array), NaN last.
pub fn sort(a: impl ArrayLike, axis: impl Into<Axes>) -> Result<Tensor> {
    let axis = one_axis("sort", axis.into())?;
    let (a, ax) = lanes("sort", a, axis)?;
    if a.rank() == 0 {
        return Ok(a);
    }
    let s = sortable(&a)?.sort(ax, false)?;
    s.cast(a.dtype())
}
/// `numpy.argsort(a, axis=-1)`: the (stable) sorting permutation, int64.
pub fn argsort(a: impl ArrayLike, axis: impl Into<Axes>) -> Result<Tensor> {
    let axis = one_axis("argsort", axis.into())?;
    let (a, ax) = lanes("argsort", a, axis)?;
    sortable(&a)?.argsort(ax, false)?.cast(DType::I64)
}

/// Which end of a run of equal values [`searchsorted`] returns.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Side {
    /// The first position where the value could go (`a[i-1] < v <= a[i]`).
    Left,
    /// The last (`a[i-1] <= v < a[i]`).
    Right,
}

/// NumPy's sort order on typed values (exact for int64, unlike a trip through f64): numbers
/// ascending, NaN last, all NaNs equal.
fn numpy_order<T: Element + PartialOrd>(a: &T, b: &T) -> Ordering {
    match a.partial_cmp(b) {
        Some(o) => o,
        #[allow(clippy::eq_op)] // x != x is the NaN test for any float element type
        None => (a != a).cmp(&(b != b)),
    }
}

fn search_typed<T: Element + PartialOrd>(a: &[T], v: &[T], side: Side) -> Vec<i64> {
    v.iter()
        .map(|x| {
            a.partition_point(|y| match side {
                Side::Left => numpy_order(y, x) == Ordering::Less,
                Side::Right => numpy_order(y, x) != Ordering::Greater,
            }) as i64
        })
        .collect()
}

/// `numpy.searchsorted(a, v, side='left')`: insertion positions of `v` in the sorted 1-D `a`
/// (NaN sorts last), int64, with `v`'s shape.
pub fn searchsorted(a: impl ArrayLike, v: impl ArrayLike, side: Side) -> Result<Tensor> {
    let (a, v, _) = promote2(a, v)?;
    if a.rank() != 1 {
        return Err(Error::invalid(
            "searchsorted",
            "object too deep for desired array (a must be 1-D)",
        ));
    }
    let out = match (a.to_host()?, v.to_host()?) {
        (HostData::F16(x), HostData::F16(y)) => search_typed(&x, &y, side),
        (HostData::BF16(x), HostData::BF16(y)) => search_typed(&x, &y, side),
        (HostData::F32(x), HostData::F32(y)) => search_typed(&x, &y, side),
        (HostData::F64(x), HostData::F64(y)) => search_typed(&x, &y, side),
        (HostData::I8(x), HostData::I8(y)) => search_typed(&x, &y, side),
        (HostData::I32(x), HostData::I32(y)) => search_typed(&x, &y, side),
        (HostData::I64(x), HostData::I64(y)) => search_typed(&x, &y, side),
        (HostData::U8(x), HostData::U8(y)) => search_typed(&x, &y, side),
        (HostData::Bool(x), HostData::Bool(y)) => search_typed(&x, &y, side),
        _ => {
            return Err(Error::invalid(
                "searchsorted",
                "arguments did not promote to one dtype",
            ))
        }
    };
    i64_tensor(out, v.shape(), &v)
}

/// `numpy.unique(ar)`: the sorted distinct values of the flattened array.
pub fn unique(ar: impl ArrayLike) -> Result<Tensor> {
    Ok(unique_all(ar)?.values)
}

/// Everything `numpy.unique(ar, return_index, return_inverse, return_counts)` returns.
#[derive(Debug, Clone)]
pub struct Unique {
    /// The sorted distinct values.
    pub values: Tensor,
    /// Position of each value's first occurrence in the flattened input (int64).
    pub indices: Tensor,
    /// For each input element, the position of its value in `values` (int64).
    pub inverse: Tensor,
    /// How often each value occurs (int64).
    pub counts: Tensor,
}

/// `numpy.unique` with all its optional outputs.
pub fn unique_all(ar: impl ArrayLike) -> Result<Unique> {
    let a = arr(ar)?.reshape(&[-1])?;
    let order = sortable(&a)?
        .argsort(0, false)?
        .cast(DType::I64)?
        .to_vec::<i64>()?;
    // equal values are adjacent after the sort; NumPy (>= 1.21) keeps one NaN
    let host = a.to_host()?;
    let starts: Vec<bool> = ferroflow_tensor::with_host_data!(&host, v => run_starts(v, &order));
    let mut first: Vec<i64> = Vec::new();
    let mut counts: Vec<i64> = Vec::new();
    let mut inverse = vec![0i64; order.len()];
    for (&i, &start) in order.iter().zip(&starts) {
        if start {
            first.push(i);
            counts.push(0);
        }
        let k = counts.len() - 1;
        counts[k] += 1;
        inverse[i as usize] = k as i64;
    }
    let n = first.len();
    let idx = i64_tensor(first, &[n], &a)?;
    Ok(Unique {
        values: a.gather(&idx, 0)?,
        indices: idx,
        inverse: i64_tensor(inverse, a.shape(), &a)?,
        counts: i64_tensor(counts, &[n], &a)?,
    })
}

/// For values visited in `order`, whether each begins a new run of equal values.
/// (NaNs are all one value, as NumPy's order has them.)
fn run_starts<T: Element>(v: &[T], order: &[i64]) -> Vec<bool> {
    #[allow(clippy::eq_op)] // x != x is the NaN test for any element type
    let same = |x: &T, y: &T| x == y || (x != x && y != y);
    (0..order.len())
        .map(|k| k == 0 || !same(&v[order[k - 1] as usize], &v[order[k] as usize]))
        .collect()
}

fn true_positions(a: &Tensor) -> Result<Vec<usize>> {
    let b = a.cast(DType::Bool)?.to_host()?;
    Ok(match b {
        HostData::Bool(v) => v
            .iter()
            .enumerate()
            .filter(|(_, b)| **b)
            .map(|(i, _)| i)
            .collect(),
        _ => Vec::new(),
    })
}

/// `numpy.nonzero(a)`: one int64 index array per axis, of the non-zero elements in C order.
pub fn nonzero(a: impl ArrayLike) -> Result<Vec<Tensor>> {
    let a = arr(a)?;
    if a.rank() == 0 {
        return Err(Error::invalid("nonzero", "Calling nonzero on 0d arrays is not allowed. Use np.atleast_1d(scalar).nonzero() instead."));
    }
    let pos = true_positions(&a)?;
    let n = pos.len();
    let shape = a.shape().to_vec();
    (0..a.rank())
        .map(|d| {
            let stride: usize = shape[d + 1..].iter().product();
            let v: Vec<i64> = pos
                .iter()
                .map(|p| ((p / stride) % shape[d]) as i64)
                .collect();
            i64_tensor(v, &[n], &a)
        })
        .collect()
}
/// `numpy.argwhere(a)`: the indices of non-zero elements as an `(N, a.ndim)` int64 array.
pub fn argwhere(a: impl ArrayLike) -> Result<Tensor> {
    let a = arr(a)?;
    if a.rank() == 0 {
        let n = true_positions(&a)?.len();
        return i64_tensor(Vec::new(), &[n, 0], &a);
    }
    Tensor::stack(&nonzero(&a)?, 1)
}
/// `numpy.flatnonzero(a)`: positions of non-zero elements in the flattened array.
pub fn flatnonzero(a: impl ArrayLike) -> Result<Tensor> {
    let a = arr(a)?;
    let pos: Vec<i64> = true_positions(&a)?.into_iter().map(|p| p as i64).collect();
    let n = pos.len();
    i64_tensor(pos, &[n], &a)
}

/// `numpy.unique_values(x)` (NumPy 2): the sorted distinct values.
pub fn unique_values(x: impl ArrayLike) -> Result<Tensor> {
    unique(x)
}
/// `numpy.unique_counts(x)` (NumPy 2): `(values, counts)`.
pub fn unique_counts(x: impl ArrayLike) -> Result<(Tensor, Tensor)> {
    let u = unique_all(x)?;
    Ok((u.values, u.counts))
}
/// `numpy.unique_inverse(x)` (NumPy 2): `(values, inverse)`, the inverse in `x`'s shape.
pub fn unique_inverse(x: impl ArrayLike) -> Result<(Tensor, Tensor)> {
    let x = arr(x)?;
    let u = unique_all(&x)?;
    Ok((u.values, u.inverse.reshape_to(x.shape())?))
}

/// `numpy.digitize(x, bins, right=False)`: the bin index of each value for monotonic
/// `bins` (increasing or decreasing), int64.
pub fn digitize(x: impl ArrayLike, bins: impl ArrayLike, right: bool) -> Result<Tensor> {
    let (x, bins, _) = promote2(x, bins)?;
    if bins.rank() != 1 {
        return Err(Error::invalid(
            "digitize",
            "object too deep for desired array",
        ));
    }
    let b = bins.to_f64_vec()?;
    let increasing = b.windows(2).all(|w| w[0] <= w[1]);
    let decreasing = b.windows(2).all(|w| w[0] >= w[1]);
    if !increasing && !decreasing {
        return Err(Error::invalid(
            "digitize",
            "bins must be monotonically increasing or decreasing",
        ));
    }
    let side = if right { Side::Left } else { Side::Right };
    if increasing {
        return searchsorted(&bins, &x, side);
    }
    // NumPy: reverse the bins, search with the same side, count from the end
    let rev = crate::shape::flip(&bins, None)?;
    let pos = searchsorted(&rev, &x, side)?;
    let n = b.len() as i64;
    crate::math::subtract(n, &pos)
}

/// `numpy.bincount(x, weights=None, minlength=0)`: occurrences of each non-negative integer
/// (int64), or the sums of their weights (float64).
pub fn bincount(x: impl ArrayLike, weights: Option<&Tensor>, minlength: usize) -> Result<Tensor> {
    let x = arr(x)?;
    if x.rank() != 1 {
        return Err(Error::invalid(
            "bincount",
            "object too deep for desired array",
        ));
    }
    let v = crate::util::host_i64("bincount", &x)?;
    if v.iter().any(|i| *i < 0) {
        return Err(Error::invalid(
            "bincount",
            "'list' argument must have no negative elements",
        ));
    }
    let n = v
        .iter()
        .copied()
        .max()
        .map(|m| m as usize + 1)
        .unwrap_or(0)
        .max(minlength);
    if n > 1 << 32 {
        return Err(Error::invalid(
            "bincount",
            format!("Maximum allowed size exceeded ({n} bins)"),
        ));
    }
    match weights {
        None => {
            let mut c = vec![0i64; n];
            v.iter().for_each(|i| c[*i as usize] += 1);
            i64_tensor(c, &[n], &x)
        }
        Some(w) => {
            if w.shape() != x.shape() {
                return Err(Error::invalid(
                    "bincount",
                    "The weights and list don't have the same length.",
                ));
            }
            let mut c = vec![0f64; n];
            for (i, wv) in v.iter().zip(w.to_f64_vec()?) {
                c[*i as usize] += wv;
            }
            crate::creation::host_array(&c, &[n], crate::default_float())?.to_device(x.device())
        }
    }
}

/// `numpy.histogram(a, bins=10, range=None)`: counts in `bins` equal-width bins over
/// `range` (default: the data's min and max; the last bin includes its right edge), and the
/// `bins + 1` edges (float64).
pub fn histogram(
    a: impl ArrayLike,
    bins: usize,
    range: Option<(f64, f64)>,
) -> Result<(Tensor, Tensor)> {
    let a = arr(a)?;
    if bins == 0 {
        return Err(Error::invalid(
            "histogram",
            "`bins` must be positive, when an integer",
        ));
    }
    let v = a.to_f64_vec()?;
    let (mut lo, mut hi) = match range {
        Some(r) => r,
        None if v.is_empty() => (0.0, 1.0),
        None => v
            .iter()
            .fold((f64::INFINITY, f64::NEG_INFINITY), |(l, h), x| {
                (l.min(*x), h.max(*x))
            }),
    };
    if !(lo.is_finite() && hi.is_finite()) || lo > hi {
        return Err(Error::invalid(
            "histogram",
            format!("supplied range of [{lo}, {hi}] is not finite or not ordered"),
        ));
    }
    if lo == hi {
        lo -= 0.5;
        hi += 0.5;
    }
    // NumPy's edges are linspace(lo, hi, bins + 1)
    let edges = crate::creation::linspace_f64(lo, hi, bins + 1, true);
    let mut counts = vec![0i64; bins];
    for x in v {
        if x < lo || x > hi || x.is_nan() {
            continue;
        }
        // NumPy: the bin from the scaled position, corrected against the edges
        let mut b = ((x - lo) * (bins as f64 / (hi - lo))) as usize;
        b = b.min(bins - 1);
        if x < edges[b] {
            b = b.saturating_sub(1);
        } else if b + 1 < bins && x >= edges[b + 1] {
            b += 1;
        }
        counts[b] += 1;
    }
    let e = crate::creation::host_array(&edges, &[bins + 1], crate::default_float())?
        .to_device(a.device())?;
    Ok((i64_tensor(counts, &[bins], &a)?, e))
}

/// `numpy.interp(x, xp, fp, left=None, right=None)`: piecewise-linear interpolation of the
/// points `(xp, fp)` (`xp` increasing) at `x`, float64; outside, `left`/`right` (default
/// the end values).
pub fn interp(
    x: impl ArrayLike,
    xp: impl ArrayLike,
    fp: impl ArrayLike,
    left: Option<f64>,
    right: Option<f64>,
) -> Result<Tensor> {
    let (x, xp, fp) = (arr(x)?, arr(xp)?, arr(fp)?);
    if xp.rank() != 1 || fp.rank() != 1 || xp.shape() != fp.shape() {
        return Err(Error::invalid(
            "interp",
            "fp and xp are not of the same length.",
        ));
    }
    let (xs, ys) = (xp.to_f64_vec()?, fp.to_f64_vec()?);
    if xs.is_empty() {
        return Err(Error::invalid("interp", "array of sample points is empty"));
    }
    let n = xs.len();
    let (l, r) = (left.unwrap_or(ys[0]), right.unwrap_or(ys[n - 1]));
    let out: Vec<f64> = x
        .to_f64_vec()?
        .into_iter()
        .map(|v| {
            if v.is_nan() {
                return v;
            }
            if v < xs[0] {
                return l;
            }
            if v > xs[n - 1] {
                return r;
            }
            let j = xs.partition_point(|p| *p <= v);
            if j >= n {
                return ys[n - 1];
            }
            let i = j.saturating_sub(1);
            if xs[j] == xs[i] {
                return ys[i];
            }
            let t = (v - xs[i]) / (xs[j] - xs[i]);
            ys[i] + t * (ys[j] - ys[i])
        })
        .collect();
    crate::creation::host_array(&out, x.shape(), crate::default_float())?.to_device(x.device())
}
