//! Shape manipulation: `reshape`, `ravel`, `transpose`, `swapaxes`, `moveaxis`,
//! `expand_dims`, `squeeze`, `concatenate`, `stack`, `hstack`/`vstack`/`dstack`, `split`,
//! `array_split`, `tile`, `repeat`, `broadcast_to`, `broadcast_arrays`, `flip`, `fliplr`,
//! `flipud`, `roll`, `rot90`, `pad`, `take`, `take_along_axis`, `where_`, `select`,
//! `compress`, `atleast_1d/2d/3d`. Views where NumPy gives views (reshape of dense data,
//! transposes, flips, broadcasts); everything is made of differentiable tensor ops.
//!
//! ```
//! use ferroflow_numpy as np;
//! ferroflow::init();
//! let a = np::arange(0, 6, 1, None)?;
//! let m = np::reshape(&a, &[2, 3])?;
//! assert_eq!(np::transpose(&m, None)?.shape(), &[3, 2]);
//! let parts = np::split(&a, 3, 0)?;
//! assert_eq!(parts[2].to_vec::<i64>()?, vec![4, 5]);
//! assert_eq!(np::roll(&a, 2, None)?.to_vec::<i64>()?, vec![4, 5, 0, 1, 2, 3]);
//! # Ok::<(), np::Error>(())
//! ```

use ferroflow_tensor::{Axes, DType, Error, Result, SliceSpec, Tensor};

use crate::array::{arr, cast_all, promote_all, ArrayLike, Value};
use crate::util::{
    axis_or_flat, broadcast_shape, host_i64, i64_tensor, norm_axes, norm_axis, one_axis, py_shape,
    required_axis,
};

/// `numpy.reshape(a, newshape)` (C order; one entry may be -1).
pub fn reshape(a: impl ArrayLike, newshape: &[isize]) -> Result<Tensor> {
    let a = arr(a)?;
    let known: usize = newshape
        .iter()
        .filter(|d| **d >= 0)
        .map(|d| *d as usize)
        .product();
    let unknown = newshape.iter().filter(|d| **d < 0).count();
    let fits = match unknown {
        0 => known == a.num_elements(),
        1 => known != 0 && a.num_elements() % known == 0,
        _ => false,
    };
    if !fits || newshape.iter().any(|d| *d < -1) {
        return Err(Error::invalid(
            "reshape",
            format!(
                "cannot reshape array of size {} into shape {:?}",
                a.num_elements(),
                newshape
            ),
        ));
    }
    a.reshape(newshape)
}

/// `numpy.ravel(a)`: the elements as 1-D, in C order.
pub fn ravel(a: impl ArrayLike) -> Result<Tensor> {
    arr(a)?.reshape(&[-1])
}

/// `numpy.transpose(a, axes=None)`: reverses the axes, or permutes them as `axes` says.
pub fn transpose(a: impl ArrayLike, axes: impl Into<Axes>) -> Result<Tensor> {
    let a = arr(a)?;
    let perm: Vec<usize> = match axes.into() {
        Axes::All => (0..a.rank()).rev().collect(),
        Axes::List(ax) => {
            if ax.len() != a.rank() {
                return Err(Error::invalid("transpose", "axes don't match array"));
            }
            norm_axes("transpose", &ax, a.rank())?
        }
    };
    a.transpose(&perm)
}

/// `numpy.swapaxes(a, axis1, axis2)`.
pub fn swapaxes(
    a: impl ArrayLike,
    axis1: impl Into<Axes>,
    axis2: impl Into<Axes>,
) -> Result<Tensor> {
    let axis1 = required_axis("swapaxes", axis1.into())?;
    let axis2 = required_axis("swapaxes", axis2.into())?;
    let a = arr(a)?;
    let (i, j) = (
        norm_axis("swapaxes", axis1, a.rank())?,
        norm_axis("swapaxes", axis2, a.rank())?,
    );
    let mut perm: Vec<usize> = (0..a.rank()).collect();
    perm.swap(i, j);
    a.transpose(&perm)
}

