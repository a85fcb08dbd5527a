//! [`ClusterCoordinator`] (TF's `tf.distribute.experimental.coordinator.ClusterCoordinator`):
//! the chief's queue of scheduled functions, one thread per worker that takes them off it,
//! and what happens when a worker or a parameter server goes away.
//!
//! Each worker's thread checks that its worker answers (`worker.hello`), brings it up to
//! date (the per-worker datasets and iterators created so far, again after the worker
//! restarted), then runs closures one at a time. A closure whose worker stops answering
//! goes back to the front of the queue for any worker (at-least-once: it may have run
//! before its worker died); the thread then waits for its worker to come back. A closure
//! that fails, or finds a parameter server gone, is an error for its [`RemoteValue`] and
//! for the next `schedule`, `join` or `done`.
//!
//! Closures go to a worker on its direct connection when it has one (the port its
//! `worker.hello` names; `ferroflow_cluster::DirectClient`): the request is written by the
//! thread that sends it and read by the worker's function thread, and the reply comes back
//! the same way, without the gRPC runtimes' thread hand-offs: an empty function's round
//! trip is then close to a bare TCP round trip between the two processes (BENCHMARKS.md,
//! "Scheduled functions on a direct connection"). While it waits for a reply there, the worker's
//! thread asks the worker's server every keepalive interval whether the worker is still
//! the same process: a hung worker is given up as the gRPC path's pings give it up. A
//! worker whose direct port cannot be reached is served over gRPC.

use super::strategy::ParameterServerStrategy;
use super::worker::{DatasetRequest, HelloReply, IteratorRequest, RunOutcome, RunRequest};
use bytes::Bytes;
use ferroflow_cluster::{DirectClient, Peer, Pending, TaskServer};
use ferroflow_tensor::{Error, Result};
use serde::de::DeserializeOwned;
use serde::{Deserialize, Serialize};
use std::collections::VecDeque;
use std::marker::PhantomData;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Condvar, Mutex};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

/// How long a scheduled function may run on a worker before the coordinator gives up on
/// the worker (`FERROFLOW_FUNCTION_TIMEOUT` seconds; 600 by default). A worker that dies
/// is noticed at once: its connection closes; one that hangs or whose host vanishes, when
/// the connection's keepalive pings go unanswered (`FERROFLOW_KEEPALIVE_SECONDS`, 10 s).
fn function_timeout() -> Duration {
    ferroflow_cluster::seconds_from_env("FERROFLOW_FUNCTION_TIMEOUT", Duration::from_secs(600))
}

/// How many closures the coordinator keeps sent to one worker at a time: the worker runs
/// them one after another, so with two the next one is there when the last one ends
/// instead of a round trip later.
const CLOSURES_IN_FLIGHT: usize = 2;

struct Closure {
    function: String,
    args: String,
    result: Arc<Slot>,
    /// How many times it was sent to a worker.
    attempts: AtomicUsize,
}

#[derive(Default)]
struct Slot {
    value: Mutex<Option<Result<String>>>,
    ready: Condvar,
    /// `value` is set (read without the lock by a `fetch` that polls, and `is_ready`).
    set: AtomicBool,
}

impl Slot {
    /// Delivers the closure's outcome; the first one stays (a closure run again after its
    /// worker was lost may be answered twice).
    fn set(&self, v: Result<String>) {
        let mut value = self.value.lock().unwrap_or_else(|e| e.into_inner());
        if value.is_none() {
            *value = Some(v);
            self.set.store(true, Ordering::Release);
            self.ready.notify_all();
        }
    }
}

/// The result of a scheduled function (TF's `RemoteValue`).
pub struct RemoteValue<T> {
    slot: Arc<Slot>,
    _t: PhantomData<fn() -> T>,
}

