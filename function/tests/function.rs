//! Graph functions against eager execution: the same results (bit for bit: the graph runs
//! the same kernels), variables by reference, fresh random numbers per call, retracing,
//! the passes, gradients through a replayed graph, and what tracing refuses.

use ferroflow::autodiff::GradientTape;
use ferroflow::function::{Function, TensorSpec};
use ferroflow::{random, Axes, BinaryOp, DType, Error, Tensor, UnaryOp, Variable};
use proptest::prelude::*;
use std::sync::atomic::{AtomicUsize, Ordering};

fn bits(t: &Tensor) -> Vec<u32> {
    t.cast(DType::F32)
        .unwrap()
        .to_vec::<f32>()
        .unwrap()
        .iter()
        .map(|v| v.to_bits())
        .collect()
}

fn f32s(shape: &[usize], seed: u64) -> Tensor {
    random::stateless_normal(shape, [seed, 7], 0.0, 2.0, DType::F32).unwrap()
}

/// The op names of a traced graph's op nodes, in order.
fn op_kinds(c: &ferroflow::function::ConcreteFunction) -> Vec<String> {
    c.graph()
        .nodes
        .iter()
        .filter_map(|n| match &n.kind {
            ferroflow::function::NodeKind::Op(op) => Some(op.name().to_string()),
            _ => None,
        })
        .collect()
}

/// The first and second gradients of `loss(run(args))` in `args[watched]` (the second of
/// the first's squares summed), under nested tapes.
fn first_and_second_order(
    run: &dyn Fn(&[Tensor]) -> ferroflow::Result<Vec<Tensor>>,
    args: &[Tensor],
    watched: usize,
    loss: &dyn Fn(&[Tensor]) -> Tensor,
) -> (Vec<f64>, Vec<f64>) {
    let x = &args[watched];
    let outer = GradientTape::new();
    outer.watch(x);
    let inner = GradientTape::new();
    inner.watch(x);
    let l = loss(&run(args).unwrap());
    let g = inner.gradient(&l, &[x.into()]).unwrap()[0].clone().unwrap();
    let gg = outer
        .gradient(
            &g.square().unwrap().reduce_sum(Axes::All, false).unwrap(),
            &[x.into()],
        )
        .unwrap()[0]
        .clone()
        .unwrap();
    (g.to_vec::<f64>().unwrap(), gg.to_vec::<f64>().unwrap())
}

/// Eager and traced gradients agree to 1e-12 relative.
fn assert_same_gradients(eager: &(Vec<f64>, Vec<f64>), traced: &(Vec<f64>, Vec<f64>)) {
    assert!(!eager.1.is_empty());
    for (e, t) in eager
        .0
        .iter()
        .zip(&traced.0)
        .chain(eager.1.iter().zip(&traced.1))
    {
        assert!((e - t).abs() <= 1e-12 * (1.0 + e.abs()), "{e} vs {t}");
    }
}

const UNARY: [UnaryOp; 9] = [
    UnaryOp::Neg,
    UnaryOp::Abs,
    UnaryOp::Tanh,
    UnaryOp::Sigmoid,
    UnaryOp::Sin,
    UnaryOp::Square,
    UnaryOp::Relu,
    UnaryOp::Exp,
    UnaryOp::Erf,
];
const BINARY: [BinaryOp; 7] = [
    BinaryOp::Add,
    BinaryOp::Sub,
    BinaryOp::Mul,
    BinaryOp::Div,
    BinaryOp::Maximum,
    BinaryOp::Minimum,
    BinaryOp::SquaredDifference,
];

/// One step of a random elementwise program: a unary op of an earlier value, a binary op
/// of two, a constant combined with one, or a mean over axis 0 (an op fusion cannot take,
/// reading a value in the middle of a chain: the fused node's extra outputs and the order
/// they need); the last value may be reduced.
#[derive(Debug, Clone)]
enum Step {
    Unary(usize, usize),
    Binary(usize, usize, usize),
    Constant(usize, f64),
    Mean(usize),
}

fn run_program(args: &[Tensor], program: &[Step], reduce: bool) -> ferroflow::Result<Vec<Tensor>> {
    let mut values: Vec<Tensor> = args.to_vec();
    for step in program {
        let v = match *step {
            Step::Unary(op, a) => values[a % values.len()].unary(UNARY[op])?,
            Step::Binary(op, a, b) => {
                let n = values.len();
                values[a % n].binary(BINARY[op], &values[b % n])?
            }
            Step::Constant(a, c) => {
                let x = &values[a % values.len()];
                x.mul(&x.scalar_like(c)?)?
            }
            Step::Mean(a) => values[a % values.len()].reduce_mean(Axes::List(vec![0]), true)?,
        };
        values.push(v);
    }
    let last = values.last().unwrap().clone();
    Ok(if reduce {
        vec![
            last.reduce_sum(Axes::List(vec![0]), true)?,
            values[values.len() / 2].clone(),
        ]
    } else {
        vec![last]
    })
}

