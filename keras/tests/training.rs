//! Models: fit, evaluate, predict, validation, callbacks, custom steps, weights I/O, summary.

mod common;
use common::blobs;
use std::sync::{Arc, Mutex};

use ferroflow_keras::activations::Activation;
use ferroflow_keras::callbacks::*;
use ferroflow_keras::layers::{BatchNormalization, Dense, Dropout, Flatten};
use ferroflow_keras::losses::{MeanSquaredError, SparseCategoricalCrossentropy};
use ferroflow_keras::{sequential, FitConfig, Logs, Model};
use ferroflow_optim::{Adam, Optimizer, Sgd};
use ferroflow_tensor::{random, DType, Error, Tensor};

/// A fresh scratch directory, removed when the returned guard drops.
fn tmp(name: &str) -> tempfile::TempDir {
    tempfile::Builder::new()
        .prefix(&format!("ferroflow-keras-{name}-"))
        .tempdir()
        .unwrap()
}

fn classifier() -> Model {
    ferroflow::init();
    Model::from(sequential![
        Dense::new(16).activation(Activation::Relu),
        Dense::new(3),
    ])
}

fn compiled() -> Model {
    let mut m = classifier();
    m.compile(
        Adam::new(0.05),
        SparseCategoricalCrossentropy::new(true),
        &["accuracy"],
    )
    .unwrap();
    m
}

#[test]
fn fit_learns_and_reports_history_evaluate_and_predict() {
    let (x, y) = blobs(600, 1);
    let mut m = compiled();
    let h = m
        .fit(
            &x,
            &y,
            FitConfig::new()
                .epochs(5)
                .batch_size(32)
                .validation_split(0.2)
                .verbose(0),
        )
        .unwrap();
    assert_eq!(h.epoch, vec![0, 1, 2, 3, 4]);
    let keys: Vec<&str> = h.history.iter().map(|(k, _)| k.as_str()).collect();
    assert_eq!(keys, ["loss", "accuracy", "val_loss", "val_accuracy"]);
    let loss = h.get("loss").unwrap();
    assert!(loss[4] < loss[0], "{loss:?}");
    assert!(h.get("val_accuracy").unwrap()[4] > 0.9);
    let (xt, yt) = blobs(300, 2);
    let logs = m.evaluate(&xt, &yt, 64).unwrap();
    assert!(logs.get("accuracy").unwrap() > 0.9);
    let p = m.predict(&xt, 64).unwrap();
    assert_eq!(p.shape(), &[300, 3]);
    // predict agrees with evaluate's accuracy.
    let am = p.argmax(-1).unwrap().to_vec::<i64>().unwrap();
    let hits = am
        .iter()
        .zip(yt.to_vec::<i64>().unwrap())
        .filter(|(a, b)| **a == *b)
        .count();
    assert!((hits as f64 / 300.0 - logs.get("accuracy").unwrap()).abs() < 1e-9);
}

#[test]
fn misuse_is_an_error() {
    let (x, y) = blobs(10, 3);
    let mut m = classifier();
    let e = m.fit(&x, &y, FitConfig::new().verbose(0)).unwrap_err();
    assert!(e.to_string().contains("compile"), "{e}");
    let mut m = compiled();
    let short = y.slice(&[0], &[5]).unwrap();
    assert!(m.fit(&x, &short, FitConfig::new().verbose(0)).is_err());
    assert!(m
        .fit(&x, &y, FitConfig::new().batch_size(0).verbose(0))
        .is_err());
    assert!(m
        .fit(&x, &y, FitConfig::new().validation_split(1.5).verbose(0))
        .is_err());
    assert!(classifier().summary().is_err());
}

#[test]
fn validation_split_holds_out_the_last_samples() {
    // Targets of the held-out tail are unlearnable noise far from the head's: the val loss
    // must be computed on exactly those rows.
    ferroflow::init();
    let x = Tensor::ones(&[10, 1], DType::F32).unwrap();
    let y = Tensor::from_vec(
        vec![1.0f32, 1.0, 1.0, 1.0, 1.0, 1.0, 1.0, 1.0, 5.0, 5.0],
        &[10, 1],
    )
    .unwrap();
    let mut m = Model::from(sequential![Dense::new(1)]);
    m.compile(Sgd::new(0.1), MeanSquaredError::new(), &[])
        .unwrap();
    let h = m
        .fit(
            &x,
            &y,
            FitConfig::new()
                .epochs(200)
                .batch_size(8)
                .validation_split(0.2)
                .verbose(0),
        )
        .unwrap();
    assert!(h.get("loss").unwrap()[199] < 1e-6);
    assert!((h.get("val_loss").unwrap()[199] - 16.0).abs() < 1e-3);
}

