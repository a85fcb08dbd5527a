//! [`Sequential`]: a stack of layers, and the `sequential!` macro.

use ferroflow_tensor::{Error, Result, Tensor};
use serde_json::{json, Value};

use crate::layer::{Layer, LayerBase};

/// A stack of layers, each feeding the next (`tf.keras.Sequential`). It is a [`Layer`];
/// wrap it in a [`Model`](super::Model) (`Model::from(seq)`) to compile and fit it.
///
/// ```
/// ferroflow::init();
/// use ferroflow_keras::{activations::Activation, layers::{Dense, Flatten}, sequential, Model};
/// let mut model = Model::from(sequential![
///     Flatten::new(),
///     Dense::new(16).activation(Activation::Relu),
///     Dense::new(10),
/// ]);
/// model.build(&[28, 28])?;
/// assert_eq!(model.count_params(), 784 * 16 + 16 + 16 * 10 + 10);
/// # Ok::<(), ferroflow_tensor::Error>(())
/// ```
pub struct Sequential {
    base: LayerBase,
    layers: Vec<Box<dyn Layer>>,
}

/// Builds a [`Sequential`] from layers: `sequential![Dense::new(8), Dense::new(1)]`.
#[macro_export]
macro_rules! sequential {
    ($($layer:expr),* $(,)?) => {{
        let mut s = $crate::model::Sequential::new();
        $( s.add($layer); )*
        s
    }};
}

impl Sequential {
    /// An empty stack.
    pub fn new() -> Sequential {
        Sequential {
            base: LayerBase::new("sequential", None),
            layers: vec![],
        }
    }
    /// Appends a layer.
    pub fn add(&mut self, layer: impl Layer + 'static) -> &mut Sequential {
        self.layers.push(Box::new(layer));
        self
    }
    /// Appends a boxed layer.
    pub fn add_boxed(&mut self, layer: Box<dyn Layer>) -> &mut Sequential {
        self.layers.push(layer);
        self
    }
    /// The layers.
    pub fn layers(&self) -> &[Box<dyn Layer>] {
        &self.layers
    }
    /// The layers, mutably (to freeze one: `layers_mut()[0].base_mut().trainable = false`).
    pub fn layers_mut(&mut self) -> &mut [Box<dyn Layer>] {
        &mut self.layers
    }
    /// Rebuilds from [`Layer::get_config`].
    pub fn from_config(c: &Value) -> Result<Sequential> {
        let mut s = Sequential::new();
        let layers = c["layers"]
            .as_array()
            .ok_or_else(|| Error::format("Sequential config", "missing list \"layers\""))?;
        for l in layers {
            s.layers.push(crate::layers::deserialize(l)?);
        }
        Ok(s)
    }
}

impl Default for Sequential {
    fn default() -> Self {
        Sequential::new()
    }
}

impl Layer for Sequential {
    fn base(&self) -> &LayerBase {
        &self.base
    }
    fn base_mut(&mut self) -> &mut LayerBase {
        &mut self.base
    }
    fn class_name(&self) -> &'static str {
        "Sequential"
    }
    fn call(&mut self, inputs: &[Tensor], training: bool) -> Result<Vec<Tensor>> {
        let mut x = inputs.to_vec();
        for l in &mut self.layers {
            x = l.apply(&x, training)?;
        }
        Ok(x)
    }
    fn get_config(&self) -> Value {
        json!({ "layers": self.layers.iter().map(|l| l.config()).collect::<Vec<_>>() })
    }
    fn sublayers(&self) -> Vec<&dyn Layer> {
        self.layers.iter().map(|l| l.as_ref()).collect()
    }
}
