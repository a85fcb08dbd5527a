//! NumPy's type promotion (the NumPy 1.16 rules that TF 2.4's `tf.experimental.numpy`
//! follows), mapped onto ferroflow's dtypes.
//!
//! - Arrays promote by [`promote_types`]: the smallest type both cast to safely
//!   (`int8 + uint8 → int16`, `int32 + float32 → float64`, `float16 + int8 → float16`).
//! - Rust scalars are *value-based* as Python scalars are in NumPy 1.16: when their kind
//!   (bool < integer < float) is no higher than the arrays', only their value counts
//!   (`int8 array + 3 → int8`, `float32 array + 1.5 → float32`, `uint8 array + 300 → uint16`);
//!   otherwise their own type does (`int32 array + 1.5 → float64`).
//! - A Rust `f64` is NumPy's default float: `float64`, or `float32` after
//!   [`set_prefer_float32`]`(true)` (TF's `prefer_float32` switch). Rust integers default to
//!   `int64`, as NumPy's do on 64-bit Linux.
//!
//! Every NumPy integer, float and complex type has a ferroflow dtype, so promotion lands
//! where NumPy's does (`uint64 + int64 → float64`, `complex64 + float64 → complex128`
//! included); `bfloat16` (not a NumPy type) promotes like a float with 8 significant bits.
//!
//! ```
//! use ferroflow_numpy::{promote_types, DType};
//! assert_eq!(promote_types(DType::I32, DType::F32), DType::F64);
//! assert_eq!(promote_types(DType::U8, DType::I8), DType::I16);
//! assert_eq!(promote_types(DType::U32, DType::I32), DType::I64);
//! assert_eq!(promote_types(DType::U64, DType::I64), DType::F64);
//! assert_eq!(promote_types(DType::F16, DType::I8), DType::F16);
//! ```

use std::sync::atomic::{AtomicBool, Ordering};

use ferroflow_tensor::{DType, Result};

use crate::array::{Scalar, Value};

static PREFER_FLOAT32: AtomicBool = AtomicBool::new(false);

/// TF's `prefer_float32` switch: when on, Rust `f64` values and float defaults (`linspace`,
/// `true_divide` of integers, `mean` of integers, ...) are `float32` instead of `float64`.
///
/// ```
/// use ferroflow_numpy as np;
/// np::set_prefer_float32(true);
/// assert_eq!(np::default_float(), np::DType::F32);
/// np::set_prefer_float32(false);
/// assert_eq!(np::default_float(), np::DType::F64);
/// ```
pub fn set_prefer_float32(on: bool) {
    PREFER_FLOAT32.store(on, Ordering::Relaxed);
}

/// Whether [`set_prefer_float32`] is on.
pub fn prefer_float32() -> bool {
    PREFER_FLOAT32.load(Ordering::Relaxed)
}

/// The float dtype NumPy falls back to: `float64`, or `float32` with [`set_prefer_float32`].
pub fn default_float() -> DType {
    if prefer_float32() {
        DType::F32
    } else {
        DType::F64
    }
}

/// NumPy's default integer (`int64`).
pub fn default_int() -> DType {
    DType::I64
}

/// NumPy's type lattice over ferroflow's dtypes, in NumPy's order of type numbers.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum NpType {
    Bool,
    I8,
    U8,
    I16,
    U16,
    I32,
    U32,
    I64,
    U64,
    F16,
    BF16,
    F32,
    F64,
    C64,
    C128,
}

use NpType as T;

/// NumPy's order of type numbers: promotion picks the first type both cast to safely.
const ORDER: [NpType; 15] = [
    T::Bool,
    T::I8,
    T::U8,
    T::I16,
    T::U16,
    T::I32,
    T::U32,
    T::I64,
    T::U64,
    T::F16,
    T::BF16,
    T::F32,
    T::F64,
    T::C64,
    T::C128,
];

