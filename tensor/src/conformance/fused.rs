//! Fused optimizer kernels against their formulas (a backend without one must say so).

use super::harness::*;
use super::reference::RefArray;
use crate::{AdamStep, DType, Device, Error, Tensor};
use proptest::prelude::*;

/// `adam_update` on random same-shaped w, g, m, v (v ≥ 0) in f32 and f64.
pub fn adam_update(device: &Device) {
    let strat = array(3, 5, -2.0, 2.0).prop_flat_map(|w| {
        let n = w.data.len();
        (
            Just(w),
            prop::collection::vec(-2.0..2.0f64, n),
            prop::collection::vec(-1.0..1.0f64, n),
            prop::collection::vec(0.0..1.0f64, n),
            any::<bool>(),
            0.0..0.01f64,
        )
    });
    check("adam_update", strat, |(w, g, m, v, f64_, decay)| {
        let dtype = if f64_ { DType::F64 } else { DType::F32 };
        let q = |d: &[f64]| RefArray::new(&w.shape, quantize(dtype, d));
        let (w, g, m, v) = (q(&w.data), q(&g), q(&m), q(&v));
        let step = AdamStep {
            lr_t: 0.01,
            beta_1: 0.9,
            beta_2: 0.999,
            epsilon: 1e-7,
            decay,
        };
        let t = |a: &RefArray| make_tensor(device, dtype, a, ViewKind::Contiguous);
        let (tw, tg, tm, tv) = (
            ok("w", t(&w))?,
            ok("g", t(&g))?,
            ok("m", t(&m))?,
            ok("v", t(&v))?,
        );
        let (w2, m2, v2) = match Tensor::adam_update(&tw, &tg, &tm, &tv, &step) {
            Err(Error::NotSupportedByBackend { .. }) => return Ok(()),
            r => ok("adam_update", r)?,
        };
        let n = w.data.len();
        let mut want = (vec![0.0; n], vec![0.0; n], vec![0.0; n]);
        for i in 0..n {
            let mi = 0.9 * m.data[i] + 0.1 * g.data[i];
            let vi = 0.999 * v.data[i] + 0.001 * g.data[i] * g.data[i];
            want.1[i] = mi;
            want.2[i] = vi;
            want.0[i] = w.data[i] - decay * w.data[i] - 0.01 * mi / (vi.sqrt() + 1e-7);
        }
        // m/(√v + ε) amplifies rounding where v is tiny: compare with an f32-sized slack.
        assert_close(
            "adam_update m",
            &m2,
            &RefArray::new(&w.shape, quantize(dtype, &want.1)),
            4.0,
            4.0 * epsilon(dtype),
        )?;
        assert_close(
            "adam_update v",
            &v2,
            &RefArray::new(&w.shape, quantize(dtype, &want.2)),
            4.0,
            4.0 * epsilon(dtype),
        )?;
        assert_close(
            "adam_update w",
            &w2,
            &RefArray::new(&w.shape, quantize(dtype, &want.0)),
            64.0,
            0.01 * 64.0 * epsilon(dtype) * 1e4,
        )
    });
}
