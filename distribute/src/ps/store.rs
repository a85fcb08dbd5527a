//! What a parameter server holds and the methods it serves: variables (and their
//! optimizer slots) by key, created, read, written and updated by the chief and the
//! workers.
//!
//! | method | request | reply |
//! |---|---|---|
//! | `ps.create` | key, name, overwrite; the initial value | — |
//! | `ps.pull` | keys | their values |
//! | `ps.write` | key, assign / assign_add / assign_sub; the value | — |
//! | `ps.apply` | key, slot keys, the update; the gradient | — |
//! | `ps.apply_all` | several `ps.apply` requests; their gradients in order | — |
//! | `ps.list` | — | every key with its variable's name |
//!
//! Each variable has its own lock: an update reads and writes the variable and its slots
//! under the variable's lock (slots are only ever locked after their variable), so
//! concurrent updates from several workers each apply whole, in some order.

use super::wire::{decode, encode};
use bytes::Bytes;
use ferroflow_cluster::TaskServer;
use ferroflow_tensor::distribution::{RemoteUpdate, VariableWrite};
use ferroflow_tensor::{Error, Result, Tensor, UpdateRule};
use serde::{Deserialize, Serialize};
use std::collections::HashMap;
use std::sync::{Arc, Mutex, RwLock};

/// One variable or slot a parameter server holds.
struct Entry {
    name: String,
    value: Mutex<Tensor>,
}

/// The variables of one parameter server.
#[derive(Default)]
pub(crate) struct Store {
    entries: RwLock<HashMap<String, Arc<Entry>>>,
}

#[derive(Serialize, Deserialize)]
pub(crate) struct CreateRequest {
    pub key: String,
    pub name: String,
    /// Replace a value already there (the chief's creation and restores); else keep it
    /// (a worker creating the variables the chief may already have created).
    pub overwrite: bool,
}

#[derive(Serialize, Deserialize)]
pub(crate) struct PullRequest {
    pub keys: Vec<String>,
}

#[derive(Serialize, Deserialize)]
pub(crate) struct WriteRequest {
    pub key: String,
    pub kind: WriteKind,
}

/// [`VariableWrite`] on the wire.
#[derive(Serialize, Deserialize, Clone, Copy)]
pub(crate) enum WriteKind {
    Assign,
    Add,
    Sub,
}

impl From<VariableWrite> for WriteKind {
    fn from(w: VariableWrite) -> WriteKind {
        match w {
            VariableWrite::Assign => WriteKind::Assign,
            VariableWrite::Add => WriteKind::Add,
            VariableWrite::Sub => WriteKind::Sub,
        }
    }
}

/// Several updates in one message (a worker's updates of one function to one ps): the
/// gradients are the message's tensors, in order.
#[derive(Serialize, Deserialize)]
pub(crate) struct ApplyAllRequest {
    pub updates: Vec<ApplyRequest>,
}

#[derive(Serialize, Deserialize)]
pub(crate) struct ApplyRequest {
    pub key: String,
    pub slots: Vec<String>,
    pub update: UpdateWire,
}

/// [`RemoteUpdate`] on the wire.
#[derive(Serialize, Deserialize, Clone, Copy, Debug, PartialEq)]
pub(crate) enum UpdateWire {
    GradientDescent {
        lr: f64,
    },
    SgdMomentum {
        lr: f64,
        momentum: f64,
        nesterov: bool,
    },
    Adam {
        lr_t: f64,
        beta_1: f64,
        beta_2: f64,
        epsilon: f64,
        decay: f64,
    },
    RmsProp {
        lr: f64,
        rho: f64,
        epsilon: f64,
        centered: bool,
    },
    Adagrad {
        lr: f64,
        epsilon: f64,
    },
    Adadelta {
        lr: f64,
        rho: f64,
        epsilon: f64,
    },
    Adamax {
        lr_t: f64,
        beta_1: f64,
        beta_2: f64,
        epsilon: f64,
    },
}

impl From<&RemoteUpdate> for UpdateWire {
    fn from(u: &RemoteUpdate) -> UpdateWire {
        match *u {
            RemoteUpdate::GradientDescent { lr } => UpdateWire::GradientDescent { lr },
            RemoteUpdate::Rule(r) => match r {
                UpdateRule::SgdMomentum {
                    lr,
                    momentum,
                    nesterov,
                } => UpdateWire::SgdMomentum {
                    lr,
                    momentum,
                    nesterov,
                },
                UpdateRule::Adam {
                    lr_t,
                    beta_1,
                    beta_2,
                    epsilon,
                    decay,
                } => UpdateWire::Adam {
                    lr_t,
                    beta_1,
                    beta_2,
                    epsilon,
                    decay,
                },
                UpdateRule::RmsProp {
                    lr,
                    rho,
                    epsilon,
                    centered,
                } => UpdateWire::RmsProp {
                    lr,
                    rho,
                    epsilon,
                    centered,
                },
                UpdateRule::Adagrad { lr, epsilon } => UpdateWire::Adagrad { lr, epsilon },
                UpdateRule::Adadelta { lr, rho, epsilon } => {
                    UpdateWire::Adadelta { lr, rho, epsilon }
                }
                UpdateRule::Adamax {
                    lr_t,
                    beta_1,
                    beta_2,
                    epsilon,
                } => UpdateWire::Adamax {
                    lr_t,
                    beta_1,
                    beta_2,
                    epsilon,
                },
            },
        }
    }
}

