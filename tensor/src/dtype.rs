//! Element types: [`DType`], the Rust types behind them ([`Element`]) and typed host
//! buffers ([`HostData`]).

use crate::error::{Error, Result};
use half::{bf16, f16};
pub use num_complex::{Complex32, Complex64};
use std::fmt;

/// The element type of a tensor. TensorFlow's rule holds: ops never promote implicitly,
/// mismatched dtypes are an error and [`crate::Tensor::cast`] converts explicitly.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
#[cfg_attr(feature = "serde", derive(serde::Serialize, serde::Deserialize))]
pub enum DType {
    /// IEEE half precision.
    F16,
    /// bfloat16 (8-bit exponent, 7-bit mantissa).
    BF16,
    /// IEEE single precision.
    F32,
    /// IEEE double precision.
    F64,
    /// Signed 8-bit integer.
    I8,
    /// Signed 16-bit integer.
    I16,
    /// Signed 32-bit integer.
    I32,
    /// Signed 64-bit integer.
    I64,
    /// Unsigned 8-bit integer.
    U8,
    /// Unsigned 16-bit integer.
    U16,
    /// Unsigned 32-bit integer.
    U32,
    /// Unsigned 64-bit integer.
    U64,
    /// Boolean.
    Bool,
    /// Complex number of two f32 (real, imaginary): TF's and NumPy's `complex64`
    /// ([`Complex32`]).
    C64,
    /// Complex number of two f64: `complex128` ([`Complex64`]).
    C128,
}

impl DType {
    /// Every dtype, in declaration order.
    pub const ALL: [DType; 15] = [
        DType::F16,
        DType::BF16,
        DType::F32,
        DType::F64,
        DType::I8,
        DType::I16,
        DType::I32,
        DType::I64,
        DType::U8,
        DType::U16,
        DType::U32,
        DType::U64,
        DType::Bool,
        DType::C64,
        DType::C128,
    ];

    /// Bytes per element.
    pub fn size_in_bytes(self) -> usize {
        match self {
            DType::F16 | DType::BF16 | DType::I16 | DType::U16 => 2,
            DType::F32 | DType::I32 | DType::U32 => 4,
            DType::F64 | DType::I64 | DType::U64 | DType::C64 => 8,
            DType::I8 | DType::U8 | DType::Bool => 1,
            DType::C128 => 16,
        }
    }
    /// True for complex64 and complex128.
    pub fn is_complex(self) -> bool {
        matches!(self, DType::C64 | DType::C128)
    }
    /// The type of a complex dtype's parts (complex64: float32, complex128: float64); other
    /// dtypes are their own.
    ///
    /// ```
    /// use ferroflow_tensor::DType;
    /// assert_eq!(DType::C64.real_dtype(), DType::F32);
    /// assert_eq!(DType::F16.real_dtype(), DType::F16);
    /// ```
    pub fn real_dtype(self) -> DType {
        match self {
            DType::C64 => DType::F32,
            DType::C128 => DType::F64,
            other => other,
        }
    }
    /// The complex dtype whose parts are this float dtype (float32: complex64, float64:
    /// complex128); `None` for the others (TF has no complex type of half precision).
    pub fn complex_dtype(self) -> Option<DType> {
        match self {
            DType::F32 | DType::C64 => Some(DType::C64),
            DType::F64 | DType::C128 => Some(DType::C128),
            _ => None,
        }
    }
    /// True for f16, bf16, f32, f64.
    pub fn is_float(self) -> bool {
        matches!(self, DType::F16 | DType::BF16 | DType::F32 | DType::F64)
    }
    /// True for the integer types.
    pub fn is_int(self) -> bool {
        matches!(
            self,
            DType::I8
                | DType::I16
                | DType::I32
                | DType::I64
                | DType::U8
                | DType::U16
                | DType::U32
                | DType::U64
        )
    }
    /// True for signed integers, floats and complex numbers.
    pub fn is_signed(self) -> bool {
        !matches!(
            self,
            DType::U8 | DType::U16 | DType::U32 | DType::U64 | DType::Bool
        )
    }
    /// TensorFlow's name (`float32`, `bfloat16`, `int64`, `bool`, ...).
    pub fn as_str(self) -> &'static str {
        match self {
            DType::F16 => "float16",
            DType::BF16 => "bfloat16",
            DType::F32 => "float32",
            DType::F64 => "float64",
            DType::I8 => "int8",
            DType::I16 => "int16",
            DType::I32 => "int32",
            DType::I64 => "int64",
            DType::U8 => "uint8",
            DType::U16 => "uint16",
            DType::U32 => "uint32",
            DType::U64 => "uint64",
            DType::Bool => "bool",
            DType::C64 => "complex64",
            DType::C128 => "complex128",
        }
    }
    /// Parses TF names and short names (`"float32"`, `"f32"`, `"half"`, `"int64"`, ...).
    pub fn parse(s: &str) -> Result<DType> {
        Ok(match s {
            "float16" | "f16" | "half" => DType::F16,
            "bfloat16" | "bf16" => DType::BF16,
            "float32" | "f32" | "float" => DType::F32,
            "float64" | "f64" | "double" => DType::F64,
            "int8" | "i8" => DType::I8,
            "int16" | "i16" => DType::I16,
            "int32" | "i32" => DType::I32,
            "int64" | "i64" => DType::I64,
            "uint8" | "u8" => DType::U8,
            "uint16" | "u16" => DType::U16,
            "uint32" | "u32" => DType::U32,
            "uint64" | "u64" => DType::U64,
            "bool" => DType::Bool,
            "complex64" | "c64" => DType::C64,
            "complex128" | "c128" => DType::C128,
            _ => return Err(Error::invalid("dtype", format!("unknown dtype {s:?}"))),
        })
    }
}

