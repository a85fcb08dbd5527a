//! Fused optimizer updates: an optional backend kernel ([`crate::fused`]) that does in one
//! pass what a chain of primitives does in many (optimizers compose the chain where the
//! backend has none).

use crate::device::{backend_for, device_has_fused};
use crate::dispatch::dispatch;
use crate::error::{Error, Result};
use crate::fused::{FusedKernel, UpdateRule};
use crate::op::Op;
use crate::tensor::Tensor;

impl Tensor {
    /// One optimizer step by `rule` on variable value `w`, gradient `g` and the rule's
    /// slots, returning `(w', slots')`. `Err(NotSupportedByBackend)` when the backend has no
    /// fused kernel for the dtype (ask [`crate::device_has_fused`] first).
    pub fn optimizer_update(
        rule: &UpdateRule,
        w: &Tensor,
        g: &Tensor,
        slots: &[Tensor],
    ) -> Result<(Tensor, Vec<Tensor>)> {
        if slots.len() != rule.num_slots() {
            return Err(Error::invalid(
                "optimizer_update",
                format!(
                    "{rule:?} takes {} slots, got {}",
                    rule.num_slots(),
                    slots.len()
                ),
            ));
        }
        for t in std::iter::once(g).chain(slots) {
            if t.shape() != w.shape() {
                return Err(Error::ShapeMismatch {
                    op: "optimizer_update",
                    msg: "the variable, gradient and slots must have one shape",
                    lhs: w.shape().to_vec(),
                    rhs: t.shape().to_vec(),
                });
            }
            if t.dtype() != w.dtype() {
                return Err(Error::DTypeMismatch {
                    op: "optimizer_update",
                    lhs: w.dtype(),
                    rhs: t.dtype(),
                });
            }
        }
        if !w.dtype().is_float() {
            return Err(Error::UnsupportedDType {
                op: "optimizer_update",
                dtype: w.dtype(),
                expected: "a float dtype",
            });
        }
        if !device_has_fused(w.device(), FusedKernel::OptimizerUpdate, w.dtype()) {
            return Err(Error::NotSupportedByBackend {
                op: "optimizer_update",
                backend: backend_for(w.device())?.name(),
                detail: format!(
                    ", {}: it declares no fused optimizer update for it (`Backend::has_fused`)",
                    w.dtype()
                ),
            });
        }
        let mut inputs = vec![w, g];
        inputs.extend(slots.iter());
        dispatch(
            || Op::OptimizerUpdate(*rule),
            &inputs,
            |p| {
                let ops: Vec<_> = slots.iter().map(|s| s.operand()).collect();
                let (nw, ns) = p
                    .backend
                    .optimizer_update(rule, w.operand(), g.operand(), &ops)?;
                let mk = |buf| Tensor::from_buffer(buf, w.shape(), w.dtype(), p.backend, p.device);
                Ok((mk(nw), ns.into_iter().map(mk).collect()))
            },
        )
    }
}
