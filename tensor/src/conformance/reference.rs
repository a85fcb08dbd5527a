//! Plain f64 reference implementations: the ground truth every backend is checked against.
//! Written for clarity, not speed: index arithmetic on row-major `Vec<f64>`s.

/// A dense row-major f64 array.
#[derive(Debug, Clone, PartialEq)]
pub struct RefArray {
    /// The shape.
    pub shape: Vec<usize>,
    /// The elements, row-major.
    pub data: Vec<f64>,
}

fn strides(shape: &[usize]) -> Vec<usize> {
    let mut s = vec![1; shape.len()];
    for i in (0..shape.len().saturating_sub(1)).rev() {
        s[i] = s[i + 1] * shape[i + 1];
    }
    s
}

/// Multi-index of flat position `i` in `shape`.
pub fn unravel(mut i: usize, shape: &[usize]) -> Vec<usize> {
    let mut idx = vec![0; shape.len()];
    for a in (0..shape.len()).rev() {
        if shape[a] > 0 {
            idx[a] = i % shape[a];
            i /= shape[a];
        }
    }
    idx
}

impl RefArray {
    /// A new array (panics when the data does not fill the shape: a bug in the test).
    pub fn new(shape: &[usize], data: Vec<f64>) -> RefArray {
        assert_eq!(
            shape.iter().product::<usize>(),
            data.len(),
            "reference: data does not fill {shape:?}"
        );
        RefArray {
            shape: shape.to_vec(),
            data,
        }
    }
    /// Element at a multi-index.
    pub fn at(&self, idx: &[usize]) -> f64 {
        let s = strides(&self.shape);
        self.data[idx.iter().zip(&s).map(|(i, s)| i * s).sum::<usize>()]
    }
    /// Elementwise map.
    pub fn map(&self, f: impl Fn(f64) -> f64) -> RefArray {
        RefArray {
            shape: self.shape.clone(),
            data: self.data.iter().map(|&x| f(x)).collect(),
        }
    }
    /// NumPy-broadcast binary op.
    pub fn zip(&self, o: &RefArray, f: impl Fn(f64, f64) -> f64) -> RefArray {
        let rank = self.shape.len().max(o.shape.len());
        let pad = |s: &[usize]| {
            let mut v = vec![1; rank - s.len()];
            v.extend_from_slice(s);
            v
        };
        let (sa, sb) = (pad(&self.shape), pad(&o.shape));
        let shape: Vec<usize> = sa
            .iter()
            .zip(&sb)
            .map(|(&a, &b)| if a == 1 { b } else { a })
            .collect();
        let (pa, pb) = (
            RefArray {
                shape: sa.clone(),
                data: self.data.clone(),
            },
            RefArray {
                shape: sb.clone(),
                data: o.data.clone(),
            },
        );
        let n = shape.iter().product();
        let data = (0..n)
            .map(|i| {
                let idx = unravel(i, &shape);
                let ia: Vec<usize> = idx
                    .iter()
                    .zip(&sa)
                    .map(|(&i, &d)| if d == 1 { 0 } else { i })
                    .collect();
                let ib: Vec<usize> = idx
                    .iter()
                    .zip(&sb)
                    .map(|(&i, &d)| if d == 1 { 0 } else { i })
                    .collect();
                f(pa.at(&ia), pb.at(&ib))
            })
            .collect();
        RefArray { shape, data }
    }
    /// Reduction over sorted `axes` (keepdims false) with `init` and `f`.
    pub fn reduce(&self, axes: &[usize], init: f64, f: impl Fn(f64, f64) -> f64) -> RefArray {
        let out_shape: Vec<usize> = (0..self.shape.len())
            .filter(|a| !axes.contains(a))
            .map(|a| self.shape[a])
            .collect();
        let mut out = vec![init; out_shape.iter().product()];
        for i in 0..self.data.len() {
            let idx = unravel(i, &self.shape);
            let kept: Vec<usize> = (0..idx.len())
                .filter(|a| !axes.contains(a))
                .map(|a| idx[a])
                .collect();
            let o: usize = kept
                .iter()
                .zip(strides(&out_shape))
                .map(|(i, s)| i * s)
                .sum();
            out[o] = f(out[o], self.data[i]);
        }
        RefArray {
            shape: out_shape,
            data: out,
        }
    }
    /// Index of the first max (or min) along `axis`; NaN wins.
    pub fn arg(&self, axis: usize, max: bool) -> RefArray {
        let out_shape: Vec<usize> = (0..self.shape.len())
            .filter(|&a| a != axis)
            .map(|a| self.shape[a])
            .collect();
        let n: usize = out_shape.iter().product();
        let data = (0..n)
            .map(|o| {
                let oi = unravel(o, &out_shape);
                let mut best = 0;
                for j in 0..self.shape[axis] {
                    let mut idx = oi.clone();
                    idx.insert(axis, j);
                    let mut bidx = oi.clone();
                    bidx.insert(axis, best);
                    let (v, b) = (self.at(&idx), self.at(&bidx));
                    if b.is_nan() {
                        break;
                    }
                    if v.is_nan() || (max && v > b) || (!max && v < b) {
                        best = j;
                    }
                }
                best as f64
            })
            .collect();
        RefArray {
            shape: out_shape,
            data,
        }
    }
    /// Batched matmul `[..b, m, k] x [..b, k, n]` with broadcast batch axes.
    pub fn matmul(&self, o: &RefArray) -> RefArray {
        let (ra, rb) = (self.shape.len(), o.shape.len());
        let (m, k, n) = (self.shape[ra - 2], self.shape[ra - 1], o.shape[rb - 1]);
        let ba = RefArray {
            shape: self.shape[..ra - 2].to_vec(),
            data: vec![0.0; self.shape[..ra - 2].iter().product()],
        };
        let bb = RefArray {
            shape: o.shape[..rb - 2].to_vec(),
            data: vec![0.0; o.shape[..rb - 2].iter().product()],
        };
        let batch = ba.zip(&bb, |_, _| 0.0).shape;
        let nb: usize = batch.iter().product();
        let mut data = Vec::with_capacity(nb * m * n);
        for b in 0..nb {
            let bi = unravel(b, &batch);
            let pick = |s: &[usize]| -> Vec<usize> {
                let off = batch.len() - s.len();
                s.iter()
                    .enumerate()
                    .map(|(i, &d)| if d == 1 { 0 } else { bi[off + i] })
                    .collect()
            };
            let (pa, pb) = (pick(&self.shape[..ra - 2]), pick(&o.shape[..rb - 2]));
            for i in 0..m {
                for j in 0..n {
                    let mut acc = 0.0;
                    for p in 0..k {
                        let mut ia = pa.clone();
                        ia.extend([i, p]);
                        let mut ib = pb.clone();
                        ib.extend([p, j]);
                        acc += self.at(&ia) * o.at(&ib);
                    }
                    data.push(acc);
                }
            }
        }
        let mut shape = batch;
        shape.extend([m, n]);
        RefArray { shape, data }
    }
    /// Axis permutation.
    pub fn transpose(&self, perm: &[usize]) -> RefArray {
        let shape: Vec<usize> = perm.iter().map(|&p| self.shape[p]).collect();
        let n = self.data.len();
        let data = (0..n)
            .map(|i| {
                let idx = unravel(i, &shape);
                let mut src = vec![0; perm.len()];
                for (a, &p) in perm.iter().enumerate() {
                    src[p] = idx[a];
                }
                self.at(&src)
            })
            .collect();
        RefArray { shape, data }
    }
}