/// `numpy.moveaxis(a, source, destination)`: the `source` axes moved to `destination`,
/// the others keep their order.
pub fn moveaxis(
    a: impl ArrayLike,
    source: impl Into<Axes>,
    destination: impl Into<Axes>,
) -> Result<Tensor> {
    let a = arr(a)?;
    let listed = |axes: Axes, what: &str| match axes {
        Axes::List(v) => Ok(v),
        Axes::All => Err(Error::invalid(
            "moveaxis",
            format!("`{what}` must name axes, got None"),
        )),
    };
    let (source, destination) = (
        listed(source.into(), "source")?,
        listed(destination.into(), "destination")?,
    );
    if source.len() != destination.len() {
        return Err(Error::invalid(
            "moveaxis",
            "`source` and `destination` arguments must have the same number of elements",
        ));
    }
    let src = norm_axes("moveaxis", &source, a.rank())?;
    let dst = norm_axes("moveaxis", &destination, a.rank())?;
    let mut order: Vec<usize> = (0..a.rank()).filter(|i| !src.contains(i)).collect();
    let mut pairs: Vec<(usize, usize)> = dst.into_iter().zip(src).collect();
    pairs.sort();
    for (d, s) in pairs {
        order.insert(d, s);
    }
    a.transpose(&order)
}

/// `numpy.expand_dims(a, axis)`: a new size-1 axis at `axis` (of the result).
pub fn expand_dims(a: impl ArrayLike, axis: impl Into<Axes>) -> Result<Tensor> {
    let axis = required_axis("expand_dims", axis.into())?;
    let a = arr(a)?;
    let ax = norm_axis("expand_dims", axis, a.rank() + 1)?;
    a.expand_dims(ax as isize)
}

/// `numpy.squeeze(a, axis=None)`: removes size-1 axes (all, or the one named).
pub fn squeeze(a: impl ArrayLike, axis: impl Into<Axes>) -> Result<Tensor> {
    let axis = one_axis("squeeze", axis.into())?;
    let a = arr(a)?;
    match axis {
        None => {
            let shape: Vec<isize> = a
                .shape()
                .iter()
                .filter(|d| **d != 1)
                .map(|d| *d as isize)
                .collect();
            a.reshape(&shape)
        }
        Some(ax) => {
            let i = norm_axis("squeeze", ax, a.rank())?;
            if a.shape()[i] != 1 {
                return Err(Error::invalid(
                    "squeeze",
                    "cannot select an axis to squeeze out which has size not equal to one",
                ));
            }
            a.squeeze(&[i as isize])
        }
    }
}

fn values<A: ArrayLike>(arrays: &[A]) -> Result<Vec<Value>> {
    arrays.iter().map(|a| a.to_value()).collect()
}

/// Arrays promoted to their common dtype.
fn promoted<A: ArrayLike>(op: &'static str, arrays: &[A]) -> Result<Vec<Tensor>> {
    if arrays.is_empty() {
        return Err(Error::invalid(op, "need at least one array to concatenate"));
    }
    let vals = values(arrays)?;
    let (ts, _) = promote_all(&vals)?;
    Ok(ts)
}

/// `numpy.concatenate(arrays, axis=0)`: `None` flattens them first. Dtypes promote.
pub fn concatenate<A: ArrayLike>(arrays: &[A], axis: impl Into<Axes>) -> Result<Tensor> {
    let axis = one_axis("concatenate", axis.into())?;
    let ts = promoted("concatenate", arrays)?;
    let (ts, axis) = match axis {
        None => (
            ts.iter().map(|t| t.reshape(&[-1])).collect::<Result<_>>()?,
            0,
        ),
        Some(ax) => {
            let r = ts[0].rank();
            if r == 0 {
                return Err(Error::invalid(
                    "concatenate",
                    "zero-dimensional arrays cannot be concatenated",
                ));
            }
            for (i, t) in ts.iter().enumerate() {
                if t.rank() != r {
                    return Err(Error::invalid("concatenate", format!("all the input array dimensions except for the concatenation axis must match exactly, but array at index 0 has {r} dimension(s) and the array at index {i} has {} dimension(s)", t.rank())));
                }
            }
            let ax = norm_axis("concatenate", ax, r)?;
            for (i, t) in ts.iter().enumerate() {
                for d in 0..r {
                    if d != ax && t.shape()[d] != ts[0].shape()[d] {
                        return Err(Error::invalid("concatenate", format!("all the input array dimensions except for the concatenation axis must match exactly, but along dimension {d}, the array at index 0 has size {} and the array at index {i} has size {}", ts[0].shape()[d], t.shape()[d])));
                    }
                }
            }
            (ts, ax as isize)
        }
    };
    Tensor::concat(&ts, axis)
}

/// `numpy.stack(arrays, axis=0)`: joins same-shaped arrays along a new axis.
pub fn stack<A: ArrayLike>(arrays: &[A], axis: impl Into<Axes>) -> Result<Tensor> {
    let axis = required_axis("stack", axis.into())?;
    let ts = promoted("stack", arrays)?;
    if ts.iter().any(|t| t.shape() != ts[0].shape()) {
        return Err(Error::invalid(
            "stack",
            "all input arrays must have the same shape",
        ));
    }
    let ax = norm_axis("stack", axis, ts[0].rank() + 1)?;
    Tensor::stack(&ts, ax as isize)
}

