//! [`vectorized_map`] (TF's `tf.vectorized_map`, "pfor"): a function of one example traced
//! once, then run on the whole batch by giving each op of its graph a leading batch axis.
//!
//! Every value of the graph is either *batched* (it depends on the mapped elements: it has
//! the batch axis in front) or *invariant* (constants, captured tensors, variables, and what
//! is computed from them only: computed once). An op with a batched input runs once through
//! its batching rule: elementwise ops and `select` broadcast after the batched inputs are
//! given the output's rank; reductions, scans, sorts, transposes, slices, pads and
//! concatenations shift their axes by one; reshapes and broadcasts prepend the batch size;
//! a matmul of a batched matrix by an invariant one is one large matrix product;
//! convolutions and pooling fold the batch into the images' batch axis; random draws draw
//! for every example. An op without a rule (a scatter, a gather by batched indices, the
//! convolution gradients, control flow) runs once per example and its results are stacked,
//! as TF's pfor falls back to a `while_loop` (with a warning naming the op).
//!
//! The batched ops run through the dispatcher where `vectorized_map` is called: tapes
//! record them (gradients flow to the mapped elements and to captured tensors) and a graph
//! function tracing the call records them.

use crate::graph::{Node, NodeKind};
use crate::trace::trace_branch;
use ferroflow_autodiff::{GradientTape, Source, UnconnectedGradients};
use ferroflow_tensor::dispatch::isolated_scope;
use ferroflow_tensor::{Error, HostData, Op, Result, Tensor};
use std::collections::HashSet;
use std::sync::Mutex;

/// A value while the graph runs on the batch.
#[derive(Clone)]
enum Value {
    /// With the batch axis in front.
    Batched(Tensor),
    /// The same for every example.
    Invariant(Tensor),
}

impl Value {
    fn tensor(&self) -> &Tensor {
        match self {
            Value::Batched(t) | Value::Invariant(t) => t,
        }
    }
    fn is_batched(&self) -> bool {
        matches!(self, Value::Batched(_))
    }
    /// The rank of one example's value.
    fn example_rank(&self) -> usize {
        match self {
            Value::Batched(t) => t.rank() - 1,
            Value::Invariant(t) => t.rank(),
        }
    }
    /// The value with the batch axis: an invariant one broadcast to `batch` copies (a view).
    fn batched(&self, batch: usize) -> Result<Tensor> {
        match self {
            Value::Batched(t) => Ok(t.clone()),
            Value::Invariant(t) => {
                let mut shape = vec![batch];
                shape.extend_from_slice(t.shape());
                t.expand_dims(0)?.broadcast_to(&shape)
            }
        }
    }
    /// Example `b` of the value.
    fn example(&self, b: usize) -> Result<Tensor> {
        match self {
            Value::Invariant(t) => Ok(t.clone()),
            Value::Batched(t) => example_of(t, b),
        }
    }
}

/// Row `b` of `t` along its first axis, without that axis.
fn example_of(t: &Tensor, b: usize) -> Result<Tensor> {
    let mut begin = vec![0; t.rank()];
    begin[0] = b;
    let mut size = vec![-1isize; t.rank()];
    size[0] = 1;
    t.slice(&begin, &size)?.reshape_to(&t.shape()[1..])
}

/// A batched tensor given `rank` dimensions per example by inserting size-1 axes after the
/// batch axis, so that it broadcasts against invariant values as one example would.
fn with_example_rank(t: &Tensor, rank: usize) -> Result<Tensor> {
    let example = &t.shape()[1..];
    if example.len() >= rank {
        return Ok(t.clone());
    }
    let mut shape = vec![t.shape()[0]];
    shape.extend(std::iter::repeat_n(1, rank - example.len()));
    shape.extend_from_slice(example);
    t.reshape_to(&shape)
}

/// Each batched value with `rank` example axes ([`with_example_rank`]), invariant values as
/// they are: the inputs of a broadcasting op run on the batch.
fn with_example_ranks(inputs: &[Value], rank: usize) -> Result<Vec<Tensor>> {
    inputs
        .iter()
        .map(|v| match v {
            Value::Batched(t) => with_example_rank(t, rank),
            Value::Invariant(t) => Ok(t.clone()),
        })
        .collect()
}

