//! The dispatcher: registered datasets, jobs, the tasks that run them on workers, the splits
//! of distributed epochs, worker liveness, and (fault-tolerant mode) a journal of it all.

use ferroflow_cluster::TaskServer;
use ferroflow_tensor::{Error, Result};
use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;
use std::io::Write;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Condvar, Mutex};
use std::time::{Duration, Instant};

use super::protocol::*;
use super::{Compression, ProcessingMode};

/// A [`DispatchServer`]'s settings (TF's `tf.data.experimental.service.DispatcherConfig`).
///
/// ```
/// use ferroflow_data::service::DispatcherConfig;
/// let config = DispatcherConfig { port: 5050, ..Default::default() };
/// assert_eq!(config.bind_address, "127.0.0.1");
/// assert!(!config.fault_tolerant_mode);
/// ```
#[derive(Clone, Debug)]
pub struct DispatcherConfig {
    /// The port to listen on; 0 lets the OS pick one ([`DispatchServer::target`] tells it).
    pub port: u16,
    /// The interface to listen on: loopback by default; `0.0.0.0` for other machines.
    pub bind_address: String,
    /// Where the journal lives (with `fault_tolerant_mode`).
    pub work_dir: Option<PathBuf>,
    /// Journal every change of state to `work_dir` (each record `fsync`ed before it is
    /// acted on) and, started again on the same `work_dir`, resume the jobs. Without it a
    /// restarted dispatcher knows no job, and their consumers get an error saying so.
    pub fault_tolerant_mode: bool,
    /// A worker silent this long is taken for dead: its running tasks are lost.
    pub worker_timeout: Duration,
    /// The cluster token workers and consumers must send (default: `FERROFLOW_CLUSTER_TOKEN`).
    pub token: Option<String>,
}

impl Default for DispatcherConfig {
    fn default() -> Self {
        DispatcherConfig {
            port: 0,
            bind_address: "127.0.0.1".into(),
            work_dir: None,
            fault_tolerant_mode: false,
            worker_timeout: Duration::from_secs(2),
            token: ferroflow_cluster::token_from_env(),
        }
    }
}

/// One change of the dispatcher's state, as journaled.
#[derive(Clone, Debug, Serialize, Deserialize)]
enum Record {
    Dataset {
        id: u64,
        def: DatasetDef,
    },
    Job {
        id: u64,
        dataset_id: u64,
        mode: ProcessingMode,
        name: Option<String>,
        compression: Compression,
    },
    Task {
        id: u64,
        job_id: u64,
        worker: String,
    },
    TaskFinished {
        id: u64,
    },
    WorkerLost {
        address: String,
    },
    Split {
        job_id: u64,
        task_id: u64,
        start: u64,
        end: u64,
        num_elements: u64,
    },
}

struct Job {
    dataset_id: u64,
    mode: ProcessingMode,
    name: Option<String>,
    compression: Compression,
    tasks: Vec<u64>,
    /// Distributed epochs: the source's size (told by the first worker) and the next index
    /// to hand out.
    num_elements: Option<u64>,
    next_split: u64,
}

struct Task {
    job_id: u64,
    worker: String,
    state: TaskState,
    /// The splits handed to this task, in order: a worker that asks again for one it was
    /// given (its reply lost with a dispatcher that died) gets the same one.
    splits: Vec<(u64, u64)>,
}

impl Task {
    /// Source elements of the splits handed to this task.
    fn split_elements(&self) -> u64 {
        self.splits
            .iter()
            .map(|(start, end)| end.saturating_sub(*start))
            .sum()
    }
}

struct Worker {
    last_seen: Instant,
    alive: bool,
    /// The process behind the address (`None`: not heard from since a journal replay).
    incarnation: Option<u64>,
}

#[derive(Default)]
struct State {
    datasets: BTreeMap<u64, DatasetDef>,
    jobs: BTreeMap<u64, Job>,
    tasks: BTreeMap<u64, Task>,
    workers: BTreeMap<String, Worker>,
    next_id: u64,
}

impl State {
    fn fresh_id(&mut self) -> u64 {
        self.next_id += 1;
        self.next_id
    }