fn step() -> impl Strategy<Value = Step> {
    prop_oneof![
        (0..UNARY.len(), 0..64usize).prop_map(|(o, a)| Step::Unary(o, a)),
        (0..BINARY.len(), 0..64usize, 0..64usize).prop_map(|(o, a, b)| Step::Binary(o, a, b)),
        (0..64usize, -3.0..3.0f64).prop_map(|(a, c)| Step::Constant(a, c)),
        (0..64usize).prop_map(Step::Mean),
    ]
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(48))]
    /// Random graphs of elementwise ops with broadcasting: the traced call, and the graph
    /// replayed on new values, equal eager execution bit for bit.
    #[test]
    fn random_elementwise_graphs_equal_eager(
        dims in proptest::collection::vec(1..5usize, 1..4),
        keep in proptest::collection::vec(any::<bool>(), 3),
        program in proptest::collection::vec(step(), 1..12),
        reduce in any::<bool>(),
        seed in 0..1000u64,
    ) {
        ferroflow::init();
        // Three arguments that broadcast: the full shape, one with some dims 1, one of
        // lower rank.
        let full = dims.clone();
        let ones: Vec<usize> = dims.iter().zip(&keep).map(|(&d, &k)| if k { d } else { 1 }).collect();
        let low = dims[dims.len() - 1..].to_vec();
        let shapes = [full, ones, low];
        let args = |s: u64| -> Vec<Tensor> {
            shapes.iter().enumerate().map(|(i, sh)| f32s(sh, s * 3 + i as u64)).collect()
        };
        let p = program.clone();
        let f = Function::new(move |a: &[Tensor]| run_program(a, &p, reduce));
        for s in [seed, seed + 1000, seed + 2000] {
            let a = args(s);
            let eager = run_program(&a, &program, reduce).unwrap();
            let traced = f.call(&a).unwrap();
            prop_assert_eq!(eager.len(), traced.len());
            for (e, t) in eager.iter().zip(&traced) {
                prop_assert_eq!(e.shape(), t.shape());
                prop_assert_eq!(bits(e), bits(t));
            }
        }
        prop_assert_eq!(f.tracing_count(), 1);
    }
}

#[test]
fn variables_are_captured_by_reference_and_writes_replay() {
    ferroflow::init();
    let counter = Variable::new("counter", Tensor::scalar(0.0f32).unwrap());
    let w = Variable::new("w", Tensor::from_vec(vec![1.0f32, 2.0], &[2]).unwrap());
    let side_effects = AtomicUsize::new(0);
    let f = Function::new(|a: &[Tensor]| {
        side_effects.fetch_add(1, Ordering::Relaxed);
        counter.assign_add(&Tensor::scalar(1.0f32)?)?;
        let y = a[0].mul(&w.value())?;
        w.assign(&w.value().mul(&w.value().scalar_like(2.0)?)?)?;
        // A read after the write sees the new value.
        Ok(vec![y, w.value().add(&a[0])?])
    });
    let x = Tensor::from_vec(vec![1.0f32, 1.0], &[2]).unwrap();
    for call in 0..4 {
        let out = f.call(std::slice::from_ref(&x)).unwrap();
        let scale = 2f32.powi(call);
        assert_eq!(out[0].to_vec::<f32>().unwrap(), vec![scale, 2.0 * scale]);
        assert_eq!(
            out[1].to_vec::<f32>().unwrap(),
            vec![2.0 * scale + 1.0, 4.0 * scale + 1.0]
        );
        assert_eq!(counter.value().item::<f32>().unwrap(), (call + 1) as f32);
    }
    // Rust side effects run at trace time only.
    assert_eq!(side_effects.load(Ordering::Relaxed), 1);
    assert_eq!(f.tracing_count(), 1);
}

#[test]
fn random_ops_draw_new_numbers_on_every_call() {
    ferroflow::init();
    let f = Function::new(|a: &[Tensor]| {
        let noise = random::normal(a[0].shape(), 0.0, 1.0, DType::F32, None)?;
        Ok(vec![a[0].add(&noise)?])
    });
    let x = Tensor::zeros(&[64], DType::F32).unwrap();
    let draws: Vec<Vec<u32>> = (0..3)
        .map(|_| bits(&f.call(std::slice::from_ref(&x)).unwrap()[0]))
        .collect();
    assert_ne!(draws[0], draws[1]);
    assert_ne!(draws[1], draws[2]);
    // Under a global seed, the graph draws what eager execution draws.
    let expected: Vec<Vec<u32>> = ferroflow::testing::seeded(11, || {
        (0..3)
            .map(|_| bits(&random::normal(&[64], 0.0, 1.0, DType::F32, None).unwrap()))
            .collect()
    });
    let traced: Vec<Vec<u32>> = ferroflow::testing::seeded(11, || {
        (0..3)
            .map(|_| bits(&f.call(std::slice::from_ref(&x)).unwrap()[0]))
            .collect()
    });
    assert_eq!(traced, expected);
}

