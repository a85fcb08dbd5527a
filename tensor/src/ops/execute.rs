//! [`Op::execute`]: runs a recorded op again on new inputs (a graph function's replay).
//!
//! Each op goes through the same public method that recorded it, so replay checks its inputs
//! the same way, tapes and profilers observe it, and a fused kernel missing on the device
//! falls back to the same composition.

use crate::error::{Error, Result};
use crate::op::Op;
use crate::ops::Axes;
use crate::tensor::Tensor;

fn arity(op: &Op, inputs: &[&Tensor], n: usize) -> Result<()> {
    if inputs.len() == n {
        Ok(())
    } else {
        Err(Error::invalid(
            op.name(),
            format!("takes {n} inputs, got {}", inputs.len()),
        ))
    }
}

impl Op {
    /// Runs this op on `inputs` (in the order observers were shown them) and returns its
    /// outputs. Ops that carry no recipe for their output ([`Op::Constant`]: the value is
    /// the graph's; [`Op::ToHost`]; [`Op::HostFunction`]) are refused with
    /// [`Error::NotTraceable`].
    ///
    /// ```no_run
    /// // A backend registered first: `ferroflow::init()` (the facade).
    /// use ferroflow_tensor::{BinaryOp, Op, Tensor};
    /// let (a, b) = (Tensor::from_slice(&[1.0f32, 2.0])?, Tensor::from_slice(&[3.0f32, 4.0])?);
    /// let y = Op::Binary(BinaryOp::Add).execute(&[&a, &b])?;
    /// assert_eq!(y[0].to_vec::<f32>()?, vec![4.0, 6.0]);
    /// # Ok::<(), ferroflow_tensor::Error>(())
    /// ```
    pub fn execute(&self, inputs: &[&Tensor]) -> Result<Vec<Tensor>> {
        let one = |t: Tensor| Ok(vec![t]);
        let n = |k: usize| arity(self, inputs, k);
        match self {
            Op::Unary(u) => {
                n(1)?;
                one(inputs[0].unary(*u)?)
            }
            Op::Binary(b) => {
                n(2)?;
                one(inputs[0].binary(*b, inputs[1])?)
            }
            Op::Reduce { op, axes, keepdims } => {
                n(1)?;
                let axes = Axes::List(axes.iter().map(|&a| a as isize).collect());
                one(inputs[0].reduce(*op, axes, *keepdims)?)
            }
            Op::ArgReduce { op, axis } => {
                n(1)?;
                one(inputs[0].arg_reduce(*op, *axis as isize)?)
            }
            Op::Cast { to } => {
                n(1)?;
                one(inputs[0].cast(*to)?)
            }
            Op::MatMul {
                transpose_a,
                transpose_b,
            } => {
                n(2)?;
                one(inputs[0].matmul_t(inputs[1], *transpose_a, *transpose_b)?)
            }
            Op::Reshape { shape } => {
                n(1)?;
                one(inputs[0].reshape_to(shape)?)
            }
            Op::Transpose { perm } => {
                n(1)?;
                one(inputs[0].transpose(perm)?)
            }
            Op::StridedSlice { begin, len, step } => {
                n(1)?;
                let x = inputs[0];
                let fits = begin.len() == x.rank()
                    && len.len() == x.rank()
                    && step.len() == x.rank()
                    && (0..x.rank()).all(|a| {
                        let last = begin[a] as isize + (len[a] as isize - 1) * step[a];
                        len[a] == 0
                            || (begin[a] < x.shape()[a]
                                && last >= 0
                                && (last as usize) < x.shape()[a])
                    });
                if !fits {
                    return Err(Error::invalid(
                        "strided_slice",
                        format!(
                            "begin {begin:?}, len {len:?}, step {step:?} do not fit shape {:?}",
                            x.shape()
                        ),
                    ));
                }
                one(x.slice_view(begin.clone(), len.clone(), step.clone())?)
            }
            Op::BroadcastTo { shape } => {
                n(1)?;
                one(inputs[0].broadcast_to(shape)?)
            }
            Op::Select => {
                n(3)?;
                one(Tensor::select(inputs[0], inputs[1], inputs[2])?)
            }
            Op::Gather { axis } => {
                n(2)?;
                one(inputs[0].gather(inputs[1], *axis as isize)?)
            }
            Op::GatherGroup { axis } => {
                let Some((indices, xs)) = inputs.split_last() else {
                    return Err(Error::invalid("gather_group", "needs the indices"));
                };
                let xs: Vec<Tensor> = xs.iter().map(|t| (*t).clone()).collect();
                Tensor::gather_group(&xs, indices, *axis as isize)
            }
            Op::ScatterAdd { axis, shape } => {
                n(2)?;
                one(Tensor::scatter_add(
                    inputs[0],
                    inputs[1],
                    shape,
                    *axis as isize,
                )?)
            }
            Op::Concat { axis } => {
                let parts: Vec<Tensor> = inputs.iter().map(|t| (*t).clone()).collect();
                one(Tensor::concat(&parts, *axis as isize)?)
            }
            Op::Pad { paddings, value } => {
                n(1)?;
                one(inputs[0].pad(paddings, *value)?)
            }
            Op::Cumulative {
                op,
                axis,
                exclusive,
                reverse,
            } => {
                n(1)?;
                one(inputs[0].cumulative(*op, *axis as isize, *exclusive, *reverse)?)
            }
            Op::Sort { axis, descending } => {
                n(1)?;
                let (values, indices) = inputs[0].sort_with_indices(*axis as isize, *descending)?;
                Ok(vec![values, indices])
            }
            Op::Copy => {
                n(1)?;
                one(inputs[0].copy()?)
            }
            Op::StopGradient { custom_gradient } => {
                n(1)?;
                one(inputs[0].stop_gradient(*custom_gradient)?)
            }
            Op::ToDevice { to } => {
                n(1)?;
                one(inputs[0].to_device(*to)?)
            }
            Op::Conv2d(w) => {
                n(2)?;
                one(inputs[0].conv2d(inputs[1], w.strides, w.padding(), w.dilations)?)
            }
            Op::FusedConv2d(w, activation) => {
                n(3)?;
                one(inputs[0].fused_conv2d(
                    inputs[1],
                    inputs[2],
                    *activation,
                    w.strides,
                    w.padding(),
                    w.dilations,
                )?)
            }
            Op::BiasActivationGrad(activation) => {
                n(2)?;
                let (dx, db) = inputs[0].bias_activation_grad(inputs[1], *activation)?;
                Ok(vec![dx, db])
            }
            Op::FusedConv2dMaxPool(w, activation, pool) => {
                n(3)?;
                let (y, pooled) = inputs[0].fused_conv2d_max_pool(
                    inputs[1],
                    inputs[2],
                    *activation,
                    w.strides,
                    w.padding(),
                    w.dilations,
                    pool.kernel,
                    pool.strides,
                    pool.padding(),
                )?;
                Ok(vec![y, pooled])
            }
            Op::MaxPoolBiasActivationGrad(w, activation) => {
                n(2)?;
                let (dx, db) = inputs[0].max_pool_bias_activation_grad(
                    inputs[1],
                    w.kernel,
                    w.strides,
                    w.padding(),
                    *activation,
                )?;
                Ok(vec![dx, db])
            }
            Op::FusedMatMul(activation) => {
                n(3)?;
                one(inputs[0].fused_matmul(inputs[1], inputs[2], *activation)?)
            }
            Op::SparseSoftmaxCrossEntropy => {
                n(2)?;
                let (loss, backprop) =
                    inputs[0].sparse_softmax_cross_entropy_with_logits(inputs[1])?;
                Ok(vec![loss, backprop])
            }
            Op::Conv2dBackpropInput(w) => {
                n(2)?;
                one(Tensor::conv2d_backprop_input(
                    w.input,
                    inputs[0],
                    inputs[1],
                    w.strides,
                    w.padding(),
                    w.dilations,
                )?)
            }
            Op::Conv2dBackpropFilter(w) => {
                n(2)?;
                let dy = inputs[1];
                let cout = dy.shape().get(3).copied().unwrap_or(0);
                let filter = [w.kernel[0], w.kernel[1], w.input[3], cout];
                one(inputs[0].conv2d_backprop_filter(
                    filter,
                    dy,
                    w.strides,
                    w.padding(),
                    w.dilations,
                )?)
            }
            Op::Pool2d(kind, w) => {
                n(1)?;
                one(inputs[0].pool2d(*kind, w.kernel, w.strides, w.padding())?)
            }
            Op::MaxPoolGrad(w) => {
                n(2)?;
                one(inputs[0].max_pool_grad(inputs[1], w.kernel, w.strides, w.padding())?)
            }
            Op::AvgPoolGrad(w) => {
                n(1)?;
                one(Tensor::avg_pool_grad(
                    w.input,
                    inputs[0],
                    w.kernel,
                    w.strides,
                    w.padding(),
                )?)
            }
            Op::OptimizerUpdate(rule) => {
                n(2 + rule.num_slots())?;
                let slots: Vec<Tensor> = inputs[2..].iter().map(|t| (*t).clone()).collect();
                let (w, slots) = Tensor::optimizer_update(rule, inputs[0], inputs[1], &slots)?;
                Ok(std::iter::once(w).chain(slots).collect())
            }
            Op::OptimizerUpdateGroup(rule) => {
                let per = 2 + rule.num_slots();
                if inputs.is_empty() || !inputs.len().is_multiple_of(per) {
                    return Err(Error::invalid(
                        "optimizer_update_group",
                        format!(
                            "takes (w, g, {} slots) per variable, got {} inputs",
                            rule.num_slots(),
                            inputs.len()
                        ),
                    ));
                }
                let variables: Vec<(Tensor, Tensor, Vec<Tensor>)> = inputs
                    .chunks(per)
                    .map(|c| {
                        let slots = c[2..].iter().map(|t| (*t).clone()).collect();
                        (c[0].clone(), c[1].clone(), slots)
                    })
                    .collect();
                Ok(Tensor::optimizer_update_group(rule, &variables)?
                    .into_iter()
                    .flat_map(|(w, slots)| std::iter::once(w).chain(slots))
                    .collect())
            }
            Op::ClipScalar { min, max } => {
                n(1)?;
                one(inputs[0].clip_scalar(*min, *max)?)
            }
            Op::FusedElementwise(program) => {
                let inputs: Vec<Tensor> = inputs.iter().map(|t| (*t).clone()).collect();
                Tensor::fused_elementwise(program, &inputs)
            }
            Op::FusedReduce {
                program,
                reduce,
                axes,
                keepdims,
            } => {
                let inputs: Vec<Tensor> = inputs.iter().map(|t| (*t).clone()).collect();
                let axes: Vec<isize> = axes.iter().map(|&a| a as isize).collect();
                Tensor::fused_reduce(program, &inputs, *reduce, axes, *keepdims)
            }
            Op::FusedMatMulReduce {
                program,
                transpose_a,
                transpose_b,
            } => {
                if inputs.len() < 2 {
                    return Err(Error::invalid(
                        "fused_matmul_reduce",
                        format!("needs a and b, got {} inputs", inputs.len()),
                    ));
                }
                let rest: Vec<Tensor> = inputs[2..].iter().map(|t| (*t).clone()).collect();
                Tensor::fused_matmul_reduce(
                    inputs[0],
                    inputs[1],
                    (*transpose_a, *transpose_b),
                    program,
                    &rest,
                )
            }
            Op::Fft { inverse } => {
                n(1)?;
                one(if *inverse {
                    inputs[0].ifft()?
                } else {
                    inputs[0].fft()?
                })
            }
            Op::RandomStateful {
                distribution,
                shape,
                dtype,
                seed,
            } => {
                n(0)?;
                one(crate::random::stateful(
                    *distribution,
                    shape,
                    *dtype,
                    *seed,
                )?)
            }
            Op::Constant => Err(Error::NotTraceable {
                op: "constant",
                msg: "a constant's value is held by the graph, not by the op".into(),
            }),
            Op::ToHost => Err(Error::NotTraceable {
                op: "to_host",
                msg: "a read to the host has no tensor output to replay".into(),
            }),
            Op::HostFunction { name } => Err(Error::NotTraceable {
                op: name,
                msg: "it is computed on the host by a library outside the op set".into(),
            }),
        }
    }
}
