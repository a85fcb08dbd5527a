//! The native CUDA backend's part of `cargo xtask gpu` (issue #23), in a process of its own
//! (`xtask gpu-cuda`, started by `xtask gpu` with NVIDIA's libraries on `LD_LIBRARY_PATH`):
//! CUDA is registered before `ferroflow::init()`, so it serves `/GPU:0` there while the wgpu
//! rows run in the parent.
//!
//! Rows (printed as `| name | result |`, which the parent adds to its table):
//! - matmul GFLOP/s for n = 1024..8192: float32 with TensorFloat-32 off and on, bfloat16;
//!   PyTorch's in the same cells when `python3` has CUDA torch (`bench/torch_matmul.py`);
//! - the host's cost per op: a chain of 1000 small adds, µs per op (goal ≤ 5);
//! - a ResNet-style network's training step (batch 256, synthetic 32×32×3) in float32 and
//!   mixed_float16 against PyTorch eager (`bench/torch_resnet.py`);
//! - MNIST `fit` (3 epochs, batch 128) of the examples' MLP under float32, mixed_float16 and
//!   mixed_bfloat16, and of the CNN under float32: test accuracy against the main job's
//!   goals (97.5%, 98.8%) and samples/s.
//!
//! Built only with the xtask feature `cuda-12` or `cuda-13` (the CUDA version whose
//! libraries the machine has); `xtask gpu` says so otherwise.

use crate::bench::{mnist_dir, python_figures_with, EpochTimer};
use crate::gpu::matmul_gflops;
use ferroflow::{DType, Device, Tensor};
use std::path::Path;
use std::time::Instant;

/// Microseconds of host time per op: a chain of 1000 adds of 16-element tensors, the
/// median of 5 chains after a warm-up, the device synchronised at the end of each.
fn per_op_micros(device: Device) -> ferroflow::Result<f64> {
    ferroflow::with_device(&device.to_string(), || {
        let x = Tensor::from_vec(vec![1.0f32; 16], &[16])?;
        let one = Tensor::from_vec(vec![1e-3f32; 16], &[16])?;
        let chain = || -> ferroflow::Result<f64> {
            let t = Instant::now();
            let mut y = x.clone();
            for _ in 0..1000 {
                y = y.add(&one)?;
            }
            ferroflow::synchronize(device)?;
            Ok(t.elapsed().as_secs_f64() * 1e6 / 1000.0)
        };
        chain()?;
        let mut times = (0..5)
            .map(|_| chain())
            .collect::<ferroflow::Result<Vec<_>>>()?;
        times.sort_by(f64::total_cmp);
        Ok(times[2])
    })?
}

/// (test accuracy, samples/s of the last epoch) of the examples' `kind` model after
/// `epochs` epochs of `fit` (batch 128) on `device` under `policy`.
fn mnist_fit(
    device: Device,
    kind: &str,
    policy: &str,
    epochs: usize,
    train: &(Tensor, Tensor),
    test: &(Tensor, Tensor),
) -> ferroflow::Result<(f64, f64)> {
    use ferroflow::keras::mixed_precision::{set_global_policy, Policy};
    set_global_policy(Policy::new(policy)?);
    ferroflow::random::set_seed(1);
    let result = ferroflow::with_device(&device.to_string(), || {
        let mut model = crate::bench::mnist_model(kind, false)?;
        let times = std::sync::Arc::new(std::sync::Mutex::new(vec![]));
        model.fit(
            &train.0,
            &train.1,
            ferroflow::keras::FitConfig::new()
                .epochs(epochs)
                .batch_size(128)
                .verbose(0)
                .callback(EpochTimer(times.clone(), Instant::now())),
        )?;
        let acc = model
            .evaluate(&test.0, &test.1, 1000)?
            .get("accuracy")
            .unwrap_or(0.0);
        Ok((
            acc,
            train.0.shape()[0] as f64 / EpochTimer::last_seconds(&times),
        ))
    })?;
    set_global_policy(Policy::default());
    result
}

