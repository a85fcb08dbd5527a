//! float32 matrix products on AVX-512 and AVX2 for the shapes training produces: one side a batch
//! (32 to a few hundred rows) or a short inner dimension (a weight gradient, K = batch).
//!
//! `gemm`'s kernels run such thin products at single-core peak but pack a whole operand
//! up front, transpose-read a transposed right operand slowly (32x128 · (256x128)ᵀ: 72 µs
//! for 2 MFLOP) and split work across threads by rows only. Here:
//!
//! - the left operand is read in place (any strides) and broadcast one element at a time;
//! - the right operand is copied in blocks of up to [`KC`] x [`NC`] (L2-resident), as
//!   panels of [`NR`] columns, just before the [`MR`]-row tiles that use it, so only the
//!   part in use is packed; a row-major right operand with a single row tile is read in
//!   place;
//! - an `MR x NR` tile of accumulators (16 zmm) advances one step of `k` with two loads,
//!   eight broadcasts and sixteen fused multiply-adds; edges use masked loads and stores;
//! - threads split the longer side of the output into chunks they claim as they come
//!   ([`crate::simd::for_each_chunk_shared`]).
//!
//! Chosen at run time on CPUs with AVX-512 ([`crate::simd::has_avx512`]) and, with the
//! same blocking and packing, on CPUs with AVX2 + FMA only (tiles of 6 rows by [`NR`]
//! columns, run as two `6 x 16` register blocks of twelve ymm accumulators:
//! [`Tile::run_rows_avx2`]; packing with 8x8 transposes); elsewhere the products go to
//! `gemm` as before.

use super::matmul::StridedMatrix;
use crate::lanes::Lanes;
use crate::simd::Isa;

/// Rows of a register tile.
pub(super) const MR: usize = 8;
/// Rows of a register tile with AVX2 (twelve ymm accumulators: 6 rows by 16 columns, each
/// half of the tile's [`NR`] columns in turn).
const AVX2_ROWS: usize = 6;
/// Columns of a register tile (two zmm registers of f32).
pub(super) const NR: usize = 32;
/// Steps of `k` per packed block of the right operand (at most; blocks are equal).
const KC: usize = 512;
/// Columns per packed block of the right operand (`KC x NC` f32 = 512 KB, L2-resident).
const NC: usize = 256;
/// Below this many multiply-adds a product runs on the calling thread.
const PAR_MACS: usize = 1 << 19;
/// Fewest rows a chunk of a row split may have: each chunk packs the whole right operand
/// (a float copied per `rows` multiply-adds), so short chunks split by columns instead
/// (128x1600 · 1600x128, a CNN's first Dense layer: 16-row chunks packed 819 KB each).
const MIN_ROWS_PER_PACK: usize = 64;
/// Chunks of the output per thread, claimed dynamically (a late pool thread takes fewer).
const CHUNKS_PER_THREAD: usize = 4;

/// Element types with a native kernel here; `gemm_into` asks before calling `gemm`.
pub(crate) trait NativeGemm: Sized {
    /// `dst (m x n, dense row-major) = [dst +] lhs · rhs` when a native kernel takes this
    /// product (returns true), or nothing (false).
    fn native_gemm(
        _dst: &mut [Self],
        _dims: (usize, usize, usize),
        _lhs: StridedMatrix<'_, Self>,
        _rhs: StridedMatrix<'_, Self>,
        _accumulate: bool,
    ) -> bool {
        false
    }
}

impl NativeGemm for f64 {}
impl NativeGemm for ferroflow_tensor::Complex32 {}
impl NativeGemm for ferroflow_tensor::Complex64 {}
impl NativeGemm for half::f16 {}

impl NativeGemm for f32 {
    fn native_gemm(
        dst: &mut [f32],
        (m, n, k): (usize, usize, usize),
        lhs: StridedMatrix<'_, f32>,
        rhs: StridedMatrix<'_, f32>,
        accumulate: bool,
    ) -> bool {
        let Some(isa) = native_isa().filter(|_| suits(m, n, k)) else {
            return false;
        };
        assert!(
            dst.len() >= m * n && lhs.fits(m, k) && rhs.fits(k, n),
            "native_gemm: operands out of bounds"
        );
        // SAFETY: `native_isa` checked the instruction set; the assert keeps every access
        // in bounds, and dst holds initialised values (read only when accumulating).
        unsafe { gemm_f32(isa, dst.as_mut_ptr(), m, n, k, lhs, rhs, accumulate) };
        true
    }
}

/// The instruction set this kernel runs with here: AVX-512 where the CPU has it (and
/// `FERROFLOW_CPU_ISA` allows it), else AVX2 + FMA, else none (`gemm` takes every product).
pub(crate) fn native_isa() -> Option<Isa> {
    match crate::simd::isa() {
        Isa::Scalar => None,
        isa => Some(isa),
    }
}

/// Whether this kernel takes an `m x k · k x n` product (where [`native_isa`] has one):
/// the product thin, a batch of rows (m ≤ 256) or a short inner dimension (k ≤ 256, weight
/// gradients). Measured against `gemm` on two cores with AVX-512: 1.0-1.3x on MLP shapes
/// (batch 32 and 128), 1.5x with k = 9; `gemm`'s blocking wins on tall products with long
/// rows (25088x288 · 288x64, an im2col convolution: 0.8x) and on large square ones, so
/// those stay with it. With AVX2 only: see BENCHMARKS.md (thirty-fourth session).
fn suits(m: usize, n: usize, k: usize) -> bool {
    m > 0 && n > 0 && m.min(k) <= 256
}

/// `dst = [dst +] lhs · rhs` with `dst` dense row-major (`m x n`), split across threads,
/// with the kernels of `isa` (AVX-512 or AVX2).
///
/// # Safety
/// The CPU has `isa` (AVX-512F; AVX2 and FMA); `dst` is valid for `m * n` writes (and
/// reads of initialised values when `accumulate`); both operands fit their slices.
#[allow(clippy::too_many_arguments)]
pub(crate) unsafe fn gemm_f32(
    isa: Isa,
    dst: *mut f32,
    m: usize,
    n: usize,
    k: usize,
    lhs: StridedMatrix<'_, f32>,
    rhs: StridedMatrix<'_, f32>,
    accumulate: bool,
) {
    if m == 0 || n == 0 {
        return;
    }
    if k == 0 {
        if !accumulate {
            std::ptr::write_bytes(dst, 0, m * n);
        }
        return;
    }
    let threads = rayon::current_num_threads();
    let out = crate::simd::SharedMut(dst);
    let avx512 = isa >= Isa::Avx512;
    let run = |rows: (usize, usize), cols: (usize, usize)| {
        let (lhs, rhs) = (&lhs, &rhs);
        // SAFETY: the caller's guarantees, for a sub-block of the output.
        unsafe {
            if avx512 {
                block_avx512(out.get(), n, rows, cols, k, lhs, rhs, accumulate)
            } else {
                block_avx2(out.get(), n, rows, cols, k, lhs, rhs, accumulate)
            }
        }
    };
    if threads < 2 || m * n * k < PAR_MACS {
        run((0, m), (0, n));
    } else if m >= n && (m.div_ceil(CHUNKS_PER_THREAD * threads) >= MIN_ROWS_PER_PACK || n < 2 * NR)
    {
        // Row tiles; every chunk packs the (short) right operand again.
        let tile_rows = if avx512 { MR } else { AVX2_ROWS };
        let rows = (m.div_ceil(CHUNKS_PER_THREAD * threads)).next_multiple_of(tile_rows);
        crate::simd::for_each_chunk_shared(m.div_ceil(rows), |c| {
            run((c * rows, ((c + 1) * rows).min(m)), (0, n))
        });
    } else {
        // Column panels: each chunk packs only its own columns of the right operand.
        let cols = (n.div_ceil(CHUNKS_PER_THREAD * threads)).next_multiple_of(NR);
        crate::simd::for_each_chunk_shared(n.div_ceil(cols), |c| {
            run((0, m), (c * cols, ((c + 1) * cols).min(n)))
        });
    }
}

