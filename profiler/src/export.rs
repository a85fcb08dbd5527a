//! Writes a recording as TensorFlow writes a profile: `<host>.xplane.pb` (XSpace, with TF's
//! plane, event and stat names, so TensorBoard's profile tools read it) and
//! `<host>.trace.json.gz` (Chrome trace events) under `<logdir>/plugins/profile/<run>/`.

use crate::names::{tf_datatype, tf_op_type_of_name};
use crate::proto::xplane::{
    x_event, x_stat, XEvent, XEventMetadata, XLine, XPlane, XSpace, XStat, XStatMetadata,
};
use crate::session::{ProfileFiles, RawKind, ThreadEvents};
use ferroflow_tensor::fs::write_atomic;
use ferroflow_tensor::trace::StatValue;
use ferroflow_tensor::{Device, DeviceKind, Error, Result};
use prost::Message;
use std::collections::HashMap;
use std::io::Write;
use std::path::{Path, PathBuf};
use std::sync::Arc;

/// TF's name of the host plane.
pub const HOST_PLANE: &str = "/host:CPU";
/// TF's name of the plane with the session's start/stop times.
pub const TASK_ENVIRONMENT_PLANE: &str = "Task Environment";

/// What a session recorded, handed from [`crate::stop`] to the writers.
pub(crate) struct Recording {
    threads: Vec<Arc<ThreadEvents>>,
    begin_wall_ns: u64,
    end_ns: u64,
    live_at_start: Vec<(Device, u64)>,
}

impl Recording {
    pub(crate) fn from_threads(
        threads: Vec<Arc<ThreadEvents>>,
        begin_wall_ns: u64,
        end_ns: u64,
        live_at_start: Vec<(Device, u64)>,
    ) -> Recording {
        Recording {
            threads,
            begin_wall_ns,
            end_ns,
            live_at_start,
        }
    }

    /// Whether nothing was recorded (TF's `empty_trace`).
    pub(crate) fn is_empty(&self) -> bool {
        self.threads
            .iter()
            .all(|t| t.events.lock().map_or(true, |e| e.is_empty()))
    }
}

/// The allocator name TF's memory profile groups by: `cpu`, `gpu_0`.
pub fn allocator_name(device: Device) -> String {
    match device.kind() {
        DeviceKind::Cpu => "cpu".to_string(),
        DeviceKind::Gpu => format!("gpu_{}", device.index()),
    }
}

