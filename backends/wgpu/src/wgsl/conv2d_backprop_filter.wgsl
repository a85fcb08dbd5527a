// conv2d_backprop_filter as implicit GEMM: the readers of its two "matrices" from the NHWC tensors.
fn load_a(base: i32, m: u32, k: u32) -> f32 {
    let ci = m % G.c; let t = m / G.c; let kw = t % G.kw; let kh = t / G.kw;
    let ow = k % G.ow; let t2 = k / G.ow; let oh = t2 % G.oh; let n = t2 / G.oh;
    let h = in_row(oh, kh);
    let w = in_col(ow, kw);
    if h < 0 || w < 0 { return 0.0; }
    return LOAD_A(A[a_at(n, u32(h), u32(w), ci)]);
}
fn load_b(base: i32, k: u32, co: u32) -> f32 {
    let ow = k % G.ow; let t2 = k / G.ow; let oh = t2 % G.oh; let n = t2 / G.oh;
    return LOAD_B(B[b_at(n, oh, ow, co)]);
}
