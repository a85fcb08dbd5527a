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

/// `fused_matmul` (`activation(a @ b + bias)`) against the reference in every float type:
/// random sizes, a batched left operand, views of it, both activations; then products
/// whose GEMM splits K and a strided bias (the kernels' other paths).
pub fn fused_matmul(device: &Device) {
    use crate::FusedActivation;
    let floats = supported(device, &DTYPES[..4]);
    let case = |dtype: DType,
                sa: &[usize],
                (k, n): (usize, usize),
                relu: bool,
                view: ViewKind,
                bias_step: usize,
                seed: u64|
     -> Result<(), TestCaseError> {
        let mut g = crate::random::Philox::new([seed, 31]);
        let mut draw =
            |len: usize| -> Vec<f64> { (0..len).map(|_| g.next_f64() * 4.0 - 2.0).collect() };
        let a = quantized(dtype, &RefArray::new(sa, draw(sa.iter().product())));
        let b = quantized(dtype, &RefArray::new(&[k, n], draw(k * n)));
        let long_bias = quantized(dtype, &RefArray::new(&[n * bias_step], draw(n * bias_step)));
        let x = ok("lhs", make_tensor(device, dtype, &a, view))?;
        let w = ok("rhs", make_tensor(device, dtype, &b, ViewKind::Contiguous))?;
        let bias = ok(
            "bias",
            make_tensor(device, dtype, &long_bias, ViewKind::Contiguous).and_then(|t| {
                t.strided_slice(&[crate::SliceSpec::Range {
                    start: None,
                    stop: None,
                    step: bias_step as isize,
                }])
            }),
        )?;
        let activation = if relu {
            FusedActivation::Relu
        } else {
            FusedActivation::Linear
        };
        let got = ok("fused_matmul", x.fused_matmul(&w, &bias, activation))?;
        let product = a.matmul(&b);
        let data: Vec<f64> = product
            .data
            .iter()
            .enumerate()
            .map(|(i, v)| {
                let s = v + long_bias.data[(i % n) * bias_step];
                if relu && s <= 0.0 {
                    0.0
                } else {
                    s
                }
            })
            .collect();
        let want = RefArray::new(&product.shape, quantize(dtype, &data));
        // The product's rounding grows with Σ|a·b| (≤ 4k here), not with the result, which
        // the bias can cancel to near zero.
        let atol = (2.0 + k as f64) * epsilon(dtype) * 4.0 * (k as f64 + 1.0);
        assert_close(
            &format!("fused_matmul {activation:?} {dtype} {sa:?}x[{k}, {n}]"),
            &got,
            &want,
            2.0 + k as f64,
            atol,
        )
    };
    let strat = (
        1..20usize,
        1..40usize,
        1..20usize,
        any::<bool>(),
        any::<bool>(),
        0..floats.len(),
        any::<u64>(),
        view_kind(),
    );
    check(
        "fused_matmul",
        strat,
        |(m, k, n, batched, relu, di, seed, view)| {
            let sa = if batched { vec![2, m, k] } else { vec![m, k] };
            case(floats[di], &sa, (k, n), relu, view, 1, seed)
        },
    );
    for &dtype in &floats {
        // A long K over few output tiles (GPU GEMMs split K there), a strided bias, and a
        // Dense layer's shape.
        for (sa, k, n, step) in [
            (vec![4, 2048], 2048, 8, 1),
            (vec![9, 7], 7, 5, 2),
            (vec![32, 784], 784, 256, 1),
        ] {
            let r = case(dtype, &sa, (k, n), true, ViewKind::Contiguous, step, 3);
            assert!(
                r.is_ok(),
                "{dtype} {sa:?}x[{k}, {n}] bias step {step}: {r:?}"
            );
        }
    }
}

