// One pass of a merge sort over dense [lines, len] scratch of (key A, position B): runs of
// w = P[5] merged in pairs, each element placed by a binary search of the other run (a
// left element after the right run's smaller keys, a right one after the left run's keys
// not above it: stable), into Y, Z.
    let len = P[4];
    let w = P[5];
    let line = i - i % len;
    let p = i % len;
    let base = p - p % (2u * w);
    let mid = min(base + w, len);
    let end = min(mid + w, len);
    let key = A[i];
    var place = 0u;
    if p < mid {
        var lo = mid;
        var hi = end;
        while lo < hi {
            let c = lo + (hi - lo) / 2u;
            if A[line + c] < key { lo = c + 1u; } else { hi = c; }
        }
        place = p + (lo - mid);
    } else {
        var lo = base;
        var hi = mid;
        while lo < hi {
            let c = lo + (hi - lo) / 2u;
            if A[line + c] <= key { lo = c + 1u; } else { hi = c; }
        }
        place = (p - mid) + lo;
    }
    Y[line + place] = key;
    Z[line + place] = B[i];