    /// Applies one record (when it happens, and again when the journal is replayed).
    fn apply(&mut self, record: &Record) {
        match record.clone() {
            Record::Dataset { id, def } => {
                self.datasets.insert(id, def);
                self.next_id = self.next_id.max(id);
            }
            Record::Job {
                id,
                dataset_id,
                mode,
                name,
                compression,
            } => {
                self.jobs.insert(
                    id,
                    Job {
                        dataset_id,
                        mode,
                        name,
                        compression,
                        tasks: vec![],
                        num_elements: None,
                        next_split: 0,
                    },
                );
                self.next_id = self.next_id.max(id);
            }
            Record::Task { id, job_id, worker } => {
                if let Some(job) = self.jobs.get_mut(&job_id) {
                    job.tasks.push(id);
                }
                self.workers.entry(worker.clone()).or_insert(Worker {
                    last_seen: Instant::now(),
                    alive: true,
                    incarnation: None,
                });
                self.tasks.insert(
                    id,
                    Task {
                        job_id,
                        worker,
                        state: TaskState::Running,
                        splits: vec![],
                    },
                );
                self.next_id = self.next_id.max(id);
            }
            Record::TaskFinished { id } => {
                if let Some(t) = self.tasks.get_mut(&id) {
                    if t.state == TaskState::Running {
                        t.state = TaskState::Finished;
                    }
                }
            }
            Record::WorkerLost { address } => {
                if let Some(w) = self.workers.get_mut(&address) {
                    w.alive = false;
                }
                for t in self.tasks.values_mut() {
                    if t.worker == address && t.state == TaskState::Running {
                        t.state = TaskState::Lost;
                    }
                }
            }
            Record::Split {
                job_id,
                task_id,
                start,
                end,
                num_elements,
            } => {
                if let Some(job) = self.jobs.get_mut(&job_id) {
                    job.num_elements = Some(num_elements);
                    job.next_split = job.next_split.max(end);
                    if let Some(t) = self.tasks.get_mut(&task_id) {
                        t.splits.push((start, end));
                    }
                }
            }
        }
    }

    fn job_finished(&self, job: &Job) -> bool {
        let states: Vec<TaskState> = job
            .tasks
            .iter()
            .filter_map(|t| self.tasks.get(t).map(|t| t.state))
            .collect();
        !states.is_empty()
            && states.iter().all(|s| *s != TaskState::Running)
            && (job.mode == ProcessingMode::ParallelEpochs
                || job.num_elements.is_some_and(|n| job.next_split >= n)
                || states.contains(&TaskState::Finished))
    }
}

/// The journal: one line per record, `crc32c-in-hex json`, appended and `fsync`ed.
struct Journal {
    file: std::fs::File,
    path: PathBuf,
}

impl Journal {
    /// Opens (or creates) the journal in `dir`, returning the records already in it. A torn
    /// last line (a record whose write a crash cut short: never acted on) is dropped.
    fn open(dir: &Path) -> Result<(Journal, Vec<Record>)> {
        std::fs::create_dir_all(dir).map_err(|e| Error::io(dir, &e))?;
        let path = dir.join("dispatcher.journal");
        let text = match std::fs::read(&path) {
            Ok(b) => b,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => vec![],
            Err(e) => return Err(Error::io(&path, &e)),
        };
        let mut records = vec![];
        let mut good_len = 0usize;
        let mut pos = 0usize;
        while pos < text.len() {
            let Some(nl) = text[pos..].iter().position(|&b| b == b'\n') else {
                break; // torn: no newline
            };
            let line = &text[pos..pos + nl];
            let parsed = std::str::from_utf8(line).ok().and_then(|l| {
                let (crc, json) = l.split_once(' ')?;
                let crc = u32::from_str_radix(crc, 16).ok()?;
                (crc32c::crc32c(json.as_bytes()) == crc)
                    .then(|| serde_json::from_str::<Record>(json).ok())?
            });
            match parsed {
                Some(r) => records.push(r),
                None if pos + nl + 1 == text.len() => break, // a torn last line
                None => {
                    return Err(Error::format(
                        path.display().to_string(),
                        format!("the dispatcher's journal is corrupt at byte {pos}"),
                    ))
                }
            }
            pos += nl + 1;
            good_len = pos;
        }
        let file = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(&path)
            .map_err(|e| Error::io(&path, &e))?;
        if good_len < text.len() {
            file.set_len(good_len as u64)
                .map_err(|e| Error::io(&path, &e))?;
        }
        ferroflow_tensor::fs::sync_dir(dir)?;
        Ok((Journal { file, path }, records))
    }