impl<T: DeserializeOwned> RemoteValue<T> {
    /// Waits for the function and returns its result, or its error. A result is here the
    /// moment the worker's reply arrives; [`ClusterCoordinator::done`] and
    /// [`ClusterCoordinator::join`] count the closure as finished a moment later.
    pub fn fetch(&self) -> Result<T> {
        // Poll a while before sleeping: a quick function's result comes within a round
        // trip, and a thread woken from sleep costs more than that on a VM
        // (`ferroflow_cluster::busy_poll_window`).
        let until = Instant::now() + ferroflow_cluster::busy_poll_window();
        ferroflow_cluster::busy_wait(until, || {
            self.slot.set.load(Ordering::Acquire).then_some(())
        });
        let mut v = self.slot.value.lock().unwrap_or_else(|e| e.into_inner());
        let outcome = loop {
            match v.as_ref() {
                Some(outcome) => break outcome,
                None => v = self.slot.ready.wait(v).unwrap_or_else(|e| e.into_inner()),
            }
        };
        match outcome {
            Ok(json) => serde_json::from_str(json).map_err(|e| {
                Error::invalid(
                    "RemoteValue::fetch",
                    format!(
                        "the result does not deserialize as {}: {e}",
                        std::any::type_name::<T>()
                    ),
                )
            }),
            Err(e) => Err(e.clone()),
        }
    }
    /// Whether the function has finished.
    pub fn is_ready(&self) -> bool {
        self.slot.set.load(Ordering::Acquire)
    }
}

/// A dataset every worker makes with the registered dataset function
/// (`create_per_worker_dataset`).
pub struct PerWorkerDataset {
    id: u64,
    coordinator: Arc<Shared>,
}

impl PerWorkerDataset {
    /// An iterator over it on every worker (`iter(per_worker_dataset)`), to pass to
    /// scheduled functions, which read it with `WorkerContext::next`.
    pub fn iter(&self) -> Result<PerWorkerIterator> {
        let id = self.coordinator.next_id.fetch_add(1, Ordering::Relaxed);
        let mut q = self.coordinator.lock();
        q.setup.push(Setup::Iterator {
            id,
            dataset: self.id,
        });
        drop(q);
        self.coordinator.wake.notify_all();
        Ok(PerWorkerIterator { id })
    }
}

/// A per-worker iterator: each worker resolves it to its own iterator (a scheduled
/// function's argument).
#[derive(Debug, Clone, Copy, Serialize, Deserialize, PartialEq, Eq)]
pub struct PerWorkerIterator {
    pub(crate) id: u64,
}

#[derive(Clone)]
enum Setup {
    Dataset { id: u64, name: String },
    Iterator { id: u64, dataset: u64 },
}

#[derive(Default)]
struct Queue {
    closures: VecDeque<Arc<Closure>>,
    in_flight: usize,
    error: Option<Error>,
    stopping: bool,
    setup: Vec<Setup>,
    scheduled: u64,
    retried: u64,
    workers_up: Vec<bool>,
    /// Per worker: its thread waits for closures with none in flight and the worker set
    /// up to date, so `schedule` may send the next one itself.
    idle: Vec<Option<IdleWorker>>,
    /// Per worker: the closure `schedule` sent it, for its thread to take over.
    handed: Vec<Option<SentClosure>>,
}

/// A closure sent to a worker, and how its outcome comes back.
type SentClosure = (Arc<Closure>, InFlight);

/// How a closure sent to a worker is waited for.
enum InFlight {
    /// A `worker.run` call over gRPC: `None` when it finished and its result is delivered,
    /// else the other outcome the worker answered.
    Grpc(Pending<Option<RunOutcome>>),
    /// A request on the worker's direct connection; replies come in the order sent.
    Direct {
        connection: Arc<DirectClient>,
        sent: Instant,
    },
    /// A request the direct connection could not take (it broke).
    Broken(Error),
}

/// A worker ready for a closure, as its thread left it for `schedule`.
struct IdleWorker {
    runner: Arc<Peer>,
    direct: Option<Arc<DirectClient>>,
    incarnation: u64,
    /// How much of the setup it has.
    set_up: usize,
}

