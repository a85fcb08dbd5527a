//! [`Function`]: a closure traced into graphs, one per input signature (TF's
//! `tf.function` and its `ConcreteFunction`s).

use crate::graph::{Graph, GraphStats, ValueRef, ValueType};
use crate::passes::{
    eliminate_common_subexpressions, eliminate_dead_code, fuse_conv_max_pool, fuse_elementwise,
    fuse_matmul_bias, fuse_matmul_reduce, fuse_max_pool_bias_grad,
};
use crate::tape_op::TapeOp;
use crate::trace::trace;
use ferroflow_tensor::{DType, Device, Error, Result, Tensor};
use std::collections::HashMap;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};

/// Traces after which [`Function`] warns that it keeps retracing (TF warns after 5).
const RETRACE_WARNING: usize = 5;

/// The shape and dtype an argument must have (TF's `tf.TensorSpec`); `None` dimensions
/// accept any size.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct TensorSpec {
    /// Per dimension: a size, or `None` for any.
    pub shape: Vec<Option<usize>>,
    /// The dtype.
    pub dtype: DType,
}

impl TensorSpec {
    /// A spec from sizes (`None`: any) and a dtype.
    ///
    /// ```
    /// use ferroflow_function::TensorSpec;
    /// use ferroflow_tensor::DType;
    /// let images = TensorSpec::new(&[None, Some(784)], DType::F32);
    /// assert_eq!(images.to_string(), "TensorSpec(shape=(None, 784), dtype=float32)");
    /// ```
    pub fn new(shape: &[Option<usize>], dtype: DType) -> TensorSpec {
        TensorSpec {
            shape: shape.to_vec(),
            dtype,
        }
    }

    /// Whether `t` fits.
    pub fn accepts(&self, t: &Tensor) -> bool {
        t.dtype() == self.dtype
            && t.rank() == self.shape.len()
            && self
                .shape
                .iter()
                .zip(t.shape())
                .all(|(s, &d)| s.is_none_or(|s| s == d))
    }
}

impl std::fmt::Display for TensorSpec {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let dims: Vec<String> = self
            .shape
            .iter()
            .map(|d| d.map_or("None".to_string(), |d| d.to_string()))
            .collect();
        let trailing = if dims.len() == 1 { "," } else { "" };
        write!(
            f,
            "TensorSpec(shape=({}{trailing}), dtype={})",
            dims.join(", "),
            self.dtype
        )
    }
}

/// What a graph is specialised to: each argument's dtype, shape and device.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
struct Signature(Vec<(DType, Vec<usize>, Device)>);

impl Signature {
    fn of(args: &[Tensor]) -> Signature {
        Signature(
            args.iter()
                .map(|t| (t.dtype(), t.shape().to_vec(), t.device()))
                .collect(),
        )
    }
}

/// One traced, optimised graph for one signature (TF's `ConcreteFunction`).
#[derive(Debug)]
pub struct ConcreteFunction {
    graph: Graph,
    frees: Vec<Vec<ValueRef>>,
    stats: GraphStats,
    /// Each argument's type, read off the graph's `Arg` nodes once.
    input_types: Vec<Option<ValueType>>,
    /// It holds an output of `custom_gradient` (a tape outside it cannot differentiate it).
    custom_gradients: bool,
    /// The call as one op on tapes, per set of inputs the tapes track, built on the first
    /// such call (`None`: the graph does not qualify, and calls replay op by op).
    tape_ops: Mutex<HashMap<Vec<bool>, Option<Arc<TapeOp>>>>,
}

impl ConcreteFunction {
    pub(crate) fn new(mut graph: Graph, folded: usize) -> ConcreteFunction {
        // Outside any trace: the passes read small constants on the host, also when a
        // control-flow branch is optimised while its function traces.
        let _outside_the_trace = ferroflow_tensor::dispatch::init_scope();
        let traced_nodes = graph.nodes.len() + folded;
        let merged = eliminate_common_subexpressions(&mut graph);
        let dead = eliminate_dead_code(&mut graph);
        let fused = fuse_matmul_bias(&mut graph)
            + fuse_conv_max_pool(&mut graph)
            + fuse_max_pool_bias_grad(&mut graph)
            + fuse_elementwise(&mut graph)
            + fuse_matmul_reduce(&mut graph);
        let mut function = ConcreteFunction::from_graph(graph);
        function.stats = GraphStats {
            traced_nodes,
            folded,
            merged,
            dead,
            fused,
            ..function.stats
        };
        function
    }

