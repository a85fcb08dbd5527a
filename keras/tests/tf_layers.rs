//! The image and preprocessing layers against TensorFlow's Keras: `fixtures/tf_layers.json`
//! (written by `fixtures/tf_layers.py`) holds each layer's own Keras config, fixed inputs,
//! TF's outputs and TF's input gradients. Every layer is rebuilt from TF's config by
//! `deserialize`, run, differentiated, and saved and loaded inside a model.

use ferroflow::autodiff::{GradientTape, Source};
use ferroflow_keras::layers::{deserialize, Normalization};
use ferroflow_keras::{sequential, Layer, Model};
use ferroflow_tensor::{DType, Tensor};
use serde_json::{json, Value};

mod tf_fixture;
use tf_fixture::{floats, shape, tensor};

fn assert_close(what: &str, got: &Tensor, want_shape: &[usize], want: &[f64]) {
    assert_eq!(got.shape(), want_shape, "{what}: shape");
    let got = got.to_f64_vec().unwrap();
    for (i, (g, w)) in got.iter().zip(want).enumerate() {
        assert!(
            (g - w).abs() <= 1e-5 * (1.0 + w.abs()),
            "{what}[{i}]: ours {g}, TensorFlow {w}"
        );
    }
}

/// The layer TF's config describes, adapted to the case's data where it has some.
fn layer_of(case: &Value) -> Box<dyn Layer> {
    let class = case["class_name"].as_str().unwrap();
    let config = json!({ "class_name": class, "config": case["config"] });
    if let Some(adapt) = case.get("adapt") {
        let mut n = Normalization::from_config(&case["config"]).unwrap();
        let data = Tensor::from_vec(floats(&adapt["data"]), &shape(&adapt["shape"])).unwrap();
        n.adapt(&data.cast(DType::F32).unwrap()).unwrap();
        return Box::new(n);
    }
    deserialize(&config).unwrap_or_else(|e| panic!("{class} from TF's config: {e}"))
}

#[test]
fn layers_match_tensorflow_outputs_and_gradients() {
    ferroflow::init();
    let fixture: Value = serde_json::from_str(include_str!("fixtures/tf_layers.json")).unwrap();
    for case in fixture["cases"].as_array().unwrap() {
        let name = case["name"].as_str().unwrap();
        let mut layer = layer_of(case);
        let x = tensor(&case["x"]);
        if let Some(weights) = case.get("weights") {
            // Built by a first call, then given TF's weights in Keras' order.
            layer
                .forward(&x, false)
                .unwrap_or_else(|e| panic!("{name}: {e}"));
            let ours = layer.weights();
            let theirs = weights.as_array().unwrap();
            assert_eq!(ours.len(), theirs.len(), "{name}: weight count");
            for (v, w) in ours.iter().zip(theirs) {
                assert_eq!(v.shape(), shape(&w["shape"]), "{name}: {}", v.name());
                v.assign(
                    &Tensor::from_vec(floats(&w["data"]), &shape(&w["shape"]))
                        .unwrap()
                        .cast(v.dtype())
                        .unwrap(),
                )
                .unwrap();
            }
        }
        let tape = GradientTape::new();
        tape.watch(&x);
        let y = layer
            .forward(&x, false)
            .unwrap_or_else(|e| panic!("{name}: {e}"));
        assert_eq!(
            y.dtype(),
            DType::parse(case["y"]["dtype"].as_str().unwrap()).unwrap(),
            "{name}: dtype"
        );
        assert_close(
            name,
            &y,
            &shape(&case["y"]["shape"]),
            &floats(&case["y"]["data"]),
        );
        if let Some(cot) = case.get("cotangent") {
            let cot = Tensor::from_vec(floats(cot), y.shape())
                .unwrap()
                .cast(y.dtype())
                .unwrap();
            let loss = y
                .mul(&cot)
                .unwrap()
                .reduce_sum(ferroflow_tensor::Axes::All, false)
                .unwrap();
            let dx = tape.gradient(&loss, &[Source::from(&x)]).unwrap()[0]
                .clone()
                .unwrap_or_else(|| panic!("{name}: no gradient"));
            assert_close(&format!("{name} dx"), &dx, x.shape(), &floats(&case["dx"]));
        }
        // Our own config rebuilds a layer that computes the same.
        let mut again = deserialize(&layer.config()).unwrap_or_else(|e| panic!("{name}: {e}"));
        if case.get("adapt").is_none() && case.get("weights").is_none() {
            let y2 = again.forward(&x, false).unwrap();
            assert_eq!(
                y2.to_f64_vec().unwrap(),
                y.to_f64_vec().unwrap(),
                "{name}: config round trip"
            );
        }
    }
}

