//! The collectives across real processes, on every transport: the ring over shared memory
//! (the workers all on this host) and over gRPC on loopback (each test starts its workers
//! as child processes, this test binary again running the ignored `worker` test, with
//! `TF_CONFIG` filled in on ports the OS picked, each handed to its worker listening) and,
//! with the `mpi` feature, MPI (the same worker started by
//! `mpirun`, no TF_CONFIG). Every test waits for its processes with a time limit and kills
//! every one it started, also when it fails.

use ferroflow::{DType, HostData, Tensor};
use ferroflow_cluster::TfConfigClusterResolver;
use ferroflow_distribute::{CollectiveGroup, CommunicationOptions, ReduceOp};
use proptest::prelude::*;
mod common;

use common::{start_workers, wait_all, SpanTransports, Workers};
use std::process::Command;
use std::sync::Arc;
use std::time::{Duration, Instant};

/// Starts `n` workers (chief-less cluster) running `mode`; returns them and when they began.
fn start(n: usize, mode: &str, timeout_s: u64) -> Workers {
    start_workers(
        n,
        &[
            ("FERROFLOW_COLLECTIVE_MODE", mode.to_string()),
            ("FERROFLOW_COLLECTIVE_TIMEOUT_S", timeout_s.to_string()),
        ],
    )
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
/// at once (`kill` mode: kills itself with SIGKILL) and the others must fail naming a peer;
/// `property:SEED:PACK` runs [`property_case`].
#[test]
#[ignore = "a worker process, started by the tests below"]
fn worker() {
    ferroflow::init();
    let mode = std::env::var("FERROFLOW_COLLECTIVE_MODE").expect("started by a test");
    // `MODE/grpc`: shared memory off, the messages over loopback gRPC.
    let (mode, shared_memory) = match mode.strip_suffix("/grpc") {
        Some(m) => (m.to_string(), false),
        None => (mode, true),
    };
    let timeout = Duration::from_secs(
        std::env::var("FERROFLOW_COLLECTIVE_TIMEOUT_S")
            .ok()
            .and_then(|s| s.parse().ok())
            .unwrap_or(30),
    );
    // Without TF_CONFIG under mpirun, the group is MPI's (the `mpi` feature).
    let resolver = TfConfigClusterResolver::from_env().expect("TF_CONFIG");
    let property: Option<(u64, usize)> = mode.strip_prefix("property:").map(|rest| {
        let (seed, pack) = rest.split_once(':').expect("property:SEED:PACK");
        (seed.parse().expect("seed"), pack.parse().expect("pack"))
    });
    let options = CommunicationOptions {
        timeout,
        bytes_per_pack: match (mode.as_str(), property) {
            ("packed", _) => 256,
            (_, Some((_, pack))) => pack,
            _ => 0,
        },
        shared_memory,
        ..CommunicationOptions::default()
    };
    let group = CollectiveGroup::new(&resolver, options).expect("group");
    let (rank, n) = (group.rank(), group.world_size());
    println!(
        "TRANSPORT {}",
        if std::env::var("TF_CONFIG").is_ok() {
            "ring"
        } else {
            "mpi"
        }
    );
    if let Some((seed, _)) = property {
        let bits = property_case(&group, seed);
        println!("LINKS {}", group.transport());
        println!("CHECKSUM {bits:016x}");
        return;
    }
    if mode == "kill-mid" {
        kill_mid_collective(&group);
    }
    if (mode == "die" || mode == "kill") && rank == n - 1 {
        if mode == "kill" {
            let _ = Command::new("kill")
                .args(["-KILL", &std::process::id().to_string()])
                .status();
        }
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
    // The first collective's profiler span, which must name the transport it took.
    let spans = Arc::new(SpanTransports::default());
    let sink = ferroflow::trace::install_sink(spans.clone());
    let sums = match group.all_reduce(&tensors, ReduceOp::Sum) {
        Ok(s) => s,
        Err(e) => {
            println!("ERROR after {:?}: {e}", started.elapsed());
            std::process::exit(3);
        }
    };
    drop(sink);
    if let Some(first) = spans.0.lock().unwrap().first() {
        println!("SPAN_TRANSPORT {first}");
    }
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
    // A long tensor: its chunks travel in several pipelined segments (1 MiB each), the last
    // one short. Small integers, so the sums are exact.
    assert_exact_sum(&group, 1_500_001, |i, r| ((i * 7 + r) % 13) as f32, "long");
    // 128 KiB: with 3 tasks exchanged directly, each message (with its header) longer than
    // a shared-memory side channel, so it streams through in pieces.
    assert_exact_sum(&group, 32_768, |i, r| ((i + 3 * r) % 17) as f32, "128 KiB");
    // Views: rows off the front (read in place at an offset where the transport can) and a
    // transpose (gathered first). Rank r's element is rank 0's plus r.
    let grid: Vec<f32> = (0..12).map(|i| (i + rank) as f32).collect();
    let grid = Tensor::from_vec(grid, &[3, 4]).unwrap();
    for view in [
        grid.slice(&[1, 0], &[-1, -1]).unwrap(),
        grid.transpose(&[1, 0]).unwrap(),
    ] {
        let sum = group
            .all_reduce(std::slice::from_ref(&view), ReduceOp::Sum)
            .unwrap();
        assert_eq!(sum[0].shape(), view.shape());
        let want: Vec<f32> = view
            .to_vec::<f32>()
            .unwrap()
            .iter()
            .map(|v| (v - rank as f32) * n as f32 + (n * (n - 1) / 2) as f32)
            .collect();
        assert_eq!(
            sum[0].to_vec::<f32>().unwrap(),
            want,
            "a view {:?}",
            view.shape()
        );
    }
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
    println!("LINKS {}", group.transport());
    let bits: u64 = got_a
        .iter()
        .fold(0u64, |h, v| h.rotate_left(5) ^ v.to_bits() as u64);
    println!("CHECKSUM {bits:016x}");
}

/// All-reduces a `len`-long f32 tensor whose element `i` on rank `r` is `value(i, r)`
/// (small integers, so the sum is exact) and checks the sum on this rank.
fn assert_exact_sum(
    group: &CollectiveGroup,
    len: usize,
    value: fn(usize, usize) -> f32,
    what: &str,
) {
    let (rank, n) = (group.rank(), group.world_size());
    let mine: Vec<f32> = (0..len).map(|i| value(i, rank)).collect();
    let sum = group
        .all_reduce(&[Tensor::from_vec(mine, &[len]).unwrap()], ReduceOp::Sum)
        .unwrap();
    let want: Vec<f32> = (0..len)
        .map(|i| (0..n).map(|r| value(i, r)).sum())
        .collect();
    assert!(
        sum[0].to_vec::<f32>().unwrap() == want,
        "the {what} tensor's sum differs"
    );
}

/// `kill-mid` mode: all-reduces 64 MB tensors over and over; after the first (the links
/// set up), the last rank kills itself with SIGKILL 100 ms later, in the middle of one. The
/// others print the error they get.
fn kill_mid_collective(group: &CollectiveGroup) -> ! {
    let (rank, n) = (group.rank(), group.world_size());
    let big = Tensor::from_vec(vec![1.0f32; 16 << 20], &[16 << 20]).unwrap();
    group
        .all_reduce(std::slice::from_ref(&big), ReduceOp::Sum)
        .expect("the first all-reduce");
    if rank == n - 1 {
        std::thread::spawn(|| {
            std::thread::sleep(Duration::from_millis(100));
            let _ = Command::new("kill")
                .args(["-KILL", &std::process::id().to_string()])
                .status();
        });
    }
    let started = Instant::now();
    for _ in 0..1000 {
        if let Err(e) = group.all_reduce(std::slice::from_ref(&big), ReduceOp::Sum) {
            println!("LINKS {}", group.transport());
            println!("ERROR after {:?}: {e}", started.elapsed());
            std::process::exit(3);
        }
    }
    println!("no error after 1000 all-reduces");
    std::process::exit(4);
}

/// Whether this machine offers POSIX shared memory (`/dev/shm`) to this user: there the
/// tasks of one host must find their shared-memory links.
fn shared_memory_available() -> bool {
    let probe = format!(
        "/dev/shm/ferroflow-collectives-probe-{}",
        std::process::id()
    );
    let ok = cfg!(target_os = "linux") && std::fs::write(&probe, b"probe").is_ok();
    let _ = std::fs::remove_file(&probe);
    if !ok {
        println!(
            "NOTE: no writable /dev/shm here: the collectives run over gRPC only and the \
             shared-memory links go untested"
        );
    }
    ok
}

/// Fails if any of `workers` left a shared-memory segment in `/dev/shm` (they are unlinked
/// once the group's links are set up).
fn assert_no_segments_left(workers: &Workers) {
    let pids: Vec<String> = workers.0.iter().map(|c| c.id().to_string()).collect();
    let left: Vec<String> = std::fs::read_dir("/dev/shm")
        .map(|d| {
            d.flatten()
                .map(|e| e.file_name().to_string_lossy().to_string())
                .filter(|name| {
                    pids.iter()
                        .any(|p| name.starts_with(&format!("ferroflow-collectives-{p}-")))
                })
                .collect()
        })
        .unwrap_or_default();
    assert!(left.is_empty(), "segments left in /dev/shm: {left:?}");
}

/// The transport each worker reported (`LINKS ...`).
fn links(results: &[(i32, String)]) -> Vec<String> {
    results
        .iter()
        .map(|(_, out)| {
            out.lines()
                .find_map(|l| l.strip_prefix("LINKS ").map(str::to_string))
                .unwrap_or_default()
        })
        .collect()
}

#[test]
fn collectives_equal_the_local_results_for_1_to_4_workers_with_identical_bits() {
    let shm = shared_memory_available();
    for (n, mode) in [
        (1, "plain"),
        (2, "plain"),
        (2, "plain/grpc"),
        (3, "packed"),
        (3, "packed/grpc"),
        (4, "plain"),
    ] {
        let mut workers = start(n, mode, 30);
        let results = wait_all(&mut workers, Duration::from_secs(120));
        checksums(&results, &format!("{n} workers ({mode})"));
        assert_no_segments_left(&workers);
        let want = match (n, mode.ends_with("/grpc"), shm) {
            (1, _, _) => "none",
            (_, false, true) => "shared memory",
            _ => "grpc",
        };
        assert!(
            links(&results).iter().all(|l| l == want),
            "{n} workers ({mode}): the collectives went over {:?}, not {want}",
            links(&results)
        );
        for (rank, (_, out)) in results.iter().enumerate() {
            assert!(
                out.contains(&format!("SPAN_TRANSPORT {want}\n")),
                "{n} workers ({mode}): rank {rank}'s first collective span does not say {want}:\n{out}"
            );
        }
    }
}

#[test]
fn a_dead_worker_is_an_error_naming_a_peer_within_the_timeout() {
    for mode in ["die", "die/grpc"] {
        dead_worker_is_an_error(mode);
    }
}

fn dead_worker_is_an_error(mode: &str) {
    let n = 3;
    let timeout_s = 3;
    let started = Instant::now();
    let mut workers = start(n, mode, timeout_s);
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
    println!("{mode}: survivors failed within {took:?} (timeout {timeout_s} s)");
}

#[test]
fn a_worker_killed_amid_a_shared_memory_all_reduce_is_an_error_at_once_not_at_the_timeout() {
    if !shared_memory_available() {
        return;
    }
    let n = 3;
    let timeout_s = 60;
    let started = Instant::now();
    let mut workers = start(n, "kill-mid", timeout_s);
    let results = wait_all(&mut workers, Duration::from_secs(90));
    let took = started.elapsed();
    assert_no_segments_left(&workers);
    for (rank, (code, out)) in results[..n - 1].iter().enumerate() {
        assert_eq!(*code, 3, "rank {rank} should fail with an error:\n{out}");
        assert!(
            out.contains("LINKS shared memory") && out.contains("/job:worker/task:"),
            "rank {rank}: not over shared memory, or the error names no peer:\n{out}"
        );
    }
    // The dead process is seen within a poll (10 ms); a chain of two survivors, each
    // failing on the one before, ends far inside the 60 s timeout.
    assert!(took < Duration::from_secs(20), "took {took:?}");
    println!("survivors failed {took:?} after the start (timeout {timeout_s} s)");
}

/// A small deterministic generator (splitmix64): every rank derives the same case from the
/// seed, and each rank's values from the seed and its rank.
struct Gen(u64);

impl Gen {
    fn next(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9e37_79b9_7f4a_7c15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        z ^ (z >> 31)
    }
    fn below(&mut self, n: usize) -> usize {
        (self.next() % n as u64) as usize
    }
}

/// The tensors `rank` contributes to case `seed`: 1 to 6 tensors of random dtypes (f16,
/// bf16, f32, f64, int32, int64) and shapes (rank 0 to 3, sizes 0 to 6), in a third of the
/// cases one long f32 tensor more, and whether the case takes the mean (only when every
/// tensor is a float).
fn property_tensors(seed: u64, rank: usize) -> (Vec<(DType, Vec<usize>, HostData)>, bool) {
    let mut case = Gen(seed);
    let count = 1 + case.below(6);
    let dtypes = [
        DType::F16,
        DType::BF16,
        DType::F32,
        DType::F64,
        DType::I32,
        DType::I64,
    ];
    let layout: Vec<(DType, Vec<usize>)> = (0..count)
        .map(|_| {
            let dtype = dtypes[case.below(dtypes.len())];
            let shape = (0..case.below(4)).map(|_| case.below(7)).collect();
            (dtype, shape)
        })
        .collect();
    // Now and then a long f32 tensor (~5 MB): its all-reduce goes around the ring in
    // pipelined segments; short ones are exchanged directly.
    let mut layout = layout;
    if case.below(3) == 0 {
        layout.push((DType::F32, vec![1_200_000 + case.below(300_000)]));
    }
    let mean = case.below(2) == 1 && layout.iter().all(|(d, _)| d.is_float());
    let mut values = Gen(seed ^ (0x51_7cc1_b727_220a ^ rank as u64).wrapping_mul(0x2545_f491));
    let tensors = layout
        .into_iter()
        .map(|(dtype, shape)| {
            let len: usize = shape.iter().product();
            let data = match dtype {
                DType::I32 => HostData::I32((0..len).map(|_| values.next() as i32).collect()),
                DType::I64 => HostData::I64((0..len).map(|_| values.next() as i64).collect()),
                // Half floats: quarters in [-8, 8], whose sums over 5 ranks are exact in f16
                // and bf16 alike, so the result is checked exactly.
                DType::F16 | DType::BF16 => HostData::from_f64_slice(
                    dtype,
                    &(0..len)
                        .map(|_| values.below(65) as f64 * 0.25 - 8.0)
                        .collect::<Vec<_>>(),
                ),
                _ => HostData::from_f64_slice(
                    dtype,
                    &(0..len)
                        .map(|_| (values.next() >> 11) as f64 / (1u64 << 53) as f64 * 20.0 - 10.0)
                        .collect::<Vec<_>>(),
                ),
            };
            (dtype, shape, data)
        })
        .collect();
    (tensors, mean)
}

/// One property case on this rank: all-reduces its tensors and checks each against the
/// local reduction of every rank's tensors (f64 for floats, wrapping for ints); returns a
/// hash of the result's bits for the parent to compare across ranks.
fn property_case(group: &CollectiveGroup, seed: u64) -> u64 {
    let (rank, n) = (group.rank(), group.world_size());
    let (mine, mean) = property_tensors(seed, rank);
    let inputs: Vec<Tensor> = mine
        .iter()
        .map(|(_, shape, data)| Tensor::from_host(data.clone(), shape).unwrap())
        .collect();
    let op = if mean { ReduceOp::Mean } else { ReduceOp::Sum };
    let got = group.all_reduce(&inputs, op).expect("all_reduce");
    let all: Vec<_> = (0..n).map(|r| property_tensors(seed, r).0).collect();
    let mut bits = 0u64;
    for (i, (dtype, shape, _)) in mine.iter().enumerate() {
        assert_eq!(got[i].shape(), &shape[..], "tensor {i}: shape");
        assert_eq!(got[i].dtype(), *dtype, "tensor {i}: dtype");
        let host = got[i].to_host().unwrap();
        for b in host.to_le_bytes() {
            bits = bits.rotate_left(7) ^ b as u64;
        }
        match (&host, dtype) {
            (HostData::I32(v), _) => {
                for (j, g) in v.iter().enumerate() {
                    let want = all.iter().fold(0i32, |s, t| match &t[i].2 {
                        HostData::I32(x) => s.wrapping_add(x[j]),
                        _ => unreachable!(),
                    });
                    assert_eq!(*g, want, "tensor {i} (int32) element {j}");
                }
            }
            (HostData::I64(v), _) => {
                for (j, g) in v.iter().enumerate() {
                    let want = all.iter().fold(0i64, |s, t| match &t[i].2 {
                        HostData::I64(x) => s.wrapping_add(x[j]),
                        _ => unreachable!(),
                    });
                    assert_eq!(*g, want, "tensor {i} (int64) element {j}");
                }
            }
            _ => {
                let got = host.to_f64_vec();
                let scale = if mean { 1.0 / n as f64 } else { 1.0 };
                let tolerance = match dtype {
                    DType::F64 => 1e-12,
                    DType::F32 => 1e-5,
                    // Exact sums; the mean of quarters rounds once to the half type.
                    _ if mean => 1e-2,
                    _ => 0.0,
                };
                let inputs: Vec<Vec<f64>> = all.iter().map(|t| t[i].2.to_f64_vec()).collect();
                for (j, g) in got.iter().enumerate() {
                    let want = inputs.iter().map(|x| x[j]).sum::<f64>() * scale;
                    assert!(
                        (g - want).abs() <= tolerance * (1.0 + want.abs()),
                        "tensor {i} ({dtype}) element {j}: {g} vs {want}"
                    );
                }
            }
        }
    }
    bits
}

/// Each rank's checksum from the workers' results, failing on any worker's error or when
/// the ranks' checksums (their results' bits) differ.
fn checksums(results: &[(i32, String)], what: &str) -> Vec<String> {
    let sums: Vec<String> = results
        .iter()
        .enumerate()
        .map(|(rank, (code, out))| {
            assert_eq!(*code, 0, "{what}: rank {rank} failed:\n{out}");
            out.lines()
                .find_map(|l| l.split_once("CHECKSUM ").map(|(_, s)| s.trim().to_string()))
                .unwrap_or_else(|| panic!("{what}: rank {rank} printed no checksum:\n{out}"))
        })
        .collect();
    assert!(
        sums.iter().all(|s| *s == sums[0]),
        "{what}: the ranks' results differ: {sums:?}"
    );
    sums
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 10, failure_persistence: None, ..ProptestConfig::default() })]

    /// all_reduce over random tensor lists (dtypes, shapes with empty ones, packing) and
    /// world sizes 1 to 5 equals the local reduction, with identical bits on every task.
    #[test]
    fn ring_all_reduce_of_random_tensor_lists_equals_the_local_sum(
        workers in 1usize..=5,
        seed in any::<u64>(),
        pack in prop_oneof![Just(0usize), 1usize..64],
        grpc in any::<bool>(),
    ) {
        let mode = format!("property:{seed}:{pack}{}", if grpc { "/grpc" } else { "" });
        let mut started = start(workers, &mode, 30);
        let results = wait_all(&mut started, Duration::from_secs(120));
        checksums(&results, &format!("{workers} workers, {mode}"));
    }
}

