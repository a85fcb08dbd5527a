//! Max pooling and its gradient in float32 on AVX-512 (NHWC): per window, 16 channels per
//! vector, the window's taps read in place, one pass over the input.
//!
//! The gradient recomputes each window's maximum and sends the window's gradient to the
//! first tap holding it (a NaN: the first NaN), as the generic kernel in `conv.rs` does; it
//! writes the input gradient image by image while the image is in cache, so no zeroed
//! whole-buffer pass precedes it. Windows that tile the input (Keras' default pooling) store
//! their taps; overlapping windows add to them.

use super::conv::for_windows;
use super::f32_conv::Geometry;
use crate::simd::{for_each_chunk_shared, SharedMut};
use ferroflow_tensor::Window2d;

/// Whether these kernels run here (AVX-512); callers use the generic kernels otherwise.
pub(crate) fn available() -> bool {
    crate::simd::has_avx512()
}

/// Runs `image(b, out_of_image_b)` for every image on the pool, `per_image` output floats
/// each, into a new uninitialised buffer every image fills entirely.
fn per_image(n: usize, per_image: usize, image: impl Fn(usize, *mut f32) + Sync) -> Vec<f32> {
    let total = n * per_image;
    let mut out: Vec<f32> = Vec::with_capacity(total);
    let dst = SharedMut(out.as_mut_ptr());
    let per = n.div_ceil(4 * rayon::current_num_threads()).max(1);
    for_each_chunk_shared(n.div_ceil(per), |c| {
        for b in c * per..((c + 1) * per).min(n) {
            // SAFETY: image b's part of `out` belongs to this chunk only.
            image(b, unsafe { dst.get().add(b * per_image) });
        }
    });
    // SAFETY: `image` wrote every float of every image (its contract).
    unsafe { out.set_len(total) };
    out
}

/// The taps of every window of an image, as offsets in floats from the image's start.
struct Windows {
    /// Offsets of the taps from a window's corner when no window reaches past the image
    /// (no padding): the same for every window, so none is computed per window.
    fixed: Option<Vec<usize>>,
    /// The current window's taps otherwise.
    taps: Vec<usize>,
}

impl Windows {
    fn new(w: &Window2d) -> Windows {
        let [_, _, wd, c] = w.input;
        let inside = Geometry::of(w, c).inside();
        let fixed = inside.then(|| {
            let mut v = Vec::with_capacity(w.kernel[0] * w.kernel[1]);
            for ky in 0..w.kernel[0] {
                for kx in 0..w.kernel[1] {
                    v.push((ky * wd + kx) * c);
                }
            }
            v
        });
        Windows {
            fixed,
            taps: Vec::with_capacity(w.kernel[0] * w.kernel[1]),
        }
    }

    /// Window `(oy, ox)`'s valid taps: `(corner, offsets)`, each tap at `corner + offset`.
    fn at(&mut self, w: &Window2d, oy: usize, ox: usize) -> (usize, &[usize]) {
        let [_, _, wd, c] = w.input;
        if let Some(fixed) = &self.fixed {
            return ((oy * w.strides[0] * wd + ox * w.strides[1]) * c, fixed);
        }
        self.taps.clear();
        let taps = &mut self.taps;
        for_windows(w, oy, ox, |iy, ix| taps.push((iy * wd + ix) * c));
        (0, &self.taps)
    }
}

/// `max_pool2d(x)`: `x` `[n, h, w, c]` dense, windows and output as `w` says. A window
/// entirely inside the padding yields `f32::MIN` (as the generic kernel).
pub(crate) fn max_pool(x: &[f32], w: &Window2d) -> Vec<f32> {
    let [n, h, wd, c] = w.input;
    assert!(
        x.len() >= n * h * wd * c,
        "max_pool2d input smaller than its shape"
    );
    per_image(n, w.output[0] * w.output[1] * c, |b, out| {
        // SAFETY: AVX-512 (callers check `available`); image b lies in x; `out` holds the
        // image's oh * ow * c outputs.
        unsafe { max_pool_image(x[b * h * wd * c..].as_ptr(), w, out) }
    })
}

/// The gradient of `max_pool2d` for input `x` and output gradient `dy` (both dense).
pub(crate) fn max_pool_grad(x: &[f32], dy: &[f32], w: &Window2d) -> Vec<f32> {
    let [n, h, wd, c] = w.input;
    let per_dy = w.output[0] * w.output[1] * c;
    assert!(
        x.len() >= n * h * wd * c && dy.len() >= n * per_dy,
        "max_pool_grad operands smaller than their shapes"
    );
    per_image(n, h * wd * c, |b, dx| {
        // SAFETY: AVX-512 (callers check `available`); image b lies in x and its gradients
        // in dy; `dx` holds the image's h * w * c floats.
        unsafe {
            max_pool_grad_image(
                x[b * h * wd * c..].as_ptr(),
                dy[b * per_dy..].as_ptr(),
                w,
                dx,
            )
        }
    })
}

#[cfg(target_arch = "x86_64")]
mod avx512 {
    use std::arch::x86_64::*;

    /// Lanes of channel block `c0` that hold channels (`c` channels in all).
    #[inline(always)]
    pub(super) fn lanes(c: usize, c0: usize) -> __mmask16 {
        if c - c0 >= 16 {
            0xffff
        } else {
            (1u16 << (c - c0)) - 1
        }
    }

