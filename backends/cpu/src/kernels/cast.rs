//! `cast` between every dtype pair, and dense copies of views.

use crate::buffer::{dense, dense_owned, dense_vec, host, narrow, narrow_from, widen};
use crate::simd::map;
use ferroflow_tensor::{
    bf16, f16, with_host_data, Complex32, Complex64, DType, Element, HostData, Operand, Result,
};

/// How an element converts: integers (and bool) go through i64 so int-to-int casts wrap
/// like C's, everything else through f64 (Rust `as`: saturating, NaN to 0).
pub(crate) trait Convert: Element {
    const INT: bool;
    fn to_i64(self) -> i64;
    fn from_i64(v: i64) -> Self;
}

macro_rules! convert_int {
    ($($t:ty),*) => {$(
        impl Convert for $t {
            const INT: bool = true;
            #[inline(always)]
            fn to_i64(self) -> i64 { self as i64 }
            #[inline(always)]
            fn from_i64(v: i64) -> Self { v as $t }
        }
    )*};
}
convert_int!(i8, i16, i32, i64, u8, u16, u32, u64);
macro_rules! convert_float {
    ($($t:ty),*) => {$(
        impl Convert for $t {
            const INT: bool = false;
            #[inline(always)]
            fn to_i64(self) -> i64 { self.to_f64() as i64 }
            #[inline(always)]
            fn from_i64(v: i64) -> Self { <$t>::from_f64(v as f64) }
        }
    )*};
}
convert_float!(f16, bf16, f32, f64);
// Complex numbers convert through their real part (real targets drop the imaginary part,
// as TF's cast does); complex-to-complex and complex-to-bool casts are handled in `cast`.
convert_float!(Complex32, Complex64);
impl Convert for bool {
    const INT: bool = true;
    #[inline(always)]
    fn to_i64(self) -> i64 {
        self as i64
    }
    #[inline(always)]
    fn from_i64(v: i64) -> Self {
        v != 0
    }
}

fn convert<T: Convert, U: Convert>(src: &[T]) -> Vec<U> {
    if T::INT && U::INT {
        map(src, |x: T| U::from_i64(x.to_i64()))
    } else {
        map(src, |x: T| U::from_f64(x.to_f64()))
    }
}

fn cast_to<T: Convert>(src: &[T], to: DType) -> HostData {
    match to {
        DType::F16 => HostData::F16(convert(src)),
        DType::BF16 => HostData::BF16(convert(src)),
        DType::F32 => HostData::F32(convert(src)),
        DType::F64 => HostData::F64(convert(src)),
        DType::I8 => HostData::I8(convert(src)),
        DType::I16 => HostData::I16(convert(src)),
        DType::I32 => HostData::I32(convert(src)),
        DType::I64 => HostData::I64(convert(src)),
        DType::U8 => HostData::U8(convert(src)),
        DType::U16 => HostData::U16(convert(src)),
        DType::U32 => HostData::U32(convert(src)),
        DType::U64 => HostData::U64(convert(src)),
        DType::Bool => HostData::Bool(convert(src)),
        DType::C64 => HostData::C64(convert(src)),
        DType::C128 => HostData::C128(convert(src)),
    }
}

pub(crate) fn cast(x: Operand<'_>, to: DType) -> Result<HostData> {
    let data = host(&x)?;
    // Between complex types both parts convert; to bool a complex number is `z != 0`.
    match (data, to) {
        (HostData::C64(v), DType::C128) => {
            return Ok(HostData::C128(map(&dense(v, x.layout), |z: Complex32| {
                Complex64::new(z.re as f64, z.im as f64)
            })))
        }
        (HostData::C128(v), DType::C64) => {
            return Ok(HostData::C64(map(&dense(v, x.layout), |z: Complex64| {
                Complex32::new(z.re as f32, z.im as f32)
            })))
        }
        (HostData::C64(v), DType::Bool) => {
            return Ok(HostData::Bool(map(&dense(v, x.layout), |z: Complex32| {
                z.re != 0.0 || z.im != 0.0
            })))
        }
        (HostData::C128(v), DType::Bool) => {
            return Ok(HostData::Bool(map(&dense(v, x.layout), |z: Complex64| {
                z.re != 0.0 || z.im != 0.0
            })))
        }
        _ => {}
    }
    // Vectorised half <-> f32 conversions (F16C where the CPU has it, via `half`).
    if let (Some(w), DType::F32) = (widen(data), to) {
        return Ok(HostData::F32(dense_owned(w, x.layout)));
    }
    if let (HostData::F32(v), DType::F16 | DType::BF16) = (data, to) {
        return Ok(narrow_from(&dense(v, x.layout), to));
    }
    if let (HostData::Bool(v), DType::F16 | DType::BF16) = (data, to) {
        // Masks (relu's gradient): 0 or 1 written straight as half bits.
        let one = match to {
            DType::F16 => f16::ONE.to_bits(),
            _ => bf16::ONE.to_bits(),
        };
        let bits: Vec<u16> = map(&dense(v, x.layout), |b: bool| if b { one } else { 0 });
        return Ok(match to {
            DType::F16 => HostData::F16(bits.into_iter().map(f16::from_bits).collect()),
            _ => HostData::BF16(bits.into_iter().map(bf16::from_bits).collect()),
        });
    }
    if matches!(to, DType::F16 | DType::BF16) && matches!(data, HostData::U8(_) | HostData::I8(_)) {
        // Through f32, exact for these (masks in relu's gradient), then the vectorised,
        // parallel narrowing; wider sources keep the direct (single-rounding) conversion.
        if let HostData::F32(v) =
            with_host_data!(data, v => cast_to(&dense(v, x.layout), DType::F32))
        {
            return Ok(narrow(v, to));
        }
    }
    Ok(with_host_data!(data, v => cast_to(&dense(v, x.layout), to)))
}

pub(crate) fn copy(x: Operand<'_>) -> Result<HostData> {
    let data = host(&x)?;
    Ok(with_host_data!(data, v => Element::into_host(dense_vec(v, x.layout))))
}
