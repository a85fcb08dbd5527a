//! Slice loops compiled three times, for baseline x86-64, AVX2+FMA and AVX-512, picked at
//! run time (the binary stays portable; the hot loops still get 256- or 512-bit vectors),
//! and split across threads with rayon once a slice is large enough to pay for it.

use std::mem::MaybeUninit;

/// Below this many elements a loop runs on the calling thread.
pub(crate) const PAR_THRESHOLD: usize = 1 << 16;
/// Elements per rayon task for work that fits in cache.
const CHUNK: usize = 1 << 15;

/// Runs `f(start, part)` on contiguous parts of `out`, a few per thread, claimed as threads
/// come ([`for_each_chunk_shared`]): the calling thread starts on the first part (inputs a
/// kernel reads were usually just written by it, so that part is in its own cache), and a
/// pool worker that wakes late takes fewer parts instead of holding up the caller (measured
/// on the MNIST CNN's large elementwise ops: 6-14% more samples/s than one part per thread).
fn split_across_threads<U: Send>(out: &mut [U], f: impl Fn(usize, &mut [U]) + Sync) {
    let n = out.len();
    let part = n
        .div_ceil(4 * rayon::current_num_threads())
        .max(CHUNK.min(n))
        .max(1);
    let dst = SharedMut(out.as_mut_ptr());
    for_each_chunk_shared(n.div_ceil(part), |c| {
        let start = c * part;
        let len = part.min(n - start);
        // SAFETY: chunk c is out[start..start + len], disjoint from every other chunk's.
        f(start, unsafe {
            std::slice::from_raw_parts_mut(dst.get().add(start), len)
        })
    });
}

#[inline(always)]
fn map_loop<T: Copy, U, F: Fn(T) -> U>(x: &[T], out: &mut [MaybeUninit<U>], f: &F) {
    for (o, &v) in out.iter_mut().zip(x) {
        o.write(f(v));
    }
}

#[inline(always)]
fn zip_loop<T: Copy, U, F: Fn(T, T) -> U>(a: &[T], b: &[T], out: &mut [MaybeUninit<U>], f: &F) {
    for ((o, &x), &y) in out.iter_mut().zip(a).zip(b) {
        o.write(f(x, y));
    }
}

#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn map_loop_avx2<T: Copy, U, F: Fn(T) -> U>(x: &[T], out: &mut [MaybeUninit<U>], f: &F) {
    map_loop(x, out, f)
}

#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn zip_loop_avx2<T: Copy, U, F: Fn(T, T) -> U>(
    a: &[T],
    b: &[T],
    out: &mut [MaybeUninit<U>],
    f: &F,
) {
    zip_loop(a, b, out, f)
}

#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx512f,avx512vl,avx512dq,avx2,fma")]
unsafe fn map_loop_avx512<T: Copy, U, F: Fn(T) -> U>(x: &[T], out: &mut [MaybeUninit<U>], f: &F) {
    map_loop(x, out, f)
}

#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx512f,avx512vl,avx512dq,avx2,fma")]
unsafe fn zip_loop_avx512<T: Copy, U, F: Fn(T, T) -> U>(
    a: &[T],
    b: &[T],
    out: &mut [MaybeUninit<U>],
    f: &F,
) {
    zip_loop(a, b, out, f)
}

/// The instruction-set levels the kernels are written for, lowest first.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub(crate) enum Isa {
    Scalar,
    Avx2,
    Avx512,
}

/// The highest level this process may use: the lower of what the CPU has and what
/// `FERROFLOW_CPU_ISA` (`avx512`, `avx2` or `scalar`) allows, read once. Tests set the
/// variable to run the lower levels' code on a machine that would not pick them.
pub(crate) fn isa() -> Isa {
    static ISA: std::sync::OnceLock<Isa> = std::sync::OnceLock::new();
    *ISA.get_or_init(|| {
        let cap = match std::env::var("FERROFLOW_CPU_ISA").as_deref() {
            Ok("scalar") => Isa::Scalar,
            Ok("avx2") => Isa::Avx2,
            _ => Isa::Avx512,
        };
        detected().min(cap)
    })
}

