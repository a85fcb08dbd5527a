// Constant padding: output element i reads the input element it lies over, or the fill value.
    let rank = P[7];
    let t = P[4];
    var rem = i;
    var off = bitcast<i32>(P[8]);
    var inside = true;
    var d = rank;
    while d > 0u {
        d = d - 1u;
        let c = rem % P[t + 4u * d];
        rem = rem / P[t + 4u * d];
        let xi = i32(c) - i32(P[t + 4u * d + 1u]);
        if xi < 0 || xi >= i32(P[t + 4u * d + 2u]) { inside = false; }
        off = off + xi * bitcast<i32>(P[t + 4u * d + 3u]);
    }
    if inside { Y[i] = A[u32(off)]; } else { Y[i] = $FILL; }
