//! `tf.summary`: event files TensorBoard reads (scalars, histograms, text, images).
//!
//! A writer makes `<logdir>/events.out.tfevents.<secs>.<host>.<pid>.<n>.v2` and appends
//! TFRecord-framed `Event` protos (masked CRC-32C), written as TF 2.x writes them: each
//! value a `tensor` with its plugin's metadata (`scalars`, `histograms`, `text`, `images`),
//! so both of TensorBoard's loaders show them.
//!
//! Crash safety: the file is never appended in place. Every flush writes the file's whole
//! contents to a temporary sibling, fsyncs it and renames it over the file, so a crash
//! leaves the events of the last flush, never a torn record. To keep flushes cheap a file
//! is closed at 4 MiB and the next one started (TensorBoard reads every file of a run).
//!
//! ```
//! let dir = tempfile::tempdir()?;
//! let writer = ferroflow_profiler::summary::create_file_writer(dir.path())?;
//! for step in 0..3 {
//!     writer.scalar("loss", 1.0 / (step as f64 + 1.0), step)?;
//! }
//! writer.text("notes", "first run", 0)?;
//! writer.flush()?;
//! let events = ferroflow_profiler::read_event_files(dir.path())?;
//! assert_eq!(events.scalars("loss").len(), 3);
//! # Ok::<(), Box<dyn std::error::Error>>(())
//! ```

use crate::export::hostname;
use crate::proto::event::{
    event, summary, DataClass, DataType, Event, Summary, SummaryMetadata, TensorProto,
    TensorShapeProto,
};
use ferroflow_data::tfrecord::masked_crc32c;
use ferroflow_tensor::fs::write_atomic;
use ferroflow_tensor::{DType, Error, Result, Tensor};
use prost::Message;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

/// A file is closed and the next begun past this many bytes.
const ROTATE_BYTES: usize = 4 << 20;
/// Unflushed events are written at the latest this long after the last flush.
const FLUSH_EVERY: Duration = Duration::from_secs(2);

static FILE_COUNTER: AtomicU64 = AtomicU64::new(0);

struct EventFile {
    dir: PathBuf,
    path: PathBuf,
    contents: Vec<u8>,
    dirty: bool,
    last_flush: Instant,
}

fn now_secs() -> f64 {
    crate::session::wall_ns() as f64 / 1e9
}

impl EventFile {
    fn create(dir: &Path) -> Result<EventFile> {
        std::fs::create_dir_all(dir).map_err(|e| Error::io(dir, &e))?;
        let n = FILE_COUNTER.fetch_add(1, Ordering::Relaxed);
        let name = format!(
            "events.out.tfevents.{}.{}.{}.{n}.v2",
            now_secs() as u64,
            hostname(),
            std::process::id()
        );
        let mut f = EventFile {
            dir: dir.to_path_buf(),
            path: dir.join(name),
            contents: Vec::new(),
            dirty: true,
            last_flush: Instant::now(),
        };
        f.append(&Event {
            wall_time: now_secs(),
            step: 0,
            what: Some(event::What::FileVersion("brain.Event:2".into())),
        });
        // The file exists from the start (TensorBoard sees the run at once).
        f.flush()?;
        Ok(f)
    }

    fn append(&mut self, event: &Event) {
        let data = event.encode_to_vec();
        let len = (data.len() as u64).to_le_bytes();
        self.contents.extend_from_slice(&len);
        self.contents
            .extend_from_slice(&masked_crc32c(&len).to_le_bytes());
        self.contents.extend_from_slice(&data);
        self.contents
            .extend_from_slice(&masked_crc32c(&data).to_le_bytes());
        self.dirty = true;
    }

    fn flush(&mut self) -> Result<()> {
        if self.dirty {
            write_atomic(&self.path, &self.contents)?;
            self.dirty = false;
        }
        self.last_flush = Instant::now();
        if self.contents.len() >= ROTATE_BYTES {
            *self = EventFile::create(&self.dir.clone())?;
        }
        Ok(())
    }
}

/// Writes summaries into one log directory (`tf.summary.SummaryWriter`). Cheap to clone;
/// clones share the file. Dropping the last clone flushes.
#[derive(Clone)]
pub struct SummaryWriter {
    file: Arc<Mutex<EventFile>>,
}

