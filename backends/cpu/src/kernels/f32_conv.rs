//! Direct float32 convolutions on AVX-512 or AVX2 + FMA (NHWC input, `[kh, kw, cin, cout]`
//! filter) on the register tiles of [`super::f32_gemm`]: no im2col matrix is ever written.
//! Each kernel is written once over [`Kernels`] and compiled per instruction set
//! ([`with_isa!`]).
//!
//! A tile is up to [`MR`] consecutive output pixels by [`NR`] output channels; its k steps
//! are the `kh·kw` filter taps, each a run of `cin` contiguous input channels read in place
//! from the image (or from a zero-padded copy of one image when the window reaches past
//! the border; then tiles stay within an output row and skip the filter rows that read
//! only padding). The filter is packed once into panels of `NR` output channels. A fused
//! convolution ([`Epilogue`]) adds the bias and applies the activation in the tiles'
//! registers before they store.
//!
//! The input gradient is, per image, `Z = dy · Wᵀ` (every output pixel's contribution to
//! each tap of its window) by the same tiles, then gathered into the input pixels the taps
//! read: any stride, dilation and padding, and no product with padding. The filter
//! gradient sums, per image, pixel-by-pixel outer products of input windows and output
//! gradients into `[kh·kw·cin, cout]` tiles.

use super::f32_gemm::{column_masks, native_isa, with_isa, Kernels, Tile, MR, NR};
use super::max_pool::PoolEachImage;
use crate::lanes::Lanes;
use crate::simd::{for_each_chunk_shared, Isa, SharedMut};
use ferroflow_tensor::{FusedActivation, Window2d};

/// Whether these kernels run here (AVX-512, or AVX2 + FMA + F16C), on float32, bfloat16
/// and float16 data alike (half types convert in registers, [`Lanes`]); callers fall back
/// to im2col + GEMM otherwise.
pub(crate) fn available() -> bool {
    native_isa().is_some()
}

/// The instruction set the native float32 kernels run with (the convolutions here and in
/// `f32_winograd`, max pooling); callers checked [`available`].
pub(super) fn kernel_isa() -> Isa {
    native_isa().unwrap_or(Isa::Avx2)
}

/// A convolution's shape: `[n, h, w, cin]` in, `[n, oh, ow, cout]` out.
#[derive(Clone, Copy)]
pub(super) struct Geometry {
    n: usize,
    h: usize,
    w: usize,
    cin: usize,
    kernel: [usize; 2],
    strides: [usize; 2],
    dilations: [usize; 2],
    pad_before: [usize; 2],
    oh: usize,
    ow: usize,
    cout: usize,
}

impl Geometry {
    pub(super) fn of(w: &Window2d, cout: usize) -> Geometry {
        Geometry {
            n: w.input[0],
            h: w.input[1],
            w: w.input[2],
            cin: w.input[3],
            kernel: w.kernel,
            strides: w.strides,
            dilations: w.dilations,
            pad_before: w.pad_before,
            oh: w.output[0],
            ow: w.output[1],
            cout,
        }
    }

    /// Rows and columns of input a window of every output pixel touches, padding included.
    fn extent(&self) -> (usize, usize) {
        let e = |o: usize, s: usize, k: usize, d: usize| (o.max(1) - 1) * s + (k - 1) * d + 1;
        (
            e(self.oh, self.strides[0], self.kernel[0], self.dilations[0]),
            e(self.ow, self.strides[1], self.kernel[1], self.dilations[1]),
        )
    }

    /// True when windows never leave the image (no padded copy needed).
    pub(super) fn inside(&self) -> bool {
        let (eh, ew) = self.extent();
        self.pad_before == [0, 0] && eh <= self.h && ew <= self.w
    }

    /// Offsets (in floats) of each filter tap's run of channels from a window's corner, in
    /// an image `pitch` pixels wide.
    fn taps(&self, pitch: usize) -> Vec<isize> {
        let mut v = Vec::with_capacity(self.kernel[0] * self.kernel[1]);
        for dy in 0..self.kernel[0] {
            for dx in 0..self.kernel[1] {
                let (y, x) = (dy * self.dilations[0], dx * self.dilations[1]);
                v.push(((y * pitch + x) * self.cin) as isize);
            }
        }
        v
    }
}

