//! [`ParameterServerStrategy`] (TF's `tf.distribute.experimental.ParameterServerStrategy`)
//! and [`Server`] (TF's `tf.distribute.Server`): the processes of a parameter-server job.

use super::store::serve_parameters;
use super::variables::{PsClient, Role, VariablePartitioner};
use super::worker::{serve_worker, Functions};
use crate::strategy::{enter_scope, Strategy};
use ferroflow_cluster::{token_from_env, ClusterResolver, ClusterSpec, Peer, TaskId, TaskServer};
use ferroflow_tensor::distribution::VariableDistribution;
use ferroflow_tensor::{Device, Error, Result};
use std::sync::{Arc, Condvar, Mutex};
use std::time::Duration;

/// How long a call to a parameter server may take before it is an error naming the ps
/// (`FERROFLOW_PS_TIMEOUT` seconds; 30 by default).
pub(crate) fn ps_timeout() -> Duration {
    ferroflow_cluster::seconds_from_env("FERROFLOW_PS_TIMEOUT", Duration::from_secs(30))
}

/// The cluster's parameter servers and workers, as the resolver describes them.
pub(crate) struct PsCluster {
    pub spec: ClusterSpec,
    pub task: Option<TaskId>,
}

impl PsCluster {
    pub(crate) fn from_resolver(
        resolver: &dyn ClusterResolver,
        who: &'static str,
    ) -> Result<PsCluster> {
        let spec = resolver.cluster_spec()?;
        for job in ["ps", "worker"] {
            if spec.num_tasks(job) == 0 {
                return Err(Error::invalid(
                    who,
                    format!(
                        "the cluster has no {job:?} tasks (jobs: {:?}); a parameter-server job \
                         needs ps and worker tasks, and a chief that coordinates",
                        spec.jobs()
                    ),
                ));
            }
        }
        Ok(PsCluster {
            spec,
            task: resolver.task(),
        })
    }

    pub(crate) fn tasks(&self, job: &str) -> Vec<(String, String)> {
        self.spec
            .job_tasks(job)
            .into_iter()
            .enumerate()
            .map(|(i, a)| (TaskId::new(job, i).to_string(), a.to_string()))
            .collect()
    }

    /// Clients of every ps task through `server`.
    pub(crate) fn ps_peers(&self, server: &TaskServer) -> Result<Vec<Peer>> {
        self.tasks("ps")
            .iter()
            .map(|(name, address)| server.peer(name, address, ps_timeout()))
            .collect()
    }
}

pub(crate) struct PsStrategyInner {
    pub server: Arc<TaskServer>,
    pub client: Arc<PsClient>,
    pub cluster: PsCluster,
    variables: Arc<VariableDistribution>,
    device: Device,
}

/// Asynchronous training with variables on parameter servers (TF's
/// `ParameterServerStrategy`): variables created in its scope live on the `ps` tasks
/// (round-robin, or in shards as the partitioner says, [`crate::ShardedVariable`]); the
/// chief schedules step functions on the workers with a [`crate::ClusterCoordinator`];
/// each worker reads the variables at the start of a step and sends its optimizer updates
/// to the ps that holds each variable, where they apply (with the variable's slots) as
/// they arrive, without waiting for the other workers.
///
/// Every task runs the same program: ps and workers serve ([`Server`]), the chief builds
/// the same state as the workers (so their variables match one for one: a variable's key
/// is its creation index and name) and coordinates.
///
/// Reads on the chief fetch the value from its ps each time; reads in a worker's step use
/// the values fetched when the step began. Updates by optimizers with a fused rule (SGD,
/// momentum, Adam, RMSprop, Adagrad, Adadelta, Adamax) apply on the ps in one go, under the
/// variable's lock; others (Nadam, Ftrl, AMSGrad) compute the new value on the worker and
/// assign it, so concurrent workers' updates of one variable may overwrite each other
/// (TF's `use_locking=False`). Sync-on-read variables (metrics) stay in each process.
///
/// ```no_run
/// use ferroflow_distribute::{ParameterServerStrategy, Strategy};
/// ferroflow::init();
/// let resolver = ferroflow_cluster::TfConfigClusterResolver::from_env()?;
/// let strategy = ParameterServerStrategy::new(&resolver, None)?;
/// let _scope = strategy.scope();
/// let w = ferroflow::Variable::new("w", ferroflow::Tensor::zeros(&[4], ferroflow::DType::F32)?);
/// assert!(w.remote_location().unwrap().contains("/job:ps/task:0"));
/// # Ok::<(), ferroflow::Error>(())
/// ```
#[derive(Clone)]
pub struct ParameterServerStrategy {
    pub(crate) inner: Arc<PsStrategyInner>,
}

