//! `cargo xtask gpu`: the wgpu backend on a real GPU, in one table.
//!
//! 0. The native CUDA backend (`ferroflow-cuda`, in progress: reported, not yet required to
//!    pass), where xtask is built with the feature `cuda-12` or `cuda-13` (the CUDA version
//!    of the machine's libraries; PyTorch's wheels bring them): its conformance suite, and
//!    `xtask gpu-cuda` (see `gpu_cuda.rs`) in a process of its own, both with the folders
//!    holding NVRTC and cuBLAS (found along `LD_LIBRARY_PATH`, the toolkit's places and
//!    `python3`'s site-packages) on `LD_LIBRARY_PATH`. `--cuda-only` stops after these.
//! 1. The wgpu test suites (the backend conformance suite and the MNIST loss-curve test) on
//!    `/GPU:0`, with `FERROFLOW_REQUIRE_WGPU=1` so a missing adapter fails.
//! 2. float32 matmul GFLOP/s for n = 1024..8192 on the wgpu device, and through
//!    PyTorch/cuBLAS (TF32 off) on the same GPU when `python3` has CUDA torch.
//! 3. MNIST: one epoch of the examples' MLP and CNN with `fit` on the wgpu device (and the MLP
//!    on the CPU for scale).
//!
//! For machines without Rust, `cargo xtask gpu --bundle DIR` builds everything (release,
//! stripped) into DIR; there, from a checkout of the repository (for `datasets/` and the
//! torch script), `DIR/xtask gpu --prebuilt DIR` runs the same checks.

use crate::bench::{mnist_train, python_figures_with, EpochTimer};
use ferroflow::{DType, Device, Tensor};
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Instant;

const SUITES: [&str; 7] = [
    "conformance",
    "devices",
    "gemm",
    "mixed_precision",
    "mnist",
    "numpy_api",
    "step_budget",
];

/// Builds the wgpu test binaries in release mode; returns (suite name, path).
fn build_tests() -> Option<Vec<(String, PathBuf)>> {
    let out = Command::new("cargo")
        .args([
            "test",
            "--release",
            "-p",
            "ferroflow-wgpu",
            "-p",
            "ferroflow-backend-tests",
            "--no-run",
            "--message-format=json",
        ])
        .output()
        .ok()?;
    if !out.status.success() {
        eprintln!(
            "xtask gpu: building the wgpu tests failed:\n{}",
            String::from_utf8_lossy(&out.stderr)
        );
        return None;
    }
    let mut found = vec![];
    for line in String::from_utf8_lossy(&out.stdout).lines() {
        let Ok(v) = serde_json::from_str::<serde_json::Value>(line) else {
            continue;
        };
        let (Some(name), Some(exe)) = (
            v.pointer("/target/name").and_then(|n| n.as_str()),
            v.get("executable").and_then(|e| e.as_str()),
        ) else {
            continue;
        };
        if SUITES.contains(&name) {
            found.push((name.to_string(), PathBuf::from(exe)));
        }
    }
    Some(found)
}

/// The xtask feature naming the CUDA version the CUDA rows are built for, if any.
fn cuda_feature() -> Option<&'static str> {
    if cfg!(feature = "cuda-13") {
        Some("cuda-13")
    } else if cfg!(feature = "cuda-12") {
        Some("cuda-12")
    } else {
        None
    }
}

/// Builds the CUDA backend's conformance suite in release mode for `feature` (issue #23, in
/// progress).
fn build_cuda_suite(feature: &str) -> Option<PathBuf> {
    let out = Command::new("cargo")
        .args([
            "test",
            "--release",
            "-p",
            "ferroflow-cuda",
            "--no-default-features",
            "--features",
            feature,
            "--test",
            "conformance",
            "--no-run",
            "--message-format=json",
        ])
        .output()
        .ok()?;
    String::from_utf8_lossy(&out.stdout)
        .lines()
        .find_map(|line| {
            let v = serde_json::from_str::<serde_json::Value>(line).ok()?;
            (v.pointer("/target/name")?.as_str()? == "conformance")
                .then(|| v.get("executable")?.as_str().map(PathBuf::from))?
        })
}

