//! Bias and activation around a layer's product: `activation(y + bias)` applied in place
//! (a fused convolution's last step on paths without a native epilogue), and its gradients
//! (`dx = g·[y > 0]`, `dbias = Σ dx` over the leading axes) in one pass.

use super::f32_gemm::{native_isa, with_isa, Kernels};
use crate::buffer::{dense, host, widen_range, Half};
use crate::lanes::Lanes;
use crate::num::Num;
use crate::simd::{for_each_chunk_shared, Isa, SharedMut};
use ferroflow_tensor::{backend::unsupported, FusedActivation, HostData, Operand, Result};
use rayon::prelude::*;

/// `y[.., c] = activation(y[.., c] + bias[c])` over rows of `bias.len()` channels, in
/// parallel for large outputs. ReLU as the `relu` kernel: NaN kept, `x <= 0` becomes 0.
pub(crate) fn bias_activation<T: Num + Send + Sync + num_traits::Float>(
    y: &mut [T],
    bias: &[T],
    activation: FusedActivation,
) {
    let c = bias.len().max(1);
    let rows = (65536 / c).max(1);
    let part = |part: &mut [T]| {
        for row in part.chunks_mut(c) {
            for (v, &b) in row.iter_mut().zip(bias) {
                let s = *v + b;
                *v = match activation {
                    FusedActivation::Linear => s,
                    FusedActivation::Relu if s <= T::ZERO => T::ZERO,
                    FusedActivation::Relu => s,
                };
            }
        }
    };
    if y.len() <= rows * c {
        // One chunk: on this thread (handing it to the pool costs more than it does).
        part(y);
    } else {
        y.par_chunks_mut(rows * c).for_each(part);
    }
}

/// `activation(a @ b + bias)` for f32 or f64: the product, then the bias and activation
/// in place over it while it is fresh in cache (no second buffer).
pub(crate) fn fused_matmul(
    a: Operand<'_>,
    b: Operand<'_>,
    bias: Operand<'_>,
    activation: FusedActivation,
) -> Result<HostData> {
    let mut y = super::matmul::matmul(a, b)?;
    match (&mut y, host(&bias)?) {
        (HostData::F32(v), HostData::F32(c)) => {
            bias_activation(v, &dense(c, bias.layout), activation)
        }
        (HostData::F64(v), HostData::F64(c)) => {
            bias_activation(v, &dense(c, bias.layout), activation)
        }
        _ => return Err(unsupported("cpu", "fused_matmul", a.dtype)),
    }
    Ok(y)
}

/// `(dx, dbias)` for `y = activation(x + bias)` from `y`'s gradient `g`, in every float
/// type: float32 and the half types in vector registers where the CPU has AVX2 or
/// AVX-512 (half types widened there, sums in f32), else element by element (half types
/// widened chunk by chunk).
pub(crate) fn bias_activation_grad(
    g: Operand<'_>,
    y: Operand<'_>,
    activation: FusedActivation,
) -> Result<(HostData, HostData)> {
    let c = g.shape().last().copied().unwrap_or(1).max(1);
    let per = chunk_rows(g.shape());
    let relu = activation == FusedActivation::Relu;
    match (host(&g)?, host(&y)?) {
        (HostData::F32(a), HostData::F32(b)) => {
            let (a, b) = (dense(a, g.layout), dense(b, y.layout));
            let (dx, db) = match native_isa() {
                Some(isa) => grad_lanes(isa, &a, &b, c, per, relu),
                None => grad_typed(&a, &b, c, per, relu),
            };
            Ok((HostData::F32(dx), HostData::F32(db)))
        }
        (HostData::F64(a), HostData::F64(b)) => {
            let (dx, db) = grad_typed(&dense(a, g.layout), &dense(b, y.layout), c, per, relu);
            Ok((HostData::F64(dx), HostData::F64(db)))
        }
        (HostData::BF16(a), HostData::BF16(b)) => {
            let (dx, db) =
                grad_half_precision(&dense(a, g.layout), &dense(b, y.layout), c, per, relu);
            Ok((HostData::BF16(dx), HostData::BF16(db)))
        }
        (HostData::F16(a), HostData::F16(b)) => {
            let (dx, db) =
                grad_half_precision(&dense(a, g.layout), &dense(b, y.layout), c, per, relu);
            Ok((HostData::F16(dx), HostData::F16(db)))
        }
        _ => Err(unsupported("cpu", "bias_activation_grad", g.dtype)),
    }
}

