//! The shared backend conformance suite on the first wgpu adapter (`/GPU:0`).
//!
//! Without an adapter every test skips with one loud line, unless `FERROFLOW_REQUIRE_WGPU=1`
//! (CI, which installs Mesa's lavapipe), where a missing adapter fails the run.

mod common;

ferroflow_tensor::conformance_tests!(optional: common::wgpu_device());
