//! Nested structures of tensors (`tf.nest`): the elements that [`batch`](crate::Dataset::batch),
//! [`unbatch`](crate::Dataset::unbatch), [`cache_file`](crate::Dataset::cache_file) and
//! [`snapshot`](crate::Dataset::snapshot) take apart and put back together.
//!
//! A [`Structure`] is a [`Tensor`], a tuple of structures (up to 5), a `Vec` of structures, or a
//! `BTreeMap<String, _>` of structures (TF's dicts). It flattens to its tensors in a fixed order
//! and describes its shape with a [`Spec`]; [`Structure::from_parts`] rebuilds it.
//!
//! ```
//! ferroflow::init();
//! use ferroflow_data::{Spec, Structure};
//! use ferroflow_tensor::Tensor;
//! let x = (Tensor::from_slice(&[1.0f32, 2.0])?, vec![Tensor::scalar(3i64)?]);
//! let parts = x.flatten();
//! assert_eq!(parts.len(), 2);
//! assert_eq!(x.spec(), Spec::Tuple(vec![Spec::Tensor, Spec::List(vec![Spec::Tensor])]));
//! let back = <(Tensor, Vec<Tensor>)>::from_parts(&x.spec(), &mut parts.into_iter())?;
//! assert_eq!(back.1[0].item::<i64>()?, 3);
//! # Ok::<(), ferroflow_tensor::Error>(())
//! ```

use std::collections::BTreeMap;

use ferroflow_tensor::{DType, Error, HostData, Result, Tensor};

/// The shape of a nested structure, without the tensors (TF's `element_spec` minus shapes).
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub enum Spec {
    /// One tensor.
    Tensor,
    /// A tuple of structures.
    Tuple(Vec<Spec>),
    /// A `Vec` of structures.
    List(Vec<Spec>),
    /// A map from names to structures, in key order.
    Map(Vec<(String, Spec)>),
}

impl Spec {
    /// How many tensors a structure of this spec flattens to.
    pub fn num_tensors(&self) -> usize {
        match self {
            Spec::Tensor => 1,
            Spec::Tuple(v) | Spec::List(v) => v.iter().map(Spec::num_tensors).sum(),
            Spec::Map(v) => v.iter().map(|(_, s)| s.num_tensors()).sum(),
        }
    }

    fn encode(&self, out: &mut Vec<u8>) {
        match self {
            Spec::Tensor => out.push(0),
            Spec::Tuple(v) | Spec::List(v) => {
                out.push(if matches!(self, Spec::Tuple(_)) { 1 } else { 2 });
                out.extend_from_slice(&(v.len() as u32).to_le_bytes());
                v.iter().for_each(|s| s.encode(out));
            }
            Spec::Map(v) => {
                out.push(3);
                out.extend_from_slice(&(v.len() as u32).to_le_bytes());
                for (k, s) in v {
                    out.extend_from_slice(&(k.len() as u32).to_le_bytes());
                    out.extend_from_slice(k.as_bytes());
                    s.encode(out);
                }
            }
        }
    }

    fn decode(r: &mut ByteReader<'_>, depth: usize) -> std::result::Result<Spec, String> {
        if depth > 64 {
            return Err("structure nested deeper than 64 levels".into());
        }
        Ok(match r.u8()? {
            0 => Spec::Tensor,
            tag @ (1 | 2) => {
                let n = r.u32()? as usize;
                let children = (0..n)
                    .map(|_| Spec::decode(r, depth + 1))
                    .collect::<std::result::Result<Vec<_>, _>>()?;
                if tag == 1 {
                    Spec::Tuple(children)
                } else {
                    Spec::List(children)
                }
            }
            3 => {
                let n = r.u32()? as usize;
                let mut children = Vec::new();
                for _ in 0..n {
                    let len = r.u32()? as usize;
                    let key = String::from_utf8(r.take(len)?.to_vec())
                        .map_err(|_| "a map key is not UTF-8".to_string())?;
                    children.push((key, Spec::decode(r, depth + 1)?));
                }
                Spec::Map(children)
            }
            t => return Err(format!("unknown structure tag {t}")),
        })
    }
}

impl std::fmt::Display for Spec {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Spec::Tensor => write!(f, "Tensor"),
            Spec::Tuple(v) | Spec::List(v) => {
                let (open, close) = if matches!(self, Spec::Tuple(_)) {
                    ("(", ")")
                } else {
                    ("[", "]")
                };
                write!(f, "{open}")?;
                for (i, s) in v.iter().enumerate() {
                    if i > 0 {
                        write!(f, ", ")?;
                    }
                    write!(f, "{s}")?;
                }
                write!(f, "{close}")
            }
            Spec::Map(v) => {
                write!(f, "{{")?;
                for (i, (k, s)) in v.iter().enumerate() {
                    if i > 0 {
                        write!(f, ", ")?;
                    }
                    write!(f, "{k:?}: {s}")?;
                }
                write!(f, "}}")
            }
        }
    }
}

