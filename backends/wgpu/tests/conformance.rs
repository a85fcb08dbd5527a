//! The shared backend conformance suite on the first wgpu adapter (`/GPU:0`), with no other
//! backend registered (the suite needs none).
//!
//! Without an adapter every test skips with one loud line, unless `FERROFLOW_REQUIRE_WGPU=1`
//! (CI, which installs Mesa's lavapipe), where a missing adapter fails the run.

/// `/GPU:0` served by wgpu, or `None` after one loud line (a failure when
/// `FERROFLOW_REQUIRE_WGPU=1`).
fn wgpu_device() -> Option<ferroflow_tensor::Device> {
    if ferroflow_wgpu::register() > 0 {
        return Some(ferroflow_tensor::Device::gpu(0));
    }
    ferroflow_tensor::testing::skip(
        "FERROFLOW_REQUIRE_WGPU",
        "wgpu found no adapter (no GPU driver; Debian: mesa-vulkan-drivers libvulkan1 for \
         lavapipe), the wgpu conformance suite did not run",
    );
    None
}

ferroflow_tensor::conformance_tests!(optional: wgpu_device());
