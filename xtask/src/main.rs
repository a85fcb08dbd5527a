//! `cargo xtask <command>`: the project's automation.
//!
//! - `ci`: the dependency direction between the crates (`deps`), format check, clippy with
//!   warnings denied, the docs with warnings denied, the
//!   README's test command, the CPU backend's tests again under `FERROFLOW_CPU_ISA=avx2` and
//!   `scalar`, the MPI and NCCL suites, the fuzz targets, then the examples (each exits
//!   non-zero when its result is wrong). Every cargo command names the whole workspace and
//!   the programs run after the tests are those the test build made (`built`), so each
//!   crate compiles once per feature set.
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
mod built;
mod deps;
mod fuzz;
mod gpu;
#[cfg(any(feature = "cuda-12", feature = "cuda-13"))]
mod gpu_cuda;

use std::path::Path;
use std::process::{Command, ExitCode};
use std::time::Instant;

use built::Executable;

fn run(cmd: &str, args: &[&str]) -> bool {
    run_with(cmd, args, &[])
}

/// [`run`] with extra environment variables.
fn run_with(cmd: &str, args: &[&str], env: &[(&str, &str)]) -> bool {
    run_in(Path::new(cmd), args, env, None)
}

/// Runs `program` (in `dir` when given) with its output shown, says how long it took;
/// whether it exited successfully.
fn run_in(program: &Path, args: &[&str], env: &[(&str, &str)], dir: Option<&Path>) -> bool {
    eprintln!("xtask: {} {}", program.display(), args.join(" "));
    let started = Instant::now();
    let mut command = Command::new(program);
    command.args(args).envs(env.iter().copied());
    if let Some(dir) = dir {
        command.current_dir(dir);
    }
    let ok = match command.status() {
        Ok(s) => s.success(),
        Err(e) => {
            eprintln!("xtask: cannot run {}: {e}", program.display());
            false
        }
    };
    let name = program.file_name().unwrap_or_default().to_string_lossy();
    said_how_long(&name, args, ok, started)
}

/// Says on stderr that `program` (named with its first argument, `cargo test`) is done or
/// failed, and in how long; returns `ok`.
fn said_how_long(program: &str, args: &[&str], ok: bool, started: Instant) -> bool {
    let named = match args.first() {
        Some(first) => format!("{program} {first}"),
        None => program.to_string(),
    };
    let outcome = if ok { "done" } else { "FAILED" };
    let seconds = started.elapsed().as_secs_f64();
    eprintln!("xtask: {named} {outcome} in {seconds:.0} s");
    ok
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
        // What that built (nothing is compiled again): the runs below take their programs
        // from it (see `built`: a `-p` would build every crate below it once more).
        && built::cargo_executables(&["test", "--workspace", "--no-run"])
            .is_some_and(|built| after_the_tests(&built))
}

