//! Each optimizer's trajectory over several steps against TF 2.4's update equations,
//! written out here in plain f64; the pipeline's order (aggregator, transformers, clipping);
//! schedules; and the loss-scale state machine.

use ferroflow::autodiff::GradientTape;
use ferroflow::optim::*;
use ferroflow::{Tensor, Variable};
use std::sync::{Arc, Mutex};

const W0: [f64; 3] = [0.5, -1.0, 2.0];

fn grads(step: usize) -> [f64; 3] {
    // Varying signs and magnitudes, including a zero.
    [
        0.3 - 0.1 * step as f64,
        -0.7 + 0.2 * step as f64,
        if step == 2 {
            0.0
        } else {
            1.5 / (step as f64 + 1.0)
        },
    ]
}

fn var() -> Variable {
    Variable::new("w", Tensor::from_slice(&W0).unwrap())
}

fn run(opt: &mut dyn Optimizer, steps: usize) -> Vec<f64> {
    ferroflow::init();
    let v = var();
    for s in 0..steps {
        let g = Tensor::from_slice(&grads(s)).unwrap();
        opt.apply_gradients(vec![(Some(g), v.clone())], true)
            .unwrap();
    }
    assert_eq!(opt.iterations(), steps as i64);
    v.peek().to_vec::<f64>().unwrap()
}

fn assert_close(name: &str, got: &[f64], want: &[f64]) {
    for (i, (a, b)) in got.iter().zip(want).enumerate() {
        assert!(
            (a - b).abs() <= 1e-12 * (1.0 + b.abs()),
            "{name}: w[{i}] = {a}, reference {b}"
        );
    }
}

#[test]
fn sgd_plain_momentum_and_nesterov_follow_tf_equations() {
    for (momentum, nesterov) in [(0.0, false), (0.9, false), (0.9, true)] {
        let lr = 0.05;
        let mut w = W0.to_vec();
        let mut v = [0.0; 3];
        for s in 0..5 {
            let g = grads(s);
            for i in 0..3 {
                if momentum == 0.0 {
                    w[i] -= lr * g[i];
                } else {
                    // v = m v - lr g; w += v (nesterov: w += m v - lr g)
                    v[i] = momentum * v[i] - lr * g[i];
                    w[i] += if nesterov {
                        momentum * v[i] - lr * g[i]
                    } else {
                        v[i]
                    };
                }
            }
        }
        let mut opt = Sgd::new(lr).with_momentum(momentum, nesterov);
        assert_close(
            &format!("SGD m={momentum} nesterov={nesterov}"),
            &run(&mut opt, 5),
            &w,
        );
    }
}

#[test]
fn adam_and_amsgrad_and_adamw_follow_their_equations() {
    for (amsgrad, wd) in [(false, 0.0), (true, 0.0), (false, 0.01)] {
        let (lr, b1, b2, eps): (f64, f64, f64, f64) = (0.01, 0.9, 0.999, 1e-7);
        let mut w = W0.to_vec();
        let (mut m, mut v, mut vh) = ([0.0; 3], [0.0; 3], [0.0f64; 3]);
        for s in 0..6 {
            let g = grads(s);
            let t = (s + 1) as f64;
            let lr_t = lr * (1.0 - b2.powf(t)).sqrt() / (1.0 - b1.powf(t));
            for i in 0..3 {
                m[i] = b1 * m[i] + (1.0 - b1) * g[i];
                v[i] = b2 * v[i] + (1.0 - b2) * g[i] * g[i];
                vh[i] = vh[i].max(v[i]);
                let denom = if amsgrad { vh[i] } else { v[i] };
                let decayed = w[i] - lr * wd * w[i];
                w[i] = decayed - lr_t * m[i] / (denom.sqrt() + eps);
            }
        }
        let mut opt = if wd > 0.0 {
            Adam::adamw(lr, wd)
        } else {
            Adam::new(lr)
        };
        opt.amsgrad = amsgrad;
        assert_close(
            &format!("Adam amsgrad={amsgrad} wd={wd}"),
            &run(&mut opt, 6),
            &w,
        );
        assert_eq!(opt.name(), if wd > 0.0 { "AdamW" } else { "Adam" });
    }
}

#[test]
fn rmsprop_plain_centered_and_momentum_follow_tf_equations() {
    for (centered, momentum) in [(false, 0.0), (true, 0.0), (false, 0.5), (true, 0.5)] {
        let (lr, rho, eps) = (0.01, 0.9, 1e-7);
        let mut w = W0.to_vec();
        let (mut ms, mut mg, mut mom) = ([0.0; 3], [0.0; 3], [0.0; 3]);
        for s in 0..5 {
            let g = grads(s);
            for i in 0..3 {
                ms[i] = rho * ms[i] + (1.0 - rho) * g[i] * g[i];
                mg[i] = rho * mg[i] + (1.0 - rho) * g[i];
                let denom = if centered {
                    ms[i] - mg[i] * mg[i]
                } else {
                    ms[i]
                };
                // TF 2.4: ε inside the root in the momentum kernels, outside it in the
                // Python update without momentum.
                if momentum > 0.0 {
                    mom[i] = momentum * mom[i] + lr * g[i] / (denom + eps).sqrt();
                    w[i] -= mom[i];
                } else {
                    w[i] -= lr * g[i] / (denom.sqrt() + eps);
                }
            }
        }
        let mut opt = RmsProp::new(lr);
        opt.centered = centered;
        opt.momentum = momentum.into();
        assert_close(
            &format!("RMSprop centered={centered} momentum={momentum}"),
            &run(&mut opt, 5),
            &w,
        );
    }
}

