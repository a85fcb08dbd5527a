//! Products: `matmul`, `dot`, `inner`, `outer`, `tensordot`, `einsum`, `cross`, `kron`,
//! `vdot`, `trace`, `diagonal`. All are reshapes and transposes around one batched matmul,
//! so they run on any device and are differentiable.
//!
//! ```
//! use ferroflow_numpy as np;
//! ferroflow::init();
//! let a = np::asarray([[1.0, 2.0], [3.0, 4.0]])?;
//! let v = np::asarray([1.0, 1.0])?;
//! assert_eq!(np::dot(&a, &v)?.to_vec::<f64>()?, vec![3.0, 7.0]);
//! let t = np::einsum("ij,j->i", &[&a, &v])?;
//! assert_eq!(t.to_vec::<f64>()?, vec![3.0, 7.0]);
//! assert_eq!(np::trace(&a)?.item::<f64>()?, 5.0);
//! # Ok::<(), np::Error>(())
//! ```

use ferroflow_tensor::{Axes, DType, Error, Result, SliceSpec, Tensor};

use crate::array::{arr, promote2, promote_all, ArrayLike, Value};
use crate::math::{multiply, subtract};
use crate::util::{broadcast_shape, i64_tensor, norm_axis, py_shape, required_axis};

/// Integer and boolean products run in a dtype the matmul kernel has, then cast back
/// (wrapping products agree modulo the narrower type's width).
fn matmul_dtype(d: DType) -> DType {
    match d {
        DType::Bool | DType::I8 | DType::U8 | DType::I16 | DType::U16 => DType::I32,
        DType::U32 | DType::U64 => DType::I64,
        d => d,
    }
}

fn mm(a: &Tensor, b: &Tensor) -> Result<Tensor> {
    let d = a.dtype();
    let md = matmul_dtype(d);
    let r = a.cast(md)?.matmul(&b.cast(md)?)?;
    if d == DType::Bool {
        r.cast(DType::Bool)
    } else {
        r.cast(d)
    }
}

/// `numpy.matmul(a, b)`: 1-D operands are promoted to matrices and the added axis removed;
/// leading (batch) axes broadcast.
pub fn matmul(a: impl ArrayLike, b: impl ArrayLike) -> Result<Tensor> {
    let (a, b, _) = promote2(a, b)?;
    for (i, t) in [&a, &b].iter().enumerate() {
        if t.rank() == 0 {
            return Err(Error::invalid(
                "matmul",
                format!("Input operand {i} does not have enough dimensions (has 0, gufunc core with signature (n?,k),(k,m?)->(n?,m?) requires 1)"),
            ));
        }
    }
    let (a2, b2) = (
        if a.rank() == 1 {
            a.expand_dims(0)?
        } else {
            a.clone()
        },
        if b.rank() == 1 {
            b.expand_dims(1)?
        } else {
            b.clone()
        },
    );
    let (k1, k2) = (a2.shape()[a2.rank() - 1], b2.shape()[b2.rank() - 2]);
    if k1 != k2 {
        return Err(Error::invalid(
            "matmul",
            format!("Input operand 1 has a mismatch in its core dimension 0, with gufunc signature (n?,k),(k,m?)->(n?,m?) (size {k2} is different from {k1})"),
        ));
    }
    broadcast_shape(
        "matmul",
        &[&a2.shape()[..a2.rank() - 2], &b2.shape()[..b2.rank() - 2]],
    )?;
    let mut r = mm(&a2, &b2)?;
    if b.rank() == 1 {
        r = r.squeeze(&[-1])?;
    }
    if a.rank() == 1 {
        r = r.squeeze(&[if b.rank() == 1 { -1 } else { -2 }])?;
    }
    Ok(r)
}

/// `tensordot`'s axes: the last `n` of `a` with the first `n` of `b`, or explicit lists.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum TensordotAxes {
    /// Sum over the last `n` axes of `a` and the first `n` of `b`.
    N(usize),
    /// Sum over these axes of `a` and of `b`, pairwise.
    Pairs(Vec<isize>, Vec<isize>),
}
impl From<usize> for TensordotAxes {
    fn from(n: usize) -> Self {
        TensordotAxes::N(n)
    }
}
impl From<i32> for TensordotAxes {
    fn from(n: i32) -> Self {
        TensordotAxes::N(n.max(0) as usize)
    }
}
impl<const N: usize> From<([isize; N], [isize; N])> for TensordotAxes {
    fn from((a, b): ([isize; N], [isize; N])) -> Self {
        TensordotAxes::Pairs(a.to_vec(), b.to_vec())
    }
}
impl From<(Vec<isize>, Vec<isize>)> for TensordotAxes {
    fn from((a, b): (Vec<isize>, Vec<isize>)) -> Self {
        TensordotAxes::Pairs(a, b)
    }
}

