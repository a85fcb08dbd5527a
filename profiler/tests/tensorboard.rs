//! A profiled Keras `fit` of the main job's MNIST CNN, read back with TensorBoard's own
//! readers: the event files with `tensorboard`'s accumulators (every scalar compared), the
//! XSpace converted by `xprof` (TensorBoard's profile plugin) to the trace viewer, overview
//! page, framework op stats, input-pipeline analysis and memory profile. Skips loudly when
//! python3 lacks them; `FERROFLOW_REQUIRE_TENSORBOARD=1` (CI) makes that a failure.

use ferroflow::data::Dataset;
use ferroflow::keras::callbacks::{TensorBoard, UpdateFreq};
use ferroflow::keras::losses::SparseCategoricalCrossentropy;
use ferroflow::keras::{applications, FitConfig, Model};
use ferroflow::optim::Adam;
use ferroflow::profiler;
use ferroflow::Tensor;
use std::path::Path;
use std::process::Command;
use std::sync::Mutex;
use std::time::Duration;

static ONE_AT_A_TIME: Mutex<()> = Mutex::new(());

fn has_tensorboard() -> bool {
    let ok = Command::new("python3")
        .args(["-c", "import tensorboard, xprof.convert.raw_to_tool_data"])
        .status()
        .is_ok_and(|s| s.success());
    if !ok {
        ferroflow::tensor::testing::skip(
            "FERROFLOW_REQUIRE_TENSORBOARD",
            "python3 with tensorboard and xprof is not installed (pip install tensorboard xprof; .ci/run does)",
        );
    }
    ok
}

