//! Crash-safe file writing: every writer of user state (weights, whole models, checkpoints,
//! data files, event files) goes through [`AtomicFile`] or [`write_atomic`].
//!
//! The new contents go to a temporary file in the target's own folder (so the rename stays
//! on one file system), are flushed and `fsync`ed, and only then renamed over the target;
//! the folder is `fsync`ed after the rename so the new name itself survives a power loss.
//! A process killed at any moment leaves the target holding either its previous contents
//! or the new ones, never a torn mix; at worst a stray `.<name>.tmp-*` file stays behind,
//! which the next successful write of the same target removes.
//!
//! ```
//! use ferroflow_tensor::fs::{write_atomic, AtomicFile};
//! use std::io::Write;
//! let dir = std::env::temp_dir().join(format!("ferroflow-fs-doc-{}", std::process::id()));
//! std::fs::create_dir_all(&dir)?;
//! let path = dir.join("weights.bin");
//! write_atomic(&path, b"version 1")?;
//! let mut f = AtomicFile::create(&path)?;
//! f.write_all(b"version 2").map_err(|e| f.error(&e))?;
//! // Until `commit`, readers still see version 1; dropping `f` instead would keep it.
//! assert_eq!(std::fs::read(&path)?, b"version 1");
//! f.commit()?;
//! assert_eq!(std::fs::read(&path)?, b"version 2");
//! # std::fs::remove_dir_all(&dir)?;
//! # Ok::<(), Box<dyn std::error::Error>>(())
//! ```

use crate::error::{Error, Result};
use std::fs::File;
use std::io::{BufWriter, Write};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};

/// A file being written in place of `path`: written to a temporary sibling, moved over
/// `path` by [`AtomicFile::commit`]. Dropped without a commit, it removes its temporary
/// file and leaves `path` as it was.
pub struct AtomicFile {
    target: PathBuf,
    temp: PathBuf,
    file: Option<BufWriter<File>>,
}

static COUNTER: AtomicU64 = AtomicU64::new(0);

const TEMP_MARK: &str = ".tmp-";

impl AtomicFile {
    /// Starts writing a new version of `path`, creating its folder if needed.
    pub fn create(path: impl AsRef<Path>) -> Result<AtomicFile> {
        let target = path.as_ref().to_path_buf();
        let name = target.file_name().ok_or_else(|| Error::Io {
            path: target.display().to_string(),
            msg: "not a file path (it has no file name)".into(),
        })?;
        let dir = parent_dir(&target);
        std::fs::create_dir_all(&dir).map_err(|e| Error::io(&dir, &e))?;
        let temp = dir.join(format!(
            ".{}{TEMP_MARK}{}-{}",
            name.to_string_lossy(),
            std::process::id(),
            COUNTER.fetch_add(1, Ordering::Relaxed)
        ));
        let file = File::create(&temp).map_err(|e| Error::io(&temp, &e))?;
        Ok(AtomicFile {
            target,
            temp,
            file: Some(BufWriter::with_capacity(1 << 20, file)),
        })
    }

    /// The path this file will replace.
    pub fn path(&self) -> &Path {
        &self.target
    }

    /// An [`Error::Io`] naming the target, for a failed write.
    pub fn error(&self, err: &std::io::Error) -> Error {
        Error::io(&self.target, err)
    }

    /// Flushes, `fsync`s and renames the new contents over the target, then `fsync`s the
    /// folder. Stray temporary files of earlier, interrupted writes of the same target are
    /// removed afterwards.
    pub fn commit(mut self) -> Result<()> {
        let writer = self
            .file
            .take()
            .ok_or_else(|| self.error(&already_committed()))?;
        let file = writer
            .into_inner()
            .map_err(|e| Error::io(&self.target, e.error()))?;
        file.sync_all().map_err(|e| Error::io(&self.target, &e))?;
        drop(file);
        std::fs::rename(&self.temp, &self.target).map_err(|e| Error::io(&self.target, &e))?;
        sync_dir(&parent_dir(&self.target))?;
        remove_stale_temps(&self.target);
        Ok(())
    }
}

impl AtomicFile {
    fn writer(&mut self) -> std::io::Result<&mut BufWriter<File>> {
        self.file.as_mut().ok_or_else(already_committed)
    }
}

