//! Max pooling and its gradient on AVX-512 or AVX2 (NHWC): per window, a vector of channels
//! at a time, the window's taps read in place, one pass over the input; written once over
//! [`Kernels`] and compiled per instruction set ([`with_isa!`]).
//!
//! Half types run natively: their values widen exactly to f32 lanes in registers, the
//! maximum of half values is one of them, and a gradient element is a `dy` value or zero,
//! so every half-precision store is exact. No f32 buffer is made.
//!
//! The gradient recomputes each window's maximum and sends the window's gradient to the
//! first tap holding it (a NaN: the first NaN), as the generic kernel in `conv.rs` does; it
//! writes the input gradient image by image while the image is in cache, so no zeroed
//! whole-buffer pass precedes it. Windows that tile the input (Keras' default pooling) store
//! their taps; overlapping windows add to them (float32 only: half-precision sums would round at every
//! addition, so [`grad_exact`] sends them to the widened path).

use super::bias;
use super::conv::for_windows;
use super::f32_conv::{kernel_isa, Geometry};
use super::f32_gemm::{with_isa, Kernels};
use crate::lanes::Lanes;
use crate::simd::{for_each_chunk_shared, Isa, SharedMut};
use ferroflow_tensor::Window2d;
use std::sync::atomic::{AtomicUsize, Ordering};

/// Whether these kernels run here (float32 and half types alike): as the convolutions'.
pub(crate) use super::f32_conv::available;

