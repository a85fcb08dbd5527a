//! Data movement: copies of views, uploads and read-backs, `select`, `concat`, `pad`.

use super::{map_one, map_source, output, run_map, same_gpu, In};
use crate::buffer::WgpuBuffer;
use crate::elem::{check_len, Elem, Params};
use crate::gpu::{backend_error, Gpu};
use crate::shaders::fill;
use ferroflow_tensor::{HostData, Result};
use std::sync::Arc;

/// The dense copy of a view.
pub(crate) fn copy_source(e: Elem) -> String {
    map_source(
        &[e],
        &[e.mov()],
        &[e.mov()],
        false,
        "    Y[i] = A[at(P[1], i)];",
    )
}

/// Dense copy of a view.
pub(crate) fn copy(x: &In<'_>) -> Result<WgpuBuffer> {
    let gpu = x.gpu();
    let e = x.elem();
    let out = output(gpu, e, x.n())?;
    let k = gpu.kernel(&format!("copy_{}", e.mov()), 1, 1, || copy_source(e))?;
    map_one(&k, x, out)
}

pub(crate) fn upload(gpu: &Arc<Gpu>, data: HostData) -> Result<WgpuBuffer> {
    let elem = Elem::of(gpu, data.dtype(), "upload")?;
    let len = data.len();
    check_len("upload", len)?;
    let bytes = match &data {
        HostData::Bool(v) => v.iter().flat_map(|&b| (b as u32).to_le_bytes()).collect(),
        d => d.to_le_bytes(),
    };
    // Small data (scalars, short vectors) comes from the per-device constant cache.
    let shared = bytes.len() <= 64;
    let buffer = if shared {
        gpu.constant(&bytes)?
    } else {
        gpu.upload(&bytes)?
    };
    Ok(WgpuBuffer {
        gpu: gpu.clone(),
        buffer: Some(buffer),
        elem,
        len,
        shared,
    })
}

pub(crate) fn download(x: &In<'_>) -> Result<HostData> {
    let e = x.elem();
    let n = x.n();
    let bytes = match x.op.layout.contiguous_range() {
        Some((off, len)) if (off * e.bytes()).is_multiple_of(4) => {
            let start = (off * e.bytes()) as u64;
            let size = ((len * e.bytes()) as u64).next_multiple_of(4);
            x.gpu().read(x.buf.raw(), start, size)?
        }
        _ => {
            let dense = copy(x)?;
            let size = ((n * e.bytes()) as u64).next_multiple_of(4);
            x.gpu().read(dense.raw(), 0, size)?
        }
    };
    let bytes = &bytes[..n * e.bytes()];
    let data = match e {
        Elem::Bool => HostData::Bool(
            bytes
                .chunks_exact(4)
                .map(|c| c.iter().any(|&b| b != 0))
                .collect(),
        ),
        _ => HostData::from_le_bytes(e.dtype(), bytes)
            .ok_or_else(|| backend_error("read-back of the wrong size"))?,
    };
    Ok(data)
}

/// `cond ? t : f` for storage type `e`.
pub(crate) fn select_source(e: Elem) -> String {
    map_source(
        &[e],
        &["u32", e.mov(), e.mov()],
        &[e.mov()],
        false,
        "    Y[i] = select(C[at(P[3], i)], B[at(P[2], i)], A[at(P[1], i)] != 0u);",
    )
}

/// `cond ? t : f`.
pub(crate) fn select(c: &In<'_>, t: &In<'_>, f: &In<'_>) -> Result<WgpuBuffer> {
    same_gpu("select", c, t)?;
    same_gpu("select", t, f)?;
    let gpu = t.gpu();
    let e = t.elem();
    let n = t.n();
    let out = output(gpu, e, n)?;
    let k = gpu.kernel(&format!("select_{}", e.mov()), 3, 1, || select_source(e))?;
    let p = Params::new(n)
        .desc(0, c.desc())
        .desc(1, t.desc())
        .desc(2, f.desc());
    run_map(
        gpu,
        &k,
        p,
        &[c.buf.raw(), t.buf.raw(), f.buf.raw()],
        &[out.raw()],
        false,
        n,
    )?;
    Ok(out)
}

