//! Merge layers: Add, Multiply, Concatenate.

use ferroflow_tensor::{Error, Result, Tensor};
use serde_json::{json, Value};

use crate::layer::{Layer, LayerBase};
use crate::layers::core::layer_base;

fn at_least_two(class: &str, inputs: &[Tensor]) -> Result<()> {
    if inputs.len() < 2 {
        return Err(Error::invalid(
            "Layer.call",
            format!(
                "{class} merges a list of at least 2 inputs, got {}",
                inputs.len()
            ),
        ));
    }
    Ok(())
}

macro_rules! elementwise_merge {
    ($name:ident, $class:literal, $prefix:literal, $method:ident, $doc:literal) => {
        #[doc = $doc]
        pub struct $name {
            base: LayerBase,
        }
        impl $name {
            /// The layer.
            pub fn new() -> $name {
                $name {
                    base: LayerBase::new($prefix, None),
                }
            }
            /// Rebuilds from [`Layer::get_config`].
            pub fn from_config(_c: &Value) -> Result<$name> {
                Ok($name::new())
            }
        }
        impl Default for $name {
            fn default() -> Self {
                $name::new()
            }
        }
        impl Layer for $name {
            layer_base!($class);
            fn call(&mut self, inputs: &[Tensor], _training: bool) -> Result<Vec<Tensor>> {
                at_least_two($class, inputs)?;
                let mut acc = inputs[0].clone();
                for x in &inputs[1..] {
                    acc = acc.$method(x)?;
                }
                Ok(vec![acc])
            }
        }
    };
}

elementwise_merge!(
    Add,
    "Add",
    "add",
    add,
    "`tf.keras.layers.Add`: the elementwise sum of its inputs."
);
elementwise_merge!(
    Multiply,
    "Multiply",
    "multiply",
    mul,
    "`tf.keras.layers.Multiply`: the elementwise product of its inputs."
);

/// `tf.keras.layers.Concatenate`: joins its inputs along `axis` (default -1).
pub struct Concatenate {
    base: LayerBase,
    /// The axis.
    pub axis: isize,
}

impl Concatenate {
    /// Concatenation along `axis`.
    pub fn new(axis: isize) -> Concatenate {
        Concatenate {
            base: LayerBase::new("concatenate", None),
            axis,
        }
    }
    /// Rebuilds from [`Layer::get_config`].
    pub fn from_config(c: &Value) -> Result<Concatenate> {
        Ok(Concatenate::new(c["axis"].as_i64().unwrap_or(-1) as isize))
    }
}

impl Layer for Concatenate {
    layer_base!("Concatenate");
    fn call(&mut self, inputs: &[Tensor], _training: bool) -> Result<Vec<Tensor>> {
        at_least_two("Concatenate", inputs)?;
        Ok(vec![Tensor::concat(inputs, self.axis)?])
    }
    fn get_config(&self) -> Value {
        json!({ "axis": self.axis })
    }
}
