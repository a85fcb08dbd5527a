//! The TF 2.4 optimizer pipeline: `minimize` → `apply_gradients` → aggregator → clipvalue /
//! clipnorm / global_clipnorm, or the user's gradient transformers → per-variable update.

use crate::dtype_scalar::DtypeScalar;
use crate::schedule::Hyper;
use ferroflow_autodiff::{GradientTape, Source};
use ferroflow_tensor::distribution::{
    cross_replica_scope, replica_context, LocalDeviceGroup, ReduceOp, RemoteUpdate,
};
use ferroflow_tensor::{
    device_has_fused, Axes, DType, Error, FusedKernel, Result, Tensor, UpdateRule, Variable,
};
use std::collections::HashMap;
use std::sync::{Arc, Mutex};

/// A list of (gradient, variable) pairs in, the same out: the shape of TF 2.4's
/// `gradient_aggregator` and `gradient_transformers`.
pub type GradientTransformer =
    Arc<dyn Fn(Vec<(Tensor, Variable)>) -> Result<Vec<(Tensor, Variable)>> + Send + Sync>;

/// State every optimizer shares: step counter, slots, and the pipeline's options.
#[derive(Default)]
pub struct OptimizerCore {
    /// Steps applied (TF's `iterations`).
    pub iterations: i64,
    /// Slot variables, keyed by (variable id, slot name).
    slots: HashMap<(u64, &'static str), Variable>,
    /// Clip each gradient element to `[-v, v]`.
    pub clipvalue: Option<f64>,
    /// Clip each gradient to this L2 norm.
    pub clipnorm: Option<f64>,
    /// Clip all gradients together to this global L2 norm.
    pub global_clipnorm: Option<f64>,
    /// User transformers, run after aggregation (TF 2.4 refuses them together with a clip
    /// option: use a transformer that clips).
    pub gradient_transformers: Vec<GradientTransformer>,
    /// TF 2.4's legacy `decay`: the learning rate of step `t` (from 0) is
    /// `lr / (1 + decay · t)` (time-based decay, computed in the variable's dtype). 0 turns
    /// it off; [`Nadam`](crate::Nadam) keeps its own `schedule_decay` instead, as TF 2.4's
    /// does.
    pub decay: f64,
    /// Cross-replica aggregation; `None` is the identity (no distribution strategy).
    pub gradient_aggregator: Option<GradientTransformer>,
    /// Restored slot values waiting for their slot to be created (TF's deferred restore).
    pending: HashMap<String, Tensor>,
    /// Run updates as chains of primitives even where the backend has a fused
    /// `optimizer_update` kernel (for comparisons; both paths give the same numbers).
    pub compose_updates: bool,
    /// Gradients of the local replicas of the step in progress under a strategy.
    pub replica_gradients: ReplicaGradients,
    /// Fused updates deferred while [`Optimizer::apply_gradients`] runs each variable's
    /// rule, applied together at its end (`None` outside it: updates apply at once).
    deferred: Mutex<Option<Vec<DeferredUpdate>>>,
}

/// One variable's fused update, waiting to be applied with the others of its step.
struct DeferredUpdate {
    rule: UpdateRule,
    var: Variable,
    g: Tensor,
    slots: Vec<Variable>,
}

/// Applies deferred fused updates: those of one rule, device and dtype as one
/// [`Tensor::optimizer_update_group`] (one kernel for a model's variables where the backend
/// can), in the order they were deferred.
fn apply_deferred(updates: Vec<DeferredUpdate>) -> Result<()> {
    let mut groups: Vec<Vec<DeferredUpdate>> = vec![];
    for u in updates {
        let key = |d: &DeferredUpdate| (d.rule, d.g.device(), d.g.dtype());
        match groups.iter_mut().find(|grp| key(&grp[0]) == key(&u)) {
            Some(grp) => grp.push(u),
            None => groups.push(vec![u]),
        }
    }
    for group in groups {
        let rule = group[0].rule;
        let operands: Vec<(Tensor, Tensor, Vec<Tensor>)> = group
            .iter()
            .map(|d| {
                let slots = d.slots.iter().map(|s| s.peek()).collect();
                (d.var.peek(), d.g.clone(), slots)
            })
            .collect();
        let updated = match operands.as_slice() {
            [(w, g, slots)] => vec![Tensor::optimizer_update(&rule, w, g, slots)?],
            _ => Tensor::optimizer_update_group(&rule, &operands)?,
        };
        for (d, (w, slots)) in group.iter().zip(updated) {
            for (slot, v) in d.slots.iter().zip(slots) {
                slot.assign(&v)?;
            }
            d.var.assign(&w)?;
        }
    }
    Ok(())
}

/// Gradients paired with their variables, as `apply_gradients` takes them (`None`: the
/// variable got no gradient).
pub type GradsAndVars = Vec<(Option<Tensor>, Variable)>;

/// The gradients the local replicas of one step pass to `apply_gradients` under a
/// distribution strategy, gathered until the last replica (TF's `merge_call`: replicas run
/// one after another here, and the update applies once, when all have handed theirs in).
#[derive(Default)]
pub struct ReplicaGradients {
    parts: Vec<GradsAndVars>,
}

impl ReplicaGradients {
    /// Outside a replica's step: `Some(grads, false)`, unchanged. In one: keeps the
    /// replica's gradients and returns `None` until the last local replica, which gets the
    /// gradients of all replicas: with `aggregate`, summed over the local replicas and then
    /// (unless `cross_worker` is false: a custom `gradient_aggregator` does that part) over
    /// the workers, on each variable's device, and `true`; without, its own (TF: they are
    /// already aggregated) and `false`.
    pub fn gather(
        &mut self,
        grads_and_vars: Vec<(Option<Tensor>, Variable)>,
        aggregate: bool,
        cross_worker: bool,
    ) -> Result<Option<(GradsAndVars, bool)>> {
        let Some(r) = replica_context() else {
            return Ok(Some((grads_and_vars, false)));
        };
        if !aggregate {
            self.parts.clear();
            return Ok(r.is_last_local().then_some((grads_and_vars, false)));
        }
        if self.parts.len() != r.local_replica {
            let handed = self.parts.len();
            self.parts.clear();
            return Err(Error::invalid(
                "apply_gradients",
                format!(
                    "replica {} handed in its gradients after {handed} replica(s) of this step; \
                     every replica must call apply_gradients once per step, in order",
                    r.local_replica
                ),
            ));
        }
        self.parts.push(grads_and_vars);
        if !r.is_last_local() {
            return Ok(None);
        }
        let parts = std::mem::take(&mut self.parts);
        let mut summed = match &r.cross_device {
            Some(group) if parts.len() > 1 => combine_local_through(group.as_ref(), parts)?,
            _ => combine_local(parts)?,
        };
        if let (true, Some(cross)) = (cross_worker, &r.cross_worker) {
            let present: Vec<usize> = (0..summed.len())
                .filter(|&i| summed[i].0.is_some())
                .collect();
            let tensors = present
                .iter()
                .filter_map(|&i| summed[i].0.clone())
                .collect();
            let reduced = cross.all_reduce_sum(tensors)?;
            for (i, g) in present.into_iter().zip(reduced) {
                summed[i].0 = Some(g);
            }
        }
        Ok(Some((summed, true)))
    }
}

/// That every replica passed gradients for the same variables, in the same order, each
/// with a gradient on every replica or on none.
fn check_replica_parts(parts: &[GradsAndVars]) -> Result<()> {
    let Some(first) = parts.first() else {
        return Ok(());
    };
    for (r, part) in parts.iter().enumerate().skip(1) {
        if part.len() != first.len() {
            return Err(Error::invalid(
                "apply_gradients",
                format!(
                    "replica {r} passed {} gradients, replica 0 passed {}",
                    part.len(),
                    first.len()
                ),
            ));
        }
        for ((g0, var), (g, v)) in first.iter().zip(part) {
            if var.id() != v.id() {
                return Err(Error::invalid(
                    "apply_gradients",
                    format!(
                        "replica {r} passed a gradient for {:?} where replica 0 passed one for {:?}",
                        v.name(),
                        var.name()
                    ),
                ));
            }
            if g0.is_some() != g.is_some() {
                return Err(Error::invalid(
                    "apply_gradients",
                    format!(
                        "variable {:?} has a gradient on some replicas only",
                        var.name()
                    ),
                ));
            }
        }
    }
    Ok(())
}

/// `t` on `device` (itself when it is there).
fn on_device(t: Tensor, device: ferroflow_tensor::Device) -> Result<Tensor> {
    if t.device() == device {
        Ok(t)
    } else {
        t.to_device(device)
    }
}

/// The local replicas' gradients summed per variable, on the variable's device.
fn combine_local(parts: Vec<GradsAndVars>) -> Result<GradsAndVars> {
    check_replica_parts(&parts)?;
    let mut parts = parts.into_iter();
    let mut total = parts.next().unwrap_or_default();
    for part in parts {
        for ((acc, var), (g, _)) in total.iter_mut().zip(part) {
            if let (Some(a), Some(g)) = (acc.take(), g) {
                let device = var.peek().device();
                *acc = Some(on_device(a, device)?.add(&on_device(g, device)?)?);
            }
        }
    }
    for (g, var) in total.iter_mut() {
        if let Some(t) = g.take() {
            *g = Some(on_device(t, var.peek().device())?);
        }
    }
    Ok(total)
}

/// The local replicas' gradients summed by the strategy's device group (MirroredStrategy's
/// `NcclAllReduce`: one all-reduce across the replicas' devices), each variable's sum taken
/// from the result on its own device.
fn combine_local_through(
    group: &dyn LocalDeviceGroup,
    parts: Vec<GradsAndVars>,
) -> Result<GradsAndVars> {
    check_replica_parts(&parts)?;
    let devices = group.devices();
    if devices.len() != parts.len() {
        return Err(Error::invalid(
            "apply_gradients",
            format!(
                "{} replicas handed in gradients for a device group of {}",
                parts.len(),
                devices.len()
            ),
        ));
    }
    let present: Vec<usize> = parts
        .first()
        .map(|p| (0..p.len()).filter(|&i| p[i].0.is_some()).collect())
        .unwrap_or_default();
    let per_device = parts
        .iter()
        .zip(&devices)
        .map(|(part, &device)| {
            present
                .iter()
                .filter_map(|&i| part[i].0.clone())
                .map(|g| on_device(g, device))
                .collect::<Result<Vec<_>>>()
        })
        .collect::<Result<Vec<_>>>()?;
    let sums = group.all_reduce(&per_device, ReduceOp::Sum)?;
    let mut total = parts.into_iter().next().unwrap_or_default();
    for (k, &i) in present.iter().enumerate() {
        let device = total[i].1.peek().device();
        let replica = devices.iter().position(|&d| d == device).unwrap_or(0);
        let sum = sums
            .get(replica)
            .and_then(|s| s.get(k))
            .cloned()
            .ok_or_else(|| {
                Error::invalid("apply_gradients", "the device group returned too few sums")
            })?;
        total[i].0 = Some(on_device(sum, device)?);
    }
    Ok(total)
}

impl OptimizerCore {
    /// The slot `name` of `var`, created from `init` on first use (`add_slot`).
    pub fn slot(
        &mut self,
        var: &Variable,
        name: &'static str,
        init: impl FnOnce() -> Result<Tensor>,
    ) -> Result<Variable> {
        if let Some(v) = self.slots.get(&(var.id(), name)) {
            return Ok(v.clone());
        }
        let full = format!("{}/{name}", var.name());
        let value = match self.pending.remove(&full) {
            Some(restored) => {
                let fresh = init()?;
                if restored.shape() != fresh.shape() || restored.dtype() != fresh.dtype() {
                    return Err(Error::invalid(
                        "set_weights",
                        format!(
                            "slot {full:?} was saved as {:?} {}, the variable needs {:?} {}",
                            restored.shape(),
                            restored.dtype(),
                            fresh.shape(),
                            fresh.dtype()
                        ),
                    ));
                }
                restored
            }
            None => init()?,
        };
        let v = Variable::new_slot(var, name, value);
        self.slots.insert((var.id(), name), v.clone());
        Ok(v)
    }
    /// Everything a checkpoint must hold to resume bit-identically: `iter` (the step count,
    /// int64) and every slot by its name (`<variable>/<slot>`), sorted by name.
    pub fn weights(&self) -> Result<Vec<(String, Tensor)>> {
        let mut out = vec![("iter".to_string(), Tensor::scalar(self.iterations)?)];
        let mut slots: Vec<(String, Tensor)> = self
            .slots
            .values()
            .map(|v| (v.name().to_string(), v.peek()))
            .collect();
        slots.sort_by(|a, b| a.0.cmp(&b.0));
        out.extend(slots);
        Ok(out)
    }
    /// Restores [`OptimizerCore::weights`]; slots not created yet are filled when they are.
    pub fn set_weights(&mut self, weights: Vec<(String, Tensor)>) -> Result<()> {
        for (name, value) in weights {
            if name == "iter" {
                self.iterations = value.cast(ferroflow_tensor::DType::I64)?.item::<i64>()?;
                continue;
            }
            match self.slots.values().find(|v| v.name() == name) {
                Some(v) => v.assign(&value)?,
                None => {
                    self.pending.insert(name, value);
                }
            }
        }
        Ok(())
    }
    /// TF 2.4's checks of the pipeline's options: `decay` ≥ 0, clip thresholds ≥ 0, not
    /// both `clipnorm` and `global_clipnorm`, and no clip option beside
    /// `gradient_transformers`. `apply_gradients` calls it before touching anything.
    pub fn check_options(&self) -> Result<()> {
        let bad = |msg: String| Err(Error::invalid("apply_gradients", msg));
        if !(self.decay >= 0.0 && self.decay.is_finite()) {
            return bad(format!(
                "decay cannot be less than 0 (or non-finite): {}",
                self.decay
            ));
        }
        let clips = [
            ("clipvalue", self.clipvalue),
            ("clipnorm", self.clipnorm),
            ("global_clipnorm", self.global_clipnorm),
        ];
        for (name, value) in clips {
            if let Some(v) = value {
                if v.is_nan() || v < 0.0 {
                    return bad(format!("`{name}` must be a number ≥ 0, got {v}"));
                }
                if !self.gradient_transformers.is_empty() {
                    return bad(format!(
                        "`{name}` cannot be set when `gradient_transformers` is set; use the \
                         `gradient_transformers` to specify clipping and other transformations \
                         (TF 2.4 refuses both)"
                    ));
                }
            }
        }
        if self.clipnorm.is_some() && self.global_clipnorm.is_some() {
            return bad(format!(
                "cannot accept both `clipnorm` and `global_clipnorm`, passed clipnorm {:?}, \
                 global_clipnorm {:?}",
                self.clipnorm, self.global_clipnorm
            ));
        }
        Ok(())
    }
    /// A hyperparameter's value at this step in `dtype` (TF's `_get_hyper(name, var_dtype)`).
    pub(crate) fn hyper(&self, h: &Hyper, dtype: DType) -> DtypeScalar {
        DtypeScalar::new(h.at(self.iterations), dtype)
    }
    /// The learning rate of this step in `dtype`, with the legacy `decay` (TF 2.4's
    /// `_decayed_lr`: `lr / (1 + decay · iterations)`).
    pub(crate) fn decayed_lr(&self, lr: &Hyper, dtype: DType) -> DtypeScalar {
        let lr_t = self.hyper(lr, dtype);
        if self.decay > 0.0 {
            lr_t / (1.0 + DtypeScalar::new(self.decay, dtype) * self.iterations as f64)
        } else {
            lr_t
        }
    }
    /// An existing slot (`get_slot`), by TF's slot name (`"m"`, `"momentum"`, ...).
    pub fn get_slot(&self, var: &Variable, name: &str) -> Option<Variable> {
        self.slots
            .iter()
            .find(|((id, n), _)| *id == var.id() && *n == name)
            .map(|(_, v)| v.clone())
    }
    /// Starts (`Some(vec![])`) or ends (`None`) deferring fused updates, returning what
    /// was deferred.
    fn set_deferred(&self, to: Option<Vec<DeferredUpdate>>) -> Option<Vec<DeferredUpdate>> {
        let mut deferred = self.deferred.lock().unwrap_or_else(|e| e.into_inner());
        std::mem::replace(&mut *deferred, to)
    }
    /// The names of the slots created so far, sorted (`get_slot_names`).
    pub fn get_slot_names(&self) -> Vec<&'static str> {
        let mut names: Vec<&'static str> = self.slots.keys().map(|(_, n)| *n).collect();
        names.sort_unstable();
        names.dedup();
        names
    }
}

