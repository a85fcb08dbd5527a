//! `numpy.linalg` through nalgebra on the host, for single matrices and stacks of them
//! (`(..., M, N)`): `inv`, `det`, `solve`, `svd`, `qr`, `cholesky`, `eigh`, `eigvalsh`,
//! `pinv`, `lstsq`, and `norm` and `matrix_power` (these two are tensor ops, differentiable
//! and on the array's device).
//!
//! The nalgebra functions compute in float64 and return the input's float dtype (integers
//! give float64). They download their input and upload their results to the input's
//! device, and a `GradientTape` records them as host functions without a gradient: asking
//! for one is an error naming the function, never a silent zero.
//!
//! ```
//! use ferroflow_numpy as np;
//! ferroflow::init();
//! let a = np::asarray([[4.0, 1.0], [2.0, 3.0]])?;
//! let x = np::linalg::solve(&a, [1.0, 2.0])?;
//! assert!(np::allclose_with(np::dot(&a, &x)?, [1.0, 2.0], 1e-12, 1e-12, false)?);
//! assert!((np::linalg::det(&a)?.item::<f64>()? - 10.0).abs() < 1e-12);
//! let n = np::linalg::norm([3.0, 4.0])?;
//! assert_eq!(n.item::<f64>()?, 5.0);
//! # Ok::<(), np::Error>(())
//! ```

use nalgebra::{DMatrix, DVector};

use ferroflow_tensor::dispatch::{dispatch, is_tracing, HostCall};
use ferroflow_tensor::{DType, Error, HostData, Op, Result, Tensor};
use std::sync::Arc;

use crate::array::{arr, ArrayLike};
use crate::dtypes::{default_float, promote_types};
use crate::util::py_shape;

fn lin_err(op: &'static str, msg: impl Into<String>) -> Error {
    Error::invalid(op, format!("LinAlgError: {}", msg.into()))
}

/// The float dtype results come back in.
fn out_dtype(d: DType) -> DType {
    if d.is_float() {
        d
    } else {
        default_float()
    }
}

/// Iteration bound of nalgebra's SVD and symmetric eigensolver (converged matrices take a
/// few dozen sweeps).
const MAX_ITERATIONS: usize = 10_000;

fn check_matrix(op: &'static str, a: &Tensor, square: bool) -> Result<(usize, usize)> {
    if a.rank() < 2 {
        return Err(lin_err(
            op,
            format!(
                "{}-dimensional array given. Array must be at least two-dimensional",
                a.rank()
            ),
        ));
    }
    let (m, n) = (a.shape()[a.rank() - 2], a.shape()[a.rank() - 1]);
    if square && m != n {
        return Err(lin_err(op, "Last 2 dimensions of the array must be square"));
    }
    if m == 0 || n == 0 || a.num_elements() == 0 {
        return Err(lin_err(
            op,
            format!(
                "empty matrices (shape {}) are not supported",
                py_shape(a.shape())
            ),
        ));
    }
    Ok((m, n))
}

/// One result of a host function per matrix: values and shape.
struct Part {
    values: Vec<f64>,
    shape: Vec<usize>,
}

fn part_of(m: &DMatrix<f64>) -> Part {
    let mut values = Vec::with_capacity(m.len());
    for i in 0..m.nrows() {
        for j in 0..m.ncols() {
            values.push(m[(i, j)]);
        }
    }
    Part {
        values,
        shape: vec![m.nrows(), m.ncols()],
    }
}

fn part_of_vec(v: &DVector<f64>) -> Part {
    Part {
        values: v.iter().copied().collect(),
        shape: vec![v.len()],
    }
}

/// A host computation on one matrix of each input stack.
type MatrixFn = dyn Fn(&[DMatrix<f64>]) -> Result<Vec<Part>> + Send + Sync;

