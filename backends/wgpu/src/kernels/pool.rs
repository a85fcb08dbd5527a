//! Pooling and its gradients over NHWC windows: max and average pooling
//! (`wgsl/pool2d.wgsl`), and the gradients (`wgsl/pool_grad_windows.wgsl` opening
//! `max_pool_grad.wgsl` and `avg_pool_grad.wgsl`), on the window geometry of
//! `wgsl/geometry.wgsl`.

use super::{bindings, float_only, output, run_map, same_gpu, In, MAIN};
use crate::buffer::WgpuBuffer;
use crate::elem::{Elem, Params};
use crate::shaders::{fill, kernel_source, GEO_LIB};
use ferroflow_tensor::{PoolKind, Result, Window2d};

/// The geometry table `GEO_LIB` reads: the window (0..14), the first operand's offset and
/// 4-D strides (14..19), the output channels (19), the second operand's (20..25).
pub(crate) fn geo_table(
    w: &Window2d,
    first: Option<&In<'_>>,
    cout: usize,
    second: Option<&In<'_>>,
) -> Vec<u32> {
    let mut t: Vec<u32> = [
        w.input[0],
        w.input[1],
        w.input[2],
        w.input[3],
        w.kernel[0],
        w.kernel[1],
        w.output[0],
        w.output[1],
        w.strides[0],
        w.strides[1],
        w.dilations[0],
        w.dilations[1],
        w.pad_before[0],
        w.pad_before[1],
    ]
    .iter()
    .map(|&v| v as u32)
    .collect();
    let operand = |t: &mut Vec<u32>, x: Option<&In<'_>>| match x {
        Some(x) => {
            t.push(x.op.layout.offset() as u32);
            t.extend(x.op.layout.strides().iter().map(|&s| s as i32 as u32));
        }
        None => t.extend([0; 5]),
    };
    operand(&mut t, first);
    t.push(cout as u32);
    operand(&mut t, second);
    t
}

/// A window kernel: the geometry library, then a map kernel over `inputs` (storage types)
/// into one output of `e` running `body`.
fn window_source(e: Elem, inputs: &[&str], body: &str) -> String {
    kernel_source(
        e == Elem::F16,
        &format!(
            "{GEO_LIB}{}{MAIN}{body}\n}}\n",
            bindings(inputs, &[e.store()], false)
        ),
    )
}

/// Max or average pooling of float elements `e`, or `None` for other dtypes.
pub(crate) fn pool2d_source(kind: PoolKind, e: Elem) -> Option<String> {
    if !e.is_float() {
        return None;
    }
    let (init, combine, result) = match kind {
        PoolKind::MaxPool2d => (
            "-f_inf()",
            "if is_nan(v) || (!is_nan(acc) && v > acc) { acc = v; }",
            "acc",
        ),
        PoolKind::AvgPool2d => ("0.0", "acc = acc + v;", "acc / max(count, 1.0)"),
    };
    let body = fill(
        include_str!("../wgsl/pool2d.wgsl"),
        &[
            ("INIT", init),
            ("COMBINE", combine),
            ("STORE", &e.store_expr(result)),
            ("LOAD", &e.load("A[a_at(n, u32(h), u32(ww), c)]")),
        ],
    );
    Some(window_source(e, &[e.store()], &body))
}

pub(crate) fn pool2d(kind: PoolKind, x: &In<'_>, w: &Window2d) -> Result<WgpuBuffer> {
    let gpu = x.gpu();
    let e = x.elem();
    float_only(gpu, kind.name(), e)?;
    let k = gpu.kernel(&format!("{}_{e:?}", kind.name()), 1, 1, || {
        pool2d_source(kind, e).unwrap_or_default()
    })?;
    let n = w.input[0] * w.output[0] * w.output[1] * w.input[3];
    let out = output(gpu, e, n)?;
    let p = Params::new(n).table(4, &geo_table(w, Some(x), 0, None));
    run_map(gpu, &k, p, &[x.buf.raw()], &[out.raw()], false, n)?;
    Ok(out)
}

/// The gradient of max pooling (dy to each window's first maximum) for float elements `e`.
pub(crate) fn max_pool_grad_source(e: Elem) -> Option<String> {
    if !e.is_float() {
        return None;
    }
    let body = fill(
        &[
            include_str!("../wgsl/pool_grad_windows.wgsl"),
            include_str!("../wgsl/max_pool_grad.wgsl"),
        ]
        .concat(),
        &[
            ("LOADX", &e.load("A[a_at(n, u32(h), u32(ww), c)]")),
            (
                "LOADDY",
                &e.load("B[at(P[1], ((n * G.oh + u32(oh)) * G.ow + u32(ow)) * G.c + c)]"),
            ),
            ("STORE", &e.store_expr("acc")),
        ],
    );
    Some(window_source(e, &[e.store(), e.store()], &body))
}

/// The gradient of average pooling (dy shared over each window's valid taps).
pub(crate) fn avg_pool_grad_source(e: Elem) -> Option<String> {
    if !e.is_float() {
        return None;
    }
    let body = fill(
        &[
            include_str!("../wgsl/pool_grad_windows.wgsl"),
            include_str!("../wgsl/avg_pool_grad.wgsl"),
        ]
        .concat(),
        &[
            (
                "LOADDY",
                &e.load("A[at(P[1], ((n * G.oh + u32(oh)) * G.ow + u32(ow)) * G.c + c)]"),
            ),
            ("STORE", &e.store_expr("acc")),
        ],
    );
    Some(window_source(e, &[e.store()], &body))
}

/// dy routed to the first maximum of each window: each input element sums the dy of the
/// windows whose first maximum it is.
pub(crate) fn max_pool_grad(x: &In<'_>, dy: &In<'_>, w: &Window2d) -> Result<WgpuBuffer> {
    same_gpu("max_pool_grad", x, dy)?;
    let gpu = x.gpu();
    let e = x.elem();
    float_only(gpu, "max_pool_grad", e)?;
    let k = gpu.kernel(&format!("max_pool_grad_{e:?}"), 2, 1, || {
        max_pool_grad_source(e).unwrap_or_default()
    })?;
    let n: usize = w.input.iter().product();
    let out = output(gpu, e, n)?;
    let p = Params::new(n)
        .desc(0, dy.desc())
        .table(4, &geo_table(w, Some(x), 0, None));
    run_map(
        gpu,
        &k,
        p,
        &[x.buf.raw(), dy.buf.raw()],
        &[out.raw()],
        false,
        n,
    )?;
    Ok(out)
}

pub(crate) fn avg_pool_grad(dy: &In<'_>, w: &Window2d) -> Result<WgpuBuffer> {
    let gpu = dy.gpu();
    let e = dy.elem();
    float_only(gpu, "avg_pool_grad", e)?;
    let k = gpu.kernel(&format!("avg_pool_grad_{e:?}"), 1, 1, || {
        avg_pool_grad_source(e).unwrap_or_default()
    })?;
    let n: usize = w.input.iter().product();
    let out = output(gpu, e, n)?;
    let p = Params::new(n)
        .desc(0, dy.desc())
        .table(4, &geo_table(w, None, 0, None));
    run_map(gpu, &k, p, &[dy.buf.raw()], &[out.raw()], false, n)?;
    Ok(out)
}
