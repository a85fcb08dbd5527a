//! Element traits for the kernels: [`Num`] (the numeric types with native kernels) and
//! [`FloatMath`] (f32 and f64). f16 and bf16 are widened to f32 around every kernel, so
//! they compute and accumulate in f32.

use ferroflow_tensor::Element;

/// A numeric type with native kernels: f32, f64, i8, i32, i64, u8. Integer arithmetic wraps
/// (as TF's does).
pub(crate) trait Num:
    Element + PartialOrd + std::ops::Add<Output = Self> + std::ops::Mul<Output = Self>
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
    /// A sum divided by the `count` of its terms (TF's `Mean`): integers truncate (the
    /// count is not narrowed to the type first; an empty integer set, which the tensor
    /// layer rejects, gives 0), floats give NaN for an empty set.
    fn mean_of(self, count: usize) -> Self;
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
            fn mean_of(self, count: usize) -> Self {
                self / count as $t
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
            fn mean_of(self, count: usize) -> Self {
                if count == 0 {
                    0
                } else {
                    (self as i128 / count as i128) as $t
                }
            }
        }
    };
}
num_float!(f32);
num_float!(f64);
num_int!(i8);
num_int!(i16);
num_int!(i32);
num_int!(i64);
num_int!(u8);
num_int!(u16);
num_int!(u32);
num_int!(u64);

/// Integer division, its relatives and powers in the type's own arithmetic, so unsigned
/// values beyond i64's range divide correctly (TF's `truncatediv`, `floordiv`, `floormod`
/// and `pow`, wrapping where the type does).
pub(crate) trait IntOps: Num {
    /// Below zero (never for unsigned types).
    fn is_negative(self) -> bool;
    /// Truncating division; `MIN / -1` wraps.
    fn trunc_div(self, o: Self) -> Self;
    /// ⌊x / y⌋.
    fn floor_div(self, o: Self) -> Self;
    /// x - ⌊x / y⌋·y (the sign of y).
    fn floor_mod(self, o: Self) -> Self;
    /// x^e for e ≥ 0, wrapping.
    fn wrapping_pow_of(self, e: Self) -> Self;
}

macro_rules! int_ops {
    ($($t:ty),*) => {$(
        impl IntOps for $t {
            #[inline(always)]
            fn is_negative(self) -> bool {
                (self as i128) < 0
            }
            #[inline(always)]
            fn trunc_div(self, o: Self) -> Self {
                self.wrapping_div(o)
            }
            #[inline(always)]
            fn floor_div(self, o: Self) -> Self {
                let q = self.wrapping_div(o);
                if self.wrapping_rem(o) != 0 && (self.is_negative() != o.is_negative()) {
                    q.wrapping_sub(1)
                } else {
                    q
                }
            }
            #[inline(always)]
            fn floor_mod(self, o: Self) -> Self {
                let r = self.wrapping_rem(o);
                if r != 0 && (r.is_negative() != o.is_negative()) {
                    r.wrapping_add(o)
                } else {
                    r
                }
            }
            #[inline(always)]
            fn wrapping_pow_of(self, e: Self) -> Self {
                let (mut base, mut e, mut acc) = (self, e as u64, 1 as $t);
                while e > 0 {
                    if e & 1 == 1 {
                        acc = acc.wrapping_mul(base);
                    }
                    base = base.wrapping_mul(base);
                    e >>= 1;
                }
                acc
            }
        }
    )*};
}
int_ops!(i8, i16, i32, i64, u8, u16, u32, u64);

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
        exp_f64(self)
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

/// Branch-free eˣ for f64, vectorisable as [`exp_f32`]: n = round(x·log₂e), r = x - n·ln 2
/// (ln 2 in two parts), eʳ by its Taylor series to r¹³ (|r| ≤ ½ ln 2, truncation below
/// 1e-17), scaled by 2ⁿ in two factors. Within 2 ulp of `f64::exp`.
#[inline(always)]
pub(crate) fn exp_f64(x: f64) -> f64 {
    const LOG2E: f64 = std::f64::consts::LOG2_E;
    const LN2_HI: f64 = 6.931_471_803_691_238e-1;
    const LN2_LO: f64 = 1.908_214_929_270_587_7e-10;
    const HI: f64 = 709.782_712_893_384;
    const LO: f64 = -745.133_219_101_941_2;
    #[allow(clippy::manual_clamp)]
    let xc = x.max(LO).min(HI);
    let n = xc.mul_add(LOG2E, 6_755_399_441_055_744.0) - 6_755_399_441_055_744.0;
    let r = (-n).mul_add(LN2_LO, (-n).mul_add(LN2_HI, xc));
    // 1/k! for k = 13 down to 2
    let p = 1.605_904_383_682_161_3e-10f64
        .mul_add(r, 2.087_675_698_786_81e-9)
        .mul_add(r, 2.505_210_838_544_172e-8)
        .mul_add(r, 2.755_731_922_398_589e-7)
        .mul_add(r, 2.755_731_922_398_589_3e-6)
        .mul_add(r, 2.480_158_730_158_73e-5)
        .mul_add(r, 1.984_126_984_126_984e-4)
        .mul_add(r, 1.388_888_888_888_889e-3)
        .mul_add(r, 8.333_333_333_333_333e-3)
        .mul_add(r, 4.166_666_666_666_666_4e-2)
        .mul_add(r, 1.666_666_666_666_666_6e-1)
        .mul_add(r, 0.5);
    let y = p.mul_add(r * r, r) + 1.0;
    // SAFETY: n is an integer-valued float in [-1075, 1024], representable as i64.
    let ni: i64 = unsafe { n.to_int_unchecked() };
    let half = ni >> 1;
    let s1 = f64::from_bits(((half + 1023) as u64) << 52);
    let s2 = f64::from_bits(((ni - half + 1023) as u64) << 52);
    let out = y * s1 * s2;
    if x.is_nan() {
        x
    } else if x > HI {
        f64::INFINITY
    } else if x < LO {
        0.0
    } else {
        out
    }
}

#[cfg(test)]
mod tests {
    #[test]
    fn exp_f64_matches_std_within_two_ulp() {
        let mut x = -746.0f64;
        while x < 710.0 {
            let (a, b) = (super::exp_f64(x), x.exp());
            let ulp = (a.to_bits() as i64 - b.to_bits() as i64).abs();
            assert!(
                ulp <= 2 || (a - b).abs() <= f64::MIN_POSITIVE,
                "x {x}: {a} vs {b} ({ulp} ulp)"
            );
            x += 0.001_37;
        }
        for x in [0.0, -0.0, 1e-300, -1e-300, 0.5, -0.5, 1.0, 709.78, -745.0] {
            let (a, b) = (super::exp_f64(x), x.exp());
            assert!((a - b).abs() <= 2.0 * f64::EPSILON * b, "x {x}: {a} vs {b}");
        }
        assert!(super::exp_f64(f64::NAN).is_nan());
        assert_eq!(super::exp_f64(f64::INFINITY), f64::INFINITY);
        assert_eq!(super::exp_f64(f64::NEG_INFINITY), 0.0);
    }

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
