//! Winograd F(4x4, 3x3) float32 convolutions on AVX-512 or AVX2 + FMA: 3x3 filters at
//! stride 1 (the body of most CNNs), forward and both gradients. The transforms are written
//! once over [`Kernels`]' vectors and compiled per instruction set ([`with_isa!`]).
//!
//! A 4x4 block of outputs (a *tile*) reads a 6x6 patch `d` of input. With the patch
//! transformed as `V = Bᵀ d B`, each filter as `U = G g Gᵀ` and `Y = Aᵀ M A`, the
//! convolution of a patch is, at each of the 36 transformed positions ξ, a sum over input
//! channels of products: `M[ξ] = V[ξ] · U[ξ]`, a `[tiles, cin] · [cin, cout]` matrix
//! product per position on the register tiles of [`super::f32_gemm`]. That is 2.25
//! multiply-adds per output and input channel where the direct convolution takes 9 (the
//! edge tiles of an output whose size is not a multiple of 4 waste a part).
//!
//! The gradients are the same three linear maps in reverse:
//! - input: `dM = A dY Aᵀ`, `dV[ξ] = dM[ξ] · U[ξ]ᵀ`, `dd = B dV Bᵀ` added into the patch
//!   (neighbouring patches overlap by two pixels);
//! - filter: `dU[ξ] = Σ V[ξ]ᵀ · dM[ξ]` over every tile of every image, then `dg = Gᵀ dU G`
//!   once.
//!
//! The matrices are those of Lavin & Gray (2016), written out below; the 1-D transforms
//! apply them with their zeros and ±1 folded away at compile time. A chunk of a few images
//! (enough tiles for full register tiles) is transformed into thread-local buffers that
//! stay in L2.
//!
//! Inputs and outputs are float32, bfloat16 or float16 ([`Lanes`]): half-precision values
//! widen to f32 as the transforms load them and round as the last transforms store them,
//! so a half-precision convolution reads and writes half the bytes and makes no widened
//! copy; everything in between (transformed values, products, sums) is f32. (Products on
//! `vdpbf16ps` would need the transformed values in bf16: tried, the F(4x4, 3x3)
//! transforms amplify that rounding to errors of 40% of the outputs' mean magnitude.)

use super::f32_conv::{kernel_isa, packed_product, sum_partials, Epilogue, PackedFilter};
use super::f32_gemm::{column_masks, with_isa, Kernels, Tile, NR};
use super::max_pool::PoolEachImage;
use crate::lanes::Lanes;
use crate::simd::Isa;
use crate::simd::{for_each_chunk_shared, SharedMut};
use ferroflow_tensor::{FusedActivation, Window2d};
use std::cell::RefCell;

/// Outputs per tile side.
const TILE: usize = 4;
/// Inputs per patch side.
const PATCH: usize = TILE + 2;
/// Transformed positions ξ per tile.
const POSITIONS: usize = PATCH * PATCH;

/// `Bᵀ`: input patch transform.
const BT: [[f32; PATCH]; PATCH] = [
    [4.0, 0.0, -5.0, 0.0, 1.0, 0.0],
    [0.0, -4.0, -4.0, 1.0, 1.0, 0.0],
    [0.0, 4.0, -4.0, -1.0, 1.0, 0.0],
    [0.0, -2.0, -1.0, 2.0, 1.0, 0.0],
    [0.0, 2.0, -1.0, -2.0, 1.0, 0.0],
    [0.0, 4.0, 0.0, -5.0, 0.0, 1.0],
];
/// `G`: filter transform.
const G: [[f32; 3]; PATCH] = [
    [1.0 / 4.0, 0.0, 0.0],
    [-1.0 / 6.0, -1.0 / 6.0, -1.0 / 6.0],
    [-1.0 / 6.0, 1.0 / 6.0, -1.0 / 6.0],
    [1.0 / 24.0, 1.0 / 12.0, 1.0 / 6.0],
    [1.0 / 24.0, -1.0 / 12.0, 1.0 / 6.0],
    [0.0, 0.0, 1.0],
];
/// `Aᵀ`: output transform.
const AT: [[f32; PATCH]; TILE] = [
    [1.0, 1.0, 1.0, 1.0, 1.0, 0.0],
    [0.0, 1.0, -1.0, 2.0, -2.0, 0.0],
    [0.0, 1.0, 1.0, 4.0, 4.0, 0.0],
    [0.0, 1.0, -1.0, 8.0, -8.0, 1.0],
];
const B: [[f32; PATCH]; PATCH] = transpose(BT);
const A: [[f32; TILE]; PATCH] = transpose(AT);
const GT: [[f32; PATCH]; 3] = transpose(G);

