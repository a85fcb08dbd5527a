//! libFuzzer entry for the `npy` reader: `cargo fuzz run npy --features libfuzzer` (nightly).
#![no_main]
libfuzzer_sys::fuzz_target!(|data: &[u8]| {
    ferroflow_fuzz::run_target("npy", data);
});
