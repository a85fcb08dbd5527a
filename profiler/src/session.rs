//! The profiling session: [`start`] / [`stop`] (`tf.profiler.experimental.start/stop`), the
//! [`Profile`] guard, and the recorder that listens to the dispatcher (every op) and to
//! `ferroflow_tensor::trace` (host spans, memory events).

use crate::export::Recording;
use crate::names::tf_op_type;
use ferroflow_tensor::dispatch::{OpEvent, OpObserver};
use ferroflow_tensor::trace::{
    self, DeviceEvent, HostEvent, MemoryEvent, SinkGuard, StatValue, TraceSink,
};
use ferroflow_tensor::{Device, Error, Result};
use std::cell::RefCell;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

/// What to record (`tf.profiler.experimental.ProfilerOptions`).
///
/// ```
/// let options = ferroflow_profiler::ProfilerOptions { delay_ms: 0, ..Default::default() };
/// assert_eq!(options.host_tracer_level, 2);
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ProfilerOptions {
    /// 0: no host events; 1: annotations only ([`crate::Trace`], `TraceMe`: steps, the
    /// input pipeline); 2 (the default, as TF): also every op through the dispatcher and
    /// every tensor allocation and free (the memory profile); 3: as 2 (TF's verbose level
    /// adds nothing ferroflow records).
    pub host_tracer_level: u32,
    /// 0: ops on GPUs are not recorded; 1 (default): they are, as their host-side launch
    /// on the host plane and, where the device has timestamp queries (the wgpu backend on
    /// an adapter with `TIMESTAMP_QUERY`), as each kernel's time on the device, on a
    /// `/device:GPU:<n>` plane (kernels then run one per pass while profiling).
    pub device_tracer_level: u32,
    /// Events before this many milliseconds after [`start`] are dropped.
    pub delay_ms: u64,
}

impl Default for ProfilerOptions {
    fn default() -> Self {
        ProfilerOptions {
            host_tracer_level: 2,
            device_tracer_level: 1,
            delay_ms: 0,
        }
    }
}

/// One recorded event, on the thread that ran it.
#[derive(Debug, Clone)]
pub(crate) struct RawEvent {
    /// Nanoseconds since the session began.
    pub start_ns: u64,
    /// Nanoseconds it took (0 for memory events).
    pub duration_ns: u64,
    pub kind: RawKind,
}

#[derive(Debug, Clone)]
pub(crate) enum RawKind {
    /// An op through the dispatcher.
    Op {
        /// TF's op type (`MatMul`).
        op_type: &'static str,
        /// The name scope (`sequential/dense`), empty at top level.
        scope: Arc<str>,
        device: Device,
        /// `[128,784];[784,10]`.
        input_shapes: String,
        /// `float;float`.
        input_dtypes: String,
        flops: u64,
        bytes_accessed: u64,
    },
    /// A `TraceMe` span (steps, input pipeline, annotations).
    Host {
        name: String,
        stats: Vec<(&'static str, StatValue)>,
    },
    /// A kernel timed on a device (GPU timestamp queries).
    Device {
        /// TF's op type of the op it ran for (`MatMul`), `Kernel` when unknown.
        op_type: &'static str,
        device: Device,
    },
    /// A tensor buffer allocated or freed.
    Memory {
        allocation: bool,
        bytes: u64,
        address: u64,
        device: Device,
        bytes_in_use: u64,
        op: Option<&'static str>,
        tensor: Option<(ferroflow_tensor::DType, Vec<usize>)>,
    },
}

/// The events of one thread.
pub(crate) struct ThreadEvents {
    pub id: u64,
    pub name: String,
    pub events: Mutex<Vec<RawEvent>>,
}

pub(crate) struct Recorder {
    session: u64,
    begin: Instant,
    /// Events before this are dropped (`delay_ms`).
    record_from: Instant,
    options: ProfilerOptions,
    threads: Mutex<Vec<Arc<ThreadEvents>>>,
}

static NEXT_SESSION: AtomicU64 = AtomicU64::new(1);
static NEXT_THREAD: AtomicU64 = AtomicU64::new(1);

thread_local! {
    /// This thread's buffer in the current session: (session id, buffer).
    static BUFFER: RefCell<Option<(u64, Arc<ThreadEvents>)>> = const { RefCell::new(None) };
    static THREAD_ID: u64 = NEXT_THREAD.fetch_add(1, Ordering::Relaxed);
}

impl Recorder {
    fn push(&self, at: Instant, duration: Duration, kind: RawKind) {
        if at < self.record_from {
            return;
        }
        let event = RawEvent {
            start_ns: at.saturating_duration_since(self.begin).as_nanos() as u64,
            duration_ns: duration.as_nanos() as u64,
            kind,
        };
        let mut event = Some(event);
        let _ = BUFFER.try_with(|b| {
            let mut b = b.borrow_mut();
            if !matches!(&*b, Some((session, _)) if *session == self.session) {
                let t = std::thread::current();
                let id = THREAD_ID.with(|id| *id);
                let buffer = Arc::new(ThreadEvents {
                    id,
                    name: t
                        .name()
                        .map_or_else(|| format!("thread-{id}"), str::to_string),
                    events: Mutex::new(Vec::with_capacity(1024)),
                });
                lock(&self.threads).push(buffer.clone());
                *b = Some((self.session, buffer));
            }
            if let (Some((_, buffer)), Some(e)) = (&*b, event.take()) {
                lock(&buffer.events).push(e);
            }
        });
        if let Some(event) = event {
            // The thread is exiting (its thread-locals are gone): keep the event anyway.
            let id = THREAD_ID.try_with(|id| *id).unwrap_or(0);
            lock(&self.threads).push(Arc::new(ThreadEvents {
                id,
                name: format!("thread-{id}"),
                events: Mutex::new(vec![event]),
            }));
        }
    }

