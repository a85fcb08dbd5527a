//! Shapes and strided layouts: how a tensor's elements sit in its buffer.
//!
//! A [`Layout`] is a shape, a stride per axis (in elements, may be zero for broadcast axes
//! or negative for reversed views) and an offset. Views (transpose, slice, strided slice,
//! broadcast, expand_dims, squeeze, reverse and reshape of contiguous data) only make a new
//! layout over the same buffer; kernels read through the layout, so views never copy.

use crate::error::{Error, Result};

/// Number of elements of a shape (1 for a scalar).
pub fn num_elements(shape: &[usize]) -> usize {
    shape.iter().product()
}

/// Number of elements of a new shape, checked: an error naming `op` when the product of
/// the dimensions overflows (TF: "encountered overflow when multiplying"). Every op that
/// makes a shape larger than its inputs' computes it through this or [`checked_dim_sum`].
pub fn checked_num_elements(op: &'static str, shape: &[usize]) -> Result<usize> {
    // Row-major strides multiply every dimension (a zero counted as one), so that product
    // must fit an isize too, even when a zero dimension makes the tensor empty.
    let strided = shape.iter().try_fold(1isize, |acc, &d| {
        acc.checked_mul(isize::try_from(d.max(1)).ok()?)
    });
    match strided {
        Some(n) if !shape.contains(&0) => Ok(n as usize),
        Some(_) => Ok(0),
        None => Err(Error::invalid(
            op,
            format!("shape {shape:?} has more elements than an address space holds"),
        )),
    }
}

/// `a + b` for dimensions, checked: an error naming `op` and `what` when it overflows.
pub fn checked_dim_sum(op: &'static str, what: &str, a: usize, b: usize) -> Result<usize> {
    a.checked_add(b)
        .ok_or_else(|| Error::invalid(op, format!("{what}: {a} + {b} overflows a dimension")))
}

/// Row-major strides of a shape.
pub fn contiguous_strides(shape: &[usize]) -> Vec<isize> {
    let mut strides = vec![0isize; shape.len()];
    let mut acc = 1isize;
    for i in (0..shape.len()).rev() {
        strides[i] = acc;
        acc *= shape[i].max(1) as isize;
    }
    strides
}

/// NumPy broadcasting of two shapes.
pub fn broadcast_shapes(op: &'static str, a: &[usize], b: &[usize]) -> Result<Vec<usize>> {
    let rank = a.len().max(b.len());
    let mut out = vec![0; rank];
    for i in 0..rank {
        let da = if i + a.len() >= rank {
            a[i + a.len() - rank]
        } else {
            1
        };
        let db = if i + b.len() >= rank {
            b[i + b.len() - rank]
        } else {
            1
        };
        out[i] = if da == db || db == 1 {
            da
        } else if da == 1 {
            db
        } else {
            return Err(Error::Broadcast {
                op,
                lhs: a.to_vec(),
                rhs: b.to_vec(),
            });
        };
    }
    Ok(out)
}

/// Resolves a possibly negative axis against a rank.
pub fn normalize_axis(op: &'static str, axis: isize, rank: usize) -> Result<usize> {
    let r = rank as isize;
    if axis < -r || axis >= r {
        return Err(Error::AxisOutOfRange { op, axis, rank });
    }
    Ok(if axis < 0 {
        (axis + r) as usize
    } else {
        axis as usize
    })
}

/// Resolves a list of axes, rejecting duplicates; returns them sorted.
pub fn normalize_axes(op: &'static str, axes: &[isize], rank: usize) -> Result<Vec<usize>> {
    let mut out = Vec::with_capacity(axes.len());
    for &a in axes {
        let n = normalize_axis(op, a, rank)?;
        if out.contains(&n) {
            return Err(Error::invalid(
                op,
                format!("axis {a} is repeated in {axes:?}"),
            ));
        }
        out.push(n);
    }
    out.sort_unstable();
    Ok(out)
}

/// Shape, strides (in elements) and offset of a view into a buffer.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct Layout {
    shape: Vec<usize>,
    strides: Vec<isize>,
    offset: usize,
}

