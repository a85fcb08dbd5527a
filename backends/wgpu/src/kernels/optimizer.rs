//! The fused optimizer update (`Backend::optimizer_update`): each rule's formula in one
//! kernel over float32 variables, gradients and slots, in the order of operations of
//! TensorFlow's kernels (as the CPU backend's).

use super::movement::copy;
use super::{map_source, output, run_map, same_gpu, In, MAIN};
use crate::buffer::WgpuBuffer;
use crate::elem::{check_len, unsupported_on, Elem, Params};
use crate::shaders::kernel_source;
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

/// The words per variable in the group kernel's table: where its elements end in the
/// group's index space, then the element offsets of `w`, `g` and two slots.
const GROUP_ROW: usize = 5;

/// The fused update of `rule` on `count` float32 variables in one kernel: thread `i` of
/// the group's index space (the variables' elements one after another) finds its variable
/// by the table at `P[P[10]]` (a row of [`GROUP_ROW`] words per variable) and updates that
/// element as [`optimizer_source`] does. Variable `v` reads `W{v}`, `G{v}`, `S{v}_0`,
/// `S{v}_1` and writes `Y{v}` (w'), `Z{v}`, `K{v}` (the slots).
pub(crate) fn optimizer_group_source(rule: &UpdateRule, count: usize) -> String {
    let (_, _, body) = rule_parts(rule);
    let ns = rule.num_slots();
    let mut decl = String::new();
    let mut b = 1;
    for v in 0..count {
        let names = [
            format!("W{v}"),
            format!("G{v}"),
            format!("S{v}_0"),
            format!("S{v}_1"),
        ];
        for n in &names[..2 + ns] {
            decl += &format!("@group(0) @binding({b}) var<storage, read> {n}: array<f32>;\n");
            b += 1;
        }
    }
    for v in 0..count {
        for n in &[format!("Y{v}"), format!("Z{v}"), format!("K{v}")][..1 + ns] {
            decl += &format!("@group(0) @binding({b}) var<storage, read_write> {n}: array<f32>;\n");
            b += 1;
        }
    }
    let mut main = String::from(
        "    let p0 = bitcast<f32>(P[4]);
    let p1 = bitcast<f32>(P[5]);
    let p2 = bitcast<f32>(P[6]);
    let p3 = bitcast<f32>(P[7]);
    let p4 = bitcast<f32>(P[8]);
    let t = P[10];
",
    );
    for v in 0..count {
        let row = v * GROUP_ROW;
        let start = if v == 0 {
            "0u".to_string()
        } else {
            format!("P[t + {}u]", row - GROUP_ROW)
        };
        let keyword = if v == 0 { "    if" } else { " else if" };
        main += &format!(
            "{keyword} i < P[t + {row}u] {{
        let j = i - {start};
        let w = W{v}[P[t + {}u] + j];
        let g = G{v}[P[t + {}u] + j];
",
            row + 1,
            row + 2
        );
        for s in 0..ns {
            main += &format!(
                "        let s{s} = S{v}_{s}[P[t + {}u] + j];\n",
                row + 3 + s
            );
        }
        let body = body
            .replace("Y[i]", &format!("Y{v}[j]"))
            .replace("Z[i]", &format!("Z{v}[j]"))
            .replace("K[i]", &format!("K{v}[j]"))
            .replace("\n    ", "\n        ");
        main += &format!("        {body}\n    }}");
    }
    kernel_source(false, &format!("{decl}{MAIN}{main}\n}}\n"))
}

/// How many variables of `rule` one group kernel may take on `gpu`: its storage buffers
/// (the parameter block, then 3 + 2·slots per variable) within the adapter's per-stage
/// limit.
fn variables_per_kernel(gpu: &crate::gpu::Gpu, rule: &UpdateRule) -> usize {
    let per = 3 + 2 * rule.num_slots();
    (gpu.max_storage_buffers.saturating_sub(1) / per).max(1)
}