/// `numpy.hstack`: concatenates along axis 1 (axis 0 for 1-D arrays).
pub fn hstack<A: ArrayLike>(arrays: &[A]) -> Result<Tensor> {
    let ts: Vec<Tensor> = promoted("hstack", arrays)?
        .into_iter()
        .map(atleast_1d)
        .collect::<Result<_>>()?;
    let axis = if ts[0].rank() == 1 { 0 } else { 1 };
    concatenate(&ts, Some(axis))
}
/// `numpy.vstack`: concatenates along axis 0 after making each array at least 2-D.
pub fn vstack<A: ArrayLike>(arrays: &[A]) -> Result<Tensor> {
    let ts: Vec<Tensor> = promoted("vstack", arrays)?
        .into_iter()
        .map(atleast_2d)
        .collect::<Result<_>>()?;
    concatenate(&ts, Some(0))
}
/// `numpy.dstack`: concatenates along axis 2 after making each array at least 3-D.
pub fn dstack<A: ArrayLike>(arrays: &[A]) -> Result<Tensor> {
    let ts: Vec<Tensor> = promoted("dstack", arrays)?
        .into_iter()
        .map(atleast_3d)
        .collect::<Result<_>>()?;
    concatenate(&ts, Some(2))
}

/// How [`split`] divides an axis: into `n` equal parts, or at the given indices.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Sections {
    /// This many parts.
    Count(usize),
    /// Split before each of these indices.
    At(Vec<usize>),
}
impl From<usize> for Sections {
    fn from(n: usize) -> Sections {
        Sections::Count(n)
    }
}
impl From<i32> for Sections {
    fn from(n: i32) -> Sections {
        Sections::Count(n.max(0) as usize)
    }
}
impl From<&[usize]> for Sections {
    fn from(v: &[usize]) -> Sections {
        Sections::At(v.to_vec())
    }
}
impl From<Vec<usize>> for Sections {
    fn from(v: Vec<usize>) -> Sections {
        Sections::At(v)
    }
}
impl<const N: usize> From<[usize; N]> for Sections {
    fn from(v: [usize; N]) -> Sections {
        Sections::At(v.to_vec())
    }
}

fn split_impl(
    op: &'static str,
    a: Tensor,
    sections: Sections,
    axis: isize,
    equal: bool,
) -> Result<Vec<Tensor>> {
    let ax = norm_axis(op, axis, a.rank())?;
    let n = a.shape()[ax];
    let bounds: Vec<usize> = match sections {
        Sections::Count(0) => {
            return Err(Error::invalid(op, "number sections must be larger than 0."))
        }
        Sections::Count(k) => {
            if equal && !n.is_multiple_of(k) {
                return Err(Error::invalid(
                    op,
                    "array split does not result in an equal division",
                ));
            }
            let (q, r) = (n / k, n % k);
            let mut b = vec![0];
            for i in 0..k {
                b.push(b[i] + q + usize::from(i < r));
            }
            b
        }
        Sections::At(idx) => {
            let mut b = vec![0];
            b.extend(idx.iter().map(|i| (*i).min(n)));
            b.push(n);
            b
        }
    };
    bounds
        .windows(2)
        .map(|w| {
            let (s, e) = (w[0], w[1].max(w[0]));
            let mut spec = vec![SliceSpec::ALL; a.rank()];
            spec[ax] = SliceSpec::range(s as isize, e as isize);
            a.strided_slice(&spec)
        })
        .collect()
}

/// `numpy.split(a, indices_or_sections, axis=0)`: equal parts (an error when they cannot be
/// equal) or pieces between the given indices.
pub fn split(
    a: impl ArrayLike,
    sections: impl Into<Sections>,
    axis: impl Into<Axes>,
) -> Result<Vec<Tensor>> {
    let axis = required_axis("split", axis.into())?;
    split_impl("split", arr(a)?, sections.into(), axis, true)
}
/// `numpy.array_split`: as [`split`], but `n` parts need not be equal (the first ones are one
/// longer).
pub fn array_split(
    a: impl ArrayLike,
    sections: impl Into<Sections>,
    axis: impl Into<Axes>,
) -> Result<Vec<Tensor>> {
    let axis = required_axis("array_split", axis.into())?;
    split_impl("array_split", arr(a)?, sections.into(), axis, false)
}