#[test]
fn new_signatures_retrace_and_input_signatures_are_checked() {
    ferroflow::init();
    let f = Function::new(|a: &[Tensor]| Ok(vec![a[0].reduce_sum(Axes::All, false)?]));
    f.call(&[Tensor::ones(&[2], DType::F32).unwrap()]).unwrap();
    f.call(&[Tensor::ones(&[2], DType::F32).unwrap()]).unwrap();
    assert_eq!(f.tracing_count(), 1);
    let s = f.call(&[Tensor::ones(&[3], DType::F32).unwrap()]).unwrap();
    assert_eq!(s[0].item::<f32>().unwrap(), 3.0);
    f.call(&[Tensor::ones(&[3], DType::F64).unwrap()]).unwrap();
    assert_eq!(f.tracing_count(), 3);

    let g = Function::new(|a: &[Tensor]| Ok(vec![a[0].reduce_sum(Axes::All, false)?]))
        .with_name("total")
        .with_input_signature(vec![TensorSpec::new(&[None, Some(2)], DType::F32)]);
    for rows in [1, 4, 1] {
        let s = g
            .call(&[Tensor::ones(&[rows, 2], DType::F32).unwrap()])
            .unwrap();
        assert_eq!(s[0].item::<f32>().unwrap(), 2.0 * rows as f32);
    }
    assert_eq!(g.tracing_count(), 2);
    let err = g
        .call(&[Tensor::ones(&[4, 3], DType::F32).unwrap()])
        .unwrap_err()
        .to_string();
    assert!(
        err.contains("argument 0") && err.contains("TensorSpec(shape=(None, 2), dtype=float32)"),
        "{err}"
    );
    let err = g
        .call(&[Tensor::ones(&[4, 2], DType::F64).unwrap()])
        .unwrap_err();
    assert!(err.to_string().contains("incompatible"), "{err}");
    assert!(g.call(&[]).is_err());
}

#[test]
fn reading_a_value_on_the_host_while_tracing_is_refused() {
    ferroflow::init();
    let f = Function::new(|a: &[Tensor]| {
        let s = a[0].reduce_sum(Axes::All, false)?;
        // Rust control flow on a tensor's value: fixed at trace time, so refused.
        if s.item::<f32>()? > 0.0 {
            Ok(vec![a[0].clone()])
        } else {
            Ok(vec![a[0].neg()?])
        }
    });
    let err = f
        .call(&[Tensor::ones(&[2], DType::F32).unwrap()])
        .unwrap_err();
    assert!(
        matches!(err, Error::NotTraceable { op: "to_host", .. }),
        "{err}"
    );
    assert!(err.to_string().contains("cond"), "{err}");
    // Tracing mode ends with the failed trace.
    assert_eq!(
        Tensor::ones(&[1], DType::F32)
            .unwrap()
            .item::<f32>()
            .unwrap(),
        1.0
    );
}

#[test]
fn a_plain_optimizer_step_inside_a_function_is_refused_naming_the_shared_form() {
    use ferroflow::optim::{Optimizer, Sgd};
    ferroflow::init();
    let w = Variable::new("w", Tensor::ones(&[2], DType::F32).unwrap());
    let opt = std::sync::Mutex::new(Sgd::new(0.1));
    let f = Function::new(|a: &[Tensor]| {
        opt.lock()
            .unwrap()
            .apply_gradients(vec![(Some(a[0].clone()), w.clone())], true)?;
        Ok(vec![])
    });
    let err = f
        .call(&[Tensor::ones(&[2], DType::F32).unwrap()])
        .unwrap_err();
    assert!(
        matches!(
            &err,
            Error::NotTraceable {
                op: "apply_gradients",
                msg,
            } if msg.contains("SharedOptimizer")
        ),
        "{err}"
    );
    assert_eq!(w.value().to_vec::<f32>().unwrap(), vec![1.0, 1.0]);
}

#[test]
fn passes_fold_constants_merge_duplicates_and_drop_dead_code() {
    ferroflow::init();
    let f = Function::new(|a: &[Tensor]| {
        let x = &a[0];
        // Folded: an expression of constants made inside the function.
        let c = Tensor::scalar(2.0f32)?
            .add(&Tensor::scalar(3.0f32)?)?
            .sqrt()?;
        // Merged: the same op on the same input twice.
        let e1 = x.exp()?;
        let e2 = x.exp()?;
        // Dead: nothing uses it.
        let _unused = x.tanh()?.sin()?;
        Ok(vec![e1.add(&e2)?.mul(&c)?])
    });
    let x = Tensor::from_vec(vec![0.0f32, 1.0], &[2]).unwrap();
    let eager = x
        .exp()
        .unwrap()
        .add(&x.exp().unwrap())
        .unwrap()
        .mul(&Tensor::scalar(5.0f32).unwrap().sqrt().unwrap())
        .unwrap();
    let c = f.get_concrete_function(std::slice::from_ref(&x)).unwrap();
    let stats = c.stats().clone();
    assert_eq!(stats.folded, 2, "{stats:?}\n{}", c.graph().listing());
    assert_eq!(stats.merged, 1, "{stats:?}\n{}", c.graph().listing());
    assert!(stats.dead >= 2, "{stats:?}\n{}", c.graph().listing());
    // exp, add, mul remain, fused into one kernel.
    assert_eq!(stats.fused, 3, "{}", c.graph().listing());
    assert_eq!(stats.ops, 1, "{}", c.graph().listing());
    let out = f.call(std::slice::from_ref(&x)).unwrap();
    assert_eq!(bits(&out[0]), bits(&eager));
}

