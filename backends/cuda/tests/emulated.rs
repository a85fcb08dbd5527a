//! The shared backend conformance suite on the CUDA backend's host emulation
//! (`ferroflow_cuda::emulation`): the backend's CUDA C, compiled by the system's C++
//! compiler, with its own views, launch parameters, error words and GEMM operand forms,
//! against the suite's float64 references — on any machine with a C++ compiler, no GPU.
//!
//! Without a C++ compiler every test skips with one loud line, unless
//! `FERROFLOW_REQUIRE_CXX=1` (CI), where that is a failure.

mod common;

fn emulated_device() -> Option<ferroflow_tensor::Device> {
    common::emulated_device(
        // Each random elementwise program is a C++ compile of its own here (~0.25 s).
        || ferroflow_tensor::conformance::harness::limit_compiled_program_cases(24),
        "the CUDA kernels' emulated conformance suite did not run",
    )
}

ferroflow_tensor::conformance_tests!(optional: emulated_device());

/// Whether two reads of tensors hold the same values bit for bit (any NaN equal to any).
fn same_bits(f: &[f64], c: &[f64]) -> bool {
    f.len() == c.len()
        && f.iter()
            .zip(c)
            .all(|(x, y)| x.to_bits() == y.to_bits() || (x.is_nan() && y.is_nan()))
}

/// Long reductions take each of the reduction's plans (see `common`); on the emulation 3
/// rows take the block-per-output kernels.
#[test]
fn long_reductions_match_references_in_every_plan() {
    if let Some(device) = emulated_device() {
        common::long_reductions_match_references(device, 3);
    }
}

/// Every fusible op in one elementwise program (its own generated kernel: each step the
/// op's own expression, rounded where the op's kernel stores it) in each float type,
/// including the half types the conformance property does not draw: the same bits as the
/// ops one by one, and with a sum and a max of its first output in the reduction's loads,
/// the same bits as reducing the composed output.
#[test]
fn elementwise_programs_match_their_ops_in_every_float_type() {
    use ferroflow_tensor::{BinaryOp, DType, ElementwiseStep, FusedKernel, ReduceOp, Tensor};
    use std::sync::Arc;
    let Some(device) = emulated_device() else {
        return;
    };
    // Every fusible op and a chain through earlier results, then a product chain and its
    // difference from its first link (which shows a link left unrounded).
    let mut program = ferroflow_cuda::source::program_with_every_op();
    let p = 2 + program.steps.len();
    program
        .steps
        .push(ElementwiseStep::Binary(BinaryOp::Mul, 0, 1));
    for k in 0..5 {
        program
            .steps
            .push(ElementwiseStep::Binary(BinaryOp::Mul, p + k, k % 2));
    }
    program
        .steps
        .push(ElementwiseStep::Binary(BinaryOp::Sub, p + 5, p));
    let last = 2 + program.steps.len() - 1;
    program.outputs = (2..=last).rev().collect();
    let program = Arc::new(program);
    ferroflow_tensor::with_device(&device.to_string(), || -> ferroflow_tensor::Result<()> {
        // a: [4, 6] read transposed from [6, 4]; b: a row of 6 broadcast over it.
        let a_values: Vec<f64> = (0..24)
            .map(|i| ((i * 37) % 23) as f64 * 0.43 - 4.1)
            .collect();
        let b_values: Vec<f64> = (0..6).map(|i| i as f64 * 0.7 - 1.3).collect();
        for dtype in [DType::F16, DType::BF16, DType::F32, DType::F64] {
            assert!(
                ferroflow_tensor::device_has_fused(device, FusedKernel::Elementwise, dtype),
                "the CUDA backend declares elementwise programs for {dtype}"
            );
            let e = ferroflow_cuda::source::Elem::of(dtype).expect("a float type");
            assert!(
                ferroflow_cuda::source::generated_program(&program, e, None).is_some()
                    && ferroflow_cuda::source::generated_program(
                        &program,
                        e,
                        Some(ReduceOp::ReduceSum)
                    )
                    .is_some(),
                "the program is one kernel in {dtype}, not op by op"
            );
            let a = Tensor::from_vec(a_values.clone(), &[6, 4])?
                .cast(dtype)?
                .transpose(&[1, 0])?;
            let b = Tensor::from_vec(b_values.clone(), &[6])?.cast(dtype)?;
            let inputs = [a, b];
            let fused = Tensor::fused_elementwise(&program, &inputs)?;
            let composed = program.compose(&inputs, &[4, 6])?;
            assert_eq!(fused.len(), composed.len());
            for (k, (f, c)) in fused.iter().zip(&composed).enumerate() {
                let (f, c) = (f.to_f64_vec()?, c.to_f64_vec()?);
                assert!(
                    same_bits(&f, &c),
                    "{dtype}, output {k} (register {}): fused {f:?}, ops {c:?}",
                    program.outputs[k]
                );
            }
            for (op, axes) in [
                (ReduceOp::ReduceSum, vec![1isize]),
                (ReduceOp::ReduceMax, vec![0, 1]),
            ] {
                let fused = Tensor::fused_reduce(&program, &inputs, op, axes.clone(), false)?;
                let want = composed[0].reduce(op, axes.clone(), false)?.to_f64_vec()?;
                let got = fused[0].to_f64_vec()?;
                assert!(
                    same_bits(&got, &want),
                    "{dtype}: {} over {axes:?}: fused {got:?}, ops {want:?}",
                    op.name()
                );
                let (extra, want) = (fused[1].to_f64_vec()?, composed[1].to_f64_vec()?);
                assert!(same_bits(&extra, &want), "{dtype}: the extra output");
            }
        }
        Ok(())
    })
    .expect("the emulated device")
    .expect("elementwise programs");
}

