//! Graph files: a [`ConcreteFunction`] written to one file and loaded back without the
//! closure that traced it (TF keeps a SavedModel's concrete functions the same way); the
//! basis of an inference runtime.
//!
//! # Layout
//! `FFGRAPH\0`, the format version (u32), the header's length (u64), the header, then the
//! data section; integers little-endian. The header is JSON: the graph's nodes in order
//! (each op with its attributes, its inputs, its outputs' shapes and dtypes, its name
//! scope; control-flow nodes with their branches' graphs), the returned values, and the
//! variables the graph reads or writes. The data section holds the elements of constants
//! and captured tensors (little-endian, as `.npy` and safetensors hold them), each at an
//! offset and length the header names.
//!
//! Variables are held by reference: the file names them, with their dtype and shape, and
//! [`ConcreteFunction::load`] binds each to the caller's variable of that name (a model's
//! weights, loaded from their own file), so a loaded function reads and updates the
//! caller's variables as the traced one did. Captured tensors are saved by value.
//!
//! Loading checks everything before anything runs: the magic and version, every length and
//! offset against the file, every node's inputs against earlier nodes, control-flow nodes
//! against their branches' arities, every constant's size against its type, and every
//! variable against the one bound to it; a bad file is an [`Error::Format`] naming what is
//! wrong, never a panic. When the graph runs, each node's outputs are checked against the
//! types the file records.

use crate::control::{CondOp, WhileOp};
use crate::function::ConcreteFunction;
use crate::graph::{Graph, Node, NodeKind, ValueRef, ValueType};
use ferroflow_tensor::distribution::VariableWrite;
use ferroflow_tensor::{Error, HostData, Op, Result, Tensor, Variable};
use serde::{Deserialize, Serialize};
use std::collections::HashMap;
use std::path::Path;
use std::sync::Arc;

/// The first bytes of a graph file.
const MAGIC: &[u8; 8] = b"FFGRAPH\0";
/// The format version this build writes and reads.
const VERSION: u32 = 1;
/// Magic, version and header length.
const PREAMBLE: usize = 8 + 4 + 8;
/// Constants start at multiples of this in the data section.
const ALIGNMENT: usize = 64;

#[derive(Serialize, Deserialize)]
struct Header {
    variables: Vec<SavedVariable>,
    graph: SavedGraph,
}

#[derive(Serialize, Deserialize)]
struct SavedVariable {
    name: String,
    #[serde(flatten)]
    value_type: ValueType,
}

#[derive(Serialize, Deserialize)]
struct SavedGraph {
    num_args: usize,
    nodes: Vec<SavedNode>,
    outputs: Vec<ValueRef>,
}

#[derive(Serialize, Deserialize)]
struct SavedNode {
    kind: SavedKind,
    #[serde(default)]
    inputs: Vec<ValueRef>,
    outputs: Vec<ValueType>,
    #[serde(default)]
    scope: String,
}

/// Where a tensor's elements are in the data section.
#[derive(Serialize, Deserialize)]
struct Blob {
    offset: u64,
    len: u64,
}

#[derive(Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
enum SavedKind {
    Arg {
        index: usize,
    },
    Constant {
        data: Blob,
    },
    Captured {
        data: Blob,
    },
    ReadVariable {
        variable: usize,
    },
    Op {
        op: Op,
    },
    WriteVariable {
        variable: usize,
        write: VariableWrite,
    },
    Cond {
        then_branch: SavedGraph,
        else_branch: SavedGraph,
    },
    While(SavedLoop),
    WhileGrad(SavedLoop),
}

#[derive(Serialize, Deserialize)]
struct SavedLoop {
    condition: SavedGraph,
    body: SavedGraph,
    num_vars: usize,
    maximum_iterations: Option<usize>,
}

/// Builds the header and the data section from a graph.
#[derive(Default)]
struct Writer {
    data: Vec<u8>,
    variables: Vec<SavedVariable>,
    /// Variable id → its index in `variables`.
    index: HashMap<u64, usize>,
    /// Variable name → the id of the variable saved under it.
    names: HashMap<String, u64>,
}

impl Writer {
    fn graph(&mut self, graph: &Graph) -> Result<SavedGraph> {
        let nodes = graph
            .nodes
            .iter()
            .enumerate()
            .map(|(i, n)| {
                Ok(SavedNode {
                    kind: self.kind(i, n)?,
                    inputs: n.inputs.clone(),
                    outputs: n.outputs.clone(),
                    scope: n.scope.to_string(),
                })
            })
            .collect::<Result<_>>()?;
        Ok(SavedGraph {
            num_args: graph.num_args,
            nodes,
            outputs: graph.outputs.clone(),
        })
    }

