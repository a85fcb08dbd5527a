//! `get_config` / `from_config`: an optimizer as Keras-style JSON and back.

use crate::more::{Adadelta, Adamax, Ftrl, Nadam};
use crate::optimizer::{Adagrad, Adam, Optimizer, RmsProp, Sgd};
use crate::schedule::{schedule_from_config, Hyper};
use ferroflow_tensor::{Error, Result};
use serde_json::{json, Map, Value};

const FLAGS: [&str; 3] = ["amsgrad", "nesterov", "centered"];

/// `optimizer.get_config()`: `{"name": ..., "learning_rate": number or schedule config, ...}`
/// with every hyperparameter by its TF name and the clipping options that are set.
///
/// ```
/// ferroflow::init();
/// use ferroflow::optim::{from_config, get_config, Adam, ExponentialDecay};
/// let adam = Adam::new(ExponentialDecay { initial_learning_rate: 0.1, decay_steps: 100.0, decay_rate: 0.9, staircase: true });
/// let cfg = get_config(&adam)?;
/// assert_eq!(cfg["learning_rate"]["class_name"], "ExponentialDecay");
/// let back = from_config(&cfg)?;
/// assert_eq!(get_config(back.as_ref())?, cfg);
/// # Ok::<(), ferroflow::Error>(())
/// ```
pub fn get_config(opt: &dyn Optimizer) -> Result<Value> {
    if let (Some(inner), Some(mode)) = (opt.inner_optimizer(), opt.loss_scale_mode()) {
        // TF 2.4's LossScaleOptimizer config: the inner optimizer and the scale's mode (the
        // current scale is state, in the optimizer's weights).
        let growth = match mode {
            crate::LossScale::Dynamic { growth_steps, .. } => json!(growth_steps),
            crate::LossScale::Fixed(_) => Value::Null,
        };
        return Ok(json!({
            "name": opt.name(),
            "inner_optimizer": get_config(inner)?,
            "dynamic": matches!(mode, crate::LossScale::Dynamic { .. }),
            "initial_scale": mode.initial_scale(),
            "dynamic_growth_steps": growth,
        }));
    }
    let mut m = Map::new();
    m.insert("name".into(), json!(opt.name()));
    m.insert(
        "learning_rate".into(),
        hyper_json("learning_rate", opt.learning_rate())?,
    );
    for (k, h) in opt.hyperparameters() {
        if k == "learning_rate" || k == "loss_scale" {
            continue;
        }
        let v = match h {
            Hyper::Const(v) if FLAGS.contains(&k) => json!(v != 0.0),
            other => hyper_json(k, &other)?,
        };
        m.insert(k.into(), v);
    }
    let core = opt.core();
    if !m.contains_key("decay") {
        m.insert("decay".into(), json!(core.decay));
    }
    for (k, v) in [
        ("clipvalue", core.clipvalue),
        ("clipnorm", core.clipnorm),
        ("global_clipnorm", core.global_clipnorm),
    ] {
        if let Some(v) = v {
            m.insert(k.into(), json!(v));
        }
    }
    Ok(Value::Object(m))
}

fn hyper_json(name: &str, h: &Hyper) -> Result<Value> {
    Ok(match h {
        Hyper::Const(v) => json!(v),
        Hyper::Schedule(s) => s.get_config().ok_or_else(|| {
            Error::invalid(
                "get_config",
                format!("the schedule of {name} is a user type without get_config"),
            )
        })?,
    })
}

