//! bfloat16 matrix products with float32 accumulation on AVX512-BF16 (`vdpbf16ps`: 32
//! bf16 multiply-adds per instruction, twice an f32 FMA's), chosen at run time. Callers fall
//! back to widening to float32 where the CPU lacks the instruction.
//!
//! Packing: `B` goes into panels of [`NR`] columns where each 32-bit lane holds the pair
//! `(B[2p][j], B[2p+1][j])`; rows of `A` go into blocks of [`MR`] rows holding the pair
//! `(A[i][2p], A[i][2p+1])`, broadcast to every lane. One `vdpbf16ps` then adds
//! `A[i][2p]·B[2p][j] + A[i][2p+1]·B[2p+1][j]` to lane `j`: an `MR x NR` tile of
//! accumulators (16 zmm registers) advances two steps of `k` per instruction pair.

use half::bf16;
use rayon::prelude::*;

use super::matmul::StridedMatrix;

/// Rows of a register tile.
const MR: usize = 8;
/// Columns of a register tile (two zmm registers of f32).
const NR: usize = 32;
/// Rows each parallel task handles (a multiple of `MR`).
const ROWS_PER_TASK: usize = 4 * MR;

/// Whether this CPU runs `vdpbf16ps` (checked once).
pub(crate) fn available() -> bool {
    #[cfg(target_arch = "x86_64")]
    {
        static HAS: std::sync::OnceLock<bool> = std::sync::OnceLock::new();
        *HAS.get_or_init(|| {
            crate::simd::has_avx512() && std::is_x86_feature_detected!("avx512bf16")
        })
    }
    #[cfg(not(target_arch = "x86_64"))]
    false
}

fn at(m: &StridedMatrix<'_, bf16>, i: usize, j: usize) -> u16 {
    m.data[(m.offset as isize + i as isize * m.rs + j as isize * m.cs) as usize].to_bits()
}

fn pair(lo: u16, hi: u16) -> u32 {
    lo as u32 | (hi as u32) << 16
}

/// The pair `(M[i][j], M[i][j + 1])` (0 past column `cols`), read as one `u32` when the
/// two are adjacent in memory.
#[inline(always)]
fn pair_along_row(m: &StridedMatrix<'_, bf16>, i: usize, j: usize, cols: usize) -> u32 {
    let o = (m.offset as isize + i as isize * m.rs + j as isize * m.cs) as usize;
    if j + 1 < cols {
        if m.cs == 1 {
            pair(m.data[o].to_bits(), m.data[o + 1].to_bits())
        } else {
            pair(m.data[o].to_bits(), at(m, i, j + 1))
        }
    } else {
        pair(m.data[o].to_bits(), 0)
    }
}

/// The pair `(M[i][j], M[i + 1][j])` (0 past row `rows`).
#[inline(always)]
fn pair_along_column(m: &StridedMatrix<'_, bf16>, i: usize, j: usize, rows: usize) -> u32 {
    let o = (m.offset as isize + i as isize * m.rs + j as isize * m.cs) as usize;
    let hi = if i + 1 < rows {
        m.data[(o as isize + m.rs) as usize].to_bits()
    } else {
        0
    };
    pair(m.data[o].to_bits(), hi)
}

