//! Learning-rate schedules (`tf.keras.optimizers.schedules`), and [`Hyper`]: a hyperparameter
//! that is a constant or a schedule of the optimizer's step.

use std::f64::consts::PI;
use std::sync::Arc;

/// A function of the optimizer step (`iterations`, starting at 0) giving a learning rate.
pub trait LearningRateSchedule: Send + Sync {
    /// The value at `step`.
    fn at(&self, step: i64) -> f64;
    /// Keras's `{"class_name": ..., "config": {...}}` for [`crate::get_config`]; `None` for a
    /// schedule that cannot be serialised (the default, for user schedules).
    fn get_config(&self) -> Option<serde_json::Value> {
        None
    }
}

macro_rules! serialisable {
    ($($t:ident),*) => {$(
        impl $t {
            fn config_json(&self) -> Option<serde_json::Value> {
                Some(serde_json::json!({ "class_name": stringify!($t), "config": serde_json::to_value(self).ok()? }))
            }
        }
    )*};
}
serialisable!(
    ExponentialDecay,
    PiecewiseConstantDecay,
    PolynomialDecay,
    InverseTimeDecay,
    CosineDecay,
    CosineDecayRestarts
);

/// Rebuilds a built-in schedule from its Keras-style config.
pub fn schedule_from_config(v: &serde_json::Value) -> Option<Hyper> {
    let c = v.get("config")?.clone();
    Some(match v.get("class_name")?.as_str()? {
        "ExponentialDecay" => serde_json::from_value::<ExponentialDecay>(c).ok()?.into(),
        "PiecewiseConstantDecay" => serde_json::from_value::<PiecewiseConstantDecay>(c)
            .ok()?
            .into(),
        "PolynomialDecay" => serde_json::from_value::<PolynomialDecay>(c).ok()?.into(),
        "InverseTimeDecay" => serde_json::from_value::<InverseTimeDecay>(c).ok()?.into(),
        "CosineDecay" => serde_json::from_value::<CosineDecay>(c).ok()?.into(),
        "CosineDecayRestarts" => serde_json::from_value::<CosineDecayRestarts>(c)
            .ok()?
            .into(),
        _ => return None,
    })
}

/// A hyperparameter: a constant or a schedule (TF accepts either for `learning_rate`).
#[derive(Clone)]
pub enum Hyper {
    /// A fixed value.
    Const(f64),
    /// A value that depends on the step.
    Schedule(Arc<dyn LearningRateSchedule>),
}

impl Hyper {
    /// The value at `step`.
    pub fn at(&self, step: i64) -> f64 {
        match self {
            Hyper::Const(v) => *v,
            Hyper::Schedule(s) => s.at(step),
        }
    }
}

impl From<f64> for Hyper {
    fn from(v: f64) -> Hyper {
        Hyper::Const(v)
    }
}

impl<S: LearningRateSchedule + 'static> From<S> for Hyper {
    fn from(s: S) -> Hyper {
        Hyper::Schedule(Arc::new(s))
    }
}

/// `initial · rate^(step / decay_steps)`, the exponent floored when `staircase`.
#[derive(Debug, Clone, serde::Serialize, serde::Deserialize)]
pub struct ExponentialDecay {
    /// Initial learning rate.
    pub initial_learning_rate: f64,
    /// Steps per decay period.
    pub decay_steps: f64,
    /// Factor per period.
    pub decay_rate: f64,
    /// Decay in whole periods.
    pub staircase: bool,
}

impl LearningRateSchedule for ExponentialDecay {
    fn get_config(&self) -> Option<serde_json::Value> {
        self.config_json()
    }
    fn at(&self, step: i64) -> f64 {
        let mut p = step as f64 / self.decay_steps;
        if self.staircase {
            p = p.floor();
        }
        self.initial_learning_rate * self.decay_rate.powf(p)
    }
}

/// `values[i]` while `step <= boundaries[i]` (and `values.last()` after the last boundary).
#[derive(Debug, Clone, serde::Serialize, serde::Deserialize)]
pub struct PiecewiseConstantDecay {
    /// Increasing step boundaries.
    pub boundaries: Vec<i64>,
    /// One more value than boundaries.
    pub values: Vec<f64>,
}

impl LearningRateSchedule for PiecewiseConstantDecay {
    fn get_config(&self) -> Option<serde_json::Value> {
        self.config_json()
    }
    fn at(&self, step: i64) -> f64 {
        let i = self
            .boundaries
            .iter()
            .position(|&b| step <= b)
            .unwrap_or(self.boundaries.len());
        self.values
            .get(i)
            .or(self.values.last())
            .copied()
            .unwrap_or(0.0)
    }
}