#[test]
fn image_and_preprocessing_layers_save_and_load_with_the_model() {
    ferroflow::init();
    use ferroflow_keras::layers::*;
    let mut norm = Normalization::new();
    let data =
        ferroflow_tensor::random::stateless_normal(&[64, 6, 6, 2], [1, 2], 3.0, 2.0, DType::F32)
            .unwrap();
    norm.adapt(&data).unwrap();
    let mut model = Model::from(sequential![
        norm,
        ZeroPadding2D::new([(1, 1), (0, 2)]),
        UpSampling2D::new([2, 2]).interpolation(Interpolation::Bilinear),
        Cropping2D::new([(1, 0), (2, 1)]),
        Resizing::new(7, 6),
        CenterCrop::new(5, 4),
        SeparableConv2D::new(3, [3, 3]).padding(ferroflow_tensor::Padding::Same),
        Flatten::new(),
        Dense::new(3)
    ]);
    let x = data.slice(&[0, 0, 0, 0], &[4, -1, -1, -1]).unwrap();
    let before = model.predict(x.clone(), 4).unwrap();
    let dir = tempfile::Builder::new()
        .prefix("ferroflow-prep-")
        .tempdir()
        .unwrap();
    model.save(dir.path()).unwrap();
    let mut loaded = Model::load(dir.path()).unwrap();
    let after = loaded.predict(x, 4).unwrap();
    assert_eq!(before.shape(), &[4, 3]);
    assert_eq!(before.to_f64_vec().unwrap(), after.to_f64_vec().unwrap());
}

#[test]
fn sequence_layers_save_and_load_with_the_model() {
    ferroflow::init();
    use ferroflow_keras::layers::*;
    let mut model = Model::from(sequential![
        TimeDistributed::new(Dense::new(4)),
        Bidirectional::new(Gru::new(3).return_sequences(true)).unwrap(),
        MaxPooling1D::new(2),
        AveragePooling1D::new(2).padding(ferroflow_tensor::Padding::Same),
        Bidirectional::new(Lstm::new(2).return_sequences(true))
            .unwrap()
            .merge_mode(MergeMode::Ave),
        GlobalMaxPooling1D::new(),
        Dense::new(2)
    ]);
    let x = ferroflow_tensor::random::stateless_normal(&[3, 8, 5], [4, 5], 0.0, 1.0, DType::F32)
        .unwrap();
    let before = model.predict(x.clone(), 3).unwrap();
    let dir = tempfile::Builder::new()
        .prefix("ferroflow-seq-")
        .tempdir()
        .unwrap();
    model.save(dir.path()).unwrap();
    let after = Model::load(dir.path()).unwrap().predict(x, 3).unwrap();
    assert_eq!(before.shape(), &[3, 2]);
    assert_eq!(before.to_f64_vec().unwrap(), after.to_f64_vec().unwrap());
    assert!(
        Bidirectional::new(Dense::new(2)).is_err(),
        "only recurrent layers"
    );
}

#[test]
fn volume_layers_save_and_load_with_the_model() {
    ferroflow::init();
    use ferroflow_keras::layers::*;
    let mut model = Model::from(sequential![
        Conv3D::new(3, [2, 2, 2]).padding(ferroflow_tensor::Padding::Same),
        MaxPooling3D::new([1, 2, 2]),
        AveragePooling3D::new([2, 1, 1]).padding(ferroflow_tensor::Padding::Same),
        GlobalAveragePooling3D::new(),
        Dense::new(2)
    ]);
    let x =
        ferroflow_tensor::random::stateless_normal(&[2, 3, 4, 4, 2], [6, 7], 0.0, 1.0, DType::F32)
            .unwrap();
    let before = model.predict(x.clone(), 2).unwrap();
    let dir = tempfile::Builder::new()
        .prefix("ferroflow-vol-")
        .tempdir()
        .unwrap();
    model.save(dir.path()).unwrap();
    let after = Model::load(dir.path()).unwrap().predict(x, 2).unwrap();
    assert_eq!(before.shape(), &[2, 2]);
    assert_eq!(before.to_f64_vec().unwrap(), after.to_f64_vec().unwrap());
}