struct Shared {
    queue: Mutex<Queue>,
    /// Signalled when closures or setup arrive, or the coordinator stops.
    wake: Condvar,
    /// Signalled when a closure finishes (for `join`).
    finished: Condvar,
    next_id: AtomicU64,
}

impl Shared {
    fn lock(&self) -> std::sync::MutexGuard<'_, Queue> {
        self.queue.lock().unwrap_or_else(|e| e.into_inner())
    }
}

/// Schedules functions on the workers of a [`ParameterServerStrategy`] and survives their
/// loss (TF's `ClusterCoordinator`).
///
/// ```no_run
/// # fn f(strategy: &ferroflow_distribute::ParameterServerStrategy) -> ferroflow::Result<()> {
/// use ferroflow_distribute::ClusterCoordinator;
/// let coordinator = ClusterCoordinator::new(strategy)?;
/// let loss = coordinator.schedule::<_, f32>("train_step", &())?;
/// coordinator.join()?;
/// println!("loss {}", loss.fetch()?);
/// # Ok(()) }
/// ```
pub struct ClusterCoordinator {
    strategy: ParameterServerStrategy,
    shared: Arc<Shared>,
    threads: Vec<JoinHandle<()>>,
}

/// How many closures ran and how many went out again after their worker was lost.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ScheduleStats {
    /// Closures scheduled.
    pub scheduled: u64,
    /// Times a closure was sent again because its worker stopped answering.
    pub retried: u64,
}

impl ClusterCoordinator {
    /// A coordinator of `strategy`'s workers; one thread per worker starts taking
    /// closures as soon as its worker answers.
    pub fn new(strategy: &ParameterServerStrategy) -> Result<ClusterCoordinator> {
        let workers = strategy.worker_tasks();
        let shared = Arc::new(Shared {
            queue: Mutex::new(Queue {
                workers_up: vec![false; workers.len()],
                idle: (0..workers.len()).map(|_| None).collect(),
                handed: (0..workers.len()).map(|_| None).collect(),
                ..Default::default()
            }),
            wake: Condvar::new(),
            finished: Condvar::new(),
            next_id: AtomicU64::new(1),
        });
        let server = &strategy.inner.server;
        // A worker's server answers `worker.hello` while its function thread runs: within
        // the keepalive interval, or the worker is given up (as its pings would be).
        let hello_timeout = Duration::from_secs(5).min(ferroflow_cluster::keepalive_interval());
        let mut threads = vec![];
        for (i, (name, address)) in workers.into_iter().enumerate() {
            let link = WorkerLink {
                index: i,
                control: server.peer(&name, &address, hello_timeout)?,
                runner: Arc::new(server.peer(&name, &address, function_timeout())?),
                server: server.clone(),
                host: address
                    .rsplit_once(':')
                    .map_or(address.as_str(), |(host, _)| host)
                    .to_string(),
                name,
            };
            let shared = shared.clone();
            threads.push(
                std::thread::Builder::new()
                    .name(format!("coordinator-worker-{i}"))
                    .spawn(move || worker_loop(&link, &shared))
                    .map_err(|e| Error::io("starting a coordinator thread", &e))?,
            );
        }
        Ok(ClusterCoordinator {
            strategy: strategy.clone(),
            shared,
            threads,
        })
    }

    /// The strategy.
    pub fn strategy(&self) -> &ParameterServerStrategy {
        &self.strategy
    }

    fn check_error(&self, q: &mut Queue) -> Result<()> {
        match q.error.take() {
            Some(e) => Err(e),
            None => Ok(()),
        }
    }

