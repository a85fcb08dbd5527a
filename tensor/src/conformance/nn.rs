//! conv2d and pooling against the reference; their gradient kernels through adjoint
//! identities (⟨conv(x, f), dy⟩ = ⟨x, backprop_input(f, dy)⟩ = ⟨f, backprop_filter(x, dy)⟩);
//! softmax and log_softmax.

use super::harness::*;
use super::reference::{self, RefArray};
use crate::{DType, Device, FusedActivation, Padding, PoolKind, Tensor, Window2d};
use proptest::prelude::*;

const FLOATS: [DType; 4] = [DType::F32, DType::F64, DType::F16, DType::BF16];

#[derive(Debug, Clone)]
struct Geometry {
    x: [usize; 4],
    k: [usize; 2],
    cout: usize,
    strides: [usize; 2],
    dilations: [usize; 2],
    same: bool,
}

fn geometry() -> impl Strategy<Value = Geometry> {
    (
        1..3usize,
        1..7usize,
        1..7usize,
        1..4usize,
        1..4usize,
        1..4usize,
        1..4usize,
        1..3usize,
        1..3usize,
        1..3usize,
        any::<bool>(),
        any::<bool>(),
    )
        .prop_map(
            |(n, h, w, c, kh, kw, cout, sh, sw, d, dil, same)| Geometry {
                x: [n, h, w, c],
                k: [kh, kw],
                cout,
                strides: if dil { [1, 1] } else { [sh, sw] },
                dilations: if dil { [d, d] } else { [1, 1] },
                same,
            },
        )
}

fn values(n: usize, seed: u64) -> Vec<f64> {
    let mut g = crate::random::Philox::new([seed, 17]);
    (0..n).map(|_| g.next_f64() * 2.0 - 1.0).collect()
}

fn dot(a: &[f64], b: &[f64]) -> f64 {
    a.iter().zip(b).map(|(p, q)| p * q).sum()
}

/// Σ|a·b|: the scale of a dot product's rounding error.
fn dot_abs(a: &[f64], b: &[f64]) -> f64 {
    a.iter().zip(b).map(|(p, q)| (p * q).abs()).sum()
}

/// A convolution case: padding, window, filter shape, input and filter values.
type ConvCaseData = (Padding, Window2d, [usize; 4], RefArray, RefArray);

/// A geometry's padding, window and filter shape, with random input and filter values
/// quantized to `dtype`.
///
/// `None` when the window is larger than a VALID input: then `device` must refuse the
/// convolution with TF's "computed output size would be negative" (checked here).
fn conv_case(
    device: &Device,
    g: &Geometry,
    dtype: DType,
    seed: u64,
) -> Result<Option<ConvCaseData>, TestCaseError> {
    let pad = if g.same {
        Padding::Same
    } else {
        Padding::Valid
    };
    let Ok(w) = Window2d::resolve("test", g.x, g.k, g.strides, g.dilations, pad) else {
        let x = ok(
            "x",
            Tensor::zeros(&g.x, dtype).and_then(|t| t.to_device(*device)),
        )?;
        let f = ok(
            "f",
            Tensor::zeros(&[g.k[0], g.k[1], g.x[3], g.cout], dtype)
                .and_then(|t| t.to_device(*device)),
        )?;
        let r = x.conv2d(&f, g.strides, pad, g.dilations);
        prop_assert!(
            matches!(&r, Err(crate::Error::InvalidArgument { msg, .. }) if msg.contains("negative")),
            "a VALID window larger than the input must be an error, got {r:?} for {g:?}"
        );
        return Ok(None);
    };
    let fshape = [g.k[0], g.k[1], g.x[3], g.cout];
    let xs = RefArray::new(&g.x, quantize(dtype, &values(g.x.iter().product(), seed)));
    let fs = RefArray::new(
        &fshape,
        quantize(dtype, &values(fshape.iter().product(), seed ^ 1)),
    );
    Ok(Some((pad, w, fshape, xs, fs)))
}

