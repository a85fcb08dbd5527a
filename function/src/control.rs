//! Control flow: [`cond`] and [`while_loop`] (TF's `tf.cond` and `tf.while_loop`).
//!
//! Run eagerly they are Rust control flow: the predicate is read on the host and the taken
//! branch (each iteration) runs as ordinary ops, which tapes record. While a graph function
//! traces, the value of a predicate is not known for later calls, so each branch (a loop's
//! condition and body) is traced into a graph of its own and the pair becomes one node
//! ([`NodeKind::Cond`], [`NodeKind::While`]) that picks the branch when the graph runs.
//!
//! What a branch uses from outside (tensors of the enclosing trace, variables it reads
//! before writing them) becomes an input of the node, so a tape inside the traced function
//! sees the dependence: it records the node as one op whose gradient is again control flow
//! (`cond` over the branches' gradients; for a loop, the iterations recomputed and
//! differentiated in reverse, TF's while_v2 with its accumulators).
//!
//! At trace time both branches run once to be traced, with their variable writes checked but
//! not made; then the taken branch runs for real. Random ops in the untaken branch draw
//! numbers then (the generator moves on), which a later call does not.

use crate::function::ConcreteFunction;
use crate::graph::{Graph, NodeKind, ValueType};
use crate::trace::{record, trace_branch, Trace};
use ferroflow_autodiff::{custom_gradient, GradFn, GradientTape, Source, UnconnectedGradients};
use ferroflow_tensor::dispatch::{init_scope, is_tracing, isolated_scope};
use ferroflow_tensor::{DType, Error, Result, Tensor, Variable};
use std::collections::HashMap;
use std::sync::Arc;

/// What a branch uses from outside it, passed to its node as an input.
#[derive(Debug, Clone)]
enum Lifted {
    /// A tensor of the enclosing trace or from outside the function.
    Tensor(Tensor),
    /// A variable the branch reads before any write of its own (tapes are told).
    Read(Variable),
    /// A variable the branch peeks at before any write of its own.
    Peek(Variable),
}

impl Lifted {
    /// Its value now, read in the enclosing context (which records the read).
    fn value(&self) -> Tensor {
        match self {
            Lifted::Tensor(t) => t.clone(),
            Lifted::Read(v) => v.value(),
            Lifted::Peek(v) => v.peek(),
        }
    }
}

/// A traced branch with what it uses from outside turned into arguments.
struct Branch {
    graph: Graph,
    folded: usize,
    lifted: Vec<Lifted>,
    outputs: Vec<ValueType>,
}

impl Branch {
    /// Traces `f` on `args` and lifts what it uses from outside: its `k`-th lifted value
    /// becomes argument `args.len() + k` (shifted by [`Branch::finish`]).
    fn trace(args: &[Tensor], f: impl FnOnce(&[Tensor]) -> Result<Vec<Tensor>>) -> Result<Branch> {
        let Trace {
            mut graph,
            outputs,
            folded,
            peeks,
        } = trace_branch(args, f)?;
        let n = args.len();
        let mut lifted: Vec<Lifted> = Vec::new();
        let mut variable_slots: HashMap<u64, usize> = HashMap::new();
        let mut written = std::collections::HashSet::new();
        // After a nested control-flow node that writes, any variable may have changed.
        let mut opaque_write = false;
        for (i, node) in graph.nodes.iter_mut().enumerate() {
            let slot = match &node.kind {
                NodeKind::Captured(t) => {
                    lifted.push(Lifted::Tensor(t.clone()));
                    lifted.len() - 1
                }
                NodeKind::ReadVariable(v) if !opaque_write && !written.contains(&v.id()) => {
                    let peek = peeks.contains(&i);
                    match variable_slots.get(&v.id()) {
                        Some(&k) => {
                            if !peek {
                                lifted[k] = Lifted::Read(v.clone());
                            }
                            k
                        }
                        None => {
                            lifted.push(if peek {
                                Lifted::Peek(v.clone())
                            } else {
                                Lifted::Read(v.clone())
                            });
                            variable_slots.insert(v.id(), lifted.len() - 1);
                            lifted.len() - 1
                        }
                    }
                }
                NodeKind::WriteVariable { variable, .. } => {
                    written.insert(variable.id());
                    continue;
                }
                kind => {
                    opaque_write |= kind.is_effect();
                    continue;
                }
            };
            node.kind = NodeKind::Arg(n + slot);
        }
        Ok(Branch {
            graph,
            folded,
            lifted,
            outputs: outputs.iter().map(ValueType::of).collect(),
        })
    }

