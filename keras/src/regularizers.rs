//! Weight regularizers (`tf.keras.regularizers`): their penalties join the training loss.
//!
//! ```
//! ferroflow::init();
//! use ferroflow_keras::regularizers::Regularizer;
//! let w = ferroflow_tensor::Tensor::from_vec(vec![1.0f32, -2.0], &[2])?;
//! let p = Regularizer::l1_l2(0.1, 0.01).penalty(&w)?.item::<f32>()?;
//! assert!((p - (0.1 * 3.0 + 0.01 * 5.0)).abs() < 1e-6);
//! # Ok::<(), ferroflow_tensor::Error>(())
//! ```

use ferroflow_tensor::{Axes, Error, Result, Tensor};
use serde_json::{json, Value};

/// `l1 · Σ|w| + l2 · Σw²` (Keras' `L1L2`; `l1` and `l2` alone are special cases).
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Regularizer {
    /// The L1 factor.
    pub l1: f64,
    /// The L2 factor.
    pub l2: f64,
}

impl Regularizer {
    /// `tf.keras.regularizers.l1(l1)`.
    pub fn l1(l1: f64) -> Regularizer {
        Regularizer { l1, l2: 0.0 }
    }
    /// `tf.keras.regularizers.l2(l2)`.
    pub fn l2(l2: f64) -> Regularizer {
        Regularizer { l1: 0.0, l2 }
    }
    /// `tf.keras.regularizers.l1_l2(l1, l2)`.
    pub fn l1_l2(l1: f64, l2: f64) -> Regularizer {
        Regularizer { l1, l2 }
    }

    /// The penalty for `w`, a scalar of `w`'s dtype.
    pub fn penalty(&self, w: &Tensor) -> Result<Tensor> {
        let mut total = w.scalar_like(0.0)?;
        if self.l1 != 0.0 {
            let s = w.abs()?.reduce_sum(Axes::All, false)?;
            total = total.add(&s.mul(&w.scalar_like(self.l1)?)?)?;
        }
        if self.l2 != 0.0 {
            let s = w.square()?.reduce_sum(Axes::All, false)?;
            total = total.add(&s.mul(&w.scalar_like(self.l2)?)?)?;
        }
        Ok(total)
    }

    /// `{"class_name": "L1L2", "config": {"l1": .., "l2": ..}}`.
    pub fn to_config(&self) -> Value {
        json!({"class_name": "L1L2", "config": {"l1": self.l1, "l2": self.l2}})
    }

    /// Parses [`Regularizer::to_config`]'s output (also `"L1"`/`"L2"` classes).
    pub fn from_config(v: &Value) -> Result<Regularizer> {
        let c = &v["config"];
        let get = |k: &str| c[k].as_f64().unwrap_or(0.0);
        match v["class_name"].as_str() {
            Some("L1L2") => Ok(Regularizer::l1_l2(get("l1"), get("l2"))),
            Some("L1") => Ok(Regularizer::l1(get("l1"))),
            Some("L2") => Ok(Regularizer::l2(get("l2"))),
            _ => Err(Error::format(
                "regularizer config",
                format!("expected class L1L2, L1 or L2, got {v}"),
            )),
        }
    }
}
