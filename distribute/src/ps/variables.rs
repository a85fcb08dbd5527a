//! Variables on parameter servers: the handle a worker or the chief reads, writes and
//! updates a variable through ([`PsVariable`], behind `ferroflow_tensor::Variable`), how
//! variables are placed on the ps tasks, and the partitioners that shard large ones.

use super::store::{
    ApplyAllRequest, ApplyRequest, CreateRequest, Empty, PullRequest, UpdateWire, WriteRequest,
};
use super::wire::{decode, encode};
use ferroflow_cluster::{Peer, PendingCall};
use ferroflow_tensor::distribution::{
    RemoteUpdate, RemoteVariable, VariablePlacement, VariableWrite,
};
use ferroflow_tensor::{DType, Error, Result, Tensor, Variable, VariableSynchronization};
use std::ops::Range;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, Weak};

/// How many shards a variable of `shape` and `dtype` is split into along its first axis
/// (TF's `tf.distribute.experimental.partitioners`). Scalars are never split, and no
/// variable gets more shards than rows.
pub trait VariablePartitioner: Send + Sync {
    /// The number of shards wanted (1: not split).
    fn num_shards(&self, shape: &[usize], dtype: DType) -> usize;
}

/// A fixed number of shards (`FixedShardsPartitioner(num_shards)`).
///
/// ```
/// use ferroflow_distribute::{FixedShardsPartitioner, VariablePartitioner};
/// let p = FixedShardsPartitioner { num_shards: 2 };
/// assert_eq!(p.num_shards(&[10, 4], ferroflow_tensor::DType::F32), 2);
/// ```
#[derive(Debug, Clone, Copy)]
pub struct FixedShardsPartitioner {
    /// How many shards.
    pub num_shards: usize,
}

impl VariablePartitioner for FixedShardsPartitioner {
    fn num_shards(&self, _shape: &[usize], _dtype: DType) -> usize {
        self.num_shards
    }
}

/// As many shards as keep each at least `min_shard_bytes`, at most `max_shards`
/// (`MinSizePartitioner`; TF's defaults: 256 KiB, 1 shard).
///
/// ```
/// use ferroflow_distribute::{MinSizePartitioner, VariablePartitioner};
/// let p = MinSizePartitioner { min_shard_bytes: 1024, max_shards: 4 };
/// // 100 rows of 8 f32: 3200 bytes, 3 shards of at least 1024 bytes.
/// assert_eq!(p.num_shards(&[100, 8], ferroflow_tensor::DType::F32), 3);
/// ```
#[derive(Debug, Clone, Copy)]
pub struct MinSizePartitioner {
    /// The smallest shard wanted, in bytes.
    pub min_shard_bytes: usize,
    /// The most shards.
    pub max_shards: usize,
}

impl Default for MinSizePartitioner {
    fn default() -> Self {
        MinSizePartitioner {
            min_shard_bytes: 256 << 10,
            max_shards: 1,
        }
    }
}

impl VariablePartitioner for MinSizePartitioner {
    fn num_shards(&self, shape: &[usize], dtype: DType) -> usize {
        let bytes = shape.iter().product::<usize>() * dtype.size_in_bytes();
        (bytes / self.min_shard_bytes.max(1)).clamp(1, self.max_shards.max(1))
    }
}

/// As few shards as keep each at most `max_shard_bytes` (`MaxSizePartitioner`), at most
/// `max_shards` when given.
///
/// ```
/// use ferroflow_distribute::{MaxSizePartitioner, VariablePartitioner};
/// let p = MaxSizePartitioner { max_shard_bytes: 1024, max_shards: None };
/// assert_eq!(p.num_shards(&[100, 8], ferroflow_tensor::DType::F32), 4);
/// ```
#[derive(Debug, Clone, Copy)]
pub struct MaxSizePartitioner {
    /// The largest shard wanted, in bytes.
    pub max_shard_bytes: usize,
    /// The most shards, if bounded.
    pub max_shards: Option<usize>,
}