/// One image as the kernels read it: in place, or a zero-padded copy reaching every window.
struct Image {
    data: *const f32,
    pitch: usize,
}

thread_local! {
    /// The zero-padded copy of the image a thread is working on (reused, so padding costs
    /// one write per element and no allocation per image).
    static PADDED: std::cell::RefCell<Vec<f32>> = const { std::cell::RefCell::new(Vec::new()) };
}

thread_local! {
    /// A thread's float32 copies of the image it works on, for half-precision operands:
    /// input (or output gradient) and output. Image-sized, so they stay in cache and no
    /// whole-buffer conversion happens.
    static WIDE: std::cell::RefCell<[Vec<f32>; 2]> =
        const { std::cell::RefCell::new([Vec::new(), Vec::new()]) };
}

/// `src` as float32: itself for f32, else widened into `scratch`.
fn as_f32<'a, T: Lanes>(src: &'a [T], scratch: &'a mut Vec<f32>) -> &'a [f32] {
    match T::as_f32(src) {
        Some(v) => v,
        None => {
            scratch.resize(src.len(), 0.0);
            T::widen_into(src, scratch);
            scratch
        }
    }
}

impl Image {
    /// Runs `f` on image `b` of `x` (`[n, h, w, cin]` dense), padded when windows reach
    /// past its border.
    fn with<R>(x: &[f32], g: &Geometry, b: usize, f: impl FnOnce(&Image) -> R) -> R {
        let per = g.h * g.w * g.cin;
        let src = &x[b * per..(b + 1) * per];
        if g.inside() {
            return f(&Image {
                data: src.as_ptr(),
                pitch: g.w,
            });
        }
        PADDED.with(|cell| {
            let copy = &mut *cell.borrow_mut();
            let (eh, ew) = g.extent();
            let row_len = ew * g.cin;
            copy.clear();
            copy.reserve(eh * row_len);
            let [pt, pl] = g.pad_before;
            let cols = g.w.min(ew.saturating_sub(pl));
            for py in 0..eh {
                match py.checked_sub(pt).filter(|&y| y < g.h) {
                    Some(y) => {
                        copy.resize(py * row_len + pl * g.cin, 0.0);
                        copy.extend_from_slice(&src[y * g.w * g.cin..(y * g.w + cols) * g.cin]);
                        copy.resize((py + 1) * row_len, 0.0);
                    }
                    None => copy.resize((py + 1) * row_len, 0.0),
                }
            }
            f(&Image {
                data: copy.as_ptr(),
                pitch: ew,
            })
        })
    }
}

/// A `[k, cout]` row-major matrix packed into panels of `NR` columns (`k x NR` each).
pub(super) struct PackedFilter {
    data: Vec<f32>,
    k: usize,
}

impl PackedFilter {
    pub(super) fn new(isa: Isa, f: &[f32], k: usize, cout: usize) -> PackedFilter {
        PackedFilter::strided(isa, f, k, cout, (cout as isize, 1))
    }

    /// A `[k, n]` matrix whose element `(p, j)` is `f[p·rs + j·cs]`, packed with `isa`'s
    /// kernels.
    pub(super) fn strided(
        isa: Isa,
        f: &[f32],
        k: usize,
        n: usize,
        (rs, cs): (isize, isize),
    ) -> PackedFilter {
        let last = (k.max(1) - 1) as isize * rs + (n.max(1) - 1) as isize * cs;
        assert!(
            k * n == 0 || (rs >= 0 && cs >= 0 && (last as usize) < f.len()),
            "filter smaller than its shape"
        );
        let panels = n.div_ceil(NR);
        let mut data = vec![0f32; panels * k * NR];
        for q in 0..panels {
            // SAFETY: the CPU has `isa` (callers check `available`); the panel lies inside f
            // (checked above) and data.
            unsafe {
                pack_panel(
                    isa,
                    f.as_ptr().offset((q * NR) as isize * cs),
                    (rs, cs),
                    k,
                    NR.min(n - q * NR),
                    data.as_mut_ptr().add(q * k * NR),
                )
            };
        }
        PackedFilter { data, k }
    }

