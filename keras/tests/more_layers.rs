//! Embedding, Conv1D, Conv2DTranspose, DepthwiseConv2D, SimpleRNN, LSTM, GRU and
//! MultiHeadAttention against f64 loops written from their definitions.

use ferroflow_autodiff::{GradientTape, Source};
use ferroflow_keras::layers::*;
use ferroflow_keras::{sequential, Layer, Model};
use ferroflow_tensor::{random, Axes, DType, Padding, Tensor};

fn randn(shape: &[usize], seed: u64) -> Tensor {
    ferroflow::init();
    random::stateless_normal(shape, [seed, 3], 0.0, 1.0, DType::F64).unwrap()
}

fn f64_layer<L: Layer>(mut l: L) -> L {
    l.base_mut().dtype_policy = ferroflow_keras::mixed_precision::Policy::new("float64").unwrap();
    l
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

fn w(l: &dyn Layer, i: usize) -> Vec<f64> {
    l.weights()[i].peek().to_f64_vec().unwrap()
}

#[test]
fn embedding_looks_up_rows_and_rejects_bad_ids() {
    let mut e = f64_layer(Embedding::new(5, 3));
    let ids = Tensor::from_vec(vec![4i64, 0, 4, 2], &[2, 2]).unwrap();
    let y = e.forward(&ids, false).unwrap();
    assert_eq!(y.shape(), &[2, 2, 3]);
    let table = w(&e, 0);
    let want: Vec<f64> = [4usize, 0, 4, 2]
        .iter()
        .flat_map(|&i| table[i * 3..i * 3 + 3].to_vec())
        .collect();
    assert_eq!(y.to_f64_vec().unwrap(), want);
    assert!(e
        .forward(&Tensor::from_vec(vec![5i64], &[1]).unwrap(), false)
        .is_err());
}

#[test]
fn conv1d_matches_the_sliding_dot_product() {
    let mut c = f64_layer(Conv1D::new(2, 3));
    let x = randn(&[2, 7, 4], 1);
    let y = c.forward(&x, false).unwrap();
    assert_eq!(y.shape(), &[2, 5, 2]);
    let (k, xv) = (w(&c, 0), x.to_f64_vec().unwrap());
    let mut want = vec![];
    for b in 0..2 {
        for t in 0..5 {
            for o in 0..2 {
                let mut s = 0.0;
                for j in 0..3 {
                    for ch in 0..4 {
                        s += xv[(b * 7 + t + j) * 4 + ch] * k[(j * 4 + ch) * 2 + o];
                    }
                }
                want.push(s);
            }
        }
    }
    close(&y.to_f64_vec().unwrap(), &want, 1e-12);
}

#[test]
fn conv2d_transpose_scatters_each_input_through_the_kernel() {
    let mut c = f64_layer(Conv2DTranspose::new(2, [3, 2]).strides([2, 1]));
    let x = randn(&[1, 3, 4, 3], 2);
    let y = c.forward(&x, false).unwrap();
    let (oh, ow) = ((3 - 1) * 2 + 3, 4 + 1);
    assert_eq!(y.shape(), &[1, oh, ow, 2]);
    let (k, xv) = (w(&c, 0), x.to_f64_vec().unwrap());
    let mut want = vec![0.0; oh * ow * 2];
    for i in 0..3 {
        for j in 0..4 {
            for ch in 0..3 {
                for ky in 0..3 {
                    for kx in 0..2 {
                        for o in 0..2 {
                            want[((i * 2 + ky) * ow + j + kx) * 2 + o] +=
                                xv[(i * 4 + j) * 3 + ch] * k[((ky * 2 + kx) * 2 + o) * 3 + ch];
                        }
                    }
                }
            }
        }
    }
    close(&y.to_f64_vec().unwrap(), &want, 1e-12);
    let mut same = Conv2DTranspose::new(4, [3, 3])
        .strides([2, 2])
        .padding(Padding::Same);
    assert_eq!(
        same.forward(&Tensor::ones(&[2, 5, 6, 1], DType::F32).unwrap(), false)
            .unwrap()
            .shape(),
        &[2, 10, 12, 4]
    );
}

#[test]
fn depthwise_conv_convolves_each_channel_alone() {
    let mut c = f64_layer(
        DepthwiseConv2D::from_config(&serde_json::json!({
        "kernel_size": [3, 3], "strides": [2, 2], "padding": "same", "depth_multiplier": 2,
        "activation": "linear", "depthwise_initializer": "glorot_uniform"}))
        .unwrap(),
    );
    let x = randn(&[1, 5, 6, 3], 3);
    let y = c.forward(&x, false).unwrap();
    assert_eq!(y.shape(), &[1, 3, 3, 6]);
    let (k, xv) = (w(&c, 0), x.to_f64_vec().unwrap());
    // TF "same": 5 rows, stride 2, kernel 3 → total padding 2 (1 top, 1 bottom); 6 cols → 1 (0 left, 1 right).
    let (pt, pl) = (1isize, 0isize);
    let mut want = vec![];
    for oy in 0..3 {
        for ox in 0..3 {
            for ch in 0..3 {
                for m in 0..2 {
                    let mut s = 0.0;
                    for ky in 0..3 {
                        for kx in 0..3 {
                            let (iy, ix) = (
                                oy as isize * 2 + ky as isize - pt,
                                ox as isize * 2 + kx as isize - pl,
                            );
                            if (0..5).contains(&iy) && (0..6).contains(&ix) {
                                s += xv[((iy * 6 + ix) * 3) as usize + ch]
                                    * k[((ky * 3 + kx) * 3 + ch) * 2 + m];
                            }
                        }
                    }
                    want.push(s);
                }
            }
        }
    }
    close(&y.to_f64_vec().unwrap(), &want, 1e-12);
    let empty = Tensor::zeros(&[1, 0, 4, 3], DType::F64).unwrap();
    assert!(c.forward(&empty, false).is_err());
    assert!(Conv2DTranspose::new(2, [2, 2])
        .forward(&Tensor::zeros(&[1, 0, 2, 1], DType::F32).unwrap(), false)
        .is_err());
}

fn sigmoid(v: f64) -> f64 {
    1.0 / (1.0 + (-v).exp())
}

/// `x·W` for row vector x (len f) and W [f, g].
fn vecmat(x: &[f64], wm: &[f64], g: usize) -> Vec<f64> {
    (0..g)
        .map(|j| x.iter().enumerate().map(|(i, xi)| xi * wm[i * g + j]).sum())
        .collect()
}

#[test]
fn recurrent_layers_match_their_cell_equations() {
    let (n, t, f, u) = (2usize, 4usize, 3usize, 5usize);
    let x = randn(&[n, t, f], 4);
    let xv = x.to_f64_vec().unwrap();
    for kind in ["simple", "lstm", "gru"] {
        let mut layer: Box<dyn Layer> = match kind {
            "simple" => Box::new(f64_layer(SimpleRNN::new(u).return_sequences(true))),
            "lstm" => Box::new(f64_layer(Lstm::new(u).return_sequences(true))),
            _ => Box::new(f64_layer(Gru::new(u).return_sequences(true))),
        };
        let y = layer.forward(&x, false).unwrap();
        assert_eq!(y.shape(), &[n, t, u]);
        // Randomise the bias so it matters.
        let bias = &layer.weights()[2];
        bias.assign(&randn(&bias.shape(), 5)).unwrap();
        let y = layer.forward(&x, false).unwrap().to_f64_vec().unwrap();
        let (k, r, b) = (
            w(layer.as_ref(), 0),
            w(layer.as_ref(), 1),
            w(layer.as_ref(), 2),
        );
        let g = k.len() / f;
        let mut want = vec![];
        for s in 0..n {
            let (mut h, mut c) = (vec![0.0; u], vec![0.0; u]);
            for step in 0..t {
                let xt = &xv[(s * t + step) * f..][..f];
                let xw: Vec<f64> = vecmat(xt, &k, g)
                    .iter()
                    .zip(&b[..g])
                    .map(|(a, b)| a + b)
                    .collect();
                let hr = vecmat(&h, &r, g);
                h = match kind {
                    "simple" => (0..u).map(|j| (xw[j] + hr[j]).tanh()).collect(),
                    "lstm" => {
                        let z: Vec<f64> = xw.iter().zip(&hr).map(|(a, b)| a + b).collect();
                        (0..u)
                            .map(|j| {
                                let (i, fg, cc, o) = (
                                    sigmoid(z[j]),
                                    sigmoid(z[u + j]),
                                    z[2 * u + j].tanh(),
                                    sigmoid(z[3 * u + j]),
                                );
                                c[j] = fg * c[j] + i * cc;
                                o * c[j].tanh()
                            })
                            .collect()
                    }
                    _ => {
                        let hr: Vec<f64> = hr.iter().zip(&b[g..]).map(|(a, b)| a + b).collect();
                        (0..u)
                            .map(|j| {
                                let z = sigmoid(xw[j] + hr[j]);
                                let rr = sigmoid(xw[u + j] + hr[u + j]);
                                let hh = (xw[2 * u + j] + rr * hr[2 * u + j]).tanh();
                                z * h[j] + (1.0 - z) * hh
                            })
                            .collect()
                    }
                };
                want.extend_from_slice(&h);
            }
        }
        close(&y, &want, 1e-10);
    }
    // LSTM's forget-gate bias starts at one.
    let mut l = Lstm::new(2);
    l.forward(&Tensor::ones(&[1, 1, 1], DType::F32).unwrap(), false)
        .unwrap();
    assert_eq!(
        l.weights()[2].peek().to_vec::<f32>().unwrap(),
        vec![0.0, 0.0, 1.0, 1.0, 0.0, 0.0, 0.0, 0.0]
    );
}

#[test]
fn lstm_gradients_match_finite_differences() {
    let mut l = f64_layer(Lstm::new(3));
    let x = randn(&[2, 3, 2], 6);
    l.forward(&x, false).unwrap();
    let kernel = l.weights()[0].clone();
    let loss = |l: &mut Lstm| {
        l.forward(&x, true)
            .unwrap()
            .square()
            .unwrap()
            .reduce_sum(Axes::All, false)
            .unwrap()
    };
    let tape = GradientTape::new();
    let value = loss(&mut l);
    let g = tape.gradient(&value, &[Source::from(&kernel)]).unwrap()[0]
        .clone()
        .unwrap()
        .to_f64_vec()
        .unwrap();
    let base = kernel.peek().to_f64_vec().unwrap();
    for idx in [0, 5, 13, 23] {
        let eps = 1e-6;
        let mut plus = base.clone();
        plus[idx] += eps;
        kernel
            .assign(&Tensor::from_vec(plus, &kernel.shape()).unwrap())
            .unwrap();
        let lp = loss(&mut l).item::<f64>().unwrap();
        let mut minus = base.clone();
        minus[idx] -= eps;
        kernel
            .assign(&Tensor::from_vec(minus, &kernel.shape()).unwrap())
            .unwrap();
        let lm = loss(&mut l).item::<f64>().unwrap();
        let fd = (lp - lm) / (2.0 * eps);
        assert!(
            (fd - g[idx]).abs() < 1e-6 * (1.0 + fd.abs()),
            "{idx}: {fd} vs {}",
            g[idx]
        );
    }
}

#[test]
fn multi_head_attention_matches_scaled_dot_product_attention() {
    let (n, tq, tv, dq, dv, h, k) = (2usize, 3usize, 4usize, 5usize, 6usize, 2usize, 3usize);
    let mut mha = f64_layer(MultiHeadAttention::new(h, k));
    let q = randn(&[n, tq, dq], 7);
    let v = randn(&[n, tv, dv], 8);
    let y = mha.apply(&[q.clone(), v.clone()], false).unwrap().remove(0);
    assert_eq!(y.shape(), &[n, tq, dq]);
    for wt in mha.weights() {
        if wt.name().ends_with("bias") {
            wt.assign(&randn(&wt.shape(), 9)).unwrap();
        }
    }
    let y = mha
        .apply(&[q.clone(), v.clone()], false)
        .unwrap()
        .remove(0)
        .to_f64_vec()
        .unwrap();
    let ws: Vec<Vec<f64>> = (0..8).map(|i| w(&mha, i)).collect();
    let (qv, vv) = (q.to_f64_vec().unwrap(), v.to_f64_vec().unwrap());
    // proj[b][t][head][j] = Σ_d x[b,t,d] W[d,head,j] + bias[head,j]
    let proj = |x: &[f64], t: usize, d: usize, wk: &[f64], bk: &[f64], kk: usize| -> Vec<f64> {
        let mut out = vec![0.0; n * t * h * kk];
        for b in 0..n {
            for s in 0..t {
                for hd in 0..h {
                    for j in 0..kk {
                        let mut acc = bk[hd * kk + j];
                        for dd in 0..d {
                            acc += x[(b * t + s) * d + dd] * wk[(dd * h + hd) * kk + j];
                        }
                        out[((b * t + s) * h + hd) * kk + j] = acc;
                    }
                }
            }
        }
        out
    };
    let (qp, kp, vp) = (
        proj(&qv, tq, dq, &ws[0], &ws[1], k),
        proj(&vv, tv, dv, &ws[2], &ws[3], k),
        proj(&vv, tv, dv, &ws[4], &ws[5], k),
    );
    let mut want = vec![0.0; n * tq * dq];
    for b in 0..n {
        for hd in 0..h {
            for i in 0..tq {
                let scores: Vec<f64> = (0..tv)
                    .map(|j| {
                        (0..k)
                            .map(|e| {
                                qp[((b * tq + i) * h + hd) * k + e]
                                    * kp[((b * tv + j) * h + hd) * k + e]
                            })
                            .sum::<f64>()
                            / (k as f64).sqrt()
                    })
                    .collect();
                let m = scores.iter().cloned().fold(f64::MIN, f64::max);
                let z: f64 = scores.iter().map(|s| (s - m).exp()).sum();
                for e in 0..k {
                    let ctx: f64 = (0..tv)
                        .map(|j| (scores[j] - m).exp() / z * vp[((b * tv + j) * h + hd) * k + e])
                        .sum();
                    for o in 0..dq {
                        want[(b * tq + i) * dq + o] += ctx * ws[6][(hd * k + e) * dq + o];
                    }
                }
            }
        }
        for i in 0..tq {
            for o in 0..dq {
                want[(b * tq + i) * dq + o] += ws[7][o];
            }
        }
    }
    close(&y, &want, 1e-10);
    assert!(mha.apply(&[q], false).is_err());
}

#[test]
fn attention_masks_hide_positions_and_dropout_only_acts_in_training() {
    let (n, t, d) = (2usize, 4usize, 6usize);
    let mut mha = f64_layer(MultiHeadAttention::new(3, 2));
    let x = randn(&[n, t, d], 21);
    // A causal mask: step i attends to steps 0..=i.
    let causal: Vec<f64> = (0..n * t * t)
        .map(|p| if (p % t) <= (p / t) % t { 1.0 } else { 0.0 })
        .collect();
    let mask = Tensor::from_vec(causal, &[n, t, t]).unwrap();
    let (out, scores) = mha.attend(&x, &x, None, Some(&mask), false).unwrap();
    assert_eq!(scores.shape(), &[n, 3, t, t]);
    let s = scores.to_f64_vec().unwrap();
    for (p, &v) in s.iter().enumerate() {
        let (i, j) = ((p / t) % t, p % t);
        if j > i {
            assert_eq!(v, 0.0, "step {i} sees step {j}");
        }
    }
    for row in s.chunks(t) {
        assert!((row.iter().sum::<f64>() - 1.0).abs() < 1e-12);
    }
    // With a causal mask, step 0's output is attention over step 0 alone.
    let first = x.slice(&[0, 0, 0], &[n as isize, 1, d as isize]).unwrap();
    let alone = mha.apply(&[first.clone(), first], false).unwrap().remove(0);
    let o = out.to_f64_vec().unwrap();
    let a = alone.to_f64_vec().unwrap();
    for b in 0..n {
        for f in 0..d {
            assert!((o[(b * t) * d + f] - a[b * d + f]).abs() < 1e-12);
        }
    }
    // A mask of the wrong shape is an error naming both shapes.
    let bad = Tensor::ones(&[n, t, t + 1], DType::F64).unwrap();
    let err = mha
        .attend(&x, &x, None, Some(&bad), false)
        .unwrap_err()
        .to_string();
    assert!(
        err.contains("attention_mask") && err.contains("[2, 4, 5]"),
        "{err}"
    );
    // Dropout on the attention probabilities: training changes the output, inference not.
    let mut dropped = f64_layer(MultiHeadAttention::new(3, 2).with_dropout(0.5));
    let plain = dropped
        .apply(&[x.clone(), x.clone()], false)
        .unwrap()
        .remove(0);
    for (w, v) in dropped.weights().iter().zip(mha.weights()) {
        w.assign(&v.value()).unwrap();
    }
    let inference = dropped
        .apply(&[x.clone(), x.clone()], false)
        .unwrap()
        .remove(0);
    let unmasked = mha.apply(&[x.clone(), x.clone()], false).unwrap().remove(0);
    assert_eq!(
        inference.to_f64_vec().unwrap(),
        unmasked.to_f64_vec().unwrap()
    );
    let training = dropped
        .apply(&[x.clone(), x.clone()], true)
        .unwrap()
        .remove(0);
    assert_ne!(
        training.to_f64_vec().unwrap(),
        inference.to_f64_vec().unwrap()
    );
    assert_eq!(plain.shape(), training.shape());
    let back = ferroflow_keras::layers::deserialize(&dropped.config()).unwrap();
    assert_eq!(back.config()["config"]["dropout"], 0.5);
}

/// Layer sizes are claims too (they come from `config.json` on load): impossible weights,
/// windows and strides are errors, never a panic, an abort or a hang; a SAME pooling window
/// far larger than its input works and costs what the input costs.
#[test]
fn hostile_layer_sizes_are_errors_not_aborts() {
    ferroflow::init();
    let x = Tensor::zeros(&[2, 8, 8, 1], DType::F32).unwrap();
    let huge = 1usize << 40;
    let cases: Vec<(&str, Model)> = vec![
        ("dense units", Model::from(sequential![Dense::new(huge)])),
        (
            "conv kernel",
            Model::from(sequential![Conv2D::new(4, [huge, huge])]),
        ),
        (
            "conv filters",
            Model::from(sequential![Conv2D::new(huge, [3, 3])]),
        ),
        (
            "conv strides",
            Model::from(sequential![Conv2D::new(4, [3, 3]).strides([0, usize::MAX])]),
        ),
        (
            "valid pool",
            Model::from(sequential![MaxPooling2D::new([huge, 2])]),
        ),
    ];
    for (what, mut m) in cases {
        let r = m.call(&x, false);
        assert!(r.is_err(), "{what}: {r:?}");
    }
    let mut same = Model::from(sequential![MaxPooling2D::new([huge, huge])
        .strides([1, 1])
        .padding(Padding::Same)]);
    let start = std::time::Instant::now();
    let y = same.call(&x, false).unwrap();
    assert_eq!(y.shape(), &[2, 8, 8, 1]);
    assert!(
        start.elapsed() < std::time::Duration::from_secs(5),
        "{:?}",
        start.elapsed()
    );
}