/// Indices (batched, or the same for every example) with `b · rows` added to example
/// `b`'s: they index the rows of all examples stacked. An index outside `[0, rows)` becomes
/// `batch · rows`, outside every example's rows, so the kernel still reports it instead of
/// reading a neighbouring example.
fn offset_indices(indices: &Value, batch: usize, rows: usize) -> Result<Tensor> {
    let t = indices.batched(batch)?;
    let constant = |values: &[f64], shape: &[usize]| {
        Tensor::from_host_on(
            HostData::from_f64_slice(t.dtype(), values),
            shape,
            t.device(),
        )
    };
    let offsets: Vec<f64> = (0..batch).map(|b| (b * rows) as f64).collect();
    let mut shape = vec![1; t.rank()];
    shape[0] = batch;
    let offsets = constant(&offsets, &shape)?;
    let valid = t
        .greater_equal(&constant(&[0.0], &[])?)?
        .logical_and(&t.less(&constant(&[rows as f64], &[])?)?)?;
    Tensor::select(
        &valid,
        &t.add(&offsets)?,
        &constant(&[(batch * rows) as f64], &[])?,
    )
}

/// Ops already warned about running once per example (TF warns once per op type).
static WARNED: Mutex<Option<HashSet<String>>> = Mutex::new(None);

fn warn_fallback(name: &str) {
    let mut warned = WARNED.lock().unwrap_or_else(|e| e.into_inner());
    if warned
        .get_or_insert_with(HashSet::new)
        .insert(name.to_string())
    {
        eprintln!(
            "WARNING: vectorized_map: no batching rule for {name}; it runs once per example \
             (TF: \"Using a while_loop for converting {name}\")"
        );
    }
}

