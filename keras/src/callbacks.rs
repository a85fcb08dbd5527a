//! Training callbacks (`tf.keras.callbacks`) and the logs they receive.
//!
//! `fit` calls each callback at the start and end of training, of every epoch and of every
//! batch; a callback may stop training (`model.stop_training = true`), change the
//! optimizer's learning rate, or save the model.
//!
//! ```
//! # use ferroflow_keras::callbacks::*;
//! let early = EarlyStopping::new("val_loss").patience(2).restore_best_weights(true);
//! let best = ModelCheckpoint::new("ckpt/best-{epoch:02d}.safetensors")?.save_best_only(true);
//! assert!(ModelCheckpoint::new("ckpt/{epoch:999999999d}").is_err());
//! # Ok::<(), ferroflow_tensor::Error>(())
//! ```

use std::io::{IsTerminal, Write};
use std::path::PathBuf;
use std::time::Instant;

use ferroflow_optim::Hyper;
use ferroflow_tensor::{Error, Result, Tensor};

use crate::model::Model;

mod tensorboard;
pub use tensorboard::{TensorBoard, UpdateFreq};

/// Named values after a batch or an epoch (`loss`, metrics, `val_*`), in insertion order.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Logs {
    entries: Vec<(String, f64)>,
}

impl Logs {
    /// Empty logs.
    pub fn new() -> Logs {
        Logs::default()
    }
    /// The value for `key`.
    pub fn get(&self, key: &str) -> Option<f64> {
        self.entries.iter().find(|(k, _)| k == key).map(|(_, v)| *v)
    }
    /// Sets `key` (replacing, or appending a new key).
    pub fn set(&mut self, key: &str, value: f64) {
        match self.entries.iter_mut().find(|(k, _)| k == key) {
            Some(e) => e.1 = value,
            None => self.entries.push((key.to_string(), value)),
        }
    }
    /// The entries in order.
    pub fn iter(&self) -> impl Iterator<Item = (&str, f64)> {
        self.entries.iter().map(|(k, v)| (k.as_str(), *v))
    }
    /// Whether there are no entries.
    pub fn is_empty(&self) -> bool {
        self.entries.is_empty()
    }
}

/// What `fit` tells callbacks at the start (Keras' `callback.params`).
#[derive(Debug, Clone, PartialEq)]
pub struct TrainParams {
    /// Total epochs.
    pub epochs: usize,
    /// Batches per epoch; `None` while unknown (a dataset of unknown cardinality before its
    /// first epoch ends).
    pub steps: Option<usize>,
    /// Verbosity (0 silent, 1 progress bar, 2 one line per epoch).
    pub verbose: u8,
}

/// A training callback. Every hook has an empty default.
#[allow(unused_variables)]
pub trait Callback: Send {
    /// Before the first epoch.
    fn on_train_begin(&mut self, params: &TrainParams, model: &mut Model) -> Result<()> {
        Ok(())
    }
    /// After the last epoch (or when training stopped early).
    fn on_train_end(&mut self, logs: &Logs, model: &mut Model) -> Result<()> {
        Ok(())
    }
    /// Before each epoch (0-based).
    fn on_epoch_begin(&mut self, epoch: usize, model: &mut Model) -> Result<()> {
        Ok(())
    }
    /// After each epoch, with the epoch's training and validation logs.
    fn on_epoch_end(&mut self, epoch: usize, logs: &Logs, model: &mut Model) -> Result<()> {
        Ok(())
    }
    /// Before each training batch.
    fn on_train_batch_begin(&mut self, batch: usize, model: &mut Model) -> Result<()> {
        Ok(())
    }
    /// After each training batch, with the running means so far this epoch.
    fn on_train_batch_end(&mut self, batch: usize, logs: &Logs, model: &mut Model) -> Result<()> {
        Ok(())
    }
}

/// Every epoch's logs (`fit` returns one, as Keras' `History`).
#[derive(Debug, Clone, Default, PartialEq)]
pub struct History {
    /// The epochs run (0-based).
    pub epoch: Vec<usize>,
    /// Per key, one value per epoch, keys in first-seen order.
    pub history: Vec<(String, Vec<f64>)>,
}

impl History {
    /// The values of `key`, one per epoch.
    pub fn get(&self, key: &str) -> Option<&[f64]> {
        self.history
            .iter()
            .find(|(k, _)| k == key)
            .map(|(_, v)| v.as_slice())
    }
    /// Records one epoch.
    pub fn record(&mut self, epoch: usize, logs: &Logs) {
        self.epoch.push(epoch);
        for (k, v) in logs.iter() {
            match self.history.iter_mut().find(|(key, _)| key == k) {
                Some((_, vals)) => vals.push(v),
                None => self.history.push((k.to_string(), vec![v])),
            }
        }
    }
}

