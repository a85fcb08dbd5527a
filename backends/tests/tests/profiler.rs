//! The profiler on the wgpu backend: with timestamp queries each kernel's time on the
//! device lands on a `/device:GPU:0` plane; without them the host-side launches say so.

mod common;

use ferroflow_tensor::{with_device, DType, Tensor};

#[test]
fn gpu_kernels_are_timed_on_the_device() {
    let Some(gpu) = common::wgpu_device() else {
        return;
    };
    let adapter = &ferroflow_wgpu::adapters()[0];
    let dir = tempfile::tempdir().unwrap();
    let profile = ferroflow_profiler::Profile::start(dir.path(), Default::default()).unwrap();
    with_device(&gpu.to_string(), || {
        let a = Tensor::ones(&[256, 256], DType::F32).unwrap();
        for step in 0..3i64 {
            let _s = ferroflow_profiler::Trace::new("train", step);
            let y = a.matmul(&a).unwrap().relu().unwrap();
            // Kernels in passes of their own while profiled: the results are unchanged.
            assert!(y.to_vec::<f32>().unwrap().iter().all(|&v| v == 256.0));
        }
    })
    .unwrap();
    let files = profile.finish().unwrap();
    let space = ferroflow_profiler::read_xspace(&files.xplane).unwrap();
    let host = &space.planes[0];
    let launches = host
        .event_metadata
        .values()
        .filter(|m| m.name.ends_with(":MatMul"))
        .count();
    assert_eq!(launches, 1, "the host plane has the MatMul launches");
    let device_plane = space.planes.iter().find(|p| p.name == "/device:GPU:0");
    if adapter.timestamp_query {
        let plane = device_plane.expect("a /device:GPU:0 plane with the kernels' device times");
        let names: Vec<&str> = plane
            .event_metadata
            .values()
            .map(|m| m.name.as_str())
            .collect();
        assert!(
            names.contains(&"MatMul") && names.contains(&"Relu"),
            "{names:?}"
        );
        let line = &plane.lines[0];
        let matmul = plane
            .event_metadata
            .values()
            .find(|m| m.name == "MatMul")
            .unwrap()
            .id;
        let timed: Vec<i64> = line
            .events
            .iter()
            .filter(|e| e.metadata_id == matmul)
            .map(|e| e.duration_ps)
            .collect();
        assert_eq!(timed.len(), 3, "one MatMul kernel per step");
        assert!(timed.iter().all(|&d| d > 0), "{timed:?}");
        println!(
            "{}: device times of the 3 MatMul kernels (ps): {timed:?}",
            adapter.name
        );
        let summary = ferroflow_profiler::summarize(&space);
        let row = summary
            .ops
            .iter()
            .find(|o| o.host_or_device == "/device:GPU:0" && o.op_type == "MatMul")
            .expect("the op table has the device's MatMul time");
        assert_eq!(row.count, 3);
    } else {
        assert!(device_plane.is_none());
        let labelled = host
            .stat_metadata
            .values()
            .any(|m| m.name == "host-side launch (no device timestamps)");
        assert!(
            labelled,
            "without timestamp queries the launches say they are host-side"
        );
        println!(
            "{}: no TIMESTAMP_QUERY, host-side launches only",
            adapter.name
        );
    }
}
