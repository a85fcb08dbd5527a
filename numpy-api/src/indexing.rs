//! NumPy indexing: integers, slices with steps, `...`, `newaxis`, boolean masks and integer
//! arrays (advanced indexing, with NumPy's rule for where the broadcast index dimensions go),
//! written with the [`idx!`](crate::idx) macro and read with [`getitem`].
//!
//! | NumPy | ferroflow |
//! |---|---|
//! | `a[1, 2:5]` | `getitem(&a, idx![1, 2..5])` |
//! | `a[::-1]` | `getitem(&a, idx![step(.., -1)])` |
//! | `a[..., None]` | `getitem(&a, idx![ELLIPSIS, NEWAXIS])` |
//! | `a[a > 0]` | `getitem(&a, idx![greater(&a, 0)?])` |
//! | `a[[0, 2], :]` | `getitem(&a, idx![asarray([0i64, 2])?, ..])` |
//!
//! ```
//! use ferroflow_numpy::{self as np, idx, step, ELLIPSIS, NEWAXIS};
//! ferroflow::init();
//! let a = np::reshape(np::arange(0, 12, 1, None)?, &[3, 4])?;
//! assert_eq!(np::getitem(&a, idx![1, 1..3])?.to_vec::<i64>()?, vec![5, 6]);
//! assert_eq!(np::getitem(&a, idx![.., step(.., -2)])?.to_vec::<i64>()?[..2], [3, 1]);
//! assert_eq!(np::getitem(&a, idx![ELLIPSIS, NEWAXIS])?.shape(), &[3, 4, 1]);
//! let big = np::getitem(&a, idx![np::greater(&a, 9)?])?;
//! assert_eq!(big.to_vec::<i64>()?, vec![10, 11]);
//! let rows = np::getitem(&a, idx![np::asarray([2i64, 0])?, 0])?;
//! assert_eq!(rows.to_vec::<i64>()?, vec![8, 0]);
//! # Ok::<(), np::Error>(())
//! ```

use std::ops::{Range, RangeFrom, RangeFull, RangeInclusive, RangeTo, RangeToInclusive};

use ferroflow_tensor::{DType, Error, Result, SliceSpec, Tensor};

use crate::util::{broadcast_shape, host_i64, i64_tensor};

/// One entry of an index expression.
#[derive(Debug, Clone)]
pub enum Index {
    /// An integer (removes the axis); negative counts from the end.
    Int(isize),
    /// `start:stop:step`.
    Slice {
        /// First position (None: from the edge).
        start: Option<isize>,
        /// End (exclusive; None: to the edge).
        stop: Option<isize>,
        /// Step (non-zero).
        step: isize,
    },
    /// `...`: as many full slices as needed.
    Ellipsis,
    /// `numpy.newaxis` / `None`: a new axis of size 1.
    NewAxis,
    /// An integer array (advanced indexing) or a boolean mask.
    Array(Tensor),
}

/// `...` in an [`idx!`](crate::idx) expression.
pub const ELLIPSIS: Index = Index::Ellipsis;
/// `numpy.newaxis` in an [`idx!`](crate::idx) expression.
pub const NEWAXIS: Index = Index::NewAxis;

/// A slice with a step: `step(1..7, 2)` is NumPy's `1:7:2`, `step(.., -1)` is `::-1`.
pub fn step(range: impl Into<Index>, step: isize) -> Index {
    match range.into() {
        Index::Slice { start, stop, .. } => Index::Slice { start, stop, step },
        Index::Int(i) => Index::Slice {
            start: Some(i),
            stop: None,
            step,
        },
        other => other,
    }
}