impl NpType {
    fn of(d: DType) -> NpType {
        match d {
            DType::Bool => T::Bool,
            DType::I8 => T::I8,
            DType::U8 => T::U8,
            DType::I16 => T::I16,
            DType::U16 => T::U16,
            DType::I32 => T::I32,
            DType::U32 => T::U32,
            DType::I64 => T::I64,
            DType::U64 => T::U64,
            DType::F16 => T::F16,
            DType::BF16 => T::BF16,
            DType::F32 => T::F32,
            DType::F64 => T::F64,
            DType::C64 => T::C64,
            DType::C128 => T::C128,
        }
    }
    /// The ferroflow dtype.
    fn dtype(self) -> DType {
        match self {
            T::Bool => DType::Bool,
            T::I8 => DType::I8,
            T::U8 => DType::U8,
            T::I16 => DType::I16,
            T::U16 => DType::U16,
            T::I32 => DType::I32,
            T::U32 => DType::U32,
            T::I64 => DType::I64,
            T::U64 => DType::U64,
            T::F16 => DType::F16,
            T::BF16 => DType::BF16,
            T::F32 => DType::F32,
            T::F64 => DType::F64,
            T::C64 => DType::C64,
            T::C128 => DType::C128,
        }
    }
    /// (kind, bits): kind 0 bool, 1 unsigned, 2 signed, 3 float, 4 complex.
    fn kind_bits(self) -> (u8, u32) {
        match self {
            T::Bool => (0, 1),
            T::U8 => (1, 8),
            T::U16 => (1, 16),
            T::U32 => (1, 32),
            T::U64 => (1, 64),
            T::I8 => (2, 8),
            T::I16 => (2, 16),
            T::I32 => (2, 32),
            T::I64 => (2, 64),
            T::F16 => (3, 16),
            T::BF16 => (3, 16),
            T::F32 => (3, 32),
            T::F64 => (3, 64),
            T::C64 => (4, 64),
            T::C128 => (4, 128),
        }
    }
    /// Significant bits of a float type (integers up to 2^this convert exactly).
    fn mantissa(self) -> u32 {
        match self {
            T::F16 => 11,
            T::BF16 => 8,
            T::F32 | T::C64 => 24,
            _ => 53,
        }
    }
    /// NumPy's `can_cast(self, to, 'safe')`.
    fn casts_safely_to(self, to: NpType) -> bool {
        if self == to || self == T::Bool {
            return true;
        }
        let ((k1, b1), (k2, b2)) = (self.kind_bits(), to.kind_bits());
        match (k1, k2) {
            (1, 1) | (2, 2) => b2 >= b1,
            (1, 2) => b2 > b1,
            (2, 1) => false,
            // integers to floats: exact when the float's mantissa holds every value
            // (NumPy also calls int64/uint64 → float64 safe)
            (1 | 2, 3) => to == T::F64 || b1 + u32::from(k1 == 1) <= to.mantissa(),
            (3, 3) => {
                // float16 and bfloat16 do not hold each other
                b2 > b1 && !(self == T::BF16 && to == T::F16)
            }
            // integers to complex numbers as to their part type
            (1 | 2, 4) => to == T::C128 || b1 + u32::from(k1 == 1) <= to.mantissa(),
            // every float but float64 fits complex64's parts
            (3, 4) => to == T::C128 || self != T::F64,
            (4, 4) => b2 > b1,
            _ => false,
        }
    }
    fn signed_of(self) -> NpType {
        match self {
            T::U8 => T::I8,
            T::U16 => T::I16,
            T::U32 => T::I32,
            T::U64 => T::I64,
            other => other,
        }
    }
}

fn promote_np(a: NpType, b: NpType) -> NpType {
    ORDER
        .iter()
        .copied()
        .find(|t| a.casts_safely_to(*t) && b.casts_safely_to(*t))
        .unwrap_or(T::F64)
}

/// NumPy's `promote_types(a, b)`: the smallest dtype both cast to safely.
///
/// ```
/// use ferroflow_numpy::{promote_types, DType};
/// assert_eq!(promote_types(DType::I64, DType::F16), DType::F64);
/// assert_eq!(promote_types(DType::Bool, DType::U8), DType::U8);
/// ```
pub fn promote_types(a: DType, b: DType) -> DType {
    promote_np(NpType::of(a), NpType::of(b)).dtype()
}

/// NumPy's `can_cast(from, to, casting='safe')`.
///
/// ```
/// use ferroflow_numpy::{can_cast, DType};
/// assert!(can_cast(DType::I32, DType::F64));
/// assert!(!can_cast(DType::I32, DType::F32));
/// ```
pub fn can_cast(from: DType, to: DType) -> bool {
    NpType::of(from).casts_safely_to(NpType::of(to))
}

