//! `cargo xtask bench profiler`: what profiling costs. Training steps of the main job's
//! MNIST CNN (Keras `train_step`, Adam, batch 128) in short blocks, with no profiler and
//! with one running (every op, every allocation, the step markers; the files are written
//! between blocks, untimed), in turn; the overhead is the median of the paired ratios, with
//! a bootstrap interval. TensorFlow's profiler on the same Keras model the same way
//! (`bench/tf_profiler_overhead.py`) where TensorFlow imports, and the interval of the
//! difference of the two overheads (many short pairs: on this shared machine a block's time
//! swings by more than either overhead, and only their number narrows the interval). Also
//! the cost of an inert trace span (what every hook costs while no profiler runs).

use std::collections::BTreeMap;
use std::time::Instant;

use crate::bench::{python_figures_with, Figures};
use crate::bench_distribute::median;
use ferroflow::keras::losses::SparseCategoricalCrossentropy;
use ferroflow::keras::{applications, Model};
use ferroflow::optim::Adam;
use ferroflow::Tensor;

fn cnn() -> ferroflow::Result<Model> {
    let mut model = Model::from(applications::mnist_cnn());
    model.build(&[28, 28, 1])?;
    model.compile(
        Adam::new(1e-3),
        SparseCategoricalCrossentropy::new(true),
        &["accuracy"],
    )?;
    Ok(model)
}

/// Seconds per step of a block of training steps on one batch, with or without a
/// profiler running (its files are written after the timing).
fn block(model: &mut Model, x: &Tensor, y: &Tensor, profiled: bool) -> ferroflow::Result<f64> {
    let dir = std::env::temp_dir().join(format!("ferroflow-bench-profiler-{}", std::process::id()));
    let profile = profiled
        .then(|| ferroflow::profiler::Profile::start(&dir, Default::default()))
        .transpose()?;
    let t0 = Instant::now();
    for step in 0..STEPS_PER_BLOCK as i64 {
        let _step = ferroflow::profiler::Trace::new("train", step);
        model.train_step(std::slice::from_ref(x), std::slice::from_ref(y))?;
    }
    let per_step = t0.elapsed().as_secs_f64() / STEPS_PER_BLOCK as f64;
    if let Some(p) = profile {
        p.finish()?;
    }
    let _ = std::fs::remove_dir_all(&dir);
    Ok(per_step)
}

/// (seconds per op event, seconds per memory event) added by a running profiler, from
/// tiny ops: a `neg` of one element (one op, one allocation) and `reshape` views (one op,
/// no allocation), each off and on in turn, medians of the paired differences.
fn tiny_op_cost() -> Option<(f64, f64)> {
    let dir = std::env::temp_dir().join(format!("ferroflow-bench-tiny-{}", std::process::id()));
    let x = Tensor::ones(&[1], ferroflow::DType::F32).ok()?;
    let time = |alloc: bool, profiled: bool| -> Option<f64> {
        let p = profiled
            .then(|| ferroflow::profiler::Profile::start(&dir, Default::default()).ok())
            .flatten();
        let n = 20_000;
        let t0 = Instant::now();
        for _ in 0..n {
            let y = if alloc { x.neg() } else { x.reshape(&[1]) };
            std::hint::black_box(y.ok()?);
        }
        let t = t0.elapsed().as_secs_f64() / n as f64;
        if let Some(p) = p {
            p.finish().ok()?;
        }
        Some(t)
    };
    let mut view = Vec::new();
    let mut alloc = Vec::new();
    for _ in 0..5 {
        view.push(time(false, true)? - time(false, false)?);
        alloc.push(time(true, true)? - time(true, false)?);
    }
    let _ = std::fs::remove_dir_all(&dir);
    let op = median(&view)?.max(0.0);
    // A `neg` is one op event plus an allocation and a free.
    let mem = ((median(&alloc)? - op) / 2.0).max(0.0);
    Some((op, mem))
}

