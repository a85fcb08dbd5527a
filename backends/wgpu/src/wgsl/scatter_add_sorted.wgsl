// scatter_add with many indices, last step: each output element finds its row's run in the
// sorted keys (B) by a binary search and sums the updates (A) at the run's positions (C),
// which the stable sort left in index order: the scanning kernel's sum, term for term.
    let inner = P[4];
    let ni = P[5];
    let row = (i / inner) % P[6];
    let outer = i / (inner * P[6]);
    var lo = 0u;
    var hi = ni;
    while lo < hi {
        let c = lo + (hi - lo) / 2u;
        if B[c] < row { lo = c + 1u; } else { hi = c; }
    }
    var acc: $C = $C();
    for (var j = lo; j < ni && B[j] == row; j = j + 1u) {
        acc = acc + $LOAD;
    }
    Y[i] = $STORE;
