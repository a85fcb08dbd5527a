//! The backend's cuDNN path on the host emulation, with the emulation's stand-in for cuDNN
//! (`emulation::set_cudnn_stand_in`: cuDNN's convolutions by their definitions, NHWC data
//! and KRSC filters, in float64): the conformance suite's convolution families and the
//! cuDNN path against the backend's own kernels. What is checked is the backend's side
//! (the zeros appended where TF pads one more after, the filter reordered for cuDNN, the
//! gradients cut and transposed back, the operand offsets); cuDNN itself runs on a GPU
//! (`conformance.rs`). Without a C++ compiler the tests skip loudly, unless
//! `FERROFLOW_REQUIRE_CXX=1`.

mod common;

fn stand_in() {
    ferroflow_cuda::emulation::set_cudnn_stand_in(true);
}

const MISSED: &str = "the cuDNN path was not checked";

fn on_device(check: fn(&ferroflow_tensor::Device)) {
    common::on_emulated_device(stand_in, MISSED, check);
}

#[test]
fn cudnn_path_conv2d_and_its_gradients() {
    on_device(ferroflow_tensor::conformance::nn::conv2d);
}

#[test]
fn cudnn_path_fused_conv2d() {
    on_device(ferroflow_tensor::conformance::nn::fused_conv2d);
}

#[test]
fn cudnn_path_pooling() {
    on_device(ferroflow_tensor::conformance::nn::pooling);
}

#[test]
fn cudnn_path_matches_own_kernels() {
    if let Some(device) = common::emulated_device(stand_in, MISSED) {
        common::cudnn_path_matches_own_kernels(device);
    }
}
