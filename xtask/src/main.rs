//! `cargo xtask <command>`: the project's automation.
//!
//! - `ci`: the dependency direction between the crates (`deps`), format check, clippy with
//!   warnings denied, the docs with warnings denied, the
//!   README's test command, the CPU backend's tests again under `FERROFLOW_CPU_ISA=avx2` and
//!   `scalar`, the fuzz targets, then the examples (each exits non-zero when its result is
//!   wrong).
//! - `bench [kernels|autodiff|optim|keras|data|data-service|mixed|numpy|distribute|ps|profiler|function] [--rounds N] [--check]`:
//!   kernels against NumPy, a training step against
//!   TensorFlow, an Adam step against the memory-bandwidth floor, all-reduce against Open
//!   MPI, multi-worker `fit` and parameter-server training against TensorFlow's, the
//!   profiler's overhead against TensorFlow's profiler; references measured in the same run,
//!   interleaved, median of rounds; writes `bench-out/kernels.csv` and prints a markdown table.
//! - `fuzz [--mutations N] [--seed S] [TARGET..]`: the readers' fuzz targets under the
//!   stable runner (see the `ferroflow-fuzz` crate); part of `ci`.
//! - `numpy-coverage`: regenerates `NUMPY_COVERAGE.md` from the NumPy API crate's source.
//! - `gpu`: the wgpu backend on a real GPU (test suites, matmul against cuBLAS, MNIST epochs),
//!   and, built with the feature `cuda-12` or `cuda-13`, the native CUDA backend (its
//!   conformance suite, and `gpu-cuda` in a process of its own: matmul against PyTorch,
//!   the host's cost per op, MNIST `fit` in three policies), one table; `--bundle DIR`
//!   prebuilds it for machines without Rust.

mod bench;
mod bench_data;
mod bench_data_service;
mod bench_distribute;
mod bench_function;
mod bench_mixed;
mod bench_numpy;
mod bench_profiler;
mod bench_ps;
mod deps;
mod fuzz;
mod gpu;
#[cfg(any(feature = "cuda-12", feature = "cuda-13"))]
mod gpu_cuda;

use std::process::{Command, ExitCode};

fn run(cmd: &str, args: &[&str]) -> bool {
    run_with(cmd, args, &[])
}

/// [`run`] with extra environment variables.
fn run_with(cmd: &str, args: &[&str], env: &[(&str, &str)]) -> bool {
    eprintln!("xtask: {cmd} {}", args.join(" "));
    match Command::new(cmd)
        .args(args)
        .envs(env.iter().copied())
        .status()
    {
        Ok(s) => s.success(),
        Err(e) => {
            eprintln!("xtask: cannot run {cmd}: {e}");
            false
        }
    }
}

