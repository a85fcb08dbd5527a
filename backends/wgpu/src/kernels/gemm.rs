//! Register-tiled GEMM, and convolution as implicit GEMM through the same kernel.
//!
//! A workgroup of 256 threads computes a `BM × BN` output tile; each thread holds a
//! `TM × TN` block of accumulators in registers and the K loop stages `BK`-deep slices of
//! both operands in workgroup memory. The operands are read by two WGSL functions, so the
//! same tiling serves a strided, batched matmul (transposes are strides) and the three
//! convolution products, whose "matrices" are computed from NHWC tensors on the fly
//! (im2col without materialising it).

use super::{output, In};
use crate::elem::{Elem, Params};
use crate::gpu::{backend_error, Gpu, Kernel};
use crate::shaders::{fill, kernel_source, GEO_LIB};
use ferroflow_tensor::{
    BinaryOp, DType, ElementwiseProgram, FusedActivation, Layout, Operand, ReduceOp, Result,
    UnaryOp, Window2d,
};
use std::sync::Arc;

#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub(crate) struct Tile {
    bm: u32,
    bn: u32,
    bk: u32,
    tm: u32,
    tn: u32,
}

pub(crate) const BIG: Tile = Tile {
    bm: 128,
    bn: 128,
    bk: 8,
    tm: 8,
    tn: 8,
};
pub(crate) const MID: Tile = Tile {
    bm: 64,
    bn: 64,
    bk: 8,
    tm: 4,
    tn: 4,
};
pub(crate) const SMALL: Tile = Tile {
    bm: 32,
    bn: 32,
    bk: 8,
    tm: 2,
    tn: 2,
};

/// The largest tile that still gives the GPU enough workgroups.
fn pick_tile(m: usize, n: usize, batch: usize) -> Tile {
    let tiles = |t: Tile| m.div_ceil(t.bm as usize) * n.div_ceil(t.bn as usize) * batch;
    if tiles(BIG) >= 128 {
        BIG
    } else if tiles(MID) >= 64 {
        MID
    } else {
        SMALL
    }
}

/// How the kernel reads its operands.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub(crate) enum Reads {
    /// Through `load_a(base, m, k)` / `load_b(base, k, n)`, one element at a time; `a_m_fast`
    /// and `b_k_fast` pick which index consecutive threads walk (the operand's contiguous one).
    Scalar { a_m_fast: bool, b_k_fast: bool },
    /// Row-major A and B (k and n contiguous, everything a multiple of 4): `vec4` loads.
    Vec4,
}

/// What a GEMM kernel does with its accumulators.
enum Epilogue<'a> {
    /// Stores each output, `Y[(b·M + row)·N + col]` = the expression the closure makes of
    /// the accumulator's name and the column's expression.
    Store(&'a dyn Fn(&str, &str) -> String),
    /// One workgroup per column tile walks every row tile: each output passes through
    /// `program_value(row·N + col, value)` (which stores what else it writes), and the
    /// values it returns are summed down the columns into `Y[col]` (no batch, no split K).
    ColumnSums,
}

