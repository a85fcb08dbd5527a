//! Elementwise ops: unary math, binary arithmetic/comparison/logic with NumPy broadcasting,
//! `cast`, `select` (TF `where`), `clip_by_value`, and the activations composed from them.

use crate::device::device_has_fused;
use crate::dispatch::dispatch;
use crate::dtype::DType;
use crate::error::{Error, Result};
use crate::fused::FusedKernel;
use crate::layout::broadcast_shapes;
use crate::op::{BinaryOp, Op, UnaryOp};
use crate::tensor::Tensor;

fn check_unary_dtype(op: UnaryOp, dtype: DType) -> Result<()> {
    // conj, real, imag and angle of real numbers are the methods' compositions
    // (`ops/complex.rs`); as primitives they take complex numbers only
    if dtype.is_complex()
        || matches!(
            op,
            UnaryOp::Conj | UnaryOp::Real | UnaryOp::Imag | UnaryOp::Angle
        )
    {
        return if dtype.is_complex() && op.accepts_complex() {
            Ok(())
        } else {
            Err(Error::UnsupportedDType {
                op: op.name(),
                dtype,
                expected: if dtype.is_complex() {
                    "a real dtype (TF has no complex kernel for it)"
                } else {
                    "a complex dtype"
                },
            })
        };
    }
    let ok = match op {
        UnaryOp::LogicalNot => dtype == DType::Bool,
        _ if op.accepts_int() => {
            dtype != DType::Bool && (dtype.is_signed() || !matches!(op, UnaryOp::Neg))
        }
        _ => dtype.is_float(),
    };
    if ok {
        return Ok(());
    }
    let expected = match op {
        UnaryOp::LogicalNot => "bool",
        UnaryOp::Neg => "a float or signed integer dtype",
        _ if op.accepts_int() => "a float or integer dtype",
        _ => "a float dtype (cast integers first)",
    };
    Err(Error::UnsupportedDType {
        op: op.name(),
        dtype,
        expected,
    })
}

fn check_binary_dtype(op: BinaryOp, dtype: DType) -> Result<()> {
    let (ok, expected) = if op == BinaryOp::Complex {
        (
            matches!(dtype, DType::F32 | DType::F64),
            "float32 or float64 parts",
        )
    } else if dtype.is_complex() {
        (
            op.accepts_complex(),
            "a real dtype (complex numbers take +, -, *, /, pow, squared_difference, ==, !=)",
        )
    } else if op.is_logical() {
        (dtype == DType::Bool, "bool")
    } else if matches!(op, BinaryOp::Equal | BinaryOp::NotEqual) {
        (true, "any dtype")
    } else if op.float_only() {
        (dtype.is_float(), "a float dtype")
    } else {
        (dtype != DType::Bool, "a numeric dtype")
    };
    if ok {
        Ok(())
    } else {
        Err(Error::UnsupportedDType {
            op: op.name(),
            dtype,
            expected,
        })
    }
}

impl Tensor {
    /// Applies a unary primitive.
    pub fn unary(&self, op: UnaryOp) -> Result<Tensor> {
        check_unary_dtype(op, self.dtype())?;
        dispatch(
            || Op::Unary(op),
            &[self],
            |p| {
                if self.num_elements() == 0 {
                    return p.empty(self.shape(), op.output_dtype(self.dtype()));
                }
                let buf = p.backend.unary(op, self.operand())?;
                Ok(Tensor::from_buffer(
                    buf,
                    self.shape(),
                    op.output_dtype(self.dtype()),
                    p.backend,
                    p.device,
                ))
            },
        )
    }

    /// Applies a binary primitive with NumPy broadcasting; dtypes must match.
    pub fn binary(&self, op: BinaryOp, rhs: &Tensor) -> Result<Tensor> {
        if self.dtype() != rhs.dtype() {
            return Err(Error::DTypeMismatch {
                op: op.name(),
                lhs: self.dtype(),
                rhs: rhs.dtype(),
            });
        }
        check_binary_dtype(op, self.dtype())?;
        dispatch(
            || Op::Binary(op),
            &[self, rhs],
            |p| {
                let out_dtype = op.output_dtype(self.dtype());
                if self.shape() == rhs.shape() {
                    if self.num_elements() == 0 {
                        return p.empty(self.shape(), out_dtype);
                    }
                    let buf = p.backend.binary(op, self.operand(), rhs.operand())?;
                    return Ok(Tensor::from_buffer(
                        buf,
                        self.shape(),
                        out_dtype,
                        p.backend,
                        p.device,
                    ));
                }
                let shape = broadcast_shapes(op.name(), self.shape(), rhs.shape())?;
                if p.check_output(op.name(), &shape, out_dtype)? == 0 {
                    return p.empty(&shape, out_dtype);
                }
                let (la, lb) = (
                    self.layout().broadcast_to(op.name(), &shape)?,
                    rhs.layout().broadcast_to(op.name(), &shape)?,
                );
                let a = crate::backend::Operand {
                    layout: &la,
                    ..self.operand()
                };
                let b = crate::backend::Operand {
                    layout: &lb,
                    ..rhs.operand()
                };
                let buf = p.backend.binary(op, a, b)?;
                Ok(Tensor::from_buffer(
                    buf, &shape, out_dtype, p.backend, p.device,
                ))
            },
        )
    }

