//! `vectorized_map` against the loop it replaces (the function on each example, stacked):
//! random programs over the batching rules, per-example gradients, jacobians, the
//! per-example fallback, gradients through the batched ops, and the errors.

use ferroflow::autodiff::{GradientTape, Source};
use ferroflow::function::{
    batch_jacobian, cond, jacobian, vectorized_map, vectorized_map_with, Function,
};
use ferroflow::{random, Axes, BinaryOp, DType, Error, Padding, Result, Tensor, UnaryOp, Variable};
use proptest::prelude::*;

fn f64s(shape: &[usize], seed: u64) -> Tensor {
    random::stateless_normal(shape, [seed, 11], 0.0, 1.0, DType::F64).unwrap()
}

/// The loop `vectorized_map` replaces: `f` on each example, results stacked.
fn looped(f: &dyn Fn(&[Tensor]) -> Result<Vec<Tensor>>, elems: &[Tensor]) -> Result<Vec<Tensor>> {
    let batch = elems[0].shape()[0];
    let mut outs: Vec<Vec<Tensor>> = Vec::new();
    for b in 0..batch {
        let example: Vec<Tensor> = elems
            .iter()
            .map(|e| e.gather(&Tensor::scalar(b as i32)?, 0))
            .collect::<Result<_>>()?;
        let ys = f(&example)?;
        outs.resize(ys.len(), Vec::new());
        for (k, y) in ys.into_iter().enumerate() {
            outs[k].push(y);
        }
    }
    outs.iter().map(|ys| Tensor::stack(ys, 0)).collect()
}

fn assert_close(got: &Tensor, want: &Tensor, what: &str) {
    assert_eq!(got.shape(), want.shape(), "{what}: shape");
    assert_eq!(got.dtype(), want.dtype(), "{what}: dtype");
    let (g, w) = (
        got.cast(DType::F64).unwrap().to_vec::<f64>().unwrap(),
        want.cast(DType::F64).unwrap().to_vec::<f64>().unwrap(),
    );
    for (i, (a, b)) in g.iter().zip(&w).enumerate() {
        assert!(
            (a - b).abs() <= 1e-12 * (1.0 + b.abs()) || (a.is_nan() && b.is_nan()),
            "{what}: element {i}: {a} vs {b}"
        );
    }
}

/// One step of a random per-example program on a value of shape [m, k].
#[derive(Debug, Clone)]
enum Step {
    Unary(usize),
    /// With an invariant operand broadcast from [k], [m, k], [m, 1] or a scalar.
    BinaryInvariant(usize, usize, u64),
    /// With the example's other input.
    BinaryOther(usize),
    /// Reduce over axis 0 or 1, keeping it (the shape stays [m, k] after a broadcast back).
    ReduceKeep(usize),
    /// Matmul by an invariant [k, k] (transposed or not).
    MatMul(bool, u64),
    /// x · xᵀ · x: matmuls of batched values.
    Gram,
    /// Transpose twice around a unary op; reshape to [m·k] and back.
    Shuffle(usize),
    /// Cumulative sum along an axis.
    Cumsum(usize),
    /// A strided slice padded back to shape.
    SlicePad,
}

const UNARY: [UnaryOp; 5] = [
    UnaryOp::Tanh,
    UnaryOp::Sin,
    UnaryOp::Sigmoid,
    UnaryOp::Abs,
    UnaryOp::Neg,
];
const BINARY: [BinaryOp; 4] = [
    BinaryOp::Add,
    BinaryOp::Mul,
    BinaryOp::Sub,
    BinaryOp::Maximum,
];

fn run_program(x: &Tensor, other: &Tensor, program: &[Step]) -> Result<Tensor> {
    let (m, k) = (x.shape()[0], x.shape()[1]);
    let mut v = x.clone();
    for step in program {
        v = match *step {
            Step::Unary(u) => v.unary(UNARY[u])?,
            Step::BinaryInvariant(b, form, seed) => {
                let shape: Vec<usize> = match form {
                    0 => vec![k],
                    1 => vec![m, k],
                    2 => vec![m, 1],
                    _ => vec![],
                };
                v.binary(BINARY[b], &f64s(&shape, seed))?
            }
            Step::BinaryOther(b) => other.binary(BINARY[b], &v)?,
            Step::ReduceKeep(axis) => {
                let r = v.reduce_sum(Axes::List(vec![axis as isize]), true)?;
                v.sub(&r.div(&r.scalar_like(4.0)?)?)?
            }
            Step::MatMul(t, seed) => v.matmul_t(&f64s(&[k, k], seed), false, t)?,
            Step::Gram => v.matmul_t(&v, false, true)?.tanh()?.matmul(&v)?,
            Step::Shuffle(u) => v
                .transpose(&[1, 0])?
                .unary(UNARY[u])?
                .transpose(&[1, 0])?
                .reshape_to(&[m * k])?
                .reshape_to(&[m, k])?,
            Step::Cumsum(axis) => v.cumsum(axis as isize, false, false)?,
            Step::SlicePad => v
                .slice(&[0, 0], &[m as isize, k as isize - 1])?
                .pad(&[(0, 0), (1, 0)], 0.5)?,
        };
    }
    Ok(v)
}