    fn kind(&mut self, i: usize, node: &Node) -> Result<SavedKind> {
        Ok(match &node.kind {
            NodeKind::Arg(index) => SavedKind::Arg { index: *index },
            NodeKind::Constant(t) => SavedKind::Constant {
                data: self.blob(t)?,
            },
            NodeKind::Captured(t) => SavedKind::Captured {
                data: self.blob(t)?,
            },
            NodeKind::ReadVariable(v) => SavedKind::ReadVariable {
                variable: self.variable(v)?,
            },
            NodeKind::Op(Op::HostFunction { name }) => {
                return Err(Error::invalid(
                    "save",
                    format!(
                        "node %{i} computes {name} on the host (outside the op set), which a \
                         graph file cannot hold; call it outside the function"
                    ),
                ))
            }
            NodeKind::Op(op) => SavedKind::Op { op: op.clone() },
            NodeKind::WriteVariable { variable, kind } => SavedKind::WriteVariable {
                variable: self.variable(variable)?,
                write: *kind,
            },
            NodeKind::Cond(op) => SavedKind::Cond {
                then_branch: self.graph(op.then_branch().graph())?,
                else_branch: self.graph(op.else_branch().graph())?,
            },
            NodeKind::While(op) => SavedKind::While(self.saved_loop(op)?),
            NodeKind::WhileGrad(op) => SavedKind::WhileGrad(self.saved_loop(op)?),
            NodeKind::HostCall(call) => {
                return Err(Error::invalid(
                    "save",
                    format!(
                        "node %{i} is the host call {:?} (a Rust closure), which a graph file \
                         cannot hold; call it outside the function",
                        call.name()
                    ),
                ))
            }
        })
    }

    fn saved_loop(&mut self, op: &WhileOp) -> Result<SavedLoop> {
        Ok(SavedLoop {
            condition: self.graph(op.condition().graph())?,
            body: self.graph(op.body().graph())?,
            num_vars: op.num_vars(),
            maximum_iterations: op.maximum_iterations(),
        })
    }

    fn blob(&mut self, t: &Tensor) -> Result<Blob> {
        let host = t.to_host()?;
        let bytes = host.le_bytes();
        self.data
            .resize(self.data.len().next_multiple_of(ALIGNMENT), 0);
        let offset = self.data.len() as u64;
        self.data.extend_from_slice(&bytes);
        Ok(Blob {
            offset,
            len: bytes.len() as u64,
        })
    }

    fn variable(&mut self, v: &Variable) -> Result<usize> {
        if let Some(&k) = self.index.get(&v.id()) {
            return Ok(k);
        }
        if let Some(&other) = self.names.get(v.name()) {
            if other != v.id() {
                return Err(Error::invalid(
                    "save",
                    format!(
                        "the graph uses two variables named {:?}; a graph file binds variables \
                         by name, so give them distinct names",
                        v.name()
                    ),
                ));
            }
        }
        let k = self.variables.len();
        self.variables.push(SavedVariable {
            name: v.name().to_string(),
            value_type: ValueType {
                shape: v.shape(),
                dtype: v.dtype(),
            },
        });
        self.index.insert(v.id(), k);
        self.names.insert(v.name().to_string(), v.id());
        Ok(k)
    }
}

/// A graph in the file's two parts: the JSON header and the data section.
pub(crate) struct Encoded {
    pub header: serde_json::Value,
    pub data: Vec<u8>,
    /// The names of the variables the graph reads or writes.
    pub variables: Vec<String>,
}

/// The header and data section of `function`'s graph (constants read back on the host).
pub(crate) fn encode(function: &ConcreteFunction) -> Result<Encoded> {
    // Constants are read back on the host, also when a trace is running around the call.
    let _outside_the_trace = ferroflow_tensor::dispatch::init_scope();
    let mut writer = Writer::default();
    let graph = writer.graph(function.graph())?;
    let header = Header {
        variables: std::mem::take(&mut writer.variables),
        graph,
    };
    let variables = header.variables.iter().map(|v| v.name.clone()).collect();
    let header = serde_json::to_value(&header)
        .map_err(|e| Error::invalid("save", format!("cannot encode the graph: {e}")))?;
    Ok(Encoded {
        header,
        data: writer.data,
        variables,
    })
}

