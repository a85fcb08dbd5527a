//! [`GradientTape`]: records the ops run on this thread that depend on watched tensors, and
//! differentiates them backwards.

use crate::grad::{backward, differentiable};
use ferroflow_tensor::dispatch::ObserverGuard;
use ferroflow_tensor::{
    push_thread_observer, Error, HostData, Op, OpEvent, OpObserver, Result, Tensor, TensorId,
    Variable,
};
use std::cell::RefCell;
use std::collections::{HashMap, HashSet};
use std::sync::{Arc, Mutex, Weak};

/// A user-supplied backward function (see [`crate::custom_gradient`]): output gradients in,
/// input gradients out.
pub type GradFn = Arc<dyn Fn(&[Tensor]) -> Result<Vec<Option<Tensor>>> + Send + Sync>;

pub(crate) enum NodeOp {
    Primitive(Op),
    Custom(GradFn),
}

struct Node {
    op: NodeOp,
    inputs: Vec<Tensor>,
    outputs: Vec<Tensor>,
    /// The name scope it ran in, kept while a profiler runs or a graph is traced: its
    /// gradient ops are named
    /// `gradient_tape/<scope>/...`, as TF names them.
    scope: Option<std::sync::Arc<str>>,
}

/// What to return for a source the target does not depend on (TF's `UnconnectedGradients`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum UnconnectedGradients {
    /// `None` (TF's default).
    #[default]
    None,
    /// Zeros shaped like the source.
    Zero,
}

/// A source to differentiate with respect to: a tensor or a variable.
#[derive(Clone)]
pub enum Source {
    /// A watched tensor.
    Tensor(Tensor),
    /// A variable (watched automatically when trainable and read under the tape).
    Variable(Variable),
}

impl Source {
    /// The shape of the tensor or of the variable's value.
    ///
    /// ```
    /// ferroflow::init();
    /// use ferroflow::{autodiff::Source, Tensor};
    /// let x = Tensor::zeros(&[2, 3], ferroflow::DType::F32)?;
    /// assert_eq!(Source::from(&x).shape(), vec![2, 3]);
    /// # Ok::<(), ferroflow::Error>(())
    /// ```
    pub fn shape(&self) -> Vec<usize> {
        match self {
            Source::Tensor(t) => t.shape().to_vec(),
            Source::Variable(v) => v.shape(),
        }
    }
}

impl From<&Tensor> for Source {
    fn from(t: &Tensor) -> Source {
        Source::Tensor(t.clone())
    }
}
impl From<&Variable> for Source {
    fn from(v: &Variable) -> Source {
        Source::Variable(v.clone())
    }
}

#[derive(Default)]
struct State {
    recording: bool,
    paused: usize,
    used: bool,
    persistent: bool,
    watch_accessed: bool,
    tracked: HashSet<TensorId>,
    watched_vars: HashSet<u64>,
    var_values: HashMap<u64, Vec<TensorId>>,
    nodes: Vec<Node>,
}

pub(crate) struct Recorder {
    state: Mutex<State>,
}

impl Recorder {
    fn lock(&self) -> std::sync::MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }
    fn active(s: &State) -> bool {
        s.recording && s.paused == 0
    }
    /// Records a node when any input is tracked; its float outputs become tracked.
    pub(crate) fn record(&self, op: NodeOp, inputs: &[Tensor], outputs: &[Tensor]) {
        let mut s = self.lock();
        if !Self::active(&s) || !inputs.iter().any(|t| s.tracked.contains(&t.id())) {
            return;
        }
        for o in outputs {
            if differentiable(o.dtype()) {
                s.tracked.insert(o.id());
            }
        }
        s.nodes.push(Node {
            op,
            inputs: inputs.to_vec(),
            outputs: outputs.to_vec(),
            scope: (ferroflow_tensor::trace::is_active()
                || ferroflow_tensor::dispatch::is_tracing())
            .then(ferroflow_tensor::trace::current_name_scope),
        });
    }
    pub(crate) fn pause(&self, by: isize) {
        let mut s = self.lock();
        s.paused = (s.paused as isize + by).max(0) as usize;
    }
}

