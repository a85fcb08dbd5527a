//! The profiler server and client (`tf.profiler.experimental.server` / `client`): a capture
//! taken on demand while training runs, TensorBoard's own capture client (xprof's, the call
//! behind the *Capture Profile* dialog) against our server, `monitor`, and bad input: a
//! closed port, an address that is not a profiler, a duration of 0, a second capture while
//! one runs; each a clear error while the training goes on.

use ferroflow::profiler::{self, client, server};
use ferroflow::tensor::testing::ChildProcess;
use ferroflow::{DType, Tensor};
use std::path::Path;
use std::process::Command;
use std::sync::atomic::{AtomicBool, AtomicI64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

/// The profiler is one per process: these tests take turns.
static ONE_AT_A_TIME: Mutex<()> = Mutex::new(());

fn serial() -> std::sync::MutexGuard<'static, ()> {
    ONE_AT_A_TIME.lock().unwrap_or_else(|e| e.into_inner())
}

/// A training loop on its own thread (steps marked as Keras marks them) until stopped; its
/// step count and any error come back from `stop`.
struct Training {
    stop: Arc<AtomicBool>,
    steps: Arc<AtomicI64>,
    thread: Option<std::thread::JoinHandle<ferroflow::Result<()>>>,
}

impl Training {
    fn start() -> Training {
        ferroflow::init();
        let stop = Arc::new(AtomicBool::new(false));
        let steps = Arc::new(AtomicI64::new(0));
        let (s, n) = (stop.clone(), steps.clone());
        let thread = std::thread::spawn(move || {
            let w = Tensor::ones(&[48, 48], DType::F32)?;
            let end = Instant::now() + Duration::from_secs(120);
            while !s.load(Ordering::Relaxed) && Instant::now() < end {
                let step = n.fetch_add(1, Ordering::Relaxed);
                let _t = profiler::Trace::new("train", step);
                let _ = w
                    .matmul(&w)?
                    .tanh()?
                    .reduce_sum(Vec::<isize>::new(), false)?;
                std::thread::sleep(Duration::from_millis(2));
            }
            Ok(())
        });
        Training {
            stop,
            steps,
            thread: Some(thread),
        }
    }

    fn stop(mut self) -> i64 {
        self.stop.store(true, Ordering::Relaxed);
        self.thread
            .take()
            .unwrap()
            .join()
            .unwrap()
            .expect("the training failed");
        self.steps.load(Ordering::Relaxed)
    }
}

impl Drop for Training {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
    }
}

#[test]
fn a_capture_while_training_writes_the_workers_profile() {
    let _g = serial();
    let training = Training::start();
    let server = server::start(0).unwrap();
    let addr = format!("grpc://{}", server.local_addr());
    let dir = tempfile::tempdir().unwrap();
    let before = training.steps.load(Ordering::Relaxed);
    let capture = client::trace(&addr, dir.path(), 500, 3, Default::default()).unwrap();
    assert!(capture.failures.is_empty(), "{:?}", capture.failures);
    let [(worker, xplane)] = &capture.profiles[..] else {
        panic!("one profile expected: {:?}", capture.profiles)
    };
    assert_eq!(worker, &server.local_addr().to_string());
    let port = server.local_addr().port();
    assert_eq!(
        xplane.file_name().unwrap().to_string_lossy(),
        format!("127.0.0.1_{port}.xplane.pb")
    );
    assert!(xplane.starts_with(dir.path().join("plugins/profile")));
    assert!(xplane
        .with_file_name(format!("127.0.0.1_{port}.trace.json.gz"))
        .exists());
    // TensorBoard lists the folder as a run: it has an event file.
    assert!(std::fs::read_dir(dir.path()).unwrap().any(|e| e
        .unwrap()
        .file_name()
        .to_string_lossy()
        .starts_with("events.out.tfevents.")));
    let summary = profiler::summarize(&profiler::read_xspace(xplane).unwrap());
    assert!(
        summary.steps.len() >= 5,
        "{} steps captured",
        summary.steps.len()
    );
    assert!(summary.ops.iter().any(|o| o.op_type == "MatMul"));
    // The steps captured are the training's, in its numbering.
    assert!(summary.steps.iter().all(|s| s.step_num >= before));
    // No capture runs now: the process can profile locally again, and the training went on.
    assert!(!profiler::is_running());
    let trained = training.stop();
    assert!(trained > summary.steps.len() as i64);
}

#[test]
fn monitor_reports_the_step_time() {
    let _g = serial();
    let training = Training::start();
    let server = server::start(0).unwrap();
    let addr = server.local_addr().to_string();
    let text = client::monitor(&addr, 400, 1).unwrap();
    assert!(text.starts_with("Steps: "), "{text}");
    assert!(text.contains("ms avg"), "{text}");
    let detailed = client::monitor(&addr, 400, 2).unwrap();
    assert!(detailed.contains("compute"), "{detailed}");
    assert!(client::monitor(&addr, 400, 3)
        .unwrap_err()
        .to_string()
        .contains("level 3"));
    training.stop();
}

