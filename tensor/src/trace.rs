//! Host trace events and memory events: the hook a profiler listens on (TF's `TraceMe`).
//!
//! Any crate can mark a span of host work with a [`TraceMe`] (the input pipeline's
//! `IteratorGetNext`, a training step, a gradient exchange) without depending on the
//! profiler: while no [`TraceSink`] is installed, creating one costs one atomic load and
//! records nothing. The profiler installs a sink with [`install_sink`] and is then told of
//! every finished span ([`TraceSink::on_host_event`]) and of every tensor buffer allocated
//! or freed on any device ([`TraceSink::on_memory`], with the bytes in use on that device
//! after it), which is what its memory profile is drawn from.
//!
//! ```
//! use ferroflow_tensor::trace::{StatValue, TraceMe};
//! // No sink installed: the span is inert and costs an atomic load.
//! let mut span = TraceMe::new("load_batch");
//! span.stat("batch", StatValue::I64(3));
//! drop(span);
//! ```

use crate::device::{Device, DeviceKind};
use crate::dtype::DType;
use std::borrow::Cow;
use std::cell::{Cell, RefCell};
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, RwLock};
use std::time::Instant;

/// The span the input pipeline records around fetching each element (TF's name): the
/// profiler counts time inside it as a step's input time.
pub const INPUT_SPAN: &str = "IteratorGetNext";

/// The op types (TF's names) of the collectives' spans, which the distribution crate records
/// as `<scope>/<type>:<type>` around each collective, with stats `algorithm`, `transport`,
/// `bytes`, `group_size` and `peers`: the profiler counts time inside them as communication.
pub const COLLECTIVE_OP_TYPES: &[&str] = &[
    "CollectiveReduceV2",
    "CollectiveGatherV2",
    "CollectiveBcastSendV2",
    "CollectiveBcastRecvV2",
];

/// The span a collective records while it waits for a peer's message (stat `peer`): the
/// part of a collective's time spent waiting for slower peers rather than transferring.
pub const PEER_WAIT_SPAN: &str = "PeerWait";

/// A value attached to a trace event (TF's `XStat` value kinds).
#[derive(Debug, Clone, PartialEq)]
pub enum StatValue {
    /// A signed integer.
    I64(i64),
    /// An unsigned integer.
    U64(u64),
    /// A float.
    F64(f64),
    /// A string.
    Str(Cow<'static, str>),
}

/// A finished span of host work.
pub struct HostEvent<'a> {
    /// What ran (`"IteratorGetNext"`, `"train"`, ...).
    pub name: &'a str,
    /// When it started.
    pub start: Instant,
    /// When it ended.
    pub end: Instant,
    /// Its statistics (`step_num`, `_r`, sizes).
    pub stats: &'a [(&'static str, StatValue)],
}

/// A tensor buffer allocated or freed.
pub struct MemoryEvent {
    /// Allocation (true) or free (false).
    pub allocation: bool,
    /// The buffer's size in bytes.
    pub bytes: usize,
    /// The buffer's identity (its address; an allocation and its free share it).
    pub address: usize,
    /// The device it lives on.
    pub device: Device,
    /// Bytes held by tensor buffers on that device after this event.
    pub bytes_in_use: usize,
    /// The op being dispatched on this thread when it happened (allocations), if any.
    pub op: Option<&'static str>,
    /// Dtype and shape of the tensor the buffer was made for (allocations).
    pub tensor: Option<(DType, Vec<usize>)>,
}

/// A kernel's run on a device, timed by the device itself (a GPU backend's timestamp
/// queries), its times converted to the host's clock.
pub struct DeviceEvent {
    /// The device.
    pub device: Device,
    /// The op the kernel was dispatched for ([`crate::op::Op::name`]), when known.
    pub op: Option<&'static str>,
    /// When the kernel started, on the host's clock (aligned to the moment the host saw
    /// the device finish the batch).
    pub start: Instant,
    /// How long it ran on the device.
    pub duration: std::time::Duration,
}

/// What a profiler implements to hear of host spans and memory events.
pub trait TraceSink: Send + Sync {
    /// A [`TraceMe`] span ended (called on the thread that ran it).
    fn on_host_event(&self, event: &HostEvent<'_>);
    /// A tensor buffer was allocated or freed (called on the thread that did it).
    fn on_memory(&self, event: &MemoryEvent);
    /// A kernel ran on a device (called by the backend when it learns the times).
    fn on_device_event(&self, _event: &DeviceEvent) {}
}

/// Reports kernels timed on a device (backends with timestamp queries call this).
pub fn record_device_events(events: &[DeviceEvent]) {
    if is_active() {
        with_sink(|s| {
            for e in events {
                s.on_device_event(e);
            }
        });
    }
}

/// The op this thread is dispatching ([`crate::op::Op::name`]) while an observer or a sink
/// is active: what a backend labels the kernels it records with.
pub fn current_op() -> Option<&'static str> {
    CURRENT_OP.with(|c| c.get())
}