/// Folders holding CUDA `major`'s NVRTC or cuBLAS (`libnvrtc.so.13`, `libcublas.so.13`,
/// ...): along `LD_LIBRARY_PATH`, the toolkit's usual places, and NVIDIA's pip wheels under
/// `python3`'s site-packages (PyTorch's CUDA libraries live there), for `LD_LIBRARY_PATH`.
fn nvidia_library_dirs(major: u32) -> Vec<PathBuf> {
    let mut roots: Vec<PathBuf> = std::env::var_os("LD_LIBRARY_PATH")
        .map(|v| std::env::split_paths(&v).collect())
        .unwrap_or_default();
    roots.extend(
        [
            "/usr/local/cuda/lib64",
            "/usr/local/cuda/targets/x86_64-linux/lib",
            "/usr/lib/x86_64-linux-gnu",
        ]
        .map(PathBuf::from),
    );
    if let Ok(o) = Command::new("python3")
        .args([
            "-c",
            "import site; print(chr(10).join(site.getsitepackages()))",
        ])
        .output()
    {
        roots.extend(
            String::from_utf8_lossy(&o.stdout)
                .lines()
                .map(|l| Path::new(l.trim()).join("nvidia")),
        );
    }
    let wanted = [
        format!("libnvrtc.so.{major}"),
        format!("libcublas.so.{major}"),
        format!("libcublasLt.so.{major}"),
    ];
    let mut found: Vec<PathBuf> = vec![];
    // Breadth-first, three folders deep at most under each root, 2000 folders in all.
    let mut queue: std::collections::VecDeque<(PathBuf, usize)> =
        roots.into_iter().map(|r| (r, 0)).collect();
    let mut seen = 0usize;
    while let Some((dir, depth)) = queue.pop_front() {
        seen += 1;
        if seen > 2000 {
            break;
        }
        let Ok(entries) = std::fs::read_dir(&dir) else {
            continue;
        };
        for entry in entries.flatten() {
            let path = entry.path();
            let name = entry.file_name().to_string_lossy().to_string();
            if wanted.iter().any(|w| name.starts_with(w.as_str())) {
                if !found.contains(&dir) {
                    found.push(dir.clone());
                }
            } else if depth < 3 && path.is_dir() {
                queue.push_back((path, depth + 1));
            }
        }
    }
    found
}

/// `LD_LIBRARY_PATH` with `dirs` in front.
fn library_path_with(dirs: &[PathBuf]) -> std::ffi::OsString {
    let old = std::env::var_os("LD_LIBRARY_PATH").unwrap_or_default();
    let mut all: Vec<PathBuf> = dirs.to_vec();
    all.extend(std::env::split_paths(&old));
    std::env::join_paths(all).unwrap_or(old)
}

/// The CUDA backend's rows (issue #23, in progress: reported, not yet a condition of
/// success): its conformance suite, then `xtask gpu-cuda` (matmul, host cost per op, MNIST
/// `fit`) in a process of its own, both with NVIDIA's libraries on `LD_LIBRARY_PATH`.
fn cuda_rows(prebuilt: Option<&Path>, passthrough: &[String]) -> Vec<(String, String)> {
    let Some(feature) = cuda_feature() else {
        return vec![(
            "CUDA backend".into(),
            "not built: `cargo run -p xtask --release --features cuda-12` (or `cuda-13`, the \
             machine's CUDA) -- gpu"
                .into(),
        )];
    };
    let major = if feature == "cuda-13" { 13 } else { 12 };
    let dirs = nvidia_library_dirs(major);
    println!("CUDA {major} libraries found in: {dirs:?}");
    let path = library_path_with(&dirs);
    let mut rows = vec![];
    let suite = match prebuilt {
        Some(d) => Some(d.join("cuda_conformance")).filter(|p| p.exists()),
        None => build_cuda_suite(feature),
    };
    let cell = match suite {
        Some(exe) => {
            let (p, f, secs) =
                run_suite_with("cuda conformance", &exe, &[("LD_LIBRARY_PATH", &path)]);
            format!("{p} passed, {f} failed ({secs:.1} s)")
        }
        None => "not built".to_string(),
    };
    rows.push((
        format!("CUDA backend conformance suite ({feature}, in progress)"),
        cell,
    ));
    let me = match std::env::current_exe() {
        Ok(p) => p,
        Err(e) => {
            rows.push(("CUDA rows".into(), format!("error: {e}")));
            return rows;
        }
    };
    let t = Instant::now();
    let mut cmd = Command::new(me);
    cmd.arg("gpu-cuda")
        .args(passthrough)
        .env("LD_LIBRARY_PATH", &path);
    let (success, lines) = run_streaming(cmd, SUITE_TIMEOUT);
    for line in &lines {
        let cells: Vec<&str> = line.split(" | ").collect();
        if let (true, [k, v]) = (line.starts_with("| "), cells.as_slice()) {
            rows.push((
                k.trim_start_matches("| ").to_string(),
                v.trim_end_matches(" |").to_string(),
            ));
        }
    }
    rows.push((
        "CUDA rows (xtask gpu-cuda)".into(),
        format!(
            "{} in {:.0} s",
            if success {
                "all ran"
            } else {
                "FAILED or cut short"
            },
            t.elapsed().as_secs_f64()
        ),
    ));
    rows
}