fn tensordot_t(a: &Tensor, b: &Tensor, ax_a: &[usize], ax_b: &[usize]) -> Result<Tensor> {
    for (i, j) in ax_a.iter().zip(ax_b) {
        if a.shape()[*i] != b.shape()[*j] {
            return Err(Error::invalid("tensordot", "shape-mismatch for sum"));
        }
    }
    let free_a: Vec<usize> = (0..a.rank()).filter(|i| !ax_a.contains(i)).collect();
    let free_b: Vec<usize> = (0..b.rank()).filter(|i| !ax_b.contains(i)).collect();
    let m: usize = free_a.iter().map(|i| a.shape()[*i]).product();
    let n: usize = free_b.iter().map(|i| b.shape()[*i]).product();
    let k: usize = ax_a.iter().map(|i| a.shape()[*i]).product();
    let pa: Vec<usize> = free_a.iter().chain(ax_a).copied().collect();
    let pb: Vec<usize> = ax_b.iter().chain(&free_b).copied().collect();
    let a2 = a.transpose(&pa)?.reshape_to(&[m, k])?;
    let b2 = b.transpose(&pb)?.reshape_to(&[k, n])?;
    let mut shape: Vec<usize> = free_a.iter().map(|i| a.shape()[*i]).collect();
    shape.extend(free_b.iter().map(|i| b.shape()[*i]));
    mm(&a2, &b2)?.reshape_to(&shape)
}

/// `numpy.tensordot(a, b, axes=2)`.
pub fn tensordot(
    a: impl ArrayLike,
    b: impl ArrayLike,
    axes: impl Into<TensordotAxes>,
) -> Result<Tensor> {
    let (a, b, _) = promote2(a, b)?;
    let (ax_a, ax_b): (Vec<usize>, Vec<usize>) = match axes.into() {
        TensordotAxes::N(n) => {
            if n > a.rank() || n > b.rank() {
                return Err(Error::invalid("tensordot", "shape-mismatch for sum"));
            }
            ((a.rank() - n..a.rank()).collect(), (0..n).collect())
        }
        TensordotAxes::Pairs(x, y) => {
            if x.len() != y.len() {
                return Err(Error::invalid("tensordot", "shape-mismatch for sum"));
            }
            (
                x.iter()
                    .map(|i| norm_axis("tensordot", *i, a.rank()))
                    .collect::<Result<_>>()?,
                y.iter()
                    .map(|i| norm_axis("tensordot", *i, b.rank()))
                    .collect::<Result<_>>()?,
            )
        }
    };
    tensordot_t(&a, &b, &ax_a, &ax_b)
}

/// `numpy.dot(a, b)`: products of scalars, inner products of vectors, matrix products, and
/// for N-D arrays the sum over the last axis of `a` and the second-to-last of `b`.
pub fn dot(a: impl ArrayLike, b: impl ArrayLike) -> Result<Tensor> {
    let (a, b, _) = promote2(a, b)?;
    if a.rank() == 0 || b.rank() == 0 {
        return multiply(&a, &b);
    }
    if a.rank() == 1 && b.rank() == 1 && a.shape() == b.shape() {
        // the inner product as one 1×k by k×1 product
        return mm(&a.expand_dims(0)?, &b.expand_dims(1)?)?.reshape(&[]);
    }
    if a.rank() <= 2 && b.rank() <= 2 {
        let (ka, kb) = (a.shape()[a.rank() - 1], b.shape()[0]);
        if ka != kb {
            return Err(Error::invalid(
                "dot",
                format!(
                    "shapes {} and {} not aligned: {ka} (dim {}) != {kb} (dim 0)",
                    py_shape(a.shape()),
                    py_shape(b.shape()),
                    a.rank() - 1
                ),
            ));
        }
        return matmul(&a, &b);
    }
    let bk = if b.rank() == 1 { 0 } else { b.rank() - 2 };
    if a.shape()[a.rank() - 1] != b.shape()[bk] {
        return Err(Error::invalid(
            "dot",
            format!(
                "shapes {} and {} not aligned: {} (dim {}) != {} (dim {bk})",
                py_shape(a.shape()),
                py_shape(b.shape()),
                a.shape()[a.rank() - 1],
                a.rank() - 1,
                b.shape()[bk]
            ),
        ));
    }
    tensordot_t(&a, &b, &[a.rank() - 1], &[bk])
}

