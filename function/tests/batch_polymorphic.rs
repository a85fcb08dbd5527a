//! Batch-polymorphic graphs: one trace-fitted template runs at every batch size, saved as
//! JSON and loaded back without the closure, bit for bit with the closure run eagerly; what
//! a template cannot hold is refused with an error naming it.

use ferroflow::autodiff::GradientTape;
use ferroflow::function::{BatchPolymorphicFunction, TensorSpec};
use ferroflow::{random, DType, Error, Result, Tensor, Variable};
use proptest::prelude::*;

mod common;
use common::bits;

fn normal(shape: &[usize], seed: u64) -> Tensor {
    random::stateless_normal(shape, [seed, 11], 0.0, 1.0, DType::F32).unwrap()
}

fn spec(shape: &[Option<usize>]) -> TensorSpec {
    TensorSpec::new(shape, DType::F32)
}

/// One step of a random program on a `[batch, 4]` value: each keeps the shape, several go
/// through shapes that depend on the batch size (reshape, transpose, split, concat).
fn step(code: u8, v: &Tensor, x: &Tensor, w: &Tensor, m: &Tensor) -> Result<Tensor> {
    Ok(match code % 10 {
        0 => v.add(w)?,
        1 => v.mul(x)?,
        2 => v.tanh()?,
        3 => v.matmul(m)?,
        4 => v.softmax(-1)?,
        5 => v.cumsum(-1, false, false)?,
        6 => v
            .reshape(&[-1, 2, 2])?
            .transpose(&[0, 2, 1])?
            .reshape(&[-1, 4])?,
        7 => v.sub(&v.reduce_mean(-1, true)?)?,
        8 => v.gelu()?,
        _ => {
            let halves = v.split(&[2, 2], -1)?;
            Tensor::concat(&[halves[1].clone(), halves[0].clone()], -1)?
        }
    })
}

fn program(codes: &[u8], x: &Tensor, w: &Tensor, m: &Tensor) -> Result<Vec<Tensor>> {
    let mut v = x.clone();
    for &c in codes {
        v = step(c, &v, x, w, m)?;
    }
    let total = v.reduce_sum(-1, false)?;
    Ok(vec![v, total])
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 24, failure_persistence: None, ..ProptestConfig::default() })]

    /// A random program, traced once and loaded from its JSON, against the closure run
    /// eagerly at batch sizes it was never traced at: the same values, bit for bit.
    #[test]
    fn loaded_graph_matches_the_closure_at_every_batch_size(
        codes in proptest::collection::vec(0u8..10, 1..8),
        batches in proptest::collection::vec(1usize..40, 1..4),
        seed in 0u64..1000,
    ) {
        ferroflow::init();
        let (w, m) = (normal(&[4], seed), normal(&[4, 4], seed + 1));
        let f = {
            let (w, m, codes) = (w.clone(), m.clone(), codes.clone());
            BatchPolymorphicFunction::trace(vec![spec(&[None, Some(4)])], move |a: &[Tensor]| {
                program(&codes, &a[0], &w, &m)
            })
            .unwrap()
        };
        let json = serde_json::to_string(&f.to_json().unwrap()).unwrap();
        let loaded = BatchPolymorphicFunction::from_json(&serde_json::from_str(&json).unwrap()).unwrap();
        for (k, &b) in batches.iter().enumerate() {
            let x = normal(&[b, 4], seed + 10 + k as u64);
            let want = program(&codes, &x, &w, &m).unwrap();
            for got in [f.call(std::slice::from_ref(&x)).unwrap(), loaded.call(std::slice::from_ref(&x)).unwrap()] {
                prop_assert_eq!(got.len(), 2);
                for (g, e) in got.iter().zip(&want) {
                    prop_assert_eq!(g.shape(), e.shape());
                    prop_assert_eq!(bits(g), bits(e), "codes {:?} at batch {}", &codes, b);
                }
            }
        }
    }
}

