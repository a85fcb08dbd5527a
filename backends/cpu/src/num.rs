//! Element traits for the kernels: [`Num`] (the numeric types with native kernels) and
//! [`FloatMath`] (f32 and f64). f16 and bf16 are widened to f32 around every kernel, so
//! they compute and accumulate in f32.

use ferroflow_tensor::Element;

/// A numeric type with native kernels: f32, f64, i8, i32, i64, u8. Integer arithmetic wraps
/// (as TF's does).
pub(crate) trait Num:
    Element + std::ops::Add<Output = Self> + std::ops::Mul<Output = Self>
{
    const ZERO: Self;
    const ONE: Self;
    /// The lowest value (−∞ for floats): max of an empty set.
    const LOWEST: Self;
    /// The highest value (+∞ for floats): min of an empty set.
    const HIGHEST: Self;
    fn wadd(self, o: Self) -> Self;
    fn wsub(self, o: Self) -> Self;
    fn wmul(self, o: Self) -> Self;
    fn isnan(self) -> bool;
    fn to_i64(self) -> i64;
    fn from_i64(v: i64) -> Self;
}

macro_rules! num_float {
    ($t:ty) => {
        impl Num for $t {
            const ZERO: Self = 0.0;
            const ONE: Self = 1.0;
            const LOWEST: Self = <$t>::NEG_INFINITY;
            const HIGHEST: Self = <$t>::INFINITY;
            #[inline(always)]
            fn wadd(self, o: Self) -> Self {
                self + o
            }
            #[inline(always)]
            fn wsub(self, o: Self) -> Self {
                self - o
            }
            #[inline(always)]
            fn wmul(self, o: Self) -> Self {
                self * o
            }
            #[inline(always)]
            fn isnan(self) -> bool {
                <$t>::is_nan(self)
            }
            #[inline(always)]
            fn to_i64(self) -> i64 {
                self as i64
            }
            #[inline(always)]
            fn from_i64(v: i64) -> Self {
                v as $t
            }
        }
    };
}
macro_rules! num_int {
    ($t:ty) => {
        impl Num for $t {
            const ZERO: Self = 0;
            const ONE: Self = 1;
            const LOWEST: Self = <$t>::MIN;
            const HIGHEST: Self = <$t>::MAX;
            #[inline(always)]
            fn wadd(self, o: Self) -> Self {
                self.wrapping_add(o)
            }
            #[inline(always)]
            fn wsub(self, o: Self) -> Self {
                self.wrapping_sub(o)
            }
            #[inline(always)]
            fn wmul(self, o: Self) -> Self {
                self.wrapping_mul(o)
            }
            #[inline(always)]
            fn isnan(self) -> bool {
                false
            }
            #[inline(always)]
            fn to_i64(self) -> i64 {
                self as i64
            }
            #[inline(always)]
            fn from_i64(v: i64) -> Self {
                v as $t
            }
        }
    };
}
num_float!(f32);
num_float!(f64);
num_int!(i8);
num_int!(i32);
num_int!(i64);
num_int!(u8);

/// f32 and f64: the transcendental functions.
pub(crate) trait FloatMath: Num + num_traits::Float + Send + Sync {
    fn erf(self) -> Self;
    /// eˣ, written so the compiler vectorises it (f32: Cephes polynomial, ≤ 2 ulp).
    fn exp_vec(self) -> Self;
}

impl FloatMath for f32 {
    #[inline(always)]
    fn erf(self) -> Self {
        libm::erff(self)
    }
    #[inline(always)]
    fn exp_vec(self) -> Self {
        exp_f32(self)
    }
}
impl FloatMath for f64 {
    #[inline(always)]
    fn erf(self) -> Self {
        libm::erf(self)
    }
    #[inline(always)]
    fn exp_vec(self) -> Self {
        self.exp()
    }
}

/// Branch-free eˣ for f32 (Cephes `expf`): range reduction by ln 2 in two parts, degree-6
/// polynomial, exponent built with integer ops. Inlined into slice loops it vectorises,
/// which `f32::exp` (a libm call) does not. `mul_add` becomes one FMA instruction in the
/// AVX2+FMA loop variants (1.5x faster than mul then add); on a CPU without FMA it is a
/// correct but slow libm call.
#[inline(always)]
pub(crate) fn exp_f32(x: f32) -> f32 {
    const LOG2E: f32 = std::f32::consts::LOG2_E;
    const C1: f32 = 0.693_359_4;
    const C2: f32 = -2.121_944_4e-4;
    // max/min (unlike clamp) turn NaN into a bound, keeping the integer conversion below defined.
    #[allow(clippy::manual_clamp)]
    let xc = x.max(-103.972_08).min(88.722_83);
    // Round to nearest with the 1.5·2^23 trick: plain adds, so it vectorises on any x86.
    let n = xc.mul_add(LOG2E, 12_582_912.0) - 12_582_912.0;
    let r = (-n).mul_add(C2, (-n).mul_add(C1, xc));
    let r2 = r * r;
    let p = 1.987_569_1e-4f32
        .mul_add(r, 1.398_199_9e-3)
        .mul_add(r, 8.333_452e-3)
        .mul_add(r, 4.166_579_6e-2)
        .mul_add(r, 1.666_666_5e-1)
        .mul_add(r, 0.5);
    let y = p.mul_add(r2, r + 1.0);
    // 2^n for n in [-150, 128]: split in two factors so each stays a normal float.
    // SAFETY: n is an integer-valued float in [-150, 128], representable as i32.
    let ni: i32 = unsafe { n.to_int_unchecked() };
    let half = ni >> 1;
    let s1 = f32::from_bits(((half + 127) as u32) << 23);
    let s2 = f32::from_bits(((ni - half + 127) as u32) << 23);
    let out = y * s1 * s2;
    // Saturate and keep NaN, as `f32::exp` does.
    if x.is_nan() {
        x
    } else if x > 88.722_83 {
        f32::INFINITY
    } else if x < -103.972_08 {
        0.0
    } else {
        out
    }
}

#[cfg(test)]
mod tests {
    #[test]
    fn exp_f32_matches_std_within_two_ulp() {
        let mut x = -104.0f32;
        while x < 89.0 {
            let (a, b) = (super::exp_f32(x), x.exp());
            let ulp = (a.to_bits() as i64 - b.to_bits() as i64).abs();
            assert!(
                ulp <= 2 || (b == 0.0 && a < 1e-44) || (a - b).abs() <= f32::MIN_POSITIVE,
                "x {x}: {a} vs {b} ({ulp} ulp)"
            );
            x += 0.0137;
        }
        assert!(super::exp_f32(f32::NAN).is_nan());
        assert_eq!(super::exp_f32(f32::INFINITY), f32::INFINITY);
        assert_eq!(super::exp_f32(f32::NEG_INFINITY), 0.0);
    }
}
