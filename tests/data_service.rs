//! The tf.data service as processes on loopback: a dispatcher (`ferroflow data-service
//! dispatcher`), workers (this test binary, serving the pipelines registered below), and
//! the trainer (the test itself). Workers and dispatchers are killed mid-epoch.

use ferroflow::cluster::ReservedPort;
use ferroflow::data::service::{self, DistributeOptions, ProcessingMode, ServiceStats};
use ferroflow::data::Dataset;
use ferroflow::tensor::testing::ChildProcess;
use ferroflow::{DType, Tensor};
use std::collections::BTreeMap;
use std::path::Path;
use std::process::{Command, Stdio};
use std::sync::Mutex;
use std::time::{Duration, Instant};

/// The pipelines every process of these tests registers (workers run this binary).
fn register_pipelines() {
    ferroflow::init();
    // MNIST's test split with each image's index: the trainer checks what arrived.
    service::register_pipeline("mnist_indexed", |_p: &serde_json::Value| {
        let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("datasets/mnist");
        let (x, y) = ferroflow::data::idx::load_mnist_pixels(dir, "t10k")?;
        let n = x.shape()[0] as i64;
        let index = Tensor::from_vec((0..n).collect::<Vec<i64>>(), &[n as usize])?;
        Dataset::from_tensor_slices((index, x, y))
    });
    // A slow map, so that a kill lands mid-epoch.
    service::register_pipeline("slow", |p: &serde_json::Value| {
        let n = p["n"].as_i64().ok_or_else(|| {
            ferroflow::Error::invalid("slow", format!("needs an integer n, got {}", p["n"]))
        })?;
        let ms = p["ms"].as_u64().unwrap_or(5);
        Ok(Dataset::range(0, n, 1).map(move |x: Tensor| {
            std::thread::sleep(Duration::from_millis(ms));
            Ok(x)
        }))
    });
    // The second element is 2 MiB: more than the small workers' limit.
    service::register_pipeline("big", |_p: &serde_json::Value| {
        Ok(Dataset::range(0, 4, 1).map(|x: Tensor| {
            let rows = if x.item::<i64>()? == 1 { 2 << 20 } else { 4 };
            Tensor::zeros(&[rows], DType::U8)
        }))
    });
}

/// Starts a server process (its errors on this test's stderr) and waits, at most 60 s, for
/// it to say it started.
fn start(command: &mut Command) -> ChildProcess {
    command.stderr(Stdio::inherit());
    ChildProcess::start(command, "started", Duration::from_secs(60))
        .unwrap()
        .0
}

/// Ports the OS picked, held listening until the server process that serves on each starts
/// ([`serve_on`]); a port is never free between the choice and the server.
static RESERVED: Mutex<Vec<ReservedPort>> = Mutex::new(Vec::new());

/// A loopback port the OS picked, held for the server [`serve_on`] starts on it.
fn free_port() -> u16 {
    let port = ferroflow::cluster::reserve_loopback_ports(1)
        .unwrap()
        .remove(0);
    let number = port.port();
    RESERVED.lock().unwrap().push(port);
    number
}

/// Starts the server process `command` on `port`, handing it the port's socket listening:
/// the one reserved by [`free_port`] the first time, bound here again when a server is
/// restarted on its port. This process's copy closes once the server runs (so a dead
/// server's port refuses connections).
fn serve_on(command: &mut Command, port: u16) -> ChildProcess {
    let held = {
        let mut reserved = RESERVED.lock().unwrap();
        match reserved.iter().position(|p| p.port() == port) {
            Some(i) => reserved.swap_remove(i),
            None => ReservedPort::bind(&format!("127.0.0.1:{port}")).unwrap(),
        }
    };
    ferroflow::cluster::hand_over(command, &[&held]);
    start(command)
}

const TOKEN: &str = "s3cret";

/// A dispatcher process on `port` (journaling to `work_dir` in fault-tolerant mode).
fn dispatcher(port: u16, work_dir: Option<&Path>) -> ChildProcess {
    dispatcher_with(port, work_dir, &[])
}