fn format_logs(logs: &Logs) -> String {
    let mut s = String::new();
    for (k, v) in logs.iter() {
        if v.abs() > 1e-3 || v == 0.0 {
            s += &format!(" - {k}: {v:.4}");
        } else {
            s += &format!(" - {k}: {v:.4e}");
        }
    }
    s
}

fn format_duration(secs: f64) -> String {
    if secs >= 3600.0 {
        format!(
            "{}:{:02}:{:02}",
            secs as u64 / 3600,
            (secs as u64 % 3600) / 60,
            secs as u64 % 60
        )
    } else if secs >= 60.0 {
        format!("{}:{:02}", secs as u64 / 60, secs as u64 % 60)
    } else {
        format!("{}s", secs.round() as u64)
    }
}

fn format_per_step(secs: f64) -> String {
    if secs >= 1.0 {
        format!("{secs:.0}s/step")
    } else if secs >= 1e-3 {
        format!("{:.0}ms/step", secs * 1e3)
    } else {
        format!("{:.0}us/step", secs * 1e6)
    }
}

/// Keras' progress bar (`verbose=1`): `Epoch 1/3`, then
/// `123/469 [=======>......] - ETA: 2s - loss: 0.5012 - accuracy: 0.8612`, redrawn in place
/// on a terminal at most every 50 ms; elsewhere (a log file, CI) only the finished line of
/// each epoch is printed. `verbose=2`: one line per epoch without the bar.
pub struct ProgbarLogger {
    verbose: u8,
    epochs: usize,
    /// Batches per epoch: given by `fit`, or counted in the first epoch when unknown.
    steps: Option<usize>,
    seen: usize,
    epoch_start: Instant,
    last_draw: Option<Instant>,
    dynamic: bool,
    width: usize,
}

impl ProgbarLogger {
    /// A progress logger at verbosity 1 or 2.
    pub fn new(verbose: u8) -> ProgbarLogger {
        ProgbarLogger {
            verbose,
            epochs: 0,
            steps: None,
            seen: 0,
            epoch_start: Instant::now(),
            last_draw: None,
            dynamic: std::io::stdout().is_terminal(),
            width: 0,
        }
    }

    fn bar(&self, current: usize) -> String {
        let Some(target) = self.steps.map(|s| s.max(1)) else {
            return format!("{current}/Unknown");
        };
        let digits = target.to_string().len();
        let filled = 30 * current.min(target) / target;
        let mut bar = format!("{current:>digits$}/{target} [");
        if filled > 0 {
            bar += &"=".repeat(filled - 1);
            bar.push(if current < target { '>' } else { '=' });
        }
        bar += &".".repeat(30 - filled);
        bar.push(']');
        bar
    }

    fn draw(&mut self, line: String, finalize: bool) {
        let mut out = std::io::stdout().lock();
        if self.dynamic {
            let pad = self.width.saturating_sub(line.chars().count());
            let _ = write!(out, "\r{line}{}", " ".repeat(pad));
            self.width = line.chars().count();
            if finalize {
                let _ = writeln!(out);
                self.width = 0;
            }
        } else if finalize {
            let _ = writeln!(out, "{line}");
        }
        let _ = out.flush();
    }
}