/// conv2d forward vs the reference, and both backprop kernels by the adjoint identities.
pub fn conv2d(device: &Device) {
    let floats = supported(device, &FLOATS);
    check(
        "conv2d",
        (geometry(), 0..floats.len(), any::<u64>(), view_kind()),
        |(g, di, seed, view)| {
            let dtype = floats[di];
            let Some((pad, w, fshape, xs, fs)) = conv_case(device, &g, dtype, seed)? else {
                return Ok(());
            };
            let (x, f) = (
                ok("x", make_tensor(device, dtype, &xs, view))?,
                ok("f", make_tensor(device, dtype, &fs, ViewKind::Contiguous))?,
            );
            let got = ok("conv2d", x.conv2d(&f, g.strides, pad, g.dilations))?;
            let want = reference::conv2d(&xs, &fs, g.strides, g.dilations, w.pad_before, w.output);
            let kdim = (g.k[0] * g.k[1] * g.x[3]) as f64;
            let want = RefArray::new(&want.shape, quantize(dtype, &want.data));
            assert_close(
                &format!("conv2d {dtype} {g:?}"),
                &got,
                &want,
                2.0,
                2.0 * epsilon(dtype) * kdim,
            )?;
            // Gradients in the most exact float the device has (f64 on the CPU).
            if dtype != exact_float(device) {
                return Ok(());
            }
            let adjoint_tol = if dtype == DType::F64 { 1e-9 } else { 1e-4 };
            let dys: Vec<f64> = quantize(dtype, &values(want.data.len(), seed ^ 2));
            let dy = ok(
                "dy",
                Tensor::from_host_on(
                    crate::HostData::from_f64_slice(dtype, &dys),
                    &want.shape,
                    *device,
                ),
            )?;
            let dx = ok(
                "backprop_input",
                Tensor::conv2d_backprop_input(g.x, &f, &dy, g.strides, pad, g.dilations),
            )?;
            let df = ok(
                "backprop_filter",
                x.conv2d_backprop_filter(fshape, &dy, g.strides, pad, g.dilations),
            )?;
            let lhs = dot(&want.data, &dys);
            let mag = 1.0 + dot_abs(&want.data, &dys);
            let by_x = dot(&xs.data, &ok("dx", dx.to_f64_vec())?);
            let by_f = dot(&fs.data, &ok("df", df.to_f64_vec())?);
            prop_assert!(
                (lhs - by_x).abs() < adjoint_tol * mag,
                "backprop_input is not conv2d's adjoint: {lhs} vs {by_x}"
            );
            prop_assert!(
                (lhs - by_f).abs() < adjoint_tol * mag,
                "backprop_filter is not conv2d's adjoint: {lhs} vs {by_f}"
            );
            Ok(())
        },
    );
    conv2d_large(device);
    conv2d_3x3_many_channels(device);
}

/// Training-sized convolutions (past a register tile of pixels and of channels, several
/// images, padded and strided and dilated windows), forward and both gradients checked
/// element by element against the definition in every float type.
fn conv2d_large(device: &Device) {
    let cases: [ConvCase; 10] = [
        ([3, 13, 13, 32], [3, 3], 64, [1, 1], [1, 1], Padding::Valid),
        // 3x3 at stride 1 with many channels (CPU: the Winograd kernels): outputs that are
        // and are not multiples of its 4x4 tiles, smaller than one tile, SAME and VALID,
        // channel counts off the 16-lane groups, images over several chunks.
        ([2, 9, 7, 20], [3, 3], 33, [1, 1], [1, 1], Padding::Same),
        ([1, 6, 5, 17], [3, 3], 16, [1, 1], [1, 1], Padding::Valid),
        ([2, 3, 4, 16], [3, 3], 16, [1, 1], [1, 1], Padding::Same),
        ([9, 10, 10, 16], [3, 3], 20, [1, 1], [1, 1], Padding::Valid),
        ([2, 28, 28, 1], [3, 3], 32, [1, 1], [1, 1], Padding::Valid),
        ([2, 9, 7, 5], [3, 3], 40, [1, 1], [1, 1], Padding::Same),
        ([2, 10, 11, 3], [3, 2], 9, [2, 2], [1, 1], Padding::Same),
        ([1, 12, 12, 6], [3, 3], 33, [1, 1], [2, 2], Padding::Same),
        ([2, 8, 8, 16], [5, 5], 12, [1, 1], [1, 1], Padding::Valid),
    ];
    for case in cases {
        let r = conv_elementwise(device, case, 5);
        assert!(r.is_ok(), "{r:?}");
    }
}

/// 3x3 convolutions at stride 1 with 16-21 input and 16-35 output channels (CPU: the
/// Winograd kernels) over random image sizes, batch sizes and paddings, forward and both
/// gradients checked element by element in every float type.
fn conv2d_3x3_many_channels(device: &Device) {
    let strategy = (
        1..3usize,
        1..11usize,
        1..11usize,
        16..22usize,
        16..36usize,
        any::<bool>(),
        any::<u64>(),
    );
    // Each case runs three f64 reference convolutions per float type: an eighth of the
    // usual count.
    check_cases(
        "conv2d 3x3 many channels",
        cases().div_ceil(8),
        strategy,
        |(n, h, w, cin, cout, same, seed)| {
            let pad = if same { Padding::Same } else { Padding::Valid };
            if !same && (h < 3 || w < 3) {
                return Ok(());
            }
            conv_elementwise(
                device,
                ([n, h, w, cin], [3, 3], cout, [1, 1], [1, 1], pad),
                seed,
            )
        },
    );
}

/// (input, kernel, cout, strides, dilations, padding)
type ConvCase = (
    [usize; 4],
    [usize; 2],
    usize,
    [usize; 2],
    [usize; 2],
    Padding,
);

