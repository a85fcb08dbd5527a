//! Creation ops, read-back, Display, random number statistics, variables.

use super::harness::{exact_float, supported};
use crate::{random, DType, Device, HostData, Tensor, Variable};

fn on(device: &Device, t: crate::Result<Tensor>) -> Tensor {
    t.and_then(|t| t.to_device(*device)).expect("creation op")
}

/// zeros/ones/fill/eye/range/linspace and every dtype's round trip through the device.
pub fn creation_and_round_trip(device: &Device) {
    for &dtype in &DType::ALL {
        let values: Vec<f64> = (0..7).map(|i| (i % 2) as f64).collect();
        let t = Tensor::from_host_on(HostData::from_f64_slice(dtype, &values), &[7], *device);
        if !crate::device_supports(*device, dtype) {
            // Unsupported: an error naming the dtype, or (storage-only types) an exact trip.
            match t {
                Err(e) => {
                    let msg = e.to_string();
                    assert!(msg.contains(dtype.as_str()), "{dtype}: {msg}");
                }
                Ok(t) => assert_eq!(t.to_f64_vec().expect("read back"), values),
            }
            continue;
        }
        let t = t.expect("upload");
        assert_eq!(t.device(), *device);
        assert_eq!(
            t.to_f64_vec().expect("read back"),
            values,
            "{dtype} round trip"
        );
        let z = on(device, Tensor::zeros(&[2, 0, 3], dtype));
        assert_eq!((z.shape(), z.num_elements()), (&[2usize, 0, 3][..], 0));
    }
    // eye(2, 3) = [[1 0 0] [0 1 0]]
    assert_eq!(
        on(device, Tensor::eye(2, 3, DType::F32))
            .to_vec::<f32>()
            .expect("eye"),
        vec![1.0, 0.0, 0.0, 0.0, 1.0, 0.0]
    );
    // range(1, 2, 0.25) = 1, 1.25, 1.5, 1.75
    assert_eq!(
        on(device, Tensor::range(1.0, 2.0, 0.25, exact_float(device)))
            .to_f64_vec()
            .expect("range"),
        vec![1.0, 1.25, 1.5, 1.75]
    );
    assert!(
        Tensor::range(0.0, 1.0, 0.0, DType::F32).is_err(),
        "range with delta 0 must fail"
    );
    let l = on(device, Tensor::linspace(0.0, 1.0, 5, exact_float(device)))
        .to_f64_vec()
        .expect("linspace");
    assert_eq!(l, vec![0.0, 0.25, 0.5, 0.75, 1.0]);
    let half = supported(device, &[DType::BF16, DType::F16, DType::F32])[0];
    let f = on(device, Tensor::fill(&[2], 2.5, half));
    assert_eq!(f.to_f64_vec().expect("fill"), vec![2.5, 2.5]);
    assert!(
        Tensor::from_vec(vec![1.0f32; 5], &[2, 3]).is_err(),
        "5 values cannot fill [2, 3]"
    );
    let s = format!("{}", on(device, Tensor::from_vec(vec![1.0f32, 2.5], &[2])));
    assert_eq!(s, "tf.Tensor([1. 2.5], shape=(2,), dtype=float32)");
    let b = format!(
        "{}",
        on(device, Tensor::from_vec(vec![true, false], &[1, 2]))
    );
    assert_eq!(b, "tf.Tensor([[True False]], shape=(1, 2), dtype=bool)");
    assert!(
        on(device, Tensor::scalar(1i32)).to_vec::<f32>().is_err(),
        "reading int32 as f32 must fail"
    );
}

/// Random tensors: seeded reproducibility and the moments of each distribution.
pub fn random_statistics(device: &Device) {
    let n = 20_000usize;
    let u = on(
        device,
        random::stateless_uniform(&[n], [5, 6], -1.0, 3.0, DType::F32),
    )
    .to_f64_vec()
    .expect("uniform");
    let mean = u.iter().sum::<f64>() / n as f64;
    assert!(
        (mean - 1.0).abs() < 0.05 && u.iter().all(|&x| (-1.0..3.0).contains(&x)),
        "uniform mean {mean}"
    );
    let g = on(
        device,
        random::stateless_normal(&[n], [5, 6], 2.0, 3.0, exact_float(device)),
    )
    .to_f64_vec()
    .expect("normal");
    let m = g.iter().sum::<f64>() / n as f64;
    let sd = (g.iter().map(|x| (x - m).powi(2)).sum::<f64>() / n as f64).sqrt();
    assert!(
        (m - 2.0).abs() < 0.1 && (sd - 3.0).abs() < 0.1,
        "normal mean {m} sd {sd}"
    );
    let t = on(
        device,
        random::stateless_truncated_normal(&[n], [1, 1], 0.0, 1.0, DType::F32),
    )
    .to_f64_vec()
    .expect("truncated");
    assert!(
        t.iter().all(|x| x.abs() <= 2.0),
        "truncated normal beyond 2 sd"
    );
    let i = on(
        device,
        random::stateless_uniform(&[n], [9, 9], 0.0, 10.0, DType::I32),
    )
    .to_f64_vec()
    .expect("int uniform");
    assert!(i
        .iter()
        .all(|&x| (0.0..10.0).contains(&x) && x.fract() == 0.0));
    for d in 0..10 {
        let c = i.iter().filter(|&&x| x == d as f64).count();
        assert!(
            (c as f64 - n as f64 / 10.0).abs() < 0.1 * n as f64 / 10.0 * 3.0,
            "digit {d}: {c}"
        );
    }
    random::set_seed(11);
    let a = random::normal(&[4], 0.0, 1.0, DType::F32, None)
        .and_then(|t| t.to_vec::<f32>())
        .expect("normal");
    random::set_seed(11);
    let b = random::normal(&[4], 0.0, 1.0, DType::F32, None)
        .and_then(|t| t.to_vec::<f32>())
        .expect("normal");
    assert_eq!(a, b, "set_seed makes stateful ops reproducible");
    assert!(
        random::stateless_normal(&[2], [0, 0], 0.0, 1.0, DType::I32).is_err(),
        "normal of int32 must fail"
    );
}

/// Variables: assign keeps shape and dtype, and refuses changes to either.
pub fn variables(device: &Device) {
    let init = Tensor::from_host_on(HostData::F32(vec![1.0, 2.0]), &[2], *device).expect("upload");
    let v = Variable::new("v", init.clone());
    let alias = v.clone();
    v.assign_add(&init).expect("assign_add");
    assert_eq!(
        alias.value().to_vec::<f32>().expect("read"),
        vec![2.0, 4.0],
        "clones share state"
    );
    v.assign_sub(&init).expect("assign_sub");
    assert_eq!(v.value().to_vec::<f32>().expect("read"), vec![1.0, 2.0]);
    let wrong = Tensor::from_host_on(HostData::F32(vec![1.0; 3]), &[3], *device).expect("upload");
    assert!(v.assign(&wrong).is_err(), "shape change must fail");
    let wrong_dtype =
        Tensor::from_host_on(HostData::I32(vec![1; 2]), &[2], *device).expect("upload");
    assert!(v.assign(&wrong_dtype).is_err(), "dtype change must fail");
    assert_eq!(
        v.value().to_vec::<f32>().expect("read"),
        vec![1.0, 2.0],
        "a failed assign leaves the value alone"
    );
}
