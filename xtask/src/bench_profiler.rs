//! `cargo xtask bench profiler`: what profiling costs. Training steps of the main job's
//! MNIST CNN (Keras `train_step`, Adam, batch 128) in blocks of 20, with no profiler and with
//! one running (every op, every allocation, the step markers; the files are written between
//! blocks, untimed), in turn; the overhead is the median of the paired ratios. TensorFlow's
//! profiler on the same Keras model the same way (`bench/tf_profiler_overhead.py`) where
//! TensorFlow imports. Also the cost of an inert trace span (what every hook costs while no
//! profiler runs).

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

const BLOCKS: usize = 6;
const STEPS_PER_BLOCK: usize = 20;

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
            let n = "128".to_string();
            let dir = mnist.to_string_lossy().to_string();
            for (k, v) in python_figures_with(&script, &[&dir, &n]).unwrap_or_default() {
                let key = match k.as_str() {
                    "tf_cnn_step_off" => "tf off",
                    "tf_cnn_step_on" => "tf on",
                    _ => "tf ratio",
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
    let ms = |v: Option<f64>| v.map_or("n/a".to_string(), |v| format!("{:.2}", v * 1e3));
    let pct = |v: Option<f64>| v.map_or("n/a".to_string(), |v| format!("{:+.1}%", v * 100.0));
    let mut md = format!(
        "\n### Profiler overhead (MNIST CNN training step, batch 128; {rounds} rounds of {BLOCKS} blocks of {STEPS_PER_BLOCK} steps off and on in turn, the first of each pair alternating, medians; overhead: the median of the paired ratios)\n\n\
         | | ms per step, not profiling | ms per step, profiling | overhead |\n|---|---|---|---|\n\
         | ferroflow (every op, every allocation) | {} | {} | {} |\n\
         | TensorFlow (tf.profiler.experimental.start) | {} | {} | {} |\n",
        ms(off), ms(on), pct(ours), ms(tf_off), ms(tf_on), pct(theirs)
    );
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
