//! Every Keras layer, traced into a graph function and replayed, gives the same outputs and
//! the same gradients (for its float inputs and its weights, from a tape inside the
//! function) as the same layer run eagerly, bit for bit: the replay runs the same kernels.
//! The layers come from `deserialize` (each class it knows), with the configs and inputs of
//! TF's fixtures (`fixtures/tf_layers.json`) and a table here for the rest; layers that
//! compute on the host answer `traceable() == false` (models holding them stay eager).

use ferroflow::autodiff::{GradientTape, Source};
use ferroflow::function::Function;
use ferroflow_keras::layers::{deserialize, Normalization};
use ferroflow_keras::Layer;
use ferroflow_tensor::{random, Axes, DType, Result, Tensor};
use serde_json::{json, Value};
use std::sync::{Arc, Mutex};

mod tf_fixture;
use tf_fixture::{floats, shape, tensor as fixture_tensor};

fn normal(shape: &[usize], seed: u64) -> Tensor {
    random::stateless_normal(shape, [seed, 21], 0.0, 1.0, DType::F32).unwrap()
}

fn ints(shape: &[usize], seed: u64, below: f64) -> Tensor {
    random::stateless_uniform(shape, [seed, 22], 0.0, below, DType::I32).unwrap()
}

fn bits(t: &Tensor) -> Vec<u64> {
    t.cast(DType::F64)
        .unwrap()
        .to_vec::<f64>()
        .unwrap()
        .iter()
        .map(|v| v.to_bits())
        .collect()
}

/// The layer's outputs, then the gradients of a fixed linear function of them for each
/// float input and each weight (zeros where none flows).
fn outputs_and_gradients(
    layer: &mut dyn Layer,
    inputs: &[Tensor],
    training: bool,
) -> Result<Vec<Tensor>> {
    let tape = GradientTape::new();
    let float_inputs: Vec<&Tensor> = inputs.iter().filter(|t| t.dtype().is_float()).collect();
    for t in &float_inputs {
        tape.watch(t);
    }
    let ys = layer.apply(inputs, training)?;
    // Integer outputs (lookups, bucketing) have no gradient: their values are compared.
    let mut loss: Option<Tensor> = None;
    for (k, y) in ys.iter().enumerate().filter(|(_, y)| y.dtype().is_float()) {
        let cotangent = random::stateless_normal(y.shape(), [k as u64, 23], 0.0, 1.0, y.dtype())?;
        let term = y
            .mul(&cotangent)?
            .reduce_sum(Axes::All, false)?
            .cast(DType::F32)?;
        loss = Some(match loss {
            Some(l) => l.add(&term)?,
            None => term,
        });
    }
    let Some(loss) = loss else {
        return Ok(ys);
    };
    let weights = layer.weights();
    let sources: Vec<Source> = float_inputs
        .iter()
        .map(|t| Source::from(*t))
        .chain(
            weights
                .iter()
                .filter(|v| v.dtype().is_float())
                .map(Source::from),
        )
        .collect();
    let grads = tape.gradient_with(
        &[loss],
        &sources,
        None,
        ferroflow::autodiff::UnconnectedGradients::Zero,
    )?;
    let mut out = ys;
    out.extend(grads.into_iter().flatten());
    Ok(out)
}

/// Builds the layer eagerly, then compares an eager call with a traced and a replayed one.
fn check(name: &str, layer: Box<dyn Layer>, inputs: Vec<Tensor>, training: bool) {
    let layer = Arc::new(Mutex::new(layer));
    {
        let mut l = layer.lock().unwrap();
        l.apply(&inputs, training)
            .unwrap_or_else(|e| panic!("{name}: {e}"));
        if !l.traceable() {
            return;
        }
    }
    let eager = outputs_and_gradients(&mut **layer.lock().unwrap(), &inputs, training)
        .unwrap_or_else(|e| panic!("{name} eagerly: {e}"));
    let f = {
        let layer = layer.clone();
        Function::new(move |a: &[Tensor]| {
            outputs_and_gradients(&mut **layer.lock().unwrap(), a, training)
        })
    };
    for call in ["trace", "replay"] {
        let traced = f
            .call(&inputs)
            .unwrap_or_else(|e| panic!("{name} ({call}): {e}"));
        assert_eq!(traced.len(), eager.len(), "{name} ({call})");
        for (i, (t, e)) in traced.iter().zip(&eager).enumerate() {
            assert_eq!(t.shape(), e.shape(), "{name} ({call}) value {i}");
            assert_eq!(bits(t), bits(e), "{name} ({call}) value {i}");
        }
    }
    assert_eq!(f.tracing_count(), 1, "{name}");
}