/// Runs `f` on every matrix of the stacks `inputs` (same batch shape) on the host and
/// assembles the results over the batch, recorded as one host-function op.
///
/// Inside a traced graph function this is a [`HostCall`]: one node of the graph that
/// computes on each call's inputs (the inputs are read on the host, which a traced op
/// cannot do). Its results carry no gradient either way.
fn batched(name: &'static str, inputs: &[&Tensor], f: Arc<MatrixFn>) -> Result<Vec<Tensor>> {
    if is_tracing() {
        let inputs: Vec<Tensor> = inputs.iter().map(|t| (*t).clone()).collect();
        let call = HostCall::new(name, move |ts: &[Tensor]| {
            let refs: Vec<&Tensor> = ts.iter().collect();
            batched_on_host(name, &refs, f.as_ref())
        });
        return call.call(&inputs);
    }
    batched_on_host(name, inputs, f.as_ref())
}

/// [`batched`] run now.
fn batched_on_host(name: &'static str, inputs: &[&Tensor], f: &MatrixFn) -> Result<Vec<Tensor>> {
    let dtype = out_dtype(
        inputs
            .iter()
            .map(|t| t.dtype())
            .fold(DType::Bool, promote_types),
    );
    let batch: Vec<usize> = inputs[0].shape()[..inputs[0].rank() - 2].to_vec();
    let nb: usize = batch.iter().product();
    let host: Vec<(Vec<f64>, usize, usize)> = inputs
        .iter()
        .map(|t| {
            let (m, n) = (t.shape()[t.rank() - 2], t.shape()[t.rank() - 1]);
            Ok((t.to_f64_vec()?, m, n))
        })
        .collect::<Result<_>>()?;
    let device = inputs[0].device();
    let (first, rest) = dispatch(
        || Op::HostFunction { name },
        inputs,
        |_| {
            let mut outs: Vec<(Vec<f64>, Vec<usize>)> = Vec::new();
            for b in 0..nb {
                let mats: Vec<DMatrix<f64>> = host
                    .iter()
                    .map(|(v, m, n)| {
                        DMatrix::from_row_slice(*m, *n, &v[b * m * n..(b + 1) * m * n])
                    })
                    .collect();
                let parts = f(&mats)?;
                if outs.is_empty() {
                    outs = parts
                        .iter()
                        .map(|p| (Vec::with_capacity(p.values.len() * nb), p.shape.clone()))
                        .collect();
                }
                for (o, p) in outs.iter_mut().zip(parts) {
                    o.0.extend(p.values);
                }
            }
            let mut ts = outs
                .into_iter()
                .map(|(v, s)| {
                    let mut shape = batch.clone();
                    shape.extend(s);
                    Tensor::from_host_on(HostData::from_f64_slice(dtype, &v), &shape, device)
                })
                .collect::<Result<Vec<Tensor>>>()?;
            if ts.is_empty() {
                return Err(Error::invalid(name, "empty batch"));
            }
            let first = ts.remove(0);
            Ok((first, ts))
        },
    )?;
    let mut all = vec![first];
    all.extend(rest);
    Ok(all)
}

fn one(v: Vec<Tensor>) -> Result<Tensor> {
    v.into_iter()
        .next()
        .ok_or_else(|| Error::invalid("linalg", "no result"))
}

/// `numpy.linalg.inv(a)`: the inverse of each square matrix (a singular one is an error).
pub fn inv(a: impl ArrayLike) -> Result<Tensor> {
    let a = arr(a)?;
    check_matrix("inv", &a, true)?;
    one(batched(
        "linalg.inv",
        &[&a],
        Arc::new(move |m| {
            let i = m[0]
                .clone()
                .try_inverse()
                .ok_or_else(|| lin_err("inv", "Singular matrix"))?;
            Ok(vec![part_of(&i)])
        }),
    )?)
}

/// `numpy.linalg.det(a)`: determinants (LU), shape `a.shape[:-2]`.
pub fn det(a: impl ArrayLike) -> Result<Tensor> {
    let a = arr(a)?;
    check_matrix("det", &a, true)?;
    one(batched(
        "linalg.det",
        &[&a],
        Arc::new(move |m| {
            Ok(vec![Part {
                values: vec![m[0].clone().lu().determinant()],
                shape: vec![],
            }])
        }),
    )?)
}

