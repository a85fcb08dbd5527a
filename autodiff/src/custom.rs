//! `stop_gradient` and `custom_gradient`.

use crate::tape::{active_recorders, GradFn, NodeOp};
use ferroflow_tensor::{Result, Tensor};

/// The same values, cut off from every tape (`tf.stop_gradient`): a new tensor identity over
/// the same storage through a recorded `StopGradient` op, which tapes give no gradient and
/// graph functions record (so a traced function computes it on every call).
///
/// ```
/// ferroflow::init();
/// use ferroflow::{Tensor, autodiff::{stop_gradient, GradientTape}};
/// let x = Tensor::scalar(2.0f32)?;
/// let tape = GradientTape::new();
/// tape.watch(&x);
/// let y = stop_gradient(&x)?.mul(&x)?; // d/dx [sg(x)·x] = sg(x) = 2
/// let g = tape.gradient(&y, &[(&x).into()])?[0].clone().unwrap();
/// assert_eq!(g.item::<f32>()?, 2.0);
/// # Ok::<(), ferroflow::Error>(())
/// ```
pub fn stop_gradient(x: &Tensor) -> Result<Tensor> {
    x.stop_gradient(false)
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
    // Fresh identities (a forward that returns an input unchanged must not alias it), made
    // by recorded ops a graph trace sees and the paused tapes do not.
    let result = forward(inputs).and_then(|(outputs, grad)| {
        let outputs = outputs
            .iter()
            .map(|y| y.stop_gradient(true))
            .collect::<Result<Vec<Tensor>>>()?;
        Ok((outputs, grad))
    });
    for r in &recorders {
        r.pause(-1);
    }
    let (outputs, grad) = result?;
    for r in &recorders {
        r.record(NodeOp::Custom(grad.clone()), inputs, &outputs);
    }
    Ok(outputs)
}