    /// Two branches traced on the same `args` as functions of one input list: `args`, then
    /// the first's lifted values (read now, in the enclosing context), then the second's.
    /// Also whether either writes a variable.
    fn join(
        args: &[Tensor],
        first: Branch,
        second: Branch,
    ) -> (Vec<Tensor>, ConcreteFunction, ConcreteFunction, bool) {
        let mut inputs = args.to_vec();
        inputs.extend(first.lifted.iter().map(Lifted::value));
        inputs.extend(second.lifted.iter().map(Lifted::value));
        let offset = first.lifted.len();
        let first = first.finish(0, inputs.len());
        let second = second.finish(offset, inputs.len());
        let has_effects = graph_has_effects(&first) || graph_has_effects(&second);
        (inputs, first, second, has_effects)
    }

    /// The branch as a function of `num_args` arguments: the `n` it was traced on, then
    /// every branch's lifted values, its own from `n + offset`.
    fn finish(mut self, offset: usize, num_args: usize) -> ConcreteFunction {
        let n = self.graph.num_args;
        for node in &mut self.graph.nodes {
            if let NodeKind::Arg(k) = &mut node.kind {
                if *k >= n {
                    *k += offset;
                }
            }
        }
        self.graph.num_args = num_args;
        ConcreteFunction::new(self.graph, self.folded)
    }
}

/// The two traced branches of a [`cond`] node. Both take the node's inputs after the
/// predicate: the values passed in, then each branch's lifted values.
#[derive(Debug)]
pub struct CondOp {
    then_branch: ConcreteFunction,
    else_branch: ConcreteFunction,
    has_effects: bool,
}

impl CondOp {
    /// The branch run when the predicate is true.
    pub fn then_branch(&self) -> &ConcreteFunction {
        &self.then_branch
    }
    /// The branch run when the predicate is false.
    pub fn else_branch(&self) -> &ConcreteFunction {
        &self.else_branch
    }
    /// Whether a branch writes a variable.
    pub fn has_effects(&self) -> bool {
        self.has_effects
    }
}

/// The traced condition and body of a [`while_loop`] node. Both take the node's inputs:
/// the loop variables, then the condition's and the body's lifted values.
#[derive(Debug)]
pub struct WhileOp {
    condition: ConcreteFunction,
    body: ConcreteFunction,
    num_vars: usize,
    maximum_iterations: Option<usize>,
    has_effects: bool,
}

impl WhileOp {
    /// The condition (one scalar bool).
    pub fn condition(&self) -> &ConcreteFunction {
        &self.condition
    }
    /// The body (the loop variables' next values).
    pub fn body(&self) -> &ConcreteFunction {
        &self.body
    }
    /// How many loop variables the node's inputs start with.
    pub fn num_vars(&self) -> usize {
        self.num_vars
    }
    /// The iteration limit, if any.
    pub fn maximum_iterations(&self) -> Option<usize> {
        self.maximum_iterations
    }
    /// Whether the condition or the body writes a variable.
    pub fn has_effects(&self) -> bool {
        self.has_effects
    }
}

impl CondOp {
    /// A node's branches as loaded from a graph file (whether they write is read off them).
    pub(crate) fn from_branches(
        then_branch: ConcreteFunction,
        else_branch: ConcreteFunction,
    ) -> CondOp {
        let has_effects = graph_has_effects(&then_branch) || graph_has_effects(&else_branch);
        CondOp {
            then_branch,
            else_branch,
            has_effects,
        }
    }
}

impl WhileOp {
    /// A loop node's parts as loaded from a graph file.
    pub(crate) fn from_parts(
        condition: ConcreteFunction,
        body: ConcreteFunction,
        num_vars: usize,
        maximum_iterations: Option<usize>,
    ) -> WhileOp {
        let has_effects = graph_has_effects(&condition) || graph_has_effects(&body);
        WhileOp {
            condition,
            body,
            num_vars,
            maximum_iterations,
            has_effects,
        }
    }
}

fn graph_has_effects(f: &ConcreteFunction) -> bool {
    f.graph().nodes.iter().any(|n| n.kind.is_effect())
}

