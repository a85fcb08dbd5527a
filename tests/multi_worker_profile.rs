//! Multi-worker profiling across real processes on loopback (TF 2.4's profiler server,
//! on-demand capture and Pod viewer), every process killed when the test ends, also on
//! failure:
//! - two workers of `examples/multi_worker_mnist` started by the launcher with profiler
//!   ports; 2 s captured from both with the client while they train: two xplanes with step
//!   markers for the same steps, collectives on both, a Pod table whose per-worker parts sum
//!   to each worker's step time, `ferroflow profile pod|report` reading it, and
//!   TensorBoard's own Pod viewer (xprof's `pod_viewer` tool) showing both workers;
//! - a straggler: one worker sleeping in its input pipeline is the one the Pod viewer
//!   flags, and its peer's time shows as waiting in the all-reduce.

use ferroflow::cluster::{LaunchSpec, LocalCluster};
use ferroflow::profiler::{self, client, PodView};
use std::path::PathBuf;
use std::process::Command;
use std::time::{Duration, Instant};

/// Waits (bounded) until every task printed `line`; `Err` with their output if one exited
/// first or the time ran out.
fn wait_for(
    cluster: &mut LocalCluster,
    tasks: usize,
    line: &str,
    limit: Duration,
) -> Result<(), String> {
    let end = Instant::now() + limit;
    loop {
        if (0..tasks).all(|i| cluster.output(i).contains(line)) {
            return Ok(());
        }
        for i in 0..tasks {
            if let Ok(Some(code)) = cluster.try_code(i) {
                return Err(format!(
                    "task {i} exited with {code}:\n{}",
                    cluster.output(i)
                ));
            }
        }
        if Instant::now() >= end {
            return Err(format!(
                "not every task printed {line:?} within {limit:?}:\n{}",
                (0..tasks)
                    .map(|i| cluster.output(i))
                    .collect::<Vec<_>>()
                    .join("\n---\n")
            ));
        }
        std::thread::sleep(Duration::from_millis(50));
    }
}

/// Starts `spec`'s tasks and waits (bounded) until each printed `line`; any failure panics
/// with the tasks' output. Every task is killed when its cluster drops.
fn start_and_wait(spec: &LaunchSpec, tasks: usize, line: &str, limit: Duration) -> LocalCluster {
    let mut cluster = LocalCluster::start(spec).unwrap();
    if let Err(output) = wait_for(&mut cluster, tasks, line, limit) {
        panic!("{output}");
    }
    cluster
}

fn addresses(cluster: &LocalCluster) -> String {
    cluster
        .profiler_addresses()
        .into_iter()
        .map(|(_, a)| format!("grpc://{a}"))
        .collect::<Vec<_>>()
        .join(",")
}

/// Each worker's parts of each step add up to its step time, as the worker's own summary
/// measures it (step span + the gap to the next step).
fn check_sums(view: &PodView, run: &std::path::Path) {
    for (w, worker) in view.workers.iter().enumerate() {
        let space = profiler::read_xspace(run.join(format!("{worker}.xplane.pb"))).unwrap();
        let own = profiler::summarize(&space);
        for step in &view.steps {
            let c = &step.workers[w];
            let parts = c.compute_us
                + c.input_us
                + c.communication_wait_us
                + c.communication_transfer_us
                + c.host_us
                + c.idle_us;
            let s = own
                .steps
                .iter()
                .find(|s| s.step_num == step.step_num)
                .unwrap();
            let measured = s.total_us + s.idle_us;
            assert!(
                (parts - c.step_us).abs() < 1e-3 && (c.step_us - measured).abs() < 1e-3,
                "{worker} step {}: parts {parts} µs, pod step {} µs, measured {measured} µs",
                step.step_num,
                c.step_us
            );
        }
    }
}