impl ParameterServerStrategy {
    /// The strategy of the chief (the coordinator) of the cluster `resolver` describes
    /// (`TfConfigClusterResolver::from_env()` under the launcher); `variable_partitioner`
    /// shards large variables. The chief serves on its cluster address (when it has one)
    /// and reaches the ps tasks with the cluster token (`FERROFLOW_CLUSTER_TOKEN`).
    pub fn new(
        resolver: &dyn ClusterResolver,
        variable_partitioner: Option<Arc<dyn VariablePartitioner>>,
    ) -> Result<ParameterServerStrategy> {
        let cluster = PsCluster::from_resolver(resolver, "ParameterServerStrategy")?;
        if let Some(t) = &cluster.task {
            if t.task_type != "chief" {
                return Err(Error::invalid(
                    "ParameterServerStrategy",
                    format!(
                        "this process is {t}: ps and worker tasks serve with \
                         `Server::new(&resolver)?.run()` / `.run_worker(functions)`; the \
                         strategy is the chief's"
                    ),
                ));
            }
        }
        let address = resolver
            .task_address()?
            .unwrap_or_else(|| "127.0.0.1:0".to_string());
        let server = Arc::new(TaskServer::start(&address, token_from_env().as_deref())?);
        Self::with_server(server, cluster, Role::Chief, variable_partitioner)
    }

    pub(crate) fn with_server(
        server: Arc<TaskServer>,
        cluster: PsCluster,
        role: Role,
        variable_partitioner: Option<Arc<dyn VariablePartitioner>>,
    ) -> Result<ParameterServerStrategy> {
        let client = PsClient::new(cluster.ps_peers(&server)?, role, variable_partitioner);
        let placer = client.clone();
        let variables = Arc::new(VariableDistribution {
            strategy: "ParameterServerStrategy",
            num_local_replicas: 1,
            on_create: None,
            place: Some(Arc::new(move |p| placer.place(p))),
        });
        Ok(ParameterServerStrategy {
            inner: Arc::new(PsStrategyInner {
                server,
                client,
                cluster,
                variables,
                device: ferroflow_tensor::current_device(),
            }),
        })
    }

    /// How many parameter servers hold the variables.
    pub fn num_ps(&self) -> usize {
        self.inner.client.num_ps()
    }

    /// The worker tasks' names and addresses.
    pub(crate) fn worker_tasks(&self) -> Vec<(String, String)> {
        self.inner.cluster.tasks("worker")
    }

    /// Creates on the ps every variable made in the scope and not created there yet (the
    /// coordinator does this before it schedules anything, so workers find the chief's
    /// initial values; reads and writes do it for their variable).
    pub fn create_variables(&self) -> Result<()> {
        self.inner.client.create_pending()
    }

    /// Tells every worker and ps task to stop serving (their [`Server::run`] returns): the
    /// end of a job (TF's servers run until their process is killed; here the launcher
    /// waits for the workers to exit). Tasks that are already gone are skipped.
    pub fn shut_down_cluster(&self) -> Result<()> {
        let mut calls = vec![];
        for job in ["worker", "ps"] {
            for (name, address) in self.inner.cluster.tasks(job) {
                let peer = self
                    .inner
                    .server
                    .peer(&name, &address, Duration::from_secs(5))?;
                calls.push(peer.start_call("task.stop", bytes::Bytes::new(), false));
            }
        }
        for c in calls {
            let _ = c.wait();
        }
        Ok(())
    }
}

impl Strategy for ParameterServerStrategy {
    fn name(&self) -> &'static str {
        "ParameterServerStrategy"
    }
    fn local_devices(&self) -> Vec<Device> {
        vec![self.inner.device]
    }
    fn variable_distribution(&self) -> Option<Arc<VariableDistribution>> {
        Some(self.inner.variables.clone())
    }
    fn to_dyn(&self) -> Arc<dyn Strategy> {
        Arc::new(self.clone())
    }
    fn as_parameter_server(&self) -> Option<&ParameterServerStrategy> {
        Some(self)
    }
}

