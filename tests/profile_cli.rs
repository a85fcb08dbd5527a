//! `ferroflow profile summarize|report` on a real log folder, and what they say of bad ones.

use std::process::Command;

fn ferroflow(args: &[&str]) -> std::process::Output {
    Command::new(env!("CARGO_BIN_EXE_ferroflow"))
        .args(args)
        .output()
        .unwrap()
}

#[test]
fn summarize_and_report_a_log_folder() {
    ferroflow::init();
    let dir = tempfile::tempdir().unwrap();
    let writer =
        ferroflow::profiler::summary::create_file_writer(dir.path().join("train")).unwrap();
    for step in 0..5 {
        writer
            .scalar("epoch_loss", 1.0 / (1.0 + step as f64), step)
            .unwrap();
    }
    writer.flush().unwrap();
    let profile =
        ferroflow::profiler::Profile::start(dir.path().join("train"), Default::default()).unwrap();
    let w = ferroflow::Tensor::ones(&[8, 8], ferroflow::DType::F32).unwrap();
    for step in 0..2i64 {
        let _s = ferroflow::profiler::Trace::new("train", step);
        let _ = w.matmul(&w).unwrap();
    }
    profile.finish().unwrap();
    let logdir = dir.path().to_str().unwrap();

    let out = ferroflow(&["profile", "summarize", logdir]);
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "{text}{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(
        text.contains("epoch_loss: 5 values, last 0.2 at step 4"),
        "{text}"
    );
    assert!(
        text.contains("2 steps") && text.contains("MatMul"),
        "{text}"
    );

    let out = ferroflow(&["profile", "report", logdir]);
    assert!(out.status.success());
    let path = String::from_utf8_lossy(&out.stdout).trim().to_string();
    assert!(std::fs::read_to_string(path).unwrap().contains("<svg"));

    // Corrupt one byte of the second record's data: the reader names record and offset.
    let events = writer.path();
    let mut bytes = std::fs::read(&events).unwrap();
    let first_len = u64::from_le_bytes(bytes[..8].try_into().unwrap()) as usize;
    let second = 16 + first_len;
    bytes[second + 12 + 3] ^= 0xff;
    std::fs::write(&events, &bytes).unwrap();
    let out = ferroflow(&["profile", "summarize", logdir]);
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "{err}");
    assert!(
        err.contains(&format!("record 1 at byte {second}")) && err.contains("CRC"),
        "{err}"
    );

    let out = ferroflow(&[
        "profile",
        "summarize",
        dir.path().join("nothing-here").to_str().unwrap(),
    ]);
    assert_eq!(out.status.code(), Some(1));
    let out = ferroflow(&["profile", "explain", logdir]);
    assert_eq!(out.status.code(), Some(2));
}