/// Runs `image(b, out_of_image_b)` for every image on the pool, `per_image` outputs each,
/// into a new uninitialised buffer every image fills entirely.
fn per_image<T: Copy>(n: usize, per_image: usize, image: impl Fn(usize, *mut T) + Sync) -> Vec<T> {
    let total = n * per_image;
    let mut out: Vec<T> = crate::block_cache::with_capacity(total);
    let dst = SharedMut(out.as_mut_ptr());
    let per = n.div_ceil(4 * rayon::current_num_threads()).max(1);
    for_each_chunk_shared(n.div_ceil(per), |c| {
        for b in c * per..((c + 1) * per).min(n) {
            // SAFETY: image b's part of `out` belongs to this chunk only.
            image(b, unsafe { dst.get().add(b * per_image) });
        }
    });
    // SAFETY: `image` wrote every element of every image (its contract).
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
/// entirely inside the padding yields the type's lowest finite value (as the generic
/// kernel).
pub(crate) fn max_pool<T: Lanes>(x: &[T], w: &Window2d) -> Vec<T> {
    let [n, h, wd, c] = w.input;
    assert!(
        x.len() >= n * h * wd * c,
        "max_pool2d input smaller than its shape"
    );
    let isa = kernel_isa();
    per_image(n, w.output[0] * w.output[1] * c, |b, out| {
        // SAFETY: the CPU has `isa` (callers check `available`); image b lies in x; `out`
        // holds the image's oh * ow * c outputs.
        unsafe { max_pool_image(isa, x[b * h * wd * c..].as_ptr(), w, out) }
    })
}

/// The max pooling of a convolution's output, image by image, run by the convolution as
/// soon as it has written an image ([`PoolEachImage::image`]), while the image is in cache:
/// [`max_pool`] of the whole output, bit for bit, without reading it back from memory.
pub(crate) struct PoolEachImage<T> {
    /// The pooling's windows over the convolution's output (as [`max_pool`] gets them).
    w: Window2d,
    out: Vec<T>,
    dst: SharedMut<T>,
    isa: Isa,
    /// Images pooled so far.
    done: AtomicUsize,
}

impl<T: Lanes> PoolEachImage<T> {
    /// Room for the pooled outputs of `w.input[0]` images, none written yet.
    pub(crate) fn new(w: &Window2d) -> PoolEachImage<T> {
        let mut out: Vec<T> = crate::block_cache::with_capacity(w.input[0] * Self::per_image(w));
        let dst = SharedMut(out.as_mut_ptr());
        PoolEachImage {
            w: w.clone(),
            out,
            dst,
            isa: kernel_isa(),
            done: AtomicUsize::new(0),
        }
    }

    fn per_image(w: &Window2d) -> usize {
        w.output[0] * w.output[1] * w.input[3]
    }

    /// Pools image `b` of the convolution's output, whose `h * w * c` elements start at `y`.
    ///
    /// # Safety
    /// The CPU has the instruction set of [`kernel_isa`] (callers check [`available`]);
    /// `y` holds image `b`, written; each image is pooled once (`b` past the batch panics).
    pub(crate) unsafe fn image(&self, b: usize, y: *const T) {
        assert!(
            b < self.w.input[0],
            "image {b} of a batch of {}",
            self.w.input[0]
        );
        max_pool_image(
            self.isa,
            y,
            &self.w,
            self.dst.get().add(b * Self::per_image(&self.w)),
        );
        self.done.fetch_add(1, Ordering::Relaxed);
    }

    /// The pooled outputs, once every image was pooled (checked).
    pub(crate) fn finish(self) -> Vec<T> {
        let n = self.w.input[0];
        assert_eq!(
            self.done.load(Ordering::Acquire),
            n,
            "the convolution pooled some of its images twice or not at all"
        );
        let mut out = self.out;
        // SAFETY: each of the n images wrote its part (counted above; `image`'s contract:
        // each once).
        unsafe { out.set_len(n * Self::per_image(&self.w)) };
        out
    }
}

/// Whether [`max_pool_grad`] takes `T` for windows `w`: always for float32; for half types
/// when the windows tile the input (each input element gets one window's gradient or zero,
/// exactly).
pub(crate) fn grad_exact<T: Lanes>(w: &Window2d) -> bool {
    T::IS_F32 || tiles(w)
}

/// Whether the windows tile the input: stride = window, no padding.
pub(crate) fn tiles(w: &Window2d) -> bool {
    w.strides == w.kernel && w.pad_before == [0, 0]
}

/// The gradient of `max_pool2d` for input `x` and output gradient `dy` (both dense); only
/// where [`grad_exact`] says so.
pub(crate) fn max_pool_grad<T: Lanes>(x: &[T], dy: &[T], w: &Window2d) -> Vec<T> {
    max_pool_grad_masked(x, dy, w, false)
}

/// `(dx, dbias)` of `max_pool(activation(x + bias))` from the pool's input `y` (the
/// activation's output, dense `[n, h, w, c]`) and the pooled output's gradient `dy`, for
/// windows that tile the input ([`tiles`]): what [`max_pool_grad`] and then the bias
/// gradient (`bias::bias_activation_grad`) give, bit for bit, in one pass. The pooling
/// gradient is written with the ReLU's mask applied (the tap's own value, loaded to find
/// the window's maximum, says whether it passes), image by image, and each image's rows
/// are added to the bias gradient's partial sums while they are in cache: the bias
/// gradient's chunks hold whole images at these sizes (`bias::chunk_rows`), so the order
/// of additions is its own. Where an image is too large for a chunk, the rows are summed
/// in a second pass, in the same order. Callers check [`available`] and [`tiles`].
pub(crate) fn bias_activation_grad_tiled<T: Lanes>(
    y: &[T],
    dy: &[T],
    w: &Window2d,
    relu: bool,
) -> (Vec<T>, Vec<T>) {
    let [n, h, wd, c] = w.input;
    let (image, per_dy) = (h * wd, w.output[0] * w.output[1] * c);
    assert!(
        y.len() >= n * image * c && dy.len() >= n * per_dy,
        "max_pool_bias_activation_grad operands smaller than their shapes"
    );
    assert!(
        tiles(w) && c > 0 && image > 0,
        "windows that do not tile the input, or an empty one"
    );
    let isa = kernel_isa();
    let per = bias::chunk_rows(&w.input);
    if !per.is_multiple_of(image) {
        // Images larger than a chunk: the masked gradient, then its rows summed.
        let dx = max_pool_grad_masked(y, dy, w, relu);
        let sums = bias::chunk_sums(n * image, c, per, |r0, r1, sum: &mut [f32]| {
            // SAFETY: the CPU has `isa` (callers check `available`).
            unsafe { bias::add_rows(isa, &dx[r0 * c..r1 * c], c, sum) }
        });
        return (dx, bias::narrow_sums(&sums));
    }
    let mut dx: Vec<T> = crate::block_cache::with_capacity(n * image * c);
    let out = SharedMut(dx.as_mut_ptr());
    let sums = bias::chunk_sums(n * image, c, per, |r0, r1, sum: &mut [f32]| {
        for b in r0 / image..r1 / image {
            // SAFETY: the CPU has `isa` (callers check `available`); image b lies in y and
            // its gradients in dy; its part of dx (capacity n * image * c) is this chunk's
            // only, written here before it is read and before dx's length is set; the
            // windows tile the input (asserted), as `relu` needs.
            unsafe {
                let d = out.get().add(b * image * c);
                max_pool_grad_image(
                    isa,
                    y[b * image * c..].as_ptr(),
                    dy[b * per_dy..].as_ptr(),
                    w,
                    relu,
                    d,
                );
                bias::add_rows(isa, std::slice::from_raw_parts(d, image * c), c, sum);
            }
        }
    });
    // SAFETY: the chunks cover all n images (whole ones: `per` is a multiple of `image`),
    // and each wrote its images.
    unsafe { dx.set_len(n * image * c) };
    (dx, bias::narrow_sums(&sums))
}

/// [`max_pool_grad`], each element kept only where it is positive when `relu` (windows
/// that tile the input only).
fn max_pool_grad_masked<T: Lanes>(x: &[T], dy: &[T], w: &Window2d, relu: bool) -> Vec<T> {
    let [n, h, wd, c] = w.input;
    let per_dy = w.output[0] * w.output[1] * c;
    assert!(
        x.len() >= n * h * wd * c && dy.len() >= n * per_dy,
        "max_pool_grad operands smaller than their shapes"
    );
    assert!(
        grad_exact::<T>(w),
        "overlapping half-precision pooling windows would round their sums"
    );
    assert!(!relu || tiles(w), "a ReLU mask on overlapping windows");
    let isa = kernel_isa();
    per_image(n, h * wd * c, |b, dx| {
        // SAFETY: the CPU has `isa` (callers check `available`); image b lies in x and its
        // gradients in dy; `dx` holds the image's h * w * c floats; relu only when tiled.
        unsafe {
            max_pool_grad_image(
                isa,
                x[b * h * wd * c..].as_ptr(),
                dy[b * per_dy..].as_ptr(),
                w,
                relu,
                dx,
            )
        }
    })
}

/// The pooled outputs of one image.
///
/// # Safety
/// The CPU has `K`'s instruction set; `x` holds the image's `h * w * c` elements and `out`
/// has room for its `oh * ow * c` outputs.
#[inline(always)]
unsafe fn max_pool_image_with<K: Kernels, T: Lanes>(x: *const T, w: &Window2d, out: *mut T) {
    let c = w.input[3];
    let [oh, ow] = w.output;
    let mut windows = Windows::new(w);
    for oy in 0..oh {
        for ox in 0..ow {
            let (corner, taps) = windows.at(w, oy, ox);
            let (x, o) = (x.add(corner), out.add((oy * ow + ox) * c));
            for c0 in (0..c).step_by(K::LANES) {
                let len = K::LANES.min(c - c0);
                let mut m = K::splat(T::LOWEST);
                for &t in taps {
                    // Generic kernel's rule: a later tap wins when greater or NaN.
                    m = K::max_last_nan(m, K::load_from(x.add(t + c0), len));
                }
                // One of the taps (or the lowest value): exact in `T`.
                K::store_exact_to(o.add(c0), len, m);
            }
        }
    }
}

with_isa! {
    /// [`max_pool_image_with`] on `isa`'s kernels.
    unsafe fn max_pool_image[T: Lanes][T](x: *const T, w: &Window2d, out: *mut T) = max_pool_image_with;
}

/// The input gradient of one image.
///
/// # Safety
/// The CPU has `K`'s instruction set; `x` holds the image's `h * w * c` elements, `dy` its
/// `oh * ow * c` gradients, and `dx` has room for `h * w * c` elements; overlapping windows
/// only for f32 (`grad_exact`) and without `relu` (which keeps an element only where `x`
/// is positive: a NaN blocks, as the ReLU's gradient).
#[inline(always)]
unsafe fn max_pool_grad_image_with<K: Kernels, T: Lanes>(
    x: *const T,
    dy: *const T,
    w: &Window2d,
    relu: bool,
    dx: *mut T,
) {
    let [_, h, wd, c] = w.input;
    let [oh, ow] = w.output;
    let tiled = tiles(w);
    if tiled {
        // Every element of the windows' rows and columns is one window's tap, which the
        // loop below stores; only the rows and columns past the last window are zeroed.
        let (rows, cols) = ((oh * w.kernel[0]).min(h), (ow * w.kernel[1]).min(wd));
        if cols < wd {
            for r in 0..rows {
                std::ptr::write_bytes(dx.add((r * wd + cols) * c), 0, (wd - cols) * c);
            }
        }
        std::ptr::write_bytes(dx.add(rows * wd * c), 0, (h - rows) * wd * c);
    } else {
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
            for c0 in (0..c).step_by(K::LANES) {
                let len = K::LANES.min(c - c0);
                let mut m = K::load_from(x.add(first + c0), len);
                for &t in &taps[1..] {
                    m = K::max_first_nan(m, K::load_from(x.add(t + c0), len));
                }
                let grad = K::load_from(g.add(c0), len);
                let mut open = K::first_lanes(len);
                for &t in taps {
                    let v = K::load_from(x.add(t + c0), len);
                    let hit = K::and(K::is_max(v, m), open);
                    open = K::and_not(open, hit);
                    let d = dx.add(t + c0);
                    if tiled {
                        let pass = if relu {
                            K::and(hit, K::positive(v))
                        } else {
                            hit
                        };
                        // A `dy` value or zero: exact in `T`, nothing to round.
                        K::store_exact_to(d, len, K::keep(pass, grad));
                    } else {
                        // f32 only (grad_exact): the sum is the f32 kernel's.
                        let sum = K::load_from(d, len);
                        K::store_to(d, len, K::add_where(sum, hit, grad));
                    }
                }
            }
        }
    }
}

