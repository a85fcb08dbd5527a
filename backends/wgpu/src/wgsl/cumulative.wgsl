// A running sum or product along one axis: one thread per line (P[6] exclusive, P[7] reverse).
    let len = P[4];
    let inner = P[5];
    let first = (i / inner) * len * inner + i % inner;
    var acc: $C = $INIT;
    for (var s = 0u; s < len; s = s + 1u) {
        let k = select(s, len - 1u - s, P[7] != 0u);
        let lin = first + k * inner;
        let v = $LOAD;
        if P[6] != 0u {
            Y[lin] = $STORE;
            acc = $COMB;
        } else {
            acc = $COMB;
            Y[lin] = $STORE;
        }
    }
