//! [`Variable`]: named, mutable, shared state (what optimizers update and checkpoints save).

use crate::dispatch::notify_variable_read;
use crate::distribution::{
    current_variable_distribution, note_remote_failure, replica_context, RemoteUpdate,
    RemoteVariable, ReplicaInfo, VariablePlacement, VariableWrite,
};
use crate::error::{Error, Result};
use crate::tensor::Tensor;
use std::fmt;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, RwLock};

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
    /// Set when created inside a distribution strategy's scope.
    distributed: Option<Distributed>,
    /// Set when a strategy placed the variable in another process (a parameter server):
    /// reads and writes go there; `value` keeps the last value seen here.
    remote: Option<Arc<dyn RemoteVariable>>,
}

/// The state of a variable created in a strategy's scope (TF's `MirroredVariable` and
/// `SyncOnReadVariable`).
struct Distributed {
    strategy: &'static str,
    /// Mirrored (sync on write): copies of the value on the replicas' other devices, made
    /// on first read there and dropped by every write.
    copies: Mutex<Vec<Tensor>>,
    /// Sync on read: one value per local replica (`value` above is unused then).
    per_replica: Option<Vec<RwLock<Tensor>>>,
    /// Mirrored: the updates the local replicas asked for in this step, applied together
    /// by the last one (so every replica of a step reads the same value, as in TF).
    pending: Mutex<Vec<Tensor>>,
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
        let name = name.into();
        let scope = current_variable_distribution();
        let remote = scope
            .as_ref()
            .and_then(|how| how.place.as_ref())
            .and_then(|place| {
                place(&VariablePlacement {
                    name: &name,
                    initial: &initial,
                    trainable,
                    synchronization,
                })
            });
        let distributed = scope.as_ref().filter(|_| remote.is_none()).and_then(|how| {
            (synchronization != VariableSynchronization::None).then(|| Distributed {
                strategy: how.strategy,
                copies: Mutex::new(vec![]),
                per_replica: (synchronization == VariableSynchronization::OnRead).then(|| {
                    (0..how.num_local_replicas.max(1))
                        .map(|_| RwLock::new(initial.clone()))
                        .collect()
                }),
                pending: Mutex::new(vec![]),
            })
        });
        let v = Variable(Arc::new(Inner {
            id: NEXT_VAR.fetch_add(1, Ordering::Relaxed),
            name,
            trainable,
            synchronization,
            aggregation,
            value: RwLock::new(initial),
            distributed,
            remote,
        }));
        if let Some(hook) = scope.as_ref().and_then(|how| how.on_create.as_ref()) {
            hook(&v);
        }
        v
    }
    /// Whether the variable was created in a distribution strategy's scope (TF's
    /// distributed variables: mirrored, or sync-on-read when its synchronization is
    /// `OnRead`; or held by a parameter server).
    pub fn is_distributed(&self) -> bool {
        self.0.distributed.is_some() || self.0.remote.is_some()
    }
    /// The handle of the variable's remote home, when a strategy placed it in another
    /// process.
    pub fn remote(&self) -> Option<&dyn RemoteVariable> {
        self.0.remote.as_deref()
    }
    /// Where the variable lives when a strategy placed it in another process
    /// (`/job:ps/task:0`), else `None`.
    pub fn remote_location(&self) -> Option<String> {
        self.0.remote.as_ref().map(|r| r.location())
    }
    /// The optimizer slot `slot` of `primary` (`<primary>/<slot>`, not trainable), starting
    /// at `initial`: next to its variable on a parameter server when the variable is held
    /// by one, else an ordinary variable (distributed like `primary` in a strategy's scope).
    pub fn new_slot(primary: &Variable, slot: &str, initial: Tensor) -> Variable {
        let name = format!("{}/{slot}", primary.name());
        match &primary.0.remote {
            Some(r) => Variable(Arc::new(Inner {
                id: NEXT_VAR.fetch_add(1, Ordering::Relaxed),
                remote: Some(r.slot(slot, &initial)),
                name,
                trainable: false,
                synchronization: VariableSynchronization::Auto,
                aggregation: VariableAggregation::None,
                value: RwLock::new(initial),
                distributed: None,
            })),
            None => Variable::with_options(
                name,
                initial,
                false,
                VariableSynchronization::Auto,
                VariableAggregation::None,
            ),
        }
    }
    /// Applies an optimizer step where a remote variable lives (its slots with it): `None`
    /// for a variable of this process (the optimizer updates it itself), else the outcome.
    pub fn apply_remote_update(
        &self,
        update: &RemoteUpdate,
        gradient: &Tensor,
        slots: &[&Variable],
    ) -> Option<Result<()>> {
        let remote = self.0.remote.as_ref()?;
        Some((|| {
            let current = self.last_known();
            check_write(VariableWrite::Sub, &current, gradient)?;
            let slot_handles = slots
                .iter()
                .map(|s| {
                    s.0.remote.as_deref().ok_or_else(|| {
                        Error::invalid(
                            "apply_gradients",
                            format!(
                                "slot {:?} of {:?} is not held with its variable on {}",
                                s.name(),
                                self.name(),
                                remote.location()
                            ),
                        )
                    })
                })
                .collect::<Result<Vec<_>>>()?;
            remote.apply(update, gradient, &slot_handles)
        })())
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
    ///
    /// A distributed variable read in a replica's step gives that replica's value: for a
    /// mirrored variable, a copy on the replica's device (made once per write); for a
    /// sync-on-read one, the replica's own value. Read outside a step, a sync-on-read
    /// variable gives its replicas' values aggregated (sum, mean, or the first's).
    pub fn value(&self) -> Tensor {
        let v = self.local_value();
        notify_variable_read(self, &v);
        v
    }
    /// The current value without telling tapes (for checkpoints, printing, moving
    /// averages): the cross-replica value of a distributed variable. A graph tracer still
    /// records the read.
    pub fn peek(&self) -> Tensor {
        let v = match self
            .0
            .distributed
            .as_ref()
            .and_then(|d| d.per_replica.as_ref())
        {
            Some(parts) => self.aggregate_replicas(parts),
            None => self.primary(),
        };
        crate::dispatch::notify_variable_peek(self, &v);
        v
    }

    fn primary(&self) -> Tensor {
        if let Some(remote) = &self.0.remote {
            match remote.read() {
                Ok(v) => {
                    *self.0.value.write().unwrap_or_else(|e| e.into_inner()) = v.clone();
                    return v;
                }
                Err(e) => note_remote_failure(e),
            }
        }
        self.last_known()
    }

    /// The value held in this process (a remote variable's last value seen here).
    fn last_known(&self) -> Tensor {
        self.0
            .value
            .read()
            .unwrap_or_else(|e| e.into_inner())
            .clone()
    }

    /// This thread's view: the replica's value inside a replica's step.
    fn local_value(&self) -> Tensor {
        let Some(d) = &self.0.distributed else {
            return self.primary();
        };
        let replica = replica_context();
        if let Some(parts) = &d.per_replica {
            return match replica.filter(|r| r.local_replica < parts.len()) {
                Some(r) => {
                    let slot = &parts[r.local_replica];
                    let v = slot.read().unwrap_or_else(|e| e.into_inner()).clone();
                    if v.device() == r.device {
                        return v;
                    }
                    match v.to_device(r.device) {
                        Ok(moved) => {
                            *slot.write().unwrap_or_else(|e| e.into_inner()) = moved.clone();
                            moved
                        }
                        // The next op names the devices that do not match.
                        Err(_) => v,
                    }
                }
                None => self.aggregate_replicas(parts),
            };
        }
        let primary = self.primary();
        let here = crate::device::current_device();
        if primary.device() == here {
            return primary;
        }
        let mut copies = d.copies.lock().unwrap_or_else(|e| e.into_inner());
        if let Some(c) = copies.iter().find(|c| c.device() == here) {
            return c.clone();
        }
        match primary.to_device(here) {
            Ok(c) => {
                copies.push(c.clone());
                c
            }
            // The next op names the devices that do not match.
            Err(_) => primary,
        }
    }

    /// A sync-on-read variable's value outside a replica's step: its replicas' values
    /// combined by its aggregation, on the first replica's device.
    fn aggregate_replicas(&self, parts: &[RwLock<Tensor>]) -> Tensor {
        let values: Vec<Tensor> = parts
            .iter()
            .map(|p| p.read().unwrap_or_else(|e| e.into_inner()).clone())
            .collect();
        let first = values[0].clone();
        let combine = || -> Result<Tensor> {
            let mut total = first.clone();
            for v in &values[1..] {
                total = total.add(&v.to_device(first.device())?)?;
            }
            match self.0.aggregation {
                VariableAggregation::Mean => total.div(&total.scalar_like(values.len() as f64)?),
                _ => Ok(total),
            }
        };
        match self.0.aggregation {
            VariableAggregation::Sum | VariableAggregation::Mean if values.len() > 1 => {
                // `peek` cannot fail; a sum that does (out of memory) is said, not hidden.
                combine().unwrap_or_else(|e| {
                    eprintln!(
                        "WARNING: variable {:?}: its replicas' values could not be combined ({e}); \
                         reading the first replica's",
                        self.name()
                    );
                    first
                })
            }
            _ => first,
        }
    }
    /// The shape (fixed for the variable's life).
    pub fn shape(&self) -> Vec<usize> {
        self.last_known().shape().to_vec()
    }
    /// The dtype (fixed for the variable's life).
    pub fn dtype(&self) -> crate::DType {
        self.last_known().dtype()
    }
    /// Replaces the value; shape and dtype must stay as they are (a value on another
    /// device is copied to the variable's).
    ///
    /// In a replica's step, a distributed variable follows TF: a sync-on-read variable
    /// sets the replica's own value; a mirrored one needs an aggregation (`Sum`, `Mean`,
    /// `OnlyFirstReplica`; `None` is an error) and takes effect when the last local
    /// replica has written, combining every replica's value (across workers too).
    pub fn assign(&self, value: &Tensor) -> Result<()> {
        self.write(VariableWrite::Assign, value)
    }
    /// `self += delta`.
    pub fn assign_add(&self, delta: &Tensor) -> Result<()> {
        self.write(VariableWrite::Add, delta)
    }
    /// `self -= delta`.
    pub fn assign_sub(&self, delta: &Tensor) -> Result<()> {
        self.write(VariableWrite::Sub, delta)
    }

    fn write(&self, kind: VariableWrite, value: &Tensor) -> Result<()> {
        if crate::dispatch::is_dry_run() {
            let current = match &self.0.remote {
                Some(_) => self.last_known(),
                None => self.primary(),
            };
            check_write(kind, &current, value)?;
        } else {
            self.write_unobserved(kind, value)?;
        }
        crate::dispatch::notify_variable_write(self, kind, value);
        Ok(())
    }

    fn write_unobserved(&self, kind: VariableWrite, value: &Tensor) -> Result<()> {
        if let Some(remote) = &self.0.remote {
            check_write(kind, &self.last_known(), value)?;
            return remote.write(kind, value);
        }
        let Some(d) = &self.0.distributed else {
            return self.write_primary(kind, value);
        };
        let replica = replica_context();
        if let Some(parts) = &d.per_replica {
            return match replica {
                Some(r) => {
                    let slot = parts.get(r.local_replica).ok_or_else(|| {
                        Error::invalid(
                            "assign",
                            format!(
                                "variable {:?} was created for {} replicas, this is replica {}",
                                self.name(),
                                parts.len(),
                                r.local_replica
                            ),
                        )
                    })?;
                    let current = slot.read().unwrap_or_else(|e| e.into_inner()).clone();
                    let new = apply_write(kind, &current, value)?;
                    *slot.write().unwrap_or_else(|e| e.into_inner()) = new;
                    Ok(())
                }
                None => {
                    // Cross-replica: every replica gets the value (a share of it when the
                    // replicas' values are summed on read, as TF does).
                    let share = if self.0.aggregation == VariableAggregation::Sum
                        && kind == VariableWrite::Assign
                    {
                        value.div(&value.scalar_like(parts.len() as f64)?)?
                    } else {
                        value.clone()
                    };
                    for slot in parts {
                        let current = slot.read().unwrap_or_else(|e| e.into_inner()).clone();
                        let new = apply_write(kind, &current, &share)?;
                        *slot.write().unwrap_or_else(|e| e.into_inner()) = new;
                    }
                    Ok(())
                }
            };
        }
        let Some(r) = replica.filter(|r| r.num_replicas_in_sync > 1) else {
            return self.write_primary(kind, value);
        };
        if self.0.aggregation == VariableAggregation::None {
            return Err(Error::invalid(
                kind.name(),
                format!(
                    "variable {:?} is mirrored by {}: updating it in a replica's step needs an \
                     aggregation (Sum, Mean or OnlyFirstReplica); create it with one, or update \
                     it outside `run` (TF: \"You must specify an aggregation method to update \
                     a MirroredVariable in Replica Context\")",
                    self.name(),
                    d.strategy
                ),
            ));
        }
        let current = self.primary();
        check_write(kind, &current, value)?;
        let mut pending = d.pending.lock().unwrap_or_else(|e| e.into_inner());
        pending.push(value.to_device(current.device())?);
        if !r.is_last_local() {
            return Ok(());
        }
        let values = std::mem::take(&mut *pending);
        drop(pending);
        let combined = combine_replica_writes(self, &r, values)?;
        self.write_primary(kind, &combined)
    }

    fn write_primary(&self, kind: VariableWrite, value: &Tensor) -> Result<()> {
        let mut slot = self.0.value.write().unwrap_or_else(|e| e.into_inner());
        let new = apply_write(kind, &slot, value)?;
        *slot = new;
        if let Some(d) = &self.0.distributed {
            d.copies.lock().unwrap_or_else(|e| e.into_inner()).clear();
        }
        Ok(())
    }
}