    pub(super) fn panel(&self, q: usize) -> *const f32 {
        self.data[q * self.k * NR..].as_ptr()
    }
}

/// [`Kernels::pack_panel`] of `K`.
#[inline(always)]
unsafe fn pack_panel_with<K: Kernels>(
    src: *const f32,
    strides: (isize, isize),
    kc: usize,
    width: usize,
    dst: *mut f32,
) {
    K::pack_panel(src, strides, kc, width, dst)
}

with_isa! {
    /// Packs a panel of `NR` columns with `isa`'s kernels.
    unsafe fn pack_panel(
        src: *const f32,
        strides: (isize, isize),
        kc: usize,
        width: usize,
        dst: *mut f32,
    ) = pack_panel_with;
}

/// Images per parallel chunk (a few chunks per thread, claimed as threads come).
fn images_per_chunk(n: usize) -> usize {
    n.div_ceil(4 * rayon::current_num_threads()).max(1)
}

/// Images per chunk of kernels that need no per-chunk state: one, so the threads finish
/// together (with four chunks per thread, the last chunk left one thread idle for up to
/// an eighth of the run on two threads).
const IMAGES_PER_CHUNK_STATELESS: usize = 1;

/// What a fused convolution does to each output after the sum: add `bias[channel]`, then
/// the activation.
#[derive(Clone, Copy)]
pub(crate) struct Epilogue<'a> {
    pub(crate) bias: &'a [f32],
    pub(crate) activation: FusedActivation,
}

/// A fused convolution's bias (null: none) and whether it applies ReLU.
fn epilogue_parts(epilogue: Option<Epilogue<'_>>, cout: usize) -> (*const f32, bool) {
    match epilogue {
        Some(e) => {
            assert!(
                e.bias.len() >= cout,
                "bias shorter than the output channels"
            );
            (e.bias.as_ptr(), e.activation == FusedActivation::Relu)
        }
        None => (std::ptr::null(), false),
    }
}

/// The output pixels of one image, `[oh * ow, cout]` at `out`, with `K`'s tiles.
///
/// # Safety
/// The CPU has `K`'s instruction set; `out` is valid for the image's `oh * ow * cout`
/// floats.
#[inline(always)]
unsafe fn forward_image_with<K: Kernels>(
    img: &Image,
    g: &Geometry,
    filter: &PackedFilter,
    epilogue: Option<Epilogue<'_>>,
    out: *mut f32,
) {
    let (bias, relu) = epilogue_parts(epilogue, g.cout);
    let taps = g.taps(img.pitch);
    let corner = |oy: usize, ox: usize| {
        ((oy * g.strides[0] * img.pitch + ox * g.strides[1]) * g.cin) as isize
    };
    let kw = g.kernel[1];
    if g.inside() {
        // No padding: tiles run across output rows, every tap in use.
        let pixels = g.oh * g.ow;
        for p0 in (0..pixels).step_by(K::ROWS) {
            let h = K::ROWS.min(pixels - p0);
            let rows = std::array::from_fn(|r| {
                let p = p0 + r.min(h - 1);
                corner(p / g.ow, p % g.ow)
            });
            let a = (img.data, rows, &taps[..], g.cin);
            let tile = tile_of_rows(a, (out.add(p0 * g.cout), g.cout), (bias, relu));
            run_panels::<K>(tile, filter, 0, g.cout, h);
        }
        return;
    }
    // Padded: tiles stay within an output row, so the filter rows whose taps fall in the
    // top or bottom padding for that row are skipped rather than multiplied by zeros (SAME
    // convolutions).
    let pad_top = g.pad_before[0];
    for oy in 0..g.oh {
        let real = |ty: usize| {
            (pad_top..pad_top + g.h).contains(&(oy * g.strides[0] + ty * g.dilations[0]))
        };
        let first = (0..g.kernel[0]).find(|&ty| real(ty));
        let last = (0..g.kernel[0]).rev().find(|&ty| real(ty));
        // The filter rows in use; none when the whole window row is padding (sums of
        // zero, then the epilogue).
        let (t0, t1) = match (first, last) {
            (Some(a), Some(b)) => (a, b + 1),
            _ => (0, 0),
        };
        for ox0 in (0..g.ow).step_by(K::ROWS) {
            let h = K::ROWS.min(g.ow - ox0);
            let p0 = oy * g.ow + ox0;
            let rows = std::array::from_fn(|r| corner(oy, ox0 + r.min(h - 1)));
            let a = (img.data, rows, &taps[t0 * kw..t1 * kw], g.cin);
            let tile = tile_of_rows(a, (out.add(p0 * g.cout), g.cout), (bias, relu));
            run_panels::<K>(tile, filter, t0 * kw * g.cin, g.cout, h);
        }
    }
}

