//! The `Nccl` implementation of the collectives across real processes (the facade's `cuda`
//! feature: `cargo test --features cuda --test nccl_collectives`).
//! Each worker serves `/GPU:0` with the CUDA backend's host emulation, whose stand-in for
//! NCCL is a hub in the chief's process that every rank reaches over loopback TCP
//! (`ferroflow::cuda::nccl`, registered as the backend's device collectives): the group's NCCL path runs for real across processes (the
//! chief's id sent over the gRPC ring, every rank joining, GPU tensors all-reduced,
//! gathered and broadcast through the communicator, host tensors left to the ring), and a
//! rank that dies fails the others' next collective. NCCL itself needs GPUs; the GPU suite
//! runs it (`ferroflow-cuda`'s `tests/conformance.rs`).

#[path = "../distribute/tests/common/mod.rs"]
mod common;

use common::{field, start_workers, training, wait_all, SpanTransports};
use ferroflow::cluster::TfConfigClusterResolver;
use ferroflow::distribute::{
    CollectiveGroup, CommunicationImplementation, CommunicationOptions, CrossDeviceOps,
    MirroredStrategy, MultiWorkerMirroredStrategy, ReduceOp, Strategy,
};
use ferroflow::{DType, Device, Tensor};
use std::sync::Arc;
use std::time::{Duration, Instant};

/// Worker `rank`'s float32 contribution (its index in the values, then its rank).
fn floats(rank: usize) -> Vec<f32> {
    (0..120)
        .map(|i| ((i as f64 * 0.37 + rank as f64 * 1.3).sin()) as f32)
        .collect()
}

fn longs(rank: usize) -> Vec<i64> {
    (0..7).map(|i| i * 1_000_000_007 + rank as i64).collect()
}

fn doubles(rank: usize) -> Vec<f64> {
    (0..15)
        .map(|i| i as f64 * 0.5 - rank as f64 * 2.25)
        .collect()
}

/// Exits the worker with `code` after printing `what`.
fn fail(what: String) -> ! {
    println!("FAILED {what}");
    std::process::exit(2);
}

