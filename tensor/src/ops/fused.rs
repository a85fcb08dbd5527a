//! Fused optimizer updates: an optional backend kernel ([`crate::fused`]) that does in one
//! pass what a chain of primitives does in many (optimizers compose the chain where the
//! backend has none).

use crate::backend::UpdateOperands;
use crate::device::{backend_for, device_has_fused};
use crate::dispatch::dispatch;
use crate::error::{Error, Result};
use crate::fused::{ElementwiseProgram, ElementwiseStep, FusedKernel, UpdateRule};
use crate::op::{Op, ReduceOp};
use crate::ops::Axes;
use crate::tensor::Tensor;
use std::sync::Arc;

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
        check_update("optimizer_update", rule, w, g, slots)?;
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

    /// [`Tensor::optimizer_update`] of several variables by one rule: `(w, g, slots)` per
    /// variable (shapes may differ between variables; one dtype and device for all),
    /// returning `(w', slots')` per variable, in order. One kernel where the backend can
    /// (wgpu: as many variables per kernel as its binding limit allows), the same numbers
    /// as one update per variable; nothing is computed when any variable is refused.
    ///
    /// ```no_run
    /// // A backend registered first: `ferroflow::init()` (the facade).
    /// use ferroflow_tensor::{Tensor, UpdateRule};
    /// let rule = UpdateRule::Adagrad { lr: 0.1, epsilon: 1e-7 };
    /// let (w1, w2) = (Tensor::from_vec(vec![1.0f32, 2.0], &[2])?, Tensor::scalar(3.0f32)?);
    /// let (g1, g2) = (Tensor::from_vec(vec![0.5f32, 0.5], &[2])?, Tensor::scalar(1.0f32)?);
    /// let acc1 = Tensor::from_vec(vec![0.1f32, 0.1], &[2])?;
    /// let acc2 = Tensor::scalar(0.1f32)?;
    /// let updated = Tensor::optimizer_update_group(
    ///     &rule,
    ///     &[(w1, g1, vec![acc1]), (w2, g2, vec![acc2])],
    /// )?;
    /// assert_eq!(updated.len(), 2);
    /// # Ok::<(), ferroflow_tensor::Error>(())
    /// ```
    pub fn optimizer_update_group(
        rule: &UpdateRule,
        variables: &[(Tensor, Tensor, Vec<Tensor>)],
    ) -> Result<Vec<(Tensor, Vec<Tensor>)>> {
        const OP: &str = "optimizer_update_group";
        let Some((w0, _, _)) = variables.first() else {
            return Ok(vec![]);
        };
        for (w, g, slots) in variables {
            check_update(OP, rule, w, g, slots)?;
            if w.dtype() != w0.dtype() {
                return Err(Error::DTypeMismatch {
                    op: OP,
                    lhs: w0.dtype(),
                    rhs: w.dtype(),
                });
            }
        }
        let inputs: Vec<&Tensor> = variables
            .iter()
            .flat_map(|(w, g, slots)| [w, g].into_iter().chain(slots))
            .collect();
        dispatch(
            || Op::OptimizerUpdateGroup(*rule),
            &inputs,
            |p| {
                let operands: Vec<UpdateOperands<'_>> = variables
                    .iter()
                    .map(|(w, g, slots)| UpdateOperands {
                        w: w.operand(),
                        g: g.operand(),
                        slots: slots.iter().map(|s| s.operand()).collect(),
                    })
                    .collect();
                let updated = p.backend.optimizer_update_group(rule, &operands)?;
                if updated.len() != variables.len() {
                    return Err(Error::Backend {
                        backend: p.backend.name(),
                        msg: format!(
                            "{OP} returned {} updates for {} variables",
                            updated.len(),
                            variables.len()
                        ),
                    });
                }
                Ok(updated
                    .into_iter()
                    .zip(variables)
                    .map(|((nw, ns), (w, _, _))| {
                        let mk = |buf| {
                            Tensor::from_buffer(buf, w.shape(), w.dtype(), p.backend, p.device)
                        };
                        (mk(nw), ns.into_iter().map(mk).collect())
                    })
                    .collect())
            },
        )
    }

    /// Runs an elementwise program ([`ElementwiseProgram`]) over `inputs` (one float dtype,
    /// broadcast together): one kernel pass where the backend has the fused kernel, else its
    /// ops one by one. Every output has the inputs' broadcast shape. Graph functions' fusion
    /// pass makes these from chains of unary and binary ops; the gradient recomputes the
    /// program's ops under a tape.
    ///
    /// ```no_run
    /// // A backend registered first: `ferroflow::init()` (the facade).
    /// use ferroflow_tensor::{BinaryOp, ElementwiseProgram, ElementwiseStep, Tensor, UnaryOp};
    /// use std::sync::Arc;
    /// let p = Arc::new(ElementwiseProgram {
    ///     num_inputs: 2,
    ///     steps: vec![ElementwiseStep::Unary(UnaryOp::Tanh, 0), ElementwiseStep::Binary(BinaryOp::Mul, 2, 1)],
    ///     outputs: vec![3],
    /// });
    /// let a = Tensor::from_vec(vec![0.0f32, 1.0], &[2])?;
    /// let b = Tensor::scalar(2.0f32)?;
    /// let y = Tensor::fused_elementwise(&p, &[a.clone(), b.clone()])?;
    /// assert_eq!(y[0].to_vec::<f32>()?, a.tanh()?.mul(&b)?.to_vec::<f32>()?);
    /// # Ok::<(), ferroflow_tensor::Error>(())
    /// ```
    pub fn fused_elementwise(
        program: &Arc<ElementwiseProgram>,
        inputs: &[Tensor],
    ) -> Result<Vec<Tensor>> {
        const OP: &str = "fused_elementwise";
        let (dtype, shape) = program_operands(OP, program, inputs)?;
        if !device_has_fused(inputs[0].device(), FusedKernel::Elementwise, dtype) {
            return program.compose(inputs, &shape);
        }
        let refs: Vec<&Tensor> = inputs.iter().collect();
        dispatch(
            || Op::FusedElementwise(program.clone()),
            &refs,
            |p| {
                let n = p.check_output(OP, &shape, dtype)?;
                if n == 0 {
                    return program
                        .outputs
                        .iter()
                        .map(|_| p.empty(&shape, dtype))
                        .collect::<Result<Vec<_>>>();
                }
                let operands: Vec<_> = inputs.iter().map(|t| t.operand()).collect();
                let bufs = p.backend.fused_elementwise(program, &operands, &shape)?;
                if bufs.len() != program.outputs.len() {
                    return Err(Error::Backend {
                        backend: p.backend.name(),
                        msg: format!(
                            "fused_elementwise returned {} buffers for {} outputs",
                            bufs.len(),
                            program.outputs.len()
                        ),
                    });
                }
                Ok(bufs
                    .into_iter()
                    .map(|b| Tensor::from_buffer(b, &shape, dtype, p.backend, p.device))
                    .collect::<Vec<Tensor>>())
            },
        )
    }
}

