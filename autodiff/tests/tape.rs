//! GradientTape semantics: persistence, variables, unconnected sources, misuse errors,
//! stop_recording/reset, stop_gradient, custom_gradient, jacobians, and memory.

use ferroflow::autodiff::{
    custom_gradient, stop_gradient, GradFn, GradientTape, Source, UnconnectedGradients,
};
use ferroflow::{Axes, DType, Error, Tensor, Variable};
use std::sync::Arc;

fn scalar(v: f64) -> Tensor {
    Tensor::scalar(v).unwrap()
}

fn grad1(g: &[Option<Tensor>]) -> f64 {
    g[0].as_ref().expect("a gradient").item::<f64>().unwrap()
}

#[test]
fn seed_example_dot_sigmoid_sum_gradient_wrt_weights() {
    ferroflow::init();
    // loss = Σ σ(x·w); dloss/dw = xᵀ σ'(x·w) with σ' = σ(1-σ).
    let x = Tensor::from_vec(vec![1.0f64, 2.0, 3.0, 4.0, 5.0, 6.0], &[3, 2]).unwrap();
    let w = Variable::new("w", Tensor::from_vec(vec![0.1f64, -0.3], &[2, 1]).unwrap());
    let tape = GradientTape::new();
    let loss = x
        .matmul(&w.value())
        .unwrap()
        .sigmoid()
        .unwrap()
        .reduce_sum(Axes::All, false)
        .unwrap();
    let g = tape.gradient(&loss, &[(&w).into()]).unwrap()[0]
        .clone()
        .unwrap()
        .to_vec::<f64>()
        .unwrap();
    let xs = [[1.0, 2.0], [3.0, 4.0], [5.0, 6.0]];
    let mut want = [0.0; 2];
    for r in xs {
        let z: f64 = r[0] * 0.1 + r[1] * -0.3;
        let s = 1.0 / (1.0 + (-z).exp());
        want[0] += r[0] * s * (1.0 - s);
        want[1] += r[1] * s * (1.0 - s);
    }
    assert!(
        (g[0] - want[0]).abs() < 1e-12 && (g[1] - want[1]).abs() < 1e-12,
        "{g:?} vs {want:?}"
    );
}

#[test]
fn non_persistent_tape_refuses_a_second_gradient() {
    ferroflow::init();
    let x = scalar(2.0);
    let tape = GradientTape::new();
    tape.watch(&x);
    let y = x.mul(&x).unwrap();
    assert_eq!(grad1(&tape.gradient(&y, &[(&x).into()]).unwrap()), 4.0);
    let err = tape.gradient(&y, &[(&x).into()]).unwrap_err();
    assert!(
        matches!(err, Error::Tape { .. }) && err.to_string().contains("persistent"),
        "{err}"
    );
}

#[test]
fn persistent_tape_allows_many_gradients() {
    ferroflow::init();
    let x = scalar(3.0);
    let tape = GradientTape::persistent();
    tape.watch(&x);
    let y = x.mul(&x).unwrap(); // y = x², dy/dx = 6
    let z = y.mul(&y).unwrap(); // z = x⁴, dz/dx = 4x³ = 108
    assert_eq!(grad1(&tape.gradient(&y, &[(&x).into()]).unwrap()), 6.0);
    assert_eq!(grad1(&tape.gradient(&z, &[(&x).into()]).unwrap()), 108.0);
}

#[test]
fn trainable_variables_are_watched_automatically_unless_disabled() {
    ferroflow::init();
    let v = Variable::new("v", scalar(2.0));
    let frozen = Variable::with_options(
        "f",
        scalar(5.0),
        false,
        Default::default(),
        Default::default(),
    );
    let tape = GradientTape::new();
    let y = v.value().mul(&frozen.value()).unwrap(); // dy/dv = 5, frozen is not watched
    let g = tape.gradient(&y, &[(&v).into(), (&frozen).into()]).unwrap();
    assert_eq!(grad1(&g), 5.0);
    assert!(g[1].is_none(), "non-trainable variables are not watched");

    let tape = GradientTape::with_options(false, false);
    tape.watch_variable(&frozen);
    let y = v.value().mul(&frozen.value()).unwrap();
    let g = tape.gradient(&y, &[(&v).into(), (&frozen).into()]).unwrap();
    assert!(g[0].is_none());
    assert_eq!(g[1].as_ref().unwrap().item::<f64>().unwrap(), 2.0);
}

