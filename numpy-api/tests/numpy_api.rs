//! The NumPy API beyond the differential cases: gradients through NumPy-API code (the seed
//! example, checked against finite differences), linalg under a tape, NumPy-worded errors,
//! `prefer_float32`, random numbers, interop, data pipelines, storage sharing, and property
//! tests of broadcasting/promotion and reductions against a plain f64 reference.

use ferroflow_autodiff::{GradientTape, Source};
use ferroflow_data::Dataset;
use ferroflow_numpy::{self as np, idx, DType, Tensor};
use proptest::prelude::*;

fn init() {
    ferroflow::init();
}

/// σ(x·w) summed, written with NumPy functions.
fn logistic_sum(x: &Tensor, w: &Tensor) -> np::Result<Tensor> {
    let z = np::dot(x, w)?;
    let s = np::true_divide(1.0, np::add(1.0, np::exp(np::negative(&z)?)?)?)?;
    np::sum(&s)
}

#[test]
fn tape_gradient_of_numpy_code_matches_finite_differences() {
    init();
    np::random::seed(3);
    let x = np::random::randn(&[5, 4]).unwrap();
    let w = np::random::randn(&[4]).unwrap();
    let tape = GradientTape::new();
    tape.watch(&w);
    let y = logistic_sum(&x, &w).unwrap();
    let g = tape.gradient(&y, &[Source::from(&w)]).unwrap()[0]
        .clone()
        .expect("gradient");
    assert_eq!(g.dtype(), DType::F64);
    let wv = w.to_vec::<f64>().unwrap();
    let gv = g.to_vec::<f64>().unwrap();
    let h = 1e-6;
    for i in 0..wv.len() {
        let shifted = |d: f64| {
            let mut v = wv.clone();
            v[i] += d;
            logistic_sum(&x, &np::asarray(v).unwrap())
                .unwrap()
                .item::<f64>()
                .unwrap()
        };
        let fd = (shifted(h) - shifted(-h)) / (2.0 * h);
        assert!(
            (fd - gv[i]).abs() < 1e-6,
            "dw[{i}]: tape {} vs finite difference {fd}",
            gv[i]
        );
    }
}

#[test]
fn second_order_gradients_through_numpy_code() {
    init();
    // d²/dx² Σ x³ = 6x, by nesting tapes around NumPy functions
    let x = np::asarray([1.0, -2.0, 0.5]).unwrap();
    let outer = GradientTape::new();
    outer.watch(&x);
    let inner = GradientTape::new();
    inner.watch(&x);
    let y = np::sum(np::power(&x, 3.0).unwrap()).unwrap();
    let dy = inner.gradient(&y, &[Source::from(&x)]).unwrap()[0]
        .clone()
        .unwrap();
    let dy_sum = np::sum(&dy).unwrap();
    let d2 = outer.gradient(&dy_sum, &[Source::from(&x)]).unwrap()[0]
        .clone()
        .unwrap();
    assert_eq!(d2.to_vec::<f64>().unwrap(), vec![6.0, -12.0, 3.0]);
}

#[test]
fn linalg_under_a_tape_says_it_has_no_gradient() {
    init();
    let a = np::asarray([[2.0, 1.0], [1.0, 3.0]]).unwrap();
    let tape = GradientTape::new();
    tape.watch(&a);
    let y = np::sum(np::linalg::inv(&a).unwrap()).unwrap();
    let e = tape.gradient(&y, &[Source::from(&a)]).unwrap_err();
    assert!(e.to_string().contains("linalg.inv"), "{e}");
    // norm is tensor ops: differentiable
    let tape = GradientTape::new();
    tape.watch(&a);
    let n = np::linalg::norm_with(&a, np::linalg::NormOrd::Fro, None, false).unwrap();
    let g = tape.gradient(&n, &[Source::from(&a)]).unwrap()[0]
        .clone()
        .unwrap();
    let want = np::true_divide(&a, &n).unwrap();
    assert!(np::allclose_with(&g, &want, 1e-12, 1e-12, false).unwrap());
}

