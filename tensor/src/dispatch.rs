//! The one dispatch function every op goes through, and the observers it informs.
//!
//! [`dispatch`] checks that the inputs share a device, finds that device's backend, runs
//! the kernel and then tells the active [`OpObserver`]s what ran: gradient tapes record it,
//! the profiler times it, a symbolic tracer captures it. This is how autodiff, profiler and
//! keras stay independent of each other and of the backends.
//!
//! Observers are global ([`add_observer`], e.g. a profiler) or per thread
//! ([`push_thread_observer`], e.g. a `GradientTape`, which TF keeps per thread). Ops that an
//! observer runs while being notified are not reported again (no re-entrancy). With no
//! observer active, the cost of dispatch is one atomic load and one thread-local read.

use crate::backend::Backend;
use crate::device::Device;
use crate::error::{Error, Result};
use crate::op::Op;
use crate::tensor::Tensor;
use crate::variable::Variable;
use std::cell::{Cell, RefCell};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, RwLock};
use std::time::{Duration, Instant};

/// What an observer is told after an op ran.
pub struct OpEvent<'a> {
    /// The op and its attributes.
    pub op: &'a Op,
    /// Its inputs.
    pub inputs: &'a [&'a Tensor],
    /// Its outputs.
    pub outputs: &'a [Tensor],
    /// Where it ran.
    pub device: Device,
    /// When the kernel started.
    pub start: Instant,
    /// How long the kernel took on the host (asynchronous backends: enqueue time).
    pub duration: Duration,
}

/// Something that wants to know about every op (gradient tape, profiler, tracer).
pub trait OpObserver: Send + Sync {
    /// Called after each op, on the thread that ran it.
    fn on_op(&self, event: &OpEvent<'_>);
    /// Called when a variable's value is read (tapes watch trainable variables this way).
    fn on_variable_read(&self, _variable: &Variable, _value: &Tensor) {}
    /// Called when a variable's value is read without telling tapes (`Variable::peek`:
    /// checkpoints, printing, moving averages); a graph tracer records it as a read all
    /// the same, so a later call reads the value of its time.
    fn on_variable_peek(&self, _variable: &Variable, _value: &Tensor) {}
    /// Called after a variable was written (`assign`, `assign_add`, `assign_sub` with
    /// `value`); a graph tracer records the write as an effect of its function.
    fn on_variable_write(
        &self,
        _variable: &Variable,
        _kind: crate::distribution::VariableWrite,
        _value: &Tensor,
    ) {
    }
    /// Called after a [`HostCall`] ran on `inputs` and returned `outputs`; a graph tracer
    /// records it as one node that calls it again on every replay.
    fn on_host_call(&self, _call: &HostCall, _inputs: &[Tensor], _outputs: &[Tensor]) {}
}

/// The function a [`HostCall`] runs.
pub type HostCallFn = dyn Fn(&[Tensor]) -> Result<Vec<Tensor>> + Send + Sync;

/// A computation on the host that graphs keep whole (TF's `tf.numpy_function`): a graph
/// function that makes one records one node, and every replay calls the function again
/// on that call's inputs. Its own ops are seen by no tape and no tracer (global observers,
/// a profiler, still see them), so its outputs carry no gradient, eagerly as in a graph.
/// It may have effects (an optimizer step: `ferroflow_optim::SharedOptimizer`); graphs keep
/// it where the trace made it, among the other effects.
///
/// ```no_run
/// use ferroflow_tensor::dispatch::HostCall;
/// use ferroflow_tensor::Tensor;
/// let double = HostCall::new("double", |xs: &[Tensor]| Ok(vec![xs[0].add(&xs[0])?]));
/// let y = double.call(&[Tensor::scalar(2.0f32)?])?;
/// assert_eq!(y[0].item::<f32>()?, 4.0);
/// # Ok::<(), ferroflow_tensor::Error>(())
/// ```
#[derive(Clone)]
pub struct HostCall {
    name: Arc<str>,
    function: Arc<HostCallFn>,
}

impl std::fmt::Debug for HostCall {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "HostCall({})", self.name)
    }
}

