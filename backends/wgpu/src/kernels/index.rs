//! Indexing: `gather` (`wgsl/gather.wgsl`) and its adjoint `scatter_add`
//! (`wgsl/scatter_add.wgsl`), with int32 or int64 indices checked on the device (an index out
//! of range is the op's error, read back from the kernel's error word), and the sparse
//! softmax cross-entropy (`wgsl/sparse_softmax_xent.wgsl`), whose labels are indices too.

use super::{map_source, output, run_map, same_gpu, In};
use crate::buffer::WgpuBuffer;
use crate::elem::{unsupported_on, Elem, Params};
use crate::gpu::{backend_error, groups_for, Gpu};
use crate::shaders::{fill, kernel_source};
use ferroflow_tensor::{Error, Result};
use std::sync::Arc;

/// Where the gather-like kernels read index `j`: the second input, descriptor 1.
const INDEX_J: &str = "B[at(P[2], j)]";

/// Whether `e` can index (int32 or int64).
fn is_index(e: Elem) -> bool {
    matches!(e, Elem::I32 | Elem::I64)
}

/// WGSL reading index `j` from `at` (an int32 or int64 buffer element) as `raw`, its range
/// check `ok` against the axis length `P[6]` and its value `r`.
fn index_load(idx: Elem, at: &str) -> Option<String> {
    Some(match idx {
        Elem::I32 => {
            format!("let raw = {at}; let ok = raw >= 0 && u32(raw) < P[6]; let r = u32(raw);")
        }
        Elem::I64 => {
            format!("let raw = {at}; let ok = raw.y == 0u && raw.x < P[6]; let r = raw.x;")
        }
        _ => return None,
    })
}

fn index_error(
    gpu: &Gpu,
    word: Option<wgpu::Buffer>,
    op: &'static str,
    bound: usize,
) -> Result<()> {
    let Some(word) = word else {
        return Ok(());
    };
    let [code, lo, hi, _] = gpu.data_error(word)?;
    if code == 0 {
        return Ok(());
    }
    Err(Error::IndexOutOfRange {
        op,
        index: ((hi as u64) << 32 | lo as u64) as i64,
        bound,
    })
}

/// WGSL recording an out-of-range index `raw` (int32 or int64) in the error word: code 2,
/// then the index's low and high words.
fn index_flag(ie: Elem) -> &'static str {
    match ie {
        Elem::I32 => "atomicMax(&E[0], 2u); atomicStore(&E[1], bitcast<u32>(raw)); atomicStore(&E[2], select(0u, 0xffffffffu, raw < 0));",
        _ => "atomicMax(&E[0], 2u); atomicStore(&E[1], raw.x); atomicStore(&E[2], raw.y);",
    }
}

/// gather of storage type `e` with indices of `ie` (int32 or int64), or `None`.
pub(crate) fn gather_source(e: Elem, ie: Elem) -> Option<String> {
    let body = fill(
        include_str!("../wgsl/gather.wgsl"),
        &[
            ("INDEX_LOAD", &index_load(ie, INDEX_J)?),
            ("FLAG", index_flag(ie)),
            ("MOV", e.mov()),
        ],
    );
    Some(map_source(
        &[e],
        &[e.mov(), ie.store()],
        &[e.mov()],
        true,
        &body,
    ))
}

pub(crate) fn gather(x: &In<'_>, idx: &In<'_>, axis: usize) -> Result<WgpuBuffer> {
    same_gpu("gather", x, idx)?;
    let gpu = x.gpu();
    let e = x.elem();
    let ie = idx.elem();
    let shape = x.op.shape();
    let inner: usize = shape[axis + 1..].iter().product();
    let outer: usize = shape[..axis].iter().product();
    let ni = idx.n();
    let n = outer * ni * inner;
    let out = output(gpu, e, n)?;
    if !is_index(ie) {
        return Err(backend_error("gather: indices must be int32 or int64"));
    }
    let k = gpu.kernel(&format!("gather_{}_{ie:?}", e.mov()), 2, 2, || {
        gather_source(e, ie).unwrap_or_default()
    })?;
    run_indexed(gpu, &k, "gather", (x, idx), &out, (n, inner), shape[axis])?;
    Ok(out)
}

