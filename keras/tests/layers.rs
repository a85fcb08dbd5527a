//! Layers against plain f64 references: Dense, activations, normalization, dropout,
//! pooling and merge layers, initializers and regularizers.

use ferroflow_keras::activations::Activation;
use ferroflow_keras::initializers::{compute_fans, Initializer};
use ferroflow_keras::layers::*;
use ferroflow_keras::regularizers::Regularizer;
use ferroflow_keras::Layer;
use ferroflow_tensor::{random, DType, Padding, Tensor};
use proptest::prelude::*;

fn init() {
    ferroflow::init();
}

fn randn(shape: &[usize], seed: u64) -> Tensor {
    random::stateless_normal(shape, [seed, 7], 0.0, 1.0, DType::F64).unwrap()
}

fn close(a: &[f64], b: &[f64], tol: f64) {
    assert_eq!(a.len(), b.len());
    for (i, (x, y)) in a.iter().zip(b).enumerate() {
        assert!(
            (x - y).abs() <= tol * (1.0 + y.abs()),
            "element {i}: {x} vs {y}"
        );
    }
}

fn f64_layer<L: Layer>(mut l: L) -> L {
    l.base_mut().dtype_policy = ferroflow_keras::mixed_precision::Policy::new("float64").unwrap();
    l
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(24))]
    #[test]
    fn dense_matches_reference(batch in 1usize..5, mid in 1usize..3, din in 1usize..6, units in 1usize..6, seed in 0u64..1000, act in 0usize..4) {
        init();
        let acts = [Activation::Linear, Activation::Relu, Activation::Tanh, Activation::Sigmoid];
        let mut d = f64_layer(Dense::new(units).activation(acts[act]).kernel_initializer(Initializer::RandomNormal { mean: 0.0, stddev: 1.0, seed: Some(seed) }));
        let x = randn(&[batch, mid, din], seed + 1);
        let y = d.forward(&x, false).unwrap();
        prop_assert_eq!(y.shape(), &[batch, mid, units]);
        let w = d.weights()[0].peek().to_f64_vec().unwrap();
        let b = d.weights()[1].peek().to_f64_vec().unwrap();
        let xv = x.to_f64_vec().unwrap();
        let mut want = vec![];
        for r in 0..batch * mid {
            for u in 0..units {
                let mut s = b[u];
                for k in 0..din { s += xv[r * din + k] * w[k * units + u]; }
                want.push(match act { 0 => s, 1 => s.max(0.0), 2 => s.tanh(), _ => 1.0 / (1.0 + (-s).exp()) });
            }
        }
        close(&y.to_f64_vec().unwrap(), &want, 1e-12);
    }

    #[test]
    fn activations_match_formulas(seed in 0u64..1000) {
        init();
        let x = randn(&[17], seed);
        let xv = x.to_f64_vec().unwrap();
        type Formula = Box<dyn Fn(f64) -> f64>;
        let cases: Vec<(&str, Formula)> = vec![
            ("relu", Box::new(|v: f64| v.max(0.0))),
            ("elu", Box::new(|v: f64| if v > 0.0 { v } else { v.exp() - 1.0 })),
            ("selu", Box::new(|v: f64| 1.050_700_987_355_480_5 * if v > 0.0 { v } else { 1.673_263_242_354_377_3 * (v.exp() - 1.0) })),
            ("softplus", Box::new(|v: f64| (1.0 + v.exp()).ln())),
            ("softsign", Box::new(|v: f64| v / (1.0 + v.abs()))),
            ("swish", Box::new(|v: f64| v / (1.0 + (-v).exp()))),
            ("gelu", Box::new(|v: f64| 0.5 * v * (1.0 + libm_erf(v / 2f64.sqrt())))),
            ("leaky_relu", Box::new(|v: f64| if v > 0.0 { v } else { 0.2 * v })),
            ("relu6", Box::new(|v: f64| v.clamp(0.0, 6.0))),
            ("exponential", Box::new(|v: f64| v.exp())),
        ];
        for (name, f) in cases {
            let y = Activation::parse(name).unwrap().apply(&x).unwrap().to_f64_vec().unwrap();
            let want: Vec<f64> = xv.iter().map(|&v| f(v)).collect();
            close(&y, &want, 1e-9);
        }
        let sm = Activation::Softmax.apply(&x).unwrap().to_f64_vec().unwrap();
        let m = xv.iter().cloned().fold(f64::MIN, f64::max);
        let z: f64 = xv.iter().map(|v| (v - m).exp()).sum();
        close(&sm, &xv.iter().map(|v| (v - m).exp() / z).collect::<Vec<_>>(), 1e-12);
    }
}

