//! [`ClusterResolver`]: where a cluster description comes from; `TF_CONFIG` and one given
//! in code.

use crate::spec::{ClusterSpec, TaskId};
use ferroflow_tensor::{Error, Result};
use serde_json::Value;

/// A source of the cluster and of this process's place in it
/// (`tf.distribute.cluster_resolver.ClusterResolver`).
pub trait ClusterResolver {
    /// The cluster (empty for a single local process).
    fn cluster_spec(&self) -> Result<ClusterSpec>;
    /// This process's task, when it is one of the cluster's.
    fn task(&self) -> Option<TaskId>;
    /// The RPC protocol named by the description (`"grpc"`), if any.
    fn rpc_layer(&self) -> Option<String> {
        None
    }
    /// The address this task serves on: its entry in the cluster.
    fn task_address(&self) -> Result<Option<String>> {
        let spec = self.cluster_spec()?;
        Ok(self
            .task()
            .and_then(|t| spec.task_address(&t.task_type, t.index).map(str::to_string)))
    }
}

/// A cluster given in code (`SimpleClusterResolver`).
///
/// ```
/// use ferroflow_cluster::{ClusterResolver, ClusterSpec, SimpleClusterResolver, TaskId};
/// let spec = ClusterSpec::new([("worker", vec!["localhost:2222".to_string()])])?;
/// let r = SimpleClusterResolver::new(spec, Some(TaskId::new("worker", 0)))?;
/// assert_eq!(r.task_address()?.as_deref(), Some("localhost:2222"));
/// # Ok::<(), ferroflow_tensor::Error>(())
/// ```
#[derive(Debug, Clone)]
pub struct SimpleClusterResolver {
    spec: ClusterSpec,
    task: Option<TaskId>,
    rpc_layer: Option<String>,
}

impl SimpleClusterResolver {
    /// `spec` with this process as `task` (checked to be one of the cluster's tasks).
    pub fn new(spec: ClusterSpec, task: Option<TaskId>) -> Result<SimpleClusterResolver> {
        if let Some(t) = &task {
            check_task(&spec, t, "task")?;
        }
        Ok(SimpleClusterResolver {
            spec,
            task,
            rpc_layer: None,
        })
    }
    /// Names the RPC protocol (`"grpc"`).
    pub fn with_rpc_layer(mut self, rpc_layer: impl Into<String>) -> Self {
        self.rpc_layer = Some(rpc_layer.into());
        self
    }
}

impl ClusterResolver for SimpleClusterResolver {
    fn cluster_spec(&self) -> Result<ClusterSpec> {
        Ok(self.spec.clone())
    }
    fn task(&self) -> Option<TaskId> {
        self.task.clone()
    }
    fn rpc_layer(&self) -> Option<String> {
        self.rpc_layer.clone()
    }
}

/// Checks that `task` is a task of `spec`; an evaluator may stand outside the cluster, as
/// in TF (it evaluates checkpoints and takes no part in training).
fn check_task(spec: &ClusterSpec, task: &TaskId, what: &str) -> Result<()> {
    let job = &task.task_type;
    let n = spec.num_tasks(job);
    if n == 0 {
        if job == "evaluator" {
            return Ok(());
        }
        let jobs = spec.jobs();
        return Err(Error::format(
            "TF_CONFIG",
            if jobs.is_empty() {
                format!("{what}.type is {job:?} but the cluster is empty (set \"cluster\")")
            } else {
                format!(
                    "{what}.type {job:?} is not a job of the cluster (jobs: {})",
                    jobs.join(", ")
                )
            },
        ));
    }
    if spec.task_address(job, task.index).is_none() {
        let indices = spec.task_indices(job);
        return Err(Error::format(
            "TF_CONFIG",
            if indices.iter().copied().eq(0..n) {
                format!(
                    "{what}.index {} is out of range: cluster.{job} has {n} task{}",
                    task.index,
                    if n == 1 { "" } else { "s" }
                )
            } else {
                format!(
                    "{what}.index {}: cluster.{job} has no such task (its indices: {indices:?})",
                    task.index
                )
            },
        ));
    }
    Ok(())
}

