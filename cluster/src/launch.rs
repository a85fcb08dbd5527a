//! [`LocalCluster`]: a job's tasks started as processes on this machine, with `TF_CONFIG`
//! filled in on free loopback ports (what `ferroflow launch` and the multi-process tests
//! run on).

use crate::spec::TaskId;
use crate::ReservedPort;
use ferroflow_tensor::{Error, Result};
use std::io::{BufRead, BufReader, Read, Write};
use std::process::{Child, Command, Stdio};
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

/// What to start: the tasks of each job and the program every task runs.
#[derive(Debug, Clone, Default)]
pub struct LaunchSpec {
    /// Start a chief (`"chief"` task 0) besides the workers.
    pub chief: bool,
    /// How many `"worker"` tasks.
    pub workers: usize,
    /// How many `"ps"` (parameter server) tasks; they serve until the others are done.
    pub ps: usize,
    /// The program and its arguments.
    pub program: String,
    /// Its arguments.
    pub args: Vec<String>,
    /// Extra environment for every task. Unless it (or this process's environment) sets
    /// `RAYON_NUM_THREADS`, each task gets the machine's cores shared out among the
    /// training tasks (the workers, and the chief unless the job has parameter servers, where
    /// it only coordinates; at least one each), as torchrun sets
    /// `OMP_NUM_THREADS`: local tasks would otherwise each start a thread per core and
    /// fight over them.
    pub env: Vec<(String, String)>,
    /// Echo each task's output lines, prefixed with its name (`[worker:1] ...`), to this
    /// process' stdout and stderr (the launcher); tests leave it off and read
    /// [`LocalCluster::output`].
    pub echo: bool,
    /// Give each task a free loopback port for its profiler server, in
    /// [`PROFILER_PORT_ENV`] (`ferroflow launch --profile-ports`); the program starts the
    /// server with `profiler::server::start_from_env()`, and
    /// [`LocalCluster::profiler_addresses`] lists where to capture.
    pub profile_ports: bool,
    /// Close each task's ports before starting it instead of handing them over listening
    /// (`ferroflow launch --release-ports`): for programs that bind their `TF_CONFIG` address
    /// themselves without taking the socket (TensorFlow, another framework), which would
    /// find the port busy. Another socket can then take a port before the task binds it.
    pub release_ports: bool,
}

/// The environment variable that gives a task its profiler server's port (read by
/// `ferroflow_profiler::server::start_from_env`).
pub const PROFILER_PORT_ENV: &str = "FERROFLOW_PROFILER_PORT";

/// A task's process and what it printed.
struct Task {
    id: TaskId,
    /// Its address in `TF_CONFIG`.
    address: String,
    /// Its profiler server's loopback address, when the launch gave it a port.
    profiler_address: Option<String>,
    child: Child,
    output: Arc<Mutex<String>>,
    relays: Vec<JoinHandle<()>>,
    code: Option<i32>,
}

/// How the group ended (per task, in start order: chief, workers, ps).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LaunchOutcome {
    /// `(task, exit code)`; `None` for a task stopped by the launcher (a parameter server
    /// after the others finished, or every task after one failed).
    pub codes: Vec<(TaskId, Option<i32>)>,
    /// The first task that failed, and its code (`-1` when killed by a signal).
    pub first_failure: Option<(TaskId, i32)>,
}

/// A job's tasks running as local processes. Dropping it kills every task still running;
/// on Linux the tasks also die with this process (`PR_SET_PDEATHSIG`), so none outlives a
/// crashed launcher or test.
///
/// ```no_run
/// use ferroflow_cluster::{LaunchSpec, LocalCluster};
/// let spec = LaunchSpec { workers: 2, program: "./train".into(), echo: true, ..Default::default() };
/// let mut cluster = LocalCluster::start(&spec)?;
/// let outcome = cluster.wait(None)?;
/// assert!(outcome.first_failure.is_none());
/// # Ok::<(), ferroflow_tensor::Error>(())
/// ```
pub struct LocalCluster {
    tasks: Vec<Task>,
    tf_configs: Vec<String>,
    /// What was started (for restarts), with the thread count filled in.
    spec: LaunchSpec,
}