/// erf by its series (enough terms for |x| < 6 at f64 precision is not needed: 1e-9 suffices).
fn libm_erf(x: f64) -> f64 {
    // Abramowitz-Stegun 7.1.26 is too coarse; integrate exp(-t²) with Simpson's rule.
    let n = 2000;
    let h = x / n as f64;
    let f = |t: f64| (-t * t).exp();
    let mut s = f(0.0) + f(x);
    for i in 1..n {
        s += f(i as f64 * h) * if i % 2 == 1 { 4.0 } else { 2.0 };
    }
    s * h / 3.0 * 2.0 / std::f64::consts::PI.sqrt()
}

#[test]
fn unknown_activation_is_an_error_listing_the_known_ones() {
    let e = Activation::parse("rellu").unwrap_err().to_string();
    assert!(e.contains("rellu") && e.contains("gelu"), "{e}");
}

#[test]
fn batch_normalization_trains_on_batch_statistics_and_infers_with_moving_ones() {
    init();
    let mut bn = f64_layer(BatchNormalization::new());
    let x = randn(&[6, 2, 2, 3], 1)
        .mul(&Tensor::scalar(3.0f64).unwrap())
        .unwrap();
    let y = bn.forward(&x, true).unwrap();
    let (yv, xv) = (y.to_f64_vec().unwrap(), x.to_f64_vec().unwrap());
    let n = 24usize;
    for c in 0..3 {
        let xs: Vec<f64> = (0..n).map(|i| xv[i * 3 + c]).collect();
        let mean = xs.iter().sum::<f64>() / n as f64;
        let var = xs.iter().map(|v| (v - mean).powi(2)).sum::<f64>() / n as f64;
        for i in 0..n {
            let want = (xs[i] - mean) / (var + 1e-3).sqrt();
            assert!((yv[i * 3 + c] - want).abs() < 1e-9);
        }
        // Moving statistics: one step of momentum 0.99 from (0, 1); the variance is unbiased
        // for NHWC input, as TF's fused kernel.
        let mm = bn.non_trainable_weights()[0].peek().to_f64_vec().unwrap()[c];
        let mv = bn.non_trainable_weights()[1].peek().to_f64_vec().unwrap()[c];
        assert!((mm - 0.01 * mean).abs() < 1e-12);
        assert!((mv - (0.99 + 0.01 * var * n as f64 / (n as f64 - 1.0))).abs() < 1e-12);
    }
    // Inference uses the moving statistics and changes nothing.
    let before = bn.non_trainable_weights()[0].peek().to_f64_vec().unwrap();
    let yi = bn.forward(&x, false).unwrap().to_f64_vec().unwrap();
    let mm = &before;
    let mv = bn.non_trainable_weights()[1].peek().to_f64_vec().unwrap();
    for i in 0..n {
        for c in 0..3 {
            let want = (xv[i * 3 + c] - mm[c]) / (mv[c] + 1e-3).sqrt();
            assert!((yi[i * 3 + c] - want).abs() < 1e-9);
        }
    }
    assert_eq!(
        bn.non_trainable_weights()[0].peek().to_f64_vec().unwrap(),
        before
    );
    assert_eq!(bn.trainable_weights().len(), 2);
}

#[test]
fn layer_normalization_normalizes_each_sample() {
    init();
    let mut ln = f64_layer(LayerNormalization::new());
    let x = randn(&[4, 5], 3);
    let y = ln.forward(&x, true).unwrap().to_f64_vec().unwrap();
    let xv = x.to_f64_vec().unwrap();
    for r in 0..4 {
        let row = &xv[r * 5..r * 5 + 5];
        let mean = row.iter().sum::<f64>() / 5.0;
        let var = row.iter().map(|v| (v - mean).powi(2)).sum::<f64>() / 5.0;
        for j in 0..5 {
            assert!((y[r * 5 + j] - (row[j] - mean) / (var + 1e-3).sqrt()).abs() < 1e-9);
        }
    }
}

