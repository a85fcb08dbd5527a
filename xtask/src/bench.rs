//! Kernel benchmarks against NumPy, measured in one invocation: for each round the Rust side
//! runs every kernel, then the NumPy script does; each figure is the median over rounds of
//! each side's median-of-repeats. Ratios > 1 mean ferroflow is faster.

use ferroflow::autodiff::{GradientTape, Source};
use ferroflow::optim::{Adam, Optimizer};
use ferroflow::{Axes, DType, Tensor, Variable};
use std::collections::BTreeMap;
use std::hint::black_box;
use std::path::Path;
use std::process::Command;
use std::time::Instant;

/// Named figures of one run (ratios), for `bench --check` against `xtask/bench/goals.csv`.
pub(crate) type Figures = BTreeMap<String, f64>;

pub(crate) fn median_time(mut f: impl FnMut(), repeats: usize) -> f64 {
    f();
    let mut t: Vec<f64> = (0..repeats)
        .map(|_| {
            let s = Instant::now();
            f();
            s.elapsed().as_secs_f64()
        })
        .collect();
    t.sort_by(f64::total_cmp);
    t[t.len() / 2]
}

fn randn(n: usize, seed: u64) -> Tensor {
    ferroflow::random::stateless_normal(&[n], [seed, 0], 0.0, 1.0, DType::F32)
        .expect("random tensor")
}

/// One round of ferroflow timings, in seconds.
fn ours() -> BTreeMap<String, f64> {
    let mut out = BTreeMap::new();
    for n in [256usize, 512, 1024, 2048] {
        let a = randn(n * n, 1).reshape_to(&[n, n]).expect("reshape");
        let b = randn(n * n, 2).reshape_to(&[n, n]).expect("reshape");
        let reps = if n <= 1024 { 9 } else { 5 };
        out.insert(
            format!("matmul_{n}"),
            median_time(|| drop(black_box(a.matmul(&b).expect("matmul"))), reps),
        );
    }
    for (size, label) in [(1usize << 20, "1M"), (1 << 24, "16M")] {
        let x = randn(size, 3);
        let y = randn(size, 4);
        let reps = if size == 1 << 20 { 21 } else { 7 };
        out.insert(
            format!("add_{label}"),
            median_time(|| drop(black_box(x.add(&y).expect("add"))), reps),
        );
        out.insert(
            format!("exp_{label}"),
            median_time(|| drop(black_box(x.exp().expect("exp"))), reps),
        );
        out.insert(
            format!("sum_{label}"),
            median_time(
                || drop(black_box(x.reduce_sum(0, false).expect("sum"))),
                reps,
            ),
        );
        out.insert(
            format!("argmax_{label}"),
            median_time(|| drop(black_box(x.argmax(0).expect("argmax"))), reps),
        );
        out.insert(
            format!("cumsum_{label}"),
            median_time(
                || drop(black_box(x.cumsum(0, false, false).expect("cumsum"))),
                reps,
            ),
        );
    }
    let (p, q) = (
        Tensor::from_slice(&[1.0f32]).expect("t"),
        Tensor::from_slice(&[1.0f32]).expect("t"),
    );
    let per = median_time(
        || {
            for _ in 0..10_000 {
                black_box(p.add(&q).expect("add"));
            }
        },
        7,
    ) / 10_000.0;
    out.insert("dispatch_add_1".into(), per);
    out
}

/// Forward + backward of an MLP 784-256-128-10 on a batch of 32 under a GradientTape (the
/// same computation as `bench/tf_mlp_step.py`): the data and weights.
pub(crate) struct MlpProblem {
    pub(crate) x: Tensor,
    pub(crate) y: Tensor,
    ws: Vec<Variable>,
    bs: Vec<Variable>,
}