#[test]
fn errors_are_worded_as_numpy_words_them() {
    init();
    let a = np::ones(&[2, 3], None).unwrap();
    let e = np::sum_with(&a, np::ReduceArgs::new().axis(2))
        .unwrap_err()
        .to_string();
    assert!(
        e.contains("axis 2 is out of bounds for array of dimension 2"),
        "{e}"
    );
    let e = np::add(&a, np::ones(&[4], None).unwrap())
        .unwrap_err()
        .to_string();
    assert!(
        e.contains("operands could not be broadcast together with shapes (2, 3) (4,)"),
        "{e}"
    );
    let e = np::reshape(&a, &[4, -1]).unwrap_err().to_string();
    assert!(
        e.contains("cannot reshape array of size 6 into shape"),
        "{e}"
    );
    let e = np::take(&a, np::asarray([3i64]).unwrap(), Some(0))
        .unwrap_err()
        .to_string();
    assert!(
        e.contains("index 3 is out of bounds for axis 0 with size 2"),
        "{e}"
    );
    let e = np::matmul(&a, &a).unwrap_err().to_string();
    assert!(e.contains("mismatch in its core dimension"), "{e}");
    let e = np::linalg::inv(np::zeros(&[2, 2], None).unwrap())
        .unwrap_err()
        .to_string();
    assert!(e.contains("Singular matrix"), "{e}");
    let e = np::getitem(&a, idx![0, 0, 0]).unwrap_err().to_string();
    assert!(e.contains("too many indices"), "{e}");
    // a corrupt .npy names the file
    let path = std::env::temp_dir().join("ferroflow-corrupt.npy");
    std::fs::write(&path, b"\x93NUMPY\x01\x00garbage").unwrap();
    let e = np::load(&path).unwrap_err().to_string();
    assert!(e.contains("ferroflow-corrupt.npy"), "{e}");
}

#[test]
fn arrays_share_storage_with_tensors() {
    init();
    let t = Tensor::from_vec(vec![1.0f32, 2.0, 3.0, 4.0], &[2, 2]).unwrap();
    assert!(np::asarray(&t).unwrap().shares_storage_with(&t));
    assert!(np::reshape(&t, &[4]).unwrap().shares_storage_with(&t));
    assert!(np::transpose(&t, None).unwrap().shares_storage_with(&t));
    assert!(np::getitem(&t, idx![.., 1])
        .unwrap()
        .shares_storage_with(&t));
    assert!(!np::array(&t).unwrap().shares_storage_with(&t));
}

#[test]
fn ndarray_and_nalgebra_round_trip() {
    init();
    let a =
        ndarray::Array3::<i32>::from_shape_fn((2, 3, 4), |(i, j, k)| (i * 100 + j * 10 + k) as i32);
    let t = np::from_ndarray(&a).unwrap();
    assert_eq!(t.shape(), &[2, 3, 4]);
    let back: ndarray::ArrayD<i32> = np::to_ndarray(&t).unwrap();
    assert_eq!(back, a.into_dyn());
    // a strided ndarray view converts in its logical order
    let m = ndarray::array![[1.0, 2.0, 3.0], [4.0, 5.0, 6.0]];
    let col = np::asarray(m.t()).unwrap();
    assert_eq!(
        col.to_vec::<f64>().unwrap(),
        vec![1.0, 4.0, 2.0, 5.0, 3.0, 6.0]
    );
    let d = nalgebra::DMatrix::from_row_slice(2, 3, &[1.0f32, 2.0, 3.0, 4.0, 5.0, 6.0]);
    let t = np::from_dmatrix(&d).unwrap();
    assert_eq!(
        t.to_vec::<f32>().unwrap(),
        vec![1.0, 2.0, 3.0, 4.0, 5.0, 6.0]
    );
    assert_eq!(np::to_dmatrix(&t).unwrap(), d.map(|v| v as f64));
    assert!(
        np::to_ndarray::<f64>(&t).is_err(),
        "element type must match"
    );
}

#[test]
fn numpy_functions_work_inside_a_data_pipeline() {
    init();
    let x = np::reshape(np::arange(0.0, 12.0, 1.0, DType::F32).unwrap(), &[4, 3]).unwrap();
    let ds = Dataset::from_tensor_slices(x)
        .unwrap()
        .map(|row: Tensor| np::clip(np::subtract(&row, 5.0)?, -2.0, 2.0))
        .batch(2, false)
        .unwrap();
    let batches: Vec<Tensor> = ds.iter().collect::<np::Result<_>>().unwrap();
    assert_eq!(batches.len(), 2);
    assert_eq!(
        batches[1].to_vec::<f32>().unwrap(),
        vec![1.0, 2.0, 2.0, 2.0, 2.0, 2.0]
    );
}

