//! The NumPy API (`ferroflow-numpy`) on the GPU: the same NumPy-style program run in a
//! `/GPU:0` scope and on the CPU gives the same arrays, and its arrays stay on the GPU.
//! wgpu has no float64, so the program runs with `prefer_float32` (TF's switch for it).

mod common;

use ferroflow_numpy::{self as np, idx, DType, Tensor};
use ferroflow_tensor::Result;

/// A program touching each family: creation, promotion with scalars, ufuncs, reductions,
/// products, sorting, indexing, clipping and linalg.
fn program() -> Result<Vec<Tensor>> {
    let a = np::reshape(np::arange(0.0, 12.0, 1.0, None)?, &[3, 4])?;
    let b = np::asarray([[1.0f32, -2.0, 0.5, 3.0]])?;
    let x = np::add(np::multiply(&a, 0.25)?, &b)?; // broadcasting and a scalar
    let e = np::exp(np::negative(&x)?)?;
    let s = np::sum_with(&e, np::ReduceArgs::new().axis(1))?;
    let m = np::mean_with(&x, np::ReduceArgs::new().keepdims(true))?;
    let mm = np::matmul(&x, np::transpose(&x, None)?)?;
    let es = np::einsum("ij,kj->ik", &[&x, &x])?;
    let sorted = np::sort(&x, Some(-1))?;
    let order = np::argsort(&x, Some(0))?;
    let picked = np::take(&x, np::asarray([2i64, 0])?, Some(0))?;
    let masked = np::getitem(&x, idx![np::greater(&x, 1.0)?])?;
    let sliced = np::getitem(&x, idx![1.., np::step(.., -2)])?;
    let clipped = np::clip(&x, -0.5, 1.5)?;
    let w = np::where_(np::less(&x, 0.0)?, &x, 0.0)?;
    let c = np::cumsum(&x, Some(1))?;
    let am = np::argmax(&x, Some(1))?;
    let sq = np::add(np::matmul(&x, np::transpose(&x, None)?)?, np::eye(3)?)?;
    let inv = np::linalg::inv(&sq)?;
    let n = np::linalg::norm_with(&x, np::linalg::NormOrd::Fro, None, false)?;
    Ok(vec![
        x, e, s, m, mm, es, sorted, order, picked, masked, sliced, clipped, w, c, am, inv, n,
    ])
}

#[test]
fn numpy_programs_run_on_the_gpu_as_on_the_cpu() {
    let Some(gpu) = common::wgpu_device() else {
        return;
    };
    np::set_prefer_float32(true);
    let on_cpu = ferroflow_tensor::with_device("/CPU:0", program)
        .expect("cpu scope")
        .expect("cpu program");
    let on_gpu = ferroflow_tensor::with_device(&gpu.to_string(), program)
        .expect("gpu scope")
        .expect("gpu program");
    np::set_prefer_float32(false);
    for (i, (c, g)) in on_cpu.iter().zip(&on_gpu).enumerate() {
        assert_eq!(g.device(), gpu, "result {i} left the GPU");
        assert_eq!((g.shape(), g.dtype()), (c.shape(), c.dtype()), "result {i}");
        let (cv, gv) = (c.to_f64_vec().expect("cpu"), g.to_f64_vec().expect("gpu"));
        for (j, (p, q)) in cv.iter().zip(&gv).enumerate() {
            assert!(
                (p - q).abs() <= 1e-4 * p.abs().max(1.0),
                "result {i} element {j}: cpu {p}, gpu {q}"
            );
        }
    }
    assert_eq!(on_gpu[0].dtype(), DType::F32);
}