static ACTIVE: AtomicBool = AtomicBool::new(false);
static SINK: RwLock<Option<Arc<dyn TraceSink>>> = RwLock::new(None);

/// Bytes live per device slot: CPU ordinals 0..8, then GPU ordinals 0..8 (ordinals past 7
/// share the last slot of their kind).
const SLOTS_PER_KIND: usize = 8;
static LIVE_PER_DEVICE: [AtomicUsize; 2 * SLOTS_PER_KIND] =
    [const { AtomicUsize::new(0) }; 2 * SLOTS_PER_KIND];

fn slot(device: Device) -> usize {
    let kind = match device.kind() {
        DeviceKind::Cpu => 0,
        DeviceKind::Gpu => 1,
    };
    kind * SLOTS_PER_KIND + device.index().min(SLOTS_PER_KIND - 1)
}

/// Bytes held by live tensor buffers on `device` (ordinals past 7 are counted together).
pub fn live_tensor_bytes_on(device: Device) -> usize {
    LIVE_PER_DEVICE[slot(device)].load(Ordering::Relaxed)
}

thread_local! {
    static CURRENT_OP: Cell<Option<&'static str>> = const { Cell::new(None) };
}

/// Whether a sink is installed (what every hook checks first).
#[inline]
pub fn is_active() -> bool {
    ACTIVE.load(Ordering::Acquire)
}

/// Removes the sink when dropped.
#[must_use = "the sink is removed when the guard is dropped"]
pub struct SinkGuard {
    sink: Arc<dyn TraceSink>,
}

impl Drop for SinkGuard {
    fn drop(&mut self) {
        let mut s = SINK.write().unwrap_or_else(|e| e.into_inner());
        if s.as_ref().is_some_and(|cur| Arc::ptr_eq(cur, &self.sink)) {
            *s = None;
            ACTIVE.store(false, Ordering::Release);
        }
    }
}

/// Installs `sink`; `None` when another sink is installed (one profiler at a time, as TF).
pub fn install_sink(sink: Arc<dyn TraceSink>) -> Option<SinkGuard> {
    let mut s = SINK.write().unwrap_or_else(|e| e.into_inner());
    if s.is_some() {
        return None;
    }
    *s = Some(sink.clone());
    ACTIVE.store(true, Ordering::Release);
    Some(SinkGuard { sink })
}

fn with_sink(f: impl FnOnce(&dyn TraceSink)) {
    let sink = SINK.read().unwrap_or_else(|e| e.into_inner()).clone();
    if let Some(sink) = sink {
        f(sink.as_ref());
    }
}

/// A span of host work, recorded when dropped if a sink was installed when it began
/// (TF's `TraceMe`).
#[must_use = "the span ends when dropped"]
pub struct TraceMe {
    name: Cow<'static, str>,
    start: Option<Instant>,
    stats: Vec<(&'static str, StatValue)>,
}

impl TraceMe {
    /// Starts a span named `name`.
    #[inline]
    pub fn new(name: impl Into<Cow<'static, str>>) -> TraceMe {
        if !is_active() {
            return TraceMe {
                name: Cow::Borrowed(""),
                start: None,
                stats: Vec::new(),
            };
        }
        TraceMe {
            name: name.into(),
            start: Some(Instant::now()),
            stats: Vec::new(),
        }
    }

    /// A training step's span: `name` with its `step_num`, marked as a root event (`_r`)
    /// so TF's tools group the step's events under it and the overview page has a row per
    /// step (TF's `Trace(name, step_num=..., _r=1)`).
    pub fn step(name: impl Into<Cow<'static, str>>, step_num: i64) -> TraceMe {
        let mut t = TraceMe::new(name);
        t.stat("step_num", StatValue::I64(step_num))
            .stat("_r", StatValue::I64(1));
        t
    }

    /// Whether this span is being recorded.
    pub fn is_recording(&self) -> bool {
        self.start.is_some()
    }