/// [`dispatcher`] with more command-line flags.
fn dispatcher_with(port: u16, work_dir: Option<&Path>, flags: &[&str]) -> ChildProcess {
    let mut c = Command::new(env!("CARGO_BIN_EXE_ferroflow"));
    c.args(["data-service", "dispatcher", "--port", &port.to_string()])
        .args(flags)
        .env("FERROFLOW_CLUSTER_TOKEN", TOKEN);
    if let Some(d) = work_dir {
        c.arg("--work-dir").arg(d).arg("--fault-tolerant");
    }
    serve_on(&mut c, port)
}

/// A worker process (this binary's `worker_child`) of the dispatcher on `dispatcher_port`.
fn worker(dispatcher_port: u16, port: u16, max_element_bytes: Option<usize>) -> ChildProcess {
    worker_with(dispatcher_port, port, max_element_bytes, None)
}

/// [`worker`], heartbeating every `heartbeat` (the default when `None`).
fn worker_with(
    dispatcher_port: u16,
    port: u16,
    max_element_bytes: Option<usize>,
    heartbeat: Option<Duration>,
) -> ChildProcess {
    let mut c = Command::new(std::env::current_exe().unwrap());
    if let Some(h) = heartbeat {
        c.env("FF_TEST_HEARTBEAT_MS", h.as_millis().to_string());
    }
    c.args(["--ignored", "--exact", "worker_child", "--nocapture"])
        .env("FERROFLOW_CLUSTER_TOKEN", TOKEN)
        .env("FF_TEST_DISPATCHER", format!("127.0.0.1:{dispatcher_port}"))
        .env("FF_TEST_WORKER_PORT", port.to_string());
    if let Some(m) = max_element_bytes {
        c.env("FF_TEST_MAX_ELEMENT", m.to_string());
    }
    serve_on(&mut c, port)
}

/// Two worker processes of the dispatcher on `dispatcher_port`, on ports the OS picked.
fn two_workers(dispatcher_port: u16) -> [ChildProcess; 2] {
    [
        worker(dispatcher_port, free_port(), None),
        worker(dispatcher_port, free_port(), None),
    ]
}

#[test]
#[ignore = "a tf.data service worker process, started by the tests below"]
fn worker_child() {
    register_pipelines();
    let mut config = service::WorkerConfig::new(&std::env::var("FF_TEST_DISPATCHER").unwrap());
    config.port = std::env::var("FF_TEST_WORKER_PORT")
        .unwrap()
        .parse()
        .unwrap();
    if let Ok(m) = std::env::var("FF_TEST_MAX_ELEMENT") {
        config.max_element_bytes = m.parse().unwrap();
    }
    if let Ok(ms) = std::env::var("FF_TEST_HEARTBEAT_MS") {
        config.heartbeat_interval = Duration::from_millis(ms.parse().unwrap());
    }
    let mut worker = service::WorkerServer::new(config);
    worker.start().unwrap();
    println!("worker started on {}", worker.address());
    // Bounded: a worker the test forgot ends by itself.
    std::thread::sleep(Duration::from_secs(180));
    worker.stop();
}

fn options(stats: &ServiceStats) -> DistributeOptions {
    DistributeOptions {
        token: Some(TOKEN.into()),
        stats: stats.clone(),
        timeout: Duration::from_secs(20),
        ..Default::default()
    }
}

fn ints(xs: &[Tensor]) -> Vec<i64> {
    xs.iter().map(|x| x.item::<i64>().unwrap()).collect()
}

/// The `slow` pipeline of `n` elements (`ms` each) as a distributed epoch of the service at
/// `target`, counted in `stats`.
fn slow_epoch(target: &str, n: i64, ms: u64, stats: &ServiceStats) -> Dataset<Tensor> {
    service::pipeline::<Tensor>("slow", serde_json::json!({"n": n, "ms": ms}))
        .unwrap()
        .apply(service::distribute_with(
            ProcessingMode::DistributedEpoch,
            target,
            options(stats),
        ))
        .unwrap()
}

/// The elements' values, sorted, after checking that none arrived twice.
fn unique_sorted(got: &[Tensor]) -> Vec<i64> {
    let mut ids = ints(got);
    ids.sort();
    ids.dedup();
    assert_eq!(ids.len(), got.len(), "an element arrived twice");
    ids
}

