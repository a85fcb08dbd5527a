//! Shape ops. Views where possible (reshape of dense data, transpose, slices with any step,
//! reverse, broadcast_to, expand_dims, squeeze, split); copies otherwise (concat, stack, pad,
//! tile, reshape of a non-dense view).

use crate::dispatch::dispatch;
use crate::error::{Error, Result};
use crate::layout::{
    checked_dim_sum, checked_num_elements, normalize_axes, normalize_axis, Layout,
};
use crate::op::Op;
use crate::tensor::Tensor;

/// One axis of a [`Tensor::strided_slice`], Python-slice style.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SliceSpec {
    /// `start:stop:step`; `None` ends mean "from the edge"; negative positions count from the end.
    Range {
        /// First position (inclusive).
        start: Option<isize>,
        /// Last position (exclusive).
        stop: Option<isize>,
        /// Step, non-zero, may be negative.
        step: isize,
    },
    /// A single index; the axis is removed (TF's shrink_axis_mask).
    Index(isize),
    /// A new size-1 axis (TF's new_axis_mask, NumPy's `newaxis`).
    NewAxis,
}

impl SliceSpec {
    /// `:` (the whole axis).
    pub const ALL: SliceSpec = SliceSpec::Range {
        start: None,
        stop: None,
        step: 1,
    };
    /// `start:stop`.
    pub fn range(start: isize, stop: isize) -> SliceSpec {
        SliceSpec::Range {
            start: Some(start),
            stop: Some(stop),
            step: 1,
        }
    }
    /// `::-1`.
    pub fn reversed() -> SliceSpec {
        SliceSpec::Range {
            start: None,
            stop: None,
            step: -1,
        }
    }
}

/// Python's slice resolution: (first index, length) for one axis of size `n`.
fn resolve_range(
    n: usize,
    start: Option<isize>,
    stop: Option<isize>,
    step: isize,
) -> (usize, usize) {
    // Shapes are bounded by isize::MAX elements (checked_num_elements), so `n` and the
    // differences below fit; the step may be any isize, so it is only ever divided by.
    let n = n as isize;
    let norm = |v: isize| if v < 0 { v.saturating_add(n) } else { v };
    let count = |span: isize| (span as usize - 1) / step.unsigned_abs() + 1;
    if step > 0 {
        let a = start.map(norm).unwrap_or(0).clamp(0, n);
        let b = stop.map(norm).unwrap_or(n).clamp(0, n);
        (a as usize, if b > a { count(b - a) } else { 0 })
    } else {
        let a = start.map(norm).unwrap_or(n - 1).clamp(-1, n - 1);
        let b = stop.map(norm).unwrap_or(-1).clamp(-1, n - 1);
        (a.max(0) as usize, if a > b { count(a - b) } else { 0 })
    }
}

impl Tensor {
    /// A view with another layout over the same storage, recorded as `op`.
    fn view_op(&self, op: impl FnOnce() -> Op, layout: Layout) -> Result<Tensor> {
        dispatch(op, &[self], |_| Ok(self.view(layout)))
    }

    /// Same elements, new shape; one entry may be -1 (inferred). A view when the data is
    /// dense, a copy otherwise (`tf.reshape`).
    pub fn reshape(&self, shape: &[isize]) -> Result<Tensor> {
        let n = self.num_elements();
        let mut infer = None;
        let mut known = 1usize;
        let mut out = Vec::with_capacity(shape.len());
        for (i, &d) in shape.iter().enumerate() {
            if d == -1 && infer.is_none() {
                infer = Some(i);
                out.push(0);
            } else if d < 0 {
                return Err(Error::invalid(
                    "reshape",
                    format!("bad dimension {d} in {shape:?} (only one -1 is allowed)"),
                ));
            } else {
                known = known.checked_mul(d as usize).ok_or_else(|| {
                    Error::invalid(
                        "reshape",
                        format!("shape {shape:?} has more elements than an address space holds"),
                    )
                })?;
                out.push(d as usize);
            }
        }
        if let Some(i) = infer {
            if known == 0 || !n.is_multiple_of(known) {
                return Err(Error::invalid(
                    "reshape",
                    format!(
                        "cannot infer -1 in {shape:?} for {n} elements (input shape {:?})",
                        self.shape()
                    ),
                ));
            }
            out[i] = n / known;
        } else if known != n {
            return Err(Error::invalid(
                "reshape",
                format!(
                    "cannot reshape {:?} ({n} elements) to {shape:?} ({known} elements)",
                    self.shape()
                ),
            ));
        }
        self.reshape_to(&out)
    }

