//! libFuzzer entry for the `tfrecord` reader: `cargo fuzz run tfrecord --features libfuzzer` (nightly).
#![no_main]
libfuzzer_sys::fuzz_target!(|data: &[u8]| {
    ferroflow_fuzz::run_target("tfrecord", data);
});
