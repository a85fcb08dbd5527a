//! gather, scatter_add (as gather's adjoint), gather_nd, scatter_nd, one_hot.

use super::harness::*;
use super::reference::{unravel, RefArray};
use crate::{DType, Device, HostData, Tensor};
use proptest::prelude::*;

/// gather along a random axis with random (repeated) indices; scatter_add is its adjoint:
/// ⟨gather(x, i), u⟩ = ⟨x, scatter_add(i, u)⟩.
pub fn gather_scatter(device: &Device) {
    let strat = nonempty_array(3, 4, -5.0, 5.0).prop_flat_map(|a| {
        let r = a.shape.len();
        (
            Just(a),
            0..r,
            prop::collection::vec(0..100usize, 0..6),
            any::<bool>(),
            view_kind(),
        )
    });
    check(
        "gather/scatter_add",
        strat,
        |(a, axis, raw_idx, i64_idx, view)| {
            let dtype = exact_float(device);
            let a = quantized(dtype, &a);
            let n = a.shape[axis];
            let idx: Vec<usize> = raw_idx.iter().map(|i| i % n).collect();
            let x = ok("input", make_tensor(device, dtype, &a, view))?;
            let it = if i64_idx {
                HostData::I64(idx.iter().map(|&i| i as i64).collect())
            } else {
                HostData::I32(idx.iter().map(|&i| i as i32).collect())
            };
            let it = ok("indices", Tensor::from_host_on(it, &[idx.len()], *device))?;
            let got = ok("gather", x.gather(&it, axis as isize))?;
            let mut shape = a.shape.clone();
            shape[axis] = idx.len();
            let want: Vec<f64> = (0..shape.iter().product())
                .map(|i| {
                    let mut ix = unravel(i, &shape);
                    ix[axis] = idx[ix[axis]];
                    a.at(&ix)
                })
                .collect();
            assert_matches("gather", &got, &RefArray::new(&shape, want.clone()), 1.0)?;
            // Adjoint identity with u = the gathered values plus one.
            let u: Vec<f64> = want.iter().map(|v| v + 1.0).collect();
            let ut = ok(
                "u",
                Tensor::from_host_on(HostData::from_f64_slice(dtype, &u), &shape, *device),
            )?;
            let s = ok(
                "scatter_add",
                Tensor::scatter_add(&it, &ut, &a.shape, axis as isize),
            )?;
            let lhs: f64 = want.iter().zip(&u).map(|(p, q)| p * q).sum();
            let mag: f64 = want.iter().zip(&u).map(|(p, q)| (p * q).abs()).sum();
            let tol = if dtype == DType::F64 { 1e-9 } else { 1e-5 };
            let rhs: f64 = a
                .data
                .iter()
                .zip(ok("read", s.to_f64_vec())?)
                .map(|(p, q)| p * q)
                .sum();
            prop_assert!(
                (lhs - rhs).abs() <= tol * (1.0 + mag),
                "scatter_add is not gather's adjoint: {lhs} vs {rhs}"
            );
            Ok(())
        },
    );
    // A large table and batch (past the CPU's threaded row copy): every row checked.
    let (rows, width, picks) = (3000usize, 40usize, 700usize);
    let table: Vec<f64> = (0..rows * width).map(|i| (i % 1013) as f64).collect();
    let idx: Vec<i64> = (0..picks).map(|i| ((i * 7919) % rows) as i64).collect();
    let x = Tensor::from_host_on(
        HostData::from_f64_slice(DType::F32, &table),
        &[rows, width],
        *device,
    )
    .expect("upload");
    let it = Tensor::from_host_on(HostData::I64(idx.clone()), &[picks], *device).expect("upload");
    let got = x
        .gather(&it, 0)
        .expect("gather")
        .to_f64_vec()
        .expect("read");
    for (r, &i) in idx.iter().enumerate() {
        let i = i as usize;
        assert_eq!(
            got[r * width..(r + 1) * width],
            table[i * width..(i + 1) * width],
            "row {r}"
        );
    }
    let x = Tensor::from_host_on(HostData::F32(vec![1.0, 2.0]), &[2], *device).expect("upload");
    let bad = Tensor::from_host_on(HostData::I32(vec![2]), &[1], *device).expect("upload");
    let msg = x.gather(&bad, 0).expect_err("index 2 of 2").to_string();
    assert!(msg.contains("out of range"), "{msg}");
}

