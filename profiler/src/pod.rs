//! The Pod viewer (TF 2.4's, for multi-worker jobs): for each training step that every
//! worker's profile holds, each worker's step time split into compute, input, communication
//! (waiting for peers, and transfer), host-side and idle time, and the step's straggler:
//! the worker the others waited for. Read from a capture's run folder, one `.xplane.pb` per
//! worker ([`crate::client::trace`] writes them).

use crate::analysis::{summarize, StepBreakdown};
use crate::proto::xplane::XSpace;
use crate::reader::{read_xspace, run_planes};
use ferroflow_tensor::Result;
use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::path::Path;

/// One worker's part of one step, microseconds. `step_us` is the sum of the other fields.
#[derive(Debug, Clone, PartialEq)]
pub struct PodCell {
    /// From the step's start to the next step's start on this worker.
    pub step_us: f64,
    /// Ops outside input and collectives.
    pub compute_us: f64,
    /// Waiting for input (`IteratorGetNext`).
    pub input_us: f64,
    /// In collectives, waiting for peers' messages.
    pub communication_wait_us: f64,
    /// In collectives, the rest: sending, copying, adding.
    pub communication_transfer_us: f64,
    /// Host code between ops (framework and user code).
    pub host_us: f64,
    /// After the step, before the next one (callbacks, logging).
    pub idle_us: f64,
}

impl PodCell {
    fn of(s: &StepBreakdown) -> PodCell {
        let wait = s.communication_wait_us;
        PodCell {
            step_us: s.total_us + s.idle_us,
            compute_us: s.compute_us,
            input_us: s.input_us,
            communication_wait_us: wait,
            communication_transfer_us: (s.communication_us - wait).max(0.0),
            host_us: s.other_us,
            idle_us: s.idle_us,
        }
    }

    /// The time the worker was busy (everything but waiting for peers and idling): the
    /// straggler is the worker with the most.
    pub fn busy_us(&self) -> f64 {
        self.compute_us + self.input_us + self.communication_transfer_us + self.host_us
    }
}

/// One step on every worker.
#[derive(Debug, Clone, PartialEq)]
pub struct PodStep {
    /// The step's `step_num`.
    pub step_num: i64,
    /// Each worker's part, in the order of [`PodView::workers`].
    pub workers: Vec<PodCell>,
    /// The index (in [`PodView::workers`]) of the step's straggler.
    pub straggler: usize,
}

/// The Pod viewer's data for one capture.
#[derive(Debug, Clone, PartialEq, Default)]
pub struct PodView {
    /// The workers, by their profile's host name (`127.0.0.1_6009`).
    pub workers: Vec<String>,
    /// The steps every worker's profile has, by step number.
    pub steps: Vec<PodStep>,
}

impl PodView {
    /// The step numbered `step_num`.
    pub fn step(&self, step_num: i64) -> Option<&PodStep> {
        self.steps.iter().find(|s| s.step_num == step_num)
    }

    /// How many steps each worker was the straggler of.
    pub fn straggler_counts(&self) -> Vec<usize> {
        let mut counts = vec![0; self.workers.len()];
        for s in &self.steps {
            counts[s.straggler] += 1;
        }
        counts
    }
}

/// The Pod view of several workers' profiles, each with its host name.
pub fn pod_view_of(profiles: &[(String, XSpace)]) -> PodView {
    let per_worker: Vec<BTreeMap<i64, PodCell>> = profiles
        .iter()
        .map(|(_, space)| {
            let mut steps = BTreeMap::new();
            for s in summarize(space).steps {
                // A step number seen twice (two lines): the first.
                steps.entry(s.step_num).or_insert_with(|| PodCell::of(&s));
            }
            steps
        })
        .collect();
    let common: Vec<i64> = per_worker
        .first()
        .map(|first| {
            first
                .keys()
                .copied()
                .filter(|k| per_worker.iter().all(|w| w.contains_key(k)))
                .collect()
        })
        .unwrap_or_default();
    let steps = common
        .into_iter()
        .map(|step_num| {
            let workers: Vec<PodCell> = per_worker.iter().map(|w| w[&step_num].clone()).collect();
            let straggler = workers
                .iter()
                .enumerate()
                .max_by(|a, b| a.1.busy_us().total_cmp(&b.1.busy_us()))
                .map_or(0, |(i, _)| i);
            PodStep {
                step_num,
                workers,
                straggler,
            }
        })
        .collect();
    PodView {
        workers: profiles.iter().map(|(h, _)| h.clone()).collect(),
        steps,
    }
}

/// The Pod view of a run folder's profiles (every `<host>.xplane.pb` in it).
pub fn pod_view(run_dir: impl AsRef<Path>) -> Result<PodView> {
    let planes = run_planes(run_dir.as_ref())?;
    let profiles = planes
        .iter()
        .map(|p| {
            let name = p.file_name().map_or_else(String::new, |n| {
                n.to_string_lossy()
                    .trim_end_matches(".xplane.pb")
                    .to_string()
            });
            Ok((name, read_xspace(p)?))
        })
        .collect::<Result<Vec<_>>>()?;
    Ok(pod_view_of(&profiles))
}

/// The Pod view as a table (`ferroflow profile pod`): per step (or only `step`), a row per
/// worker in milliseconds, the straggler marked `*`, and how often each worker straggled.
pub fn pod_table(view: &PodView, step: Option<i64>) -> String {
    let mut out = String::new();
    let _ = writeln!(
        out,
        "Pod viewer: {} workers, {} steps in every profile (ms; * marks the straggler)",
        view.workers.len(),
        view.steps.len()
    );
    let width = view
        .workers
        .iter()
        .map(String::len)
        .max()
        .unwrap_or(6)
        .max(6)
        + 1;
    let _ = writeln!(
        out,
        "{:>6}  {:<width$} {:>9} {:>9} {:>9} {:>9} {:>9} {:>9} {:>9}",
        "step", "worker", "step", "compute", "input", "wait", "transfer", "host", "idle"
    );
    for s in view
        .steps
        .iter()
        .filter(|s| step.is_none_or(|n| n == s.step_num))
    {
        for (i, (worker, c)) in view.workers.iter().zip(&s.workers).enumerate() {
            let mark = if i == s.straggler { "*" } else { " " };
            let _ = writeln!(
                out,
                "{:>6}  {:<width$} {:>9.3} {:>9.3} {:>9.3} {:>9.3} {:>9.3} {:>9.3} {:>9.3}",
                if i == 0 {
                    s.step_num.to_string()
                } else {
                    String::new()
                },
                format!("{worker}{mark}"),
                c.step_us / 1e3,
                c.compute_us / 1e3,
                c.input_us / 1e3,
                c.communication_wait_us / 1e3,
                c.communication_transfer_us / 1e3,
                c.host_us / 1e3,
                c.idle_us / 1e3,
            );
        }
    }
    let counts = view.straggler_counts();
    let _ = writeln!(out, "\nStraggler of (steps):");
    for (w, n) in view.workers.iter().zip(counts) {
        let _ = writeln!(out, "  {w}: {n}");
    }
    out
}