/// A tape around a call of the loaded graph gives the closure's gradients.
#[test]
fn gradients_through_a_loaded_graph() {
    ferroflow::init();
    let m = normal(&[4, 3], 1);
    let f = {
        let m = m.clone();
        BatchPolymorphicFunction::trace(
            vec![spec(&[None, Some(4)]), spec(&[None])],
            move |a: &[Tensor]| {
                let h = a[0].matmul(&m)?.tanh()?;
                Ok(vec![h.mul(&a[1].reshape(&[-1, 1])?)?])
            },
        )
        .unwrap()
    };
    let loaded = BatchPolymorphicFunction::from_json(&f.to_json().unwrap()).unwrap();
    let (x, s) = (normal(&[6, 4], 2), normal(&[6], 3));
    let gradient = |run: &dyn Fn(&[Tensor]) -> Result<Vec<Tensor>>| {
        let tape = GradientTape::new();
        tape.watch(&x);
        tape.watch(&s);
        let y = run(&[x.clone(), s.clone()]).unwrap();
        let loss = y[0]
            .square()
            .unwrap()
            .reduce_sum(Vec::<isize>::new(), false)
            .unwrap();
        tape.gradient(&loss, &[(&x).into(), (&s).into()])
            .unwrap()
            .into_iter()
            .map(|g| g.unwrap().to_vec::<f32>().unwrap())
            .collect::<Vec<_>>()
    };
    let eager = gradient(&|a: &[Tensor]| {
        let h = a[0].matmul(&m)?.tanh()?;
        Ok(vec![h.mul(&a[1].reshape(&[-1, 1])?)?])
    });
    let graph = gradient(&|a: &[Tensor]| loaded.call(a));
    for (g, e) in graph.iter().zip(&eager) {
        assert_eq!(g.len(), e.len());
        for (a, b) in g.iter().zip(e) {
            assert!((a - b).abs() <= 1e-6 * (1.0 + b.abs()), "{a} vs {b}");
        }
    }
}

fn refused(result: Result<BatchPolymorphicFunction>) -> String {
    match result {
        Err(e @ Error::InvalidArgument { .. }) => e.to_string(),
        Err(other) => panic!("expected InvalidArgument, got {other:?}"),
        Ok(f) => panic!("expected an error, got {f:?}"),
    }
}

#[test]
fn what_a_template_cannot_hold_is_refused_by_name() {
    ferroflow::init();
    let one = vec![spec(&[None, Some(4)])];
    // A variable: weights belong to layers.
    let v = Variable::new("scale", normal(&[4], 5));
    let msg = refused(BatchPolymorphicFunction::trace(
        one.clone(),
        |a: &[Tensor]| Ok(vec![a[0].mul(&v.value())?]),
    ));
    assert!(msg.contains("\"scale\""), "{msg}");
    // Structure that changes with the batch size.
    let msg = refused(BatchPolymorphicFunction::trace(
        one.clone(),
        |a: &[Tensor]| {
            let x = &a[0];
            Ok(vec![if x.shape()[0].is_multiple_of(2) {
                x.exp()?
            } else {
                x.tanh()?
            }])
        },
    ));
    assert!(msg.contains("changes with the batch size"), "{msg}");
    // A shape quadratic in the batch size: fits 2 and 3, not 5.
    let msg = refused(BatchPolymorphicFunction::trace(
        one.clone(),
        |a: &[Tensor]| {
            let x = &a[0];
            Ok(vec![x.matmul(&x.t()?)?.reshape(&[-1])?])
        },
    ));
    assert!(msg.contains("other than linearly"), "{msg}");
    // A constant whose value is the batch size.
    let msg = refused(BatchPolymorphicFunction::trace(one, |a: &[Tensor]| {
        let n = Tensor::scalar(a[0].shape()[0] as f32)?;
        Ok(vec![a[0].div(&n)?])
    }));
    assert!(msg.contains("depends on the batch size"), "{msg}");
}

#[test]
fn bad_arguments_and_damaged_json_are_errors() {
    ferroflow::init();
    let f = BatchPolymorphicFunction::trace(
        vec![spec(&[None, Some(2)]), spec(&[None])],
        |a: &[Tensor]| Ok(vec![a[0].reduce_sum(-1, false)?.add(&a[1])?]),
    )
    .unwrap();
    let e = f
        .call(&[
            Tensor::ones(&[3, 2], DType::F32).unwrap(),
            Tensor::ones(&[4], DType::F32).unwrap(),
        ])
        .unwrap_err();
    assert!(e.to_string().contains("batch size 4"), "{e}");
    let e = f
        .call(&[
            Tensor::ones(&[3, 2], DType::F64).unwrap(),
            Tensor::ones(&[3], DType::F32).unwrap(),
        ])
        .unwrap_err();
    assert!(e.to_string().contains("argument 0"), "{e}");
    let good = f.to_json().unwrap();
    let damaged = |edit: &dyn Fn(&mut serde_json::Value)| {
        let mut v = good.clone();
        edit(&mut v);
        match BatchPolymorphicFunction::from_json(&v) {
            Err(e @ Error::Format { .. }) => e.to_string(),
            other => panic!("expected a format error, got {other:?}"),
        }
    };
    assert!(damaged(&|v| v["data"] = "%%%".into()).contains("base64"));
    assert!(damaged(&|v| v["format"] = 99.into()).contains("format 99"));
    assert!(
        damaged(&|v| v["batch_terms"][0]["path"] = "/graph/nowhere".into())
            .contains("/graph/nowhere")
    );
    assert!(damaged(&|v| v["graph"]["graph"]["outputs"][0]["node"] = 999.into()).contains("%999"));
}
