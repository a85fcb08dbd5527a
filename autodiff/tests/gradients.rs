//! Every differentiable op's gradient against central finite differences in f64.
//!
//! For an op `f`, the checked scalar is `L = Σ f(x) · w` with fixed random weights `w`, so
//! every output element's derivative is exercised; `dL/dx` from the tape must match
//! `(L(x + εeᵢ) - L(x - εeᵢ)) / 2ε` for every element i.

#![allow(clippy::cloned_ref_to_slice_refs)] // `&[x.clone()]` reads better in these tables

use ferroflow::autodiff::{GradientTape, Source};
use ferroflow::{Axes, DType, FusedActivation, HostData, Padding, SliceSpec, Tensor};
use proptest::prelude::*;
use proptest::test_runner::{Config, TestRunner};

fn t(shape: &[usize], v: &[f64]) -> Tensor {
    Tensor::from_host(HostData::F64(v.to_vec()), shape).unwrap()
}

fn weights(shape: &[usize]) -> Tensor {
    let n: usize = shape.iter().product();
    t(
        shape,
        &(0..n)
            .map(|i| ((i * 37 % 11) as f64 - 5.0) / 4.0 + 0.1)
            .collect::<Vec<_>>(),
    )
}

fn loss(y: &Tensor, w: &Tensor) -> Tensor {
    y.mul(w).unwrap().reduce_sum(Axes::All, false).unwrap()
}

/// Checks the tape's gradient of `f` at `inputs` against finite differences.
fn check(
    name: &str,
    f: &dyn Fn(&[Tensor]) -> ferroflow::Result<Tensor>,
    inputs: &[(Vec<usize>, Vec<f64>)],
) {
    ferroflow::init();
    let xs: Vec<Tensor> = inputs.iter().map(|(s, v)| t(s, v)).collect();
    let tape = GradientTape::new();
    for x in &xs {
        tape.watch(x);
    }
    let y = f(&xs).unwrap_or_else(|e| panic!("{name}: forward failed: {e}"));
    let w = weights(y.shape());
    let l = loss(&y, &w);
    let sources: Vec<Source> = xs.iter().map(Source::from).collect();
    let grads = tape
        .gradient(&l, &sources)
        .unwrap_or_else(|e| panic!("{name}: gradient failed: {e}"));
    let eps = 1e-6;
    for (k, (shape, v)) in inputs.iter().enumerate() {
        let analytic = grads[k].as_ref().map(|g| {
            assert_eq!(g.shape(), shape.as_slice(), "{name}: gradient {k} shape");
            g.to_vec::<f64>().unwrap()
        });
        for i in 0..v.len() {
            let eval = |d: f64| {
                let mut vs: Vec<Tensor> = xs.clone();
                let mut p = v.clone();
                p[i] += d;
                vs[k] = t(shape, &p);
                loss(&f(&vs).unwrap(), &w).item::<f64>().unwrap()
            };
            let numeric = (eval(eps) - eval(-eps)) / (2.0 * eps);
            let a = analytic.as_ref().map(|g| g[i]).unwrap_or(0.0);
            assert!(
                (a - numeric).abs() <= 1e-5 * (1.0 + numeric.abs()),
                "{name}: d/dx{k}[{i}] tape {a}, finite difference {numeric}"
            );
        }
    }
}

fn vals(n: usize, seed: u64, lo: f64, hi: f64) -> Vec<f64> {
    let mut g = ferroflow::random::Philox::new([seed, 3]);
    (0..n).map(|_| lo + (hi - lo) * g.next_f64()).collect()
}

fn input(shape: &[usize], seed: u64, lo: f64, hi: f64) -> (Vec<usize>, Vec<f64>) {
    (shape.to_vec(), vals(shape.iter().product(), seed, lo, hi))
}

/// Cases per gradient property: `FERROFLOW_GRADIENT_CASES`, 64 by default (CI's count).
fn cases() -> u32 {
    std::env::var("FERROFLOW_GRADIENT_CASES")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(64)
}

/// A proptest runner whose failing inputs are saved beside this file
/// (`tests/gradients.proptest-regressions`) and replayed first on the next run, so a
/// failure reproduces.
fn runner(cases: u32) -> TestRunner {
    TestRunner::new(Config {
        cases,
        source_file: Some(file!()),
        failure_persistence: Some(Box::new(
            proptest::test_runner::FileFailurePersistence::SourceParallel("proptest-regressions"),
        )),
        ..Config::default()
    })
}

/// Shapes of rank 0 to 4 with dimensions 1 to 3.
fn shapes() -> impl Strategy<Value = Vec<usize>> {
    prop::collection::vec(1..4usize, 0..5)
}

