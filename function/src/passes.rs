//! Graph passes: common-subexpression elimination, dead-code elimination, product-bias-
//! activation fusion and elementwise fusion (constant folding happens while tracing, where
//! the values are at hand: `trace`).

use crate::graph::{Graph, NodeKind, ValueRef};
use std::collections::HashMap;

/// Constants up to this many elements are compared by value when merging (by a hash of
/// their bytes, the bytes compared before a merge); larger ones by identity.
const MERGE_CONSTANT_ELEMENTS: usize = 1 << 16;

/// The key in `write_epochs` that counts control-flow nodes that write (any variable may
/// have changed after one). Variable ids start at 1.
const CONTROL_FLOW_WRITES: u64 = 0;

/// What identifies a node's result, for merging equal nodes; `None` for nodes never merged
/// (arguments, effects, random draws).
fn key(graph: &Graph, i: usize, write_epochs: &HashMap<u64, usize>) -> Option<String> {
    let node = &graph.nodes[i];
    match &node.kind {
        NodeKind::Arg(_)
        | NodeKind::WriteVariable { .. }
        | NodeKind::Cond(_)
        | NodeKind::While(_)
        | NodeKind::WhileGrad(_)
        | NodeKind::HostCall(_) => None,
        NodeKind::Op(ferroflow_tensor::Op::RandomStateful { .. }) => None,
        NodeKind::Op(op) => Some(format!("op {op:?} {:?}", node.inputs)),
        NodeKind::Captured(t) => Some(format!("captured {:?}", t.id())),
        NodeKind::Constant(t) => {
            if t.num_elements() <= MERGE_CONSTANT_ELEMENTS {
                use std::hash::{Hash, Hasher};
                let mut hasher = std::collections::hash_map::DefaultHasher::new();
                constant_bytes(t)?.hash(&mut hasher);
                Some(format!(
                    "constant {} {:?} {:016x}",
                    t.dtype(),
                    t.shape(),
                    hasher.finish()
                ))
            } else {
                Some(format!("constant {:?}", t.id()))
            }
        }
        NodeKind::ReadVariable(v) => Some(format!(
            "read {} after {} writes, {} control-flow writes",
            v.id(),
            write_epochs.get(&v.id()).copied().unwrap_or(0),
            write_epochs.get(&CONTROL_FLOW_WRITES).copied().unwrap_or(0)
        )),
    }
}

/// A constant's bytes, as the host holds them.
fn constant_bytes(t: &ferroflow_tensor::Tensor) -> Option<Vec<u8>> {
    Some(t.to_host().ok()?.to_le_bytes())
}