#[test]
fn mnist_through_two_workers_distributed_once_and_parallel_twice() {
    register_pipelines();
    let dport = free_port();
    let _d = dispatcher(dport, None);
    let _w = two_workers(dport);
    let target = format!("grpc://127.0.0.1:{dport}");
    let (x, y) = ferroflow::data::idx::load_mnist_pixels(
        Path::new(env!("CARGO_MANIFEST_DIR")).join("datasets/mnist"),
        "t10k",
    )
    .unwrap();
    let (pixels, labels) = (x.to_vec::<u8>().unwrap(), y.to_vec::<i64>().unwrap());
    let local =
        service::pipeline::<(Tensor, Tensor, Tensor)>("mnist_indexed", serde_json::json!({}))
            .unwrap();
    for (mode, copies) in [
        (ProcessingMode::DistributedEpoch, 1),
        (ProcessingMode::ParallelEpochs, 2),
    ] {
        let stats = ServiceStats::default();
        let ds = local
            .apply(service::distribute_with(mode, &target, options(&stats)))
            .unwrap();
        let mut seen = vec![0u32; 10_000];
        for element in &ds {
            let (i, image, label) = element.unwrap();
            let i = i.item::<i64>().unwrap() as usize;
            seen[i] += 1;
            assert_eq!(
                image.to_vec::<u8>().unwrap(),
                &pixels[i * 784..(i + 1) * 784]
            );
            assert_eq!(label.item::<i64>().unwrap(), labels[i]);
        }
        assert!(
            seen.iter().all(|&c| c == copies),
            "{mode:?}: counts {:?}",
            seen.iter().fold(BTreeMap::new(), |mut m, c| {
                *m.entry(*c).or_insert(0) += 1;
                m
            })
        );
        // Both workers served.
        let by_worker = stats.elements_by_worker();
        assert_eq!(by_worker.len(), 2, "{by_worker:?}");
        assert!(by_worker.values().all(|&n| n > 0), "{by_worker:?}");
        assert_eq!(stats.elements(), 10_000 * copies as u64);
        assert!(stats.lost_workers().is_empty());
    }
}

/// A job's start (the worker hearing of its task) and end (the dispatcher hearing that the
/// task's end was told) each wait for a round trip, not for the worker's next heartbeat: a
/// consumer asking for a task the worker has not heard of, and a task's end, make the
/// worker heartbeat at once. Here the worker's own interval is 60 s, so without that each
/// epoch would wait a minute. Also checks that, of requests in flight together, one
/// answered "no such task" after another found the task is not taken for a lost task.
#[test]
fn epochs_start_and_end_without_waiting_for_the_worker_heartbeat_interval() {
    register_pipelines();
    let dport = free_port();
    let _d = dispatcher_with(dport, None, &["--worker-timeout", "300s"]);
    let _w = worker_with(dport, free_port(), None, Some(Duration::from_secs(60)));
    // The worker's first heartbeat (at its start) registers it.
    std::thread::sleep(Duration::from_millis(500));
    let target = format!("grpc://127.0.0.1:{dport}");
    let started = Instant::now();
    let mut epoch_ms = vec![];
    for epoch in 0..20 {
        let stats = ServiceStats::default();
        let t = Instant::now();
        let got: Vec<Tensor> = slow_epoch(&target, 30, 0, &stats)
            .iter()
            .collect::<ferroflow::Result<_>>()
            .unwrap_or_else(|e| panic!("epoch {epoch}: {e}"));
        epoch_ms.push(t.elapsed().as_millis());
        assert_eq!(
            unique_sorted(&got),
            (0..30).collect::<Vec<i64>>(),
            "epoch {epoch}"
        );
        assert_eq!(stats.lost_workers(), Vec::<String>::new(), "epoch {epoch}");
    }
    eprintln!("epochs of 30 elements, ms: {epoch_ms:?}");
    assert!(
        started.elapsed() < Duration::from_secs(30),
        "20 epochs took {:?} (each, ms: {epoch_ms:?})",
        started.elapsed()
    );
}

