//! The built-in layers (`tf.keras.layers`), and [`deserialize`], which rebuilds any of them
//! from its config.

mod conv;
mod conv3d;
mod core;
mod image_random;
mod lookup;
mod merge;
mod more_conv;
mod norm;
mod preprocessing;
mod recurrent;
mod reshaping;
mod wrappers;

pub use self::conv::{
    AveragePooling1D, AveragePooling2D, Conv2D, GlobalAveragePooling1D, GlobalAveragePooling2D,
    GlobalMaxPooling1D, GlobalMaxPooling2D, MaxPooling1D, MaxPooling2D,
};
pub use self::conv3d::{
    AveragePooling3D, Conv3D, GlobalAveragePooling3D, GlobalMaxPooling3D, MaxPooling3D,
};
pub use self::core::{Activation, Dense, Dropout, Flatten, Rescaling, Reshape};
pub use self::image_random::{
    adjust_contrast, rotation_matrices, transform_images, zoom_matrices, FillMode, RandomContrast,
    RandomFlip, RandomRotation, RandomZoom,
};
pub use self::lookup::{Hashing, IntegerLookup};
pub use self::merge::{Add, Concatenate, Multiply};
pub use self::more_conv::{Conv1D, Conv2DTranspose, DepthwiseConv2D, Embedding, SeparableConv2D};
pub use self::norm::{BatchNormalization, LayerNormalization};
pub use self::preprocessing::{CategoryEncoding, CategoryOutput, Discretization, Normalization};
pub use self::recurrent::{Gru, Lstm, MultiHeadAttention, SimpleRNN};
pub use self::reshaping::{
    resize_images, CenterCrop, Cropping2D, Interpolation, Resizing, UpSampling2D, ZeroPadding2D,
};
pub use self::wrappers::{Bidirectional, MergeMode, TimeDistributed};

use ferroflow_tensor::{Error, Result};
use serde_json::Value;

use crate::layer::Layer;

/// Rebuilds a layer from its full config (`{"class_name", "config"}`, as
/// [`Layer::config`] writes it). Unbuilt: weights are created on first call or loaded.
pub fn deserialize(v: &Value) -> Result<Box<dyn Layer>> {
    let class = v["class_name"]
        .as_str()
        .ok_or_else(|| Error::format("layer config", format!("no class_name in {v}")))?;
    let c = &v["config"];
    let mut layer: Box<dyn Layer> = match class {
        "Dense" => Box::new(Dense::from_config(c)?),
        "Activation" => Box::new(Activation::from_config(c)?),
        "Dropout" => Box::new(Dropout::from_config(c)?),
        "Flatten" => Box::new(Flatten::from_config(c)?),
        "Reshape" => Box::new(Reshape::from_config(c)?),
        "Rescaling" => Box::new(Rescaling::from_config(c)?),
        "Conv2D" => Box::new(Conv2D::from_config(c)?),
        "MaxPooling2D" => Box::new(MaxPooling2D::from_config(c)?),
        "AveragePooling2D" => Box::new(AveragePooling2D::from_config(c)?),
        "GlobalAveragePooling2D" => Box::new(GlobalAveragePooling2D::from_config(c)?),
        "GlobalMaxPooling2D" => Box::new(GlobalMaxPooling2D::from_config(c)?),
        "BatchNormalization" => Box::new(BatchNormalization::from_config(c)?),
        "LayerNormalization" => Box::new(LayerNormalization::from_config(c)?),
        "Add" => Box::new(Add::from_config(c)?),
        "Embedding" => Box::new(Embedding::from_config(c)?),
        "Conv1D" => Box::new(Conv1D::from_config(c)?),
        "Conv2DTranspose" => Box::new(Conv2DTranspose::from_config(c)?),
        "DepthwiseConv2D" => Box::new(DepthwiseConv2D::from_config(c)?),
        "SimpleRNN" => Box::new(SimpleRNN::from_config(c)?),
        "LSTM" => Box::new(Lstm::from_config(c)?),
        "GRU" => Box::new(Gru::from_config(c)?),
        "MultiHeadAttention" => Box::new(MultiHeadAttention::from_config(c)?),
        "Multiply" => Box::new(Multiply::from_config(c)?),
        "Concatenate" => Box::new(Concatenate::from_config(c)?),
        "ZeroPadding2D" => Box::new(ZeroPadding2D::from_config(c)?),
        "Cropping2D" => Box::new(Cropping2D::from_config(c)?),
        "UpSampling2D" => Box::new(UpSampling2D::from_config(c)?),
        "Resizing" => Box::new(Resizing::from_config(c)?),
        "CenterCrop" => Box::new(CenterCrop::from_config(c)?),
        "Normalization" => Box::new(Normalization::from_config(c)?),
        "Discretization" => Box::new(Discretization::from_config(c)?),
        "CategoryEncoding" => Box::new(CategoryEncoding::from_config(c)?),
        "SeparableConv2D" => Box::new(SeparableConv2D::from_config(c)?),
        "MaxPooling1D" => Box::new(MaxPooling1D::from_config(c)?),
        "AveragePooling1D" => Box::new(AveragePooling1D::from_config(c)?),
        "GlobalMaxPooling1D" => Box::new(GlobalMaxPooling1D::from_config(c)?),
        "GlobalAveragePooling1D" => Box::new(GlobalAveragePooling1D::from_config(c)?),
        "TimeDistributed" => Box::new(TimeDistributed::from_config(c)?),
        "Bidirectional" => Box::new(Bidirectional::from_config(c)?),
        "IntegerLookup" => Box::new(IntegerLookup::from_config(c)?),
        "Hashing" => Box::new(Hashing::from_config(c)?),
        "RandomFlip" => Box::new(RandomFlip::from_config(c)?),
        "RandomRotation" => Box::new(RandomRotation::from_config(c)?),
        "RandomZoom" => Box::new(RandomZoom::from_config(c)?),
        "RandomContrast" => Box::new(RandomContrast::from_config(c)?),
        "Conv3D" => Box::new(Conv3D::from_config(c)?),
        "MaxPooling3D" => Box::new(MaxPooling3D::from_config(c)?),
        "AveragePooling3D" => Box::new(AveragePooling3D::from_config(c)?),
        "GlobalMaxPooling3D" => Box::new(GlobalMaxPooling3D::from_config(c)?),
        "GlobalAveragePooling3D" => Box::new(GlobalAveragePooling3D::from_config(c)?),
        "Sequential" => Box::new(crate::model::Sequential::from_config(c)?),
        "Functional" => Box::new(crate::functional::Functional::from_config(c)?),
        other => {
            return Err(Error::format(
                "layer config",
                format!("unknown layer class {other:?}"),
            ))
        }
    };
    apply_common(layer.as_mut(), c)?;
    Ok(layer)
}

