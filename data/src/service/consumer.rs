//! The trainer's side: `distribute`, `register_dataset`, `from_dataset_id`, and the
//! iterator that reads a job's elements from its workers.

use bytes::Bytes;
use ferroflow_cluster::{Connector, Peer};
use ferroflow_tensor::{Error, Result};
use std::collections::{BTreeMap, VecDeque};
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::mpsc::{Receiver, SyncSender};
use std::sync::{Arc, Condvar, Mutex};
use std::time::{Duration, Instant};

use super::protocol::*;
use super::worker::strip_scheme;
use super::{Compression, ProcessingMode, Wakeup};
use crate::dataset::{Cardinality, ElementIter};
use crate::{decode_element, Dataset, Structure};

/// How a trainer reads from the service ([`distribute_with`], [`from_dataset_id_with`]).
///
/// ```
/// use ferroflow_data::service::{Compression, DistributeOptions};
/// let options = DistributeOptions { job_name: Some("shared".into()), ..Default::default() };
/// assert_eq!(options.compression, Compression::Auto);
/// ```
#[derive(Clone, Debug)]
pub struct DistributeOptions {
    /// Consumers iterating with the same job name share one job: each element goes to one
    /// of them. Without a name every iteration is a job of its own.
    pub job_name: Option<String>,
    /// Element requests in flight at once, over all workers (TF's
    /// `max_outstanding_requests`).
    pub max_outstanding_requests: usize,
    /// How elements travel (TF's `compression`: `Auto`, snappy between hosts, unless set).
    pub compression: Compression,
    /// Calls to the dispatcher and workers give up after this long; a dispatcher unreachable
    /// this long, or no live worker for this long, ends the iteration with an error.
    pub timeout: Duration,
    /// What this consumer received and lost (shared with its clones: keep one to read it).
    pub stats: ServiceStats,
    /// The cluster token (default: `FERROFLOW_CLUSTER_TOKEN`).
    pub token: Option<String>,
}

impl Default for DistributeOptions {
    fn default() -> Self {
        DistributeOptions {
            job_name: None,
            max_outstanding_requests: 8,
            compression: Compression::Auto,
            timeout: Duration::from_secs(30),
            stats: ServiceStats::default(),
            token: ferroflow_cluster::token_from_env(),
        }
    }
}

/// What one consumer received from the service, per task, and what was lost with workers
/// that died (a handle: clones share it).
///
/// A distributed epoch loses the elements a dead worker had read from its splits but not
/// delivered, as TF documents; [`lost_elements`](Self::lost_elements) counts them in source
/// elements (exact for one consumer of a pipeline without read-ahead: elements a worker's
/// `prefetch` or parallel `map` had read ahead count as delivered).
#[derive(Clone, Debug, Default)]
pub struct ServiceStats(Arc<Mutex<StatsInner>>);

#[derive(Debug, Default)]
struct StatsInner {
    elements: u64,
    tasks: BTreeMap<u64, TaskStats>,
}

#[derive(Debug, Default, Clone)]
struct TaskStats {
    worker: String,
    elements: u64,
    source_read: u64,
    split_elements: u64,
    lost: bool,
}

impl ServiceStats {
    fn with<R>(&self, f: impl FnOnce(&mut StatsInner) -> R) -> R {
        f(&mut self.0.lock().unwrap_or_else(|e| e.into_inner()))
    }

    /// Elements received (errors not counted).
    pub fn elements(&self) -> u64 {
        self.with(|s| s.elements)
    }

    /// Elements received from each worker, by address.
    pub fn elements_by_worker(&self) -> BTreeMap<String, u64> {
        self.with(|s| {
            let mut m = BTreeMap::new();
            for t in s.tasks.values() {
                *m.entry(t.worker.clone()).or_insert(0) += t.elements;
            }
            m
        })
    }

