//! Device selection and naming, and the errors for what the wgpu backend does not do.

mod common;

use ferroflow_tensor::{list_devices, with_device, DType, Device, HostData, Tensor};

#[test]
fn gpu_devices_are_listed_with_their_adapter() {
    let Some(gpu) = common::wgpu_device() else {
        return;
    };
    let adapters = ferroflow_wgpu::adapters();
    let devices = list_devices();
    let (_, desc) = devices
        .iter()
        .find(|(d, _)| *d == gpu)
        .expect("/GPU:0 is listed");
    assert!(
        desc.starts_with("wgpu: ") && desc.contains(&adapters[0].name),
        "{desc}"
    );
    assert!(devices.iter().any(|(d, _)| *d == Device::CPU));
    // TF device strings select it; an ordinal past the adapters is an error saying so.
    let t = with_device("/device:GPU:0", || Tensor::from_slice(&[1.0f32, 2.0]))
        .expect("scope")
        .expect("tensor");
    assert_eq!(t.device(), gpu);
    let missing = format!("/GPU:{}", adapters.len());
    let e = with_device(&missing, || ())
        .expect_err("no such GPU")
        .to_string();
    assert!(e.contains("wgpu") && e.contains(&missing[1..]), "{e}");
}

#[test]
fn unsupported_dtypes_are_errors_naming_dtype_and_device() {
    let Some(gpu) = common::wgpu_device() else {
        return;
    };
    let name = &ferroflow_wgpu::adapters()[0].name;
    for data in [
        HostData::F64(vec![1.0]),
        HostData::BF16(vec![half::bf16::ONE]),
        HostData::U8(vec![1]),
        HostData::I8(vec![1]),
    ] {
        let dtype = data.dtype();
        let e = Tensor::from_host_on(data, &[1], gpu)
            .expect_err("not stored on wgpu")
            .to_string();
        assert!(
            e.contains(dtype.as_str()) && e.contains(name.as_str()),
            "{e}"
        );
    }
    // int64 is stored and cast, but has no arithmetic: an error, not a wrong number.
    let big = [3, -4, 1 << 40, -(1 << 40) - 4096, i64::MIN, i64::MAX];
    let i = Tensor::from_host_on(HostData::I64(big.to_vec()), &[6], gpu).expect("int64 stored");
    let want: Vec<f32> = big.iter().map(|&v| v as f32).collect();
    assert_eq!(
        i.cast(DType::F32)
            .expect("cast")
            .to_vec::<f32>()
            .expect("read"),
        want
    );
    let want: Vec<i32> = big.iter().map(|&v| v as i32).collect();
    assert_eq!(
        i.cast(DType::I32)
            .expect("cast")
            .to_vec::<i32>()
            .expect("read"),
        want
    );
    let back = Tensor::from_host_on(HostData::F32(want_f(&big)), &[6], gpu)
        .expect("f32")
        .cast(DType::I64)
        .expect("cast")
        .to_vec::<i64>()
        .expect("read");
    let want: Vec<i64> = want_f(&big).iter().map(|&v| v as i64).collect();
    assert_eq!(back, want, "float32 -> int64 saturates like Rust's `as`");
    let e = i.add(&i).expect_err("no int64 add").to_string();
    assert!(e.contains("int64"), "{e}");
    // A CPU tensor and a GPU tensor meet only through `to_device`.
    let c = Tensor::from_slice(&[1.0f32, 2.0]).expect("cpu");
    let g = c.to_device(gpu).expect("to gpu");
    assert!(c.add(&g).is_err());
    assert_eq!(
        g.to_device(Device::CPU)
            .expect("back")
            .to_vec::<f32>()
            .expect("read"),
        [1.0, 2.0]
    );
}

fn want_f(v: &[i64]) -> Vec<f32> {
    v.iter().map(|&x| x as f32).collect()
}