impl HostCall {
    /// A host call named `name` (graph listings and errors use it).
    pub fn new(
        name: impl Into<Arc<str>>,
        function: impl Fn(&[Tensor]) -> Result<Vec<Tensor>> + Send + Sync + 'static,
    ) -> HostCall {
        HostCall {
            name: name.into(),
            function: Arc::new(function),
        }
    }
    /// Its name.
    pub fn name(&self) -> &str {
        &self.name
    }
    /// Runs it on `inputs`, isolated from tapes and tracers, and tells the thread's
    /// observers (a graph tracer records it). Refused inside a control-flow branch being
    /// traced: the branch's effects are only checked there, and a host call cannot be.
    pub fn call(&self, inputs: &[Tensor]) -> Result<Vec<Tensor>> {
        if is_dry_run() {
            return Err(Error::NotTraceable {
                op: "host_call",
                msg: format!(
                    "host call {:?} inside a cond or while_loop branch of a graph function \
                     (branches are traced without their effects, and a host call's cannot be \
                     held back): call it outside the control flow",
                    self.name
                ),
            });
        }
        let outputs = {
            let _isolated = isolated_scope();
            (self.function)(inputs)?
        };
        if observed() {
            notify(|o| o.on_host_call(self, inputs, &outputs));
        }
        Ok(outputs)
    }
}

static GLOBAL: RwLock<Vec<Arc<dyn OpObserver>>> = RwLock::new(Vec::new());
static GLOBAL_COUNT: AtomicUsize = AtomicUsize::new(0);

thread_local! {
    static THREAD: RefCell<Vec<Arc<dyn OpObserver>>> = const { RefCell::new(Vec::new()) };
    static THREAD_COUNT: Cell<usize> = const { Cell::new(0) };
    static NOTIFYING: Cell<bool> = const { Cell::new(false) };
    static TRACING: Cell<usize> = const { Cell::new(0) };
    static DRY_RUN: Cell<usize> = const { Cell::new(0) };
}

/// While alive, variable writes on this thread are checked and reported to observers but
/// not made ([`enter_dry_run`]).
#[must_use = "the dry run ends when the guard is dropped"]
pub struct DryRunGuard(());

impl Drop for DryRunGuard {
    fn drop(&mut self) {
        let _ = DRY_RUN.try_with(|t| t.set(t.get().saturating_sub(1)));
    }
}

/// Enters a dry run on this thread (nests): a graph function traces the branch of a `cond`
/// that this call does not take, or a loop body, for its graph, and must not change the
/// variables it writes. [`InitScope`]s inside keep it.
///
/// ```
/// use ferroflow_tensor::dispatch::{enter_dry_run, is_dry_run};
/// assert!(!is_dry_run());
/// let dry = enter_dry_run(); // `v.assign_add(..)` now checks shapes and tells observers
/// assert!(is_dry_run());
/// drop(dry);
/// assert!(!is_dry_run());
/// ```
pub fn enter_dry_run() -> DryRunGuard {
    DRY_RUN.with(|t| t.set(t.get() + 1));
    DryRunGuard(())
}

/// Whether variable writes on this thread are only checked ([`enter_dry_run`]).
pub fn is_dry_run() -> bool {
    DRY_RUN.with(|t| t.get() > 0)
}

/// While alive, the thread observers registered before it (gradient tapes, an enclosing
/// graph trace) see none of this thread's ops and the thread is not tracing; observers
/// pushed inside (a tape, a branch's tracer) work as usual, and global observers (a
/// profiler) still see everything. A graph function runs a control-flow branch for its
/// value this way, or traces it into a graph of its own.
#[must_use = "the scope ends when the guard is dropped"]
pub struct IsolatedScope {
    observers: Vec<Arc<dyn OpObserver>>,
    tracing: usize,
}

impl Drop for IsolatedScope {
    fn drop(&mut self) {
        let observers = std::mem::take(&mut self.observers);
        let _ = THREAD_COUNT.try_with(|c| c.set(observers.len()));
        let _ = THREAD.try_with(|t| *t.borrow_mut() = observers);
        let _ = TRACING.try_with(|t| t.set(self.tracing));
    }
}

