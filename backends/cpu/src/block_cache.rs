//! Freed large host blocks, kept for the next kernel output of the same size.
//!
//! glibc serves threads other than the main one from secondary arenas made of heaps of at most
//! 64 MiB; a block that does not fit one is mapped afresh at every allocation and unmapped at
//! its free, so each use of it pays a page fault per 4 KiB. A training step run outside the
//! main thread (a spawned thread, a server's worker, a test) with activations of tens of MiB
//! paid that every step: the MNIST CNN at batch 512 took 1.55 million page faults an epoch in
//! a spawned thread against 70 thousand on the main one, 26% slower (BENCHMARKS.md, "Large
//! blocks outside the main thread"). So the backend keeps freed blocks of at least
//! [`MIN_BYTES`] itself, as TF's BFC allocator and PyTorch's caching allocator keep device
//! memory: [`CpuBuffer`](crate::CpuBuffer) hands its vector here when dropped, and a kernel
//! asks [`with_capacity`] for its output's vector.
//!
//! A request takes the smallest kept block of its alignment that holds it with at most a
//! quarter to spare. Each request first frees the blocks that went unused for
//! [`STALE_AFTER`] requests, so blocks of sizes no longer asked for (a finished `fit`'s,
//! before `evaluate` at another batch size) go back to malloc instead of adding to the
//! footprint. At most [`crate::block_cache_limit`] bytes are kept, the oldest freed first.
//!
//! On the main thread under glibc the cache stands aside: [`tune_malloc`] has the main
//! arena keep and reuse large blocks itself, across sizes, which holds less memory than
//! blocks kept by size (the main job's MNIST CNN peaked at 201 MiB resident with the main
//! arena alone, at 331 MiB with a first version of the cache beside it).

use std::alloc::Layout;
use std::collections::VecDeque;
use std::mem::{align_of, size_of, ManuallyDrop};
use std::ptr::NonNull;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Mutex, MutexGuard};

/// Blocks smaller than this go to and from malloc as they are (glibc keeps them in the
/// arena's heap and reuses them without faults).
pub(crate) const MIN_BYTES: usize = 8 << 20;

/// The most blocks kept, whatever their bytes: a request scans them all.
const MAX_BLOCKS: usize = 256;

/// A block kept while this many requests for large blocks went by without taking it is
/// stale: its size is no longer asked for (or it came from an allocation that does not ask
/// the cache), and the next request frees it. A training step makes a few such requests
/// per layer (the MNIST CNN at batch 512: about 10 a step), each size coming back every
/// step.
const STALE_AFTER: u64 = 512;

/// An allocation of the global allocator with `Layout { size: bytes, align }`, owned by the
/// cache.
struct Block {
    ptr: NonNull<u8>,
    bytes: usize,
    align: usize,
    /// [`Kept::requests`] when it was kept.
    kept_at: u64,
}

// SAFETY: a kept block is memory nothing else points to; whichever thread takes it owns it.
unsafe impl Send for Block {}

impl Block {
    /// Gives the memory back to the global allocator.
    fn free(self) {
        // SAFETY: `ptr` was allocated by the global allocator with this size and alignment
        // (`keep` reads them off the vector that owned it) and is freed once, here.
        unsafe {
            std::alloc::dealloc(
                self.ptr.as_ptr(),
                Layout::from_size_align_unchecked(self.bytes, self.align),
            )
        }
    }
}

/// The kept blocks, oldest first, and their bytes.
struct Kept {
    blocks: VecDeque<Block>,
    bytes: usize,
    /// Requests for large blocks so far: the cache's clock.
    requests: u64,
}

/// Freed blocks and the most bytes of them to keep.
struct BlockCache {
    kept: Mutex<Kept>,
    limit: AtomicUsize,
}

/// The backend's cache (1 GiB by default, [`crate::set_block_cache_limit`]).
static CACHE: BlockCache = BlockCache::new(1 << 30);

impl BlockCache {
    const fn new(limit: usize) -> BlockCache {
        BlockCache {
            kept: Mutex::new(Kept {
                blocks: VecDeque::new(),
                bytes: 0,
                requests: 0,
            }),
            limit: AtomicUsize::new(limit),
        }
    }