    /// Queues the registered function `function` with `args` for the next free worker and
    /// returns at once (TF's `schedule`). An error a closure scheduled earlier ran into
    /// (its own, or a parameter server that is gone) is returned here, once.
    pub fn schedule<A: Serialize, T: DeserializeOwned>(
        &self,
        function: &str,
        args: &A,
    ) -> Result<RemoteValue<T>> {
        self.strategy.create_variables()?;
        let args = serde_json::to_string(args).map_err(|e| {
            Error::invalid(
                "schedule",
                format!("the arguments of {function:?} do not serialize: {e}"),
            )
        })?;
        let slot = Arc::new(Slot::default());
        let closure = Arc::new(Closure {
            function: function.to_string(),
            args,
            result: slot.clone(),
            attempts: AtomicUsize::new(0),
        });
        let mut q = self.shared.lock();
        self.check_error(&mut q)?;
        q.scheduled += 1;
        // A worker waiting for work with nothing queued before this closure: send it from
        // here, and its thread takes the call over (the call does not wait for that
        // thread to wake).
        let setup = q.setup.len();
        let idle = if q.closures.is_empty() {
            q.idle
                .iter_mut()
                .enumerate()
                .find_map(|(i, w)| w.take_if(|w| w.set_up == setup).map(|w| (i, w)))
        } else {
            None
        };
        match idle {
            Some((index, worker)) => {
                match send_closure(
                    &worker.runner,
                    worker.direct.as_ref(),
                    worker.incarnation,
                    &closure,
                ) {
                    Ok(call) => {
                        q.in_flight += 1;
                        q.handed[index] = Some((closure, call));
                    }
                    Err(e) => unsent(&mut q, &self.shared, &closure, e),
                }
                drop(q);
                self.shared.wake.notify_all();
            }
            None => {
                q.closures.push_back(closure);
                drop(q);
                self.shared.wake.notify_one();
            }
        }
        Ok(RemoteValue {
            slot,
            _t: PhantomData,
        })
    }

    /// Waits until every scheduled closure has finished (TF's `join`); the first error
    /// one of them ran into, if any.
    pub fn join(&self) -> Result<()> {
        let mut q = self.shared.lock();
        loop {
            self.check_error(&mut q)?;
            if q.closures.is_empty() && q.in_flight == 0 {
                return Ok(());
            }
            q = self
                .shared
                .finished
                .wait_timeout(q, Duration::from_millis(200))
                .unwrap_or_else(|e| e.into_inner())
                .0;
        }
    }

    /// Whether every scheduled closure has finished (TF's `done`); an error one ran into.
    pub fn done(&self) -> Result<bool> {
        let mut q = self.shared.lock();
        self.check_error(&mut q)?;
        Ok(q.closures.is_empty() && q.in_flight == 0)
    }

    /// Has every worker make a dataset with the registered dataset function `name` (TF's
    /// `create_per_worker_dataset`); a worker that restarts makes it again.
    pub fn create_per_worker_dataset(&self, name: &str) -> Result<PerWorkerDataset> {
        let id = self.shared.next_id.fetch_add(1, Ordering::Relaxed);
        let mut q = self.shared.lock();
        self.check_error(&mut q)?;
        q.setup.push(Setup::Dataset {
            id,
            name: name.to_string(),
        });
        drop(q);
        self.shared.wake.notify_all();
        Ok(PerWorkerDataset {
            id,
            coordinator: self.shared.clone(),
        })
    }

    /// Closures scheduled so far and how many were sent again after a worker was lost.
    pub fn stats(&self) -> ScheduleStats {
        let q = self.shared.lock();
        ScheduleStats {
            scheduled: q.scheduled,
            retried: q.retried,
        }
    }

    /// How many workers answer now.
    pub fn workers_up(&self) -> usize {
        self.shared.lock().workers_up.iter().filter(|u| **u).count()
    }
}

impl Drop for ClusterCoordinator {
    fn drop(&mut self) {
        self.shared.lock().stopping = true;
        self.shared.wake.notify_all();
        for t in self.threads.drain(..) {
            let _ = t.join();
        }
    }
}

fn json<T: Serialize>(v: &T) -> Result<Bytes> {
    serde_json::to_vec(v)
        .map(Bytes::from)
        .map_err(|e| Error::invalid("coordinator", e.to_string()))
}