    /// A graph as it is (loaded from a file, or already optimised): no pass runs.
    pub(crate) fn from_graph(graph: Graph) -> ConcreteFunction {
        let frees = graph.last_uses();
        let mut input_types = vec![None; graph.num_args];
        for n in &graph.nodes {
            if let (crate::graph::NodeKind::Arg(k), Some(t)) = (&n.kind, n.outputs.first()) {
                if let Some(slot) = input_types.get_mut(*k) {
                    *slot = Some(t.clone());
                }
            }
        }
        let stats = GraphStats {
            traced_nodes: graph.nodes.len(),
            nodes: graph.nodes.len(),
            ops: graph
                .nodes
                .iter()
                .filter(|n| matches!(n.kind, crate::graph::NodeKind::Op(_)))
                .count(),
            peak_bytes: graph.peak_bytes(),
            ..GraphStats::default()
        };
        ConcreteFunction {
            custom_gradients: graph.has_custom_gradients(),
            graph,
            frees,
            stats,
            input_types,
            tape_ops: Mutex::new(HashMap::new()),
        }
    }

    /// Runs the graph. The arguments must have the types it was traced for
    /// ([`ConcreteFunction::input_types`]).
    ///
    /// Under a recording `GradientTape`, a graph without variable writes, random draws or
    /// control flow is recorded as one op whose gradient is a compiled backward graph
    /// reading the values the forward saved (traced once, on the first such call); second
    /// and higher-order gradients recompute through the graph so the outer tape sees every
    /// op. Other graphs replay op by op, each recorded. A graph holding a `custom_gradient`
    /// refuses a tape outside it that tracks an argument (`Error::NotTraceable`): the graph
    /// has the forward ops, not the gradient function; a tape inside the traced closure
    /// uses the custom gradient as eagerly.
    ///
    /// ```
    /// ferroflow::init();
    /// use ferroflow::{autodiff::GradientTape, function::Function, Tensor};
    /// let f = Function::new(|a: &[Tensor]| Ok(vec![a[0].mul(&a[0])?.tanh()?]));
    /// let x = Tensor::from_vec(vec![0.5f64, -1.0], &[2])?;
    /// f.call(&[x.clone()])?; // traced
    /// let tape = GradientTape::new();
    /// tape.watch(&x);
    /// let y = f.call(&[x.clone()])?;
    /// assert_eq!(tape.num_recorded(), 1); // one op: the call
    /// let dx = tape.gradient(&y[0], &[(&x).into()])?[0].clone().unwrap();
    /// let t = x.mul(&x)?.tanh()?; // d tanh(x²)/dx = 2x (1 - tanh²)
    /// let want = x.mul(&x.scalar_like(2.0)?)?.mul(&t.mul(&t)?.neg()?.add(&t.ones_like()?)?)?;
    /// let (dx, want) = (dx.to_vec::<f64>()?, want.to_vec::<f64>()?);
    /// assert!(dx.iter().zip(&want).all(|(a, b)| (a - b).abs() < 1e-12));
    /// # Ok::<(), ferroflow::Error>(())
    /// ```
    pub fn call(&self, args: &[Tensor]) -> Result<Vec<Tensor>> {
        if self.needs_the_closure_under_a_tape(args) {
            return Err(Error::NotTraceable {
                op: "custom_gradient",
                msg: "a tape outside a graph function cannot differentiate through a \
                      custom_gradient inside it (the graph holds its forward ops, not its \
                      gradient function): record the tape inside the function, or call the \
                      closure eagerly"
                    .into(),
            });
        }
        if !ferroflow_tensor::dispatch::is_tracing()
            && ferroflow_autodiff::is_recording()
            && self.fits(args)
        {
            let inputs = TapeOp::inputs_of(&self.graph, args);
            // One backward graph per set of inputs the tapes track (gradients for the
            // others are never asked for, and a data batch's would cost a product).
            let needed: Vec<bool> = inputs.iter().map(ferroflow_autodiff::is_tracked).collect();
            if needed.iter().any(|&n| n) {
                let op = {
                    let mut ops = self.tape_ops.lock().unwrap_or_else(|e| e.into_inner());
                    match ops.get(&needed) {
                        Some(op) => op.clone(),
                        None => {
                            let op = match TapeOp::build(self, &inputs, &needed) {
                                Ok(op) => op.map(Arc::new),
                                // A backward that cannot be a graph (a gradient that reads
                                // a value on the host): the call replays op by op.
                                Err(Error::NotTraceable { .. }) => None,
                                Err(e) => return Err(e),
                            };
                            ops.insert(needed, op.clone());
                            op
                        }
                    }
                };
                if let Some(op) = op {
                    return op.call(&inputs);
                }
            }
        }
        self.replay(args)
    }