/// Masks of the two zmm halves of a tile `width` columns wide.
pub(super) fn column_masks(width: usize) -> (u16, u16) {
    let bits = |w: usize| if w >= 16 { 0xffff } else { (1u16 << w) - 1 };
    (bits(width), bits(width.saturating_sub(16)))
}

/// One instruction set's float32 building blocks: the register tile and panel packing of
/// [`block`], and vectors of [`Kernels::LANES`] channels for the convolutions' transforms
/// and gathers ([`super::f32_conv`], [`super::f32_winograd`]). Code generic over it is
/// `#[inline(always)]` and holds no closures that call it (a closure does not inherit its
/// caller's instruction set: every intrinsic in it would become a call); [`with_isa!`]
/// compiles it once per instruction set.
pub(super) trait Kernels {
    /// Rows per register tile (at most [`MR`]).
    const ROWS: usize;
    /// float32 lanes per vector.
    const LANES: usize;
    /// A vector of [`Kernels::LANES`] floats.
    type V: Copy;
    /// [`Tile::run_rows`] or [`Tile::run_rows_avx2`].
    unsafe fn run_rows(tile: &Tile<'_>, h: usize);
    /// [`pack_panel`] or [`pack_panel_avx2`].
    unsafe fn pack_panel(
        src: *const f32,
        strides: (isize, isize),
        kc: usize,
        width: usize,
        dst: *mut f32,
    );
    /// All lanes zero.
    unsafe fn zero() -> Self::V;
    /// All lanes `x`.
    unsafe fn splat(x: f32) -> Self::V;
    /// `a + b`.
    unsafe fn add(a: Self::V, b: Self::V) -> Self::V;
    /// `a - b`.
    unsafe fn sub(a: Self::V, b: Self::V) -> Self::V;
    /// `a · b + c`, fused.
    unsafe fn fmadd(a: Self::V, b: Self::V, c: Self::V) -> Self::V;
    /// Lanes `<= 0` set to 0 (NaN kept): ReLU as the fused kernels apply it.
    unsafe fn relu(v: Self::V) -> Self::V;
    /// `len` (≤ LANES) floats at `p`, zero beyond.
    unsafe fn load(p: *const f32, len: usize) -> Self::V;
    /// The first `len` (≤ LANES) lanes stored at `p`.
    unsafe fn store(p: *mut f32, len: usize, v: Self::V);
    /// `len` (≤ LANES) elements of `T` at `p` widened to f32, zero beyond.
    unsafe fn load_from<T: Lanes>(p: *const T, len: usize) -> Self::V;
    /// The first `len` (≤ LANES) lanes stored at `p`, rounded to `T`.
    unsafe fn store_to<T: Lanes>(p: *mut T, len: usize, v: Self::V);
    /// As [`Kernels::store_to`] for lanes that hold values of `T` exactly (loaded elements
    /// or zero): nothing to round.
    unsafe fn store_exact_to<T: Lanes>(p: *mut T, len: usize, v: Self::V);
    /// A lane predicate.
    type Mask: Copy;
    /// The first `len` lanes.
    unsafe fn first_lanes(len: usize) -> Self::Mask;
    /// `a` and `b`.
    unsafe fn and(a: Self::Mask, b: Self::Mask) -> Self::Mask;
    /// `a` and not `b`.
    unsafe fn and_not(a: Self::Mask, b: Self::Mask) -> Self::Mask;
    /// `v` where `mask`, else 0.
    unsafe fn keep(mask: Self::Mask, v: Self::V) -> Self::V;
    /// `sum + v` where `mask`, else `sum` (unchanged, a `-0.0` too).
    unsafe fn add_where(sum: Self::V, mask: Self::Mask, v: Self::V) -> Self::V;
    /// A running maximum `m` updated with a later value `v`: `v` where it is greater or NaN
    /// (max pooling's rule: the last NaN wins).
    unsafe fn max_last_nan(m: Self::V, v: Self::V) -> Self::V;
    /// As [`Kernels::max_last_nan`] but the first NaN wins: `v` where it is greater, or NaN
    /// while `m` is not.
    unsafe fn max_first_nan(m: Self::V, v: Self::V) -> Self::V;
    /// The lanes where `v` equals the maximum `m` (NaN matching NaN).
    unsafe fn is_max(v: Self::V, m: Self::V) -> Self::Mask;
    /// The lanes where `v > 0` (NaN not).
    unsafe fn positive(v: Self::V) -> Self::Mask;
}

/// The AVX-512F building blocks.
pub(super) struct Avx512Kernels;
/// The AVX2 + FMA building blocks.
pub(super) struct Avx2Kernels;

#[cfg(target_arch = "x86_64")]
impl Kernels for Avx512Kernels {
    const ROWS: usize = MR;
    const LANES: usize = 16;
    type V = std::arch::x86_64::__m512;
    #[inline(always)]
    unsafe fn run_rows(tile: &Tile<'_>, h: usize) {
        tile.run_rows(h)
    }
    #[inline(always)]
    unsafe fn pack_panel(
        src: *const f32,
        strides: (isize, isize),
        kc: usize,
        width: usize,
        dst: *mut f32,
    ) {
        pack_panel(src, strides, kc, width, dst)
    }
    #[inline(always)]
    unsafe fn zero() -> Self::V {
        std::arch::x86_64::_mm512_setzero_ps()
    }
    #[inline(always)]
    unsafe fn splat(x: f32) -> Self::V {
        std::arch::x86_64::_mm512_set1_ps(x)
    }
    #[inline(always)]
    unsafe fn add(a: Self::V, b: Self::V) -> Self::V {
        std::arch::x86_64::_mm512_add_ps(a, b)
    }
    #[inline(always)]
    unsafe fn sub(a: Self::V, b: Self::V) -> Self::V {
        std::arch::x86_64::_mm512_sub_ps(a, b)
    }
    #[inline(always)]
    unsafe fn fmadd(a: Self::V, b: Self::V, c: Self::V) -> Self::V {
        std::arch::x86_64::_mm512_fmadd_ps(a, b, c)
    }
    #[inline(always)]
    unsafe fn relu(v: Self::V) -> Self::V {
        use std::arch::x86_64::*;
        let zero = _mm512_setzero_ps();
        _mm512_mask_mov_ps(v, _mm512_cmp_ps_mask::<_CMP_LE_OQ>(v, zero), zero)
    }
    #[inline(always)]
    unsafe fn load(p: *const f32, len: usize) -> Self::V {
        f32::load(p, len)
    }
    #[inline(always)]
    unsafe fn store(p: *mut f32, len: usize, v: Self::V) {
        f32::store(p, len, v)
    }
    #[inline(always)]
    unsafe fn load_from<T: Lanes>(p: *const T, len: usize) -> Self::V {
        T::load(p, len)
    }
    #[inline(always)]
    unsafe fn store_to<T: Lanes>(p: *mut T, len: usize, v: Self::V) {
        T::store(p, len, v)
    }
    #[inline(always)]
    unsafe fn store_exact_to<T: Lanes>(p: *mut T, len: usize, v: Self::V) {
        T::store_exact(p, len, v)
    }
    #[inline(always)]
    unsafe fn positive(v: Self::V) -> Self::Mask {
        use std::arch::x86_64::*;
        _mm512_cmp_ps_mask::<_CMP_GT_OQ>(v, _mm512_setzero_ps())
    }
    type Mask = std::arch::x86_64::__mmask16;
    #[inline(always)]
    unsafe fn first_lanes(len: usize) -> Self::Mask {
        crate::lanes::avx512::first(len)
    }
    #[inline(always)]
    unsafe fn and(a: Self::Mask, b: Self::Mask) -> Self::Mask {
        a & b
    }
    #[inline(always)]
    unsafe fn and_not(a: Self::Mask, b: Self::Mask) -> Self::Mask {
        a & !b
    }
    #[inline(always)]
    unsafe fn keep(mask: Self::Mask, v: Self::V) -> Self::V {
        std::arch::x86_64::_mm512_maskz_mov_ps(mask, v)
    }
    #[inline(always)]
    unsafe fn add_where(sum: Self::V, mask: Self::Mask, v: Self::V) -> Self::V {
        std::arch::x86_64::_mm512_mask_add_ps(sum, mask, sum, v)
    }
    #[inline(always)]
    unsafe fn max_last_nan(m: Self::V, v: Self::V) -> Self::V {
        use std::arch::x86_64::*;
        let take =
            _mm512_cmp_ps_mask::<_CMP_GT_OQ>(v, m) | _mm512_cmp_ps_mask::<_CMP_UNORD_Q>(v, v);
        _mm512_mask_mov_ps(m, take, v)
    }
    #[inline(always)]
    unsafe fn max_first_nan(m: Self::V, v: Self::V) -> Self::V {
        use std::arch::x86_64::*;
        let greater = _mm512_cmp_ps_mask::<_CMP_GT_OQ>(v, m);
        let new_nan =
            _mm512_cmp_ps_mask::<_CMP_UNORD_Q>(v, v) & !_mm512_cmp_ps_mask::<_CMP_UNORD_Q>(m, m);
        _mm512_mask_mov_ps(m, greater | new_nan, v)
    }
    #[inline(always)]
    unsafe fn is_max(v: Self::V, m: Self::V) -> Self::Mask {
        use std::arch::x86_64::*;
        _mm512_cmp_ps_mask::<_CMP_EQ_OQ>(v, m)
            | (_mm512_cmp_ps_mask::<_CMP_UNORD_Q>(v, v) & _mm512_cmp_ps_mask::<_CMP_UNORD_Q>(m, m))
    }
}

#[cfg(target_arch = "x86_64")]
impl Kernels for Avx2Kernels {
    const ROWS: usize = AVX2_ROWS;
    const LANES: usize = 8;
    type V = std::arch::x86_64::__m256;
    #[inline(always)]
    unsafe fn run_rows(tile: &Tile<'_>, h: usize) {
        tile.run_rows_avx2(h)
    }
    #[inline(always)]
    unsafe fn pack_panel(
        src: *const f32,
        strides: (isize, isize),
        kc: usize,
        width: usize,
        dst: *mut f32,
    ) {
        pack_panel_avx2(src, strides, kc, width, dst)
    }
    #[inline(always)]
    unsafe fn zero() -> Self::V {
        std::arch::x86_64::_mm256_setzero_ps()
    }
    #[inline(always)]
    unsafe fn splat(x: f32) -> Self::V {
        std::arch::x86_64::_mm256_set1_ps(x)
    }
    #[inline(always)]
    unsafe fn add(a: Self::V, b: Self::V) -> Self::V {
        std::arch::x86_64::_mm256_add_ps(a, b)
    }
    #[inline(always)]
    unsafe fn sub(a: Self::V, b: Self::V) -> Self::V {
        std::arch::x86_64::_mm256_sub_ps(a, b)
    }
    #[inline(always)]
    unsafe fn fmadd(a: Self::V, b: Self::V, c: Self::V) -> Self::V {
        std::arch::x86_64::_mm256_fmadd_ps(a, b, c)
    }
    #[inline(always)]
    unsafe fn relu(v: Self::V) -> Self::V {
        use std::arch::x86_64::*;
        let zero = _mm256_setzero_ps();
        _mm256_blendv_ps(v, zero, _mm256_cmp_ps::<_CMP_LE_OQ>(v, zero))
    }
    #[inline(always)]
    unsafe fn load(p: *const f32, len: usize) -> Self::V {
        f32::load8(p, len)
    }
    #[inline(always)]
    unsafe fn store(p: *mut f32, len: usize, v: Self::V) {
        f32::store8(p, len, v)
    }
    #[inline(always)]
    unsafe fn load_from<T: Lanes>(p: *const T, len: usize) -> Self::V {
        T::load8(p, len)
    }
    #[inline(always)]
    unsafe fn store_to<T: Lanes>(p: *mut T, len: usize, v: Self::V) {
        T::store8(p, len, v)
    }
    #[inline(always)]
    unsafe fn store_exact_to<T: Lanes>(p: *mut T, len: usize, v: Self::V) {
        T::store8_exact(p, len, v)
    }
    #[inline(always)]
    unsafe fn positive(v: Self::V) -> Self::Mask {
        use std::arch::x86_64::*;
        _mm256_cmp_ps::<_CMP_GT_OQ>(v, _mm256_setzero_ps())
    }
    /// All-ones lanes where true.
    type Mask = std::arch::x86_64::__m256;
    #[inline(always)]
    unsafe fn first_lanes(len: usize) -> Self::Mask {
        std::arch::x86_64::_mm256_castsi256_ps(crate::lanes::avx2::first(len))
    }
    #[inline(always)]
    unsafe fn and(a: Self::Mask, b: Self::Mask) -> Self::Mask {
        std::arch::x86_64::_mm256_and_ps(a, b)
    }
    #[inline(always)]
    unsafe fn and_not(a: Self::Mask, b: Self::Mask) -> Self::Mask {
        std::arch::x86_64::_mm256_andnot_ps(b, a)
    }
    #[inline(always)]
    unsafe fn keep(mask: Self::Mask, v: Self::V) -> Self::V {
        std::arch::x86_64::_mm256_and_ps(mask, v)
    }
    #[inline(always)]
    unsafe fn add_where(sum: Self::V, mask: Self::Mask, v: Self::V) -> Self::V {
        use std::arch::x86_64::*;
        _mm256_blendv_ps(sum, _mm256_add_ps(sum, v), mask)
    }
    #[inline(always)]
    unsafe fn max_last_nan(m: Self::V, v: Self::V) -> Self::V {
        use std::arch::x86_64::*;
        let take = _mm256_or_ps(
            _mm256_cmp_ps::<_CMP_GT_OQ>(v, m),
            _mm256_cmp_ps::<_CMP_UNORD_Q>(v, v),
        );
        _mm256_blendv_ps(m, v, take)
    }
    #[inline(always)]
    unsafe fn max_first_nan(m: Self::V, v: Self::V) -> Self::V {
        use std::arch::x86_64::*;
        let greater = _mm256_cmp_ps::<_CMP_GT_OQ>(v, m);
        let new_nan = _mm256_andnot_ps(
            _mm256_cmp_ps::<_CMP_UNORD_Q>(m, m),
            _mm256_cmp_ps::<_CMP_UNORD_Q>(v, v),
        );
        _mm256_blendv_ps(m, v, _mm256_or_ps(greater, new_nan))
    }
    #[inline(always)]
    unsafe fn is_max(v: Self::V, m: Self::V) -> Self::Mask {
        use std::arch::x86_64::*;
        let both_nan = _mm256_and_ps(
            _mm256_cmp_ps::<_CMP_UNORD_Q>(v, v),
            _mm256_cmp_ps::<_CMP_UNORD_Q>(m, m),
        );
        _mm256_or_ps(_mm256_cmp_ps::<_CMP_EQ_OQ>(v, m), both_nan)
    }
}

/// Defines `$name(isa, args..)`, which runs `$generic::<K, ..>(args..)` compiled for the
/// instruction set `isa` names: [`Avx512Kernels`] with AVX-512F, else [`Avx2Kernels`] with
/// AVX2 + FMA (a function cannot be generic over its target features, so each instruction
/// set gets a wrapper that enables them and inlines the generic body).
///
/// `with_isa!(unsafe fn name [T: Lanes] [T] (a: A, b: B) -> R = generic);`
macro_rules! with_isa {
    ($(#[$meta:meta])* $vis:vis unsafe fn $name:ident $([$($bound:tt)*] [$($g:ident),*])?
        ($($arg:ident: $ty:ty),* $(,)?) $(-> $ret:ty)? = $generic:ident;) => {
        $(#[$meta])*
        #[allow(clippy::too_many_arguments)]
        $vis unsafe fn $name$(<$($bound)*>)?(
            isa: crate::simd::Isa,
            $($arg: $ty),*
        ) $(-> $ret)? {
            #[cfg(target_arch = "x86_64")]
            {
                #[target_feature(enable = "avx512f")]
                #[allow(clippy::too_many_arguments)]
                unsafe fn avx512$(<$($bound)*>)?($($arg: $ty),*) $(-> $ret)? {
                    $generic::<$crate::kernels::f32_gemm::Avx512Kernels $($(, $g)*)?>($($arg),*)
                }
                #[target_feature(enable = "avx2,fma,f16c")]
                #[allow(clippy::too_many_arguments)]
                unsafe fn avx2$(<$($bound)*>)?($($arg: $ty),*) $(-> $ret)? {
                    $generic::<$crate::kernels::f32_gemm::Avx2Kernels $($(, $g)*)?>($($arg),*)
                }
                if isa >= crate::simd::Isa::Avx512 {
                    avx512$(::<$($g),*>)?($($arg),*)
                } else {
                    avx2$(::<$($g),*>)?($($arg),*)
                }
            }
            #[cfg(not(target_arch = "x86_64"))]
            {
                let _ = (isa, $($arg),*);
                unreachable!("the native float32 kernels are only chosen on x86-64")
            }
        }
    };
}
pub(super) use with_isa;

/// [`block`] with the AVX-512 kernels.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx512f")]
#[allow(clippy::too_many_arguments)]
unsafe fn block_avx512(
    dst: *mut f32,
    ldc: usize,
    rows: (usize, usize),
    cols: (usize, usize),
    k: usize,
    lhs: &StridedMatrix<'_, f32>,
    rhs: &StridedMatrix<'_, f32>,
    accumulate: bool,
) {
    // The closure inherits this function's instruction set; `block` inlines into it.
    with_pack(packs(rhs, rows, Avx512Kernels::ROWS), |pack| {
        block::<Avx512Kernels>(pack, dst, ldc, rows, cols, k, lhs, rhs, accumulate)
    })
}

/// [`block`] with the AVX2 + FMA kernels.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2,fma,f16c")]
#[allow(clippy::too_many_arguments)]
unsafe fn block_avx2(
    dst: *mut f32,
    ldc: usize,
    rows: (usize, usize),
    cols: (usize, usize),
    k: usize,
    lhs: &StridedMatrix<'_, f32>,
    rhs: &StridedMatrix<'_, f32>,
    accumulate: bool,
) {
    // The closure inherits this function's instruction set; `block` inlines into it.
    with_pack(packs(rhs, rows, Avx2Kernels::ROWS), |pack| {
        block::<Avx2Kernels>(pack, dst, ldc, rows, cols, k, lhs, rhs, accumulate)
    })
}

/// Whether [`block`] packs the right operand (else it reads it in place: one row tile of
/// `tile_rows` and contiguous rows).
fn packs(rhs: &StridedMatrix<'_, f32>, rows: (usize, usize), tile_rows: usize) -> bool {
    !(rhs.cs == 1 && rows.1 - rows.0 <= tile_rows)
}

/// Runs `f` with this thread's packing buffer ([`KC`] x [`NC`] floats when `needed`).
fn with_pack(needed: bool, f: impl FnOnce(*mut f32)) {
    thread_local! {
        static PACK: std::cell::RefCell<Vec<f32>> = const { std::cell::RefCell::new(Vec::new()) };
    }
    PACK.with_borrow_mut(|pack| {
        if needed && pack.len() < KC * NC {
            pack.resize(KC * NC, 0.0);
        }
        f(pack.as_mut_ptr())
    })
}

/// The output rows `rows.0..rows.1` by columns `cols.0..cols.1`, with the kernels `K`
/// (inlined into [`block_avx512`] / [`block_avx2`], which enable their instruction sets;
/// no closures here, which would not inherit them), packing into `pack`.
#[cfg(target_arch = "x86_64")]
#[inline(always)]
#[allow(clippy::too_many_arguments)]
unsafe fn block<K: Kernels>(
    pack: *mut f32,
    dst: *mut f32,
    ldc: usize,
    rows: (usize, usize),
    cols: (usize, usize),
    k: usize,
    lhs: &StridedMatrix<'_, f32>,
    rhs: &StridedMatrix<'_, f32>,
    accumulate: bool,
) {
    let a = lhs.data.as_ptr().add(lhs.offset);
    let b = rhs.data.as_ptr().add(rhs.offset);
    // One row tile: B is read once, in place when its rows are contiguous.
    let in_place = !packs(rhs, rows, K::ROWS);
    let mut row_offsets = [0isize; MR];
    for (r, o) in row_offsets.iter_mut().enumerate() {
        *o = r as isize * lhs.rs;
    }
    // Equal blocks of at most KC steps of k.
    let kstep = k.div_ceil(k.div_ceil(KC));
    for k0 in (0..k).step_by(kstep) {
        let kc = kstep.min(k - k0);
        let add = accumulate || k0 > 0;
        for jb in (cols.0..cols.1).step_by(NC) {
            let ncols = NC.min(cols.1 - jb);
            let panels = ncols.div_ceil(NR);
            let block_at = b.offset(k0 as isize * rhs.rs + jb as isize * rhs.cs);
            if !in_place {
                // Panel q holds columns jb + 32q.. as kc rows of NR floats.
                for q in 0..panels {
                    K::pack_panel(
                        block_at.offset((q * NR) as isize * rhs.cs),
                        (rhs.rs, rhs.cs),
                        kc,
                        NR.min(ncols - q * NR),
                        pack.add(q * KC * NR),
                    );
                }
            }
            // Each row tile of A (K::ROWS x kc, L1-resident) meets every panel of the block.
            let mut i0 = rows.0;
            while i0 < rows.1 {
                let h = balanced_tile_rows(rows.1 - i0, K::ROWS);
                for q in 0..panels {
                    let (bp, b_rs) = if in_place {
                        (block_at.add(q * NR), rhs.rs)
                    } else {
                        (pack.add(q * KC * NR) as *const f32, NR as isize)
                    };
                    let tile = Tile {
                        a: a.offset(i0 as isize * lhs.rs + k0 as isize * lhs.cs),
                        rows: row_offsets,
                        a_cs: lhs.cs,
                        segments: &[0],
                        seg_len: kc,
                        b: bp,
                        b_rs,
                        masks: column_masks(NR.min(ncols - q * NR)),
                        c: dst.add(i0 * ldc + jb + q * NR),
                        ldc,
                        add,
                        bias: std::ptr::null(),
                        relu: false,
                    };
                    K::run_rows(&tile, h);
                }
                i0 += h;
            }
        }
    }
}

/// Rows of the next register tile when `left` rows remain, tiles holding at most `most`:
/// the rows spread evenly over the tiles they need (32 rows in 6-row tiles: 6, 6, 5, 5, 5,
/// 5, not five of 6 and one of 2). A short tile has too few accumulators to hide the
/// multiply-add's latency (two rows: four chains, about 40% of the units' rate), while 5
/// rows keep as many in flight as 6.
fn balanced_tile_rows(left: usize, most: usize) -> usize {
    left.div_ceil(left.div_ceil(most))
}

/// Packs `kc` rows of a panel `width` (≤ NR) columns wide whose element (p, j) is at
/// `src + p·rs + j·cs` into `dst[p * NR + j]`.
///
/// # Safety
/// AVX-512F is present, the panel lies inside its buffer and `dst` holds `kc * NR` floats.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx512f")]
pub(super) unsafe fn pack_panel(
    src: *const f32,
    (rs, cs): (isize, isize),
    kc: usize,
    width: usize,
    dst: *mut f32,
) {
    use std::arch::x86_64::*;
    let (m0, m1) = column_masks(width);
    if cs == 1 {
        for p in 0..kc {
            let s = src.offset(p as isize * rs);
            let d = dst.add(p * NR);
            _mm512_storeu_ps(d, _mm512_maskz_loadu_ps(m0, s));
            _mm512_storeu_ps(d.add(16), _mm512_maskz_loadu_ps(m1, s.add(16)));
        }
    } else if rs == 1 {
        pack_transposed(src, cs, kc, width, dst);
    } else {
        pack_strided(src, (rs, cs), kc, width, dst);
    }
}

/// [`pack_panel`] of a matrix strided both ways: element by element, along k.
///
/// # Safety
/// As [`pack_panel`]'s (no instruction-set requirement).
unsafe fn pack_strided(
    src: *const f32,
    (rs, cs): (isize, isize),
    kc: usize,
    width: usize,
    dst: *mut f32,
) {
    for j in 0..width {
        let s = src.offset(j as isize * cs);
        for p in 0..kc {
            *dst.add(p * NR + j) = *s.offset(p as isize * rs);
        }
    }
}

/// Eight floats at `p`, or (not `FULL`) the lanes `mask` selects and zeros (a plain
/// function, not a closure, so it inlines into the caller's instruction set).
#[cfg(target_arch = "x86_64")]
#[inline(always)]
unsafe fn load8<const FULL: bool>(
    p: *const f32,
    mask: std::arch::x86_64::__m256i,
) -> std::arch::x86_64::__m256 {
    use std::arch::x86_64::*;
    if FULL {
        _mm256_loadu_ps(p)
    } else {
        _mm256_maskload_ps(p, mask)
    }
}

/// [`pack_panel`] with AVX2: the same layout (`kc` rows of [`NR`] floats, columns past
/// `width` zero where a row is written through registers).
///
/// # Safety
/// AVX2 is present, the panel lies inside its buffer and `dst` holds `kc * NR` floats.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2,fma,f16c")]
pub(super) unsafe fn pack_panel_avx2(
    src: *const f32,
    (rs, cs): (isize, isize),
    kc: usize,
    width: usize,
    dst: *mut f32,
) {
    use std::arch::x86_64::*;
    if cs == 1 {
        let masks: [__m256i; NR / 8] =
            std::array::from_fn(|q| crate::lanes::avx2::first(width.saturating_sub(8 * q)));
        for p in 0..kc {
            let s = src.offset(p as isize * rs);
            let d = dst.add(p * NR);
            for (q, &mask) in masks.iter().enumerate() {
                _mm256_storeu_ps(d.add(8 * q), _mm256_maskload_ps(s.add(8 * q), mask));
            }
        }
    } else if rs == 1 {
        pack_transposed_avx2(src, cs, kc, width, dst);
    } else {
        pack_strided(src, (rs, cs), kc, width, dst);
    }
}

/// [`pack_transposed`] with AVX2: 8x8 blocks through registers.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn pack_transposed_avx2(src: *const f32, cs: isize, kc: usize, width: usize, dst: *mut f32) {
    use std::arch::x86_64::*;
    for p0 in (0..kc).step_by(8) {
        let depth = 8.min(kc - p0);
        let load_mask = crate::lanes::avx2::first(depth);
        for oct in 0..width.div_ceil(8) {
            let mut r = [_mm256_setzero_ps(); 8];
            for (jj, v) in r.iter_mut().enumerate() {
                let j = oct * 8 + jj;
                if j < width {
                    *v = _mm256_maskload_ps(src.offset(j as isize * cs).add(p0), load_mask);
                }
            }
            transpose8(&mut r);
            for (pp, v) in r.iter().enumerate().take(depth) {
                _mm256_storeu_ps(dst.add((p0 + pp) * NR + oct * 8), *v);
            }
        }
    }
}

/// Transposes an 8x8 block of f32 held as 8 rows.
#[cfg(target_arch = "x86_64")]
#[inline(always)]
unsafe fn transpose8(r: &mut [std::arch::x86_64::__m256; 8]) {
    use std::arch::x86_64::*;
    let t: [__m256; 8] = std::array::from_fn(|i| {
        let (a, b) = (r[i / 2 * 2], r[i / 2 * 2 + 1]);
        if i % 2 == 0 {
            _mm256_unpacklo_ps(a, b)
        } else {
            _mm256_unpackhi_ps(a, b)
        }
    });
    // t0 = a0b0a1b1|a4b4a5b5, t1 = a2b2a3b3|a6b6a7b7 (rows 0 and 1), t2/t3 rows 2 and 3..
    let s: [__m256; 8] = std::array::from_fn(|i| {
        let (lo, hi) = (t[(i / 4) * 4 + (i % 2)], t[(i / 4) * 4 + 2 + (i % 2)]);
        if (i / 2) % 2 == 0 {
            _mm256_shuffle_ps::<0x44>(lo, hi)
        } else {
            _mm256_shuffle_ps::<0xEE>(lo, hi)
        }
    });
    // s[0..4]: columns 0, 4 / 2, 6 / 1, 5 / 3, 7 of rows 0-3 (low | high lane); s[4..8]
    // the same of rows 4-7.
    let order = [0usize, 2, 1, 3];
    for (c, &q) in order.iter().enumerate() {
        r[c] = _mm256_permute2f128_ps::<0x20>(s[q], s[q + 4]);
        r[c + 4] = _mm256_permute2f128_ps::<0x31>(s[q], s[q + 4]);
    }
}

/// Packs a transposed panel: `dst[p * NR + j] = src[j * cs + p]` for `p < kc`, `j < width`
/// (a right operand stored as its transpose, e.g. `dZ · Wᵀ`), 16x16 blocks at a time
/// through registers instead of one scattered element at a time.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx512f")]
unsafe fn pack_transposed(src: *const f32, cs: isize, kc: usize, width: usize, dst: *mut f32) {
    use std::arch::x86_64::*;
    for p0 in (0..kc).step_by(16) {
        let depth = 16.min(kc - p0);
        let load_mask = column_masks(depth).0;
        for half in 0..width.div_ceil(16) {
            let mut r = [_mm512_setzero_ps(); 16];
            for (jj, v) in r.iter_mut().enumerate() {
                let j = half * 16 + jj;
                if j < width {
                    *v = _mm512_maskz_loadu_ps(load_mask, src.offset(j as isize * cs).add(p0));
                }
            }
            transpose16(&mut r);
            for (pp, v) in r.iter().enumerate().take(depth) {
                _mm512_storeu_ps(dst.add((p0 + pp) * NR + half * 16), *v);
            }
        }
    }
}

/// Transposes a 16x16 block of f32 held as 16 rows.
#[cfg(target_arch = "x86_64")]
#[inline(always)]
unsafe fn transpose16(r: &mut [std::arch::x86_64::__m512; 16]) {
    use std::arch::x86_64::*;
    let mut t = [_mm512_setzero_ps(); 16];
    for i in 0..8 {
        t[2 * i] = _mm512_unpacklo_ps(r[2 * i], r[2 * i + 1]);
        t[2 * i + 1] = _mm512_unpackhi_ps(r[2 * i], r[2 * i + 1]);
    }
    let mut u = [_mm512_setzero_ps(); 16];
    for i in 0..4 {
        let (a, b, c, d) = (t[4 * i], t[4 * i + 1], t[4 * i + 2], t[4 * i + 3]);
        let pd = _mm512_castps_pd;
        u[4 * i] = _mm512_castpd_ps(_mm512_unpacklo_pd(pd(a), pd(c)));
        u[4 * i + 1] = _mm512_castpd_ps(_mm512_unpackhi_pd(pd(a), pd(c)));
        u[4 * i + 2] = _mm512_castpd_ps(_mm512_unpacklo_pd(pd(b), pd(d)));
        u[4 * i + 3] = _mm512_castpd_ps(_mm512_unpackhi_pd(pd(b), pd(d)));
    }
    for h in 0..2 {
        for i in 0..4 {
            let (a, b) = (u[8 * h + i], u[8 * h + 4 + i]);
            t[8 * h + i] = _mm512_shuffle_f32x4::<0x88>(a, b);
            t[8 * h + 4 + i] = _mm512_shuffle_f32x4::<0xdd>(a, b);
        }
    }
    for i in 0..8 {
        r[i] = _mm512_shuffle_f32x4::<0x88>(t[i], t[8 + i]);
        r[8 + i] = _mm512_shuffle_f32x4::<0xdd>(t[i], t[8 + i]);
    }
}

#[cfg(not(target_arch = "x86_64"))]
#[allow(clippy::too_many_arguments)]
unsafe fn block_avx512(
    _dst: *mut f32,
    _ldc: usize,
    _rows: (usize, usize),
    _cols: (usize, usize),
    _k: usize,
    _lhs: &StridedMatrix<'_, f32>,
    _rhs: &StridedMatrix<'_, f32>,
    _accumulate: bool,
) {
    unreachable!("native_gemm is only chosen on x86-64 with AVX-512 or AVX2")
}

#[cfg(not(target_arch = "x86_64"))]
use block_avx512 as block_avx2;

/// One register tile: `C[0..R, 0..width] = [C +] A[0..R, 0..kc] · B[0..kc, 0..width]`.
///
/// Row `r` of A starts at `a + rows[r]`; its `kc` steps of k are `segments.len()` runs of
/// `seg_len` elements `a_cs` apart, run `s` starting `segments[s]` further on. A matrix
/// product has one run and evenly spaced rows; a direct convolution has one run per filter
/// tap (`kh·kw` runs of `cin` channels) and rows at the output pixels' windows, which need
/// not be evenly spaced (a tile may wrap to the next output row). B advances `b_rs` per step.
#[derive(Clone, Copy)]
pub(super) struct Tile<'s> {
    pub a: *const f32,
    pub rows: [isize; MR],
    pub a_cs: isize,
    pub segments: &'s [isize],
    pub seg_len: usize,
    pub b: *const f32,
    pub b_rs: isize,
    pub masks: (u16, u16),
    pub c: *mut f32,
    pub ldc: usize,
    pub add: bool,
    /// A fused convolution's epilogue on the sums before they are stored: `bias[column]`
    /// added (null: none), then, with `relu`, values `<= 0` set to 0 (NaN kept).
    pub bias: *const f32,
    pub relu: bool,
}

impl Tile<'_> {
    /// Runs the tile for its first `h` (1..=MR) rows.
    ///
    /// # Safety
    /// AVX-512F is present and every address the tile describes is valid.
    #[cfg(target_arch = "x86_64")]
    #[inline(always)]
    pub(super) unsafe fn run_rows(&self, h: usize) {
        match h {
            8 => self.run::<8>(),
            7 => self.run::<7>(),
            6 => self.run::<6>(),
            5 => self.run::<5>(),
            4 => self.run::<4>(),
            3 => self.run::<3>(),
            2 => self.run::<2>(),
            _ => self.run::<1>(),
        }
    }