impl OpObserver for Recorder {
    fn on_op(&self, e: &OpEvent<'_>) {
        if matches!(e.op, Op::Constant | Op::ToHost) {
            return;
        }
        let inputs: Vec<Tensor> = e.inputs.iter().map(|t| (*t).clone()).collect();
        self.record(NodeOp::Primitive(e.op.clone()), &inputs, e.outputs);
    }
    fn on_variable_read(&self, v: &Variable, value: &Tensor) {
        let mut s = self.lock();
        if !Self::active(&s) || !differentiable(value.dtype()) {
            return;
        }
        if (s.watch_accessed && v.trainable()) || s.watched_vars.contains(&v.id()) {
            s.tracked.insert(value.id());
            let ids = s.var_values.entry(v.id()).or_default();
            if !ids.contains(&value.id()) {
                ids.push(value.id());
            }
        }
    }
}

thread_local! {
    /// The tapes recording on this thread (for custom_gradient and stop_recording).
    static ACTIVE: RefCell<Vec<Weak<Recorder>>> = const { RefCell::new(Vec::new()) };
}

pub(crate) fn active_recorders() -> Vec<Arc<Recorder>> {
    ACTIVE.with(|a| a.borrow().iter().filter_map(Weak::upgrade).collect())
}

/// Whether a tape records the ops run on this thread now: one is recording and not paused
/// (by [`GradientTape::stop_recording`] or inside a [`crate::custom_gradient`]'s forward).
/// Graph functions use it to record a call as one op only when a tape would see it.
///
/// ```
/// ferroflow::init();
/// use ferroflow::autodiff::{is_recording, GradientTape};
/// assert!(!is_recording());
/// let tape = GradientTape::new();
/// assert!(is_recording());
/// {
///     let _paused = tape.stop_recording();
///     assert!(!is_recording());
/// }
/// tape.stop();
/// assert!(!is_recording());
/// ```
pub fn is_recording() -> bool {
    active_recorders()
        .iter()
        .any(|r| Recorder::active(&r.lock()))
}

/// Whether a tape recording now tracks `t` (watched, a trainable variable's value read
/// under it, or computed from one): whether a gradient with respect to `t` can be asked
/// for. Graph functions compile a backward graph only for the inputs a tape tracks.
///
/// ```
/// ferroflow::init();
/// use ferroflow::{autodiff::{is_tracked, GradientTape}, Tensor};
/// let (x, c) = (Tensor::scalar(2.0f32)?, Tensor::scalar(3.0f32)?);
/// let tape = GradientTape::new();
/// tape.watch(&x);
/// let y = x.mul(&c)?;
/// assert!(is_tracked(&x) && is_tracked(&y) && !is_tracked(&c));
/// # Ok::<(), ferroflow::Error>(())
/// ```
pub fn is_tracked(t: &Tensor) -> bool {
    active_recorders().iter().any(|r| {
        let s = r.lock();
        Recorder::active(&s) && s.tracked.contains(&t.id())
    })
}

/// Records operations for automatic differentiation, like `tf.GradientTape`.
///
/// Recording starts at construction; a non-persistent tape stops at its
/// [`GradientTape::gradient`] call, a persistent one at [`GradientTape::stop`] or when dropped
/// (never recording its own backward passes). Ops run on this thread meanwhile that depend on
/// a watched tensor or a trainable variable read under the tape are recorded. Gradient functions are ordinary ops, so a tape
/// that is still recording when an inner tape computes gradients records that computation:
/// nest tapes for second derivatives.
///
/// ```
/// ferroflow::init();
/// use ferroflow::{Tensor, autodiff::GradientTape};
/// let x = Tensor::scalar(3.0f64)?;
/// let outer = GradientTape::new();
/// outer.watch(&x);
/// let inner = GradientTape::new();
/// inner.watch(&x);
/// let y = x.mul(&x)?.mul(&x)?;                       // y = x³
/// let dy = inner.gradient(&y, &[(&x).into()])?[0].clone().unwrap(); // 3x² = 27
/// let d2y = outer.gradient(&dy, &[(&x).into()])?[0].clone().unwrap(); // 6x = 18
/// assert_eq!((dy.item::<f64>()?, d2y.item::<f64>()?), (27.0, 18.0));
/// # Ok::<(), ferroflow::Error>(())
/// ```
pub struct GradientTape {
    recorder: Arc<Recorder>,
    guard: Mutex<Option<ObserverGuard>>,
}

impl Default for GradientTape {
    fn default() -> Self {
        GradientTape::new()
    }
}