    /// The workers that died (or were given up) while serving this consumer.
    pub fn lost_workers(&self) -> Vec<String> {
        self.with(|s| {
            let mut v: Vec<String> = s
                .tasks
                .values()
                .filter(|t| t.lost)
                .map(|t| t.worker.clone())
                .collect();
            v.dedup();
            v
        })
    }

    /// Source elements of a distributed epoch lost with dead workers: handed to them in
    /// splits, never delivered here.
    pub fn lost_elements(&self) -> u64 {
        self.with(|s| {
            s.tasks
                .values()
                .filter(|t| t.lost)
                .map(|t| t.split_elements.saturating_sub(t.source_read))
                .sum()
        })
    }
}

impl std::fmt::Display for ServiceStats {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let lost = self.lost_workers();
        write!(
            f,
            "{} elements from {} workers",
            self.elements(),
            self.elements_by_worker().len()
        )?;
        if !lost.is_empty() {
            write!(
                f,
                "; lost {} source elements with {} ({})",
                self.lost_elements(),
                if lost.len() == 1 {
                    "a dead worker".to_string()
                } else {
                    format!("{} dead workers", lost.len())
                },
                lost.join(", ")
            )?;
        }
        Ok(())
    }
}

fn bad_service(service: &str) -> Error {
    Error::invalid(
        "tf.data service",
        format!("service {service:?} is not an address: expected grpc://host:port"),
    )
}

fn check_service(service: &str) -> Result<String> {
    let address = strip_scheme(service);
    match address.rsplit_once(':') {
        Some((host, port)) if !host.is_empty() && port.parse::<u16>().is_ok() => {
            Ok(address.to_string())
        }
        _ => Err(bad_service(service)),
    }
}

/// Moves a registered pipeline's processing onto the service (TF's
/// `tf.data.experimental.service.distribute`): `dataset.apply(distribute(mode, service,
/// job_name))` is a dataset whose iteration creates (or joins, by `job_name`) a job on the
/// dispatcher at `service` (`grpc://host:port`) and reads its elements from the workers.
/// The dataset must be one made by [`pipeline`](super::pipeline) (its name and parameters
/// are what travels); transformations after `distribute` run here.
///
/// ```no_run
/// ferroflow::init();
/// use ferroflow_data::service::{self, ProcessingMode};
/// use ferroflow_tensor::Tensor;
/// # service::register_pipeline("numbers", |_| Ok(ferroflow_data::Dataset::range(0, 10, 1)));
/// let ds = service::pipeline::<Tensor>("numbers", serde_json::json!({}))?
///     .apply(service::distribute(ProcessingMode::ParallelEpochs, "grpc://127.0.0.1:5050", None))?;
/// for x in &ds {
///     println!("{}", x?.item::<i64>()?);
/// }
/// # Ok::<(), ferroflow_tensor::Error>(())
/// ```
pub fn distribute<T: Structure>(
    mode: ProcessingMode,
    service: &str,
    job_name: Option<&str>,
) -> impl FnOnce(&Dataset<T>) -> Result<Dataset<T>> {
    distribute_with(
        mode,
        service,
        DistributeOptions {
            job_name: job_name.map(str::to_string),
            ..Default::default()
        },
    )
}

/// [`distribute`] with all of [`DistributeOptions`].
pub fn distribute_with<T: Structure>(
    mode: ProcessingMode,
    service: &str,
    options: DistributeOptions,
) -> impl FnOnce(&Dataset<T>) -> Result<Dataset<T>> {
    let service = service.to_string();
    move |dataset: &Dataset<T>| {
        let address = check_service(&service)?;
        let def = registered_def(dataset)?;
        Ok(service_dataset(mode, address, Source::Def(def), options))
    }
}

