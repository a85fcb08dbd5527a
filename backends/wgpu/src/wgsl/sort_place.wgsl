// The values (A, copied bit for bit) and int32 indices of each line in the order the merge
// passes found (B: each sorted place's index along the line).
    let len = P[4];
    let inner = P[5];
    let line = i / len;
    let p = i % len;
    let first = (line / inner) * len * inner + line % inner;
    let j = B[i];
    Y[first + p * inner] = A[at(P[1], first + j * inner)];
    Z[first + p * inner] = i32(j);