/// Rows of `c` channels per chunk claimed by a thread (about 64 KB of `g`).
fn rows_per_chunk(c: usize) -> usize {
    (16384 / c.max(1)).max(1)
}

/// Values of an image at most that a chunk holds whole ([`chunk_rows`]): 256 KB of f32.
const WHOLE_IMAGE_VALUES: usize = 65536;

/// Images a batch needs for chunks of whole images ([`chunk_rows`]): fewer would leave
/// threads idle (a constant, not the thread count, so that the sums' order is the same on
/// every machine).
const WHOLE_IMAGE_BATCH: usize = 8;

/// The rows (all axes but the last, flattened) per chunk of a bias gradient over a tensor
/// of `shape`, whose chunks' partial sums fix its order of additions: whole images (the
/// axes between the first and the last) where one has at most [`WHOLE_IMAGE_VALUES`]
/// values and the batch at least [`WHOLE_IMAGE_BATCH`] of them, as many as make about
/// 64 KB; else (and for matrices) [`rows_per_chunk`]. Whole images let the fused pooling
/// gradient sum each image as it writes it.
pub(super) fn chunk_rows(shape: &[usize]) -> usize {
    let c = shape.last().copied().unwrap_or(1).max(1);
    let image: usize = shape
        .get(1..shape.len().saturating_sub(1))
        .map_or(1, |s| s.iter().product());
    let batch = shape.first().copied().unwrap_or(0);
    if shape.len() >= 3
        && image > 0
        && image * c <= WHOLE_IMAGE_VALUES
        && batch >= WHOLE_IMAGE_BATCH
    {
        image * (16384 / (image * c)).max(1)
    } else {
        rows_per_chunk(c)
    }
}

/// One chunk of rows: `dst = g·mask` (written), `sum += dst` per channel.
#[inline(always)]
fn grad_rows<T: Num + num_traits::Float>(
    g: &[T],
    y: &[T],
    c: usize,
    relu: bool,
    dst: &mut [std::mem::MaybeUninit<T>],
    sum: &mut [T],
) {
    for ((d, gr), yr) in dst.chunks_mut(c).zip(g.chunks(c)).zip(y.chunks(c)) {
        for (((d, s), &gv), &yv) in d.iter_mut().zip(sum.iter_mut()).zip(gr).zip(yr) {
            // Passes where y > 0 (a NaN y blocks, as relu_grad).
            let pass = yv > T::ZERO;
            let v = if relu & !pass { T::ZERO } else { gv };
            d.write(v);
            *s = *s + v;
        }
    }
}

/// Runs `chunk(k, rows r0..r1, dx rows (uninitialised), partial sums of chunk k)` over
/// chunks of the `values / c` rows on the pool; returns `dx` (every row written by
/// `chunk`) and the per-channel sums of all chunks' partials.
fn over_chunks<D: Copy + Send, S: num_traits::Float + Send + Sync>(
    values: usize,
    c: usize,
    per: usize,
    chunk: impl Fn(usize, usize, &mut [std::mem::MaybeUninit<D>], &mut [S]) + Sync,
) -> (Vec<D>, Vec<S>) {
    let rows = values / c;
    let mut dx: Vec<D> = crate::block_cache::with_capacity(rows * c);
    let out = SharedMut(dx.as_mut_ptr());
    let sums = chunk_sums(rows, c, per, |r0, r1, sum| {
        // SAFETY: rows r0..r1 of dx are this chunk's only, and dx has capacity for rows * c
        // values; the rows are written before dx's length is set.
        let dst = unsafe {
            std::slice::from_raw_parts_mut(
                out.get().add(r0 * c).cast::<std::mem::MaybeUninit<D>>(),
                (r1 - r0) * c,
            )
        };
        chunk(r0, r1, dst, sum);
    });
    // SAFETY: `chunk` wrote every row (its contract).
    unsafe { dx.set_len(rows * c) };
    (dx, sums)
}

