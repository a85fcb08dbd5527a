//! `mixed_float16` on the wgpu device: float16 compute (the adapter's SHADER_F16), float32
//! variables, dynamic loss scaling; the MLP learns as well as under float32 on the CPU.

mod common;

use ferroflow_keras::mixed_precision::{set_global_policy, Policy};
use ferroflow_keras::{applications, losses::SparseCategoricalCrossentropy, FitConfig, Model};
use ferroflow_optim::Adam;
use ferroflow_tensor::{random, with_device, DType, Device, Result, Tensor};

fn accuracy_after_training(
    policy: &str,
    device: Device,
    x: &Tensor,
    y: &Tensor,
) -> Result<(f64, DType)> {
    set_global_policy(Policy::new(policy)?);
    random::set_seed(3);
    let r = with_device(&device.to_string(), || -> Result<(f64, DType)> {
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
        let hidden = model.predict(&x.slice(&[0, 0, 0, 0], &[2, -1, -1, -1])?, 2)?;
        let acc = h
            .get("accuracy")
            .and_then(|a| a.last().copied())
            .unwrap_or(0.0);
        Ok((acc, hidden.dtype()))
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
        eprintln!("SKIPPED: this adapter has no SHADER_F16, float16 is not computed on it");
        return;
    }
    let (x, y) = common::mnist(960).expect("MNIST from datasets/mnist");
    // The float32 reference trains on the CPU (same seed, same data order).
    let (f32_acc, f32_out) =
        accuracy_after_training("float32", Device::CPU, &x, &y).expect("float32");
    let (f16_acc, f16_out) = accuracy_after_training("mixed_float16", gpu, &x, &y).expect("mixed");
    println!("training accuracy: float32 (CPU) {f32_acc:.4}, mixed_float16 (wgpu) {f16_acc:.4}");
    // The logits layer stays float32 under a mixed policy (the guide's advice).
    assert_eq!((f32_out, f16_out), (DType::F32, DType::F32));
    assert!(f32_acc > 0.85, "float32 did not learn: {f32_acc}");
    assert!(
        (f32_acc - f16_acc).abs() <= 0.02,
        "mixed_float16 {f16_acc} vs float32 {f32_acc}"
    );
}
