//! What one training step costs the host: kernels dispatched, waits for the GPU and buffer
//! creations. Small-batch speed on a GPU is decided by these counts (each dispatch and each
//! wait costs tens of microseconds of driver time), so they are held to a budget.

mod common;

use ferroflow_keras::{applications, losses::SparseCategoricalCrossentropy, FitConfig, Model};
use ferroflow_optim::Adam;
use ferroflow_tensor::{random, with_device, DType};

#[test]
fn an_mlp_training_step_stays_within_its_dispatch_budget() {
    let Some(gpu) = common::wgpu_device() else {
        return;
    };
    random::set_seed(1);
    with_device(&gpu.to_string(), || {
        let mut model = Model::from(applications::mnist_mlp());
        model.build(&[28, 28, 1]).expect("build");
        model
            .compile(
                Adam::new(1e-3),
                SparseCategoricalCrossentropy::new(true),
                &["accuracy"],
            )
            .expect("compile");
        let x =
            random::stateless_uniform(&[640, 28, 28, 1], [1, 2], 0.0, 1.0, DType::F32).expect("x");
        let y = random::stateless_uniform(&[640], [1, 3], 0.0, 10.0, DType::I64).expect("y");
        let fit = |m: &mut Model| {
            m.fit(
                &x,
                &y,
                FitConfig::new().epochs(1).batch_size(128).verbose(0),
            )
            .expect("fit")
        };
        fit(&mut model);
        let (k0, r0, u0) = ferroflow_wgpu::counters();
        fit(&mut model);
        let (k1, r1, u1) = ferroflow_wgpu::counters();
        let per = |a: u64, b: u64| (b - a) as f64 / 5.0;
        let (kernels, reads, uploads) = (per(k0, k1), per(r0, r1), per(u0, u1));
        println!("per step: {kernels} kernels, {reads} reads, {uploads} uploads");
        // The batch's inputs and labels gathered by one kernel (`gather_group`), forward,
        // loss, backward and the fused Adam updates of all variables as one group (as many
        // variables per kernel as the adapter's storage-buffer limit takes: lavapipe's 32
        // take 4 of the 6, so 2 kernels; one on GPUs with more, 15 per step there), `fit`
        // running its step as a graph whose elementwise chains are one generated kernel
        // each (with the values other ops read as extra outputs, and a reduction at the
        // end inlined), the loss and its gradient one kernel (TF's
        // SparseSoftmaxCrossEntropyWithLogits), each Dense layer's product, bias and ReLU
        // one GEMM with an epilogue (TF's `_FusedMatMul`), the loss's mean one reduction
        // (TF's `Mean`), the accuracy read as the comparison's bools, and each backward
        // product with the ReLU and bias gradients of the layer below one GEMM
        // (`fused_matmul_reduce`, cuBLASLt's `DRELU_BGRAD`): 16 kernels (72 eagerly, 63
        // before the wgpu backend ran elementwise programs in one kernel, 57 before the
        // softmax cross-entropy's fused gradient, 46 before multi-output fusion, 42 before
        // fused reductions, 36 before the fused loss kernel, 28 before the fused products,
        // 25 before the grouped optimizer update, 21 before the one-kernel mean and the
        // accuracy without its cast, 19 before the backward GEMM epilogue, 17 before the
        // grouped gather).
        assert!(kernels <= 16.0, "{kernels} kernels per step");
        // The loss, the metrics and the labels' range check (one for the batch's gather).
        assert!(reads <= 5.0, "{reads} waits for the GPU per step");
        // The batch (x, y) and the step's changing scalars; constants come from the cache.
        assert!(uploads <= 6.0, "{uploads} uploads per step");
    })
    .expect("device scope");
}