impl MlpProblem {
    pub(crate) fn new() -> ferroflow::Result<MlpProblem> {
        let x = ferroflow::random::stateless_normal(&[32, 784], [7, 0], 0.0, 1.0, DType::F32)?;
        let labels = ferroflow::random::stateless_uniform(&[32], [8, 0], 0.0, 10.0, DType::I32)?;
        let y = Tensor::one_hot(&labels, 10, 1.0, 0.0, DType::F32)?;
        let sizes = [(784usize, 256usize), (256, 128), (128, 10)];
        let ws = sizes
            .iter()
            .enumerate()
            .map(|(i, &(a, b))| {
                let w = ferroflow::random::stateless_normal(
                    &[a, b],
                    [i as u64, 9],
                    0.0,
                    0.05,
                    DType::F32,
                )?;
                Ok(Variable::new(format!("w{i}"), w))
            })
            .collect::<ferroflow::Result<_>>()?;
        let bs = sizes
            .iter()
            .enumerate()
            .map(|(i, &(_, b))| {
                Ok(Variable::new(
                    format!("b{i}"),
                    Tensor::zeros(&[b], DType::F32)?,
                ))
            })
            .collect::<ferroflow::Result<_>>()?;
        Ok(MlpProblem { x, y, ws, bs })
    }

    /// The weights, as gradient sources.
    pub(crate) fn sources(&self) -> Vec<Source> {
        self.ws.iter().chain(&self.bs).map(Source::from).collect()
    }

    /// The mean cross-entropy of `x` against one-hot `y`.
    pub(crate) fn loss(&self, x: &Tensor, y: &Tensor) -> ferroflow::Result<Tensor> {
        let (ws, bs) = (&self.ws, &self.bs);
        let h = x.matmul(&ws[0].value())?.add(&bs[0].value())?.relu()?;
        let h = h.matmul(&ws[1].value())?.add(&bs[1].value())?.relu()?;
        let logits = h.matmul(&ws[2].value())?.add(&bs[2].value())?;
        y.mul(&logits.log_softmax(-1)?)?
            .reduce_sum(-1, false)?
            .neg()?
            .reduce_mean(Axes::All, false)
    }

    /// The gradients of [`MlpProblem::loss`].
    pub(crate) fn step(&self, x: &Tensor, y: &Tensor) -> ferroflow::Result<Vec<Tensor>> {
        let tape = GradientTape::new();
        let loss = self.loss(x, y)?;
        Ok(tape
            .gradient(&loss, &self.sources())?
            .into_iter()
            .flatten()
            .collect())
    }
}

/// Median per-step time of [`MlpProblem::step`], eagerly.
fn mlp_step() -> f64 {
    let p = MlpProblem::new().expect("the MLP problem");
    let steps = 200;
    median_time(
        || {
            for _ in 0..steps {
                black_box(p.step(&p.x, &p.y).expect("mlp step"));
            }
        },
        5,
    ) / steps as f64
}

/// (Adam step over 10M f32 parameters in seconds, the memory-bandwidth floor for it in
/// seconds): the floor is the bytes an ideal step moves (read w, g, m, v; write w, m, v) over
/// the copy bandwidth measured now (a 40 MB copy reads and writes 40 MB).
fn adam_vs_floor() -> (f64, f64) {
    let n = 10_000_000usize;
    let w = Variable::new(
        "w",
        ferroflow::random::stateless_normal(&[n], [1, 1], 0.0, 1.0, DType::F32).expect("w"),
    );
    let g = ferroflow::random::stateless_normal(&[n], [2, 2], 0.0, 1.0, DType::F32).expect("g");
    let mut opt = Adam::new(0.001);
    let adam = median_time(
        || {
            opt.apply_gradients(vec![(Some(g.clone()), w.clone())], true)
                .expect("adam step")
        },
        9,
    );
    let src: Vec<f32> = vec![1.0; n];
    let mut dst: Vec<f32> = vec![0.0; n];
    let copy = median_time(
        || {
            dst.copy_from_slice(black_box(&src));
            black_box(&dst);
        },
        9,
    );
    let bandwidth = 2.0 * 4.0 * n as f64 / copy;
    let floor = 7.0 * 4.0 * n as f64 / bandwidth;
    (adam, floor)
}