/// Whether running `f` draws random numbers (in its own ops or a nested control-flow node).
fn draws_random(f: &ConcreteFunction) -> bool {
    f.graph().nodes.iter().any(|n| match &n.kind {
        NodeKind::Op(op) => matches!(op, ferroflow_tensor::Op::RandomStateful { .. }),
        NodeKind::Cond(c) => draws_random(&c.then_branch) || draws_random(&c.else_branch),
        NodeKind::While(w) | NodeKind::WhileGrad(w) => {
            draws_random(&w.condition) || draws_random(&w.body)
        }
        _ => false,
    })
}

/// The gradient of a traced control-flow node recomputes its branches; with random draws
/// inside, the recomputation would draw other numbers than the forward did.
fn refuse_random_recompute(op: &'static str, branches: &[&ConcreteFunction]) -> Result<()> {
    if branches.iter().any(|b| draws_random(b)) {
        return Err(Error::NotTraceable {
            op,
            msg: "a gradient through a traced branch that draws random numbers (it would be \
                  recomputed with other numbers than the forward pass drew): draw them before \
                  the control flow and pass them in"
                .into(),
        });
    }
    Ok(())
}

fn differentiable(dtype: DType) -> bool {
    dtype.is_float() || dtype.is_complex()
}

/// Checks that `pred` is a scalar bool and reads it on the host (also while tracing: the
/// value decides only which branch this call runs, never what the graph holds).
fn read_predicate(op: &'static str, pred: &Tensor) -> Result<bool> {
    if pred.dtype() != DType::Bool || pred.rank() != 0 {
        return Err(Error::invalid(
            op,
            format!(
                "the predicate must be a scalar bool tensor, got shape {:?} {} (reduce it with \
                 `all`/`any` or compare a scalar)",
                pred.shape(),
                pred.dtype()
            ),
        ));
    }
    let _outside_the_trace = init_scope();
    pred.item::<bool>()
}

/// `then_branch()` if `pred` is true, else `else_branch()` (TF's `tf.cond`); `pred` is a
/// scalar bool tensor.
///
/// Eagerly, this is an `if` on the predicate's value. Inside a [`crate::Function`], both
/// branches are traced and the graph chooses on every call; they must then return as many
/// tensors of the same shapes and dtypes. Gradients flow through the taken branch, also
/// when a tape inside the function asks for them.
///
/// ```
/// ferroflow::init();
/// use ferroflow::{function::{cond, Function}, Axes, Tensor};
/// let f = Function::new(|a: &[Tensor]| {
///     let total = a[0].reduce_sum(Axes::All, false)?;
///     let positive = total.greater(&total.scalar_like(0.0)?)?;
///     cond(&positive, || Ok(vec![a[0].sqrt()?]), || Ok(vec![a[0].neg()?]))
/// });
/// let x = Tensor::from_vec(vec![4.0f32, 9.0], &[2])?;
/// assert_eq!(f.call(&[x.clone()])?[0].to_vec::<f32>()?, vec![2.0, 3.0]);
/// assert_eq!(f.call(&[x.neg()?])?[0].to_vec::<f32>()?, vec![4.0, 9.0]); // the same graph
/// assert_eq!(f.tracing_count(), 1);
/// # Ok::<(), ferroflow::Error>(())
/// ```
pub fn cond(
    pred: &Tensor,
    then_branch: impl FnOnce() -> Result<Vec<Tensor>>,
    else_branch: impl FnOnce() -> Result<Vec<Tensor>>,
) -> Result<Vec<Tensor>> {
    cond_with_args(pred, &[], |_| then_branch(), |_| else_branch())
}

/// [`cond`] with the branches' inputs passed explicitly (used for gradients, whose branches
/// take the forward inputs and the output gradients).
fn cond_with_args(
    pred: &Tensor,
    args: &[Tensor],
    then_branch: impl FnOnce(&[Tensor]) -> Result<Vec<Tensor>>,
    else_branch: impl FnOnce(&[Tensor]) -> Result<Vec<Tensor>>,
) -> Result<Vec<Tensor>> {
    if !is_tracing() {
        return if read_predicate("cond", pred)? {
            then_branch(args)
        } else {
            else_branch(args)
        };
    }
    read_predicate("cond", pred)?;
    let then_traced = Branch::trace(args, then_branch)?;
    let else_traced = Branch::trace(args, else_branch)?;
    if then_traced.outputs.len() != else_traced.outputs.len() {
        return Err(Error::invalid(
            "cond",
            format!(
                "the true branch returns {} tensors, the false branch {}: both must return \
                 the same number",
                then_traced.outputs.len(),
                else_traced.outputs.len()
            ),
        ));
    }
    for (i, (a, b)) in then_traced
        .outputs
        .iter()
        .zip(&else_traced.outputs)
        .enumerate()
    {
        if a != b {
            return Err(Error::invalid(
                "cond",
                format!(
                    "output {i}: the true branch gives {:?} {}, the false branch {:?} {}; \
                     inside a function both branches must give the same shapes and dtypes",
                    a.shape, a.dtype, b.shape, b.dtype
                ),
            ));
        }
    }
    let (inputs, then_branch, else_branch, has_effects) =
        Branch::join(args, then_traced, else_traced);
    let op = Arc::new(CondOp {
        then_branch,
        else_branch,
        has_effects,
    });
    run_cond(&op, pred, &inputs)
}