/// One convolution's forward and both gradients against the definition, element by
/// element, in every float type the device has.
fn conv_elementwise(
    device: &Device,
    (xs, k, cout, strides, dil, pad): ConvCase,
    seed: u64,
) -> Result<(), TestCaseError> {
    let w = Window2d::resolve("test", xs, k, strides, dil, pad).unwrap();
    let fshape = [k[0], k[1], xs[3], cout];
    let x = RefArray::new(&xs, values(xs.iter().product(), seed));
    let f = RefArray::new(&fshape, values(fshape.iter().product(), seed ^ 1));
    let y = reference::conv2d(&x, &f, strides, dil, w.pad_before, w.output);
    let dy = RefArray::new(&y.shape, values(y.data.len(), seed ^ 2));
    for dtype in supported(device, &FLOATS) {
        let q = |r: &RefArray| RefArray::new(&r.shape, quantize(dtype, &r.data));
        let up = |r: &RefArray| make_tensor(device, dtype, &q(r), ViewKind::Contiguous);
        let (tx, tf, tdy) = (ok("x", up(&x))?, ok("f", up(&f))?, ok("dy", up(&dy))?);
        // References from the quantized operands, so only the kernel's rounding differs.
        let (xq, fq, dyq) = (q(&x), q(&f), q(&dy));
        let want_y = reference::conv2d(&xq, &fq, strides, dil, w.pad_before, w.output);
        let (want_dx, want_df) =
            reference::conv2d_backprop(&xq, &fq, &dyq, strides, dil, w.pad_before);
        let what = |name: &str| {
            format!("{name} {dtype} x {xs:?} k {k:?} cout {cout} s {strides:?} d {dil:?} {pad:?}")
        };
        let terms = |n: usize| 4.0 * epsilon(dtype) * n as f64;
        let got = ok("conv2d", tx.conv2d(&tf, strides, pad, dil))?;
        assert_close(
            &what("conv2d"),
            &got,
            &q(&want_y),
            2.0,
            terms(k[0] * k[1] * xs[3]),
        )?;
        let got = ok(
            "dx",
            Tensor::conv2d_backprop_input(xs, &tf, &tdy, strides, pad, dil),
        )?;
        assert_close(
            &what("backprop_input"),
            &got,
            &q(&want_dx),
            2.0,
            terms(k[0] * k[1] * cout),
        )?;
        let got = ok(
            "df",
            tx.conv2d_backprop_filter(fshape, &tdy, strides, pad, dil),
        )?;
        let pixels = xs[0] * w.output[0] * w.output[1];
        assert_close(
            &what("backprop_filter"),
            &got,
            &q(&want_df),
            2.0,
            terms(pixels),
        )?;
    }
    Ok(())
}

