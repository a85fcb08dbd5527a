//! Register-tiled GEMM, and convolution as implicit GEMM through the same kernel.
//!
//! A workgroup of 256 threads computes a `BM × BN` output tile; each thread holds a
//! `TM × TN` block of accumulators in registers and the K loop stages `BK`-deep slices of
//! both operands in workgroup memory. The operands are read by two WGSL functions, so the
//! same tiling serves a strided, batched matmul (transposes are strides) and the three
//! convolution products, whose "matrices" are computed from NHWC tensors on the fly
//! (im2col without materialising it).

use crate::elem::{Elem, Params};
use crate::gpu::{backend_error, Gpu, Kernel};
use crate::ops::{output, In};
use crate::shaders::{fill, kernel_source};
use ferroflow_tensor::{Result, Window2d};
use std::sync::Arc;

#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
struct Tile {
    bm: u32,
    bn: u32,
    bk: u32,
    tm: u32,
    tn: u32,
}

const BIG: Tile = Tile {
    bm: 128,
    bn: 128,
    bk: 8,
    tm: 8,
    tn: 8,
};
const MID: Tile = Tile {
    bm: 64,
    bn: 64,
    bk: 16,
    tm: 4,
    tn: 4,
};
const SMALL: Tile = Tile {
    bm: 32,
    bn: 32,
    bk: 32,
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

const GEMM: &str = "
const BM: u32 = $BMu;
const BN: u32 = $BNu;
const BK: u32 = $BKu;
const TM: u32 = $TMu;
const TN: u32 = $TNu;
const RT: u32 = BM / TM;
const CT: u32 = BN / TN;
var<workgroup> As: array<$C, $ASZ>;
var<workgroup> Bs: array<$C, $BSZ>;
@compute @workgroup_size(256)
fn main(@builtin(workgroup_id) wid: vec3<u32>, @builtin(local_invocation_index) tid: u32) {
    setup();
    let M = P[5];
    let N = P[6];
    let K = P[7];
    let b = wid.z;
    let abase = a_base(b);
    let bbase = b_base(b);
    let row0 = wid.y * BM;
    let col0 = wid.x * BN;
    let tr = tid / CT;
    let tc = tid % CT;
    var acc: array<$C, $TMTN>;
    var av: array<$C, $TMu>;
    var bv: array<$C, $TNu>;
    for (var k0 = 0u; k0 < K; k0 = k0 + BK) {
        for (var e = tid; e < BM * BK; e = e + 256u) {
            $AIDX
            let gm = row0 + m;
            let gk = k0 + kk;
            var v = $C();
            if gm < M && gk < K { v = load_a(abase, gm, gk); }
            As[kk * BM + m] = v;
        }
        for (var e = tid; e < BK * BN; e = e + 256u) {
            $BIDX
            let gn = col0 + n;
            let gk = k0 + kk;
            var v = $C();
            if gn < N && gk < K { v = load_b(bbase, gk, gn); }
            Bs[kk * BN + n] = v;
        }
        workgroupBarrier();
        for (var kk = 0u; kk < BK; kk = kk + 1u) {
            for (var i = 0u; i < TM; i = i + 1u) { av[i] = As[kk * BM + tr + i * RT]; }
            for (var j = 0u; j < TN; j = j + 1u) { bv[j] = Bs[kk * BN + tc + j * CT]; }
            for (var i = 0u; i < TM; i = i + 1u) {
                for (var j = 0u; j < TN; j = j + 1u) {
                    acc[i * TN + j] = $FMA;
                }
            }
        }
        workgroupBarrier();
    }
    for (var i = 0u; i < TM; i = i + 1u) {
        let gm = row0 + tr + i * RT;
        if gm >= M { continue; }
        for (var j = 0u; j < TN; j = j + 1u) {
            let gn = col0 + tc + j * CT;
            if gn < N { Y[(b * M + gm) * N + gn] = $STORE; }
        }
    }
}
";

/// Builds (once) the GEMM kernel with the given operand readers.
#[allow(clippy::too_many_arguments)]
fn gemm_kernel(
    gpu: &Arc<Gpu>,
    key: &str,
    t: Tile,
    a: Elem,
    b: Elem,
    out: Elem,
    a_m_fast: bool,
    b_k_fast: bool,
    loaders: &str,
) -> Result<Arc<Kernel>> {
    let key = format!("{key}_{t:?}_{a:?}{b:?}{out:?}_{a_m_fast}{b_k_fast}");
    let f16 = [a, b, out].contains(&Elem::F16);
    let s = |v: u32| v.to_string();
    let body = fill(
        GEMM,
        &[
            ("BM", &s(t.bm)),
            ("BN", &s(t.bn)),
            ("BK", &s(t.bk)),
            ("TM", &s(t.tm)),
            ("TN", &s(t.tn)),
            ("ASZ", &s(t.bm * t.bk)),
            ("BSZ", &s(t.bn * t.bk)),
            ("TMTN", &s(t.tm * t.tn)),
            (
                "AIDX",
                if a_m_fast {
                    "let m = e % BM; let kk = e / BM;"
                } else {
                    "let m = e / BK; let kk = e % BK;"
                },
            ),
            (
                "BIDX",
                if b_k_fast {
                    "let kk = e % BK; let n = e / BK;"
                } else {
                    "let n = e % BN; let kk = e / BN;"
                },
            ),
            ("STORE", &out.store_expr("acc[i * TN + j]")),
            ("C", a.compute().unwrap_or("f32")),
            (
                "FMA",
                if a.is_float() {
                    "fma(av[i], bv[j], acc[i * TN + j])"
                } else {
                    "acc[i * TN + j] + av[i] * bv[j]"
                },
            ),
        ],
    );
    gpu.kernel(&key, 2, 1, || {
        kernel_source(
            f16,
            &format!(
                "@group(0) @binding(1) var<storage, read> A: array<{}>;
@group(0) @binding(2) var<storage, read> B: array<{}>;
@group(0) @binding(3) var<storage, read_write> Y: array<{}>;
{loaders}{body}",
                a.store(),
                b.store(),
                out.store()
            ),
        )
    })
}

fn float_operands(gpu: &Gpu, op: &'static str, e: Elem) -> Result<()> {
    if e.is_float() {
        Ok(())
    } else {
        Err(crate::elem::unsupported_on(gpu, op, e.dtype()))
    }
}

/// `[..batch, m, k] × [..batch, k, n]` with strided (and broadcast) operands.
pub(crate) fn matmul(a: &In<'_>, b: &In<'_>) -> Result<crate::buffer::WgpuBuffer> {
    let gpu = a.gpu();
    let e = a.elem();
    if !Arc::ptr_eq(gpu, b.gpu()) {
        return Err(backend_error("matmul: operands live on different GPUs"));
    }
    if !matches!(e, Elem::F32 | Elem::F16 | Elem::I32) {
        return Err(crate::elem::unsupported_on(gpu, "matmul", e.dtype()));
    }
    let c = e.compute().unwrap_or("f32");
    let (sa, sb) = (a.op.shape(), b.op.shape());
    let r = sa.len();
    let (m, k, n) = (sa[r - 2], sa[r - 1], sb[r - 1]);
    let batch_dims = &sa[..r - 2];
    let batch: usize = batch_dims.iter().product();
    let out = output(gpu, e, batch * m * n)?;
    if batch * m * n == 0 {
        return Ok(out);
    }
    if batch > 65535 {
        return Err(backend_error(format!(
            "matmul: {batch} batch matrices exceed one dispatch (65535)"
        )));
    }
    let (ast, bst) = (a.op.layout.strides(), b.op.layout.strides());
    let (sam, sak, sbk, sbn) = (ast[r - 2], ast[r - 1], bst[r - 2], bst[r - 1]);
    let t = pick_tile(m, n, batch);
    let loaders = format!(
        "fn setup() {{}}
fn a_base(b: u32) -> i32 {{ return bitcast<i32>(at(P[1], b)); }}
fn b_base(b: u32) -> i32 {{ return bitcast<i32>(at(P[2], b)); }}
fn load_a(base: i32, m: u32, k: u32) -> {c} {{
    return {};
}}
fn load_b(base: i32, k: u32, n: u32) -> {c} {{
    return {};
}}
",
        e.load("A[u32(base + i32(m) * bitcast<i32>(P[8]) + i32(k) * bitcast<i32>(P[9]))]"),
        e.load("B[u32(base + i32(k) * bitcast<i32>(P[10]) + i32(n) * bitcast<i32>(P[11]))]"),
    );
    let a_m_fast = sam == 1 && sak != 1;
    let b_k_fast = sbk == 1 && sbn != 1;
    let kern = gemm_kernel(gpu, "matmul", t, e, e, e, a_m_fast, b_k_fast, &loaders)?;
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
    let groups = [
        n.div_ceil(t.bn as usize) as u32,
        m.div_ceil(t.bm as usize) as u32,
        batch as u32,
    ];
    if groups[1] > 65535 || groups[0] > 65535 {
        return Err(backend_error(
            "matmul: the matrices exceed one dispatch's workgroups",
        ));
    }
    gpu.dispatch(
        &kern,
        &p.0,
        &[a.buf.raw(), b.buf.raw()],
        &[out.raw()],
        groups,
    )?;
    Ok(out)
}

/// Geometry shared by the convolution readers, loaded once per workgroup.
const CONV_LIB: &str = "
struct Geo { n: u32, h: u32, w: u32, c: u32, kh: u32, kw: u32, oh: u32, ow: u32,
             sh: u32, sw: u32, dh: u32, dw: u32, ph: u32, pw: u32, cout: u32 }
var<private> G: Geo;
fn setup() {
    let t = P[4];
    G = Geo(P[t], P[t + 1u], P[t + 2u], P[t + 3u], P[t + 4u], P[t + 5u], P[t + 6u], P[t + 7u],
            P[t + 8u], P[t + 9u], P[t + 10u], P[t + 11u], P[t + 12u], P[t + 13u], P[t + 19u]);
}
fn a_base(b: u32) -> i32 { return 0; }
fn b_base(b: u32) -> i32 { return 0; }
// Offsets of a 4-D element of the first (table 14..19) and second (20..25) operand.
fn a_at(i0: u32, i1: u32, i2: u32, i3: u32) -> u32 {
    let t = P[4] + 14u;
    return u32(bitcast<i32>(P[t]) + i32(i0) * bitcast<i32>(P[t + 1u]) + i32(i1) * bitcast<i32>(P[t + 2u])
        + i32(i2) * bitcast<i32>(P[t + 3u]) + i32(i3) * bitcast<i32>(P[t + 4u]));
}
fn b_at(i0: u32, i1: u32, i2: u32, i3: u32) -> u32 {
    let t = P[4] + 20u;
    return u32(bitcast<i32>(P[t]) + i32(i0) * bitcast<i32>(P[t + 1u]) + i32(i1) * bitcast<i32>(P[t + 2u])
        + i32(i2) * bitcast<i32>(P[t + 3u]) + i32(i3) * bitcast<i32>(P[t + 4u]));
}
fn in_row(o: u32, k: u32) -> i32 {
    let r = i32(o * G.sh + k * G.dh) - i32(G.ph);
    return select(-1, r, r >= 0 && r < i32(G.h));
}
fn in_col(o: u32, k: u32) -> i32 {
    let r = i32(o * G.sw + k * G.dw) - i32(G.pw);
    return select(-1, r, r >= 0 && r < i32(G.w));
}
fn out_row(h: u32, k: u32) -> i32 {
    let t = i32(h + G.ph) - i32(k * G.dh);
    if t < 0 || t % i32(G.sh) != 0 { return -1; }
    let o = t / i32(G.sh);
    return select(-1, o, o < i32(G.oh));
}
fn out_col(w: u32, k: u32) -> i32 {
    let t = i32(w + G.pw) - i32(k * G.dw);
    if t < 0 || t % i32(G.sw) != 0 { return -1; }
    let o = t / i32(G.sw);
    return select(-1, o, o < i32(G.ow));
}
";

fn conv_table(w: &Window2d, cout: usize, first: &In<'_>, second: &In<'_>) -> Vec<u32> {
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
    t.push(first.op.layout.offset() as u32);
    t.extend(first.op.layout.strides().iter().map(|&s| s as i32 as u32));
    t.push(cout as u32);
    t.push(second.op.layout.offset() as u32);
    t.extend(second.op.layout.strides().iter().map(|&s| s as i32 as u32));
    t
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
    let out = output(gpu, e, m * n)?;
    if m * n == 0 {
        return Ok(out);
    }
    let t = pick_tile(m, n, 1);
    let loaders = format!(
        "{CONV_LIB}fn LOAD_A(v: {t}) -> f32 {{ return f32(v); }}
fn LOAD_B(v: {t}) -> f32 {{ return f32(v); }}
{readers}",
        t = e.store()
    );
    let kern = gemm_kernel(gpu, key, t, e, e, e, false, false, &loaders)?;
    let p = Params::new(0)
        .set(5, m as u32)
        .set(6, n as u32)
        .set(7, k as u32)
        .table(4, &conv_table(w, cout, first, second));
    let groups = [
        n.div_ceil(t.bn as usize) as u32,
        m.div_ceil(t.bm as usize) as u32,
        1,
    ];
    if groups[1] > 65535 || groups[0] > 65535 {
        return Err(backend_error(format!(
            "{key}: the problem exceeds one dispatch's workgroups"
        )));
    }
    gpu.dispatch(
        &kern,
        &p.0,
        &[first.buf.raw(), second.buf.raw()],
        &[out.raw()],
        groups,
    )?;
    Ok(out)
}

/// NHWC conv2d with an HWIO filter: `[N·OH·OW, KH·KW·Cin] × [KH·KW·Cin, Cout]`.
pub(crate) fn conv2d(x: &In<'_>, f: &In<'_>, w: &Window2d) -> Result<crate::buffer::WgpuBuffer> {
    let fs = f.op.shape();
    let cout = fs[3];
    let m = w.input[0] * w.output[0] * w.output[1];
    let k = w.kernel[0] * w.kernel[1] * w.input[3];
    // Readers: `$LA[..])` becomes `LOAD_A(A[..])`, the read converted to f32.
    let readers = "
fn load_a(base: i32, m: u32, k: u32) -> f32 {
    let ow = m % G.ow; let t = m / G.ow; let oh = t % G.oh; let n = t / G.oh;
    let ci = k % G.c; let t2 = k / G.c; let kw = t2 % G.kw; let kh = t2 / G.kw;
    let h = in_row(oh, kh);
    let w = in_col(ow, kw);
    if h < 0 || w < 0 { return 0.0; }
    return $LA[a_at(n, u32(h), u32(w), ci)]);
}
fn load_b(base: i32, k: u32, co: u32) -> f32 {
    let ci = k % G.c; let t2 = k / G.c; let kw = t2 % G.kw; let kh = t2 / G.kw;
    return $LB[b_at(kh, kw, ci, co)]);
}
";
    conv_gemm("conv2d", x, f, w, cout, (m, cout, k), &fix_readers(readers))
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
    let readers = "