/// `Optimizer.from_config(config)`: rebuilds any optimizer of this crate from [`get_config`].
pub fn from_config(cfg: &Value) -> Result<Box<dyn Optimizer>> {
    let bad = |msg: String| Error::invalid("from_config", msg);
    let name = cfg
        .get("name")
        .and_then(Value::as_str)
        .ok_or_else(|| bad("missing \"name\"".into()))?;
    if name == "LossScaleOptimizer" {
        // TF 2.4's arguments: `dynamic` (default true), `initial_scale` (2^15 when dynamic,
        // required otherwise), `dynamic_growth_steps` (2000; must be absent when fixed).
        let inner = from_config(&cfg["inner_optimizer"])?;
        let num = |k: &str, default: f64| cfg.get(k).and_then(Value::as_f64).unwrap_or(default);
        let given = |k: &str| cfg.get(k).filter(|v| !v.is_null());
        let dynamic = cfg.get("dynamic").and_then(Value::as_bool).unwrap_or(true);
        let mode = if dynamic {
            let growth = num("dynamic_growth_steps", 2000.0);
            if !(growth >= 1.0 && growth <= u32::MAX as f64 && growth.fract() == 0.0) {
                return Err(bad(format!(
                    "dynamic_growth_steps must be a whole number ≥ 1, got {}",
                    cfg["dynamic_growth_steps"]
                )));
            }
            crate::LossScale::Dynamic {
                initial_scale: num("initial_scale", 32768.0),
                growth_steps: growth as u32,
            }
        } else {
            if given("dynamic_growth_steps").is_some() {
                return Err(bad(format!(
                    "\"dynamic_growth_steps\" must be None if \"dynamic\" is False, but got: {}",
                    cfg["dynamic_growth_steps"]
                )));
            }
            let Some(scale) = given("initial_scale").and_then(Value::as_f64) else {
                return Err(bad(
                    "\"initial_scale\" must be specified if \"dynamic\" is False".into(),
                ));
            };
            crate::LossScale::Fixed(scale)
        };
        return Ok(Box::new(crate::LossScaleOptimizer::new(inner, mode)?));
    }
    let lr: Hyper = match cfg.get("learning_rate") {
        Some(Value::Number(n)) => n.as_f64().unwrap_or(0.001).into(),
        Some(v @ Value::Object(_)) => schedule_from_config(v)
            .ok_or_else(|| bad(format!("unknown learning-rate schedule {v}")))?,
        _ => return Err(bad("missing \"learning_rate\"".into())),
    };
    let num = |k: &str, default: f64| cfg.get(k).and_then(Value::as_f64).unwrap_or(default);
    let hyp = |k: &str, default: f64| -> Result<Hyper> {
        match cfg.get(k) {
            None => Ok(Hyper::Const(default)),
            Some(Value::Number(n)) => Ok(Hyper::Const(n.as_f64().unwrap_or(default))),
            Some(v) => {
                schedule_from_config(v).ok_or_else(|| bad(format!("{k}: unknown schedule {v}")))
            }
        }
    };
    let flag = |k: &str| cfg.get(k).and_then(Value::as_bool).unwrap_or(false);
    let mut opt: Box<dyn Optimizer> = match name {
        "SGD" => Box::new(Sgd::new(lr).with_momentum(hyp("momentum", 0.0)?, flag("nesterov"))),
        "Adam" | "AdamW" => {
            let mut a = Adam::new(lr);
            (a.beta_1, a.beta_2, a.epsilon, a.amsgrad, a.weight_decay) = (
                hyp("beta_1", 0.9)?,
                hyp("beta_2", 0.999)?,
                hyp("epsilon", 1e-7)?,
                flag("amsgrad"),
                hyp("weight_decay", 0.0)?,
            );
            Box::new(a)
        }
        "RMSprop" => {
            let mut r = RmsProp::new(lr);
            (r.rho, r.momentum, r.epsilon, r.centered) = (
                hyp("rho", 0.9)?,
                hyp("momentum", 0.0)?,
                hyp("epsilon", 1e-7)?,
                flag("centered"),
            );
            Box::new(r)
        }
        "Adagrad" => {
            let mut a = Adagrad::new(lr);
            (a.initial_accumulator_value, a.epsilon) =
                (num("initial_accumulator_value", 0.1), hyp("epsilon", 1e-7)?);
            Box::new(a)
        }
        "Adadelta" => {
            let mut a = Adadelta::new(lr);
            (a.rho, a.epsilon) = (hyp("rho", 0.95)?, hyp("epsilon", 1e-7)?);
            Box::new(a)
        }
        "Adamax" => {
            let mut a = Adamax::new(lr);
            (a.beta_1, a.beta_2, a.epsilon) = (
                hyp("beta_1", 0.9)?,
                hyp("beta_2", 0.999)?,
                hyp("epsilon", 1e-7)?,
            );
            Box::new(a)
        }
        "Nadam" => {
            let mut a = Nadam::new(lr);
            // TF 2.4's Nadam keeps its momentum schedule's decay as `decay`.
            a.schedule_decay = num("decay", 0.004);
            (a.beta_1, a.beta_2, a.epsilon) = (
                hyp("beta_1", 0.9)?,
                hyp("beta_2", 0.999)?,
                hyp("epsilon", 1e-7)?,
            );
            Box::new(a)
        }
        "Ftrl" => {
            let mut f = Ftrl::new(lr);
            f.learning_rate_power = hyp("learning_rate_power", -0.5)?;
            f.initial_accumulator_value = num("initial_accumulator_value", 0.1);
            f.l1 = hyp("l1_regularization_strength", 0.0)?;
            f.l2 = hyp("l2_regularization_strength", 0.0)?;
            f.l2_shrinkage = hyp("l2_shrinkage_regularization_strength", 0.0)?;
            f.beta = hyp("beta", 0.0)?;
            Box::new(f)
        }
        other => return Err(bad(format!("unknown optimizer {other:?}"))),
    };
    let core = opt.core_mut();
    if name != "Nadam" {
        core.decay = num("decay", 0.0);
    }
    core.clipvalue = cfg.get("clipvalue").and_then(Value::as_f64);
    core.clipnorm = cfg.get("clipnorm").and_then(Value::as_f64);
    core.global_clipnorm = cfg.get("global_clipnorm").and_then(Value::as_f64);
    core.check_options()
        .map_err(|e| bad(format!("{name}: {e}")))?;
    Ok(opt)
}