/// fused_conv2d (`activation(conv2d(x, f) + bias)`) vs the reference convolution plus bias
/// and ReLU, in every float type, over random geometries with up to 39 output channels
/// (AVX-512 lane edges) and the MNIST network's two layers; fused_conv2d_max_pool is
/// fused_conv2d and then max_pool2d, bit for bit.
pub fn fused_conv2d(device: &Device) {
    let floats = supported(device, &FLOATS);
    let case = |dtype: DType, g: &Geometry, activation: FusedActivation, seed: u64, view, pool| {
        let Some((pad, w, _, xs, fs)) = conv_case(device, g, dtype, seed)? else {
            return Ok(());
        };
        let bs = RefArray::new(&[g.cout], quantize(dtype, &values(g.cout, seed ^ 2)));
        let (x, f, b) = (
            ok("x", make_tensor(device, dtype, &xs, view))?,
            ok("f", make_tensor(device, dtype, &fs, ViewKind::Contiguous))?,
            ok(
                "bias",
                make_tensor(device, dtype, &bs, ViewKind::Contiguous),
            )?,
        );
        let got = ok(
            "fused_conv2d",
            x.fused_conv2d(&f, &b, activation, g.strides, pad, g.dilations),
        )?;
        let mut want = reference::conv2d(&xs, &fs, g.strides, g.dilations, w.pad_before, w.output);
        for (i, v) in want.data.iter_mut().enumerate() {
            *v += bs.data[i % g.cout];
            if activation == FusedActivation::Relu && *v <= 0.0 {
                *v = 0.0;
            }
        }
        let kdim = (g.k[0] * g.k[1] * g.x[3] + 1) as f64;
        assert_close(
            &format!("fused_conv2d {activation:?} {dtype} {g:?}"),
            &got,
            &RefArray::new(&want.shape, quantize(dtype, &want.data)),
            2.0,
            2.0 * epsilon(dtype) * kdim,
        )?;
        // With the max pooling of its output: the two ops' results, bit for bit. Windows
        // that tile it (Keras' default), or overlapping ones cut by the edge (ResNet's).
        let (ksize, strides, pool_pad) = match pool {
            0 if w.output.iter().all(|&d| d >= 2) => ([2, 2], [2, 2], Padding::Valid),
            1 => ([3, 3], [2, 2], Padding::Same),
            _ => ([2, 3], [2, 1], Padding::Same),
        };
        let (y, pooled) = ok(
            "fused_conv2d_max_pool",
            x.fused_conv2d_max_pool(
                &f,
                &b,
                activation,
                g.strides,
                pad,
                g.dilations,
                ksize,
                strides,
                pool_pad,
            ),
        )?;
        let what =
            format!("fused_conv2d_max_pool {activation:?} {dtype} {g:?} {ksize:?}/{strides:?}");
        same_bits(&format!("{what}: y"), &y, &got)?;
        let want_pooled = ok("max_pool2d", got.max_pool2d(ksize, strides, pool_pad))?;
        same_bits(&format!("{what}: pooled"), &pooled, &want_pooled)
    };
    check(
        "fused_conv2d",
        (
            geometry(),
            prop_oneof![Just(0usize), 14..40usize],
            any::<bool>(),
            0..floats.len(),
            any::<u64>(),
            (view_kind(), 0..3usize),
        ),
        |(mut g, wide, relu, di, seed, (view, pool))| {
            if wide > 0 {
                g.cout = wide;
            }
            let activation = if relu {
                FusedActivation::Relu
            } else {
                FusedActivation::Linear
            };
            case(floats[di], &g, activation, seed, view, pool)
        },
    );
    for dtype in floats.iter().copied() {
        for (x, cout) in [([3, 13, 13, 32], 64), ([2, 28, 28, 1], 32)] {
            let g = Geometry {
                x,
                k: [3, 3],
                cout,
                strides: [1, 1],
                dilations: [1, 1],
                same: false,
            };
            // The pooling tiles the output, overlaps it, or is 2x3 / 2x1.
            for pool in 0..3 {
                let r = case(
                    dtype,
                    &g,
                    FusedActivation::Relu,
                    11,
                    ViewKind::Contiguous,
                    pool,
                );
                assert!(r.is_ok(), "{r:?}");
            }
        }
    }
    // Bad operands are errors naming the op: a bias that is not [out_channels], a VALID
    // pooling window larger than the convolution's output.
    let zeros = |shape: &[usize]| {
        Tensor::zeros(shape, DType::F32)
            .and_then(|t| t.to_device(*device))
            .expect("zeros")
    };
    let (x, f) = (zeros(&[1, 4, 4, 1]), zeros(&[3, 3, 1, 2]));
    let fused = |bias: &Tensor, pool: [usize; 2]| {
        x.fused_conv2d_max_pool(
            &f,
            bias,
            FusedActivation::Relu,
            [1, 1],
            Padding::Valid,
            [1, 1],
            pool,
            pool,
            Padding::Valid,
        )
    };
    let r = fused(&zeros(&[3]), [2, 2]);
    assert!(
        matches!(
            &r,
            Err(crate::Error::ShapeMismatch {
                op: "fused_conv2d_max_pool",
                ..
            })
        ),
        "{r:?}"
    );
    let r = fused(&zeros(&[2]), [3, 3]);
    assert!(
        matches!(&r, Err(crate::Error::InvalidArgument { msg, .. }) if msg.contains("negative")),
        "{r:?}"
    );
}

/// bias_activation_grad (`dx = g·[y > 0]`, `dbias = Σ dx` over the leading axes; linear:
/// `dx = g`) vs the reference, in every float type, with outputs `y` that are exactly zero in
/// places (a ReLU's output), over views and channel counts across vector widths.
pub fn bias_activation_grad(device: &Device) {
    let floats = supported(device, &FLOATS);
    let strat = (
        nonempty_array(3, 6, -1.0, 1.0),
        prop_oneof![Just(0usize), 14..70usize],
        any::<bool>(),
        0..floats.len(),
        any::<u64>(),
        view_kind(),
    );
    check(
        "bias_activation_grad",
        strat,
        |(a, wide, relu, di, seed, view)| {
            let dtype = floats[di];
            let mut shape = a.shape.clone();
            if wide > 0 {
                *shape.last_mut().expect("rank >= 1") = wide;
            }
            let n: usize = shape.iter().product();
            let gs = RefArray::new(&shape, quantize(dtype, &values(n, seed)));
            // A ReLU output: about a third exactly zero.
            let ys: Vec<f64> = values(n, seed ^ 5)
                .iter()
                .map(|&v| if v < -0.3 { 0.0 } else { v })
                .collect();
            let ys = RefArray::new(&shape, quantize(dtype, &ys));
            let (g, y) = (
                ok("g", make_tensor(device, dtype, &gs, view))?,
                ok("y", make_tensor(device, dtype, &ys, ViewKind::Contiguous))?,
            );
            let activation = if relu {
                FusedActivation::Relu
            } else {
                FusedActivation::Linear
            };
            let (dx, db) = ok(
                "bias_activation_grad",
                g.bias_activation_grad(&y, activation),
            )?;
            let want = gs.zip(&ys, |gv, yv| if relu && yv <= 0.0 { 0.0 } else { gv });
            assert_matches(&format!("dx {activation:?} {dtype}"), &dx, &want, 1.0)?;
            let lead: Vec<usize> = (0..shape.len() - 1).collect();
            let sums = want.reduce(&lead, 0.0, |acc, v| acc + v);
            let rows = (n / shape[shape.len() - 1]) as f64;
            assert_close(
                &format!("dbias {activation:?} {dtype}"),
                &db,
                &RefArray::new(&sums.shape, quantize(dtype, &sums.data)),
                2.0,
                2.0 * epsilon(dtype) * rows,
            )
        },
    );
}