    /// Whether a call on `args` needs the traced closure itself: the graph holds a
    /// `custom_gradient` (its forward ops, not its gradient function) and a tape outside
    /// tracks an argument.
    pub(crate) fn needs_the_closure_under_a_tape(&self, args: &[Tensor]) -> bool {
        self.custom_gradients
            && ferroflow_autodiff::is_recording()
            && args.iter().any(ferroflow_autodiff::is_tracked)
    }

    /// Runs the graph op by op (tapes record each op).
    pub(crate) fn replay(&self, args: &[Tensor]) -> Result<Vec<Tensor>> {
        self.graph.run(args, &self.frees)
    }

    /// Whether `args` have the traced signature's types.
    fn fits(&self, args: &[Tensor]) -> bool {
        let types = &self.input_types;
        types.len() == args.len()
            && types.iter().zip(args).all(|(t, a)| {
                t.as_ref()
                    .is_some_and(|t| a.shape() == t.shape.as_slice() && a.dtype() == t.dtype)
            })
    }

    /// The shape and dtype of each argument, in order (the signature it was traced for);
    /// `None` for an argument the graph never reads (only a control-flow branch has them:
    /// the inputs only the other branch uses).
    pub fn input_types(&self) -> &[Option<ValueType>] {
        &self.input_types
    }

    /// Writes the graph to a file that [`ConcreteFunction::load`] reads back without the
    /// closure: its ops with their attributes, constants and captured tensors by value,
    /// variables by name (their values stay with the caller; save them with the model's
    /// weights). Crash-safe (temporary file, fsync, rename). A graph that uses two variables
    /// of one name, or a host function (the NumPy API's `linalg`), cannot be saved.
    ///
    /// ```
    /// ferroflow::init();
    /// use ferroflow::{function::{ConcreteFunction, Function}, Tensor, Variable};
    /// let w = Variable::new("w", Tensor::from_vec(vec![2.0f32, 3.0], &[2])?);
    /// let f = {
    ///     let w = w.clone();
    ///     Function::new(move |a: &[Tensor]| Ok(vec![a[0].mul(&w.value())?.tanh()?]))
    /// };
    /// let x = Tensor::from_vec(vec![0.5f32, -1.0], &[2])?;
    /// let path = std::env::temp_dir().join(format!("ferroflow-doc-{}.ffgraph", std::process::id()));
    /// f.get_concrete_function(&[x.clone()])?.save(&path)?;
    /// // Elsewhere, without the closure: bind the variables by name.
    /// let loaded = ConcreteFunction::load(&path, &[w.clone()])?;
    /// assert_eq!(loaded.call(&[x.clone()])?[0].to_vec::<f32>()?, f.call(&[x])?[0].to_vec::<f32>()?);
    /// # std::fs::remove_file(&path)?;
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn save(&self, path: impl AsRef<std::path::Path>) -> Result<()> {
        crate::saved::save(self, path.as_ref())
    }

    /// Reads a graph file written by [`ConcreteFunction::save`] and binds each variable it
    /// names to the one of that name in `variables` (same dtype and shape), which calls then
    /// read and update. Everything is checked before anything runs: a bad or truncated file,
    /// a missing or mismatched variable is an error naming it. Constants are placed on the
    /// default device. See [`ConcreteFunction::save`] for an example.
    pub fn load(
        path: impl AsRef<std::path::Path>,
        variables: &[ferroflow_tensor::Variable],
    ) -> Result<ConcreteFunction> {
        crate::saved::load(path.as_ref(), variables)
    }

