//! Reductions over random axis subsets (with keepdims), mean, logsumexp, argmax/argmin.

use super::harness::*;
use super::reference::RefArray;
use crate::{Axes, DType, Device, ReduceOp};
use proptest::prelude::*;

const NUMERIC: [DType; 11] = [
    DType::F32,
    DType::F64,
    DType::F16,
    DType::BF16,
    DType::I32,
    DType::I64,
    DType::I8,
    DType::I16,
    DType::U16,
    DType::U32,
    DType::U64,
];

fn axes_strategy() -> impl Strategy<Value = (RefArray, Option<Vec<isize>>)> {
    array(4, 5, -3.0, 3.0).prop_flat_map(|a| {
        let rank = a.shape.len();
        let axes = prop::option::weighted(
            0.85,
            prop::sample::subsequence((0..rank).collect::<Vec<_>>(), 0..=rank),
        );
        (Just(a), axes, any::<bool>()).prop_map(move |(a, axes, neg)| {
            let axes = axes.map(|v| {
                v.into_iter()
                    .map(|x| {
                        if neg {
                            x as isize - rank as isize
                        } else {
                            x as isize
                        }
                    })
                    .collect()
            });
            (a, axes)
        })
    })
}

fn resolve(axes: &Option<Vec<isize>>, rank: usize) -> Vec<usize> {
    match axes {
        None => (0..rank).collect(),
        Some(v) => {
            let mut r: Vec<usize> = v
                .iter()
                .map(|&x| {
                    if x < 0 {
                        (x + rank as isize) as usize
                    } else {
                        x as usize
                    }
                })
                .collect();
            r.sort_unstable();
            r
        }
    }
}

fn keep(want: RefArray, shape: &[usize], axes: &[usize], keepdims: bool) -> RefArray {
    if !keepdims {
        return want;
    }
    let s: Vec<usize> = shape
        .iter()
        .enumerate()
        .map(|(i, &d)| if axes.contains(&i) { 1 } else { d })
        .collect();
    RefArray::new(&s, want.data)
}