    fn records_device(&self, device: Device) -> bool {
        device.kind() == ferroflow_tensor::DeviceKind::Cpu || self.options.device_tracer_level > 0
    }
}

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|e| e.into_inner())
}

fn shapes_and_dtypes(inputs: &[&ferroflow_tensor::Tensor]) -> (String, String) {
    let mut shapes = String::new();
    let mut dtypes = String::new();
    for (i, t) in inputs.iter().enumerate() {
        if i > 0 {
            shapes.push(';');
            dtypes.push(';');
        }
        shapes.push('[');
        for (j, d) in t.shape().iter().enumerate() {
            if j > 0 {
                shapes.push(',');
            }
            shapes.push_str(&d.to_string());
        }
        shapes.push(']');
        dtypes.push_str(crate::names::tf_dtype_name(t.dtype()));
    }
    (shapes, dtypes)
}

impl OpObserver for Recorder {
    fn on_op(&self, e: &OpEvent<'_>) {
        if self.options.host_tracer_level < 2 || !self.records_device(e.device) {
            return;
        }
        let (input_shapes, input_dtypes) = shapes_and_dtypes(e.inputs);
        let (flops, bytes_accessed) = crate::names::cost(e.op, e.inputs, e.outputs);
        self.push(
            e.start,
            e.duration,
            RawKind::Op {
                op_type: tf_op_type(e.op),
                scope: trace::current_name_scope(),
                device: e.device,
                input_shapes,
                input_dtypes,
                flops,
                bytes_accessed,
            },
        );
    }
}

impl TraceSink for Recorder {
    fn on_host_event(&self, e: &HostEvent<'_>) {
        if self.options.host_tracer_level < 1 {
            return;
        }
        self.push(
            e.start,
            e.end.saturating_duration_since(e.start),
            RawKind::Host {
                name: e.name.to_string(),
                stats: e.stats.to_vec(),
            },
        );
    }

    fn on_device_event(&self, e: &DeviceEvent) {
        if self.options.device_tracer_level == 0 {
            return;
        }
        self.push(
            e.start,
            e.duration,
            RawKind::Device {
                op_type: e.op.map_or("Kernel", crate::names::tf_op_type_of_name),
                device: e.device,
            },
        );
    }

    fn on_memory(&self, e: &MemoryEvent) {
        if self.options.host_tracer_level < 2 || !self.records_device(e.device) {
            return;
        }
        self.push(
            Instant::now(),
            Duration::ZERO,
            RawKind::Memory {
                allocation: e.allocation,
                bytes: e.bytes as u64,
                address: e.address as u64,
                device: e.device,
                bytes_in_use: e.bytes_in_use as u64,
                op: e.op,
                tensor: e.tensor.clone(),
            },
        );
    }
}

/// The running session.
struct Running {
    recorder: Arc<Recorder>,
    /// Where [`stop`] writes; `None` for a capture by a profiler client (the server sends
    /// the recording back instead).
    logdir: Option<PathBuf>,
    begin_wall_ns: u64,
    /// Bytes live per device when the session began (the memory profile's baseline).
    live_at_start: Vec<(Device, u64)>,
    _observer: ferroflow_tensor::dispatch::ObserverGuard,
    _sink: SinkGuard,
}

static RUNNING: Mutex<Option<Running>> = Mutex::new(None);

/// Nanoseconds since the Unix epoch (0 if the clock is before it).
pub(crate) fn wall_ns() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_nanos() as u64)
}

