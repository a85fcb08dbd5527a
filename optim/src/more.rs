//! Adadelta, Adamax, Nadam and Ftrl with TF 2.4's update rules and defaults.

use crate::dtype_scalar::DtypeScalar;
use crate::optimizer::{core_impl, hyper_setters, try_fused, Optimizer, OptimizerCore};
use crate::schedule::Hyper;
use ferroflow_tensor::{Result, Tensor, UpdateRule, Variable};

/// Adadelta (TF 2.4: learning_rate 0.001, rho 0.95, epsilon 1e-7):
/// `acc = ρ acc + (1-ρ) g²; u = √(acc_u + ε)/√(acc + ε) · g; acc_u = ρ acc_u + (1-ρ) u²;
/// w -= lr · u`.
pub struct Adadelta {
    core: OptimizerCore,
    /// Learning rate.
    pub learning_rate: Hyper,
    /// ρ.
    pub rho: Hyper,
    /// ε.
    pub epsilon: Hyper,
}

impl Adadelta {
    /// Adadelta with TF 2.4's defaults except the learning rate.
    pub fn new(learning_rate: impl Into<Hyper>) -> Adadelta {
        Adadelta {
            core: OptimizerCore::default(),
            learning_rate: learning_rate.into(),
            rho: Hyper::Const(0.95),
            epsilon: Hyper::Const(1e-7),
        }
    }
}

impl Optimizer for Adadelta {
    core_impl!("Adadelta");
    fn hyperparameters(&self) -> Vec<(&'static str, Hyper)> {
        vec![
            ("learning_rate", self.learning_rate.clone()),
            ("rho", self.rho.clone()),
            ("epsilon", self.epsilon.clone()),
        ]
    }
    /// TF 2.4 (`ResourceApplyAdadelta`): `acc = acc·ρ + g²(1-ρ);
    /// u = √(acc_u + ε)·(1/√(acc + ε))·g; w -= u·lr; acc_u = acc_u·ρ + u²(1-ρ)`.
    fn update(&mut self, g: &Tensor, var: &Variable, _t: i64) -> Result<()> {
        let dtype = var.dtype();
        let w = var.peek();
        let lr = self.core.decayed_lr(&self.learning_rate, dtype).get();
        let rho = self.core.hyper(&self.rho, dtype);
        let one_minus_rho = (1.0 - rho).get();
        let epsilon = self.core.hyper(&self.epsilon, dtype).get();
        let acc_slot = self.core.slot(var, "accum_grad", || w.zeros_like())?;
        let upd_slot = self.core.slot(var, "accum_var", || w.zeros_like())?;
        let rule = UpdateRule::Adadelta {
            lr,
            rho: rho.get(),
            epsilon,
        };
        if try_fused(&self.core, rule, var, g, &[&acc_slot, &upd_slot])? {
            return Ok(());
        }
        let s = |x: f64| g.scalar_like(x);
        let acc = acc_slot
            .peek()
            .mul(&s(rho.get())?)?
            .add(&g.square()?.mul(&s(one_minus_rho)?)?)?;
        let eps = s(epsilon)?;
        let acc_u = upd_slot.peek();
        let u = acc_u
            .add(&eps)?
            .sqrt()?
            .mul(&acc.add(&eps)?.rsqrt()?)?
            .mul(g)?;
        let acc_u = acc_u
            .mul(&s(rho.get())?)?
            .add(&u.square()?.mul(&s(one_minus_rho)?)?)?;
        acc_slot.assign(&acc)?;
        upd_slot.assign(&acc_u)?;
        var.assign(&w.sub(&u.mul(&s(lr)?)?)?)
    }
}

/// Adamax (TF 2.4: learning_rate 0.001, beta_1 0.9, beta_2 0.999, epsilon 1e-7):
/// `m = β1 m + (1-β1) g; u = max(β2 u, |g|); w -= lr/(1-β1^t) · m/(u + ε)`.
pub struct Adamax {
    core: OptimizerCore,
    /// Learning rate.
    pub learning_rate: Hyper,
    /// β1.
    pub beta_1: Hyper,
    /// β2.
    pub beta_2: Hyper,
    /// ε.
    pub epsilon: Hyper,
}

impl Adamax {
    /// Adamax with TF 2.4's defaults except the learning rate.
    pub fn new(learning_rate: impl Into<Hyper>) -> Adamax {
        Adamax {
            core: OptimizerCore::default(),
            learning_rate: learning_rate.into(),
            beta_1: Hyper::Const(0.9),
            beta_2: Hyper::Const(0.999),
            epsilon: Hyper::Const(1e-7),
        }
    }
}

