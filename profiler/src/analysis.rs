//! What a profile says, computed from its XSpace (ours or TensorFlow's): the step-time
//! breakdown, the op table by self time, and the memory timeline. The HTML report and
//! `ferroflow profile summarize` print these.

use crate::export::{offset_ps, stat_text, HOST_PLANE};
use crate::proto::xplane::{XPlane, XSpace};
use ferroflow_tensor::trace::{COLLECTIVE_OP_TYPES, INPUT_SPAN, PEER_WAIT_SPAN};
use std::collections::HashMap;

/// One training step (an event with a `step_num` stat, as [`crate::Trace`] writes it).
#[derive(Debug, Clone, PartialEq)]
pub struct StepBreakdown {
    /// The step's name and number (`train 3`).
    pub name: String,
    /// Its `step_num`.
    pub step_num: i64,
    /// Wall time of the step, microseconds.
    pub total_us: f64,
    /// Time waiting for input (`IteratorGetNext` spans in the step), microseconds.
    pub input_us: f64,
    /// Time in ops (self time of dispatched ops in the step, outside input and
    /// collectives), microseconds.
    pub compute_us: f64,
    /// Time in collectives (the distribution crate's all-reduce, all-gather, broadcast
    /// spans, [`ferroflow_tensor::trace::COLLECTIVE_OP_TYPES`]), microseconds.
    pub communication_us: f64,
    /// The part of `communication_us` spent waiting for peers' messages
    /// ([`ferroflow_tensor::trace::PEER_WAIT_SPAN`]); the rest is transfer (sending,
    /// copying, adding).
    pub communication_wait_us: f64,
    /// The rest of the step (host code between ops: framework and user code): `total_us`
    /// is `input_us + compute_us + communication_us + other_us`.
    pub other_us: f64,
    /// Time after the step before the next step on its thread began (callbacks, logging,
    /// the end of an epoch), microseconds; 0 for the last step.
    pub idle_us: f64,
}

/// One row of the op table.
#[derive(Debug, Clone, PartialEq)]
pub struct OpRow {
    /// Where the time was spent: `Host`, or a device plane (`/device:GPU:0`) for kernels
    /// timed on the device (TF's "Host/device" column).
    pub host_or_device: String,
    /// TF's op type (`MatMul`).
    pub op_type: String,
    /// The full name (`sequential/dense/MatMul`).
    pub name: String,
    /// How many times it ran.
    pub count: u64,
    /// Total time, microseconds.
    pub total_us: f64,
    /// Total self time (nested ops excluded), microseconds.
    pub self_us: f64,
    /// Estimated FLOPs over all runs.
    pub flops: u64,
    /// Bytes read and written over all runs.
    pub bytes: u64,
}

impl OpRow {
    fn new(host_or_device: &str, op_type: &str, name: &str) -> OpRow {
        OpRow {
            host_or_device: host_or_device.to_string(),
            op_type: op_type.to_string(),
            name: name.to_string(),
            count: 0,
            total_us: 0.0,
            self_us: 0.0,
            flops: 0,
            bytes: 0,
        }
    }
}

/// Memory in use on one allocator over time.
#[derive(Debug, Clone, PartialEq)]
pub struct MemoryTimeline {
    /// `cpu`, `gpu_0`.
    pub allocator: String,
    /// (microseconds since the profile began, bytes in use), in time order.
    pub points: Vec<(f64, u64)>,
    /// The most bytes in use.
    pub peak_bytes: u64,
    /// The op whose allocation reached the peak, when known.
    pub peak_op: Option<String>,
}

/// Everything the report shows.
#[derive(Debug, Clone, PartialEq, Default)]
pub struct ProfileSummary {
    /// Steps in time order.
    pub steps: Vec<StepBreakdown>,
    /// Ops by descending self time.
    pub ops: Vec<OpRow>,
    /// One timeline per allocator.
    pub memory: Vec<MemoryTimeline>,
}

struct Span {
    start: i64,
    end: i64,
    meta: i64,
    stats: Vec<(String, String)>,
}

fn stat_map(plane: &XPlane, stats: &[crate::proto::xplane::XStat]) -> Vec<(String, String)> {
    stats
        .iter()
        .filter_map(|s| {
            let name = plane.stat_metadata.get(&s.metadata_id)?.name.clone();
            Some((name, stat_text(plane, s)))
        })
        .collect()
}