/// The worker: all-reduces, gathers and broadcasts tensors on the emulated GPU through the
/// group's NCCL communicator and checks each result against the sums of every rank's
/// contribution computed here; exits 0 when every one is right. In `die` mode the last
/// rank leaves after the first all-reduce and the others must fail naming a rank.
#[test]
#[ignore = "a worker process, started by the tests below"]
fn worker() {
    // Two emulated devices (MirroredStrategy's mode uses both; the others /GPU:0).
    if let Err(e) = ferroflow::cuda::emulation::register_devices(2) {
        fail(format!("the CUDA emulation: {e}"));
    }
    ferroflow::init();
    let mode = std::env::var("FERROFLOW_NCCL_MODE").expect("started by a test");
    let timeout = Duration::from_secs(
        std::env::var("FERROFLOW_NCCL_TIMEOUT_S")
            .ok()
            .and_then(|s| s.parse().ok())
            .unwrap_or(30),
    );
    let resolver = TfConfigClusterResolver::from_env().expect("TF_CONFIG");
    let options = CommunicationOptions {
        implementation: CommunicationImplementation::Nccl,
        timeout,
        ..CommunicationOptions::default()
    };
    if mode == "fit" {
        fit_worker(&resolver, options);
        return;
    }
    if mode == "mirrored" {
        mirrored_worker();
        return;
    }
    let group = CollectiveGroup::new(&resolver, options).expect("group");
    let (rank, n) = (group.rank(), group.world_size());
    let gpu = Device::gpu(0);
    let on_gpu = |t: Tensor| t.to_device(gpu).expect("to the GPU");
    let spans = Arc::new(SpanTransports::default());
    let sink = ferroflow::trace::install_sink(spans.clone());

    let a = on_gpu(Tensor::from_vec(floats(rank), &[12, 10]).unwrap());
    let b = on_gpu(Tensor::from_vec(doubles(rank), &[3, 5]).unwrap());
    let c = on_gpu(Tensor::from_vec(longs(rank), &[7]).unwrap());
    // A transposed view (not dense: NCCL gets a dense copy) and a bfloat16 tensor.
    let at = a.transpose(&[1, 0]).unwrap();
    let half = a.cast(DType::BF16).unwrap();
    let sums = match group.all_reduce(&[a.clone(), b, c, at, half], ReduceOp::Sum) {
        Ok(s) => s,
        Err(e) => fail(format!("all_reduce: {e}")),
    };
    if mode == "die" && rank == n - 1 {
        println!("LEAVING");
        std::process::exit(0);
    }
    if mode == "die" {
        let started = Instant::now();
        match group.all_reduce(std::slice::from_ref(&a), ReduceOp::Sum) {
            Ok(_) => fail("an all-reduce without the last rank succeeded".into()),
            Err(e) => {
                println!("ERROR after {:?}: {e}", started.elapsed());
                std::process::exit(3);
            }
        }
    }
    for s in &sums {
        if s.device() != gpu {
            fail(format!("a result on {}", s.device()));
        }
    }
    let every = |f: fn(usize) -> Vec<f64>| -> Vec<f64> {
        let parts: Vec<Vec<f64>> = (0..n).map(f).collect();
        (0..parts[0].len())
            .map(|i| parts.iter().map(|p| p[i]).sum())
            .collect()
    };
    let float_sums = every(|r| floats(r).iter().map(|&v| v as f64).collect());
    // The stand-in sums in float64 and rounds once, so float32 results are exact.
    let want_a: Vec<f32> = float_sums.iter().map(|&v| v as f32).collect();
    let got_a = sums[0].to_vec::<f32>().unwrap();
    if got_a != want_a {
        fail(format!(
            "float32 sums {:?} != {:?}",
            &got_a[..4],
            &want_a[..4]
        ));
    }
    if sums[1].to_vec::<f64>().unwrap() != every(doubles) {
        fail("float64 sums".into());
    }
    let want_c: Vec<i64> = (0..7).map(|i| (0..n).map(|r| longs(r)[i]).sum()).collect();
    if sums[2].to_vec::<i64>().unwrap() != want_c {
        fail("int64 sums".into());
    }
    let transposed = sums[3].transpose(&[1, 0]).unwrap().to_vec::<f32>().unwrap();
    if transposed != want_a {
        fail("the transposed view's sums".into());
    }
    // bfloat16: each rank's value rounded, summed, rounded again.
    let want_half: Vec<f64> = (0..120)
        .map(|i| {
            let s: f64 = (0..n)
                .map(|r| ferroflow::bf16::from_f32(floats(r)[i]).to_f64())
                .sum();
            ferroflow::bf16::from_f64(s).to_f64()
        })
        .collect();
    if sums[4].dtype() != DType::BF16 || sums[4].to_f64_vec().unwrap() != want_half {
        fail("bfloat16 sums".into());
    }
    let means = group
        .all_reduce(std::slice::from_ref(&a), ReduceOp::Mean)
        .unwrap_or_else(|e| fail(format!("mean: {e}")));
    let want_mean: Vec<f32> = float_sums.iter().map(|&v| (v / n as f64) as f32).collect();
    if means[0].to_vec::<f32>().unwrap() != want_mean {
        fail("float32 means".into());
    }
    let mine = on_gpu(Tensor::from_vec(longs(rank), &[1, 7]).unwrap());
    let gathered = group
        .all_gather(&mine)
        .unwrap_or_else(|e| fail(format!("all_gather: {e}")));
    let want_gathered: Vec<i64> = (0..n).flat_map(longs).collect();
    if gathered.shape() != [n, 7] || gathered.to_vec::<i64>().unwrap() != want_gathered {
        fail(format!("all_gather: {:?}", gathered.shape()));
    }
    let root = n - 1;
    let sent = group
        .broadcast(
            &on_gpu(Tensor::from_vec(doubles(rank), &[15]).unwrap()),
            root,
        )
        .unwrap_or_else(|e| fail(format!("broadcast: {e}")));
    if sent.to_vec::<f64>().unwrap() != doubles(root) {
        fail("broadcast".into());
    }
    // Host tensors take the ring in the same group.
    let host = Tensor::from_vec(doubles(rank), &[15]).unwrap();
    let host_sum = group
        .all_reduce(&[host], ReduceOp::Sum)
        .unwrap_or_else(|e| fail(format!("host all_reduce: {e}")));
    if host_sum[0].device() != Device::parse("/CPU:0").unwrap()
        || host_sum[0].to_vec::<f64>().unwrap() != every(doubles)
    {
        fail("host all_reduce".into());
    }
    drop(sink);
    spans.print();
    println!("OK rank {rank} of {n}");
}

