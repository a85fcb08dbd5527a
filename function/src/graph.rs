//! The graph a trace records: nodes in execution order, each reading earlier nodes' outputs.

use crate::control::{run_cond, run_while, run_while_gradient, CondOp, WhileOp};
use ferroflow_tensor::dispatch::HostCall;
use ferroflow_tensor::distribution::VariableWrite;
use ferroflow_tensor::{DType, Error, Op, Result, Tensor, Variable};
use std::sync::Arc;

/// One output of one node.
#[derive(
    Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, serde::Serialize, serde::Deserialize,
)]
pub struct ValueRef {
    /// The node's index in [`Graph::nodes`].
    pub node: usize,
    /// Which of its outputs.
    pub output: usize,
}

/// The type of a value: shape and dtype, as recorded at trace time.
#[derive(Debug, Clone, PartialEq, Eq, Hash, serde::Serialize, serde::Deserialize)]
pub struct ValueType {
    /// Shape.
    pub shape: Vec<usize>,
    /// Element type.
    pub dtype: DType,
}

impl ValueType {
    pub(crate) fn of(t: &Tensor) -> ValueType {
        ValueType {
            shape: t.shape().to_vec(),
            dtype: t.dtype(),
        }
    }
    /// Bytes a dense buffer of this type holds.
    pub fn bytes(&self) -> usize {
        self.shape.iter().product::<usize>() * self.dtype.size_in_bytes()
    }
}

/// What a node does.
#[derive(Debug, Clone)]
pub enum NodeKind {
    /// The function's `i`-th argument.
    Arg(usize),
    /// A constant made inside the function (or folded from constants).
    Constant(Tensor),
    /// A tensor from outside the function that it uses (TF's captured eager tensor), held by
    /// reference: the same tensor on every call, so an outer tape that watches it still sees
    /// the ops that use it.
    Captured(Tensor),
    /// The current value of a variable (read on every call).
    ReadVariable(Variable),
    /// A primitive op.
    Op(Op),
    /// A write to a variable (an effect: kept even though nothing reads it).
    WriteVariable {
        /// The variable.
        variable: Variable,
        /// `assign`, `assign_add` or `assign_sub`.
        kind: VariableWrite,
    },
    /// `cond` ([`crate::cond`]): inputs `[pred, the branches' inputs..]`.
    Cond(Arc<CondOp>),
    /// `while_loop` ([`crate::while_loop`]): inputs `[loop variables.., lifted values..]`,
    /// outputs the loop variables' final values.
    While(Arc<WhileOp>),
    /// The gradient of a `while_loop` node: inputs its inputs then its outputs' gradients,
    /// outputs one gradient per input.
    WhileGrad(Arc<WhileOp>),
    /// A [`HostCall`]: its closure runs on the host on every call (an effect: kept in its
    /// place, never merged; graph files and `vectorized_map` refuse it).
    HostCall(HostCall),
}

impl NodeKind {
    /// A short name for listings.
    pub fn name(&self) -> String {
        match self {
            NodeKind::Arg(i) => format!("arg{i}"),
            NodeKind::Constant(_) => "constant".into(),
            NodeKind::Captured(_) => "captured".into(),
            NodeKind::ReadVariable(v) => format!("read_variable({})", v.name()),
            NodeKind::Op(op) => op.name().into(),
            NodeKind::WriteVariable { variable, kind } => {
                format!("{}({})", kind.name(), variable.name())
            }
            NodeKind::Cond(op) => format!(
                "cond[then: {} ops, else: {} ops]",
                op.then_branch().stats().ops,
                op.else_branch().stats().ops
            ),
            NodeKind::While(op) => format!(
                "while[condition: {} ops, body: {} ops]",
                op.condition().stats().ops,
                op.body().stats().ops
            ),
            NodeKind::WhileGrad(_) => "while_grad".into(),
            NodeKind::HostCall(call) => format!("host_call({})", call.name()),
        }
    }
    /// Whether running it changes something outside the graph (it must run even when
    /// nothing reads it, in its place among the other effects).
    pub fn is_effect(&self) -> bool {
        match self {
            NodeKind::WriteVariable { .. } => true,
            NodeKind::Cond(op) => op.has_effects(),
            NodeKind::While(op) => op.has_effects(),
            NodeKind::HostCall(_) => true,
            _ => false,
        }
    }
}

/// One node: what it does, what it reads, the types of what it makes.
#[derive(Debug, Clone)]
pub struct Node {
    /// What it does.
    pub kind: NodeKind,
    /// Its inputs, outputs of earlier nodes.
    pub inputs: Vec<ValueRef>,
    /// The types of its outputs.
    pub outputs: Vec<ValueType>,
    /// The name scope it was traced in (`sequential/dense`; empty at top level): replays
    /// run it there, so profiles name its ops as eager ones.
    pub scope: Arc<str>,
}