/// An optimizer: a per-variable update rule on top of the shared TF 2.4 pipeline.
pub trait Optimizer: Send {
    /// The shared state.
    fn core(&self) -> &OptimizerCore;
    /// The shared state, mutably.
    fn core_mut(&mut self) -> &mut OptimizerCore;
    /// TF's class name (`"Adam"`).
    fn name(&self) -> &'static str;
    /// Applies one update to `var` at 1-based step `t`.
    fn update(&mut self, grad: &Tensor, var: &Variable, t: i64) -> Result<()>;
    /// Hyperparameters by TF name, each a constant or a schedule of the step (`get_config`).
    fn hyperparameters(&self) -> Vec<(&'static str, Hyper)>;
    /// The learning rate as given (constant or schedule).
    fn learning_rate(&self) -> &Hyper;
    /// Replaces the learning rate (Keras callbacks such as `ReduceLROnPlateau` do this).
    fn set_learning_rate(&mut self, learning_rate: Hyper);

    /// The current loss scale when this optimizer scales losses (a
    /// [`LossScaleOptimizer`](crate::LossScaleOptimizer)): a training step multiplies the loss
    /// by it under the tape and divides the gradients by it before `apply_gradients`, as
    /// Keras' `train_step` does. `None` for every other optimizer.
    fn loss_scale(&self) -> Option<f64> {
        None
    }
    /// The optimizer a wrapper (a [`LossScaleOptimizer`](crate::LossScaleOptimizer))
    /// delegates to; `None` for a plain optimizer.
    fn inner_optimizer(&self) -> Option<&dyn Optimizer> {
        None
    }
    /// How a wrapper's loss scale moves; `None` for an optimizer that does not scale losses.
    fn loss_scale_mode(&self) -> Option<crate::LossScale> {
        None
    }
    /// Everything a checkpoint needs to resume bit-identically (Keras' optimizer
    /// `get_weights`): the step count and every slot, by name.
    fn get_weights(&self) -> Result<Vec<(String, Tensor)>> {
        self.core().weights()
    }
    /// Restores [`Optimizer::get_weights`]; slots of variables not seen yet are filled when
    /// they are created.
    fn set_weights(&mut self, weights: Vec<(String, Tensor)>) -> Result<()> {
        self.core_mut().set_weights(weights)
    }
    /// Steps applied so far.
    fn iterations(&self) -> i64 {
        self.core().iterations
    }
    /// The slot `name` of `var` once created (TF's `get_slot(var, "m")`).
    fn get_slot(&self, var: &Variable, name: &str) -> Option<Variable> {
        self.core().get_slot(var, name)
    }
    /// The names of the slots this optimizer has created (TF's `get_slot_names()`).
    fn get_slot_names(&self) -> Vec<&'static str> {
        self.core().get_slot_names()
    }

