//! Losses and metrics against f64 references written out from their definitions.

use ferroflow_keras::losses::*;
use ferroflow_keras::metrics::{self, Auc, Metric, TopKCategoricalAccuracy};
use ferroflow_tensor::{random, DType, Error, Tensor};
use proptest::prelude::*;

fn t(v: Vec<f64>, shape: &[usize]) -> Tensor {
    Tensor::from_vec(v, shape).unwrap()
}

fn softmax_row(r: &[f64]) -> Vec<f64> {
    let m = r.iter().cloned().fold(f64::MIN, f64::max);
    let z: f64 = r.iter().map(|v| (v - m).exp()).sum();
    r.iter().map(|v| (v - m).exp() / z).collect()
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(32))]
    #[test]
    fn losses_match_their_definitions(b in 1usize..6, k in 2usize..6, seed in 0u64..10_000, smooth in 0usize..2) {
        ferroflow::init();
        let logits = random::stateless_normal(&[b, k], [seed, 1], 0.0, 2.0, DType::F64).unwrap();
        let target = random::stateless_uniform(&[b, k], [seed, 2], 0.0, 1.0, DType::F64).unwrap();
        let ids = random::stateless_uniform(&[b], [seed, 3], 0.0, k as f64, DType::I64).unwrap();
        let (lv, tv, iv) = (logits.to_f64_vec().unwrap(), target.to_f64_vec().unwrap(), ids.to_vec::<i64>().unwrap());
        let ls = smooth as f64 * 0.1;
        let rows = |v: &[f64]| v.chunks(k).map(|c| c.to_vec()).collect::<Vec<_>>();
        let mean = |v: Vec<f64>| v.iter().sum::<f64>() / v.len() as f64;
        let probs: Vec<f64> = rows(&lv).iter().flat_map(|r| softmax_row(r)).collect();
        let p = t(probs.clone(), &[b, k]);
        let onehot: Vec<f64> = iv.iter().flat_map(|&i| (0..k).map(move |j| if j as i64 == i { 1.0 } else { 0.0 })).collect();
        let oh = t(onehot.clone(), &[b, k]);
        let eps = 1e-7;

        let mse = MeanSquaredError::new().call(&target, &logits, None).unwrap().item::<f64>().unwrap();
        prop_assert!((mse - mean(lv.iter().zip(&tv).map(|(a, b)| (a - b).powi(2)).collect())).abs() < 1e-12);
        let mae = MeanAbsoluteError::new().call(&target, &logits, None).unwrap().item::<f64>().unwrap();
        prop_assert!((mae - mean(lv.iter().zip(&tv).map(|(a, b)| (a - b).abs()).collect())).abs() < 1e-12);
        let hub = Huber::new(1.0).call(&target, &logits, None).unwrap().item::<f64>().unwrap();
        let want = mean(lv.iter().zip(&tv).map(|(a, b)| { let e = (a - b).abs(); if e <= 1.0 { 0.5 * e * e } else { e - 0.5 } }).collect());
        prop_assert!((hub - want).abs() < 1e-12);

        // Categorical: from logits equals from probabilities, and the definition.
        let mut cce = CategoricalCrossentropy::new(true);
        cce.label_smoothing = ls;
        let l1 = cce.call(&oh, &logits, None).unwrap().item::<f64>().unwrap();
        cce.from_logits = false;
        let l2 = cce.call(&oh, &p, None).unwrap().item::<f64>().unwrap();
        let smoothed: Vec<f64> = onehot.iter().map(|y| y * (1.0 - ls) + ls / k as f64).collect();
        let want = mean((0..b).map(|r| -(0..k).map(|j| smoothed[r * k + j] * probs[r * k + j].ln()).sum::<f64>()).collect());
        prop_assert!((l1 - want).abs() < 1e-9, "{} {}", l1, want);
        prop_assert!((l2 - want).abs() < 1e-6);
        if ls == 0.0 {
            let s = SparseCategoricalCrossentropy::new(true).call(&ids, &logits, None).unwrap().item::<f64>().unwrap();
            prop_assert!((s - want).abs() < 1e-9);
            let s2 = SparseCategoricalCrossentropy::new(false).call(&ids.expand_dims(-1).unwrap(), &p, None).unwrap().item::<f64>().unwrap();
            prop_assert!((s2 - want).abs() < 1e-6);
        }

        // Binary on logits and probabilities.
        let mut bce = BinaryCrossentropy::new(true);
        bce.label_smoothing = ls;
        let z: Vec<f64> = tv.iter().map(|y| y * (1.0 - ls) + 0.5 * ls).collect();
        let want = mean(lv.iter().zip(&z).map(|(x, z)| { let s = 1.0 / (1.0 + (-x).exp()); -(z * s.ln() + (1.0 - z) * (1.0 - s).ln()) }).collect());
        let got = bce.call(&target, &logits, None).unwrap().item::<f64>().unwrap();
        prop_assert!((got - want).abs() < 1e-9);
        bce.from_logits = false;
        let sig = logits.sigmoid().unwrap();
        let got = bce.call(&target, &sig, None).unwrap().item::<f64>().unwrap();
        // On probabilities Keras clips to [ε, 1 - ε] and adds ε inside the logs.
        let want_p = mean(lv.iter().zip(&z).map(|(x, z)| {
            let s = (1.0 / (1.0 + (-x).exp())).clamp(eps, 1.0 - eps);
            -(z * (s + eps).ln() + (1.0 - z) * (1.0 - s + eps).ln())
        }).collect());
        prop_assert!((got - want_p).abs() < 1e-9 * (1.0 + want_p.abs()), "{} vs {}", got, want_p);

        let kld = KLDivergence::new().call(&target, &p, None).unwrap().item::<f64>().unwrap();
        let want = mean((0..b).map(|r| (0..k).map(|j| { let y = tv[r * k + j].max(eps); y * (y / probs[r * k + j].max(eps)).ln() }).sum::<f64>()).collect());
        prop_assert!((kld - want).abs() < 1e-9);
    }
}

