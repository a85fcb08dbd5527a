fn f_nan() -> f32 { return bitcast<f32>(0x7fc00000u); }
fn f_inf() -> f32 { return bitcast<f32>(0x7f800000u); }
fn is_nan(x: f32) -> bool { return (bitcast<u32>(x) & 0x7fffffffu) > 0x7f800000u; }
fn is_inf(x: f32) -> bool { return (bitcast<u32>(x) & 0x7fffffffu) == 0x7f800000u; }
fn is_finite(x: f32) -> bool { return (bitcast<u32>(x) & 0x7f800000u) != 0x7f800000u; }
fn sign_bit(x: f32) -> bool { return (bitcast<u32>(x) & 0x80000000u) != 0u; }
fn copysign(m: f32, s: f32) -> f32 {
    return bitcast<f32>((bitcast<u32>(m) & 0x7fffffffu) | (bitcast<u32>(s) & 0x80000000u));
}
fn f_div(a: f32, b: f32) -> f32 {
    if is_nan(a) || is_nan(b) { return f_nan(); }
    if b == 0.0 {
        if a == 0.0 { return f_nan(); }
        return select(f_inf(), -f_inf(), sign_bit(a) != sign_bit(b));
    }
    if is_inf(b) {
        if is_inf(a) { return f_nan(); }
        return select(0.0, -0.0, sign_bit(a) != sign_bit(b));
    }
    return a / b;
}
fn f_exp(x: f32) -> f32 {
    if is_nan(x) { return x; }
    if x > 88.72284 { return f_inf(); }
    if x < -103.97208 { return 0.0; }
    return exp(x);
}
fn f_log(x: f32) -> f32 {
    if is_nan(x) || x < 0.0 { return f_nan(); }
    if x == 0.0 { return -f_inf(); }
    if is_inf(x) { return x; }
    return log(x);
}
fn f_expm1(x: f32) -> f32 {
    if is_nan(x) { return x; }
    if abs(x) < 1e-5 { return x + 0.5 * x * x; }
    let u = f_exp(x);
    if is_inf(u) { return u; }
    if u == 1.0 { return x; }
    let um1 = u - 1.0;
    if um1 == -1.0 { return -1.0; }
    return um1 * x / log(u);
}
fn f_log1p(x: f32) -> f32 {
    if is_nan(x) || x < -1.0 { return f_nan(); }
    if x == -1.0 { return -f_inf(); }
    if is_inf(x) { return x; }
    let u = 1.0 + x;
    if u == 1.0 { return x; }
    return log(u) * x / (u - 1.0);
}
fn f_sqrt(x: f32) -> f32 {
    if is_nan(x) || x < 0.0 { return f_nan(); }
    if is_inf(x) || x == 0.0 { return x; }
    return sqrt(x);
}
fn f_rsqrt(x: f32) -> f32 {
    if is_nan(x) || x < 0.0 { return f_nan(); }
    if x == 0.0 { return copysign(f_inf(), x); }
    if is_inf(x) { return 0.0; }
    return 1.0 / sqrt(x);
}
fn f_trig_ok(x: f32) -> bool { return is_finite(x); }
fn f_sin(x: f32) -> f32 { if !is_finite(x) { return f_nan(); } return sin(x); }
fn f_cos(x: f32) -> f32 { if !is_finite(x) { return f_nan(); } return cos(x); }
fn f_tan(x: f32) -> f32 { if !is_finite(x) { return f_nan(); } return tan(x); }
// asin, acos, atan: Cephes' single-precision polynomials (drivers' builtins can be off by
// 1e-4 and more).
fn f_asin(x: f32) -> f32 {
    if is_nan(x) || abs(x) > 1.0 { return f_nan(); }
    let a = abs(x);
    if a < 1e-4 { return x; }
    var z: f32;
    var s: f32;
    let big = a > 0.5;
    if big { z = 0.5 * (1.0 - a); s = sqrt(z); } else { z = a * a; s = a; }
    let p = ((((4.2163199048e-2 * z + 2.4181311049e-2) * z + 4.5470025998e-2) * z
        + 7.4953002686e-2) * z + 1.6666752422e-1) * z * s + s;
    var r = p;
    if big { r = 1.5707963267948966 - 2.0 * p; }
    return copysign(r, x);
}
fn f_acos(x: f32) -> f32 {
    if is_nan(x) || abs(x) > 1.0 { return f_nan(); }
    if x < -0.5 { return 3.141592653589793 - 2.0 * f_asin(sqrt(0.5 * (1.0 + x))); }
    if x > 0.5 { return 2.0 * f_asin(sqrt(0.5 * (1.0 - x))); }
    return 1.5707963267948966 - f_asin(x);
}
fn f_atan(x: f32) -> f32 {
    if is_nan(x) { return x; }
    let a = abs(x);
    var y = 0.0;
    var z = a;
    if a > 2.414213562373095 {
        y = 1.5707963267948966;
        z = -1.0 / a;
    } else if a > 0.4142135623730950 {
        y = 0.7853981633974483;
        z = (a - 1.0) / (a + 1.0);
    }
    let zz = z * z;
    let p = (((8.05374449538e-2 * zz - 1.38776856032e-1) * zz + 1.99777106478e-1) * zz
        - 3.33329491539e-1) * zz * z + z;
    return copysign(y + p, x);
}
fn f_sinh(x: f32) -> f32 {
    if is_nan(x) || is_inf(x) { return x; }
    let a = abs(x);
    if a > 80.0 { return copysign(f_exp(a - 0.6931472), x); }
    return 0.5 * (f_expm1(x) - f_expm1(-x));
}
fn f_cosh(x: f32) -> f32 {
    if is_nan(x) { return x; }
    let a = abs(x);
    if a > 80.0 { return f_exp(a - 0.6931472); }
    let e = exp(a);
    return 0.5 * (e + 1.0 / e);
}
fn f_tanh(x: f32) -> f32 {
    if is_nan(x) { return x; }
    let a = abs(x);
    if a > 9.1 { return copysign(1.0, x); }
    let e = f_expm1(-2.0 * a);
    return copysign(-e / (2.0 + e), x);
}
fn f_sigmoid(x: f32) -> f32 {
    if is_nan(x) { return x; }
    if x >= 0.0 { return 1.0 / (1.0 + f_exp(-x)); }
    let e = f_exp(x);
    return e / (1.0 + e);
}
// erfc by Numerical Recipes' Chebyshev fit (fractional error < 1.2e-7).
fn f_erf(x: f32) -> f32 {
    if is_nan(x) { return x; }
    let z = abs(x);
    if z < 0.01 { return x * 1.1283791671 * (1.0 - x * x / 3.0); }
    if z > 4.0 { return copysign(1.0, x); }
    let t = 1.0 / (1.0 + 0.5 * z);
    let p = -z * z - 1.26551223 + t * (1.00002368 + t * (0.37409196 + t * (0.09678418
        + t * (-0.18628806 + t * (0.27886807 + t * (-1.13520398 + t * (1.48851587
        + t * (-0.82215223 + t * 0.17087277))))))));
    let erfc = t * exp(p);
    return copysign(1.0 - erfc, x);
}
fn f_sign(x: f32) -> f32 {
    if is_nan(x) { return x; }
    if x > 0.0 { return 1.0; }
    if x < 0.0 { return -1.0; }
    return 0.0;
}
fn f_is_int(y: f32) -> bool { return is_finite(y) && floor(y) == y; }
fn f_pow(a: f32, b: f32) -> f32 {
    if b == 0.0 { return 1.0; }
    if a == 1.0 { return 1.0; }
    if is_nan(a) || is_nan(b) { return f_nan(); }
    let odd = f_is_int(b) && abs(b) < 16777216.0 && (i32(abs(b)) & 1) == 1;
    if a == 0.0 {
        if b > 0.0 { return select(0.0, a, odd); }
        return select(f_inf(), copysign(f_inf(), a), odd);
    }
    if is_inf(b) {
        let m = abs(a);
        if m == 1.0 { return 1.0; }
        if (m > 1.0) == (b > 0.0) { return f_inf(); }
        return 0.0;
    }
    if is_inf(a) {
        if a > 0.0 { return select(0.0, f_inf(), b > 0.0); }
        let r = select(0.0, f_inf(), b > 0.0);
        return select(r, -r, odd);
    }
    if a < 0.0 {
        if !f_is_int(b) { return f_nan(); }
        let r = exp2(b * log2(-a));
        return select(r, -r, odd);
    }
    return exp2(b * log2(a));
}
fn f_max(a: f32, b: f32) -> f32 {
    if is_nan(a) || is_nan(b) { return f_nan(); }
    return max(a, b);
}
fn f_min(a: f32, b: f32) -> f32 {
    if is_nan(a) || is_nan(b) { return f_nan(); }
    return min(a, b);
}
fn f_floordiv(a: f32, b: f32) -> f32 { return floor(f_div(a, b)); }
fn f_floormod(a: f32, b: f32) -> f32 {
    if is_nan(a) || is_nan(b) || is_inf(a) || b == 0.0 { return f_nan(); }
    if is_inf(b) {
        if a == 0.0 || (a < 0.0) == (b < 0.0) { return a; }
        return b;
    }
    var r = a - b * trunc(a / b);
    if abs(r) >= abs(b) { r = 0.0; }
    if r != 0.0 && ((r < 0.0) != (b < 0.0)) { r = r + b; }
    return r;
}
fn f_atan2(a: f32, b: f32) -> f32 {
    if is_nan(a) || is_nan(b) { return f_nan(); }
    if a == 0.0 {
        if sign_bit(b) { return copysign(3.1415927, a); }
        return a;
    }
    if is_inf(a) && is_inf(b) {
        return copysign(select(0.7853982, 2.3561945, b < 0.0), a);
    }
    if is_inf(b) {
        return copysign(select(0.0, 3.1415927, b < 0.0), a);
    }
    if is_inf(a) { return copysign(1.5707964, a); }
    return atan2(a, b);
}
fn f_eq(a: f32, b: f32) -> bool { return !is_nan(a) && !is_nan(b) && a == b; }
fn f_lt(a: f32, b: f32) -> bool { return !is_nan(a) && !is_nan(b) && a < b; }
fn f_le(a: f32, b: f32) -> bool { return !is_nan(a) && !is_nan(b) && a <= b; }
// The sort key of `x`: an unsigned word whose order is the CPU's sort order (numbers
// ascending, -0 equal to 0, every NaN above everything), read from the bits so that a
// device which flushes subnormals in comparisons still orders them.
fn sort_key(x: f32) -> u32 {
    let bits = bitcast<u32>(x);
    if is_nan(x) { return 0xffffffffu; }
    if (bits & 0x7fffffffu) == 0u { return 0x80000000u; }
    return select(bits | 0x80000000u, ~bits, (bits & 0x80000000u) != 0u);
}
