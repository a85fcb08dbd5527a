//! Worker processes for the multi-process suites (`collectives.rs`, and the facade's
//! `tests/nccl_collectives.rs`, which includes this file): each test
//! starts its workers as child processes, the test binary again running its ignored
//! `worker` test, with `TF_CONFIG` filled in on ports the OS picked (each handed to its
//! worker listening), waits for them with a time limit and kills every one it started,
//! also when it fails.
#![allow(dead_code)]

pub mod training;

use std::process::{Child, Command, Stdio};
use std::sync::Mutex;
use std::time::{Duration, Instant};

/// Kills every child on drop (a failing assertion included).
pub struct Workers(pub Vec<Child>);

impl Drop for Workers {
    fn drop(&mut self) {
        for c in &mut self.0 {
            let _ = c.kill();
            let _ = c.wait();
        }
    }
}

/// Starts `n` workers (a chief-less cluster) of this test binary's `worker` test, each with
/// `env` set.
pub fn start_workers(n: usize, env: &[(&str, String)]) -> Workers {
    // Held listening until each worker has started with its own (`hand_over`).
    let ports = ferroflow::cluster::reserve_loopback_ports(n).expect("reserve ports");
    let addresses: Vec<&str> = ports.iter().map(|p| p.address()).collect();
    let cluster = serde_json::json!({ "worker": addresses });
    let exe = std::env::current_exe().expect("test binary");
    let children = (0..n)
        .map(|i| {
            let tf_config = serde_json::json!({
                "cluster": cluster,
                "task": {"type": "worker", "index": i},
            });
            let mut command = Command::new(&exe);
            ferroflow::cluster::hand_over(&mut command, &[&ports[i]]);
            command
                .args([
                    "--ignored",
                    "--exact",
                    "worker",
                    "--nocapture",
                    "--test-threads=1",
                ])
                .env("TF_CONFIG", tf_config.to_string())
                .envs(env.iter().map(|(k, v)| (k, v)))
                .stdout(Stdio::piped())
                .stderr(Stdio::piped())
                .spawn()
                .expect("start a worker")
        })
        .collect();
    Workers(children)
}

/// Waits for every worker (bounded), returning (exit code, output) per worker.
pub fn wait_all(workers: &mut Workers, limit: Duration) -> Vec<(i32, String)> {
    let start = Instant::now();
    let mut done: Vec<Option<i32>> = vec![None; workers.0.len()];
    while done.iter().any(Option::is_none) {
        assert!(
            start.elapsed() < limit,
            "workers still running after {limit:?}: {done:?}"
        );
        for (c, d) in workers.0.iter_mut().zip(&mut done) {
            if d.is_none() {
                if let Some(status) = c.try_wait().expect("wait") {
                    *d = Some(status.code().unwrap_or(-1));
                }
            }
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    workers
        .0
        .iter_mut()
        .zip(done)
        .map(|(c, code)| {
            use std::io::Read;
            let mut out = String::new();
            if let Some(mut s) = c.stdout.take() {
                let _ = s.read_to_string(&mut out);
            }
            if let Some(mut s) = c.stderr.take() {
                let _ = s.read_to_string(&mut out);
            }
            (code.unwrap_or(-1), out)
        })
        .collect()
}

/// The value a worker printed after `key` and a space (the first such line).
pub fn field<'a>(out: &'a str, key: &str) -> &'a str {
    out.lines()
        .find_map(|l| l.split(&format!("{key} ")).nth(1))
        .unwrap_or_else(|| panic!("no {key} in:\n{out}"))
}

/// The transport stat of every collective span (a trace sink).
#[derive(Default)]
pub struct SpanTransports(pub Mutex<Vec<String>>);

impl SpanTransports {
    /// Prints `TRANSPORTS` and the transports seen, comma-separated (see [`field`]).
    pub fn print(&self) {
        println!("TRANSPORTS {}", self.0.lock().unwrap().join(","));
    }
}

impl ferroflow::trace::TraceSink for SpanTransports {
    fn on_host_event(&self, event: &ferroflow::trace::HostEvent<'_>) {
        for (name, value) in event.stats {
            if let (&"transport", ferroflow::trace::StatValue::Str(t)) = (name, value) {
                self.0.lock().unwrap().push(t.to_string());
            }
        }
    }
    fn on_memory(&self, _: &ferroflow::trace::MemoryEvent) {}
}
