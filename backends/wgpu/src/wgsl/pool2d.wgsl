// Max or average pooling: output element i folds the valid taps of its window.
    setup();
    let c = i % G.c;
    let ow = (i / G.c) % G.ow;
    let oh = (i / (G.c * G.ow)) % G.oh;
    let n = i / (G.c * G.ow * G.oh);
    var acc = $INIT;
    var count = 0.0;
    for (var kh = 0u; kh < G.kh; kh = kh + 1u) {
        let h = in_row(oh, kh);
        if h < 0 { continue; }
        for (var kw = 0u; kw < G.kw; kw = kw + 1u) {
            let ww = in_col(ow, kw);
            if ww < 0 { continue; }
            let v = $LOAD;
            $COMBINE
            count = count + 1.0;
        }
    }
    Y[i] = $STORE;