#[test]
fn tapes_differentiate_a_replayed_graph_to_second_order() {
    ferroflow::init();
    let w = Variable::new(
        "w",
        Tensor::from_vec(vec![0.5f32, -1.5, 2.0], &[3]).unwrap(),
    );
    let f = Function::new(|a: &[Tensor]| {
        let y = a[0].mul(&w.value())?.tanh()?.square()?;
        Ok(vec![y.reduce_sum(Axes::All, false)?])
    });
    let x = Tensor::from_vec(vec![1.0f32, 0.5, -0.25], &[3]).unwrap();
    let grads = |use_function: bool| -> (Vec<u32>, Vec<u32>) {
        let outer = GradientTape::new();
        outer.watch(&x);
        let inner = GradientTape::new();
        inner.watch(&x);
        let loss = if use_function {
            f.call(std::slice::from_ref(&x)).unwrap().remove(0)
        } else {
            x.mul(&w.value())
                .unwrap()
                .tanh()
                .unwrap()
                .square()
                .unwrap()
                .reduce_sum(Axes::All, false)
                .unwrap()
        };
        let g = inner.gradient(&loss, &[(&x).into(), (&w).into()]).unwrap();
        let gx = g[0].clone().unwrap();
        let gw = g[1].clone().unwrap();
        let gg = outer
            .gradient(&gx.reduce_sum(Axes::All, false).unwrap(), &[(&x).into()])
            .unwrap();
        let _ = gw;
        (bits(&gx), bits(gg[0].as_ref().unwrap()))
    };
    let eager = grads(false);
    let traced = grads(true); // the trace itself
    let replayed = grads(true); // the graph
    assert_eq!(traced, eager);
    assert_eq!(replayed, eager);
    assert_eq!(f.tracing_count(), 1);
}

#[test]
fn one_tensor_passed_twice_is_two_arguments() {
    ferroflow::init();
    let f = Function::new(|a: &[Tensor]| Ok(vec![a[0].sub(&a[1].mul(&a[1].scalar_like(2.0)?)?)?]));
    let x = Tensor::from_vec(vec![1.0f32, 2.0], &[2]).unwrap();
    let tape = GradientTape::new();
    tape.watch(&x);
    let y = f.call(&[x.clone(), x.clone()]).unwrap().remove(0);
    assert_eq!(y.to_vec::<f32>().unwrap(), vec![-1.0, -2.0]);
    let g = tape.gradient(&y, &[(&x).into()]).unwrap();
    assert_eq!(
        g[0].as_ref().unwrap().to_vec::<f32>().unwrap(),
        vec![-1.0, -1.0]
    );
    let z = Tensor::from_vec(vec![5.0f32, 5.0], &[2]).unwrap();
    assert_eq!(
        f.call(&[x, z]).unwrap()[0].to_vec::<f32>().unwrap(),
        vec![-9.0, -8.0]
    );
}

/// Counts the ops this thread dispatches.
struct OpCounter(AtomicUsize);
impl ferroflow::OpObserver for OpCounter {
    fn on_op(&self, _event: &ferroflow::OpEvent<'_>) {
        self.0.fetch_add(1, Ordering::Relaxed);
    }
}

fn dispatched(f: impl FnOnce()) -> usize {
    let counter = std::sync::Arc::new(OpCounter(AtomicUsize::new(0)));
    let guard = ferroflow::push_thread_observer(counter.clone());
    f();
    drop(guard);
    counter.0.load(Ordering::Relaxed)
}

#[test]
fn gelu_from_primitives_is_one_kernel() {
    ferroflow::init();
    let gelu = Function::new(|a: &[Tensor]| Ok(vec![a[0].gelu()?]));
    let x = f32s(&[64, 33], 5);
    let eager_ops = dispatched(|| {
        x.gelu().unwrap();
    });
    let first = gelu.call(std::slice::from_ref(&x)).unwrap();
    let mut replayed = vec![];
    let graph_ops = dispatched(|| replayed = gelu.call(std::slice::from_ref(&x)).unwrap());
    assert!(eager_ops >= 4, "gelu composes {eager_ops} ops");
    assert_eq!(graph_ops, 1, "the graph dispatches one fused kernel");
    assert_eq!(bits(&first[0]), bits(&x.gelu().unwrap()));
    assert_eq!(bits(&replayed[0]), bits(&first[0]));
    // And its gradient (through the fused op) equals the eager one.
    let grad = |use_graph: bool| {
        let tape = GradientTape::new();
        tape.watch(&x);
        let y = if use_graph {
            gelu.call(std::slice::from_ref(&x)).unwrap().remove(0)
        } else {
            x.gelu().unwrap()
        };
        bits(
            tape.gradient(&y, &[(&x).into()]).unwrap()[0]
                .as_ref()
                .unwrap(),
        )
    };
    assert_eq!(grad(true), grad(false));
}