/// Writes `function` to `path` (crash-safe: temporary file, fsync, rename).
pub(crate) fn save(function: &ConcreteFunction, path: &Path) -> Result<()> {
    let encoded = encode(function)?;
    let json = serde_json::to_vec(&encoded.header).map_err(|e| {
        Error::format(
            path.display().to_string(),
            format!("cannot encode the graph: {e}"),
        )
    })?;
    let mut bytes = Vec::with_capacity(PREAMBLE + json.len() + encoded.data.len());
    bytes.extend_from_slice(MAGIC);
    bytes.extend_from_slice(&VERSION.to_le_bytes());
    bytes.extend_from_slice(&(json.len() as u64).to_le_bytes());
    bytes.extend_from_slice(&json);
    bytes.extend_from_slice(&encoded.data);
    ferroflow_tensor::fs::write_atomic(path, &bytes)
}

/// Checks a file's graphs and builds them, binding variables by name.
struct Reader<'a> {
    what: String,
    data: &'a [u8],
    variables: Vec<Variable>,
}

impl Reader<'_> {
    fn bad(&self, msg: impl Into<String>) -> Error {
        Error::format(self.what.clone(), msg.into())
    }

    fn graph(&self, saved: &SavedGraph, at: &str) -> Result<Graph> {
        let mut nodes: Vec<Node> = Vec::with_capacity(saved.nodes.len());
        let mut args_seen = vec![false; saved.num_args];
        let check_ref = |nodes: &[Node], v: &ValueRef, here: &str| -> Result<()> {
            match nodes.get(v.node) {
                Some(n) if v.output < n.outputs.len() => Ok(()),
                _ => Err(self.bad(format!(
                    "{here} reads %{}:{}, which no earlier node makes",
                    v.node, v.output
                ))),
            }
        };
        for (i, s) in saved.nodes.iter().enumerate() {
            let here = format!("{at}node %{i}");
            for v in &s.inputs {
                check_ref(&nodes, v, &here)?;
            }
            for t in &s.outputs {
                if byte_size(t).is_none() {
                    return Err(self.bad(format!(
                        "{here}: an output of shape {:?} {} is too large",
                        t.shape, t.dtype
                    )));
                }
            }
            let arity = |inputs: usize, outputs: usize| -> Result<()> {
                if s.inputs.len() == inputs && s.outputs.len() == outputs {
                    Ok(())
                } else {
                    Err(self.bad(format!(
                        "{here} has {} inputs and {} outputs, its kind takes {inputs} and makes \
                         {outputs}",
                        s.inputs.len(),
                        s.outputs.len()
                    )))
                }
            };
            let kind = match &s.kind {
                SavedKind::Arg { index } => {
                    arity(0, 1)?;
                    match args_seen.get_mut(*index) {
                        Some(seen) if !*seen => *seen = true,
                        _ => {
                            return Err(self.bad(format!(
                                "{here} is argument {index} of a graph of {} arguments (or a \
                                 second node for it)",
                                saved.num_args
                            )))
                        }
                    }
                    NodeKind::Arg(*index)
                }
                SavedKind::Constant { data } => {
                    arity(0, 1)?;
                    NodeKind::Constant(self.tensor(data, &s.outputs[0], &here)?)
                }
                SavedKind::Captured { data } => {
                    arity(0, 1)?;
                    NodeKind::Captured(self.tensor(data, &s.outputs[0], &here)?)
                }
                SavedKind::ReadVariable { variable } => {
                    arity(0, 1)?;
                    let v = self.variable(*variable, &here)?;
                    NodeKind::ReadVariable(v)
                }
                SavedKind::Op { op } => NodeKind::Op(op.clone()),
                SavedKind::WriteVariable { variable, write } => {
                    arity(1, 0)?;
                    NodeKind::WriteVariable {
                        variable: self.variable(*variable, &here)?,
                        kind: *write,
                    }
                }
                SavedKind::Cond {
                    then_branch,
                    else_branch,
                } => {
                    let then_graph = self.graph(then_branch, &format!("{here} (true branch), "))?;
                    let else_graph =
                        self.graph(else_branch, &format!("{here} (false branch), "))?;
                    let takes = s.inputs.len().checked_sub(1);
                    for g in [&then_graph, &else_graph] {
                        if takes != Some(g.num_args) || g.outputs.len() != s.outputs.len() {
                            return Err(self.bad(format!(
                                "{here}: a cond of {} inputs (the predicate first) and {} \
                                 outputs has a branch of {} arguments and {} results",
                                s.inputs.len(),
                                s.outputs.len(),
                                g.num_args,
                                g.outputs.len()
                            )));
                        }
                    }
                    NodeKind::Cond(Arc::new(CondOp::from_branches(
                        ConcreteFunction::from_graph(then_graph),
                        ConcreteFunction::from_graph(else_graph),
                    )))
                }
                SavedKind::While(l) => {
                    let op = self.while_op(l, s.inputs.len(), &here)?;
                    if s.outputs.len() != l.num_vars {
                        return Err(self.bad(format!(
                            "{here}: a while loop of {} loop variables makes {} outputs",
                            l.num_vars,
                            s.outputs.len()
                        )));
                    }
                    NodeKind::While(op)
                }
                SavedKind::WhileGrad(l) => {
                    // Inputs: the loop's inputs, then one gradient per loop variable;
                    // outputs: one gradient per loop input.
                    let op = self.while_op(l, s.outputs.len(), &here)?;
                    if s.inputs.len() != s.outputs.len() + l.num_vars {
                        return Err(self.bad(format!(
                            "{here}: a while loop's gradient over {} inputs and {} loop \
                             variables reads {} values",
                            s.outputs.len(),
                            l.num_vars,
                            s.inputs.len()
                        )));
                    }
                    NodeKind::WhileGrad(op)
                }
            };
            if let NodeKind::ReadVariable(v) = &kind {
                let recorded = &s.outputs[0];
                if v.shape() != recorded.shape || v.dtype() != recorded.dtype {
                    return Err(self.bad(format!(
                        "{here} reads variable {:?} as {:?} {}, the variable bound to it is {:?} {}",
                        v.name(),
                        recorded.shape,
                        recorded.dtype,
                        v.shape(),
                        v.dtype()
                    )));
                }
            }
            nodes.push(Node {
                kind,
                inputs: s.inputs.clone(),
                outputs: s.outputs.clone(),
                scope: s.scope.as_str().into(),
            });
        }
        for v in &saved.outputs {
            check_ref(&nodes, v, &format!("{at}the result"))?;
        }
        Ok(Graph {
            nodes,
            outputs: saved.outputs.clone(),
            num_args: saved.num_args,
        })
    }

    fn while_op(&self, l: &SavedLoop, inputs: usize, here: &str) -> Result<Arc<WhileOp>> {
        let condition = self.graph(&l.condition, &format!("{here} (condition), "))?;
        let body = self.graph(&l.body, &format!("{here} (body), "))?;
        if condition.num_args != inputs
            || body.num_args != inputs
            || l.num_vars > inputs
            || condition.outputs.len() != 1
            || body.outputs.len() != l.num_vars
        {
            return Err(self.bad(format!(
                "{here}: a while loop over {inputs} inputs ({} loop variables) has a condition \
                 of {} arguments and {} results and a body of {} arguments and {} results",
                l.num_vars,
                condition.num_args,
                condition.outputs.len(),
                body.num_args,
                body.outputs.len()
            )));
        }
        Ok(Arc::new(WhileOp::from_parts(
            ConcreteFunction::from_graph(condition),
            ConcreteFunction::from_graph(body),
            l.num_vars,
            l.maximum_iterations,
        )))
    }

    fn tensor(&self, blob: &Blob, t: &ValueType, here: &str) -> Result<Tensor> {
        let expected = byte_size(t).unwrap_or(usize::MAX);
        let start = usize::try_from(blob.offset).ok();
        let end = start.and_then(|s| s.checked_add(usize::try_from(blob.len).ok()?));
        let bytes = match (start, end) {
            (Some(s), Some(e)) if e <= self.data.len() => &self.data[s..e],
            _ => {
                return Err(self.bad(format!(
                    "{here}: its {} bytes at offset {} lie outside the data section ({} bytes)",
                    blob.len,
                    blob.offset,
                    self.data.len()
                )))
            }
        };
        if bytes.len() != expected {
            return Err(self.bad(format!(
                "{here}: {} bytes for a {:?} {} tensor, which takes {expected}",
                bytes.len(),
                t.shape,
                t.dtype
            )));
        }
        let host = HostData::from_le_bytes(t.dtype, bytes).ok_or_else(|| {
            self.bad(format!(
                "{here}: the bytes are not {} elements of {}",
                t.shape.iter().product::<usize>(),
                t.dtype
            ))
        })?;
        Tensor::from_host(host, &t.shape)
    }

    fn variable(&self, k: usize, here: &str) -> Result<Variable> {
        self.variables.get(k).cloned().ok_or_else(|| {
            self.bad(format!(
                "{here} names variable {k}, the file lists {}",
                self.variables.len()
            ))
        })
    }
}

