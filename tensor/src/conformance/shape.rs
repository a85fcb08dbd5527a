//! Shape ops: reshape, transpose, strided_slice, reverse, broadcast_to, concat/split/stack,
//! pad (constant and mirror), tile.

use super::harness::*;
use super::reference::{unravel, RefArray};
use crate::{DType, Device, SliceSpec, Tensor};
use proptest::prelude::*;

const DTYPES: [DType; 5] = [DType::F32, DType::F64, DType::BF16, DType::I32, DType::Bool];

fn int_values(dtype: DType, a: &RefArray) -> RefArray {
    quantized(
        dtype,
        &if dtype == DType::Bool {
            a.map(|v| (v > 0.0) as u8 as f64)
        } else {
            a.map(|v| v.round())
        },
    )
}

/// reshape (with -1), transpose and reverse keep the row-major element order they promise.
pub fn reshape_transpose_reverse(device: &Device) {
    let dtypes = supported(device, &DTYPES);
    let strat = array(4, 4, -9.0, 9.0).prop_flat_map(|a| {
        let r = a.shape.len();
        (
            Just(a),
            Just((0..r).collect::<Vec<_>>()).prop_shuffle(),
            0..dtypes.len(),
            view_kind(),
            any::<bool>(),
        )
    });
    check(
        "reshape/transpose/reverse",
        strat,
        |(a, perm, di, view, infer)| {
            let dtype = dtypes[di];
            let a = int_values(dtype, &a);
            let x = ok("input", make_tensor(device, dtype, &a, view))?;
            let mut target: Vec<isize> = a.shape.iter().rev().map(|&d| d as isize).collect();
            if infer && !target.is_empty() && !a.data.is_empty() {
                target[0] = -1;
            }
            let rev_shape: Vec<usize> = a.shape.iter().rev().copied().collect();
            assert_matches(
                "reshape",
                &ok("reshape", x.reshape(&target))?,
                &RefArray::new(&rev_shape, a.data.clone()),
                1.0,
            )?;
            assert_matches(
                "transpose",
                &ok("transpose", x.transpose(&perm))?,
                &a.transpose(&perm),
                1.0,
            )?;
            if !a.shape.is_empty() {
                let axes: Vec<isize> = vec![0, a.shape.len() as isize - 1];
                let axes: Vec<isize> = if a.shape.len() == 1 { vec![0] } else { axes };
                let got = ok("reverse", x.reverse(&axes))?;
                let want: Vec<f64> = (0..a.data.len())
                    .map(|i| {
                        let mut idx = unravel(i, &a.shape);
                        for &ax in &axes {
                            let ax = ax as usize;
                            idx[ax] = a.shape[ax] - 1 - idx[ax];
                        }
                        a.at(&idx)
                    })
                    .collect();
                assert_matches("reverse", &got, &RefArray::new(&a.shape, want), 1.0)?;
            }
            Ok(())
        },
    );
}

/// Positions a Python slice selects, by filtering (a formulation independent of the
/// implementation's arithmetic).
fn slice_positions(n: usize, start: Option<isize>, stop: Option<isize>, step: isize) -> Vec<usize> {
    let n = n as isize;
    let norm = |v: isize| if v < 0 { v + n } else { v };
    if step > 0 {
        let s = start.map(norm).unwrap_or(0).max(0);
        let e = stop.map(norm).unwrap_or(n);
        (0..n)
            .filter(|&p| p >= s && p < e && (p - s) % step == 0)
            .map(|p| p as usize)
            .collect()
    } else {
        let s = start.map(norm).unwrap_or(n - 1).min(n - 1);
        let e = stop.map(norm).unwrap_or(-1);
        let e = if stop.is_some() && e < 0 { -1 } else { e };
        (0..n)
            .rev()
            .filter(|&p| p <= s && p > e && (s - p) % (-step) == 0)
            .map(|p| p as usize)
            .collect()
    }
}

