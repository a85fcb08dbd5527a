//! The fused optimizer update: one pass reading w, g and the slots, writing w' and slots'.

use crate::buffer::{dense, host};
use ferroflow_tensor::{
    backend::unsupported, DType, Element, HostData, Operand, Result, UpdateRule,
};
use rayon::prelude::*;

/// One parallel task's share: its start index, its part of w', its parts of each slot'.
type Chunk<'a, T> = (usize, &'a mut [T], Vec<&'a mut [T]>);

/// Runs `step(w, g, slots) -> w'` (updating `slots` in place) over every element, threaded.
fn run<T, const S: usize, F>(w: &[T], g: &[T], slots: &[&[T]; S], step: F) -> (Vec<T>, Vec<Vec<T>>)
where
    T: Copy + Default + Send + Sync,
    F: Fn(T, T, &mut [T; S]) -> T + Sync,
{
    let n = w.len();
    let mut w2 = vec![T::default(); n];
    let mut s2: Vec<Vec<T>> = (0..S).map(|_| vec![T::default(); n]).collect();
    const CHUNK: usize = 1 << 14;
    let mut outs: Vec<Chunk<'_, T>> = {
        let mut slot_chunks: Vec<_> = s2.iter_mut().map(|v| v.chunks_mut(CHUNK)).collect();
        w2.chunks_mut(CHUNK)
            .enumerate()
            .map(|(i, wc)| {
                (
                    i * CHUNK,
                    wc,
                    slot_chunks
                        .iter_mut()
                        .map(|it| it.next().unwrap_or_default())
                        .collect(),
                )
            })
            .collect()
    };
    outs.par_iter_mut().for_each(|(base, wc, sc)| {
        for j in 0..wc.len() {
            let i = *base + j;
            let mut s = [T::default(); S];
            for k in 0..S {
                s[k] = slots[k][i];
            }
            wc[j] = step(w[i], g[i], &mut s);
            for k in 0..S {
                sc[k][j] = s[k];
            }
        }
    });
    drop(outs);
    (w2, s2)
}

fn update_typed<T: num_traits::Float + Default + Send + Sync>(
    rule: &UpdateRule,
    w: &[T],
    g: &[T],
    s: &[&[T]],
) -> (Vec<T>, Vec<Vec<T>>) {
    let c = |x: f64| T::from(x).unwrap_or(T::zero());
    let one = T::one();
    match *rule {
        UpdateRule::SgdMomentum {
            lr,
            momentum,
            nesterov,
        } => {
            let (lr, m) = (c(lr), c(momentum));
            run(w, g, &[s[0]], |w, g, st: &mut [T; 1]| {
                st[0] = m * st[0] - lr * g;
                if nesterov {
                    w + m * st[0] - lr * g
                } else {
                    w + st[0]
                }
            })
        }
        UpdateRule::Adam {
            lr_t,
            beta_1,
            beta_2,
            epsilon,
            decay,
        } => {
            let (lr_t, b1, b2, eps, decay) = (c(lr_t), c(beta_1), c(beta_2), c(epsilon), c(decay));
            run(w, g, &[s[0], s[1]], |w, g, st: &mut [T; 2]| {
                st[0] = b1 * st[0] + (one - b1) * g;
                st[1] = b2 * st[1] + (one - b2) * g * g;
                w - decay * w - lr_t * st[0] / (st[1].sqrt() + eps)
            })
        }
        UpdateRule::RmsProp {
            lr,
            rho,
            epsilon,
            centered: false,
        } => {
            let (lr, rho, eps) = (c(lr), c(rho), c(epsilon));
            run(w, g, &[s[0]], |w, g, st: &mut [T; 1]| {
                st[0] = rho * st[0] + (one - rho) * g * g;
                w - lr * g / (st[0] + eps).sqrt()
            })
        }
        UpdateRule::RmsProp {
            lr,
            rho,
            epsilon,
            centered: true,
        } => {
            let (lr, rho, eps) = (c(lr), c(rho), c(epsilon));
            run(w, g, &[s[0], s[1]], |w, g, st: &mut [T; 2]| {
                st[0] = rho * st[0] + (one - rho) * g * g;
                st[1] = rho * st[1] + (one - rho) * g;
                w - lr * g / (st[0] - st[1] * st[1] + eps).sqrt()
            })
        }
        UpdateRule::Adagrad { lr, epsilon } => {
            let (lr, eps) = (c(lr), c(epsilon));
            run(w, g, &[s[0]], |w, g, st: &mut [T; 1]| {
                st[0] = st[0] + g * g;
                w - lr * g / (st[0].sqrt() + eps)
            })
        }
        UpdateRule::Adadelta { lr, rho, epsilon } => {
            let (lr, rho, eps) = (c(lr), c(rho), c(epsilon));
            run(w, g, &[s[0], s[1]], |w, g, st: &mut [T; 2]| {
                st[0] = rho * st[0] + (one - rho) * g * g;
                let u = (st[1] + eps).sqrt() / (st[0] + eps).sqrt() * g;
                st[1] = rho * st[1] + (one - rho) * u * u;
                w - lr * u
            })
        }
        UpdateRule::Adamax {
            lr_t,
            beta_1,
            beta_2,
            epsilon,
        } => {
            let (lr_t, b1, b2, eps) = (c(lr_t), c(beta_1), c(beta_2), c(epsilon));
            run(w, g, &[s[0], s[1]], |w, g, st: &mut [T; 2]| {
                st[0] = b1 * st[0] + (one - b1) * g;
                st[1] = (b2 * st[1]).max(g.abs());
                w - lr_t * st[0] / (st[1] + eps)
            })
        }
    }
}

fn typed<'a, T: Element>(x: &Operand<'a>) -> Result<std::borrow::Cow<'a, [T]>> {
    let d = host(x)?;
    let v = T::slice_of(d).ok_or_else(|| unsupported("cpu", "optimizer_update", x.dtype))?;
    Ok(dense(v, x.layout))
}

fn go<T: Element + num_traits::Float + Default + Send + Sync>(
    rule: &UpdateRule,
    w: Operand<'_>,
    g: Operand<'_>,
    slots: &[Operand<'_>],
) -> Result<(HostData, Vec<HostData>)> {
    let (wv, gv) = (typed::<T>(&w)?, typed::<T>(&g)?);
    let sv = slots.iter().map(typed::<T>).collect::<Result<Vec<_>>>()?;
    let refs: Vec<&[T]> = sv.iter().map(|c| c.as_ref()).collect();
    let (nw, ns) = update_typed(rule, &wv, &gv, &refs);
    Ok((T::into_host(nw), ns.into_iter().map(T::into_host).collect()))
}

pub(crate) fn optimizer_update(
    rule: &UpdateRule,
    w: Operand<'_>,
    g: Operand<'_>,
    slots: &[Operand<'_>],
) -> Result<(HostData, Vec<HostData>)> {
    match w.dtype {
        DType::F32 => go::<f32>(rule, w, g, slots),
        DType::F64 => go::<f64>(rule, w, g, slots),
        d => Err(unsupported("cpu", "optimizer_update", d)),
    }
}
