//! The CUDA C of every kernel, generated per op and element type (as the wgpu backend
//! generates its WGSL), compiled by NVRTC on first use and cached per device.
//!
//! Each kernel is one `extern "C" __global__` function named after its source's
//! [`KernelSource::name`]; operands are read through a [`View`] (shape, strides, offset: a
//! transposed, sliced or broadcast tensor needs no copy first) and outputs are dense. Half
//! types compute in `float` and round once when stored, as the CPU backend does. Integer
//! arithmetic wraps (it runs on the unsigned type of the same width). Data-dependent
//! failures (integer division by zero, a negative integer exponent) set an error word the
//! host reads after the kernel.

use ferroflow_tensor::{
    ArgReduceOp, BinaryOp, CumulativeOp, DType, ElementwiseProgram, ElementwiseStep,
    FusedActivation, PoolKind, ReduceOp, UnaryOp,
};

/// The most axes a [`View`] describes; the backend refuses deeper tensors with an error.
pub const MAX_RANK: usize = 8;

/// How a kernel reads one operand: the layout of [`ferroflow_tensor::Layout`] in the form the
/// kernels take as a by-value parameter (`struct View` of the prelude).
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct View {
    /// First element, in elements.
    pub offset: i64,
    /// Extent of each axis (the first `rank` are used).
    pub shape: [i64; MAX_RANK],
    /// Step of each axis in elements (zero for a broadcast axis, negative for a reversed one).
    pub strides: [i64; MAX_RANK],
    /// Number of axes.
    pub rank: i32,
    /// 1 when the view has fewer than 2^32 elements: its index arithmetic runs in 32 bits
    /// (a GPU's 64-bit division is a long subroutine).
    pub narrow: i32,
}

// SAFETY: `View` is `repr(C)`, plain integers, and matches `struct View` in `PRELUDE` field for
// field (checked by `view_matches_the_prelude` below).
unsafe impl cudarc::driver::DeviceRepr for View {}

/// One kernel's source: `name` is its `extern "C"` function.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct KernelSource {
    /// The function name, unique per op and element types.
    pub name: String,
    /// The complete CUDA C program (prelude included).
    pub code: String,
}

/// Error codes a kernel writes to the error word (the largest one written wins).
pub mod error_code {
    /// An integer divided by zero.
    pub const DIVISION_BY_ZERO: u32 = 1;
    /// A gather or scatter index outside its axis (the index in words 2 and 3).
    pub const INDEX_OUT_OF_RANGE: u32 = 2;
    /// An integer raised to a negative integer power.
    pub const NEGATIVE_POWER: u32 = 3;
}

/// Element types the kernels store. Complex numbers stay on the CPU backend.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Elem {
    /// IEEE half, computed in float.
    F16,
    /// bfloat16, computed in float.
    BF16,
    /// float.
    F32,
    /// double.
    F64,
    /// signed char.
    I8,
    /// short.
    I16,
    /// int.
    I32,
    /// long long.
    I64,
    /// unsigned char.
    U8,
    /// unsigned short.
    U16,
    /// unsigned int.
    U32,
    /// unsigned long long.
    U64,
    /// one byte, 0 or 1.
    Bool,
}

impl Elem {
    /// Every element type, for the catalog.
    pub const ALL: [Elem; 13] = [
        Elem::F16,
        Elem::BF16,
        Elem::F32,
        Elem::F64,
        Elem::I8,
        Elem::I16,
        Elem::I32,
        Elem::I64,
        Elem::U8,
        Elem::U16,
        Elem::U32,
        Elem::U64,
        Elem::Bool,
    ];

    /// The element type storing `dtype`, or `None` for complex dtypes.
    pub fn of(dtype: DType) -> Option<Elem> {
        Some(match dtype {
            DType::F16 => Elem::F16,
            DType::BF16 => Elem::BF16,
            DType::F32 => Elem::F32,
            DType::F64 => Elem::F64,
            DType::I8 => Elem::I8,
            DType::I16 => Elem::I16,
            DType::I32 => Elem::I32,
            DType::I64 => Elem::I64,
            DType::U8 => Elem::U8,
            DType::U16 => Elem::U16,
            DType::U32 => Elem::U32,
            DType::U64 => Elem::U64,
            DType::Bool => Elem::Bool,
            DType::C64 | DType::C128 => return None,
        })
    }

    /// The dtype this element type stores.
    pub fn dtype(self) -> DType {
        match self {
            Elem::F16 => DType::F16,
            Elem::BF16 => DType::BF16,
            Elem::F32 => DType::F32,
            Elem::F64 => DType::F64,
            Elem::I8 => DType::I8,
            Elem::I16 => DType::I16,
            Elem::I32 => DType::I32,
            Elem::I64 => DType::I64,
            Elem::U8 => DType::U8,
            Elem::U16 => DType::U16,
            Elem::U32 => DType::U32,
            Elem::U64 => DType::U64,
            Elem::Bool => DType::Bool,
        }
    }

    /// The C type in memory.
    pub fn store(self) -> &'static str {
        match self {
            Elem::F16 => "ff_f16",
            Elem::BF16 => "ff_bf16",
            Elem::F32 => "float",
            Elem::F64 => "double",
            Elem::I8 => "signed char",
            Elem::I16 => "short",
            Elem::I32 => "int",
            Elem::I64 => "long long",
            Elem::U8 | Elem::Bool => "unsigned char",
            Elem::U16 => "unsigned short",
            Elem::U32 => "unsigned int",
            Elem::U64 => "unsigned long long",
        }
    }

    /// The C type arithmetic runs in: float for the half types, the type itself otherwise.
    pub fn compute(self) -> &'static str {
        match self {
            Elem::F16 | Elem::BF16 => "float",
            e => e.store(),
        }
    }

    /// The unsigned type wrapping integer arithmetic runs in.
    fn wide(self) -> &'static str {
        match self {
            Elem::I64 | Elem::U64 => "unsigned long long",
            _ => "unsigned int",
        }
    }

    fn is_float(self) -> bool {
        matches!(self, Elem::F16 | Elem::BF16 | Elem::F32 | Elem::F64)
    }

    fn is_signed_int(self) -> bool {
        matches!(self, Elem::I8 | Elem::I16 | Elem::I32 | Elem::I64)
    }

    fn is_unsigned_int(self) -> bool {
        matches!(self, Elem::U8 | Elem::U16 | Elem::U32 | Elem::U64)
    }

    /// The C expression reading `v` (of the storage type) as the compute type.
    pub fn load(self, v: &str) -> String {
        match self {
            Elem::F16 => format!("ld_f16({v})"),
            Elem::BF16 => format!("ld_bf16({v})"),
            _ => format!("({v})"),
        }
    }

    /// The C expression storing `v` (of the compute type) as the storage type.
    pub fn store_expr(self, v: &str) -> String {
        match self {
            Elem::F16 => format!("st_f16({v})"),
            Elem::BF16 => format!("st_bf16({v})"),
            e => format!("(({})({v}))", e.store()),
        }
    }

    /// A short tag for kernel names.
    pub fn tag(self) -> &'static str {
        match self {
            Elem::F16 => "f16",
            Elem::BF16 => "bf16",
            Elem::F32 => "f32",
            Elem::F64 => "f64",
            Elem::I8 => "i8",
            Elem::I16 => "i16",
            Elem::I32 => "i32",
            Elem::I64 => "i64",
            Elem::U8 => "u8",
            Elem::U16 => "u16",
            Elem::U32 => "u32",
            Elem::U64 => "u64",
            Elem::Bool => "bool",
        }
    }

    /// The name of the math function `base` for this float type (`expf` or `exp`).
    fn math(self, base: &str) -> String {
        if self == Elem::F64 {
            base.to_string()
        } else {
            format!("{base}f")
        }
    }

    /// The smallest and largest values, as C literals of the compute type.
    fn limits(self) -> (&'static str, &'static str) {
        match self {
            Elem::F16 | Elem::BF16 | Elem::F32 => (
                "(-__int_as_float(0x7f800000))",
                "__int_as_float(0x7f800000)",
            ),
            Elem::F64 => (
                "(-__longlong_as_double(0x7ff0000000000000LL))",
                "__longlong_as_double(0x7ff0000000000000LL)",
            ),
            Elem::I8 => ("(-128)", "127"),
            Elem::I16 => ("(-32768)", "32767"),
            Elem::I32 => ("(-2147483647 - 1)", "2147483647"),
            Elem::I64 => ("(-9223372036854775807LL - 1)", "9223372036854775807LL"),
            Elem::U8 | Elem::Bool => ("0", "255"),
            Elem::U16 => ("0", "65535"),
            Elem::U32 => ("0u", "4294967295u"),
            Elem::U64 => ("0ull", "18446744073709551615ull"),
        }
    }
}

/// Helpers every kernel shares: the view type and its indexing, the half conversions.
pub const PRELUDE: &str = r#"
#define FF_MAX_RANK 8
typedef long long ff_i64;
struct View {
    ff_i64 offset;
    ff_i64 shape[FF_MAX_RANK];
    ff_i64 strides[FF_MAX_RANK];
        int rank;
    int narrow;
};
struct ff_f16 { unsigned short b; };
struct ff_bf16 { unsigned short b; };
__device__ __forceinline__ ff_i64 at(const View& v, ff_i64 i) {
    /* Dense and broadcast-scalar operands (most of them) take no division. */
        if (v.rank <= 1) return v.offset + (v.rank == 1 ? i * v.strides[0] : 0);
    ff_i64 o = v.offset;
    if (v.narrow) {
        unsigned int u = (unsigned int)i;
        for (int d = v.rank - 1; d >= 0; --d) {
            unsigned int s = (unsigned int)v.shape[d];
            unsigned int q = u / s;
            o += (ff_i64)(u - q * s) * v.strides[d];
            u = q;
        }
        return o;
    }
    for (int d = v.rank - 1; d >= 0; --d) {
        ff_i64 s = v.shape[d];
        o += (i % s) * v.strides[d];
        i /= s;
    }
    return o;
}
#ifdef FF_HOST
/* The host emulation (crate::emulation): the compiler's _Float16 rounds as the GPU does. */
__device__ __forceinline__ float ld_f16(ff_f16 v) {
    _Float16 h;
    memcpy(&h, &v.b, 2);
    return (float)h;
}
__device__ __forceinline__ ff_f16 st_f16(float f) {
    _Float16 h = (_Float16)f;
    ff_f16 v;
    memcpy(&v.b, &h, 2);
    return v;
}
__device__ __forceinline__ ff_f16 st_f16(double f) {
    _Float16 h = (_Float16)f;
    ff_f16 v;
    memcpy(&v.b, &h, 2);
    return v;
}
#else
__device__ __forceinline__ float ld_f16(ff_f16 v) {
    float f;
    asm("cvt.f32.f16 %0, %1;" : "=f"(f) : "h"(v.b));
    return f;
}
__device__ __forceinline__ ff_f16 st_f16(float f) {
    ff_f16 v;
    asm("cvt.rn.f16.f32 %0, %1;" : "=h"(v.b) : "f"(f));
    return v;
}
__device__ __forceinline__ ff_f16 st_f16(double f) {
    ff_f16 v;
    asm("cvt.rn.f16.f64 %0, %1;" : "=h"(v.b) : "d"(f));
    return v;
}
#endif
__device__ __forceinline__ float ld_bf16(ff_bf16 v) {
    return __uint_as_float(((unsigned int)v.b) << 16);
}
/* Round to nearest even; a NaN stays a (quiet) NaN, as the half crate converts. */
__device__ __forceinline__ ff_bf16 st_bf16(float f) {
    unsigned int u = __float_as_uint(f);
    ff_bf16 v;
    if ((u & 0x7fffffffu) > 0x7f800000u) {
        v.b = (unsigned short)((u >> 16) | 0x40u);
    } else {
        u += 0x7fffu + ((u >> 16) & 1u);
        v.b = (unsigned short)(u >> 16);
    }
    return v;
}
__device__ __forceinline__ ff_bf16 st_bf16(double f) { return st_bf16((float)f); }
__device__ __forceinline__ bool ff_isnan(float x) { return x != x; }
__device__ __forceinline__ bool ff_isnan(double x) { return x != x; }
template <class T> __device__ __forceinline__ bool ff_isnan(T) { return false; }
#define FF_LOOP(n) for (ff_i64 i = (ff_i64)blockIdx.x * blockDim.x + threadIdx.x; i < (n); \
    i += (ff_i64)blockDim.x * gridDim.x)
"#;

/// One program holding `kernels`, each in a namespace of its own with `extra(kernel)` after
/// it (what a kernel declares stays its own; the prelude is shared, as at run time). NVRTC's
/// and a C++ compiler's start-up dominate one small kernel, so the CI check and the host
/// emulation compile the catalog this way.
pub fn grouped(
    name: &str,
    kernels: &[KernelSource],
    mut extra: impl FnMut(&KernelSource) -> String,
) -> KernelSource {
    let mut code = PRELUDE.to_string();
    for k in kernels {
        let own = k.code.strip_prefix(PRELUDE).unwrap_or(&k.code);
        code += &format!("namespace ns_{} {{\n{own}\n{}}}\n", k.name, extra(k));
    }
    KernelSource {
        name: name.to_string(),
        code,
    }
}

fn program_source(name: &str, helpers: &str, kernel: &str) -> KernelSource {
    KernelSource {
        name: name.to_string(),
        code: format!("{PRELUDE}{helpers}\n{kernel}"),
    }
}

/// The expression of `op` on `x` (compute type of `e`), or `None` where there is no kernel.
fn unary_expr(op: UnaryOp, e: Elem) -> Option<String> {
    use UnaryOp::*;
    if e.is_float() {
        let c = e.compute();
        let m = |f: &str| format!("{}(x)", e.math(f));
        return Some(match op {
            Neg => "-x".into(),
            Abs => m("fabs"),
            Sign => format!(
                "(x > ({c})0 ? ({c})1 : (x < ({c})0 ? ({c})-1 : (x == ({c})0 ? ({c})0 : x)))"
            ),
            Exp => m("exp"),
            Expm1 => m("expm1"),
            Log => m("log"),
            Log1p => m("log1p"),
            Sqrt => m("sqrt"),
            Rsqrt => format!("({c})1 / {}(x)", e.math("sqrt")),
            Square => "x * x".into(),
            Reciprocal => format!("({c})1 / x"),
            Sin => m("sin"),
            Cos => m("cos"),
            Tan => m("tan"),
            Asin => m("asin"),
            Acos => m("acos"),
            Atan => m("atan"),
            Sinh => m("sinh"),
            Cosh => m("cosh"),
            Tanh => m("tanh"),
            Sigmoid => format!(
                "(x >= ({c})0 ? ({c})1 / (({c})1 + {exp}(-x)) : {exp}(x) / (({c})1 + {exp}(x)))",
                exp = e.math("exp")
            ),
            Erf => m("erf"),
            Floor => m("floor"),
            Ceil => m("ceil"),
            // TF rounds half to even.
            Round => m("rint"),
            Relu => format!("(x < ({c})0 ? ({c})0 : x)"),
            IsFinite => format!("(x == x && {}(x) != {})", e.math("fabs"), e.limits().1),
            IsNan => "(x != x)".into(),
            LogicalNot | Conj | Real | Imag | Angle => return None,
        });
    }
    let w = e.wide();
    if e.is_signed_int() {
        return Some(match op {
            Neg => format!("({w})0 - ({w})x"),
            Abs => format!("(x < 0 ? ({w})0 - ({w})x : ({w})x)"),
            Sign => "((x > 0) - (x < 0))".into(),
            Square => format!("({w})x * ({w})x"),
            Relu => "(x < 0 ? 0 : x)".into(),
            _ => return None,
        });
    }
    if e.is_unsigned_int() {
        // Neg is refused above the backend for unsigned types.
        return Some(match op {
            Abs | Relu => "x".into(),
            Sign => "(x > 0)".into(),
            Square => format!("({w})x * ({w})x"),
            _ => return None,
        });
    }
    match op {
        LogicalNot => Some("(x == 0)".into()),
        _ => None,
    }
}

