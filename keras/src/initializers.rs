//! Weight initializers (`tf.keras.initializers`), with TF's fan computation and seeds.
//!
//! ```
//! ferroflow::init();
//! use ferroflow_keras::initializers::Initializer;
//! use ferroflow_tensor::DType;
//! let w = Initializer::GlorotUniform { seed: Some(7) }.sample(&[784, 256], DType::F32)?;
//! let limit = (6.0f32 / (784.0 + 256.0)).sqrt();
//! assert!(w.to_vec::<f32>()?.iter().all(|x| x.abs() <= limit));
//! # Ok::<(), ferroflow_tensor::Error>(())
//! ```

use ferroflow_tensor::{random, DType, Error, Result, Tensor};
use serde_json::{json, Value};

/// Which fan a [`Initializer::VarianceScaling`] divides by.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum FanMode {
    /// Input units (`fan_in`).
    FanIn,
    /// Output units (`fan_out`).
    FanOut,
    /// Their mean (`fan_avg`).
    FanAvg,
}

/// The distribution a [`Initializer::VarianceScaling`] draws from.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Distribution {
    /// Normal truncated at two standard deviations, rescaled to the wanted variance.
    TruncatedNormal,
    /// Plain normal.
    UntruncatedNormal,
    /// Uniform in `[-limit, limit]`.
    Uniform,
}

/// A weight initializer. With `seed: Some(s)` every call gives the same values (TF 2.4);
/// with `None` each call draws fresh numbers from the global generator
/// ([`ferroflow_tensor::random::set_seed`] makes that reproducible).
#[derive(Debug, Clone, PartialEq)]
pub enum Initializer {
    /// All zeros.
    Zeros,
    /// All ones.
    Ones,
    /// One value everywhere.
    Constant(f64),
    /// Normal with the given mean and standard deviation.
    RandomNormal {
        /// Mean.
        mean: f64,
        /// Standard deviation.
        stddev: f64,
        /// Seed.
        seed: Option<u64>,
    },
    /// Uniform in `[minval, maxval)`.
    RandomUniform {
        /// Lower bound.
        minval: f64,
        /// Upper bound.
        maxval: f64,
        /// Seed.
        seed: Option<u64>,
    },
    /// Normal truncated at two standard deviations.
    TruncatedNormal {
        /// Mean.
        mean: f64,
        /// Standard deviation (before truncation).
        stddev: f64,
        /// Seed.
        seed: Option<u64>,
    },
    /// TF's `VarianceScaling`: variance `scale / n` with `n` the chosen fan.
    VarianceScaling {
        /// Scale.
        scale: f64,
        /// Fan.
        mode: FanMode,
        /// Distribution.
        distribution: Distribution,
        /// Seed.
        seed: Option<u64>,
    },
    /// Glorot (Xavier) uniform: the Keras default for kernels.
    GlorotUniform {
        /// Seed.
        seed: Option<u64>,
    },
    /// Glorot (Xavier) normal.
    GlorotNormal {
        /// Seed.
        seed: Option<u64>,
    },
    /// He normal (`scale` 2, fan_in, truncated normal).
    HeNormal {
        /// Seed.
        seed: Option<u64>,
    },
    /// He uniform.
    HeUniform {
        /// Seed.
        seed: Option<u64>,
    },
    /// LeCun normal (`scale` 1, fan_in, truncated normal).
    LecunNormal {
        /// Seed.
        seed: Option<u64>,
    },
    /// LeCun uniform.
    LecunUniform {
        /// Seed.
        seed: Option<u64>,
    },
    /// A (semi-)orthogonal matrix times `gain`, from the QR decomposition of a normal matrix.
    Orthogonal {
        /// Multiplier.
        gain: f64,
        /// Seed.
        seed: Option<u64>,
    },
    /// The identity matrix times `gain` (2-D shapes only).
    Identity {
        /// Multiplier.
        gain: f64,
    },
}