#[test]
fn bad_addresses_durations_and_a_second_capture_are_clear_errors() {
    let _g = serial();
    let training = Training::start();
    let dir = tempfile::tempdir().unwrap();
    // A closed port: named, within the attempts (no long wait).
    let closed = ferroflow::cluster::free_loopback_addresses(1)
        .unwrap()
        .remove(0);
    let t = Instant::now();
    let e = client::trace(&closed, dir.path(), 200, 2, Default::default())
        .unwrap_err()
        .to_string();
    assert!(
        e.contains(&closed) && e.contains("no profiler server answers"),
        "{e}"
    );
    assert!(t.elapsed() < Duration::from_secs(30));
    // A gRPC server that is not a profiler (a cluster task's).
    let task = ferroflow::cluster::TaskServer::start("127.0.0.1:0", None).unwrap();
    let e = client::trace(
        &task.local_addr().to_string(),
        dir.path(),
        200,
        3,
        Default::default(),
    )
    .unwrap_err()
    .to_string();
    assert!(e.contains("not a profiler server"), "{e}");
    // A TCP server that does not speak gRPC at all.
    let plain = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let plain_addr = plain.local_addr().unwrap().to_string();
    let talker = std::thread::spawn(move || {
        use std::io::Write;
        for s in plain.incoming().take(2) {
            let _ = s.and_then(|mut s| s.write_all(b"HTTP/1.1 400 Bad Request\r\n\r\n"));
        }
    });
    let e = client::trace(&plain_addr, dir.path(), 200, 2, Default::default())
        .unwrap_err()
        .to_string();
    assert!(e.contains(&plain_addr), "{e}");
    let _ = std::net::TcpStream::connect(&plain_addr);
    let _ = std::net::TcpStream::connect(&plain_addr);
    let _ = talker.join();

    let server = server::start(0).unwrap();
    let addr = server.local_addr().to_string();
    let e = client::trace(&addr, dir.path(), 0, 1, Default::default())
        .unwrap_err()
        .to_string();
    assert!(e.contains("duration_ms is 0"), "{e}");
    // Two captures at once: the second is refused, naming the cause; the first is written.
    let first = {
        let (addr, dir) = (addr.clone(), dir.path().to_path_buf());
        std::thread::spawn(move || client::trace(&addr, dir, 1500, 1, Default::default()))
    };
    std::thread::sleep(Duration::from_millis(600));
    // While it runs, the profiler listens to every op and every span.
    assert!(profiler::is_running());
    assert_eq!(ferroflow::tensor::dispatch::global_observer_count(), 1);
    assert!(ferroflow::tensor::trace::is_active());
    let e = client::trace(&addr, dir.path(), 300, 3, Default::default())
        .unwrap_err()
        .to_string();
    assert!(e.contains("another profiler is running"), "{e}");
    // A local profile cannot start either, nor stop the capture.
    let e = profiler::start(dir.path().join("local"), Default::default())
        .unwrap_err()
        .to_string();
    assert!(e.contains("a capture by a profiler client"), "{e}");
    assert!(profiler::stop().is_err());
    let first = first.join().unwrap().unwrap();
    assert_eq!(first.profiles.len(), 1);
    // After it nothing is left listening: the training pays nothing (one atomic load per op
    // and span, as before the capture).
    assert!(!profiler::is_running());
    assert_eq!(ferroflow::tensor::dispatch::global_observer_count(), 0);
    assert!(!ferroflow::tensor::trace::is_active());
    // One good worker and one dead: the good one's profile is written, the dead one named.
    let both = format!("grpc://{addr},grpc://{closed}");
    let capture = client::trace(&both, dir.path(), 300, 1, Default::default()).unwrap();
    assert_eq!(capture.profiles.len(), 1);
    assert_eq!(capture.failures.len(), 1);
    assert_eq!(capture.failures[0].0, closed);
    // A local profile while the server idles works as before.
    let local = profiler::Profile::start(dir.path().join("local"), Default::default()).unwrap();
    local.finish().unwrap();
    assert!(training.stop() > 0);
}

fn has_xprof() -> bool {
    let ok = Command::new("python3")
        .args(["-c", "import xprof.convert._pywrap_profiler_plugin"])
        .status()
        .is_ok_and(|s| s.success());
    if !ok {
        ferroflow::tensor::testing::skip(
            "FERROFLOW_REQUIRE_TENSORBOARD",
            "python3 with xprof (TensorBoard's profile plugin and its capture client) is not \
             installed (pip install xprof; .ci/run does)",
        );
    }
    ok
}