impl Layout {
    /// Row-major layout of `shape` at offset 0.
    pub fn contiguous(shape: &[usize]) -> Layout {
        Layout {
            strides: contiguous_strides(shape),
            shape: shape.to_vec(),
            offset: 0,
        }
    }
    /// A layout from its parts (the caller guarantees it stays inside the buffer).
    pub fn new(shape: Vec<usize>, strides: Vec<isize>, offset: usize) -> Layout {
        debug_assert_eq!(shape.len(), strides.len());
        Layout {
            shape,
            strides,
            offset,
        }
    }
    /// The shape.
    pub fn shape(&self) -> &[usize] {
        &self.shape
    }
    /// The strides, in elements.
    pub fn strides(&self) -> &[isize] {
        &self.strides
    }
    /// Offset of element `[0, 0, ...]`, in elements.
    pub fn offset(&self) -> usize {
        self.offset
    }
    /// Number of axes.
    pub fn rank(&self) -> usize {
        self.shape.len()
    }
    /// Number of elements.
    pub fn num_elements(&self) -> usize {
        num_elements(&self.shape)
    }
    /// True when the elements are row-major and dense (at any offset).
    pub fn is_contiguous(&self) -> bool {
        let mut acc = 1isize;
        for i in (0..self.shape.len()).rev() {
            if self.shape[i] != 1 && self.strides[i] != acc {
                return false;
            }
            acc *= self.shape[i] as isize;
        }
        true
    }
    /// `Some((offset, len))` when the layout is a dense row-major range of the buffer.
    pub fn contiguous_range(&self) -> Option<(usize, usize)> {
        self.is_contiguous()
            .then(|| (self.offset, self.num_elements()))
    }
    /// True when every element reads the same buffer slot (all strides zero or size-1 axes).
    pub fn is_scalar_broadcast(&self) -> bool {
        self.shape
            .iter()
            .zip(&self.strides)
            .all(|(&d, &s)| d == 1 || s == 0)
    }
    /// Buffer offset of a multi-index.
    pub fn offset_of(&self, index: &[usize]) -> usize {
        let mut o = self.offset as isize;
        for (i, s) in index.iter().zip(&self.strides) {
            o += *i as isize * s;
        }
        o as usize
    }

    /// Broadcasts to `shape` (NumPy rules; new and size-1 axes get stride 0).
    pub fn broadcast_to(&self, op: &'static str, shape: &[usize]) -> Result<Layout> {
        if shape.len() < self.rank() {
            return Err(Error::Broadcast {
                op,
                lhs: self.shape.clone(),
                rhs: shape.to_vec(),
            });
        }
        let lead = shape.len() - self.rank();
        let mut strides = vec![0isize; shape.len()];
        for i in 0..self.rank() {
            let (d, t) = (self.shape[i], shape[lead + i]);
            if d == t {
                strides[lead + i] = self.strides[i];
            } else if d == 1 {
                strides[lead + i] = 0;
            } else {
                return Err(Error::Broadcast {
                    op,
                    lhs: self.shape.clone(),
                    rhs: shape.to_vec(),
                });
            }
        }
        Ok(Layout {
            shape: shape.to_vec(),
            strides,
            offset: self.offset,
        })
    }

    /// Reorders the axes: axis `i` of the result is axis `perm[i]` of `self`.
    pub fn permute(&self, perm: &[usize]) -> Result<Layout> {
        let rank = self.rank();
        let mut seen = vec![false; rank];
        if perm.len() != rank
            || perm
                .iter()
                .any(|&p| p >= rank || std::mem::replace(&mut seen[p], true))
        {
            return Err(Error::invalid(
                "transpose",
                format!("perm {perm:?} is not a permutation of 0..{rank}"),
            ));
        }
        Ok(Layout {
            shape: perm.iter().map(|&p| self.shape[p]).collect(),
            strides: perm.iter().map(|&p| self.strides[p]).collect(),
            offset: self.offset,
        })
    }

    /// Strided slice along every axis: `begin` inclusive, `len` elements, `step` (non-zero,
    /// may be negative). The caller has clamped the ranges.
    pub fn slice_steps(&self, begin: &[usize], len: &[usize], step: &[isize]) -> Layout {
        let mut offset = self.offset as isize;
        let mut shape = Vec::with_capacity(self.rank());
        let mut strides = Vec::with_capacity(self.rank());
        for i in 0..self.rank() {
            if len[i] > 0 {
                offset += begin[i] as isize * self.strides[i];
            }
            shape.push(len[i]);
            // With two or more elements |step| < the axis length, so the product stays
            // inside the buffer; one element never moves by the stride (the step may be huge).
            strides.push(if len[i] > 1 {
                self.strides[i] * step[i]
            } else {
                self.strides[i]
            });
        }
        // An empty view may point anywhere; keep the offset inside the buffer.
        let offset = if shape.contains(&0) {
            self.offset
        } else {
            offset as usize
        };
        Layout {
            shape,
            strides,
            offset,
        }
    }