/// Transfers are ops: an observer (a profiler) sees `to_device` and the read back to the
/// host, and a gradient taken through `to_device` arrives on the device its source lives on.
#[test]
fn transfers_are_observed_ops_and_gradients_cross_back() {
    use ferroflow_autodiff::GradientTape;
    use ferroflow_tensor::{push_thread_observer, Op, OpEvent, OpObserver};
    use std::sync::{Arc, Mutex};
    let Some(gpu) = common::wgpu_device() else {
        return;
    };
    #[derive(Default)]
    struct Seen(Mutex<Vec<(Op, Device)>>);
    impl OpObserver for Seen {
        fn on_op(&self, e: &OpEvent<'_>) {
            self.0.lock().unwrap().push((e.op.clone(), e.device));
        }
    }
    let x = Tensor::from_slice(&[1.0f32, -2.0, 3.0]).expect("cpu");
    let seen = Arc::new(Seen::default());
    let guard = push_thread_observer(seen.clone());
    let g = x.to_device(gpu).expect("to gpu");
    assert_eq!(g.to_vec::<f32>().expect("read"), [1.0, -2.0, 3.0]);
    drop(guard);
    let ops = seen.0.lock().unwrap().clone();
    assert!(
        ops.contains(&(Op::ToDevice { to: gpu }, Device::CPU)),
        "{ops:?}"
    );
    assert!(ops.contains(&(Op::ToHost, gpu)), "{ops:?}");

    let tape = GradientTape::new();
    tape.watch(&x);
    let y = x
        .to_device(gpu)
        .and_then(|t| t.square())
        .and_then(|t| t.reduce_sum(0, false))
        .expect("forward on the GPU");
    let dx = tape.gradient(&y, &[(&x).into()]).expect("gradient")[0]
        .clone()
        .expect("x is watched");
    assert_eq!(dx.device(), Device::CPU, "the gradient lives where x lives");
    assert_eq!(dx.to_vec::<f32>().expect("read"), [2.0, -4.0, 6.0]);
}

/// `reduce_mean` (TF's `Mean`, one kernel: counted by `step_budget.rs`, whose binary runs
/// nothing beside it) divides in the reduction's store, and a long mean split into partial
/// sums divides once, by the whole count, in the second pass: float32 as the CPU computes
/// it, int32 the wrapped sum truncated.
#[test]
fn a_split_mean_divides_by_the_whole_count() {
    let Some(gpu) = common::wgpu_device() else {
        return;
    };
    let n = 40_000usize;
    let values: Vec<f32> = (0..2 * n)
        .map(|i| ((i * 7919) % 1013) as f32 / 101.0)
        .collect();
    let ints: Vec<i32> = (0..2 * n as i32)
        .map(|i| i.wrapping_mul(2_654_435))
        .collect();
    let x = Tensor::from_vec(values.clone(), &[2, n]).expect("x");
    let xi = Tensor::from_vec(ints.clone(), &[2, n]).expect("xi");
    let on_gpu = |t: &Tensor| t.to_device(gpu).expect("to gpu");
    let row_mean = |r: usize, len: usize| {
        values[r * n..r * n + len]
            .iter()
            .map(|&v| v as f64)
            .sum::<f64>()
            / len as f64
    };
    // 100 elements per output: one pass; 40 000: partial sums, then the mean of the parts.
    for len in [100, n] {
        let part = on_gpu(&x.slice(&[0, 0], &[2, len as isize]).expect("slice"));
        let got = part
            .reduce_mean(1isize, false)
            .expect("mean")
            .to_f64_vec()
            .expect("read");
        for (r, g) in got.iter().enumerate() {
            let want = row_mean(r, len);
            assert!(
                (g - want).abs() <= 1e-5 * want.abs(),
                "{len} elements, row {r}: {g} vs {want}"
            );
        }
    }
    let got = on_gpu(&xi)
        .reduce_mean(1isize, false)
        .expect("long int mean")
        .to_f64_vec()
        .expect("read");
    for (r, g) in got.iter().enumerate() {
        let sum = ints[r * n..(r + 1) * n]
            .iter()
            .fold(0i32, |a, &b| a.wrapping_add(b));
        assert_eq!(*g as i32, sum / n as i32, "int32 row {r}");
    }
}