    fn kept(&self) -> MutexGuard<'_, Kept> {
        // The lists stay consistent if a holder panicked: every update pairs a push or pop
        // with its bytes, with nothing between them that can panic.
        self.kept.lock().unwrap_or_else(|e| e.into_inner())
    }

    fn with_capacity<T: Copy>(&self, n: usize) -> Vec<T> {
        let size = size_of::<T>();
        let need = n.saturating_mul(size);
        if size == 0 || need < MIN_BYTES || self.limit.load(Ordering::Relaxed) == 0 {
            return Vec::with_capacity(n);
        }
        let (found, evicted) = {
            let mut kept = self.kept();
            kept.requests += 1;
            // Blocks kept before the last STALE_AFTER requests: sizes no longer asked for.
            let stale = evict_while(&mut kept, |k, b| k.requests - b.kept_at > STALE_AFTER);
            let fits = |b: &Block| {
                b.align == align_of::<T>()
                    && b.bytes.is_multiple_of(size)
                    && b.bytes >= need
                    && b.bytes - need <= need / 4
            };
            let best = (kept.blocks.iter().enumerate())
                .filter(|(_, b)| fits(b))
                .min_by_key(|(_, b)| b.bytes)
                .map(|(i, _)| i);
            let found = best.and_then(|i| kept.blocks.remove(i));
            kept.bytes -= found.as_ref().map_or(0, |b| b.bytes);
            (found, stale)
        };
        evicted.into_iter().for_each(Block::free);
        match found {
            // SAFETY: the block was allocated with `Layout { size: bytes, align:
            // align_of::<T>() }` and `bytes` is a multiple of `size`: the layout of a
            // `Vec<T>` with capacity `bytes / size`, as `from_raw_parts` requires; length 0,
            // so no element is read.
            Some(block) => unsafe {
                Vec::from_raw_parts(block.ptr.as_ptr().cast::<T>(), 0, block.bytes / size)
            },
            None => Vec::with_capacity(n),
        }
    }

    fn keep<T: Copy>(&self, v: Vec<T>) {
        let bytes = v.capacity().saturating_mul(size_of::<T>());
        let limit = self.limit.load(Ordering::Relaxed);
        if size_of::<T>() == 0 || bytes < MIN_BYTES || bytes > limit {
            return;
        }
        // A vector with capacity points at its allocation whatever its length; the elements
        // are `Copy`, so there is nothing to drop.
        let ptr = NonNull::from(&mut ManuallyDrop::new(v)[..]).cast::<u8>();
        let evicted = {
            let mut kept = self.kept();
            let kept_at = kept.requests;
            kept.bytes += bytes;
            kept.blocks.push_back(Block {
                ptr,
                bytes,
                align: align_of::<T>(),
                kept_at,
            });
            evict_while(&mut kept, |k, _| {
                k.bytes > limit || k.blocks.len() > MAX_BLOCKS
            })
        };
        evicted.into_iter().for_each(Block::free);
    }

    fn set_limit(&self, bytes: usize) {
        self.limit.store(bytes, Ordering::Relaxed);
        let evicted = {
            let mut kept = self.kept();
            evict_while(&mut kept, |k, _| k.bytes > bytes)
        };
        evicted.into_iter().for_each(Block::free);
    }
}

/// Takes the oldest kept blocks out while `evict(kept, oldest)` holds, for the caller to
/// free once the lock is released.
fn evict_while(kept: &mut Kept, evict: impl Fn(&Kept, &Block) -> bool) -> Vec<Block> {
    let mut out = Vec::new();
    while kept
        .blocks
        .front()
        .is_some_and(|oldest| evict(kept, oldest))
    {
        if let Some(block) = kept.blocks.pop_front() {
            kept.bytes -= block.bytes;
            out.push(block);
        }
    }
    out
}

/// Whether glibc's main arena keeps large blocks itself ([`tune_malloc`] ran).
static MAIN_ARENA_KEEPS: std::sync::atomic::AtomicBool = std::sync::atomic::AtomicBool::new(false);

/// Raises glibc's mmap and trim thresholds to 1 GiB (unless `FERROFLOW_CPU_KEEP_MALLOC` is
/// set), so the main arena reuses large freed blocks instead of unmapping them; once per
/// process, from [`crate::register`].
pub(crate) fn tune_malloc() {
    #[cfg(all(target_os = "linux", target_env = "gnu"))]
    if std::env::var_os("FERROFLOW_CPU_KEEP_MALLOC").is_none() {
        const ONE_GIB: libc::c_int = 1 << 30;
        // SAFETY: mallopt only adjusts allocator parameters; it is thread-safe in glibc.
        let set = unsafe {
            libc::mallopt(libc::M_MMAP_THRESHOLD, ONE_GIB) == 1
                && libc::mallopt(libc::M_TRIM_THRESHOLD, ONE_GIB) == 1
        };
        MAIN_ARENA_KEEPS.store(set, Ordering::Relaxed);
    }
}