fn registered_def<T>(dataset: &Dataset<T>) -> Result<DatasetDef> {
    dataset.pipeline.as_deref().cloned().ok_or_else(|| {
        Error::invalid(
            "tf.data service",
            "the dataset is not a registered pipeline: the service's workers cannot run Rust \
             closures sent to them, so build the dataset with service::pipeline(name, params) \
             from a pipeline registered with service::register_pipeline (transformations \
             after distribute run in the trainer)",
        )
    })
}

/// Registers `dataset` (a [`pipeline`](super::pipeline)) with the dispatcher at `service`
/// and returns its id, for [`from_dataset_id`] (TF's `register_dataset`); the same pipeline
/// and parameters give the same id.
pub fn register_dataset<T: Structure>(service: &str, dataset: &Dataset<T>) -> Result<u64> {
    register_dataset_with(service, dataset, &DistributeOptions::default())
}

/// [`register_dataset`] with the token and timeout of `options`.
pub fn register_dataset_with<T: Structure>(
    service: &str,
    dataset: &Dataset<T>,
    options: &DistributeOptions,
) -> Result<u64> {
    let address = check_service(service)?;
    let def = registered_def(dataset)?;
    let connector = Connector::new(options.token.as_deref())?;
    let dispatcher = connector.peer("the tf.data dispatcher", &address, options.timeout)?;
    register(&dispatcher, &def)
}

fn register(dispatcher: &Peer, def: &DatasetDef) -> Result<u64> {
    let reply = dispatcher.call(REGISTER_DATASET, to_bytes(def))?;
    Ok(from_bytes::<RegisterDatasetReply>("GetOrRegisterDataset reply", &reply)?.dataset_id)
}

/// The elements of the dataset registered as `dataset_id` (TF's `from_dataset_id`), read
/// through a job as with [`distribute`]. An error when the dispatcher knows no such dataset
/// or its elements are not `T`.
pub fn from_dataset_id<T: Structure>(
    mode: ProcessingMode,
    service: &str,
    dataset_id: u64,
    job_name: Option<&str>,
) -> Result<Dataset<T>> {
    from_dataset_id_with(
        mode,
        service,
        dataset_id,
        DistributeOptions {
            job_name: job_name.map(str::to_string),
            ..Default::default()
        },
    )
}

/// [`from_dataset_id`] with all of [`DistributeOptions`].
pub fn from_dataset_id_with<T: Structure>(
    mode: ProcessingMode,
    service: &str,
    dataset_id: u64,
    options: DistributeOptions,
) -> Result<Dataset<T>> {
    let address = check_service(service)?;
    let connector = Connector::new(options.token.as_deref())?;
    let dispatcher = connector.peer("the tf.data dispatcher", &address, options.timeout)?;
    let reply = dispatcher.call(GET_DATASET, to_bytes(&GetDatasetRequest { dataset_id }))?;
    let def: DatasetDef = from_bytes("GetDatasetDef reply", &reply)?;
    if def.element_type != std::any::type_name::<T>() {
        return Err(Error::invalid(
            "tf.data service",
            format!(
                "dataset {dataset_id} (pipeline {:?}) yields {}, not {}",
                def.pipeline,
                def.element_type,
                std::any::type_name::<T>()
            ),
        ));
    }
    Ok(service_dataset(
        mode,
        address,
        Source::Id(dataset_id),
        options,
    ))
}

#[derive(Clone)]
enum Source {
    Def(DatasetDef),
    Id(u64),
}

fn service_dataset<T: Structure>(
    mode: ProcessingMode,
    address: String,
    source: Source,
    options: DistributeOptions,
) -> Dataset<T> {
    let fp = format!("service({address},{mode:?})");
    Dataset::from_parts(
        Cardinality::Unknown,
        move || Ok(fp.clone()),
        move || -> ElementIter<T> {
            match Consumer::<T>::start(mode, &address, source.clone(), options.clone()) {
                Ok(c) => Box::new(c),
                Err(e) => Box::new(std::iter::once(Err(e))),
            }
        },
    )
}

/// What the reading threads send the iterator.
enum Item<T> {
    Element(Result<T>),
    End,
}

