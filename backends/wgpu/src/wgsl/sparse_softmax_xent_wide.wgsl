// sparse softmax cross-entropy over wide rows (a language model's vocabulary): a workgroup
// per row, its invocations striding over the classes; the row is copied into the backprop
// output while its maximum is found, turned into the softmax there (maximum and sum
// combined by a fixed tree), the label's one subtracted, and the loss written. A label out
// of range is recorded in the error word (the row's loss is left as it is).
var<workgroup> sh: array<f32, 256>;
@compute @workgroup_size(256)
fn main(@builtin(workgroup_id) wid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>,
        @builtin(local_invocation_id) lid: vec3<u32>) {
    let i = wid.y * nwg.x + wid.x;
    // Workgroups past the last row read the last row and write nothing.
    let live = i < P[0];
    let j = min(i, P[0] - 1u);
    let c = P[6];
    $INDEX_LOAD
    if live && !ok && lid.x == 0u { $FLAG }
    let base = j * c;
    var t = bitcast<f32>(P[7]);
    if live {
        for (var k = lid.x; k < c; k = k + WG) {
            let v = A[at(P[1], base + k)];
            Z[base + k] = v;
            if v > t { t = v; }
        }
    }
    sh[lid.x] = t;
    workgroupBarrier();
    for (var s = WG / 2u; s > 0u; s = s >> 1u) {
        if lid.x < s && sh[lid.x + s] > sh[lid.x] { sh[lid.x] = sh[lid.x + s]; }
        workgroupBarrier();
    }
    let m = sh[0];
    workgroupBarrier();
    var sum = 0.0;
    if live {
        for (var k = lid.x; k < c; k = k + WG) {
            let e = exp(Z[base + k] - m);
            Z[base + k] = e;
            sum = sum + e;
        }
    }
    sh[lid.x] = sum;
    workgroupBarrier();
    for (var s = WG / 2u; s > 0u; s = s >> 1u) {
        if lid.x < s { sh[lid.x] = sh[lid.x] + sh[lid.x + s]; }
        workgroupBarrier();
    }
    let total = sh[0];
    let inv = 1.0 / total;
    if live {
        for (var k = lid.x; k < c; k = k + WG) {
            var p = Z[base + k] * inv;
            if ok && k == r { p = p - 1.0; }
            Z[base + k] = p;
        }
        if ok && lid.x == 0u { Y[i] = log(total) - (A[at(P[1], base + r)] - m); }
    }
}