/// `n` loopback addresses with nothing listening: bound by the OS, noted, released. For an
/// address that must refuse connections, or a server this crate does not start (another
/// framework's); a task this crate's launcher starts gets its port already listening
/// ([`crate::reserve_loopback_ports`]), since a released port can be taken by any socket
/// before the task binds it.
pub fn free_loopback_addresses(n: usize) -> Result<Vec<String>> {
    Ok(crate::reserve_loopback_ports(n)?
        .iter()
        .map(|p| p.address().to_string())
        .collect())
}

impl LocalCluster {
    /// Starts every task of `spec`, each with its `TF_CONFIG`.
    pub fn start(spec: &LaunchSpec) -> Result<LocalCluster> {
        if spec.workers == 0 && !spec.chief {
            return Err(Error::invalid(
                "launch",
                "the job needs at least one worker or a chief",
            ));
        }
        let mut jobs: Vec<(&str, usize)> = vec![];
        if spec.chief {
            jobs.push(("chief", 1));
        }
        jobs.push(("worker", spec.workers));
        if spec.ps > 0 {
            jobs.push(("ps", spec.ps));
        }
        let total: usize = jobs.iter().map(|j| j.1).sum();
        // Held listening until each task has started with its own (see `hand_over`).
        let mut ports = crate::reserve_loopback_ports(total)?.into_iter();
        let mut cluster = serde_json::Map::new();
        let mut ids = vec![];
        let mut task_ports = vec![];
        for (job, n) in &jobs {
            if *n == 0 {
                continue;
            }
            let held: Vec<ReservedPort> = ports.by_ref().take(*n).collect();
            let list: Vec<&str> = held.iter().map(|p| p.address()).collect();
            cluster.insert(job.to_string(), serde_json::json!(list));
            ids.extend((0..*n).map(|i| TaskId::new(*job, i)));
            task_ports.extend(held);
        }
        let mut spec = spec.clone();
        let set = |k: &str| std::env::var_os(k).is_some() || spec.env.iter().any(|(n, _)| n == k);
        if !set("RAYON_NUM_THREADS") {
            let cores = std::thread::available_parallelism().map_or(1, |n| n.get());
            // In a parameter-server job the chief only coordinates: the workers compute.
            let training = spec.workers + usize::from(spec.chief && spec.ps == 0);
            let threads = (cores / training.max(1)).max(1);
            spec.env
                .push(("RAYON_NUM_THREADS".into(), threads.to_string()));
        }
        let spec = &spec;
        let mut out = LocalCluster {
            tasks: vec![],
            tf_configs: vec![],
            spec: spec.clone(),
        };
        let mut profiler_ports = if spec.profile_ports {
            crate::reserve_loopback_ports(ids.len())?
                .into_iter()
                .map(Some)
                .collect()
        } else {
            Vec::from_iter(std::iter::repeat_with(|| None).take(ids.len()))
        }
        .into_iter();
        for (id, port) in ids.into_iter().zip(task_ports) {
            let tf_config = serde_json::json!({
                "cluster": cluster,
                "task": {"type": id.task_type, "index": id.index},
            })
            .to_string();
            let profiler = profiler_ports.next().flatten();
            // The task owns its sockets from here; this process's copies close.
            let task = spawn(spec, &id, &tf_config, port, profiler)?;
            out.tf_configs.push(tf_config);
            out.tasks.push(task);
        }
        Ok(out)
    }

    /// The tasks, in start order.
    pub fn task_ids(&self) -> Vec<TaskId> {
        self.tasks.iter().map(|t| t.id.clone()).collect()
    }

    /// The `TF_CONFIG` task `i` (start order) was given.
    pub fn tf_config(&self, i: usize) -> &str {
        &self.tf_configs[i]
    }

    /// Each task's profiler server address (`127.0.0.1:port`), in start order, when the
    /// launch gave ports ([`LaunchSpec::profile_ports`]).
    pub fn profiler_addresses(&self) -> Vec<(TaskId, String)> {
        self.tasks
            .iter()
            .filter_map(|t| Some((t.id.clone(), t.profiler_address.clone()?)))
            .collect()
    }