impl fmt::Display for DType {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// A Rust type that is the element of a dtype.
///
/// Complex numbers are elements too, but not ordered: code that compares elements asks for
/// `PartialOrd` besides.
pub trait Element: Copy + Send + Sync + PartialEq + fmt::Debug + Default + 'static {
    /// The dtype this type stores.
    const DTYPE: DType;
    /// Lossy conversion to f64 (bool: 0 or 1; complex: the real part, as a cast to a real
    /// type takes it).
    fn to_f64(self) -> f64;
    /// Conversion from f64 with Rust `as` semantics (saturating, NaN to 0 for ints; complex:
    /// a zero imaginary part).
    fn from_f64(v: f64) -> Self;
    /// Wraps a vector as [`HostData`].
    fn into_host(v: Vec<Self>) -> HostData;
    /// Borrows the vector inside [`HostData`] when it has this type.
    fn slice_of(d: &HostData) -> Option<&[Self]>;
    /// Takes the vector out of [`HostData`] when it has this type.
    fn vec_of(d: HostData) -> Option<Vec<Self>>;
}

macro_rules! element {
    ($t:ty, $variant:ident, $to:expr, $from:expr) => {
        impl Element for $t {
            const DTYPE: DType = DType::$variant;
            #[inline]
            fn to_f64(self) -> f64 {
                let f: fn($t) -> f64 = $to;
                f(self)
            }
            #[inline]
            fn from_f64(v: f64) -> Self {
                let f: fn(f64) -> $t = $from;
                f(v)
            }
            fn into_host(v: Vec<Self>) -> HostData {
                HostData::$variant(v)
            }
            fn slice_of(d: &HostData) -> Option<&[Self]> {
                match d {
                    HostData::$variant(v) => Some(v),
                    _ => None,
                }
            }
            fn vec_of(d: HostData) -> Option<Vec<Self>> {
                match d {
                    HostData::$variant(v) => Some(v),
                    _ => None,
                }
            }
        }
    };
}
element!(f16, F16, |x| x.to_f64(), f16::from_f64);
element!(bf16, BF16, |x| x.to_f64(), bf16::from_f64);
element!(f32, F32, |x| x as f64, |v| v as f32);
element!(f64, F64, |x| x, |v| v);
element!(i8, I8, |x| x as f64, |v| v as i8);
element!(i16, I16, |x| x as f64, |v| v as i16);
element!(i32, I32, |x| x as f64, |v| v as i32);
element!(i64, I64, |x| x as f64, |v| v as i64);
element!(u8, U8, |x| x as f64, |v| v as u8);
element!(u16, U16, |x| x as f64, |v| v as u16);
element!(u32, U32, |x| x as f64, |v| v as u32);
element!(u64, U64, |x| x as f64, |v| v as u64);
element!(bool, Bool, |x| x as u8 as f64, |v| v != 0.0);
element!(Complex32, C64, |x| x.re as f64, |v| Complex32::new(
    v as f32, 0.0
));
element!(Complex64, C128, |x| x.re, |v| Complex64::new(v, 0.0));

