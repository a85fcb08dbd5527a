// Each element's sort key (`$KEY`: a word whose unsigned order is the sort's; complemented
// for descending, P[6]) and its index along its line, into dense scratch [lines, len]:
// the input of the merge passes (`sort_merge.wgsl`).
    let len = P[4];
    let inner = P[5];
    let line = i / len;
    let k = i % len;
    let first = (line / inner) * len * inner + line % inner;
    let v = $LOAD;
    let key = $KEY;
    Y[i] = select(key, ~key, P[6] != 0u);
    Z[i] = k;
