//! The worker: heartbeats to the dispatcher, runs each task's pipeline on a thread of its
//! own into a bounded buffer, and hands the elements to the consumers that ask.

use bytes::Bytes;
use ferroflow_cluster::{Connector, Peer, PendingCall, TaskServer, MAX_MESSAGE_BYTES};
use ferroflow_tensor::{Error, Result};
use std::collections::{BTreeSet, HashMap, VecDeque};
use std::ops::Range;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Condvar, Mutex};
use std::time::{Duration, Instant};

use super::dispatcher::StopHandle;
use super::protocol::*;
use super::{Compression, ProcessingMode, Wakeup};
use crate::split::{with_split_provider, SplitProvider};

/// A [`WorkerServer`]'s settings (TF's `tf.data.experimental.service.WorkerConfig`).
///
/// ```
/// use ferroflow_data::service::WorkerConfig;
/// let config = WorkerConfig::new("127.0.0.1:5050");
/// assert_eq!(config.port, 0);
/// ```
#[derive(Clone, Debug)]
pub struct WorkerConfig {
    /// The dispatcher's `host:port` (a `grpc://` prefix is accepted).
    pub dispatcher_address: String,
    /// The port to listen on; 0 lets the OS pick one.
    pub port: u16,
    /// The interface to listen on: loopback by default.
    pub bind_address: String,
    /// The address consumers reach this worker at (default: the bound `host:port`).
    pub worker_address: Option<String>,
    /// How often the worker tells the dispatcher it is alive (and learns its tasks).
    pub heartbeat_interval: Duration,
    /// Each call to the dispatcher gives up after this long.
    pub dispatcher_timeout: Duration,
    /// Elements each task keeps ready for its consumers (default 32: with 8, one worker
    /// streaming MNIST batches to a consumer on loopback ran at 0.73× the pipeline in
    /// process in the median of seven rounds, with 32 at 0.88×; the buffer rides out the
    /// moments the consumer's requests are in transit). Memory: up to this many encoded
    /// elements per task.
    pub buffer_size: usize,
    /// The largest encoded element the worker sends: a larger one is an error for that
    /// element, naming both sizes.
    pub max_element_bytes: usize,
    /// The cluster token (default: `FERROFLOW_CLUSTER_TOKEN`).
    pub token: Option<String>,
}

impl WorkerConfig {
    /// The defaults, for a dispatcher at `dispatcher_address`.
    pub fn new(dispatcher_address: &str) -> WorkerConfig {
        WorkerConfig {
            dispatcher_address: dispatcher_address.to_string(),
            port: 0,
            bind_address: "127.0.0.1".into(),
            worker_address: None,
            heartbeat_interval: Duration::from_millis(200),
            dispatcher_timeout: Duration::from_secs(10),
            buffer_size: 32,
            max_element_bytes: MAX_MESSAGE_BYTES - 4096,
            token: ferroflow_cluster::token_from_env(),
        }
    }
}

/// `host:port` of a service address, without a `grpc://` scheme.
pub(crate) fn strip_scheme(address: &str) -> &str {
    address.strip_prefix("grpc://").unwrap_or(address)
}

/// A task's buffer of encoded elements, filled by its pipeline thread.
struct TaskRun {
    /// How its elements travel: compressed as they leave (on the serving thread, not the
    /// pipeline's, which is often the bottleneck).
    compression: Compression,
    queue: Mutex<Queue>,
    /// Wakes the consumers' requests: an element arrived in an empty buffer, the buffer is
    /// full, the pipeline ended, a reply finished gathering, or the task stopped. Not every
    /// element: a reply gathers several, and a wake-up per element cost more than the
    /// element's copy.
    ready: Condvar,
    /// Wakes the pipeline's thread waiting for room in a full buffer.
    room: Condvar,
    stop: AtomicBool,
    /// A consumer has been told the end: the task is finished.
    end_told: AtomicBool,
}

#[derive(Default)]
struct Queue {
    ready: VecDeque<(ElementHeader, Vec<u8>)>,
    /// A reply is gathering elements: the other requests wait their turn.
    gathering: bool,
    /// The pipeline ended (the reason when it could not run at all).
    ended: Option<Option<String>>,
}