#[test]
fn a_worker_killed_mid_epoch_loses_only_what_it_held_and_comes_back() {
    register_pipelines();
    let dport = free_port();
    let _d = dispatcher(dport, None);
    let (port_a, port_b) = (free_port(), free_port());
    let _a = worker(dport, port_a, None);
    let b = worker(dport, port_b, None);
    let target = format!("grpc://127.0.0.1:{dport}");
    let n = 600;
    let stats = ServiceStats::default();
    let ds = slow_epoch(&target, n, 4, &stats);
    let start = Instant::now();
    let mut got = vec![];
    let mut b = Some(b);
    for x in &ds {
        got.push(x.unwrap());
        if got.len() == 100 {
            b.take().unwrap().kill();
        }
        assert!(
            start.elapsed() < Duration::from_secs(120),
            "the epoch never ended"
        );
    }
    assert!(b.is_none(), "the epoch ended before the kill");
    unique_sorted(&got);
    let lost = stats.lost_workers();
    assert_eq!(lost, vec![format!("127.0.0.1:{port_b}")], "{stats}");
    // What it held: the rest of its current split and what its buffer had not delivered
    // (none, when the kill fell between two splits).
    assert!(stats.lost_elements() < 100, "{stats}");
    assert_eq!(
        got.len() as u64 + stats.lost_elements(),
        n as u64,
        "{stats}"
    );
    println!("{stats}");

    // The worker comes back on its address and gets work.
    let _b = worker(dport, port_b, None);
    let stats = ServiceStats::default();
    let again = service::pipeline::<Tensor>("slow", serde_json::json!({"n": 50, "ms": 1}))
        .unwrap()
        .apply(service::distribute_with(
            ProcessingMode::ParallelEpochs,
            &target,
            options(&stats),
        ))
        .unwrap();
    assert_eq!(again.iter().count(), 100);
    let by_worker = stats.elements_by_worker();
    assert_eq!(
        by_worker.get(&format!("127.0.0.1:{port_b}")),
        Some(&50),
        "{by_worker:?}"
    );
}

#[test]
fn a_worker_restarted_before_the_dispatcher_notices_is_a_new_worker() {
    register_pipelines();
    // Silence alone would take a minute to count: only the restart itself can tell.
    let dport = free_port();
    let _d = dispatcher_with(dport, None, &["--worker-timeout", "60s"]);
    let (port_a, port_b) = (free_port(), free_port());
    let _a = worker(dport, port_a, None);
    let b = worker(dport, port_b, None);
    let target = format!("grpc://127.0.0.1:{dport}");
    let b_address = format!("127.0.0.1:{port_b}");
    // Long enough (~5 s left at the restart) for the new process to start and join, also
    // on a loaded machine.
    let n = 1000;
    let stats = ServiceStats::default();
    let ds = slow_epoch(&target, n, 6, &stats);
    let start = Instant::now();
    let (mut got, mut b, mut restarted, mut from_b_before) = (vec![], Some(b), None, 0);
    for x in &ds {
        got.push(x.unwrap());
        if got.len() == 100 {
            from_b_before = stats
                .elements_by_worker()
                .get(&b_address)
                .copied()
                .unwrap_or(0);
            b.take().unwrap().kill();
            restarted = Some(worker(dport, port_b, None));
        }
        assert!(
            start.elapsed() < Duration::from_secs(50),
            "the epoch never ended: {stats}"
        );
    }
    assert!(restarted.is_some(), "the epoch ended before the restart");
    unique_sorted(&got);
    assert_eq!(stats.lost_workers(), vec![b_address.clone()], "{stats}");
    assert_eq!(
        got.len() as u64 + stats.lost_elements(),
        n as u64,
        "{stats}"
    );
    // The restarted worker joined the epoch and served part of it.
    let from_b = stats
        .elements_by_worker()
        .get(&b_address)
        .copied()
        .unwrap_or(0);
    assert!(from_b > from_b_before, "{stats}");
    println!("{stats}");
}

