//! Reductions (`wgsl/reduce.wgsl`: a tree per output, long reductions split into partial
//! sums and reduced again) and argmax/argmin (`wgsl/arg_reduce.wgsl`).

use super::{output, In};
use crate::buffer::WgpuBuffer;
use crate::elem::{descriptor, unsupported_on, Elem, Params};
use crate::gpu::groups_for;
use crate::shaders::{fill, kernel_source};
use ferroflow_tensor::{ArgReduceOp, ReduceOp, Result};

/// The parameter slot of a mean's count (the reduction kernel's scalars are slots 4..7;
/// a fused reduction's input descriptors follow it).
pub(crate) const MEAN_COUNT_SLOT: usize = 7;

/// The identity and the combination of `a` and `b` of reduction `op` on elements `e` (a
/// mean's are the sum's: its division is the store's, [`reduce_source`]).
pub(crate) fn reduce_parts(e: Elem, op: ReduceOp) -> Option<(&'static str, &'static str)> {
    use ReduceOp::*;
    let r = match (e, op) {
        (Elem::F32 | Elem::F16, ReduceSum | ReduceMean) => ("0.0", "a + b"),
        (Elem::F32 | Elem::F16, ReduceProd) => ("1.0", "a * b"),
        (Elem::F32 | Elem::F16, ReduceMax) => (
            "-f_inf()",
            "select(select(max(a, b), b, is_nan(b)), a, is_nan(a))",
        ),
        (Elem::F32 | Elem::F16, ReduceMin) => (
            "f_inf()",
            "select(select(min(a, b), b, is_nan(b)), a, is_nan(a))",
        ),
        (Elem::I32, ReduceSum | ReduceMean) => ("0", "a + b"),
        (Elem::I32, ReduceProd) => ("1", "a * b"),
        (Elem::I32, ReduceMax) => ("(-2147483647 - 1)", "max(a, b)"),
        (Elem::I32, ReduceMin) => ("2147483647", "min(a, b)"),
        (Elem::U32, ReduceSum | ReduceMean) => ("0u", "a + b"),
        (Elem::U32, ReduceProd) => ("1u", "a * b"),
        (Elem::U32, ReduceMax) => ("0u", "max(a, b)"),
        (Elem::U32, ReduceMin) => ("4294967295u", "min(a, b)"),
        (Elem::Bool, ReduceAny | ReduceMax) => ("0u", "a | b"),
        (Elem::Bool, ReduceAll | ReduceMin) => ("1u", "a & b"),
        _ => return None,
    };
    Some(r)
}

/// What a reduction kernel stores of its tree's result `sh[0]`: a mean divides by the count
/// in parameter slot [`MEAN_COUNT_SLOT`] (an empty float set giving NaN: WGSL leaves 0 / 0
/// undefined; integers truncating, as WGSL's division does).
pub(crate) fn reduced_value(e: Elem, op: ReduceOp) -> Option<String> {
    Some(if op != ReduceOp::ReduceMean {
        "sh[0]".to_string()
    } else if e.is_float() {
        format!("select(sh[0] / f32(P[{MEAN_COUNT_SLOT}]), f_nan(), P[{MEAN_COUNT_SLOT}] == 0u)")
    } else {
        format!("(sh[0] / {}(P[{MEAN_COUNT_SLOT}]))", e.compute()?)
    })
}

/// Reduction `op` of elements `e`, reading storage type `in_e` and writing `out_e` (the
/// partial sums of a split reduction are float32), or `None` where the backend has none. A
/// mean divides what it stores ([`reduced_value`]); the first pass of a split mean is a
/// sum.
pub(crate) fn reduce_source(op: ReduceOp, e: Elem, in_e: Elem, out_e: Elem) -> Option<String> {
    let (init, combine) = reduce_parts(e, op)?;
    let value = reduced_value(e, op)?;
    let body = fill(
        include_str!("../wgsl/reduce.wgsl"),
        &[
            ("C", e.compute()?),
            ("INIT", init),
            ("COMBINE", combine),
            ("LOAD", &in_e.load("A[base + at(P[2], r)]")),
            ("STORE", &out_e.store_expr(&value)),
        ],
    );
    Some(kernel_source(
        in_e == Elem::F16 || out_e == Elem::F16,
        &format!(
            "{}{body}",
            super::bindings(&[in_e.store()], &[out_e.store()], false)
        ),
    ))
}

