//! `cargo xtask bench distribute`: the collectives and multi-worker `fit`, every side
//! measured in the same run, rounds interleaved, medians of the rounds:
//!
//! - all-reduce bus bandwidth of 4 local processes, 1 MB to 256 MB (one f32 tensor; bus
//!   bandwidth = 2(n-1)/n × bytes / time, as nccl-tests report it): our ring (started by
//!   `ferroflow launch`) over shared memory and over gRPC, and our MPI path (`mpirun`),
//!   against Open MPI's own `MPI_Allreduce` (`bench/mpi_allreduce.c`, compiled here with
//!   mpicc) over its shared-memory transport and over TCP (`--mca btl tcp,self`, the
//!   like-for-like reference of the gRPC ring);
//! - Keras `fit` of the MNIST MLP (batch 64 per worker): 2 local workers over the ring (shared
//!   memory, gRPC) and over MPI against our single process at the same global batch, against TensorFlow's
//!   MultiWorkerMirroredStrategy on 2 local workers (`bench/tf_mwms_mnist.py`, where
//!   TensorFlow imports), and `MultiWorkerMirroredStrategy` with 1 worker against no strategy.
//!
//! The workers are `distribute/examples/collective_bench.rs`, built with the `mpi` feature
//! where mpicc is (the MPI columns are left out, saying so, where it is not).

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::Command;

use crate::bench::Figures;

const SIZES_MB: [usize; 5] = [1, 4, 16, 64, 256];
const RANKS: usize = 4;
const REPEATS: &str = "5";

pub(crate) fn median(v: &[f64]) -> Option<f64> {
    let mut v = v.to_vec();
    v.sort_by(f64::total_cmp);
    v.get(v.len() / 2).copied()
}

/// The `NAME BYTES SECONDS` / `NAME VALUE` lines a worker printed, by key (`allreduce
/// 1048576`, `fit`), from the output of `cmd`; `None` (said) when it failed.
pub(crate) fn figures_of(cmd: &mut Command, what: &str) -> Option<BTreeMap<String, f64>> {
    let out = cmd.output().ok()?;
    let text = String::from_utf8_lossy(&out.stdout);
    if !out.status.success() {
        eprintln!(
            "xtask bench distribute: {what} failed:\n{text}\n{}",
            String::from_utf8_lossy(&out.stderr)
        );
        return None;
    }
    let mut figures = BTreeMap::new();
    for line in text.lines() {
        // `ferroflow launch` prefixes each line with the task's name.
        let line = line.split_once("] ").map_or(line, |(_, l)| l);
        let words: Vec<&str> = line.split_whitespace().collect();
        match words[..] {
            ["allreduce", bytes, secs] => {
                figures.insert(format!("allreduce {bytes}"), secs.parse().ok()?);
            }
            [name, value] if name.starts_with("ps_") || name.starts_with("ds_") => {
                figures.insert(name.to_string(), value.parse().ok()?);
            }
            [name @ ("fit" | "fit_tf"), value] => {
                figures.insert(name.to_string(), value.parse().ok()?);
            }
            _ => {}
        }
    }
    Some(figures)
}

fn mpirun(np: usize, program: &Path) -> Command {
    mpirun_with(&[], np, program)
}

/// [`mpirun`] with Open MPI's byte transfer kept to TCP (no shared memory).
fn mpirun_tcp(np: usize, program: &Path) -> Command {
    mpirun_with(&["--mca", "btl", "tcp,self"], np, program)
}

/// `mpirun` of `np` ranks of `program` with `options` of its own.
fn mpirun_with(options: &[&str], np: usize, program: &Path) -> Command {
    let mut c = Command::new("mpirun");
    c.args(["--allow-run-as-root", "--oversubscribe"])
        .args(options)
        .args(["-np", &np.to_string()])
        .arg(program);
    c
}

fn launch(launcher: &Path, workers: usize, program: &[&str]) -> Command {
    launch_job(launcher, &["--workers", &workers.to_string()], program)
}

/// `ferroflow launch` of `program` with the job's tasks given by `tasks` (`--workers N`,
/// `--chief`, `--ps M`).
pub(crate) fn launch_job(launcher: &Path, tasks: &[&str], program: &[&str]) -> Command {
    let mut c = Command::new(launcher);
    c.arg("launch")
        .args(tasks)
        .args(["--timeout", "900", "--"])
        .args(program);
    c
}

