//! What the MNIST examples share: the MNIST copy in `datasets/mnist`, read as the tutorials
//! prepare it.

use std::path::{Path, PathBuf};

use ferroflow::{DType, Result, Tensor};

/// The folder of the MNIST copy in the repository.
pub fn mnist_dir() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("datasets/mnist")
}

/// One split (`"train"` or `"t10k"`): images as f32 in [0, 1], shape [n, 28, 28, 1]; labels
/// as int64, shape [n].
pub fn load_mnist(split: &str) -> Result<(Tensor, Tensor)> {
    let dir = mnist_dir();
    let images = ferroflow::data::idx::read(dir.join(format!("{split}-images-idx3-ubyte.gz")))?;
    let labels = ferroflow::data::idx::read(dir.join(format!("{split}-labels-idx1-ubyte.gz")))?;
    let n = images.shape()[0];
    let x = images
        .cast(DType::F32)?
        .div(&Tensor::scalar(255.0f32)?)?
        .reshape_to(&[n, 28, 28, 1])?;
    Ok((x, labels.cast(DType::I64)?))
}