/// Times every epoch of a `fit` (the benchmarks report the second: the first warms up).
pub(crate) struct EpochTimer(
    pub(crate) std::sync::Arc<std::sync::Mutex<Vec<f64>>>,
    pub(crate) Instant,
);

impl EpochTimer {
    /// The seconds of the last epoch timed into `times` (NaN before any).
    pub(crate) fn last_seconds(times: &std::sync::Mutex<Vec<f64>>) -> f64 {
        times
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .last()
            .copied()
            .unwrap_or(f64::NAN)
    }
}

impl ferroflow::keras::callbacks::Callback for EpochTimer {
    fn on_epoch_begin(
        &mut self,
        _e: usize,
        _m: &mut ferroflow::keras::Model,
    ) -> ferroflow::Result<()> {
        self.1 = Instant::now();
        Ok(())
    }
    fn on_epoch_end(
        &mut self,
        _e: usize,
        _l: &ferroflow::keras::Logs,
        _m: &mut ferroflow::keras::Model,
    ) -> ferroflow::Result<()> {
        self.0
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .push(self.1.elapsed().as_secs_f64());
        Ok(())
    }
}

/// The repository's MNIST copy: beside the sources that built this binary, else
/// `datasets/mnist` under the current directory (a prebuilt binary run from a checkout).
pub(crate) fn mnist_dir() -> std::path::PathBuf {
    let built = Path::new(env!("CARGO_MANIFEST_DIR")).join("../datasets/mnist");
    if built.exists() {
        built
    } else {
        Path::new("datasets/mnist").to_path_buf()
    }
}

/// The first `n` MNIST training images as f32 in [0, 1], `[n, 28, 28, 1]`, and their labels
/// as int64.
pub(crate) fn mnist_train(n: usize) -> ferroflow::Result<(Tensor, Tensor)> {
    let dir = mnist_dir();
    let images = ferroflow::data::idx::read(dir.join("train-images-idx3-ubyte.gz"))?;
    let labels = ferroflow::data::idx::read(dir.join("train-labels-idx1-ubyte.gz"))?;
    let x = images
        .slice(&[0, 0, 0], &[n as isize, 28, 28])?
        .cast(DType::F32)?
        .div(&Tensor::scalar(255.0f32)?)?
        .reshape_to(&[n, 28, 28, 1])?;
    Ok((x, labels.slice(&[0], &[n as isize])?.cast(DType::I64)?))
}

/// Samples per second of Keras `fit` on MNIST for the examples' MLP and CNN: two epochs on
/// the first `n` training images, the second epoch timed (as `bench/tf_keras_mnist.py`).
pub(crate) fn keras_fit(kind: &str, n: usize) -> ferroflow::Result<f64> {
    keras_fit_with(kind, n, false)
}

/// The examples' MNIST model (`"mlp"` or `"cnn"`) compiled as the main job compiles it
/// (Adam 1e-3, sparse categorical cross-entropy on logits, accuracy), its steps run eagerly
/// or as graphs.
pub(crate) fn mnist_model(
    kind: &str,
    run_eagerly: bool,
) -> ferroflow::Result<ferroflow::keras::Model> {
    use ferroflow::keras::losses::SparseCategoricalCrossentropy;
    use ferroflow::keras::{applications, Model};
    let net = if kind == "mlp" {
        applications::mnist_mlp()
    } else {
        applications::mnist_cnn()
    };
    let mut model = Model::from(net);
    model.compile(
        ferroflow::optim::Adam::new(1e-3),
        SparseCategoricalCrossentropy::new(true),
        &["accuracy"],
    )?;
    model.set_run_eagerly(run_eagerly);
    Ok(model)
}

