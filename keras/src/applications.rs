//! Ready-made networks (`tf.keras.applications` in spirit): the ones TensorFlow's MNIST
//! tutorials train, shared by `examples/mnist.rs` and `cargo xtask bench keras`.
//!
//! ```
//! ferroflow::init();
//! use ferroflow_keras::{applications, Model};
//! let mut mlp = Model::from(applications::mnist_mlp());
//! mlp.build(&[28, 28, 1])?;
//! assert_eq!(mlp.count_params(), 235_146);
//! # Ok::<(), ferroflow_tensor::Error>(())
//! ```

use crate::activations::Activation::Relu;
use crate::layer::Layer;
use crate::layers::{Conv2D, Dense, Flatten, MaxPooling2D};
use crate::mixed_precision::{global_policy, Policy};
use crate::model::Sequential;
use crate::sequential;

/// The logits layer: in float32 under a mixed global policy (the mixed precision guide's
/// "keep the model's output in float32").
fn logits(units: usize) -> Dense {
    let d = Dense::new(units);
    if global_policy().is_mixed() {
        d.dtype(Policy::default())
    } else {
        d
    }
}

/// MLP 784-256-128-10 (ReLU; logits out) over 28×28(×1) images, in the global dtype policy.
pub fn mnist_mlp() -> Sequential {
    sequential![
        Flatten::new(),
        Dense::new(256).activation(Relu),
        Dense::new(128).activation(Relu),
        logits(10),
    ]
}

/// CNN Conv32(3×3)-MaxPool-Conv64(3×3)-MaxPool-Dense128-Dense10 (ReLU; logits out) over
/// 28×28×1 images.
pub fn mnist_cnn() -> Sequential {
    sequential![
        Conv2D::new(32, [3, 3]).activation(Relu),
        MaxPooling2D::new([2, 2]),
        Conv2D::new(64, [3, 3]).activation(Relu),
        MaxPooling2D::new([2, 2]),
        Flatten::new(),
        Dense::new(128).activation(Relu),
        logits(10),
    ]
}
