//! The primitive ops as WGSL kernels, one module per family; each kernel's WGSL is in
//! `src/wgsl/` (the shared libraries and one template per kernel family, included at compile
//! time), and each family has a function that builds a kernel's full source from its
//! variant (op, element types) without a GPU, so `catalog.rs` lists every shader the backend
//! can build and its test validates each with naga on any machine.
//!
//! At run time an op builds its kernel once per variant (`Gpu::kernel`, keyed by name),
//! fills a parameter block from the operand layouts and records a dispatch. Inputs are read
//! through their layouts (strided, broadcast, reversed, offset views need no copy first);
//! outputs are fresh dense buffers.

#[cfg(test)]
mod catalog;
pub(crate) mod elementwise;
pub(crate) mod fused;
pub(crate) mod gemm;
pub(crate) mod index;
pub(crate) mod movement;
pub(crate) mod optimizer;
pub(crate) mod pool;
pub(crate) mod reduce;
pub(crate) mod scan;

use crate::buffer::{gpu_buffer, WgpuBuffer};
use crate::elem::{check_len, layout_descriptor, unsupported_on, Elem, Params};
use crate::gpu::{backend_error, groups_for, Gpu, WG};
use crate::shaders::kernel_source;
use ferroflow_tensor::{Operand, Result};
use std::sync::Arc;

/// An operand's buffer, device and storage type.
pub(crate) struct In<'a> {
    pub buf: &'a WgpuBuffer,
    pub op: Operand<'a>,
}

impl<'a> In<'a> {
    pub fn new(op: Operand<'a>) -> Result<In<'a>> {
        Ok(In {
            buf: gpu_buffer(&op)?,
            op,
        })
    }
    pub fn gpu(&self) -> &Arc<Gpu> {
        &self.buf.gpu
    }
    pub fn elem(&self) -> Elem {
        self.buf.elem
    }
    pub fn desc(&self) -> Vec<u32> {
        layout_descriptor(self.op.layout)
    }
    pub fn n(&self) -> usize {
        self.op.layout.num_elements()
    }
}

/// A fresh output buffer of `len` elements.
pub(crate) fn output(gpu: &Arc<Gpu>, elem: Elem, len: usize) -> Result<WgpuBuffer> {
    check_len("output", len)?;
    Ok(WgpuBuffer {
        gpu: gpu.clone(),
        buffer: Some(gpu.alloc((len * elem.bytes()) as u64)?),
        elem,
        len,
        shared: false,
    })
}

pub(crate) fn same_gpu(op: &'static str, a: &In<'_>, b: &In<'_>) -> Result<()> {
    if Arc::ptr_eq(a.gpu(), b.gpu()) {
        Ok(())
    } else {
        Err(backend_error(format!(
            "{op}: operands live on different GPUs; move one with `to_device`"
        )))
    }
}

pub(crate) const MAIN: &str = "@compute @workgroup_size(256)
fn main(@builtin(workgroup_id) wid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>,
        @builtin(local_invocation_id) lid: vec3<u32>) {
    let i = linear_id(wid, nwg, lid);
    if i >= P[0] { return; }
";

/// Declarations of inputs `A`, `B`, `C`.. (read) then outputs `Y`, `Z`.. (read-write), and
/// the error word `E` after them when `checked`.
pub(crate) fn bindings(inputs: &[&str], outputs: &[&str], checked: bool) -> String {
    let mut s = String::new();
    let names_in = ["A", "B", "C", "D"];
    let names_out = ["Y", "Z", "K", "I"];
    let mut b = 1;
    for (n, t) in names_in.iter().zip(inputs) {
        s += &format!("@group(0) @binding({b}) var<storage, read> {n}: array<{t}>;\n");
        b += 1;
    }
    for (n, t) in names_out.iter().zip(outputs) {
        s += &format!("@group(0) @binding({b}) var<storage, read_write> {n}: array<{t}>;\n");
        b += 1;
    }
    if checked {
        s += &format!("@group(0) @binding({b}) var<storage, read_write> E: array<atomic<u32>>;\n");
    }
    s
}

/// The source of a one-thread-per-output-element kernel: bindings for `inputs` and
/// `outputs` (storage types), the error word when `checked`, and `main` running `body` with
/// `i` the output index. `elems` are the element types involved (float16 enables `f16`).
pub(crate) fn map_source(
    elems: &[Elem],
    inputs: &[&str],
    outputs: &[&str],
    checked: bool,
    body: &str,
) -> String {
    kernel_source(
        elems.contains(&Elem::F16),
        &format!(
            "{}{}{}\n}}\n",
            bindings(inputs, outputs, checked),
            MAIN,
            body
        ),
    )
}

/// Records a map kernel over `n` items. A `checked` kernel gets its own error word, which
/// is returned (read it with [`Gpu::data_error`]).
pub(crate) fn run_map(
    gpu: &Arc<Gpu>,
    kernel: &crate::gpu::Kernel,
    params: Params,
    inputs: &[&wgpu::Buffer],
    out: &[&wgpu::Buffer],
    checked: bool,
    n: usize,
) -> Result<Option<wgpu::Buffer>> {
    let mut outs: Vec<&wgpu::Buffer> = out.to_vec();
    let word = if checked {
        Some(gpu.error_word()?)
    } else {
        None
    };
    if let Some(w) = &word {
        outs.push(w);
    }
    gpu.dispatch(kernel, &params.0, inputs, &outs, groups_for(n, WG)?)?;
    Ok(word)
}

/// Runs a one-input map kernel (input read through its layout, descriptor 0) into `out`.
pub(crate) fn map_one(k: &crate::gpu::Kernel, x: &In<'_>, out: WgpuBuffer) -> Result<WgpuBuffer> {
    let n = out.len;
    run_map(
        x.gpu(),
        k,
        Params::new(n).desc(0, x.desc()),
        &[x.buf.raw()],
        &[out.raw()],
        false,
        n,
    )?;
    Ok(out)
}

/// The float dtypes only (the window and convolution kernels).
pub(crate) fn float_only(gpu: &Gpu, op: &'static str, e: Elem) -> Result<()> {
    if e.is_float() {
        Ok(())
    } else {
        Err(unsupported_on(gpu, op, e.dtype()))
    }
}
