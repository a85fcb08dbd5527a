//! What the NumPy functions accept ([`ArrayLike`]): ferroflow tensors (NumPy's `ndarray` *is*
//! [`Tensor`] here, so nothing is copied between the two APIs), Rust scalars (value-based in
//! promotion, like Python scalars), slices, vectors and nested arrays.
//!
//! ```
//! use ferroflow_numpy as np;
//! ferroflow::init();
//! let a = np::asarray([[1.0, 2.0], [3.0, 4.0]])?;
//! assert_eq!(a.shape(), &[2, 2]);
//! assert_eq!(a.dtype(), np::DType::F64); // a Rust f64 is NumPy's float64
//! let b = np::asarray(&a)?;
//! assert!(b.shares_storage_with(&a)); // asarray of an array is the array
//! # Ok::<(), np::Error>(())
//! ```

use ferroflow_tensor::{current_device, DType, Device, Element, HostData, Result, Tensor};

use crate::dtypes::{default_float, result_type, scalar_dtype};

/// NumPy's `ndarray`: a ferroflow [`Tensor`] (the same type, so arrays and tensors share
/// storage and `GradientTape` sees NumPy-API code as ordinary ops).
pub type NdArray = Tensor;

/// A Rust scalar: its value and the dtype of its Rust type.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum Scalar {
    /// `bool`.
    Bool(bool),
    /// An integer and the dtype of its Rust type (`int64` for `i64`, ...).
    Int(i64, DType),
    /// A float and the dtype of its Rust type (`f64` is the default float).
    Float(f64, DType),
}

/// An argument of a NumPy function: an array, or a Rust scalar that promotes by value.
#[derive(Debug, Clone)]
pub enum Value {
    /// An array (a tensor); its dtype is what it is.
    Array(Tensor),
    /// A scalar; see [`crate::dtypes`] for how it promotes.
    Scalar(Scalar),
}

impl From<Tensor> for Value {
    fn from(t: Tensor) -> Value {
        Value::Array(t)
    }
}
macro_rules! value_from {
    ($($t:ty => $e:expr),*) => {$(
        impl From<$t> for Value {
            fn from(v: $t) -> Value {
                let f: fn($t) -> Scalar = $e;
                Value::Scalar(f(v))
            }
        }
    )*};
}
value_from!(
    bool => Scalar::Bool,
    i8 => |v| Scalar::Int(v as i64, DType::I8),
    u8 => |v| Scalar::Int(v as i64, DType::U8),
    i16 => |v| Scalar::Int(v as i64, DType::I16),
    u16 => |v| Scalar::Int(v as i64, DType::U16),
    u32 => |v| Scalar::Int(v as i64, DType::U32),
    i32 => |v| Scalar::Int(v as i64, DType::I32),
    i64 => |v| Scalar::Int(v, DType::I64),
    usize => |v| Scalar::Int(v as i64, DType::I64),
    f32 => |v| Scalar::Float(v as f64, DType::F32),
    f64 => |v| Scalar::Float(v, DType::F64)
);

impl Value {
    /// The device an array lives on (`None` for scalars).
    pub fn device(&self) -> Option<Device> {
        match self {
            Value::Array(t) => Some(t.device()),
            Value::Scalar(_) => None,
        }
    }
    /// The dtype this value has on its own (a scalar's Rust type, `f64` as the default float).
    pub fn dtype(&self) -> DType {
        match self {
            Value::Array(t) => t.dtype(),
            Value::Scalar(s) => scalar_dtype(*s),
        }
    }
    /// As a tensor of `dtype` on `device` (arrays are cast, never moved: an array on another
    /// device stays there and the op that uses it reports the mismatch).
    pub fn to_tensor(&self, dtype: DType, device: Device) -> Result<Tensor> {
        match self {
            Value::Array(t) => t.cast(dtype),
            Value::Scalar(s) => {
                // converted on the host, so no dtype the device lacks (float64 on a GPU)
                // is ever uploaded
                let host = match (*s, dtype) {
                    (Scalar::Int(v, _), DType::I64) => HostData::I64(vec![v]),
                    (Scalar::Bool(b), _) => HostData::filled(dtype, 1, b as u8 as f64),
                    (Scalar::Int(v, _), _) => HostData::filled(dtype, 1, v as f64),
                    (Scalar::Float(v, _), _) => HostData::filled(dtype, 1, v),
                };
                Tensor::from_host_on(host, &[], device)
            }
        }
    }
    /// As a tensor in its own dtype on the current device.
    pub fn into_tensor(self) -> Result<Tensor> {
        match self {
            Value::Array(t) => Ok(t),
            s => {
                let d = s.dtype();
                s.to_tensor(d, current_device())
            }
        }
    }
}