/// `op` reading `e`, writing `out` (its output dtype's element type).
pub fn unary(op: UnaryOp, e: Elem, out: Elem) -> Option<KernelSource> {
    let expr = unary_expr(op, e)?;
    let name = format!("unary_{}_{}", op.name(), e.tag());
    let kernel = format!(
        "extern \"C\" __global__ void {name}(const {s}* __restrict__ A, View va, {o}* __restrict__ Y, ff_i64 n) {{\n\
         FF_LOOP(n) {{\n    {c} x = {load};\n    Y[i] = {store};\n}}\n}}\n",
        s = e.store(),
        o = out.store(),
        c = e.compute(),
        load = e.load("A[at(va, i)]"),
        store = out.store_expr(&expr),
    );
    Some(program_source(&name, "", &kernel))
}

/// (expression on `a`, `b`, whether it checks for a zero divisor, whether for a negative power)
fn binary_expr(op: BinaryOp, e: Elem) -> Option<(String, bool, bool)> {
    use BinaryOp::*;
    let plain = |s: &str| Some((s.to_string(), false, false));
    let cmp = |op: BinaryOp| match op {
        Equal => Some("(a == b)"),
        NotEqual => Some("(a != b)"),
        Less => Some("(a < b)"),
        LessEqual => Some("(a <= b)"),
        Greater => Some("(a > b)"),
        GreaterEqual => Some("(a >= b)"),
        _ => None,
    };
    if let Some(c) = cmp(op) {
        return plain(c);
    }
    if e.is_float() {
        let c = e.compute();
        return match op {
            Add => plain("a + b"),
            Sub => plain("a - b"),
            Mul => plain("a * b"),
            Div => plain("a / b"),
            FloorDiv => plain(&format!("{}(a / b)", e.math("floor"))),
            FloorMod => plain("ff_floormod(a, b)"),
            Pow => plain(&format!("{}(a, b)", e.math("pow"))),
            Maximum => plain("(a != a ? a : (b != b ? b : (a > b ? a : b)))"),
            Minimum => plain("(a != a ? a : (b != b ? b : (a < b ? a : b)))"),
            SquaredDifference => plain("(a - b) * (a - b)"),
            Atan2 => plain(&format!("{}(a, b)", e.math("atan2"))),
            // x · [y > 0]: a product, so a NaN or infinite gradient stays NaN as on the CPU.
            ReluGrad => plain(&format!("a * (b > ({c})0 ? ({c})1 : ({c})0)")),
            _ => None,
        };
    }
    let w = e.wide();
    if e.is_signed_int() {
        return match op {
            Add => plain(&format!("({w})a + ({w})b")),
            Sub => plain(&format!("({w})a - ({w})b")),
            Mul => plain(&format!("({w})a * ({w})b")),
            // b = -1 is negation (wrapping at the minimum, where C's division overflows).
            Div => Some((
                format!("(b == -1 ? ({w})0 - ({w})a : ({w})(a / b))"),
                true,
                false,
            )),
            FloorDiv => Some(("ff_floordiv(a, b)".into(), true, false)),
            FloorMod => Some(("ff_floormod(a, b)".into(), true, false)),
            Pow => Some(("ff_ipow(a, b)".into(), false, true)),
            Maximum => plain("(a > b ? a : b)"),
            Minimum => plain("(a < b ? a : b)"),
            SquaredDifference => plain(&format!("(({w})a - ({w})b) * (({w})a - ({w})b)")),
            _ => None,
        };
    }
    if e.is_unsigned_int() {
        return match op {
            Add => plain(&format!("({w})a + ({w})b")),
            Sub => plain(&format!("({w})a - ({w})b")),
            Mul => plain(&format!("({w})a * ({w})b")),
            // Unsigned: floor division is truncating division, the modulo the remainder.
            Div | FloorDiv => Some(("a / b".into(), true, false)),
            FloorMod => Some(("a % b".into(), true, false)),
            Pow => plain("ff_ipow(a, b)"),
            Maximum => plain("(a > b ? a : b)"),
            Minimum => plain("(a < b ? a : b)"),
            SquaredDifference => plain(&format!("(({w})a - ({w})b) * (({w})a - ({w})b)")),
            _ => None,
        };
    }
    match op {
        LogicalAnd => plain("(a && b)"),
        LogicalOr => plain("(a || b)"),
        LogicalXor => plain("((a != 0) != (b != 0))"),
        Maximum => plain("(a > b ? a : b)"),
        Minimum => plain("(a < b ? a : b)"),
        _ => None,
    }
}

/// Floor division and modulo and integer powers on the compute type of `e`.
fn binary_helpers(e: Elem) -> String {
    let c = e.compute();
    let w = e.wide();
    if e.is_float() {
        // TF's floormod: the remainder takes the divisor's sign.
        return format!(
            "__device__ __forceinline__ {c} ff_floormod({c} a, {c} b) {{\n\
             {c} r = {fmod}(a, b);\n\
             if (r != ({c})0 && ((r < ({c})0) != (b < ({c})0))) r += b;\n\
             return r;\n}}\n",
            fmod = e.math("fmod")
        );
    }
    if e == Elem::Bool {
        return String::new();
    }
    let mut h = format!(
        "__device__ __forceinline__ {c} ff_ipow({c} a, {c} b) {{\n\
         {w} base = ({w})a, r = 1;\n\
         unsigned long long k = (unsigned long long)b;\n\
         while (k) {{ if (k & 1ull) r *= base; base *= base; k >>= 1; }}\n\
         return ({c})r;\n}}\n"
    );
    if e.is_signed_int() {
        h += &format!(
            "__device__ __forceinline__ {c} ff_floordiv({c} a, {c} b) {{\n\
             if (b == -1) return ({c})(({w})0 - ({w})a);\n\
             {c} q = a / b;\n\
             if ((a % b != 0) && ((a < 0) != (b < 0))) q -= 1;\n\
             return q;\n}}\n\
             __device__ __forceinline__ {c} ff_floormod({c} a, {c} b) {{\n\
             if (b == -1) return 0;\n\
             {c} r = a % b;\n\
             if (r != 0 && ((r < 0) != (b < 0))) r += b;\n\
             return r;\n}}\n"
        );
    }
    h
}

/// `op` on two operands of `e` (read through their broadcast views), writing `out`. The
/// second value says whether the kernel writes the error word (its last parameter, `E`,
/// which unchecked kernels do not have).
pub fn binary(op: BinaryOp, e: Elem, out: Elem) -> Option<(KernelSource, bool)> {
    let (expr, div_check, pow_check) = binary_expr(op, e)?;
    let name = format!("binary_{}_{}", op.name(), e.tag());
    let mut body = format!(
        "    {c} a = {la};\n    {c} b = {lb};\n",
        c = e.compute(),
        la = e.load("A[at(va, i)]"),
        lb = e.load("B[at(vb, i)]"),
    );
    if div_check {
        body += &format!(
            "    if (b == 0) {{ atomicMax(E, {}u); Y[i] = 0; continue; }}\n",
            error_code::DIVISION_BY_ZERO
        );
    }
    if pow_check {
        body += &format!(
            "    if (b < 0) {{ atomicMax(E, {}u); Y[i] = 0; continue; }}\n",
            error_code::NEGATIVE_POWER
        );
    }
    body += &format!("    Y[i] = {};\n", out.store_expr(&expr));
    let kernel = format!(
        "extern \"C\" __global__ void {name}(const {s}* __restrict__ A, View va, const {s}* __restrict__ B, View vb, \
         {o}* __restrict__ Y, ff_i64 n{e_param}) {{\n\
         FF_LOOP(n) {{\n{body}}}\n}}\n",
        s = e.store(),
        o = out.store(),
        // Only checked kernels take the error word.
        e_param = if div_check || pow_check { ", unsigned int* E" } else { "" },
    );
    Some((
        program_source(&name, &binary_helpers(e), &kernel),
        div_check || pow_check,
    ))
}

/// The conversion of `v` (compute type of `from`) to the compute type of `to`, as Rust's
/// `as` converts: floats to integers saturate and NaN becomes 0; to bool is `!= 0`.
fn cast_expr(from: Elem, to: Elem) -> String {
    if to == Elem::Bool {
        return "(v != 0)".into();
    }
    if to.is_float() {
        // double to half rounds once (`st_f16(double)`), as the half crate converts.
        if from == Elem::F64 && to == Elem::F16 {
            return "(v)".into();
        }
        return format!("({})(v)", if to == Elem::F64 { "double" } else { "float" });
    }
    if from.is_float() {
        // Compare in double: every integer bound below is exact there.
        let (lo, hi) = to.limits();
        let top = match to {
            Elem::I8 => "128.0",
            Elem::I16 => "32768.0",
            Elem::I32 => "2147483648.0",
            Elem::I64 => "9223372036854775808.0",
            Elem::U8 => "256.0",
            Elem::U16 => "65536.0",
            Elem::U32 => "4294967296.0",
            _ => "18446744073709551616.0",
        };
        let t = to.store();
        return format!(
            "((double)v != (double)v ? ({t})0 : ((double)v <= (double){lo} ? ({t}){lo} : \
             ((double)v >= {top} ? ({t}){hi} : ({t})v)))"
        );
    }
    // Integer to integer: two's complement truncation or extension.
    format!("({})(v)", to.store())
}

/// A conversion from `from` to `to` (any pair of real element types).
pub fn cast(from: Elem, to: Elem) -> KernelSource {
    let name = format!("cast_{}_{}", from.tag(), to.tag());
    let expr = if from == to {
        "v".to_string()
    } else {
        cast_expr(from, to)
    };
    // A half type to the other half type goes through float (one rounding: float holds
    // every value of both exactly).
    let kernel = format!(
        "extern \"C\" __global__ void {name}(const {s}* __restrict__ A, View va, {o}* __restrict__ Y, ff_i64 n) {{\n\
         FF_LOOP(n) {{\n    {c} v = {load};\n    Y[i] = {store};\n}}\n}}\n",
        s = from.store(),
        o = to.store(),
        c = from.compute(),
        load = from.load("A[at(va, i)]"),
        store = if from == to {
            "A[at(va, i)]".to_string()
        } else {
            to.store_expr(&expr)
        },
    );
    program_source(&name, "", &kernel)
}

/// `cond ? on_true : on_false` elementwise (`cond` bool, all three through broadcast views).
pub fn select(e: Elem) -> KernelSource {
    let name = format!("select_{}", e.tag());
    let kernel = format!(
        "extern \"C\" __global__ void {name}(const unsigned char* __restrict__ C, View vc, \
         const {s}* __restrict__ A, View va, const {s}* __restrict__ B, View vb, {s}* __restrict__ Y, ff_i64 n) {{\n\
         FF_LOOP(n) {{\n    Y[i] = C[at(vc, i)] ? A[at(va, i)] : B[at(vb, i)];\n}}\n}}\n",
        s = e.store()
    );
    program_source(&name, "", &kernel)
}

/// The accumulator type, its start and the combining statement of a reduction, or `None`.
fn reduce_parts(op: ReduceOp, e: Elem) -> Option<(String, String, String)> {
    use ReduceOp::*;
    // Floats accumulate in double for sums and products (the half types and float too:
    // more accurate than the float result needs, and independent of the order).
    let acc = if e.is_float() {
        "double".to_string()
    } else if e == Elem::Bool {
        "int".to_string()
    } else {
        e.wide().to_string()
    };
    let (lo, hi) = e.limits();
    Some(match op {
        ReduceSum | ReduceMean if e != Elem::Bool => (acc, "0".into(), "r = r + v;".into()),
        ReduceProd if e != Elem::Bool => (acc, "1".into(), "r = r * v;".into()),
        ReduceMax if e != Elem::Bool => (
            e.compute().into(),
            lo.into(),
            // A NaN propagates: once r is NaN it stays.
            "if (r == r && (v != v || v > r)) r = v;".into(),
        ),
        ReduceMin if e != Elem::Bool => (
            e.compute().into(),
            hi.into(),
            "if (r == r && (v != v || v < r)) r = v;".into(),
        ),
        ReduceAny if e == Elem::Bool => (acc, "0".into(), "r = r || v;".into()),
        ReduceAll if e == Elem::Bool => (acc, "1".into(), "r = r && v;".into()),
        _ => return None,
    })
}

/// Threads per block of the block-per-output reductions.
pub const REDUCE_BLOCK: u32 = 256;

/// A reduction: output `o` combines the `m` elements `A[at(kept, o) + at(red, j)]`.
/// `_rows` kernels run one thread per output (short reductions); `_blocks` kernels one block
/// of [`REDUCE_BLOCK`] threads per output, combined by a fixed tree (long reductions over
/// many outputs); `_partials` and `_finish` split long reductions over few outputs (a
/// full sum, batch norm's per-channel moments): `_partials` runs a thread per (output,
/// segment), segment `s` of `S` combining elements `j ≡ s (mod S)` (consecutive threads
/// read consecutive elements whether the kept or the reduced axis is the contiguous one),
/// and `_finish` a block per output over its `S` partials. All are deterministic: the
/// partition and the trees depend on the shapes alone.
pub fn reduce(op: ReduceOp, e: Elem) -> Option<[KernelSource; 4]> {
    let base = format!("{}_{}", op.name(), e.tag());
    let load = e.load("A[base + at(red, j)]");
    let input = format!("const {}* __restrict__ A, ", e.store());
    reduction_kernels(&base, op, e, &input, "", &load, "")
}

/// A block's tree over its `__shared__` array `part` ([`REDUCE_BLOCK`] values of `acc`):
/// each thread's `r` stored, then the upper half folded into the lower by `combine` (which
/// folds `v` into `r`), halving until `part[0]` holds the block's result, the same order
/// on every run.
fn block_tree(acc: &str, combine: &str) -> String {
    format!(
        "part[threadIdx.x] = r;\n\
         __syncthreads();\n\
         for (unsigned int half = {REDUCE_BLOCK} / 2; half > 0; half >>= 1) {{\n\
         if (threadIdx.x < half) {{ r = part[threadIdx.x]; {acc} v = part[threadIdx.x + half]; {combine} part[threadIdx.x] = r; }}\n\
         __syncthreads();\n}}\n"
    )
}

