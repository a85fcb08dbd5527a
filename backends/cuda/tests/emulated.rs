//! The shared backend conformance suite on the CUDA backend's host emulation
//! (`ferroflow_cuda::emulation`): the backend's CUDA C, compiled by the system's C++
//! compiler, with its own views, launch parameters, error words and GEMM operand forms,
//! against the suite's float64 references — on any machine with a C++ compiler, no GPU.
//!
//! Without a C++ compiler every test skips with one loud line, unless
//! `FERROFLOW_REQUIRE_CXX=1` (CI), where that is a failure.

fn emulated_device() -> Option<ferroflow_tensor::Device> {
    if ferroflow_cuda::emulation::available() {
        match ferroflow_cuda::emulation::register() {
            Ok(_) => return Some(ferroflow_tensor::Device::gpu(0)),
            Err(e) => panic!("the CUDA emulation did not start: {e}"),
        }
    }
    ferroflow_tensor::testing::skip(
        "FERROFLOW_REQUIRE_CXX",
        "no C++ compiler runs (set CXX, or install g++), the CUDA kernels' emulated \
         conformance suite did not run",
    );
    None
}

ferroflow_tensor::conformance_tests!(optional: emulated_device());

/// Long reductions into few outputs take the block-per-output kernels (a shared-memory tree
/// behind `__syncthreads`; real threads on the emulation): sums, products, extremes, with a
/// NaN propagating, in float32, float64 and wrapping int32, against float64 references.
#[test]
fn block_reductions_match_references() {
    use ferroflow_tensor::{DType, Tensor};
    let Some(device) = emulated_device() else {
        return;
    };
    let (rows, m) = (3usize, 1000usize);
    let values: Vec<f64> = (0..rows * m)
        .map(|i| ((i * 7919) % 1013) as f64 / 101.0 - 5.0)
        .collect();
    ferroflow_tensor::with_device(&device.to_string(), || -> ferroflow_tensor::Result<()> {
        for dtype in [DType::F32, DType::F64] {
            let x = Tensor::from_vec(values.clone(), &[rows, m])?.cast(dtype)?;
            let exact: Vec<f64> = x.to_f64_vec()?;
            let exact_row = |r: usize| &exact[r * m..(r + 1) * m];
            let sums = x.reduce_sum(1, false)?.to_f64_vec()?;
            let maxes = x.reduce_max(1, false)?.to_f64_vec()?;
            let mins = x.reduce_min(1, false)?.to_f64_vec()?;
            for r in 0..rows {
                let want: f64 = exact_row(r).iter().sum();
                assert!(
                    (sums[r] - want).abs() <= 1e-4 * want.abs().max(1.0),
                    "{dtype} sum of row {r}: {} vs {want}",
                    sums[r]
                );
                let hi = exact_row(r).iter().copied().fold(f64::MIN, f64::max);
                let lo = exact_row(r).iter().copied().fold(f64::MAX, f64::min);
                assert_eq!((maxes[r], mins[r]), (hi, lo), "{dtype} extremes of row {r}");
            }
            // Products of values near 1 stay finite.
            let near_one = x
                .div(&Tensor::scalar(1000.0f64)?.cast(dtype)?)?
                .add(&Tensor::scalar(1.0f64)?.cast(dtype)?)?;
            let exact_near: Vec<f64> = near_one.to_f64_vec()?;
            let prods = near_one.reduce_prod(1, false)?.to_f64_vec()?;
            for r in 0..rows {
                let want: f64 = exact_near[r * m..(r + 1) * m].iter().product();
                assert!(
                    (prods[r] - want).abs() <= 1e-4 * want.abs(),
                    "{dtype} product of row {r}: {} vs {want}",
                    prods[r]
                );
            }
            // A NaN anywhere in a row wins its max and min.
            let mut with_nan = values.clone();
            with_nan[m + 517] = f64::NAN;
            let y = Tensor::from_vec(with_nan, &[rows, m])?.cast(dtype)?;
            let ymax = y.reduce_max(1, false)?.to_f64_vec()?;
            let ymin = y.reduce_min(1, false)?.to_f64_vec()?;
            assert!(
                ymax[1].is_nan() && ymin[1].is_nan(),
                "{dtype}: NaN did not propagate"
            );
            assert!(!ymax[0].is_nan() && !ymax[2].is_nan());
        }
        // int32 sums wrap as on the CPU.
        let ints: Vec<i32> = (0..rows * m)
            .map(|i| (i as i32).wrapping_mul(2_654_435))
            .collect();
        let x = Tensor::from_vec(ints.clone(), &[rows, m])?;
        let sums = x.reduce_sum(1, false)?.to_vec::<i32>()?;
        for r in 0..rows {
            let want = ints[r * m..(r + 1) * m]
                .iter()
                .fold(0i32, |a, &b| a.wrapping_add(b));
            assert_eq!(sums[r], want, "int32 sum of row {r}");
        }
        Ok(())
    })
    .expect("the emulated device")
    .expect("block reductions");
}