impl Tensor {
    /// Runs an elementwise program over `inputs` and reduces its first output over `axes`
    /// in the same pass: `[reduce(program(inputs)[0]), program(inputs)[1..]..]`, exactly
    /// what [`Tensor::fused_elementwise`] and then [`Tensor::reduce`] give (sum, product,
    /// max or min). One kernel where the backend has the fused program, else the ops one by
    /// one. Graph functions' fusion pass makes these from a chain ending in a reduction.
    ///
    /// ```no_run
    /// // A backend registered first: `ferroflow::init()` (the facade).
    /// use ferroflow_tensor::{ElementwiseProgram, ElementwiseStep, ReduceOp, Tensor, UnaryOp};
    /// use std::sync::Arc;
    /// // Σ exp(x) over the last axis.
    /// let p = Arc::new(ElementwiseProgram {
    ///     num_inputs: 1,
    ///     steps: vec![ElementwiseStep::Unary(UnaryOp::Exp, 0)],
    ///     outputs: vec![1],
    /// });
    /// let x = Tensor::from_vec(vec![0.0f32, 1.0, 2.0, 3.0], &[2, 2])?;
    /// let y = Tensor::fused_reduce(&p, &[x.clone()], ReduceOp::ReduceSum, -1, false)?;
    /// assert_eq!(y[0].to_vec::<f32>()?, x.exp()?.reduce_sum(-1, false)?.to_vec::<f32>()?);
    /// # Ok::<(), ferroflow_tensor::Error>(())
    /// ```
    pub fn fused_reduce(
        program: &Arc<ElementwiseProgram>,
        inputs: &[Tensor],
        reduce: ReduceOp,
        axes: impl Into<Axes>,
        keepdims: bool,
    ) -> Result<Vec<Tensor>> {
        const OP: &str = "fused_reduce";
        let (dtype, shape) = program_operands(OP, program, inputs)?;
        if !matches!(
            reduce,
            ReduceOp::ReduceSum
                | ReduceOp::ReduceMean
                | ReduceOp::ReduceProd
                | ReduceOp::ReduceMax
                | ReduceOp::ReduceMin
        ) {
            return Err(Error::invalid(
                OP,
                format!(
                    "{} of floats is not a fusible reduction (sum, mean, prod, max, min)",
                    reduce.name()
                ),
            ));
        }
        let axes = axes.into().resolve(OP, shape.len())?;
        let n: usize = shape.iter().product();
        if n == 0 || !device_has_fused(inputs[0].device(), FusedKernel::Elementwise, dtype) {
            let mut outputs = program.compose(inputs, &shape)?;
            let reduced = outputs[0].reduce(reduce, Axes::List(to_isize(&axes)), keepdims)?;
            outputs[0] = reduced;
            return Ok(outputs);
        }
        let reduced_shape: Vec<usize> = shape
            .iter()
            .enumerate()
            .filter_map(|(i, &d)| match (axes.contains(&i), keepdims) {
                (false, _) => Some(d),
                (true, true) => Some(1),
                (true, false) => None,
            })
            .collect();
        let refs: Vec<&Tensor> = inputs.iter().collect();
        dispatch(
            || Op::FusedReduce {
                program: program.clone(),
                reduce,
                axes: axes.clone(),
                keepdims,
            },
            &refs,
            |p| {
                p.check_output(OP, &shape, dtype)?;
                p.check_output(OP, &reduced_shape, dtype)?;
                let operands: Vec<_> = inputs.iter().map(|t| t.operand()).collect();
                let bufs = p
                    .backend
                    .fused_reduce(program, &operands, &shape, reduce, &axes)?;
                if bufs.len() != program.outputs.len() {
                    return Err(Error::Backend {
                        backend: p.backend.name(),
                        msg: format!(
                            "fused_reduce returned {} buffers for {} outputs",
                            bufs.len(),
                            program.outputs.len()
                        ),
                    });
                }
                Ok(bufs
                    .into_iter()
                    .enumerate()
                    .map(|(k, b)| {
                        let s = if k == 0 { &reduced_shape } else { &shape };
                        Tensor::from_buffer(b, s, dtype, p.backend, p.device)
                    })
                    .collect::<Vec<Tensor>>())
            },
        )
    }
}