/// [`keras_fit`], the steps run eagerly or as graphs.
pub(crate) fn keras_fit_with(kind: &str, n: usize, run_eagerly: bool) -> ferroflow::Result<f64> {
    use ferroflow::keras::FitConfig;
    use std::sync::{Arc, Mutex};
    let (x, y) = mnist_train(n)?;
    let mut model = mnist_model(kind, run_eagerly)?;
    let times = Arc::new(Mutex::new(vec![]));
    model.fit(
        &x,
        &y,
        FitConfig::new()
            .epochs(2)
            .batch_size(128)
            .verbose(0)
            .callback(EpochTimer(times.clone(), Instant::now())),
    )?;
    let t = *times.lock().unwrap().last().unwrap_or(&f64::NAN);
    Ok(n as f64 / t)
}

fn python_figures(script: &Path) -> Option<BTreeMap<String, f64>> {
    python_figures_with(script, &[])
}

pub(crate) fn python_figures_with(script: &Path, args: &[&str]) -> Option<BTreeMap<String, f64>> {
    let o = Command::new("python3")
        .arg(script)
        .args(args)
        .output()
        .ok()?;
    if !o.status.success() {
        eprintln!(
            "xtask bench: {} failed: {}",
            script.display(),
            String::from_utf8_lossy(&o.stderr)
        );
        return None;
    }
    Some(
        String::from_utf8_lossy(&o.stdout)
            .lines()
            .filter_map(|l| {
                let (k, v) = l.split_once(' ')?;
                Some((k.to_string(), v.trim().parse().ok()?))
            })
            .collect(),
    )
}

/// Peak f32 FMA throughput of this machine (all threads), in GFLOP/s: independent AVX2 FMA
/// chains, enough of them to cover the latency.
fn fma_peak_gflops() -> Option<f64> {
    #[cfg(target_arch = "x86_64")]
    {
        if !(is_x86_feature_detected!("avx2") && is_x86_feature_detected!("fma")) {
            return None;
        }
        #[target_feature(enable = "avx2,fma")]
        unsafe fn chains(iters: usize) -> f32 {
            use std::arch::x86_64::*;
            let mut acc = [_mm256_set1_ps(0.0); 12];
            let (m, a) = (_mm256_set1_ps(0.999_999), _mm256_set1_ps(1e-7));
            for _ in 0..iters {
                for r in acc.iter_mut() {
                    *r = _mm256_fmadd_ps(*r, m, a);
                }
            }
            let mut s = 0.0;
            for r in acc {
                let mut v = [0f32; 8];
                _mm256_storeu_ps(v.as_mut_ptr(), r);
                s += v.iter().sum::<f32>();
            }
            s
        }
        let threads = std::thread::available_parallelism()
            .map(|n| n.get())
            .unwrap_or(1);
        let iters = 20_000_000usize;
        let start = Instant::now();
        let handles: Vec<_> = (0..threads)
            .map(|_| {
                std::thread::spawn(move || {
                    // SAFETY: features checked above.
                    unsafe { chains(iters) }
                })
            })
            .collect();
        for h in handles {
            black_box(h.join().ok()?);
        }
        let flops = (threads * iters * 12 * 8 * 2) as f64;
        Some(flops / start.elapsed().as_secs_f64() / 1e9)
    }
    #[cfg(not(target_arch = "x86_64"))]
    None
}

fn median(v: &[f64]) -> f64 {
    let mut v = v.to_vec();
    v.sort_by(f64::total_cmp);
    v[v.len() / 2]
}

fn load() -> String {
    std::fs::read_to_string("/proc/loadavg")
        .map(|s| s.split_whitespace().take(3).collect::<Vec<_>>().join(" "))
        .unwrap_or_else(|_| "unknown".into())
}