/// `numpy.linalg.solve(a, b)`: `x` with `a @ x = b`; `b` is a vector (`(..., M)`) or a
/// matrix of right-hand sides (`(..., M, K)`).
pub fn solve(a: impl ArrayLike, b: impl ArrayLike) -> Result<Tensor> {
    let a = arr(a)?;
    let (m, _) = check_matrix("solve", &a, true)?;
    let b = arr(b)?;
    let vector = b.rank() == a.rank() - 1;
    let b2 = if vector {
        b.expand_dims(-1)?
    } else {
        b.clone()
    };
    if b2.rank() != a.rank()
        || b2.shape()[b2.rank() - 2] != m
        || b2.shape()[..b2.rank() - 2] != a.shape()[..a.rank() - 2]
    {
        return Err(Error::invalid("solve", format!("solve: Input operand 1 has a mismatch in its core dimension 0, with gufunc signature (m,m),(m,n)->(m,n) (shapes {} and {})", py_shape(a.shape()), py_shape(b.shape()))));
    }
    let x = one(batched(
        "linalg.solve",
        &[&a, &b2],
        Arc::new(move |m| {
            let lu = m[0].clone().lu();
            let x = lu
                .solve(&m[1])
                .ok_or_else(|| lin_err("solve", "Singular matrix"))?;
            Ok(vec![part_of(&x)])
        }),
    )?)?;
    if vector {
        x.squeeze(&[-1])
    } else {
        Ok(x)
    }
}

/// nalgebra's SVD with singular values in descending order: (U m×k, s, Vᵀ k×n).
fn svd_sorted(
    op: &'static str,
    m: &DMatrix<f64>,
) -> Result<(DMatrix<f64>, DVector<f64>, DMatrix<f64>)> {
    // NaN or inf input is NumPy's LinAlgError (nalgebra would panic or loop on it)
    if m.iter().any(|v| !v.is_finite()) {
        return Err(lin_err(op, "SVD did not converge"));
    }
    let svd = m
        .clone()
        .try_svd(true, true, f64::EPSILON, MAX_ITERATIONS)
        .ok_or_else(|| lin_err(op, "SVD did not converge"))?;
    let (Some(u), Some(vt)) = (svd.u, svd.v_t) else {
        return Err(lin_err(op, "SVD did not converge"));
    };
    let s = svd.singular_values;
    let mut order: Vec<usize> = (0..s.len()).collect();
    order.sort_by(|&i, &j| s[j].total_cmp(&s[i]));
    let u = DMatrix::from_fn(u.nrows(), order.len(), |r, c| u[(r, order[c])]);
    let vt = DMatrix::from_fn(order.len(), vt.ncols(), |r, c| vt[(order[r], c)]);
    let s = DVector::from_fn(order.len(), |i, _| s[order[i]]);
    Ok((u, s, vt))
}

/// Completes the orthonormal columns of `q` (r×k) to a square orthogonal matrix.
fn complete_basis(q: &DMatrix<f64>) -> DMatrix<f64> {
    let r = q.nrows();
    let mut cols: Vec<DVector<f64>> = q.column_iter().map(|c| c.into_owned()).collect();
    for e in 0..r {
        if cols.len() == r {
            break;
        }
        let mut v = DVector::from_fn(r, |i, _| if i == e { 1.0 } else { 0.0 });
        for _ in 0..2 {
            for c in &cols {
                let d = c.dot(&v);
                v -= c * d;
            }
        }
        let n = v.norm();
        if n > 1e-10 {
            cols.push(v / n);
        }
    }
    DMatrix::from_columns(&cols)
}