/// NumPy's `min_scalar_type` for a Rust scalar, with its "small unsigned" flag (a
/// non-negative integer that also fits the signed type of the same width).
fn min_scalar_type(s: Scalar) -> (NpType, bool) {
    match s {
        Scalar::Bool(_) => (T::Bool, false),
        Scalar::Int(v, _) => {
            if v < 0 {
                let t = if v >= -128 {
                    T::I8
                } else if v >= -32768 {
                    T::I16
                } else if v >= i32::MIN as i64 {
                    T::I32
                } else {
                    T::I64
                };
                (t, false)
            } else if v < 256 {
                (T::U8, v < 128)
            } else if v < 65536 {
                (T::U16, v < 32768)
            } else if v < 1 << 32 {
                (T::U32, v < 1 << 31)
            } else {
                (T::U64, true)
            }
        }
        Scalar::Float(v, _) => {
            let a = v.abs();
            let t = if !v.is_finite() || a <= 65504.0 {
                T::F16
            } else if a <= f32::MAX as f64 {
                T::F32
            } else {
                T::F64
            };
            (t, false)
        }
    }
}

/// NumPy's promotion with the small-unsigned rule: a small non-negative scalar meeting a
/// signed or float type acts as the signed integer of its width.
fn promote_flagged(a: (NpType, bool), b: (NpType, bool)) -> (NpType, bool) {
    let fix = |x: (NpType, bool), other: NpType| {
        if x.1 && other != T::Bool && !matches!(other.kind_bits().0, 1) {
            x.0.signed_of()
        } else {
            x.0
        }
    };
    let (ta, tb) = (fix(a, b.0), fix(b, a.0));
    (promote_np(ta, tb), a.1 && b.1)
}

/// The dtype a scalar has on its own (not value-based): a Rust `f64` is the default float.
pub(crate) fn scalar_dtype(s: Scalar) -> DType {
    match s {
        Scalar::Bool(_) => DType::Bool,
        Scalar::Int(_, d) => d,
        Scalar::Float(_, DType::F64) => default_float(),
        Scalar::Float(_, d) => d,
    }
}

fn kind_rank(d: DType) -> u8 {
    match d {
        DType::Bool => 0,
        d if d.is_int() => 1,
        d if d.is_complex() => 3,
        _ => 2,
    }
}

/// NumPy's `result_type` over arrays and Rust scalars (value-based for scalars, see the
/// module docs).
///
/// ```
/// use ferroflow_numpy as np;
/// ferroflow::init();
/// let i8s = np::asarray(&[1i8, 2, 3][..])?;
/// assert_eq!(np::result_type(&[&i8s.clone().into(), &3i64.into()])?, np::DType::I8);
/// assert_eq!(np::result_type(&[&i8s.into(), &1.5f64.into()])?, np::DType::F64);
/// # Ok::<(), np::Error>(())
/// ```
pub fn result_type(values: &[&Value]) -> Result<DType> {
    let arrays: Vec<DType> = values
        .iter()
        .filter_map(|v| match v {
            Value::Array(t) => Some(t.dtype()),
            Value::Scalar(_) => None,
        })
        .collect();
    let scalars: Vec<Scalar> = values
        .iter()
        .filter_map(|v| match v {
            Value::Scalar(s) => Some(*s),
            Value::Array(_) => None,
        })
        .collect();
    let max_array_kind = arrays.iter().map(|d| kind_rank(*d)).max();
    let max_scalar_kind = scalars.iter().map(|s| kind_rank(scalar_dtype(*s))).max();
    let value_based = match (max_array_kind, max_scalar_kind) {
        (Some(a), Some(s)) => s <= a,
        _ => false,
    };
    let mut acc: Option<(NpType, bool)> = None;
    let mut add = |x: (NpType, bool)| {
        acc = Some(match acc {
            None => x,
            Some(a) => promote_flagged(a, x),
        })
    };
    for s in &scalars {
        if value_based {
            add(min_scalar_type(*s));
        } else {
            add((NpType::of(scalar_dtype(*s)), false));
        }
    }
    for d in &arrays {
        add((NpType::of(*d), false));
    }
    match acc {
        Some((t, _)) => Ok(t.dtype()),
        None => Ok(default_float()),
    }
}