fn check_with_tensorboard(logdir: &Path, expected: serde_json::Value) {
    let spec = logdir.join("expected.json");
    std::fs::write(&spec, expected.to_string()).unwrap();
    let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/tensorboard_check.py");
    let out = Command::new("python3")
        .arg(&script)
        .arg(logdir)
        .arg(&spec)
        .output()
        .unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    println!("{stdout}");
    assert!(
        out.status.success(),
        "TensorBoard's readers disagree:\n{stdout}\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
}

fn mnist(n: usize) -> (Tensor, Tensor) {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("../datasets/mnist");
    let (x, y) = ferroflow::data::idx::load_mnist(dir, "t10k").unwrap();
    let first = |t: &Tensor| {
        let mut size = vec![-1isize; t.rank()];
        size[0] = n as isize;
        t.slice(&vec![0; t.rank()], &size).unwrap()
    };
    (first(&x), first(&y))
}

/// The main job's network (`applications::mnist_cnn` or `mnist_mlp`), built and compiled.
fn compiled(network: ferroflow::keras::Sequential) -> Model {
    let mut model = Model::from(network);
    model.build(&[28, 28, 1]).unwrap();
    model
        .compile(
            Adam::new(1e-3),
            SparseCategoricalCrossentropy::new(true),
            &["accuracy"],
        )
        .unwrap();
    model
}

#[test]
fn a_profiled_cnn_fit_opens_in_tensorboard() {
    ferroflow::init();
    let _g = ONE_AT_A_TIME.lock().unwrap_or_else(|e| e.into_inner());
    let dir = tempfile::tempdir().unwrap();
    let (x, y) = mnist(768);
    let (vx, vy) = mnist(256);
    let mut model = compiled(applications::mnist_cnn());
    let tb = TensorBoard::new(dir.path())
        .update_freq(UpdateFreq::Batches(2))
        .histogram_freq(1)
        .profile_batch(3, 6)
        .unwrap();
    let history = model
        .fit(
            &x,
            &y,
            FitConfig::new()
                .epochs(2)
                .batch_size(128)
                .verbose(0)
                .validation_data(vx, vy)
                .callback(tb),
        )
        .unwrap();

    // Our own reader first: the profile holds the 4 profiled steps and the CNN's ops.
    let (_, planes) = profiler::latest_profile(dir.path().join("train")).unwrap();
    let summary = profiler::summarize(&profiler::read_xspace(&planes[0]).unwrap());
    assert_eq!(
        summary.steps.len(),
        4,
        "batches 3..=6 profiled: {:?}",
        summary.steps
    );
    let types: Vec<&str> = summary.ops.iter().map(|o| o.op_type.as_str()).collect();
    // The graph step joins each max pooling to the convolution below it.
    for op in [
        "_FusedConv2DMaxPool",
        "MatMul",
        "_FusedMaxPoolGradBiasAddGrad",
        "Conv2DBackpropFilter",
        "ResourceApplyAdam",
    ] {
        assert!(
            types.contains(&op),
            "{op} missing from the op table: {types:?}"
        );
    }
    // Layer names are unique per process (`sequential_2/conv2d_5` when other tests built
    // models first).
    assert!(
        summary
            .ops
            .iter()
            .any(|o| o.name.starts_with("sequential") && o.name.contains("/conv2d")),
        "layer name scopes: {:?}",
        summary.ops.iter().map(|o| &o.name).collect::<Vec<_>>()
    );
    assert!(
        summary
            .ops
            .iter()
            .any(|o| o.name.starts_with("gradient_tape/sequential")),
        "gradient ops named after their layer"
    );
    assert!(
        summary.ops.iter().any(|o| o.name.starts_with("Adam/")),
        "the update's ops"
    );
    assert!(summary.memory[0].peak_bytes > 0);

    let train_log = profiler::read_event_files(dir.path().join("train")).unwrap();
    let loss = history.get("loss").unwrap();
    let epochs: Vec<(i64, f64)> = train_log.scalars("epoch_loss");
    assert_eq!(epochs.len(), 2);
    for ((step, v), want) in epochs.iter().zip(loss) {
        assert!(
            (v - want).abs() <= 1e-6 * want.abs().max(1.0),
            "epoch {step}: {v} vs {want}"
        );
    }
    assert_eq!(
        train_log.scalars("batch_loss").len(),
        6,
        "12 batches, every second one"
    );
    if !has_tensorboard() {
        return;
    }
    let series = |log: &profiler::EventLog, tag: &str| {
        serde_json::json!(log
            .scalars(tag)
            .iter()
            .map(|(s, v)| serde_json::json!([s, v]))
            .collect::<Vec<_>>())
    };
    let val_log = profiler::read_event_files(dir.path().join("validation")).unwrap();
    let mut train = serde_json::Map::new();
    for tag in [
        "epoch_loss",
        "epoch_accuracy",
        "epoch_learning_rate",
        "batch_loss",
        "batch_accuracy",
    ] {
        train.insert(tag.into(), series(&train_log, tag));
    }
    let mut validation = serde_json::Map::new();
    for tag in ["epoch_loss", "epoch_accuracy"] {
        validation.insert(tag.into(), series(&val_log, tag));
    }
    // The validation values TensorBoard reads are the ones fit returned.
    let val_loss = history.get("val_loss").unwrap();
    for ((_, v), want) in val_log.scalars("epoch_loss").iter().zip(val_loss) {
        assert!((v - want).abs() <= 1e-6 * want.abs().max(1.0));
    }
    let histograms: Vec<String> = train_log
        .tags()
        .into_iter()
        .filter(|t| !t.starts_with("epoch_") && !t.starts_with("batch_"))
        .collect();
    assert_eq!(histograms.len(), model.weights().len(), "{histograms:?}");
    check_with_tensorboard(
        dir.path(),
        serde_json::json!({
            "scalars": {"train": train, "validation": validation},
            "histogram_tags": histograms,
            "profile_run": "train",
            "op_types": ["_FusedConv2DMaxPool", "MatMul", "_FusedMaxPoolGradBiasAddGrad"],
            "steps": 4,
        }),
    );
}

#[test]
fn an_input_bound_pipeline_shows_as_input_time() {
    ferroflow::init();
    let _g = ONE_AT_A_TIME.lock().unwrap_or_else(|e| e.into_inner());
    let dir = tempfile::tempdir().unwrap();
    let (x, y) = mnist(256);
    let slow = Dataset::from_tensor_slices((x, y))
        .unwrap()
        .batch(32, false)
        .unwrap()
        .map(|(bx, by)| {
            std::thread::sleep(Duration::from_millis(30));
            Ok((bx, by))
        });
    let mut model = compiled(applications::mnist_mlp());
    let tb = TensorBoard::new(dir.path()).profile_batch(2, 5).unwrap();
    model
        .fit_dataset(&slow, FitConfig::new().epochs(1).verbose(0).callback(tb))
        .unwrap();
    let (_, planes) = profiler::latest_profile(dir.path().join("train")).unwrap();
    let summary = profiler::summarize(&profiler::read_xspace(&planes[0]).unwrap());
    assert_eq!(summary.steps.len(), 4);
    for s in &summary.steps {
        assert!(
            s.input_us >= 25_000.0,
            "step {} input {} µs",
            s.name,
            s.input_us
        );
        assert!(s.input_us > s.compute_us, "{s:?}");
    }
    if !has_tensorboard() {
        return;
    }
    check_with_tensorboard(
        dir.path(),
        serde_json::json!({
            "scalars": {},
            "profile_run": "train",
            "op_types": ["MatMul"],
            "steps": 4,
            "input_bound": true,
        }),
    );
}

/// A callback that fails at batch `at`.
struct FailAt(usize);

impl ferroflow::keras::callbacks::Callback for FailAt {
    fn on_train_batch_end(
        &mut self,
        batch: usize,
        _logs: &ferroflow::keras::callbacks::Logs,
        _model: &mut Model,
    ) -> ferroflow::Result<()> {
        if batch == self.0 {
            return Err(ferroflow::Error::invalid("FailAt", "stop here"));
        }
        Ok(())
    }
}

#[test]
fn a_fit_that_fails_mid_profile_leaves_no_profiler_running() {
    ferroflow::init();
    let _g = ONE_AT_A_TIME.lock().unwrap_or_else(|e| e.into_inner());
    let dir = tempfile::tempdir().unwrap();
    let (x, y) = mnist(512);
    let mut model = Model::from(applications::mnist_mlp());
    model.build(&[28, 28, 1]).unwrap();
    model
        .compile(
            Adam::new(1e-3),
            SparseCategoricalCrossentropy::new(true),
            &[],
        )
        .unwrap();
    let tb = TensorBoard::new(dir.path()).profile_batch(2, 6).unwrap();
    let e = model
        .fit(
            &x,
            &y,
            FitConfig::new()
                .batch_size(32)
                .verbose(0)
                .callback(tb)
                .callback(FailAt(3)),
        )
        .unwrap_err();
    assert!(e.to_string().contains("stop here"));
    assert!(
        !profiler::is_running(),
        "the callback's drop stopped the profiler"
    );
    // What was recorded up to the failure was written.
    let (_, planes) = profiler::latest_profile(dir.path().join("train")).unwrap();
    assert!(
        !profiler::summarize(&profiler::read_xspace(&planes[0]).unwrap())
            .steps
            .is_empty()
    );
    // And an unwritable log folder fails before the first step.
    let file = dir.path().join("plain-file");
    std::fs::write(&file, b"x").unwrap();
    let e = model
        .fit(
            &x,
            &y,
            FitConfig::new()
                .verbose(0)
                .callback(TensorBoard::new(file.join("logs"))),
        )
        .unwrap_err();
    assert!(e.to_string().contains("plain-file"), "{e}");
}