/// `(fan_in, fan_out)` of a weight shape, as TF computes them: the last two dimensions are
/// (input, output) and the leading ones form the receptive field.
pub fn compute_fans(shape: &[usize]) -> (f64, f64) {
    match shape.len() {
        0 => (1.0, 1.0),
        1 => (shape[0] as f64, shape[0] as f64),
        2 => (shape[0] as f64, shape[1] as f64),
        r => {
            // In f64: exact for any real shape, and a hostile one cannot overflow.
            let field: f64 = shape[..r - 2].iter().map(|&d| d as f64).product();
            (shape[r - 2] as f64 * field, shape[r - 1] as f64 * field)
        }
    }
}

/// Seed pair for one draw: fixed for a seeded initializer, from the global generator otherwise.
fn draw_seed(seed: Option<u64>) -> Result<[u64; 2]> {
    match seed {
        Some(s) => Ok([s, 0x6b65_7261_735f_696e]),
        None => {
            // One integer from the stateful generator keeps `set_seed` reproducibility.
            let t = random::uniform(&[2], 0.0, i32::MAX as f64, DType::I64, None)?;
            let v = t.to_vec::<i64>()?;
            Ok([v[0] as u64, v[1] as u64])
        }
    }
}

impl Initializer {
    /// A tensor of `shape` drawn from this initializer.
    pub fn sample(&self, shape: &[usize], dtype: DType) -> Result<Tensor> {
        use Initializer::*;
        let fans = compute_fans(shape);
        let vs = |scale: f64, mode: FanMode, distribution: Distribution, seed| {
            VarianceScaling {
                scale,
                mode,
                distribution,
                seed,
            }
            .sample(shape, dtype)
        };
        match *self {
            Zeros => Tensor::zeros(shape, dtype),
            Ones => Tensor::ones(shape, dtype),
            Constant(v) => Tensor::fill(shape, v, dtype),
            RandomNormal { mean, stddev, seed } => {
                random::stateless_normal(shape, draw_seed(seed)?, mean, stddev, dtype)
            }
            RandomUniform {
                minval,
                maxval,
                seed,
            } => random::stateless_uniform(shape, draw_seed(seed)?, minval, maxval, dtype),
            TruncatedNormal { mean, stddev, seed } => {
                random::stateless_truncated_normal(shape, draw_seed(seed)?, mean, stddev, dtype)
            }
            VarianceScaling {
                scale,
                mode,
                distribution,
                seed,
            } => {
                let n = match mode {
                    FanMode::FanIn => fans.0,
                    FanMode::FanOut => fans.1,
                    FanMode::FanAvg => (fans.0 + fans.1) / 2.0,
                }
                .max(1.0);
                let var = scale / n;
                let seed = draw_seed(seed)?;
                match distribution {
                    // 0.879… is the stddev of a unit normal truncated at ±2.
                    Distribution::TruncatedNormal => random::stateless_truncated_normal(
                        shape,
                        seed,
                        0.0,
                        var.sqrt() / 0.879_625_661_034_239_8,
                        dtype,
                    ),
                    Distribution::UntruncatedNormal => {
                        random::stateless_normal(shape, seed, 0.0, var.sqrt(), dtype)
                    }
                    Distribution::Uniform => {
                        let limit = (3.0 * var).sqrt();
                        random::stateless_uniform(shape, seed, -limit, limit, dtype)
                    }
                }
            }
            GlorotUniform { seed } => vs(1.0, FanMode::FanAvg, Distribution::Uniform, seed),
            GlorotNormal { seed } => vs(1.0, FanMode::FanAvg, Distribution::TruncatedNormal, seed),
            HeNormal { seed } => vs(2.0, FanMode::FanIn, Distribution::TruncatedNormal, seed),
            HeUniform { seed } => vs(2.0, FanMode::FanIn, Distribution::Uniform, seed),
            LecunNormal { seed } => vs(1.0, FanMode::FanIn, Distribution::TruncatedNormal, seed),
            LecunUniform { seed } => vs(1.0, FanMode::FanIn, Distribution::Uniform, seed),
            Orthogonal { gain, seed } => orthogonal(shape, gain, seed, dtype),
            Identity { gain } => match *shape {
                [r, c] => {
                    let v: Vec<f64> = (0..r * c)
                        .map(|i| if i / c == i % c { gain } else { 0.0 })
                        .collect();
                    Tensor::from_vec(v, shape)?.cast(dtype)
                }
                _ => Err(Error::invalid(
                    "Identity initializer",
                    format!("needs a 2-D shape, got {shape:?}"),
                )),
            },
        }
    }