/// A tile whose rows of A are `(a, rows, segments, seg_len)` (contiguous runs) and whose
/// output starts at `c` (`ldc` apart), with an epilogue `(bias, relu)`; its B, columns and
/// masks are set per panel by [`run_panels`].
fn tile_of_rows<'s>(
    (a, rows, segments, seg_len): (*const f32, [isize; MR], &'s [isize], usize),
    (c, ldc): (*mut f32, usize),
    (bias, relu): (*const f32, bool),
) -> Tile<'s> {
    Tile {
        a,
        rows,
        a_cs: 1,
        segments,
        seg_len,
        b: std::ptr::null(),
        b_rs: NR as isize,
        masks: (0, 0),
        c,
        ldc,
        add: false,
        bias,
        relu,
    }
}

/// Runs `tile` (its B, columns and masks left to set) against every panel of `filter`
/// from filter row `k0` on: the tile's `h` rows by all `n` columns.
///
/// # Safety
/// As [`forward_image_with`]: the tile's A rows and C rows are valid, the filter's panels
/// hold `k0` plus the tile's steps of k.
#[inline(always)]
unsafe fn run_panels<K: Kernels>(
    tile: Tile<'_>,
    filter: &PackedFilter,
    k0: usize,
    n: usize,
    h: usize,
) {
    let (c, bias) = (tile.c, tile.bias);
    for q in 0..n.div_ceil(NR) {
        let panel = Tile {
            b: filter.panel(q).add(k0 * NR),
            masks: column_masks(NR.min(n - q * NR)),
            c: c.add(q * NR),
            bias: if bias.is_null() {
                bias
            } else {
                bias.add(q * NR)
            },
            ..tile
        };
        K::run_rows(&panel, h);
    }
}

with_isa! {
    /// [`forward_image_with`] on `isa`'s kernels.
    unsafe fn forward_image(
        img: &Image,
        g: &Geometry,
        filter: &PackedFilter,
        epilogue: Option<Epilogue<'_>>,
        out: *mut f32,
    ) = forward_image_with;
}