/// Runs a traced `cond` node: eagerly, the taken branch's ops (tapes record them); while
/// tracing, the taken branch for its value and one node in the trace (and on tapes).
pub(crate) fn run_cond(op: &Arc<CondOp>, pred: &Tensor, inputs: &[Tensor]) -> Result<Vec<Tensor>> {
    let taken = if read_predicate("cond", pred)? {
        &op.then_branch
    } else {
        &op.else_branch
    };
    if !is_tracing() {
        return taken.replay(inputs);
    }
    let values = {
        let _isolated = isolated_scope();
        taken.replay(inputs)?
    };
    let gradient: GradFn = {
        let (op, pred, inputs) = (op.clone(), pred.clone(), inputs.to_vec());
        Arc::new(move |dys: &[Tensor]| {
            refuse_random_recompute("cond", &[&op.then_branch, &op.else_branch])?;
            cond_gradient(&op, &pred, &inputs, dys)
        })
    };
    let outputs = custom_gradient(inputs, |_| Ok((values, gradient)))?;
    let mut node_inputs = vec![pred.clone()];
    node_inputs.extend_from_slice(inputs);
    record(NodeKind::Cond(op.clone()), &node_inputs, &outputs)?;
    Ok(outputs)
}

/// The gradient of a `cond` node: a `cond` over the branches' gradients.
fn cond_gradient(
    op: &Arc<CondOp>,
    pred: &Tensor,
    inputs: &[Tensor],
    dys: &[Tensor],
) -> Result<Vec<Option<Tensor>>> {
    let n = inputs.len();
    let mut args = inputs.to_vec();
    args.extend_from_slice(dys);
    let grads = cond_with_args(
        pred,
        &args,
        |a| branch_gradient(&op.then_branch, &a[..n], &a[n..]),
        |a| branch_gradient(&op.else_branch, &a[..n], &a[n..]),
    )?;
    Ok(grads
        .into_iter()
        .zip(inputs)
        .map(|(g, x)| differentiable(x.dtype()).then_some(g))
        .collect())
}

/// d(`f`'s outputs · `dys`)/d`xs` for a branch run on `xs`: zeros for inputs it does not
/// use and for integer inputs (both branches of a gradient `cond` must give tensors).
fn branch_gradient(f: &ConcreteFunction, xs: &[Tensor], dys: &[Tensor]) -> Result<Vec<Tensor>> {
    let xs = Tensor::with_distinct_ids(xs)?;
    let tape = GradientTape::with_options(false, false);
    for x in xs.iter().filter(|x| differentiable(x.dtype())) {
        tape.watch(x);
    }
    let ys = f.replay(&xs)?;
    let (targets, seeds): (Vec<Tensor>, Vec<Tensor>) = ys
        .into_iter()
        .zip(dys)
        .filter(|(y, _)| differentiable(y.dtype()))
        .map(|(y, dy)| (y, dy.clone()))
        .unzip();
    let sources: Vec<Source> = xs
        .iter()
        .filter(|x| differentiable(x.dtype()))
        .map(Source::from)
        .collect();
    let mut grads = if targets.is_empty() || sources.is_empty() {
        Vec::new()
    } else {
        tape.gradient_with(&targets, &sources, Some(&seeds), UnconnectedGradients::Zero)?
    }
    .into_iter();
    xs.iter()
        .map(|x| match differentiable(x.dtype()) {
            true => match grads.next().flatten() {
                Some(g) => Ok(g),
                None => x.zeros_like(),
            },
            false => x.zeros_like(),
        })
        .collect()
}