impl VariablePartitioner for MaxSizePartitioner {
    fn num_shards(&self, shape: &[usize], dtype: DType) -> usize {
        let bytes = shape.iter().product::<usize>() * dtype.size_in_bytes();
        let n = bytes.div_ceil(self.max_shard_bytes.max(1)).max(1);
        self.max_shards.map_or(n, |m| n.min(m.max(1)))
    }
}

/// Rows of `rows` split into `n` runs as `numpy.array_split` does (the first `rows % n`
/// runs one row longer).
fn row_ranges(rows: usize, n: usize) -> Vec<Range<usize>> {
    let (base, extra) = (rows / n, rows % n);
    let mut start = 0;
    (0..n)
        .map(|i| {
            let len = base + usize::from(i < extra);
            let r = start..start + len;
            start += len;
            r
        })
        .collect()
}

/// Whether this process is the chief (its creations replace what a ps holds; its reads
/// always fetch) or a worker (its creations keep what is there; its reads in a scheduled
/// function come from the values fetched when the function started).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Role {
    Chief,
    Worker,
}

/// This process' connections to the parameter servers and every variable it placed on
/// them.
pub(crate) struct PsClient {
    peers: Vec<Peer>,
    role: Role,
    /// Worker: the scheduled function running (0: none; reads then always fetch).
    generation: AtomicU64,
    /// Worker: the function whose values were fetched (on the first read in it).
    fetched: AtomicU64,
    variables: Mutex<Vec<Weak<PsVariable>>>,
    next_index: AtomicUsize,
    next_ps: AtomicUsize,
    partitioner: Option<Arc<dyn VariablePartitioner>>,
    /// Worker: the updates of the function running, per ps, sent together (one
    /// `ps.apply_all` per ps) when the function ends or something reads or writes first.
    outbox: Mutex<Vec<Vec<(ApplyRequest, Tensor)>>>,
}

/// One part of a variable on one ps: rows `rows` of its first axis (all of a variable
/// that is not sharded).
#[derive(Clone)]
struct Shard {
    ps: usize,
    key: String,
    rows: Range<usize>,
}

struct State {
    /// The value to create the variable with on first use; `None` once created.
    initial: Option<Tensor>,
    /// The value fetched in the scheduled function `.0`.
    cache: Option<(u64, Tensor)>,
    /// An update of it was queued or sent and may not be answered yet.
    unsettled: bool,
}

/// A variable (or optimizer slot) held by parameter servers.
pub(crate) struct PsVariable {
    client: Arc<PsClient>,
    name: String,
    shards: Vec<Shard>,
    is_slot: bool,
    /// Where this process computes with the variable (values from the ps go there).
    device: ferroflow_tensor::Device,
    state: Mutex<State>,
}

impl PsClient {
    pub(crate) fn new(
        peers: Vec<Peer>,
        role: Role,
        partitioner: Option<Arc<dyn VariablePartitioner>>,
    ) -> Arc<PsClient> {
        Arc::new(PsClient {
            peers,
            role,
            generation: AtomicU64::new(0),
            fetched: AtomicU64::new(0),
            variables: Mutex::new(vec![]),
            next_index: AtomicUsize::new(0),
            next_ps: AtomicUsize::new(0),
            partitioner,
            outbox: Mutex::new(vec![]),
        })
    }

    pub(crate) fn num_ps(&self) -> usize {
        self.peers.len()
    }

    pub(crate) fn peer(&self, ps: usize) -> &Peer {
        &self.peers[ps]
    }