/// A bias's gradient through a ReLU over many rows and few channels (a convolution's:
/// rows are batch · height · width) is one fused reduction spread over the rows (the split
/// plan: 3 channels take it on the emulation as 32 do on a GPU), `dx` and `dbias` the same
/// bits as `relu_grad` and its sum one by one, in each float type; the gradient of a
/// Linear activation is `g` and its sum.
#[test]
fn bias_gradients_over_long_columns_match_their_ops_in_every_float_type() {
    use ferroflow_tensor::{DType, FusedActivation, Tensor};
    let Some(device) = emulated_device() else {
        return;
    };
    ferroflow_tensor::with_device(&device.to_string(), || -> ferroflow_tensor::Result<()> {
        for shape in [vec![1000usize, 3], vec![10, 10, 12, 2]] {
            let n: usize = shape.iter().product();
            let g_values: Vec<f64> = (0..n)
                .map(|i| ((i * 7919) % 1013) as f64 / 101.0 - 5.0)
                .collect();
            // A ReLU's output: about a third exactly zero.
            let y_values: Vec<f64> = (0..n)
                .map(|i| (((i * 104_729) % 997) as f64 / 99.0 - 3.0).max(0.0))
                .collect();
            let lead: Vec<isize> = (0..shape.len() as isize - 1).collect();
            for dtype in [DType::F16, DType::BF16, DType::F32, DType::F64] {
                let g = Tensor::from_vec(g_values.clone(), &shape)?.cast(dtype)?;
                let y = Tensor::from_vec(y_values.clone(), &shape)?.cast(dtype)?;
                for activation in [FusedActivation::Relu, FusedActivation::Linear] {
                    let (dx, db) = g.bias_activation_grad(&y, activation)?;
                    let want_dx = match activation {
                        FusedActivation::Relu => g.relu_grad(&y)?,
                        FusedActivation::Linear => g.clone(),
                    };
                    let want_db = want_dx.reduce_sum(lead.clone(), false)?;
                    assert_eq!(db.shape(), &shape[shape.len() - 1..]);
                    let what = format!("{dtype} {activation:?} {shape:?}");
                    assert!(
                        same_bits(&dx.to_f64_vec()?, &want_dx.to_f64_vec()?),
                        "dx, {what}"
                    );
                    let (got, want) = (db.to_f64_vec()?, want_db.to_f64_vec()?);
                    assert!(same_bits(&got, &want), "dbias, {what}: {got:?} vs {want:?}");
                }
            }
        }
        Ok(())
    })
    .expect("the emulated device")
    .expect("bias gradients");
}