impl Callback for ProgbarLogger {
    fn on_train_begin(&mut self, params: &TrainParams, _model: &mut Model) -> Result<()> {
        self.epochs = params.epochs;
        self.steps = params.steps;
        Ok(())
    }
    fn on_epoch_begin(&mut self, epoch: usize, _model: &mut Model) -> Result<()> {
        if self.verbose > 0 {
            println!("Epoch {}/{}", epoch + 1, self.epochs);
        }
        self.epoch_start = Instant::now();
        self.last_draw = None;
        self.seen = 0;
        Ok(())
    }
    fn on_train_batch_end(&mut self, batch: usize, logs: &Logs, _model: &mut Model) -> Result<()> {
        let current = batch + 1;
        self.seen = current;
        if self.verbose != 1 || !self.dynamic {
            return Ok(());
        }
        let now = Instant::now();
        let due = self
            .last_draw
            .is_none_or(|t| now.duration_since(t).as_secs_f64() >= 0.05);
        if due && self.steps.is_none_or(|s| current < s) {
            let elapsed = now.duration_since(self.epoch_start).as_secs_f64();
            let eta = match self.steps {
                Some(s) => format!(
                    " - ETA: {}",
                    format_duration(elapsed / current as f64 * (s - current) as f64)
                ),
                None => String::new(),
            };
            let line = format!("{}{eta}{}", self.bar(current), format_logs(logs));
            self.draw(line, false);
            self.last_draw = Some(now);
        }
        Ok(())
    }
    fn on_epoch_end(&mut self, _epoch: usize, logs: &Logs, _model: &mut Model) -> Result<()> {
        // An epoch of unknown length has now been counted (Keras does the same).
        let steps = *self.steps.get_or_insert(self.seen);
        let elapsed = self.epoch_start.elapsed().as_secs_f64();
        let timing = format!(
            "{} {}",
            format_duration(elapsed),
            format_per_step(elapsed / steps.max(1) as f64)
        );
        match self.verbose {
            1 => {
                let line = format!("{} - {timing}{}", self.bar(steps), format_logs(logs));
                self.draw(line, true);
            }
            2 => println!("{steps}/{steps} - {timing}{}", format_logs(logs)),
            _ => {}
        }
        Ok(())
    }
}

/// Whether improvement means a larger or a smaller value.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Mode {
    /// Larger is better for names containing `acc`, `auc`, `precision` or `recall`,
    /// smaller otherwise (Keras' `auto`).
    Auto,
    /// Smaller is better.
    Min,
    /// Larger is better.
    Max,
}

/// Tracks the best value of a monitored quantity.
#[derive(Debug, Clone)]
struct Monitor {
    key: String,
    maximize: bool,
    min_delta: f64,
    best: Option<f64>,
}

impl Monitor {
    fn new(key: &str, mode: Mode, min_delta: f64) -> Monitor {
        let maximize = match mode {
            Mode::Max => true,
            Mode::Min => false,
            Mode::Auto => ["acc", "auc", "precision", "recall"]
                .iter()
                .any(|s| key.contains(s)),
        };
        Monitor {
            key: key.into(),
            maximize,
            min_delta: min_delta.abs(),
            best: None,
        }
    }
    /// The monitored value, with a warning when the logs lack it.
    fn value(&self, logs: &Logs, who: &str) -> Option<f64> {
        let v = logs.get(&self.key);
        if v.is_none() {
            let keys: Vec<&str> = logs.iter().map(|(k, _)| k).collect();
            eprintln!(
                "WARNING: {who} conditioned on metric `{}` which is not available. Available metrics are: {}",
                self.key,
                keys.join(",")
            );
        }
        v
    }
    fn improves(&self, v: f64) -> bool {
        match self.best {
            None => !v.is_nan(),
            Some(b) if self.maximize => v - self.min_delta > b,
            Some(b) => v + self.min_delta < b,
        }
    }
}

/// `tf.keras.callbacks.EarlyStopping`: stops training when the monitored value has not
/// improved by `min_delta` for `patience` epochs; optionally restores the best weights.
pub struct EarlyStopping {
    monitor: Monitor,
    patience: usize,
    baseline: Option<f64>,
    restore_best_weights: bool,
    wait: usize,
    best_weights: Option<Vec<Tensor>>,
    /// The epoch training stopped at (0 when it ran to the end).
    pub stopped_epoch: usize,
}

impl EarlyStopping {
    /// Monitors `monitor` (`"val_loss"`), patience 0, min_delta 0, mode auto.
    pub fn new(monitor: &str) -> EarlyStopping {
        EarlyStopping {
            monitor: Monitor::new(monitor, Mode::Auto, 0.0),
            patience: 0,
            baseline: None,
            restore_best_weights: false,
            wait: 0,
            best_weights: None,
            stopped_epoch: 0,
        }
    }
    /// Epochs without improvement before stopping.
    pub fn patience(mut self, p: usize) -> Self {
        self.patience = p;
        self
    }
    /// The smallest change that counts as an improvement.
    pub fn min_delta(mut self, d: f64) -> Self {
        self.monitor.min_delta = d.abs();
        self
    }
    /// Whether larger or smaller is better.
    pub fn mode(mut self, mode: Mode) -> Self {
        self.monitor = Monitor::new(&self.monitor.key, mode, self.monitor.min_delta);
        self
    }
    /// A value the monitored quantity must beat.
    pub fn baseline(mut self, b: f64) -> Self {
        self.baseline = Some(b);
        self
    }
    /// Restore the weights of the best epoch when stopping.
    pub fn restore_best_weights(mut self, r: bool) -> Self {
        self.restore_best_weights = r;
        self
    }
}

