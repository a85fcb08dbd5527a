//! Layer wrappers: TimeDistributed and Bidirectional.

use ferroflow_tensor::{Error, Result, Tensor};
use serde_json::{json, Value};

use crate::layer::{cfg, Layer, LayerBase};
use crate::layers::core::layer_base;
use crate::layers::{deserialize, expect_inputs};

/// `tf.keras.layers.TimeDistributed`: applies a layer to every step of `[batch, steps,
/// ...]` (one call on `[batch · steps, ...]`, so the layer's weights are shared by the
/// steps).
///
/// ```
/// ferroflow::init();
/// use ferroflow_keras::{layers::{Dense, TimeDistributed}, Layer};
/// use ferroflow_tensor::{DType, Tensor};
/// let mut td = TimeDistributed::new(Dense::new(4));
/// let y = td.forward(&Tensor::ones(&[2, 5, 3], DType::F32)?, false)?;
/// assert_eq!(y.shape(), &[2, 5, 4]);
/// assert_eq!(td.count_params(), 3 * 4 + 4);
/// # Ok::<(), ferroflow_tensor::Error>(())
/// ```
pub struct TimeDistributed {
    base: LayerBase,
    layer: Box<dyn Layer>,
}

impl TimeDistributed {
    /// Wraps `layer`.
    pub fn new(layer: impl Layer + 'static) -> TimeDistributed {
        TimeDistributed::wrap(Box::new(layer))
    }
    /// Wraps a boxed layer.
    pub fn wrap(layer: Box<dyn Layer>) -> TimeDistributed {
        let name = format!("time_distributed_{}", layer.name());
        TimeDistributed {
            base: LayerBase::new(&name, None),
            layer,
        }
    }
    /// Rebuilds from [`Layer::get_config`] (or Keras' own config).
    pub fn from_config(c: &Value) -> Result<TimeDistributed> {
        Ok(TimeDistributed::wrap(deserialize(cfg(
            c,
            "TimeDistributed",
            "layer",
        )?)?))
    }
}

impl Layer for TimeDistributed {
    layer_base!("TimeDistributed");
    fn call(&mut self, inputs: &[Tensor], training: bool) -> Result<Vec<Tensor>> {
        expect_inputs(self, inputs, 1)?;
        let x = &inputs[0];
        let (b, t) = match x.shape() {
            [b, t, ..] => (*b, *t),
            s => {
                return Err(Error::invalid(
                    "TimeDistributed",
                    format!("expects [batch, steps, ...] (rank ≥ 3), got shape {s:?}"),
                ))
            }
        };
        if x.rank() < 3 {
            return Err(Error::invalid(
                "TimeDistributed",
                format!(
                    "expects [batch, steps, ...] (rank ≥ 3), got shape {:?}",
                    x.shape()
                ),
            ));
        }
        let mut flat = vec![b * t];
        flat.extend_from_slice(&x.shape()[2..]);
        let y = self.layer.forward(&x.reshape_to(&flat)?, training)?;
        let mut shape = vec![b, t];
        shape.extend_from_slice(&y.shape()[1..]);
        Ok(vec![y.reshape_to(&shape)?])
    }
    fn sublayers(&self) -> Vec<&dyn Layer> {
        vec![self.layer.as_ref()]
    }
    fn get_config(&self) -> Value {
        json!({ "layer": self.layer.config() })
    }
}

/// How [`Bidirectional`] combines the two directions (`merge_mode`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum MergeMode {
    /// Concatenated features (the default).
    Concat,
    /// Summed.
    Sum,
    /// Multiplied.
    Mul,
    /// Averaged.
    Ave,
}

impl MergeMode {
    fn name(self) -> &'static str {
        match self {
            MergeMode::Concat => "concat",
            MergeMode::Sum => "sum",
            MergeMode::Mul => "mul",
            MergeMode::Ave => "ave",
        }
    }
}

/// `tf.keras.layers.Bidirectional`: a recurrent layer run forwards and a copy of it run
/// backwards (`go_backwards` flipped), their outputs merged; with `return_sequences` the
/// backward outputs are put back in time order first, as Keras does. Weights: the forward
/// layer's, then the backward layer's.
///
/// ```
/// ferroflow::init();
/// use ferroflow_keras::{layers::{Bidirectional, Lstm}, Layer};
/// use ferroflow_tensor::{DType, Tensor};
/// let mut bi = Bidirectional::new(Lstm::new(4).return_sequences(true))?;
/// let y = bi.forward(&Tensor::ones(&[2, 5, 3], DType::F32)?, false)?;
/// assert_eq!(y.shape(), &[2, 5, 8]);
/// # Ok::<(), ferroflow_tensor::Error>(())
/// ```
pub struct Bidirectional {
    base: LayerBase,
    forward: Box<dyn Layer>,
    backward: Box<dyn Layer>,
    /// How the directions combine.
    pub merge_mode: MergeMode,
}

