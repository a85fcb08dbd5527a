//! libFuzzer entry for the `safetensors` reader: `cargo fuzz run safetensors --features libfuzzer` (nightly).
#![no_main]
libfuzzer_sys::fuzz_target!(|data: &[u8]| {
    ferroflow_fuzz::run_target("safetensors", data);
});
