//! [`ClusterSpec`] and [`TaskId`].

use ferroflow_tensor::{Error, Result};
use serde_json::{json, Map, Value};
use std::collections::BTreeMap;
use std::fmt;

/// The tasks of a cluster by job (`tf.train.ClusterSpec`): for each job name, its tasks'
/// addresses by task index. Indices may be sparse, as TF allows (`{"worker": {"1": ...}}`).
///
/// ```
/// use ferroflow_cluster::ClusterSpec;
/// let spec = ClusterSpec::from_json(
///     &serde_json::json!({"worker": ["a:1", "b:1"], "ps": {"1": "c:1"}}),
///     "cluster",
/// )?;
/// assert_eq!(spec.job_tasks("worker"), vec!["a:1", "b:1"]);
/// assert_eq!(spec.task_address("ps", 1), Some("c:1"));
/// assert_eq!(spec.task_address("ps", 0), None);
/// # Ok::<(), ferroflow_tensor::Error>(())
/// ```
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ClusterSpec {
    jobs: BTreeMap<String, BTreeMap<usize, String>>,
}

impl ClusterSpec {
    /// A cluster of dense jobs: `(job, addresses)`; each address is checked
    /// ([`check_address`]), and an address may appear only once in the cluster.
    pub fn new<'a>(jobs: impl IntoIterator<Item = (&'a str, Vec<String>)>) -> Result<ClusterSpec> {
        let mut spec = ClusterSpec::default();
        for (job, addresses) in jobs {
            let tasks = addresses.into_iter().enumerate().collect();
            spec.insert_job("cluster", job, tasks)?;
        }
        Ok(spec)
    }

    /// Reads the `cluster` object of a TF_CONFIG (`what` names it in errors): each job a
    /// list of addresses, or an object from task index to address.
    pub fn from_json(v: &Value, what: &str) -> Result<ClusterSpec> {
        let jobs = v.as_object().ok_or_else(|| {
            Error::format(
                "TF_CONFIG",
                format!("{what} must be an object of jobs, got {v}"),
            )
        })?;
        let mut spec = ClusterSpec::default();
        for (job, tasks) in jobs {
            let field = format!("{what}.{job}");
            let tasks: BTreeMap<usize, String> = match tasks {
                Value::Array(list) => list
                    .iter()
                    .enumerate()
                    .map(|(i, a)| Ok((i, address_of(a, &format!("{field}[{i}]"))?)))
                    .collect::<Result<_>>()?,
                Value::Object(map) => map
                    .iter()
                    .map(|(k, a)| {
                        let i = k.parse::<usize>().map_err(|_| {
                            Error::format(
                                "TF_CONFIG",
                                format!("{field}: task index {k:?} is not a non-negative integer"),
                            )
                        })?;
                        Ok((i, address_of(a, &format!("{field}.{k}"))?))
                    })
                    .collect::<Result<_>>()?,
                other => {
                    return Err(Error::format(
                        "TF_CONFIG",
                        format!("{field} must be a list of addresses or an object from task index to address, got {other}"),
                    ))
                }
            };
            spec.insert_job(what, job, tasks)?;
        }
        Ok(spec)
    }

    fn insert_job(&mut self, what: &str, job: &str, tasks: BTreeMap<usize, String>) -> Result<()> {
        if job.is_empty() || !job.chars().all(|c| c.is_ascii_alphanumeric() || c == '_') {
            return Err(Error::format(
                "TF_CONFIG",
                format!("{what}: job name {job:?} must be letters, digits and underscores"),
            ));
        }
        if self.jobs.contains_key(job) {
            return Err(Error::format(
                "TF_CONFIG",
                format!("{what}: job {job:?} appears twice"),
            ));
        }
        for (i, a) in &tasks {
            check_address(a)
                .map_err(|msg| Error::format("TF_CONFIG", format!("{what}.{job}[{i}]: {msg}")))?;
            if let Some((other_job, other_index)) = self.find(a) {
                return Err(Error::format(
                    "TF_CONFIG",
                    format!(
                        "{what}.{job}[{i}]: address {a} is also {what}.{other_job}[{other_index}]"
                    ),
                ));
            }
            if let Some((j, _)) = tasks.iter().find(|(j, b)| *j < i && *b == a) {
                return Err(Error::format(
                    "TF_CONFIG",
                    format!("{what}.{job}[{i}]: address {a} is also {what}.{job}[{j}]"),
                ));
            }
        }
        if job == "chief" && tasks.len() > 1 {
            return Err(Error::format(
                "TF_CONFIG",
                format!(
                    "{what}.chief has {} tasks; a cluster has at most one chief",
                    tasks.len()
                ),
            ));
        }
        self.jobs.insert(job.to_string(), tasks);
        Ok(())
    }

    /// The job and index of the task at `address`.
    fn find(&self, address: &str) -> Option<(&str, usize)> {
        self.jobs.iter().find_map(|(job, tasks)| {
            tasks
                .iter()
                .find(|(_, a)| a.as_str() == address)
                .map(|(i, _)| (job.as_str(), *i))
        })
    }

    /// The job names, sorted.
    pub fn jobs(&self) -> Vec<&str> {
        self.jobs.keys().map(String::as_str).collect()
    }
    /// Whether the cluster has no task (a single local process).
    pub fn is_empty(&self) -> bool {
        self.jobs.values().all(BTreeMap::is_empty)
    }
    /// How many tasks `job` has (0 when the cluster has no such job).
    pub fn num_tasks(&self, job: &str) -> usize {
        self.jobs.get(job).map_or(0, BTreeMap::len)
    }
    /// The task indices of `job`, ascending.
    pub fn task_indices(&self, job: &str) -> Vec<usize> {
        self.jobs
            .get(job)
            .map_or(vec![], |t| t.keys().copied().collect())
    }
    /// The addresses of `job`'s tasks in index order.
    pub fn job_tasks(&self, job: &str) -> Vec<&str> {
        self.jobs
            .get(job)
            .map_or(vec![], |t| t.values().map(String::as_str).collect())
    }
    /// The address of task `index` of `job`.
    pub fn task_address(&self, job: &str, index: usize) -> Option<&str> {
        self.jobs.get(job)?.get(&index).map(String::as_str)
    }
    /// The cluster as TF_CONFIG's `cluster` object (dense jobs as lists, sparse ones as
    /// objects).
    pub fn to_json(&self) -> Value {
        let mut m = Map::new();
        for (job, tasks) in &self.jobs {
            let dense = tasks.keys().copied().eq(0..tasks.len());
            let v = if dense {
                json!(tasks.values().collect::<Vec<_>>())
            } else {
                Value::Object(
                    tasks
                        .iter()
                        .map(|(i, a)| (i.to_string(), json!(a)))
                        .collect(),
                )
            };
            m.insert(job.clone(), v);
        }
        Value::Object(m)
    }
}