/// Bytes of a dense buffer of `t`, or `None` when that overflows.
fn byte_size(t: &ValueType) -> Option<usize> {
    t.shape
        .iter()
        .try_fold(t.dtype.size_in_bytes(), |acc, &d| acc.checked_mul(d))
        .filter(|&b| b <= isize::MAX as usize)
}

/// Reads a graph file and binds its variables by name to `variables`.
pub(crate) fn load(path: &Path, variables: &[Variable]) -> Result<ConcreteFunction> {
    let what = path.display().to_string();
    let bytes = std::fs::read(path).map_err(|e| Error::io(path, &e))?;
    let bad = |msg: String| Error::format(what.clone(), msg);
    if bytes.len() < PREAMBLE || &bytes[..8] != MAGIC {
        return Err(bad(
            "not a ferroflow graph file (it does not start with FFGRAPH)".into(),
        ));
    }
    let (mut version, mut header_len) = ([0u8; 4], [0u8; 8]);
    version.copy_from_slice(&bytes[8..12]);
    header_len.copy_from_slice(&bytes[12..20]);
    let (version, header_len) = (u32::from_le_bytes(version), u64::from_le_bytes(header_len));
    if version != VERSION {
        return Err(bad(format!(
            "graph file format version {version}; this build reads version {VERSION}"
        )));
    }
    let header_end = usize::try_from(header_len)
        .ok()
        .and_then(|n| PREAMBLE.checked_add(n))
        .filter(|&end| end <= bytes.len())
        .ok_or_else(|| {
            bad(format!(
                "the header claims {header_len} bytes, the file has {} after the preamble",
                bytes.len() - PREAMBLE
            ))
        })?;
    let header: Header = serde_json::from_slice(&bytes[PREAMBLE..header_end])
        .map_err(|e| bad(format!("the header is not a graph: {e}")))?;
    build(what, header, &bytes[header_end..], variables)
}

