//! The profiler end to end: sessions, what a profile holds, the files TensorBoard opens
//! (checked with TensorBoard's own readers in tensorboard.rs), and bad input.

use ferroflow::profiler::{self, ProfilerOptions, Trace};
use ferroflow::{DType, Tensor};
use std::sync::Mutex;

/// One profiler per process: the tests of this file take turns.
static ONE_AT_A_TIME: Mutex<()> = Mutex::new(());

fn serial() -> std::sync::MutexGuard<'static, ()> {
    ferroflow::init();
    ONE_AT_A_TIME.lock().unwrap_or_else(|e| e.into_inner())
}

#[test]
fn start_twice_and_stop_without_start_are_errors() {
    let _g = serial();
    let dir = tempfile::tempdir().unwrap();
    assert!(profiler::stop()
        .unwrap_err()
        .to_string()
        .contains("no profiler is running"));
    profiler::start(dir.path(), ProfilerOptions::default()).unwrap();
    let e = profiler::start(dir.path(), ProfilerOptions::default()).unwrap_err();
    assert!(e.to_string().contains("another profiler is running"), "{e}");
    profiler::stop().unwrap();
    assert!(!profiler::is_running());
}

#[test]
fn an_unwritable_logdir_is_an_error_at_start() {
    let _g = serial();
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("a-file");
    std::fs::write(&file, b"x").unwrap();
    let e = profiler::start(file.join("logs"), ProfilerOptions::default()).unwrap_err();
    assert!(e.to_string().contains("a-file"), "{e}");
    assert!(!profiler::is_running());
}

#[test]
fn steps_ops_and_memory_are_recorded() {
    let _g = serial();
    let dir = tempfile::tempdir().unwrap();
    let profile = profiler::Profile::start(dir.path(), ProfilerOptions::default()).unwrap();
    ferroflow::reset_peak_tensor_bytes();
    let start_live = ferroflow::live_tensor_bytes();
    let w = Tensor::ones(&[32, 32], DType::F32).unwrap();
    for step in 0..4i64 {
        let _step = Trace::new("train", step);
        let _scope = ferroflow::tensor::trace::NameScope::enter("dense");
        let y = w.matmul(&w).unwrap().relu().unwrap();
        drop(y);
    }
    let peak = ferroflow::peak_tensor_bytes();
    let files = profile.finish().unwrap();
    assert!(files.trace_json.exists());
    let space = profiler::read_xspace(&files.xplane).unwrap();
    assert_eq!(space.planes[0].name, "/host:CPU");
    let s = profiler::summarize(&space);
    assert_eq!(s.steps.len(), 4, "{:?}", s.steps);
    assert_eq!(
        s.steps.iter().map(|x| x.step_num).collect::<Vec<_>>(),
        vec![0, 1, 2, 3]
    );
    let matmul = s
        .ops
        .iter()
        .find(|o| o.name == "dense/MatMul")
        .expect("dense/MatMul in the op table");
    assert_eq!(matmul.count, 4);
    assert_eq!(matmul.flops, 4 * 2 * 32 * 32 * 32);
    assert!(s.ops.iter().any(|o| o.op_type == "Relu"));
    let cpu = s
        .memory
        .iter()
        .find(|m| m.allocator == "cpu")
        .expect("cpu memory timeline");
    assert!(start_live <= peak);
    assert_eq!(
        cpu.peak_bytes as usize, peak,
        "the profile's peak is the allocator's peak"
    );
}

#[test]
fn level_one_records_annotations_only_and_delay_drops_early_events() {
    let _g = serial();
    let dir = tempfile::tempdir().unwrap();
    let options = ProfilerOptions {
        host_tracer_level: 1,
        ..Default::default()
    };
    let profile = profiler::Profile::start(dir.path(), options).unwrap();
    {
        let _t = profiler::trace!("user_span", batch = 3);
        let _ = Tensor::ones(&[4], DType::F32).unwrap().exp().unwrap();
    }
    let space = profiler::read_xspace(&profile.finish().unwrap().xplane).unwrap();
    let names: Vec<String> = space.planes[0]
        .event_metadata
        .values()
        .map(|m| m.name.clone())
        .collect();
    assert_eq!(names, vec!["user_span".to_string()]);

    let dir = tempfile::tempdir().unwrap();
    let options = ProfilerOptions {
        delay_ms: 60_000,
        ..Default::default()
    };
    let profile = profiler::Profile::start(dir.path(), options).unwrap();
    let _ = Tensor::ones(&[4], DType::F32).unwrap().exp().unwrap();
    let space = profiler::read_xspace(&profile.finish().unwrap().xplane).unwrap();
    assert!(space.planes[0].lines.iter().all(|l| l.events.is_empty()));
}

#[test]
fn the_report_draws_three_pictures() {
    let _g = serial();
    let dir = tempfile::tempdir().unwrap();
    let profile = profiler::Profile::start(dir.path(), ProfilerOptions::default()).unwrap();
    let w = Tensor::ones(&[16, 16], DType::F32).unwrap();
    for step in 0..3i64 {
        let _step = Trace::new("train", step);
        let _ = w.matmul(&w).unwrap();
    }
    profile.finish().unwrap();
    let html = std::fs::read_to_string(profiler::report(dir.path()).unwrap()).unwrap();
    assert_eq!(html.matches("<svg").count(), 2, "step bars and memory line");
    assert!(html.contains("<table>") && html.contains("MatMul"));
    assert_eq!(
        html.matches("<rect").count(),
        3 * 4,
        "three bars of four parts (input, compute, communication, other)"
    );
    assert!(!html.contains("<script"));
}

#[test]
fn corrupt_profiles_are_reported_not_panicked_on() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("bad.xplane.pb");
    std::fs::write(&path, [0xff, 0xff, 0xff, 0xff, 0x0f]).unwrap();
    let e = profiler::read_xspace(&path).unwrap_err().to_string();
    assert!(e.contains("bad.xplane.pb") && e.contains("XSpace"), "{e}");

    // A well-formed protobuf whose event names metadata the plane lacks.
    use profiler::proto::xplane::*;
    use prost::Message;
    let space = XSpace {
        planes: vec![XPlane {
            name: "/host:CPU".into(),
            lines: vec![XLine {
                events: vec![XEvent {
                    metadata_id: 7,
                    ..Default::default()
                }],
                ..Default::default()
            }],
            ..Default::default()
        }],
        ..Default::default()
    };
    std::fs::write(&path, space.encode_to_vec()).unwrap();
    let e = profiler::read_xspace(&path).unwrap_err().to_string();
    assert!(
        e.contains("line 0") && e.contains("event 0") && e.contains("metadata 7"),
        "{e}"
    );
}
