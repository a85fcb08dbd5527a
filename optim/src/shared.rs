//! An optimizer with shared ownership: the form graph functions (and anything else that
//! needs the same optimizer from several places) hold.

use crate::optimizer::Optimizer;
use ferroflow_autodiff::{GradientTape, Source};
use ferroflow_tensor::dispatch::HostCall;
use ferroflow_tensor::{DType, Device, Error, Result, Tensor, Variable};
use std::sync::{Arc, Mutex, MutexGuard};

/// An optimizer behind shared ownership, as TF's optimizer object is: clones are handles to
/// the same optimizer, and its `apply_gradients`, `minimize` and loss-scale methods take
/// `&self`, so a graph function's closure can use it.
///
/// Inside a traced function (`ferroflow_function::Function`), `apply_gradients` is one host
/// step of the graph (a [`HostCall`], TF's `numpy_function`): every call of the function
/// applies the gradients that call computed, with that step's counter, schedules, clipping
/// and loss scale, running the same update as eagerly, so results equal eager steps bit for
/// bit. The loss scale of a [`LossScaleOptimizer`](crate::LossScaleOptimizer) enters the
/// graph the same way ([`SharedOptimizer::get_scaled_loss`]), read anew on every call. A plain
/// `&mut` optimizer refuses to be stepped while tracing, since a graph cannot call it again.
///
/// Do not hold [`SharedOptimizer::lock`]'s guard while calling the other methods (they lock
/// it themselves).
///
/// ```
/// ferroflow::init();
/// use ferroflow::autodiff::{GradientTape, Source};
/// use ferroflow::function::Function;
/// use ferroflow::optim::{Adam, SharedOptimizer};
/// use ferroflow::{Axes, Tensor, Variable};
/// let w = Variable::new("w", Tensor::scalar(2.0f32)?);
/// let opt = SharedOptimizer::new(Adam::new(0.1));
/// let step = Function::new(|_: &[Tensor]| {
///     let tape = GradientTape::new();
///     let loss = w.value().square()?; // minimum at 0
///     opt.minimize(&loss, &[w.clone()], &tape)?;
///     Ok(vec![loss])
/// });
/// for _ in 0..100 {
///     step.call(&[])?; // traced on the first call, replayed after
/// }
/// assert_eq!(opt.iterations(), 100);
/// assert!(w.peek().item::<f32>()?.abs() < 0.1);
/// # Ok::<(), ferroflow::Error>(())
/// ```
#[derive(Clone)]
pub struct SharedOptimizer(Arc<Mutex<Box<dyn Optimizer>>>);

impl SharedOptimizer {
    /// Shares `optimizer`.
    pub fn new(optimizer: impl Optimizer + 'static) -> SharedOptimizer {
        SharedOptimizer::from_box(Box::new(optimizer))
    }

    /// Shares an optimizer already boxed (as `from_config` and Keras hold them).
    pub fn from_box(optimizer: Box<dyn Optimizer>) -> SharedOptimizer {
        SharedOptimizer(Arc::new(Mutex::new(optimizer)))
    }