    /// The maximum of `m` and `v` per lane, a NaN in `v` taken unless `m` is one already
    /// (so the first NaN wins).
    #[inline(always)]
    pub(super) unsafe fn max_first_nan(m: __m512, v: __m512) -> __m512 {
        let greater = _mm512_cmp_ps_mask::<_CMP_GT_OQ>(v, m);
        let new_nan =
            _mm512_cmp_ps_mask::<_CMP_UNORD_Q>(v, v) & !_mm512_cmp_ps_mask::<_CMP_UNORD_Q>(m, m);
        _mm512_mask_mov_ps(m, greater | new_nan, v)
    }

    /// Lanes where `v` is the maximum `m` (NaN matching NaN).
    #[inline(always)]
    pub(super) unsafe fn is_max(v: __m512, m: __m512) -> __mmask16 {
        _mm512_cmp_ps_mask::<_CMP_EQ_OQ>(v, m)
            | (_mm512_cmp_ps_mask::<_CMP_UNORD_Q>(v, v) & _mm512_cmp_ps_mask::<_CMP_UNORD_Q>(m, m))
    }
}

/// The pooled outputs of one image.
///
/// # Safety
/// AVX-512F is present; `x` holds the image's `h * w * c` floats and `out` has room for its
/// `oh * ow * c` outputs.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx512f")]
unsafe fn max_pool_image(x: *const f32, w: &Window2d, out: *mut f32) {
    use std::arch::x86_64::*;
    let c = w.input[3];
    let [oh, ow] = w.output;
    let mut windows = Windows::new(w);
    for oy in 0..oh {
        for ox in 0..ow {
            let (corner, taps) = windows.at(w, oy, ox);
            let (x, o) = (x.add(corner), out.add((oy * ow + ox) * c));
            for c0 in (0..c).step_by(16) {
                let k = avx512::lanes(c, c0);
                let mut m = _mm512_set1_ps(f32::MIN);
                for &t in taps {
                    // Generic kernel's rule: a later tap wins when greater or NaN.
                    let v = _mm512_maskz_loadu_ps(k, x.add(t + c0));
                    let take = _mm512_cmp_ps_mask::<_CMP_GT_OQ>(v, m)
                        | _mm512_cmp_ps_mask::<_CMP_UNORD_Q>(v, v);
                    m = _mm512_mask_mov_ps(m, take, v);
                }
                _mm512_mask_storeu_ps(o.add(c0), k, m);
            }
        }
    }
}

/// The input gradient of one image.
///
/// # Safety
/// AVX-512F is present; `x` holds the image's `h * w * c` floats, `dy` its `oh * ow * c`
/// gradients, and `dx` has room for `h * w * c` floats.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx512f")]
unsafe fn max_pool_grad_image(x: *const f32, dy: *const f32, w: &Window2d, dx: *mut f32) {
    use std::arch::x86_64::*;
    let [_, h, wd, c] = w.input;
    let [oh, ow] = w.output;
    let tiled = w.strides == w.kernel && w.pad_before == [0, 0];
    let covered = tiled && oh * w.kernel[0] == h && ow * w.kernel[1] == wd;
    if !covered {
        std::ptr::write_bytes(dx, 0, h * wd * c);
    }
    let mut windows = Windows::new(w);
    for oy in 0..oh {
        for ox in 0..ow {
            let (corner, taps) = windows.at(w, oy, ox);
            let Some(&first) = taps.first() else {
                continue; // a window entirely inside the padding
            };
            let (x, dx) = (x.add(corner), dx.add(corner));
            let g = dy.add((oy * ow + ox) * c);
            for c0 in (0..c).step_by(16) {
                let k = avx512::lanes(c, c0);
                let mut m = _mm512_maskz_loadu_ps(k, x.add(first + c0));
                for &t in &taps[1..] {
                    m = avx512::max_first_nan(m, _mm512_maskz_loadu_ps(k, x.add(t + c0)));
                }
                let grad = _mm512_maskz_loadu_ps(k, g.add(c0));
                let mut open: __mmask16 = k;
                for &t in taps {
                    let hit = avx512::is_max(_mm512_maskz_loadu_ps(k, x.add(t + c0)), m) & open;
                    open &= !hit;
                    let d = dx.add(t + c0);
                    if tiled {
                        _mm512_mask_storeu_ps(d, k, _mm512_maskz_mov_ps(hit, grad));
                    } else {
                        let sum = _mm512_maskz_loadu_ps(k, d);
                        _mm512_mask_storeu_ps(d, k, _mm512_mask_add_ps(sum, hit, sum, grad));
                    }
                }
            }
        }
    }
}

#[cfg(not(target_arch = "x86_64"))]
unsafe fn max_pool_image(_: *const f32, _: &Window2d, _: *mut f32) {
    unreachable!("the AVX-512 pooling kernels are only chosen on x86-64 with AVX-512")
}

#[cfg(not(target_arch = "x86_64"))]
unsafe fn max_pool_grad_image(_: *const f32, _: *const f32, _: &Window2d, _: *mut f32) {
    unreachable!("the AVX-512 pooling kernels are only chosen on x86-64 with AVX-512")
}