/// Runs `body` while `condition` holds (TF's `tf.while_loop`): `condition` maps the loop
/// variables to a scalar bool tensor, `body` to their next values.
///
/// Eagerly, this is a Rust loop. Inside a [`crate::Function`], the condition and the body
/// are traced once each and the graph loops as many times as each call needs; the body
/// must then keep every loop variable's shape and dtype (TF's shape invariants).
/// Gradients flow through every iteration, also when a tape inside the function asks for
/// them (the iterations' values are kept and differentiated in reverse).
///
/// ```
/// ferroflow::init();
/// use ferroflow::{function::{while_loop, Function}, Tensor};
/// // x doubled until it exceeds a limit passed as an argument
/// let f = Function::new(|a: &[Tensor]| {
///     let limit = a[1].clone();
///     while_loop(
///         |v| v[0].less_equal(&limit),
///         |v| Ok(vec![v[0].add(&v[0])?]),
///         &a[..1],
///     )
/// });
/// let one = Tensor::scalar(1.0f32)?;
/// assert_eq!(f.call(&[one.clone(), Tensor::scalar(10.0f32)?])?[0].item::<f32>()?, 16.0);
/// assert_eq!(f.call(&[one, Tensor::scalar(100.0f32)?])?[0].item::<f32>()?, 128.0);
/// assert_eq!(f.tracing_count(), 1);
/// # Ok::<(), ferroflow::Error>(())
/// ```
pub fn while_loop(
    condition: impl Fn(&[Tensor]) -> Result<Tensor>,
    body: impl Fn(&[Tensor]) -> Result<Vec<Tensor>>,
    loop_vars: &[Tensor],
) -> Result<Vec<Tensor>> {
    while_loop_with(condition, body, loop_vars, None)
}

/// [`while_loop`] that stops after `maximum_iterations` iterations at most (TF's argument
/// of that name) even while the condition holds.
///
/// ```
/// ferroflow::init();
/// use ferroflow::{function::while_loop_with, Tensor};
/// let ones = while_loop_with(
///     |_| Tensor::scalar(true),
///     |v| Ok(vec![v[0].add(&v[0].ones_like()?)?]),
///     &[Tensor::scalar(0i32)?],
///     Some(7),
/// )?;
/// assert_eq!(ones[0].item::<i32>()?, 7);
/// # Ok::<(), ferroflow::Error>(())
/// ```
pub fn while_loop_with(
    condition: impl Fn(&[Tensor]) -> Result<Tensor>,
    body: impl Fn(&[Tensor]) -> Result<Vec<Tensor>>,
    loop_vars: &[Tensor],
    maximum_iterations: Option<usize>,
) -> Result<Vec<Tensor>> {
    let n = loop_vars.len();
    let check_body = |i: usize, next: &[Tensor]| -> Result<()> {
        if next.len() != n {
            return Err(Error::invalid(
                "while_loop",
                format!(
                    "the body returned {} values for {n} loop variables",
                    next.len()
                ),
            ));
        }
        for (k, (a, b)) in loop_vars.iter().zip(next).enumerate() {
            if a.dtype() != b.dtype() || (is_tracing() && a.shape() != b.shape()) {
                return Err(Error::invalid(
                    "while_loop",
                    format!(
                        "loop variable {k} enters as {:?} {} and leaves iteration {i} as {:?} \
                         {}; inside a function the body must keep each variable's shape and \
                         dtype",
                        a.shape(),
                        a.dtype(),
                        b.shape(),
                        b.dtype()
                    ),
                ));
            }
        }
        Ok(())
    };
    if !is_tracing() {
        let mut vars = loop_vars.to_vec();
        let mut i = 0;
        while maximum_iterations.is_none_or(|m| i < m)
            && read_predicate("while_loop", &condition(&vars)?)?
        {
            let next = body(&vars)?;
            check_body(i, &next)?;
            vars = next;
            i += 1;
        }
        return Ok(vars);
    }
    let condition_traced = Branch::trace(loop_vars, |v| Ok(vec![condition(v)?]))?;
    if condition_traced.outputs.len() != 1
        || condition_traced.outputs[0].dtype != DType::Bool
        || !condition_traced.outputs[0].shape.is_empty()
    {
        let got = &condition_traced.outputs[0];
        return Err(Error::invalid(
            "while_loop",
            format!(
                "the condition must give a scalar bool tensor, got shape {:?} {}",
                got.shape, got.dtype
            ),
        ));
    }
    let mut next = Vec::new();
    let body_traced = Branch::trace(loop_vars, |v| {
        let out = body(v)?;
        next = out.clone();
        Ok(out)
    })?;
    check_body(0, &next)?;
    let (inputs, condition, body, has_effects) =
        Branch::join(loop_vars, condition_traced, body_traced);
    let op = Arc::new(WhileOp {
        condition,
        body,
        num_vars: n,
        maximum_iterations,
        has_effects,
    });
    run_while(&op, &inputs)
}