/// `got` equal to `want` in shape and bit for bit (a NaN as any NaN).
fn same_bits(what: &str, got: &Tensor, want: &Tensor) -> Result<(), TestCaseError> {
    prop_assert_eq!(got.shape(), want.shape(), "{}", what);
    let (got, want) = (
        ok("read", got.to_f64_vec())?,
        ok("read", want.to_f64_vec())?,
    );
    prop_assert!(
        got.iter()
            .zip(&want)
            .all(|(a, b)| a.to_bits() == b.to_bits() || (a.is_nan() && b.is_nan())),
        "{what}: {got:?}, the composed ops {want:?}"
    );
    Ok(())
}

/// max/avg pooling vs the reference; avg_pool_grad by adjointness; max_pool_grad routes each
/// dy to the first maximum of its window; max_pool_bias_activation_grad is max_pool_grad and
/// then bias_activation_grad, bit for bit.
pub fn pooling(device: &Device) {
    let floats = supported(device, &FLOATS);
    check(
        "pool2d",
        (
            geometry(),
            0..floats.len(),
            any::<u64>(),
            view_kind(),
            prop_oneof![Just(0usize), 14..40usize],
            prop_oneof![3 => Just(0usize), 1 => 4..24usize],
        ),
        |(mut g, di, seed, view, wide, grow)| {
            let dtype = floats[di];
            if wide > 0 {
                g.x[3] = wide; // channels across vector widths (16 floats per AVX-512 lane set)
            }
            // Windows larger than the input: SAME pads them (the kernels see the window cut
            // to what can reach the input), VALID refuses them.
            g.k = [g.k[0] + grow, g.k[1] + grow / 2];
            let pad = if g.same {
                Padding::Same
            } else {
                Padding::Valid
            };
            let k = [g.k[0], g.k[1]];
            let xs = RefArray::new(&g.x, quantize(dtype, &values(g.x.iter().product(), seed)));
            let x = ok("x", make_tensor(device, dtype, &xs, view))?;
            let Ok(w) = Window2d::resolve("test", g.x, k, g.strides, [1, 1], pad) else {
                // TF: "computed output size would be negative".
                for kind in [PoolKind::MaxPool2d, PoolKind::AvgPool2d] {
                    let r = x.pool2d(kind, k, g.strides, pad);
                    prop_assert!(
                        matches!(&r, Err(crate::Error::InvalidArgument { msg, .. }) if msg.contains("negative")),
                        "a VALID window larger than the input must be an error, got {r:?}"
                    );
                }
                return Ok(());
            };
            for kind in [PoolKind::MaxPool2d, PoolKind::AvgPool2d] {
                let got = ok(kind.name(), x.pool2d(kind, k, g.strides, pad))?;
                let want = reference::pool2d(
                    &xs,
                    kind == PoolKind::MaxPool2d,
                    k,
                    g.strides,
                    w.pad_before,
                    w.output,
                );
                assert_matches(
                    &format!("{} {dtype}", kind.name()),
                    &got,
                    &RefArray::new(&want.shape, quantize(dtype, &want.data)),
                    2.0,
                )?;
            }
            let out_shape = [g.x[0], w.output[0], w.output[1], g.x[3]];
            let dys = quantize(dtype, &values(out_shape.iter().product(), seed ^ 3));
            let dy = ok(
                "dy",
                Tensor::from_host_on(
                    crate::HostData::from_f64_slice(dtype, &dys),
                    &out_shape,
                    *device,
                ),
            )?;
            // max: the gradient is dy at each window's first maximum, summed over windows.
            let mx = ok("max_pool_grad", x.max_pool_grad(&dy, k, g.strides, pad))?;
            let want = reference_max_pool_grad(&xs.data, &dys, &g, &w);
            // Overlapping windows add up to kh·kw gradients in one element, rounded.
            let overlap = (k[0] * k[1]) as f64 * epsilon(dtype);
            assert_close(
                &format!("max_pool_grad {dtype}"),
                &mx,
                &RefArray::new(&g.x, quantize(dtype, &want)),
                1.0,
                overlap,
            )?;
            // The pooling gradient with the ReLU and bias gradients below it, in one op:
            // what the two ops give, bit for bit (a NaN as a NaN).
            for activation in [FusedActivation::Relu, FusedActivation::Linear] {
                let (dx, db) = ok(
                    "max_pool_bias_activation_grad",
                    x.max_pool_bias_activation_grad(&dy, k, g.strides, pad, activation),
                )?;
                let (want_dx, want_db) = ok(
                    "bias_activation_grad",
                    mx.bias_activation_grad(&x, activation),
                )?;
                for (name, got, want) in [("dx", &dx, &want_dx), ("dbias", &db, &want_db)] {
                    same_bits(
                        &format!("max_pool_bias_activation_grad {name} {activation:?} {dtype}"),
                        got,
                        want,
                    )?;
                }
            }
            // avg_pool_grad by adjointness, in the most exact float the device has.
            if dtype != exact_float(device) {
                return Ok(());
            }
            let adjoint_tol = if dtype == DType::F64 { 1e-9 } else { 1e-4 };
            let avg = reference::pool2d(&xs, false, k, g.strides, w.pad_before, w.output);
            let dx = ok(
                "avg_pool_grad",
                Tensor::avg_pool_grad(g.x, &dy, k, g.strides, pad),
            )?;
            let (lhs, rhs) = (
                dot(&avg.data, &dys),
                dot(&xs.data, &ok("dx", dx.to_f64_vec())?),
            );
            prop_assert!(
                (lhs - rhs).abs() < adjoint_tol * (1.0 + dot_abs(&avg.data, &dys)),
                "avg_pool_grad is not avg_pool's adjoint: {lhs} vs {rhs}"
            );
            Ok(())
        },
    );
}

