//! Reductions: `reduce_sum`, `reduce_mean`, `reduce_prod`, `reduce_max`, `reduce_min`,
//! `reduce_any`, `reduce_all`, `reduce_logsumexp`, `argmax`, `argmin`.

use crate::dispatch::dispatch;
use crate::dtype::DType;
use crate::error::{Error, Result};
use crate::layout::{normalize_axes, normalize_axis};
use crate::op::{ArgReduceOp, Op, ReduceOp};
use crate::tensor::Tensor;

/// Which axes a reduction runs over: all of them (TF's `axis=None`) or a list (possibly
/// negative, possibly empty, which reduces nothing).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Axes {
    /// Every axis.
    All,
    /// These axes.
    List(Vec<isize>),
}

/// NumPy's `axis=None` (every axis) or one axis.
impl From<Option<isize>> for Axes {
    fn from(a: Option<isize>) -> Axes {
        match a {
            None => Axes::All,
            Some(a) => Axes::List(vec![a]),
        }
    }
}
impl From<isize> for Axes {
    fn from(a: isize) -> Axes {
        Axes::List(vec![a])
    }
}
impl From<i32> for Axes {
    fn from(a: i32) -> Axes {
        Axes::List(vec![a as isize])
    }
}
impl From<&[isize]> for Axes {
    fn from(a: &[isize]) -> Axes {
        Axes::List(a.to_vec())
    }
}
impl From<&Vec<isize>> for Axes {
    fn from(a: &Vec<isize>) -> Axes {
        Axes::List(a.clone())
    }
}
/// A pair of axes (NumPy's `axes=(0, 1)`).
impl From<(isize, isize)> for Axes {
    fn from((a, b): (isize, isize)) -> Axes {
        Axes::List(vec![a, b])
    }
}
impl From<Vec<isize>> for Axes {
    fn from(a: Vec<isize>) -> Axes {
        Axes::List(a)
    }
}
impl<const N: usize> From<&[isize; N]> for Axes {
    fn from(a: &[isize; N]) -> Axes {
        Axes::List(a.to_vec())
    }
}
impl<const N: usize> From<[isize; N]> for Axes {
    fn from(a: [isize; N]) -> Axes {
        Axes::List(a.to_vec())
    }
}

impl Axes {
    /// Normalised, sorted axes for a rank.
    pub fn resolve(&self, op: &'static str, rank: usize) -> Result<Vec<usize>> {
        match self {
            Axes::All => Ok((0..rank).collect()),
            Axes::List(v) => normalize_axes(op, v, rank),
        }
    }
}

fn reduced_shape(shape: &[usize], axes: &[usize], keepdims: bool) -> Vec<usize> {
    let mut out = Vec::with_capacity(shape.len());
    for (i, &d) in shape.iter().enumerate() {
        if !axes.contains(&i) {
            out.push(d);
        } else if keepdims {
            out.push(1);
        }
    }
    out
}

