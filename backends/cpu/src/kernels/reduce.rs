//! Reductions (sum, prod, max, min, any, all) and argmax/argmin.
//!
//! The reduced axes are moved last by a layout permutation: dense rows then reduce with a
//! vectorised lane fold; a leading block of reduced axes on dense data reduces column-wise
//! (also vectorised); anything else is made dense first.

use crate::buffer::{dense, host, narrow, widen, Half};
use crate::num::Num;
use crate::simd::{combine_into, fold, per_thread_parts, PAR_THRESHOLD};
use ferroflow_tensor::{
    backend::unsupported, ArgReduceOp, Element, HostData, Layout, Operand, ReduceOp, Result,
};
use rayon::prelude::*;

pub(crate) fn reduce_with<T: Element, F: Fn(T, T) -> T + Sync + Send + Copy>(
    data: &[T],
    layout: &Layout,
    axes: &[usize],
    init: T,
    f: F,
) -> Vec<T> {
    let rank = layout.rank();
    let kept: Vec<usize> = (0..rank).filter(|a| !axes.contains(a)).collect();
    let k: usize = kept.iter().map(|&a| layout.shape()[a]).product();
    let r: usize = axes.iter().map(|&a| layout.shape()[a]).product();
    if r == 0 || k == 0 {
        return vec![init; k];
    }
    let leading_block = axes.iter().enumerate().all(|(i, &a)| i == a);
    if leading_block && !axes.is_empty() && !kept.is_empty() {
        if let Some((off, n)) = layout.contiguous_range() {
            return reduce_columns(&data[off..off + n], r, k, init, f);
        }
    }
    let mut perm = kept.clone();
    perm.extend_from_slice(axes);
    let permuted = layout
        .permute(&perm)
        .expect("kept ++ axes is a permutation");
    let rows = dense(data, &permuted);
    if k == 1 {
        return vec![fold(&rows, init, f)];
    }
    let row = |c: &[T]| c.iter().fold(init, |acc, &v| f(acc, v));
    if k * r < PAR_THRESHOLD {
        rows.chunks(r).map(row).collect()
    } else if r >= 4096 {
        rows.chunks(r).map(|c| fold(c, init, f)).collect()
    } else {
        rows.par_chunks(r).map(row).collect()
    }
}

/// `out[j] = f(.. f(f(init, x[0][j]), x[1][j]) ..)`: row-wise passes that vectorise over j.
/// Large inputs split the rows among threads (each streams whole rows, contiguous memory)
/// and combine the per-thread partial rows in order.
fn reduce_columns<T: Element, F: Fn(T, T) -> T + Sync + Send + Copy>(
    x: &[T],
    r: usize,
    k: usize,
    init: T,
    f: F,
) -> Vec<T> {
    let pass = |o: &mut [T], rows: std::ops::Range<usize>| {
        for i in rows {
            combine_into(o, &x[i * k..i * k + k], &f);
        }
    };
    let threads = rayon::current_num_threads();
    if r * k < PAR_THRESHOLD || threads == 1 || r < 2 * threads {
        let mut out = vec![init; k];
        pass(&mut out, 0..r);
        return out;
    }
    let partials = per_thread_parts(r, 2, Vec::new(), |lo, hi| {
        let mut o = vec![init; k];
        pass(&mut o, lo..hi);
        o
    });
    let mut parts = partials.into_iter();
    let mut out = parts.next().unwrap_or_else(|| vec![init; k]);
    for p in parts {
        combine_into(&mut out, &p, &f);
    }
    out
}

