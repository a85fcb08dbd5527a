//! `cargo xtask bench numpy`: the NumPy API (`ferroflow::numpy`) against NumPy on a 1M
//! float64 vector and a 1000×1000 float64 matrix: sum, mean over axis 0, exp, clip, dot,
//! argmax, sort, cumsum, and the FFT (complex and real input; the matrix row by row). Each round runs ours, then `bench/numpy_api.py`; figures are the
//! median over rounds of each side's median of repeats.

use std::collections::BTreeMap;
use std::hint::black_box;
use std::path::Path;

use ferroflow::numpy as np;
use ferroflow::{DType, Tensor};

use crate::bench::{median_time, python_figures_with};

fn median(v: &[f64]) -> f64 {
    let mut v = v.to_vec();
    v.sort_by(f64::total_cmp);
    v[v.len() / 2]
}

fn ours() -> ferroflow::Result<BTreeMap<String, f64>> {
    let mut out = BTreeMap::new();
    let vec = ferroflow::random::stateless_normal(&[1 << 20], [1, 0], 0.0, 1.0, DType::F64)?;
    let mat = ferroflow::random::stateless_normal(&[1000, 1000], [2, 0], 0.0, 1.0, DType::F64)?;
    for (label, x) in [("vec1M", &vec), ("mat1000", &mat)] {
        let reps = 11;
        let mut time = |name: &str,
                        reps: usize,
                        f: &dyn Fn() -> ferroflow::Result<Tensor>|
         -> ferroflow::Result<()> {
            f()?;
            out.insert(
                format!("{name}_{label}"),
                median_time(|| drop(black_box(f().expect("checked above"))), reps),
            );
            Ok(())
        };
        time("sum", reps, &|| np::sum(x))?;
        time("mean_axis0", reps, &|| {
            np::mean_with(x, np::ReduceArgs::new().axis(0))
        })?;
        time("exp", reps, &|| np::exp(x))?;
        time("clip", reps, &|| np::clip(x, -0.5, 0.5))?;
        time("dot", if x.rank() == 2 { 5 } else { reps }, &|| {
            np::dot(x, x)
        })?;
        time("argmax", reps, &|| np::argmax(x, None))?;
        time("sort", 5, &|| np::sort(x, Some(-1)))?;
        time("cumsum", reps, &|| np::cumsum(x, Some(0)))?;
        time("fft", 5, &|| np::fft::fft(x))?;
        time("rfft", 5, &|| np::fft::rfft(x))?;
    }
    Ok(out)
}

/// Runs the rounds and returns the markdown table.
pub(crate) fn run(rounds: usize, has_numpy: bool) -> String {
    let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("bench/numpy_api.py");
    let mut mine: BTreeMap<String, Vec<f64>> = BTreeMap::new();
    let mut theirs: BTreeMap<String, Vec<f64>> = BTreeMap::new();
    for r in 0..rounds {
        eprintln!("xtask bench: numpy API round {}/{rounds}", r + 1);
        match ours() {
            Ok(m) => m
                .into_iter()
                .for_each(|(k, v)| mine.entry(k).or_default().push(v)),
            Err(e) => eprintln!("xtask bench: numpy API: {e}"),
        }
        if has_numpy {
            for (k, v) in python_figures_with(&script, &[]).unwrap_or_default() {
                theirs.entry(k).or_default().push(v);
            }
        }
    }
    let mut md = String::from(
        "| NumPy API, float64 | ferroflow | NumPy | ratio (NumPy time / ours) |\n|---|---|---|---|\n",
    );
    for (k, v) in &mine {
        let o = median(v);
        let t = theirs.get(k).map(|v| median(v));
        md.push_str(&format!(
            "| {k} | {:.3} ms | {} | {} |\n",
            o * 1e3,
            t.map(|t| format!("{:.3} ms", t * 1e3))
                .unwrap_or_else(|| "n/a".into()),
            t.map(|t| format!("{:.2}x", t / o))
                .unwrap_or_else(|| "n/a".into())
        ));
    }
    md
}