    /// [`Tensor::reshape`] with a fully known shape.
    pub fn reshape_to(&self, shape: &[usize]) -> Result<Tensor> {
        if checked_num_elements("reshape", shape)? != self.num_elements() {
            return Err(Error::ShapeMismatch {
                op: "reshape",
                msg: "element counts differ",
                lhs: self.shape().to_vec(),
                rhs: shape.to_vec(),
            });
        }
        let op = || Op::Reshape {
            shape: shape.to_vec(),
        };
        if let Some(layout) = self.layout().reshape(shape) {
            return self.view_op(op, layout);
        }
        dispatch(op, &[self], |p| {
            if self.num_elements() == 0 {
                return p.empty(shape, self.dtype());
            }
            Ok(Tensor::from_buffer(
                p.backend.copy(self.operand())?,
                shape,
                self.dtype(),
                p.backend,
                p.device,
            ))
        })
    }

    /// Permutes axes (`tf.transpose(x, perm)`); a view.
    pub fn transpose(&self, perm: &[usize]) -> Result<Tensor> {
        let layout = self.layout().permute(perm)?;
        self.view_op(
            || Op::Transpose {
                perm: perm.to_vec(),
            },
            layout,
        )
    }
    /// Swaps the last two axes (matrix transpose of every matrix in a batch).
    pub fn t(&self) -> Result<Tensor> {
        let r = self.rank();
        if r < 2 {
            return Err(Error::invalid(
                "transpose",
                format!("needs rank >= 2, shape is {:?}", self.shape()),
            ));
        }
        let mut perm: Vec<usize> = (0..r).collect();
        perm.swap(r - 2, r - 1);
        self.transpose(&perm)
    }

    /// NumPy-style strided slice; axes past `specs` are kept whole. A view.
    pub fn strided_slice(&self, specs: &[SliceSpec]) -> Result<Tensor> {
        let consumed = specs
            .iter()
            .filter(|s| !matches!(s, SliceSpec::NewAxis))
            .count();
        if consumed > self.rank() {
            return Err(Error::invalid(
                "strided_slice",
                format!(
                    "{consumed} slice specs for a tensor of rank {}",
                    self.rank()
                ),
            ));
        }
        let (mut begin, mut len, mut step, mut drop) = (vec![], vec![], vec![], vec![]);
        let mut newaxes = vec![];
        let mut axis = 0;
        for spec in specs {
            match *spec {
                SliceSpec::NewAxis => newaxes.push(axis + newaxes.len()),
                SliceSpec::Index(i) => {
                    let n = self.shape()[axis];
                    let j = if i < 0 { i + n as isize } else { i };
                    if j < 0 || j >= n as isize {
                        return Err(Error::IndexOutOfRange {
                            op: "strided_slice",
                            index: i as i64,
                            bound: n,
                        });
                    }
                    begin.push(j as usize);
                    len.push(1);
                    step.push(1);
                    drop.push(axis);
                    axis += 1;
                }
                SliceSpec::Range {
                    start,
                    stop,
                    step: s,
                } => {
                    if s == 0 {
                        return Err(Error::invalid(
                            "strided_slice",
                            "slice step must be non-zero",
                        ));
                    }
                    let (b, l) = resolve_range(self.shape()[axis], start, stop, s);
                    begin.push(b);
                    len.push(l);
                    step.push(s);
                    axis += 1;
                }
            }
        }
        for a in axis..self.rank() {
            begin.push(0);
            len.push(self.shape()[a]);
            step.push(1);
        }
        let sliced = self.slice_view(begin, len, step)?;
        let mut out = if drop.is_empty() {
            sliced
        } else {
            sliced.squeeze(&drop.iter().map(|&a| a as isize).collect::<Vec<_>>())?
        };
        // New axes are positions in the output counted before dropped axes are removed.
        for &a in &newaxes {
            let removed_before = drop.iter().filter(|&&d| d < a).count();
            out = out.expand_dims((a - removed_before) as isize)?;
        }
        Ok(out)
    }

