//! Random ops on random shapes, dtypes and attributes: each call returns `Ok` or a clear
//! `Err`; a panic anywhere is a bug.

use super::harness::{cases, check};
use crate::{
    Axes, BinaryOp, DType, Device, HostData, Padding, PoolKind, ReduceOp, SliceSpec, Tensor,
    UnaryOp,
};
use proptest::prelude::*;
use proptest::test_runner::TestCaseError;

#[derive(Debug, Clone)]
struct Arg {
    dtype: usize,
    shape: Vec<usize>,
}

fn arg() -> impl Strategy<Value = Arg> {
    (0..DType::ALL.len(), prop::collection::vec(0..4usize, 0..5))
        .prop_map(|(dtype, shape)| Arg { dtype, shape })
}

fn build(device: &Device, a: &Arg, salt: usize) -> crate::Result<Tensor> {
    let n: usize = a.shape.iter().product();
    let v: Vec<f64> = (0..n).map(|i| ((i * 7 + salt) % 11) as f64 - 5.0).collect();
    Tensor::from_host_on(
        HostData::from_f64_slice(DType::ALL[a.dtype], &v),
        &a.shape,
        *device,
    )
}

fn run_op(op: usize, x: &Tensor, y: &Tensor, i: isize, j: usize) -> crate::Result<Tensor> {
    let u = j % 7;
    match op {
        0 => x.unary(UnaryOp::ALL[j % UnaryOp::ALL.len()]),
        1 => x.binary(BinaryOp::ALL[j % BinaryOp::ALL.len()], y),
        2 => x.reduce(
            ReduceOp::ALL[j % ReduceOp::ALL.len()],
            Axes::List(vec![i, i + 1]),
            j.is_multiple_of(2),
        ),
        3 => x.argmax(i),
        4 => x.matmul_t(y, j.is_multiple_of(2), j.is_multiple_of(3)),
        5 => x.reshape(&[i, -1]),
        6 => x.transpose(
            &(0..x.rank())
                .rev()
                .map(|p| (p + j) % (x.rank() + 1))
                .collect::<Vec<_>>(),
        ),
        7 => x.strided_slice(&[
            SliceSpec::Range {
                start: Some(i),
                stop: Some(-i),
                step: if j.is_multiple_of(2) {
                    0
                } else {
                    -(u as isize) - 1
                },
            },
            SliceSpec::Index(i),
        ]),
        8 => Tensor::concat(&[x.clone(), y.clone()], i),
        9 => x.gather(y, i),
        10 => x.pad(&vec![(u, j % 3); x.rank()], 1.0),
        11 => x.tile(&vec![u; x.rank() + j % 2]),
        12 => x.cumsum(i, j.is_multiple_of(2), j.is_multiple_of(3)),
        13 => x.sort(i, j.is_multiple_of(2)),
        14 => x.top_k(u).map(|p| p.0),
        15 => x.conv2d(
            y,
            [u, 1],
            if j.is_multiple_of(2) {
                Padding::Same
            } else {
                Padding::Valid
            },
            [1, j % 3],
        ),
        16 => x.pool2d(
            if j.is_multiple_of(2) {
                PoolKind::MaxPool2d
            } else {
                PoolKind::AvgPool2d
            },
            [u, 2],
            [1, u],
            Padding::Same,
        ),
        17 => x.cast(DType::ALL[j % DType::ALL.len()]),
        18 => Tensor::select(x, y, x),
        19 => Tensor::one_hot(x, u, 1.0, 0.0, DType::F32),
        20 => x
            .split(&[u, j], i)
            .map(|v| v.into_iter().next().unwrap_or_else(|| x.clone())),
        21 => x.squeeze(&[i]),
        22 => x.expand_dims(i),
        23 => x.broadcast_to(y.shape()),
        24 => x.softmax(i),
        25 => x.gather_nd(y),
        26 => Tensor::scatter_nd(y, x, &[u, j % 4]),
        27 => x.pad_mirror(&vec![(u, 1); x.rank()], j.is_multiple_of(2)),
        28 => Tensor::conv2d_backprop_input([1, u, u, 1], x, y, [1, 1], Padding::Same, [1, 1]),
        29 => x.max_pool_grad(y, [u, u], [1, 1], Padding::Valid),
        _ => x.reduce_logsumexp(Axes::List(vec![i]), false),
    }
}

