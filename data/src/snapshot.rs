//! Elements persisted on disk: [`Dataset::cache_file`] and [`Dataset::snapshot`].
//!
//! Both write records in TFRecord framing (CRC-checked) whose payload is an encoded element
//! ([`encode_element`]); both write under a temporary name and publish with an atomic rename
//! only after a complete pass, so an interrupted write (an early stop, an error, a killed
//! process) is never read as complete.
//!
//! Snapshot layout, under the directory given:
//!
//! ```text
//! <path>/<fingerprint>/snapshot.metadata        JSON, written last: the completed run
//! <path>/<fingerprint>/<run>/shard_00000.snapshot ...
//! ```
//!
//! The fingerprint hashes the whole pipeline upstream of the snapshot: the data of tensor
//! sources, the paths, sizes and modification times of files, every parameter, and, for each
//! Rust function (map, filter, generator), its type name together with the executable's
//! identity, so a rebuilt program writes a new snapshot instead of reading stale data.

use std::path::{Path, PathBuf};
use std::sync::Arc;

use ferroflow_tensor::{Error, Result};

use crate::dataset::{at_element, Dataset, ElementIter};
use crate::structure::{decode_element, encode_element, Structure};
use crate::tfrecord::{Compression, TfRecordReader, TfRecordWriter};

/// Options of [`Dataset::snapshot_with`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct SnapshotOptions {
    /// Compression of the shard files (TF's default `"AUTO"` is Snappy).
    pub compression: Compression,
    /// A new shard file starts when the current one holds this many (uncompressed) bytes.
    pub shard_size_bytes: u64,
}

impl Default for SnapshotOptions {
    fn default() -> Self {
        SnapshotOptions {
            compression: Compression::Snappy,
            shard_size_bytes: 256 << 20,
        }
    }
}

const METADATA: &str = "snapshot.metadata";

fn unique_suffix() -> String {
    static COUNTER: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);
    let nanos = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_nanos())
        .unwrap_or(0);
    format!(
        "{}-{nanos}-{}",
        std::process::id(),
        COUNTER.fetch_add(1, std::sync::atomic::Ordering::Relaxed)
    )
}

fn io(path: &Path) -> impl Fn(std::io::Error) -> Error + '_ {
    move |e| Error::io(path, &e)
}

/// A finished snapshot's description.
#[derive(Debug)]
struct Metadata {
    run: String,
    shards: usize,
    elements: u64,
    compression: Compression,
}

impl Metadata {
    fn to_json(&self, fingerprint: &str) -> String {
        serde_json::json!({
            "fingerprint": fingerprint,
            "run": self.run,
            "num_shards": self.shards,
            "num_elements": self.elements,
            "compression": self.compression.name(),
            "finalized": true,
        })
        .to_string()
    }
    fn read(path: &Path) -> Result<Option<Metadata>> {
        let text = match std::fs::read_to_string(path) {
            Ok(t) => t,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(None),
            Err(e) => return Err(Error::io(path, &e)),
        };
        let bad = |msg: &str| Error::format(path.display().to_string(), msg.to_string());
        let v: serde_json::Value =
            serde_json::from_str(&text).map_err(|e| bad(&format!("not JSON: {e}")))?;
        if v["finalized"] != serde_json::Value::Bool(true) {
            return Ok(None);
        }
        let run = v["run"].as_str().ok_or_else(|| bad("no run"))?.to_string();
        if run.contains(['/', '\\']) || run.starts_with('.') {
            return Err(bad("bad run name"));
        }
        Ok(Some(Metadata {
            run,
            shards: v["num_shards"]
                .as_u64()
                .ok_or_else(|| bad("no num_shards"))? as usize,
            elements: v["num_elements"]
                .as_u64()
                .ok_or_else(|| bad("no num_elements"))?,
            compression: Compression::parse(
                v["compression"]
                    .as_str()
                    .ok_or_else(|| bad("no compression"))?,
            )?,
        }))
    }
}

fn shard_path(dir: &Path, run: &str, shard: usize) -> PathBuf {
    dir.join(run).join(format!("shard_{shard:05}.snapshot"))
}