/// `fit` mode: Keras' `fit` under MultiWorkerMirroredStrategy with NCCL, the replicas on
/// the emulated GPU: prints the trained weights, their device and the collectives'
/// transports.
fn fit_worker(resolver: &TfConfigClusterResolver, options: CommunicationOptions) {
    let strategy = MultiWorkerMirroredStrategy::with_resolver(resolver, options)
        .unwrap_or_else(|e| fail(format!("the strategy: {e}")));
    let spans = Arc::new(SpanTransports::default());
    let sink = ferroflow::trace::install_sink(spans.clone());
    // Only the chief's seed matches the single-process reference: the others' initial
    // weights and shuffle seed must come from the chief.
    ferroflow::random::set_seed(3 + strategy.worker_index() as u64);
    let mut m = {
        let _scope = strategy.scope();
        training::model()
    };
    let w = training::train(&mut m);
    drop(sink);
    println!("WEIGHTS {}", training::f32_hex(&w));
    println!("DEVICE {}", m.weights()[0].peek().device());
    spans.print();
}

/// `mirrored` mode: Keras' `fit` under MirroredStrategy over the two emulated GPUs with
/// `NcclAllReduce`: prints the trained weights and the collectives' transports.
fn mirrored_worker() {
    let strategy = MirroredStrategy::with_cross_device_ops(
        &["/GPU:0", "/GPU:1"],
        CrossDeviceOps::NcclAllReduce,
    )
    .unwrap_or_else(|e| fail(format!("the strategy: {e}")));
    let spans = Arc::new(SpanTransports::default());
    let sink = ferroflow::trace::install_sink(spans.clone());
    ferroflow::random::set_seed(3);
    let mut m = {
        let _scope = strategy.scope();
        training::model()
    };
    let w = training::train(&mut m);
    drop(sink);
    println!("WEIGHTS {}", training::f32_hex(&w));
    spans.print();
}

fn run(n: usize, mode: &str, timeout_s: u64, limit: Duration) -> Vec<(i32, String)> {
    let mut workers = start_workers(
        n,
        &[
            ("FERROFLOW_NCCL_MODE", mode.to_string()),
            ("FERROFLOW_NCCL_TIMEOUT_S", timeout_s.to_string()),
        ],
    );
    wait_all(&mut workers, limit)
}

/// Whether the emulation runs here (a C++ compiler), else one loud line (a failure when
/// `FERROFLOW_REQUIRE_CXX=1`, as in CI).
fn emulation_runs() -> bool {
    if ferroflow::cuda::emulation::available() {
        return true;
    }
    ferroflow::testing::skip(
        "FERROFLOW_REQUIRE_CXX",
        "no C++ compiler runs (set CXX, or install g++): the NCCL collectives were not checked \
         on the CUDA emulation",
    );
    false
}