/// One input's strided copy into its slab of a concatenation.
pub(crate) fn concat_source(e: Elem) -> String {
    map_source(
        &[e],
        &[e.mov()],
        &[e.mov()],
        false,
        "    let chunk = P[4];
    Y[(i / chunk) * P[5] + P[6] + i % chunk] = A[at(P[1], i)];",
    )
}

/// Concatenation: one strided copy per input into its slab of the output.
pub(crate) fn concat(inputs: &[In<'_>], axis: usize) -> Result<WgpuBuffer> {
    let first = inputs
        .first()
        .ok_or_else(|| backend_error("concat of no tensors"))?;
    let gpu = first.gpu();
    let e = first.elem();
    let shape = first.op.shape();
    let inner: usize = shape[axis + 1..].iter().product();
    let total: usize = inputs.iter().map(|x| x.op.shape()[axis]).sum();
    let outer: usize = shape[..axis].iter().product();
    let out = output(gpu, e, outer * total * inner)?;
    let k = gpu.kernel(&format!("concat_{}", e.mov()), 1, 1, || concat_source(e))?;
    let mut start = 0;
    for x in inputs {
        same_gpu("concat", first, x)?;
        let na = x.op.shape()[axis];
        let n = x.n();
        let p = Params::new(n)
            .set(4, (na * inner).max(1) as u32)
            .set(5, (total * inner) as u32)
            .set(6, (start * inner) as u32)
            .desc(0, x.desc());
        run_map(gpu, &k, p, &[x.buf.raw()], &[out.raw()], false, n)?;
        start += na;
    }
    Ok(out)
}

/// The fill word(s) of `value` in storage type `e`.
fn fill_words(e: Elem, value: f64) -> [u32; 2] {
    match e {
        Elem::F32 | Elem::F16 => [(value as f32).to_bits(), 0],
        Elem::I32 => [value as i32 as u32, 0],
        Elem::U32 => [value as u32, 0],
        Elem::Bool => [(value != 0.0) as u32, 0],
        Elem::I64 => {
            let v = value as i64 as u64;
            [v as u32, (v >> 32) as u32]
        }
    }
}

fn fill_expr(e: Elem) -> &'static str {
    match e {
        Elem::F16 => "f16(bitcast<f32>(P[5]))",
        Elem::I64 => "vec2<u32>(P[5], P[6])",
        _ => "P[5]",
    }
}

/// Constant padding (`wgsl/pad.wgsl`) for storage type `e`.
pub(crate) fn pad_source(e: Elem) -> String {
    let body = fill(include_str!("../wgsl/pad.wgsl"), &[("FILL", fill_expr(e))]);
    map_source(&[e], &[e.mov()], &[e.mov()], false, &body)
}

pub(crate) fn pad(x: &In<'_>, paddings: &[(usize, usize)], value: f64) -> Result<WgpuBuffer> {
    let gpu = x.gpu();
    let e = x.elem();
    let shape = x.op.shape();
    let out_shape: Vec<usize> = shape
        .iter()
        .zip(paddings)
        .map(|(&d, &(a, b))| d + a + b)
        .collect();
    let n: usize = out_shape.iter().product();
    let out = output(gpu, e, n)?;
    let k = gpu.kernel(&format!("pad_{}", e.mov()), 1, 1, || pad_source(e))?;
    let mut table = vec![];
    for (d, (&(before, _), &od)) in paddings.iter().zip(&out_shape).enumerate() {
        table.extend([
            od as u32,
            before as u32,
            shape[d] as u32,
            x.op.layout.strides()[d] as i32 as u32,
        ]);
    }
    let [w0, w1] = fill_words(e, value);
    let p = Params::new(n)
        .set(5, w0)
        .set(6, w1)
        .set(7, shape.len() as u32)
        .set(8, x.op.layout.offset() as u32)
        .table(4, &table);
    run_map(gpu, &k, p, &[x.buf.raw()], &[out.raw()], false, n)?;
    Ok(out)
}