/// TF conv2d on NHWC x HWIO with explicit geometry.
#[allow(clippy::too_many_arguments)]
pub fn conv2d(
    x: &RefArray,
    f: &RefArray,
    strides: [usize; 2],
    dil: [usize; 2],
    pad: [usize; 2],
    out_hw: [usize; 2],
) -> RefArray {
    let [n, h, w, cin] = [x.shape[0], x.shape[1], x.shape[2], x.shape[3]];
    let [kh, kw, _, cout] = [f.shape[0], f.shape[1], f.shape[2], f.shape[3]];
    let mut out = vec![0.0; n * out_hw[0] * out_hw[1] * cout];
    for b in 0..n {
        for oy in 0..out_hw[0] {
            for ox in 0..out_hw[1] {
                for co in 0..cout {
                    let mut acc = 0.0;
                    for ky in 0..kh {
                        for kx in 0..kw {
                            let Some((iy, ix)) =
                                window_tap([oy, ox], [ky, kx], strides, dil, pad, [h, w])
                            else {
                                continue;
                            };
                            for ci in 0..cin {
                                acc += x.at(&[b, iy, ix, ci]) * f.at(&[ky, kx, ci, co]);
                            }
                        }
                    }
                    out[((b * out_hw[0] + oy) * out_hw[1] + ox) * cout + co] = acc;
                }
            }
        }
    }
    RefArray::new(&[n, out_hw[0], out_hw[1], cout], out)
}

