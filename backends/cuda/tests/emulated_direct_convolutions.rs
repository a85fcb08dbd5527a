//! The direct convolution loops (what a convolution runs when its im2col workspace would
//! pass `set_convolution_workspace_limit`; here the limit is 0, so every one does) on the
//! CUDA backend's host emulation: the conformance suite's convolution families. The GEMM
//! path runs in `emulated.rs`. Without a C++ compiler the tests skip loudly, unless
//! `FERROFLOW_REQUIRE_CXX=1`.

fn emulated_device_with_direct_convolutions() -> Option<ferroflow_tensor::Device> {
    ferroflow_cuda::set_convolution_workspace_limit(0);
    if ferroflow_cuda::emulation::available() {
        match ferroflow_cuda::emulation::register() {
            Ok(_) => return Some(ferroflow_tensor::Device::gpu(0)),
            Err(e) => panic!("the CUDA emulation did not start: {e}"),
        }
    }
    ferroflow_tensor::testing::skip(
        "FERROFLOW_REQUIRE_CXX",
        "no C++ compiler runs (set CXX, or install g++), the direct convolutions were not \
         checked on the CUDA emulation",
    );
    None
}

fn on_device(check: fn(&ferroflow_tensor::Device)) {
    let Some(device) = emulated_device_with_direct_convolutions() else {
        return;
    };
    ferroflow_tensor::with_device(&device.to_string(), || check(&device))
        .expect("the emulated device");
}

#[test]
fn direct_conv2d_and_its_gradients() {
    on_device(ferroflow_tensor::conformance::nn::conv2d);
}

#[test]
fn direct_fused_conv2d() {
    on_device(ferroflow_tensor::conformance::nn::fused_conv2d);
}
