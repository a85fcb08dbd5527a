//! Shared machinery: proptest configuration, input tensors with varied layouts, tolerances
//! and comparison against the f64 reference.

use super::reference::RefArray;
use crate::{DType, Device, HostData, SliceSpec, Tensor};
use proptest::prelude::*;
use proptest::test_runner::{Config, TestCaseError, TestRunner};

/// Cases per property (env `FERROFLOW_CONFORMANCE_CASES`, default 256): GPU backends on
/// software drivers lower it, a soak run raises it.
pub fn cases() -> u32 {
    std::env::var("FERROFLOW_CONFORMANCE_CASES")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(256)
}

/// The cap [`limit_compiled_program_cases`] sets (none by default).
static COMPILED_PROGRAM_CASES: std::sync::atomic::AtomicU32 =
    std::sync::atomic::AtomicU32::new(u32::MAX);

/// Caps the cases of the properties whose every case is a new program the backend compiles
/// (random elementwise programs): a test binary whose backend compiles each with a C++
/// compiler (the CUDA backend's host emulation) runs fewer of them than [`cases`].
///
/// ```
/// use ferroflow_tensor::conformance::harness;
/// harness::limit_compiled_program_cases(24);
/// assert!(harness::compiled_program_cases() <= 24);
/// ```
pub fn limit_compiled_program_cases(n: u32) {
    COMPILED_PROGRAM_CASES.store(n, std::sync::atomic::Ordering::Relaxed);
}

/// Cases of a property whose every case is a new compiled program: [`cases`], or fewer
/// after [`limit_compiled_program_cases`].
pub fn compiled_program_cases() -> u32 {
    cases().min(COMPILED_PROGRAM_CASES.load(std::sync::atomic::Ordering::Relaxed))
}

/// Runs a property, panicking with proptest's minimal failing case.
pub fn check<S: Strategy>(
    name: &str,
    strategy: S,
    test: impl Fn(S::Value) -> Result<(), TestCaseError>,
) where
    S::Value: std::fmt::Debug,
{
    check_cases(name, cases(), strategy, test)
}

/// [`check`] with `cases` cases (a property whose cases are expensive runs fewer).
pub fn check_cases<S: Strategy>(
    name: &str,
    cases: u32,
    strategy: S,
    test: impl Fn(S::Value) -> Result<(), TestCaseError>,
) where
    S::Value: std::fmt::Debug,
{
    let mut runner = TestRunner::new(Config {
        cases,
        failure_persistence: None,
        ..Config::default()
    });
    if let Err(e) = runner.run(&strategy, test) {
        panic!("conformance property `{name}` failed: {e}");
    }
}

/// Turns an `Err` from ferroflow into a failed case naming the op.
pub fn ok<T>(what: &str, r: crate::Result<T>) -> Result<T, TestCaseError> {
    r.map_err(|e| TestCaseError::fail(format!("{what}: unexpected error: {e}")))
}

/// How the input's elements sit in memory; every kind shows the same logical values.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ViewKind {
    /// Dense, offset 0.
    Contiguous,
    /// A transpose of a dense tensor with the reverse axis order.
    Transposed,
    /// Axis 0 reversed (negative stride).
    Reversed,
    /// Every second element of a last axis twice as long.
    Strided,
    /// A dense view at a non-zero offset.
    Offset,
}

/// Any view kind.
pub fn view_kind() -> impl Strategy<Value = ViewKind> {
    prop_oneof![
        Just(ViewKind::Contiguous),
        Just(ViewKind::Transposed),
        Just(ViewKind::Reversed),
        Just(ViewKind::Strided),
        Just(ViewKind::Offset),
    ]
}

/// Values rounded to what `dtype` can hold (so the reference sees the real inputs).
pub fn quantize(dtype: DType, v: &[f64]) -> Vec<f64> {
    HostData::from_f64_slice(dtype, v).to_f64_vec()
}

/// A dense tensor of `shape` on `device` holding `v` converted to `dtype` (rounded or
/// truncated as `HostData::from_f64_slice` converts; read it back for the exact values).
pub fn upload(device: &Device, dtype: DType, shape: &[usize], v: &[f64]) -> crate::Result<Tensor> {
    Tensor::from_host_on(HostData::from_f64_slice(dtype, v), shape, *device)
}

/// A tensor on `device` holding `a` (already quantized) through the layout `view` asks for.
pub fn make_tensor(
    device: &Device,
    dtype: DType,
    a: &RefArray,
    view: ViewKind,
) -> crate::Result<Tensor> {
    make_view(a, view, 7.0, |shape, data| {
        upload(device, dtype, shape, data)
    })
}

