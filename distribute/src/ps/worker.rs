//! A worker of a parameter-server job: the functions it runs by name ([`Functions`]), the
//! per-worker datasets it iterates ([`WorkerContext::next`]), and the methods it serves the
//! chief's coordinator.
//!
//! | method | request (JSON) | reply (JSON) |
//! |---|---|---|
//! | `worker.hello` | — | the worker's incarnation (new each time the process starts) |
//! | `worker.run` | incarnation, function name, arguments | [`RunOutcome`] |
//! | `worker.dataset` | incarnation, dataset id, dataset function name | — |
//! | `worker.iterator` | incarnation, iterator id, dataset id | — |
//!
//! One thread owns the worker's state and runs everything, one call at a time, inside the
//! strategy's scope; the server's handlers pass it the calls. It also answers `worker.run`
//! on a direct connection (`ferroflow_cluster::DirectListener`, on Unix): the chief's
//! requests reach it without the server's runtime, and its replies leave the same way.

use super::strategy::{scope_of, ParameterServerStrategy};
use super::variables::VariablePartitioner;
use crate::input::InputContext;
use bytes::Bytes;
use ferroflow_cluster::{Reply, TaskServer};
use ferroflow_data::Dataset;
use ferroflow_tensor::distribution::take_remote_failure;
use ferroflow_tensor::{Error, Result};
use serde::de::DeserializeOwned;
use serde::{Deserialize, Serialize};
use std::any::Any;
use std::collections::HashMap;
use std::sync::mpsc;
use std::sync::{Arc, Mutex};

type StepFn<S> = Box<dyn Fn(&mut S, &mut WorkerContext, &str) -> Result<String> + Send>;
type DatasetFn = Arc<dyn Fn(&InputContext) -> Result<Box<dyn Fn() -> Box<dyn Any>>> + Send + Sync>;
type BuildFn<S> = Box<dyn FnOnce(&WorkerContext) -> Result<S> + Send>;

/// The functions a parameter-server job's workers run, by name, and the state they run on
/// (TF's `tf.function`s the coordinator schedules: Rust cannot ship closures, so every
/// task runs the same binary and the chief schedules functions by name with serialisable
/// arguments).
///
/// The state (a model, an optimizer, metrics) is built once per worker process, in the
/// strategy's scope, by `build`; the chief builds it with the same function first
/// ([`Functions::build_state`]) so that its variables and the workers' are the same ones
/// on the parameter servers.
///
/// ```no_run
/// use ferroflow_distribute::Functions;
/// let functions = Functions::new(|_ctx| Ok(ferroflow::Variable::new("w", ferroflow::Tensor::scalar(0.0f32)?)))
///     .function("add", |w, _ctx, x: f32| {
///         w.assign_add(&ferroflow::Tensor::scalar(x)?)?;
///         Ok(w.value().item::<f32>()?)
///     });
/// ```
pub struct Functions<S> {
    build: Option<BuildFn<S>>,
    functions: HashMap<String, StepFn<S>>,
    datasets: HashMap<String, DatasetFn>,
    pub(crate) partitioner: Option<Arc<dyn VariablePartitioner>>,
}