/// What a coordinator thread reaches its worker through.
struct WorkerLink {
    index: usize,
    /// The worker's task name, for errors.
    name: String,
    /// The host of its address (its direct connection's port is on it).
    host: String,
    server: Arc<TaskServer>,
    /// For `worker.hello`: is it there, which process is it.
    control: Peer,
    /// For `worker.run` over gRPC, `worker.dataset` and `worker.iterator`.
    runner: Arc<Peer>,
}

impl WorkerLink {
    fn hello(&self) -> Result<HelloReply> {
        self.control
            .start_call("worker.hello", Bytes::new(), false)
            .wait()
            .and_then(|b| {
                serde_json::from_slice::<HelloReply>(&b)
                    .map_err(|e| Error::invalid("worker.hello", e.to_string()))
            })
    }

    /// A direct connection to the worker at `port`, if it can be made.
    fn connect_direct(&self, port: u16) -> Option<Arc<DirectClient>> {
        let address = format!("{}:{port}", self.host);
        self.server
            .connect_direct(&self.name, &address, Duration::from_secs(5))
            .ok()
            .map(Arc::new)
    }

    /// Waits for the outcome of a closure sent to the worker (its `incarnation`): `None`
    /// when it finished and its result is delivered.
    fn wait(
        &self,
        incarnation: u64,
        closure: &Closure,
        in_flight: InFlight,
    ) -> Result<Option<RunOutcome>> {
        let (connection, sent) = match in_flight {
            InFlight::Grpc(call) => return call.wait(),
            InFlight::Broken(e) => return Err(e),
            InFlight::Direct { connection, sent } => (connection, sent),
        };
        let lost = |msg: String| Error::Unavailable {
            op: format!("function {:?}", closure.function),
            peer: self.name.clone(),
            msg,
        };
        let deadline = sent + function_timeout();
        loop {
            match connection.receive(ferroflow_cluster::keepalive_interval())? {
                Some(reply) => {
                    return match run_outcome(Ok(reply))? {
                        RunOutcome::Done(json) => {
                            closure.result.set(Ok(json));
                            Ok(None)
                        }
                        other => Ok(Some(other)),
                    };
                }
                None if Instant::now() >= deadline => {
                    return Err(lost(format!(
                        "no reply within the function timeout ({:?}, FERROFLOW_FUNCTION_TIMEOUT)",
                        function_timeout()
                    )))
                }
                None => match self.hello() {
                    Ok(h) if h.incarnation == incarnation => {}
                    Ok(_) => return Err(lost("the worker restarted".into())),
                    Err(e) => return Err(lost(format!("the worker stopped answering: {e}"))),
                },
            }
        }
    }
}