#[test]
fn unary_ops_match_finite_differences_on_random_shapes() {
    type F = fn(&Tensor) -> ferroflow::Result<Tensor>;
    let ops: Vec<(&str, F, f64, f64)> = vec![
        ("neg", Tensor::neg, -3.0, 3.0),
        ("abs", Tensor::abs, 0.2, 3.0),
        ("exp", Tensor::exp, -3.0, 3.0),
        ("expm1", Tensor::expm1, -3.0, 3.0),
        ("log", Tensor::log, 0.2, 5.0),
        ("log1p", Tensor::log1p, -0.5, 5.0),
        ("sqrt", Tensor::sqrt, 0.2, 5.0),
        ("rsqrt", Tensor::rsqrt, 0.2, 5.0),
        ("square", Tensor::square, -3.0, 3.0),
        ("reciprocal", Tensor::reciprocal, 0.3, 3.0),
        ("sin", Tensor::sin, -3.0, 3.0),
        ("cos", Tensor::cos, -3.0, 3.0),
        ("tan", Tensor::tan, -1.0, 1.0),
        ("asin", Tensor::asin, -0.8, 0.8),
        ("acos", Tensor::acos, -0.8, 0.8),
        ("atan", Tensor::atan, -3.0, 3.0),
        ("sinh", Tensor::sinh, -2.0, 2.0),
        ("cosh", Tensor::cosh, -2.0, 2.0),
        ("tanh", Tensor::tanh, -2.0, 2.0),
        ("sigmoid", Tensor::sigmoid, -4.0, 4.0),
        ("erf", Tensor::erf, -2.0, 2.0),
        ("relu", Tensor::relu, 0.1, 2.0),
        ("softplus", Tensor::softplus, -3.0, 3.0),
        ("gelu", Tensor::gelu, -3.0, 3.0),
        ("swish", Tensor::swish, -3.0, 3.0),
        ("selu", Tensor::selu, 0.1, 3.0),
    ];
    for (name, f, lo, hi) in ops {
        runner(cases())
            .run(&(shapes(), any::<u64>()), |(shape, seed)| {
                check(name, &|x| f(&x[0]), &[input(&shape, seed, lo, hi)]);
                Ok(())
            })
            .unwrap();
    }
    // Negative side of the piecewise activations.
    check("relu<0", &|x| x[0].relu(), &[input(&[4], 1, -2.0, -0.1)]);
    check("elu<0", &|x| x[0].elu(1.0), &[input(&[4], 2, -2.0, -0.1)]);
    check(
        "leaky_relu<0",
        &|x| x[0].leaky_relu(0.2),
        &[input(&[4], 3, -2.0, -0.1)],
    );
    // fused clip with constant bounds: values inside, below and above (away from the kinks)
    check(
        "clip_scalar",
        &|x| x[0].clip_scalar(-1.0, 1.0),
        &[(vec![6], vec![-2.5, -1.5, -0.5, 0.25, 0.75, 1.8])],
    );
}

#[test]
fn binary_ops_with_broadcasting_match_finite_differences() {
    type F = fn(&Tensor, &Tensor) -> ferroflow::Result<Tensor>;
    // (name, op, magnitude range, whether operands may be negative): values are drawn in
    // [lo, hi] and, where signs are allowed, negated at random.
    let ops: Vec<(&str, F, f64, f64, bool)> = vec![
        ("add", Tensor::add, 0.1, 2.0, true),
        ("sub", Tensor::sub, 0.1, 2.0, true),
        ("mul", Tensor::mul, 0.1, 2.0, true),
        ("div", Tensor::div, 0.5, 2.0, true),
        // a^b for non-integer b needs a > 0 (a <= 0 is checked against TF's rule below)
        ("pow", Tensor::pow, 0.5, 2.0, false),
        ("maximum", Tensor::maximum, 0.1, 2.0, true),
        ("minimum", Tensor::minimum, 0.1, 2.0, true),
        (
            "squared_difference",
            Tensor::squared_difference,
            0.1,
            2.0,
            true,
        ),
        ("atan2", Tensor::atan2, 0.5, 2.0, true),
        ("floormod", Tensor::floormod, 0.3, 6.0, true),
        // b on both sides of 0 (never at the kink: the draws are continuous)
        ("relu_grad", Tensor::relu_grad, 0.1, 2.0, true),
    ];
    let strategy = (
        shapes(),
        prop::collection::vec(any::<bool>(), 4),
        any::<u64>(),
    );
    for (name, f, lo, hi, signed) in ops {
        runner(cases())
            .run(&strategy, |(shape, ones, seed)| {
                let other: Vec<usize> = shape
                    .iter()
                    .enumerate()
                    .map(|(i, &d)| if ones[i] { 1 } else { d })
                    .collect();
                let sign = |(s, v): (Vec<usize>, Vec<f64>), salt: u64| {
                    let flips = vals(v.len(), seed ^ salt, 0.0, 1.0);
                    let v: Vec<f64> = v
                        .iter()
                        .zip(flips)
                        .map(|(&x, f)| if signed && f < 0.5 { -x } else { x })
                        .collect();
                    (s, v)
                };
                let a = sign(input(&shape, seed, lo, hi), 77);
                let b = sign(input(&other, seed ^ 9, lo, hi), 78);
                if name == "floormod" || name == "maximum" || name == "minimum" {
                    // Away from the kinks (a/b at an integer, a = b), where finite
                    // differences straddle a jump: those cases are checked by rule below.
                    let y = f(&t(&a.0, &a.1), &t(&b.0, &b.1)).unwrap();
                    let q = t(&a.0, &a.1)
                        .div(&t(&b.0, &b.1))
                        .unwrap()
                        .to_vec::<f64>()
                        .unwrap();
                    let d = t(&a.0, &a.1)
                        .sub(&t(&b.0, &b.1))
                        .unwrap()
                        .to_vec::<f64>()
                        .unwrap();
                    let near = if name == "floormod" {
                        q.iter().any(|q| (q - q.round()).abs() < 0.05)
                    } else {
                        d.iter().any(|d| d.abs() < 0.05)
                    };
                    prop_assume!(!near && y.num_elements() > 0);
                }
                check(name, &|x| f(&x[0], &x[1]), &[a, b]);
                Ok(())
            })
            .unwrap();
    }
}

