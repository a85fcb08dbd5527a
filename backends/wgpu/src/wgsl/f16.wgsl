fn f16_bits(b: u32) -> f16 {
    return f16(unpack2x16float(b).x);
}
fn to_f16(v: f32) -> f16 {
    if is_nan(v) { return f16_bits(0x7e00u); }
    if v >= 65520.0 { return f16_bits(0x7c00u); }
    if v <= -65520.0 { return f16_bits(0xfc00u); }
    return f16(v);
}