/// `numpy.inner(a, b)`: sums over the last axes of both.
pub fn inner(a: impl ArrayLike, b: impl ArrayLike) -> Result<Tensor> {
    let (a, b, _) = promote2(a, b)?;
    if a.rank() == 0 || b.rank() == 0 {
        return multiply(&a, &b);
    }
    let (ka, kb) = (a.shape()[a.rank() - 1], b.shape()[b.rank() - 1]);
    if ka != kb {
        return Err(Error::invalid(
            "inner",
            format!(
                "shapes {} and {} not aligned: {ka} (dim {}) != {kb} (dim {})",
                py_shape(a.shape()),
                py_shape(b.shape()),
                a.rank() - 1,
                b.rank() - 1
            ),
        ));
    }
    tensordot_t(&a, &b, &[a.rank() - 1], &[b.rank() - 1])
}

/// `numpy.outer(a, b)`: `a.ravel()[:, None] * b.ravel()[None, :]`.
pub fn outer(a: impl ArrayLike, b: impl ArrayLike) -> Result<Tensor> {
    let (a, b, _) = promote2(a, b)?;
    multiply(&a.reshape(&[-1, 1])?, &b.reshape(&[1, -1])?)
}

/// `numpy.vdot(a, b)`: the dot product of the flattened arrays, the first conjugated.
pub fn vdot(a: impl ArrayLike, b: impl ArrayLike) -> Result<Tensor> {
    let (a, b, _) = promote2(a, b)?;
    let a = a.conj()?;
    if a.num_elements() != b.num_elements() {
        return Err(Error::invalid(
            "vdot",
            "cannot reshape: vectors have different lengths",
        ));
    }
    matmul(&a.reshape(&[-1])?, &b.reshape(&[-1])?)
}

/// `numpy.kron(a, b)`: the Kronecker product.
pub fn kron(a: impl ArrayLike, b: impl ArrayLike) -> Result<Tensor> {
    let (a, b, _) = promote2(a, b)?;
    let r = a.rank().max(b.rank());
    let pad = |t: &Tensor| -> Vec<usize> {
        let mut s = vec![1; r - t.rank()];
        s.extend_from_slice(t.shape());
        s
    };
    let (sa, sb) = (pad(&a), pad(&b));
    let ia: Vec<isize> = sa.iter().flat_map(|d| [*d as isize, 1]).collect();
    let ib: Vec<isize> = sb.iter().flat_map(|d| [1, *d as isize]).collect();
    let out: Vec<usize> = sa.iter().zip(&sb).map(|(x, y)| x * y).collect();
    multiply(&a.reshape(&ia)?, &b.reshape(&ib)?)?.reshape_to(&out)
}

fn component(t: &Tensor, i: isize) -> Result<Tensor> {
    let mut s = vec![SliceSpec::ALL; t.rank()];
    s[t.rank() - 1] = SliceSpec::Index(i);
    t.strided_slice(&s)
}

/// `numpy.cross(a, b, axis=-1)`: cross products of 3-vectors (2-vectors have z = 0; two
/// 2-vectors give the z component alone) along `axis`.
pub fn cross(a: impl ArrayLike, b: impl ArrayLike, axis: impl Into<Axes>) -> Result<Tensor> {
    let axis = required_axis("cross", axis.into())?;
    let (a, b, _) = promote2(a, b)?;
    let (aa, ab) = (
        norm_axis("cross", axis, a.rank())?,
        norm_axis("cross", axis, b.rank())?,
    );
    let a = crate::shape::moveaxis(&a, [aa as isize], [-1])?;
    let b = crate::shape::moveaxis(&b, [ab as isize], [-1])?;
    let (na, nb) = (a.shape()[a.rank() - 1], b.shape()[b.rank() - 1]);
    if !matches!(na, 2 | 3) || !matches!(nb, 2 | 3) {
        return Err(Error::invalid(
            "cross",
            "incompatible dimensions for cross product\n(dimension must be 2 or 3)",
        ));
    }
    let comps = |t: &Tensor, n: usize| -> Result<Vec<Tensor>> {
        let mut v: Vec<Tensor> = (0..n as isize)
            .map(|i| component(t, i))
            .collect::<Result<_>>()?;
        if n == 2 {
            v.push(v[0].zeros_like()?);
        }
        Ok(v)
    };
    let (x, y) = (comps(&a, na)?, comps(&b, nb)?);
    let c = |i: usize, j: usize| -> Result<Tensor> {
        subtract(multiply(&x[i], &y[j])?, multiply(&x[j], &y[i])?)
    };
    if na == 2 && nb == 2 {
        return c(0, 1);
    }
    let parts = [c(1, 2)?, c(2, 0)?, c(0, 1)?];
    let shape = broadcast_shape(
        "cross",
        &[parts[0].shape(), parts[1].shape(), parts[2].shape()],
    )?;
    let parts: Vec<Tensor> = parts
        .iter()
        .map(|p| p.broadcast_to(&shape))
        .collect::<Result<_>>()?;
    let out = Tensor::stack(&parts, -1)?;
    let r = out.rank() as isize;
    let axis = if axis < 0 { axis + r } else { axis.min(r - 1) };
    crate::shape::moveaxis(&out, [-1], [axis])
}

