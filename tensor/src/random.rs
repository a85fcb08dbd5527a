//! Random tensors: stateless (same seed, same numbers, anywhere) and stateful (a global
//! generator seeded by [`set_seed`], like `tf.random.set_seed`).
//!
//! Numbers come from the Philox-4x32-10 counter-based generator (the one TF uses), computed
//! on the host and uploaded; generation is cheap next to what consumes it.
//!
//! ```no_run
//! // A backend registered first: `ferroflow::init()` (the facade).
//! use ferroflow_tensor::{random, DType};
//! let a = random::stateless_normal(&[3], [1, 2], 0.0, 1.0, DType::F32)?;
//! let b = random::stateless_normal(&[3], [1, 2], 0.0, 1.0, DType::F32)?;
//! assert_eq!(a.to_vec::<f32>()?, b.to_vec::<f32>()?);
//! # Ok::<(), ferroflow_tensor::Error>(())
//! ```

use crate::device::current_device;
use crate::dispatch::dispatch_on;
use crate::dtype::{DType, HostData};
use crate::error::{Error, Result};
use crate::op::{Op, RandomDistribution};
use crate::tensor::Tensor;
use std::sync::Mutex;

/// Philox-4x32-10: 128-bit counter, 64-bit key.
#[derive(Debug, Clone)]
pub struct Philox {
    key: [u32; 2],
    counter: [u32; 4],
    buf: [u32; 4],
    used: usize,
}

impl Philox {
    /// A generator from a 2-word seed.
    pub fn new(seed: [u64; 2]) -> Philox {
        Philox {
            key: [seed[0] as u32, (seed[0] >> 32) as u32],
            counter: [0, 0, seed[1] as u32, (seed[1] >> 32) as u32],
            buf: [0; 4],
            used: 4,
        }
    }
    fn block(&mut self) -> [u32; 4] {
        const M0: u64 = 0xD251_1F53;
        const M1: u64 = 0xCD9E_8D57;
        let (mut c, mut k) = (self.counter, self.key);
        for _ in 0..10 {
            let p0 = M0 * c[0] as u64;
            let p1 = M1 * c[2] as u64;
            c = [
                ((p1 >> 32) as u32) ^ c[1] ^ k[0],
                p1 as u32,
                ((p0 >> 32) as u32) ^ c[3] ^ k[1],
                p0 as u32,
            ];
            k[0] = k[0].wrapping_add(0x9E37_79B9);
            k[1] = k[1].wrapping_add(0xBB67_AE85);
        }
        // 128-bit counter increment.
        for w in self.counter.iter_mut() {
            *w = w.wrapping_add(1);
            if *w != 0 {
                break;
            }
        }
        c
    }
    /// Next 32 random bits.
    pub fn next_u32(&mut self) -> u32 {
        if self.used == 4 {
            self.buf = self.block();
            self.used = 0;
        }
        self.used += 1;
        self.buf[self.used - 1]
    }
    /// Uniform in [0, 1) with 53 random bits.
    pub fn next_f64(&mut self) -> f64 {
        let hi = (self.next_u32() >> 5) as u64;
        let lo = (self.next_u32() >> 6) as u64;
        ((hi << 26) | lo) as f64 / (1u64 << 53) as f64
    }
    /// Standard normal (Box-Muller).
    pub fn next_normal(&mut self) -> f64 {
        let u1 = 1.0 - self.next_f64(); // (0, 1]
        let u2 = self.next_f64();
        (-2.0 * u1.ln()).sqrt() * (std::f64::consts::TAU * u2).cos()
    }
}

struct GlobalGen {
    seed: Option<u64>,
    op_count: u64,
}

static GLOBAL: Mutex<GlobalGen> = Mutex::new(GlobalGen {
    seed: None,
    op_count: 0,
});

/// Sets the global seed: later stateful random ops give the same sequence in every run
/// (`tf.random.set_seed`).
pub fn set_seed(seed: u64) {
    let mut g = GLOBAL.lock().unwrap_or_else(|e| e.into_inner());
    g.seed = Some(seed);
    g.op_count = 0;
}

/// TF's `random_seed.get_seed` for random ops built once (a dataset's `shuffle`): with an
/// operation seed the key is `(global seed, op seed)`, the global seed defaulting to TF's
/// `DEFAULT_GRAPH_SEED` (87654321), so two ops with the same seed agree; without one, the
/// global seed ([`set_seed`]) and a per-process op counter decide, or fresh entropy when no
/// global seed is set.
///
/// ```
/// use ferroflow_tensor::random::{get_seed, set_seed};
/// assert_eq!(get_seed(Some(5)), get_seed(Some(5)));
/// set_seed(7);
/// let a = get_seed(None);
/// set_seed(7);
/// assert_eq!(get_seed(None), a);
/// ```
pub fn get_seed(op_seed: Option<u64>) -> [u64; 2] {
    const DEFAULT_GRAPH_SEED: u64 = 87_654_321;
    match op_seed {
        Some(s) => {
            let g = GLOBAL.lock().unwrap_or_else(|e| e.into_inner());
            [g.seed.unwrap_or(DEFAULT_GRAPH_SEED), s]
        }
        None => stateful_seed(None),
    }
}