#[cfg(not(feature = "mpi"))]
#[test]
fn mpi_without_the_mpi_feature_is_an_error_naming_it() {
    use ferroflow_distribute::CommunicationImplementation;
    println!(
        "SKIPPED: the MPI transport's tests: built without the `mpi` feature \
         (`cargo test -p ferroflow-distribute --features mpi --test collectives`; CI runs them)"
    );
    let e = group_error(CommunicationImplementation::Mpi);
    assert!(
        e.contains("`mpi` cargo feature") && e.contains("MPI"),
        "{e}"
    );
}

/// The same worker started by `mpirun` (no TF_CONFIG: the group is MPI's).
#[cfg(feature = "mpi")]
mod over_mpi {
    use super::*;
    use std::process::{Child, Stdio};

    /// `mpirun`, its process group (killed whole on drop, a failing assertion included) and
    /// the folder of its ranks' output (removed on drop).
    struct MpiRun(Child, std::path::PathBuf);

    impl Drop for MpiRun {
        fn drop(&mut self) {
            let group = format!("-{}", self.0.id());
            let _ = Command::new("kill")
                .args(["-KILL", "--", &group])
                .stderr(Stdio::null())
                .status();
            let _ = self.0.kill();
            let _ = self.0.wait();
            let _ = std::fs::remove_dir_all(&self.1);
        }
    }