/// The ResNet-style network of the convolution goal (the same as
/// `bench/torch_resnet.py`): conv 3×3/32 + batch norm + ReLU, two residual blocks at 32
/// channels, a stride-2 conv to 64, two blocks at 64, global average pooling, Dense 10
/// (logits), compiled with Adam 1e-3 and sparse cross-entropy.
fn resnet_style() -> ferroflow::Result<ferroflow::keras::Model> {
    use ferroflow::keras::activations::Activation as Act;
    use ferroflow::keras::functional::{input, KerasTensor, Symbolic};
    use ferroflow::keras::layers::{
        Activation, Add, BatchNormalization, Conv2D, Dense, GlobalAveragePooling2D,
    };
    use ferroflow::Padding;
    fn conv_bn(x: &KerasTensor, filters: usize, stride: usize) -> ferroflow::Result<KerasTensor> {
        let c = Conv2D::new(filters, [3, 3])
            .padding(Padding::Same)
            .strides([stride, stride])
            .on(&[x])?;
        Ok(BatchNormalization::new().on(&[&c[0]])?.remove(0))
    }
    fn relu(x: &KerasTensor) -> ferroflow::Result<KerasTensor> {
        Ok(Activation::new(Act::Relu).on(&[x])?.remove(0))
    }
    fn block(x: &KerasTensor, filters: usize) -> ferroflow::Result<KerasTensor> {
        let h = relu(&conv_bn(x, filters, 1)?)?;
        let h = conv_bn(&h, filters, 1)?;
        relu(&Add::new().on(&[&h, x])?[0])
    }
    let x = input(&[32, 32, 3], "images");
    let mut h = relu(&conv_bn(&x, 32, 1)?)?;
    h = block(&block(&h, 32)?, 32)?;
    h = relu(&conv_bn(&h, 64, 2)?)?;
    h = block(&block(&h, 64)?, 64)?;
    let pooled = GlobalAveragePooling2D::new().on(&[&h])?;
    let logits = Dense::new(10).on(&[&pooled[0]])?;
    let mut model = ferroflow::keras::Model::new(&[x], &logits)?;
    model.compile(
        ferroflow::optim::Adam::new(1e-3),
        ferroflow::keras::losses::SparseCategoricalCrossentropy::new(true),
        &[],
    )?;
    Ok(model)
}

/// `n` synthetic 32×32×3 images in [0, 1) and int64 labels in 0..10 (fixed seeds): the
/// ResNet-style network's data (as `bench/torch_resnet.py` makes its own).
fn synthetic_images(n: usize) -> ferroflow::Result<(Tensor, Tensor)> {
    let x = ferroflow::random::stateless_uniform(&[n, 32, 32, 3], [5, 6], 0.0, 1.0, DType::F32)?;
    let y = ferroflow::random::stateless_uniform(&[n], [7, 8], 0.0, 10.0, DType::F32)?
        .floor()?
        .cast(DType::I64)?;
    Ok((x, y))
}

/// Samples/s of the ResNet-style network's training steps (`fit`, batch 256, synthetic
/// 32×32×3 data, 10 steps per epoch, the second of two epochs timed) on `device` under
/// `policy`.
fn resnet_samples_per_second(device: Device, policy: &str) -> ferroflow::Result<f64> {
    use ferroflow::keras::mixed_precision::{set_global_policy, Policy};
    const BATCH: usize = 256;
    const STEPS: usize = 10;
    set_global_policy(Policy::new(policy)?);
    ferroflow::random::set_seed(2);
    let result = ferroflow::with_device(&device.to_string(), || {
        let (x, y) = synthetic_images(BATCH * STEPS)?;
        let mut model = resnet_style()?;
        let times = std::sync::Arc::new(std::sync::Mutex::new(vec![]));
        model.fit(
            &x,
            &y,
            ferroflow::keras::FitConfig::new()
                .epochs(2)
                .batch_size(BATCH)
                .verbose(0)
                .callback(EpochTimer(times.clone(), Instant::now())),
        )?;
        Ok((BATCH * STEPS) as f64 / EpochTimer::last_seconds(&times))
    })?;
    set_global_policy(Policy::default());
    result
}