fn address_of(v: &Value, field: &str) -> Result<String> {
    v.as_str().map(str::to_string).ok_or_else(|| {
        Error::format(
            "TF_CONFIG",
            format!("{field} must be a \"host:port\" string, got {v}"),
        )
    })
}

/// Checks a task address: `host:port` with a port in 1..=65535 and a host name, an IPv4
/// address or a bracketed IPv6 address (`[::1]:2222`). Returns what is wrong.
pub fn check_address(address: &str) -> std::result::Result<(), String> {
    let (host, port) = address
        .rsplit_once(':')
        .ok_or_else(|| format!("address {address:?} has no port (expected \"host:port\")"))?;
    match port.parse::<u16>() {
        Ok(p) if p > 0 => {}
        _ => {
            return Err(format!(
                "address {address:?}: port {port:?} is not in 1..=65535"
            ))
        }
    }
    let host_ok = if let Some(inner) = host.strip_prefix('[') {
        inner
            .strip_suffix(']')
            .is_some_and(|ip| ip.parse::<std::net::Ipv6Addr>().is_ok())
    } else {
        !host.is_empty()
            && host
                .chars()
                .all(|c| c.is_ascii_alphanumeric() || c == '.' || c == '-' || c == '_')
    };
    if host_ok {
        Ok(())
    } else {
        Err(format!(
            "address {address:?}: {host:?} is not a host name or IP address"
        ))
    }
}

/// One task of a cluster: its job and index (`/job:worker/task:1`).
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct TaskId {
    /// The job (`"chief"`, `"worker"`, `"ps"`, `"evaluator"`, ...).
    pub task_type: String,
    /// The index within the job.
    pub index: usize,
}

impl TaskId {
    /// Task `index` of `task_type`.
    pub fn new(task_type: impl Into<String>, index: usize) -> TaskId {
        TaskId {
            task_type: task_type.into(),
            index,
        }
    }
}

impl fmt::Display for TaskId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "/job:{}/task:{}", self.task_type, self.index)
    }
}