    /// TF 2.4's `apply_gradients(grads_and_vars, experimental_aggregate_gradients)`.
    /// `None` gradients are skipped with a warning; a gradient whose shape or dtype does not
    /// match its variable is an error naming the variable, and nothing is updated.
    ///
    /// Called in a replica's step under a distribution strategy, the replicas' gradients
    /// are gathered ([`ReplicaGradients`]) and the update applies once, at the last local
    /// replica, with the gradients summed over all replicas (TF's default aggregator:
    /// the loss of each replica is scaled by the global batch).
    fn apply_gradients(
        &mut self,
        grads_and_vars: Vec<(Option<Tensor>, Variable)>,
        aggregate: bool,
    ) -> Result<()> {
        // The profiler names the update's ops `<Optimizer>/...` (inert when not profiling).
        let _name_scope = ferroflow_tensor::trace::NameScope::enter(self.name());
        refuse_inside_function()?;
        self.core().check_options()?;
        let custom = self.core().gradient_aggregator.is_some();
        let Some((grads_and_vars, gathered)) =
            self.core_mut()
                .replica_gradients
                .gather(grads_and_vars, aggregate, !custom)?
        else {
            return Ok(());
        };
        let _cross_replica = cross_replica_scope();
        let mut pairs = Vec::with_capacity(grads_and_vars.len());
        let mut missing = vec![];
        for (g, v) in grads_and_vars {
            match g {
                Some(g) => {
                    let value = v.peek();
                    if g.shape() != value.shape() || g.dtype() != value.dtype() {
                        return Err(Error::invalid(
                            "apply_gradients",
                            format!(
                                "gradient {:?} {} does not match variable {:?} {:?} {}",
                                g.shape(),
                                g.dtype(),
                                v.name(),
                                value.shape(),
                                value.dtype()
                            ),
                        ));
                    }
                    pairs.push((g, v));
                }
                None => missing.push(v.name().to_string()),
            }
        }
        if !missing.is_empty() {
            eprintln!("WARNING: Gradients do not exist for variables {missing:?} when minimizing the loss.");
        }
        if aggregate && (!gathered || custom) {
            if let Some(agg) = self.core().gradient_aggregator.clone() {
                pairs = agg(pairs)?;
            }
        }
        // TF 2.4's `_transform_gradients`: the clip options, then the transformers (a
        // configuration has one or the other: `check_options`).
        pairs = clip(self.core(), pairs)?;
        for t in self.core().gradient_transformers.clone() {
            pairs = t(pairs)?;
        }
        let t = self.core().iterations + 1;
        // Fused updates wait and apply together (one kernel for many variables); a rule
        // that fails leaves every variable as it was.
        self.core().set_deferred(Some(vec![]));
        let ran = pairs.iter().try_for_each(|(g, v)| self.update(g, v, t));
        let deferred = self.core().set_deferred(None).unwrap_or_default();
        ran?;
        apply_deferred(deferred)?;
        self.core_mut().iterations = t;
        Ok(())
    }