#[test]
fn early_stopping_stops_and_restores_the_best_weights() {
    let (x, y) = blobs(200, 4);
    let mut m = compiled();
    // Monitoring val_accuracy in `min` mode: accuracy only rises after epoch 0, so the
    // best epoch is the first and training stops after `patience` more.
    let h = m
        .fit(
            &x,
            &y,
            FitConfig::new()
                .epochs(50)
                .verbose(0)
                .validation_data(&x, &y)
                .callback(
                    EarlyStopping::new("val_accuracy")
                        .mode(Mode::Min)
                        .patience(2)
                        .restore_best_weights(true),
                ),
        )
        .unwrap();
    assert_eq!(
        h.epoch.len(),
        4,
        "stops after the best epoch plus patience + 1"
    );
    // Restored weights are the epoch-0 weights: val accuracy back to epoch 0's.
    let acc0 = h.get("val_accuracy").unwrap()[0];
    let now = m.evaluate(&x, &y, 32).unwrap().get("accuracy").unwrap();
    assert!((now - acc0).abs() < 1e-12, "{now} vs {acc0}");
}

#[test]
fn checkpoint_lr_callbacks_csv_and_terminate_on_nan() {
    let scratch = tmp("callbacks");
    let dir = scratch.path();
    let (x, y) = blobs(128, 5);
    let mut m = compiled();
    let lrs = Arc::new(Mutex::new(vec![]));
    let seen = lrs.clone();
    let csv = dir.join("log.csv");
    m.fit(
        &x,
        &y,
        FitConfig::new()
            .epochs(4)
            .verbose(0)
            .validation_data(&x, &y)
            .callback(LearningRateScheduler::new(move |epoch, lr| {
                seen.lock().unwrap().push(lr);
                0.01 / (epoch + 1) as f64
            }))
            .callback(
                ModelCheckpoint::new(dir.join("w-{epoch:02d}.safetensors").to_str().unwrap())
                    .unwrap(),
            )
            .callback(CsvLogger::new(&csv)),
    )
    .unwrap();
    assert_eq!(*lrs.lock().unwrap(), vec![0.05, 0.01, 0.005, 0.01 / 3.0]);
    for e in 1..=4 {
        assert!(dir.join(format!("w-{e:02}.safetensors")).exists());
    }
    let text = std::fs::read_to_string(&csv).unwrap();
    let lines: Vec<&str> = text.lines().collect();
    assert_eq!(lines[0], "epoch,loss,accuracy,val_loss,val_accuracy");
    assert_eq!(lines.len(), 5);
    assert!(lines[4].starts_with("3,"));

    // save_best_only: a monitored value that never improves after the first epoch.
    let mut m = compiled();
    let mut cp = ModelCheckpoint::new(dir.join("best-{epoch}.safetensors").to_str().unwrap())
        .unwrap()
        .monitor("loss", Mode::Max)
        .save_best_only(true);
    let mut logs = Logs::new();
    for (epoch, loss) in [3.0, 2.0, 4.0, 1.0].into_iter().enumerate() {
        logs.set("loss", loss);
        m.build(&[2]).unwrap();
        cp.on_epoch_end(epoch, &logs, &mut m).unwrap();
    }
    let saved: Vec<String> = cp
        .saved
        .iter()
        .map(|p| p.file_name().unwrap().to_string_lossy().into())
        .collect();
    assert_eq!(saved, ["best-1.safetensors", "best-3.safetensors"]);

    // ReduceLROnPlateau divides the learning rate after `patience` flat epochs.
    let mut r = ReduceLROnPlateau::new("val_loss").factor(0.5).patience(2);
    let params = TrainParams {
        epochs: 10,
        steps: Some(1),
        verbose: 0,
    };
    r.on_train_begin(&params, &mut m).unwrap();
    for epoch in 0..5 {
        let mut l = Logs::new();
        l.set("val_loss", 1.0);
        r.on_epoch_end(epoch, &l, &mut m).unwrap();
    }
    let lr = m.optimizer_mut().unwrap().learning_rate().at(0);
    assert!((lr - 0.05 * 0.25).abs() < 1e-12, "{lr}");

    // TerminateOnNaN: a NaN input makes the first batch's loss NaN.
    let mut bad = x.to_vec::<f32>().unwrap();
    bad[0] = f32::NAN;
    let xn = Tensor::from_vec(bad, &[128, 2]).unwrap();
    let mut m = compiled();
    let h = m
        .fit(
            &xn,
            &y,
            FitConfig::new()
                .epochs(3)
                .shuffle(false)
                .verbose(0)
                .callback(TerminateOnNaN),
        )
        .unwrap();
    assert_eq!(h.epoch.len(), 1);
    assert!(h.get("loss").unwrap()[0].is_nan());
}

