//! `cargo xtask bench data`: input pipelines against tf.data (xtask/bench/tf_data.py) in the
//! same invocation, plus two figures without a reference: how parallel `map` scales with
//! cores on a CPU-heavy Rust function, and how much of an input-bound training loop the
//! consumer spends waiting, with and without `prefetch`.

use std::collections::BTreeMap;
use std::hint::black_box;
use std::path::Path;
use std::time::{Duration, Instant};

use ferroflow::data::{Dataset, AUTOTUNE};
use ferroflow::{DType, Tensor};

fn median(v: &[f64]) -> f64 {
    let mut v = v.to_vec();
    v.sort_by(f64::total_cmp);
    v[v.len() / 2]
}

/// Elements per second of the second full pass (the first warms caches and allocators).
fn elements_per_second<T: Send + 'static>(ds: &Dataset<T>, n: usize) -> f64 {
    for x in ds.iter() {
        black_box(x.expect("pipeline element"));
    }
    let t = Instant::now();
    for x in ds.iter() {
        black_box(x.expect("pipeline element"));
    }
    n as f64 / t.elapsed().as_secs_f64()
}

/// About `units` x 0.1 ms of single-threaded floating-point work.
fn burn(units: u32, seed: f64) -> f64 {
    let mut x = seed;
    for _ in 0..units * 25_000 {
        x = (x * 1.000_001 + 0.5).sqrt();
    }
    x
}

/// The ops-inside-map function of the tf.data reference: 50 x (sin, multiply).
fn heavy(mut x: Tensor) -> ferroflow::Result<Tensor> {
    let k = x.scalar_like(1.01)?;
    for _ in 0..50 {
        x = x.sin()?.mul(&k)?;
    }
    Ok(x)
}

/// One round of our figures.
fn ours(x: &Tensor, y: &Tensor) -> ferroflow::Result<BTreeMap<&'static str, f64>> {
    let mut out = BTreeMap::new();
    let n = x.shape()[0];
    let ds = Dataset::from_tensor_slices((x.clone(), y.clone()))?
        .shuffle(10_000, Some(1), true)?
        .batch(128, false)?;
    out.insert("data_mnist", elements_per_second(&ds, n));

    let rows = ferroflow::random::stateless_normal(&[2000, 1024], [1, 2], 0.0, 1.0, DType::F32)?;
    let src = Dataset::from_tensor_slices(rows)?;
    out.insert("data_map_seq", elements_per_second(&src.map(heavy), 2000));
    out.insert(
        "data_map_par",
        elements_per_second(&src.map_parallel(heavy, AUTOTUNE, true), 2000),
    );

    // Scaling on a CPU-bound Rust function (about 1 ms per element).
    let items = Dataset::from_generator(|| 0..400u32);
    let f = |i: u32| Ok(burn(10, i as f64));
    out.insert("scale_seq", elements_per_second(&items.map(f), 400));
    for (key, threads) in [("scale_par1", 1usize), ("scale_par2", 2), ("scale_par4", 4)] {
        out.insert(
            key,
            elements_per_second(&items.map_parallel(f, threads, true), 400),
        );
    }
    out.insert(
        "scale_autotune",
        elements_per_second(&items.map_parallel(f, AUTOTUNE, true), 400),
    );

    // An input-bound loop: producing a batch costs ~2 ms, a training step ~3 ms.
    for (key, prefetch) in [("wait_none", false), ("wait_prefetch", true)] {
        let batches = Dataset::from_generator(|| 0..60u32).map(|i| Ok(burn(20, i as f64)));
        let batches = if prefetch {
            batches.prefetch(AUTOTUNE)
        } else {
            batches
        };
        let (mut waited, start) = (Duration::ZERO, Instant::now());
        let mut it = batches.iter();
        loop {
            let t = Instant::now();
            let Some(b) = it.next() else { break };
            waited += t.elapsed();
            black_box(burn(30, b?));
        }
        let total = start.elapsed().as_secs_f64();
        out.insert(key, waited.as_secs_f64() / total);
        out.insert(
            if prefetch {
                "total_prefetch"
            } else {
                "total_none"
            },
            total,
        );
    }
    Ok(out)
}

