//! Graph passes: common-subexpression elimination and dead-code elimination (constant
//! folding happens while tracing, where the values are at hand: `trace`).

use crate::graph::{Graph, NodeKind, ValueRef};
use std::collections::HashMap;

/// Constants up to this many elements are compared by value when merging.
const MERGE_CONSTANT_ELEMENTS: usize = 16;

/// What identifies a node's result, for merging equal nodes; `None` for nodes never merged
/// (arguments, effects, random draws).
fn key(graph: &Graph, i: usize, write_epochs: &HashMap<u64, usize>) -> Option<String> {
    let node = &graph.nodes[i];
    match &node.kind {
        NodeKind::Arg(_) | NodeKind::WriteVariable { .. } => None,
        NodeKind::Op(ferroflow_tensor::Op::RandomStateful { .. }) => None,
        NodeKind::Op(op) => Some(format!("op {op:?} {:?}", node.inputs)),
        NodeKind::Captured(t) => Some(format!("captured {:?}", t.id())),
        NodeKind::Constant(t) => {
            if t.num_elements() <= MERGE_CONSTANT_ELEMENTS {
                let bytes = t.to_host().ok()?.to_le_bytes();
                Some(format!("constant {} {:?} {bytes:?}", t.dtype(), t.shape()))
            } else {
                Some(format!("constant {:?}", t.id()))
            }
        }
        NodeKind::ReadVariable(v) => Some(format!(
            "read {} after {} writes",
            v.id(),
            write_epochs.get(&v.id()).copied().unwrap_or(0)
        )),
    }
}

/// Merges nodes equal to an earlier one (same op, attributes and inputs; equal small
/// constants; reads of a variable with no write between). Returns how many were merged.
pub(crate) fn eliminate_common_subexpressions(graph: &mut Graph) -> usize {
    let mut replace: HashMap<ValueRef, ValueRef> = HashMap::new();
    let mut seen: HashMap<String, usize> = HashMap::new();
    let mut write_epochs: HashMap<u64, usize> = HashMap::new();
    let mut merged = 0;
    for i in 0..graph.nodes.len() {
        for v in graph.nodes[i].inputs.iter_mut() {
            if let Some(r) = replace.get(v) {
                *v = *r;
            }
        }
        if let NodeKind::WriteVariable { variable, .. } = &graph.nodes[i].kind {
            *write_epochs.entry(variable.id()).or_default() += 1;
        }
        let Some(k) = key(graph, i, &write_epochs) else {
            continue;
        };
        match seen.get(&k) {
            Some(&earlier) => {
                for output in 0..graph.nodes[i].outputs.len() {
                    replace.insert(
                        ValueRef { node: i, output },
                        ValueRef {
                            node: earlier,
                            output,
                        },
                    );
                }
                merged += 1;
            }
            None => {
                seen.insert(k, i);
            }
        }
    }
    for v in graph.outputs.iter_mut() {
        if let Some(r) = replace.get(v) {
            *v = *r;
        }
    }
    merged
}

/// Removes nodes that neither lead to an output nor to an effect, and renumbers the rest
/// (arguments always stay). Returns how many were removed.
pub(crate) fn eliminate_dead_code(graph: &mut Graph) -> usize {
    let n = graph.nodes.len();
    let mut live = vec![false; n];
    let mut stack: Vec<usize> = graph.outputs.iter().map(|v| v.node).collect();
    for (i, node) in graph.nodes.iter().enumerate() {
        if node.kind.is_effect() || matches!(node.kind, NodeKind::Arg(_)) {
            stack.push(i);
        }
    }
    while let Some(i) = stack.pop() {
        if std::mem::replace(&mut live[i], true) {
            continue;
        }
        stack.extend(graph.nodes[i].inputs.iter().map(|v| v.node));
    }
    let mut index = vec![usize::MAX; n];
    let mut kept = Vec::with_capacity(n);
    for (i, node) in std::mem::take(&mut graph.nodes).into_iter().enumerate() {
        if live[i] {
            index[i] = kept.len();
            kept.push(node);
        }
    }
    let renumber = |v: &mut ValueRef| v.node = index[v.node];
    for node in kept.iter_mut() {
        node.inputs.iter_mut().for_each(renumber);
    }
    graph.outputs.iter_mut().for_each(renumber);
    let removed = n - kept.len();
    graph.nodes = kept;
    removed
}
