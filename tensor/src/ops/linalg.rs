//! `matmul`: batched matrix products with transposes and broadcast batch axes.

use crate::backend::Operand;
use crate::dispatch::dispatch;
use crate::dtype::DType;
use crate::error::{Error, Result};
use crate::layout::broadcast_shapes;
use crate::op::Op;
use crate::tensor::Tensor;

impl Tensor {
    /// `self @ rhs` over the last two axes; leading axes broadcast (`tf.linalg.matmul`).
    pub fn matmul(&self, rhs: &Tensor) -> Result<Tensor> {
        self.matmul_t(rhs, false, false)
    }

    /// `op(self) @ op(rhs)` where `op` transposes the last two axes when asked.
    /// Transposes are free: the kernel reads through the transposed layout.
    pub fn matmul_t(&self, rhs: &Tensor, transpose_a: bool, transpose_b: bool) -> Result<Tensor> {
        if self.dtype() != rhs.dtype() {
            return Err(Error::DTypeMismatch {
                op: "matmul",
                lhs: self.dtype(),
                rhs: rhs.dtype(),
            });
        }
        if !(self.dtype().is_float()
            || self.dtype().is_complex()
            || matches!(self.dtype(), DType::I32 | DType::I64))
        {
            return Err(Error::UnsupportedDType {
                op: "matmul",
                dtype: self.dtype(),
                expected: "a float or complex dtype, int32 or int64",
            });
        }
        if self.rank() < 2 || rhs.rank() < 2 {
            return Err(Error::ShapeMismatch {
                op: "matmul",
                msg: "both inputs need rank >= 2",
                lhs: self.shape().to_vec(),
                rhs: rhs.shape().to_vec(),
            });
        }
        let la = if transpose_a {
            self.layout().permute(&swap_last(self.rank()))?
        } else {
            self.layout().clone()
        };
        let lb = if transpose_b {
            rhs.layout().permute(&swap_last(rhs.rank()))?
        } else {
            rhs.layout().clone()
        };
        let (ra, rb) = (la.rank(), lb.rank());
        let (m, k) = (la.shape()[ra - 2], la.shape()[ra - 1]);
        let (k2, n) = (lb.shape()[rb - 2], lb.shape()[rb - 1]);
        if k != k2 {
            return Err(Error::ShapeMismatch {
                op: "matmul",
                msg: "inner dimensions differ",
                lhs: la.shape().to_vec(),
                rhs: lb.shape().to_vec(),
            });
        }
        let batch = broadcast_shapes("matmul", &la.shape()[..ra - 2], &lb.shape()[..rb - 2])?;
        let with = |tail: [usize; 2]| {
            let mut s = batch.clone();
            s.extend(tail);
            s
        };
        let la = la.broadcast_to("matmul", &with([m, k]))?;
        let lb = lb.broadcast_to("matmul", &with([k, n]))?;
        let out_shape = with([m, n]);
        dispatch(
            || Op::MatMul {
                transpose_a,
                transpose_b,
            },
            &[self, rhs],
            |p| {
                p.check_output("matmul", la.shape(), self.dtype())?;
                p.check_output("matmul", lb.shape(), self.dtype())?;
                if p.check_output("matmul", &out_shape, self.dtype())? == 0 {
                    return p.empty(&out_shape, self.dtype());
                }
                let buf = p.backend.matmul(
                    Operand {
                        layout: &la,
                        ..self.operand()
                    },
                    Operand {
                        layout: &lb,
                        ..rhs.operand()
                    },
                )?;
                Ok(Tensor::from_buffer(
                    buf,
                    &out_shape,
                    self.dtype(),
                    p.backend,
                    p.device,
                ))
            },
        )
    }
}

fn swap_last(rank: usize) -> Vec<usize> {
    let mut p: Vec<usize> = (0..rank).collect();
    p.swap(rank - 2, rank - 1);
    p
}
