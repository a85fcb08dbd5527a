//! Argument checks with NumPy's wording, shared by every module.

use ferroflow_tensor::{Axes, Error, HostData, Result, Tensor};

/// NumPy's `AxisError`: "axis 3 is out of bounds for array of dimension 2".
pub(crate) fn axis_error(op: &'static str, axis: isize, ndim: usize) -> Error {
    Error::invalid(
        op,
        format!("AxisError: axis {axis} is out of bounds for array of dimension {ndim}"),
    )
}

/// One axis from the API's one axis argument type ([`Axes`]): `None` (every axis: for
/// these functions, the flattened array) or a single axis; several are an error.
pub(crate) fn one_axis(op: &'static str, axis: Axes) -> Result<Option<isize>> {
    match axis {
        Axes::All => Ok(None),
        Axes::List(v) if v.len() == 1 => Ok(Some(v[0])),
        Axes::List(v) => Err(Error::invalid(
            op,
            format!("takes one axis (or None), got {v:?}"),
        )),
    }
}

/// Exactly one axis (`None` is an error: this function has no flattened form).
pub(crate) fn required_axis(op: &'static str, axis: Axes) -> Result<isize> {
    one_axis(op, axis)?.ok_or_else(|| Error::invalid(op, "needs an axis (an integer), got None"))
}

/// A possibly negative axis of an array of rank `ndim`, NumPy's way.
pub(crate) fn norm_axis(op: &'static str, axis: isize, ndim: usize) -> Result<usize> {
    let n = ndim as isize;
    if axis < -n || axis >= n {
        return Err(axis_error(op, axis, ndim));
    }
    Ok(if axis < 0 { axis + n } else { axis } as usize)
}

/// NumPy's `axis=None` convention for one-axis functions: `None` works on the flattened
/// array (axis 0 of it), `Some(axis)` on that axis (checked, NumPy's wording).
pub(crate) fn axis_or_flat(
    op: &'static str,
    a: Tensor,
    axis: Option<isize>,
) -> Result<(Tensor, usize)> {
    match axis {
        None => Ok((a.reshape(&[-1])?, 0)),
        Some(ax) => {
            let ax = norm_axis(op, ax, a.rank())?;
            Ok((a, ax))
        }
    }
}

/// Several axes, NumPy's way: each in range, no repeats ("repeated axis").
pub(crate) fn norm_axes(op: &'static str, axes: &[isize], ndim: usize) -> Result<Vec<usize>> {
    let mut out = Vec::with_capacity(axes.len());
    for &a in axes {
        let a = norm_axis(op, a, ndim)?;
        if out.contains(&a) {
            return Err(Error::invalid(op, "repeated axis"));
        }
        out.push(a);
    }
    Ok(out)
}

/// NumPy's broadcast error: "operands could not be broadcast together with shapes (2,3) (4,)".
pub(crate) fn broadcast_shape(op: &'static str, shapes: &[&[usize]]) -> Result<Vec<usize>> {
    let rank = shapes.iter().map(|s| s.len()).max().unwrap_or(0);
    let mut out = vec![1usize; rank];
    for s in shapes {
        for (i, &d) in s.iter().enumerate() {
            let o = &mut out[rank - s.len() + i];
            if *o == 1 {
                *o = d;
            } else if d != 1 && d != *o {
                let list: Vec<String> = shapes.iter().map(|s| py_shape(s)).collect();
                return Err(Error::invalid(
                    op,
                    format!(
                        "operands could not be broadcast together with shapes {}",
                        list.join(" ")
                    ),
                ));
            }
        }
    }
    Ok(out)
}

/// A shape as Python prints it: `(2, 3)`, `(4,)`, `()`.
pub(crate) fn py_shape(s: &[usize]) -> String {
    match s.len() {
        1 => format!("({},)", s[0]),
        _ => format!(
            "({})",
            s.iter()
                .map(|d| d.to_string())
                .collect::<Vec<_>>()
                .join(", ")
        ),
    }
}

/// Host values as i64 (indices, counts), rejecting non-integer dtypes.
pub(crate) fn host_i64(op: &'static str, t: &Tensor) -> Result<Vec<i64>> {
    if !(t.dtype().is_int() || t.dtype() == ferroflow_tensor::DType::Bool) {
        return Err(Error::invalid(
            op,
            format!(
                "arrays used as indices must be of integer (or boolean) type, got {}",
                t.dtype()
            ),
        ));
    }
    Ok(match t.cast(ferroflow_tensor::DType::I64)?.to_host()? {
        HostData::I64(v) => v,
        other => other.to_f64_vec().into_iter().map(|x| x as i64).collect(),
    })
}

/// An int64 tensor from host values on the device of `like`.
pub(crate) fn i64_tensor(values: Vec<i64>, shape: &[usize], like: &Tensor) -> Result<Tensor> {
    Tensor::from_host_on(HostData::I64(values), shape, like.device())
}

/// A bool tensor from host values on the device of `like`.
pub(crate) fn bool_tensor(values: Vec<bool>, shape: &[usize], like: &Tensor) -> Result<Tensor> {
    Tensor::from_host_on(HostData::Bool(values), shape, like.device())
}