#[test]
fn tensorboards_capture_client_captures_a_ferroflow_worker() {
    if !has_xprof() {
        return;
    }
    let _g = serial();
    let training = Training::start();
    let server = server::start(0).unwrap();
    let dir = tempfile::tempdir().unwrap();
    let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/capture_with_xprof.py");
    let out = Command::new("python3")
        .arg(&script)
        .arg(format!("grpc://{}", server.local_addr()))
        .arg(dir.path())
        .output()
        .unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    println!("{stdout}");
    assert!(
        out.status.success(),
        "xprof's capture failed:\n{stdout}\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
    // What it wrote is our XSpace, with the training's steps in it.
    let (_, planes) = profiler::latest_profile(dir.path()).unwrap();
    assert_eq!(planes.len(), 1, "{planes:?}");
    // Named by TF's client after the address it captured.
    let port = server.local_addr().port();
    assert!(
        planes[0].ends_with(format!("127.0.0.1_{port}.xplane.pb")),
        "{planes:?}"
    );
    let summary = profiler::summarize(&profiler::read_xspace(&planes[0]).unwrap());
    assert!(!summary.steps.is_empty());
    training.stop();
}

/// Starts `command` (its stderr dropped) and waits, at most `limit`, until it prints a line
/// containing "started"; killed when dropped.
fn start_child(command: &mut Command, limit: Duration) -> ChildProcess {
    command.stderr(std::process::Stdio::null());
    ChildProcess::start(command, "started", limit).unwrap().0
}

#[test]
fn our_client_captures_a_tensorflow_worker() {
    let has_tf = Command::new("python3")
        .args(["-c", "import tensorflow"])
        .stderr(std::process::Stdio::null())
        .status()
        .is_ok_and(|s| s.success());
    if !has_tf {
        ferroflow::tensor::testing::skip(
            "FERROFLOW_REQUIRE_TENSORFLOW",
            "python3 with TensorFlow is not installed (pip install tensorflow-cpu), so there is \
             no TensorFlow profiler server to capture",
        );
        return;
    }
    let port = ferroflow::cluster::free_loopback_addresses(1)
        .unwrap()
        .remove(0);
    let port = port.rsplit_once(':').unwrap().1.to_string();
    let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/tf_profiler_worker.py");
    let _worker = start_child(
        Command::new("python3").arg(&script).arg(&port),
        Duration::from_secs(90),
    );
    let dir = tempfile::tempdir().unwrap();
    let addr = format!("grpc://127.0.0.1:{port}");
    let capture = client::trace(&addr, dir.path(), 800, 3, Default::default()).unwrap();
    // TF's server wrote it into our run folder, under the name we gave it.
    let [(_, xplane)] = &capture.profiles[..] else {
        panic!("{capture:?}")
    };
    assert_eq!(
        xplane.file_name().unwrap().to_string_lossy(),
        format!("127.0.0.1_{port}.xplane.pb")
    );
    let summary = profiler::summarize(&profiler::read_xspace(xplane).unwrap());
    assert!(summary.steps.len() >= 5, "{} steps", summary.steps.len());
    // (TF's eager ops are host events of its own naming, `KernelAndDeviceFunc::Run`.)
    assert!(!summary.ops.is_empty());
}

#[test]
#[ignore = "a worker process with a cluster token, started by the token test"]
fn token_worker_child() {
    let _server = server::start_from_env()
        .unwrap()
        .expect("FERROFLOW_PROFILER_PORT");
    let training = Training::start();
    println!("started");
    std::thread::sleep(Duration::from_secs(40));
    training.stop();
}

#[test]
#[ignore = "a client process with a cluster token, started by the token test"]
fn token_client_child() {
    let addr = std::env::var("FERROFLOW_TEST_PROFILER_ADDR").unwrap();
    let dir = tempfile::tempdir().unwrap();
    match client::trace(&addr, dir.path(), 300, 1, Default::default()) {
        Ok(c) => println!("CAPTURED {}", c.profiles.len()),
        Err(e) => println!("FAILED {e}"),
    }
}

#[test]
fn a_server_with_the_cluster_token_refuses_clients_without_it() {
    let exe = std::env::current_exe().unwrap();
    let addr = ferroflow::cluster::free_loopback_addresses(1)
        .unwrap()
        .remove(0);
    let port = addr.rsplit_once(':').unwrap().1.to_string();
    let _worker = start_child(
        Command::new(&exe)
            .args(["--ignored", "--exact", "token_worker_child", "--nocapture"])
            .env("FERROFLOW_CLUSTER_TOKEN", "s3cret")
            .env(server::PORT_ENV, &port),
        Duration::from_secs(60),
    );
    let client = |token: Option<&str>| {
        let mut c = Command::new(&exe);
        c.args(["--ignored", "--exact", "token_client_child", "--nocapture"])
            .env("FERROFLOW_TEST_PROFILER_ADDR", &addr)
            .env_remove("FERROFLOW_CLUSTER_TOKEN");
        if let Some(t) = token {
            c.env("FERROFLOW_CLUSTER_TOKEN", t);
        }
        String::from_utf8_lossy(&c.output().unwrap().stdout).into_owned()
    };
    let without = client(None);
    assert!(
        without.contains("FAILED") && without.contains("tokens differ"),
        "{without}"
    );
    let wrong = client(Some("guess"));
    assert!(
        wrong.contains("FAILED") && wrong.contains("tokens differ"),
        "{wrong}"
    );
    let with = client(Some("s3cret"));
    assert!(with.contains("CAPTURED 1"), "{with}");
}
