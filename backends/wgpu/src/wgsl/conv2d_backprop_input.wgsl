// conv2d_backprop_input as implicit GEMM: the readers of its two "matrices" from the NHWC tensors.
fn load_a(base: i32, m: u32, k: u32) -> f32 {
    let w0 = m % G.w; let t = m / G.w; let h0 = t % G.h; let n = t / G.h;
    let co = k % G.cout; let t2 = k / G.cout; let kw = t2 % G.kw; let kh = t2 / G.kw;
    let oh = out_row(h0, kh);
    let ow = out_col(w0, kw);
    if oh < 0 || ow < 0 { return 0.0; }
    return LOAD_A(A[a_at(n, u32(oh), u32(ow), co)]);
}
fn load_b(base: i32, k: u32, ci: u32) -> f32 {
    let co = k % G.cout; let t2 = k / G.cout; let kw = t2 % G.kw; let kh = t2 / G.kw;
    return LOAD_B(B[b_at(kh, kw, ci, co)]);
}