/// `conv2d(x, filter)`: `x` `[n, h, w, cin]`, `filter` `[kh, kw, cin, cout]`, both dense;
/// `x` and the result float32, bfloat16 or float16 (computed in f32 image by image).
///
/// With an `epilogue`, `activation(conv2d(x, filter) + bias)` (a fused convolution); with
/// `pool`, each image of the result is max pooled as soon as it is written.
pub(crate) fn forward<T: Lanes>(
    x: &[T],
    filter: &[f32],
    w: &Window2d,
    cout: usize,
    epilogue: Option<Epilogue<'_>>,
    pool: Option<&PoolEachImage<T>>,
) -> Vec<T> {
    if super::f32_winograd::suits(w, cout) {
        return super::f32_winograd::forward(x, filter, w, cout, epilogue, pool);
    }
    let isa = kernel_isa();
    let g = &Geometry::of(w, cout);
    let filter = &PackedFilter::new(isa, filter, g.kernel[0] * g.kernel[1] * g.cin, cout);
    let pixels = g.oh * g.ow;
    let total = g.n * pixels * g.cout;
    assert!(
        x.len() >= g.n * g.h * g.w * g.cin,
        "conv operands smaller than their shapes"
    );
    let mut out: Vec<T> = crate::block_cache::with_capacity(total);
    let dst = SharedMut(out.as_mut_ptr());
    let per = IMAGES_PER_CHUNK_STATELESS;
    let (per_in, per_out) = (g.h * g.w * g.cin, pixels * g.cout);
    for_each_chunk_shared(g.n.div_ceil(per), |c| {
        for b in c * per..((c + 1) * per).min(g.n) {
            WIDE.with_borrow_mut(|[wide_in, wide_out]| {
                let image = as_f32(&x[b * per_in..(b + 1) * per_in], wide_in);
                Image::with(image, g, 0, |img| {
                    // SAFETY: the CPU has `isa` (callers check `available`); image b's rows
                    // of `out` belong to this chunk only; an f32 `T` is f32.
                    unsafe {
                        let out = dst.get().add(b * per_out);
                        if T::IS_F32 {
                            forward_image(isa, img, g, filter, epilogue, out as *mut f32)
                        } else {
                            wide_out.resize(per_out, 0.0);
                            forward_image(isa, img, g, filter, epilogue, wide_out.as_mut_ptr());
                            T::narrow_to(wide_out, out);
                        }
                        // Image b is written, and each chunk's images are its own.
                        if let Some(pool) = pool {
                            pool.image(b, out);
                        }
                    }
                })
            });
        }
    });
    // SAFETY: every image's tiles wrote all of its pixels' channels.
    unsafe { out.set_len(total) };
    out
}

/// The input gradient `[n, h, w, cin]` of `conv2d` (any strides, dilations, padding) for
/// output gradient `dy` (dense): per image, `Z = dy · Wᵀ` (`[oh·ow, kh·kw·cin]`, each
/// output pixel's contribution to every tap of its window) by the register tiles, then each
/// row of `Z` added into the window it came from. No multiply touches padding, unlike
/// running the forward kernel over a zero-padded `dy` (at 13x13 with a 3x3 window, 40% of
/// its products were with padding zeros).
pub(crate) fn backprop_input<T: Lanes>(filter: &[f32], dy: &[T], w: &Window2d) -> Vec<T> {
    let [n, h, wd, cin] = w.input;
    let taps = w.kernel[0] * w.kernel[1];
    let cout = filter.len() / (taps * cin).max(1);
    if super::f32_winograd::suits(w, cout) {
        return super::f32_winograd::backprop_input(filter, dy, w, cout);
    }
    let pixels = w.output[0] * w.output[1];
    let zcols = taps * cin;
    assert!(
        dy.len() >= n * pixels * cout && filter.len() >= zcols * cout,
        "conv operands smaller than their shapes"
    );
    // Wᵀ as a [cout, kh·kw·cin] matrix: element (j, t·cin + c) = filter[(t·cin + c)·cout + j].
    let isa = kernel_isa();
    let packed = PackedFilter::strided(isa, filter, cout, zcols, (1, cout as isize));
    let per_image = h * wd * cin;
    let mut dx: Vec<T> = crate::block_cache::with_capacity(n * per_image);
    let dst = SharedMut(dx.as_mut_ptr());
    let per = IMAGES_PER_CHUNK_STATELESS;
    thread_local! {
        static Z: std::cell::RefCell<Vec<f32>> = const { std::cell::RefCell::new(Vec::new()) };
    }
    for_each_chunk_shared(n.div_ceil(per), |c| {
        Z.with_borrow_mut(|z| {
            z.resize(pixels * zcols, 0.0);
            for b in c * per..((c + 1) * per).min(n) {
                WIDE.with_borrow_mut(|[wide_dy, _]| {
                    let dy = as_f32(&dy[b * pixels * cout..(b + 1) * pixels * cout], wide_dy);
                    // SAFETY: the CPU has `isa` (callers check `available`); dy holds
                    // image b's gradients; z holds pixels x zcols floats; image b's part of
                    // dx belongs to this chunk.
                    unsafe {
                        // z = dy · Wᵀ: each output pixel's contribution to every tap.
                        let (a, out) = (dy.as_ptr(), z.as_mut_ptr());
                        packed_product(isa, a, pixels, cout, &packed, zcols, out);
                        gather_windows(isa, z, w, dst.get().add(b * per_image));
                    }
                })
            }
        })
    });
    // SAFETY: scatter_windows wrote every element of every image.
    unsafe { dx.set_len(n * per_image) };
    dx
}