    /// Converts to `dtype` (`tf.cast`): floats to integers truncate toward zero and
    /// saturate, NaN becomes 0; anything to bool is `x != 0`.
    pub fn cast(&self, dtype: DType) -> Result<Tensor> {
        if dtype == self.dtype() {
            return Ok(self.clone());
        }
        dispatch(
            || Op::Cast { to: dtype },
            &[self],
            |p| {
                if p.check_output("cast", self.shape(), dtype)? == 0 {
                    return p.empty(self.shape(), dtype);
                }
                Ok(Tensor::from_buffer(
                    p.backend.cast(self.operand(), dtype)?,
                    self.shape(),
                    dtype,
                    p.backend,
                    p.device,
                ))
            },
        )
    }

    /// `where(cond, self, other)` elementwise, all three broadcast together (`tf.where`).
    pub fn select(cond: &Tensor, on_true: &Tensor, on_false: &Tensor) -> Result<Tensor> {
        if cond.dtype() != DType::Bool {
            return Err(Error::UnsupportedDType {
                op: "select",
                dtype: cond.dtype(),
                expected: "bool for the condition",
            });
        }
        if on_true.dtype() != on_false.dtype() {
            return Err(Error::DTypeMismatch {
                op: "select",
                lhs: on_true.dtype(),
                rhs: on_false.dtype(),
            });
        }
        dispatch(
            || Op::Select,
            &[cond, on_true, on_false],
            |p| {
                let shape = broadcast_shapes("select", cond.shape(), on_true.shape())?;
                let shape = broadcast_shapes("select", &shape, on_false.shape())?;
                if p.check_output("select", &shape, on_true.dtype())? == 0 {
                    return p.empty(&shape, on_true.dtype());
                }
                let lc = cond.layout().broadcast_to("select", &shape)?;
                let lt = on_true.layout().broadcast_to("select", &shape)?;
                let lf = on_false.layout().broadcast_to("select", &shape)?;
                let buf = p.backend.select(
                    crate::backend::Operand {
                        layout: &lc,
                        ..cond.operand()
                    },
                    crate::backend::Operand {
                        layout: &lt,
                        ..on_true.operand()
                    },
                    crate::backend::Operand {
                        layout: &lf,
                        ..on_false.operand()
                    },
                )?;
                Ok(Tensor::from_buffer(
                    buf,
                    &shape,
                    on_true.dtype(),
                    p.backend,
                    p.device,
                ))
            },
        )
    }

    /// Clips to `[min, max]` (`tf.clip_by_value`), as `minimum(maximum(x, min), max)`.
    pub fn clip_by_value(&self, min: &Tensor, max: &Tensor) -> Result<Tensor> {
        self.maximum(min)?.minimum(max)
    }

    /// Clips to constant bounds, `minimum(maximum(x, min), max)` (NaN stays NaN), in one pass
    /// where the backend has the fused kernel, else composed. Bounds convert to the dtype.
    ///
    /// ```no_run
    /// // A backend registered first: `ferroflow::init()` (the facade).
    /// let x = ferroflow_tensor::Tensor::from_vec(vec![-2.0f64, 0.5, 3.0, f64::NAN], &[4])?;
    /// let c = x.clip_scalar(-1.0, 1.0)?.to_vec::<f64>()?;
    /// assert_eq!(&c[..3], &[-1.0, 0.5, 1.0]);
    /// assert!(c[3].is_nan());
    /// # Ok::<(), ferroflow_tensor::Error>(())
    /// ```
    pub fn clip_scalar(&self, min: f64, max: f64) -> Result<Tensor> {
        if self.dtype() == DType::Bool || self.dtype().is_complex() {
            return Err(Error::UnsupportedDType {
                op: "clip_scalar",
                dtype: self.dtype(),
                expected: "a real numeric dtype",
            });
        }
        if !device_has_fused(self.device(), FusedKernel::ClipScalar, self.dtype()) {
            return self.clip_by_value(&self.scalar_like(min)?, &self.scalar_like(max)?);
        }
        dispatch(
            || Op::ClipScalar { min, max },
            &[self],
            |p| {
                if self.num_elements() == 0 {
                    return p.empty(self.shape(), self.dtype());
                }
                let buf = p.backend.clip_scalar(self.operand(), min, max)?;
                Ok(Tensor::from_buffer(
                    buf,
                    self.shape(),
                    self.dtype(),
                    p.backend,
                    p.device,
                ))
            },
        )
    }

