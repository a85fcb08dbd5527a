//! `stop_gradient` and `custom_gradient`.

use crate::tape::{active_recorders, GradFn, NodeOp};
use ferroflow_tensor::{Result, Tensor};

/// The same values, cut off from every tape (`tf.stop_gradient`): a new tensor identity over
/// the same storage that no tape has seen produced.
pub fn stop_gradient(x: &Tensor) -> Tensor {
    x.with_new_id()
}

/// Runs `forward` on `inputs` without recording its inner ops, and records one node whose
/// gradient is the returned function instead (`@tf.custom_gradient`).
///
/// The gradient function receives one gradient per output (zeros for unused outputs) and
/// returns one optional gradient per input. It is run with ordinary ops, so it is itself
/// differentiable by an outer tape.
///
/// ```
/// ferroflow::init();
/// use ferroflow::{Tensor, autodiff::{custom_gradient, GradientTape}};
/// use std::sync::Arc;
/// // log(1 + eˣ) with the stable gradient σ(x) = 1 - 1/(1 + eˣ)
/// let x = Tensor::scalar(100.0f64)?;
/// let tape = GradientTape::new();
/// tape.watch(&x);
/// let y = custom_gradient(&[x.clone()], |xs| {
///     let e = xs[0].exp()?;
///     let y = e.add(&e.ones_like()?)?.log()?;
///     let x0 = xs[0].clone();
///     let grad: ferroflow::autodiff::GradFn = Arc::new(move |dy: &[Tensor]| Ok(vec![Some(dy[0].mul(&x0.sigmoid()?)?)]));
///     Ok((vec![y], grad))
/// })?;
/// let g = tape.gradient(&y[0], &[(&x).into()])?[0].clone().unwrap();
/// assert_eq!(g.item::<f64>()?, 1.0);
/// # Ok::<(), ferroflow::Error>(())
/// ```
pub fn custom_gradient(
    inputs: &[Tensor],
    forward: impl FnOnce(&[Tensor]) -> Result<(Vec<Tensor>, GradFn)>,
) -> Result<Vec<Tensor>> {
    let recorders = active_recorders();
    for r in &recorders {
        r.pause(1);
    }
    let result = forward(inputs);
    for r in &recorders {
        r.pause(-1);
    }
    let (outputs, grad) = result?;
    // Fresh identities: a forward that returns an input unchanged must not alias it.
    let outputs: Vec<Tensor> = outputs.iter().map(crate::custom::stop_gradient).collect();
    for r in &recorders {
        r.record(NodeOp::Custom(grad.clone()), inputs, &outputs);
    }
    Ok(outputs)
}