impl TaskRun {
    /// Queues an element, waiting while the buffer is full; false once the task is stopped.
    fn push(&self, element: (ElementHeader, Vec<u8>), capacity: usize) -> bool {
        let mut q = self.queue.lock().unwrap_or_else(|e| e.into_inner());
        while q.ready.len() >= capacity && !self.stop.load(Ordering::Relaxed) {
            q = self
                .room
                .wait_timeout(q, Duration::from_millis(100))
                .unwrap_or_else(|e| e.into_inner())
                .0;
        }
        if self.stop.load(Ordering::Relaxed) {
            return false;
        }
        q.ready.push_back(element);
        // A request waits for a first element, or a gathering reply for a full buffer (or
        // the end of its gathering time).
        if (q.ready.len() == 1 && !q.gathering) || q.ready.len() >= capacity {
            self.ready.notify_all();
        }
        true
    }

    /// Wakes everything waiting on the task (it ended or stopped).
    fn wake_all(&self) {
        self.ready.notify_all();
        self.room.notify_all();
    }

    /// An element as it travels: snappy-compressed (by `encoder`, one per reply) when the
    /// job asks for it (under [`Compression::Auto`], when the consumer's request does).
    fn compress(
        &self,
        encoder: &mut snap::raw::Encoder,
        wanted: bool,
        header: ElementHeader,
        body: Vec<u8>,
    ) -> (ElementHeader, Vec<u8>) {
        let compress = match self.compression {
            Compression::None => false,
            Compression::Snappy => true,
            Compression::Auto => wanted,
        };
        if !compress || header.kind != ElementKind::Element {
            return (header, body);
        }
        match encoder.compress_vec(&body) {
            Ok(c) => (
                ElementHeader {
                    compressed: true,
                    ..header
                },
                c,
            ),
            Err(e) => (
                status(
                    ElementKind::ElementError(format!("cannot compress: {e}")),
                    header.source_read,
                ),
                vec![],
            ),
        }
    }

    fn end(&self, error: Option<String>) {
        self.queue.lock().unwrap_or_else(|e| e.into_inner()).ended = Some(error);
        self.wake_all();
    }

    /// The next reply for a consumer: the elements ready within a short gathering time,
    /// up to about `max_bytes` (at least one), waiting up to `wait` for the first; else the
    /// end (telling it marks the task finished) or "not ready".
    ///
    /// One reply gathers at a time, for up to [`GATHER_TIME`] or [`GATHER_BYTES`]: a
    /// consumer that keeps requests waiting would otherwise get each element in a call of
    /// its own, and a call costs far more than copying an element.
    fn take(&self, wait: Duration, max_bytes: usize, compressed: bool) -> Bytes {
        // Each element's framing counted as this many bytes.
        const FRAMING: usize = 256;
        let end = Instant::now() + wait;
        let mut q = self.queue.lock().unwrap_or_else(|e| e.into_inner());
        let wait_until = |q, until: Instant| {
            let left = until.saturating_duration_since(Instant::now());
            self.ready
                .wait_timeout(q, left)
                .unwrap_or_else(|e| e.into_inner())
                .0
        };
        // Our turn, and the first element.
        loop {
            if !q.gathering {
                if !q.ready.is_empty() {
                    break;
                }
                if let Some(error) = &q.ended {
                    let kind = match error {
                        None => ElementKind::End,
                        Some(msg) => ElementKind::TaskError(msg.clone()),
                    };
                    self.end_told.store(true, Ordering::Relaxed);
                    return header_only(kind);
                }
            }
            if Instant::now() >= end || self.stop.load(Ordering::Relaxed) {
                return header_only(ElementKind::NotReady);
            }
            q = wait_until(q, end);
        }
        q.gathering = true;
        let gather_end = Instant::now() + GATHER_TIME;
        let (mut taken, mut bytes, mut full) = (Vec::new(), 0usize, false);
        loop {
            while let Some((_, next)) = q.ready.front() {
                if !taken.is_empty() && bytes + next.len() + FRAMING > max_bytes {
                    full = true;
                    break;
                }
                bytes += next.len() + FRAMING;
                taken.extend(q.ready.pop_front());
            }
            // Room in the buffer: the pipeline goes on meanwhile.
            self.room.notify_all();
            if full
                || bytes >= GATHER_BYTES
                || q.ended.is_some()
                || Instant::now() >= gather_end
                || self.stop.load(Ordering::Relaxed)
            {
                break;
            }
            q = wait_until(q, gather_end);
        }
        q.gathering = false;
        drop(q);
        // The next request's turn.
        self.ready.notify_all();
        // Compressed and framed outside the lock.
        let mut taken = taken.into_iter();
        let Some((header, body)) = taken.next() else {
            return header_only(ElementKind::NotReady);
        };
        let mut encoder = snap::raw::Encoder::new();
        let (header, body) = self.compress(&mut encoder, compressed, header, body);
        let mut reply = Frames::new(&header, body);
        for (header, body) in taken {
            let (header, body) = self.compress(&mut encoder, compressed, header, body);
            reply.push(&header, &body);
        }
        reply.into_bytes()
    }
}