/// Row-major index of a broadcast position.
fn bcast_index(shape: &[usize], out: &[usize], flat: usize) -> usize {
    let mut rem = flat;
    let mut coords = vec![0; out.len()];
    for d in (0..out.len()).rev() {
        coords[d] = rem % out[d];
        rem /= out[d];
    }
    let off = out.len() - shape.len();
    let mut idx = 0;
    for (d, &n) in shape.iter().enumerate() {
        idx = idx * n + if n == 1 { 0 } else { coords[off + d] };
    }
    idx
}

fn shapes() -> impl Strategy<Value = (Vec<usize>, Vec<usize>)> {
    proptest::collection::vec(1usize..4, 1..4).prop_flat_map(|out| {
        let n = out.len();
        (
            Just(out.clone()),
            proptest::collection::vec(any::<bool>(), n),
            0..=n,
        )
            .prop_map(move |(o, ones, drop)| {
                let b: Vec<usize> = o
                    .iter()
                    .zip(&ones)
                    .map(|(d, one)| if *one { 1 } else { *d })
                    .collect();
                (o, b[drop..].to_vec())
            })
    })
}

const DTYPES: [DType; 6] = [
    DType::F64,
    DType::F32,
    DType::I32,
    DType::I64,
    DType::I8,
    DType::U8,
];

proptest! {
    #![proptest_config(ProptestConfig::with_cases(64))]

    #[test]
    fn broadcasting_and_promotion_match_a_plain_reference(
        (sa, sb) in shapes(),
        da in 0usize..6,
        db in 0usize..6,
        seed in 0u64..1000,
        swap in any::<bool>(),
    ) {
        init();
        let (sa, sb) = if swap { (sb, sa) } else { (sa, sb) };
        let (da, db) = (DTYPES[da], DTYPES[db]);
        np::random::seed(seed);
        let a = np::asarray_of(np::random::randint(0, 9, &sa, None).unwrap(), da).unwrap();
        let b = np::asarray_of(np::random::randint(1, 9, &sb, None).unwrap(), db).unwrap();
        let want = np::promote_types(da, db);
        let out_shape = {
            let r = sa.len().max(sb.len());
            (0..r).map(|i| {
                let x = if i + sa.len() >= r { sa[i + sa.len() - r] } else { 1 };
                let y = if i + sb.len() >= r { sb[i + sb.len() - r] } else { 1 };
                x.max(y)
            }).collect::<Vec<_>>()
        };
        let (av, bv) = (a.to_f64_vec().unwrap(), b.to_f64_vec().unwrap());
        let n: usize = out_shape.iter().product();
        for (name, f, r) in [
            ("add", np::add(&a, &b).unwrap(), (|x: f64, y: f64| x + y) as fn(f64, f64) -> f64),
            ("multiply", np::multiply(&a, &b).unwrap(), |x, y| x * y),
            ("maximum", np::maximum(&a, &b).unwrap(), |x: f64, y: f64| x.max(y)),
            ("subtract", np::subtract(&a, &b).unwrap(), |x, y| x - y),
        ] {
            prop_assert_eq!(f.dtype(), want, "{} of {} and {}", name, da, db);
            prop_assert_eq!(f.shape(), &out_shape[..]);
            let got = f.to_f64_vec().unwrap();
            for i in 0..n {
                let mut e = r(av[bcast_index(&sa, &out_shape, i)], bv[bcast_index(&sb, &out_shape, i)]);
                if want == DType::U8 { e = e.rem_euclid(256.0); }
                if want == DType::I8 { e = ((e as i64 + 128).rem_euclid(256) - 128) as f64; }
                prop_assert!((got[i] - e).abs() <= 1e-6 * e.abs().max(1.0), "{} [{}]: {} vs {}", name, i, got[i], e);
            }
        }
        // NumPy divides integers in the default float (int8 / int8 is float64).
        let q = np::true_divide(&a, &b).unwrap();
        let float = if want.is_float() { want } else { np::default_float() };
        prop_assert_eq!(q.dtype(), float);
    }

    #[test]
    fn reductions_match_a_plain_reference(
        shape in proptest::collection::vec(1usize..5, 1..4),
        axis_pick in 0usize..4,
        keepdims in any::<bool>(),
        seed in 0u64..1000,
    ) {
        init();
        np::random::seed(seed);
        let a = np::random::randn(&shape).unwrap();
        let v = a.to_f64_vec().unwrap();
        let ax = axis_pick % shape.len();
        let outer: usize = shape[..ax].iter().product();
        let n = shape[ax];
        let inner: usize = shape[ax + 1..].iter().product();
        let mut sums = vec![0.0; outer * inner];
        let mut maxs = vec![f64::NEG_INFINITY; outer * inner];
        for o in 0..outer { for k in 0..n { for i in 0..inner {
            let x = v[(o * n + k) * inner + i];
            sums[o * inner + i] += x;
            maxs[o * inner + i] = maxs[o * inner + i].max(x);
        }}}
        let args = np::ReduceArgs::new().axis(ax as isize).keepdims(keepdims);
        let s = np::sum_with(&a, args.clone()).unwrap();
        let m = np::mean_with(&a, args.clone()).unwrap();
        let mx = np::amax_with(&a, args).unwrap();
        let mut want_shape = shape.clone();
        if keepdims { want_shape[ax] = 1 } else { want_shape.remove(ax); }
        prop_assert_eq!(s.shape(), &want_shape[..]);
        for (i, (g, e)) in s.to_f64_vec().unwrap().iter().zip(&sums).enumerate() {
            prop_assert!((g - e).abs() < 1e-12, "sum[{}]", i);
        }
        for (g, e) in m.to_f64_vec().unwrap().iter().zip(&sums) {
            prop_assert!((g - e / n as f64).abs() < 1e-12);
        }
        prop_assert_eq!(mx.to_f64_vec().unwrap(), maxs);
    }
}