/// `numpy.linalg.svd(a, full_matrices=True)`: `(u, s, vh)` with `a = u @ diag(s) @ vh`,
/// singular values descending. Singular vectors are unique only up to sign; nalgebra's
/// signs can differ from LAPACK's.
pub fn svd(a: impl ArrayLike, full_matrices: bool) -> Result<(Tensor, Tensor, Tensor)> {
    let a = arr(a)?;
    check_matrix("svd", &a, false)?;
    let r = batched(
        "linalg.svd",
        &[&a],
        Arc::new(move |m| {
            let (mut u, s, mut vt) = svd_sorted("svd", &m[0])?;
            if full_matrices {
                u = complete_basis(&u);
                vt = complete_basis(&vt.transpose()).transpose();
            }
            Ok(vec![part_of(&u), part_of_vec(&s), part_of(&vt)])
        }),
    )?;
    let mut it = r.into_iter();
    match (it.next(), it.next(), it.next()) {
        (Some(u), Some(s), Some(v)) => Ok((u, s, v)),
        _ => Err(Error::invalid("svd", "missing results")),
    }
}

/// `numpy.linalg.qr(a, mode='reduced')`: `(q, r)` with orthonormal `q` (M×K) and upper
/// triangular `r` (K×N), K = min(M, N).
pub fn qr(a: impl ArrayLike) -> Result<(Tensor, Tensor)> {
    let a = arr(a)?;
    check_matrix("qr", &a, false)?;
    let r = batched(
        "linalg.qr",
        &[&a],
        Arc::new(move |m| {
            let qr = m[0].clone().qr();
            Ok(vec![part_of(&qr.q()), part_of(&qr.r())])
        }),
    )?;
    let mut it = r.into_iter();
    match (it.next(), it.next()) {
        (Some(q), Some(r)) => Ok((q, r)),
        _ => Err(Error::invalid("qr", "missing results")),
    }
}

/// `numpy.linalg.cholesky(a)`: lower-triangular `L` with `a = L @ Lᵀ`; a matrix that is not
/// positive definite is an error.
pub fn cholesky(a: impl ArrayLike) -> Result<Tensor> {
    let a = arr(a)?;
    check_matrix("cholesky", &a, true)?;
    one(batched(
        "linalg.cholesky",
        &[&a],
        Arc::new(move |m| {
            let c = m[0]
                .clone()
                .cholesky()
                .ok_or_else(|| lin_err("cholesky", "Matrix is not positive definite"))?;
            Ok(vec![part_of(&c.l())])
        }),
    )?)
}

/// The symmetric matrix from the lower triangle (NumPy's `UPLO='L'`).
fn lower_symmetric(m: &DMatrix<f64>) -> DMatrix<f64> {
    DMatrix::from_fn(m.nrows(), m.ncols(), |i, j| {
        if i >= j {
            m[(i, j)]
        } else {
            m[(j, i)]
        }
    })
}

fn eigh_sorted(m: &DMatrix<f64>) -> Result<(DVector<f64>, DMatrix<f64>)> {
    if m.iter().any(|v| !v.is_finite()) {
        return Err(lin_err("eigh", "Eigenvalues did not converge"));
    }
    let e = lower_symmetric(m)
        .try_symmetric_eigen(f64::EPSILON, MAX_ITERATIONS)
        .ok_or_else(|| lin_err("eigh", "Eigenvalues did not converge"))?;
    let mut order: Vec<usize> = (0..e.eigenvalues.len()).collect();
    order.sort_by(|&i, &j| e.eigenvalues[i].total_cmp(&e.eigenvalues[j]));
    let w = DVector::from_fn(order.len(), |i, _| e.eigenvalues[order[i]]);
    let v = DMatrix::from_fn(m.nrows(), order.len(), |r, c| e.eigenvectors[(r, order[c])]);
    Ok((w, v))
}

/// `numpy.linalg.eigh(a)`: eigenvalues (ascending) and eigenvectors (columns) of symmetric
/// matrices, from the lower triangle. Eigenvectors are unique only up to sign.
pub fn eigh(a: impl ArrayLike) -> Result<(Tensor, Tensor)> {
    let a = arr(a)?;
    check_matrix("eigh", &a, true)?;
    let r = batched(
        "linalg.eigh",
        &[&a],
        Arc::new(move |m| {
            let (w, v) = eigh_sorted(&m[0])?;
            Ok(vec![part_of_vec(&w), part_of(&v)])
        }),
    )?;
    let mut it = r.into_iter();
    match (it.next(), it.next()) {
        (Some(w), Some(v)) => Ok((w, v)),
        _ => Err(Error::invalid("eigh", "missing results")),
    }
}

