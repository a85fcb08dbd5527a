//! A graph function's call recorded on a tape as one op (TF records a `PartitionedCall`
//! with the function's gradient function): its gradient is a traced and optimised backward
//! graph that reads the values the forward saved.
//!
//! On the first call under a tape, the graph (its variable reads and captured tensors made
//! arguments: the *primal* graph) is traced once more with a tape inside taking its
//! gradient for given output gradients. That combined graph is split: the nodes that do not
//! depend on the output gradients form the *forward* graph, which returns the outputs and
//! the values the rest reads (the saved intermediates); the others form the *backward*
//! graph, which takes the saved values and the output gradients. Both go through the passes
//! (fusion included), so the backward is compiled as the forward is.
//!
//! A call then runs the forward graph inside `custom_gradient` (the tape sees one op, its
//! inputs the arguments, the variables' values read under the tape, and the captured
//! tensors) and the gradient runs the backward graph. When a tape is recording while that
//! gradient runs (a second-order gradient), the gradient is instead recomputed through the
//! primal graph under a tape, so the recording tape sees every op and differentiates it
//! again: every order works.
//!
//! Only graphs whose result does not change with how they run qualify: no variable writes,
//! no random draws, no control-flow nodes, float outputs. Others are replayed op by op with
//! the tape recording each, as before.

use crate::function::ConcreteFunction;
use crate::graph::{Graph, Node, NodeKind, ValueRef};
use crate::passes::{eliminate_common_subexpressions, eliminate_dead_code};
use crate::trace::trace;
use ferroflow_autodiff::{
    custom_gradient, is_recording, stop_gradient, GradFn, GradientTape, Source,
    UnconnectedGradients,
};
use ferroflow_tensor::dispatch::isolated_scope;
use ferroflow_tensor::{Error, Op, Result, Tensor};
use std::collections::HashMap;
use std::sync::Arc;

/// The forward and backward graphs of a function recorded as one op.
#[derive(Debug)]
pub(crate) struct TapeOp {
    /// The graph with reads and captures as arguments `num_args..`.
    primal: ConcreteFunction,
    /// Primal arguments → outputs, then the saved values.
    forward: ConcreteFunction,
    /// Saved values, then one gradient per output → one gradient per differentiable input.
    backward: ConcreteFunction,
    num_outputs: usize,
    /// The inputs that get a gradient (float or complex), in the backward's output order.
    differentiable: Vec<usize>,
}

fn differentiable(t: &crate::graph::ValueType) -> bool {
    t.dtype.is_float() || t.dtype.is_complex()
}

/// Whether `graph` qualifies (see the module docs).
fn qualifies(graph: &Graph) -> bool {
    graph.nodes.iter().all(|n| match &n.kind {
        NodeKind::Op(op) => !matches!(op, Op::RandomStateful { .. } | Op::HostFunction { .. }),
        NodeKind::Arg(_)
        | NodeKind::Constant(_)
        | NodeKind::Captured(_)
        | NodeKind::ReadVariable(_) => true,
        _ => false,
    }) && graph
        .outputs
        .iter()
        .all(|v| differentiable(&graph.nodes[v.node].outputs[v.output]))
}

impl TapeOp {
    /// The inputs a call on `args` passes to the op: the arguments, the variables' values
    /// (read here, where the tapes see the reads and watch trainable variables), then the
    /// captured tensors.
    pub(crate) fn inputs_of(graph: &Graph, args: &[Tensor]) -> Vec<Tensor> {
        let mut inputs: Vec<Tensor> = args.to_vec();
        let mut captures = Vec::new();
        for n in &graph.nodes {
            match &n.kind {
                NodeKind::ReadVariable(v) => inputs.push(v.value()),
                NodeKind::Captured(t) => captures.push(t.clone()),
                _ => {}
            }
        }
        inputs.extend(captures);
        inputs
    }

