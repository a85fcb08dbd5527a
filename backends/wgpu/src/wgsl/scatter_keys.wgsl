// scatter_add with many indices, first step: each index (A, read through its layout) as a
// sort key with its position, for the merge passes (`sort_merge.wgsl`). An index out of
// range is recorded in the error word and keyed above every row.
    let j = i;
    $INDEX_LOAD
    if ok { Y[i] = r; } else { $FLAG Y[i] = 0xffffffffu; }
    Z[i] = i;