/// `numpy.linalg.eigvalsh(a)`: the eigenvalues of [`eigh`].
pub fn eigvalsh(a: impl ArrayLike) -> Result<Tensor> {
    Ok(eigh(a)?.0)
}

fn pinv_matrix(m: &DMatrix<f64>, rcond: f64) -> Result<DMatrix<f64>> {
    let (u, s, vt) = svd_sorted("pinv", m)?;
    let cutoff = rcond * s.iter().copied().fold(0.0, f64::max);
    let sinv = DVector::from_fn(s.len(), |i, _| if s[i] > cutoff { 1.0 / s[i] } else { 0.0 });
    Ok(vt.transpose() * DMatrix::from_diagonal(&sinv) * u.transpose())
}

/// `numpy.linalg.pinv(a, rcond=1e-15)`: the Moore-Penrose pseudo-inverse (singular values
/// below `rcond·max(s)` count as zero).
pub fn pinv(a: impl ArrayLike, rcond: f64) -> Result<Tensor> {
    let a = arr(a)?;
    check_matrix("pinv", &a, false)?;
    one(batched(
        "linalg.pinv",
        &[&a],
        Arc::new(move |m| Ok(vec![part_of(&pinv_matrix(&m[0], rcond)?)])),
    )?)
}

/// What [`lstsq`] returns, as `numpy.linalg.lstsq` does.
#[derive(Debug, Clone)]
pub struct Lstsq {
    /// The least-squares solution.
    pub x: Tensor,
    /// Squared residual norms per column of `b` (empty unless `a` has full column rank and
    /// more rows than columns).
    pub residuals: Tensor,
    /// The effective rank of `a`.
    pub rank: usize,
    /// `a`'s singular values, descending.
    pub s: Tensor,
}

/// `numpy.linalg.lstsq(a, b, rcond=None)`: minimises `‖b - a x‖₂` for one 2-D `a`;
/// singular values below `rcond·max(s)` are dropped (default `rcond`: machine epsilon times
/// `max(M, N)`).
pub fn lstsq(a: impl ArrayLike, b: impl ArrayLike, rcond: Option<f64>) -> Result<Lstsq> {
    let a = arr(a)?;
    let (m, n) = check_matrix("lstsq", &a, false)?;
    if a.rank() != 2 {
        return Err(lin_err(
            "lstsq",
            format!(
                "{}-dimensional array given. Array must be two-dimensional",
                a.rank()
            ),
        ));
    }
    let b = arr(b)?;
    let vector = b.rank() == 1;
    let b2 = if vector {
        b.expand_dims(-1)?
    } else {
        b.clone()
    };
    if b2.rank() != 2 || b2.shape()[0] != m {
        return Err(lin_err(
            "lstsq",
            format!(
                "Incompatible dimensions: a is {} and b is {}",
                py_shape(a.shape()),
                py_shape(b.shape())
            ),
        ));
    }
    let rcond = rcond.unwrap_or(f64::EPSILON * m.max(n) as f64);
    let k = b2.shape()[1];
    let r = batched(
        "linalg.lstsq",
        &[&a, &b2],
        Arc::new(move |mats| {
            let (u, s, vt) = svd_sorted("lstsq", &mats[0])?;
            let cutoff = rcond * s.iter().copied().fold(0.0, f64::max);
            let rank = s.iter().filter(|v| **v > cutoff).count();
            let sinv =
                DVector::from_fn(s.len(), |i, _| if s[i] > cutoff { 1.0 / s[i] } else { 0.0 });
            let x = vt.transpose() * DMatrix::from_diagonal(&sinv) * u.transpose() * &mats[1];
            let res = &mats[0] * &x - &mats[1];
            let residuals: Vec<f64> = if rank == n && m > n {
                (0..k).map(|c| res.column(c).norm_squared()).collect()
            } else {
                Vec::new()
            };
            let nres = residuals.len();
            Ok(vec![
                part_of(&x),
                Part {
                    values: residuals,
                    shape: vec![nres],
                },
                Part {
                    values: vec![rank as f64],
                    shape: vec![],
                },
                part_of_vec(&s),
            ])
        }),
    )?;
    let mut it = r.into_iter();
    let (Some(x), Some(residuals), Some(rank), Some(s)) =
        (it.next(), it.next(), it.next(), it.next())
    else {
        return Err(Error::invalid("lstsq", "missing results"));
    };
    let rank = rank.to_f64_vec()?.first().copied().unwrap_or(0.0) as usize;
    let x = if vector { x.squeeze(&[-1])? } else { x };
    Ok(Lstsq {
        x,
        residuals,
        rank,
        s,
    })
}