/// Where an op is not differentiable, TF's rules: maximum's gradient goes to `a` on a tie
/// (`a >= b`), minimum's likewise (`a <= b`); a reduce max/min shares it equally among the
/// tied maxima; pow's `d/db` is 0 for `a <= 0` and its `d/da = b·a^(b-1)` there too.
#[test]
fn tie_and_kink_rules_follow_tensorflow() {
    ferroflow::init();
    let grads =
        |f: &dyn Fn(&Tensor, &Tensor) -> ferroflow::Result<Tensor>, a: &[f64], b: &[f64]| {
            let (x, y) = (t(&[a.len()], a), t(&[b.len()], b));
            let tape = GradientTape::new();
            tape.watch(&x);
            tape.watch(&y);
            let z = f(&x, &y).unwrap().reduce_sum(Axes::All, false).unwrap();
            let g = tape.gradient(&z, &[(&x).into(), (&y).into()]).unwrap();
            let v = |i: usize| g[i].as_ref().map(|t| t.to_vec::<f64>().unwrap());
            (v(0), v(1))
        };
    // maximum/minimum: ties (first element) go to a, the rest to the larger/smaller.
    let (da, db) = grads(&|a, b| a.maximum(b), &[1.0, 2.0, 0.0], &[1.0, 1.0, 3.0]);
    assert_eq!(
        (da.unwrap(), db.unwrap()),
        (vec![1.0, 1.0, 0.0], vec![0.0, 0.0, 1.0])
    );
    let (da, db) = grads(&|a, b| a.minimum(b), &[1.0, 2.0, 0.0], &[1.0, 1.0, 3.0]);
    assert_eq!(
        (da.unwrap(), db.unwrap()),
        (vec![1.0, 0.0, 1.0], vec![0.0, 1.0, 0.0])
    );
    // reduce_max/min: two tied extremes share the gradient, 1/2 each.
    let x = t(&[4], &[3.0, 1.0, 3.0, -2.0]);
    for (op, want) in [
        ("max", vec![0.5, 0.0, 0.5, 0.0]),
        ("min", vec![0.0, 0.0, 0.0, 1.0]),
    ] {
        let tape = GradientTape::new();
        tape.watch(&x);
        let y = if op == "max" {
            x.reduce_max(Axes::All, false)
        } else {
            x.reduce_min(Axes::All, false)
        }
        .unwrap();
        let g = tape.gradient(&y, &[(&x).into()]).unwrap()[0]
            .clone()
            .unwrap();
        assert_eq!(g.to_vec::<f64>().unwrap(), want, "reduce_{op}");
    }
    // pow at a <= 0 with integer exponents: d/da = b a^(b-1) (0^1 → 1·0^0 = 1), d/db = 0.
    let (da, db) = grads(&|a, b| a.pow(b), &[0.0, -2.0, 0.0], &[2.0, 3.0, 1.0]);
    assert_eq!(da.unwrap(), vec![0.0, 12.0, 1.0]);
    assert_eq!(db.unwrap(), vec![0.0, 0.0, 0.0]);
}

#[test]
fn reductions_match_finite_differences_over_random_axes() {
    runner(cases())
        .run(
            &(
                prop::collection::vec(1..4usize, 1..5),
                any::<u64>(),
                any::<bool>(),
            ),
            |(shape, seed, keep)| {
                let rank = shape.len();
                let axes: Vec<isize> = (0..rank as isize)
                    .filter(|a| (seed >> a) & 1 == 1)
                    .collect();
                let ax = Axes::List(axes.clone());
                let inp = input(&shape, seed, -2.0, 2.0);
                check(
                    "reduce_sum",
                    &|x| x[0].reduce_sum(ax.clone(), keep),
                    std::slice::from_ref(&inp),
                );
                check(
                    "reduce_mean",
                    &|x| x[0].reduce_mean(ax.clone(), keep),
                    std::slice::from_ref(&inp),
                );
                check(
                    "reduce_max",
                    &|x| x[0].reduce_max(ax.clone(), keep),
                    std::slice::from_ref(&inp),
                );
                check(
                    "reduce_min",
                    &|x| x[0].reduce_min(ax.clone(), keep),
                    std::slice::from_ref(&inp),
                );
                check(
                    "reduce_prod",
                    &|x| x[0].reduce_prod(ax.clone(), keep),
                    std::slice::from_ref(&inp),
                );
                check(
                    "reduce_logsumexp",
                    &|x| x[0].reduce_logsumexp(ax.clone(), keep),
                    &[inp],
                );
                Ok(())
            },
        )
        .unwrap();
    // A zero inside a product: the gradient is the product of the others, not NaN.
    check(
        "reduce_prod with zero",
        &|x| x[0].reduce_prod(Axes::All, false),
        &[(vec![3], vec![2.0, 0.0, 3.0])],
    );
}

#[test]
fn matmul_matches_finite_differences_with_transposes_and_batch_broadcast() {
    for (ta, tb) in [(false, false), (true, false), (false, true), (true, true)] {
        let a = if ta {
            input(&[2, 3, 4], 1, -1.0, 1.0)
        } else {
            input(&[2, 4, 3], 1, -1.0, 1.0)
        };
        let b = if tb {
            input(&[1, 2, 3], 2, -1.0, 1.0)
        } else {
            input(&[1, 3, 2], 2, -1.0, 1.0)
        };
        check("matmul", &|x| x[0].matmul_t(&x[1], ta, tb), &[a, b]);
    }
}