#[test]
fn bad_inputs_are_errors_naming_the_layer() {
    ferroflow::init();
    use ferroflow_keras::layers::*;
    let img = Tensor::ones(&[1, 4, 4, 1], DType::F32).unwrap();
    let err = |r: ferroflow_tensor::Result<Tensor>| r.expect_err("an error").to_string();
    assert!(err(Cropping2D::new([(2, 2), (0, 0)]).forward(&img, false)).contains("Cropping2D"));
    assert!(err(CenterCrop::new(5, 2).forward(&img, false)).contains("CenterCrop"));
    assert!(err(ZeroPadding2D::new([(1, 1), (1, 1)])
        .forward(&Tensor::ones(&[4, 4], DType::F32).unwrap(), false))
    .contains("NHWC"));
    assert!(err(Resizing::new(0, 3).forward(&img, false)).contains("positive"));
    let tokens = Tensor::from_vec(vec![0i64, 7], &[2]).unwrap();
    assert!(
        err(CategoryEncoding::new(4, CategoryOutput::Count).forward(&tokens, false))
            .contains("num_tokens=4")
    );
    assert!(Discretization::new(&[1.0, 0.0]).is_err());
    let mut n = Normalization::new().with_mean_variance(&[0.0, 1.0, 2.0], &[1.0]);
    assert!(
        err(n.forward(&Tensor::ones(&[2, 2], DType::F32).unwrap(), false)).contains("3 values")
    );
    assert!(deserialize(&json!({"class_name": "Resizing", "config": {"height": 2, "width": 2, "interpolation": "lanczos5"}})).is_err());
    assert!(err(Hashing::new(4).unwrap().forward(&img, false)).contains("integer"));
    assert!(Hashing::with_mask(1, Some(0)).is_err());
    assert!(
        IntegerLookup::new(&[3, 0]).is_err(),
        "the mask value in the vocabulary"
    );
    assert!(IntegerLookup::new(&[3, 3]).is_err(), "a repeated value");
    let mut strict = IntegerLookup::with_options(&[5], None, 0, -1, false).unwrap();
    let unknown = Tensor::from_vec(vec![5i64, 6], &[2]).unwrap();
    assert!(err(strict.forward(&unknown, false)).contains("not in the vocabulary"));
    assert!(deserialize(
        &json!({"class_name": "Hashing", "config": {"num_bins": 3, "salt": [1, 2]}})
    )
    .is_err());
}

#[test]
fn image_transforms_match_tensorflows_kernel_in_every_fill_mode() {
    ferroflow::init();
    use ferroflow_keras::layers::*;
    let fixture: Value = serde_json::from_str(include_str!("fixtures/tf_layers.json")).unwrap();
    let e = &fixture["image_transforms"];
    let images = Tensor::from_vec(floats(&e["images"]["data"]), &shape(&e["images"]["shape"]))
        .unwrap()
        .cast(DType::F32)
        .unwrap();
    let (h, w) = (images.shape()[1], images.shape()[2]);
    let matrix = |v: &Value| -> Vec<[f32; 8]> {
        v.as_array()
            .unwrap()
            .iter()
            .map(|row| {
                let r = floats(row);
                std::array::from_fn(|i| r[i] as f32)
            })
            .collect()
    };
    // TF 2.4's rotation and zoom matrices.
    let angles: Vec<f32> = floats(&e["angles"]).iter().map(|&a| a as f32).collect();
    let zooms: Vec<(f32, f32)> = e["zooms"]
        .as_array()
        .unwrap()
        .iter()
        .map(|z| (z[0].as_f64().unwrap() as f32, z[1].as_f64().unwrap() as f32))
        .collect();
    let mut checked = 0;
    for t in e["transforms"].as_array().unwrap() {
        let kind = t["kind"].as_str().unwrap();
        let theirs = matrix(&t["transforms"]);
        let ours = match kind {
            "rotation" => rotation_matrices(&angles, h, w),
            "zoom" => zoom_matrices(&zooms, h, w),
            _ => theirs.clone(),
        };
        for (a, b) in ours.iter().flatten().zip(theirs.iter().flatten()) {
            assert!(
                (a - b).abs() <= 1e-6 * (1.0 + b.abs()),
                "{kind} matrix: {ours:?} vs {theirs:?}"
            );
        }
        let fill = match t["fill_mode"].as_str().unwrap() {
            "reflect" => FillMode::Reflect,
            "wrap" => FillMode::Wrap,
            "constant" => FillMode::Constant,
            _ => FillMode::Nearest,
        };
        let interp = match t["interpolation"].as_str().unwrap() {
            "bilinear" => Interpolation::Bilinear,
            _ => Interpolation::Nearest,
        };
        let y = transform_images(&images, &theirs, interp, fill, 0.5).unwrap();
        let what = format!("{kind} {fill:?} {interp:?}");
        assert_close(&what, &y, images.shape(), &floats(&t["y"]));
        checked += 1;
    }
    assert_eq!(checked, 24);
    let contrast = adjust_contrast(&images, &images.scalar_like(1.7).unwrap()).unwrap();
    assert_close(
        "adjust_contrast",
        &contrast,
        images.shape(),
        &floats(&e["contrast_1_7"]),
    );
}