/// (op events, memory events) of one CNN training step, counted from a profile of 3.
fn step_event_counts(model: &mut Model, x: &Tensor, y: &Tensor) -> Option<(usize, usize)> {
    let dir = std::env::temp_dir().join(format!("ferroflow-bench-count-{}", std::process::id()));
    let p = ferroflow::profiler::Profile::start(&dir, Default::default()).ok()?;
    for _ in 0..3 {
        model
            .train_step(std::slice::from_ref(x), std::slice::from_ref(y))
            .ok()?;
    }
    let files = p.finish().ok()?;
    let space = ferroflow::profiler::read_xspace(&files.xplane).ok()?;
    let _ = std::fs::remove_dir_all(&dir);
    let (mut ops, mut mems) = (0, 0);
    for plane in &space.planes {
        for line in &plane.lines {
            for e in &line.events {
                let name = plane
                    .event_metadata
                    .get(&e.metadata_id)
                    .map_or("", |m| m.name.as_str());
                if name.starts_with("Memory") {
                    mems += 1;
                } else if name.contains(':') {
                    ops += 1;
                }
            }
        }
    }
    Some((ops / 3, mems / 3))
}

/// Pairs of blocks (off, on) per round.
const BLOCKS: usize = 30;
/// Training steps per block.
const STEPS_PER_BLOCK: usize = 4;

/// The 5th and 95th percentiles of `stat` over 2000 bootstrap resamples of `groups` (each
/// resampled on its own, with replacement; a fixed seed, so a run's figures are repeatable):
/// a 90% interval for `stat` of the populations the samples came from.
fn bootstrap_interval(groups: &[&[f64]], stat: impl Fn(&[Vec<f64>]) -> f64) -> Option<(f64, f64)> {
    if groups.iter().any(|g| g.is_empty()) {
        return None;
    }
    let mut state = 0x9E37_79B9_7F4A_7C15u64;
    let mut next = move || {
        // splitmix64
        state = state.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = state;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    };
    let mut stats: Vec<f64> = (0..2000)
        .map(|_| {
            let resampled: Vec<Vec<f64>> = groups
                .iter()
                .map(|g| {
                    (0..g.len())
                        .map(|_| g[(next() % g.len() as u64) as usize])
                        .collect()
                })
                .collect();
            stat(&resampled)
        })
        .collect();
    stats.sort_by(f64::total_cmp);
    Some((stats[100], stats[1899]))
}