/// The cluster from the `TF_CONFIG` environment variable, verbatim
/// (`TFConfigClusterResolver`): `{"cluster": {job: [addresses] or {index: address}},
/// "task": {"type": job, "index": i}, "rpc_layer": "grpc", "environment": ...}`. Unset or
/// empty, it is a single local process (an empty cluster, no task).
///
/// ```
/// use ferroflow_cluster::{ClusterResolver, TfConfigClusterResolver};
/// let e = TfConfigClusterResolver::from_json(
///     r#"{"cluster": {"worker": ["a:1", "b:1"]}, "task": {"type": "worker", "index": 2}}"#,
/// )
/// .unwrap_err()
/// .to_string();
/// assert_eq!(e, "TF_CONFIG: task.index 2 is out of range: cluster.worker has 2 tasks");
/// ```
#[derive(Debug, Clone)]
pub struct TfConfigClusterResolver {
    /// What TF_CONFIG says, checked.
    resolved: SimpleClusterResolver,
}

impl TfConfigClusterResolver {
    /// Reads `TF_CONFIG` from the environment.
    pub fn from_env() -> Result<TfConfigClusterResolver> {
        match std::env::var("TF_CONFIG") {
            Ok(text) => TfConfigClusterResolver::from_json(&text),
            Err(std::env::VarError::NotPresent) => TfConfigClusterResolver::from_json(""),
            Err(std::env::VarError::NotUnicode(_)) => Err(Error::format(
                "TF_CONFIG",
                "the variable is not valid UTF-8",
            )),
        }
    }

    /// Reads a TF_CONFIG text (empty or whitespace: a single local process).
    pub fn from_json(text: &str) -> Result<TfConfigClusterResolver> {
        if text.trim().is_empty() {
            return Ok(TfConfigClusterResolver {
                resolved: SimpleClusterResolver::new(ClusterSpec::default(), None)?,
            });
        }
        let v: Value = serde_json::from_str(text)
            .map_err(|e| Error::format("TF_CONFIG", format!("not valid JSON: {e}")))?;
        let top = v
            .as_object()
            .ok_or_else(|| Error::format("TF_CONFIG", format!("must be a JSON object, got {v}")))?;
        const FIELDS: [&str; 4] = ["cluster", "task", "rpc_layer", "environment"];
        if let Some(k) = top.keys().find(|k| !FIELDS.contains(&k.as_str())) {
            return Err(Error::format(
                "TF_CONFIG",
                format!("unknown field {k:?} (expected {})", FIELDS.join(", ")),
            ));
        }
        let spec = match top.get("cluster") {
            None | Some(Value::Null) => ClusterSpec::default(),
            Some(c) => ClusterSpec::from_json(c, "cluster")?,
        };
        let task = match top.get("task") {
            None | Some(Value::Null) => None,
            Some(t) => Some(task_of(t)?),
        };
        let mut resolved = SimpleClusterResolver::new(spec, task)?;
        resolved.rpc_layer = match top.get("rpc_layer") {
            None | Some(Value::Null) => None,
            Some(Value::String(s)) => Some(s.clone()),
            Some(other) => {
                return Err(Error::format(
                    "TF_CONFIG",
                    format!("rpc_layer must be a string, got {other}"),
                ))
            }
        };
        Ok(TfConfigClusterResolver { resolved })
    }
}