/// Whether this thread's large blocks go through the cache: every thread but the main one
/// when the main arena keeps its own.
fn serves_this_thread() -> bool {
    #[cfg(target_os = "linux")]
    {
        thread_local! {
            // SAFETY: gettid and getpid only read the calling thread's ids.
            static MAIN: bool = unsafe { libc::gettid() == libc::getpid() };
        }
        !(MAIN_ARENA_KEEPS.load(Ordering::Relaxed) && MAIN.with(|m| *m))
    }
    #[cfg(not(target_os = "linux"))]
    true
}

/// An empty vector with room for at least `n` elements: a kept block when one fits, else
/// new memory from malloc. What a kernel writes a large output into.
pub(crate) fn with_capacity<T: Copy>(n: usize) -> Vec<T> {
    if n.saturating_mul(size_of::<T>()) >= MIN_BYTES && serves_this_thread() {
        CACHE.with_capacity(n)
    } else {
        Vec::with_capacity(n)
    }
}

/// A vector of `n` copies of `value`, in a kept block when one fits.
pub(crate) fn filled<T: Copy>(n: usize, value: T) -> Vec<T> {
    let mut v = with_capacity(n);
    v.resize(n, value);
    v
}

/// Keeps a freed vector's memory for a later [`with_capacity`] when it is large enough and
/// the limit allows; otherwise frees it.
pub(crate) fn keep<T: Copy>(v: Vec<T>) {
    // Small vectors (nearly every one) are freed without looking at the thread.
    if v.capacity().saturating_mul(size_of::<T>()) >= MIN_BYTES && serves_this_thread() {
        CACHE.keep(v)
    }
}

/// Sets the most bytes kept, freeing kept blocks beyond it.
pub(crate) fn set_limit(bytes: usize) {
    CACHE.set_limit(bytes)
}