#[test]
fn a_consumer_whose_tasks_all_stopped_says_so_before_the_dispatcher_notices() {
    register_pipelines();
    // The dispatcher would take a minute to call the worker dead; the consumer's own
    // timeout (3 s) ends the wait with an error naming it.
    let dport = free_port();
    let _d = dispatcher_with(dport, None, &["--worker-timeout", "60s"]);
    let w = worker(dport, free_port(), None);
    let target = format!("grpc://127.0.0.1:{dport}");
    let stats = ServiceStats::default();
    let ds = service::pipeline::<Tensor>("slow", serde_json::json!({"n": 400, "ms": 4}))
        .unwrap()
        .apply(service::distribute_with(
            ProcessingMode::DistributedEpoch,
            &target,
            DistributeOptions {
                timeout: Duration::from_secs(3),
                ..options(&stats)
            },
        ))
        .unwrap();
    let (mut got, mut errors, mut w) = (0, vec![], Some(w));
    let start = Instant::now();
    for x in &ds {
        match x {
            Ok(_) => got += 1,
            Err(e) => errors.push(e.to_string()),
        }
        if got == 20 {
            if let Some(w) = w.take() {
                w.kill();
            }
        }
        assert!(start.elapsed() < Duration::from_secs(30), "never ended");
    }
    assert!(w.is_none(), "the epoch ended before the kill");
    assert!(
        errors
            .iter()
            .any(|e| e.contains("no task of the job has been read")),
        "{errors:?}"
    );
    assert!(start.elapsed() < Duration::from_secs(20));
}

#[test]
fn a_restarted_dispatcher_resumes_the_job_in_fault_tolerant_mode_and_fails_it_clearly_without() {
    register_pipelines();
    for fault_tolerant in [true, false] {
        let work_dir = tempfile::tempdir().unwrap();
        let work_dir = fault_tolerant.then_some(work_dir.path());
        let dport = free_port();
        let d = dispatcher(dport, work_dir);
        let _w = two_workers(dport);
        let target = format!("grpc://127.0.0.1:{dport}");
        let n = 400;
        let stats = ServiceStats::default();
        let ds = slow_epoch(&target, n, 4, &stats);
        let start = Instant::now();
        let (mut got, mut errors) = (vec![], vec![]);
        let mut d = Some(d);
        let mut restarted = None;
        for x in &ds {
            match x {
                Ok(x) => got.push(x),
                Err(e) => errors.push(e.to_string()),
            }
            if got.len() == 60 && d.is_some() {
                d.take().unwrap().kill();
                std::thread::sleep(Duration::from_millis(300));
                restarted = Some(dispatcher(dport, work_dir));
            }
            assert!(
                start.elapsed() < Duration::from_secs(120),
                "the epoch never ended"
            );
        }
        assert!(restarted.is_some(), "the epoch ended before the restart");
        let ids = unique_sorted(&got);
        if fault_tolerant {
            assert!(errors.is_empty(), "{errors:?}");
            assert_eq!(ids, (0..n).collect::<Vec<_>>(), "{stats}");
        } else {
            assert!(
                errors.iter().any(|e| e.contains("lost its jobs")),
                "{errors:?}"
            );
            assert!((got.len() as i64) < n);
        }
    }
}

