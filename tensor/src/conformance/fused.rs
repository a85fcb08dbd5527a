//! The fused `optimizer_update` kernel against each rule's formula, on the dtypes the
//! backend declares it for (`Backend::has_fused`); elsewhere the call must be refused with
//! `NotSupportedByBackend` without reaching the backend.

use super::harness::*;
use super::reference::RefArray;
use crate::{device_has_fused, DType, Device, Error, FusedKernel, Tensor, UpdateRule};
use proptest::prelude::*;

/// One element of a rule in f64, evaluated as TensorFlow's kernels evaluate it (the order of
/// operations of `ferroflow-optim`'s rules): returns w' and updates the slots.
fn reference(rule: &UpdateRule, w: f64, g: f64, s: &mut [f64]) -> f64 {
    match *rule {
        UpdateRule::SgdMomentum {
            lr,
            momentum,
            nesterov,
        } => {
            s[0] = s[0] * momentum - g * lr;
            if nesterov {
                w + (s[0] * momentum - g * lr)
            } else {
                w + s[0]
            }
        }
        UpdateRule::Adam {
            lr_t,
            beta_1,
            beta_2,
            epsilon,
            decay,
        } => {
            s[0] += (g - s[0]) * (1.0 - beta_1);
            s[1] += (g * g - s[1]) * (1.0 - beta_2);
            (w - decay * w) - (s[0] * lr_t) / (s[1].sqrt() + epsilon)
        }
        UpdateRule::RmsProp {
            lr,
            rho,
            epsilon,
            centered,
        } => {
            s[0] = rho * s[0] + (1.0 - rho) * (g * g);
            let denom = if centered {
                s[1] = rho * s[1] + (1.0 - rho) * g;
                s[0] - s[1] * s[1]
            } else {
                s[0]
            };
            w - (lr * g) / (denom.sqrt() + epsilon)
        }
        UpdateRule::Adagrad { lr, epsilon } => {
            s[0] += g * g;
            w - (g * lr) / (s[0].sqrt() + epsilon)
        }
        UpdateRule::Adadelta { lr, rho, epsilon } => {
            s[0] = s[0] * rho + (g * g) * (1.0 - rho);
            let u = (s[1] + epsilon).sqrt() * (1.0 / (s[0] + epsilon).sqrt()) * g;
            s[1] = s[1] * rho + (u * u) * (1.0 - rho);
            w - u * lr
        }
        UpdateRule::Adamax {
            lr_t,
            beta_1,
            beta_2,
            epsilon,
        } => {
            s[0] += (g - s[0]) * (1.0 - beta_1);
            s[1] = (beta_2 * s[1]).max(g.abs());
            w - lr_t * (s[0] / (s[1] + epsilon))
        }
    }
}

/// One update rule of every kind (and both RMSprop variants), as the fused-kernel cases and
/// the wgpu shader catalog use them.
pub fn rules() -> Vec<UpdateRule> {
    vec![
        UpdateRule::SgdMomentum {
            lr: 0.1,
            momentum: 0.9,
            nesterov: false,
        },
        UpdateRule::SgdMomentum {
            lr: 0.1,
            momentum: 0.9,
            nesterov: true,
        },
        UpdateRule::Adam {
            lr_t: 0.01,
            beta_1: 0.9,
            beta_2: 0.999,
            epsilon: 1e-7,
            decay: 0.001,
        },
        UpdateRule::RmsProp {
            lr: 0.01,
            rho: 0.9,
            epsilon: 1e-7,
            centered: false,
        },
        UpdateRule::RmsProp {
            lr: 0.01,
            rho: 0.9,
            epsilon: 1e-7,
            centered: true,
        },
        UpdateRule::Adagrad {
            lr: 0.1,
            epsilon: 1e-7,
        },
        UpdateRule::Adadelta {
            lr: 1.0,
            rho: 0.95,
            epsilon: 1e-7,
        },
        UpdateRule::Adamax {
            lr_t: 0.01,
            beta_1: 0.9,
            beta_2: 0.999,
            epsilon: 1e-7,
        },
    ]
}