/// How long one suite (or `xtask gpu-cuda`) may run before it is killed and reported: a
/// borrowed GPU machine's lease is short, and a hang must not take the rest of the table.
const SUITE_TIMEOUT: std::time::Duration = std::time::Duration::from_secs(420);

/// Runs `cmd`, echoing its output as it comes (so a run cut short still shows how far it
/// got) and collecting its stdout lines; kills it after `timeout`. Returns (whether it
/// exited successfully, its stdout lines).
fn run_streaming(mut cmd: Command, timeout: std::time::Duration) -> (bool, Vec<String>) {
    use std::io::BufRead;
    let mut child = match cmd
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::inherit())
        .spawn()
    {
        Ok(c) => c,
        Err(e) => {
            eprintln!("xtask gpu: cannot run {:?}: {e}", cmd.get_program());
            return (false, vec![]);
        }
    };
    let Some(stdout) = child.stdout.take() else {
        let _ = child.kill();
        let _ = child.wait();
        return (false, vec![]);
    };
    let reader = std::thread::spawn(move || {
        std::io::BufReader::new(stdout)
            .lines()
            .map_while(|l| l.ok())
            .inspect(|l| println!("{l}"))
            .collect::<Vec<String>>()
    });
    let start = Instant::now();
    let success = loop {
        match child.try_wait() {
            Ok(Some(status)) => break status.success(),
            Ok(None) if start.elapsed() < timeout => {
                std::thread::sleep(std::time::Duration::from_millis(100))
            }
            Ok(None) | Err(_) => {
                eprintln!(
                    "xtask gpu: {:?} ran past {} s: killed",
                    cmd.get_program(),
                    timeout.as_secs()
                );
                let _ = child.kill();
                let _ = child.wait();
                break false;
            }
        }
    };
    (success, reader.join().unwrap_or_default())
}

/// Runs one test binary; returns (passed, failed) counts from libtest's summary.
fn run_suite(name: &str, exe: &Path) -> (usize, usize, f64) {
    run_suite_with(name, exe, &[])
}

/// [`run_suite`] with extra environment variables.
fn run_suite_with(name: &str, exe: &Path, env: &[(&str, &std::ffi::OsStr)]) -> (usize, usize, f64) {
    let t = Instant::now();
    let mut cmd = Command::new(exe);
    cmd.envs(env.iter().copied())
        .env("FERROFLOW_REQUIRE_WGPU", "1")
        .env("FERROFLOW_REQUIRE_SHADER_F16", "1")
        .env("FERROFLOW_REQUIRE_CUDA", "1")
        .arg("--test-threads=4");
    let (success, lines) = run_streaming(cmd, SUITE_TIMEOUT);
    let secs = t.elapsed().as_secs_f64();
    let text = lines.join("\n");
    let count = |what: &str| {
        text.lines()
            .filter(|l| l.starts_with("test result:"))
            .filter_map(|l| {
                let i = l.find(what)?;
                l[..i].trim().rsplit(' ').next()?.parse::<usize>().ok()
            })
            .sum::<usize>()
    };
    let failed = count(" failed").max(usize::from(!success));
    println!("suite {name}: {} passed, {failed} failed", count(" passed"));
    (count(" passed"), failed, secs)
}

/// Median GFLOP/s of `n×n×n` matmuls in `dtype` on `device` (3 timed runs of 3-200
/// products after 2 warm-ups, the device synchronised around each).
pub(crate) fn matmul_gflops(device: Device, n: usize, dtype: DType) -> ferroflow::Result<f64> {
    let spec = device.to_string();
    ferroflow::with_device(&spec, || {
        let operand = |seed: [u64; 2]| {
            ferroflow::random::stateless_uniform(&[n, n], seed, -1.0, 1.0, DType::F32)?
                .cast(dtype)?
                .to_device(device)
        };
        let (a, b) = (operand([1, 2])?, operand([3, 4])?);
        let sync = || ferroflow::synchronize(device);
        for _ in 0..2 {
            a.matmul(&b)?;
            sync()?;
        }
        let reps = ((8.0 * (8192.0 / n as f64).powi(3)) as usize).clamp(3, 200);
        let mut times = vec![];
        for _ in 0..3 {
            let t = Instant::now();
            for _ in 0..reps {
                a.matmul(&b)?;
            }
            sync()?;
            times.push(t.elapsed().as_secs_f64() / reps as f64);
        }
        times.sort_by(f64::total_cmp);
        Ok(2.0 * (n as f64).powi(3) / times[1] / 1e9)
    })?
}