/// The op of `node` on batched values through its batching rule, or `None` when it has none.
fn batch_op(op: &Op, inputs: &[Value], batch: usize) -> Result<Option<Vec<Tensor>>> {
    let shift = |axes: &[usize]| -> Vec<usize> { axes.iter().map(|a| a + 1).collect() };
    let all_batched =
        || -> Result<Vec<Tensor>> { inputs.iter().map(|v| v.batched(batch)).collect() };
    let run = |op: Op, ts: Vec<Tensor>| -> Result<Option<Vec<Tensor>>> {
        let r: Vec<&Tensor> = ts.iter().collect();
        op.execute(&r).map(Some)
    };
    let single = || -> Result<Tensor> {
        match inputs {
            [v] => v.batched(batch),
            _ => Err(Error::invalid(op.name(), "takes one input")),
        }
    };
    match op {
        Op::Unary(_)
        | Op::Cast { .. }
        | Op::Copy
        | Op::StopGradient { .. }
        | Op::ClipScalar { .. }
        | Op::Fft { .. } => run(op.clone(), vec![single()?]),
        // Rows of logits and their labels: any leading axes, the batch one included.
        Op::SparseSoftmaxCrossEntropy => run(op.clone(), all_batched()?),
        Op::Binary(_) | Op::Select | Op::FusedElementwise(_) => {
            // Broadcast as one example would: batched inputs get the output's rank.
            let rank = inputs.iter().map(Value::example_rank).max().unwrap_or(0);
            let ts = with_example_ranks(inputs, rank)?;
            run(op.clone(), ts)
        }
        Op::FusedReduce {
            program,
            reduce,
            axes,
            keepdims,
        } => {
            let rank = inputs.iter().map(Value::example_rank).max().unwrap_or(0);
            let ts = with_example_ranks(inputs, rank)?;
            run(
                Op::FusedReduce {
                    program: program.clone(),
                    reduce: *reduce,
                    axes: shift(axes),
                    keepdims: *keepdims,
                },
                ts,
            )
        }
        // Each tensor's gather by its rule.
        Op::GatherGroup { axis } => {
            let Some((indices, xs)) = inputs.split_last() else {
                return Err(Error::invalid(op.name(), "needs the indices"));
            };
            let mut out = Vec::with_capacity(xs.len());
            for x in xs {
                let gather = Op::Gather { axis: *axis };
                let Some(mut y) = batch_op(&gather, &[x.clone(), indices.clone()], batch)? else {
                    return Ok(None);
                };
                out.push(y.remove(0));
            }
            Ok(Some(out))
        }
        // The product by its rule, then the fused row sum by its own.
        Op::FusedMatMulReduce {
            program,
            transpose_a,
            transpose_b,
        } => {
            let [a, b, rest @ ..] = inputs else {
                return Err(Error::invalid(op.name(), "needs a and b"));
            };
            let product = match (a, b) {
                (Value::Invariant(x), Value::Invariant(w)) => {
                    Value::Invariant(x.matmul_t(w, *transpose_a, *transpose_b)?)
                }
                _ => {
                    let matmul = Op::MatMul {
                        transpose_a: *transpose_a,
                        transpose_b: *transpose_b,
                    };
                    let Some(mut y) = batch_op(&matmul, &[a.clone(), b.clone()], batch)? else {
                        return Ok(None);
                    };
                    Value::Batched(y.remove(0))
                }
            };
            let operands: Vec<Value> = std::iter::once(product)
                .chain(rest.iter().cloned())
                .collect();
            let rows = Op::FusedReduce {
                program: program.clone(),
                reduce: ferroflow_tensor::ReduceOp::ReduceSum,
                axes: vec![0],
                keepdims: false,
            };
            batch_op(&rows, &operands, batch)
        }
        Op::Reduce {
            op: r,
            axes,
            keepdims,
        } => run(
            Op::Reduce {
                op: *r,
                axes: shift(axes),
                keepdims: *keepdims,
            },
            vec![single()?],
        ),
        Op::ArgReduce { op: r, axis } => run(
            Op::ArgReduce {
                op: *r,
                axis: axis + 1,
            },
            vec![single()?],
        ),
        Op::Cumulative {
            op: c,
            axis,
            exclusive,
            reverse,
        } => run(
            Op::Cumulative {
                op: *c,
                axis: axis + 1,
                exclusive: *exclusive,
                reverse: *reverse,
            },
            vec![single()?],
        ),
        Op::Sort { axis, descending } => run(
            Op::Sort {
                axis: axis + 1,
                descending: *descending,
            },
            vec![single()?],
        ),
        Op::Reshape { shape } => {
            let mut s = vec![batch];
            s.extend_from_slice(shape);
            run(Op::Reshape { shape: s }, vec![single()?])
        }
        Op::Transpose { perm } => {
            let mut p = vec![0];
            p.extend(shift(perm));
            run(Op::Transpose { perm: p }, vec![single()?])
        }
        Op::BroadcastTo { shape } => {
            let x = with_example_rank(&single()?, shape.len())?;
            let mut s = vec![batch];
            s.extend_from_slice(shape);
            run(Op::BroadcastTo { shape: s }, vec![x])
        }
        Op::StridedSlice { begin, len, step } => {
            let (mut b, mut l, mut s) = (vec![0], vec![batch], vec![1]);
            b.extend_from_slice(begin);
            l.extend_from_slice(len);
            s.extend_from_slice(step);
            run(
                Op::StridedSlice {
                    begin: b,
                    len: l,
                    step: s,
                },
                vec![single()?],
            )
        }
        Op::Pad { paddings, value } => {
            let mut p = vec![(0, 0)];
            p.extend_from_slice(paddings);
            run(
                Op::Pad {
                    paddings: p,
                    value: *value,
                },
                vec![single()?],
            )
        }
        Op::Concat { axis } => run(Op::Concat { axis: axis + 1 }, all_batched()?),
        Op::Gather { axis } if !inputs[1].is_batched() => run(
            Op::Gather { axis: axis + 1 },
            vec![inputs[0].batched(batch)?, inputs[1].tensor().clone()],
        ),
        Op::Gather { axis: 0 } => {
            // Per-example indices into per-example rows: one gather from all rows.
            let params = inputs[0].batched(batch)?;
            let rows = params.shape()[1];
            let mut flat = vec![batch * rows];
            flat.extend_from_slice(&params.shape()[2..]);
            let indices = offset_indices(&inputs[1], batch, rows)?;
            run(
                Op::Gather { axis: 0 },
                vec![params.reshape_to(&flat)?, indices],
            )
        }
        Op::ScatterAdd { axis: 0, shape } => {
            // Each example's updates into its own block of rows of one output.
            let rows = shape[0];
            let indices = offset_indices(&inputs[0], batch, rows)?;
            let mut flat = vec![batch * rows];
            flat.extend_from_slice(&shape[1..]);
            let sums = Tensor::scatter_add(&indices, &inputs[1].batched(batch)?, &flat, 0)?;
            let mut out = vec![batch];
            out.extend_from_slice(shape);
            Ok(Some(vec![sums.reshape_to(&out)?]))
        }
        // [batch, .., m, k] @ [k, n] + bias: one product of all rows, as `MatMul`'s rule;
        // a batched weight or bias runs once per example.
        Op::FusedMatMul(activation) => match inputs {
            [Value::Batched(x), Value::Invariant(w), Value::Invariant(bias)] if w.rank() == 2 => {
                let k = x.shape()[x.rank() - 1];
                let rows = x.num_elements() / k.max(1);
                let y = x
                    .reshape_to(&[rows, k])?
                    .fused_matmul(w, bias, *activation)?;
                let mut shape = x.shape()[..x.rank() - 1].to_vec();
                shape.push(y.shape()[1]);
                Ok(Some(vec![y.reshape_to(&shape)?]))
            }
            // Otherwise the product by `MatMul`'s rule, then the bias and activation on the
            // batched product (a batched bias [batch, n] gets the product's rank).
            [a, b, bias] => {
                let product = Op::MatMul {
                    transpose_a: false,
                    transpose_b: false,
                };
                let Some(mut y) = batch_op(&product, &[a.clone(), b.clone()], batch)? else {
                    return Ok(None);
                };
                let y = y.remove(0);
                let bias = match bias {
                    Value::Invariant(t) => t.clone(),
                    Value::Batched(t) => {
                        let mut shape = vec![1usize; y.rank()];
                        shape[0] = batch;
                        shape[y.rank() - 1] = t.shape()[t.rank() - 1];
                        t.reshape_to(&shape)?
                    }
                };
                let sum = y.add(&bias)?;
                Ok(Some(vec![match activation {
                    ferroflow_tensor::FusedActivation::Linear => sum,
                    ferroflow_tensor::FusedActivation::Relu => sum.relu()?,
                }]))
            }
            _ => Ok(None),
        },
        Op::MatMul {
            transpose_a,
            transpose_b,
        } => {
            let (a, b) = (&inputs[0], &inputs[1]);
            if let (Value::Batched(x), Value::Invariant(w)) = (a, b) {
                if !transpose_a && w.rank() == 2 {
                    // [batch, .., m, k] @ [k, n]: one product of all rows.
                    let k = x.shape()[x.rank() - 1];
                    let rows = x.num_elements() / k.max(1);
                    let y = x.reshape_to(&[rows, k])?.matmul_t(w, false, *transpose_b)?;
                    let mut shape = x.shape()[..x.rank() - 1].to_vec();
                    shape.push(y.shape()[1]);
                    return Ok(Some(vec![y.reshape_to(&shape)?]));
                }
            }
            let rank = a.example_rank().max(b.example_rank());
            // Contraction over one element (per-example weight gradients xᵀ·δ): an outer
            // product, which broadcasting multiplies in one pass (a batched matrix product
            // of k = 1 is the slow case of a GEMM kernel).
            let ta = a.tensor();
            let k = if *transpose_a {
                ta.shape()[ta.rank() - 2]
            } else {
                ta.shape()[ta.rank() - 1]
            };
            if k == 1 && ta.dtype().is_float() {
                let column = |v: &Value, transpose: bool| -> Result<Tensor> {
                    // As [.., m, 1] (a) or [.., 1, n] (b): a transpose of a size-1 axis is a
                    // reshape.
                    let t = v.tensor();
                    if !transpose {
                        return Ok(t.clone());
                    }
                    let mut s = t.shape().to_vec();
                    let r = s.len();
                    s.swap(r - 1, r - 2);
                    t.reshape_to(&s)
                };
                let (ca, cb) = (column(a, *transpose_a)?, column(b, *transpose_b)?);
                let ca = match a {
                    Value::Batched(_) => with_example_rank(&ca, rank)?,
                    Value::Invariant(_) => ca,
                };
                let cb = match b {
                    Value::Batched(_) => with_example_rank(&cb, rank)?,
                    Value::Invariant(_) => cb,
                };
                return Ok(Some(vec![ca.mul(&cb)?]));
            }
            let ts = with_example_ranks(inputs, rank)?;
            run(op.clone(), ts)
        }
        // The pooling gradient folded as `MaxPoolGrad`'s, the ReLU's mask over the whole
        // batch, and each example's bias gradient summed over its own pixels.
        Op::MaxPoolBiasActivationGrad(w, activation) if inputs.len() == 2 => {
            let (y, dy) = (inputs[0].batched(batch)?, inputs[1].batched(batch)?);
            if y.rank() != 5 || dy.rank() != 5 {
                return Ok(None);
            }
            let g = Op::MaxPoolGrad(w.clone())
                .execute(&[&fold_batch(&y)?, &fold_batch(&dy)?])?
                .remove(0)
                .reshape_to(y.shape())?;
            let dx = match activation {
                ferroflow_tensor::FusedActivation::Relu => g.relu_grad(&y)?,
                ferroflow_tensor::FusedActivation::Linear => g,
            };
            let db = dx.reduce_sum(ferroflow_tensor::Axes::List(vec![1, 2, 3]), false)?;
            Ok(Some(vec![dx, db]))
        }
        Op::Conv2d(_)
        | Op::FusedConv2d(..)
        | Op::FusedConv2dMaxPool(..)
        | Op::Pool2d(..)
        | Op::MaxPoolGrad(_)
            if inputs[1..].iter().all(|v| !v.is_batched()) || matches!(op, Op::MaxPoolGrad(_)) =>
        {
            // Images [batch, n, h, w, c]: the batch folded into n.
            let mut ts = Vec::with_capacity(inputs.len());
            for (i, v) in inputs.iter().enumerate() {
                let image = i == 0 || matches!(op, Op::MaxPoolGrad(_));
                ts.push(if image {
                    fold_batch(&v.batched(batch)?)?
                } else {
                    v.tensor().clone()
                });
            }
            let r: Vec<&Tensor> = ts.iter().collect();
            let n = inputs[0].tensor().shape()[inputs[0].tensor().rank() - 4];
            // Each output (the fused pooling's two) unfolded again.
            let unfold = |y: Tensor| {
                let mut s = vec![batch, n];
                s.extend_from_slice(&y.shape()[1..]);
                y.reshape_to(&s)
            };
            let ys = op.execute(&r)?.into_iter().map(unfold);
            Ok(Some(ys.collect::<Result<Vec<Tensor>>>()?))
        }
        Op::RandomStateful {
            distribution,
            shape,
            dtype,
            seed,
        } => {
            let mut s = vec![batch];
            s.extend_from_slice(shape);
            run(
                Op::RandomStateful {
                    distribution: *distribution,
                    shape: s,
                    dtype: *dtype,
                    seed: *seed,
                },
                vec![],
            )
        }
        _ => Ok(None),
    }
}

