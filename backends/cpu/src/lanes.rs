//! Sixteen elements of float32, bfloat16 or float16 as the f32 lanes of one AVX-512
//! register: how the vector kernels read and write these types, so a half-precision tensor
//! runs through a float32 kernel without a widened copy in memory (the conversion happens
//! in registers).
//!
//! bfloat16 widens exactly (its bits are the high half of an f32); stores round to nearest
//! even with NaNs made quiet, the same integer rounding as `buffer`'s whole-buffer
//! narrowing (one place: [`avx512::round_to_bf16`]). float16 converts with AVX-512F's
//! `vcvtph2ps` / `vcvtps2ph` (exact widening; narrowing to nearest even, as the `half`
//! crate rounds).

/// An element type the AVX-512 kernels load and store as 16 f32 lanes.
pub(crate) trait Lanes: Copy + Send + Sync + 'static {
    /// The lowest finite value, as f32.
    const LOWEST: f32;
    /// Whether this is float32 itself: a value computed in f32 is stored unrounded.
    const IS_F32: bool;
    /// `len` (≤ 16) elements at `p` as f32 lanes, zero beyond.
    ///
    /// # Safety
    /// AVX-512F is present; `p` is valid for `len` reads.
    #[cfg(target_arch = "x86_64")]
    unsafe fn load(p: *const Self, len: usize) -> std::arch::x86_64::__m512;
    /// The first `len` (≤ 16) lanes of `v` stored at `p`, rounded to this type.
    ///
    /// # Safety
    /// AVX-512F is present; `p` is valid for `len` writes.
    #[cfg(target_arch = "x86_64")]
    unsafe fn store(p: *mut Self, len: usize, v: std::arch::x86_64::__m512);
    /// As [`Lanes::store`] for lanes that hold values of this type exactly (loaded
    /// elements or zero): nothing to round.
    ///
    /// # Safety
    /// As [`Lanes::store`].
    #[cfg(target_arch = "x86_64")]
    unsafe fn store_exact(p: *mut Self, len: usize, v: std::arch::x86_64::__m512);
    /// The slice as float32 when it is float32 (no copy); `None` for other types.
    fn as_f32(v: &[Self]) -> Option<&[f32]>;
    /// `dst[..src.len()] = src` widened to f32 (exact).
    fn widen_into(src: &[Self], dst: &mut [f32]);
    /// `dst[i] = src[i]` rounded to this type, into memory that may be uninitialised.
    ///
    /// # Safety
    /// `dst` is valid for `src.len()` writes.
    unsafe fn narrow_to(src: &[f32], dst: *mut Self);
}

impl Lanes for f32 {
    const LOWEST: f32 = f32::MIN;
    const IS_F32: bool = true;
    #[cfg(target_arch = "x86_64")]
    #[inline(always)]
    unsafe fn load(p: *const f32, len: usize) -> std::arch::x86_64::__m512 {
        std::arch::x86_64::_mm512_maskz_loadu_ps(avx512::first(len), p)
    }
    #[cfg(target_arch = "x86_64")]
    #[inline(always)]
    unsafe fn store(p: *mut f32, len: usize, v: std::arch::x86_64::__m512) {
        std::arch::x86_64::_mm512_mask_storeu_ps(p, avx512::first(len), v)
    }
    #[cfg(target_arch = "x86_64")]
    #[inline(always)]
    unsafe fn store_exact(p: *mut f32, len: usize, v: std::arch::x86_64::__m512) {
        Self::store(p, len, v)
    }
    fn as_f32(v: &[f32]) -> Option<&[f32]> {
        Some(v)
    }
    fn widen_into(src: &[f32], dst: &mut [f32]) {
        dst[..src.len()].copy_from_slice(src)
    }
    unsafe fn narrow_to(src: &[f32], dst: *mut f32) {
        std::ptr::copy_nonoverlapping(src.as_ptr(), dst, src.len())
    }
}

impl Lanes for half::bf16 {
    // bf16's lowest finite value (0xFF7F), exactly an f32.
    const LOWEST: f32 = -3.389_531_4e38;
    const IS_F32: bool = false;
    #[cfg(target_arch = "x86_64")]
    #[inline(always)]
    unsafe fn load(p: *const half::bf16, len: usize) -> std::arch::x86_64::__m512 {
        avx512::from_bf16(avx512::load_halves(p as *const u16, len))
    }
    #[cfg(target_arch = "x86_64")]
    #[inline(always)]
    unsafe fn store(p: *mut half::bf16, len: usize, v: std::arch::x86_64::__m512) {
        avx512::store_bf16_bits(p, len, avx512::round_to_bf16(v))
    }
    #[cfg(target_arch = "x86_64")]
    #[inline(always)]
    unsafe fn store_exact(p: *mut half::bf16, len: usize, v: std::arch::x86_64::__m512) {
        use std::arch::x86_64::*;
        let high = _mm512_srli_epi32::<16>(_mm512_castps_si512(v));
        avx512::store_bf16_bits(p, len, high)
    }
    fn as_f32(_: &[half::bf16]) -> Option<&[f32]> {
        None
    }
    fn widen_into(src: &[half::bf16], dst: &mut [f32]) {
        <half::bf16 as crate::buffer::Half>::widen_into(src, dst)
    }
    unsafe fn narrow_to(src: &[f32], dst: *mut half::bf16) {
        crate::buffer::narrow_bf16_to(src, dst)
    }
}