/// sum, mean, prod, max, min on every numeric dtype over random axes.
pub fn reductions(device: &Device) {
    let numeric = supported(device, &NUMERIC);
    for op in [
        ReduceOp::ReduceSum,
        ReduceOp::ReduceMean,
        ReduceOp::ReduceProd,
        ReduceOp::ReduceMax,
        ReduceOp::ReduceMin,
    ] {
        check(
            op.name(),
            (
                axes_strategy(),
                0..numeric.len(),
                view_kind(),
                any::<bool>(),
            ),
            |((a, axes), di, view, keepdims)| {
                let dtype = numeric[di];
                // Products stay exact and small with values in {-1, 0, 1, 2} capped at a few factors.
                let a = if op == ReduceOp::ReduceProd {
                    a.map(|v| (v / 1.5).round().clamp(-1.0, 1.0))
                } else {
                    a
                };
                let a = quantized(dtype, &a);
                let x = ok("input", make_tensor(device, dtype, &a, view))?;
                let ax = axes.clone().map(Axes::List).unwrap_or(Axes::All);
                let r = resolve(&axes, a.shape.len());
                // How many elements each output combines.
                let n: usize = r.iter().map(|&i| a.shape[i]).product();
                if op == ReduceOp::ReduceMean && !dtype.is_float() && n == 0 {
                    // The mean of an empty integer set is an error, not a value.
                    return match x.reduce(op, ax, keepdims) {
                        Err(crate::Error::Arithmetic { .. }) => Ok(()),
                        other => Err(proptest::test_runner::TestCaseError::fail(format!(
                            "reduce_mean {dtype} over an empty axis: {other:?}, not an arithmetic error"
                        ))),
                    };
                }
                let got = ok(op.name(), x.reduce(op, ax, keepdims))?;
                let want = match op {
                    ReduceOp::ReduceSum => a.reduce(&r, 0.0, |p, q| p + q),
                    // Integers: the wrapped sum divided with truncation.
                    ReduceOp::ReduceMean if !dtype.is_float() => a
                        .reduce(&r, 0.0, |p, q| p + q)
                        .map(|v| (wrap_int(dtype, v) / n as f64).trunc()),
                    ReduceOp::ReduceMean => a.reduce(&r, 0.0, |p, q| p + q).map(|v| v / n as f64),
                    ReduceOp::ReduceProd => a.reduce(&r, 1.0, |p, q| p * q),
                    ReduceOp::ReduceMax => a.reduce(&r, f64::NEG_INFINITY, f64::max),
                    _ => a.reduce(&r, f64::INFINITY, f64::min),
                };
                // Integers: empty max/min give the dtype's extremes; sums wrap.
                let want = if dtype.is_float() {
                    RefArray::new(&want.shape, quantize(dtype, &want.data))
                } else {
                    want.map(|v| {
                        if v.is_infinite() {
                            if v > 0.0 {
                                int_max(dtype)
                            } else {
                                int_min(dtype)
                            }
                        } else {
                            wrap_int(dtype, v)
                        }
                    })
                };
                // Max, min and these products are exact: one input, or products of
                // {-1, 0, 1}. A sum's rounding error is bounded by the elements that output
                // adds: eps·(4 + 2√n)·Σ|x| over its own n elements (and exact for integers).
                // A mean's: that bound over n, and the division's rounding.
                let tol: Vec<f64> = if op == ReduceOp::ReduceSum && dtype.is_float() {
                    let abs_sums = a.map(|v| v.abs()).reduce(&r, 0.0, |p, q| p + q);
                    let k = epsilon(dtype) * (4.0 + 2.0 * (n as f64).sqrt());
                    abs_sums.data.iter().map(|s| k * s).collect()
                } else if op == ReduceOp::ReduceMean && dtype.is_float() {
                    let abs_sums = a.map(|v| v.abs()).reduce(&r, 0.0, |p, q| p + q);
                    let k = epsilon(dtype) * (5.0 + 2.0 * (n as f64).sqrt());
                    abs_sums
                        .data
                        .iter()
                        .map(|s| k * s / n.max(1) as f64)
                        .collect()
                } else {
                    vec![0.0; want.data.len()]
                };
                assert_within(
                    &format!("{} {dtype} axes {axes:?}", op.name()),
                    &got,
                    &keep(want, &a.shape, &r, keepdims),
                    &tol,
                )
            },
        );
    }
    check(
        "reduce_any/all",
        (axes_strategy(), any::<bool>()),
        |((a, axes), keepdims)| {
            let b = quantized(DType::Bool, &a.map(|v| (v > 1.0) as u8 as f64));
            let x = ok(
                "input",
                make_tensor(device, DType::Bool, &b, ViewKind::Contiguous),
            )?;
            let ax = || axes.clone().map(Axes::List).unwrap_or(Axes::All);
            let r = resolve(&axes, b.shape.len());
            assert_matches(
                "reduce_any",
                &ok("any", x.reduce_any(ax(), keepdims))?,
                &keep(
                    b.reduce(&r, 0.0, |p, q| (p != 0.0 || q != 0.0) as u8 as f64),
                    &b.shape,
                    &r,
                    keepdims,
                ),
                1.0,
            )?;
            assert_matches(
                "reduce_all",
                &ok("all", x.reduce_all(ax(), keepdims))?,
                &keep(
                    b.reduce(&r, 1.0, |p, q| (p != 0.0 && q != 0.0) as u8 as f64),
                    &b.shape,
                    &r,
                    keepdims,
                ),
                1.0,
            )
        },
    );
    // NaN propagates through max and min.
    let x = crate::Tensor::from_host_on(
        crate::HostData::F32(vec![1.0, f32::NAN, 3.0]),
        &[3],
        *device,
    )
    .expect("upload");
    assert!(x
        .reduce_max(Axes::All, false)
        .and_then(|t| t.item::<f32>())
        .expect("max")
        .is_nan());
    assert!(x
        .reduce_min(Axes::All, false)
        .and_then(|t| t.item::<f32>())
        .expect("min")
        .is_nan());
}

fn int_max(d: DType) -> f64 {
    match d {
        DType::I8 => i8::MAX as f64,
        DType::I16 => i16::MAX as f64,
        DType::I32 => i32::MAX as f64,
        DType::U8 => u8::MAX as f64,
        DType::U16 => u16::MAX as f64,
        DType::U32 => u32::MAX as f64,
        DType::U64 => u64::MAX as f64,
        _ => i64::MAX as f64,
    }
}
fn int_min(d: DType) -> f64 {
    match d {
        DType::I8 => i8::MIN as f64,
        DType::I16 => i16::MIN as f64,
        DType::I32 => i32::MIN as f64,
        DType::U8 | DType::U16 | DType::U32 | DType::U64 => 0.0,
        _ => i64::MIN as f64,
    }
}