pub(crate) fn run(rounds: usize, has_tf: bool, figures: &mut Figures) -> String {
    ferroflow::init();
    let mnist = crate::bench::mnist_dir();
    let setup = || -> ferroflow::Result<(Model, Tensor, Tensor)> {
        let (x, y) = crate::bench::mnist_train(128)?;
        let mut model = cnn()?;
        block(&mut model, &x, &y, false)?; // warm-up
        Ok((model, x, y))
    };
    let (mut model, x, y) = match setup() {
        Ok(s) => s,
        Err(e) => return format!("profiler: could not set up the CNN: {e}\n"),
    };
    let mut series: BTreeMap<&str, Vec<f64>> = BTreeMap::new();
    let script =
        std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("bench/tf_profiler_overhead.py");
    for r in 0..rounds {
        eprintln!("xtask bench profiler: round {}/{rounds}", r + 1);
        // Blocks off and on in turn: the machine's drift falls on both alike; the paired
        // ratios' median is the overhead.
        for b in 0..BLOCKS {
            // Which block of the pair goes first alternates (no position bias).
            let pair = if b % 2 == 0 {
                block(&mut model, &x, &y, false)
                    .and_then(|off| Ok((off, block(&mut model, &x, &y, true)?)))
            } else {
                block(&mut model, &x, &y, true)
                    .and_then(|on| Ok((block(&mut model, &x, &y, false)?, on)))
            };
            let (off, on) = match pair {
                Ok(p) => p,
                Err(e) => return format!("profiler: the profiled steps failed: {e}\n"),
            };
            series.entry("off").or_default().push(off);
            series.entry("on").or_default().push(on);
            series.entry("ratio").or_default().push(on / off - 1.0);
        }
        if has_tf {
            let dir = mnist.to_string_lossy().to_string();
            let (blocks, steps) = (BLOCKS.to_string(), STEPS_PER_BLOCK.to_string());
            let args = [dir.as_str(), "128", blocks.as_str(), steps.as_str()];
            for (k, v) in python_figures_with(&script, &args).unwrap_or_default() {
                let key = match k.as_str() {
                    "tf_cnn_step_off" => "tf off",
                    "tf_cnn_step_on" => "tf on",
                    k if k.starts_with("tf_cnn_pair_") => "tf ratio",
                    _ => continue,
                };
                series.entry(key).or_default().push(v);
            }
        }
    }
    // The profiler's own cost per op, low in noise: a tight loop of tiny ops (each one op
    // event and two memory events) off and on in turn; times the ops and allocations of a
    // CNN step as the profile counts them, over the step's time.
    let per_op = tiny_op_cost();
    let events = step_event_counts(&mut model, &x, &y);
    let step_off = series.get("off").and_then(|v| median(v));
    let derived = per_op
        .zip(events)
        .zip(step_off)
        .map(|((d, (ops, mems)), step)| (ops as f64 * d.0 + mems as f64 * d.1) / step);
    if let Some(v) = derived {
        figures.insert("profiler_overhead".into(), v);
    }
    // An inert span: what a hook costs while no profiler runs.
    let n = 10_000_000u32;
    let t0 = Instant::now();
    for i in 0..n {
        let span = ferroflow::tensor::trace::TraceMe::new("inert");
        std::hint::black_box((&span, i));
    }
    let inert_ns = t0.elapsed().as_secs_f64() * 1e9 / n as f64;
    let get = |k: &str| series.get(k).and_then(|v| median(v));
    let (off, on) = (get("off"), get("on"));
    let (tf_off, tf_on) = (get("tf off"), get("tf on"));
    let (ours, theirs) = (get("ratio"), get("tf ratio"));
    if let (Some(a), Some(b)) = (ours, theirs) {
        // Ratio of overheads; a negative TF overhead (noise) leaves it out.
        if b > 0.0 {
            figures.insert("profiler_overhead_vs_tf".into(), a.max(0.0) / b);
        }
    }
    let pairs = |k: &str| series.get(k).cloned().unwrap_or_default();
    let (ours_pairs, tf_pairs) = (pairs("ratio"), pairs("tf ratio"));
    let of_median = |g: &[Vec<f64>]| median(&g[0]).unwrap_or(f64::NAN);
    let ours_interval = bootstrap_interval(&[&ours_pairs], of_median);
    let tf_interval = bootstrap_interval(&[&tf_pairs], of_median);
    // Ours minus TensorFlow's: at or below 0 at the interval's top, ours is shown ≤ TF's.
    let difference = bootstrap_interval(&[&ours_pairs, &tf_pairs], |g| {
        median(&g[0]).unwrap_or(f64::NAN) - median(&g[1]).unwrap_or(f64::NAN)
    });
    if let Some((_, hi)) = difference {
        figures.insert("profiler_overhead_minus_tf_upper".into(), hi);
    }
    let ms = |v: Option<f64>| v.map_or("n/a".to_string(), |v| format!("{:.2}", v * 1e3));
    let pct = |v: Option<f64>| v.map_or("n/a".to_string(), |v| format!("{:+.1}%", v * 100.0));
    let interval = |v: Option<(f64, f64)>| {
        v.map_or("n/a".to_string(), |(lo, hi)| {
            format!("{:+.1}% to {:+.1}%", lo * 100.0, hi * 100.0)
        })
    };
    let mut md = format!(
        "\n### Profiler overhead (MNIST CNN training step, batch 128; {rounds} rounds of {BLOCKS} pairs of blocks of {STEPS_PER_BLOCK} steps off and on, the first of each pair alternating, medians; overhead: the median of the paired ratios, with its 90% bootstrap interval)\n\n\
         | | ms per step, not profiling | ms per step, profiling | overhead | 90% interval |\n|---|---|---|---|---|\n\
         | ferroflow (every op, every allocation) | {} | {} | {} | {} |\n\
         | TensorFlow (tf.profiler.experimental.start) | {} | {} | {} | {} |\n",
        ms(off), ms(on), pct(ours), interval(ours_interval), ms(tf_off), ms(tf_on), pct(theirs), interval(tf_interval)
    );
    if let Some((lo, hi)) = difference {
        md.push_str(&format!(
            "\nOurs minus TensorFlow's overhead ({} and {} pairs): 90% interval {:+.2} to {:+.2} \
             points; ours ≤ TensorFlow's is {}.\n",
            ours_pairs.len(),
            tf_pairs.len(),
            lo * 100.0,
            hi * 100.0,
            if hi <= 0.0 { "shown" } else { "not shown" }
        ));
    }
    if let (Some((op_ns, mem_ns)), Some((ops, mems)), Some(d)) = (per_op, events, derived) {
        md.push_str(&format!(
            "\nThe profiler's own cost, measured on tiny ops: {:.2} µs per op event, {:.2} µs per \
             memory event; a CNN step has {ops} ops and {mems} allocations and frees, so \
             profiling costs {:.2}% of its {:.2} ms (the wall-clock pairs above swing by more \
             than that on this shared machine).\n",
            op_ns * 1e6,
            mem_ns * 1e6,
            d * 100.0,
            get("off").unwrap_or(0.0) * 1e3
        ));
    }
    md.push_str(&format!(
        "\nAn inert trace span (no profiler running): {inert_ns:.2} ns.\n"
    ));
    if !has_tf {
        md.push_str(
            "\n(TensorFlow is not importable: `pip install tensorflow-cpu` for its row.)\n",
        );
    }
    md
}

