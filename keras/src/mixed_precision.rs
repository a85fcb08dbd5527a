//! Mixed precision (`tf.keras.mixed_precision`, stable since TF 2.4): a [`Policy`] gives every
//! layer a compute dtype and a variable dtype.
//!
//! Under `"mixed_float16"` or `"mixed_bfloat16"` a layer keeps its weights in float32, casts
//! its floating inputs to the half type (opt out with [`LayerBase::autocast`]), and reads its
//! weights as the half type inside `call` (TF's autocast variables), so gradients and
//! optimizer updates stay in float32. Numerically sensitive parts run in float32: softmax,
//! the losses and metrics, batch and layer normalization. `Model::compile` wraps the
//! optimizer in a dynamic [`LossScaleOptimizer`](ferroflow_optim::LossScaleOptimizer) under
//! `"mixed_float16"`, as TF 2.4 does; `"mixed_bfloat16"` has float32's range and needs none.
//!
//! ```
//! ferroflow::init();
//! use ferroflow_keras::layers::Dense;
//! use ferroflow_keras::mixed_precision::{set_global_policy, Policy};
//! use ferroflow_keras::Layer;
//! use ferroflow_tensor::{DType, Tensor};
//! let mut dense = Dense::new(4).dtype(Policy::new("mixed_bfloat16")?);
//! let y = dense.forward(&Tensor::ones(&[2, 3], DType::F32)?, false)?;
//! assert_eq!(y.dtype(), DType::BF16); // computed in bfloat16
//! assert_eq!(dense.weights()[0].dtype(), DType::F32); // stored in float32
//! # Ok::<(), ferroflow_tensor::Error>(())
//! ```
//!
//! [`LayerBase::autocast`]: crate::layer::LayerBase::autocast

use std::cell::Cell;
use std::sync::Mutex;

use ferroflow_tensor::{DType, Error, Result, Tensor, Variable};

/// A layer's dtype policy (`tf.keras.mixed_precision.Policy`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Policy {
    name: String,
    compute: DType,
    variable: DType,
}

impl Policy {
    /// The policy named `name`: `"float32"`, `"float64"`, `"float16"`, `"bfloat16"` (compute
    /// and variables in that type), `"mixed_float16"` or `"mixed_bfloat16"` (compute in the
    /// half type, variables in float32).
    pub fn new(name: &str) -> Result<Policy> {
        let (compute, variable) = match name {
            "float32" => (DType::F32, DType::F32),
            "float64" => (DType::F64, DType::F64),
            "float16" => (DType::F16, DType::F16),
            "bfloat16" => (DType::BF16, DType::BF16),
            "mixed_float16" => (DType::F16, DType::F32),
            "mixed_bfloat16" => (DType::BF16, DType::F32),
            other => {
                return Err(Error::invalid(
                    "Policy",
                    format!(
                        "unknown policy {other:?}: expected float32, float64, float16, bfloat16, \
                         mixed_float16 or mixed_bfloat16"
                    ),
                ))
            }
        };
        Ok(Policy {
            name: name.to_string(),
            compute,
            variable,
        })
    }
    /// The policy's name.
    pub fn name(&self) -> &str {
        &self.name
    }
    /// The dtype layers compute in.
    pub fn compute_dtype(&self) -> DType {
        self.compute
    }
    /// The dtype layers keep their weights in.
    pub fn variable_dtype(&self) -> DType {
        self.variable
    }
    /// Whether compute and variable dtypes differ (a mixed policy).
    pub fn is_mixed(&self) -> bool {
        self.compute != self.variable
    }
}

impl Default for Policy {
    fn default() -> Self {
        Policy::new("float32").expect("float32 is a policy")
    }
}

impl std::fmt::Display for Policy {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "<Policy \"{}\">", self.name)
    }
}

static GLOBAL_POLICY: Mutex<Option<Policy>> = Mutex::new(None);

/// Sets the policy new layers get (`set_global_policy`); layers made before keep theirs.
///
/// ```
/// use ferroflow_keras::mixed_precision::{global_policy, set_global_policy, Policy};
/// set_global_policy(Policy::new("mixed_float16")?);
/// assert_eq!(global_policy().compute_dtype(), ferroflow_tensor::DType::F16);
/// set_global_policy(Policy::new("float32")?);
/// # Ok::<(), ferroflow_tensor::Error>(())
/// ```
pub fn set_global_policy(policy: Policy) {
    *GLOBAL_POLICY.lock().unwrap_or_else(|e| e.into_inner()) = Some(policy);
}

/// The policy new layers get (`global_policy`): float32 unless set.
pub fn global_policy() -> Policy {
    GLOBAL_POLICY
        .lock()
        .unwrap_or_else(|e| e.into_inner())
        .clone()
        .unwrap_or_default()
}

thread_local! {
    /// The dtype floating variables are read as inside the running layer's `call`.
    static AUTOCAST: Cell<Option<DType>> = const { Cell::new(None) };
}

/// Runs `f` with floating variables read as `dtype` (TF's `enable_auto_cast_variables`
/// scope, which `Layer.__call__` opens with its compute dtype); `None` reads them as stored.
pub fn with_autocast<R>(dtype: Option<DType>, f: impl FnOnce() -> R) -> R {
    struct Restore(Option<DType>);
    impl Drop for Restore {
        fn drop(&mut self) {
            AUTOCAST.with(|c| c.set(self.0));
        }
    }
    let _restore = Restore(AUTOCAST.with(|c| c.replace(dtype)));
    f()
}

/// A variable's value as the layer computes with it: cast to the autocast dtype when a mixed
/// policy's `call` is running and the variable is floating (the cast is on the tape, so the
/// gradient reaches the float32 variable as float32).
pub fn read_variable(v: &Variable) -> Result<Tensor> {
    let value = v.value();
    match AUTOCAST.with(Cell::get) {
        Some(d) if value.dtype().is_float() && value.dtype() != d => value.cast(d),
        _ => Ok(value),
    }
}
