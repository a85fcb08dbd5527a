//! cumsum/cumprod (exclusive, reverse), sort/argsort (stable, NaN last), top_k.

use super::harness::*;
use super::reference::{unravel, RefArray};
use crate::{DType, Device};
use proptest::prelude::*;

const DTYPES: [DType; 9] = [
    DType::F32,
    DType::F64,
    DType::F16,
    DType::I32,
    DType::I64,
    DType::I16,
    DType::U16,
    DType::U32,
    DType::U64,
];

fn lanes(shape: &[usize], axis: usize) -> Vec<Vec<Vec<usize>>> {
    // Every 1-D lane along `axis`, as lists of multi-indices.
    let mut outer = shape.to_vec();
    outer[axis] = 1;
    (0..outer.iter().product())
        .map(|o| {
            let base = unravel(o, &outer);
            (0..shape[axis])
                .map(|j| {
                    let mut ix = base.clone();
                    ix[axis] = j;
                    ix
                })
                .collect()
        })
        .collect()
}

fn flat(shape: &[usize], ix: &[usize]) -> usize {
    ix.iter().zip(shape).fold(0, |acc, (&i, &d)| acc * d + i)
}

/// cumsum and cumprod in all four (exclusive, reverse) modes along a random axis.
pub fn scans(device: &Device) {
    let dtypes = supported(device, &DTYPES);
    let strat = nonempty_array(3, 5, -2.0, 2.0).prop_flat_map(|a| {
        let r = a.shape.len();
        (
            Just(a),
            0..r,
            0..dtypes.len(),
            view_kind(),
            any::<bool>(),
            any::<bool>(),
        )
    });
    check(
        "cumsum/cumprod",
        strat,
        |(a, axis, di, view, exclusive, reverse)| {
            let dtype = dtypes[di];
            let a = quantized(
                dtype,
                &if dtype.is_float() {
                    a
                } else {
                    a.map(|v| v.round())
                },
            );
            let x = ok("input", make_tensor(device, dtype, &a, view))?;
            for prod in [false, true] {
                let mut want = vec![0.0; a.data.len()];
                for lane in lanes(&a.shape, axis) {
                    let order: Vec<&Vec<usize>> = if reverse {
                        lane.iter().rev().collect()
                    } else {
                        lane.iter().collect()
                    };
                    let mut acc = if prod { 1.0 } else { 0.0 };
                    for ix in order {
                        let v = a.at(ix);
                        if exclusive {
                            want[flat(&a.shape, ix)] = acc;
                        }
                        acc = if prod { acc * v } else { acc + v };
                        if !exclusive {
                            want[flat(&a.shape, ix)] = acc;
                        }
                    }
                }
                let got = ok(
                    "scan",
                    if prod {
                        x.cumprod(axis as isize, exclusive, reverse)
                    } else {
                        x.cumsum(axis as isize, exclusive, reverse)
                    },
                )?;
                let want = RefArray::new(&a.shape, quantize(dtype, &want));
                let extra = 8.0 * epsilon(dtype) * 32.0;
                assert_close(
                    &format!(
                        "{} {dtype} excl {exclusive} rev {reverse}",
                        if prod { "cumprod" } else { "cumsum" }
                    ),
                    &got,
                    &want,
                    4.0,
                    extra,
                )?;
            }
            Ok(())
        },
    );
}

