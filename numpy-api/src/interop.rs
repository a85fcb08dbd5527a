//! Conversions to and from the Rust array crates: `ndarray` arrays (any dimension, any
//! ferroflow element type) and `nalgebra` matrices. Both also work as [`ArrayLike`]
//! arguments directly.
//!
//! ```
//! use ferroflow_numpy as np;
//! ferroflow::init();
//! let a = ndarray::array![[1.0f32, 2.0], [3.0, 4.0]];
//! let t = np::from_ndarray(&a)?;
//! assert_eq!(t.shape(), &[2, 2]);
//! let back: ndarray::ArrayD<f32> = np::to_ndarray(&np::transpose(&t, None)?)?;
//! assert_eq!(back[[0, 1]], 3.0);
//! let m = nalgebra::DMatrix::from_row_slice(2, 2, &[1.0, 2.0, 3.0, 4.0]);
//! assert_eq!(np::to_dmatrix(&np::asarray(&m)?)?, m);
//! # Ok::<(), np::Error>(())
//! ```

use ferroflow_tensor::{Element, Error, Result, Tensor};

use crate::array::{ArrayLike, Value};

/// An `ndarray` array (view or owned, any dimension) as a tensor on the current device.
pub fn from_ndarray<T, S, D>(a: &ndarray::ArrayBase<S, D>) -> Result<Tensor>
where
    T: Element,
    S: ndarray::Data<Elem = T>,
    D: ndarray::Dimension,
{
    let data: Vec<T> = a.iter().copied().collect();
    Tensor::from_vec(data, a.shape())
}

/// A tensor as an owned `ndarray` array; `T` must be the tensor's element type.
pub fn to_ndarray<T: Element>(t: &Tensor) -> Result<ndarray::ArrayD<T>> {
    let v = t.to_vec::<T>()?;
    ndarray::ArrayD::from_shape_vec(ndarray::IxDyn(t.shape()), v)
        .map_err(|e| Error::invalid("to_ndarray", e.to_string()))
}

/// A `nalgebra` matrix as a 2-D tensor (rows × columns).
pub fn from_dmatrix<T, R, C, S>(m: &nalgebra::Matrix<T, R, C, S>) -> Result<Tensor>
where
    T: Element + nalgebra::Scalar,
    R: nalgebra::Dim,
    C: nalgebra::Dim,
    S: nalgebra::RawStorage<T, R, C>,
{
    let (r, c) = m.shape();
    let mut data = Vec::with_capacity(r * c);
    for i in 0..r {
        for j in 0..c {
            data.push(m[(i, j)]);
        }
    }
    Tensor::from_vec(data, &[r, c])
}

/// A 2-D tensor as a `nalgebra` `DMatrix<f64>` (values converted to f64).
pub fn to_dmatrix(t: &Tensor) -> Result<nalgebra::DMatrix<f64>> {
    if t.rank() != 2 {
        return Err(Error::invalid(
            "to_dmatrix",
            format!("expected a 2-d array, got shape {:?}", t.shape()),
        ));
    }
    let v = t.to_f64_vec()?;
    Ok(nalgebra::DMatrix::from_row_slice(
        t.shape()[0],
        t.shape()[1],
        &v,
    ))
}

impl<T, S, D> ArrayLike for ndarray::ArrayBase<S, D>
where
    T: Element,
    S: ndarray::Data<Elem = T>,
    D: ndarray::Dimension,
{
    fn to_value(&self) -> Result<Value> {
        Ok(Value::Array(from_ndarray(self)?))
    }
}

impl<T, R, C, S> ArrayLike for nalgebra::Matrix<T, R, C, S>
where
    T: Element + nalgebra::Scalar,
    R: nalgebra::Dim,
    C: nalgebra::Dim,
    S: nalgebra::RawStorage<T, R, C>,
{
    fn to_value(&self) -> Result<Value> {
        Ok(Value::Array(from_dmatrix(self)?))
    }
}
