//! Batched matmul through the `gemm` crate (f32, f64; f16 widened to f32; bf16 on
//! AVX512-BF16 or widened), reading the operands' strides directly so transposed and
//! broadcast inputs are never copied.
//! Integers use a plain triple loop.

use super::f32_gemm::NativeGemm;
use crate::buffer::{host, narrow, widen};
use ferroflow_tensor::{
    backend::unsupported, Complex32, Complex64, DType, HostData, Layout, Operand, Result,
};
use gemm::Parallelism;
use rayon::prelude::*;

/// Offsets of every batch matrix for a `[..batch, r, c]` layout.
fn batch_offsets(l: &Layout) -> Vec<usize> {
    let rank = l.rank();
    let batch = Layout::new(
        l.shape()[..rank - 2].to_vec(),
        l.strides()[..rank - 2].to_vec(),
        l.offset(),
    );
    let mut v = Vec::with_capacity(batch.num_elements());
    batch.for_each_offset(|o| v.push(o));
    v
}

struct Dims {
    m: usize,
    k: usize,
    n: usize,
    a_rs: isize,
    a_cs: isize,
    b_rs: isize,
    b_cs: isize,
}

impl Dims {
    /// One batch's `(lhs, rhs)` matrices, starting at offsets `oa` and `ob`.
    fn operands<'a, T>(
        &self,
        a: &'a [T],
        oa: usize,
        b: &'a [T],
        ob: usize,
    ) -> (StridedMatrix<'a, T>, StridedMatrix<'a, T>) {
        (
            StridedMatrix {
                data: a,
                offset: oa,
                rs: self.a_rs,
                cs: self.a_cs,
            },
            StridedMatrix {
                data: b,
                offset: ob,
                rs: self.b_rs,
                cs: self.b_cs,
            },
        )
    }
}

fn dims(la: &Layout, lb: &Layout) -> Dims {
    let (ra, rb) = (la.rank(), lb.rank());
    Dims {
        m: la.shape()[ra - 2],
        k: la.shape()[ra - 1],
        n: lb.shape()[rb - 1],
        a_rs: la.strides()[ra - 2],
        a_cs: la.strides()[ra - 1],
        b_rs: lb.strides()[rb - 2],
        b_cs: lb.strides()[rb - 1],
    }
}

/// A matrix inside a buffer: element (i, j) is `data[offset + i·rs + j·cs]`.
#[derive(Clone, Copy)]
pub(crate) struct StridedMatrix<'a, T> {
    pub data: &'a [T],
    pub offset: usize,
    pub rs: isize,
    pub cs: isize,
}

impl<T> StridedMatrix<'_, T> {
    /// True when every element of an `r x c` matrix lies inside `data`.
    pub(crate) fn fits(&self, r: usize, c: usize) -> bool {
        if r == 0 || c == 0 {
            return true;
        }
        let corners = [
            0,
            (r as isize - 1) * self.rs,
            (c as isize - 1) * self.cs,
            (r as isize - 1) * self.rs + (c as isize - 1) * self.cs,
        ];
        corners.iter().all(|&d| {
            let p = self.offset as isize + d;
            p >= 0 && (p as usize) < self.data.len()
        })
    }
}