/// A contiguous, typed host buffer: how data enters and leaves a device, and the CPU
/// backend's storage.
#[derive(Debug, Clone, PartialEq)]
#[allow(missing_docs)]
pub enum HostData {
    F16(Vec<f16>),
    BF16(Vec<bf16>),
    F32(Vec<f32>),
    F64(Vec<f64>),
    I8(Vec<i8>),
    I16(Vec<i16>),
    I32(Vec<i32>),
    I64(Vec<i64>),
    U8(Vec<u8>),
    U16(Vec<u16>),
    U32(Vec<u32>),
    U64(Vec<u64>),
    Bool(Vec<bool>),
    C64(Vec<Complex32>),
    C128(Vec<Complex64>),
}

/// Runs `$body` with `$v` bound to the typed vector inside a [`HostData`] (any variant).
#[macro_export]
macro_rules! with_host_data {
    ($data:expr, $v:ident => $body:expr) => {
        match $data {
            $crate::HostData::F16($v) => $body,
            $crate::HostData::BF16($v) => $body,
            $crate::HostData::F32($v) => $body,
            $crate::HostData::F64($v) => $body,
            $crate::HostData::I8($v) => $body,
            $crate::HostData::I16($v) => $body,
            $crate::HostData::I32($v) => $body,
            $crate::HostData::I64($v) => $body,
            $crate::HostData::U8($v) => $body,
            $crate::HostData::U16($v) => $body,
            $crate::HostData::U32($v) => $body,
            $crate::HostData::U64($v) => $body,
            $crate::HostData::Bool($v) => $body,
            $crate::HostData::C64($v) => $body,
            $crate::HostData::C128($v) => $body,
        }
    };
}