    /// Places a variable created in the strategy's scope: every one but sync-on-read
    /// variables (metrics, which each process keeps for itself).
    pub(crate) fn place(
        self: &Arc<Self>,
        p: &VariablePlacement<'_>,
    ) -> Option<Arc<dyn RemoteVariable>> {
        if p.synchronization == VariableSynchronization::OnRead || self.peers.is_empty() {
            return None;
        }
        let index = self.next_index.fetch_add(1, Ordering::Relaxed);
        let key = format!("{index}:{}", p.name);
        let shape = p.initial.shape();
        let rows = shape.first().copied().unwrap_or(1);
        let n = match (&self.partitioner, shape.is_empty()) {
            (Some(part), false) => part
                .num_shards(shape, p.initial.dtype())
                .clamp(1, rows.max(1)),
            _ => 1,
        };
        let shards = if n == 1 {
            vec![Shard {
                ps: self.next_ps.fetch_add(1, Ordering::Relaxed) % self.peers.len(),
                key,
                rows: 0..rows,
            }]
        } else {
            row_ranges(rows, n)
                .into_iter()
                .enumerate()
                .map(|(i, r)| Shard {
                    ps: self.next_ps.fetch_add(1, Ordering::Relaxed) % self.peers.len(),
                    key: format!("{key}/part_{i}"),
                    rows: r,
                })
                .collect()
        };
        Some(self.register(p.name.to_string(), shards, false, p.initial.clone()))
    }

    fn register(
        self: &Arc<Self>,
        name: String,
        shards: Vec<Shard>,
        is_slot: bool,
        initial: Tensor,
    ) -> Arc<PsVariable> {
        let v = Arc::new(PsVariable {
            client: self.clone(),
            name,
            shards,
            is_slot,
            device: initial.device(),
            state: Mutex::new(State {
                initial: Some(initial),
                cache: None,
                unsettled: false,
            }),
        });
        let mut all = self.variables.lock().unwrap_or_else(|e| e.into_inner());
        all.retain(|w| w.strong_count() > 0);
        all.push(Arc::downgrade(&v));
        v
    }

    fn live(&self) -> Vec<Arc<PsVariable>> {
        self.variables
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .iter()
            .filter_map(Weak::upgrade)
            .collect()
    }

    /// Creates on the ps every variable not created yet (the chief does before it schedules
    /// functions, so workers find the chief's values).
    pub(crate) fn create_pending(&self) -> Result<()> {
        for v in self.live() {
            let mut st = v.lock();
            v.ensure_created(&mut st)?;
        }
        Ok(())
    }

    /// The ps that holds `key`: a shard of a variable of this process, or a slot of one
    /// (`<shard key>/<slot>`).
    pub(crate) fn ps_of_key(&self, key: &str) -> Option<usize> {
        self.live().iter().find_map(|v| {
            v.shards.iter().find_map(|s| {
                let slot_of = key
                    .strip_prefix(s.key.as_str())
                    .is_some_and(|rest| rest.starts_with('/') && !rest[1..].contains('/'));
                (key == s.key || slot_of).then_some(s.ps)
            })
        })
    }

    /// A worker starting a scheduled function: its first read of a variable fetches every
    /// variable (one request per ps), which its other reads then use.
    pub(crate) fn begin_function(&self) {
        self.generation.fetch_add(1, Ordering::Relaxed);
    }

    /// Creates what is not created yet and fetches every variable, one request per ps, for
    /// the reads of the function running.
    fn fetch_all(&self) -> Result<()> {
        let generation = self.generation.load(Ordering::Relaxed);
        self.fetched.store(generation, Ordering::Relaxed);
        let vars: Vec<Arc<PsVariable>> = self.live().into_iter().filter(|v| !v.is_slot).collect();
        let mut keys: Vec<Vec<(usize, usize)>> = vec![vec![]; self.peers.len()];
        for (i, v) in vars.iter().enumerate() {
            let mut st = v.lock();
            v.ensure_created(&mut st)?;
            v.wait_pending(&mut st)?;
            for (s, shard) in v.shards.iter().enumerate() {
                keys[shard.ps].push((i, s));
            }
        }
        let calls: Vec<(usize, PendingCall)> = keys
            .iter()
            .enumerate()
            .filter(|(_, k)| !k.is_empty())
            .map(|(ps, k)| {
                let req = PullRequest {
                    keys: k
                        .iter()
                        .map(|&(i, s)| vars[i].shards[s].key.clone())
                        .collect(),
                };
                let payload = encode(&req, &[])?;
                Ok((ps, self.peers[ps].start_call("ps.pull", payload, false)))
            })
            .collect::<Result<_>>()?;
        let mut parts: Vec<Vec<Option<Tensor>>> =
            vars.iter().map(|v| vec![None; v.shards.len()]).collect();
        for (ps, call) in calls {
            let reply = call.wait()?;
            let (_, tensors): (Empty, _) = decode("ps.pull reply", &reply)?;
            if tensors.len() != keys[ps].len() {
                return Err(Error::invalid(
                    "ps.pull",
                    format!(
                        "{} sent {} values for {} keys",
                        self.peers[ps].name(),
                        tensors.len(),
                        keys[ps].len()
                    ),
                ));
            }
            for (&(i, s), t) in keys[ps].iter().zip(tensors) {
                parts[i][s] = Some(t);
            }
        }
        for (v, p) in vars.iter().zip(parts) {
            let p: Vec<Tensor> = p.into_iter().flatten().collect();
            let value = v.join_shards(p)?;
            v.lock().cache = Some((generation, value));
        }
        Ok(())
    }