fn step() -> impl Strategy<Value = Step> {
    prop_oneof![
        (0..5usize).prop_map(Step::Unary),
        (0..4usize, 0..4usize, 0..1000u64).prop_map(|(b, f, s)| Step::BinaryInvariant(b, f, s)),
        (0..4usize).prop_map(Step::BinaryOther),
        (0..2usize).prop_map(Step::ReduceKeep),
        (any::<bool>(), 0..1000u64).prop_map(|(t, s)| Step::MatMul(t, s)),
        Just(Step::Gram),
        (0..5usize).prop_map(Step::Shuffle),
        (0..2usize).prop_map(Step::Cumsum),
        Just(Step::SlicePad),
    ]
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 48, ..ProptestConfig::default() })]

    /// Random programs mapped over a batch equal the loop over the examples.
    #[test]
    fn random_programs_equal_the_loop(
        program in prop::collection::vec(step(), 1..7),
        batch in 1usize..6,
        m in 1usize..4,
        k in 2usize..5,
        seed in 0u64..1000,
    ) {
        ferroflow::init();
        let xs = f64s(&[batch, m, k], seed);
        let others = f64s(&[batch, m, k], seed + 1);
        let f = |e: &[Tensor]| Ok(vec![run_program(&e[0], &e[1], &program)?]);
        let mapped = vectorized_map_with(f, &[xs.clone(), others.clone()], false).unwrap();
        let want = looped(&f, &[xs, others]).unwrap();
        assert_close(&mapped[0], &want[0], &format!("{program:?}"));
    }
}

/// A two-layer network's loss on one example and its gradients for the weights.
fn per_example_gradients<'a>(
    w1: &'a Variable,
    b1: &'a Variable,
    w2: &'a Variable,
) -> impl Fn(&[Tensor]) -> Result<Vec<Tensor>> + 'a {
    move |e: &[Tensor]| {
        let (x, label) = (e[0].expand_dims(0)?, &e[1]);
        let tape = GradientTape::new();
        let h = x.matmul(&w1.value())?.add(&b1.value())?.relu()?;
        let logits = h.matmul(&w2.value())?.reshape_to(&[3])?;
        let loss = logits
            .sub(&logits.reduce_max(Axes::All, true)?)?
            .exp()?
            .reduce_sum(Axes::All, false)?
            .log()?
            .sub(
                &logits
                    .gather(label, 0)?
                    .sub(&logits.reduce_max(Axes::All, false)?)?,
            )?;
        let g = tape.gradient(&loss, &[w1.into(), b1.into(), w2.into()])?;
        Ok(g.into_iter().map(|g| g.expect("a gradient")).collect())
    }
}

#[test]
fn per_example_gradients_equal_the_loop() {
    ferroflow::init();
    let w1 = Variable::new("w1", f64s(&[5, 8], 1));
    let b1 = Variable::new("b1", f64s(&[8], 2));
    let w2 = Variable::new("w2", f64s(&[8, 3], 3));
    let xs = f64s(&[16, 5], 4);
    let labels = Tensor::from_vec((0..16).map(|i| i % 3).collect::<Vec<i32>>(), &[16]).unwrap();
    let f = per_example_gradients(&w1, &b1, &w2);
    let mapped = vectorized_map_with(&f, &[xs.clone(), labels.clone()], false).unwrap();
    let want = looped(&f, &[xs, labels]).unwrap();
    assert_eq!(mapped.len(), 3);
    for (k, (g, w)) in mapped.iter().zip(&want).enumerate() {
        assert_close(g, w, &format!("gradient {k}"));
    }
    assert_eq!(mapped[0].shape(), &[16, 5, 8]);
}