/// About how long a worker's pipeline should take to read one split of a distributed
/// epoch: a split costs a dispatcher call, so a pipeline that reads quickly asks for more
/// elements at a time (see [`split_want`]).
const SPLIT_TIME: Duration = Duration::from_millis(10);

/// The elements to ask for in the next split, after the pipeline read `elements` in
/// `took`: about [`SPLIT_TIME`]'s worth, at most four times the last split.
fn split_want(elements: u64, took: Duration) -> u64 {
    let per_split = elements as f64 * SPLIT_TIME.as_secs_f64() / took.as_secs_f64().max(1e-6);
    (per_split as u64).min(elements.saturating_mul(4))
}

/// The shortest time between two heartbeats of a worker (see [`Worker::heartbeat_due`]).
const MIN_HEARTBEAT_GAP: Duration = Duration::from_millis(2);

/// How long a reply waits for more elements after its first (see [`TaskRun::take`]).
const GATHER_TIME: Duration = Duration::from_millis(2);
/// A reply with this many bytes of elements goes at once.
const GATHER_BYTES: usize = 1 << 20;

/// A reply of one header and no element.
fn header_only(kind: ElementKind) -> Bytes {
    frame(&status(kind, 0), Vec::new())
}

/// A header without an element body: a per-element error, the end, ...
fn status(kind: ElementKind, source_read: u64) -> ElementHeader {
    ElementHeader {
        kind,
        compressed: false,
        source_read,
    }
}

struct Worker {
    address: String,
    /// This start of the worker (see [`WorkerHeartbeatRequest::incarnation`]).
    incarnation: u64,
    config: WorkerConfig,
    dispatcher: Peer,
    tasks: Mutex<HashMap<u64, Arc<TaskRun>>>,
    finished: Mutex<BTreeSet<u64>>,
    /// Wakes the heartbeat loop before its interval: the dispatcher has news for this
    /// worker (a consumer asked for a task it has not heard of), or this worker has news
    /// for the dispatcher (a consumer was told a task's end, which finishes the task).
    heartbeat_due: Wakeup,
}

/// Hands a distributed epoch's splits to the task's source, from the dispatcher. While the
/// source reads one split, the next is already asked for (the pipeline never waits a round
/// trip between splits; a worker that dies loses the one it holds ahead too, counted).
struct DispatcherSplits {
    worker: Arc<Worker>,
    job_id: u64,
    task_id: u64,
    read: Arc<AtomicU64>,
    /// Splits received so far (the next request's `split_index`), and the request for it
    /// already on its way.
    next: Mutex<(u64, Option<PendingCall>)>,
    /// When the pipeline got its last split, and that split's elements: the pace that sizes
    /// the next request (`want`).
    last: Mutex<Option<(Instant, u64)>>,
    /// The task (its retries end when it is stopped).
    run: Arc<TaskRun>,
}

impl DispatcherSplits {
    fn request(&self, split_index: u64, num_elements: u64, want: u64) -> PendingCall {
        let request = to_bytes(&GetSplitRequest {
            job_id: self.job_id,
            task_id: self.task_id,
            num_elements,
            split_index,
            want,
        });
        // Not retried inside the call: `next_split` retries every kind of unavailability
        // (refused, reset mid-call) against one deadline.
        self.worker.dispatcher.start_call(GET_SPLIT, request, false)
    }
}