macro_rules! index_from_int {
    ($($t:ty),*) => {$(
        impl From<$t> for Index {
            fn from(i: $t) -> Index { Index::Int(i as isize) }
        }
        impl From<Range<$t>> for Index {
            fn from(r: Range<$t>) -> Index {
                Index::Slice { start: Some(r.start as isize), stop: Some(r.end as isize), step: 1 }
            }
        }
        impl From<RangeInclusive<$t>> for Index {
            fn from(r: RangeInclusive<$t>) -> Index {
                let end = *r.end() as isize;
                Index::Slice { start: Some(*r.start() as isize), stop: if end == -1 { None } else { Some(end + 1) }, step: 1 }
            }
        }
        impl From<RangeFrom<$t>> for Index {
            fn from(r: RangeFrom<$t>) -> Index {
                Index::Slice { start: Some(r.start as isize), stop: None, step: 1 }
            }
        }
        impl From<RangeTo<$t>> for Index {
            fn from(r: RangeTo<$t>) -> Index {
                Index::Slice { start: None, stop: Some(r.end as isize), step: 1 }
            }
        }
        impl From<RangeToInclusive<$t>> for Index {
            fn from(r: RangeToInclusive<$t>) -> Index {
                let end = r.end as isize;
                Index::Slice { start: None, stop: if end == -1 { None } else { Some(end + 1) }, step: 1 }
            }
        }
    )*};
}
index_from_int!(i32, i64, isize, usize);

impl From<RangeFull> for Index {
    fn from(_: RangeFull) -> Index {
        Index::Slice {
            start: None,
            stop: None,
            step: 1,
        }
    }
}
impl From<Tensor> for Index {
    fn from(t: Tensor) -> Index {
        Index::Array(t)
    }
}
impl From<&Tensor> for Index {
    fn from(t: &Tensor) -> Index {
        Index::Array(t.clone())
    }
}

/// Builds an index expression: `idx![0, 1..3, .., step(.., -1), ELLIPSIS, NEWAXIS, mask]`.
#[macro_export]
macro_rules! idx {
    ($($e:expr),* $(,)?) => {
        &[$($crate::Index::from($e)),*][..]
    };
}