/// `gather_group`: up to four tensors of mixed dtypes (as long along the gathered axis, views
/// among them) gathered by one index tensor give what each `gather` gives, bit for bit; an
/// index out of range is the error `gather` gives; tensors of different lengths are an
/// error naming the shapes.
pub fn gather_group(device: &Device) {
    let dtypes = supported(
        device,
        &[
            DType::F32,
            DType::I64,
            DType::I32,
            DType::F16,
            DType::Bool,
            DType::F64,
        ],
    );
    let strat = (
        prop::collection::vec((0..dtypes.len(), 0..3usize, 1..4usize, view_kind()), 1..5),
        1..6usize,
        0..2usize,
        prop::collection::vec(0..100usize, 0..8),
        any::<bool>(),
        any::<u64>(),
    );
    check(
        "gather_group",
        strat,
        |(tensors, n, axis_choice, raw_idx, i64_idx, seed)| {
            let mut g = crate::random::Philox::new([seed, 53]);
            // Each tensor: [n, w] or [w, n] (axis 1) with its own width and dtype.
            let axis = axis_choice;
            let mut xs = Vec::new();
            for &(di, extra, w, view) in &tensors {
                let dtype = dtypes[di];
                let mut shape = if axis == 0 { vec![n, w] } else { vec![w, n] };
                shape.extend(std::iter::repeat_n(2, extra.min(1)));
                let len: usize = shape.iter().product();
                let values: Vec<f64> = (0..len)
                    .map(|_| (g.next_f64() * 8.0).floor() - 3.0)
                    .collect();
                let a = quantized(dtype, &RefArray::new(&shape, values));
                xs.push(ok("input", make_tensor(device, dtype, &a, view))?);
            }
            let idx: Vec<usize> = raw_idx.iter().map(|i| i % n).collect();
            let it = if i64_idx {
                HostData::I64(idx.iter().map(|&i| i as i64).collect())
            } else {
                HostData::I32(idx.iter().map(|&i| i as i32).collect())
            };
            let it = ok("indices", Tensor::from_host_on(it, &[idx.len()], *device))?;
            let got = ok(
                "gather_group",
                Tensor::gather_group(&xs, &it, axis as isize),
            )?;
            prop_assert_eq!(got.len(), xs.len());
            for (k, (x, y)) in xs.iter().zip(&got).enumerate() {
                let want = ok("gather", x.gather(&it, axis as isize))?;
                prop_assert_eq!(y.shape(), want.shape());
                prop_assert_eq!(y.dtype(), want.dtype());
                let (a, b) = (ok("read", y.to_f64_vec())?, ok("read", want.to_f64_vec())?);
                prop_assert!(
                    a.iter().zip(&b).all(|(p, q)| p.to_bits() == q.to_bits()),
                    "tensor {k} ({}): {a:?} vs gather's {b:?}",
                    x.dtype()
                );
            }
            // One index past the end: gather's error.
            let bad = ok(
                "indices",
                Tensor::from_host_on(HostData::I64(vec![0, n as i64]), &[2], *device),
            )?;
            match Tensor::gather_group(&xs, &bad, axis as isize) {
                Err(crate::Error::IndexOutOfRange { index, bound, .. }) => {
                    prop_assert_eq!((index, bound), (n as i64, n));
                }
                other => prop_assert!(false, "index {n} of {n}: {other:?}"),
            }
            Ok(())
        },
    );
    let x = Tensor::from_host_on(HostData::F32(vec![1.0, 2.0]), &[2], *device).expect("upload");
    let y =
        Tensor::from_host_on(HostData::F32(vec![1.0, 2.0, 3.0]), &[3], *device).expect("upload");
    let i = Tensor::from_host_on(HostData::I32(vec![0]), &[1], *device).expect("upload");
    let msg = Tensor::gather_group(&[x, y], &i, 0)
        .expect_err("lengths 2 and 3")
        .to_string();
    assert!(msg.contains("[2]") && msg.contains("[3]"), "{msg}");
}

/// gather_nd, scatter_nd and one_hot on small cases with the math spelled out.
pub fn nd_and_one_hot(device: &Device) {
    let up = |d: HostData, s: &[usize]| Tensor::from_host_on(d, s, *device).expect("upload");
    // params[i, j] = 10 i + j; gather_nd at (1, 2) and (0, 0) gives 12 and 0.
    let params = up(
        HostData::F32(
            (0..2)
                .flat_map(|i| (0..3).map(move |j| (10 * i + j) as f32))
                .collect(),
        ),
        &[2, 3],
    );
    let idx = up(HostData::I64(vec![1, 2, 0, 0]), &[2, 2]);
    assert_eq!(
        params
            .gather_nd(&idx)
            .and_then(|t| t.to_vec::<f32>())
            .expect("gather_nd"),
        vec![12.0, 0.0]
    );
    // Depth 1 picks rows.
    let rows = up(HostData::I32(vec![1]), &[1, 1]);
    assert_eq!(
        params.gather_nd(&rows).expect("gather_nd rows").shape(),
        &[1, 3]
    );
    // scatter_nd accumulates repeated indices (TF semantics).
    let s_idx = up(HostData::I32(vec![0, 1, 0, 1, 1, 0]), &[3, 2]);
    let upd = up(HostData::F32(vec![1.0, 2.0, 5.0]), &[3]);
    let s = Tensor::scatter_nd(&s_idx, &upd, &[2, 2])
        .and_then(|t| t.to_vec::<f32>())
        .expect("scatter_nd");
    assert_eq!(s, vec![0.0, 3.0, 5.0, 0.0]);
    let out_of_range = up(HostData::I32(vec![2, 0]), &[1, 2]);
    assert!(
        params.gather_nd(&out_of_range).is_err(),
        "gather_nd with row 2 of 2 must fail"
    );
    // one_hot: out-of-range indices give an all-off row.
    let oh = Tensor::one_hot(
        &up(HostData::I32(vec![0, 2, 5]), &[3]),
        3,
        1.0,
        0.0,
        DType::F32,
    )
    .and_then(|t| t.to_vec::<f32>())
    .expect("one_hot");
    assert_eq!(oh, vec![1.0, 0.0, 0.0, 0.0, 0.0, 1.0, 0.0, 0.0, 0.0]);
}