/// `commit` consumes the file, so this cannot be reached; an error rather than a panic.
fn already_committed() -> std::io::Error {
    std::io::Error::other("the file was already committed")
}

impl Write for AtomicFile {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        self.writer()?.write(buf)
    }
    fn write_all(&mut self, buf: &[u8]) -> std::io::Result<()> {
        self.writer()?.write_all(buf)
    }
    fn flush(&mut self) -> std::io::Result<()> {
        self.writer()?.flush()
    }
}

impl Drop for AtomicFile {
    fn drop(&mut self) {
        if self.file.take().is_some() {
            let _ = std::fs::remove_file(&self.temp);
        }
    }
}

/// Replaces `path` with `bytes` crash-safely (see the module docs).
pub fn write_atomic(path: impl AsRef<Path>, bytes: &[u8]) -> Result<()> {
    let mut f = AtomicFile::create(path)?;
    f.write_all(bytes).map_err(|e| f.error(&e))?;
    f.commit()
}

/// `fsync`s a folder, so that names created or renamed in it are durable (a no-op where the
/// platform cannot open folders as files).
pub fn sync_dir(dir: &Path) -> Result<()> {
    #[cfg(unix)]
    {
        let d = File::open(dir).map_err(|e| Error::io(dir, &e))?;
        d.sync_all().map_err(|e| Error::io(dir, &e))?;
    }
    #[cfg(not(unix))]
    let _ = dir;
    Ok(())
}

fn parent_dir(path: &Path) -> PathBuf {
    match path.parent() {
        Some(p) if !p.as_os_str().is_empty() => p.to_path_buf(),
        _ => PathBuf::from("."),
    }
}

/// Removes `.<name>.tmp-<pid>-<n>` siblings left by writers of `target` that were killed,
/// except this process's own. Two processes writing one target at once race (as TF's
/// chief-only checkpointing avoids): the last rename wins, and a writer whose temporary
/// file was removed gets an error from its rename; neither can leave a torn target.
fn remove_stale_temps(target: &Path) {
    let (Some(name), dir) = (target.file_name(), parent_dir(target)) else {
        return;
    };
    let prefix = format!(".{}{TEMP_MARK}", name.to_string_lossy());
    let own = format!("{prefix}{}-", std::process::id());
    let Ok(entries) = std::fs::read_dir(&dir) else {
        return;
    };
    for e in entries.flatten() {
        let n = e.file_name();
        let n = n.to_string_lossy();
        if n.starts_with(&prefix) && !n.starts_with(&own) {
            let _ = std::fs::remove_file(e.path());
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn scratch(tag: &str) -> PathBuf {
        let d = std::env::temp_dir().join(format!(
            "ferroflow-fs-{tag}-{}-{}",
            std::process::id(),
            COUNTER.fetch_add(1, Ordering::Relaxed)
        ));
        std::fs::create_dir_all(&d).unwrap();
        d
    }

    #[test]
    fn an_uncommitted_write_leaves_the_old_contents_and_no_temp_file() {
        let d = scratch("drop");
        let p = d.join("a.bin");
        write_atomic(&p, b"old").unwrap();
        {
            let mut f = AtomicFile::create(&p).unwrap();
            f.write_all(b"new and longer").unwrap();
        }
        assert_eq!(std::fs::read(&p).unwrap(), b"old");
        let names: Vec<_> = std::fs::read_dir(&d).unwrap().flatten().collect();
        assert_eq!(names.len(), 1, "only the target is left");
        std::fs::remove_dir_all(&d).unwrap();
    }

    #[test]
    fn a_commit_replaces_the_contents_and_removes_stale_temps_of_dead_writers() {
        let d = scratch("commit");
        let p = d.join("b.bin");
        let stale = d.join(".b.bin.tmp-999999999-0");
        std::fs::write(&stale, b"torn").unwrap();
        write_atomic(&p, b"one").unwrap();
        write_atomic(&p, b"two").unwrap();
        assert_eq!(std::fs::read(&p).unwrap(), b"two");
        assert!(!stale.exists(), "a dead writer's temp file is removed");
        std::fs::remove_dir_all(&d).unwrap();
    }

    #[test]
    fn a_path_without_a_file_name_is_an_error() {
        assert!(matches!(AtomicFile::create("/"), Err(Error::Io { .. })));
    }
}
