//! Indexing ops: `gather` and `scatter_add` (primitives), and `gather_nd`, `scatter_nd`,
//! `tensor_scatter_nd_add`, `one_hot` composed from them.

use crate::dispatch::dispatch;
use crate::dtype::{DType, HostData};
use crate::error::{Error, Result};
use crate::layout::normalize_axis;
use crate::op::Op;
use crate::tensor::Tensor;

fn check_indices(op: &'static str, indices: &Tensor) -> Result<()> {
    match indices.dtype() {
        DType::I32 | DType::I64 => Ok(()),
        d => Err(Error::UnsupportedDType {
            op,
            dtype: d,
            expected: "int32 or int64 indices",
        }),
    }
}

/// Validates `[.., depth]` indices against `dims` on the host and flattens them to row-major
/// positions in `dims` (shape: the index batch shape).
fn flatten_nd_indices(op: &'static str, indices: &Tensor, dims: &[usize]) -> Result<Tensor> {
    check_indices(op, indices)?;
    let depth = *indices
        .shape()
        .last()
        .ok_or_else(|| Error::invalid(op, "indices must have rank >= 1"))?;
    if depth > dims.len() {
        return Err(Error::invalid(
            op,
            format!(
                "index depth {depth} exceeds the rank {} of shape {dims:?}",
                dims.len()
            ),
        ));
    }
    if depth == 0 {
        return Err(Error::invalid(
            op,
            "index depth (the last axis of indices) must be at least 1",
        ));
    }
    let raw: Vec<i64> = indices
        .to_f64_vec()?
        .into_iter()
        .map(|v| v as i64)
        .collect();
    let mut flat = Vec::with_capacity(raw.len() / depth);
    for chunk in raw.chunks(depth) {
        let mut pos = 0i64;
        for (j, &i) in chunk.iter().enumerate() {
            if i < 0 || i >= dims[j] as i64 {
                return Err(Error::IndexOutOfRange {
                    op,
                    index: i,
                    bound: dims[j],
                });
            }
            pos = pos * dims[j] as i64 + i;
        }
        flat.push(pos);
    }
    let batch = &indices.shape()[..indices.rank() - 1];
    Tensor::from_host_on(HostData::I64(flat), batch, indices.device())
}

impl Tensor {
    /// Gathers slices along `axis` (`tf.gather`): output shape
    /// `x.shape[..axis] ++ indices.shape ++ x.shape[axis+1..]`. Out-of-range indices are an error.
    pub fn gather(&self, indices: &Tensor, axis: isize) -> Result<Tensor> {
        check_indices("gather", indices)?;
        let axis = normalize_axis("gather", axis, self.rank())?;
        let mut shape = self.shape()[..axis].to_vec();
        shape.extend_from_slice(indices.shape());
        shape.extend_from_slice(&self.shape()[axis + 1..]);
        dispatch(
            || Op::Gather { axis },
            &[self, indices],
            |p| {
                if p.check_output("gather", &shape, self.dtype())? == 0 {
                    return p.empty(&shape, self.dtype());
                }
                let buf = p.backend.gather(self.operand(), indices.operand(), axis)?;
                Ok(Tensor::from_buffer(
                    buf,
                    &shape,
                    self.dtype(),
                    p.backend,
                    p.device,
                ))
            },
        )
    }

    /// [`Tensor::gather`] of each of `xs` by the same `indices` along `axis`: one kernel
    /// where the backend can (wgpu: up to three tensors as long along `axis`), the gathers
    /// one by one elsewhere; the same values and errors as those gathers. What `fit` does to
    /// a batch's inputs and targets.
    ///
    /// ```no_run
    /// // A backend registered first: `ferroflow::init()` (the facade).
    /// use ferroflow_tensor::Tensor;
    /// let x = Tensor::from_vec(vec![1.0f32, 2.0, 3.0, 4.0, 5.0, 6.0], &[3, 2])?;
    /// let y = Tensor::from_vec(vec![7i64, 8, 9], &[3])?;
    /// let idx = Tensor::from_vec(vec![2i64, 0], &[2])?;
    /// let batch = Tensor::gather_group(&[x, y], &idx, 0)?;
    /// assert_eq!(batch[0].to_vec::<f32>()?, vec![5.0, 6.0, 1.0, 2.0]);
    /// assert_eq!(batch[1].to_vec::<i64>()?, vec![9, 7]);
    /// # Ok::<(), ferroflow_tensor::Error>(())
    /// ```
    pub fn gather_group(xs: &[Tensor], indices: &Tensor, axis: isize) -> Result<Vec<Tensor>> {
        check_indices("gather_group", indices)?;
        let Some(first) = xs.first() else {
            return Ok(vec![]);
        };
        let axis = normalize_axis("gather_group", axis, first.rank())?;
        let mut shapes = Vec::with_capacity(xs.len());
        for x in xs {
            if x.rank() <= axis || x.shape()[axis] != first.shape()[axis] {
                return Err(Error::ShapeMismatch {
                    op: "gather_group",
                    msg: "every tensor must be as long along the gathered axis",
                    lhs: first.shape().to_vec(),
                    rhs: x.shape().to_vec(),
                });
            }
            let mut shape = x.shape()[..axis].to_vec();
            shape.extend_from_slice(indices.shape());
            shape.extend_from_slice(&x.shape()[axis + 1..]);
            shapes.push(shape);
        }
        // One tensor, or an empty output: `gather` as it is (devices are checked by
        // `dispatch` either way).
        let empty = shapes.iter().any(|s| s.contains(&0));
        if xs.len() == 1 || empty {
            return xs
                .iter()
                .map(|x| x.gather(indices, axis as isize))
                .collect();
        }
        let mut inputs: Vec<&Tensor> = xs.iter().collect();
        inputs.push(indices);
        dispatch(
            || Op::GatherGroup { axis },
            &inputs,
            |p| {
                for (x, s) in xs.iter().zip(&shapes) {
                    p.check_output("gather_group", s, x.dtype())?;
                }
                let operands: Vec<_> = xs.iter().map(|x| x.operand()).collect();
                let bufs = p.backend.gather_group(&operands, indices.operand(), axis)?;
                if bufs.len() != xs.len() {
                    return Err(Error::Backend {
                        backend: p.backend.name(),
                        msg: format!(
                            "gather_group returned {} buffers for {} tensors",
                            bufs.len(),
                            xs.len()
                        ),
                    });
                }
                Ok(bufs
                    .into_iter()
                    .zip(xs.iter().zip(&shapes))
                    .map(|(b, (x, s))| Tensor::from_buffer(b, s, x.dtype(), p.backend, p.device))
                    .collect::<Vec<Tensor>>())
            },
        )
    }