    /// Whether `mpirun` is here; says SKIPPED (or fails under `FERROFLOW_REQUIRE_MPI=1`)
    /// when not.
    fn have_mpirun() -> bool {
        let found = Command::new("mpirun")
            .arg("--version")
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .status()
            .is_ok_and(|s| s.success());
        if !found {
            assert!(
                std::env::var("FERROFLOW_REQUIRE_MPI").as_deref() != Ok("1"),
                "FERROFLOW_REQUIRE_MPI=1 but mpirun is not on PATH"
            );
            println!("SKIPPED: no mpirun on PATH (Debian: apt-get install openmpi-bin)");
        }
        found
    }

    /// `mpirun -np n` of the worker in `mode`, in a process group of its own.
    fn mpirun(n: usize, mode: &str, timeout_s: u64) -> MpiRun {
        use std::os::unix::process::CommandExt;
        use std::sync::atomic::{AtomicUsize, Ordering};
        static RUNS: AtomicUsize = AtomicUsize::new(0);
        let exe = std::env::current_exe().expect("test binary");
        let out = std::env::temp_dir().join(format!(
            "ferroflow-mpirun-{}-{}",
            std::process::id(),
            RUNS.fetch_add(1, Ordering::SeqCst)
        ));
        let child = Command::new("mpirun")
            .args([
                "--allow-run-as-root",
                "--oversubscribe",
                "--output-filename",
            ])
            .arg(&out)
            .arg("-np")
            .arg(n.to_string())
            .args([
                "-x",
                "FERROFLOW_COLLECTIVE_MODE",
                "-x",
                "FERROFLOW_COLLECTIVE_TIMEOUT_S",
            ])
            .arg(&exe)
            .args([
                "--ignored",
                "--exact",
                "worker",
                "--nocapture",
                "--test-threads=1",
            ])
            .env_remove("TF_CONFIG")
            .env("FERROFLOW_COLLECTIVE_MODE", mode)
            .env("FERROFLOW_COLLECTIVE_TIMEOUT_S", timeout_s.to_string())
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .process_group(0)
            .spawn()
            .expect("start mpirun");
        MpiRun(child, out)
    }

