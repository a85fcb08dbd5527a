//! Reads ferroflow's (and TensorFlow's) profile and event files back, checking every CRC
//! and every metadata reference: the tests use it, and `ferroflow profile summarize`.

use crate::proto::event::{event, summary, Event};
use crate::proto::xplane::{x_stat, XSpace};
use ferroflow_data::tfrecord::{Compression, TfRecordReader};
use ferroflow_tensor::{Error, Result};
use prost::Message;
use std::path::{Path, PathBuf};

/// Reads an `.xplane.pb` and checks that every event and stat names metadata its plane
/// has (and every `ref_value` a stat-metadata entry). Errors name the plane, line and
/// event.
pub fn read_xspace(path: impl AsRef<Path>) -> Result<XSpace> {
    let path = path.as_ref();
    let bytes = std::fs::read(path).map_err(|e| Error::io(path, &e))?;
    let what = path.display().to_string();
    let space = XSpace::decode(bytes.as_slice())
        .map_err(|e| Error::format(&what, format!("not an XSpace protobuf: {e}")))?;
    for (pi, plane) in space.planes.iter().enumerate() {
        let bad =
            |msg: String| Error::format(&what, format!("plane {pi} ({:?}): {msg}", plane.name));
        let check_stats = |stats: &[crate::proto::xplane::XStat], at: &str| -> Result<()> {
            for (si, s) in stats.iter().enumerate() {
                if !plane.stat_metadata.contains_key(&s.metadata_id) {
                    return Err(bad(format!(
                        "{at} stat {si} names stat metadata {} that the plane does not have",
                        s.metadata_id
                    )));
                }
                if let Some(x_stat::Value::RefValue(r)) = s.value {
                    if !plane.stat_metadata.contains_key(&(r as i64)) {
                        return Err(bad(format!(
                            "{at} stat {si} refers to stat metadata {r} that the plane does not have"
                        )));
                    }
                }
            }
            Ok(())
        };
        check_stats(&plane.stats, "the plane's")?;
        for (id, m) in &plane.event_metadata {
            if *id != m.id {
                return Err(bad(format!(
                    "event metadata under key {id} has id {}",
                    m.id
                )));
            }
        }
        for (li, line) in plane.lines.iter().enumerate() {
            for (ei, e) in line.events.iter().enumerate() {
                if !plane.event_metadata.contains_key(&e.metadata_id) {
                    return Err(bad(format!(
                        "line {li} ({:?}) event {ei} names event metadata {} that the plane does not have",
                        line.name, e.metadata_id
                    )));
                }
                if e.duration_ps < 0 {
                    return Err(bad(format!("line {li} event {ei} has a negative duration")));
                }
                check_stats(&e.stats, &format!("line {li} event {ei}"))?;
            }
        }
    }
    Ok(space)
}

/// The newest profile run under `<logdir>/plugins/profile/` (or, for a Keras log folder,
/// under `<logdir>/train/plugins/profile/`) and its `.xplane.pb` files.
pub fn latest_profile(logdir: impl AsRef<Path>) -> Result<(PathBuf, Vec<PathBuf>)> {
    let mut dir = logdir.as_ref().join("plugins").join("profile");
    if !dir.is_dir() && logdir.as_ref().join("train/plugins/profile").is_dir() {
        dir = logdir.as_ref().join("train/plugins/profile");
    }
    let mut runs: Vec<PathBuf> = std::fs::read_dir(&dir)
        .map_err(|e| Error::io(&dir, &e))?
        .filter_map(|e| e.ok().map(|e| e.path()))
        .filter(|p| p.is_dir())
        .collect();
    runs.sort();
    let run = runs.pop().ok_or_else(|| {
        Error::format(
            dir.display().to_string(),
            "no profile runs here (profile something first)",
        )
    })?;
    let planes = run_planes(&run)?;
    Ok((run, planes))
}

/// The `.xplane.pb` files of a profile run folder (one per host), sorted; an error when it
/// has none.
pub(crate) fn run_planes(run: &Path) -> Result<Vec<PathBuf>> {
    let mut planes: Vec<PathBuf> = std::fs::read_dir(run)
        .map_err(|e| Error::io(run, &e))?
        .filter_map(|e| e.ok().map(|e| e.path()))
        .filter(|p| p.to_string_lossy().ends_with(".xplane.pb"))
        .collect();
    planes.sort();
    if planes.is_empty() {
        return Err(Error::format(
            run.display().to_string(),
            "the run has no .xplane.pb file",
        ));
    }
    Ok(planes)
}