/// `stop_gradient` and `custom_gradient` inside a function are ops of its graph: every call
/// computes them from its own arguments (they were once captured as the first call's
/// values), and a tape inside the function honours them as eagerly.
#[test]
fn stop_and_custom_gradients_are_recomputed_per_call() {
    use ferroflow::autodiff::{custom_gradient, stop_gradient, GradFn};
    use std::sync::Arc;
    ferroflow::init();
    // y = x²·sg(x) + cg(x), where cg(x) = x³ with the gradient 10·dy; returns y and dy/dx
    // from a tape inside: 2x·x + 10 (sg cuts x²'s other factor; cg's gradient is its own).
    let f = Function::new(|a: &[Tensor]| {
        let x = &a[0];
        let tape = GradientTape::new();
        tape.watch(x);
        let cubed = custom_gradient(std::slice::from_ref(x), |xs| {
            let y = xs[0].mul(&xs[0])?.mul(&xs[0])?;
            let grad: GradFn =
                Arc::new(|dy: &[Tensor]| Ok(vec![Some(dy[0].mul(&dy[0].scalar_like(10.0)?)?)]));
            Ok((vec![y], grad))
        })?;
        let y = x.mul(x)?.mul(&stop_gradient(x)?)?.add(&cubed[0])?;
        let g = tape.gradient(&y, &[x.into()])?.remove(0);
        Ok(vec![
            y,
            g.ok_or_else(|| Error::invalid("test", "no gradient"))?,
        ])
    });
    for v in [2.0f32, 3.0, -1.5] {
        let x = Tensor::from_vec(vec![v], &[1]).unwrap();
        let out = f.call(std::slice::from_ref(&x)).unwrap();
        assert_eq!(out[0].to_vec::<f32>().unwrap(), vec![2.0 * v * v * v]);
        assert_eq!(out[1].to_vec::<f32>().unwrap(), vec![2.0 * v * v + 10.0]);
    }
    assert_eq!(f.tracing_count(), 1);
    // A tape outside cannot see the custom gradient through the graph: the function runs
    // its closure eagerly then (the custom gradient, 3·dy, is what the tape gets), and the
    // graph alone refuses (an error, not a silent zero).
    let g = Function::new(|a: &[Tensor]| {
        custom_gradient(a, |xs| {
            let grad: GradFn =
                Arc::new(|dy: &[Tensor]| Ok(vec![Some(dy[0].mul(&dy[0].scalar_like(3.0)?)?)]));
            Ok((vec![xs[0].exp()?], grad))
        })
    });
    let x = Tensor::from_vec(vec![0.5f32], &[1]).unwrap();
    g.call(std::slice::from_ref(&x)).unwrap();
    let tape = GradientTape::new();
    tape.watch(&x);
    let y = g.call(std::slice::from_ref(&x)).unwrap().remove(0);
    assert_eq!(bits(&y), bits(&x.exp().unwrap()));
    let dx = tape
        .gradient(&y, &[(&x).into()])
        .unwrap()
        .remove(0)
        .unwrap();
    assert_eq!(dx.to_vec::<f32>().unwrap(), vec![3.0]);
    assert_eq!(g.tracing_count(), 1);
    let tape = GradientTape::new();
    tape.watch(&x);
    let concrete = g.get_concrete_function(std::slice::from_ref(&x)).unwrap();
    match concrete.call(std::slice::from_ref(&x)) {
        Err(Error::NotTraceable { op, msg }) => {
            assert_eq!(op, "custom_gradient");
            assert!(msg.contains("record the tape inside the function"), "{msg}");
        }
        other => panic!("expected NotTraceable, got {other:?}"),
    }
    // Without a tape, or with one that tracks nothing the graph reads, the call runs.
    drop(tape);
    let y = g.call(std::slice::from_ref(&x)).unwrap();
    assert_eq!(bits(&y[0]), bits(&x.exp().unwrap()));
    // stop_gradient under a tape outside: a graph op with no gradient, as eagerly.
    let h = Function::new(|a: &[Tensor]| Ok(vec![a[0].mul(&stop_gradient(&a[0])?)?]));
    let tape = GradientTape::new();
    tape.watch(&x);
    let y = h.call(std::slice::from_ref(&x)).unwrap().remove(0);
    let dx = tape
        .gradient(&y, &[(&x).into()])
        .unwrap()
        .remove(0)
        .unwrap();
    assert_eq!(bits(&dx), bits(&x));
}

/// Multi-output fusion: a chain's inner values read outside it become extra outputs of the
/// fused node, unless a reader outside runs before the chain's end (it would wait for the
/// fused node, which needs it: the value leaves the chain instead).
#[test]
fn inner_values_read_outside_a_chain_are_extra_outputs() {
    ferroflow::init();
    let body = |a: &[Tensor]| -> ferroflow::Result<Vec<Tensor>> {
        let t = a[0].tanh()?;
        let m = t.reduce_mean(Axes::List(vec![0]), true)?; // reads t before the chain ends
        let s = t.add(&m)?.exp()?;
        let e = s.mul(&a[0])?.sigmoid()?; // s read inside the chain and returned
        Ok(vec![e, s])
    };
    let f = Function::new(body);
    let x = f32s(&[3, 4], 7);
    let (eager, traced) = (
        body(std::slice::from_ref(&x)).unwrap(),
        f.call(std::slice::from_ref(&x)).unwrap(),
    );
    for (e, t) in eager.iter().zip(&traced) {
        assert_eq!(bits(e), bits(t));
    }
    let c = f.get_concrete_function(std::slice::from_ref(&x)).unwrap();
    let fused: Vec<usize> = c
        .graph()
        .nodes
        .iter()
        .filter_map(|n| match &n.kind {
            ferroflow::function::NodeKind::Op(ferroflow::Op::FusedElementwise(p)) => {
                Some(p.outputs.len())
            }
            _ => None,
        })
        .collect();
    // add, exp, mul, sigmoid in one kernel returning sigmoid and exp; tanh alone.
    assert_eq!(fused, [2], "{}", c.graph().listing());
    let again = f32s(&[3, 4], 8);
    let (eager, traced) = (
        body(std::slice::from_ref(&again)).unwrap(),
        f.call(std::slice::from_ref(&again)).unwrap(),
    );
    for (e, t) in eager.iter().zip(&traced) {
        assert_eq!(bits(e), bits(t));
    }
}