impl UpdateWire {
    /// Plain gradient descent's learning rate (`None` for the fused rules).
    fn gradient_descent_lr(self) -> Option<f64> {
        match self {
            UpdateWire::GradientDescent { lr } => Some(lr),
            _ => None,
        }
    }

    /// The fused rule, or `None` for plain gradient descent.
    fn rule(self) -> Option<UpdateRule> {
        Some(match self {
            UpdateWire::GradientDescent { .. } => return None,
            UpdateWire::SgdMomentum {
                lr,
                momentum,
                nesterov,
            } => UpdateRule::SgdMomentum {
                lr,
                momentum,
                nesterov,
            },
            UpdateWire::Adam {
                lr_t,
                beta_1,
                beta_2,
                epsilon,
                decay,
            } => UpdateRule::Adam {
                lr_t,
                beta_1,
                beta_2,
                epsilon,
                decay,
            },
            UpdateWire::RmsProp {
                lr,
                rho,
                epsilon,
                centered,
            } => UpdateRule::RmsProp {
                lr,
                rho,
                epsilon,
                centered,
            },
            UpdateWire::Adagrad { lr, epsilon } => UpdateRule::Adagrad { lr, epsilon },
            UpdateWire::Adadelta { lr, rho, epsilon } => UpdateRule::Adadelta { lr, rho, epsilon },
            UpdateWire::Adamax {
                lr_t,
                beta_1,
                beta_2,
                epsilon,
            } => UpdateRule::Adamax {
                lr_t,
                beta_1,
                beta_2,
                epsilon,
            },
        })
    }
}

/// `ps.list`'s reply: (key, variable name) of everything the ps holds, sorted by key.
#[derive(Serialize, Deserialize)]
pub(crate) struct ListReply {
    pub entries: Vec<(String, String)>,
}

/// No fields (a request or reply that is only its tensors, or nothing).
#[derive(Serialize, Deserialize)]
pub(crate) struct Empty {}

fn one(what: &str, mut tensors: Vec<Tensor>, n: usize) -> Result<Vec<Tensor>> {
    if tensors.len() != n {
        return Err(Error::invalid(
            "ps",
            format!("{what} carries {} tensors, it needs {n}", tensors.len()),
        ));
    }
    tensors.truncate(n);
    Ok(tensors)
}

fn shapes_agree(op: &'static str, key: &str, current: &Tensor, value: &Tensor) -> Result<()> {
    if current.shape() != value.shape() || current.dtype() != value.dtype() {
        return Err(Error::invalid(
            op,
            format!(
                "variable {key:?} is {} {:?} on this ps, the value is {} {:?}",
                current.dtype(),
                current.shape(),
                value.dtype(),
                value.shape()
            ),
        ));
    }
    Ok(())
}

impl Store {
    fn entry(&self, op: &'static str, key: &str) -> Result<Arc<Entry>> {
        self.entries
            .read()
            .unwrap_or_else(|e| e.into_inner())
            .get(key)
            .cloned()
            .ok_or_else(|| {
                Error::invalid(
                    op,
                    format!(
                        "this ps holds no variable {key:?} (was it created through the \
                         strategy, and has this ps restarted since? then restore a checkpoint)"
                    ),
                )
            })
    }

    fn create(&self, payload: &[u8]) -> Result<Bytes> {
        let (req, t): (CreateRequest, _) = decode("ps.create request", payload)?;
        let value = one("ps.create", t, 1)?.remove(0);
        let mut entries = self.entries.write().unwrap_or_else(|e| e.into_inner());
        match entries.get(&req.key) {
            Some(e) if !req.overwrite => {
                let current = e.value.lock().unwrap_or_else(|e| e.into_inner());
                shapes_agree("ps.create", &req.key, &current, &value).map_err(|err| {
                    Error::invalid(
                        "ps.create",
                        format!(
                            "{err}: the chief and the workers must create the same variables in \
                             the same order ({:?} here, {:?} from the caller)",
                            e.name, req.name
                        ),
                    )
                })?;
            }
            _ => {
                entries.insert(
                    req.key,
                    Arc::new(Entry {
                        name: req.name,
                        value: Mutex::new(value),
                    }),
                );
            }
        }
        encode(&Empty {}, &[])
    }

