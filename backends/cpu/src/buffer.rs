//! The CPU buffer (a typed host vector) and the helpers kernels use to read views.

use ferroflow_tensor::{DType, DeviceBuffer, Element, Error, HostData, Layout, Operand, Result};
use half::slice::HalfFloatSliceExt;
use half::{bf16, f16};
use std::any::Any;
use std::borrow::Cow;

/// Host memory holding one dense typed vector.
pub struct CpuBuffer(pub HostData);

impl DeviceBuffer for CpuBuffer {
    fn as_any(&self) -> &dyn Any {
        self
    }
    fn size_in_bytes(&self) -> usize {
        self.0.size_in_bytes()
    }
    fn host_data(&self) -> Option<&HostData> {
        Some(&self.0)
    }
}

/// The host data behind an operand (a buffer from another backend is a bug upstream, reported
/// as an error rather than a panic).
pub(crate) fn host<'a>(x: &Operand<'a>) -> Result<&'a HostData> {
    x.buffer
        .as_any()
        .downcast_ref::<CpuBuffer>()
        .map(|b| &b.0)
        .ok_or_else(|| Error::Backend {
            backend: "cpu",
            msg: "received a buffer owned by another backend".into(),
        })
}

/// The view's elements, dense and row-major: borrowed when the layout already is.
pub(crate) fn dense<'a, T: Element>(v: &'a [T], layout: &Layout) -> Cow<'a, [T]> {
    if let Some((off, n)) = layout.contiguous_range() {
        return Cow::Borrowed(&v[off..off + n]);
    }
    let mut out = Vec::with_capacity(layout.num_elements());
    layout.for_each_offset(|o| out.push(v[o]));
    Cow::Owned(out)
}

/// The view's elements, dense and row-major, from a vector the caller owns: the vector
/// itself when the view is all of it, in order.
pub(crate) fn dense_owned<T: Element>(v: Vec<T>, layout: &Layout) -> Vec<T> {
    match layout.contiguous_range() {
        Some((0, n)) if n == v.len() => v,
        _ => dense(&v, layout).into_owned(),
    }
}

/// A half-precision element type and its conversions to and from f32 (`half`'s rounding:
/// to nearest even, NaN kept).
pub(crate) trait Half: Copy + Default + Send + Sync + 'static {
    /// `dst[i] = src[i]` as f32 (exact).
    fn widen_into(src: &[Self], dst: &mut [f32]);
    /// `dst[i] = src[i]` rounded to this type.
    fn narrow_into(src: &[f32], dst: &mut [Self]);
    /// Wraps a vector as host data.
    fn host(v: Vec<Self>) -> HostData;
}

impl Half for f16 {
    fn widen_into(src: &[f16], dst: &mut [f32]) {
        src.convert_to_f32_slice(dst)
    }
    fn narrow_into(src: &[f32], dst: &mut [f16]) {
        dst.convert_from_f32_slice(src)
    }
    fn host(v: Vec<f16>) -> HostData {
        HostData::F16(v)
    }
}

impl Half for bf16 {
    fn widen_into(src: &[bf16], dst: &mut [f32]) {
        let n = src.len().min(dst.len());
        // SAFETY: dst has room for n elements.
        unsafe { widen_bf16_to(&src[..n], dst.as_mut_ptr()) }
    }
    fn narrow_into(src: &[f32], dst: &mut [bf16]) {
        let n = src.len().min(dst.len());
        // SAFETY: dst has room for n elements.
        unsafe { narrow_bf16_to(&src[..n], dst.as_mut_ptr()) }
    }
    fn host(v: Vec<bf16>) -> HostData {
        HostData::BF16(v)
    }
}

/// `dst[i] = src[i]` as f32 into memory that may be uninitialised.
///
/// # Safety
/// `dst` is valid for `src.len()` writes.
unsafe fn widen_bf16_to(src: &[bf16], dst: *mut f32) {
    let done = if crate::simd::has_avx512() {
        bf16_simd::widen(src.as_ptr(), dst, src.len())
    } else {
        0
    };
    // bfloat16 is the upper half of a float32: exact, a shift.
    for (i, s) in src.iter().enumerate().skip(done) {
        dst.add(i).write(f32::from_bits((s.to_bits() as u32) << 16));
    }
}