/// The `_rows`, `_blocks`, `_partials` and `_finish` kernels of reduction `op` on `e` (see
/// [`reduce`]) named `{base}_rows` and so on: parameters `({inputs}View kept, View red,
/// ff_i64 m, S* Y{extra}[, ff_i64 n])` (`_partials`: `({inputs}View kept, View red, ff_i64 m,
/// ACC* P{extra}, ff_i64 n, ff_i64 segments)`, `_finish`: `(const ACC* P, ff_i64 n, ff_i64
/// segments, ff_i64 m, S* Y)`, ACC the accumulator type, at most 8 bytes), element `j` of
/// output `o`'s reduction read as `load` (with `base` = `at(kept, o)`), `helpers` before the
/// kernels. A mean stores its sum divided by `m` (integers: the sum wrapped to the type
/// first, then divided with truncation, as the CPU backend does).
fn reduction_kernels(
    base: &str,
    op: ReduceOp,
    e: Elem,
    inputs: &str,
    extra: &str,
    load: &str,
    helpers: &str,
) -> Option<[KernelSource; 4]> {
    let (acc, init, combine) = reduce_parts(op, e)?;
    let s = e.store();
    let c = e.compute();
    let store = match op {
        ReduceOp::ReduceMean if e.is_float() => e.store_expr("(r / (double)m)"),
        ReduceOp::ReduceMean => {
            let wide = if e.is_signed_int() {
                "long long"
            } else {
                "unsigned long long"
            };
            e.store_expr(&format!("(({wide})(({s})r) / ({wide})m)"))
        }
        _ => e.store_expr("r"),
    };
    let rows = format!(
        "extern \"C\" __global__ void {base}_rows({inputs}View kept, View red, ff_i64 m, \
         {s}* __restrict__ Y{extra}, ff_i64 n) {{\n\
         FF_LOOP(n) {{\n\
         ff_i64 base = at(kept, i);\n\
         {acc} r = ({acc}){init};\n\
         for (ff_i64 j = 0; j < m; ++j) {{ {c} v = {load}; {combine} }}\n\
         Y[i] = {store};\n}}\n}}\n"
    );
    let tree = block_tree(&acc, &combine);
    let blocks = format!(
        "extern \"C\" __global__ void {base}_blocks({inputs}View kept, View red, ff_i64 m, \
         {s}* __restrict__ Y{extra}) {{\n\
         __shared__ {acc} part[{REDUCE_BLOCK}];\n\
         ff_i64 base = at(kept, (ff_i64)blockIdx.x);\n\
         {acc} r = ({acc}){init};\n\
         for (ff_i64 j = threadIdx.x; j < m; j += {REDUCE_BLOCK}) {{ {c} v = {load}; {combine} }}\n\
         {tree}\
         if (threadIdx.x == 0) {{ r = part[0]; Y[blockIdx.x] = {store}; }}\n}}\n"
    );
    let partials = format!(
        "extern \"C\" __global__ void {base}_partials({inputs}View kept, View red, ff_i64 m, \
         {acc}* __restrict__ P{extra}, ff_i64 n, ff_i64 segments) {{\n\
         FF_LOOP(n * segments) {{\n\
         ff_i64 base = at(kept, i % n);\n\
         {acc} r = ({acc}){init};\n\
         for (ff_i64 j = i / n; j < m; j += segments) {{ {c} v = {load}; {combine} }}\n\
         P[i] = r;\n}}\n}}\n"
    );
    let finish = format!(
        "extern \"C\" __global__ void {base}_finish(const {acc}* __restrict__ P, ff_i64 n, \
         ff_i64 segments, ff_i64 m, {s}* __restrict__ Y) {{\n\
         __shared__ {acc} part[{REDUCE_BLOCK}];\n\
         {acc} r = ({acc}){init};\n\
         for (ff_i64 j = threadIdx.x; j < segments; j += {REDUCE_BLOCK}) {{ {acc} v = P[j * n + blockIdx.x]; {combine} }}\n\
         {tree}\
         if (threadIdx.x == 0) {{ r = part[0]; Y[blockIdx.x] = {store}; }}\n}}\n"
    );
    Some([
        program_source(&format!("{base}_rows"), helpers, &rows),
        program_source(&format!("{base}_blocks"), helpers, &blocks),
        program_source(&format!("{base}_partials"), helpers, &partials),
        program_source(&format!("{base}_finish"), "", &finish),
    ])
}

/// Arg-reductions along at most this many elements take [`arg_reduce`]'s thread-per-output
/// kernel; longer ones (an argmax over a vocabulary) its block-per-output kernel.
pub const ARG_REDUCE_ROW_MAX: usize = 1024;

/// The index (int64) of the extreme along one axis: output `o` scans `A[at(kept, o) + j·stride]`
/// for `j < m`; the first index wins ties and the first NaN beats any number, as on the CPU.
/// Two kernels, parameters `(A, kept, stride, m, Y, n)`: `{op}_{t}`, a thread per output
/// (lines of up to [`ARG_REDUCE_ROW_MAX`]); `{op}_blocks_{t}`, a block of [`REDUCE_BLOCK`]
/// threads per output, each keeping the first best of its stride of the line, combined by
/// a fixed tree under the same rule (the same index: the rule picks one element).
pub fn arg_reduce(op: ArgReduceOp, e: Elem) -> Option<[KernelSource; 2]> {
    if e == Elem::Bool {
        return None;
    }
    let name = format!("{}_{}", op.name(), e.tag());
    let (better, cmp) = match op {
        ArgReduceOp::ArgMax => ("v > best", ">"),
        ArgReduceOp::ArgMin => ("v < best", "<"),
    };
    let (s, c) = (e.store(), e.compute());
    let kernel = format!(
        "extern \"C\" __global__ void {name}(const {s}* __restrict__ A, View kept, ff_i64 stride, ff_i64 m, \
         long long* __restrict__ Y, ff_i64 n) {{\n\
         FF_LOOP(n) {{\n\
         ff_i64 base = at(kept, i);\n\
         {c} best = {first};\n\
         ff_i64 index = 0;\n\
         for (ff_i64 j = 1; j < m && !ff_isnan(best); ++j) {{\n\
         {c} v = {next};\n\
         if (ff_isnan(v) || {better}) {{ best = v; index = j; }}\n}}\n\
         Y[i] = index;\n}}\n}}\n",
        first = e.load("A[base]"),
        next = e.load("A[base + j * stride]"),
    );
    let blocks_name = format!("{}_blocks_{}", op.name(), e.tag());
    let blocks = format!(
        "extern \"C\" __global__ void {blocks_name}(const {s}* __restrict__ A, View kept, ff_i64 stride, ff_i64 m, \
         long long* __restrict__ Y, ff_i64 n) {{\n\
         __shared__ {c} pv[{REDUCE_BLOCK}];\n\
         __shared__ long long pi[{REDUCE_BLOCK}];\n\
         ff_i64 base = at(kept, (ff_i64)blockIdx.x);\n\
         {c} best = 0;\n\
         long long index = -1;\n\
         for (ff_i64 j = threadIdx.x; j < m; j += {REDUCE_BLOCK}) {{\n\
         {c} v = {next};\n\
         if (index < 0 || (!ff_isnan(best) && (ff_isnan(v) || {better}))) {{ best = v; index = j; }}\n}}\n\
         pv[threadIdx.x] = best;\n\
         pi[threadIdx.x] = index;\n\
         __syncthreads();\n\
         for (unsigned int half = {REDUCE_BLOCK} / 2; half > 0; half >>= 1) {{\n\
         if (threadIdx.x < half) {{\n\
         {c} t = pv[threadIdx.x], o = pv[threadIdx.x + half];\n\
         long long ti = pi[threadIdx.x], oi = pi[threadIdx.x + half];\n\
         int take;\n\
         if (oi < 0) take = 0;\n\
         else if (ti < 0) take = 1;\n\
         else if (ff_isnan(t)) take = ff_isnan(o) && oi < ti;\n\
         else if (ff_isnan(o)) take = 1;\n\
         else take = (o {cmp} t) || (o == t && oi < ti);\n\
         if (take) {{ pv[threadIdx.x] = o; pi[threadIdx.x] = oi; }}\n}}\n\
         __syncthreads();\n}}\n\
         if (threadIdx.x == 0) Y[blockIdx.x] = pi[0];\n}}\n",
        next = e.load("A[base + j * stride]"),
    );
    Some([
        program_source(&name, "", &kernel),
        program_source(&blocks_name, "", &blocks),
    ])
}

/// `Y[at(vy, i)] = A[at(va, i)]` over the `n` elements of a shape both views describe: a
/// strided copy into part of an output (concat's inputs, pad's interior).
pub fn copy_into(e: Elem) -> KernelSource {
    let name = format!("copy_into_{}", e.tag());
    let kernel = format!(
        "extern \"C\" __global__ void {name}(const {s}* __restrict__ A, View va, {s}* __restrict__ Y, View vy, ff_i64 n) {{\n\
         FF_LOOP(n) {{\n    Y[at(vy, i)] = A[at(va, i)];\n}}\n}}\n",
        s = e.store()
    );
    program_source(&name, "", &kernel)
}

/// `Y[i] = v` for `i < n`, `v` converted from double as Rust's `as` converts (pad's value).
pub fn fill(e: Elem) -> KernelSource {
    let name = format!("fill_{}", e.tag());
    let value = e.store_expr(&cast_expr(Elem::F64, e));
    let kernel = format!(
        "extern \"C\" __global__ void {name}({s}* __restrict__ Y, ff_i64 n, double v) {{\n\
         FF_LOOP(n) {{\n    Y[i] = {value};\n}}\n}}\n",
        s = e.store()
    );
    program_source(&name, "", &kernel)
}

/// Reads index `j` of `B` (int32 or int64) into `r`, or records it in the error word (code 2,
/// the value in `E[2..4]`) and runs `on_bad`.
fn index_load(ie: Elem, on_bad: &str) -> Option<String> {
    if !matches!(ie, Elem::I32 | Elem::I64) {
        return None;
    }
    Some(format!(
        "long long r = (long long)B[at(vb, j)];\n\
         if (r < 0 || r >= bound) {{ if (atomicMax(E, {code}u) < {code}u) \
         {{ *(unsigned long long*)(E + 2) = (unsigned long long)r; }} {on_bad} }}\n",
        code = error_code::INDEX_OUT_OF_RANGE
    ))
}

/// Gather along one axis: output `i` (of `outer × ni × inner`) copies the element its index
/// selects; an index outside `[0, bound)` is recorded in the error word and gives zero bits.
pub fn gather(e: Elem, ie: Elem) -> Option<KernelSource> {
    let name = format!("gather_{}_{}", e.tag(), ie.tag());
    let load = index_load(ie, "Y[i] = zero; continue;")?;
    let kernel = format!(
        "extern \"C\" __global__ void {name}(const {s}* __restrict__ A, View va, const {is}* __restrict__ B, View vb, \
         {s}* __restrict__ Y, ff_i64 n, ff_i64 inner, ff_i64 ni, ff_i64 bound, unsigned int* E) {{\n\
         const {s} zero = {{0}};\n\
         FF_LOOP(n) {{\n\
         ff_i64 j = (i / inner) % ni;\n\
         {load}\
         Y[i] = A[at(va, ((i / (inner * ni)) * bound + r) * inner + i % inner)];\n}}\n}}\n",
        s = e.store(),
        is = ie.store(),
    );
    Some(program_source(&name, "", &kernel))
}

/// Rows of at most this many classes take [`sparse_softmax_xent`]'s thread-per-row kernel;
/// wider ones (a language model's vocabulary) its block-per-row kernel.
pub const SOFTMAX_ROW_MAX: usize = 1024;

/// The sparse softmax cross-entropy (`Backend::sparse_softmax_cross_entropy`): each row of
/// the logits (`bound` classes, read through the view once, into the backprop output) gets
/// the softmax minus the one-hot label there and the loss `logsumexp - x[label]` (shifted
/// by the row's maximum, as TF's kernel) in `L`, in the compute type; a label outside
/// `[0, bound)` is recorded in the error word. Two kernels, parameters `(A, va, B, vb, L, BP,
/// rows, bound, E)`: `sparse_softmax_xent_{t}_{it}`, a thread per row walking its classes
/// in order (rows of up to [`SOFTMAX_ROW_MAX`]); `sparse_softmax_xent_blocks_{t}_{it}`, a
/// block of [`REDUCE_BLOCK`] threads per row, its maximum and sum combined by a fixed tree
/// (deterministic; the sum's rounding differs from the row kernel's by its order).
pub fn sparse_softmax_xent(e: Elem, ie: Elem) -> Option<[KernelSource; 2]> {
    if !matches!(e, Elem::F32 | Elem::F64) {
        return None;
    }
    let name = format!("sparse_softmax_xent_{}_{}", e.tag(), ie.tag());
    let load = index_load(ie, "continue;")?;
    let c = e.compute();
    let kernel = format!(
        "extern \"C\" __global__ void {name}(const {s}* __restrict__ A, View va, const {is}* __restrict__ B, View vb, \
         {s}* __restrict__ L, {s}* __restrict__ BP, ff_i64 rows, ff_i64 bound, unsigned int* E) {{\n\
         FF_LOOP(rows) {{\n\
         ff_i64 j = i;\n\
         {load}\
         ff_i64 base = i * bound;\n\
         {c} m = {lo};\n\
         {c} picked = 0;\n\
         for (ff_i64 k = 0; k < bound; ++k) {{ {c} v = A[at(va, base + k)]; BP[base + k] = v; if (v > m) m = v; if (k == r) picked = v; }}\n\
         {c} s = 0;\n\
         for (ff_i64 k = 0; k < bound; ++k) {{ {c} x = {exp}(BP[base + k] - m); BP[base + k] = x; s = s + x; }}\n\
         {c} inv = ({c})1 / s;\n\
         for (ff_i64 k = 0; k < bound; ++k) {{ BP[base + k] = BP[base + k] * inv; }}\n\
         BP[base + r] = BP[base + r] - ({c})1;\n\
         L[i] = {log}(s) - (picked - m);\n}}\n}}\n",
        s = e.store(),
        is = ie.store(),
        lo = e.limits().0,
        exp = e.math("exp"),
        log = e.math("log"),
    );
    let blocks_name = format!("sparse_softmax_xent_blocks_{}_{}", e.tag(), ie.tag());
    let blocks = format!(
        "extern \"C\" __global__ void {blocks_name}(const {s}* __restrict__ A, View va, const {is}* __restrict__ B, View vb, \
         {s}* __restrict__ L, {s}* __restrict__ BP, ff_i64 rows, ff_i64 bound, unsigned int* E) {{\n\
         __shared__ {c} part[{REDUCE_BLOCK}];\n\
         ff_i64 i = (ff_i64)blockIdx.x;\n\
         long long label = (long long)B[at(vb, i)];\n\
         int bad = label < 0 || label >= bound;\n\
         if (bad && threadIdx.x == 0 && atomicMax(E, {code}u) < {code}u) {{ *(unsigned long long*)(E + 2) = (unsigned long long)label; }}\n\
         ff_i64 base = i * bound;\n\
         {c} r = {lo};\n\
         for (ff_i64 k = threadIdx.x; k < bound; k += {REDUCE_BLOCK}) {{ {c} v = A[at(va, base + k)]; BP[base + k] = v; if (v > r) r = v; }}\n\
         {max_tree}\
         {c} m = part[0];\n\
         __syncthreads();\n\
         r = 0;\n\
         for (ff_i64 k = threadIdx.x; k < bound; k += {REDUCE_BLOCK}) {{ {c} x = {exp}(BP[base + k] - m); BP[base + k] = x; r = r + x; }}\n\
         {sum_tree}\
         {c} s = part[0];\n\
         {c} inv = ({c})1 / s;\n\
         for (ff_i64 k = threadIdx.x; k < bound; k += {REDUCE_BLOCK}) {{ {c} p = BP[base + k] * inv; if (k == label) p = p - ({c})1; BP[base + k] = p; }}\n\
         if (threadIdx.x == 0 && !bad) {{ {c} picked = A[at(va, base + label)]; L[i] = {log}(s) - (picked - m); }}\n}}\n",
        s = e.store(),
        is = ie.store(),
        lo = e.limits().0,
        exp = e.math("exp"),
        log = e.math("log"),
        code = error_code::INDEX_OUT_OF_RANGE,
        max_tree = block_tree(c, "if (v > r) r = v;"),
        sum_tree = block_tree(c, "r = r + v;"),
    );
    Some([
        program_source(&name, "", &kernel),
        program_source(&blocks_name, "", &blocks),
    ])
}