#[test]
fn jacobians_equal_the_tapes_loops() {
    ferroflow::init();
    let x = f64s(&[3, 4], 7);
    let w = f64s(&[4, 2], 8);
    let forward = |x: &Tensor| -> Result<Tensor> {
        x.matmul(&w)?
            .tanh()?
            .mul(&x.reduce_sum(Axes::List(vec![1]), true)?)
    };
    for batched in [false, true] {
        let tape = GradientTape::persistent();
        tape.watch(&x);
        let y = forward(&x).unwrap();
        let source: Source = (&x).into();
        let (got, want) = if batched {
            (
                batch_jacobian(&tape, &y, &source).unwrap(),
                tape.batch_jacobian(&y, &source).unwrap(),
            )
        } else {
            (
                jacobian(&tape, &y, &source).unwrap(),
                tape.jacobian(&y, &source).unwrap(),
            )
        };
        assert_close(
            &got,
            &want,
            if batched {
                "batch_jacobian"
            } else {
                "jacobian"
            },
        );
    }
}

#[test]
fn ops_without_a_rule_run_per_example_or_are_refused() {
    ferroflow::init();
    let xs = f64s(&[4, 3], 12);
    // cond on a per-example predicate, and a scatter: no batching rule.
    let f = |e: &[Tensor]| -> Result<Vec<Tensor>> {
        let x = &e[0];
        let total = x.reduce_sum(Axes::All, false)?;
        let y = cond(
            &total.greater(&total.scalar_like(0.0)?)?,
            || Ok(vec![x.exp()?]),
            || Ok(vec![x.neg()?]),
        )?;
        let idx = Tensor::from_vec(vec![2i32, 0, 2], &[3])?;
        Ok(vec![Tensor::scatter_add(&idx, &y[0], &[3], 0)?])
    };
    let mapped = vectorized_map(f, std::slice::from_ref(&xs)).unwrap();
    let want = looped(&f, std::slice::from_ref(&xs)).unwrap();
    assert_close(&mapped[0], &want[0], "fallback");
    let e = vectorized_map_with(f, std::slice::from_ref(&xs), false).unwrap_err();
    assert!(
        matches!(&e, Error::NotTraceable { msg, .. } if msg.contains("cond")),
        "{e}"
    );
}

#[test]
fn convolutions_and_pooling_fold_the_batch_into_the_images() {
    ferroflow::init();
    let images = f64s(&[3, 6, 6, 2], 20);
    let filter = f64s(&[3, 3, 2, 4], 21);
    let f = |e: &[Tensor]| -> Result<Vec<Tensor>> {
        let x = e[0].expand_dims(0)?;
        let y = x.conv2d(&filter, [1, 1], Padding::Same, [1, 1])?.relu()?;
        let p = y.pool2d(
            ferroflow::PoolKind::MaxPool2d,
            [2, 2],
            [2, 2],
            Padding::Valid,
        )?;
        Ok(vec![p.reshape_to(&[36])?])
    };
    let mapped = vectorized_map_with(f, std::slice::from_ref(&images), false).unwrap();
    let want = looped(&f, std::slice::from_ref(&images)).unwrap();
    assert_close(&mapped[0], &want[0], "conv + pool");
}

#[test]
fn gradients_flow_through_the_batched_ops_and_random_ops_draw_per_example() {
    ferroflow::init();
    let xs = f64s(&[5, 3], 30);
    let w = f64s(&[3], 31);
    let tape = GradientTape::persistent();
    tape.watch(&xs);
    tape.watch(&w);
    let ys = vectorized_map(
        |e| Ok(vec![e[0].sin()?.mul(&w)?]),
        std::slice::from_ref(&xs),
    )
    .unwrap();
    let loss = ys[0].reduce_sum(Axes::All, false).unwrap();
    let g = tape.gradient(&loss, &[(&xs).into(), (&w).into()]).unwrap();
    assert_close(
        g[0].as_ref().unwrap(),
        &xs.cos().unwrap().mul(&w).unwrap(),
        "d/dxs",
    );
    assert_close(
        g[1].as_ref().unwrap(),
        &xs.sin()
            .unwrap()
            .reduce_sum(Axes::List(vec![0]), false)
            .unwrap(),
        "d/dw",
    );
    let noise = vectorized_map(
        |e| {
            Ok(vec![
                random::normal(&[4], 0.0, 1.0, DType::F32, None)?.add(&e[0].cast(DType::F32)?)?
            ])
        },
        &[Tensor::zeros(&[6], DType::F64).unwrap()],
    )
    .unwrap();
    let rows = noise[0].to_vec::<f32>().unwrap();
    assert_eq!(noise[0].shape(), &[6, 4]);
    assert!(
        rows[..4] != rows[4..8],
        "every example draws its own numbers"
    );
}