/// `numpy.tile(A, reps)`: `A` repeated `reps[i]` times along each axis (shorter `reps` or
/// arrays are padded with leading ones, as NumPy does).
pub fn tile(a: impl ArrayLike, reps: &[usize]) -> Result<Tensor> {
    let a = arr(a)?;
    let d = a.rank().max(reps.len());
    let mut shape = vec![1isize; d - a.rank()];
    shape.extend(a.shape().iter().map(|s| *s as isize));
    let a = a.reshape(&shape)?;
    let mut r = vec![1usize; d - reps.len()];
    r.extend_from_slice(reps);
    a.tile(&r)
}

/// `numpy.repeat(a, repeats, axis=None)`: each element (or slice along `axis`) repeated;
/// `repeats` is one count or one per element. `None` works on the flattened array.
pub fn repeat(a: impl ArrayLike, repeats: impl ArrayLike, axis: impl Into<Axes>) -> Result<Tensor> {
    let axis = one_axis("repeat", axis.into())?;
    let (a, ax) = axis_or_flat("repeat", arr(a)?, axis)?;
    let n = a.shape()[ax];
    let reps = host_i64("repeat", &arr(repeats)?)?;
    let reps: Vec<i64> = match reps.len() {
        1 => vec![reps[0]; n],
        l if l == n => reps,
        l => {
            return Err(Error::invalid(
                "repeat",
                format!("operands could not be broadcast together with shape ({n},) ({l},)"),
            ))
        }
    };
    if reps.iter().any(|r| *r < 0) {
        return Err(Error::invalid(
            "repeat",
            "repeats may not contain negative values.",
        ));
    }
    let idx: Vec<i64> = reps
        .iter()
        .enumerate()
        .flat_map(|(i, r)| std::iter::repeat_n(i as i64, *r as usize))
        .collect();
    let len = idx.len();
    a.gather(&i64_tensor(idx, &[len], &a)?, ax as isize)
}

/// `numpy.broadcast_to(array, shape)` (a view).
pub fn broadcast_to(a: impl ArrayLike, shape: &[usize]) -> Result<Tensor> {
    let a = arr(a)?;
    let out = broadcast_shape("broadcast_to", &[a.shape(), shape])?;
    if out != shape {
        return Err(Error::invalid(
            "broadcast_to",
            format!(
                "operands could not be broadcast together with remapped shapes [original->remapped]: {} and requested shape {}",
                py_shape(a.shape()),
                py_shape(shape)
            ),
        ));
    }
    a.broadcast_to(shape)
}

/// `numpy.broadcast_arrays(*args)`: every argument broadcast to their common shape (views).
pub fn broadcast_arrays<A: ArrayLike>(arrays: &[A]) -> Result<Vec<Tensor>> {
    let ts: Vec<Tensor> = arrays.iter().map(arr).collect::<Result<_>>()?;
    let shapes: Vec<&[usize]> = ts.iter().map(|t| t.shape()).collect();
    let shape = broadcast_shape("broadcast_arrays", &shapes)?;
    ts.iter().map(|t| t.broadcast_to(&shape)).collect()
}

/// `numpy.flip(m, axis=None)`: reverses the order along the axes (all for `None`); a view.
pub fn flip(m: impl ArrayLike, axis: impl Into<Axes>) -> Result<Tensor> {
    let m = arr(m)?;
    let axes: Vec<isize> = match axis.into() {
        Axes::All => (0..m.rank() as isize).collect(),
        Axes::List(l) => norm_axes("flip", &l, m.rank())?
            .into_iter()
            .map(|a| a as isize)
            .collect(),
    };
    m.reverse(&axes)
}
/// `numpy.fliplr(m)`: reverses axis 1.
pub fn fliplr(m: impl ArrayLike) -> Result<Tensor> {
    let m = arr(m)?;
    if m.rank() < 2 {
        return Err(Error::invalid("fliplr", "Input must be >= 2-d."));
    }
    m.reverse(&[1])
}
/// `numpy.flipud(m)`: reverses axis 0.
pub fn flipud(m: impl ArrayLike) -> Result<Tensor> {
    let m = arr(m)?;
    if m.rank() < 1 {
        return Err(Error::invalid("flipud", "Input must be >= 1-d."));
    }
    m.reverse(&[0])
}