/// Where the ResNet-style step's device time goes: a profile of 3 training steps (batch
/// 256, float32) after 2 warm-up steps (kernels compiled), its op rows timed on the device,
/// most first (`top` of them), after a line with their total and the host's step times.
fn resnet_device_profile(device: Device, top: usize) -> ferroflow::Result<Vec<String>> {
    ferroflow::random::set_seed(2);
    ferroflow::with_device(&device.to_string(), || {
        let (x, y) = synthetic_images(256)?;
        let mut model = resnet_style()?;
        let step = |model: &mut ferroflow::keras::Model| {
            model.train_step(std::slice::from_ref(&x), std::slice::from_ref(&y))
        };
        for _ in 0..2 {
            step(&mut model)?;
        }
        ferroflow::synchronize(device)?;
        let dir =
            std::env::temp_dir().join(format!("ferroflow-cuda-profile-{}", std::process::id()));
        let profile = ferroflow::profiler::Profile::start(&dir, Default::default())?;
        let t = Instant::now();
        for _ in 0..3 {
            step(&mut model)?;
        }
        ferroflow::synchronize(device)?;
        let wall_ms = t.elapsed().as_secs_f64() * 1e3 / 3.0;
        let files = profile.finish()?;
        let space = ferroflow::profiler::read_xspace(&files.xplane)?;
        let _ = std::fs::remove_dir_all(&dir);
        let summary = ferroflow::profiler::summarize(&space);
        let rows: Vec<_> = summary
            .ops
            .iter()
            .filter(|o| o.host_or_device != "Host")
            .collect();
        let total: f64 = rows.iter().map(|o| o.self_us).sum::<f64>().max(1e-9);
        let mut lines = vec![format!(
            "device time {:.2} ms per step over {} op rows; {wall_ms:.2} ms per step on the \
             host's clock (profiled)",
            total / 3e3,
            rows.len()
        )];
        lines.extend(rows.iter().take(top).map(|o| {
            format!(
                "{:<26} {:<48} {:>5} {:>9.1} µs {:>5.1}%",
                o.op_type,
                o.name,
                o.count,
                o.self_us,
                100.0 * o.self_us / total
            )
        }));
        Ok(lines)
    })?
}

