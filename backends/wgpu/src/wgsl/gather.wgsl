// gather along one axis: output element i copies the input element its index selects; an
// index out of range is recorded in the error word and gives a zero.
    let inner = P[4];
    let ni = P[5];
    let j = (i / inner) % ni;
    $INDEX_LOAD
    if !ok { $FLAG Y[i] = $MOV(); return; }
    Y[i] = A[at(P[1], ((i / (inner * ni)) * P[6] + r) * inner + i % inner)];