/// The update the local replicas' writes of one step make together.
fn combine_replica_writes(var: &Variable, r: &ReplicaInfo, values: Vec<Tensor>) -> Result<Tensor> {
    if values.len() != r.num_local_replicas {
        return Err(Error::invalid(
            "assign",
            format!(
                "mirrored variable {:?} was written by {} of the {} local replicas in this step; \
                 every replica must write it",
                var.name(),
                values.len(),
                r.num_local_replicas
            ),
        ));
    }
    let mut values = values.into_iter();
    let first = values
        .next()
        .ok_or_else(|| Error::invalid("assign", "no replica wrote"))?;
    if var.aggregation() == VariableAggregation::OnlyFirstReplica {
        return Ok(first);
    }
    let mut total = first;
    for v in values {
        total = total.add(&v)?;
    }
    if let Some(cross) = &r.cross_worker {
        total = cross
            .all_reduce_sum(vec![total])?
            .pop()
            .ok_or_else(|| Error::invalid("assign", "the cross-worker sum returned nothing"))?;
    }
    if var.aggregation() == VariableAggregation::Mean {
        total = total.div(&total.scalar_like(r.num_replicas_in_sync as f64)?)?;
    }
    Ok(total)
}

fn check_write(kind: VariableWrite, current: &Tensor, value: &Tensor) -> Result<()> {
    if current.shape() != value.shape() {
        return Err(Error::ShapeMismatch {
            op: kind.name(),
            msg: "the new value's shape differs from the variable's",
            lhs: current.shape().to_vec(),
            rhs: value.shape().to_vec(),
        });
    }
    if current.dtype() != value.dtype() {
        return Err(Error::DTypeMismatch {
            op: kind.name(),
            lhs: current.dtype(),
            rhs: value.dtype(),
        });
    }
    Ok(())
}

/// `current` after the write, on `current`'s device.
fn apply_write(kind: VariableWrite, current: &Tensor, value: &Tensor) -> Result<Tensor> {
    check_write(kind, current, value)?;
    let value = if value.device() != current.device() {
        value.to_device(current.device())?
    } else {
        value.clone()
    };
    match kind {
        VariableWrite::Assign => Ok(value),
        VariableWrite::Add => current.add(&value),
        VariableWrite::Sub => current.sub(&value),
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