    /// `max(x, alpha·x)` (`tf.nn.leaky_relu`, alpha 0.2 in TF).
    pub fn leaky_relu(&self, alpha: f64) -> Result<Tensor> {
        self.maximum(&self.mul(&self.scalar_like(alpha)?)?)
    }
    /// `x` for x > 0, else `alpha·(eˣ - 1)` (`tf.nn.elu` has alpha 1).
    pub fn elu(&self, alpha: f64) -> Result<Tensor> {
        let neg = self.expm1()?.mul(&self.scalar_like(alpha)?)?;
        Tensor::select(&self.greater(&self.scalar_like(0.0)?)?, self, &neg)
    }
    /// `scale·elu(x, alpha)` with the SELU constants (`tf.nn.selu`).
    pub fn selu(&self) -> Result<Tensor> {
        const ALPHA: f64 = 1.673_263_242_354_377_3;
        const SCALE: f64 = 1.050_700_987_355_480_5;
        self.elu(ALPHA)?.mul(&self.scalar_like(SCALE)?)
    }
    /// `ln(1 + eˣ)`, computed stably as `max(x, 0) + ln(1 + e^-|x|)` (`tf.nn.softplus`).
    pub fn softplus(&self) -> Result<Tensor> {
        self.relu()?.add(&self.abs()?.neg()?.exp()?.log1p()?)
    }
    /// `x·Φ(x) = x/2·(1 + erf(x/√2))` (`tf.nn.gelu`, exact form).
    pub fn gelu(&self) -> Result<Tensor> {
        let inner = self
            .mul(&self.scalar_like(std::f64::consts::FRAC_1_SQRT_2)?)?
            .erf()?;
        let one = self.scalar_like(1.0)?;
        self.mul(&self.scalar_like(0.5)?)?.mul(&inner.add(&one)?)
    }
    /// `x·sigmoid(x)` (`tf.nn.swish`, also called silu).
    pub fn swish(&self) -> Result<Tensor> {
        self.mul(&self.sigmoid()?)
    }
}

macro_rules! unary_methods {
    ($($(#[$m:meta])* $name:ident => $op:ident),* $(,)?) => {
        impl Tensor { $( $(#[$m])* pub fn $name(&self) -> Result<Tensor> { self.unary(UnaryOp::$op) } )* }
    };
}
unary_methods!(
    /// -x
    neg => Neg,
    /// |x|
    abs => Abs,
    /// sign(x)
    sign => Sign,
    /// eˣ
    exp => Exp,
    /// eˣ - 1
    expm1 => Expm1,
    /// ln x
    log => Log,
    /// ln(1 + x)
    log1p => Log1p,
    /// √x
    sqrt => Sqrt,
    /// 1/√x
    rsqrt => Rsqrt,
    /// x²
    square => Square,
    /// 1/x
    reciprocal => Reciprocal,
    /// sin x
    sin => Sin,
    /// cos x
    cos => Cos,
    /// tan x
    tan => Tan,
    /// asin x
    asin => Asin,
    /// acos x
    acos => Acos,
    /// atan x
    atan => Atan,
    /// sinh x
    sinh => Sinh,
    /// cosh x
    cosh => Cosh,
    /// tanh x
    tanh => Tanh,
    /// 1/(1 + e^-x)
    sigmoid => Sigmoid,
    /// erf x
    erf => Erf,
    /// ⌊x⌋
    floor => Floor,
    /// ⌈x⌉
    ceil => Ceil,
    /// round half to even
    round => Round,
    /// max(x, 0)
    relu => Relu,
    /// x is finite (bool)
    is_finite => IsFinite,
    /// x is NaN (bool)
    is_nan => IsNan,
    /// !x (bool)
    logical_not => LogicalNot,
);

macro_rules! binary_methods {
    ($($(#[$m:meta])* $name:ident => $op:ident),* $(,)?) => {
        impl Tensor { $( $(#[$m])* pub fn $name(&self, rhs: &Tensor) -> Result<Tensor> { self.binary(BinaryOp::$op, rhs) } )* }
    };
}
binary_methods!(
    /// a + b
    add => Add,
    /// a - b
    sub => Sub,
    /// a · b
    mul => Mul,
    /// a / b (integers truncate toward zero; division by zero is an error)
    div => Div,
    /// ⌊a / b⌋
    floordiv => FloorDiv,
    /// a mod b with the sign of b (`tf.math.floormod`)
    floormod => FloorMod,
    /// a^b (integers: negative exponents are an error)
    pow => Pow,
    /// max(a, b)
    maximum => Maximum,
    /// min(a, b)
    minimum => Minimum,
    /// (a - b)²
    squared_difference => SquaredDifference,
    /// atan2(a, b)
    atan2 => Atan2,
    /// self · \[features > 0\]: a ReLU's input gradient from its output gradient `self` and
    /// its input `features` (TF `ReluGrad`)
    relu_grad => ReluGrad,
    /// a == b
    equal => Equal,
    /// a != b
    not_equal => NotEqual,
    /// a < b
    less => Less,
    /// a <= b
    less_equal => LessEqual,
    /// a > b
    greater => Greater,
    /// a >= b
    greater_equal => GreaterEqual,
    /// a && b
    logical_and => LogicalAnd,
    /// a || b
    logical_or => LogicalOr,
    /// a ^ b
    logical_xor => LogicalXor,
);