impl GradientTape {
    /// A non-persistent tape that watches trainable variables it sees read.
    pub fn new() -> GradientTape {
        GradientTape::with_options(false, true)
    }
    /// A persistent tape: [`GradientTape::gradient`] may be called many times.
    pub fn persistent() -> GradientTape {
        GradientTape::with_options(true, true)
    }
    /// Both TF options: `persistent` and `watch_accessed_variables`.
    pub fn with_options(persistent: bool, watch_accessed_variables: bool) -> GradientTape {
        let recorder = Arc::new(Recorder {
            state: Mutex::new(State {
                recording: true,
                persistent,
                watch_accessed: watch_accessed_variables,
                ..State::default()
            }),
        });
        let guard = push_thread_observer(recorder.clone());
        ACTIVE.with(|a| {
            let mut a = a.borrow_mut();
            a.retain(|w| w.strong_count() > 0);
            a.push(Arc::downgrade(&recorder));
        });
        GradientTape {
            recorder,
            guard: Mutex::new(Some(guard)),
        }
    }

    /// Ensures `t` is traced: later ops that use it are recorded (`tape.watch`).
    pub fn watch(&self, t: &Tensor) {
        if differentiable(t.dtype()) {
            self.recorder.lock().tracked.insert(t.id());
        }
    }
    /// Watches a variable (useful with `watch_accessed_variables = false` or non-trainable
    /// variables); its current value is traced from now on.
    pub fn watch_variable(&self, v: &Variable) {
        self.recorder.lock().watched_vars.insert(v.id());
        let value = v.peek();
        self.recorder.on_variable_read(v, &value);
    }
    /// Variables this tape has seen read while watching them (`tape.watched_variables()`).
    pub fn watched_variable_ids(&self) -> Vec<u64> {
        self.recorder.lock().var_values.keys().copied().collect()
    }

    /// Pauses recording until the returned guard drops (`with tape.stop_recording():`).
    pub fn stop_recording(&self) -> RecordingPause {
        self.recorder.pause(1);
        RecordingPause {
            recorder: self.recorder.clone(),
        }
    }
    /// Forgets everything recorded so far (`tape.reset()`); watching starts again.
    pub fn reset(&self) {
        let mut s = self.recorder.lock();
        s.nodes.clear();
        s.tracked.clear();
        s.var_values.clear();
    }
    /// Stops recording for good (leaving TF's `with` block).
    pub fn stop(&self) {
        self.recorder.lock().recording = false;
        self.guard.lock().unwrap_or_else(|e| e.into_inner()).take();
    }
    /// Number of ops recorded (for tests and memory checks).
    pub fn num_recorded(&self) -> usize {
        self.recorder.lock().nodes.len()
    }

    /// d target / d sources (`tape.gradient(target, sources)`); `None` for sources the
    /// target does not depend on and for integer sources.
    pub fn gradient(&self, target: &Tensor, sources: &[Source]) -> Result<Vec<Option<Tensor>>> {
        self.gradient_with(
            std::slice::from_ref(target),
            sources,
            None,
            UnconnectedGradients::None,
        )
    }

    /// The full form: several targets (their gradients are summed), optional
    /// `output_gradients` (one per target, the target's shape), and the unconnected policy.
    pub fn gradient_with(
        &self,
        targets: &[Tensor],
        sources: &[Source],
        output_gradients: Option<&[Tensor]>,
        unconnected: UnconnectedGradients,
    ) -> Result<Vec<Option<Tensor>>> {
        let seeds = match output_gradients {
            Some(g) => {
                if g.len() != targets.len() {
                    return Err(Error::Tape {
                        method: "gradient",
                        msg: format!("{} output_gradients for {} targets", g.len(), targets.len()),
                    });
                }
                for (t, og) in targets.iter().zip(g) {
                    if t.shape() != og.shape() || t.dtype() != og.dtype() {
                        return Err(Error::Tape {
                            method: "gradient",
                            msg: format!(
                                "output_gradients has shape {:?} {}, target has {:?} {}",
                                og.shape(),
                                og.dtype(),
                                t.shape(),
                                t.dtype()
                            ),
                        });
                    }
                }
                g.to_vec()
            }
            None => targets
                .iter()
                .map(|t| t.ones_like())
                .collect::<Result<Vec<_>>>()?,
        };
        let out = self.backward_from(targets, seeds, sources, unconnected);
        self.finish();
        out
    }