/// `numpy.roll(a, shift, axis=None)`: elements shifted cyclically (`None`: over the flattened
/// array, keeping the shape).
pub fn roll(a: impl ArrayLike, shift: isize, axis: impl Into<Axes>) -> Result<Tensor> {
    let axis = one_axis("roll", axis.into())?;
    let a = arr(a)?;
    match axis {
        None => roll(a.reshape(&[-1])?, shift, Some(0))?.reshape_to(a.shape()),
        Some(ax) => {
            let ax = norm_axis("roll", ax, a.rank())?;
            let n = a.shape()[ax] as isize;
            if n == 0 {
                return Ok(a);
            }
            let s = shift.rem_euclid(n);
            if s == 0 {
                return Ok(a);
            }
            let mut head = vec![SliceSpec::ALL; a.rank()];
            let mut tail = head.clone();
            head[ax] = SliceSpec::range(n - s, n);
            tail[ax] = SliceSpec::range(0, n - s);
            Tensor::concat(
                &[a.strided_slice(&head)?, a.strided_slice(&tail)?],
                ax as isize,
            )
        }
    }
}

/// `numpy.rot90(m, k=1, axes=(0, 1))`: rotates by 90° `k` times in the plane of `axes`,
/// from the first axis towards the second.
pub fn rot90(m: impl ArrayLike, k: isize, axes: impl Into<Axes>) -> Result<Tensor> {
    let axes = match axes.into() {
        Axes::List(v) if v.len() == 2 => (v[0], v[1]),
        other => {
            return Err(Error::invalid(
                "rot90",
                format!("len(axes) must be 2, got {other:?}"),
            ))
        }
    };
    let m = arr(m)?;
    if m.rank() < 2 {
        return Err(Error::invalid(
            "rot90",
            "Axes must be different and the array at least 2-d.",
        ));
    }
    let (a0, a1) = (
        norm_axis("rot90", axes.0, m.rank())?,
        norm_axis("rot90", axes.1, m.rank())?,
    );
    if a0 == a1 {
        return Err(Error::invalid("rot90", "Axes must be different."));
    }
    let mut perm: Vec<usize> = (0..m.rank()).collect();
    perm.swap(a0, a1);
    match k.rem_euclid(4) {
        0 => Ok(m),
        2 => m.reverse(&[a0 as isize, a1 as isize]),
        1 => m.reverse(&[a1 as isize])?.transpose(&perm),
        _ => m.transpose(&perm)?.reverse(&[a1 as isize]),
    }
}

/// `numpy.pad`'s modes.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum PadMode {
    /// A constant (`constant_values`).
    Constant(f64),
    /// The edge value repeated.
    Edge,
    /// Mirrored without the edge (`reflect`).
    Reflect,
    /// Mirrored with the edge (`symmetric`).
    Symmetric,
    /// Wrapped around (`wrap`).
    Wrap,
}

/// The source index of padded position `i` (in `-before..n+after`) for a mode.
fn pad_source(mode: PadMode, i: isize, n: isize) -> isize {
    match mode {
        PadMode::Constant(_) | PadMode::Edge => i.clamp(0, n - 1),
        PadMode::Wrap => i.rem_euclid(n),
        PadMode::Reflect => {
            if n == 1 {
                return 0;
            }
            let p = 2 * (n - 1);
            let j = i.rem_euclid(p);
            if j < n {
                j
            } else {
                p - j
            }
        }
        PadMode::Symmetric => {
            let p = 2 * n;
            let j = i.rem_euclid(p);
            if j < n {
                j
            } else {
                p - 1 - j
            }
        }
    }
}

/// `numpy.pad(array, pad_width, mode)`: `pad_width` is one `(before, after)` for every axis
/// or one per axis.
pub fn pad(a: impl ArrayLike, pad_width: &[(usize, usize)], mode: PadMode) -> Result<Tensor> {
    let a = arr(a)?;
    let widths: Vec<(usize, usize)> = match pad_width.len() {
        1 => vec![pad_width[0]; a.rank()],
        n if n == a.rank() => pad_width.to_vec(),
        n => {
            return Err(Error::invalid(
                "pad",
                format!(
                    "operands could not be broadcast together with remapped shapes [original->remapped]: ({n},2) and requested shape ({},2)",
                    a.rank()
                ),
            ))
        }
    };
    if let PadMode::Constant(v) = mode {
        return a.pad(&widths, v);
    }
    let mut out = a;
    for (ax, &(before, after)) in widths.iter().enumerate() {
        if before == 0 && after == 0 {
            continue;
        }
        let n = out.shape()[ax] as isize;
        if n == 0 {
            return Err(Error::invalid(
                "pad",
                "can't extend empty axis using modes other than 'constant' or 'empty'",
            ));
        }
        let idx: Vec<i64> = (-(before as isize)..n + after as isize)
            .map(|i| pad_source(mode, i, n) as i64)
            .collect();
        let len = idx.len();
        out = out.gather(&i64_tensor(idx, &[len], &out)?, ax as isize)?;
    }
    Ok(out)
}