/// The events of a run's files, in file order.
#[derive(Debug, Clone, Default)]
pub struct EventLog {
    /// Each event with the file it came from.
    pub events: Vec<(PathBuf, Event)>,
}

impl EventLog {
    /// `(step, value)` of every scalar with `tag` (TF 2.x tensor scalars and old
    /// `simple_value`s), in file order.
    pub fn scalars(&self, tag: &str) -> Vec<(i64, f64)> {
        let mut out = Vec::new();
        for (_, e) in &self.events {
            let Some(event::What::Summary(s)) = &e.what else {
                continue;
            };
            for v in s.value.iter().filter(|v| v.tag == tag) {
                match &v.value {
                    Some(summary::value::Value::SimpleValue(x)) => out.push((e.step, *x as f64)),
                    Some(summary::value::Value::Tensor(t)) => {
                        if let Some(x) = t.float_val.first() {
                            out.push((e.step, *x as f64));
                        } else if let Some(x) = t.double_val.first() {
                            out.push((e.step, *x));
                        } else if t.tensor_content.len() == 4 {
                            let b: [u8; 4] = t.tensor_content[..].try_into().unwrap_or([0; 4]);
                            out.push((e.step, f32::from_le_bytes(b) as f64));
                        }
                    }
                    _ => {}
                }
            }
        }
        out
    }

    /// Every tag with summaries, sorted, once each.
    pub fn tags(&self) -> Vec<String> {
        let mut tags: Vec<String> = self
            .events
            .iter()
            .filter_map(|(_, e)| match &e.what {
                Some(event::What::Summary(s)) => Some(s.value.iter().map(|v| v.tag.clone())),
                _ => None,
            })
            .flatten()
            .collect();
        tags.sort();
        tags.dedup();
        tags
    }
}

/// Reads one event file, checking each record's CRCs and decoding each `Event`; errors
/// name the record index and byte offset.
pub fn read_event_file(path: impl AsRef<Path>) -> Result<Vec<Event>> {
    let path = path.as_ref();
    let mut out = Vec::new();
    let mut offset = 0u64;
    for (index, record) in TfRecordReader::open(path, Compression::None)?.enumerate() {
        let record = record?;
        let event = Event::decode(record.as_slice()).map_err(|e| {
            Error::format(
                path.display().to_string(),
                format!("record {index} at byte {offset}: not an Event protobuf: {e}"),
            )
        })?;
        offset += 16 + record.len() as u64;
        out.push(event);
    }
    Ok(out)
}

/// The folders under `logdir` (itself included, three levels deep) that hold event files:
/// TensorBoard's runs.
pub fn event_runs(logdir: impl AsRef<Path>) -> Vec<PathBuf> {
    fn walk(dir: &Path, depth: usize, out: &mut Vec<PathBuf>) {
        let Ok(entries) = std::fs::read_dir(dir) else {
            return;
        };
        let mut has_events = false;
        let mut subdirs = Vec::new();
        for e in entries.flatten() {
            let p = e.path();
            if p.is_dir() {
                subdirs.push(p);
            } else if e
                .file_name()
                .to_string_lossy()
                .starts_with("events.out.tfevents.")
            {
                has_events = true;
            }
        }
        if has_events {
            out.push(dir.to_path_buf());
        }
        if depth < 3 {
            subdirs.sort();
            for d in subdirs {
                walk(&d, depth + 1, out);
            }
        }
    }
    let mut out = Vec::new();
    walk(logdir.as_ref(), 0, &mut out);
    out
}

/// Reads every `events.out.tfevents.*` file directly in `dir`, in name order.
pub fn read_event_files(dir: impl AsRef<Path>) -> Result<EventLog> {
    let dir = dir.as_ref();
    let mut files: Vec<PathBuf> = std::fs::read_dir(dir)
        .map_err(|e| Error::io(dir, &e))?
        .filter_map(|e| e.ok().map(|e| e.path()))
        .filter(|p| {
            p.file_name()
                .is_some_and(|n| n.to_string_lossy().starts_with("events.out.tfevents."))
        })
        .collect();
    files.sort();
    let mut log = EventLog::default();
    for f in files {
        for e in read_event_file(&f)? {
            log.events.push((f.clone(), e));
        }
    }
    Ok(log)
}
