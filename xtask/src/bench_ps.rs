//! `cargo xtask bench ps`: parameter-server training, ours and TensorFlow's in the same run,
//! rounds interleaved, medians of the rounds:
//!
//! - steps/s of the MNIST MLP (Adam, batch 128 per step) scheduled by a chief on 1, 2 and 4
//!   local workers with 2 parameter servers: ours (`distribute/examples/ps_bench.rs`, started
//!   by `ferroflow launch --chief --workers N --ps 2`) against TensorFlow's
//!   `ParameterServerStrategy` + `ClusterCoordinator` on the same processes
//!   (`bench/tf_ps_mnist.py`, where TensorFlow imports);
//! - our scheduling round trip (an empty function scheduled and fetched, one at a time),
//!   against a bare TCP round trip between two processes measured in the same process in
//!   interleaved blocks (the floor under it on this machine), and push/pull of a 1 MiB
//!   variable between the chief and a ps.

use std::collections::BTreeMap;
use std::path::Path;

use crate::bench::Figures;
use crate::bench_distribute::{build_release_bench, figures_of, launch_job, median};

const WORKERS: [usize; 3] = [1, 2, 4];
const STEPS: &str = "400";

pub(crate) fn run(rounds: usize, has_tf: bool, figures: &mut Figures) -> String {
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("..");
    let Some((launcher, program)) = build_release_bench("ferroflow-distribute", "ps_bench", &[])
    else {
        return "ps: the launcher or the benchmark tasks did not build\n".into();
    };
    let program = program.to_string_lossy().to_string();
    let mnist = crate::bench::mnist_dir().to_string_lossy().to_string();
    let tf_script = root.join("xtask/bench/tf_ps_mnist.py");
    // "ours N ps_steps" / "tf N ps_tf_steps" / "ours N ps_roundtrip" ... → per-round values
    let mut series: BTreeMap<String, Vec<f64>> = BTreeMap::new();
    for r in 0..rounds {
        eprintln!("xtask bench ps: round {}/{rounds}", r + 1);
        for n in WORKERS {
            let workers = n.to_string();
            let ours = figures_of(
                &mut launch_job(
                    &launcher,
                    &["--chief", "--workers", &workers, "--ps", "2"],
                    &[&program, &mnist, STEPS],
                ),
                &format!("our parameter-server job, {n} workers"),
            );
            for (k, v) in ours.unwrap_or_default() {
                series.entry(format!("ours {n} {k}")).or_default().push(v);
            }
            if has_tf {
                let tf = crate::bench::python_figures_with(&tf_script, &[&mnist, &workers, STEPS]);
                for (k, v) in tf.unwrap_or_default() {
                    series.entry(format!("tf {n} {k}")).or_default().push(v);
                }
            }
        }
    }
    let get = |k: &str| series.get(k).and_then(|v| median(v));
    let cell =
        |v: Option<f64>, digits: usize| v.map_or("n/a".to_string(), |v| format!("{v:.digits$}"));
    let mut md = format!(
        "\n### Parameter-server training (chief + N workers + 2 ps, local processes; {rounds} rounds, medians)\n\n\
         | MNIST MLP, batch 128 per step | ours steps/s | TensorFlow steps/s | ours / TensorFlow |\n|---|---|---|---|\n"
    );
    for n in WORKERS {
        let (ours, tf) = (
            get(&format!("ours {n} ps_steps")),
            get(&format!("tf {n} ps_tf_steps")),
        );
        let ratio = ours.zip(tf).map(|(a, b)| a / b);
        if let Some(v) = ratio {
            figures.insert(format!("ps_steps_vs_tf_{n}_workers"), v);
        }
        md.push_str(&format!(
            "| {n} worker{} | {} | {} | {} |\n",
            if n == 1 { "" } else { "s" },
            cell(ours, 0),
            cell(tf, 0),
            cell(ratio, 2)
        ));
    }
    let roundtrip = get("ours 1 ps_roundtrip").map(|s| s * 1e6);
    let tcp = get("ours 1 ps_tcp_roundtrip").map(|s| s * 1e6);
    let over_tcp = roundtrip.zip(tcp).map(|(a, b)| a / b);
    let push = get("ours 1 ps_push").map(|b| b / 1e9);
    let pull = get("ours 1 ps_pull").map(|b| b / 1e9);
    if let Some(v) = roundtrip {
        figures.insert("ps_roundtrip_us".into(), v);
    }
    if let Some(v) = over_tcp {
        figures.insert("ps_roundtrip_vs_tcp".into(), v);
    }
    if let Some(v) = push {
        figures.insert("ps_push_1mib_gbps".into(), v);
    }
    if let Some(v) = pull {
        figures.insert("ps_pull_1mib_gbps".into(), v);
    }
    md.push_str(&format!(
        "\nOurs, 1 worker: an empty scheduled function's round trip {} µs, {}× a bare TCP round \
         trip between two processes ({} µs, measured beside it); a 1 MiB variable pushed \
         to a ps at {} GB/s, pulled at {} GB/s.\n",
        cell(roundtrip, 0),
        cell(over_tcp, 2),
        cell(tcp, 0),
        cell(push, 2),
        cell(pull, 2)
    ));
    if !has_tf {
        md.push_str(
            "\n(TensorFlow is not importable: `pip install tensorflow-cpu tf_keras` for its column.)\n",
        );
    }
    md
}