#[test]
fn custom_train_step_and_custom_loops_share_the_model() {
    let (x, y) = blobs(64, 6);
    let mut m = compiled();
    let calls = Arc::new(Mutex::new(0usize));
    let c = calls.clone();
    m.set_train_step(move |model, x, y| {
        *c.lock().unwrap() += 1;
        model.default_train_step(x, y)
    });
    m.fit(&x, &y, FitConfig::new().epochs(2).batch_size(16).verbose(0))
        .unwrap();
    assert_eq!(*calls.lock().unwrap(), 8);
    // A GradientTape loop on the same model's layers.
    let before = m.get_weights().unwrap();
    let tape = ferroflow_autodiff::GradientTape::new();
    let out = m.call(&x, true).unwrap();
    let loss = SparseCategoricalCrossentropy::new(true);
    use ferroflow_keras::losses::Loss;
    let l = loss.call(&y, &out, None).unwrap();
    let vars = m.trainable_weights();
    let mut opt = Sgd::new(0.1);
    opt.minimize(&l, &vars, &tape).unwrap();
    let after = m.get_weights().unwrap();
    assert_ne!(
        before[0].to_vec::<f32>().unwrap(),
        after[0].to_vec::<f32>().unwrap()
    );
}

#[test]
fn weights_round_trip_and_mismatches_change_nothing() {
    let scratch = tmp("weights");
    let dir = scratch.path();
    let (x, y) = blobs(64, 7);
    let mut m = compiled();
    m.fit(&x, &y, FitConfig::new().epochs(2).verbose(0))
        .unwrap();
    let path = dir.join("w.safetensors");
    m.save_weights(&path).unwrap();
    let p0 = m.predict(&x, 32).unwrap().to_vec::<f32>().unwrap();
    // A fresh model with other layer names loads by position.
    let mut fresh = classifier();
    fresh.build(&[2]).unwrap();
    fresh.load_weights(&path).unwrap();
    assert_eq!(fresh.predict(&x, 32).unwrap().to_vec::<f32>().unwrap(), p0);
    // A model of another shape: an error naming the weight; nothing assigned.
    let mut other = Model::from(sequential![Dense::new(16), Dense::new(4)]);
    other.build(&[2]).unwrap();
    let w0 = other.get_weights().unwrap()[0].to_vec::<f32>().unwrap();
    let e = other.load_weights(&path).unwrap_err().to_string();
    assert!(e.contains("kernel") && e.contains("[16, 4]"), "{e}");
    assert_eq!(other.get_weights().unwrap()[0].to_vec::<f32>().unwrap(), w0);
    // Not a safetensors file.
    std::fs::write(dir.join("junk"), b"junk").unwrap();
    assert!(matches!(
        fresh.load_weights(dir.join("junk")),
        Err(Error::Format { .. })
    ));
    // Whole model: config + weights.
    let mut bn = Model::from(sequential![
        Flatten::new(),
        Dense::new(8),
        BatchNormalization::new(),
        Dropout::new(0.5),
        Dense::new(3)
    ]);
    bn.compile(
        Adam::new(0.01),
        SparseCategoricalCrossentropy::new(true),
        &[],
    )
    .unwrap();
    bn.fit(&x, &y, FitConfig::new().epochs(1).verbose(0))
        .unwrap();
    bn.save(dir.join("model")).unwrap();
    let mut back = Model::load(dir.join("model")).unwrap();
    assert_eq!(
        back.predict(&x, 32).unwrap().to_vec::<f32>().unwrap(),
        bn.predict(&x, 32).unwrap().to_vec::<f32>().unwrap()
    );
    assert_eq!(back.network().config(), bn.network().config());
    // The optimizer comes back with its state: one more step on the same batch leaves both
    // models with the same weights (Adam's moments and step count were restored).
    assert_eq!(
        back.optimizer_mut().unwrap().iterations(),
        bn.optimizer_mut().unwrap().iterations()
    );
    let (bx, by) = (
        x.slice(&[0, 0], &[32, 2]).unwrap(),
        y.slice(&[0], &[32]).unwrap(),
    );
    let seeded_step = |m: &mut Model| {
        // The same dropout mask in both.
        ferroflow_tensor::testing::seeded(11, || {
            m.train_step(std::slice::from_ref(&bx), std::slice::from_ref(&by))
                .unwrap()
        });
    };
    seeded_step(&mut bn);
    seeded_step(&mut back);
    for (a, b) in bn
        .get_weights()
        .unwrap()
        .iter()
        .zip(back.get_weights().unwrap())
    {
        assert_eq!(a.to_vec::<f32>().unwrap(), b.to_vec::<f32>().unwrap());
    }
    let cfg: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(dir.join("model/config.json")).unwrap())
            .unwrap();
    assert_eq!(cfg["training_config"]["optimizer"]["name"], "Adam");
    assert_eq!(cfg["training_config"]["loss"]["from_logits"], true);
    // compile = false: the weights without the training setup.
    let mut bare = Model::load_with(dir.join("model"), false).unwrap();
    let err = bare
        .fit(&x, &y, FitConfig::new().verbose(0))
        .unwrap_err()
        .to_string();
    assert!(err.contains("compile"), "{err}");
    // Saved uncompiled: loads uncompiled, and no stale optimizer file stays behind.
    let mut plain = Model::from(sequential![Dense::new(2)]);
    plain.build(&[2]).unwrap();
    plain.save(dir.join("model")).unwrap();
    assert!(!dir.join("model/optimizer.safetensors").exists());
    assert!(Model::load(dir.join("model"))
        .unwrap()
        .optimizer_mut()
        .is_none());
}