/// `numpy.diagonal(a)`: the main diagonal of the first two axes; [`diagonal_with`] takes
/// `offset`, `axis1` and `axis2`.
pub fn diagonal(a: impl ArrayLike) -> Result<Tensor> {
    diagonal_with(a, 0, 0, 1)
}

/// `numpy.diagonal(a, offset=0, axis1=0, axis2=1)`: the diagonal of the (axis1, axis2)
/// planes, as the last axis of the result.
pub fn diagonal_with(
    a: impl ArrayLike,
    offset: isize,
    axis1: impl Into<Axes>,
    axis2: impl Into<Axes>,
) -> Result<Tensor> {
    let axis1 = required_axis("diagonal", axis1.into())?;
    let axis2 = required_axis("diagonal", axis2.into())?;
    let a = arr(a)?;
    if a.rank() < 2 {
        return Err(Error::invalid(
            "diagonal",
            "diag requires an array of at least two dimensions",
        ));
    }
    let (i, j) = (
        norm_axis("diagonal", axis1, a.rank())?,
        norm_axis("diagonal", axis2, a.rank())?,
    );
    if i == j {
        return Err(Error::invalid(
            "diagonal",
            "axis1 and axis2 cannot be the same",
        ));
    }
    let mut perm: Vec<usize> = (0..a.rank()).filter(|k| *k != i && *k != j).collect();
    perm.push(i);
    perm.push(j);
    let t = a.transpose(&perm)?;
    let (r, c) = (a.shape()[i] as isize, a.shape()[j] as isize);
    let (r0, c0) = if offset >= 0 {
        (0, offset)
    } else {
        (-offset, 0)
    };
    let len = (r - r0).min(c - c0).max(0) as usize;
    let idx: Vec<i64> = (0..len as isize)
        .map(|k| ((r0 + k) * c + c0 + k) as i64)
        .collect();
    let mut flat: Vec<isize> = t.shape()[..t.rank() - 2]
        .iter()
        .map(|d| *d as isize)
        .collect();
    flat.push(r * c);
    t.reshape(&flat)?.gather(&i64_tensor(idx, &[len], &a)?, -1)
}

/// `numpy.trace(a)`: the sum of the main diagonal of the first two axes; [`trace_with`]
/// takes `offset`, `axis1` and `axis2`.
///
/// ```
/// ferroflow::init();
/// use ferroflow_numpy as np;
/// assert_eq!(np::trace(np::eye(3)?)?.item::<f64>()?, 3.0);
/// # Ok::<(), np::Error>(())
/// ```
pub fn trace(a: impl ArrayLike) -> Result<Tensor> {
    trace_with(a, 0, 0, 1)
}

/// `numpy.trace(a, offset=0, axis1=0, axis2=1)`: sums of diagonals.
pub fn trace_with(
    a: impl ArrayLike,
    offset: isize,
    axis1: impl Into<Axes>,
    axis2: impl Into<Axes>,
) -> Result<Tensor> {
    let axis1 = required_axis("trace", axis1.into())?;
    let axis2 = required_axis("trace", axis2.into())?;
    let d = diagonal_with(a, offset, axis1, axis2)?;
    crate::reductions::sum_with(&d, crate::reductions::ReduceArgs::new().axis(-1))
}

/// One operand of an einsum with its labels.
struct Term {
    t: Tensor,
    labels: Vec<char>,
}