#[test]
fn shape_ops_match_finite_differences() {
    let x = input(&[2, 3, 4], 5, -1.0, 1.0);
    check("reshape", &|x| x[0].reshape(&[4, -1]), &[x.clone()]);
    check("transpose", &|x| x[0].transpose(&[2, 0, 1]), &[x.clone()]);
    check(
        "strided_slice",
        &|x| {
            x[0].strided_slice(&[
                SliceSpec::Index(1),
                SliceSpec::reversed(),
                SliceSpec::Range {
                    start: Some(0),
                    stop: None,
                    step: 2,
                },
            ])
        },
        &[x.clone()],
    );
    check(
        "slice",
        &|x| x[0].slice(&[0, 1, 1], &[2, -1, 2]),
        &[x.clone()],
    );
    check(
        "broadcast_to",
        &|x| x[0].broadcast_to(&[3, 2, 3, 4]),
        &[x.clone()],
    );
    check(
        "expand+squeeze",
        &|x| x[0].expand_dims(1)?.squeeze(&[1]),
        &[x.clone()],
    );
    check("reverse", &|x| x[0].reverse(&[0, 2]), &[x.clone()]);
    check(
        "concat",
        &|x| Tensor::concat(&[x[0].clone(), x[1].clone()], 1),
        &[x.clone(), input(&[2, 2, 4], 6, -1.0, 1.0)],
    );
    check(
        "stack",
        &|x| Tensor::stack(&[x[0].clone(), x[0].square()?], 0),
        &[x.clone()],
    );
    check(
        "split",
        &|x| Ok(x[0].split(&[1, 3], 2)?[1].clone()),
        &[x.clone()],
    );
    check(
        "pad",
        &|x| x[0].pad(&[(1, 0), (0, 2), (1, 1)], 0.5),
        &[x.clone()],
    );
    check(
        "pad REFLECT",
        &|x| x[0].pad_mirror(&[(1, 1), (2, 1), (0, 2)], false),
        &[x.clone()],
    );
    check(
        "pad SYMMETRIC",
        &|x| x[0].pad_mirror(&[(1, 1), (2, 1), (0, 2)], true),
        &[x.clone()],
    );
    check("tile", &|x| x[0].tile(&[2, 1, 2]), &[x.clone()]);
}

/// cast passes the gradient through in the source dtype (finite differences would only
/// measure f32 rounding here, so the identity is checked directly): d/dx Σ c·cast(x) = c.
#[test]
fn cast_passes_gradients_through_and_integers_get_none() {
    ferroflow::init();
    let x = t(&[3], &[0.5, 0.25, -1.0]);
    let c = Tensor::from_slice(&[2.0f32, -1.0, 0.5]).unwrap();
    let tape = GradientTape::persistent();
    tape.watch(&x);
    let y = x
        .cast(DType::F32)
        .unwrap()
        .mul(&c)
        .unwrap()
        .reduce_sum(Axes::All, false)
        .unwrap();
    let g = tape.gradient(&y, &[(&x).into()]).unwrap()[0]
        .clone()
        .unwrap();
    assert_eq!(
        (g.dtype(), g.to_vec::<f64>().unwrap()),
        (DType::F64, vec![2.0, -1.0, 0.5])
    );
    // An integer intermediate cuts the path: no gradient, not a wrong one.
    let z = x
        .cast(DType::I32)
        .unwrap()
        .cast(DType::F64)
        .unwrap()
        .reduce_sum(Axes::All, false)
        .unwrap();
    let tape2 = GradientTape::new();
    tape2.watch(&x);
    let z2 = x
        .mul(&x)
        .unwrap()
        .reduce_sum(Axes::All, false)
        .unwrap()
        .add(&z)
        .unwrap();
    let g2 = tape2.gradient(&z2, &[(&x).into()]).unwrap()[0]
        .clone()
        .unwrap()
        .to_vec::<f64>()
        .unwrap();
    assert_eq!(g2, vec![1.0, 0.5, -2.0]);
}

#[test]
fn indexing_ops_match_finite_differences() {
    let x = input(&[4, 3], 7, -1.0, 1.0);
    let idx = Tensor::from_slice(&[2i64, 0, 2, 3]).unwrap();
    check(
        "gather axis 0 (repeats)",
        &|x| x[0].gather(&idx, 0),
        &[x.clone()],
    );
    check(
        "gather axis 1",
        &|x| x[0].gather(&Tensor::from_slice(&[1i32, 1]).unwrap(), 1),
        &[x.clone()],
    );
    let nd = Tensor::from_vec(vec![1i64, 2, 3, 0], &[2, 2]).unwrap();
    check("gather_nd", &|x| x[0].gather_nd(&nd), &[x.clone()]);
    check(
        "scatter_nd",
        &|x| Tensor::scatter_nd(&nd, &x[0], &[4, 3]),
        &[input(&[2], 8, -1.0, 1.0)],
    );
    let cond = Tensor::from_vec(vec![true, false, true], &[3]).unwrap();
    check(
        "select",
        &|x| Tensor::select(&cond, &x[0], &x[1]),
        &[x.clone(), input(&[1, 3], 9, -1.0, 1.0)],
    );
}

