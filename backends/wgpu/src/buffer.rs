//! The wgpu device buffer: a pooled storage buffer that returns to its device's pool on drop.

use crate::elem::Elem;
use crate::gpu::{backend_error, Gpu};
use ferroflow_tensor::{DeviceBuffer, Operand, Result};
use std::any::Any;
use std::sync::Arc;

/// A tensor's storage on a wgpu device: `len` elements of one dtype in a pooled buffer.
/// Tensors own it through the `Backend` trait; users meet it only as
/// `tensor.buffer().as_any().downcast_ref::<WgpuBuffer>()`.
pub struct WgpuBuffer {
    pub(crate) gpu: Arc<Gpu>,
    pub(crate) buffer: Option<wgpu::Buffer>,
    pub(crate) elem: Elem,
    pub(crate) len: usize,
    /// Shared with the device's constant cache: not returned to the pool on drop.
    pub(crate) shared: bool,
}

impl WgpuBuffer {
    pub(crate) fn raw(&self) -> &wgpu::Buffer {
        self.buffer
            .as_ref()
            .expect("a live WgpuBuffer holds its buffer")
    }
}

impl Drop for WgpuBuffer {
    fn drop(&mut self) {
        if let Some(b) = self.buffer.take() {
            if !self.shared {
                self.gpu.recycle(b);
            }
        }
    }
}

impl DeviceBuffer for WgpuBuffer {
    fn as_any(&self) -> &dyn Any {
        self
    }
    fn size_in_bytes(&self) -> usize {
        self.len * self.elem.bytes()
    }
}

/// The wgpu buffer behind an operand (a buffer of another backend is reported, not a panic).
pub(crate) fn gpu_buffer<'a>(x: &Operand<'a>) -> Result<&'a WgpuBuffer> {
    x.buffer
        .as_any()
        .downcast_ref::<WgpuBuffer>()
        .ok_or_else(|| backend_error("received a buffer owned by another backend"))
}
