//! The shared backend conformance suite on the CUDA backend's host emulation
//! (`ferroflow_cuda::emulation`): the backend's CUDA C, compiled by the system's C++
//! compiler, with its own views, launch parameters, error words and GEMM operand forms,
//! against the suite's float64 references — on any machine with a C++ compiler, no GPU.
//!
//! Without a C++ compiler every test skips with one loud line, unless
//! `FERROFLOW_REQUIRE_CXX=1` (CI), where that is a failure.

fn emulated_device() -> Option<ferroflow_tensor::Device> {
    if ferroflow_cuda::emulation::available() {
        match ferroflow_cuda::emulation::register() {
            Ok(_) => return Some(ferroflow_tensor::Device::gpu(0)),
            Err(e) => panic!("the CUDA emulation did not start: {e}"),
        }
    }
    ferroflow_tensor::testing::skip(
        "FERROFLOW_REQUIRE_CXX",
        "no C++ compiler runs (set CXX, or install g++), the CUDA kernels' emulated \
         conformance suite did not run",
    );
    None
}

ferroflow_tensor::conformance_tests!(optional: emulated_device());