/// Centered RMSprop's second slot is a running mean `m` of the gradient beside the mean
/// square `v`, and `v - m²` (a variance) is what it divides by: states with `m² ≥ v` do not
/// arise and make that difference cancel catastrophically (f32 and the f64 reference then
/// disagree in the leading digits). Scale `m` to `|m| ≤ √v / 2`, keeping the variance ≥ ¾ v
/// through an update. Other rules' slots are returned as they are.
fn centered_mean(rule: &UpdateRule, v: &[f64], m: Vec<f64>) -> Vec<f64> {
    if !matches!(rule, UpdateRule::RmsProp { centered: true, .. }) {
        return m;
    }
    m.iter().zip(v).map(|(m, v)| m * 0.5 * v.sqrt()).collect()
}

/// Every rule on random same-shaped w, g and slots (second moments ≥ 0) in f32 and f64, each
/// operand a random view (transposed, reversed, strided, offset).
pub fn optimizer_update(device: &Device) {
    let strat = array(3, 5, -2.0, 2.0).prop_flat_map(|w| {
        let n = w.data.len();
        (
            Just(w),
            prop::collection::vec(-2.0..2.0f64, n),
            prop::collection::vec(0.05..1.0f64, n),
            prop::collection::vec(0.05..1.0f64, n),
            any::<bool>(),
            0..8usize,
            prop::collection::vec(view_kind(), 4),
        )
    });
    check(
        "optimizer_update",
        strat,
        |(w, g, s0, s1, f64_, ri, views)| {
            let rule = rules()[ri];
            let dtype = if f64_ {
                exact_float(device)
            } else {
                DType::F32
            };
            let q = |d: &[f64]| RefArray::new(&w.shape, quantize(dtype, d));
            let (w, g) = (q(&w.data), q(&g));
            // Slots hold positive values: second moments, accumulators (and valid first moments).
            let s1 = centered_mean(&rule, &s0, s1);
            let slots: Vec<RefArray> = [s0, s1]
                .iter()
                .take(rule.num_slots())
                .map(|v| q(v))
                .collect();
            let t = |a: &RefArray, view: ViewKind| make_tensor(device, dtype, a, view);
            let (tw, tg) = (ok("w", t(&w, views[0]))?, ok("g", t(&g, views[1]))?);
            let ts = slots
                .iter()
                .zip(&views[2..])
                .map(|(s, &view)| ok("slot", t(s, view)))
                .collect::<Result<Vec<_>, _>>()?;
            let result = Tensor::optimizer_update(&rule, &tw, &tg, &ts);
            if !device_has_fused(*device, FusedKernel::OptimizerUpdate, dtype) {
                prop_assert!(
                    matches!(result, Err(Error::NotSupportedByBackend { .. })),
                    "optimizer_update on {dtype}, which the backend does not declare: {result:?}"
                );
                return Ok(());
            }
            let (nw, ns) = ok("optimizer_update", result)?;
            let n = w.data.len();
            let mut want_w = vec![0.0; n];
            let mut want_s = vec![vec![0.0; n]; slots.len()];
            for i in 0..n {
                let mut st: Vec<f64> = slots.iter().map(|s| s.data[i]).collect();
                want_w[i] = reference(&rule, w.data[i], g.data[i], &mut st);
                for (k, v) in st.into_iter().enumerate() {
                    want_s[k][i] = v;
                }
            }
            let eps = epsilon(dtype);
            assert_close(&format!("{rule:?} w"), &nw, &q(&want_w), 64.0, 64.0 * eps)?;
            for (k, (got, want)) in ns.iter().zip(&want_s).enumerate() {
                assert_close(
                    &format!("{rule:?} slot {k}"),
                    got,
                    &q(want),
                    16.0,
                    16.0 * eps,
                )?;
            }
            Ok(())
        },
    );
    // Past the kernels' chunking and threading thresholds: every rule over 100k elements
    // (f32), each element checked.
    let n = 100_003;
    let value = |i: usize, lo: f64, hi: f64| lo + (hi - lo) * ((i * 7919 % 1009) as f64 / 1009.0);
    let w: Vec<f64> = (0..n).map(|i| value(i, -2.0, 2.0)).collect();
    let g: Vec<f64> = (0..n).map(|i| value(i + 3, -2.0, 2.0)).collect();
    let slot_values: Vec<Vec<f64>> = (0..2)
        .map(|k| (0..n).map(|i| value(i + 11 * (k + 1), 0.05, 1.0)).collect())
        .collect();
    let upload = |v: &[f64]| {
        Tensor::from_host_on(
            crate::HostData::from_f64_slice(DType::F32, v),
            &[n],
            *device,
        )
        .expect("upload")
    };
    for rule in rules() {
        let slot_values = [
            slot_values[0].clone(),
            centered_mean(&rule, &slot_values[0], slot_values[1].clone()),
        ];
        let slots: Vec<Tensor> = slot_values[..rule.num_slots()]
            .iter()
            .map(|v| upload(v))
            .collect();
        if !device_has_fused(*device, FusedKernel::OptimizerUpdate, DType::F32) {
            break;
        }
        let (nw, ns) = Tensor::optimizer_update(&rule, &upload(&w), &upload(&g), &slots)
            .expect("optimizer_update");
        let got_w = nw.to_f64_vec().expect("read");
        let got_s: Vec<Vec<f64>> = ns.iter().map(|t| t.to_f64_vec().expect("read")).collect();
        for i in 0..n {
            let q = |x: f64| x as f32 as f64;
            let mut st: Vec<f64> = slot_values[..rule.num_slots()]
                .iter()
                .map(|s| q(s[i]))
                .collect();
            let want = reference(&rule, q(w[i]), q(g[i]), &mut st);
            let close = |a: f64, b: f64| (a - b).abs() <= 1e-5 * (1.0 + b.abs());
            assert!(
                close(got_w[i], want),
                "{rule:?} w[{i}]: {} vs {want}",
                got_w[i]
            );
            for (k, v) in st.iter().enumerate() {
                assert!(
                    close(got_s[k][i], *v),
                    "{rule:?} slot {k}[{i}]: {} vs {v}",
                    got_s[k][i]
                );
            }
        }
    }
    // A wrong slot count is an error, not a panic.
    let one = Tensor::from_host_on(crate::HostData::F32(vec![1.0]), &[1], *device).expect("upload");
    assert!(Tensor::optimizer_update(&rules()[2], &one, &one, std::slice::from_ref(&one)).is_err());
}

