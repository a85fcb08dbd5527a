//! `LossScaleOptimizer` (TF 2.4 mixed precision): scales the loss up so small f16 gradients
//! do not flush to zero, unscales the gradients, and, under a dynamic scale, skips steps
//! whose gradients overflowed.

use crate::optimizer::{Optimizer, OptimizerCore};
use ferroflow_autodiff::{GradientTape, Source};
use ferroflow_tensor::{Axes, Error, Result, Tensor, Variable};

/// How the loss scale moves (TF 2.4's `dynamic`, `initial_scale`, `dynamic_growth_steps`).
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum LossScale {
    /// TF's dynamic scale: starts at `initial_scale`, doubles after `growth_steps` finite
    /// steps in a row, and on any non-finite gradient halves (never below 1) and skips the
    /// step.
    Dynamic {
        /// The first scale (TF: 2^15).
        initial_scale: f64,
        /// Finite steps between doublings (TF: 2000).
        growth_steps: u32,
    },
    /// A constant scale. Every step is applied, even one whose gradients are not finite (TF
    /// 2.4 skips steps only under a dynamic scale).
    Fixed(f64),
}

impl LossScale {
    /// TF 2.4's default: dynamic, starting at 2^15, doubling after 2000 finite steps.
    ///
    /// ```
    /// use ferroflow::optim::LossScale;
    /// assert_eq!(LossScale::dynamic(), LossScale::Dynamic { initial_scale: 32768.0, growth_steps: 2000 });
    /// ```
    pub fn dynamic() -> LossScale {
        LossScale::Dynamic {
            initial_scale: 32768.0,
            growth_steps: 2000,
        }
    }
    /// The scale the optimizer starts with.
    pub fn initial_scale(&self) -> f64 {
        match *self {
            LossScale::Dynamic { initial_scale, .. } => initial_scale,
            LossScale::Fixed(s) => s,
        }
    }
}

/// Wraps an optimizer with loss scaling (`tf.keras.mixed_precision.LossScaleOptimizer`).
///
/// ```
/// ferroflow::init();
/// use ferroflow::optim::{LossScaleOptimizer, Optimizer, Sgd};
/// let opt = LossScaleOptimizer::dynamic(Box::new(Sgd::new(0.1)))?;
/// assert_eq!(opt.current_loss_scale(), 32768.0);
/// # Ok::<(), ferroflow::Error>(())
/// ```
pub struct LossScaleOptimizer {
    inner: Box<dyn Optimizer>,
    mode: LossScale,
    scale: f64,
    good_steps: u32,
    replica_gradients: crate::optimizer::ReplicaGradients,
}