fn get<'a>(stats: &'a [(String, String)], key: &str) -> Option<&'a str> {
    stats
        .iter()
        .find(|(k, _)| k == key)
        .map(|(_, v)| v.as_str())
}

/// An op event's name is `scope/Type:Type` (TF's `name:type`); `None` for other events.
fn op_name_and_type(name: &str) -> Option<(&str, &str)> {
    let (full, ty) = name.rsplit_once(':')?;
    let ok = ty
        .chars()
        .next()
        .is_some_and(|c| c.is_ascii_uppercase() || c == '_')
        && ty.chars().all(|c| c.is_ascii_alphanumeric() || c == '_');
    ok.then_some((full, ty))
}

/// Summarizes the host plane of `space`.
pub fn summarize(space: &XSpace) -> ProfileSummary {
    let Some(plane) = space.planes.iter().find(|p| p.name == HOST_PLANE) else {
        return ProfileSummary::default();
    };
    // Times relative to the earliest line, in picoseconds (saturating: a hostile file
    // cannot overflow them).
    let origin_ns = plane
        .lines
        .iter()
        .map(|l| l.timestamp_ns)
        .min()
        .unwrap_or(0);
    let mut steps = Vec::new();
    let mut ops: HashMap<String, OpRow> = HashMap::new();
    let mut memory: HashMap<String, MemoryTimeline> = HashMap::new();
    for line in &plane.lines {
        let base = line
            .timestamp_ns
            .saturating_sub(origin_ns)
            .saturating_mul(1000);
        let mut spans: Vec<Span> = line
            .events
            .iter()
            .map(|e| Span {
                start: base.saturating_add(offset_ps(e)),
                end: base
                    .saturating_add(offset_ps(e))
                    .saturating_add(e.duration_ps.max(0)),
                meta: e.metadata_id,
                stats: stat_map(plane, &e.stats),
            })
            .collect();
        spans.sort_by_key(|s| (s.start, std::cmp::Reverse(s.end)));
        let name_of = |s: &Span| {
            plane
                .event_metadata
                .get(&s.meta)
                .map_or("", |m| m.name.as_str())
        };
        // Self time of op events: their duration minus nested op events on the same line.
        let mut self_ps: Vec<i64> = spans.iter().map(|s| s.end - s.start).collect();
        let mut stack: Vec<usize> = Vec::new();
        for (i, s) in spans.iter().enumerate() {
            if op_name_and_type(name_of(s)).is_none() {
                continue;
            }
            while stack.last().is_some_and(|&j| spans[j].end <= s.start) {
                stack.pop();
            }
            if let Some(&parent) = stack.last() {
                self_ps[parent] -= s.end.min(spans[parent].end) - s.start;
            }
            stack.push(i);
        }
        for (i, s) in spans.iter().enumerate() {
            let name = name_of(s);
            if let Some((full, ty)) = op_name_and_type(name) {
                let row = ops
                    .entry(full.to_string())
                    .or_insert_with(|| OpRow::new("Host", ty, full));
                row.count += 1;
                row.total_us += (s.end - s.start) as f64 / 1e6;
                row.self_us += self_ps[i].max(0) as f64 / 1e6;
                row.flops += get(&s.stats, "flops")
                    .and_then(|v| v.parse().ok())
                    .unwrap_or(0);
                row.bytes += get(&s.stats, "bytes_accessed")
                    .and_then(|v| v.parse().ok())
                    .unwrap_or(0);
            } else if name == "MemoryAllocation" || name == "MemoryDeallocation" {
                let allocator = get(&s.stats, "allocator_name").unwrap_or("cpu").to_string();
                let in_use: u64 = get(&s.stats, "bytes_allocated")
                    .and_then(|v| v.parse().ok())
                    .unwrap_or(0);
                let t = memory
                    .entry(allocator.clone())
                    .or_insert_with(|| MemoryTimeline {
                        allocator,
                        points: Vec::new(),
                        peak_bytes: 0,
                        peak_op: None,
                    });
                t.points.push((s.start as f64 / 1e6, in_use));
                if in_use > t.peak_bytes {
                    t.peak_bytes = in_use;
                    t.peak_op = get(&s.stats, "tf_op").map(str::to_string);
                }
            }
        }
        // Steps: root events with a step number; input, compute and communication are the
        // spans inside.
        let first_step = steps.len();
        // (start, end) of this line's steps, microseconds, in the order they are pushed.
        let mut step_bounds: Vec<(f64, f64)> = Vec::new();
        for (i, s) in spans.iter().enumerate() {
            let Some(step_num) = get(&s.stats, "step_num").and_then(|v| v.parse::<i64>().ok())
            else {
                continue;
            };
            let inside = |o: &Span| o.start >= s.start && o.end <= s.end;
            // Spans are sorted by start: the step's children follow it.
            let children = || {
                spans[i + 1..]
                    .iter()
                    .enumerate()
                    .map(move |(k, o)| (i + 1 + k, o))
                    .take_while(|(_, o)| o.start < s.end)
                    .filter(|(_, o)| inside(o))
            };
            let within =
                |set: &[(i64, i64)], o: &Span| set.iter().any(|&(a, b)| o.start >= a && o.end <= b);
            // Outermost input and collective spans (nested ones are counted by their parent).
            let mut input_spans: Vec<(i64, i64)> = Vec::new();
            let mut collective_spans: Vec<(i64, i64)> = Vec::new();
            for (_, o) in children() {
                let n = name_of(o);
                if n.starts_with(INPUT_SPAN) && !within(&input_spans, o) {
                    input_spans.push((o.start, o.end));
                } else if op_name_and_type(n)
                    .is_some_and(|(_, ty)| COLLECTIVE_OP_TYPES.contains(&ty))
                    && !within(&input_spans, o)
                    && !within(&collective_spans, o)
                {
                    collective_spans.push((o.start, o.end));
                }
            }
            let length = |set: &[(i64, i64)]| set.iter().map(|(a, b)| b - a).sum::<i64>();
            let input = length(&input_spans);
            let communication = length(&collective_spans);
            let mut compute = 0i64;
            let mut wait_spans: Vec<(i64, i64)> = Vec::new();
            for (j, o) in children() {
                let n = name_of(o);
                if n == PEER_WAIT_SPAN {
                    if within(&collective_spans, o) && !within(&wait_spans, o) {
                        wait_spans.push((o.start, o.end));
                    }
                    continue;
                }
                if op_name_and_type(n).is_none()
                    || within(&input_spans, o)
                    || within(&collective_spans, o)
                {
                    continue;
                }
                compute += self_ps[j].max(0);
            }
            let total = s.end - s.start;
            let compute = compute.min((total - input - communication).max(0));
            let other = (total - input - compute - communication).max(0);
            steps.push(StepBreakdown {
                name: format!("{} {step_num}", name_of(s)),
                step_num,
                total_us: total as f64 / 1e6,
                input_us: input as f64 / 1e6,
                compute_us: compute as f64 / 1e6,
                communication_us: communication as f64 / 1e6,
                communication_wait_us: length(&wait_spans).min(communication) as f64 / 1e6,
                other_us: other as f64 / 1e6,
                idle_us: 0.0,
            });
            step_bounds.push((s.start as f64 / 1e6, s.end as f64 / 1e6));
        }
        // Idle: from each step's end to the next step's start on this line.
        let line_steps = &mut steps[first_step..];
        for (k, step) in line_steps.iter_mut().enumerate() {
            if let (Some(this), Some(next)) = (step_bounds.get(k), step_bounds.get(k + 1)) {
                step.idle_us = (next.0 - this.1).max(0.0);
            }
        }
    }
    steps.sort_by_key(|s| s.step_num);
    let mut ops: Vec<OpRow> = ops.into_values().collect();
    // Kernels timed on a device: one row per op type and device.
    for plane in space
        .planes
        .iter()
        .filter(|p| p.name.starts_with("/device:"))
    {
        let mut rows: HashMap<&str, OpRow> = HashMap::new();
        for e in plane.lines.iter().flat_map(|l| &l.events) {
            let Some(meta) = plane.event_metadata.get(&e.metadata_id) else {
                continue;
            };
            let row = rows
                .entry(meta.name.as_str())
                .or_insert_with(|| OpRow::new(&plane.name, &meta.name, &meta.name));
            row.count += 1;
            row.total_us += e.duration_ps.max(0) as f64 / 1e6;
            row.self_us += e.duration_ps.max(0) as f64 / 1e6;
        }
        ops.extend(rows.into_values());
    }
    ops.sort_by(|a, b| b.self_us.total_cmp(&a.self_us));
    let mut memory: Vec<MemoryTimeline> = memory.into_values().collect();
    for m in &mut memory {
        m.points.sort_by(|a, b| a.0.total_cmp(&b.0));
    }
    memory.sort_by(|a, b| a.allocator.cmp(&b.allocator));
    ProfileSummary { steps, ops, memory }
}