/// The update of several variables by one rule (`optimizer_update_group`) gives each
/// variable bit for bit what its own `optimizer_update` gives: 1 to 9 variables of random
/// shapes (past the wgpu kernel's variables-per-kernel limit), each operand a random view,
/// in f32 and f64. Mixed dtypes and wrong slot counts are errors; no variables, no update.
pub fn optimizer_update_group(device: &Device) {
    let variable = array(3, 4, -2.0, 2.0).prop_flat_map(|w| {
        let n = w.data.len();
        (
            Just(w),
            prop::collection::vec(-2.0..2.0f64, n),
            prop::collection::vec(0.05..1.0f64, n),
            prop::collection::vec(0.05..1.0f64, n),
            prop::collection::vec(view_kind(), 4),
        )
    });
    let strat = (
        prop::collection::vec(variable, 1..=9),
        any::<bool>(),
        0..8usize,
    );
    check("optimizer_update_group", strat, |(variables, f64_, ri)| {
        let rule = rules()[ri];
        let dtype = if f64_ {
            exact_float(device)
        } else {
            DType::F32
        };
        let mut group = vec![];
        for (w, g, s0, s1, views) in &variables {
            let q = |d: &[f64]| RefArray::new(&w.shape, quantize(dtype, d));
            let t = |a: &RefArray, view: ViewKind| make_tensor(device, dtype, a, view);
            let s1 = centered_mean(&rule, s0, s1.clone());
            let slots = [s0.clone(), s1][..rule.num_slots()]
                .iter()
                .zip(&views[2..])
                .map(|(v, &view)| ok("slot", t(&q(v), view)))
                .collect::<Result<Vec<_>, _>>()?;
            group.push((
                ok("w", t(&q(&w.data), views[0]))?,
                ok("g", t(&q(g), views[1]))?,
                slots,
            ));
        }
        let result = Tensor::optimizer_update_group(&rule, &group);
        if !device_has_fused(*device, FusedKernel::OptimizerUpdate, dtype) {
            prop_assert!(
                matches!(result, Err(Error::NotSupportedByBackend { .. })),
                "optimizer_update_group on {dtype}, which the backend does not declare: \
                     {result:?}"
            );
            return Ok(());
        }
        let updated = ok("optimizer_update_group", result)?;
        prop_assert_eq!(updated.len(), group.len());
        let bits = |t: &Tensor| -> Result<Vec<u64>, TestCaseError> {
            Ok(ok("read", t.to_f64_vec())?
                .iter()
                .map(|x| x.to_bits())
                .collect())
        };
        for (v, ((w, g, slots), (gw, gs))) in group.iter().zip(&updated).enumerate() {
            let (nw, ns) = ok(
                "optimizer_update",
                Tensor::optimizer_update(&rule, w, g, slots),
            )?;
            prop_assert_eq!(gw.shape(), w.shape());
            prop_assert_eq!(bits(gw)?, bits(&nw)?, "{:?} variable {} w", rule, v);
            prop_assert_eq!(gs.len(), ns.len());
            for (k, (a, b)) in gs.iter().zip(&ns).enumerate() {
                prop_assert_eq!(bits(a)?, bits(b)?, "{:?} variable {} slot {}", rule, v, k);
            }
        }
        Ok(())
    });
    let on = |v: Vec<f64>, dtype: DType| {
        let n = v.len();
        Tensor::from_host_on(crate::HostData::from_f64_slice(dtype, &v), &[n], *device)
            .expect("upload")
    };
    let rule = rules()[4]; // two slots
    assert!(Tensor::optimizer_update_group(&rule, &[])
        .expect("no variables")
        .is_empty());
    if !device_has_fused(*device, FusedKernel::OptimizerUpdate, DType::F32)
        || !crate::device_supports(*device, DType::F64)
    {
        return;
    }
    let f32_var = |n: usize| {
        let v = || on(vec![0.5; n], DType::F32);
        (v(), v(), vec![v(), v()])
    };
    let f64_var = (
        on(vec![0.5; 2], DType::F64),
        on(vec![0.5; 2], DType::F64),
        vec![on(vec![0.5; 2], DType::F64), on(vec![0.5; 2], DType::F64)],
    );
    let mixed = Tensor::optimizer_update_group(&rule, &[f32_var(3), f64_var]);
    assert!(
        matches!(mixed, Err(Error::DTypeMismatch { .. })),
        "one group, two dtypes: {mixed:?}"
    );
    let (w, g, mut slots) = f32_var(2);
    slots.pop();
    let short = Tensor::optimizer_update_group(&rule, &[f32_var(3), (w, g, slots)]);
    assert!(short.is_err(), "a variable short of a slot: {short:?}");
}

