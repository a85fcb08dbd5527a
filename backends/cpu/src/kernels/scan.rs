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

/// Running sums and products of complex numbers.
fn scan_complex<P: super::complex::Part>(
    v: &[num_complex::Complex<P>],
    layout: &Layout,
    axis: usize,
    prod: bool,
    exclusive: bool,
    reverse: bool,
) -> Vec<num_complex::Complex<P>>
where
    num_complex::Complex<P>: Element,
{
    use num_traits::{One, Zero};
    if prod {
        let one = num_complex::Complex::one();
        scan_with(v, layout, axis, exclusive, reverse, one, |a, b| a * b)
    } else {
        let zero = num_complex::Complex::zero();
        scan_with(v, layout, axis, exclusive, reverse, zero, |a, b| a + b)
    }
}

fn scan_with<T: Element, F: Fn(T, T) -> T + Sync + Copy>(
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
    let prod = op == CumulativeOp::Cumprod;
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
        HostData::I16(v) => HostData::I16(scan_typed(v, l, axis, prod, exclusive, reverse)),
        HostData::U16(v) => HostData::U16(scan_typed(v, l, axis, prod, exclusive, reverse)),
        HostData::U32(v) => HostData::U32(scan_typed(v, l, axis, prod, exclusive, reverse)),
        HostData::U64(v) => HostData::U64(scan_typed(v, l, axis, prod, exclusive, reverse)),
        HostData::C64(v) => HostData::C64(scan_complex(v, l, axis, prod, exclusive, reverse)),
        HostData::C128(v) => HostData::C128(scan_complex(v, l, axis, prod, exclusive, reverse)),
        _ => return Err(unsupported("cpu", op.name(), x.dtype)),
    })
}

/// An unsigned key whose order is the sort order: numbers ascending, -0.0 equal to 0.0, NaN
/// above everything (all NaNs equal).
trait SortKey: Element {
    fn key(self) -> u64;
}

impl SortKey for f64 {
    #[inline(always)]
    fn key(self) -> u64 {
        const SIGN: u64 = 1 << 63;
        let bits = self.to_bits();
        if self.is_nan() {
            u64::MAX
        } else if self == 0.0 {
            SIGN
        } else if bits & SIGN != 0 {
            !bits
        } else {
            bits | SIGN
        }
    }
}
impl SortKey for f32 {
    #[inline(always)]
    fn key(self) -> u64 {
        // exact in f64, which orders the same
        (self as f64).key()
    }
}
impl SortKey for half::f16 {
    #[inline(always)]
    fn key(self) -> u64 {
        self.to_f32().key()
    }
}
impl SortKey for half::bf16 {
    #[inline(always)]
    fn key(self) -> u64 {
        self.to_f32().key()
    }
}
macro_rules! int_key {
    ($($t:ty),*) => {$(
        impl SortKey for $t {
            #[inline(always)]
            fn key(self) -> u64 {
                (self as i64 as u64) ^ (1 << 63)
            }
        }
    )*};
}
int_key!(i8, i16, i32, i64);
macro_rules! uint_key {
    ($($t:ty),*) => {$(
        impl SortKey for $t {
            #[inline(always)]
            fn key(self) -> u64 {
                self as u64
            }
        }
    )*};
}
uint_key!(u8, u16, u32, u64);

/// Stable LSD radix sort of (key, index) pairs by key, `BITS` bits per pass (16 for long
/// lanes, 8 for short ones, so the histogram stays small beside the data); passes where
/// every key has the same digit are skipped.
fn radix_sort<const BITS: u32>(pairs: &mut Vec<(u64, u32)>) {
    let buckets = 1usize << BITS;
    let mask = (buckets - 1) as u64;
    let passes = (64 / BITS) as usize;
    let n = pairs.len();
    // every pass's histogram in one read of the keys
    let mut counts = vec![0usize; buckets * passes];
    for &(k, _) in pairs.iter() {
        for p in 0..passes {
            counts[p * buckets + ((k >> (p as u32 * BITS)) & mask) as usize] += 1;
        }
    }
    let mut tmp = vec![(0u64, 0u32); n];
    for p in 0..passes {
        let c = &mut counts[p * buckets..(p + 1) * buckets];
        if c.contains(&n) {
            continue;
        }
        let mut sum = 0;
        for v in c.iter_mut() {
            let here = *v;
            *v = sum;
            sum += here;
        }
        let shift = p as u32 * BITS;
        for &pair in pairs.iter() {
            let d = ((pair.0 >> shift) & mask) as usize;
            // c[d] < n: it starts at the count of smaller digits and rises once per key
            // with digit d
            tmp[c[d]] = pair;
            c[d] += 1;
        }
        std::mem::swap(pairs, &mut tmp);
    }
}

/// Sorts one lane: the permutation, stable (equal keys keep index order). Descending uses
/// the complemented key, so NaN comes first there (it is the largest value).
fn sort_lane<T: SortKey>(
    lane: impl Iterator<Item = T>,
    n: usize,
    descending: bool,
) -> Vec<(u64, u32)> {
    let flip = if descending { u64::MAX } else { 0 };
    let mut pairs: Vec<(u64, u32)> = lane
        .enumerate()
        .map(|(i, v)| (v.key() ^ flip, i as u32))
        .collect();
    if n >= 1 << 14 {
        radix_sort::<16>(&mut pairs);
    } else if n >= 256 {
        radix_sort::<8>(&mut pairs);
    } else {
        // (key, index) pairs are distinct: an unstable sort of them is a stable sort by key
        pairs.sort_unstable();
    }
    pairs
}

fn sort_typed<T: SortKey>(
    v: &[T],
    layout: &Layout,
    axis: usize,
    descending: bool,
) -> (Vec<T>, Vec<i32>) {
    let x = dense(v, layout);
    let (outer, n, inner) = split_at_axis(layout.shape(), axis);
    let mut vals = crate::block_cache::filled(x.len(), T::default());
    let mut idxs = crate::block_cache::filled(x.len(), 0i32);
    if inner == 1 && n > 0 {
        // contiguous lanes, sorted in parallel
        vals.par_chunks_mut(n)
            .zip(idxs.par_chunks_mut(n))
            .zip(x.par_chunks(n))
            .for_each(|((vo, io), row)| {
                for (i, (_, p)) in sort_lane(row.iter().copied(), n, descending)
                    .into_iter()
                    .enumerate()
                {
                    vo[i] = row[p as usize];
                    io[i] = p as i32;
                }
            });
        return (vals, idxs);
    }
    for o in 0..outer {
        for j in 0..inner {
            let at = |i: usize| o * n * inner + i * inner + j;
            let perm = sort_lane((0..n).map(|i| x[at(i)]), n, descending);
            for (i, (_, p)) in perm.into_iter().enumerate() {
                vals[at(i)] = x[at(p as usize)];
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
        HostData::I16(v) => go!(v),
        HostData::U16(v) => go!(v),
        HostData::U32(v) => go!(v),
        HostData::U64(v) => go!(v),
        HostData::Bool(_) | HostData::C64(_) | HostData::C128(_) => {
            return Err(unsupported("cpu", "sort", x.dtype))
        }
    })
}