/// Reduces over `axes`: one workgroup per output element (tree reduction in workgroup
/// memory); long reductions with few outputs are split into partial sums and reduced again.
pub(crate) fn reduce(op: ReduceOp, x: &In<'_>, axes: &[usize]) -> Result<WgpuBuffer> {
    let gpu = x.gpu();
    let e = x.elem();
    if e == Elem::I64 {
        return Err(unsupported_on(gpu, op.name(), e.dtype()));
    }
    if reduce_parts(e, op).is_none() {
        return Err(unsupported_on(gpu, op.name(), e.dtype()));
    }
    let shape = x.op.shape();
    let strides = x.op.layout.strides();
    let keep: Vec<usize> = (0..shape.len()).filter(|a| !axes.contains(a)).collect();
    let out_dims: Vec<usize> = keep.iter().map(|&a| shape[a]).collect();
    let out_strides: Vec<isize> = keep.iter().map(|&a| strides[a]).collect();
    let red_dims: Vec<usize> = axes.iter().map(|&a| shape[a]).collect();
    let red_strides: Vec<isize> = axes.iter().map(|&a| strides[a]).collect();
    let n_out: usize = out_dims.iter().product();
    let n_red: usize = red_dims.iter().product();
    let parts = parts_of(n_out, n_red);
    let per = n_red.div_ceil(parts).max(1);
    let partial_elem = partial_elem(e);
    let out = output(gpu, e, n_out)?;
    if n_out == 0 {
        return Ok(out);
    }
    let offset = x.op.layout.offset();
    let params = |n: usize| {
        Params::new(n)
            .set(4, n_red as u32)
            .set(5, parts as u32)
            .set(6, per as u32)
            .set(MEAN_COUNT_SLOT, n_red as u32)
            .desc(0, descriptor(&out_dims, &out_strides, offset))
            .desc(1, descriptor(&red_dims, &red_strides, 0))
    };
    if parts == 1 {
        let k = reduce_kernel(gpu, op, e, e, e)?;
        gpu.dispatch(
            &k,
            &params(n_out).0,
            &[x.buf.raw()],
            &[out.raw()],
            groups_for(n_out, 1)?,
        )?;
        return Ok(out);
    }
    let partial = output(gpu, partial_elem, n_out * parts)?;
    let k1 = reduce_kernel(gpu, partial_pass(op), e, e, partial_elem)?;
    gpu.dispatch(
        &k1,
        &params(n_out * parts).0,
        &[x.buf.raw()],
        &[partial.raw()],
        groups_for(n_out * parts, 1)?,
    )?;
    reduce_partials(gpu, op, e, &partial, (n_out, n_red), parts, &out)?;
    Ok(out)
}

/// How many parts each output's reduction is split into: long reductions with few outputs
/// are reduced in parts (partial results) and the parts reduced again.
pub(crate) fn parts_of(n_out: usize, n_red: usize) -> usize {
    if n_out < 256 && n_red >= 16384 {
        (n_red / 4096).clamp(2, 1024)
    } else {
        1
    }
}

/// The reduction the first pass of a split `op` runs: a mean's parts are sums (the second
/// pass divides once, by the whole count).
pub(crate) fn partial_pass(op: ReduceOp) -> ReduceOp {
    if op == ReduceOp::ReduceMean {
        ReduceOp::ReduceSum
    } else {
        op
    }
}

/// The element type of a split reduction's partial results.
pub(crate) fn partial_elem(e: Elem) -> Elem {
    match e {
        Elem::F16 => Elem::F32,
        other => other,
    }
}

/// The reduction kernel of `op` on elements `e`, reading `in_e` and writing `out_e`.
fn reduce_kernel(
    gpu: &crate::gpu::Gpu,
    op: ReduceOp,
    e: Elem,
    in_e: Elem,
    out_e: Elem,
) -> Result<std::sync::Arc<crate::gpu::Kernel>> {
    gpu.kernel(
        &format!("reduce_{}_{in_e:?}_{out_e:?}", op.name()),
        1,
        1,
        || reduce_source(op, e, in_e, out_e).unwrap_or_default(),
    )
}