/// `dst (m x n, dense row-major) = [dst +] lhs (m x k) · rhs (k x n)`.
#[allow(clippy::too_many_arguments)]
pub(crate) fn gemm_into<T: Copy + Send + Sync + NativeGemm + 'static>(
    dst: &mut [T],
    m: usize,
    n: usize,
    k: usize,
    lhs: StridedMatrix<'_, T>,
    rhs: StridedMatrix<'_, T>,
    accumulate: bool,
    zero: T,
    one: T,
    par: Parallelism,
) {
    assert!(
        dst.len() >= m * n && lhs.fits(m, k) && rhs.fits(k, n),
        "gemm_into: operands out of bounds"
    );
    if m == 0 || n == 0 || k == 0 {
        return;
    }
    if T::native_gemm(dst, (m, n, k), lhs, rhs, accumulate) {
        return;
    }
    // gemm's own threading splits poorly when one side is thin (a batch of 32 rows times a
    // layer, or its gradient): measured 94 GFLOP/s on 2 cores for 32x784x256. Splitting the
    // rows across threads, each running the single-threaded kernel, reaches ~1.5x that.
    let threads = rayon::current_num_threads();
    if matches!(par, Parallelism::Rayon(_)) && threads > 1 && m.min(n) < 256 && m >= 16 {
        let rows = m.div_ceil(threads).next_multiple_of(8);
        dst[..m * n]
            .par_chunks_mut(rows * n)
            .enumerate()
            .for_each(|(c, d)| {
                let part = StridedMatrix {
                    offset: (lhs.offset as isize + (c * rows) as isize * lhs.rs) as usize,
                    ..lhs
                };
                gemm_into(
                    d,
                    d.len() / n,
                    n,
                    k,
                    part,
                    rhs,
                    accumulate,
                    zero,
                    one,
                    Parallelism::None,
                );
            });
        return;
    }
    // SAFETY: the assert above keeps every element gemm touches inside the three slices.
    unsafe {
        gemm::gemm(
            m,
            n,
            k,
            dst.as_mut_ptr(),
            1,
            n as isize,
            accumulate,
            lhs.data.as_ptr().add(lhs.offset),
            lhs.cs,
            lhs.rs,
            rhs.data.as_ptr().add(rhs.offset),
            rhs.cs,
            rhs.rs,
            if accumulate { one } else { zero },
            one,
            false,
            false,
            false,
            par,
        )
    }
}

/// A vectorised dot product for a 1×k by k×1 product (gemm's microkernels are built for
/// matrices), for the types that have one.
type DotFn<T> = Option<fn(&[T], &[T]) -> T>;

fn gemm_batched<T: Copy + Default + Send + Sync + NativeGemm + 'static>(
    a: &[T],
    la: &Layout,
    b: &[T],
    lb: &Layout,
    zero: T,
    one: T,
    dot: DotFn<T>,
) -> Vec<T> {
    let d = dims(la, lb);
    let (oa, ob) = (batch_offsets(la), batch_offsets(lb));
    let batches = oa.len();
    let mn = d.m * d.n;
    let mut out = crate::buffer::zeroed(batches * mn);
    if mn == 0 || batches == 0 {
        return out;
    }
    if d.k == 0 {
        return out; // empty inner dimension: zeros
    }
    let flops = 2 * d.m * d.n * d.k;
    if let (Some(dot), 1, 1, 1) = (dot, d.m, d.n, batches) {
        let (lhs, rhs) = d.operands(a, oa[0], b, ob[0]);
        if lhs.cs == 1 && rhs.rs == 1 {
            let x = &lhs.data[lhs.offset..lhs.offset + d.k];
            let y = &rhs.data[rhs.offset..rhs.offset + d.k];
            out[0] = dot(x, y);
            return out;
        }
    }
    let run = |dst: &mut [T], i: usize, par: Parallelism| {
        let (lhs, rhs) = d.operands(a, oa[i], b, ob[i]);
        gemm_into(dst, d.m, d.n, d.k, lhs, rhs, false, zero, one, par);
    };
    if batches > 1 && flops < (1 << 22) {
        out.par_chunks_mut(mn)
            .enumerate()
            .for_each(|(i, dst)| run(dst, i, Parallelism::None));
    } else {
        let par = if flops < (1 << 18) {
            Parallelism::None
        } else {
            Parallelism::Rayon(0)
        };
        for (i, dst) in out.chunks_mut(mn).enumerate() {
            run(dst, i, par);
        }
    }
    out
}