impl Optimizer for Adamax {
    core_impl!("Adamax");
    fn hyperparameters(&self) -> Vec<(&'static str, Hyper)> {
        vec![
            ("learning_rate", self.learning_rate.clone()),
            ("beta_1", self.beta_1.clone()),
            ("beta_2", self.beta_2.clone()),
            ("epsilon", self.epsilon.clone()),
        ]
    }
    /// TF 2.4 (`ResourceApplyAdaMax`): `m += (g - m)(1-β1); u = max(β2·u, |g|);
    /// w -= lr/(1-β1^t)·(m/(u + ε))`.
    fn update(&mut self, g: &Tensor, var: &Variable, t: i64) -> Result<()> {
        let dtype = var.dtype();
        let w = var.peek();
        let lr = self.core.decayed_lr(&self.learning_rate, dtype);
        let b1 = self.core.hyper(&self.beta_1, dtype);
        let b2 = self.core.hyper(&self.beta_2, dtype).get();
        let epsilon = self.core.hyper(&self.epsilon, dtype).get();
        let lr_t = (lr / (1.0 - b1.pow(t as f64))).get();
        let m_slot = self.core.slot(var, "m", || w.zeros_like())?;
        let u_slot = self.core.slot(var, "v", || w.zeros_like())?;
        let rule = UpdateRule::Adamax {
            lr_t,
            beta_1: b1.get(),
            beta_2: b2,
            epsilon,
        };
        if try_fused(&self.core, rule, var, g, &[&m_slot, &u_slot])? {
            return Ok(());
        }
        let s = |x: f64| g.scalar_like(x);
        let m = m_slot.peek();
        let m = m.add(&g.sub(&m)?.mul(&s((1.0 - b1).get())?)?)?;
        let u = u_slot.peek().mul(&s(b2)?)?.maximum(&g.abs()?)?;
        m_slot.assign(&m)?;
        u_slot.assign(&u)?;
        var.assign(&w.sub(&m.div(&u.add(&s(epsilon)?)?)?.mul(&s(lr_t)?)?)?)
    }
}

/// Nadam (TF 2.4: learning_rate 0.001, beta_1 0.9, beta_2 0.999, epsilon 1e-7), with Keras's
/// momentum schedule `μ_t = β1 (1 - ½·0.96^(0.004 t))` and the running product
/// `m_schedule`; see `Nadam::update` for the full rule.
pub struct Nadam {
    core: OptimizerCore,
    /// Learning rate.
    pub learning_rate: Hyper,
    /// β1.
    pub beta_1: Hyper,
    /// β2.
    pub beta_2: Hyper,
    /// ε.
    pub epsilon: Hyper,
    /// The momentum schedule's decay (TF 2.4's `schedule_decay`, which its Nadam stores as
    /// `decay`: 0.004).
    pub schedule_decay: f64,
    /// (step t, TF's float32 `momentum_cache` after it, S_t = Π μ_1..μ_t in the dtype of the
    /// step's variables): advanced once per step.
    m_cache: (i64, f32, f64),
}

impl Nadam {
    /// Nadam with TF 2.4's defaults except the learning rate.
    pub fn new(learning_rate: impl Into<Hyper>) -> Nadam {
        Nadam {
            core: OptimizerCore::default(),
            learning_rate: learning_rate.into(),
            beta_1: Hyper::Const(0.9),
            beta_2: Hyper::Const(0.999),
            epsilon: Hyper::Const(1e-7),
            schedule_decay: 0.004,
            m_cache: (0, 1.0, 1.0),
        }
    }
    /// μ_step = β1 (1 - ½·0.96^(schedule_decay · step)), in `dtype`.
    fn momentum_at(&self, dtype: ferroflow_tensor::DType, step: i64) -> DtypeScalar {
        let b1 = self.core.hyper(&self.beta_1, dtype);
        // TF 2.4 writes `math_ops.cast(0.96, var_dtype)`: the Python float becomes a float32
        // tensor first, so even a float64 variable's base is float32's 0.96.
        let decay_base = DtypeScalar::new(0.96f32 as f64, dtype);
        let exponent = DtypeScalar::new(self.schedule_decay, dtype) * step as f64;
        b1 * (1.0 - 0.5 * decay_base.pow(exponent.get()))
    }
}

