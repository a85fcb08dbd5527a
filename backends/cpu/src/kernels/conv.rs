//! conv2d (NHWC x HWIO), the fused conv2d + bias + activation, the two backprop kernels,
//! and 2-D pooling. float32 runs the kernels of `f32_conv` / `f32_winograd` / `max_pool` on
//! CPUs with AVX-512 or AVX2 + FMA, and so do bfloat16 and float16 (half types read and
//! written in registers, f32 arithmetic; see `crate::lanes`); bf16 convolutions those
//! kernels do not take use AVX512-BF16 products, and everything else goes through
//! im2col + gemm here (half types widened).
//!
//! im2col turns each output position's receptive field into a row of `kh·kw·cin` values, so
//! the convolution becomes one [rows, kh·kw·cin] x [kh·kw·cin, cout] product — the filter in
//! HWIO order already is that matrix. Batches are processed in chunks that bound the
//! im2col buffer.

use super::matmul::{gemm_into, StridedMatrix};
use crate::buffer::{dense, dense_owned, host, narrow, widen, Half};
use crate::num::Num;
use ferroflow_tensor::{
    backend::unsupported, DType, FusedActivation, HostData, Operand, PoolKind, Result, Window2d,
};
use gemm::Parallelism;
use rayon::prelude::*;

/// Most im2col elements held at once.
const COLS_BUDGET: usize = 1 << 23;

/// Float operands as (data, dtype-to-return) with f16/bf16 widened to f32.
enum Floats<'a> {
    F32(std::borrow::Cow<'a, [f32]>),
    F64(std::borrow::Cow<'a, [f64]>),
}

fn floats<'a>(op: &'static str, x: &Operand<'a>) -> Result<Floats<'a>> {
    let d = host(x)?;
    if let Some(w) = widen(d) {
        return Ok(Floats::F32(std::borrow::Cow::Owned(dense_owned(
            w, x.layout,
        ))));
    }
    match d {
        HostData::F32(v) => Ok(Floats::F32(dense(v, x.layout))),
        HostData::F64(v) => Ok(Floats::F64(dense(v, x.layout))),
        _ => Err(unsupported("cpu", op, x.dtype)),
    }
}

/// Runs a two-operand float kernel in f32 (f16/bf16 widened, the result narrowed to `out`)
/// or in f64; the closures are the same kernel at the two types.
fn float_pair(
    op: &'static str,
    a: &Operand<'_>,
    b: &Operand<'_>,
    out: DType,
    on_f32: impl FnOnce(&[f32], &[f32]) -> Vec<f32>,
    on_f64: impl FnOnce(&[f64], &[f64]) -> Vec<f64>,
) -> Result<HostData> {
    Ok(match (floats(op, a)?, floats(op, b)?) {
        (Floats::F32(x), Floats::F32(y)) => narrow(on_f32(&x, &y), out),
        (Floats::F64(x), Floats::F64(y)) => HostData::F64(on_f64(&x, &y)),
        _ => return Err(unsupported("cpu", op, out)),
    })
}

/// Input position of output `o` at window tap `t`, or None inside the padding.
#[inline(always)]
fn source(
    o: usize,
    t: usize,
    stride: usize,
    dilation: usize,
    pad: usize,
    n: usize,
) -> Option<usize> {
    let p = (o * stride + t * dilation) as isize - pad as isize;
    (p >= 0 && (p as usize) < n).then_some(p as usize)
}

/// Rows `[b0, b1)` of the im2col matrix: one row per (b, oy, ox), `kh·kw·cin` columns.
fn im2col<T: Copy + Default + Send + Sync>(
    x: &[T],
    w: &Window2d,
    cin: usize,
    b0: usize,
    b1: usize,
) -> Vec<T> {
    let [_, h, wd, _] = w.input;
    let [oh, ow] = w.output;
    let [kh, kw] = w.kernel;
    let kdim = kh * kw * cin;
    let mut cols = vec![T::default(); (b1 - b0) * oh * ow * kdim];
    cols.par_chunks_mut((ow * kdim).max(1))
        .enumerate()
        .for_each(|(r, row)| {
            let (b, oy) = (b0 + r / oh, r % oh);
            for ox in 0..ow {
                for ky in 0..kh {
                    let Some(iy) = source(oy, ky, w.strides[0], w.dilations[0], w.pad_before[0], h)
                    else {
                        continue;
                    };
                    for kx in 0..kw {
                        let Some(ix) =
                            source(ox, kx, w.strides[1], w.dilations[1], w.pad_before[1], wd)
                        else {
                            continue;
                        };
                        let src = ((b * h + iy) * wd + ix) * cin;
                        let dst = ox * kdim + (ky * kw + kx) * cin;
                        row[dst..dst + cin].copy_from_slice(&x[src..src + cin]);
                    }
                }
            }
        });
    cols
}

/// The matrix product the im2col convolutions run on: operands of type `T`, results
/// accumulated in `Acc` (`T` itself through `gemm`, or f32 for bf16 operands through
/// AVX512-BF16).
trait ConvGemm<T>: Sync {
    type Acc: Num + Send + Sync + 'static;
    /// `dst (m x n) = [dst +] lhs (m x k) · rhs (k x n)`.
    #[allow(clippy::too_many_arguments)]
    fn gemm(
        &self,
        dst: &mut [Self::Acc],
        m: usize,
        n: usize,
        k: usize,
        lhs: StridedMatrix<'_, T>,
        rhs: StridedMatrix<'_, T>,
        accumulate: bool,
    );
}

/// `gemm` at the operands' own type.
struct SameType;

impl<T: Num + Send + Sync + super::f32_gemm::NativeGemm + 'static> ConvGemm<T> for SameType {
    type Acc = T;
    fn gemm(
        &self,
        dst: &mut [T],
        m: usize,
        n: usize,
        k: usize,
        lhs: StridedMatrix<'_, T>,
        rhs: StridedMatrix<'_, T>,
        accumulate: bool,
    ) {
        gemm_into(
            dst,
            m,
            n,
            k,
            lhs,
            rhs,
            accumulate,
            T::ZERO,
            T::ONE,
            Parallelism::Rayon(0),
        );
    }
}