#[test]
fn adagrad_follows_tf_equations_with_its_initial_accumulator() {
    let (lr, eps) = (0.1, 1e-7);
    let mut w = W0.to_vec();
    let mut acc = [0.1; 3];
    for s in 0..5 {
        let g = grads(s);
        for i in 0..3 {
            acc[i] += g[i] * g[i];
            w[i] -= lr * g[i] / (acc[i].sqrt() + eps);
        }
    }
    assert_close("Adagrad", &run(&mut Adagrad::new(lr), 5), &w);
}

#[test]
fn pipeline_aggregates_then_clips_or_transforms() {
    ferroflow::init();
    let order = Arc::new(Mutex::new(Vec::<String>::new()));
    let doubling_aggregator = |order: Arc<Mutex<Vec<String>>>| -> GradientTransformer {
        // Doubles (standing in for a sum over two replicas).
        Arc::new(move |pairs| {
            order.lock().unwrap().push("aggregate".into());
            pairs
                .into_iter()
                .map(|(g, v)| Ok((g.mul(&g.scalar_like(2.0)?)?, v)))
                .collect()
        })
    };
    let mut opt = Sgd::new(1.0);
    opt.core_mut().gradient_aggregator = Some(doubling_aggregator(order.clone()));
    let o2 = order.clone();
    opt.core_mut()
        .gradient_transformers
        .push(Arc::new(move |pairs| {
            o2.lock().unwrap().push(format!(
                "transform sees {:?}",
                pairs[0].0.to_vec::<f64>().unwrap()
            ));
            Ok(pairs)
        }));
    let v = Variable::new("w", Tensor::from_slice(&[0.0f64, 0.0]).unwrap());
    let g = || Some(Tensor::from_slice(&[0.3f64, -4.0]).unwrap());
    opt.apply_gradients(vec![(g(), v.clone())], true).unwrap();
    assert_eq!(
        *order.lock().unwrap(),
        vec![
            "aggregate".to_string(),
            "transform sees [0.6, -8.0]".to_string()
        ]
    );
    assert_eq!(v.peek().to_vec::<f64>().unwrap(), vec![-0.6, 8.0]);
    // A clip option beside transformers is refused, as TF 2.4 refuses it; nothing moves.
    opt.core_mut().clipvalue = Some(1.0);
    let err = opt
        .apply_gradients(vec![(g(), v.clone())], true)
        .unwrap_err()
        .to_string();
    assert!(
        err.contains("clipvalue") && err.contains("gradient_transformers"),
        "{err}"
    );
    assert_eq!(
        (v.peek().to_vec::<f64>().unwrap(), opt.iterations()),
        (vec![-0.6, 8.0], 1)
    );
    // clipvalue acts after aggregation: 2·[0.3, -4] = [0.6, -8] clips to [0.6, -1].
    let mut opt = Sgd::new(1.0);
    opt.core_mut().gradient_aggregator = Some(doubling_aggregator(order.clone()));
    opt.core_mut().clipvalue = Some(1.0);
    let v = Variable::new("w", Tensor::from_slice(&[0.0f64, 0.0]).unwrap());
    opt.apply_gradients(vec![(g(), v.clone())], true).unwrap();
    assert_eq!(v.peek().to_vec::<f64>().unwrap(), vec![-0.6, 1.0]);
    // aggregate = false skips the aggregator (the caller already reduced).
    opt.apply_gradients(
        vec![(Some(Tensor::from_slice(&[0.3f64, 0.0]).unwrap()), v.clone())],
        false,
    )
    .unwrap();
    assert_close(
        "aggregate=false",
        &v.peek().to_vec::<f64>().unwrap(),
        &[-0.6 - 0.3, 1.0],
    );
    // TF 2.4's other refusals: clipnorm with global_clipnorm, a negative decay or clip.
    for (bad, what) in [
        (
            serde_json::json!({"name": "SGD", "learning_rate": 0.1, "clipnorm": 1.0, "global_clipnorm": 1.0}),
            "global_clipnorm",
        ),
        (
            serde_json::json!({"name": "Adam", "learning_rate": 0.1, "decay": -0.5}),
            "decay",
        ),
        (
            serde_json::json!({"name": "SGD", "learning_rate": 0.1, "clipvalue": -1.0}),
            "clipvalue",
        ),
    ] {
        let err = from_config(&bad).err().expect("refused").to_string();
        assert!(err.contains(what), "{bad}: {err}");
    }
}

#[test]
fn legacy_decay_divides_the_learning_rate_by_one_plus_decay_times_the_step() {
    ferroflow::init();
    // SGD, lr 1, decay 0.5, gradient 1: steps subtract 1/(1+0), 1/(1+0.5), 1/(1+1).
    let mut opt = Sgd::new(1.0);
    opt.core_mut().decay = 0.5;
    let v = Variable::new("w", Tensor::from_slice(&[0.0f64]).unwrap());
    let mut want = 0.0;
    for step in 0..3 {
        opt.apply_gradients(
            vec![(Some(Tensor::from_slice(&[1.0f64]).unwrap()), v.clone())],
            true,
        )
        .unwrap();
        want -= 1.0 / (1.0 + 0.5 * step as f64);
        assert_eq!(v.peek().to_vec::<f64>().unwrap(), vec![want]);
    }
    // Part of the config, both ways; Nadam's `decay` is its momentum schedule's.
    let cfg = get_config(&opt).unwrap();
    assert_eq!(cfg["decay"], 0.5);
    assert_eq!(from_config(&cfg).unwrap().core().decay, 0.5);
    let nadam = get_config(&Nadam::new(0.1)).unwrap();
    assert_eq!(nadam["decay"], 0.004);
    assert_eq!(from_config(&nadam).unwrap().core().decay, 0.0);
}