with_isa! {
    /// [`max_pool_grad_image_with`] on `isa`'s kernels.
    unsafe fn max_pool_grad_image[T: Lanes][T](
        x: *const T,
        dy: *const T,
        w: &Window2d,
        relu: bool,
        dx: *mut T,
    ) = max_pool_grad_image_with;
}

#[cfg(test)]
mod tests {
    use super::*;
    use ferroflow_tensor::{Element, Padding};
    use half::{bf16, f16};

    /// A xorshift32 stream from `seed` (not 0).
    fn xorshift(mut seed: u32) -> impl FnMut() -> u32 {
        move || {
            seed ^= seed << 13;
            seed ^= seed >> 17;
            seed ^= seed << 5;
            seed
        }
    }

    /// A half type's conversions, for tests generic over bf16 and f16.
    trait HalfTest: Lanes + PartialEq + std::fmt::Debug {
        const NAN: Self;
        fn of(v: f32) -> Self;
        fn wide(self) -> f32;
    }
    impl HalfTest for f32 {
        const NAN: f32 = f32::NAN;
        fn of(v: f32) -> f32 {
            v
        }
        fn wide(self) -> f32 {
            self
        }
    }
    impl HalfTest for bf16 {
        const NAN: bf16 = bf16::NAN;
        fn of(v: f32) -> bf16 {
            bf16::from_f32(v)
        }
        fn wide(self) -> f32 {
            self.to_f32()
        }
    }
    impl HalfTest for f16 {
        const NAN: f16 = f16::NAN;
        fn of(v: f32) -> f16 {
            f16::from_f32(v)
        }
        fn wide(self) -> f32 {
            self.to_f32()
        }
    }