/// Scatter-adds of at most this many indices scan them all per output ([`scatter_add`]'s
/// first kernel); more are sorted first (its second).
pub const SCATTER_SCAN_MAX: usize = 64;

/// The adjoint of gather: output `i` (of `outer × bound × inner`, zeros first) sums the
/// updates whose index selects its row, in index order (deterministic, no atomics); an
/// index out of range is recorded in the error word. Two kernels, the same bits:
/// - `scatter_add_{t}_{it}` (at most [`SCATTER_SCAN_MAX`] indices): each output reads every
///   index; parameters `(A, va, B, vb, Y, n, inner, ni, bound, E)`;
/// - `scatter_add_sorted_{t}_{it}`: the indices' keys and positions sorted (stable: the
///   index type's [`sort`] kernels), each output finds its row's run by a binary search and
///   sums the run's updates in order (positions ascending, as the scan adds them);
///   parameters `(A, va, K, P, Y, n, inner, ni, bound, E)`; out-of-range indices, at the
///   run's two ends, checked by the first thread.
pub fn scatter_add(e: Elem, ie: Elem) -> Option<[KernelSource; 2]> {
    if e == Elem::Bool {
        return None;
    }
    let name = format!("scatter_add_{}_{}", e.tag(), ie.tag());
    let load = index_load(ie, "continue;")?;
    let acc = if e.is_float() { e.compute() } else { e.wide() };
    let kernel = format!(
        "extern \"C\" __global__ void {name}(const {s}* __restrict__ A, View va, const {is}* __restrict__ B, View vb, \
         {s}* __restrict__ Y, ff_i64 n, ff_i64 inner, ff_i64 ni, ff_i64 bound, unsigned int* E) {{\n\
         FF_LOOP(n) {{\n\
         ff_i64 row = (i / inner) % bound;\n\
         ff_i64 outer = i / (inner * bound);\n\
         {acc} acc = 0;\n\
         for (ff_i64 j = 0; j < ni; ++j) {{\n\
         {load}\
         if (r == row) {{ {c} v = {lv}; acc = acc + v; }}\n}}\n\
         Y[i] = {store};\n}}\n}}\n",
        s = e.store(),
        is = ie.store(),
        c = e.compute(),
        lv = e.load("A[at(va, (outer * ni + j) * inner + i % inner)]"),
        store = e.store_expr("acc"),
    );
    let sorted_name = format!("scatter_add_sorted_{}_{}", e.tag(), ie.tag());
    let bad = |r: &str| {
        format!(
            "if (atomicMax(E, {code}u) < {code}u) {{ *(unsigned long long*)(E + 2) = \
             (unsigned long long)({r}); }}",
            code = error_code::INDEX_OUT_OF_RANGE
        )
    };
    let sorted = format!(
        "extern \"C\" __global__ void {sorted_name}(const {s}* __restrict__ A, View va, \
         const unsigned long long* __restrict__ K, const int* __restrict__ P, {s}* __restrict__ Y, \
         ff_i64 n, ff_i64 inner, ff_i64 ni, ff_i64 bound, unsigned int* E) {{\n\
         const unsigned long long sign = 1ull << 63;\n\
         FF_LOOP(n) {{\n\
         if (i == 0) {{\n\
         long long first = (long long)(K[0] ^ sign), last = (long long)(K[ni - 1] ^ sign);\n\
         if (first < 0) {{ {bad_first} }}\n\
         if (last >= bound) {{ {bad_last} }}\n\
         }}\n\
         ff_i64 row = (i / inner) % bound;\n\
         ff_i64 outer = i / (inner * bound);\n\
         unsigned long long key = ((unsigned long long)(long long)row) ^ sign;\n\
         ff_i64 lo = 0, hi = ni;\n\
         while (lo < hi) {{ ff_i64 c = lo + (hi - lo) / 2; if (K[c] < key) lo = c + 1; else hi = c; }}\n\
         {acc} acc = 0;\n\
         for (ff_i64 t = lo; t < ni && K[t] == key; ++t) {{\n\
         ff_i64 j = P[t];\n\
         {c} v = {lv}; acc = acc + v;\n}}\n\
         Y[i] = {store};\n}}\n}}\n",
        s = e.store(),
        c = e.compute(),
        bad_first = bad("first"),
        bad_last = bad("last"),
        lv = e.load("A[at(va, (outer * ni + j) * inner + i % inner)]"),
        store = e.store_expr("acc"),
    );
    Some([
        program_source(&name, "", &kernel),
        program_source(&sorted_name, "", &sorted),
    ])
}

/// Running sums or products along one axis, one thread per line, in the compute type and in
/// order (the CPU backend's numbers): line `l` reads `A[at(kin, l) + j·sin]`, writes
/// `Y[at(kout, l) + j·sout]`; `exclusive` shifts by one, `reverse` runs from the end.
pub fn cumulative(op: CumulativeOp, e: Elem) -> Option<KernelSource> {
    if e == Elem::Bool {
        return None;
    }
    let name = format!("{}_{}", op.name(), e.tag());
    let (init, combine) = match (op, e.is_float()) {
        (CumulativeOp::Cumsum, true) => ("0", "acc = acc + v;".to_string()),
        (CumulativeOp::Cumprod, true) => ("1", "acc = acc * v;".to_string()),
        (CumulativeOp::Cumsum, false) => (
            "0",
            format!(
                "acc = ({c})(({w})acc + ({w})v);",
                c = e.compute(),
                w = e.wide()
            ),
        ),
        (CumulativeOp::Cumprod, false) => (
            "1",
            format!(
                "acc = ({c})(({w})acc * ({w})v);",
                c = e.compute(),
                w = e.wide()
            ),
        ),
    };
    let kernel = format!(
        "extern \"C\" __global__ void {name}(const {s}* __restrict__ A, View kin, ff_i64 sin, {s}* __restrict__ Y, \
         View kout, ff_i64 sout, ff_i64 m, ff_i64 n, int exclusive, int reverse) {{\n\
         FF_LOOP(n) {{\n\
         ff_i64 a0 = at(kin, i), y0 = at(kout, i);\n\
         {c} acc = ({c}){init};\n\
         for (ff_i64 t = 0; t < m; ++t) {{\n\
         ff_i64 j = reverse ? m - 1 - t : t;\n\
         {c} v = {lv};\n\
         if (exclusive) {{ Y[y0 + j * sout] = {store}; {combine} }}\n\
         else {{ {combine} Y[y0 + j * sout] = {store}; }}\n}}\n}}\n}}\n",
        s = e.store(),
        c = e.compute(),
        lv = e.load("A[a0 + j * sin]"),
        store = e.store_expr("acc"),
    );
    Some(program_source(&name, "", &kernel))
}

/// The geometry of a 2-D window op (NHWC), with the strides of its two tensor operands
/// (`struct Geo` of [`WINDOW_HELPERS`]): read as `a_at(n, h, w, c)` / `b_at(..)`.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Geo {
    /// Batch, input height, width, channels.
    pub n: i64,
    /// Input height.
    pub h: i64,
    /// Input width.
    pub w: i64,
    /// Input channels.
    pub c: i64,
    /// Window height.
    pub kh: i64,
    /// Window width.
    pub kw: i64,
    /// Output height.
    pub oh: i64,
    /// Output width.
    pub ow: i64,
    /// Stride along height.
    pub sh: i64,
    /// Stride along width.
    pub sw: i64,
    /// Dilation along height.
    pub dh: i64,
    /// Dilation along width.
    pub dw: i64,
    /// Padding before, top.
    pub ph: i64,
    /// Padding before, left.
    pub pw: i64,
    /// Output channels (convolutions).
    pub cout: i64,
    /// First operand: offset and the steps of its four axes.
    pub a: [i64; 5],
    /// Second operand: offset and the steps of its four axes.
    pub b: [i64; 5],
}

// SAFETY: `Geo` is `repr(C)`, 25 `i64`s, and matches `struct Geo` in `WINDOW_HELPERS`.
unsafe impl cudarc::driver::DeviceRepr for Geo {}

/// The window ops' geometry type and helpers.
pub const WINDOW_HELPERS: &str = r#"
struct Geo {
    ff_i64 n, h, w, c, kh, kw, oh, ow, sh, sw, dh, dw, ph, pw, cout;
    ff_i64 a[5];
    ff_i64 b[5];
};
__device__ __forceinline__ ff_i64 a_at(const Geo& g, ff_i64 i0, ff_i64 i1, ff_i64 i2, ff_i64 i3) {
    return g.a[0] + i0 * g.a[1] + i1 * g.a[2] + i2 * g.a[3] + i3 * g.a[4];
}
__device__ __forceinline__ ff_i64 b_at(const Geo& g, ff_i64 i0, ff_i64 i1, ff_i64 i2, ff_i64 i3) {
    return g.b[0] + i0 * g.b[1] + i1 * g.b[2] + i2 * g.b[3] + i3 * g.b[4];
}
/* Input row of window row k at output row o, or -1 in the padding. */
__device__ __forceinline__ ff_i64 in_row(const Geo& g, ff_i64 o, ff_i64 k) {
    ff_i64 r = o * g.sh + k * g.dh - g.ph;
    return (r >= 0 && r < g.h) ? r : -1;
}
__device__ __forceinline__ ff_i64 in_col(const Geo& g, ff_i64 o, ff_i64 k) {
    ff_i64 r = o * g.sw + k * g.dw - g.pw;
    return (r >= 0 && r < g.w) ? r : -1;
}
/* Output row whose window row k covers input row h, or -1. */
__device__ __forceinline__ ff_i64 out_row(const Geo& g, ff_i64 h, ff_i64 k) {
    ff_i64 t = h + g.ph - k * g.dh;
    if (t < 0 || t % g.sh != 0) return -1;
    ff_i64 o = t / g.sh;
    return o < g.oh ? o : -1;
}
__device__ __forceinline__ ff_i64 out_col(const Geo& g, ff_i64 w, ff_i64 k) {
    ff_i64 t = w + g.pw - k * g.dw;
    if (t < 0 || t % g.sw != 0) return -1;
    ff_i64 o = t / g.sw;
    return o < g.ow ? o : -1;
}
"#;

/// A window kernel reading `operands` (1 to 3) tensors `A`, `B` (and a bias `C` read through
/// a view `vc`) of `e`.
fn window_kernel(name: &str, e: Elem, operands: usize, body: &str) -> KernelSource {
    let mut params = ["A", "B"][..operands.clamp(1, 2)]
        .iter()
        .map(|t| format!("const {}* __restrict__ {t}", e.store()))
        .collect::<Vec<_>>()
        .join(", ");
    if operands == 3 {
        params += &format!(", const {}* __restrict__ C, View vc", e.store());
    }
    let kernel = format!(
        "extern \"C\" __global__ void {name}({params}, {s}* __restrict__ Y, ff_i64 n_out, Geo g) {{\n\
         FF_LOOP(n_out) {{\n{body}\n}}\n}}\n",
        s = e.store()
    );
    program_source(name, WINDOW_HELPERS, &kernel)
}

/// Max or average pooling (NHWC) of a float type: output `i` folds the valid taps of its
/// window; a NaN wins a max, padding never does, the average counts valid taps only.
pub fn pool2d(kind: PoolKind, e: Elem) -> Option<KernelSource> {
    if !e.is_float() {
        return None;
    }
    let c = e.compute();
    let (init, combine, result) = match kind {
        PoolKind::MaxPool2d => (
            e.limits().0.to_string(),
            "if (v != v || (acc == acc && v > acc)) acc = v;",
            "acc".to_string(),
        ),
        PoolKind::AvgPool2d => (
            "0".to_string(),
            "acc = acc + v;",
            format!("acc / ({c})(count > 0 ? count : 1)"),
        ),
    };
    let name = format!("{}_{}", kind.name(), e.tag());
    let body = format!(
        "ff_i64 ch = i % g.c, ow = (i / g.c) % g.ow, oh = (i / (g.c * g.ow)) % g.oh, b = i / (g.c * g.ow * g.oh);\n\
         {c} acc = ({c}){init};\n\
         ff_i64 count = 0;\n\
         for (ff_i64 kh = 0; kh < g.kh; ++kh) {{\n\
         ff_i64 h = in_row(g, oh, kh);\n\
         if (h < 0) continue;\n\
         for (ff_i64 kw = 0; kw < g.kw; ++kw) {{\n\
         ff_i64 w = in_col(g, ow, kw);\n\
         if (w < 0) continue;\n\
         {c} v = {load};\n\
         {combine}\n\
         count += 1;\n}}\n}}\n\
         Y[i] = {store};",
        load = e.load("A[a_at(g, b, h, w, ch)]"),
        store = e.store_expr(&result),
    );
    Some(window_kernel(&name, e, 1, &body))
}

