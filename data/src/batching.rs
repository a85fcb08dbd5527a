//! Stacking elements into batches and splitting batches back into elements.

use ferroflow_tensor::{Error, Result, Tensor};

use crate::dataset::PaddedBatch;
use crate::structure::Structure;

/// Stacks `elements` component by component along a new first axis, padding first when
/// `padding` is given.
pub(crate) fn stack<T: Structure>(elements: &[T], padding: Option<&PaddedBatch>) -> Result<T> {
    let spec = elements[0].spec();
    let mut columns: Vec<Vec<Tensor>> =
        vec![Vec::with_capacity(elements.len()); spec.num_tensors()];
    for (i, e) in elements.iter().enumerate() {
        let s = e.spec();
        if s != spec {
            return Err(Error::InvalidArgument {
                op: "batch",
                msg: format!("element {i} of the batch has structure {s}, the first has {spec}"),
            });
        }
        for (col, t) in columns.iter_mut().zip(e.flatten()) {
            col.push(t);
        }
    }
    let stacked = columns
        .iter()
        .enumerate()
        .map(|(c, col)| match padding {
            None => stack_equal(c, col),
            Some(p) => stack_padded(c, col, p),
        })
        .collect::<Result<Vec<_>>>()?;
    T::from_parts(&spec, &mut stacked.into_iter())
}

fn stack_equal(component: usize, col: &[Tensor]) -> Result<Tensor> {
    if let Some(t) = col.iter().find(|t| t.shape() != col[0].shape()) {
        return Err(Error::InvalidArgument {
            op: "batch",
            msg: format!(
                "component {component} has shapes {:?} and {:?} in one batch; batch needs equal \
                 shapes, padded_batch pads them",
                col[0].shape(),
                t.shape()
            ),
        });
    }
    if let Some(t) = col.iter().find(|t| t.dtype() != col[0].dtype()) {
        return Err(Error::DTypeMismatch {
            op: "batch",
            lhs: col[0].dtype(),
            rhs: t.dtype(),
        });
    }
    Tensor::stack(col, 0)
}

fn stack_padded(component: usize, col: &[Tensor], options: &PaddedBatch) -> Result<Tensor> {
    let rank = col[0].rank();
    if let Some(t) = col.iter().find(|t| t.rank() != rank) {
        return Err(Error::InvalidArgument {
            op: "padded_batch",
            msg: format!(
                "component {component} has ranks {rank} and {} in one batch; padding keeps the rank",
                t.rank()
            ),
        });
    }
    let mut target: Vec<usize> = (0..rank)
        .map(|a| col.iter().map(|t| t.shape()[a]).max().unwrap_or(0))
        .collect();
    if !options.padded_shapes.is_empty() {
        let fixed = options
            .padded_shapes
            .get(component)
            .ok_or_else(|| Error::InvalidArgument {
                op: "padded_batch",
                msg: format!(
                    "padded_shapes has {} entries, the element has more components",
                    options.padded_shapes.len()
                ),
            })?;
        if fixed.len() != rank {
            return Err(Error::InvalidArgument {
                op: "padded_batch",
                msg: format!(
                    "padded shape {fixed:?} of component {component} has rank {}, the component has rank {rank}",
                    fixed.len()
                ),
            });
        }
        for (a, f) in fixed.iter().enumerate() {
            if let Some(size) = *f {
                if size < target[a] {
                    return Err(Error::InvalidArgument {
                        op: "padded_batch",
                        msg: format!(
                            "component {component} has size {} on axis {a}, larger than its padded size {size}",
                            target[a]
                        ),
                    });
                }
                target[a] = size;
            }
        }
    }
    let padded = col
        .iter()
        .map(|t| {
            let pads: Vec<(usize, usize)> = t
                .shape()
                .iter()
                .zip(&target)
                .map(|(&s, &n)| (0, n - s))
                .collect();
            if pads.iter().all(|p| p.1 == 0) {
                Ok(t.clone())
            } else {
                t.pad(&pads, options.padding_value)
            }
        })
        .collect::<Result<Vec<_>>>()?;
    stack_equal(component, &padded)
}

/// Splits every component of `x` along its first axis; all must share that dimension.
pub(crate) fn unstack<T: Structure>(x: &T) -> Result<Vec<T>> {
    let spec = x.spec();
    let parts = x.flatten();
    let Some(first) = parts.first() else {
        return Ok(Vec::new());
    };
    if let Some(t) = parts
        .iter()
        .find(|t| t.rank() == 0 || t.shape()[0] != first.shape()[0])
    {
        return Err(Error::InvalidArgument {
            op: "unbatch",
            msg: format!(
                "every component needs the same first dimension, got shapes {:?} and {:?}",
                first.shape(),
                t.shape()
            ),
        });
    }
    let columns = parts
        .iter()
        .map(|t| t.unstack(0))
        .collect::<Result<Vec<_>>>()?;
    (0..first.shape()[0])
        .map(|i| T::from_parts(&spec, &mut columns.iter().map(|c| c[i].clone())))
        .collect()
}