pub(crate) fn run(args: &[String]) -> bool {
    ferroflow::init();
    let only = args
        .first()
        .map(String::as_str)
        .filter(|a| !a.starts_with("--"));
    let (do_kernels, do_autodiff, do_keras) = (
        only.is_none() || only == Some("kernels"),
        only.is_none() || only == Some("autodiff"),
        only.is_none() || only == Some("keras"),
    );
    let check = args.iter().any(|a| a == "--check");
    let mut figures = Figures::new();
    let rounds: usize = args
        .iter()
        .position(|a| a == "--rounds")
        .and_then(|i| args.get(i + 1))
        .and_then(|v| v.parse().ok())
        .unwrap_or(3)
        .max(1);
    let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("bench/numpy_kernels.py");
    let has_numpy = Command::new("python3")
        .args(["-c", "import numpy"])
        .status()
        .map(|s| s.success())
        .unwrap_or(false);
    if !has_numpy {
        eprintln!("xtask bench: numpy is not importable; install it with `pip install numpy` for the reference column");
    }
    let load_before = load();
    let mut mine: BTreeMap<String, Vec<f64>> = BTreeMap::new();
    let mut theirs: BTreeMap<String, Vec<f64>> = BTreeMap::new();
    for r in (0..rounds).filter(|_| do_kernels) {
        eprintln!("xtask bench: round {}/{rounds}", r + 1);
        for (k, v) in ours() {
            mine.entry(k).or_default().push(v);
        }
        if has_numpy {
            for (k, v) in python_figures(&script).unwrap_or_default() {
                theirs.entry(k).or_default().push(v);
            }
        }
    }
    // Autodiff: an MLP training step against TensorFlow eager and tf.function.
    let tf_script = Path::new(env!("CARGO_MANIFEST_DIR")).join("bench/tf_mlp_step.py");
    let has_tf = Command::new("python3")
        .args(["-c", "import tensorflow"])
        .output()
        .map(|o| o.status.success())
        .unwrap_or(false);
    if !has_tf {
        eprintln!("xtask bench: tensorflow is not importable; `pip install tensorflow-cpu` for the autodiff reference");
    }
    let (mut mlp, mut tf_eager, mut tf_fn) = (vec![], vec![], vec![]);
    for r in (0..rounds).filter(|_| do_autodiff) {
        eprintln!("xtask bench: autodiff round {}/{rounds}", r + 1);
        mlp.push(mlp_step());
        if has_tf {
            if let Some(m) = python_figures(&tf_script) {
                tf_eager.extend(m.get("mlp_step_tf_eager"));
                tf_fn.extend(m.get("mlp_step_tf_function"));
            }
        }
    }
    // Keras fit on MNIST against TensorFlow's Keras, interleaved.
    const CNN_SAMPLES: usize = 10_000;
    let keras_script = Path::new(env!("CARGO_MANIFEST_DIR")).join("bench/tf_keras_mnist.py");
    let mnist_dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("../datasets/mnist");
    let mut keras: BTreeMap<&str, (Vec<f64>, Vec<f64>)> = BTreeMap::new();
    for r in (0..rounds).filter(|_| do_keras) {
        eprintln!("xtask bench: keras round {}/{rounds}", r + 1);
        for (kind, n) in [("mlp", 60_000), ("cnn", CNN_SAMPLES)] {
            match keras_fit(kind, n) {
                Ok(v) => keras.entry(kind).or_default().0.push(v),
                Err(e) => eprintln!("xtask bench: keras {kind}: {e}"),
            }
        }
        if has_tf {
            let dir = mnist_dir.to_string_lossy().to_string();
            let n = CNN_SAMPLES.to_string();
            for (k, v) in python_figures_with(&keras_script, &[&dir, &n]).unwrap_or_default() {
                if let Some(kind) = k.strip_prefix("keras_").and_then(|k| k.strip_suffix("_tf")) {
                    let kind = if kind == "mlp" { "mlp" } else { "cnn" };
                    keras.entry(kind).or_default().1.push(v);
                }
            }
        }
    }
    // The main job's peak resident memory, one model per process (the example reports it).
    let peak_rss: BTreeMap<&str, f64> = if do_keras
        && crate::run(
            "cargo",
            &["build", "--quiet", "--release", "--example", "mnist"],
        ) {
        let target = std::env::var("CARGO_TARGET_DIR").unwrap_or_else(|_| "target".into());
        let out_dir =
            std::env::temp_dir().join(format!("ferroflow-bench-mnist-{}", std::process::id()));
        let peaks = ["mlp", "cnn"]
            .into_iter()
            .filter_map(|kind| {
                let o = Command::new(format!("{target}/release/examples/mnist"))
                    .args([kind, "--epochs", "1", "--out"])
                    .arg(&out_dir)
                    .output()
                    .ok()?;
                let text = String::from_utf8_lossy(&o.stdout);
                let mib = text
                    .lines()
                    .find_map(|l| l.strip_prefix("peak resident memory: "))?
                    .trim_end_matches(" MiB")
                    .parse()
                    .ok()?;
                Some((kind, mib))
            })
            .collect();
        let _ = std::fs::remove_dir_all(&out_dir);
        peaks
    } else {
        BTreeMap::new()
    };
    let adam = if only.is_none() || only == Some("optim") {
        let runs: Vec<(f64, f64)> = (0..rounds).map(|_| adam_vs_floor()).collect();
        Some((
            median(&runs.iter().map(|r| r.0).collect::<Vec<_>>()),
            median(&runs.iter().map(|r| r.1).collect::<Vec<_>>()),
        ))
    } else {
        None
    };
    let mixed_table = (only.is_none() || only == Some("mixed"))
        .then(|| crate::bench_mixed::run(rounds, &mut figures));
    let numpy_table = (only.is_none() || only == Some("numpy"))
        .then(|| crate::bench_numpy::run(rounds, has_numpy));
    let distribute_table = (only.is_none() || only == Some("distribute"))
        .then(|| crate::bench_distribute::run(rounds, has_tf, &mut figures));
    let ps_table = (only.is_none() || only == Some("ps"))
        .then(|| crate::bench_ps::run(rounds, has_tf, &mut figures));
    // `profiler-capture`: only the on-demand capture's part of the profiler section.
    let profiler_table = (only.is_none() || matches!(only, Some("profiler" | "profiler-capture")))
        .then(|| {
            let mut md = String::new();
            if only != Some("profiler-capture") {
                md.push_str(&crate::bench_profiler::run(rounds, has_tf, &mut figures));
            }
            md.push_str(&crate::bench_profiler::capture_section(
                rounds,
                &mut figures,
            ));
            md
        });
    let function_table = (only.is_none() || only == Some("function"))
        .then(|| crate::bench_function::run(rounds, has_tf, &mut figures));
    let data_service_table = (only.is_none() || only == Some("data-service"))
        .then(|| crate::bench_data_service::run(rounds, has_tf, &mut figures));
    let data_table = (only.is_none() || only == Some("data")).then(|| {
        let has_tf_data = has_tf;
        crate::bench_data::run(rounds, has_tf_data)
    });
    let peak = fma_peak_gflops();
    let mut md = String::new();
    md.push_str(&format!(
        "machine: {} cores, load average before {load_before}, after {}; rounds: {rounds}; FMA peak (f32, AVX2, all cores): {}\n\n",
        std::thread::available_parallelism().map(|n| n.get()).unwrap_or(1),
        load(),
        peak.map(|p| format!("{p:.0} GFLOP/s")).unwrap_or_else(|| "n/a".into())
    ));
    if do_kernels {
        md.push_str(
            "| kernel | ferroflow | NumPy | ratio (NumPy time / ours) |\n|---|---|---|---|\n",
        );
    }
    let mut csv = String::from("kernel,ferroflow_seconds,numpy_seconds,ratio\n");
    let order: Vec<String> = mine.keys().cloned().collect();
    for k in order {
        let ours_s = median(&mine[&k]);
        let np = theirs.get(&k).map(|v| median(v));
        let fmt = |s: f64| -> String {
            if let Some(n) = k
                .strip_prefix("matmul_")
                .and_then(|n| n.parse::<f64>().ok())
            {
                format!("{:.1} GFLOP/s", 2.0 * n * n * n / s / 1e9)
            } else if k.starts_with("dispatch") {
                format!("{:.3} µs", s * 1e6)
            } else {
                format!("{:.3} ms", s * 1e3)
            }
        };
        let ratio = np.map(|n| n / ours_s);
        md.push_str(&format!(
            "| {k} | {} | {} | {} |\n",
            fmt(ours_s),
            np.map(fmt).unwrap_or_else(|| "n/a".into()),
            ratio
                .map(|r| format!("{r:.2}x"))
                .unwrap_or_else(|| "n/a".into())
        ));
        csv.push_str(&format!(
            "{k},{ours_s:.9e},{},{}\n",
            np.map(|n| format!("{n:.9e}")).unwrap_or_default(),
            ratio.map(|r| format!("{r:.3}")).unwrap_or_default()
        ));
    }
    if do_autodiff {
        let ours_step = if mlp.is_empty() {
            f64::NAN
        } else {
            median(&mlp)
        };
        md.push_str("\n| MLP 784-256-128-10, batch 32, forward + backward | per step | ours / it |\n|---|---|---|\n");
        md.push_str(&format!(
            "| ferroflow GradientTape | {:.1} µs | 1.00 |\n",
            ours_step * 1e6
        ));
        csv.push_str(&format!("mlp_step_ferroflow,{ours_step:.9e},,\n"));
        for (name, v) in [
            ("TensorFlow tf.function", &tf_fn),
            ("TensorFlow eager", &tf_eager),
        ] {
            if v.is_empty() {
                md.push_str(&format!("| {name} | n/a | n/a |\n"));
            } else {
                let t = median(v);
                md.push_str(&format!(
                    "| {name} | {:.1} µs | {:.2} |\n",
                    t * 1e6,
                    ours_step / t
                ));
                let key = if name.ends_with("eager") {
                    "eager"
                } else {
                    "function"
                };
                figures.insert(format!("mlp_step_vs_tf_{key}"), ours_step / t);
                csv.push_str(&format!("mlp_step_{},{t:.9e},,\n", name.replace(' ', "_")));
            }
        }
    }
    if do_keras {
        md.push_str(
            "\n| Keras fit, MNIST, batch 128, Adam (2nd epoch) | ferroflow | TensorFlow Keras | ours / TF |\n|---|---|---|---|\n",
        );
        for (kind, label) in [
            ("mlp", "MLP 784-256-128-10, 60k samples"),
            ("cnn", "CNN C32-P-C64-P-D128-D10, 10k samples"),
        ] {
            let (ours_v, tf_v) = keras.get(kind).cloned().unwrap_or_default();
            let o = (!ours_v.is_empty()).then(|| median(&ours_v));
            let t = (!tf_v.is_empty()).then(|| median(&tf_v));
            let f = |v: Option<f64>| {
                v.map(|v| format!("{v:.0} samples/s"))
                    .unwrap_or_else(|| "n/a".into())
            };
            md.push_str(&format!(
                "| {label} | {} | {} | {} |\n",
                f(o),
                f(t),
                o.zip(t)
                    .map(|(o, t)| format!("{:.2}x", o / t))
                    .unwrap_or_else(|| "n/a".into())
            ));
            if let Some((o, t)) = o.zip(t) {
                figures.insert(format!("keras_{kind}_vs_tf"), o / t);
            }
            csv.push_str(&format!(
                "keras_{kind},{},{},{}\n",
                o.map(|v| format!("{v:.6e}")).unwrap_or_default(),
                t.map(|v| format!("{v:.6e}")).unwrap_or_default(),
                o.zip(t)
                    .map(|(o, t)| format!("{:.3}", o / t))
                    .unwrap_or_default()
            ));
        }
    }
    if do_keras {
        md.push_str("\n| main job, 1 epoch (`examples/mnist <model>`) | peak resident memory |\n|---|---|\n");
        for kind in ["mlp", "cnn"] {
            let v = peak_rss.get(kind).copied();
            md.push_str(&format!(
                "| {kind} | {} |\n",
                v.map_or("n/a".to_string(), |v| format!("{v:.0} MiB"))
            ));
            if let Some(v) = v {
                figures.insert(format!("main_job_peak_mib_{kind}"), v);
            }
        }
    }
    if let Some((step, floor)) = adam {
        figures.insert("adam_floor_fraction".into(), floor / step);
        md.push_str(&format!(
            "\n| Adam step, 10M f32 parameters | time | memory-bandwidth floor | floor / time |\n|---|---|---|---|\n| fused kernel | {:.2} ms | {:.2} ms | {:.2} |\n",
            step * 1e3,
            floor * 1e3,
            floor / step
        ));
        csv.push_str(&format!(
            "adam_10M,{step:.9e},{floor:.9e},{:.3}\n",
            floor / step
        ));
    }
    if let Some(t) = mixed_table {
        md.push('\n');
        md.push_str(&t);
    }
    if let Some(t) = numpy_table {
        md.push('\n');
        md.push_str(&t);
    }
    if let Some(t) = data_table {
        md.push('\n');
        md.push_str(&t);
    }
    if let Some(t) = data_service_table {
        md.push('\n');
        md.push_str(&t);
    }
    if let Some(t) = distribute_table {
        md.push('\n');
        md.push_str(&t);
    }
    if let Some(t) = ps_table {
        md.push('\n');
        md.push_str(&t);
    }
    if let Some(t) = profiler_table {
        md.push('\n');
        md.push_str(&t);
    }
    if let Some(t) = function_table {
        md.push('\n');
        md.push_str(&t);
    }
    let _ = std::fs::create_dir_all("bench-out");
    let _ = std::fs::write("bench-out/kernels.csv", &csv);
    let _ = std::fs::write("bench-out/kernels.md", &md);
    println!("{md}");
    !check || check_goals(&figures)
}