/// bf16 operands, f32 results, through `vdpbf16ps` (only built where it is available).
struct Bf16Dot;

impl ConvGemm<half::bf16> for Bf16Dot {
    type Acc = f32;
    fn gemm(
        &self,
        dst: &mut [f32],
        m: usize,
        n: usize,
        k: usize,
        lhs: StridedMatrix<'_, half::bf16>,
        rhs: StridedMatrix<'_, half::bf16>,
        accumulate: bool,
    ) {
        super::bf16_gemm::gemm_bf16_into(dst, m, n, k, lhs, rhs, accumulate);
    }
}

/// A dense bf16 operand, borrowed when it already is one.
type Bf16View<'a> = std::borrow::Cow<'a, [half::bf16]>;

/// A bf16 convolution through [`Bf16Dot`] when the CPU has AVX512-BF16 and the convolution
/// is not one the direct or Winograd float32 kernels take (on which those kernels, reading
/// and writing bf16, beat im2col + `vdpbf16ps`); `None` sends the caller to them.
fn bf16_operands<'a>(
    a: &Operand<'a>,
    b: &Operand<'a>,
    w: &Window2d,
    cout: usize,
) -> Option<(Bf16View<'a>, Bf16View<'a>)> {
    if direct::suits(w) || super::f32_winograd::suits(w, cout) || !super::bf16_gemm::available() {
        return None;
    }
    match (host(a).ok()?, host(b).ok()?) {
        (HostData::BF16(x), HostData::BF16(y)) => Some((dense(x, a.layout), dense(y, b.layout))),
        _ => None,
    }
}

fn batch_chunk(w: &Window2d, kdim: usize) -> usize {
    let per_image = (w.output[0] * w.output[1] * kdim).max(1);
    (COLS_BUDGET / per_image).clamp(1, w.input[0].max(1))
}

fn conv2d_typed<T: Copy + Default + Send + Sync, G: ConvGemm<T>>(
    x: &[T],
    f: &[T],
    w: &Window2d,
    cout: usize,
    g: &G,
) -> Vec<G::Acc> {
    let [n, _, _, cin] = w.input;
    let kdim = w.kernel[0] * w.kernel[1] * cin;
    let rows_per_image = w.output[0] * w.output[1];
    let mut out = crate::block_cache::filled(n * rows_per_image * cout, G::Acc::ZERO);
    let step = batch_chunk(w, kdim);
    for b0 in (0..n).step_by(step) {
        let b1 = (b0 + step).min(n);
        let cols = im2col(x, w, cin, b0, b1);
        let rows = (b1 - b0) * rows_per_image;
        let dst = &mut out[b0 * rows_per_image * cout..b1 * rows_per_image * cout];
        let lhs = StridedMatrix {
            data: &cols,
            offset: 0,
            rs: kdim as isize,
            cs: 1,
        };
        let rhs = StridedMatrix {
            data: f,
            offset: 0,
            rs: cout as isize,
            cs: 1,
        };
        g.gemm(dst, rows, cout, kdim, lhs, rhs, false);
    }
    out
}

pub(crate) fn conv2d(x: Operand<'_>, filter: Operand<'_>, w: &Window2d) -> Result<HostData> {
    Ok(conv2d_then(x, filter, w, None, None)?.0)
}

/// `activation(conv2d(x, filter) + bias)`: the bias and activation applied to each image's
/// float32 outputs while in cache (direct kernels), or in one pass over the float32 (or
/// float64) result before it is narrowed — never as separate ops over the stored output.
pub(crate) fn fused_conv2d(
    x: Operand<'_>,
    filter: Operand<'_>,
    bias: Operand<'_>,
    w: &Window2d,
    activation: FusedActivation,
) -> Result<HostData> {
    Ok(conv2d_then(x, filter, w, Some((bias, activation)), None)?.0)
}

/// [`fused_conv2d`] and the max pooling of its result by `pool`: `(y, pooled)`, pooled
/// only where the convolution runs on the float32 kernels ([`super::f32_conv::forward`]:
/// float32, bfloat16 and float16 on AVX2 or AVX-512), each image as soon as it is written,
/// by [`super::max_pool::max_pool`]'s kernel (the same bits); `None` elsewhere: the caller
/// pools the stored result.
pub(crate) fn fused_conv2d_max_pool(
    x: Operand<'_>,
    filter: Operand<'_>,
    bias: Operand<'_>,
    w: &Window2d,
    activation: FusedActivation,
    pool: &Window2d,
) -> Result<(HostData, Option<HostData>)> {
    conv2d_then(x, filter, w, Some((bias, activation)), Some(pool))
}

