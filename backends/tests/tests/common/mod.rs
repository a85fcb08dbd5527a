//! Finding the wgpu device for the tests, or saying loudly why they skip.

use ferroflow_tensor::{DType, Device, Result, Tensor};
use std::path::Path;

/// `/GPU:0` served by wgpu, or `None` (after one loud line) when no adapter exists; panics
/// instead when `FERROFLOW_REQUIRE_WGPU=1`.
pub fn wgpu_device() -> Option<Device> {
    ferroflow_cpu::register();
    let n = ferroflow_wgpu::register();
    if n > 0 {
        return Some(Device::gpu(0));
    }
    ferroflow_tensor::testing::skip(
        "FERROFLOW_REQUIRE_WGPU",
        "wgpu found no adapter (no GPU driver; Debian: mesa-vulkan-drivers libvulkan1 for \
         lavapipe), the wgpu tests did not run",
    );
    None
}

/// The first `n` MNIST training images as f32 in [0, 1] (`[n, 28, 28, 1]`) and their int64
/// labels, from the repository's copy (beside the sources, or under the current directory
/// for a prebuilt test binary).
#[allow(dead_code)] // not every test file trains
pub fn mnist(n: usize) -> Result<(Tensor, Tensor)> {
    let built = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../datasets/mnist");
    let dir = if built.exists() {
        built
    } else {
        Path::new("datasets/mnist").to_path_buf()
    };
    let images = ferroflow_data::idx::read(dir.join("train-images-idx3-ubyte.gz"))?;
    let labels = ferroflow_data::idx::read(dir.join("train-labels-idx1-ubyte.gz"))?;
    let x = images
        .slice(&[0, 0, 0], &[n as isize, -1, -1])?
        .cast(DType::F32)?
        .div(&Tensor::scalar(255.0f32)?)?
        .reshape_to(&[n, 28, 28, 1])?;
    Ok((x, labels.slice(&[0], &[n as isize])?.cast(DType::I64)?))
}
