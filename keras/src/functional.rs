//! The Functional API (TF 2.4's `KerasTensor` refactor): symbolic tensors, layers called on
//! them record nodes, and [`Functional`] runs the resulting graph in topological order. Any
//! function of tensors on KerasTensors is a node too ([`KerasTensor::apply`], TF's
//! `TFOpLambda`): traced into a graph for every batch size, saved with the model.
//!
//! ```
//! ferroflow::init();
//! use ferroflow_keras::functional::{input, Symbolic};
//! use ferroflow_keras::layers::{Concatenate, Dense};
//! use ferroflow_keras::{LayerRef, Model};
//! use ferroflow_tensor::{DType, Tensor};
//! let a = input(&[4], "a");
//! let b = input(&[3], "b");
//! let shared = LayerRef::new(Dense::new(8));
//! let ha = shared.on(&[&a.relu()?])?; // a raw op on a KerasTensor becomes a node
//! let hb = Dense::new(8).on(&[&b])?;
//! let joined = Concatenate::new(-1).on(&[&ha[0], &hb[0]])?;
//! let out = Dense::new(1).on(&[&joined[0]])?;
//! let mut model = Model::new(&[a, b], &out)?;
//! let y = model.call_multi(&[Tensor::ones(&[2, 4], DType::F32)?, Tensor::ones(&[2, 3], DType::F32)?], false)?;
//! assert_eq!(y[0].shape(), &[2, 1]);
//! # Ok::<(), ferroflow_tensor::Error>(())
//! ```

use std::collections::{HashMap, HashSet};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;

use ferroflow_function::{BatchPolymorphicFunction, TensorSpec};
use ferroflow_tensor::{Axes, DType, Error, Result, Tensor};
use serde_json::{json, Value};

use crate::activations::Activation;
use crate::layer::{unique_name, Layer, LayerBase, LayerRef};

static NEXT_NODE: AtomicUsize = AtomicUsize::new(0);

/// A function of tensors recorded as a graph node (Keras' `Lambda`).
pub type LambdaFn = Arc<dyn Fn(&[Tensor]) -> Result<Vec<Tensor>> + Send + Sync>;