    fn append(&mut self, record: &Record) -> Result<()> {
        let json = serde_json::to_string(record).unwrap_or_default();
        let line = format!("{:08x} {json}\n", crc32c::crc32c(json.as_bytes()));
        self.file
            .write_all(line.as_bytes())
            .and_then(|_| self.file.sync_data())
            .map_err(|e| Error::io(&self.path, &e))
    }
}

struct Dispatcher {
    state: Mutex<State>,
    journal: Mutex<Option<Journal>>,
    worker_timeout: Duration,
}

fn invalid(msg: String) -> Error {
    Error::invalid("tf.data dispatcher", msg)
}

impl Dispatcher {
    /// Journals `record` (fault-tolerant mode), then applies it.
    fn commit(&self, state: &mut State, record: Record) -> Result<()> {
        if let Some(j) = self
            .journal
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .as_mut()
        {
            j.append(&record)?;
        }
        state.apply(&record);
        Ok(())
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Marks the workers silent for longer than the timeout as lost.
    fn sweep(&self, state: &mut State) -> Result<()> {
        let now = Instant::now();
        let dead: Vec<String> = state
            .workers
            .iter()
            .filter(|(_, w)| w.alive && now.duration_since(w.last_seen) > self.worker_timeout)
            .map(|(a, _)| a.clone())
            .collect();
        for address in dead {
            self.commit(state, Record::WorkerLost { address })?;
        }
        Ok(())
    }

    fn register_dataset(&self, def: DatasetDef) -> Result<RegisterDatasetReply> {
        let mut s = self.lock();
        if let Some((&id, _)) = s.datasets.iter().find(|(_, d)| **d == def) {
            return Ok(RegisterDatasetReply { dataset_id: id });
        }
        let id = s.fresh_id();
        self.commit(&mut s, Record::Dataset { id, def })?;
        Ok(RegisterDatasetReply { dataset_id: id })
    }

    fn dataset(&self, r: GetDatasetRequest) -> Result<DatasetDef> {
        self.lock()
            .datasets
            .get(&r.dataset_id)
            .cloned()
            .ok_or_else(|| invalid(format!("no dataset with id {}", r.dataset_id)))
    }

    fn create_job(&self, r: CreateJobRequest) -> Result<CreateJobReply> {
        let mut s = self.lock();
        self.sweep(&mut s)?;
        if !s.datasets.contains_key(&r.dataset_id) {
            return Err(invalid(format!("no dataset with id {}", r.dataset_id)));
        }
        if let Some(name) = &r.job_name {
            let shared = s
                .jobs
                .iter()
                .find(|(_, j)| j.name.as_ref() == Some(name) && !s.job_finished(j));
            if let Some((&id, job)) = shared {
                if job.dataset_id != r.dataset_id || job.mode != r.mode {
                    return Err(invalid(format!(
                        "job {name:?} exists for dataset {} in mode {:?}; this consumer asks \
                         for dataset {} in mode {:?}",
                        job.dataset_id, job.mode, r.dataset_id, r.mode
                    )));
                }
                return Ok(CreateJobReply { job_id: id });
            }
        }
        let id = s.fresh_id();
        self.commit(
            &mut s,
            Record::Job {
                id,
                dataset_id: r.dataset_id,
                mode: r.mode,
                name: r.job_name,
                compression: r.compression,
            },
        )?;
        let live: Vec<String> = s
            .workers
            .iter()
            .filter(|(_, w)| w.alive)
            .map(|(a, _)| a.clone())
            .collect();
        for worker in live {
            let task = s.fresh_id();
            self.commit(
                &mut s,
                Record::Task {
                    id: task,
                    job_id: id,
                    worker,
                },
            )?;
        }
        Ok(CreateJobReply { job_id: id })
    }

    fn client_heartbeat(&self, r: ClientHeartbeatRequest) -> Result<ClientHeartbeatReply> {
        let mut s = self.lock();
        self.sweep(&mut s)?;
        let job = s.jobs.get(&r.job_id).ok_or_else(|| {
            invalid(format!(
                "no job {} at this dispatcher: it was restarted without fault_tolerant_mode \
                 and a work_dir, and lost its jobs",
                r.job_id
            ))
        })?;
        let tasks = job
            .tasks
            .iter()
            .filter_map(|id| {
                s.tasks.get(id).map(|t| TaskInfo {
                    task_id: *id,
                    worker_address: t.worker.clone(),
                    state: t.state,
                    split_elements: t.split_elements(),
                })
            })
            .collect();
        Ok(ClientHeartbeatReply {
            tasks,
            finished: s.job_finished(job),
            live_workers: s.workers.values().filter(|w| w.alive).count(),
        })
    }

    fn worker_heartbeat(&self, r: WorkerHeartbeatRequest) -> Result<WorkerHeartbeatReply> {
        let mut s = self.lock();
        let address = r.worker_address;
        // A worker restarted at the same address before the timeout noticed: what the
        // earlier process ran is lost (its consumers stop reading it; the new one joins).
        let restarted = s
            .workers
            .get(&address)
            .and_then(|w| w.incarnation)
            .is_some_and(|known| known != r.incarnation);
        if restarted {
            self.commit(
                &mut s,
                Record::WorkerLost {
                    address: address.clone(),
                },
            )?;
        }
        let w = s.workers.entry(address.clone()).or_insert(Worker {
            last_seen: Instant::now(),
            alive: true,
            incarnation: None,
        });
        w.last_seen = Instant::now();
        w.alive = true;
        w.incarnation = Some(r.incarnation);
        self.sweep(&mut s)?;
        for id in r.finished_tasks {
            let running = s
                .tasks
                .get(&id)
                .is_some_and(|t| t.worker == address && t.state == TaskState::Running);
            if running {
                self.commit(&mut s, Record::TaskFinished { id })?;
            }
        }
        // Every unfinished job this worker has no live or finished task of gets one: a new
        // worker joins the running jobs, a restarted one comes back to them.
        let joins: Vec<u64> = s
            .jobs
            .iter()
            .filter(|(_, j)| !s.job_finished(j))
            .filter(|(_, j)| {
                !j.tasks.iter().any(|t| {
                    s.tasks
                        .get(t)
                        .is_some_and(|t| t.worker == address && t.state != TaskState::Lost)
                })
            })
            .map(|(&id, _)| id)
            .collect();
        for job_id in joins {
            let id = s.fresh_id();
            self.commit(
                &mut s,
                Record::Task {
                    id,
                    job_id,
                    worker: address.clone(),
                },
            )?;
        }
        let tasks = s
            .tasks
            .iter()
            .filter(|(_, t)| t.worker == address && t.state == TaskState::Running)
            .filter_map(|(&task_id, t)| {
                let job = s.jobs.get(&t.job_id)?;
                Some(TaskDef {
                    task_id,
                    job_id: t.job_id,
                    dataset: s.datasets.get(&job.dataset_id)?.clone(),
                    mode: job.mode,
                    compression: job.compression,
                })
            })
            .collect();
        Ok(WorkerHeartbeatReply { tasks })
    }

    fn get_split(&self, r: GetSplitRequest) -> Result<GetSplitReply> {
        let mut s = self.lock();
        let job = s
            .jobs
            .get(&r.job_id)
            .ok_or_else(|| invalid(format!("no job {}", r.job_id)))?;
        if job.mode != ProcessingMode::DistributedEpoch {
            return Err(invalid(format!(
                "job {} is not a distributed epoch: it has no splits",
                r.job_id
            )));
        }
        if let Some(n) = job.num_elements.filter(|&n| n != r.num_elements) {
            return Err(invalid(format!(
                "the workers disagree on the size of job {}'s source: {n} and {} elements \
                 (do they read the same files?)",
                r.job_id, r.num_elements
            )));
        }
        let given = match s.tasks.get(&r.task_id) {
            Some(t) if t.state == TaskState::Running => t.splits.len() as u64,
            _ => {
                return Err(invalid(format!(
                    "task {} is not running (its worker was taken for dead)",
                    r.task_id
                )))
            }
        };
        // Asked again (the reply was lost): the same split.
        if r.split_index < given {
            let split = s
                .tasks
                .get(&r.task_id)
                .map(|t| t.splits[r.split_index as usize]);
            return Ok(GetSplitReply { split });
        }
        if r.split_index > given {
            return Err(invalid(format!(
                "task {} asks for its split {} but was given {given}",
                r.task_id, r.split_index
            )));
        }
        let n = r.num_elements;
        let start = job.next_split;
        if start >= n {
            return Ok(GetSplitReply { split: None });
        }
        let end = (start + split_size(n, r.want)).min(n);
        self.commit(
            &mut s,
            Record::Split {
                job_id: r.job_id,
                task_id: r.task_id,
                start,
                end,
                num_elements: n,
            },
        )?;
        Ok(GetSplitReply {
            split: Some((start, end)),
        })
    }
}

/// Source elements per split of a source of `n`: about 256 splits per pass (a dead worker
/// loses at most the few it holds), at most 4096 elements each, unless the worker `want`s
/// more (its pipeline reads them quickly: a split per few milliseconds of reading); never
/// more than a sixteenth of the pass, so the workers still share its end.
fn split_size(n: u64, want: u64) -> u64 {
    let base = n.div_ceil(256).clamp(1, 4096);
    want.min(n.div_ceil(16)).max(base)
}

/// The tf.data service's dispatcher (TF's `tf.data.experimental.service.DispatchServer`):
/// registers datasets, creates jobs and hands their tasks to workers, splits distributed
/// epochs, notices dead workers. Serves on the cluster layer's gRPC server.
///
/// ```
/// use ferroflow_data::service::{DispatchServer, DispatcherConfig};
/// let mut dispatcher = DispatchServer::new(DispatcherConfig::default());
/// dispatcher.start()?;
/// assert!(dispatcher.target().starts_with("grpc://127.0.0.1:"));
/// dispatcher.stop();
/// # Ok::<(), ferroflow_tensor::Error>(())
/// ```
pub struct DispatchServer {
    config: DispatcherConfig,
    running: Option<Running>,
    stopped: Arc<(Mutex<bool>, Condvar)>,
}

struct Running {
    server: TaskServer,
    sweeper: std::thread::JoinHandle<()>,
    stop_sweeper: Arc<std::sync::atomic::AtomicBool>,
}

impl DispatchServer {
    /// A dispatcher with `config`, not yet serving ([`start`](Self::start)).
    pub fn new(config: DispatcherConfig) -> DispatchServer {
        DispatchServer {
            config,
            running: None,
            stopped: Arc::new((Mutex::new(false), Condvar::new())),
        }
    }

