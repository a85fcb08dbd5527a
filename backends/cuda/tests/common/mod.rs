//! Checks shared by the CUDA suites on the real device (`conformance.rs`) and on the host
//! emulation (`emulated*.rs`); each uses a part.
#![allow(dead_code)]

/// The emulated device `/GPU:0` (after `configure` set the backend up for the suite), or
/// `None` after one loud line saying that `missed` was not checked (a failure when
/// `FERROFLOW_REQUIRE_CXX=1`, as in CI) where no C++ compiler runs.
pub fn emulated_device(configure: fn(), missed: &str) -> Option<ferroflow_tensor::Device> {
    configure();
    if ferroflow_cuda::emulation::available() {
        match ferroflow_cuda::emulation::register() {
            Ok(_) => return Some(ferroflow_tensor::Device::gpu(0)),
            Err(e) => panic!("the CUDA emulation did not start: {e}"),
        }
    }
    ferroflow_tensor::testing::skip(
        "FERROFLOW_REQUIRE_CXX",
        &format!("no C++ compiler runs (set CXX, or install g++), {missed} on the CUDA emulation"),
    );
    None
}

/// Runs `check` (a conformance family) on [`emulated_device`] as the default device.
pub fn on_emulated_device(configure: fn(), missed: &str, check: fn(&ferroflow_tensor::Device)) {
    let Some(device) = emulated_device(configure, missed) else {
        return;
    };
    ferroflow_tensor::with_device(&device.to_string(), || check(&device))
        .expect("the emulated device");
}