#[test]
fn clipnorm_and_global_clipnorm_scale_to_the_norm() {
    ferroflow::init();
    // g = [3, 4] has norm 5: clipnorm 1 gives [0.6, 0.8]; global over [3,4] and [12] (norm 13)
    // with 6.5 halves both.
    let mut opt = Sgd::new(1.0);
    opt.core_mut().clipnorm = Some(1.0);
    let v = Variable::new("w", Tensor::from_slice(&[0.0f64, 0.0]).unwrap());
    opt.apply_gradients(
        vec![(Some(Tensor::from_slice(&[3.0f64, 4.0]).unwrap()), v.clone())],
        true,
    )
    .unwrap();
    let w = v.peek().to_vec::<f64>().unwrap();
    assert!(
        (w[0] + 0.6).abs() < 1e-12 && (w[1] + 0.8).abs() < 1e-12,
        "{w:?}"
    );
    let mut opt = Sgd::new(1.0);
    opt.core_mut().global_clipnorm = Some(6.5);
    let a = Variable::new("a", Tensor::from_slice(&[0.0f64, 0.0]).unwrap());
    let b = Variable::new("b", Tensor::from_slice(&[0.0f64]).unwrap());
    opt.apply_gradients(
        vec![
            (Some(Tensor::from_slice(&[3.0f64, 4.0]).unwrap()), a.clone()),
            (Some(Tensor::from_slice(&[12.0f64]).unwrap()), b.clone()),
        ],
        true,
    )
    .unwrap();
    assert_eq!(a.peek().to_vec::<f64>().unwrap(), vec![-1.5, -2.0]);
    assert_eq!(b.peek().to_vec::<f64>().unwrap(), vec![-6.0]);
}

#[test]
fn none_gradients_are_skipped_and_mismatches_are_errors_naming_the_variable() {
    ferroflow::init();
    let mut opt = Sgd::new(0.1);
    let a = Variable::new("layer/kernel", Tensor::from_slice(&[1.0f64, 1.0]).unwrap());
    let b = Variable::new("unused", Tensor::from_slice(&[1.0f64]).unwrap());
    opt.apply_gradients(
        vec![
            (Some(Tensor::from_slice(&[1.0f64, 2.0]).unwrap()), a.clone()),
            (None, b.clone()),
        ],
        true,
    )
    .unwrap();
    assert_eq!(b.peek().to_vec::<f64>().unwrap(), vec![1.0]);
    let e = opt
        .apply_gradients(
            vec![(Some(Tensor::from_slice(&[1.0f64]).unwrap()), a.clone())],
            true,
        )
        .unwrap_err()
        .to_string();
    assert!(e.contains("layer/kernel"), "{e}");
    let e = opt
        .apply_gradients(
            vec![(Some(Tensor::from_slice(&[1.0f32, 1.0]).unwrap()), a)],
            true,
        )
        .unwrap_err()
        .to_string();
    assert!(e.contains("float32") && e.contains("float64"), "{e}");
}

#[test]
fn schedules_match_their_formulas() {
    let e = ExponentialDecay {
        initial_learning_rate: 0.1,
        decay_steps: 10.0,
        decay_rate: 0.5,
        staircase: false,
    };
    assert!((e.at(5) - 0.1 * 0.5f64.powf(0.5)).abs() < 1e-15);
    let es = ExponentialDecay {
        staircase: true,
        ..e.clone()
    };
    assert_eq!((es.at(9), es.at(10)), (0.1, 0.05));
    let p = PiecewiseConstantDecay {
        boundaries: vec![10, 20],
        values: vec![1.0, 0.5, 0.1],
    };
    assert_eq!(
        (p.at(0), p.at(10), p.at(11), p.at(20), p.at(21)),
        (1.0, 1.0, 0.5, 0.5, 0.1)
    );
    let poly = PolynomialDecay {
        initial_learning_rate: 1.0,
        decay_steps: 10.0,
        end_learning_rate: 0.0,
        power: 2.0,
        cycle: false,
    };
    assert!((poly.at(5) - 0.25).abs() < 1e-15 && poly.at(50) == 0.0);
    let cyc = PolynomialDecay {
        cycle: true,
        ..poly.clone()
    };
    assert!((cyc.at(15) - 0.0625).abs() < 1e-15, "{}", cyc.at(15)); // decay_steps becomes 20
    let inv = InverseTimeDecay {
        initial_learning_rate: 1.0,
        decay_steps: 1.0,
        decay_rate: 0.5,
        staircase: false,
    };
    assert!((inv.at(2) - 0.5).abs() < 1e-15);
    let cos = CosineDecay {
        initial_learning_rate: 1.0,
        decay_steps: 10.0,
        alpha: 0.1,
    };
    assert!((cos.at(5) - 0.55).abs() < 1e-15 && (cos.at(10) - 0.1).abs() < 1e-15);
    // SGDR, t_mul 2: periods [0,10), [10,30); m_mul 0.5 halves the second peak.
    let r = CosineDecayRestarts {
        initial_learning_rate: 1.0,
        first_decay_steps: 10.0,
        t_mul: 2.0,
        m_mul: 0.5,
        alpha: 0.0,
    };
    assert!(
        (r.at(0) - 1.0).abs() < 1e-12
            && (r.at(10) - 0.5).abs() < 1e-12
            && (r.at(20) - 0.25).abs() < 1e-12,
        "{} {} {}",
        r.at(0),
        r.at(10),
        r.at(20)
    );
    // A schedule drives the optimizer through `iterations`.
    ferroflow::init();
    let mut opt = Sgd::new(p.clone());
    let v = Variable::new("w", Tensor::scalar(0.0f64).unwrap());
    for _ in 0..12 {
        opt.apply_gradients(
            vec![(Some(Tensor::scalar(1.0f64).unwrap()), v.clone())],
            true,
        )
        .unwrap();
    }
    // steps 0..=10 use 1.0 (11 steps), step 11 uses 0.5
    assert_eq!(v.peek().item::<f64>().unwrap(), -11.5);
}

