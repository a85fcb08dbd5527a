//! libFuzzer entry for the `element` reader: `cargo fuzz run element --features libfuzzer` (nightly).
#![no_main]
libfuzzer_sys::fuzz_target!(|data: &[u8]| {
    ferroflow_fuzz::run_target("element", data);
});