    /// A worker ending a scheduled function: waits for the answers to every update it sent
    /// (the first failure is the function's error); later reads fetch again.
    pub(crate) fn end_function(&self) -> Result<()> {
        let settled = self.settle_updates();
        self.generation.fetch_add(1, Ordering::Relaxed);
        settled
    }

    /// Sends the updates queued in the outbox, one `ps.apply_all` per ps, and waits for
    /// their answers; the first failure.
    fn settle_updates(&self) -> Result<()> {
        let queued = std::mem::take(&mut *self.outbox.lock().unwrap_or_else(|e| e.into_inner()));
        let mut first = Ok(());
        let mut sent: Vec<PendingCall> = Vec::with_capacity(queued.len());
        for (ps, updates) in queued.into_iter().enumerate() {
            if updates.is_empty() {
                continue;
            }
            let (requests, gradients): (Vec<ApplyRequest>, Vec<Tensor>) =
                updates.into_iter().unzip();
            match encode(&ApplyAllRequest { updates: requests }, &gradients) {
                Ok(payload) => sent.push(self.peers[ps].start_call("ps.apply_all", payload, false)),
                Err(e) => {
                    if first.is_ok() {
                        first = Err(e);
                    }
                }
            }
        }
        for call in sent {
            if let Err(e) = call.wait() {
                if first.is_ok() {
                    first = Err(e);
                }
            }
        }
        first
    }

    /// The scheduled function running, if any (a worker's reads in it use one fetch).
    fn current_generation(&self) -> Option<u64> {
        match self.role {
            Role::Worker => Some(self.generation.load(Ordering::Relaxed)),
            Role::Chief => None,
        }
    }
}