fn detected() -> Isa {
    #[cfg(target_arch = "x86_64")]
    {
        // F16C (half-precision conversions in registers) came with or before AVX2 on every
        // x86-64 CPU that has both AVX2 and FMA; the AVX2 level asks for all three.
        let avx2 = is_x86_feature_detected!("avx2")
            && is_x86_feature_detected!("fma")
            && is_x86_feature_detected!("f16c");
        let avx512 = is_x86_feature_detected!("avx512f")
            && is_x86_feature_detected!("avx512vl")
            && is_x86_feature_detected!("avx512dq");
        match (avx2, avx512) {
            (true, true) => Isa::Avx512,
            (true, false) => Isa::Avx2,
            _ => Isa::Scalar,
        }
    }
    #[cfg(not(target_arch = "x86_64"))]
    {
        Isa::Scalar
    }
}

/// Whether the AVX-512 (F, VL, DQ) kernels run: the CPU has them and `FERROFLOW_CPU_ISA`
/// allows them.
#[inline]
pub(crate) fn has_avx512() -> bool {
    isa() >= Isa::Avx512
}

/// Whether the AVX2 + FMA kernels run (the CPU has F16C too: half-precision data
/// converts in registers, see `crate::lanes`).
#[inline]
pub(crate) fn has_avx2() -> bool {
    isa() >= Isa::Avx2
}

/// `out[i] = f(x[i])` through the widest vector loop this CPU has.
#[inline]
pub(crate) fn map_chunk<T: Copy, U, F: Fn(T) -> U>(x: &[T], out: &mut [MaybeUninit<U>], f: &F) {
    #[cfg(target_arch = "x86_64")]
    if has_avx512() {
        // SAFETY: the CPU supports the features the function was compiled for.
        return unsafe { map_loop_avx512(x, out, f) };
    }
    #[cfg(target_arch = "x86_64")]
    if has_avx2() {
        // SAFETY: the CPU supports the features the function was compiled for.
        return unsafe { map_loop_avx2(x, out, f) };
    }
    map_loop(x, out, f)
}

/// `out[i] = f(a[i], b[i])` through the widest vector loop this CPU has.
#[inline]
pub(crate) fn zip_chunk<T: Copy, U, F: Fn(T, T) -> U>(
    a: &[T],
    b: &[T],
    out: &mut [MaybeUninit<U>],
    f: &F,
) {
    #[cfg(target_arch = "x86_64")]
    if has_avx512() {
        // SAFETY: as above.
        return unsafe { zip_loop_avx512(a, b, out, f) };
    }
    #[cfg(target_arch = "x86_64")]
    if has_avx2() {
        // SAFETY: as above.
        return unsafe { zip_loop_avx2(a, b, out, f) };
    }
    zip_loop(a, b, out, f)
}

/// `f` over every element.
pub(crate) fn map<T: Copy + Sync, U: Copy + Default + Send, F: Fn(T) -> U + Sync>(
    x: &[T],
    f: F,
) -> Vec<U> {
    fill_uninit(x.len(), |out| {
        if x.len() < PAR_THRESHOLD {
            map_chunk(x, out, &f);
        } else {
            split_across_threads(out, |start, o| map_chunk(&x[start..start + o.len()], o, &f));
        }
    })
}

/// `f` over pairs of equal-length slices.
pub(crate) fn zip<T: Copy + Sync, U: Copy + Default + Send, F: Fn(T, T) -> U + Sync>(
    a: &[T],
    b: &[T],
    f: F,
) -> Vec<U> {
    debug_assert_eq!(a.len(), b.len());
    fill_uninit(a.len(), |out| {
        if a.len() < PAR_THRESHOLD {
            zip_chunk(a, b, out, &f);
        } else {
            split_across_threads(out, |start, o| {
                let end = start + o.len();
                zip_chunk(&a[start..end], &b[start..end], o, &f)
            });
        }
    })
}