/// `dst[i] = src[i]` rounded to bf16 (to nearest even, NaN made quiet) into memory that
/// may be uninitialised.
///
/// # Safety
/// `dst` is valid for `src.len()` writes.
pub(crate) unsafe fn narrow_bf16_to(src: &[f32], dst: *mut bf16) {
    let done = if crate::simd::has_avx512() {
        bf16_simd::narrow(src.as_ptr(), dst, src.len())
    } else {
        0
    };
    for (i, &x) in src.iter().enumerate().skip(done) {
        let b = x.to_bits();
        let rounded = (b.wrapping_add(0x7FFF + ((b >> 16) & 1)) >> 16) as u16;
        let quiet_nan = ((b >> 16) | 0x40) as u16;
        dst.add(i).write(bf16::from_bits(if x.is_nan() {
            quiet_nan
        } else {
            rounded
        }));
    }
}

/// bf16 conversions 16 elements at a time on AVX-512F, with the scalar code's rounding (to
/// nearest even in integer arithmetic, NaN made quiet): each returns how many leading
/// elements it converted (a multiple of 16; the caller converts the rest).
mod bf16_simd {
    use half::bf16;

    /// # Safety
    /// AVX-512F is present; `src` and `dst` hold `n` elements.
    #[cfg(target_arch = "x86_64")]
    #[target_feature(enable = "avx512f")]
    pub(super) unsafe fn widen(src: *const bf16, dst: *mut f32, n: usize) -> usize {
        use crate::lanes::avx512::from_bf16;
        use std::arch::x86_64::*;
        let mut i = 0;
        while i + 16 <= n {
            let h = _mm256_loadu_si256(src.add(i) as *const __m256i);
            _mm512_storeu_ps(dst.add(i), from_bf16(h));
            i += 16;
        }
        i
    }

    /// # Safety
    /// AVX-512F is present; `src` and `dst` hold `n` elements.
    #[cfg(target_arch = "x86_64")]
    #[target_feature(enable = "avx512f")]
    pub(super) unsafe fn narrow(src: *const f32, dst: *mut bf16, n: usize) -> usize {
        use crate::lanes::avx512::round_to_bf16;
        use std::arch::x86_64::*;
        let mut i = 0;
        while i + 16 <= n {
            let r = round_to_bf16(_mm512_loadu_ps(src.add(i)));
            _mm256_storeu_si256(dst.add(i) as *mut __m256i, _mm512_cvtepi32_epi16(r));
            i += 16;
        }
        i
    }

    #[cfg(not(target_arch = "x86_64"))]
    pub(super) unsafe fn widen(_: *const bf16, _: *mut f32, _: usize) -> usize {
        0
    }

    #[cfg(not(target_arch = "x86_64"))]
    pub(super) unsafe fn narrow(_: *const f32, _: *mut bf16, _: usize) -> usize {
        0
    }
}

/// f16/bf16 storage widened to f32 (the whole buffer, so the layout still applies); large
/// buffers convert on all cores.
pub(crate) fn widen(data: &HostData) -> Option<Vec<f32>> {
    match data {
        HostData::F16(v) => Some(convert(v, f16::widen_into)),
        HostData::BF16(v) => Some(convert_uninit(v, widen_bf16_to)),
        _ => None,
    }
}

/// f32 results narrowed back to a half dtype (or kept as f32).
pub(crate) fn narrow(v: Vec<f32>, dtype: DType) -> HostData {
    match dtype {
        DType::F16 | DType::BF16 => narrow_from(&v, dtype),
        _ => HostData::F32(v),
    }
}

/// f32 values narrowed to a half dtype (copied as f32 for any other dtype).
pub(crate) fn narrow_from(v: &[f32], dtype: DType) -> HostData {
    match dtype {
        DType::F16 => HostData::F16(convert(v, f16::narrow_into)),
        DType::BF16 => HostData::BF16(convert_uninit(v, narrow_bf16_to)),
        _ => HostData::F32(v.to_vec()),
    }
}

/// An elementwise f32 kernel run over half-precision data without widening whole buffers:
/// chunks of the output (in parallel when large) get their inputs widened into small f32
/// buffers by `widen_chunk(start, end, scratch...)`, `f32_kernel` computes them, and the
/// results are narrowed in place. `align` keeps chunk boundaries on multiples of it.
pub(crate) fn half_chunked<H: Half>(
    n: usize,
    align: usize,
    f32_kernel: impl Fn(usize, usize) -> Vec<f32> + Sync,
) -> Vec<H> {
    use rayon::prelude::*;
    let chunk = (8192 / align.max(1)).max(1) * align.max(1);
    let mut out = vec![H::default(); n];
    let run = |(c, o): (usize, &mut [H])| {
        let start = c * chunk;
        let v = f32_kernel(start, start + o.len());
        H::narrow_into(&v, o);
    };
    if n < crate::simd::PAR_THRESHOLD {
        out.chunks_mut(chunk).enumerate().for_each(run);
    } else {
        out.par_chunks_mut(chunk).enumerate().for_each(run);
    }
    out
}