fn ci() -> bool {
    deps::run()
        && run("cargo", &["fmt", "--all", "--", "--check"])
        && run(
            "cargo",
            &[
                "clippy",
                "--workspace",
                "--all-targets",
                "--",
                "-D",
                "warnings",
            ],
        )
        && run_with(
            "cargo",
            &["doc", "--workspace", "--no-deps", "--quiet"],
            &[("RUSTDOCFLAGS", "-D warnings")],
        )
        && run("cargo", &["test", "--workspace"])
        // The CPU backend again at the instruction-set levels this machine would not pick
        // (its AVX-512 kernels' own tests skip there, so their switch is lifted).
        && ["avx2", "scalar"].iter().all(|isa| {
            run_with(
                "cargo",
                &["test", "-p", "ferroflow-cpu"],
                &[("FERROFLOW_CPU_ISA", isa), ("FERROFLOW_REQUIRE_AVX512", "0")],
            )
        })
        // The MPI transport's suite (the `mpi` feature: needs Open MPI, which .ci/run
        // installs) with its lints.
        && mpi_suite()
        // The NCCL implementation of the collectives across processes (the facade's
        // `cuda` feature), on emulated GPUs.
        && nccl_suite()
        // The GPU script's CUDA rows (`xtask gpu-cuda`), the CUDA backend against CUDA 13's
        // API and the facade registering it ahead of wgpu, which the default build leaves
        // out: compiled and linted.
        && run(
            "cargo",
            &[
                "clippy",
                "-p",
                "xtask",
                "-p",
                "ferroflow",
                "--features",
                "xtask/cuda-13,ferroflow/cuda-13,ferroflow/wgpu",
                "--all-targets",
                "--",
                "-D",
                "warnings",
            ],
        )
        // Every file reader: seeds, regressions and 100k mutations each, under a memory
        // limit (about a minute).
        && fuzz::run(&[])
        && [
            &["tensors"][..],
            &["custom_training_loop"],
            // the whole step, optimizer included, as one graph function (exits non-zero
            // below 96.5% test accuracy after 2 epochs)
            &["training_loop_from_scratch"],
            // strategy.run over two logical CPU devices (MirroredStrategy)
            &["distributed_custom_training"],
            // the NumPy API guide: exits non-zero when a result differs from NumPy's
            &["numpy_api"],
            // The main job: the MLP (exits non-zero below 97.5% test accuracy after 3
            // epochs) and the CNN (below 98.7%; about a minute here), profiled: its
            // TensorBoard logs and report are checked below.
            &["mnist", "mlp"],
            &["mnist", "cnn", "--profile"],
            // TFRecord shards → interleave → parallel map → cache → shuffle → batch →
            // prefetch → fit; exits non-zero below 97% test accuracy.
            &["data_pipeline"],
            // The tf.data service: a dispatcher and two worker processes run the pipeline's
            // augmentation for fit (exits non-zero below 95.5% test accuracy).
            &["data_service"],
        ]
        .iter()
        .all(|e| {
            let mut args = vec!["run", "--quiet", "--example"];
            args.extend_from_slice(e);
            run("cargo", &args)
        })
        // The profiled CNN's log folder read back: every event file's CRCs, every profile
        // reference (fails on a corrupt or missing file).
        && run(
            "cargo",
            &[
                "run", "--quiet", "--bin", "ferroflow", "--", "profile", "summarize",
                "target/mnist/logs/cnn",
            ],
        )
        // Distributed training as TF's tutorials do it, two worker processes started by
        // `ferroflow launch` (each exits non-zero below its accuracy goal; the launcher
        // with the first failing worker's code).
        && run(
            "cargo",
            &[
                "build", "--quiet", "--bin", "ferroflow", "--example", "multi_worker_mnist",
                "--example", "distributed_custom_training", "--example",
                "parameter_server_training",
            ],
        )
        && {
            let target = std::env::var("CARGO_TARGET_DIR").unwrap_or_else(|_| "target".into());
            let launcher = format!("{target}/debug/ferroflow");
            ["multi_worker_mnist", "distributed_custom_training"].iter().all(|e| {
                let program = format!("{target}/debug/examples/{e}");
                run(
                    &launcher,
                    &["launch", "--workers", "2", "--timeout", "600", "--", &program],
                )
            })
            // TF's parameter-server tutorial, Keras' fit and the custom loop: a chief, 2
            // workers and 2 parameter servers (exits non-zero below 95% test accuracy).
            && ["fit", "custom"].iter().all(|api| {
                let program = format!("{target}/debug/examples/parameter_server_training");
                run(
                    &launcher,
                    &[
                        "launch", "--chief", "--workers", "2", "--ps", "2", "--timeout", "600",
                        "--", &program, "--api", api,
                    ],
                )
            })
        }
        // The same programs, unchanged, started by `mpirun` (built with the `mpi` feature:
        // no TF_CONFIG, the collectives over MPI).
        && (!have_mpi()
            || run(
                "cargo",
                &[
                    "build", "--quiet", "--features", "mpi", "--example", "multi_worker_mnist",
                    "--example", "distributed_custom_training",
                ],
            ) && {
                let target = std::env::var("CARGO_TARGET_DIR").unwrap_or_else(|_| "target".into());
                ["multi_worker_mnist", "distributed_custom_training"].iter().all(|e| {
                    let program = format!("{target}/debug/examples/{e}");
                    run(
                        "mpirun",
                        &["--allow-run-as-root", "--oversubscribe", "-np", "2", &program],
                    )
                })
            })
}