/// Reads TF_CONFIG's `task` object.
fn task_of(v: &Value) -> Result<TaskId> {
    let t = v.as_object().ok_or_else(|| {
        Error::format(
            "TF_CONFIG",
            format!("task must be an object {{\"type\": ..., \"index\": ...}}, got {v}"),
        )
    })?;
    if let Some(k) = t.keys().find(|k| !["type", "index"].contains(&k.as_str())) {
        return Err(Error::format(
            "TF_CONFIG",
            format!("task: unknown field {k:?} (expected type, index)"),
        ));
    }
    let task_type = match t.get("type") {
        Some(Value::String(s)) if !s.is_empty() => s.clone(),
        Some(other) => {
            return Err(Error::format(
                "TF_CONFIG",
                format!("task.type must be a job name, got {other}"),
            ))
        }
        None => return Err(Error::format("TF_CONFIG", "task.type is missing")),
    };
    let index = match t.get("index") {
        // TF reads the index as an int; a string of digits is accepted as TF's int() would.
        Some(Value::Number(n)) => n.as_u64(),
        Some(Value::String(s)) => s.parse::<u64>().ok(),
        None => Some(0), // TF's default
        Some(_) => None,
    }
    .and_then(|i| usize::try_from(i).ok())
    .ok_or_else(|| {
        Error::format(
            "TF_CONFIG",
            format!(
                "task.index must be a non-negative integer, got {}",
                t["index"]
            ),
        )
    })?;
    Ok(TaskId { task_type, index })
}