impl Callback for EarlyStopping {
    fn on_train_begin(&mut self, _p: &TrainParams, _model: &mut Model) -> Result<()> {
        self.wait = 0;
        self.stopped_epoch = 0;
        self.monitor.best = self.baseline;
        self.best_weights = None;
        Ok(())
    }
    fn on_epoch_end(&mut self, epoch: usize, logs: &Logs, model: &mut Model) -> Result<()> {
        let Some(v) = self.monitor.value(logs, "Early stopping") else {
            return Ok(());
        };
        if self.monitor.improves(v) {
            self.monitor.best = Some(v);
            self.wait = 0;
            if self.restore_best_weights {
                self.best_weights = Some(model.get_weights()?);
            }
            return Ok(());
        }
        self.wait += 1;
        if self.wait > self.patience {
            self.stopped_epoch = epoch;
            model.stop_training = true;
            if let Some(w) = self.best_weights.take() {
                println!("Restoring model weights from the end of the best epoch.");
                model.set_weights(w)?;
            }
        }
        Ok(())
    }
    fn on_train_end(&mut self, _logs: &Logs, _model: &mut Model) -> Result<()> {
        if self.stopped_epoch > 0 {
            println!("Epoch {:05}: early stopping", self.stopped_epoch + 1);
        }
        Ok(())
    }
}

/// A checkpoint path with `{key}`, `{key:02d}` and `{key:.4f}` placeholders (Python's
/// format mini-language, the subset Keras' templates use), parsed once, so a template that
/// cannot be applied is an error when the callback is made, not at the end of an epoch.
#[derive(Debug, Clone)]
struct PathTemplate {
    pieces: Vec<Piece>,
    text: String,
}

#[derive(Debug, Clone)]
enum Piece {
    Literal(String),
    /// `{key}` (`spec` None), `{key:0Nd}` / `{key:Nd}` (`Int`), `{key:.Pf}` (`Fixed`).
    Field {
        key: String,
        spec: Spec,
    },
}

#[derive(Debug, Clone, Copy)]
enum Spec {
    Plain,
    Int { width: usize },
    Fixed { precision: usize },
}

/// Widths and precisions past this are refused (they only make absurd file names).
const MAX_FORMAT_WIDTH: usize = 64;

impl PathTemplate {
    fn parse(template: &str) -> Result<PathTemplate> {
        let bad =
            |msg: String| Error::invalid("ModelCheckpoint", format!("path {template:?}: {msg}"));
        let number = |digits: &str, what: &str| -> Result<usize> {
            let n: usize = digits
                .parse()
                .map_err(|_| bad(format!("{what} {digits:?} is not a number")))?;
            if n > MAX_FORMAT_WIDTH {
                return Err(bad(format!("{what} {n} is over {MAX_FORMAT_WIDTH}")));
            }
            Ok(n)
        };
        let mut pieces = vec![];
        let mut rest = template;
        while let Some(start) = rest.find('{') {
            if start > 0 {
                pieces.push(Piece::Literal(rest[..start].to_string()));
            }
            let end = rest[start..]
                .find('}')
                .map(|e| start + e)
                .ok_or_else(|| bad("unclosed '{'".into()))?;
            let field = &rest[start + 1..end];
            let (key, spec) = field.split_once(':').unwrap_or((field, ""));
            if key.is_empty() {
                return Err(bad("an empty placeholder {}".into()));
            }
            let spec = if spec.is_empty() {
                Spec::Plain
            } else if let Some(w) = spec.strip_suffix('d') {
                let w = w.trim_start_matches('0');
                Spec::Int {
                    width: if w.is_empty() { 0 } else { number(w, "width")? },
                }
            } else if let Some(p) = spec.strip_prefix('.').and_then(|s| s.strip_suffix('f')) {
                Spec::Fixed {
                    precision: number(p, "precision")?,
                }
            } else {
                return Err(bad(format!(
                    "format {spec:?} of {key:?} is not one of d, 0Nd or .Nf"
                )));
            };
            pieces.push(Piece::Field {
                key: key.to_string(),
                spec,
            });
            rest = &rest[end + 1..];
        }
        if rest.contains('}') {
            return Err(bad("a '}' without its '{'".into()));
        }
        if !rest.is_empty() {
            pieces.push(Piece::Literal(rest.to_string()));
        }
        Ok(PathTemplate {
            pieces,
            text: template.to_string(),
        })
    }