impl Optimizer for Nadam {
    core_impl!("Nadam");
    fn hyperparameters(&self) -> Vec<(&'static str, Hyper)> {
        vec![
            ("learning_rate", self.learning_rate.clone()),
            ("beta_1", self.beta_1.clone()),
            ("beta_2", self.beta_2.clone()),
            ("epsilon", self.epsilon.clone()),
            ("decay", Hyper::Const(self.schedule_decay)),
        ]
    }
    /// TF 2.4's Python update, in the variable's dtype: `μ_t = β1(1 - ½·0.96^(d·t))`
    /// (`d` the schedule decay), `S_t = S_{t-1}·μ_t` (the float32 `momentum_cache`),
    /// `g' = g/(1 - S_t)`, `m = β1 m + (1-β1) g`, `m' = m/(1 - S_t μ_{t+1})`,
    /// `v = β2 v + (1-β2) g²`, `v' = v/(1-β2^t)`, `m̄ = (1-μ_t) g' + μ_{t+1} m'`,
    /// `w -= lr·m̄/(√v' + ε)`.
    fn update(&mut self, g: &Tensor, var: &Variable, t: i64) -> Result<()> {
        let dtype = var.dtype();
        let core = &self.core;
        let b1 = core.hyper(&self.beta_1, dtype);
        let b2 = core.hyper(&self.beta_2, dtype);
        let epsilon = core.hyper(&self.epsilon, dtype).get();
        // Nadam ignores the legacy decay: its `decay` is the momentum schedule's.
        let lr = core.hyper(&self.learning_rate, dtype).get();
        let (mu_t, mu_next) = (self.momentum_at(dtype, t), self.momentum_at(dtype, t + 1));
        // S_t advances once per step, shared by every variable of the step. TF keeps it in a
        // float32 variable (`momentum_cache`) and uses the product in the variable's dtype.
        if self.m_cache.0 != t {
            let previous = if self.m_cache.0 == t - 1 {
                self.m_cache.1
            } else {
                // After a restore: rebuild the product in the same order, bit for bit.
                let mut p = 1.0f32;
                for i in 1..t {
                    p = (DtypeScalar::new(p as f64, dtype) * self.momentum_at(dtype, i)).get()
                        as f32;
                }
                p
            };
            let s_t = DtypeScalar::new(previous as f64, dtype) * mu_t;
            self.m_cache = (t, s_t.get() as f32, s_t.get());
        }
        let s_t = DtypeScalar::new(self.m_cache.2, dtype);
        let s_next = s_t * mu_next;
        let w = var.peek();
        let c = |x: f64| g.scalar_like(x);
        let m_slot = self.core.slot(var, "m", || w.zeros_like())?;
        let v_slot = self.core.slot(var, "v", || w.zeros_like())?;
        let m = m_slot
            .peek()
            .mul(&c(b1.get())?)?
            .add(&g.mul(&c((1.0 - b1).get())?)?)?;
        let v = v_slot
            .peek()
            .mul(&c(b2.get())?)?
            .add(&g.square()?.mul(&c((1.0 - b2).get())?)?)?;
        m_slot.assign(&m)?;
        v_slot.assign(&v)?;
        let g_prime = g.div(&c((1.0 - s_t).get())?)?;
        let m_prime = m.div(&c((1.0 - s_next).get())?)?;
        let v_prime = v.div(&c((1.0 - b2.pow(t as f64)).get())?)?;
        let m_bar = g_prime
            .mul(&c((1.0 - mu_t).get())?)?
            .add(&m_prime.mul(&c(mu_next.get())?)?)?;
        var.assign(
            &w.sub(
                &m_bar
                    .mul(&c(lr)?)?
                    .div(&v_prime.sqrt()?.add(&c(epsilon)?)?)?,
            )?,
        )
    }
}

/// FTRL-Proximal (TF 2.4: learning_rate 0.001, learning_rate_power -0.5,
/// initial_accumulator_value 0.1, l1 = l2 = l2_shrinkage = beta = 0); see `Ftrl::update`.
pub struct Ftrl {
    core: OptimizerCore,
    /// Learning rate.
    pub learning_rate: Hyper,
    /// Power of the accumulator in the per-coordinate rate (≤ 0).
    pub learning_rate_power: Hyper,
    /// Starting accumulator.
    pub initial_accumulator_value: f64,
    /// L1 strength.
    pub l1: Hyper,
    /// L2 strength.
    pub l2: Hyper,
    /// L2 shrinkage strength (added to the gradient only).
    pub l2_shrinkage: Hyper,
    /// β from the paper (adds β/(2 lr) to l2).
    pub beta: Hyper,
}

