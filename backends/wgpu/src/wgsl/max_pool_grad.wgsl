            // The first maximum of window (oh, ow).
            var best = -f_inf();
            var bh = -1;
            var bw = -1;
            for (var a = 0u; a < G.kh; a = a + 1u) {
                let h = in_row(u32(oh), a);
                if h < 0 { continue; }
                for (var b = 0u; b < G.kw; b = b + 1u) {
                    let ww = in_col(u32(ow), b);
                    if ww < 0 { continue; }
                    let v = $LOADX;
                    if bh < 0 || (!is_nan(best) && (is_nan(v) || v > best)) {
                        best = v; bh = h; bw = ww;
                    }
                }
            }
            if bh == i32(h0) && bw == i32(w0) {
                acc = acc + $LOADDY;
            }
        }
    }
    Y[i] = $STORE;