fn stateful_seed(op_seed: Option<u64>) -> [u64; 2] {
    let mut g = GLOBAL.lock().unwrap_or_else(|e| e.into_inner());
    g.op_count += 1;
    let global = g.seed.unwrap_or_else(|| {
        // No global seed: fresh entropy per process, as TF without a seed.
        let t = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map(|d| d.as_nanos() as u64)
            .unwrap_or(0);
        let s = t ^ 0x5DEE_CE66_D1CE_4E5B;
        g.seed = Some(s);
        s
    });
    [
        global,
        op_seed.unwrap_or(0).wrapping_mul(0x9E37_79B9_7F4A_7C15) ^ g.op_count,
    ]
}

fn check_float(op: &'static str, dtype: DType) -> Result<()> {
    if dtype.is_float() {
        Ok(())
    } else {
        Err(Error::UnsupportedDType {
            op,
            dtype,
            expected: "a float dtype",
        })
    }
}

fn host(dtype: DType, values: Vec<f64>) -> HostData {
    HostData::from_f64_slice(dtype, &values)
}

/// Checks `distribution` for `dtype` and `shape`: the number of values to draw.
fn check_draw(distribution: RandomDistribution, shape: &[usize], dtype: DType) -> Result<usize> {
    let op = distribution.op_name();
    match distribution {
        RandomDistribution::Uniform { minval, maxval } => {
            if maxval.partial_cmp(&minval) != Some(std::cmp::Ordering::Greater) {
                return Err(Error::invalid(
                    op,
                    format!("needs minval < maxval, got {minval} and {maxval}"),
                ));
            }
            if dtype == DType::Bool || dtype.is_complex() {
                return Err(Error::UnsupportedDType {
                    op,
                    dtype,
                    expected: "a float or integer dtype",
                });
            }
        }
        RandomDistribution::Normal { .. } | RandomDistribution::TruncatedNormal { .. } => {
            check_float(op, dtype)?;
        }
    }
    crate::tensor::check_new(op, shape, DType::F64)
}

/// The `n` numbers of `distribution` for `seed`, on the host (checked by [`check_draw`]).
fn draw(distribution: RandomDistribution, n: usize, seed: [u64; 2], dtype: DType) -> HostData {
    let mut g = Philox::new(seed);
    match distribution {
        RandomDistribution::Uniform { minval, maxval } => {
            let v = if dtype.is_int() {
                let (lo, span) = (minval.ceil(), (maxval.ceil() - minval.ceil()).max(1.0));
                (0..n).map(|_| lo + (g.next_f64() * span).floor()).collect()
            } else {
                (0..n)
                    .map(|_| minval + (maxval - minval) * g.next_f64())
                    .collect()
            };
            host(dtype, v)
        }
        RandomDistribution::Normal { mean, stddev } => host(
            dtype,
            (0..n).map(|_| mean + stddev * g.next_normal()).collect(),
        ),
        RandomDistribution::TruncatedNormal { mean, stddev } => {
            let v = (0..n)
                .map(|_| loop {
                    let x = g.next_normal();
                    if x.abs() <= 2.0 {
                        break mean + stddev * x;
                    }
                })
                .collect();
            host(dtype, v)
        }
    }
}

/// The numbers of `distribution` for `seed` as a tensor of `shape` on `p`'s device:
/// generated there where the backend has a generator ([`crate::Backend::random`]), else
/// drawn on the host and uploaded; the same numbers either way.
fn generate(
    p: &crate::dispatch::Placement<'_>,
    distribution: RandomDistribution,
    shape: &[usize],
    seed: [u64; 2],
    dtype: DType,
) -> Result<Tensor> {
    let n = check_draw(distribution, shape, dtype)?;
    if n > 0 {
        if let Some(buffer) = p
            .backend
            .random(p.device.index(), &distribution, n, seed, dtype)
        {
            return Ok(Tensor::from_buffer(
                buffer?, shape, dtype, p.backend, p.device,
            ));
        }
    }
    p.upload(draw(distribution, n, seed, dtype), shape)
}

/// A stateless draw on the current device (an op observers see as a constant, as a
/// tensor made from host data).
fn stateless(
    distribution: RandomDistribution,
    shape: &[usize],
    seed: [u64; 2],
    dtype: DType,
) -> Result<Tensor> {
    dispatch_on(
        || Op::Constant,
        current_device(),
        |p| generate(&p, distribution, shape, seed, dtype),
    )
}