/// sort and argsort (stable in both directions), top_k on the last axis.
pub fn sorting(device: &Device) {
    let dtypes = supported(device, &DTYPES);
    let strat = nonempty_array(3, 6, -3.0, 3.0).prop_flat_map(|a| {
        let r = a.shape.len();
        (Just(a), 0..r, 0..dtypes.len(), view_kind(), any::<bool>())
    });
    check(
        "sort/argsort/top_k",
        strat,
        |(a, axis, di, view, descending)| {
            let dtype = dtypes[di];
            let a = quantized(dtype, &a.map(|v| v.round())); // ties on purpose
            let x = ok("input", make_tensor(device, dtype, &a, view))?;
            let (vals, idxs) = ok("sort", x.sort_with_indices(axis as isize, descending))?;
            prop_assert_eq!(idxs.dtype(), DType::I32);
            let (mut wv, mut wi) = (vec![0.0; a.data.len()], vec![0.0; a.data.len()]);
            for lane in lanes(&a.shape, axis) {
                let mut order: Vec<usize> = (0..lane.len()).collect();
                order.sort_by(|&p, &q| {
                    let (u, v) = (a.at(&lane[p]), a.at(&lane[q]));
                    // IEEE order (-0 == +0), as the kernels compare; inputs hold no NaN.
                    let o = u.partial_cmp(&v).unwrap_or(std::cmp::Ordering::Equal);
                    if descending {
                        o.reverse()
                    } else {
                        o
                    }
                });
                for (j, &p) in order.iter().enumerate() {
                    wv[flat(&a.shape, &lane[j])] = a.at(&lane[p]);
                    wi[flat(&a.shape, &lane[j])] = p as f64;
                }
            }
            assert_matches("sort values", &vals, &RefArray::new(&a.shape, wv), 1.0)?;
            assert_matches("argsort (stable)", &idxs, &RefArray::new(&a.shape, wi), 1.0)?;
            let last = a.shape.len() - 1;
            let k = a.shape[last] / 2;
            let (tv, ti) = ok("top_k", x.top_k(k))?;
            let (sv, si) = ok("sort desc", x.sort_with_indices(-1, true))?;
            let mut size = vec![-1isize; a.shape.len()];
            size[last] = k as isize;
            let begin = vec![0; a.shape.len()];
            prop_assert_eq!(
                ok("tv", tv.to_f64_vec())?,
                ok("sv", sv.slice(&begin, &size).and_then(|t| t.to_f64_vec()))?
            );
            prop_assert_eq!(
                ok("ti", ti.to_f64_vec())?,
                ok("si", si.slice(&begin, &size).and_then(|t| t.to_f64_vec()))?
            );
            Ok(())
        },
    );
    // NaN sorts last (ascending).
    let x = crate::Tensor::from_host_on(
        crate::HostData::F32(vec![2.0, f32::NAN, -1.0]),
        &[3],
        *device,
    )
    .expect("upload");
    let s = x
        .sort(0, false)
        .and_then(|t| t.to_vec::<f32>())
        .expect("sort");
    assert!(s[0] == -1.0 && s[1] == 2.0 && s[2].is_nan(), "{s:?}");
    // A line longer than int32 indices reach is refused, not sorted with wrapped indices
    // (a broadcast view: no memory; a device that cannot hold its size refuses the view).
    let narrow = supported(device, &[DType::U8, DType::I16, DType::F32]);
    let long = upload(device, narrow[0], &[1], &[1.0])
        .expect("upload")
        .broadcast_to(&[i32::MAX as usize + 1]);
    if let Ok(long) = long {
        let r = long.sort_with_indices(0, false);
        assert!(
            matches!(&r, Err(crate::Error::InvalidArgument { msg, .. }) if msg.contains("int32")),
            "{:?}",
            r.map(|_| ())
        );
    }
}

/// Scans of lines longer than GPU backends scan in one thread (4096: chunks beyond, their
/// totals scanned and added back), one line and two, along a contiguous and a strided axis,
/// in every (exclusive, reverse) mode, with lengths that leave the last chunk short and one
/// the chunks divide (read in place where the line is dense): running
/// sums in the float types against float64 references, sums and products of integers exactly
/// (wrapping), float products of values near 1 within a tolerance.
pub fn long_scans(device: &Device) {
    let dtypes = supported(
        device,
        &[DType::F32, DType::F16, DType::F64, DType::I32, DType::I64],
    );
    for (m, lines) in [(4097usize, 1usize), (10_007, 2), (4900, 2)] {
        let n = m * lines;
        for &dtype in &dtypes {
            for prod in [false, true] {
                let values: Vec<f64> = (0..n)
                    .map(|i| match (dtype.is_float(), prod) {
                        (true, false) => ((i * 7919) % 1013) as f64 / 101.0 - 5.0,
                        (true, true) => 1.0 + (((i * 7919) % 101) as f64 - 50.0) / 50_000.0,
                        (false, false) => ((i * 7919) % 2001) as f64 - 1000.0,
                        // Odd factors: a product that wraps but never becomes 0.
                        (false, true) => (2 * ((i * 7919) % 7) + 1) as f64,
                    })
                    .collect();
                let rows = upload(device, dtype, &[lines, m], &values).expect("upload");
                let exact = rows.to_f64_vec().expect("read");
                for (exclusive, reverse) in
                    [(false, false), (true, false), (false, true), (true, true)]
                {
                    let mut want = vec![0.0; n];
                    for l in 0..lines {
                        let order: Vec<usize> = if reverse {
                            (0..m).rev().collect()
                        } else {
                            (0..m).collect()
                        };
                        let (mut acc, mut wrapped) =
                            (if prod { 1.0 } else { 0.0 }, if prod { 1i64 } else { 0 });
                        for j in order {
                            let v = exact[l * m + j];
                            let at = l * m + j;
                            if exclusive {
                                want[at] = if dtype.is_float() {
                                    acc
                                } else {
                                    wrapped as f64
                                };
                            }
                            acc = if prod { acc * v } else { acc + v };
                            wrapped = match (prod, dtype) {
                                (true, DType::I32) => {
                                    (wrapped as i32).wrapping_mul(v as i32) as i64
                                }
                                (false, DType::I32) => {
                                    (wrapped as i32).wrapping_add(v as i32) as i64
                                }
                                (true, _) => wrapped.wrapping_mul(v as i64),
                                (false, _) => wrapped.wrapping_add(v as i64),
                            };
                            if !exclusive {
                                want[at] = if dtype.is_float() {
                                    acc
                                } else {
                                    wrapped as f64
                                };
                            }
                        }
                    }
                    let scan = |t: &crate::Tensor, axis: isize| {
                        if prod {
                            t.cumprod(axis, exclusive, reverse)
                        } else {
                            t.cumsum(axis, exclusive, reverse)
                        }
                    };
                    let along = scan(&rows, 1).expect("scan");
                    let strided = rows
                        .transpose(&[1, 0])
                        .and_then(|t| scan(&t, 0))
                        .and_then(|t| t.transpose(&[1, 0]))
                        .expect("scan of the transpose");
                    let what = format!(
                        "{} {dtype}, {lines} lines of {m}, exclusive {exclusive}, reverse {reverse}",
                        if prod { "cumprod" } else { "cumsum" }
                    );
                    for (how, t) in [("along 1", along), ("along 0 of the transpose", strided)] {
                        let got = t.to_f64_vec().expect("read");
                        for (i, (&g, &w)) in got.iter().zip(&want).enumerate() {
                            let close = if dtype.is_float() {
                                // Terms folded into element i so far, and the error a
                                // fold of them may carry: relative for products, against
                                // the running sum of magnitudes (at most 5 a term) for sums.
                                let j = i % m;
                                let k = (if reverse { m - j } else { j + 1 }) as f64;
                                let scale = if prod { k * w.abs() } else { 5.0 * k };
                                (g - w).abs() <= 16.0 * epsilon(dtype) * scale.max(1.0)
                            } else {
                                g == w
                            };
                            assert!(close, "{what}, {how}: element {i} is {g}, want {w}");
                        }
                    }
                }
            }
        }
    }
}

