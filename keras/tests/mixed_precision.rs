//! Mixed precision: policies, autocast of inputs and variables, float32 islands (softmax,
//! losses, normalization), loss scaling inside `fit`.

mod common;
use common::blobs;
use std::sync::Mutex;

use ferroflow_autodiff::{GradientTape, Source};
use ferroflow_keras::activations::Activation;
use ferroflow_keras::layers::{BatchNormalization, Conv2D, Dense, Flatten, MaxPooling2D};
use ferroflow_keras::losses::{MeanSquaredError, SparseCategoricalCrossentropy};
use ferroflow_keras::mixed_precision::{global_policy, set_global_policy, Policy};
use ferroflow_keras::{sequential, FitConfig, Layer, Model, Sequential};
use ferroflow_optim::{Adam, Sgd};
use ferroflow_tensor::{random, Axes, DType, Tensor};

/// The global policy is process state: tests that build layers take this lock.
static GLOBAL: Mutex<()> = Mutex::new(());

fn lock() -> std::sync::MutexGuard<'static, ()> {
    ferroflow::init();
    GLOBAL.lock().unwrap_or_else(|e| e.into_inner())
}

fn policy(name: &str) -> Policy {
    Policy::new(name).unwrap()
}

#[test]
fn policies_name_their_dtypes() {
    let _g = lock();
    for (name, compute, variable) in [
        ("float32", DType::F32, DType::F32),
        ("float64", DType::F64, DType::F64),
        ("float16", DType::F16, DType::F16),
        ("bfloat16", DType::BF16, DType::BF16),
        ("mixed_float16", DType::F16, DType::F32),
        ("mixed_bfloat16", DType::BF16, DType::F32),
    ] {
        let p = policy(name);
        assert_eq!(
            (p.name(), p.compute_dtype(), p.variable_dtype()),
            (name, compute, variable)
        );
        assert_eq!(p.is_mixed(), name.starts_with("mixed"));
    }
    let err = Policy::new("mixed_float8").unwrap_err().to_string();
    assert!(
        err.contains("mixed_float16") && err.contains("mixed_float8"),
        "{err}"
    );
    assert_eq!(global_policy().name(), "float32");
    set_global_policy(policy("mixed_bfloat16"));
    let d = Dense::new(3);
    set_global_policy(policy("float32"));
    assert_eq!(
        d.base().dtype_policy.name(),
        "mixed_bfloat16",
        "layers take the global policy when made"
    );
    assert_eq!(Dense::new(3).base().dtype_policy.name(), "float32");
}

#[test]
fn a_mixed_layer_computes_in_half_and_keeps_float32_weights_and_gradients() {
    let _g = lock();
    for (name, half) in [
        ("mixed_float16", DType::F16),
        ("mixed_bfloat16", DType::BF16),
    ] {
        let x = random::stateless_normal(&[4, 5], [1, 1], 0.0, 1.0, DType::F32).unwrap();
        let mut mixed = Dense::new(3).dtype(policy(name));
        let mut plain = Dense::new(3);
        mixed.forward(&x, false).unwrap(); // builds
        plain.forward(&x, false).unwrap();
        for (p, m) in plain.weights().iter().zip(mixed.weights()) {
            p.assign(&m.value()).unwrap();
        }
        assert!(mixed
            .weights()
            .iter()
            .all(|w| w.value().dtype() == DType::F32));
        let tape = GradientTape::new();
        let y = mixed.forward(&x, true).unwrap();
        assert_eq!(y.dtype(), half);
        let loss = y
            .upcast_half()
            .unwrap()
            .square()
            .unwrap()
            .reduce_sum(Axes::All, false)
            .unwrap();
        let kernel = mixed.weights()[0].clone();
        let g = tape
            .gradient(&loss, &[Source::from(&kernel)])
            .unwrap()
            .remove(0)
            .unwrap();
        assert_eq!(
            g.dtype(),
            DType::F32,
            "the gradient reaches the float32 variable as float32"
        );
        // Against the float32 layer, within the half type's precision.
        let tape = GradientTape::new();
        let y32 = plain.forward(&x, true).unwrap();
        let loss32 = y32.square().unwrap().reduce_sum(Axes::All, false).unwrap();
        let g32 = tape
            .gradient(&loss32, &[Source::from(&plain.weights()[0])])
            .unwrap()
            .remove(0)
            .unwrap();
        let tol = if half == DType::F16 { 1e-2 } else { 5e-2 };
        for (a, b) in y
            .to_f64_vec()
            .unwrap()
            .iter()
            .zip(y32.to_f64_vec().unwrap())
        {
            assert!((a - b).abs() <= tol * (1.0 + b.abs()), "{name}: {a} vs {b}");
        }
        for (a, b) in g
            .to_f64_vec()
            .unwrap()
            .iter()
            .zip(g32.to_f64_vec().unwrap())
        {
            assert!(
                (a - b).abs() <= 2.0 * tol * (1.0 + b.abs()),
                "{name}: grad {a} vs {b}"
            );
        }
    }
}