    /// The adjoint of [`Tensor::gather`]: zeros of `shape`, with each slice of `updates` added at
    /// its index along `axis` (repeated indices accumulate; `tf.math.unsorted_segment_sum`).
    pub fn scatter_add(
        indices: &Tensor,
        updates: &Tensor,
        shape: &[usize],
        axis: isize,
    ) -> Result<Tensor> {
        check_indices("scatter_add", indices)?;
        let axis = normalize_axis("scatter_add", axis, shape.len())?;
        let mut expected = shape[..axis].to_vec();
        expected.extend_from_slice(indices.shape());
        expected.extend_from_slice(&shape[axis + 1..]);
        if updates.shape() != expected.as_slice() {
            return Err(Error::ShapeMismatch {
                op: "scatter_add",
                msg: "updates must have shape out[..axis] ++ indices ++ out[axis+1..]",
                lhs: expected,
                rhs: updates.shape().to_vec(),
            });
        }
        if updates.dtype() == DType::Bool {
            return Err(Error::UnsupportedDType {
                op: "scatter_add",
                dtype: DType::Bool,
                expected: "a numeric dtype",
            });
        }
        dispatch(
            || Op::ScatterAdd {
                axis,
                shape: shape.to_vec(),
            },
            &[indices, updates],
            |p| {
                if p.check_output("scatter_add", shape, updates.dtype())? == 0 {
                    return p.empty(shape, updates.dtype());
                }
                let buf =
                    p.backend
                        .scatter_add(indices.operand(), updates.operand(), shape, axis)?;
                Ok(Tensor::from_buffer(
                    buf,
                    shape,
                    updates.dtype(),
                    p.backend,
                    p.device,
                ))
            },
        )
    }

    /// `tf.gather_nd`: `indices[.., depth]` picks slices of the first `depth` axes.
    pub fn gather_nd(&self, indices: &Tensor) -> Result<Tensor> {
        let flat = flatten_nd_indices("gather_nd", indices, self.shape())?;
        let depth = indices.shape()[indices.rank() - 1];
        let lead: usize = self.shape()[..depth].iter().product();
        let mut merged = vec![lead as isize];
        merged.extend(self.shape()[depth..].iter().map(|&d| d as isize));
        self.reshape(&merged)?.gather(&flat, 0)
    }

    /// `tf.scatter_nd`: zeros of `shape` with `updates` added at `indices[.., depth]`.
    pub fn scatter_nd(indices: &Tensor, updates: &Tensor, shape: &[usize]) -> Result<Tensor> {
        let flat = flatten_nd_indices("scatter_nd", indices, shape)?;
        let depth = indices.shape()[indices.rank() - 1];
        crate::layout::checked_num_elements("scatter_nd", shape)?;
        let lead: usize = shape[..depth].iter().product();
        let mut merged = vec![lead];
        merged.extend_from_slice(&shape[depth..]);
        let mut upd_shape = flat.shape().to_vec();
        upd_shape.extend_from_slice(&shape[depth..]);
        if updates.shape() != upd_shape.as_slice() {
            return Err(Error::ShapeMismatch {
                op: "scatter_nd",
                msg: "updates must have shape indices[..-1] ++ shape[depth..]",
                lhs: upd_shape,
                rhs: updates.shape().to_vec(),
            });
        }
        Tensor::scatter_add(&flat, updates, &merged, 0)?.reshape_to(shape)
    }

    /// `tf.tensor_scatter_nd_add`: `self` plus `updates` scattered at `indices`.
    pub fn tensor_scatter_nd_add(&self, indices: &Tensor, updates: &Tensor) -> Result<Tensor> {
        self.add(&Tensor::scatter_nd(indices, updates, self.shape())?)
    }

    /// `tf.one_hot`: a new last axis of size `depth`, `on` at the index and `off` elsewhere
    /// (indices outside `0..depth` give a row of `off`).
    pub fn one_hot(
        indices: &Tensor,
        depth: usize,
        on: f64,
        off: f64,
        dtype: DType,
    ) -> Result<Tensor> {
        check_indices("one_hot", indices)?;
        let positions =
            Tensor::range(0.0, depth as f64, 1.0, indices.dtype())?.to_device(indices.device())?;
        let hit = indices.expand_dims(-1)?.equal(&positions)?;
        let on = Tensor::from_host_on(HostData::filled(dtype, 1, on), &[], indices.device())?;
        let off = Tensor::from_host_on(HostData::filled(dtype, 1, off), &[], indices.device())?;
        Tensor::select(&hit, &on, &off)
    }
}