/// Whether node `a` may stand for node `b` of the same key: constants (keyed by a hash)
/// must hold the same bytes.
fn same_value(graph: &Graph, a: usize, b: usize) -> bool {
    match (&graph.nodes[a].kind, &graph.nodes[b].kind) {
        (NodeKind::Constant(x), NodeKind::Constant(y)) => {
            x.id() == y.id()
                || matches!((constant_bytes(x), constant_bytes(y)), (Some(a), Some(b)) if a == b)
        }
        _ => true,
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
        match &graph.nodes[i].kind {
            NodeKind::WriteVariable { variable, .. } => {
                *write_epochs.entry(variable.id()).or_default() += 1;
            }
            kind if kind.is_effect() => {
                *write_epochs.entry(CONTROL_FLOW_WRITES).or_default() += 1;
            }
            _ => {}
        }
        let Some(k) = key(graph, i, &write_epochs) else {
            continue;
        };
        match seen.get(&k) {
            Some(&earlier) if same_value(graph, earlier, i) => {
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
            Some(_) => {}
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
    keep_nodes(graph, &live)
}

/// Drops the nodes `keep` does not mark and renumbers every reference to the rest (no
/// kept node may read a dropped one); returns how many were dropped.
fn keep_nodes(graph: &mut Graph, keep: &[bool]) -> usize {
    let n = graph.nodes.len();
    let mut index = vec![usize::MAX; n];
    let mut kept = Vec::with_capacity(n);
    for (i, node) in std::mem::take(&mut graph.nodes).into_iter().enumerate() {
        if keep[i] {
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

/// Who reads each value (each reader once, in node order; `usize::MAX`: the graph returns
/// it).
fn readers_of(graph: &Graph) -> HashMap<ValueRef, Vec<usize>> {
    let mut readers: HashMap<ValueRef, Vec<usize>> = HashMap::new();
    for (i, node) in graph.nodes.iter().enumerate() {
        for v in &node.inputs {
            let r = readers.entry(*v).or_default();
            if r.last() != Some(&i) {
                r.push(i);
            }
        }
    }
    for v in &graph.outputs {
        readers.entry(*v).or_default().push(usize::MAX);
    }
    readers
}

/// Product, bias and activation fusion (TF grappler's remapper): a float32 or float64
/// `matmul` without transposes whose only reader adds a bias vector along its last axis
/// becomes one `Op::FusedMatMul` node, which also takes in a ReLU when that is the sum's
/// only reader (a Dense layer's forward: one kernel instead of a product and an
/// elementwise pass). Runs before elementwise fusion. Returns how many nodes it replaced.
pub(crate) fn fuse_matmul_bias(graph: &mut Graph) -> usize {
    use ferroflow_tensor::{BinaryOp, DType, FusedActivation, Op, UnaryOp};
    let readers = readers_of(graph);
    let only_reader = |node: usize| -> Option<usize> {
        match readers.get(&ValueRef { node, output: 0 })?.as_slice() {
            [j] if *j != usize::MAX => Some(*j),
            _ => None,
        }
    };
    let n = graph.nodes.len();
    let mut keep = vec![true; n];
    let mut fused = 0;
    for i in 0..n {
        let product = &graph.nodes[i];
        let is_product = matches!(
            product.kind,
            NodeKind::Op(Op::MatMul {
                transpose_a: false,
                transpose_b: false
            })
        );
        let Some(out) = product.outputs.first() else {
            continue;
        };
        if !is_product || !matches!(out.dtype, DType::F32 | DType::F64) || product.inputs.len() != 2
        {
            continue;
        }
        let Some(j) = only_reader(i) else {
            continue;
        };
        let add = &graph.nodes[j];
        if !matches!(add.kind, NodeKind::Op(Op::Binary(BinaryOp::Add))) || add.outputs[0] != *out {
            continue;
        }
        let me = ValueRef { node: i, output: 0 };
        let bias = match add.inputs.as_slice() {
            [x, b] if *x == me && *b != me => *b,
            [b, x] if *x == me && *b != me => *b,
            _ => continue,
        };
        let bias_type = &graph.nodes[bias.node].outputs[bias.output];
        if bias_type.dtype != out.dtype || bias_type.shape != [out.shape[out.shape.len() - 1]] {
            continue;
        }
        let inputs = vec![product.inputs[0], product.inputs[1], bias];
        // The ReLU joins when it alone reads the sum.
        let relu = only_reader(j).filter(|&k| {
            matches!(graph.nodes[k].kind, NodeKind::Op(Op::Unary(UnaryOp::Relu)))
                && graph.nodes[k].outputs[0] == *out
        });
        let (at, activation) = match relu {
            Some(k) => (k, FusedActivation::Relu),
            None => (j, FusedActivation::Linear),
        };
        let node = &mut graph.nodes[at];
        node.kind = NodeKind::Op(Op::FusedMatMul(activation));
        node.inputs = inputs;
        keep[i] = false;
        fused += 2;
        if at != j {
            keep[j] = false;
            fused += 1;
        }
    }
    keep_nodes(graph, &keep);
    fused
}

/// Pooling-gradient fusion: a `max_pool_grad` of `y` read only by a `bias_activation_grad`
/// with the same `y` (a convolution's ReLU and bias under a max pooling, in the backward)
/// becomes one `Op::MaxPoolBiasActivationGrad`: the pooling gradient, as large as the
/// convolution's output, is never stored and read back. Returns how many nodes it removed.
pub(crate) fn fuse_max_pool_bias_grad(graph: &mut Graph) -> usize {
    use ferroflow_tensor::Op;
    let readers = readers_of(graph);
    let n = graph.nodes.len();
    let mut keep = vec![true; n];
    for j in 0..n {
        let NodeKind::Op(Op::BiasActivationGrad(activation)) = graph.nodes[j].kind else {
            continue;
        };
        let [g, y] = graph.nodes[j].inputs[..] else {
            continue;
        };
        let pool = &graph.nodes[g.node];
        let NodeKind::Op(Op::MaxPoolGrad(w)) = &pool.kind else {
            continue;
        };
        let only_here = readers.get(&g).is_some_and(|r| r.as_slice() == [j]);
        if g.output != 0 || !only_here || pool.inputs.len() != 2 || pool.inputs[0] != y {
            continue;
        }
        let (w, dy) = (w.clone(), pool.inputs[1]);
        keep[g.node] = false;
        let node = &mut graph.nodes[j];
        node.kind = NodeKind::Op(Op::MaxPoolBiasActivationGrad(w, activation));
        node.inputs = vec![y, dy];
    }
    keep_nodes(graph, &keep)
}

/// Convolution-pooling fusion: a max pooling of a fused convolution's output (a Keras
/// `Conv2D` with its activation under a `MaxPooling2D`) joins the convolution's node, which
/// becomes one `Op::FusedConv2dMaxPool` with the convolution's output and the pooled one:
/// each image is pooled while the convolution's output for it is in cache. The output stays
/// a value of the graph for its other readers (the pooling's gradient). Returns how many
/// nodes it removed.
pub(crate) fn fuse_conv_max_pool(graph: &mut Graph) -> usize {
    use ferroflow_tensor::{Op, PoolKind};
    let n = graph.nodes.len();
    let mut keep = vec![true; n];
    let mut moved: HashMap<ValueRef, ValueRef> = HashMap::new();
    for (j, kept) in keep.iter_mut().enumerate() {
        let NodeKind::Op(Op::Pool2d(PoolKind::MaxPool2d, pool)) = &graph.nodes[j].kind else {
            continue;
        };
        let [y] = graph.nodes[j].inputs[..] else {
            continue;
        };
        let conv = &graph.nodes[y.node];
        let NodeKind::Op(Op::FusedConv2d(w, activation)) = &conv.kind else {
            continue;
        };
        if y.output != 0 || conv.outputs.len() != 1 || graph.nodes[j].outputs.len() != 1 {
            continue;
        }
        let kind = NodeKind::Op(Op::FusedConv2dMaxPool(
            w.clone(),
            *activation,
            Box::new(pool.clone()),
        ));
        let pooled = graph.nodes[j].outputs[0].clone();
        let node = &mut graph.nodes[y.node];
        node.kind = kind;
        node.outputs.push(pooled);
        moved.insert(
            ValueRef { node: j, output: 0 },
            ValueRef {
                node: y.node,
                output: 1,
            },
        );
        *kept = false;
    }
    if moved.is_empty() {
        return 0;
    }
    // The pooling's readers read the fused node's second output (an earlier node: the
    // order stays topological).
    let redirect = |v: &mut ValueRef| {
        if let Some(to) = moved.get(v) {
            *v = *to;
        }
    };
    for node in graph.nodes.iter_mut() {
        node.inputs.iter_mut().for_each(redirect);
    }
    graph.outputs.iter_mut().for_each(redirect);
    keep_nodes(graph, &keep)
}

/// The program step of a node when it is a fusible elementwise op of floats.
fn fusible_step(graph: &Graph, i: usize) -> Option<()> {
    use ferroflow_tensor::{ElementwiseProgram, Op};
    let node = &graph.nodes[i];
    let ok = match &node.kind {
        NodeKind::Op(Op::Unary(u)) => ElementwiseProgram::fusible_unary(*u),
        NodeKind::Op(Op::Binary(b)) => ElementwiseProgram::fusible_binary(*b),
        _ => false,
    };
    let dtype = node.outputs.first()?.dtype;
    (ok && node.outputs.len() == 1
        && matches!(
            dtype,
            ferroflow_tensor::DType::F32 | ferroflow_tensor::DType::F64
        )
        && node
            .inputs
            .iter()
            .all(|v| graph.nodes[v.node].outputs[v.output].dtype == dtype))
    .then_some(())
}

/// Elementwise fusion: trees of fusible unary and binary float ops of one output shape,
/// each inner value read only by the next op of the tree, become one
/// `Op::FusedElementwise` node (one kernel pass over cache-sized chunks on backends with the
/// fused kernel; the ops one by one elsewhere). Returns how many nodes the fused ones
/// replaced.
pub(crate) fn fuse_elementwise(graph: &mut Graph) -> usize {
    use ferroflow_tensor::{ElementwiseProgram, ElementwiseStep, Op, ReduceOp};
    let n = graph.nodes.len();
    let readers = readers_of(graph);
    let fusible: Vec<bool> = (0..n).map(|i| fusible_step(graph, i).is_some()).collect();
    // Each fusible node joins the tree of its first fusible reader of the same output type;
    // its other readers then read it as an extra output of the fused node.
    let mut parent: Vec<Option<usize>> = vec![None; n];
    for i in (0..n).filter(|&i| fusible[i]) {
        let v = ValueRef { node: i, output: 0 };
        parent[i] = readers.get(&v).and_then(|r| {
            r.iter().copied().find(|&j| {
                j != usize::MAX
                    && fusible[j]
                    && graph.nodes[j].outputs[0] == graph.nodes[i].outputs[0]
            })
        });
    }
    let root_of = |parent: &[Option<usize>], mut i: usize| {
        while let Some(p) = parent[i] {
            i = p;
        }
        i
    };
    // The fused node runs where its root ran: a member read outside its tree before that
    // (which would also make a cycle through the reader) leaves the tree. Each round cuts
    // at least one link, so this ends.
    loop {
        let mut cut = false;
        for i in 0..n {
            if parent[i].is_none() {
                continue;
            }
            let r = root_of(&parent, i);
            let early_reader = readers[&ValueRef { node: i, output: 0 }]
                .iter()
                .any(|&j| j < r && root_of(&parent, j) != r);
            if early_reader {
                parent[i] = None;
                cut = true;
            }
        }
        if !cut {
            break;
        }
    }
    let mut members: HashMap<usize, Vec<usize>> = HashMap::new();
    for i in (0..n).filter(|&i| fusible[i]) {
        members.entry(root_of(&parent, i)).or_default().push(i);
    }
    let mut removed = vec![false; n];
    // Values of absorbed members read outside their tree: now outputs of the fused node.
    let mut moved: HashMap<ValueRef, ValueRef> = HashMap::new();
    let mut fused = 0;
    'groups: for (r, mut group) in members {
        group.sort_unstable();
        let in_group = |j: usize| j != usize::MAX && group.binary_search(&j).is_ok();
        // Who reads each member's value outside its tree (`usize::MAX`: the graph returns it).
        let outside = |m: usize| -> Vec<usize> {
            readers
                .get(&ValueRef { node: m, output: 0 })
                .map(|rs| rs.iter().copied().filter(|&j| !in_group(j)).collect())
                .unwrap_or_default()
        };
        // A reduction (sum, mean, prod, max, min) of the tree's result joins it when
        // everything else read outside the
        // tree is read after the reduction (the fused node runs where the reduction ran).
        let reduction = outside(r).into_iter().find(|&j| {
            j != usize::MAX
                && matches!(
                    &graph.nodes[j].kind,
                    NodeKind::Op(Op::Reduce { op, .. }) if matches!(
                        op,
                        ReduceOp::ReduceSum
                            | ReduceOp::ReduceMean
                            | ReduceOp::ReduceProd
                            | ReduceOp::ReduceMax
                            | ReduceOp::ReduceMin
                    )
                )
                && graph.nodes[j].inputs.first() == Some(&ValueRef { node: r, output: 0 })
        });
        let reduction =
            reduction.filter(|&red| group.iter().flat_map(|&m| outside(m)).all(|j| j >= red));
        if group.len() < 2 && reduction.is_none() {
            continue;
        }
        let mut inputs: Vec<ValueRef> = Vec::new();
        let mut register: HashMap<ValueRef, usize> = HashMap::new();
        for &m in &group {
            for v in &graph.nodes[m].inputs {
                if !in_group(v.node) && !register.contains_key(v) {
                    register.insert(*v, inputs.len());
                    inputs.push(*v);
                }
            }
        }
        let mut steps = Vec::with_capacity(group.len());
        for (k, &m) in group.iter().enumerate() {
            let node = &graph.nodes[m];
            let reg = |i: usize| node.inputs.get(i).and_then(|v| register.get(v)).copied();
            let step = match &node.kind {
                NodeKind::Op(Op::Unary(u)) => reg(0).map(|a| ElementwiseStep::Unary(*u, a)),
                NodeKind::Op(Op::Binary(b)) => reg(0)
                    .zip(reg(1))
                    .map(|(a, c)| ElementwiseStep::Binary(*b, a, c)),
                _ => None,
            };
            // Members read only values made before them: always a step (else: left alone).
            let Some(step) = step else {
                continue 'groups;
            };
            steps.push(step);
            register.insert(ValueRef { node: m, output: 0 }, inputs.len() + k);
        }
        // Outputs: the tree's result (reduced, when a reduction joined), then each member
        // read outside the tree by anything else.
        let mut outputs = vec![inputs.len() + steps.len() - 1];
        let mut extra = Vec::new();
        for (k, &m) in group.iter().enumerate() {
            let others = outside(m)
                .into_iter()
                .any(|j| Some(j) != reduction || m != r);
            if others && (m != r || reduction.is_some()) {
                extra.push((ValueRef { node: m, output: 0 }, outputs.len()));
                outputs.push(inputs.len() + k);
            }
        }
        let value_type = graph.nodes[r].outputs[0].clone();
        let program = std::sync::Arc::new(ElementwiseProgram {
            num_inputs: inputs.len(),
            outputs,
            steps,
        });
        let at = reduction.unwrap_or(r);
        let node = &mut graph.nodes[at];
        let (kind, first_type) = match (&node.kind, reduction) {
            (NodeKind::Op(Op::Reduce { op, axes, keepdims }), Some(_)) => (
                Op::FusedReduce {
                    program: program.clone(),
                    reduce: *op,
                    axes: axes.clone(),
                    keepdims: *keepdims,
                },
                node.outputs[0].clone(),
            ),
            _ => (Op::FusedElementwise(program.clone()), value_type.clone()),
        };
        node.kind = NodeKind::Op(kind);
        node.inputs = inputs;
        node.outputs = std::iter::once(first_type)
            .chain(std::iter::repeat_n(value_type, program.outputs.len() - 1))
            .collect();
        for (v, output) in extra {
            moved.insert(v, ValueRef { node: at, output });
        }
        for &m in &group {
            if m != at {
                removed[m] = true;
            }
        }
        fused += group.len();
    }
    for v in graph
        .nodes
        .iter_mut()
        .flat_map(|node| node.inputs.iter_mut())
        .chain(graph.outputs.iter_mut())
    {
        if let Some(to) = moved.get(v) {
            *v = *to;
        }
    }
    // Drop the absorbed nodes; what outside their tree read them reads the fused node now.
    let keep: Vec<bool> = removed.iter().map(|r| !r).collect();
    keep_nodes(graph, &keep);
    fused
}

/// Product-epilogue fusion (cuBLASLt's `DRELU_BGRAD`): a float32 or float64 rank-2
/// `matmul` read only by one fused sum over the rows (`Op::FusedReduce`, axis 0 of a rank-2
/// program, what elementwise fusion makes of a Dense layer's bias gradient and the ReLU
/// gradient before it) becomes one `Op::FusedMatMulReduce`: the product is the program's
/// register 0 as the GEMM stores it, and the backward of a Dense layer under another loses
/// a kernel. Runs after elementwise fusion. Returns how many nodes it removed.
pub(crate) fn fuse_matmul_reduce(graph: &mut Graph) -> usize {
    use ferroflow_tensor::{DType, ElementwiseProgram, ElementwiseStep, Op, ReduceOp};
    let readers = readers_of(graph);
    let n = graph.nodes.len();
    let mut keep = vec![true; n];
    let mut fused = 0;
    for i in 0..n {
        let NodeKind::Op(Op::FusedReduce {
            program,
            reduce: ReduceOp::ReduceSum,
            axes,
            keepdims: false,
        }) = &graph.nodes[i].kind
        else {
            continue;
        };
        let Some(first) = graph.nodes[i].outputs.first() else {
            continue;
        };
        let shape_rank = graph.nodes[i]
            .inputs
            .iter()
            .map(|v| graph.nodes[v.node].outputs[v.output].shape.len())
            .max()
            .unwrap_or(0);
        if axes.as_slice() != [0]
            || shape_rank != 2
            || !matches!(first.dtype, DType::F32 | DType::F64)
        {
            continue;
        }
        // The first input made by a product that nothing else reads, of the program's whole
        // shape (no broadcast widens it).
        let found = graph.nodes[i].inputs.iter().enumerate().find_map(|(k, v)| {
            let producer = &graph.nodes[v.node];
            let NodeKind::Op(Op::MatMul {
                transpose_a,
                transpose_b,
            }) = producer.kind
            else {
                return None;
            };
            let only_here = readers.get(v).is_some_and(|r| r.as_slice() == [i]);
            let whole = graph.nodes[i].inputs.iter().all(|u| {
                let s = &graph.nodes[u.node].outputs[u.output].shape;
                s.len() <= 2
                    && s.iter()
                        .rev()
                        .zip(producer.outputs[0].shape.iter().rev())
                        .all(|(&d, &p)| d == p || d == 1)
            });
            (only_here
                && whole
                && producer.inputs.len() == 2
                && producer.outputs[0].shape.len() == 2
                && keep[v.node])
                .then_some((k, v.node, transpose_a, transpose_b))
        });
        let Some((k, product, transpose_a, transpose_b)) = found else {
            continue;
        };
        // The product becomes register 0: swap registers 0 and k.
        let swap = |r: usize| match r {
            0 => k,
            r if r == k => 0,
            r => r,
        };
        let steps = program
            .steps
            .iter()
            .map(|s| match *s {
                ElementwiseStep::Unary(op, a) => ElementwiseStep::Unary(op, swap(a)),
                ElementwiseStep::Binary(op, a, b) => ElementwiseStep::Binary(op, swap(a), swap(b)),
            })
            .collect();
        let program = std::sync::Arc::new(ElementwiseProgram {
            num_inputs: program.num_inputs,
            steps,
            outputs: program.outputs.clone(),
        });
        let mut rest = graph.nodes[i].inputs.clone();
        rest.swap(0, k);
        let mut inputs = graph.nodes[product].inputs.clone();
        inputs.extend(rest.into_iter().skip(1));
        let node = &mut graph.nodes[i];
        node.kind = NodeKind::Op(Op::FusedMatMulReduce {
            program,
            transpose_a,
            transpose_b,
        });
        node.inputs = inputs;
        keep[product] = false;
        fused += 1;
    }
    keep_nodes(graph, &keep);
    fused
}