/// The layout work of [`make_tensor`] for any element type: `upload` places a dense
/// buffer of `a`'s values (or `filler` in the gaps a view skips) on the device, the view
/// is then taken there. Complex tensors pass an array of element indices and a negative
/// filler, and upload the elements the indices name.
pub fn make_view(
    a: &RefArray,
    view: ViewKind,
    filler: f64,
    upload: impl Fn(&[usize], &[f64]) -> crate::Result<Tensor>,
) -> crate::Result<Tensor> {
    let rank = a.shape.len();
    match view {
        ViewKind::Transposed if rank >= 2 => {
            let perm: Vec<usize> = (0..rank).rev().collect();
            let t = a.transpose(&perm);
            upload(&t.shape, &t.data)?.transpose(&perm)
        }
        ViewKind::Reversed if rank >= 1 => {
            let n0 = a.shape[0];
            let inner: usize = a.shape[1..].iter().product();
            let mut data = Vec::with_capacity(a.data.len());
            for i in (0..n0).rev() {
                data.extend_from_slice(&a.data[i * inner..(i + 1) * inner]);
            }
            upload(&a.shape, &data)?.reverse(&[0])
        }
        ViewKind::Strided if rank >= 1 => {
            let last = a.shape[rank - 1];
            let mut shape = a.shape.clone();
            shape[rank - 1] = 2 * last;
            let mut data = Vec::with_capacity(a.data.len() * 2);
            for row in a.data.chunks(last.max(1)) {
                for &x in row {
                    data.extend([x, filler]);
                }
            }
            if last == 0 {
                data.clear();
            }
            let t = upload(&shape, &data)?;
            let mut specs = vec![SliceSpec::ALL; rank - 1];
            specs.push(SliceSpec::Range {
                start: None,
                stop: None,
                step: 2,
            });
            t.strided_slice(&specs)
        }
        ViewKind::Offset => {
            let mut data = vec![filler; 5];
            data.extend_from_slice(&a.data);
            let t = upload(&[data.len()], &data)?;
            t.slice(&[5], &[a.data.len() as isize])?
                .reshape_to(&a.shape)
        }
        _ => upload(&a.shape, &a.data),
    }
}

/// The dtypes of `list` that `device` stores and computes (a GPU backend may lack float64,
/// bfloat16 or the 8-bit types; those must fail with an error instead, checked elsewhere).
pub fn supported(device: &Device, list: &[DType]) -> Vec<DType> {
    list.iter()
        .copied()
        .filter(|&d| crate::device_supports(*device, d))
        .collect()
}

/// float64 where the device has it, else float32: the dtype of checks that want the most
/// exact arithmetic the device offers.
pub fn exact_float(device: &Device) -> DType {
    if crate::device_supports(*device, DType::F64) {
        DType::F64
    } else {
        DType::F32
    }
}

/// Relative and absolute tolerance for results of `dtype`, for a well-conditioned op.
pub fn tolerance(dtype: DType) -> (f64, f64) {
    match dtype {
        DType::F64 => (1e-10, 1e-12),
        DType::F32 => (2e-5, 1e-6),
        DType::F16 => (2e-3, 2e-3),
        DType::BF16 => (1.6e-2, 1e-2),
        _ => (0.0, 0.0),
    }
}

/// Compares a result tensor with the reference: same shape, and each element within
/// `scale` × the dtype's tolerance (NaNs must match NaNs, infinities must match exactly).
pub fn assert_matches(
    what: &str,
    got: &Tensor,
    want: &RefArray,
    scale: f64,
) -> Result<(), TestCaseError> {
    assert_close(what, got, want, scale, 0.0)
}

/// Compares a result with the reference element by element, element `i` within `tol[i]`
/// (absolute; 0 demands equality). NaNs must match NaNs, infinities match exactly. For
/// results whose error is known per element: a sum's from the elements it adds, a max's
/// (exact) of zero.
pub fn assert_within(
    what: &str,
    got: &Tensor,
    want: &RefArray,
    tol: &[f64],
) -> Result<(), TestCaseError> {
    prop_assert_eq!(got.shape(), want.shape.as_slice(), "{}: shape", what);
    let g = ok(what, got.to_f64_vec())?;
    for (i, ((&x, &y), &t)) in g.iter().zip(&want.data).zip(tol).enumerate() {
        let fine = if y.is_nan() {
            x.is_nan()
        } else if y.is_infinite() || x.is_infinite() {
            x == y
        } else {
            (x - y).abs() <= t
        };
        prop_assert!(
            fine,
            "{}: element {} (index {:?}) is {}, reference {} (tolerance {}, {})",
            what,
            i,
            super::reference::unravel(i, &want.shape),
            x,
            y,
            t,
            got.dtype()
        );
    }
    Ok(())
}