/// `out = a · b`: `a` `[rows, k]` row-major, `b` packed `[k, n]`, `out` `[rows, n]`
/// row-major, on `K`'s register tiles.
///
/// # Safety
/// The CPU has `K`'s instruction set; `a` holds `rows * k` floats and `out` has room for
/// `rows * n`; `b` is `[k, n]`.
#[inline(always)]
unsafe fn packed_product_with<K: Kernels>(
    a: *const f32,
    rows: usize,
    k: usize,
    b: &PackedFilter,
    n: usize,
    out: *mut f32,
) {
    for r0 in (0..rows).step_by(K::ROWS) {
        let h = K::ROWS.min(rows - r0);
        let rows = std::array::from_fn(|r| (r.min(h - 1) * k) as isize);
        let a = (a.add(r0 * k), rows, &[0isize][..], k);
        let tile = tile_of_rows(a, (out.add(r0 * n), n), (std::ptr::null(), false));
        run_panels::<K>(tile, b, 0, n, h);
    }
}

with_isa! {
    /// [`packed_product_with`] on `isa`'s kernels.
    pub(super) unsafe fn packed_product(
        a: *const f32,
        rows: usize,
        k: usize,
        b: &PackedFilter,
        n: usize,
        out: *mut f32,
    ) = packed_product_with;
}

/// `dx` (one image, `h x w x cin`): each input pixel's gradient is the sum of the
/// segments of `z` (output pixel, tap) whose tap read that pixel, added in registers and
/// stored once.
///
/// # Safety
/// The CPU has `K`'s instruction set; `z` holds the image's `oh·ow x kh·kw·cin`
/// contributions; `dx` has room for the image's `h * w * cin` floats.
#[inline(always)]
unsafe fn gather_windows_with<K: Kernels, T: Lanes>(z: &[f32], w: &Window2d, dx: *mut T) {
    let [_, h, wd, cin] = w.input;
    let [oh, ow] = w.output;
    let [kh, kw] = w.kernel;
    let zcols = kh * kw * cin;
    assert!(
        z.len() >= oh * ow * zcols,
        "contributions smaller than the image's"
    );
    // The output position whose tap `t` reads input position `i` along one axis, if any.
    let source = |i: usize, t: usize, stride: usize, dilation: usize, pad: usize, out: usize| {
        let p = (i + pad).checked_sub(t * dilation)?;
        (p % stride == 0 && p / stride < out).then_some(p / stride)
    };
    let mut segments: Vec<usize> = Vec::with_capacity(kh * kw);
    for iy in 0..h {
        for ix in 0..wd {
            segments.clear();
            for ty in 0..kh {
                let Some(oy) = source(iy, ty, w.strides[0], w.dilations[0], w.pad_before[0], oh)
                else {
                    continue;
                };
                for tx in 0..kw {
                    if let Some(ox) =
                        source(ix, tx, w.strides[1], w.dilations[1], w.pad_before[1], ow)
                    {
                        segments.push((oy * ow + ox) * zcols + (ty * kw + tx) * cin);
                    }
                }
            }
            let d = dx.add((iy * wd + ix) * cin);
            for c0 in (0..cin).step_by(K::LANES) {
                let len = K::LANES.min(cin - c0);
                let mut acc = K::zero();
                for &o in &segments {
                    acc = K::add(acc, K::load(z.as_ptr().add(o + c0), len));
                }
                K::store_to(d.add(c0), len, acc);
            }
        }
    }
}

with_isa! {
    /// [`gather_windows_with`] on `isa`'s kernels.
    unsafe fn gather_windows[T: Lanes][T](z: &[f32], w: &Window2d, dx: *mut T) = gather_windows_with;
}

