//! Direct float32 convolutions on AVX-512 (NHWC input, `[kh, kw, cin, cout]` filter) on the
//! register tiles of [`super::f32_gemm`]: no im2col matrix is ever written.
//!
//! A tile is up to [`MR`] consecutive output pixels by [`NR`] output channels; its k steps
//! are the `kh·kw` filter taps, each a run of `cin` contiguous input channels read in place
//! from the image (or from a zero-padded copy of one image when the window reaches past
//! the border). The filter is packed once into panels of `NR` output channels.
//!
//! The input gradient of a stride-1 convolution is the same kernel run over the output
//! gradient (padded by the window's extent) with the filter flipped and its channel axes
//! swapped. The filter gradient sums, per image, pixel-by-pixel outer products of input
//! windows and output gradients into `[kh·kw·cin, cout]` tiles.

use super::f32_gemm::{column_masks, pack_panel, Tile, MR, NR};
use crate::simd::{for_each_chunk_shared, SharedMut};
use ferroflow_tensor::{FusedActivation, Window2d};

/// Whether these kernels run here (AVX-512); callers fall back to im2col + GEMM otherwise.
pub(crate) fn available() -> bool {
    crate::simd::has_avx512()
}

/// A convolution's shape: `[n, h, w, cin]` in, `[n, oh, ow, cout]` out.
#[derive(Clone, Copy)]
struct Geometry {
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
    fn of(w: &Window2d, cout: usize) -> Geometry {
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
    fn inside(&self) -> bool {
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
struct PackedFilter {
    data: Vec<f32>,
    k: usize,
}

impl PackedFilter {
    fn new(f: &[f32], k: usize, cout: usize) -> PackedFilter {
        assert!(f.len() >= k * cout, "filter smaller than its shape");
        let panels = cout.div_ceil(NR);
        let mut data = vec![0f32; panels * k * NR];
        for q in 0..panels {
            // SAFETY: AVX-512 (callers check `available`); the panel lies inside f and data.
            unsafe {
                pack_panel(
                    f.as_ptr().add(q * NR),
                    (cout as isize, 1),
                    k,
                    NR.min(cout - q * NR),
                    data.as_mut_ptr().add(q * k * NR),
                )
            };
        }
        PackedFilter { data, k }
    }

    fn panel(&self, q: usize) -> *const f32 {
        self.data[q * self.k * NR..].as_ptr()
    }
}

/// Images per parallel chunk (a few chunks per thread, claimed as threads come).
fn images_per_chunk(n: usize) -> usize {
    n.div_ceil(4 * rayon::current_num_threads()).max(1)
}

/// What a fused convolution does to each output after the sum: add `bias[channel]`, then
/// the activation.
#[derive(Clone, Copy)]
pub(crate) struct Epilogue<'a> {
    pub(crate) bias: &'a [f32],
    pub(crate) activation: FusedActivation,
}

/// `[n, oh, ow, cout]` = the convolution of `x` with a packed filter, each image's outputs
/// finished by `epilogue` while they are in cache.
fn forward_packed(
    x: &[f32],
    g: &Geometry,
    filter: &PackedFilter,
    epilogue: Option<Epilogue<'_>>,
) -> Vec<f32> {
    let pixels = g.oh * g.ow;
    let total = g.n * pixels * g.cout;
    assert!(
        x.len() >= g.n * g.h * g.w * g.cin && filter.k == g.kernel[0] * g.kernel[1] * g.cin,
        "conv operands smaller than their shapes"
    );
    let mut out: Vec<f32> = Vec::with_capacity(total);
    let dst = SharedMut(out.as_mut_ptr());
    let per = images_per_chunk(g.n);
    for_each_chunk_shared(g.n.div_ceil(per), |c| {
        for b in c * per..((c + 1) * per).min(g.n) {
            Image::with(x, g, b, |img| {
                // SAFETY: AVX-512 (checked by callers); image b's rows of `out` belong to
                // this chunk only.
                unsafe {
                    let out = dst.get().add(b * pixels * g.cout);
                    forward_image(img, g, filter, out);
                    if let Some(e) = epilogue {
                        finish_image(out, pixels, g.cout, e);
                    }
                }
            });
        }
    });
    // SAFETY: every image's tiles wrote all of its pixels' channels.
    unsafe { out.set_len(total) };
    out
}

/// The output pixels of one image, `[oh * ow, cout]` at `out`.
///
/// # Safety
/// AVX-512F is present; `out` is valid for the image's `oh * ow * cout` floats.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx512f")]
unsafe fn forward_image(img: &Image, g: &Geometry, filter: &PackedFilter, out: *mut f32) {
    let taps = g.taps(img.pitch);
    let corner = |oy: usize, ox: usize| {
        ((oy * g.strides[0] * img.pitch + ox * g.strides[1]) * g.cin) as isize
    };
    let tile = |rows: [isize; MR], h: usize, p0: usize, tap_rows: (usize, usize)| {
        let kw = g.kernel[1];
        let k0 = tap_rows.0 * kw;
        for q in 0..g.cout.div_ceil(NR) {
            // Every window of the tile's pixels lies inside the image (a padded copy when
            // needed); the panel holds k x NR floats; the tile writes rows p0..p0+h,
            // columns of panel q.
            Tile {
                a: img.data,
                rows,
                a_cs: 1,
                segments: &taps[k0..tap_rows.1 * kw],
                seg_len: g.cin,
                b: filter.panel(q).add(k0 * g.cin * NR),
                b_rs: NR as isize,
                masks: column_masks(NR.min(g.cout - q * NR)),
                c: out.add(p0 * g.cout + q * NR),
                ldc: g.cout,
                add: false,
            }
            .run_rows(h)
        }
    };
    if g.inside() {
        // No padding: tiles run across output rows, every tap in use.
        let pixels = g.oh * g.ow;
        for p0 in (0..pixels).step_by(MR) {
            let h = MR.min(pixels - p0);
            let rows = std::array::from_fn(|r| {
                let p = p0 + r.min(h - 1);
                corner(p / g.ow, p % g.ow)
            });
            tile(rows, h, p0, (0, g.kernel[0]));
        }
        return;
    }
    // Padded: tiles stay within an output row, so the filter rows whose taps fall in the
    // top or bottom padding for that row are skipped rather than multiplied by zeros (a
    // stride-1 input gradient's padded output gradient is 40% padding at 13x13, 3x3).
    let pad_top = g.pad_before[0];
    for oy in 0..g.oh {
        let row_of = |ty: usize| oy * g.strides[0] + ty * g.dilations[0];
        let real = |ty: usize| (pad_top..pad_top + g.h).contains(&row_of(ty));
        let first = (0..g.kernel[0]).find(|&ty| real(ty));
        let last = (0..g.kernel[0]).rev().find(|&ty| real(ty));
        for ox0 in (0..g.ow).step_by(MR) {
            let h = MR.min(g.ow - ox0);
            let p0 = oy * g.ow + ox0;
            match (first, last) {
                (Some(a), Some(b)) => {
                    let rows = std::array::from_fn(|r| corner(oy, ox0 + r.min(h - 1)));
                    tile(rows, h, p0, (a, b + 1));
                }
                // The whole window row is padding: zeros.
                _ => {
                    for r in 0..h {
                        std::ptr::write_bytes(out.add((p0 + r) * g.cout), 0, g.cout);
                    }
                }
            }
        }
    }
}

/// Applies `e` to one image's `pixels x cout` outputs at `out`.
///
/// # Safety
/// AVX-512F is present; `out` is valid for `pixels * cout` floats; `e.bias` holds `cout`.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx512f")]
unsafe fn finish_image(out: *mut f32, pixels: usize, cout: usize, e: Epilogue<'_>) {
    use std::arch::x86_64::*;
    assert!(
        e.bias.len() >= cout,
        "bias shorter than the output channels"
    );
    let relu = e.activation == FusedActivation::Relu;
    for p in 0..pixels {
        let row = out.add(p * cout);
        for c0 in (0..cout).step_by(16) {
            let k: __mmask16 = if cout - c0 >= 16 {
                0xffff
            } else {
                (1u16 << (cout - c0)) - 1
            };
            let mut v = _mm512_add_ps(
                _mm512_maskz_loadu_ps(k, row.add(c0)),
                _mm512_maskz_loadu_ps(k, e.bias.as_ptr().add(c0)),
            );
            if relu {
                // 0 where v <= 0 (as the relu kernel: NaN kept, -0 becomes 0).
                let off = _mm512_cmp_ps_mask::<_CMP_LE_OQ>(v, _mm512_setzero_ps());
                v = _mm512_mask_mov_ps(v, off, _mm512_setzero_ps());
            }
            _mm512_mask_storeu_ps(row.add(c0), k, v);
        }
    }
}

#[cfg(not(target_arch = "x86_64"))]
unsafe fn finish_image(_: *mut f32, _: usize, _: usize, _: Epilogue<'_>) {
    unreachable!("the direct convolutions are only chosen on x86-64 with AVX-512")
}

#[cfg(not(target_arch = "x86_64"))]
unsafe fn forward_image(_: &Image, _: &Geometry, _: &PackedFilter, _: *mut f32) {
    unreachable!("the direct convolutions are only chosen on x86-64 with AVX-512")
}

/// `conv2d(x, filter)`: `x` `[n, h, w, cin]`, `filter` `[kh, kw, cin, cout]`, both dense.
///
/// With an `epilogue`, `activation(conv2d(x, filter) + bias)` (a fused convolution).
pub(crate) fn forward(
    x: &[f32],
    filter: &[f32],
    w: &Window2d,
    cout: usize,
    epilogue: Option<Epilogue<'_>>,
) -> Vec<f32> {
    let g = Geometry::of(w, cout);
    let k = g.kernel[0] * g.kernel[1] * g.cin;
    forward_packed(x, &g, &PackedFilter::new(filter, k, cout), epilogue)
}

/// The input gradient of a stride-1 convolution (`None` for other strides, or padding
/// wider than the window, which the caller runs through im2col): the forward kernel over
/// `dy` padded by the window's extent, with the filter flipped and `cin`/`cout` swapped.
pub(crate) fn backprop_input(filter: &[f32], dy: &[f32], w: &Window2d) -> Option<Vec<f32>> {
    let [kh, kw] = w.kernel;
    let [dh, dw] = w.dilations;
    let (cin, cout) = (w.input[3], filter.len() / (kh * kw * w.input[3]).max(1));
    let reach = [(kh - 1) * dh, (kw - 1) * dw];
    if w.strides != [1, 1] || w.pad_before[0] > reach[0] || w.pad_before[1] > reach[1] {
        return None;
    }
    // flipped[dy'][dx'][j][c] = filter[kh-1-dy'][kw-1-dx'][c][j]
    let mut flipped = vec![0f32; kh * kw * cout * cin];
    for ty in 0..kh {
        for tx in 0..kw {
            let src = ((kh - 1 - ty) * kw + (kw - 1 - tx)) * cin * cout;
            let dst = (ty * kw + tx) * cout * cin;
            for c in 0..cin {
                for j in 0..cout {
                    flipped[dst + j * cin + c] = filter[src + c * cout + j];
                }
            }
        }
    }
    let g = Geometry {
        n: w.input[0],
        h: w.output[0],
        w: w.output[1],
        cin: cout,
        kernel: w.kernel,
        strides: [1, 1],
        dilations: w.dilations,
        pad_before: [reach[0] - w.pad_before[0], reach[1] - w.pad_before[1]],
        oh: w.input[1],
        ow: w.input[2],
        cout: cin,
    };
    let packed = PackedFilter::new(&flipped, kh * kw * cout, cin);
    Some(forward_packed(dy, &g, &packed, None))
}

/// The filter gradient `[kh, kw, cin, cout]` of `conv2d` for input `x` and output gradient
/// `dy` (both dense): per image, tiles of `MR` filter rows (tap, channel) by `NR` output
/// channels accumulate over the image's pixels; chunks of images sum into their own
/// partial gradient, added up at the end.
pub(crate) fn backprop_filter(x: &[f32], dy: &[f32], w: &Window2d, cout: usize) -> Vec<f32> {
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
    for_each_chunk_shared(g.n.div_ceil(per), |c| {
        for b in c * per..((c + 1) * per).min(g.n) {
            Image::with(x, &g, b, |img| {
                // SAFETY: AVX-512 (checked by callers); dy holds image b's pixels; partial c
                // (rows x cout floats) belongs to this chunk only.
                unsafe {
                    filter_grad_image(
                        img,
                        &g,
                        dy[b * pixels * cout..].as_ptr(),
                        dst.get().add(c * rows * cout),
                    )
                }
            });
        }
    });
    let (first, rest) = partials.split_at_mut(rows * cout);
    for part in rest.chunks(rows * cout) {
        for (a, b) in first.iter_mut().zip(part) {
            *a += b;
        }
    }
    partials.truncate(rows * cout);
    partials
}

/// Adds one image's filter gradient to `grad` (`[kh·kw·cin, cout]`).
///
/// # Safety
/// AVX-512F is present; `dy` holds the image's `oh * ow * cout` gradients and `grad` is
/// valid for `kh·kw·cin * cout` floats.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx512f")]
unsafe fn filter_grad_image(img: &Image, g: &Geometry, dy: *const f32, grad: *mut f32) {
    let taps = g.taps(img.pitch);
    let rows = taps.len() * g.cin;
    // Filter row m = (tap, channel) reads the input at the pixel's corner + this offset.
    let offset = |m: usize| taps[m / g.cin] + (m % g.cin) as isize;
    // k runs over the output pixels: one run per output row.
    let output_rows: Vec<isize> = (0..g.oh)
        .map(|oy| (oy * g.strides[0] * img.pitch * g.cin) as isize)
        .collect();
    for m0 in (0..rows).step_by(MR) {
        let h = MR.min(rows - m0);
        let row_offsets = std::array::from_fn(|r| if r < h { offset(m0 + r) } else { 0 });
        for q in 0..g.cout.div_ceil(NR) {
            Tile {
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
            }
            .run_rows(h)
        }
    }
}

#[cfg(not(target_arch = "x86_64"))]
unsafe fn filter_grad_image(_: &Image, _: &Geometry, _: *const f32, _: *mut f32) {
    unreachable!("the direct convolutions are only chosen on x86-64 with AVX-512")
}