#[test]
fn multiple_targets_sum_and_output_gradients_weight_them() {
    ferroflow::init();
    let x = Tensor::from_slice(&[1.0f64, 2.0]).unwrap();
    let tape = GradientTape::persistent();
    tape.watch(&x);
    let a = x.mul(&x).unwrap(); // da/dx = 2x
    let b = x.mul(&scalar(3.0)).unwrap(); // db/dx = 3
    let g = tape
        .gradient_with(
            &[a.clone(), b.clone()],
            &[(&x).into()],
            None,
            UnconnectedGradients::None,
        )
        .unwrap();
    assert_eq!(
        g[0].as_ref().unwrap().to_vec::<f64>().unwrap(),
        vec![5.0, 7.0]
    );
    let w = [
        Tensor::from_slice(&[10.0f64, 1.0]).unwrap(),
        Tensor::from_slice(&[0.0f64, 1.0]).unwrap(),
    ];
    let g = tape
        .gradient_with(
            &[a.clone(), b],
            &[(&x).into()],
            Some(&w),
            UnconnectedGradients::None,
        )
        .unwrap();
    assert_eq!(
        g[0].as_ref().unwrap().to_vec::<f64>().unwrap(),
        vec![20.0, 7.0]
    );
    let bad = [Tensor::from_slice(&[1.0f64]).unwrap()];
    let e = tape
        .gradient_with(&[a], &[(&x).into()], Some(&bad), UnconnectedGradients::None)
        .unwrap_err();
    assert!(e.to_string().contains("output_gradients"), "{e}");
}

#[test]
fn unconnected_integer_and_unwatched_sources() {
    ferroflow::init();
    let x = scalar(1.0);
    let other = scalar(4.0);
    let ints = Tensor::scalar(3i32).unwrap();
    let tape = GradientTape::persistent();
    tape.watch(&x);
    tape.watch(&other);
    tape.watch(&ints);
    let y = x.exp().unwrap();
    let g = tape
        .gradient(&y, &[(&x).into(), (&other).into(), (&ints).into()])
        .unwrap();
    assert!(g[1].is_none() && g[2].is_none());
    let g = tape
        .gradient_with(&[y], &[(&other).into()], None, UnconnectedGradients::Zero)
        .unwrap();
    assert_eq!(grad1(&g), 0.0);
    // A target computed from nothing the tape watched is an error, not a silent None.
    let lonely = scalar(5.0).exp().unwrap();
    let e = tape.gradient(&lonely, &[(&x).into()]).unwrap_err();
    assert!(e.to_string().contains("not computed from"), "{e}");
}

#[test]
fn non_differentiable_ops_give_none_not_zero() {
    ferroflow::init();
    let x = Tensor::from_slice(&[1.5f64, -2.5]).unwrap();
    let tape = GradientTape::persistent();
    tape.watch(&x);
    for y in [x.floor().unwrap(), x.sign().unwrap(), x.round().unwrap()] {
        let s = y.reduce_sum(Axes::All, false).unwrap();
        assert!(tape.gradient(&s, &[(&x).into()]).unwrap()[0].is_none());
    }
    let am = x.argmax(0).unwrap();
    assert_eq!(am.dtype(), DType::I64);
}

#[test]
fn stop_recording_reset_and_stop_gradient() {
    ferroflow::init();
    let x = scalar(2.0);
    let tape = GradientTape::persistent();
    tape.watch(&x);
    let y = x.mul(&x).unwrap();
    let paused = {
        let _p = tape.stop_recording();
        y.mul(&x).unwrap()
    };
    let z = paused.add(&y).unwrap();
    // Only y = x² is on the tape: dz/dx = 2x = 4 (the paused x³ contributes nothing).
    assert_eq!(grad1(&tape.gradient(&z, &[(&x).into()]).unwrap()), 4.0);
    let cut = stop_gradient(&y).unwrap().mul(&x).unwrap(); // d/dx [sg(x²)·x] = x² = 4
    assert_eq!(grad1(&tape.gradient(&cut, &[(&x).into()]).unwrap()), 4.0);
    tape.reset();
    assert_eq!(tape.num_recorded(), 0);
    assert!(
        tape.gradient(&y, &[(&x).into()]).is_err(),
        "after reset nothing is recorded"
    );
}

#[test]
fn custom_gradient_replaces_the_derivative_and_nests() {
    ferroflow::init();
    // Forward: y = x³; declared gradient: 3x², itself made of ops, so the second
    // derivative through it is 6x.
    let x = scalar(2.0);
    let outer = GradientTape::new();
    outer.watch(&x);
    let inner = GradientTape::new();
    inner.watch(&x);
    let y = custom_gradient(std::slice::from_ref(&x), |xs| {
        let x0 = xs[0].clone();
        let y = x0.mul(&x0)?.mul(&x0)?;
        let grad: GradFn = Arc::new(move |dy: &[Tensor]| {
            Ok(vec![Some(
                dy[0].mul(&x0.mul(&x0)?.mul(&x0.scalar_like(3.0)?)?)?,
            )])
        });
        Ok((vec![y], grad))
    })
    .unwrap();
    assert_eq!(
        inner.num_recorded(),
        1,
        "the forward's own ops are not recorded"
    );
    let g = inner.gradient(&y[0], &[(&x).into()]).unwrap()[0]
        .clone()
        .unwrap();
    assert_eq!(g.item::<f64>().unwrap(), 12.0);
    assert_eq!(grad1(&outer.gradient(&g, &[(&x).into()]).unwrap()), 12.0);
}