/// The GEMM kernel: thread `(tr, tc)` owns rows `tr·TM + i` and columns `tc + j·CT` of the
/// tile (columns interleaved, so workgroup-memory reads of B hit distinct banks and stores
/// coalesce), accumulating in `TM·TN` scalar registers (generated code, no arrays).
fn gemm_source(t: Tile, c: &str, fma: bool, reads: Reads, epilogue: Epilogue<'_>) -> String {
    let (rt, ct) = (t.bm / t.tm, t.bn / t.tn);
    assert_eq!(rt * ct, 256, "GEMM tiles use 256 threads");
    let column_sums = matches!(epilogue, Epilogue::ColumnSums);
    let mut s = format!(
        "const BM: u32 = {}u;
const BN: u32 = {}u;
const BK: u32 = {}u;
var<workgroup> As: array<{c}, {}>;
var<workgroup> Bs: array<{c}, {}>;
@compute @workgroup_size(256)
fn main(@builtin(workgroup_id) wid: vec3<u32>, @builtin(local_invocation_index) tid: u32) {{
    setup();
    let M = P[5];
    let N = P[6];
    let K = P[7];
    let b = wid.z;
    let abase = a_base(b);
    let bbase = b_base(b);
    let col0 = wid.x * BN;
    let tr = tid / {ct}u;
    let tc = tid % {ct}u;
",
        t.bm,
        t.bn,
        t.bk,
        t.bm * t.bk,
        t.bn * t.bk
    );
    if column_sums {
        for j in 0..t.tn {
            s += &format!("    var s{j}: f32 = 0.0;\n");
        }
        s += "    for (var row0 = 0u; row0 < M; row0 = row0 + BM) {\n";
    } else {
        s += "    let row0 = wid.y * BM;\n";
    }
    for i in 0..t.tm {
        for j in 0..t.tn {
            s += &format!("    var c{i}_{j}: {c} = {c}();\n");
        }
    }
    // Split K: workgroup z takes K range [z·P[12], (z+1)·P[12]) into its own output slab.
    s += "    var kb = 0u;
    var ke = K;
    if P[12] != 0u {
        kb = wid.z * P[12];
        ke = min(kb + P[12], K);
    }
    for (var k0 = kb; k0 < ke; k0 = k0 + BK) {\n";
    match reads {
        Reads::Scalar { a_m_fast, b_k_fast } => {
            let aidx = if a_m_fast {
                "let m = e % BM; let kk = e / BM;"
            } else {
                "let m = e / BK; let kk = e % BK;"
            };
            let bidx = if b_k_fast {
                "let kk = e % BK; let n = e / BK;"
            } else {
                "let n = e % BN; let kk = e / BN;"
            };
            s += &format!(
                "        for (var e = tid; e < BM * BK; e = e + 256u) {{
            {aidx}
            let gm = row0 + m;
            let gk = k0 + kk;
            var v = {c}();
            if gm < M && gk < ke {{ v = load_a(abase, gm, gk); }}
            As[kk * BM + m] = v;
        }}
        for (var e = tid; e < BK * BN; e = e + 256u) {{
            {bidx}
            let gn = col0 + n;
            let gk = k0 + kk;
            var v = {c}();
            if gn < N && gk < ke {{ v = load_b(bbase, gk, gn); }}
            Bs[kk * BN + n] = v;
        }}
"
            );
        }
        Reads::Vec4 => {
            s += "        for (var e = tid; e < BM * BK / 4u; e = e + 256u) {
            let m = e / (BK / 4u);
            let kk = (e % (BK / 4u)) * 4u;
            let gm = row0 + m;
            let gk = k0 + kk;
            var v = vec4<f32>();
            if gm < M && gk < ke { v = A4[(u32(abase) + gm * P[8] + gk) / 4u]; }
            As[kk * BM + m] = v.x;
            As[(kk + 1u) * BM + m] = v.y;
            As[(kk + 2u) * BM + m] = v.z;
            As[(kk + 3u) * BM + m] = v.w;
        }
        for (var e = tid; e < BK * BN / 4u; e = e + 256u) {
            let kk = e / (BN / 4u);
            let n = (e % (BN / 4u)) * 4u;
            let gn = col0 + n;
            let gk = k0 + kk;
            var v = vec4<f32>();
            if gn < N && gk < ke { v = B4[(u32(bbase) + gk * P[10] + gn) / 4u]; }
            let o = kk * BN + n;
            Bs[o] = v.x;
            Bs[o + 1u] = v.y;
            Bs[o + 2u] = v.z;
            Bs[o + 3u] = v.w;
        }
";
        }
    }
    s += &format!(
        "        workgroupBarrier();
        for (var kk = 0u; kk < BK; kk = kk + 1u) {{
            let ao = kk * BM + tr * {}u;
            let bo = kk * BN + tc;
",
        t.tm
    );
    for i in 0..t.tm {
        s += &format!("            let a{i} = As[ao + {i}u];\n");
    }
    for j in 0..t.tn {
        s += &format!("            let b{j} = Bs[bo + {}u];\n", j * ct);
    }
    for i in 0..t.tm {
        for j in 0..t.tn {
            if fma {
                s += &format!("            c{i}_{j} = fma(a{i}, b{j}, c{i}_{j});\n");
            } else {
                s += &format!("            c{i}_{j} = c{i}_{j} + a{i} * b{j};\n");
            }
        }
    }
    s += "        }
        workgroupBarrier();
    }
";
    for i in 0..t.tm {
        s += &format!(
            "    let r{i} = row0 + tr * {}u + {i}u;\n    if r{i} < M {{\n",
            t.tm
        );
        for j in 0..t.tn {
            let col = format!("col0 + tc + {}u", j * ct);
            s += &match &epilogue {
                Epilogue::Store(store) => format!(
                    "        if {col} < N {{ Y[(b * M + r{i}) * N + {col}] = {}; }}\n",
                    store(&format!("c{i}_{j}"), &col)
                ),
                Epilogue::ColumnSums => format!(
                    "        if {col} < N {{ s{j} = s{j} + program_value(r{i} * N + {col}, c{i}_{j}); }}\n"
                ),
            };
        }
        s += "    }\n";
    }
    if column_sums {
        // The row tiles' loop ends; each thread's column partials, then a sum down the
        // threads of each column (in order: the same bits every run).
        s += "    }\n";
        s = s.replacen(
            "var<workgroup> Bs:",
            &format!(
                "var<workgroup> Red: array<f32, {}>;\nvar<workgroup> Bs:",
                rt * t.bn
            ),
            1,
        );
        for j in 0..t.tn {
            s += &format!("    Red[tr * BN + tc + {}u] = s{j};\n", j * ct);
        }
        s += &format!(
            "    workgroupBarrier();
    if tid < BN && col0 + tid < N {{
        var total: f32 = 0.0;
        for (var q = 0u; q < {rt}u; q = q + 1u) {{ total = total + Red[q * BN + tid]; }}
        Y[col0 + tid] = total;
    }}
"
        );
    }
    s += "}\n";
    s
}

/// The full GEMM source: operands of storage types `a` and `b`, output `out`, read as
/// `reads` says through `loaders` (the WGSL defining `setup`, `a_base`, `b_base` and, for
/// scalar reads, `load_a`/`load_b`).
pub(crate) fn gemm_full_source(
    t: Tile,
    (a, b, out): (Elem, Elem, Elem),
    reads: Reads,
    loaders: &str,
) -> String {
    let f16 = [a, b, out].contains(&Elem::F16);
    let c = a.compute().unwrap_or("f32");
    let body = gemm_source(
        t,
        c,
        a.is_float(),
        reads,
        Epilogue::Store(&|v, _| out.store_expr(v)),
    );
    let (ta, tb) = operand_declarations(reads);
    let decl = fill(
        &format!(
            "@group(0) @binding(1) var<storage, read> {ta};
@group(0) @binding(2) var<storage, read> {tb};
@group(0) @binding(3) var<storage, read_write> Y: array<$Y>;
"
        ),
        &[("A", a.store()), ("B", b.store()), ("Y", out.store())],
    );
    kernel_source(f16, &format!("{decl}{loaders}{body}"))
}

/// The GEMM's operand bindings for `reads` (element types `$A`/`$B` for scalar reads).
fn operand_declarations(reads: Reads) -> (&'static str, &'static str) {
    match reads {
        Reads::Vec4 => ("A4: array<vec4<f32>>", "B4: array<vec4<f32>>"),
        Reads::Scalar { .. } => ("A: array<$A>", "B: array<$B>"),
    }
}

/// The float32 GEMM with a bias-and-activation epilogue (`fused_matmul`): the bias
/// (binding 3, dense from word `P[13]`) added to each output column as the tile is
/// stored, then the activation (ReLU keeps NaN, as the `relu` kernel).
pub(crate) fn gemm_epilogue_source(
    t: Tile,
    reads: Reads,
    loaders: &str,
    activation: FusedActivation,
) -> String {
    let body = gemm_source(
        t,
        "f32",
        true,
        reads,
        Epilogue::Store(&|v, col| format!("epilogue({v}, {col})")),
    );
    let (ta, tb) = operand_declarations(reads);
    let act = match activation {
        FusedActivation::Linear => "return s;",
        FusedActivation::Relu => "return select(s, 0.0, s <= 0.0);",
    };
    let decl = fill(
        &format!(
            "@group(0) @binding(1) var<storage, read> {ta};
@group(0) @binding(2) var<storage, read> {tb};
@group(0) @binding(3) var<storage, read> Bias: array<f32>;
@group(0) @binding(4) var<storage, read_write> Y: array<f32>;
fn epilogue(v: f32, col: u32) -> f32 {{
    let s = v + Bias[P[13] + col];
    {act}
}}
"
        ),
        &[("A", "f32"), ("B", "f32")],
    );
    kernel_source(false, &format!("{decl}{loaders}{body}"))
}

/// Builds (once) the GEMM kernel with the given operand readers.
#[allow(clippy::too_many_arguments)]
fn gemm_kernel(
    gpu: &Arc<Gpu>,
    key: &str,
    t: Tile,
    a: Elem,
    b: Elem,
    out: Elem,
    reads: Reads,
    loaders: &str,
) -> Result<Arc<Kernel>> {
    let key = format!("{key}_{t:?}_{a:?}{b:?}{out:?}_{reads:?}");
    gpu.kernel_trusted(&key, 2, 1, || {
        gemm_full_source(t, (a, b, out), reads, loaders)
    })
}

fn float_operands(gpu: &Gpu, op: &'static str, e: Elem) -> Result<()> {
    if e.is_float() {
        Ok(())
    } else {
        Err(crate::elem::unsupported_on(gpu, op, e.dtype()))
    }
}

/// The matmul's operand readers for storage type `e`: strided scalar loads, or only the
/// batch bases for `vec4` reads.
pub(crate) fn matmul_loaders(e: Elem, reads: Reads) -> String {
    let bases = "fn setup() {}
fn a_base(b: u32) -> i32 { return bitcast<i32>(at(P[1], b)); }
fn b_base(b: u32) -> i32 { return bitcast<i32>(at(P[2], b)); }
";
    if reads == Reads::Vec4 {
        return bases.to_string();
    }
    let c = e.compute().unwrap_or("f32");
    format!(
        "{bases}fn load_a(base: i32, m: u32, k: u32) -> {c} {{
    return {};
}}
fn load_b(base: i32, k: u32, n: u32) -> {c} {{
    return {};
}}
",
        e.load("A[u32(base + i32(m) * bitcast<i32>(P[8]) + i32(k) * bitcast<i32>(P[9]))]"),
        e.load("B[u32(base + i32(k) * bitcast<i32>(P[10]) + i32(n) * bitcast<i32>(P[11]))]"),
    )
}

