//! One gradient function per primitive op, written with ordinary tensor ops so that an outer
//! tape records them (higher-order gradients). Each arm opens with its derivative.
//!
//! Non-differentiable ops (comparisons, logical ops, argmax, floor/ceil/round/sign, integer
//! outputs) give `None`: no gradient, never a made-up number.
//!
//! Complex numbers follow TF's convention: the gradient of a real loss L with respect to
//! z = x + iy is ∂L/∂x + i·∂L/∂y, so a holomorphic f passes back g·conj(f'(z)). The rules
//! written for real numbers serve holomorphic ops as conj(rule(conj(g))) (`holomorphic`).

use ferroflow_tensor::{
    Axes, BinaryOp, CumulativeOp, DType, Error, FusedActivation, HostData, Op, PoolKind, ReduceOp,
    Result, Tensor, UnaryOp,
};

/// Sums `g` down to `shape`, undoing NumPy broadcasting.
pub(crate) fn unbroadcast(g: Tensor, shape: &[usize]) -> Result<Tensor> {
    if g.shape() == shape {
        return Ok(g);
    }
    let lead = g.rank() - shape.len();
    let mut axes: Vec<isize> = (0..lead as isize).collect();
    for (i, &d) in shape.iter().enumerate() {
        if d == 1 && g.shape()[lead + i] != 1 {
            axes.push((lead + i) as isize);
        }
    }
    g.reduce_sum(Axes::List(axes), false)?.reshape_to(shape)
}

fn scalar(like: &Tensor, v: f64) -> Result<Tensor> {
    like.scalar_like(v)
}

/// `f()` when the gradient is needed, `None` otherwise: skips backward work for inputs
/// that lead to no source (a model's input images, for instance).
fn when(needed: bool, f: impl FnOnce() -> Result<Tensor>) -> Result<Option<Tensor>> {
    if needed {
        f().map(Some)
    } else {
        Ok(None)
    }
}

/// conv2d's input and filter gradients for output gradient `g` (each only when needed):
/// dx = backprop_input(f, g), df = backprop_filter(x, g).
fn conv2d_grads(
    w: &ferroflow_tensor::Window2d,
    x: &Tensor,
    f: &Tensor,
    g: &Tensor,
    needs: [bool; 2],
) -> Result<Vec<Option<Tensor>>> {
    let fs = shape4(f.shape());
    Ok(vec![
        when(needs[0], || {
            Tensor::conv2d_backprop_input(w.input, f, g, w.strides, w.padding(), w.dilations)
        })?,
        when(needs[1], || {
            x.conv2d_backprop_filter(fs, g, w.strides, w.padding(), w.dilations)
        })?,
    ])
}

/// The gradients of `y = act(conv2d(x, f) + b)` (inputs `[x, f, b]`) for `y`'s gradient `g`:
/// through the activation (ReLU: where y > 0, i.e. where its input was positive), then
/// conv2d's and a bias add's.
fn fused_conv2d(
    w: &ferroflow_tensor::Window2d,
    activation: FusedActivation,
    inputs: &[Tensor],
    y: &Tensor,
    g: Tensor,
    need: impl Fn(usize) -> bool,
) -> Result<Vec<Option<Tensor>>> {
    let (g, db) = through_bias_activation(g, y, activation, need(2))?;
    let mut grads = conv2d_grads(w, &inputs[0], &inputs[1], &g, [need(0), need(1)])?;
    grads.push(db);
    Ok(grads)
}

/// `(dx, db) = bias_activation_grad(g, y)` is linear in `g`: dx = g·mask, db = Σ dx over
/// the leading axes, so d/dg = (gdx + gdb broadcast along the last axis)·mask; `y` enters
/// only through the mask (zero derivative almost everywhere).
fn bias_activation_grad(
    activation: FusedActivation,
    y: &Tensor,
    grads: &[Option<Tensor>],
) -> Result<Vec<Option<Tensor>>> {
    let sum = match (
        grads.first().cloned().flatten(),
        grads.get(1).cloned().flatten(),
    ) {
        (None, None) => return Ok(vec![None, None]),
        (Some(gdx), None) => gdx,
        (None, Some(gdb)) => gdb.broadcast_to(y.shape())?,
        (Some(gdx), Some(gdb)) => gdx.add(&gdb)?,
    };
    Ok(vec![
        Some(match activation {
            FusedActivation::Linear => sum,
            FusedActivation::Relu => sum.relu_grad(y)?,
        }),
        None,
    ])
}

/// The gradient of `y = activation(z + bias)` with respect to `z` from `y`'s gradient `g`
/// (ReLU: where y > 0, i.e. where its input was positive), and the bias's when `bias` is
/// asked for (one fused pass then): the first half of a fused convolution's or product's
/// gradient.
fn through_bias_activation(
    g: Tensor,
    y: &Tensor,
    activation: FusedActivation,
    bias: bool,
) -> Result<(Tensor, Option<Tensor>)> {
    Ok(match activation {
        _ if bias => {
            let (g, db) = g.bias_activation_grad(y, activation)?;
            (g, Some(db))
        }
        FusedActivation::Linear => (g, None),
        FusedActivation::Relu => (g.relu_grad(y)?, None),
    })
}