/// Element requests in flight, over all of a consumer's workers.
struct Permits {
    free: Mutex<usize>,
    changed: Condvar,
}

impl Permits {
    fn try_take(&self) -> bool {
        let mut f = self.free.lock().unwrap_or_else(|e| e.into_inner());
        if *f > 0 {
            *f -= 1;
            true
        } else {
            false
        }
    }
    fn take(&self, stop: &AtomicBool) -> bool {
        let mut f = self.free.lock().unwrap_or_else(|e| e.into_inner());
        while *f == 0 {
            if stop.load(Ordering::Relaxed) {
                return false;
            }
            f = self
                .changed
                .wait_timeout(f, Duration::from_millis(100))
                .unwrap_or_else(|e| e.into_inner())
                .0;
        }
        *f -= 1;
        true
    }
    fn give(&self) {
        *self.free.lock().unwrap_or_else(|e| e.into_inner()) += 1;
        self.changed.notify_one();
    }
}

/// One pass over a job: a thread that follows the job on the dispatcher and a thread per
/// task reading its worker, all feeding one channel.
struct Consumer<T> {
    rx: Receiver<Item<T>>,
    stop: Arc<AtomicBool>,
    done: bool,
}

impl<T> Drop for Consumer<T> {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
    }
}

impl<T: Structure> Iterator for Consumer<T> {
    type Item = Result<T>;
    fn next(&mut self) -> Option<Result<T>> {
        if self.done {
            return None;
        }
        match self.rx.recv() {
            Ok(Item::Element(e)) => Some(e),
            Ok(Item::End) | Err(_) => {
                self.done = true;
                None
            }
        }
    }
}

struct Shared<T> {
    connector: Connector,
    tx: SyncSender<Item<T>>,
    stop: Arc<AtomicBool>,
    permits: Permits,
    stats: ServiceStats,
    timeout: Duration,
    /// The job's compression, as this consumer asked for it.
    compression: Compression,
    /// Readers whose thread has not ended.
    readers_running: AtomicUsize,
    /// Wakes [`follow_job`] when a reader ends: the job may be finished.
    reader_ended: Wakeup,
}

impl<T: Structure> Consumer<T> {
    fn start(
        mode: ProcessingMode,
        address: &str,
        source: Source,
        options: DistributeOptions,
    ) -> Result<Consumer<T>> {
        let connector = Connector::new(options.token.as_deref())?;
        let dispatcher = connector.peer("the tf.data dispatcher", address, options.timeout)?;
        let dataset_id = match source {
            Source::Def(def) => register(&dispatcher, &def)?,
            Source::Id(id) => id,
        };
        let reply = dispatcher.call(
            CREATE_JOB,
            to_bytes(&CreateJobRequest {
                dataset_id,
                mode,
                job_name: options.job_name.clone(),
                compression: options.compression,
            }),
        )?;
        let job_id = from_bytes::<CreateJobReply>("GetOrCreateJob reply", &reply)?.job_id;
        let outstanding = options.max_outstanding_requests.max(1);
        let (tx, rx) = std::sync::mpsc::sync_channel(outstanding * 2);
        let stop = Arc::new(AtomicBool::new(false));
        let shared = Arc::new(Shared {
            connector,
            tx,
            stop: stop.clone(),
            permits: Permits {
                free: Mutex::new(outstanding),
                changed: Condvar::new(),
            },
            stats: options.stats.clone(),
            timeout: options.timeout,
            compression: options.compression,
            readers_running: AtomicUsize::new(0),
            reader_ended: Wakeup::default(),
        });
        std::thread::Builder::new()
            .name("tf.data consumer".into())
            .spawn(move || follow_job(shared, dispatcher, job_id))
            .map_err(|e| Error::invalid("tf.data service", format!("no thread: {e}")))?;
        Ok(Consumer {
            rx,
            stop,
            done: false,
        })
    }
}