/// Compares the run's figures with the goals in `xtask/bench/goals.csv` (`figure,op,goal,
/// what`), printing met / not met for each; `false` when a measured goal is not met.
/// Goals whose figure this run did not measure (no TensorFlow, another `bench` section)
/// are listed as not measured.
fn check_goals(figures: &Figures) -> bool {
    let path = Path::new(env!("CARGO_MANIFEST_DIR")).join("bench/goals.csv");
    let text = match std::fs::read_to_string(&path) {
        Ok(t) => t,
        Err(e) => {
            eprintln!("xtask bench --check: {}: {e}", path.display());
            return false;
        }
    };
    let mut all_met = true;
    println!("| goal | figure | this run | verdict |\n|---|---|---|---|");
    for line in text.lines().skip(1).filter(|l| !l.trim().is_empty()) {
        let cols: Vec<&str> = line.splitn(4, ',').collect();
        let [figure, op, goal, what] = cols[..] else {
            eprintln!("xtask bench --check: bad line in goals.csv: {line}");
            return false;
        };
        let Ok(goal) = goal.parse::<f64>() else {
            eprintln!("xtask bench --check: bad goal in goals.csv: {line}");
            return false;
        };
        let verdict = match (figures.get(figure), op) {
            (None, _) => "not measured".to_string(),
            (Some(&v), ">=") if v >= goal => format!("{v:.3}: met"),
            (Some(&v), "<=") if v <= goal => format!("{v:.3}: met"),
            (Some(&v), ">=" | "<=") => {
                all_met = false;
                format!("{v:.3}: NOT MET")
            }
            (Some(_), other) => {
                eprintln!("xtask bench --check: unknown comparison {other:?} in goals.csv");
                return false;
            }
        };
        println!("| {what} | {figure} {op} {goal} | {verdict} |");
    }
    all_met
}