/// `[batch, n, ..]` as `[batch · n, ..]`: a batch of image batches as one.
fn fold_batch(t: &Tensor) -> Result<Tensor> {
    let mut s = vec![t.shape()[0] * t.shape()[1]];
    s.extend_from_slice(&t.shape()[2..]);
    t.reshape_to(&s)
}

/// Runs `node` once per example and stacks the results.
fn per_example(node: &Node, inputs: &[Value], batch: usize) -> Result<Vec<Tensor>> {
    let mut outputs: Vec<Vec<Tensor>> = vec![Vec::with_capacity(batch); node.outputs.len()];
    for b in 0..batch {
        let examples = inputs
            .iter()
            .map(|v| v.example(b))
            .collect::<Result<Vec<_>>>()?;
        let r: Vec<&Tensor> = examples.iter().collect();
        for (k, t) in node.execute(&r)?.into_iter().enumerate() {
            outputs[k].push(t);
        }
    }
    outputs
        .iter()
        .zip(&node.outputs)
        .map(|(ts, ty)| {
            if ts.is_empty() {
                let mut s = vec![0];
                s.extend_from_slice(&ty.shape);
                Tensor::zeros(&s, ty.dtype)
            } else {
                Tensor::stack(ts, 0)
            }
        })
        .collect()
}

