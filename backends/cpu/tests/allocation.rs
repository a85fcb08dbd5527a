//! An allocation the allocator refuses is `ResourceExhausted`, not an abort: a child
//! process caps its address space at 2 GiB, then asks for tensors of 8 GiB (under the
//! memory of machines like CI's, so the size check alone passes them, and the allocator's
//! refusal is what stops them) and must get an error back.

use std::process::Command;

const CHILD_ENV: &str = "FERROFLOW_ALLOCATION_CHILD";

#[test]
#[ignore = "the child process of the test below; started by it"]
fn allocation_child() {
    assert!(
        std::env::var(CHILD_ENV).is_ok(),
        "run by refused_allocations_are_errors"
    );
    ferroflow_cpu::register();
    let bytes: libc::rlim_t = 2 << 30;
    let lim = libc::rlimit {
        rlim_cur: bytes,
        rlim_max: bytes,
    };
    // SAFETY: setrlimit reads a valid rlimit struct.
    assert_eq!(unsafe { libc::setrlimit(libc::RLIMIT_AS, &lim) }, 0);
    use ferroflow_tensor::{DType, Error, Tensor};
    let column = Tensor::zeros(&[1 << 16, 1], DType::F32).unwrap();
    let row = Tensor::zeros(&[1, 1 << 15], DType::F32).unwrap();
    for (what, r) in [
        ("zeros", Tensor::zeros(&[1 << 31], DType::F32)),
        ("broadcast add", column.add(&row)),
        ("matmul", column.matmul(&row)),
    ] {
        match r {
            Err(Error::ResourceExhausted { reason, .. }) => println!("{what}: refused: {reason}"),
            other => panic!("{what}: expected ResourceExhausted, got {other:?}"),
        }
    }
    println!("ALLOCATION_CHILD_OK");
}

#[test]
fn refused_allocations_are_errors_not_aborts() {
    let out = Command::new(std::env::current_exe().unwrap())
        .args(["--exact", "allocation_child", "--ignored", "--nocapture"])
        .env(CHILD_ENV, "1")
        .output()
        .unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success() && stdout.contains("ALLOCATION_CHILD_OK"),
        "the child failed ({}): {stdout}\n{}",
        out.status,
        String::from_utf8_lossy(&out.stderr)
    );
}
