// A tree reduction: one workgroup per output element (or per part of one, when a long
// reduction is split), folding `a` and `b` with the reduction's combination.
var<workgroup> sh: array<$C, 256>;
@compute @workgroup_size(256)
fn main(@builtin(workgroup_id) wid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>,
        @builtin(local_invocation_id) lid: vec3<u32>) {
    let o = wid.y * nwg.x + wid.x;
    let parts = P[5];
    let row = o / parts;
    let part = o % parts;
    let start = part * P[6];
    let end = min(start + P[6], P[4]);
    let base = at(P[1], row);
    var acc: $C = $INIT;
    if o < P[0] {
        for (var r = start + lid.x; r < end; r = r + WG) {
            let b = $LOAD;
            let a = acc;
            acc = $COMBINE;
        }
    }
    sh[lid.x] = acc;
    workgroupBarrier();
    for (var s = WG / 2u; s > 0u; s = s >> 1u) {
        if lid.x < s {
            let a = sh[lid.x];
            let b = sh[lid.x + s];
            sh[lid.x] = $COMBINE;
        }
        workgroupBarrier();
    }
    if lid.x == 0u && o < P[0] { Y[o] = $STORE; }
}