/// The steps of both workers (`STEP <end ns> <duration ns>` lines of the capture bench's
/// output).
fn step_lines(output: &str) -> Vec<(u128, u128)> {
    output
        .lines()
        .filter_map(|l| {
            let mut w = l.strip_prefix("STEP ")?.split_whitespace();
            Some((w.next()?.parse().ok()?, w.next()?.parse().ok()?))
        })
        .collect()
}

fn now_ns() -> u128 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_nanos())
}

/// Captures per round, each after a quiet stretch of the same length.
const CAPTURES_PER_ROUND: usize = 3;

/// One round of the capture section: 2 workers of `capture_bench` (the MNIST MLP under
/// MultiWorkerMirroredStrategy) with profiler servers; after a second of warm-up, three
/// times: 2 s of quiet training, then a 2 s capture from both. Returns, per capture, the
/// median step time (s) of both workers in the quiet 2 s before it, during it, and in the
/// second after it (from 0.3 s past the capture's return, when the workers have sent their
/// profiles): each capture compared with its own neighbours, so the machine's drift cancels.
fn capture_round(worker: &std::path::Path) -> Result<Vec<(f64, f64, f64)>, String> {
    use ferroflow::cluster::{LaunchSpec, LocalCluster};
    let mut cluster = LocalCluster::start(&LaunchSpec {
        workers: 2,
        program: worker.to_string_lossy().into_owned(),
        args: vec!["--steps".into(), "12000".into()],
        profile_ports: true,
        ..Default::default()
    })
    .map_err(|e| e.to_string())?;
    let end = Instant::now() + std::time::Duration::from_secs(180);
    while !(0..2).all(|i| cluster.output(i).contains("training")) {
        if Instant::now() > end || (0..2).any(|i| cluster.try_code(i).ok().flatten().is_some()) {
            return Err(format!(
                "the workers did not start training:\n{}",
                cluster.output(0)
            ));
        }
        std::thread::sleep(std::time::Duration::from_millis(50));
    }
    std::thread::sleep(std::time::Duration::from_secs(1));
    let addrs: Vec<String> = cluster
        .profiler_addresses()
        .into_iter()
        .map(|(_, a)| format!("grpc://{a}"))
        .collect();
    let dir = std::env::temp_dir().join(format!("ferroflow-bench-capture-{}", std::process::id()));
    // (quiet from, capture call, capture returned), ns since the epoch.
    let mut windows = Vec::new();
    for _ in 0..CAPTURES_PER_ROUND {
        let quiet = now_ns();
        std::thread::sleep(std::time::Duration::from_secs(2));
        let t0 = now_ns();
        let capture =
            ferroflow::profiler::client::trace(&addrs.join(","), &dir, 2000, 1, Default::default());
        let t1 = now_ns();
        let _ = std::fs::remove_dir_all(&dir);
        let capture = capture.map_err(|e| e.to_string())?;
        if capture.profiles.len() != 2 {
            return Err(format!("{} profiles captured", capture.profiles.len()));
        }
        windows.push((quiet, t0, t1));
        std::thread::sleep(std::time::Duration::from_millis(1300));
    }
    let outcome = cluster
        .wait(Some(std::time::Duration::from_secs(300)))
        .map_err(|e| e.to_string())?;
    if let Some((task, code)) = outcome.first_failure {
        return Err(format!("{task} failed with {code}"));
    }
    let steps: Vec<(u128, u128)> = (0..2)
        .flat_map(|i| step_lines(&cluster.output(i)))
        .collect();
    let within = |from: u128, to: u128| -> Vec<f64> {
        steps
            .iter()
            .filter(|(end, dur)| end.saturating_sub(*dur) >= from && *end <= to)
            .map(|(_, d)| *d as f64 / 1e9)
            .collect()
    };
    windows
        .into_iter()
        .map(|(quiet, t0, t1)| {
            // The capture records from 0.2 s after the call (the common start) for 2 s.
            let before = within(quiet, t0);
            let during = within(t0 + 250_000_000, t0 + 2_200_000_000);
            let after = within(t1 + 300_000_000, t1 + 1_300_000_000);
            match (median(&before), median(&during), median(&after)) {
                (Some(b), Some(d), Some(a)) => Ok((b, d, a)),
                _ => Err(format!(
                    "too few steps: {} before, {} during, {} after a capture (the workers \
                     finished early?)",
                    before.len(),
                    during.len(),
                    after.len()
                )),
            }
        })
        .collect()
}

