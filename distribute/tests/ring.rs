//! The ring all-reduce across real processes on loopback: each test starts its workers as
//! child processes (this test binary again, running the ignored `worker` test) with
//! `TF_CONFIG` filled in on ports the OS picked, waits for them with a time limit, and kills
//! every child it started, also when it fails.

use ferroflow::Tensor;
use ferroflow_cluster::TfConfigClusterResolver;
use ferroflow_distribute::{CollectiveGroup, CommunicationOptions, ReduceOp};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

/// Free loopback addresses: bound by the OS, noted, released.
fn free_addresses(n: usize) -> Vec<String> {
    let listeners: Vec<_> = (0..n)
        .map(|_| std::net::TcpListener::bind("127.0.0.1:0").expect("bind"))
        .collect();
    listeners
        .iter()
        .map(|l| l.local_addr().expect("addr").to_string())
        .collect()
}

/// Kills every child on drop (a failing assertion included).
struct Workers(Vec<Child>);

impl Drop for Workers {
    fn drop(&mut self) {
        for c in &mut self.0 {
            let _ = c.kill();
            let _ = c.wait();
        }
    }
}

/// Starts `n` workers (chief-less cluster) running `mode`; returns them and when they began.
fn start(n: usize, mode: &str, timeout_s: u64) -> Workers {
    let addresses = free_addresses(n);
    let cluster = serde_json::json!({ "worker": addresses });
    let exe = std::env::current_exe().expect("test binary");
    let children = (0..n)
        .map(|i| {
            let tf_config = serde_json::json!({
                "cluster": cluster,
                "task": {"type": "worker", "index": i},
            });
            Command::new(&exe)
                .args([
                    "--ignored",
                    "--exact",
                    "worker",
                    "--nocapture",
                    "--test-threads=1",
                ])
                .env("TF_CONFIG", tf_config.to_string())
                .env("FERROFLOW_RING_MODE", mode)
                .env("FERROFLOW_RING_TIMEOUT_S", timeout_s.to_string())
                .stdout(Stdio::piped())
                .stderr(Stdio::piped())
                .spawn()
                .expect("start a worker")
        })
        .collect();
    Workers(children)
}