/// Sorts of lines longer than GPU kernels sort by rank or in one thread (the CUDA and wgpu
/// backends' 256: merge passes beyond), and of short lines, against a stable sort of the
/// documented keys (numbers ascending, -0 equal to 0, NaN above everything; descending the
/// reverse, ties in index order either way): values and int32 indices, along a contiguous
/// and a strided axis, with lengths that leave a run unpaired, in the float types (NaN, ±0,
/// float32 subnormals, which a device flushing them in comparisons would tie with 0, and
/// many ties) and integers the device has.
pub fn long_sorts(device: &Device) {
    let dtypes = supported(
        device,
        &[
            DType::F32,
            DType::F16,
            DType::BF16,
            DType::F64,
            DType::I32,
            DType::U8,
        ],
    );
    for (m, lines) in [(257usize, 3usize), (1000, 2), (512, 1), (40, 3)] {
        let n = m * lines;
        for &dtype in &dtypes {
            let values: Vec<f64> = (0..n)
                .map(|i| match (dtype.is_float(), i % 17) {
                    (true, 0) => f64::NAN,
                    (true, 1) => -0.0,
                    (true, 2) => 0.0,
                    (true, 3) => 1e-40,
                    (true, 4) => -3e-40,
                    (true, _) => ((i * 7919) % 61) as f64 / 4.0 - 7.0,
                    (false, _) => ((i * 7919) % 211) as f64,
                })
                .collect();
            // [lines, m] sorted along 1; its transpose [m, lines] (a view) along 0.
            let rows = upload(device, dtype, &[lines, m], &values).expect("upload");
            let exact = rows.to_f64_vec().expect("read");
            let key = |v: f64| -> (u8, f64) {
                if v.is_nan() {
                    (1, 0.0)
                } else {
                    (0, if v == 0.0 { 0.0 } else { v })
                }
            };
            for descending in [false, true] {
                let mut want_v = vec![0.0; n];
                let mut want_i = vec![0.0; n];
                for l in 0..lines {
                    let line = &exact[l * m..(l + 1) * m];
                    let mut order: Vec<usize> = (0..m).collect();
                    order.sort_by(|&p, &q| {
                        let o = key(line[p])
                            .partial_cmp(&key(line[q]))
                            .expect("ordered keys");
                        if descending {
                            o.reverse()
                        } else {
                            o
                        }
                    });
                    for (j, &p) in order.iter().enumerate() {
                        want_v[l * m + j] = line[p];
                        want_i[l * m + j] = p as f64;
                    }
                }
                let what = format!("{dtype}, {lines} lines of {m}, descending {descending}");
                let along = rows.sort_with_indices(1, descending).expect("sort");
                let (tv, ti) = rows
                    .transpose(&[1, 0])
                    .and_then(|t| t.sort_with_indices(0, descending))
                    .expect("sort of the transpose");
                let strided = (
                    tv.transpose(&[1, 0]).expect("transpose"),
                    ti.transpose(&[1, 0]).expect("transpose"),
                );
                for (how, (v, i)) in [("along 1", along), ("along 0 of the transpose", strided)] {
                    assert_eq!(i.dtype(), DType::I32);
                    let got_v = v.to_f64_vec().expect("read");
                    assert!(
                        got_v
                            .iter()
                            .zip(&want_v)
                            .all(|(g, w)| g.to_bits() == w.to_bits() || (g.is_nan() && w.is_nan())),
                        "values, {what}, {how}"
                    );
                    assert_eq!(
                        i.to_f64_vec().expect("read"),
                        want_i,
                        "indices, {what}, {how}"
                    );
                }
            }
        }
    }
}