    /// TF 2.4's `minimize(loss, var_list, tape)`: gradients of `loss` (computed under
    /// `tape`) for `var_list`, then [`Optimizer::apply_gradients`].
    fn minimize(
        &mut self,
        loss: &Tensor,
        var_list: &[Variable],
        tape: &GradientTape,
    ) -> Result<()> {
        let sources: Vec<Source> = var_list.iter().map(Source::from).collect();
        let grads = tape.gradient(loss, &sources)?;
        self.apply_gradients(
            grads.into_iter().zip(var_list.iter().cloned()).collect(),
            true,
        )
    }
}

/// `minimize` with the loss as a closure and the variables given lazily (TF accepts both):
/// runs `loss` under a fresh tape, then asks for `var_list` (so a model built by its first
/// call has its variables by then), then applies the gradients.
pub fn minimize_fn(
    opt: &mut dyn Optimizer,
    loss: impl FnOnce() -> Result<Tensor>,
    var_list: impl FnOnce() -> Vec<Variable>,
) -> Result<Tensor> {
    let tape = GradientTape::new();
    let value = loss()?;
    let vars = var_list();
    opt.minimize(&value, &vars, &tape)?;
    Ok(value)
}

fn clip(core: &OptimizerCore, pairs: Vec<(Tensor, Variable)>) -> Result<Vec<(Tensor, Variable)>> {
    let mut pairs = pairs;
    if let Some(c) = core.clipvalue {
        pairs = pairs
            .into_iter()
            .map(|(g, v)| Ok((g.clip_by_value(&g.scalar_like(-c)?, &g.scalar_like(c)?)?, v)))
            .collect::<Result<_>>()?;
    }
    if let Some(c) = core.clipnorm {
        pairs = pairs
            .into_iter()
            .map(|(g, v)| {
                let norm = g.square()?.reduce_sum(Axes::All, false)?.sqrt()?;
                Ok((scale_to_norm(&g, &norm, c)?, v))
            })
            .collect::<Result<_>>()?;
    }
    if let Some(c) = core.global_clipnorm {
        let mut total: Option<Tensor> = None;
        for (g, _) in &pairs {
            let s = g.square()?.reduce_sum(Axes::All, false)?;
            total = Some(match total {
                Some(t) => t.add(&s)?,
                None => s,
            });
        }
        if let Some(total) = total {
            let norm = total.sqrt()?;
            pairs = pairs
                .into_iter()
                .map(|(g, v)| Ok((scale_to_norm(&g, &norm.cast(g.dtype())?, c)?, v)))
                .collect::<Result<_>>()?;
        }
    }
    Ok(pairs)
}