/// The gradient of max pooling by its definition: each window's `dy` goes to the first
/// tap holding the window's maximum, summed over windows.
fn reference_max_pool_grad(x: &[f64], dys: &[f64], g: &Geometry, w: &Window2d) -> Vec<f64> {
    let k = g.k;
    let mut want = vec![0.0; x.len()];
    let [n, h, wd, c] = g.x;
    for b in 0..n {
        for oy in 0..w.output[0] {
            for ox in 0..w.output[1] {
                for ch in 0..c {
                    let mut best: Option<(f64, usize)> = None;
                    for ky in 0..k[0] {
                        for kx in 0..k[1] {
                            let Some((iy, ix)) = reference::window_tap(
                                [oy, ox],
                                [ky, kx],
                                g.strides,
                                [1, 1],
                                w.pad_before,
                                [h, wd],
                            ) else {
                                continue;
                            };
                            let p = ((b * h + iy) * wd + ix) * c + ch;
                            if best.is_none_or(|(v, _)| x[p] > v) {
                                best = Some((x[p], p));
                            }
                        }
                    }
                    if let Some((_, p)) = best {
                        want[p] += dys[((b * w.output[0] + oy) * w.output[1] + ox) * c + ch];
                    }
                }
            }
        }
    }
    want
}

/// softmax and log_softmax along a random axis, stable for large logits.
pub fn softmax(device: &Device) {
    let floats = supported(device, &FLOATS);
    let strat = nonempty_array(3, 5, -30.0, 30.0).prop_flat_map(|a| {
        let r = a.shape.len();
        (Just(a), 0..r, 0..floats.len(), view_kind())
    });
    check("softmax/log_softmax", strat, |(a, axis, di, view)| {
        let dtype = floats[di];
        let a = quantized(dtype, &a.map(|v| v * 10.0)); // up to ±300: overflows a naive exp
        let x = ok("x", make_tensor(device, dtype, &a, view))?;
        let m = a.reduce(&[axis], f64::NEG_INFINITY, f64::max);
        let lse: Vec<f64> = {
            let s = a.reduce(&[axis], 0.0, |acc, _| acc);
            let mut sums = vec![0.0; s.data.len()];
            for i in 0..a.data.len() {
                let mut idx = reference::unravel(i, &a.shape);
                idx.remove(axis);
                let o = idx
                    .iter()
                    .zip(&m.shape)
                    .fold(0, |acc, (&i, &d)| acc * d + i);
                sums[o] += (a.data[i] - m.data[o]).exp();
            }
            sums.iter()
                .zip(&m.data)
                .map(|(s, mx)| s.ln() + mx)
                .collect()
        };
        let logp: Vec<f64> = (0..a.data.len())
            .map(|i| {
                let mut idx = reference::unravel(i, &a.shape);
                idx.remove(axis);
                let o = idx
                    .iter()
                    .zip(&m.shape)
                    .fold(0, |acc, (&i, &d)| acc * d + i);
                a.data[i] - lse[o]
            })
            .collect();
        let want_log = RefArray::new(&a.shape, quantize(dtype, &logp));
        let want = RefArray::new(
            &a.shape,
            quantize(dtype, &logp.iter().map(|v| v.exp()).collect::<Vec<_>>()),
        );
        let scale = a.data.iter().fold(1.0f64, |s, v| s.max(v.abs()));
        // Softmax's outputs are in [0, 1]: a few ulps of each output, relative, plus the
        // error of exp(x - max) in the dtype the op computes in (float32 for half types),
        // which grows with |x - max| ≤ 2·scale; the smallest normal number as the floor (GPUs flush subnormal outputs).
        let compute_eps = epsilon(if dtype == DType::F64 {
            DType::F64
        } else {
            DType::F32
        });
        let rel = 2.0 * epsilon(dtype) + 4.0 * compute_eps * (1.0 + 2.0 * scale);
        let tol: Vec<f64> = want
            .data
            .iter()
            .map(|p| rel * p + min_normal(dtype))
            .collect();
        assert_within(
            "softmax",
            &ok("softmax", x.softmax(axis as isize))?,
            &want,
            &tol,
        )?;
        assert_close(
            "log_softmax",
            &ok("log_softmax", x.log_softmax(axis as isize))?,
            &want_log,
            4.0,
            4.0 * epsilon(dtype) * scale,
        )
    });
}

