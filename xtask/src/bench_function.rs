//! `cargo xtask bench function`: graph functions (#24). The MLP training step (forward and
//! backward of 784-256-128-10 at batch 32, `bench::MlpProblem`) eagerly and as a
//! `Function`, in turn, against TensorFlow's `tf.function` and `jit_compile=True` (XLA)
//! from `bench/tf_mlp_step.py` in the same rounds; Keras `fit` on MNIST with the steps as
//! graphs (the default) and eagerly; the ops one Keras MLP train step dispatches each way;
//! per-example gradients of the MLP for 128 examples by a loop and by `vectorized_map`
//! (and TensorFlow's loop and `tf.vectorized_map`, `bench/tf_per_example.py`).

use std::collections::BTreeMap;
use std::hint::black_box;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;

use crate::bench::{median_time, python_figures_with, Figures, MlpProblem};
use crate::bench_distribute::median;
use ferroflow::function::Function;
use ferroflow::Tensor;

const STEPS: usize = 200;

/// Seconds per step of the MLP problem: eagerly, as a traced function, and with the
/// forward (the loss) as a traced function under a tape outside it (the call one op on the
/// tape, its gradient the compiled backward graph).
fn mlp_steps(
    p: &MlpProblem,
    f: &Function<'_>,
    forward: &Function<'_>,
) -> ferroflow::Result<(f64, f64, f64)> {
    let args = [p.x.clone(), p.y.clone()];
    f.call(&args)?; // traced once, before timing
    forward.call(&args)?;
    let sources = p.sources();
    let outside = || -> ferroflow::Result<Vec<Option<Tensor>>> {
        let tape = ferroflow::autodiff::GradientTape::new();
        let loss = forward.call(&args)?;
        tape.gradient(&loss[0], &sources)
    };
    outside()?; // the backward graph traced once, before timing
    let eager = median_time(
        || {
            for _ in 0..STEPS {
                black_box(p.step(&p.x, &p.y).expect("eager step"));
            }
        },
        5,
    ) / STEPS as f64;
    let graph = median_time(
        || {
            for _ in 0..STEPS {
                black_box(f.call(&args).expect("graph step"));
            }
        },
        5,
    ) / STEPS as f64;
    let tape_outside = median_time(
        || {
            for _ in 0..STEPS {
                black_box(outside().expect("forward graph under a tape"));
            }
        },
        5,
    ) / STEPS as f64;
    Ok((eager, graph, tape_outside))
}

/// Examples in the per-example gradient figures.
const PER_EXAMPLE: usize = 128;

/// Seconds for the MLP's weight gradients of each of 128 examples: a loop over the examples
/// (each a batch of one, eagerly: the Python-loop-style version) and `vectorized_map`.
fn per_example_gradients(p: &MlpProblem) -> ferroflow::Result<(f64, f64)> {
    let xs = ferroflow::random::stateless_normal(
        &[PER_EXAMPLE, 784],
        [17, 0],
        0.0,
        1.0,
        ferroflow::DType::F32,
    )?;
    let labels = ferroflow::random::stateless_uniform(
        &[PER_EXAMPLE],
        [18, 0],
        0.0,
        10.0,
        ferroflow::DType::I32,
    )?;
    let ys = Tensor::one_hot(&labels, 10, 1.0, 0.0, ferroflow::DType::F32)?;
    let rows: Vec<(Tensor, Tensor)> = (0..PER_EXAMPLE)
        .map(|i| {
            let i = Tensor::scalar(i as i32)?;
            Ok((xs.gather(&i, 0)?, ys.gather(&i, 0)?))
        })
        .collect::<ferroflow::Result<_>>()?;
    let one = |x: &Tensor, y: &Tensor| p.step(&x.expand_dims(0)?, &y.expand_dims(0)?);
    let looped = median_time(
        || {
            // Kept, as the loop's user keeps them (TF's loop builds the same list).
            let all: Vec<Vec<Tensor>> = rows
                .iter()
                .map(|(x, y)| one(x, y).expect("per-example step"))
                .collect();
            black_box(all);
        },
        3,
    );
    let mapped = median_time(
        || {
            black_box(
                ferroflow::function::vectorized_map(
                    |e| one(&e[0], &e[1]),
                    &[xs.clone(), ys.clone()],
                )
                .expect("vectorized_map"),
            );
        },
        5,
    );
    Ok((looped, mapped))
}

/// Counts the ops this thread dispatches.
struct OpCounter(AtomicUsize);
impl ferroflow::OpObserver for OpCounter {
    fn on_op(&self, _event: &ferroflow::OpEvent<'_>) {
        self.0.fetch_add(1, Ordering::Relaxed);
    }
}