const fn transpose<T: Copy, const R: usize, const C: usize>(m: [[T; C]; R]) -> [[T; R]; C] {
    let mut t = [[m[0][0]; R]; C];
    let mut r = 0;
    while r < R {
        let mut c = 0;
        while c < C {
            t[c][r] = m[r][c];
            c += 1;
        }
        r += 1;
    }
    t
}

/// Fewest input and output channels for which the transforms pay for themselves (the first
/// layer of an image model, one to three channels, stays direct).
const MIN_CHANNELS: usize = 16;
/// Most `cin · cout` (the filter gradient keeps a `36 x cin x cout` partial sum per chunk).
const MAX_CHANNEL_PAIRS: usize = 64 * 128;
/// Most bytes of one image's transformed input and output (`36 x tiles x (cin + cout)`
/// floats): beyond this they would not stay in L2 and the direct kernels do better.
const MAX_IMAGE_BYTES: usize = 1 << 20;
/// Tiles a chunk gathers from its images before the products (full 8-row register tiles;
/// more would leave L2).
const CHUNK_TILES: usize = 32;

/// Whether [`forward`], [`backprop_input`] and [`backprop_filter`] take this convolution.
pub(crate) fn suits(w: &Window2d, cout: usize) -> bool {
    let plan = Plan::of(w, cout);
    super::f32_conv::available()
        && w.kernel == [3, 3]
        && w.strides == [1, 1]
        && w.dilations == [1, 1]
        && plan.cin >= MIN_CHANNELS
        && cout >= MIN_CHANNELS
        && plan.cin * cout <= MAX_CHANNEL_PAIRS
        && POSITIONS * plan.tiles * (plan.cin + cout) * 4 <= MAX_IMAGE_BYTES
}

/// One convolution's sizes: `[n, h, w, cin]` in, `[n, oh, ow, cout]` out, `th x tw` tiles
/// per image, `images` images per chunk.
#[derive(Clone, Copy)]
struct Plan {
    n: usize,
    h: usize,
    w: usize,
    cin: usize,
    cout: usize,
    oh: usize,
    ow: usize,
    pad: [usize; 2],
    th: usize,
    tw: usize,
    tiles: usize,
    images: usize,
}

impl Plan {
    fn of(w: &Window2d, cout: usize) -> Plan {
        let [n, h, wd, cin] = w.input;
        let [oh, ow] = w.output;
        let (th, tw) = (oh.div_ceil(TILE), ow.div_ceil(TILE));
        let tiles = (th * tw).max(1);
        Plan {
            n,
            h,
            w: wd,
            cin,
            cout,
            oh,
            ow,
            pad: w.pad_before,
            th,
            tw,
            tiles,
            images: CHUNK_TILES.div_ceil(tiles),
        }
    }

    /// The images of chunk `c`.
    fn chunk(&self, c: usize) -> std::ops::Range<usize> {
        c * self.images..((c + 1) * self.images).min(self.n)
    }

    fn chunks(&self) -> usize {
        self.n.div_ceil(self.images)
    }
}

