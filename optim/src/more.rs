//! Adadelta, Adamax, Nadam and Ftrl with TF 2.4's update rules and defaults.

use crate::optimizer::{core_impl, try_fused, Optimizer, OptimizerCore};
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
    fn update(&mut self, g: &Tensor, var: &Variable, _t: i64) -> Result<()> {
        let w = var.peek();
        let lr = self.learning_rate.at(self.core.iterations);
        let s = |x: f64| g.scalar_like(x);
        let acc_slot = self.core.slot(var, "accum_grad", || w.zeros_like())?;
        let upd_slot = self.core.slot(var, "accum_var", || w.zeros_like())?;
        let rule = UpdateRule::Adadelta {
            lr,
            rho: self.rho.at(self.core.iterations),
            epsilon: self.epsilon.at(self.core.iterations),
        };
        if try_fused(&self.core, rule, var, g, &[&acc_slot, &upd_slot])? {
            return Ok(());
        }
        let acc = acc_slot
            .peek()
            .mul(&s(self.rho.at(self.core.iterations))?)?
            .add(
                &g.square()?
                    .mul(&s(1.0 - self.rho.at(self.core.iterations))?)?,
            )?;
        let eps = s(self.epsilon.at(self.core.iterations))?;
        let u = upd_slot
            .peek()
            .add(&eps)?
            .sqrt()?
            .div(&acc.add(&eps)?.sqrt()?)?
            .mul(g)?;
        let acc_u = upd_slot
            .peek()
            .mul(&s(self.rho.at(self.core.iterations))?)?
            .add(
                &u.square()?
                    .mul(&s(1.0 - self.rho.at(self.core.iterations))?)?,
            )?;
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
    fn update(&mut self, g: &Tensor, var: &Variable, t: i64) -> Result<()> {
        let w = var.peek();
        let lr = self.learning_rate.at(self.core.iterations);
        let s = |x: f64| g.scalar_like(x);
        let m_slot = self.core.slot(var, "m", || w.zeros_like())?;
        let u_slot = self.core.slot(var, "v", || w.zeros_like())?;
        let b1 = self.beta_1.at(self.core.iterations);
        let rule = UpdateRule::Adamax {
            lr_t: lr / (1.0 - b1.powf(t as f64)),
            beta_1: b1,
            beta_2: self.beta_2.at(self.core.iterations),
            epsilon: self.epsilon.at(self.core.iterations),
        };
        if try_fused(&self.core, rule, var, g, &[&m_slot, &u_slot])? {
            return Ok(());
        }
        let m = m_slot
            .peek()
            .mul(&s(self.beta_1.at(self.core.iterations))?)?
            .add(&g.mul(&s(1.0 - self.beta_1.at(self.core.iterations))?)?)?;
        let u = u_slot
            .peek()
            .mul(&s(self.beta_2.at(self.core.iterations))?)?
            .maximum(&g.abs()?)?;
        m_slot.assign(&m)?;
        u_slot.assign(&u)?;
        let lr_t = lr / (1.0 - self.beta_1.at(self.core.iterations).powf(t as f64));
        var.assign(
            &w.sub(
                &m.mul(&s(lr_t)?)?
                    .div(&u.add(&s(self.epsilon.at(self.core.iterations))?)?)?,
            )?,
        )
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
    /// (step, m_schedule after that step): the product Π μ_1..μ_t, advanced once per step.
    m_schedule: (i64, f64),
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
            m_schedule: (0, 1.0),
        }
    }
    fn momentum_cache(&self, t: f64) -> f64 {
        self.beta_1.at(self.core.iterations) * (1.0 - 0.5 * 0.96f64.powf(0.004 * t))
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
        ]
    }
    /// `g' = g/(1 - S_t)`, `m = β1 m + (1-β1) g`, `m' = m/(1 - S_t μ_{t+1})`,
    /// `v = β2 v + (1-β2) g²`, `v' = v/(1-β2^t)`, `m̄ = (1-μ_t) g' + μ_{t+1} m'`,
    /// `w -= lr · m̄/(√v' + ε)` with `S_t = Π_{i≤t} μ_i`.
    fn update(&mut self, g: &Tensor, var: &Variable, t: i64) -> Result<()> {
        // S_t advances once per step, shared by every variable of the step.
        if self.m_schedule.0 == t - 1 {
            let prev = self.m_schedule.1;
            self.m_schedule = (t, prev * self.momentum_cache(t as f64));
        } else if self.m_schedule.0 != t {
            // After a restore: rebuild the product in the same order, so it is bit-identical.
            let mut p = 1.0;
            for i in 1..=t {
                p *= self.momentum_cache(i as f64);
            }
            self.m_schedule = (t, p);
        }
        let s_t = self.m_schedule.1;
        let (mu_t, mu_next) = (
            self.momentum_cache(t as f64),
            self.momentum_cache(t as f64 + 1.0),
        );
        let s_next = s_t * mu_next;
        let w = var.peek();
        let lr = self.learning_rate.at(self.core.iterations);
        let c = |x: f64| g.scalar_like(x);
        let m_slot = self.core.slot(var, "m", || w.zeros_like())?;
        let v_slot = self.core.slot(var, "v", || w.zeros_like())?;
        let m = m_slot
            .peek()
            .mul(&c(self.beta_1.at(self.core.iterations))?)?
            .add(&g.mul(&c(1.0 - self.beta_1.at(self.core.iterations))?)?)?;
        let v = v_slot
            .peek()
            .mul(&c(self.beta_2.at(self.core.iterations))?)?
            .add(
                &g.square()?
                    .mul(&c(1.0 - self.beta_2.at(self.core.iterations))?)?,
            )?;
        m_slot.assign(&m)?;
        v_slot.assign(&v)?;
        let g_prime = g.mul(&c(1.0 / (1.0 - s_t))?)?;
        let m_prime = m.mul(&c(1.0 / (1.0 - s_next))?)?;
        let v_prime =
            v.mul(&c(1.0
                / (1.0
                    - self.beta_2.at(self.core.iterations).powf(t as f64)))?)?;
        let m_bar = g_prime
            .mul(&c(1.0 - mu_t)?)?
            .add(&m_prime.mul(&c(mu_next)?)?)?;
        var.assign(
            &w.sub(
                &m_bar.mul(&c(lr)?)?.div(
                    &v_prime
                        .sqrt()?
                        .add(&c(self.epsilon.at(self.core.iterations))?)?,
                )?,
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
    /// `n' = n + g²; z += g + 2·l2s·w - (n'^-p - n^-p)/lr · w;
    /// w = |z| > l1 ? (sign(z)·l1 - z) / (n'^-p/lr + 2·l2') : 0` with `p` the power and
    /// `l2' = l2 + β/(2 lr)`.
    fn update(&mut self, g: &Tensor, var: &Variable, _t: i64) -> Result<()> {
        let w = var.peek();
        let lr = self.learning_rate.at(self.core.iterations);
        let c = |x: f64| g.scalar_like(x);
        let init = self.initial_accumulator_value;
        let n_slot = self.core.slot(var, "accumulator", || w.full_like(init))?;
        let z_slot = self.core.slot(var, "linear", || w.zeros_like())?;
        let n = n_slot.peek();
        let n_new = n.add(&g.square()?)?;
        let neg_p = c(-self.learning_rate_power.at(self.core.iterations))?;
        let sigma = n_new
            .pow(&neg_p)?
            .sub(&n.pow(&neg_p)?)?
            .mul(&c(1.0 / lr)?)?;
        let g_shrunk = g.add(&w.mul(&c(2.0 * self.l2_shrinkage.at(self.core.iterations))?)?)?;
        let z = z_slot.peek().add(&g_shrunk)?.sub(&sigma.mul(&w)?)?;
        let l2 = self.l2.at(self.core.iterations) + self.beta.at(self.core.iterations) / (2.0 * lr);
        let quadratic = n_new.pow(&neg_p)?.mul(&c(1.0 / lr)?)?.add(&c(2.0 * l2)?)?;
        let l1 = c(self.l1.at(self.core.iterations))?;
        let w_new = z.sign()?.mul(&l1)?.sub(&z)?.div(&quadratic)?;
        let w_new = Tensor::select(&z.abs()?.greater(&l1)?, &w_new, &w.zeros_like()?)?;
        n_slot.assign(&n_new)?;
        z_slot.assign(&z)?;
        var.assign(&w_new)
    }
}
