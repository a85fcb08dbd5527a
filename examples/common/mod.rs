//! What the MNIST examples share: the MNIST copy in `datasets/mnist`, read as the tutorials
//! prepare it.

use std::path::{Path, PathBuf};

use ferroflow::{Result, Tensor};

/// The folder of the MNIST copy in the repository.
pub fn mnist_dir() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("datasets/mnist")
}

/// One split (`"train"` or `"t10k"`): images as f32 in [0, 1], shape [n, 28, 28, 1]; labels
/// as int64, shape [n].
#[allow(dead_code)] // each example compiles this module; the main job uses the pixels
pub fn load_mnist(split: &str) -> Result<(Tensor, Tensor)> {
    ferroflow::data::idx::load_mnist(mnist_dir(), split)
}

/// One split with the images as stored, `u8` pixels `[n, 28, 28, 1]` (a quarter of the f32
/// memory; the model scales them, `Rescaling(1/255)`); labels as int64.
#[allow(dead_code)] // each example compiles this module; only the main job uses this
pub fn load_mnist_pixels(split: &str) -> Result<(Tensor, Tensor)> {
    ferroflow::data::idx::load_mnist_pixels(mnist_dir(), split)
}