#[test]
fn loss_scale_state_machine_step_by_step() {
    ferroflow::init();
    let v = Variable::new("w", Tensor::from_slice(&[1.0f32]).unwrap());
    let mut opt = LossScaleOptimizer::new(
        Box::new(Sgd::new(1.0)),
        LossScale::Dynamic {
            initial_scale: 32768.0,
            growth_steps: 3,
        },
    )
    .unwrap();
    assert_eq!(opt.current_loss_scale(), 32768.0);
    let finite = || Some(Tensor::from_slice(&[0.5f32]).unwrap());
    let overflow = || Some(Tensor::from_slice(&[f32::INFINITY]).unwrap());
    // Overflow: halve, skip the update, iterations still advance.
    opt.apply_gradients(vec![(overflow(), v.clone())], true)
        .unwrap();
    assert_eq!(
        (opt.current_loss_scale(), opt.good_steps(), opt.iterations()),
        (16384.0, 0, 1)
    );
    assert_eq!(v.peek().to_vec::<f32>().unwrap(), vec![1.0]);
    // Three finite steps: applied, then the scale doubles.
    for k in 1..=3 {
        opt.apply_gradients(vec![(finite(), v.clone())], true)
            .unwrap();
        assert_eq!(opt.good_steps(), if k == 3 { 0 } else { k });
    }
    assert_eq!((opt.current_loss_scale(), opt.iterations()), (32768.0, 4));
    assert_eq!(v.peek().to_vec::<f32>().unwrap(), vec![-0.5]);
    // NaN also halves; the scale never goes below 1.
    let mut tiny = LossScaleOptimizer::new(Box::new(Sgd::new(1.0)), LossScale::dynamic()).unwrap();
    tiny.set_state(1.0, 5);
    tiny.apply_gradients(
        vec![(Some(Tensor::from_slice(&[f32::NAN]).unwrap()), v.clone())],
        true,
    )
    .unwrap();
    assert_eq!((tiny.current_loss_scale(), tiny.good_steps()), (1.0, 0));
    // A fixed scale never moves and applies every step, even a non-finite one (TF 2.4
    // skips only under a dynamic scale); wrapping a LossScaleOptimizer is refused.
    let mut fixed =
        LossScaleOptimizer::new(Box::new(Sgd::new(1.0)), LossScale::Fixed(128.0)).unwrap();
    let u = Variable::new("u", Tensor::from_slice(&[1.0f32]).unwrap());
    fixed
        .apply_gradients(vec![(finite(), u.clone())], true)
        .unwrap();
    assert_eq!(u.peek().to_vec::<f32>().unwrap(), vec![0.5]);
    fixed
        .apply_gradients(vec![(overflow(), u.clone())], true)
        .unwrap();
    assert_eq!((fixed.current_loss_scale(), fixed.iterations()), (128.0, 2));
    assert_eq!(u.peek().to_vec::<f32>().unwrap(), vec![f32::NEG_INFINITY]);
    assert!(LossScaleOptimizer::dynamic(Box::new(fixed)).is_err());
    // The dynamic scale starts where asked and grows after the steps asked.
    let mut custom = LossScaleOptimizer::new(
        Box::new(Sgd::new(1.0)),
        LossScale::Dynamic {
            initial_scale: 4.0,
            growth_steps: 2,
        },
    )
    .unwrap();
    assert_eq!(custom.current_loss_scale(), 4.0);
    for _ in 0..2 {
        custom
            .apply_gradients(vec![(finite(), u.clone())], true)
            .unwrap();
    }
    assert_eq!(custom.current_loss_scale(), 8.0);
    // Bad arguments are errors naming them.
    for (mode, what) in [
        (LossScale::Fixed(0.0), "initial_scale"),
        (
            LossScale::Dynamic {
                initial_scale: f64::INFINITY,
                growth_steps: 5,
            },
            "initial_scale",
        ),
        (
            LossScale::Dynamic {
                initial_scale: 2.0,
                growth_steps: 0,
            },
            "dynamic_growth_steps",
        ),
    ] {
        let err = LossScaleOptimizer::new(Box::new(Sgd::new(1.0)), mode)
            .err()
            .expect("refused")
            .to_string();
        assert!(err.contains(what), "{mode:?}: {err}");
    }
    // The scale state is part of the checkpoint.
    let saved = opt.weights().unwrap();
    let mut restored = LossScaleOptimizer::new(
        Box::new(Sgd::new(1.0)),
        LossScale::Dynamic {
            initial_scale: 32768.0,
            growth_steps: 3,
        },
    )
    .unwrap();
    opt.apply_gradients(vec![(overflow(), v.clone())], true)
        .unwrap();
    restored.set_weights(saved).unwrap();
    assert_eq!(
        (
            restored.current_loss_scale(),
            restored.good_steps(),
            restored.iterations()
        ),
        (32768.0, 0, 4)
    );
}