/// One worker's thread: keep the worker set up, run closures on it, hand back the ones it
/// did not finish.
fn worker_loop(link: &WorkerLink, shared: &Shared) {
    let index = link.index;
    let runner = &link.runner;
    let mut incarnation: Option<u64> = None;
    let mut healthy = false;
    let mut set_up = 0usize;
    let mut direct: Option<Arc<DirectClient>> = None;
    // The incarnation whose direct port could not be reached (it is served over gRPC).
    let mut no_direct: Option<u64> = None;
    let set_up_state = |shared: &Shared, up: bool| {
        shared.lock().workers_up[index] = up;
    };
    loop {
        if shared.lock().stopping {
            return;
        }
        // Is the worker there, and is it the process we set up? (Asked at the start and
        // after a failure; while closures succeed, the worker is the one we know.)
        let inc = match (incarnation, healthy) {
            (Some(inc), true) => inc,
            _ => match link.hello() {
                Ok(h) => {
                    if incarnation != Some(h.incarnation) {
                        direct = None;
                    }
                    if direct.is_none() && no_direct != Some(h.incarnation) {
                        direct = h.run_port.and_then(|port| link.connect_direct(port));
                        if direct.is_none() {
                            no_direct = Some(h.incarnation);
                        }
                    }
                    h.incarnation
                }
                Err(_) => {
                    set_up_state(shared, false);
                    let q = shared.lock();
                    if q.stopping {
                        return;
                    }
                    drop(shared.wake.wait_timeout(q, Duration::from_millis(250)));
                    continue;
                }
            },
        };
        if incarnation != Some(inc) {
            incarnation = Some(inc);
            set_up = 0;
        }
        healthy = true;
        set_up_state(shared, true);
        // Bring the worker's datasets and iterators up to date.
        let setup: Vec<Setup> = shared.lock().setup[set_up..].to_vec();
        let mut failed = false;
        for s in setup {
            let call = match &s {
                Setup::Dataset { id, name } => json(&DatasetRequest {
                    incarnation: inc,
                    id: *id,
                    name: name.clone(),
                })
                .map(|p| runner.start_call("worker.dataset", p, false)),
                Setup::Iterator { id, dataset } => json(&IteratorRequest {
                    incarnation: inc,
                    id: *id,
                    dataset: *dataset,
                })
                .map(|p| runner.start_call("worker.iterator", p, false)),
            };
            match call.and_then(|c| c.wait()) {
                Ok(_) => set_up += 1,
                Err(e @ Error::Remote { .. }) => {
                    let mut q = shared.lock();
                    q.error.get_or_insert(e);
                    drop(q);
                    shared.finished.notify_all();
                    set_up += 1;
                }
                Err(_) => {
                    failed = true;
                    break;
                }
            }
        }
        if failed {
            healthy = false;
            continue;
        }
        // Keep up to CLOSURES_IN_FLIGHT closures sent to the worker (its function thread
        // runs them one after another: the next one is there when the last one ends), until
        // new setup arrives or the coordinator stops.
        let mut sent: VecDeque<SentClosure> = VecDeque::new();
        loop {
            let taken = {
                let mut q = shared.lock();
                let taken = loop {
                    if let Some(handed) = q.handed[index].take() {
                        sent.push_back(handed);
                        continue;
                    }
                    if q.stopping || q.setup.len() > set_up || sent.len() == CLOSURES_IN_FLIGHT {
                        break None;
                    }
                    if let Some(c) = q.closures.pop_front() {
                        q.in_flight += 1;
                        break Some(c);
                    }
                    if !sent.is_empty() {
                        break None;
                    }
                    // Nothing in flight and nothing queued: `schedule` may send the next
                    // closure itself.
                    q.idle[index] = Some(IdleWorker {
                        runner: runner.clone(),
                        direct: direct.clone(),
                        incarnation: inc,
                        set_up,
                    });
                    q = shared
                        .wake
                        .wait_timeout(q, Duration::from_millis(500))
                        .unwrap_or_else(|e| e.into_inner())
                        .0;
                };
                q.idle[index] = None;
                taken
            };
            if let Some(closure) = taken {
                match send_closure(runner, direct.as_ref(), inc, &closure) {
                    Ok(in_flight) => sent.push_back((closure, in_flight)),
                    Err(e) => {
                        let mut q = shared.lock();
                        q.in_flight -= 1;
                        unsent(&mut q, shared, &closure, e);
                    }
                }
                continue;
            }
            let Some((closure, in_flight)) = sent.pop_front() else {
                break;
            };
            let outcome = link.wait(inc, &closure, in_flight);
            if !finish(index, runner, shared, closure, outcome) {
                // The worker is gone or restarted: what else was sent to it goes back to
                // the queue too (or counts, if it finished before). Its direct
                // connection's later replies cannot come before the one that failed.
                while let Some((closure, in_flight)) = sent.pop_front() {
                    let outcome = match in_flight {
                        InFlight::Direct { .. } => Err(Error::Unavailable {
                            op: format!("function {:?}", closure.function),
                            peer: link.name.clone(),
                            msg: "its worker was lost before it answered".into(),
                        }),
                        other => link.wait(inc, &closure, other),
                    };
                    finish(index, runner, shared, closure, outcome);
                }
                healthy = false;
                direct = None;
                break;
            }
        }
        if shared.lock().stopping {
            return;
        }
    }
}