    #[cfg(target_arch = "x86_64")]
    #[inline(always)]
    unsafe fn run<const R: usize>(&self) {
        use std::arch::x86_64::*;
        let (m0, m1) = self.masks;
        let mut acc = [[_mm512_setzero_ps(); 2]; R];
        let mut bp = self.b;
        for &segment in self.segments {
            let mut ap = self.a.offset(segment);
            for _ in 0..self.seg_len {
                let b0 = _mm512_maskz_loadu_ps(m0, bp);
                let b1 = _mm512_maskz_loadu_ps(m1, bp.add(16));
                for (r, row) in acc.iter_mut().enumerate() {
                    let av = _mm512_set1_ps(*ap.offset(self.rows[r]));
                    row[0] = _mm512_fmadd_ps(av, b0, row[0]);
                    row[1] = _mm512_fmadd_ps(av, b1, row[1]);
                }
                ap = ap.offset(self.a_cs);
                bp = bp.offset(self.b_rs);
            }
        }
        for (r, row) in acc.iter().enumerate() {
            let cp = self.c.add(r * self.ldc);
            let (mut x0, mut x1) = (row[0], row[1]);
            if self.add {
                x0 = _mm512_add_ps(x0, _mm512_maskz_loadu_ps(m0, cp));
                x1 = _mm512_add_ps(x1, _mm512_maskz_loadu_ps(m1, cp.add(16)));
            }
            if !self.bias.is_null() {
                x0 = _mm512_add_ps(x0, _mm512_maskz_loadu_ps(m0, self.bias));
                x1 = _mm512_add_ps(x1, _mm512_maskz_loadu_ps(m1, self.bias.add(16)));
            }
            if self.relu {
                let zero = _mm512_setzero_ps();
                x0 = _mm512_mask_mov_ps(x0, _mm512_cmp_ps_mask::<_CMP_LE_OQ>(x0, zero), zero);
                x1 = _mm512_mask_mov_ps(x1, _mm512_cmp_ps_mask::<_CMP_LE_OQ>(x1, zero), zero);
            }
            _mm512_mask_storeu_ps(cp, m0, x0);
            _mm512_mask_storeu_ps(cp.add(16), m1, x1);
        }
    }
}

