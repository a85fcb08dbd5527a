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
pub fn load_mnist(split: &str) -> Result<(Tensor, Tensor)> {
    ferroflow::data::idx::load_mnist(mnist_dir(), split)
}