#[test]
fn autocast_can_be_turned_off_and_a_float32_last_layer_works() {
    let _g = lock();
    let x = Tensor::ones(&[2, 3], DType::F32).unwrap();
    let mut d = Dense::new(2).dtype(policy("mixed_float16"));
    d.base_mut().autocast = false;
    let err = d.forward(&x, false).unwrap_err().to_string();
    assert!(err.contains("float32") && err.contains("float16"), "{err}");
    let y = d.forward(&x.cast(DType::F16).unwrap(), false).unwrap();
    assert_eq!(y.dtype(), DType::F16);
    // The guide's recipe: everything mixed, the output layer in float32.
    let mut net = sequential![
        Dense::new(4)
            .dtype(policy("mixed_float16"))
            .activation(Activation::Relu),
        Dense::new(2).dtype(policy("float32")),
    ];
    assert_eq!(net.forward(&x, false).unwrap().dtype(), DType::F32);
    // Integer inputs are not cast (an Embedding's ids stay ids).
    let ids = Tensor::from_vec(vec![0i64, 1], &[2]).unwrap();
    let mut emb = ferroflow_keras::layers::Embedding::new(3, 2).dtype(policy("mixed_bfloat16"));
    assert_eq!(emb.forward(&ids, false).unwrap().dtype(), DType::BF16);
}

#[test]
fn softmax_normalization_and_losses_run_in_float32() {
    let _g = lock();
    let x = random::stateless_normal(&[3, 7], [2, 2], 0.0, 4.0, DType::F32).unwrap();
    let h = x.cast(DType::F16).unwrap();
    let soft = h.softmax(-1).unwrap();
    assert_eq!(soft.dtype(), DType::F16);
    let want = h
        .cast(DType::F32)
        .unwrap()
        .softmax(-1)
        .unwrap()
        .cast(DType::F16)
        .unwrap();
    assert_eq!(soft.to_f64_vec().unwrap(), want.to_f64_vec().unwrap());
    // Batch normalization: half output, float32 statistics and moving averages.
    let mut bn = BatchNormalization::new().dtype(policy("mixed_float16"));
    let big = x.mul(&x.scalar_like(300.0).unwrap()).unwrap(); // squares overflow float16
    let y = bn.forward(&big, true).unwrap();
    assert_eq!(y.dtype(), DType::F16);
    assert!(y.to_f64_vec().unwrap().iter().all(|v| v.is_finite()));
    let var = bn
        .weights()
        .into_iter()
        .find(|w| w.name().ends_with("moving_variance"))
        .unwrap();
    assert_eq!(var.value().dtype(), DType::F32);
    assert!(var
        .value()
        .to_f64_vec()
        .unwrap()
        .iter()
        .all(|v| v.is_finite() && *v > 1.0));
}

#[test]
fn compile_wraps_the_optimizer_in_a_loss_scale_under_mixed_float16_only() {
    let _g = lock();
    let build = |name: &str| {
        set_global_policy(policy(name));
        let mut m = Model::from(sequential![Dense::new(1)]);
        set_global_policy(policy("float32"));
        m.compile(Sgd::new(0.1), MeanSquaredError::new(), &[])
            .unwrap();
        m
    };
    let mut m16 = build("mixed_float16");
    let opt = m16.optimizer_mut().unwrap();
    assert_eq!(opt.name(), "LossScaleOptimizer");
    assert_eq!(opt.loss_scale(), Some(32768.0));
    for name in ["mixed_bfloat16", "float32"] {
        let mut m = build(name);
        assert_eq!(m.optimizer_mut().unwrap().name(), "SGD", "{name}");
    }
}