    /// Builds the graphs for `function` with gradients for the inputs `needed` marks
    /// (those a tape tracks), tracing on `inputs` ([`TapeOp::inputs_of`]); `None` when it
    /// does not qualify or no input needs a gradient.
    pub(crate) fn build(
        function: &ConcreteFunction,
        inputs: &[Tensor],
        needed: &[bool],
    ) -> Result<Option<TapeOp>> {
        let graph = function.graph();
        if !qualifies(graph) {
            return Ok(None);
        }
        // The primal graph: reads and captures become arguments.
        let count = |f: fn(&NodeKind) -> bool| graph.nodes.iter().filter(|n| f(&n.kind)).count();
        let reads = count(|k| matches!(k, NodeKind::ReadVariable(_)));
        let captures = count(|k| matches!(k, NodeKind::Captured(_)));
        let num_inputs = graph.num_args + reads + captures;
        if inputs.len() != num_inputs {
            return Err(Error::invalid(
                "function",
                "a call's inputs do not match its graph (a bug in ferroflow)",
            ));
        }
        let (mut next_read, mut next_capture) = (graph.num_args, graph.num_args + reads);
        let mut primal = graph.clone();
        for n in &mut primal.nodes {
            match n.kind {
                NodeKind::ReadVariable(_) => {
                    n.kind = NodeKind::Arg(next_read);
                    next_read += 1;
                }
                NodeKind::Captured(_) => {
                    n.kind = NodeKind::Arg(next_capture);
                    next_capture += 1;
                }
                _ => {}
            }
        }
        primal.num_args = num_inputs;
        let primal = ConcreteFunction::from_graph(primal);
        let input_types = primal.input_types();
        let differentiable: Vec<usize> = (0..num_inputs)
            .filter(|&i| {
                needed.get(i) == Some(&true) && input_types[i].as_ref().is_some_and(differentiable)
            })
            .collect();
        if differentiable.is_empty() {
            return Ok(None);
        }
        let num_outputs = graph.outputs.len();

        // Trace forward and backward together, apart from the tapes around the call (fresh
        // identities: no outer tape tracks the trace's inputs).
        let _isolated = isolated_scope();
        let values = inputs
            .iter()
            .map(stop_gradient)
            .collect::<Result<Vec<Tensor>>>()?;
        let outputs = primal.replay(&values)?;
        let mut combined_args = values;
        for o in &outputs {
            combined_args.push(o.ones_like()?);
        }
        let combined = trace(&combined_args, |a| {
            let (inputs, dys) = a.split_at(num_inputs);
            let tape = GradientTape::new();
            for &i in &differentiable {
                tape.watch(&inputs[i]);
            }
            let mut outs = primal.replay(inputs)?;
            let sources: Vec<Source> = differentiable
                .iter()
                .map(|&i| (&inputs[i]).into())
                .collect();
            let grads =
                tape.gradient_with(&outs, &sources, Some(dys), UnconnectedGradients::Zero)?;
            for g in grads {
                outs.push(g.ok_or_else(|| {
                    Error::invalid(
                        "function",
                        "a zero gradient went missing (a bug in ferroflow)",
                    )
                })?);
            }
            Ok(outs)
        })?;
        let mut graph = combined.graph;
        eliminate_common_subexpressions(&mut graph);
        eliminate_dead_code(&mut graph);
        let (forward, backward) = split(&graph, num_inputs, num_outputs)?;
        Ok(Some(TapeOp {
            primal,
            forward: ConcreteFunction::new(forward, 0),
            backward: ConcreteFunction::new(backward, 0),
            num_outputs,
            differentiable,
        }))
    }

    /// Runs the function as one op on the tapes recording now, on [`TapeOp::inputs_of`].
    pub(crate) fn call(self: &Arc<TapeOp>, inputs: &[Tensor]) -> Result<Vec<Tensor>> {
        let op = self.clone();
        custom_gradient(inputs, move |inputs| {
            let mut outputs = op.forward.replay(inputs)?;
            let saved = outputs.split_off(op.num_outputs);
            let inputs = inputs.to_vec();
            let gradient: GradFn =
                Arc::new(move |dys: &[Tensor]| op.gradient(&inputs, &saved, dys));
            Ok((outputs, gradient))
        })
    }

    fn gradient(
        &self,
        inputs: &[Tensor],
        saved: &[Tensor],
        dys: &[Tensor],
    ) -> Result<Vec<Option<Tensor>>> {
        let expected = &self.backward.input_types()[saved.len()..];
        let fits = dys.len() == expected.len()
            && dys.iter().zip(expected).all(|(d, t)| {
                t.as_ref()
                    .is_none_or(|t| d.shape() == t.shape.as_slice() && d.dtype() == t.dtype)
            });
        let grads = if is_recording() || !fits {
            // A tape records this gradient (second order), or the output gradients are not
            // of the traced types: the primal graph again under a tape, every op visible.
            let tape = GradientTape::new();
            for &i in &self.differentiable {
                tape.watch(&inputs[i]);
            }
            let outs = self.primal.replay(inputs)?;
            let sources: Vec<Source> = self
                .differentiable
                .iter()
                .map(|&i| (&inputs[i]).into())
                .collect();
            tape.gradient_with(&outs, &sources, Some(dys), UnconnectedGradients::Zero)?
                .into_iter()
                .map(|g| {
                    g.ok_or_else(|| Error::invalid("function", "a zero gradient went missing"))
                })
                .collect::<Result<Vec<_>>>()?
        } else {
            let mut args = saved.to_vec();
            args.extend_from_slice(dys);
            self.backward.replay(&args)?
        };
        let mut out = vec![None; inputs.len()];
        for (&i, g) in self.differentiable.iter().zip(grads) {
            out[i] = Some(g);
        }
        Ok(out)
    }
}

