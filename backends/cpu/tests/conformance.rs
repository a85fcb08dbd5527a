//! The shared backend conformance suite, on the CPU backend.

ferroflow_tensor::conformance_tests!(ferroflow_cpu::register(), ferroflow_tensor::Device::CPU);