/// The input position `(iy, ix)` that output `o` of a window op (convolution, pooling)
/// reads at tap `t`, or `None` in the padding.
pub fn window_tap(
    o: [usize; 2],
    t: [usize; 2],
    strides: [usize; 2],
    dil: [usize; 2],
    pad: [usize; 2],
    hw: [usize; 2],
) -> Option<(usize, usize)> {
    let at = |a: usize| {
        (o[a] * strides[a] + t[a] * dil[a])
            .checked_sub(pad[a])
            .filter(|&i| i < hw[a])
    };
    Some((at(0)?, at(1)?))
}

/// The gradients of [`conv2d`] for an output gradient `dy`: `(dx, dfilter)`, summed tap by
/// tap from the definition.
pub fn conv2d_backprop(
    x: &RefArray,
    f: &RefArray,
    dy: &RefArray,
    strides: [usize; 2],
    dil: [usize; 2],
    pad: [usize; 2],
) -> (RefArray, RefArray) {
    let [n, h, w, cin] = [x.shape[0], x.shape[1], x.shape[2], x.shape[3]];
    let [kh, kw, _, cout] = [f.shape[0], f.shape[1], f.shape[2], f.shape[3]];
    let [oh, ow] = [dy.shape[1], dy.shape[2]];
    let mut dx = vec![0.0; x.data.len()];
    let mut df = vec![0.0; f.data.len()];
    for b in 0..n {
        for oy in 0..oh {
            for ox in 0..ow {
                for ky in 0..kh {
                    for kx in 0..kw {
                        let Some((iy, ix)) =
                            window_tap([oy, ox], [ky, kx], strides, dil, pad, [h, w])
                        else {
                            continue;
                        };
                        let xi = ((b * h + iy) * w + ix) * cin;
                        let fi = (ky * kw + kx) * cin * cout;
                        let di = ((b * oh + oy) * ow + ox) * cout;
                        for ci in 0..cin {
                            for co in 0..cout {
                                let g = dy.data[di + co];
                                dx[xi + ci] += g * f.data[fi + ci * cout + co];
                                df[fi + ci * cout + co] += g * x.data[xi + ci];
                            }
                        }
                    }
                }
            }
        }
    }
    (RefArray::new(&x.shape, dx), RefArray::new(&f.shape, df))
}

/// TF pooling (max, or avg over the valid part of each window).
pub fn pool2d(
    x: &RefArray,
    max: bool,
    k: [usize; 2],
    strides: [usize; 2],
    pad: [usize; 2],
    out_hw: [usize; 2],
) -> RefArray {
    let [n, h, w, c] = [x.shape[0], x.shape[1], x.shape[2], x.shape[3]];
    let mut out = vec![0.0; n * out_hw[0] * out_hw[1] * c];
    for b in 0..n {
        for oy in 0..out_hw[0] {
            for ox in 0..out_hw[1] {
                for ch in 0..c {
                    let (mut acc, mut cnt) = (if max { f64::NEG_INFINITY } else { 0.0 }, 0);
                    for ky in 0..k[0] {
                        for kx in 0..k[1] {
                            let Some((iy, ix)) =
                                window_tap([oy, ox], [ky, kx], strides, [1, 1], pad, [h, w])
                            else {
                                continue;
                            };
                            let v = x.at(&[b, iy, ix, ch]);
                            cnt += 1;
                            acc = if max { acc.max(v) } else { acc + v };
                        }
                    }
                    out[((b * out_hw[0] + oy) * out_hw[1] + ox) * c + ch] =
                        if max { acc } else { acc / cnt.max(1) as f64 };
                }
            }
        }
    }
    RefArray::new(&[n, out_hw[0], out_hw[1], c], out)
}