impl<S: 'static> Functions<S> {
    /// Functions on the state `build` makes.
    pub fn new(build: impl FnOnce(&WorkerContext) -> Result<S> + Send + 'static) -> Functions<S> {
        Functions {
            build: Some(Box::new(build)),
            functions: HashMap::new(),
            datasets: HashMap::new(),
            partitioner: None,
        }
    }

    /// Registers `f` as `name`: its arguments and result travel as JSON.
    pub fn function<A, R>(
        mut self,
        name: &str,
        f: impl Fn(&mut S, &mut WorkerContext, A) -> Result<R> + Send + 'static,
    ) -> Functions<S>
    where
        A: DeserializeOwned,
        R: Serialize,
    {
        let fname = name.to_string();
        self.functions.insert(
            name.to_string(),
            Box::new(move |state, ctx, args| {
                let a: A = serde_json::from_str(args).map_err(|e| {
                    Error::invalid(
                        "worker.run",
                        format!("the arguments of {fname:?} do not deserialize: {e}"),
                    )
                })?;
                let r = f(state, ctx, a)?;
                serde_json::to_string(&r).map_err(|e| {
                    Error::invalid("worker.run", format!("the result of {fname:?}: {e}"))
                })
            }),
        );
        self
    }

    /// Registers `make` as the dataset function `name` (TF's `dataset_fn` of
    /// `create_per_worker_dataset`): each worker calls it with its [`InputContext`].
    pub fn dataset<T: Send + 'static>(
        mut self,
        name: &str,
        make: impl Fn(&InputContext) -> Result<Dataset<T>> + Send + Sync + 'static,
    ) -> Functions<S> {
        self.datasets.insert(
            name.to_string(),
            Arc::new(move |ctx| {
                let dataset = make(ctx)?;
                Ok(Box::new(move || Box::new(dataset.iter()) as Box<dyn Any>)
                    as Box<dyn Fn() -> Box<dyn Any>>)
            }),
        );
        self
    }

    /// Shards large variables with `partitioner` (the chief's strategy must use the same).
    pub fn variable_partitioner(mut self, partitioner: Arc<dyn VariablePartitioner>) -> Self {
        self.partitioner = Some(partitioner);
        self
    }

    /// Builds the state in `strategy`'s scope: the chief does, before it schedules, so its
    /// variables are the workers' (same creation order, same keys on the ps).
    pub fn build_state(&mut self, strategy: &ParameterServerStrategy) -> Result<S> {
        let build = self.build.take().ok_or_else(|| {
            Error::invalid("Functions::build_state", "the state was already built")
        })?;
        let _scope = scope_of(strategy);
        build(&WorkerContext::new(None, strategy.worker_tasks().len()))
    }
}

/// What a running function knows of its worker: its index, and its per-worker iterators.
pub struct WorkerContext {
    worker_index: Option<usize>,
    num_workers: usize,
    iterators: HashMap<u64, Box<dyn Any>>,
}

impl WorkerContext {
    fn new(worker_index: Option<usize>, num_workers: usize) -> WorkerContext {
        WorkerContext {
            worker_index,
            num_workers,
            iterators: HashMap::new(),
        }
    }
    /// This worker's index (`None` on the chief).
    pub fn worker_index(&self) -> Option<usize> {
        self.worker_index
    }
    /// How many workers the job has.
    pub fn num_workers(&self) -> usize {
        self.num_workers
    }
    /// The next element of this worker's iterator `iterator` (TF's `next(iterator)` in a
    /// scheduled function); `Ok(None)` at its end. `T` is the dataset function's element
    /// type.
    pub fn next<T: 'static>(&mut self, iterator: &crate::PerWorkerIterator) -> Result<Option<T>> {
        let it = self.iterators.get_mut(&iterator.id).ok_or_else(|| {
            Error::invalid(
                "next",
                format!(
                    "this worker has no iterator {} (made by the coordinator's \
                     create_per_worker_dataset(..).iter())",
                    iterator.id
                ),
            )
        })?;
        let it = it
            .downcast_mut::<ferroflow_data::DatasetIter<T>>()
            .ok_or_else(|| {
                Error::invalid(
                    "next",
                    format!(
                        "iterator {}'s elements are not {}",
                        iterator.id,
                        std::any::type_name::<T>()
                    ),
                )
            })?;
        it.next().transpose()
    }
}

#[derive(Serialize, Deserialize)]
pub(crate) struct HelloReply {
    pub incarnation: u64,
    /// The port of the worker's direct connection for `worker.run` (on its server's host),
    /// if it has one.
    #[serde(default)]
    pub run_port: Option<u16>,
}

#[derive(Serialize, Deserialize)]
pub(crate) struct RunRequest {
    pub incarnation: u64,
    pub function: String,
    pub args: String,
}

/// How a scheduled function ended on a worker.
#[derive(Serialize, Deserialize, Debug)]
pub(crate) enum RunOutcome {
    /// Its result, as JSON.
    Done(String),
    /// It failed (its own error: bad arguments, an unknown name, a shape error, ...).
    Failed(String),
    /// A parameter server did not answer: the job cannot go on without it.
    PsUnavailable(String),
    /// The request was for an earlier incarnation of this worker (it restarted): the
    /// coordinator replays its datasets and sends the function again.
    Restarted,
}

#[derive(Serialize, Deserialize)]
pub(crate) struct DatasetRequest {
    pub incarnation: u64,
    pub id: u64,
    pub name: String,
}