fn reduce_num<T: Num + Sync + Send>(
    op: ReduceOp,
    data: &[T],
    layout: &Layout,
    axes: &[usize],
) -> Option<Vec<T>> {
    Some(match op {
        ReduceOp::ReduceSum => reduce_with(data, layout, axes, T::ZERO, |a: T, b: T| a.wadd(b)),
        ReduceOp::ReduceMean => {
            let count = reduced_count(layout, axes);
            let mut sums = reduce_with(data, layout, axes, T::ZERO, |a: T, b: T| a.wadd(b));
            sums.iter_mut().for_each(|s| *s = s.mean_of(count));
            sums
        }
        ReduceOp::ReduceProd => reduce_with(data, layout, axes, T::ONE, |a: T, b: T| a.wmul(b)),
        // `a.isnan()` keeps a NaN once seen; a NaN `b` wins because `a > NaN` is false.
        ReduceOp::ReduceMax => reduce_with(data, layout, axes, T::LOWEST, |a: T, b: T| {
            if (a > b) | a.isnan() {
                a
            } else {
                b
            }
        }),
        ReduceOp::ReduceMin => reduce_with(data, layout, axes, T::HIGHEST, |a: T, b: T| {
            if (a < b) | a.isnan() {
                a
            } else {
                b
            }
        }),
        ReduceOp::ReduceAny | ReduceOp::ReduceAll => return None,
    })
}

/// A reduction of dense half-precision data over every axis but the last (a bias
/// gradient), without widening the whole buffer: blocks of rows are widened and folded into
/// f32 partials in parallel, the partials combined in order, the result narrowed. `None`:
/// the general path.
fn reduce_half_rows<H: Half>(
    op: ReduceOp,
    v: &[H],
    layout: &Layout,
    axes: &[usize],
) -> Option<HostData> {
    let rank = layout.rank();
    if rank < 2 || axes.len() != rank - 1 || axes.iter().enumerate().any(|(i, &a)| a != i) {
        return None;
    }
    let (off, n) = layout.contiguous_range()?;
    let c = layout.shape()[rank - 1];
    if c == 0 || n == 0 {
        return None;
    }
    let (init, combine): (f32, fn(f32, f32) -> f32) = match op {
        ReduceOp::ReduceSum | ReduceOp::ReduceMean => (0.0, |a, b| a + b),
        ReduceOp::ReduceProd => (1.0, |a, b| a * b),
        // As `reduce_num`: a NaN, once seen, stays.
        ReduceOp::ReduceMax => (
            f32::NEG_INFINITY,
            |a, b| if a > b || a.is_nan() { a } else { b },
        ),
        ReduceOp::ReduceMin => (
            f32::INFINITY,
            |a, b| if a < b || a.is_nan() { a } else { b },
        ),
        ReduceOp::ReduceAny | ReduceOp::ReduceAll => return None,
    };
    let src = &v[off..off + n];
    let rows = n / c;
    let per = (8192 / c).max(1);
    let partials: Vec<Vec<f32>> = (0..rows.div_ceil(per))
        .into_par_iter()
        .map(|k| {
            let (r0, r1) = (k * per, ((k + 1) * per).min(rows));
            let x = crate::buffer::widen_range(src, r0 * c, r1 * c);
            let mut acc = vec![init; c];
            for row in x.chunks_exact(c) {
                for (a, &v) in acc.iter_mut().zip(row) {
                    *a = combine(*a, v);
                }
            }
            acc
        })
        .collect();
    let mut total = vec![init; c];
    for p in &partials {
        for (t, &v) in total.iter_mut().zip(p) {
            *t = combine(*t, v);
        }
    }
    if op == ReduceOp::ReduceMean {
        total.iter_mut().for_each(|t| *t = t.mean_of(rows));
    }
    let mut out = vec![H::default(); c];
    H::narrow_into(&total, &mut out);
    Some(H::host(out))
}

/// How many elements each output of a reduction over `axes` combines.
pub(crate) fn reduced_count(layout: &Layout, axes: &[usize]) -> usize {
    axes.iter().map(|&a| layout.shape()[a]).product()
}