/// `xtask gpu-cuda [--sizes 1024,2048,4096,8192] [--epochs N]`: the rows above, printed.
pub fn run(args: &[String]) -> bool {
    let mut sizes = vec![1024usize, 2048, 4096, 8192];
    let mut epochs = 3usize;
    let mut i = 0;
    while i < args.len() {
        match (args[i].as_str(), args.get(i + 1)) {
            ("--sizes", Some(v)) => {
                sizes = v.split(',').filter_map(|s| s.parse().ok()).collect();
                i += 1;
            }
            ("--epochs", Some(v)) => {
                epochs = v.parse().unwrap_or(epochs);
                i += 1;
            }
            (other, _) => {
                eprintln!("xtask gpu-cuda: unknown argument {other:?}");
                return false;
            }
        }
        i += 1;
    }
    let row = |k: &str, v: &str| println!("| {k} | {v} |");
    // CUDA first: it serves `/GPU:N` in this process; init() then adds the CPU.
    let n = ferroflow_cuda::register();
    ferroflow::init();
    if n == 0 {
        let why = ferroflow_cuda::devices_or_error()
            .err()
            .unwrap_or_else(|| "the driver lists no CUDA device".into());
        row("CUDA backend", &format!("no device: {why}"));
        return false;
    }
    let gpu = Device::gpu(0);
    row(
        "CUDA devices and versions",
        &format!(
            "{:?}; {}; {}; {}; nvidia-smi: {}",
            ferroflow_cuda::devices(),
            ferroflow_cuda::versions().unwrap_or_else(|e| e),
            ferroflow_cuda::cudnn_version().unwrap_or_else(|e| format!("no cuDNN: {e}")),
            ferroflow_cuda::nccl::nccl_version().unwrap_or_else(|e| format!("no NCCL: {e}")),
            std::process::Command::new("nvidia-smi")
                .args(["--query-gpu=name,driver_version", "--format=csv,noheader"])
                .output()
                .map(|o| String::from_utf8_lossy(&o.stdout).trim().to_string())
                .unwrap_or_else(|e| format!("not run ({e})"))
        ),
    );
    let mut ok = true;
    let strs: Vec<String> = sizes.iter().map(|n| n.to_string()).collect();
    let torch = |mode: &str| {
        let mut args: Vec<&str> = vec!["--mode", mode];
        args.extend(strs.iter().map(String::as_str));
        python_figures_with(Path::new("xtask/bench/torch_matmul.py"), &args)
    };
    for (label, dtype, tf32, mode) in [
        ("float32, TF32 off", DType::F32, false, "float32"),
        ("float32, TF32 on", DType::F32, true, "tf32"),
        ("bfloat16", DType::BF16, true, "bfloat16"),
    ] {
        ferroflow_cuda::set_tensor_float_32_execution(tf32);
        let theirs = torch(mode);
        for &n in &sizes {
            let t = theirs.as_ref().and_then(|t| t.get(&n.to_string()).copied());
            let cell = match (matmul_gflops(gpu, n, dtype), t) {
                (Ok(g), Some(t)) => {
                    format!("{g:.0} GFLOP/s vs PyTorch {t:.0} ({:.2}×)", g / t)
                }
                (Ok(g), None) => format!("{g:.0} GFLOP/s (no CUDA torch)"),
                (Err(e), _) => {
                    ok = false;
                    format!("error: {e}")
                }
            };
            row(&format!("CUDA matmul {label} {n}×{n}×{n}"), &cell);
        }
    }
    ferroflow_cuda::set_tensor_float_32_execution(true);
    // With the block cache (no allocation or free per op), then without it (the driver's
    // pool: two driver calls more per op).
    let limit = ferroflow_cuda::block_cache_limit();
    let with_cache = per_op_micros(gpu);
    ferroflow_cuda::set_block_cache_limit(0);
    let without = per_op_micros(gpu);
    ferroflow_cuda::set_block_cache_limit(limit);
    match (with_cache, without) {
        (Ok(us), Ok(pool)) => row(
            "CUDA host cost per op (1000 chained adds of 16 floats)",
            &format!("{us:.2} µs (goal ≤ 5); {pool:.2} µs without the block cache"),
        ),
        (Err(e), _) | (_, Err(e)) => {
            ok = false;
            row("CUDA host cost per op", &format!("error: {e}"));
        }
    }
    // The ResNet-style step against PyTorch eager (goal ≥ 1.0×; mixed_float16 ≥ 2× our
    // float32).
    let mut float32_rate = None;
    for policy in ["float32", "mixed_float16"] {
        let theirs = python_figures_with(
            Path::new("xtask/bench/torch_resnet.py"),
            &[policy, "256", "20"],
        )
        .and_then(|f| f.get("samples_per_s").copied());
        let cell = match resnet_samples_per_second(gpu, policy) {
            Ok(ours) => {
                if policy == "float32" {
                    float32_rate = Some(ours);
                }
                let vs_f32 = match (policy, float32_rate) {
                    ("mixed_float16", Some(f)) => {
                        format!(", {:.2}× our float32 (goal ≥ 2)", ours / f)
                    }
                    _ => String::new(),
                };
                match theirs {
                    Some(t) => format!(
                        "{ours:.0} samples/s vs PyTorch eager {t:.0} ({:.2}×, goal ≥ 1.0){vs_f32}",
                        ours / t
                    ),
                    None => format!("{ours:.0} samples/s (no CUDA torch){vs_f32}"),
                }
            }
            Err(e) => {
                ok = false;
                format!("error: {e}")
            }
        };
        row(
            &format!("CUDA ResNet-style training step, batch 256, 32×32×3, {policy}"),
            &cell,
        );
    }
    // The same float32 step on the backend's own convolutions (cuDNN off): im2col and one
    // cuBLAS GEMM each (what cuDNN gains, where it loads), then under a 16 MiB workspace
    // (GEMMs over chunks of images) and none (the direct loops: what the chunks save).
    let cudnn = ferroflow_cuda::cudnn_version().is_ok();
    let workspace = ferroflow_cuda::convolution_workspace_limit();
    ferroflow_cuda::set_cudnn_enabled(false);
    for (plan, limit) in [
        ("im2col + cuBLAS", workspace),
        ("GEMMs over image chunks, 16 MiB workspace", 16 << 20),
        ("direct loops, no workspace", 0),
    ] {
        if limit == workspace && !cudnn {
            // The rows above ran this plan already.
            continue;
        }
        ferroflow_cuda::set_convolution_workspace_limit(limit);
        let own = resnet_samples_per_second(gpu, "float32");
        let cell = match own {
            Ok(r) => format!(
                "{r:.0} samples/s{}",
                float32_rate
                    .map(|f| format!("; the default plan {:.2}× that", f / r))
                    .unwrap_or_default()
            ),
            Err(e) => {
                ok = false;
                format!("error: {e}")
            }
        };
        row(
            &format!("CUDA ResNet-style step, float32, cuDNN off, {plan}"),
            &cell,
        );
    }
    ferroflow_cuda::set_convolution_workspace_limit(workspace);
    ferroflow_cuda::set_cudnn_enabled(true);
    for line in ferroflow_cuda::cudnn_report() {
        row("CUDA convolutions", &line);
    }
    match resnet_device_profile(gpu, 30) {
        Ok(lines) => lines.iter().for_each(|l| println!("profile: {l}")),
        Err(e) => {
            ok = false;
            row("CUDA ResNet-style step profile", &format!("error: {e}"));
        }
    }
    let dir = mnist_dir();
    // The examples' models take f32 pixels in [0, 1] (the main job puts a `Rescaling` in
    // front of them for its u8 pixels).
    let split = |name: &str| -> ferroflow::Result<(Tensor, Tensor)> {
        let (x, y) = ferroflow::data::idx::load_mnist_pixels(&dir, name)?;
        Ok((x.cast(DType::F32)?.div(&Tensor::scalar(255.0f32)?)?, y))
    };
    let data = split("train").and_then(|train| Ok((train, split("t10k")?)));
    let (train, test) = match data {
        Ok(d) => d,
        Err(e) => {
            row("CUDA MNIST", &format!("error: {e}"));
            return false;
        }
    };
    for (kind, policy, goal) in [
        ("mlp", "float32", 0.975),
        ("mlp", "mixed_float16", 0.975),
        ("mlp", "mixed_bfloat16", 0.975),
        ("cnn", "float32", 0.988),
    ] {
        let cell = match mnist_fit(gpu, kind, policy, epochs, &train, &test) {
            Ok((acc, rate)) => {
                let met = acc >= goal || epochs < 3;
                ok &= met;
                format!(
                    "test accuracy {:.2}% (goal {:.1}%: {}), {rate:.0} samples/s",
                    acc * 100.0,
                    goal * 100.0,
                    if met { "met" } else { "NOT met" }
                )
            }
            Err(e) => {
                ok = false;
                format!("error: {e}")
            }
        };
        row(
            &format!("CUDA MNIST {kind} fit, {epochs} epochs, batch 128, {policy}"),
            &cell,
        );
    }
    ok
}
