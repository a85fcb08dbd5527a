//! The fused optimizer update: one pass reading w, g and the slots, writing w' and slots'.

use crate::buffer::{dense, host};
use ferroflow_tensor::{
    backend::unsupported, DType, Element, HostData, Operand, Result, UpdateRule,
};

/// Elements per chunk claimed by a thread (w, g and two slots: 256 KB of f32 read).
const CHUNK: usize = 1 << 14;

/// One element's update over slices of a chunk: `f(w, g, slots) -> (w', slots')`.
#[inline(always)]
fn update_loop<T: Copy, const S: usize, F: Fn(T, T, [T; S]) -> (T, [T; S])>(
    w: &[T],
    g: &[T],
    slots: [&[T]; S],
    out_w: *mut T,
    out_slots: [*mut T; S],
    f: &F,
) {
    let n = w.len();
    let g = &g[..n];
    let slots = slots.map(|s| &s[..n]);
    for i in 0..n {
        let (nw, ns) = f(w[i], g[i], std::array::from_fn(|j| slots[j][i]));
        // SAFETY: the caller's outputs hold n elements.
        unsafe {
            out_w.add(i).write(nw);
            for j in 0..S {
                out_slots[j].add(i).write(ns[j]);
            }
        }
    }
}

#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx512f,avx512vl,avx512dq,avx2,fma")]
unsafe fn update_loop_avx512<T: Copy, const S: usize, F: Fn(T, T, [T; S]) -> (T, [T; S])>(
    w: &[T],
    g: &[T],
    slots: [&[T]; S],
    out_w: *mut T,
    out_slots: [*mut T; S],
    f: &F,
) {
    update_loop(w, g, slots, out_w, out_slots, f)
}

#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn update_loop_avx2<T: Copy, const S: usize, F: Fn(T, T, [T; S]) -> (T, [T; S])>(
    w: &[T],
    g: &[T],
    slots: [&[T]; S],
    out_w: *mut T,
    out_slots: [*mut T; S],
    f: &F,
) {
    update_loop(w, g, slots, out_w, out_slots, f)
}

/// `f(w, g, slots) -> (w', slots')` over every element into new buffers: vectorised
/// (compiled for AVX-512 and AVX2 besides the baseline), outputs never zeroed first, and
/// chunks shared with the pool without waiting for a sleeping worker.
fn run<T, const S: usize, F>(w: &[T], g: &[T], slots: [&[T]; S], f: F) -> (Vec<T>, Vec<Vec<T>>)
where
    T: Copy + Send + Sync,
    F: Fn(T, T, [T; S]) -> (T, [T; S]) + Sync,
{
    let n = w.len();
    assert!(g.len() == n && slots.iter().all(|s| s.len() == n));
    let mut nw: Vec<T> = crate::block_cache::with_capacity(n);
    let mut ns: [Vec<T>; S] = std::array::from_fn(|_| crate::block_cache::with_capacity(n));
    let out_w = crate::simd::SharedMut(nw.as_mut_ptr());
    let out_s = ns
        .each_mut()
        .map(|v| crate::simd::SharedMut(v.as_mut_ptr()));
    let chunk = |c: usize| {
        let r = c * CHUNK..((c + 1) * CHUNK).min(n);
        let o = r.start;
        let args = (
            &w[r.clone()],
            &g[r.clone()],
            slots.map(|s| &s[r.clone()]),
            // SAFETY: r lies within the n-element buffers; chunks are disjoint.
            unsafe { out_w.get().add(o) },
            out_s.each_ref().map(|p| unsafe { p.get().add(o) }),
        );
        #[cfg(target_arch = "x86_64")]
        if crate::simd::has_avx512() {
            // SAFETY: the CPU supports the features the function was compiled for.
            return unsafe { update_loop_avx512(args.0, args.1, args.2, args.3, args.4, &f) };
        }
        #[cfg(target_arch = "x86_64")]
        if crate::simd::has_avx2() {
            // SAFETY: as above.
            return unsafe { update_loop_avx2(args.0, args.1, args.2, args.3, args.4, &f) };
        }
        update_loop(args.0, args.1, args.2, args.3, args.4, &f)
    };
    let chunks = n.div_ceil(CHUNK);
    if n < crate::simd::PAR_THRESHOLD {
        (0..chunks).for_each(chunk);
    } else {
        crate::simd::for_each_chunk_shared(chunks, chunk);
    }
    // SAFETY: every chunk wrote its range of every output, and the chunks cover 0..n.
    unsafe {
        nw.set_len(n);
        for v in ns.iter_mut() {
            v.set_len(n);
        }
    }
    (nw, ns.into_iter().collect())
}