/// `a[index]`: basic indexing gives views; integer arrays and masks gather (a copy), with the
/// broadcast index shape placed where NumPy places it (at the first advanced index when they
/// are adjacent, else first).
pub fn getitem(a: &Tensor, index: &[Index]) -> Result<Tensor> {
    // masks become one integer array per masked axis; with arrays present, integers are
    // advanced indices too (NumPy's rule)
    let has_array = index.iter().any(|i| matches!(i, Index::Array(_)));
    let mut items: Vec<Index> = Vec::new();
    for it in index {
        match it {
            Index::Array(t) if t.dtype() == DType::Bool => {
                for p in crate::sorting::nonzero(t)? {
                    items.push(Index::Array(p));
                }
                if t.rank() == 0 {
                    return Err(Error::invalid(
                        "getitem",
                        "0-d boolean indices are not supported",
                    ));
                }
            }
            Index::Int(i) if has_array => {
                items.push(Index::Array(i64_tensor(vec![*i as i64], &[], a)?))
            }
            other => items.push(other.clone()),
        }
    }
    // rank consumed by each entry (masks consumed their rank via nonzero's arrays)
    let consumed: usize = items
        .iter()
        .map(|i| match i {
            Index::NewAxis | Index::Ellipsis => 0,
            _ => 1,
        })
        .sum();
    let ellipses = items
        .iter()
        .filter(|i| matches!(i, Index::Ellipsis))
        .count();
    if ellipses > 1 {
        return Err(Error::invalid(
            "getitem",
            "an index can only have a single ellipsis ('...')",
        ));
    }
    if consumed > a.rank() {
        return Err(Error::invalid(
            "getitem",
            format!("IndexError: too many indices for array: array is {}-dimensional, but {consumed} were indexed", a.rank()),
        ));
    }
    let fill = a.rank() - consumed;
    let mut expanded: Vec<Index> = Vec::new();
    let mut seen_ellipsis = false;
    for it in items {
        if matches!(it, Index::Ellipsis) {
            seen_ellipsis = true;
            expanded.extend(std::iter::repeat_n(Index::from(..), fill));
        } else {
            expanded.push(it);
        }
    }
    if !seen_ellipsis {
        expanded.extend(std::iter::repeat_n(Index::from(..), fill));
    }
    // basic part: slices, ints, new axes; arrays keep their axis whole for now
    let mut specs = Vec::new();
    let mut arrays: Vec<(usize, Tensor)> = Vec::new(); // (axis of the basic result, index)
    let mut out_axis = 0usize;
    let mut in_axis = 0usize;
    for it in &expanded {
        match it {
            Index::Int(i) => {
                let n = a.shape()[in_axis] as isize;
                if *i < -n || *i >= n {
                    return Err(Error::invalid("getitem", format!("IndexError: index {i} is out of bounds for axis {in_axis} with size {n}")));
                }
                specs.push(SliceSpec::Index(*i));
                in_axis += 1;
            }
            Index::Slice { start, stop, step } => {
                if *step == 0 {
                    return Err(Error::invalid(
                        "getitem",
                        "ValueError: slice step cannot be zero",
                    ));
                }
                specs.push(SliceSpec::Range {
                    start: *start,
                    stop: *stop,
                    step: *step,
                });
                in_axis += 1;
                out_axis += 1;
            }
            Index::NewAxis => {
                specs.push(SliceSpec::NewAxis);
                out_axis += 1;
            }
            Index::Array(t) => {
                specs.push(SliceSpec::ALL);
                arrays.push((out_axis, t.clone()));
                in_axis += 1;
                out_axis += 1;
            }
            Index::Ellipsis => {}
        }
    }
    let basic = a.strided_slice(&specs)?;
    if arrays.is_empty() {
        return Ok(basic);
    }
    // advanced part: flat positions over the indexed axes, one gather
    let shapes: Vec<&[usize]> = arrays.iter().map(|(_, t)| t.shape()).collect();
    let bshape = broadcast_shape("getitem", &shapes)?;
    let axes: Vec<usize> = arrays.iter().map(|(ax, _)| *ax).collect();
    let adjacent = axes.windows(2).all(|w| w[1] == w[0] + 1);
    let mut flat: Option<Vec<i64>> = None;
    for (ax, t) in &arrays {
        let n = basic.shape()[*ax] as i64;
        let v = host_i64("getitem", &t.broadcast_to(&bshape)?.contiguous()?)?;
        let mut checked = Vec::with_capacity(v.len());
        for x in v {
            let j = if x < 0 { x + n } else { x };
            if j < 0 || j >= n {
                return Err(Error::invalid(
                    "getitem",
                    format!("IndexError: index {x} is out of bounds for axis {ax} with size {n}"),
                ));
            }
            checked.push(j);
        }
        flat = Some(match flat {
            None => checked,
            Some(f) => f.iter().zip(&checked).map(|(p, j)| p * n + j).collect(),
        });
    }
    let flat = flat.unwrap_or_default();
    let rest: Vec<usize> = (0..basic.rank()).filter(|d| !axes.contains(d)).collect();
    let mut perm = axes.clone();
    perm.extend(&rest);
    let moved = basic.transpose(&perm)?;
    let k: usize = axes.iter().map(|d| basic.shape()[*d]).product();
    let mut merged: Vec<usize> = vec![k];
    merged.extend(rest.iter().map(|d| basic.shape()[*d]));
    let merged_t = moved.contiguous()?.reshape_to(&merged)?;
    let idx = i64_tensor(flat, &bshape, a)?;
    let g = merged_t.gather(&idx, 0)?;
    if !adjacent || axes[0] == 0 {
        return Ok(g);
    }
    // adjacent advanced indices: their dims go where the first of them was
    let nb = bshape.len();
    let first = axes[0];
    let mut order: Vec<usize> = (nb..nb + first).collect();
    order.extend(0..nb);
    order.extend(nb + first..g.rank());
    g.transpose(&order)
}