/// The filter gradient `[kh, kw, cin, cout]` of `conv2d` for input `x` and output gradient
/// `dy` (both dense): per image, tiles of `MR` filter rows (tap, channel) by `NR` output
/// channels accumulate over the image's pixels; chunks of images sum into their own
/// partial gradient, added up at the end.
pub(crate) fn backprop_filter<T: Lanes>(x: &[T], dy: &[T], w: &Window2d, cout: usize) -> Vec<f32> {
    if super::f32_winograd::suits(w, cout) {
        return super::f32_winograd::backprop_filter(x, dy, w, cout);
    }
    let isa = kernel_isa();
    let g = Geometry::of(w, cout);
    let rows = g.kernel[0] * g.kernel[1] * g.cin;
    let pixels = g.oh * g.ow;
    assert!(
        x.len() >= g.n * g.h * g.w * g.cin && dy.len() >= g.n * pixels * cout,
        "conv operands smaller than their shapes"
    );
    let per = images_per_chunk(g.n);
    let chunks = g.n.div_ceil(per).max(1);
    let mut partials = vec![0f32; chunks * rows * cout];
    let dst = SharedMut(partials.as_mut_ptr());
    let (per_in, per_out) = (g.h * g.w * g.cin, pixels * cout);
    for_each_chunk_shared(g.n.div_ceil(per), |c| {
        for b in c * per..((c + 1) * per).min(g.n) {
            WIDE.with_borrow_mut(|[wide_in, wide_dy]| {
                let image = as_f32(&x[b * per_in..(b + 1) * per_in], wide_in);
                let dy = as_f32(&dy[b * per_out..(b + 1) * per_out], wide_dy);
                Image::with(image, &g, 0, |img| {
                    // SAFETY: the CPU has `isa` (callers check `available`); dy holds image
                    // b's pixels; partial c (rows x cout floats) belongs to this chunk only.
                    unsafe {
                        let partial = dst.get().add(c * rows * cout);
                        filter_grad_image(isa, img, &g, dy.as_ptr(), partial)
                    }
                })
            });
        }
    });
    sum_partials(partials, rows * cout)
}

/// The sum of the consecutive `len`-float partial results in `partials` (chunks of images
/// that each summed their own filter gradient).
pub(super) fn sum_partials(mut partials: Vec<f32>, len: usize) -> Vec<f32> {
    let (first, rest) = partials.split_at_mut(len);
    for part in rest.chunks(len) {
        for (a, b) in first.iter_mut().zip(part) {
            *a += b;
        }
    }
    partials.truncate(len);
    partials
}

/// Adds one image's filter gradient to `grad` (`[kh·kw·cin, cout]`), with `K`'s tiles.
///
/// # Safety
/// The CPU has `K`'s instruction set; `dy` holds the image's `oh * ow * cout` gradients and
/// `grad` is valid for `kh·kw·cin * cout` floats.
#[inline(always)]
unsafe fn filter_grad_image_with<K: Kernels>(
    img: &Image,
    g: &Geometry,
    dy: *const f32,
    grad: *mut f32,
) {
    let taps = g.taps(img.pitch);
    let rows = taps.len() * g.cin;
    // Filter row m = (tap, channel) reads the input at the pixel's corner + this offset.
    let offset = |m: usize| taps[m / g.cin] + (m % g.cin) as isize;
    // k runs over the output pixels: one run per output row.
    let output_rows: Vec<isize> = (0..g.oh)
        .map(|oy| (oy * g.strides[0] * img.pitch * g.cin) as isize)
        .collect();
    for m0 in (0..rows).step_by(K::ROWS) {
        let h = K::ROWS.min(rows - m0);
        let row_offsets = std::array::from_fn(|r| if r < h { offset(m0 + r) } else { 0 });
        for q in 0..g.cout.div_ceil(NR) {
            let tile = Tile {
                a: img.data,
                rows: row_offsets,
                a_cs: (g.strides[1] * g.cin) as isize,
                segments: &output_rows,
                seg_len: g.ow,
                b: dy.add(q * NR),
                b_rs: g.cout as isize,
                masks: column_masks(NR.min(g.cout - q * NR)),
                c: grad.add(m0 * g.cout + q * NR),
                ldc: g.cout,
                add: true,
                bias: std::ptr::null(),
                relu: false,
            };
            K::run_rows(&tile, h);
        }
    }
}