impl HostData {
    /// The dtype of the elements.
    pub fn dtype(&self) -> DType {
        match self {
            HostData::F16(_) => DType::F16,
            HostData::BF16(_) => DType::BF16,
            HostData::F32(_) => DType::F32,
            HostData::F64(_) => DType::F64,
            HostData::I8(_) => DType::I8,
            HostData::I16(_) => DType::I16,
            HostData::I32(_) => DType::I32,
            HostData::I64(_) => DType::I64,
            HostData::U8(_) => DType::U8,
            HostData::U16(_) => DType::U16,
            HostData::U32(_) => DType::U32,
            HostData::U64(_) => DType::U64,
            HostData::Bool(_) => DType::Bool,
            HostData::C64(_) => DType::C64,
            HostData::C128(_) => DType::C128,
        }
    }
    /// Number of elements.
    pub fn len(&self) -> usize {
        with_host_data!(self, v => v.len())
    }
    /// True when there are no elements.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
    /// Element `i` as f64.
    pub fn get_f64(&self, i: usize) -> f64 {
        with_host_data!(self, v => v[i].to_f64())
    }
    /// All elements as f64 (lossless for every dtype except i64 and u64 beyond 2^53; complex:
    /// the real parts).
    pub fn to_f64_vec(&self) -> Vec<f64> {
        with_host_data!(self, v => v.iter().map(|x| x.to_f64()).collect())
    }
    /// A buffer of `dtype` built from f64 values (Rust `as` semantics).
    pub fn from_f64_slice(dtype: DType, values: &[f64]) -> HostData {
        fn conv<T: Element>(values: &[f64]) -> HostData {
            T::into_host(values.iter().map(|&x| T::from_f64(x)).collect())
        }
        match dtype {
            DType::F16 => conv::<f16>(values),
            DType::BF16 => conv::<bf16>(values),
            DType::F32 => conv::<f32>(values),
            DType::F64 => conv::<f64>(values),
            DType::I8 => conv::<i8>(values),
            DType::I16 => conv::<i16>(values),
            DType::I32 => conv::<i32>(values),
            DType::I64 => conv::<i64>(values),
            DType::U8 => conv::<u8>(values),
            DType::U16 => conv::<u16>(values),
            DType::U32 => conv::<u32>(values),
            DType::U64 => conv::<u64>(values),
            DType::Bool => conv::<bool>(values),
            DType::C64 => conv::<Complex32>(values),
            DType::C128 => conv::<Complex64>(values),
        }
    }
    /// `n` copies of `value` converted to `dtype`.
    pub fn filled(dtype: DType, n: usize, value: f64) -> HostData {
        fn fill<T: Element>(n: usize, value: f64) -> HostData {
            T::into_host(vec![T::from_f64(value); n])
        }
        match dtype {
            DType::F16 => fill::<f16>(n, value),
            DType::BF16 => fill::<bf16>(n, value),
            DType::F32 => fill::<f32>(n, value),
            DType::F64 => fill::<f64>(n, value),
            DType::I8 => fill::<i8>(n, value),
            DType::I16 => fill::<i16>(n, value),
            DType::I32 => fill::<i32>(n, value),
            DType::I64 => fill::<i64>(n, value),
            DType::U8 => fill::<u8>(n, value),
            DType::U16 => fill::<u16>(n, value),
            DType::U32 => fill::<u32>(n, value),
            DType::U64 => fill::<u64>(n, value),
            DType::Bool => fill::<bool>(n, value),
            DType::C64 => fill::<Complex32>(n, value),
            DType::C128 => fill::<Complex64>(n, value),
        }
    }
    /// Size in bytes.
    pub fn size_in_bytes(&self) -> usize {
        self.len() * self.dtype().size_in_bytes()
    }
    /// The elements as little-endian bytes (bool as 0/1), the layout of `.npy`, safetensors
    /// and ferroflow's record files.
    ///
    /// ```
    /// use ferroflow_tensor::{DType, HostData};
    /// let d = HostData::I32(vec![1, -2]);
    /// let bytes = d.to_le_bytes();
    /// assert_eq!(bytes, [1, 0, 0, 0, 254, 255, 255, 255]);
    /// assert_eq!(HostData::from_le_bytes(DType::I32, &bytes), Some(d));
    /// ```
    pub fn to_le_bytes(&self) -> Vec<u8> {
        self.le_bytes().into_owned()
    }
    /// The values' little-endian bytes where the memory already is those bytes (2-, 4- and
    /// 8-byte numbers on little-endian machines, and `uint8`): borrowed, nothing computed;
    /// `None` where [`HostData::le_bytes`] would convert.
    ///
    /// ```
    /// use ferroflow_tensor::HostData;
    /// assert_eq!(HostData::U8(vec![1, 2]).le_bytes_in_place(), Some(&[1u8, 2][..]));
    /// assert_eq!(HostData::Bool(vec![true]).le_bytes_in_place(), None); // converted
    /// ```
    pub fn le_bytes_in_place(&self) -> Option<&[u8]> {
        // On little-endian machines the bytes are the memory itself.
        #[cfg(target_endian = "little")]
        match self {
            HostData::F32(v) => return Some(bytemuck::cast_slice(v)),
            HostData::F64(v) => return Some(bytemuck::cast_slice(v)),
            HostData::I32(v) => return Some(bytemuck::cast_slice(v)),
            HostData::I64(v) => return Some(bytemuck::cast_slice(v)),
            HostData::I16(v) => return Some(bytemuck::cast_slice(v)),
            HostData::U16(v) => return Some(bytemuck::cast_slice(v)),
            HostData::U32(v) => return Some(bytemuck::cast_slice(v)),
            HostData::U64(v) => return Some(bytemuck::cast_slice(v)),
            HostData::C64(v) => return Some(bytemuck::cast_slice(v)),
            HostData::C128(v) => return Some(bytemuck::cast_slice(v)),
            _ => {}
        }
        match self {
            HostData::U8(v) => Some(v),
            _ => None,
        }
    }
    /// [`HostData::to_le_bytes`] without a copy where the memory already is those bytes
    /// (2-, 4- and 8-byte numbers, and `uint8`, on little-endian machines), for writers that
    /// append them to a larger buffer.
    ///
    /// ```
    /// use ferroflow_tensor::HostData;
    /// let d = HostData::F32(vec![1.0]);
    /// assert_eq!(&*d.le_bytes(), &1.0f32.to_le_bytes());
    /// ```
    pub fn le_bytes(&self) -> std::borrow::Cow<'_, [u8]> {
        use std::borrow::Cow;
        if let Some(bytes) = self.le_bytes_in_place() {
            return Cow::Borrowed(bytes);
        }
        Cow::Owned(match self {
            HostData::F16(v) => v.iter().flat_map(|x| x.to_le_bytes()).collect(),
            HostData::BF16(v) => v.iter().flat_map(|x| x.to_le_bytes()).collect(),
            HostData::F32(v) => v.iter().flat_map(|x| x.to_le_bytes()).collect(),
            HostData::F64(v) => v.iter().flat_map(|x| x.to_le_bytes()).collect(),
            HostData::I8(v) => v.iter().map(|&x| x as u8).collect(),
            HostData::I16(v) => v.iter().flat_map(|x| x.to_le_bytes()).collect(),
            HostData::I32(v) => v.iter().flat_map(|x| x.to_le_bytes()).collect(),
            HostData::I64(v) => v.iter().flat_map(|x| x.to_le_bytes()).collect(),
            HostData::U8(v) => v.clone(),
            HostData::U16(v) => v.iter().flat_map(|x| x.to_le_bytes()).collect(),
            HostData::U32(v) => v.iter().flat_map(|x| x.to_le_bytes()).collect(),
            HostData::U64(v) => v.iter().flat_map(|x| x.to_le_bytes()).collect(),
            HostData::Bool(v) => v.iter().map(|&b| b as u8).collect(),
            HostData::C64(v) => v
                .iter()
                .flat_map(|x| [x.re.to_le_bytes(), x.im.to_le_bytes()])
                .flatten()
                .collect(),
            HostData::C128(v) => v
                .iter()
                .flat_map(|x| [x.re.to_le_bytes(), x.im.to_le_bytes()])
                .flatten()
                .collect(),
        })
    }
    /// Elements of `dtype` from little-endian bytes; `None` when the length is not a multiple
    /// of the element size or a bool byte is not 0 or 1.
    pub fn from_le_bytes(dtype: DType, b: &[u8]) -> Option<HostData> {
        fn chunks<const N: usize, T>(b: &[u8], f: impl Fn([u8; N]) -> T) -> Option<Vec<T>> {
            if !b.len().is_multiple_of(N) {
                return None;
            }
            b.chunks_exact(N)
                .map(|c| c.try_into().ok().map(&f))
                .collect()
        }
        // On little-endian machines the values are the bytes themselves (one copy).
        #[cfg(target_endian = "little")]
        {
            // One pass of unaligned reads (no zero-filled buffer first).
            fn pod<T: bytemuck::Pod>(b: &[u8]) -> Option<Vec<T>> {
                let size = std::mem::size_of::<T>();
                b.len().is_multiple_of(size).then(|| {
                    b.chunks_exact(size)
                        .map(bytemuck::pod_read_unaligned::<T>)
                        .collect()
                })
            }
            match dtype {
                DType::F32 => return pod(b).map(HostData::F32),
                DType::F64 => return pod(b).map(HostData::F64),
                DType::I32 => return pod(b).map(HostData::I32),
                DType::I64 => return pod(b).map(HostData::I64),
                DType::I16 => return pod(b).map(HostData::I16),
                DType::U16 => return pod(b).map(HostData::U16),
                DType::U32 => return pod(b).map(HostData::U32),
                DType::U64 => return pod(b).map(HostData::U64),
                DType::C64 => return pod(b).map(HostData::C64),
                DType::C128 => return pod(b).map(HostData::C128),
                _ => {}
            }
        }
        if !b.len().is_multiple_of(dtype.size_in_bytes()) {
            return None;
        }
        Some(match dtype {
            DType::F16 => HostData::F16(chunks(b, half::f16::from_le_bytes)?),
            DType::BF16 => HostData::BF16(chunks(b, half::bf16::from_le_bytes)?),
            DType::F32 => HostData::F32(chunks(b, f32::from_le_bytes)?),
            DType::F64 => HostData::F64(chunks(b, f64::from_le_bytes)?),
            DType::I8 => HostData::I8(b.iter().map(|&x| x as i8).collect()),
            DType::I16 => HostData::I16(chunks(b, i16::from_le_bytes)?),
            DType::I32 => HostData::I32(chunks(b, i32::from_le_bytes)?),
            DType::I64 => HostData::I64(chunks(b, i64::from_le_bytes)?),
            DType::U8 => HostData::U8(b.to_vec()),
            DType::U16 => HostData::U16(chunks(b, u16::from_le_bytes)?),
            DType::U32 => HostData::U32(chunks(b, u32::from_le_bytes)?),
            DType::U64 => HostData::U64(chunks(b, u64::from_le_bytes)?),
            DType::Bool => HostData::Bool(
                b.iter()
                    .map(|&x| (x <= 1).then_some(x == 1))
                    .collect::<Option<_>>()?,
            ),
            // a complex number is its two parts in a row
            DType::C64 => HostData::C64(
                chunks(b, f32::from_le_bytes)?
                    .chunks_exact(2)
                    .map(|p| Complex32::new(p[0], p[1]))
                    .collect(),
            ),
            DType::C128 => HostData::C128(
                chunks(b, f64::from_le_bytes)?
                    .chunks_exact(2)
                    .map(|p| Complex64::new(p[0], p[1]))
                    .collect(),
            ),
        })
    }
}
