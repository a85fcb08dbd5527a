//! The fused optimizer update (`Backend::optimizer_update`): each rule's formula in one
//! kernel over float32 variables, gradients and slots, in the order of operations of
//! TensorFlow's kernels (as the CPU backend's).

use super::movement::copy;
use super::{map_source, output, run_map, same_gpu, In};
use crate::buffer::WgpuBuffer;
use crate::elem::{unsupported_on, Elem, Params};
use ferroflow_tensor::{Result, UpdateRule};

/// A rule's kernel name, its five scalars (`p0`..`p4`) and the WGSL updating `Y` (w'), `Z`
/// and `K` (the slots) from `w`, `g`, `s0`, `s1`.
fn rule_parts(rule: &UpdateRule) -> (&'static str, [f64; 5], &'static str) {
    match *rule {
        UpdateRule::SgdMomentum {
            lr,
            momentum,
            nesterov,
        } => (
            "sgd",
            [lr, momentum, nesterov as u8 as f64, 0.0, 0.0],
            "let s0n = s0 * p1 - g * p0;
    Z[i] = s0n;
    Y[i] = select(w + s0n, w + (s0n * p1 - g * p0), p2 != 0.0);",
        ),
        UpdateRule::Adam {
            lr_t,
            beta_1,
            beta_2,
            epsilon,
            decay,
        } => (
            "adam",
            [lr_t, beta_1, beta_2, epsilon, decay],
            "let s0n = s0 + (g - s0) * (1.0 - p1);
    let s1n = s1 + (g * g - s1) * (1.0 - p2);
    Z[i] = s0n;
    K[i] = s1n;
    Y[i] = (w - p4 * w) - (s0n * p0) / (sqrt(s1n) + p3);",
        ),
        UpdateRule::RmsProp {
            lr,
            rho,
            epsilon,
            centered: false,
        } => (
            "rmsprop",
            [lr, rho, epsilon, 0.0, 0.0],
            "let s0n = p1 * s0 + (1.0 - p1) * (g * g);
    Z[i] = s0n;
    Y[i] = w - (p0 * g) / (f_sqrt(s0n) + p2);",
        ),
        UpdateRule::RmsProp {
            lr,
            rho,
            epsilon,
            centered: true,
        } => (
            "rmsprop_centered",
            [lr, rho, epsilon, 0.0, 0.0],
            "let s0n = p1 * s0 + (1.0 - p1) * (g * g);
    let s1n = p1 * s1 + (1.0 - p1) * g;
    Z[i] = s0n;
    K[i] = s1n;
    Y[i] = w - (p0 * g) / (f_sqrt(s0n - s1n * s1n) + p2);",
        ),
        UpdateRule::Adagrad { lr, epsilon } => (
            "adagrad",
            [lr, epsilon, 0.0, 0.0, 0.0],
            "let s0n = s0 + g * g;
    Z[i] = s0n;
    Y[i] = w - (g * p0) / (sqrt(s0n) + p1);",
        ),
        UpdateRule::Adadelta { lr, rho, epsilon } => (
            "adadelta",
            [lr, rho, epsilon, 0.0, 0.0],
            "let s0n = s0 * p1 + (g * g) * (1.0 - p1);
    let u = f_sqrt(s1 + p2) * (1.0 / f_sqrt(s0n + p2)) * g;
    Z[i] = s0n;
    K[i] = s1 * p1 + (u * u) * (1.0 - p1);
    Y[i] = w - u * p0;",
        ),
        UpdateRule::Adamax {
            lr_t,
            beta_1,
            beta_2,
            epsilon,
        } => (
            "adamax",
            [lr_t, beta_1, beta_2, epsilon, 0.0],
            "let s0n = s0 + (g - s0) * (1.0 - p1);
    let s1n = max(p2 * s1, abs(g));
    Z[i] = s0n;
    K[i] = s1n;
    Y[i] = w - p0 * (s0n / (s1n + p3));",
        ),
    }
}

/// The fused update of `rule` on float32 operands.
pub(crate) fn optimizer_source(rule: &UpdateRule) -> String {
    let (_, _, body) = rule_parts(rule);
    let ns = rule.num_slots();
    let mut head = String::from(
        "    let w = A[P[12] + i];
    let g = B[P[13] + i];
    let p0 = bitcast<f32>(P[4]);
    let p1 = bitcast<f32>(P[5]);
    let p2 = bitcast<f32>(P[6]);
    let p3 = bitcast<f32>(P[7]);
    let p4 = bitcast<f32>(P[8]);
",
    );
    if ns >= 1 {
        head += "    let s0 = C[P[14] + i];\n";
    }
    if ns >= 2 {
        head += "    let s1 = D[P[15] + i];\n";
    }
    let ins = vec!["f32"; 2 + ns];
    let outs = vec!["f32"; 1 + ns];
    map_source(
        &[Elem::F32],
        &ins,
        &outs,
        false,
        &format!("{head}    {body}"),
    )
}

/// One optimizer step per element (`Backend::optimizer_update`): the rule's formula in one
/// kernel instead of a chain of primitives, on float32 operands of one GPU (what
/// `has_fused` declares); strided views are made dense first.
pub(crate) fn optimizer_update(
    rule: &UpdateRule,
    w: &In<'_>,
    g: &In<'_>,
    slots: &[In<'_>],
) -> Result<(WgpuBuffer, Vec<WgpuBuffer>)> {
    let gpu = w.gpu();
    let all: Vec<&In<'_>> = [w, g].into_iter().chain(slots).collect();
    if let Some(x) = all.iter().find(|x| x.elem() != Elem::F32) {
        return Err(unsupported_on(gpu, "optimizer_update", x.elem().dtype()));
    }
    // (The tensor layer checked the slot count, shapes and dtypes.)
    for x in &all[1..] {
        same_gpu("optimizer_update", w, x)?;
    }
    // Each operand as (buffer, element offset): views that are not one dense range are
    // copied to a dense buffer first.
    let dense_copies: Vec<Option<WgpuBuffer>> = all
        .iter()
        .map(|x| match x.op.layout.contiguous_range() {
            Some(_) => Ok(None),
            None => copy(x).map(Some),
        })
        .collect::<Result<_>>()?;
    let operands: Vec<(&wgpu::Buffer, usize)> = all
        .iter()
        .zip(&dense_copies)
        .map(|(x, c)| match c {
            Some(c) => (c.raw(), 0),
            None => (
                x.buf.raw(),
                x.op.layout.contiguous_range().map_or(0, |(off, _)| off),
            ),
        })
        .collect();
    let (name, p, _) = rule_parts(rule);
    let ns = slots.len();
    let k = gpu.kernel(&format!("optimizer_{name}"), 2 + ns, 1 + ns, || {
        optimizer_source(rule)
    })?;
    let n = w.n();
    let nw = output(gpu, Elem::F32, n)?;
    let new_slots = (0..ns)
        .map(|_| output(gpu, Elem::F32, n))
        .collect::<Result<Vec<_>>>()?;
    let mut params = Params::new(n);
    for (i, v) in p.iter().enumerate() {
        params = params.set(4 + i, (*v as f32).to_bits());
    }
    for (i, (_, off)) in operands.iter().enumerate() {
        params = params.set(12 + i, *off as u32);
    }
    let inputs: Vec<&wgpu::Buffer> = operands.iter().map(|(b, _)| *b).collect();
    let mut outputs = vec![nw.raw()];
    outputs.extend(new_slots.iter().map(|s| s.raw()));
    run_map(gpu, &k, params, &inputs, &outputs, false, n)?;
    Ok((nw, new_slots))
}
