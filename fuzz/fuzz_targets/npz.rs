//! libFuzzer entry for the `npz` reader: `cargo fuzz run npz --features libfuzzer` (nightly).
#![no_main]
libfuzzer_sys::fuzz_target!(|data: &[u8]| {
    ferroflow_fuzz::run_target("npz", data);
});
