//! `cond` and `while_loop` traced into graphs against the same code run eagerly: the same
//! values and gradients (bit for bit: the same kernels run) whichever branch and however
//! many iterations a later call takes, gradients from tapes inside and outside the
//! function, variable writes only in the taken branch, and the errors a trace gives.

use ferroflow::autodiff::{GradientTape, UnconnectedGradients};
use ferroflow::function::{cond, while_loop, while_loop_with, Function, NodeKind};
use ferroflow::{random, Axes, DType, Error, Result, Tensor, Variable};

mod common;
use common::bits;

fn f64s(shape: &[usize], seed: u64) -> Tensor {
    random::stateless_normal(shape, [seed, 3], 0.0, 1.0, DType::F64).unwrap()
}

fn positive(x: &Tensor) -> Result<Tensor> {
    let total = x.reduce_sum(Axes::All, false)?;
    total.greater(&total.scalar_like(0.0)?)
}

/// y = cond(sum(x) > 0, x³·w, sin(x)·w), with dy/dx and dy/dw from a tape inside.
fn cond_step(args: &[Tensor]) -> Result<Vec<Tensor>> {
    let (x, w) = (&args[0], &args[1]);
    let tape = GradientTape::new();
    tape.watch(x);
    tape.watch(w);
    let y = cond(
        &positive(x)?,
        || Ok(vec![x.mul(x)?.mul(x)?.mul(w)?]),
        || Ok(vec![x.sin()?.mul(w)?]),
    )?;
    let loss = y[0].reduce_sum(Axes::All, false)?;
    let g = tape.gradient(&loss, &[x.into(), w.into()])?;
    Ok(vec![
        y[0].clone(),
        g[0].clone().expect("dx"),
        g[1].clone().expect("dw"),
    ])
}

#[test]
fn cond_picks_the_branch_per_call_with_gradients_from_a_tape_inside() {
    ferroflow::init();
    let f = Function::new(cond_step);
    let w = f64s(&[3], 1);
    for (i, sign) in [1.0, -1.0, -1.0, 1.0].into_iter().enumerate() {
        let x = f64s(&[3], 10 + i as u64).abs().unwrap();
        let x = x.mul(&x.scalar_like(sign).unwrap()).unwrap();
        let traced = f.call(&[x.clone(), w.clone()]).unwrap();
        let eager = cond_step(&[x, w.clone()]).unwrap();
        for (t, e) in traced.iter().zip(&eager) {
            assert_eq!(bits(t), bits(e), "call {i} (sign {sign})");
        }
    }
    assert_eq!(f.tracing_count(), 1);
    let graph = f
        .get_concrete_function(&[f64s(&[3], 1), w.clone()])
        .unwrap();
    let conds = graph
        .graph()
        .nodes
        .iter()
        .filter(|n| matches!(n.kind, NodeKind::Cond(_)))
        .count();
    // The forward cond and its gradient, itself a cond over the branches' gradients.
    assert_eq!(conds, 2, "{}", graph.graph().listing());
}

#[test]
fn a_tape_outside_differentiates_the_replayed_cond_to_second_order() {
    ferroflow::init();
    // y = cond(x > 0, x³, x²): dy/dx = 3x² or 2x, d²y/dx² = 6x or 2.
    let f = Function::new(|a: &[Tensor]| {
        let x = &a[0];
        cond(
            &x.greater(&x.scalar_like(0.0)?)?,
            || Ok(vec![x.mul(x)?.mul(x)?]),
            || Ok(vec![x.mul(x)?]),
        )
    });
    for (i, x0) in [1.5f64, -2.0, 0.5, -0.25].into_iter().enumerate() {
        let x = Tensor::scalar(x0).unwrap();
        let outer = GradientTape::new();
        outer.watch(&x);
        let inner = GradientTape::new();
        inner.watch(&x);
        let y = f.call(std::slice::from_ref(&x)).unwrap();
        let dy = inner.gradient(&y[0], &[(&x).into()]).unwrap()[0]
            .clone()
            .unwrap();
        let d2y = outer.gradient(&dy, &[(&x).into()]).unwrap()[0]
            .clone()
            .unwrap();
        let (want_dy, want_d2y) = if x0 > 0.0 {
            (3.0 * x0 * x0, 6.0 * x0)
        } else {
            (2.0 * x0, 2.0)
        };
        assert_eq!(dy.item::<f64>().unwrap(), want_dy, "call {i}");
        assert_eq!(d2y.item::<f64>().unwrap(), want_d2y, "call {i}");
    }
    assert_eq!(f.tracing_count(), 1);
}