impl Node {
    /// Runs an op, control-flow or variable-write node on its inputs (the other kinds take
    /// their value from the call: arguments, constants, captures, variables).
    pub(crate) fn execute(&self, inputs: &[&Tensor]) -> Result<Vec<Tensor>> {
        let owned = || inputs.iter().map(|t| (*t).clone()).collect::<Vec<Tensor>>();
        match &self.kind {
            NodeKind::Op(op) => op.execute(inputs),
            NodeKind::WriteVariable { variable, kind } => {
                let value = inputs.first().ok_or_else(|| {
                    Error::invalid("function", "a variable write without a value")
                })?;
                match kind {
                    VariableWrite::Assign => variable.assign(value)?,
                    VariableWrite::Add => variable.assign_add(value)?,
                    VariableWrite::Sub => variable.assign_sub(value)?,
                }
                Ok(vec![])
            }
            NodeKind::Cond(op) => {
                let inputs = owned();
                let (pred, rest) = inputs
                    .split_first()
                    .ok_or_else(|| Error::invalid("function", "a cond node without a predicate"))?;
                run_cond(op, pred, rest)
            }
            NodeKind::While(op) => run_while(op, &owned()),
            NodeKind::HostCall(call) => call.call(&owned()),
            NodeKind::WhileGrad(op) => {
                // Inputs: the loop's inputs (one gradient out for each), then dys.
                let inputs = owned();
                if inputs.len() < self.outputs.len() {
                    return Err(Error::invalid(
                        "function",
                        "a while_grad node short of inputs",
                    ));
                }
                let (forward, dys) = inputs.split_at(self.outputs.len());
                run_while_gradient(op, forward, dys)
            }
            NodeKind::Arg(_)
            | NodeKind::Constant(_)
            | NodeKind::Captured(_)
            | NodeKind::ReadVariable(_) => Err(Error::invalid(
                "function",
                format!(
                    "{} takes its value from the call (a bug in ferroflow)",
                    self.kind.name()
                ),
            )),
        }
    }
}

/// A traced function's graph: nodes in an order that runs them (inputs first, effects in
/// the order the trace made them), and the values the function returns.
#[derive(Debug, Clone, Default)]
pub struct Graph {
    /// The nodes.
    pub nodes: Vec<Node>,
    /// The returned values.
    pub outputs: Vec<ValueRef>,
    /// How many arguments it takes.
    pub num_args: usize,
}

/// What the passes did to a graph, for tests and the curious (`ConcreteFunction::stats`).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct GraphStats {
    /// Nodes the trace recorded.
    pub traced_nodes: usize,
    /// Op nodes replaced by constants computed at trace time.
    pub folded: usize,
    /// Nodes merged into an equal earlier node.
    pub merged: usize,
    /// Nodes removed because nothing used them.
    pub dead: usize,
    /// Op nodes replaced by fused ones: elementwise ops (`Op::FusedElementwise`), and
    /// products with their bias add and ReLU (`Op::FusedMatMul`).
    pub fused: usize,
    /// Nodes left.
    pub nodes: usize,
    /// Op nodes left: the kernels (or views) one call dispatches.
    pub ops: usize,
    /// The most bytes of intermediate values alive at once when values are freed after
    /// their last use (views counted as buffers: an upper bound).
    pub peak_bytes: usize,
}

impl Graph {
    /// Whether it (or a control-flow branch in it) holds an output of `custom_gradient`
    /// (`Op::StopGradient { custom_gradient: true }`), whose gradient function a graph
    /// cannot hold.
    pub(crate) fn has_custom_gradients(&self) -> bool {
        self.nodes.iter().any(|n| match &n.kind {
            NodeKind::Op(Op::StopGradient { custom_gradient }) => *custom_gradient,
            NodeKind::Cond(c) => {
                c.then_branch().graph().has_custom_gradients()
                    || c.else_branch().graph().has_custom_gradients()
            }
            NodeKind::While(w) | NodeKind::WhileGrad(w) => {
                w.condition().graph().has_custom_gradients()
                    || w.body().graph().has_custom_gradients()
            }
            _ => false,
        })
    }

    /// For each node, the values whose last reader it is (freed right after it runs).
    pub(crate) fn last_uses(&self) -> Vec<Vec<ValueRef>> {
        let mut last = std::collections::HashMap::new();
        for (i, n) in self.nodes.iter().enumerate() {
            for v in &n.inputs {
                last.insert(*v, i);
            }
        }
        for v in &self.outputs {
            last.insert(*v, usize::MAX);
        }
        let mut frees = vec![vec![]; self.nodes.len()];
        for (v, &i) in &last {
            if i != usize::MAX {
                frees[i].push(*v);
            }
        }
        // Values nobody reads are freed as soon as they are made.
        for (i, n) in self.nodes.iter().enumerate() {
            for k in 0..n.outputs.len() {
                let v = ValueRef { node: i, output: k };
                if !last.contains_key(&v) {
                    frees[i].push(v);
                }
            }
        }
        frees
    }