#[test]
fn scans_sorts_and_nn_ops_match_finite_differences() {
    let x = input(&[3, 4], 11, 0.5, 2.0);
    for (ex, rev) in [(false, false), (true, false), (false, true), (true, true)] {
        check("cumsum", &|x| x[0].cumsum(1, ex, rev), &[x.clone()]);
        check("cumprod", &|x| x[0].cumprod(0, ex, rev), &[x.clone()]);
    }
    check("sort", &|x| x[0].sort(1, true), &[x.clone()]);
    check("top_k", &|x| Ok(x[0].top_k(2)?.0), &[x.clone()]);
    check("softmax", &|x| x[0].softmax(-1), &[x.clone()]);
    check("log_softmax", &|x| x[0].log_softmax(0), &[x.clone()]);
    // The fused cross-entropy's two outputs, each and together (the backprop output's
    // gradient is the softmax's Jacobian).
    let labels = Tensor::from_vec(vec![2i64, 0, 3], &[3]).unwrap();
    let xent = |x: &[Tensor]| x[0].sparse_softmax_cross_entropy_with_logits(&labels);
    check("sparse xent loss", &|x| Ok(xent(x)?.0), &[x.clone()]);
    check("sparse xent backprop", &|x| Ok(xent(x)?.1), &[x.clone()]);
    check(
        "sparse xent loss and backprop",
        &|x| {
            let (loss, backprop) = xent(x)?;
            backprop.add(&loss.expand_dims(-1)?)
        },
        &[x.clone()],
    );
    let img = input(&[2, 5, 5, 2], 12, -1.0, 1.0);
    let filt = input(&[3, 2, 2, 3], 13, -1.0, 1.0);
    check(
        "conv2d SAME s2",
        &|x| x[0].conv2d(&x[1], [2, 1], Padding::Same, [1, 1]),
        &[img.clone(), filt.clone()],
    );
    check(
        "conv2d VALID d2",
        &|x| x[0].conv2d(&x[1], [1, 1], Padding::Valid, [1, 2]),
        &[img.clone(), filt.clone()],
    );
    let bias = input(&[3], 14, -1.0, 1.0);
    for activation in [FusedActivation::Linear, FusedActivation::Relu] {
        check(
            &format!("fused_conv2d {activation:?} SAME s2"),
            &|x| x[0].fused_conv2d(&x[1], &x[2], activation, [2, 1], Padding::Same, [1, 1]),
            &[img.clone(), filt.clone(), bias.clone()],
        );
    }
    check(
        "max_pool2d",
        &|x| x[0].max_pool2d([2, 2], [2, 2], Padding::Same),
        &[img.clone()],
    );
    check(
        "avg_pool2d",
        &|x| x[0].avg_pool2d([3, 2], [1, 2], Padding::Same),
        &[img.clone()],
    );
    // Overlapping max-pool windows (3x3 at stride 1): an element can be the maximum of
    // several windows and collects each one's gradient.
    check(
        "max_pool2d overlapping",
        &|x| x[0].max_pool2d([3, 3], [1, 1], Padding::Valid),
        &[img.clone()],
    );
}

/// The backprop primitives and other ops no composite reaches, differentiated directly
/// (their own gradients are what second derivatives use).
#[test]
fn backprop_primitives_match_finite_differences() {
    let img = input(&[2, 5, 4, 2], 21, -1.0, 1.0);
    // copy: the identity
    check("copy", &|x| x[0].copy(), &[img.clone()]);
    // conv2d_backprop_filter(x, dy): bilinear in x and dy
    let dy = input(&[2, 3, 2, 3], 22, -1.0, 1.0);
    check(
        "conv2d_backprop_filter",
        &|x| x[0].conv2d_backprop_filter([3, 3, 2, 3], &x[1], [1, 1], Padding::Valid, [1, 1]),
        &[img.clone(), dy.clone()],
    );
    let dy_same = input(&[2, 3, 2, 3], 23, -1.0, 1.0);
    check(
        "conv2d_backprop_filter SAME s2",
        &|x| x[0].conv2d_backprop_filter([2, 3, 2, 3], &x[1], [2, 2], Padding::Same, [1, 1]),
        &[img.clone(), dy_same],
    );
    // conv2d_backprop_input(filter, dy)
    check(
        "conv2d_backprop_input",
        &|x| {
            Tensor::conv2d_backprop_input(
                [2, 5, 4, 2],
                &x[0],
                &x[1],
                [1, 1],
                Padding::Valid,
                [1, 1],
            )
        },
        &[input(&[3, 3, 2, 3], 24, -1.0, 1.0), dy],
    );
    // avg_pool_grad(dy): linear in dy
    check(
        "avg_pool_grad",
        &|x| Tensor::avg_pool_grad([2, 5, 4, 2], &x[0], [3, 2], [1, 2], Padding::Same),
        &[input(&[2, 5, 2, 2], 25, -1.0, 1.0)],
    );
    // fused_matmul(a, b, bias): the product's, the bias add's and the ReLU's gradients (a
    // batched left operand; the bias keeps the sums away from ReLU's kink).
    for activation in [FusedActivation::Linear, FusedActivation::Relu] {
        check(
            &format!("fused_matmul {activation:?}"),
            &|x| x[0].fused_matmul(&x[1], &x[2], activation),
            &[
                input(&[2, 3, 4], 28, -1.0, 1.0),
                input(&[4, 5], 29, -1.0, 1.0),
                (vec![5], vec![2.5, -2.5, 2.5, -2.5, 2.5]),
            ],
        );
    }
    // bias_activation_grad(g, y): dx = g·[y > 0] and db = Σ dx; y away from 0.
    let g = input(&[3, 4], 26, -1.0, 1.0);
    let y: (Vec<usize>, Vec<f64>) = (
        vec![3, 4],
        vals(12, 27, -1.0, 1.0)
            .iter()
            .map(|v| v + 0.2 * v.signum())
            .collect(),
    );
    for activation in [FusedActivation::Linear, FusedActivation::Relu] {
        check(
            &format!("bias_activation_grad {activation:?} dx"),
            &|x| Ok(x[0].bias_activation_grad(&x[1], activation)?.0),
            &[g.clone(), y.clone()],
        );
        check(
            &format!("bias_activation_grad {activation:?} db"),
            &|x| Ok(x[0].bias_activation_grad(&x[1], activation)?.1),
            &[g.clone(), y.clone()],
        );
    }
}

