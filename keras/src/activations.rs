//! Activation functions by Keras name (`tf.keras.activations`).
//!
//! ```
//! ferroflow::init();
//! use ferroflow_keras::activations::Activation;
//! let x = ferroflow_tensor::Tensor::from_vec(vec![-1.0f32, 0.0, 2.0], &[3])?;
//! let y = Activation::parse("relu")?.apply(&x)?;
//! assert_eq!(y.to_vec::<f32>()?, vec![0.0, 0.0, 2.0]);
//! # Ok::<(), ferroflow_tensor::Error>(())
//! ```

use ferroflow_tensor::{Error, Result, Tensor};

/// An activation function. Every one is composed from differentiable tensor ops.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum Activation {
    /// Identity (`"linear"`, Keras' default).
    Linear,
    /// `max(x, 0)`.
    Relu,
    /// `1 / (1 + e^-x)`.
    Sigmoid,
    /// `tanh x`.
    Tanh,
    /// Softmax over the last axis.
    Softmax,
    /// Gaussian error linear unit, exact (erf) form (TF's default `approximate=False`).
    Gelu,
    /// `x · sigmoid(x)` (also `"silu"`).
    Swish,
    /// `x` for `x > 0`, `e^x - 1` otherwise.
    Elu,
    /// Scaled ELU with the self-normalising constants.
    Selu,
    /// `log(1 + e^x)`.
    Softplus,
    /// `x / (1 + |x|)`.
    Softsign,
    /// `max(x, alpha·x)`; the string name gives TF's default `alpha = 0.2`.
    LeakyRelu(f64),
    /// `min(max(x, 0), 6)`.
    Relu6,
    /// `e^x`.
    Exponential,
}

impl Activation {
    /// The activation for a Keras name (`"relu"`, `"softmax"`, `"leaky_relu"`, ...).
    pub fn parse(name: &str) -> Result<Activation> {
        use Activation::*;
        Ok(match name {
            "linear" | "" => Linear,
            "relu" => Relu,
            "sigmoid" => Sigmoid,
            "tanh" => Tanh,
            "softmax" => Softmax,
            "gelu" => Gelu,
            "swish" | "silu" => Swish,
            "elu" => Elu,
            "selu" => Selu,
            "softplus" => Softplus,
            "softsign" => Softsign,
            "leaky_relu" => LeakyRelu(0.2),
            "relu6" => Relu6,
            "exponential" => Exponential,
            other => {
                return Err(Error::invalid(
                    "activation",
                    format!(
                        "unknown activation {other:?}; known: linear, relu, sigmoid, tanh, \
                         softmax, gelu, swish, elu, selu, softplus, softsign, leaky_relu, relu6, \
                         exponential"
                    ),
                ))
            }
        })
    }

    /// The Keras name (what `get_config` stores).
    pub fn name(&self) -> &'static str {
        use Activation::*;
        match self {
            Linear => "linear",
            Relu => "relu",
            Sigmoid => "sigmoid",
            Tanh => "tanh",
            Softmax => "softmax",
            Gelu => "gelu",
            Swish => "swish",
            Elu => "elu",
            Selu => "selu",
            Softplus => "softplus",
            Softsign => "softsign",
            LeakyRelu(_) => "leaky_relu",
            Relu6 => "relu6",
            Exponential => "exponential",
        }
    }

    /// Applies the activation.
    pub fn apply(&self, x: &Tensor) -> Result<Tensor> {
        use Activation::*;
        match *self {
            Linear => Ok(x.clone()),
            Relu => x.relu(),
            Sigmoid => x.sigmoid(),
            Tanh => x.tanh(),
            Softmax => x.softmax(-1),
            Gelu => x.gelu(),
            Swish => x.swish(),
            Elu => x.elu(1.0),
            Selu => x.selu(),
            Softplus => x.softplus(),
            Softsign => x.div(&x.abs()?.add(&x.scalar_like(1.0)?)?),
            LeakyRelu(alpha) => x.leaky_relu(alpha),
            Relu6 => x.relu()?.minimum(&x.scalar_like(6.0)?),
            Exponential => x.exp(),
        }
    }
}