#[test]
fn inside_a_function_and_errors() {
    ferroflow::init();
    let f = Function::new(|a: &[Tensor]| {
        vectorized_map(
            |e| Ok(vec![e[0].square()?.reduce_sum(Axes::All, false)?]),
            a,
        )
    });
    for seed in 0..3 {
        let xs = f64s(&[4, 2], 40 + seed);
        let want = xs
            .square()
            .unwrap()
            .reduce_sum(Axes::List(vec![1]), false)
            .unwrap();
        assert_close(
            &f.call(std::slice::from_ref(&xs)).unwrap()[0],
            &want,
            "in a function",
        );
    }
    assert_eq!(f.tracing_count(), 1);
    let e = vectorized_map(
        |e| Ok(vec![e[0].clone()]),
        &[f64s(&[3, 2], 1), f64s(&[4, 2], 2)],
    )
    .unwrap_err();
    assert!(e.to_string().contains("same first dimension"), "{e}");
    let v = Variable::new("v", Tensor::scalar(0.0f64).unwrap());
    let e = vectorized_map(
        |e| {
            v.assign(&e[0].reduce_sum(Axes::All, false)?)?;
            Ok(vec![e[0].clone()])
        },
        &[f64s(&[3, 2], 1)],
    )
    .unwrap_err();
    assert!(
        matches!(&e, Error::NotTraceable { msg, .. } if msg.contains("writes variable")),
        "{e}"
    );
    assert_eq!(
        v.value().item::<f64>().unwrap(),
        0.0,
        "the trace's write was not made"
    );
}

#[test]
fn an_index_out_of_an_examples_range_is_an_error_not_a_neighbours_row() {
    ferroflow::init();
    let params = f64s(&[3, 4, 2], 50);
    // Example 1 (not the one traced) asks for row 4 of its 4: stacked, that is example
    // 2's first row.
    let indices = Tensor::from_vec(vec![0i32, 4, 1], &[3]).unwrap();
    let e = vectorized_map(|e| Ok(vec![e[0].gather(&e[1], 0)?]), &[params, indices]);
    assert!(e.is_err(), "{e:?}");
}

/// Per-example bias gradients and losses of a convolution with its ReLU under a max
/// pooling: the graph's fused convolution and pooling, and its fused pooling and ReLU/bias
/// gradient, have batching rules (the map runs with no loop to fall back to), and the
/// results equal the loop's.
#[test]
fn the_fused_pooling_and_bias_gradient_is_batched() {
    use ferroflow::FusedActivation;
    ferroflow::init();
    let images = f64s(&[3, 6, 6, 2], 40);
    let filter = f64s(&[3, 3, 2, 4], 41);
    // Negative biases: windows of a ReLU's zeros, whose gradient the mask stops.
    let bias = Tensor::from_vec(vec![-1.5f64, -3.0, 0.3, -2.0], &[4]).unwrap();
    // The pooled outputs weighted: `dy` nonzero where an output is zero too.
    let weights = f64s(&[1, 3, 3, 4], 43);
    let f = |e: &[Tensor]| -> Result<Vec<Tensor>> {
        let tape = GradientTape::new();
        tape.watch(&bias);
        let x = e[0].expand_dims(0)?;
        let y = x.fused_conv2d(
            &filter,
            &bias,
            FusedActivation::Relu,
            [1, 1],
            Padding::Same,
            [1, 1],
        )?;
        let p = y.pool2d(
            ferroflow::PoolKind::MaxPool2d,
            [2, 2],
            [2, 2],
            Padding::Valid,
        )?;
        let loss = p.mul(&weights)?.reduce_sum(Axes::All, false)?;
        let g = tape.gradient(&loss, &[(&bias).into()])?;
        Ok(vec![g[0].clone().unwrap(), loss])
    };
    let mapped = vectorized_map_with(f, std::slice::from_ref(&images), false).unwrap();
    let want = looped(&f, std::slice::from_ref(&images)).unwrap();
    assert_eq!(mapped[0].shape(), &[3, 4]);
    assert_close(&mapped[0], &want[0], "bias gradients");
    // The loss needs the pooling: the graph's convolution and pooling are one fused node,
    // batched as well.
    assert_close(&mapped[1], &want[1], "losses");
}
