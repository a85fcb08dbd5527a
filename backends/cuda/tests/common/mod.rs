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

/// NCCL's collectives through [`ferroflow_cuda::nccl`] with one rank per entry of
/// `devices` (each in a thread of its own, as NCCL's ranks of one process are): all-reduce
/// sums in every dtype it takes (a transposed view among them), averages, an all-gather
/// and a broadcast, against the sums of the ranks' values computed here. The values are
/// small integers, exact in every float type, so every result must equal its reference;
/// a dtype NCCL does not reduce is an error.
pub fn nccl_collectives_match_references(devices: &[ferroflow_tensor::Device]) {
    use ferroflow_cuda::nccl::{NcclCommunicator, NcclId};
    use ferroflow_tensor::distribution::ReduceOp;
    use ferroflow_tensor::{DType, Tensor};
    let world = devices.len();
    let value = |rank: usize, i: usize| ((i * 7 + rank * 3) % 11) as f64 - 5.0;
    let values = |rank: usize, n: usize| (0..n).map(|i| value(rank, i)).collect::<Vec<f64>>();
    let id = NcclId::new(devices[0]).expect("an NCCL id");
    let rank_checks = |rank: usize, device: ferroflow_tensor::Device| {
        let on = |data: Vec<f64>, shape: &[usize], dtype: DType| {
            Tensor::from_host_on(ferroflow_tensor::HostData::F64(data), shape, device)
                .and_then(|t| t.cast(dtype))
                .expect("a tensor on the device")
        };
        let comm = NcclCommunicator::new(
            device,
            &id,
            rank,
            world,
            std::time::Duration::from_secs(120),
        )
        .expect("joining the communicator");
        let dtypes = [
            DType::F32,
            DType::F64,
            DType::F16,
            DType::BF16,
            DType::I32,
            DType::I64,
        ];
        let mut inputs: Vec<Tensor> = dtypes
            .iter()
            .map(|&d| on(values(rank, 65), &[5, 13], d))
            .collect();
        inputs.push(inputs[0].transpose(&[1, 0]).expect("a view"));
        let sums = comm.all_reduce(&inputs, ReduceOp::Sum).expect("all_reduce");
        let sum_of = |i: usize| (0..world).map(|r| value(r, i)).sum::<f64>();
        for (k, (s, x)) in sums.iter().zip(&inputs).enumerate() {
            assert_eq!(
                (s.dtype(), s.shape(), s.device()),
                (x.dtype(), x.shape(), device),
                "sum {k}"
            );
            let got = s
                .contiguous()
                .and_then(|t| t.to_f64_vec())
                .expect("read back");
            let reference: Vec<f64> = match k {
                6 => (0..13)
                    .flat_map(|c| (0..5).map(move |r| r * 13 + c))
                    .map(sum_of)
                    .collect(),
                _ => (0..65).map(sum_of).collect(),
            };
            assert_eq!(
                got,
                reference,
                "rank {rank}: the sum of input {k} ({})",
                x.dtype()
            );
        }
        let means = comm
            .all_reduce(&inputs[..2], ReduceOp::Mean)
            .expect("average");
        for m in &means {
            for (i, got) in m.to_f64_vec().expect("read back").iter().enumerate() {
                let want = sum_of(i) / world as f64;
                assert!(
                    (got - want).abs() <= 1e-6,
                    "rank {rank}: average[{i}] {got} vs {want}"
                );
            }
        }
        let mine = on(values(rank, 6), &[2, 3], DType::I64);
        let gathered = comm.all_gather(&mine).expect("all_gather");
        assert_eq!(gathered.shape(), &[2 * world, 3]);
        let want: Vec<f64> = (0..world).flat_map(|r| values(r, 6)).collect();
        assert_eq!(
            gathered.to_f64_vec().expect("read back"),
            want,
            "rank {rank}: all_gather"
        );
        let root = world - 1;
        let sent = comm
            .broadcast(&on(values(rank, 9), &[9], DType::F64), root)
            .expect("broadcast");
        assert_eq!(
            sent.to_f64_vec().expect("read back"),
            values(root, 9),
            "rank {rank}: broadcast"
        );
        let bytes = on(values(rank, 4), &[4], DType::I8);
        assert!(
            comm.all_reduce(&[bytes], ReduceOp::Sum).is_err(),
            "int8 is not reduced"
        );
    };
    std::thread::scope(|s| {
        let ranks: Vec<_> = devices
            .iter()
            .enumerate()
            .map(|(rank, &device)| s.spawn(move || rank_checks(rank, device)))
            .collect();
        for (rank, r) in ranks.into_iter().enumerate() {
            if let Err(panic) = r.join() {
                std::panic::resume_unwind(Box::new(format!("rank {rank}: {panic:?}")));
            }
        }
    });
}

/// One NCCL group across this process's `devices` (distinct devices; MirroredStrategy's
/// `NcclAllReduce`): [`ferroflow_cuda::nccl::NcclCommunicator::for_devices`] and
/// `all_reduce_together` sum each device's float32 and int64 tensors, every result on its
/// own device and equal to the sum computed here.
pub fn nccl_local_group_matches_references(devices: &[ferroflow_tensor::Device]) {
    use ferroflow_cuda::nccl::NcclCommunicator;
    use ferroflow_tensor::distribution::ReduceOp;
    use ferroflow_tensor::{DType, HostData, Tensor};
    let n = devices.len();
    let value = |rank: usize, i: usize| ((i * 5 + rank * 7) % 13) as f64 - 6.0;
    let comms = NcclCommunicator::for_devices(devices, std::time::Duration::from_secs(120))
        .expect("a communicator per device");
    assert_eq!(comms.len(), n);
    let per_device: Vec<Vec<Tensor>> = devices
        .iter()
        .enumerate()
        .map(|(rank, &d)| {
            let values: Vec<f64> = (0..40).map(|i| value(rank, i)).collect();
            [DType::F32, DType::I64]
                .iter()
                .map(|&dtype| {
                    Tensor::from_host_on(HostData::F64(values.clone()), &[4, 10], d)
                        .and_then(|t| t.cast(dtype))
                        .expect("a tensor on the device")
                })
                .collect()
        })
        .collect();
    let sums = NcclCommunicator::all_reduce_together(&comms, &per_device, ReduceOp::Sum)
        .expect("all_reduce_together");
    let want: Vec<f64> = (0..40).map(|i| (0..n).map(|r| value(r, i)).sum()).collect();
    for (rank, (results, &device)) in sums.iter().zip(devices).enumerate() {
        for t in results {
            assert_eq!(t.device(), device, "rank {rank}");
            assert_eq!(
                t.to_f64_vec().expect("read back"),
                want,
                "rank {rank}: {}",
                t.dtype()
            );
        }
    }
    assert!(
        NcclCommunicator::all_reduce_together(&comms, &per_device[..n - 1], ReduceOp::Sum).is_err(),
        "a list missing for a device"
    );
}