impl PsVariable {
    fn lock(&self) -> std::sync::MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }

    fn ensure_created(&self, st: &mut State) -> Result<()> {
        let Some(initial) = st.initial.take() else {
            return Ok(());
        };
        let parts = match self.split(&initial) {
            Ok(p) => p,
            Err(e) => {
                st.initial = Some(initial);
                return Err(e);
            }
        };
        let calls: Vec<PendingCall> = self
            .shards
            .iter()
            .zip(parts)
            .map(|(shard, part)| {
                let req = CreateRequest {
                    key: shard.key.clone(),
                    name: self.name.clone(),
                    overwrite: self.client.role == Role::Chief,
                };
                Ok(self.client.peers[shard.ps].start_call(
                    "ps.create",
                    encode(&req, &[part])?,
                    true,
                ))
            })
            .collect::<Result<_>>()?;
        let mut outcome = Ok(());
        for c in calls {
            if let Err(e) = c.wait() {
                if outcome.is_ok() {
                    outcome = Err(e);
                }
            }
        }
        if outcome.is_err() {
            st.initial = Some(initial);
        }
        outcome
    }

    /// Settles this process' updates (all of them: they travel together) when one of this
    /// variable's may be unanswered, before a read or write of it sees the ps.
    fn wait_pending(&self, st: &mut State) -> Result<()> {
        if !std::mem::take(&mut st.unsettled) {
            return Ok(());
        }
        self.client.settle_updates()
    }

    /// `value` cut into this variable's shards.
    fn split(&self, value: &Tensor) -> Result<Vec<Tensor>> {
        if self.shards.len() == 1 {
            return Ok(vec![value.clone()]);
        }
        let sizes: Vec<usize> = self.shards.iter().map(|s| s.rows.len()).collect();
        value.split(&sizes, 0)
    }

    fn join_shards(&self, mut parts: Vec<Tensor>) -> Result<Tensor> {
        if parts.len() != self.shards.len() {
            return Err(Error::invalid(
                "ps.pull",
                format!(
                    "variable {:?}: {} of its {} shards came back",
                    self.name,
                    parts.len(),
                    self.shards.len()
                ),
            ));
        }
        let whole = if parts.len() == 1 {
            parts.remove(0)
        } else {
            Tensor::concat(&parts, 0)?
        };
        if whole.device() == self.device {
            Ok(whole)
        } else {
            whole.to_device(self.device)
        }
    }

    fn fetch(&self) -> Result<Tensor> {
        let calls: Vec<PendingCall> = self
            .shards
            .iter()
            .map(|shard| {
                let req = PullRequest {
                    keys: vec![shard.key.clone()],
                };
                Ok(self.client.peers[shard.ps].start_call("ps.pull", encode(&req, &[])?, false))
            })
            .collect::<Result<_>>()?;
        let mut parts = Vec::with_capacity(calls.len());
        for c in calls {
            let reply = c.wait()?;
            let (_, mut t): (Empty, Vec<Tensor>) = decode("ps.pull reply", &reply)?;
            if t.len() != 1 {
                return Err(Error::invalid(
                    "ps.pull",
                    format!("{} values for one key", t.len()),
                ));
            }
            parts.push(t.remove(0));
        }
        self.join_shards(parts)
    }

    /// Where each shard lives: (ps task index, rows).
    pub(crate) fn shard_places(&self) -> Vec<(usize, Range<usize>)> {
        self.shards.iter().map(|s| (s.ps, s.rows.clone())).collect()
    }
}

impl RemoteVariable for PsVariable {
    fn read(&self) -> Result<Tensor> {
        let generation = self.client.current_generation();
        if let Some(g) = generation {
            // The function's first read fetches every variable at once.
            if !self.is_slot && self.client.fetched.load(Ordering::Relaxed) != g {
                self.client.fetch_all()?;
            }
        }
        let mut st = self.lock();
        self.ensure_created(&mut st)?;
        self.wait_pending(&mut st)?;
        if let (Some(g), Some((cached_g, v))) = (generation, &st.cache) {
            if g == *cached_g {
                return Ok(v.clone());
            }
        }
        let v = self.fetch()?;
        st.cache = generation.map(|g| (g, v.clone()));
        Ok(v)
    }

    fn write(&self, kind: VariableWrite, value: &Tensor) -> Result<()> {
        let mut st = self.lock();
        self.ensure_created(&mut st)?;
        self.wait_pending(&mut st)?;
        st.cache = None;
        let value = value.to_device(ferroflow_tensor::Device::CPU)?;
        let calls: Vec<PendingCall> = self
            .shards
            .iter()
            .zip(self.split(&value)?)
            .map(|(shard, part)| {
                let req = WriteRequest {
                    key: shard.key.clone(),
                    kind: kind.into(),
                };
                Ok(self.client.peers[shard.ps].start_call(
                    "ps.write",
                    encode(&req, &[part])?,
                    false,
                ))
            })
            .collect::<Result<_>>()?;
        let mut first = Ok(());
        for c in calls {
            if let Err(e) = c.wait() {
                if first.is_ok() {
                    first = Err(e);
                }
            }
        }
        first
    }