/// Enters an [`IsolatedScope`].
///
/// ```
/// use ferroflow_tensor::dispatch::{enter_tracing, is_tracing, isolated_scope};
/// let tracing = enter_tracing();
/// {
///     let _isolated = isolated_scope();
///     assert!(!is_tracing());
/// }
/// assert!(is_tracing());
/// # drop(tracing);
/// ```
pub fn isolated_scope() -> IsolatedScope {
    let observers = THREAD.with(|t| std::mem::take(&mut *t.borrow_mut()));
    THREAD_COUNT.with(|c| c.set(0));
    IsolatedScope {
        observers,
        tracing: TRACING.with(|t| t.replace(0)),
    }
}

/// While alive, this thread is tracing a graph function: ops run and are recorded, and
/// what a graph cannot record (a tensor's value read on the host) is refused with
/// [`Error::NotTraceable`] instead of baking one call's value into every later call.
#[must_use = "tracing ends when the guard is dropped"]
pub struct TracingGuard(());

impl Drop for TracingGuard {
    fn drop(&mut self) {
        let _ = TRACING.try_with(|t| t.set(t.get().saturating_sub(1)));
    }
}

/// Enters tracing mode on this thread (a graph function's tracer; nests).
pub fn enter_tracing() -> TracingGuard {
    TRACING.with(|t| t.set(t.get() + 1));
    TracingGuard(())
}

/// Whether this thread is tracing a graph function.
///
/// ```
/// use ferroflow_tensor::dispatch::{enter_tracing, is_tracing};
/// assert!(!is_tracing());
/// let guard = enter_tracing();
/// assert!(is_tracing());
/// drop(guard);
/// assert!(!is_tracing());
/// ```
pub fn is_tracing() -> bool {
    TRACING.with(|t| t.get() > 0)
}

/// While alive, this thread works outside any trace and any observer (TF's `init_scope`):
/// what a layer does to create its variables (initializers that draw seeds on the host)
/// runs once, eagerly, and no tape or graph records it.
#[must_use = "the scope ends when the guard is dropped"]
pub struct InitScope {
    tracing: usize,
    notifying: bool,
}

impl Drop for InitScope {
    fn drop(&mut self) {
        let _ = TRACING.try_with(|t| t.set(self.tracing));
        let _ = NOTIFYING.try_with(|n| n.set(self.notifying));
    }
}

/// Enters an [`InitScope`].
///
/// ```
/// use ferroflow_tensor::dispatch::{enter_tracing, init_scope, is_tracing};
/// let tracing = enter_tracing();
/// {
///     let _init = init_scope();
///     assert!(!is_tracing());
/// }
/// assert!(is_tracing());
/// # drop(tracing);
/// ```
pub fn init_scope() -> InitScope {
    InitScope {
        tracing: TRACING.with(|t| t.replace(0)),
        notifying: NOTIFYING.with(|n| n.replace(true)),
    }
}

/// `Err(NotTraceable)` for `op` while tracing: for host-side work whose result a graph
/// would bake in (`msg` says what to do instead).
pub fn refuse_while_tracing(op: &'static str, msg: &str) -> Result<()> {
    if is_tracing() {
        Err(Error::NotTraceable {
            op,
            msg: msg.to_string(),
        })
    } else {
        Ok(())
    }
}

/// Removes its observer when dropped.
#[must_use = "the observer is removed when the guard is dropped"]
pub struct ObserverGuard {
    observer: Arc<dyn OpObserver>,
    global: bool,
}

impl Drop for ObserverGuard {
    fn drop(&mut self) {
        let same = |o: &Arc<dyn OpObserver>| Arc::ptr_eq(o, &self.observer);
        if self.global {
            let mut g = GLOBAL.write().unwrap_or_else(|e| e.into_inner());
            if let Some(i) = g.iter().rposition(same) {
                g.remove(i);
                GLOBAL_COUNT.fetch_sub(1, Ordering::Release);
            }
        } else {
            let _ = THREAD.try_with(|t| {
                let mut t = t.borrow_mut();
                if let Some(i) = t.iter().rposition(same) {
                    t.remove(i);
                    THREAD_COUNT.with(|c| c.set(c.get() - 1));
                }
            });
        }
    }
}