/// `f` applied to every example of `elems` (their slices along the first axis), its
/// results stacked along a new first axis (TF's `tf.vectorized_map`) — without a loop:
/// `f` is traced once on the first example and its graph run on the whole batch, each op
/// given a leading batch axis. Ops with no batching rule run once per example (a warning
/// names them); [`vectorized_map_with`] can refuse that instead.
///
/// `f` must not write variables (as in TF's pfor). Tensors it uses from outside are shared
/// by every example; its random ops draw for each example. Gradients flow through the
/// batched ops to `elems` and to what `f` uses from outside.
///
/// ```
/// ferroflow::init();
/// use ferroflow::{function::vectorized_map, Axes, Tensor};
/// // Per-example squared norms of the rows of x, and each row's outer product with itself.
/// let x = Tensor::from_vec(vec![1.0f32, 2.0, 3.0, 4.0, 5.0, 6.0], &[3, 2])?;
/// let out = vectorized_map(
///     |e| {
///         let row = e[0].expand_dims(0)?; // [1, 2]
///         Ok(vec![
///             e[0].square()?.reduce_sum(Axes::All, false)?,
///             row.matmul_t(&row, true, false)?, // [2, 2]
///         ])
///     },
///     &[x],
/// )?;
/// assert_eq!(out[0].to_vec::<f32>()?, vec![5.0, 25.0, 61.0]);
/// assert_eq!(out[1].shape(), &[3, 2, 2]);
/// assert_eq!(out[1].to_vec::<f32>()?[4..8], [9.0, 12.0, 12.0, 16.0]);
/// # Ok::<(), ferroflow::Error>(())
/// ```
pub fn vectorized_map(
    f: impl FnOnce(&[Tensor]) -> Result<Vec<Tensor>>,
    elems: &[Tensor],
) -> Result<Vec<Tensor>> {
    vectorized_map_with(f, elems, true)
}