/// Follows job `job_id` on the dispatcher: starts a reader for each new task, records the
/// splits handed out, and ends the pass once the job is finished and every reader is done.
fn follow_job<T: Structure>(shared: Arc<Shared<T>>, dispatcher: Peer, job_id: u64) {
    let mut readers: BTreeMap<u64, std::thread::JoinHandle<()>> = BTreeMap::new();
    let mut last_answer = Instant::now();
    let mut last_worker = Instant::now();
    let mut last_read = Instant::now();
    let mut idle_wait = Duration::from_millis(1);
    let fail = |e: Error| {
        let _ = shared.tx.send(Item::Element(Err(e)));
        let _ = shared.tx.send(Item::End);
    };
    while !shared.stop.load(Ordering::Relaxed) {
        let reply = dispatcher
            .call(
                CLIENT_HEARTBEAT,
                to_bytes(&ClientHeartbeatRequest { job_id }),
            )
            .and_then(|r| from_bytes::<ClientHeartbeatReply>("ClientHeartbeat reply", &r));
        let hb = match reply {
            Ok(hb) => hb,
            Err(e @ Error::Remote { .. }) => return fail(e),
            Err(e) if last_answer.elapsed() > shared.timeout => return fail(e),
            Err(_) => {
                std::thread::sleep(Duration::from_millis(100));
                continue;
            }
        };
        last_answer = Instant::now();
        shared.stats.with(|s| {
            for t in &hb.tasks {
                let entry = s.tasks.entry(t.task_id).or_default();
                entry.worker = t.worker_address.clone();
                entry.split_elements = t.split_elements;
                if t.state == TaskState::Lost {
                    entry.lost = true;
                }
            }
        });
        for t in hb.tasks.iter().filter(|t| t.state != TaskState::Lost) {
            if readers.contains_key(&t.task_id) {
                continue;
            }
            let (running, task) = (ReaderRunning::new(&shared), t.clone());
            if let Ok(h) = std::thread::Builder::new()
                .name(format!("tf.data reader {}", t.task_id))
                .spawn(move || read_task(running.0.clone(), task))
            {
                readers.insert(t.task_id, h);
            }
        }
        let reading = shared.readers_running.load(Ordering::SeqCst) > 0;
        if hb.finished && !reading {
            break;
        }
        let stalled = |what: &str| {
            fail(Error::Unavailable {
                op: format!("read job {job_id}"),
                peer: "the tf.data workers".into(),
                msg: format!(
                    "{what} for {:?} and the job is not finished",
                    shared.timeout
                ),
            })
        };
        if hb.live_workers > 0 || reading {
            last_worker = Instant::now();
        } else if last_worker.elapsed() > shared.timeout {
            return stalled("no worker has been alive");
        }
        if reading {
            last_read = Instant::now();
        } else if last_read.elapsed() > shared.timeout {
            // Every reader ended (a task's error, a worker gone) and the dispatcher still
            // counts a task running: say so rather than wait for ever.
            return stalled("no task of the job has been read");
        }
        if reading {
            shared.reader_ended.wait(FOLLOW_INTERVAL);
            idle_wait = Duration::from_millis(1);
        } else {
            // No reader: the job is about to finish (its workers report their tasks' ends
            // right after telling them), or it waits for a worker. Ask again soon, then
            // less and less often.
            shared.reader_ended.wait(idle_wait);
            idle_wait = (idle_wait * 2).min(FOLLOW_INTERVAL);
        }
    }
    for (_, h) in readers {
        let _ = h.join();
    }
    let _ = shared.tx.send(Item::End);
}

/// A reader counted in [`Shared::readers_running`] from its start until its thread ends
/// (however it ends, or when it could not start), which wakes [`follow_job`].
struct ReaderRunning<T>(Arc<Shared<T>>);