    pub(crate) fn slice_view(
        &self,
        begin: Vec<usize>,
        len: Vec<usize>,
        step: Vec<isize>,
    ) -> Result<Tensor> {
        let layout = self.layout().slice_steps(&begin, &len, &step);
        self.view_op(|| Op::StridedSlice { begin, len, step }, layout)
    }

    /// `tf.slice`: `size[i] == -1` takes the rest of axis i. A view.
    pub fn slice(&self, begin: &[usize], size: &[isize]) -> Result<Tensor> {
        if begin.len() != self.rank() || size.len() != self.rank() {
            return Err(Error::invalid(
                "slice",
                format!(
                    "begin {begin:?} and size {size:?} must both have rank {}",
                    self.rank()
                ),
            ));
        }
        let mut len = vec![];
        for i in 0..self.rank() {
            let n = self.shape()[i];
            let l = if size[i] == -1 {
                n.saturating_sub(begin[i])
            } else if size[i] < 0 {
                usize::MAX
            } else {
                size[i] as usize
            };
            if begin[i] > n || l > n - begin[i].min(n) {
                return Err(Error::invalid(
                    "slice",
                    format!(
                        "begin {begin:?} size {size:?} is outside shape {:?}",
                        self.shape()
                    ),
                ));
            }
            len.push(l);
        }
        self.slice_view(begin.to_vec(), len, vec![1; self.rank()])
    }

    /// Reverses the given axes (`tf.reverse`); a view with negative strides.
    pub fn reverse(&self, axes: &[isize]) -> Result<Tensor> {
        let axes = normalize_axes("reverse", axes, self.rank())?;
        let mut begin = vec![0; self.rank()];
        let mut step = vec![1; self.rank()];
        for &a in &axes {
            begin[a] = self.shape()[a].saturating_sub(1);
            step[a] = -1;
        }
        self.slice_view(begin, self.shape().to_vec(), step)
    }

    /// NumPy broadcast to `shape` (`tf.broadcast_to`); a view with zero strides.
    pub fn broadcast_to(&self, shape: &[usize]) -> Result<Tensor> {
        let layout = self.layout().broadcast_to("broadcast_to", shape)?;
        dispatch(
            || Op::BroadcastTo {
                shape: shape.to_vec(),
            },
            &[self],
            |p| {
                // A view, but one every later op reads as a tensor of this size.
                p.check_output("broadcast_to", shape, self.dtype())?;
                Ok(self.view(layout))
            },
        )
    }

    /// Inserts a size-1 axis at `axis` (-rank-1..=rank) (`tf.expand_dims`); a view.
    pub fn expand_dims(&self, axis: isize) -> Result<Tensor> {
        let a = normalize_axis("expand_dims", axis, self.rank() + 1)?;
        let layout = self.layout().insert_axis(a);
        let shape = layout.shape().to_vec();
        self.view_op(|| Op::Reshape { shape }, layout)
    }

    /// Removes size-1 axes: the listed ones, or all when `axes` is empty (`tf.squeeze`).
    pub fn squeeze(&self, axes: &[isize]) -> Result<Tensor> {
        let axes: Vec<usize> = if axes.is_empty() {
            (0..self.rank()).filter(|&i| self.shape()[i] == 1).collect()
        } else {
            normalize_axes("squeeze", axes, self.rank())?
        };
        if let Some(&bad) = axes.iter().find(|&&a| self.shape()[a] != 1) {
            return Err(Error::invalid(
                "squeeze",
                format!(
                    "axis {bad} has size {} in shape {:?}, not 1",
                    self.shape()[bad],
                    self.shape()
                ),
            ));
        }
        let layout = self.layout().remove_axes(&axes);
        let shape = layout.shape().to_vec();
        self.view_op(|| Op::Reshape { shape }, layout)
    }