/// Second derivatives: the Hessian from nested tapes against finite differences of the
/// tape's own gradient.
#[test]
fn hessians_from_nested_tapes_match_finite_differences() {
    ferroflow::init();
    type F = Box<dyn Fn(&Tensor) -> ferroflow::Result<Tensor>>;
    let a = t(&[3, 3], &vals(9, 21, -1.0, 1.0));
    let a2 = a.clone();
    let funcs: Vec<(&str, F)> = vec![
        (
            "Σ sin(x) x²",
            Box::new(|x: &Tensor| x.sin()?.mul(&x.square()?)?.reduce_sum(Axes::All, false)),
        ),
        (
            "logsumexp(Ax)",
            Box::new(move |x: &Tensor| {
                a.matmul(&x.reshape(&[3, 1])?)?
                    .reduce_logsumexp(Axes::All, false)
            }),
        ),
        (
            "Σ softmax(x)·c",
            Box::new(|x: &Tensor| {
                x.softmax(0)?
                    .mul(&t(&[3], &[1.0, -2.0, 0.5]))?
                    .reduce_sum(Axes::All, false)
            }),
        ),
        (
            "Σ tanh(Ax)²",
            Box::new(move |x: &Tensor| {
                a2.matmul(&x.reshape(&[3, 1])?)?
                    .tanh()?
                    .square()?
                    .reduce_sum(Axes::All, false)
            }),
        ),
        (
            "sparse softmax cross-entropy",
            Box::new(|x: &Tensor| {
                let labels = Tensor::from_vec(vec![1i64], &[1]).unwrap();
                x.reshape(&[1, 3])?
                    .sparse_softmax_cross_entropy_with_logits(&labels)?
                    .0
                    .reduce_sum(Axes::All, false)
            }),
        ),
        (
            "Σ x^x",
            Box::new(|x: &Tensor| x.pow(x)?.reduce_sum(Axes::All, false)),
        ),
    ];
    let x0 = vals(3, 22, 0.5, 1.5);
    for (name, f) in funcs {
        let grad = |xv: &[f64]| -> Vec<f64> {
            let x = t(&[3], xv);
            let tape = GradientTape::new();
            tape.watch(&x);
            let y = f(&x).unwrap();
            tape.gradient(&y, &[(&x).into()]).unwrap()[0]
                .clone()
                .unwrap()
                .to_vec::<f64>()
                .unwrap()
        };
        let x = t(&[3], &x0);
        let outer = GradientTape::new();
        outer.watch(&x);
        let inner = GradientTape::new();
        inner.watch(&x);
        let y = f(&x).unwrap();
        let g = inner.gradient(&y, &[(&x).into()]).unwrap()[0]
            .clone()
            .unwrap();
        let h = outer
            .jacobian(&g, &(&x).into())
            .unwrap()
            .to_vec::<f64>()
            .unwrap();
        let eps = 1e-5;
        for j in 0..3 {
            let (mut p, mut m) = (x0.clone(), x0.clone());
            p[j] += eps;
            m[j] -= eps;
            let (gp, gm) = (grad(&p), grad(&m));
            for i in 0..3 {
                let numeric = (gp[i] - gm[i]) / (2.0 * eps);
                assert!(
                    (h[i * 3 + j] - numeric).abs() < 1e-5 * (1.0 + numeric.abs()),
                    "{name}: H[{i},{j}] tape {} numeric {numeric}",
                    h[i * 3 + j]
                );
            }
        }
    }
}

/// Second derivatives through conv2d (its backprop kernels are differentiated in turn).
#[test]
fn conv2d_second_derivative_matches_finite_differences() {
    let img = input(&[1, 4, 4, 1], 31, -1.0, 1.0);
    let filt = input(&[2, 2, 1, 2], 32, -1.0, 1.0);
    // f(x) = Σ (dL/dx)² where L = Σ tanh(conv(x, w)); checks d/dx of backprop_input.
    check(
        "d/dx Σ (∂/∂x Σ tanh(conv))²",
        &|x| {
            let tape = GradientTape::new();
            tape.watch(&x[0]);
            let y = x[0]
                .conv2d(&x[1], [1, 1], Padding::Same, [1, 1])?
                .tanh()?
                .reduce_sum(Axes::All, false)?;
            let g = tape.gradient(&y, &[(&x[0]).into()])?[0].clone().unwrap();
            g.square()?.reduce_sum(Axes::All, false)
        },
        &[img, filt],
    );
}