/// Adds an observer for ops on every thread (a profiler).
pub fn add_observer(observer: Arc<dyn OpObserver>) -> ObserverGuard {
    GLOBAL
        .write()
        .unwrap_or_else(|e| e.into_inner())
        .push(observer.clone());
    GLOBAL_COUNT.fetch_add(1, Ordering::Release);
    ObserverGuard {
        observer,
        global: true,
    }
}

/// How many observers of every thread's ops are registered (a running profiler's; 0 while
/// none runs, when the dispatcher's only cost for them is one atomic load per op).
///
/// ```
/// assert_eq!(ferroflow_tensor::dispatch::global_observer_count(), 0);
/// ```
pub fn global_observer_count() -> usize {
    GLOBAL_COUNT.load(Ordering::Acquire)
}

/// Adds an observer for ops on this thread only (a gradient tape).
pub fn push_thread_observer(observer: Arc<dyn OpObserver>) -> ObserverGuard {
    THREAD.with(|t| t.borrow_mut().push(observer.clone()));
    THREAD_COUNT.with(|c| c.set(c.get() + 1));
    ObserverGuard {
        observer,
        global: false,
    }
}

#[inline]
fn observed() -> bool {
    (GLOBAL_COUNT.load(Ordering::Acquire) > 0 || THREAD_COUNT.with(|c| c.get()) > 0)
        && !NOTIFYING.with(|n| n.get())
}

fn notify(f: impl Fn(&dyn OpObserver)) {
    NOTIFYING.with(|n| n.set(true));
    struct Reset;
    impl Drop for Reset {
        fn drop(&mut self) {
            NOTIFYING.with(|n| n.set(false));
        }
    }
    let _reset = Reset;
    let thread: Vec<_> = THREAD.with(|t| t.borrow().clone());
    for o in &thread {
        f(o.as_ref());
    }
    if GLOBAL_COUNT.load(Ordering::Acquire) > 0 {
        let global: Vec<_> = GLOBAL.read().unwrap_or_else(|e| e.into_inner()).clone();
        for o in &global {
            f(o.as_ref());
        }
    }
}

pub(crate) fn notify_variable_read(variable: &Variable, value: &Tensor) {
    if observed() {
        notify(|o| o.on_variable_read(variable, value));
    }
}

pub(crate) fn notify_variable_peek(variable: &Variable, value: &Tensor) {
    if observed() {
        notify(|o| o.on_variable_peek(variable, value));
    }
}

pub(crate) fn notify_variable_write(
    variable: &Variable,
    kind: crate::distribution::VariableWrite,
    value: &Tensor,
) {
    if observed() {
        notify(|o| o.on_variable_write(variable, kind, value));
    }
}

/// What a kernel closure returns: one tensor, a pair, or a list.
pub trait OpOutputs {
    /// The outputs as a list, for observers.
    fn to_list(&self) -> Vec<Tensor>;
}
impl OpOutputs for Tensor {
    fn to_list(&self) -> Vec<Tensor> {
        vec![self.clone()]
    }
}
/// A read to the host: observers see the op with no tensor output.
impl OpOutputs for crate::HostData {
    fn to_list(&self) -> Vec<Tensor> {
        vec![]
    }
}
/// A list of outputs (a fused program's, a group's), in order.
impl OpOutputs for Vec<Tensor> {
    fn to_list(&self) -> Vec<Tensor> {
        self.clone()
    }
}
impl OpOutputs for (Tensor, Tensor) {
    fn to_list(&self) -> Vec<Tensor> {
        vec![self.0.clone(), self.1.clone()]
    }
}

/// Several variables' optimizer updates: `[w', slots'..]` per variable, in order.
impl OpOutputs for Vec<(Tensor, Vec<Tensor>)> {
    fn to_list(&self) -> Vec<Tensor> {
        self.iter()
            .flat_map(|(w, s)| std::iter::once(w.clone()).chain(s.iter().cloned()))
            .collect()
    }
}

