//! [`BatchPolymorphicFunction`]: one traced graph for every batch size, which saves and
//! loads without the closure (what a Keras Functional model's `TFOpLambda` nodes hold).
//!
//! A trace records concrete shapes (a reshape's target, a broadcast's shape, each value's
//! type). This module traces the closure at batch sizes 2 and 3, finds every integer in the
//! encoded graph that differs between the two and fits it as `per_batch · batch + offset`,
//! then traces at 5 and 8 and checks the fitted graph reproduces those traces exactly. A
//! graph that passes is a template: the graph for any batch size is the template with its
//! batch terms evaluated (built once per size, and checked as a loaded graph file is). What
//! it cannot hold is refused with an error naming the node: a change of structure with the
//! batch size, an attribute or constant that depends on it in another way, variables
//! (weights belong to layers), host functions.

use crate::function::{ConcreteFunction, TensorSpec};
use crate::saved::{decode, encode, Encoded};
use crate::trace::trace_branch;
use base64::Engine;
use ferroflow_tensor::{DType, Error, Result, Tensor};
use serde_json::{json, Value};
use std::sync::{Arc, Mutex};

/// The batch sizes the batch terms are fitted from.
const FIT_SIZES: [usize; 2] = [2, 3];
/// The batch sizes the fitted template is checked against.
const CHECK_SIZES: [usize; 2] = [5, 8];
/// The version of [`BatchPolymorphicFunction::to_json`]'s layout.
const FORMAT: u64 = 1;
/// Batch sizes whose graphs stay cached (the least recently built is dropped beyond).
const CACHED_SIZES: usize = 16;

/// One integer of the encoded graph that is `per_batch · batch + offset`.
#[derive(Debug, Clone, PartialEq, Eq)]
struct BatchTerm {
    /// A JSON pointer into the header.
    path: String,
    per_batch: i64,
    offset: i64,
}

/// A function traced once into a graph that runs at every batch size: the `None`
/// dimensions of its input specs all stand for the batch size. Built with
/// [`BatchPolymorphicFunction::trace`], saved as JSON with
/// [`BatchPolymorphicFunction::to_json`] and loaded back without the closure. Calls run the
/// graph specialised to the batch size of their arguments (one per size, built on first use,
/// as XLA specialises), through the dispatcher: tapes record them, gradients work.
///
/// ```
/// ferroflow::init();
/// use ferroflow::{function::{BatchPolymorphicFunction, TensorSpec}, DType, Tensor};
/// // Flatten each example and append its sum: shapes depend on the batch size.
/// let f = BatchPolymorphicFunction::trace(vec![TensorSpec::new(&[None, Some(2), Some(3)], DType::F32)], |a: &[Tensor]| {
///     let flat = a[0].reshape(&[-1, 6])?;
///     Ok(vec![Tensor::concat(&[flat.clone(), flat.reduce_sum(-1, true)?], -1)?])
/// })?;
/// let loaded = BatchPolymorphicFunction::from_json(&f.to_json()?)?; // no closure
/// let x = Tensor::ones(&[7, 2, 3], DType::F32)?;
/// let y = loaded.call(&[x])?;
/// assert_eq!(y[0].shape(), &[7, 7]);
/// assert_eq!(y[0].to_vec::<f32>()?[6], 6.0);
/// # Ok::<(), ferroflow::Error>(())
/// ```
pub struct BatchPolymorphicFunction {
    inputs: Vec<TensorSpec>,
    template: Value,
    terms: Vec<BatchTerm>,
    data: Arc<Vec<u8>>,
    graphs: Mutex<Vec<(usize, Arc<ConcreteFunction>)>>,
}

impl std::fmt::Debug for BatchPolymorphicFunction {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("BatchPolymorphicFunction")
            .field("inputs", &self.inputs)
            .field("batch_terms", &self.terms.len())
            .finish()
    }
}