/// `g · c / max(norm, c)`: unchanged when the norm is within `c` (tf.clip_by_norm).
fn scale_to_norm(g: &Tensor, norm: &Tensor, c: f64) -> Result<Tensor> {
    let cap = norm.scalar_like(c)?;
    g.mul(&cap)?.div(&norm.maximum(&cap)?)
}

/// The options every optimizer shares, as builder methods (TF's keyword arguments
/// `clipnorm=`, `clipvalue=`, `global_clipnorm=`, `decay=`, `gradient_transformers=`,
/// `gradient_aggregator=`), for any optimizer.
///
/// ```
/// ferroflow::init();
/// use ferroflow::optim::{Adam, Optimizer, OptimizerBuilder};
/// let adam = Adam::new(1e-3).beta_1(0.8).amsgrad(true).clipnorm(1.0);
/// assert_eq!(adam.core().clipnorm, Some(1.0));
/// # Ok::<(), ferroflow::Error>(())
/// ```
pub trait OptimizerBuilder: Optimizer + Sized {
    /// Clips each gradient to this L2 norm.
    fn clipnorm(mut self, clipnorm: f64) -> Self {
        self.core_mut().clipnorm = Some(clipnorm);
        self
    }
    /// Clips each gradient element to `[-clipvalue, clipvalue]`.
    fn clipvalue(mut self, clipvalue: f64) -> Self {
        self.core_mut().clipvalue = Some(clipvalue);
        self
    }
    /// Clips all gradients together to this global L2 norm.
    fn global_clipnorm(mut self, global_clipnorm: f64) -> Self {
        self.core_mut().global_clipnorm = Some(global_clipnorm);
        self
    }
    /// TF 2.4's legacy time-based decay: `lr / (1 + decay · iterations)`.
    fn decay(mut self, decay: f64) -> Self {
        self.core_mut().decay = decay;
        self
    }
    /// Appends a gradient transformer (run after aggregation; not together with a clip).
    fn gradient_transformer(mut self, transformer: GradientTransformer) -> Self {
        self.core_mut().gradient_transformers.push(transformer);
        self
    }
    /// Replaces the cross-replica gradient aggregator.
    fn gradient_aggregator(mut self, aggregator: GradientTransformer) -> Self {
        self.core_mut().gradient_aggregator = Some(aggregator);
        self
    }
}

impl<T: Optimizer + Sized> OptimizerBuilder for T {}

/// Builder methods for an optimizer's own hyperparameters (each a constant or a schedule)
/// and flags.
macro_rules! hyper_setters {
    ($ty:ident { $($field:ident),* } $(flags { $($flag:ident),* })?) => {
        impl $ty {
            $(
                #[doc = concat!("Sets `", stringify!($field), "` (a constant or a schedule).")]
                pub fn $field(mut self, value: impl Into<Hyper>) -> $ty {
                    self.$field = value.into();
                    self
                }
            )*
            $($(
                #[doc = concat!("Sets `", stringify!($flag), "`.")]
                pub fn $flag(mut self, on: bool) -> $ty {
                    self.$flag = on;
                    self
                }
            )*)?
        }
    };
}
pub(crate) use hyper_setters;

hyper_setters!(Sgd { momentum } flags { nesterov });
hyper_setters!(Adam { beta_1, beta_2, epsilon, weight_decay } flags { amsgrad });
hyper_setters!(RmsProp { rho, momentum, epsilon } flags { centered });
hyper_setters!(Adagrad { epsilon });

impl Adagrad {
    /// Sets the accumulators' starting value (TF's `initial_accumulator_value`).
    pub fn initial_accumulator_value(mut self, value: f64) -> Adagrad {
        self.initial_accumulator_value = value;
        self
    }
}

/// The accessors every optimizer implements the same way: its core state, its learning
/// rate and (given a literal) its TF class name.
macro_rules! core_impl {
    () => {
        fn core(&self) -> &OptimizerCore {
            &self.core
        }
        fn core_mut(&mut self) -> &mut OptimizerCore {
            &mut self.core
        }
        fn learning_rate(&self) -> &Hyper {
            &self.learning_rate
        }
        fn set_learning_rate(&mut self, learning_rate: Hyper) {
            self.learning_rate = learning_rate;
        }
    };
    ($name:literal) => {
        core_impl!();
        fn name(&self) -> &'static str {
            $name
        }
    };
}
pub(crate) use core_impl;