    /// Joins tensors along `axis` (`tf.concat`).
    pub fn concat(tensors: &[Tensor], axis: isize) -> Result<Tensor> {
        let first = tensors
            .first()
            .ok_or_else(|| Error::invalid("concat", "needs at least one tensor"))?;
        let rank = first.rank();
        if rank == 0 {
            return Err(Error::invalid(
                "concat",
                "cannot concatenate scalars (use stack)",
            ));
        }
        let axis = normalize_axis("concat", axis, rank)?;
        let mut shape = first.shape().to_vec();
        shape[axis] = 0;
        for t in tensors {
            if t.dtype() != first.dtype() {
                return Err(Error::DTypeMismatch {
                    op: "concat",
                    lhs: first.dtype(),
                    rhs: t.dtype(),
                });
            }
            let same = t.rank() == rank
                && (0..rank).all(|i| i == axis || t.shape()[i] == first.shape()[i]);
            if !same {
                return Err(Error::ShapeMismatch {
                    op: "concat",
                    msg: "shapes must agree on every axis but the concat axis",
                    lhs: first.shape().to_vec(),
                    rhs: t.shape().to_vec(),
                });
            }
            shape[axis] =
                checked_dim_sum("concat", "the concat axis", shape[axis], t.shape()[axis])?;
        }
        let refs: Vec<&Tensor> = tensors.iter().collect();
        dispatch(
            || Op::Concat { axis },
            &refs,
            |p| {
                if p.check_output("concat", &shape, first.dtype())? == 0 {
                    return p.empty(&shape, first.dtype());
                }
                let ops: Vec<_> = tensors.iter().map(|t| t.operand()).collect();
                Ok(Tensor::from_buffer(
                    p.backend.concat(&ops, axis)?,
                    &shape,
                    first.dtype(),
                    p.backend,
                    p.device,
                ))
            },
        )
    }

    /// Stacks equal-shaped tensors along a new `axis` (`tf.stack`).
    pub fn stack(tensors: &[Tensor], axis: isize) -> Result<Tensor> {
        let first = tensors
            .first()
            .ok_or_else(|| Error::invalid("stack", "needs at least one tensor"))?;
        let a = normalize_axis("stack", axis, first.rank() + 1)?;
        let expanded = tensors
            .iter()
            .map(|t| {
                if t.shape() != first.shape() {
                    return Err(Error::ShapeMismatch {
                        op: "stack",
                        msg: "all shapes must be equal",
                        lhs: first.shape().to_vec(),
                        rhs: t.shape().to_vec(),
                    });
                }
                t.expand_dims(a as isize)
            })
            .collect::<Result<Vec<_>>>()?;
        Tensor::concat(&expanded, a as isize)
    }

    /// Splits along `axis` into pieces of the given sizes (`tf.split` with sizes); views.
    pub fn split(&self, sizes: &[usize], axis: isize) -> Result<Vec<Tensor>> {
        let axis = normalize_axis("split", axis, self.rank())?;
        let total = sizes.iter().try_fold(0usize, |acc, &s| acc.checked_add(s));
        if total != Some(self.shape()[axis]) {
            let total = total.map_or("more than usize::MAX".to_string(), |t| t.to_string());
            return Err(Error::invalid(
                "split",
                format!(
                    "sizes {sizes:?} sum to {total}, axis {axis} of {:?} has {}",
                    self.shape(),
                    self.shape()[axis]
                ),
            ));
        }
        let mut out = vec![];
        let mut at = 0;
        for &s in sizes {
            let mut begin = vec![0; self.rank()];
            let mut len = self.shape().to_vec();
            begin[axis] = at;
            len[axis] = s;
            out.push(self.slice_view(begin, len, vec![1; self.rank()])?);
            at += s;
        }
        Ok(out)
    }
    /// Splits along `axis` into `num` equal pieces (`tf.split(x, num)`).
    pub fn split_equal(&self, num: usize, axis: isize) -> Result<Vec<Tensor>> {
        let a = normalize_axis("split", axis, self.rank())?;
        let n = self.shape()[a];
        if num == 0 || !n.is_multiple_of(num) {
            return Err(Error::invalid(
                "split",
                format!("axis {a} of size {n} does not split into {num} equal pieces"),
            ));
        }
        self.split(&vec![n / num; num], axis)
    }
    /// The slices along `axis`, each without that axis (`tf.unstack`).
    pub fn unstack(&self, axis: isize) -> Result<Vec<Tensor>> {
        let a = normalize_axis("unstack", axis, self.rank())?;
        self.split_equal(self.shape()[a], axis)?
            .into_iter()
            .map(|t| t.squeeze(&[a as isize]))
            .collect()
    }