#[test]
fn dropout_drops_at_its_rate_scales_the_rest_and_is_the_identity_at_inference() {
    init();
    let mut d = Dropout::new(0.3);
    let x = Tensor::ones(&[200, 100], DType::F32).unwrap();
    let y = d.forward(&x, true).unwrap().to_vec::<f32>().unwrap();
    let dropped = y.iter().filter(|v| **v == 0.0).count() as f64 / y.len() as f64;
    assert!((dropped - 0.3).abs() < 0.02, "dropped {dropped}");
    assert!(y.iter().all(|v| *v == 0.0 || (v - 1.0 / 0.7).abs() < 1e-6));
    assert_eq!(
        d.forward(&x, false).unwrap().to_vec::<f32>().unwrap(),
        vec![1.0; 20000]
    );
    assert!(Dropout::new(1.0).forward(&x, true).is_err());
}

#[test]
fn shape_layers_pooling_and_merges() {
    init();
    let x = randn(&[2, 4, 4, 3], 5);
    assert_eq!(Flatten::new().forward(&x, false).unwrap().shape(), &[2, 48]);
    assert_eq!(
        Reshape::new(&[-1, 6]).forward(&x, false).unwrap().shape(),
        &[2, 8, 6]
    );
    let mp = MaxPooling2D::new([2, 2]).forward(&x, false).unwrap();
    assert_eq!(mp.shape(), &[2, 2, 2, 3]);
    let xv = x.to_f64_vec().unwrap();
    let at = |b: usize, i: usize, j: usize, c: usize| xv[((b * 4 + i) * 4 + j) * 3 + c];
    let want = [
        at(1, 2, 0, 2),
        at(1, 2, 1, 2),
        at(1, 3, 0, 2),
        at(1, 3, 1, 2),
    ]
    .into_iter()
    .fold(f64::MIN, f64::max);
    // A float32 layer casts its float64 input to float32 first (Keras' autocast).
    assert_eq!(mp.dtype(), DType::F32);
    assert_eq!(
        mp.to_f64_vec().unwrap()[((2 + 1) * 2) * 3 + 2],
        want as f32 as f64
    );
    let ap = AveragePooling2D::new([2, 2])
        .padding(Padding::Same)
        .strides([3, 3]);
    assert_eq!(ap.padding, Padding::Same);
    let g = f64_layer(GlobalAveragePooling2D::new())
        .forward(&x, false)
        .unwrap();
    assert_eq!(g.shape(), &[2, 3]);
    let mean0: f64 = (0..16).map(|p| xv[p * 3]).sum::<f64>() / 16.0;
    assert!((g.to_f64_vec().unwrap()[0] - mean0).abs() < 1e-12);
    let a = randn(&[2, 3], 1);
    let b = randn(&[2, 3], 2);
    let s = f64_layer(Add::new())
        .apply(&[a.clone(), b.clone()], false)
        .unwrap();
    let p = f64_layer(Multiply::new())
        .apply(&[a.clone(), b.clone()], false)
        .unwrap();
    let c = f64_layer(Concatenate::new(-1))
        .apply(&[a.clone(), b.clone()], false)
        .unwrap();
    let (av, bv) = (a.to_f64_vec().unwrap(), b.to_f64_vec().unwrap());
    close(
        &s[0].to_f64_vec().unwrap(),
        &av.iter().zip(&bv).map(|(x, y)| x + y).collect::<Vec<_>>(),
        0.0,
    );
    close(
        &p[0].to_f64_vec().unwrap(),
        &av.iter().zip(&bv).map(|(x, y)| x * y).collect::<Vec<_>>(),
        0.0,
    );
    assert_eq!(c[0].shape(), &[2, 6]);
    assert!(Add::new().apply(&[a], false).is_err());
}

#[test]
fn conv2d_builds_its_kernel_from_the_input_channels() {
    init();
    let mut conv = Conv2D::new(4, [3, 3])
        .padding(Padding::Same)
        .strides([2, 2]);
    let y = conv
        .forward(&Tensor::ones(&[1, 7, 7, 2], DType::F32).unwrap(), false)
        .unwrap();
    assert_eq!(y.shape(), &[1, 4, 4, 4]);
    assert_eq!(conv.weights()[0].shape(), vec![3, 3, 2, 4]);
    // A wrong-rank input is an error, not a panic.
    let mut conv = Conv2D::new(4, [3, 3]);
    assert!(conv
        .forward(&Tensor::ones(&[7, 7], DType::F32).unwrap(), false)
        .is_err());
}