/// `dst (m x n, dense row-major f32) = [dst +] lhs (m x k) · rhs (k x n)`, bf16 operands.
///
/// # Panics
/// When [`available`] is false (callers check), or when an operand is out of bounds.
#[allow(clippy::too_many_arguments)]
pub(crate) fn gemm_bf16_into(
    dst: &mut [f32],
    m: usize,
    n: usize,
    k: usize,
    lhs: StridedMatrix<'_, bf16>,
    rhs: StridedMatrix<'_, bf16>,
    accumulate: bool,
) {
    assert!(available(), "gemm_bf16_into needs AVX512-BF16");
    assert!(
        dst.len() >= m * n && lhs.fits(m, k) && rhs.fits(k, n),
        "gemm_bf16_into: operands out of bounds"
    );
    if m == 0 || n == 0 {
        return;
    }
    if k == 0 {
        if !accumulate {
            dst[..m * n].fill(0.0);
        }
        return;
    }
    let kp = k.div_ceil(2);
    let panels = n.div_ceil(NR);
    // B, packed once: panel q, pair p, column j.
    let mut bpack = vec![0u32; panels * kp * NR];
    bpack
        .par_chunks_mut(kp * NR)
        .enumerate()
        .for_each(|(q, panel)| {
            let cols = NR.min(n - q * NR);
            if rhs.cs == 1 && cols == NR {
                // Row-major full panel: two rows' 32 values interleaved 16 at a time.
                let base = rhs.data.as_ptr() as *const u16;
                for p in 0..kp {
                    let row = |i: usize| {
                        (rhs.offset as isize + i as isize * rhs.rs + (q * NR) as isize) as usize
                    };
                    let hi = (2 * p + 1 < k).then(|| row(2 * p + 1));
                    // SAFETY: available() was asserted (AVX-512F); `fits` checked that rows
                    // 2p, 2p+1 (< k) hold columns q·NR..q·NR+NR; the panel holds NR pairs.
                    unsafe {
                        interleave_rows(
                            base.add(row(2 * p)),
                            hi.map(|h| base.add(h)),
                            panel[p * NR..].as_mut_ptr(),
                        )
                    };
                }
                return;
            }
            if rhs.rs == 1 {
                // Column-major B (a transposed view): each column's pairs are consecutive
                // u32s, read along the column and spread over the panel's pair rows.
                for j in 0..cols {
                    let start = (rhs.offset as isize + ((q * NR + j) as isize) * rhs.cs) as usize;
                    let column = &rhs.data[start..start + k];
                    for (p, two) in column.chunks_exact(2).enumerate() {
                        panel[p * NR + j] = pair(two[0].to_bits(), two[1].to_bits());
                    }
                    if k % 2 == 1 {
                        panel[(kp - 1) * NR + j] = pair(column[k - 1].to_bits(), 0);
                    }
                }
                return;
            }
            for p in 0..kp {
                let dst = &mut panel[p * NR..p * NR + cols];
                for (j, d) in dst.iter_mut().enumerate() {
                    *d = pair_along_column(&rhs, 2 * p, q * NR + j, k);
                }
            }
        });
    let task = |(t, rows): (usize, &mut [f32])| {
        let mut apack = vec![0u32; kp * MR];
        let row0 = t * ROWS_PER_TASK;
        let nrows = rows.len() / n;
        for b0 in (0..nrows).step_by(MR) {
            let valid = MR.min(nrows - b0);
            if valid < MR {
                apack.fill(0);
            }
            if lhs.rs == 1 {
                // A column-major (a transposed view): columns 2p and 2p+1 of the block's
                // rows are runs of `valid` values each.
                let first = lhs.offset as isize + (row0 + b0) as isize;
                let column = |c: usize| {
                    let start = (first + c as isize * lhs.cs) as usize;
                    &lhs.data[start..start + valid]
                };
                for p in 0..kp {
                    let lo = column(2 * p);
                    let dst = &mut apack[p * MR..p * MR + valid];
                    if 2 * p + 1 < k {
                        let hi = column(2 * p + 1);
                        for ((d, l), h) in dst.iter_mut().zip(lo).zip(hi) {
                            *d = pair(l.to_bits(), h.to_bits());
                        }
                    } else {
                        for (d, l) in dst.iter_mut().zip(lo) {
                            *d = pair(l.to_bits(), 0);
                        }
                    }
                }
            } else if lhs.cs == 1 {
                // Rows contiguous: each pair is one (unaligned) u32 of the row, low half
                // first (x86 is little-endian).
                for r in 0..valid {
                    let i = row0 + b0 + r;
                    let start = (lhs.offset as isize + i as isize * lhs.rs) as usize;
                    let row = &lhs.data[start..start + k];
                    for (p, pair) in row.chunks_exact(2).enumerate() {
                        apack[p * MR + r] = self::pair(pair[0].to_bits(), pair[1].to_bits());
                    }
                    if k % 2 == 1 {
                        apack[(kp - 1) * MR + r] = self::pair(row[k - 1].to_bits(), 0);
                    }
                }
            } else {
                for r in 0..valid {
                    let i = row0 + b0 + r;
                    for p in 0..kp {
                        apack[p * MR + r] = pair_along_row(&lhs, i, 2 * p, k);
                    }
                }
            }
            for q in 0..panels {
                let cols = NR.min(n - q * NR);
                let out = &mut rows[b0 * n..];
                // SAFETY: `available()` was asserted; the packed buffers hold `kp` pairs of
                // MR rows and NR columns; the tile writes `valid` rows of `cols` columns, all
                // inside `rows` (n columns per row, `valid` rows left from b0).
                unsafe {
                    tile(
                        apack.as_ptr(),
                        bpack.as_ptr().add(q * kp * NR),
                        kp,
                        out.as_mut_ptr().add(q * NR),
                        n,
                        valid,
                        cols,
                        accumulate,
                    );
                }
            }
        }
    };
    let dst = &mut dst[..m * n];
    if m * n * k >= 1 << 18 {
        dst.par_chunks_mut(ROWS_PER_TASK * n)
            .enumerate()
            .for_each(task);
    } else {
        dst.chunks_mut(ROWS_PER_TASK * n).enumerate().for_each(task);
    }
}

