//! Scans and sorting: `cumsum`, `cumprod` (primitives), `sort`/`argsort` (one primitive
//! returning values and indices) and `top_k` composed from it.

use crate::dispatch::dispatch;
use crate::dtype::DType;
use crate::error::{Error, Result};
use crate::layout::normalize_axis;
use crate::op::{CumulativeOp, Op};
use crate::tensor::Tensor;

impl Tensor {
    /// Running sum/product along `axis` (`tf.math.cumsum`/`cumprod` with `exclusive`,
    /// `reverse`).
    pub fn cumulative(
        &self,
        op: CumulativeOp,
        axis: isize,
        exclusive: bool,
        reverse: bool,
    ) -> Result<Tensor> {
        let axis = normalize_axis(op.name(), axis, self.rank())?;
        if self.dtype() == DType::Bool {
            return Err(Error::UnsupportedDType {
                op: op.name(),
                dtype: DType::Bool,
                expected: "a numeric dtype",
            });
        }
        dispatch(
            || Op::Cumulative {
                op,
                axis,
                exclusive,
                reverse,
            },
            &[self],
            |p| {
                if self.num_elements() == 0 {
                    return p.empty(self.shape(), self.dtype());
                }
                let buf = p
                    .backend
                    .cumulative(op, self.operand(), axis, exclusive, reverse)?;
                Ok(Tensor::from_buffer(
                    buf,
                    self.shape(),
                    self.dtype(),
                    p.backend,
                    p.device,
                ))
            },
        )
    }
    /// `tf.math.cumsum`.
    pub fn cumsum(&self, axis: isize, exclusive: bool, reverse: bool) -> Result<Tensor> {
        self.cumulative(CumulativeOp::Cumsum, axis, exclusive, reverse)
    }
    /// `tf.math.cumprod`.
    pub fn cumprod(&self, axis: isize, exclusive: bool, reverse: bool) -> Result<Tensor> {
        self.cumulative(CumulativeOp::Cumprod, axis, exclusive, reverse)
    }

    /// Stable sort along `axis`: (values, int32 indices). NaN sorts above every number.
    pub fn sort_with_indices(&self, axis: isize, descending: bool) -> Result<(Tensor, Tensor)> {
        let axis = normalize_axis("sort", axis, self.rank())?;
        if self.dtype() == DType::Bool || self.dtype().is_complex() {
            return Err(Error::UnsupportedDType {
                op: "sort",
                dtype: self.dtype(),
                expected: "a real numeric dtype",
            });
        }
        if self.shape()[axis] > i32::MAX as usize {
            return Err(Error::invalid(
                "sort",
                format!(
                    "a line of {} elements along axis {axis}: its int32 indices stop at {}",
                    self.shape()[axis],
                    i32::MAX
                ),
            ));
        }
        dispatch(
            || Op::Sort { axis, descending },
            &[self],
            |p| {
                if self.num_elements() == 0 {
                    return Ok((
                        p.empty(self.shape(), self.dtype())?,
                        p.empty(self.shape(), DType::I32)?,
                    ));
                }
                let (v, i) = p.backend.sort(self.operand(), axis, descending)?;
                Ok((
                    Tensor::from_buffer(v, self.shape(), self.dtype(), p.backend, p.device),
                    Tensor::from_buffer(i, self.shape(), DType::I32, p.backend, p.device),
                ))
            },
        )
    }
    /// `tf.sort`.
    pub fn sort(&self, axis: isize, descending: bool) -> Result<Tensor> {
        Ok(self.sort_with_indices(axis, descending)?.0)
    }
    /// `tf.argsort` (stable).
    pub fn argsort(&self, axis: isize, descending: bool) -> Result<Tensor> {
        Ok(self.sort_with_indices(axis, descending)?.1)
    }
    /// `tf.math.top_k` along the last axis: (values, int32 indices), largest first, lower
    /// index first among equals.
    pub fn top_k(&self, k: usize) -> Result<(Tensor, Tensor)> {
        if self.rank() == 0 {
            return Err(Error::invalid("top_k", "input must have rank >= 1"));
        }
        let n = self.shape()[self.rank() - 1];
        if k > n {
            return Err(Error::invalid(
                "top_k",
                format!(
                    "k = {k} exceeds the last axis size {n} of shape {:?}",
                    self.shape()
                ),
            ));
        }
        let (v, i) = self.sort_with_indices(-1, true)?;
        let mut size: Vec<isize> = vec![-1; self.rank()];
        size[self.rank() - 1] = k as isize;
        let begin = vec![0; self.rank()];
        Ok((v.slice(&begin, &size)?, i.slice(&begin, &size)?))
    }
}