/// `numpy.linalg.norm`'s `ord`.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum NormOrd {
    /// `ord=None`: 2-norm of vectors, Frobenius norm of matrices.
    Default,
    /// A number: `p`-norms of vectors (`inf`, `-inf`, 0 included); for matrices 1, -1, 2,
    /// -2, inf, -inf.
    P(f64),
    /// `'fro'`: the Frobenius norm.
    Fro,
    /// `'nuc'`: the nuclear norm (sum of singular values).
    Nuc,
}
impl From<f64> for NormOrd {
    fn from(p: f64) -> NormOrd {
        NormOrd::P(p)
    }
}

/// `numpy.linalg.norm(x)`: the 2-norm of the flattened array (Frobenius for a matrix);
/// [`norm_with`] takes `ord`, `axis` and `keepdims`.
pub fn norm(x: impl ArrayLike) -> Result<Tensor> {
    norm_with(x, NormOrd::Default, None, false)
}

/// `numpy.linalg.norm(x, ord=None, axis=None, keepdims=False)`: vector norms over one axis,
/// matrix norms over two (`axis`: `None`, `i` or `[i, j]`). Norms without singular values
/// are tensor ops (differentiable, on any device).
// guards on `p` read as the NumPy docs' table (inf, -inf, 0, 1, 2, other p)
#[allow(clippy::redundant_guards)]
pub fn norm_with(
    x: impl ArrayLike,
    ord: NormOrd,
    axis: impl Into<ferroflow_tensor::Axes>,
    keepdims: bool,
) -> Result<Tensor> {
    let axis: Option<Vec<isize>> = match axis.into() {
        ferroflow_tensor::Axes::All => None,
        ferroflow_tensor::Axes::List(v) => Some(v),
    };
    let x = arr(x)?;
    let x = x.cast(out_dtype(x.dtype()))?;
    let axes: Vec<usize> = match axis {
        None => {
            if ord == NormOrd::Default {
                let r = x
                    .square()?
                    .reduce_sum(ferroflow_tensor::Axes::All, false)?
                    .sqrt()?;
                return if keepdims {
                    r.reshape(&vec![1isize; x.rank()])
                } else {
                    Ok(r)
                };
            }
            (0..x.rank()).collect()
        }
        Some(a) => crate::util::norm_axes("norm", &a, x.rank())?,
    };
    let ax: Vec<isize> = axes.iter().map(|a| *a as isize).collect();
    match axes.len() {
        1 => {
            let a = x.abs()?;
            match ord {
                NormOrd::Default => a.square()?.reduce_sum(ax, keepdims)?.sqrt(),
                NormOrd::P(p) if p == f64::INFINITY => a.reduce_max(ax, keepdims),
                NormOrd::P(p) if p == f64::NEG_INFINITY => a.reduce_min(ax, keepdims),
                NormOrd::P(p) if p == 0.0 => a
                    .not_equal(&a.scalar_like(0.0)?)?
                    .cast(a.dtype())?
                    .reduce_sum(ax, keepdims),
                NormOrd::P(p) if p == 1.0 => a.reduce_sum(ax, keepdims),
                NormOrd::P(p) if p == 2.0 => a.square()?.reduce_sum(ax, keepdims)?.sqrt(),
                NormOrd::P(p) => a
                    .pow(&a.scalar_like(p)?)?
                    .reduce_sum(ax, keepdims)?
                    .pow(&a.scalar_like(1.0 / p)?),
                NormOrd::Fro | NormOrd::Nuc => {
                    Err(Error::invalid("norm", "Invalid norm order for vectors."))
                }
            }
        }
        2 => {
            let (r, c) = (ax[0], ax[1]);
            if axes[0] == axes[1] {
                return Err(Error::invalid("norm", "Duplicate axes given."));
            }
            let a = x.abs()?;
            let keep = |t: Tensor| -> Result<Tensor> {
                if keepdims {
                    let mut t = t;
                    for d in axes
                        .iter()
                        .copied()
                        .collect::<std::collections::BTreeSet<_>>()
                    {
                        t = t.expand_dims(d as isize)?;
                    }
                    Ok(t)
                } else {
                    Ok(t)
                }
            };
            // reduce the first-listed axis, then the other (its index shifts if it was after)
            let other =
                |first: isize, second: isize| if second > first { second - 1 } else { second };
            match ord {
                NormOrd::Default | NormOrd::Fro => {
                    keep(a.square()?.reduce_sum(vec![r, c], false)?.sqrt()?)
                }
                NormOrd::P(p) if p == 1.0 => keep(
                    a.reduce_sum(vec![r], false)?
                        .reduce_max(vec![other(r, c)], false)?,
                ),
                NormOrd::P(p) if p == -1.0 => keep(
                    a.reduce_sum(vec![r], false)?
                        .reduce_min(vec![other(r, c)], false)?,
                ),
                NormOrd::P(p) if p == f64::INFINITY => keep(
                    a.reduce_sum(vec![c], false)?
                        .reduce_max(vec![other(c, r)], false)?,
                ),
                NormOrd::P(p) if p == f64::NEG_INFINITY => keep(
                    a.reduce_sum(vec![c], false)?
                        .reduce_min(vec![other(c, r)], false)?,
                ),
                NormOrd::P(p) if p == 2.0 || p == -2.0 => {
                    let m = crate::shape::moveaxis(&x, [r, c], [-2, -1])?;
                    let s = svd(&m, false)?.1;
                    keep(if p > 0.0 {
                        s.reduce_max(vec![-1], false)?
                    } else {
                        s.reduce_min(vec![-1], false)?
                    })
                }
                NormOrd::Nuc => {
                    let m = crate::shape::moveaxis(&x, [r, c], [-2, -1])?;
                    keep(svd(&m, false)?.1.reduce_sum(vec![-1], false)?)
                }
                NormOrd::P(_) => Err(Error::invalid("norm", "Invalid norm order for matrices.")),
            }
        }
        _ => Err(Error::invalid(
            "norm",
            "Improper number of dimensions to norm.",
        )),
    }
}

/// `numpy.linalg.matrix_power(a, n)`: `a` multiplied by itself `n` times (by squaring);
/// `n = 0` gives identities, negative `n` powers of the inverse.
pub fn matrix_power(a: impl ArrayLike, n: i64) -> Result<Tensor> {
    let a = arr(a)?;
    let (m, _) = check_matrix("matrix_power", &a, true)?;
    let mut base = if n < 0 { inv(&a)? } else { a.clone() };
    let mut e = n.unsigned_abs();
    if e == 0 {
        let eye = crate::creation::eye_with(m, None, 0, a.dtype())?.to_device(a.device())?;
        return eye.broadcast_to(a.shape())?.contiguous();
    }
    let mut result: Option<Tensor> = None;
    while e > 0 {
        if e & 1 == 1 {
            result = Some(match result {
                None => base.clone(),
                Some(r) => crate::products::matmul(&r, &base)?,
            });
        }
        e >>= 1;
        if e > 0 {
            base = crate::products::matmul(&base, &base)?;
        }
    }
    result.ok_or_else(|| Error::invalid("matrix_power", "no result"))
}