/// A matmul's kernel choice: tile, operand reads, loaders, parameters and `(batch, m, n,
/// k)`; `None` when the output is empty.
struct MatmulPlan {
    tile: Tile,
    reads: Reads,
    loaders: String,
    params: Params,
    dims: (usize, usize, usize, usize),
}

fn plan_matmul(a: &In<'_>, b: &In<'_>) -> Result<Option<MatmulPlan>> {
    let gpu = a.gpu();
    let e = a.elem();
    if !Arc::ptr_eq(gpu, b.gpu()) {
        return Err(backend_error("matmul: operands live on different GPUs"));
    }
    if !matches!(e, Elem::F32 | Elem::F16 | Elem::I32) {
        return Err(crate::elem::unsupported_on(gpu, "matmul", e.dtype()));
    }
    let (sa, sb) = (a.op.shape(), b.op.shape());
    let r = sa.len();
    let (m, k, n) = (sa[r - 2], sa[r - 1], sb[r - 1]);
    let batch_dims = &sa[..r - 2];
    let batch: usize = batch_dims.iter().product();
    if batch * m * n == 0 {
        return Ok(None);
    }
    if batch > 65535 {
        return Err(backend_error(format!(
            "matmul: {batch} batch matrices exceed one dispatch (65535)"
        )));
    }
    let (ast, bst) = (a.op.layout.strides(), b.op.layout.strides());
    let (sam, sak, sbk, sbn) = (ast[r - 2], ast[r - 1], bst[r - 2], bst[r - 1]);
    let t = pick_tile(m, n, batch);
    let four = |v: isize| v.rem_euclid(4) == 0;
    let vec4 = e == Elem::F32
        && sak == 1
        && sbn == 1
        && four(sam)
        && four(sbk)
        && k % 4 == 0
        && n % 4 == 0
        && four(a.op.layout.offset() as isize)
        && four(b.op.layout.offset() as isize)
        && ast[..r - 2].iter().chain(&bst[..r - 2]).all(|&s| four(s));
    let reads = if vec4 {
        Reads::Vec4
    } else {
        Reads::Scalar {
            a_m_fast: sam == 1 && sak != 1,
            b_k_fast: sbk == 1 && sbn != 1,
        }
    };
    let loaders = matmul_loaders(e, reads);
    let p = Params::new(0)
        .set(5, m as u32)
        .set(6, n as u32)
        .set(7, k as u32)
        .set(8, sam as i32 as u32)
        .set(9, sak as i32 as u32)
        .set(10, sbk as i32 as u32)
        .set(11, sbn as i32 as u32)
        .desc(
            0,
            crate::elem::descriptor(batch_dims, &ast[..r - 2], a.op.layout.offset()),
        )
        .desc(
            1,
            crate::elem::descriptor(batch_dims, &bst[..r - 2], b.op.layout.offset()),
        );
    Ok(Some(MatmulPlan {
        tile: t,
        reads,
        loaders,
        params: p,
        dims: (batch, m, n, k),
    }))
}