/// strided_slice with random starts, stops and (negative) steps.
pub fn strided_slice(device: &Device) {
    let spec = (
        prop::option::of(-6isize..6),
        prop::option::of(-6isize..6),
        prop_oneof![1isize..4, -3isize..0],
    );
    let strat = (
        array(3, 5, -9.0, 9.0),
        prop::collection::vec(spec, 3),
        view_kind(),
    );
    check("strided_slice", strat, |(a, specs, view)| {
        let a = quantized(DType::F32, &a);
        let x = ok("input", make_tensor(device, DType::F32, &a, view))?;
        let rank = a.shape.len();
        let specs: Vec<_> = specs.into_iter().take(rank).collect();
        let ss: Vec<SliceSpec> = specs
            .iter()
            .map(|&(s, e, st)| SliceSpec::Range {
                start: s,
                stop: e,
                step: st,
            })
            .collect();
        let got = ok("strided_slice", x.strided_slice(&ss))?;
        let pos: Vec<Vec<usize>> = (0..rank)
            .map(|i| match specs.get(i) {
                Some(&(s, e, st)) => slice_positions(a.shape[i], s, e, st),
                None => (0..a.shape[i]).collect(),
            })
            .collect();
        let shape: Vec<usize> = pos.iter().map(|p| p.len()).collect();
        let want: Vec<f64> = (0..shape.iter().product())
            .map(|i| {
                let idx = unravel(i, &shape);
                a.at(&idx
                    .iter()
                    .enumerate()
                    .map(|(ax, &j)| pos[ax][j])
                    .collect::<Vec<_>>())
            })
            .collect();
        assert_matches("strided_slice", &got, &RefArray::new(&shape, want), 1.0)
    });
}

/// concat of the pieces of a split gives back the original; stack adds an axis.
pub fn concat_split_stack(device: &Device) {
    let dtypes = supported(device, &DTYPES);
    let strat = nonempty_array(3, 5, -9.0, 9.0).prop_flat_map(|a| {
        let r = a.shape.len();
        (Just(a), 0..r, 0..dtypes.len(), view_kind())
    });
    check("concat/split/stack", strat, |(a, axis, di, view)| {
        let dtype = dtypes[di];
        let a = int_values(dtype, &a);
        let x = ok("input", make_tensor(device, dtype, &a, view))?;
        let n = a.shape[axis];
        let sizes = vec![n / 2, 0, n - n / 2];
        let parts = ok("split", x.split(&sizes, axis as isize))?;
        for (p, &s) in parts.iter().zip(&sizes) {
            prop_assert_eq!(p.shape()[axis], s);
        }
        assert_matches(
            "concat(split)",
            &ok("concat", Tensor::concat(&parts, axis as isize))?,
            &a,
            1.0,
        )?;
        let st = ok("stack", Tensor::stack(&[x.clone(), x.clone()], 0))?;
        let mut shape = vec![2];
        shape.extend_from_slice(&a.shape);
        assert_matches(
            "stack",
            &st,
            &RefArray::new(&shape, [a.data.clone(), a.data.clone()].concat()),
            1.0,
        )
    });
    let x =
        Tensor::from_host_on(crate::HostData::F32(vec![0.0; 6]), &[2, 3], *device).expect("upload");
    let y =
        Tensor::from_host_on(crate::HostData::F32(vec![0.0; 4]), &[2, 2], *device).expect("upload");
    assert!(
        Tensor::concat(&[x.clone(), y.clone()], 0).is_err(),
        "concat along 0 of [2,3] and [2,2] must fail"
    );
    assert_eq!(
        Tensor::concat(&[x, y], 1).expect("concat along 1").shape(),
        &[2, 5]
    );
}

fn mirror(i: isize, n: isize, symmetric: bool) -> usize {
    // Bounce off the edges until inside; SYMMETRIC repeats the edge element, REFLECT does not.
    let mut i = i;
    loop {
        if i < 0 {
            i = if symmetric { -i - 1 } else { -i };
        } else if i >= n {
            i = if symmetric {
                2 * n - i - 1
            } else {
                2 * n - i - 2
            };
        } else {
            return i as usize;
        }
    }
}

