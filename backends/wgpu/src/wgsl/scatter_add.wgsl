// scatter_add (the adjoint of gather): each output element sums the updates (A) whose
// index (B) selects its row; an index out of range is recorded in the error word.
    let inner = P[4];
    let ni = P[5];
    let row = (i / inner) % P[6];
    let outer = i / (inner * P[6]);
    var acc: $C = $C();
    for (var j = 0u; j < ni; j = j + 1u) {
        $INDEX_LOAD
        if !ok { $FLAG continue; }
        if r == row { acc = acc + $LOAD; }
    }
    Y[i] = $STORE;
