//! `SharedOptimizer`: an optimizer step inside a graph function is one host step of the
//! graph, so a traced training step equals the eager one bit for bit, schedules, clipping
//! and a dynamic loss scale (skipped steps included) following every call.

use ferroflow::autodiff::{GradientTape, Source};
use ferroflow::function::{Function, NodeKind};
use ferroflow::optim::*;
use ferroflow::{random, Axes, DType, Error, Tensor, Variable};

/// A two-layer regression model's weights.
struct Model {
    w1: Variable,
    b1: Variable,
    w2: Variable,
}

impl Model {
    fn new() -> Model {
        let init = |shape: &[usize], seed: u64| {
            random::stateless_normal(shape, [seed, 9], 0.0, 0.5, DType::F32).unwrap()
        };
        Model {
            w1: Variable::new("w1", init(&[4, 8], 1)),
            b1: Variable::new("b1", init(&[8], 2)),
            w2: Variable::new("w2", init(&[8, 1], 3)),
        }
    }
    fn vars(&self) -> Vec<Variable> {
        vec![self.w1.clone(), self.b1.clone(), self.w2.clone()]
    }
    fn loss(&self, x: &Tensor, y: &Tensor) -> ferroflow::Result<Tensor> {
        let h = x.matmul(&self.w1.value())?.add(&self.b1.value())?.relu()?;
        h.matmul(&self.w2.value())?
            .squared_difference(y)?
            .reduce_mean(Axes::All, false)
    }
    fn bits(&self) -> Vec<Vec<u32>> {
        self.vars()
            .iter()
            .map(|v| {
                v.peek()
                    .to_vec::<f32>()
                    .unwrap()
                    .iter()
                    .map(|x| x.to_bits())
                    .collect()
            })
            .collect()
    }
}

/// Batch `step`: inputs and targets; `poison` puts an infinity in the inputs (its
/// gradients are then non-finite).
fn batch(step: u64, poison: bool) -> (Tensor, Tensor) {
    let x = random::stateless_normal(&[16, 4], [step, 1], 0.0, 1.0, DType::F32).unwrap();
    let y = random::stateless_normal(&[16, 1], [step, 2], 0.0, 1.0, DType::F32).unwrap();
    let x = if poison {
        let mut v = x.to_vec::<f32>().unwrap();
        v[5] = f32::INFINITY;
        Tensor::from_vec(v, &[16, 4]).unwrap()
    } else {
        x
    };
    (x, y)
}

/// Adam with a decaying learning rate, clipping and weight decay: every per-step scalar
/// moves between calls.
fn adam() -> Adam {
    let lr = ExponentialDecay {
        initial_learning_rate: 0.05,
        decay_steps: 3.0,
        decay_rate: 0.5,
        staircase: false,
    };
    Adam::adamw(lr, 0.01).global_clipnorm(1.0)
}

fn slot_bits(opt: &dyn Optimizer, model: &Model) -> Vec<Vec<u32>> {
    let mut out = vec![];
    for v in model.vars() {
        for name in ["m", "v"] {
            let s = opt.get_slot(&v, name).expect("slot");
            out.push(
                s.peek()
                    .to_vec::<f32>()
                    .unwrap()
                    .iter()
                    .map(|x| x.to_bits())
                    .collect(),
            );
        }
    }
    out
}