impl BatchPolymorphicFunction {
    /// Traces `f` on zeros of the `inputs` specs at batch sizes 2, 3, 5 and 8 (each `None`
    /// dimension is the batch size) and keeps the graph that fits all four. The closure
    /// runs four times, seen by no tape or trace around the call; variable writes are
    /// checked, not made. Rust control flow on the batch size is seen at those four sizes
    /// only. Errors name what cannot be held: a graph whose structure changes with the batch
    /// size, an attribute or constant depending on it other than linearly, a variable
    /// (weights belong to layers), a host function.
    pub fn trace(
        inputs: Vec<TensorSpec>,
        f: impl Fn(&[Tensor]) -> Result<Vec<Tensor>>,
    ) -> Result<BatchPolymorphicFunction> {
        let encoded = |batch: usize| -> Result<Encoded> {
            let args = inputs
                .iter()
                .map(|s| Tensor::zeros(&shape_at(s, batch), s.dtype))
                .collect::<Result<Vec<_>>>()?;
            let traced = trace_branch(&args, &f)?;
            let e = encode(&ConcreteFunction::new(traced.graph, traced.folded))?;
            if let Some(name) = e.variables.first() {
                return Err(Error::invalid(
                    "BatchPolymorphicFunction",
                    format!(
                        "the function uses variable {name:?}; a batch-polymorphic graph holds \
                         no variables (give the weights to a layer)"
                    ),
                ));
            }
            Ok(e)
        };
        let (a, b) = (encoded(FIT_SIZES[0])?, encoded(FIT_SIZES[1])?);
        let mut terms = Vec::new();
        fit(&a.header, &b.header, &mut String::new(), &mut terms)?;
        if a.data != b.data {
            return Err(changed_constant(&a, &b));
        }
        let function = BatchPolymorphicFunction {
            inputs: inputs.clone(),
            template: a.header,
            terms,
            data: Arc::new(a.data),
            graphs: Mutex::new(Vec::new()),
        };
        for size in CHECK_SIZES {
            let traced = encoded(size)?;
            let fitted = function.header_at(size)?;
            if fitted != traced.header {
                let mut at = String::new();
                let path = first_difference(&fitted, &traced.header, &mut at)
                    .unwrap_or_else(|| "/".into());
                return Err(Error::invalid(
                    "BatchPolymorphicFunction",
                    format!(
                        "the graph traced at batch {size} differs from the one fitted to batches \
                         {FIT_SIZES:?} at {path} ({}): it depends on the batch size other than \
                         linearly",
                        describe(&fitted, &traced.header, &path)
                    ),
                ));
            }
            if traced.data != *function.data {
                return Err(changed_constant(&traced, &b));
            }
        }
        Ok(function)
    }

    /// The input specs (`None`: the batch size).
    pub fn inputs(&self) -> &[TensorSpec] {
        &self.inputs
    }

    /// The batch size of `args`: the size of every `None` dimension (they must agree), after
    /// checking each argument against its spec. Arguments without a `None` dimension give 1.
    pub fn batch_size_of(&self, args: &[Tensor]) -> Result<usize> {
        if args.len() != self.inputs.len() {
            return Err(Error::invalid(
                "BatchPolymorphicFunction",
                format!("takes {} arguments, got {}", self.inputs.len(), args.len()),
            ));
        }
        let mut batch = None;
        for (i, (spec, t)) in self.inputs.iter().zip(args).enumerate() {
            if !spec.accepts(t) {
                return Err(Error::invalid(
                    "BatchPolymorphicFunction",
                    format!(
                        "argument {i} (shape {:?}, dtype {}) is incompatible with {spec}",
                        t.shape(),
                        t.dtype()
                    ),
                ));
            }
            for (d, s) in spec.shape.iter().zip(t.shape()) {
                if d.is_none() {
                    match batch {
                        None => batch = Some(*s),
                        Some(b) if b != *s => {
                            return Err(Error::invalid(
                                "BatchPolymorphicFunction",
                                format!(
                                    "argument {i} has batch size {s} where an earlier one has \
                                     {b}: every None dimension is the batch size"
                                ),
                            ))
                        }
                        Some(_) => {}
                    }
                }
            }
        }
        Ok(batch.unwrap_or(1))
    }