/// Reads the elements of record files in order; stops after the first error.
fn read_records<T: Structure>(
    stage: &'static str,
    files: Vec<PathBuf>,
    compression: Compression,
    expected: Option<u64>,
) -> ElementIter<T> {
    let mut files = files.into_iter();
    let mut current: Option<(TfRecordReader, String)> = None;
    let mut index = 0u64;
    let mut failed = false;
    Box::new(std::iter::from_fn(move || loop {
        if failed {
            return None;
        }
        if let Some((r, what)) = &mut current {
            match r.next() {
                Some(Ok(bytes)) => {
                    let i = index;
                    index += 1;
                    let out = decode_element::<T>(&bytes, what);
                    failed = out.is_err();
                    return Some(out.map_err(|e| at_element(stage, i, e)));
                }
                Some(Err(e)) => {
                    failed = true;
                    return Some(Err(at_element(stage, index, e)));
                }
                None => current = None,
            }
        }
        let Some(path) = files.next() else {
            if let Some(n) = expected.filter(|&n| n != index) {
                failed = true;
                return Some(Err(at_element(
                    stage,
                    index,
                    Error::format(
                        stage,
                        format!("the files hold {index} elements, their metadata says {n}"),
                    ),
                )));
            }
            return None;
        };
        match TfRecordReader::open(&path, compression) {
            Ok(r) => current = Some((r, path.display().to_string())),
            Err(e) => {
                failed = true;
                return Some(Err(at_element(stage, index, e)));
            }
        }
    }))
}

/// Makes a finished write visible: called with the number of shards and elements.
type PublishFn = dyn FnOnce(usize, u64) -> Result<()> + Send;

/// Passes elements through while writing them to record files; `publish` runs after a
/// complete pass without errors, `abandon` otherwise (early drop included).
struct Recorder<T> {
    input: ElementIter<T>,
    stage: &'static str,
    writer: Option<TfRecordWriter>,
    open_shard: Box<dyn FnMut(usize) -> Result<TfRecordWriter> + Send>,
    shard_size: u64,
    shards: usize,
    elements: u64,
    publish: Option<Box<PublishFn>>,
    abandon: Option<Box<dyn FnOnce() + Send>>,
    failed: bool,
}

impl<T: Structure> Recorder<T> {
    fn record(&mut self, x: &T) -> Result<()> {
        let bytes = encode_element(x)?;
        if self.writer.is_none() {
            self.writer = Some((self.open_shard)(self.shards)?);
            self.shards += 1;
        }
        let w = self.writer.as_mut().expect("opened just above");
        w.write(&bytes)?;
        if w.bytes_written() >= self.shard_size {
            self.writer.take().expect("present").finish()?;
        }
        self.elements += 1;
        Ok(())
    }

    fn finish(&mut self) -> Result<()> {
        if let Some(w) = self.writer.take() {
            w.finish()?;
        }
        match self.publish.take() {
            Some(p) => p(self.shards, self.elements),
            None => Ok(()),
        }
    }

    fn give_up(&mut self) {
        self.failed = true;
        self.writer = None;
        self.publish = None;
        if let Some(a) = self.abandon.take() {
            a();
        }
    }
}

impl<T: Structure> Iterator for Recorder<T> {
    type Item = Result<T>;
    fn next(&mut self) -> Option<Result<T>> {
        match self.input.next() {
            Some(Ok(x)) => {
                if !self.failed {
                    let i = self.elements;
                    if let Err(e) = self.record(&x) {
                        self.give_up();
                        return Some(Err(at_element(self.stage, i, e)));
                    }
                }
                Some(Ok(x))
            }
            Some(Err(e)) => {
                self.give_up();
                Some(Err(e))
            }
            None => {
                if !self.failed {
                    if let Err(e) = self.finish() {
                        let i = self.elements;
                        self.give_up();
                        return Some(Err(at_element(self.stage, i, e)));
                    }
                    self.failed = true; // published: nothing more to do
                    self.abandon = None;
                }
                None
            }
        }
    }
}

impl<T> Drop for Recorder<T> {
    fn drop(&mut self) {
        self.writer = None;
        if let Some(a) = self.abandon.take() {
            a();
        }
    }
}

impl<T: Structure> Dataset<T> {
    /// Keeps the elements in a file after the first complete pass (`cache(filename)`):
    /// later passes, in this process or another, read the file instead of recomputing. The
    /// file is `path` itself (CRC-checked records); a pass that stops early or meets an
    /// error leaves no file behind.
    pub fn cache_file(&self, path: impl AsRef<Path>) -> Dataset<T> {
        let path = path.as_ref().to_path_buf();
        let label = format!("cache({})", path.display());
        self.derive(self.cardinality(), label, move |input| {
            if path.is_file() {
                drop(input);
                return read_records("cache", vec![path.clone()], Compression::None, None);
            }
            let tmp = path.with_file_name(format!(
                "{}.tmp-{}",
                path.file_name()
                    .map(|n| n.to_string_lossy())
                    .unwrap_or_default(),
                unique_suffix()
            ));
            let (t1, t2, target) = (tmp.clone(), tmp.clone(), path.clone());
            Box::new(Recorder {
                input,
                stage: "cache",
                writer: None,
                open_shard: Box::new(move |_| TfRecordWriter::create(&t1, Compression::None)),
                shard_size: u64::MAX,
                shards: 0,
                elements: 0,
                publish: Some(Box::new(move |shards, _| {
                    if shards == 0 {
                        TfRecordWriter::create(&t2, Compression::None)?.finish()?;
                    }
                    std::fs::rename(&t2, &target).map_err(io(&target))?;
                    ferroflow_tensor::fs::sync_dir(target.parent().unwrap_or(Path::new(".")))
                })),
                abandon: Some(Box::new(move || {
                    let _ = std::fs::remove_file(&tmp);
                })),
                failed: false,
            })
        })
    }