/// `(loss, backprop) = sparse_softmax_cross_entropy_with_logits(logits, labels)`: the
/// loss's gradient is `backprop`, scaled per row by `gloss`; `backprop = p - one_hot` with
/// `p = softmax(logits)` has the softmax's Jacobian-vector product `p·(gb - Σ gb·p)`. Both
/// read the op's outputs, so an outer tape differentiates them again (any order). The
/// labels get none.
fn sparse_softmax_cross_entropy(
    labels: &Tensor,
    outputs: &[Tensor],
    grads: &[Option<Tensor>],
) -> Result<Vec<Option<Tensor>>> {
    let backprop = &outputs[1];
    let from_loss = match grads.first().cloned().flatten() {
        Some(g) => Some(backprop.mul(&g.expand_dims(-1)?)?),
        None => None,
    };
    let from_backprop = match grads.get(1).cloned().flatten() {
        Some(gb) => {
            let classes = backprop.shape().last().copied().unwrap_or(0);
            let one_hot = Tensor::one_hot(labels, classes, 1.0, 0.0, backprop.dtype())?;
            let p = backprop.add(&one_hot)?;
            let inner = gb.mul(&p)?.reduce_sum(-1isize, true)?;
            Some(p.mul(&gb.sub(&inner)?)?)
        }
        None => None,
    };
    let d_logits = match (from_loss, from_backprop) {
        (Some(a), Some(b)) => Some(a.add(&b)?),
        (a, b) => a.or(b),
    };
    Ok(vec![d_logits, None])
}

/// A fused elementwise program: its ops recomputed one by one under a tape of their own and
/// differentiated there (an outer tape records that too: higher orders work).
/// `reduce`: the reduction a `FusedReduce` applies to the program's first output;
/// `product`: a `FusedMatMulReduce`'s transposes (its inputs `[a, b, rest..]`, the program's
/// `[a @ b, rest..]`).
fn fused_elementwise(
    program: &ferroflow_tensor::ElementwiseProgram,
    reduce: Option<(ReduceOp, &[usize], bool)>,
    product: Option<(bool, bool)>,
    inputs: &[Tensor],
    grads: &[Option<Tensor>],
) -> Result<Vec<Option<Tensor>>> {
    let tape = crate::GradientTape::new();
    // The inputs themselves, so an outer tape connects the recomputation to them.
    let xs = Tensor::with_distinct_ids(inputs)?;
    for x in &xs {
        tape.watch(x);
    }
    let operands: Vec<Tensor> = match (product, &xs[..]) {
        (Some((ta, tb)), [a, b, rest @ ..]) => std::iter::once(a.matmul_t(b, ta, tb)?)
            .chain(rest.iter().cloned())
            .collect(),
        _ => xs.clone(),
    };
    let mut shape: Vec<usize> = Vec::new();
    for x in &operands {
        shape = ferroflow_tensor::layout::broadcast_shapes("fused_elementwise", &shape, x.shape())?;
    }
    let mut ys = program.compose(&operands, &shape)?;
    if let (Some((op, axes, keepdims)), Some(first)) = (reduce, ys.first_mut()) {
        let axes: Vec<isize> = axes.iter().map(|&a| a as isize).collect();
        *first = first.reduce(op, axes, keepdims)?;
    }
    let (targets, seeds): (Vec<Tensor>, Vec<Tensor>) = ys
        .into_iter()
        .zip(grads)
        .filter_map(|(y, g)| g.clone().map(|g| (y, g)))
        .unzip();
    if targets.is_empty() {
        return Ok(vec![None; inputs.len()]);
    }
    let sources: Vec<crate::Source> = xs.iter().map(crate::Source::from).collect();
    tape.gradient_with(
        &targets,
        &sources,
        Some(&seeds),
        crate::UnconnectedGradients::None,
    )
}