/// Runs `rule` through the backend's fused kernel, updating `var` and `slots`; `Ok(false)`
/// when the backend has none (or `compose_updates` is set), so the caller composes it.
pub(crate) fn try_fused(
    core: &OptimizerCore,
    rule: UpdateRule,
    var: &Variable,
    g: &Tensor,
    slots: &[&Variable],
) -> Result<bool> {
    if let Some(applied) = var.apply_remote_update(&RemoteUpdate::Rule(rule), g, slots) {
        return applied.map(|()| true);
    }
    let w = var.peek();
    if core.compose_updates
        || !device_has_fused(w.device(), FusedKernel::OptimizerUpdate, w.dtype())
    {
        return Ok(false);
    }
    let update = DeferredUpdate {
        rule,
        var: var.clone(),
        g: g.clone(),
        slots: slots.iter().map(|s| (*s).clone()).collect(),
    };
    let mut deferred = core.deferred.lock().unwrap_or_else(|e| e.into_inner());
    match deferred.as_mut() {
        // A variable given twice in one step is updated twice, in turn, as before.
        Some(list) if !list.iter().any(|d| d.var.id() == var.id()) => list.push(update),
        Some(list) => {
            let earlier = std::mem::take(list);
            drop(deferred);
            apply_deferred(earlier)?;
            apply_deferred(vec![update])?;
        }
        None => {
            drop(deferred);
            apply_deferred(vec![update])?;
        }
    }
    Ok(true)
}

/// Gradient descent with momentum (TF 2.4 `SGD`: learning_rate 0.01, momentum 0,
/// nesterov false): `v = m·v - lr·g; w += v` (nesterov: `w += m·v - lr·g`).
pub struct Sgd {
    core: OptimizerCore,
    /// Learning rate.
    pub learning_rate: Hyper,
    /// Momentum.
    pub momentum: Hyper,
    /// Nesterov momentum.
    pub nesterov: bool,
}

impl Sgd {
    /// SGD with TF's defaults except the learning rate.
    pub fn new(learning_rate: impl Into<Hyper>) -> Sgd {
        Sgd {
            core: OptimizerCore::default(),
            learning_rate: learning_rate.into(),
            momentum: Hyper::Const(0.0),
            nesterov: false,
        }
    }
    /// With momentum (and optionally Nesterov).
    pub fn with_momentum(mut self, momentum: impl Into<Hyper>, nesterov: bool) -> Sgd {
        self.momentum = momentum.into();
        self.nesterov = nesterov;
        self
    }
}

impl Optimizer for Sgd {
    core_impl!("SGD");
    fn hyperparameters(&self) -> Vec<(&'static str, Hyper)> {
        vec![
            ("learning_rate", self.learning_rate.clone()),
            ("momentum", self.momentum.clone()),
            ("nesterov", Hyper::Const(self.nesterov as u8 as f64)),
        ]
    }
    /// TF 2.4: `w -= g·lr` (`ResourceApplyGradientDescent`), or with momentum
    /// `a = a·m - g·lr; w += a` (nesterov: `w += a·m - g·lr`; `ResourceApplyKerasMomentum`).
    fn update(&mut self, g: &Tensor, var: &Variable, _t: i64) -> Result<()> {
        let dtype = var.dtype();
        let lr = self.core.decayed_lr(&self.learning_rate, dtype).get();
        // As TF: a momentum given as a schedule always keeps the velocity slot.
        let plain = matches!(self.momentum, Hyper::Const(m) if m == 0.0);
        if plain {
            if let Some(applied) =
                var.apply_remote_update(&RemoteUpdate::GradientDescent { lr }, g, &[])
            {
                return applied;
            }
        }
        let w = var.peek();
        let g_lr = g.mul(&g.scalar_like(lr)?)?;
        if plain {
            return var.assign(&w.sub(&g_lr)?);
        }
        let velocity = self.core.slot(var, "momentum", || w.zeros_like())?;
        let momentum = self.core.hyper(&self.momentum, dtype).get();
        let rule = UpdateRule::SgdMomentum {
            lr,
            momentum,
            nesterov: self.nesterov,
        };
        if try_fused(&self.core, rule, var, g, &[&velocity])? {
            return Ok(());
        }
        let m = g.scalar_like(momentum)?;
        let v = velocity.peek().mul(&m)?.sub(&g_lr)?;
        velocity.assign(&v)?;
        let step = if self.nesterov {
            v.mul(&m)?.sub(&g_lr)?
        } else {
            v
        };
        var.assign(&w.add(&step)?)
    }
}

/// Adam (TF 2.4: learning_rate 0.001, beta_1 0.9, beta_2 0.999, epsilon 1e-7, amsgrad
/// false): `m = β1 m + (1-β1) g; v = β2 v + (1-β2) g²;
/// w -= lr·√(1-β2^t)/(1-β1^t) · m / (√v̂ + ε)` with `v̂ = v` or, for AMSGrad, `max(v̂, v)`.
/// `weight_decay` > 0 gives AdamW (decoupled: `w -= lr·wd·w` before the Adam step).
pub struct Adam {
    core: OptimizerCore,
    /// Learning rate.
    pub learning_rate: Hyper,
    /// β1.
    pub beta_1: Hyper,
    /// β2.
    pub beta_2: Hyper,
    /// ε (added to √v̂, TF's "epsilon hat").
    pub epsilon: Hyper,
    /// AMSGrad variant.
    pub amsgrad: bool,
    /// Decoupled weight decay (AdamW); 0 for Adam.
    pub weight_decay: Hyper,
}