fn sum_labels(term: Term, keep: &dyn Fn(char) -> bool) -> Result<Term> {
    let drop: Vec<isize> = term
        .labels
        .iter()
        .enumerate()
        .filter(|(_, l)| !keep(**l))
        .map(|(i, _)| i as isize)
        .collect();
    if drop.is_empty() {
        return Ok(term);
    }
    let labels = term.labels.iter().copied().filter(|l| keep(*l)).collect();
    Ok(Term {
        t: term.t.reduce_sum(drop, false)?,
        labels,
    })
}

/// Takes diagonals for labels repeated within one operand (`"ii->i"`).
fn dedupe(mut term: Term) -> Result<Term> {
    loop {
        let dup = term.labels.iter().enumerate().find_map(|(i, l)| {
            term.labels[i + 1..]
                .iter()
                .position(|m| m == l)
                .map(|j| (i, i + 1 + j))
        });
        let Some((i, j)) = dup else { return Ok(term) };
        let l = term.labels[i];
        term.t = diagonal_with(&term.t, 0, i as isize, j as isize)?;
        term.labels.remove(j);
        term.labels.remove(i);
        term.labels.push(l);
    }
}

fn contract(x: Term, y: Term, needed: &dyn Fn(char) -> bool) -> Result<Term> {
    let in_y = |l: &char| y.labels.contains(l);
    let in_x = |l: &char| x.labels.contains(l);
    let batch: Vec<char> = x
        .labels
        .iter()
        .copied()
        .filter(|l| in_y(l) && needed(*l))
        .collect();
    let sum: Vec<char> = x
        .labels
        .iter()
        .copied()
        .filter(|l| in_y(l) && !needed(*l))
        .collect();
    let lfree: Vec<char> = x.labels.iter().copied().filter(|l| !in_y(l)).collect();
    let rfree: Vec<char> = y.labels.iter().copied().filter(|l| !in_x(l)).collect();
    let size = |l: char| -> usize {
        let sx = x
            .labels
            .iter()
            .position(|m| *m == l)
            .map(|p| x.t.shape()[p])
            .unwrap_or(1);
        let sy = y
            .labels
            .iter()
            .position(|m| *m == l)
            .map(|p| y.t.shape()[p])
            .unwrap_or(1);
        sx.max(sy)
    };
    let arrange = |term: &Term, order: &[char]| -> Result<Tensor> {
        let perm: Vec<usize> = order
            .iter()
            .map(|l| term.labels.iter().position(|m| m == l).unwrap_or(0))
            .collect();
        let shape: Vec<usize> = order.iter().map(|l| size(*l)).collect();
        let t = term.t.transpose(&perm)?;
        if t.shape() == shape.as_slice() {
            Ok(t)
        } else {
            t.broadcast_to(&shape)
        }
    };
    let prod = |ls: &[char]| -> usize { ls.iter().map(|l| size(*l)).product() };
    let (b, m, k, n) = (prod(&batch), prod(&lfree), prod(&sum), prod(&rfree));
    let xo: Vec<char> = batch.iter().chain(&lfree).chain(&sum).copied().collect();
    let yo: Vec<char> = batch.iter().chain(&sum).chain(&rfree).copied().collect();
    let xt = arrange(&x, &xo)?.reshape_to(&[b, m, k])?;
    let yt = arrange(&y, &yo)?.reshape_to(&[b, k, n])?;
    let labels: Vec<char> = batch.iter().chain(&lfree).chain(&rfree).copied().collect();
    let shape: Vec<usize> = labels.iter().map(|l| size(*l)).collect();
    Ok(Term {
        t: mm(&xt, &yt)?.reshape_to(&shape)?,
        labels,
    })
}

