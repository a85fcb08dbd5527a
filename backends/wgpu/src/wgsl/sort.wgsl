// A stable sort of one line per thread: bottom-up merge sort between the two halves of the
// scratch buffers K (keys) and I (indices).
    let len = P[4];
    let inner = P[5];
    let total = P[0] * len;
    let first = (i / inner) * len * inner + i % inner;
    let base = i * len;
    for (var k = 0u; k < len; k = k + 1u) {
        K[base + k] = $LOAD;
        I[base + k] = k;
    }
    var src = 0u;
    for (var w = 1u; w < len; w = w * 2u) {
        let dst = total - src;
        for (var lo = 0u; lo < len; lo = lo + 2u * w) {
            let mid = min(lo + w, len);
            let hi = min(lo + 2u * w, len);
            var p = lo;
            var q = mid;
            for (var o = lo; o < hi; o = o + 1u) {
                var take_right = false;
                if p >= mid {
                    take_right = true;
                } else if q < hi {
                    let b = K[src + base + p];
                    let a = K[src + base + q];
                    take_right = $BEFORE;
                }
                if take_right {
                    K[dst + base + o] = K[src + base + q];
                    I[dst + base + o] = I[src + base + q];
                    q = q + 1u;
                } else {
                    K[dst + base + o] = K[src + base + p];
                    I[dst + base + o] = I[src + base + p];
                    p = p + 1u;
                }
            }
        }
        src = dst;
    }
    for (var k = 0u; k < len; k = k + 1u) {
        let v = K[src + base + k];
        Y[first + k * inner] = $STORE;
        Z[first + k * inner] = i32(I[src + base + k]);
    }