    /// Starts serving (replaying the journal first in fault-tolerant mode). An error when
    /// the port is taken, when `fault_tolerant_mode` has no `work_dir`, or when the journal
    /// cannot be read.
    pub fn start(&mut self) -> Result<()> {
        if self.running.is_some() {
            return Ok(());
        }
        let (journal, state) = match (&self.config.work_dir, self.config.fault_tolerant_mode) {
            (Some(dir), true) => {
                let (journal, records) = Journal::open(dir)?;
                let mut state = State::default();
                records.iter().for_each(|r| state.apply(r));
                (Some(journal), state)
            }
            (None, true) => {
                return Err(invalid(
                    "fault_tolerant_mode needs a work_dir to journal to".into(),
                ))
            }
            _ => (None, State::default()),
        };
        let dispatcher = Arc::new(Dispatcher {
            state: Mutex::new(state),
            journal: Mutex::new(journal),
            worker_timeout: self.config.worker_timeout,
        });
        let address = format!("{}:{}", self.config.bind_address, self.config.port);
        // Bound now, serving once its methods are there (a restarted dispatcher is called at
        // once by the workers and consumers that were retrying it).
        let server = TaskServer::bind(&address, self.config.token.as_deref())?;
        fn serve<Q, A>(
            server: &TaskServer,
            dispatcher: &Arc<Dispatcher>,
            method: &'static str,
            f: impl Fn(&Dispatcher, Q) -> Result<A> + Send + Sync + 'static,
        ) where
            Q: serde::de::DeserializeOwned,
            A: Serialize,
        {
            let d = dispatcher.clone();
            server.handle(method, move |payload| {
                let request = from_bytes(method, &payload)?;
                Ok(to_bytes(&f(&d, request)?))
            });
        }
        serve(
            &server,
            &dispatcher,
            REGISTER_DATASET,
            Dispatcher::register_dataset,
        );
        serve(&server, &dispatcher, GET_DATASET, Dispatcher::dataset);
        serve(&server, &dispatcher, CREATE_JOB, Dispatcher::create_job);
        serve(
            &server,
            &dispatcher,
            CLIENT_HEARTBEAT,
            Dispatcher::client_heartbeat,
        );
        serve(
            &server,
            &dispatcher,
            WORKER_HEARTBEAT,
            Dispatcher::worker_heartbeat,
        );
        serve(&server, &dispatcher, GET_SPLIT, Dispatcher::get_split);
        server.serve();
        let stop_sweeper = Arc::new(std::sync::atomic::AtomicBool::new(false));
        let sweeper = {
            let (d, stop) = (dispatcher.clone(), stop_sweeper.clone());
            std::thread::spawn(move || {
                while !stop.load(std::sync::atomic::Ordering::Relaxed) {
                    std::thread::sleep(Duration::from_millis(100));
                    let mut s = d.lock();
                    let _ = d.sweep(&mut s);
                }
            })
        };
        *self.stopped.0.lock().unwrap_or_else(|e| e.into_inner()) = false;
        self.running = Some(Running {
            server,
            sweeper,
            stop_sweeper,
        });
        Ok(())
    }