/// Indices checked against an axis of size `n`, negatives counted from the end.
fn checked_indices(idx: &Tensor, n: usize, axis: usize) -> Result<Tensor> {
    let v = host_i64("take", idx)?;
    let out: Vec<i64> = v
        .iter()
        .map(|&i| {
            let j = if i < 0 { i + n as i64 } else { i };
            if j < 0 || j >= n as i64 {
                Err(Error::invalid(
                    "take",
                    format!("IndexError: index {i} is out of bounds for axis {axis} with size {n}"),
                ))
            } else {
                Ok(j)
            }
        })
        .collect::<Result<_>>()?;
    i64_tensor(out, idx.shape(), idx)
}

/// `numpy.take(a, indices, axis=None)`: elements (or slices along `axis`) at `indices`;
/// negative indices count from the end, out-of-range ones are an `IndexError`.
pub fn take(a: impl ArrayLike, indices: impl ArrayLike, axis: impl Into<Axes>) -> Result<Tensor> {
    let axis = one_axis("take", axis.into())?;
    let (a, ax) = axis_or_flat("take", arr(a)?, axis)?;
    let idx = checked_indices(&arr(indices)?, a.shape()[ax], ax)?;
    a.gather(&idx, ax as isize)
}

/// `numpy.take_along_axis(arr, indices, axis)`: picks along `axis` with an index array of the
/// same rank (other axes broadcast), as `argsort` results are used.
pub fn take_along_axis(
    a: impl ArrayLike,
    indices: impl ArrayLike,
    axis: impl Into<Axes>,
) -> Result<Tensor> {
    let axis = required_axis("take_along_axis", axis.into())?;
    let a = arr(a)?;
    let idx = arr(indices)?;
    if idx.rank() != a.rank() {
        return Err(Error::invalid(
            "take_along_axis",
            "`indices` and `arr` must have the same number of dimensions",
        ));
    }
    let ax = norm_axis("take_along_axis", axis, a.rank())?;
    let mut a_shape = a.shape().to_vec();
    a_shape[ax] = 1;
    let mut out = broadcast_shape("take_along_axis", &[&a_shape, idx.shape()])?;
    out[ax] = idx.shape()[ax];
    let mut ib = out.clone();
    ib[ax] = idx.shape()[ax];
    let iv = host_i64("take_along_axis", &idx.broadcast_to(&ib)?.contiguous()?)?;
    let n = a.shape()[ax] as i64;
    let strides: Vec<i64> = {
        let mut s = vec![1i64; a.rank()];
        for d in (0..a.rank().saturating_sub(1)).rev() {
            s[d] = s[d + 1] * a.shape()[d + 1] as i64;
        }
        s
    };
    let mut flat = Vec::with_capacity(iv.len());
    let mut coord = vec![0usize; out.len()];
    for &i in &iv {
        let j = if i < 0 { i + n } else { i };
        if j < 0 || j >= n {
            return Err(Error::invalid(
                "take_along_axis",
                format!("IndexError: index {i} is out of bounds for axis {ax} with size {n}"),
            ));
        }
        let mut p = 0i64;
        for d in 0..out.len() {
            let c = if d == ax {
                j
            } else if a.shape()[d] == 1 {
                0
            } else {
                coord[d] as i64
            };
            p += c * strides[d];
        }
        flat.push(p);
        for d in (0..out.len()).rev() {
            coord[d] += 1;
            if coord[d] < out[d] {
                break;
            }
            coord[d] = 0;
        }
    }
    let len = flat.len();
    a.reshape(&[-1])?
        .gather(&i64_tensor(flat, &[len], &a)?, 0)?
        .reshape_to(&out)
}

/// NumPy truthiness: `x != 0` as bool.
pub(crate) fn truth(t: &Tensor) -> Result<Tensor> {
    t.cast(DType::Bool)
}

/// `numpy.where(condition, x, y)` (`where` is a Rust keyword): `x` where the condition is
/// true, else `y`; all three broadcast, `x` and `y` promote. The one-argument form is
/// [`crate::nonzero`].
pub fn where_(condition: impl ArrayLike, x: impl ArrayLike, y: impl ArrayLike) -> Result<Tensor> {
    let c = truth(&arr(condition)?)?;
    let vals = [x.to_value()?, y.to_value()?];
    let (xy, _) = promote_all(&vals)?;
    broadcast_shape("where", &[c.shape(), xy[0].shape(), xy[1].shape()])?;
    Tensor::select(&c, &xy[0], &xy[1])
}

