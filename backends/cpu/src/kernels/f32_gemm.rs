//! float32 matrix products on AVX-512 for the shapes training produces: one side a batch
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
//! Chosen at run time on CPUs with AVX-512 ([`crate::simd::has_avx512`]); elsewhere the
//! products go to `gemm` as before.

use super::matmul::StridedMatrix;

/// Rows of a register tile.
pub(super) const MR: usize = 8;
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
        if !suits(m, n, k) {
            return false;
        }
        assert!(
            dst.len() >= m * n && lhs.fits(m, k) && rhs.fits(k, n),
            "native_gemm: operands out of bounds"
        );
        // SAFETY: `suits` checked AVX-512; the assert keeps every access in bounds, and dst
        // holds initialised values (read only when accumulating).
        unsafe { gemm_f32(dst.as_mut_ptr(), m, n, k, lhs, rhs, accumulate) };
        true
    }
}

/// Whether this kernel takes an `m x k · k x n` product: AVX-512 present and the product
/// thin, a batch of rows (m ≤ 256) or a short inner dimension (k ≤ 256, weight gradients).
/// Measured against `gemm` on two cores: 1.0-1.3x on MLP shapes (batch 32 and 128), 1.5x
/// with k = 9; `gemm`'s blocking wins on tall products with long rows (25088x288 · 288x64,
/// an im2col convolution: 0.8x) and on large square ones, so those stay with it.
pub(crate) fn suits(m: usize, n: usize, k: usize) -> bool {
    crate::simd::has_avx512() && m > 0 && n > 0 && m.min(k) <= 256
}

/// `dst = [dst +] lhs · rhs` with `dst` dense row-major (`m x n`), split across threads.
///
/// # Safety
/// The CPU has AVX-512F; `dst` is valid for `m * n` writes (and reads of initialised
/// values when `accumulate`); both operands fit their slices.
pub(crate) unsafe fn gemm_f32(
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
    let run = |rows: (usize, usize), cols: (usize, usize)| {
        // SAFETY: the caller's guarantees, for a sub-block of the output.
        unsafe { block(out.get(), n, rows, cols, k, &lhs, &rhs, accumulate) }
    };
    if threads < 2 || m * n * k < PAR_MACS {
        run((0, m), (0, n));
    } else if m >= n && (m.div_ceil(CHUNKS_PER_THREAD * threads) >= MIN_ROWS_PER_PACK || n < 2 * NR)
    {
        // Row tiles; every chunk packs the (short) right operand again.
        let rows = (m.div_ceil(CHUNKS_PER_THREAD * threads)).next_multiple_of(MR);
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

/// The output rows `rows.0..rows.1` by columns `cols.0..cols.1`.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx512f")]
#[allow(clippy::too_many_arguments)]
unsafe fn block(
    dst: *mut f32,
    ldc: usize,
    rows: (usize, usize),
    cols: (usize, usize),
    k: usize,
    lhs: &StridedMatrix<'_, f32>,
    rhs: &StridedMatrix<'_, f32>,
    accumulate: bool,
) {
    thread_local! {
        static PACK: std::cell::RefCell<Vec<f32>> = const { std::cell::RefCell::new(Vec::new()) };
    }
    let a = lhs.data.as_ptr().add(lhs.offset);
    let b = rhs.data.as_ptr().add(rhs.offset);
    // One row tile: B is read once, in place when its rows are contiguous.
    let in_place = rhs.cs == 1 && rows.1 - rows.0 <= MR;
    PACK.with_borrow_mut(|pack| {
        if !in_place && pack.len() < KC * NC {
            pack.resize(KC * NC, 0.0);
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
                        pack_panel(
                            block_at.offset((q * NR) as isize * rhs.cs),
                            (rhs.rs, rhs.cs),
                            kc,
                            NR.min(ncols - q * NR),
                            pack.as_mut_ptr().add(q * KC * NR),
                        );
                    }
                }
                // Each row tile of A (8 x kc, L1-resident) meets every panel of the block.
                let mut i0 = rows.0;
                while i0 < rows.1 {
                    let h = MR.min(rows.1 - i0);
                    for q in 0..panels {
                        let (bp, b_rs) = if in_place {
                            (block_at.add(q * NR), rhs.rs)
                        } else {
                            (pack.as_ptr().add(q * KC * NR), NR as isize)
                        };
                        Tile {
                            a: a.offset(i0 as isize * lhs.rs + k0 as isize * lhs.cs),
                            rows: std::array::from_fn(|r| r as isize * lhs.rs),
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
                        }
                        .run_rows(h);
                    }
                    i0 += h;
                }
            }
        }
    });
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
        // Strided both ways: element by element, along k.
        for j in 0..width {
            let s = src.offset(j as isize * cs);
            for p in 0..kc {
                *dst.add(p * NR + j) = *s.offset(p as isize * rs);
            }
        }
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
unsafe fn block(
    _dst: *mut f32,
    _ldc: usize,
    _rows: (usize, usize),
    _cols: (usize, usize),
    _k: usize,
    _lhs: &StridedMatrix<'_, f32>,
    _rhs: &StridedMatrix<'_, f32>,
    _accumulate: bool,
) {
    unreachable!("native_gemm is only chosen on x86-64 with AVX-512")
}