    /// The same elements under a new shape, when that needs no copy (contiguous data).
    pub fn reshape(&self, shape: &[usize]) -> Option<Layout> {
        self.is_contiguous().then(|| Layout {
            strides: contiguous_strides(shape),
            shape: shape.to_vec(),
            offset: self.offset,
        })
    }

    /// Inserts a size-1 axis at `axis` (already normalised to `0..=rank`).
    pub fn insert_axis(&self, axis: usize) -> Layout {
        let mut l = self.clone();
        let stride = if axis < self.rank() {
            self.strides[axis] * self.shape[axis] as isize
        } else {
            1
        };
        l.shape.insert(axis, 1);
        l.strides.insert(axis, stride);
        l
    }

    /// Removes the given size-1 axes (sorted, normalised).
    pub fn remove_axes(&self, axes: &[usize]) -> Layout {
        let mut l = Layout {
            shape: vec![],
            strides: vec![],
            offset: self.offset,
        };
        for i in 0..self.rank() {
            if !axes.contains(&i) {
                l.shape.push(self.shape[i]);
                l.strides.push(self.strides[i]);
            }
        }
        l
    }

    /// Calls `f` with the buffer offset of every element, in row-major order of the view.
    pub fn for_each_offset(&self, mut f: impl FnMut(usize)) {
        let n = self.num_elements();
        if n == 0 {
            return;
        }
        if self.rank() == 0 {
            f(self.offset);
            return;
        }
        let rank = self.rank();
        let inner = self.shape[rank - 1];
        let inner_stride = self.strides[rank - 1];
        let mut index = vec![0usize; rank - 1];
        let mut base = self.offset as isize;
        loop {
            let mut o = base;
            for _ in 0..inner {
                f(o as usize);
                o += inner_stride;
            }
            // Advance the outer multi-index (odometer).
            let mut axis = rank - 1;
            loop {
                if axis == 0 {
                    return;
                }
                axis -= 1;
                index[axis] += 1;
                base += self.strides[axis];
                if index[axis] < self.shape[axis] {
                    break;
                }
                base -= self.strides[axis] * self.shape[axis] as isize;
                index[axis] = 0;
            }
        }
    }

    /// The smallest and one-past-largest buffer slot the view touches (`None` when empty).
    pub fn buffer_span(&self) -> Option<(usize, usize)> {
        if self.num_elements() == 0 {
            return None;
        }
        let mut lo = self.offset as isize;
        let mut hi = self.offset as isize;
        for (&d, &s) in self.shape.iter().zip(&self.strides) {
            let ext = (d as isize - 1) * s;
            if ext < 0 {
                lo += ext;
            } else {
                hi += ext;
            }
        }
        Some((lo as usize, hi as usize + 1))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn broadcasting_follows_numpy() {
        assert_eq!(
            broadcast_shapes("t", &[2, 1, 3], &[4, 1]).unwrap(),
            vec![2, 4, 3]
        );
        assert_eq!(broadcast_shapes("t", &[], &[5]).unwrap(), vec![5]);
        assert_eq!(broadcast_shapes("t", &[0, 1], &[1, 7]).unwrap(), vec![0, 7]);
        assert!(broadcast_shapes("t", &[2, 3], &[3, 2]).is_err());
    }

    #[test]
    fn offsets_walk_a_transposed_view() {
        let l = Layout::contiguous(&[2, 3]).permute(&[1, 0]).unwrap();
        let mut v = vec![];
        l.for_each_offset(|o| v.push(o));
        assert_eq!(v, vec![0, 3, 1, 4, 2, 5]);
        assert!(!l.is_contiguous());
    }

    #[test]
    fn negative_step_slice_reverses() {
        let l = Layout::contiguous(&[5]).slice_steps(&[4], &[5], &[-1]);
        let mut v = vec![];
        l.for_each_offset(|o| v.push(o));
        assert_eq!(v, vec![4, 3, 2, 1, 0]);
        assert_eq!(l.buffer_span(), Some((0, 5)));
    }
}
