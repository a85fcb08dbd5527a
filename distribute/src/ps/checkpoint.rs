//! [`PsCheckpoint`]: every variable and optimizer slot the parameter servers hold, saved by
//! the chief into one file per checkpoint (TF's `tf.train.Checkpoint` with a
//! `CheckpointManager` under `ParameterServerStrategy`).
//!
//! Files: `<dir>/ckpt-<step>.ffps` (the ps wire format: a JSON header with the step and
//! every (key, name), then the tensors) and `<dir>/checkpoint` (JSON: the kept files,
//! oldest first). Both are written crash-safely (temp file, fsync, rename); older files
//! beyond `max_to_keep` are deleted after the index no longer names them.

use super::store::{Empty, ListReply, PullRequest};
use super::strategy::ParameterServerStrategy;
use super::wire::{decode, encode};
use bytes::Bytes;
use ferroflow_tensor::{Error, Result, Tensor};
use serde::{Deserialize, Serialize};
use std::path::{Path, PathBuf};

#[derive(Serialize, Deserialize)]
struct FileHeader {
    step: u64,
    entries: Vec<(String, String)>,
}

#[derive(Serialize, Deserialize, Default)]
struct Index {
    /// Kept checkpoint files (names in the folder), oldest first.
    kept: Vec<String>,
}

/// Saves and restores the state of a parameter-server job's variables, keeping the last
/// `max_to_keep` checkpoints.
///
/// ```no_run
/// # fn f(strategy: &ferroflow_distribute::ParameterServerStrategy) -> ferroflow::Result<()> {
/// use ferroflow_distribute::PsCheckpoint;
/// let checkpoints = PsCheckpoint::new(strategy, "/tmp/ckpt", 3)?;
/// let start = checkpoints.restore_latest()?.unwrap_or(0); // the step to go on from
/// checkpoints.save(start + 100)?;
/// # Ok(()) }
/// ```
pub struct PsCheckpoint {
    strategy: ParameterServerStrategy,
    directory: PathBuf,
    max_to_keep: usize,
}

impl PsCheckpoint {
    /// Checkpoints of `strategy`'s variables in `directory` (made if missing).
    pub fn new(
        strategy: &ParameterServerStrategy,
        directory: impl AsRef<Path>,
        max_to_keep: usize,
    ) -> Result<PsCheckpoint> {
        let directory = directory.as_ref().to_path_buf();
        std::fs::create_dir_all(&directory)
            .map_err(|e| Error::io(format!("creating {}", directory.display()), &e))?;
        Ok(PsCheckpoint {
            strategy: strategy.clone(),
            directory,
            max_to_keep: max_to_keep.max(1),
        })
    }

    fn index(&self) -> Result<Index> {
        let path = self.directory.join("checkpoint");
        match std::fs::read(&path) {
            Ok(b) => serde_json::from_slice(&b).map_err(|e| {
                Error::invalid(
                    "PsCheckpoint",
                    format!("{} is not a checkpoint index: {e}", path.display()),
                )
            }),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(Index::default()),
            Err(e) => Err(Error::io(format!("reading {}", path.display()), &e)),
        }
    }

    /// The newest checkpoint file, if any.
    pub fn latest(&self) -> Result<Option<PathBuf>> {
        Ok(self.index()?.kept.last().map(|n| self.directory.join(n)))
    }

    /// Saves every variable and slot of every ps as checkpoint `step` (after
    /// `ClusterCoordinator::join` it is a consistent state; during training, each variable
    /// is as it was when read). Returns the file.
    pub fn save(&self, step: u64) -> Result<PathBuf> {
        self.strategy.create_variables()?;
        let client = &self.strategy.inner.client;
        let mut entries = vec![];
        let mut tensors: Vec<Tensor> = vec![];
        for ps in 0..client.num_ps() {
            let peer = client.peer(ps);
            let (list, _): (ListReply, Vec<Tensor>) =
                decode("ps.list reply", &peer.call("ps.list", Bytes::new())?)?;
            let keys: Vec<String> = list.entries.iter().map(|e| e.0.clone()).collect();
            let reply = peer.call("ps.pull", encode(&PullRequest { keys }, &[])?)?;
            let (_, values): (Empty, Vec<Tensor>) = decode("ps.pull reply", &reply)?;
            if values.len() != list.entries.len() {
                return Err(Error::invalid(
                    "PsCheckpoint::save",
                    format!(
                        "{} sent {} values for {} keys",
                        peer.name(),
                        values.len(),
                        list.entries.len()
                    ),
                ));
            }
            entries.extend(list.entries);
            tensors.extend(values);
        }
        let bytes = encode(&FileHeader { step, entries }, &tensors)?;
        let name = format!("ckpt-{step}.ffps");
        let path = self.directory.join(&name);
        ferroflow_tensor::fs::write_atomic(&path, &bytes)?;
        let mut index = self.index()?;
        index.kept.retain(|n| n != &name);
        index.kept.push(name);
        let dropped: Vec<String> = if index.kept.len() > self.max_to_keep {
            index
                .kept
                .drain(..index.kept.len() - self.max_to_keep)
                .collect()
        } else {
            vec![]
        };
        let text = serde_json::to_vec(&index)
            .map_err(|e| Error::invalid("PsCheckpoint::save", e.to_string()))?;
        ferroflow_tensor::fs::write_atomic(self.directory.join("checkpoint"), &text)?;
        for n in dropped {
            let _ = std::fs::remove_file(self.directory.join(n));
        }
        Ok(path)
    }

    /// Restores the newest checkpoint onto the parameter servers (every variable and slot
    /// it holds, replacing what they hold) and returns its step; `None` when there is none.
    /// The chief calls it after building the state, before scheduling.
    pub fn restore_latest(&self) -> Result<Option<u64>> {
        let Some(path) = self.latest()? else {
            return Ok(None);
        };
        self.restore(&path).map(Some)
    }

    /// Restores the checkpoint file `path`; returns its step.
    pub fn restore(&self, path: &Path) -> Result<u64> {
        let bytes = std::fs::read(path)
            .map_err(|e| Error::io(format!("reading {}", path.display()), &e))?;
        let what = format!("checkpoint {}", path.display());
        let (header, tensors): (FileHeader, Vec<Tensor>) = decode(&what, &bytes)?;
        if header.entries.len() != tensors.len() {
            return Err(Error::invalid(
                "PsCheckpoint::restore",
                format!(
                    "{what} names {} entries and holds {} tensors",
                    header.entries.len(),
                    tensors.len()
                ),
            ));
        }
        self.strategy.create_variables()?;
        let client = &self.strategy.inner.client;
        let mut calls = vec![];
        for ((key, name), value) in header.entries.into_iter().zip(tensors) {
            let ps = client.ps_of_key(&key).ok_or_else(|| {
                Error::invalid(
                    "PsCheckpoint::restore",
                    format!(
                        "{what} holds {key:?} ({name}), which no variable of this program \
                         matches (was the state built the same way before restoring?)"
                    ),
                )
            })?;
            let req = super::store::CreateRequest {
                key,
                name,
                overwrite: true,
            };
            calls.push(
                client
                    .peer(ps)
                    .start_call("ps.create", encode(&req, &[value])?, true),
            );
        }
        for c in calls {
            c.wait()?;
        }
        Ok(header.step)
    }
}
