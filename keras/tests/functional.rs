//! The Functional API: symbolic inputs, shared layers, raw ops as nodes, several inputs and
//! outputs, nesting, fit, save/load.

use ferroflow_keras::activations::Activation;
use ferroflow_keras::functional::{input, KerasTensor, Symbolic};
use ferroflow_keras::layers::{Add, Concatenate, Dense};
use ferroflow_keras::losses::MeanSquaredError;
use ferroflow_keras::{FitConfig, Functional, Layer, LayerRef, Model};
use ferroflow_optim::Adam;
use ferroflow_tensor::{random, DType, Tensor};

fn x(n: usize, d: usize, seed: u64) -> Tensor {
    ferroflow::init();
    random::stateless_normal(&[n, d], [seed, 9], 0.0, 1.0, DType::F32).unwrap()
}

/// Compiles `model` for mean squared error with Adam and fits it: the loss per epoch.
fn fit_regression(model: &mut Model, xs: &Tensor, ys: &Tensor, epochs: usize) -> Vec<f64> {
    model
        .compile(Adam::new(0.02), MeanSquaredError::new(), &[])
        .unwrap();
    let h = model
        .fit(
            xs,
            ys,
            FitConfig::new().epochs(epochs).batch_size(32).verbose(0),
        )
        .unwrap();
    h.get("loss").unwrap().to_vec()
}

#[test]
fn graph_runs_in_topological_order_with_shared_layers_and_ops() {
    ferroflow::init();
    let a = input(&[3], "a");
    let b = input(&[3], "b");
    assert_eq!(a.shape(), &[None, Some(3)]);
    let shared = LayerRef::new(Dense::new(4).activation(Activation::Tanh));
    let ha = (&shared).on(&[&a]).unwrap().remove(0);
    let hb = (&shared).on(&[&b]).unwrap().remove(0);
    let diff = ha.sub(&hb).unwrap().square().unwrap();
    let s = diff.reduce_sum(&[1], true).unwrap();
    let both = Concatenate::new(-1).on(&[&ha, &hb]).unwrap().remove(0);
    let mut model = Model::new(&[a, b], &[s.clone(), both]).unwrap();
    // One set of weights for the shared layer.
    assert_eq!(model.weights().len(), 2);
    let (xa, xb) = (x(5, 3, 1), x(5, 3, 2));
    let out = model.call_multi(&[xa.clone(), xb.clone()], false).unwrap();
    assert_eq!(out[0].shape(), &[5, 1]);
    assert_eq!(out[1].shape(), &[5, 8]);
    // The same computation by hand.
    let w = model.weights();
    let f = |t: &Tensor| {
        t.matmul(&w[0].peek())
            .unwrap()
            .add(&w[1].peek())
            .unwrap()
            .tanh()
            .unwrap()
    };
    let want = f(&xa)
        .sub(&f(&xb))
        .unwrap()
        .square()
        .unwrap()
        .reduce_sum(1isize, true)
        .unwrap();
    let (g, w) = (
        out[0].to_vec::<f32>().unwrap(),
        want.to_vec::<f32>().unwrap(),
    );
    for (g, w) in g.iter().zip(&w) {
        assert!((g - w).abs() < 1e-5);
    }
    // Feeding the wrong number or shape of inputs is an error.
    assert!(model.call_multi(std::slice::from_ref(&xa), false).is_err());
    assert!(model.call_multi(&[xa, x(5, 4, 3)], false).is_err());
}

#[test]
fn disconnected_graphs_are_errors() {
    ferroflow::init();
    let a = input(&[2], "a");
    let b = input(&[2], "b");
    let y = Add::new().on(&[&a, &b]).unwrap().remove(0);
    let e = Model::new(&[a], &[y]).err().unwrap().to_string();
    assert!(e.contains("disconnected") && e.contains("\"b\""), "{e}");
}

