//! Finding the wgpu device for the tests, or saying loudly why they skip.

use ferroflow_tensor::Device;

/// `/GPU:0` served by wgpu, or `None` (after one loud line) when no adapter exists; panics
/// instead when `FERROFLOW_REQUIRE_WGPU=1`.
pub fn wgpu_device() -> Option<Device> {
    ferroflow_cpu::register();
    let n = ferroflow_wgpu::register();
    if n > 0 {
        return Some(Device::gpu(0));
    }
    if std::env::var("FERROFLOW_REQUIRE_WGPU").is_ok_and(|v| v == "1") {
        panic!(
            "FERROFLOW_REQUIRE_WGPU=1 but wgpu found no adapter: install a Vulkan driver \
             (Debian: mesa-vulkan-drivers libvulkan1)"
        );
    }
    eprintln!(
        "SKIPPED: no wgpu adapter (no GPU driver; install mesa-vulkan-drivers for lavapipe), \
         the wgpu tests did not run"
    );
    None
}