/// Anything a NumPy function takes as an array argument.
pub trait ArrayLike {
    /// The argument as an array or a scalar.
    fn to_value(&self) -> Result<Value>;
}

impl ArrayLike for Tensor {
    fn to_value(&self) -> Result<Value> {
        Ok(Value::Array(self.clone()))
    }
}
impl ArrayLike for Value {
    fn to_value(&self) -> Result<Value> {
        Ok(self.clone())
    }
}
impl<A: ArrayLike + ?Sized> ArrayLike for &A {
    fn to_value(&self) -> Result<Value> {
        (**self).to_value()
    }
}
macro_rules! scalar_like {
    ($($t:ty),*) => {$(
        impl ArrayLike for $t {
            fn to_value(&self) -> Result<Value> {
                Ok(Value::from(*self))
            }
        }
    )*};
}
scalar_like!(bool, i8, u8, i16, u16, u32, i32, i64, usize, f32, f64);

/// Host data for a Rust element type, with `f64` data in the default float dtype.
fn host_tensor<T: Element>(data: Vec<T>, shape: &[usize]) -> Result<Tensor> {
    if T::DTYPE == DType::F64 && default_float() != DType::F64 {
        // converted on the host: a device without float64 never receives it
        let v: Vec<f64> = data.iter().map(|x| x.to_f64()).collect();
        return Tensor::from_host(HostData::from_f64_slice(default_float(), &v), shape);
    }
    Tensor::from_vec(data, shape)
}

/// Nested Rust data (elements, arrays, slices and vectors of them) with a rectangular shape.
pub trait Nested {
    /// The element type.
    type Elem: Element;
    /// The shape, or `None` when nested parts differ in length (a ragged list).
    fn nested_shape(&self) -> Option<Vec<usize>>;
    /// Appends the elements in C order.
    fn flatten_into(&self, out: &mut Vec<Self::Elem>);
}

macro_rules! nested_elem {
    ($($t:ty),*) => {$(
        impl Nested for $t {
            type Elem = $t;
            fn nested_shape(&self) -> Option<Vec<usize>> { Some(Vec::new()) }
            fn flatten_into(&self, out: &mut Vec<$t>) { out.push(*self) }
        }
    )*};
}
nested_elem!(
    f64,
    f32,
    i64,
    i32,
    i8,
    u8,
    i16,
    u16,
    u32,
    u64,
    bool,
    ferroflow_tensor::f16,
    ferroflow_tensor::bf16,
    ferroflow_tensor::Complex32,
    ferroflow_tensor::Complex64
);

fn seq_shape<A: Nested>(items: &[A]) -> Option<Vec<usize>> {
    let mut inner: Option<Vec<usize>> = None;
    for it in items {
        let s = it.nested_shape()?;
        match &inner {
            None => inner = Some(s),
            Some(prev) if *prev != s => return None,
            _ => {}
        }
    }
    let mut shape = vec![items.len()];
    shape.extend(inner.unwrap_or_default());
    Some(shape)
}