#[test]
fn initializers_have_their_statistics_and_seeds_repeat() {
    init();
    assert_eq!(compute_fans(&[3, 3, 16, 32]), (144.0, 288.0));
    let shape = [400, 300];
    let g = Initializer::GlorotUniform { seed: Some(1) }
        .sample(&shape, DType::F64)
        .unwrap()
        .to_f64_vec()
        .unwrap();
    let limit = (6.0f64 / 700.0).sqrt();
    assert!(g.iter().all(|v| v.abs() <= limit));
    let var = g.iter().map(|v| v * v).sum::<f64>() / g.len() as f64;
    assert!((var - limit * limit / 3.0).abs() < 0.05 * limit * limit / 3.0);
    let h = Initializer::HeNormal { seed: Some(2) }
        .sample(&shape, DType::F64)
        .unwrap()
        .to_f64_vec()
        .unwrap();
    let var = h.iter().map(|v| v * v).sum::<f64>() / h.len() as f64;
    assert!(
        (var - 2.0 / 400.0).abs() < 0.05 * 2.0 / 400.0,
        "he var {var}"
    );
    assert!(h
        .iter()
        .all(|v| v.abs() <= 2.0 * (2.0f64 / 400.0).sqrt() / 0.8796 + 1e-12));
    let again = Initializer::HeNormal { seed: Some(2) }
        .sample(&shape, DType::F64)
        .unwrap()
        .to_f64_vec()
        .unwrap();
    assert_eq!(h, again);
    let fresh1 = Initializer::HeNormal { seed: None }
        .sample(&[10], DType::F64)
        .unwrap()
        .to_f64_vec()
        .unwrap();
    let fresh2 = Initializer::HeNormal { seed: None }
        .sample(&[10], DType::F64)
        .unwrap()
        .to_f64_vec()
        .unwrap();
    assert_ne!(fresh1, fresh2);
    for (r, c) in [(6, 4), (4, 6)] {
        let q = Initializer::Orthogonal {
            gain: 1.0,
            seed: Some(3),
        }
        .sample(&[r, c], DType::F64)
        .unwrap();
        let qq = if r >= c {
            q.t().unwrap().matmul(&q).unwrap()
        } else {
            q.matmul(&q.t().unwrap()).unwrap()
        };
        let n = r.min(c);
        let eye = Tensor::eye(n, n, DType::F64).unwrap().to_f64_vec().unwrap();
        close(&qq.to_f64_vec().unwrap(), &eye, 1e-10);
    }
    // Config round trip.
    for i in [
        Initializer::GlorotNormal { seed: Some(4) },
        Initializer::Constant(0.5),
        Initializer::Orthogonal {
            gain: 2.0,
            seed: None,
        },
    ] {
        assert_eq!(Initializer::from_config(&i.to_config()).unwrap(), i);
    }
}

#[test]
fn regularizers_penalise_weights() {
    init();
    let mut d = f64_layer(Dense::new(2).kernel_regularizer(Regularizer::l1_l2(0.1, 0.01)));
    d.forward(&Tensor::ones(&[1, 3], DType::F64).unwrap(), false)
        .unwrap();
    let w = d.weights()[0].peek().to_f64_vec().unwrap();
    let want =
        0.1 * w.iter().map(|v| v.abs()).sum::<f64>() + 0.01 * w.iter().map(|v| v * v).sum::<f64>();
    let got = d.regularization_losses().unwrap();
    assert_eq!(got.len(), 1);
    assert!((got[0].item::<f64>().unwrap() - want).abs() < 1e-12);
}

#[test]
fn layers_rebuild_from_their_configs() {
    init();
    let layers: Vec<Box<dyn Layer>> = vec![
        Box::new(Dense::new(3).activation(Activation::Gelu).use_bias(false)),
        Box::new(
            Conv2D::new(2, [3, 1])
                .strides([2, 1])
                .padding(Padding::Same),
        ),
        Box::new(MaxPooling2D::new([2, 2])),
        Box::new(Dropout::new(0.25)),
        Box::new(BatchNormalization::new()),
        Box::new(Concatenate::new(1)),
        Box::new(Reshape::new(&[2, -1])),
        Box::new(Embedding::new(10, 4)),
        Box::new(Conv1D::new(3, 2)),
        Box::new(Conv2DTranspose::new(3, [2, 2]).strides([2, 2])),
        Box::new(Lstm::new(4).return_sequences(true)),
        Box::new(Gru::new(2)),
        Box::new(SimpleRNN::new(3).activation(Activation::Relu)),
        Box::new(MultiHeadAttention::new(2, 8)),
        Box::new(LayerNormalization::new()),
        Box::new(GlobalMaxPooling2D::new()),
    ];
    for l in layers {
        let c = l.config();
        let back = deserialize(&c).unwrap();
        assert_eq!(back.config(), c);
    }
    assert!(deserialize(&serde_json::json!({"class_name": "Nope", "config": {}})).is_err());
}