    /// Runs the graph for `args`' batch size.
    pub fn call(&self, args: &[Tensor]) -> Result<Vec<Tensor>> {
        let batch = self.batch_size_of(args)?;
        self.concrete(batch)?.call(args)
    }

    /// The graph specialised to `batch` (built and checked on first use).
    pub fn concrete(&self, batch: usize) -> Result<Arc<ConcreteFunction>> {
        {
            let mut graphs = self.graphs.lock().unwrap_or_else(|e| e.into_inner());
            if let Some(k) = graphs.iter().position(|(b, _)| *b == batch) {
                let entry = graphs.remove(k);
                let c = entry.1.clone();
                graphs.push(entry);
                return Ok(c);
            }
        }
        let header = self.header_at(batch)?;
        let c = Arc::new(decode(
            format!("batch-polymorphic graph at batch {batch}"),
            header,
            &self.data,
            &[],
        )?);
        let mut graphs = self.graphs.lock().unwrap_or_else(|e| e.into_inner());
        if graphs.len() >= CACHED_SIZES {
            graphs.remove(0);
        }
        graphs.push((batch, c.clone()));
        Ok(c)
    }

    /// The template with its batch terms evaluated at `batch`.
    fn header_at(&self, batch: usize) -> Result<Value> {
        let mut header = self.template.clone();
        let b = i64::try_from(batch).map_err(|_| too_large(batch))?;
        for t in &self.terms {
            let v = t
                .per_batch
                .checked_mul(b)
                .and_then(|x| x.checked_add(t.offset))
                .filter(|&v| v >= 0)
                .ok_or_else(|| {
                    Error::invalid(
                        "BatchPolymorphicFunction",
                        format!(
                            "at batch {batch}, {} = {}·batch + {} is negative or too large",
                            t.path, t.per_batch, t.offset
                        ),
                    )
                })?;
            let slot = header.pointer_mut(&t.path).ok_or_else(|| {
                Error::format(
                    "batch-polymorphic graph",
                    format!("a batch term names {}, which the graph lacks", t.path),
                )
            })?;
            *slot = json!(v);
        }
        Ok(header)
    }

    /// The function as JSON (a Keras model config holds it): the input specs, the graph
    /// template, its batch terms, and the constants' bytes in base64.
    pub fn to_json(&self) -> Result<Value> {
        let inputs: Vec<Value> = self
            .inputs
            .iter()
            .map(|s| json!({"shape": s.shape, "dtype": s.dtype.as_str()}))
            .collect();
        let terms: Vec<Value> = self
            .terms
            .iter()
            .map(|t| json!({"path": t.path, "per_batch": t.per_batch, "offset": t.offset}))
            .collect();
        Ok(json!({
            "format": FORMAT,
            "inputs": inputs,
            "graph": self.template,
            "batch_terms": terms,
            "data": base64::engine::general_purpose::STANDARD.encode(self.data.as_slice()),
        }))
    }