#[test]
fn loss_scale_config_has_tf_2_4_arguments() {
    ferroflow::init();
    let lso = LossScaleOptimizer::new(
        Box::new(Sgd::new(0.1)),
        LossScale::Dynamic {
            initial_scale: 256.0,
            growth_steps: 10,
        },
    )
    .unwrap();
    let cfg = get_config(&lso).unwrap();
    assert_eq!(
        (
            &cfg["dynamic"],
            &cfg["initial_scale"],
            &cfg["dynamic_growth_steps"]
        ),
        (
            &serde_json::json!(true),
            &serde_json::json!(256.0),
            &serde_json::json!(10)
        )
    );
    assert_eq!(
        get_config(from_config(&cfg).unwrap().as_ref()).unwrap(),
        cfg
    );
    let fixed = LossScaleOptimizer::new(Box::new(Sgd::new(0.1)), LossScale::Fixed(64.0)).unwrap();
    let cfg = get_config(&fixed).unwrap();
    assert_eq!(cfg["dynamic_growth_steps"], serde_json::Value::Null);
    assert_eq!(from_config(&cfg).unwrap().loss_scale(), Some(64.0));
    // TF's defaults and refusals.
    let inner = get_config(&Sgd::new(0.1)).unwrap();
    let dynamic =
        from_config(&serde_json::json!({"name": "LossScaleOptimizer", "inner_optimizer": inner}))
            .unwrap();
    assert_eq!(dynamic.loss_scale_mode(), Some(LossScale::dynamic()));
    for (bad, what) in [
        (
            serde_json::json!({"name": "LossScaleOptimizer", "inner_optimizer": inner, "dynamic": false}),
            "initial_scale",
        ),
        (
            serde_json::json!({"name": "LossScaleOptimizer", "inner_optimizer": inner, "dynamic": false, "initial_scale": 8.0, "dynamic_growth_steps": 5}),
            "dynamic_growth_steps",
        ),
        (
            serde_json::json!({"name": "LossScaleOptimizer", "inner_optimizer": inner, "dynamic_growth_steps": 0}),
            "dynamic_growth_steps",
        ),
    ] {
        let err = from_config(&bad).err().expect("refused").to_string();
        assert!(err.contains(what), "{bad}: {err}");
    }
}

#[test]
fn loss_scale_minimize_scales_and_unscales() {
    ferroflow::init();
    // loss = w², dloss/dw = 2w = 4 at w = 2: the scaled loss's gradient is 4·2^15, unscaled 4.
    let v = Variable::new("w", Tensor::scalar(2.0f32).unwrap());
    let mut opt = LossScaleOptimizer::dynamic(Box::new(Sgd::new(0.25))).unwrap();
    let tape = GradientTape::new();
    let loss = v.value().square().unwrap();
    assert_eq!(
        opt.get_scaled_loss(&loss).unwrap().item::<f32>().unwrap(),
        4.0 * 32768.0
    );
    opt.minimize(&loss, std::slice::from_ref(&v), &tape)
        .unwrap();
    assert_eq!(v.peek().item::<f32>().unwrap(), 1.0); // 2 - 0.25·4
}

#[test]
fn adadelta_follows_tf_equations() {
    let (lr, rho, eps): (f64, f64, f64) = (1.0, 0.95, 1e-7);
    let mut w = W0.to_vec();
    let (mut acc, mut acc_u) = ([0.0; 3], [0.0; 3]);
    for s in 0..5 {
        let g = grads(s);
        for i in 0..3 {
            acc[i] = rho * acc[i] + (1.0 - rho) * g[i] * g[i];
            let u = (acc_u[i] + eps).sqrt() / (acc[i] + eps).sqrt() * g[i];
            acc_u[i] = rho * acc_u[i] + (1.0 - rho) * u * u;
            w[i] -= lr * u;
        }
    }
    assert_close("Adadelta", &run(&mut Adadelta::new(lr), 5), &w);
}

#[test]
fn adamax_follows_tf_equations() {
    let (lr, b1, b2, eps): (f64, f64, f64, f64) = (0.01, 0.9, 0.999, 1e-7);
    let mut w = W0.to_vec();
    let (mut m, mut u) = ([0.0; 3], [0.0f64; 3]);
    for s in 0..5 {
        let g = grads(s);
        let t = (s + 1) as f64;
        for i in 0..3 {
            m[i] = b1 * m[i] + (1.0 - b1) * g[i];
            u[i] = (b2 * u[i]).max(g[i].abs());
            w[i] -= lr / (1.0 - b1.powf(t)) * m[i] / (u[i] + eps);
        }
    }
    assert_close("Adamax", &run(&mut Adamax::new(lr), 5), &w);
}