    /// `tape.jacobian(target, source)`: shape `target.shape ++ source.shape`.
    pub fn jacobian(&self, target: &Tensor, source: &Source) -> Result<Tensor> {
        let src_shape = source.shape();
        let n = target.num_elements();
        let mut rows = Vec::with_capacity(n);
        for i in 0..n {
            let mut seed = vec![0.0; n];
            seed[i] = 1.0;
            rows.push(self.seeded_gradient("jacobian", target, &seed, source)?);
        }
        self.finish();
        let mut shape = target.shape().to_vec();
        shape.extend_from_slice(&src_shape);
        if rows.is_empty() {
            return Tensor::zeros(&shape, target.dtype());
        }
        Tensor::stack(&rows, 0)?.reshape_to(&shape)
    }

    /// `tape.batch_jacobian(target, source)`: for `[batch, ..]` target and source whose rows
    /// are independent, shape `[batch, target_rest.., source_rest..]`.
    pub fn batch_jacobian(&self, target: &Tensor, source: &Source) -> Result<Tensor> {
        let src_shape = source.shape();
        if target.rank() == 0 || src_shape.is_empty() || target.shape()[0] != src_shape[0] {
            return Err(Error::Tape {
                method: "batch_jacobian",
                msg: format!(
                    "target {:?} and source {:?} need the same leading batch axis",
                    target.shape(),
                    src_shape
                ),
            });
        }
        let b = target.shape()[0];
        let m: usize = target.shape()[1..].iter().product();
        let mut cols = Vec::with_capacity(m);
        for j in 0..m {
            let mut seed = vec![0.0; b * m];
            for r in 0..b {
                seed[r * m + j] = 1.0;
            }
            cols.push(self.seeded_gradient("batch_jacobian", target, &seed, source)?);
        }
        self.finish();
        let mut shape = vec![b];
        shape.extend_from_slice(&target.shape()[1..]);
        shape.extend_from_slice(&src_shape[1..]);
        if cols.is_empty() {
            return Tensor::zeros(&shape, target.dtype());
        }
        Tensor::stack(&cols, 1)?.reshape_to(&shape)
    }

    /// One backward pass from `target` seeded with `seed` (its elements, row-major), keeping
    /// the record for the next pass.
    fn seeded_gradient(
        &self,
        method: &'static str,
        target: &Tensor,
        seed: &[f64],
        source: &Source,
    ) -> Result<Tensor> {
        let seed = Tensor::from_host_on(
            HostData::from_f64_slice(target.dtype(), seed),
            target.shape(),
            target.device(),
        )?;
        let g = self.backward_from(
            std::slice::from_ref(target),
            vec![seed],
            std::slice::from_ref(source),
            UnconnectedGradients::Zero,
        )?;
        g.into_iter().next().flatten().ok_or_else(|| Error::Tape {
            method,
            msg: "no gradient for the source".into(),
        })
    }

    fn finish(&self) {
        let persistent = self.recorder.lock().persistent;
        if !persistent {
            let mut s = self.recorder.lock();
            s.used = true;
            s.nodes.clear();
            s.tracked.clear();
            s.var_values.clear();
        }
    }

    fn backward_from(
        &self,
        targets: &[Tensor],
        seeds: Vec<Tensor>,
        sources: &[Source],
        unconnected: UnconnectedGradients,
    ) -> Result<Vec<Option<Tensor>>> {
        // A non-persistent tape stops recording here (its `with` block is over in TF terms);
        // a persistent one keeps recording afterwards but not its own backward pass.
        let (nodes, var_values, tracked, persistent) = {
            let mut s = self.recorder.lock();
            if s.used {
                return Err(Error::Tape {
                    method: "gradient",
                    msg: "a non-persistent GradientTape can only be used to compute one set of gradients (use GradientTape::persistent())".into(),
                });
            }
            if !s.persistent {
                s.recording = false;
            }
            (
                std::mem::take(&mut s.nodes),
                s.var_values.clone(),
                s.tracked.clone(),
                s.persistent,
            )
        };
        if persistent {
            self.recorder.pause(1);
        } else {
            self.guard.lock().unwrap_or_else(|e| e.into_inner()).take();
        }
        let result = run_backward(
            &nodes,
            targets,
            seeds,
            sources,
            &var_values,
            &tracked,
            unconnected,
        );
        if persistent {
            self.recorder.pause(-1);
        }
        let mut s = self.recorder.lock();
        let recorded_meanwhile = std::mem::replace(&mut s.nodes, nodes);
        s.nodes.extend(recorded_meanwhile);
        drop(s);
        result
    }
}