#[test]
fn nested_functional_models_fit_and_save() {
    let scratch = tempfile::Builder::new()
        .prefix("ferroflow-functional-")
        .tempdir()
        .unwrap();
    let dir = scratch.path().join("model");
    ferroflow::init();
    let inner_in = input(&[4], "inner_in");
    let h = Dense::new(8)
        .activation(Activation::Relu)
        .on(&[&inner_in])
        .unwrap()
        .remove(0);
    let inner = Functional::new(&[inner_in], &[h]).unwrap();
    let outer_in = input(&[4], "outer_in");
    let z = inner.on(&[&outer_in]).unwrap().remove(0);
    let y = Dense::new(1).on(&[&z]).unwrap().remove(0);
    let y = y.add(&outer_in.reduce_mean(&[1], true).unwrap()).unwrap();
    let mut model = Model::new(&[outer_in], &[y]).unwrap();
    assert_eq!(model.count_params(), 4 * 8 + 8 + 8 + 1);
    let xs = x(256, 4, 4);
    let ys = xs.reduce_sum(-1isize, true).unwrap();
    let l = fit_regression(&mut model, &xs, &ys, 30);
    assert!(l[29] < 0.1 * l[0], "{l:?}");
    let s = model.summary().unwrap();
    assert!(s.contains("(Functional)"), "{s}");
    model.save(&dir).unwrap();
    let mut back = Model::load(&dir).unwrap();
    let (p, q) = (
        model.predict(&xs, 64).unwrap(),
        back.predict(&xs, 64).unwrap(),
    );
    assert_eq!(p.to_vec::<f32>().unwrap(), q.to_vec::<f32>().unwrap());
    // A custom lambda node cannot be saved: an error, nothing written.
    let a = input(&[2], "a");
    let l = KerasTensor::lambda(&[&a], |t| Ok(vec![t[0].mul(&t[0])?])).unwrap();
    let m = Model::new(&[a], &[l]).unwrap();
    let where_ = dir.join("lambda");
    let e = m.save(&where_).unwrap_err().to_string();
    assert!(e.contains("lambda"), "{e}");
    assert!(!where_.exists());
}

#[test]
fn several_outputs_get_keras_named_losses_and_metrics() {
    ferroflow::init();
    let a = input(&[3], "features");
    let h = Dense::new(8)
        .activation(Activation::Relu)
        .on(&[&a])
        .unwrap()
        .remove(0);
    let mut first = Dense::new(1);
    first.base_mut().set_name("price");
    let mut second = Dense::new(2);
    second.base_mut().set_name("extras");
    let p = first.on(&[&h]).unwrap().remove(0);
    let e = second.on(&[&h]).unwrap().remove(0);
    let mut model = Model::new(&[a], &[p, e]).unwrap();
    model
        .compile(Adam::new(0.01), MeanSquaredError::new(), &["mae"])
        .unwrap();
    let xs = x(64, 3, 4);
    let yp = xs.reduce_sum(1isize, true).unwrap();
    let ye = xs.slice(&[0, 0], &[64, 2]).unwrap().contiguous().unwrap();
    let h = model
        .fit(
            vec![xs.clone()],
            vec![yp.clone(), ye.clone()],
            FitConfig::new().epochs(3).batch_size(16).verbose(0),
        )
        .unwrap();
    let keys: Vec<&str> = h.history.iter().map(|(k, _)| k.as_str()).collect();
    assert_eq!(
        keys,
        [
            "loss",
            "price_loss",
            "extras_loss",
            "price_mae",
            "extras_mae"
        ]
    );
    // The total is the sum of the per-output losses (no regularizers here).
    let logs = model
        .evaluate(vec![xs.clone()], vec![yp.clone(), ye.clone()], 64)
        .unwrap();
    let total = logs.get("loss").unwrap();
    let parts = logs.get("price_loss").unwrap() + logs.get("extras_loss").unwrap();
    assert!(
        (total - parts).abs() < 1e-5 * total.abs().max(1.0),
        "{total} vs {parts}"
    );
    // Each output's metric matches the loss computed on that output alone.
    let out = model.call_multi(std::slice::from_ref(&xs), false).unwrap();
    let mae = out[1]
        .sub(&ye)
        .unwrap()
        .abs()
        .unwrap()
        .to_vec::<f32>()
        .unwrap();
    let want = mae.iter().sum::<f32>() as f64 / mae.len() as f64;
    assert!((logs.get("extras_mae").unwrap() - want).abs() < 1e-5);
}