    /// The operating system's process id of task `i`.
    pub fn pid(&self, i: usize) -> u32 {
        self.tasks[i].child.id()
    }

    /// Kills task `i` at once (SIGKILL: what a lost machine looks like to its peers), with
    /// the processes it started.
    pub fn kill(&mut self, i: usize) -> Result<()> {
        let t = &mut self.tasks[i];
        kill_group(&mut t.child).map_err(|e| Error::io(format!("killing {}", t.id), &e))?;
        let _ = t.child.wait();
        Ok(())
    }

    /// Starts task `i` again with the same `TF_CONFIG` (killing it first if it still
    /// runs): a lost machine coming back. Its output starts afresh. Its ports are bound
    /// again here and handed over as at the start (an error names one another process
    /// took since the task died).
    pub fn restart(&mut self, i: usize) -> Result<()> {
        if poll(&mut self.tasks[i])?.is_none() {
            self.kill(i)?;
        }
        let id = self.tasks[i].id.clone();
        let port = ReservedPort::bind(&self.tasks[i].address)?;
        let profiler = self.tasks[i]
            .profiler_address
            .as_deref()
            .map(ReservedPort::bind)
            .transpose()?;
        let task = spawn(&self.spec, &id, &self.tf_configs[i], port, profiler)?;
        let old = std::mem::replace(&mut self.tasks[i], task);
        for r in old.relays {
            let _ = r.join();
        }
        Ok(())
    }

    /// What task `i` printed so far (stdout and stderr, interleaved as read).
    pub fn output(&self, i: usize) -> String {
        self.tasks[i]
            .output
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .clone()
    }

    /// The exit code of task `i` if it has exited.
    pub fn try_code(&mut self, i: usize) -> Result<Option<i32>> {
        poll(&mut self.tasks[i])
    }