    /// The optimizer, locked: its configuration, slots and checkpoint weights. Drop the
    /// guard before calling the other methods.
    pub fn lock(&self) -> MutexGuard<'_, Box<dyn Optimizer>> {
        self.0.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Steps applied so far (TF's `iterations`).
    pub fn iterations(&self) -> i64 {
        self.lock().iterations()
    }

    /// [`Optimizer::apply_gradients`]; inside a traced function, a host step of its graph
    /// that applies each call's gradients (see the type's docs).
    pub fn apply_gradients(
        &self,
        grads_and_vars: Vec<(Option<Tensor>, Variable)>,
        aggregate: bool,
    ) -> Result<()> {
        let name = format!("{}/apply_gradients", self.lock().name());
        let present: Vec<bool> = grads_and_vars.iter().map(|(g, _)| g.is_some()).collect();
        let (grads, vars): (Vec<Option<Tensor>>, Vec<Variable>) =
            grads_and_vars.into_iter().unzip();
        let grads: Vec<Tensor> = grads.into_iter().flatten().collect();
        let optimizer = self.clone();
        let step = HostCall::new(name, move |grads: &[Tensor]| {
            if grads.len() != present.iter().filter(|p| **p).count() {
                return Err(Error::invalid(
                    "apply_gradients",
                    format!(
                        "the step was traced with {} gradients and is called with {}",
                        present.iter().filter(|p| **p).count(),
                        grads.len()
                    ),
                ));
            }
            let mut grads = grads.iter().cloned();
            let pairs = present
                .iter()
                .zip(&vars)
                .map(|(p, v)| (if *p { grads.next() } else { None }, v.clone()))
                .collect();
            optimizer.lock().apply_gradients(pairs, aggregate)?;
            Ok(vec![])
        });
        step.call(&grads).map(|_| ())
    }

    /// [`Optimizer::minimize`]: the gradients of `loss` (recorded by `tape`) for `var_list`,
    /// then [`SharedOptimizer::apply_gradients`]. A loss-scaling optimizer's loss is scaled
    /// on the tape and its gradients unscaled, as its own `minimize` does.
    pub fn minimize(
        &self,
        loss: &Tensor,
        var_list: &[Variable],
        tape: &GradientTape,
    ) -> Result<()> {
        let sources: Vec<Source> = var_list.iter().map(Source::from).collect();
        let scaled = self.get_scaled_loss(loss)?;
        let grads = self.get_unscaled_gradients(tape.gradient(&scaled, &sources)?)?;
        self.apply_gradients(
            grads.into_iter().zip(var_list.iter().cloned()).collect(),
            true,
        )
    }

    /// The current loss scale as a scalar tensor of `loss`'s dtype on its device, or
    /// `None` when the optimizer does not scale losses; inside a traced function it is read
    /// from the optimizer on every call (a [`HostCall`] without inputs), so the graph
    /// follows a dynamic scale.
    pub fn loss_scale_of(&self, loss: &Tensor) -> Result<Option<Tensor>> {
        if self.lock().loss_scale().is_none() {
            return Ok(None);
        }
        let optimizer = self.clone();
        let like = loss.scalar_like(1.0)?;
        let read = HostCall::new("loss_scale", move |_: &[Tensor]| {
            let scale = optimizer.lock().loss_scale().ok_or_else(|| {
                Error::invalid("loss_scale", "the optimizer no longer scales losses")
            })?;
            Ok(vec![like.scalar_like(scale)?])
        });
        Ok(read.call(&[])?.pop())
    }

    /// `loss · scale` (TF's `LossScaleOptimizer.get_scaled_loss`); `loss` unchanged when
    /// the optimizer does not scale losses.
    pub fn get_scaled_loss(&self, loss: &Tensor) -> Result<Tensor> {
        match self.loss_scale_of(loss)? {
            Some(scale) => loss.mul(&scale),
            None => Ok(loss.clone()),
        }
    }

    /// `g / scale` for each gradient (TF's `get_unscaled_gradients`); unchanged when the
    /// optimizer does not scale losses.
    pub fn get_unscaled_gradients(
        &self,
        grads: Vec<Option<Tensor>>,
    ) -> Result<Vec<Option<Tensor>>> {
        if self.lock().loss_scale().is_none() {
            return Ok(grads);
        }
        // One read per dtype and device, each rounded once from the scale (as eagerly).
        let mut scales: Vec<(DType, Device, Tensor)> = vec![];
        grads
            .into_iter()
            .map(|g| {
                g.map(|g| {
                    let known = scales
                        .iter()
                        .find(|(d, dev, _)| *d == g.dtype() && *dev == g.device());
                    let scale = match known {
                        Some((_, _, s)) => s.clone(),
                        None => {
                            let s = self.loss_scale_of(&g)?.ok_or_else(|| {
                                Error::invalid("get_unscaled_gradients", "no loss scale")
                            })?;
                            scales.push((g.dtype(), g.device(), s.clone()));
                            s
                        }
                    };
                    g.div(&scale)
                })
                .transpose()
            })
            .collect()
    }
}

impl std::fmt::Debug for SharedOptimizer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self.0.try_lock() {
            Ok(o) => write!(
                f,
                "SharedOptimizer({}, iterations {})",
                o.name(),
                o.iterations()
            ),
            Err(_) => write!(f, "SharedOptimizer(locked)"),
        }
    }
}
