//! cumsum/cumprod and the stable sort with indices.

use crate::buffer::{dense, host, narrow, split_at_axis, widen};
use crate::num::Num;
use ferroflow_tensor::{
    backend::unsupported, CumulativeOp, Element, HostData, Layout, Operand, Result,
};
use rayon::prelude::*;

fn scan_typed<T: Num + Send + Sync>(
    v: &[T],
    layout: &Layout,
    axis: usize,
    prod: bool,
    exclusive: bool,
    reverse: bool,
) -> Vec<T> {
    // Two monomorphic instances so the combine step inlines into the loops.
    if prod {
        scan_with(v, layout, axis, exclusive, reverse, T::ONE, |a: T, b: T| {
            a.wmul(b)
        })
    } else {
        scan_with(
            v,
            layout,
            axis,
            exclusive,
            reverse,
            T::ZERO,
            |a: T, b: T| a.wadd(b),
        )
    }
}

fn scan_with<T: Num + Send + Sync, F: Fn(T, T) -> T + Sync + Copy>(
    v: &[T],
    layout: &Layout,
    axis: usize,
    exclusive: bool,
    reverse: bool,
    init: T,
    f: F,
) -> Vec<T> {
    let x = dense(v, layout);
    let (outer, n, inner) = split_at_axis(layout.shape(), axis);
    let mut out = crate::buffer::zeroed(x.len());
    if x.is_empty() {
        return out;
    }
    if inner == 1 {
        // One lane per row: a plain running total, no per-step slicing.
        let rows = |src: &[T], dst: &mut [T]| {
            let mut acc = init;
            let mut step = |i: usize| {
                if exclusive {
                    dst[i] = acc;
                    acc = f(acc, src[i]);
                } else {
                    acc = f(acc, src[i]);
                    dst[i] = acc;
                }
            };
            if reverse {
                (0..n).rev().for_each(&mut step);
            } else {
                (0..n).for_each(&mut step);
            }
        };
        out.chunks_mut(n)
            .zip(x.chunks(n))
            .for_each(|(d, s)| rows(s, d));
        return out;
    }
    let block = n * inner;
    let scan_block = |src: &[T], dst: &mut [T]| {
        // Walk the axis row by row; each step is a vectorised pass over `inner` lanes.
        let mut acc = vec![init; inner];
        for s in 0..n {
            let i = if reverse { n - 1 - s } else { s };
            let row = &src[i * inner..(i + 1) * inner];
            let d = &mut dst[i * inner..(i + 1) * inner];
            if exclusive {
                d.copy_from_slice(&acc);
                for (a, &r) in acc.iter_mut().zip(row) {
                    *a = f(*a, r);
                }
            } else {
                for ((a, &r), o) in acc.iter_mut().zip(row).zip(d.iter_mut()) {
                    *a = f(*a, r);
                    *o = *a;
                }
            }
        }
    };
    if outer > 1 && x.len() >= crate::simd::PAR_THRESHOLD {
        out.par_chunks_mut(block)
            .zip(x.par_chunks(block))
            .for_each(|(d, s)| scan_block(s, d));
    } else {
        out.chunks_mut(block)
            .zip(x.chunks(block))
            .for_each(|(d, s)| scan_block(s, d));
    }
    out
}

pub(crate) fn cumulative(
    op: CumulativeOp,
    x: Operand<'_>,
    axis: usize,
    exclusive: bool,
    reverse: bool,
) -> Result<HostData> {
    let prod = op == CumulativeOp::Prod;
    let data = host(&x)?;
    let l = x.layout;
    if let Some(w) = widen(data) {
        return Ok(narrow(
            scan_typed(&w, l, axis, prod, exclusive, reverse),
            x.dtype,
        ));
    }
    Ok(match data {
        HostData::F32(v) => HostData::F32(scan_typed(v, l, axis, prod, exclusive, reverse)),
        HostData::F64(v) => HostData::F64(scan_typed(v, l, axis, prod, exclusive, reverse)),
        HostData::I8(v) => HostData::I8(scan_typed(v, l, axis, prod, exclusive, reverse)),
        HostData::I32(v) => HostData::I32(scan_typed(v, l, axis, prod, exclusive, reverse)),
        HostData::I64(v) => HostData::I64(scan_typed(v, l, axis, prod, exclusive, reverse)),
        HostData::U8(v) => HostData::U8(scan_typed(v, l, axis, prod, exclusive, reverse)),
        _ => return Err(unsupported("cpu", op.name(), x.dtype)),
    })
}

/// Total order with NaN above everything (and equal to itself).
#[inline]
fn cmp_nan_last<T: Element>(a: &T, b: &T) -> std::cmp::Ordering {
    use std::cmp::Ordering::*;
    match a.partial_cmp(b) {
        Some(o) => o,
        None => match (a.partial_cmp(a).is_none(), b.partial_cmp(b).is_none()) {
            (true, true) => Equal,
            (true, false) => Greater,
            _ => Less,
        },
    }
}

fn sort_typed<T: Element>(
    v: &[T],
    layout: &Layout,
    axis: usize,
    descending: bool,
) -> (Vec<T>, Vec<i32>) {
    let x = dense(v, layout);
    let (outer, n, inner) = split_at_axis(layout.shape(), axis);
    let mut vals = vec![T::default(); x.len()];
    let mut idxs = vec![0i32; x.len()];
    let mut perm: Vec<usize> = Vec::with_capacity(n);
    for o in 0..outer {
        for j in 0..inner {
            let at = |i: usize| o * n * inner + i * inner + j;
            perm.clear();
            perm.extend(0..n);
            // Stable: equal keys keep index order in both directions.
            if descending {
                perm.sort_by(|&p, &q| cmp_nan_last(&x[at(q)], &x[at(p)]));
            } else {
                perm.sort_by(|&p, &q| cmp_nan_last(&x[at(p)], &x[at(q)]));
            }
            for (i, &p) in perm.iter().enumerate() {
                vals[at(i)] = x[at(p)];
                idxs[at(i)] = p as i32;
            }
        }
    }
    (vals, idxs)
}

pub(crate) fn sort(x: Operand<'_>, axis: usize, descending: bool) -> Result<(HostData, HostData)> {
    let data = host(&x)?;
    macro_rules! go {
        ($v:expr) => {{
            let (a, b) = sort_typed($v, x.layout, axis, descending);
            (Element::into_host(a), HostData::I32(b))
        }};
    }
    Ok(match data {
        HostData::F16(v) => go!(v),
        HostData::BF16(v) => go!(v),
        HostData::F32(v) => go!(v),
        HostData::F64(v) => go!(v),
        HostData::I8(v) => go!(v),
        HostData::I32(v) => go!(v),
        HostData::I64(v) => go!(v),
        HostData::U8(v) => go!(v),
        HostData::Bool(_) => return Err(unsupported("cpu", "sort", x.dtype)),
    })
}
