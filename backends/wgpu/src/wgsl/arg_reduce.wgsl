// argmax/argmin along one axis: one workgroup per output, int64 indices as two words.
var<workgroup> sv: array<$C, 256>;
var<workgroup> si: array<u32, 256>;
fn no_nan(v: i32) -> bool { return false; }
fn no_nan_u(v: u32) -> bool { return false; }
// Does (va, ia) beat (vb, ib)? A NaN wins, then the better value, then the lower index.
fn wins(va: $C, ia: u32, vb: $C, ib: u32) -> bool {
    if ib == 0xffffffffu { return true; }
    if ia == 0xffffffffu { return false; }
    let na = $NAN(va);
    let nb = $NAN(vb);
    if na && nb { return ia < ib; }
    if na { return true; }
    if nb { return false; }
    if va == vb { return ia < ib; }
    return $BETTER;
}
@compute @workgroup_size(256)
fn main(@builtin(workgroup_id) wid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>,
        @builtin(local_invocation_id) lid: vec3<u32>) {
    let o = wid.y * nwg.x + wid.x;
    let base = at(P[1], o);
    var bv: $C = $C();
    var bi = 0xffffffffu;
    if o < P[0] {
        for (var r = lid.x; r < P[4]; r = r + WG) {
            let v = $LOAD;
            if wins(v, r, bv, bi) { bv = v; bi = r; }
        }
    }
    sv[lid.x] = bv;
    si[lid.x] = bi;
    workgroupBarrier();
    for (var s = WG / 2u; s > 0u; s = s >> 1u) {
        if lid.x < s && wins(sv[lid.x + s], si[lid.x + s], sv[lid.x], si[lid.x]) {
            sv[lid.x] = sv[lid.x + s];
            si[lid.x] = si[lid.x + s];
        }
        workgroupBarrier();
    }
    if lid.x == 0u && o < P[0] { Y[o] = vec2<u32>(si[0], 0u); }
}