/// `[..batch, m, k] × [..batch, k, n]` with strided (and broadcast) operands.
pub(crate) fn matmul(a: &In<'_>, b: &In<'_>) -> Result<crate::buffer::WgpuBuffer> {
    let Some(plan) = plan_matmul(a, b)? else {
        return output(a.gpu(), a.elem(), 0);
    };
    launch_plan(a, b, plan)
}

/// Runs a planned product (split over K when the plan's output alone cannot fill the GPU).
fn launch_plan(a: &In<'_>, b: &In<'_>, plan: MatmulPlan) -> Result<crate::buffer::WgpuBuffer> {
    launch(
        a.gpu(),
        "matmul",
        (plan.tile, a.elem(), plan.reads),
        &plan.loaders,
        plan.params,
        (a.buf.raw(), b.buf.raw()),
        plan.dims,
    )
}

/// `activation(a @ b + bias)` for float32 operands: the GEMM with the bias and activation
/// in its epilogue (one kernel); a product that splits K, or a strided bias, runs the
/// GEMM and then the bias add and activation kernels.
pub(crate) fn fused_matmul(
    a: &In<'_>,
    b: &In<'_>,
    bias: &In<'_>,
    activation: FusedActivation,
) -> Result<crate::buffer::WgpuBuffer> {
    let gpu = a.gpu();
    if !Arc::ptr_eq(gpu, b.gpu()) || !Arc::ptr_eq(gpu, bias.gpu()) {
        return Err(backend_error(
            "fused_matmul: operands live on different GPUs",
        ));
    }
    if [a.elem(), b.elem(), bias.elem()] != [Elem::F32; 3] {
        return Err(crate::elem::unsupported_on(
            gpu,
            "fused_matmul",
            a.elem().dtype(),
        ));
    }
    let Some(plan) = plan_matmul(a, b)? else {
        return output(gpu, Elem::F32, 0);
    };
    let (batch, m, n, _) = plan.dims;
    let splits = k_splits(plan.tile, Elem::F32, plan.dims);
    let dense_bias = bias.op.layout.contiguous_range().map(|(offset, _)| offset);
    let (Some(offset), 1) = (dense_bias, splits) else {
        let y = launch_plan(a, b, plan)?;
        let sa = a.op.shape();
        let mut shape = sa[..sa.len() - 2].to_vec();
        shape.extend([m, n]);
        let layout = Layout::contiguous(&shape);
        let y_op = Operand {
            buffer: &y,
            layout: &layout,
            dtype: DType::F32,
        };
        let bias_layout = bias.op.layout.broadcast_to("fused_matmul", &shape)?;
        let bias_op = Operand {
            layout: &bias_layout,
            ..bias.op
        };
        let sum = super::elementwise::binary(BinaryOp::Add, &In::new(y_op)?, &In::new(bias_op)?)?;
        return match activation {
            FusedActivation::Linear => Ok(sum),
            FusedActivation::Relu => {
                let sum_op = Operand {
                    buffer: &sum,
                    layout: &layout,
                    dtype: DType::F32,
                };
                super::elementwise::unary(UnaryOp::Relu, &In::new(sum_op)?)
            }
        };
    };
    let t = plan.tile;
    let groups = [
        n.div_ceil(t.bn as usize) as u32,
        m.div_ceil(t.bm as usize) as u32,
        batch as u32,
    ];
    if groups.iter().any(|&g| g > 65535) {
        return Err(backend_error(
            "fused_matmul: the problem exceeds one dispatch's workgroups",
        ));
    }
    let key = format!("fused_matmul_{activation:?}_{t:?}_{:?}", plan.reads);
    let kern = gpu.kernel_trusted(&key, 3, 1, || {
        gemm_epilogue_source(t, plan.reads, &plan.loaders, activation)
    })?;
    let out = output(gpu, Elem::F32, batch * m * n)?;
    let p = plan.params.set(12, 0).set(13, offset as u32);
    gpu.dispatch(
        &kern,
        &p.0,
        &[a.buf.raw(), b.buf.raw(), bias.buf.raw()],
        &[out.raw()],
        groups,
    )?;
    Ok(out)
}