#[test]
fn second_order_gradients_of_a_cond_inside_the_function() {
    ferroflow::init();
    let body = |a: &[Tensor]| -> Result<Vec<Tensor>> {
        let x = &a[0];
        let outer = GradientTape::new();
        outer.watch(x);
        let inner = GradientTape::new();
        inner.watch(x);
        let y = cond(
            &x.greater(&x.scalar_like(0.0)?)?,
            || Ok(vec![x.mul(x)?.mul(x)?.sin()?]),
            || Ok(vec![x.mul(x)?.exp()?]),
        )?;
        let dy = inner.gradient(&y[0], &[x.into()])?[0].clone().expect("dy");
        let d2y = outer.gradient(&dy, &[x.into()])?[0].clone().expect("d2y");
        Ok(vec![y[0].clone(), dy, d2y])
    };
    let f = Function::new(body);
    for x0 in [0.7f64, -0.3, 1.1, -1.2] {
        let x = Tensor::scalar(x0).unwrap();
        let traced = f.call(std::slice::from_ref(&x)).unwrap();
        let eager = body(std::slice::from_ref(&x)).unwrap();
        for (t, e) in traced.iter().zip(&eager) {
            assert_eq!(bits(t), bits(e), "x = {x0}");
        }
    }
    assert_eq!(f.tracing_count(), 1);
}

#[test]
fn only_the_taken_branch_writes_its_variables() {
    ferroflow::init();
    let counter = Variable::new("counter", Tensor::scalar(0.0f32).unwrap());
    let f = Function::new(|a: &[Tensor]| {
        let one = Tensor::scalar(1.0f32)?;
        cond(
            &a[0],
            || {
                counter.assign_add(&one)?;
                Ok(vec![counter.value()])
            },
            || {
                counter.assign_add(&one.scalar_like(10.0)?)?;
                Ok(vec![counter.value()])
            },
        )
    });
    let mut want = 0.0;
    for (i, p) in [true, false, true, true, false].into_iter().enumerate() {
        let y = f.call(&[Tensor::scalar(p).unwrap()]).unwrap();
        want += if p { 1.0 } else { 10.0 };
        assert_eq!(counter.value().item::<f32>().unwrap(), want, "call {i}");
        assert_eq!(
            y[0].item::<f32>().unwrap(),
            want,
            "call {i}: read after write"
        );
    }
    assert_eq!(f.tracing_count(), 1);
}

#[test]
fn variables_read_in_a_branch_get_gradients_from_a_tape_inside() {
    ferroflow::init();
    let w = Variable::new("w", f64s(&[4], 5));
    let body = |a: &[Tensor]| -> Result<Vec<Tensor>> {
        let x = &a[0];
        let tape = GradientTape::new();
        let y = cond(
            &positive(x)?,
            || Ok(vec![x.mul(&w.value())?.tanh()?]),
            || Ok(vec![x.add(&w.value())?.square()?]),
        )?;
        let loss = y[0].reduce_sum(Axes::All, false)?;
        let g = tape.gradient(&loss, &[(&w).into()])?;
        Ok(vec![g[0].clone().expect("a gradient for w")])
    };
    let f = Function::new(body);
    for seed in 0..4 {
        let x = f64s(&[4], 20 + seed);
        let traced = f.call(std::slice::from_ref(&x)).unwrap();
        let eager = body(std::slice::from_ref(&x)).unwrap();
        assert_eq!(bits(&traced[0]), bits(&eager[0]), "seed {seed}");
    }
}

/// (x, i) → (x·w + sin(x), i + 1) while i < n; dx and dw from a tape inside.
fn loop_step(args: &[Tensor]) -> Result<Vec<Tensor>> {
    let (x, w, n) = (&args[0], &args[1], &args[2]);
    let tape = GradientTape::new();
    tape.watch(x);
    tape.watch(w);
    let out = while_loop(
        |v| v[1].less(n),
        |v| {
            Ok(vec![
                v[0].mul(w)?.add(&v[0].sin()?)?,
                v[1].add(&v[1].ones_like()?)?,
            ])
        },
        &[x.clone(), Tensor::scalar(0i32)?],
    )?;
    let loss = out[0].reduce_sum(Axes::All, false)?;
    // Zero iterations leave w unused: eagerly its gradient is None, a traced loop (which
    // cannot know) gives zeros, as in TF.
    let g = tape.gradient_with(
        &[loss],
        &[x.into(), w.into()],
        None,
        UnconnectedGradients::Zero,
    )?;
    Ok(vec![
        out[0].clone(),
        out[1].clone(),
        g[0].clone().expect("dx"),
        g[1].clone().expect("dw"),
    ])
}

