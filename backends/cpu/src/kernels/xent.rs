//! Softmax cross-entropy against integer labels with its gradient
//! (`sparse_softmax_cross_entropy_with_logits`): one pass over each row of logits for the
//! maximum, one for the sum of exponentials, one writing the softmax minus the one-hot
//! target; rows in parallel for large batches.

use crate::buffer::{dense, host};
use ferroflow_tensor::{backend::unsupported, Error, HostData, Operand, Result};
use rayon::prelude::*;
use std::borrow::Cow;

const OP: &str = "sparse_softmax_cross_entropy_with_logits";

/// `(loss, backprop)` for f32 or f64 logits `[.., classes]` and int32/int64 labels.
pub(crate) fn sparse_softmax_cross_entropy(
    logits: Operand<'_>,
    labels: Operand<'_>,
) -> Result<(HostData, HostData)> {
    let classes = logits.shape().last().copied().unwrap_or(0);
    // int64 labels as they lie when dense (no copy per step); int32 widened.
    let ids: Cow<'_, [i64]> = match host(&labels)? {
        HostData::I64(v) => dense(v, labels.layout),
        HostData::I32(v) => dense(v, labels.layout).iter().map(|&i| i as i64).collect(),
        _ => return Err(unsupported("cpu", OP, labels.dtype)),
    };
    if let Some(&bad) = ids.iter().find(|&&i| i < 0 || i as u64 >= classes as u64) {
        return Err(Error::IndexOutOfRange {
            op: OP,
            index: bad,
            bound: classes,
        });
    }
    match host(&logits)? {
        HostData::F32(v) => {
            let (loss, backprop) = rows(&dense(v, logits.layout), &ids, classes);
            Ok((HostData::F32(loss), HostData::F32(backprop)))
        }
        HostData::F64(v) => {
            let (loss, backprop) = rows(&dense(v, logits.layout), &ids, classes);
            Ok((HostData::F64(loss), HostData::F64(backprop)))
        }
        _ => Err(unsupported("cpu", OP, logits.dtype)),
    }
}

/// Rows per parallel chunk (about 64 KB of logits).
fn rows_per_chunk(classes: usize) -> usize {
    (16384 / classes.max(1)).max(1)
}

fn rows<T: num_traits::Float + Send + Sync>(x: &[T], ids: &[i64], c: usize) -> (Vec<T>, Vec<T>) {
    let mut loss = vec![T::zero(); ids.len()];
    let mut backprop = crate::block_cache::filled(x.len(), T::zero());
    if c == 0 {
        return (loss, backprop);
    }
    let per = rows_per_chunk(c);
    if ids.len() <= per {
        rows_into(x, ids, &mut backprop, &mut loss, c);
    } else {
        backprop
            .par_chunks_mut(per * c)
            .zip(loss.par_chunks_mut(per))
            .enumerate()
            .for_each(|(i, (b, l))| {
                let first = i * per;
                let ids = &ids[first..first + l.len()];
                rows_into(&x[first * c..(first + l.len()) * c], ids, b, l, c);
            });
    }
    (loss, backprop)
}

/// Rows of `c` logits `x` with their labels into `backprop` and `loss`.
fn rows_into<T: num_traits::Float>(
    x: &[T],
    ids: &[i64],
    backprop: &mut [T],
    loss: &mut [T],
    c: usize,
) {
    for (((x, b), l), &id) in x.chunks(c).zip(backprop.chunks_mut(c)).zip(loss).zip(ids) {
        *l = row(x, b, id as usize);
    }
}

/// One row: `b = softmax(x) - one_hot(label)`, returns `logsumexp(x) - x[label]`, as TF's
/// kernel computes them (shifted by the row's maximum).
#[inline]
fn row<T: num_traits::Float>(x: &[T], b: &mut [T], label: usize) -> T {
    // A NaN skips the comparison here but makes the sum, and so the whole row, NaN.
    let max = x
        .iter()
        .fold(T::neg_infinity(), |m, &v| if v > m { v } else { m });
    let mut sum = T::zero();
    for (d, &v) in b.iter_mut().zip(x) {
        let e = (v - max).exp();
        *d = e;
        sum = sum + e;
    }
    let inv = sum.recip();
    for d in b.iter_mut() {
        *d = *d * inv;
    }
    b[label] = b[label] - T::one();
    sum.ln() - (x[label] - max)
}
