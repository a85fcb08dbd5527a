//! The NCCL collectives of `ferroflow_cuda::nccl` on the host emulation, whose stand-in for
//! NCCL is a hub thread reached over loopback TCP: three ranks, each in a thread of its own
//! on the emulated `/GPU:0`, check the backend's side (dense operands from views, output
//! buffers and shapes, dtypes, the communicator's checks) against references. The
//! distribution crate's suite (`distribute/tests/nccl.rs`) runs the same path across
//! processes; NCCL itself runs on a GPU (`conformance.rs`). Without a C++ compiler the test
//! skips loudly, unless `FERROFLOW_REQUIRE_CXX=1`.

mod common;

/// Registers the suite's two emulated devices (whichever test comes first).
fn two_devices() {
    let _ = ferroflow_cuda::emulation::register_devices(2);
}

#[test]
fn nccl_collectives_through_the_stand_in() {
    let Some(device) =
        common::emulated_device(two_devices, "the NCCL collectives were not checked")
    else {
        return;
    };
    common::nccl_collectives_match_references(&[device, device, device]);
}

/// One NCCL group across two emulated devices of this process (MirroredStrategy's
/// `NcclAllReduce`).
#[test]
fn nccl_group_across_this_process_devices() {
    let Some(device) = common::emulated_device(two_devices, "the NCCL group was not checked")
    else {
        return;
    };
    common::nccl_local_group_matches_references(&[device, ferroflow_tensor::Device::gpu(1)]);
}