fn update_typed<T: num_traits::Float + Default + Send + Sync>(
    rule: &UpdateRule,
    w: &[T],
    g: &[T],
    s: &[&[T]],
) -> (Vec<T>, Vec<Vec<T>>) {
    let c = |x: f64| T::from(x).unwrap_or(T::zero());
    let one = T::one();
    // Each rule is evaluated as TensorFlow's kernel (or TF 2.4's Python update) evaluates it,
    // operation by operation, so float32 results match TF's to the last bits.
    match *rule {
        UpdateRule::SgdMomentum {
            lr,
            momentum,
            nesterov,
        } => {
            let (lr, m) = (c(lr), c(momentum));
            run(w, g, [s[0]], |w, g, [a]| {
                let a = a * m - g * lr;
                let w = if nesterov {
                    w + (a * m - g * lr)
                } else {
                    w + a
                };
                (w, [a])
            })
        }
        UpdateRule::Adam {
            lr_t,
            beta_1,
            beta_2,
            epsilon,
            decay,
        } => {
            let (alpha, b1, b2, eps, decay) = (c(lr_t), c(beta_1), c(beta_2), c(epsilon), c(decay));
            let (one_minus_b1, one_minus_b2) = (one - b1, one - b2);
            run(w, g, [s[0], s[1]], |w, g, [m, v]| {
                let m = m + (g - m) * one_minus_b1;
                let v = v + (g * g - v) * one_minus_b2;
                ((w - decay * w) - (m * alpha) / (v.sqrt() + eps), [m, v])
            })
        }
        UpdateRule::RmsProp {
            lr,
            rho,
            epsilon,
            centered: false,
        } => {
            let (lr, rho, eps) = (c(lr), c(rho), c(epsilon));
            let one_minus_rho = one - rho;
            run(w, g, [s[0]], |w, g, [ms]| {
                let ms = rho * ms + one_minus_rho * (g * g);
                (w - (lr * g) / (ms.sqrt() + eps), [ms])
            })
        }
        UpdateRule::RmsProp {
            lr,
            rho,
            epsilon,
            centered: true,
        } => {
            let (lr, rho, eps) = (c(lr), c(rho), c(epsilon));
            let one_minus_rho = one - rho;
            run(w, g, [s[0], s[1]], |w, g, [ms, mg]| {
                let ms = rho * ms + one_minus_rho * (g * g);
                let mg = rho * mg + one_minus_rho * g;
                (w - (lr * g) / ((ms - mg * mg).sqrt() + eps), [ms, mg])
            })
        }
        UpdateRule::Adagrad { lr, epsilon } => {
            let (lr, eps) = (c(lr), c(epsilon));
            run(w, g, [s[0]], |w, g, [acc]| {
                let acc = acc + g * g;
                (w - (g * lr) / (acc.sqrt() + eps), [acc])
            })
        }
        UpdateRule::Adadelta { lr, rho, epsilon } => {
            let (lr, rho, eps) = (c(lr), c(rho), c(epsilon));
            let one_minus_rho = one - rho;
            run(w, g, [s[0], s[1]], |w, g, [acc, acc_u]| {
                let acc = acc * rho + (g * g) * one_minus_rho;
                let u = (acc_u + eps).sqrt() * (one / (acc + eps).sqrt()) * g;
                let acc_u = acc_u * rho + (u * u) * one_minus_rho;
                (w - u * lr, [acc, acc_u])
            })
        }
        UpdateRule::Adamax {
            lr_t,
            beta_1,
            beta_2,
            epsilon,
        } => {
            let (lr_t, b1, b2, eps) = (c(lr_t), c(beta_1), c(beta_2), c(epsilon));
            let one_minus_b1 = one - b1;
            run(w, g, [s[0], s[1]], |w, g, [m, u]| {
                let m = m + (g - m) * one_minus_b1;
                let u = (b2 * u).max(g.abs());
                (w - lr_t * (m / (u + eps)), [m, u])
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