    /// Attaches a statistic (ignored when not recording).
    pub fn stat(&mut self, name: &'static str, value: StatValue) -> &mut TraceMe {
        if self.start.is_some() {
            self.stats.push((name, value));
        }
        self
    }
}

impl Drop for TraceMe {
    fn drop(&mut self) {
        if let Some(start) = self.start {
            let end = Instant::now();
            with_sink(|s| {
                s.on_host_event(&HostEvent {
                    name: &self.name,
                    start,
                    end,
                    stats: &self.stats,
                })
            });
        }
    }
}

/// Reports a finished span that was timed elsewhere (the dispatcher's kernel times).
pub fn record_host_event(event: &HostEvent<'_>) {
    if is_active() {
        with_sink(|s| s.on_host_event(event));
    }
}

/// Names the op this thread is dispatching (for the memory events of its allocations);
/// restores the previous name when dropped.
pub(crate) struct CurrentOp(Option<&'static str>);

impl CurrentOp {
    pub(crate) fn enter(name: &'static str) -> CurrentOp {
        CurrentOp(CURRENT_OP.with(|c| c.replace(Some(name))))
    }
}

impl Drop for CurrentOp {
    fn drop(&mut self) {
        let prev = self.0;
        CURRENT_OP.with(|c| c.set(prev));
    }
}

/// Counts a buffer of `bytes` on `device` as live; tells the sink if one is installed.
pub(crate) fn allocated(
    device: Device,
    bytes: usize,
    address: usize,
    tensor: impl FnOnce() -> (DType, Vec<usize>),
) {
    let live = LIVE_PER_DEVICE[slot(device)].fetch_add(bytes, Ordering::Relaxed) + bytes;
    if is_active() {
        let event = MemoryEvent {
            allocation: true,
            bytes,
            address,
            device,
            bytes_in_use: live,
            op: CURRENT_OP.with(|c| c.get()),
            tensor: Some(tensor()),
        };
        with_sink(|s| s.on_memory(&event));
    }
}

/// Counts a buffer as freed; tells the sink if one is installed.
pub(crate) fn freed(device: Device, bytes: usize, address: usize) {
    let live = LIVE_PER_DEVICE[slot(device)]
        .fetch_sub(bytes, Ordering::Relaxed)
        .saturating_sub(bytes);
    if is_active() {
        let event = MemoryEvent {
            allocation: false,
            bytes,
            address,
            device,
            bytes_in_use: live,
            op: None,
            tensor: None,
        };
        with_sink(|s| s.on_memory(&event));
    }
}

thread_local! {
    static NAME_SCOPE: RefCell<Vec<Arc<str>>> = const { RefCell::new(Vec::new()) };
}

/// A name scope (`tf.name_scope`) for the ops dispatched on this thread while it lives,
/// as the profiler names them (`sequential/dense/MatMul`). Keras layers enter their name.
/// Inert (an atomic load) when no sink is installed.
///
/// ```
/// use ferroflow_tensor::trace::{current_name_scope, NameScope};
/// let _outer = NameScope::enter("model");
/// // With no profiler running nothing is kept:
/// assert_eq!(&*current_name_scope(), "");
/// ```
#[must_use = "the scope ends when dropped"]
pub struct NameScope {
    entered: bool,
}

impl NameScope {
    /// Enters `name` below the current scope (kept while a profiler runs, and while a
    /// graph function is traced, whose graph keeps each op's scope for later profiles).
    #[inline]
    pub fn enter(name: &str) -> NameScope {
        if !is_active() && !crate::dispatch::is_tracing() {
            return NameScope { entered: false };
        }
        NAME_SCOPE.with(|s| {
            let mut s = s.borrow_mut();
            let full: Arc<str> = match s.last() {
                Some(parent) => format!("{parent}/{name}").into(),
                None => name.into(),
            };
            s.push(full);
        });
        NameScope { entered: true }
    }
}

impl NameScope {
    /// Enters the full scope `path` (`sequential/dense`) as it is, whatever the current
    /// scope: a graph's replay names each op as its trace did.
    #[inline]
    pub fn enter_path(path: &Arc<str>) -> NameScope {
        if !is_active() {
            return NameScope { entered: false };
        }
        NAME_SCOPE.with(|s| s.borrow_mut().push(path.clone()));
        NameScope { entered: true }
    }
}

impl Drop for NameScope {
    fn drop(&mut self) {
        if self.entered {
            let _ = NAME_SCOPE.try_with(|s| s.borrow_mut().pop());
        }
    }
}

/// The full name scope of this thread (`""` at top level).
pub fn current_name_scope() -> Arc<str> {
    NAME_SCOPE
        .try_with(|s| s.borrow().last().cloned())
        .ok()
        .flatten()
        .unwrap_or_else(|| {
            static TOP: std::sync::OnceLock<Arc<str>> = std::sync::OnceLock::new();
            TOP.get_or_init(|| Arc::from("")).clone()
        })
}