/// sparse_softmax_cross_entropy_with_logits vs the reference (`loss = logsumexp - x[label]`,
/// `backprop = softmax - one_hot`) in every float type with int32 and int64 labels, logits
/// up to ±300 (a naive exp overflows), over views and class counts from 1 to 70; a label
/// outside `[0, classes)` is the op's `IndexOutOfRange`.
pub fn sparse_softmax_cross_entropy(device: &Device) {
    const OP: &str = "sparse_softmax_cross_entropy_with_logits";
    let floats = supported(device, &FLOATS);
    let ints = supported(device, &[DType::I32, DType::I64]);
    if ints.is_empty() {
        return;
    }
    let strat = (
        nonempty_array(3, 5, -30.0, 30.0),
        prop_oneof![Just(0usize), 14..70usize],
        0..floats.len(),
        0..ints.len(),
        any::<u64>(),
        view_kind(),
    );
    let case = |dtype: DType, label_dtype: DType, shape: &[usize], seed: u64, view: ViewKind| {
        let classes = shape[shape.len() - 1];
        let n: usize = shape.iter().product();
        let rows = n / classes;
        let xs: Vec<f64> = values(n, seed).iter().map(|v| v * 300.0).collect();
        let x = RefArray::new(shape, quantize(dtype, &xs));
        let mut g = crate::random::Philox::new([seed, 23]);
        let ids: Vec<f64> = (0..rows)
            .map(|_| ((g.next_f64() * classes as f64) as usize).min(classes - 1) as f64)
            .collect();
        let ids = RefArray::new(&shape[..shape.len() - 1], ids);
        let logits = ok("logits", make_tensor(device, dtype, &x, view))?;
        let labels = ok("labels", make_tensor(device, label_dtype, &ids, view))?;
        let (loss, backprop) = ok(OP, logits.sparse_softmax_cross_entropy_with_logits(&labels))?;
        let (mut want_loss, mut want_bp) = (vec![0.0; rows], vec![0.0; n]);
        let mut p = vec![0.0; n];
        let mut scale = 1.0f64;
        for r in 0..rows {
            let row = &x.data[r * classes..(r + 1) * classes];
            let m = row.iter().copied().fold(f64::NEG_INFINITY, f64::max);
            let s: f64 = row.iter().map(|v| (v - m).exp()).sum();
            let label = ids.data[r] as usize;
            want_loss[r] = s.ln() + m - row[label];
            for (k, v) in row.iter().enumerate() {
                p[r * classes + k] = (v - m).exp() / s;
                want_bp[r * classes + k] = p[r * classes + k] - f64::from(k == label);
                scale = scale.max(v.abs());
            }
        }
        // As softmax: each probability within a few ulps of the dtype plus the error of
        // exp(x - max) in the dtype computed in (float32 for half types); the loss's
        // cancellation error grows with the logits' size.
        let compute_eps = epsilon(if dtype == DType::F64 {
            DType::F64
        } else {
            DType::F32
        });
        let rel = 4.0 * compute_eps * (1.0 + 2.0 * scale);
        let bp_tol: Vec<f64> = want_bp
            .iter()
            .zip(&p)
            .map(|(w, p)| rel * p + 2.0 * epsilon(dtype) * w.abs() + min_normal(dtype))
            .collect();
        let bp_want = RefArray::new(shape, quantize(dtype, &want_bp));
        assert_within(&format!("backprop {dtype}"), &backprop, &bp_want, &bp_tol)?;
        let loss_tol: Vec<f64> = want_loss
            .iter()
            .map(|w| rel * (1.0 + classes as f64) + 2.0 * epsilon(dtype) * w.abs())
            .collect();
        let loss_want = RefArray::new(&shape[..shape.len() - 1], quantize(dtype, &want_loss));
        assert_within(&format!("loss {dtype}"), &loss, &loss_want, &loss_tol)
    };
    check(OP, strat, |(a, wide, di, ii, seed, view)| {
        let mut shape = a.shape.clone();
        if wide > 0 {
            *shape.last_mut().expect("rank >= 1") = wide;
        }
        case(floats[di], ints[ii], &shape, seed, view)
    });
    // Batches large enough that backends split the rows among threads or workgroups.
    for &dtype in &floats {
        for (shape, view) in [
            ([4099, 10], ViewKind::Contiguous),
            ([700, 33], ViewKind::Transposed),
        ] {
            let r = case(dtype, ints[0], &shape, 5, view);
            assert!(r.is_ok(), "{dtype} {shape:?}: {r:?}");
        }
    }
    for &dtype in &floats {
        for &label_dtype in &ints {
            let logits = Tensor::from_host_on(
                crate::HostData::from_f64_slice(dtype, &[0.0, 1.0, 2.0, 3.0, 4.0, 5.0]),
                &[2, 3],
                *device,
            )
            .expect("logits");
            for bad in [3.0, -1.0] {
                let labels = Tensor::from_host_on(
                    crate::HostData::from_f64_slice(label_dtype, &[0.0, bad]),
                    &[2],
                    *device,
                )
                .expect("labels");
                match logits.sparse_softmax_cross_entropy_with_logits(&labels) {
                    Err(crate::Error::IndexOutOfRange { op, index, bound }) => {
                        assert_eq!((op, index, bound), (OP, bad as i64, 3), "{dtype}");
                    }
                    other => panic!("{device} {dtype} {label_dtype}: label {bad} gave {other:?}"),
                }
            }
        }
    }
}

