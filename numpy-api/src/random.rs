//! `numpy.random`: one global generator (Philox, as TF's), reseeded by [`seed`]:
//! `rand`, `randn`, `randint`, `uniform`, `standard_normal`, `random`. Draws are made on the
//! host and placed on the current device. The streams are ferroflow's, not NumPy's Mersenne
//! Twister: the same seed gives the same numbers here, not the numbers NumPy would give.
//!
//! ```
//! use ferroflow_numpy as np;
//! ferroflow::init();
//! np::random::seed(7);
//! let a = np::random::rand(&[3])?;
//! np::random::seed(7);
//! assert_eq!(np::random::rand(&[3])?.to_vec::<f64>()?, a.to_vec::<f64>()?);
//! let d = np::random::randint(0, 6, &[1000], None)?;
//! assert!(d.to_vec::<i64>()?.iter().all(|v| (0..6).contains(v)));
//! # Ok::<(), np::Error>(())
//! ```

use std::sync::Mutex;

use ferroflow_tensor::random::Philox;
use ferroflow_tensor::{DType, Error, HostData, Result, Tensor};

use crate::dtypes::{default_float, default_int};

static GENERATOR: Mutex<Option<Philox>> = Mutex::new(None);

fn with_gen<T>(f: impl FnOnce(&mut Philox) -> T) -> T {
    let mut g = GENERATOR.lock().unwrap_or_else(|e| e.into_inner());
    let gen = g.get_or_insert_with(|| {
        let t = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map(|d| d.as_nanos() as u64)
            .unwrap_or(0);
        Philox::new([t, std::process::id() as u64])
    });
    f(gen)
}

/// `numpy.random.seed(seed)`: restarts the global generator.
pub fn seed(seed: u64) {
    let mut g = GENERATOR.lock().unwrap_or_else(|e| e.into_inner());
    *g = Some(Philox::new([seed, 0x006e_756d_7079]));
}

fn floats(shape: &[usize], f: impl Fn(&mut Philox) -> f64) -> Result<Tensor> {
    let n: usize = shape.iter().product();
    let v: Vec<f64> = with_gen(|g| (0..n).map(|_| f(g)).collect());
    crate::creation::host_array(&v, shape, default_float())
}

/// `numpy.random.rand(*shape)`: uniform on `[0, 1)`.
pub fn rand(shape: &[usize]) -> Result<Tensor> {
    floats(shape, |g| g.next_f64())
}
/// `numpy.random.random(size)` (same as [`rand`]).
pub fn random(shape: &[usize]) -> Result<Tensor> {
    rand(shape)
}
/// `numpy.random.randn(*shape)`: standard normal.
pub fn randn(shape: &[usize]) -> Result<Tensor> {
    floats(shape, |g| g.next_normal())
}
/// `numpy.random.standard_normal(size)` (same as [`randn`]).
pub fn standard_normal(shape: &[usize]) -> Result<Tensor> {
    randn(shape)
}
/// `numpy.random.uniform(low, high, size)`: uniform on `[low, high)`.
pub fn uniform(low: f64, high: f64, shape: &[usize]) -> Result<Tensor> {
    if !(low.is_finite() && high.is_finite()) {
        return Err(Error::invalid(
            "uniform",
            format!("low and high must be finite, got {low} and {high}"),
        ));
    }
    floats(shape, |g| low + (high - low) * g.next_f64())
}
/// `numpy.random.randint(low, high, size, dtype=int64)`: integers in `[low, high)`.
pub fn randint(
    low: i64,
    high: i64,
    shape: &[usize],
    dtype: impl Into<Option<DType>>,
) -> Result<Tensor> {
    if high <= low {
        return Err(Error::invalid(
            "randint",
            format!("low >= high ({low} >= {high})"),
        ));
    }
    let span = (high - low) as u64;
    let n: usize = shape.iter().product();
    let v: Vec<i64> = with_gen(|g| {
        (0..n)
            .map(|_| {
                // 64 random bits, rejection-free for spans far below 2^64 (bias < 2^-32)
                let r = ((g.next_u32() as u64) << 32) | g.next_u32() as u64;
                low + (r % span) as i64
            })
            .collect()
    });
    let dtype = dtype.into().unwrap_or(default_int());
    if !dtype.is_int() {
        return Err(Error::invalid(
            "randint",
            format!("Unsupported dtype {dtype} for randint"),
        ));
    }
    Tensor::from_host(HostData::I64(v), shape)?.cast(dtype)
}