    /// Waits for `mpirun` (bounded): its exit code, each rank's output (the files of
    /// `--output-filename`), everything `mpirun` printed, and how long it took.
    fn finish(run: &mut MpiRun, n: usize, limit: Duration) -> (i32, Vec<String>, String, Duration) {
        let start = Instant::now();
        let code = loop {
            if let Some(status) = run.0.try_wait().expect("wait") {
                break status.code().unwrap_or(-1);
            }
            assert!(
                start.elapsed() < limit,
                "mpirun still running after {limit:?}"
            );
            std::thread::sleep(Duration::from_millis(20));
        };
        let took = start.elapsed();
        let mut all = String::new();
        use std::io::Read;
        if let Some(mut s) = run.0.stdout.take() {
            let _ = s.read_to_string(&mut all);
        }
        if let Some(mut s) = run.0.stderr.take() {
            let _ = s.read_to_string(&mut all);
        }
        let ranks = (0..n)
            .map(|r| {
                ["stdout", "stderr"]
                    .iter()
                    .map(|f| {
                        std::fs::read_to_string(run.1.join(format!("1/rank.{r}/{f}")))
                            .unwrap_or_default()
                    })
                    .collect::<Vec<_>>()
                    .join("\n")
            })
            .collect();
        (code, ranks, all, took)
    }