#[test]
fn reductions_and_sample_weights() {
    ferroflow::init();
    let y = t(vec![0.0, 0.0, 0.0, 0.0], &[2, 2]);
    let p = t(vec![1.0, 1.0, 2.0, 2.0], &[2, 2]);
    let per = MeanSquaredError {
        reduction: Reduction::None,
    }
    .call(&y, &p, None)
    .unwrap();
    assert_eq!(per.to_f64_vec().unwrap(), vec![1.0, 4.0]);
    let sum = MeanSquaredError {
        reduction: Reduction::Sum,
    }
    .call(&y, &p, None)
    .unwrap();
    assert_eq!(sum.item::<f64>().unwrap(), 5.0);
    let w = t(vec![2.0, 0.0], &[2]);
    let weighted = MeanSquaredError::new().call(&y, &p, Some(&w)).unwrap();
    assert_eq!(weighted.item::<f64>().unwrap(), 1.0);
}

#[test]
fn bad_targets_are_errors() {
    ferroflow::init();
    let logits = t(vec![0.0; 6], &[2, 3]);
    let e = SparseCategoricalCrossentropy::new(true)
        .call(
            &Tensor::from_vec(vec![1i64, 3], &[2]).unwrap(),
            &logits,
            None,
        )
        .unwrap_err();
    assert!(
        matches!(
            e,
            Error::IndexOutOfRange {
                index: 3,
                bound: 3,
                ..
            }
        ),
        "{e}"
    );
    assert!(CategoricalCrossentropy::new(true)
        .call(&t(vec![0.0; 4], &[2, 2]), &logits, None)
        .is_err());
    assert!(get("nope").is_err());
    assert_eq!(get("mse").unwrap().name(), "mean_squared_error");
}

#[test]
fn accuracy_metrics_count_hits_and_reset() {
    ferroflow::init();
    let pred = t(vec![0.1, 0.7, 0.2, 0.5, 0.3, 0.2, 0.3, 0.3, 0.4], &[3, 3]);
    let sparse = Tensor::from_vec(vec![1i64, 1, 2], &[3]).unwrap();
    let mut auto = metrics::get("accuracy").unwrap();
    auto.update_state(&sparse, &pred, None).unwrap();
    assert!((auto.result() - 2.0 / 3.0).abs() < 1e-12);
    auto.reset_state();
    assert_eq!(auto.result(), 0.0);
    let onehot = t(vec![0.0, 1.0, 0.0, 1.0, 0.0, 0.0, 0.0, 0.0, 1.0], &[3, 3]);
    let mut cat = metrics::get("accuracy").unwrap();
    cat.update_state(&onehot, &pred, None).unwrap();
    assert_eq!(cat.result(), 1.0);
    // Binary, weighted.
    let mut bin = metrics::get("binary_accuracy").unwrap();
    bin.update_state(
        &t(vec![1.0, 0.0, 1.0, 0.0], &[4, 1]),
        &t(vec![0.9, 0.6, 0.4, 0.1], &[4, 1]),
        Some(&t(vec![1.0, 1.0, 3.0, 1.0], &[4])),
    )
    .unwrap();
    assert!((bin.result() - 2.0 / 6.0).abs() < 1e-12);
    // Top-2 with a tie at the boundary counts as a hit (TF's in_top_k).
    let mut top = TopKCategoricalAccuracy::new(2, true);
    let p = t(vec![0.5, 0.2, 0.2, 0.1, 0.1, 0.8], &[2, 3]);
    top.update_state(&Tensor::from_vec(vec![2i64, 0], &[2]).unwrap(), &p, None)
        .unwrap();
    assert_eq!(top.result(), 1.0);
}