fn load_a(base: i32, m: u32, k: u32) -> f32 {
    let w0 = m % G.w; let t = m / G.w; let h0 = t % G.h; let n = t / G.h;
    let co = k % G.cout; let t2 = k / G.cout; let kw = t2 % G.kw; let kh = t2 / G.kw;
    let oh = out_row(h0, kh);
    let ow = out_col(w0, kw);
    if oh < 0 || ow < 0 { return 0.0; }
    return $LA[a_at(n, u32(oh), u32(ow), co)]);
}
fn load_b(base: i32, k: u32, ci: u32) -> f32 {
    let co = k % G.cout; let t2 = k / G.cout; let kw = t2 % G.kw; let kh = t2 / G.kw;
    return $LB[b_at(kh, kw, ci, co)]);
}
";
    conv_gemm(
        "conv2d_backprop_input",
        dy,
        f,
        w,
        cout,
        (m, w.input[3], k),
        &fix_readers(readers),
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
    let readers = "
fn load_a(base: i32, m: u32, k: u32) -> f32 {
    let ci = m % G.c; let t = m / G.c; let kw = t % G.kw; let kh = t / G.kw;
    let ow = k % G.ow; let t2 = k / G.ow; let oh = t2 % G.oh; let n = t2 / G.oh;
    let h = in_row(oh, kh);
    let w = in_col(ow, kw);
    if h < 0 || w < 0 { return 0.0; }
    return $LA[a_at(n, u32(h), u32(w), ci)]);
}
fn load_b(base: i32, k: u32, co: u32) -> f32 {
    let ow = k % G.ow; let t2 = k / G.ow; let oh = t2 % G.oh; let n = t2 / G.oh;
    return $LB[b_at(n, oh, ow, co)]);
}
";
    conv_gemm(
        "conv2d_backprop_filter",
        x,
        dy,
        w,
        cout,
        (m, cout, k),
        &fix_readers(readers),
    )
}

/// `$LA[..])` → `f32(A[..])` (or `A[..]` for f32): the conversion wraps the read.
fn fix_readers(r: &str) -> String {
    r.replace("$LA[", "LOAD_A(A[").replace("$LB[", "LOAD_B(B[")
}