/// The order every bias gradient here sums in: `chunk(rows r0..r1, partial)` adds each
/// chunk's rows (`per` of them, [`chunk_rows`]) into a partial of `c` sums starting at
/// zero, on the pool; the partials are then added in chunk order.
pub(super) fn chunk_sums<S: num_traits::Float + Send + Sync>(
    rows: usize,
    c: usize,
    per: usize,
    chunk: impl Fn(usize, usize, &mut [S]) + Sync,
) -> Vec<S> {
    let per = per.max(1);
    let chunks = rows.div_ceil(per);
    let mut partials = vec![S::zero(); chunks.max(1) * c];
    let sums = SharedMut(partials.as_mut_ptr());
    for_each_chunk_shared(chunks, |k| {
        let (r0, r1) = (k * per, ((k + 1) * per).min(rows));
        // SAFETY: chunk k owns partial k (c values).
        let sum = unsafe { std::slice::from_raw_parts_mut(sums.get().add(k * c), c) };
        chunk(r0, r1, sum);
    });
    let (db, rest) = partials.split_at_mut(c);
    for part in rest.chunks(c) {
        for (a, &b) in db.iter_mut().zip(part) {
            *a = *a + b;
        }
    }
    partials.truncate(c);
    partials
}

/// Adds the rows of `dx` (`c ≥ 1` channels each, in order) to `sum` per channel, widened
/// to f32: one chunk's share of a bias gradient whose `dx` is already masked (the fused
/// pooling gradient's), as [`grad_rows_lanes`] adds it.
///
/// # Safety
/// The CPU has `isa`.
pub(super) unsafe fn add_rows<H: Lanes>(isa: Isa, dx: &[H], c: usize, sum: &mut [f32]) {
    grad_rows_lanes(isa, dx, &[], c, false, None, sum)
}

/// The bias gradient, summed in f32, narrowed once to the element type (a copy for f32).
pub(super) fn narrow_sums<H: Lanes>(db: &[f32]) -> Vec<H> {
    let mut out = Vec::with_capacity(db.len());
    // SAFETY: narrow_to writes all db.len() elements of the capacity.
    unsafe {
        H::narrow_to(db, out.as_mut_ptr());
        out.set_len(db.len());
    }
    out
}

/// `(dx, dbias)` over rows of `c ≥ 1` channels; `relu`: the activation is ReLU.
fn grad_typed<T: Num + Send + Sync + num_traits::Float>(
    g: &[T],
    y: &[T],
    c: usize,
    per: usize,
    relu: bool,
) -> (Vec<T>, Vec<T>) {
    over_chunks(g.len().min(y.len()), c, per, |r0, r1, dst, sum| {
        let span = r0 * c..r1 * c;
        grad_rows(&g[span.clone()], &y[span], c, relu, dst, sum)
    })
}

/// Half-precision `g`, `y`: in registers with AVX-512 or AVX2, else widened chunk by chunk.
fn grad_half_precision<H: Half + Lanes + Send + Sync>(
    g: &[H],
    y: &[H],
    c: usize,
    per: usize,
    relu: bool,
) -> (Vec<H>, Vec<H>) {
    match native_isa() {
        Some(isa) => grad_lanes(isa, g, y, c, per, relu),
        None => grad_half(g, y, c, per, relu),
    }
}

/// Half-precision `g`, `y`: each chunk widened to f32, computed, `dx` narrowed back; the
/// bias gradient summed in f32 and narrowed once.
fn grad_half<H: Half + Send + Sync>(
    g: &[H],
    y: &[H],
    c: usize,
    per: usize,
    relu: bool,
) -> (Vec<H>, Vec<H>) {
    let (dx, db) = over_chunks(
        g.len().min(y.len()),
        c,
        per,
        |r0, r1, dst: &mut [std::mem::MaybeUninit<H>], sum| {
            let (gw, yw) = (
                widen_range(g, r0 * c, r1 * c),
                widen_range(y, r0 * c, r1 * c),
            );
            let mut wide = vec![0f32; gw.len()];
            // SAFETY: MaybeUninit<f32> has f32's layout; grad_rows only writes through it.
            let view = unsafe {
                &mut *(wide.as_mut_slice() as *mut [f32] as *mut [std::mem::MaybeUninit<f32>])
            };
            grad_rows(&gw, &yw, c, relu, view, sum);
            assert_eq!(
                wide.len(),
                dst.len(),
                "a chunk's dx and its rows differ in length"
            );
            // SAFETY: dst holds wide.len() elements; narrow_to writes every one.
            unsafe { H::narrow_to(&wide, dst.as_mut_ptr().cast()) }
        },
    );
    (dx, narrow_sums(&db))
}