    /// Waits until every task but the parameter servers has exited, or one fails (then the
    /// others are killed), or `limit` passes (then every task is killed and the error says
    /// which were still running). Parameter servers are stopped at the end.
    pub fn wait(&mut self, limit: Option<Duration>) -> Result<LaunchOutcome> {
        let start = Instant::now();
        let mut first_failure = None;
        loop {
            let mut running = vec![];
            for t in &mut self.tasks {
                match poll(t)? {
                    Some(0) => {}
                    Some(code) => {
                        if first_failure.is_none() {
                            first_failure = Some((t.id.clone(), code));
                        }
                    }
                    None if t.id.task_type == "ps" => {}
                    None => running.push(t.id.to_string()),
                }
            }
            if running.is_empty() || first_failure.is_some() {
                break;
            }
            if let Some(limit) = limit.filter(|l| start.elapsed() > *l) {
                self.stop_all();
                return Err(Error::Unavailable {
                    op: "launch".into(),
                    peer: running.join(", "),
                    msg: format!("still running after {limit:?}; every task was stopped"),
                });
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        self.stop_all();
        Ok(LaunchOutcome {
            codes: self.tasks.iter().map(|t| (t.id.clone(), t.code)).collect(),
            first_failure,
        })
    }

    /// Kills every task still running (with the processes it started) and reads what is
    /// left of their output (for at most a second each: a process that escaped its group
    /// may hold a pipe open).
    fn stop_all(&mut self) {
        for t in &mut self.tasks {
            if poll(t).ok().flatten().is_none() {
                let _ = kill_group(&mut t.child);
                let _ = t.child.wait();
            }
        }
        for t in &mut self.tasks {
            let deadline = Instant::now() + Duration::from_secs(1);
            for r in t.relays.drain(..) {
                while !r.is_finished() && Instant::now() < deadline {
                    std::thread::sleep(Duration::from_millis(5));
                }
                if r.is_finished() {
                    let _ = r.join();
                }
            }
        }
    }
}

impl Drop for LocalCluster {
    fn drop(&mut self) {
        self.stop_all();
    }
}

/// Kills a task and every process in its process group (it leads one; see `spawn`).
fn kill_group(child: &mut Child) -> std::io::Result<()> {
    #[cfg(unix)]
    {
        // SAFETY: kill(2) with a negative pid signals the process group the task leads.
        let rc = unsafe { libc::kill(-(child.id() as libc::pid_t), libc::SIGKILL) };
        if rc == 0 {
            return Ok(());
        }
    }
    child.kill()
}

/// The task's exit code once it has exited (`-1` for a signal).
fn poll(t: &mut Task) -> Result<Option<i32>> {
    if t.code.is_none() {
        if let Some(status) = t
            .child
            .try_wait()
            .map_err(|e| Error::io(format!("waiting for {}", t.id), &e))?
        {
            t.code = Some(status.code().unwrap_or(-1));
        }
    }
    Ok(t.code)
}

/// Starts task `id`, handing it `port` (its `TF_CONFIG` address) and `profiler` (its
/// profiler server's port) listening, or closed first ([`LaunchSpec::release_ports`]).
fn spawn(
    spec: &LaunchSpec,
    id: &TaskId,
    tf_config: &str,
    port: ReservedPort,
    profiler: Option<ReservedPort>,
) -> Result<Task> {
    let mut cmd = Command::new(&spec.program);
    cmd.args(&spec.args).env("TF_CONFIG", tf_config);
    if let Some(p) = &profiler {
        cmd.env(PROFILER_PORT_ENV, p.port().to_string());
    }
    let address = port.address().to_string();
    let profiler_address = profiler.as_ref().map(|p| p.address().to_string());
    let handed: Vec<ReservedPort> = std::iter::once(port).chain(profiler).collect();
    if spec.release_ports {
        drop(handed);
    } else {
        crate::hand_over(&mut cmd, &handed.iter().collect::<Vec<_>>());
    }
    cmd.envs(spec.env.iter().map(|(k, v)| (k.as_str(), v.as_str())))
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
    #[cfg(unix)]
    {
        use std::os::unix::process::CommandExt;
        // Each task leads its own process group, so stopping it stops what it started.
        cmd.process_group(0);
    }
    #[cfg(target_os = "linux")]
    {
        use std::os::unix::process::CommandExt;
        // SAFETY: the closure only calls prctl, which is async-signal-safe.
        unsafe {
            cmd.pre_exec(|| {
                libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGKILL);
                Ok(())
            });
        }
    }
    let mut child = cmd
        .spawn()
        .map_err(|e| Error::io(format!("starting {} for {id}", spec.program), &e))?;
    let output = Arc::new(Mutex::new(String::new()));
    let name = format!("{}:{}", id.task_type, id.index);
    let mut relays = vec![];
    if let Some(s) = child.stdout.take() {
        relays.push(relay(s, name.clone(), output.clone(), spec.echo, false));
    }
    if let Some(s) = child.stderr.take() {
        relays.push(relay(s, name, output.clone(), spec.echo, true));
    }
    Ok(Task {
        id: id.clone(),
        address,
        profiler_address,
        child,
        output,
        relays,
        code: None,
    })
}

/// Reads a task's stream line by line into `output`, echoing `[name] line` when asked.
fn relay(
    stream: impl Read + Send + 'static,
    name: String,
    output: Arc<Mutex<String>>,
    echo: bool,
    to_stderr: bool,
) -> JoinHandle<()> {
    std::thread::spawn(move || {
        let mut reader = BufReader::new(stream);
        let mut line = Vec::new();
        while reader.read_until(b'\n', &mut line).unwrap_or(0) > 0 {
            let text = String::from_utf8_lossy(&line);
            if echo {
                let prefixed = format!("[{name}] {}", text.trim_end_matches('\n'));
                if to_stderr {
                    let _ = writeln!(std::io::stderr(), "{prefixed}");
                } else {
                    let _ = writeln!(std::io::stdout(), "{prefixed}");
                }
            }
            output
                .lock()
                .unwrap_or_else(|e| e.into_inner())
                .push_str(&text);
            line.clear();
        }
    })
}
