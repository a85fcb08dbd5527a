//! Eager tensors, the way TensorFlow's "Introduction to tensors" guide shows them.
//!
//! Run: `cargo run --release --example tensors` (about a second on a laptop CPU).
//! Expected output: the tensors below printed TF-style, then "done".

use ferroflow::prelude::*;
use ferroflow::random;

fn main() -> Result<(), ferroflow::Error> {
    ferroflow::init();
    let rank_2 = Tensor::from_vec(vec![1.0f32, 2.0, 3.0, 4.0, 5.0, 6.0], &[3, 2])?;
    println!("{rank_2}");
    let a = Tensor::from_vec(vec![1i32, 2, 3, 4], &[2, 2])?;
    let b = Tensor::ones(&[2, 2], DType::I32)?;
    println!("add: {}", a.add(&b)?);
    println!("mul: {}", a.mul(&b)?);
    println!("matmul: {}", a.matmul(&b)?);
    let c = Tensor::from_vec(vec![4.0f32, 5.0, 10.0, 1.0], &[2, 2])?;
    println!("reduce_max: {}", c.reduce_max(Axes::All, false)?);
    println!("argmax: {}", c.argmax(0)?);
    println!("softmax: {}", c.softmax(-1)?);
    println!("transpose: {}", rank_2.t()?);
    println!(
        "slice [1:, ::-1]: {}",
        rank_2.strided_slice(&[
            SliceSpec::Range {
                start: Some(1),
                stop: None,
                step: 1
            },
            SliceSpec::reversed()
        ])?
    );
    random::set_seed(42);
    let x = random::normal(&[2, 3], 0.0, 1.0, DType::F32, None)?;
    println!("random normal: {x}");
    let images = random::uniform(&[1, 8, 8, 3], 0.0, 1.0, DType::F32, Some(1))?;
    let filters = random::truncated_normal(&[3, 3, 3, 4], 0.0, 0.1, DType::F32, Some(2))?;
    let y = images
        .conv2d(&filters, [1, 1], Padding::Same, [1, 1])?
        .max_pool2d([2, 2], [2, 2], Padding::Valid)?;
    println!("conv2d + max_pool2d shape: {:?}", y.shape());
    let err = a.add(&c).unwrap_err();
    println!("a clear error: {err}");
    println!("done");
    Ok(())
}