/// The gradient of max pooling: input element `i` sums the `dy` of every window whose first
/// maximum (NaN first, padding never) it is.
pub fn max_pool_grad(e: Elem) -> Option<KernelSource> {
    if !e.is_float() {
        return None;
    }
    let c = e.compute();
    let name = format!("max_pool_grad_{}", e.tag());
    let body = format!(
        "ff_i64 ch = i % g.c, w0 = (i / g.c) % g.w, h0 = (i / (g.c * g.w)) % g.h, b = i / (g.c * g.w * g.h);\n\
         {c} acc = 0;\n\
         for (ff_i64 kh = 0; kh < g.kh; ++kh) {{\n\
         ff_i64 oh = out_row(g, h0, kh);\n\
         if (oh < 0) continue;\n\
         for (ff_i64 kw = 0; kw < g.kw; ++kw) {{\n\
         ff_i64 ow = out_col(g, w0, kw);\n\
         if (ow < 0) continue;\n\
         {c} best = 0;\n\
         ff_i64 bh = -1, bw = -1;\n\
         for (ff_i64 p = 0; p < g.kh; ++p) {{\n\
         ff_i64 h = in_row(g, oh, p);\n\
         if (h < 0) continue;\n\
         for (ff_i64 q = 0; q < g.kw; ++q) {{\n\
         ff_i64 w = in_col(g, ow, q);\n\
         if (w < 0) continue;\n\
         {c} v = {lx};\n\
         if (bh < 0 || (best == best && (v != v || v > best))) {{ best = v; bh = h; bw = w; }}\n}}\n}}\n\
         if (bh == h0 && bw == w0) acc = acc + {ldy};\n}}\n}}\n\
         Y[i] = {store};",
        lx = e.load("A[a_at(g, b, h, w, ch)]"),
        ldy = e.load("B[b_at(g, b, oh, ow, ch)]"),
        store = e.store_expr("acc"),
    );
    Some(window_kernel(&name, e, 2, &body))
}

/// The gradient of average pooling: input element `i` sums `dy / valid taps` of every window
/// covering it.
pub fn avg_pool_grad(e: Elem) -> Option<KernelSource> {
    if !e.is_float() {
        return None;
    }
    let c = e.compute();
    let name = format!("avg_pool_grad_{}", e.tag());
    let body = format!(
        "ff_i64 ch = i % g.c, w0 = (i / g.c) % g.w, h0 = (i / (g.c * g.w)) % g.h, b = i / (g.c * g.w * g.h);\n\
         {c} acc = 0;\n\
         for (ff_i64 kh = 0; kh < g.kh; ++kh) {{\n\
         ff_i64 oh = out_row(g, h0, kh);\n\
         if (oh < 0) continue;\n\
         for (ff_i64 kw = 0; kw < g.kw; ++kw) {{\n\
         ff_i64 ow = out_col(g, w0, kw);\n\
         if (ow < 0) continue;\n\
         ff_i64 count = 0;\n\
         for (ff_i64 p = 0; p < g.kh; ++p) {{ if (in_row(g, oh, p) < 0) continue;\n\
         for (ff_i64 q = 0; q < g.kw; ++q) {{ if (in_col(g, ow, q) >= 0) count += 1; }} }}\n\
         acc = acc + {ldy} / ({c})(count > 0 ? count : 1);\n}}\n}}\n\
         Y[i] = {store};",
        ldy = e.load("A[a_at(g, b, oh, ow, ch)]"),
        store = e.store_expr("acc"),
    );
    Some(window_kernel(&name, e, 1, &body))
}

/// NHWC convolution with an HWIO filter, directly: output `(b, oh, ow, co)` sums
/// `x[b, h, w, ci] · f[kh, kw, ci, co]` over the valid taps (A = x, B = filter).
pub fn conv2d(e: Elem) -> Option<KernelSource> {
    conv2d_with(e, None)
}

/// `activation(conv2d(x, filter) + bias)` in one kernel (`Backend::fused_conv2d`): the
/// bias added to the sum and the activation applied before the one rounding to `e`.
pub fn fused_conv2d(e: Elem, activation: FusedActivation) -> Option<KernelSource> {
    conv2d_with(e, Some(activation))
}

fn conv2d_with(e: Elem, epilogue: Option<FusedActivation>) -> Option<KernelSource> {
    if !e.is_float() {
        return None;
    }
    let c = e.compute();
    let name = match epilogue {
        None => format!("conv2d_{}", e.tag()),
        Some(a) => format!(
            "fused_conv2d_{}_{}",
            format!("{a:?}").to_lowercase(),
            e.tag()
        ),
    };
    let finish = match epilogue {
        None => String::new(),
        Some(a) => format!(
            "acc = acc + {};\n{}",
            e.load("C[at(vc, co)]"),
            match a {
                FusedActivation::Linear => "",
                FusedActivation::Relu => "acc = acc < 0 ? 0 : acc;\n",
            }
        ),
    };
    let body = format!(
        "ff_i64 co = i % g.cout, ow = (i / g.cout) % g.ow, oh = (i / (g.cout * g.ow)) % g.oh, b = i / (g.cout * g.ow * g.oh);\n\
         {c} acc = 0;\n\
         for (ff_i64 kh = 0; kh < g.kh; ++kh) {{\n\
         ff_i64 h = in_row(g, oh, kh);\n\
         if (h < 0) continue;\n\
         for (ff_i64 kw = 0; kw < g.kw; ++kw) {{\n\
         ff_i64 w = in_col(g, ow, kw);\n\
         if (w < 0) continue;\n\
                  for (ff_i64 ci = 0; ci < g.c; ++ci) acc = acc + {lx} * {lf};\n}}\n}}\n\
         {finish}Y[i] = {store};",
        lx = e.load("A[a_at(g, b, h, w, ci)]"),
        lf = e.load("B[b_at(g, kh, kw, ci, co)]"),
        store = e.store_expr("acc"),
    );
    Some(window_kernel(
        &name,
        e,
        if epilogue.is_some() { 3 } else { 2 },
        &body,
    ))
}

/// The column matrix of a convolution's input (`im2col`): row `(b, oh, ow)` of
/// `[batch · oh · ow, kh · kw · c]` holds the window at that output position, `(kh, kw, c)`
/// in the filter's order, zeros in the padding; `A` read through `g.a`. A float
/// convolution is then one GEMM with the filter as `[kh · kw · c, cout]` (cuBLAS, tensor
/// cores), and its filter gradient the GEMM of the columns' transpose with `dy`.
pub fn im2col(e: Elem) -> Option<KernelSource> {
    if !e.is_float() {
        return None;
    }
    let name = format!("im2col_{}", e.tag());
    let body = format!(
        "ff_i64 row = g.kh * g.kw * g.c;
         ff_i64 k = i % row, m = i / row;
         ff_i64 ci = k % g.c, kw = (k / g.c) % g.kw, kh = k / (g.c * g.kw);
         ff_i64 ow = m % g.ow, oh = (m / g.ow) % g.oh, b = m / (g.ow * g.oh);
         ff_i64 r = in_row(g, oh, kh), q = in_col(g, ow, kw);
         Y[i] = (r < 0 || q < 0) ? {zero} : A[a_at(g, b, r, q, ci)];",
        zero = e.store_expr(if e == Elem::F64 { "0.0" } else { "0.0f" }),
    );
    Some(window_kernel(&name, e, 1, &body))
}

/// The input gradient from the columns' gradient (`col2im`): input element `(b, h, w, c)`
/// sums, in window order, the entries of the dense `[batch · oh · ow, kh · kw · c]` matrix
/// `A` of the output positions whose window covers it (a sum per input element: no atomics,
/// deterministic), in double, rounded once.
pub fn col2im(e: Elem) -> Option<KernelSource> {
    if !e.is_float() {
        return None;
    }
    let name = format!("col2im_{}", e.tag());
    let body = format!(
        "ff_i64 ci = i % g.c, w0 = (i / g.c) % g.w, h0 = (i / (g.c * g.w)) % g.h, b = i / (g.c * g.w * g.h);
         ff_i64 row = g.kh * g.kw * g.c;
         double acc = 0;
         for (ff_i64 kh = 0; kh < g.kh; ++kh) {{
         ff_i64 oh = out_row(g, h0, kh);
         if (oh < 0) continue;
         for (ff_i64 kw = 0; kw < g.kw; ++kw) {{
         ff_i64 ow = out_col(g, w0, kw);
         if (ow < 0) continue;
         acc = acc + (double){load};
}}
}}
         Y[i] = {store};",
        load = e.load("A[((b * g.oh + oh) * g.ow + ow) * row + (kh * g.kw + kw) * g.c + ci]"),
        store = e.store_expr("acc"),
    );
    Some(window_kernel(&name, e, 1, &body))
}

/// The gradient of conv2d with respect to its input: element `(b, h, w, ci)` sums
/// `dy[b, oh, ow, co] · f[kh, kw, ci, co]` over the outputs whose window covers it
/// (A = filter, B = dy).
pub fn conv2d_backprop_input(e: Elem) -> Option<KernelSource> {
    if !e.is_float() {
        return None;
    }
    let c = e.compute();
    let name = format!("conv2d_backprop_input_{}", e.tag());
    let body = format!(
        "ff_i64 ci = i % g.c, w0 = (i / g.c) % g.w, h0 = (i / (g.c * g.w)) % g.h, b = i / (g.c * g.w * g.h);\n\
         {c} acc = 0;\n\
         for (ff_i64 kh = 0; kh < g.kh; ++kh) {{\n\
         ff_i64 oh = out_row(g, h0, kh);\n\
         if (oh < 0) continue;\n\
         for (ff_i64 kw = 0; kw < g.kw; ++kw) {{\n\
         ff_i64 ow = out_col(g, w0, kw);\n\
         if (ow < 0) continue;\n\
         for (ff_i64 co = 0; co < g.cout; ++co) acc = acc + {ldy} * {lf};\n}}\n}}\n\
         Y[i] = {store};",
        ldy = e.load("B[b_at(g, b, oh, ow, co)]"),
        lf = e.load("A[a_at(g, kh, kw, ci, co)]"),
        store = e.store_expr("acc"),
    );
    Some(window_kernel(&name, e, 2, &body))
}

/// The gradient of conv2d with respect to its filter: element `(kh, kw, ci, co)` sums
/// `x[b, h, w, ci] · dy[b, oh, ow, co]` over the batch and the outputs (A = x, B = dy).
pub fn conv2d_backprop_filter(e: Elem) -> Option<KernelSource> {
    if !e.is_float() {
        return None;
    }
    let c = e.compute();
    let name = format!("conv2d_backprop_filter_{}", e.tag());
    let body = format!(
        "ff_i64 co = i % g.cout, ci = (i / g.cout) % g.c, kw = (i / (g.cout * g.c)) % g.kw, kh = i / (g.cout * g.c * g.kw);\n\
         {c} acc = 0;\n\
         for (ff_i64 b = 0; b < g.n; ++b) {{\n\
         for (ff_i64 oh = 0; oh < g.oh; ++oh) {{\n\
         ff_i64 h = in_row(g, oh, kh);\n\
         if (h < 0) continue;\n\
         for (ff_i64 ow = 0; ow < g.ow; ++ow) {{\n\
         ff_i64 w = in_col(g, ow, kw);\n\
         if (w < 0) continue;\n\
         acc = acc + {lx} * {ldy};\n}}\n}}\n}}\n\
         Y[i] = {store};",
        lx = e.load("A[a_at(g, b, h, w, ci)]"),
        ldy = e.load("B[b_at(g, b, oh, ow, co)]"),
        store = e.store_expr("acc"),
    );
    Some(window_kernel(&name, e, 2, &body))
}

/// Lines up to this long sort by rank ([`sort`]'s first kernel, one launch); longer ones
/// by merging (its other three, `2 + ⌈log2 m⌉` launches).
pub const SORT_RANK_MAX: usize = 256;

/// A stable sort along one axis, as the CPU backend orders: each element's unsigned key
/// (numbers ascending, -0 equal to 0, every NaN above everything; complemented for
/// descending), ties in index order, each value placed with its index (int32). Four
/// kernels:
/// - `sort_{t}` (lines of at most [`SORT_RANK_MAX`]): a thread per element places it at
///   its rank among its line's (key, index) pairs, comparing it with its whole line;
///   parameters `(A, kin, sin, Y, I, kout, sout, m, n, descending)`;
/// - `sort_keys_{t}`: each element's key and index into dense scratch `[lines, m]`
///   (`A, kin, sin, K, P, m, n, descending`);
/// - `sort_merge_{t}`: one pass of a merge sort over the scratch (`Kin, Pin, Kout, Pout, m,
///   n, w`): runs of `w` merged in pairs, each element placed by a binary search of the
///   other run (a left element after the right run's smaller keys, a right one after the
///   left run's keys not above it: stable); `w` = 1, 2, 4, .. while `w < m`;
/// - `sort_place_{t}`: the values and indices written in the sorted order (`A, kin, sin, Y,
///   I, kout, sout, m, n, P`: the rank kernel's, the order for the direction).
///
/// Both ways give the same bits: the (key, index) order is total.
pub fn sort(e: Elem) -> Option<[KernelSource; 4]> {
    if e == Elem::Bool {
        return None;
    }
    let t = e.tag();
    let key = if e.is_float() {
        "__device__ __forceinline__ unsigned long long ff_key(double x) {\n\
         const unsigned long long sign = 1ull << 63;\n\
         unsigned long long bits = (unsigned long long)__double_as_longlong(x);\n\
         if (x != x) return ~0ull;\n\
         if (x == 0.0) return sign;\n\
         return (bits & sign) ? ~bits : (bits | sign);\n}\n"
            .to_string()
    } else if e.is_signed_int() {
        format!(
            "__device__ __forceinline__ unsigned long long ff_key({} x) {{\n\
             return ((unsigned long long)(long long)x) ^ (1ull << 63);\n}}\n",
            e.compute()
        )
    } else {
        format!(
            "__device__ __forceinline__ unsigned long long ff_key({} x) {{ return (unsigned long long)x; }}\n",
            e.compute()
        )
    };
    let arg = if e.is_float() { "(double)" } else { "" };
    let s = e.store();
    let rank_name = format!("sort_{t}");
    let rank = format!(
        "extern \"C\" __global__ void {rank_name}(const {s}* __restrict__ A, View kin, ff_i64 sin, {s}* __restrict__ Y, \
         int* __restrict__ I, View kout, ff_i64 sout, ff_i64 m, ff_i64 n, int descending) {{\n\
         unsigned long long flip = descending ? ~0ull : 0ull;\n\
         FF_LOOP(n) {{\n\
         ff_i64 line = i / m, j = i % m;\n\
         ff_i64 a0 = at(kin, line);\n\
         unsigned long long kj = ff_key({arg}{lj}) ^ flip;\n\
         ff_i64 rank = 0;\n\
         for (ff_i64 k = 0; k < m; ++k) {{\n\
         unsigned long long kk = ff_key({arg}{lk}) ^ flip;\n\
         if (kk < kj || (kk == kj && k < j)) ++rank;\n}}\n\
         ff_i64 y = at(kout, line) + rank * sout;\n\
         Y[y] = A[a0 + j * sin];\n\
         I[y] = (int)j;\n}}\n}}\n",
        lj = e.load("A[a0 + j * sin]"),
        lk = e.load("A[a0 + k * sin]"),
    );
    let keys_name = format!("sort_keys_{t}");
    let keys = format!(
        "extern \"C\" __global__ void {keys_name}(const {s}* __restrict__ A, View kin, ff_i64 sin, \
         unsigned long long* __restrict__ K, int* __restrict__ P, ff_i64 m, ff_i64 n, int descending) {{\n\
         unsigned long long flip = descending ? ~0ull : 0ull;\n\
         FF_LOOP(n) {{\n\
         ff_i64 line = i / m, j = i % m;\n\
         K[i] = ff_key({arg}{lj}) ^ flip;\n\
         P[i] = (int)j;\n}}\n}}\n",
        lj = e.load("A[at(kin, line) + j * sin]"),
    );
    let merge_name = format!("sort_merge_{t}");
    let merge = format!(
        "extern \"C\" __global__ void {merge_name}(const unsigned long long* __restrict__ Kin, \
         const int* __restrict__ Pin, unsigned long long* __restrict__ Kout, int* __restrict__ Pout, \
         ff_i64 m, ff_i64 n, ff_i64 w) {{\n\
         FF_LOOP(n) {{\n\
         ff_i64 line = i / m, p = i % m;\n\
         const unsigned long long* L = Kin + line * m;\n\
         ff_i64 base = p - p % (2 * w);\n\
         ff_i64 mid = base + w < m ? base + w : m;\n\
         ff_i64 end = mid + w < m ? mid + w : m;\n\
         unsigned long long k = Kin[i];\n\
         ff_i64 lo, hi, place;\n\
         if (p < mid) {{\n\
         lo = mid; hi = end;\n\
         while (lo < hi) {{ ff_i64 c = lo + (hi - lo) / 2; if (L[c] < k) lo = c + 1; else hi = c; }}\n\
         place = base + (p - base) + (lo - mid);\n\
         }} else {{\n\
         lo = base; hi = mid;\n\
         while (lo < hi) {{ ff_i64 c = lo + (hi - lo) / 2; if (L[c] <= k) lo = c + 1; else hi = c; }}\n\
         place = base + (p - mid) + (lo - base);\n\
         }}\n\
         Kout[line * m + place] = k;\n\
         Pout[line * m + place] = Pin[i];\n}}\n}}\n"
    );
    let place_name = format!("sort_place_{t}");
    let place = format!(
        "extern \"C\" __global__ void {place_name}(const {s}* __restrict__ A, View kin, ff_i64 sin, \
         {s}* __restrict__ Y, int* __restrict__ I, View kout, ff_i64 sout, ff_i64 m, ff_i64 n, \
         const int* __restrict__ P) {{\n\
         FF_LOOP(n) {{\n\
         ff_i64 line = i / m, p = i % m;\n\
         int j = P[i];\n\
         ff_i64 y = at(kout, line) + p * sout;\n\
         Y[y] = A[at(kin, line) + (ff_i64)j * sin];\n\
         I[y] = j;\n}}\n}}\n"
    );
    Some([
        program_source(&rank_name, &key, &rank),
        program_source(&keys_name, &key, &keys),
        program_source(&merge_name, "", &merge),
        program_source(&place_name, "", &place),
    ])
}

