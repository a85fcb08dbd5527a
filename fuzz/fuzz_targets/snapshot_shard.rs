//! libFuzzer entry for the `snapshot_shard` reader: `cargo fuzz run snapshot_shard --features libfuzzer` (nightly).
#![no_main]
libfuzzer_sys::fuzz_target!(|data: &[u8]| {
    ferroflow_fuzz::run_target("snapshot_shard", data);
});
