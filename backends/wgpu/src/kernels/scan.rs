//! Scans and sorts along one axis: running sums and products (`wgsl/cumulative.wgsl`) and
//! a stable merge sort with indices (`wgsl/sort.wgsl`), one thread per line.

use super::{map_source, output, run_map, In};
use crate::buffer::WgpuBuffer;
use crate::elem::{unsupported_on, Elem, Params};
use crate::shaders::fill;
use ferroflow_tensor::{CumulativeOp, Result};

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
    let before = match (descending, e.is_float()) {
        (false, true) => "(!is_nan(a) && is_nan(b)) || f_lt(a, b)",
        (true, true) => "(is_nan(a) && !is_nan(b)) || f_lt(b, a)",
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

/// Stable sort of every line along `axis`: one thread per line, bottom-up merge sort in a
/// scratch buffer. (Values, int32 indices.)
pub(crate) fn sort(x: &In<'_>, axis: usize, descending: bool) -> Result<(WgpuBuffer, WgpuBuffer)> {
    let gpu = x.gpu();
    let e = x.elem();
    if !matches!(e, Elem::F32 | Elem::F16 | Elem::I32 | Elem::U32) {
        return Err(unsupported_on(gpu, "sort", e.dtype()));
    }
    let k = gpu.kernel(&format!("sort_{e:?}_{descending}"), 1, 4, || {
        sort_source(e, descending).unwrap_or_default()
    })?;
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
    let scratch_k = output(gpu, Elem::F32, 2 * n)?;
    let scratch_i = output(gpu, Elem::I32, 2 * n)?;
    let p = Params::new(lines)
        .set(4, len as u32)
        .set(5, inner.max(1) as u32)
        .desc(0, x.desc());
    run_map(
        gpu,
        &k,
        p,
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
