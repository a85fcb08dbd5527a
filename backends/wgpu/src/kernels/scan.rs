//! Scans and sorts along one axis: running sums and products (`wgsl/cumulative.wgsl`) and
//! a stable merge sort with indices: one thread per line for lines up to
//! [`SORT_LINE_MAX`] (`wgsl/sort.wgsl`), merge passes over every element at once for longer
//! ones (`wgsl/sort_keys.wgsl`, `sort_merge.wgsl`, `sort_place.wgsl`; [`merge_sorted`],
//! which `scatter_add` uses too).

use super::{map_source, output, run_map, In};
use crate::buffer::WgpuBuffer;
use crate::elem::{unsupported_on, Elem, Params};
use crate::gpu::Gpu;
use crate::shaders::fill;
use ferroflow_tensor::{CumulativeOp, Result};
use std::sync::Arc;

/// Lines up to this long sort in one thread each ([`sort_source`]); longer ones by merge
/// passes over all their elements ([`sort_keys_source`], [`merge_sorted`],
/// [`sort_place_source`]: `2 + ⌈log2 len⌉` dispatches), so that one long line is not one
/// thread's work.
pub(crate) const SORT_LINE_MAX: usize = 256;

/// A running sum or product of elements `e` (float32, float16, int32, uint32), or `None`.
pub(crate) fn cumulative_source(op: CumulativeOp, e: Elem) -> Option<String> {
    if !matches!(e, Elem::F32 | Elem::F16 | Elem::I32 | Elem::U32) {
        return None;
    }
    let (init, comb) = match (op, e.is_float()) {
        (CumulativeOp::Cumsum, true) => ("0.0", "acc + v"),
        (CumulativeOp::Cumprod, true) => ("1.0", "acc * v"),
        (CumulativeOp::Cumsum, false) => ("0", "acc + v"),
        (CumulativeOp::Cumprod, false) => ("1", "acc * v"),
    };
    let body = fill(
        include_str!("../wgsl/cumulative.wgsl"),
        &[
            ("C", e.compute()?),
            ("INIT", init),
            ("COMB", comb),
            ("LOAD", &e.load("A[at(P[1], lin)]")),
            ("STORE", &e.store_expr("acc")),
        ],
    );
    Some(map_source(&[e], &[e.store()], &[e.store()], false, &body))
}

/// Running sum/product: one thread per line along `axis`.
pub(crate) fn cumulative(
    op: CumulativeOp,
    x: &In<'_>,
    axis: usize,
    exclusive: bool,
    reverse: bool,
) -> Result<WgpuBuffer> {
    let gpu = x.gpu();
    let e = x.elem();
    if !matches!(e, Elem::F32 | Elem::F16 | Elem::I32 | Elem::U32) {
        return Err(unsupported_on(gpu, op.name(), e.dtype()));
    }
    let k = gpu.kernel(&format!("{}_{e:?}", op.name()), 1, 1, || {
        cumulative_source(op, e).unwrap_or_default()
    })?;
    let shape = x.op.shape();
    let len = shape[axis];
    let inner: usize = shape[axis + 1..].iter().product();
    let n = x.n();
    let out = output(gpu, e, n)?;
    let lines = n.checked_div(len).unwrap_or(0);
    let p = Params::new(lines)
        .set(4, len as u32)
        .set(5, inner.max(1) as u32)
        .set(6, exclusive as u32)
        .set(7, reverse as u32)
        .desc(0, x.desc());
    run_map(gpu, &k, p, &[x.buf.raw()], &[out.raw()], false, lines)?;
    Ok(out)
}

/// A stable sort of elements `e` (float32, float16, int32, uint32; NaN last ascending, first
/// descending), or `None`.
pub(crate) fn sort_source(e: Elem, descending: bool) -> Option<String> {
    if !matches!(e, Elem::F32 | Elem::F16 | Elem::I32 | Elem::U32) {
        return None;
    }
    // Floats by their sort keys, from the bits (as the merge passes order them), so that a
    // device which flushes subnormals in comparisons still orders them.
    let before = match (descending, e.is_float()) {
        (false, true) => "sort_key(a) < sort_key(b)",
        (true, true) => "sort_key(a) > sort_key(b)",
        (false, false) => "a < b",
        (true, false) => "a > b",
    };
    let body = fill(
        include_str!("../wgsl/sort.wgsl"),
        &[
            ("LOAD", &e.load("A[at(P[1], first + k * inner)]")),
            ("BEFORE", before),
            ("STORE", &e.store_expr("v")),
        ],
    );
    Some(map_source(
        &[e],
        &[e.store()],
        &[e.store(), "i32", e.compute()?, "u32"],
        false,
        &body,
    ))
}

/// Each element's sort key and its index along its line, for lines of elements `e`
/// (float32, float16, int32, uint32), or `None`.
pub(crate) fn sort_keys_source(e: Elem) -> Option<String> {
    let key = match e {
        Elem::F32 | Elem::F16 => "sort_key(v)",
        Elem::I32 => "bitcast<u32>(v) ^ 0x80000000u",
        Elem::U32 => "v",
        _ => return None,
    };
    let body = fill(
        include_str!("../wgsl/sort_keys.wgsl"),
        &[
            ("LOAD", &e.load("A[at(P[1], first + k * inner)]")),
            ("KEY", key),
        ],
    );
    Some(map_source(
        &[e],
        &[e.store()],
        &["u32", "u32"],
        false,
        &body,
    ))
}

