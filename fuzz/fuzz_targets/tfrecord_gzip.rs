//! libFuzzer entry for the `tfrecord_gzip` reader: `cargo fuzz run tfrecord_gzip --features libfuzzer` (nightly).
#![no_main]
libfuzzer_sys::fuzz_target!(|data: &[u8]| {
    ferroflow_fuzz::run_target("tfrecord_gzip", data);
});