    fn pull(&self, payload: &[u8]) -> Result<Bytes> {
        let (req, _): (PullRequest, Vec<Tensor>) = decode("ps.pull request", payload)?;
        let values = req
            .keys
            .iter()
            .map(|k| {
                let e = self.entry("ps.pull", k)?;
                let v = e.value.lock().unwrap_or_else(|e| e.into_inner()).clone();
                Ok(v)
            })
            .collect::<Result<Vec<_>>>()?;
        encode(&Empty {}, &values)
    }

    fn write(&self, payload: &[u8]) -> Result<Bytes> {
        let (req, t): (WriteRequest, _) = decode("ps.write request", payload)?;
        let value = one("ps.write", t, 1)?.remove(0);
        let e = self.entry("ps.write", &req.key)?;
        let mut current = e.value.lock().unwrap_or_else(|e| e.into_inner());
        shapes_agree("ps.write", &req.key, &current, &value)?;
        *current = match req.kind {
            WriteKind::Assign => value,
            WriteKind::Add => current.add(&value)?,
            WriteKind::Sub => current.sub(&value)?,
        };
        encode(&Empty {}, &[])
    }

    fn apply(&self, payload: &[u8]) -> Result<Bytes> {
        let (req, t): (ApplyRequest, _) = decode("ps.apply request", payload)?;
        let gradient = one("ps.apply", t, 1)?.remove(0);
        self.apply_one(&req, &gradient)?;
        encode(&Empty {}, &[])
    }

    /// Applies each update of the message in order; the first that fails ends it (those
    /// before it stay applied, as separate `ps.apply` calls would).
    fn apply_all(&self, payload: &[u8]) -> Result<Bytes> {
        let (req, t): (ApplyAllRequest, _) = decode("ps.apply_all request", payload)?;
        let gradients = one("ps.apply_all", t, req.updates.len())?;
        for (update, gradient) in req.updates.iter().zip(&gradients) {
            self.apply_one(update, gradient)?;
        }
        encode(&Empty {}, &[])
    }

    fn apply_one(&self, req: &ApplyRequest, gradient: &Tensor) -> Result<()> {
        let var = self.entry("ps.apply", &req.key)?;
        let slots = req
            .slots
            .iter()
            .map(|k| self.entry("ps.apply", k))
            .collect::<Result<Vec<_>>>()?;
        let mut w = var.value.lock().unwrap_or_else(|e| e.into_inner());
        shapes_agree("ps.apply", &req.key, &w, gradient)?;
        match req.update.rule() {
            None => {
                if !slots.is_empty() {
                    return Err(Error::invalid(
                        "ps.apply",
                        "gradient descent takes no slots".to_string(),
                    ));
                }
                let lr = req.update.gradient_descent_lr().ok_or_else(|| {
                    Error::invalid("ps.apply", format!("{:?} has no update rule", req.update))
                })?;
                *w = w.sub(&gradient.mul(&gradient.scalar_like(lr)?)?)?;
            }
            Some(rule) => {
                if slots.len() != rule.num_slots() {
                    return Err(Error::invalid(
                        "ps.apply",
                        format!(
                            "{:?} needs {} slots, the request names {}",
                            req.update,
                            rule.num_slots(),
                            slots.len()
                        ),
                    ));
                }
                let mut guards: Vec<_> = slots
                    .iter()
                    .map(|s| s.value.lock().unwrap_or_else(|e| e.into_inner()))
                    .collect();
                let values: Vec<Tensor> = guards.iter().map(|g| (**g).clone()).collect();
                let (new_w, new_slots) = Tensor::optimizer_update(&rule, &w, gradient, &values)?;
                for (g, v) in guards.iter_mut().zip(new_slots) {
                    **g = v;
                }
                *w = new_w;
            }
        }
        Ok(())
    }

    fn list(&self) -> Result<Bytes> {
        let mut entries: Vec<(String, String)> = self
            .entries
            .read()
            .unwrap_or_else(|e| e.into_inner())
            .iter()
            .map(|(k, e)| (k.clone(), e.name.clone()))
            .collect();
        entries.sort();
        encode(&ListReply { entries }, &[])
    }
}

/// Serves the parameter-server methods on `server` from a new, empty store.
pub(crate) fn serve_parameters(server: &TaskServer) {
    let store = Arc::new(Store::default());
    let s = store.clone();
    server.handle("ps.create", move |b| s.create(&b));
    // Reads and updates are short (a copy, one fused update per variable): they run on the
    // server's runtime, without a hop to its blocking pool.
    let s = store.clone();
    server.handle_deferred("ps.pull", move |b, reply| reply.send(s.pull(&b)));
    let s = store.clone();
    server.handle("ps.write", move |b| s.write(&b));
    let s = store.clone();
    server.handle("ps.apply", move |b| s.apply(&b));
    let s = store.clone();
    server.handle_deferred("ps.apply_all", move |b, reply| reply.send(s.apply_all(&b)));
    server.handle("ps.list", move |_| store.list());
}