#[test]
fn nadam_follows_keras_equations_with_the_momentum_schedule() {
    let (lr, b1, b2, eps): (f64, f64, f64, f64) = (0.01, 0.9, 0.999, 1e-7);
    // TF 2.4's `cast(0.96, var_dtype)` goes through float32 even for float64 variables.
    let mu = |t: f64| b1 * (1.0 - 0.5 * (0.96f32 as f64).powf(0.004 * t));
    let mut w = W0.to_vec();
    let (mut m, mut v) = ([0.0; 3], [0.0; 3]);
    // The running product S_t is kept in TF's float32 `momentum_cache`; each step uses the
    // cache times μ_t in the variable's dtype.
    let mut cache = 1.0f32;
    for s in 0..5 {
        let g = grads(s);
        let t = (s + 1) as f64;
        let sched = cache as f64 * mu(t);
        cache = sched as f32;
        let next = sched * mu(t + 1.0);
        for i in 0..3 {
            let g_prime = g[i] / (1.0 - sched);
            m[i] = b1 * m[i] + (1.0 - b1) * g[i];
            v[i] = b2 * v[i] + (1.0 - b2) * g[i] * g[i];
            let m_prime = m[i] / (1.0 - next);
            let v_prime = v[i] / (1.0 - b2.powf(t));
            let m_bar = (1.0 - mu(t)) * g_prime + mu(t + 1.0) * m_prime;
            w[i] -= lr * m_bar / (v_prime.sqrt() + eps);
        }
    }
    assert_close("Nadam", &run(&mut Nadam::new(lr), 5), &w);
}

#[test]
fn ftrl_follows_tf_equations_with_and_without_regularization() {
    for (l1, l2, shrink, beta) in [(0.0, 0.0, 0.0, 0.0), (0.05, 0.1, 0.02, 0.3)] {
        let (lr, p) = (0.1, -0.5f64);
        let mut w = W0.to_vec();
        let (mut n, mut z) = ([0.1f64; 3], [0.0; 3]);
        let l2a = l2 + beta / (2.0 * lr);
        for s in 0..5 {
            let g = grads(s);
            for i in 0..3 {
                let n_new = n[i] + g[i] * g[i];
                let sigma = (n_new.powf(-p) - n[i].powf(-p)) / lr;
                z[i] += g[i] + 2.0 * shrink * w[i] - sigma * w[i];
                let quad = n_new.powf(-p) / lr + 2.0 * l2a;
                w[i] = if z[i].abs() > l1 {
                    (z[i].signum() * l1 - z[i]) / quad
                } else {
                    0.0
                };
                n[i] = n_new;
            }
        }
        let mut opt = Ftrl::new(lr);
        opt.l1 = l1.into();
        opt.l2 = l2.into();
        opt.l2_shrinkage = shrink.into();
        opt.beta = beta.into();
        assert_close(&format!("Ftrl l1={l1}"), &run(&mut opt, 5), &w);
    }
}

/// Save after 4 steps, restore into a fresh optimizer and variable, run 4 more: the result is
/// bit-identical to 8 uninterrupted steps (for every optimizer with slots or step state).
#[test]
fn checkpointed_weights_resume_bit_identically() {
    ferroflow::init();
    type Maker = fn() -> Box<dyn Optimizer>;
    let makers: Vec<(&str, Maker)> = vec![
        ("sgd", || Box::new(Sgd::new(0.1).with_momentum(0.9, true))),
        ("adam", || Box::new(Adam::new(0.01))),
        ("amsgrad", || {
            let mut a = Adam::new(0.01);
            a.amsgrad = true;
            Box::new(a)
        }),
        ("rmsprop", || Box::new(RmsProp::new(0.01))),
        ("adagrad", || Box::new(Adagrad::new(0.1))),
        ("adadelta", || Box::new(Adadelta::new(1.0))),
        ("adamax", || Box::new(Adamax::new(0.01))),
        ("nadam", || Box::new(Nadam::new(0.01))),
        ("ftrl", || Box::new(Ftrl::new(0.1))),
    ];
    for (name, make) in makers {
        let step = |opt: &mut dyn Optimizer, v: &Variable, s: usize| {
            opt.apply_gradients(
                vec![(Some(Tensor::from_slice(&grads(s)).unwrap()), v.clone())],
                true,
            )
            .unwrap();
        };
        let straight = var();
        let mut a = make();
        for s in 0..8 {
            step(a.as_mut(), &straight, s);
        }
        let first = var();
        let mut b = make();
        for s in 0..4 {
            step(b.as_mut(), &first, s);
        }
        let saved_w = first.peek();
        let saved = b.core().weights().unwrap();
        let resumed = Variable::new("w", saved_w);
        let mut c = make();
        c.core_mut().set_weights(saved).unwrap();
        assert_eq!(c.iterations(), 4, "{name}");
        for s in 4..8 {
            step(c.as_mut(), &resumed, s);
        }
        assert_eq!(
            resumed.peek().to_vec::<f64>().unwrap(),
            straight.peek().to_vec::<f64>().unwrap(),
            "{name}"
        );
    }
}

#[test]
fn minimize_fn_takes_a_loss_closure_and_a_lazy_var_list() {
    ferroflow::init();
    let w = Variable::new("w", Tensor::scalar(3.0f64).unwrap());
    let mut opt = Sgd::new(0.25);
    let w2 = w.clone();
    // d/dw w² = 2w = 6: w becomes 3 - 0.25·6 = 1.5
    let loss = minimize_fn(&mut opt, || w.value().square(), move || vec![w2]).unwrap();
    assert_eq!(loss.item::<f64>().unwrap(), 9.0);
    assert_eq!(w.peek().item::<f64>().unwrap(), 1.5);
}