impl SplitProvider for DispatcherSplits {
    /// Asks the dispatcher, again while it is unreachable (restarting in fault-tolerant
    /// mode) for up to the dispatcher timeout: the request names the split by index, so a
    /// retried one never skips a split.
    fn next_split(&self, num_elements: u64) -> Result<Option<Range<u64>>> {
        let mut next = self.next.lock().unwrap_or_else(|e| e.into_inner());
        let index = next.0;
        let started = Instant::now();
        // The pipeline read its last split in the time since it got it.
        let want = self
            .last
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .map_or(0, |(got, elements)| split_want(elements, got.elapsed()));
        let mut call = next
            .1
            .take()
            .unwrap_or_else(|| self.request(index, num_elements, want));
        let reply = loop {
            match call.wait() {
                Err(Error::Unavailable { .. })
                    if started.elapsed() < self.worker.config.dispatcher_timeout
                        && !self.run.stop.load(Ordering::Relaxed) =>
                {
                    std::thread::sleep(Duration::from_millis(50));
                    call = self.request(index, num_elements, want);
                }
                other => break other?,
            }
        };
        let reply: GetSplitReply = from_bytes("GetSplit reply", &reply)?;
        if let Some((start, end)) = reply.split {
            *next = (index + 1, Some(self.request(index + 1, num_elements, want)));
            *self.last.lock().unwrap_or_else(|e| e.into_inner()) =
                Some((Instant::now(), end.saturating_sub(start)));
        }
        Ok(reply.split.map(|(a, b)| a..b))
    }
    fn element_read(&self) {
        self.read.fetch_add(1, Ordering::Relaxed);
    }
}

impl Worker {
    /// Runs task `def`'s pipeline into `run`'s buffer until it ends or is stopped.
    fn produce(self: &Arc<Self>, def: TaskDef, run: Arc<TaskRun>) {
        let read = Arc::new(AtomicU64::new(0));
        let built = match def.mode {
            ProcessingMode::ParallelEpochs => super::registry::build_encoded(&def.dataset),
            ProcessingMode::DistributedEpoch => {
                let provider = Arc::new(DispatcherSplits {
                    worker: self.clone(),
                    job_id: def.job_id,
                    task_id: def.task_id,
                    read: read.clone(),
                    next: Mutex::new((0, None)),
                    last: Mutex::new(None),
                    run: run.clone(),
                });
                match with_split_provider(provider, || super::registry::build_encoded(&def.dataset))
                {
                    (Ok(_), claimed) if claimed != 1 => Err(Error::invalid(
                        "tf.data service",
                        format!(
                            "a distributed epoch splits the one source of a pipeline; \
                             pipeline {:?} has {claimed} splittable sources \
                             (from_tensor_slices, range, list_files)",
                            def.dataset.pipeline
                        ),
                    )),
                    (built, _) => built,
                }
            }
        };
        let dataset = match built {
            Ok(d) => d,
            Err(e) => {
                run.end(Some(format!(
                    "worker {} cannot run pipeline {:?}: {e}",
                    self.address, def.dataset.pipeline
                )));
                return;
            }
        };
        let limit = self.config.max_element_bytes;
        // The most an element of `n` bytes takes on the wire (snappy may grow it a little;
        // under `Auto` a consumer may ask for it compressed).
        let wire_len = |n: usize| match def.compression {
            Compression::None => n,
            // 0: too large for snappy at all.
            Compression::Snappy | Compression::Auto => match snap::raw::max_compress_len(n) {
                0 if n > 0 => usize::MAX,
                m => m,
            },
        };
        for item in dataset.iter() {
            let source_read = read.load(Ordering::Relaxed);
            let element = match item {
                Ok(bytes) if wire_len(bytes.len()) > limit => (
                    status(
                        ElementKind::ElementError(format!(
                            "an element of {} bytes is larger than the worker's message \
                             limit of {limit} bytes (max_element_bytes): batch fewer rows",
                            bytes.len()
                        )),
                        source_read,
                    ),
                    vec![],
                ),
                Ok(bytes) => (
                    ElementHeader {
                        kind: ElementKind::Element,
                        compressed: false,
                        source_read,
                    },
                    bytes,
                ),
                Err(e) => (
                    status(ElementKind::ElementError(e.to_string()), source_read),
                    vec![],
                ),
            };
            if !run.push(element, self.config.buffer_size) {
                return;
            }
        }
        run.end(None);
    }