/// Runs `rounds` interleaved rounds and returns the Markdown table.
pub(crate) fn run(rounds: usize, python: bool) -> String {
    let (x, y) = match crate::bench::mnist_train(60_000) {
        Ok(d) => d,
        Err(e) => return format!("data benchmark: cannot read MNIST: {e}\n"),
    };
    let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("bench/tf_data.py");
    let mnist_dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("../datasets/mnist");
    let mut mine: BTreeMap<&str, Vec<f64>> = BTreeMap::new();
    let mut tf: BTreeMap<String, Vec<f64>> = BTreeMap::new();
    for r in 0..rounds {
        eprintln!("xtask bench: data round {}/{rounds}", r + 1);
        match ours(&x, &y) {
            Ok(m) => m
                .into_iter()
                .for_each(|(k, v)| mine.entry(k).or_default().push(v)),
            Err(e) => eprintln!("xtask bench: data: {e}"),
        }
        if python {
            let dir = mnist_dir.to_string_lossy().to_string();
            for (k, v) in crate::bench::python_figures_with(&script, &[&dir]).unwrap_or_default() {
                tf.entry(k).or_default().push(v);
            }
        }
    }
    let m = |k: &str| mine.get(k).map(|v| median(v)).unwrap_or(f64::NAN);
    let t = |k: &str| tf.get(k).map(|v| median(v));
    let mut md = String::new();
    md.push_str("| pipeline | ferroflow | tf.data | ours / tf.data |\n|---|---|---|---|\n");
    for (key, label) in [
        (
            "data_mnist",
            "MNIST 60k: from_tensor_slices, shuffle(10000), batch(128)",
        ),
        (
            "data_map_seq",
            "map: 50 x (sin, mul) on 1024 floats, sequential",
        ),
        ("data_map_par", "same map, num_parallel_calls=AUTOTUNE"),
    ] {
        let ours_v = m(key);
        let tf_v = t(&format!("{key}_tf"));
        md.push_str(&format!(
            "| {label} | {ours_v:.0} elements/s | {} | {} |\n",
            tf_v.map(|v| format!("{v:.0} elements/s"))
                .unwrap_or_else(|| "n/a".into()),
            tf_v.map(|v| format!("{:.2}x", ours_v / v))
                .unwrap_or_else(|| "n/a".into()),
        ));
    }
    md.push_str(&format!(
        "\n| parallel map, CPU-bound Rust function (~1 ms/element) | elements/s | speed-up over sequential |\n|---|---|---|\n| sequential `map` | {:.0} | 1.00x |\n",
        m("scale_seq")
    ));
    for (key, label) in [
        ("scale_par1", "`map_parallel`, 1 thread"),
        ("scale_par2", "`map_parallel`, 2 threads"),
        ("scale_par4", "`map_parallel`, 4 threads"),
        ("scale_autotune", "`map_parallel`, AUTOTUNE"),
    ] {
        md.push_str(&format!(
            "| {label} | {:.0} | {:.2}x |\n",
            m(key),
            m(key) / m("scale_seq")
        ));
    }
    md.push_str(&format!(
        "\n| input-bound loop: 60 batches, ~2 ms to produce, ~3 ms to consume | consumer waiting | total |\n|---|---|---|\n| no prefetch | {:.0}% | {:.0} ms |\n| prefetch(AUTOTUNE) | {:.1}% | {:.0} ms |\n",
        100.0 * m("wait_none"),
        1e3 * m("total_none"),
        100.0 * m("wait_prefetch"),
        1e3 * m("total_prefetch"),
    ));
    md
}