/// `U = G g Gᵀ` of every filter `g` (`[3, 3, cin, cout]`): `[36, cin, cout]`.
fn filter_transform(isa: Isa, filter: &[f32], cin: usize, cout: usize) -> Vec<f32> {
    assert!(
        filter.len() >= 9 * cin * cout,
        "filter smaller than its shape"
    );
    let mut u = vec![0f32; POSITIONS * cin * cout];
    // SAFETY: the CPU has `isa` (suits checked it); sizes checked above.
    unsafe { filter_transforms(isa, &G, filter.as_ptr(), u.as_mut_ptr(), cin, cout) };
    u
}

/// `dg = Gᵀ dU G` of every transformed filter gradient (`[36, cin, cout]`):
/// `[3, 3, cin, cout]`.
fn filter_gradient_inverse(isa: Isa, du: &[f32], cin: usize, cout: usize) -> Vec<f32> {
    assert!(du.len() >= POSITIONS * cin * cout);
    let mut dg = vec![0f32; 9 * cin * cout];
    // SAFETY: the CPU has `isa` (suits checked it); sizes checked above.
    unsafe { filter_transforms(isa, &GT, du.as_ptr(), dg.as_mut_ptr(), cin, cout) };
    dg
}

/// `m · f · mᵀ` for every (input, output) channel pair of `from` (`[I, I, cin, cout]`)
/// into `to` (`[O, O, cin, cout]`), a vector of output channels at a time.
///
/// # Safety
/// The CPU has `K`'s instruction set; `from` and `to` hold their shapes.
#[inline(always)]
unsafe fn filter_transforms_with<K: Kernels, const I: usize, const O: usize>(
    m: &[[f32; I]; O],
    from: *const f32,
    to: *mut f32,
    cin: usize,
    cout: usize,
) {
    for ci in 0..cin {
        for c0 in (0..cout).step_by(K::LANES) {
            let len = K::LANES.min(cout - c0);
            let f =
                patch::<K, I>(|a, b| K::load(from.add(((a * I + b) * cin + ci) * cout + c0), len));
            let transformed = two_d::<K, I, O>(m, &f);
            for (t, &value) in transformed.as_flattened().iter().enumerate() {
                K::store(to.add((t * cin + ci) * cout + c0), len, value);
            }
        }
    }
}

with_isa! {
    /// [`filter_transforms_with`] on `isa`'s kernels.
    unsafe fn filter_transforms[const I: usize, const O: usize][I, O](
        m: &[[f32; I]; O],
        from: *const f32,
        to: *mut f32,
        cin: usize,
        cout: usize,
    ) = filter_transforms_with;
}

thread_local! {
    /// A thread's buffers for the chunk it works on: transformed input (or output
    /// gradient), their products, and the input gradient's padded accumulator.
    static BUFFERS: RefCell<[Vec<f32>; 3]> = const { RefCell::new([Vec::new(), Vec::new(), Vec::new()]) };
}