/// Ops one Keras train step of the MNIST MLP dispatches (optimizer and metrics included),
/// eagerly and as a graph.
fn keras_step_ops(run_eagerly: bool) -> ferroflow::Result<usize> {
    let (x, y) = crate::bench::mnist_train(32)?;
    let mut model = crate::bench::mnist_model("mlp", run_eagerly)?;
    for _ in 0..3 {
        model.train_step(std::slice::from_ref(&x), std::slice::from_ref(&y))?;
    }
    let counter = Arc::new(OpCounter(AtomicUsize::new(0)));
    let guard = ferroflow::push_thread_observer(counter.clone());
    model.train_step(std::slice::from_ref(&x), std::slice::from_ref(&y))?;
    drop(guard);
    Ok(counter.0.load(Ordering::Relaxed))
}

pub(crate) fn run(rounds: usize, has_tf: bool, figures: &mut Figures) -> String {
    ferroflow::init();
    let problem = match MlpProblem::new() {
        Ok(p) => p,
        Err(e) => return format!("function: could not set up the MLP: {e}\n"),
    };
    let f = Function::new(|a: &[Tensor]| problem.step(&a[0], &a[1])).with_name("mlp_step");
    let forward =
        Function::new(|a: &[Tensor]| Ok(vec![problem.loss(&a[0], &a[1])?])).with_name("mlp_loss");
    let script = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("bench/tf_mlp_step.py");
    let mut series: BTreeMap<&str, Vec<f64>> = BTreeMap::new();
    const CNN_SAMPLES: usize = 10_000;
    for r in 0..rounds {
        eprintln!("xtask bench function: round {}/{rounds}", r + 1);
        match mlp_steps(&problem, &f, &forward) {
            Ok((eager, graph, outside)) => {
                series.entry("eager").or_default().push(eager);
                series.entry("graph").or_default().push(graph);
                series.entry("tape outside").or_default().push(outside);
            }
            Err(e) => return format!("function: the MLP step failed: {e}\n"),
        }
        match per_example_gradients(&problem) {
            Ok((looped, mapped)) => {
                series.entry("per-example loop").or_default().push(looped);
                series.entry("per-example vmap").or_default().push(mapped);
            }
            Err(e) => eprintln!("xtask bench function: per-example gradients: {e}"),
        }
        if has_tf {
            let per_example_script =
                std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("bench/tf_per_example.py");
            for (k, v) in python_figures_with(&per_example_script, &[]).unwrap_or_default() {
                match k.as_str() {
                    "per_example_tf_loop" => {
                        series.entry("per-example tf loop").or_default().push(v)
                    }
                    "per_example_tf_pfor" => {
                        series.entry("per-example tf pfor").or_default().push(v)
                    }
                    _ => {}
                }
            }
            for (k, v) in python_figures_with(&script, &[]).unwrap_or_default() {
                let key = match k.as_str() {
                    "mlp_step_tf_eager" => "tf eager",
                    "mlp_step_tf_function" => "tf function",
                    "mlp_step_tf_xla" => "tf xla",
                    _ => continue,
                };
                series.entry(key).or_default().push(v);
            }
        }
        for (kind, n) in [("mlp", 60_000), ("cnn", CNN_SAMPLES)] {
            for (eagerly, key) in [(false, "graph"), (true, "eager")] {
                match crate::bench::keras_fit_with(kind, n, eagerly) {
                    Ok(v) => series
                        .entry(match (kind, key) {
                            ("mlp", "graph") => "fit mlp graph",
                            ("mlp", _) => "fit mlp eager",
                            (_, "graph") => "fit cnn graph",
                            _ => "fit cnn eager",
                        })
                        .or_default()
                        .push(v),
                    Err(e) => eprintln!("xtask bench function: keras {kind}: {e}"),
                }
            }
        }
        if has_tf {
            let dir = crate::bench::mnist_dir().to_string_lossy().to_string();
            let keras_script =
                std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("bench/tf_keras_mnist.py");
            for (k, v) in python_figures_with(&keras_script, &[&dir, &CNN_SAMPLES.to_string()])
                .unwrap_or_default()
            {
                match k.as_str() {
                    "keras_mlp_tf" => series.entry("fit mlp tf").or_default().push(v),
                    "keras_cnn_tf" => series.entry("fit cnn tf").or_default().push(v),
                    _ => {}
                }
            }
        }
    }
    let get = |k: &str| series.get(k).and_then(|v| median(v));
    let ratio = |a: Option<f64>, b: Option<f64>| a.zip(b).map(|(a, b)| a / b);
    let step_vs_fn = ratio(get("graph"), get("tf function"));
    let step_vs_xla = ratio(get("graph"), get("tf xla"));
    let fit_vs_tf = ratio(get("fit mlp graph"), get("fit mlp tf"));
    let cnn_graph_vs_eager = ratio(get("fit cnn graph"), get("fit cnn eager"));
    let vmap_speedup = ratio(get("per-example loop"), get("per-example vmap"));
    for (name, v) in [
        ("function_mlp_step_vs_tf_function", step_vs_fn),
        ("function_mlp_step_vs_tf_xla", step_vs_xla),
        ("function_keras_mlp_vs_tf", fit_vs_tf),
        ("function_keras_cnn_graph_vs_eager", cnn_graph_vs_eager),
        ("function_vectorized_map_vs_loop", vmap_speedup),
    ] {
        if let Some(v) = v {
            figures.insert(name.into(), v);
        }
    }
    let ops = (keras_step_ops(true).ok(), keras_step_ops(false).ok());
    let stats = f
        .get_concrete_function(&[problem.x.clone(), problem.y.clone()])
        .map(|c| c.stats().clone());
    let us = |v: Option<f64>| v.map_or("n/a".into(), |v| format!("{:.1}", v * 1e6));
    let x = |v: Option<f64>| v.map_or("n/a".into(), |v| format!("{v:.2}×"));
    let sps = |v: Option<f64>| v.map_or("n/a".into(), |v| format!("{v:.0}"));
    let mut md = format!(
        "\n### Graph functions (#24; {rounds} rounds, medians; ours and TensorFlow's in turn)\n\n\
         MLP 784-256-128-10, batch 32, forward and backward under a tape (µs per step; \
         \"forward `Function`, tape outside\": the loss traced, the tape around the call, \
         which it records as one op with a compiled backward graph):\n\n\
         | ferroflow eager | ferroflow `Function` | ferroflow forward `Function`, tape outside | TF eager | TF `tf.function` | TF `jit_compile=True` | ours (graph) / tf.function | ours (graph) / XLA |\n\
         |---|---|---|---|---|---|---|---|\n\
         | {} | {} | {} | {} | {} | {} | {} | {} |\n\n",
        us(get("eager")),
        us(get("graph")),
        us(get("tape outside")),
        us(get("tf eager")),
        us(get("tf function")),
        us(get("tf xla")),
        x(step_vs_fn),
        x(step_vs_xla),
    );
    if let Ok(s) = stats {
        md.push_str(&format!(
            "The traced step: {} nodes recorded, {} folded, {} merged, {} dead; {} ops per call; \
             intermediate values at most {:.1} KiB alive at once.\n\n",
            s.traced_nodes,
            s.folded,
            s.merged,
            s.dead,
            s.ops,
            s.peak_bytes as f64 / 1024.0
        ));
    }
    md.push_str(&format!(
        "Keras `fit` on MNIST, batch 128, samples/s (second epoch):\n\n\
         | model | graphs (default) | `run_eagerly` | TensorFlow Keras | graphs / TF | graphs / eager |\n|---|---|---|---|---|---|\n\
         | MLP (60 000 samples) | {} | {} | {} | {} | {} |\n\
         | CNN ({CNN_SAMPLES} samples) | {} | {} | {} | {} | {} |\n\n",
        sps(get("fit mlp graph")),
        sps(get("fit mlp eager")),
        sps(get("fit mlp tf")),
        x(fit_vs_tf),
        x(ratio(get("fit mlp graph"), get("fit mlp eager"))),
        sps(get("fit cnn graph")),
        sps(get("fit cnn eager")),
        sps(get("fit cnn tf")),
        x(ratio(get("fit cnn graph"), get("fit cnn tf"))),
        x(cnn_graph_vs_eager),
    ));
    md.push_str(&format!(
        "Ops one Keras MLP train step dispatches (batch 32; optimizer and metrics included): \
         eagerly {}, as a graph {}.\n",
        ops.0.map_or("n/a".into(), |v| v.to_string()),
        ops.1.map_or("n/a".into(), |v| v.to_string())
    ));
    let ms = |v: Option<f64>| v.map_or("n/a".into(), |v| format!("{:.1}", v * 1e3));
    md.push_str(&format!(
        "\nPer-example gradients of the same MLP for {PER_EXAMPLE} examples (ms; each example \
         a batch of one):\n\n\
         | ferroflow loop | ferroflow `vectorized_map` | loop / vectorized_map | TF loop (eager) | TF `vectorized_map` in `tf.function` | TF loop / pfor | ours (vectorized_map) / TF pfor |\n\
         |---|---|---|---|---|---|---|\n\
         | {} | {} | {} | {} | {} | {} | {} |\n",
        ms(get("per-example loop")),
        ms(get("per-example vmap")),
        x(vmap_speedup),
        ms(get("per-example tf loop")),
        ms(get("per-example tf pfor")),
        x(ratio(get("per-example tf loop"), get("per-example tf pfor"))),
        x(ratio(get("per-example vmap"), get("per-example tf pfor"))),
    ));
    if !has_tf {
        md.push_str(
            "\n(TensorFlow is not importable: `pip install tensorflow-cpu` for its columns.)\n",
        );
    }
    md
}