/// The convolution, fused with a bias and activation when `fused` says so; with `pool`,
/// also each image's max pooling where the float32 kernels run the convolution (`None` in
/// the second result elsewhere: the caller pools the stored result).
fn conv2d_then(
    x: Operand<'_>,
    filter: Operand<'_>,
    w: &Window2d,
    fused: Option<(Operand<'_>, FusedActivation)>,
    pool: Option<&Window2d>,
) -> Result<(HostData, Option<HostData>)> {
    let cout = filter.shape()[3];
    let (bias, activation) = match &fused {
        Some((b, a)) => (Some(floats("fused_conv2d", b)?), *a),
        None => (None, FusedActivation::Linear),
    };
    let bias32 = match &bias {
        Some(Floats::F32(b)) => Some(&b[..]),
        _ => None,
    };
    let finish32 = |mut y: Vec<f32>| {
        if let Some(b) = bias32 {
            super::bias::bias_activation(&mut y, b, activation);
        }
        y
    };
    if let Some((a, f)) = bf16_operands(&x, &filter, w, cout) {
        let y = finish32(conv2d_typed(&a, &f, w, cout, &Bf16Dot));
        return Ok((narrow(y, DType::BF16), None));
    }
    // Half-precision data through the float32 kernels, read and written as its own type
    // (the filter, small, widened).
    if let (true, Some(a)) = (
        super::f32_conv::available() && filter.dtype == x.dtype,
        dense_half(&x),
    ) {
        if let Floats::F32(f) = floats("conv2d", &filter)? {
            let epilogue = bias32.map(|bias| super::f32_conv::Epilogue { bias, activation });
            return Ok(match a {
                HalfView::BF16(a) => {
                    let (y, pooled) = forward_pooled(&a, &f, w, cout, epilogue, pool);
                    (HostData::BF16(y), pooled.map(HostData::BF16))
                }
                HalfView::F16(a) => {
                    let (y, pooled) = forward_pooled(&a, &f, w, cout, epilogue, pool);
                    (HostData::F16(y), pooled.map(HostData::F16))
                }
            });
        }
    }
    let mut pooled32: Option<Vec<f32>> = None;
    let y = float_pair(
        "conv2d",
        &x,
        &filter,
        x.dtype,
        |a, f| {
            if super::f32_conv::available() {
                let epilogue = bias32.map(|bias| super::f32_conv::Epilogue { bias, activation });
                let (y, pooled) = forward_pooled(a, f, w, cout, epilogue, pool);
                pooled32 = pooled;
                y
            } else if direct::suits(w) {
                finish32(direct::forward(a, f, w, cout))
            } else {
                finish32(conv2d_typed(a, f, w, cout, &SameType))
            }
        },
        |a, f| {
            let mut y = conv2d_typed(a, f, w, cout, &SameType);
            if let Some(Floats::F64(b)) = &bias {
                super::bias::bias_activation(&mut y, b, activation);
            }
            y
        },
    )?;
    // Float32 only: `float_pair` gave `y` in `x`'s type, and the hook pooled that type.
    let pooled = match (pooled32, x.dtype) {
        (Some(p), DType::F32) => Some(HostData::F32(p)),
        _ => None,
    };
    Ok((y, pooled))
}

/// [`super::f32_conv::forward`], and with `pool` each image of its result max pooled as
/// soon as it is written ([`super::max_pool::PoolEachImage`]).
fn forward_pooled<T: crate::lanes::Lanes>(
    x: &[T],
    filter: &[f32],
    w: &Window2d,
    cout: usize,
    epilogue: Option<super::f32_conv::Epilogue<'_>>,
    pool: Option<&Window2d>,
) -> (Vec<T>, Option<Vec<T>>) {
    use super::max_pool::PoolEachImage;
    let pooled = pool.map(PoolEachImage::new);
    let y = super::f32_conv::forward(x, filter, w, cout, epilogue, pooled.as_ref());
    (y, pooled.map(PoolEachImage::finish))
}

/// Direct convolution for inputs with few channels (a network's first layer: `kh·kw·cin`
/// of 9 or 27), where im2col + GEMM has too thin an inner dimension: each output pixel is
/// `Σ_t patch[t] · filter[t, :]` over the `cout` outputs, vectorised along `cout` (AVX2+FMA
/// chosen at run time), rows of output pixels in parallel.
mod direct {
    use super::{source, Window2d};
    use rayon::prelude::*;

    /// Patch lengths (`kh·kw·cin`) this path takes.
    const MAX_PATCH: usize = 32;

    pub(super) fn suits(w: &Window2d) -> bool {
        let kdim = w.kernel[0] * w.kernel[1] * w.input[3];
        kdim > 0 && kdim <= MAX_PATCH
    }

    /// The window of output pixel `(b, oy, ox)` as `kh·kw·cin` values, zeros in the padding.
    #[inline(always)]
    fn gather(x: &[f32], w: &Window2d, b: usize, oy: usize, ox: usize, patch: &mut [f32]) {
        let [_, h, wd, cin] = w.input;
        let [kh, kw] = w.kernel;
        for ky in 0..kh {
            let iy = source(oy, ky, w.strides[0], w.dilations[0], w.pad_before[0], h);
            for kx in 0..kw {
                let dst = &mut patch[(ky * kw + kx) * cin..][..cin];
                let ix = source(ox, kx, w.strides[1], w.dilations[1], w.pad_before[1], wd);
                match (iy, ix) {
                    // One channel (grey images): a plain load, not a memcpy call per tap.
                    (Some(iy), Some(ix)) if cin == 1 => dst[0] = x[(b * h + iy) * wd + ix],
                    (Some(iy), Some(ix)) => {
                        dst.copy_from_slice(&x[((b * h + iy) * wd + ix) * cin..][..cin])
                    }
                    _ => dst.fill(0.0),
                }
            }
        }
    }

    #[inline(always)]
    fn forward_row(x: &[f32], f: &[f32], w: &Window2d, cout: usize, r: usize, row: &mut [f32]) {
        let kdim = w.kernel[0] * w.kernel[1] * w.input[3];
        let [oh, ow] = w.output;
        let (b, oy) = (r / oh, r % oh);
        let mut patch = [0f32; MAX_PATCH];
        for ox in 0..ow {
            gather(x, w, b, oy, ox, &mut patch[..kdim]);
            let o = &mut row[ox * cout..(ox + 1) * cout];
            // Blocks of 16 outputs held in registers across the taps (accumulating in
            // memory would chain every tap through a store and a reload).
            let mut c0 = 0;
            while c0 < cout {
                let width = BLOCK.min(cout - c0);
                let mut acc = [0f32; BLOCK];
                if width == BLOCK {
                    for (t, &p) in patch[..kdim].iter().enumerate() {
                        let ft: &[f32; BLOCK] = f[t * cout + c0..][..BLOCK]
                            .try_into()
                            .expect("a block of BLOCK filter values");
                        for j in 0..BLOCK {
                            acc[j] += p * ft[j];
                        }
                    }
                    let dst: &mut [f32; BLOCK] = (&mut o[c0..c0 + BLOCK])
                        .try_into()
                        .expect("a block of BLOCK outputs");
                    *dst = acc;
                    c0 += BLOCK;
                    continue;
                } else {
                    for (t, &p) in patch[..kdim].iter().enumerate() {
                        for (a, &fv) in acc.iter_mut().zip(&f[t * cout + c0..][..width]) {
                            *a += p * fv;
                        }
                    }
                }
                o[c0..c0 + width].copy_from_slice(&acc[..width]);
                c0 += width;
            }
        }
    }

    /// Outputs accumulated in registers at once.
    const BLOCK: usize = 16;

    #[cfg(target_arch = "x86_64")]
    #[target_feature(enable = "avx2,fma,f16c")]
    unsafe fn forward_row_avx2(
        x: &[f32],
        f: &[f32],
        w: &Window2d,
        cout: usize,
        r: usize,
        row: &mut [f32],
    ) {
        forward_row(x, f, w, cout, r, row)
    }

    pub(super) fn forward(x: &[f32], f: &[f32], w: &Window2d, cout: usize) -> Vec<f32> {
        let [n, ..] = w.input;
        let [oh, ow] = w.output;
        let mut out = crate::block_cache::filled(n * oh * ow * cout, 0f32);
        let avx2 = crate::simd::has_avx2();
        out.par_chunks_mut((ow * cout).max(1))
            .enumerate()
            .for_each(|(r, row)| {
                #[cfg(target_arch = "x86_64")]
                if avx2 {
                    // SAFETY: the CPU has AVX2 and FMA (checked above).
                    return unsafe { forward_row_avx2(x, f, w, cout, r, row) };
                }
                let _ = avx2;
                forward_row(x, f, w, cout, r, row)
            });
        out
    }

    #[inline(always)]
    fn filter_rows(
        x: &[f32],
        dy: &[f32],
        w: &Window2d,
        cout: usize,
        rows: std::ops::Range<usize>,
        acc: &mut [f32],
    ) {
        let kdim = w.kernel[0] * w.kernel[1] * w.input[3];
        let [oh, ow] = w.output;
        let mut patch = [0f32; MAX_PATCH];
        for r in rows {
            let (b, oy) = (r / oh, r % oh);
            for ox in 0..ow {
                gather(x, w, b, oy, ox, &mut patch[..kdim]);
                let g = &dy[(r * ow + ox) * cout..][..cout];
                for (t, &p) in patch[..kdim].iter().enumerate() {
                    for (a, &gv) in acc[t * cout..(t + 1) * cout].iter_mut().zip(g) {
                        *a += p * gv;
                    }
                }
            }
        }
    }

    #[cfg(target_arch = "x86_64")]
    #[target_feature(enable = "avx2,fma,f16c")]
    unsafe fn filter_rows_avx2(
        x: &[f32],
        dy: &[f32],
        w: &Window2d,
        cout: usize,
        rows: std::ops::Range<usize>,
        acc: &mut [f32],
    ) {
        filter_rows(x, dy, w, cout, rows, acc)
    }

    /// `dW[t, co] = Σ_pixels patch[t] · dy[pixel, co]`: private accumulators per task, summed.
    pub(super) fn filter_grad(x: &[f32], dy: &[f32], w: &Window2d, cout: usize) -> Vec<f32> {
        let kdim = w.kernel[0] * w.kernel[1] * w.input[3];
        let rows = w.input[0] * w.output[0];
        let tasks = rayon::current_num_threads().max(1) * 4;
        let per = rows.div_ceil(tasks).max(1);
        let avx2 = crate::simd::has_avx2();
        (0..rows.div_ceil(per))
            .into_par_iter()
            .map(|t| {
                let range = t * per..((t + 1) * per).min(rows);
                let mut acc = vec![0f32; kdim * cout];
                #[cfg(target_arch = "x86_64")]
                if avx2 {
                    // SAFETY: the CPU has AVX2 and FMA (checked above).
                    unsafe { filter_rows_avx2(x, dy, w, cout, range, &mut acc) };
                    return acc;
                }
                let _ = avx2;
                filter_rows(x, dy, w, cout, range, &mut acc);
                acc
            })
            .reduce(
                || vec![0f32; kdim * cout],
                |mut a, b| {
                    a.iter_mut().zip(&b).for_each(|(x, y)| *x += y);
                    a
                },
            )
    }
}

fn backprop_input_typed<T: Copy + Send + Sync, G: ConvGemm<T>>(
    f: &[T],
    dy: &[T],
    w: &Window2d,
    cout: usize,
    g: &G,
) -> Vec<G::Acc> {
    let [n, h, wd, cin] = w.input;
    let [oh, ow] = w.output;
    let [kh, kw] = w.kernel;
    let kdim = kh * kw * cin;
    let rows_per_image = oh * ow;
    let mut dx = crate::block_cache::filled(n * h * wd * cin, G::Acc::ZERO);
    let step = batch_chunk(w, kdim);
    for b0 in (0..n).step_by(step) {
        let b1 = (b0 + step).min(n);
        let rows = (b1 - b0) * rows_per_image;
        // dcols = dy · filterᵀ, filter read as [cout, kdim] through swapped strides.
        let mut dcols = vec![G::Acc::ZERO; rows * kdim];
        let lhs = StridedMatrix {
            data: dy,
            offset: b0 * rows_per_image * cout,
            rs: cout as isize,
            cs: 1,
        };
        let rhs = StridedMatrix {
            data: f,
            offset: 0,
            rs: 1,
            cs: cout as isize,
        };
        g.gemm(&mut dcols, rows, kdim, cout, lhs, rhs, false);
        // col2im: each image only touches its own slice of dx, so images run in parallel.
        dx[b0 * h * wd * cin..b1 * h * wd * cin]
            .par_chunks_mut((h * wd * cin).max(1))
            .enumerate()
            .for_each(|(bi, img)| {
                for oy in 0..oh {
                    for ox in 0..ow {
                        let row = &dcols[((bi * oh + oy) * ow + ox) * kdim..][..kdim];
                        for ky in 0..kh {
                            let Some(iy) =
                                source(oy, ky, w.strides[0], w.dilations[0], w.pad_before[0], h)
                            else {
                                continue;
                            };
                            for kx in 0..kw {
                                let Some(ix) = source(
                                    ox,
                                    kx,
                                    w.strides[1],
                                    w.dilations[1],
                                    w.pad_before[1],
                                    wd,
                                ) else {
                                    continue;
                                };
                                let d = &mut img[(iy * wd + ix) * cin..][..cin];
                                let s = &row[(ky * kw + kx) * cin..][..cin];
                                for (a, &b) in d.iter_mut().zip(s) {
                                    *a = *a + b;
                                }
                            }
                        }
                    }
                }
            });
    }
    dx
}

pub(crate) fn conv2d_backprop_input(
    filter: Operand<'_>,
    dy: Operand<'_>,
    w: &Window2d,
) -> Result<HostData> {
    let cout = filter.shape()[3];
    let op = "conv2d_backprop_input";
    if let Some((f, g)) = bf16_operands(&filter, &dy, w, cout) {
        return Ok(narrow(
            backprop_input_typed(&f, &g, w, cout, &Bf16Dot),
            DType::BF16,
        ));
    }
    if let (true, Some(g)) = (
        super::f32_conv::available() && filter.dtype == dy.dtype,
        dense_half(&dy),
    ) {
        if let Floats::F32(f) = floats(op, &filter)? {
            return Ok(match g {
                HalfView::BF16(g) => HostData::BF16(super::f32_conv::backprop_input(&f, &g[..], w)),
                HalfView::F16(g) => HostData::F16(super::f32_conv::backprop_input(&f, &g[..], w)),
            });
        }
    }
    float_pair(
        op,
        &filter,
        &dy,
        dy.dtype,
        |f, g| {
            if super::f32_conv::available() {
                super::f32_conv::backprop_input(f, g, w)
            } else {
                backprop_input_typed(f, g, w, cout, &SameType)
            }
        },
        |f, g| backprop_input_typed(f, g, w, cout, &SameType),
    )
}

fn backprop_filter_typed<T: Copy + Default + Send + Sync, G: ConvGemm<T>>(
    x: &[T],
    dy: &[T],
    w: &Window2d,
    cout: usize,
    g: &G,
) -> Vec<G::Acc> {
    let [n, _, _, cin] = w.input;
    let kdim = w.kernel[0] * w.kernel[1] * cin;
    let rows_per_image = w.output[0] * w.output[1];
    let mut dw = vec![G::Acc::ZERO; kdim * cout];
    let step = batch_chunk(w, kdim);
    for (ci, b0) in (0..n).step_by(step).enumerate() {
        let b1 = (b0 + step).min(n);
        let rows = (b1 - b0) * rows_per_image;
        let cols = im2col(x, w, cin, b0, b1);
        // dW += colsᵀ · dy
        let lhs = StridedMatrix {
            data: &cols,
            offset: 0,
            rs: 1,
            cs: kdim as isize,
        };
        let rhs = StridedMatrix {
            data: dy,
            offset: b0 * rows_per_image * cout,
            rs: cout as isize,
            cs: 1,
        };
        g.gemm(&mut dw, kdim, cout, rows, lhs, rhs, ci > 0);
    }
    dw
}

pub(crate) fn conv2d_backprop_filter(
    x: Operand<'_>,
    dy: Operand<'_>,
    filter_shape: [usize; 4],
    w: &Window2d,
) -> Result<HostData> {
    let cout = filter_shape[3];
    let op = "conv2d_backprop_filter";
    if let Some((a, g)) = bf16_operands(&x, &dy, w, cout) {
        return Ok(narrow(
            backprop_filter_typed(&a, &g, w, cout, &Bf16Dot),
            DType::BF16,
        ));
    }
    if super::f32_conv::available() {
        match (dense_half(&x), dense_half(&dy)) {
            (Some(HalfView::BF16(a)), Some(HalfView::BF16(g))) => {
                let grad = super::f32_conv::backprop_filter(&a[..], &g[..], w, cout);
                return Ok(narrow(grad, DType::BF16));
            }
            (Some(HalfView::F16(a)), Some(HalfView::F16(g))) => {
                let grad = super::f32_conv::backprop_filter(&a[..], &g[..], w, cout);
                return Ok(narrow(grad, DType::F16));
            }
            _ => {}
        }
    }
    float_pair(
        op,
        &x,
        &dy,
        x.dtype,
        |a, g| {
            if super::f32_conv::available() {
                super::f32_conv::backprop_filter(a, g, w, cout)
            } else if direct::suits(w) {
                direct::filter_grad(a, g, w, cout)
            } else {
                backprop_filter_typed(a, g, w, cout, &SameType)
            }
        },
        |a, g| backprop_filter_typed(a, g, w, cout, &SameType),
    )
}

/// Calls `f(oy, ox, taps)` per output position with the valid input positions of its window.
pub(super) fn for_windows(w: &Window2d, oy: usize, ox: usize, mut f: impl FnMut(usize, usize)) {
    let [_, h, wd, _] = w.input;
    for ky in 0..w.kernel[0] {
        let Some(iy) = source(oy, ky, w.strides[0], 1, w.pad_before[0], h) else {
            continue;
        };
        for kx in 0..w.kernel[1] {
            let Some(ix) = source(ox, kx, w.strides[1], 1, w.pad_before[1], wd) else {
                continue;
            };
            f(iy, ix);
        }
    }
}

fn pool_typed<T: Num + Send + Sync + num_traits::Float>(
    kind: PoolKind,
    x: &[T],
    w: &Window2d,
) -> Vec<T> {
    let [n, h, wd, c] = w.input;
    let [oh, ow] = w.output;
    let mut out = crate::block_cache::filled(n * oh * ow * c, T::ZERO);
    out.par_chunks_mut((ow * c).max(1))
        .enumerate()
        .for_each(|(r, row)| {
            let (b, oy) = (r / oh, r % oh);
            for ox in 0..ow {
                let o = &mut row[ox * c..(ox + 1) * c];
                let mut count = 0usize;
                o.fill(if kind == PoolKind::MaxPool2d {
                    T::LOWEST
                } else {
                    T::ZERO
                });
                for_windows(w, oy, ox, |iy, ix| {
                    count += 1;
                    let s = &x[((b * h + iy) * wd + ix) * c..][..c];
                    match kind {
                        PoolKind::MaxPool2d => o
                            .iter_mut()
                            .zip(s)
                            .for_each(|(a, &v)| *a = if (v > *a) | v.isnan() { v } else { *a }),
                        PoolKind::AvgPool2d => o.iter_mut().zip(s).for_each(|(a, &v)| *a = *a + v),
                    }
                });
                if kind == PoolKind::AvgPool2d {
                    let inv = T::ONE / T::from(count.max(1)).unwrap_or(T::ONE);
                    o.iter_mut().for_each(|a| *a = *a * inv);
                }
            }
        });
    out
}

/// A pooling kernel (`f32_kernel(window of a few images, inputs)`) over half-precision
/// `inputs` (each with its elements per image), a few images at a time: their inputs widened
/// into small f32 buffers, the results narrowed in place — no whole-buffer widening.
fn pool_half<H: Half>(
    w: &Window2d,
    inputs: &[(&[H], usize)],
    out_per_image: usize,
    f32_kernel: impl Fn(&Window2d, &[Vec<f32>]) -> Vec<f32> + Sync,
) -> HostData {
    let n = w.input[0];
    let out = crate::buffer::half_chunked::<H>(n * out_per_image, out_per_image.max(1), |s, e| {
        let (i0, i1) = (s / out_per_image, e / out_per_image);
        let mut part = w.clone();
        part.input[0] = i1 - i0;
        let wide: Vec<Vec<f32>> = inputs
            .iter()
            .map(|(data, per)| crate::buffer::widen_range(data, i0 * per, i1 * per))
            .collect();
        f32_kernel(&part, &wide)
    });
    H::host(out)
}

/// Dense half-precision data of an operand, or `None` for other dtypes.
fn dense_half<'a>(x: &Operand<'a>) -> Option<HalfView<'a>> {
    match host(x).ok()? {
        HostData::F16(v) => Some(HalfView::F16(dense(v, x.layout))),
        HostData::BF16(v) => Some(HalfView::BF16(dense(v, x.layout))),
        _ => None,
    }
}