/// `numpy.select(condlist, choicelist, default=0)`: per element, the choice of the first
/// true condition, else `default`.
pub fn select<C: ArrayLike, V: ArrayLike>(
    condlist: &[C],
    choicelist: &[V],
    default: impl ArrayLike,
) -> Result<Tensor> {
    if condlist.len() != choicelist.len() {
        return Err(Error::invalid(
            "select",
            "list of cases must be same length as list of conditions",
        ));
    }
    let mut vals: Vec<Value> = values(choicelist)?;
    vals.push(default.to_value()?);
    let (choices, dtype) = promote_all(&vals)?;
    let mut out = choices[choices.len() - 1].clone();
    for (c, v) in condlist.iter().zip(&choices).rev() {
        let c = arr(c)?;
        if c.dtype() != DType::Bool {
            return Err(Error::invalid(
                "select",
                format!(
                    "invalid entry in condlist: should be boolean ndarray, got {}",
                    c.dtype()
                ),
            ));
        }
        out = Tensor::select(&c, v, &out)?;
    }
    let _ = cast_all;
    Ok(if out.dtype() == dtype {
        out
    } else {
        out.cast(dtype)?
    })
}

/// `numpy.compress(condition, a, axis=None)`: the slices along `axis` where the 1-D
/// condition is true.
pub fn compress(
    condition: impl ArrayLike,
    a: impl ArrayLike,
    axis: impl Into<Axes>,
) -> Result<Tensor> {
    let axis = one_axis("compress", axis.into())?;
    let c = truth(&arr(condition)?)?;
    if c.rank() != 1 {
        return Err(Error::invalid("compress", "condition must be a 1-d array"));
    }
    let keep: Vec<i64> = c
        .to_vec::<bool>()?
        .iter()
        .enumerate()
        .filter(|(_, b)| **b)
        .map(|(i, _)| i as i64)
        .collect();
    let (a, ax) = axis_or_flat("compress", arr(a)?, axis)?;
    if let Some(last) = keep.last() {
        if *last as usize >= a.shape()[ax] {
            return Err(Error::invalid(
                "compress",
                format!(
                    "IndexError: index {last} is out of bounds for axis {ax} with size {}",
                    a.shape()[ax]
                ),
            ));
        }
    }
    let len = keep.len();
    a.gather(&i64_tensor(keep, &[len], &a)?, ax as isize)
}

/// `numpy.atleast_1d(a)`.
pub fn atleast_1d(a: impl ArrayLike) -> Result<Tensor> {
    let a = arr(a)?;
    if a.rank() == 0 {
        a.reshape(&[1])
    } else {
        Ok(a)
    }
}
/// `numpy.atleast_2d(a)`: 1-D arrays become rows `(1, N)`.
pub fn atleast_2d(a: impl ArrayLike) -> Result<Tensor> {
    let a = arr(a)?;
    match a.rank() {
        0 => a.reshape(&[1, 1]),
        1 => a.expand_dims(0),
        _ => Ok(a),
    }
}
/// `numpy.atleast_3d(a)`: 1-D `(N)` becomes `(1, N, 1)`, 2-D `(M, N)` becomes `(M, N, 1)`.
pub fn atleast_3d(a: impl ArrayLike) -> Result<Tensor> {
    let a = arr(a)?;
    match a.rank() {
        0 => a.reshape(&[1, 1, 1]),
        1 => a.reshape(&[1, -1, 1]),
        2 => a.expand_dims(2),
        _ => Ok(a),
    }
}

fn split_along(
    op: &'static str,
    a: impl ArrayLike,
    sections: impl Into<Sections>,
    min_rank: usize,
    axis: isize,
) -> Result<Vec<Tensor>> {
    let a = arr(a)?;
    if a.rank() < min_rank {
        return Err(Error::invalid(
            op,
            format!("{op} only works on arrays of {min_rank} or more dimensions"),
        ));
    }
    split_impl(op, a, sections.into(), axis, true)
}
/// `numpy.hsplit`: [`split`] along axis 1 (axis 0 for 1-D arrays).
pub fn hsplit(a: impl ArrayLike, sections: impl Into<Sections>) -> Result<Vec<Tensor>> {
    let a = arr(a)?;
    let axis = if a.rank() == 1 { 0 } else { 1 };
    split_along("hsplit", a, sections, 1, axis)
}
/// `numpy.vsplit`: [`split`] along axis 0 of an array of rank >= 2.
pub fn vsplit(a: impl ArrayLike, sections: impl Into<Sections>) -> Result<Vec<Tensor>> {
    split_along("vsplit", a, sections, 2, 0)
}
/// `numpy.dsplit`: [`split`] along axis 2 of an array of rank >= 3.
pub fn dsplit(a: impl ArrayLike, sections: impl Into<Sections>) -> Result<Vec<Tensor>> {
    split_along("dsplit", a, sections, 3, 2)
}

