//! TensorFlow's "NumPy API on TensorFlow" guide (`tf.experimental.numpy`), in ferroflow:
//! arrays that are tensors, NumPy type promotion, broadcasting, indexing, a gradient through
//! NumPy code, the guide's `tf.data` pipeline over a NumPy array and its gradient of
//! `sum(sigmoid(dot(x, w)))`, interop with `.npy` files and `ndarray`, and the array on
//! another device.
//!
//! Run: `cargo run --release --example numpy_api` (well under a second).
//! Every result is compared with what NumPy 1.x prints for the same code (the literals
//! below); the example exits non-zero on the first difference.

use ferroflow::autodiff::{GradientTape, Source};
use ferroflow::data::Dataset;
use ferroflow::numpy::{self as np, idx, DType};

/// `got` must equal NumPy's `want` (shape and values within `tol`; NaN matches NaN).
fn expect(
    what: &str,
    got: &np::Tensor,
    shape: &[usize],
    want: &[f64],
    tol: f64,
) -> Result<(), ferroflow::Error> {
    let values = got.to_f64_vec()?;
    let close = |g: &f64, w: &f64| (g.is_nan() && w.is_nan()) || (g - w).abs() <= tol;
    check(
        &format!(
            "{what}: got {values:?} of shape {:?}, NumPy gives {want:?} of shape {shape:?}",
            got.shape()
        ),
        got.shape() == shape
            && values.len() == want.len()
            && values.iter().zip(want).all(|(g, w)| close(g, w)),
    )
}

fn check(what: &str, ok: bool) -> Result<(), ferroflow::Error> {
    if ok {
        Ok(())
    } else {
        Err(ferroflow::Error::invalid(
            "numpy_api example",
            format!("{what}: wrong result"),
        ))
    }
}