/// Long reductions take each of the reduction's plans: the block-per-output kernels (a
/// shared-memory tree behind `__syncthreads`; real threads on the emulation) for rows along
/// the contiguous axis, and the split kernels (partials over interleaved segments, then a
/// tree per output) for columns (outputs along the contiguous axis, batch norm's moments)
/// and for one output (a full reduction): sums, products, extremes, with a NaN propagating,
/// in float32, float64 and wrapping int32, against float64 references. `rows` (≥ 2): the
/// outputs of the row and column plans (the backend picks blocks from a number of rows
/// that depends on the device).
pub fn long_reductions_match_references(device: ferroflow_tensor::Device, rows: usize) {
    use ferroflow_tensor::{DType, Tensor};
    let m = 1000usize;
    let values: Vec<f64> = (0..rows * m)
        .map(|i| ((i * 7919) % 1013) as f64 / 101.0 - 5.0)
        .collect();
    type Reduce = fn(&Tensor, isize) -> ferroflow_tensor::Result<Tensor>;
    // Row r of `x` ([rows, m]) reduced by `f`, by each plan: (plan, one value per row).
    let by_plan = |x: &Tensor, f: Reduce| -> ferroflow_tensor::Result<Vec<(&str, Vec<f64>)>> {
        let blocks = f(x, 1)?.to_f64_vec()?;
        let columns = f(&x.transpose(&[1, 0])?.copy()?, 0)?.to_f64_vec()?;
        let single = (0..rows)
            .map(|r| {
                let row = x.slice(&[r, 0], &[1, m as isize])?.reshape(&[m as isize])?;
                Ok(f(&row, 0)?.to_f64_vec()?[0])
            })
            .collect::<ferroflow_tensor::Result<Vec<f64>>>()?;
        Ok(vec![
            ("blocks", blocks),
            ("columns", columns),
            ("one output", single),
        ])
    };
    let sum: Reduce = |x, a| x.reduce_sum(a, false);
    let prod: Reduce = |x, a| x.reduce_prod(a, false);
    let max: Reduce = |x, a| x.reduce_max(a, false);
    let min: Reduce = |x, a| x.reduce_min(a, false);
    let mean: Reduce = |x, a| x.reduce_mean(a, false);
    ferroflow_tensor::with_device(&device.to_string(), || -> ferroflow_tensor::Result<()> {
        for dtype in [DType::F32, DType::F64] {
            let x = Tensor::from_vec(values.clone(), &[rows, m])?.cast(dtype)?;
            let exact: Vec<f64> = x.to_f64_vec()?;
            let exact_row = |r: usize| &exact[r * m..(r + 1) * m];
            for (plan, sums) in by_plan(&x, sum)? {
                for (r, got) in sums.iter().enumerate() {
                    let want: f64 = exact_row(r).iter().sum();
                    assert!(
                        (got - want).abs() <= 1e-4 * want.abs().max(1.0),
                        "{dtype} sum of row {r} ({plan}): {got} vs {want}"
                    );
                }
            }
            for (plan, means) in by_plan(&x, mean)? {
                for (r, got) in means.iter().enumerate() {
                    let want: f64 = exact_row(r).iter().sum::<f64>() / m as f64;
                    assert!(
                        (got - want).abs() <= 1e-6 * want.abs().max(1e-2),
                        "{dtype} mean of row {r} ({plan}): {got} vs {want}"
                    );
                }
            }
            for ((plan, maxes), (_, mins)) in by_plan(&x, max)?.into_iter().zip(by_plan(&x, min)?) {
                for r in 0..rows {
                    let hi = exact_row(r).iter().copied().fold(f64::MIN, f64::max);
                    let lo = exact_row(r).iter().copied().fold(f64::MAX, f64::min);
                    assert_eq!(
                        (maxes[r], mins[r]),
                        (hi, lo),
                        "{dtype} extremes of row {r} ({plan})"
                    );
                }
            }
            // Products of values near 1 stay finite.
            let near_one = x
                .div(&Tensor::scalar(1000.0f64)?.cast(dtype)?)?
                .add(&Tensor::scalar(1.0f64)?.cast(dtype)?)?;
            let exact_near: Vec<f64> = near_one.to_f64_vec()?;
            for (plan, prods) in by_plan(&near_one, prod)? {
                for r in 0..rows {
                    let want: f64 = exact_near[r * m..(r + 1) * m].iter().product();
                    assert!(
                        (prods[r] - want).abs() <= 1e-4 * want.abs(),
                        "{dtype} product of row {r} ({plan}): {} vs {want}",
                        prods[r]
                    );
                }
            }
            // A NaN anywhere in a row wins its max and min.
            let mut with_nan = values.clone();
            with_nan[m + 517] = f64::NAN;
            let y = Tensor::from_vec(with_nan, &[rows, m])?.cast(dtype)?;
            for ((plan, ymax), (_, ymin)) in by_plan(&y, max)?.into_iter().zip(by_plan(&y, min)?) {
                assert!(
                    ymax[1].is_nan() && ymin[1].is_nan(),
                    "{dtype} ({plan}): NaN did not propagate"
                );
                assert!(!ymax[0].is_nan() && !ymax[2].is_nan(), "{dtype} ({plan})");
            }
        }
        // int32 sums wrap as on the CPU.
        let ints: Vec<i32> = (0..rows * m)
            .map(|i| (i as i32).wrapping_mul(2_654_435))
            .collect();
        let x = Tensor::from_vec(ints.clone(), &[rows, m])?;
        for (plan, sums) in by_plan(&x, sum)? {
            for r in 0..rows {
                let want = ints[r * m..(r + 1) * m]
                    .iter()
                    .fold(0i32, |a, &b| a.wrapping_add(b));
                assert_eq!(sums[r] as i32, want, "int32 sum of row {r} ({plan})");
            }
        }
        // Their means: the wrapped sum divided with truncation, as on the CPU.
        for (plan, means) in by_plan(&x, mean)? {
            for r in 0..rows {
                let sum = ints[r * m..(r + 1) * m]
                    .iter()
                    .fold(0i32, |a, &b| a.wrapping_add(b));
                assert_eq!(
                    means[r] as i32,
                    sum / m as i32,
                    "int32 mean of row {r} ({plan})"
                );
            }
        }
        Ok(())
    })
    .expect("the emulated device")
    .expect("long reductions");
}