/// pad (CONSTANT, REFLECT, SYMMETRIC) and tile.
pub fn pad_and_tile(device: &Device) {
    let strat = nonempty_array(3, 4, -9.0, 9.0).prop_flat_map(|a| {
        let r = a.shape.len();
        (
            Just(a),
            prop::collection::vec((0..3usize, 0..3usize), r),
            prop::collection::vec(0..3usize, r),
            view_kind(),
        )
    });
    check("pad/tile", strat, |(a, pads, mult, view)| {
        let a = quantized(DType::F32, &a);
        let x = ok("input", make_tensor(device, DType::F32, &a, view))?;
        let out_shape: Vec<usize> = a
            .shape
            .iter()
            .zip(&pads)
            .map(|(d, (p, q))| d + p + q)
            .collect();
        let idx_in = |i: usize, f: &dyn Fn(isize, usize) -> Option<usize>| -> Option<Vec<usize>> {
            unravel(i, &out_shape)
                .iter()
                .enumerate()
                .map(|(ax, &j)| f(j as isize - pads[ax].0 as isize, ax))
                .collect()
        };
        let n: usize = out_shape.iter().product();
        let constant: Vec<f64> = (0..n)
            .map(|i| {
                idx_in(i, &|j, ax| {
                    (j >= 0 && (j as usize) < a.shape[ax]).then_some(j as usize)
                })
                .map(|ix| a.at(&ix))
                .unwrap_or(-2.5)
            })
            .collect();
        assert_matches(
            "pad constant",
            &ok("pad", x.pad(&pads, -2.5))?,
            &RefArray::new(&out_shape, constant),
            1.0,
        )?;
        for symmetric in [false, true] {
            let fits = a.shape.iter().zip(&pads).all(|(&d, &(p, q))| {
                let limit = if symmetric { d } else { d - 1 };
                p <= limit && q <= limit
            });
            let got = x.pad_mirror(&pads, symmetric);
            if !fits {
                prop_assert!(got.is_err(), "oversized mirror padding must be an error");
                continue;
            }
            let want: Vec<f64> = (0..n)
                .map(|i| {
                    a.at(
                        &idx_in(i, &|j, ax| Some(mirror(j, a.shape[ax] as isize, symmetric)))
                            .unwrap_or_default(),
                    )
                })
                .collect();
            assert_matches(
                if symmetric {
                    "pad SYMMETRIC"
                } else {
                    "pad REFLECT"
                },
                &ok("pad_mirror", got)?,
                &RefArray::new(&out_shape, want),
                1.0,
            )?;
        }
        let tiled_shape: Vec<usize> = a.shape.iter().zip(&mult).map(|(d, m)| d * m).collect();
        let want: Vec<f64> = (0..tiled_shape.iter().product())
            .map(|i| {
                a.at(&unravel(i, &tiled_shape)
                    .iter()
                    .zip(&a.shape)
                    .map(|(j, d)| j % d)
                    .collect::<Vec<_>>())
            })
            .collect();
        assert_matches(
            "tile",
            &ok("tile", x.tile(&mult))?,
            &RefArray::new(&tiled_shape, want),
            1.0,
        )
    });
}

/// broadcast_to, expand_dims and squeeze.
pub fn broadcast_expand_squeeze(device: &Device) {
    check(
        "broadcast_to/expand_dims/squeeze",
        (super::elementwise::broadcast_pair(-5.0, 5.0), view_kind()),
        |((a, b), view)| {
            let dtype = exact_float(device);
            let a = quantized(dtype, &a);
            let target = a.zip(&b, |_, _| 0.0).shape;
            let x = ok("input", make_tensor(device, dtype, &a, view))?;
            assert_matches(
                "broadcast_to",
                &ok("broadcast_to", x.broadcast_to(&target))?,
                &a.zip(&b, |p, _| p),
                1.0,
            )?;
            let e = ok("expand_dims", x.expand_dims(-1))?;
            let mut s = a.shape.clone();
            s.push(1);
            assert_matches("expand_dims", &e, &RefArray::new(&s, a.data.clone()), 1.0)?;
            let sq = ok("squeeze", e.squeeze(&[]))?;
            let s2: Vec<usize> = s.iter().copied().filter(|&d| d != 1).collect();
            assert_matches("squeeze", &sq, &RefArray::new(&s2, a.data.clone()), 1.0)
        },
    );
}
