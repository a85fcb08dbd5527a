//! TensorFlow's "Custom training: basics" tutorial: fit `y = W·x + b` to noisy samples of
//! `y = 3x + 2` with a `GradientTape` and plain gradient descent, the training step wrapped
//! in a graph function (TF's `@tf.function`): traced on the first call, replayed after.
//!
//! Run: `cargo run --release --example custom_training_loop` (well under a second).
//! Expected output: the loss falling every epoch, then `W ≈ 3.0, b ≈ 2.0`.

use ferroflow::autodiff::{GradientTape, Source};
use ferroflow::function::Function;
use ferroflow::prelude::*;
use ferroflow::random;

fn main() -> Result<(), ferroflow::Error> {
    ferroflow::init();
    const TRUE_W: f32 = 3.0;
    const TRUE_B: f32 = 2.0;
    let n = 1000;
    let x = random::stateless_normal(&[n], [1, 1], 0.0, 1.0, DType::F32)?;
    let noise = random::stateless_normal(&[n], [2, 2], 0.0, 1.0, DType::F32)?;
    let y = x
        .mul(&Tensor::scalar(TRUE_W)?)?
        .add(&Tensor::scalar(TRUE_B)?)?
        .add(&noise)?;

    // The model: tf.Variable(5.0) and tf.Variable(0.0), as in the tutorial.
    let w = Variable::new("w", Tensor::scalar(5.0f32)?);
    let b = Variable::new("b", Tensor::scalar(0.0f32)?);
    let learning_rate = Tensor::scalar(0.1f32)?;
    let sources: Vec<Source> = vec![(&w).into(), (&b).into()];

    // One step: the loss, its gradients and the updates, all recorded into the graph on
    // the first call (the updates are variable writes, replayed on every call).
    let train_step = Function::new(|args: &[Tensor]| {
        let (x, y) = (&args[0], &args[1]);
        let tape = GradientTape::new();
        let prediction = x.mul(&w.value())?.add(&b.value())?;
        let loss = y
            .squared_difference(&prediction)?
            .reduce_mean(Axes::All, false)?;
        let grads = tape.gradient(&loss, &sources)?;
        for (v, g) in [&w, &b].into_iter().zip(grads) {
            let g = g.ok_or_else(|| {
                ferroflow::Error::invalid("train_step", "both variables are used by the loss")
            })?;
            v.assign_sub(&g.mul(&learning_rate)?)?;
        }
        Ok(vec![loss])
    })
    .with_name("train_step");

    for epoch in 0..25 {
        let loss = train_step.call(&[x.clone(), y.clone()])?.remove(0);
        println!(
            "epoch {epoch:2}: W = {:.3}, b = {:.3}, loss = {:.5}",
            w.peek().item::<f32>()?,
            b.peek().item::<f32>()?,
            loss.item::<f32>()?
        );
    }
    let (fw, fb) = (w.peek().item::<f32>()?, b.peek().item::<f32>()?);
    println!("W ≈ {fw:.1}, b ≈ {fb:.1}");
    if (fw - TRUE_W).abs() > 0.2 || (fb - TRUE_B).abs() > 0.2 {
        return Err(ferroflow::Error::invalid(
            "custom_training_loop",
            format!("did not converge: W = {fw}, b = {fb}"),
        ));
    }
    Ok(())
}