/// `fused_matmul_reduce` (`Σ_rows program(a @ b, inputs..)[0]` and the program's other
/// outputs) against the reference in every float type: random sizes, both transposes, a
/// Dense layer's ReLU gradient (its column sums the bias gradient) and a program with a
/// broadcast row vector; the fused kernel where the device declares it, the product and
/// `fused_reduce` elsewhere.
pub fn fused_matmul_reduce(device: &Device) {
    use crate::{BinaryOp, ElementwiseProgram, ElementwiseStep, Tensor, UnaryOp};
    use std::sync::Arc;
    let floats = supported(device, &DTYPES[..4]);
    // relu_grad(p, y), returned too; tanh(p · z) with z a row vector, and p · z returned.
    let relu_grad = Arc::new(ElementwiseProgram {
        num_inputs: 2,
        steps: vec![ElementwiseStep::Binary(BinaryOp::ReluGrad, 0, 1)],
        outputs: vec![2, 2],
    });
    let scaled_tanh = Arc::new(ElementwiseProgram {
        num_inputs: 2,
        steps: vec![
            ElementwiseStep::Binary(BinaryOp::Mul, 0, 1),
            ElementwiseStep::Unary(UnaryOp::Tanh, 2),
        ],
        outputs: vec![3, 2],
    });
    let strat = (
        (1..40usize, 1..30usize, 1..40usize),
        (any::<bool>(), any::<bool>(), any::<bool>()),
        0..floats.len(),
        any::<u64>(),
    );
    check(
        "fused_matmul_reduce",
        strat,
        |((m, k, n), (ta, tb, relu), di, seed)| {
            let dtype = floats[di];
            let mut g = crate::random::Philox::new([seed, 47]);
            let mut draw =
                |len: usize| -> Vec<f64> { (0..len).map(|_| g.next_f64() * 4.0 - 2.0).collect() };
            let a_shape = if ta { [k, m] } else { [m, k] };
            let b_shape = if tb { [n, k] } else { [k, n] };
            let a = quantized(dtype, &RefArray::new(&a_shape, draw(m * k)));
            let b = quantized(dtype, &RefArray::new(&b_shape, draw(k * n)));
            let other_shape = if relu { vec![m, n] } else { vec![n] };
            let other = quantized(
                dtype,
                &RefArray::new(&other_shape, draw(other_shape.iter().product())),
            );
            let at = |i: usize, l: usize| {
                if ta {
                    a.data[l * m + i]
                } else {
                    a.data[i * k + l]
                }
            };
            let bt = |l: usize, j: usize| {
                if tb {
                    b.data[j * k + l]
                } else {
                    b.data[l * n + j]
                }
            };
            // The reference: each output's program values, and Σ|a·b| per output for the
            // product's rounding bound.
            let mut first = vec![0.0; m * n];
            let mut second = vec![0.0; m * n];
            let mut magnitude = vec![0.0; m * n];
            for i in 0..m {
                for j in 0..n {
                    let p: f64 = (0..k).map(|l| at(i, l) * bt(l, j)).sum();
                    magnitude[i * n + j] = (0..k).map(|l| (at(i, l) * bt(l, j)).abs()).sum();
                    let (v, w) = if relu {
                        let y = other.data[i * n + j];
                        let v = if y > 0.0 { p } else { 0.0 };
                        (v, v)
                    } else {
                        let s = p * other.data[j];
                        (s.tanh(), s)
                    };
                    first[i * n + j] = v;
                    second[i * n + j] = w;
                }
            }
            let sums: Vec<f64> = (0..n)
                .map(|j| (0..m).map(|i| first[i * n + j]).sum())
                .collect();
            let x = ok("a", make_tensor(device, dtype, &a, ViewKind::Contiguous))?;
            let w = ok("b", make_tensor(device, dtype, &b, ViewKind::Contiguous))?;
            let o = ok(
                "other",
                make_tensor(device, dtype, &other, ViewKind::Contiguous),
            )?;
            let program = if relu { &relu_grad } else { &scaled_tanh };
            let got = ok(
                "fused_matmul_reduce",
                Tensor::fused_matmul_reduce(&x, &w, (ta, tb), program, &[o]),
            )?;
            prop_assert_eq!(got.len(), 2);
            let what = format!(
                "fused_matmul_reduce {} {dtype} [{m}, {k}]x[{k}, {n}] transposes {ta} {tb}",
                if relu { "relu_grad" } else { "tanh(p·z)" }
            );
            // Each output's rounding is bounded by (k + 4)·ε·(Σ|a·b| + 1) (the scale by z and
            // tanh do not widen it); a column sum's by those of its m terms plus m·ε·Σ|terms|.
            let eps = epsilon(dtype);
            let bound: Vec<f64> = magnitude
                .iter()
                .map(|s| (k as f64 + 4.0) * eps * (s + 1.0))
                .collect();
            let sum_tol: Vec<f64> = (0..n)
                .map(|j| {
                    (0..m)
                        .map(|i| {
                            bound[i * n + j]
                                + (m as f64 + 2.0) * eps * (first[i * n + j].abs() + 1.0)
                        })
                        .sum()
                })
                .collect();
            assert_within(
                &format!("{what}: column sums"),
                &got[0],
                &RefArray::new(&[n], sums),
                &sum_tol,
            )?;
            assert_within(
                &format!("{what}: second output"),
                &got[1],
                &RefArray::new(&[m, n], second),
                &bound,
            )
        },
    );
}