/// Integer matrix products (cuBLAS has none): `Y[p, i, j] = Σ_l A[p, i, l] · B[p, l, j]` over
/// dense operands, wrapping, a thread per output.
pub fn matmul_int(e: Elem) -> Option<KernelSource> {
    if !(e.is_signed_int() || e.is_unsigned_int()) {
        return None;
    }
    let name = format!("matmul_{}", e.tag());
    let kernel = format!(
        "extern \"C\" __global__ void {name}(const {s}* __restrict__ A, const {s}* __restrict__ B, {s}* __restrict__ Y, \
         ff_i64 m, ff_i64 k, ff_i64 n, ff_i64 total) {{\n\
         FF_LOOP(total) {{\n\
         ff_i64 j = i % n, r = (i / n) % m, p = i / (n * m);\n\
         {w} acc = 0;\n\
         for (ff_i64 l = 0; l < k; ++l) acc += ({w})A[(p * m + r) * k + l] * ({w})B[(p * k + l) * n + j];\n\
         Y[i] = ({s})acc;\n}}\n}}\n",
        s = e.store(),
        w = e.wide(),
    );
    Some(program_source(&name, "", &kernel))
}

/// The fused optimizer updates (`Backend::optimizer_update`), one kernel per rule.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum OptimizerKind {
    /// SGD with momentum (Nesterov by a scalar).
    Sgd,
    /// Adam / AdamW (decoupled decay by a scalar).
    Adam,
    /// RMSprop.
    RmsProp,
    /// Centered RMSprop.
    RmsPropCentered,
    /// Adagrad.
    Adagrad,
    /// Adadelta.
    Adadelta,
    /// Adamax.
    Adamax,
}

impl OptimizerKind {
    /// Every rule, for the catalog.
    pub const ALL: [OptimizerKind; 7] = [
        OptimizerKind::Sgd,
        OptimizerKind::Adam,
        OptimizerKind::RmsProp,
        OptimizerKind::RmsPropCentered,
        OptimizerKind::Adagrad,
        OptimizerKind::Adadelta,
        OptimizerKind::Adamax,
    ];

    /// The kernel of `rule` and its five scalars `p0..p4`.
    pub fn of(rule: &ferroflow_tensor::UpdateRule) -> (OptimizerKind, [f64; 5]) {
        use ferroflow_tensor::UpdateRule as R;
        match *rule {
            R::SgdMomentum {
                lr,
                momentum,
                nesterov,
            } => (
                OptimizerKind::Sgd,
                [lr, momentum, f64::from(u8::from(nesterov)), 0.0, 0.0],
            ),
            R::Adam {
                lr_t,
                beta_1,
                beta_2,
                epsilon,
                decay,
            } => (OptimizerKind::Adam, [lr_t, beta_1, beta_2, epsilon, decay]),
            R::RmsProp {
                lr,
                rho,
                epsilon,
                centered: false,
            } => (OptimizerKind::RmsProp, [lr, rho, epsilon, 0.0, 0.0]),
            R::RmsProp {
                lr,
                rho,
                epsilon,
                centered: true,
            } => (OptimizerKind::RmsPropCentered, [lr, rho, epsilon, 0.0, 0.0]),
            R::Adagrad { lr, epsilon } => (OptimizerKind::Adagrad, [lr, epsilon, 0.0, 0.0, 0.0]),
            R::Adadelta { lr, rho, epsilon } => {
                (OptimizerKind::Adadelta, [lr, rho, epsilon, 0.0, 0.0])
            }
            R::Adamax {
                lr_t,
                beta_1,
                beta_2,
                epsilon,
            } => (OptimizerKind::Adamax, [lr_t, beta_1, beta_2, epsilon, 0.0]),
        }
    }

    /// How many slots the rule reads and writes.
    pub fn slots(self) -> usize {
        match self {
            OptimizerKind::Sgd | OptimizerKind::RmsProp | OptimizerKind::Adagrad => 1,
            _ => 2,
        }
    }
}

/// A rule's update of one element in `e` (f32/f64): reads `w`, `g`, `s0`, `s1` and the
/// scalars `p0..p4`, writes `Y[i]` (w') and the slots `Z[i]`, `K[i]`.
fn update_body(kind: OptimizerKind, e: Elem) -> String {
    let t = e.store();
    let one = if e == Elem::F64 { "1.0" } else { "1.0f" };
    let m = |f: &str| e.math(f);
    match kind {
        OptimizerKind::Sgd => format!(
            "{t} s0n = s0 * p1 - g * p0;\n Z[i] = s0n;\n Y[i] = p2 != 0 ? w + (s0n * p1 - g * p0) : w + s0n;"
        ),
        OptimizerKind::Adam => format!(
            "{t} s0n = s0 + (g - s0) * ({one} - p1);\n {t} s1n = s1 + (g * g - s1) * ({one} - p2);\n \
             Z[i] = s0n;\n K[i] = s1n;\n Y[i] = (w - p4 * w) - (s0n * p0) / ({sqrt}(s1n) + p3);",
            sqrt = m("sqrt")
        ),
        OptimizerKind::RmsProp => format!(
            "{t} s0n = p1 * s0 + ({one} - p1) * (g * g);\n Z[i] = s0n;\n Y[i] = w - (p0 * g) / ({sqrt}(s0n) + p2);",
            sqrt = m("sqrt")
        ),
        OptimizerKind::RmsPropCentered => format!(
            "{t} s0n = p1 * s0 + ({one} - p1) * (g * g);\n {t} s1n = p1 * s1 + ({one} - p1) * g;\n \
             Z[i] = s0n;\n K[i] = s1n;\n Y[i] = w - (p0 * g) / ({sqrt}(s0n - s1n * s1n) + p2);",
            sqrt = m("sqrt")
        ),
        OptimizerKind::Adagrad => format!(
            "{t} s0n = s0 + g * g;\n Z[i] = s0n;\n Y[i] = w - (g * p0) / ({sqrt}(s0n) + p1);",
            sqrt = m("sqrt")
        ),
        OptimizerKind::Adadelta => format!(
            "{t} s0n = s0 * p1 + (g * g) * ({one} - p1);\n \
             {t} u = {sqrt}(s1 + p2) * ({one} / {sqrt}(s0n + p2)) * g;\n \
             Z[i] = s0n;\n K[i] = s1 * p1 + (u * u) * ({one} - p1);\n Y[i] = w - u * p0;",
            sqrt = m("sqrt")
        ),
        OptimizerKind::Adamax => format!(
            "{t} s0n = s0 + (g - s0) * ({one} - p1);\n {t} s1n = {max}(p2 * s1, {abs}(g));\n \
             Z[i] = s0n;\n K[i] = s1n;\n Y[i] = w - p0 * (s0n / (s1n + p3));",
            max = m("fmax"),
            abs = m("fabs")
        ),
    }
}

/// One optimizer step per element for float32 or float64 variables: the rule's formula in
/// TensorFlow's order of operations (the CPU backend's and the wgpu backend's), the scalars
/// `p0..p4` in the variable's type. `W`, `G` and the slots are read through views; the new
/// variable goes to `Y`, the new slots to `Z` and `K`.
pub fn optimizer(kind: OptimizerKind, e: Elem) -> Option<KernelSource> {
    if !matches!(e, Elem::F32 | Elem::F64) {
        return None;
    }
    let t = e.store();
    let body = update_body(kind, e);
    let ns = kind.slots();
    let mut params =
        format!("const {t}* __restrict__ W, View vw, const {t}* __restrict__ G, View vg");
    let mut loads = "{t} w = W[at(vw, i)];\n {t} g = G[at(vg, i)];\n".replace("{t}", t);
    for (slot, name) in ["S0", "S1"].iter().enumerate().take(ns) {
        params += &format!(", const {t}* __restrict__ {name}, View v{slot}");
        loads += &format!(" {t} s{slot} = {name}[at(v{slot}, i)];\n");
    }
    params += &format!(", {t}* __restrict__ Y");
    for name in ["Z", "K"].iter().take(ns) {
        params += &format!(", {t}* __restrict__ {name}");
    }
    params += &format!(", ff_i64 n, {t} p0, {t} p1, {t} p2, {t} p3, {t} p4");
    let name = format!(
        "optimizer_{}_{}",
        format!("{kind:?}").to_lowercase(),
        e.tag()
    );
    let kernel = format!(
        "extern \"C\" __global__ void {name}({params}) {{\n\
         FF_LOOP(n) {{\n {loads} {body}\n}}\n}}\n"
    );
    Some(program_source(&name, "", &kernel))
}

/// The most variables one [`optimizer_group`] kernel updates (its parameters stay far
/// below CUDA's 4 KB: 12 words per variable at most).
pub const OPTIMIZER_GROUP_MAX: usize = 16;

/// [`optimizer`] for `count` dense variables in one kernel: the variables' elements one
/// after another as one index space, each thread finding its variable by the running ends
/// `e0, e1, ..` and updating that element as [`optimizer`] does. Per variable `v`: `W{v}`,
/// `G{v}`, its slots `S{v}_0`, `S{v}_1`, the outputs `Y{v}`, `Z{v}`, `K{v}`, its end `e{v}`
/// and its inputs' element offsets `o{v}_w`, `o{v}_g`, `o{v}_0`, `o{v}_1`; then `n` and
/// `p0..p4`. `None` for other types or more than [`OPTIMIZER_GROUP_MAX`] variables.
pub fn optimizer_group(kind: OptimizerKind, e: Elem, count: usize) -> Option<KernelSource> {
    if !matches!(e, Elem::F32 | Elem::F64) || count == 0 || count > OPTIMIZER_GROUP_MAX {
        return None;
    }
    let t = e.store();
    let ns = kind.slots();
    let body = update_body(kind, e);
    let mut params = vec![];
    let mut branches = String::new();
    for v in 0..count {
        params.push(format!("const {t}* __restrict__ W{v}"));
        params.push(format!("const {t}* __restrict__ G{v}"));
        for k in 0..ns {
            params.push(format!("const {t}* __restrict__ S{v}_{k}"));
        }
        params.push(format!("{t}* __restrict__ Y{v}"));
        for name in ["Z", "K"].iter().take(ns) {
            params.push(format!("{t}* __restrict__ {name}{v}"));
        }
        params.push(format!("ff_i64 e{v}"));
        params.push(format!("ff_i64 o{v}_w"));
        params.push(format!("ff_i64 o{v}_g"));
        for k in 0..ns {
            params.push(format!("ff_i64 o{v}_{k}"));
        }
        let start = if v == 0 {
            "0".to_string()
        } else {
            format!("e{}", v - 1)
        };
        let keyword = if v == 0 { "if" } else { " else if" };
        let mut loads = format!(
            " ff_i64 j = i - {start};\n {t} w = W{v}[o{v}_w + j];\n {t} g = G{v}[o{v}_g + j];\n"
        );
        for k in 0..ns {
            loads += &format!(" {t} s{k} = S{v}_{k}[o{v}_{k} + j];\n");
        }
        let update = body
            .replace("Y[i]", &format!("Y{v}[j]"))
            .replace("Z[i]", &format!("Z{v}[j]"))
            .replace("K[i]", &format!("K{v}[j]"));
        branches += &format!("{keyword} (i < e{v}) {{\n{loads} {update}\n }}");
    }
    params.push("ff_i64 n".to_string());
    params.extend((0..5).map(|k| format!("{t} p{k}")));
    let name = format!(
        "optimizer_group_{}_{}_{count}",
        format!("{kind:?}").to_lowercase(),
        e.tag()
    );
    let kernel = format!(
        "extern \"C\" __global__ void {name}({}) {{\n\
         FF_LOOP(n) {{\n {branches}\n}}\n}}\n",
        params.join(", ")
    );
    Some(program_source(&name, "", &kernel))
}

