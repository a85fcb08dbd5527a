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

use ferroflow_tensor::{DType, Error, HostData, Result, Tensor};

use crate::array::{arr, promote2, ArrayLike};
use crate::util::{i64_tensor, norm_axis};

fn lanes(op: &'static str, a: impl ArrayLike, axis: Option<isize>) -> Result<(Tensor, isize)> {
    let a = arr(a)?;
    Ok(match axis {
        None => (a.reshape(&[-1])?, 0),
        Some(ax) => {
            let ax = norm_axis(op, ax, a.rank())?;
            (a, ax as isize)
        }
    })
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
pub fn sort(a: impl ArrayLike, axis: Option<isize>) -> Result<Tensor> {
    let (a, ax) = lanes("sort", a, axis)?;
    if a.rank() == 0 {
        return Ok(a);
    }
    let s = sortable(&a)?.sort(ax, false)?;
    s.cast(a.dtype())
}
/// `numpy.argsort(a, axis=-1)`: the (stable) sorting permutation, int64.
pub fn argsort(a: impl ArrayLike, axis: Option<isize>) -> Result<Tensor> {
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

fn total(a: f64, b: f64) -> Ordering {
    match a.partial_cmp(&b) {
        Some(o) => o,
        None => a.is_nan().cmp(&b.is_nan()),
    }
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
    let (av, vv) = (a.to_f64_vec()?, v.to_f64_vec()?);
    let out: Vec<i64> = vv
        .iter()
        .map(|x| {
            av.partition_point(|y| match side {
                Side::Left => total(*y, *x) == Ordering::Less,
                Side::Right => total(*y, *x) != Ordering::Greater,
            }) as i64
        })
        .collect();
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
    let vals = a.to_f64_vec()?;
    let mut first: Vec<i64> = Vec::new();
    let mut counts: Vec<i64> = Vec::new();
    let mut inverse = vec![0i64; vals.len()];
    let mut prev: Option<f64> = None;
    for &i in &order {
        let x = vals[i as usize];
        // NumPy (>= 1.21) keeps one NaN; equal values are adjacent after a stable sort
        let same = prev.is_some_and(|p| p == x || (p.is_nan() && x.is_nan()));
        if !same {
            first.push(i);
            counts.push(0);
        }
        let k = counts.len() - 1;
        counts[k] += 1;
        inverse[i as usize] = k as i64;
        prev = Some(x);
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