    /// Reads [`BatchPolymorphicFunction::to_json`]'s JSON, checking it whole (the graph is
    /// built at batch 1 as a graph file is checked): a bad one is an `Error::Format` naming
    /// what is wrong.
    pub fn from_json(v: &Value) -> Result<BatchPolymorphicFunction> {
        let bad = |msg: String| Error::format("batch-polymorphic graph", msg);
        if v["format"].as_u64() != Some(FORMAT) {
            return Err(bad(format!(
                "format {} where this build reads {FORMAT}",
                v["format"]
            )));
        }
        let inputs = v["inputs"]
            .as_array()
            .ok_or_else(|| bad("no \"inputs\" list".into()))?
            .iter()
            .map(|s| {
                let dtype = s["dtype"]
                    .as_str()
                    .and_then(|d| DType::parse(d).ok())
                    .ok_or_else(|| bad(format!("an input's dtype is not a dtype: {s}")))?;
                let shape = s["shape"]
                    .as_array()
                    .and_then(|dims| {
                        dims.iter()
                            .map(|d| match d {
                                Value::Null => Some(None),
                                d => d.as_u64().and_then(|d| usize::try_from(d).ok()).map(Some),
                            })
                            .collect::<Option<Vec<_>>>()
                    })
                    .ok_or_else(|| bad(format!("an input's shape is not a shape: {s}")))?;
                Ok(TensorSpec::new(&shape, dtype))
            })
            .collect::<Result<Vec<_>>>()?;
        let terms = v["batch_terms"]
            .as_array()
            .ok_or_else(|| bad("no \"batch_terms\" list".into()))?
            .iter()
            .map(|t| {
                Some(BatchTerm {
                    path: t["path"].as_str()?.to_string(),
                    per_batch: t["per_batch"].as_i64()?,
                    offset: t["offset"].as_i64()?,
                })
            })
            .collect::<Option<Vec<_>>>()
            .ok_or_else(|| bad("a batch term is not {path, per_batch, offset}".into()))?;
        let data = base64::engine::general_purpose::STANDARD
            .decode(
                v["data"]
                    .as_str()
                    .ok_or_else(|| bad("no \"data\" string".into()))?,
            )
            .map_err(|e| bad(format!("the data is not base64: {e}")))?;
        let function = BatchPolymorphicFunction {
            inputs,
            template: v["graph"].clone(),
            terms,
            data: Arc::new(data),
            graphs: Mutex::new(Vec::new()),
        };
        function.concrete(1)?;
        Ok(function)
    }
}

fn shape_at(spec: &TensorSpec, batch: usize) -> Vec<usize> {
    spec.shape.iter().map(|d| d.unwrap_or(batch)).collect()
}

fn too_large(batch: usize) -> Error {
    Error::invalid(
        "BatchPolymorphicFunction",
        format!("batch size {batch} is too large"),
    )
}

/// A JSON pointer's escaping of one key.
fn escape(key: &str) -> String {
    key.replace('~', "~0").replace('/', "~1")
}

/// Walks `a` (the trace at the first fit size) and `b` (the second) together, adding a
/// batch term for each integer that differs; any other difference is an error.
fn fit(a: &Value, b: &Value, at: &mut String, terms: &mut Vec<BatchTerm>) -> Result<()> {
    let changed = |what: &str| {
        Error::invalid(
            "BatchPolymorphicFunction",
            format!(
                "the traced graph changes with the batch size at {at} ({what}; batch {}: {}, \
                 batch {}: {}): a graph for every batch size cannot hold it",
                FIT_SIZES[0],
                short(a),
                FIT_SIZES[1],
                short(b)
            ),
        )
    };
    match (a, b) {
        (Value::Object(x), Value::Object(y)) => {
            if x.len() != y.len() || x.keys().any(|k| !y.contains_key(k)) {
                return Err(changed("different fields"));
            }
            for (k, va) in x {
                let len = at.len();
                at.push('/');
                at.push_str(&escape(k));
                fit(va, &y[k], at, terms)?;
                at.truncate(len);
            }
            Ok(())
        }
        (Value::Array(x), Value::Array(y)) => {
            if x.len() != y.len() {
                return Err(changed("a list of another length"));
            }
            for (i, (va, vb)) in x.iter().zip(y).enumerate() {
                let len = at.len();
                at.push_str(&format!("/{i}"));
                fit(va, vb, at, terms)?;
                at.truncate(len);
            }
            Ok(())
        }
        _ if a == b => Ok(()),
        (Value::Number(x), Value::Number(y)) => match (x.as_i64(), y.as_i64()) {
            (Some(x), Some(y)) => {
                let (b0, b1) = (FIT_SIZES[0] as i64, FIT_SIZES[1] as i64);
                let nonlinear = || changed("an integer not linear in the batch size");
                let diff = y.checked_sub(x).ok_or_else(nonlinear)?;
                if diff % (b1 - b0) != 0 {
                    return Err(nonlinear());
                }
                let per_batch = diff / (b1 - b0);
                let offset = per_batch
                    .checked_mul(b0)
                    .and_then(|p| x.checked_sub(p))
                    .ok_or_else(nonlinear)?;
                terms.push(BatchTerm {
                    path: at.clone(),
                    per_batch,
                    offset,
                });
                Ok(())
            }
            _ => Err(changed("a non-integer attribute")),
        },
        _ => Err(changed("another value")),
    }
}