/// A nested structure of tensors: flattens to tensors and rebuilds from them.
pub trait Structure: Sized + Send + 'static {
    /// Appends this structure's tensors, depth first, to `out`.
    fn flatten_into(&self, out: &mut Vec<Tensor>);
    /// The structure's shape.
    fn spec(&self) -> Spec;
    /// Rebuilds a structure of `spec` from tensors in [`flatten_into`](Self::flatten_into)
    /// order; an error when the spec does not fit this type or tensors run out.
    fn from_parts(spec: &Spec, parts: &mut dyn Iterator<Item = Tensor>) -> Result<Self>;

    /// This structure's tensors, depth first.
    fn flatten(&self) -> Vec<Tensor> {
        let mut out = Vec::new();
        self.flatten_into(&mut out);
        out
    }
    /// The same structure with every tensor replaced by `f(tensor)`.
    fn map_tensors(&self, mut f: impl FnMut(&Tensor) -> Result<Tensor>) -> Result<Self> {
        let parts = self
            .flatten()
            .iter()
            .map(&mut f)
            .collect::<Result<Vec<_>>>()?;
        Self::from_parts(&self.spec(), &mut parts.into_iter())
    }
}

fn spec_error(expected: &str, got: &Spec) -> Error {
    Error::format(
        "structure",
        format!("expected {expected}, the data holds {got}"),
    )
}

impl Structure for Tensor {
    fn flatten_into(&self, out: &mut Vec<Tensor>) {
        out.push(self.clone());
    }
    fn spec(&self) -> Spec {
        Spec::Tensor
    }
    fn from_parts(spec: &Spec, parts: &mut dyn Iterator<Item = Tensor>) -> Result<Self> {
        if *spec != Spec::Tensor {
            return Err(spec_error("a tensor", spec));
        }
        parts
            .next()
            .ok_or_else(|| Error::format("structure", "fewer tensors than the structure holds"))
    }
}

macro_rules! tuple_structure {
    ($n:literal; $($name:ident $idx:tt),+) => {
        impl<$($name: Structure),+> Structure for ($($name,)+) {
            fn flatten_into(&self, out: &mut Vec<Tensor>) {
                $(self.$idx.flatten_into(out);)+
            }
            fn spec(&self) -> Spec {
                Spec::Tuple(vec![$(self.$idx.spec()),+])
            }
            fn from_parts(spec: &Spec, parts: &mut dyn Iterator<Item = Tensor>) -> Result<Self> {
                match spec {
                    Spec::Tuple(children) if children.len() == $n => {
                        Ok(($($name::from_parts(&children[$idx], parts)?,)+))
                    }
                    _ => Err(spec_error(concat!("a tuple of ", $n), spec)),
                }
            }
        }
    };
}
tuple_structure!(1; A 0);
tuple_structure!(2; A 0, B 1);
tuple_structure!(3; A 0, B 1, C 2);
tuple_structure!(4; A 0, B 1, C 2, D 3);
tuple_structure!(5; A 0, B 1, C 2, D 3, E 4);

impl<A: Structure> Structure for Vec<A> {
    fn flatten_into(&self, out: &mut Vec<Tensor>) {
        self.iter().for_each(|a| a.flatten_into(out));
    }
    fn spec(&self) -> Spec {
        Spec::List(self.iter().map(Structure::spec).collect())
    }
    fn from_parts(spec: &Spec, parts: &mut dyn Iterator<Item = Tensor>) -> Result<Self> {
        match spec {
            Spec::List(children) => children.iter().map(|s| A::from_parts(s, parts)).collect(),
            _ => Err(spec_error("a list", spec)),
        }
    }
}

impl<A: Structure> Structure for BTreeMap<String, A> {
    fn flatten_into(&self, out: &mut Vec<Tensor>) {
        self.values().for_each(|a| a.flatten_into(out));
    }
    fn spec(&self) -> Spec {
        Spec::Map(self.iter().map(|(k, v)| (k.clone(), v.spec())).collect())
    }
    fn from_parts(spec: &Spec, parts: &mut dyn Iterator<Item = Tensor>) -> Result<Self> {
        match spec {
            Spec::Map(children) => children
                .iter()
                .map(|(k, s)| Ok((k.clone(), A::from_parts(s, parts)?)))
                .collect(),
            _ => Err(spec_error("a map", spec)),
        }
    }
}