    /// Pooling on `H` in registers gives, bit for bit, what the float32 kernels give on the
    /// widened values (ties, NaNs, channel tails past a multiple of 16 included).
    fn pooling_matches_float32_on_widened_values<H: HalfTest>() {
        for (shape, k, strides, pad) in [
            ([2, 8, 8, 33], [2, 2], [2, 2], Padding::Valid),
            ([3, 7, 9, 20], [2, 2], [2, 2], Padding::Valid),
            ([2, 6, 6, 16], [3, 3], [3, 3], Padding::Valid),
            ([2, 5, 7, 18], [3, 3], [2, 1], Padding::Same),
        ] {
            let w = Window2d::resolve("test", shape, k, strides, [1, 1], pad).unwrap();
            let mut next = xorshift(0x9e37_79b9);
            // A coarse grid (ties in windows), a few NaNs.
            let n: usize = shape.iter().product();
            let x: Vec<H> = (0..n)
                .map(|_| match next() % 41 {
                    0 => H::NAN,
                    v => H::of(v as f32 / 4.0 - 5.0),
                })
                .collect();
            let per_y = w.output[0] * w.output[1] * shape[3];
            let dy: Vec<H> = (0..shape[0] * per_y)
                .map(|_| H::of((next() % 1000) as f32 / 97.0 - 5.0))
                .collect();
            let wide = |v: &[H]| -> Vec<f32> { v.iter().map(|h| h.wide()).collect() };
            // NaN != NaN: compare the widened values' bits.
            let bits = |v: Vec<H>| -> Vec<u32> { v.iter().map(|h| h.wide().to_bits()).collect() };
            let rounded = |v: Vec<f32>| -> Vec<u32> {
                v.iter().map(|&f| H::of(f).wide().to_bits()).collect()
            };
            assert_eq!(
                bits(max_pool(&x, &w)),
                rounded(max_pool(&wide(&x), &w)),
                "max_pool {shape:?}"
            );
            if grad_exact::<H>(&w) {
                assert_eq!(
                    bits(max_pool_grad(&x, &dy, &w)),
                    rounded(max_pool_grad(&wide(&x), &wide(&dy), &w)),
                    "max_pool_grad {shape:?}"
                );
            }
        }
        let overlapping =
            Window2d::resolve("test", [1, 4, 4, 1], [3, 3], [1, 1], [1, 1], Padding::Valid)
                .unwrap();
        assert!(!grad_exact::<H>(&overlapping));
    }