/// reduce_mean and reduce_logsumexp on floats.
pub fn mean_and_logsumexp(device: &Device) {
    let floats = supported(device, &NUMERIC[..4]);
    check(
        "reduce_mean/logsumexp",
        (axes_strategy(), 0..floats.len(), view_kind()),
        |((a, axes), di, view)| {
            let dtype = floats[di];
            let a = quantized(dtype, &a);
            let x = ok("input", make_tensor(device, dtype, &a, view))?;
            let r = resolve(&axes, a.shape.len());
            let count: usize = r.iter().map(|&i| a.shape[i]).product();
            let ax = || axes.clone().map(Axes::List).unwrap_or(Axes::All);
            let mean = a.reduce(&r, 0.0, |p, q| p + q).map(|s| s / count as f64);
            let extra = 8.0 * epsilon(dtype) * a.data.iter().fold(0.0f64, |m, v| m.max(v.abs()));
            assert_close(
                "reduce_mean",
                &ok("mean", x.reduce_mean(ax(), false))?,
                &RefArray::new(&mean.shape, quantize(dtype, &mean.data)),
                4.0,
                extra,
            )?;
            let lse = a.reduce(&r, 0.0, |p, q| p + q.exp()).map(f64::ln);
            assert_close(
                "reduce_logsumexp",
                &ok("lse", x.reduce_logsumexp(ax(), false))?,
                &RefArray::new(&lse.shape, quantize(dtype, &lse.data)),
                4.0,
                extra,
            )
        },
    );
}

/// argmax/argmin along one axis (first index on ties; values on a coarse grid make ties).
pub fn arg_reductions(device: &Device) {
    let numeric = supported(device, &NUMERIC);
    let strat = nonempty_array(4, 5, -3.0, 3.0).prop_flat_map(|a| {
        let r = a.shape.len();
        (Just(a), 0..r, 0..numeric.len(), view_kind())
    });
    check("argmax/argmin", strat, |(a, axis, di, view)| {
        let dtype = numeric[di];
        let a = quantized(dtype, &a.map(|v| v.round()));
        let x = ok("input", make_tensor(device, dtype, &a, view))?;
        let gmax = ok("argmax", x.argmax(axis as isize))?;
        prop_assert_eq!(gmax.dtype(), DType::I64);
        assert_matches("argmax", &gmax, &a.arg(axis, true), 1.0)?;
        assert_matches(
            "argmin",
            &ok("argmin", x.argmin(axis as isize))?,
            &a.arg(axis, false),
            1.0,
        )
    });
}

/// Arg-reductions along lines longer than GPU kernels take a thread per output for (the
/// CUDA backend's 1024: a block per output beyond) against the rule every backend shares:
/// the first index of the extreme, the first NaN before any number; along a contiguous and
/// a strided axis, with NaNs in threads a block's tree meets in both orders, in float32,
/// bfloat16 (many ties) and int32 where the device has them.
pub fn long_arg_reductions(device: &Device) {
    let m = 1024 * 2 + 3;
    let lines = 4usize;
    for dtype in supported(device, &[DType::F32, DType::BF16, DType::I32]) {
        let values: Vec<f64> = (0..lines * m)
            .map(|i| match (dtype.is_float(), i / m, i % m) {
                (true, 1, 1030 | 1900) | (true, 2, 1100 | 1300 | 1500 | 1900 | 2000 | 2040) => {
                    f64::NAN
                }
                _ => ((i * 7919) % 2003) as f64 / 7.0 - 140.0,
            })
            .collect();
        let rows = upload(device, dtype, &[lines, m], &values).expect("upload");
        let exact = rows.to_f64_vec().expect("read");
        for max in [true, false] {
            let want: Vec<f64> = (0..lines)
                .map(|l| {
                    let line = &exact[l * m..(l + 1) * m];
                    if let Some(j) = line.iter().position(|v| v.is_nan()) {
                        return j as f64;
                    }
                    let mut best = 0;
                    for (j, &v) in line.iter().enumerate() {
                        if (max && v > line[best]) || (!max && v < line[best]) {
                            best = j;
                        }
                    }
                    best as f64
                })
                .collect();
            let arg = |t: &crate::Tensor, axis: isize| {
                if max { t.argmax(axis) } else { t.argmin(axis) }
                    .and_then(|a| a.to_f64_vec())
                    .expect("arg-reduction")
            };
            let along = arg(&rows, 1);
            let strided = arg(&rows.transpose(&[1, 0]).expect("transpose"), 0);
            let what = format!("{dtype} {}", if max { "argmax" } else { "argmin" });
            assert_eq!(along, want, "{what} along the contiguous axis");
            assert_eq!(strided, want, "{what} along a strided axis");
        }
    }
}