    /// Pads each axis with `value` (`tf.pad`, mode CONSTANT).
    pub fn pad(&self, paddings: &[(usize, usize)], value: f64) -> Result<Tensor> {
        if paddings.len() != self.rank() {
            return Err(Error::invalid(
                "pad",
                format!(
                    "{} paddings for a tensor of rank {}",
                    paddings.len(),
                    self.rank()
                ),
            ));
        }
        let shape = self
            .shape()
            .iter()
            .zip(paddings)
            .map(|(&d, &(a, b))| {
                checked_dim_sum("pad", "dimension plus paddings", d, a)
                    .and_then(|s| checked_dim_sum("pad", "dimension plus paddings", s, b))
            })
            .collect::<Result<Vec<usize>>>()?;
        dispatch(
            || Op::Pad {
                paddings: paddings.to_vec(),
                value,
            },
            &[self],
            |p| {
                if p.check_output("pad", &shape, self.dtype())? == 0 {
                    return p.empty(&shape, self.dtype());
                }
                Ok(Tensor::from_buffer(
                    p.backend.pad(self.operand(), paddings, value)?,
                    &shape,
                    self.dtype(),
                    p.backend,
                    p.device,
                ))
            },
        )
    }

    /// Pads by mirroring (`tf.pad` modes REFLECT, without the edge, and SYMMETRIC, with it),
    /// composed as one gather per padded axis.
    pub fn pad_mirror(&self, paddings: &[(usize, usize)], symmetric: bool) -> Result<Tensor> {
        if paddings.len() != self.rank() {
            return Err(Error::invalid(
                "pad",
                format!(
                    "{} paddings for a tensor of rank {}",
                    paddings.len(),
                    self.rank()
                ),
            ));
        }
        let mut out = self.clone();
        for (axis, &(before, after)) in paddings.iter().enumerate() {
            if before == 0 && after == 0 {
                continue;
            }
            let n = self.shape()[axis] as i64;
            let limit = if symmetric { n } else { n - 1 };
            if before as i64 > limit || after as i64 > limit {
                return Err(Error::invalid("pad", format!("padding ({before}, {after}) is too large for axis {axis} of size {n} in mode {}", if symmetric { "SYMMETRIC" } else { "REFLECT" })));
            }
            let shift = if symmetric { 1 } else { 0 };
            let idx: Vec<i64> = (-(before as i64)..n + after as i64)
                .map(|i| {
                    if i < 0 {
                        -i - shift
                    } else if i >= n {
                        2 * n - i - 2 + shift
                    } else {
                        i
                    }
                })
                .collect();
            let len = idx.len();
            let idx =
                Tensor::from_host_on(crate::dtype::HostData::I64(idx), &[len], self.device())?;
            out = out.gather(&idx, axis as isize)?;
        }
        Ok(out)
    }

    /// Repeats the tensor `multiples[i]` times along axis i (`tf.tile`).
    pub fn tile(&self, multiples: &[usize]) -> Result<Tensor> {
        if multiples.len() != self.rank() {
            return Err(Error::invalid(
                "tile",
                format!(
                    "{} multiples for a tensor of rank {}",
                    multiples.len(),
                    self.rank()
                ),
            ));
        }
        let mut interleaved = vec![];
        let mut target = vec![];
        for (&d, &m) in self.shape().iter().zip(multiples) {
            interleaved.extend([1, d]);
            target.extend([m, d]);
        }
        let final_shape = self
            .shape()
            .iter()
            .zip(multiples)
            .map(|(&d, &m)| d.checked_mul(m))
            .collect::<Option<Vec<usize>>>()
            .ok_or_else(|| {
                Error::invalid(
                    "tile",
                    format!(
                        "multiples {multiples:?} of shape {:?} overflow a dimension",
                        self.shape()
                    ),
                )
            })?;
        self.reshape_to(&interleaved)?
            .broadcast_to(&target)?
            .reshape_to(&final_shape)
    }
}