/// A program wider than one kernel's parameters (more than
/// `source::MAX_PROGRAM_INPUTS` inputs) runs op by op through the ops' own kernels, each
/// output its own tensor, with and without a reduction: the same bits as the ops.
#[test]
fn a_program_wider_than_one_kernel_runs_op_by_op() {
    use ferroflow_cuda::source::{generated_program, Elem, MAX_PROGRAM_INPUTS};
    use ferroflow_tensor::{
        BinaryOp, ElementwiseProgram, ElementwiseStep, ReduceOp, Tensor, UnaryOp,
    };
    use std::sync::Arc;
    let Some(device) = emulated_device() else {
        return;
    };
    let n_in = MAX_PROGRAM_INPUTS + 2;
    let mut steps: Vec<ElementwiseStep> = (1..n_in)
        .map(|k| {
            let acc = if k == 1 { 0 } else { n_in + k - 2 };
            ElementwiseStep::Binary(BinaryOp::Add, acc, k)
        })
        .collect();
    steps.push(ElementwiseStep::Unary(UnaryOp::Sigmoid, 2 * n_in - 2));
    let last = n_in + steps.len() - 1;
    let program = Arc::new(ElementwiseProgram {
        num_inputs: n_in,
        steps,
        outputs: vec![last, last - 1, last],
    });
    assert!(generated_program(&program, Elem::F32, None).is_none());
    ferroflow_tensor::with_device(&device.to_string(), || -> ferroflow_tensor::Result<()> {
        let inputs: Vec<Tensor> = (0..n_in)
            .map(|k| {
                let values: Vec<f32> = (0..6)
                    .map(|i| (i * 7 + k * 3) as f32 * 0.11 - 1.0)
                    .collect();
                Tensor::from_vec(values, if k % 2 == 0 { &[2, 3][..] } else { &[6][..] })
                    .and_then(|t| t.reshape(&[2, 3]))
            })
            .collect::<ferroflow_tensor::Result<_>>()?;
        let fused = Tensor::fused_elementwise(&program, &inputs)?;
        let composed = program.compose(&inputs, &[2, 3])?;
        assert_eq!(fused.len(), 3);
        for (f, c) in fused.iter().zip(&composed) {
            assert_eq!(f.to_vec::<f32>()?, c.to_vec::<f32>()?);
        }
        let reduced = Tensor::fused_reduce(&program, &inputs, ReduceOp::ReduceSum, 1, false)?;
        assert_eq!(
            reduced[0].to_vec::<f32>()?,
            composed[0].reduce_sum(1, false)?.to_vec::<f32>()?
        );
        assert_eq!(reduced[1].to_vec::<f32>()?, composed[1].to_vec::<f32>()?);
        Ok(())
    })
    .expect("the emulated device")
    .expect("a wide program");
}

