//! `mixed_float16` on the wgpu device: float16 compute (the adapter's SHADER_F16), float32
//! variables, dynamic loss scaling; the MLP learns as well as under float32 on the CPU.

mod common;

use ferroflow_keras::mixed_precision::{set_global_policy, Policy};
use ferroflow_keras::{applications, losses::SparseCategoricalCrossentropy, FitConfig, Model};
use ferroflow_optim::Adam;
use ferroflow_tensor::dispatch::{push_thread_observer, OpEvent, OpObserver};
use ferroflow_tensor::{random, with_device, DType, Device, Op, Result, Tensor};
use std::sync::{Arc, Mutex};

/// Records the output dtype and device of every matmul (the Dense layers' products).
#[derive(Default)]
struct MatmulDtypes(Mutex<Vec<(DType, Device)>>);

impl OpObserver for MatmulDtypes {
    fn on_op(&self, e: &OpEvent<'_>) {
        if matches!(e.op, Op::MatMul { .. }) {
            let mut seen = self.0.lock().unwrap();
            seen.extend(e.outputs.iter().map(|t| (t.dtype(), e.device)));
        }
    }
}

/// Accuracy after training, the logits' dtype, and the dtypes and devices the hidden
/// layers' matmuls computed in during `predict`.
type Trained = (f64, DType, Vec<(DType, Device)>);

fn accuracy_after_training(
    policy: &str,
    device: Device,
    x: &Tensor,
    y: &Tensor,
) -> Result<Trained> {
    set_global_policy(Policy::new(policy)?);
    random::set_seed(3);
    let r = with_device(&device.to_string(), || -> Result<Trained> {
        let mut model = Model::from(applications::mnist_mlp());
        model.build(&[28, 28, 1])?;
        model.compile(
            Adam::new(1e-3),
            SparseCategoricalCrossentropy::new(true),
            &["accuracy"],
        )?;
        let h = model.fit(
            x,
            y,
            FitConfig::new()
                .epochs(6)
                .batch_size(64)
                .shuffle(false)
                .verbose(0),
        )?;
        let seen = Arc::new(MatmulDtypes::default());
        let logits = {
            let _watch = push_thread_observer(seen.clone());
            model.predict(&x.slice(&[0, 0, 0, 0], &[2, -1, -1, -1])?, 2)?
        };
        let acc = h
            .get("accuracy")
            .and_then(|a| a.last().copied())
            .unwrap_or(0.0);
        let matmuls = seen.0.lock().unwrap().clone();
        Ok((acc, logits.dtype(), matmuls))
    })?;
    set_global_policy(Policy::new("float32")?);
    r
}

#[test]
fn mixed_float16_trains_on_wgpu_like_float32() {
    let Some(gpu) = common::wgpu_device() else {
        return;
    };
    if !ferroflow_tensor::device_supports(gpu, DType::F16) {
        return ferroflow_tensor::testing::skip(
            "FERROFLOW_REQUIRE_SHADER_F16",
            "this adapter has no SHADER_F16, float16 is not computed on it",
        );
    }
    let (x, y) = common::mnist(960).expect("MNIST from datasets/mnist");
    // The float32 reference trains on the CPU (same seed, same data order).
    let (f32_acc, f32_out, f32_matmuls) =
        accuracy_after_training("float32", Device::CPU, &x, &y).expect("float32");
    let (f16_acc, f16_out, f16_matmuls) =
        accuracy_after_training("mixed_float16", gpu, &x, &y).expect("mixed");
    println!("training accuracy: float32 (CPU) {f32_acc:.4}, mixed_float16 (wgpu) {f16_acc:.4}");
    // The logits layer stays float32 under a mixed policy (the guide's advice).
    assert_eq!((f32_out, f16_out), (DType::F32, DType::F32));
    // The policy took effect: the hidden Dense layers multiply in float16 on the GPU
    // (the logits layer in float32), and nothing does under float32.
    assert!(
        f16_matmuls.contains(&(DType::F16, gpu)),
        "no float16 matmul ran on {gpu} under mixed_float16: {f16_matmuls:?}"
    );
    assert!(
        f32_matmuls.iter().all(|&(d, _)| d == DType::F32) && !f32_matmuls.is_empty(),
        "{f32_matmuls:?}"
    );
    assert!(f32_acc > 0.85, "float32 did not learn: {f32_acc}");
    assert!(
        (f32_acc - f16_acc).abs() <= 0.02,
        "mixed_float16 {f16_acc} vs float32 {f32_acc}"
    );
}