/// The pointer of the first place `a` and `b` differ.
fn first_difference(a: &Value, b: &Value, at: &mut String) -> Option<String> {
    match (a, b) {
        (Value::Object(x), Value::Object(y)) if x.len() == y.len() => {
            for (k, va) in x {
                let vb = y.get(k)?;
                let len = at.len();
                at.push('/');
                at.push_str(&escape(k));
                if let Some(p) = first_difference(va, vb, at) {
                    return Some(p);
                }
                at.truncate(len);
            }
            None
        }
        (Value::Array(x), Value::Array(y)) if x.len() == y.len() => {
            for (i, (va, vb)) in x.iter().zip(y).enumerate() {
                let len = at.len();
                at.push_str(&format!("/{i}"));
                if let Some(p) = first_difference(va, vb, at) {
                    return Some(p);
                }
                at.truncate(len);
            }
            None
        }
        _ if a == b => None,
        _ => Some(at.clone()),
    }
}

fn describe(fitted: &Value, traced: &Value, path: &str) -> String {
    format!(
        "fitted {}, traced {}",
        fitted.pointer(path).map_or("nothing".into(), short),
        traced.pointer(path).map_or("nothing".into(), short)
    )
}

/// A value for an error message, cut to a readable length.
fn short(v: &Value) -> String {
    let s = v.to_string();
    if s.len() > 80 {
        let cut = (0..=77).rev().find(|&i| s.is_char_boundary(i)).unwrap_or(0);
        format!("{}...", &s[..cut])
    } else {
        s
    }
}

/// The error for constants whose bytes differ between two traces, naming the first node
/// whose constant differs.
fn changed_constant(a: &Encoded, b: &Encoded) -> Error {
    let mut blobs = Vec::new();
    collect_blobs(&a.header, &mut String::new(), &mut blobs);
    let slice = |data: &[u8], (off, len): (u64, u64)| -> Option<Vec<u8>> {
        let (off, len) = (usize::try_from(off).ok()?, usize::try_from(len).ok()?);
        data.get(off..off.checked_add(len)?).map(<[u8]>::to_vec)
    };
    let node = blobs
        .iter()
        .find(|(_, blob)| slice(&a.data, *blob) != slice(&b.data, *blob))
        .map_or_else(
            || "a constant".to_string(),
            |(path, _)| format!("the constant at {path}"),
        );
    Error::invalid(
        "BatchPolymorphicFunction",
        format!(
            "{node} made inside the function has a value that depends on the batch size; \
             compute it from the inputs (ones_like, the shape of an input) or pass it in"
        ),
    )
}

/// Every constant's or captured tensor's `(offset, len)` in the data section, with the
/// pointer of its node.
fn collect_blobs(v: &Value, at: &mut String, out: &mut Vec<(String, (u64, u64))>) {
    match v {
        Value::Object(m) => {
            if let (Some(off), Some(len)) = (m.get("offset"), m.get("len")) {
                if let (Some(off), Some(len)) = (off.as_u64(), len.as_u64()) {
                    out.push((at.clone(), (off, len)));
                    return;
                }
            }
            for (k, x) in m {
                let l = at.len();
                at.push('/');
                at.push_str(&escape(k));
                collect_blobs(x, at, out);
                at.truncate(l);
            }
        }
        Value::Array(a) => {
            for (i, x) in a.iter().enumerate() {
                let l = at.len();
                at.push_str(&format!("/{i}"));
                collect_blobs(x, at, out);
                at.truncate(l);
            }
        }
        _ => {}
    }
}
