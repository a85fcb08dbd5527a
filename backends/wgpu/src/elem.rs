//! How each dtype lives on the GPU and in WGSL, and the parameter blocks kernels read.

use crate::gpu::Gpu;
use ferroflow_tensor::backend::unsupported;
use ferroflow_tensor::{DType, Layout, Result};

/// A dtype as stored in a wgpu buffer.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub(crate) enum Elem {
    F32,
    /// Needs the adapter's `SHADER_F16`.
    F16,
    I32,
    /// Unsigned 32-bit integers (WGSL's `u32`: wrapping arithmetic).
    U32,
    /// One `u32` (0 or 1) per element.
    Bool,
    /// Two `u32` words (low, high) per element: storage, movement, casts, equality and
    /// indices only (argmax results, gather indices); arithmetic needs a cast first.
    I64,
}

impl Elem {
    /// The storage of `dtype` on `gpu`, or the "not supported" error naming dtype and device.
    pub fn of(gpu: &Gpu, dtype: DType, op: &'static str) -> Result<Elem> {
        Ok(match dtype {
            DType::F32 => Elem::F32,
            DType::F16 if gpu.f16 => Elem::F16,
            DType::I32 => Elem::I32,
            DType::U32 => Elem::U32,
            DType::Bool => Elem::Bool,
            DType::I64 => Elem::I64,
            _ => return Err(unsupported_on(gpu, op, dtype)),
        })
    }
    pub fn dtype(self) -> DType {
        match self {
            Elem::F32 => DType::F32,
            Elem::F16 => DType::F16,
            Elem::I32 => DType::I32,
            Elem::U32 => DType::U32,
            Elem::Bool => DType::Bool,
            Elem::I64 => DType::I64,
        }
    }
    /// Bytes per element in a buffer.
    pub fn bytes(self) -> usize {
        match self {
            Elem::F16 => 2,
            Elem::I64 => 8,
            _ => 4,
        }
    }
    /// The WGSL element type of the buffer array.
    pub fn store(self) -> &'static str {
        match self {
            Elem::F32 => "f32",
            Elem::F16 => "f16",
            Elem::I32 => "i32",
            Elem::U32 | Elem::Bool => "u32",
            Elem::I64 => "vec2<u32>",
        }
    }
    /// The element type for kernels that only move data (bit copies).
    pub fn mov(self) -> &'static str {
        match self {
            Elem::F16 => "f16",
            Elem::I64 => "vec2<u32>",
            _ => "u32",
        }
    }
    /// The WGSL type kernels compute in (f16 computes in f32), `None` for storage-only types.
    pub fn compute(self) -> Option<&'static str> {
        match self {
            Elem::F32 | Elem::F16 => Some("f32"),
            Elem::I32 => Some("i32"),
            Elem::U32 | Elem::Bool => Some("u32"),
            Elem::I64 => None,
        }
    }
    pub fn is_float(self) -> bool {
        matches!(self, Elem::F32 | Elem::F16)
    }
    /// WGSL converting a stored value `v` to the compute type.
    pub fn load(self, v: &str) -> String {
        match self {
            Elem::F16 => format!("f32({v})"),
            _ => v.to_string(),
        }
    }
    /// WGSL converting a compute value `v` to the stored type.
    pub fn store_expr(self, v: &str) -> String {
        match self {
            Elem::F16 => format!("to_f16({v})"),
            _ => v.to_string(),
        }
    }
}

/// The "not supported" error for a dtype the wgpu backend has no kernel for on this adapter.
pub(crate) fn unsupported_on(gpu: &Gpu, op: &'static str, dtype: DType) -> ferroflow_tensor::Error {
    let why = match dtype {
        DType::F16 => " (the adapter lacks SHADER_F16)",
        DType::F64 => " (WGSL has no f64)",
        _ => "",
    };
    let mut e = unsupported("wgpu", op, dtype);
    if let ferroflow_tensor::Error::NotSupportedByBackend { detail, .. } = &mut e {
        detail.push_str(&format!(
            "{why} on {} ({:?}); cast to float32 or int32, or use the CPU",
            gpu.info.name, gpu.info.backend
        ));
    }
    e
}

/// A layout as a WGSL descriptor `[rank, offset, dims.., strides..]`, with unit axes dropped
/// and axes that are contiguous with each other merged (fewer divisions per index).
pub(crate) fn descriptor(dims: &[usize], strides: &[isize], offset: usize) -> Vec<u32> {
    let mut d: Vec<(usize, isize)> = vec![];
    for (&n, &s) in dims.iter().zip(strides) {
        if n == 1 {
            continue;
        }
        if let Some(last) = d.last_mut() {
            if last.1 == s * n as isize {
                last.0 *= n;
                last.1 = s;
                continue;
            }
        }
        d.push((n, s));
    }
    let mut out = vec![d.len() as u32, offset as u32];
    out.extend(d.iter().map(|&(n, _)| n as u32));
    out.extend(d.iter().map(|&(_, s)| s as i32 as u32));
    out
}

/// The descriptor of a whole layout.
pub(crate) fn layout_descriptor(l: &Layout) -> Vec<u32> {
    descriptor(l.shape(), l.strides(), l.offset())
}

/// A kernel's parameter block: word 0 the item count, words 1..4 the offsets of up to three
/// descriptors, words 4..16 scalars, descriptors from word 16.
pub(crate) struct Params(pub Vec<u32>);

impl Params {
    pub fn new(n: usize) -> Params {
        let mut w = vec![0u32; 16];
        w[0] = n as u32;
        Params(w)
    }
    /// Sets scalar `slot` (4..16).
    pub fn set(mut self, slot: usize, v: u32) -> Params {
        self.0[slot] = v;
        self
    }
    /// Appends descriptor `i` (0..3).
    pub fn desc(mut self, i: usize, d: Vec<u32>) -> Params {
        self.0[1 + i] = self.0.len() as u32;
        self.0.extend(d);
        self
    }
    /// Appends raw words (kernel-specific tables) at the end, returning where they start.
    pub fn table(mut self, slot: usize, words: &[u32]) -> Params {
        self.0[slot] = self.0.len() as u32;
        self.0.extend_from_slice(words);
        self
    }
}

/// Checks that a tensor's element count fits the 32-bit indexing of the kernels.
pub(crate) fn check_len(op: &'static str, n: usize) -> Result<()> {
    if n > u32::MAX as usize / 2 {
        return Err(crate::gpu::backend_error(format!(
            "{op}: {n} elements exceed the wgpu kernels' 32-bit indexing"
        )));
    }
    Ok(())
}