/// A chain ending in a reduction is one kernel with it (`Op::FusedReduce`), its inner values
/// read elsewhere extra outputs; values and gradients (to second order) are eager's.
#[test]
fn a_reduction_at_the_end_of_a_chain_joins_it() {
    ferroflow::init();
    let body = |a: &[Tensor]| -> ferroflow::Result<Vec<Tensor>> {
        let shifted = a[0].sub(&a[1])?;
        let e = shifted.exp()?;
        let total = e.reduce_sum(Axes::List(vec![1]), true)?; // exp(x - m) summed
        let top = shifted
            .tanh()?
            .mul(&a[0])?
            .reduce_max(Axes::List(vec![0]), false)?;
        Ok(vec![total, top, e])
    };
    let f = Function::new(body);
    let (x, m) = (f32s(&[5, 7], 3), f32s(&[5, 1], 4));
    let args = [x.clone(), m.clone()];
    let c = f.get_concrete_function(&args).unwrap();
    let kinds = op_kinds(&c);
    // sub and exp with the sum (sub and exp also returned as extra outputs: tanh reads
    // one, the caller the other), then tanh and mul with the max.
    assert_eq!(
        kinds,
        ["fused_reduce", "fused_reduce"],
        "{}",
        c.graph().listing()
    );
    for s in [3u64, 30] {
        let args = [f32s(&[5, 7], s), f32s(&[5, 1], s + 1)];
        let (eager, traced) = (body(&args).unwrap(), f.call(&args).unwrap());
        for (e, t) in eager.iter().zip(&traced) {
            assert_eq!(e.shape(), t.shape());
            assert_eq!(bits(e), bits(t));
        }
    }
    // Gradients through the fused reduction, first and second order, equal eager ones.
    let args64 = [x.cast(DType::F64).unwrap(), m.cast(DType::F64).unwrap()];
    let loss = |y: &[Tensor]| {
        y[0].reduce_sum(Axes::All, false)
            .unwrap()
            .add(&y[1].reduce_sum(Axes::All, false).unwrap())
            .unwrap()
    };
    let f64_fn = Function::new(body);
    assert_same_gradients(
        &first_and_second_order(&body, &args64, 0, &loss),
        &first_and_second_order(&|a| f64_fn.call(a), &args64, 0, &loss),
    );
}

/// A Dense layer's product, bias add and ReLU in a graph are one `FusedMatMul` (TF's
/// remapper), also with the gradients in the same graph (the ReLU's gradient reads its
/// output, so the sum is not kept); the results and gradients equal eager ones to the bit.
#[test]
fn a_product_its_bias_and_relu_are_one_kernel() {
    ferroflow::init();
    let x = f32s(&[8, 5], 11);
    let w = f32s(&[5, 4], 12);
    let b = f32s(&[4], 13);
    let forward = |a: &[Tensor]| -> ferroflow::Result<Tensor> {
        let h = a[0].matmul(&a[1])?.add(&a[2])?.relu()?;
        h.matmul(&a[1].transpose(&[1, 0])?)?
            .add(&a[0].reduce_sum(0isize, false)?)
    };
    let step = |a: &[Tensor]| -> ferroflow::Result<Vec<Tensor>> {
        let tape = GradientTape::new();
        tape.watch(&a[1]);
        tape.watch(&a[2]);
        let loss = forward(a)?.square()?.reduce_sum(Axes::All, false)?;
        let g = tape.gradient(&loss, &[(&a[1]).into(), (&a[2]).into()])?;
        Ok(vec![loss, g[0].clone().unwrap(), g[1].clone().unwrap()])
    };
    let f = Function::new(move |a: &[Tensor]| step(a));
    let args = [x.clone(), w.clone(), b.clone()];
    let traced = f.call(&args).unwrap();
    let c = f.get_concrete_function(&args).unwrap();
    let listing = c.graph().listing();
    let fused: Vec<&str> = listing
        .lines()
        .filter(|l| l.contains("fused_matmul("))
        .collect();
    // The first layer (product + bias + ReLU) and the second (product + a bias vector);
    // in the backward, the second layer's input gradient with the first's ReLU and bias
    // gradients.
    assert_eq!(fused.len(), 2, "{listing}");
    assert_eq!(
        listing.matches("fused_matmul_reduce(").count(),
        1,
        "{listing}"
    );
    assert!(!listing.contains(" relu("), "{listing}");
    let eager = step(&args).unwrap();
    for (t, e) in traced.iter().zip(&eager) {
        assert_eq!(bits(t), bits(e), "{listing}");
    }
    let replayed = f.call(&args).unwrap();
    assert_eq!(bits(&replayed[1]), bits(&eager[1]));
}

