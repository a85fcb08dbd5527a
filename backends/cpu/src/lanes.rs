//! float32, bfloat16 or float16 as the f32 lanes of one vector register: sixteen to an
//! AVX-512 register, eight to an AVX2 one. How the vector kernels read and write these
//! types, so a half-precision tensor runs through a float32 kernel without a widened copy
//! in memory (the conversion happens in registers).
//!
//! bfloat16 widens exactly (its bits are the high half of an f32); stores round to nearest
//! even with NaNs made quiet, the same integer rounding as `buffer`'s scalar narrowing (one
//! rule, written once per register width: [`avx512::round_to_bf16`], [`avx2::round_to_bf16`]).
//! float16 converts with `vcvtph2ps` / `vcvtps2ph` (AVX-512F, or F16C beside AVX2: exact
//! widening; narrowing to nearest even, as the `half` crate rounds).

/// An element type the vector kernels load and store as f32 lanes: 16 with AVX-512, 8 with
/// AVX2 + F16C.
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
    /// `len` (≤ 8) elements at `p` as the f32 lanes of an AVX2 register, zero beyond.
    ///
    /// # Safety
    /// AVX2 and F16C are present; `p` is valid for `len` reads.
    #[cfg(target_arch = "x86_64")]
    unsafe fn load8(p: *const Self, len: usize) -> std::arch::x86_64::__m256;
    /// The first `len` (≤ 8) lanes of `v` stored at `p`, rounded to this type.
    ///
    /// # Safety
    /// AVX2 and F16C are present; `p` is valid for `len` writes.
    #[cfg(target_arch = "x86_64")]
    unsafe fn store8(p: *mut Self, len: usize, v: std::arch::x86_64::__m256);
    /// As [`Lanes::store8`] for lanes that hold values of this type exactly.
    ///
    /// # Safety
    /// As [`Lanes::store8`].
    #[cfg(target_arch = "x86_64")]
    unsafe fn store8_exact(p: *mut Self, len: usize, v: std::arch::x86_64::__m256);
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
    #[cfg(target_arch = "x86_64")]
    #[inline(always)]
    unsafe fn load8(p: *const f32, len: usize) -> std::arch::x86_64::__m256 {
        use std::arch::x86_64::*;
        if len >= 8 {
            _mm256_loadu_ps(p)
        } else {
            _mm256_maskload_ps(p, avx2::first(len))
        }
    }
    #[cfg(target_arch = "x86_64")]
    #[inline(always)]
    unsafe fn store8(p: *mut f32, len: usize, v: std::arch::x86_64::__m256) {
        use std::arch::x86_64::*;
        if len >= 8 {
            _mm256_storeu_ps(p, v)
        } else {
            _mm256_maskstore_ps(p, avx2::first(len), v)
        }
    }
    #[cfg(target_arch = "x86_64")]
    #[inline(always)]
    unsafe fn store8_exact(p: *mut f32, len: usize, v: std::arch::x86_64::__m256) {
        Self::store8(p, len, v)
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
    #[cfg(target_arch = "x86_64")]
    #[inline(always)]
    unsafe fn load8(p: *const half::bf16, len: usize) -> std::arch::x86_64::__m256 {
        avx2::from_bf16(avx2::load_halves(p as *const u16, len))
    }
    #[cfg(target_arch = "x86_64")]
    #[inline(always)]
    unsafe fn store8(p: *mut half::bf16, len: usize, v: std::arch::x86_64::__m256) {
        avx2::store_halves(
            p as *mut u16,
            len,
            avx2::pack_low_halves(avx2::round_to_bf16(v)),
        )
    }
    #[cfg(target_arch = "x86_64")]
    #[inline(always)]
    unsafe fn store8_exact(p: *mut half::bf16, len: usize, v: std::arch::x86_64::__m256) {
        use std::arch::x86_64::*;
        let high = _mm256_srli_epi32::<16>(_mm256_castps_si256(v));
        avx2::store_halves(p as *mut u16, len, avx2::pack_low_halves(high))
    }
    fn as_f32(_: &[half::bf16]) -> Option<&[f32]> {
        None
    }
    fn widen_into(src: &[half::bf16], dst: &mut [f32]) {
        let n = src.len().min(dst.len());
        // SAFETY: dst has room for n elements.
        unsafe { crate::buffer::widen_uninit(&src[..n], dst.as_mut_ptr()) }
    }
    unsafe fn narrow_to(src: &[f32], dst: *mut half::bf16) {
        crate::buffer::narrow_uninit(src, dst)
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
    #[cfg(target_arch = "x86_64")]
    #[inline(always)]
    unsafe fn load8(p: *const half::f16, len: usize) -> std::arch::x86_64::__m256 {
        std::arch::x86_64::_mm256_cvtph_ps(avx2::load_halves(p as *const u16, len))
    }
    #[cfg(target_arch = "x86_64")]
    #[inline(always)]
    unsafe fn store8(p: *mut half::f16, len: usize, v: std::arch::x86_64::__m256) {
        use std::arch::x86_64::*;
        // F16C's immediate is the rounding mode alone (to nearest even).
        let packed = _mm256_cvtps_ph::<_MM_FROUND_TO_NEAREST_INT>(v);
        avx2::store_halves(p as *mut u16, len, packed)
    }
    #[cfg(target_arch = "x86_64")]
    #[inline(always)]
    unsafe fn store8_exact(p: *mut half::f16, len: usize, v: std::arch::x86_64::__m256) {
        Self::store8(p, len, v)
    }
    fn as_f32(_: &[half::f16]) -> Option<&[f32]> {
        None
    }
    fn widen_into(src: &[half::f16], dst: &mut [f32]) {
        let n = src.len().min(dst.len());
        // SAFETY: dst has room for n elements.
        unsafe { crate::buffer::widen_uninit(&src[..n], dst.as_mut_ptr()) }
    }
    unsafe fn narrow_to(src: &[f32], dst: *mut half::f16) {
        crate::buffer::narrow_uninit(src, dst)
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

    /// `dst[i] = src[i]` widened to f32 (exact), 16 at a time.
    ///
    /// # Safety
    /// AVX-512F is present; `dst` is valid for `src.len()` writes.
    #[target_feature(enable = "avx512f")]
    pub(crate) unsafe fn widen_all<T: Lanes>(src: &[T], dst: *mut f32) {
        for (i, part) in src.chunks(16).enumerate() {
            f32::store(
                dst.add(16 * i),
                part.len(),
                T::load(part.as_ptr(), part.len()),
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

#[cfg(target_arch = "x86_64")]
pub(crate) mod avx2 {
    use super::Lanes;
    use std::arch::x86_64::*;

    /// The first `len` (≤ 8) lanes: all ones where included (the mask of AVX2's masked
    /// loads and stores).
    #[inline(always)]
    pub(crate) unsafe fn first(len: usize) -> __m256i {
        _mm256_cmpgt_epi32(
            _mm256_set1_epi32(len.min(8) as i32),
            _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7),
        )
    }

    /// `len` (≤ 8) 16-bit values at `p`, zero beyond (a tail through a copy: AVX2 has no
    /// 16-bit masked load).
    #[inline(always)]
    pub(crate) unsafe fn load_halves(p: *const u16, len: usize) -> __m128i {
        if len >= 8 {
            _mm_loadu_si128(p as *const __m128i)
        } else {
            let mut tmp = [0u16; 8];
            std::ptr::copy_nonoverlapping(p, tmp.as_mut_ptr(), len);
            _mm_loadu_si128(tmp.as_ptr() as *const __m128i)
        }
    }

    /// The first `len` (≤ 8) of 8 packed 16-bit values stored at `p` (a tail through a
    /// copy).
    #[inline(always)]
    pub(crate) unsafe fn store_halves(p: *mut u16, len: usize, packed: __m128i) {
        if len >= 8 {
            _mm_storeu_si128(p as *mut __m128i, packed);
        } else {
            let mut tmp = [0u16; 8];
            _mm_storeu_si128(tmp.as_mut_ptr() as *mut __m128i, packed);
            std::ptr::copy_nonoverlapping(tmp.as_ptr(), p, len);
        }
    }

    /// The low 16 bits of each 32-bit lane of `bits`, in order (every lane holds a value
    /// below 2^16, so the unsigned saturating pack keeps it).
    #[inline(always)]
    pub(crate) unsafe fn pack_low_halves(bits: __m256i) -> __m128i {
        _mm_packus_epi32(
            _mm256_castsi256_si128(bits),
            _mm256_extracti128_si256::<1>(bits),
        )
    }

    /// Eight bf16 bit patterns as f32 lanes (exact: the patterns become high halves).
    #[inline(always)]
    pub(crate) unsafe fn from_bf16(halves: __m128i) -> __m256 {
        _mm256_castsi256_ps(_mm256_slli_epi32::<16>(_mm256_cvtepu16_epi32(halves)))
    }

    /// The lanes of `x` rounded to bf16 (to nearest even, NaN made quiet): the 16-bit
    /// patterns in the low halves of 32-bit lanes. [`super::avx512::round_to_bf16`]'s
    /// arithmetic on eight lanes.
    #[inline(always)]
    pub(crate) unsafe fn round_to_bf16(x: __m256) -> __m256i {
        let b = _mm256_castps_si256(x);
        let high = _mm256_srli_epi32::<16>(b);
        let lsb = _mm256_and_si256(high, _mm256_set1_epi32(1));
        let bias = _mm256_add_epi32(_mm256_set1_epi32(0x7FFF), lsb);
        let rounded = _mm256_srli_epi32::<16>(_mm256_add_epi32(b, bias));
        let nan = _mm256_castps_si256(_mm256_cmp_ps::<_CMP_UNORD_Q>(x, x));
        let quiet = _mm256_or_si256(high, _mm256_set1_epi32(0x40));
        _mm256_blendv_epi8(rounded, quiet, nan)
    }

    /// `dst[i] = src[i]` rounded to `T`, 8 at a time.
    ///
    /// # Safety
    /// AVX2 and F16C are present; `dst` is valid for `src.len()` writes.
    #[target_feature(enable = "avx2,fma,f16c")]
    pub(crate) unsafe fn narrow_all<T: Lanes>(src: &[f32], dst: *mut T) {
        for (i, part) in src.chunks(8).enumerate() {
            T::store8(
                dst.add(8 * i),
                part.len(),
                f32::load8(part.as_ptr(), part.len()),
            );
        }
    }

    /// `dst[i] = src[i]` widened to f32 (exact), 8 at a time.
    ///
    /// # Safety
    /// AVX2 and F16C are present; `dst` is valid for `src.len()` writes.
    #[target_feature(enable = "avx2,fma,f16c")]
    pub(crate) unsafe fn widen_all<T: Lanes>(src: &[T], dst: *mut f32) {
        for (i, part) in src.chunks(8).enumerate() {
            f32::store8(
                dst.add(8 * i),
                part.len(),
                T::load8(part.as_ptr(), part.len()),
            );
        }
    }
}

#[cfg(all(test, target_arch = "x86_64"))]
mod tests {
    use super::Lanes;
    use half::{bf16, f16};

    /// float32 values at and around every bf16 and f16 rounding boundary (each half
    /// pattern widened, one below, halfway and one above the next half value), the
    /// specials, and a sweep of other bit patterns; 13 past a multiple of 16, so both
    /// register widths end in a tail.
    fn boundaries() -> Vec<f32> {
        let mut bits: Vec<u32> = Vec::new();
        for h in 0..=u16::MAX as u32 {
            let b = h << 16;
            bits.extend([b, b | 0x7FFF, b | 0x8000, b | 0x8001, b | 0xFFFF]);
            let f = f16::from_bits(h as u16).to_f32().to_bits();
            bits.extend([
                f,
                f.wrapping_add(0x0FFF),
                f.wrapping_add(0x1000),
                f + 0x1001,
            ]);
        }
        bits.extend((0..u32::MAX / 7919).map(|i| i.wrapping_mul(7919)));
        bits.extend([
            0x7F80_0001,
            0xFF80_0001,
            0x7FC0_0000,
            0x0000_0001,
            0x8000_0000,
        ]);
        while bits.len() % 16 != 13 {
            bits.push(bits.len() as u32);
        }
        bits.into_iter().map(f32::from_bits).collect()
    }

    /// `narrow` then `widen` at one register width against the `half` crate's scalar
    /// conversions, bit for bit.
    fn matches_half_crate<H: Lanes>(
        name: &str,
        narrow: unsafe fn(&[f32], *mut H),
        widen: unsafe fn(&[H], *mut f32),
        of: fn(f32) -> H,
        to_bits: fn(H) -> u16,
        to_f32: fn(H) -> f32,
    ) {
        let xs = boundaries();
        let mut halves: Vec<H> = Vec::with_capacity(xs.len());
        // SAFETY: the caller checked the instruction set; room for xs.len() elements.
        unsafe {
            narrow(&xs, halves.as_mut_ptr());
            halves.set_len(xs.len());
        }
        for (x, h) in xs.iter().zip(&halves) {
            assert_eq!(
                to_bits(*h),
                to_bits(of(*x)),
                "{name}: {x:e} ({:#010x}) narrowed",
                x.to_bits()
            );
        }
        let every: Vec<H> = (0..=u16::MAX)
            .map(|b| of(f32::from_bits((b as u32) << 16)))
            .chain(halves)
            .collect();
        let mut wide: Vec<f32> = Vec::with_capacity(every.len());
        // SAFETY: as above.
        unsafe {
            widen(&every, wide.as_mut_ptr());
            wide.set_len(every.len());
        }
        for (h, w) in every.iter().zip(&wide) {
            let want = to_f32(*h);
            assert!(
                w.to_bits() == want.to_bits() || (w.is_nan() && want.is_nan()),
                "{name}: {:#06x} widened to {:#010x}, not {:#010x}",
                to_bits(*h),
                w.to_bits(),
                want.to_bits()
            );
        }
    }

    /// The AVX2 and AVX-512 loads and stores round and widen as the `half` crate does,
    /// every pattern, NaNs, infinities, subnormals and ties included, tails too.
    #[test]
    fn register_conversions_match_the_half_crate_bit_for_bit() {
        if crate::simd::has_avx2() {
            matches_half_crate(
                "bf16 avx2",
                super::avx2::narrow_all::<bf16>,
                super::avx2::widen_all::<bf16>,
                bf16::from_f32,
                bf16::to_bits,
                bf16::to_f32,
            );
            matches_half_crate(
                "f16 avx2",
                super::avx2::narrow_all::<f16>,
                super::avx2::widen_all::<f16>,
                f16::from_f32,
                f16::to_bits,
                f16::to_f32,
            );
        } else {
            ferroflow_tensor::testing::skip(
                "FERROFLOW_REQUIRE_AVX512",
                "no AVX2 + FMA + F16C here (or FERROFLOW_CPU_ISA=scalar); the AVX2 conversions do not run",
            );
        }
        if crate::simd::has_avx512() {
            matches_half_crate(
                "bf16 avx512",
                super::avx512::narrow_all::<bf16>,
                super::avx512::widen_all::<bf16>,
                bf16::from_f32,
                bf16::to_bits,
                bf16::to_f32,
            );
            matches_half_crate(
                "f16 avx512",
                super::avx512::narrow_all::<f16>,
                super::avx512::widen_all::<f16>,
                f16::from_f32,
                f16::to_bits,
                f16::to_f32,
            );
        } else {
            ferroflow_tensor::testing::skip(
                "FERROFLOW_REQUIRE_AVX512",
                "no AVX-512F here (or FERROFLOW_CPU_ISA caps it); the AVX-512 conversions do not run",
            );
        }
    }
}