/// Starts profiling into `logdir` (`tf.profiler.experimental.start`): from now on every op,
/// annotation and allocation is recorded until [`stop`] writes the profile.
///
/// Errors: another profiler is running (in this process), or `logdir` cannot be written
/// (checked now, so a training run learns it before it starts, not when it stops).
///
/// ```
/// ferroflow::init();
/// let dir = tempfile::tempdir()?;
/// ferroflow_profiler::start(dir.path(), ferroflow_profiler::ProfilerOptions::default())?;
/// let x = ferroflow::Tensor::ones(&[4, 4], ferroflow::DType::F32)?;
/// let _ = x.matmul(&x)?;
/// assert!(ferroflow_profiler::start(dir.path(), Default::default()).is_err()); // one at a time
/// let written = ferroflow_profiler::stop()?;
/// assert!(written.xplane.exists());
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
pub fn start(logdir: impl AsRef<Path>, options: ProfilerOptions) -> Result<()> {
    let logdir = logdir.as_ref().to_path_buf();
    if is_running() {
        return Err(another_is_running());
    }
    check_writable(&logdir)?;
    begin(Some(logdir), options)
}

fn another_is_running() -> Error {
    let capture = lock(&RUNNING).as_ref().is_some_and(|r| r.logdir.is_none());
    Error::invalid(
        "profiler.start",
        if capture {
            "another profiler is running: a capture by a profiler client (profiler::server); \
             it ends by itself when its duration is over"
        } else {
            "another profiler is running; stop it first (profiler::stop)"
        },
    )
}

/// Starts a session recording into memory, written by [`stop`] when `logdir` is given.
fn begin(logdir: Option<PathBuf>, options: ProfilerOptions) -> Result<()> {
    let mut running = lock(&RUNNING);
    if running.is_some() {
        drop(running);
        return Err(another_is_running());
    }
    let begin = Instant::now();
    let recorder = Arc::new(Recorder {
        session: NEXT_SESSION.fetch_add(1, Ordering::Relaxed),
        begin,
        record_from: begin + Duration::from_millis(options.delay_ms),
        options,
        threads: Mutex::new(Vec::new()),
    });
    let sink = trace::install_sink(recorder.clone()).ok_or_else(|| {
        Error::invalid(
            "profiler.start",
            "another profiler is running (a trace sink is installed); stop it first",
        )
    })?;
    let observer = ferroflow_tensor::add_observer(recorder.clone());
    let live_at_start = [Device::CPU]
        .into_iter()
        .chain((0..8).map(Device::gpu))
        .map(|d| (d, trace::live_tensor_bytes_on(d) as u64))
        .filter(|(d, b)| *b > 0 || *d == Device::CPU)
        .collect();
    *running = Some(Running {
        recorder,
        logdir,
        begin_wall_ns: wall_ns(),
        live_at_start,
        _observer: observer,
        _sink: sink,
    });
    Ok(())
}

/// Ends the running session (stops listening) and returns its recording and where it was
/// to be written.
fn end(running: Running) -> (Recording, Option<PathBuf>) {
    let Running {
        recorder,
        logdir,
        begin_wall_ns,
        live_at_start,
        _observer,
        _sink,
    } = running;
    // Stop listening before the recording is read.
    drop(_observer);
    drop(_sink);
    let end_ns = recorder.begin.elapsed().as_nanos() as u64;
    let threads = std::mem::take(&mut *lock(&recorder.threads));
    let recording = Recording::from_threads(threads, begin_wall_ns, end_ns, live_at_start);
    (recording, logdir)
}

/// A capture for a profiler client (the profiler server's `Profile` call): records like
/// [`start`] but into memory; [`Capture::finish`] returns the recording, and dropping it
/// unfinished (the client went away) ends the session without writing anything.
pub(crate) struct Capture {
    active: bool,
}

impl Capture {
    /// Starts recording; the error of [`start`] when another profiler runs.
    pub(crate) fn start(options: ProfilerOptions) -> Result<Capture> {
        begin(None, options)?;
        Ok(Capture { active: true })
    }

    /// Stops recording and returns what was recorded.
    pub(crate) fn finish(mut self) -> Option<Recording> {
        self.active = false;
        take_capture().map(|r| end(r).0)
    }
}

/// The running session if it is a capture.
fn take_capture() -> Option<Running> {
    let mut running = lock(&RUNNING);
    if running.as_ref().is_some_and(|r| r.logdir.is_none()) {
        running.take()
    } else {
        None
    }
}

impl Drop for Capture {
    fn drop(&mut self) {
        if self.active {
            if let Some(r) = take_capture() {
                drop(end(r));
            }
        }
    }
}

/// Whether a profiling session is running in this process.
pub fn is_running() -> bool {
    lock(&RUNNING).is_some()
}

/// The files a session wrote.
#[derive(Debug, Clone)]
pub struct ProfileFiles {
    /// `<logdir>/plugins/profile/<run>/`.
    pub run_dir: PathBuf,
    /// `<host>.xplane.pb`: TF's XSpace (TensorBoard's Profile tab).
    pub xplane: PathBuf,
    /// `<host>.trace.json.gz`: Chrome trace events (Perfetto, chrome://tracing).
    pub trace_json: PathBuf,
}

