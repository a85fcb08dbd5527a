@group(0) @binding(0) var<storage, read> P: array<u32>;
const WG: u32 = 256u;
fn linear_id(wid: vec3<u32>, nwg: vec3<u32>, lid: vec3<u32>) -> u32 {
    return (wid.y * nwg.x + wid.x) * WG + lid.x;
}
// Element offset of the `lin`-th element (row-major) of the view described at P[base]:
// rank, offset, dims[rank], strides[rank] (strides as bit-cast i32).
fn at(base: u32, lin: u32) -> u32 {
    let rank = P[base];
    var off = bitcast<i32>(P[base + 1u]);
    var rem = lin;
    var d = rank;
    while d > 0u {
        d = d - 1u;
        let dim = P[base + 2u + d];
        off = off + i32(rem % dim) * bitcast<i32>(P[base + 2u + rank + d]);
        rem = rem / dim;
    }
    return u32(off);
}