    /// The path for `epoch` (1-based in the name, as Keras) and `logs`; a placeholder the
    /// logs lack is an error naming it.
    fn fill(&self, epoch: usize, logs: &Logs) -> Result<String> {
        let mut out = String::new();
        for piece in &self.pieces {
            let (key, spec) = match piece {
                Piece::Literal(s) => {
                    out += s;
                    continue;
                }
                Piece::Field { key, spec } => (key, *spec),
            };
            let value = if key == "epoch" {
                Some((epoch + 1) as f64)
            } else {
                logs.get(key)
            }
            .ok_or_else(|| {
                Error::invalid(
                    "ModelCheckpoint",
                    format!("path {:?} names {key:?}, which the logs lack", self.text),
                )
            })?;
            out += &match spec {
                Spec::Int { width } => format!("{:0width$}", value as i64),
                Spec::Fixed { precision } => format!("{value:.precision$}"),
                Spec::Plain if key == "epoch" => format!("{}", value as i64),
                Spec::Plain => format!("{value}"),
            };
        }
        Ok(out)
    }
}

/// `tf.keras.callbacks.ModelCheckpoint`: saves the weights (safetensors) after each
/// epoch, or only when the monitored value improved (`save_best_only`). The path may name
/// the epoch and any log value: `"ckpt/weights.{epoch:02d}-{val_loss:.2f}.safetensors"`.
/// With `save_weights_only(false)` the whole model is saved (a folder: config + weights).
/// Under a multi-worker strategy only the chief writes.
pub struct ModelCheckpoint {
    filepath: PathTemplate,
    monitor: Monitor,
    save_best_only: bool,
    save_weights_only: bool,
    /// Paths written so far.
    pub saved: Vec<PathBuf>,
}

impl ModelCheckpoint {
    /// Saves weights to `filepath` after every epoch, monitoring `val_loss`. `filepath` may
    /// hold `{epoch}`, `{epoch:02d}`, `{val_loss:.4f}`-style placeholders; one that cannot
    /// be applied (unclosed, an unknown format, a width over 64) is an error here.
    pub fn new(filepath: &str) -> Result<ModelCheckpoint> {
        Ok(ModelCheckpoint {
            filepath: PathTemplate::parse(filepath)?,
            monitor: Monitor::new("val_loss", Mode::Auto, 0.0),
            save_best_only: false,
            save_weights_only: true,
            saved: vec![],
        })
    }
    /// The value `save_best_only` watches.
    pub fn monitor(mut self, key: &str, mode: Mode) -> Self {
        self.monitor = Monitor::new(key, mode, 0.0);
        self
    }
    /// Save only when the monitored value improved.
    pub fn save_best_only(mut self, b: bool) -> Self {
        self.save_best_only = b;
        self
    }
    /// Weights only (default) or the whole model.
    pub fn save_weights_only(mut self, b: bool) -> Self {
        self.save_weights_only = b;
        self
    }
}

impl Callback for ModelCheckpoint {
    fn on_epoch_end(&mut self, epoch: usize, logs: &Logs, model: &mut Model) -> Result<()> {
        // Under a multi-worker strategy only the chief writes (every worker holds the same
        // weights; TF has the others write to temporary places and delete them).
        if !model.writes_files() {
            return Ok(());
        }
        if self.save_best_only {
            let Some(v) = self.monitor.value(logs, "Can save best model only with") else {
                return Ok(());
            };
            if !self.monitor.improves(v) {
                return Ok(());
            }
            self.monitor.best = Some(v);
        }
        let path = PathBuf::from(self.filepath.fill(epoch, logs)?);
        if self.save_weights_only {
            model.save_weights(&path)?;
        } else {
            model.save(&path)?;
        }
        self.saved.push(path);
        Ok(())
    }
}

/// `tf.keras.callbacks.LearningRateScheduler`: sets the learning rate before each epoch to
/// `schedule(epoch, current_lr)`.
pub struct LearningRateScheduler {
    schedule: Box<dyn FnMut(usize, f64) -> f64 + Send>,
    verbose: bool,
}

impl LearningRateScheduler {
    /// Uses `schedule(epoch, lr) -> new lr`.
    pub fn new(schedule: impl FnMut(usize, f64) -> f64 + Send + 'static) -> LearningRateScheduler {
        LearningRateScheduler {
            schedule: Box::new(schedule),
            verbose: false,
        }
    }
    /// Print each change.
    pub fn verbose(mut self, v: bool) -> Self {
        self.verbose = v;
        self
    }
}