impl Tensor {
    /// The product `a @ b` (each transposed first when asked; rank 2, one float dtype) run
    /// through `program` as its register 0, with `inputs` as registers 1.. (each broadcast
    /// to the product's shape `[m, n]`), the program's first output summed over the rows in
    /// the same pass: `[Σ_rows program(a @ b, inputs..)[0] ([n]), the program's other
    /// outputs ([m, n])..]`, which is [`Tensor::fused_reduce`] of the product over axis 0.
    /// One kernel where the backend declares [`FusedKernel::FusedMatMulReduce`] (wgpu: the
    /// GEMM's epilogue), the product and then `fused_reduce` elsewhere. What a graph
    /// function's fusion makes of a Dense layer's backward: the product `dy @ wᵀ`, the ReLU
    /// gradient of the layer below and its bias gradient (cuBLASLt's `DRELU_BGRAD`).
    ///
    /// ```no_run
    /// // A backend registered first: `ferroflow::init()` (the facade).
    /// use ferroflow_tensor::{BinaryOp, ElementwiseProgram, ElementwiseStep, Tensor};
    /// use std::sync::Arc;
    /// // relu_grad(dy @ wᵀ, y) and its column sums.
    /// let p = Arc::new(ElementwiseProgram {
    ///     num_inputs: 2,
    ///     steps: vec![ElementwiseStep::Binary(BinaryOp::ReluGrad, 0, 1)],
    ///     outputs: vec![2, 2],
    /// });
    /// let dy = Tensor::from_vec(vec![1.0f32, 2.0, 3.0, 4.0], &[2, 2])?;
    /// let w = Tensor::from_vec(vec![1.0f32, 0.0, 0.0, 1.0], &[2, 2])?;
    /// let y = Tensor::from_vec(vec![1.0f32, 0.0, 1.0, 1.0], &[2, 2])?;
    /// let out = Tensor::fused_matmul_reduce(&dy, &w, (false, true), &p, &[y])?;
    /// assert_eq!(out[0].to_vec::<f32>()?, vec![4.0, 4.0]);
    /// assert_eq!(out[1].to_vec::<f32>()?, vec![1.0, 0.0, 3.0, 4.0]);
    /// # Ok::<(), ferroflow_tensor::Error>(())
    /// ```
    pub fn fused_matmul_reduce(
        a: &Tensor,
        b: &Tensor,
        (transpose_a, transpose_b): (bool, bool),
        program: &Arc<ElementwiseProgram>,
        inputs: &[Tensor],
    ) -> Result<Vec<Tensor>> {
        const OP: &str = "fused_matmul_reduce";
        if a.rank() != 2 || b.rank() != 2 {
            return Err(Error::ShapeMismatch {
                op: OP,
                msg: "both operands need rank 2",
                lhs: a.shape().to_vec(),
                rhs: b.shape().to_vec(),
            });
        }
        let (la, lb, out_shape) = a.matmul_layouts(b, transpose_a, transpose_b)?;
        let dtype = a.dtype();
        let declared = device_has_fused(a.device(), FusedKernel::FusedMatMulReduce, dtype);
        let compose = || -> Result<Vec<Tensor>> {
            let product = a.matmul_t(b, transpose_a, transpose_b)?;
            let all: Vec<Tensor> = std::iter::once(product)
                .chain(inputs.iter().cloned())
                .collect();
            Tensor::fused_reduce(program, &all, ReduceOp::ReduceSum, 0isize, false)
        };
        if !declared || !dtype.is_float() {
            return compose();
        }
        // The program's operands as `fused_reduce` checks them, the product standing in
        // for register 0; a broadcast that widens the product is the composed path's error.
        let (_, shape) = program_operands_after(OP, program, (dtype, &out_shape), inputs)?;
        if shape != out_shape || out_shape.contains(&0) {
            return compose();
        }
        let n = out_shape[1];
        let mut refs: Vec<&Tensor> = vec![a, b];
        refs.extend(inputs.iter());
        dispatch(
            || Op::FusedMatMulReduce {
                program: program.clone(),
                transpose_a,
                transpose_b,
            },
            &refs,
            |p| {
                p.check_output(OP, &out_shape, dtype)?;
                let operands: Vec<_> = inputs.iter().map(|t| t.operand()).collect();
                let bufs = p.backend.fused_matmul_reduce(
                    crate::backend::Operand {
                        layout: &la,
                        ..a.operand()
                    },
                    crate::backend::Operand {
                        layout: &lb,
                        ..b.operand()
                    },
                    program,
                    &operands,
                )?;
                if bufs.len() != program.outputs.len() {
                    return Err(Error::Backend {
                        backend: p.backend.name(),
                        msg: format!(
                            "fused_matmul_reduce returned {} buffers for {} outputs",
                            bufs.len(),
                            program.outputs.len()
                        ),
                    });
                }
                Ok(bufs
                    .into_iter()
                    .enumerate()
                    .map(|(k, buf)| {
                        let s: &[usize] = if k == 0 { &[n] } else { &out_shape };
                        Tensor::from_buffer(buf, s, dtype, p.backend, p.device)
                    })
                    .collect::<Vec<Tensor>>())
            },
        )
    }
}