/// The most tensors one `gather_group` kernel takes (three parameter words each: where its
/// outputs end in the kernel's index space, its inner size, its descriptor).
pub(crate) const GATHER_GROUP_MAX: usize = 3;

/// The parameter slot of tensor `t`'s first word in a `gather_group` kernel (slots 2, 5 and
/// 6 hold the indices' descriptor, their count and the axis's length, as in `gather`).
fn gather_group_slot(t: usize) -> usize {
    7 + 3 * t
}

/// `gather` of tensors of storage types `elems` (at most [`GATHER_GROUP_MAX`]) by indices of
/// `ie` in one kernel: thread `i` of the joint index space copies one element of the
/// tensor whose outputs cover `i` (inputs `B` the indices, `X0..`; outputs `O0..`), an
/// index out of range recorded in the error word as `gather` records it.
pub(crate) fn gather_group_source(elems: &[Elem], ie: Elem) -> Option<String> {
    if elems.is_empty() || elems.len() > GATHER_GROUP_MAX {
        return None;
    }
    let g = elems.len();
    let mut s = format!(
        "@group(0) @binding(1) var<storage, read> B: array<{}>;\n",
        ie.store()
    );
    for (t, e) in elems.iter().enumerate() {
        s += &format!(
            "@group(0) @binding({}) var<storage, read> X{t}: array<{}>;\n",
            2 + t,
            e.mov()
        );
    }
    for (t, e) in elems.iter().enumerate() {
        s += &format!(
            "@group(0) @binding({}) var<storage, read_write> O{t}: array<{}>;\n",
            2 + g + t,
            e.mov()
        );
    }
    s += &format!(
        "@group(0) @binding({}) var<storage, read_write> E: array<atomic<u32>>;\n",
        2 + 2 * g
    );
    let mut body = String::from("    let ni = P[5];\n");
    for (t, e) in elems.iter().enumerate() {
        let slot = gather_group_slot(t);
        let start = if t == 0 {
            "0u".to_string()
        } else {
            format!("P[{}]", gather_group_slot(t - 1))
        };
        body += &format!(
            "    if i < P[{slot}] {{
        let k = i - {start};
        let inner = P[{}];
        let j = (k / inner) % ni;
        {}
        if !ok {{ {} O{t}[k] = {}(); return; }}
        O{t}[k] = X{t}[at(P[{}], ((k / (inner * ni)) * P[6] + r) * inner + k % inner)];
        return;
    }}
",
            slot + 1,
            index_load(ie, INDEX_J)?,
            index_flag(ie),
            e.mov(),
            slot + 2,
        );
    }
    Some(crate::shaders::kernel_source(
        elems.contains(&Elem::F16),
        &format!("{s}{}{body}}}\n", super::MAIN),
    ))
}