/// `(initial - end) · (1 - step/decay_steps)^power + end`; with `cycle`, decay_steps grows to
/// the next multiple of itself past `step`.
#[derive(Debug, Clone, serde::Serialize, serde::Deserialize)]
pub struct PolynomialDecay {
    /// Initial learning rate.
    pub initial_learning_rate: f64,
    /// Steps to reach the end value.
    pub decay_steps: f64,
    /// Final learning rate (TF default 1e-4).
    pub end_learning_rate: f64,
    /// Exponent (TF default 1).
    pub power: f64,
    /// Restart after decay_steps.
    pub cycle: bool,
}

impl LearningRateSchedule for PolynomialDecay {
    fn get_config(&self) -> Option<serde_json::Value> {
        self.config_json()
    }
    fn at(&self, step: i64) -> f64 {
        let s = step as f64;
        let (s, d) = if self.cycle {
            let mult = if s == 0.0 {
                1.0
            } else {
                (s / self.decay_steps).ceil()
            };
            (s, self.decay_steps * mult)
        } else {
            (s.min(self.decay_steps), self.decay_steps)
        };
        (self.initial_learning_rate - self.end_learning_rate) * (1.0 - s / d).powf(self.power)
            + self.end_learning_rate
    }
}

/// `initial / (1 + rate · step/decay_steps)`, the ratio floored when `staircase`.
#[derive(Debug, Clone, serde::Serialize, serde::Deserialize)]
pub struct InverseTimeDecay {
    /// Initial learning rate.
    pub initial_learning_rate: f64,
    /// Steps per unit of decay.
    pub decay_steps: f64,
    /// Decay rate.
    pub decay_rate: f64,
    /// Decay in whole units.
    pub staircase: bool,
}

impl LearningRateSchedule for InverseTimeDecay {
    fn get_config(&self) -> Option<serde_json::Value> {
        self.config_json()
    }
    fn at(&self, step: i64) -> f64 {
        let mut p = step as f64 / self.decay_steps;
        if self.staircase {
            p = p.floor();
        }
        self.initial_learning_rate / (1.0 + self.decay_rate * p)
    }
}

/// Cosine decay to `alpha · initial` over `decay_steps` (SGDR without restarts).
#[derive(Debug, Clone, serde::Serialize, serde::Deserialize)]
pub struct CosineDecay {
    /// Initial learning rate.
    pub initial_learning_rate: f64,
    /// Steps to decay over.
    pub decay_steps: f64,
    /// Minimum as a fraction of the initial rate.
    pub alpha: f64,
}

impl LearningRateSchedule for CosineDecay {
    fn get_config(&self) -> Option<serde_json::Value> {
        self.config_json()
    }
    fn at(&self, step: i64) -> f64 {
        let p = (step as f64).min(self.decay_steps) / self.decay_steps;
        let cosine = 0.5 * (1.0 + (PI * p).cos());
        self.initial_learning_rate * ((1.0 - self.alpha) * cosine + self.alpha)
    }
}

/// Cosine decay with warm restarts (SGDR): periods grow by `t_mul`, peaks shrink by `m_mul`.
#[derive(Debug, Clone, serde::Serialize, serde::Deserialize)]
pub struct CosineDecayRestarts {
    /// Initial learning rate.
    pub initial_learning_rate: f64,
    /// Length of the first period.
    pub first_decay_steps: f64,
    /// Period growth factor (TF default 2).
    pub t_mul: f64,
    /// Peak factor per restart (TF default 1).
    pub m_mul: f64,
    /// Minimum as a fraction of the initial rate.
    pub alpha: f64,
}

impl LearningRateSchedule for CosineDecayRestarts {
    fn get_config(&self) -> Option<serde_json::Value> {
        self.config_json()
    }
    fn at(&self, step: i64) -> f64 {
        let frac = step as f64 / self.first_decay_steps;
        let (i_restart, frac) = if self.t_mul == 1.0 {
            let i = frac.floor();
            (i, frac - i)
        } else {
            let i = ((1.0 - frac * (1.0 - self.t_mul)).ln() / self.t_mul.ln()).floor();
            let sum = (1.0 - self.t_mul.powf(i)) / (1.0 - self.t_mul);
            (i, (frac - sum) / self.t_mul.powf(i))
        };
        let m_fac = self.m_mul.powf(i_restart);
        let cosine = 0.5 * m_fac * (1.0 + (PI * frac).cos());
        self.initial_learning_rate * ((1.0 - self.alpha) * cosine + self.alpha)
    }
}
