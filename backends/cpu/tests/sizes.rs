//! The shape-arithmetic cases of issue #27, each once by name: sizes that overflow, tensors
//! no device holds, windows larger than their input. Every one is an `Err` naming the op,
//! never a wrapped dimension, a panic, an abort or a hang (the conformance suite's
//! `hostile_arguments` throws random such arguments at every op on every backend).

use ferroflow_tensor::{DType, Error, Padding, SliceSpec, Tensor};

fn init() {
    ferroflow_cpu::register();
}

fn refused(what: &str, r: ferroflow_tensor::Result<Tensor>) -> Error {
    match r {
        Ok(t) => panic!("{what}: accepted, shape {:?}", t.shape()),
        Err(e) => e,
    }
}

#[test]
fn products_that_overflow_are_errors_not_wrapped_shapes() {
    init();
    let e = refused(
        "zeros [MAX, MAX]",
        Tensor::zeros(&[usize::MAX, usize::MAX], DType::F32),
    );
    assert!(e.to_string().starts_with("fill: shape"), "{e}");
    refused(
        "zeros [MAX, 0, MAX]",
        Tensor::zeros(&[usize::MAX, 0, usize::MAX], DType::F32),
    );
    let x = Tensor::zeros(&[2, 3], DType::F32).unwrap();
    refused("reshape", x.reshape(&[isize::MAX, isize::MAX, 0]));
    refused("tile", x.tile(&[usize::MAX, 2]));
    refused("broadcast_to", x.broadcast_to(&[usize::MAX, 2, 3]));
    refused("pad", x.pad(&[(usize::MAX, 1), (0, 0)], 0.0));
    assert!(
        x.split(&[usize::MAX, 4], 1).is_err(),
        "split sizes that wrap to 3"
    );
    refused("eye", Tensor::eye(1 << 32, 1 << 32, DType::F32));
}

#[test]
fn tensors_larger_than_the_device_are_resource_exhausted() {
    init();
    let e = refused(
        "zeros [2^40, 2^40]",
        Tensor::zeros(&[1 << 40, 1 << 40], DType::F32),
    );
    assert!(matches!(e, Error::InvalidArgument { .. }), "{e}");
    let e = refused("zeros [2^40]", Tensor::zeros(&[1 << 40], DType::F32));
    match &e {
        Error::ResourceExhausted { bytes, shape, .. } => {
            assert_eq!(
                (*bytes, shape.as_slice()),
                (4u128 << 40, &[1usize << 40][..])
            )
        }
        other => panic!("{other}"),
    }
    // Outputs larger than any input: a broadcast, and a product over an empty axis.
    let a = Tensor::zeros(&[1 << 21, 1], DType::F32).unwrap();
    let b = Tensor::zeros(&[1, 1 << 21], DType::F32).unwrap();
    let e = refused("[2^21, 1] + [1, 2^21]", a.add(&b));
    assert!(matches!(e, Error::ResourceExhausted { .. }), "{e}");
    let empty_k = Tensor::zeros(&[1 << 30, 0], DType::F32).unwrap();
    let e = refused(
        "matmul [2^30, 0] x [0, 2^30]",
        empty_k.matmul(&empty_k.t().unwrap()),
    );
    assert!(matches!(e, Error::ResourceExhausted { .. }), "{e}");
}

#[test]
fn strided_slices_with_extreme_steps_stay_inside_the_tensor() {
    init();
    let x = Tensor::from_vec((0..6).map(|v| v as f32).collect(), &[6]).unwrap();
    for step in [isize::MAX, isize::MIN, isize::MIN + 1, 1 << 40] {
        let s = x
            .strided_slice(&[SliceSpec::Range {
                start: None,
                stop: None,
                step,
            }])
            .unwrap();
        let want = if step > 0 { vec![0.0] } else { vec![5.0] };
        assert_eq!(s.to_vec::<f32>().unwrap(), want, "step {step}");
    }
}

#[test]
fn windows_larger_than_a_valid_input_are_tf_negative_size_errors() {
    init();
    let x = Tensor::zeros(&[1, 4, 4, 1], DType::F32).unwrap();
    let f = Tensor::zeros(&[5, 5, 1, 1], DType::F32).unwrap();
    let e = refused(
        "conv2d VALID 5x5 on 4x4",
        x.conv2d(&f, [1, 1], Padding::Valid, [1, 1]),
    );
    assert!(
        e.to_string()
            .contains("computed output size would be negative"),
        "{e}"
    );
    let e = refused(
        "max_pool VALID 5x5 on 4x4",
        x.max_pool2d([5, 5], [1, 1], Padding::Valid),
    );
    assert!(e.to_string().contains("negative"), "{e}");
    // SAME pads any window: a huge one costs what the input costs (it used to hang).
    let t = std::time::Instant::now();
    let y = x
        .max_pool2d([1 << 40, 1 << 40], [1, 1], Padding::Same)
        .unwrap();
    assert_eq!(y.shape(), &[1, 4, 4, 1]);
    assert!(
        t.elapsed() < std::time::Duration::from_secs(2),
        "{:?}",
        t.elapsed()
    );
}
