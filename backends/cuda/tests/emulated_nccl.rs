//! The NCCL collectives of `ferroflow_cuda::nccl` on the host emulation, whose stand-in for
//! NCCL is a hub thread reached over loopback TCP: three ranks, each in a thread of its own
//! on the emulated `/GPU:0`, check the backend's side (dense operands from views, output
//! buffers and shapes, dtypes, the communicator's checks) against references. The
//! distribution crate's suite (`distribute/tests/nccl.rs`) runs the same path across
//! processes; NCCL itself runs on a GPU (`conformance.rs`). Without a C++ compiler the test
//! skips loudly, unless `FERROFLOW_REQUIRE_CXX=1`.

mod common;

#[test]
fn nccl_collectives_through_the_stand_in() {
    let Some(device) = common::emulated_device(|| {}, "the NCCL collectives were not checked")
    else {
        return;
    };
    common::nccl_collectives_match_references(&[device, device, device]);
}