impl Callback for LearningRateScheduler {
    fn on_epoch_begin(&mut self, epoch: usize, model: &mut Model) -> Result<()> {
        let opt = model.optimizer_mut().ok_or_else(|| {
            Error::invalid(
                "LearningRateScheduler",
                "the model has no optimizer: call compile first",
            )
        })?;
        let lr = opt.learning_rate().at(opt.iterations());
        let new = (self.schedule)(epoch, lr);
        if !new.is_finite() {
            return Err(Error::invalid(
                "LearningRateScheduler",
                format!("the schedule returned {new} for epoch {epoch}"),
            ));
        }
        opt.set_learning_rate(Hyper::Const(new));
        if self.verbose {
            println!(
                "\nEpoch {:05}: LearningRateScheduler setting learning rate to {new}.",
                epoch + 1
            );
        }
        Ok(())
    }
}

/// `tf.keras.callbacks.ReduceLROnPlateau`: multiplies the learning rate by `factor` when
/// the monitored value has not improved for `patience` epochs, then waits `cooldown`
/// epochs; never below `min_lr`.
pub struct ReduceLROnPlateau {
    monitor: Monitor,
    factor: f64,
    patience: usize,
    cooldown: usize,
    min_lr: f64,
    wait: usize,
    cooldown_left: usize,
}

impl ReduceLROnPlateau {
    /// Keras' defaults: factor 0.1, patience 10, min_delta 1e-4, cooldown 0, min_lr 0.
    pub fn new(monitor: &str) -> ReduceLROnPlateau {
        ReduceLROnPlateau {
            monitor: Monitor::new(monitor, Mode::Auto, 1e-4),
            factor: 0.1,
            patience: 10,
            cooldown: 0,
            min_lr: 0.0,
            wait: 0,
            cooldown_left: 0,
        }
    }
    /// The multiplier (must be < 1).
    pub fn factor(mut self, f: f64) -> Self {
        self.factor = f;
        self
    }
    /// Epochs without improvement before reducing.
    pub fn patience(mut self, p: usize) -> Self {
        self.patience = p;
        self
    }
    /// Epochs to wait after a reduction.
    pub fn cooldown(mut self, c: usize) -> Self {
        self.cooldown = c;
        self
    }
    /// The floor.
    pub fn min_lr(mut self, m: f64) -> Self {
        self.min_lr = m;
        self
    }
    /// The smallest change that counts as an improvement.
    pub fn min_delta(mut self, d: f64) -> Self {
        self.monitor.min_delta = d.abs();
        self
    }
}

impl Callback for ReduceLROnPlateau {
    fn on_train_begin(&mut self, _p: &TrainParams, _model: &mut Model) -> Result<()> {
        if self.factor >= 1.0 {
            return Err(Error::invalid(
                "ReduceLROnPlateau",
                format!("does not support a factor >= 1.0, got {}", self.factor),
            ));
        }
        self.wait = 0;
        self.cooldown_left = 0;
        self.monitor.best = None;
        Ok(())
    }
    fn on_epoch_end(&mut self, epoch: usize, logs: &Logs, model: &mut Model) -> Result<()> {
        let Some(v) = self.monitor.value(logs, "Learning rate reduction") else {
            return Ok(());
        };
        if self.cooldown_left > 0 {
            self.cooldown_left -= 1;
            self.wait = 0;
        }
        if self.monitor.improves(v) {
            self.monitor.best = Some(v);
            self.wait = 0;
            return Ok(());
        }
        if self.cooldown_left > 0 {
            return Ok(());
        }
        self.wait += 1;
        if self.wait >= self.patience {
            let opt = model.optimizer_mut().ok_or_else(|| {
                Error::invalid(
                    "ReduceLROnPlateau",
                    "the model has no optimizer: call compile first",
                )
            })?;
            let old = opt.learning_rate().at(opt.iterations());
            if old > self.min_lr {
                let new = (old * self.factor).max(self.min_lr);
                opt.set_learning_rate(Hyper::Const(new));
                println!(
                    "\nEpoch {:05}: ReduceLROnPlateau reducing learning rate to {new}.",
                    epoch + 1
                );
                self.cooldown_left = self.cooldown;
                self.wait = 0;
            }
        }
        Ok(())
    }
}

/// `tf.keras.callbacks.CSVLogger`: one row per epoch, `epoch` then the log keys.
pub struct CsvLogger {
    path: PathBuf,
    separator: char,
    append: bool,
    keys: Option<Vec<String>>,
}