/// Gradients of a primitive's inputs from the gradients of its outputs (`None` = zero).
/// `needs[i]` says whether input `i` leads to a source; the costly gradients (matmul,
/// convolution, products) are computed only for those.
pub(crate) fn backward(
    op: &Op,
    inputs: &[Tensor],
    outputs: &[Tensor],
    grads: &[Option<Tensor>],
    needs: &[bool],
) -> Result<Vec<Option<Tensor>>> {
    let need = |i: usize| needs.get(i).copied().unwrap_or(true);
    if let Op::BiasActivationGrad(activation) = op {
        return bias_activation_grad(*activation, &inputs[1], grads);
    }
    if let Op::SparseSoftmaxCrossEntropy = op {
        return sparse_softmax_cross_entropy(&inputs[1], outputs, grads);
    }
    if let Op::FusedElementwise(program) = op {
        return fused_elementwise(program, None, None, inputs, grads);
    }
    // Each tensor's gradient as `gather`'s: scattered back (the indices get none).
    if let Op::GatherGroup { axis } = op {
        let Some((indices, xs)) = inputs.split_last() else {
            return Ok(vec![]);
        };
        let mut out = Vec::with_capacity(inputs.len());
        for (x, g) in xs.iter().zip(grads.iter().chain(std::iter::repeat(&None))) {
            out.push(match g {
                Some(g) => Some(Tensor::scatter_add(indices, g, x.shape(), *axis as isize)?),
                None => None,
            });
        }
        out.push(None);
        return Ok(out);
    }
    if let Op::FusedMatMulReduce {
        program,
        transpose_a,
        transpose_b,
    } = op
    {
        let rows = Some((ReduceOp::ReduceSum, &[0usize][..], false));
        let product = Some((*transpose_a, *transpose_b));
        return fused_elementwise(program, rows, product, inputs, grads);
    }
    if let Op::FusedReduce {
        program,
        reduce,
        axes,
        keepdims,
    } = op
    {
        return fused_elementwise(
            program,
            Some((*reduce, axes, *keepdims)),
            None,
            inputs,
            grads,
        );
    }
    // (y, max_pool(y)) with y = act(conv2d(x, f) + b): y's gradient is its own plus the
    // pooling's (routed to each window's first maximum), then the fused convolution's rule.
    if let Op::FusedConv2dMaxPool(w, activation, pool) = op {
        let y = &outputs[0];
        let through_pool = match grads.get(1).cloned().flatten() {
            Some(gp) => Some(y.max_pool_grad(&gp, pool.kernel, pool.strides, pool.padding())?),
            None => None,
        };
        let g = match (grads.first().cloned().flatten(), through_pool) {
            (Some(gy), Some(gp)) => gy.add(&gp)?,
            (Some(g), None) | (None, Some(g)) => g,
            (None, None) => return Ok(vec![None; inputs.len()]),
        };
        return fused_conv2d(w, *activation, inputs, y, g, need);
    }
    let Some(g) = grads.first().cloned().flatten() else {
        return Ok(vec![None; inputs.len()]);
    };
    let y = &outputs[0];
    Ok(match op {
        Op::Constant | Op::RandomStateful { .. } => vec![],
        Op::Unary(u) => vec![unary(*u, &inputs[0], y, &g)?],
        Op::Binary(b) => binary(*b, &inputs[0], &inputs[1], &g, [need(0), need(1)])?,
        Op::Reduce { op, axes, keepdims } => vec![reduce(*op, &inputs[0], y, &g, axes, *keepdims)?],
        Op::ArgReduce { .. } => vec![None],
        // the gradient passes where min <= x <= max (TF's ClipByValue gradient)
        Op::ClipScalar { min, max } => {
            let x = &inputs[0];
            let inside = x
                .greater_equal(&x.scalar_like(*min)?)?
                .logical_and(&x.less_equal(&x.scalar_like(*max)?)?)?;
            vec![Some(g.mul(&inside.cast(g.dtype())?)?)]
        }
        // d cast(x) = cast(g) back to x's dtype, for float and complex x only (a complex
        // gradient reaching a real input keeps its real part, as TF's).
        Op::Cast { .. } => vec![if differentiable(inputs[0].dtype()) {
            Some(g.cast(inputs[0].dtype())?)
        } else {
            None
        }],
        Op::MatMul {
            transpose_a,
            transpose_b,
        } => matmul(
            &inputs[0],
            &inputs[1],
            &g,
            *transpose_a,
            *transpose_b,
            [need(0), need(1)],
        )?,
        // reshape: the gradient has the input's shape.
        Op::Reshape { .. } => vec![Some(g.reshape_to(inputs[0].shape())?)],
        // transpose: apply the inverse permutation.
        Op::Transpose { perm } => {
            let mut inv = vec![0; perm.len()];
            for (i, &p) in perm.iter().enumerate() {
                inv[p] = i;
            }
            vec![Some(g.transpose(&inv)?)]
        }
        Op::StridedSlice {
            begin,
            len: _,
            step,
        } => vec![Some(slice_grad(&g, inputs[0].shape(), begin, step)?)],
        Op::BroadcastTo { .. } => vec![Some(unbroadcast(g, inputs[0].shape())?)],
        // where(c, a, b): a gets g where c, b gets g elsewhere; c gets nothing.
        Op::Select => {
            let zeros = g.zeros_like()?;
            let c = &inputs[0];
            vec![
                None,
                Some(unbroadcast(
                    Tensor::select(c, &g, &zeros)?,
                    inputs[1].shape(),
                )?),
                Some(unbroadcast(
                    Tensor::select(c, &zeros, &g)?,
                    inputs[2].shape(),
                )?),
            ]
        }
        // gather: scatter the gradient back (repeated indices accumulate).
        Op::Gather { axis } => vec![
            Some(Tensor::scatter_add(
                &inputs[1],
                &g,
                inputs[0].shape(),
                *axis as isize,
            )?),
            None,
        ],
        // scatter_add: each update's gradient is the gradient at its destination.
        Op::ScatterAdd { axis, .. } => vec![None, Some(g.gather(&inputs[0], *axis as isize)?)],
        // concat: split the gradient into the inputs' sizes.
        Op::Concat { axis } => {
            let sizes: Vec<usize> = inputs.iter().map(|t| t.shape()[*axis]).collect();
            g.split(&sizes, *axis as isize)?
                .into_iter()
                .map(Some)
                .collect()
        }
        // pad: the gradient is the un-padded window.
        Op::Pad { paddings, .. } => {
            let begin: Vec<usize> = paddings.iter().map(|p| p.0).collect();
            let size: Vec<isize> = inputs[0].shape().iter().map(|&d| d as isize).collect();
            vec![Some(g.slice(&begin, &size)?)]
        }
        Op::Cumulative {
            op,
            axis,
            exclusive,
            reverse,
        } => vec![cumulative(
            *op, &inputs[0], y, &g, *axis, *exclusive, *reverse,
        )?],
        // sort: route each value's gradient back to where it came from.
        Op::Sort { axis, .. } => vec![Some(unpermute(&g, &outputs[1], *axis)?)],
        Op::Copy => vec![Some(g)],
        Op::StopGradient { .. } => vec![None],
        // The gradient goes back to the device the input came from.
        Op::ToDevice { .. } => vec![Some(g.to_device(inputs[0].device())?)],
        Op::ToHost => vec![None],
        // conv2d: dx = backprop_input(f, g), df = backprop_filter(x, g).
        Op::Conv2d(w) => conv2d_grads(w, &inputs[0], &inputs[1], &g, [need(0), need(1)])?,
        Op::FusedConv2d(w, activation) => fused_conv2d(w, *activation, inputs, y, g, need)?,
        // y = act(a @ b + bias): the gradient through the activation, then matmul's and
        // the bias add's.
        Op::FusedMatMul(activation) => {
            let (g, db) = through_bias_activation(g, y, *activation, need(2))?;
            let mut grads = matmul(&inputs[0], &inputs[1], &g, false, false, [need(0), need(1)])?;
            grads.push(db);
            grads
        }
        // backprop_input(f, dy) is linear in each: d/df = backprop_filter(g, dy), d/ddy = conv2d(g, f).
        Op::Conv2dBackpropInput(w) => {
            let (f, dy) = (&inputs[0], &inputs[1]);
            let fs = shape4(f.shape());
            vec![
                Some(g.conv2d_backprop_filter(fs, dy, w.strides, w.padding(), w.dilations)?),
                Some(g.conv2d(f, w.strides, w.padding(), w.dilations)?),
            ]
        }
        // backprop_filter(x, dy): d/dx = backprop_input(g, dy), d/ddy = conv2d(x, g).
        Op::Conv2dBackpropFilter(w) => {
            let (xx, dy) = (&inputs[0], &inputs[1]);
            vec![
                Some(Tensor::conv2d_backprop_input(
                    w.input,
                    &g,
                    dy,
                    w.strides,
                    w.padding(),
                    w.dilations,
                )?),
                Some(xx.conv2d(&g, w.strides, w.padding(), w.dilations)?),
            ]
        }
        Op::Pool2d(kind, w) => {
            let p = w.padding();
            vec![Some(match kind {
                PoolKind::MaxPool2d => inputs[0].max_pool_grad(&g, w.kernel, w.strides, p)?,
                PoolKind::AvgPool2d => Tensor::avg_pool_grad(w.input, &g, w.kernel, w.strides, p)?,
            })]
        }
        // avg_pool_grad is linear in dy; its adjoint is avg_pool.
        Op::AvgPoolGrad(w) => vec![Some(g.avg_pool2d(w.kernel, w.strides, w.padding())?)],
        // fft: the adjoint of the unscaled transform is n·ifft; of ifft, fft/n (TF's FFTGrad)
        Op::Fft { inverse } => {
            let n = scalar(&g, *inputs[0].shape().last().unwrap_or(&1) as f64)?;
            vec![Some(if *inverse {
                g.fft()?.div(&n)?
            } else {
                g.ifft()?.mul(&n)?
            })]
        }
        Op::MaxPoolGrad(_) | Op::MaxPoolBiasActivationGrad(..) => {
            return Err(Error::NoGradient {
                op: op.name(),
                detail: ", so max pooling has no second derivative here yet".into(),
            })
        }
        other => {
            return Err(Error::NoGradient {
                op: other.name(),
                detail: String::new(),
            })
        }
    })
    .map(|mut v: Vec<Option<Tensor>>| {
        v.resize(inputs.len(), None);
        v
    })
}