    /// One heartbeat: reports the finished tasks, starts the new ones, stops those the
    /// dispatcher no longer lists.
    fn heartbeat(self: &Arc<Self>) -> Result<()> {
        let finished: Vec<u64> = {
            let tasks = self.tasks.lock().unwrap_or_else(|e| e.into_inner());
            let mut done = self.finished.lock().unwrap_or_else(|e| e.into_inner());
            for (id, run) in tasks.iter() {
                if run.end_told.load(Ordering::Relaxed) {
                    done.insert(*id);
                }
            }
            done.iter().copied().collect()
        };
        let reply = self.dispatcher.call(
            WORKER_HEARTBEAT,
            to_bytes(&WorkerHeartbeatRequest {
                worker_address: self.address.clone(),
                incarnation: self.incarnation,
                pipelines: super::registry::registered_pipelines(),
                finished_tasks: finished,
            }),
        )?;
        let reply: WorkerHeartbeatReply = from_bytes("WorkerHeartbeat reply", &reply)?;
        let listed: BTreeSet<u64> = reply.tasks.iter().map(|t| t.task_id).collect();
        let mut tasks = self.tasks.lock().unwrap_or_else(|e| e.into_inner());
        let finished = self.finished.lock().unwrap_or_else(|e| e.into_inner());
        // Tasks the dispatcher dropped (lost, or a dispatcher that forgot them) stop; the
        // finished ones stay to answer late consumers.
        tasks.retain(|id, run| {
            let keep = listed.contains(id) || finished.contains(id);
            if !keep {
                run.stop.store(true, Ordering::Relaxed);
                run.wake_all();
            }
            keep
        });
        for def in reply.tasks {
            if tasks.contains_key(&def.task_id) || finished.contains(&def.task_id) {
                continue;
            }
            let run = Arc::new(TaskRun {
                compression: def.compression,
                queue: Mutex::default(),
                ready: Condvar::new(),
                room: Condvar::new(),
                stop: AtomicBool::new(false),
                end_told: AtomicBool::new(false),
            });
            tasks.insert(def.task_id, run.clone());
            let me = self.clone();
            std::thread::Builder::new()
                .name(format!("tf.data task {}", def.task_id))
                .spawn(move || me.produce(def, run))
                .map_err(|e| Error::invalid("tf.data worker", format!("no thread: {e}")))?;
        }
        Ok(())
    }

    fn get_element(&self, payload: Bytes) -> Result<Bytes> {
        let r: GetElementRequest = from_bytes("GetElement request", &payload)?;
        let run = self
            .tasks
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .get(&r.task_id)
            .cloned();
        let Some(run) = run else {
            self.heartbeat_due.wake();
            return Ok(header_only(ElementKind::UnknownTask));
        };
        let max_bytes = (r.max_bytes as usize).min(self.config.max_element_bytes);
        let end_told = run.end_told.load(Ordering::Relaxed);
        let reply = run.take(Duration::from_millis(250), max_bytes, r.compressed);
        if !end_told && run.end_told.load(Ordering::Relaxed) {
            self.heartbeat_due.wake();
        }
        Ok(reply)
    }
}

/// A value that differs between two starts of a worker: the process id and the clock.
fn incarnation() -> u64 {
    let nanos = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_nanos() as u64);
    nanos ^ ((std::process::id() as u64) << 32)
}

/// A tf.data service worker (TF's `tf.data.experimental.service.WorkerServer`): registers
/// with the dispatcher, runs the pipelines of the tasks it is given (registered by name in
/// this program), and serves their elements to the trainers.
///
/// ```
/// use ferroflow_data::service::{DispatchServer, DispatcherConfig, WorkerConfig, WorkerServer};
/// let mut dispatcher = DispatchServer::new(DispatcherConfig::default());
/// dispatcher.start()?;
/// let mut worker = WorkerServer::new(WorkerConfig::new(&dispatcher.target()));
/// worker.start()?;
/// assert!(worker.address().starts_with("127.0.0.1:"));
/// worker.stop();
/// # Ok::<(), ferroflow_tensor::Error>(())
/// ```
pub struct WorkerServer {
    config: WorkerConfig,
    running: Option<(TaskServer, Arc<Worker>, Arc<AtomicBool>)>,
    heartbeats: Option<std::thread::JoinHandle<()>>,
    stopped: Arc<(Mutex<bool>, Condvar)>,
}

impl WorkerServer {
    /// A worker with `config`, not yet serving ([`start`](Self::start)).
    pub fn new(config: WorkerConfig) -> WorkerServer {
        WorkerServer {
            config,
            running: None,
            heartbeats: None,
            stopped: Arc::new((Mutex::new(false), Condvar::new())),
        }
    }