#[test]
fn safetensors_files_open_in_python() {
    let has = std::process::Command::new("python3")
        .args(["-c", "import safetensors.numpy, numpy"])
        .status()
        .map(|s| s.success())
        .unwrap_or(false);
    if !has {
        return ferroflow_tensor::testing::skip(
            "FERROFLOW_REQUIRE_NUMPY",
            "python3 with `safetensors` and `numpy` is not installed (pip install safetensors numpy; .ci/run does)",
        );
    }
    let scratch = tmp("python");
    let dir = scratch.path();
    let mut m = classifier();
    m.build(&[2]).unwrap();
    let path = dir.join("w.safetensors");
    m.save_weights(&path).unwrap();
    let w = m.network().named_weights();
    let script = "import sys, safetensors.numpy as s\nd = s.load_file(sys.argv[1])\nfor k in sorted(d): print(k, list(d[k].shape), str(d[k].dtype), repr(float(d[k].sum())))";
    let out = std::process::Command::new("python3")
        .args(["-c", script, path.to_str().unwrap()])
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let text = String::from_utf8(out.stdout).unwrap();
    let mut want: Vec<String> = w
        .iter()
        .map(|(n, v)| {
            let s: f32 = v.peek().to_vec::<f32>().unwrap().iter().sum();
            (n.clone(), v.shape(), s)
        })
        .map(|(n, shape, s)| format!("{n} {shape:?} float32 {s}"))
        .collect();
    want.sort();
    let got: Vec<&str> = text.lines().collect();
    assert_eq!(got.len(), want.len());
    for (g, w) in got.iter().zip(&want) {
        let (gn, gs) = g.rsplit_once(' ').unwrap();
        let (wn, ws) = w.rsplit_once(' ').unwrap();
        assert_eq!(gn, wn);
        let (gs, ws): (f64, f64) = (gs.parse().unwrap(), ws.parse().unwrap());
        assert!((gs - ws).abs() < 1e-4 * (1.0 + ws.abs()), "{g} vs {w}");
    }
}