impl<T> ReaderRunning<T> {
    fn new(shared: &Arc<Shared<T>>) -> ReaderRunning<T> {
        shared.readers_running.fetch_add(1, Ordering::SeqCst);
        ReaderRunning(shared.clone())
    }
}

impl<T> Drop for ReaderRunning<T> {
    fn drop(&mut self) {
        self.0.readers_running.fetch_sub(1, Ordering::SeqCst);
        self.0.reader_ended.wake();
    }
}

/// How often a consumer asks the dispatcher about its job while its readers read (new
/// tasks, lost workers); sooner when a reader ends.
const FOLLOW_INTERVAL: Duration = Duration::from_millis(50);

/// How many bytes of elements one `GetElement` reply may carry: all the worker has ready,
/// up to this (a reply per element would cost a round trip per element).
const REPLY_BYTES: u64 = 4 << 20;

/// Reads task `task`'s elements from its worker until it ends, fails, or the worker dies.
fn read_task<T: Structure>(shared: Arc<Shared<T>>, task: TaskInfo) {
    let lost = |shared: &Shared<T>| {
        shared.stats.with(|s| {
            s.tasks.entry(task.task_id).or_default().lost = true;
        })
    };
    let worker = match shared.connector.peer(
        &format!("tf.data worker {}", task.worker_address),
        &task.worker_address,
        shared.timeout,
    ) {
        Ok(w) => w,
        Err(_) => return lost(&shared),
    };
    let request = to_bytes(&GetElementRequest {
        task_id: task.task_id,
        max_bytes: REPLY_BYTES,
        compressed: shared.compression.compresses_for(&task.worker_address),
    });
    let mut in_flight = VecDeque::new();
    let mut ending = false;
    // The dispatcher lists a task before its worker's next heartbeat tells the worker of
    // it: until the worker answers for it once, "no such task" means "not yet". Requests
    // in flight together may be answered in any order: only a request sent after the first
    // answer for the task came back can tell that the worker dropped it.
    let started = Instant::now();
    let mut known = TaskKnown::default();
    let mut not_yet_wait = Duration::from_millis(1);
    'reading: loop {
        if shared.stop.load(Ordering::Relaxed) {
            break;
        }
        if !ending {
            if in_flight.is_empty() {
                if !shared.permits.take(&shared.stop) {
                    break;
                }
                in_flight.push_back((
                    Instant::now(),
                    worker.start_call(GET_ELEMENT, request.clone(), false),
                ));
            }
            while in_flight.len() < 4 && shared.permits.try_take() {
                in_flight.push_back((
                    Instant::now(),
                    worker.start_call(GET_ELEMENT, request.clone(), false),
                ));
            }
        }
        let Some((sent, call)) = in_flight.pop_front() else {
            break;
        };
        let answer = call.wait();
        shared.permits.give();
        let frames = match answer.and_then(|b| unframe(&b)) {
            Ok(x) => x,
            Err(Error::Unavailable { .. }) => {
                lost(&shared);
                ending = true;
                continue;
            }
            Err(e) => {
                let _ = shared.tx.send(Item::Element(Err(e)));
                ending = true;
                continue;
            }
        };
        for (header, body) in frames {
            if header.kind != ElementKind::UnknownTask {
                known.found();
            }
            let item = match header.kind {
                ElementKind::Element => decode(&body, header.compressed, &task.worker_address),
                ElementKind::NotReady => continue,
                ElementKind::End => {
                    ending = true;
                    continue;
                }
                ElementKind::UnknownTask => match known.no_such_task(sent) {
                    NoSuchTask::Stale => continue,
                    NoSuchTask::NotYet if started.elapsed() < shared.timeout => {
                        // The worker hears of the task at its next heartbeat, which this
                        // request hastened.
                        std::thread::sleep(not_yet_wait);
                        not_yet_wait = (not_yet_wait * 2).min(Duration::from_millis(10));
                        continue;
                    }
                    NoSuchTask::NotYet | NoSuchTask::Dropped => {
                        lost(&shared);
                        ending = true;
                        continue;
                    }
                },
                ElementKind::ElementError(msg) => Err(remote(&task.worker_address, msg)),
                ElementKind::TaskError(msg) => {
                    // Every request in flight tells the same: pass it on once.
                    let _ = shared
                        .tx
                        .send(Item::Element(Err(remote(&task.worker_address, msg))));
                    break 'reading;
                }
            };
            if item.is_ok() {
                shared.stats.with(|s| {
                    s.elements += 1;
                    let t = s.tasks.entry(task.task_id).or_default();
                    t.elements += 1;
                    t.source_read = t.source_read.max(header.source_read);
                });
            }
            if shared.tx.send(Item::Element(item)).is_err() {
                break 'reading;
            }
        }
    }
    drain(&mut in_flight, &shared.permits);
}