pub(crate) fn reduce(op: ReduceOp, x: Operand<'_>, axes: &[usize]) -> Result<HostData> {
    let data = host(&x)?;
    let rows = match data {
        HostData::F16(v) => reduce_half_rows(op, v, x.layout, axes),
        HostData::BF16(v) => reduce_half_rows(op, v, x.layout, axes),
        _ => None,
    };
    if let Some(out) = rows {
        return Ok(out);
    }
    let none = || unsupported("cpu", op.name(), x.dtype);
    if let Some(w) = widen(data) {
        return Ok(narrow(
            reduce_num(op, &w, x.layout, axes).ok_or_else(none)?,
            x.dtype,
        ));
    }
    Ok(match data {
        HostData::F32(v) => HostData::F32(reduce_num(op, v, x.layout, axes).ok_or_else(none)?),
        HostData::F64(v) => HostData::F64(reduce_num(op, v, x.layout, axes).ok_or_else(none)?),
        HostData::I8(v) => HostData::I8(reduce_num(op, v, x.layout, axes).ok_or_else(none)?),
        HostData::I32(v) => HostData::I32(reduce_num(op, v, x.layout, axes).ok_or_else(none)?),
        HostData::I64(v) => HostData::I64(reduce_num(op, v, x.layout, axes).ok_or_else(none)?),
        HostData::U8(v) => HostData::U8(reduce_num(op, v, x.layout, axes).ok_or_else(none)?),
        HostData::I16(v) => HostData::I16(reduce_num(op, v, x.layout, axes).ok_or_else(none)?),
        HostData::U16(v) => HostData::U16(reduce_num(op, v, x.layout, axes).ok_or_else(none)?),
        HostData::U32(v) => HostData::U32(reduce_num(op, v, x.layout, axes).ok_or_else(none)?),
        HostData::U64(v) => HostData::U64(reduce_num(op, v, x.layout, axes).ok_or_else(none)?),
        HostData::C64(v) => super::complex::reduce(op, v, x.layout, axes)?,
        HostData::C128(v) => super::complex::reduce(op, v, x.layout, axes)?,
        HostData::Bool(v) => HostData::Bool(match op {
            ReduceOp::ReduceAny => reduce_with(v, x.layout, axes, false, |a, b| a | b),
            ReduceOp::ReduceAll => reduce_with(v, x.layout, axes, true, |a, b| a & b),
            _ => return Err(none()),
        }),
        _ => return Err(none()),
    })
}

/// Index of the first maximum (or minimum) of a row; the first NaN wins outright.
///
/// One pass: each block of the row is folded to its best value (vectorised), blocks are
/// combined keeping the earliest best, then only the winning block is scanned for the index.
fn arg_row<T: Num + Sync + Send, const MAX: bool>(row: &[T]) -> i64 {
    const BLOCK: usize = 2048;
    let max = MAX;
    let pick = move |a: T, b: T| {
        let better = if MAX { a > b } else { a < b };
        if better | a.isnan() {
            a
        } else {
            b
        }
    };
    let init = if max { T::LOWEST } else { T::HIGHEST };
    let block_best = |(i, blk): (usize, &[T])| (fold(blk, init, pick), i);
    // Earliest block wins ties; a NaN beats any number.
    let combine = move |(va, ia): (T, usize), (vb, ib): (T, usize)| {
        let a_wins = match (va.isnan(), vb.isnan()) {
            (true, true) => ia < ib,
            (true, false) => true,
            (false, true) => false,
            _ => pick(va, vb) == va && (va != vb || ia < ib),
        };
        if a_wins {
            (va, ia)
        } else {
            (vb, ib)
        }
    };
    let (best, bi) = if row.len() >= PAR_THRESHOLD {
        // one part per thread (block-aligned), each folding its blocks in order
        let blocks = row.len().div_ceil(BLOCK);
        per_thread_parts(blocks, 1, (init, usize::MAX), |lo, hi| {
            (lo..hi)
                .map(|b| block_best((b, &row[b * BLOCK..((b + 1) * BLOCK).min(row.len())])))
                .fold((init, usize::MAX), combine)
        })
        .into_iter()
        .fold((init, usize::MAX), combine)
    } else {
        row.chunks(BLOCK)
            .enumerate()
            .map(block_best)
            .fold((init, usize::MAX), combine)
    };
    if bi == usize::MAX {
        return 0;
    }
    let block = &row[bi * BLOCK..(bi * BLOCK + BLOCK).min(row.len())];
    let nan = best.isnan();
    let j = block
        .iter()
        .position(|&v| if nan { v.isnan() } else { v == best })
        .unwrap_or(0);
    (bi * BLOCK + j) as i64
}