/// `src[start..end]` widened to f32.
pub(crate) fn widen_range<H: Half>(src: &[H], start: usize, end: usize) -> Vec<f32> {
    let mut v = vec![0f32; end - start];
    H::widen_into(&src[start..end], &mut v);
    v
}

/// Element-type conversion of a whole slice with `f` applied chunk by chunk, in parallel
/// above [`crate::simd::PAR_THRESHOLD`] elements.
fn convert<S: Sync, D: Copy + Default + Send>(
    src: &[S],
    f: impl Fn(&[S], &mut [D]) + Sync,
) -> Vec<D> {
    use rayon::prelude::*;
    const CHUNK: usize = 1 << 14;
    let mut out = vec![D::default(); src.len()];
    if src.len() < crate::simd::PAR_THRESHOLD {
        f(src, &mut out);
    } else {
        out.par_chunks_mut(CHUNK)
            .zip(src.par_chunks(CHUNK))
            .for_each(|(o, s)| f(s, o));
    }
    out
}

/// [`convert`] into uninitialised memory (no zeroing pass over the output): `f` writes
/// every element of its chunk's destination.
fn convert_uninit<S: Sync, D: Send>(src: &[S], f: unsafe fn(&[S], *mut D)) -> Vec<D> {
    const CHUNK: usize = 1 << 14;
    let n = src.len();
    let mut out: Vec<D> = Vec::with_capacity(n);
    let dst = crate::simd::SharedMut(out.as_mut_ptr());
    // SAFETY: chunk c writes elements c·CHUNK.. of its own part of `out` (capacity n).
    if n < crate::simd::PAR_THRESHOLD {
        unsafe { f(src, dst.get()) };
    } else {
        crate::simd::for_each_chunk_shared(n.div_ceil(CHUNK), |c| {
            let part = &src[c * CHUNK..((c + 1) * CHUNK).min(n)];
            unsafe { f(part, dst.get().add(c * CHUNK)) }
        });
    }
    // SAFETY: every element was written above.
    unsafe { out.set_len(n) };
    out
}

/// Boxes host data as a kernel output.
pub(crate) fn out(d: HostData) -> Result<ferroflow_tensor::BufferBox> {
    Ok(Box::new(CpuBuffer(d)))
}

/// Splits `[.., axis, ..]` of a shape into (outer, axis size, inner) element counts.
pub(crate) fn split_at_axis(shape: &[usize], axis: usize) -> (usize, usize, usize) {
    (
        shape[..axis].iter().product(),
        shape[axis],
        shape[axis + 1..].iter().product(),
    )
}

/// A zeroed vector for a kernel's output. (Large buffers are recycled by malloc, see
/// [`crate::register`], so no page-fault tricks are needed here.)
pub(crate) fn zeroed<T: Copy + Default>(n: usize) -> Vec<T> {
    vec![T::default(); n]
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn half_conversions_match_the_half_crate_bit_for_bit() {
        // Every 16-bit pattern, and float32s around every rounding boundary.
        let mut xs: Vec<f32> = (0..=u16::MAX)
            .flat_map(|h| {
                let b = (h as u32) << 16;
                [b, b | 0x7FFF, b | 0x8000, b | 0x8001, b | 0xFFFF]
            })
            .map(f32::from_bits)
            .collect();
        xs.extend([
            0.0,
            -0.0,
            f32::INFINITY,
            f32::NEG_INFINITY,
            f32::NAN,
            f32::MAX,
            f32::MIN_POSITIVE,
        ]);
        for dtype in [DType::BF16, DType::F16] {
            let ours = narrow(xs.clone(), dtype);
            let theirs: Vec<u16> = match dtype {
                DType::BF16 => xs.iter().map(|&x| bf16::from_f32(x).to_bits()).collect(),
                _ => xs.iter().map(|&x| f16::from_f32(x).to_bits()).collect(),
            };
            let got: Vec<u16> = match &ours {
                HostData::BF16(v) => v.iter().map(|h| h.to_bits()).collect(),
                HostData::F16(v) => v.iter().map(|h| h.to_bits()).collect(),
                _ => unreachable!("narrow keeps the dtype"),
            };
            assert_eq!(got, theirs, "{dtype}");
            let back = widen(&ours).expect("a half type widens");
            let want: Vec<u32> = match &ours {
                HostData::BF16(v) => v.iter().map(|h| h.to_f32().to_bits()).collect(),
                HostData::F16(v) => v.iter().map(|h| h.to_f32().to_bits()).collect(),
                _ => unreachable!(),
            };
            assert_eq!(back.iter().map(|x| x.to_bits()).collect::<Vec<_>>(), want);
        }
    }
}