/// Uniform in `[minval, maxval)`; integer dtypes draw integers (`maxval` exclusive).
pub fn stateless_uniform(
    shape: &[usize],
    seed: [u64; 2],
    minval: f64,
    maxval: f64,
    dtype: DType,
) -> Result<Tensor> {
    stateless(
        RandomDistribution::Uniform { minval, maxval },
        shape,
        seed,
        dtype,
    )
}

/// Normal with `mean` and `stddev`.
pub fn stateless_normal(
    shape: &[usize],
    seed: [u64; 2],
    mean: f64,
    stddev: f64,
    dtype: DType,
) -> Result<Tensor> {
    stateless(
        RandomDistribution::Normal { mean, stddev },
        shape,
        seed,
        dtype,
    )
}

/// Normal with values beyond two standard deviations redrawn (`tf.random.truncated_normal`).
pub fn stateless_truncated_normal(
    shape: &[usize],
    seed: [u64; 2],
    mean: f64,
    stddev: f64,
    dtype: DType,
) -> Result<Tensor> {
    stateless(
        RandomDistribution::TruncatedNormal { mean, stddev },
        shape,
        seed,
        dtype,
    )
}

/// New numbers of `distribution` from the global generator on the current device: one
/// [`Op::RandomStateful`] that observers see, so a traced function draws again on every
/// call instead of replaying the numbers of its trace. [`uniform`], [`normal`] and
/// [`truncated_normal`] are this op.
///
/// ```no_run
/// // A backend registered first: `ferroflow::init()` (the facade).
/// use ferroflow_tensor::{random, DType, RandomDistribution};
/// let d = RandomDistribution::Normal { mean: 0.0, stddev: 1.0 };
/// let a = random::stateful(d, &[4], DType::F32, None)?;
/// let b = random::stateful(d, &[4], DType::F32, None)?;
/// assert_ne!(a.to_vec::<f32>()?, b.to_vec::<f32>()?);
/// # Ok::<(), ferroflow_tensor::Error>(())
/// ```
pub fn stateful(
    distribution: RandomDistribution,
    shape: &[usize],
    dtype: DType,
    seed: Option<u64>,
) -> Result<Tensor> {
    let device = current_device();
    dispatch_on(
        || Op::RandomStateful {
            distribution,
            shape: shape.to_vec(),
            dtype,
            seed,
        },
        device,
        |p| generate(&p, distribution, shape, stateful_seed(seed), dtype),
    )
}

/// Stateful uniform (`tf.random.uniform`): each call draws new numbers; reproducible after
/// [`set_seed`].
pub fn uniform(
    shape: &[usize],
    minval: f64,
    maxval: f64,
    dtype: DType,
    seed: Option<u64>,
) -> Result<Tensor> {
    stateful(
        RandomDistribution::Uniform { minval, maxval },
        shape,
        dtype,
        seed,
    )
}

/// Stateful normal (`tf.random.normal`).
pub fn normal(
    shape: &[usize],
    mean: f64,
    stddev: f64,
    dtype: DType,
    seed: Option<u64>,
) -> Result<Tensor> {
    stateful(
        RandomDistribution::Normal { mean, stddev },
        shape,
        dtype,
        seed,
    )
}

/// Stateful truncated normal (`tf.random.truncated_normal`).
pub fn truncated_normal(
    shape: &[usize],
    mean: f64,
    stddev: f64,
    dtype: DType,
    seed: Option<u64>,
) -> Result<Tensor> {
    stateful(
        RandomDistribution::TruncatedNormal { mean, stddev },
        shape,
        dtype,
        seed,
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn philox_uniform_has_the_right_moments() {
        let mut g = Philox::new([7, 0]);
        let xs: Vec<f64> = (0..100_000).map(|_| g.next_f64()).collect();
        let mean = xs.iter().sum::<f64>() / xs.len() as f64;
        let var = xs.iter().map(|x| (x - mean).powi(2)).sum::<f64>() / xs.len() as f64;
        assert!((mean - 0.5).abs() < 0.01, "{mean}");
        assert!((var - 1.0 / 12.0).abs() < 0.005, "{var}");
        assert!(xs.iter().all(|&x| (0.0..1.0).contains(&x)));
    }

    #[test]
    fn philox_normal_has_unit_variance() {
        let mut g = Philox::new([3, 4]);
        let xs: Vec<f64> = (0..100_000).map(|_| g.next_normal()).collect();
        let mean = xs.iter().sum::<f64>() / xs.len() as f64;
        let var = xs.iter().map(|x| (x - mean).powi(2)).sum::<f64>() / xs.len() as f64;
        assert!(
            mean.abs() < 0.02 && (var - 1.0).abs() < 0.02,
            "{mean} {var}"
        );
    }
}