#[derive(Serialize, Deserialize)]
pub(crate) struct IteratorRequest {
    pub incarnation: u64,
    pub id: u64,
    pub dataset: u64,
}

enum Job {
    Run(RunRequest, Reply),
    Dataset(DatasetRequest, mpsc::Sender<Result<()>>),
    Iterator(IteratorRequest, mpsc::Sender<Result<()>>),
}

/// The way into the function thread for the server's handlers: its jobs, and (on Unix) a
/// socket whose byte wakes it from `poll`, where it also waits for the chief's direct
/// requests.
struct Jobs {
    tx: Mutex<mpsc::Sender<Job>>,
    #[cfg(unix)]
    wake: std::os::unix::net::UnixStream,
}

impl Jobs {
    fn send(&self, job: Job) -> Result<()> {
        self.tx
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .send(job)
            .map_err(|_| gone())?;
        #[cfg(unix)]
        {
            use std::io::Write;
            // The socket does not block: when it is full, the thread is awake already.
            let _ = (&self.wake).write(&[1]);
        }
        Ok(())
    }
}

/// The worker's serving state; dropping it (and the server's handlers) ends the function
/// thread.
pub(crate) struct WorkerService {
    _jobs: Arc<Jobs>,
}

fn json<T: Serialize>(v: &T) -> Result<Bytes> {
    serde_json::to_vec(v)
        .map(Bytes::from)
        .map_err(|e| Error::invalid("worker", e.to_string()))
}

fn parse<T: DeserializeOwned>(what: &'static str, b: &[u8]) -> Result<T> {
    serde_json::from_slice(b).map_err(|e| Error::invalid(what, format!("malformed request: {e}")))
}

/// What the function thread owns: the state, the functions, the datasets made.
struct FunctionThread<S> {
    incarnation: u64,
    index: usize,
    num_workers: usize,
    steps: HashMap<String, StepFn<S>>,
    datasets: HashMap<String, DatasetFn>,
    made: HashMap<u64, Box<dyn Fn() -> Box<dyn Any>>>,
    client: Arc<super::variables::PsClient>,
    state: S,
    ctx: WorkerContext,
}

impl<S> FunctionThread<S> {
    fn run(&mut self, req: &RunRequest) -> RunOutcome {
        if req.incarnation != self.incarnation {
            RunOutcome::Restarted
        } else {
            run_function(
                &self.steps,
                &self.client,
                &mut self.state,
                &mut self.ctx,
                req,
            )
        }
    }

    /// A `worker.run` request from a direct connection, answered.
    fn run_direct(&mut self, request: Bytes) -> std::result::Result<Vec<u8>, String> {
        let req: RunRequest = parse("worker.run", &request).map_err(|e| e.to_string())?;
        serde_json::to_vec(&self.run(&req)).map_err(|e| format!("worker.run: {e}"))
    }

    fn handle(&mut self, job: Job) {
        match job {
            Job::Run(req, reply) => reply.send(json(&self.run(&req))),
            Job::Dataset(req, reply) => {
                let outcome = if req.incarnation != self.incarnation {
                    Err(Error::invalid("worker.dataset", "this worker restarted"))
                } else {
                    match self.datasets.get(&req.name) {
                        None => Err(Error::invalid(
                            "worker.dataset",
                            format!("no dataset function {:?} is registered", req.name),
                        )),
                        Some(make) => make(&InputContext {
                            num_input_pipelines: self.num_workers,
                            input_pipeline_id: self.index,
                            num_replicas_in_sync: self.num_workers,
                        })
                        .map(|m| {
                            self.made.insert(req.id, m);
                        }),
                    }
                };
                let _ = reply.send(outcome);
            }
            Job::Iterator(req, reply) => {
                let outcome = if req.incarnation != self.incarnation {
                    Err(Error::invalid("worker.iterator", "this worker restarted"))
                } else {
                    match self.made.get(&req.dataset) {
                        None => Err(Error::invalid(
                            "worker.iterator",
                            format!("this worker has no dataset {}", req.dataset),
                        )),
                        Some(m) => {
                            self.ctx.iterators.insert(req.id, m());
                            Ok(())
                        }
                    }
                };
                let _ = reply.send(outcome);
            }
        }
    }