    /// For each node, the values freed after it ran.
    pub(crate) fn frees(&self) -> &[Vec<ValueRef>] {
        &self.frees
    }

    /// The optimised graph.
    pub fn graph(&self) -> &Graph {
        &self.graph
    }

    /// What tracing and the passes did.
    pub fn stats(&self) -> &GraphStats {
        &self.stats
    }
}

type Body<'f> = dyn Fn(&[Tensor]) -> Result<Vec<Tensor>> + Send + Sync + 'f;

/// The graphs of one traced computation, one per input signature, each with a value `T`
/// the trace returned beside its tensors (which of a step's gradients exist, say). The body
/// is handed over on every call and runs only when a signature is new; so it may borrow
/// mutably what the caller owns (a Keras model), which a stored closure could not.
/// [`Function`] is this cache with a stored closure.
///
/// ```
/// ferroflow::init();
/// use ferroflow::{function::TraceCache, Tensor};
/// let cache: TraceCache<usize> = TraceCache::new("double");
/// let x = Tensor::from_vec(vec![1.0f32, 2.0], &[2])?;
/// let mut runs = 0;
/// for _ in 0..3 {
///     let (y, n) = cache.call_with(&[x.clone()], |a| {
///         runs += 1;
///         Ok((vec![a[0].add(&a[0])?], a.len()))
///     })?;
///     assert_eq!((y[0].to_vec::<f32>()?, n), (vec![2.0, 4.0], 1));
/// }
/// assert_eq!((runs, cache.tracing_count()), (1, 1));
/// # Ok::<(), ferroflow::Error>(())
/// ```
pub struct TraceCache<T = ()> {
    name: String,
    input_signature: Option<Vec<TensorSpec>>,
    graphs: Mutex<HashMap<Signature, (Arc<ConcreteFunction>, T)>>,
    traces: AtomicUsize,
    warned: AtomicUsize,
    /// Whether the warning that a call ran eagerly (a `custom_gradient` under a tape
    /// outside) was printed.
    warned_eager: AtomicUsize,
}

impl<T> std::fmt::Debug for TraceCache<T> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("TraceCache")
            .field("name", &self.name)
            .field("input_signature", &self.input_signature)
            .field("traces", &self.tracing_count())
            .finish()
    }
}

impl<T> TraceCache<T> {
    /// How many times a body was traced (TF's `experimental_get_tracing_count`).
    pub fn tracing_count(&self) -> usize {
        self.traces.load(Ordering::Relaxed)
    }
}

impl<T: Clone> TraceCache<T> {
    /// An empty cache; `name` names the computation in warnings and errors.
    pub fn new(name: impl Into<String>) -> TraceCache<T> {
        TraceCache {
            name: name.into(),
            input_signature: None,
            graphs: Mutex::new(HashMap::new()),
            traces: AtomicUsize::new(0),
            warned: AtomicUsize::new(0),
            warned_eager: AtomicUsize::new(0),
        }
    }

    /// Fixes the arguments' dtypes and ranks (TF's `input_signature`): a call that does not
    /// fit is an error naming the argument. A `None` dimension accepts any size; each size
    /// met gets its own graph (as XLA specialises), and those traces are not retraces.
    pub fn with_input_signature(mut self, specs: Vec<TensorSpec>) -> TraceCache<T> {
        self.input_signature = Some(specs);
        self
    }

    fn check_signature(&self, args: &[Tensor]) -> Result<()> {
        let Some(specs) = &self.input_signature else {
            return Ok(());
        };
        if specs.len() != args.len() {
            return Err(Error::invalid(
                "function",
                format!(
                    "{}: takes {} arguments (its input_signature), got {}",
                    self.name,
                    specs.len(),
                    args.len()
                ),
            ));
        }
        for (i, (spec, t)) in specs.iter().zip(args).enumerate() {
            if !spec.accepts(t) {
                return Err(Error::invalid(
                    "function",
                    format!(
                        "{}: argument {i} (shape {:?}, dtype {}) is incompatible with its input_signature {spec}",
                        self.name,
                        t.shape(),
                        t.dtype()
                    ),
                ));
            }
        }
        Ok(())
    }