/// The most rows [`fused_matmul_reduce`] walks in one workgroup (a taller product runs the
/// GEMM, then the fused reduction: a workgroup per column tile would leave the GPU idle).
const COLUMN_SUMS_MAX_ROWS: usize = 4096;
/// The parameter slots of the program's other inputs' descriptors in the column-sum GEMM
/// (`program_body` numbers them from slot 13 + 1: slots 14 and 15, after the GEMM's own).
const COLUMN_SUMS_FIRST_SLOT: usize = 13;
/// The program's other inputs the column-sum GEMM can address (slots 14 and 15).
const COLUMN_SUMS_MAX_INPUTS: usize = 16 - COLUMN_SUMS_FIRST_SLOT - 1;

/// The float32 GEMM whose outputs pass through `program` (the product its register 0, its
/// other inputs `X1..` read through descriptors from slot 14), writing the program's other
/// outputs and summing its first down the columns into `Y` ([`Epilogue::ColumnSums`]).
pub(crate) fn gemm_column_sums_source(
    t: Tile,
    reads: Reads,
    loaders: &str,
    program: &ElementwiseProgram,
) -> Option<String> {
    let (functions, loads) = super::fused::program_body(program, COLUMN_SUMS_FIRST_SLOT, 1)?;
    let mut body = format!("    let r0 = product;\n{loads}");
    for (k, r) in program.outputs.iter().enumerate().skip(1) {
        body += &format!("    O{k}[i] = r{r};\n");
    }
    let (ta, tb) = operand_declarations(reads);
    let n_in = program.num_inputs;
    let mut decl = fill(
        &format!(
            "@group(0) @binding(1) var<storage, read> {ta};
@group(0) @binding(2) var<storage, read> {tb};
"
        ),
        &[("A", "f32"), ("B", "f32")],
    );
    for k in 1..n_in {
        decl += &format!(
            "@group(0) @binding({}) var<storage, read> X{k}: array<f32>;\n",
            2 + k
        );
    }
    decl += &super::fused::reduction_output_bindings(2 + n_in, program.outputs.len());
    let value = format!(
        "fn program_value(i: u32, product: f32) -> f32 {{\n{body}    return r{};\n}}\n",
        program.outputs[0]
    );
    let gemm = gemm_source(t, "f32", true, reads, Epilogue::ColumnSums);
    Some(kernel_source(
        false,
        &format!("{decl}{functions}{value}{loaders}{gemm}"),
    ))
}