/// The most bytes kept.
pub(crate) fn limit() -> usize {
    CACHE.limit.load(Ordering::Relaxed)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn kept_bytes(cache: &BlockCache) -> usize {
        cache.kept().bytes
    }

    #[test]
    fn a_freed_block_serves_the_next_request_of_its_size_and_alignment() {
        let cache = BlockCache::new(1 << 30);
        let n = MIN_BYTES / 4; // f32 elements in the smallest block kept
        let mut v: Vec<f32> = cache.with_capacity(n);
        v.resize(n, 1.5);
        let ptr = v.as_ptr() as usize;
        cache.keep(v);
        assert_eq!(kept_bytes(&cache), MIN_BYTES);
        // Another 4-byte type with the same alignment takes the same memory.
        let w: Vec<i32> = cache.with_capacity(n);
        assert_eq!(w.as_ptr() as usize, ptr);
        assert_eq!((w.len(), w.capacity()), (0, n));
        assert_eq!(kept_bytes(&cache), 0);
        cache.keep(w);
        // A type of another alignment does not (its layout would differ).
        let d: Vec<f64> = cache.with_capacity(n / 2);
        assert_ne!(d.as_ptr() as usize, ptr);
        assert_eq!(kept_bytes(&cache), MIN_BYTES);
        // The best fit first; then one with a quarter to spare; never one with more.
        cache.keep(vec![0f32; 2 * n]);
        cache.keep(vec![0f32; n + n / 4]);
        let exact: Vec<f32> = cache.with_capacity(n);
        assert_eq!((exact.as_ptr() as usize, exact.capacity()), (ptr, n));
        let roomy: Vec<f32> = cache.with_capacity(n);
        assert_eq!(roomy.capacity(), n + n / 4);
        let fresh: Vec<f32> = cache.with_capacity(n);
        assert_eq!(fresh.capacity(), n);
        assert_eq!(kept_bytes(&cache), 8 * n, "the block twice the size stays");
    }

    #[test]
    fn small_blocks_and_a_zero_limit_keep_nothing() {
        let cache = BlockCache::new(1 << 30);
        cache.keep(vec![0u8; MIN_BYTES - 1]);
        assert_eq!(kept_bytes(&cache), 0);
        let small: Vec<u8> = cache.with_capacity(MIN_BYTES - 1);
        assert_eq!(small.capacity(), MIN_BYTES - 1);
        cache.keep(vec![0u8; MIN_BYTES]);
        assert_eq!(kept_bytes(&cache), MIN_BYTES);
        cache.set_limit(0);
        assert_eq!(
            kept_bytes(&cache),
            0,
            "setting the limit frees what is over it"
        );
        cache.keep(vec![0u8; MIN_BYTES]);
        assert_eq!(kept_bytes(&cache), 0);
    }

    #[test]
    fn the_limit_frees_the_oldest_blocks() {
        let cache = BlockCache::new(3 * MIN_BYTES);
        let blocks: Vec<Vec<u8>> = (0..4).map(|i| vec![i; MIN_BYTES]).collect();
        let addresses: Vec<usize> = blocks.iter().map(|b| b.as_ptr() as usize).collect();
        blocks.into_iter().for_each(|b| cache.keep(b));
        assert_eq!(
            kept_bytes(&cache),
            3 * MIN_BYTES,
            "the oldest block was freed"
        );
        let taken: Vec<Vec<u8>> = (0..3).map(|_| cache.with_capacity(MIN_BYTES)).collect();
        let mut got: Vec<usize> = taken.iter().map(|b| b.as_ptr() as usize).collect();
        got.sort_unstable();
        let mut want = addresses[1..].to_vec();
        want.sort_unstable();
        assert_eq!(got, want);
        // A block larger than the limit is not kept at all.
        cache.keep(vec![0u8; 4 * MIN_BYTES]);
        assert_eq!(kept_bytes(&cache), 0);
    }

    #[test]
    fn a_block_no_request_takes_is_freed_after_stale_after_requests() {
        let cache = BlockCache::new(1 << 30);
        cache.keep(vec![0u8; MIN_BYTES]);
        let other = || drop(cache.with_capacity::<u8>(2 * MIN_BYTES));
        (0..STALE_AFTER).for_each(|_| other());
        assert_eq!(kept_bytes(&cache), MIN_BYTES, "not stale yet");
        other();
        assert_eq!(kept_bytes(&cache), 0, "stale: freed by the next request");
        // A block taken and kept again starts its count afresh.
        cache.keep(vec![0u8; MIN_BYTES]);
        (0..STALE_AFTER).for_each(|_| other());
        let again: Vec<u8> = cache.with_capacity(MIN_BYTES);
        cache.keep(again);
        (0..STALE_AFTER).for_each(|_| other());
        assert_eq!(kept_bytes(&cache), MIN_BYTES);
    }

    #[test]
    fn a_dropped_output_is_the_next_outputs_memory_outside_the_main_thread(
    ) -> ferroflow_tensor::Result<()> {
        use ferroflow_tensor::{Backend, BufferBox, DType, HostData, Layout, Operand, UnaryOp};
        let in_cache = |at: usize| {
            CACHE
                .kept()
                .blocks
                .iter()
                .any(|b| b.ptr.as_ptr() as usize == at)
        };
        let run = move || -> ferroflow_tensor::Result<()> {
            // f32 elements: past the smallest block kept, a size no other test asks for.
            let n = MIN_BYTES / 4 + 12_345;
            let cpu = crate::CpuBackend;
            let input = cpu.upload(0, HostData::F32(vec![0.5; n]))?;
            let layout = Layout::contiguous(&[n]);
            let x = Operand {
                buffer: &*input,
                layout: &layout,
                dtype: DType::F32,
            };
            let address = |b: &BufferBox| match b.host_data() {
                Some(HostData::F32(v)) => v.as_ptr() as usize,
                _ => 0,
            };
            let first = cpu.unary(UnaryOp::Neg, x)?;
            let at = address(&first);
            drop(first);
            assert!(in_cache(at), "the dropped output's memory was not kept");
            let second = cpu.unary(UnaryOp::Exp, x)?;
            assert_eq!(address(&second), at);
            assert!(!in_cache(at));
            match second.host_data() {
                Some(HostData::F32(v)) => assert!(v.iter().all(|&y| y == 0.5f32.exp())),
                _ => panic!("exp of float32 gave another type"),
            }
            Ok(())
        };
        // libtest may run a test on the main thread; the cache serves the others.
        std::thread::spawn(run)
            .join()
            .unwrap_or_else(|e| std::panic::resume_unwind(e))
    }
}
