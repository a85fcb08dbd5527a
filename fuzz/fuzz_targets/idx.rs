//! libFuzzer entry for the `idx` reader: `cargo fuzz run idx --features libfuzzer` (nightly).
#![no_main]
libfuzzer_sys::fuzz_target!(|data: &[u8]| {
    ferroflow_fuzz::run_target("idx", data);
});