    #[test]
    fn mpi_collectives_equal_the_local_results_with_identical_bits() {
        if !have_mpirun() {
            return;
        }
        for (n, mode) in [(1, "plain"), (2, "plain"), (3, "packed")] {
            let mut run = mpirun(n, mode, 30);
            let (code, ranks, all, _) = finish(&mut run, n, Duration::from_secs(120));
            assert_eq!(code, 0, "mpirun -np {n} ({mode}) failed:\n{all}");
            let results: Vec<(i32, String)> = ranks.into_iter().map(|o| (0, o)).collect();
            for (rank, (_, out)) in results.iter().enumerate() {
                assert!(
                    out.contains("TRANSPORT mpi"),
                    "rank {rank}: not over MPI:\n{out}"
                );
            }
            checksums(&results, &format!("mpirun -np {n} ({mode})"));
        }
    }

    #[test]
    fn a_killed_mpi_rank_ends_the_job_with_an_error_not_a_hang() {
        if !have_mpirun() {
            return;
        }
        let mut run = mpirun(3, "kill", 30);
        let (code, _, all, took) = finish(&mut run, 3, Duration::from_secs(90));
        assert_ne!(code, 0, "mpirun should fail when a rank is killed:\n{all}");
        assert!(
            !all.contains("CHECKSUM"),
            "a rank finished without the killed one:\n{all}"
        );
        println!("mpirun failed {took:?} after a rank was killed (exit {code})");
    }