/// Three workers' GPU tensors go through NCCL (their profiler spans say so), host tensors
/// through the ring, and every result is right on every worker.
#[test]
fn gpu_tensors_are_reduced_gathered_and_broadcast_through_nccl() {
    if !emulation_runs() {
        return;
    }
    let results = run(3, "collectives", 60, Duration::from_secs(600));
    for (rank, (code, out)) in results.iter().enumerate() {
        assert_eq!(*code, 0, "worker {rank} failed:\n{out}");
        let transports: Vec<&str> = field(out, "TRANSPORTS").split(',').collect();
        // all_reduce, mean, all_gather, broadcast on the GPU; then the host's all-reduce.
        assert_eq!(transports.len(), 5, "worker {rank}: {transports:?}");
        assert!(
            transports[..4].iter().all(|t| *t == "nccl"),
            "worker {rank}: {transports:?}"
        );
        assert_ne!(transports[4], "nccl", "worker {rank}: {transports:?}");
    }
}

/// A rank that leaves fails the others' next NCCL collective with an error naming a rank,
/// well within the collective timeout's bound: never a hang.
#[test]
fn a_rank_that_leaves_fails_the_others_next_collective() {
    if !emulation_runs() {
        return;
    }
    let started = Instant::now();
    let results = run(3, "die", 20, Duration::from_secs(600));
    let (code, out) = &results[2];
    assert!(
        *code == 0 && out.contains("LEAVING"),
        "the last worker:\n{out}"
    );
    for (rank, (code, out)) in results[..2].iter().enumerate() {
        assert_eq!(*code, 3, "worker {rank} should fail its collective:\n{out}");
        assert!(
            out.contains("ERROR") && out.contains("rank 2"),
            "worker {rank}:\n{out}"
        );
    }
    println!("three workers, one leaving: {:?}", started.elapsed());
}

/// Two workers training with `fit` under MultiWorkerMirroredStrategy through NCCL (the
/// replicas and variables on the emulated GPU, the chief's initial weights broadcast and
/// every step's gradients all-reduced by the communicator) end with bit-identical weights,
/// those of one process training with the global batch on the CPU.
#[test]
fn multi_worker_fit_through_nccl_matches_one_process() {
    if !emulation_runs() {
        return;
    }
    let reference = training::reference_weights();
    let results = run(2, "fit", 120, Duration::from_secs(900));
    let mut weights = vec![];
    for (rank, (code, out)) in results.iter().enumerate() {
        assert_eq!(*code, 0, "worker {rank} failed:\n{out}");
        assert_eq!(field(out, "DEVICE"), "/device:GPU:0", "worker {rank}");
        assert_steps_went_through_nccl(field(out, "TRANSPORTS"));
        weights.push(training::from_hex(field(out, "WEIGHTS")));
    }
    assert_eq!(
        training::f32_hex(&weights[1]),
        training::f32_hex(&weights[0]),
        "the workers' weights differ"
    );
    let worst = training::max_difference(&weights[0], &reference);
    assert!(
        worst < 1e-4,
        "two workers vs one process: max difference {worst}"
    );
}

/// That at least one collective per training step went through NCCL (`transports`: the
/// comma-separated transports of a worker's collectives).
fn assert_steps_went_through_nccl(transports: &str) {
    assert!(
        transports.split(',').filter(|t| *t == "nccl").count() >= training::STEPS,
        "the steps' gradients did not all go through NCCL: {transports}"
    );
}

/// MirroredStrategy over two GPUs with `NcclAllReduce` (emulated devices, NCCL's stand-in):
/// `fit` sums each step's gradients of the two replicas through one NCCL all-reduce and ends
/// with the weights of one device training with the global batch.
#[test]
fn mirrored_fit_over_two_gpus_through_nccl_matches_one_device() {
    if !emulation_runs() {
        return;
    }
    let reference = training::reference_weights();
    let results = run(1, "mirrored", 120, Duration::from_secs(900));
    let (code, out) = &results[0];
    assert_eq!(*code, 0, "the process failed:\n{out}");
    assert_steps_went_through_nccl(field(out, "TRANSPORTS"));
    let weights = training::from_hex(field(out, "WEIGHTS"));
    let worst = training::max_difference(&weights, &reference);
    assert!(
        worst < 1e-4,
        "two GPUs vs one device: max difference {worst}"
    );
}