const RNN_CLASSES: [&str; 3] = ["SimpleRNN", "LSTM", "GRU"];

impl Bidirectional {
    /// Wraps a SimpleRNN, LSTM or GRU.
    pub fn new(layer: impl Layer + 'static) -> Result<Bidirectional> {
        Bidirectional::wrap(Box::new(layer), MergeMode::Concat)
    }
    /// Sets how the directions combine.
    pub fn merge_mode(mut self, mode: MergeMode) -> Bidirectional {
        self.merge_mode = mode;
        self
    }
    /// Wraps a boxed recurrent layer (the backward copy is made from its config).
    pub fn wrap(layer: Box<dyn Layer>, merge_mode: MergeMode) -> Result<Bidirectional> {
        if !RNN_CLASSES.contains(&layer.class_name()) {
            return Err(Error::invalid(
                "Bidirectional",
                format!(
                    "wraps a SimpleRNN, LSTM or GRU, got {} {:?}",
                    layer.class_name(),
                    layer.name()
                ),
            ));
        }
        let mut config = layer.config();
        let inner = &mut config["config"];
        let backwards = !inner["go_backwards"].as_bool().unwrap_or(false);
        inner["go_backwards"] = json!(backwards);
        let base_name = layer.name().to_string();
        inner["name"] = json!(format!("backward_{base_name}"));
        let backward = deserialize(&config)?;
        let mut forward = layer;
        forward.base_mut().set_name(format!("forward_{base_name}"));
        Ok(Bidirectional {
            base: LayerBase::new(&format!("bidirectional_{base_name}"), None),
            forward,
            backward,
            merge_mode,
        })
    }
    /// Rebuilds from [`Layer::get_config`] (or Keras' own config).
    pub fn from_config(c: &Value) -> Result<Bidirectional> {
        let mode = match c.get("merge_mode").and_then(Value::as_str) {
            None | Some("concat") => MergeMode::Concat,
            Some("sum") => MergeMode::Sum,
            Some("mul") => MergeMode::Mul,
            Some("ave") => MergeMode::Ave,
            Some(other) => {
                return Err(Error::format(
                    "Bidirectional config",
                    format!("merge_mode {other:?} is not supported (concat, sum, mul, ave)"),
                ))
            }
        };
        let mut layer_cfg = cfg(c, "Bidirectional", "layer")?.clone();
        // The config names the wrapped layer; the directions get their own names.
        if let Some(n) = layer_cfg["config"]["name"].as_str() {
            let n = n.trim_start_matches("forward_").to_string();
            layer_cfg["config"]["name"] = json!(n);
        }
        Bidirectional::wrap(deserialize(&layer_cfg)?, mode)
    }
}

impl Layer for Bidirectional {
    layer_base!("Bidirectional");
    fn call(&mut self, inputs: &[Tensor], training: bool) -> Result<Vec<Tensor>> {
        expect_inputs(self, inputs, 1)?;
        let x = &inputs[0];
        let fwd = self.forward.forward(x, training)?;
        let mut bwd = self.backward.forward(x, training)?;
        if bwd.rank() == 3 {
            // A backward sequence comes out last step first: back to time order.
            bwd = bwd.reverse(&[1])?;
        }
        let y = match self.merge_mode {
            MergeMode::Concat => Tensor::concat(&[fwd, bwd], -1)?,
            MergeMode::Sum => fwd.add(&bwd)?,
            MergeMode::Mul => fwd.mul(&bwd)?,
            MergeMode::Ave => fwd.add(&bwd)?.mul(&fwd.scalar_like(0.5)?)?,
        };
        Ok(vec![y])
    }
    fn sublayers(&self) -> Vec<&dyn Layer> {
        vec![self.forward.as_ref(), self.backward.as_ref()]
    }
    fn get_config(&self) -> Value {
        json!({ "layer": self.forward.config(), "merge_mode": self.merge_mode.name() })
    }
}