/// A Dense layer's backward under another: the product `g @ wᵀ`, the ReLU gradient of the
/// layer below and that layer's bias gradient are one `FusedMatMulReduce` (cuBLASLt's
/// `DRELU_BGRAD`); the results equal eager ones to the bit, and a tape differentiates the
/// replayed graph through the fused node to second order as it does the eager ops.
#[test]
fn a_backward_product_with_the_relu_and_bias_gradients_below_is_one_kernel() {
    ferroflow::init();
    let body = |a: &[Tensor]| -> ferroflow::Result<Vec<Tensor>> {
        // a = [g, w, y]: the upstream gradient, the upper layer's weights, the lower
        // layer's ReLU output.
        let dz = a[0].matmul_t(&a[1], false, true)?.relu_grad(&a[2])?;
        Ok(vec![dz.reduce_sum(0isize, false)?, dz])
    };
    let f = Function::new(body);
    let args = [f32s(&[6, 3], 21), f32s(&[5, 3], 22), f32s(&[6, 5], 23)];
    let c = f.get_concrete_function(&args).unwrap();
    let kinds = op_kinds(&c);
    assert_eq!(kinds, ["fused_matmul_reduce"], "{}", c.graph().listing());
    for s in [21u64, 40] {
        let args = [f32s(&[6, 3], s), f32s(&[5, 3], s + 1), f32s(&[6, 5], s + 2)];
        let (eager, traced) = (body(&args).unwrap(), f.call(&args).unwrap());
        for (e, t) in eager.iter().zip(&traced) {
            assert_eq!(e.shape(), t.shape());
            assert_eq!(bits(e), bits(t));
        }
    }
    // A product another op reads too stays a product.
    let both = Function::new(|a: &[Tensor]| -> ferroflow::Result<Vec<Tensor>> {
        let p = a[0].matmul_t(&a[1], false, true)?;
        let dz = p.relu_grad(&a[2])?;
        Ok(vec![dz.reduce_sum(0isize, false)?, p])
    });
    let listing = both.get_concrete_function(&args).unwrap().graph().listing();
    assert!(!listing.contains("fused_matmul_reduce"), "{listing}");
    // Gradients through the fused node, first and second order, equal eager ones.
    let a64: Vec<Tensor> = args.iter().map(|t| t.cast(DType::F64).unwrap()).collect();
    let loss = |y: &[Tensor]| {
        y[0].square()
            .unwrap()
            .reduce_sum(Axes::All, false)
            .unwrap()
            .add(&y[1].reduce_sum(Axes::All, false).unwrap())
            .unwrap()
    };
    let f64_fn = Function::new(body);
    assert_same_gradients(
        &first_and_second_order(&body, &a64, 1, &loss),
        &first_and_second_order(&|a| f64_fn.call(a), &a64, 1, &loss),
    );
}