    /// `grpc://host:port`: what trainers pass as `service` and workers as their
    /// `dispatcher_address` (without the scheme). Empty before [`start`](Self::start).
    pub fn target(&self) -> String {
        self.running
            .as_ref()
            .map(|r| format!("grpc://{}", r.server.local_addr()))
            .unwrap_or_default()
    }

    /// A handle that ends [`join`](Self::join) from another thread.
    pub fn stop_handle(&self) -> StopHandle {
        StopHandle(self.stopped.clone())
    }

    /// Blocks while the dispatcher serves, until [`stop`](Self::stop) or a
    /// [`StopHandle`]: a dispatcher process's main loop.
    pub fn join(&self) {
        let (lock, cv) = &*self.stopped;
        let mut stopped = lock.lock().unwrap_or_else(|e| e.into_inner());
        while !*stopped && self.running.is_some() {
            stopped = cv.wait(stopped).unwrap_or_else(|e| e.into_inner());
        }
    }

    /// Stops serving (the journal stays, for a restart in fault-tolerant mode).
    pub fn stop(&mut self) {
        if let Some(r) = self.running.take() {
            r.stop_sweeper
                .store(true, std::sync::atomic::Ordering::Relaxed);
            drop(r.server);
            let _ = r.sweeper.join();
        }
        StopHandle(self.stopped.clone()).stop();
    }
}

/// Ends a server's `join` from another thread ([`DispatchServer::stop_handle`],
/// [`WorkerServer::stop_handle`](super::WorkerServer::stop_handle)); the server stops
/// serving when its owner then calls `stop` or drops it.
#[derive(Clone)]
pub struct StopHandle(pub(crate) Arc<(Mutex<bool>, Condvar)>);

impl StopHandle {
    /// Wakes the `join`.
    pub fn stop(&self) {
        *self.0 .0.lock().unwrap_or_else(|e| e.into_inner()) = true;
        self.0 .1.notify_all();
    }
}

impl Drop for DispatchServer {
    fn drop(&mut self) {
        self.stop();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_journal_replays_and_drops_a_torn_last_record() {
        let dir = tempfile::tempdir().unwrap();
        let def = DatasetDef {
            pipeline: "p".into(),
            params: "{}".into(),
            element_type: "t".into(),
        };
        {
            let (mut j, old) = Journal::open(dir.path()).unwrap();
            assert!(old.is_empty());
            j.append(&Record::Dataset { id: 1, def }).unwrap();
            j.append(&Record::TaskFinished { id: 9 }).unwrap();
        }
        let path = dir.path().join("dispatcher.journal");
        let mut f = std::fs::OpenOptions::new()
            .append(true)
            .open(&path)
            .unwrap();
        f.write_all(b"0000abcd {\"Task").unwrap();
        drop(f);
        let (mut j, records) = Journal::open(dir.path()).unwrap();
        assert_eq!(records.len(), 2);
        j.append(&Record::TaskFinished { id: 10 }).unwrap();
        let (_, records) = Journal::open(dir.path()).unwrap();
        assert_eq!(records.len(), 3);
        // A corrupt record in the middle is an error, not a silent loss.
        let text = std::fs::read_to_string(&path).unwrap();
        std::fs::write(&path, text.replacen("TaskFinished", "TaskFinishex", 1)).unwrap();
        assert!(Journal::open(dir.path()).is_err());
    }

    #[test]
    fn a_split_asked_for_again_is_the_same_split() {
        let d = Dispatcher {
            state: Mutex::default(),
            journal: Mutex::new(None),
            worker_timeout: Duration::from_secs(60),
        };
        let def = DatasetDef {
            pipeline: "p".into(),
            params: "{}".into(),
            element_type: "t".into(),
        };
        let dataset_id = d.register_dataset(def).unwrap().dataset_id;
        d.worker_heartbeat(WorkerHeartbeatRequest {
            worker_address: "w:1".into(),
            incarnation: 7,
            pipelines: vec![],
            finished_tasks: vec![],
        })
        .unwrap();
        let job_id = d
            .create_job(CreateJobRequest {
                dataset_id,
                mode: ProcessingMode::DistributedEpoch,
                job_name: None,
                compression: Compression::None,
            })
            .unwrap()
            .job_id;
        let task_id = *d.lock().tasks.keys().next().unwrap();
        let split = |split_index| {
            d.get_split(GetSplitRequest {
                job_id,
                task_id,
                num_elements: 1000,
                split_index,
                want: if split_index < 2 { 0 } else { 100 },
            })
            .map(|r| r.split)
        };
        let first = split(0).unwrap();
        assert_eq!(first, Some((0, 4)));
        assert_eq!(split(0).unwrap(), first);
        assert!(split(2).unwrap_err().to_string().contains("was given 1"));
        assert_eq!(split(1).unwrap(), Some((4, 8)));
        assert_eq!(d.lock().tasks[&task_id].split_elements(), 8);
        // A worker that reads quickly asks for more: at most a sixteenth of the source.
        assert_eq!(split(2).unwrap(), Some((8, 71)));
        // The same address from another process: its tasks are lost.
        d.worker_heartbeat(WorkerHeartbeatRequest {
            worker_address: "w:1".into(),
            incarnation: 8,
            pipelines: vec![],
            finished_tasks: vec![],
        })
        .unwrap();
        assert_eq!(d.lock().tasks[&task_id].state, TaskState::Lost);
    }

    #[test]
    fn splits_cover_the_source_once() {
        for n in [1u64, 7, 255, 256, 257, 60_000, 10_000_000] {
            let s = split_size(n, 0);
            assert!((1..=4096).contains(&s) && n.div_ceil(s) <= 256.max(n.div_ceil(4096)));
            // What a worker wants, between that and a sixteenth of the source.
            for want in [1, 100, 5000, u64::MAX] {
                let w = split_size(n, want);
                assert!(
                    w >= s && (w == s || w <= n.div_ceil(16)),
                    "n {n} want {want}: {w}"
                );
                assert!(
                    w == s || w == want || w == n.div_ceil(16),
                    "n {n} want {want}: {w}"
                );
            }
        }
        assert_eq!(split_size(60_000, 1000), 1000);
        assert_eq!(split_size(60_000, 100_000), 3750);
    }
}
