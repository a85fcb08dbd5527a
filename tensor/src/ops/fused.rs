//! Fused optimizer updates: optional backend kernels that do in one pass what a chain of
//! primitives does in many (the optimizer falls back to the chain when a backend has none).

use crate::dispatch::dispatch;
use crate::error::{Error, Result};
use crate::op::{AdamStep, Op};
use crate::tensor::Tensor;

impl Tensor {
    /// One Adam/AdamW step on `(w, g, m, v)`, returning `(w', m', v')`; see [`AdamStep`].
    /// `Err(NotSupportedByBackend)` when the backend has no fused kernel.
    pub fn adam_update(
        w: &Tensor,
        g: &Tensor,
        m: &Tensor,
        v: &Tensor,
        step: &AdamStep,
    ) -> Result<(Tensor, Tensor, Tensor)> {
        for t in [g, m, v] {
            if t.shape() != w.shape() {
                return Err(Error::ShapeMismatch {
                    op: "adam_update",
                    msg: "w, g, m and v must have one shape",
                    lhs: w.shape().to_vec(),
                    rhs: t.shape().to_vec(),
                });
            }
            if t.dtype() != w.dtype() {
                return Err(Error::DTypeMismatch {
                    op: "adam_update",
                    lhs: w.dtype(),
                    rhs: t.dtype(),
                });
            }
        }
        if !w.dtype().is_float() {
            return Err(Error::UnsupportedDType {
                op: "adam_update",
                dtype: w.dtype(),
                expected: "a float dtype",
            });
        }
        dispatch(
            || Op::AdamUpdate(*step),
            &[w, g, m, v],
            |p| {
                let (a, b, c) = p.backend.adam_update(
                    w.operand(),
                    g.operand(),
                    m.operand(),
                    v.operand(),
                    step,
                )?;
                let mk = |buf| Tensor::from_buffer(buf, w.shape(), w.dtype(), p.backend, p.device);
                Ok((mk(a), mk(b), mk(c)))
            },
        )
    }
}