fn matmul_int<T: crate::num::Num + Send + Sync>(
    a: &[T],
    la: &Layout,
    b: &[T],
    lb: &Layout,
) -> Vec<T> {
    let d = dims(la, lb);
    let (oa, ob) = (batch_offsets(la), batch_offsets(lb));
    let mut out = crate::block_cache::filled(oa.len() * d.m * d.n, T::ZERO);
    for (bi, dst) in out
        .chunks_mut((d.m * d.n).max(1))
        .enumerate()
        .take(oa.len())
    {
        for i in 0..d.m {
            for j in 0..d.n {
                let mut acc = T::ZERO;
                for p in 0..d.k {
                    let x =
                        a[(oa[bi] as isize + i as isize * d.a_rs + p as isize * d.a_cs) as usize];
                    let y =
                        b[(ob[bi] as isize + p as isize * d.b_rs + j as isize * d.b_cs) as usize];
                    acc = acc.wadd(x.wmul(y));
                }
                dst[i * d.n + j] = acc;
            }
        }
    }
    out
}

/// Batched bf16 products through `vdpbf16ps`, accumulated and returned in f32.
fn gemm_batched_bf16(a: &[half::bf16], la: &Layout, b: &[half::bf16], lb: &Layout) -> Vec<f32> {
    let d = dims(la, lb);
    let (oa, ob) = (batch_offsets(la), batch_offsets(lb));
    let mn = d.m * d.n;
    let mut out = crate::block_cache::filled(oa.len() * mn, 0f32);
    if mn == 0 {
        return out;
    }
    for (i, dst) in out.chunks_mut(mn).enumerate() {
        let (lhs, rhs) = d.operands(a, oa[i], b, ob[i]);
        super::bf16_gemm::gemm_bf16_into(dst, d.m, d.n, d.k, lhs, rhs, false);
    }
    out
}

pub(crate) fn matmul(a: Operand<'_>, b: Operand<'_>) -> Result<HostData> {
    let (da, db) = (host(&a)?, host(&b)?);
    let (la, lb) = (a.layout, b.layout);
    Ok(match (da, db) {
        (HostData::F32(x), HostData::F32(y)) => HostData::F32(gemm_batched(
            x,
            la,
            y,
            lb,
            0.0,
            1.0,
            Some(|x, y| crate::simd::dot(x, y, 0.0)),
        )),
        (HostData::F64(x), HostData::F64(y)) => HostData::F64(gemm_batched(
            x,
            la,
            y,
            lb,
            0.0,
            1.0,
            Some(|x, y| crate::simd::dot(x, y, 0.0)),
        )),
        // float16 widened to the float32 kernels (the `gemm` crate's f16 path was 1.3-2.4x
        // slower than float32 at the CNN's and square shapes; the conversions are linear).
        (HostData::F16(_), HostData::F16(_)) => {
            let (wx, wy) = (widen(da).unwrap_or_default(), widen(db).unwrap_or_default());
            let dot = |x: &[f32], y: &[f32]| crate::simd::dot(x, y, 0.0);
            narrow(
                gemm_batched(&wx, la, &wy, lb, 0.0, 1.0, Some(dot)),
                DType::F16,
            )
        }
        (HostData::BF16(x), HostData::BF16(y)) if super::bf16_gemm::available() => {
            narrow(gemm_batched_bf16(x, la, y, lb), DType::BF16)
        }
        (HostData::BF16(_), HostData::BF16(_)) => {
            let (wx, wy) = (widen(da).unwrap_or_default(), widen(db).unwrap_or_default());
            narrow(gemm_batched(&wx, la, &wy, lb, 0.0, 1.0, None), DType::BF16)
        }
        (HostData::C64(x), HostData::C64(y)) => HostData::C64(gemm_batched(
            x,
            la,
            y,
            lb,
            Complex32::new(0.0, 0.0),
            Complex32::new(1.0, 0.0),
            None,
        )),
        (HostData::C128(x), HostData::C128(y)) => HostData::C128(gemm_batched(
            x,
            la,
            y,
            lb,
            Complex64::new(0.0, 0.0),
            Complex64::new(1.0, 0.0),
            None,
        )),
        (HostData::I32(x), HostData::I32(y)) => HostData::I32(matmul_int(x, la, y, lb)),
        (HostData::I64(x), HostData::I64(y)) => HostData::I64(matmul_int(x, la, y, lb)),
        _ => return Err(unsupported("cpu", "matmul", a.dtype)),
    })
}