/// `conv2d(x, filter)` for a convolution [`suits`] accepts, with an optional fused bias
/// and activation, and each image max pooled once written when `pool` is given.
pub(crate) fn forward<T: Lanes>(
    x: &[T],
    filter: &[f32],
    w: &Window2d,
    cout: usize,
    epilogue: Option<Epilogue<'_>>,
    pool: Option<&PoolEachImage<T>>,
) -> Vec<T> {
    let p = &Plan::of(w, cout);
    assert!(
        x.len() >= p.n * p.h * p.w * p.cin,
        "conv operands smaller than their shapes"
    );
    if let Some(e) = epilogue {
        assert!(
            e.bias.len() >= cout,
            "bias shorter than the output channels"
        );
    }
    let isa = kernel_isa();
    let u = filter_transform(isa, filter, p.cin, cout);
    let packed: Vec<PackedFilter> = (0..POSITIONS)
        .map(|xi| PackedFilter::new(isa, &u[xi * p.cin * cout..], p.cin, cout))
        .collect();
    let (per_in, per_out) = (p.h * p.w * p.cin, p.oh * p.ow * cout);
    let mut out: Vec<T> = crate::block_cache::with_capacity(p.n * per_out);
    let dst = SharedMut(out.as_mut_ptr());
    for_each_chunk_shared(p.chunks(), |c| {
        let images = p.chunk(c);
        let rows = images.len() * p.tiles;
        BUFFERS.with_borrow_mut(|[v, m, _]| {
            v.resize(POSITIONS * rows * p.cin, 0.0);
            m.resize(POSITIONS * rows * cout, 0.0);
            // SAFETY: the CPU has `isa` (suits checked it); the chunk's images lie in x
            // (checked above); the buffers hold the chunk's transformed values; the chunk's
            // images' part of `out` belongs to this chunk only.
            unsafe {
                for (i, b) in images.clone().enumerate() {
                    let image = x.as_ptr().add(b * per_in);
                    input_transform(isa, p, image, v, (rows, i * p.tiles));
                }
                products(isa, rows, v, p.cin, &packed, cout, m.as_mut_ptr());
                for (i, b) in images.enumerate() {
                    let (at, out) = ((rows, i * p.tiles), dst.get().add(b * per_out));
                    output_transform(isa, p, m, at, epilogue, out);
                    // Image b is written; each chunk's images are its own.
                    if let Some(pool) = pool {
                        pool.image(b, out);
                    }
                }
            }
        })
    });
    // SAFETY: every image's output transform wrote all of its pixels.
    unsafe { out.set_len(p.n * per_out) };
    out
}

/// The input gradient `[n, h, w, cin]` of a convolution [`suits`] accepts.
pub(crate) fn backprop_input<T: Lanes>(
    filter: &[f32],
    dy: &[T],
    w: &Window2d,
    cout: usize,
) -> Vec<T> {
    let p = &Plan::of(w, cout);
    assert!(
        dy.len() >= p.n * p.oh * p.ow * cout,
        "conv operands smaller than their shapes"
    );
    let isa = kernel_isa();
    let u = filter_transform(isa, filter, p.cin, cout);
    // U[ξ]ᵀ: [cout, cin], element (j, c) = u[ξ][c][j].
    let transposed = |xi: usize| {
        PackedFilter::strided(
            isa,
            &u[xi * p.cin * cout..],
            cout,
            p.cin,
            (1, cout as isize),
        )
    };
    let packed: Vec<PackedFilter> = (0..POSITIONS).map(transposed).collect();
    let (per_in, per_out) = (p.h * p.w * p.cin, p.oh * p.ow * cout);
    let mut dx: Vec<T> = crate::block_cache::with_capacity(p.n * per_in);
    let dst = SharedMut(dx.as_mut_ptr());
    for_each_chunk_shared(p.chunks(), |c| {
        let images = p.chunk(c);
        let rows = images.len() * p.tiles;
        BUFFERS.with_borrow_mut(|[dm, dv, patches]| {
            dm.resize(POSITIONS * rows * cout, 0.0);
            dv.resize(POSITIONS * rows * p.cin, 0.0);
            // SAFETY: the CPU has `isa` (suits checked it); the chunk's gradients lie in
            // dy (checked above); the buffers hold the chunk's values; the chunk's images'
            // part of dx belongs to this chunk only.
            unsafe {
                for (i, b) in images.clone().enumerate() {
                    let (image, at) = (dy.as_ptr().add(b * per_out), (rows, i * p.tiles));
                    output_gradient_transform(isa, p, image, dm, at);
                }
                products(isa, rows, dm, cout, &packed, p.cin, dv.as_mut_ptr());
                for (i, b) in images.enumerate() {
                    let first = i * p.tiles;
                    input_gradient_transform(
                        isa,
                        p,
                        dv,
                        (rows, first),
                        patches,
                        dst.get().add(b * per_in),
                    );
                }
            }
        })
    });
    // SAFETY: every image's input gradient transform wrote all of its pixels.
    unsafe { dx.set_len(p.n * per_in) };
    dx
}