/// The fused kernels a device declares are for dtypes it supports, and every fused op's
/// tensor method runs on every dtype the device supports whether or not it declares the
/// kernel (composed from primitives where it does not), agreeing with the composition.
pub fn declared_fused_kernels(device: &Device) {
    for &kernel in FusedKernel::ALL {
        for dtype in DType::ALL {
            if device_has_fused(*device, kernel, dtype) {
                assert!(
                    crate::device_supports(*device, dtype),
                    "{device} declares {} for {dtype}, a dtype it does not support",
                    kernel.name()
                );
            }
        }
    }
    for dtype in DType::ALL {
        // clip_scalar compares: bool and complex numbers have no order
        if !crate::device_supports(*device, dtype) || dtype == DType::Bool || dtype.is_complex() {
            continue;
        }
        let t = Tensor::from_host_on(
            crate::HostData::from_f64_slice(dtype, &[-3.0, -1.0, 0.0, 2.0, 5.0, 7.0]),
            &[1, 2, 3, 1],
            *device,
        )
        .expect("upload");
        let fused = t.clip_scalar(-1.0, 4.0).expect("clip_scalar");
        let composed = t
            .maximum(&t.scalar_like(-1.0).expect("scalar"))
            .and_then(|m| m.minimum(&t.scalar_like(4.0)?))
            .expect("composed clip");
        assert_eq!(
            fused.to_f64_vec().expect("read"),
            composed.to_f64_vec().expect("read"),
            "clip_scalar on {dtype}"
        );
        if !dtype.is_float() {
            continue;
        }
        let bias = Tensor::from_host_on(
            crate::HostData::from_f64_slice(dtype, &[0.5]),
            &[1],
            *device,
        )
        .expect("upload");
        let f = Tensor::from_host_on(
            crate::HostData::from_f64_slice(dtype, &[2.0]),
            &[1, 1, 1, 1],
            *device,
        )
        .expect("upload");
        let y = t
            .fused_conv2d(
                &f,
                &bias,
                crate::FusedActivation::Relu,
                [1, 1],
                crate::Padding::Valid,
                [1, 1],
            )
            .expect("fused_conv2d");
        let want = t
            .conv2d(&f, [1, 1], crate::Padding::Valid, [1, 1])
            .and_then(|c| c.add(&bias))
            .and_then(|c| c.relu())
            .expect("composed conv2d");
        assert_eq!(
            y.to_f64_vec().expect("read"),
            want.to_f64_vec().expect("read"),
            "fused_conv2d on {dtype}"
        );
        let (dx, db) = t
            .bias_activation_grad(&y, crate::FusedActivation::Relu)
            .expect("bias_activation_grad");
        let want_dx = t.relu_grad(&y).expect("relu_grad");
        let want_db = want_dx
            .reduce_sum(crate::Axes::List(vec![0, 1, 2]), false)
            .expect("sum");
        assert_eq!(
            dx.to_f64_vec().expect("read"),
            want_dx.to_f64_vec().expect("read"),
            "dx on {dtype}"
        );
        assert_eq!(
            db.to_f64_vec().expect("read"),
            want_db.to_f64_vec().expect("read"),
            "dbias on {dtype}"
        );
    }
}