#[test]
fn while_loop_runs_as_many_iterations_as_each_call_needs_with_gradients() {
    ferroflow::init();
    let f = Function::new(loop_step);
    let w = f64s(&[3], 2).mul(&Tensor::scalar(0.5f64).unwrap()).unwrap();
    for (i, n) in [3i32, 0, 5, 1].into_iter().enumerate() {
        let args = [
            f64s(&[3], 30 + i as u64),
            w.clone(),
            Tensor::scalar(n).unwrap(),
        ];
        let traced = f.call(&args).unwrap();
        let eager = loop_step(&args).unwrap();
        assert_eq!(traced[1].item::<i32>().unwrap(), n, "call {i}: iterations");
        for (t, e) in traced.iter().zip(&eager) {
            assert_eq!(bits(t), bits(e), "call {i} ({n} iterations)");
        }
    }
    assert_eq!(f.tracing_count(), 1);
}

#[test]
fn a_tape_outside_differentiates_a_replayed_while_loop() {
    ferroflow::init();
    // x squared n times: x^(2^n), d/dx = 2^n x^(2^n - 1).
    let f = Function::new(|a: &[Tensor]| {
        let n = a[1].clone();
        let out = while_loop(
            |v| v[1].less(&n),
            |v| Ok(vec![v[0].mul(&v[0])?, v[1].add(&v[1].ones_like()?)?]),
            &[a[0].clone(), Tensor::scalar(0i32)?],
        )?;
        Ok(vec![out[0].clone()])
    });
    for n in [2i32, 3, 0] {
        let x = Tensor::scalar(1.1f64).unwrap();
        let tape = GradientTape::new();
        tape.watch(&x);
        let y = f.call(&[x.clone(), Tensor::scalar(n).unwrap()]).unwrap();
        let g = tape.gradient(&y[0], &[(&x).into()]).unwrap()[0]
            .clone()
            .unwrap();
        let p = 2f64.powi(n);
        let want = p * 1.1f64.powf(p - 1.0);
        let got = g.item::<f64>().unwrap();
        assert!(
            (got - want).abs() <= 1e-12 * want,
            "n = {n}: {got} vs {want}"
        );
    }
    assert_eq!(f.tracing_count(), 1);
}

#[test]
fn nested_control_flow_and_maximum_iterations() {
    ferroflow::init();
    // Collatz steps from a start value, at most `cap` of them: a cond inside a loop body.
    let body = |a: &[Tensor]| -> Result<Vec<Tensor>> {
        let two = Tensor::scalar(2i64)?;
        let one = Tensor::scalar(1i64)?;
        while_loop_with(
            |v| v[0].greater(&one),
            |v| {
                let odd = v[0].floormod(&two)?.equal(&one)?;
                let next = cond(
                    &odd,
                    || Ok(vec![v[0].mul(&one.scalar_like(3.0)?)?.add(&one)?]),
                    || Ok(vec![v[0].floordiv(&two)?]),
                )?;
                Ok(vec![next[0].clone(), v[1].add(&one)?])
            },
            &[a[0].clone(), Tensor::scalar(0i64)?],
            Some(100),
        )
    };
    let f = Function::new(body);
    for start in [27i64, 6, 1, 97] {
        let x = Tensor::scalar(start).unwrap();
        let traced = f.call(std::slice::from_ref(&x)).unwrap();
        let eager = body(std::slice::from_ref(&x)).unwrap();
        let (mut v, mut steps) = (start, 0);
        while v > 1 && steps < 100 {
            v = if v % 2 == 1 { 3 * v + 1 } else { v / 2 };
            steps += 1;
        }
        assert_eq!(traced[0].item::<i64>().unwrap(), v, "start {start}");
        assert_eq!(traced[1].item::<i64>().unwrap(), steps, "start {start}");
        assert_eq!(eager[1].item::<i64>().unwrap(), steps, "start {start}");
    }
    assert_eq!(f.tracing_count(), 1);
}