    /// Binds its port and starts heartbeating to the dispatcher (which may not be up yet:
    /// the worker keeps trying, and registers again after a dispatcher restart).
    pub fn start(&mut self) -> Result<()> {
        if self.running.is_some() {
            return Ok(());
        }
        let bind = format!("{}:{}", self.config.bind_address, self.config.port);
        // Bound now, serving once its method is there (a worker restarted on its address
        // is called at once by the consumers that were retrying it).
        let server = TaskServer::bind(&bind, self.config.token.as_deref())?;
        let address = self
            .config
            .worker_address
            .clone()
            .unwrap_or_else(|| server.local_addr().to_string());
        let connector = Connector::new(self.config.token.as_deref())?;
        let dispatcher = connector.peer(
            "the tf.data dispatcher",
            strip_scheme(&self.config.dispatcher_address),
            self.config.dispatcher_timeout,
        )?;
        let worker = Arc::new(Worker {
            address,
            incarnation: incarnation(),
            config: self.config.clone(),
            dispatcher,
            tasks: Mutex::default(),
            finished: Mutex::default(),
            heartbeat_due: Wakeup::default(),
        });
        let w = worker.clone();
        server.handle(GET_ELEMENT, move |payload| w.get_element(payload));
        server.serve();
        let stop = Arc::new(AtomicBool::new(false));
        let (w, s, interval) = (worker.clone(), stop.clone(), self.config.heartbeat_interval);
        self.heartbeats = Some(std::thread::spawn(move || {
            let _connector = connector;
            while !s.load(Ordering::Relaxed) {
                let started = Instant::now();
                let _ = w.heartbeat();
                w.heartbeat_due.wait(interval);
                // Woken early: at most one heartbeat per MIN_HEARTBEAT_GAP, however often
                // consumers ask for unknown tasks.
                std::thread::sleep(MIN_HEARTBEAT_GAP.saturating_sub(started.elapsed()));
            }
        }));
        *self.stopped.0.lock().unwrap_or_else(|e| e.into_inner()) = false;
        self.running = Some((server, worker, stop));
        Ok(())
    }

    /// The `host:port` consumers reach this worker at (empty before `start`).
    pub fn address(&self) -> String {
        self.running
            .as_ref()
            .map(|(_, w, _)| w.address.clone())
            .unwrap_or_default()
    }

    /// A handle that ends [`join`](Self::join) from another thread.
    pub fn stop_handle(&self) -> StopHandle {
        StopHandle(self.stopped.clone())
    }

    /// Blocks while the worker serves, until [`stop`](Self::stop) or a [`StopHandle`].
    pub fn join(&self) {
        let (lock, cv) = &*self.stopped;
        let mut stopped = lock.lock().unwrap_or_else(|e| e.into_inner());
        while !*stopped && self.running.is_some() {
            stopped = cv.wait(stopped).unwrap_or_else(|e| e.into_inner());
        }
    }

    /// Stops the tasks and the heartbeats, and stops serving.
    pub fn stop(&mut self) {
        if let Some((server, worker, stop)) = self.running.take() {
            stop.store(true, Ordering::Relaxed);
            worker.heartbeat_due.wake();
            for run in worker
                .tasks
                .lock()
                .unwrap_or_else(|e| e.into_inner())
                .values()
            {
                run.stop.store(true, Ordering::Relaxed);
                run.wake_all();
            }
            drop(server);
            if let Some(h) = self.heartbeats.take() {
                let _ = h.join();
            }
        }
        StopHandle(self.stopped.clone()).stop();
    }
}

impl Drop for WorkerServer {
    fn drop(&mut self) {
        self.stop();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn run(compression: Compression) -> TaskRun {
        TaskRun {
            compression,
            queue: Mutex::default(),
            ready: Condvar::new(),
            room: Condvar::new(),
            stop: AtomicBool::new(false),
            end_told: AtomicBool::new(false),
        }
    }

    /// Whether the element of a reply `take` made for a request asking `compressed` left
    /// compressed (and decompresses to what went in).
    fn sent_compressed(compression: Compression, compressed: bool) -> bool {
        let run = run(compression);
        let body = vec![7u8; 10_000];
        assert!(run.push((status(ElementKind::Element, 0), body.clone()), 8));
        let reply = run.take(Duration::from_secs(5), 1 << 20, compressed);
        let frames = unframe(&reply).unwrap();
        let (header, got) = &frames[0];
        assert_eq!(header.kind, ElementKind::Element);
        if header.compressed {
            let raw = snap::raw::Decoder::new().decompress_vec(got).unwrap();
            assert_eq!(raw, body);
        } else {
            assert_eq!(&got[..], &body[..]);
        }
        header.compressed
    }

    #[test]
    fn elements_are_compressed_as_the_job_and_under_auto_the_request_ask() {
        assert!(!sent_compressed(Compression::Auto, false));
        assert!(sent_compressed(Compression::Auto, true));
        assert!(sent_compressed(Compression::Snappy, false));
        assert!(!sent_compressed(Compression::None, true));
    }
}
