//! [`SlurmClusterResolver`]: the cluster of a Slurm job step, as TF's `SlurmClusterResolver`
//! derives it.

use crate::resolver::ClusterResolver;
use crate::spec::{ClusterSpec, TaskId};
use ferroflow_tensor::{Error, Result};

/// The cluster of the Slurm job step this process belongs to (started by `srun`): the
/// step's nodes (`SLURM_STEP_NODELIST`, or the job's), tasks per node
/// (`SLURM_STEP_TASKS_PER_NODE`, `"2(x3),1"`), this task's rank (`SLURM_PROCID`). As in TF,
/// the tasks in node order get addresses `node:port_base + i` (`i` the task's place on its
/// node) and are dealt to the jobs in the order given: `[("ps", 1), ("worker", 3)]` makes
/// the first task `ps:0` and the next three `worker:0..3`; no jobs means every task is a
/// worker. (TF's `auto_set_gpu`, which sets `CUDA_VISIBLE_DEVICES` per task, is not done
/// here.)
///
/// ```
/// use ferroflow_cluster::{ClusterResolver, SlurmClusterResolver};
/// let env = |k: &str| match k {
///     "SLURM_PROCID" => Some("2".to_string()),
///     "SLURM_STEP_NODELIST" => Some("gpu[07-08]".to_string()),
///     "SLURM_STEP_TASKS_PER_NODE" => Some("2(x2)".to_string()),
///     _ => None,
/// };
/// let r = SlurmClusterResolver::from_vars(env, &[("ps", 1), ("worker", 3)], 8888)?;
/// assert_eq!(r.cluster_spec()?.job_tasks("worker"), ["gpu07:8889", "gpu08:8888", "gpu08:8889"]);
/// assert_eq!(r.task().unwrap().to_string(), "/job:worker/task:1");
/// # Ok::<(), ferroflow_tensor::Error>(())
/// ```
#[derive(Debug, Clone)]
pub struct SlurmClusterResolver {
    spec: ClusterSpec,
    task: TaskId,
}

impl SlurmClusterResolver {
    /// From this process's environment.
    pub fn from_env(jobs: &[(&str, usize)], port_base: u16) -> Result<SlurmClusterResolver> {
        SlurmClusterResolver::from_vars(|k| std::env::var(k).ok(), jobs, port_base)
    }

    /// From the variables `var` returns (the environment, or a test's table).
    pub fn from_vars(
        var: impl Fn(&str) -> Option<String>,
        jobs: &[(&str, usize)],
        port_base: u16,
    ) -> Result<SlurmClusterResolver> {
        let bad = |msg: String| Error::format("Slurm", msg);
        let get = |names: &[&str]| -> Result<String> {
            names.iter().find_map(|n| var(n)).ok_or_else(|| {
                bad(format!(
                    "{} is not set: not inside a Slurm job step (start the program with srun)",
                    names.join(" or ")
                ))
            })
        };
        let nodes = expand_hostlist(&get(&["SLURM_STEP_NODELIST", "SLURM_JOB_NODELIST"])?)?;
        let per_node = tasks_per_node(&get(&[
            "SLURM_STEP_TASKS_PER_NODE",
            "SLURM_TASKS_PER_NODE",
        ])?)?;
        if per_node.len() != nodes.len() {
            return Err(bad(format!(
                "the tasks per node name {} nodes, the node list {}",
                per_node.len(),
                nodes.len()
            )));
        }
        let rank_text = get(&["SLURM_PROCID"])?;
        let rank: usize = rank_text
            .trim()
            .parse()
            .map_err(|_| bad(format!("SLURM_PROCID {rank_text:?} is not a task rank")))?;
        let mut addresses = vec![];
        for (node, &n) in nodes.iter().zip(&per_node) {
            for i in 0..n {
                let port = u16::try_from(port_base as usize + i)
                    .ok()
                    .filter(|&p| p > 0)
                    .ok_or_else(|| {
                        bad(format!(
                            "port {port_base} + {i} for {node} is not a TCP port"
                        ))
                    })?;
                addresses.push(format!("{node}:{port}"));
            }
        }
        let total = addresses.len();
        if rank >= total {
            return Err(bad(format!(
                "SLURM_PROCID {rank} is out of range: the step has {total} tasks"
            )));
        }
        let all_workers = [("worker", total)];
        let jobs = if jobs.is_empty() {
            &all_workers[..]
        } else {
            jobs
        };
        let wanted: usize = jobs.iter().map(|(_, n)| n).sum();
        if wanted > total {
            return Err(bad(format!(
                "the jobs ask for {wanted} tasks, the step has {total} (srun --ntasks)"
            )));
        }
        let mut next = addresses.into_iter();
        let mut task = None;
        let mut dealt = vec![];
        let mut position = 0;
        for &(job, n) in jobs {
            let tasks: Vec<String> = next.by_ref().take(n).collect();
            if (position..position + n).contains(&rank) {
                task = Some(TaskId::new(job, rank - position));
            }
            position += n;
            dealt.push((job, tasks));
        }
        let task = task.ok_or_else(|| {
            bad(format!(
                "task {rank} has no job: the jobs take the step's first {wanted} of {total} tasks"
            ))
        })?;
        let spec = ClusterSpec::new(dealt)?;
        Ok(SlurmClusterResolver { spec, task })
    }
}