/// [`vectorized_map`]; with `fallback_to_while_loop: false` (TF's argument of that name) an
/// op with no batching rule is an error naming it instead of a loop over the examples.
///
/// ```
/// ferroflow::init();
/// use ferroflow::{function::{cond, vectorized_map_with}, Tensor};
/// // A cond on each example's own predicate: no batching rule.
/// let f = |e: &[Tensor]| {
///     let x = &e[0];
///     cond(&x.greater(&x.scalar_like(0.0)?)?, || Ok(vec![x.sqrt()?]), || Ok(vec![x.neg()?]))
/// };
/// let xs = Tensor::from_vec(vec![4.0f32, -2.0, 9.0], &[3])?;
/// let e = vectorized_map_with(f, &[xs.clone()], false).unwrap_err();
/// assert!(e.to_string().contains("cond"), "{e}");
/// let ys = vectorized_map_with(f, &[xs], true)?; // once per example
/// assert_eq!(ys[0].to_vec::<f32>()?, vec![2.0, 2.0, 3.0]);
/// # Ok::<(), ferroflow::Error>(())
/// ```
pub fn vectorized_map_with(
    f: impl FnOnce(&[Tensor]) -> Result<Vec<Tensor>>,
    elems: &[Tensor],
    fallback_to_while_loop: bool,
) -> Result<Vec<Tensor>> {
    let first = elems
        .first()
        .ok_or_else(|| Error::invalid("vectorized_map", "needs at least one tensor to map"))?;
    let batch = *first.shape().first().ok_or_else(|| {
        Error::invalid(
            "vectorized_map",
            "the mapped tensors need a first axis (rank >= 1)",
        )
    })?;
    for (i, e) in elems.iter().enumerate() {
        if e.shape().first() != Some(&batch) {
            return Err(Error::invalid(
                "vectorized_map",
                format!(
                    "elems[{i}] has shape {:?}, elems[0] {:?}: every mapped tensor needs the \
                     same first dimension",
                    e.shape(),
                    first.shape()
                ),
            ));
        }
    }
    if batch == 0 {
        return Err(Error::invalid(
            "vectorized_map",
            "the mapped tensors have no examples (first dimension 0): there is nothing to \
             trace the function on",
        ));
    }
    let examples = {
        let _isolated = isolated_scope();
        elems
            .iter()
            .map(|e| example_of(e, 0))
            .collect::<Result<Vec<_>>>()?
    };
    let traced = trace_branch(&examples, f)?;
    let function = crate::function::ConcreteFunction::new(traced.graph, traced.folded);
    let graph = function.graph();
    let mut values: Vec<Vec<Option<Value>>> = graph
        .nodes
        .iter()
        .map(|n| vec![None; n.outputs.len()])
        .collect();
    for (i, node) in graph.nodes.iter().enumerate() {
        let inputs = node
            .inputs
            .iter()
            .map(|v| {
                values[v.node][v.output].clone().ok_or_else(|| {
                    Error::invalid("vectorized_map", "a value used before it was made (a bug)")
                })
            })
            .collect::<Result<Vec<Value>>>()?;
        let out: Vec<Value> = match &node.kind {
            NodeKind::Arg(k) => vec![Value::Batched(elems[*k].clone())],
            NodeKind::Constant(t) | NodeKind::Captured(t) => vec![Value::Invariant(t.clone())],
            NodeKind::ReadVariable(v) => vec![Value::Invariant(v.value())],
            NodeKind::WriteVariable { variable, .. } => {
                return Err(Error::NotTraceable {
                    op: "vectorized_map",
                    msg: format!(
                        "the function writes variable {:?}; vectorized_map runs functions \
                         without side effects (as TF's pfor): return the update instead",
                        variable.name()
                    ),
                })
            }
            NodeKind::HostCall(call) => {
                return Err(Error::NotTraceable {
                    op: "vectorized_map",
                    msg: format!(
                        "the function makes the host call {:?}, which may have effects; \
                         vectorized_map runs functions without side effects (as TF's pfor): \
                         call it outside",
                        call.name()
                    ),
                })
            }
            kind => {
                let random = matches!(kind, NodeKind::Op(Op::RandomStateful { .. }));
                if !random && !inputs.iter().any(Value::is_batched) {
                    let r: Vec<&Tensor> = inputs.iter().map(Value::tensor).collect();
                    node.execute(&r)?
                        .into_iter()
                        .map(Value::Invariant)
                        .collect()
                } else {
                    let ruled = match kind {
                        NodeKind::Op(op) => batch_op(op, &inputs, batch)?,
                        _ => None,
                    };
                    let outs = match ruled {
                        Some(outs) => outs,
                        None => {
                            let name = kind.name();
                            if !fallback_to_while_loop {
                                return Err(Error::NotTraceable {
                                    op: "vectorized_map",
                                    msg: format!(
                                        "no batching rule for {name} (fallback_to_while_loop \
                                         is off)"
                                    ),
                                });
                            }
                            warn_fallback(&name);
                            per_example(node, &inputs, batch)?
                        }
                    };
                    outs.into_iter().map(Value::Batched).collect()
                }
            }
        };
        for (k, v) in out.into_iter().enumerate() {
            values[i][k] = Some(v);
        }
        for v in &function.frees()[i] {
            values[v.node][v.output] = None;
        }
    }
    graph
        .outputs
        .iter()
        .map(|v| {
            values[v.node][v.output]
                .as_ref()
                .ok_or_else(|| Error::invalid("vectorized_map", "an output was freed (a bug)"))?
                .batched(batch)
        })
        .collect()
}