#[test]
fn tf_fixture_layers_traced_equal_eager() {
    ferroflow::init();
    let fixture: Value = serde_json::from_str(include_str!("fixtures/tf_layers.json")).unwrap();
    for case in fixture["cases"].as_array().unwrap() {
        let name = case["name"].as_str().unwrap();
        let class = case["class_name"].as_str().unwrap();
        let layer: Box<dyn Layer> = if let Some(adapt) = case.get("adapt") {
            let mut n = Normalization::from_config(&case["config"]).unwrap();
            let data = Tensor::from_vec(floats(&adapt["data"]), &shape(&adapt["shape"])).unwrap();
            n.adapt(&data.cast(DType::F32).unwrap()).unwrap();
            Box::new(n)
        } else {
            deserialize(&json!({ "class_name": class, "config": case["config"] }))
                .unwrap_or_else(|e| panic!("{name}: {e}"))
        };
        check(name, layer, vec![fixture_tensor(&case["x"])], false);
    }
}

#[test]
fn core_layers_traced_equal_eager() {
    ferroflow::init();
    // TF Keras' own configs (`fixtures/layer_configs.py` writes them), in this table's order.
    let configs: Value = serde_json::from_str(include_str!("fixtures/layer_configs.json")).unwrap();
    let configs = configs["layers"].as_array().unwrap();
    let cases: Vec<(&str, Vec<Tensor>, bool)> = vec![
        ("Dense", vec![normal(&[2, 4], 1)], false),
        ("Activation", vec![normal(&[2, 4], 2)], false),
        ("Dropout", vec![normal(&[2, 4], 3)], false),
        ("Flatten", vec![normal(&[2, 3, 2], 4)], false),
        ("Reshape", vec![normal(&[2, 3, 2], 5)], false),
        ("Rescaling", vec![normal(&[2, 4], 6)], false),
        ("Conv2D", vec![normal(&[2, 5, 5, 3], 7)], false),
        ("MaxPooling2D", vec![normal(&[2, 4, 4, 2], 8)], false),
        ("AveragePooling2D", vec![normal(&[2, 4, 4, 2], 9)], false),
        (
            "GlobalAveragePooling2D",
            vec![normal(&[2, 4, 4, 2], 10)],
            false,
        ),
        ("GlobalMaxPooling2D", vec![normal(&[2, 4, 4, 2], 11)], false),
        ("BatchNormalization", vec![normal(&[4, 3], 12)], false),
        ("BatchNormalization", vec![normal(&[4, 3], 13)], true),
        ("LayerNormalization", vec![normal(&[2, 5], 14)], false),
        ("Add", vec![normal(&[2, 3], 15), normal(&[2, 3], 16)], false),
        (
            "Multiply",
            vec![normal(&[2, 3], 17), normal(&[2, 3], 18)],
            false,
        ),
        (
            "Concatenate",
            vec![normal(&[2, 3], 19), normal(&[2, 2], 20)],
            false,
        ),
        ("Embedding", vec![ints(&[2, 4], 21, 10.0)], false),
        ("Conv1D", vec![normal(&[2, 6, 3], 22)], false),
        ("Conv2DTranspose", vec![normal(&[1, 3, 3, 2], 23)], false),
        ("DepthwiseConv2D", vec![normal(&[1, 4, 4, 2], 24)], false),
        ("SimpleRNN", vec![normal(&[2, 4, 3], 25)], false),
        ("LSTM", vec![normal(&[2, 4, 3], 26)], false),
        ("LSTM", vec![normal(&[2, 4, 3], 27)], false),
        ("GRU", vec![normal(&[2, 4, 3], 28)], false),
        (
            "MultiHeadAttention",
            vec![normal(&[1, 3, 4], 29), normal(&[1, 3, 4], 30)],
            false,
        ),
        ("ZeroPadding2D", vec![normal(&[1, 3, 3, 2], 31)], false),
        ("RandomFlip", vec![normal(&[1, 3, 3, 2], 32)], true),
        ("RandomRotation", vec![normal(&[1, 3, 3, 2], 33)], true),
        ("RandomZoom", vec![normal(&[1, 3, 3, 2], 34)], true),
        ("RandomContrast", vec![normal(&[1, 3, 3, 2], 35)], true),
    ];
    assert_eq!(
        cases.len(),
        configs.len(),
        "the table and the fixture list the same layers"
    );
    for ((class, inputs, training), saved) in cases.into_iter().zip(configs) {
        assert_eq!(saved["class_name"], class, "the fixture's order");
        let layer = deserialize(saved).unwrap_or_else(|e| panic!("{class}: {e}"));
        if class.starts_with("Random") {
            assert!(
                !layer.traceable(),
                "{class} draws on the host: not traceable"
            );
        }
        check(
            &format!("{class} (training: {training})"),
            layer,
            inputs,
            training,
        );
    }
}