/// Group kernels for the NVRTC check (generated at run time per variable count, so the
/// [`catalog`] holds none): every rule, f32 and f64, three variables.
pub fn optimizer_group_samples() -> Vec<KernelSource> {
    let mut all = vec![];
    for e in [Elem::F32, Elem::F64] {
        for kind in OptimizerKind::ALL {
            all.extend(optimizer_group(kind, e, 3));
        }
    }
    all
}

/// `min(max(x, lo), hi)` with the bounds converted to `e` as Rust's `as` / the half crate
/// convert them (the CPU backend's `from_f64`): a NaN stays NaN.
pub fn clip_scalar(e: Elem) -> Option<KernelSource> {
    if e == Elem::Bool {
        return None;
    }
    let c = e.compute();
    let bound = |var: &str| {
        format!(
            "{{ double v = {var}; {var}_c = {}; }}",
            e.load(&e.store_expr(&cast_expr(Elem::F64, e)))
        )
    };
    let name = format!("clip_scalar_{}", e.tag());
    let kernel = format!(
        "extern \"C\" __global__ void {name}(const {s}* __restrict__ A, View va, {s}* __restrict__ Y, ff_i64 n, \
         double lo, double hi) {{\n\
         {c} lo_c, hi_c;\n{blo}\n{bhi}\n\
         FF_LOOP(n) {{\n\
         {c} x = {load};\n\
         {c} m = x < lo_c ? lo_c : x;\n\
         Y[i] = {store};\n}}\n}}\n",
        s = e.store(),
        blo = bound("lo"),
        bhi = bound("hi"),
        load = e.load("A[at(va, i)]"),
        store = e.store_expr("(m > hi_c ? hi_c : m)"),
    );
    Some(program_source(&name, "", &kernel))
}

/// Inputs one elementwise-program kernel reads: each is a pointer and a [`View`] by value
/// (152 bytes), and 16 of them with the reduction's two views and
/// [`MAX_PROGRAM_OUTPUTS`] output pointers stay inside CUDA's 4 KB of kernel parameters
/// (3.3 KB). A wider program runs op by op.
pub const MAX_PROGRAM_INPUTS: usize = 16;
/// Outputs one elementwise-program kernel writes (8-byte pointers).
pub const MAX_PROGRAM_OUTPUTS: usize = 64;

/// The expression rounding a register of the compute type as a store and a load of `e`
/// round it: each step of a program on a half type is rounded where the op's own kernel
/// stores it, so the program's results equal the ops' one by one, bit for bit.
fn rounded(e: Elem, v: &str) -> String {
    match e {
        Elem::F16 | Elem::BF16 => e.load(&e.store_expr(v)),
        _ => v.to_string(),
    }
}

/// A program's helper functions (one per step, each the op's own kernel expression) and
/// the statements computing its registers `r0..` at dense element `i`, input `k` read
/// through view `v{k}`; `None` where a step has no float kernel of `e` or checks its
/// operands (integer division: not fusible).
fn program_steps(program: &ElementwiseProgram, e: Elem) -> Option<(String, String)> {
    if !e.is_float() {
        return None;
    }
    let c = e.compute();
    let mut helpers = binary_helpers(e);
    let mut body = String::new();
    for k in 0..program.num_inputs {
        body += &format!(
            "    {c} r{k} = {};\n",
            e.load(&format!("X{k}[at(v{k}, i)]"))
        );
    }
    for (k, step) in program.steps.iter().enumerate() {
        let r = program.num_inputs + k;
        let call = match *step {
            ElementwiseStep::Unary(op, a) => {
                let expr = unary_expr(op, e)?;
                helpers += &format!(
                    "__device__ __forceinline__ {c} ff_step{k}({c} x) {{ return {expr}; }}\n"
                );
                format!("ff_step{k}(r{a})")
            }
            ElementwiseStep::Binary(op, a, b) => {
                let (expr, div_check, pow_check) = binary_expr(op, e)?;
                if div_check || pow_check {
                    return None;
                }
                helpers += &format!(
                    "__device__ __forceinline__ {c} ff_step{k}({c} a, {c} b) {{ return {expr}; }}\n"
                );
                format!("ff_step{k}(r{a}, r{b})")
            }
        };
        body += &format!(
            "    {c} r{r} = {};\n",
            rounded(e, &format!("({c})({call})"))
        );
    }
    Some((helpers, body))
}

/// The parameters reading a program's inputs: `const S* X0, View v0, ...`.
fn program_inputs(program: &ElementwiseProgram, e: Elem) -> String {
    (0..program.num_inputs)
        .map(|k| format!("const {}* __restrict__ X{k}, View v{k}, ", e.store()))
        .collect()
}

/// The parameters of outputs `from..` of a program: `S* O1, ...`.
fn program_outputs(program: &ElementwiseProgram, e: Elem, from: usize) -> String {
    (from..program.outputs.len())
        .map(|k| format!("{}* __restrict__ O{k}, ", e.store()))
        .collect()
}

/// The kernel running `program` on element type `e` over `n` elements of its broadcast
/// shape, named `fused_{e}_p{id}`: one thread per element reads each input through its
/// view, computes every step in registers and writes each output (dense). Parameters:
/// `(X0, v0, .., O0, .., n)`.
pub fn fused_program(program: &ElementwiseProgram, e: Elem, id: usize) -> Option<KernelSource> {
    if program.check().is_err()
        || program.num_inputs > MAX_PROGRAM_INPUTS
        || program.outputs.len() > MAX_PROGRAM_OUTPUTS
    {
        return None;
    }
    let (helpers, mut body) = program_steps(program, e)?;
    for (k, r) in program.outputs.iter().enumerate() {
        body += &format!("    O{k}[i] = {};\n", e.store_expr(&format!("r{r}")));
    }
    let name = format!("fused_{}_p{id}", e.tag());
    let kernel = format!(
        "extern \"C\" __global__ void {name}({ins}{outs}ff_i64 n) {{\nFF_LOOP(n) {{\n{body}}}\n}}\n",
        ins = program_inputs(program, e),
        outs = program_outputs(program, e, 0),
    );
    Some(program_source(&name, &helpers, &kernel))
}

/// `program` with reduction `op` of its first output in the loads of the reduction
/// kernels (as [`reduce`]'s, `_rows` and `_blocks`, named `fused_{op}_{e}_p{id}_..`): the
/// program runs once per element of its (dense) shape, writes its other outputs there
/// (each element is read once) and hands the first, rounded as stored, to the reduction,
/// which folds it in the order it folds a stored tensor: the same bits as the program's
/// output reduced on its own. Parameters: `(X0, v0, .., kept, red, m, Y, O1, .., [n])`.
pub fn fused_program_reduce(
    program: &ElementwiseProgram,
    op: ReduceOp,
    e: Elem,
    id: usize,
) -> Option<[KernelSource; 4]> {
    if program.check().is_err()
        || program.num_inputs > MAX_PROGRAM_INPUTS
        || program.outputs.len() > MAX_PROGRAM_OUTPUTS
    {
        return None;
    }
    let (helpers, mut body) = program_steps(program, e)?;
    for (k, r) in program.outputs.iter().enumerate().skip(1) {
        body += &format!("    O{k}[i] = {};\n", e.store_expr(&format!("r{r}")));
    }
    let c = e.compute();
    let ins = program_inputs(program, e);
    let outs = program_outputs(program, e, 1);
    // The program at element `i` as a function of its own (inlined), returning the first
    // output; the names `X*`, `v*`, `O*` pass through unchanged.
    let args: String = (0..program.num_inputs)
        .map(|k| format!("X{k}, v{k}, "))
        .chain((1..program.outputs.len()).map(|k| format!("O{k}, ")))
        .collect();
    let value = format!(
        "__device__ __forceinline__ {c} ff_value({}{}ff_i64 i) {{\n{body}    return r{};\n}}\n",
        ins.replace(", View v", ", const View& v"),
        outs,
        program.outputs[0]
    );
    let extra = format!(", {}", outs.trim_end_matches(", "));
    reduction_kernels(
        &format!("fused_{}_{}_p{id}", op.name(), e.tag()),
        op,
        e,
        &ins,
        if outs.is_empty() { "" } else { &extra },
        &format!("ff_value({args}base + at(red, j))"),
        &format!("{helpers}{value}"),
    )
}

/// A program using every fusible op (each unary op of the first input, each binary op of
/// the two inputs, and a chain through earlier results), returning every step's result.
pub fn program_with_every_op() -> ElementwiseProgram {
    let mut steps: Vec<ElementwiseStep> = UnaryOp::ALL
        .iter()
        .filter(|&&op| ElementwiseProgram::fusible_unary(op))
        .map(|&op| ElementwiseStep::Unary(op, 0))
        .chain(
            BinaryOp::ALL
                .iter()
                .filter(|&&op| ElementwiseProgram::fusible_binary(op))
                .map(|&op| ElementwiseStep::Binary(op, 0, 1)),
        )
        .collect();
    let n = 2 + steps.len();
    steps.push(ElementwiseStep::Binary(BinaryOp::Mul, n - 1, 1));
    steps.push(ElementwiseStep::Unary(UnaryOp::Tanh, n));
    let end = 2 + steps.len();
    ElementwiseProgram {
        num_inputs: 2,
        steps,
        outputs: (2..end).collect(),
    }
}

/// Program kernels for the NVRTC check (programs are generated at run time, so the
/// [`catalog`] holds none): [`program_with_every_op`] in each float type, alone and with
/// each reduction of floats in its loads.
pub fn program_samples() -> Vec<KernelSource> {
    let program = program_with_every_op();
    let mut all = vec![];
    for e in [Elem::F16, Elem::BF16, Elem::F32, Elem::F64] {
        all.extend(fused_program(&program, e, 0));
        for op in [
            ReduceOp::ReduceSum,
            ReduceOp::ReduceMean,
            ReduceOp::ReduceProd,
            ReduceOp::ReduceMax,
            ReduceOp::ReduceMin,
        ] {
            all.extend(
                fused_program_reduce(&program, op, e, 0)
                    .into_iter()
                    .flatten(),
            );
        }
    }
    all
}

/// The kernels of an elementwise program on `e`, with a reduction of its first output or
/// none, generated once per process and named by the program's number in this process
/// (the first program seen is `p0`): `None` where the program has no kernel of `e`.
pub fn generated_program(
    program: &ElementwiseProgram,
    e: Elem,
    reduce: Option<ReduceOp>,
) -> Option<std::sync::Arc<Generated>> {
    use std::collections::HashMap;
    use std::sync::{Arc, Mutex, OnceLock};
    /// A program's number and its kernels per (type, reduction), looked up by the program
    /// itself: a launch clones nothing.
    struct Program {
        id: usize,
        kernels: HashMap<(Elem, Option<ReduceOp>), Option<Arc<Generated>>>,
    }
    static MEMO: OnceLock<Mutex<HashMap<ElementwiseProgram, Program>>> = OnceLock::new();
    let mut memo = MEMO
        .get_or_init(Default::default)
        .lock()
        .unwrap_or_else(|e| e.into_inner());
    if let Some(hit) = memo.get(program).and_then(|p| p.kernels.get(&(e, reduce))) {
        return hit.clone();
    }
    let next = memo.len();
    let entry = memo.entry(program.clone()).or_insert_with(|| Program {
        id: next,
        kernels: HashMap::new(),
    });
    let kernels = match reduce {
        None => fused_program(program, e, entry.id).map(|k| vec![k]),
        Some(op) => fused_program_reduce(program, op, e, entry.id).map(|ks| ks.to_vec()),
    };
    let made = kernels.map(|kernels| {
        Arc::new(Generated {
            kernels,
            checked: false,
        })
    });
    entry.kernels.insert((e, reduce), made.clone());
    made
}

/// Philox4x32-10 (the host's `ferroflow_tensor::random::Philox`): block `b` of the stream
/// for seed `(s0, s1)` is the rounds applied to the counter `[b, s1]` (128 bits, little
/// end first) under the key `s0`, and `ff_unit` the host's 53-bit uniform from two words.
const PHILOX: &str = r#"
__device__ __forceinline__ void ff_philox(ff_i64 s0, ff_i64 s1, unsigned long long b, unsigned int w[4]) {
    unsigned int c0 = (unsigned int)b, c1 = (unsigned int)(b >> 32);
    unsigned int c2 = (unsigned int)s1, c3 = (unsigned int)((unsigned long long)s1 >> 32);
    unsigned int k0 = (unsigned int)s0, k1 = (unsigned int)((unsigned long long)s0 >> 32);
    for (int r = 0; r < 10; ++r) {
        unsigned long long p0 = 0xD2511F53ull * (unsigned long long)c0;
        unsigned long long p1 = 0xCD9E8D57ull * (unsigned long long)c2;
        unsigned int n0 = (unsigned int)(p1 >> 32) ^ c1 ^ k0;
        unsigned int n1 = (unsigned int)p1;
        unsigned int n2 = (unsigned int)(p0 >> 32) ^ c3 ^ k1;
        unsigned int n3 = (unsigned int)p0;
        c0 = n0; c1 = n1; c2 = n2; c3 = n3;
        k0 += 0x9E3779B9u;
        k1 += 0xBB67AE85u;
    }
    w[0] = c0; w[1] = c1; w[2] = c2; w[3] = c3;
}
__device__ __forceinline__ double ff_unit(unsigned int a, unsigned int b) {
    unsigned long long hi = a >> 5, lo = b >> 6;
    return (double)((hi << 26) | lo) / 9007199254740992.0;
}
"#;

/// Uniform numbers on `e` from the Philox stream (`random::stateless_uniform`'s): element
/// `i` from words `2i` and `2i + 1`, `a + b·u` for floats (`a` = minval, `b` = maxval −
/// minval), `a + ⌊u·b⌋` for integers (`a` = ⌈minval⌉, `b` the span), in double, then
/// converted as the host converts. Parameters `(Y, n, s0, s1, a, b)`.
pub fn random_uniform(e: Elem) -> Option<KernelSource> {
    if e == Elem::Bool {
        return None;
    }
    let name = format!("random_uniform_{}", e.tag());
    let value = if e.is_float() {
        "a + b * u"
    } else {
        "a + floor(u * b)"
    };
    let kernel = format!(
        "extern \"C\" __global__ void {name}({s}* __restrict__ Y, ff_i64 n, ff_i64 s0, ff_i64 s1, double a, double b) {{\n\
         FF_LOOP(n) {{\n\
         unsigned int w[4];\n\
         ff_philox(s0, s1, (unsigned long long)i >> 1, w);\n\
         unsigned int lane = 2 * (unsigned int)(i & 1);\n\
         double u = ff_unit(w[lane], w[lane + 1]);\n\
         double v = {value};\n\
         Y[i] = {store};\n}}\n}}\n",
        s = e.store(),
        store = e.store_expr(&cast_expr(Elem::F64, e)),
    );
    Some(program_source(&name, PHILOX, &kernel))
}