#[test]
fn two_mnist_workers_captured_while_training() {
    let exe = std::env::current_exe().unwrap();
    // target/<profile>/deps/<test> → target/<profile>/examples/multi_worker_mnist (cargo
    // test builds the examples).
    let example = exe
        .parent()
        .and_then(|d| d.parent())
        .map(|d| d.join("examples/multi_worker_mnist"))
        .unwrap();
    assert!(
        example.exists(),
        "{} is missing: cargo test builds the examples",
        example.display()
    );
    let out = tempfile::tempdir().unwrap();
    let mut cluster = start_and_wait(
        &LaunchSpec {
            workers: 2,
            program: example.to_string_lossy().into_owned(),
            // Far more epochs than the test lasts (its workers are killed when it ends):
            // the capture must find them training, however fast the machine.
            args: ["--epochs", "1000", "--out", &out.path().to_string_lossy()]
                .map(String::from)
                .to_vec(),
            profile_ports: true,
            ..Default::default()
        },
        2,
        "training",
        Duration::from_secs(120),
    );
    let logdir = out.path().join("logs");
    let capture =
        client::trace(&addresses(&cluster), &logdir, 2000, 3, Default::default()).unwrap();
    assert!(capture.failures.is_empty(), "{:?}", capture.failures);
    assert_eq!(capture.profiles.len(), 2);
    let summaries: Vec<_> = capture
        .profiles
        .iter()
        .map(|(_, p)| profiler::summarize(&profiler::read_xspace(p).unwrap()))
        .collect();
    // Both have the steps of the same numbers (the capture's edges aside) and collectives.
    let steps = |i: usize| -> Vec<i64> { summaries[i].steps.iter().map(|s| s.step_num).collect() };
    let (a, b) = (steps(0), steps(1));
    assert!(
        a.len() >= 5 && b.len() >= 5,
        "{} and {} steps",
        a.len(),
        b.len()
    );
    let only_one =
        a.iter().filter(|s| !b.contains(s)).count() + b.iter().filter(|s| !a.contains(s)).count();
    assert!(only_one <= 4, "steps differ: {a:?} vs {b:?}");
    for s in &summaries {
        let reduce = s.ops.iter().find(|o| o.op_type == "CollectiveReduceV2");
        assert!(
            reduce.is_some_and(|r| r.count as usize >= a.len().min(b.len())),
            "no all-reduce per step"
        );
        assert!(s.steps.iter().all(|st| st.communication_us > 0.0));
    }
    let view = profiler::pod_view(&capture.run_dir).unwrap();
    assert_eq!(view.workers.len(), 2);
    assert!(view.steps.len() >= a.len().min(b.len()) - 4);
    check_sums(&view, &capture.run_dir);
    // The training goes on after the capture.
    std::thread::sleep(Duration::from_millis(500));
    for i in 0..2 {
        let code = cluster.try_code(i).unwrap();
        assert!(
            code.is_none(),
            "worker {i} exited with {code:?}:\n{}",
            cluster.output(i)
        );
    }
    drop(cluster);

    let cli = |args: &[&str]| {
        let o = Command::new(env!("CARGO_BIN_EXE_ferroflow"))
            .args(args)
            .output()
            .unwrap();
        assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
        String::from_utf8_lossy(&o.stdout).into_owned()
    };
    let logdir_s = logdir.to_string_lossy().into_owned();
    let table = cli(&["profile", "pod", &logdir_s]);
    assert!(table.contains("Pod viewer: 2 workers"), "{table}");
    assert!(table.contains('*'), "{table}");
    let report = PathBuf::from(cli(&["profile", "report", &logdir_s]).trim());
    let html = std::fs::read_to_string(report).unwrap();
    assert!(html.contains("Pod viewer: step") && html.contains("Step time by worker and step"));

    // TensorBoard's own Pod viewer (xprof's pod_viewer tool) shows both workers' steps.
    let has_xprof = Command::new("python3")
        .args(["-c", "import xprof.convert.raw_to_tool_data"])
        .status()
        .is_ok_and(|s| s.success());
    if !has_xprof {
        ferroflow::tensor::testing::skip(
            "FERROFLOW_REQUIRE_TENSORBOARD",
            "python3 with xprof is not installed (pip install xprof; .ci/run does): \
             TensorBoard's Pod viewer not checked",
        );
        return;
    }
    let script = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/pod_viewer_check.py");
    let o = Command::new("python3")
        .arg(script)
        .args(capture.profiles.iter().map(|(_, p)| p))
        .output()
        .unwrap();
    let stdout = String::from_utf8_lossy(&o.stdout);
    println!("{stdout}");
    assert!(
        o.status.success(),
        "xprof's pod viewer: {stdout}{}",
        String::from_utf8_lossy(&o.stderr)
    );
}