/// `dst[j] = (lo[j], hi[j])` as bf16 pairs for the `NR` columns (`hi` zero when `None`).
///
/// # Safety
/// AVX-512F is present; `lo` and `hi` hold `NR` values, `dst` room for `NR` pairs.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx512f")]
unsafe fn interleave_rows(lo: *const u16, hi: Option<*const u16>, dst: *mut u32) {
    use std::arch::x86_64::*;
    for h in (0..NR).step_by(16) {
        let low = _mm512_cvtepu16_epi32(_mm256_loadu_si256(lo.add(h) as *const __m256i));
        let pairs = match hi {
            Some(hi) => {
                let high = _mm512_cvtepu16_epi32(_mm256_loadu_si256(hi.add(h) as *const __m256i));
                _mm512_or_si512(low, _mm512_slli_epi32::<16>(high))
            }
            None => low,
        };
        _mm512_storeu_si512(dst.add(h) as *mut __m512i, pairs);
    }
}

#[cfg(not(target_arch = "x86_64"))]
unsafe fn interleave_rows(_: *const u16, _: Option<*const u16>, _: *mut u32) {
    unreachable!("available() is false off x86_64")
}

/// One `MR x NR` tile: accumulates `kp` pairs, then writes `valid x cols` of it to `c`
/// (row stride `ldc`), adding to what is there when `accumulate`.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx512f,avx512bf16")]
#[allow(clippy::too_many_arguments)]
unsafe fn tile(
    a: *const u32,
    b: *const u32,
    kp: usize,
    c: *mut f32,
    ldc: usize,
    valid: usize,
    cols: usize,
    accumulate: bool,
) {
    use std::arch::x86_64::*;
    let mut acc = [_mm512_setzero_ps(); 2 * MR];
    for p in 0..kp {
        let b0: __m512bh = std::mem::transmute(_mm512_loadu_si512(b.add(p * NR) as *const _));
        let b1: __m512bh = std::mem::transmute(_mm512_loadu_si512(b.add(p * NR + 16) as *const _));
        for r in 0..MR {
            let av: __m512bh = std::mem::transmute(_mm512_set1_epi32(*a.add(p * MR + r) as i32));
            acc[2 * r] = _mm512_dpbf16_ps(acc[2 * r], av, b0);
            acc[2 * r + 1] = _mm512_dpbf16_ps(acc[2 * r + 1], av, b1);
        }
    }
    let m0: __mmask16 = if cols >= 16 {
        0xFFFF
    } else {
        (1u32 << cols) as u16 - 1
    };
    let m1: __mmask16 = if cols >= 32 {
        0xFFFF
    } else if cols > 16 {
        (1u32 << (cols - 16)) as u16 - 1
    } else {
        0
    };
    for r in 0..valid {
        let row = c.add(r * ldc);
        let (mut v0, mut v1) = (acc[2 * r], acc[2 * r + 1]);
        if accumulate {
            v0 = _mm512_add_ps(v0, _mm512_maskz_loadu_ps(m0, row));
            v1 = _mm512_add_ps(v1, _mm512_maskz_loadu_ps(m1, row.add(16)));
        }
        _mm512_mask_storeu_ps(row, m0, v0);
        _mm512_mask_storeu_ps(row.add(16), m1, v1);
    }
}