fn shape4(s: &[usize]) -> [usize; 4] {
    [s[0], s[1], s[2], s[3]]
}

/// `rule(conj(g))` conjugated: a rule written for real numbers, applied to a holomorphic op
/// of complex numbers (the conjugations are free on real ones).
fn holomorphic<const N: usize>(
    g: &Tensor,
    rule: impl FnOnce(&Tensor) -> Result<[Option<Tensor>; N]>,
) -> Result<[Option<Tensor>; N]> {
    if !g.dtype().is_complex() {
        return rule(g);
    }
    let mut out = rule(&g.conj()?)?;
    for t in out.iter_mut().flatten() {
        *t = t.conj()?;
    }
    Ok(out)
}

fn unary(op: UnaryOp, x: &Tensor, y: &Tensor, g: &Tensor) -> Result<Option<Tensor>> {
    use UnaryOp::*;
    match op {
        // d conj = conj (as TF: the gradient conjugated)
        Conj => return Ok(Some(g.conj()?)),
        // d re(z) = 1 on the real axis: g as the real part
        Real => return Ok(Some(Tensor::complex(g, &g.zeros_like()?)?)),
        // d im(z): g as the imaginary part
        Imag => return Ok(Some(Tensor::complex(&g.zeros_like()?, g)?)),
        // d arg(z) = (-y + ix)/|z|² (TF's AngleGrad)
        Angle => {
            let z = Tensor::complex(&x.imag()?, &x.real()?)?.reciprocal()?;
            let gc = Tensor::complex(g, &g.zeros_like()?)?;
            return Ok(Some(gc.mul(&z)?.neg()?));
        }
        // d|z| = z/|z| (0 at 0; sign(x) for real x)
        Abs => return Ok(Some(g.cast(x.dtype())?.mul(&x.sign()?)?)),
        _ => {}
    }
    let [grad] = holomorphic(g, |g| Ok([real_unary(op, x, y, g)?]))?;
    Ok(grad)
}