/// `Σ_rows program(a @ b, inputs..)[0]` and the program's other outputs for float32
/// operands of rank 2 (`Backend::fused_matmul_reduce`): one kernel, a workgroup per column
/// tile walking every row tile, the program run on each output as it leaves the
/// accumulators; `None` where that kernel does not apply (too many rows or program
/// inputs for its bindings and parameter slots; the backend then runs the GEMM and the
/// fused reduction).
pub(crate) fn fused_matmul_reduce(
    a: &In<'_>,
    b: &In<'_>,
    program: &ElementwiseProgram,
    inputs: &[In<'_>],
) -> Result<Option<Vec<crate::buffer::WgpuBuffer>>> {
    let gpu = a.gpu();
    let same_gpu = std::iter::once(b)
        .chain(inputs)
        .all(|x| Arc::ptr_eq(gpu, x.gpu()));
    let all_f32 = std::iter::once(a)
        .chain(std::iter::once(b))
        .chain(inputs)
        .all(|x| x.elem() == Elem::F32);
    if !same_gpu || !all_f32 || a.op.layout.rank() != 2 || b.op.layout.rank() != 2 {
        return Ok(None);
    }
    let Some(plan) = plan_matmul(a, b)? else {
        return Ok(None);
    };
    let (batch, m, n, _) = plan.dims;
    let bindings = 2 + program.num_inputs + program.outputs.len();
    if batch != 1
        || m > COLUMN_SUMS_MAX_ROWS
        || inputs.len() > COLUMN_SUMS_MAX_INPUTS
        || program.num_inputs != 1 + inputs.len()
        || bindings > gpu.max_storage_buffers
    {
        return Ok(None);
    }
    // The program's other inputs broadcast to the product's shape.
    let mut layouts = Vec::with_capacity(inputs.len());
    for x in inputs {
        layouts.push(x.op.layout.broadcast_to("fused_matmul_reduce", &[m, n])?);
    }
    let t = SMALL;
    let key = format!("fused_matmul_reduce_{t:?}_{:?}_{program:?}", plan.reads);
    // Generated on the first call only (a program with no float32 expression, which
    // `ElementwiseProgram::check` refuses before it gets here, would not compile).
    let kern = gpu.kernel_trusted(&key, 2 + inputs.len(), program.outputs.len(), || {
        gemm_column_sums_source(t, plan.reads, &plan.loaders, program).unwrap_or_default()
    })?;
    let groups = [n.div_ceil(t.bn as usize) as u32, 1, 1];
    if groups[0] > 65535 {
        return Ok(None);
    }
    let sums = output(gpu, Elem::F32, n)?;
    let extras = (1..program.outputs.len())
        .map(|_| output(gpu, Elem::F32, m * n))
        .collect::<Result<Vec<_>>>()?;
    let mut p = plan.params.set(12, 0);
    for (k, l) in layouts.iter().enumerate() {
        p = p.table(
            COLUMN_SUMS_FIRST_SLOT + 1 + k,
            &crate::elem::layout_descriptor(l),
        );
    }
    let ins: Vec<&wgpu::Buffer> = [a, b]
        .into_iter()
        .chain(inputs)
        .map(|x| x.buf.raw())
        .collect();
    let outs: Vec<&wgpu::Buffer> = std::iter::once(&sums)
        .chain(&extras)
        .map(|o| o.raw())
        .collect();
    gpu.dispatch(&kern, &p.0, &ins, &outs, groups)?;
    Ok(Some(std::iter::once(sums).chain(extras).collect()))
}

/// How many slabs to split K into: problems with few output tiles and a long K (the filter
/// gradient of a convolution: KH·KW·Cin × Cout outputs, N·OH·OW deep) would otherwise run on
/// a handful of workgroups.
fn k_splits(t: Tile, e: Elem, (batch, m, n, k): (usize, usize, usize, usize)) -> usize {
    let tiles = m.div_ceil(t.bm as usize) * n.div_ceil(t.bn as usize);
    if batch != 1 || !e.is_float() || tiles >= 128 || k < 1024 {
        return 1;
    }
    (256 / tiles).clamp(1, 64).min(k / 256).max(1)
}

/// Dispatches a GEMM over `batch` `m×n` outputs, K deep: split into K slabs (partial sums in
/// float32, then summed by the reduction kernel) when the output alone cannot fill the GPU.
fn launch(
    gpu: &Arc<Gpu>,
    key: &str,
    (t, e, reads): (Tile, Elem, Reads),
    loaders: &str,
    p: Params,
    (a, b): (&wgpu::Buffer, &wgpu::Buffer),
    (batch, m, n, k): (usize, usize, usize, usize),
) -> Result<crate::buffer::WgpuBuffer> {
    let mut splits = k_splits(t, e, (batch, m, n, k));
    let chunk = if splits > 1 {
        k.div_ceil(splits).next_multiple_of(t.bk as usize)
    } else {
        0
    };
    if splits > 1 {
        splits = k.div_ceil(chunk);
    }
    let groups = [
        n.div_ceil(t.bn as usize) as u32,
        m.div_ceil(t.bm as usize) as u32,
        (batch * splits) as u32,
    ];
    if groups.iter().any(|&g| g > 65535) {
        return Err(backend_error(format!(
            "{key}: the problem exceeds one dispatch's workgroups"
        )));
    }
    let p = p.set(12, chunk as u32);
    if splits == 1 {
        let kern = gemm_kernel(gpu, key, t, e, e, e, reads, loaders)?;
        let out = output(gpu, e, batch * m * n)?;
        gpu.dispatch(&kern, &p.0, &[a, b], &[out.raw()], groups)?;
        return Ok(out);
    }
    let kern = gemm_kernel(gpu, key, t, e, e, Elem::F32, reads, loaders)?;
    let partial = output(gpu, Elem::F32, splits * m * n)?;
    gpu.dispatch(&kern, &p.0, &[a, b], &[partial.raw()], groups)?;
    let layout = Layout::contiguous(&[splits, m * n]);
    let op = Operand {
        buffer: &partial,
        layout: &layout,
        dtype: DType::F32,
    };
    let sum = super::reduce::reduce(ReduceOp::ReduceSum, &In::new(op)?, &[0])?;
    if e == Elem::F32 {
        return Ok(sum);
    }
    let layout = Layout::contiguous(&[m * n]);
    let op = Operand {
        buffer: &sum,
        layout: &layout,
        dtype: DType::F32,
    };
    super::elementwise::cast(&In::new(op)?, e.dtype())
}

/// The convolution GEMMs' batch bases (there is no batch: split K uses `wid.z`).
const CONV_BASES: &str = "fn a_base(b: u32) -> i32 { return 0; }
fn b_base(b: u32) -> i32 { return 0; }
";

/// A convolution GEMM's loaders: the window geometry, no batch bases, and `readers` (one
/// of `wgsl/conv2d*.wgsl`) over operands of storage type `e`.
pub(crate) fn conv_loaders(e: Elem, readers: &str) -> String {
    format!(
        "{GEO_LIB}{CONV_BASES}fn LOAD_A(v: {t}) -> f32 {{ return f32(v); }}
fn LOAD_B(v: {t}) -> f32 {{ return f32(v); }}
{readers}",
        t = e.store()
    )
}

#[allow(clippy::too_many_arguments)]
fn conv_gemm(
    key: &str,
    first: &In<'_>,
    second: &In<'_>,
    w: &Window2d,
    cout: usize,
    (m, n, k): (usize, usize, usize),
    readers: &str,
) -> Result<crate::buffer::WgpuBuffer> {
    let gpu = first.gpu();
    let e = first.elem();
    if !Arc::ptr_eq(gpu, second.gpu()) {
        return Err(backend_error(format!(
            "{key}: operands live on different GPUs"
        )));
    }
    float_operands(gpu, "conv2d", e)?;
    if m * n == 0 {
        return output(gpu, e, 0);
    }
    let t = pick_tile(m, n, 1);
    let loaders = conv_loaders(e, readers);
    let reads = Reads::Scalar {
        a_m_fast: false,
        b_k_fast: false,
    };
    let p = Params::new(0)
        .set(5, m as u32)
        .set(6, n as u32)
        .set(7, k as u32)
        .table(
            4,
            &super::pool::geo_table(w, Some(first), cout, Some(second)),
        );
    launch(
        gpu,
        key,
        (t, e, reads),
        &loaders,
        p,
        (first.buf.raw(), second.buf.raw()),
        (1, m, n, k),
    )
}

/// NHWC conv2d with an HWIO filter: `[N·OH·OW, KH·KW·Cin] × [KH·KW·Cin, Cout]`.
pub(crate) fn conv2d(x: &In<'_>, f: &In<'_>, w: &Window2d) -> Result<crate::buffer::WgpuBuffer> {
    let fs = f.op.shape();
    let cout = fs[3];
    let m = w.input[0] * w.output[0] * w.output[1];
    let k = w.kernel[0] * w.kernel[1] * w.input[3];
    // Readers: `LOAD_A`/`LOAD_B` convert a stored element to f32.
    let readers = include_str!("../wgsl/conv2d.wgsl");
    conv_gemm("conv2d", x, f, w, cout, (m, cout, k), readers)
}

/// Gradient w.r.t. the input: `[N·H·W, KH·KW·Cout] × [KH·KW·Cout, Cin]`, each row reading
/// the dy entries whose windows cover its pixel.
pub(crate) fn conv2d_backprop_input(
    f: &In<'_>,
    dy: &In<'_>,
    w: &Window2d,
) -> Result<crate::buffer::WgpuBuffer> {
    let cout = f.op.shape()[3];
    let m = w.input[0] * w.input[1] * w.input[2];
    let k = w.kernel[0] * w.kernel[1] * cout;
    let readers = include_str!("../wgsl/conv2d_backprop_input.wgsl");
    conv_gemm(
        "conv2d_backprop_input",
        dy,
        f,
        w,
        cout,
        (m, w.input[3], k),
        readers,
    )
}

/// Gradient w.r.t. the filter: `[KH·KW·Cin, N·OH·OW] × [N·OH·OW, Cout]`.
pub(crate) fn conv2d_backprop_filter(
    x: &In<'_>,
    dy: &In<'_>,
    fshape: [usize; 4],
    w: &Window2d,
) -> Result<crate::buffer::WgpuBuffer> {
    let cout = fshape[3];
    let m = fshape[0] * fshape[1] * fshape[2];
    let k = w.input[0] * w.output[0] * w.output[1];
    let readers = include_str!("../wgsl/conv2d_backprop_filter.wgsl");
    conv_gemm(
        "conv2d_backprop_filter",
        x,
        dy,
        w,
        cout,
        (m, cout, k),
        readers,
    )
}