/// `f(a[i], row[i % row.len()])` over every element of `a` (a bias added along the last
/// axis): whole runs of the row at a time through the vectorised pair loop, split across
/// threads, no index arithmetic per element.
pub(crate) fn zip_rows<T: Copy + Sync, U: Copy + Default + Send, F: Fn(T, T) -> U + Sync>(
    a: &[T],
    row: &[T],
    f: F,
) -> Vec<U> {
    let (n, width) = (a.len(), row.len());
    assert!(
        width > 0 && n % width == 0,
        "zip_rows: {n} elements are not rows of {width}"
    );
    let part = |start: usize, out: &mut [MaybeUninit<U>]| {
        let (mut done, mut col) = (0, start % width);
        while done < out.len() {
            let k = (width - col).min(out.len() - done);
            let at = start + done;
            zip_chunk(
                &a[at..at + k],
                &row[col..col + k],
                &mut out[done..done + k],
                &f,
            );
            done += k;
            col = 0;
        }
    };
    fill_uninit(n, |out| {
        if n < PAR_THRESHOLD {
            part(0, out);
        } else {
            split_across_threads(out, part);
        }
    })
}

/// A vector of `rows · width` elements written row by row (`row(r, out)` writes every
/// element of row `r`), groups of whole rows split across threads when it is large.
pub(crate) fn fill_rows<U: Send + Copy>(
    rows: usize,
    width: usize,
    row: impl Fn(usize, &mut [MaybeUninit<U>]) + Sync,
) -> Vec<U> {
    let n = rows * width;
    if n == 0 {
        return Vec::new();
    }
    fill_uninit(n, |out| {
        let group = |first: usize, o: &mut [MaybeUninit<U>]| {
            for (k, r) in o.chunks_mut(width).enumerate() {
                row(first + k, r);
            }
        };
        if n < PAR_THRESHOLD || rows < 2 {
            return group(0, out);
        }
        let per = rows.div_ceil(4 * rayon::current_num_threads()).max(1);
        let dst = SharedMut(out.as_mut_ptr());
        for_each_chunk_shared(rows.div_ceil(per), |c| {
            let first = c * per;
            let count = per.min(rows - first);
            // SAFETY: group c is rows first..first + count, disjoint from every other group's.
            group(first, unsafe {
                std::slice::from_raw_parts_mut(dst.get().add(first * width), count * width)
            })
        });
    })
}

/// A vector of `n` elements, every one written by `fill` before it is exposed. Skipping the
/// zeroing pass matters: for an elementwise op it is a third of the memory traffic.
fn fill_uninit<U: Copy>(n: usize, fill: impl FnOnce(&mut [MaybeUninit<U>])) -> Vec<U> {
    let mut out: Vec<U> = crate::block_cache::with_capacity(n);
    fill(&mut out.spare_capacity_mut()[..n]);
    // SAFETY: callers write every element of the slice (map/zip write one output per input,
    // and the input lengths equal n).
    unsafe { out.set_len(n) };
    out
}

/// Folds a slice with `LANES` independent accumulators (vectorisable, and more accurate for
/// float sums than one running total), then combines the lanes.
#[inline(always)]
fn fold_lanes<T: Copy, const LANES: usize>(x: &[T], init: T, f: &impl Fn(T, T) -> T) -> T {
    let mut acc = [init; LANES];
    let chunks = x.chunks_exact(LANES);
    let rest = chunks.remainder();
    for c in chunks {
        for i in 0..LANES {
            acc[i] = f(acc[i], c[i]);
        }
    }
    let mut r = init;
    for &a in acc.iter() {
        r = f(r, a);
    }
    for &v in rest {
        r = f(r, v);
    }
    r
}

#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn fold_lanes_avx2<T: Copy, const LANES: usize>(
    x: &[T],
    init: T,
    f: &impl Fn(T, T) -> T,
) -> T {
    fold_lanes::<T, LANES>(x, init, f)
}

#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx512f,avx512vl,avx512dq,avx2,fma")]
unsafe fn fold_lanes_avx512<T: Copy, const LANES: usize>(
    x: &[T],
    init: T,
    f: &impl Fn(T, T) -> T,
) -> T {
    fold_lanes::<T, LANES>(x, init, f)
}

