//! WGSL building blocks shared by the kernels, each a file in `src/wgsl/`: the parameter
//! block and strided indexing (`prelude.wgsl`), float helpers with IEEE behaviour spelled
//! out (`float.wgsl`: WGSL leaves NaN, infinities and out-of-domain inputs of its builtins
//! "indeterminate", so each edge is handled there), float16 conversions (`f16.wgsl`),
//! integer helpers (`int.wgsl`) and the window geometry (`geometry.wgsl`); and the two
//! functions that assemble a kernel's source (`kernel_source`, `fill`).

/// Parameter block, linear ids and the strided index of a descriptor.
pub(crate) const PRELUDE: &str = include_str!("wgsl/prelude.wgsl");

/// Float helpers (f32), used by every kernel that computes on floats.
pub(crate) const FLOAT_LIB: &str = include_str!("wgsl/float.wgsl");

/// f16 conversions that keep overflow and NaN (WGSL leaves out-of-range conversions
/// indeterminate). Only in kernels that `enable f16`.
pub(crate) const F16_LIB: &str = include_str!("wgsl/f16.wgsl");

/// Integer helpers; checked ops record a data error in the error word `E`.
pub(crate) const INT_LIB: &str = include_str!("wgsl/int.wgsl");

/// The full source of a kernel: `enable f16` when needed, the prelude, the libraries and
/// the body.
pub(crate) fn kernel_source(f16: bool, body: &str) -> String {
    let mut s = String::new();
    if f16 {
        s.push_str("enable f16;\n");
    }
    s.push_str(PRELUDE);
    s.push_str(FLOAT_LIB);
    s.push_str(INT_LIB);
    if f16 {
        s.push_str(F16_LIB);
    }
    s.push_str(body);
    s
}

/// Replaces `$NAME` placeholders in a WGSL template.
pub(crate) fn fill(template: &str, pairs: &[(&str, &str)]) -> String {
    let mut s = template.to_string();
    // Longest names first, so `$TO` is not eaten by `$T`.
    let mut pairs = pairs.to_vec();
    pairs.sort_by_key(|(k, _)| std::cmp::Reverse(k.len()));
    for (k, v) in pairs {
        s = s.replace(&format!("${k}"), v);
    }
    s
}

/// Window geometry for convolution and pooling kernels, from a table at `P[4]`: input
/// [n, h, w, c], window, output, strides, dilations, padding before (0..14), the first
/// operand's offset and 4-D strides (14..19), the output channels (19), the second operand's
/// offset and strides (20..25). `setup()` loads it once into the private `G`.
pub(crate) const GEO_LIB: &str = include_str!("wgsl/geometry.wgsl");
