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
use crate::layers::{Conv2D, Dense, Flatten, MaxPooling2D};
use crate::model::Sequential;
use crate::sequential;

/// MLP 784-256-128-10 (ReLU; logits out) over 28×28(×1) images.
pub fn mnist_mlp() -> Sequential {
    sequential![
        Flatten::new(),
        Dense::new(256).activation(Relu),
        Dense::new(128).activation(Relu),
        Dense::new(10),
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
        Dense::new(10),
    ]
}