#[test]
fn a_traced_step_with_the_optimizer_inside_equals_eager_steps() {
    ferroflow::init();
    let steps = 12;
    // Eager, a plain optimizer.
    let eager = Model::new();
    let mut eager_opt = adam();
    for s in 0..steps {
        let (x, y) = batch(s, false);
        let tape = GradientTape::new();
        let loss = eager.loss(&x, &y).unwrap();
        eager_opt.minimize(&loss, &eager.vars(), &tape).unwrap();
    }
    // The whole step, optimizer included, as one graph function.
    let traced = Model::new();
    let opt = SharedOptimizer::new(adam());
    let vars = traced.vars();
    let step = Function::new(|a: &[Tensor]| {
        let tape = GradientTape::new();
        let loss = traced.loss(&a[0], &a[1])?;
        opt.minimize(&loss, &vars, &tape)?;
        Ok(vec![loss])
    });
    for s in 0..steps {
        let (x, y) = batch(s, false);
        step.call(&[x, y]).unwrap();
    }
    assert_eq!(step.tracing_count(), 1);
    assert_eq!(opt.iterations(), steps as i64);
    assert_eq!(traced.bits(), eager.bits(), "weights");
    assert_eq!(
        slot_bits(&**opt.lock(), &traced),
        slot_bits(&eager_opt, &eager),
        "slots"
    );
    // The step is one host node of the graph; the forward and backward are graph ops.
    let (x, y) = batch(0, false);
    let c = step.get_concrete_function(&[x, y]).unwrap();
    let host = c
        .graph()
        .nodes
        .iter()
        .filter(|n| matches!(&n.kind, NodeKind::HostCall(h) if h.name() == "AdamW/apply_gradients"))
        .count();
    assert_eq!(host, 1, "{}", c.graph().listing());
    assert!(c.stats().ops > 5, "{}", c.graph().listing());
}

#[test]
fn a_dynamic_loss_scale_in_a_traced_step_skips_and_moves_as_eagerly() {
    ferroflow::init();
    let steps = 10;
    let poisoned = |s: u64| s == 2 || s == 3 || s == 7;
    let make = || {
        LossScaleOptimizer::new(
            Box::new(Sgd::new(0.05).with_momentum(0.9, false)),
            LossScale::Dynamic {
                initial_scale: 1024.0,
                growth_steps: 2,
            },
        )
        .unwrap()
    };
    let eager = Model::new();
    let mut eager_opt = make();
    let mut eager_scales = vec![];
    for s in 0..steps {
        let (x, y) = batch(s, poisoned(s));
        let tape = GradientTape::new();
        let loss = eager.loss(&x, &y).unwrap();
        eager_opt.minimize(&loss, &eager.vars(), &tape).unwrap();
        eager_scales.push(eager_opt.current_loss_scale());
    }
    let traced = Model::new();
    let opt = SharedOptimizer::new(make());
    let vars = traced.vars();
    let step = Function::new(|a: &[Tensor]| {
        let tape = GradientTape::new();
        let loss = traced.loss(&a[0], &a[1])?;
        // TF's custom-loop form: scale, differentiate, unscale, apply.
        let scaled = opt.get_scaled_loss(&loss)?;
        let sources: Vec<Source> = vars.iter().map(Source::from).collect();
        let grads = opt.get_unscaled_gradients(tape.gradient(&scaled, &sources)?)?;
        opt.apply_gradients(grads.into_iter().zip(vars.iter().cloned()).collect(), true)?;
        Ok(vec![scaled])
    });
    let mut traced_scales = vec![];
    for s in 0..steps {
        let (x, y) = batch(s, poisoned(s));
        step.call(&[x, y]).unwrap();
        traced_scales.push(opt.lock().loss_scale().unwrap());
    }
    assert_eq!(step.tracing_count(), 1);
    assert_eq!(traced_scales, eager_scales, "the scale moved differently");
    assert!(
        traced_scales.iter().any(|s| *s < 1024.0) && traced_scales.iter().any(|s| *s > 1024.0),
        "the run should both halve and double the scale: {traced_scales:?}"
    );
    assert_eq!(opt.iterations(), steps as i64);
    assert_eq!(traced.bits(), eager.bits());
}

#[test]
fn a_loss_scale_read_on_the_host_is_refused_in_a_trace_and_names_the_fix() {
    ferroflow::init();
    // (A plain optimizer's own step refuses the same way: function/tests/function.rs.)
    let lso = std::sync::Mutex::new(LossScaleOptimizer::dynamic(Box::new(Sgd::new(0.1))).unwrap());
    let scaled =
        Function::new(|a: &[Tensor]| Ok(vec![lso.lock().unwrap().get_scaled_loss(&a[0])?]));
    let (x, _) = batch(0, false);
    match scaled.call(&[x]) {
        Err(Error::NotTraceable { op, msg }) => {
            assert_eq!(op, "get_scaled_loss");
            assert!(msg.contains("SharedOptimizer"), "{msg}");
        }
        other => panic!("expected NotTraceable, got {other:?}"),
    }
}