/// A kernel timed on a device: (start ns since the session began, duration ns, op type).
type DeviceKernel = (u64, u64, &'static str);

/// TF's plane name for a device: `/device:GPU:0`.
pub fn device_plane_name(device: Device) -> String {
    device.to_string()
}

/// `name`'s id in `ids` (the next one, from 1, when new) and whether it is new.
fn intern(ids: &mut HashMap<String, i64>, name: &str) -> (i64, bool) {
    if let Some(&id) = ids.get(name) {
        return (id, false);
    }
    let id = ids.len() as i64 + 1;
    ids.insert(name.to_string(), id);
    (id, true)
}

/// Interns event and stat metadata of one plane (ids from 1, as TF's XPlaneBuilder).
struct PlaneBuilder {
    plane: XPlane,
    events: HashMap<String, i64>,
    stats: HashMap<String, i64>,
}

impl PlaneBuilder {
    fn new(id: i64, name: &str) -> PlaneBuilder {
        PlaneBuilder {
            plane: XPlane {
                id,
                name: name.to_string(),
                ..Default::default()
            },
            events: HashMap::new(),
            stats: HashMap::new(),
        }
    }

    fn event_metadata(&mut self, name: &str, display_name: &str) -> i64 {
        let (id, new) = intern(&mut self.events, name);
        if new {
            let m = XEventMetadata {
                id,
                name: name.to_string(),
                display_name: display_name.to_string(),
                ..Default::default()
            };
            self.plane.event_metadata.insert(id, m);
        }
        id
    }

    fn stat_metadata(&mut self, name: &str) -> i64 {
        let (id, new) = intern(&mut self.stats, name);
        if new {
            let m = XStatMetadata {
                id,
                name: name.to_string(),
                description: String::new(),
            };
            self.plane.stat_metadata.insert(id, m);
        }
        id
    }

    fn stat(&mut self, name: &str, value: x_stat::Value) -> XStat {
        XStat {
            metadata_id: self.stat_metadata(name),
            value: Some(value),
        }
    }

    /// A string stat stored once as stat metadata and referenced (TF's `ref_value`).
    fn ref_stat(&mut self, name: &str, value: &str) -> XStat {
        let target = self.stat_metadata(value) as u64;
        self.stat(name, x_stat::Value::RefValue(target))
    }

    fn value_stat(&mut self, name: &str, value: &StatValue) -> XStat {
        let v = match value {
            StatValue::I64(v) => x_stat::Value::Int64Value(*v),
            StatValue::U64(v) => x_stat::Value::Uint64Value(*v),
            StatValue::F64(v) => x_stat::Value::DoubleValue(*v),
            StatValue::Str(s) => x_stat::Value::StrValue(s.to_string()),
        };
        self.stat(name, v)
    }
}

fn shape_string(shape: &[usize]) -> String {
    let dims: Vec<String> = shape.iter().map(|d| d.to_string()).collect();
    format!("[{}]", dims.join(","))
}

/// The XSpace of a recording: the host plane (a line per thread with its ops, annotations
/// and memory events) and the task-environment plane.
pub(crate) fn to_xspace(rec: &Recording, host: &str) -> XSpace {
    let mut b = PlaneBuilder::new(0, HOST_PLANE);
    // Memory events are replayed in time order across threads for the running peak.
    let mut peak: HashMap<Device, u64> = rec.live_at_start.iter().copied().collect();
    let mut memory_order: Vec<(u64, usize, usize)> = Vec::new();
    let threads: Vec<Vec<crate::session::RawEvent>> = rec
        .threads
        .iter()
        .map(|t| {
            // The session has stopped: the events are taken, not copied.
            let mut events =
                std::mem::take(&mut *t.events.lock().unwrap_or_else(|e| e.into_inner()));
            events.sort_by_key(|e| (e.start_ns, std::cmp::Reverse(e.duration_ns)));
            events
        })
        .collect();
    for (ti, events) in threads.iter().enumerate() {
        for (ei, e) in events.iter().enumerate() {
            if matches!(e.kind, RawKind::Memory { .. }) {
                memory_order.push((e.start_ns, ti, ei));
            }
        }
    }
    memory_order.sort_unstable();
    let mut peak_at: HashMap<(usize, usize), u64> = HashMap::new();
    for &(_, ti, ei) in &memory_order {
        if let RawKind::Memory {
            device,
            bytes_in_use,
            ..
        } = &threads[ti][ei].kind
        {
            let p = peak.entry(*device).or_insert(0);
            *p = (*p).max(*bytes_in_use);
            peak_at.insert((ti, ei), *p);
        }
    }

    let mut device_events: HashMap<Device, Vec<DeviceKernel>> = HashMap::new();
    for (ti, (thread, events)) in rec.threads.iter().zip(&threads).enumerate() {
        let mut line = XLine {
            id: thread.id as i64,
            display_id: 0,
            name: thread.name.clone(),
            display_name: thread.name.clone(),
            timestamp_ns: rec.begin_wall_ns as i64,
            duration_ps: 0,
            events: Vec::with_capacity(events.len()),
        };
        for (ei, e) in events.iter().enumerate() {
            if let RawKind::Device { op_type, device } = &e.kind {
                device_events.entry(*device).or_default().push((
                    e.start_ns,
                    e.duration_ns,
                    *op_type,
                ));
                continue;
            }
            let (metadata_id, stats) = match &e.kind {
                RawKind::Op {
                    op_type,
                    scope,
                    device,
                    input_shapes,
                    input_dtypes,
                    flops,
                    bytes_accessed,
                } => {
                    let name = if scope.is_empty() {
                        format!("{op_type}:{op_type}")
                    } else {
                        format!("{scope}/{op_type}:{op_type}")
                    };
                    let id = b.event_metadata(&name, op_type);
                    let mut stats = vec![
                        b.ref_stat("device", &device.to_string()),
                        b.ref_stat("input_shapes", input_shapes),
                        b.ref_stat("input_dtypes", input_dtypes),
                        b.stat("flops", x_stat::Value::Uint64Value(*flops)),
                        b.stat(
                            "bytes_accessed",
                            x_stat::Value::Uint64Value(*bytes_accessed),
                        ),
                    ];
                    if device.kind() != DeviceKind::Cpu {
                        stats.push(b.ref_stat("timing", "host-side launch (no device timestamps)"));
                    }
                    (id, stats)
                }
                RawKind::Host { name, stats } => {
                    let id = b.event_metadata(name, "");
                    let stats = stats.iter().map(|(k, v)| b.value_stat(k, v)).collect();
                    (id, stats)
                }
                RawKind::Device { .. } => continue,
                RawKind::Memory {
                    allocation,
                    bytes,
                    address,
                    device,
                    bytes_in_use,
                    op,
                    tensor,
                } => {
                    let name = if *allocation {
                        "MemoryAllocation"
                    } else {
                        "MemoryDeallocation"
                    };
                    let id = b.event_metadata(name, "");
                    let peak = peak_at.get(&(ti, ei)).copied().unwrap_or(*bytes_in_use);
                    let mut stats = vec![
                        b.ref_stat("allocator_name", &allocator_name(*device)),
                        b.stat("bytes_reserved", x_stat::Value::Int64Value(0)),
                        b.stat(
                            "bytes_allocated",
                            x_stat::Value::Int64Value(*bytes_in_use as i64),
                        ),
                        b.stat("bytes_available", x_stat::Value::Int64Value(0)),
                        b.stat("fragmentation", x_stat::Value::DoubleValue(0.0)),
                        b.stat("peak_bytes_in_use", x_stat::Value::Int64Value(peak as i64)),
                        b.stat("requested_bytes", x_stat::Value::Int64Value(*bytes as i64)),
                        b.stat("allocation_bytes", x_stat::Value::Int64Value(*bytes as i64)),
                        b.stat("addr", x_stat::Value::Int64Value(*address as i64)),
                    ];
                    if let Some(op) = op {
                        stats.push(b.ref_stat("tf_op", tf_op_type_of_name(op)));
                    }
                    if *allocation {
                        stats.push(b.ref_stat("region_type", "output"));
                    }
                    match tensor {
                        Some((dtype, shape)) => {
                            stats.push(b.stat(
                                "data_type",
                                x_stat::Value::Int64Value(tf_datatype(*dtype) as i64),
                            ));
                            stats.push(b.ref_stat("shape", &shape_string(shape)));
                        }
                        None => stats.push(b.stat("data_type", x_stat::Value::Int64Value(0))),
                    }
                    (id, stats)
                }
            };
            line.events.push(XEvent {
                metadata_id,
                data: Some(x_event::Data::OffsetPs(e.start_ns as i64 * 1000)),
                duration_ps: e.duration_ns as i64 * 1000,
                stats,
            });
        }
        line.duration_ps = span_ps(&line);
        b.plane.lines.push(line);
    }

    // One plane per device whose kernels were timed on the device (TF's `/device:GPU:0`),
    // one line: the queue the backend submits to.
    let mut devices: Vec<(Device, Vec<DeviceKernel>)> = device_events.into_iter().collect();
    devices.sort_by_key(|(d, _)| d.index());
    let mut device_planes = Vec::new();
    for (pi, (device, mut events)) in devices.into_iter().enumerate() {
        events.sort_unstable();
        let mut d = PlaneBuilder::new(pi as i64 + 1, &device_plane_name(device));
        let mut line = XLine {
            id: 0,
            display_id: 0,
            name: "Stream #0(Compute)".into(),
            display_name: "Stream #0(Compute)".into(),
            timestamp_ns: rec.begin_wall_ns as i64,
            duration_ps: 0,
            events: Vec::with_capacity(events.len()),
        };
        for (start_ns, duration_ns, op_type) in events {
            let metadata_id = d.event_metadata(op_type, op_type);
            let stats = vec![
                d.ref_stat("tf_op", &format!("{op_type}:{op_type}")),
                d.ref_stat("timing", "device timestamps"),
            ];
            line.events.push(XEvent {
                metadata_id,
                data: Some(x_event::Data::OffsetPs(start_ns as i64 * 1000)),
                duration_ps: duration_ns as i64 * 1000,
                stats,
            });
        }
        line.duration_ps = span_ps(&line);
        d.plane.lines.push(line);
        device_planes.push(d.plane);
    }

    let mut env = PlaneBuilder::new(0, TASK_ENVIRONMENT_PLANE);
    let start = env.stat(
        "profile_start_time",
        x_stat::Value::Uint64Value(rec.begin_wall_ns),
    );
    let stop = env.stat(
        "profile_stop_time",
        x_stat::Value::Uint64Value(rec.begin_wall_ns + rec.end_ns),
    );
    env.plane.stats = vec![start, stop];

    let mut planes = vec![b.plane];
    planes.extend(device_planes);
    planes.push(env.plane);
    XSpace {
        planes,
        errors: vec![],
        warnings: vec![],
        hostnames: vec![host.to_string()],
    }
}

/// A line's length: the end of its last event, in picoseconds from its timestamp.
fn span_ps(line: &XLine) -> i64 {
    line.events
        .iter()
        .map(|e| offset_ps(e) + e.duration_ps)
        .max()
        .unwrap_or(0)
}

/// An event's offset from its line's timestamp, in picoseconds.
pub(crate) fn offset_ps(e: &XEvent) -> i64 {
    match e.data {
        Some(x_event::Data::OffsetPs(o)) => o,
        _ => 0,
    }
}

/// The value of a stat as text (references resolved through the plane's stat metadata).
pub(crate) fn stat_text(plane: &XPlane, stat: &XStat) -> String {
    match &stat.value {
        Some(x_stat::Value::DoubleValue(v)) => v.to_string(),
        Some(x_stat::Value::Uint64Value(v)) => v.to_string(),
        Some(x_stat::Value::Int64Value(v)) => v.to_string(),
        Some(x_stat::Value::StrValue(s)) => s.clone(),
        Some(x_stat::Value::BytesValue(b)) => format!("<{} bytes>", b.len()),
        Some(x_stat::Value::RefValue(r)) => plane
            .stat_metadata
            .get(&(*r as i64))
            .map_or_else(String::new, |m| m.name.clone()),
        None => String::new(),
    }
}

/// Chrome trace-event JSON of an XSpace (Perfetto and chrome://tracing open it): a
/// process per plane, a thread per line, complete (`X`) events with their stats as args,
/// and the memory in use per allocator as counter (`C`) events.
pub fn chrome_trace_json(space: &XSpace) -> String {
    let mut out: Vec<serde_json::Value> = Vec::new();
    for (pid, plane) in space.planes.iter().enumerate() {
        if plane.lines.is_empty() {
            continue;
        }
        out.push(
            serde_json::json!({"ph": "M", "name": "process_name", "pid": pid,
            "args": {"name": plane.name}}),
        );
        for line in &plane.lines {
            out.push(
                serde_json::json!({"ph": "M", "name": "thread_name", "pid": pid,
                "tid": line.id, "args": {"name": line.name}}),
            );
            for e in &line.events {
                let Some(meta) = plane.event_metadata.get(&e.metadata_id) else {
                    continue;
                };
                let ts_us = (line.timestamp_ns as f64) / 1e3 + offset_ps(e) as f64 / 1e6;
                let mut args = serde_json::Map::new();
                for s in &e.stats {
                    if let Some(m) = plane.stat_metadata.get(&s.metadata_id) {
                        args.insert(m.name.clone(), stat_text(plane, s).into());
                    }
                }
                if meta.name.starts_with("Memory") {
                    let allocator = args
                        .get("allocator_name")
                        .and_then(|v| v.as_str())
                        .unwrap_or("memory")
                        .to_string();
                    let in_use: f64 = args
                        .get("bytes_allocated")
                        .and_then(|v| v.as_str())
                        .and_then(|s| s.parse().ok())
                        .unwrap_or(0.0);
                    out.push(serde_json::json!({"ph": "C", "pid": pid, "ts": ts_us,
                        "name": format!("memory {allocator}"), "args": {"bytes in use": in_use}}));
                    continue;
                }
                out.push(serde_json::json!({"ph": "X", "pid": pid, "tid": line.id,
                    "ts": ts_us, "dur": e.duration_ps as f64 / 1e6, "name": meta.name,
                    "args": args}));
            }
        }
    }
    serde_json::json!({"displayTimeUnit": "ns", "traceEvents": out}).to_string()
}

/// This machine's host name (as TF names profile files), `localhost` when unknown.
pub fn hostname() -> String {
    std::fs::read_to_string("/proc/sys/kernel/hostname")
        .ok()
        .or_else(|| std::env::var("HOSTNAME").ok())
        .or_else(|| std::env::var("COMPUTERNAME").ok())
        .map(|h| h.trim().to_string())
        .filter(|h| !h.is_empty() && !h.contains(['/', '\\']))
        .unwrap_or_else(|| "localhost".to_string())
}

/// A wall-clock time as TF names profile runs: `2026_12_01_23_01_27` (UTC).
pub(crate) fn utc_timestamp(wall_ns: u64) -> String {
    let secs = (wall_ns / 1_000_000_000) as i64;
    let (y, mo, d) = civil_from_days(secs.div_euclid(86_400));
    let t = secs.rem_euclid(86_400);
    format!(
        "{y:04}_{mo:02}_{d:02}_{:02}_{:02}_{:02}",
        t / 3600,
        t / 60 % 60,
        t % 60
    )
}

/// A run folder name as TF makes them (`2026_12_01_23_01_27`, UTC), unique in `dir`.
fn run_name(dir: &Path, wall_ns: u64) -> String {
    let base = utc_timestamp(wall_ns);
    let mut name = base.clone();
    let mut n = 1;
    while dir.join(&name).exists() {
        name = format!("{base}_{n}");
        n += 1;
    }
    name
}

/// (year, month, day) of a count of days since 1970-01-01 (Howard Hinnant's algorithm).
fn civil_from_days(z: i64) -> (i64, u32, u32) {
    let z = z + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z.rem_euclid(146_097);
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let d = (doy - (153 * mp + 2) / 5 + 1) as u32;
    let m = if mp < 10 { mp + 3 } else { mp - 9 } as u32;
    (yoe + era * 400 + i64::from(m <= 2), m, d)
}

/// Writes the recording's files (each crash-safe: temporary file, fsync, rename).
pub(crate) fn write_profile(logdir: &Path, rec: &Recording) -> Result<ProfileFiles> {
    let host = hostname();
    let space = to_xspace(rec, &host);
    let run_dir = new_run_dir(logdir, rec.begin_wall_ns)?;
    write_run_files(&run_dir, &host, &space)
}

/// Creates `<logdir>/plugins/profile/<run>/` for a profile that began at `wall_ns`.
pub(crate) fn new_run_dir(logdir: &Path, wall_ns: u64) -> Result<PathBuf> {
    let profile_dir = logdir.join("plugins").join("profile");
    std::fs::create_dir_all(&profile_dir).map_err(|e| Error::io(&profile_dir, &e))?;
    let run_dir = profile_dir.join(run_name(&profile_dir, wall_ns));
    std::fs::create_dir_all(&run_dir).map_err(|e| Error::io(&run_dir, &e))?;
    Ok(run_dir)
}

/// Writes `<host>.xplane.pb` (`space` as encoded) and `<host>.trace.json.gz` into `run_dir`
/// (each crash-safe: temporary file, fsync, rename).
pub(crate) fn write_run_files(run_dir: &Path, host: &str, space: &XSpace) -> Result<ProfileFiles> {
    let xplane = run_dir.join(format!("{host}.xplane.pb"));
    write_atomic(&xplane, &space.encode_to_vec())?;
    let trace_json = run_dir.join(format!("{host}.trace.json.gz"));
    let mut gz = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::fast());
    gz.write_all(chrome_trace_json(space).as_bytes())
        .and_then(|_| gz.flush())
        .map_err(|e| Error::io(&trace_json, &e))?;
    let gz = gz.finish().map_err(|e| Error::io(&trace_json, &e))?;
    write_atomic(&trace_json, &gz)?;
    Ok(ProfileFiles {
        run_dir: run_dir.to_path_buf(),
        xplane,
        trace_json,
    })
}

#[cfg(test)]
mod tests {
    #[test]
    fn civil_dates() {
        assert_eq!(super::civil_from_days(0), (1970, 1, 1));
        // 2026-12-01 is day 20788.
        assert_eq!(super::civil_from_days(20_788), (2026, 12, 1));
        assert_eq!(super::civil_from_days(11_016), (2000, 2, 29));
    }
}