fn arg_typed<T: Num + Sync + Send>(
    op: ArgReduceOp,
    data: &[T],
    layout: &Layout,
    axis: usize,
) -> Vec<i64> {
    let rank = layout.rank();
    let mut perm: Vec<usize> = (0..rank).filter(|&a| a != axis).collect();
    perm.push(axis);
    let rows = dense(data, &layout.permute(&perm).expect("a permutation"));
    let n = layout.shape()[axis];
    let max = op == ArgReduceOp::ArgMax;
    if rows.len() < PAR_THRESHOLD || n >= 4096 {
        if max {
            rows.chunks(n).map(arg_row::<T, true>).collect()
        } else {
            rows.chunks(n).map(arg_row::<T, false>).collect()
        }
    } else {
        if max {
            rows.par_chunks(n).map(arg_row::<T, true>).collect()
        } else {
            rows.par_chunks(n).map(arg_row::<T, false>).collect()
        }
    }
}

pub(crate) fn arg_reduce(op: ArgReduceOp, x: Operand<'_>, axis: usize) -> Result<HostData> {
    let data = host(&x)?;
    if let Some(w) = widen(data) {
        return Ok(HostData::I64(arg_typed(op, &w, x.layout, axis)));
    }
    Ok(HostData::I64(match data {
        HostData::F32(v) => arg_typed(op, v, x.layout, axis),
        HostData::F64(v) => arg_typed(op, v, x.layout, axis),
        HostData::I8(v) => arg_typed(op, v, x.layout, axis),
        HostData::I32(v) => arg_typed(op, v, x.layout, axis),
        HostData::I64(v) => arg_typed(op, v, x.layout, axis),
        HostData::U8(v) => arg_typed(op, v, x.layout, axis),
        HostData::I16(v) => arg_typed(op, v, x.layout, axis),
        HostData::U16(v) => arg_typed(op, v, x.layout, axis),
        HostData::U32(v) => arg_typed(op, v, x.layout, axis),
        HostData::U64(v) => arg_typed(op, v, x.layout, axis),
        _ => return Err(unsupported("cpu", op.name(), x.dtype)),
    }))
}

#[cfg(test)]
mod tests {
    use super::*;
    use half::bf16;

    /// Reducing half-precision rows block by block gives the whole-buffer path's result
    /// (sums up to f32 rounding of a different order, before narrowing).
    #[test]
    fn half_row_reductions_match_the_widened_path() {
        for shape in [vec![3000, 5], vec![7, 9, 16], vec![2, 1]] {
            let n: usize = shape.iter().product();
            let mut vals: Vec<bf16> = (0..n)
                .map(|i| bf16::from_f32(((i * 37 % 101) as f32 - 50.0) / 16.0))
                .collect();
            if n > 10 {
                vals[7] = bf16::NAN; // a NaN in column 7 % c
            }
            let layout = Layout::contiguous(&shape);
            let axes: Vec<usize> = (0..shape.len() - 1).collect();
            let wide: Vec<f32> = vals.iter().map(|v| v.to_f32()).collect();
            for op in [
                ReduceOp::ReduceSum,
                ReduceOp::ReduceMax,
                ReduceOp::ReduceMin,
                ReduceOp::ReduceProd,
            ] {
                let got = match reduce_half_rows(op, &vals, &layout, &axes) {
                    Some(HostData::BF16(v)) => v,
                    other => panic!("{other:?}"),
                };
                let want = reduce_num(op, &wide, &layout, &axes).expect("a numeric reduction");
                for (g, w) in got.iter().zip(&want) {
                    let (g, w) = (g.to_f32(), bf16::from_f32(*w).to_f32());
                    let same = (g.is_nan() && w.is_nan())
                        || g == w
                        || (g - w).abs() <= 0.01 * w.abs().max(1.0);
                    assert!(same, "{op:?} {shape:?}: {g} vs {w}");
                }
            }
        }
    }
}