macro_rules! named_ops {
    ($(#[$m:meta])* $name:ident { $($(#[$vm:meta])* $v:ident => $s:literal),* $(,)? }) => {
        $(#[$m])*
        #[derive(Debug, Clone, Copy, PartialEq, Eq)]
        pub enum $name { $($(#[$vm])* $v),* }
        impl $name {
            /// Every variant.
            pub const ALL: &'static [$name] = &[$($name::$v),*];
            /// The `tf.math` name, as written in a model config.
            pub fn name(self) -> &'static str { match self { $($name::$v => $s),* } }
            /// The op of a `tf.math` name (a model config's).
            pub fn parse(name: &str) -> Result<$name> {
                match name {
                    $($s => Ok($name::$v),)*
                    other => Err(Error::format(
                        "TFOpLambda config",
                        format!(concat!("unknown ", stringify!($name), " {:?}; expected one of {:?}"), other, [$($s),*]),
                    )),
                }
            }
        }
    };
}

named_ops!(
    /// The binary ops a [`TfOp`] records.
    SymbolicBinary {
        /// `tf.math.add`
        Add => "add",
        /// `tf.math.subtract`
        Subtract => "subtract",
        /// `tf.math.multiply`
        Multiply => "multiply",
        /// `tf.math.divide`
        Divide => "divide",
        /// `tf.math.maximum`
        Maximum => "maximum",
        /// `tf.math.minimum`
        Minimum => "minimum",
        /// `tf.linalg.matmul`
        Matmul => "matmul",
    }
);

named_ops!(
    /// The reductions a [`TfOp`] records.
    SymbolicReduce {
        /// `tf.math.reduce_sum`
        Sum => "sum",
        /// `tf.math.reduce_mean`
        Mean => "mean",
    }
);

named_ops!(
    /// The unary math ops a [`TfOp`] records (activations are [`SymbolicUnary::Activation`]).
    SymbolicMath {
        /// `tf.math.exp`
        Exp => "exp",
        /// `tf.math.log`
        Log => "log",
        /// `tf.math.square`
        Square => "square",
        /// `tf.math.sqrt`
        Sqrt => "sqrt",
        /// `tf.math.abs`
        Abs => "abs",
        /// `tf.math.negative`
        Negative => "negative",
    }
);

/// A unary op a [`TfOp`] records: a math function or a Keras activation.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum SymbolicUnary {
    /// `exp`, `log`, `square`, `sqrt`, `abs`, `negative`.
    Math(SymbolicMath),
    /// An activation by Keras name (`relu`, `tanh`, `softmax`, ...).
    Activation(Activation),
}

impl SymbolicUnary {
    fn name(self) -> &'static str {
        match self {
            SymbolicUnary::Math(m) => m.name(),
            SymbolicUnary::Activation(a) => a.name(),
        }
    }
    fn parse(name: &str) -> Result<SymbolicUnary> {
        match SymbolicMath::parse(name) {
            Ok(m) => Ok(SymbolicUnary::Math(m)),
            Err(_) => Activation::parse(name).map(SymbolicUnary::Activation),
        }
    }
}

/// A raw tensor op recorded on KerasTensors (Keras' `TFOpLambda`). The typed ones can be
/// saved in a model config (by their `tf.math` names); a [`TfOp::Custom`] closure cannot.
#[derive(Clone)]
pub enum TfOp {
    /// An elementwise binary op, or `matmul`.
    Binary(SymbolicBinary),
    /// A unary math op or an activation.
    Unary(SymbolicUnary),
    /// Reshape of each sample (the batch dimension is kept).
    Reshape(Vec<isize>),
    /// `reduce_sum`/`reduce_mean` over axes (never the batch axis 0).
    Reduce {
        /// Which reduction.
        op: SymbolicReduce,
        /// The axes.
        axes: Vec<isize>,
        /// Keep reduced axes.
        keepdims: bool,
    },
    /// Any function of the input tensors, traced into a graph that runs at every batch size
    /// and saves with the model ([`KerasTensor::apply`]).
    Traced {
        /// The name the node is listed under (`tf.math.log1p`, say).
        name: String,
        /// The graph.
        function: Arc<BatchPolymorphicFunction>,
    },
    /// Any function of the input tensors, run as it is (Keras' `Lambda`); not serializable.
    Custom(LambdaFn),
}

impl TfOp {
    fn name(&self) -> String {
        match self {
            TfOp::Binary(SymbolicBinary::Matmul) => "tf.linalg.matmul".into(),
            TfOp::Binary(b) => format!("tf.math.{}", b.name()),
            TfOp::Unary(u) => format!("tf.math.{}", u.name()),
            TfOp::Reshape(_) => "tf.reshape".into(),
            TfOp::Reduce { op, .. } => format!("tf.math.reduce_{}", op.name()),
            TfOp::Traced { name, .. } => name.clone(),
            TfOp::Custom(_) => "lambda".into(),
        }
    }
    fn arity(&self) -> Option<usize> {
        match self {
            TfOp::Binary(_) => Some(2),
            TfOp::Unary(_) | TfOp::Reshape(_) | TfOp::Reduce { .. } => Some(1),
            TfOp::Traced { function, .. } => Some(function.inputs().len()),
            TfOp::Custom(_) => None,
        }
    }
    fn run(&self, inputs: &[Tensor]) -> Result<Vec<Tensor>> {
        if let Some(n) = self.arity() {
            if inputs.len() != n {
                return Err(Error::invalid(
                    "TFOpLambda",
                    format!("{} takes {n} input(s), got {}", self.name(), inputs.len()),
                ));
            }
        }
        let out = match self {
            TfOp::Binary(op) => {
                let (a, b) = (&inputs[0], &inputs[1]);
                match op {
                    SymbolicBinary::Add => a.add(b)?,
                    SymbolicBinary::Subtract => a.sub(b)?,
                    SymbolicBinary::Multiply => a.mul(b)?,
                    SymbolicBinary::Divide => a.div(b)?,
                    SymbolicBinary::Maximum => a.maximum(b)?,
                    SymbolicBinary::Minimum => a.minimum(b)?,
                    SymbolicBinary::Matmul => a.matmul(b)?,
                }
            }
            TfOp::Unary(op) => {
                let x = &inputs[0];
                match op {
                    SymbolicUnary::Math(SymbolicMath::Exp) => x.exp()?,
                    SymbolicUnary::Math(SymbolicMath::Log) => x.log()?,
                    SymbolicUnary::Math(SymbolicMath::Square) => x.square()?,
                    SymbolicUnary::Math(SymbolicMath::Sqrt) => x.sqrt()?,
                    SymbolicUnary::Math(SymbolicMath::Abs) => x.abs()?,
                    SymbolicUnary::Math(SymbolicMath::Negative) => x.neg()?,
                    SymbolicUnary::Activation(a) => a.apply(x)?,
                }
            }
            TfOp::Reshape(shape) => {
                let x = &inputs[0];
                let mut s = vec![x.shape().first().copied().unwrap_or(1) as isize];
                s.extend_from_slice(shape);
                x.reshape(&s)?
            }
            TfOp::Reduce { op, axes, keepdims } => {
                let x = &inputs[0];
                let axes = Axes::from(axes.clone());
                match op {
                    SymbolicReduce::Sum => x.reduce_sum(axes, *keepdims)?,
                    SymbolicReduce::Mean => x.reduce_mean(axes, *keepdims)?,
                }
            }
            TfOp::Traced { function, .. } => return function.call(inputs),
            TfOp::Custom(f) => return f(inputs),
        };
        Ok(vec![out])
    }
    fn to_config(&self) -> Result<Value> {
        Ok(match self {
            TfOp::Binary(b) => json!({"kind": "binary", "function": b.name()}),
            TfOp::Unary(u) => json!({"kind": "unary", "function": u.name()}),
            TfOp::Reshape(s) => json!({"kind": "reshape", "shape": s}),
            TfOp::Reduce { op, axes, keepdims } => {
                json!({"kind": "reduce", "function": op.name(), "axes": axes, "keepdims": keepdims})
            }
            TfOp::Traced { name, function } => {
                json!({"kind": "traced", "function": name, "graph": function.to_json()?})
            }
            TfOp::Custom(_) => {
                return Err(Error::invalid(
                    "Functional.get_config",
                    "a custom lambda node cannot be serialized; record it with \
                     KerasTensor::apply (a traced graph that saves), or rebuild the model in \
                     code and use save_weights",
                ))
            }
        })
    }
    fn from_config(v: &Value) -> Result<TfOp> {
        let bad = || Error::format("TFOpLambda config", format!("cannot read {v}"));
        let s = |k: &str| v[k].as_str().ok_or_else(bad);
        let ints = |k: &str| -> Result<Vec<isize>> {
            v[k].as_array()
                .and_then(|a| a.iter().map(|x| x.as_i64().map(|i| i as isize)).collect())
                .ok_or_else(bad)
        };
        Ok(match v["kind"].as_str() {
            Some("binary") => TfOp::Binary(SymbolicBinary::parse(s("function")?)?),
            Some("unary") => TfOp::Unary(SymbolicUnary::parse(s("function")?)?),
            Some("reshape") => TfOp::Reshape(ints("shape")?),
            Some("reduce") => TfOp::Reduce {
                op: SymbolicReduce::parse(s("function")?)?,
                axes: ints("axes")?,
                keepdims: v["keepdims"].as_bool().unwrap_or(false),
            },
            Some("traced") => TfOp::Traced {
                name: s("function")?.to_string(),
                function: Arc::new(BatchPolymorphicFunction::from_json(&v["graph"])?),
            },
            _ => return Err(bad()),
        })
    }
}

enum NodeKind {
    Input { name: String },
    Layer(LayerRef),
    Op(TfOp),
}

struct Node {
    id: usize,
    kind: NodeKind,
    inputs: Vec<KerasTensor>,
}

/// A symbolic tensor: a shape with an unknown batch dimension (`None`), a dtype, and the
/// node that produces it.
#[derive(Clone)]
pub struct KerasTensor {
    shape: Vec<Option<usize>>,
    dtype: DType,
    node: Arc<Node>,
    index: usize,
}

impl std::fmt::Debug for KerasTensor {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "KerasTensor(shape={:?}, dtype={})",
            self.shape, self.dtype
        )
    }
}

/// `tf.keras.Input`: a symbolic input of per-sample `shape` (float32).
pub fn input(shape: &[usize], name: &str) -> KerasTensor {
    input_with_dtype(shape, DType::F32, name)
}

/// [`input`] of another dtype (`int64` token ids for an embedding, for instance).
pub fn input_with_dtype(shape: &[usize], dtype: DType, name: &str) -> KerasTensor {
    let mut s = vec![None];
    s.extend(shape.iter().map(|&d| Some(d)));
    let name = if name.is_empty() {
        unique_name("input")
    } else {
        name.to_string()
    };
    KerasTensor {
        shape: s,
        dtype,
        node: Arc::new(Node {
            id: NEXT_NODE.fetch_add(1, Ordering::Relaxed),
            kind: NodeKind::Input { name },
            inputs: vec![],
        }),
        index: 0,
    }
}

fn probe(t: &KerasTensor) -> Result<Tensor> {
    let shape: Vec<usize> = t.shape.iter().map(|d| d.unwrap_or(1)).collect();
    Tensor::zeros(&shape, t.dtype)
}

fn symbolic_outputs(kind: NodeKind, inputs: &[&KerasTensor], outs: &[Tensor]) -> Vec<KerasTensor> {
    let node = Arc::new(Node {
        id: NEXT_NODE.fetch_add(1, Ordering::Relaxed),
        kind,
        inputs: inputs.iter().map(|t| (*t).clone()).collect(),
    });
    outs.iter()
        .enumerate()
        .map(|(i, o)| {
            let mut shape: Vec<Option<usize>> = o.shape().iter().map(|&d| Some(d)).collect();
            if let Some(first) = shape.first_mut() {
                *first = None;
            }
            KerasTensor {
                shape,
                dtype: o.dtype(),
                node: node.clone(),
                index: i,
            }
        })
        .collect()
}

impl KerasTensor {
    /// The shape, batch dimension `None`.
    pub fn shape(&self) -> &[Option<usize>] {
        &self.shape
    }
    /// The dtype.
    pub fn dtype(&self) -> DType {
        self.dtype
    }
    /// Records `op` applied to `inputs` (Keras' `TFOpLambda`): the output shape comes from
    /// running the op once on a probe batch of one.
    pub fn op(inputs: &[&KerasTensor], op: TfOp) -> Result<KerasTensor> {
        KerasTensor::record(inputs, op)?
            .into_iter()
            .next()
            .ok_or_else(|| Error::invalid("TFOpLambda", "the op returned no tensor"))
    }
    /// Every output of `op` applied to `inputs`, recorded as one node.
    fn record(inputs: &[&KerasTensor], op: TfOp) -> Result<Vec<KerasTensor>> {
        let probes = inputs
            .iter()
            .map(|t| probe(t))
            .collect::<Result<Vec<_>>>()?;
        let outs = op.run(&probes)?;
        Ok(symbolic_outputs(NodeKind::Op(op), inputs, &outs))
    }
    /// Any function of tensors on symbolic tensors, recorded as one node (TF 2.4's
    /// `TFOpLambda`, for every op): `f` runs on tensors of the inputs' shapes and dtypes and
    /// is traced into a graph that runs at every batch size
    /// ([`ferroflow_function::BatchPolymorphicFunction`]), so tensor ops, composites and
    /// NumPy-API functions all work, and the node saves with the model (its config holds
    /// the graph, not the closure). `name` lists the node (`"tf.math.log1p"`). What such a
    /// graph cannot hold is an error here, naming it: a variable (weights belong to
    /// layers), structure or constants that change with the batch size other than linearly;
    /// [`KerasTensor::lambda`] keeps the closure instead.
    ///
    /// ```
    /// ferroflow::init();
    /// use ferroflow_keras::functional::{input, KerasTensor};
    /// use ferroflow_keras::Model;
    /// use ferroflow_tensor::{DType, Tensor};
    /// let x = input(&[4], "x");
    /// let parts = KerasTensor::apply("split_and_scan", &[&x], |t| {
    ///     let halves = t[0].split(&[2, 2], -1)?;
    ///     Ok(vec![halves[0].cumsum(-1, false, false)?, ferroflow::numpy::sinc(&halves[1])?])
    /// })?;
    /// let mut model = Model::new(&[x], &parts)?;
    /// let y = model.call_multi(&[Tensor::ones(&[3, 4], DType::F32)?], false)?;
    /// assert_eq!(y[0].to_vec::<f32>()?, [1.0, 2.0, 1.0, 2.0, 1.0, 2.0]);
    /// assert_eq!(y[1].shape(), &[3, 2]);
    /// # Ok::<(), ferroflow_tensor::Error>(())
    /// ```
    pub fn apply(
        name: &str,
        inputs: &[&KerasTensor],
        f: impl Fn(&[Tensor]) -> Result<Vec<Tensor>>,
    ) -> Result<Vec<KerasTensor>> {
        let specs = inputs
            .iter()
            .map(|t| TensorSpec::new(&t.shape, t.dtype))
            .collect();
        let function = BatchPolymorphicFunction::trace(specs, f).map_err(|e| match e {
            Error::InvalidArgument { msg, .. } => {
                Error::invalid("TFOpLambda", format!("{name}: {msg}"))
            }
            other => other,
        })?;
        KerasTensor::record(
            inputs,
            TfOp::Traced {
                name: name.to_string(),
                function: Arc::new(function),
            },
        )
    }
    /// [`KerasTensor::apply`] for a function of one tensor with one result.
    ///
    /// ```
    /// ferroflow::init();
    /// use ferroflow_keras::functional::input;
    /// let x = input(&[3], "x");
    /// let y = x.map("tf.math.log1p", |t| t.log1p())?;
    /// assert_eq!(y.shape(), &[None, Some(3)]);
    /// # Ok::<(), ferroflow_tensor::Error>(())
    /// ```
    pub fn map(&self, name: &str, f: impl Fn(&Tensor) -> Result<Tensor>) -> Result<KerasTensor> {
        KerasTensor::apply(name, &[self], |t| Ok(vec![f(&t[0])?]))?
            .into_iter()
            .next()
            .ok_or_else(|| Error::invalid("TFOpLambda", format!("{name} returned no tensor")))
    }
    /// A custom function of symbolic tensors kept as a closure (Keras' `Lambda`): it runs as
    /// written, and a model holding it cannot be saved ([`KerasTensor::apply`] traces one
    /// into a graph that saves).
    pub fn lambda(
        inputs: &[&KerasTensor],
        f: impl Fn(&[Tensor]) -> Result<Vec<Tensor>> + Send + Sync + 'static,
    ) -> Result<KerasTensor> {
        KerasTensor::op(inputs, TfOp::Custom(Arc::new(f)))
    }
    /// Reshapes each sample.
    pub fn reshape(&self, shape: &[isize]) -> Result<KerasTensor> {
        KerasTensor::op(&[self], TfOp::Reshape(shape.to_vec()))
    }
    /// Sums over `axes` (not the batch axis).
    pub fn reduce_sum(&self, axes: &[isize], keepdims: bool) -> Result<KerasTensor> {
        KerasTensor::op(
            &[self],
            TfOp::Reduce {
                op: SymbolicReduce::Sum,
                axes: axes.to_vec(),
                keepdims,
            },
        )
    }
    /// Averages over `axes` (not the batch axis).
    pub fn reduce_mean(&self, axes: &[isize], keepdims: bool) -> Result<KerasTensor> {
        KerasTensor::op(
            &[self],
            TfOp::Reduce {
                op: SymbolicReduce::Mean,
                axes: axes.to_vec(),
                keepdims,
            },
        )
    }
}

macro_rules! symbolic_binary {
    ($($method:ident => $op:ident),*) => {
        impl KerasTensor {
            $(
                #[doc = concat!("`SymbolicBinary::", stringify!($op), "` on symbolic tensors (a TFOpLambda node).")]
                pub fn $method(&self, other: &KerasTensor) -> Result<KerasTensor> {
                    KerasTensor::op(&[self, other], TfOp::Binary(SymbolicBinary::$op))
                }
            )*
        }
    };
}
symbolic_binary!(add => Add, sub => Subtract, mul => Multiply, div => Divide,
    maximum => Maximum, minimum => Minimum, matmul => Matmul);

macro_rules! symbolic_unary {
    ($($method:ident => $variant:ident($op:path)),*) => {
        impl KerasTensor {
            $(
                #[doc = concat!("`", stringify!($op), "` on a symbolic tensor (a TFOpLambda node).")]
                pub fn $method(&self) -> Result<KerasTensor> {
                    KerasTensor::op(&[self], TfOp::Unary(SymbolicUnary::$variant($op)))
                }
            )*
        }
    };
}
symbolic_unary!(relu => Activation(Activation::Relu), sigmoid => Activation(Activation::Sigmoid),
    tanh => Activation(Activation::Tanh), softmax => Activation(Activation::Softmax),
    exp => Math(SymbolicMath::Exp), log => Math(SymbolicMath::Log),
    square => Math(SymbolicMath::Square), sqrt => Math(SymbolicMath::Sqrt),
    abs => Math(SymbolicMath::Abs), neg => Math(SymbolicMath::Negative));

/// Calling a layer on symbolic tensors: records a node and gives its symbolic outputs.
pub trait Symbolic {
    /// Calls the layer on KerasTensors (building it for their shapes).
    fn on(self, inputs: &[&KerasTensor]) -> Result<Vec<KerasTensor>>;
}

impl Symbolic for &LayerRef {
    fn on(self, inputs: &[&KerasTensor]) -> Result<Vec<KerasTensor>> {
        let probes = inputs
            .iter()
            .map(|t| probe(t))
            .collect::<Result<Vec<_>>>()?;
        let outs = self.lock().apply(&probes, false)?;
        Ok(symbolic_outputs(
            NodeKind::Layer(self.clone()),
            inputs,
            &outs,
        ))
    }
}

impl<L: Layer + 'static> Symbolic for L {
    fn on(self, inputs: &[&KerasTensor]) -> Result<Vec<KerasTensor>> {
        (&LayerRef::new(self)).on(inputs)
    }
}