/// Applies the common config keys (name, trainable, dtype) to a freshly made layer.
fn apply_common(layer: &mut dyn Layer, c: &Value) -> Result<()> {
    let class = layer.class_name();
    let b = layer.base_mut();
    if let Some(n) = c["name"].as_str() {
        b.set_name(n);
    }
    if let Some(t) = c["trainable"].as_bool() {
        b.trainable = t;
    }
    // A policy name, or Keras' serialized form {"class_name": "Policy", "config": {"name": ..}}.
    let policy = c["dtype"]
        .as_str()
        .or_else(|| c["dtype"]["config"]["name"].as_str());
    // Keras 3 gives the layers that output integers (Hashing, IntegerLookup,
    // Discretization) an integer dtype such as `int64`: what they output anyway, no float
    // policy to set. Elsewhere an integer policy is an error, as before.
    const INTEGER_OUTPUT: [&str; 3] = ["Hashing", "IntegerLookup", "Discretization"];
    let integer = policy
        .and_then(|n| ferroflow_tensor::DType::parse(n).ok())
        .is_some_and(|d| !d.is_float());
    if integer && INTEGER_OUTPUT.contains(&class) {
        return Ok(());
    }
    if let Some(name) = policy {
        b.dtype_policy = crate::mixed_precision::Policy::new(name)?;
    }
    Ok(())
}

/// The current value of a weight `build` creates, or an error when the layer is called
/// before it was built.
pub(crate) fn built_weight(
    v: &Option<ferroflow_tensor::Variable>,
    class: &str,
) -> Result<ferroflow_tensor::Tensor> {
    let v = v.as_ref().ok_or_else(|| {
        Error::invalid(
            "Layer.call",
            format!("{class}: call before build: use `apply`/`forward`"),
        )
    })?;
    crate::mixed_precision::read_variable(v)
}

/// Creates the `kernel` weight (`name`, usually `"kernel"`) and, when `bias` gives its
/// length, initializer and penalty, the `bias` weight: what Dense and the conv layers build.
pub(crate) fn add_kernel_and_bias(
    base: &mut crate::layer::LayerBase,
    name: &str,
    shape: &[usize],
    init: &crate::initializers::Initializer,
    regularizer: Option<crate::regularizers::Regularizer>,
    bias: Option<(
        usize,
        &crate::initializers::Initializer,
        Option<crate::regularizers::Regularizer>,
    )>,
) -> Result<(
    Option<ferroflow_tensor::Variable>,
    Option<ferroflow_tensor::Variable>,
)> {
    let kernel = base.add_weight(name, shape, init, true, regularizer)?;
    let bias = match bias {
        Some((n, init, reg)) => Some(base.add_weight("bias", &[n], init, true, reg)?),
        None => None,
    };
    Ok((Some(kernel), bias))
}

/// `activation(y + bias)`, the bias optional: how Dense and the conv layers finish.
pub(crate) fn bias_and_activation(
    y: ferroflow_tensor::Tensor,
    bias: &Option<ferroflow_tensor::Variable>,
    activation: crate::activations::Activation,
) -> Result<ferroflow_tensor::Tensor> {
    let y = match bias {
        Some(b) => y.add(&crate::mixed_precision::read_variable(b)?)?,
        None => y,
    };
    activation.apply(&y)
}

/// Checks a layer received exactly `n` inputs.
pub(crate) fn expect_inputs(
    layer: &dyn Layer,
    inputs: &[ferroflow_tensor::Tensor],
    n: usize,
) -> Result<()> {
    if inputs.len() != n {
        return Err(Error::invalid(
            "Layer.call",
            format!(
                "{} {:?} takes {n} input(s), got {}",
                layer.class_name(),
                layer.name(),
                inputs.len()
            ),
        ));
    }
    Ok(())
}