/// One register tile: `C[0..R, 0..width] = [C +] A[0..R, 0..kc] · B[0..kc, 0..width]`.
///
/// Row `r` of A starts at `a + rows[r]`; its `kc` steps of k are `segments.len()` runs of
/// `seg_len` elements `a_cs` apart, run `s` starting `segments[s]` further on. A matrix
/// product has one run and evenly spaced rows; a direct convolution has one run per filter
/// tap (`kh·kw` runs of `cin` channels) and rows at the output pixels' windows, which need
/// not be evenly spaced (a tile may wrap to the next output row). B advances `b_rs` per step.
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
            if !crate::simd::has_avx512() {
                eprintln!("skipped: this CPU has no AVX-512, the kernel under test never runs");
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
            let mut c: Vec<f32> = (0..m * n).map(|i| value(i + 13)).collect();
            let want = reference((m, n, k), &a, &b, &c, accumulate);
            prop_assert!(f32::native_gemm(&mut c, (m, n, k), a, b, accumulate));
            for (i, (&g, &w)) in c.iter().zip(&want).enumerate() {
                prop_assert!(
                    (g as f64 - w).abs() <= 1e-5 * (k as f64 + 1.0),
                    "({}, {}): {} vs {}", i / n, i % n, g, w
                );
            }
        }
    }

    #[test]
    fn transposed_panels_pack_like_element_by_element() {
        if !crate::simd::has_avx512() {
            eprintln!("skipped: this CPU has no AVX-512, the kernel under test never runs");
            return;
        }
        for (kc, width) in [(16, 16), (128, 32), (37, 21), (5, 3), (1, 32)] {
            let cs = kc + 3;
            let src: Vec<f32> = (0..width * cs).map(|i| i as f32).collect();
            let mut got = vec![f32::NAN; kc * NR];
            // SAFETY: AVX-512 checked; src holds width rows of cs >= kc values, got kc x NR.
            unsafe { pack_transposed(src.as_ptr(), cs as isize, kc, width, got.as_mut_ptr()) };
            for p in 0..kc {
                for j in 0..width {
                    assert_eq!(
                        got[p * NR + j],
                        src[j * cs + p],
                        "kc {kc} width {width} ({p}, {j})"
                    );
                }
            }
        }
    }

    #[test]
    fn an_empty_inner_dimension_gives_zeros_or_leaves_the_sum() {
        if !suits(2, 3, 0) {
            eprintln!("skipped: this CPU has no AVX-512, the kernel under test never runs");
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