/// Sends `closure` to the worker `runner` reaches (its incarnation `incarnation`), on its
/// direct connection when there is one. Over gRPC, the function's result reaches its
/// `RemoteValue` from the runtime's thread as it arrives, and the call's outcome is left
/// for the worker's thread to book.
fn send_closure(
    runner: &Peer,
    direct: Option<&Arc<DirectClient>>,
    incarnation: u64,
    closure: &Closure,
) -> Result<InFlight> {
    closure.attempts.fetch_add(1, Ordering::Relaxed);
    let request = json(&RunRequest {
        incarnation,
        function: closure.function.clone(),
        args: closure.args.clone(),
    })?;
    if let Some(connection) = direct {
        return match connection.send(&request) {
            Ok(()) => Ok(InFlight::Direct {
                connection: connection.clone(),
                sent: Instant::now(),
            }),
            Err(e @ Error::Unavailable { .. }) => Ok(InFlight::Broken(e)),
            Err(e) => Err(e),
        };
    }
    let result = closure.result.clone();
    Ok(InFlight::Grpc(runner.start_call_then(
        "worker.run",
        request,
        false,
        move |reply| {
            Ok(match run_outcome(reply)? {
                RunOutcome::Done(json) => {
                    result.set(Ok(json));
                    None
                }
                other => Some(other),
            })
        },
    )))
}

/// A `worker.run` reply as the outcome it says.
fn run_outcome(reply: Result<Bytes>) -> Result<RunOutcome> {
    serde_json::from_slice::<RunOutcome>(&reply?)
        .map_err(|e| Error::invalid("worker.run", format!("malformed reply: {e}")))
}

/// A closure that could not be sent: its error is its result and the job's next error.
fn unsent(q: &mut Queue, shared: &Shared, closure: &Closure, e: Error) {
    closure.result.set(Err(e.clone()));
    q.error.get_or_insert(e);
    shared.finished.notify_all();
}

/// Records how a closure sent to worker `index` ended (`Ok(None)`: it finished and its
/// result is delivered); `false` when the worker stopped answering or restarted (the
/// closure is queued again, at the front).
fn finish(
    index: usize,
    runner: &Peer,
    shared: &Shared,
    closure: Arc<Closure>,
    outcome: Result<Option<RunOutcome>>,
) -> bool {
    let mut q = shared.lock();
    q.in_flight -= 1;
    let mut worker_ok = true;
    match outcome {
        Ok(None) => {}
        Ok(Some(RunOutcome::Done(json))) => closure.result.set(Ok(json)),
        Ok(Some(RunOutcome::Restarted)) => {
            q.closures.push_front(closure);
            q.retried += 1;
            worker_ok = false;
        }
        Ok(Some(RunOutcome::Failed(msg))) => {
            let e = Error::Remote {
                op: format!("function {:?}", closure.function),
                peer: runner.name().to_string(),
                msg,
            };
            closure.result.set(Err(e.clone()));
            q.error.get_or_insert(e);
        }
        Ok(Some(RunOutcome::PsUnavailable(msg))) => {
            let e = Error::Unavailable {
                op: format!("function {:?}", closure.function),
                peer: runner.name().to_string(),
                msg: format!("a parameter server is unavailable: {msg}"),
            };
            closure.result.set(Err(e.clone()));
            q.error.get_or_insert(e);
        }
        Err(e @ Error::Remote { .. }) => {
            closure.result.set(Err(e.clone()));
            q.error.get_or_insert(e);
        }
        Err(_) => {
            // The worker stopped answering: someone else runs it.
            q.closures.push_front(closure);
            q.retried += 1;
            q.workers_up[index] = false;
            worker_ok = false;
        }
    }
    drop(q);
    shared.finished.notify_all();
    shared.wake.notify_all();
    worker_ok
}