/// Throws random ops at the backend; each must return `Ok` or `Err`, never panic.
pub fn never_panics(device: &Device) {
    let _ = cases();
    check(
        "never panics",
        (0..31usize, arg(), arg(), -5isize..5, 0..20usize),
        |(op, a, b, i, j)| {
            let (x, y) = match (build(device, &a, 1), build(device, &b, 2)) {
                (Ok(x), Ok(y)) => (x, y),
                // A dtype the device lacks fails to upload, cleanly: nothing more to throw.
                _ if ![&a, &b]
                    .iter()
                    .all(|v| crate::device_supports(*device, DType::ALL[v.dtype])) =>
                {
                    return Ok(())
                }
                _ => return Err(TestCaseError::fail("building inputs failed")),
            };
            let r = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
                run_op(op, &x, &y, i, j).and_then(|t| t.to_host().map(|_| ()))
            }));
            prop_assert!(
                r.is_ok(),
                "op #{op} panicked on {a:?} and {b:?} (i {i}, j {j})"
            );
            Ok(())
        },
    );
}

/// Dimensions, sizes and counts a hostile caller passes: zero, small, and values whose
/// products and sums wrap or whose tensors no device holds. (No value here asks for a
/// tensor that fits memory yet is huge: the test must not allocate gigabytes.)
const HOSTILE: [usize; 10] = [
    0,
    1,
    2,
    3,
    1 << 40,
    1 << 62,
    1 << 63,
    isize::MAX as usize,
    usize::MAX - 1,
    usize::MAX,
];

fn hostile() -> impl Strategy<Value = usize> {
    (0..HOSTILE.len()).prop_map(|i| HOSTILE[i])
}

fn hostile_signed() -> impl Strategy<Value = isize> {
    prop_oneof![
        -4isize..5,
        Just(isize::MAX),
        Just(isize::MIN),
        Just(isize::MIN + 1),
        Just(1isize << 40),
        Just(-(1isize << 40)),
    ]
}

/// One op with hostile attributes on small real inputs `x` (rank 4, float32) and `e` (an
/// empty tensor with one hostile dimension when that fits an address space, else `x`).
fn run_hostile(op: usize, x: &Tensor, e: &Tensor, d: &[usize], s: &[isize]) -> crate::Result<()> {
    let d2 = [d[0], d[1]];
    let pad = if d[2].is_multiple_of(2) {
        Padding::Same
    } else {
        Padding::Valid
    };
    let t = match op {
        0 => Tensor::zeros(d, DType::F32),
        1 => Tensor::fill(&d[..2], 1.0, DType::I8),
        2 => Tensor::eye(d[0], d[1], DType::F32),
        3 => Tensor::linspace(0.0, 1.0, d[0], DType::F32),
        4 => Tensor::range(0.0, d[0] as f64, 1e-300, DType::F32),
        5 => x.reshape(&s[..3]),
        6 => x.reshape_to(&d[..4]),
        7 => x.tile(&d[..4]),
        8 => x.broadcast_to(&d[..4]),
        9 => x.pad(&[(d[0], d[1]), (d[2], 0), (0, 0), (0, d[3])], 0.0),
        10 => x.split(&d[..3], s[0]).map(|v| v[0].clone()),
        11 => x.strided_slice(&[
            SliceSpec::Range {
                start: Some(s[0]),
                stop: Some(s[1]),
                step: if s[2] == 0 { 1 } else { s[2] },
            },
            SliceSpec::Index(s[3]),
        ]),
        12 => x.slice(&d[..4], &s[..4]),
        13 => x.conv2d(
            &Tensor::zeros(&[1, 1, 3, 2], DType::F32)?,
            d2,
            pad,
            [d[2], d[3]],
        ),
        14 => x.pool2d(PoolKind::MaxPool2d, d2, [d[2].max(1), 1], pad),
        15 => x.pool2d(PoolKind::AvgPool2d, d2, [1, d[3].max(1)], pad),
        16 => Tensor::avg_pool_grad([d[0], d[1], d[2], d[3]], x, [1, 1], [1, 1], pad),
        17 => Tensor::conv2d_backprop_input(
            [d[0], d[1], d[2], 3],
            &Tensor::zeros(&[1, 1, 3, 3], DType::F32)?,
            x,
            [1, 1],
            pad,
            [1, 1],
        ),
        18 => x.conv2d_backprop_filter([d[0], d[1], 3, d[2]], x, [1, 1], pad, [1, 1]),
        19 => Tensor::one_hot(
            &Tensor::zeros(&[2], DType::I32)?.to_device(x.device())?,
            d[0],
            1.0,
            0.0,
            DType::F32,
        ),
        20 => Tensor::scatter_nd(
            &Tensor::zeros(&[1, 2], DType::I32)?.to_device(x.device())?,
            &Tensor::zeros(&[1, d[2]], DType::F32)?.to_device(x.device())?,
            &d[..3],
        ),
        21 => e.matmul(&e.t()?),
        22 => e.add(&e.reshape_to(&[1, 1, 1, 0])?.transpose(&[3, 1, 2, 0])?),
        23 => Tensor::concat(&[e.clone(), e.clone()], s[0]),
        24 => e.tile(&[d[0], 1, 1, 1]),
        25 => x.reduce(
            ReduceOp::ALL[d[0] % ReduceOp::ALL.len()],
            Axes::List(s[..2].to_vec()),
            false,
        ),
        26 => x.top_k(d[0]).map(|p| p.0),
        27 => x.cumsum(s[0], true, false),
        28 => crate::random::stateless_uniform(&d[..3], [1, 2], 0.0, 1.0, DType::F32),
        29 => x.gather(
            &Tensor::from_vec(vec![s[0] as i64], &[1])?.to_device(x.device())?,
            s[1],
        ),
        30 => x.transpose(&d[..4]),
        // Empty tensors with a huge dimension: kernels must not loop over it.
        31 => e.reduce(
            ReduceOp::ALL[d[1] % ReduceOp::ALL.len()],
            Axes::List(vec![s[0]]),
            d[2].is_multiple_of(2),
        ),
        32 => e.unary(UnaryOp::ALL[d[1] % UnaryOp::ALL.len()]),
        33 => e.pad(&[(0, 0), (0, d[1].min(1)), (0, 0), (0, 0)], 0.0),
        34 => e.cumsum(s[0], true, false),
        35 => e.sort(s[0], true),
        36 => e.transpose(&[3, 2, 1, 0])?.contiguous(),
        37 => e.cast(DType::ALL[d[1] % DType::ALL.len()]),
        38 => e.gather(
            &Tensor::zeros(&[2], DType::I32)?.to_device(e.device())?,
            s[0],
        ),
        39 => e.argmax(s[0]),
        40 => e.softmax(s[0]),
        41 => e.pool2d(PoolKind::MaxPool2d, [1, 1], [1, 1], pad),
        42 => e
            .strided_slice(&[SliceSpec::Range {
                start: None,
                stop: None,
                step: s[1].max(1),
            }])?
            .contiguous(),
        43 => e.reverse(&[0])?.contiguous(),
        44 => Tensor::stack(&[e.clone(), e.clone()], s[0]),
        45 => e.broadcast_to(&[2, d[0], 0, 1, 1])?.contiguous(),
        _ => e.top_k(d[1]).map(|p| p.0),
    }?;
    // Whatever came back is a real tensor: reading it back must work too.
    t.to_host().map(|_| ())
}

