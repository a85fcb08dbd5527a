//! The CPU buffer (a typed host vector) and the helpers kernels use to read views.

use ferroflow_tensor::{DType, DeviceBuffer, Element, Error, HostData, Layout, Operand, Result};
use half::{bf16, f16};
use std::any::Any;
use std::borrow::Cow;

/// Host memory holding one dense typed vector. Dropped, a large vector's memory goes to the
/// backend's block cache for the next output of its size ([`crate::set_block_cache_limit`]).
pub struct CpuBuffer(pub HostData);

impl Drop for CpuBuffer {
    fn drop(&mut self) {
        ferroflow_tensor::with_host_data!(&mut self.0, v => crate::block_cache::keep(std::mem::take(v)))
    }
}

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

/// The view's elements, dense and row-major, in a vector of their own: a kernel's output,
/// so its memory comes from the block cache ([`dense`]'s copies are temporaries, which
/// would take kept blocks and free them to malloc).
pub(crate) fn dense_vec<T: Element>(v: &[T], layout: &Layout) -> Vec<T> {
    let mut out = crate::block_cache::with_capacity(layout.num_elements());
    match layout.contiguous_range() {
        Some((off, n)) => out.extend_from_slice(&v[off..off + n]),
        None => layout.for_each_offset(|o| out.push(v[o])),
    }
    out
}

/// The view's elements, dense and row-major, from a vector the caller owns: the vector
/// itself when the view is all of it, in order.
pub(crate) fn dense_owned<T: Element>(v: Vec<T>, layout: &Layout) -> Vec<T> {
    match layout.contiguous_range() {
        Some((0, n)) if n == v.len() => v,
        _ => dense_vec(&v, layout),
    }
}

/// A half-precision element type and its conversions to and from f32 (`half`'s rounding:
/// to nearest even, NaN kept); whole slices widen with [`Lanes::widen_into`](crate::lanes::Lanes::widen_into).
pub(crate) trait Half: crate::lanes::Lanes + Default {
    /// One element as f32 (exact): the conversion where no vector one runs.
    fn widen_one(self) -> f32;
    /// One f32 rounded to this type: the conversion where no vector one runs.
    fn narrow_one(x: f32) -> Self;
    /// Wraps a vector as host data.
    fn host(v: Vec<Self>) -> HostData;
    /// `dst[i] = src[i]` rounded to this type, over the shorter of the two.
    fn narrow_into(src: &[f32], dst: &mut [Self]) {
        let n = src.len().min(dst.len());
        // SAFETY: dst has room for n elements.
        unsafe { narrow_uninit(&src[..n], dst.as_mut_ptr()) }
    }
}

impl Half for f16 {
    fn widen_one(self) -> f32 {
        self.to_f32()
    }
    fn narrow_one(x: f32) -> f16 {
        f16::from_f32(x)
    }
    fn host(v: Vec<f16>) -> HostData {
        HostData::F16(v)
    }
}

impl Half for bf16 {
    fn widen_one(self) -> f32 {
        self.to_f32()
    }
    fn narrow_one(x: f32) -> bf16 {
        bf16::from_f32(x)
    }
    fn host(v: Vec<bf16>) -> HostData {
        HostData::BF16(v)
    }
}

/// `dst[i] = src[i]` as f32 into memory that may be uninitialised: in registers
/// (`crate::lanes`) with AVX-512 or AVX2 + F16C, else element by element.
///
/// # Safety
/// `dst` is valid for `src.len()` writes.
pub(crate) unsafe fn widen_uninit<H: Half>(src: &[H], dst: *mut f32) {
    #[cfg(target_arch = "x86_64")]
    if crate::simd::has_avx512() {
        return crate::lanes::avx512::widen_all(src, dst);
    }
    #[cfg(target_arch = "x86_64")]
    if crate::simd::has_avx2() {
        return crate::lanes::avx2::widen_all(src, dst);
    }
    for (i, &s) in src.iter().enumerate() {
        dst.add(i).write(s.widen_one());
    }
}

/// `dst[i] = src[i]` rounded to `H` (to nearest even, NaN made quiet) into memory that may
/// be uninitialised: in registers with AVX-512 or AVX2 + F16C, else element by element
/// (the same results, `crate::lanes`' tests check every pattern).
///
/// # Safety
/// `dst` is valid for `src.len()` writes.
pub(crate) unsafe fn narrow_uninit<H: Half>(src: &[f32], dst: *mut H) {
    #[cfg(target_arch = "x86_64")]
    if crate::simd::has_avx512() {
        return crate::lanes::avx512::narrow_all(src, dst);
    }
    #[cfg(target_arch = "x86_64")]
    if crate::simd::has_avx2() {
        return crate::lanes::avx2::narrow_all(src, dst);
    }
    for (i, &x) in src.iter().enumerate() {
        dst.add(i).write(H::narrow_one(x));
    }
}