impl Ftrl {
    /// Ftrl with TF 2.4's defaults except the learning rate.
    pub fn new(learning_rate: impl Into<Hyper>) -> Ftrl {
        Ftrl {
            core: OptimizerCore::default(),
            learning_rate: learning_rate.into(),
            learning_rate_power: Hyper::Const(-0.5),
            initial_accumulator_value: 0.1,
            l1: Hyper::Const(0.0),
            l2: Hyper::Const(0.0),
            l2_shrinkage: Hyper::Const(0.0),
            beta: Hyper::Const(0.0),
        }
    }
}

impl Optimizer for Ftrl {
    core_impl!("Ftrl");
    fn hyperparameters(&self) -> Vec<(&'static str, Hyper)> {
        vec![
            ("learning_rate", self.learning_rate.clone()),
            ("learning_rate_power", self.learning_rate_power.clone()),
            (
                "initial_accumulator_value",
                Hyper::Const(self.initial_accumulator_value),
            ),
            ("l1_regularization_strength", self.l1.clone()),
            ("l2_regularization_strength", self.l2.clone()),
            (
                "l2_shrinkage_regularization_strength",
                self.l2_shrinkage.clone(),
            ),
            ("beta", self.beta.clone()),
        ]
    }
    /// TF 2.4 (`ResourceApplyFtrl[V2]`): `n' = n + g²;
    /// z += (g + 2·l2s·w) - (n'^-p - n^-p)/lr · w;
    /// w = |z| > l1 ? (l1·sign(z) - z) / (n'^-p/lr + 2·l2') : 0` with `p` the power
    /// (`√` for p = -0.5, as TF's kernel) and `l2' = l2 + β/(2 lr)`.
    fn update(&mut self, g: &Tensor, var: &Variable, _t: i64) -> Result<()> {
        let dtype = var.dtype();
        let w = var.peek();
        let core = &self.core;
        let lr = core.decayed_lr(&self.learning_rate, dtype);
        let power = core.hyper(&self.learning_rate_power, dtype).get();
        let l1 = core.hyper(&self.l1, dtype).get();
        let l2 = (core.hyper(&self.l2, dtype) + core.hyper(&self.beta, dtype) / (2.0 * lr)).get();
        let l2_shrinkage = core.hyper(&self.l2_shrinkage, dtype);
        let c = |x: f64| g.scalar_like(x);
        let init = self.initial_accumulator_value;
        let n_slot = self.core.slot(var, "accumulator", || w.full_like(init))?;
        let z_slot = self.core.slot(var, "linear", || w.zeros_like())?;
        let n = n_slot.peek();
        let n_new = n.add(&g.square()?)?;
        let rate = |x: &Tensor| {
            if power == -0.5 {
                x.sqrt()
            } else {
                x.pow(&c(-power)?)
            }
        };
        let lr_c = c(lr.get())?;
        let sigma = rate(&n_new)?.sub(&rate(&n)?)?.div(&lr_c)?;
        let g_shrunk = if l2_shrinkage.get() > 0.0 {
            g.add(&w.mul(&c((2.0 * l2_shrinkage).get())?)?)?
        } else {
            g.clone()
        };
        let z = z_slot.peek().add(&g_shrunk.sub(&sigma.mul(&w)?)?)?;
        let quadratic = rate(&n_new)?.div(&lr_c)?.add(&c(2.0 * l2)?)?;
        let l1 = c(l1)?;
        let w_new = l1.mul(&z.sign()?)?.sub(&z)?.div(&quadratic)?;
        let w_new = Tensor::select(&z.abs()?.greater(&l1)?, &w_new, &w.zeros_like()?)?;
        n_slot.assign(&n_new)?;
        z_slot.assign(&z)?;
        var.assign(&w_new)
    }
}

hyper_setters!(Adadelta { rho, epsilon });
hyper_setters!(Adamax {
    beta_1,
    beta_2,
    epsilon
});
hyper_setters!(Nadam {
    beta_1,
    beta_2,
    epsilon
});
hyper_setters!(Ftrl {
    learning_rate_power,
    l1,
    l2,
    l2_shrinkage,
    beta
});

impl Nadam {
    /// Sets the momentum schedule's decay (TF 2.4's `schedule_decay`, default 0.004).
    pub fn schedule_decay(mut self, value: f64) -> Nadam {
        self.schedule_decay = value;
        self
    }
}

impl Ftrl {
    /// Sets the accumulators' starting value (TF's `initial_accumulator_value`).
    pub fn initial_accumulator_value(mut self, value: f64) -> Ftrl {
        self.initial_accumulator_value = value;
        self
    }
}
