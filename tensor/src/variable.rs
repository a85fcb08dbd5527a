//! [`Variable`]: named, mutable, shared state (what optimizers update and checkpoints save).

use crate::dispatch::notify_variable_read;
use crate::error::{Error, Result};
use crate::tensor::Tensor;
use std::fmt;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, RwLock};

static NEXT_VAR: AtomicU64 = AtomicU64::new(1);

/// How a distribution strategy keeps replicas of a variable in sync (TF's
/// `tf.VariableSynchronization`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub enum VariableSynchronization {
    /// Let the strategy decide (on-write for mirrored variables).
    #[default]
    Auto,
    /// Not synchronised (non-trainable only).
    None,
    /// Synchronised whenever written.
    OnWrite,
    /// Synchronised when read (metrics).
    OnRead,
}

/// How replica updates combine (TF's `tf.VariableAggregation`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub enum VariableAggregation {
    /// No aggregation.
    #[default]
    None,
    /// Sum over replicas.
    Sum,
    /// Mean over replicas.
    Mean,
    /// Take the first replica's value.
    OnlyFirstReplica,
}

struct Inner {
    id: u64,
    name: String,
    trainable: bool,
    synchronization: VariableSynchronization,
    aggregation: VariableAggregation,
    value: RwLock<Tensor>,
}

/// A named, shared, mutable tensor, like `tf.Variable`. Clones share the same state.
///
/// ```no_run
/// // A backend registered first: `ferroflow::init()` (the facade).
/// use ferroflow_tensor::{Tensor, Variable};
/// let v = Variable::new("w", Tensor::from_slice(&[1.0f32, 2.0])?);
/// v.assign_add(&Tensor::from_slice(&[0.5f32, 0.5])?)?;
/// assert_eq!(v.value().to_vec::<f32>()?, vec![1.5, 2.5]);
/// # Ok::<(), ferroflow_tensor::Error>(())
/// ```
#[derive(Clone)]
pub struct Variable(Arc<Inner>);

impl Variable {
    /// A trainable variable holding `initial`.
    pub fn new(name: impl Into<String>, initial: Tensor) -> Variable {
        Variable::with_options(
            name,
            initial,
            true,
            VariableSynchronization::Auto,
            VariableAggregation::None,
        )
    }
    /// A variable with every TF attribute given.
    pub fn with_options(
        name: impl Into<String>,
        initial: Tensor,
        trainable: bool,
        synchronization: VariableSynchronization,
        aggregation: VariableAggregation,
    ) -> Variable {
        Variable(Arc::new(Inner {
            id: NEXT_VAR.fetch_add(1, Ordering::Relaxed),
            name: name.into(),
            trainable,
            synchronization,
            aggregation,
            value: RwLock::new(initial),
        }))
    }
    /// Unique id.
    pub fn id(&self) -> u64 {
        self.0.id
    }
    /// The name given at creation.
    pub fn name(&self) -> &str {
        &self.0.name
    }
    /// Whether optimizers train it (and tapes watch it automatically).
    pub fn trainable(&self) -> bool {
        self.0.trainable
    }
    /// The synchronization attribute.
    pub fn synchronization(&self) -> VariableSynchronization {
        self.0.synchronization
    }
    /// The aggregation attribute.
    pub fn aggregation(&self) -> VariableAggregation {
        self.0.aggregation
    }
    /// The current value (observers such as gradient tapes are told of the read).
    pub fn value(&self) -> Tensor {
        let v = self.peek();
        notify_variable_read(self, &v);
        v
    }
    /// The current value without telling observers (for checkpoints and printing).
    pub fn peek(&self) -> Tensor {
        self.0
            .value
            .read()
            .unwrap_or_else(|e| e.into_inner())
            .clone()
    }
    /// The shape.
    pub fn shape(&self) -> Vec<usize> {
        self.peek().shape().to_vec()
    }
    /// The dtype (fixed for the variable's life).
    pub fn dtype(&self) -> crate::DType {
        self.peek().dtype()
    }
    /// Replaces the value; shape, dtype and device must stay as they are.
    pub fn assign(&self, value: &Tensor) -> Result<()> {
        let mut slot = self.0.value.write().unwrap_or_else(|e| e.into_inner());
        if slot.shape() != value.shape() {
            return Err(Error::ShapeMismatch {
                op: "assign",
                msg: "the new value's shape differs from the variable's",
                lhs: slot.shape().to_vec(),
                rhs: value.shape().to_vec(),
            });
        }
        if slot.dtype() != value.dtype() {
            return Err(Error::DTypeMismatch {
                op: "assign",
                lhs: slot.dtype(),
                rhs: value.dtype(),
            });
        }
        let value = if value.device() != slot.device() {
            value.to_device(slot.device())?
        } else {
            value.clone()
        };
        *slot = value;
        Ok(())
    }
    /// `self += delta`.
    pub fn assign_add(&self, delta: &Tensor) -> Result<()> {
        self.assign(&self.peek().add(delta)?)
    }
    /// `self -= delta`.
    pub fn assign_sub(&self, delta: &Tensor) -> Result<()> {
        self.assign(&self.peek().sub(delta)?)
    }
}

impl fmt::Debug for Variable {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let v = self.peek();
        write!(
            f,
            "<tf.Variable '{}' shape={:?} dtype={}>",
            self.name(),
            v.shape(),
            v.dtype()
        )
    }
}