/// `g`, `y` in registers (`isa`'s vectors): `dx` is `g`'s own value or zero (exact:
/// nothing to round), the bias gradient summed in f32 from `g` widened in registers; no
/// f32 buffers for half types.
fn grad_lanes<H: Lanes>(
    isa: Isa,
    g: &[H],
    y: &[H],
    c: usize,
    per: usize,
    relu: bool,
) -> (Vec<H>, Vec<H>) {
    let (dx, db) = over_chunks(
        g.len().min(y.len()),
        c,
        per,
        |r0, r1, dst, sum: &mut [f32]| {
            let span = r0 * c..r1 * c;
            // SAFETY: the CPU has `isa` (`native_isa` chose it); g, y and dst hold the chunk's
            // rows; sum holds c values.
            unsafe {
                grad_rows_lanes(
                    isa,
                    &g[span.clone()],
                    &y[span],
                    c,
                    relu,
                    Some(dst.as_mut_ptr().cast()),
                    sum,
                )
            }
        },
    );
    (dx, narrow_sums(&db))
}

/// Vectors of channels [`grad_rows_lanes_with`] sums in registers at once.
const SUM_VECTORS: usize = 4;

/// `dst = g·[y > 0]` (or `g` without ReLU; nothing stored without `dst`) and `sum += dst`
/// per channel over rows of `c` channels: blocks of up to [`SUM_VECTORS`] vectors of `K::LANES` channels, each block's
/// sums held in registers down all the rows (not loaded and stored back per row). Each
/// channel still adds its rows in order, as [`grad_rows`] does (the same bits); a blocked
/// lane adds zero, as it does there.
///
/// # Safety
/// The CPU has `K`'s instruction set; `dst`, if any, is valid for `g.len()` writes; `y` is
/// as long as `g` where `relu`; `sum` holds `c` values.
#[inline(always)]
unsafe fn grad_rows_lanes_with<K: Kernels, H: Lanes>(
    g: &[H],
    y: &[H],
    c: usize,
    relu: bool,
    dst: Option<*mut H>,
    sum: &mut [f32],
) {
    assert!((!relu || y.len() >= g.len()) && sum.len() >= c);
    let rows = g.len() / c;
    for b0 in (0..c).step_by(SUM_VECTORS * K::LANES) {
        // Channels of each vector of the block (0: past the last channel).
        let lens: [usize; SUM_VECTORS] =
            std::array::from_fn(|j| c.saturating_sub(b0 + j * K::LANES).min(K::LANES));
        let mut acc = [K::zero(); SUM_VECTORS];
        for j in 0..SUM_VECTORS {
            if lens[j] > 0 {
                acc[j] = K::load(sum.as_ptr().add(b0 + j * K::LANES), lens[j]);
            }
        }
        for r in 0..rows {
            for j in 0..SUM_VECTORS {
                let len = lens[j];
                if len == 0 {
                    break;
                }
                let at = r * c + b0 + j * K::LANES;
                let gv = K::load_from(g.as_ptr().add(at), len);
                // Passes where y > 0 (a NaN y blocks), as grad_rows.
                let kept = if relu {
                    K::keep(K::positive(K::load_from(y.as_ptr().add(at), len)), gv)
                } else {
                    gv
                };
                if let Some(dst) = dst {
                    // g's own bits or zero: exact.
                    K::store_exact_to(dst.add(at), len, kept);
                }
                acc[j] = K::add(acc[j], kept);
            }
        }
        for j in 0..SUM_VECTORS {
            if lens[j] > 0 {
                K::store(sum.as_mut_ptr().add(b0 + j * K::LANES), lens[j], acc[j]);
            }
        }
    }
}