    /// The graph traced for `args`' signature, if there is one (after checking `args`
    /// against the input signature).
    fn cached(&self, args: &[Tensor]) -> Result<Option<(Arc<ConcreteFunction>, T)>> {
        self.check_signature(args)?;
        let graphs = self.graphs.lock().unwrap_or_else(|e| e.into_inner());
        Ok(graphs
            .get(&Signature::of(args))
            .map(|(c, value)| (c.clone(), value.clone())))
    }

    /// The graph for `args`' signature, tracing `body` on `args` when the signature is new:
    /// returns the graph, its value, and when it was traced now, the call's results.
    #[allow(clippy::type_complexity)]
    fn concrete(
        &self,
        args: &[Tensor],
        body: impl FnOnce(&[Tensor]) -> Result<(Vec<Tensor>, T)>,
    ) -> Result<(Arc<ConcreteFunction>, T, Option<Vec<Tensor>>)> {
        if let Some((c, value)) = self.cached(args)? {
            return Ok((c, value, None));
        }
        let signature = Signature::of(args);
        let earlier: Vec<Signature> = self
            .graphs
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .keys()
            .cloned()
            .collect();
        let mut value = None;
        let traced = trace(args, |a| {
            let (outputs, v) = body(a)?;
            value = Some(v);
            Ok(outputs)
        })?;
        let value =
            value.ok_or_else(|| Error::invalid("function", "the trace returned no value"))?;
        let concrete = Arc::new(ConcreteFunction::new(traced.graph, traced.folded));
        let traces = self.traces.fetch_add(1, Ordering::Relaxed) + 1;
        if self.input_signature.is_none()
            && traces > RETRACE_WARNING
            && self.warned.fetch_add(1, Ordering::Relaxed) == 0
        {
            eprintln!(
                "WARNING: {} was traced {traces} times: its arguments' signature changed ({}). \
                 Tracing is expensive; pass arguments of fixed shapes, or give an \
                 input_signature with None for the sizes that vary.",
                self.name,
                describe_change(&earlier, &signature)
            );
        }
        self.graphs
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .insert(signature, (concrete.clone(), value.clone()));
        Ok((concrete, value, Some(traced.outputs)))
    }

    /// Runs the graph for `args`' signature, or, when the signature is new, traces `body`
    /// on `args` (that trace is this call) and keeps its graph and value. A graph holding
    /// a `custom_gradient` called under a tape that tracks an argument runs `body` eagerly
    /// instead (once with a warning): the graph has the custom gradient's forward ops, not
    /// its gradient function, and the tape needs the latter.
    pub fn call_with(
        &self,
        args: &[Tensor],
        body: impl FnOnce(&[Tensor]) -> Result<(Vec<Tensor>, T)>,
    ) -> Result<(Vec<Tensor>, T)> {
        if let Some((graph, value)) = self.cached(args)? {
            if graph.needs_the_closure_under_a_tape(args) {
                if self.warned_eager.fetch_add(1, Ordering::Relaxed) == 0 {
                    eprintln!(
                        "WARNING: {} holds a custom_gradient and runs eagerly under the \
                         GradientTape outside it (a graph keeps a custom gradient's forward \
                         ops, not its gradient function); record the tape inside the \
                         function to run it as a graph.",
                        self.name
                    );
                }
                return body(args);
            }
            return Ok((graph.call(args)?, value));
        }
        match self.concrete(args, body)? {
            (_, value, Some(traced)) => Ok((traced, value)),
            (graph, value, None) => Ok((graph.call(args)?, value)),
        }
    }

    /// The graph for `args`' signature (TF's `get_concrete_function`), tracing `body` on
    /// `args` if the signature is new.
    pub fn get_concrete_function(
        &self,
        args: &[Tensor],
        body: impl FnOnce(&[Tensor]) -> Result<(Vec<Tensor>, T)>,
    ) -> Result<Arc<ConcreteFunction>> {
        Ok(self.concrete(args, body)?.0)
    }
}

