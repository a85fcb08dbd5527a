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
                PoolKind::Max
            } else {
                PoolKind::Avg
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
