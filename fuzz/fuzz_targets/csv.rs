//! libFuzzer entry for the `csv` reader: `cargo fuzz run csv --features libfuzzer` (nightly).
#![no_main]
libfuzzer_sys::fuzz_target!(|data: &[u8]| {
    ferroflow_fuzz::run_target("csv", data);
});