/// The gradient of a unary op of real numbers (and, through [`holomorphic`], complex ones).
fn real_unary(op: UnaryOp, x: &Tensor, y: &Tensor, g: &Tensor) -> Result<Option<Tensor>> {
    use UnaryOp::*;
    let one = || scalar(x, 1.0);
    Ok(Some(match op {
        // d(-x) = -1
        Neg => g.neg()?,
        // d eˣ = eˣ
        Exp => g.mul(y)?,
        // d(eˣ - 1) = eˣ = y + 1
        Expm1 => g.mul(&y.add(&one()?)?)?,
        // d ln x = 1/x
        Log => g.div(x)?,
        // d ln(1+x) = 1/(1+x)
        Log1p => g.div(&x.add(&one()?)?)?,
        // d √x = 1/(2√x)
        Sqrt => g.div(&y.mul(&scalar(x, 2.0)?)?)?,
        // d x^-½ = -½ x^-3/2 = -½ y³
        Rsqrt => g.mul(&y.mul(y)?.mul(y)?.mul(&scalar(x, -0.5)?)?)?,
        // d x² = 2x
        Square => g.mul(&x.mul(&scalar(x, 2.0)?)?)?,
        // d 1/x = -1/x² = -y²
        Reciprocal => g.mul(&y.square()?.neg()?)?,
        // d sin = cos
        Sin => g.mul(&x.cos()?)?,
        // d cos = -sin
        Cos => g.mul(&x.sin()?.neg()?)?,
        // d tan = 1 + tan²
        Tan => g.mul(&y.square()?.add(&one()?)?)?,
        // d asin = 1/√(1-x²)
        Asin => g.mul(&one()?.sub(&x.square()?)?.rsqrt()?)?,
        // d acos = -1/√(1-x²)
        Acos => g.mul(&one()?.sub(&x.square()?)?.rsqrt()?.neg()?)?,
        // d atan = 1/(1+x²)
        Atan => g.div(&x.square()?.add(&one()?)?)?,
        // d sinh = cosh
        Sinh => g.mul(&x.cosh()?)?,
        // d cosh = sinh
        Cosh => g.mul(&x.sinh()?)?,
        // d tanh = 1 - tanh²
        Tanh => g.mul(&one()?.sub(&y.square()?)?)?,
        // d σ = σ(1-σ)
        Sigmoid => g.mul(&y.mul(&one()?.sub(y)?)?)?,
        // d erf = 2/√π e^{-x²}
        Erf => g.mul(
            &x.square()?
                .neg()?
                .exp()?
                .mul(&scalar(x, std::f64::consts::FRAC_2_SQRT_PI)?)?,
        )?,
        // d relu = [x > 0] = [y > 0] (NaN in both): read off the output, as TF's ReluGrad
        // does, so a graph's backward does not keep the activation's input alive (the
        // product, bias add and ReLU of a Dense layer then fuse into one op).
        Relu => g.relu_grad(y)?,
        // piecewise constant or boolean: no gradient
        Sign | Floor | Ceil | Round | IsFinite | IsNan | LogicalNot => return Ok(None),
        // handled in `unary`
        Abs | Conj | Real | Imag | Angle => return Ok(None),
    }))
}