/// `f(lo, hi)` over one range of `0..n` per thread (at least `min_part` long), results in
/// range order. The ranges are claimed through [`for_each_chunk_shared`], so the caller
/// computes any range a sleeping pool thread has not taken yet instead of waiting for it.
pub(crate) fn per_thread_parts<R: Send + Clone>(
    n: usize,
    min_part: usize,
    init: R,
    f: impl Fn(usize, usize) -> R + Sync,
) -> Vec<R> {
    let threads = rayon::current_num_threads().max(1);
    let part = n.div_ceil(threads).max(min_part).max(1);
    let parts = n.div_ceil(part).max(1);
    let mut out = vec![init; parts];
    let slots = SharedMut(out.as_mut_ptr());
    for_each_chunk_shared(parts, |i| {
        let (lo, hi) = ((i * part).min(n), ((i + 1) * part).min(n));
        // SAFETY: slot i (initialised) is written only by the one call that claimed i,
        // and `out` outlives `for_each_chunk_shared`.
        unsafe { *slots.get().add(i) = f(lo, hi) };
    });
    out
}

/// A pointer to an output shared with the pool's threads, each writing a disjoint part.
#[derive(Clone, Copy)]
pub(crate) struct SharedMut<T>(pub *mut T);
// SAFETY: users hand threads disjoint parts of the pointee (their own obligation).
unsafe impl<T> Send for SharedMut<T> {}
unsafe impl<T> Sync for SharedMut<T> {}

impl<T> SharedMut<T> {
    /// The pointer (a method, so closures capture the `Sync` wrapper, not the raw field).
    pub(crate) fn get(&self) -> *mut T {
        self.0
    }
}

/// Runs `f(c)` for every `c` in `0..chunks` on the calling thread and whichever pool
/// threads join in time. Chunks are claimed one at a time from a shared counter, so the
/// caller never waits for a pool thread that has not woken yet, only for chunks already
/// running: a pool worker asleep after a run of small single-threaded ops wakes tens of
/// microseconds late, and a fork-join waiting for it pays that (measured: a 2-MFLOP product took
/// 35 µs on two threads, 22 µs on one).
#[inline]
pub(crate) fn for_each_chunk_shared(chunks: usize, f: impl Fn(usize) + Sync) {
    chunks_shared(chunks, &f)
}

/// [`for_each_chunk_shared`] through one non-generic body: generic, its claiming and
/// rayon's spawning were compiled once per kernel closure (1551 copies, a third of the CPU
/// backend's LLVM IR; the crate compiles in two thirds of the time without them). Chunks
/// are a few per thread, so calling the task through a pointer costs nothing measurable.
fn chunks_shared(chunks: usize, f: &(dyn Fn(usize) + Sync)) {
    use std::sync::atomic::{AtomicUsize, Ordering};
    use std::sync::Arc;
    let helpers = rayon::current_num_threads()
        .saturating_sub(1)
        .min(chunks.saturating_sub(1));
    if helpers == 0 {
        (0..chunks).for_each(f);
        return;
    }
    struct Shared {
        next: AtomicUsize,
        done: AtomicUsize,
        chunks: usize,
        task: *const (dyn Fn(usize) + Sync),
    }
    // SAFETY: `task` is only called for a claimed chunk, and the caller does not return
    // before every claimed chunk is done (below), so the closure outlives every call.
    unsafe impl Send for Shared {}
    unsafe impl Sync for Shared {}
    impl Shared {
        fn work(&self) {
            /// Counts a chunk as done even if its task unwinds.
            struct Done<'a>(&'a AtomicUsize);
            impl Drop for Done<'_> {
                fn drop(&mut self) {
                    self.0.fetch_add(1, Ordering::Release);
                }
            }
            loop {
                let c = self.next.fetch_add(1, Ordering::AcqRel);
                if c >= self.chunks {
                    return;
                }
                let _done = Done(&self.done);
                // SAFETY: see the `Send`/`Sync` impls.
                unsafe { (*self.task)(c) };
            }
        }
    }
    // SAFETY: erases the closure's lifetime; `Shared::work` only calls it while this
    // function is still waiting below.
    let task: *const (dyn Fn(usize) + Sync + 'static) = unsafe { std::mem::transmute(f) };
    let shared = Arc::new(Shared {
        next: AtomicUsize::new(0),
        done: AtomicUsize::new(0),
        chunks,
        task,
    });
    for _ in 0..helpers {
        let s = Arc::clone(&shared);
        rayon::spawn(move || s.work());
    }
    shared.work();
    let mut spins = 0u32;
    while shared.done.load(Ordering::Acquire) < chunks {
        if spins < 1 << 12 {
            std::hint::spin_loop();
            spins += 1;
        } else {
            std::thread::yield_now();
        }
    }
}

