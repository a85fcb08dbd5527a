//! Host calls (TF's `tf.numpy_function`) inside graph functions: one node, called again on
//! every replay, kept and ordered as an effect, refused where a graph cannot hold it.

use ferroflow::autodiff::{GradientTape, Source};
use ferroflow::function::{cond, vectorized_map, Function, HostCall, NodeKind};
use ferroflow::{Error, Tensor, Variable};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;

/// A host call that counts its calls and returns `x · 2 + calls so far`.
fn counting(calls: &Arc<AtomicUsize>) -> HostCall {
    let calls = calls.clone();
    HostCall::new("count_and_double", move |xs: &[Tensor]| {
        let n = calls.fetch_add(1, Ordering::SeqCst) + 1;
        Ok(vec![xs[0]
            .add(&xs[0])?
            .add(&xs[0].scalar_like(n as f64)?)?])
    })
}

fn host_calls(f: &Function<'_>, args: &[Tensor]) -> usize {
    let c = f.get_concrete_function(args).unwrap();
    c.graph()
        .nodes
        .iter()
        .filter(|n| matches!(n.kind, NodeKind::HostCall(_)))
        .count()
}

#[test]
fn a_host_call_runs_on_every_call_with_that_calls_inputs() {
    ferroflow::init();
    let calls = Arc::new(AtomicUsize::new(0));
    let call = counting(&calls);
    let f = Function::new(|a: &[Tensor]| {
        let y = call.call(&[a[0].mul(&a[0])?])?.remove(0);
        Ok(vec![y.add(&a[0])?])
    });
    for (i, x) in [1.0f32, 2.0, -3.0, 0.5].into_iter().enumerate() {
        let out = f.call(&[Tensor::scalar(x).unwrap()]).unwrap().remove(0);
        // x² · 2 + calls + x, with this call's x and count.
        let want = x * x * 2.0 + (i + 1) as f32 + x;
        assert_eq!(out.item::<f32>().unwrap(), want, "call {i}");
    }
    assert_eq!(f.tracing_count(), 1, "one trace, replayed after");
    assert_eq!(
        calls.load(Ordering::SeqCst),
        4,
        "once per call, the trace included"
    );
    assert_eq!(host_calls(&f, &[Tensor::scalar(1.0f32).unwrap()]), 1);
}

#[test]
fn equal_host_calls_are_not_merged_and_unused_ones_still_run() {
    ferroflow::init();
    let calls = Arc::new(AtomicUsize::new(0));
    let call = counting(&calls);
    let f = Function::new(|a: &[Tensor]| {
        let first = call.call(std::slice::from_ref(&a[0]))?.remove(0);
        let _unused = call.call(std::slice::from_ref(&a[0]))?;
        let third = call.call(std::slice::from_ref(&a[0]))?.remove(0);
        Ok(vec![first, third])
    });
    let x = Tensor::scalar(10.0f32).unwrap();
    for round in 0..3usize {
        let out = f.call(std::slice::from_ref(&x)).unwrap();
        let base = 3 * round;
        assert_eq!(out[0].item::<f32>().unwrap(), 20.0 + (base + 1) as f32);
        assert_eq!(out[1].item::<f32>().unwrap(), 20.0 + (base + 3) as f32);
    }
    assert_eq!(calls.load(Ordering::SeqCst), 9);
    assert_eq!(host_calls(&f, std::slice::from_ref(&x)), 3);
}

#[test]
fn reads_after_a_host_call_see_its_writes() {
    ferroflow::init();
    let v = Variable::new("counter", Tensor::scalar(0.0f32).unwrap());
    let bump = {
        let v = v.clone();
        HostCall::new("bump", move |_: &[Tensor]| {
            v.assign_add(&Tensor::scalar(1.0f32)?)?;
            Ok(vec![])
        })
    };
    let f = Function::new(|_: &[Tensor]| {
        let before = v.value();
        bump.call(&[])?;
        let after = v.value();
        Ok(vec![before, after])
    });
    for i in 0..4 {
        let out = f.call(&[]).unwrap();
        assert_eq!(out[0].item::<f32>().unwrap(), i as f32);
        assert_eq!(out[1].item::<f32>().unwrap(), (i + 1) as f32);
    }
    assert_eq!(v.peek().item::<f32>().unwrap(), 4.0);
}