#[test]
fn bad_input_is_a_clear_error_and_the_servers_keep_serving() {
    register_pipelines();
    // Registered in the trainer only: the workers cannot build it.
    service::register_pipeline("trainer_only", |_p: &serde_json::Value| {
        Ok(Dataset::range(0, 3, 1))
    });
    let dport = free_port();
    let _d = dispatcher(dport, None);
    let _w = worker(dport, free_port(), Some(1 << 20));
    let target = format!("grpc://127.0.0.1:{dport}");
    let stats = ServiceStats::default();
    let parallel = |ds: &Dataset<Tensor>| {
        ds.apply(service::distribute_with(
            ProcessingMode::ParallelEpochs,
            &target,
            options(&stats),
        ))
        .unwrap()
    };

    // Names and parameters the trainer can check itself.
    let e = service::pipeline::<Tensor>("no_such", serde_json::json!({})).unwrap_err();
    assert!(
        e.to_string().contains("no pipeline named \"no_such\""),
        "{e}"
    );
    let e = service::pipeline::<Tensor>("slow", serde_json::json!({"n": "ten"})).unwrap_err();
    assert!(e.to_string().contains("needs an integer n"), "{e}");
    let e = service::pipeline::<(Tensor, Tensor)>("slow", serde_json::json!({"n": 1})).unwrap_err();
    assert!(e.to_string().contains("yields"), "{e}");
    let e = Dataset::range(0, 3, 1)
        .apply(service::distribute(
            ProcessingMode::ParallelEpochs,
            &target,
            None,
        ))
        .unwrap_err();
    assert!(e.to_string().contains("not a registered pipeline"), "{e}");
    let e = service::pipeline::<Tensor>("slow", serde_json::json!({"n": 1}))
        .unwrap()
        .apply(service::distribute(
            ProcessingMode::ParallelEpochs,
            "localhost",
            None,
        ))
        .unwrap_err();
    assert!(e.to_string().contains("grpc://host:port"), "{e}");

    // A pipeline the worker lacks: one error naming it, then the job ends.
    let items: Vec<_> =
        parallel(&service::pipeline("trainer_only", serde_json::json!({})).unwrap())
            .iter()
            .collect();
    assert_eq!(items.len(), 1, "{items:?}");
    let e = items[0].as_ref().unwrap_err().to_string();
    assert!(e.contains("no pipeline named \"trainer_only\""), "{e}");

    // An element over the worker's limit: an error for it, the others arrive.
    let items: Vec<_> = parallel(&service::pipeline("big", serde_json::json!({})).unwrap())
        .iter()
        .collect();
    assert_eq!(items.len(), 4);
    let errors: Vec<String> = items
        .iter()
        .filter_map(|r| r.as_ref().err().map(|e| e.to_string()))
        .collect();
    assert_eq!(errors.len(), 1, "{errors:?}");
    assert!(
        errors[0].contains("larger than the worker's message limit"),
        "{}",
        errors[0]
    );

    // A wrong token: refused, naming the cause.
    let wrong = DistributeOptions {
        token: Some("guess".into()),
        timeout: Duration::from_secs(5),
        ..Default::default()
    };
    let items: Vec<_> = service::pipeline::<Tensor>("slow", serde_json::json!({"n": 2}))
        .unwrap()
        .apply(service::distribute_with(
            ProcessingMode::ParallelEpochs,
            &target,
            wrong,
        ))
        .unwrap()
        .iter()
        .collect();
    assert_eq!(items.len(), 1);
    let e = items[0].as_ref().unwrap_err().to_string();
    assert!(e.contains("tokens differ"), "{e}");

    // And the servers still serve.
    let ok: Vec<Tensor> =
        parallel(&service::pipeline("slow", serde_json::json!({"n": 5, "ms": 0})).unwrap())
            .iter()
            .collect::<Result<_, _>>()
            .unwrap();
    let mut v = ints(&ok);
    v.sort();
    assert_eq!(v, vec![0, 1, 2, 3, 4]);

    // register_dataset / from_dataset_id: the same pipeline and parameters, the same id;
    // an unknown id or another element type is an error.
    let five = service::pipeline::<Tensor>("slow", serde_json::json!({"n": 5, "ms": 0})).unwrap();
    let id = service::register_dataset_with(&target, &five, &options(&stats)).unwrap();
    assert_eq!(
        service::register_dataset_with(&target, &five, &options(&stats)).unwrap(),
        id
    );
    let by_id = service::from_dataset_id_with::<Tensor>(
        ProcessingMode::DistributedEpoch,
        &target,
        id,
        options(&stats),
    )
    .unwrap();
    let mut v = ints(&by_id.iter().collect::<Result<Vec<_>, _>>().unwrap());
    v.sort();
    assert_eq!(v, vec![0, 1, 2, 3, 4]);
    let e = service::from_dataset_id_with::<Tensor>(
        ProcessingMode::DistributedEpoch,
        &target,
        id + 1000,
        options(&stats),
    )
    .unwrap_err();
    assert!(e.to_string().contains("no dataset with id"), "{e}");
    let e = service::from_dataset_id_with::<(Tensor, Tensor)>(
        ProcessingMode::DistributedEpoch,
        &target,
        id,
        options(&stats),
    )
    .unwrap_err();
    assert!(e.to_string().contains("yields"), "{e}");
}