/// Second derivatives through fused_conv2d's bias gradient (bias_activation_grad is
/// differentiated in turn): f = Σ (∂/∂b Σ tanh(relu(conv(x, w) + b)))².
#[test]
fn fused_conv2d_bias_second_derivative_matches_finite_differences() {
    let img = input(&[2, 4, 4, 2], 41, -1.0, 1.0);
    let filt = input(&[2, 2, 2, 3], 42, -1.0, 1.0);
    let bias = input(&[3], 43, -0.5, 0.5);
    for activation in [FusedActivation::Linear, FusedActivation::Relu] {
        check(
            &format!("d/d(x, w, b) Σ (∂/∂b Σ tanh(fused_conv2d {activation:?}))²"),
            &|x| {
                let tape = GradientTape::new();
                tape.watch(&x[2]);
                let y = x[0]
                    .fused_conv2d(&x[1], &x[2], activation, [1, 1], Padding::Same, [1, 1])?
                    .tanh()?
                    .reduce_sum(Axes::All, false)?;
                let g = tape.gradient(&y, &[(&x[2]).into()])?[0].clone().unwrap();
                g.square()?.reduce_sum(Axes::All, false)
            },
            &[img.clone(), filt.clone(), bias.clone()],
        );
    }
}

/// A complex128 tensor from parts.
fn ct(shape: &[usize], re: &[f64], im: &[f64]) -> Tensor {
    let v = re
        .iter()
        .zip(im)
        .map(|(&a, &b)| ferroflow::Complex64::new(a, b))
        .collect();
    Tensor::from_host(HostData::C128(v), shape).unwrap()
}

/// A real loss of a complex or real result: Σ re(y)·w + im(y)·w' (w' a second pattern).
fn complex_loss(y: &Tensor, w: &Tensor) -> Tensor {
    let w2 = w
        .reverse(&[])
        .unwrap()
        .mul(&w.scalar_like(-0.7).unwrap())
        .unwrap();
    let re = y.real().unwrap().cast(DType::F64).unwrap();
    let im = y.imag().unwrap().cast(DType::F64).unwrap();
    let s = re.mul(w).unwrap().add(&im.mul(&w2).unwrap()).unwrap();
    s.reduce_sum(Axes::All, false).unwrap()
}

/// One input of a complex gradient check: its shape, real and imaginary parts, and whether
/// it is complex128 (else float64, the imaginary parts unused).
type ComplexInput = (Vec<usize>, Vec<f64>, Vec<f64>, bool);

/// The tape's gradient of a real loss of `f` against finite differences in TF's convention:
/// for a complex input z = x + iy the gradient is ∂L/∂x + i·∂L/∂y.
fn check_complex(
    name: &str,
    f: &dyn Fn(&[Tensor]) -> ferroflow::Result<Tensor>,
    inputs: &[ComplexInput],
) {
    ferroflow::init();
    let make = |(s, re, im, complex): &ComplexInput| {
        if *complex {
            ct(s, re, im)
        } else {
            t(s, re)
        }
    };
    let xs: Vec<Tensor> = inputs.iter().map(make).collect();
    let tape = GradientTape::new();
    for x in &xs {
        tape.watch(x);
    }
    let y = f(&xs).unwrap_or_else(|e| panic!("{name}: forward failed: {e}"));
    let w = weights(y.shape());
    let l = complex_loss(&y, &w);
    let sources: Vec<Source> = xs.iter().map(Source::from).collect();
    let grads = tape
        .gradient(&l, &sources)
        .unwrap_or_else(|e| panic!("{name}: gradient failed: {e}"));
    let eps = 1e-6;
    for (k, input) in inputs.iter().enumerate() {
        let (shape, re, im, complex) = input;
        let g = grads[k]
            .as_ref()
            .unwrap_or_else(|| panic!("{name}: no gradient for input {k}"));
        assert_eq!(g.shape(), shape.as_slice(), "{name}: gradient {k} shape");
        assert_eq!(g.dtype(), xs[k].dtype(), "{name}: gradient {k} dtype");
        let (g_re, g_im) = (
            g.real().unwrap().to_vec::<f64>().unwrap(),
            g.imag().unwrap().to_vec::<f64>().unwrap(),
        );
        let parts: &[(bool, &Vec<f64>)] = if *complex {
            &[(false, &g_re), (true, &g_im)]
        } else {
            &[(false, &g_re)]
        };
        for &(imaginary, analytic) in parts {
            for i in 0..re.len() {
                let eval = |d: f64| {
                    let mut vs = xs.clone();
                    let (mut r, mut m) = (re.clone(), im.clone());
                    if imaginary {
                        m[i] += d;
                    } else {
                        r[i] += d;
                    }
                    vs[k] = make(&(shape.clone(), r, m, *complex));
                    complex_loss(&f(&vs).unwrap(), &w).item::<f64>().unwrap()
                };
                let numeric = (eval(eps) - eval(-eps)) / (2.0 * eps);
                let a = analytic[i];
                assert!(
                    (a - numeric).abs() <= 1e-5 * (1.0 + numeric.abs()),
                    "{name}: d/d{}(x{k}[{i}]) tape {a}, finite difference {numeric}",
                    if imaginary { "im" } else { "re" }
                );
            }
        }
    }
}

fn complex_input(shape: &[usize], seed: u64, lo: f64, hi: f64) -> ComplexInput {
    let n = shape.iter().product();
    (
        shape.to_vec(),
        vals(n, seed, lo, hi),
        vals(n, seed + 1000, lo, hi),
        true,
    )
}