#[test]
fn linalg_and_creation_edge_cases_are_errors_not_hangs_or_panics() {
    init();
    let nan = np::asarray([[f64::NAN, 1.0], [1.0, 2.0]]).unwrap();
    // NaN input is NumPy's LinAlgError, not a panic or a hang inside nalgebra
    let e = np::linalg::svd(&nan, false).unwrap_err().to_string();
    assert!(e.contains("SVD did not converge"), "{e}");
    assert!(np::linalg::eigh(&nan).is_err());
    assert!(np::linalg::pinv(&nan, 1e-15).is_err());
    let empty = np::zeros(&[0, 0], None).unwrap();
    assert!(np::linalg::inv(&empty).is_err());
    assert!(np::linalg::det(np::zeros(&[2, 0, 0], None).unwrap()).is_err());
    let e = np::arange(0.0, 1e18, 1.0, None).unwrap_err().to_string();
    assert!(e.contains("Maximum allowed size exceeded"), "{e}");
    assert!(np::arange(0, 5, 0, None).is_err());
    assert!(np::geomspace(0.0, 1.0, 3).is_err());
    assert!(np::einsum("ij,jk->", &[np::ones(&[2, 3], None).unwrap()]).is_err());
    assert!(np::einsum("ij->k", &[np::ones(&[2, 3], None).unwrap()]).is_err());
    assert!(np::getitem(&np::ones(&[3], None).unwrap(), idx![np::step(.., 0)]).is_err());
    assert!(np::bincount(np::asarray([1i64 << 40]).unwrap(), None, 0).is_err());
    assert!(np::quantile(np::ones(&[3], None).unwrap(), Vec::<f64>::new()).is_err());
    assert!(np::concatenate(&Vec::<Tensor>::new(), Some(0)).is_err());
}

#[test]
fn complex_numbers_have_no_order_and_differentiate_through_the_fft() {
    use ferroflow_autodiff::{GradientTape, Source};
    ferroflow::init();
    let z = np::asarray([np::Complex64::new(1.0, 2.0), np::Complex64::new(-1.0, 0.5)]).unwrap();
    // TF's rule: complex numbers have no order (NumPy orders them lexicographically)
    for e in [
        np::maximum(&z, &z).unwrap_err(),
        np::sort(&z, -1).unwrap_err(),
        np::argmax(&z, None).unwrap_err(),
    ] {
        assert!(e.to_string().contains("complex128"), "{e}");
    }
    // Parseval: Σ |fft(x)|² = n·Σ x², so its gradient through the tape is 2·n·x
    let x = np::asarray([0.5, -1.0, 2.0, 0.25]).unwrap();
    let tape = GradientTape::new();
    tape.watch(&x);
    let y = np::fft::fft(&x).unwrap();
    let power =
        np::sum(np::real(np::multiply(&y, np::conj(&y).unwrap()).unwrap()).unwrap()).unwrap();
    let g = tape.gradient(&power, &[Source::from(&x)]).unwrap()[0]
        .clone()
        .expect("connected");
    let want: Vec<f64> = x
        .to_vec::<f64>()
        .unwrap()
        .iter()
        .map(|v| 2.0 * 4.0 * v)
        .collect();
    let got = g.to_vec::<f64>().unwrap();
    assert!(
        got.iter().zip(&want).all(|(a, b)| (a - b).abs() < 1e-12),
        "{got:?} vs {want:?}"
    );
}