    proptest! {
        #![proptest_config(ProptestConfig { cases: 6, failure_persistence: None, ..ProptestConfig::default() })]

        /// The ring's property over MPI: random tensor lists, 1 to 4 ranks.
        #[test]
        fn mpi_all_reduce_of_random_tensor_lists_equals_the_local_sum(
            n in 1usize..=4,
            seed in any::<u64>(),
        ) {
            if !have_mpirun() {
                return Ok(());
            }
            let mode = format!("property:{seed}:0");
            let mut run = mpirun(n, &mode, 30);
            let (code, ranks, all, _) = finish(&mut run, n, Duration::from_secs(120));
            prop_assert_eq!(code, 0, "mpirun -np {} ({}) failed:\n{}", n, mode, all);
            let results: Vec<(i32, String)> = ranks.into_iter().map(|o| (0, o)).collect();
            checksums(&results, &mode);
        }
    }
}

/// Where no backend offers NCCL (this suite's build has no CUDA backend), asking for it is
/// an error that names the cargo feature and the implementations that are built, never a
/// group that silently uses another transport.
#[test]
fn nccl_without_a_backend_offering_it_is_an_error_naming_the_feature() {
    use ferroflow_distribute::CommunicationImplementation;
    let e = group_error(CommunicationImplementation::Nccl);
    assert!(
        e.contains("no backend offers NCCL") && e.contains("`cuda`") && e.contains("Ring"),
        "{e}"
    );
}

/// The error of a single-worker group asked to use `implementation` (a test fails where it
/// makes a group).
fn group_error(implementation: ferroflow_distribute::CommunicationImplementation) -> String {
    ferroflow::init();
    let options = CommunicationOptions {
        implementation,
        ..CommunicationOptions::default()
    };
    let resolver = TfConfigClusterResolver::from_json("{}").unwrap();
    CollectiveGroup::new(&resolver, options)
        .err()
        .expect("an error")
        .to_string()
}