impl Lanes for half::f16 {
    // f16's lowest finite value, -65504, exactly an f32.
    const LOWEST: f32 = -65504.0;
    const IS_F32: bool = false;
    #[cfg(target_arch = "x86_64")]
    #[inline(always)]
    unsafe fn load(p: *const half::f16, len: usize) -> std::arch::x86_64::__m512 {
        std::arch::x86_64::_mm512_cvtph_ps(avx512::load_halves(p as *const u16, len))
    }
    #[cfg(target_arch = "x86_64")]
    #[inline(always)]
    unsafe fn store(p: *mut half::f16, len: usize, v: std::arch::x86_64::__m512) {
        use std::arch::x86_64::*;
        let packed = _mm512_cvtps_ph::<{ _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC }>(v);
        avx512::store_halves(p as *mut u16, len, packed)
    }
    #[cfg(target_arch = "x86_64")]
    #[inline(always)]
    unsafe fn store_exact(p: *mut half::f16, len: usize, v: std::arch::x86_64::__m512) {
        Self::store(p, len, v)
    }
    fn as_f32(_: &[half::f16]) -> Option<&[f32]> {
        None
    }
    fn widen_into(src: &[half::f16], dst: &mut [f32]) {
        <half::f16 as crate::buffer::Half>::widen_into(src, dst)
    }
    unsafe fn narrow_to(src: &[f32], dst: *mut half::f16) {
        #[cfg(target_arch = "x86_64")]
        if crate::simd::has_avx512() {
            return avx512::narrow_all(src, dst);
        }
        for (i, &x) in src.iter().enumerate() {
            dst.add(i).write(half::f16::from_f32(x));
        }
    }
}

#[cfg(target_arch = "x86_64")]
pub(crate) mod avx512 {
    use super::Lanes;
    use std::arch::x86_64::*;

    /// The first `len` (≤ 16) lanes.
    #[inline(always)]
    pub(crate) fn first(len: usize) -> __mmask16 {
        if len >= 16 {
            0xffff
        } else {
            (1u16 << len) - 1
        }
    }

    /// The low 16 bits of the first `len` (≤ 16) lanes of `bits` stored at `p`. Packs in a
    /// register and stores 32 bytes (the memory form of `vpmovdw`, masked or not, is slow on
    /// AMD Zen 4: it doubled the time of memory-bound bf16 kernels); a tail goes through a
    /// copy (masked 16-bit stores would need AVX512-BW).
    #[inline(always)]
    pub(crate) unsafe fn store_bf16_bits(p: *mut half::bf16, len: usize, bits: __m512i) {
        store_halves(p as *mut u16, len, _mm512_cvtepi32_epi16(bits))
    }

    /// `len` (≤ 16) 16-bit values at `p`, zero beyond. Full vectors load directly; a tail
    /// goes through a copy (masked 16-bit loads would need AVX512-BW).
    #[inline(always)]
    pub(crate) unsafe fn load_halves(p: *const u16, len: usize) -> __m256i {
        if len >= 16 {
            _mm256_loadu_si256(p as *const __m256i)
        } else {
            let mut tmp = [0u16; 16];
            std::ptr::copy_nonoverlapping(p, tmp.as_mut_ptr(), len);
            _mm256_loadu_si256(tmp.as_ptr() as *const __m256i)
        }
    }

    /// The first `len` (≤ 16) of 16 packed 16-bit values stored at `p` (a tail through a
    /// copy).
    #[inline(always)]
    pub(crate) unsafe fn store_halves(p: *mut u16, len: usize, packed: __m256i) {
        if len >= 16 {
            _mm256_storeu_si256(p as *mut __m256i, packed);
        } else {
            let mut tmp = [0u16; 16];
            _mm256_storeu_si256(tmp.as_mut_ptr() as *mut __m256i, packed);
            std::ptr::copy_nonoverlapping(tmp.as_ptr(), p, len);
        }
    }

    /// `dst[i] = src[i]` rounded to `T`, 16 at a time.
    ///
    /// # Safety
    /// AVX-512F is present; `dst` is valid for `src.len()` writes.
    #[target_feature(enable = "avx512f")]
    pub(crate) unsafe fn narrow_all<T: Lanes>(src: &[f32], dst: *mut T) {
        for (i, part) in src.chunks(16).enumerate() {
            T::store(
                dst.add(16 * i),
                part.len(),
                f32::load(part.as_ptr(), part.len()),
            );
        }
    }

    /// Sixteen bf16 bit patterns as f32 lanes (exact: the patterns become high halves).
    #[inline(always)]
    pub(crate) unsafe fn from_bf16(halves: __m256i) -> __m512 {
        _mm512_castsi512_ps(_mm512_slli_epi32::<16>(_mm512_cvtepu16_epi32(halves)))
    }

    /// The lanes of `x` rounded to bf16 (to nearest even, NaN made quiet): the 16-bit
    /// patterns in the low halves of 32-bit lanes.
    #[inline(always)]
    pub(crate) unsafe fn round_to_bf16(x: __m512) -> __m512i {
        let b = _mm512_castps_si512(x);
        let high = _mm512_srli_epi32::<16>(b);
        let lsb = _mm512_and_si512(high, _mm512_set1_epi32(1));
        let bias = _mm512_add_epi32(_mm512_set1_epi32(0x7FFF), lsb);
        let rounded = _mm512_srli_epi32::<16>(_mm512_add_epi32(b, bias));
        let nan = _mm512_cmp_ps_mask::<_CMP_UNORD_Q>(x, x);
        _mm512_mask_mov_epi32(rounded, nan, _mm512_or_si512(high, _mm512_set1_epi32(0x40)))
    }
}