fn binary(
    op: BinaryOp,
    a: &Tensor,
    b: &Tensor,
    g: &Tensor,
    needs: [bool; 2],
) -> Result<Vec<Option<Tensor>>> {
    if op == BinaryOp::Complex {
        // complex(a, b): a gets the real part of g, b the imaginary part
        return Ok(vec![
            when(needs[0], || unbroadcast(g.real()?, a.shape()))?,
            when(needs[1], || unbroadcast(g.imag()?, b.shape()))?,
        ]);
    }
    if !differentiable(a.dtype()) {
        return Ok(vec![None, None]);
    }
    if a.dtype().is_complex() {
        return complex_binary(op, a, b, g, needs);
    }
    real_binary(op, a, b, g, needs)
}

/// The gradients of a binary op of real numbers (and, through [`holomorphic`], of the
/// holomorphic ones of complex numbers).
fn real_binary(
    op: BinaryOp,
    a: &Tensor,
    b: &Tensor,
    g: &Tensor,
    needs: [bool; 2],
) -> Result<Vec<Option<Tensor>>> {
    use BinaryOp::*;
    let (da, db) = match op {
        // d(a+b) = (1, 1)
        Add => (g.clone(), g.clone()),
        // d(a-b) = (1, -1)
        Sub => (g.clone(), g.neg()?),
        // d(ab) = (b, a), each only when wanted
        Mul => {
            return Ok(vec![
                when(needs[0], || unbroadcast(g.mul(b)?, a.shape()))?,
                when(needs[1], || unbroadcast(g.mul(a)?, b.shape()))?,
            ])
        }
        // d(a/b) = (1/b, -a/b²)
        Div => (g.div(b)?, g.mul(&a.neg()?.div(&b.square()?)?)?),
        // d(a mod b) = (1, -⌊a/b⌋)
        FloorMod => (g.clone(), g.mul(&a.floordiv(b)?.neg()?)?),
        // d aᵇ = (b a^(b-1), ln(a) aᵇ); the second is 0 where a <= 0 (TF's convention)
        Pow => {
            let one = scalar(a, 1.0)?;
            let da = g.mul(&b.mul(&a.pow(&b.sub(&one)?)?)?)?;
            let zero = scalar(a, 0.0)?;
            let positive = a.greater(&zero)?;
            let safe_a = Tensor::select(&positive, a, &a.ones_like()?)?;
            let log_a = Tensor::select(&positive, &safe_a.log()?, &a.zeros_like()?)?;
            (da, g.mul(&log_a.mul(&a.pow(b)?)?)?)
        }
        // d max(a, b): to a where a >= b, else to b (TF's tie rule)
        Maximum | Minimum => {
            let pick_a = if op == Maximum {
                a.greater_equal(b)?
            } else {
                a.less_equal(b)?
            };
            let zeros = g.zeros_like()?;
            let gb = g.broadcast_to(&broadcast_shape(a, b)?)?;
            let zb = zeros.broadcast_to(gb.shape())?;
            (
                Tensor::select(&pick_a, &gb, &zb)?,
                Tensor::select(&pick_a, &zb, &gb)?,
            )
        }
        // d (a-b)² = (2(a-b), -2(a-b))
        SquaredDifference => {
            let d = a.sub(b)?.mul(&scalar(a, 2.0)?)?.mul(g)?;
            (d.clone(), d.neg()?)
        }
        // relu_grad(a, b) = a·[b > 0]: linear in a, piecewise constant in b
        ReluGrad => {
            return Ok(vec![Some(unbroadcast(g.relu_grad(b)?, a.shape())?), None]);
        }
        // d atan2(a, b) = (b, -a) / (a² + b²)
        Atan2 => {
            let r = a.square()?.add(&b.square()?)?;
            (g.mul(&b.div(&r)?)?, g.mul(&a.neg()?.div(&r)?)?)
        }
        // floor division, comparisons and logic are piecewise constant
        FloorDiv | Equal | NotEqual | Less | LessEqual | Greater | GreaterEqual | LogicalAnd
        | LogicalOr | LogicalXor | Complex => return Ok(vec![None, None]),
    };
    Ok(vec![
        Some(unbroadcast(da, a.shape())?),
        Some(unbroadcast(db, b.shape())?),
    ])
}