/// The smallest normal number of a float dtype: below it, results may be subnormal or
/// flushed to zero (GPUs flush), so only that absolute accuracy is promised there.
pub fn min_normal(dtype: DType) -> f64 {
    match dtype {
        DType::F64 => f64::MIN_POSITIVE,
        DType::F32 | DType::BF16 => f32::MIN_POSITIVE as f64,
        DType::F16 => 2f64.powi(-14),
        _ => 0.0,
    }
}

/// Machine epsilon of a float dtype (0 for the others).
pub fn epsilon(dtype: DType) -> f64 {
    match dtype {
        DType::F64 => f64::EPSILON,
        DType::F32 => f32::EPSILON as f64,
        DType::F16 => 9.77e-4,
        DType::BF16 => 7.82e-3,
        _ => 0.0,
    }
}

/// [`assert_matches`] with an extra absolute tolerance (for sums, whose rounding error
/// scales with Σ|x| rather than with the result).
pub fn assert_close(
    what: &str,
    got: &Tensor,
    want: &RefArray,
    scale: f64,
    extra_atol: f64,
) -> Result<(), TestCaseError> {
    prop_assert_eq!(got.shape(), want.shape.as_slice(), "{}: shape", what);
    let g = ok(what, got.to_f64_vec())?;
    let (rtol, atol) = tolerance(got.dtype());
    let (rtol, atol) = (rtol * scale, atol * scale + extra_atol);
    for (i, (&x, &y)) in g.iter().zip(&want.data).enumerate() {
        let fine = if y.is_nan() {
            x.is_nan()
        } else if y.is_infinite() || x.is_infinite() {
            x == y
        } else {
            (x - y).abs() <= atol + rtol * y.abs()
        };
        prop_assert!(
            fine,
            "{}: element {} (index {:?}) is {}, reference {} ({})",
            what,
            i,
            super::reference::unravel(i, &want.shape),
            x,
            y,
            got.dtype()
        );
    }
    Ok(())
}

/// A shape of rank `0..=max_rank` with dims `0..=max_dim`.
pub fn shape(max_rank: usize, max_dim: usize) -> impl Strategy<Value = Vec<usize>> {
    prop::collection::vec(0..=max_dim, 0..=max_rank)
}

/// A shape with values drawn from `lo..hi`.
pub fn array(max_rank: usize, max_dim: usize, lo: f64, hi: f64) -> impl Strategy<Value = RefArray> {
    shape(max_rank, max_dim).prop_flat_map(move |s| {
        let n: usize = s.iter().product();
        prop::collection::vec(lo..hi, n).prop_map(move |d| RefArray::new(&s, d))
    })
}

/// A non-empty shape of rank `1..=max_rank` with values in `lo..hi`.
pub fn nonempty_array(
    max_rank: usize,
    max_dim: usize,
    lo: f64,
    hi: f64,
) -> impl Strategy<Value = RefArray> {
    prop::collection::vec(1..=max_dim, 1..=max_rank).prop_flat_map(move |s| {
        let n: usize = s.iter().product();
        prop::collection::vec(lo..hi, n).prop_map(move |d| RefArray::new(&s, d))
    })
}

/// Rounds every value of an integer dtype's array to integers and quantizes to `dtype`.
pub fn quantized(dtype: DType, a: &RefArray) -> RefArray {
    let v: Vec<f64> = if dtype.is_float() {
        a.data.clone()
    } else {
        a.data.iter().map(|x| x.round()).collect()
    };
    RefArray::new(&a.shape, quantize(dtype, &v))
}

/// Wraps an exact integer result to `dtype` the way C casts do (what TF's integer kernels give).
pub fn wrap_int(dtype: DType, v: f64) -> f64 {
    let i = v as i64;
    match dtype {
        DType::I8 => i as i8 as f64,
        DType::I16 => i as i16 as f64,
        DType::U8 => i as u8 as f64,
        DType::U16 => i as u16 as f64,
        DType::U32 => i as u32 as f64,
        DType::U64 => i as u64 as f64,
        DType::I32 => i as i32 as f64,
        DType::I64 => i as f64,
        DType::Bool => (i != 0) as u8 as f64,
        _ => v,
    }
}