/// A ps or worker task of a parameter-server job (TF's `tf.distribute.Server`): serves on
/// the task's cluster address until the chief stops it
/// ([`ParameterServerStrategy::shut_down_cluster`]) or the process is killed.
///
/// ```no_run
/// use ferroflow_cluster::{ClusterResolver, TfConfigClusterResolver};
/// use ferroflow_distribute::Server;
/// ferroflow::init();
/// let resolver = TfConfigClusterResolver::from_env()?;
/// if resolver.task().is_some_and(|t| t.task_type == "ps") {
///     Server::new(&resolver)?.run()?;
/// }
/// # Ok::<(), ferroflow::Error>(())
/// ```
pub struct Server {
    server: Arc<TaskServer>,
    cluster: PsCluster,
    task: TaskId,
    stopped: Arc<(Mutex<bool>, Condvar)>,
}

impl Server {
    /// Starts serving this process' task of the cluster `resolver` describes, on its
    /// address, with the cluster token: a ps serves its variables from now on; a worker
    /// binds its address now and answers once [`run_worker`](Server::run_worker) has its
    /// functions (the chief, calling a restarted worker at once, never finds it without
    /// them).
    pub fn new(resolver: &dyn ClusterResolver) -> Result<Server> {
        let cluster = PsCluster::from_resolver(resolver, "Server")?;
        let task = cluster.task.clone().ok_or_else(|| {
            Error::invalid("Server", "the resolver names no task for this process")
        })?;
        if task.task_type != "ps" && task.task_type != "worker" {
            return Err(Error::invalid(
                "Server",
                format!("{task} is neither a ps nor a worker task; the chief coordinates"),
            ));
        }
        let address = resolver.task_address()?.ok_or_else(|| {
            Error::invalid("Server", format!("the cluster has no address for {task}"))
        })?;
        let server = Arc::new(TaskServer::bind(&address, token_from_env().as_deref())?);
        let stopped = Arc::new((Mutex::new(false), Condvar::new()));
        let s = stopped.clone();
        server.handle("task.stop", move |_| {
            *s.0.lock().unwrap_or_else(|e| e.into_inner()) = true;
            s.1.notify_all();
            Ok(bytes::Bytes::new())
        });
        if task.task_type == "ps" {
            serve_parameters(&server);
            server.serve();
        }
        Ok(Server {
            server,
            cluster,
            task,
            stopped,
        })
    }

    /// This task.
    pub fn task(&self) -> &TaskId {
        &self.task
    }

    /// The address it serves on.
    pub fn local_addr(&self) -> std::net::SocketAddr {
        self.server.local_addr()
    }

    /// Serves until stopped (a ps; a worker needs its functions: [`Server::run_worker`]).
    pub fn run(self) -> Result<()> {
        if self.task.task_type == "worker" {
            return Err(Error::invalid(
                "Server::run",
                format!(
                    "{} is a worker: it runs the chief's scheduled functions, registered with \
                     `Server::run_worker(functions)`",
                    self.task
                ),
            ));
        }
        self.wait_for_stop();
        Ok(())
    }

    /// Serves a worker task until stopped: builds `functions`' state in the strategy's
    /// scope (the variables on the ps, created there unless the chief already has) and runs
    /// the functions the chief schedules by name.
    pub fn run_worker<S: 'static>(self, functions: Functions<S>) -> Result<()> {
        if self.task.task_type != "worker" {
            return Err(Error::invalid(
                "Server::run_worker",
                format!("{} is not a worker task", self.task),
            ));
        }
        let strategy = ParameterServerStrategy::with_server(
            self.server.clone(),
            PsCluster {
                spec: self.cluster.spec.clone(),
                task: Some(self.task.clone()),
            },
            Role::Worker,
            functions.partitioner.clone(),
        )?;
        let _worker = serve_worker(&self.server, strategy, self.task.index, functions)?;
        self.server.serve();
        self.wait_for_stop();
        Ok(())
    }

    fn wait_for_stop(&self) {
        let (lock, cv) = &*self.stopped;
        let mut stopped = lock.lock().unwrap_or_else(|e| e.into_inner());
        while !*stopped {
            stopped = cv.wait(stopped).unwrap_or_else(|e| e.into_inner());
        }
        // Let the stop call's answer go out before the runtime shuts down.
        std::thread::sleep(Duration::from_millis(50));
    }
}

/// Enters `strategy`'s scope on this thread (what the worker's function thread does once).
pub(crate) fn scope_of(strategy: &ParameterServerStrategy) -> crate::StrategyScope {
    enter_scope(strategy.to_dyn())
}