/// `gather` of each of `xs` by `idx` along `axis` in one kernel (`Backend::gather_group`),
/// or `None` where one kernel cannot take them (more than [`GATHER_GROUP_MAX`] tensors, or
/// more bindings than the adapter allows): the backend then gathers them one by one.
pub(crate) fn gather_group(
    xs: &[In<'_>],
    idx: &In<'_>,
    axis: usize,
) -> Result<Option<Vec<WgpuBuffer>>> {
    let Some(first) = xs.first() else {
        return Ok(Some(vec![]));
    };
    let gpu = first.gpu();
    let ie = idx.elem();
    if xs.len() > GATHER_GROUP_MAX || 3 + 2 * xs.len() > gpu.max_storage_buffers || !is_index(ie) {
        return Ok(None);
    }
    for x in xs {
        same_gpu("gather_group", x, idx)?;
    }
    // Every tensor as long along `axis` (the tensor layer checks it; a direct call that
    // breaks it runs the gathers one by one, each checking its own).
    let Some(&bound) = first.op.shape().get(axis) else {
        return Ok(None);
    };
    if xs.iter().any(|x| x.op.shape().get(axis) != Some(&bound)) {
        return Ok(None);
    }
    let ni = idx.n();
    let elems: Vec<Elem> = xs.iter().map(|x| x.elem()).collect();
    let name = elems.iter().map(|e| e.mov()).collect::<Vec<_>>().join("_");
    let k = gpu.kernel(
        &format!("gather_group_{name}_{ie:?}"),
        1 + xs.len(),
        xs.len() + 1,
        || gather_group_source(&elems, ie).unwrap_or_default(),
    )?;
    let mut outs = Vec::with_capacity(xs.len());
    let mut p = Params::new(0)
        .set(5, ni as u32)
        .set(6, bound as u32)
        .desc(1, idx.desc());
    let mut end = 0usize;
    for (t, x) in xs.iter().enumerate() {
        let shape = x.op.shape();
        let inner: usize = shape[axis + 1..].iter().product();
        let outer: usize = shape[..axis].iter().product();
        let n = outer * ni * inner;
        outs.push(output(gpu, x.elem(), n)?);
        end += n;
        let slot = gather_group_slot(t);
        p = p
            .set(slot, end as u32)
            .set(slot + 1, inner.max(1) as u32)
            .table(slot + 2, &x.desc());
    }
    if end == 0 {
        return Ok(Some(outs));
    }
    crate::elem::check_len("gather_group", end)?;
    p.0[0] = end as u32;
    let inputs: Vec<&wgpu::Buffer> = std::iter::once(idx.buf.raw())
        .chain(xs.iter().map(|x| x.buf.raw()))
        .collect();
    let out_raw: Vec<&wgpu::Buffer> = outs.iter().map(|o| o.raw()).collect();
    let word = run_map(gpu, &k, p, &inputs, &out_raw, true, end)?;
    index_error(gpu, word, "gather", bound)?;
    Ok(Some(outs))
}

/// scatter_add of elements `e` (float32, float16, int32, uint32) with indices of `ie`, or `None`.
pub(crate) fn scatter_add_source(e: Elem, ie: Elem) -> Option<String> {
    if !matches!(e, Elem::F32 | Elem::F16 | Elem::I32 | Elem::U32) {
        return None;
    }
    let body = fill(
        include_str!("../wgsl/scatter_add.wgsl"),
        &[
            ("INDEX_LOAD", &index_load(ie, INDEX_J)?),
            ("FLAG", index_flag(ie)),
            ("C", e.compute()?),
            (
                "LOAD",
                &e.load("A[at(P[1], (outer * ni + j) * inner + i % inner)]"),
            ),
            ("STORE", &e.store_expr("acc")),
        ],
    );
    Some(map_source(
        &[e],
        &[e.store(), ie.store()],
        &[e.store()],
        true,
        &body,
    ))
}

/// A scatter-add of up to this many indices has every output scan them all
/// ([`scatter_add_source`]); with more, the indices are sorted first and each output sums
/// its row's run ([`scatter_keys_source`], `scan::merge_sorted`,
/// [`scatter_add_sorted_source`]), the same terms in the same order.
pub(crate) const SCATTER_SCAN_MAX: usize = 64;

/// Each index of `ie` as a sort key with its position (out of range: flagged, keyed last),
/// or `None`.
pub(crate) fn scatter_keys_source(ie: Elem) -> Option<String> {
    let body = fill(
        include_str!("../wgsl/scatter_keys.wgsl"),
        &[
            ("INDEX_LOAD", &index_load(ie, "A[at(P[1], j)]")?),
            ("FLAG", index_flag(ie)),
        ],
    );
    Some(map_source(&[], &[ie.store()], &["u32", "u32"], true, &body))
}

/// The sums of a scatter-add of elements `e` over indices sorted with their positions, or
/// `None`.
pub(crate) fn scatter_add_sorted_source(e: Elem) -> Option<String> {
    if !matches!(e, Elem::F32 | Elem::F16 | Elem::I32 | Elem::U32) {
        return None;
    }
    let body = fill(
        include_str!("../wgsl/scatter_add_sorted.wgsl"),
        &[
            ("C", e.compute()?),
            (
                "LOAD",
                &e.load("A[at(P[1], (outer * ni + C[j]) * inner + i % inner)]"),
            ),
            ("STORE", &e.store_expr("acc")),
        ],
    );
    Some(map_source(
        &[e],
        &[e.store(), "u32", "u32"],
        &[e.store()],
        false,
        &body,
    ))
}

/// `scatter_add`: scanning every index per output up to [`SCATTER_SCAN_MAX`] indices, by
/// sorted indices beyond.
pub(crate) fn scatter_add(
    idx: &In<'_>,
    upd: &In<'_>,
    shape: &[usize],
    axis: usize,
) -> Result<WgpuBuffer> {
    same_gpu("scatter_add", idx, upd)?;
    let gpu = upd.gpu();
    let e = upd.elem();
    let ie = idx.elem();
    if !matches!(e, Elem::F32 | Elem::F16 | Elem::I32 | Elem::U32) {
        return Err(unsupported_on(gpu, "scatter_add", e.dtype()));
    }
    if !is_index(ie) {
        return Err(backend_error("scatter_add: indices must be int32 or int64"));
    }
    let inner: usize = shape[axis + 1..].iter().product();
    let n: usize = shape.iter().product();
    let out = output(gpu, e, n)?;
    let (ni, bound) = (idx.n(), shape[axis]);
    if ni > SCATTER_SCAN_MAX && n > 0 {
        let keys = gpu.kernel(&format!("scatter_keys_{ie:?}"), 1, 3, || {
            scatter_keys_source(ie).unwrap_or_default()
        })?;
        let scratch = (output(gpu, Elem::U32, ni)?, output(gpu, Elem::U32, ni)?);
        let word = run_map(
            gpu,
            &keys,
            Params::new(ni).set(6, bound as u32).desc(0, idx.desc()),
            &[idx.buf.raw()],
            &[scratch.0.raw(), scratch.1.raw()],
            true,
            ni,
        )?;
        let (sorted, positions) = super::scan::merge_sorted(gpu, scratch.0, scratch.1, ni)?;
        let sums = gpu.kernel(&format!("scatter_add_sorted_{e:?}"), 3, 1, || {
            scatter_add_sorted_source(e).unwrap_or_default()
        })?;
        let p = Params::new(n)
            .set(4, inner.max(1) as u32)
            .set(5, ni as u32)
            .set(6, bound as u32)
            .desc(0, upd.desc());
        run_map(
            gpu,
            &sums,
            p,
            &[upd.buf.raw(), sorted.raw(), positions.raw()],
            &[out.raw()],
            false,
            n,
        )?;
        index_error(gpu, word, "scatter_add", bound)?;
        return Ok(out);
    }
    let k = gpu.kernel(&format!("scatter_add_{e:?}_{ie:?}"), 2, 2, || {
        scatter_add_source(e, ie).unwrap_or_default()
    })?;
    run_indexed(gpu, &k, "scatter_add", (upd, idx), &out, (n, inner), bound)?;
    Ok(out)
}

/// Runs a gather-like kernel over `n` outputs (params: the slab size `inner`, the index
/// count, the indexed axis' length `bound`; descriptors of the data and the indices), then
/// turns an out-of-range index the kernel flagged into the op's error.
fn run_indexed(
    gpu: &Arc<Gpu>,
    k: &crate::gpu::Kernel,
    op: &'static str,
    (data, idx): (&In<'_>, &In<'_>),
    out: &WgpuBuffer,
    (n, inner): (usize, usize),
    bound: usize,
) -> Result<()> {
    if n == 0 {
        return Ok(());
    }
    let p = Params::new(n)
        .set(4, inner.max(1) as u32)
        .set(5, idx.n() as u32)
        .set(6, bound as u32)
        .desc(0, data.desc())
        .desc(1, idx.desc());
    let word = run_map(
        gpu,
        k,
        p,
        &[data.buf.raw(), idx.buf.raw()],
        &[out.raw()],
        true,
        n,
    )?;
    index_error(gpu, word, op, bound)
}

/// The sparse softmax cross-entropy over float32 logits with int32 or int64 labels, or `None`.
pub(crate) fn sparse_softmax_cross_entropy_source(ie: Elem) -> Option<String> {
    let body = fill(
        include_str!("../wgsl/sparse_softmax_xent.wgsl"),
        &[
            ("INDEX_LOAD", &index_load(ie, INDEX_J)?),
            ("FLAG", index_flag(ie)),
        ],
    );
    Some(map_source(
        &[Elem::F32],
        &["f32", ie.store()],
        &["f32", "f32"],
        true,
        &body,
    ))
}

/// Rows of at most this many classes take one invocation each
/// ([`sparse_softmax_cross_entropy_source`]); wider ones a workgroup each
/// ([`sparse_softmax_cross_entropy_wide_source`]).
pub(crate) const SOFTMAX_ROW_MAX: usize = 1024;

/// The sparse softmax cross-entropy over rows wider than [`SOFTMAX_ROW_MAX`]: a workgroup
/// per row (`wgsl/sparse_softmax_xent_wide.wgsl`), or `None`.
pub(crate) fn sparse_softmax_cross_entropy_wide_source(ie: Elem) -> Option<String> {
    let body = fill(
        include_str!("../wgsl/sparse_softmax_xent_wide.wgsl"),
        &[
            ("INDEX_LOAD", &index_load(ie, INDEX_J)?),
            ("FLAG", index_flag(ie)),
        ],
    );
    Some(kernel_source(
        false,
        &format!(
            "{}{body}",
            super::bindings(&["f32", ie.store()], &["f32", "f32"], true)
        ),
    ))
}

/// `(loss, backprop)` of float32 `logits` (`[.., classes]`) against int32/int64 `labels`:
/// one invocation per row, or a workgroup per row for rows wider than [`SOFTMAX_ROW_MAX`];
/// a label outside `[0, classes)` is the op's error.
pub(crate) fn sparse_softmax_cross_entropy(
    logits: &In<'_>,
    labels: &In<'_>,
) -> Result<(WgpuBuffer, WgpuBuffer)> {
    const OP: &str = "sparse_softmax_cross_entropy_with_logits";
    same_gpu(OP, logits, labels)?;
    let gpu = logits.gpu();
    if logits.elem() != Elem::F32 {
        return Err(unsupported_on(gpu, OP, logits.elem().dtype()));
    }
    let ie = labels.elem();
    if !is_index(ie) {
        return Err(backend_error(format!(
            "{OP}: labels must be int32 or int64"
        )));
    }
    let classes = logits.op.shape().last().copied().unwrap_or(0);
    let rows = labels.n();
    let loss = output(gpu, Elem::F32, rows)?;
    let backprop = output(gpu, Elem::F32, logits.n())?;
    if rows == 0 || classes == 0 {
        return Ok((loss, backprop));
    }
    let p = Params::new(rows)
        .set(6, classes as u32)
        .set(7, f32::NEG_INFINITY.to_bits())
        .desc(0, logits.desc())
        .desc(1, labels.desc());
    if classes > SOFTMAX_ROW_MAX {
        let k = gpu.kernel(&format!("sparse_softmax_xent_wide_{ie:?}"), 2, 3, || {
            sparse_softmax_cross_entropy_wide_source(ie).unwrap_or_default()
        })?;
        let word = gpu.error_word()?;
        gpu.dispatch(
            &k,
            &p.0,
            &[logits.buf.raw(), labels.buf.raw()],
            &[loss.raw(), backprop.raw(), &word],
            groups_for(rows, 1)?,
        )?;
        index_error(gpu, Some(word), OP, classes)?;
        return Ok((loss, backprop));
    }
    let k = gpu.kernel(&format!("sparse_softmax_xent_{ie:?}"), 2, 3, || {
        sparse_softmax_cross_entropy_source(ie).unwrap_or_default()
    })?;
    let word = run_map(
        gpu,
        &k,
        p,
        &[logits.buf.raw(), labels.buf.raw()],
        &[loss.raw(), backprop.raw()],
        true,
        rows,
    )?;
    index_error(gpu, word, OP, classes)?;
    Ok((loss, backprop))
}