/// Scatter-adds of more indices than GPU kernels scan per output (the CUDA backend's 64:
/// sorted beyond, each output summing its row's run) against sums in index order in each
/// type (the same bits: every backend adds a row's updates in index order): repeated and
/// unused rows, leading and trailing axes around the scattered one, the index types the
/// device has (contiguous, and a transposed view), float32, float64 and int32 updates; an
/// index below zero or at the bound is the error naming it.
pub fn many_index_scatter_adds(device: &Device) {
    let ni = 64 * 3 + 5;
    let (outer, bound, inner) = (2usize, 23usize, 3usize);
    // Rows 0..20 only (20..23 get nothing), some many times.
    let rows: Vec<i64> = (0..ni).map(|j| ((j * j * 7 + 3 * j) % 20) as i64).collect();
    let upd: Vec<f64> = (0..outer * ni * inner)
        .map(|i| ((i * 7919) % 1013) as f64 / 37.0 - 13.0)
        .collect();
    let shape = [outer, bound, inner];
    let up =
        |dtype: DType, v: &[f64], shape: &[usize]| upload(device, dtype, shape, v).expect("upload");
    for index_dtype in supported(device, &[DType::I32, DType::I64]) {
        let as_f64 = |v: &[i64]| v.iter().map(|&r| r as f64).collect::<Vec<f64>>();
        // [ni] as given, and as the transpose of a [third, 3] view.
        let flat = up(index_dtype, &as_f64(&rows), &[ni]);
        let third = ni / 3;
        let by_column: Vec<i64> = (0..third * 3)
            .map(|q| rows[(q % 3) * third + q / 3])
            .collect();
        let strided = up(index_dtype, &as_f64(&by_column), &[third, 3])
            .transpose(&[1, 0])
            .expect("transpose");
        for (how, indices, order) in [
            ("contiguous", flat, rows.clone()),
            ("a transposed view", strided, rows[..third * 3].to_vec()),
        ] {
            let count = order.len();
            let mut ushape = vec![outer];
            ushape.extend(indices.shape());
            ushape.push(inner);
            let u = &upd[..outer * count * inner];
            for dtype in supported(device, &[DType::F32, DType::F64, DType::I32]) {
                let updates = up(dtype, u, &ushape);
                let exact = updates.to_f64_vec().expect("read");
                let got = Tensor::scatter_add(&indices, &updates, &shape, 1)
                    .and_then(|t| t.to_f64_vec())
                    .expect("scatter_add");
                for o in 0..outer {
                    for r in 0..bound {
                        for c in 0..inner {
                            let terms = (0..count)
                                .filter(|&j| order[j] == r as i64)
                                .map(|j| exact[(o * count + j) * inner + c]);
                            let want = match dtype {
                                DType::F32 => terms.fold(0f32, |a, v| a + v as f32) as f64,
                                DType::I32 => terms.fold(0i64, |a, v| a + v as i64) as f64,
                                _ => terms.fold(0f64, |a, v| a + v),
                            };
                            let at = (o * bound + r) * inner + c;
                            assert_eq!(
                                got[at].to_bits(),
                                want.to_bits(),
                                "{dtype} by {index_dtype} indices ({how}), row {r}: {} vs {want}",
                                got[at]
                            );
                        }
                    }
                }
            }
        }
        for bad in [-1i64, bound as i64] {
            let mut wrong = rows.clone();
            wrong[ni / 2] = bad;
            let indices = up(index_dtype, &as_f64(&wrong), &[ni]);
            let updates = up(exact_float(device), &upd, &[outer, ni, inner]);
            let r = Tensor::scatter_add(&indices, &updates, &shape, 1);
            assert!(
                matches!(r, Err(crate::Error::IndexOutOfRange { index, bound: b, .. })
                    if index == bad && b == bound),
                "index {bad} ({index_dtype}): {:?}",
                r.map(|_| ())
            );
        }
    }
}
