//! The CPU buffer (a typed host vector) and the helpers kernels use to read views.

use ferroflow_tensor::{DType, DeviceBuffer, Element, Error, HostData, Layout, Operand, Result};
use half::slice::HalfFloatSliceExt;
use half::{bf16, f16};
use std::any::Any;
use std::borrow::Cow;

/// Host memory holding one dense typed vector.
pub struct CpuBuffer(pub HostData);

impl DeviceBuffer for CpuBuffer {
    fn as_any(&self) -> &dyn Any {
        self
    }
    fn size_in_bytes(&self) -> usize {
        self.0.size_in_bytes()
    }
}

/// The host data behind an operand (a buffer from another backend is a bug upstream, reported
/// as an error rather than a panic).
pub(crate) fn host<'a>(x: &Operand<'a>) -> Result<&'a HostData> {
    x.buffer
        .as_any()
        .downcast_ref::<CpuBuffer>()
        .map(|b| &b.0)
        .ok_or_else(|| Error::Backend {
            backend: "cpu",
            msg: "received a buffer owned by another backend".into(),
        })
}

/// The view's elements, dense and row-major: borrowed when the layout already is.
pub(crate) fn dense<'a, T: Element>(v: &'a [T], layout: &Layout) -> Cow<'a, [T]> {
    if let Some((off, n)) = layout.contiguous_range() {
        return Cow::Borrowed(&v[off..off + n]);
    }
    let mut out = Vec::with_capacity(layout.num_elements());
    layout.for_each_offset(|o| out.push(v[o]));
    Cow::Owned(out)
}

/// f16/bf16 storage widened to f32 (the whole buffer, so the layout still applies).
pub(crate) fn widen(data: &HostData) -> Option<Vec<f32>> {
    match data {
        HostData::F16(v) => {
            let mut out = vec![0f32; v.len()];
            v.convert_to_f32_slice(&mut out);
            Some(out)
        }
        HostData::BF16(v) => {
            let mut out = vec![0f32; v.len()];
            v.convert_to_f32_slice(&mut out);
            Some(out)
        }
        _ => None,
    }
}

/// f32 results narrowed back to a half dtype (or kept as f32).
pub(crate) fn narrow(v: Vec<f32>, dtype: DType) -> HostData {
    match dtype {
        DType::F16 => {
            let mut o = vec![f16::ZERO; v.len()];
            o.convert_from_f32_slice(&v);
            HostData::F16(o)
        }
        DType::BF16 => {
            let mut o = vec![bf16::ZERO; v.len()];
            o.convert_from_f32_slice(&v);
            HostData::BF16(o)
        }
        _ => HostData::F32(v),
    }
}

/// Boxes host data as a kernel output.
pub(crate) fn out(d: HostData) -> Result<ferroflow_tensor::BufferBox> {
    Ok(Box::new(CpuBuffer(d)))
}

/// Splits `[.., axis, ..]` of a shape into (outer, axis size, inner) element counts.
pub(crate) fn split_at_axis(shape: &[usize], axis: usize) -> (usize, usize, usize) {
    (
        shape[..axis].iter().product(),
        shape[axis],
        shape[axis + 1..].iter().product(),
    )
}

/// A zeroed vector for a kernel's output. (Large buffers are recycled by malloc, see
/// [`crate::register`], so no page-fault tricks are needed here.)
pub(crate) fn zeroed<T: Copy + Default>(n: usize) -> Vec<T> {
    vec![T::default(); n]
}
