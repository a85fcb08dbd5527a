//! Eager tensors, the way TensorFlow's "Introduction to tensors" guide shows them.
//!
//! Run: `cargo run --release --example tensors` (about a second on a laptop CPU).
//! Expected output: the tensors below printed TF-style, then "done". Every result is
//! compared with what TensorFlow 2.4 prints for the same code (the literals below); the
//! example exits non-zero on the first difference.

use ferroflow::prelude::*;
use ferroflow::random;

/// `got` must hold `want` (TensorFlow's output), each value within `tol`.
fn expect(
    what: &str,
    got: &Tensor,
    shape: &[usize],
    want: &[f64],
    tol: f64,
) -> Result<(), ferroflow::Error> {
    let values = got.to_f64_vec()?;
    let same = got.shape() == shape
        && values.len() == want.len()
        && values.iter().zip(want).all(|(g, w)| (g - w).abs() <= tol);
    if same {
        Ok(())
    } else {
        Err(ferroflow::Error::invalid(
            "tensors example",
            format!("{what}: got {values:?} of shape {:?}, TensorFlow gives {want:?} of shape {shape:?}", got.shape()),
        ))
    }
}

fn main() -> Result<(), ferroflow::Error> {
    ferroflow::init();
    let rank_2 = Tensor::from_vec(vec![1.0f32, 2.0, 3.0, 4.0, 5.0, 6.0], &[3, 2])?;
    println!("{rank_2}");
    let a = Tensor::from_vec(vec![1i32, 2, 3, 4], &[2, 2])?;
    let b = Tensor::ones(&[2, 2], DType::I32)?;
    println!("add: {}", a.add(&b)?);
    expect("add", &a.add(&b)?, &[2, 2], &[2.0, 3.0, 4.0, 5.0], 0.0)?;
    println!("mul: {}", a.mul(&b)?);
    expect("mul", &a.mul(&b)?, &[2, 2], &[1.0, 2.0, 3.0, 4.0], 0.0)?;
    println!("matmul: {}", a.matmul(&b)?);
    expect(
        "matmul",
        &a.matmul(&b)?,
        &[2, 2],
        &[3.0, 3.0, 7.0, 7.0],
        0.0,
    )?;
    let c = Tensor::from_vec(vec![4.0f32, 5.0, 10.0, 1.0], &[2, 2])?;
    println!("reduce_max: {}", c.reduce_max(Axes::All, false)?);
    expect(
        "reduce_max",
        &c.reduce_max(Axes::All, false)?,
        &[],
        &[10.0],
        0.0,
    )?;
    println!("argmax: {}", c.argmax(0)?);
    expect("argmax", &c.argmax(0)?, &[2], &[1.0, 0.0], 0.0)?;
    println!("softmax: {}", c.softmax(-1)?);
    expect(
        "softmax",
        &c.softmax(-1)?,
        &[2, 2],
        &[2.689_414e-1, 7.310_586e-1, 9.998_766_2e-1, 1.233_945_8e-4],
        1e-7,
    )?;
    println!("transpose: {}", rank_2.t()?);
    expect(
        "transpose",
        &rank_2.t()?,
        &[2, 3],
        &[1.0, 3.0, 5.0, 2.0, 4.0, 6.0],
        0.0,
    )?;
    let sliced = rank_2.strided_slice(&[
        SliceSpec::Range {
            start: Some(1),
            stop: None,
            step: 1,
        },
        SliceSpec::reversed(),
    ])?;
    println!("slice [1:, ::-1]: {sliced}");
    expect("slice", &sliced, &[2, 2], &[4.0, 3.0, 6.0, 5.0], 0.0)?;
    // ferroflow's Philox stream, not TF's numbers: the same seed gives the same draws.
    random::set_seed(42);
    let x = random::normal(&[2, 3], 0.0, 1.0, DType::F32, None)?;
    println!("random normal: {x}");
    random::set_seed(42);
    let again = random::normal(&[2, 3], 0.0, 1.0, DType::F32, None)?;
    expect(
        "set_seed repeats the draws",
        &again,
        &[2, 3],
        &x.to_f64_vec()?,
        0.0,
    )?;
    let images = random::uniform(&[1, 8, 8, 3], 0.0, 1.0, DType::F32, Some(1))?;
    let filters = random::truncated_normal(&[3, 3, 3, 4], 0.0, 0.1, DType::F32, Some(2))?;
    let y = images
        .conv2d(&filters, [1, 1], Padding::Same, [1, 1])?
        .max_pool2d([2, 2], [2, 2], Padding::Valid)?;
    println!("conv2d + max_pool2d shape: {:?}", y.shape());
    if y.shape() != [1, 4, 4, 4] {
        return Err(ferroflow::Error::invalid(
            "tensors example",
            format!(
                "conv2d + max_pool2d: shape {:?}, TensorFlow gives [1, 4, 4, 4]",
                y.shape()
            ),
        ));
    }
    let err = a.add(&c).unwrap_err();
    println!("a clear error: {err}");
    if !err
        .to_string()
        .contains("dtypes differ, lhs int32, rhs float32")
    {
        return Err(ferroflow::Error::invalid(
            "tensors example",
            format!("int32 + float32 must be refused naming both dtypes, got: {err}"),
        ));
    }
    println!("done");
    Ok(())
}