    /// The most bytes of values alive at once under [`Graph::last_uses`] (arguments,
    /// constants and variables excluded: they exist anyway).
    pub(crate) fn peak_bytes(&self) -> usize {
        let frees = self.last_uses();
        let (mut live, mut peak) = (0usize, 0usize);
        let counts = |n: &Node| matches!(n.kind, NodeKind::Op(_));
        for (i, n) in self.nodes.iter().enumerate() {
            if counts(n) {
                live += n.outputs.iter().map(ValueType::bytes).sum::<usize>();
            }
            peak = peak.max(live);
            for v in &frees[i] {
                let m = &self.nodes[v.node];
                if counts(m) {
                    live -= m.outputs[v.output].bytes();
                }
            }
        }
        peak
    }

    /// Runs the graph on `args`: each node in order, each value dropped after its last
    /// reader ran. Ops go through the dispatcher, so a tape active around the call records
    /// them (gradients, higher-order too) and a profiler sees them.
    pub(crate) fn run(&self, args: &[Tensor], frees: &[Vec<ValueRef>]) -> Result<Vec<Tensor>> {
        if args.len() != self.num_args {
            return Err(Error::invalid(
                "function",
                format!("takes {} arguments, got {}", self.num_args, args.len()),
            ));
        }
        let mut values: Vec<Vec<Option<Tensor>>> = self
            .nodes
            .iter()
            .map(|n| vec![None; n.outputs.len()])
            .collect();
        let profiling = ferroflow_tensor::trace::is_active();
        for (i, node) in self.nodes.iter().enumerate() {
            let _scope = (profiling && !node.scope.is_empty())
                .then(|| ferroflow_tensor::trace::NameScope::enter_path(&node.scope));
            let get = |v: &ValueRef| {
                values[v.node][v.output].as_ref().ok_or_else(|| {
                    Error::invalid(
                        "function",
                        format!("graph value {v:?} read after it was freed (a bug in ferroflow)"),
                    )
                })
            };
            let out = match &node.kind {
                NodeKind::Arg(k) => vec![args[*k].clone()],
                NodeKind::Constant(t) | NodeKind::Captured(t) => vec![t.clone()],
                NodeKind::ReadVariable(v) => vec![v.value()],
                _ => {
                    let inputs = node.inputs.iter().map(get).collect::<Result<Vec<_>>>()?;
                    node.execute(&inputs)?
                }
            };
            if out.len() != node.outputs.len() {
                return Err(Error::invalid(
                    "function",
                    format!(
                        "node {i} ({}) made {} values, the trace recorded {}",
                        node.kind.name(),
                        out.len(),
                        node.outputs.len()
                    ),
                ));
            }
            for (k, t) in out.into_iter().enumerate() {
                let recorded = &node.outputs[k];
                if t.shape() != recorded.shape.as_slice() || t.dtype() != recorded.dtype {
                    if let NodeKind::Arg(k) = node.kind {
                        return Err(Error::invalid(
                            "function",
                            format!(
                                "argument {k} must be {:?} {} (the traced signature), got {:?} {}",
                                recorded.shape,
                                recorded.dtype,
                                t.shape(),
                                t.dtype()
                            ),
                        ));
                    }
                    return Err(Error::invalid(
                        "function",
                        format!(
                            "node %{i} ({}) made {:?} {}, the graph records {:?} {}",
                            node.kind.name(),
                            t.shape(),
                            t.dtype(),
                            recorded.shape,
                            recorded.dtype
                        ),
                    ));
                }
                values[i][k] = Some(t);
            }
            for v in &frees[i] {
                values[v.node][v.output] = None;
            }
        }
        self.outputs
            .iter()
            .map(|v| {
                values[v.node][v.output].clone().ok_or_else(|| {
                    Error::invalid("function", "an output was freed (a bug in ferroflow)")
                })
            })
            .collect()
    }

    /// A listing, one node per line (`%3 = matmul(%1, %2) : [32, 10] float32`).
    pub fn listing(&self) -> String {
        use std::fmt::Write;
        let mut s = String::new();
        let name = |v: &ValueRef| {
            if v.output == 0 {
                format!("%{}", v.node)
            } else {
                format!("%{}:{}", v.node, v.output)
            }
        };
        for (i, n) in self.nodes.iter().enumerate() {
            let inputs: Vec<String> = n.inputs.iter().map(name).collect();
            let types: Vec<String> = n
                .outputs
                .iter()
                .map(|t| format!("{:?} {}", t.shape, t.dtype))
                .collect();
            let _ = writeln!(
                s,
                "%{i} = {}({}) : {}",
                n.kind.name(),
                inputs.join(", "),
                types.join(", ")
            );
        }
        let outs: Vec<String> = self.outputs.iter().map(name).collect();
        let _ = writeln!(s, "return {}", outs.join(", "));
        s
    }
}