/// Builds a graph from a header (as [`encode`] makes it) and its data section, checking
/// both as [`load`] checks a file; `what` names the source in errors.
pub(crate) fn decode(
    what: String,
    header: serde_json::Value,
    data: &[u8],
    variables: &[Variable],
) -> Result<ConcreteFunction> {
    let header: Header = serde_json::from_value(header)
        .map_err(|e| Error::format(what.clone(), format!("the header is not a graph: {e}")))?;
    build(what, header, data, variables)
}

fn build(
    what: String,
    header: Header,
    data: &[u8],
    variables: &[Variable],
) -> Result<ConcreteFunction> {
    let bound = header
        .variables
        .iter()
        .map(|saved| bind(saved, variables).map_err(|msg| Error::format(what.clone(), msg)))
        .collect::<Result<Vec<_>>>()?;
    let reader = Reader {
        what,
        data,
        variables: bound,
    };
    let graph = reader.graph(&header.graph, "")?;
    Ok(ConcreteFunction::from_graph(graph))
}

/// The one variable in `given` named as `saved`, of its dtype and shape.
fn bind(saved: &SavedVariable, given: &[Variable]) -> std::result::Result<Variable, String> {
    let mut named = given.iter().filter(|v| v.name() == saved.name);
    let v = named.next().ok_or_else(|| {
        format!(
            "the graph uses variable {:?} ({:?} {}); pass it to load",
            saved.name, saved.value_type.shape, saved.value_type.dtype
        )
    })?;
    if named.any(|other| other.id() != v.id()) {
        return Err(format!(
            "two of the variables passed to load are named {:?}; the graph binds by name",
            saved.name
        ));
    }
    if v.shape() != saved.value_type.shape || v.dtype() != saved.value_type.dtype {
        return Err(format!(
            "variable {:?} is {:?} {}, the graph was traced with {:?} {}",
            saved.name,
            v.shape(),
            v.dtype(),
            saved.value_type.shape,
            saved.value_type.dtype
        ));
    }
    Ok(v.clone())
}