#[test]
fn every_optimizer_round_trips_through_get_config() {
    ferroflow::init();
    let mut adam = Adam::adamw(0.003, 0.01);
    adam.amsgrad = true;
    adam.core_mut().clipnorm = Some(1.5);
    let mut ftrl = Ftrl::new(0.2);
    ftrl.l1 = 0.01.into();
    let opts: Vec<Box<dyn Optimizer>> = vec![
        Box::new(Sgd::new(0.1).with_momentum(0.9, true)),
        Box::new(adam),
        Box::new(RmsProp::new(CosineDecay {
            initial_learning_rate: 0.1,
            decay_steps: 50.0,
            alpha: 0.0,
        })),
        Box::new(Adagrad::new(0.1)),
        Box::new(Adadelta::new(1.0)),
        Box::new({
            // Any hyperparameter may be a schedule, not only the learning rate.
            let mut a = Adamax::new(0.002);
            a.beta_1 = ExponentialDecay {
                initial_learning_rate: 0.9,
                decay_steps: 10.0,
                decay_rate: 0.99,
                staircase: false,
            }
            .into();
            a
        }),
        Box::new(Nadam::new(PiecewiseConstantDecay {
            boundaries: vec![5],
            values: vec![0.1, 0.01],
        })),
        Box::new(ftrl),
    ];
    for o in opts {
        let cfg = get_config(o.as_ref()).unwrap();
        let back = from_config(&cfg).unwrap();
        assert_eq!(get_config(back.as_ref()).unwrap(), cfg, "{}", o.name());
    }
    assert!(from_config(&serde_json::json!({"name": "Lion", "learning_rate": 0.1})).is_err());
}

#[test]
fn any_hyperparameter_can_follow_a_schedule() {
    // SGD whose momentum switches from 0 to 0.5 after step 1: v = m v - lr g; w += v.
    ferroflow::init();
    let mut opt = Sgd::new(0.1).with_momentum(
        PiecewiseConstantDecay {
            boundaries: vec![1],
            values: vec![0.0, 0.5],
        },
        false,
    );
    let v = Variable::new("w", Tensor::scalar(0.0f64).unwrap());
    let (mut w, mut vel) = (0.0f64, 0.0f64);
    for step in 0..4 {
        let m = if step <= 1 { 0.0 } else { 0.5 };
        vel = m * vel - 0.1;
        w += vel;
        opt.apply_gradients(
            vec![(Some(Tensor::scalar(1.0f64).unwrap()), v.clone())],
            true,
        )
        .unwrap();
        assert!(
            (v.peek().item::<f64>().unwrap() - w).abs() < 1e-15,
            "step {step}"
        );
    }
}

/// The fused kernels and the composed primitives give the same trajectories.
#[test]
fn fused_and_composed_updates_agree_for_every_optimizer() {
    ferroflow::init();
    type Maker = fn() -> Box<dyn Optimizer>;
    let makers: Vec<(&str, Maker)> = vec![
        ("sgd", || Box::new(Sgd::new(0.1).with_momentum(0.9, false))),
        ("nesterov", || {
            Box::new(Sgd::new(0.1).with_momentum(0.9, true))
        }),
        ("adamw", || Box::new(Adam::adamw(0.01, 0.01))),
        ("rmsprop", || Box::new(RmsProp::new(0.01))),
        ("centered", || {
            let mut r = RmsProp::new(0.01);
            r.centered = true;
            Box::new(r)
        }),
        ("adagrad", || Box::new(Adagrad::new(0.1))),
        ("adadelta", || Box::new(Adadelta::new(1.0))),
        ("adamax", || Box::new(Adamax::new(0.01))),
    ];
    for (name, make) in makers {
        let mut fused = make();
        let mut composed = make();
        composed.core_mut().compose_updates = true;
        // Count the fused update kernels each run dispatches: the fused run must use them
        // (a silent fallback would compare composed with composed) and the composed none.
        let fused_count = Arc::new(FusedUpdates::default());
        let a = {
            let _watch = ferroflow::dispatch::push_thread_observer(fused_count.clone());
            run(fused.as_mut(), 6)
        };
        let composed_count = Arc::new(FusedUpdates::default());
        let b = {
            let _watch = ferroflow::dispatch::push_thread_observer(composed_count.clone());
            run(composed.as_mut(), 6)
        };
        assert_eq!(
            (
                *fused_count.0.lock().unwrap(),
                *composed_count.0.lock().unwrap()
            ),
            (6, 0),
            "{name}: fused update kernels dispatched by the fused and the composed runs"
        );
        assert_close(name, &a, &b);
    }
}

/// Counts `optimizer_update` kernels (the fused update) that ran.
#[derive(Default)]
struct FusedUpdates(Mutex<usize>);

impl ferroflow::dispatch::OpObserver for FusedUpdates {
    fn on_op(&self, e: &ferroflow::dispatch::OpEvent<'_>) {
        if matches!(e.op, ferroflow::Op::OptimizerUpdate(_)) {
            *self.0.lock().unwrap() += 1;
        }
    }
}