/// The binary ops of complex numbers: the holomorphic ones by their real rules, conjugated;
/// (a-b)·conj(a-b) is real-valued, so its gradient is 2·re(g)·(a-b).
fn complex_binary(
    op: BinaryOp,
    a: &Tensor,
    b: &Tensor,
    g: &Tensor,
    needs: [bool; 2],
) -> Result<Vec<Option<Tensor>>> {
    use BinaryOp::*;
    let [da, db] = match op {
        Add | Sub | Mul | Div => holomorphic(g, |g| {
            let v = real_binary(op, a, b, g, needs)?;
            Ok([v[0].clone(), v[1].clone()])
        })?,
        // d aᵇ = (b a^(b-1), ln(a) aᵇ) on the principal branch
        Pow => holomorphic(g, |g| {
            let one = scalar(a, 1.0)?;
            Ok([
                when(needs[0], || {
                    unbroadcast(g.mul(&b.mul(&a.pow(&b.sub(&one)?)?)?)?, a.shape())
                })?,
                when(needs[1], || {
                    unbroadcast(g.mul(&a.log()?.mul(&a.pow(b)?)?)?, b.shape())
                })?,
            ])
        })?,
        SquaredDifference => {
            let d = a.sub(b)?.mul(&g.real()?.cast(a.dtype())?)?;
            let d = d.mul(&scalar(a, 2.0)?)?;
            [
                Some(unbroadcast(d.clone(), a.shape())?),
                Some(unbroadcast(d.neg()?, b.shape())?),
            ]
        }
        _ => [None, None],
    };
    Ok(vec![da, db])
}

fn broadcast_shape(a: &Tensor, b: &Tensor) -> Result<Vec<usize>> {
    ferroflow_tensor::layout::broadcast_shapes("gradient", a.shape(), b.shape())
}

/// The gradient reshaped so it broadcasts against the input (reduced axes back as size 1).
fn keep_reduced(g: &Tensor, x: &Tensor, axes: &[usize], keepdims: bool) -> Result<Tensor> {
    if keepdims {
        return Ok(g.clone());
    }
    let shape: Vec<usize> = x
        .shape()
        .iter()
        .enumerate()
        .map(|(i, &d)| if axes.contains(&i) { 1 } else { d })
        .collect();
    g.reshape_to(&shape)
}

fn reduce(
    op: ReduceOp,
    x: &Tensor,
    y: &Tensor,
    g: &Tensor,
    axes: &[usize],
    keepdims: bool,
) -> Result<Option<Tensor>> {
    if !differentiable(x.dtype()) {
        return Ok(None);
    }
    let gk = keep_reduced(g, x, axes, keepdims)?;
    Ok(Some(match op {
        // d Σx = 1 everywhere
        ReduceOp::ReduceSum => gk.broadcast_to(x.shape())?,
        // d mean = 1 / count everywhere (divided before broadcasting: one small op)
        ReduceOp::ReduceMean => {
            let count: usize = axes.iter().map(|&a| x.shape()[a]).product();
            gk.div(&gk.scalar_like(count as f64)?)?
                .broadcast_to(x.shape())?
        }
        // d max: shared equally by the elements equal to the max (TF's rule)
        ReduceOp::ReduceMax | ReduceOp::ReduceMin => {
            let yk = keep_reduced(y, x, axes, keepdims)?;
            let hit = x.equal(&yk)?.cast(x.dtype())?;
            let count =
                hit.reduce_sum(Axes::List(axes.iter().map(|&a| a as isize).collect()), true)?;
            gk.mul(&hit)?.div(&count)?
        }
        // d Πx / dxᵢ = Π_{j≠i} xⱼ: exclusive products from both sides (exact with zeros)
        ReduceOp::ReduceProd => prod_grad(x, &gk, axes)?,
        ReduceOp::ReduceAny | ReduceOp::ReduceAll => return Ok(None),
    }))
}

fn prod_grad(x: &Tensor, gk: &Tensor, axes: &[usize]) -> Result<Tensor> {
    let rank = x.rank();
    let kept: Vec<usize> = (0..rank).filter(|a| !axes.contains(a)).collect();
    let mut perm = kept.clone();
    perm.extend_from_slice(axes);
    let k: usize = kept.iter().map(|&a| x.shape()[a]).product();
    let r: usize = axes.iter().map(|&a| x.shape()[a]).product();
    let flat = x.transpose(&perm)?.reshape_to(&[k, r])?;
    let left = flat.cumprod(1, true, false)?;
    let right = flat.cumprod(1, true, true)?;
    // conj: the products are the derivative, passed back conjugated (complex numbers)
    let others = left.mul(&right)?.conj()?;
    let mut permuted_shape: Vec<usize> = perm.iter().map(|&p| x.shape()[p]).collect();
    if permuted_shape.is_empty() {
        permuted_shape = vec![];
    }
    let mut inv = vec![0; rank];
    for (i, &p) in perm.iter().enumerate() {
        inv[p] = i;
    }
    let back = others.reshape_to(&permuted_shape)?.transpose(&inv)?;
    back.mul(gk)
}