impl Tensor {
    /// Applies a reduction primitive over `axes`.
    pub fn reduce(&self, op: ReduceOp, axes: impl Into<Axes>, keepdims: bool) -> Result<Tensor> {
        let axes = axes.into().resolve(op.name(), self.rank())?;
        let dtype = self.dtype();
        let ok = match op {
            ReduceOp::ReduceAny | ReduceOp::ReduceAll => dtype == DType::Bool,
            // complex numbers have sums and products, no order
            ReduceOp::ReduceMax | ReduceOp::ReduceMin => {
                dtype != DType::Bool && !dtype.is_complex()
            }
            _ => dtype != DType::Bool,
        };
        if op == ReduceOp::ReduceMean
            && dtype.is_int()
            && axes.iter().any(|&a| self.shape()[a] == 0)
        {
            return Err(Error::Arithmetic {
                op: "reduce_mean",
                msg: "mean of an empty integer set",
            });
        }
        if !ok {
            let expected = if matches!(op, ReduceOp::ReduceAny | ReduceOp::ReduceAll) {
                "bool"
            } else if dtype.is_complex() {
                "a real dtype (complex numbers have no order)"
            } else {
                "a numeric dtype"
            };
            return Err(Error::UnsupportedDType {
                op: op.name(),
                dtype,
                expected,
            });
        }
        dispatch(
            || Op::Reduce {
                op,
                axes: axes.clone(),
                keepdims,
            },
            &[self],
            |p| {
                let shape = reduced_shape(self.shape(), &axes, keepdims);
                // Reducing over an empty axis makes an output larger than the input.
                if p.check_output(op.name(), &shape, dtype)? == 0 {
                    return p.empty(&shape, dtype);
                }
                let buf = p.backend.reduce(op, self.operand(), &axes)?;
                Ok(Tensor::from_buffer(buf, &shape, dtype, p.backend, p.device))
            },
        )
    }
    /// Σ over `axes` (`tf.reduce_sum`); f16/bf16 accumulate in f32.
    pub fn reduce_sum(&self, axes: impl Into<Axes>, keepdims: bool) -> Result<Tensor> {
        self.reduce(ReduceOp::ReduceSum, axes, keepdims)
    }
    /// Π over `axes`.
    pub fn reduce_prod(&self, axes: impl Into<Axes>, keepdims: bool) -> Result<Tensor> {
        self.reduce(ReduceOp::ReduceProd, axes, keepdims)
    }
    /// Maximum over `axes` (the dtype's lowest value for an empty set, as TF).
    pub fn reduce_max(&self, axes: impl Into<Axes>, keepdims: bool) -> Result<Tensor> {
        self.reduce(ReduceOp::ReduceMax, axes, keepdims)
    }
    /// Minimum over `axes`.
    pub fn reduce_min(&self, axes: impl Into<Axes>, keepdims: bool) -> Result<Tensor> {
        self.reduce(ReduceOp::ReduceMin, axes, keepdims)
    }
    /// Logical or over `axes`.
    pub fn reduce_any(&self, axes: impl Into<Axes>, keepdims: bool) -> Result<Tensor> {
        self.reduce(ReduceOp::ReduceAny, axes, keepdims)
    }
    /// Logical and over `axes`.
    pub fn reduce_all(&self, axes: impl Into<Axes>, keepdims: bool) -> Result<Tensor> {
        self.reduce(ReduceOp::ReduceAll, axes, keepdims)
    }
    /// Mean over `axes` (`tf.reduce_mean`, TF's `Mean`): sum / count in one op. Integers
    /// divide with truncation as in TF; f16/bf16 accumulate and divide in f32; an empty set
    /// gives NaN for floats and an error for integers.
    pub fn reduce_mean(&self, axes: impl Into<Axes>, keepdims: bool) -> Result<Tensor> {
        self.reduce(ReduceOp::ReduceMean, axes, keepdims)
    }
    /// `log(Σ exp(x))` over `axes`, computed stably by subtracting the maximum.
    pub fn reduce_logsumexp(&self, axes: impl Into<Axes>, keepdims: bool) -> Result<Tensor> {
        if !self.dtype().is_float() {
            return Err(Error::UnsupportedDType {
                op: "reduce_logsumexp",
                dtype: self.dtype(),
                expected: "a float dtype",
            });
        }
        let axes = axes.into();
        let m = self.reduce_max(axes.clone(), true)?;
        // An infinite or empty maximum must not turn the shift into NaN.
        let m = Tensor::select(&m.is_finite()?, &m, &m.zeros_like()?)?;
        let s = self
            .sub(&m)?
            .exp()?
            .reduce_sum(axes.clone(), true)?
            .log()?
            .add(&m)?;
        let resolved = axes.resolve("reduce_logsumexp", self.rank())?;
        if keepdims || resolved.is_empty() {
            Ok(s)
        } else {
            s.squeeze(&resolved.iter().map(|&a| a as isize).collect::<Vec<_>>())
        }
    }
    /// Index (int64) of the largest value along `axis` (first on ties, NaN wins).
    pub fn argmax(&self, axis: isize) -> Result<Tensor> {
        self.arg_reduce(ArgReduceOp::ArgMax, axis)
    }
    /// Index (int64) of the smallest value along `axis`.
    pub fn argmin(&self, axis: isize) -> Result<Tensor> {
        self.arg_reduce(ArgReduceOp::ArgMin, axis)
    }
    pub(crate) fn arg_reduce(&self, op: ArgReduceOp, axis: isize) -> Result<Tensor> {
        let axis = normalize_axis(op.name(), axis, self.rank())?;
        if self.dtype() == DType::Bool || self.dtype().is_complex() {
            return Err(Error::UnsupportedDType {
                op: op.name(),
                dtype: self.dtype(),
                expected: "a real numeric dtype",
            });
        }
        if self.shape()[axis] == 0 {
            return Err(Error::invalid(
                op.name(),
                format!("axis {axis} of shape {:?} is empty", self.shape()),
            ));
        }
        dispatch(
            || Op::ArgReduce { op, axis },
            &[self],
            |p| {
                let shape = reduced_shape(self.shape(), &[axis], false);
                if self.num_elements() == 0 {
                    return p.empty(&shape, DType::I64);
                }
                let buf = p.backend.arg_reduce(op, self.operand(), axis)?;
                Ok(Tensor::from_buffer(
                    buf,
                    &shape,
                    DType::I64,
                    p.backend,
                    p.device,
                ))
            },
        )
    }
}