/// Reads little-endian fields out of a byte slice, with errors instead of panics.
pub(crate) struct ByteReader<'a> {
    bytes: &'a [u8],
    pos: usize,
}

impl<'a> ByteReader<'a> {
    pub(crate) fn new(bytes: &'a [u8]) -> Self {
        ByteReader { bytes, pos: 0 }
    }
    pub(crate) fn take(&mut self, n: usize) -> std::result::Result<&'a [u8], String> {
        let end = self
            .pos
            .checked_add(n)
            .filter(|&e| e <= self.bytes.len())
            .ok_or_else(|| {
                format!(
                    "truncated: {n} more bytes needed at offset {}, {} left",
                    self.pos,
                    self.bytes.len() - self.pos
                )
            })?;
        let s = &self.bytes[self.pos..end];
        self.pos = end;
        Ok(s)
    }
    pub(crate) fn u8(&mut self) -> std::result::Result<u8, String> {
        Ok(self.take(1)?[0])
    }
    pub(crate) fn u32(&mut self) -> std::result::Result<u32, String> {
        Ok(u32::from_le_bytes(
            self.take(4)?.try_into().expect("4 bytes"),
        ))
    }
    pub(crate) fn u64(&mut self) -> std::result::Result<u64, String> {
        Ok(u64::from_le_bytes(
            self.take(8)?.try_into().expect("8 bytes"),
        ))
    }
    pub(crate) fn is_done(&self) -> bool {
        self.pos == self.bytes.len()
    }
}

/// The dtype's code in ferroflow's record format (fixed: files keep their meaning whatever
/// dtypes are added later).
fn dtype_code(d: DType) -> u8 {
    match d {
        DType::F16 => 0,
        DType::BF16 => 1,
        DType::F32 => 2,
        DType::F64 => 3,
        DType::I8 => 4,
        DType::I32 => 5,
        DType::I64 => 6,
        DType::U8 => 7,
        DType::Bool => 8,
        DType::I16 => 9,
        DType::U16 => 10,
        DType::U32 => 11,
        DType::U64 => 12,
        DType::C64 => 13,
        DType::C128 => 14,
    }
}

/// Serializes one element (its spec, then each tensor's dtype, shape and little-endian data):
/// the payload of a record in [`cache_file`](crate::Dataset::cache_file) and
/// [`snapshot`](crate::Dataset::snapshot) files.
pub fn encode_element<T: Structure>(element: &T) -> Result<Vec<u8>> {
    let tensors = element.flatten();
    let data: usize = tensors
        .iter()
        .map(|t| t.num_elements() * t.dtype().size_in_bytes() + 2 + 8 * t.rank())
        .sum();
    let mut out = Vec::with_capacity(data + 64);
    element.spec().encode(&mut out);
    for t in tensors {
        out.push(dtype_code(t.dtype()));
        out.push(t.rank() as u8);
        for &d in t.shape() {
            out.extend_from_slice(&(d as u64).to_le_bytes());
        }
        // Straight from a CPU tensor's storage (one copy), else from its host copy.
        t.extend_le_bytes(&mut out)?;
    }
    Ok(out)
}

/// The inverse of [`encode_element`]; `what` names the source in errors.
pub fn decode_element<T: Structure>(bytes: &[u8], what: &str) -> Result<T> {
    let err = |msg: String| Error::format(what, msg);
    let mut r = ByteReader::new(bytes);
    let spec = Spec::decode(&mut r, 0).map_err(err)?;
    let mut tensors = Vec::with_capacity(spec.num_tensors());
    for _ in 0..spec.num_tensors() {
        let code = r.u8().map_err(err)?;
        let dtype = DType::ALL
            .into_iter()
            .find(|&d| dtype_code(d) == code)
            .ok_or_else(|| err(format!("unknown dtype code {code}")))?;
        let rank = r.u8().map_err(err)? as usize;
        let shape = (0..rank)
            .map(|_| r.u64().map(|d| d as usize))
            .collect::<std::result::Result<Vec<_>, _>>()
            .map_err(err)?;
        let n = shape
            .iter()
            .try_fold(1usize, |a, &d| a.checked_mul(d))
            .and_then(|n| n.checked_mul(dtype.size_in_bytes()))
            .ok_or_else(|| err(format!("shape {shape:?} overflows")))?;
        let data = r.take(n).map_err(err)?;
        let host =
            HostData::from_le_bytes(dtype, data).ok_or_else(|| err(format!("bad {dtype} data")))?;
        tensors.push(Tensor::from_host(host, &shape)?);
    }
    if !r.is_done() {
        return Err(err("trailing bytes after the element".into()));
    }
    T::from_parts(&spec, &mut tensors.into_iter())
}