#[test]
#[ignore = "a worker process, started by the straggler test"]
fn straggler_child() {
    use ferroflow::data::Dataset;
    use ferroflow::distribute::{CommunicationOptions, MultiWorkerMirroredStrategy, Strategy};
    use ferroflow::keras::{layers::Dense, losses::MeanSquaredError, sequential, FitConfig, Model};
    ferroflow::init();
    let _server = profiler::server::start_from_env().unwrap();
    let strategy = MultiWorkerMirroredStrategy::new(CommunicationOptions {
        timeout: Duration::from_secs(60),
        ..Default::default()
    })
    .unwrap();
    let slow = strategy.worker_index() == 1;
    let mut model = {
        let _scope = strategy.scope();
        let mut m = Model::from(sequential![Dense::new(32), Dense::new(1)]);
        m.compile(
            ferroflow::optim::Sgd::new(0.01),
            MeanSquaredError::new(),
            &[],
        )
        .unwrap();
        m
    };
    let x = ferroflow::Tensor::ones(&[64, 16], ferroflow::DType::F32).unwrap();
    let y = ferroflow::Tensor::zeros(&[64, 1], ferroflow::DType::F32).unwrap();
    let data = Dataset::from_tensor_slices((x, y))
        .unwrap()
        .batch(16, true)
        .unwrap()
        .repeat(None)
        .map(move |b| {
            if slow {
                std::thread::sleep(Duration::from_millis(25));
            }
            Ok(b)
        });
    println!("training");
    model
        .fit_dataset(
            &data,
            FitConfig::new()
                .epochs(1)
                .steps_per_epoch(100_000)
                .verbose(0),
        )
        .unwrap();
}

#[test]
fn the_pod_viewer_flags_the_worker_slowed_in_its_input() {
    let exe = std::env::current_exe().unwrap();
    let cluster = start_and_wait(
        &LaunchSpec {
            workers: 2,
            program: exe.to_string_lossy().into_owned(),
            args: [
                "--ignored",
                "--exact",
                "straggler_child",
                "--nocapture",
                "--test-threads=1",
            ]
            .map(String::from)
            .to_vec(),
            profile_ports: true,
            ..Default::default()
        },
        2,
        "training",
        Duration::from_secs(60),
    );
    let dir = tempfile::tempdir().unwrap();
    let capture = client::trace(
        &addresses(&cluster),
        dir.path(),
        1500,
        3,
        Default::default(),
    )
    .unwrap();
    drop(cluster);
    let view = profiler::pod_view(&capture.run_dir).unwrap();
    assert!(view.steps.len() >= 10, "{} steps", view.steps.len());
    // Worker 1 (the second address) sleeps in its input pipeline.
    let slow = view
        .workers
        .iter()
        .position(|w| {
            capture.profiles[1].1.file_name().unwrap().to_string_lossy() == format!("{w}.xplane.pb")
        })
        .unwrap();
    let counts = view.straggler_counts();
    assert!(
        counts[slow] * 10 >= view.steps.len() * 9,
        "the slow worker straggled in {} of {} steps:\n{}",
        counts[slow],
        view.steps.len(),
        profiler::pod_table(&view, None)
    );
    let fast = 1 - slow;
    let mean = |w: usize, f: fn(&profiler::PodCell) -> f64| {
        view.steps.iter().map(|s| f(&s.workers[w])).sum::<f64>() / view.steps.len() as f64
    };
    // The slow one's time is input; its peer waits for it in the all-reduce.
    assert!(mean(slow, |c| c.input_us) > 20_000.0);
    assert!(mean(fast, |c| c.input_us) < 5_000.0);
    assert!(
        mean(fast, |c| c.communication_wait_us) > 15_000.0,
        "{}",
        profiler::pod_table(&view, None)
    );
    assert!(
        mean(slow, |c| c.communication_wait_us) < mean(fast, |c| c.communication_wait_us) / 4.0
    );
}
