//! Bias and activation around a layer's product: `activation(y + bias)` applied in place
//! (a fused convolution's last step on paths without a native epilogue), and its gradients
//! (`dx = g·[y > 0]`, `dbias = Σ dx` over the leading axes) in one pass.

use crate::buffer::{dense, host};
use crate::num::Num;
use crate::simd::{for_each_chunk_shared, SharedMut};
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
    y.par_chunks_mut(rows * c).for_each(|part| {
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
    });
}

/// `(dx, dbias)` for `y = activation(x + bias)` from `y`'s gradient `g` (f32, f64; other
/// dtypes are not supported here and the caller composes `relu_grad` and `reduce_sum`).
pub(crate) fn bias_activation_grad(
    g: Operand<'_>,
    y: Operand<'_>,
    activation: FusedActivation,
) -> Result<(HostData, HostData)> {
    let c = g.shape().last().copied().unwrap_or(1);
    match (host(&g)?, host(&y)?) {
        (HostData::F32(a), HostData::F32(b)) => {
            let (dx, db) = grad_typed(&dense(a, g.layout), &dense(b, y.layout), c, activation);
            Ok((HostData::F32(dx), HostData::F32(db)))
        }
        (HostData::F64(a), HostData::F64(b)) => {
            let (dx, db) = grad_typed(&dense(a, g.layout), &dense(b, y.layout), c, activation);
            Ok((HostData::F64(dx), HostData::F64(db)))
        }
        _ => Err(unsupported("cpu", "bias_activation_grad", g.dtype)),
    }
}

/// Rows of `c` channels per chunk claimed by a thread (about 64 KB of `g`).
fn rows_per_chunk(c: usize) -> usize {
    (16384 / c.max(1)).max(1)
}

fn grad_typed<T: Num + Send + Sync + num_traits::Float>(
    g: &[T],
    y: &[T],
    c: usize,
    activation: FusedActivation,
) -> (Vec<T>, Vec<T>) {
    let n = g.len().min(y.len());
    let c = c.max(1);
    let rows = n / c;
    let per = rows_per_chunk(c);
    let chunks = rows.div_ceil(per);
    let mut dx: Vec<T> = Vec::with_capacity(rows * c);
    let mut partials = vec![T::ZERO; chunks.max(1) * c];
    let (out, sums) = (SharedMut(dx.as_mut_ptr()), SharedMut(partials.as_mut_ptr()));
    let relu = activation == FusedActivation::Relu;
    for_each_chunk_shared(chunks, |k| {
        let (r0, r1) = (k * per, ((k + 1) * per).min(rows));
        // SAFETY: chunk k owns partial k (c values) and rows r0..r1 of dx, which has
        // capacity for rows * c values.
        let sum = unsafe { std::slice::from_raw_parts_mut(sums.get().add(k * c), c) };
        // SAFETY: as above; the rows are written (MaybeUninit) before dx's length is set.
        let dst = unsafe {
            std::slice::from_raw_parts_mut(
                out.get().add(r0 * c).cast::<std::mem::MaybeUninit<T>>(),
                (r1 - r0) * c,
            )
        };
        let (g, y) = (&g[r0 * c..r1 * c], &y[r0 * c..r1 * c]);
        for ((d, gr), yr) in dst.chunks_mut(c).zip(g.chunks(c)).zip(y.chunks(c)) {
            for (((d, s), &gv), &yv) in d.iter_mut().zip(sum.iter_mut()).zip(gr).zip(yr) {
                // Passes where y > 0 (a NaN y blocks, as relu_grad).
                let pass = yv > T::ZERO;
                let v = if relu & !pass { T::ZERO } else { gv };
                d.write(v);
                *s = *s + v;
            }
        }
    });
    // SAFETY: the chunks wrote every row.
    unsafe { dx.set_len(rows * c) };
    let (db, rest) = partials.split_at_mut(c);
    for part in rest.chunks(c) {
        for (a, &b) in db.iter_mut().zip(part) {
            *a = *a + b;
        }
    }
    partials.truncate(c);
    (dx, partials)
}