impl<A: Nested> Nested for [A] {
    type Elem = A::Elem;
    fn nested_shape(&self) -> Option<Vec<usize>> {
        seq_shape(self)
    }
    fn flatten_into(&self, out: &mut Vec<A::Elem>) {
        self.iter().for_each(|a| a.flatten_into(out))
    }
}
impl<A: Nested, const N: usize> Nested for [A; N] {
    type Elem = A::Elem;
    fn nested_shape(&self) -> Option<Vec<usize>> {
        seq_shape(self)
    }
    fn flatten_into(&self, out: &mut Vec<A::Elem>) {
        self.iter().for_each(|a| a.flatten_into(out))
    }
}
impl<A: Nested> Nested for Vec<A> {
    type Elem = A::Elem;
    fn nested_shape(&self) -> Option<Vec<usize>> {
        seq_shape(self)
    }
    fn flatten_into(&self, out: &mut Vec<A::Elem>) {
        self.iter().for_each(|a| a.flatten_into(out))
    }
}

fn nested_value<N: Nested + ?Sized>(n: &N) -> Result<Value> {
    let shape = n.nested_shape().ok_or_else(|| {
        ferroflow_tensor::Error::invalid(
            "array",
            "setting an array element with a sequence. The requested array has an inhomogeneous shape",
        )
    })?;
    let mut data = Vec::new();
    n.flatten_into(&mut data);
    Ok(Value::Array(host_tensor(data, &shape)?))
}

impl<A: Nested> ArrayLike for [A] {
    fn to_value(&self) -> Result<Value> {
        nested_value(self)
    }
}
impl<A: Nested, const N: usize> ArrayLike for [A; N] {
    fn to_value(&self) -> Result<Value> {
        nested_value(self)
    }
}
impl<A: Nested> ArrayLike for Vec<A> {
    fn to_value(&self) -> Result<Value> {
        nested_value(self)
    }
}

/// `numpy.asarray`: the argument as an array; an array is returned as it is (same storage).
pub fn asarray(a: impl ArrayLike) -> Result<Tensor> {
    a.to_value()?.into_tensor()
}

/// `numpy.asarray(a, dtype)`: the argument as an array of `dtype` (a cast only when needed).
pub fn asarray_of(a: impl ArrayLike, dtype: DType) -> Result<Tensor> {
    let v = a.to_value()?;
    let device = v.device().unwrap_or_else(current_device);
    v.to_tensor(dtype, device)
}

/// `numpy.array`: a new array (a copy, even of an array).
///
/// ```
/// use ferroflow_numpy as np;
/// ferroflow::init();
/// let a = np::asarray([1i32, 2, 3])?;
/// let b = np::array(&a)?;
/// assert!(!b.shares_storage_with(&a));
/// assert_eq!(b.to_vec::<i32>()?, vec![1, 2, 3]);
/// # Ok::<(), np::Error>(())
/// ```
pub fn array(a: impl ArrayLike) -> Result<Tensor> {
    match a.to_value()? {
        Value::Array(t) => t.copy(),
        s => s.into_tensor(),
    }
}

/// Converts arguments to tensors of their common NumPy dtype (`result_type`) on the device of
/// the first array among them (the current device when all are scalars).
pub(crate) fn promote_all(values: &[Value]) -> Result<(Vec<Tensor>, DType)> {
    let refs: Vec<&Value> = values.iter().collect();
    let dtype = result_type(&refs)?;
    let tensors = cast_all(values, dtype)?;
    Ok((tensors, dtype))
}

/// Converts arguments to tensors of `dtype` on the device of the first array among them.
pub(crate) fn cast_all(values: &[Value], dtype: DType) -> Result<Vec<Tensor>> {
    let device = values
        .iter()
        .find_map(Value::device)
        .unwrap_or_else(current_device);
    values.iter().map(|v| v.to_tensor(dtype, device)).collect()
}

/// Two arguments promoted together.
pub(crate) fn promote2(a: impl ArrayLike, b: impl ArrayLike) -> Result<(Tensor, Tensor, DType)> {
    let (t, d) = promote_all(&[a.to_value()?, b.to_value()?])?;
    let mut it = t.into_iter();
    match (it.next(), it.next()) {
        (Some(a), Some(b)) => Ok((a, b, d)),
        _ => Err(ferroflow_tensor::Error::invalid(
            "result_type",
            "two arguments expected",
        )),
    }
}

/// One argument as an array.
pub(crate) fn arr(a: impl ArrayLike) -> Result<Tensor> {
    asarray(a)
}