impl Adam {
    /// Adam with TF 2.4's defaults except the learning rate.
    pub fn new(learning_rate: impl Into<Hyper>) -> Adam {
        Adam {
            core: OptimizerCore::default(),
            learning_rate: learning_rate.into(),
            beta_1: Hyper::Const(0.9),
            beta_2: Hyper::Const(0.999),
            epsilon: Hyper::Const(1e-7),
            amsgrad: false,
            weight_decay: Hyper::Const(0.0),
        }
    }
    /// AdamW (Loshchilov & Hutter): Adam with decoupled weight decay.
    pub fn adamw(learning_rate: impl Into<Hyper>, weight_decay: impl Into<Hyper>) -> Adam {
        Adam {
            weight_decay: weight_decay.into(),
            ..Adam::new(learning_rate)
        }
    }
}

impl Optimizer for Adam {
    core_impl!();
    fn name(&self) -> &'static str {
        if self.weight_decay.at(self.core.iterations) > 0.0 {
            "AdamW"
        } else {
            "Adam"
        }
    }
    fn hyperparameters(&self) -> Vec<(&'static str, Hyper)> {
        vec![
            ("learning_rate", self.learning_rate.clone()),
            ("beta_1", self.beta_1.clone()),
            ("beta_2", self.beta_2.clone()),
            ("epsilon", self.epsilon.clone()),
            ("amsgrad", Hyper::Const(self.amsgrad as u8 as f64)),
            ("weight_decay", self.weight_decay.clone()),
        ]
    }
    /// TF 2.4 (`ResourceApplyAdam`, `...WithAmsgrad`): `α = lr·√(1-β2^t)/(1-β1^t)`,
    /// `m += (g - m)(1-β1); v += (g² - v)(1-β2); w -= m·α/(√v̂ + ε)`.
    fn update(&mut self, g: &Tensor, var: &Variable, t: i64) -> Result<()> {
        let dtype = var.dtype();
        let w = var.peek();
        let core = &self.core;
        let lr = core.decayed_lr(&self.learning_rate, dtype);
        let (b1, b2) = (
            core.hyper(&self.beta_1, dtype),
            core.hyper(&self.beta_2, dtype),
        );
        let epsilon = core.hyper(&self.epsilon, dtype).get();
        let weight_decay = self.weight_decay.at(core.iterations);
        let decay = (lr * weight_decay).get();
        let local_step = t as f64;
        let alpha = lr * (1.0 - b2.pow(local_step)).sqrt() / (1.0 - b1.pow(local_step));
        let m_slot = self.core.slot(var, "m", || w.zeros_like())?;
        let v_slot = self.core.slot(var, "v", || w.zeros_like())?;
        if !self.amsgrad {
            let rule = UpdateRule::Adam {
                lr_t: alpha.get(),
                beta_1: b1.get(),
                beta_2: b2.get(),
                epsilon,
                decay,
            };
            if try_fused(&self.core, rule, var, g, &[&m_slot, &v_slot])? {
                return Ok(());
            }
        }
        let s = |x: f64| g.scalar_like(x);
        let m = m_slot.peek();
        let m = m.add(&g.sub(&m)?.mul(&s((1.0 - b1).get())?)?)?;
        let v = v_slot.peek();
        let v = v.add(&g.square()?.sub(&v)?.mul(&s((1.0 - b2).get())?)?)?;
        m_slot.assign(&m)?;
        v_slot.assign(&v)?;
        let v_hat = if self.amsgrad {
            let vh_slot = self.core.slot(var, "vhat", || w.zeros_like())?;
            let vh = vh_slot.peek().maximum(&v)?;
            vh_slot.assign(&vh)?;
            vh
        } else {
            v
        };
        let mut w_new = w.clone();
        if weight_decay > 0.0 {
            w_new = w_new.sub(&w.mul(&s(decay)?)?)?;
        }
        let step = m
            .mul(&s(alpha.get())?)?
            .div(&v_hat.sqrt()?.add(&s(epsilon)?)?)?;
        var.assign(&w_new.sub(&step)?)
    }
}

/// RMSprop (TF 2.4: learning_rate 0.001, rho 0.9, momentum 0, epsilon 1e-7, centered
/// false): `ms = ρ ms + (1-ρ) g²` (centered: `mg = ρ mg + (1-ρ) g`, denominator
/// `ms - mg²`); `mom = μ mom + lr g / √(denom + ε); w -= mom`.
pub struct RmsProp {
    core: OptimizerCore,
    /// Learning rate.
    pub learning_rate: Hyper,
    /// ρ.
    pub rho: Hyper,
    /// Momentum μ.
    pub momentum: Hyper,
    /// ε (inside the square root, as TF's kernel).
    pub epsilon: Hyper,
    /// Centered variant.
    pub centered: bool,
}

impl RmsProp {
    /// RMSprop with TF 2.4's defaults except the learning rate.
    pub fn new(learning_rate: impl Into<Hyper>) -> RmsProp {
        RmsProp {
            core: OptimizerCore::default(),
            learning_rate: learning_rate.into(),
            rho: Hyper::Const(0.9),
            momentum: Hyper::Const(0.0),
            epsilon: Hyper::Const(1e-7),
            centered: false,
        }
    }
}

