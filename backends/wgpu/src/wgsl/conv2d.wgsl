// conv2d as implicit GEMM: the readers of its two "matrices" from the NHWC tensors.
fn load_a(base: i32, m: u32, k: u32) -> f32 {
    let ow = m % G.ow; let t = m / G.ow; let oh = t % G.oh; let n = t / G.oh;
    let ci = k % G.c; let t2 = k / G.c; let kw = t2 % G.kw; let kh = t2 / G.kw;
    let h = in_row(oh, kh);
    let w = in_col(ow, kw);
    if h < 0 || w < 0 { return 0.0; }
    return LOAD_A(A[a_at(n, u32(h), u32(w), ci)]);
}
fn load_b(base: i32, k: u32, co: u32) -> f32 {
    let ci = k % G.c; let t2 = k / G.c; let kw = t2 % G.kw; let kh = t2 / G.kw;
    return LOAD_B(B[b_at(kh, kw, ci, co)]);
}