#[test]
fn precision_recall_and_auc() {
    ferroflow::init();
    let y = t(vec![1.0, 1.0, 0.0, 0.0, 1.0, 0.0], &[6]);
    let p = t(vec![0.9, 0.4, 0.6, 0.2, 0.7, 0.1], &[6]);
    let mut pr = metrics::get("precision").unwrap();
    let mut rc = metrics::get("recall").unwrap();
    pr.update_state(&y, &p, None).unwrap();
    rc.update_state(&y, &p, None).unwrap();
    assert!((pr.result() - 2.0 / 3.0).abs() < 1e-12);
    assert!((rc.result() - 2.0 / 3.0).abs() < 1e-12);
    // AUC against the exact rank statistic on many random points.
    let n = 2000;
    let yv = random::stateless_uniform(&[n], [5, 5], 0.0, 2.0, DType::I64)
        .unwrap()
        .cast(DType::F64)
        .unwrap();
    let noise = random::stateless_uniform(&[n], [6, 6], 0.0, 1.0, DType::F64).unwrap();
    let score = yv
        .mul(&t(vec![0.3], &[]))
        .unwrap()
        .add(&noise.mul(&t(vec![0.7], &[])).unwrap())
        .unwrap();
    let mut auc = Auc::new(200).unwrap();
    auc.update_state(&yv, &score, None).unwrap();
    let (ys, ss) = (yv.to_f64_vec().unwrap(), score.to_f64_vec().unwrap());
    let (mut wins, mut pairs) = (0.0, 0.0);
    for i in 0..n {
        for j in 0..n {
            if ys[i] == 1.0 && ys[j] == 0.0 {
                pairs += 1.0;
                wins += if ss[i] > ss[j] {
                    1.0
                } else if ss[i] == ss[j] {
                    0.5
                } else {
                    0.0
                };
            }
        }
    }
    let exact = wins / pairs;
    assert!(
        (auc.result() - exact).abs() < 5e-3,
        "{} vs {exact}",
        auc.result()
    );
    assert!(Auc::new(1).is_err());
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(24))]
    /// The softmax cross-entropies on logits have TF's fused gradient, for the logits and
    /// (categorical) the targets, and it is differentiable again: first and second order
    /// against the formulas in f64 (targets not summing to one included).
    #[test]
    fn softmax_crossentropy_gradients_to_second_order(b in 1usize..5, k in 2usize..6, seed in 0u64..10_000) {
        use ferroflow_autodiff::GradientTape;
        ferroflow::init();
        let x = random::stateless_normal(&[b, k], [seed, 1], 0.0, 2.0, DType::F64).unwrap();
        let y = random::stateless_uniform(&[b, k], [seed, 2], 0.0, 1.0, DType::F64).unwrap();
        let v = random::stateless_normal(&[b, k], [seed, 4], 0.0, 1.0, DType::F64).unwrap();
        let ids = random::stateless_uniform(&[b], [seed, 3], 0.0, k as f64, DType::I64).unwrap();
        let (xv, yv, vv, iv) = (x.to_f64_vec().unwrap(), y.to_f64_vec().unwrap(), v.to_f64_vec().unwrap(), ids.to_vec::<i64>().unwrap());
        let onehot: Vec<f64> = iv.iter().flat_map(|&i| (0..k).map(move |j| if j as i64 == i { 1.0 } else { 0.0 })).collect();
        for sparse in [false, true] {
            let targets = if sparse { onehot.clone() } else { yv.clone() };
            let outer = GradientTape::new();
            outer.watch(&x);
            let inner = GradientTape::new();
            inner.watch(&x);
            inner.watch(&y);
            let loss = if sparse {
                SparseCategoricalCrossentropy::new(true).call(&ids, &x, None).unwrap()
            } else {
                CategoricalCrossentropy::new(true).call(&y, &x, None).unwrap()
            };
            let g = inner.gradient(&loss, &[(&x).into(), (&y).into()]).unwrap();
            let gx = g[0].clone().unwrap();
            let hv = outer.gradient(&gx.mul(&v).unwrap().reduce_sum(ferroflow_tensor::Axes::All, false).unwrap(), &[(&x).into()]).unwrap()[0].clone().unwrap();
            let (gx, hv) = (gx.to_f64_vec().unwrap(), hv.to_f64_vec().unwrap());
            for r in 0..b {
                let row = |a: &[f64]| a[r * k..(r + 1) * k].to_vec();
                let p = softmax_row(&row(&xv));
                let (t, vr) = (row(&targets), row(&vv));
                let st: f64 = t.iter().sum();
                let pv: f64 = p.iter().zip(&vr).map(|(p, v)| p * v).sum();
                for j in 0..k {
                    let want_g = (p[j] * st - t[j]) / b as f64;
                    let want_hv = st * (p[j] * vr[j] - p[j] * pv) / b as f64;
                    prop_assert!((gx[r * k + j] - want_g).abs() < 1e-12, "sparse {}: d/dlogits {} vs {}", sparse, gx[r * k + j], want_g);
                    prop_assert!((hv[r * k + j] - want_hv).abs() < 1e-12, "sparse {}: Hv {} vs {}", sparse, hv[r * k + j], want_hv);
                }
                if !sparse {
                    let gy = g[1].clone().unwrap().to_f64_vec().unwrap();
                    for j in 0..k {
                        let want = -p[j].ln() / b as f64;
                        prop_assert!((gy[r * k + j] - want).abs() < 1e-12, "d/dtargets {} vs {}", gy[r * k + j], want);
                    }
                } else {
                    prop_assert!(g[1].is_none(), "sparse targets get no gradient");
                }
            }
        }
    }
}