#[test]
fn every_integer_dtype_round_trips_through_safetensors_and_python() {
    ferroflow::init();
    let scratch = tmp("int-dtypes");
    let path = scratch.path().join("ints.safetensors");
    let tensors = vec![
        (
            "i16".to_string(),
            Tensor::from_vec(vec![i16::MIN, -1, i16::MAX], &[3]).unwrap(),
        ),
        (
            "u16".to_string(),
            Tensor::from_vec(vec![0u16, u16::MAX], &[2, 1]).unwrap(),
        ),
        (
            "u32".to_string(),
            Tensor::from_vec(vec![7u32, u32::MAX], &[2]).unwrap(),
        ),
        (
            "u64".to_string(),
            Tensor::from_vec(vec![u64::MAX, 1 << 60], &[1, 2]).unwrap(),
        ),
    ];
    ferroflow::keras::saving::save_tensors(&path, &tensors).unwrap();
    let back = ferroflow::keras::saving::load_tensors(&path).unwrap();
    assert_eq!(back.len(), tensors.len());
    for ((n, t), (bn, b)) in tensors.iter().zip(&back) {
        assert_eq!((n, t.dtype(), t.shape()), (bn, b.dtype(), b.shape()));
        assert_eq!(t.to_host().unwrap(), b.to_host().unwrap(), "{n}");
    }
    let has = std::process::Command::new("python3")
        .args(["-c", "import safetensors.numpy, numpy"])
        .status()
        .map(|s| s.success())
        .unwrap_or(false);
    if !has {
        return ferroflow_tensor::testing::skip(
            "FERROFLOW_REQUIRE_NUMPY",
            "python3 with `safetensors` and `numpy` is not installed (pip install safetensors numpy; .ci/run does)",
        );
    }
    // Python reads each with its own dtype and values, and writes them back for us.
    let again = scratch.path().join("from_python.safetensors");
    let script = "import sys, safetensors.numpy as s\nd = s.load_file(sys.argv[1])\nfor k in sorted(d): print(k, str(d[k].dtype), [int(v) for v in d[k].ravel()])\ns.save_file(d, sys.argv[2])";
    let out = std::process::Command::new("python3")
        .args([
            "-c",
            script,
            path.to_str().unwrap(),
            again.to_str().unwrap(),
        ])
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let text = String::from_utf8(out.stdout).unwrap();
    let mut want: Vec<String> = tensors
        .iter()
        .map(|(n, t)| {
            let host = t.to_host().unwrap();
            let values: Vec<String> = match &host {
                ferroflow::HostData::I16(v) => v.iter().map(|x| x.to_string()).collect(),
                ferroflow::HostData::U16(v) => v.iter().map(|x| x.to_string()).collect(),
                ferroflow::HostData::U32(v) => v.iter().map(|x| x.to_string()).collect(),
                ferroflow::HostData::U64(v) => v.iter().map(|x| x.to_string()).collect(),
                other => panic!("{other:?}"),
            };
            format!("{n} {} [{}]", t.dtype(), values.join(", "))
        })
        .collect();
    want.sort();
    assert_eq!(text.lines().collect::<Vec<_>>(), want);
    let from_python = ferroflow::keras::saving::load_tensors(&again).unwrap();
    for (n, t) in &tensors {
        let (_, b) = from_python.iter().find(|(bn, _)| bn == n).unwrap();
        assert_eq!(
            t.to_host().unwrap(),
            b.to_host().unwrap(),
            "{n} from Python"
        );
    }
}

#[test]
fn summary_lists_layers_and_parameter_counts() {
    ferroflow::init();
    let mut m = Model::from(sequential![
        Flatten::new(),
        Dense::new(8).activation(Activation::Relu),
        BatchNormalization::new(),
        Dense::new(2)
    ]);
    m.build(&[3, 4]).unwrap();
    let s = m.summary().unwrap();
    assert!(s.contains("(None, 12)"), "{s}");
    assert!(s.contains("(None, 8)"));
    assert!(s.contains("Total params: 154"), "{s}");
    assert!(s.contains("Trainable params: 138"));
    assert!(s.contains("Non-trainable params: 16"));
    let dense = m.network().sublayers()[1].name().to_string();
    assert!(s.contains(&format!("{dense} (Dense)")));
}

/// A subclassed model: a custom `Layer` holding two Dense layers and a skip connection.
struct Residual {
    base: ferroflow_keras::LayerBase,
    inner: Dense,
    out: Dense,
}

impl ferroflow_keras::Layer for Residual {
    fn base(&self) -> &ferroflow_keras::LayerBase {
        &self.base
    }
    fn base_mut(&mut self) -> &mut ferroflow_keras::LayerBase {
        &mut self.base
    }
    fn class_name(&self) -> &'static str {
        "Residual"
    }
    fn call(&mut self, inputs: &[Tensor], training: bool) -> ferroflow_tensor::Result<Vec<Tensor>> {
        let h = self.inner.forward(&inputs[0], training)?;
        let y = self.out.forward(&h, training)?;
        Ok(vec![y.add(&inputs[0].reduce_sum(-1isize, true)?)?])
    }
    fn sublayers(&self) -> Vec<&dyn ferroflow_keras::Layer> {
        vec![&self.inner, &self.out]
    }
}

