//! `tf.keras.callbacks.TensorBoard`: epoch (and batch) metrics as event files in
//! `<log_dir>/train` and `<log_dir>/validation`, weight histograms, and a profile of a
//! range of batches (written under `<log_dir>/train/plugins/profile`).

use super::{Callback, Logs, TrainParams};
use crate::model::Model;
use ferroflow_profiler::summary::{create_file_writer, SummaryWriter};
use ferroflow_tensor::{Error, Result};
use std::path::PathBuf;

/// How often [`TensorBoard`] writes metrics (Keras' `update_freq`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum UpdateFreq {
    /// After each epoch (`"epoch"`, the default).
    Epoch,
    /// After every `n` batches as well (`"batch"` is `Batches(1)`; an integer is `n`):
    /// `batch_<metric>` at the global batch number.
    Batches(usize),
}

/// Writes what TensorBoard shows of a `fit` (`tf.keras.callbacks.TensorBoard`):
/// `epoch_loss`, `epoch_<metric>` and `epoch_learning_rate` per epoch in `train/`, the
/// validation metrics under the same tags in `validation/`, `batch_*` per batch when
/// [`UpdateFreq::Batches`] says so, histograms of every weight each `histogram_freq`
/// epochs, and a profile of the batches `profile_batch` names (1-based, inclusive; TF 2.4's
/// default profiles batch 2; `(0, 0)` profiles nothing).
///
/// ```
/// use ferroflow_keras::callbacks::{TensorBoard, UpdateFreq};
/// let tb = TensorBoard::new("logs/run1")
///     .update_freq(UpdateFreq::Batches(100))
///     .histogram_freq(1)
///     .profile_batch(10, 20)?;
/// assert!(TensorBoard::new("logs").profile_batch(5, 2).is_err());
/// # Ok::<(), ferroflow_tensor::Error>(())
/// ```
pub struct TensorBoard {
    log_dir: PathBuf,
    update_freq: UpdateFreq,
    histogram_freq: usize,
    profile_batch: (usize, usize),
    train: Option<SummaryWriter>,
    validation: Option<SummaryWriter>,
    /// Batches begun so far, over all epochs (1-based once the first begins).
    global_batch: usize,
    profiling: bool,
}

impl TensorBoard {
    /// Logs into `log_dir` (made at the start of training if needed).
    pub fn new(log_dir: impl Into<PathBuf>) -> TensorBoard {
        TensorBoard {
            log_dir: log_dir.into(),
            update_freq: UpdateFreq::Epoch,
            histogram_freq: 0,
            profile_batch: (2, 2),
            train: None,
            validation: None,
            global_batch: 0,
            profiling: false,
        }
    }
    /// How often metrics are written.
    pub fn update_freq(mut self, f: UpdateFreq) -> Self {
        self.update_freq = f;
        self
    }
    /// Weight histograms every `n` epochs (0: none).
    pub fn histogram_freq(mut self, n: usize) -> Self {
        self.histogram_freq = n;
        self
    }
    /// Profiles batches `start..=stop` (1-based, counted over all epochs); `(0, 0)`: none.
    pub fn profile_batch(mut self, start: usize, stop: usize) -> Result<Self> {
        if (start == 0) != (stop == 0) || start > stop {
            return Err(Error::invalid(
                "TensorBoard",
                format!("profile_batch must be (start, stop) with 1 <= start <= stop, or (0, 0); got ({start}, {stop})"),
            ));
        }
        self.profile_batch = (start, stop);
        Ok(self)
    }

    fn stop_profiling(&mut self) -> Result<()> {
        if self.profiling {
            self.profiling = false;
            ferroflow_profiler::stop()?;
        }
        Ok(())
    }
}

impl Callback for TensorBoard {
    fn on_train_begin(&mut self, _params: &TrainParams, _model: &mut Model) -> Result<()> {
        // Both writers now: an unwritable log_dir fails before the first step.
        self.train = Some(create_file_writer(self.log_dir.join("train"))?);
        self.validation = Some(create_file_writer(self.log_dir.join("validation"))?);
        self.global_batch = 0;
        Ok(())
    }

    fn on_train_batch_begin(&mut self, _batch: usize, _model: &mut Model) -> Result<()> {
        self.global_batch += 1;
        if self.profile_batch.0 != 0 && self.global_batch == self.profile_batch.0 {
            let dir = self.log_dir.join("train");
            match ferroflow_profiler::start(&dir, Default::default()) {
                Ok(()) => self.profiling = true,
                // TF warns and trains on when another profiler runs; so do we.
                Err(e) => eprintln!("WARNING: TensorBoard: not profiling: {e}"),
            }
        }
        Ok(())
    }

    fn on_train_batch_end(&mut self, _batch: usize, logs: &Logs, _model: &mut Model) -> Result<()> {
        if let (UpdateFreq::Batches(n), Some(w)) = (self.update_freq, &self.train) {
            if n > 0 && self.global_batch.is_multiple_of(n) {
                for (k, v) in logs.iter() {
                    w.scalar(&format!("batch_{k}"), v, self.global_batch as i64)?;
                }
            }
        }
        if self.profiling && self.global_batch >= self.profile_batch.1 {
            self.stop_profiling()?;
        }
        Ok(())
    }

    fn on_epoch_end(&mut self, epoch: usize, logs: &Logs, model: &mut Model) -> Result<()> {
        let step = epoch as i64;
        if let Some(w) = &self.train {
            for (k, v) in logs.iter().filter(|(k, _)| !k.starts_with("val_")) {
                w.scalar(&format!("epoch_{k}"), v, step)?;
            }
            if let Some(opt) = model.optimizer_mut() {
                let lr = opt.learning_rate().at(opt.iterations());
                w.scalar("epoch_learning_rate", lr, step)?;
            }
            if self.histogram_freq > 0 && epoch.is_multiple_of(self.histogram_freq) {
                for v in model.weights() {
                    w.histogram(&v.name().replace(':', "_"), &v.peek(), step, None)?;
                }
            }
            w.flush()?;
        }
        if let Some(w) = &self.validation {
            for (k, v) in logs.iter() {
                if let Some(k) = k.strip_prefix("val_") {
                    w.scalar(&format!("epoch_{k}"), v, step)?;
                }
            }
            w.flush()?;
        }
        Ok(())
    }

    fn on_train_end(&mut self, _logs: &Logs, _model: &mut Model) -> Result<()> {
        self.stop_profiling()?;
        for w in [&self.train, &self.validation].into_iter().flatten() {
            w.flush()?;
        }
        Ok(())
    }
}

impl Drop for TensorBoard {
    /// A `fit` that failed mid-profile never reaches `on_train_end`: stop the profiler
    /// here, so it is not left running (the next `start` would be refused).
    fn drop(&mut self) {
        if self.profiling {
            if let Err(e) = self.stop_profiling() {
                eprintln!("WARNING: TensorBoard: the profile could not be written: {e}");
            }
        }
    }
}