#[cfg(not(target_arch = "x86_64"))]
#[allow(clippy::too_many_arguments)]
unsafe fn tile(
    _a: *const u32,
    _b: *const u32,
    _kp: usize,
    _c: *mut f32,
    _ldc: usize,
    _valid: usize,
    _cols: usize,
    _accumulate: bool,
) {
    unreachable!("available() is false off x86_64")
}

#[cfg(test)]
mod tests {
    use super::*;

    fn reference(a: &[bf16], b: &[bf16], m: usize, k: usize, n: usize) -> Vec<f64> {
        let mut c = vec![0.0; m * n];
        for i in 0..m {
            for j in 0..n {
                c[i * n + j] = (0..k)
                    .map(|p| a[i * k + p].to_f64() * b[p * n + j].to_f64())
                    .sum();
            }
        }
        c
    }

    #[test]
    fn matches_a_float64_reference_on_ragged_shapes_and_strides() {
        if !available() {
            return ferroflow_tensor::testing::skip(
                "FERROFLOW_REQUIRE_AVX512",
                "this CPU has no AVX512-BF16; the bf16 GEMM does not run",
            );
        }
        let val = |i: usize| bf16::from_f32(((i * 7919 % 97) as f32 - 48.0) / 16.0);
        for (m, k, n) in [
            (1, 1, 1),
            (3, 5, 7),
            (8, 2, 32),
            (9, 17, 33),
            (70, 31, 65),
            (33, 128, 40),
        ] {
            let a: Vec<bf16> = (0..m * k).map(val).collect();
            let b: Vec<bf16> = (0..k * n).map(|i| val(i + 13)).collect();
            let want = reference(&a, &b, m, k, n);
            let lhs = StridedMatrix {
                data: &a,
                offset: 0,
                rs: k as isize,
                cs: 1,
            };
            let rhs = StridedMatrix {
                data: &b,
                offset: 0,
                rs: n as isize,
                cs: 1,
            };
            let mut c = vec![0f32; m * n];
            gemm_bf16_into(&mut c, m, n, k, lhs, rhs, false);
            for (g, w) in c.iter().zip(&want) {
                assert!(
                    (*g as f64 - w).abs() <= 1e-5 * (1.0 + w.abs()),
                    "{m}x{k}x{n}: {g} vs {w}"
                );
            }
            // Accumulating, and reading B transposed (column stride n -> row stride 1).
            let bt: Vec<bf16> = (0..n * k).map(|i| b[(i % k) * n + i / k]).collect();
            let rhs_t = StridedMatrix {
                data: &bt,
                offset: 0,
                rs: 1,
                cs: k as isize,
            };
            gemm_bf16_into(&mut c, m, n, k, lhs, rhs_t, true);
            for (g, w) in c.iter().zip(&want) {
                assert!(
                    (*g as f64 - 2.0 * w).abs() <= 2e-5 * (1.0 + w.abs()),
                    "{m}x{k}x{n} accumulate"
                );
            }
            // A transposed (row stride 1, column stride m), B transposed.
            let at: Vec<bf16> = (0..m * k).map(|i| a[(i % m) * k + i / m]).collect();
            let lhs_t = StridedMatrix {
                data: &at,
                offset: 0,
                rs: 1,
                cs: m as isize,
            };
            gemm_bf16_into(&mut c, m, n, k, lhs_t, rhs_t, false);
            for (g, w) in c.iter().zip(&want) {
                assert!(
                    (*g as f64 - w).abs() <= 1e-5 * (1.0 + w.abs()),
                    "{m}x{k}x{n} transposed operands"
                );
            }
        }
    }
}