#[test]
fn subclassed_models_fit_and_expose_their_sublayers_weights() {
    ferroflow::init();
    let x = random::stateless_normal(&[128, 3], [3, 3], 0.0, 1.0, DType::F32).unwrap();
    // Target: sum(x) + 2·x0, so the dense part has to learn 2·x0.
    let y = x
        .reduce_sum(-1isize, true)
        .unwrap()
        .add(
            &x.slice(&[0, 0], &[128, 1])
                .unwrap()
                .mul(&Tensor::scalar(2.0f32).unwrap())
                .unwrap(),
        )
        .unwrap();
    let net = Residual {
        base: ferroflow_keras::LayerBase::new("residual", None),
        inner: Dense::new(8).activation(Activation::Relu),
        out: Dense::new(1),
    };
    let mut m = Model::from_layer(net);
    m.compile(Adam::new(0.02), MeanSquaredError::new(), &[])
        .unwrap();
    let h = m
        .fit(
            &x,
            &y,
            FitConfig::new().epochs(60).batch_size(32).verbose(0),
        )
        .unwrap();
    assert_eq!(m.trainable_weights().len(), 4);
    assert_eq!(m.count_params(), 3 * 8 + 8 + 8 + 1);
    let l = h.get("loss").unwrap();
    assert!(l[59] < 0.05 * l[0], "{} -> {}", l[0], l[59]);
    let names: Vec<String> = m
        .network()
        .named_weights()
        .into_iter()
        .map(|(n, _)| n)
        .collect();
    assert!(names[0].starts_with("residual/dense"), "{names:?}");
}

#[test]
fn model_checkpoint_refuses_templates_it_cannot_apply_when_made() {
    for bad in [
        "w-{epoch.h5",
        "w-{}.h5",
        "w-{epoch:x}.h5",
        "w-{epoch:99999999999999999999d}.h5",
        "w-{val_loss:.100f}.h5",
        "w-epoch}.h5",
    ] {
        let e = ModelCheckpoint::new(bad)
            .err()
            .unwrap_or_else(|| panic!("{bad} was accepted"));
        assert!(e.to_string().starts_with("ModelCheckpoint: path"), "{e}");
    }
    for good in [
        "w.h5",
        "w-{epoch:02d}-{val_loss:.3f}.h5",
        "{epoch}",
        "{loss:4d}",
    ] {
        assert!(ModelCheckpoint::new(good).is_ok(), "{good}");
    }
}

#[test]
fn errors_name_the_method_that_failed() {
    let mut m = compiled();
    m.build(&[2]).unwrap();
    let scalar = Tensor::scalar(1.0f32).unwrap();
    let e = m.predict(&scalar, 4).unwrap_err().to_string();
    assert!(
        e.starts_with("Model.predict: x is empty or a scalar"),
        "{e}"
    );
    let e = m.evaluate(&scalar, &scalar, 4).unwrap_err().to_string();
    assert!(e.starts_with("Model.evaluate:"), "{e}");
}

/// Counts batch begins and ends.
struct BatchCounter(Arc<Mutex<(usize, usize)>>);

impl Callback for BatchCounter {
    fn on_train_batch_begin(
        &mut self,
        _batch: usize,
        _model: &mut Model,
    ) -> ferroflow_tensor::Result<()> {
        self.0.lock().unwrap().0 += 1;
        Ok(())
    }
    fn on_train_batch_end(
        &mut self,
        _batch: usize,
        _logs: &Logs,
        _model: &mut Model,
    ) -> ferroflow_tensor::Result<()> {
        self.0.lock().unwrap().1 += 1;
        Ok(())
    }
}

#[test]
fn every_batch_begun_ends_when_the_count_is_known() {
    ferroflow::init();
    let x = Tensor::from_vec((0..40).map(|i| i as f32 / 40.0).collect(), &[20, 2]).unwrap();
    let y = Tensor::from_vec((0..20).map(|i| i as f32 / 20.0).collect(), &[20, 1]).unwrap();
    let mut model = Model::from(sequential![Dense::new(1)]);
    model
        .compile(Sgd::new(0.1), MeanSquaredError::new(), &[])
        .unwrap();
    let counts = Arc::new(Mutex::new((0, 0)));
    // 20 samples in batches of 8: 3 batches an epoch, 2 epochs.
    model
        .fit(
            &x,
            &y,
            FitConfig::new()
                .epochs(2)
                .batch_size(8)
                .verbose(0)
                .callback(BatchCounter(counts.clone())),
        )
        .unwrap();
    assert_eq!(*counts.lock().unwrap(), (6, 6));
}