/// Builds the release `ferroflow` binary (servers, the launcher) and `example` of `package`
/// (with `features`): their paths, or `None` when either does not build.
pub(crate) fn build_release_bench(
    package: &str,
    example: &str,
    features: &[&str],
) -> Option<(PathBuf, PathBuf)> {
    let target =
        PathBuf::from(std::env::var("CARGO_TARGET_DIR").unwrap_or_else(|_| "target".into()));
    let mut example_build = vec![
        "build",
        "--quiet",
        "--release",
        "-p",
        package,
        "--example",
        example,
    ];
    if !features.is_empty() {
        example_build.push("--features");
        example_build.extend(features);
    }
    let built = crate::run(
        "cargo",
        &[
            "build",
            "--quiet",
            "--release",
            "--bin",
            "ferroflow",
            "-p",
            "ferroflow",
        ],
    ) && crate::run("cargo", &example_build);
    built.then(|| {
        (
            target.join("release/ferroflow"),
            target.join("release/examples").join(example),
        )
    })
}

pub(crate) fn run(rounds: usize, has_tf: bool, figures: &mut Figures) -> String {
    let target =
        PathBuf::from(std::env::var("CARGO_TARGET_DIR").unwrap_or_else(|_| "target".into()));
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("..");
    let have_mpi = crate::have_mpi();
    let features: &[&str] = if have_mpi { &["mpi"] } else { &[] };
    let Some((launcher, worker)) =
        build_release_bench("ferroflow-distribute", "collective_bench", features)
    else {
        return "distribute: the launcher or the benchmark worker did not build\n".into();
    };
    let worker_s = worker.to_string_lossy().to_string();
    let reference = target.join("release/mpi_allreduce");
    let have_reference = have_mpi
        && crate::run(
            "mpicc",
            &[
                "-O2",
                "-o",
                &reference.to_string_lossy(),
                &root.join("xtask/bench/mpi_allreduce.c").to_string_lossy(),
            ],
        );
    let sizes = SIZES_MB.map(|s| s.to_string()).join(",");
    let mnist = crate::bench::mnist_dir().to_string_lossy().to_string();
    let tf_script = root
        .join("xtask/bench/tf_mwms_mnist.py")
        .to_string_lossy()
        .to_string();
    // series name → per-round values (seconds for all-reduce keys, samples/s for fit)
    let mut series: BTreeMap<String, Vec<f64>> = BTreeMap::new();
    let mut add = |prefix: &str, found: Option<BTreeMap<String, f64>>| {
        for (k, v) in found.unwrap_or_default() {
            series.entry(format!("{prefix} {k}")).or_default().push(v);
        }
    };
    for r in 0..rounds {
        eprintln!("xtask bench distribute: round {}/{rounds}", r + 1);
        if have_reference {
            add(
                "openmpi",
                figures_of(
                    mpirun(RANKS, &reference).args([&sizes, REPEATS]),
                    "MPI_Allreduce",
                ),
            );
            add(
                "openmpi-tcp",
                figures_of(
                    mpirun_tcp(RANKS, &reference).args([&sizes, REPEATS]),
                    "MPI_Allreduce over TCP",
                ),
            );
        }
        if have_mpi {
            add(
                "mpi",
                figures_of(
                    mpirun(RANKS, &worker).args(["allreduce", &sizes, REPEATS]),
                    "MPI all-reduce",
                ),
            );
        }
        add(
            "ring",
            figures_of(
                &mut launch(&launcher, RANKS, &[&worker_s, "allreduce", &sizes, REPEATS]),
                "ring all-reduce",
            ),
        );
        add(
            "ring-grpc",
            figures_of(
                &mut launch(
                    &launcher,
                    RANKS,
                    &[&worker_s, "allreduce", &sizes, REPEATS, "grpc"],
                ),
                "ring all-reduce over gRPC",
            ),
        );
        add(
            "single",
            figures_of(
                Command::new(&worker).args(["fit", "none", &mnist, "128"]),
                "fit, one process",
            ),
        );
        add(
            "mwms1",
            figures_of(
                Command::new(&worker).args(["fit", "mwms", &mnist, "128"]),
                "fit, 1 worker",
            ),
        );
        add(
            "ring2",
            figures_of(
                &mut launch(&launcher, 2, &[&worker_s, "fit", "mwms", &mnist, "64"]),
                "fit, 2 workers (ring)",
            ),
        );
        add(
            "ring2-grpc",
            figures_of(
                &mut launch(
                    &launcher,
                    2,
                    &[&worker_s, "fit", "mwms", &mnist, "64", "grpc"],
                ),
                "fit, 2 workers (ring over gRPC)",
            ),
        );
        if have_mpi {
            add(
                "mpi2",
                figures_of(
                    mpirun(2, &worker).args(["fit", "mwms", &mnist, "64"]),
                    "fit, 2 workers (MPI)",
                ),
            );
        }
        if has_tf {
            add(
                "tf2",
                figures_of(
                    // TensorFlow binds its TF_CONFIG port itself.
                    &mut launch_job(
                        &launcher,
                        &["--workers", "2", "--release-ports"],
                        &["python3", &tf_script, &mnist, "64"],
                    ),
                    "TensorFlow MWMS fit",
                ),
            );
        }
    }
    let get = |k: &str| series.get(k).and_then(|v| median(v));
    let mut md = format!(
        "\n### Distributed ({RANKS} local processes for all-reduce, 2 for fit; {rounds} rounds, medians)\n\n\
         | all-reduce | Open MPI bus GB/s | Open MPI over TCP | ours over MPI | our ring, shared memory | our ring, gRPC | MPI path / Open MPI | ring (shared memory) / Open MPI | ring (gRPC) / Open MPI over TCP |\n\
         |---|---|---|---|---|---|---|---|---|\n"
    );
    let bus = |secs: Option<f64>, bytes: f64| {
        secs.map(|s| 2.0 * (RANKS as f64 - 1.0) / RANKS as f64 * bytes / s / 1e9)
    };
    let cell = |v: Option<f64>| v.map_or("n/a".to_string(), |v| format!("{v:.2}"));
    for mb in SIZES_MB {
        let bytes = (mb << 20) as f64;
        let key = |side: &str| format!("{side} allreduce {}", mb << 20);
        let (reference, reference_tcp, mpi, ring, ring_grpc) = (
            bus(get(&key("openmpi")), bytes),
            bus(get(&key("openmpi-tcp")), bytes),
            bus(get(&key("mpi")), bytes),
            bus(get(&key("ring")), bytes),
            bus(get(&key("ring-grpc")), bytes),
        );
        let ratio = |a: Option<f64>, b: Option<f64>| a.zip(b).map(|(a, b)| a / b);
        if let Some(v) = ratio(ring, reference) {
            figures.insert(format!("allreduce_ring_vs_mpi_{mb}MB"), v);
        }
        if let Some(v) = ratio(ring_grpc, reference_tcp) {
            figures.insert(format!("allreduce_ring_grpc_vs_mpi_tcp_{mb}MB"), v);
        }
        if let Some(v) = ratio(mpi, reference) {
            figures.insert(format!("allreduce_mpi_path_vs_mpi_{mb}MB"), v);
        }
        md.push_str(&format!(
            "| {mb} MB | {} | {} | {} | {} | {} | {} | {} | {} |\n",
            cell(reference),
            cell(reference_tcp),
            cell(mpi),
            cell(ring),
            cell(ring_grpc),
            cell(ratio(mpi, reference)),
            cell(ratio(ring, reference)),
            cell(ratio(ring_grpc, reference_tcp))
        ));
    }
    let single = get("single fit");
    md.push_str(
        "\n| MNIST MLP fit, batch 64 per worker | samples/s | vs our single process (batch 128) |\n|---|---|---|\n",
    );
    for (label, key) in [
        ("ours, one process, no strategy", "single fit"),
        ("ours, MultiWorkerMirrored, 1 worker", "mwms1 fit"),
        ("ours, 2 workers, ring over shared memory", "ring2 fit"),
        ("ours, 2 workers, ring over gRPC", "ring2-grpc fit"),
        ("ours, 2 workers, MPI", "mpi2 fit"),
        ("TensorFlow MultiWorkerMirrored, 2 workers", "tf2 fit_tf"),
    ] {
        let v = get(key);
        md.push_str(&format!(
            "| {label} | {} | {} |\n",
            v.map_or("n/a".into(), |v| format!("{v:.0}")),
            cell(v.zip(single).map(|(v, s)| v / s))
        ));
    }
    if let (Some(ring2), Some(s)) = (get("ring2 fit"), single) {
        figures.insert("fit_2_workers_vs_single".into(), ring2 / s);
    }
    if let (Some(one), Some(s)) = (get("mwms1 fit"), single) {
        figures.insert("mwms_1_worker_overhead".into(), s / one - 1.0);
    }
    if let (Some(ring2), Some(tf)) = (get("ring2 fit"), get("tf2 fit_tf")) {
        figures.insert("fit_2_workers_vs_tf".into(), ring2 / tf);
        md.push_str(&format!(
            "\n2 workers, ours over TensorFlow's: {:.1}×\n",
            ring2 / tf
        ));
    }
    if !has_tf {
        md.push_str(
            "\n(TensorFlow is not importable: `pip install tensorflow-cpu` for its column.)\n",
        );
    }
    if !have_mpi {
        md.push_str("\n(No mpicc/mpirun: the MPI columns need Open MPI.)\n");
    }
    md
}
