//! A graph function called under a tape is one op on the tape, its gradient a compiled
//! backward graph: the same gradients as eager execution (for arguments, variables read and
//! captured tensors), to second order, from persistent tapes used twice; graphs that do not
//! qualify (variable writes, random draws) still replay op by op with correct gradients.

use ferroflow::autodiff::GradientTape;
use ferroflow::function::Function;
use ferroflow::{random, Axes, DType, Result, Tensor, Variable};

fn normal(shape: &[usize], seed: u64) -> Tensor {
    random::stateless_normal(shape, [seed, 7], 0.0, 1.0, DType::F64).unwrap()
}

fn assert_close(a: &Tensor, b: &Tensor, what: &str) {
    assert_eq!(a.shape(), b.shape(), "{what}");
    let (a, b) = (a.to_vec::<f64>().unwrap(), b.to_vec::<f64>().unwrap());
    for (i, (x, y)) in a.iter().zip(&b).enumerate() {
        assert!(
            (x - y).abs() <= 1e-12 * (1.0 + x.abs().max(y.abs())),
            "{what}[{i}]: {x} vs {y}"
        );
    }
}

/// tanh-MLP layer with a GELU (fused chain), a captured scale and a softmax.
fn layer(x: &Tensor, w: &Variable, scale: &Tensor) -> Result<Vec<Tensor>> {
    let h = x.matmul(&w.value())?.mul(scale)?;
    let g = h.gelu()?;
    let p = g.softmax(-1)?;
    Ok(vec![p, g.reduce_sum(Axes::All, false)?])
}

fn setup() -> (Variable, Tensor, Function<'static>) {
    let w = Variable::new("w", normal(&[5, 4], 1));
    let scale = normal(&[4], 2);
    let f = {
        let (w, scale) = (w.clone(), scale.clone());
        Function::new(move |a: &[Tensor]| layer(&a[0], &w, &scale))
    };
    (w, scale, f)
}

/// A loss of both outputs, so each output gradient matters.
fn loss(outs: &[Tensor]) -> Result<Tensor> {
    let weights = normal(outs[0].shape(), 9);
    outs[0]
        .mul(&weights)?
        .reduce_sum(Axes::All, false)?
        .add(&outs[1].square()?)
}

#[test]
fn a_call_is_one_op_with_the_eager_gradients() {
    ferroflow::init();
    let (w, scale, f) = setup();
    let x = normal(&[3, 5], 3);
    f.call(std::slice::from_ref(&x)).unwrap(); // traced
    for seed in 0..3 {
        let x = normal(&[3, 5], 10 + seed);
        let traced = {
            let tape = GradientTape::new();
            tape.watch(&x);
            tape.watch(&scale);
            let outs = f.call(std::slice::from_ref(&x)).unwrap();
            assert_eq!(tape.num_recorded(), 1, "the call is one op on the tape");
            let l = loss(&outs).unwrap();
            tape.gradient(&l, &[(&x).into(), (&w).into(), (&scale).into()])
                .unwrap()
        };
        let eager = {
            let tape = GradientTape::new();
            tape.watch(&x);
            tape.watch(&scale);
            let outs = layer(&x, &w, &scale).unwrap();
            assert!(tape.num_recorded() > 5);
            let l = loss(&outs).unwrap();
            tape.gradient(&l, &[(&x).into(), (&w).into(), (&scale).into()])
                .unwrap()
        };
        for (name, (t, e)) in ["x", "w", "scale"].iter().zip(traced.iter().zip(&eager)) {
            assert_close(t.as_ref().unwrap(), e.as_ref().unwrap(), name);
        }
    }
}

#[test]
fn second_order_gradients_through_a_recorded_call() {
    ferroflow::init();
    let (w, scale, f) = setup();
    let x = normal(&[2, 5], 4);
    f.call(std::slice::from_ref(&x)).unwrap();
    let second = |call: &dyn Fn(&Tensor) -> Vec<Tensor>| {
        let outer = GradientTape::new();
        outer.watch(&x);
        let inner = GradientTape::new();
        inner.watch(&x);
        let l = loss(&call(&x)).unwrap();
        let dx = inner.gradient(&l, &[(&x).into()]).unwrap()[0]
            .clone()
            .unwrap();
        let s = dx.square().unwrap().reduce_sum(Axes::All, false).unwrap();
        outer.gradient(&s, &[(&x).into(), (&w).into()]).unwrap()
    };
    let traced = second(&|x| f.call(std::slice::from_ref(x)).unwrap());
    let eager = second(&|x| layer(x, &w, &scale).unwrap());
    for (name, (t, e)) in ["x", "w"].iter().zip(traced.iter().zip(&eager)) {
        assert_close(t.as_ref().unwrap(), e.as_ref().unwrap(), name);
    }
}

#[test]
fn a_persistent_tape_takes_the_gradient_twice() {
    ferroflow::init();
    let (w, _, f) = setup();
    let x = normal(&[3, 5], 5);
    f.call(std::slice::from_ref(&x)).unwrap();
    let tape = GradientTape::persistent();
    let outs = f.call(std::slice::from_ref(&x)).unwrap();
    let l = loss(&outs).unwrap();
    let a = tape.gradient(&l, &[(&w).into()]).unwrap()[0]
        .clone()
        .unwrap();
    let b = tape.gradient(&l, &[(&w).into()]).unwrap()[0]
        .clone()
        .unwrap();
    assert_close(&a, &b, "w");
}

#[test]
fn graphs_that_write_or_draw_replay_op_by_op() {
    ferroflow::init();
    let counter = Variable::new("calls", Tensor::scalar(0.0f64).unwrap());
    let f = {
        let counter = counter.clone();
        Function::new(move |a: &[Tensor]| {
            counter.assign_add(&Tensor::scalar(1.0f64)?)?;
            let total = a[0].sin()?.mul(&a[0])?.reduce_sum(Axes::All, false)?;
            Ok(vec![total.clone(), total.exp()?])
        })
    };
    let x = normal(&[4], 6);
    f.call(std::slice::from_ref(&x)).unwrap();
    let tape = GradientTape::persistent();
    tape.watch(&x);
    let y = f.call(std::slice::from_ref(&x)).unwrap();
    assert!(
        tape.num_recorded() > 1,
        "replayed op by op (the fused sum, then exp)"
    );
    let dx = tape.gradient(&y[0], &[(&x).into()]).unwrap()[0]
        .clone()
        .unwrap();
    // d Σ x sin x = sin x + x cos x
    let want = x
        .sin()
        .unwrap()
        .add(&x.mul(&x.cos().unwrap()).unwrap())
        .unwrap();
    assert_close(&dx, &want, "dx");
    // d exp(Σ x sin x) = exp(Σ x sin x) (sin x + x cos x)
    let de = tape.gradient(&y[1], &[(&x).into()]).unwrap()[0]
        .clone()
        .unwrap();
    assert_close(&de, &want.mul(&y[1]).unwrap(), "d exp");
    assert_eq!(counter.value().item::<f64>().unwrap(), 2.0);
}