/// The filter gradient `[3, 3, cin, cout]` of a convolution [`suits`] accepts.
pub(crate) fn backprop_filter<T: Lanes>(x: &[T], dy: &[T], w: &Window2d, cout: usize) -> Vec<f32> {
    let p = &Plan::of(w, cout);
    assert!(
        x.len() >= p.n * p.h * p.w * p.cin && dy.len() >= p.n * p.oh * p.ow * cout,
        "conv operands smaller than their shapes"
    );
    let isa = kernel_isa();
    let partial_len = POSITIONS * p.cin * cout;
    // Two groups of chunks per thread: each group keeps its own transformed gradient sum.
    let per_group = p.chunks().div_ceil(2 * rayon::current_num_threads()).max(1);
    let groups = p.chunks().div_ceil(per_group).max(1);
    let mut partials = vec![0f32; groups * partial_len];
    let dst = SharedMut(partials.as_mut_ptr());
    let (per_in, per_out) = (p.h * p.w * p.cin, p.oh * p.ow * cout);
    for_each_chunk_shared(groups, |group| {
        BUFFERS.with_borrow_mut(|[v, dm, _]| {
            for c in group * per_group..((group + 1) * per_group).min(p.chunks()) {
                let images = p.chunk(c);
                let rows = images.len() * p.tiles;
                v.resize(POSITIONS * rows * p.cin, 0.0);
                dm.resize(POSITIONS * rows * cout, 0.0);
                // SAFETY: the CPU has `isa` (suits checked it); the chunk's images lie in x
                // and their gradients in dy (checked above); partial `group` belongs to this
                // group.
                unsafe {
                    for (i, b) in images.enumerate() {
                        let at = (rows, i * p.tiles);
                        input_transform(isa, p, x.as_ptr().add(b * per_in), v, at);
                        output_gradient_transform(isa, p, dy.as_ptr().add(b * per_out), dm, at);
                    }
                    let du = dst.get().add(group * partial_len);
                    filter_gradient_products(isa, p, rows, v, dm, du);
                }
            }
        })
    });
    filter_gradient_inverse(isa, &sum_partials(partials, partial_len), p.cin, cout)
}

/// `out[ξ] = a[ξ] · b[ξ]` for the 36 positions: `a[ξ]` `[rows, k]` row-major, `b[ξ]`
/// packed `[k, n]`, `out[ξ]` `[rows, n]`.
///
/// # Safety
/// The CPU has `isa`; `out` has room for `36 * rows * n` floats.
unsafe fn products(
    isa: Isa,
    rows: usize,
    a: &[f32],
    k: usize,
    b: &[PackedFilter],
    n: usize,
    out: *mut f32,
) {
    assert!(a.len() >= POSITIONS * rows * k && b.len() == POSITIONS);
    for (xi, b) in b.iter().enumerate() {
        let (a, out) = (a.as_ptr().add(xi * rows * k), out.add(xi * rows * n));
        packed_product(isa, a, rows, k, b, n, out);
    }
}

/// `du[ξ] += v[ξ]ᵀ · dm[ξ]` for the 36 positions of a chunk's `rows` tiles (`[cin, cout]`
/// each, k over the tiles), on `K`'s register tiles.
///
/// # Safety
/// The CPU has `K`'s instruction set; `du` is valid for `36 * cin * cout` floats.
#[inline(always)]
unsafe fn filter_gradient_products_with<K: Kernels>(
    p: &Plan,
    rows: usize,
    v: &[f32],
    dm: &[f32],
    du: *mut f32,
) {
    assert!(v.len() >= POSITIONS * rows * p.cin && dm.len() >= POSITIONS * rows * p.cout);
    for xi in 0..POSITIONS {
        for c0 in (0..p.cin).step_by(K::ROWS) {
            let h = K::ROWS.min(p.cin - c0);
            let offsets = std::array::from_fn(|r| (c0 + r.min(h - 1)) as isize);
            for q in 0..p.cout.div_ceil(NR) {
                let tile = Tile {
                    a: v.as_ptr().add(xi * rows * p.cin),
                    rows: offsets,
                    a_cs: p.cin as isize,
                    segments: &[0],
                    seg_len: rows,
                    b: dm.as_ptr().add(xi * rows * p.cout + q * NR),
                    b_rs: p.cout as isize,
                    masks: column_masks(NR.min(p.cout - q * NR)),
                    c: du.add((xi * p.cin + c0) * p.cout + q * NR),
                    ldc: p.cout,
                    add: true,
                    bias: std::ptr::null(),
                    relu: false,
                };
                K::run_rows(&tile, h);
            }
        }
    }
}