#[test]
fn jacobian_and_batch_jacobian() {
    ferroflow::init();
    // y = A x: the jacobian is A.
    let a = Tensor::from_vec(vec![1.0f64, 2.0, 3.0, 4.0, 5.0, 6.0], &[3, 2]).unwrap();
    let x = Tensor::from_vec(vec![0.5f64, -1.0], &[2, 1]).unwrap();
    let tape = GradientTape::new();
    tape.watch(&x);
    let y = a.matmul(&x).unwrap();
    let j = tape.jacobian(&y, &Source::from(&x)).unwrap();
    assert_eq!(j.shape(), &[3, 1, 2, 1]);
    assert_eq!(j.to_vec::<f64>().unwrap(), a.to_vec::<f64>().unwrap());
    // Row-wise y_b = x_b² elementwise: batch_jacobian is diag(2 x_b) per row.
    let xb = Tensor::from_vec(vec![1.0f64, 2.0, 3.0, 4.0], &[2, 2]).unwrap();
    let tape = GradientTape::new();
    tape.watch(&xb);
    let yb = xb.square().unwrap();
    let bj = tape.batch_jacobian(&yb, &Source::from(&xb)).unwrap();
    assert_eq!(bj.shape(), &[2, 2, 2]);
    assert_eq!(
        bj.to_vec::<f64>().unwrap(),
        vec![2.0, 0.0, 0.0, 4.0, 6.0, 0.0, 0.0, 8.0]
    );
}

#[test]
fn ten_thousand_training_steps_do_not_grow_live_tensor_memory() {
    ferroflow::init();
    let x = ferroflow::random::stateless_normal(&[16, 8], [1, 2], 0.0, 1.0, DType::F32).unwrap();
    let target =
        ferroflow::random::stateless_normal(&[16, 1], [3, 4], 0.0, 1.0, DType::F32).unwrap();
    let w = Variable::new(
        "w",
        ferroflow::random::stateless_normal(&[8, 1], [5, 6], 0.0, 0.1, DType::F32).unwrap(),
    );
    let lr = Tensor::scalar(0.01f32).unwrap();
    let step = || {
        let tape = GradientTape::new();
        let pred = x.matmul(&w.value()).unwrap().tanh().unwrap();
        let loss = pred
            .squared_difference(&target)
            .unwrap()
            .reduce_mean(Axes::All, false)
            .unwrap();
        let g = tape.gradient(&loss, &[(&w).into()]).unwrap()[0]
            .clone()
            .unwrap();
        w.assign_sub(&g.mul(&lr).unwrap()).unwrap();
        loss.item::<f32>().unwrap()
    };
    let mut first = 0.0;
    for _ in 0..100 {
        first = step();
    }
    let baseline = ferroflow::live_tensor_bytes();
    let mut last = first;
    for _ in 0..10_000 {
        last = step();
    }
    let after = ferroflow::live_tensor_bytes();
    // Other tests in this binary run in parallel and hold a few small tensors; a leak of
    // even one 32-byte gradient per step would add 320 KB.
    assert!(
        after <= baseline + 16 * 1024,
        "live tensor bytes grew from {baseline} to {after}"
    );
    assert!(
        last < first,
        "training should reduce the loss ({first} -> {last})"
    );
}

#[test]
fn half_precision_inputs_get_half_precision_gradients() {
    ferroflow::init();
    // d/dx Σ x² = 2x, and d/dx Σ tanh(x)·w = w (1 - tanh² x), in f16 and bf16.
    for dtype in [DType::F16, DType::BF16] {
        let x = Tensor::from_host(
            ferroflow::HostData::from_f64_slice(dtype, &[0.5, -1.25, 2.0]),
            &[3],
        )
        .unwrap();
        let w = Tensor::from_host(
            ferroflow::HostData::from_f64_slice(dtype, &[1.0, 2.0, -0.5]),
            &[3],
        )
        .unwrap();
        let tape = GradientTape::persistent();
        tape.watch(&x);
        let sq = x.square().unwrap().reduce_sum(Axes::All, false).unwrap();
        let g = tape.gradient(&sq, &[(&x).into()]).unwrap()[0]
            .clone()
            .unwrap();
        assert_eq!(g.dtype(), dtype);
        assert_eq!(g.to_f64_vec().unwrap(), vec![1.0, -2.5, 4.0]);
        let th = x
            .tanh()
            .unwrap()
            .mul(&w)
            .unwrap()
            .reduce_sum(Axes::All, false)
            .unwrap();
        let g = tape.gradient(&th, &[(&x).into()]).unwrap()[0]
            .clone()
            .unwrap()
            .to_f64_vec()
            .unwrap();
        for ((gi, xi), wi) in g.iter().zip([0.5f64, -1.25, 2.0]).zip([1.0, 2.0, -0.5]) {
            let want = wi * (1.0 - xi.tanh().powi(2));
            assert!(
                (gi - want).abs() < 0.02 * (1.0 + want.abs()),
                "{dtype}: {gi} vs {want}"
            );
        }
    }
}
