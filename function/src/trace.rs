//! Tracing: the closure runs once on real tensors while a thread observer records every op,
//! variable read and variable write into a [`Graph`].
//!
//! Tracing by execution gives the first call's results directly (the trace is that call)
//! and needs no symbolic tensor type: every op the closure can run, composites and NumPy
//! functions included, records itself as the primitives it dispatches. What a graph cannot
//! hold is refused while tracing (`Error::NotTraceable`): reading a tensor's value on the
//! host, an optimizer step outside a `SharedOptimizer` (its counter lives on the host).
//! Host code a graph keeps is a [`HostCall`]: recorded as one node, called on every replay.

use crate::graph::{Graph, Node, NodeKind, ValueRef, ValueType};
use ferroflow_tensor::dispatch::{
    enter_dry_run, enter_tracing, isolated_scope, push_thread_observer, HostCall, OpEvent,
    OpObserver,
};
use ferroflow_tensor::distribution::VariableWrite;
use ferroflow_tensor::{Error, Op, Result, Tensor, TensorId, Variable};
use std::cell::RefCell;
use std::collections::{HashMap, HashSet};
use std::sync::{Arc, Mutex};

/// Folded constants larger than this stay ops (their memory would live in the graph).
const FOLD_LIMIT_BYTES: usize = 1 << 20;

#[derive(Default)]
struct Recording {
    nodes: Vec<Node>,
    producers: HashMap<TensorId, ValueRef>,
    /// Nodes whose value is a trace-time constant (made inside the function).
    constant: Vec<bool>,
    folded: usize,
    /// `ReadVariable` nodes that were peeks (`Variable::peek`: no tape is told).
    peeks: HashSet<usize>,
}

impl Recording {
    fn push(&mut self, kind: NodeKind, inputs: Vec<ValueRef>, outputs: &[Tensor]) -> usize {
        let i = self.nodes.len();
        let is_constant = matches!(kind, NodeKind::Constant(_));
        self.nodes.push(Node {
            kind,
            inputs,
            outputs: outputs.iter().map(ValueType::of).collect(),
            scope: ferroflow_tensor::trace::current_name_scope(),
        });
        self.constant.push(is_constant);
        for (k, t) in outputs.iter().enumerate() {
            self.producers
                .insert(t.id(), ValueRef { node: i, output: k });
        }
        i
    }

    /// The value `t` is, capturing it when nothing in the trace made it.
    fn value_of(&mut self, t: &Tensor) -> ValueRef {
        match self.producers.get(&t.id()) {
            Some(v) => *v,
            None => {
                let i = self.push(
                    NodeKind::Captured(t.clone()),
                    vec![],
                    std::slice::from_ref(t),
                );
                ValueRef { node: i, output: 0 }
            }
        }
    }

    fn on_op(&mut self, op: &Op, inputs: &[&Tensor], outputs: &[Tensor]) {
        match op {
            // The read was refused before it ran; nothing to record.
            Op::ToHost => return,
            Op::Constant => {
                if let Some(t) = outputs.first() {
                    self.push(NodeKind::Constant(t.clone()), vec![], outputs);
                }
                return;
            }
            _ => {}
        }
        let refs: Vec<ValueRef> = inputs.iter().map(|t| self.value_of(t)).collect();
        let deterministic = !matches!(op, Op::RandomStateful { .. } | Op::HostFunction { .. });
        let foldable = deterministic
            && !refs.is_empty()
            && refs.iter().all(|v| self.constant[v.node])
            && outputs
                .iter()
                .all(|t| ValueType::of(t).bytes() <= FOLD_LIMIT_BYTES);
        if foldable {
            // Constant folding: the trace already computed the value.
            for t in outputs {
                self.push(
                    NodeKind::Constant(t.clone()),
                    vec![],
                    std::slice::from_ref(t),
                );
            }
            self.folded += 1;
            return;
        }
        self.push(NodeKind::Op(op.clone()), refs, outputs);
    }
}

/// The thread observer that records a trace.
pub(crate) struct Recorder(Mutex<Recording>);

impl Recorder {
    fn with<R>(&self, f: impl FnOnce(&mut Recording) -> R) -> R {
        f(&mut self.0.lock().unwrap_or_else(|e| e.into_inner()))
    }
}