    /// Persists the pipeline's output under `path` (`tf.data.experimental.snapshot`): the
    /// first complete pass writes it in shard files keyed by the pipeline's
    /// [`fingerprint`](Self::fingerprint); later passes, also in a new process, read those
    /// instead of recomputing. A different pipeline gets a different directory.
    ///
    /// ```
    /// ferroflow::init();
    /// use ferroflow_data::{tfrecord::Compression, Dataset};
    /// let dir = std::env::temp_dir().join(format!("ferroflow-doc-snapshot-{}", std::process::id()));
    /// let ds = Dataset::range(0, 5, 1).snapshot(&dir, Compression::Gzip);
    /// let first: Vec<i64> = ds.iter().map(|x| x?.item::<i64>()).collect::<Result<_, _>>()?;
    /// let again: Vec<i64> = ds.iter().map(|x| x?.item::<i64>()).collect::<Result<_, _>>()?;
    /// assert_eq!(first, again);
    /// # std::fs::remove_dir_all(&dir).ok();
    /// # Ok::<(), ferroflow_tensor::Error>(())
    /// ```
    pub fn snapshot(&self, path: impl AsRef<Path>, compression: Compression) -> Dataset<T> {
        self.snapshot_with(
            path,
            SnapshotOptions {
                compression,
                ..SnapshotOptions::default()
            },
        )
    }

    /// [`snapshot`](Self::snapshot) with every option.
    pub fn snapshot_with(&self, path: impl AsRef<Path>, options: SnapshotOptions) -> Dataset<T> {
        let root = path.as_ref().to_path_buf();
        let upstream = self.clone();
        let label = format!("snapshot({})", root.display());
        let fingerprint: Arc<std::sync::OnceLock<Result<String>>> = Arc::default();
        self.derive(self.cardinality(), label, move |input| {
            let fp = match fingerprint.get_or_init(|| upstream.fingerprint()) {
                Ok(fp) => fp.clone(),
                Err(e) => {
                    return Box::new(std::iter::once(Err(at_element("snapshot", 0, e.clone()))))
                }
            };
            let dir = root.join(&fp);
            match Metadata::read(&dir.join(METADATA)) {
                Err(e) => return Box::new(std::iter::once(Err(at_element("snapshot", 0, e)))),
                Ok(Some(meta)) => {
                    // The shard count is a claim of the file: check it against the shards
                    // present before listing them.
                    let present = std::fs::read_dir(dir.join(&meta.run))
                        .map(|d| d.flatten().count())
                        .unwrap_or(0);
                    if meta.shards > present {
                        let e = Error::format(
                            dir.join(METADATA).display().to_string(),
                            format!(
                                "num_shards is {} but the run folder {} holds {present} files",
                                meta.shards, meta.run
                            ),
                        );
                        return Box::new(std::iter::once(Err(at_element("snapshot", 0, e))));
                    }
                    let files = (0..meta.shards)
                        .map(|s| shard_path(&dir, &meta.run, s))
                        .collect();
                    drop(input);
                    return read_records("snapshot", files, meta.compression, Some(meta.elements));
                }
                Ok(None) => {}
            }
            let run = format!("run-{}", unique_suffix());
            let run_dir = dir.join(&run);
            if let Err(e) = std::fs::create_dir_all(&run_dir) {
                return Box::new(std::iter::once(Err(at_element(
                    "snapshot",
                    0,
                    Error::io(&run_dir, &e),
                ))));
            }
            let (d1, d2, r1, r2) = (dir.clone(), dir.clone(), run.clone(), run_dir.clone());
            let compression = options.compression;
            Box::new(Recorder {
                input,
                stage: "snapshot",
                writer: None,
                open_shard: Box::new(move |s| {
                    TfRecordWriter::create(shard_path(&d1, &r1, s), compression)
                }),
                shard_size: options.shard_size_bytes.max(1),
                shards: 0,
                elements: 0,
                publish: Some(Box::new(move |shards, elements| {
                    let meta = Metadata {
                        run,
                        shards,
                        elements,
                        compression,
                    };
                    ferroflow_tensor::fs::write_atomic(
                        d2.join(METADATA),
                        meta.to_json(&fp).as_bytes(),
                    )
                })),
                abandon: Some(Box::new(move || {
                    let _ = std::fs::remove_dir_all(&r2);
                })),
                failed: false,
            })
        })
    }
}