impl LossScaleOptimizer {
    /// Dynamic loss scaling with TF 2.4's defaults (2^15, growth every 2000 finite steps).
    pub fn dynamic(inner: Box<dyn Optimizer>) -> Result<LossScaleOptimizer> {
        LossScaleOptimizer::new(inner, LossScale::dynamic())
    }
    /// Any mode. Refuses to wrap a LossScaleOptimizer (TF does too), a scale that is not
    /// positive and finite, and a dynamic scale that grows after 0 steps.
    ///
    /// ```
    /// ferroflow::init();
    /// use ferroflow::optim::{LossScale, LossScaleOptimizer, Sgd};
    /// let opt = LossScaleOptimizer::new(
    ///     Box::new(Sgd::new(0.1)),
    ///     LossScale::Dynamic { initial_scale: 1024.0, growth_steps: 100 },
    /// )?;
    /// assert_eq!(opt.current_loss_scale(), 1024.0);
    /// # Ok::<(), ferroflow::Error>(())
    /// ```
    pub fn new(inner: Box<dyn Optimizer>, mode: LossScale) -> Result<LossScaleOptimizer> {
        let bad = |msg: String| Err(Error::invalid("LossScaleOptimizer", msg));
        if inner.name() == "LossScaleOptimizer" {
            return bad("cannot wrap a LossScaleOptimizer in another".into());
        }
        let scale = mode.initial_scale();
        if !(scale > 0.0 && scale.is_finite()) {
            return bad(format!(
                "the loss scale must be positive and finite, got initial_scale {scale}"
            ));
        }
        if let LossScale::Dynamic {
            growth_steps: 0, ..
        } = mode
        {
            return bad("dynamic_growth_steps must be at least 1, got 0".into());
        }
        Ok(LossScaleOptimizer {
            inner,
            mode,
            scale,
            good_steps: 0,
            replica_gradients: Default::default(),
        })
    }
    /// The current scale (`loss_scale`).
    pub fn current_loss_scale(&self) -> f64 {
        self.scale
    }
    /// How the scale moves (`dynamic`, `initial_scale`, `dynamic_growth_steps`).
    pub fn mode(&self) -> LossScale {
        self.mode
    }
    /// Consecutive finite steps since the last change (TF's `good_steps`; checkpointed).
    pub fn good_steps(&self) -> u32 {
        self.good_steps
    }
    /// Restores the scale state from a checkpoint.
    pub fn set_state(&mut self, scale: f64, good_steps: u32) {
        self.scale = scale;
        self.good_steps = good_steps;
    }
    /// The wrapped optimizer's checkpoint weights plus `current_loss_scale` and `good_steps`.
    pub fn weights(&self) -> Result<Vec<(String, Tensor)>> {
        let mut w = self.inner.core().weights()?;
        w.push(("current_loss_scale".into(), Tensor::scalar(self.scale)?));
        w.push(("good_steps".into(), Tensor::scalar(self.good_steps as i64)?));
        Ok(w)
    }
    /// Restores [`LossScaleOptimizer::weights`].
    pub fn set_weights(&mut self, weights: Vec<(String, Tensor)>) -> Result<()> {
        let mut rest = vec![];
        for (name, value) in weights {
            match name.as_str() {
                "current_loss_scale" => {
                    self.scale = value.cast(ferroflow_tensor::DType::F64)?.item::<f64>()?
                }
                "good_steps" => {
                    self.good_steps = value
                        .cast(ferroflow_tensor::DType::I64)?
                        .item::<i64>()?
                        .max(0) as u32
                }
                _ => rest.push((name, value)),
            }
        }
        self.inner.core_mut().set_weights(rest)
    }
    /// `loss · scale` (`get_scaled_loss`), for custom training loops.
    ///
    /// Refused inside a traced function: the scale of the trace would stay in the graph
    /// while the optimizer's moves (use [`SharedOptimizer::get_scaled_loss`](crate::SharedOptimizer::get_scaled_loss)).
    pub fn get_scaled_loss(&self, loss: &Tensor) -> Result<Tensor> {
        refuse_scale_while_tracing("get_scaled_loss")?;
        loss.mul(&loss.scalar_like(self.scale)?)
    }
    /// `g / scale` for each gradient (`get_unscaled_gradients`).
    pub fn get_unscaled_gradients(
        &self,
        grads: Vec<Option<Tensor>>,
    ) -> Result<Vec<Option<Tensor>>> {
        refuse_scale_while_tracing("get_unscaled_gradients")?;
        grads
            .into_iter()
            .map(|g| g.map(|g| g.div(&g.scalar_like(self.scale)?)).transpose())
            .collect()
    }
}

/// The loss scale read on the host would be baked into a traced graph.
fn refuse_scale_while_tracing(op: &'static str) -> Result<()> {
    ferroflow_tensor::dispatch::refuse_while_tracing(
        op,
        "the loss scale changes between steps and a graph would keep the traced one; share \
         the optimizer (`SharedOptimizer::new(opt)`) and use its `get_scaled_loss` / \
         `get_unscaled_gradients`, which read the scale on every call, or pass the scale \
         in as an argument",
    )
}

fn all_finite(pairs: &[(Option<Tensor>, Variable)]) -> Result<bool> {
    for (g, _) in pairs {
        if let Some(g) = g {
            if !g
                .is_finite()?
                .reduce_all(Axes::All, false)?
                .item::<bool>()?
            {
                return Ok(false);
            }
        }
    }
    Ok(true)
}

