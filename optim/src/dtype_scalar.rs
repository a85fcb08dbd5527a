//! Hyperparameter arithmetic as TF 2.4 does it: in the variable's dtype.
//!
//! TF converts each hyperparameter to the variable's dtype (`_get_hyper(name, var_dtype)`)
//! and computes `1 - beta_2`, `beta_1 ** t`, `lr * sqrt(1 - beta_2 ** t) / (1 - beta_1 ** t)`
//! and the like with ops of that dtype, each result rounded. Doing it in f64 and rounding
//! once gives other float32 values (`1 - beta_2` alone differs by 1.3e-5 relative for
//! β2 = 0.999), and the slots drift from TF's. [`DtypeScalar`] rounds after every
//! operation, so float32 variables get exactly TF's scalars.

use ferroflow_tensor::{DType, HostData};
use std::ops::{Add, Div, Mul, Sub};

/// A scalar in `dtype`'s precision: every operation's result is rounded to it.
#[derive(Debug, Clone, Copy, PartialEq)]
pub(crate) struct DtypeScalar {
    value: f64,
    dtype: DType,
}

/// `x` rounded to the nearest value of `dtype`.
fn round_to(x: f64, dtype: DType) -> f64 {
    match dtype {
        DType::F64 => x,
        DType::F32 => x as f32 as f64,
        d => HostData::filled(d, 1, x).get_f64(0),
    }
}

impl DtypeScalar {
    /// `value` converted to `dtype` (a Python float becoming a tensor of the variable's
    /// dtype).
    pub(crate) fn new(value: f64, dtype: DType) -> DtypeScalar {
        DtypeScalar {
            value: round_to(value, dtype),
            dtype,
        }
    }
    /// The value (exactly representable in the dtype).
    pub(crate) fn get(self) -> f64 {
        self.value
    }
    fn with(self, value: f64) -> DtypeScalar {
        DtypeScalar::new(value, self.dtype)
    }
    /// √x.
    pub(crate) fn sqrt(self) -> DtypeScalar {
        // +, -, ·, / and √ of two values of a narrower type, done in f64 and rounded once,
        // give the narrower type's correctly rounded result.
        self.with(self.value.sqrt())
    }
    /// `self ** exponent` as the dtype's own `pow` computes it.
    pub(crate) fn pow(self, exponent: f64) -> DtypeScalar {
        let e = round_to(exponent, self.dtype);
        match self.dtype {
            DType::F64 => self.with(self.value.powf(e)),
            _ => self.with((self.value as f32).powf(e as f32) as f64),
        }
    }
}

macro_rules! arith {
    ($($tr:ident $f:ident $op:tt),*) => {$(
        impl $tr for DtypeScalar {
            type Output = DtypeScalar;
            fn $f(self, rhs: DtypeScalar) -> DtypeScalar {
                self.with(self.value $op rhs.value)
            }
        }
        /// A Python float on one side: converted to the dtype first, as TF does.
        impl $tr<f64> for DtypeScalar {
            type Output = DtypeScalar;
            fn $f(self, rhs: f64) -> DtypeScalar {
                self.with(self.value $op round_to(rhs, self.dtype))
            }
        }
        impl $tr<DtypeScalar> for f64 {
            type Output = DtypeScalar;
            fn $f(self, rhs: DtypeScalar) -> DtypeScalar {
                rhs.with(round_to(self, rhs.dtype) $op rhs.value)
            }
        }
    )*};
}
arith!(Add add +, Sub sub -, Mul mul *, Div div /);

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn float32_arithmetic_rounds_every_step_as_float32_does() {
        let b2 = DtypeScalar::new(0.999, DType::F32);
        assert_eq!(b2.get(), 0.999f32 as f64);
        assert_eq!((1.0 - b2).get(), (1.0f32 - 0.999f32) as f64);
        assert_ne!((1.0 - b2).get(), (1.0 - 0.999f64) as f32 as f64);
        let t = DtypeScalar::new(3.0, DType::F32);
        assert_eq!(
            (b2.pow(t.get()) * 2.5).sqrt().get(),
            ((0.999f32.powf(3.0) * 2.5).sqrt()) as f64
        );
        let d = DtypeScalar::new(0.1, DType::F64);
        assert_eq!((d / 3.0).get(), 0.1 / 3.0);
        let h = DtypeScalar::new(0.1, DType::F16);
        assert_eq!(h.get(), half::f16::from_f64(0.1).to_f64());
    }
}