/// One merge pass over (key, position) scratch (`wgsl/sort_merge.wgsl`).
pub(crate) fn sort_merge_source() -> String {
    map_source(
        &[],
        &["u32", "u32"],
        &["u32", "u32"],
        false,
        include_str!("../wgsl/sort_merge.wgsl"),
    )
}

/// The sorted values and indices of lines of elements `e` from their merged positions, or
/// `None`.
pub(crate) fn sort_place_source(e: Elem) -> Option<String> {
    if !matches!(e, Elem::F32 | Elem::F16 | Elem::I32 | Elem::U32) {
        return None;
    }
    Some(map_source(
        &[e],
        &[e.mov(), "u32"],
        &[e.mov(), "i32"],
        false,
        include_str!("../wgsl/sort_place.wgsl"),
    ))
}

/// Sorts dense scratch of `total / len` lines of (key, position) pairs by key, line by line
/// and stably: `⌈log2 len⌉` merge passes between the given buffers and two more. Returns the
/// sorted pair.
pub(crate) fn merge_sorted(
    gpu: &Arc<Gpu>,
    keys: WgpuBuffer,
    positions: WgpuBuffer,
    len: usize,
) -> Result<(WgpuBuffer, WgpuBuffer)> {
    let total = keys.len;
    let merge = gpu.kernel("sort_merge", 2, 2, sort_merge_source)?;
    let mut from = (keys, positions);
    let mut to = (
        output(gpu, Elem::U32, total)?,
        output(gpu, Elem::U32, total)?,
    );
    let mut w = 1usize;
    while w < len {
        let p = Params::new(total).set(4, len as u32).set(5, w as u32);
        run_map(
            gpu,
            &merge,
            p,
            &[from.0.raw(), from.1.raw()],
            &[to.0.raw(), to.1.raw()],
            false,
            total,
        )?;
        std::mem::swap(&mut from, &mut to);
        w *= 2;
    }
    Ok(from)
}

/// Stable sort of every line along `axis` (values, int32 indices): one thread per line
/// (bottom-up merge sort in a scratch buffer) for lines up to [`SORT_LINE_MAX`], merge
/// passes over all elements for longer ones. Both give the CPU backend's order.
pub(crate) fn sort(x: &In<'_>, axis: usize, descending: bool) -> Result<(WgpuBuffer, WgpuBuffer)> {
    let gpu = x.gpu();
    let e = x.elem();
    if !matches!(e, Elem::F32 | Elem::F16 | Elem::I32 | Elem::U32) {
        return Err(unsupported_on(gpu, "sort", e.dtype()));
    }
    let shape = x.op.shape();
    let len = shape[axis];
    let inner: usize = shape[axis + 1..].iter().product();
    let n = x.n();
    let values = output(gpu, e, n)?;
    let indices = output(gpu, Elem::I32, n)?;
    let lines = n.checked_div(len).unwrap_or(0);
    if lines == 0 {
        return Ok((values, indices));
    }
    // Over `items` threads: lines, or elements for the merge passes' kernels.
    let params = |items: usize| {
        Params::new(items)
            .set(4, len as u32)
            .set(5, inner.max(1) as u32)
            .set(6, descending as u32)
            .desc(0, x.desc())
    };
    if len > SORT_LINE_MAX {
        let keys = gpu.kernel(&format!("sort_keys_{e:?}"), 1, 2, || {
            sort_keys_source(e).unwrap_or_default()
        })?;
        let place = gpu.kernel(&format!("sort_place_{e:?}"), 2, 2, || {
            sort_place_source(e).unwrap_or_default()
        })?;
        let scratch = (output(gpu, Elem::U32, n)?, output(gpu, Elem::U32, n)?);
        run_map(
            gpu,
            &keys,
            params(n),
            &[x.buf.raw()],
            &[scratch.0.raw(), scratch.1.raw()],
            false,
            n,
        )?;
        let (_, order) = merge_sorted(gpu, scratch.0, scratch.1, len)?;
        run_map(
            gpu,
            &place,
            params(n),
            &[x.buf.raw(), order.raw()],
            &[values.raw(), indices.raw()],
            false,
            n,
        )?;
        return Ok((values, indices));
    }
    let k = gpu.kernel(&format!("sort_{e:?}_{descending}"), 1, 4, || {
        sort_source(e, descending).unwrap_or_default()
    })?;
    let scratch_k = output(gpu, Elem::F32, 2 * n)?;
    let scratch_i = output(gpu, Elem::I32, 2 * n)?;
    run_map(
        gpu,
        &k,
        params(lines),
        &[x.buf.raw()],
        &[
            values.raw(),
            indices.raw(),
            scratch_k.raw(),
            scratch_i.raw(),
        ],
        false,
        lines,
    )?;
    Ok((values, indices))
}