/// Creates a writer for `logdir` (`tf.summary.create_file_writer`); the folder is made if
/// needed. Errors name the folder when it cannot be written.
pub fn create_file_writer(logdir: impl AsRef<Path>) -> Result<SummaryWriter> {
    Ok(SummaryWriter {
        file: Arc::new(Mutex::new(EventFile::create(logdir.as_ref())?)),
    })
}

fn metadata(plugin: &str, class: DataClass) -> SummaryMetadata {
    SummaryMetadata {
        plugin_data: Some(crate::proto::event::summary_metadata::PluginData {
            plugin_name: plugin.to_string(),
            content: Vec::new(),
        }),
        display_name: String::new(),
        summary_description: String::new(),
        data_class: class as i32,
    }
}

fn shape(dims: &[i64]) -> TensorShapeProto {
    TensorShapeProto {
        dim: dims
            .iter()
            .map(|&size| crate::proto::event::tensor_shape_proto::Dim {
                size,
                name: String::new(),
            })
            .collect(),
        unknown_rank: false,
    }
}

impl SummaryWriter {
    /// The file being written now.
    pub fn path(&self) -> PathBuf {
        self.lock().path.clone()
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, EventFile> {
        self.file.lock().unwrap_or_else(|e| e.into_inner())
    }

    fn write(
        &self,
        tag: &str,
        step: i64,
        meta: SummaryMetadata,
        tensor: TensorProto,
    ) -> Result<()> {
        if tag.is_empty() {
            return Err(Error::invalid("summary", "a summary needs a non-empty tag"));
        }
        let event = Event {
            wall_time: now_secs(),
            step,
            what: Some(event::What::Summary(Summary {
                value: vec![summary::Value {
                    node_name: String::new(),
                    tag: tag.to_string(),
                    metadata: Some(meta),
                    value: Some(summary::value::Value::Tensor(tensor)),
                }],
            })),
        };
        let mut f = self.lock();
        f.append(&event);
        if f.last_flush.elapsed() >= FLUSH_EVERY {
            f.flush()?;
        }
        Ok(())
    }

    /// A scalar (`tf.summary.scalar`): a float32 tensor with the scalars plugin's metadata.
    pub fn scalar(&self, tag: &str, value: f64, step: i64) -> Result<()> {
        let tensor = TensorProto {
            dtype: DataType::DtFloat as i32,
            tensor_shape: Some(shape(&[])),
            float_val: vec![value as f32],
            ..Default::default()
        };
        self.write(tag, step, metadata("scalars", DataClass::Scalar), tensor)
    }

    /// A histogram of `values` (`tf.summary.histogram`, 30 buckets by default): a float64
    /// `[buckets, 3]` tensor of (left edge, right edge, count).
    pub fn histogram(
        &self,
        tag: &str,
        values: &Tensor,
        step: i64,
        buckets: Option<usize>,
    ) -> Result<()> {
        let data = values.cast(DType::F64)?.to_vec::<f64>()?;
        if data.iter().any(|v| !v.is_finite()) {
            return Err(Error::invalid(
                "summary.histogram",
                format!("{tag}: values must be finite (found NaN or infinity)"),
            ));
        }
        let rows = histogram_buckets(&data, buckets.unwrap_or(30))?;
        let flat: Vec<f64> = rows.iter().flat_map(|r| r.iter().copied()).collect();
        let tensor = TensorProto {
            dtype: DataType::DtDouble as i32,
            tensor_shape: Some(shape(&[rows.len() as i64, 3])),
            tensor_content: flat.iter().flat_map(|v| v.to_le_bytes()).collect(),
            ..Default::default()
        };
        self.write(tag, step, metadata("histograms", DataClass::Tensor), tensor)
    }

    /// Markdown text (`tf.summary.text`).
    pub fn text(&self, tag: &str, text: &str, step: i64) -> Result<()> {
        let tensor = TensorProto {
            dtype: DataType::DtString as i32,
            tensor_shape: Some(shape(&[])),
            string_val: vec![text.as_bytes().to_vec()],
            ..Default::default()
        };
        self.write(tag, step, metadata("text", DataClass::Tensor), tensor)
    }

    /// Images (`tf.summary.image`): `images` is `[k, h, w, c]` (or one `[h, w, c]`) with
    /// 1, 3 or 4 channels, `u8` or floats in [0, 1]; at most `max_outputs` are written,
    /// each as PNG.
    pub fn image(&self, tag: &str, images: &Tensor, step: i64, max_outputs: usize) -> Result<()> {
        let dims = images.shape().to_vec();
        let dims = match dims.len() {
            3 => vec![1, dims[0], dims[1], dims[2]],
            4 => dims,
            _ => {
                return Err(Error::invalid(
                    "summary.image",
                    format!("{tag}: images must be [k, h, w, c] or [h, w, c], got shape {dims:?}"),
                ))
            }
        };
        let (k, h, w, c) = (dims[0], dims[1], dims[2], dims[3]);
        if !matches!(c, 1 | 3 | 4) {
            return Err(Error::invalid(
                "summary.image",
                format!("{tag}: images need 1, 3 or 4 channels, got {c}"),
            ));
        }
        let pixels: Vec<u8> = match images.dtype() {
            DType::U8 => images.to_vec::<u8>()?,
            d if d.is_float() => images
                .cast(DType::F32)?
                .to_vec::<f32>()?
                .iter()
                .map(|v| (v.clamp(0.0, 1.0) * 255.0).round() as u8)
                .collect(),
            d => {
                return Err(Error::invalid(
                    "summary.image",
                    format!("{tag}: images must be uint8 or floating point, got {d}"),
                ))
            }
        };
        let per_image = h * w * c;
        let mut strings = vec![w.to_string().into_bytes(), h.to_string().into_bytes()];
        for i in 0..k.min(max_outputs.max(1)) {
            strings.push(crate::png::encode(
                &pixels[i * per_image..(i + 1) * per_image],
                w,
                h,
                c,
            )?);
        }
        let tensor = TensorProto {
            dtype: DataType::DtString as i32,
            tensor_shape: Some(shape(&[strings.len() as i64])),
            string_val: strings,
            ..Default::default()
        };
        self.write(
            tag,
            step,
            metadata("images", DataClass::BlobSequence),
            tensor,
        )
    }

    /// Writes what is buffered (crash-safe: temporary file, fsync, rename).
    pub fn flush(&self) -> Result<()> {
        self.lock().flush()
    }
}

impl Drop for SummaryWriter {
    fn drop(&mut self) {
        if Arc::strong_count(&self.file) == 1 {
            if let Err(e) = self.flush() {
                eprintln!("ferroflow summary writer: could not flush on drop: {e}");
            }
        }
    }
}

/// TF 2.x's histogram buckets: `k` equal buckets from min to max, rows (left, right, count);
/// one bucket of width 1 around the value when all values are equal; none for no values.
pub fn histogram_buckets(values: &[f64], k: usize) -> Result<Vec<[f64; 3]>> {
    if k == 0 {
        return Err(Error::invalid(
            "summary.histogram",
            "buckets must be at least 1",
        ));
    }
    if values.is_empty() {
        return Ok(Vec::new());
    }
    let min = values.iter().copied().fold(f64::INFINITY, f64::min);
    let max = values.iter().copied().fold(f64::NEG_INFINITY, f64::max);
    if min == max {
        return Ok(vec![[min - 0.5, max + 0.5, values.len() as f64]]);
    }
    let width = (max - min) / k as f64;
    let mut counts = vec![0f64; k];
    for &v in values {
        let i = (((v - min) / width) as usize).min(k - 1);
        counts[i] += 1.0;
    }
    Ok((0..k)
        .map(|i| {
            let left = min + width * i as f64;
            let right = if i == k - 1 {
                max
            } else {
                min + width * (i + 1) as f64
            };
            [left, right, counts[i]]
        })
        .collect())
}

#[cfg(test)]
mod tests {
    use super::histogram_buckets;
    use proptest::prelude::*;

    proptest! {
        #[test]
        fn buckets_cover_every_value(values in proptest::collection::vec(-1e3f64..1e3, 1..200), k in 1usize..40) {
            let rows = histogram_buckets(&values, k).unwrap();
            let total: f64 = rows.iter().map(|r| r[2]).sum();
            prop_assert_eq!(total as usize, values.len());
            for r in &rows { prop_assert!(r[0] <= r[1]); }
            // Each value falls in the bucket that counted it (a plain reference count).
            if rows.len() == k {
                let min = rows[0][0];
                let width = (rows[k - 1][1] - min) / k as f64;
                let mut reference = vec![0usize; k];
                for v in &values { reference[(((v - min) / width) as usize).min(k - 1)] += 1; }
                for (r, want) in rows.iter().zip(&reference) { prop_assert_eq!(r[2] as usize, *want); }
            }
        }
    }
}
