//! The primitive ops as WGSL kernels: each function builds (once per dtype and variant) a
//! kernel source, fills a parameter block from the operand layouts and records a dispatch.
//! Inputs are read through their layouts (strided, broadcast, reversed, offset views need no
//! copy first); outputs are fresh dense buffers.

use crate::buffer::{gpu_buffer, WgpuBuffer};
use crate::elem::{check_len, descriptor, layout_descriptor, unsupported_on, Elem, Params};
use crate::gpu::{backend_error, groups_for, Gpu, WG};
use crate::shaders::{fill, kernel_source, GEO_LIB};
use ferroflow_tensor::{
    ArgReduceOp, BinaryOp, CumulativeOp, DType, Error, HostData, Operand, PoolKind, ReduceOp,
    Result, UnaryOp, UpdateRule, Window2d,
};
use std::sync::Arc;

/// An operand's buffer, device and storage type.
pub(crate) struct In<'a> {
    pub buf: &'a WgpuBuffer,
    pub op: Operand<'a>,
}

impl<'a> In<'a> {
    pub fn new(op: Operand<'a>) -> Result<In<'a>> {
        Ok(In {
            buf: gpu_buffer(&op)?,
            op,
        })
    }
    pub fn gpu(&self) -> &Arc<Gpu> {
        &self.buf.gpu
    }
    pub fn elem(&self) -> Elem {
        self.buf.elem
    }
    pub fn desc(&self) -> Vec<u32> {
        layout_descriptor(self.op.layout)
    }
    pub fn n(&self) -> usize {
        self.op.layout.num_elements()
    }
}

/// A fresh output buffer of `len` elements.
pub(crate) fn output(gpu: &Arc<Gpu>, elem: Elem, len: usize) -> Result<WgpuBuffer> {
    check_len("output", len)?;
    Ok(WgpuBuffer {
        gpu: gpu.clone(),
        buffer: Some(gpu.alloc((len * elem.bytes()) as u64)?),
        elem,
        len,
        shared: false,
    })
}

fn same_gpu(op: &'static str, a: &In<'_>, b: &In<'_>) -> Result<()> {
    if Arc::ptr_eq(a.gpu(), b.gpu()) {
        Ok(())
    } else {
        Err(backend_error(format!(
            "{op}: operands live on different GPUs; move one with `to_device`"
        )))
    }
}

const MAIN: &str = "@compute @workgroup_size(256)
fn main(@builtin(workgroup_id) wid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>,
        @builtin(local_invocation_id) lid: vec3<u32>) {
    let i = linear_id(wid, nwg, lid);
    if i >= P[0] { return; }
";

/// Declarations of inputs `A`, `B`, `C`.. (read) then outputs `Y`, `Z`.. (read-write), and
/// the error word `E` after them when `checked`.
fn bindings(inputs: &[&str], outputs: &[&str], checked: bool) -> String {
    let mut s = String::new();
    let names_in = ["A", "B", "C", "D"];
    let names_out = ["Y", "Z", "K", "I"];
    let mut b = 1;
    for (n, t) in names_in.iter().zip(inputs) {
        s += &format!("@group(0) @binding({b}) var<storage, read> {n}: array<{t}>;\n");
        b += 1;
    }
    for (n, t) in names_out.iter().zip(outputs) {
        s += &format!("@group(0) @binding({b}) var<storage, read_write> {n}: array<{t}>;\n");
        b += 1;
    }
    if checked {
        s += &format!("@group(0) @binding({b}) var<storage, read_write> E: array<atomic<u32>>;\n");
    }
    s
}

/// A one-thread-per-output-element kernel: `body` runs with `i` the output index.
#[allow(clippy::too_many_arguments)]
fn map_kernel(
    gpu: &Arc<Gpu>,
    key: &str,
    elems: &[Elem],
    inputs: &[&str],
    outputs: &[&str],
    checked: bool,
    body: &str,
) -> Result<Arc<crate::gpu::Kernel>> {
    let f16 = elems.contains(&Elem::F16);
    gpu.kernel(key, inputs.len(), outputs.len() + checked as usize, || {
        kernel_source(
            f16,
            &format!(
                "{}{}{}\n}}\n",
                bindings(inputs, outputs, checked),
                MAIN,
                body
            ),
        )
    })
}

/// Records a map kernel over `n` items. A `checked` kernel gets its own error word, which
/// is returned (read it with [`Gpu::data_error`]).
fn run_map(
    gpu: &Arc<Gpu>,
    kernel: &crate::gpu::Kernel,
    params: Params,
    inputs: &[&wgpu::Buffer],
    out: &[&wgpu::Buffer],
    checked: bool,
    n: usize,
) -> Result<Option<wgpu::Buffer>> {
    let mut outs: Vec<&wgpu::Buffer> = out.to_vec();
    let word = if checked {
        Some(gpu.error_word()?)
    } else {
        None
    };
    if let Some(w) = &word {
        outs.push(w);
    }
    gpu.dispatch(kernel, &params.0, inputs, &outs, groups_for(n, WG)?)?;
    Ok(word)
}

/// Runs a one-input map kernel (input read through its layout, descriptor 0) into `out`.
fn map_one(k: &crate::gpu::Kernel, x: &In<'_>, out: WgpuBuffer) -> Result<WgpuBuffer> {
    let n = out.len;
    run_map(
        x.gpu(),
        k,
        Params::new(n).desc(0, x.desc()),
        &[x.buf.raw()],
        &[out.raw()],
        false,
        n,
    )?;
    Ok(out)
}

// ---------------------------------------------------------------- movement

/// Dense copy of a view.
pub(crate) fn copy(x: &In<'_>) -> Result<WgpuBuffer> {
    let gpu = x.gpu();
    let e = x.elem();
    let n = x.n();
    let out = output(gpu, e, n)?;
    let k = map_kernel(
        gpu,
        &format!("copy_{}", e.mov()),
        &[e],
        &[e.mov()],
        &[e.mov()],
        false,
        "    Y[i] = A[at(P[1], i)];",
    )?;
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

/// `cond ? t : f`.
pub(crate) fn select(c: &In<'_>, t: &In<'_>, f: &In<'_>) -> Result<WgpuBuffer> {
    same_gpu("select", c, t)?;
    same_gpu("select", t, f)?;
    let gpu = t.gpu();
    let e = t.elem();
    let n = t.n();
    let out = output(gpu, e, n)?;
    let k = map_kernel(
        gpu,
        &format!("select_{}", e.mov()),
        &[e],
        &["u32", e.mov(), e.mov()],
        &[e.mov()],
        false,
        "    Y[i] = select(C[at(P[3], i)], B[at(P[2], i)], A[at(P[1], i)] != 0u);",
    )?;
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
    let k = map_kernel(
        gpu,
        &format!("concat_{}", e.mov()),
        &[e],
        &[e.mov()],
        &[e.mov()],
        false,
        "    let chunk = P[4];
    Y[(i / chunk) * P[5] + P[6] + i % chunk] = A[at(P[1], i)];",
    )?;
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
    let body = fill(
        "    let rank = P[7];
    let t = P[4];
    var rem = i;
    var off = bitcast<i32>(P[8]);
    var inside = true;
    var d = rank;
    while d > 0u {
        d = d - 1u;
        let c = rem % P[t + 4u * d];
        rem = rem / P[t + 4u * d];
        let xi = i32(c) - i32(P[t + 4u * d + 1u]);
        if xi < 0 || xi >= i32(P[t + 4u * d + 2u]) { inside = false; }
        off = off + xi * bitcast<i32>(P[t + 4u * d + 3u]);
    }
    if inside { Y[i] = A[u32(off)]; } else { Y[i] = $FILL; }",
        &[("FILL", fill_expr(e))],
    );
    let k = map_kernel(
        gpu,
        &format!("pad_{}", e.mov()),
        &[e],
        &[e.mov()],
        &[e.mov()],
        false,
        &body,
    )?;
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

// ---------------------------------------------------------------- elementwise

fn unary_expr(op: UnaryOp, e: Elem) -> Option<&'static str> {
    use UnaryOp::*;
    Some(match e {
        Elem::F32 | Elem::F16 => match op {
            Neg => "-x",
            Abs => "abs(x)",
            Sign => "f_sign(x)",
            Exp => "f_exp(x)",
            Expm1 => "f_expm1(x)",
            Log => "f_log(x)",
            Log1p => "f_log1p(x)",
            Sqrt => "f_sqrt(x)",
            Rsqrt => "f_rsqrt(x)",
            Square => "x * x",
            Reciprocal => "f_div(1.0, x)",
            Sin => "f_sin(x)",
            Cos => "f_cos(x)",
            Tan => "f_tan(x)",
            Asin => "f_asin(x)",
            Acos => "f_acos(x)",
            Atan => "f_atan(x)",
            Sinh => "f_sinh(x)",
            Cosh => "f_cosh(x)",
            Tanh => "f_tanh(x)",
            Sigmoid => "f_sigmoid(x)",
            Erf => "f_erf(x)",
            Floor => "floor(x)",
            Ceil => "ceil(x)",
            Round => "round(x)",
            Relu => "select(x, 0.0, x < 0.0)",
            IsFinite => "u32(is_finite(x))",
            IsNan => "u32(is_nan(x))",
            LogicalNot => return None,
        },
        Elem::I32 => match op {
            Neg => "-x",
            Abs => "i_abs(x)",
            Sign => "sign(x)",
            Square => "x * x",
            Relu => "max(x, 0)",
            _ => return None,
        },
        Elem::Bool => match op {
            LogicalNot => "u32(x == 0u)",
            _ => return None,
        },
        Elem::I64 => return None,
    })
}

pub(crate) fn unary(op: UnaryOp, x: &In<'_>) -> Result<WgpuBuffer> {
    let gpu = x.gpu();
    let e = x.elem();
    let expr = unary_expr(op, e).ok_or_else(|| unsupported_on(gpu, op.name(), e.dtype()))?;
    let oe = Elem::of(gpu, op.output_dtype(e.dtype()), op.name())?;
    let n = x.n();
    let out = output(gpu, oe, n)?;
    let body = format!(
        "    let x = {};\n    Y[i] = {};",
        e.load("A[at(P[1], i)]"),
        oe.store_expr(expr)
    );
    let k = map_kernel(
        gpu,
        &format!("unary_{}_{:?}", op.name(), e),
        &[e, oe],
        &[e.store()],
        &[oe.store()],
        false,
        &body,
    )?;
    map_one(&k, x, out)
}

/// (expression, needs a nonzero divisor check, needs a non-negative exponent check)
fn binary_expr(op: BinaryOp, e: Elem) -> Option<(&'static str, bool, bool)> {
    use BinaryOp::*;
    let plain = |s| Some((s, false, false));
    match e {
        Elem::F32 | Elem::F16 => match op {
            Add => plain("a + b"),
            Sub => plain("a - b"),
            Mul => plain("a * b"),
            Div => plain("f_div(a, b)"),
            FloorDiv => plain("f_floordiv(a, b)"),
            FloorMod => plain("f_floormod(a, b)"),
            Pow => plain("f_pow(a, b)"),
            Maximum => plain("f_max(a, b)"),
            Minimum => plain("f_min(a, b)"),
            SquaredDifference => plain("(a - b) * (a - b)"),
            Atan2 => plain("f_atan2(a, b)"),
            ReluGrad => plain("a * select(0.0, 1.0, f_lt(0.0, b))"),
            Equal => plain("u32(f_eq(a, b))"),
            NotEqual => plain("u32(!f_eq(a, b))"),
            Less => plain("u32(f_lt(a, b))"),
            LessEqual => plain("u32(f_le(a, b))"),
            Greater => plain("u32(f_lt(b, a))"),
            GreaterEqual => plain("u32(f_le(b, a))"),
            LogicalAnd | LogicalOr | LogicalXor => None,
        },
        Elem::I32 => match op {
            Add => plain("a + b"),
            Sub => plain("a - b"),
            Mul => plain("a * b"),
            Div => Some(("a / b", true, false)),
            FloorDiv => Some(("i_floordiv(a, b)", true, false)),
            FloorMod => Some(("i_floormod(a, b)", true, false)),
            Pow => Some(("i_pow(a, b)", false, true)),
            Maximum => plain("max(a, b)"),
            Minimum => plain("min(a, b)"),
            SquaredDifference => plain("(a - b) * (a - b)"),
            Equal => plain("u32(a == b)"),
            NotEqual => plain("u32(a != b)"),
            Less => plain("u32(a < b)"),
            LessEqual => plain("u32(a <= b)"),
            Greater => plain("u32(a > b)"),
            GreaterEqual => plain("u32(a >= b)"),
            Atan2 | ReluGrad | LogicalAnd | LogicalOr | LogicalXor => None,
        },
        Elem::Bool => match op {
            LogicalAnd => plain("a & b"),
            LogicalOr => plain("a | b"),
            LogicalXor => plain("a ^ b"),
            Equal => plain("u32(a == b)"),
            NotEqual => plain("u32(a != b)"),
            Less => plain("u32(a < b)"),
            LessEqual => plain("u32(a <= b)"),
            Greater => plain("u32(a > b)"),
            GreaterEqual => plain("u32(a >= b)"),
            Maximum => plain("max(a, b)"),
            Minimum => plain("min(a, b)"),
            _ => None,
        },
        Elem::I64 => match op {
            Equal => plain("u32(all(a == b))"),
            NotEqual => plain("u32(any(a != b))"),
            _ => None,
        },
    }
}

pub(crate) fn binary(op: BinaryOp, a: &In<'_>, b: &In<'_>) -> Result<WgpuBuffer> {
    same_gpu(op.name(), a, b)?;
    let gpu = a.gpu();
    let e = a.elem();
    let (expr, div_check, pow_check) =
        binary_expr(op, e).ok_or_else(|| unsupported_on(gpu, op.name(), e.dtype()))?;
    let oe = Elem::of(gpu, op.output_dtype(e.dtype()), op.name())?;
    let n = a.n();
    let out = output(gpu, oe, n)?;
    let checked = div_check || pow_check;
    let mut body = format!(
        "    let a = {};\n    let b = {};\n",
        e.load("A[at(P[1], i)]"),
        e.load("B[at(P[2], i)]")
    );
    if div_check {
        body += "    if b == 0 { atomicMax(&E[0], 1u); Y[i] = 0; return; }\n";
    }
    if pow_check {
        body += "    if b < 0 { atomicMax(&E[0], 3u); Y[i] = 0; return; }\n";
    }
    body += &format!("    Y[i] = {};", oe.store_expr(expr));
    let k = map_kernel(
        gpu,
        &format!("binary_{}_{:?}", op.name(), e),
        &[e, oe],
        &[e.store(), e.store()],
        &[oe.store()],
        checked,
        &body,
    )?;
    let p = Params::new(n).desc(0, a.desc()).desc(1, b.desc());
    let word = run_map(
        gpu,
        &k,
        p,
        &[a.buf.raw(), b.buf.raw()],
        &[out.raw()],
        checked,
        n,
    )?;
    if let Some(word) = word {
        match gpu.data_error(word)?[0] {
            0 => {}
            3 => {
                return Err(Error::Arithmetic {
                    op: "pow",
                    msg: "integers to negative integer powers are not allowed",
                })
            }
            _ => {
                return Err(Error::Arithmetic {
                    op: op.name(),
                    msg: "integer division by zero",
                })
            }
        }
    }
    Ok(out)
}

const CAST_LIB: &str = "
fn f_to_i32(x: f32) -> i32 {
    if is_nan(x) { return 0; }
    if x >= 2147483647.0 { return 2147483647; }
    if x <= -2147483648.0 { return -2147483647 - 1; }
    return i32(x);
}
fn f_to_i64(x: f32) -> vec2<u32> {
    if is_nan(x) { return vec2<u32>(0u, 0u); }
    if x >= 9.223372e18 { return vec2<u32>(0xffffffffu, 0x7fffffffu); }
    if x <= -9.223372e18 { return vec2<u32>(0u, 0x80000000u); }
    let t = trunc(abs(x));
    let hi = floor(t / 4294967296.0);
    let lo = t - hi * 4294967296.0;
    var v = vec2<u32>(u32(lo), u32(hi));
    if x < 0.0 && t != 0.0 {
        let nlo = ~v.x + 1u;
        v = vec2<u32>(nlo, ~v.y + select(0u, 1u, nlo == 0u));
    }
    return v;
}
fn i64_to_f32(v: vec2<u32>) -> f32 {
    // Values that fit in 32 bits convert exactly; others through their magnitude.
    let lo = bitcast<i32>(v.x);
    if (v.y == 0u && lo >= 0) || (v.y == 0xffffffffu && lo < 0) { return f32(lo); }
    var m = v;
    let neg = (v.y & 0x80000000u) != 0u;
    if neg {
        let nlo = ~v.x + 1u;
        m = vec2<u32>(nlo, ~v.y + select(0u, 1u, nlo == 0u));
    }
    let r = f32(m.y) * 4294967296.0 + f32(m.x);
    return select(r, -r, neg);
}
";

pub(crate) fn cast(x: &In<'_>, to: DType) -> Result<WgpuBuffer> {
    let gpu = x.gpu();
    let from = x.elem();
    let to = Elem::of(gpu, to, "cast")?;
    use Elem::*;
    let expr = match (from, to) {
        (a, b) if a == b => "v".to_string(),
        (F32 | F16, F32 | F16) => to.store_expr(&from.load("v")),
        (F32 | F16, I32) => format!("f_to_i32({})", from.load("v")),
        (F32 | F16, Bool) => format!("u32(is_nan({0}) || {0} != 0.0)", from.load("v")),
        (F32 | F16, I64) => format!("f_to_i64({})", from.load("v")),
        (I32, F32 | F16) => to.store_expr("f32(v)"),
        (I32, Bool) => "u32(v != 0)".into(),
        (I32, I64) => "vec2<u32>(bitcast<u32>(v), select(0u, 0xffffffffu, v < 0))".into(),
        (Bool, F32 | F16) => to.store_expr("f32(v)"),
        (Bool, I32) => "i32(v)".into(),
        (Bool, I64) => "vec2<u32>(v, 0u)".into(),
        (I64, I32) => "bitcast<i32>(v.x)".into(),
        (I64, Bool) => "u32(v.x != 0u || v.y != 0u)".into(),
        (I64, F32 | F16) => to.store_expr("i64_to_f32(v)"),
        _ => return Err(unsupported_on(gpu, "cast", to.dtype())),
    };
    let n = x.n();
    let out = output(gpu, to, n)?;
    let body = format!("    let v = A[at(P[1], i)];\n    Y[i] = {expr};");
    let k = gpu.kernel(&format!("cast_{from:?}_{to:?}"), 1, 1, || {
        kernel_source(
            from == F16 || to == F16,
            &format!(
                "{CAST_LIB}{}{MAIN}{body}\n}}\n",
                bindings(&[from.store()], &[to.store()], false)
            ),
        )
    })?;
    map_one(&k, x, out)
}

// ---------------------------------------------------------------- reductions

fn reduce_parts(op_name: &str, e: Elem, op: ReduceOp) -> Result<(&'static str, &'static str)> {
    use ReduceOp::*;
    let r = match (e, op) {
        (Elem::F32 | Elem::F16, ReduceSum) => ("0.0", "a + b"),
        (Elem::F32 | Elem::F16, ReduceProd) => ("1.0", "a * b"),
        (Elem::F32 | Elem::F16, ReduceMax) => (
            "-f_inf()",
            "select(select(max(a, b), b, is_nan(b)), a, is_nan(a))",
        ),
        (Elem::F32 | Elem::F16, ReduceMin) => (
            "f_inf()",
            "select(select(min(a, b), b, is_nan(b)), a, is_nan(a))",
        ),
        (Elem::I32, ReduceSum) => ("0", "a + b"),
        (Elem::I32, ReduceProd) => ("1", "a * b"),
        (Elem::I32, ReduceMax) => ("(-2147483647 - 1)", "max(a, b)"),
        (Elem::I32, ReduceMin) => ("2147483647", "min(a, b)"),
        (Elem::Bool, ReduceAny | ReduceMax) => ("0u", "a | b"),
        (Elem::Bool, ReduceAll | ReduceMin) => ("1u", "a & b"),
        _ => {
            return Err(backend_error(format!(
                "{op_name}: no wgpu reduction for {}",
                e.dtype()
            )))
        }
    };
    Ok(r)
}

/// Reduces over `axes`: one workgroup per output element (tree reduction in workgroup
/// memory); long reductions with few outputs are split into partial sums and reduced again.
pub(crate) fn reduce(op: ReduceOp, x: &In<'_>, axes: &[usize]) -> Result<WgpuBuffer> {
    let gpu = x.gpu();
    let e = x.elem();
    if e == Elem::I64 {
        return Err(unsupported_on(gpu, op.name(), e.dtype()));
    }
    let (init, combine) =
        reduce_parts(op.name(), e, op).map_err(|_| unsupported_on(gpu, op.name(), e.dtype()))?;
    let shape = x.op.shape();
    let strides = x.op.layout.strides();
    let keep: Vec<usize> = (0..shape.len()).filter(|a| !axes.contains(a)).collect();
    let out_dims: Vec<usize> = keep.iter().map(|&a| shape[a]).collect();
    let out_strides: Vec<isize> = keep.iter().map(|&a| strides[a]).collect();
    let red_dims: Vec<usize> = axes.iter().map(|&a| shape[a]).collect();
    let red_strides: Vec<isize> = axes.iter().map(|&a| strides[a]).collect();
    let n_out: usize = out_dims.iter().product();
    let n_red: usize = red_dims.iter().product();
    let c = e.compute().expect("compute type");
    let parts = if n_out < 256 && n_red >= 16384 {
        (n_red / 4096).clamp(2, 1024)
    } else {
        1
    };
    let per = n_red.div_ceil(parts).max(1);
    let partial_elem = match e {
        Elem::F16 => Elem::F32,
        other => other,
    };
    let kern = |in_e: Elem, out_e: Elem| {
        let body = fill(
            "var<workgroup> sh: array<$C, 256>;
@compute @workgroup_size(256)
fn main(@builtin(workgroup_id) wid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>,
        @builtin(local_invocation_id) lid: vec3<u32>) {
    let o = wid.y * nwg.x + wid.x;
    let parts = P[5];
    let row = o / parts;
    let part = o % parts;
    let start = part * P[6];
    let end = min(start + P[6], P[4]);
    let base = at(P[1], row);
    var acc: $C = $INIT;
    if o < P[0] {
        for (var r = start + lid.x; r < end; r = r + WG) {
            let b = $LOAD;
            let a = acc;
            acc = $COMBINE;
        }
    }
    sh[lid.x] = acc;
    workgroupBarrier();
    for (var s = WG / 2u; s > 0u; s = s >> 1u) {
        if lid.x < s {
            let a = sh[lid.x];
            let b = sh[lid.x + s];
            sh[lid.x] = $COMBINE;
        }
        workgroupBarrier();
    }
    if lid.x == 0u && o < P[0] { Y[o] = $STORE; }
}
",
            &[
                ("C", c),
                ("INIT", init),
                ("COMBINE", combine),
                ("LOAD", &in_e.load("A[base + at(P[2], r)]")),
                ("STORE", &out_e.store_expr("sh[0]")),
            ],
        );
        gpu.kernel(
            &format!("reduce_{}_{in_e:?}_{out_e:?}", op.name()),
            1,
            1,
            || {
                kernel_source(
                    in_e == Elem::F16 || out_e == Elem::F16,
                    &format!(
                        "{}{body}",
                        bindings(&[in_e.store()], &[out_e.store()], false)
                    ),
                )
            },
        )
    };
    let out = output(gpu, e, n_out)?;
    if n_out == 0 {
        return Ok(out);
    }
    let offset = x.op.layout.offset();
    if parts == 1 {
        let k = kern(e, e)?;
        let p = Params::new(n_out)
            .set(4, n_red as u32)
            .set(5, 1)
            .set(6, per as u32)
            .desc(0, descriptor(&out_dims, &out_strides, offset))
            .desc(1, descriptor(&red_dims, &red_strides, 0));
        gpu.dispatch(
            &k,
            &p.0,
            &[x.buf.raw()],
            &[out.raw()],
            groups_for(n_out, 1)?,
        )?;
        return Ok(out);
    }
    let partial = output(gpu, partial_elem, n_out * parts)?;
    let k1 = kern(e, partial_elem)?;
    let p = Params::new(n_out * parts)
        .set(4, n_red as u32)
        .set(5, parts as u32)
        .set(6, per as u32)
        .desc(0, descriptor(&out_dims, &out_strides, offset))
        .desc(1, descriptor(&red_dims, &red_strides, 0));
    gpu.dispatch(
        &k1,
        &p.0,
        &[x.buf.raw()],
        &[partial.raw()],
        groups_for(n_out * parts, 1)?,
    )?;
    let k2 = kern(partial_elem, e)?;
    let p = Params::new(n_out)
        .set(4, parts as u32)
        .set(5, 1)
        .set(6, parts as u32)
        .desc(0, descriptor(&[n_out], &[parts as isize], 0))
        .desc(1, descriptor(&[parts], &[1], 0));
    gpu.dispatch(
        &k2,
        &p.0,
        &[partial.raw()],
        &[out.raw()],
        groups_for(n_out, 1)?,
    )?;
    Ok(out)
}

/// argmax/argmin along `axis` (int64 output, first index on ties, a NaN wins outright).
pub(crate) fn arg_reduce(op: ArgReduceOp, x: &In<'_>, axis: usize) -> Result<WgpuBuffer> {
    let gpu = x.gpu();
    let e = x.elem();
    if !matches!(e, Elem::F32 | Elem::F16 | Elem::I32) {
        return Err(unsupported_on(gpu, op.name(), e.dtype()));
    }
    let c = e.compute().expect("compute type");
    let (better, nan) = match (op, e.is_float()) {
        (ArgReduceOp::ArgMax, true) => ("f_lt(vb, va)", "is_nan"),
        (ArgReduceOp::ArgMin, true) => ("f_lt(va, vb)", "is_nan"),
        (ArgReduceOp::ArgMax, false) => ("va > vb", "no_nan"),
        (ArgReduceOp::ArgMin, false) => ("va < vb", "no_nan"),
    };
    let body = fill(
        "var<workgroup> sv: array<$C, 256>;
var<workgroup> si: array<u32, 256>;
fn no_nan(v: i32) -> bool { return false; }
// Does (va, ia) beat (vb, ib)? A NaN wins, then the better value, then the lower index.
fn wins(va: $C, ia: u32, vb: $C, ib: u32) -> bool {
    if ib == 0xffffffffu { return true; }
    if ia == 0xffffffffu { return false; }
    let na = $NAN(va);
    let nb = $NAN(vb);
    if na && nb { return ia < ib; }
    if na { return true; }
    if nb { return false; }
    if va == vb { return ia < ib; }
    return $BETTER;
}
@compute @workgroup_size(256)
fn main(@builtin(workgroup_id) wid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>,
        @builtin(local_invocation_id) lid: vec3<u32>) {
    let o = wid.y * nwg.x + wid.x;
    let base = at(P[1], o);
    var bv: $C = $C();
    var bi = 0xffffffffu;
    if o < P[0] {
        for (var r = lid.x; r < P[4]; r = r + WG) {
            let v = $LOAD;
            if wins(v, r, bv, bi) { bv = v; bi = r; }
        }
    }
    sv[lid.x] = bv;
    si[lid.x] = bi;
    workgroupBarrier();
    for (var s = WG / 2u; s > 0u; s = s >> 1u) {
        if lid.x < s && wins(sv[lid.x + s], si[lid.x + s], sv[lid.x], si[lid.x]) {
            sv[lid.x] = sv[lid.x + s];
            si[lid.x] = si[lid.x + s];
        }
        workgroupBarrier();
    }
    if lid.x == 0u && o < P[0] { Y[o] = vec2<u32>(si[0], 0u); }
}
",
        &[
            ("C", c),
            ("BETTER", better),
            ("NAN", nan),
            ("LOAD", &e.load("A[base + at(P[2], r)]")),
        ],
    );
    let k = gpu.kernel(&format!("{}_{e:?}", op.name()), 1, 1, || {
        kernel_source(
            e == Elem::F16,
            &format!("{}{body}", bindings(&[e.store()], &["vec2<u32>"], false)),
        )
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
    let c = match e {
        Elem::F32 | Elem::F16 | Elem::I32 => e.compute().expect("compute type"),
        _ => return Err(unsupported_on(gpu, op.name(), e.dtype())),
    };
    let (init, comb) = match (op, e.is_float()) {
        (CumulativeOp::Cumsum, true) => ("0.0", "acc + v"),
        (CumulativeOp::Cumprod, true) => ("1.0", "acc * v"),
        (CumulativeOp::Cumsum, false) => ("0", "acc + v"),
        (CumulativeOp::Cumprod, false) => ("1", "acc * v"),
    };
    let body = fill(
        "    let len = P[4];
    let inner = P[5];
    let first = (i / inner) * len * inner + i % inner;
    var acc: $C = $INIT;
    for (var s = 0u; s < len; s = s + 1u) {
        let k = select(s, len - 1u - s, P[7] != 0u);
        let lin = first + k * inner;
        let v = $LOAD;
        if P[6] != 0u {
            Y[lin] = $STORE;
            acc = $COMB;
        } else {
            acc = $COMB;
            Y[lin] = $STORE;
        }
    }",
        &[
            ("C", c),
            ("INIT", init),
            ("COMB", comb),
            ("LOAD", &e.load("A[at(P[1], lin)]")),
            ("STORE", &e.store_expr("acc")),
        ],
    );
    let k = map_kernel(
        gpu,
        &format!("{}_{e:?}", op.name()),
        &[e],
        &[e.store()],
        &[e.store()],
        false,
        &body,
    )?;
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

/// Stable sort of every line along `axis`: one thread per line, bottom-up merge sort in a
/// scratch buffer. (Values, int32 indices.)
pub(crate) fn sort(x: &In<'_>, axis: usize, descending: bool) -> Result<(WgpuBuffer, WgpuBuffer)> {
    let gpu = x.gpu();
    let e = x.elem();
    let c = match e {
        Elem::F32 | Elem::F16 | Elem::I32 => e.compute().expect("compute type"),
        _ => return Err(unsupported_on(gpu, "sort", e.dtype())),
    };
    let before = match (descending, e.is_float()) {
        (false, true) => "(!is_nan(a) && is_nan(b)) || f_lt(a, b)",
        (true, true) => "(is_nan(a) && !is_nan(b)) || f_lt(b, a)",
        (false, false) => "a < b",
        (true, false) => "a > b",
    };
    let body = fill(
        "    let len = P[4];
    let inner = P[5];
    let total = P[0] * len;
    let first = (i / inner) * len * inner + i % inner;
    let base = i * len;
    for (var k = 0u; k < len; k = k + 1u) {
        K[base + k] = $LOAD;
        I[base + k] = k;
    }
    var src = 0u;
    for (var w = 1u; w < len; w = w * 2u) {
        let dst = total - src;
        for (var lo = 0u; lo < len; lo = lo + 2u * w) {
            let mid = min(lo + w, len);
            let hi = min(lo + 2u * w, len);
            var p = lo;
            var q = mid;
            for (var o = lo; o < hi; o = o + 1u) {
                var take_right = false;
                if p >= mid {
                    take_right = true;
                } else if q < hi {
                    let b = K[src + base + p];
                    let a = K[src + base + q];
                    take_right = $BEFORE;
                }
                if take_right {
                    K[dst + base + o] = K[src + base + q];
                    I[dst + base + o] = I[src + base + q];
                    q = q + 1u;
                } else {
                    K[dst + base + o] = K[src + base + p];
                    I[dst + base + o] = I[src + base + p];
                    p = p + 1u;
                }
            }
        }
        src = dst;
    }
    for (var k = 0u; k < len; k = k + 1u) {
        let v = K[src + base + k];
        Y[first + k * inner] = $STORE;
        Z[first + k * inner] = i32(I[src + base + k]);
    }",
        &[
            ("LOAD", &e.load("A[at(P[1], first + k * inner)]")),
            ("BEFORE", before),
            ("STORE", &e.store_expr("v")),
        ],
    );
    let k = map_kernel(
        gpu,
        &format!("sort_{e:?}_{descending}"),
        &[e],
        &[e.store()],
        &[e.store(), "i32", c, "u32"],
        false,
        &body,
    )?;
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

// ---------------------------------------------------------------- indexing

fn index_load(idx: Elem) -> Result<&'static str> {
    Ok(match idx {
        Elem::I32 => {
            "let raw = B[at(P[2], j)]; let ok = raw >= 0 && u32(raw) < P[6]; let r = u32(raw);"
        }
        Elem::I64 => {
            "let raw = B[at(P[2], j)]; let ok = raw.y == 0u && raw.x < P[6]; let r = raw.x;"
        }
        _ => return Err(backend_error("indices must be int32 or int64")),
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
    let flag = index_flag(ie);
    let body = format!(
        "    let inner = P[4];
    let ni = P[5];
    let j = (i / inner) % ni;
    {}
    if !ok {{ {flag} Y[i] = {}(); return; }}
    Y[i] = A[at(P[1], ((i / (inner * ni)) * P[6] + r) * inner + i % inner)];",
        index_load(ie)?,
        e.mov()
    );
    let k = map_kernel(
        gpu,
        &format!("gather_{}_{ie:?}", e.mov()),
        &[e],
        &[e.mov(), ie.store()],
        &[e.mov()],
        true,
        &body,
    )?;
    run_indexed(gpu, &k, "gather", (x, idx), &out, (n, inner), shape[axis])?;
    Ok(out)
}

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
    let c = match e {
        Elem::F32 | Elem::F16 | Elem::I32 => e.compute().expect("compute type"),
        _ => return Err(unsupported_on(gpu, "scatter_add", e.dtype())),
    };
    let inner: usize = shape[axis + 1..].iter().product();
    let n: usize = shape.iter().product();
    let out = output(gpu, e, n)?;
    let flag = index_flag(ie);
    // Here `A` is the updates and `B` the indices; each output element sums its updates.
    let body = format!(
        "    let inner = P[4];
    let ni = P[5];
    let row = (i / inner) % P[6];
    let outer = i / (inner * P[6]);
    var acc: {c} = {c}();
    for (var j = 0u; j < ni; j = j + 1u) {{
        {}
        if !ok {{ {flag} continue; }}
        if r == row {{ acc = acc + {}; }}
    }}
    Y[i] = {};",
        index_load(ie)?,
        e.load("A[at(P[1], (outer * ni + j) * inner + i % inner)]"),
        e.store_expr("acc")
    );
    let k = map_kernel(
        gpu,
        &format!("scatter_add_{e:?}_{ie:?}"),
        &[e],
        &[e.store(), ie.store()],
        &[e.store()],
        true,
        &body,
    )?;
    run_indexed(
        gpu,
        &k,
        "scatter_add",
        (upd, idx),
        &out,
        (n, inner),
        shape[axis],
    )?;
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

// ---------------------------------------------------------------- pooling

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

fn float_only(gpu: &Gpu, op: &'static str, e: Elem) -> Result<()> {
    if e.is_float() {
        Ok(())
    } else {
        Err(unsupported_on(gpu, op, e.dtype()))
    }
}

pub(crate) fn pool2d(kind: PoolKind, x: &In<'_>, w: &Window2d) -> Result<WgpuBuffer> {
    let gpu = x.gpu();
    let e = x.elem();
    float_only(gpu, kind.name(), e)?;
    let (init, combine, result) = match kind {
        PoolKind::MaxPool2d => (
            "-f_inf()",
            "if is_nan(v) || (!is_nan(acc) && v > acc) { acc = v; }",
            "acc",
        ),
        PoolKind::AvgPool2d => ("0.0", "acc = acc + v;", "acc / max(count, 1.0)"),
    };
    let body = fill(
        "    setup();
    let c = i % G.c;
    let ow = (i / G.c) % G.ow;
    let oh = (i / (G.c * G.ow)) % G.oh;
    let n = i / (G.c * G.ow * G.oh);
    var acc = $INIT;
    var count = 0.0;
    for (var kh = 0u; kh < G.kh; kh = kh + 1u) {
        let h = in_row(oh, kh);
        if h < 0 { continue; }
        for (var kw = 0u; kw < G.kw; kw = kw + 1u) {
            let ww = in_col(ow, kw);
            if ww < 0 { continue; }
            let v = $LOAD;
            $COMBINE
            count = count + 1.0;
        }
    }
    Y[i] = $STORE;",
        &[
            ("INIT", init),
            ("COMBINE", combine),
            ("STORE", &e.store_expr(result)),
            ("LOAD", &e.load("A[a_at(n, u32(h), u32(ww), c)]")),
        ],
    );
    let k = window_kernel(
        gpu,
        &format!("{}_{e:?}", kind.name()),
        e,
        &[e.store()],
        &body,
    )?;
    let n = w.input[0] * w.output[0] * w.output[1] * w.input[3];
    let out = output(gpu, e, n)?;
    let p = Params::new(n).table(4, &geo_table(w, Some(x), 0, None));
    run_map(gpu, &k, p, &[x.buf.raw()], &[out.raw()], false, n)?;
    Ok(out)
}

fn window_kernel(
    gpu: &Arc<Gpu>,
    key: &str,
    e: Elem,
    inputs: &[&str],
    body: &str,
) -> Result<Arc<crate::gpu::Kernel>> {
    gpu.kernel(key, inputs.len(), 1, || {
        kernel_source(
            e == Elem::F16,
            &format!(
                "{GEO_LIB}{}{MAIN}{body}\n}}\n",
                bindings(inputs, &[e.store()], false)
            ),
        )
    })
}

/// WGSL opening of the pooling gradients: input element `i` = (n, h0, w0, c), then a loop over
/// the windows (oh, ow) that cover it (the body continues inside, closes both loops).
const POOL_GRAD_WINDOWS: &str = "    setup();
    let c = i % G.c;
    let w0 = (i / G.c) % G.w;
    let h0 = (i / (G.c * G.w)) % G.h;
    let n = i / (G.c * G.w * G.h);
    var acc = 0.0;
    for (var kh = 0u; kh < G.kh; kh = kh + 1u) {
        let oh = out_row(h0, kh);
        if oh < 0 { continue; }
        for (var kw = 0u; kw < G.kw; kw = kw + 1u) {
            let ow = out_col(w0, kw);
            if ow < 0 { continue; }
";

/// dy routed to the first maximum of each window: each input element sums the dy of the
/// windows whose first maximum it is.
pub(crate) fn max_pool_grad(x: &In<'_>, dy: &In<'_>, w: &Window2d) -> Result<WgpuBuffer> {
    same_gpu("max_pool_grad", x, dy)?;
    let gpu = x.gpu();
    let e = x.elem();
    float_only(gpu, "max_pool_grad", e)?;
    let body = fill(
        &[
            POOL_GRAD_WINDOWS,
            "            // The first maximum of window (oh, ow).
            var best = -f_inf();
            var bh = -1;
            var bw = -1;
            for (var a = 0u; a < G.kh; a = a + 1u) {
                let h = in_row(u32(oh), a);
                if h < 0 { continue; }
                for (var b = 0u; b < G.kw; b = b + 1u) {
                    let ww = in_col(u32(ow), b);
                    if ww < 0 { continue; }
                    let v = $LOADX;
                    if bh < 0 || (!is_nan(best) && (is_nan(v) || v > best)) {
                        best = v; bh = h; bw = ww;
                    }
                }
            }
            if bh == i32(h0) && bw == i32(w0) {
                acc = acc + $LOADDY;
            }
        }
    }
    Y[i] = $STORE;",
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
    let k = window_kernel(
        gpu,
        &format!("max_pool_grad_{e:?}"),
        e,
        &[e.store(), e.store()],
        &body,
    )?;
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
    let body = fill(
        &[
            POOL_GRAD_WINDOWS,
            "            var count = 0.0;
            for (var a = 0u; a < G.kh; a = a + 1u) {
                for (var b = 0u; b < G.kw; b = b + 1u) {
                    if in_row(u32(oh), a) >= 0 && in_col(u32(ow), b) >= 0 { count = count + 1.0; }
                }
            }
            acc = acc + $LOADDY / count;
        }
    }
    Y[i] = $STORE;",
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
    let k = window_kernel(gpu, &format!("avg_pool_grad_{e:?}"), e, &[e.store()], &body)?;
    let n: usize = w.input.iter().product();
    let out = output(gpu, e, n)?;
    let p = Params::new(n)
        .desc(0, dy.desc())
        .table(4, &geo_table(w, None, 0, None));
    run_map(gpu, &k, p, &[dy.buf.raw()], &[out.raw()], false, n)?;
    Ok(out)
}

// ---------------------------------------------------------------- fused optimizer step

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
    if all.iter().any(|x| !Arc::ptr_eq(x.gpu(), gpu)) {
        return Err(backend_error(
            "optimizer_update: operands live on different GPUs; move them with `to_device`",
        ));
    }
    if slots.len() != rule.num_slots() {
        return Err(Error::invalid(
            "optimizer_update",
            format!(
                "{rule:?} takes {} slots, got {}",
                rule.num_slots(),
                slots.len()
            ),
        ));
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
    let (name, p, body): (&str, [f64; 5], &str) = match *rule {
        UpdateRule::SgdMomentum {
            lr,
            momentum,
            nesterov,
        } => (
            "sgd",
            [lr, momentum, nesterov as u8 as f64, 0.0, 0.0],
            "let s0n = p1 * s0 - p0 * g;
    Z[i] = s0n;
    Y[i] = select(w + s0n, w + p1 * s0n - p0 * g, p2 != 0.0);",
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
            "let s0n = p1 * s0 + (1.0 - p1) * g;
    let s1n = p2 * s1 + (1.0 - p2) * g * g;
    Z[i] = s0n;
    K[i] = s1n;
    Y[i] = w - p4 * w - p0 * s0n / (sqrt(s1n) + p3);",
        ),
        UpdateRule::RmsProp {
            lr,
            rho,
            epsilon,
            centered: false,
        } => (
            "rmsprop",
            [lr, rho, epsilon, 0.0, 0.0],
            "let s0n = p1 * s0 + (1.0 - p1) * g * g;
    Z[i] = s0n;
    Y[i] = w - p0 * g / f_sqrt(s0n + p2);",
        ),
        UpdateRule::RmsProp {
            lr,
            rho,
            epsilon,
            centered: true,
        } => (
            "rmsprop_centered",
            [lr, rho, epsilon, 0.0, 0.0],
            "let s0n = p1 * s0 + (1.0 - p1) * g * g;
    let s1n = p1 * s1 + (1.0 - p1) * g;
    Z[i] = s0n;
    K[i] = s1n;
    Y[i] = w - p0 * g / f_sqrt(s0n - s1n * s1n + p2);",
        ),
        UpdateRule::Adagrad { lr, epsilon } => (
            "adagrad",
            [lr, epsilon, 0.0, 0.0, 0.0],
            "let s0n = s0 + g * g;
    Z[i] = s0n;
    Y[i] = w - p0 * g / (sqrt(s0n) + p1);",
        ),
        UpdateRule::Adadelta { lr, rho, epsilon } => (
            "adadelta",
            [lr, rho, epsilon, 0.0, 0.0],
            "let s0n = p1 * s0 + (1.0 - p1) * g * g;
    let u = f_sqrt(s1 + p2) / f_sqrt(s0n + p2) * g;
    Z[i] = s0n;
    K[i] = p1 * s1 + (1.0 - p1) * u * u;
    Y[i] = w - p0 * u;",
        ),
        UpdateRule::Adamax {
            lr_t,
            beta_1,
            beta_2,
            epsilon,
        } => (
            "adamax",
            [lr_t, beta_1, beta_2, epsilon, 0.0],
            "let s0n = p1 * s0 + (1.0 - p1) * g;
    let s1n = max(p2 * s1, abs(g));
    Z[i] = s0n;
    K[i] = s1n;
    Y[i] = w - p0 * s0n / (s1n + p3);",
        ),
    };
    let ns = slots.len();
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
    let k = map_kernel(
        gpu,
        &format!("optimizer_{name}"),
        &[Elem::F32],
        &ins,
        &outs,
        false,
        &format!("{head}    {body}"),
    )?;
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
