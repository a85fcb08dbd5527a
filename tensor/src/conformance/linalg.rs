//! matmul with transposes and broadcast batch axes.

use super::harness::*;
use super::reference::RefArray;
use crate::{DType, Device};
use proptest::prelude::*;

const DTYPES: [DType; 6] = [
    DType::F32,
    DType::F64,
    DType::F16,
    DType::BF16,
    DType::I32,
    DType::I64,
];

/// `matmul_t` against the reference on random sizes (including 0), batch broadcasting,
/// transposes and views.
pub fn matmul(device: &Device) {
    let dtypes = supported(device, &DTYPES);
    let strat = (
        0..6usize,
        0..6usize,
        0..6usize,
        prop::collection::vec(1..3usize, 0..3),
        prop::collection::vec(any::<bool>(), 3),
        0..dtypes.len(),
        any::<bool>(),
        any::<bool>(),
        view_kind(),
    )
        .prop_flat_map(|(m, k, n, batch, ones, di, ta, tb, view)| {
            let ba: Vec<usize> = batch
                .iter()
                .enumerate()
                .map(|(i, &d)| if ones[i] { 1 } else { d })
                .collect();
            let bb = batch.clone();
            let sa = [ba.clone(), if ta { vec![k, m] } else { vec![m, k] }].concat();
            let sb = [
                bb[bb.len().min(1)..].to_vec(),
                if tb { vec![n, k] } else { vec![k, n] },
            ]
            .concat();
            let (na, nb): (usize, usize) = (sa.iter().product(), sb.iter().product());
            (
                Just((sa, sb, di, ta, tb, view)),
                prop::collection::vec(-2.0..2.0f64, na),
                prop::collection::vec(-2.0..2.0f64, nb),
            )
        });
    check("matmul", strat, |((sa, sb, di, ta, tb, view), va, vb)| {
        let dtype = dtypes[di];
        let round = |v: Vec<f64>| {
            if dtype.is_float() {
                v
            } else {
                v.iter().map(|x| (x * 2.0).round()).collect()
            }
        };
        let (a, b) = (
            quantized(dtype, &RefArray::new(&sa, round(va))),
            quantized(dtype, &RefArray::new(&sb, round(vb))),
        );
        let (x, y) = (
            ok("lhs", make_tensor(device, dtype, &a, view))?,
            ok("rhs", make_tensor(device, dtype, &b, ViewKind::Contiguous))?,
        );
        let got = ok("matmul", x.matmul_t(&y, ta, tb))?;
        let swap = |r: &RefArray, t: bool| {
            if !t {
                return r.clone();
            }
            let n = r.shape.len();
            let mut p: Vec<usize> = (0..n).collect();
            p.swap(n - 2, n - 1);
            r.transpose(&p)
        };
        let want = swap(&a, ta).matmul(&swap(&b, tb));
        let k = if ta {
            a.shape[a.shape.len() - 2]
        } else {
            a.shape[a.shape.len() - 1]
        };
        let want = RefArray::new(&want.shape, quantize(dtype, &want.data));
        assert_matches(
            &format!("matmul {dtype} ta {ta} tb {tb}"),
            &got,
            &want,
            2.0 + k as f64,
        )
    });
    // Sizes past the kernels' blocking and threading thresholds (thin matrices split by rows
    // or by columns, inner dimensions past a packed block, a transposed right operand, row
    // counts that are not a multiple of a register tile), in f32 and f64.
    for (m, k, n, ta, tb) in [
        (40usize, 33usize, 20usize, false, false),
        (48, 17, 300, true, true),
        (300, 40, 24, false, true),
        (33, 260, 17, true, false),
        (37, 300, 70, false, true),
        (530, 140, 45, true, false),
        (9, 129, 1000, false, false),
        (6, 1000, 400, false, false),
        (5, 200, 77, true, true),
    ] {
        for dtype in supported(device, &[DType::F32, DType::F64]) {
            let va: Vec<f64> = (0..m * k)
                .map(|i| ((i * 7919) % 13) as f64 / 6.5 - 1.0)
                .collect();
            let vb: Vec<f64> = (0..k * n)
                .map(|i| ((i * 104729) % 11) as f64 / 5.5 - 1.0)
                .collect();
            let a = RefArray::new(&[m, k], quantize(dtype, &va));
            let b = RefArray::new(&[k, n], quantize(dtype, &vb));
            let sa = if ta { a.transpose(&[1, 0]) } else { a.clone() };
            let sb = if tb { b.transpose(&[1, 0]) } else { b.clone() };
            let x = make_tensor(device, dtype, &sa, ViewKind::Contiguous).expect("lhs");
            let y = make_tensor(device, dtype, &sb, ViewKind::Contiguous).expect("rhs");
            let got = x.matmul_t(&y, ta, tb).expect("matmul");
            let want = a.matmul(&b);
            let r = assert_close(
                &format!("matmul {m}x{k}x{n} {dtype}"),
                &got,
                &RefArray::new(&want.shape, quantize(dtype, &want.data)),
                2.0,
                4.0 * epsilon(dtype) * k as f64,
            );
            assert!(r.is_ok(), "{r:?}");
        }
    }
    // Shape and dtype errors are values.
    let x = crate::Tensor::from_host_on(crate::HostData::F32(vec![0.0; 6]), &[2, 3], *device)
        .expect("upload");
    let msg = x
        .matmul(&x)
        .expect_err("inner dimensions differ")
        .to_string();
    assert!(msg.contains("matmul") && msg.contains("[2, 3]"), "{msg}");
}