/// A closure run as graphs (TF's `tf.function`): the first call with a new signature
/// (argument dtypes, shapes, devices) runs the closure once while recording its ops into a
/// graph, optimises it (constant folding, common subexpressions, dead code, values freed
/// after their last use) and keeps it; later calls with that signature run the graph.
///
/// What runs only at trace time: everything in the closure that is not a tensor op or a
/// variable read or write (printing, counters, Rust control flow, which is decided by the
/// trace's values: branch on a tensor's value with [`crate::cond`] and loop with
/// [`crate::while_loop`], which the graph decides on every call). Variables are captured by reference: a call sees their current values
/// and its writes are visible outside. Tensors from outside the closure are captured as
/// they are. Reading a tensor's value on the host inside the closure is an error
/// (`Error::NotTraceable`): it would fix one call's value in every later call. Random ops
/// draw new numbers on every call. Ops run on other threads (a strategy's replicas) are not
/// recorded.
///
/// ```
/// ferroflow::init();
/// use ferroflow::{function::Function, Tensor, Variable};
/// let w = Variable::new("w", Tensor::from_vec(vec![2.0f32], &[1])?);
/// let f = Function::new(|args: &[Tensor]| {
///     let y = args[0].mul(&w.value())?.add(&args[0].scalar_like(1.0)?)?;
///     Ok(vec![y])
/// });
/// let x = Tensor::from_vec(vec![1.0f32, 2.0], &[2])?;
/// assert_eq!(f.call(&[x.clone()])?[0].to_vec::<f32>()?, vec![3.0, 5.0]); // traced
/// w.assign(&Tensor::from_vec(vec![3.0f32], &[1])?)?;
/// assert_eq!(f.call(&[x])?[0].to_vec::<f32>()?, vec![4.0, 7.0]); // the graph, new w
/// assert_eq!(f.tracing_count(), 1);
/// # Ok::<(), ferroflow::Error>(())
/// ```
pub struct Function<'f> {
    body: Box<Body<'f>>,
    cache: TraceCache<()>,
}

impl std::fmt::Debug for Function<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        self.cache.fmt(f)
    }
}

impl<'f> Function<'f> {
    /// A function from a closure over argument tensors returning tensors; it may borrow
    /// what it uses (a model, variables) for the function's life.
    pub fn new(body: impl Fn(&[Tensor]) -> Result<Vec<Tensor>> + Send + Sync + 'f) -> Function<'f> {
        Function {
            body: Box::new(body),
            cache: TraceCache::new("function"),
        }
    }

    /// Names the function in warnings and errors.
    pub fn with_name(mut self, name: impl Into<String>) -> Function<'f> {
        self.cache.name = name.into();
        self
    }

    /// Fixes the arguments' dtypes and ranks ([`TraceCache::with_input_signature`]).
    pub fn with_input_signature(mut self, specs: Vec<TensorSpec>) -> Function<'f> {
        self.cache = self.cache.with_input_signature(specs);
        self
    }

    /// How many times the closure was traced (TF's `experimental_get_tracing_count`).
    pub fn tracing_count(&self) -> usize {
        self.cache.tracing_count()
    }

    /// Calls the function: the graph for these arguments' signature, traced first if new.
    pub fn call(&self, args: &[Tensor]) -> Result<Vec<Tensor>> {
        Ok(self.cache.call_with(args, |a| Ok(((self.body)(a)?, ())))?.0)
    }

    /// The graph for `args`' signature (TF's `get_concrete_function`), traced if new (which
    /// runs the closure once on `args`).
    pub fn get_concrete_function(&self, args: &[Tensor]) -> Result<Arc<ConcreteFunction>> {
        self.cache
            .get_concrete_function(args, |a| Ok(((self.body)(a)?, ())))
    }
}

/// What differs between a new signature and the nearest earlier one.
fn describe_change(earlier: &[Signature], new: &Signature) -> String {
    let Some(last) = earlier.iter().find(|s| s.0.len() == new.0.len()) else {
        return format!("{} arguments", new.0.len());
    };
    for (i, (a, b)) in last.0.iter().zip(&new.0).enumerate() {
        if a != b {
            return format!(
                "argument {i}: {} {:?} on {} after {} {:?} on {}",
                b.0, b.1, b.2, a.0, a.1, a.2
            );
        }
    }
    "the same signature".into()
}