    /// The Keras name and config, as `get_config` writes them.
    pub fn to_config(&self) -> Value {
        use Initializer::*;
        let (class, config) = match *self {
            Zeros => ("Zeros", json!({})),
            Ones => ("Ones", json!({})),
            Constant(v) => ("Constant", json!({ "value": v })),
            RandomNormal { mean, stddev, seed } => (
                "RandomNormal",
                json!({"mean": mean, "stddev": stddev, "seed": seed}),
            ),
            RandomUniform {
                minval,
                maxval,
                seed,
            } => (
                "RandomUniform",
                json!({"minval": minval, "maxval": maxval, "seed": seed}),
            ),
            TruncatedNormal { mean, stddev, seed } => (
                "TruncatedNormal",
                json!({"mean": mean, "stddev": stddev, "seed": seed}),
            ),
            VarianceScaling {
                scale,
                mode,
                distribution,
                seed,
            } => (
                "VarianceScaling",
                json!({
                    "scale": scale,
                    "mode": match mode { FanMode::FanIn => "fan_in", FanMode::FanOut => "fan_out", FanMode::FanAvg => "fan_avg" },
                    "distribution": match distribution {
                        Distribution::TruncatedNormal => "truncated_normal",
                        Distribution::UntruncatedNormal => "untruncated_normal",
                        Distribution::Uniform => "uniform",
                    },
                    "seed": seed,
                }),
            ),
            GlorotUniform { seed } => ("GlorotUniform", json!({ "seed": seed })),
            GlorotNormal { seed } => ("GlorotNormal", json!({ "seed": seed })),
            HeNormal { seed } => ("HeNormal", json!({ "seed": seed })),
            HeUniform { seed } => ("HeUniform", json!({ "seed": seed })),
            LecunNormal { seed } => ("LecunNormal", json!({ "seed": seed })),
            LecunUniform { seed } => ("LecunUniform", json!({ "seed": seed })),
            Orthogonal { gain, seed } => ("Orthogonal", json!({"gain": gain, "seed": seed})),
            Identity { gain } => ("Identity", json!({ "gain": gain })),
        };
        json!({"class_name": class, "config": config})
    }

