//! `matmul`: batched matrix products with transposes and broadcast batch axes.

use crate::backend::{BufferBox, Operand};
use crate::device::device_has_fused;
use crate::dispatch::{dispatch, Placement};
use crate::dtype::DType;
use crate::error::{Error, Result};
use crate::fused::{FusedActivation, FusedKernel};
use crate::layout::{broadcast_shapes, Layout};
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
        let (la, lb, out_shape) = self.matmul_layouts(rhs, transpose_a, transpose_b)?;
        dispatch(
            || Op::MatMul {
                transpose_a,
                transpose_b,
            },
            &[self, rhs],
            |p| {
                run_product("matmul", self, rhs, (&la, &lb, &out_shape), &p, |a, b| {
                    p.backend.matmul(a, b)
                })
            },
        )
    }

    /// `activation(self @ rhs + bias)` (`bias` along the last axis, as a Dense layer adds
    /// it), in one kernel where the backend has it (TF's `_FusedMatMul` with `BiasAdd` and
    /// an optional `Relu`: the bias and activation applied as the product is stored), else
    /// composed. What a graph function's pass makes of a Dense layer's forward.
    ///
    /// ```no_run
    /// // A backend registered first: `ferroflow::init()` (the facade).
    /// use ferroflow_tensor::{FusedActivation, Tensor};
    /// let x = Tensor::from_vec(vec![1.0f32, 2.0], &[1, 2])?;
    /// let w = Tensor::from_vec(vec![1.0f32, -1.0, 1.0, -1.0], &[2, 2])?;
    /// let b = Tensor::from_vec(vec![0.5f32, 0.5], &[2])?;
    /// let y = x.fused_matmul(&w, &b, FusedActivation::Relu)?;
    /// assert_eq!(y.to_vec::<f32>()?, vec![3.5, 0.0]);
    /// # Ok::<(), ferroflow_tensor::Error>(())
    /// ```
    pub fn fused_matmul(
        &self,
        rhs: &Tensor,
        bias: &Tensor,
        activation: FusedActivation,
    ) -> Result<Tensor> {
        const OP: &str = "fused_matmul";
        if !self.dtype().is_float() {
            return Err(Error::UnsupportedDType {
                op: OP,
                dtype: self.dtype(),
                expected: "a float dtype",
            });
        }
        let (la, lb, out_shape) = self.matmul_layouts(rhs, false, false)?;
        if bias.dtype() != self.dtype() {
            return Err(Error::DTypeMismatch {
                op: OP,
                lhs: self.dtype(),
                rhs: bias.dtype(),
            });
        }
        let n = out_shape[out_shape.len() - 1];
        if bias.shape() != [n] {
            return Err(Error::ShapeMismatch {
                op: OP,
                msg: "the bias must be a vector as long as the product's last axis",
                lhs: out_shape,
                rhs: bias.shape().to_vec(),
            });
        }
        if !device_has_fused(self.device(), FusedKernel::FusedMatMul, self.dtype()) {
            let y = self.matmul(rhs)?.add(bias)?;
            return match activation {
                FusedActivation::Linear => Ok(y),
                FusedActivation::Relu => y.relu(),
            };
        }
        dispatch(
            || Op::FusedMatMul(activation),
            &[self, rhs, bias],
            |p| {
                run_product(OP, self, rhs, (&la, &lb, &out_shape), &p, |a, b| {
                    p.backend.fused_matmul(a, b, bias.operand(), activation)
                })
            },
        )
    }

    /// The operands' layouts for a product (transposed as asked, batch axes broadcast) and
    /// the output shape, or the error naming what does not fit.
    pub(crate) fn matmul_layouts(
        &self,
        rhs: &Tensor,
        transpose_a: bool,
        transpose_b: bool,
    ) -> Result<(Layout, Layout, Vec<usize>)> {
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
        Ok((la, lb, with([m, n])))
    }
}

/// Runs a product's kernel on `p`: the operands' and the output's sizes checked, an empty
/// output without a kernel, the operands read through the product's layouts.
fn run_product(
    op: &'static str,
    a: &Tensor,
    b: &Tensor,
    (la, lb, out_shape): (&Layout, &Layout, &[usize]),
    p: &Placement<'_>,
    kernel: impl FnOnce(Operand<'_>, Operand<'_>) -> Result<BufferBox>,
) -> Result<Tensor> {
    p.check_output(op, la.shape(), a.dtype())?;
    p.check_output(op, lb.shape(), a.dtype())?;
    if p.check_output(op, out_shape, a.dtype())? == 0 {
        return p.empty(out_shape, a.dtype());
    }
    let buf = kernel(
        Operand {
            layout: la,
            ..a.operand()
        },
        Operand {
            layout: lb,
            ..b.operand()
        },
    )?;
    Ok(Tensor::from_buffer(
        buf,
        out_shape,
        a.dtype(),
        p.backend,
        p.device,
    ))
}

fn swap_last(rank: usize) -> Vec<usize> {
    let mut p: Vec<usize> = (0..rank).collect();
    p.swap(rank - 2, rank - 1);
    p
}