#[test]
fn complex_unary_ops_match_finite_differences_in_tfs_convention() {
    use ferroflow::UnaryOp;
    for &op in UnaryOp::ALL.iter().filter(|o| o.accepts_complex()) {
        // away from branch cuts, poles and |z| = 0 where the ops are not differentiable
        let (lo, hi) = match op {
            UnaryOp::Asin | UnaryOp::Acos | UnaryOp::Atan => (0.1, 0.6),
            UnaryOp::Tan | UnaryOp::Tanh | UnaryOp::Sigmoid => (-1.0, 1.0),
            UnaryOp::Log | UnaryOp::Sqrt | UnaryOp::Rsqrt | UnaryOp::Reciprocal => (0.3, 2.0),
            UnaryOp::Abs | UnaryOp::Angle => (0.2, 2.0),
            _ => (-1.5, 1.5),
        };
        runner(cases() / 4)
            .run(&(shapes(), 0..1000u64), |(shape, seed)| {
                let x = complex_input(&shape, seed, lo, hi);
                match op {
                    // piecewise constant: no gradient, as for real numbers
                    UnaryOp::Sign => {}
                    _ => check_complex(op.name(), &|v| v[0].unary(op), &[x]),
                }
                Ok(())
            })
            .unwrap();
    }
}

#[test]
fn complex_binary_ops_match_finite_differences_with_broadcasting() {
    use ferroflow::BinaryOp;
    for op in [
        BinaryOp::Add,
        BinaryOp::Sub,
        BinaryOp::Mul,
        BinaryOp::Div,
        BinaryOp::Pow,
        BinaryOp::SquaredDifference,
    ] {
        let (lo, hi) = if matches!(op, BinaryOp::Pow | BinaryOp::Div) {
            (0.3, 1.5)
        } else {
            (-1.5, 1.5)
        };
        let a = complex_input(&[2, 3], 1, lo, hi);
        let b = complex_input(&[3], 2, lo, hi);
        check_complex(
            op.name(),
            &|v| v[0].binary(op, &v[1]),
            &[a.clone(), b.clone()],
        );
        check_complex(op.name(), &|v| v[1].binary(op, &v[0]), &[a, b]);
    }
    // complex(re, im) from real parts: their gradients are the parts of the gradient
    let (re, im) = (input(&[2, 3], 3, -1.0, 1.0), input(&[3], 4, -1.0, 1.0));
    check_complex(
        "complex",
        &|v| Tensor::complex(&v[0], &v[1]),
        &[
            (re.0, re.1, vec![0.0; 6], false),
            (im.0, im.1, vec![0.0; 3], false),
        ],
    );
}

#[test]
fn complex_reductions_scans_matmul_casts_and_ffts_match_finite_differences() {
    let x = complex_input(&[2, 3, 4], 5, -1.0, 1.0);
    let r = |f: fn(&Tensor) -> ferroflow::Result<Tensor>| move |v: &[Tensor]| f(&v[0]);
    check_complex(
        "reduce_sum",
        &r(|x| x.reduce_sum(Axes::from(&[0, 2][..]), false)),
        &[x.clone()],
    );
    check_complex("reduce_prod", &r(|x| x.reduce_prod(1, true)), &[x.clone()]);
    check_complex(
        "reduce_mean",
        &r(|x| x.reduce_mean(Axes::All, false)),
        &[x.clone()],
    );
    check_complex("cumsum", &r(|x| x.cumsum(2, true, false)), &[x.clone()]);
    check_complex("cumprod", &r(|x| x.cumprod(1, false, true)), &[x.clone()]);
    check_complex("fft", &r(|x| x.fft()), &[x.clone()]);
    check_complex("ifft", &r(|x| x.ifft()), &[x.clone()]);
    check_complex("irfft", &r(|x| x.irfft(Some(6))), &[x.clone()]);
    check_complex("irfft odd", &r(|x| x.irfft(Some(5))), &[x.clone()]);
    check_complex(
        "fft of a prime length",
        &r(|x| x.fft()),
        &[complex_input(&[7], 6, -1.0, 1.0)],
    );
    check_complex(
        "complex to real cast",
        &r(|x| x.cast(DType::F64)),
        &[x.clone()],
    );
    let real = input(&[2, 5], 7, -1.0, 1.0);
    let real = (real.0, real.1, vec![0.0; 10], false);
    check_complex("rfft", &r(|x| x.rfft(None)), &[real.clone()]);
    check_complex("rfft padded", &r(|x| x.rfft(Some(8))), &[real.clone()]);
    check_complex("real to complex cast", &r(|x| x.cast(DType::C128)), &[real]);
    let (a, b) = (
        complex_input(&[2, 3, 4], 8, -1.0, 1.0),
        complex_input(&[4, 2], 9, -1.0, 1.0),
    );
    check_complex("matmul", &|v| v[0].matmul(&v[1]), &[a.clone(), b.clone()]);
    let bt = complex_input(&[2, 4], 10, -1.0, 1.0);
    check_complex("matmul_t", &|v| v[0].matmul_t(&v[1], false, true), &[a, bt]);
}

#[test]
fn complex_second_derivatives_match_finite_differences() {
    // d/dz of the gradient of L(z) = Σ re(w·z³): the inner gradient is itself differentiated
    let x = complex_input(&[4], 11, -1.0, 1.0);
    check_complex(
        "gradient of cube",
        &|v| {
            let inner = GradientTape::new();
            inner.watch(&v[0]);
            let y = v[0].mul(&v[0])?.mul(&v[0])?;
            let l = complex_loss(&y, &weights(y.shape()));
            let g = inner.gradient(&l, &[Source::from(&v[0])])?;
            Ok(g[0].clone().expect("connected"))
        },
        &[x],
    );
}