/// The second pass of a split reduction: `parts` partial results per output, `n_out`
/// outputs each reducing `n_red` elements (a mean's count), into `out`.
pub(crate) fn reduce_partials(
    gpu: &crate::gpu::Gpu,
    op: ReduceOp,
    e: Elem,
    partial: &WgpuBuffer,
    (n_out, n_red): (usize, usize),
    parts: usize,
    out: &WgpuBuffer,
) -> Result<()> {
    let k2 = reduce_kernel(gpu, op, e, partial_elem(e), e)?;
    let p = Params::new(n_out)
        .set(4, parts as u32)
        .set(5, 1)
        .set(6, parts as u32)
        .set(MEAN_COUNT_SLOT, n_red as u32)
        .desc(0, descriptor(&[n_out], &[parts as isize], 0))
        .desc(1, descriptor(&[parts], &[1], 0));
    gpu.dispatch(
        &k2,
        &p.0,
        &[partial.raw()],
        &[out.raw()],
        groups_for(n_out, 1)?,
    )
}

/// argmax/argmin of elements `e` (float32, float16, int32, uint32), or `None`.
pub(crate) fn arg_reduce_source(op: ArgReduceOp, e: Elem) -> Option<String> {
    if !matches!(e, Elem::F32 | Elem::F16 | Elem::I32 | Elem::U32) {
        return None;
    }
    let never_nan = if e == Elem::U32 { "no_nan_u" } else { "no_nan" };
    let (better, nan) = match (op, e.is_float()) {
        (ArgReduceOp::ArgMax, true) => ("f_lt(vb, va)", "is_nan"),
        (ArgReduceOp::ArgMin, true) => ("f_lt(va, vb)", "is_nan"),
        (ArgReduceOp::ArgMax, false) => ("va > vb", never_nan),
        (ArgReduceOp::ArgMin, false) => ("va < vb", never_nan),
    };
    let body = fill(
        include_str!("../wgsl/arg_reduce.wgsl"),
        &[
            ("C", e.compute()?),
            ("BETTER", better),
            ("NAN", nan),
            ("LOAD", &e.load("A[base + at(P[2], r)]")),
        ],
    );
    Some(kernel_source(
        e == Elem::F16,
        &format!(
            "{}{body}",
            super::bindings(&[e.store()], &["vec2<u32>"], false)
        ),
    ))
}

/// argmax/argmin along `axis` (int64 output, first index on ties, a NaN wins outright).
pub(crate) fn arg_reduce(op: ArgReduceOp, x: &In<'_>, axis: usize) -> Result<WgpuBuffer> {
    let gpu = x.gpu();
    let e = x.elem();
    if !matches!(e, Elem::F32 | Elem::F16 | Elem::I32 | Elem::U32) {
        return Err(unsupported_on(gpu, op.name(), e.dtype()));
    }
    let k = gpu.kernel(&format!("{}_{e:?}", op.name()), 1, 1, || {
        arg_reduce_source(op, e).unwrap_or_default()
    })?;
    let shape = x.op.shape();
    let strides = x.op.layout.strides();
    let keep: Vec<usize> = (0..shape.len()).filter(|&a| a != axis).collect();
    let out_dims: Vec<usize> = keep.iter().map(|&a| shape[a]).collect();
    let out_strides: Vec<isize> = keep.iter().map(|&a| strides[a]).collect();
    let n_out: usize = out_dims.iter().product();
    let out = output(gpu, Elem::I64, n_out)?;
    let p = Params::new(n_out)
        .set(4, shape[axis] as u32)
        .desc(0, descriptor(&out_dims, &out_strides, x.op.layout.offset()))
        .desc(1, descriptor(&[shape[axis]], &[strides[axis]], 0));
    gpu.dispatch(
        &k,
        &p.0,
        &[x.buf.raw()],
        &[out.raw()],
        groups_for(n_out, 1)?,
    )?;
    Ok(out)
}