/// Normal numbers on float `e` from the Philox stream (`random::stateless_normal`'s):
/// element `i` from block `i` (Box-Muller of its two 53-bit uniforms), `mean + stddev·z` in
/// double, converted as the host converts. Parameters `(Y, n, s0, s1, mean, stddev)`.
pub fn random_normal(e: Elem) -> Option<KernelSource> {
    if !e.is_float() {
        return None;
    }
    let name = format!("random_normal_{}", e.tag());
    let kernel = format!(
        "extern \"C\" __global__ void {name}({s}* __restrict__ Y, ff_i64 n, ff_i64 s0, ff_i64 s1, double mean, double stddev) {{\n\
         FF_LOOP(n) {{\n\
         unsigned int w[4];\n\
         ff_philox(s0, s1, (unsigned long long)i, w);\n\
         double u1 = 1.0 - ff_unit(w[0], w[1]);\n\
         double u2 = ff_unit(w[2], w[3]);\n\
         double z = sqrt(-2.0 * log(u1)) * cos(6.283185307179586 * u2);\n\
         double v = mean + stddev * z;\n\
         Y[i] = {store};\n}}\n}}\n",
        s = e.store(),
        store = e.store_expr(&cast_expr(Elem::F64, e)),
    );
    Some(program_source(&name, PHILOX, &kernel))
}

/// Which generated kernel (or kernels: a reduction has two) an op needs: the key of
/// [`generated`].
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum KernelKey {
    /// [`unary`] (op, input, output).
    Unary(UnaryOp, Elem, Elem),
    /// [`binary`] (op, input, output).
    Binary(BinaryOp, Elem, Elem),
    /// [`reduce`]: the thread-per-output and block-per-output kernels.
    Reduce(ReduceOp, Elem),
    /// [`arg_reduce`].
    ArgReduce(ArgReduceOp, Elem),
    /// [`cast`] (from, to).
    Cast(Elem, Elem),
    /// [`select`].
    Select(Elem),
    /// [`copy_into`].
    CopyInto(Elem),
    /// [`fill`].
    Fill(Elem),
    /// [`gather`] (values, indices).
    Gather(Elem, Elem),
    /// [`scatter_add`] (values, indices).
    ScatterAdd(Elem, Elem),
    /// [`cumulative`].
    Cumulative(CumulativeOp, Elem),
    /// [`sort`].
    Sort(Elem),
    /// [`matmul_int`].
    MatmulInt(Elem),
    /// [`pool2d`].
    Pool(PoolKind, Elem),
    /// [`max_pool_grad`].
    MaxPoolGrad(Elem),
    /// [`avg_pool_grad`].
    AvgPoolGrad(Elem),
    /// [`conv2d`].
    Conv2d(Elem),
    /// [`conv2d_backprop_input`].
    Conv2dBackpropInput(Elem),
    /// [`conv2d_backprop_filter`].
    Conv2dBackpropFilter(Elem),
    /// [`im2col`].
    Im2col(Elem),
    /// [`col2im`].
    Col2im(Elem),
    /// [`random_uniform`].
    RandomUniform(Elem),
    /// [`random_normal`].
    RandomNormal(Elem),
    /// [`optimizer`].
    Optimizer(OptimizerKind, Elem),
    /// [`optimizer_group`] of this many variables.
    OptimizerGroup(OptimizerKind, Elem, usize),
    /// [`fused_conv2d`].
    FusedConv2d(Elem, FusedActivation),
    /// [`clip_scalar`].
    ClipScalar(Elem),
    /// [`sparse_softmax_xent`]: logits and labels.
    SparseSoftmaxXent(Elem, Elem),
}

/// An op's generated kernels, and whether they write the error word.
#[derive(Debug)]
pub struct Generated {
    /// The kernels, in the order the generator returns them.
    pub kernels: Vec<KernelSource>,
    /// True when the host must clear and read the error word around them.
    pub checked: bool,
}

/// The kernels of `key`, generated once per process (a launch then costs a map lookup, not
/// the source text), or `None` where the backend has no such kernel.
pub fn generated(key: KernelKey) -> Option<std::sync::Arc<Generated>> {
    use std::collections::HashMap;
    use std::sync::{Arc, Mutex, OnceLock};
    type Memo = Mutex<HashMap<KernelKey, Option<Arc<Generated>>>>;
    static MEMO: OnceLock<Memo> = OnceLock::new();
    let memo = MEMO.get_or_init(Default::default);
    if let Some(hit) = memo.lock().unwrap_or_else(|e| e.into_inner()).get(&key) {
        return hit.clone();
    }
    let one = |k: Option<KernelSource>| k.map(|k| (vec![k], false));
    let made = match key {
        KernelKey::Unary(op, e, out) => one(unary(op, e, out)),
        KernelKey::Binary(op, e, out) => binary(op, e, out).map(|(k, checked)| (vec![k], checked)),
        KernelKey::Reduce(op, e) => reduce(op, e).map(|ks| (ks.to_vec(), false)),
        KernelKey::ArgReduce(op, e) => arg_reduce(op, e).map(|ks| (ks.to_vec(), false)),
        KernelKey::Cast(from, to) => one(Some(cast(from, to))),
        KernelKey::Select(e) => one(Some(select(e))),
        KernelKey::CopyInto(e) => one(Some(copy_into(e))),
        KernelKey::Fill(e) => one(Some(fill(e))),
        KernelKey::Gather(e, ie) => gather(e, ie).map(|k| (vec![k], true)),
        KernelKey::ScatterAdd(e, ie) => scatter_add(e, ie).map(|ks| (ks.to_vec(), true)),
        KernelKey::SparseSoftmaxXent(e, ie) => {
            sparse_softmax_xent(e, ie).map(|ks| (ks.to_vec(), true))
        }
        KernelKey::Cumulative(op, e) => one(cumulative(op, e)),
        KernelKey::Sort(e) => sort(e).map(|ks| (ks.to_vec(), false)),
        KernelKey::MatmulInt(e) => one(matmul_int(e)),
        KernelKey::Pool(kind, e) => one(pool2d(kind, e)),
        KernelKey::MaxPoolGrad(e) => one(max_pool_grad(e)),
        KernelKey::AvgPoolGrad(e) => one(avg_pool_grad(e)),
        KernelKey::Conv2d(e) => one(conv2d(e)),
        KernelKey::Conv2dBackpropInput(e) => one(conv2d_backprop_input(e)),
        KernelKey::Conv2dBackpropFilter(e) => one(conv2d_backprop_filter(e)),
        KernelKey::Im2col(e) => one(im2col(e)),
        KernelKey::Col2im(e) => one(col2im(e)),
        KernelKey::RandomUniform(e) => one(random_uniform(e)),
        KernelKey::RandomNormal(e) => one(random_normal(e)),
        KernelKey::Optimizer(kind, e) => one(optimizer(kind, e)),
        KernelKey::OptimizerGroup(kind, e, count) => one(optimizer_group(kind, e, count)),
        KernelKey::FusedConv2d(e, a) => one(fused_conv2d(e, a)),
        KernelKey::ClipScalar(e) => one(clip_scalar(e)),
    }
    .map(|(kernels, checked)| Arc::new(Generated { kernels, checked }));
    memo.lock()
        .unwrap_or_else(|e| e.into_inner())
        .insert(key, made.clone());
    made
}

/// Every kernel the backend can compile, for the NVRTC check of CI and the GPU's warm-up.
pub fn catalog() -> Vec<KernelSource> {
    let mut all = vec![];
    for &e in &Elem::ALL {
        for &op in UnaryOp::ALL {
            if let Some(out) = Elem::of(op.output_dtype(e.dtype())) {
                all.extend(unary(op, e, out));
            }
        }
        for &op in BinaryOp::ALL {
            if let Some(out) = Elem::of(op.output_dtype(e.dtype())) {
                all.extend(binary(op, e, out).map(|(k, _)| k));
            }
        }
        for &to in &Elem::ALL {
            all.push(cast(e, to));
        }
        all.push(select(e));
        for &op in ReduceOp::ALL {
            all.extend(reduce(op, e).into_iter().flatten());
        }
        for &op in ArgReduceOp::ALL {
            all.extend(arg_reduce(op, e).into_iter().flatten());
        }
        all.push(copy_into(e));
        all.push(fill(e));
        for ie in [Elem::I32, Elem::I64] {
            all.extend(gather(e, ie));
            all.extend(scatter_add(e, ie).into_iter().flatten());
            all.extend(sparse_softmax_xent(e, ie).into_iter().flatten());
        }
        for &op in CumulativeOp::ALL {
            all.extend(cumulative(op, e));
        }
        for &kind in PoolKind::ALL {
            all.extend(pool2d(kind, e));
        }
        all.extend(max_pool_grad(e));
        all.extend(avg_pool_grad(e));
        all.extend(conv2d(e));
        all.extend(conv2d_backprop_input(e));
        all.extend(conv2d_backprop_filter(e));
        all.extend(im2col(e));
        all.extend(col2im(e));
        all.extend(random_uniform(e));
        all.extend(random_normal(e));
        all.extend(sort(e).into_iter().flatten());
        all.extend(matmul_int(e));
        for kind in OptimizerKind::ALL {
            all.extend(optimizer(kind, e));
        }
        for a in [FusedActivation::Linear, FusedActivation::Relu] {
            all.extend(fused_conv2d(e, a));
        }
        all.extend(clip_scalar(e));
    }
    all
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn view_matches_the_prelude() {
        // offset + 8 shapes + 8 strides (8 bytes each) + rank + pad (4 bytes each)
        assert_eq!(std::mem::size_of::<View>(), 8 + 64 + 64 + 4 + 4);
        assert_eq!(std::mem::align_of::<View>(), 8);
        assert!(PRELUDE.contains("ff_i64 offset;\n    ff_i64 shape[FF_MAX_RANK];"));
        assert!(PRELUDE.contains(&format!("#define FF_MAX_RANK {MAX_RANK}")));
    }

    #[test]
    fn kernel_names_are_unique_and_defined_in_their_source() {
        let all = catalog();
        let mut names: Vec<&str> = all.iter().map(|k| k.name.as_str()).collect();
        names.sort_unstable();
        let before = names.len();
        names.dedup();
        assert_eq!(names.len(), before, "two kernels share a name");
        for k in &all {
            assert!(
                k.code.contains(&format!("__global__ void {}(", k.name)),
                "{} is not defined in its own source",
                k.name
            );
        }
        // Every element type has a copy (cast to itself) and a select.
        for e in Elem::ALL {
            assert!(names.contains(&format!("cast_{0}_{0}", e.tag()).as_str()));
            assert!(names.contains(&format!("select_{}", e.tag()).as_str()));
        }
    }

    /// Every kernel an op can launch is in the catalog (so CI compiles it with NVRTC and the
    /// host emulation finds it in its group).
    #[test]
    fn the_catalog_holds_every_launchable_kernel() {
        let names: std::collections::HashSet<String> =
            catalog().into_iter().map(|k| k.name).collect();
        let mut keys = vec![];
        for e in Elem::ALL {
            for &op in UnaryOp::ALL {
                if let Some(out) = Elem::of(op.output_dtype(e.dtype())) {
                    keys.push(KernelKey::Unary(op, e, out));
                }
            }
            for &op in BinaryOp::ALL {
                if let Some(out) = Elem::of(op.output_dtype(e.dtype())) {
                    keys.push(KernelKey::Binary(op, e, out));
                }
            }
            keys.extend(ReduceOp::ALL.iter().map(|&op| KernelKey::Reduce(op, e)));
            keys.extend(
                ArgReduceOp::ALL
                    .iter()
                    .map(|&op| KernelKey::ArgReduce(op, e)),
            );
            keys.extend(Elem::ALL.iter().map(|&to| KernelKey::Cast(e, to)));
            keys.extend([
                KernelKey::Select(e),
                KernelKey::CopyInto(e),
                KernelKey::Fill(e),
                KernelKey::Gather(e, Elem::I32),
                KernelKey::Gather(e, Elem::I64),
                KernelKey::ScatterAdd(e, Elem::I32),
                KernelKey::ScatterAdd(e, Elem::I64),
                KernelKey::SparseSoftmaxXent(e, Elem::I32),
                KernelKey::SparseSoftmaxXent(e, Elem::I64),
                KernelKey::Sort(e),
                KernelKey::MatmulInt(e),
                KernelKey::MaxPoolGrad(e),
                KernelKey::AvgPoolGrad(e),
                KernelKey::Conv2d(e),
                KernelKey::Conv2dBackpropInput(e),
                KernelKey::Conv2dBackpropFilter(e),
                KernelKey::Im2col(e),
                KernelKey::Col2im(e),
                KernelKey::RandomUniform(e),
                KernelKey::RandomNormal(e),
            ]);
            keys.extend(
                CumulativeOp::ALL
                    .iter()
                    .map(|&op| KernelKey::Cumulative(op, e)),
            );
            keys.extend(PoolKind::ALL.iter().map(|&k| KernelKey::Pool(k, e)));
            keys.extend(
                OptimizerKind::ALL
                    .iter()
                    .map(|&k| KernelKey::Optimizer(k, e)),
            );
            keys.extend([
                KernelKey::FusedConv2d(e, FusedActivation::Linear),
                KernelKey::FusedConv2d(e, FusedActivation::Relu),
                KernelKey::ClipScalar(e),
            ]);
        }
        let mut launchable = 0;
        for key in keys {
            for k in generated(key).iter().flat_map(|g| g.kernels.iter()) {
                launchable += 1;
                assert!(
                    names.contains(&k.name),
                    "{key:?}: kernel {} is not in the catalog",
                    k.name
                );
            }
        }
        assert_eq!(
            launchable,
            names.len(),
            "the catalog holds kernels no op launches"
        );
    }

    #[test]
    fn a_malformed_program_has_no_kernel() {
        for program in [
            // No outputs.
            ElementwiseProgram {
                num_inputs: 1,
                steps: vec![ElementwiseStep::Unary(UnaryOp::Tanh, 0)],
                outputs: vec![],
            },
            // A step reading a register not yet written.
            ElementwiseProgram {
                num_inputs: 1,
                steps: vec![ElementwiseStep::Unary(UnaryOp::Tanh, 5)],
                outputs: vec![1],
            },
        ] {
            assert!(fused_program(&program, Elem::F32, 0).is_none());
            assert!(fused_program_reduce(&program, ReduceOp::ReduceSum, Elem::F32, 0).is_none());
            assert!(generated_program(&program, Elem::F32, None).is_none());
        }
        let good = program_with_every_op();
        assert!(fused_program(&good, Elem::F16, 0).is_some());
        // Integer registers are not fusible.
        assert!(fused_program(&good, Elem::I32, 0).is_none());
    }

    #[test]
    fn complex_dtypes_have_no_element_type() {
        assert_eq!(Elem::of(DType::C64), None);
        for e in Elem::ALL {
            assert_eq!(Elem::of(e.dtype()), Some(e));
        }
    }
}
