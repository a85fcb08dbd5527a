// sparse softmax cross-entropy: invocation i takes row i of the logits (C classes): the
// row is copied into the backprop output while its maximum is found, turned into the
// softmax there, the label's one subtracted, and the loss written. A label out of range is
// recorded in the error word (the row's outputs are left as they are).
    let c = P[6];
    let j = i;
    $INDEX_LOAD
    if !ok { $FLAG return; }
    let base = i * c;
    var m = bitcast<f32>(P[7]);
    var picked = 0.0;
    for (var k = 0u; k < c; k = k + 1u) {
        let v = A[at(P[1], base + k)];
        Z[base + k] = v;
        if v > m { m = v; }
        if k == r { picked = v; }
    }
    var s = 0.0;
    for (var k = 0u; k < c; k = k + 1u) {
        let e = exp(Z[base + k] - m);
        Z[base + k] = e;
        s = s + e;
    }
    let inv = 1.0 / s;
    for (var k = 0u; k < c; k = k + 1u) {
        Z[base + k] = Z[base + k] * inv;
    }
    Z[base + r] = Z[base + r] - 1.0;
    Y[i] = log(s) - (picked - m);