/// Whether this machine can build and run the `mpi` feature (`mpicc` and `mpirun` on
/// PATH); says SKIPPED when not, and fails under `FERROFLOW_REQUIRE_MPI=1`.
fn have_mpi() -> bool {
    let found = ["mpicc", "mpirun"].iter().all(|tool| {
        Command::new(tool)
            .arg("--version")
            .stdout(std::process::Stdio::null())
            .stderr(std::process::Stdio::null())
            .status()
            .is_ok_and(|s| s.success())
    });
    if !found {
        if std::env::var("FERROFLOW_REQUIRE_MPI").as_deref() == Ok("1") {
            eprintln!("xtask: FERROFLOW_REQUIRE_MPI=1 but mpicc or mpirun is missing");
            std::process::exit(1);
        }
        eprintln!(
            "SKIPPED: the MPI transport (no mpicc/mpirun; Debian: apt-get install \
             libopenmpi-dev openmpi-bin libclang-dev)"
        );
    }
    found
}

/// The `mpi` feature's lints and the collectives suite over MPI, where MPI is installed.
fn mpi_suite() -> bool {
    !have_mpi()
        || run(
            "cargo",
            &[
                "clippy",
                "-p",
                "ferroflow-distribute",
                "--features",
                "mpi",
                "--all-targets",
                "--",
                "-D",
                "warnings",
            ],
        ) && run(
            "cargo",
            &[
                "test",
                "-p",
                "ferroflow-distribute",
                "--features",
                "mpi",
                "--test",
                "collectives",
            ],
        )
}

/// The collectives' NCCL path across processes (the facade's `cuda` feature, whose
/// backend offers NCCL), with its lints: worker processes on the CUDA backend's host
/// emulation, whose stand-in for NCCL carries their collectives.
fn nccl_suite() -> bool {
    ["clippy", "test"].iter().all(|command| {
        let mut args = vec![*command, "-p", "ferroflow", "--features", "cuda"];
        args.extend_from_slice(match *command {
            "clippy" => &["--tests", "--", "-D", "warnings"][..],
            _ => &["--test", "nccl_collectives"],
        });
        run("cargo", &args)
    })
}

fn main() -> ExitCode {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let ok = match args.first().map(String::as_str) {
        Some("ci") => ci(),
        Some("deps") => deps::run(),
        Some("bench") => bench::run(&args[1..]),
        Some("gpu") => gpu::run(&args[1..]),
        #[cfg(any(feature = "cuda-12", feature = "cuda-13"))]
        Some("gpu-cuda") => gpu_cuda::run(&args[1..]),
        Some("fuzz") => fuzz::run(&args[1..]),
        Some("numpy-coverage") => {
            std::env::set_var("FERROFLOW_UPDATE_COVERAGE", "1");
            run(
                "cargo",
                &["test", "-p", "ferroflow-numpy", "--test", "coverage"],
            )
        }
        _ => {
            eprintln!(
                "usage: cargo xtask ci | cargo xtask bench [kernels|autodiff|optim|keras|data|data-service|mixed|numpy|distribute|ps|profiler|function] [--rounds N] [--check] | cargo xtask gpu [--sizes N,..] [--bundle DIR | --prebuilt DIR] | cargo xtask fuzz [--mutations N] [--seed S] [TARGET..] | cargo xtask numpy-coverage"
            );
            false
        }
    };
    if ok {
        ExitCode::SUCCESS
    } else {
        ExitCode::FAILURE
    }
}