/// Every op a TFOpLambda node can record survives `get_config` → `from_config` (by its
/// `tf.math` name) and computes the same; a config naming an unknown op is refused when read,
/// with the name and the known ones in the error.
#[test]
fn every_recorded_op_round_trips_through_the_config() {
    use ferroflow_keras::functional::{
        SymbolicBinary, SymbolicMath, SymbolicReduce, SymbolicUnary, TfOp,
    };
    ferroflow::init();
    let a = input(&[3], "a");
    let b = input(&[3], "b");
    let mut outs = vec![];
    for &op in SymbolicBinary::ALL {
        let node = if op == SymbolicBinary::Matmul {
            let row = a.reshape(&[1, 3]).unwrap();
            let column = b.reshape(&[3, 1]).unwrap();
            KerasTensor::op(&[&row, &column], TfOp::Binary(op)).unwrap()
        } else {
            KerasTensor::op(&[&a, &b], TfOp::Binary(op)).unwrap()
        };
        outs.push(node);
    }
    let positive = a.abs().unwrap().add(&b.abs().unwrap()).unwrap();
    for &m in SymbolicMath::ALL {
        outs.push(KerasTensor::op(&[&positive], TfOp::Unary(SymbolicUnary::Math(m))).unwrap());
    }
    for act in [Activation::Relu, Activation::Gelu, Activation::Softmax] {
        outs.push(KerasTensor::op(&[&a], TfOp::Unary(SymbolicUnary::Activation(act))).unwrap());
    }
    for &r in SymbolicReduce::ALL {
        let op = TfOp::Reduce {
            op: r,
            axes: vec![1],
            keepdims: true,
        };
        outs.push(KerasTensor::op(&[&a], op).unwrap());
    }
    let model = Functional::new(&[a, b], &outs).unwrap();
    let config = model.get_config();
    let mut back = Functional::from_config(&config).unwrap();
    let mut model = model;
    let inputs = [x(4, 3, 11), x(4, 3, 12)];
    let want = model.call(&inputs, false).unwrap();
    let got = back.call(&inputs, false).unwrap();
    assert_eq!(want.len(), outs.len());
    for (w, g) in want.iter().zip(&got) {
        assert_eq!(w.to_vec::<f32>().unwrap(), g.to_vec::<f32>().unwrap());
    }
    let text = config.to_string();
    for name in [
        "\"multiply\"",
        "\"matmul\"",
        "\"negative\"",
        "\"gelu\"",
        "\"mean\"",
    ] {
        assert!(text.contains(name), "{name} missing from {text}");
    }
    let bad: serde_json::Value =
        serde_json::from_str(&text.replacen("\"multiply\"", "\"multiplyy\"", 1)).unwrap();
    let e = Functional::from_config(&bad).err().unwrap().to_string();
    assert!(e.contains("multiplyy") && e.contains("subtract"), "{e}");
}

/// Any tensor op or NumPy-API function on KerasTensors is a node (`KerasTensor::apply`,
/// TF 2.4's TFOpLambda): gradients flow through it, the model trains with `fit` (as graphs,
/// the default), saves and loads without the closures, and the loaded model predicts the
/// same bits at batch sizes never traced.
#[test]
fn any_op_on_keras_tensors_trains_saves_and_loads() {
    let scratch = tempfile::Builder::new()
        .prefix("ferroflow-functional-")
        .tempdir()
        .unwrap();
    let dir = scratch.path().join("model");
    ferroflow::init();
    let a = input(&[4], "a");
    let h = Dense::new(6).on(&[&a]).unwrap().remove(0);
    // Ops outside the typed list: |x| then log1p, a split with two results, a scan, a
    // NumPy-API function, and a node of two inputs.
    let h = h.map("log1p_abs", |t| t.abs()?.log1p()).unwrap();
    let parts = KerasTensor::apply("split", &[&h], |t| t[0].split(&[3, 3], -1)).unwrap();
    assert_eq!(parts.len(), 2);
    let left = parts[0]
        .map("cumsum", |t| t.cumsum(-1, false, false))
        .unwrap();
    let right = parts[1]
        .map("numpy.sinc", |t| ferroflow::numpy::sinc(t))
        .unwrap();
    let mixed = KerasTensor::apply("logaddexp", &[&left, &right], |t| {
        Ok(vec![ferroflow::numpy::logaddexp(&t[0], &t[1])?])
    })
    .unwrap()
    .remove(0);
    let y = Dense::new(1).on(&[&mixed]).unwrap().remove(0);
    let mut model = Model::new(&[a], &[y]).unwrap();
    let xs = x(256, 4, 21);
    let ys = xs.reduce_sum(-1isize, true).unwrap();
    let first = model.get_weights().unwrap()[0].to_vec::<f32>().unwrap();
    let l = fit_regression(&mut model, &xs, &ys, 20);
    assert!(l[19] < 0.5 * l[0], "{l:?}");
    // The first Dense learned: gradients reached it through the traced nodes.
    assert_ne!(
        model.get_weights().unwrap()[0].to_vec::<f32>().unwrap(),
        first
    );
    model.save(&dir).unwrap();
    let config = std::fs::read_to_string(dir.join("config.json")).unwrap();
    assert_eq!(config.matches("\"traced\"").count(), 5, "{config}");
    let mut back = Model::load(&dir).unwrap();
    for n in [1, 7, 64] {
        let xs = x(n, 4, 30 + n as u64);
        let (p, q) = (
            model.predict(&xs, 64).unwrap(),
            back.predict(&xs, 64).unwrap(),
        );
        assert_eq!(p.shape(), &[n, 1]);
        assert_eq!(p.to_vec::<f32>().unwrap(), q.to_vec::<f32>().unwrap());
    }
    // A variable inside the function is refused, by name: weights belong to layers.
    let v = ferroflow_tensor::Variable::new("gain", Tensor::ones(&[4], DType::F32).unwrap());
    let b = input(&[4], "b");
    let e = b
        .map("gain", |t| t.mul(&v.value()))
        .unwrap_err()
        .to_string();
    assert!(e.contains("TFOpLambda") && e.contains("\"gain\""), "{e}");
}
