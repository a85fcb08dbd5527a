            var count = 0.0;
            for (var a = 0u; a < G.kh; a = a + 1u) {
                for (var b = 0u; b < G.kw; b = b + 1u) {
                    if in_row(u32(oh), a) >= 0 && in_col(u32(ow), b) >= 0 { count = count + 1.0; }
                }
            }
            acc = acc + $LOADDY / count;
        }
    }
    Y[i] = $STORE;