/// `Σ a[i]·b[i]` over equal-length slices, in independent lanes (vectorised; fused
/// multiply-adds in the AVX2+FMA and AVX-512 variants), split across threads for long inputs.
pub(crate) fn dot<T>(a: &[T], b: &[T], zero: T) -> T
where
    T: Copy
        + Send
        + Sync
        + num_traits::MulAdd<Output = T>
        + std::ops::Add<Output = T>
        + std::ops::Mul<Output = T>,
{
    debug_assert_eq!(a.len(), b.len());
    #[inline(always)]
    fn lanes<T, const FMA: bool>(a: &[T], b: &[T], zero: T) -> T
    where
        T: Copy
            + num_traits::MulAdd<Output = T>
            + std::ops::Add<Output = T>
            + std::ops::Mul<Output = T>,
    {
        const L: usize = 32;
        // peel to a 64-byte boundary of `a`: whole-cache-line vector loads
        let head = a.as_ptr().align_offset(64).min(a.len());
        let mut s0 = zero;
        for i in 0..head {
            s0 = s0 + a[i] * b[i];
        }
        let (a, b) = (&a[head..], &b[head..]);
        let mut acc = [zero; L];
        let n = a.len() / L * L;
        for (x, y) in a[..n].chunks_exact(L).zip(b[..n].chunks_exact(L)) {
            for i in 0..L {
                // without FMA hardware `mul_add` is a library call: multiply, then add
                acc[i] = if FMA {
                    x[i].mul_add(y[i], acc[i])
                } else {
                    acc[i] + x[i] * y[i]
                };
            }
        }
        let mut s = s0;
        for v in acc {
            s = s + v;
        }
        for i in n..a.len() {
            s = s + a[i] * b[i];
        }
        s
    }
    #[cfg(target_arch = "x86_64")]
    #[target_feature(enable = "avx2,fma,f16c")]
    unsafe fn lanes_avx2<T>(a: &[T], b: &[T], zero: T) -> T
    where
        T: Copy
            + num_traits::MulAdd<Output = T>
            + std::ops::Add<Output = T>
            + std::ops::Mul<Output = T>,
    {
        lanes::<T, true>(a, b, zero)
    }
    #[cfg(target_arch = "x86_64")]
    #[target_feature(enable = "avx512f,avx512vl,avx512dq,avx2,fma")]
    unsafe fn lanes_avx512<T>(a: &[T], b: &[T], zero: T) -> T
    where
        T: Copy
            + num_traits::MulAdd<Output = T>
            + std::ops::Add<Output = T>
            + std::ops::Mul<Output = T>,
    {
        lanes::<T, true>(a, b, zero)
    }
    let run = |x: &[T], y: &[T]| -> T {
        #[cfg(target_arch = "x86_64")]
        if has_avx512() {
            // SAFETY: feature checked.
            return unsafe { lanes_avx512(x, y, zero) };
        }
        #[cfg(target_arch = "x86_64")]
        if has_avx2() {
            // SAFETY: feature checked.
            return unsafe { lanes_avx2(x, y, zero) };
        }
        lanes::<T, false>(x, y, zero)
    };
    if a.len() < PAR_THRESHOLD {
        run(a, b)
    } else {
        per_thread_parts(a.len(), CHUNK, zero, |lo, hi| run(&a[lo..hi], &b[lo..hi]))
            .into_iter()
            .fold(zero, |p, q| p + q)
    }
}