/// The float dtype NumPy computes a float-only ufunc (`exp`, `sqrt`, `true_divide`, ...) in
/// for an input dtype: floats keep theirs; `bool`, `int8` and `uint8` give `float16`,
/// `int16` and `uint16` `float32`; wider integers give the default float.
pub fn float_result(d: DType) -> DType {
    match d {
        d if d.is_float() || d.is_complex() => d,
        DType::Bool | DType::I8 | DType::U8 => DType::F16,
        DType::I16 | DType::U16 => DType::F32,
        _ => default_float(),
    }
}

/// The dtype NumPy averages and divides in: inexact types (floats and complex numbers) keep
/// theirs, integers and booleans take the default float.
pub(crate) fn inexact_result(d: DType) -> DType {
    if d.is_float() || d.is_complex() {
        d
    } else {
        default_float()
    }
}

/// The dtype NumPy accumulates `sum`/`prod`/`cumsum` in: booleans and narrower integers
/// widen to the default integer (`int64`), narrower unsigned integers to `uint64`.
pub(crate) fn accumulate_dtype(d: DType) -> DType {
    match d {
        DType::Bool | DType::I8 | DType::I16 | DType::I32 => default_int(),
        DType::U8 | DType::U16 | DType::U32 => DType::U64,
        d => d,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use DType::*;

    #[test]
    fn array_promotion_matches_numpys_table() {
        // (a, b, NumPy's np.promote_types)
        let cases = [
            (Bool, Bool, Bool),
            (Bool, I8, I8),
            (U8, I8, I16),
            (U16, I16, I32),
            (U16, I8, I32),
            (U32, I32, I64),
            (U32, I8, I64),
            (U64, I64, F64),
            (U64, I8, F64),
            (U64, U8, U64),
            (U16, U32, U32),
            (I16, F16, F32),
            (U16, F16, F32),
            (U32, F32, F64),
            (U8, I32, I32),
            (I32, I64, I64),
            (U8, F16, F16),
            (I8, F16, F16),
            (I32, F16, F64),
            (I32, F32, F64),
            (I64, F32, F64),
            (I8, F32, F32),
            (F16, F32, F32),
            (F32, F64, F64),
            (F16, BF16, F32),
            (I8, BF16, BF16),
            (I32, BF16, F64),
            (C64, F32, C64),
            (C64, F64, C128),
            (C64, I8, C64),
            (C64, I16, C64),
            (C64, U16, C64),
            (C64, I32, C128),
            (C64, I64, C128),
            (C64, F16, C64),
            (C64, C128, C128),
            (Bool, C64, C64),
            (U64, C64, C128),
        ];
        for (a, b, want) in cases {
            assert_eq!(promote_types(a, b), want, "{a} + {b}");
            assert_eq!(promote_types(b, a), want, "{b} + {a}");
        }
    }

    #[test]
    fn scalars_are_value_based_as_in_numpy_1_16() {
        ferroflow_cpu_init();
        let arr = |d: DType| Value::Array(ferroflow_tensor::Tensor::zeros(&[2], d).unwrap());
        let int = |v: i64| Value::Scalar(Scalar::Int(v, I64));
        let float = |v: f64| Value::Scalar(Scalar::Float(v, F64));
        let rt = |a: &Value, b: &Value| result_type(&[a, b]).unwrap();
        // the examples of NumPy 1.16's result_type documentation and value-based casting
        assert_eq!(rt(&arr(I8), &int(3)), I8);
        assert_eq!(rt(&arr(U8), &int(3)), U8);
        assert_eq!(rt(&arr(U8), &int(300)), U16);
        assert_eq!(rt(&arr(I8), &int(200)), I16);
        assert_eq!(rt(&arr(I8), &int(-3)), I8);
        assert_eq!(rt(&arr(U8), &int(-3)), I16);
        assert_eq!(rt(&arr(U16), &int(70000)), U32);
        assert_eq!(rt(&arr(U32), &int(-1)), I64);
        assert_eq!(rt(&arr(I32), &float(1.5)), F64);
        assert_eq!(rt(&arr(F32), &float(1.5)), F32);
        assert_eq!(rt(&arr(F16), &float(1e6)), F32);
        assert_eq!(rt(&arr(I8), &float(1.5)), F64); // float kind beats int kind: float64
        assert_eq!(rt(&arr(Bool), &int(1)), I64);
        assert_eq!(
            result_type(&[&Value::Scalar(Scalar::Float(3.0, F64)), &int(-2)]).unwrap(),
            F64
        );
    }

    fn ferroflow_cpu_init() {
        ferroflow::init();
    }
}