impl ClusterResolver for SlurmClusterResolver {
    fn cluster_spec(&self) -> Result<ClusterSpec> {
        Ok(self.spec.clone())
    }
    fn task(&self) -> Option<TaskId> {
        Some(self.task.clone())
    }
    fn rpc_layer(&self) -> Option<String> {
        Some("grpc".into())
    }
}

/// Slurm's tasks-per-node list: `"2(x3),1"` is `[2, 2, 2, 1]`.
fn tasks_per_node(s: &str) -> Result<Vec<usize>> {
    let bad = || {
        Error::format(
            "Slurm",
            format!("tasks per node {s:?} is not like \"2(x3),1\""),
        )
    };
    let mut out = vec![];
    for part in s.trim().split(',') {
        let (n, times) = match part.split_once("(x") {
            Some((n, rest)) => (n, rest.strip_suffix(')').ok_or_else(bad)?),
            None => (part, "1"),
        };
        let n: usize = n.parse().map_err(|_| bad())?;
        let times: usize = times.parse().map_err(|_| bad())?;
        if times > 1 << 20 {
            return Err(bad());
        }
        out.extend(std::iter::repeat_n(n, times));
    }
    Ok(out)
}

/// Expands a Slurm host list: `"node[01-03,07],gpu1"` is `node01, node02, node03, node07,
/// gpu1`; several bracket groups in one name expand as a product (`r[1-2]n[1-2]`), and a
/// range keeps its zero padding.
///
/// ```
/// assert_eq!(
///     ferroflow_cluster::expand_hostlist("node[08-10],login")?,
///     ["node08", "node09", "node10", "login"]
/// );
/// # Ok::<(), ferroflow_tensor::Error>(())
/// ```
pub fn expand_hostlist(list: &str) -> Result<Vec<String>> {
    let bad = |why: &str| Error::format("Slurm", format!("host list {list:?}: {why}"));
    // Split at the commas outside brackets.
    let mut items = vec![];
    let (mut depth, mut start) = (0usize, 0);
    for (i, c) in list.char_indices() {
        match c {
            '[' => depth += 1,
            ']' => depth = depth.checked_sub(1).ok_or_else(|| bad("unbalanced ']'"))?,
            ',' if depth == 0 => {
                items.push(&list[start..i]);
                start = i + 1;
            }
            _ => {}
        }
    }
    if depth != 0 {
        return Err(bad("unbalanced '['"));
    }
    items.push(&list[start..]);
    let mut hosts = vec![];
    for item in items.into_iter().map(str::trim).filter(|s| !s.is_empty()) {
        let mut names = vec![String::new()];
        let mut rest = item;
        while let Some(open) = rest.find('[') {
            let close = rest[open..]
                .find(']')
                .ok_or_else(|| bad("unbalanced '['"))?
                + open;
            let prefix = &rest[..open];
            let mut expanded = vec![];
            for range in rest[open + 1..close].split(',') {
                let (lo, hi) = range.split_once('-').unwrap_or((range, range));
                let (a, b) = (
                    lo.parse::<u64>()
                        .map_err(|_| bad("a range bound is not a number"))?,
                    hi.parse::<u64>()
                        .map_err(|_| bad("a range bound is not a number"))?,
                );
                if a > b || b - a > 100_000 {
                    return Err(bad("a range runs backwards or is too long"));
                }
                expanded.extend((a..=b).map(|v| format!("{prefix}{v:0width$}", width = lo.len())));
            }
            names = names
                .iter()
                .flat_map(|n| expanded.iter().map(move |e| format!("{n}{e}")))
                .collect();
            rest = &rest[close + 1..];
        }
        hosts.extend(names.into_iter().map(|n| format!("{n}{rest}")));
    }
    if hosts.is_empty() {
        return Err(bad("no hosts"));
    }
    Ok(hosts)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn vars<'a>(table: &'a [(&'a str, &'a str)]) -> impl Fn(&str) -> Option<String> + 'a {
        move |k| {
            table
                .iter()
                .find(|(n, _)| *n == k)
                .map(|(_, v)| v.to_string())
        }
    }

    #[test]
    fn host_lists_expand_as_slurm_writes_them() {
        assert_eq!(expand_hostlist("a").unwrap(), ["a"]);
        assert_eq!(
            expand_hostlist("n[1-3,5],m[09-11]").unwrap(),
            ["n1", "n2", "n3", "n5", "m09", "m10", "m11"]
        );
        assert_eq!(
            expand_hostlist("r[1-2]x[01-02].lab").unwrap(),
            ["r1x01.lab", "r1x02.lab", "r2x01.lab", "r2x02.lab"]
        );
        for bad in ["n[1-3", "n]1[", "n[3-1]", "n[a-b]", "", "n[1-999999999]"] {
            assert!(expand_hostlist(bad).is_err(), "{bad}");
        }
    }

    #[test]
    fn tasks_are_dealt_to_jobs_in_node_order() {
        let env = [
            ("SLURM_PROCID", "0"),
            ("SLURM_JOB_NODELIST", "c[1-2]"),
            ("SLURM_TASKS_PER_NODE", "1,2"),
        ];
        let r = SlurmClusterResolver::from_vars(vars(&env), &[], 2222).unwrap();
        let spec = r.cluster_spec().unwrap();
        assert_eq!(spec.job_tasks("worker"), ["c1:2222", "c2:2222", "c2:2223"]);
        assert_eq!(r.task(), Some(TaskId::new("worker", 0)));
        assert_eq!(r.task_address().unwrap().as_deref(), Some("c1:2222"));
    }

    #[test]
    fn inconsistent_steps_are_errors_naming_the_variable() {
        let base = [
            ("SLURM_PROCID", "5"),
            ("SLURM_STEP_NODELIST", "c[1-2]"),
            ("SLURM_STEP_TASKS_PER_NODE", "2(x2)"),
        ];
        let e = SlurmClusterResolver::from_vars(vars(&base), &[], 2222).unwrap_err();
        assert!(
            e.to_string().contains("SLURM_PROCID 5 is out of range"),
            "{e}"
        );
        let e = SlurmClusterResolver::from_vars(vars(&base[1..]), &[], 2222).unwrap_err();
        assert!(e.to_string().contains("SLURM_PROCID is not set"), "{e}");
        let first = [("SLURM_PROCID", "0"), base[1], base[2]];
        let e = SlurmClusterResolver::from_vars(vars(&first), &[("worker", 9)], 2222).unwrap_err();
        assert!(
            e.to_string().contains("ask for 9 tasks, the step has 4"),
            "{e}"
        );
        let odd = [
            ("SLURM_PROCID", "0"),
            ("SLURM_STEP_NODELIST", "c[1-3]"),
            ("SLURM_STEP_TASKS_PER_NODE", "2(x2)"),
        ];
        let e = SlurmClusterResolver::from_vars(vars(&odd), &[], 2222).unwrap_err();
        assert!(
            e.to_string().contains("name 2 nodes, the node list 3"),
            "{e}"
        );
        let unused = [
            ("SLURM_PROCID", "3"),
            ("SLURM_STEP_NODELIST", "c[1-2]"),
            ("SLURM_STEP_TASKS_PER_NODE", "2(x2)"),
        ];
        let e = SlurmClusterResolver::from_vars(vars(&unused), &[("worker", 2)], 2222).unwrap_err();
        assert!(e.to_string().contains("task 3 has no job"), "{e}");
    }
}