#[test]
fn random_augmentations_are_the_identity_in_inference_and_their_transform_in_training() {
    ferroflow::init();
    use ferroflow_keras::layers::*;
    let x =
        ferroflow_tensor::random::stateless_uniform(&[4, 6, 5, 2], [9, 9], 0.0, 1.0, DType::F32)
            .unwrap();
    let layers: Vec<Box<dyn Layer>> = vec![
        Box::new(RandomFlip::new("horizontal_and_vertical").unwrap()),
        Box::new(RandomRotation::new(0.2).seed(1)),
        Box::new(RandomZoom::new(0.3).width_factor(-0.1, 0.4).seed(2)),
        Box::new(RandomContrast::new(0.5).unwrap()),
    ];
    for mut l in layers {
        let name = l.class_name();
        let same = l.forward(&x, false).unwrap();
        assert_eq!(
            same.to_f64_vec().unwrap(),
            x.to_f64_vec().unwrap(),
            "{name} in inference"
        );
        let y = l.forward(&x, true).unwrap();
        assert_eq!(y.shape(), x.shape(), "{name}");
        assert_ne!(
            y.to_f64_vec().unwrap(),
            x.to_f64_vec().unwrap(),
            "{name} in training"
        );
        // Gradients reach the input.
        let tape = GradientTape::new();
        tape.watch(&x);
        let y = l.forward(&x, true).unwrap();
        let s = y.reduce_sum(ferroflow_tensor::Axes::All, false).unwrap();
        let g = tape.gradient(&s, &[Source::from(&x)]).unwrap()[0].clone();
        assert!(g.is_some(), "{name}: no gradient");
        // Our config rebuilds it.
        assert!(deserialize(&l.config()).is_ok(), "{name} config");
    }
    // A flip is a flip: each image is itself or its mirror.
    let mut flip = RandomFlip::new("horizontal").unwrap();
    let y = flip.forward(&x, true).unwrap();
    let mirror = x.reverse(&[2]).unwrap();
    for i in 0..4 {
        let row = |t: &Tensor| {
            t.slice(&[i, 0, 0, 0], &[1, -1, -1, -1])
                .unwrap()
                .to_f64_vec()
                .unwrap()
        };
        assert!(row(&y) == row(&x) || row(&y) == row(&mirror), "image {i}");
    }
    // A rotation by the layer's own draw: the transform of TF 2.4's rotation matrix.
    let mut rot = RandomRotation::new(0.25).fill_mode(FillMode::Constant);
    let y = ferroflow_tensor::testing::seeded(5, || rot.forward(&x, true).unwrap());
    let turn = 2.0 * std::f64::consts::PI;
    let angles = ferroflow_tensor::testing::seeded(5, || {
        ferroflow_tensor::random::uniform(&[4], -0.25 * turn, 0.25 * turn, DType::F32, None)
            .unwrap()
            .to_vec::<f32>()
            .unwrap()
    });
    let want = transform_images(
        &x,
        &rotation_matrices(&angles, 6, 5),
        Interpolation::Bilinear,
        FillMode::Constant,
        0.0,
    )
    .unwrap();
    assert_eq!(y.to_f64_vec().unwrap(), want.to_f64_vec().unwrap());
    assert!(RandomFlip::new("diagonal").is_err());
    assert!(RandomContrast::new(1.5).is_err());
}
