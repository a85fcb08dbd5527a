//! ferroflow-keras: Keras for ferroflow (`tf.keras`): layers, `Sequential` and functional
//! models, `compile`/`fit`/`evaluate`/`predict`, losses, metrics, callbacks, and weights as
//! safetensors.
//!
//! # Overview
//! - [`Layer`] (with its [`LayerBase`]): a computation with weights, built lazily on its
//!   first input shape; [`layers`] holds the layers, [`initializers`] and [`regularizers`]
//!   what their weights start from and are penalised by.
//! - [`Sequential`] (the [`sequential!`] macro) and [`Functional`] (symbolic
//!   [`KerasTensor`]s from [`input`]) compose layers into a network, itself a `Layer`.
//! - [`Model`] wraps a network: `compile` with an optimizer (`ferroflow-optim`), a loss
//!   ([`losses`]) and [`metrics`]; `fit` runs `train_step` (forward under a
//!   `GradientTape`, `apply_gradients`) over batches from arrays or a `ferroflow-data`
//!   `Dataset`, calling [`callbacks`] around epochs and batches; `save`/`load` and
//!   `save_weights`/`load_weights` go through [`saving`] (crash-safe safetensors files).
//! - [`mixed_precision`]: the dtype `Policy`, autocast of variables inside `Layer::apply`,
//!   and loss scaling through the optimizer.
//!
//! ```
//! ferroflow::init();
//! use ferroflow_keras::{activations::Activation, layers::Dense, losses, sequential, FitConfig, Model};
//! use ferroflow_optim::Adam;
//! use ferroflow_tensor::{random, DType};
//! // Learn the sign of the sum of two numbers.
//! let x = random::stateless_normal(&[256, 2], [1, 2], 0.0, 1.0, DType::F32)?;
//! let y = x.reduce_sum(-1isize, true)?.greater(&x.scalar_like(0.0)?)?.cast(DType::F32)?;
//! let mut model = Model::from(sequential![
//!     Dense::new(8).activation(Activation::Relu),
//!     Dense::new(1).activation(Activation::Sigmoid),
//! ]);
//! model.compile(Adam::new(0.05), losses::BinaryCrossentropy::new(false), &["accuracy"])?;
//! let history = model.fit(&x, &y, FitConfig::new().epochs(40).batch_size(64).verbose(0))?;
//! assert!(history.get("accuracy").unwrap().last().unwrap() > &0.9);
//! # Ok::<(), ferroflow_tensor::Error>(())
//! ```

#![warn(missing_docs)]

pub mod activations;
pub mod applications;
pub mod callbacks;
pub mod functional;
pub mod initializers;
pub mod layer;
pub mod layers;
pub mod losses;
pub mod metrics;
pub mod mixed_precision;
pub mod model;
pub mod regularizers;
pub mod saving;

pub use callbacks::{Callback, History, Logs};
pub use functional::{input, Functional, KerasTensor, Symbolic};
pub use layer::{Layer, LayerBase, LayerRef};
pub use model::{
    fit_functions, Batch, Data, DatasetCreator, FitBatch, FitConfig, Model, Sequential,
    ValidationData,
};