/// `tape.jacobian(target, source)` computed with [`vectorized_map`] over the rows of the
/// identity instead of one backward pass per element of `target` (TF's `tape.jacobian`
/// with `experimental_use_pfor=True`, its default): shape `target.shape ++ source.shape`.
/// The tape is used once, as by `gradient`.
///
/// ```
/// ferroflow::init();
/// use ferroflow::{autodiff::GradientTape, function::jacobian, Tensor};
/// let x = Tensor::from_vec(vec![1.0f64, 2.0, 3.0], &[3])?;
/// let tape = GradientTape::new();
/// tape.watch(&x);
/// let y = x.mul(&x)?; // dy/dx = diag(2x)
/// let j = jacobian(&tape, &y, &(&x).into())?;
/// assert_eq!(j.to_vec::<f64>()?, vec![2.0, 0.0, 0.0, 0.0, 4.0, 0.0, 0.0, 0.0, 6.0]);
/// # Ok::<(), ferroflow::Error>(())
/// ```
pub fn jacobian(tape: &GradientTape, target: &Tensor, source: &Source) -> Result<Tensor> {
    let n = target.num_elements();
    let source_shape = source.shape();
    let mut shape = target.shape().to_vec();
    shape.extend_from_slice(&source_shape);
    if n == 0 {
        return Tensor::zeros(&shape, target.dtype());
    }
    let mut seeds_shape = vec![n];
    seeds_shape.extend_from_slice(target.shape());
    let seeds = identity(n, &seeds_shape, target)?;
    seeded_gradients(tape, target, source, seeds, "jacobian")?.reshape_to(&shape)
}