/// Stops the session and writes its profile under `<logdir>/plugins/profile/<run>/`
/// (`tf.profiler.experimental.stop`). Errors: no session is running, or the files could
/// not be written (the recording is then lost, but nothing else is).
pub fn stop() -> Result<ProfileFiles> {
    let mut guard = lock(&RUNNING);
    let running = match guard.take() {
        Some(r) if r.logdir.is_none() => {
            *guard = Some(r);
            return Err(Error::invalid(
                "profiler.stop",
                "the running profile is a capture by a profiler client (profiler::server): \
                 it ends by itself when its duration is over",
            ));
        }
        Some(r) => r,
        None => {
            return Err(Error::invalid(
                "profiler.stop",
                "no profiler is running (profiler::start it first)",
            ))
        }
    };
    drop(guard);
    match end(running) {
        (recording, Some(logdir)) => crate::export::write_profile(&logdir, &recording),
        (_, None) => Err(Error::invalid(
            "profiler.stop",
            "the session had no log folder",
        )),
    }
}

/// Profiles while alive: starts on [`Profile::start`], stops and writes on drop (or on
/// [`Profile::finish`], which returns the files and any write error).
///
/// ```
/// ferroflow::init();
/// let dir = tempfile::tempdir()?;
/// {
///     let _profile = ferroflow_profiler::Profile::start(dir.path(), Default::default())?;
///     let x = ferroflow::Tensor::ones(&[8], ferroflow::DType::F32)?;
///     let _ = x.exp()?;
/// } // written here
/// assert!(dir.path().join("plugins/profile").exists());
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
#[must_use = "the profile stops when the guard is dropped"]
pub struct Profile {
    active: bool,
}

impl Profile {
    /// Starts a session (see [`start`]).
    pub fn start(logdir: impl AsRef<Path>, options: ProfilerOptions) -> Result<Profile> {
        start(logdir, options)?;
        Ok(Profile { active: true })
    }

    /// Stops now and returns what was written.
    pub fn finish(mut self) -> Result<ProfileFiles> {
        self.active = false;
        stop()
    }
}

impl Drop for Profile {
    fn drop(&mut self) {
        if self.active {
            if let Err(e) = stop() {
                // A drop cannot return the error; say it where a user looks.
                eprintln!("ferroflow profiler: the profile could not be written: {e}");
            }
        }
    }
}

/// Checks that `dir` can be created and written, by writing and removing a probe file.
fn check_writable(dir: &Path) -> Result<()> {
    std::fs::create_dir_all(dir).map_err(|e| Error::io(dir, &e))?;
    let probe = dir.join(format!(".ferroflow-profiler-probe-{}", std::process::id()));
    std::fs::write(&probe, b"").map_err(|e| Error::io(dir, &e))?;
    let _ = std::fs::remove_file(&probe);
    Ok(())
}

/// A profiled span of host code (`tf.profiler.experimental.Trace`). With `step_num` it
/// marks one training step: the overview page's step-time breakdown has a row per step.
/// Costs an atomic load when no profiler runs.
///
/// ```
/// for step in 0..3i64 {
///     let _step = ferroflow_profiler::Trace::new("train", step);
///     // ... one training step ...
/// }
/// let _span = ferroflow_profiler::Trace::new("preprocess", None);
/// ```
#[must_use = "the span ends when dropped"]
pub struct Trace(#[allow(dead_code)] trace::TraceMe);

impl Trace {
    /// Starts a span named `name`; `step_num` (with `Some` or a bare number) marks a step.
    pub fn new(name: &str, step_num: impl Into<Option<i64>>) -> Trace {
        if !trace::is_active() {
            return Trace(trace::TraceMe::new(""));
        }
        match step_num.into() {
            Some(step) => Trace(trace::TraceMe::step(name.to_string(), step)),
            None => Trace(trace::TraceMe::new(name.to_string())),
        }
    }
}

/// Marks a span of host code for the profiler: `let _t = trace!("name");` or with
/// statistics, `trace!("load", batch = 3, file = "a.rec")`. Inert (an atomic load) when no
/// profiler runs; the span ends when the returned guard drops.
///
/// ```
/// let _t = ferroflow_profiler::trace!("decode", batch = 7);
/// ```
#[macro_export]
macro_rules! trace {
    ($name:expr $(, $key:ident = $value:expr)* $(,)?) => {{
        #[allow(unused_mut)]
        let mut t = $crate::__private::TraceMe::new($name);
        if t.is_recording() {
            $( t.stat(stringify!($key), $crate::__private::IntoStat::into_stat($value)); )*
        }
        t
    }};
}