/// Hostile arguments (zero, huge and wrapping dimensions, out-of-range axes and steps)
/// across the op set: every call returns `Ok` or `Err` within a time limit; no panic,
/// abort or hang. The ops run on a helper thread so a hang fails the case instead of the
/// whole run.
pub fn hostile_arguments(device: &Device) {
    let device = *device;
    check(
        "hostile arguments",
        (
            0..47usize,
            prop::collection::vec(hostile(), 4),
            prop::collection::vec(hostile_signed(), 4),
        ),
        |(op, d, s)| {
            let (tx, rx) = std::sync::mpsc::channel();
            let (d2, s2) = (d.clone(), s.clone());
            std::thread::spawn(move || {
                let r = std::panic::catch_unwind(|| {
                    crate::with_device(&device.to_string(), || {
                        let x =
                            Tensor::from_vec((0..24).map(|v| v as f32).collect(), &[1, 2, 4, 3])?
                                .to_device(device)?;
                        let empty = [d2[0], 0, 1, 1];
                        let e = match crate::layout::checked_num_elements("test", &empty) {
                            Ok(_) => Tensor::zeros(&empty, DType::F32)?.to_device(device)?,
                            Err(_) => x.clone(),
                        };
                        run_hostile(op, &x, &e, &d2, &s2)
                    })
                    .and_then(|r| r)
                });
                let _ = tx.send(r.is_ok());
            });
            match rx.recv_timeout(std::time::Duration::from_secs(5)) {
                Ok(true) => Ok(()),
                Ok(false) => Err(TestCaseError::fail(format!(
                    "op #{op} panicked with dims {d:?} and signed {s:?}"
                ))),
                Err(_) => Err(TestCaseError::fail(format!(
                    "op #{op} hung (over 5 s) with dims {d:?} and signed {s:?}"
                ))),
            }
        },
    );
}