/// Softmax cross-entropy over rows wider than GPU kernels take a thread per row for (the
/// CUDA and wgpu backends' 1024: a block per row beyond) against float64 references: losses
/// and backprop in the float types the op takes, with int32 and int64 labels, widths that
/// leave a block's last pass partial; a NaN logit makes its row's loss NaN and leaves the
/// others; a label at the bound is the error naming it.
pub fn wide_softmax_cross_entropy(device: &Device) {
    let rows = 3usize;
    let up =
        |dtype: DType, v: &[f64], shape: &[usize]| upload(device, dtype, shape, v).expect("upload");
    let label_types = supported(device, &[DType::I32, DType::I64]);
    for classes in [1025usize, 2049] {
        let logits: Vec<f64> = (0..rows * classes)
            .map(|i| ((i * 7919) % 1013) as f64 / 61.0 - 8.0)
            .collect();
        let labels: Vec<f64> = (0..rows)
            .map(|r| ((r * 977 + 5) % classes) as f64)
            .collect();
        for dtype in supported(device, &[DType::F32, DType::F64]) {
            let x = up(dtype, &logits, &[rows, classes]);
            let exact = x.to_f64_vec().expect("read");
            for &label_dtype in &label_types {
                let y = up(label_dtype, &labels, &[rows]);
                let (loss, backprop) = x
                    .sparse_softmax_cross_entropy_with_logits(&y)
                    .expect("softmax cross-entropy");
                let loss = loss.to_f64_vec().expect("read");
                let backprop = backprop.to_f64_vec().expect("read");
                let eps = epsilon(dtype);
                for r in 0..rows {
                    let row = &exact[r * classes..(r + 1) * classes];
                    let label = labels[r] as usize;
                    let m = row.iter().cloned().fold(f64::MIN, f64::max);
                    let sum: f64 = row.iter().map(|v| (v - m).exp()).sum();
                    let want = sum.ln() - (row[label] - m);
                    let what = format!("{dtype} by {label_dtype}, {classes} classes, row {r}");
                    assert!(
                        (loss[r] - want).abs() <= 16.0 * eps * (1.0 + want.abs()),
                        "loss, {what}: {} vs {want}",
                        loss[r]
                    );
                    for (k, v) in row.iter().enumerate() {
                        let p = (v - m).exp() / sum - f64::from(k == label);
                        let got = backprop[r * classes + k];
                        assert!(
                            (got - p).abs() <= 16.0 * eps * (1.0 / classes as f64 + p.abs()),
                            "backprop, {what}, class {k}: {got} vs {p}"
                        );
                    }
                }
            }
            // A NaN logit: its row's loss is NaN, the others' are not.
            let mut with_nan = logits.clone();
            with_nan[classes + 7] = f64::NAN;
            let x = up(dtype, &with_nan, &[rows, classes]);
            let y = up(label_types[0], &labels, &[rows]);
            let loss = x
                .sparse_softmax_cross_entropy_with_logits(&y)
                .and_then(|(l, _)| l.to_f64_vec())
                .expect("softmax cross-entropy");
            assert!(
                loss[1].is_nan() && !loss[0].is_nan() && !loss[2].is_nan(),
                "{dtype}: {loss:?}"
            );
            // A label at the bound.
            let mut wrong = labels.clone();
            wrong[2] = classes as f64;
            let y = up(label_types[0], &wrong, &[rows]);
            let r = x.sparse_softmax_cross_entropy_with_logits(&y);
            assert!(
                matches!(r, Err(crate::Error::IndexOutOfRange { index, bound, .. })
                    if index == classes as i64 && bound == classes),
                "{dtype}: {:?}",
                r.map(|_| ())
            );
        }
    }
}