/// An elementwise program ([`crate::Tensor::fused_elementwise`]) over broadcast, strided
/// views gives exactly what its ops give one by one, in every float dtype the device
/// supports; the fused kernel where the device declares it, the composition elsewhere.
pub fn elementwise_program(device: &Device) {
    use crate::{BinaryOp, ElementwiseProgram, ElementwiseStep, UnaryOp};
    use std::sync::Arc;
    const UNARY: [UnaryOp; 6] = [
        UnaryOp::Neg,
        UnaryOp::Tanh,
        UnaryOp::Sigmoid,
        UnaryOp::Exp,
        UnaryOp::Relu,
        UnaryOp::Square,
    ];
    const BINARY: [BinaryOp; 5] = [
        BinaryOp::Add,
        BinaryOp::Sub,
        BinaryOp::Mul,
        BinaryOp::Maximum,
        BinaryOp::SquaredDifference,
    ];
    let step = prop_oneof![
        (0..UNARY.len(), 0..16usize).prop_map(|(o, a)| (o, a, None)),
        (0..BINARY.len(), 0..16usize, 0..16usize).prop_map(|(o, a, b)| (o, a, Some(b))),
    ];
    let strat = (
        prop::collection::vec(1..5usize, 1..4),
        prop::collection::vec(step, 1..8),
        prop::collection::vec(view_kind(), 2),
        any::<bool>(),
        any::<u64>(),
        (
            prop::collection::vec(any::<bool>(), 3),
            any::<bool>(),
            0..5usize,
        ),
    );
    check_cases(
        "elementwise_program",
        compiled_program_cases(),
        strat,
        |(dims, raw, views, use_f64, seed, (reduced, keepdims, reduce_op))| {
            let dtype = if use_f64 {
                exact_float(device)
            } else {
                DType::F32
            };
            // Two inputs: the full shape, and its last axis broadcast against it.
            let full = RefArray::new(&dims, values(seed, dims.iter().product()));
            let last = &dims[dims.len() - 1..];
            let row = RefArray::new(last, values(seed ^ 1, last[0]));
            let a = ok("a", make_tensor(device, dtype, &full, views[0]))?;
            let b = ok("b", make_tensor(device, dtype, &row, views[1]))?;
            let steps: Vec<ElementwiseStep> = raw
                .iter()
                .enumerate()
                .map(|(i, &(o, x, y))| {
                    let n = 2 + i;
                    match y {
                        None => ElementwiseStep::Unary(UNARY[o], x % n),
                        Some(y) => ElementwiseStep::Binary(BINARY[o], x % n, y % n),
                    }
                })
                .collect();
            let last_reg = 2 + steps.len() - 1;
            let program = Arc::new(ElementwiseProgram {
                num_inputs: 2,
                outputs: vec![last_reg, 2],
                steps,
            });
            let inputs = [a, b];
            let fused = ok(
                "fused_elementwise",
                Tensor::fused_elementwise(&program, &inputs),
            )?;
            let composed = ok("compose", program.compose(&inputs, &dims))?;
            prop_assert_eq!(fused.len(), 2);
            for (f, c) in fused.iter().zip(&composed) {
                prop_assert_eq!(f.shape(), &dims[..]);
                let (f, c) = (ok("read", f.to_f64_vec())?, ok("read", c.to_f64_vec())?);
                let same = f
                    .iter()
                    .zip(&c)
                    .all(|(x, y)| x.to_bits() == y.to_bits() || (x.is_nan() && y.is_nan()));
                prop_assert!(same, "{program:?} on {dtype}: fused {f:?}, composed {c:?}");
            }
            // The same program with a reduction of its first output in the pass: exactly
            // the reduction of the composed output.
            let op = [
                crate::ReduceOp::ReduceSum,
                crate::ReduceOp::ReduceMax,
                crate::ReduceOp::ReduceMin,
                crate::ReduceOp::ReduceProd,
                crate::ReduceOp::ReduceMean,
            ][reduce_op];
            let axes: Vec<isize> = (0..dims.len())
                .filter(|&a| reduced[a])
                .map(|a| a as isize)
                .collect();
            let fused = ok(
                "fused_reduce",
                Tensor::fused_reduce(&program, &inputs, op, axes.clone(), keepdims),
            )?;
            let want = ok("reduce", composed[0].reduce(op, axes.clone(), keepdims))?;
            prop_assert_eq!(fused.len(), 2);
            prop_assert_eq!(fused[0].shape(), want.shape());
            prop_assert_eq!(fused[1].shape(), &dims[..]);
            for (f, c) in [(&fused[0], &want), (&fused[1], &composed[1])] {
                let (f, c) = (ok("read", f.to_f64_vec())?, ok("read", c.to_f64_vec())?);
                let same = f
                    .iter()
                    .zip(&c)
                    .all(|(x, y)| x.to_bits() == y.to_bits() || (x.is_nan() && y.is_nan()));
                prop_assert!(
                    same,
                    "{program:?} then {} over {axes:?} on {dtype}: fused {f:?}, composed {c:?}",
                    op.name()
                );
            }
            Ok(())
        },
    );
    // A wide program (more inputs than one kernel may bind on small adapters), returning
    // one register twice: each output its own tensor.
    let n_in = 14;
    let inputs: Vec<Tensor> = (0..n_in)
        .map(|k| {
            let shape: &[usize] = if k % 2 == 0 { &[2, 3] } else { &[3] };
            let n = shape.iter().product();
            Tensor::from_host_on(
                crate::HostData::F32(values(k as u64, n).iter().map(|&v| v as f32).collect()),
                shape,
                *device,
            )
            .expect("upload")
        })
        .collect();
    let steps: Vec<ElementwiseStep> = (1..n_in)
        .map(|k| {
            let acc = if k == 1 { 0 } else { n_in + k - 2 };
            ElementwiseStep::Binary(BinaryOp::Mul, acc, k)
        })
        .chain([ElementwiseStep::Unary(UnaryOp::Tanh, 2 * n_in - 2)])
        .collect();
    let last = n_in + steps.len() - 1;
    let wide = Arc::new(ElementwiseProgram {
        num_inputs: n_in,
        steps,
        outputs: vec![last, last - 1, last],
    });
    let fused = Tensor::fused_elementwise(&wide, &inputs).expect("a wide program");
    let composed = wide.compose(&inputs, &[2, 3]).expect("compose");
    assert_eq!(fused.len(), 3);
    for (f, c) in fused.iter().zip(&composed) {
        assert_eq!(f.shape(), &[2, 3]);
        assert_eq!(
            f.to_f64_vec().expect("read"),
            c.to_f64_vec().expect("read"),
            "{wide:?}"
        );
    }
    // The shared op-by-op runner on this backend (what a backend's `fused_elementwise` falls
    // back to for a program wider than one kernel): the same values, each output a buffer
    // of its own.
    let backend = crate::device::backend_for(*device).expect("the device's backend");
    let operands: Vec<_> = inputs.iter().map(|t| t.operand()).collect();
    let by_ops = wide
        .run_op_by_op(backend.as_ref(), &operands, &[2, 3])
        .expect("the program op by op");
    assert_eq!(by_ops.len(), 3);
    let by_ops: Vec<Tensor> = by_ops
        .into_iter()
        .map(|b| Tensor::from_buffer(b, &[2, 3], DType::F32, &backend, *device))
        .collect();
    for (b, c) in by_ops.iter().zip(&composed) {
        assert_eq!(
            b.to_f64_vec().expect("read"),
            c.to_f64_vec().expect("read"),
            "{wide:?} op by op"
        );
    }
    // A long reduction (few outputs, many elements each: reduced in parts, then the parts)
    // with an extra output: the same bits as the program's output reduced on its own.
    let long = Tensor::from_host_on(
        crate::HostData::F32(values(99, 3 * 20_000).iter().map(|&v| v as f32).collect()),
        &[3, 20_000],
        *device,
    )
    .expect("upload");
    let row = Tensor::from_host_on(
        crate::HostData::F32(vec![0.5, -0.25, 2.0]),
        &[3, 1],
        *device,
    )
    .expect("upload");
    let program = Arc::new(ElementwiseProgram {
        num_inputs: 2,
        steps: vec![
            ElementwiseStep::Binary(BinaryOp::Mul, 0, 1),
            ElementwiseStep::Unary(UnaryOp::Tanh, 2),
        ],
        outputs: vec![3, 2],
    });
    let inputs = [long, row];
    let composed = program.compose(&inputs, &[3, 20_000]).expect("compose");
    for op in [crate::ReduceOp::ReduceSum, crate::ReduceOp::ReduceMax] {
        for axes in [vec![1isize], vec![0, 1]] {
            let fused = Tensor::fused_reduce(&program, &inputs, op, axes.clone(), false)
                .expect("a long fused reduction");
            let want = composed[0].reduce(op, axes.clone(), false).expect("reduce");
            assert_eq!(
                fused[0].to_f64_vec().expect("read"),
                want.to_f64_vec().expect("read"),
                "{} over {axes:?}",
                op.name()
            );
            assert_eq!(
                fused[1].to_f64_vec().expect("read"),
                composed[1].to_f64_vec().expect("read")
            );
        }
    }
    // A malformed program is an error, not a panic.
    let one = Tensor::from_host_on(crate::HostData::F32(vec![1.0]), &[1], *device).expect("upload");
    let bad = Arc::new(ElementwiseProgram {
        num_inputs: 1,
        steps: vec![ElementwiseStep::Unary(UnaryOp::Neg, 5)],
        outputs: vec![1],
    });
    assert!(Tensor::fused_elementwise(&bad, std::slice::from_ref(&one)).is_err());
    assert!(Tensor::fused_elementwise(&bad, &[]).is_err());
    let neg = Arc::new(ElementwiseProgram {
        num_inputs: 1,
        steps: vec![ElementwiseStep::Unary(UnaryOp::Neg, 0)],
        outputs: vec![1],
    });
    let any = Tensor::fused_reduce(
        &neg,
        std::slice::from_ref(&one),
        crate::ReduceOp::ReduceAny,
        0,
        false,
    );
    assert!(any.is_err(), "reduce_any of floats is not fusible");
    let out_of_range = Tensor::fused_reduce(
        &neg,
        std::slice::from_ref(&one),
        crate::ReduceOp::ReduceSum,
        3,
        false,
    );
    assert!(out_of_range.is_err(), "axis 3 of a vector");
}

/// Deterministic values in [-3, 3) from a seed.
fn values(seed: u64, n: usize) -> Vec<f64> {
    let mut g = crate::random::Philox::new([seed, 17]);
    (0..n).map(|_| g.next_f64() * 6.0 - 3.0).collect()
}