/// While a profiler listens (a trace sink installed), every kernel and GEMM the backend
/// queues is timed for the profiler's device plane, labelled with the op it ran for, on the
/// device it ran on, inside the span of the run; nothing is timed once the sink is gone.
/// (On the emulation the host's clock times each launch; on a GPU, events on the stream.)
#[test]
fn kernels_are_timed_for_the_profiler_while_one_listens() {
    use ferroflow_tensor::trace::{install_sink, DeviceEvent, HostEvent, MemoryEvent, TraceSink};
    use ferroflow_tensor::{Device, Tensor};
    use std::sync::{Arc, Mutex};
    use std::time::{Duration, Instant};
    /// A timed kernel: its op, device, start and duration.
    type Timed = (Option<&'static str>, Device, Instant, Duration);
    #[derive(Default)]
    struct Kernels(Mutex<Vec<Timed>>);
    impl TraceSink for Kernels {
        fn on_host_event(&self, _: &HostEvent<'_>) {}
        fn on_memory(&self, _: &MemoryEvent) {}
        fn on_device_event(&self, e: &DeviceEvent) {
            let mut seen = self.0.lock().unwrap_or_else(|e| e.into_inner());
            seen.push((e.op, e.device, e.start, e.duration));
        }
    }
    struct NoOps;
    impl ferroflow_tensor::dispatch::OpObserver for NoOps {
        fn on_op(&self, _: &ferroflow_tensor::dispatch::OpEvent<'_>) {}
    }
    let Some(device) = emulated_device() else {
        return;
    };
    let run = || {
        ferroflow_tensor::with_device(
            &device.to_string(),
            || -> ferroflow_tensor::Result<Vec<f64>> {
                let a = Tensor::from_vec(
                    (0..64).map(|i| i as f32 / 64.0).collect::<Vec<_>>(),
                    &[8, 8],
                )?;
                a.tanh()?.matmul(&a)?.to_f64_vec()
            },
        )
        .expect("the emulated device")
        .expect("tanh and matmul")
    };
    let sink = Arc::new(Kernels::default());
    let begin = Instant::now();
    {
        // As the profiler listens: a sink, and an op observer (which names the op each
        // kernel runs for).
        let _listening = install_sink(sink.clone()).expect("no other profiler in this test");
        let _observing = ferroflow_tensor::dispatch::push_thread_observer(Arc::new(NoOps));
        run();
    }
    let end = Instant::now();
    let count = |seen: &[Timed], op: &str| {
        seen.iter()
            .filter(|(o, d, start, took)| {
                *o == Some(op) && *d == device && *start >= begin && *start + *took <= end
            })
            .count()
    };
    let seen = sink.0.lock().unwrap_or_else(|e| e.into_inner()).clone();
    assert!(
        count(&seen, "tanh") >= 1,
        "no timed tanh kernel in {seen:?}"
    );
    assert!(count(&seen, "matmul") >= 1, "no timed GEMM in {seen:?}");
    // The sink is gone: nothing more is timed.
    run();
    let after = sink.0.lock().unwrap_or_else(|e| e.into_inner()).len();
    assert_eq!(
        after,
        seen.len(),
        "kernels were timed with no profiler listening"
    );
}

/// Uniform and normal numbers are generated on the device (`Backend::random`: Philox on the
/// GPU, element `i` from its own words of the stream) and equal the host's draws bit for
/// bit, in every dtype, stateless and stateful; a truncated normal (sequential redraws)
/// is drawn on the host.
#[test]
fn random_numbers_are_generated_on_the_device_as_the_host_draws_them() {
    use ferroflow_tensor::random::{self, Philox};
    use ferroflow_tensor::{DType, HostData, RandomDistribution};
    let Some(device) = emulated_device() else {
        return;
    };
    let backend = ferroflow_tensor::device::backend_for(device).expect("the emulated backend");
    let n = 1001; // odd: the last uniform uses half of its Philox block
    let seed = [0x0123_4567_89AB_CDEF, 0xFEDC_BA98_7654_3210];
    ferroflow_tensor::with_device(&device.to_string(), || -> ferroflow_tensor::Result<()> {
        for dtype in [
            DType::F32,
            DType::F64,
            DType::F16,
            DType::BF16,
            DType::I32,
            DType::I64,
            DType::U8,
            DType::I8,
        ] {
            let (lo, hi) = if dtype.is_int() {
                (-3.5, 200.0)
            } else {
                (-2.0, 5.0)
            };
            let uniform = RandomDistribution::Uniform {
                minval: lo,
                maxval: hi,
            };
            assert!(
                backend.random(0, &uniform, n, seed, dtype).is_some(),
                "no uniform generator for {dtype}"
            );
            let mut g = Philox::new(seed);
            let want: Vec<f64> = (0..n)
                .map(|_| {
                    let u = g.next_f64();
                    if dtype.is_int() {
                        lo.ceil() + (u * (hi.ceil() - lo.ceil())).floor()
                    } else {
                        lo + (hi - lo) * u
                    }
                })
                .collect();
            let want = HostData::from_f64_slice(dtype, &want).to_f64_vec();
            let got = random::stateless_uniform(&[n], seed, lo, hi, dtype)?;
            assert_eq!(got.device(), device);
            assert!(same_bits(&got.to_f64_vec()?, &want), "uniform {dtype}");
            if !dtype.is_float() {
                continue;
            }
            let mut g = Philox::new(seed);
            let want: Vec<f64> = (0..n).map(|_| 0.5 + 3.0 * g.next_normal()).collect();
            let want = HostData::from_f64_slice(dtype, &want).to_f64_vec();
            let got = random::stateless_normal(&[n], seed, 0.5, 3.0, dtype)?;
            assert!(same_bits(&got.to_f64_vec()?, &want), "normal {dtype}");
        }
        let truncated = RandomDistribution::TruncatedNormal {
            mean: 0.0,
            stddev: 1.0,
        };
        assert!(backend.random(0, &truncated, n, seed, DType::F32).is_none());
        let t = random::stateless_truncated_normal(&[n], seed, 0.0, 1.0, DType::F32)?;
        assert!(t.to_f64_vec()?.iter().all(|v| v.abs() <= 2.0));
        // Stateful draws: the same seed sequence on the device as on the host.
        let draw = || random::normal(&[64], 0.0, 1.0, DType::F32, None)?.to_f64_vec();
        let a = ferroflow_tensor::testing::seeded(11, draw)?;
        let b = ferroflow_tensor::testing::seeded(11, draw)?;
        assert_eq!(a, b);
        Ok(())
    })
    .expect("the emulated device")
    .expect("random numbers");
}
