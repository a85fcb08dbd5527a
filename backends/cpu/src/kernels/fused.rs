//! The fused optimizer update: one pass reading w, g and the slots, writing w' and slots'.

use crate::buffer::{dense, host};
use ferroflow_tensor::{
    backend::unsupported, DType, Element, HostData, Operand, Result, UpdateRule,
};
use rayon::prelude::*;

const CHUNK: usize = 1 << 14;

/// `step(w, g, &mut s0) -> w'` over every element, threaded: w' and s0' in one pass.
fn run1<T, F>(w: &[T], g: &[T], s0: &[T], step: F) -> (Vec<T>, Vec<Vec<T>>)
where
    T: Copy + Default + Send + Sync,
    F: Fn(T, T, &mut T) -> T + Sync,
{
    let n = w.len();
    let (mut w2, mut a2) = (vec![T::default(); n], vec![T::default(); n]);
    w2.par_chunks_mut(CHUNK)
        .zip(a2.par_chunks_mut(CHUNK))
        .enumerate()
        .for_each(|(c, (wo, ao))| {
            let r = c * CHUNK..c * CHUNK + wo.len();
            for ((((wo, ao), &wv), &gv), &av) in wo
                .iter_mut()
                .zip(ao.iter_mut())
                .zip(&w[r.clone()])
                .zip(&g[r.clone()])
                .zip(&s0[r])
            {
                let mut a = av;
                *wo = step(wv, gv, &mut a);
                *ao = a;
            }
        });
    (w2, vec![a2])
}

/// `step(w, g, &mut s0, &mut s1) -> w'` over every element, threaded.
fn run2<T, F>(w: &[T], g: &[T], s0: &[T], s1: &[T], step: F) -> (Vec<T>, Vec<Vec<T>>)
where
    T: Copy + Default + Send + Sync,
    F: Fn(T, T, &mut T, &mut T) -> T + Sync,
{
    let n = w.len();
    let (mut w2, mut a2, mut b2) = (
        vec![T::default(); n],
        vec![T::default(); n],
        vec![T::default(); n],
    );
    w2.par_chunks_mut(CHUNK)
        .zip(a2.par_chunks_mut(CHUNK).zip(b2.par_chunks_mut(CHUNK)))
        .enumerate()
        .for_each(|(c, (wo, (ao, bo)))| {
            let r = c * CHUNK..c * CHUNK + wo.len();
            let inputs = w[r.clone()]
                .iter()
                .zip(&g[r.clone()])
                .zip(s0[r.clone()].iter().zip(&s1[r]));
            for (((wo, ao), bo), ((&wv, &gv), (&av, &bv))) in wo
                .iter_mut()
                .zip(ao.iter_mut())
                .zip(bo.iter_mut())
                .zip(inputs)
            {
                let (mut a, mut b) = (av, bv);
                *wo = step(wv, gv, &mut a, &mut b);
                *ao = a;
                *bo = b;
            }
        });
    (w2, vec![a2, b2])
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
            run1(w, g, s[0], |w, g, s0: &mut T| {
                *s0 = m * *s0 - lr * g;
                if nesterov {
                    w + m * *s0 - lr * g
                } else {
                    w + *s0
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
            run2(w, g, s[0], s[1], |w, g, s0: &mut T, s1: &mut T| {
                *s0 = b1 * *s0 + (one - b1) * g;
                *s1 = b2 * *s1 + (one - b2) * g * g;
                w - decay * w - lr_t * *s0 / (s1.sqrt() + eps)
            })
        }
        UpdateRule::RmsProp {
            lr,
            rho,
            epsilon,
            centered: false,
        } => {
            let (lr, rho, eps) = (c(lr), c(rho), c(epsilon));
            run1(w, g, s[0], |w, g, s0: &mut T| {
                *s0 = rho * *s0 + (one - rho) * g * g;
                w - lr * g / (*s0 + eps).sqrt()
            })
        }
        UpdateRule::RmsProp {
            lr,
            rho,
            epsilon,
            centered: true,
        } => {
            let (lr, rho, eps) = (c(lr), c(rho), c(epsilon));
            run2(w, g, s[0], s[1], |w, g, s0: &mut T, s1: &mut T| {
                *s0 = rho * *s0 + (one - rho) * g * g;
                *s1 = rho * *s1 + (one - rho) * g;
                w - lr * g / (*s0 - *s1 * *s1 + eps).sqrt()
            })
        }
        UpdateRule::Adagrad { lr, epsilon } => {
            let (lr, eps) = (c(lr), c(epsilon));
            run1(w, g, s[0], |w, g, s0: &mut T| {
                *s0 = *s0 + g * g;
                w - lr * g / (s0.sqrt() + eps)
            })
        }
        UpdateRule::Adadelta { lr, rho, epsilon } => {
            let (lr, rho, eps) = (c(lr), c(rho), c(epsilon));
            run2(w, g, s[0], s[1], |w, g, s0: &mut T, s1: &mut T| {
                *s0 = rho * *s0 + (one - rho) * g * g;
                let u = (*s1 + eps).sqrt() / (*s0 + eps).sqrt() * g;
                *s1 = rho * *s1 + (one - rho) * u * u;
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
            run2(w, g, s[0], s[1], |w, g, s0: &mut T, s1: &mut T| {
                *s0 = b1 * *s0 + (one - b1) * g;
                *s1 = (b2 * *s1).max(g.abs());
                w - lr_t * *s0 / (*s1 + eps)
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
