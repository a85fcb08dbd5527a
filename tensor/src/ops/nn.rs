//! Neural-network ops: conv2d (NHWC input, HWIO filter) and its two backprop primitives,
//! max/avg pooling and their gradients, softmax and log_softmax.

use crate::device::device_has_fused;
use crate::dispatch::{dispatch, Placement};
use crate::dtype::DType;
use crate::error::{Error, Result};
use crate::fused::{FusedActivation, FusedKernel};
use crate::layout::normalize_axis;
use crate::op::{Op, Padding, PoolKind, Window2d};
use crate::ops::Axes;
use crate::tensor::Tensor;

fn nhwc(op: &'static str, t: &Tensor) -> Result<[usize; 4]> {
    if !t.dtype().is_float() {
        return Err(Error::UnsupportedDType {
            op,
            dtype: t.dtype(),
            expected: "a float dtype",
        });
    }
    match *t.shape() {
        [n, h, w, c] => Ok([n, h, w, c]),
        _ => Err(Error::invalid(
            op,
            format!("input must be NHWC (rank 4), got shape {:?}", t.shape()),
        )),
    }
}

/// Errs with `DTypeMismatch` naming the first of `others` whose dtype differs from `x`'s.
fn same_dtype(op: &'static str, x: &Tensor, others: &[&Tensor]) -> Result<()> {
    match others.iter().find(|o| o.dtype() != x.dtype()) {
        Some(o) => Err(Error::DTypeMismatch {
            op,
            lhs: x.dtype(),
            rhs: o.dtype(),
        }),
        None => Ok(()),
    }
}

/// Refuses convolutions whose per-image working set cannot exist on the device: the
/// patch matrix (`oh·ow` rows of `kh·kw·cin` taps, what im2col-style kernels build per
/// image) and the padded image that windows reach (`extent_h × extent_w × cin`). TF runs
/// out of memory on these too; here it is a `ResourceExhausted` before any allocation.
fn check_conv_scratch(
    p: &Placement<'_>,
    op: &'static str,
    w: &Window2d,
    dtype: DType,
) -> Result<()> {
    let cin = w.input[3];
    p.check_output(
        op,
        &[w.output[0], w.output[1], w.kernel[0], w.kernel[1], cin],
        dtype,
    )?;
    let extent = |i: usize| {
        (w.output[i].max(1) - 1)
            .checked_mul(w.strides[i])
            .and_then(|e| e.checked_add((w.kernel[i] - 1).checked_mul(w.dilations[i])? + 1))
            .unwrap_or(usize::MAX)
    };
    p.check_output(op, &[extent(0), extent(1), cin], dtype)?;
    Ok(())
}

fn conv_window(
    x: [usize; 4],
    filter: &[usize],
    strides: [usize; 2],
    padding: Padding,
    dilations: [usize; 2],
) -> Result<Window2d> {
    if filter.len() != 4 || filter[2] != x[3] {
        return Err(Error::ShapeMismatch {
            op: "conv2d",
            msg:
                "filter must be [h, w, in_channels, out_channels] with in_channels = input channels",
            lhs: x.to_vec(),
            rhs: filter.to_vec(),
        });
    }
    Window2d::resolve(
        "conv2d",
        x,
        [filter[0], filter[1]],
        strides,
        dilations,
        padding,
    )
}