/// f16/bf16 storage widened to f32 (the whole buffer, so the layout still applies); large
/// buffers convert on all cores.
pub(crate) fn widen(data: &HostData) -> Option<Vec<f32>> {
    match data {
        HostData::F16(v) => Some(convert_uninit(v, widen_uninit)),
        HostData::BF16(v) => Some(convert_uninit(v, widen_uninit)),
        _ => None,
    }
}

/// f32 results narrowed back to a half dtype (or kept as f32).
pub(crate) fn narrow(v: Vec<f32>, dtype: DType) -> HostData {
    match dtype {
        DType::F16 | DType::BF16 => {
            let out = narrow_from(&v, dtype);
            // The f32 values were a temporary: their memory serves the next output.
            crate::block_cache::keep(v);
            out
        }
        _ => HostData::F32(v),
    }
}

/// f32 values narrowed to a half dtype (copied as f32 for any other dtype).
pub(crate) fn narrow_from(v: &[f32], dtype: DType) -> HostData {
    match dtype {
        DType::F16 => HostData::F16(convert_uninit(v, narrow_uninit)),
        DType::BF16 => HostData::BF16(convert_uninit(v, narrow_uninit)),
        _ => HostData::F32(v.to_vec()),
    }
}

/// An elementwise f32 kernel run over half-precision data without widening whole buffers:
/// chunks of the output (in parallel when large) get their inputs widened into small f32
/// buffers by `f32_kernel(start, end)`, which computes them (`end - start` values), and the
/// results are narrowed into the output (never zeroed first). `align` keeps chunk
/// boundaries on multiples of it.
pub(crate) fn half_chunked<H: Half>(
    n: usize,
    align: usize,
    f32_kernel: impl Fn(usize, usize) -> Vec<f32> + Sync,
) -> Vec<H> {
    let chunk = (8192 / align.max(1)).max(1) * align.max(1);
    let chunks = n.div_ceil(chunk);
    let mut out: Vec<H> = crate::block_cache::with_capacity(n);
    let dst = crate::simd::SharedMut(out.as_mut_ptr());
    let run = |c: usize| {
        let (start, end) = (c * chunk, ((c + 1) * chunk).min(n));
        let v = f32_kernel(start, end);
        assert_eq!(
            v.len(),
            end - start,
            "an f32 kernel's chunk of the wrong length"
        );
        // SAFETY: chunk c owns out[start..end] (within the capacity n); narrow_to writes
        // every element of it.
        unsafe { H::narrow_to(&v, dst.get().add(start)) }
    };
    if n < crate::simd::PAR_THRESHOLD {
        (0..chunks).for_each(run);
    } else {
        crate::simd::for_each_chunk_shared(chunks, run);
    }
    // SAFETY: the chunks cover 0..n and each wrote its elements.
    unsafe { out.set_len(n) };
    out
}

/// `src[start..end]` widened to f32 (into a new buffer, not zeroed first).
pub(crate) fn widen_range<H: Half>(src: &[H], start: usize, end: usize) -> Vec<f32> {
    let part = &src[start..end];
    let mut v = Vec::with_capacity(part.len());
    // SAFETY: widen_uninit writes all part.len() elements of the capacity.
    unsafe {
        widen_uninit(part, v.as_mut_ptr());
        v.set_len(part.len());
    }
    v
}

/// Element-type conversion of a whole slice with `f` applied chunk by chunk, in parallel
/// above [`crate::simd::PAR_THRESHOLD`] elements, into uninitialised memory (no zeroing
/// pass over the output): `f` writes every element of its chunk's destination.
fn convert_uninit<S: Sync, D: Send + Copy>(src: &[S], f: unsafe fn(&[S], *mut D)) -> Vec<D> {
    const CHUNK: usize = 1 << 14;
    let n = src.len();
    let mut out: Vec<D> = crate::block_cache::with_capacity(n);
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

/// A zeroed vector for a kernel's output (a kept block when one fits, see
/// [`crate::block_cache`]).
pub(crate) fn zeroed<T: Copy + Default>(n: usize) -> Vec<T> {
    crate::block_cache::filled(n, T::default())
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