    fn apply(
        &self,
        update: &RemoteUpdate,
        gradient: &Tensor,
        slots: &[&dyn RemoteVariable],
    ) -> Result<()> {
        let slots: Vec<&PsVariable> = slots
            .iter()
            .map(|s| {
                s.as_any()
                    .downcast_ref::<PsVariable>()
                    .filter(|s| s.shards.len() == self.shards.len())
                    .ok_or_else(|| {
                        Error::invalid(
                            "apply_gradients",
                            format!("a slot of {:?} is not kept with it on its ps", self.name),
                        )
                    })
            })
            .collect::<Result<_>>()?;
        for s in &slots {
            let mut st = s.lock();
            s.ensure_created(&mut st)?;
            st.cache = None;
        }
        let mut st = self.lock();
        self.ensure_created(&mut st)?;
        st.cache = None;
        st.unsettled = true;
        drop(st);
        let gradient = gradient.to_device(ferroflow_tensor::Device::CPU)?;
        let wire = UpdateWire::from(update);
        {
            let mut outbox = self.client.outbox.lock().unwrap_or_else(|e| e.into_inner());
            outbox.resize_with(self.client.peers.len(), Vec::new);
            for (i, (shard, part)) in self.shards.iter().zip(self.split(&gradient)?).enumerate() {
                let req = ApplyRequest {
                    key: shard.key.clone(),
                    slots: slots.iter().map(|s| s.shards[i].key.clone()).collect(),
                    update: wire,
                };
                outbox[shard.ps].push((req, part));
            }
        }
        // The chief's updates apply before it goes on; a worker's go with the others of its
        // function (at its end, or before something reads or writes).
        if self.client.role == Role::Chief {
            return self.client.settle_updates();
        }
        Ok(())
    }

    fn slot(&self, name: &str, initial: &Tensor) -> Arc<dyn RemoteVariable> {
        let shards = self
            .shards
            .iter()
            .map(|s| Shard {
                ps: s.ps,
                key: format!("{}/{name}", s.key),
                rows: s.rows.clone(),
            })
            .collect();
        self.client.register(
            format!("{}/{name}", self.name),
            shards,
            true,
            initial.clone(),
        )
    }

    fn location(&self) -> String {
        let names: Vec<&str> = self
            .shards
            .iter()
            .map(|s| self.client.peers[s.ps].name())
            .collect();
        if names.len() == 1 {
            names[0].to_string()
        } else {
            format!("sharded over {}", names.join(", "))
        }
    }

    fn as_any(&self) -> &dyn std::any::Any {
        self
    }
}

/// A variable split over several parameter servers along its first axis (TF's
/// `ShardedVariable`), as a partitioner asked. It is an ordinary [`Variable`] to layers and
/// optimizers (reads join the shards, updates apply per shard on each shard's ps); this
/// view tells where the shards are.
///
/// ```no_run
/// # fn f(v: &ferroflow_tensor::Variable) {
/// if let Some(sharded) = ferroflow_distribute::ShardedVariable::of(v) {
///     for (ps, rows) in sharded.shards() {
///         println!("/job:ps/task:{ps} holds rows {rows:?}");
///     }
/// }
/// # }
/// ```
#[derive(Clone)]
pub struct ShardedVariable {
    variable: Variable,
    shards: Vec<(usize, Range<usize>)>,
}

impl ShardedVariable {
    /// The sharded view of `variable` when it is held by parameter servers in more than one
    /// shard.
    pub fn of(variable: &Variable) -> Option<ShardedVariable> {
        let ps = variable.remote()?.as_any().downcast_ref::<PsVariable>()?;
        (ps.shards.len() > 1).then(|| ShardedVariable {
            variable: variable.clone(),
            shards: ps.shard_places(),
        })
    }
    /// The variable.
    pub fn variable(&self) -> &Variable {
        &self.variable
    }
    /// Each shard's ps task index and the rows of the first axis it holds, in order.
    pub fn shards(&self) -> &[(usize, Range<usize>)] {
        &self.shards
    }
}