enum HalfView<'a> {
    F16(std::borrow::Cow<'a, [half::f16]>),
    BF16(std::borrow::Cow<'a, [half::bf16]>),
}

pub(crate) fn pool2d(kind: PoolKind, x: Operand<'_>, w: &Window2d) -> Result<HostData> {
    let [_, h, wd, c] = w.input;
    let out_per_image = w.output[0] * w.output[1] * c;
    let fast = kind == PoolKind::MaxPool2d && super::max_pool::available();
    let pool_f32 = |x: &[f32], part: &Window2d| {
        if fast {
            super::max_pool::max_pool(x, part)
        } else {
            pool_typed(kind, x, part)
        }
    };
    let kernel = |part: &Window2d, ins: &[Vec<f32>]| pool_f32(&ins[0], part);
    match dense_half(&x) {
        Some(HalfView::F16(v)) if fast => {
            return Ok(HostData::F16(super::max_pool::max_pool(&v, w)))
        }
        Some(HalfView::F16(v)) => {
            return Ok(pool_half(w, &[(&v, h * wd * c)], out_per_image, kernel))
        }
        Some(HalfView::BF16(v)) if fast => {
            return Ok(HostData::BF16(super::max_pool::max_pool(&v, w)))
        }
        Some(HalfView::BF16(v)) => {
            return Ok(pool_half(w, &[(&v, h * wd * c)], out_per_image, kernel))
        }
        None => {}
    }
    Ok(match floats(kind.name(), &x)? {
        Floats::F32(a) => narrow(pool_f32(&a, w), x.dtype),
        Floats::F64(a) => HostData::F64(pool_typed(kind, &a, w)),
    })
}

/// The gradient of max pooling: each window's gradient goes to the first tap holding the
/// window's maximum (a NaN, the first NaN). Per window, over contiguous channel rows and
/// without data-dependent branches (so the loops vectorise): the maximum, then the first tap
/// equal to it (taps scanned backwards, the last match kept), then the writes.
fn max_pool_grad_typed<T: Num + Send + Sync + num_traits::Float>(
    x: &[T],
    dy: &[T],
    w: &Window2d,
) -> Vec<T> {
    let [n, h, wd, c] = w.input;
    let [oh, ow] = w.output;
    let mut dx = crate::block_cache::filled(n * h * wd * c, T::ZERO);
    // Windows that tile the input (Keras' default pooling) write each element once.
    let tiled = w.strides == w.kernel && w.pad_before == [0, 0];
    dx.par_chunks_mut((h * wd * c).max(1))
        .enumerate()
        .for_each(|(b, img)| {
            let xb = &x[b * h * wd * c..][..h * wd * c];
            let mut best = vec![T::ZERO; c];
            let mut first = vec![0u32; c];
            let mut taps: Vec<usize> = Vec::with_capacity(w.kernel[0] * w.kernel[1]);
            for oy in 0..oh {
                for ox in 0..ow {
                    taps.clear();
                    for_windows(w, oy, ox, |iy, ix| taps.push((iy * wd + ix) * c));
                    let Some(&p0) = taps.first() else {
                        continue; // a window entirely inside the padding
                    };
                    best.copy_from_slice(&xb[p0..p0 + c]);
                    for &p in &taps[1..] {
                        for (m, &v) in best.iter_mut().zip(&xb[p..p + c]) {
                            let take = (v > *m) | (v.isnan() & !m.isnan());
                            *m = if take { v } else { *m };
                        }
                    }
                    first.fill(taps.len() as u32);
                    for (t, &p) in taps.iter().enumerate().rev() {
                        for ((f, &v), &m) in first.iter_mut().zip(&xb[p..p + c]).zip(&best) {
                            let hit = (v == m) | (v.isnan() & m.isnan());
                            *f = if hit { t as u32 } else { *f };
                        }
                    }
                    let g = &dy[((b * oh + oy) * ow + ox) * c..][..c];
                    for (t, &p) in taps.iter().enumerate() {
                        let d = &mut img[p..p + c];
                        if tiled {
                            for ((d, &f), &g) in d.iter_mut().zip(&first).zip(g) {
                                *d = if f == t as u32 { g } else { T::ZERO };
                            }
                        } else {
                            for ((d, &f), &g) in d.iter_mut().zip(&first).zip(g) {
                                *d = *d + if f == t as u32 { g } else { T::ZERO };
                            }
                        }
                    }
                }
            }
        });
    dx
}

pub(crate) fn max_pool_grad(x: Operand<'_>, dy: Operand<'_>, w: &Window2d) -> Result<HostData> {
    let [_, h, wd, c] = w.input;
    let (per_x, per_dy) = (h * wd * c, w.output[0] * w.output[1] * c);
    let fast = super::max_pool::available();
    let grad_f32 = |x: &[f32], dy: &[f32], part: &Window2d| {
        if fast {
            super::max_pool::max_pool_grad(x, dy, part)
        } else {
            max_pool_grad_typed(x, dy, part)
        }
    };
    let kernel = |part: &Window2d, ins: &[Vec<f32>]| grad_f32(&ins[0], &ins[1], part);
    match (dense_half(&x), dense_half(&dy)) {
        (Some(HalfView::F16(a)), Some(HalfView::F16(g)))
            if fast && super::max_pool::grad_exact::<half::f16>(w) =>
        {
            return Ok(HostData::F16(super::max_pool::max_pool_grad(&a, &g, w)))
        }
        (Some(HalfView::F16(a)), Some(HalfView::F16(g))) => {
            return Ok(pool_half(w, &[(&a, per_x), (&g, per_dy)], per_x, kernel))
        }
        (Some(HalfView::BF16(a)), Some(HalfView::BF16(g)))
            if fast && super::max_pool::grad_exact::<half::bf16>(w) =>
        {
            return Ok(HostData::BF16(super::max_pool::max_pool_grad(&a, &g, w)))
        }
        (Some(HalfView::BF16(a)), Some(HalfView::BF16(g))) => {
            return Ok(pool_half(w, &[(&a, per_x), (&g, per_dy)], per_x, kernel))
        }
        _ => {}
    }
    float_pair(
        "max_pool_grad",
        &x,
        &dy,
        x.dtype,
        |a, g| grad_f32(a, g, w),
        |a, g| max_pool_grad_typed(a, g, w),
    )
}

/// `max_pool_grad` then the bias gradient in one pass ([`super::max_pool::bias_activation_grad_tiled`])
/// where the native kernels run, the windows tile the input and the type is float32 or a
/// half type; `None` elsewhere (the caller runs the two kernels, which give the same bits).
pub(crate) fn max_pool_bias_activation_grad(
    y: Operand<'_>,
    dy: Operand<'_>,
    w: &Window2d,
    activation: FusedActivation,
) -> Result<Option<(HostData, HostData)>> {
    use super::max_pool::{available, bias_activation_grad_tiled, tiles};
    if !available() || !tiles(w) || w.input.contains(&0) {
        return Ok(None);
    }
    let relu = activation == FusedActivation::Relu;
    Ok(match (host(&y)?, host(&dy)?) {
        (HostData::F32(a), HostData::F32(g)) => {
            let (dx, db) =
                bias_activation_grad_tiled(&dense(a, y.layout), &dense(g, dy.layout), w, relu);
            Some((HostData::F32(dx), HostData::F32(db)))
        }
        (HostData::BF16(a), HostData::BF16(g)) => {
            let (dx, db) =
                bias_activation_grad_tiled(&dense(a, y.layout), &dense(g, dy.layout), w, relu);
            Some((HostData::BF16(dx), HostData::BF16(db)))
        }
        (HostData::F16(a), HostData::F16(g)) => {
            let (dx, db) =
                bias_activation_grad_tiled(&dense(a, y.layout), &dense(g, dy.layout), w, relu);
            Some((HostData::F16(dx), HostData::F16(db)))
        }
        _ => None,
    })
}

fn avg_pool_grad_typed<T: Num + Send + Sync + num_traits::Float>(dy: &[T], w: &Window2d) -> Vec<T> {
    let [n, h, wd, c] = w.input;
    let [oh, ow] = w.output;
    let mut dx = crate::block_cache::filled(n * h * wd * c, T::ZERO);
    dx.par_chunks_mut((h * wd * c).max(1))
        .enumerate()
        .for_each(|(b, img)| {
            for oy in 0..oh {
                for ox in 0..ow {
                    let mut count = 0usize;
                    for_windows(w, oy, ox, |_, _| count += 1);
                    let inv = T::ONE / T::from(count.max(1)).unwrap_or(T::ONE);
                    let g = &dy[((b * oh + oy) * ow + ox) * c..][..c];
                    for_windows(w, oy, ox, |iy, ix| {
                        let d = &mut img[(iy * wd + ix) * c..][..c];
                        d.iter_mut().zip(g).for_each(|(a, &v)| *a = *a + v * inv);
                    });
                }
            }
        });
    dx
}

pub(crate) fn avg_pool_grad(dy: Operand<'_>, w: &Window2d) -> Result<HostData> {
    Ok(match floats("avg_pool_grad", &dy)? {
        Floats::F32(g) => narrow(avg_pool_grad_typed(&g, w), dy.dtype),
        Floats::F64(g) => HostData::F64(avg_pool_grad_typed(&g, w)),
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use ferroflow_tensor::Padding;

    fn values(n: usize, seed: u64) -> Vec<f32> {
        (0..n)
            .map(|i| ((((i as u64 + 1) * 2_654_435_761) ^ seed) % 1000) as f32 / 250.0 - 2.0)
            .collect()
    }

    /// The bf16 convolutions (AVX512-BF16 products, f32 accumulation) agree with the f32
    /// ones on the same bf16-representable values.
    #[test]
    fn bf16_convolutions_match_float32() {
        if !super::super::bf16_gemm::available() {
            return ferroflow_tensor::testing::skip(
                "FERROFLOW_REQUIRE_AVX512",
                "this CPU has no AVX512-BF16; the bf16 convolutions do not run",
            );
        }
        let cases = [
            ([2, 9, 8, 8], [3, 3], [1, 1], [1, 1], Padding::Valid, 16),
            ([3, 7, 7, 5], [3, 3], [2, 2], [1, 1], Padding::Same, 20),
            ([1, 10, 9, 6], [2, 3], [1, 2], [2, 1], Padding::Same, 33),
        ];
        let round = |v: Vec<f32>| -> Vec<f32> {
            v.into_iter()
                .map(|x| half::bf16::from_f32(x).to_f32())
                .collect()
        };
        let to_bf16 =
            |v: &[f32]| -> Vec<half::bf16> { v.iter().map(|&x| half::bf16::from_f32(x)).collect() };
        for (shape, k, strides, dilations, pad, cout) in cases {
            let w = Window2d::resolve("test", shape, k, strides, dilations, pad).unwrap();
            assert!(!direct::suits(&w));
            let x = round(values(shape.iter().product(), 4));
            let f = round(values(k[0] * k[1] * shape[3] * cout, 5));
            let want = conv2d_typed(&x, &f, &w, cout, &SameType);
            let got = conv2d_typed(&to_bf16(&x), &to_bf16(&f), &w, cout, &Bf16Dot);
            let close = |what: &str, got: &[f32], want: &[f32]| {
                assert_eq!(got.len(), want.len());
                for (g, e) in got.iter().zip(want) {
                    assert!(
                        (g - e).abs() <= 1e-4 * (1.0 + e.abs()),
                        "{what} {shape:?}: {g} vs {e}"
                    );
                }
            };
            close("forward", &got, &want);
            let dy = round(values(want.len(), 6));
            close(
                "backprop input",
                &backprop_input_typed(&to_bf16(&f), &to_bf16(&dy), &w, cout, &Bf16Dot),
                &backprop_input_typed(&f, &dy, &w, cout, &SameType),
            );
            close(
                "backprop filter",
                &backprop_filter_typed(&to_bf16(&x), &to_bf16(&dy), &w, cout, &Bf16Dot),
                &backprop_filter_typed(&x, &dy, &w, cout, &SameType),
            );
        }
    }

    /// Pooling and its gradient on half-precision data, a few images at a time, give what
    /// the whole-batch f32 kernels give on the widened data.
    #[test]
    fn half_pooling_matches_the_widened_kernels() {
        for (shape, k, strides, pad) in [
            ([5, 8, 8, 3], [2, 2], [2, 2], Padding::Valid),
            ([3, 7, 9, 2], [3, 3], [2, 1], Padding::Same),
            ([40, 4, 4, 1], [2, 2], [2, 2], Padding::Valid),
        ] {
            let w = Window2d::resolve("test", shape, k, strides, [1, 1], pad).unwrap();
            // Values on a coarse grid, so windows hold ties.
            let x: Vec<half::bf16> = values(shape.iter().product(), 7)
                .iter()
                .map(|v| half::bf16::from_f32((v * 2.0).round()))
                .collect();
            let per_x = shape[1] * shape[2] * shape[3];
            let per_y = w.output[0] * w.output[1] * shape[3];
            let dy: Vec<half::bf16> = values(shape[0] * per_y, 8)
                .iter()
                .map(|&v| half::bf16::from_f32(v))
                .collect();
            let wide = |v: &[half::bf16]| -> Vec<f32> { v.iter().map(|h| h.to_f32()).collect() };
            let want = narrow(max_pool_grad_typed(&wide(&x), &wide(&dy), &w), DType::BF16);
            let got = pool_half(&w, &[(&x, per_x), (&dy, per_y)], per_x, |part, ins| {
                max_pool_grad_typed(&ins[0], &ins[1], part)
            });
            assert_eq!(got, want, "max_pool_grad {shape:?}");
            let want = narrow(pool_typed(PoolKind::AvgPool2d, &wide(&x), &w), DType::BF16);
            let got = pool_half(&w, &[(&x, per_x)], per_y, |part, ins| {
                pool_typed(PoolKind::AvgPool2d, &ins[0], part)
            });
            assert_eq!(got, want, "avg_pool {shape:?}");
        }
    }

    /// The direct small-channel kernels agree with im2col + GEMM on every geometry kind.
    #[test]
    fn direct_convolution_matches_im2col() {
        let cases = [
            ([2, 9, 8, 1], [3, 3], [1, 1], [1, 1], Padding::Valid, 32),
            ([3, 7, 7, 3], [3, 3], [2, 2], [1, 1], Padding::Same, 20),
            ([1, 10, 9, 2], [2, 3], [1, 2], [2, 1], Padding::Same, 17),
            ([2, 5, 6, 1], [5, 5], [1, 1], [1, 1], Padding::Same, 7),
        ];
        for (shape, k, strides, dilations, pad, cout) in cases {
            let w = Window2d::resolve("test", shape, k, strides, dilations, pad).unwrap();
            assert!(direct::suits(&w));
            let x = values(shape.iter().product(), 1);
            let f = values(k[0] * k[1] * shape[3] * cout, 2);
            let (got, want) = (
                direct::forward(&x, &f, &w, cout),
                conv2d_typed(&x, &f, &w, cout, &SameType),
            );
            for (g, e) in got.iter().zip(&want) {
                assert!(
                    (g - e).abs() <= 1e-4 * (1.0 + e.abs()),
                    "forward {shape:?}: {g} vs {e}"
                );
            }
            let dy = values(want.len(), 3);
            let (got, want) = (
                direct::filter_grad(&x, &dy, &w, cout),
                backprop_filter_typed(&x, &dy, &w, cout, &SameType),
            );
            assert_eq!(got.len(), want.len());
            for (g, e) in got.iter().zip(&want) {
                assert!(
                    (g - e).abs() <= 1e-3 * (1.0 + e.abs()),
                    "filter {shape:?}: {g} vs {e}"
                );
            }
        }
    }
}