#[test]
fn builders_set_every_hyperparameter_and_slots_are_found_by_name() {
    ferroflow::init();
    let adam = Adam::new(1e-3)
        .beta_1(0.8)
        .beta_2(0.99)
        .epsilon(1e-6)
        .amsgrad(true)
        .clipnorm(1.0)
        .decay(0.01);
    let cfg = get_config(&adam).unwrap();
    for (k, v) in [
        ("beta_1", serde_json::json!(0.8)),
        ("beta_2", serde_json::json!(0.99)),
        ("epsilon", serde_json::json!(1e-6)),
        ("amsgrad", serde_json::json!(true)),
        ("clipnorm", serde_json::json!(1.0)),
        ("decay", serde_json::json!(0.01)),
    ] {
        assert_eq!(cfg[k], v, "{k}");
    }
    let sgd = Sgd::new(0.1).momentum(0.9).nesterov(true).clipvalue(0.5);
    let cfg = get_config(&sgd).unwrap();
    assert_eq!(
        (&cfg["momentum"], &cfg["nesterov"], &cfg["clipvalue"]),
        (
            &serde_json::json!(0.9),
            &serde_json::json!(true),
            &serde_json::json!(0.5)
        )
    );
    let rms = RmsProp::new(0.1).rho(0.8).momentum(0.5).centered(true);
    let cfg = get_config(&rms).unwrap();
    assert_eq!(
        (&cfg["rho"], &cfg["centered"]),
        (&serde_json::json!(0.8), &serde_json::json!(true))
    );
    let ftrl = Ftrl::new(0.1)
        .l1(0.01)
        .l2(0.02)
        .beta(0.5)
        .learning_rate_power(-0.7);
    let cfg = get_config(&ftrl).unwrap();
    assert_eq!(cfg["l1_regularization_strength"], 0.01);
    assert_eq!(cfg["learning_rate_power"], -0.7);
    // A schedule through a builder too.
    let scheduled = Adam::new(0.1).beta_1(ExponentialDecay {
        initial_learning_rate: 0.9,
        decay_steps: 10.0,
        decay_rate: 0.5,
        staircase: true,
    });
    assert_eq!(
        get_config(&scheduled).unwrap()["beta_1"]["class_name"],
        "ExponentialDecay"
    );
    // Slots by TF's names.
    let mut adam = Adam::new(0.1);
    let v = var();
    assert!(adam.get_slot(&v, "m").is_none());
    adam.apply_gradients(
        vec![(
            Some(Tensor::from_slice(&[1.0f64, 1.0, 1.0]).unwrap()),
            v.clone(),
        )],
        true,
    )
    .unwrap();
    let name = String::from("m");
    assert_eq!(adam.get_slot(&v, &name).unwrap().name(), "w/m");
    assert_eq!(adam.get_slot_names(), vec!["m", "v"]);
    assert!(adam.get_slot(&v, "momentum").is_none());
}

/// Counts the fused update ops that ran: single updates and groups (with their variables).
#[derive(Default)]
struct UpdateOps {
    singles: Mutex<usize>,
    groups: Mutex<Vec<usize>>,
}

impl ferroflow::dispatch::OpObserver for UpdateOps {
    fn on_op(&self, e: &ferroflow::dispatch::OpEvent<'_>) {
        match e.op {
            ferroflow::Op::OptimizerUpdate(_) => *self.singles.lock().unwrap() += 1,
            ferroflow::Op::OptimizerUpdateGroup(rule) => self
                .groups
                .lock()
                .unwrap()
                .push(e.inputs.len() / (2 + rule.num_slots())),
            _ => {}
        }
    }
}

/// `apply_gradients` over several variables updates them as one group (one kernel where
/// the backend can), with the trajectories of the composed primitives; a variable given
/// twice in one step is updated twice, in turn.
#[test]
fn a_step_updates_its_variables_as_one_group() {
    ferroflow::init();
    let shapes: [&[usize]; 4] = [&[3, 2], &[2], &[4, 1, 2], &[]];
    let make_vars = || -> Vec<Variable> {
        shapes
            .iter()
            .enumerate()
            .map(|(k, s)| {
                let n: usize = s.iter().product();
                let data: Vec<f64> = (0..n).map(|i| 0.3 * k as f64 - 0.1 * i as f64).collect();
                Variable::new(format!("v{k}"), Tensor::from_vec(data, s).unwrap())
            })
            .collect()
    };
    let grad = |v: &Variable, step: usize| {
        let w = v.peek();
        let n = w.shape().iter().product::<usize>();
        let data: Vec<f64> = (0..n).map(|i| ((i + step) as f64).sin()).collect();
        Tensor::from_vec(data, w.shape()).unwrap()
    };
    let train = |opt: &mut dyn Optimizer, twice: bool| -> Vec<Vec<f64>> {
        let vars = make_vars();
        for step in 0..4 {
            let mut pairs: Vec<(Option<Tensor>, Variable)> = vars
                .iter()
                .map(|v| (Some(grad(v, step)), v.clone()))
                .collect();
            if twice {
                pairs.push((Some(grad(&vars[1], step + 7)), vars[1].clone()));
            }
            opt.apply_gradients(pairs, true).unwrap();
        }
        vars.iter()
            .map(|v| v.peek().to_vec::<f64>().unwrap())
            .collect()
    };
    for twice in [false, true] {
        let mut fused = Adam::new(0.05);
        let mut composed = Adam::new(0.05);
        composed.core_mut().compose_updates = true;
        let seen = Arc::new(UpdateOps::default());
        let got = {
            let _watch = ferroflow::dispatch::push_thread_observer(seen.clone());
            train(&mut fused, twice)
        };
        let want = train(&mut composed, twice);
        for (k, (a, b)) in got.iter().zip(&want).enumerate() {
            assert_close(&format!("variable {k}, twice {twice}"), a, b);
        }
        let (singles, groups) = (
            *seen.singles.lock().unwrap(),
            seen.groups.lock().unwrap().clone(),
        );
        if twice {
            // The repeated variable flushes the first four as a group, then runs alone.
            assert_eq!((singles, groups), (4, vec![4, 4, 4, 4]), "twice");
        } else {
            assert_eq!((singles, groups), (0, vec![4, 4, 4, 4]), "once");
        }
    }
}