with_isa! {
    /// [`filter_gradient_products_with`] on `isa`'s kernels.
    unsafe fn filter_gradient_products(
        p: &Plan,
        rows: usize,
        v: &[f32],
        dm: &[f32],
        du: *mut f32,
    ) = filter_gradient_products_with;
}

/// `m · v` on vectors of channels. With `m` a constant, the zero terms vanish, ±1 become
/// additions and the starting `-0.0` folds away (`-0.0 + x` is `x`): straight-line code.
#[inline(always)]
unsafe fn apply<K: Kernels, const I: usize, const O: usize>(
    m: &[[f32; I]; O],
    v: &[K::V; I],
) -> [K::V; O] {
    let mut out = [K::zero(); O];
    for (o, row) in m.iter().enumerate() {
        let mut acc = K::splat(-0.0);
        for (&c, &x) in row.iter().zip(v) {
            if c == 1.0 {
                acc = K::add(acc, x);
            } else if c == -1.0 {
                acc = K::sub(acc, x);
            } else if c != 0.0 {
                acc = K::fmadd(K::splat(c), x, acc);
            }
        }
        out[o] = acc;
    }
    out
}

/// An `I x I` patch of vectors, element `(a, b)` from `value(a, b)`: built in place, not
/// zeroed first (a zeroed patch cost a `memset` call per tile and block of channels).
#[inline(always)]
fn patch<K: Kernels, const I: usize>(value: impl Fn(usize, usize) -> K::V) -> [[K::V; I]; I] {
    std::array::from_fn(|a| std::array::from_fn(|b| value(a, b)))
}

/// `m · d · mᵀ` of an `I x I` patch of vectors.
#[inline(always)]
unsafe fn two_d<K: Kernels, const I: usize, const O: usize>(
    m: &[[f32; I]; O],
    d: &[[K::V; I]; I],
) -> [[K::V; O]; O] {
    let mut columns = [[K::zero(); I]; O];
    for j in 0..I {
        let mut column = [K::zero(); I];
        for i in 0..I {
            column[i] = d[i][j];
        }
        let transformed = apply::<K, I, O>(m, &column);
        for o in 0..O {
            columns[o][j] = transformed[o];
        }
    }
    let mut out = [[K::zero(); O]; O];
    for o in 0..O {
        out[o] = apply::<K, I, O>(m, &columns[o]);
    }
    out
}