/// `numpy.einsum(subscripts, *operands)`: explicit (`"ij,jk->ik"`) and implicit (`"ij,jk"`)
/// forms, `...` broadcasting, repeated labels in one operand (diagonals), any number of
/// operands (contracted left to right, each pair as one batched matmul).
pub fn einsum<A: ArrayLike>(subscripts: &str, operands: &[A]) -> Result<Tensor> {
    let vals: Vec<Value> = operands
        .iter()
        .map(|o| o.to_value())
        .collect::<Result<_>>()?;
    let (ts, _) = promote_all(&vals)?;
    let s: String = subscripts.chars().filter(|c| !c.is_whitespace()).collect();
    let (lhs, rhs) = match s.split_once("->") {
        Some((l, r)) => (l.to_string(), Some(r.to_string())),
        None => (s.clone(), None),
    };
    let specs: Vec<&str> = lhs.split(',').collect();
    if specs.len() != ts.len() {
        return Err(Error::invalid(
            "einsum",
            format!("more operands provided to einstein sum function than specified in the subscripts string ({} specs, {} operands)", specs.len(), ts.len()),
        ));
    }
    // ellipsis dims become private labels, right-aligned across operands
    const ELL: &str = "ΑΒΓΔΕΖΗΘΙΚΛΜΝΞΟΠ";
    let ell: Vec<char> = ELL.chars().collect();
    let mut ell_dims = 0usize;
    for (spec, t) in specs.iter().zip(&ts) {
        if spec.contains("...") {
            let named = spec.replace("...", "").chars().count();
            ell_dims = ell_dims.max(t.rank().saturating_sub(named));
        }
    }
    if ell_dims > ell.len() {
        return Err(Error::invalid("einsum", "too many broadcast dimensions"));
    }
    let mut terms = Vec::new();
    let mut counts = std::collections::BTreeMap::new();
    for (spec, t) in specs.iter().zip(&ts) {
        let mut labels = Vec::new();
        let named = spec.replace("...", "").chars().count();
        for (i, part) in spec.split("...").enumerate() {
            if i == 1 {
                let e = t.rank().saturating_sub(named);
                labels.extend(&ell[ell_dims - e..ell_dims]);
            }
            for c in part.chars() {
                if !c.is_ascii_alphabetic() {
                    return Err(Error::invalid("einsum", format!("invalid subscript '{c}' in einstein sum subscripts string, subscripts must be letters")));
                }
                labels.push(c);
            }
        }
        for l in &labels {
            if l.is_ascii_alphabetic() {
                *counts.entry(*l).or_insert(0) += 1;
            }
        }
        if labels.len() != t.rank() {
            return Err(Error::invalid(
                "einsum",
                format!("operand has more dimensions than subscripts given in einstein sum, but no '...' ellipsis provided to broadcast the extra dimensions ({spec:?} for shape {})", py_shape(t.shape())),
            ));
        }
        terms.push(dedupe(Term {
            t: t.clone(),
            labels,
        })?);
    }
    let out: Vec<char> = match rhs {
        Some(r) => {
            let mut o = Vec::new();
            for (i, part) in r.split("...").enumerate() {
                if i == 1 {
                    o.extend(&ell[..ell_dims]);
                }
                o.extend(part.chars());
            }
            o
        }
        None => {
            let mut o: Vec<char> = ell[..ell_dims].to_vec();
            o.extend(counts.into_iter().filter(|(_, n)| *n == 1).map(|(l, _)| l));
            o
        }
    };
    for l in &out {
        if !terms.iter().any(|t| t.labels.contains(l)) {
            return Err(Error::invalid("einsum", format!("einstein sum subscripts string included output subscript '{l}' which never appeared in an input")));
        }
    }
    let n = terms.len();
    let mut iter = terms.into_iter();
    let Some(first) = iter.next() else {
        return Err(Error::invalid("einsum", "No input operands"));
    };
    let rest: Vec<Term> = iter.collect();
    let later = |from: usize| -> Vec<char> {
        rest[from..]
            .iter()
            .flat_map(|t| t.labels.iter().copied())
            .collect()
    };
    let mut cur = {
        let needed: Vec<char> = out.iter().copied().chain(later(0)).collect();
        sum_labels(first, &|l| needed.contains(&l))?
    };
    for (i, y) in rest.iter().enumerate() {
        let needed_after: Vec<char> = out.iter().copied().chain(later(i + 1)).collect();
        let y = Term {
            t: y.t.clone(),
            labels: y.labels.clone(),
        };
        let yl = y.labels.clone();
        let cl = cur.labels.clone();
        let y = sum_labels(y, &|l| needed_after.contains(&l) || cl.contains(&l))?;
        cur = sum_labels(cur, &|l| needed_after.contains(&l) || yl.contains(&l))?;
        cur = contract(cur, y, &|l| needed_after.contains(&l))?;
    }
    let _ = n;
    let cur = sum_labels(cur, &|l| out.contains(&l))?;
    let perm: Vec<usize> = out
        .iter()
        .map(|l| cur.labels.iter().position(|m| m == l).unwrap_or(0))
        .collect();
    cur.t.transpose(&perm)
}