fn main() -> Result<(), ferroflow::Error> {
    ferroflow::init();

    // ND arrays are tensors: no copies between the NumPy API and the rest of ferroflow.
    let ones = np::ones(&[5, 3], DType::F32)?;
    println!("created {ones}");
    let tensor = ferroflow::Tensor::from_vec(vec![1.0f32, 2.0, 3.0], &[3])?;
    check(
        "shared storage",
        np::asarray(&tensor)?.shares_storage_with(&tensor),
    )?;

    // Type promotion follows NumPy: int32 + float32 is float64; a Rust scalar promotes by value.
    let mixed = np::add(np::asarray([1i32, 2])?, np::asarray([0.5f32, 0.25])?)?;
    println!("int32 + float32 -> {}: {mixed}", mixed.dtype());
    check("promotion", mixed.dtype() == DType::F64)?;
    expect("int32 + float32", &mixed, &[2], &[1.5, 2.25], 0.0)?;
    let small = np::add(np::asarray([1i8, 2])?, 3)?;
    check("value-based scalar", small.dtype() == DType::I8)?;
    expect("int8 + 3", &small, &[2], &[4.0, 5.0], 0.0)?;

    // Broadcasting, reductions, and NumPy's defaults (mean of integers is float64).
    let x = np::reshape(np::arange(0, 12, 1, None)?, &[3, 4])?;
    let centred = np::subtract(
        &x,
        np::mean_with(&x, np::ReduceArgs::new().axis(0).keepdims(true))?,
    )?;
    println!("centred columns {centred}");
    check("mean of int64 is float64", centred.dtype() == DType::F64)?;
    expect(
        "x - x.mean(0, keepdims=True)",
        &centred,
        &[3, 4],
        &[
            -4.0, -4.0, -4.0, -4.0, 0.0, 0.0, 0.0, 0.0, 4.0, 4.0, 4.0, 4.0,
        ],
        0.0,
    )?;

    // Indexing: slices with steps, new axes, boolean masks, integer arrays.
    let odd_rows = np::getitem(&x, idx![1..3, np::step(.., -1)])?;
    println!("x[1:3, ::-1] = {odd_rows}");
    expect(
        "x[1:3, ::-1]",
        &odd_rows,
        &[2, 4],
        &[7.0, 6.0, 5.0, 4.0, 11.0, 10.0, 9.0, 8.0],
        0.0,
    )?;
    let big = np::getitem(&x, idx![np::greater(&x, 8)?])?;
    check("mask", big.to_vec::<i64>()? == vec![9, 10, 11])?;

    // A gradient through NumPy code: d/dw Σ tanh(x·w) = xᵀ(1 - tanh²(x·w)).
    let data = np::subtract(
        np::divide(np::reshape(np::arange(0, 32, 1, None)?, &[8, 4])?, 10.0)?,
        1.0,
    )?;
    let w = np::asarray([0.1, -0.2, 0.3, -0.4])?;
    let tape = GradientTape::new();
    tape.watch(&w);
    let loss = np::sum(np::tanh(np::dot(&data, &w)?)?)?;
    let grad = tape.gradient(&loss, &[Source::from(&w)])?[0]
        .clone()
        .ok_or_else(|| ferroflow::Error::invalid("numpy_api example", "no gradient"))?;
    let by_hand = np::dot(
        np::transpose(&data, None)?,
        np::subtract(1.0, np::square(np::tanh(np::dot(&data, &w)?)?)?)?,
    )?;
    println!("gradient {grad}");
    check(
        "gradient",
        np::allclose_with(&grad, &by_hand, 1e-12, 1e-12, false)?,
    )?;
    // NumPy: data.T @ (1 - np.tanh(data @ w)**2)
    expect(
        "gradient",
        &grad,
        &[4],
        &[2.640_012_62, 3.396_469_52, 4.152_926_42, 4.909_383_32],
        1e-8,
    )?;

    // The guide's interoperability section, NumPy names as it writes them:
    //   ds = tf.data.Dataset.from_tensor_slices(np.random.randn(1000, 1024))
    //            .map(lambda z: z.clip(-1, 1)).batch(100)
    //   with tf.GradientTape() as tape: tape.watch(w); y = np.sum(tf.sigmoid(np.dot(x, w)))
    np::random::seed(1);
    let ds = Dataset::from_tensor_slices(np::random::randn(&[1000, 1024])?)?
        .map(|z| np::clip(&z, -1.0, 1.0))
        .batch(100, false)?;
    let mut batches = 0;
    let mut first = None;
    for batch in ds.iter() {
        let batch = batch?;
        check(
            "batch of clipped rows",
            batch.shape() == [100, 1024]
                && np::all(np::less_equal(np::absolute(&batch)?, 1.0)?)?.item::<bool>()?,
        )?;
        first.get_or_insert(batch);
        batches += 1;
    }
    check("10 batches of 100", batches == 10)?;
    let xb = first.ok_or_else(|| ferroflow::Error::invalid("numpy_api example", "no batch"))?;
    let wb = np::multiply(np::random::randn(&[1024, 8])?, 0.05)?;
    let tape = GradientTape::new();
    tape.watch(&wb);
    let y = np::sum(np::dot(&xb, &wb)?.sigmoid()?)?;
    let dw = tape.gradient(&y, &[Source::from(&wb)])?[0]
        .clone()
        .ok_or_else(|| ferroflow::Error::invalid("numpy_api example", "no gradient for w"))?;
    // d/dw Σ σ(xw) = xᵀ σ(xw)(1 - σ(xw)), written in NumPy names.
    let s = np::dot(&xb, &wb)?.sigmoid()?;
    let by_hand = np::dot(
        np::transpose(&xb, None)?,
        np::multiply(&s, np::subtract(1.0, &s)?)?,
    )?;
    println!(
        "tf.data: {batches} batches of {:?}; dy/dw {:?}",
        xb.shape(),
        dw.shape()
    );
    check(
        "gradient of sum(sigmoid(dot(x, w)))",
        dw.shape() == [1024, 8] && np::allclose_with(&dw, &by_hand, 1e-12, 1e-12, false)?,
    )?;

    // Files NumPy reads, and the Rust array crates.
    let path = std::env::temp_dir().join("ferroflow-numpy-example.npz");
    np::savez_compressed(&path, &[("x", &x), ("grad", &grad)])?;
    let back = np::load_npz(&path)?;
    check("npz", np::array_equal(back.array("x")?, &x)?)?;
    let nd: ferroflow::numpy::ndarray::ArrayD<i64> = np::to_ndarray(&x)?;
    check("ndarray", nd[[2, 3]] == 11)?;

    // Sorting, linear algebra.
    let s = np::sort(np::asarray([3.0, f64::NAN, 1.0])?, Some(-1))?;
    println!("sort puts NaN last: {s}");
    expect("sort", &s, &[3], &[1.0, 3.0, f64::NAN], 0.0)?;
    let a = np::asarray([[4.0, 1.0], [1.0, 3.0]])?;
    let (evals, _) = np::linalg::eigh(&a)?;
    let inv = np::linalg::inv(&a)?;
    check(
        "inverse",
        np::allclose_with(np::matmul(&a, &inv)?, np::eye(2)?, 1e-12, 1e-12, false)?,
    )?;
    println!("eigenvalues {evals}");
    expect("eigh", &evals, &[2], &[2.381_966_01, 4.618_033_99], 1e-8)?;
    expect(
        "inv",
        &inv,
        &[2, 2],
        &[0.272_727_27, -0.090_909_09, -0.090_909_09, 0.363_636_36],
        1e-8,
    )?;
    println!("done");
    Ok(())
}