    /// The fused pooling and ReLU/bias gradient (`conv::max_pool_bias_activation_grad`)
    /// gives, bit for bit, what `max_pool_grad` and then `bias::bias_activation_grad` give,
    /// in float32, bfloat16 and float16: windows of 2x2 and 3x3 and 2x3, inputs that the
    /// windows cover exactly, that leave a last row and column, and SAME windows cut by the
    /// edge; channel counts across the vector widths; chunks of the bias gradient of one and
    /// of several images, and rows cut across images (a small batch, an image larger than a
    /// chunk); ties, zeros, negative values and NaNs. Windows that overlap are not its (`None`: the two kernels run).
    fn fused_pooling_bias_gradient_equals_the_two_kernels<H: Element + HalfTest>() {
        use super::super::{bias, conv};
        use crate::CpuBuffer;
        use ferroflow_tensor::{FusedActivation, HostData, Layout, Operand};
        fn operand<'a, H: Element>(buffer: &'a CpuBuffer, layout: &'a Layout) -> Operand<'a> {
            Operand {
                buffer,
                layout,
                dtype: H::DTYPE,
            }
        }
        let bits =
            |d: &HostData| -> Vec<u64> { d.to_f64_vec().iter().map(|v| v.to_bits()).collect() };
        for (shape, k, strides, pad) in [
            ([9, 26, 26, 32], [2, 2], [2, 2], Padding::Valid),
            ([8, 11, 11, 64], [2, 2], [2, 2], Padding::Valid),
            ([24, 13, 9, 7], [2, 2], [2, 2], Padding::Same),
            ([8, 9, 10, 33], [3, 3], [3, 3], Padding::Valid),
            // A batch too small for chunks of whole images.
            ([3, 8, 10, 1], [2, 3], [2, 3], Padding::Valid),
            // An image past a chunk of the bias gradient: its rows summed in a second pass.
            ([2, 34, 34, 64], [2, 2], [2, 2], Padding::Valid),
        ] {
            let w = Window2d::resolve("test", shape, k, strides, [1, 1], pad)
                .unwrap()
                .clipped_for_pooling();
            assert!(tiles(&w), "{shape:?}");
            let mut next = xorshift(0x2545_f491 ^ shape.iter().product::<usize>() as u32);
            let n: usize = shape.iter().product();
            // Mostly a ReLU's output (a third zero, ties on a coarse grid), with negative
            // values and NaNs among them.
            let y: Vec<H> = (0..n)
                .map(|_| match next() % 97 {
                    0 => H::NAN,
                    1..=3 => H::of(-0.5),
                    v if v < 35 => H::of(0.0),
                    v => H::of((v % 9) as f32 / 4.0),
                })
                .collect();
            let dy_shape = [shape[0], w.output[0], w.output[1], shape[3]];
            let dy: Vec<H> = (0..dy_shape.iter().product())
                .map(|_| H::of((next() % 1000) as f32 / 97.0 - 5.0))
                .collect();
            let (y, dy) = (CpuBuffer(H::into_host(y)), CpuBuffer(H::into_host(dy)));
            let (y_layout, dy_layout) = (Layout::contiguous(&shape), Layout::contiguous(&dy_shape));
            let (yo, dyo) = (operand::<H>(&y, &y_layout), operand::<H>(&dy, &dy_layout));
            for activation in [FusedActivation::Relu, FusedActivation::Linear] {
                let case = format!("{} {shape:?} {k:?} {activation:?}", H::DTYPE);
                let (dx, db) = conv::max_pool_bias_activation_grad(yo, dyo, &w, activation)
                    .unwrap()
                    .expect("the fused path takes windows that tile the input");
                let g = CpuBuffer(conv::max_pool_grad(yo, dyo, &w).unwrap());
                let (want_dx, want_db) =
                    bias::bias_activation_grad(operand::<H>(&g, &y_layout), yo, activation)
                        .unwrap();
                assert_eq!(bits(&dx), bits(&want_dx), "dx {case}");
                assert_eq!(bits(&db), bits(&want_db), "dbias {case}");
            }
        }
        // Overlapping windows: the two kernels, not this one.
        let overlapping =
            Window2d::resolve("test", [1, 5, 5, 3], [3, 3], [2, 2], [1, 1], Padding::Valid)
                .unwrap();
        let (x, dy) = (
            CpuBuffer(H::into_host(vec![H::of(1.0); 75])),
            CpuBuffer(H::into_host(vec![H::of(1.0); 12])),
        );
        let (x_layout, dy_layout) = (
            Layout::contiguous(&[1, 5, 5, 3]),
            Layout::contiguous(&[1, 2, 2, 3]),
        );
        let fused = conv::max_pool_bias_activation_grad(
            operand::<H>(&x, &x_layout),
            operand::<H>(&dy, &dy_layout),
            &overlapping,
            FusedActivation::Relu,
        )
        .unwrap();
        assert!(fused.is_none(), "overlapping windows took the tiled kernel");
    }

    #[test]
    fn fused_pooling_and_bias_gradients_equal_the_two_kernels() {
        if !available() {
            return ferroflow_tensor::testing::skip(
                "FERROFLOW_REQUIRE_AVX512",
                "neither AVX-512 nor AVX2 here (or FERROFLOW_CPU_ISA=scalar); the fused pooling gradient does not run",
            );
        }
        fused_pooling_bias_gradient_equals_the_two_kernels::<f32>();
        fused_pooling_bias_gradient_equals_the_two_kernels::<bf16>();
        fused_pooling_bias_gradient_equals_the_two_kernels::<f16>();
    }

    #[test]
    fn half_pooling_matches_float32_on_widened_values() {
        if !available() {
            return ferroflow_tensor::testing::skip(
                "FERROFLOW_REQUIRE_AVX512",
                "neither AVX-512 nor AVX2 here (or FERROFLOW_CPU_ISA=scalar); the pooling kernels do not run",
            );
        }
        pooling_matches_float32_on_widened_values::<bf16>();
        pooling_matches_float32_on_widened_values::<f16>();
    }
}