/// The loop of a traced `while_loop` node on its inputs; each iteration's loop variables
/// are pushed to `states` when given (for the gradient).
fn iterate(
    op: &WhileOp,
    inputs: &[Tensor],
    mut states: Option<&mut Vec<Vec<Tensor>>>,
) -> Result<Vec<Tensor>> {
    let n = op.num_vars;
    let mut args = inputs.to_vec();
    let mut i = 0;
    while op.maximum_iterations.is_none_or(|m| i < m)
        && read_predicate("while_loop", &op.condition.replay(&args)?[0])?
    {
        if let Some(states) = states.as_deref_mut() {
            states.push(args[..n].to_vec());
        }
        let next = op.body.replay(&args)?;
        args.splice(..n, next);
        i += 1;
    }
    args.truncate(n);
    Ok(args)
}

/// Runs a traced `while_loop` node: eagerly, every iteration's ops (tapes record them);
/// while tracing, the loop for its value and one node in the trace (and on tapes).
pub(crate) fn run_while(op: &Arc<WhileOp>, inputs: &[Tensor]) -> Result<Vec<Tensor>> {
    if !is_tracing() {
        return iterate(op, inputs, None);
    }
    let values = {
        let _isolated = isolated_scope();
        iterate(op, inputs, None)?
    };
    let gradient: GradFn = {
        let (op, inputs) = (op.clone(), inputs.to_vec());
        Arc::new(move |dys: &[Tensor]| {
            refuse_random_recompute("while_loop", &[&op.condition, &op.body])?;
            let grads = run_while_gradient(&op, &inputs, dys)?;
            Ok(grads
                .into_iter()
                .zip(&inputs)
                .map(|(g, x)| differentiable(x.dtype()).then_some(g))
                .collect())
        })
    };
    let outputs = custom_gradient(inputs, |_| Ok((values, gradient)))?;
    record(NodeKind::While(op.clone()), inputs, &outputs)?;
    Ok(outputs)
}

/// The gradient of a `while_loop` node with respect to each of its inputs (zeros where
/// none flows) given its outputs' gradients `dys`: eagerly, the iterations recomputed and
/// differentiated in reverse; while tracing, one node in the trace.
pub(crate) fn run_while_gradient(
    op: &Arc<WhileOp>,
    inputs: &[Tensor],
    dys: &[Tensor],
) -> Result<Vec<Tensor>> {
    if !is_tracing() {
        return while_gradient(op, inputs, dys);
    }
    let values = {
        let _isolated = isolated_scope();
        while_gradient(op, inputs, dys)?
    };
    let unsupported: GradFn = Arc::new(|_: &[Tensor]| {
        Err(Error::NotTraceable {
            op: "while_loop",
            msg: "a second-order gradient through a while_loop inside a function; take it \
                  outside the function (eager loops have every order)"
                .into(),
        })
    });
    let mut node_inputs = inputs.to_vec();
    node_inputs.extend_from_slice(dys);
    let outputs = custom_gradient(&node_inputs, |_| Ok((values, unsupported)))?;
    record(NodeKind::WhileGrad(op.clone()), &node_inputs, &outputs)?;
    Ok(outputs)
}

fn while_gradient(op: &WhileOp, inputs: &[Tensor], dys: &[Tensor]) -> Result<Vec<Tensor>> {
    let n = op.num_vars;
    let mut states = Vec::new();
    iterate(op, inputs, Some(&mut states))?;
    let mut var_grads: Vec<Tensor> = dys[..n].to_vec();
    let mut lifted_grads: Vec<Tensor> = inputs[n..]
        .iter()
        .map(Tensor::zeros_like)
        .collect::<Result<_>>()?;
    for state in states.iter().rev() {
        let mut args = state.clone();
        args.extend_from_slice(&inputs[n..]);
        let grads = branch_gradient(&op.body, &args, &var_grads)?;
        let (vars, lifted) = grads.split_at(n);
        var_grads = vars.to_vec();
        for (acc, g) in lifted_grads.iter_mut().zip(lifted) {
            if differentiable(g.dtype()) {
                *acc = acc.add(g)?;
            }
        }
    }
    var_grads.extend(lifted_grads);
    Ok(var_grads)
}