impl ClusterResolver for TfConfigClusterResolver {
    fn cluster_spec(&self) -> Result<ClusterSpec> {
        self.resolved.cluster_spec()
    }
    fn task(&self) -> Option<TaskId> {
        self.resolved.task()
    }
    fn rpc_layer(&self) -> Option<String> {
        self.resolved.rpc_layer()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn err(text: &str) -> String {
        match TfConfigClusterResolver::from_json(text) {
            Ok(r) => panic!("accepted {text}: {r:?}"),
            Err(e) => e.to_string(),
        }
    }

    #[test]
    fn a_kubeflow_tf_config_reads_as_tensorflow_reads_it() {
        let text = r#"{"cluster": {"chief": ["job-chief-0.ns.svc:2222"],
            "worker": ["job-worker-0.ns.svc:2222", "job-worker-1.ns.svc:2222"],
            "ps": ["10.0.0.7:2222"]},
            "task": {"type": "worker", "index": 1}, "environment": "cloud", "rpc_layer": "grpc"}"#;
        let r = TfConfigClusterResolver::from_json(text).unwrap();
        let spec = r.cluster_spec().unwrap();
        assert_eq!(spec.jobs(), vec!["chief", "ps", "worker"]);
        assert_eq!(spec.num_tasks("worker"), 2);
        assert_eq!(r.task(), Some(TaskId::new("worker", 1)));
        assert_eq!(
            r.task_address().unwrap().as_deref(),
            Some("job-worker-1.ns.svc:2222")
        );
        assert_eq!(r.rpc_layer().as_deref(), Some("grpc"));
        // The JSON form round-trips.
        let again = ClusterSpec::from_json(&spec.to_json(), "cluster").unwrap();
        assert_eq!(again, spec);
    }

    #[test]
    fn unset_or_empty_is_a_single_local_process() {
        for text in ["", "  ", "{}", r#"{"cluster": {}}"#] {
            let r = TfConfigClusterResolver::from_json(text).unwrap();
            assert!(r.cluster_spec().unwrap().is_empty(), "{text}");
            assert_eq!(r.task(), None);
            assert_eq!(r.task_address().unwrap(), None);
        }
    }

    #[test]
    fn sparse_jobs_and_ipv6_addresses() {
        let r = TfConfigClusterResolver::from_json(
            r#"{"cluster": {"worker": {"0": "[::1]:2222", "3": "[::1]:2223"}},
                "task": {"type": "worker", "index": "3"}}"#,
        )
        .unwrap();
        assert_eq!(r.task_address().unwrap().as_deref(), Some("[::1]:2223"));
        let e = err(
            r#"{"cluster": {"worker": {"0": "a:1", "3": "b:1"}}, "task": {"type": "worker", "index": 1}}"#,
        );
        assert_eq!(
            e,
            "TF_CONFIG: task.index 1: cluster.worker has no such task (its indices: [0, 3])"
        );
    }

    #[test]
    fn an_evaluator_may_stand_outside_the_cluster() {
        let r = TfConfigClusterResolver::from_json(
            r#"{"cluster": {"worker": ["a:1"]}, "task": {"type": "evaluator", "index": 0}}"#,
        )
        .unwrap();
        assert_eq!(r.task_address().unwrap(), None);
    }

    /// Each malformed or inconsistent TF_CONFIG is refused with the field it is about.
    #[test]
    fn malformed_configs_are_errors_naming_the_field() {
        let cases = [
            ("{", "not valid JSON"),
            ("[1]", "must be a JSON object"),
            (r#"{"clsuter": {}}"#, "unknown field \"clsuter\""),
            (r#"{"cluster": []}"#, "cluster must be an object of jobs"),
            (
                r#"{"cluster": {"worker": "a:1"}}"#,
                "cluster.worker must be a list",
            ),
            (
                r#"{"cluster": {"worker": [1]}}"#,
                "cluster.worker[0] must be a \"host:port\" string",
            ),
            (
                r#"{"cluster": {"worker": ["a"]}}"#,
                "cluster.worker[0]: address \"a\" has no port",
            ),
            (
                r#"{"cluster": {"worker": ["a:0"]}}"#,
                "port \"0\" is not in 1..=65535",
            ),
            (r#"{"cluster": {"worker": ["a:99999"]}}"#, "port \"99999\""),
            (
                r#"{"cluster": {"worker": ["a b:1"]}}"#,
                "is not a host name",
            ),
            (
                r#"{"cluster": {"worker": {"x": "a:1"}}}"#,
                "cluster.worker: task index \"x\"",
            ),
            (
                r#"{"cluster": {"worker": ["a:1", "a:1"]}}"#,
                "cluster.worker[1]: address a:1 is also cluster.worker[0]",
            ),
            (
                r#"{"cluster": {"ps": ["a:1"], "worker": ["a:1"]}}"#,
                "cluster.worker[0]: address a:1 is also cluster.ps[0]",
            ),
            (
                r#"{"cluster": {"chief": ["a:1", "b:1"]}}"#,
                "cluster.chief has 2 tasks",
            ),
            (
                r#"{"cluster": {"wor-ker": ["a:1"]}}"#,
                "job name \"wor-ker\"",
            ),
            (
                r#"{"task": {"type": "worker", "index": 0}}"#,
                "task.type is \"worker\" but the cluster is empty",
            ),
            (
                r#"{"cluster": {"worker": ["a:1"]}, "task": {"type": "ps", "index": 0}}"#,
                "task.type \"ps\" is not a job of the cluster (jobs: worker)",
            ),
            (
                r#"{"cluster": {"worker": ["a:1"]}, "task": {"type": "worker", "index": 1}}"#,
                "task.index 1 is out of range: cluster.worker has 1 task",
            ),
            (
                r#"{"cluster": {"worker": ["a:1"]}, "task": {"type": "worker", "index": -1}}"#,
                "task.index must be a non-negative integer, got -1",
            ),
            (
                r#"{"cluster": {"worker": ["a:1"]}, "task": {"index": 0}}"#,
                "task.type is missing",
            ),
            (
                r#"{"cluster": {"worker": ["a:1"]}, "task": {"type": "worker", "idx": 0}}"#,
                "task: unknown field \"idx\"",
            ),
            (
                r#"{"cluster": {"worker": ["a:1"]}, "task": "worker"}"#,
                "task must be an object",
            ),
            (
                r#"{"cluster": {"worker": ["a:1"]}, "rpc_layer": 1}"#,
                "rpc_layer must be a string",
            ),
        ];
        for (text, want) in cases {
            let e = err(text);
            assert!(e.starts_with("TF_CONFIG: "), "{e}");
            assert!(e.contains(want), "{text}: {e:?} does not say {want:?}");
        }
    }

    #[test]
    fn from_env_reads_tf_config() {
        // The only test that touches the variable (tests run on threads of one process).
        std::env::set_var(
            "TF_CONFIG",
            r#"{"cluster": {"worker": ["localhost:1234"]}, "task": {"type": "worker", "index": 0}}"#,
        );
        let r = TfConfigClusterResolver::from_env();
        std::env::remove_var("TF_CONFIG");
        assert_eq!(
            r.unwrap().task_address().unwrap().as_deref(),
            Some("localhost:1234")
        );
    }
}