impl Tile<'_> {
    /// [`Tile::run_rows`] with AVX2 + FMA: the tile's first `h` (1..=MR) rows in blocks of
    /// up to [`AVX2_ROWS`] rows by 16 columns (twelve ymm accumulators, two loads of B and a
    /// broadcast of A per row and step of k), each half of the [`NR`] columns that holds
    /// any.
    ///
    /// # Safety
    /// AVX2 and FMA are present and every address the tile describes is valid.
    #[cfg(target_arch = "x86_64")]
    #[inline(always)]
    pub(super) unsafe fn run_rows_avx2(&self, h: usize) {
        let width = (self.masks.0.count_ones() + self.masks.1.count_ones()) as usize;
        let mut r0 = 0;
        while r0 < h.min(MR) {
            let rows = AVX2_ROWS.min(h - r0);
            for col in (0..width).step_by(16) {
                let w = (width - col).min(16);
                match (rows, w == 16) {
                    (6, true) => self.run_avx2::<6, true>(r0, col, w),
                    (6, false) => self.run_avx2::<6, false>(r0, col, w),
                    (5, true) => self.run_avx2::<5, true>(r0, col, w),
                    (5, false) => self.run_avx2::<5, false>(r0, col, w),
                    (4, true) => self.run_avx2::<4, true>(r0, col, w),
                    (4, false) => self.run_avx2::<4, false>(r0, col, w),
                    (3, true) => self.run_avx2::<3, true>(r0, col, w),
                    (3, false) => self.run_avx2::<3, false>(r0, col, w),
                    (2, true) => self.run_avx2::<2, true>(r0, col, w),
                    (2, false) => self.run_avx2::<2, false>(r0, col, w),
                    (_, true) => self.run_avx2::<1, true>(r0, col, w),
                    (_, false) => self.run_avx2::<1, false>(r0, col, w),
                }
            }
            r0 += rows;
        }
    }

    /// Rows `r0..r0 + R` by columns `col..col + width` (`width` ≤ 16; `FULL`: 16, read and
    /// written without masks).
    #[cfg(target_arch = "x86_64")]
    #[inline(always)]
    unsafe fn run_avx2<const R: usize, const FULL: bool>(
        &self,
        r0: usize,
        col: usize,
        width: usize,
    ) {
        use std::arch::x86_64::*;
        let (k0, k1) = (
            crate::lanes::avx2::first(width),
            crate::lanes::avx2::first(width.saturating_sub(8)),
        );
        let mut acc = [[_mm256_setzero_ps(); 2]; R];
        let mut bp = self.b.add(col);
        for &segment in self.segments {
            let mut ap = self.a.offset(segment);
            for _ in 0..self.seg_len {
                let b0 = load8::<FULL>(bp, k0);
                let b1 = load8::<FULL>(bp.add(8), k1);
                for (r, row) in acc.iter_mut().enumerate() {
                    let av = _mm256_broadcast_ss(&*ap.offset(self.rows[r0 + r]));
                    row[0] = _mm256_fmadd_ps(av, b0, row[0]);
                    row[1] = _mm256_fmadd_ps(av, b1, row[1]);
                }
                ap = ap.offset(self.a_cs);
                bp = bp.offset(self.b_rs);
            }
        }
        let zero = _mm256_setzero_ps();
        for (r, row) in acc.iter().enumerate() {
            let cp = self.c.add((r0 + r) * self.ldc + col);
            let (mut x0, mut x1) = (row[0], row[1]);
            if self.add {
                x0 = _mm256_add_ps(x0, load8::<FULL>(cp, k0));
                x1 = _mm256_add_ps(x1, load8::<FULL>(cp.add(8), k1));
            }
            if !self.bias.is_null() {
                x0 = _mm256_add_ps(x0, load8::<FULL>(self.bias.add(col), k0));
                x1 = _mm256_add_ps(x1, load8::<FULL>(self.bias.add(col + 8), k1));
            }
            if self.relu {
                x0 = _mm256_blendv_ps(x0, zero, _mm256_cmp_ps::<_CMP_LE_OQ>(x0, zero));
                x1 = _mm256_blendv_ps(x1, zero, _mm256_cmp_ps::<_CMP_LE_OQ>(x1, zero));
            }
            if FULL {
                _mm256_storeu_ps(cp, x0);
                _mm256_storeu_ps(cp.add(8), x1);
            } else {
                _mm256_maskstore_ps(cp, k0, x0);
                _mm256_maskstore_ps(cp.add(8), k1, x1);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    /// `[c +] a · b` in f64, reading the operands through their strides.
    fn reference(
        dims: (usize, usize, usize),
        a: &StridedMatrix<'_, f32>,
        b: &StridedMatrix<'_, f32>,
        c: &[f32],
        accumulate: bool,
    ) -> Vec<f64> {
        let (m, n, k) = dims;
        let at = |x: &StridedMatrix<'_, f32>, i: usize, j: usize| {
            x.data[(x.offset as isize + i as isize * x.rs + j as isize * x.cs) as usize] as f64
        };
        let mut out = vec![0.0; m * n];
        for i in 0..m {
            for j in 0..n {
                let s: f64 = (0..k).map(|p| at(a, i, p) * at(b, p, j)).sum();
                out[i * n + j] = s + if accumulate { c[i * n + j] as f64 } else { 0.0 };
            }
        }
        out
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(48))]
        /// Every layout of both operands (row-major, transposed, a strided view with an
        /// offset), with and without accumulation, on sizes around the tile, block and
        /// threading edges.
        #[test]
        fn matches_the_f64_reference(
            m in 1..80usize,
            n in 1..90usize,
            k in prop_oneof![1..20usize, 120..300usize],
            a_layout in 0..3usize,
            b_layout in 0..3usize,
            accumulate: bool,
            seed in 0..1000u64,
        ) {
            let isas = kernel_isas();
            if isas.is_empty() {
                eprintln!("skipped: this CPU has neither AVX-512 nor AVX2, the kernels under test never run");
                return Ok(());
            }
            let value = |i: usize| (((i as u64 * 2654435761 + seed) % 1000) as f32) / 500.0 - 1.0;
            // (data, offset, rs, cs) for an r x c matrix in the chosen layout.
            let layout = |r: usize, c: usize, kind: usize, salt: usize| -> (Vec<f32>, usize, isize, isize) {
                match kind {
                    0 => ((0..r * c).map(|i| value(i + salt)).collect(), 0, c as isize, 1),
                    1 => ((0..r * c).map(|i| value(i + salt)).collect(), 0, 1, r as isize),
                    _ => ((0..3 + r * (2 * c + 1)).map(|i| value(i + salt)).collect(), 3, (2 * c + 1) as isize, 2),
                }
            };
            let (ad, ao, ars, acs) = layout(m, k, a_layout, 0);
            let (bd, bo, brs, bcs) = layout(k, n, b_layout, 7);
            let a = StridedMatrix { data: &ad, offset: ao, rs: ars, cs: acs };
            let b = StridedMatrix { data: &bd, offset: bo, rs: brs, cs: bcs };
            let c0: Vec<f32> = (0..m * n).map(|i| value(i + 13)).collect();
            let want = reference((m, n, k), &a, &b, &c0, accumulate);
            for isa in isas {
                let mut c = c0.clone();
                // SAFETY: `kernel_isas` lists what this CPU has; `c` holds m x n values and
                // `layout` made both operands fit their slices.
                unsafe { gemm_f32(isa, c.as_mut_ptr(), m, n, k, a, b, accumulate) };
                for (i, (&g, &w)) in c.iter().zip(&want).enumerate() {
                    prop_assert!(
                        (g as f64 - w).abs() <= 1e-5 * (k as f64 + 1.0),
                        "{:?} ({}, {}): {} vs {}", isa, i / n, i % n, g, w
                    );
                }
            }
        }
    }

    /// The instruction sets this CPU can run the kernels with (whatever `FERROFLOW_CPU_ISA`
    /// says: the tests check every version the CPU has).
    fn kernel_isas() -> Vec<Isa> {
        let mut isas = vec![];
        #[cfg(target_arch = "x86_64")]
        {
            if std::is_x86_feature_detected!("avx512f") {
                isas.push(Isa::Avx512);
            }
            if std::is_x86_feature_detected!("avx2") && std::is_x86_feature_detected!("fma") {
                isas.push(Isa::Avx2);
            }
        }
        isas
    }

    #[test]
    fn row_tiles_cover_the_rows_evenly() {
        for most in [AVX2_ROWS, MR] {
            for rows in 1..200 {
                let mut tiles = vec![];
                let mut left = rows;
                while left > 0 {
                    let h = balanced_tile_rows(left, most);
                    assert!((1..=most).contains(&h), "{rows} rows: a tile of {h}");
                    tiles.push(h);
                    left -= h;
                }
                // As few tiles as whole ones would need, none more than a row shorter than
                // another.
                assert_eq!(tiles.len(), rows.div_ceil(most), "{rows} rows: {tiles:?}");
                let (lo, hi) = (tiles.iter().min(), tiles.iter().max());
                assert!(
                    hi.zip(lo).is_some_and(|(h, l)| h - l <= 1),
                    "{rows}: {tiles:?}"
                );
            }
        }
    }

    #[test]
    fn panels_pack_like_element_by_element() {
        let isas = kernel_isas();
        if isas.is_empty() {
            eprintln!(
                "skipped: this CPU has neither AVX-512 nor AVX2, the kernels under test never run"
            );
            return;
        }
        for isa in isas {
            for (kc, width) in [
                (16, 16),
                (128, 32),
                (37, 21),
                (5, 3),
                (1, 32),
                (9, 8),
                (8, 9),
            ] {
                let cs = kc + 3;
                let src: Vec<f32> = (0..(kc + 3) * (width + 3)).map(|i| i as f32).collect();
                // Transposed (rows of the panel contiguous along k) and row-major panels.
                for (rs, cs) in [(1, cs as isize), (width as isize + 2, 1)] {
                    let mut got = vec![f32::NAN; kc * NR];
                    // SAFETY: `kernel_isas` lists what this CPU has; src holds every
                    // element of the panel in both layouts, got kc x NR.
                    unsafe {
                        let pack = if isa == Isa::Avx512 {
                            pack_panel
                        } else {
                            pack_panel_avx2
                        };
                        pack(src.as_ptr(), (rs, cs), kc, width, got.as_mut_ptr())
                    };
                    for p in 0..kc {
                        for j in 0..width {
                            assert_eq!(
                                got[p * NR + j],
                                src[(p as isize * rs + j as isize * cs) as usize],
                                "{isa:?} strides ({rs}, {cs}) kc {kc} width {width} ({p}, {j})"
                            );
                        }
                    }
                }
            }
        }
    }

    #[test]
    fn an_empty_inner_dimension_gives_zeros_or_leaves_the_sum() {
        if native_isa().is_none() {
            eprintln!(
                "skipped: this CPU has neither AVX-512 nor AVX2, the kernel under test never runs"
            );
            return;
        }
        let (a, b) = ([0f32; 0], [0f32; 0]);
        let m = |d| StridedMatrix {
            data: d,
            offset: 0,
            rs: 0,
            cs: 0,
        };
        let mut c = vec![5f32; 6];
        assert!(f32::native_gemm(&mut c, (2, 3, 0), m(&a), m(&b), true));
        assert_eq!(c, vec![5.0; 6]);
        assert!(f32::native_gemm(&mut c, (2, 3, 0), m(&a), m(&b), false));
        assert_eq!(c, vec![0.0; 6]);
    }
}