/// Seconds for one epoch of `fit` (batch 128, the second of two) of the examples' `kind`
/// model on `device` under the dtype policy `policy` ("float32", "mixed_float16", ...).
fn mnist_epoch(
    device: Device,
    kind: &str,
    policy: &str,
    x: &Tensor,
    y: &Tensor,
) -> ferroflow::Result<f64> {
    use ferroflow::keras::mixed_precision::{set_global_policy, Policy};
    set_global_policy(Policy::new(policy)?);
    let seconds = mnist_epoch_under_policy(device, kind, x, y);
    set_global_policy(Policy::default());
    seconds
}

fn mnist_epoch_under_policy(
    device: Device,
    kind: &str,
    x: &Tensor,
    y: &Tensor,
) -> ferroflow::Result<f64> {
    use ferroflow::keras::losses::SparseCategoricalCrossentropy;
    use ferroflow::keras::{applications, FitConfig, Model};
    use ferroflow::optim::Adam;
    ferroflow::random::set_seed(1);
    ferroflow::with_device(&device.to_string(), || {
        let mut model = Model::from(if kind == "mlp" {
            applications::mnist_mlp()
        } else {
            applications::mnist_cnn()
        });
        model.build(&[28, 28, 1])?;
        model.compile(
            Adam::new(1e-3),
            SparseCategoricalCrossentropy::new(true),
            &["accuracy"],
        )?;
        let times = std::sync::Arc::new(std::sync::Mutex::new(vec![]));
        // Two epochs: the first compiles the kernels.
        let h = model.fit(
            x,
            y,
            FitConfig::new()
                .epochs(2)
                .batch_size(128)
                .verbose(0)
                .callback(EpochTimer(times.clone(), Instant::now())),
        )?;
        let acc = h
            .get("accuracy")
            .and_then(|a| a.last().copied())
            .unwrap_or(0.0);
        println!(
            "mnist {kind} on {device} ({}): training accuracy {acc:.4} after 2 epochs",
            ferroflow::keras::mixed_precision::global_policy().name()
        );
        Ok(EpochTimer::last_seconds(&times))
    })?
}

fn bundle(dir: &Path) -> bool {
    let Some(tests) = build_tests() else {
        return false;
    };
    if std::fs::create_dir_all(dir).is_err() {
        eprintln!("xtask gpu: cannot create {}", dir.display());
        return false;
    }
    let me = match std::env::current_exe() {
        Ok(p) => p,
        Err(e) => {
            eprintln!("xtask gpu: {e}");
            return false;
        }
    };
    let mut files = vec![("xtask".to_string(), me)];
    files.extend(tests);
    if let Some(feature) = cuda_feature() {
        match build_cuda_suite(feature) {
            Some(exe) => files.push(("cuda_conformance".to_string(), exe)),
            None => {
                eprintln!("xtask gpu: building the CUDA conformance suite failed");
                return false;
            }
        }
    }
    for (name, src) in files {
        let dst = dir.join(&name);
        if !crate::run(
            "objcopy",
            &[
                "--strip-all",
                &src.to_string_lossy(),
                &dst.to_string_lossy(),
            ],
        ) {
            return false;
        }
    }
    println!(
        "bundle in {}: run `{}/xtask gpu --prebuilt {}` from a checkout",
        dir.display(),
        dir.display(),
        dir.display()
    );
    true
}