    /// Runs jobs from the server's handlers and requests from the chief's direct
    /// connections, one at a time, until the handlers are gone.
    #[cfg(unix)]
    fn serve(
        mut self,
        inbox: mpsc::Receiver<Job>,
        mut wake: std::os::unix::net::UnixStream,
        listener: ferroflow_cluster::DirectListener,
    ) {
        use std::io::Read;
        use std::os::fd::AsRawFd;
        let pollfd = ferroflow_cluster::readable;
        let mut connections: Vec<ferroflow_cluster::DirectConnection> = vec![];
        let mut fds = vec![];
        let window = ferroflow_cluster::busy_poll_window();
        let mut busy_until = std::time::Instant::now();
        loop {
            loop {
                match inbox.try_recv() {
                    Ok(job) => {
                        self.handle(job);
                        busy_until = std::time::Instant::now() + window;
                    }
                    Err(mpsc::TryRecvError::Empty) => break,
                    Err(mpsc::TryRecvError::Disconnected) => return,
                }
            }
            fds.clear();
            fds.push(pollfd(wake.as_raw_fd()));
            fds.push(pollfd(listener.as_raw_fd()));
            fds.extend(connections.iter().map(|c| pollfd(c.as_raw_fd())));
            // Poll a while after answering before sleeping (the next request of a tight
            // loop comes within a round trip; see `busy_poll_window`).
            match ferroflow_cluster::poll_readable(&mut fds, busy_until, None) {
                Ok(0) => continue, // interrupted
                Ok(_) => {}
                Err(_) => {
                    // Not expected of poll on live descriptors; do not spin on it.
                    std::thread::sleep(std::time::Duration::from_millis(10));
                    continue;
                }
            }
            if fds[0].revents != 0 {
                let mut bytes = [0u8; 64];
                loop {
                    match wake.read(&mut bytes) {
                        // Every sender is gone: run what they sent, then end.
                        Ok(0) => {
                            while let Ok(job) = inbox.try_recv() {
                                self.handle(job);
                            }
                            return;
                        }
                        Ok(_) => {}
                        Err(_) => break,
                    }
                }
            }
            let mut open = Vec::with_capacity(connections.len() + 1);
            for (c, fd) in connections.drain(..).zip(&fds[2..]) {
                let mut c = c;
                if fd.revents == 0 {
                    open.push(c);
                    continue;
                }
                if matches!(c.serve_readable(&mut |r| self.run_direct(r)), Ok(true)) {
                    open.push(c);
                }
                busy_until = std::time::Instant::now() + window;
            }
            connections = open;
            if fds[1].revents != 0 {
                loop {
                    match listener.accept() {
                        Ok(Some(c)) => connections.push(c),
                        Ok(None) => break,
                        Err(_) => {
                            // Out of descriptors, or the like: the listener stays
                            // readable, so do not spin on it.
                            std::thread::sleep(std::time::Duration::from_millis(10));
                            break;
                        }
                    }
                }
            }
        }
    }
}

