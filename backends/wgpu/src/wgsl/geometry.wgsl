struct Geo { n: u32, h: u32, w: u32, c: u32, kh: u32, kw: u32, oh: u32, ow: u32,
             sh: u32, sw: u32, dh: u32, dw: u32, ph: u32, pw: u32, cout: u32 }
var<private> G: Geo;
fn setup() {
    let t = P[4];
    G = Geo(P[t], P[t + 1u], P[t + 2u], P[t + 3u], P[t + 4u], P[t + 5u], P[t + 6u], P[t + 7u],
            P[t + 8u], P[t + 9u], P[t + 10u], P[t + 11u], P[t + 12u], P[t + 13u], P[t + 19u]);
}
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
// Input row of window row k at output row o, or -1 in the padding.
fn in_row(o: u32, k: u32) -> i32 {
    let r = i32(o * G.sh + k * G.dh) - i32(G.ph);
    return select(-1, r, r >= 0 && r < i32(G.h));
}
fn in_col(o: u32, k: u32) -> i32 {
    let r = i32(o * G.sw + k * G.dw) - i32(G.pw);
    return select(-1, r, r >= 0 && r < i32(G.w));
}
// Output row whose window row k covers input row h, or -1.
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