impl Tensor {
    /// 2-D convolution (`tf.nn.conv2d`, data_format NHWC): `self` is [batch, h, w, in],
    /// `filter` is [kh, kw, in, out]; output [batch, oh, ow, out].
    pub fn conv2d(
        &self,
        filter: &Tensor,
        strides: [usize; 2],
        padding: Padding,
        dilations: [usize; 2],
    ) -> Result<Tensor> {
        let x = nhwc("conv2d", self)?;
        same_dtype("conv2d", self, &[filter])?;
        let w = conv_window(x, filter.shape(), strides, padding, dilations)?;
        let shape = [x[0], w.output[0], w.output[1], filter.shape()[3]];
        dispatch(
            || Op::Conv2d(w.clone()),
            &[self, filter],
            |p| {
                if p.check_output("conv2d", &shape, self.dtype())? == 0 {
                    return p.empty(&shape, self.dtype());
                }
                check_conv_scratch(&p, "conv2d", &w, self.dtype())?;
                let buf = p.backend.conv2d(self.operand(), filter.operand(), &w)?;
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

    /// A fused convolution's operands checked (NHWC input, one dtype, the bias
    /// `[out_channels]`): its window and output shape.
    fn fused_conv_window(
        &self,
        op: &'static str,
        filter: &Tensor,
        bias: &Tensor,
        strides: [usize; 2],
        padding: Padding,
        dilations: [usize; 2],
    ) -> Result<(Window2d, [usize; 4])> {
        let x = nhwc(op, self)?;
        same_dtype(op, self, &[filter, bias])?;
        let w = conv_window(x, filter.shape(), strides, padding, dilations)?;
        let cout = filter.shape()[3];
        if bias.shape() != [cout] {
            return Err(Error::ShapeMismatch {
                op,
                msg: "bias must be [out_channels]",
                lhs: vec![cout],
                rhs: bias.shape().to_vec(),
            });
        }
        let shape = [x[0], w.output[0], w.output[1], cout];
        Ok((w, shape))
    }

    /// `activation(conv2d(x, filter) + bias)` (TF's `_FusedConv2D` with BiasAdd and Relu, the
    /// form Keras' `Conv2D(activation="relu")` runs in a graph): one kernel where the backend
    /// has it, so the convolution's output is written once; else the three ops composed.
    /// `bias` is `[out_channels]` in the input's dtype.
    ///
    /// ```no_run
    /// // A backend registered first: `ferroflow::init()` (the facade).
    /// use ferroflow_tensor::{FusedActivation, Padding, Tensor};
    /// let x = Tensor::from_vec(vec![1.0f32, -2.0, 3.0, -4.0], &[1, 2, 2, 1])?;
    /// let f = Tensor::from_vec(vec![1.0f32], &[1, 1, 1, 1])?;
    /// let b = Tensor::from_vec(vec![0.5f32], &[1])?;
    /// let y = x.fused_conv2d(&f, &b, FusedActivation::Relu, [1, 1], Padding::Valid, [1, 1])?;
    /// assert_eq!(y.to_vec::<f32>()?, vec![1.5, 0.0, 3.5, 0.0]);
    /// # Ok::<(), ferroflow_tensor::Error>(())
    /// ```
    pub fn fused_conv2d(
        &self,
        filter: &Tensor,
        bias: &Tensor,
        activation: FusedActivation,
        strides: [usize; 2],
        padding: Padding,
        dilations: [usize; 2],
    ) -> Result<Tensor> {
        let (w, shape) =
            self.fused_conv_window("fused_conv2d", filter, bias, strides, padding, dilations)?;
        if !device_has_fused(self.device(), FusedKernel::FusedConv2d, self.dtype()) {
            let y = self
                .conv2d(filter, strides, padding, dilations)?
                .add(bias)?;
            return match activation {
                FusedActivation::Linear => Ok(y),
                FusedActivation::Relu => y.relu(),
            };
        }
        dispatch(
            || Op::FusedConv2d(w.clone(), activation),
            &[self, filter, bias],
            |p| {
                if p.check_output("fused_conv2d", &shape, self.dtype())? == 0 {
                    return p.empty(&shape, self.dtype());
                }
                check_conv_scratch(&p, "fused_conv2d", &w, self.dtype())?;
                let buf = p.backend.fused_conv2d(
                    self.operand(),
                    filter.operand(),
                    bias.operand(),
                    &w,
                    activation,
                )?;
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

    /// `y = activation(conv2d(x, filter) + bias)` ([`Tensor::fused_conv2d`]) and its max
    /// pooling ([`Tensor::max_pool2d`] of `y` by `pool_ksize`, `pool_strides`,
    /// `pool_padding`): `(y, pooled)`, each equal to what those two ops give, to the bit. One
    /// kernel where the backend has it (each image pooled while the convolution's output for
    /// it is in cache, so the pooling does not read `y` back from memory), else the two ops;
    /// graph functions make it of them (a Keras `Conv2D` with its activation under a
    /// `MaxPooling2D`). `y` is returned too: the pooling's gradient needs it.
    ///
    /// ```no_run
    /// // A backend registered first: `ferroflow::init()` (the facade).
    /// use ferroflow_tensor::{FusedActivation, Padding, Tensor};
    /// let x = Tensor::from_vec(vec![1.0f32, -2.0, 3.0, -4.0], &[1, 2, 2, 1])?;
    /// let f = Tensor::from_vec(vec![1.0f32], &[1, 1, 1, 1])?;
    /// let b = Tensor::from_vec(vec![0.5f32], &[1])?;
    /// let (y, pooled) = x.fused_conv2d_max_pool(
    ///     &f,
    ///     &b,
    ///     FusedActivation::Relu,
    ///     [1, 1],
    ///     Padding::Valid,
    ///     [1, 1],
    ///     [2, 2],
    ///     [2, 2],
    ///     Padding::Valid,
    /// )?;
    /// assert_eq!(y.to_vec::<f32>()?, vec![1.5, 0.0, 3.5, 0.0]);
    /// assert_eq!(pooled.to_vec::<f32>()?, vec![3.5]);
    /// # Ok::<(), ferroflow_tensor::Error>(())
    /// ```
    #[allow(clippy::too_many_arguments)] // the convolution's settings, then the pooling's
    pub fn fused_conv2d_max_pool(
        &self,
        filter: &Tensor,
        bias: &Tensor,
        activation: FusedActivation,
        strides: [usize; 2],
        padding: Padding,
        dilations: [usize; 2],
        pool_ksize: [usize; 2],
        pool_strides: [usize; 2],
        pool_padding: Padding,
    ) -> Result<(Tensor, Tensor)> {
        const OP: &str = "fused_conv2d_max_pool";
        let composed = || {
            let y = self.fused_conv2d(filter, bias, activation, strides, padding, dilations)?;
            let pooled = y.max_pool2d(pool_ksize, pool_strides, pool_padding)?;
            Ok((y, pooled))
        };
        let (w, shape) = self.fused_conv_window(OP, filter, bias, strides, padding, dilations)?;
        let pool = Window2d::resolve(OP, shape, pool_ksize, pool_strides, [1, 1], pool_padding)?;
        let pooled_shape = [shape[0], pool.output[0], pool.output[1], shape[3]];
        if shape.contains(&0)
            || pooled_shape.contains(&0)
            || !device_has_fused(self.device(), FusedKernel::FusedConv2dMaxPool, self.dtype())
        {
            // The two ops (empty results, or a backend without the kernel).
            return composed();
        }
        dispatch(
            || Op::FusedConv2dMaxPool(w.clone(), activation, Box::new(pool.clone())),
            &[self, filter, bias],
            |p| {
                p.check_output(OP, &shape, self.dtype())?;
                p.check_output(OP, &pooled_shape, self.dtype())?;
                check_conv_scratch(&p, OP, &w, self.dtype())?;
                let (y, pooled) = p.backend.fused_conv2d_max_pool(
                    self.operand(),
                    filter.operand(),
                    bias.operand(),
                    &w,
                    activation,
                    &pool.clipped_for_pooling(),
                )?;
                Ok((
                    Tensor::from_buffer(y, &shape, self.dtype(), p.backend, p.device),
                    Tensor::from_buffer(pooled, &pooled_shape, self.dtype(), p.backend, p.device),
                ))
            },
        )
    }

    /// The gradients of `y = activation(x + bias)` (bias along the last axis, as
    /// [`Tensor::fused_conv2d`] or a Dense layer adds it) from the gradient `g` of `y`:
    /// `(dx, dbias)`, `dx = g·[y > 0]` for ReLU (`g` itself when linear) and `dbias` its sum
    /// over every axis but the last. One pass where the backend has the fused kernel (TF's
    /// `ReluGrad` + `BiasAddGrad`), else composed.
    ///
    /// ```no_run
    /// // A backend registered first: `ferroflow::init()` (the facade).
    /// use ferroflow_tensor::{FusedActivation, Tensor};
    /// let g = Tensor::from_vec(vec![1.0f32, 2.0, 3.0, 4.0], &[2, 2])?;
    /// let y = Tensor::from_vec(vec![0.5f32, 0.0, 1.0, 2.0], &[2, 2])?;
    /// let (dx, db) = g.bias_activation_grad(&y, FusedActivation::Relu)?;
    /// assert_eq!(dx.to_vec::<f32>()?, vec![1.0, 0.0, 3.0, 4.0]);
    /// assert_eq!(db.to_vec::<f32>()?, vec![4.0, 4.0]);
    /// # Ok::<(), ferroflow_tensor::Error>(())
    /// ```
    pub fn bias_activation_grad(
        &self,
        y: &Tensor,
        activation: FusedActivation,
    ) -> Result<(Tensor, Tensor)> {
        const OP: &str = "bias_activation_grad";
        if !self.dtype().is_float() {
            return Err(Error::UnsupportedDType {
                op: OP,
                dtype: self.dtype(),
                expected: "a float dtype",
            });
        }
        same_dtype(OP, self, &[y])?;
        if y.shape() != self.shape() || self.rank() == 0 {
            return Err(Error::ShapeMismatch {
                op: OP,
                msg: "g and y must have one shape of rank >= 1",
                lhs: self.shape().to_vec(),
                rhs: y.shape().to_vec(),
            });
        }
        let lead: Vec<isize> = (0..self.rank() as isize - 1).collect();
        let composed = |dx: Tensor| -> Result<(Tensor, Tensor)> {
            let db = dx.reduce_sum(Axes::List(lead.clone()), false)?;
            Ok((dx, db))
        };
        if activation == FusedActivation::Linear {
            // dx is g itself: nothing to fuse.
            return composed(self.clone());
        }
        if !device_has_fused(self.device(), FusedKernel::BiasActivationGrad, self.dtype()) {
            return composed(self.relu_grad(y)?);
        }
        let channels = self.shape()[self.rank() - 1];
        dispatch(
            || Op::BiasActivationGrad(activation),
            &[self, y],
            |p| {
                let (dx, db) =
                    p.backend
                        .bias_activation_grad(self.operand(), y.operand(), activation)?;
                Ok((
                    Tensor::from_buffer(dx, self.shape(), self.dtype(), p.backend, p.device),
                    Tensor::from_buffer(db, &[channels], self.dtype(), p.backend, p.device),
                ))
            },
        )
    }

    /// Softmax cross-entropy of `self` (logits, `[.., classes]`) against integer class ids
    /// `labels` (int32 or int64, the logits' shape without the class axis), as TF's
    /// `tf.nn.sparse_softmax_cross_entropy_with_logits` computes it: `(loss, backprop)` with
    /// `loss = logsumexp(logits) - logits[label]` per row and `backprop = softmax(logits) -
    /// one_hot(label)` (the loss's gradient, which TF's kernel returns beside it). One pass
    /// over each row where the backend has the fused kernel (TF's
    /// `SparseSoftmaxCrossEntropyWithLogits`), else composed from `log_softmax`. A label
    /// outside `[0, classes)` is [`Error::IndexOutOfRange`] (TF's CPU kernel refuses it too).
    /// Float16 and bfloat16 logits are computed in float32, the results rounded back.
    /// Differentiable in the logits, to any order.
    ///
    /// ```no_run
    /// // A backend registered first: `ferroflow::init()` (the facade).
    /// use ferroflow_tensor::Tensor;
    /// let logits = Tensor::from_vec(vec![0.0f32, 0.0, 2.0, 0.0], &[2, 2])?;
    /// let labels = Tensor::from_vec(vec![1i64, 0], &[2])?;
    /// let (loss, backprop) = logits.sparse_softmax_cross_entropy_with_logits(&labels)?;
    /// assert!((loss.to_vec::<f32>()?[0] - 2f32.ln()).abs() < 1e-6);
    /// assert!((backprop.to_vec::<f32>()?[1] + 0.5).abs() < 1e-6);
    /// # Ok::<(), ferroflow_tensor::Error>(())
    /// ```
    pub fn sparse_softmax_cross_entropy_with_logits(
        &self,
        labels: &Tensor,
    ) -> Result<(Tensor, Tensor)> {
        const OP: &str = "sparse_softmax_cross_entropy_with_logits";
        self.check_float(OP)?;
        if !matches!(labels.dtype(), DType::I32 | DType::I64) {
            return Err(Error::UnsupportedDType {
                op: OP,
                dtype: labels.dtype(),
                expected: "int32 or int64 labels",
            });
        }
        if self.rank() == 0 || labels.shape() != &self.shape()[..self.rank() - 1] {
            return Err(Error::ShapeMismatch {
                op: OP,
                msg: "labels must have the logits' shape without the last (class) axis",
                lhs: self.shape().to_vec(),
                rhs: labels.shape().to_vec(),
            });
        }
        let classes = self.shape()[self.rank() - 1];
        if classes == 0 && labels.num_elements() > 0 {
            return Err(Error::invalid(
                OP,
                "the logits have no classes (last axis of size 0)",
            ));
        }
        if self.is_half() {
            let (loss, backprop) = self
                .upcast_half()?
                .sparse_softmax_cross_entropy_with_logits(labels)?;
            return Ok((loss.cast(self.dtype())?, backprop.cast(self.dtype())?));
        }
        if !device_has_fused(
            self.device(),
            FusedKernel::SparseSoftmaxCrossEntropy,
            self.dtype(),
        ) {
            return self.composed_sparse_softmax_cross_entropy(labels, classes);
        }
        dispatch(
            || Op::SparseSoftmaxCrossEntropy,
            &[self, labels],
            |p| {
                let (loss, backprop) = p
                    .backend
                    .sparse_softmax_cross_entropy(self.operand(), labels.operand())?;
                Ok((
                    Tensor::from_buffer(loss, labels.shape(), self.dtype(), p.backend, p.device),
                    Tensor::from_buffer(backprop, self.shape(), self.dtype(), p.backend, p.device),
                ))
            },
        )
    }

    /// [`Tensor::sparse_softmax_cross_entropy_with_logits`] from primitives: the labels
    /// checked on the device by a gather from `classes` zeros (added to the one-hot
    /// targets, so a traced graph keeps the check), then `log_softmax`.
    fn composed_sparse_softmax_cross_entropy(
        &self,
        labels: &Tensor,
        classes: usize,
    ) -> Result<(Tensor, Tensor)> {
        let check = Tensor::zeros(&[classes], self.dtype())?
            .to_device(labels.device())?
            .gather(labels, 0)
            .map_err(|e| match e {
                Error::IndexOutOfRange { index, bound, .. } => Error::IndexOutOfRange {
                    op: "sparse_softmax_cross_entropy_with_logits",
                    index,
                    bound,
                },
                e => e,
            })?;
        let targets = Tensor::one_hot(labels, classes, 1.0, 0.0, self.dtype())?
            .add(&check.expand_dims(-1)?)?;
        let log_p = self.log_softmax(-1)?;
        let loss = targets.mul(&log_p)?.reduce_sum(-1isize, false)?.neg()?;
        let backprop = log_p.exp()?.sub(&targets)?;
        Ok((loss, backprop))
    }

    /// Gradient of [`Tensor::conv2d`] with respect to its input of shape `input_shape`
    /// (`tf.nn.conv2d_transpose` is this op).
    pub fn conv2d_backprop_input(
        input_shape: [usize; 4],
        filter: &Tensor,
        dy: &Tensor,
        strides: [usize; 2],
        padding: Padding,
        dilations: [usize; 2],
    ) -> Result<Tensor> {
        let dy_shape = nhwc("conv2d_backprop_input", dy)?;
        same_dtype("conv2d_backprop_input", filter, &[dy])?;
        let w = conv_window(input_shape, filter.shape(), strides, padding, dilations)?;
        let expected = [input_shape[0], w.output[0], w.output[1], filter.shape()[3]];
        if dy_shape != expected {
            return Err(Error::ShapeMismatch {
                op: "conv2d_backprop_input",
                msg: "dy does not match the conv output shape",
                lhs: expected.to_vec(),
                rhs: dy_shape.to_vec(),
            });
        }
        dispatch(
            || Op::Conv2dBackpropInput(w.clone()),
            &[filter, dy],
            |p| {
                if p.check_output("conv2d_backprop_input", &input_shape, dy.dtype())? == 0 {
                    return p.empty(&input_shape, dy.dtype());
                }
                check_conv_scratch(&p, "conv2d_backprop_input", &w, dy.dtype())?;
                let buf = p
                    .backend
                    .conv2d_backprop_input(filter.operand(), dy.operand(), &w)?;
                Ok(Tensor::from_buffer(
                    buf,
                    &input_shape,
                    dy.dtype(),
                    p.backend,
                    p.device,
                ))
            },
        )
    }

    /// Gradient of [`Tensor::conv2d`] with respect to its filter of shape `filter_shape`.
    pub fn conv2d_backprop_filter(
        &self,
        filter_shape: [usize; 4],
        dy: &Tensor,
        strides: [usize; 2],
        padding: Padding,
        dilations: [usize; 2],
    ) -> Result<Tensor> {
        let x = nhwc("conv2d_backprop_filter", self)?;
        let dy_shape = nhwc("conv2d_backprop_filter", dy)?;
        same_dtype("conv2d_backprop_filter", self, &[dy])?;
        let w = conv_window(x, &filter_shape, strides, padding, dilations)?;
        let expected = [x[0], w.output[0], w.output[1], filter_shape[3]];
        if dy_shape != expected {
            return Err(Error::ShapeMismatch {
                op: "conv2d_backprop_filter",
                msg: "dy does not match the conv output shape",
                lhs: expected.to_vec(),
                rhs: dy_shape.to_vec(),
            });
        }
        dispatch(
            || Op::Conv2dBackpropFilter(w.clone()),
            &[self, dy],
            |p| {
                if p.check_output("conv2d_backprop_filter", &filter_shape, self.dtype())? == 0 {
                    return p.empty(&filter_shape, self.dtype());
                }
                check_conv_scratch(&p, "conv2d_backprop_filter", &w, self.dtype())?;
                let buf = p.backend.conv2d_backprop_filter(
                    self.operand(),
                    dy.operand(),
                    filter_shape,
                    &w,
                )?;
                Ok(Tensor::from_buffer(
                    buf,
                    &filter_shape,
                    self.dtype(),
                    p.backend,
                    p.device,
                ))
            },
        )
    }

    fn pool_window(
        &self,
        op: &'static str,
        ksize: [usize; 2],
        strides: [usize; 2],
        padding: Padding,
    ) -> Result<Window2d> {
        let x = nhwc(op, self)?;
        Window2d::resolve(op, x, ksize, strides, [1, 1], padding)
    }

    /// Max or average pooling (`tf.nn.max_pool2d`, `tf.nn.avg_pool2d`, NHWC).
    pub fn pool2d(
        &self,
        kind: PoolKind,
        ksize: [usize; 2],
        strides: [usize; 2],
        padding: Padding,
    ) -> Result<Tensor> {
        let w = self.pool_window(kind.name(), ksize, strides, padding)?;
        let s = self.shape();
        let shape = [s[0], w.output[0], w.output[1], s[3]];
        dispatch(
            || Op::Pool2d(kind, w.clone()),
            &[self],
            |p| {
                if p.check_output(kind.name(), &shape, self.dtype())? == 0 {
                    return p.empty(&shape, self.dtype());
                }
                Ok(Tensor::from_buffer(
                    p.backend
                        .pool2d(kind, self.operand(), &w.clipped_for_pooling())?,
                    &shape,
                    self.dtype(),
                    p.backend,
                    p.device,
                ))
            },
        )
    }
    /// `tf.nn.max_pool2d`.
    pub fn max_pool2d(
        &self,
        ksize: [usize; 2],
        strides: [usize; 2],
        padding: Padding,
    ) -> Result<Tensor> {
        self.pool2d(PoolKind::MaxPool2d, ksize, strides, padding)
    }
    /// `tf.nn.avg_pool2d` (padding excluded from the mean).
    pub fn avg_pool2d(
        &self,
        ksize: [usize; 2],
        strides: [usize; 2],
        padding: Padding,
    ) -> Result<Tensor> {
        self.pool2d(PoolKind::AvgPool2d, ksize, strides, padding)
    }

    fn check_pool_dy(&self, op: &'static str, w: &Window2d, dy: &Tensor) -> Result<()> {
        let expected = [w.input[0], w.output[0], w.output[1], w.input[3]];
        if dy.shape() != expected {
            return Err(Error::ShapeMismatch {
                op,
                msg: "dy does not match the pooling output shape",
                lhs: expected.to_vec(),
                rhs: dy.shape().to_vec(),
            });
        }
        same_dtype(op, self, &[dy])?;
        Ok(())
    }

    /// Gradient of max pooling: each `dy` goes to the first maximum of its window in `self`.
    pub fn max_pool_grad(
        &self,
        dy: &Tensor,
        ksize: [usize; 2],
        strides: [usize; 2],
        padding: Padding,
    ) -> Result<Tensor> {
        let w = self.pool_window("max_pool_grad", ksize, strides, padding)?;
        self.check_pool_dy("max_pool_grad", &w, dy)?;
        dispatch(
            || Op::MaxPoolGrad(w.clone()),
            &[self, dy],
            |p| {
                if self.num_elements() == 0 {
                    return p.empty(self.shape(), self.dtype());
                }
                Ok(Tensor::from_buffer(
                    p.backend.max_pool_grad(
                        self.operand(),
                        dy.operand(),
                        &w.clipped_for_pooling(),
                    )?,
                    self.shape(),
                    self.dtype(),
                    p.backend,
                    p.device,
                ))
            },
        )
    }

    /// The gradients of `max_pool(activation(x + bias))` from `self`, the pool's input `y`
    /// (the activation's output, `[n, h, w, c]`), and the pooled output's gradient `dy`:
    /// `(dx, dbias)`, what [`Tensor::max_pool_grad`] followed by
    /// [`Tensor::bias_activation_grad`] with the same `y` gives, to the bit. One pass where
    /// the backend has the fused kernel (a convolution's ReLU and bias under a max pooling:
    /// the pooling gradient is never stored), else those two ops; graph functions make it of
    /// them.
    ///
    /// ```no_run
    /// // A backend registered first: `ferroflow::init()` (the facade).
    /// use ferroflow_tensor::{FusedActivation, Padding, Tensor};
    /// // One image of 2x2 pixels, one channel: the window's maximum is the last pixel.
    /// let y = Tensor::from_vec(vec![0.0f32, 1.0, 0.5, 2.0], &[1, 2, 2, 1])?;
    /// let dy = Tensor::from_vec(vec![3.0f32], &[1, 1, 1, 1])?;
    /// let (dx, db) = y.max_pool_bias_activation_grad(
    ///     &dy,
    ///     [2, 2],
    ///     [2, 2],
    ///     Padding::Valid,
    ///     FusedActivation::Relu,
    /// )?;
    /// assert_eq!(dx.to_vec::<f32>()?, vec![0.0, 0.0, 0.0, 3.0]);
    /// assert_eq!(db.to_vec::<f32>()?, vec![3.0]);
    /// # Ok::<(), ferroflow_tensor::Error>(())
    /// ```
    pub fn max_pool_bias_activation_grad(
        &self,
        dy: &Tensor,
        ksize: [usize; 2],
        strides: [usize; 2],
        padding: Padding,
        activation: FusedActivation,
    ) -> Result<(Tensor, Tensor)> {
        const OP: &str = "max_pool_bias_activation_grad";
        let w = self.pool_window(OP, ksize, strides, padding)?;
        self.check_pool_dy(OP, &w, dy)?;
        let composed = || {
            self.max_pool_grad(dy, ksize, strides, padding)?
                .bias_activation_grad(self, activation)
        };
        // Linear: `bias_activation_grad` sums the pooling gradient with `reduce_sum`, whose
        // order a one-pass kernel does not follow; nothing to gain there either way.
        if activation == FusedActivation::Linear
            || self.num_elements() == 0
            || !device_has_fused(
                self.device(),
                FusedKernel::MaxPoolBiasActivationGrad,
                self.dtype(),
            )
        {
            return composed();
        }
        let channels = self.shape()[3];
        dispatch(
            || Op::MaxPoolBiasActivationGrad(w.clone(), activation),
            &[self, dy],
            |p| {
                let (dx, db) = p.backend.max_pool_bias_activation_grad(
                    self.operand(),
                    dy.operand(),
                    &w.clipped_for_pooling(),
                    activation,
                )?;
                Ok((
                    Tensor::from_buffer(dx, self.shape(), self.dtype(), p.backend, p.device),
                    Tensor::from_buffer(db, &[channels], self.dtype(), p.backend, p.device),
                ))
            },
        )
    }

    /// Gradient of average pooling for an input of shape `input_shape`.
    pub fn avg_pool_grad(
        input_shape: [usize; 4],
        dy: &Tensor,
        ksize: [usize; 2],
        strides: [usize; 2],
        padding: Padding,
    ) -> Result<Tensor> {
        nhwc("avg_pool_grad", dy)?;
        let w = Window2d::resolve(
            "avg_pool_grad",
            input_shape,
            ksize,
            strides,
            [1, 1],
            padding,
        )?;
        let expected = [input_shape[0], w.output[0], w.output[1], input_shape[3]];
        if dy.shape() != expected {
            return Err(Error::ShapeMismatch {
                op: "avg_pool_grad",
                msg: "dy does not match the pooling output shape",
                lhs: expected.to_vec(),
                rhs: dy.shape().to_vec(),
            });
        }
        dispatch(
            || Op::AvgPoolGrad(w.clone()),
            &[dy],
            |p| {
                if p.check_output("avg_pool_grad", &input_shape, dy.dtype())? == 0 {
                    return p.empty(&input_shape, dy.dtype());
                }
                Ok(Tensor::from_buffer(
                    p.backend
                        .avg_pool_grad(dy.operand(), &w.clipped_for_pooling())?,
                    &input_shape,
                    dy.dtype(),
                    p.backend,
                    p.device,
                ))
            },
        )
    }

    /// `softmax` along `axis`, stable: `exp(x - max) / Σ exp(x - max)` (float16 and bfloat16
    /// inputs are computed in float32 and the result cast back).
    pub fn softmax(&self, axis: isize) -> Result<Tensor> {
        self.check_float("softmax")?;
        if self.is_half() {
            return self.upcast_half()?.softmax(axis)?.cast(self.dtype());
        }
        let a = normalize_axis("softmax", axis, self.rank())? as isize;
        let e = self.sub(&self.reduce_max(a, true)?)?.exp()?;
        e.div(&e.reduce_sum(a, true)?)
    }

    /// `log_softmax` along `axis`: `x - logsumexp(x)`.
    pub fn log_softmax(&self, axis: isize) -> Result<Tensor> {
        self.check_float("log_softmax")?;
        if self.is_half() {
            return self.upcast_half()?.log_softmax(axis)?.cast(self.dtype());
        }
        let a = normalize_axis("log_softmax", axis, self.rank())? as isize;
        self.sub(&self.reduce_logsumexp(a, true)?)
    }

    /// Float16 and bfloat16 cast to float32, every other dtype as it is: where mixed
    /// precision computes numerically sensitive parts (softmax, losses, normalization
    /// statistics).
    ///
    /// ```no_run
    /// // A backend registered first: `ferroflow::init()` (the facade).
    /// use ferroflow_tensor::{DType, Tensor};
    /// let h = Tensor::ones(&[2], DType::BF16)?;
    /// assert_eq!(h.upcast_half()?.dtype(), DType::F32);
    /// assert_eq!(Tensor::ones(&[2], DType::F64)?.upcast_half()?.dtype(), DType::F64);
    /// # Ok::<(), ferroflow_tensor::Error>(())
    /// ```
    pub fn upcast_half(&self) -> Result<Tensor> {
        match self.dtype() {
            DType::F16 | DType::BF16 => self.cast(DType::F32),
            _ => Ok(self.clone()),
        }
    }

    fn is_half(&self) -> bool {
        matches!(self.dtype(), DType::F16 | DType::BF16)
    }

    fn check_float(&self, op: &'static str) -> Result<()> {
        if self.dtype().is_float() {
            Ok(())
        } else {
            Err(Error::UnsupportedDType {
                op,
                dtype: self.dtype(),
                expected: "a float dtype",
            })
        }
    }
}