fn to_isize(axes: &[usize]) -> Vec<isize> {
    axes.iter().map(|&a| a as isize).collect()
}

/// Checks a program against its inputs (count, one float dtype, broadcastable) and gives
/// the dtype and the broadcast shape.
fn program_operands(
    op: &'static str,
    program: &ElementwiseProgram,
    inputs: &[Tensor],
) -> Result<(crate::DType, Vec<usize>)> {
    let Some((first, rest)) = inputs.split_first() else {
        return Err(Error::invalid(op, "the program reads no inputs"));
    };
    program_operands_after(op, program, (first.dtype(), first.shape()), rest)
}

/// [`program_operands`] with the first input given by its dtype and shape (a product the
/// same kernel makes).
fn program_operands_after(
    op: &'static str,
    program: &ElementwiseProgram,
    (dtype, first_shape): (crate::DType, &[usize]),
    rest: &[Tensor],
) -> Result<(crate::DType, Vec<usize>)> {
    program.check()?;
    if rest.len() + 1 != program.num_inputs {
        return Err(Error::invalid(
            op,
            format!(
                "the program reads {} inputs, got {}",
                program.num_inputs,
                rest.len() + 1
            ),
        ));
    }
    if !dtype.is_float() {
        return Err(Error::UnsupportedDType {
            op,
            dtype,
            expected: "a float dtype",
        });
    }
    let mut shape = first_shape.to_vec();
    for t in rest {
        if t.dtype() != dtype {
            return Err(Error::DTypeMismatch {
                op,
                lhs: dtype,
                rhs: t.dtype(),
            });
        }
        shape = crate::layout::broadcast_shapes(op, &shape, t.shape())?;
    }
    Ok((dtype, shape))
}