/// The capture section: what a 2 s on-demand capture costs two training workers, during and
/// after it (issue #22's goal: ≤ 5% during, nothing after).
pub(crate) fn capture_section(rounds: usize, figures: &mut Figures) -> String {
    let target = std::env::var("CARGO_TARGET_DIR").map_or_else(
        |_| std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../target"),
        std::path::PathBuf::from,
    );
    let build = [
        "build",
        "--quiet",
        "--release",
        "-p",
        "ferroflow-profiler",
        "--example",
        "capture_bench",
    ];
    if !crate::run("cargo", &build) {
        return "profiler capture: the benchmark worker did not build\n".into();
    }
    let worker = target.join("release/examples/capture_bench");
    let mut rows = Vec::new();
    for r in 0..rounds {
        eprintln!("xtask bench profiler: capture round {}/{rounds}", r + 1);
        match capture_round(&worker) {
            Ok(round) => rows.extend(round),
            Err(e) => return format!("profiler capture: {e}\n"),
        }
    }
    let during: Vec<f64> = rows.iter().map(|(b, d, _)| d / b - 1.0).collect();
    let after: Vec<f64> = rows.iter().map(|(b, _, a)| a / b - 1.0).collect();
    let (d, a) = (
        median(&during).unwrap_or(f64::NAN),
        median(&after).unwrap_or(f64::NAN),
    );
    figures.insert("profiler_capture_slowdown".into(), d);
    figures.insert("profiler_after_capture_slowdown".into(), a);
    let mut md = format!(
        "\n### On-demand capture (2 workers of the MNIST MLP under MultiWorkerMirroredStrategy, batch 64 each, on this machine; {rounds} rounds of {CAPTURES_PER_ROUND} cycles of 2 s of training then a 2 s capture of both with `profiler::client::trace`; step-time medians of both workers in the quiet 2 s before each capture, during it, and in the second after it; slowdowns: the medians of the per-capture ratios)\n\n\
         | capture | ms per step before | during the capture | after it | slowdown during | after |\n|---|---|---|---|---|---|\n"
    );
    for (i, (b, d, a)) in rows.iter().enumerate() {
        md.push_str(&format!(
            "| {} | {:.2} | {:.2} | {:.2} | {:+.1}% | {:+.1}% |\n",
            i + 1,
            b * 1e3,
            d * 1e3,
            a * 1e3,
            (d / b - 1.0) * 100.0,
            (a / b - 1.0) * 100.0
        ));
    }
    md.push_str(&format!(
        "| median | | | | {:+.1}% | {:+.1}% |\n",
        d * 100.0,
        a * 100.0
    ));
    md
}