/// `V = Bᵀ d B` of every tile's 6x6 input patch of one image (`[h, w, cin]` at `image`;
/// pixels outside it, padding or past the last tile, read as zero) into tile rows
/// `first..` of `v` (`[36, rows, cin]`).
///
/// # Safety
/// The CPU has `K`'s instruction set; `image` holds the image.
#[inline(always)]
unsafe fn input_transform_with<K: Kernels, T: Lanes>(
    p: &Plan,
    image: *const T,
    v: &mut [f32],
    (rows, first): (usize, usize),
) {
    assert!(v.len() >= POSITIONS * rows * p.cin && first + p.tiles <= rows);
    let v = v.as_mut_ptr();
    for ty in 0..p.th {
        for tx in 0..p.tw {
            let t = first + ty * p.tw + tx;
            for c0 in (0..p.cin).step_by(K::LANES) {
                let len = K::LANES.min(p.cin - c0);
                let d = patch::<K, PATCH>(|a, b| {
                    let r = (TILE * ty + a).checked_sub(p.pad[0]).filter(|&r| r < p.h);
                    let c = (TILE * tx + b).checked_sub(p.pad[1]).filter(|&c| c < p.w);
                    match (r, c) {
                        (Some(r), Some(c)) => {
                            K::load_from(image.add((r * p.w + c) * p.cin + c0), len)
                        }
                        _ => K::zero(),
                    }
                });
                let transformed = two_d::<K, PATCH, PATCH>(&BT, &d);
                for (xi, &value) in transformed.as_flattened().iter().enumerate() {
                    K::store(v.add((xi * rows + t) * p.cin + c0), len, value);
                }
            }
        }
    }
}

with_isa! {
    /// [`input_transform_with`] on `isa`'s kernels.
    unsafe fn input_transform[T: Lanes][T](
        p: &Plan,
        image: *const T,
        v: &mut [f32],
        at: (usize, usize),
    ) = input_transform_with;
}

/// `dM = A dY Aᵀ` of every tile's 4x4 block of one image's output gradient (`[oh, ow,
/// cout]` at `dy`; the part of an edge tile past the output reads as zero) into tile rows
/// `first..` of `dm` (`[36, rows, cout]`).
///
/// # Safety
/// The CPU has `K`'s instruction set; `dy` holds the image's gradients.
#[inline(always)]
unsafe fn output_gradient_transform_with<K: Kernels, T: Lanes>(
    p: &Plan,
    dy: *const T,
    dm: &mut [f32],
    (rows, first): (usize, usize),
) {
    assert!(dm.len() >= POSITIONS * rows * p.cout && first + p.tiles <= rows);
    let dm = dm.as_mut_ptr();
    for ty in 0..p.th {
        for tx in 0..p.tw {
            let t = first + ty * p.tw + tx;
            for c0 in (0..p.cout).step_by(K::LANES) {
                let len = K::LANES.min(p.cout - c0);
                let y = patch::<K, TILE>(|a, b| {
                    let (r, c) = (TILE * ty + a, TILE * tx + b);
                    if r < p.oh && c < p.ow {
                        K::load_from(dy.add((r * p.ow + c) * p.cout + c0), len)
                    } else {
                        K::zero()
                    }
                });
                let transformed = two_d::<K, TILE, PATCH>(&A, &y);
                for (xi, &value) in transformed.as_flattened().iter().enumerate() {
                    K::store(dm.add((xi * rows + t) * p.cout + c0), len, value);
                }
            }
        }
    }
}

with_isa! {
    /// [`output_gradient_transform_with`] on `isa`'s kernels.
    unsafe fn output_gradient_transform[T: Lanes][T](
        p: &Plan,
        dy: *const T,
        dm: &mut [f32],
        at: (usize, usize),
    ) = output_gradient_transform_with;
}