/// `tape.batch_jacobian(target, source)` with [`vectorized_map`] (TF's default pfor):
/// for `[batch, ..]` target and source whose rows are independent, shape
/// `[batch, target_rest.., source_rest..]`; one backward pass per element of a target row,
/// each for the whole batch, all of them batched.
///
/// ```
/// ferroflow::init();
/// use ferroflow::{autodiff::GradientTape, function::batch_jacobian, Tensor};
/// let x = Tensor::from_vec(vec![1.0f64, 2.0, 3.0, 4.0], &[2, 2])?;
/// let tape = GradientTape::new();
/// tape.watch(&x);
/// let y = x.mul(&x)?; // each row: diag(2 x_row)
/// let j = batch_jacobian(&tape, &y, &(&x).into())?;
/// assert_eq!(j.shape(), &[2, 2, 2]);
/// assert_eq!(j.to_vec::<f64>()?, vec![2.0, 0.0, 0.0, 4.0, 6.0, 0.0, 0.0, 8.0]);
/// # Ok::<(), ferroflow::Error>(())
/// ```
pub fn batch_jacobian(tape: &GradientTape, target: &Tensor, source: &Source) -> Result<Tensor> {
    let source_shape = source.shape();
    let (Some(&batch), Some(&source_batch)) = (target.shape().first(), source_shape.first()) else {
        return Err(Error::invalid(
            "batch_jacobian",
            "target and source need a batch axis (rank >= 1)",
        ));
    };
    if batch != source_batch {
        return Err(Error::invalid(
            "batch_jacobian",
            format!(
                "target batch {batch} differs from source batch {source_batch} ({:?} vs {source_shape:?})",
                target.shape()
            ),
        ));
    }
    let row = &target.shape()[1..];
    let per_row: usize = row.iter().product();
    let mut shape = target.shape().to_vec();
    shape.extend_from_slice(&source_shape[1..]);
    if per_row == 0 || batch == 0 {
        return Tensor::zeros(&shape, target.dtype());
    }
    // Seed j: element j of every row.
    let mut seeds_shape = vec![per_row, 1];
    seeds_shape.extend_from_slice(row);
    let mut full = vec![per_row];
    full.extend_from_slice(target.shape());
    let seeds = identity(per_row, &seeds_shape, target)?.broadcast_to(&full)?;
    let columns = seeded_gradients(tape, target, source, seeds, "batch_jacobian")?;
    // [per_row, batch, source_rest..] → [batch, per_row, source_rest..] → [batch, row.., source_rest..]
    let mut perm: Vec<usize> = (0..columns.rank()).collect();
    perm.swap(0, 1);
    columns.transpose(&perm)?.reshape_to(&shape)
}

/// The `n × n` identity in `target`'s dtype and device, reshaped to `shape`.
fn identity(n: usize, shape: &[usize], target: &Tensor) -> Result<Tensor> {
    let mut data = vec![0.0; n * n];
    for i in 0..n {
        data[i * n + i] = 1.0;
    }
    Tensor::from_host_on(
        HostData::from_f64_slice(target.dtype(), &data),
        shape,
        target.device(),
    )
}

/// d target / d source for each seed (a stack of `target`-shaped output gradients), all
/// the backward passes as one vectorized one.
fn seeded_gradients(
    tape: &GradientTape,
    target: &Tensor,
    source: &Source,
    seeds: Tensor,
    method: &'static str,
) -> Result<Tensor> {
    let grads = vectorized_map(
        |e| {
            let g = tape.gradient_with(
                std::slice::from_ref(target),
                std::slice::from_ref(source),
                Some(&e[..1]),
                UnconnectedGradients::Zero,
            )?;
            let g = g.into_iter().next().flatten().ok_or_else(|| Error::Tape {
                method,
                msg: "no gradient for the source".into(),
            })?;
            Ok(vec![g])
        },
        &[seeds],
    )?;
    grads.into_iter().next().ok_or_else(|| Error::Tape {
        method,
        msg: "vectorized_map returned no gradient (a bug in ferroflow)".into(),
    })
}