impl Optimizer for RmsProp {
    core_impl!("RMSprop");
    fn hyperparameters(&self) -> Vec<(&'static str, Hyper)> {
        vec![
            ("learning_rate", self.learning_rate.clone()),
            ("rho", self.rho.clone()),
            ("momentum", self.momentum.clone()),
            ("epsilon", self.epsilon.clone()),
            ("centered", Hyper::Const(self.centered as u8 as f64)),
        ]
    }
    /// TF 2.4. Without momentum (its Python update): `ms = ρ·ms + (1-ρ)·g²` (centered:
    /// `mg = ρ·mg + (1-ρ)·g`, denominator `ms - mg²`), `w -= lr·g/(√denom + ε)`. With
    /// momentum (`ResourceApply[Centered]RMSProp`): `ms += (g² - ms)(1-ρ)` (`mg += (g -
    /// mg)(1-ρ)`), `mom = mom·μ + g·lr/√(denom + ε)`, `w -= mom`.
    fn update(&mut self, g: &Tensor, var: &Variable, _t: i64) -> Result<()> {
        let dtype = var.dtype();
        let w = var.peek();
        let core = &self.core;
        let lr = core.decayed_lr(&self.learning_rate, dtype).get();
        let rho = core.hyper(&self.rho, dtype);
        let one_minus_rho = (1.0 - rho).get();
        let epsilon = core.hyper(&self.epsilon, dtype).get();
        let momentum = core.hyper(&self.momentum, dtype).get();
        let s = |x: f64| g.scalar_like(x);
        let ms_slot = self.core.slot(var, "rms", || w.zeros_like())?;
        let mg_slot = if self.centered {
            Some(self.core.slot(var, "mg", || w.zeros_like())?)
        } else {
            None
        };
        if matches!(self.momentum, Hyper::Const(m) if m == 0.0) {
            let rule = UpdateRule::RmsProp {
                lr,
                rho: rho.get(),
                epsilon,
                centered: self.centered,
            };
            let slots: Vec<&Variable> = std::iter::once(&ms_slot).chain(mg_slot.as_ref()).collect();
            if try_fused(&self.core, rule, var, g, &slots)? {
                return Ok(());
            }
            let ms = ms_slot
                .peek()
                .mul(&s(rho.get())?)?
                .add(&g.square()?.mul(&s(one_minus_rho)?)?)?;
            ms_slot.assign(&ms)?;
            let denom = match &mg_slot {
                Some(mg_slot) => {
                    let mg = mg_slot
                        .peek()
                        .mul(&s(rho.get())?)?
                        .add(&g.mul(&s(one_minus_rho)?)?)?;
                    mg_slot.assign(&mg)?;
                    ms.sub(&mg.square()?)?
                }
                None => ms,
            };
            let step = g.mul(&s(lr)?)?.div(&denom.sqrt()?.add(&s(epsilon)?)?)?;
            return var.assign(&w.sub(&step)?);
        }
        let ms = ms_slot.peek();
        let ms = ms.add(&g.square()?.sub(&ms)?.mul(&s(one_minus_rho)?)?)?;
        ms_slot.assign(&ms)?;
        let denom = match &mg_slot {
            Some(mg_slot) => {
                let mg = mg_slot.peek();
                let mg = mg.add(&g.sub(&mg)?.mul(&s(one_minus_rho)?)?)?;
                mg_slot.assign(&mg)?;
                ms.sub(&mg.square()?)?.add(&s(epsilon)?)?
            }
            None => ms.add(&s(epsilon)?)?,
        };
        let mom_slot = self.core.slot(var, "momentum", || w.zeros_like())?;
        let mom = mom_slot
            .peek()
            .mul(&s(momentum)?)?
            .add(&g.mul(&s(lr)?)?.div(&denom.sqrt()?)?)?;
        mom_slot.assign(&mom)?;
        var.assign(&w.sub(&mom)?)
    }
}

/// Adagrad (TF 2.4: learning_rate 0.001, initial_accumulator_value 0.1, epsilon 1e-7):
/// `acc += g²; w -= lr · g / (√acc + ε)`.
pub struct Adagrad {
    core: OptimizerCore,
    /// Learning rate.
    pub learning_rate: Hyper,
    /// Starting value of the accumulator.
    pub initial_accumulator_value: f64,
    /// ε.
    pub epsilon: Hyper,
}

impl Adagrad {
    /// Adagrad with TF 2.4's defaults except the learning rate.
    pub fn new(learning_rate: impl Into<Hyper>) -> Adagrad {
        Adagrad {
            core: OptimizerCore::default(),
            learning_rate: learning_rate.into(),
            initial_accumulator_value: 0.1,
            epsilon: Hyper::Const(1e-7),
        }
    }
}

impl Optimizer for Adagrad {
    core_impl!("Adagrad");
    fn hyperparameters(&self) -> Vec<(&'static str, Hyper)> {
        vec![
            ("learning_rate", self.learning_rate.clone()),
            (
                "initial_accumulator_value",
                Hyper::Const(self.initial_accumulator_value),
            ),
            ("epsilon", self.epsilon.clone()),
        ]
    }
    /// TF 2.4 (`ResourceApplyAdagradV2`): `acc += g²; w -= g·lr/(√acc + ε)`.
    fn update(&mut self, g: &Tensor, var: &Variable, _t: i64) -> Result<()> {
        let dtype = var.dtype();
        let w = var.peek();
        let lr = self.core.decayed_lr(&self.learning_rate, dtype).get();
        let epsilon = self.core.hyper(&self.epsilon, dtype).get();
        let init = self.initial_accumulator_value;
        let acc_slot = self.core.slot(var, "accumulator", || w.full_like(init))?;
        let rule = UpdateRule::Adagrad { lr, epsilon };
        if try_fused(&self.core, rule, var, g, &[&acc_slot])? {
            return Ok(());
        }
        let acc = acc_slot.peek().add(&g.square()?)?;
        acc_slot.assign(&acc)?;
        let step = g
            .mul(&g.scalar_like(lr)?)?
            .div(&acc.sqrt()?.add(&g.scalar_like(epsilon)?)?)?;
        var.assign(&w.sub(&step)?)
    }
}

/// Optimizers keep their step counter (`iterations`) and learning-rate schedule on the host,
/// and a graph cannot call a `&mut` optimizer again on a later call: refused while tracing,
/// with what to do instead ([`SharedOptimizer`](crate::SharedOptimizer) makes the step a
/// host step of the graph).
pub(crate) fn refuse_inside_function() -> Result<()> {
    ferroflow_tensor::dispatch::refuse_while_tracing(
        "apply_gradients",
        "an optimizer's step counter (iterations) and learning-rate schedule live on the \
         host, and a graph cannot call this optimizer again on later calls; share it \
         (`SharedOptimizer::new(opt)`, whose apply_gradients/minimize are one host step of \
         the graph, run on every call), or return the gradients from the function and \
         apply them outside it",
    )
}