/// CI's steps after the README's test command, given what it built.
fn after_the_tests(built: &[Executable]) -> bool {
    cpu_tests_at_other_isas(built)
        // The MPI transport's suite (the `mpi` feature: needs Open MPI, which .ci/run
        // installs) with its lints.
        && mpi_suite()
        // The NCCL implementation of the collectives across processes (the facade's
        // `cuda` feature), on emulated GPUs.
        && nccl_suite()
        // The GPU script's CUDA rows (`xtask gpu-cuda`), the CUDA backend against CUDA 13's
        // API and the facade registering it ahead of wgpu, which the default build leaves
        // out: compiled and linted (the CUDA crate not named, so that its default, CUDA 12,
        // stays off; the library is linted as the others' dependency).
        && run(
            "cargo",
            &[
                "clippy",
                "--workspace",
                "--exclude",
                "ferroflow-cuda",
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
        && examples(built)
        && launched_examples(built)
        && examples_under_mpirun()
}

/// The CPU backend's tests again at the instruction-set levels this machine would not pick
/// (its AVX-512 kernels' own tests skip there, so their switch is lifted).
fn cpu_tests_at_other_isas(built: &[Executable]) -> bool {
    let tests: Vec<&Executable> = built
        .iter()
        .filter(|e| e.package == "ferroflow-cpu" && e.test)
        .collect();
    if tests.is_empty() {
        eprintln!("xtask: the test build made no test of ferroflow-cpu");
        return false;
    }
    ["avx2", "scalar"].iter().all(|isa| {
        tests.iter().all(|test| {
            let env = [
                ("FERROFLOW_CPU_ISA", *isa),
                ("FERROFLOW_REQUIRE_AVX512", "0"),
            ];
            run_in(&test.path, &[], &env, Some(&test.package_dir))
        })
    })
}

/// The facade's examples, each exiting non-zero when its result is wrong.
fn examples(built: &[Executable]) -> bool {
    [
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
        built::find(built, "ferroflow", "example", e[0])
            .is_some_and(|example| run_in(&example.path, &e[1..], &[], None))
    })
}

/// The profiled CNN's logs read back, and distributed training as TF's tutorials do it:
/// worker processes started by `ferroflow launch`.
fn launched_examples(built: &[Executable]) -> bool {
    let Some(launcher) = built::find(built, "ferroflow", "bin", "ferroflow") else {
        return false;
    };
    let launch = |example: &str, options: &[&str], program_args: &[&str]| {
        built::find(built, "ferroflow", "example", example).is_some_and(|program| {
            let program = program.path.to_string_lossy();
            let mut args = vec!["launch"];
            args.extend_from_slice(options);
            args.extend_from_slice(&["--timeout", "600", "--", &program]);
            args.extend_from_slice(program_args);
            run_in(&launcher.path, &args, &[], None)
        })
    };
    // The profiled CNN's log folder: every event file's CRCs, every profile reference
    // (fails on a corrupt or missing file).
    let summarize = ["profile", "summarize", "target/mnist/logs/cnn"];
    run_in(&launcher.path, &summarize, &[], None)
        // Two workers (each exits non-zero below its accuracy goal; the launcher with the
        // first failing worker's code).
        && ["multi_worker_mnist", "distributed_custom_training"]
            .iter()
            .all(|e| launch(e, &["--workers", "2"], &[]))
        // TF's parameter-server tutorial, Keras' fit and the custom loop: a chief, 2
        // workers and 2 parameter servers (exits non-zero below 95% test accuracy).
        && ["fit", "custom"].iter().all(|api| {
            let cluster = ["--chief", "--workers", "2", "--ps", "2"];
            launch("parameter_server_training", &cluster, &["--api", api])
        })
}

/// The launched programs again, unchanged, started by `mpirun` (built with the `mpi`
/// feature: no TF_CONFIG, the collectives over MPI), where MPI is installed.
fn examples_under_mpirun() -> bool {
    let programs = ["multi_worker_mnist", "distributed_custom_training"];
    !have_mpi()
        || built::cargo_executables(&[
            "build",
            "--workspace",
            "--features",
            "ferroflow/mpi",
            "--example",
            programs[0],
            "--example",
            programs[1],
        ])
        .is_some_and(|with_mpi| {
            programs.iter().all(|e| {
                built::find(&with_mpi, "ferroflow", "example", e).is_some_and(|program| {
                    let program = program.path.to_string_lossy();
                    let args = [
                        "--allow-run-as-root",
                        "--oversubscribe",
                        "-np",
                        "2",
                        &program,
                    ];
                    run("mpirun", &args)
                })
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
    !have_mpi() || suite_with_feature("ferroflow-distribute/mpi", "--all-targets", "collectives")
}

/// The collectives' NCCL path across processes (the facade's `cuda` feature, whose
/// backend offers NCCL), with its lints: worker processes on the CUDA backend's host
/// emulation, whose stand-in for NCCL carries their collectives.
fn nccl_suite() -> bool {
    suite_with_feature("ferroflow/cuda", "--tests", "nccl_collectives")
}

/// Clippy over `lint_targets` and the test `test` with the workspace's features plus
/// `feature` (`package/feature`): only the crates that feature changes compile again.
fn suite_with_feature(feature: &str, lint_targets: &str, test: &str) -> bool {
    let with = ["--workspace", "--features", feature];
    let clippy = [
        &["clippy"][..],
        &with,
        &[lint_targets, "--", "-D", "warnings"],
    ]
    .concat();
    let tests = [&["test"][..], &with, &["--test", test]].concat();
    run("cargo", &clippy) && run("cargo", &tests)
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