/// A graph of layers and ops between symbolic inputs and outputs (what `tf.keras.Model(inputs,
/// outputs)` builds). It is a [`Layer`], so it nests inside other graphs.
pub struct Functional {
    base: LayerBase,
    inputs: Vec<KerasTensor>,
    outputs: Vec<KerasTensor>,
    order: Vec<Arc<Node>>,
    layers: Vec<LayerRef>,
}

impl Functional {
    /// The graph from `inputs` to `outputs`; an error when an output depends on an input
    /// not listed (a disconnected graph).
    pub fn new(inputs: &[KerasTensor], outputs: &[KerasTensor]) -> Result<Functional> {
        if inputs.is_empty() || outputs.is_empty() {
            return Err(Error::invalid(
                "Model",
                "a functional model needs inputs and outputs",
            ));
        }
        let input_ids: HashSet<usize> = inputs.iter().map(|t| t.node.id).collect();
        for t in inputs {
            if !matches!(t.node.kind, NodeKind::Input { .. }) {
                return Err(Error::invalid(
                    "Model",
                    "every model input must come from `input(...)`",
                ));
            }
        }
        let mut order = vec![];
        let mut seen = HashSet::new();
        fn visit(
            n: &Arc<Node>,
            inputs: &HashSet<usize>,
            seen: &mut HashSet<usize>,
            order: &mut Vec<Arc<Node>>,
        ) -> Result<()> {
            if !seen.insert(n.id) {
                return Ok(());
            }
            if let NodeKind::Input { name } = &n.kind {
                if !inputs.contains(&n.id) {
                    return Err(Error::invalid(
                        "Model",
                        format!("graph disconnected: the outputs need input {name:?}, which is not among the model's inputs"),
                    ));
                }
            }
            for i in &n.inputs {
                visit(&i.node, inputs, seen, order)?;
            }
            order.push(n.clone());
            Ok(())
        }
        for o in outputs {
            visit(&o.node, &input_ids, &mut seen, &mut order)?;
        }
        let mut layers: Vec<LayerRef> = vec![];
        for n in &order {
            if let NodeKind::Layer(l) = &n.kind {
                if !layers.iter().any(|x| x.ptr_eq(l)) {
                    layers.push(l.clone());
                }
            }
        }
        // The graph's layers were built while it was traced.
        let mut base = LayerBase::new("model", None);
        base.mark_built();
        Ok(Functional {
            base,
            inputs: inputs.to_vec(),
            outputs: outputs.to_vec(),
            order,
            layers,
        })
    }
    /// The distinct layers, in graph order.
    pub fn layers(&self) -> &[LayerRef] {
        &self.layers
    }
    /// Rebuilds from [`Layer::get_config`].
    pub fn from_config(c: &Value) -> Result<Functional> {
        let bad = |m: String| Error::format("Functional config", m);
        let nodes = c["nodes"]
            .as_array()
            .ok_or_else(|| bad("missing \"nodes\"".into()))?;
        let mut built: Vec<Vec<KerasTensor>> = vec![];
        let mut layers: HashMap<String, LayerRef> = HashMap::new();
        for n in nodes {
            let ins: Vec<KerasTensor> = match n["inbound"].as_array() {
                Some(a) => a
                    .iter()
                    .map(|p| resolve(&built, p))
                    .collect::<Result<_>>()?,
                None => vec![],
            };
            let refs: Vec<&KerasTensor> = ins.iter().collect();
            let outs = match n["kind"].as_str() {
                Some("input") => {
                    let shape: Vec<usize> = serde_json::from_value(n["shape"].clone())
                        .map_err(|e| bad(e.to_string()))?;
                    let dtype = DType::ALL
                        .into_iter()
                        .find(|d| d.to_string() == n["dtype"].as_str().unwrap_or(""))
                        .ok_or_else(|| bad(format!("bad input dtype {}", n["dtype"])))?;
                    vec![input_with_dtype(
                        &shape,
                        dtype,
                        n["name"].as_str().unwrap_or(""),
                    )]
                }
                Some("layer") => {
                    let name = n["layer_name"]
                        .as_str()
                        .ok_or_else(|| bad("layer node without layer_name".into()))?;
                    let l = match layers.get(name) {
                        Some(l) => l.clone(),
                        None => {
                            let l = LayerRef::from_boxed(crate::layers::deserialize(&n["layer"])?);
                            layers.insert(name.to_string(), l.clone());
                            l
                        }
                    };
                    (&l).on(&refs)?
                }
                Some("op") => KerasTensor::record(&refs, TfOp::from_config(&n["op"])?)?,
                other => return Err(bad(format!("unknown node kind {other:?}"))),
            };
            built.push(outs);
        }
        let pick = |key: &str| -> Result<Vec<KerasTensor>> {
            c[key]
                .as_array()
                .ok_or_else(|| bad(format!("missing {key:?}")))?
                .iter()
                .map(|p| resolve(&built, p))
                .collect()
        };
        let ins = pick("inputs")?;
        let outs = pick("outputs")?;
        Functional::new(&ins, &outs)
    }
}

