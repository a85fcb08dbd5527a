//! Test-suite support shared by every ferroflow crate: one rule for skipping.
//!
//! A test that cannot run here (no GPU, no NumPy, no AVX-512) calls [`skip`] with the
//! switch that would require it. Without the switch set it prints one loud `SKIPPED:` line
//! naming what is missing and returns, so the caller returns; with the switch set to `1`
//! (CI sets every switch its machine satisfies) it panics with the same words, so a skip
//! can never hide a test that CI believes ran.
//!
//! | switch | requires |
//! |---|---|
//! | `FERROFLOW_REQUIRE_WGPU` | a wgpu adapter (lavapipe in CI) |
//! | `FERROFLOW_REQUIRE_SHADER_F16` | a wgpu adapter with `SHADER_F16` (real GPUs; not lavapipe) |
//! | `FERROFLOW_REQUIRE_NUMPY` | `python3` with NumPy (and safetensors, for the weight files) |
//! | `FERROFLOW_REQUIRE_AVX512` | AVX-512F (and AVX512-BF16 for the bf16 kernels) |
//!
//! ```
//! fn needs_numpy(has_numpy: bool) {
//!     if !has_numpy {
//!         return ferroflow_tensor::testing::skip("FERROFLOW_REQUIRE_NUMPY", "python3 with NumPy is not installed (pip install numpy)");
//!     }
//!     // ... the test
//! }
//! # std::env::remove_var("FERROFLOW_REQUIRE_NUMPY");
//! needs_numpy(false);
//! ```

/// Skips the calling test loudly, or fails it when `switch` is set to `1` (see the
/// module docs). `missing` says what is absent and how to get it.
pub fn skip(switch: &str, missing: &str) {
    if std::env::var(switch).is_ok_and(|v| v == "1") {
        panic!("{switch}=1 requires this test to run, but {missing}");
    }
    eprintln!("SKIPPED: {missing} (set {switch}=1 to make this a failure)");
}