impl OpOutputs for (Tensor, Vec<Tensor>) {
    fn to_list(&self) -> Vec<Tensor> {
        let mut v = vec![self.0.clone()];
        v.extend(self.1.iter().cloned());
        v
    }
}

/// Where a kernel runs: the device of the inputs and its backend.
pub struct Placement<'a> {
    /// The device.
    pub device: Device,
    /// Its backend.
    pub backend: &'a Arc<dyn Backend>,
}

impl Placement<'_> {
    /// Checks that an output of `shape` and `dtype` fits this device
    /// ([`crate::device::check_allocation`]); returns its element count. Call it before the
    /// kernel allocates.
    pub fn check_output(
        &self,
        op: &'static str,
        shape: &[usize],
        dtype: crate::DType,
    ) -> Result<usize> {
        crate::device::check_allocation(op, shape, dtype, self.device, self.backend.as_ref())
    }

    /// Host data of `shape` placed on this device as a tensor (creation ops' kernel).
    pub fn upload(&self, data: crate::HostData, shape: &[usize]) -> Result<Tensor> {
        let dtype = data.dtype();
        let buffer = self.backend.upload(self.device.index(), data)?;
        Ok(Tensor::from_buffer(
            buffer,
            shape,
            dtype,
            self.backend,
            self.device,
        ))
    }

    /// A tensor of `shape` with no elements, without calling a kernel: ops whose output is
    /// empty return this, so no kernel loops over the other (possibly huge) dimensions.
    pub fn empty(&self, shape: &[usize], dtype: crate::DType) -> Result<Tensor> {
        let buffer = self
            .backend
            .upload(self.device.index(), crate::HostData::filled(dtype, 0, 0.0))?;
        Ok(Tensor::from_buffer(
            buffer,
            shape,
            dtype,
            self.backend,
            self.device,
        ))
    }
}

/// Runs one op: checks the inputs share a device, runs `kernel` on that device's backend,
/// then tells the observers. `op` builds the op description only when someone observes.
/// Ops without inputs run on `device` (creation ops pass the current device scope).
pub fn dispatch<O: OpOutputs>(
    op: impl FnOnce() -> Op,
    inputs: &[&Tensor],
    kernel: impl FnOnce(Placement<'_>) -> Result<O>,
) -> Result<O> {
    let Some(first) = inputs.first() else {
        return Err(Error::invalid(
            "dispatch",
            "an op without inputs needs dispatch_on",
        ));
    };
    let device = first.device();
    for t in &inputs[1..] {
        if t.device() != device {
            return Err(Error::DeviceMismatch {
                op: op().name(),
                lhs: device.to_string(),
                rhs: t.device().to_string(),
            });
        }
    }
    run(op, inputs, device, first.backend(), kernel)
}

/// [`dispatch`] for ops without tensor inputs (constants, random numbers), on `device`.
pub fn dispatch_on<O: OpOutputs>(
    op: impl FnOnce() -> Op,
    device: Device,
    kernel: impl FnOnce(Placement<'_>) -> Result<O>,
) -> Result<O> {
    let backend = crate::device::backend_for(device)?;
    run(op, &[], device, &backend, kernel)
}

#[inline]
fn run<O: OpOutputs>(
    op: impl FnOnce() -> Op,
    inputs: &[&Tensor],
    device: Device,
    backend: &Arc<dyn Backend>,
    kernel: impl FnOnce(Placement<'_>) -> Result<O>,
) -> Result<O> {
    if !observed() {
        return kernel(Placement { device, backend });
    }
    let op = op();
    let current = crate::trace::CurrentOp::enter(op.name());
    let start = Instant::now();
    let out = kernel(Placement { device, backend })?;
    let duration = start.elapsed();
    drop(current);
    let outputs = out.to_list();
    notify(|o| {
        o.on_op(&OpEvent {
            op: &op,
            inputs,
            outputs: &outputs,
            device,
            start,
            duration,
        })
    });
    Ok(out)
}