/// `cargo xtask gpu [--sizes 1024,2048,4096,8192] [--mnist SAMPLES] [--epochs N] [--cuda-only]
/// [--bundle DIR | --prebuilt DIR]` (`--epochs`: the CUDA MNIST rows' epochs, 3).
pub fn run(args: &[String]) -> bool {
    let mut sizes = vec![1024usize, 2048, 4096, 8192];
    let mut samples = 60000usize;
    let mut prebuilt = None;
    let mut cuda_only = false;
    let mut passthrough: Vec<String> = vec![];
    let mut i = 0;
    while i < args.len() {
        match (args[i].as_str(), args.get(i + 1)) {
            ("--sizes", Some(v)) => {
                sizes = v.split(',').filter_map(|s| s.parse().ok()).collect();
                passthrough.extend(["--sizes".to_string(), v.clone()]);
                i += 1;
            }
            ("--epochs", Some(v)) => {
                passthrough.extend(["--epochs".to_string(), v.clone()]);
                i += 1;
            }
            ("--cuda-only", _) => cuda_only = true,
            ("--mnist", Some(v)) => {
                samples = v.parse().unwrap_or(samples);
                i += 1;
            }
            ("--bundle", Some(d)) => return bundle(Path::new(d)),
            ("--prebuilt", Some(d)) => {
                prebuilt = Some(PathBuf::from(d));
                i += 1;
            }
            (other, _) => {
                eprintln!("xtask gpu: unknown argument {other:?}");
                return false;
            }
        }
        i += 1;
    }
    // The CUDA rows first (the part of issue #23 that waits for a GPU), in processes of
    // their own.
    let cuda = cuda_rows(prebuilt.as_deref(), &passthrough);
    if cuda_only {
        print_table("CUDA", &cuda);
        return true;
    }
    ferroflow::init();
    let adapters = ferroflow_wgpu::register();
    println!("wgpu adapters: {:?}", ferroflow_wgpu::adapters());
    if adapters == 0 {
        eprintln!("xtask gpu: wgpu found no adapter");
        return false;
    }
    let gpu = Device::gpu(0);
    let mut rows: Vec<(String, String)> = vec![];
    let tests = match &prebuilt {
        // A bundle may leave suites out (the transfer limit): run the ones it has.
        Some(d) => SUITES
            .iter()
            .map(|s| (s.to_string(), d.join(s)))
            .filter(|(_, p)| p.exists())
            .collect(),
        None => build_tests().unwrap_or_default(),
    };
    let mut ok = !tests.is_empty();
    for (name, exe) in &tests {
        let (p, f, secs) = run_suite(name, exe);
        ok &= f == 0 && p > 0;
        rows.push((
            format!("wgpu test suite `{name}`"),
            format!("{p} passed, {f} failed ({secs:.1} s)"),
        ));
    }
    rows.extend(cuda);
    let strs: Vec<String> = sizes.iter().map(|n| n.to_string()).collect();
    let strs: Vec<&str> = strs.iter().map(String::as_str).collect();
    let torch = python_figures_with(Path::new("xtask/bench/torch_matmul.py"), &strs);
    if torch.is_none() {
        println!("(no CUDA torch in python3: the cuBLAS column stays empty)");
    }
    for &n in &sizes {
        let ours = matmul_gflops(gpu, n, DType::F32);
        let theirs = torch.as_ref().and_then(|t| t.get(&n.to_string()).copied());
        let cell = match (&ours, theirs) {
            (Ok(g), Some(t)) => format!("{g:.0} GFLOP/s vs cuBLAS {t:.0} ({:.0}%)", 100.0 * g / t),
            (Ok(g), None) => format!("{g:.0} GFLOP/s"),
            (Err(e), _) => {
                ok = false;
                format!("error: {e}")
            }
        };
        rows.push((format!("matmul f32 {n}×{n}×{n}"), cell));
    }
    match mnist_train(samples) {
        Ok((x, y)) => {
            for (kind, device, policy) in [
                ("mlp", gpu, "float32"),
                ("cnn", gpu, "float32"),
                ("mlp", gpu, "mixed_float16"),
                ("cnn", gpu, "mixed_float16"),
                ("mlp", Device::CPU, "float32"),
                ("cnn", Device::CPU, "float32"),
            ] {
                let cell = match mnist_epoch(device, kind, policy, &x, &y) {
                    Ok(s) => format!("{s:.2} s ({:.0} samples/s)", samples as f64 / s),
                    Err(e) => {
                        ok = false;
                        format!("error: {e}")
                    }
                };
                rows.push((
                    format!(
                        "MNIST {kind} epoch of {samples} (fit, batch 128, {policy}) on {device}"
                    ),
                    cell,
                ));
            }
        }
        Err(e) => {
            ok = false;
            rows.push(("MNIST".into(), format!("error: {e}")));
        }
    }
    print_table(&ferroflow_wgpu::adapters()[0].name, &rows);
    ok
}

fn print_table(title: &str, rows: &[(String, String)]) {
    println!("\n| {title} | result |\n|---|---|");
    for (k, v) in rows {
        println!("| {k} | {v} |");
    }
}