#[test]
fn host_call_outputs_carry_no_gradient_eagerly_or_traced() {
    ferroflow::init();
    let double = HostCall::new("double", |xs: &[Tensor]| Ok(vec![xs[0].add(&xs[0])?]));
    let w = Variable::new("w", Tensor::scalar(3.0f32).unwrap());
    let step = |_: &[Tensor]| -> ferroflow::Result<Vec<Tensor>> {
        let tape = GradientTape::new();
        let x = w.value();
        let y = double.call(std::slice::from_ref(&x))?.remove(0);
        let loss = y.mul(&x)?; // the host call's branch adds nothing
        let g = tape.gradient(&loss, &[Source::from(&w)])?.remove(0);
        Ok(vec![g.ok_or_else(|| Error::invalid("test", "no gradient"))?])
    };
    let eager = step(&[]).unwrap().remove(0).item::<f32>().unwrap();
    let f = Function::new(step);
    let traced = f.call(&[]).unwrap().remove(0).item::<f32>().unwrap();
    let replayed = f.call(&[]).unwrap().remove(0).item::<f32>().unwrap();
    assert_eq!(eager, 6.0, "d(y·x)/dx with y held constant is y = 2x");
    assert_eq!(traced, eager);
    assert_eq!(replayed, eager);
}

#[test]
fn where_a_graph_cannot_hold_a_host_call_it_is_refused_by_name() {
    ferroflow::init();
    let calls = Arc::new(AtomicUsize::new(0));
    let call = counting(&calls);
    // Inside a traced cond branch.
    let f = Function::new(|a: &[Tensor]| {
        let pred = a[0].greater(&a[0].scalar_like(0.0)?)?;
        cond(
            &pred,
            || call.call(std::slice::from_ref(&a[0])),
            || Ok(vec![a[0].clone()]),
        )
    });
    match f.call(&[Tensor::scalar(1.0f32).unwrap()]) {
        Err(Error::NotTraceable { op, msg }) => {
            assert_eq!(op, "host_call");
            assert!(
                msg.contains("count_and_double") && msg.contains("branch"),
                "{msg}"
            );
        }
        other => panic!("expected NotTraceable, got {other:?}"),
    }
    // In a graph file.
    let g = Function::new(|a: &[Tensor]| call.call(std::slice::from_ref(&a[0])));
    let c = g
        .get_concrete_function(&[Tensor::scalar(1.0f32).unwrap()])
        .unwrap();
    let path = std::env::temp_dir().join(format!(
        "ferroflow-host-call-{}.ffgraph",
        std::process::id()
    ));
    let err = c.save(&path).unwrap_err().to_string();
    assert!(!path.exists(), "a refused save writes nothing");
    assert!(
        err.contains("host call") && err.contains("count_and_double"),
        "{err}"
    );
    // Under vectorized_map.
    let xs = Tensor::from_vec(vec![1.0f32, 2.0, 3.0], &[3]).unwrap();
    let err = vectorized_map(|a| call.call(a), &[xs])
        .unwrap_err()
        .to_string();
    assert!(err.contains("host call"), "{err}");
}

#[test]
fn numpy_linalg_in_a_function_is_a_host_call_computed_on_every_call() {
    use ferroflow::numpy::linalg;
    ferroflow::init();
    // inv(a) @ b, a diagonally dominant (invertible), new values on every call.
    let f = Function::new(|a: &[Tensor]| Ok(vec![linalg::inv(&a[0])?.matmul(&a[1])?]));
    let inputs = |seed: u64| {
        let a = ferroflow::random::stateless_normal(
            &[2, 3, 3],
            [seed, 1],
            0.0,
            1.0,
            ferroflow::DType::F64,
        )
        .unwrap()
        .add(
            &Tensor::eye(3, 3, ferroflow::DType::F64)
                .unwrap()
                .mul(&Tensor::scalar(4.0f64).unwrap())
                .unwrap(),
        )
        .unwrap();
        let b = ferroflow::random::stateless_normal(
            &[2, 3, 2],
            [seed, 2],
            0.0,
            1.0,
            ferroflow::DType::F64,
        )
        .unwrap();
        (a, b)
    };
    for seed in 0..4 {
        let (a, b) = inputs(seed);
        let traced = f.call(&[a.clone(), b.clone()]).unwrap().remove(0);
        let eager = linalg::inv(&a).unwrap().matmul(&b).unwrap();
        assert_eq!(
            traced.to_vec::<f64>().unwrap(),
            eager.to_vec::<f64>().unwrap(),
            "call {seed}"
        );
    }
    assert_eq!(f.tracing_count(), 1);
    let (a, b) = inputs(0);
    assert_eq!(host_calls(&f, &[a, b]), 1);
}