impl CsvLogger {
    /// Writes (truncating) to `path` with `,` separators.
    pub fn new(path: impl Into<PathBuf>) -> CsvLogger {
        CsvLogger {
            path: path.into(),
            separator: ',',
            append: false,
            keys: None,
        }
    }
    /// Appends to an existing file instead of truncating it.
    pub fn append(mut self, a: bool) -> Self {
        self.append = a;
        self
    }
    /// The field separator.
    pub fn separator(mut self, s: char) -> Self {
        self.separator = s;
        self
    }
}

impl Callback for CsvLogger {
    fn on_train_begin(&mut self, _p: &TrainParams, _model: &mut Model) -> Result<()> {
        self.keys = None;
        let has_content = self.append
            && std::fs::metadata(&self.path)
                .map(|m| m.len() > 0)
                .unwrap_or(false);
        if has_content {
            // Continue the existing columns.
            let text =
                std::fs::read_to_string(&self.path).map_err(|e| Error::io(&self.path, &e))?;
            if let Some(h) = text.lines().next() {
                self.keys = Some(h.split(self.separator).skip(1).map(String::from).collect());
            }
        } else {
            std::fs::write(&self.path, "").map_err(|e| Error::io(&self.path, &e))?;
        }
        Ok(())
    }
    fn on_epoch_end(&mut self, epoch: usize, logs: &Logs, _model: &mut Model) -> Result<()> {
        let sep = self.separator.to_string();
        let mut text = String::new();
        let keys = match &self.keys {
            Some(k) => k.clone(),
            None => {
                let k: Vec<String> = logs.iter().map(|(k, _)| k.to_string()).collect();
                text += &format!("epoch{sep}{}\n", k.join(&sep));
                self.keys = Some(k.clone());
                k
            }
        };
        let row: Vec<String> = keys
            .iter()
            .map(|k| logs.get(k).map_or("NA".into(), |v| v.to_string()))
            .collect();
        text += &format!("{epoch}{sep}{}\n", row.join(&sep));
        let mut f = std::fs::OpenOptions::new()
            .append(true)
            .create(true)
            .open(&self.path)
            .map_err(|e| Error::io(&self.path, &e))?;
        f.write_all(text.as_bytes())
            .map_err(|e| Error::io(&self.path, &e))
    }
}

/// `tf.keras.callbacks.TerminateOnNaN`: stops training at the first batch whose loss is
/// NaN or infinite.
#[derive(Debug, Default)]
pub struct TerminateOnNaN;

impl Callback for TerminateOnNaN {
    fn on_train_batch_end(&mut self, batch: usize, logs: &Logs, model: &mut Model) -> Result<()> {
        if let Some(l) = logs.get("loss") {
            if !l.is_finite() {
                println!("Batch {batch}: Invalid loss, terminating training");
                model.stop_training = true;
            }
        }
        Ok(())
    }
}

/// `tf.keras.callbacks.experimental.BackupAndRestore` (TF 2.4): backs the training up at the
/// end of every epoch, and a `fit` that finds a backup resumes from the epoch after it, so a
/// job killed mid-training (a worker lost) and restarted loses at most the epoch in
/// progress. The backup is deleted when training finishes.
///
/// The backup (weights, the optimizer's state and the epoch) is crash-safe: each
/// generation's files are written whole before `checkpoint.json`, which names them and the
/// epoch, replaces the previous one in one rename; a backup is the previous one or the new
/// one, never a mix. Under a multi-worker strategy only the chief writes, and every worker
/// restores from the same folder (it must be shared, as in TF). The model must be built
/// before `fit` (`model.build(input_shape)`), so there are weights to restore into.
///
/// ```no_run
/// use ferroflow_keras::{callbacks::BackupAndRestore, FitConfig};
/// let config = FitConfig::new().epochs(10).callback(BackupAndRestore::new("/tmp/backup"));
/// ```
pub struct BackupAndRestore {
    backup_dir: PathBuf,
}

impl BackupAndRestore {
    /// Backs up into `backup_dir` (created when needed).
    pub fn new(backup_dir: impl Into<PathBuf>) -> BackupAndRestore {
        BackupAndRestore {
            backup_dir: backup_dir.into(),
        }
    }

    fn checkpoint_path(&self) -> PathBuf {
        self.backup_dir.join("checkpoint.json")
    }
}