#[test]
fn an_overflowing_step_inside_fit_halves_the_scale_and_is_skipped() {
    let _g = lock();
    set_global_policy(policy("mixed_float16"));
    let mut m = Model::from(sequential![Dense::new(1)]);
    set_global_policy(policy("float32"));
    m.compile(Sgd::new(1e-3), MeanSquaredError::new(), &[])
        .unwrap();
    m.build(&[1]).unwrap();
    let before = m.get_weights().unwrap();
    // Targets far from the prediction: d(loss)/d(y_pred) · 2^15 overflows float16.
    let x = Tensor::from_vec(vec![1.0f32], &[1, 1]).unwrap();
    let y = Tensor::from_vec(vec![3000.0f32], &[1, 1]).unwrap();
    m.fit(&x, &y, FitConfig::new().epochs(1).batch_size(1).verbose(0))
        .unwrap();
    let opt = m.optimizer_mut().unwrap();
    assert_eq!(opt.loss_scale(), Some(16384.0), "the scale halved");
    assert_eq!(opt.iterations(), 1, "the skipped step still counts");
    let after = m.get_weights().unwrap();
    for (a, b) in before.iter().zip(&after) {
        assert_eq!(
            a.to_f64_vec().unwrap(),
            b.to_f64_vec().unwrap(),
            "weights untouched"
        );
    }
    // Keep going: the scale falls until the scaled gradient fits, then training moves.
    m.fit(&x, &y, FitConfig::new().epochs(30).batch_size(1).verbose(0))
        .unwrap();
    let opt = m.optimizer_mut().unwrap();
    let scale = opt.loss_scale().unwrap();
    assert!(scale <= 16.0, "scale {scale}");
    let moved = m.get_weights().unwrap();
    assert_ne!(
        moved[0].to_f64_vec().unwrap(),
        before[0].to_f64_vec().unwrap()
    );
}

#[test]
fn mixed_models_train_as_well_as_float32_ones() {
    let _g = lock();
    let (x, y) = blobs(600, 3);
    let (xt, yt) = blobs(300, 4);
    let mut accs = vec![];
    for name in ["float32", "mixed_float16", "mixed_bfloat16"] {
        set_global_policy(policy(name));
        ferroflow_tensor::random::set_seed(5);
        let mut m = Model::from(sequential![
            Dense::new(16).activation(Activation::Relu),
            Dense::new(3).dtype(policy("float32")),
        ]);
        set_global_policy(policy("float32"));
        m.compile(
            Adam::new(0.02),
            SparseCategoricalCrossentropy::new(true),
            &["accuracy"],
        )
        .unwrap();
        m.fit(&x, &y, FitConfig::new().epochs(6).batch_size(32).verbose(0))
            .unwrap();
        let acc = m.evaluate(&xt, &yt, 100).unwrap().get("accuracy").unwrap();
        accs.push((name, acc));
    }
    let f32_acc = accs[0].1;
    assert!(f32_acc > 0.9, "{accs:?}");
    for (name, acc) in &accs[1..] {
        assert!(
            (acc - f32_acc).abs() <= 0.02,
            "{name}: {acc} vs float32 {f32_acc}"
        );
    }
}

#[test]
fn a_mixed_cnn_runs_forward_and_backward() {
    let _g = lock();
    set_global_policy(policy("mixed_bfloat16"));
    let mut net: Sequential = sequential![
        Conv2D::new(4, [3, 3]).activation(Activation::Relu),
        MaxPooling2D::new([2, 2]),
        BatchNormalization::new(),
        Flatten::new(),
        Dense::new(3).dtype(policy("float32")),
    ];
    set_global_policy(policy("float32"));
    let x = random::stateless_normal(&[2, 8, 8, 1], [3, 3], 0.0, 1.0, DType::F32).unwrap();
    let tape = GradientTape::new();
    let y = net.forward(&x, true).unwrap();
    assert_eq!(y.dtype(), DType::F32);
    let loss = y.square().unwrap().reduce_sum(Axes::All, false).unwrap();
    let vars = net.trainable_weights();
    let grads = tape
        .gradient(&loss, &vars.iter().map(Source::from).collect::<Vec<_>>())
        .unwrap();
    for (g, v) in grads.iter().zip(&vars) {
        let g = g.as_ref().unwrap();
        assert_eq!(g.dtype(), DType::F32, "{}", v.name());
        assert!(g.to_f64_vec().unwrap().iter().all(|x| x.is_finite()));
    }
}

#[test]
fn the_policy_survives_a_config_round_trip() {
    let _g = lock();
    let d = Dense::new(2).dtype(policy("mixed_float16"));
    let c = d.config();
    assert_eq!(c["config"]["dtype"], "mixed_float16");
    let back = ferroflow_keras::layers::deserialize(&c).unwrap();
    assert_eq!(back.base().dtype_policy.name(), "mixed_float16");
    // Keras' serialized policy object.
    let mut keras_form = c.clone();
    keras_form["config"]["dtype"] =
        serde_json::json!({"class_name": "Policy", "config": {"name": "mixed_bfloat16"}});
    let back = ferroflow_keras::layers::deserialize(&keras_form).unwrap();
    assert_eq!(back.base().dtype_policy.compute_dtype(), DType::BF16);
    let mut bad = c;
    bad["config"]["dtype"] = serde_json::json!("int8");
    assert!(ferroflow_keras::layers::deserialize(&bad).is_err());
}
