//! Fused optimizer updates: one pass reading w, g, m, v and writing w', m', v'.

use crate::buffer::{dense, host};
use ferroflow_tensor::{backend::unsupported, AdamStep, HostData, Operand, Result};
use rayon::prelude::*;

fn adam_typed<T: num_traits::Float + Send + Sync>(
    w: &[T],
    g: &[T],
    m: &[T],
    v: &[T],
    s: &AdamStep,
) -> (Vec<T>, Vec<T>, Vec<T>) {
    let c = |x: f64| T::from(x).unwrap_or(T::zero());
    let (b1, b2, lr_t, eps, decay) = (
        c(s.beta_1),
        c(s.beta_2),
        c(s.lr_t),
        c(s.epsilon),
        c(s.decay),
    );
    let (one_b1, one_b2) = (T::one() - b1, T::one() - b2);
    let n = w.len();
    let (mut w2, mut m2, mut v2) = (vec![T::zero(); n], vec![T::zero(); n], vec![T::zero(); n]);
    const CHUNK: usize = 1 << 15;
    w2.par_chunks_mut(CHUNK)
        .zip(m2.par_chunks_mut(CHUNK))
        .zip(v2.par_chunks_mut(CHUNK))
        .enumerate()
        .for_each(|(ci, ((wo, mo), vo))| {
            let base = ci * CHUNK;
            for j in 0..wo.len() {
                let i = base + j;
                let gi = g[i];
                let mi = b1 * m[i] + one_b1 * gi;
                let vi = b2 * v[i] + one_b2 * gi * gi;
                mo[j] = mi;
                vo[j] = vi;
                wo[j] = w[i] - decay * w[i] - lr_t * mi / (vi.sqrt() + eps);
            }
        });
    (w2, m2, v2)
}

pub(crate) fn adam_update(
    w: Operand<'_>,
    g: Operand<'_>,
    m: Operand<'_>,
    v: Operand<'_>,
    s: &AdamStep,
) -> Result<(HostData, HostData, HostData)> {
    macro_rules! go {
        ($variant:ident) => {{
            let (
                HostData::$variant(a),
                HostData::$variant(b),
                HostData::$variant(c),
                HostData::$variant(d),
            ) = (host(&w)?, host(&g)?, host(&m)?, host(&v)?)
            else {
                return Err(unsupported("cpu", "adam_update", w.dtype));
            };
            let (x, y, z) = adam_typed(
                &dense(a, w.layout),
                &dense(b, g.layout),
                &dense(c, m.layout),
                &dense(d, v.layout),
                s,
            );
            Ok((
                HostData::$variant(x),
                HostData::$variant(y),
                HostData::$variant(z),
            ))
        }};
    }
    match w.dtype {
        ferroflow_tensor::DType::F32 => go!(F32),
        ferroflow_tensor::DType::F64 => go!(F64),
        d => Err(unsupported("cpu", "adam_update", d)),
    }
}