/// The input cuDNN runs [`cudnn_path_matches_own_kernels`]'s convolutions on: `[3, 12, 10,
/// 5]` with a row and a column of zeros appended (stride 2, SAME: TF pads one more after).
pub const CUDNN_CASE_INPUT: [usize; 4] = [3, 13, 11, 5];

/// The input of [`cudnn_path_matches_own_kernels`]'s pooling (as cuDNN runs it: no zeros
/// appended).
pub const CUDNN_POOL_INPUT: [usize; 4] = [3, 12, 10, 5];

/// The backend's cuDNN path (on a GPU cuDNN; on the emulation its stand-in) and its own
/// kernels (cuDNN turned off for a moment: tests that convolve meanwhile take the own
/// kernels, which the suite checks too) give the same values for a stride-2 SAME
/// convolution whose padding TF puts one more after than before, its two gradients, and
/// max and average pooling over a 3×3 SAME window at stride 1 (padding alike on both sides;
/// [`CUDNN_POOL_INPUT`]), in float32, float16 and bfloat16.
pub fn cudnn_path_matches_own_kernels(device: ferroflow_tensor::Device) {
    use ferroflow_tensor::{DType, Padding, Tensor};
    let (xs, fs) = ([3, 12, 10, 5], [3, 3, 5, 7]);
    let run = |dtype: DType| -> ferroflow_tensor::Result<Vec<Vec<f64>>> {
        ferroflow_tensor::with_device(&device.to_string(), || -> ferroflow_tensor::Result<_> {
            let values = |n: usize, k: usize| -> Vec<f64> {
                (0..n).map(|i| ((i * k) % 97) as f64 / 48.5 - 1.0).collect()
            };
            let x = Tensor::from_vec(values(xs.iter().product(), 31), &xs)?.cast(dtype)?;
            let f = Tensor::from_vec(values(fs.iter().product(), 17), &fs)?.cast(dtype)?;
            let y = x.conv2d(&f, [2, 2], Padding::Same, [1, 1])?;
            let dy = y.mul(&y)?;
            let dx = Tensor::conv2d_backprop_input(xs, &f, &dy, [2, 2], Padding::Same, [1, 1])?;
            let df = x.conv2d_backprop_filter(fs, &dy, [2, 2], Padding::Same, [1, 1])?;
            let max = x.max_pool2d([3, 3], [1, 1], Padding::Same)?;
            let avg = x.avg_pool2d([3, 3], [1, 1], Padding::Same)?;
            [y, dx, df, max, avg]
                .iter()
                .map(|t| t.to_f64_vec())
                .collect()
        })?
    };
    for (dtype, tolerance) in [(DType::F32, 1e-4), (DType::F16, 2e-2), (DType::BF16, 1e-1)] {
        let with_cudnn = run(dtype).expect("convolutions through cuDNN");
        ferroflow_cuda::set_cudnn_enabled(false);
        let without = run(dtype);
        ferroflow_cuda::set_cudnn_enabled(true);
        let without = without.expect("convolutions on the backend's kernels");
        let ops = [
            "conv2d",
            "backprop_input",
            "backprop_filter",
            "max_pool",
            "avg_pool",
        ];
        assert_eq!(with_cudnn.len(), ops.len());
        for (what, (a, b)) in ops.iter().zip(with_cudnn.iter().zip(&without)) {
            assert_eq!(a.len(), b.len(), "{dtype} {what}");
            let scale = b.iter().fold(1.0f64, |m, v| m.max(v.abs()));
            for (i, (p, q)) in a.iter().zip(b).enumerate() {
                assert!(
                    (p - q).abs() <= tolerance * scale,
                    "{dtype} {what}[{i}]: cuDNN path {p}, own kernels {q}"
                );
            }
        }
    }
}