/// `Y = Aᵀ M A` of one image's tiles (rows `first..` of `m`, `[36, rows, cout]`), then
/// the epilogue: the image's `[oh, ow, cout]` output at `out` (an edge tile's pixels past
/// the output are dropped).
///
/// # Safety
/// The CPU has `K`'s instruction set; `out` has room for the image's `oh * ow * cout`
/// floats.
#[inline(always)]
unsafe fn output_transform_with<K: Kernels, T: Lanes>(
    p: &Plan,
    m: &[f32],
    (rows, first): (usize, usize),
    epilogue: Option<Epilogue<'_>>,
    out: *mut T,
) {
    assert!(m.len() >= POSITIONS * rows * p.cout && first + p.tiles <= rows);
    let relu = matches!(epilogue, Some(e) if e.activation == FusedActivation::Relu);
    for ty in 0..p.th {
        for tx in 0..p.tw {
            let t = first + ty * p.tw + tx;
            for c0 in (0..p.cout).step_by(K::LANES) {
                let len = K::LANES.min(p.cout - c0);
                let sums = patch::<K, PATCH>(|a, b| {
                    K::load(
                        m.as_ptr().add(((a * PATCH + b) * rows + t) * p.cout + c0),
                        len,
                    )
                });
                let y = two_d::<K, PATCH, TILE>(&AT, &sums);
                let bias = match epilogue {
                    Some(e) => K::load(e.bias.as_ptr().add(c0), len),
                    None => K::zero(),
                };
                for (a, values) in y.iter().enumerate() {
                    let r = TILE * ty + a;
                    for (b, &value) in values.iter().enumerate() {
                        let c = TILE * tx + b;
                        if r >= p.oh || c >= p.ow {
                            continue;
                        }
                        let mut value = K::add(value, bias);
                        if relu {
                            value = K::relu(value);
                        }
                        K::store_to(out.add((r * p.ow + c) * p.cout + c0), len, value);
                    }
                }
            }
        }
    }
}

with_isa! {
    /// [`output_transform_with`] on `isa`'s kernels.
    unsafe fn output_transform[T: Lanes][T](
        p: &Plan,
        m: &[f32],
        at: (usize, usize),
        epilogue: Option<Epilogue<'_>>,
        out: *mut T,
    ) = output_transform_with;
}

/// `dd = B dV Bᵀ` of one image's tiles (rows `first..` of `dv`, `[36, rows, cin]`), added
/// into the tiles' 6x6 patches in `patches` (`(4·th + 2) x (4·tw + 2) x cin`, padding
/// included, zeroed here), then the image's part (`[h, w, cin]`) copied to `dx`.
///
/// # Safety
/// The CPU has `K`'s instruction set; `dx` has room for the image's `h * w * cin` floats.
#[inline(always)]
unsafe fn input_gradient_transform_with<K: Kernels, T: Lanes>(
    p: &Plan,
    dv: &[f32],
    (rows, first): (usize, usize),
    patches: &mut Vec<f32>,
    dx: *mut T,
) {
    assert!(dv.len() >= POSITIONS * rows * p.cin && first + p.tiles <= rows);
    let pitch = TILE * p.tw + 2;
    patches.clear();
    patches.resize((TILE * p.th + 2) * pitch * p.cin, 0.0);
    let acc = patches.as_mut_ptr();
    for ty in 0..p.th {
        for tx in 0..p.tw {
            let t = first + ty * p.tw + tx;
            for c0 in (0..p.cin).step_by(K::LANES) {
                let len = K::LANES.min(p.cin - c0);
                let n = patch::<K, PATCH>(|a, b| {
                    K::load(
                        dv.as_ptr().add(((a * PATCH + b) * rows + t) * p.cin + c0),
                        len,
                    )
                });
                let patch = two_d::<K, PATCH, PATCH>(&B, &n);
                for (a, values) in patch.iter().enumerate() {
                    for (b, &value) in values.iter().enumerate() {
                        let at = acc.add(((TILE * ty + a) * pitch + TILE * tx + b) * p.cin + c0);
                        K::store(at, len, K::add(K::load(at, len), value));
                    }
                }
            }
        }
    }
    let row_len = p.w * p.cin;
    for r in 0..p.h {
        let from = ((r + p.pad[0]) * pitch + p.pad[1]) * p.cin;
        T::narrow_to(&patches[from..from + row_len], dx.add(r * row_len));
    }
}

with_isa! {
    /// [`input_gradient_transform_with`] on `isa`'s kernels.
    unsafe fn input_gradient_transform[T: Lanes][T](
        p: &Plan,
        dv: &[f32],
        at: (usize, usize),
        patches: &mut Vec<f32>,
        dx: *mut T,
    ) = input_gradient_transform_with;
}
