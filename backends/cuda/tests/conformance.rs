//! The shared backend conformance suite on the first CUDA device (`/GPU:0`), with no other
//! backend registered (the suite needs none).
//!
//! Without an NVIDIA GPU, driver and CUDA libraries (12, or 13 with the feature `cuda-13`) every test skips with one loud line,
//! unless `FERROFLOW_REQUIRE_CUDA=1` (the H200 script of `cargo xtask gpu`), where a missing
//! device fails the run.

mod common;

/// `/GPU:0` served by CUDA, or `None` after one loud line (a failure when
/// `FERROFLOW_REQUIRE_CUDA=1`).
fn cuda_device() -> Option<ferroflow_tensor::Device> {
    // The suite checks float32 products against float64 at float32's tolerance: full
    // float32, as TF's own tests run them.
    ferroflow_cuda::set_tensor_float_32_execution(false);
    if ferroflow_cuda::register() > 0 {
        return Some(ferroflow_tensor::Device::gpu(0));
    }
    let why = match ferroflow_cuda::devices_or_error() {
        Ok(_) => "the NVIDIA driver found no CUDA device".to_string(),
        Err(e) => e,
    };
    ferroflow_tensor::testing::skip(
        "FERROFLOW_REQUIRE_CUDA",
        &format!("{why}; the CUDA conformance suite did not run"),
    );
    None
}

ferroflow_tensor::conformance_tests!(optional: cuda_device());

/// Long reductions take each of the reduction's plans (see `common`): 300 rows (more than
/// twice an H200's multiprocessors) take the block-per-output kernels.
#[test]
fn long_reductions_match_references_in_every_plan() {
    if let Some(device) = cuda_device() {
        common::long_reductions_match_references(device, 300);
    }
}

/// Where cuDNN loads (`FERROFLOW_REQUIRE_CUDNN=1` makes its absence a failure), float
/// convolutions and pooling go through it: the values of
/// `common::cudnn_path_matches_own_kernels`, and a cuDNN plan (no refusal) for each of its
/// convolutions and poolings in float32, float16 and bfloat16.
#[test]
fn convolutions_run_through_cudnn_where_it_loads() {
    use ferroflow_tensor::DType;
    let Some(device) = cuda_device() else {
        return;
    };
    if let Err(why) = ferroflow_cuda::cudnn_version() {
        ferroflow_tensor::testing::skip("FERROFLOW_REQUIRE_CUDNN", &why);
        return;
    }
    common::cudnn_path_matches_own_kernels(device);
    let plans = ferroflow_cuda::cudnn_plans();
    let cases = [
        ("conv2d", common::CUDNN_CASE_INPUT, 7),
        ("conv2d_backprop_input", common::CUDNN_CASE_INPUT, 7),
        ("conv2d_backprop_filter", common::CUDNN_CASE_INPUT, 7),
        ("max_pool2d", common::CUDNN_POOL_INPUT, 5),
        ("avg_pool2d", common::CUDNN_POOL_INPUT, 5),
    ];
    for dtype in [DType::F32, DType::F16, DType::BF16] {
        for (op, input, filters) in cases {
            let plan = plans
                .iter()
                .find(|p| p.op == op && p.dtype == dtype && p.input == input)
                .unwrap_or_else(|| panic!("no cuDNN plan for {op} in {dtype}: {plans:?}"));
            assert!(
                plan.algorithm.is_ok(),
                "cuDNN refused {op} in {dtype}: {plan:?}"
            );
            let stride = if filters == 7 { 2 } else { 1 };
            assert_eq!(
                (plan.filters, plan.kernel, plan.strides),
                (filters, [3, 3], [stride, stride]),
                "{op} in {dtype}"
            );
        }
    }
    println!("{}", ferroflow_cuda::cudnn_report().join("\n"));
}

/// NCCL's collectives with one rank per CUDA device of the machine (one rank where it has
/// one GPU: NCCL runs no two ranks on one device), where `libnccl.so.2` loads
/// (`FERROFLOW_REQUIRE_NCCL=1` makes its absence a failure).
#[test]
fn nccl_collectives_on_every_gpu() {
    if cuda_device().is_none() {
        return;
    }
    if let Err(why) = ferroflow_cuda::nccl::nccl_version() {
        ferroflow_tensor::testing::skip("FERROFLOW_REQUIRE_NCCL", &why);
        return;
    }
    let gpus: Vec<_> = (0..ferroflow_cuda::devices().len())
        .map(ferroflow_tensor::Device::gpu)
        .collect();
    common::nccl_collectives_match_references(&gpus);
    common::nccl_local_group_matches_references(&gpus);
    println!(
        "{} over {} GPU(s)",
        ferroflow_cuda::nccl::nccl_version().unwrap_or_default(),
        gpus.len()
    );
}