/// `numpy.column_stack`: 1-D arrays become columns, then everything joins along axis 1.
pub fn column_stack<A: ArrayLike>(arrays: &[A]) -> Result<Tensor> {
    let ts: Vec<Tensor> = promoted("column_stack", arrays)?
        .into_iter()
        .map(|t| match t.rank() {
            0 => t.reshape(&[1, 1]),
            1 => t.reshape(&[-1, 1]),
            _ => Ok(t),
        })
        .collect::<Result<_>>()?;
    concatenate(&ts, Some(1))
}

/// `numpy.append(arr, values, axis=None)`: `values` joined after `arr` (`None`: both
/// flattened).
pub fn append(a: impl ArrayLike, values: impl ArrayLike, axis: impl Into<Axes>) -> Result<Tensor> {
    let axis = one_axis("append", axis.into())?;
    let vals = [a.to_value()?, values.to_value()?];
    concatenate(&vals, axis)
}

/// `numpy.delete(arr, indices, axis=None)`: the slices at `indices` removed (`None`: from the
/// flattened array); negative indices count from the end.
pub fn delete(a: impl ArrayLike, indices: impl ArrayLike, axis: impl Into<Axes>) -> Result<Tensor> {
    let axis = one_axis("delete", axis.into())?;
    let (a, ax) = axis_or_flat("delete", arr(a)?, axis)?;
    let n = a.shape()[ax] as i64;
    let mut drop = vec![false; n as usize];
    for i in host_i64("delete", &arr(indices)?)? {
        let j = if i < 0 { i + n } else { i };
        if j < 0 || j >= n {
            return Err(Error::invalid(
                "delete",
                format!("IndexError: index {i} is out of bounds for axis {ax} with size {n}"),
            ));
        }
        drop[j as usize] = true;
    }
    let keep: Vec<i64> = (0..n).filter(|i| !drop[*i as usize]).collect();
    let len = keep.len();
    a.gather(&i64_tensor(keep, &[len], &a)?, ax as isize)
}

/// `numpy.rollaxis(a, axis, start=0)`: `axis` moved to sit before `start`.
pub fn rollaxis(a: impl ArrayLike, axis: impl Into<Axes>, start: isize) -> Result<Tensor> {
    let axis = required_axis("rollaxis", axis.into())?;
    let a = arr(a)?;
    let n = a.rank() as isize;
    let ax = norm_axis("rollaxis", axis, a.rank())?;
    let s = if start < 0 { start + n } else { start };
    if s < 0 || s > n {
        return Err(Error::invalid(
            "rollaxis",
            format!(
                "AxisError: 'start' arg requires {} <= start < {}, but {start} was passed in",
                -n,
                n + 1
            ),
        ));
    }
    let mut s = s as usize;
    if ax < s {
        s -= 1;
    }
    let mut order: Vec<usize> = (0..a.rank()).filter(|d| *d != ax).collect();
    order.insert(s, ax);
    a.transpose(&order)
}

/// `numpy.extract(condition, arr)`: the elements of the flattened `arr` where the flattened
/// condition is true.
pub fn extract(condition: impl ArrayLike, a: impl ArrayLike) -> Result<Tensor> {
    compress(ravel(condition)?, ravel(a)?, None)
}

/// `numpy.ascontiguousarray(a)`: a dense (C-order) array of rank >= 1; the same array when
/// it already is one.
pub fn ascontiguousarray(a: impl ArrayLike) -> Result<Tensor> {
    atleast_1d(a)?.contiguous()
}

/// `numpy.copy(a)`: a new array with the same values.
pub fn copy(a: impl ArrayLike) -> Result<Tensor> {
    crate::array(a)
}

/// `numpy.broadcast_shapes(*shapes)`: the shape the arguments broadcast to.
pub fn broadcast_shapes(shapes: &[&[usize]]) -> Result<Vec<usize>> {
    broadcast_shape("broadcast_shapes", shapes)
}

/// `numpy.array_equiv(a1, a2)`: broadcastable and equal everywhere.
pub fn array_equiv(a1: impl ArrayLike, a2: impl ArrayLike) -> Result<bool> {
    let (a, b) = (arr(a1)?, arr(a2)?);
    if broadcast_shape("array_equiv", &[a.shape(), b.shape()]).is_err() {
        return Ok(false);
    }
    crate::logic::equal(&a, &b)?
        .reduce_all(Axes::All, false)?
        .item::<bool>()
}