    /// Parses [`Initializer::to_config`]'s output, or a Keras string name (`"he_normal"`).
    pub fn from_config(v: &Value) -> Result<Initializer> {
        use Initializer::*;
        let bad = |msg: String| Error::format("initializer config", msg);
        if let Some(name) = v.as_str() {
            return Ok(match name {
                "zeros" => Zeros,
                "ones" => Ones,
                "glorot_uniform" => GlorotUniform { seed: None },
                "glorot_normal" => GlorotNormal { seed: None },
                "he_normal" => HeNormal { seed: None },
                "he_uniform" => HeUniform { seed: None },
                "lecun_normal" => LecunNormal { seed: None },
                "lecun_uniform" => LecunUniform { seed: None },
                "orthogonal" => Orthogonal {
                    gain: 1.0,
                    seed: None,
                },
                "identity" => Identity { gain: 1.0 },
                "random_normal" => RandomNormal {
                    mean: 0.0,
                    stddev: 0.05,
                    seed: None,
                },
                "random_uniform" => RandomUniform {
                    minval: -0.05,
                    maxval: 0.05,
                    seed: None,
                },
                "truncated_normal" => TruncatedNormal {
                    mean: 0.0,
                    stddev: 0.05,
                    seed: None,
                },
                other => return Err(bad(format!("unknown initializer {other:?}"))),
            });
        }
        let class = v["class_name"].as_str().ok_or_else(|| {
            bad(format!(
                "expected a name or {{class_name, config}}, got {v}"
            ))
        })?;
        let c = &v["config"];
        let f = |k: &str| -> Result<f64> {
            c[k].as_f64()
                .ok_or_else(|| bad(format!("{class}: missing number {k:?}")))
        };
        let seed = c["seed"].as_u64();
        Ok(match class {
            "Zeros" => Zeros,
            "Ones" => Ones,
            "Constant" => Constant(f("value")?),
            "RandomNormal" => RandomNormal {
                mean: f("mean")?,
                stddev: f("stddev")?,
                seed,
            },
            "RandomUniform" => RandomUniform {
                minval: f("minval")?,
                maxval: f("maxval")?,
                seed,
            },
            "TruncatedNormal" => TruncatedNormal {
                mean: f("mean")?,
                stddev: f("stddev")?,
                seed,
            },
            "VarianceScaling" => VarianceScaling {
                scale: f("scale")?,
                mode: match c["mode"].as_str() {
                    Some("fan_in") => FanMode::FanIn,
                    Some("fan_out") => FanMode::FanOut,
                    Some("fan_avg") => FanMode::FanAvg,
                    m => return Err(bad(format!("VarianceScaling: bad mode {m:?}"))),
                },
                distribution: match c["distribution"].as_str() {
                    Some("truncated_normal") => Distribution::TruncatedNormal,
                    Some("untruncated_normal") | Some("normal") => Distribution::UntruncatedNormal,
                    Some("uniform") => Distribution::Uniform,
                    d => return Err(bad(format!("VarianceScaling: bad distribution {d:?}"))),
                },
                seed,
            },
            "GlorotUniform" => GlorotUniform { seed },
            "GlorotNormal" => GlorotNormal { seed },
            "HeNormal" => HeNormal { seed },
            "HeUniform" => HeUniform { seed },
            "LecunNormal" => LecunNormal { seed },
            "LecunUniform" => LecunUniform { seed },
            "Orthogonal" => Orthogonal {
                gain: f("gain")?,
                seed,
            },
            "Identity" => Identity { gain: f("gain")? },
            other => return Err(bad(format!("unknown initializer class {other:?}"))),
        })
    }
}

/// TF's orthogonal initializer: flatten to (rows = product of all but the last, cols = last),
/// QR-decompose a normal matrix of the taller orientation, fix the signs by R's diagonal.
fn orthogonal(shape: &[usize], gain: f64, seed: Option<u64>, dtype: DType) -> Result<Tensor> {
    if shape.len() < 2 {
        return Err(Error::invalid(
            "Orthogonal initializer",
            format!("needs a shape of rank ≥ 2, got {shape:?}"),
        ));
    }
    let cols = shape[shape.len() - 1];
    let rows: usize = shape[..shape.len() - 1].iter().product();
    let (m, n) = (rows.max(cols), rows.min(cols));
    let a = random::stateless_normal(&[m, n], draw_seed(seed)?, 0.0, 1.0, DType::F64)?
        .to_vec::<f64>()?;
    // Modified Gram-Schmidt on the n columns of the m x n matrix `a` (row-major).
    let mut q = a;
    for j in 0..n {
        for k in 0..j {
            let dot: f64 = (0..m).map(|i| q[i * n + j] * q[i * n + k]).sum();
            for i in 0..m {
                q[i * n + j] -= dot * q[i * n + k];
            }
        }
        let norm = (0..m).map(|i| q[i * n + j].powi(2)).sum::<f64>().sqrt();
        // R's diagonal is positive under Gram-Schmidt: TF's sign fix is implied.
        for i in 0..m {
            q[i * n + j] /= norm.max(f64::MIN_POSITIVE);
        }
    }
    let out: Vec<f64> = if rows >= cols {
        q.iter().map(|x| x * gain).collect()
    } else {
        // Transpose the m x n (cols x rows) result into rows x cols.
        (0..rows * cols)
            .map(|idx| q[(idx % cols) * n + idx / cols] * gain)
            .collect()
    };
    Tensor::from_vec(out, &[rows, cols])?
        .reshape_to(shape)?
        .cast(dtype)
}
