// The pooling gradients' opening: input element i = (n, h0, w0, c), then a loop over the
// windows (oh, ow) that cover it; the gradient's own part continues inside both loops.
    setup();
    let c = i % G.c;
    let w0 = (i / G.c) % G.w;
    let h0 = (i / (G.c * G.w)) % G.h;
    let n = i / (G.c * G.w * G.h);
    var acc = 0.0;
    for (var kh = 0u; kh < G.kh; kh = kh + 1u) {
        let oh = out_row(h0, kh);
        if oh < 0 { continue; }
        for (var kw = 0u; kw < G.kw; kw = kw + 1u) {
            let ow = out_col(w0, kw);
            if ow < 0 { continue; }