with_isa! {
    /// [`grad_rows_lanes_with`] on `isa`'s vectors.
    unsafe fn grad_rows_lanes[H: Lanes][H](
        g: &[H],
        y: &[H],
        c: usize,
        relu: bool,
        dst: Option<*mut H>,
        sum: &mut [f32],
    ) = grad_rows_lanes_with;
}

#[cfg(test)]
mod tests {
    use super::*;

    /// `g` and `y` for `rows` rows of `c` channels: values in [-1, 1] with zeros, a NaN `g`
    /// and a NaN `y` among them.
    fn operands(rows: usize, c: usize, seed: u32) -> (Vec<f32>, Vec<f32>) {
        let mut state = seed;
        let mut next = move || {
            state ^= state << 13;
            state ^= state >> 17;
            state ^= state << 5;
            (state % 2001) as f32 / 1000.0 - 1.0
        };
        let n = rows * c;
        let mut g: Vec<f32> = (0..n).map(|_| next()).collect();
        let mut y: Vec<f32> = (0..n)
            .map(|i| if i % 5 == 0 { 0.0 } else { next() })
            .collect();
        g[n / 3] = f32::NAN;
        y[n / 2] = f32::NAN;
        (g, y)
    }

    fn bits<T: Half>(v: &[T]) -> Vec<u32> {
        v.iter().map(|&x| x.widen_one().to_bits()).collect()
    }

    /// The vector path against the widened one for half type `H`, bit for bit.
    fn half_matches<H: Half>(isa: Isa, g: &[f32], y: &[f32], c: usize, relu: bool, case: &str) {
        let (gh, yh): (Vec<H>, Vec<H>) = (
            g.iter().map(|&x| H::narrow_one(x)).collect(),
            y.iter().map(|&x| H::narrow_one(x)).collect(),
        );
        let per = rows_per_chunk(c);
        let (dx, db) = grad_lanes(isa, &gh, &yh, c, per, relu);
        let (want_dx, want_db) = grad_half(&gh, &yh, c, per, relu);
        let name = std::any::type_name::<H>();
        assert_eq!(bits(&dx), bits(&want_dx), "{name} dx {case}");
        assert_eq!(bits(&db), bits(&want_db), "{name} db {case}");
    }

    /// The vector path (sums in registers, blocks of channels, chunks of rows) gives the
    /// element-by-element path's bits for float32, and for bf16 and f16 the widened path's,
    /// over channel counts around the vector and block widths and row counts past a chunk.
    #[test]
    fn vector_bias_gradient_matches_the_element_by_element_one() {
        let Some(isa) = native_isa() else {
            return ferroflow_tensor::testing::skip(
                "FERROFLOW_REQUIRE_AVX512",
                "neither AVX-512 nor AVX2 + FMA here (or FERROFLOW_CPU_ISA=scalar); the vector bias gradient does not run",
            );
        };
        for c in [1, 7, 8, 9, 16, 31, 32, 33, 64, 65, 100] {
            for rows in [1, 3, rows_per_chunk(c) * 2 + 5] {
                for relu in [true, false] {
                    let case = format!("c {c}, rows {rows}, relu {relu}");
                    let (g, y) = operands(rows, c, 0x9e37_79b9 ^ (c * 31 + rows) as u32);
                    let per = rows_per_chunk(c);
                    let (dx, db) = grad_lanes(isa, &g, &y, c, per, relu);
                    let (want_dx, want_db) = grad_typed(&g, &y, c, per, relu);
                    let f32_bits = |v: &[f32]| v.iter().map(|x| x.to_bits()).collect::<Vec<_>>();
                    assert_eq!(f32_bits(&dx), f32_bits(&want_dx), "f32 dx {case}");
                    assert_eq!(f32_bits(&db), f32_bits(&want_db), "f32 db {case}");
                    half_matches::<half::bf16>(isa, &g, &y, c, relu, &case);
                    half_matches::<half::f16>(isa, &g, &y, c, relu, &case);
                }
            }
        }
    }
}