#[test]
fn a_function_called_inside_another_keeps_its_control_flow() {
    ferroflow::init();
    let inner = Function::new(|a: &[Tensor]| {
        let x = &a[0];
        cond(&positive(x)?, || Ok(vec![x.exp()?]), || Ok(vec![x.neg()?]))
    });
    let outer = Function::new(|a: &[Tensor]| {
        let y = inner.call(a)?;
        Ok(vec![y[0].add(&y[0])?])
    });
    for sign in [1.0f64, -1.0, 1.0] {
        let x = f64s(&[2], 4)
            .abs()
            .unwrap()
            .mul(&Tensor::scalar(sign).unwrap())
            .unwrap();
        let y = outer.call(std::slice::from_ref(&x)).unwrap();
        let branch = if sign > 0.0 { x.exp() } else { x.neg() }.unwrap();
        assert_eq!(
            bits(&y[0]),
            bits(&branch.add(&branch).unwrap()),
            "sign {sign}"
        );
    }
    assert_eq!(outer.tracing_count(), 1);
}

#[test]
fn traced_control_flow_errors_name_the_problem() {
    ferroflow::init();
    let x = f64s(&[3], 9);
    let mismatched = Function::new(|a: &[Tensor]| {
        cond(
            &positive(&a[0])?,
            || Ok(vec![a[0].clone()]),
            || Ok(vec![a[0].reduce_sum(Axes::All, false)?]),
        )
    });
    let e = mismatched.call(std::slice::from_ref(&x)).unwrap_err();
    assert!(
        matches!(&e, Error::InvalidArgument { msg, .. } if msg.contains("output 0") && msg.contains("same shapes")),
        "{e}"
    );
    let not_bool = Function::new(|a: &[Tensor]| cond(&a[0], || Ok(vec![]), || Ok(vec![])));
    let e = not_bool.call(std::slice::from_ref(&x)).unwrap_err();
    assert!(e.to_string().contains("scalar bool"), "{e}");
    let growing = Function::new(|a: &[Tensor]| {
        while_loop(
            |v| Tensor::scalar(v[0].rank() < 3),
            |v| Ok(vec![v[0].expand_dims(0)?]),
            a,
        )
    });
    let e = growing.call(std::slice::from_ref(&x)).unwrap_err();
    assert!(
        e.to_string().contains("loop variable 0") && e.to_string().contains("shape"),
        "{e}"
    );
    // Eagerly the same loop is a Rust loop: shapes may change.
    let grown = while_loop(
        |v| Tensor::scalar(v[0].rank() < 3),
        |v| Ok(vec![v[0].expand_dims(0)?]),
        std::slice::from_ref(&x),
    )
    .unwrap();
    assert_eq!(grown[0].shape(), &[1, 1, 3]);
}

#[test]
fn a_gradient_through_a_traced_branch_that_draws_random_numbers_is_refused() {
    ferroflow::init();
    // Dropout-like noise inside a branch: the gradient would recompute other numbers.
    let f = Function::new(|a: &[Tensor]| {
        let x = &a[0];
        let tape = GradientTape::new();
        tape.watch(x);
        let y = cond(
            &positive(x)?,
            || {
                Ok(vec![x.mul(&random::uniform(
                    x.shape(),
                    0.0,
                    1.0,
                    DType::F64,
                    None,
                )?)?])
            },
            || Ok(vec![x.neg()?]),
        )?;
        let g = tape.gradient(&y[0].reduce_sum(Axes::All, false)?, &[x.into()])?;
        Ok(vec![g[0].clone().expect("dx")])
    });
    let e = f.call(&[f64s(&[3], 1).abs().unwrap()]).unwrap_err();
    assert!(
        matches!(&e, Error::NotTraceable { op: "cond", msg } if msg.contains("random")),
        "{e}"
    );
    // The same numbers drawn outside the cond and passed in: fine.
    let g = Function::new(|a: &[Tensor]| {
        let x = &a[0];
        let noise = random::uniform(x.shape(), 0.0, 1.0, DType::F64, None)?;
        let tape = GradientTape::new();
        tape.watch(x);
        let y = cond(
            &positive(x)?,
            || Ok(vec![x.mul(&noise)?]),
            || Ok(vec![x.neg()?]),
        )?;
        let d = tape.gradient(&y[0].reduce_sum(Axes::All, false)?, &[x.into()])?;
        Ok(vec![noise, d[0].clone().expect("dx")])
    });
    for _ in 0..2 {
        let out = g.call(&[f64s(&[3], 1).abs().unwrap()]).unwrap();
        assert_eq!(bits(&out[0]), bits(&out[1]), "d(x·noise)/dx = noise");
    }
}