impl Optimizer for LossScaleOptimizer {
    fn core(&self) -> &OptimizerCore {
        self.inner.core()
    }
    fn core_mut(&mut self) -> &mut OptimizerCore {
        self.inner.core_mut()
    }
    fn name(&self) -> &'static str {
        "LossScaleOptimizer"
    }
    fn loss_scale(&self) -> Option<f64> {
        Some(self.scale)
    }
    fn inner_optimizer(&self) -> Option<&dyn Optimizer> {
        Some(self.inner.as_ref())
    }
    fn loss_scale_mode(&self) -> Option<LossScale> {
        Some(self.mode)
    }
    fn get_weights(&self) -> Result<Vec<(String, Tensor)>> {
        LossScaleOptimizer::weights(self)
    }
    fn set_weights(&mut self, weights: Vec<(String, Tensor)>) -> Result<()> {
        LossScaleOptimizer::set_weights(self, weights)
    }
    fn learning_rate(&self) -> &crate::schedule::Hyper {
        self.inner.learning_rate()
    }
    fn set_learning_rate(&mut self, learning_rate: crate::schedule::Hyper) {
        self.inner.set_learning_rate(learning_rate);
    }
    fn hyperparameters(&self) -> Vec<(&'static str, crate::schedule::Hyper)> {
        let mut h = self.inner.hyperparameters();
        h.push(("loss_scale", crate::schedule::Hyper::Const(self.scale)));
        h
    }
    fn update(&mut self, grad: &Tensor, var: &Variable, t: i64) -> Result<()> {
        self.inner.update(grad, var, t)
    }
    /// Takes unscaled gradients. Under a dynamic scale: applies them when all are finite,
    /// otherwise skips the update (iterations still advance) and halves the scale. Under a
    /// fixed scale every step is applied (TF 2.4: a non-finite gradient reaches the
    /// variables).
    fn apply_gradients(
        &mut self,
        grads_and_vars: Vec<(Option<Tensor>, Variable)>,
        aggregate: bool,
    ) -> Result<()> {
        crate::optimizer::refuse_inside_function()?;
        // Under a strategy: the finiteness check and the scale see all replicas' gradients.
        let custom = self.inner.core().gradient_aggregator.is_some();
        let Some((grads_and_vars, gathered)) =
            self.replica_gradients
                .gather(grads_and_vars, aggregate, !custom)?
        else {
            return Ok(());
        };
        let _cross_replica = ferroflow_tensor::distribution::cross_replica_scope();
        let aggregate = aggregate && (!gathered || custom);
        let LossScale::Dynamic { growth_steps, .. } = self.mode else {
            return self.inner.apply_gradients(grads_and_vars, aggregate);
        };
        if !all_finite(&grads_and_vars)? {
            self.scale = (self.scale / 2.0).max(1.0);
            self.good_steps = 0;
            self.inner.core_mut().iterations += 1;
            return Ok(());
        }
        self.inner.apply_gradients(grads_and_vars, aggregate)?;
        self.good_steps += 1;
        if self.good_steps >= growth_steps {
            let doubled = self.scale * 2.0;
            if doubled.is_finite() {
                self.scale = doubled;
            }
            self.good_steps = 0;
        }
        Ok(())
    }
    /// Scales the loss, differentiates, unscales, then applies (or skips) as above.
    fn minimize(
        &mut self,
        loss: &Tensor,
        var_list: &[Variable],
        tape: &GradientTape,
    ) -> Result<()> {
        // The scaled loss must be on the tape: record it before taking the gradient.
        let scaled = self.get_scaled_loss(loss)?;
        let sources: Vec<Source> = var_list.iter().map(Source::from).collect();
        let grads = self.get_unscaled_gradients(tape.gradient(&scaled, &sources)?)?;
        self.apply_gradients(
            grads.into_iter().zip(var_list.iter().cloned()).collect(),
            true,
        )
    }
}
