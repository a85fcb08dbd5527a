//! libFuzzer entry for the `model_config_cnn` reader: `cargo fuzz run model_config_cnn --features libfuzzer` (nightly).
#![no_main]
libfuzzer_sys::fuzz_target!(|data: &[u8]| {
    ferroflow_fuzz::run_target("model_config_cnn", data);
});