impl OpObserver for Recorder {
    fn on_op(&self, event: &OpEvent<'_>) {
        self.with(|r| r.on_op(event.op, event.inputs, event.outputs));
    }
    fn on_variable_read(&self, variable: &Variable, value: &Tensor) {
        self.with(|r| {
            r.push(
                NodeKind::ReadVariable(variable.clone()),
                vec![],
                std::slice::from_ref(value),
            )
        });
    }
    fn on_variable_peek(&self, variable: &Variable, value: &Tensor) {
        self.with(|r| {
            let i = r.push(
                NodeKind::ReadVariable(variable.clone()),
                vec![],
                std::slice::from_ref(value),
            );
            r.peeks.insert(i);
        });
    }
    fn on_host_call(&self, call: &HostCall, inputs: &[Tensor], outputs: &[Tensor]) {
        self.with(|r| {
            let refs = inputs.iter().map(|t| r.value_of(t)).collect();
            r.push(NodeKind::HostCall(call.clone()), refs, outputs);
        });
    }
    fn on_variable_write(&self, variable: &Variable, kind: VariableWrite, value: &Tensor) {
        self.with(|r| {
            let v = r.value_of(value);
            r.push(
                NodeKind::WriteVariable {
                    variable: variable.clone(),
                    kind,
                },
                vec![v],
                &[],
            );
        });
    }
}

thread_local! {
    /// The recorders of the traces running on this thread, innermost last: control-flow
    /// ops record themselves into the innermost.
    static RECORDERS: RefCell<Vec<Arc<Recorder>>> = const { RefCell::new(Vec::new()) };
}

struct RecorderEntry;

impl RecorderEntry {
    fn push(recorder: Arc<Recorder>) -> RecorderEntry {
        RECORDERS.with(|r| r.borrow_mut().push(recorder));
        RecorderEntry
    }
}

impl Drop for RecorderEntry {
    fn drop(&mut self) {
        let _ = RECORDERS.try_with(|r| r.borrow_mut().pop());
    }
}

/// Records a node that is not a dispatched op (a control-flow op) into the traces running
/// on this thread (a function traced inside another's trace records into both, as their
/// observers both see its ops); its inputs are resolved as an op's are.
pub(crate) fn record(kind: NodeKind, inputs: &[Tensor], outputs: &[Tensor]) -> Result<()> {
    let recorders = RECORDERS.with(|r| r.borrow().clone());
    if recorders.is_empty() {
        return Err(Error::invalid(
            "function",
            "the thread is tracing but no graph function records it (tracing mode was \
             entered outside ferroflow::function)",
        ));
    }
    for recorder in recorders {
        recorder.with(|r| {
            let refs = inputs.iter().map(|t| r.value_of(t)).collect();
            r.push(kind.clone(), refs, outputs);
        });
    }
    Ok(())
}

/// While alive, the traces that were running on this thread receive no recorded nodes
/// (a branch is traced into its own graph).
struct RecordersHidden(Vec<Arc<Recorder>>);

impl RecordersHidden {
    fn enter() -> RecordersHidden {
        RecordersHidden(RECORDERS.with(|r| std::mem::take(&mut *r.borrow_mut())))
    }
}

impl Drop for RecordersHidden {
    fn drop(&mut self) {
        let hidden = std::mem::take(&mut self.0);
        let _ = RECORDERS.try_with(|r| *r.borrow_mut() = hidden);
    }
}

/// A finished trace: the graph as recorded, and what the call returned.
pub(crate) struct Trace {
    pub graph: Graph,
    pub outputs: Vec<Tensor>,
    pub folded: usize,
    /// `ReadVariable` nodes that were peeks.
    pub peeks: HashSet<usize>,
}

/// Runs `f` on `args` in tracing mode and records it.
pub(crate) fn trace(
    args: &[Tensor],
    f: impl FnOnce(&[Tensor]) -> Result<Vec<Tensor>>,
) -> Result<Trace> {
    let recorder = Arc::new(Recorder(Mutex::new(Recording::default())));
    // The arguments themselves, so a tape around the call connects them to the trace's ops
    // (a tensor passed twice stays two arguments).
    let traced_args = Tensor::with_distinct_ids(args)?;
    recorder.with(|r| {
        for (i, a) in traced_args.iter().enumerate() {
            r.push(NodeKind::Arg(i), vec![], std::slice::from_ref(a));
        }
    });
    let outputs = {
        let _observer = push_thread_observer(recorder.clone());
        let _tracing = enter_tracing();
        let _entry = RecorderEntry::push(recorder.clone());
        f(&traced_args)?
    };
    let mut recording = std::mem::take(&mut *recorder.0.lock().unwrap_or_else(|e| e.into_inner()));
    let output_refs = outputs.iter().map(|t| recording.value_of(t)).collect();
    Ok(Trace {
        graph: Graph {
            nodes: recording.nodes,
            outputs: output_refs,
            num_args: args.len(),
        },
        outputs,
        folded: recording.folded,
        peeks: recording.peeks,
    })
}

/// Traces a control-flow branch (a `cond` branch, a loop's condition or body) on `args`:
/// seen by no enclosing tape or trace, its variable writes checked but not made (this call
/// may not take it; the branch runs for real afterwards, from its graph).
pub(crate) fn trace_branch(
    args: &[Tensor],
    f: impl FnOnce(&[Tensor]) -> Result<Vec<Tensor>>,
) -> Result<Trace> {
    let _isolated = isolated_scope();
    let _hidden = RecordersHidden::enter();
    let _dry = enter_dry_run();
    trace(args, f)
}