/// Waits for every worker (bounded), returning (exit code, output) per worker.
fn wait_all(workers: &mut Workers, limit: Duration) -> Vec<(i32, String)> {
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

/// The tensors worker `rank` contributes: deterministic, different per rank.
fn contribution(rank: usize) -> (Vec<f32>, Vec<f64>, Vec<i64>, Vec<i32>) {
    let r = rank as f64;
    (
        (0..1000)
            .map(|i| ((i as f64 * 0.37 + r * 1.3).sin()) as f32)
            .collect(),
        (0..15).map(|i| i as f64 * 0.5 - r * 2.25).collect(),
        (0..7).map(|i| i * 1_000_000_007 + rank as i64).collect(),
        (0..3).map(|i| i - 7 * rank as i32).collect(),
    )
}

/// The worker: all-reduces its contribution and checks the result against the sum of every
/// rank's contribution computed here; exits 0 when right. In `die` mode the last rank exits
/// at once and the others must fail naming a peer.
#[test]
#[ignore = "a worker process, started by the tests below"]
fn worker() {
    ferroflow::init();
    let mode = std::env::var("FERROFLOW_RING_MODE").expect("started by a test");
    let timeout = Duration::from_secs(
        std::env::var("FERROFLOW_RING_TIMEOUT_S")
            .ok()
            .and_then(|s| s.parse().ok())
            .unwrap_or(30),
    );
    let resolver = TfConfigClusterResolver::from_env().expect("TF_CONFIG");
    let options = CommunicationOptions {
        timeout,
        bytes_per_pack: if mode == "packed" { 256 } else { 0 },
        ..CommunicationOptions::default()
    };
    let group = CollectiveGroup::new(&resolver, options).expect("group");
    let (rank, n) = (group.rank(), group.world_size());
    if mode == "die" && rank == n - 1 {
        std::process::exit(0);
    }
    let (a, b, c, d) = contribution(rank);
    let tensors = [
        Tensor::from_vec(a, &[10, 100]).unwrap(),
        Tensor::from_vec(b, &[3, 5]).unwrap(),
        Tensor::from_vec(c, &[7]).unwrap(),
        Tensor::from_vec(d, &[3]).unwrap(),
    ];
    let started = Instant::now();
    let sums = match group.all_reduce(&tensors, ReduceOp::Sum) {
        Ok(s) => s,
        Err(e) => {
            println!("ERROR after {:?}: {e}", started.elapsed());
            std::process::exit(3);
        }
    };
    let all: Vec<_> = (0..n).map(contribution).collect();
    let want_a: Vec<f64> = (0..1000)
        .map(|i| all.iter().map(|c| c.0[i] as f64).sum())
        .collect();
    let got_a = sums[0].to_vec::<f32>().unwrap();
    for (g, w) in got_a.iter().zip(&want_a) {
        assert!(
            (*g as f64 - w).abs() <= 1e-5 * (1.0 + w.abs()),
            "{g} vs {w}"
        );
    }
    let want_b: Vec<f64> = (0..15).map(|i| all.iter().map(|c| c.1[i]).sum()).collect();
    assert_eq!(sums[1].to_vec::<f64>().unwrap(), want_b);
    let want_c: Vec<i64> = (0..7).map(|i| all.iter().map(|c| c.2[i]).sum()).collect();
    assert_eq!(sums[2].to_vec::<i64>().unwrap(), want_c);
    let want_d: Vec<i32> = (0..3).map(|i| all.iter().map(|c| c.3[i]).sum()).collect();
    assert_eq!(sums[3].to_vec::<i32>().unwrap(), want_d);
    assert_eq!(sums[0].shape(), &[10, 100]);
    // The mean, and every rank's bits: print a checksum the parent compares.
    let mean = group.all_reduce(&tensors[..2], ReduceOp::Mean).unwrap();
    let m = mean[1].to_vec::<f64>().unwrap();
    for (g, w) in m.iter().zip(&want_b) {
        assert!((g - w / n as f64).abs() < 1e-12);
    }
    // all_gather: every rank's [2, 3] block, in rank order.
    let block = Tensor::from_vec(vec![rank as f32; 6], &[2, 3]).unwrap();
    let gathered = group.all_gather(&block).unwrap();
    assert_eq!(gathered.shape(), &[2 * n, 3]);
    let want: Vec<f32> = (0..n).flat_map(|r| vec![r as f32; 6]).collect();
    assert_eq!(gathered.to_vec::<f32>().unwrap(), want);
    // broadcast from the last rank: everyone ends with its values.
    let root = n - 1;
    let mine = Tensor::from_vec(vec![rank as i64 * 10, -1], &[2]).unwrap();
    let b = group.broadcast(&mine, root).unwrap();
    assert_eq!(b.to_vec::<i64>().unwrap(), vec![root as i64 * 10, -1]);
    group.barrier().unwrap();
    let bits: u64 = got_a
        .iter()
        .fold(0u64, |h, v| h.rotate_left(5) ^ v.to_bits() as u64);
    println!("CHECKSUM {bits:016x}");
}

#[test]
fn collectives_equal_the_local_results_for_1_to_4_workers_with_identical_bits() {
    for (n, mode) in [(1, "plain"), (2, "plain"), (3, "packed"), (4, "plain")] {
        let mut workers = start(n, mode, 30);
        let results = wait_all(&mut workers, Duration::from_secs(120));
        let mut sums = vec![];
        for (rank, (code, out)) in results.iter().enumerate() {
            assert_eq!(*code, 0, "{n} workers ({mode}), rank {rank} failed:\n{out}");
            let sum = out
                .lines()
                .find_map(|l| l.split_once("CHECKSUM ").map(|(_, s)| s.trim()))
                .unwrap_or_else(|| panic!("rank {rank} printed no checksum:\n{out}"));
            sums.push(sum.to_string());
        }
        assert!(
            sums.iter().all(|s| *s == sums[0]),
            "{n} workers: the ranks' results differ: {sums:?}"
        );
    }
}

#[test]
fn a_dead_worker_is_an_error_naming_a_peer_within_the_timeout() {
    let n = 3;
    let timeout_s = 3;
    let started = Instant::now();
    let mut workers = start(n, "die", timeout_s);
    let results = wait_all(&mut workers, Duration::from_secs(60));
    let took = started.elapsed();
    assert_eq!(results[n - 1].0, 0, "the dying worker exits cleanly");
    for (rank, (code, out)) in results[..n - 1].iter().enumerate() {
        assert_eq!(*code, 3, "rank {rank} should fail with an error:\n{out}");
        assert!(
            out.contains("ERROR")
                && out.contains("/job:worker/task:")
                && out.contains("all_reduce 0"),
            "rank {rank}: the error names no peer or collective:\n{out}"
        );
    }
    // Each survivor gives up after about one timeout (a chain of two at most).
    assert!(
        took < Duration::from_secs(2 * timeout_s + 20),
        "took {took:?}"
    );
    println!("survivors failed within {took:?} (timeout {timeout_s} s)");
}
