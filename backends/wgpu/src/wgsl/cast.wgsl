fn f_to_i32(x: f32) -> i32 {
    if is_nan(x) { return 0; }
    if x >= 2147483647.0 { return 2147483647; }
    if x <= -2147483648.0 { return -2147483647 - 1; }
    return i32(x);
}
fn f_to_u32(x: f32) -> u32 {
    if is_nan(x) || x <= 0.0 { return 0u; }
    if x >= 4294967295.0 { return 4294967295u; }
    return u32(x);
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
