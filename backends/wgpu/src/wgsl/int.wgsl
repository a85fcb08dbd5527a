fn i_pow(a: i32, b: i32) -> i32 {
    var base = a;
    var e = u32(max(b, 0));
    var acc = 1i;
    while e > 0u {
        if (e & 1u) == 1u { acc = acc * base; }
        base = base * base;
        e = e >> 1u;
    }
    return acc;
}
fn i_abs(a: i32) -> i32 { return select(a, -a, a < 0); }
// Floor division and modulo with the divisor's sign (b != 0).
fn i_floordiv(a: i32, b: i32) -> i32 {
    let q = a / b;
    if (a % b != 0) && ((a < 0) != (b < 0)) { return q - 1; }
    return q;
}
fn i_floormod(a: i32, b: i32) -> i32 {
    let r = a % b;
    if r != 0 && ((r < 0) != (b < 0)) { return r + b; }
    return r;
}
fn u_pow(a: u32, b: u32) -> u32 {
    var base = a;
    var e = b;
    var acc = 1u;
    while e > 0u {
        if (e & 1u) == 1u { acc = acc * base; }
        base = base * base;
        e = e >> 1u;
    }
    return acc;
}