/// Whether a worker knows a reader's task, from its answers: several requests are in
/// flight at once and the worker serves them on threads of their own, so one sent earlier
/// may find the task while one sent later, looked up a moment sooner, did not.
#[derive(Default)]
struct TaskKnown {
    /// When the reader first got an answer for the task.
    since: Option<Instant>,
}

/// What a worker's "no such task" means ([`TaskKnown::no_such_task`]).
#[derive(Debug, PartialEq)]
enum NoSuchTask {
    /// The worker has not heard of the task yet (from the dispatcher, at its next
    /// heartbeat): ask again.
    NotYet,
    /// The request was sent before the worker's first answer for the task arrived: an
    /// answer overtaken by that one, meaning nothing now.
    Stale,
    /// Sent after the worker had answered for the task: it dropped the task (it restarted,
    /// or the dispatcher gave the task up).
    Dropped,
}

impl TaskKnown {
    /// An answer for the task arrived.
    fn found(&mut self) {
        self.since.get_or_insert_with(Instant::now);
    }

    /// What "no such task" means for a request sent at `sent`.
    fn no_such_task(&self, sent: Instant) -> NoSuchTask {
        match self.since {
            None => NoSuchTask::NotYet,
            Some(since) if sent <= since => NoSuchTask::Stale,
            Some(_) => NoSuchTask::Dropped,
        }
    }
}

/// Waits out the requests still in flight (each answers within the worker's wait).
fn drain(in_flight: &mut VecDeque<(Instant, ferroflow_cluster::PendingCall)>, permits: &Permits) {
    for (_, call) in in_flight.drain(..) {
        let _ = call.wait();
        permits.give();
    }
}

fn remote(worker: &str, msg: String) -> Error {
    Error::Remote {
        op: "tf.data GetElement".into(),
        peer: format!("tf.data worker {worker}"),
        msg,
    }
}

fn decode<T: Structure>(body: &Bytes, compressed: bool, worker: &str) -> Result<T> {
    let what = format!("an element from tf.data worker {worker}");
    if compressed {
        let raw = snap::raw::Decoder::new()
            .decompress_vec(body)
            .map_err(|e| Error::format(what.clone(), format!("bad snappy data: {e}")))?;
        decode_element(&raw, &what)
    } else {
        decode_element(body, &what)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn no_such_task_is_a_drop_only_for_a_request_sent_after_the_task_was_found() {
        let mut known = TaskKnown::default();
        let early = Instant::now();
        assert_eq!(known.no_such_task(early), NoSuchTask::NotYet);
        std::thread::sleep(Duration::from_millis(2));
        known.found();
        // An earlier request answered after the one that found the task.
        assert_eq!(known.no_such_task(early), NoSuchTask::Stale);
        std::thread::sleep(Duration::from_millis(2));
        known.found();
        assert_eq!(known.no_such_task(early), NoSuchTask::Stale);
        assert_eq!(known.no_such_task(Instant::now()), NoSuchTask::Dropped);
    }
}
