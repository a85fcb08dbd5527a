//! `cargo xtask bench data-service`: the tf.data service, ours and TensorFlow's in the same
//! run, rounds interleaved, medians of the rounds. MNIST's training split in batches of 128
//! read in process and through the service from 1 and 2 worker processes on loopback
//! (`data/examples/service_bench.rs`, `bench/tf_data_service.py` where TensorFlow imports).

use std::collections::BTreeMap;
use std::path::Path;
use std::process::Command;

use crate::bench::Figures;
use crate::bench_distribute::{build_release_bench, median};

pub(crate) fn run(rounds: usize, has_tf: bool, figures: &mut Figures) -> String {
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("..");
    let Some((binary, bench)) =
        build_release_bench("ferroflow-data", "service_bench", &["service"])
    else {
        return "data-service: the servers or the benchmark did not build\n".into();
    };
    let binary = binary.to_string_lossy().to_string();
    let mnist = crate::bench::mnist_dir().to_string_lossy().to_string();
    let tf_script = root.join("xtask/bench/tf_data_service.py");
    let mut series: BTreeMap<String, Vec<f64>> = BTreeMap::new();
    for r in 0..rounds {
        eprintln!("xtask bench data-service: round {}/{rounds}", r + 1);
        let ours = crate::bench_distribute::figures_of(
            Command::new(&bench).args([&binary, &mnist]),
            "our tf.data service benchmark",
        );
        for (k, v) in ours.unwrap_or_default() {
            series.entry(k).or_default().push(v);
        }
        if has_tf {
            for (k, v) in
                crate::bench::python_figures_with(&tf_script, &[&mnist]).unwrap_or_default()
            {
                series.entry(k).or_default().push(v);
            }
        }
    }
    let get = |k: &str| series.get(k).and_then(|v| median(v));
    let cell =
        |v: Option<f64>, digits: usize| v.map_or("n/a".to_string(), |v| format!("{v:.digits$}"));
    let (local, local_tf) = (get("ds_local_rate"), get("ds_local_rate_tf"));
    let mut md = format!(
        "\n### tf.data service (MNIST train, batches of 128, dispatcher and workers as local processes; {rounds} rounds, medians)\n\n\
         | batches/s | ours | ours / in process | TensorFlow | TensorFlow / in process | ours / TensorFlow |\n|---|---|---|---|---|---|\n\
         | in process | {} | 1.00 | {} | 1.00 | {} |\n",
        cell(local, 0),
        cell(local_tf, 0),
        cell(local.zip(local_tf).map(|(a, b)| a / b), 2),
    );
    let rows = [
        ("ds_rate_1", "1 worker, distributed epoch (snappy)"),
        (
            "ds_rate_1_none",
            "1 worker, distributed epoch (no compression)",
        ),
        ("ds_rate_1_parallel", "1 worker, parallel epochs (snappy)"),
        ("ds_rate_2", "2 workers, distributed epoch (snappy)"),
        (
            "ds_rate_2_none",
            "2 workers, distributed epoch (no compression)",
        ),
    ];
    for (key, what) in rows {
        let (ours, tf) = (get(key), get(&format!("{key}_tf")));
        let of_local = ours.zip(local).map(|(a, b)| a / b);
        let ratio = ours.zip(tf).map(|(a, b)| a / b);
        if let Some(v) = of_local {
            figures.insert(format!("data_service_{}_vs_local", &key[3..]), v);
        }
        if let Some(v) = ratio {
            figures.insert(format!("data_service_{}_vs_tf", &key[3..]), v);
        }
        md.push_str(&format!(
            "| {what} | {} | {} | {} | {} | {} |\n",
            cell(ours, 0),
            cell(of_local, 2),
            cell(tf, 0),
            cell(tf.zip(local_tf).map(|(a, b)| a / b), 2),
            cell(ratio, 2)
        ));
    }
    md.push_str(&format!(
        "\nTime to the first batch (the job created, the workers told, the pipeline built): ours {} / {} s with 1 / 2 workers, TensorFlow {} / {} s.\n",
        cell(get("ds_first_1"), 2),
        cell(get("ds_first_2"), 2),
        cell(get("ds_first_1_tf"), 2),
        cell(get("ds_first_2_tf"), 2),
    ));
    if !has_tf {
        md.push_str(
            "\n(TensorFlow is not importable: `pip install tensorflow-cpu` for its columns.)\n",
        );
    }
    md
}