impl ElementwiseProgram {
    /// The program's ops one by one on `inputs` (each an op observers and tapes see), the
    /// outputs broadcast to `shape`: what [`Tensor::fused_elementwise`] does where the
    /// backend has no fused kernel, and what its gradient differentiates.
    pub fn compose(&self, inputs: &[Tensor], shape: &[usize]) -> Result<Vec<Tensor>> {
        self.check()?;
        if inputs.len() != self.num_inputs {
            return Err(Error::invalid(
                "fused_elementwise",
                format!(
                    "the program reads {} inputs, got {}",
                    self.num_inputs,
                    inputs.len()
                ),
            ));
        }
        let mut registers: Vec<Tensor> = inputs.to_vec();
        for step in &self.steps {
            let v = match *step {
                ElementwiseStep::Unary(op, a) => registers[a].unary(op)?,
                ElementwiseStep::Binary(op, a, b) => registers[a].binary(op, &registers[b])?,
            };
            registers.push(v);
        }
        self.outputs
            .iter()
            .map(|&r| {
                let t = &registers[r];
                if t.shape() == shape {
                    Ok(t.clone())
                } else {
                    t.broadcast_to(shape)
                }
            })
            .collect()
    }
}

/// The checks of one variable's fused update (`op` names the caller): the rule's slot
/// count, one shape and float dtype for the value, gradient and slots, and a backend that
/// declares the fused kernel for the dtype.
fn check_update(
    op: &'static str,
    rule: &UpdateRule,
    w: &Tensor,
    g: &Tensor,
    slots: &[Tensor],
) -> Result<()> {
    if slots.len() != rule.num_slots() {
        return Err(Error::invalid(
            op,
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
                op,
                msg: "the variable, gradient and slots must have one shape",
                lhs: w.shape().to_vec(),
                rhs: t.shape().to_vec(),
            });
        }
        if t.dtype() != w.dtype() {
            return Err(Error::DTypeMismatch {
                op,
                lhs: w.dtype(),
                rhs: t.dtype(),
            });
        }
    }
    if !w.dtype().is_float() {
        return Err(Error::UnsupportedDType {
            op,
            dtype: w.dtype(),
            expected: "a float dtype",
        });
    }
    if !device_has_fused(w.device(), FusedKernel::OptimizerUpdate, w.dtype()) {
        return Err(Error::NotSupportedByBackend {
            op,
            backend: backend_for(w.device())?.name(),
            detail: format!(
                ", {}: it declares no fused optimizer update for it (`Backend::has_fused`)",
                w.dtype()
            ),
        });
    }
    Ok(())
}