/// Starts the worker's function thread (building the state) and serves the worker methods
/// on `server`: `worker.run` also on a direct connection (on Unix), whose port `worker.hello`
/// tells the chief.
pub(crate) fn serve_worker<S: 'static>(
    server: &TaskServer,
    strategy: ParameterServerStrategy,
    index: usize,
    mut functions: Functions<S>,
) -> Result<WorkerService> {
    let incarnation = {
        use std::hash::{BuildHasher, Hasher};
        let mut h = std::collections::hash_map::RandomState::new().build_hasher();
        h.write_u32(std::process::id());
        h.write_u128(
            std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .map_or(0, |d| d.as_nanos()),
        );
        h.finish()
    };
    let num_workers = strategy.worker_tasks().len();
    let build = functions
        .build
        .take()
        .ok_or_else(|| Error::invalid("Server::run_worker", "the state was already built"))?;
    let steps = std::mem::take(&mut functions.functions);
    let datasets = std::mem::take(&mut functions.datasets);
    let (tx, inbox) = mpsc::channel::<Job>();
    #[cfg(unix)]
    let (jobs, wake, listener) = {
        let (wake_tx, wake) = std::os::unix::net::UnixStream::pair()
            .and_then(|(a, b)| {
                a.set_nonblocking(true)?;
                b.set_nonblocking(true)?;
                Ok((a, b))
            })
            .map_err(|e| Error::io("making the worker's wake-up socket", &e))?;
        let jobs = Jobs {
            tx: Mutex::new(tx),
            wake: wake_tx,
        };
        (jobs, wake, server.direct_listener()?)
    };
    #[cfg(not(unix))]
    let jobs = Jobs { tx: Mutex::new(tx) };
    #[cfg(unix)]
    let run_port = Some(listener.port());
    #[cfg(not(unix))]
    let run_port = None;
    let (built_tx, built_rx) = mpsc::channel::<Result<()>>();
    let client = strategy.inner.client.clone();
    std::thread::Builder::new()
        .name("ps-worker-functions".into())
        .spawn(move || {
            let _scope = scope_of(&strategy);
            let ctx = WorkerContext::new(Some(index), num_workers);
            let state = match build(&ctx) {
                Ok(s) => {
                    let _ = built_tx.send(Ok(()));
                    s
                }
                Err(e) => {
                    let _ = built_tx.send(Err(e));
                    return;
                }
            };
            let thread = FunctionThread {
                incarnation,
                index,
                num_workers,
                steps,
                datasets,
                made: HashMap::new(),
                client,
                state,
                ctx,
            };
            #[cfg(unix)]
            thread.serve(inbox, wake, listener);
            #[cfg(not(unix))]
            {
                let mut thread = thread;
                for job in inbox {
                    thread.handle(job);
                }
            }
        })
        .map_err(|e| Error::io("starting the worker's function thread", &e))?;
    built_rx.recv().map_err(|_| {
        Error::invalid(
            "Server::run_worker",
            "the function thread ended while building the state",
        )
    })??;
    let jobs = Arc::new(jobs);
    server.handle("worker.hello", move |_| {
        json(&HelloReply {
            incarnation,
            run_port,
        })
    });
    let j = jobs.clone();
    // The function thread answers the chief's run requests itself.
    server.handle_deferred("worker.run", move |b, reply| {
        match parse::<RunRequest>("worker.run", &b) {
            Ok(req) => {
                // A send fails only when the function thread has ended; the reply dropped
                // with the job tells the chief so.
                let _ = j.send(Job::Run(req, reply));
            }
            Err(e) => reply.send(Err(e)),
        }
    });
    let j = jobs.clone();
    server.handle("worker.dataset", move |b| {
        let req: DatasetRequest = parse("worker.dataset", &b)?;
        let (tx, rx) = mpsc::channel();
        j.send(Job::Dataset(req, tx))?;
        rx.recv().map_err(|_| gone())??;
        Ok(Bytes::new())
    });
    let j = jobs.clone();
    server.handle("worker.iterator", move |b| {
        let req: IteratorRequest = parse("worker.iterator", &b)?;
        let (tx, rx) = mpsc::channel();
        j.send(Job::Iterator(req, tx))?;
        rx.recv().map_err(|_| gone())??;
        Ok(Bytes::new())
    });
    Ok(WorkerService { _jobs: jobs })
}

fn gone() -> Error {
    Error::invalid("worker", "the worker's function thread has ended")
}

fn run_function<S>(
    steps: &HashMap<String, StepFn<S>>,
    client: &super::variables::PsClient,
    state: &mut S,
    ctx: &mut WorkerContext,
    req: &RunRequest,
) -> RunOutcome {
    let Some(f) = steps.get(&req.function) else {
        let mut names: Vec<&String> = steps.keys().collect();
        names.sort();
        return RunOutcome::Failed(format!(
            "no function {:?} is registered on this worker (registered: {names:?})",
            req.function
        ));
    };
    let _ = take_remote_failure();
    client.begin_function();
    let result = f(state, ctx, &req.args);
    let ended = client.end_function();
    let failure = take_remote_failure();
    let ps_error = [
        result.as_ref().err(),
        ended.as_ref().err(),
        failure.as_ref(),
    ]
    .into_iter()
    .flatten()
    .find(|e| matches!(e, Error::Unavailable { .. }))
    .map(|e| e.to_string());
    if let Some(msg) = ps_error {
        return RunOutcome::PsUnavailable(msg);
    }
    match (result, ended, failure) {
        (Ok(r), Ok(()), None) => RunOutcome::Done(r),
        (Err(e), _, _) | (_, Err(e), _) | (_, _, Some(e)) => RunOutcome::Failed(e.to_string()),
    }
}