impl Callback for BackupAndRestore {
    fn on_train_begin(&mut self, _params: &TrainParams, model: &mut Model) -> Result<()> {
        let path = self.checkpoint_path();
        let text = match std::fs::read_to_string(&path) {
            Ok(t) => t,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(()),
            Err(e) => return Err(Error::io(&path, &e)),
        };
        let bad =
            |what: &str| Error::format("BackupAndRestore", format!("{}: {what}", path.display()));
        let ckpt: serde_json::Value =
            serde_json::from_str(&text).map_err(|e| bad(&format!("not JSON ({e})")))?;
        let epoch = ckpt["epoch"].as_u64().ok_or_else(|| bad("no \"epoch\""))? as usize;
        let file = |key: &str| -> Result<PathBuf> {
            let name = ckpt[key]
                .as_str()
                .ok_or_else(|| bad(&format!("no {key:?}")))?;
            if name.contains('/') || name.contains('\\') || name.starts_with('.') {
                return Err(bad(&format!("{key} {name:?} is not a file name")));
            }
            Ok(self.backup_dir.join(name))
        };
        if model.weights().is_empty() {
            return Err(Error::invalid(
                "BackupAndRestore",
                "the model has no weights yet: build it (model.build(input_shape)) before fit, \
                 so the backup can be restored into it",
            ));
        }
        model.load_weights(file("weights_file")?)?;
        let weights = model.weights();
        let optimizer_state = crate::saving::load_tensors(file("optimizer_file")?)?
            .into_iter()
            .map(|(name, t)| {
                // `#<weight index>/<slot>` back to the slot's name in this model.
                let renamed = name
                    .strip_prefix('#')
                    .and_then(|r| r.split_once('/'))
                    .and_then(|(i, slot)| {
                        let v = weights.get(i.parse::<usize>().ok()?)?;
                        Some(format!("{}/{slot}", v.name()))
                    });
                match renamed {
                    Some(n) => Ok((n, t)),
                    None if name == "iter" => Ok((name, t)),
                    None => Err(bad(&format!(
                        "optimizer slot {name:?} names no weight of the model"
                    ))),
                }
            })
            .collect::<Result<Vec<_>>>()?;
        if let Some(opt) = model.optimizer_mut() {
            opt.set_weights(optimizer_state)?;
        }
        model.resume_epoch = Some(epoch + 1);
        Ok(())
    }

    fn on_epoch_end(&mut self, epoch: usize, _logs: &Logs, model: &mut Model) -> Result<()> {
        if !model.writes_files() {
            return Ok(());
        }
        let dir = &self.backup_dir;
        std::fs::create_dir_all(dir).map_err(|e| Error::io(dir, &e))?;
        let (weights_file, optimizer_file) = (
            format!("weights-{epoch}.safetensors"),
            format!("optimizer-{epoch}.safetensors"),
        );
        model.save_weights(dir.join(&weights_file))?;
        // Slots are saved by the index of their weight (`#3/m`), not its name: a restarted
        // program may number its layers differently.
        let index: std::collections::HashMap<String, usize> = model
            .weights()
            .iter()
            .enumerate()
            .map(|(i, v)| (v.name().to_string(), i))
            .collect();
        let optimizer_state = match model.optimizer_mut() {
            Some(opt) => opt.get_weights()?,
            None => vec![],
        }
        .into_iter()
        .map(|(name, t)| {
            match name
                .rsplit_once('/')
                .and_then(|(var, slot)| Some((index.get(var)?, slot)))
            {
                Some((i, slot)) => (format!("#{i}/{slot}"), t),
                None => (name, t),
            }
        })
        .collect::<Vec<_>>();
        crate::saving::save_tensors(dir.join(&optimizer_file), &optimizer_state)?;
        let ckpt = serde_json::json!({
            "epoch": epoch,
            "weights_file": weights_file,
            "optimizer_file": optimizer_file,
        });
        ferroflow_tensor::fs::write_atomic(self.checkpoint_path(), ckpt.to_string().as_bytes())?;
        // The new backup is in place: earlier epochs' files are garbage.
        if let Ok(entries) = std::fs::read_dir(dir) {
            for entry in entries.flatten() {
                let name = entry.file_name().to_string_lossy().into_owned();
                let earlier = ["weights-", "optimizer-"].iter().any(|stem| {
                    name.strip_prefix(stem)
                        .and_then(|r| r.strip_suffix(".safetensors"))
                        .and_then(|e| e.parse::<usize>().ok())
                        .is_some_and(|e| e != epoch)
                });
                if earlier {
                    let _ = std::fs::remove_file(entry.path());
                }
            }
        }
        Ok(())
    }

    fn on_train_end(&mut self, _logs: &Logs, model: &mut Model) -> Result<()> {
        if model.writes_files() && self.backup_dir.exists() {
            std::fs::remove_dir_all(&self.backup_dir)
                .map_err(|e| Error::io(&self.backup_dir, &e))?;
        }
        Ok(())
    }
}