/// [`optimizer_update`] of several float32 variables (`Backend::optimizer_update_group`):
/// as many per kernel as the adapter's binding limit allows (all of a model's usually;
/// lavapipe's 32 storage buffers take 4 Adam variables), one kernel per variable where
/// only one fits.
pub(crate) fn optimizer_update_group(
    rule: &UpdateRule,
    variables: &[(In<'_>, In<'_>, Vec<In<'_>>)],
) -> Result<Vec<(WgpuBuffer, Vec<WgpuBuffer>)>> {
    let Some((w0, _, _)) = variables.first() else {
        return Ok(vec![]);
    };
    let gpu = w0.gpu();
    let per_kernel = variables_per_kernel(gpu, rule);
    let mut updated = Vec::with_capacity(variables.len());
    for group in variables.chunks(per_kernel) {
        if let [(w, g, slots)] = group {
            updated.push(optimizer_update(rule, w, g, slots)?);
            continue;
        }
        updated.extend(update_group_in_one_kernel(rule, group)?);
    }
    Ok(updated)
}

/// One kernel updating every variable of `group` (which fits the binding limit).
fn update_group_in_one_kernel(
    rule: &UpdateRule,
    group: &[(In<'_>, In<'_>, Vec<In<'_>>)],
) -> Result<Vec<(WgpuBuffer, Vec<WgpuBuffer>)>> {
    let gpu = group[0].0.gpu();
    let ns = rule.num_slots();
    let mut dense_copies: Vec<WgpuBuffer> = vec![];
    let mut table: Vec<u32> = Vec::with_capacity(group.len() * GROUP_ROW);
    let mut operands: Vec<(usize, Option<usize>, usize)> = vec![]; // (variable, copy, offset)
    let mut total = 0usize;
    for (v, (w, g, slots)) in group.iter().enumerate() {
        let all: Vec<&In<'_>> = [w, g].into_iter().chain(slots).collect();
        if let Some(x) = all.iter().find(|x| x.elem() != Elem::F32) {
            return Err(unsupported_on(
                gpu,
                "optimizer_update_group",
                x.elem().dtype(),
            ));
        }
        for x in &all {
            same_gpu("optimizer_update_group", &group[0].0, x)?;
        }
        total += w.n();
        check_len("optimizer_update_group", total)?;
        table.push(total as u32);
        let mut row = [0u32; GROUP_ROW - 1];
        for (k, x) in all.iter().enumerate() {
            match x.op.layout.contiguous_range() {
                Some((off, _)) => {
                    operands.push((v, None, k));
                    row[k] = off as u32;
                }
                None => {
                    dense_copies.push(copy(x)?);
                    operands.push((v, Some(dense_copies.len() - 1), k));
                }
            }
        }
        table.extend_from_slice(&row);
    }
    let inputs: Vec<&wgpu::Buffer> = operands
        .iter()
        .map(|&(v, c, k)| match c {
            Some(c) => dense_copies[c].raw(),
            None => {
                let (w, g, slots) = &group[v];
                match k {
                    0 => w.buf.raw(),
                    1 => g.buf.raw(),
                    s => slots[s - 2].buf.raw(),
                }
            }
        })
        .collect();
    let (name, p, _) = rule_parts(rule);
    let count = group.len();
    let k = gpu.kernel(
        &format!("optimizer_group_{name}_{count}"),
        count * (2 + ns),
        count * (1 + ns),
        || optimizer_group_source(rule, count),
    )?;
    let mut results = Vec::with_capacity(count);
    for (w, _, _) in group {
        let n = w.n();
        let nw = output(gpu, Elem::F32, n)?;
        let new_slots = (0..ns)
            .map(|_| output(gpu, Elem::F32, n))
            .collect::<Result<Vec<_>>>()?;
        results.push((nw, new_slots));
    }
    let mut params = Params::new(total);
    for (i, v) in p.iter().enumerate() {
        params = params.set(4 + i, (*v as f32).to_bits());
    }
    let params = params.table(10, &table);
    let outputs: Vec<&wgpu::Buffer> = results
        .iter()
        .flat_map(|(nw, ns)| std::iter::once(nw.raw()).chain(ns.iter().map(|s| s.raw())))
        .collect();
    run_map(gpu, &k, params, &inputs, &outputs, false, total)?;
    Ok(results)
}