impl Drop for GradientTape {
    fn drop(&mut self) {
        self.guard.lock().unwrap_or_else(|e| e.into_inner()).take();
    }
}

/// Resumes recording when dropped (see [`GradientTape::stop_recording`]).
pub struct RecordingPause {
    recorder: Arc<Recorder>,
}

impl Drop for RecordingPause {
    fn drop(&mut self) {
        self.recorder.pause(-1);
    }
}

fn accumulate(grads: &mut HashMap<TensorId, Tensor>, id: TensorId, g: Tensor) -> Result<()> {
    let sum = match grads.remove(&id) {
        Some(prev) => prev.add(&g)?,
        None => g,
    };
    grads.insert(id, sum);
    Ok(())
}

fn run_backward(
    nodes: &[Node],
    targets: &[Tensor],
    seeds: Vec<Tensor>,
    sources: &[Source],
    var_values: &HashMap<u64, Vec<TensorId>>,
    tracked: &HashSet<TensorId>,
    unconnected: UnconnectedGradients,
) -> Result<Vec<Option<Tensor>>> {
    if !targets.iter().any(|t| tracked.contains(&t.id())) {
        return Err(Error::Tape {
            method: "gradient",
            msg: "the target was not computed from any tensor or variable this tape watched (watch the inputs, or compute the target while the tape records)".into(),
        });
    }
    let mut grads: HashMap<TensorId, Tensor> = HashMap::new();
    for (t, s) in targets.iter().zip(seeds) {
        if tracked.contains(&t.id()) {
            accumulate(&mut grads, t.id(), s)?;
        }
    }
    for node in nodes.iter().rev() {
        let outs: Vec<Option<Tensor>> = node
            .outputs
            .iter()
            .map(|o| grads.get(&o.id()).cloned())
            .collect();
        if outs.iter().all(Option::is_none) {
            continue;
        }
        let _scope = node.scope.as_ref().map(|scope| {
            ferroflow_tensor::trace::NameScope::enter(&if scope.is_empty() {
                "gradient_tape".to_string()
            } else {
                format!("gradient_tape/{scope}")
            })
        });
        let ins = match &node.op {
            NodeOp::Primitive(op) => {
                let needs: Vec<bool> = node
                    .inputs
                    .iter()
                    .map(|i| tracked.contains(&i.id()) && differentiable(i.dtype()))
                    .collect();
                backward(op, &node.inputs, &node.outputs, &outs, &needs)?
            }
            NodeOp::Custom(f) => {
                let filled = node
                    .outputs
                    .iter()
                    .zip(&outs)
                    .map(|(o, g)| g.clone().map(Ok).unwrap_or_else(|| o.zeros_like()))
                    .collect::<Result<Vec<_>>>()?;
                f(&filled)?
            }
        };
        for (input, g) in node.inputs.iter().zip(ins) {
            if let Some(g) = g {
                if tracked.contains(&input.id()) && differentiable(input.dtype()) {
                    accumulate(&mut grads, input.id(), g)?;
                }
            }
        }
    }
    sources
        .iter()
        .map(|s| {
            let (found, like) = match s {
                Source::Tensor(t) => {
                    if !differentiable(t.dtype()) {
                        return Ok(None);
                    }
                    (grads.get(&t.id()).cloned(), t.clone())
                }
                Source::Variable(v) => {
                    let value = v.peek();
                    let mut acc: Option<Tensor> = None;
                    for id in var_values.get(&v.id()).into_iter().flatten() {
                        if let Some(g) = grads.get(id) {
                            acc = Some(match acc {
                                Some(a) => a.add(g)?,
                                None => g.clone(),
                            });
                        }
                    }
                    (acc, value)
                }
            };
            match (found, unconnected) {
                (Some(g), _) => Ok(Some(g)),
                (None, UnconnectedGradients::Zero) => Ok(Some(like.zeros_like()?)),
                (None, UnconnectedGradients::None) => Ok(None),
            }
        })
        .collect()
}