fn matmul(
    a: &Tensor,
    b: &Tensor,
    g: &Tensor,
    ta: bool,
    tb: bool,
    needs: [bool; 2],
) -> Result<Vec<Option<Tensor>>> {
    if !differentiable(a.dtype()) {
        return Ok(vec![None, None]);
    }
    // Complex matrices: the adjoints (conjugate transposes) take the transposes' place.
    let (a, b) = (&a.conj()?, &b.conj()?);
    // C = op(A) op(B): dA = g op(B)ᵀ (transposed back if A was), dB likewise.
    let da = when(needs[0], || {
        let da = match (ta, tb) {
            (false, false) => g.matmul_t(b, false, true)?,
            (false, true) => g.matmul_t(b, false, false)?,
            (true, false) => b.matmul_t(g, false, true)?,
            (true, true) => b.matmul_t(g, true, true)?,
        };
        unbroadcast(da, a.shape())
    })?;
    let db = when(needs[1], || {
        let db = match (ta, tb) {
            (false, false) => a.matmul_t(g, true, false)?,
            (false, true) => g.matmul_t(a, true, false)?,
            (true, false) => a.matmul_t(g, false, false)?,
            (true, true) => g.matmul_t(a, true, true)?,
        };
        unbroadcast(db, b.shape())
    })?;
    Ok(vec![da, db])
}

/// Gradient of a strided slice: place `g` back at the sliced positions of zeros of `shape`,
/// one scatter per axis (a pad when the step is 1).
fn slice_grad(g: &Tensor, shape: &[usize], begin: &[usize], step: &[isize]) -> Result<Tensor> {
    let mut out = g.clone();
    for axis in 0..shape.len() {
        let n = g.shape()[axis];
        if n == shape[axis] && step[axis] == 1 {
            continue;
        }
        if step[axis] == 1 {
            let mut pads = vec![(0, 0); shape.len()];
            pads[axis] = (begin[axis], shape[axis] - begin[axis] - n);
            out = out.pad(&pads, 0.0)?;
        } else {
            let idx: Vec<i64> = (0..n)
                .map(|i| begin[axis] as i64 + i as i64 * step[axis] as i64)
                .collect();
            let idx = Tensor::from_host_on(HostData::I64(idx), &[n], g.device())?;
            let mut target = out.shape().to_vec();
            target[axis] = shape[axis];
            out = Tensor::scatter_add(&idx, &out, &target, axis as isize)?;
        }
    }
    Ok(out)
}

fn cumulative(
    op: CumulativeOp,
    x: &Tensor,
    y: &Tensor,
    g: &Tensor,
    axis: usize,
    exclusive: bool,
    reverse: bool,
) -> Result<Option<Tensor>> {
    if !differentiable(x.dtype()) {
        return Ok(None);
    }
    let a = axis as isize;
    let [grad] = holomorphic(g, |g| {
        Ok([Some(match op {
            // cumsum's adjoint is the cumsum running the other way.
            CumulativeOp::Cumsum => g.cumsum(a, exclusive, !reverse)?,
            // cumprod: Σ_{j ≥ i} g_j y_j / x_i (TF's formula; inputs with zeros give inf/NaN,
            // as in TF)
            CumulativeOp::Cumprod => g.mul(y)?.cumsum(a, exclusive, !reverse)?.div(x)?,
        })])
    })?;
    Ok(grad)
}

/// Inverse of a per-lane permutation: `out[.., idx[.., j, ..], ..] = g[.., j, ..]` along `axis`.
fn unpermute(g: &Tensor, idx: &Tensor, axis: usize) -> Result<Tensor> {
    // Build full scatter_nd indices [.., rank]: every coordinate is its own, except `axis`.
    let rank = g.rank();
    let shape = g.shape().to_vec();
    let n: usize = shape.iter().product();
    let perm = idx.to_f64_vec()?;
    let mut full = Vec::with_capacity(n * rank);
    for (i, &p) in perm.iter().enumerate().take(n) {
        let mut rem = i;
        let mut coord = vec![0usize; rank];
        for a in (0..rank).rev() {
            coord[a] = rem % shape[a];
            rem /= shape[a];
        }
        coord[axis] = p as usize;
        full.extend(coord.iter().map(|&c| c as i64));
    }
    let mut ishape = shape.clone();
    ishape.push(rank);
    let indices = Tensor::from_host_on(HostData::I64(full), &ishape, g.device())?;
    Tensor::scatter_nd(&indices, g, &shape)
}

/// True for dtypes that carry gradients.
pub(crate) fn differentiable(d: DType) -> bool {
    d.is_float() || d.is_complex()
}