/// `step` traced on `args`: its graph holds one `fused` node and no `gone` one, and a call
/// gives the eager step's results to the bit. Returns the function, the eager results and
/// the graph's listing.
fn fused_to_the_bit<F>(
    step: &F,
    args: &[Tensor],
    fused: &str,
    gone: &[&str],
) -> (Function<'static>, Vec<Tensor>, String)
where
    F: Fn(&[Tensor]) -> ferroflow::Result<Vec<Tensor>> + Clone + Send + Sync + 'static,
{
    let f = Function::new(step.clone());
    let c = f.get_concrete_function(args).unwrap();
    let (kinds, listing) = (op_kinds(&c), c.graph().listing());
    assert_eq!(kinds.iter().filter(|k| *k == fused).count(), 1, "{listing}");
    assert!(
        !kinds.iter().any(|k| gone.contains(&k.as_str())),
        "{listing}"
    );
    let (eager, traced) = (step(args).unwrap(), f.call(args).unwrap());
    assert_eq!(eager.len(), traced.len());
    for (e, t) in eager.iter().zip(&traced) {
        assert_eq!(e.shape(), t.shape());
        assert_eq!(bits(e), bits(t), "{listing}");
    }
    (f, eager, listing)
}

/// A convolution's ReLU and bias under a max pooling, differentiated in a graph: the
/// pooling gradient and the ReLU/bias gradient below it are one
/// `max_pool_bias_activation_grad` node, and every result equals the eager step's to the
/// bit. A pooling gradient that something else reads too stays as it was.
#[test]
fn a_pooling_gradient_with_the_relu_and_bias_gradients_below_is_one_kernel() {
    use ferroflow::{FusedActivation, Padding, PoolKind};
    ferroflow::init();
    // a = [x, filter, bias, dense weights]; 2x2 pooling of 10x10 maps (and one of 9x9:
    // the last row and column in no window).
    let step = |a: &[Tensor]| -> ferroflow::Result<Vec<Tensor>> {
        let tape = GradientTape::new();
        for v in &a[1..] {
            tape.watch(v);
        }
        let h = a[0].fused_conv2d(
            &a[1],
            &a[2],
            FusedActivation::Relu,
            [1, 1],
            Padding::Valid,
            [1, 1],
        )?;
        let p = h.pool2d(PoolKind::MaxPool2d, [2, 2], [2, 2], Padding::Valid)?;
        let flat = p.reshape_to(&[p.shape()[0], p.num_elements() / p.shape()[0]])?;
        let loss = flat.matmul(&a[3])?.square()?.reduce_sum(Axes::All, false)?;
        let g = tape.gradient(&loss, &[(&a[1]).into(), (&a[2]).into(), (&a[3]).into()])?;
        let mut out = vec![loss];
        out.extend(g.into_iter().map(|g| g.unwrap()));
        Ok(out)
    };
    for (size, seed) in [(12usize, 31u64), (11, 47)] {
        let pooled = (size - 2) / 2;
        let args = [
            f32s(&[3, size, size, 2], seed),
            f32s(&[3, 3, 2, 8], seed + 1),
            f32s(&[8], seed + 2),
            f32s(&[pooled * pooled * 8, 4], seed + 3),
        ];
        fused_to_the_bit(
            &step,
            &args,
            "max_pool_bias_activation_grad",
            &["max_pool_grad", "bias_activation_grad"],
        );
    }
    // The pooling gradient returned as well: both ops stay.
    let both = Function::new(|a: &[Tensor]| -> ferroflow::Result<Vec<Tensor>> {
        let g = a[0].max_pool_grad(&a[1], [2, 2], [2, 2], Padding::Valid)?;
        let (dx, db) = g.bias_activation_grad(&a[0], FusedActivation::Relu)?;
        Ok(vec![dx, db, g])
    });
    let args = [
        f32s(&[2, 4, 4, 3], 5).relu().unwrap(),
        f32s(&[2, 2, 2, 3], 6),
    ];
    let kinds = op_kinds(&both.get_concrete_function(&args).unwrap());
    assert!(
        kinds.iter().any(|k| k == "max_pool_grad")
            && kinds.iter().any(|k| k == "bias_activation_grad"),
        "{kinds:?}"
    );
}

/// A fused convolution under a max pooling, traced: one `fused_conv2d_max_pool` node gives
/// the convolution's output (returned too) and its pooling, each equal to the eager ops'
/// to the bit; a max pooling of a plain convolution stays as it is. A tape outside the
/// function differentiates the call through the fused node (gradients reaching both of its
/// outputs), to the bit of the eager gradients.
#[test]
fn a_max_pooling_of_a_fused_convolution_is_one_kernel() {
    use ferroflow::{FusedActivation, Padding};
    ferroflow::init();
    // a = [x, filter, bias]; 2x2 pooling of 10x10 maps (and of 9x9: the last row and
    // column in no window).
    let forward = |a: &[Tensor]| -> ferroflow::Result<Vec<Tensor>> {
        let h = a[0].fused_conv2d(
            &a[1],
            &a[2],
            FusedActivation::Relu,
            [1, 1],
            Padding::Valid,
            [1, 1],
        )?;
        let p = h.max_pool2d([2, 2], [2, 2], Padding::Valid)?;
        Ok(vec![h, p])
    };
    for (size, seed) in [(12usize, 61u64), (11, 67)] {
        let args = [
            f32s(&[3, size, size, 2], seed),
            f32s(&[3, 3, 2, 8], seed + 1),
            f32s(&[8], seed + 2),
        ];
        let (f, eager, listing) = fused_to_the_bit(
            &forward,
            &args,
            "fused_conv2d_max_pool",
            &["fused_conv2d", "max_pool2d"],
        );
        // A tape outside: a loss of both outputs, differentiated through the call.
        let (wh, wp) = (
            f32s(eager[0].shape(), seed + 3),
            f32s(eager[1].shape(), seed + 4),
        );
        let gradients = |run: &dyn Fn(&[Tensor]) -> ferroflow::Result<Vec<Tensor>>| {
            let tape = GradientTape::new();
            args.iter().for_each(|a| tape.watch(a));
            let out = run(&args).unwrap();
            let loss = out[0]
                .mul(&wh)
                .unwrap()
                .reduce_sum(Axes::All, false)
                .unwrap()
                .add(
                    &out[1]
                        .mul(&wp)
                        .unwrap()
                        .reduce_sum(Axes::All, false)
                        .unwrap(),
                )
                .unwrap();
            let sources: Vec<_> = args.iter().map(|a| a.into()).collect();
            tape.gradient(&loss, &sources).unwrap()
        };
        let (want, got) = (gradients(&forward), gradients(&|a| f.call(a)));
        for (w, g) in want.iter().zip(&got) {
            let (w, g) = (w.as_ref().unwrap(), g.as_ref().unwrap());
            assert_eq!(bits(w), bits(g), "{listing}");
        }
    }
    // A plain convolution's pooling: no fused convolution to join.
    let plain = Function::new(|a: &[Tensor]| -> ferroflow::Result<Vec<Tensor>> {
        let h = a[0].conv2d(&a[1], [1, 1], Padding::Valid, [1, 1])?;
        Ok(vec![h.max_pool2d([2, 2], [2, 2], Padding::Valid)?])
    });
    let args = [f32s(&[2, 6, 6, 2], 5), f32s(&[3, 3, 2, 4], 6)];
    let kinds = op_kinds(&plain.get_concrete_function(&args).unwrap());
    assert!(
        kinds.iter().any(|k| k == "conv2d") && kinds.iter().any(|k| k == "max_pool2d"),
        "{kinds:?}"
    );
}