with_isa! {
    /// [`filter_grad_image_with`] on `isa`'s kernels.
    unsafe fn filter_grad_image(
        img: &Image,
        g: &Geometry,
        dy: *const f32,
        grad: *mut f32,
    ) = filter_grad_image_with;
}

#[cfg(test)]
mod tests {
    use super::*;
    use ferroflow_tensor::Padding;
    use half::{bf16, f16};

    /// The convolutions on half-precision data (read and written as their own type, in
    /// registers or image by image) give, bit for bit, the float32 kernels' results on the
    /// widened data, rounded: direct and Winograd kernels, forward (fused), input and filter
    /// gradients.
    #[test]
    fn half_data_matches_float32_on_widened_values_bit_for_bit() {
        if !available() {
            return ferroflow_tensor::testing::skip(
                "FERROFLOW_REQUIRE_AVX512",
                "neither AVX-512 nor AVX2 + FMA here (or FERROFLOW_CPU_ISA=scalar); these kernels do not run",
            );
        }
        matches_widened(bf16::from_f32, bf16::to_f32);
        matches_widened(f16::from_f32, f16::to_f32);
    }

    fn matches_widened<H: Lanes + std::fmt::Debug>(of: fn(f32) -> H, wide1: fn(H) -> f32) {
        // (input, kernel, padding, cout): direct (few channels, strided, padded) and
        // Winograd (3x3 stride 1, ≥ 16 channels; a channel tail past 16).
        for (shape, k, strides, pad, cout) in [
            ([3, 9, 8, 1], [3, 3], [1, 1], Padding::Valid, 32),
            ([2, 7, 7, 3], [3, 3], [2, 2], Padding::Same, 20),
            ([3, 9, 10, 16], [3, 3], [1, 1], Padding::Valid, 32),
            ([2, 6, 7, 18], [3, 3], [1, 1], Padding::Same, 17),
        ] {
            let w = Window2d::resolve("test", shape, k, strides, [1, 1], pad).unwrap();
            let mut seed = 0x2545_f491u32;
            let mut next = move || {
                seed ^= seed << 13;
                seed ^= seed >> 17;
                seed ^= seed << 5;
                of((seed % 2001) as f32 / 1000.0 - 1.0)
            };
            let per_y = w.output[0] * w.output[1] * cout;
            let x: Vec<H> = (0..shape.iter().product()).map(|_| next()).collect();
            let dy: Vec<H> = (0..shape[0] * per_y).map(|_| next()).collect();
            let filter: Vec<f32> = (0..k[0] * k[1] * shape[3] * cout)
                .map(|_| wide1(next()))
                .collect();
            let bias: Vec<f32> = (0..cout).map(|_| wide1(next())).collect();
            let wide = |v: &[H]| -> Vec<f32> { v.iter().map(|&h| wide1(h)).collect() };
            let bits = |v: &[H]| -> Vec<u32> { v.iter().map(|&h| wide1(h).to_bits()).collect() };
            let rounded =
                |v: &[f32]| -> Vec<u32> { v.iter().map(|&f| wide1(of(f)).to_bits()).collect() };
            let epilogue = Some(Epilogue {
                bias: &bias,
                activation: FusedActivation::Relu,
            });
            let case = format!("{shape:?} -> {cout}");
            assert_eq!(
                bits(&forward(&x, &filter, &w, cout, epilogue, None)),
                rounded(&forward(&wide(&x), &filter, &w, cout, epilogue, None)),
                "forward {case}"
            );
            assert_eq!(
                bits(&backprop_input(&filter, &dy, &w)),
                rounded(&backprop_input(&filter, &wide(&dy), &w)),
                "input gradient {case}"
            );
            assert_eq!(
                backprop_filter(&x, &dy, &w, cout),
                backprop_filter(&wide(&x), &wide(&dy), &w, cout),
                "filter gradient {case}"
            );
        }
    }
}
