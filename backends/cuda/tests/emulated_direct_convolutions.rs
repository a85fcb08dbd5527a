//! The direct convolution loops (what a convolution runs when its im2col workspace would
//! pass `set_convolution_workspace_limit`; here the limit is 0, so every one does) on the
//! CUDA backend's host emulation: the conformance suite's convolution families. The GEMM
//! path runs in `emulated.rs`. Without a C++ compiler the tests skip loudly, unless
//! `FERROFLOW_REQUIRE_CXX=1`.

mod common;

fn on_device(check: fn(&ferroflow_tensor::Device)) {
    common::on_emulated_device(
        || ferroflow_cuda::set_convolution_workspace_limit(0),
        "the direct convolutions were not checked",
        check,
    );
}

#[test]
fn direct_conv2d_and_its_gradients() {
    on_device(ferroflow_tensor::conformance::nn::conv2d);
}

#[test]
fn direct_fused_conv2d() {
    on_device(ferroflow_tensor::conformance::nn::fused_conv2d);
}