/// The tensor a config reference `[node, output]` names among the nodes rebuilt so far.
fn resolve(built: &[Vec<KerasTensor>], p: &Value) -> Result<KerasTensor> {
    let (i, j) = (p[0].as_u64(), p[1].as_u64());
    i.zip(j)
        .and_then(|(i, j)| built.get(i as usize)?.get(j as usize))
        .cloned()
        .ok_or_else(|| Error::format("Functional config", format!("bad tensor reference {p}")))
}

impl Layer for Functional {
    fn base(&self) -> &LayerBase {
        &self.base
    }
    fn base_mut(&mut self) -> &mut LayerBase {
        &mut self.base
    }
    fn class_name(&self) -> &'static str {
        "Functional"
    }
    fn output_names(&self) -> Option<Vec<String>> {
        let mut names: Vec<String> = Vec::new();
        for o in &self.outputs {
            let base = match &o.node.kind {
                NodeKind::Layer(l) => l.lock().name().to_string(),
                NodeKind::Op(op) => op.name().to_string(),
                NodeKind::Input { name } => name.clone(),
            };
            // Keras makes repeated names unique with a suffix.
            let mut name = base.clone();
            let mut k = 1;
            while names.contains(&name) {
                name = format!("{base}_{k}");
                k += 1;
            }
            names.push(name);
        }
        Some(names)
    }
    fn call(&mut self, inputs: &[Tensor], training: bool) -> Result<Vec<Tensor>> {
        if inputs.len() != self.inputs.len() {
            return Err(Error::invalid(
                "Functional.call",
                format!(
                    "the model has {} inputs, got {}",
                    self.inputs.len(),
                    inputs.len()
                ),
            ));
        }
        let mut values: HashMap<usize, Vec<Tensor>> = HashMap::new();
        for (kt, t) in self.inputs.iter().zip(inputs) {
            let want = &kt.shape[1..];
            let got = t.shape().get(1..).unwrap_or(&[]);
            if want.len() != got.len()
                || want
                    .iter()
                    .zip(got)
                    .any(|(w, g)| w.is_some_and(|w| w != *g))
            {
                return Err(Error::invalid(
                    "Functional.call",
                    format!(
                        "input of shape {:?} does not match the model input {:?}",
                        t.shape(),
                        kt.shape
                    ),
                ));
            }
            values.insert(kt.node.id, vec![t.clone()]);
        }
        for n in &self.order {
            if values.contains_key(&n.id) {
                continue;
            }
            let ins: Vec<Tensor> = n
                .inputs
                .iter()
                .map(|k| values[&k.node.id][k.index].clone())
                .collect();
            let out = match &n.kind {
                NodeKind::Input { name } => {
                    return Err(Error::invalid(
                        "Functional.call",
                        format!("input {name:?} was not fed"),
                    ))
                }
                NodeKind::Layer(l) => l.lock().apply(&ins, training)?,
                NodeKind::Op(op) => op.run(&ins)?,
            };
            values.insert(n.id, out);
        }
        Ok(self
            .outputs
            .iter()
            .map(|k| values[&k.node.id][k.index].clone())
            .collect())
    }
    fn visit_sublayers(&self, f: &mut dyn FnMut(&dyn Layer)) {
        for l in &self.layers {
            let g = l.lock();
            f(g.as_ref());
        }
    }
    fn get_config(&self) -> Value {
        let index: HashMap<usize, usize> = self
            .order
            .iter()
            .enumerate()
            .map(|(i, n)| (n.id, i))
            .collect();
        let mut described: HashSet<String> = HashSet::new();
        let mut nodes = vec![];
        let mut failure = None;
        for n in &self.order {
            let inbound: Vec<Value> = n
                .inputs
                .iter()
                .map(|k| json!([index[&k.node.id], k.index]))
                .collect();
            nodes.push(match &n.kind {
                NodeKind::Input { name } => {
                    let kt = self.inputs.iter().find(|k| k.node.id == n.id);
                    let shape: Vec<usize> = kt.map(|k| k.shape[1..].iter().map(|d| d.unwrap_or(0)).collect()).unwrap_or_default();
                    json!({"kind": "input", "name": name, "shape": shape, "dtype": kt.map(|k| k.dtype.to_string())})
                }
                NodeKind::Layer(l) => {
                    let g = l.lock();
                    let name = g.name().to_string();
                    let mut v = json!({"kind": "layer", "layer_name": name, "inbound": inbound});
                    if described.insert(name) {
                        v["layer"] = g.config();
                    }
                    v
                }
                NodeKind::Op(op) => match op.to_config() {
                    Ok(c) => json!({"kind": "op", "name": op.name(), "op": c, "inbound": inbound}),
                    Err(e) => {
                        failure = Some(e.to_string());
                        json!({"kind": "op", "name": op.name(), "inbound": inbound})
                    }
                },
            });
        }
        let refs = |ts: &[KerasTensor]| -> Vec<Value> {
            ts.iter()
                .map(|k| json!([index[&k.node.id], k.index]))
                .collect()
        };
        let mut c =
            json!({"nodes": nodes, "inputs": refs(&self.inputs), "outputs": refs(&self.outputs)});
        if let Some(e) = failure {
            c["unserializable"] = json!(e);
        }
        c
    }
}