/// `dst[i] = f(dst[i], src[i])`, vectorised (one row of a column-wise reduction).
pub(crate) fn combine_into<T: Copy, F: Fn(T, T) -> T>(dst: &mut [T], src: &[T], f: &F) {
    #[inline(always)]
    fn combine_loop<T: Copy, F: Fn(T, T) -> T>(dst: &mut [T], src: &[T], f: &F) {
        for (d, &v) in dst.iter_mut().zip(src) {
            *d = f(*d, v);
        }
    }
    #[cfg(target_arch = "x86_64")]
    #[target_feature(enable = "avx2,fma,f16c")]
    unsafe fn combine_avx2<T: Copy, F: Fn(T, T) -> T>(dst: &mut [T], src: &[T], f: &F) {
        combine_loop(dst, src, f)
    }
    #[cfg(target_arch = "x86_64")]
    #[target_feature(enable = "avx512f,avx512vl,avx512dq,avx2,fma")]
    unsafe fn combine_avx512<T: Copy, F: Fn(T, T) -> T>(dst: &mut [T], src: &[T], f: &F) {
        combine_loop(dst, src, f)
    }
    #[cfg(target_arch = "x86_64")]
    if has_avx512() {
        // SAFETY: feature checked.
        return unsafe { combine_avx512(dst, src, f) };
    }
    #[cfg(target_arch = "x86_64")]
    if has_avx2() {
        // SAFETY: feature checked.
        return unsafe { combine_avx2(dst, src, f) };
    }
    combine_loop(dst, src, f)
}

/// Folds one slice (`f` must be associative; `init` its identity), threaded when large.
pub(crate) fn fold<T: Copy + Send + Sync, F: Fn(T, T) -> T + Sync>(x: &[T], init: T, f: F) -> T {
    let run = |c: &[T]| -> T {
        #[cfg(target_arch = "x86_64")]
        if has_avx512() {
            // SAFETY: feature checked.
            return unsafe { fold_lanes_avx512::<T, 32>(c, init, &f) };
        }
        #[cfg(target_arch = "x86_64")]
        if has_avx2() {
            // SAFETY: feature checked.
            return unsafe { fold_lanes_avx2::<T, 32>(c, init, &f) };
        }
        fold_lanes::<T, 32>(c, init, &f)
    };
    if x.len() < PAR_THRESHOLD {
        run(x)
    } else {
        per_thread_parts(x.len(), CHUNK, init, |lo, hi| run(&x[lo..hi]))
            .into_iter()
            .fold(init, &f)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn zip_rows_pairs_every_element_with_its_column_across_thread_parts() {
        // 13 columns, enough rows to split across threads at a boundary inside a row.
        for rows in [1usize, 5, 10_007] {
            let width = 13;
            let a: Vec<f32> = (0..rows * width).map(|i| i as f32).collect();
            let row: Vec<f32> = (0..width).map(|j| 1000.0 * j as f32).collect();
            let got = zip_rows(&a, &row, |x, y| x + y);
            for (i, g) in got.iter().enumerate() {
                assert_eq!(*g, a[i] + row[i % width], "element {i} of {rows} rows");
            }
        }
    }

    #[test]
    fn chunks_shared_with_the_pool_run_each_chunk_once() {
        use std::sync::atomic::{AtomicUsize, Ordering};
        for chunks in [0usize, 1, 2, 7, 64] {
            let counts: Vec<AtomicUsize> = (0..chunks).map(|_| AtomicUsize::new(0)).collect();
            for_each_chunk_shared(chunks, |c| {
                counts[c].fetch_add(1, Ordering::Relaxed);
            });
            assert!(
                counts.iter().all(|c| c.load(Ordering::Relaxed) == 1),
                "{chunks} chunks"
            );
        }
    }
}