/// Splits a combined graph (arguments: `num_inputs` inputs then the output gradients;
/// results: `num_outputs` outputs then the gradients) into the forward graph (inputs →
/// outputs and saved values) and the backward graph (saved values and output gradients →
/// gradients). Constants the backward reads are copied into it rather than saved.
fn split(graph: &Graph, num_inputs: usize, num_outputs: usize) -> Result<(Graph, Graph)> {
    let mut backward_node = vec![false; graph.nodes.len()];
    for (i, n) in graph.nodes.iter().enumerate() {
        backward_node[i] = match n.kind {
            NodeKind::Arg(k) => k >= num_inputs,
            _ => n.inputs.iter().any(|v| backward_node[v.node]),
        };
    }
    let (outputs, gradients) = graph.outputs.split_at(num_outputs);
    if outputs.iter().any(|v| backward_node[v.node]) {
        return Err(Error::invalid(
            "function",
            "an output depends on its own gradient (a bug in ferroflow)",
        ));
    }
    let is_constant = |v: &ValueRef| matches!(graph.nodes[v.node].kind, NodeKind::Constant(_));
    let mut saved: Vec<ValueRef> = Vec::new();
    let mut need = |v: &ValueRef| {
        if !backward_node[v.node] && !is_constant(v) && !saved.contains(v) {
            saved.push(*v);
        }
    };
    for (i, n) in graph.nodes.iter().enumerate() {
        if backward_node[i] {
            n.inputs.iter().for_each(&mut need);
        }
    }
    gradients.iter().for_each(&mut need);

    // Forward: the nodes that do not read an output gradient, in order.
    let mut forward_index = HashMap::new();
    let mut forward = Graph {
        num_args: num_inputs,
        ..Graph::default()
    };
    for (i, n) in graph.nodes.iter().enumerate() {
        if backward_node[i] {
            continue;
        }
        let mut node = n.clone();
        node.inputs = n
            .inputs
            .iter()
            .map(|v| ValueRef {
                node: forward_index[&v.node],
                output: v.output,
            })
            .collect();
        forward_index.insert(i, forward.nodes.len());
        forward.nodes.push(node);
    }
    forward.outputs = outputs
        .iter()
        .chain(&saved)
        .map(|v| ValueRef {
            node: forward_index[&v.node],
            output: v.output,
        })
        .collect();

    // Backward: the saved values as arguments, then the rest.
    let mut backward = Graph {
        num_args: saved.len() + (graph.num_args - num_inputs),
        ..Graph::default()
    };
    let mut value_of: HashMap<ValueRef, ValueRef> = HashMap::new();
    for (k, v) in saved.iter().enumerate() {
        value_of.insert(*v, ValueRef { node: k, output: 0 });
        backward.nodes.push(Node {
            kind: NodeKind::Arg(k),
            inputs: vec![],
            outputs: vec![graph.nodes[v.node].outputs[v.output].clone()],
            scope: "".into(),
        });
    }
    // A value in the backward graph: saved, made there, or a forward constant copied.
    fn lookup(
        v: &ValueRef,
        graph: &Graph,
        backward: &mut Graph,
        value_of: &mut HashMap<ValueRef, ValueRef>,
    ) -> ValueRef {
        if let Some(mapped) = value_of.get(v) {
            return *mapped;
        }
        let copy = ValueRef {
            node: backward.nodes.len(),
            output: 0,
        };
        backward.nodes.push(graph.nodes[v.node].clone());
        value_of.insert(*v, copy);
        copy
    }
    for (i, n) in graph.nodes.iter().enumerate() {
        if !backward_node[i] {
            continue;
        }
        let mut node = n.clone();
        if let NodeKind::Arg(k) = n.kind {
            node.kind = NodeKind::Arg(saved.len() + k - num_inputs);
        }
        node.inputs = n
            .inputs
            .iter()
            .map(|v| lookup(v, graph, &mut backward, &mut value_of))
            .collect();
        let here = backward.nodes.len();
        for output in 0..n.outputs.len() {
            value_of.insert(
                ValueRef { node: i, output },
                ValueRef { node: here, output },
            );
        }
        backward.nodes.push(node);
    }
    backward.outputs = gradients
        .iter()
        .map(|v| lookup(v, graph, &mut backward, &mut value_of))
        .collect();
    Ok((forward, backward))
}
