//! Convolutions whose batch's im2col columns pass `set_convolution_workspace_limit` while
//! one image's fit run as GEMMs a chunk of images at a time (not the direct loops), on the
//! CUDA backend's host emulation. The limit here, 16 KiB, splits many of the conformance
//! suite's random two-image cases and the fixed case below; the whole-batch GEMM runs in
//! `emulated.rs`, the direct loops in `emulated_direct_convolutions.rs`. Without a C++
//! compiler the tests skip loudly, unless `FERROFLOW_REQUIRE_CXX=1`.

mod common;

use ferroflow_tensor::{DType, FusedActivation, HostData, Padding, Tensor};

/// The workspace limit of this suite.
const LIMIT: usize = 16 << 10;

fn configure() {
    ferroflow_cuda::set_convolution_workspace_limit(LIMIT);
}

fn on_device(check: fn(&ferroflow_tensor::Device)) {
    common::on_emulated_device(
        configure,
        "the chunked convolutions were not checked",
        check,
    );
}

#[test]
fn chunked_conv2d_and_its_gradients() {
    on_device(ferroflow_tensor::conformance::nn::conv2d);
}

#[test]
fn chunked_fused_conv2d() {
    on_device(ferroflow_tensor::conformance::nn::fused_conv2d);
}

/// Five 8×8×3 images, a 3×3 window to 4 channels (SAME): 6,912 bytes of float32 columns an
/// image, so 16 KiB holds two and the batch runs as chunks of 2, 2 and 1 (float64: one
/// image a chunk). Each image's own call fits the limit and runs as one GEMM: the batch's
/// forward output and input gradient are theirs bit for bit, and its filter gradient their
/// sum.
#[test]
fn a_batch_in_chunks_matches_its_images_one_by_one() {
    on_device(|device| {
        let (batch, hw, c, cout) = (5usize, 8usize, 3usize, 4usize);
        let upload = |dtype: DType, shape: &[usize], seed: usize| {
            let n: usize = shape.iter().product();
            let v: Vec<f64> = (0..n)
                .map(|i| ((i * 7919 + seed * 104_729) % 1013) as f64 / 507.0 - 1.0)
                .collect();
            Tensor::from_host_on(HostData::from_f64_slice(dtype, &v), shape, *device)
                .expect("upload")
        };
        for dtype in [DType::F32, DType::F64] {
            let x = upload(dtype, &[batch, hw, hw, c], 1);
            let f = upload(dtype, &[3, 3, c, cout], 2);
            let bias = upload(dtype, &[cout], 3);
            let dy = upload(dtype, &[batch, hw, hw, cout], 4);
            let (s, d, same) = ([1, 1], [1, 1], Padding::Same);
            let image = |t: &Tensor, b: usize| {
                let mut size: Vec<isize> = t.shape().iter().map(|&v| v as isize).collect();
                size[0] = 1;
                t.slice(&[b, 0, 0, 0], &size).expect("slice")
            };
            let each = |op: &dyn Fn(usize) -> Tensor| -> Vec<f64> {
                (0..batch)
                    .flat_map(|b| op(b).to_f64_vec().expect("read"))
                    .collect()
            };
            let read = |t: ferroflow_tensor::Result<Tensor>| t.and_then(|t| t.to_f64_vec());
            let bits = |v: &[f64]| v.iter().map(|x| x.to_bits()).collect::<Vec<_>>();

            let y = read(x.conv2d(&f, s, same, d)).expect("conv2d");
            let want = each(&|b| image(&x, b).conv2d(&f, s, same, d).expect("conv2d"));
            assert_eq!(bits(&y), bits(&want), "conv2d, {dtype}");

            let act = FusedActivation::Relu;
            let y = read(x.fused_conv2d(&f, &bias, act, s, same, d)).expect("fused");
            let want = each(&|b| {
                image(&x, b)
                    .fused_conv2d(&f, &bias, act, s, same, d)
                    .expect("fused")
            });
            assert_eq!(bits(&y), bits(&want), "fused_conv2d, {dtype}");

            let input = [batch, hw, hw, c];
            let dx = read(Tensor::conv2d_backprop_input(input, &f, &dy, s, same, d))
                .expect("backprop input");
            let want = each(&|b| {
                Tensor::conv2d_backprop_input([1, hw, hw, c], &f, &image(&dy, b), s, same, d)
                    .expect("backprop input")
            });
            assert_eq!(bits(&dx), bits(&want), "conv2d_backprop_input, {dtype}");

            let fshape = [3, 3, c, cout];
            let dw =
                read(x.conv2d_backprop_filter(fshape, &dy, s, same, d)).expect("backprop filter");
            let per_image: Vec<Vec<f64>> = (0..batch)
                .map(|b| {
                    read(image(&x, b).conv2d_backprop_filter(fshape, &image(&dy, b), s, same, d))
                        .expect("backprop filter")
                })
                .collect();
            let tolerance = if dtype == DType::F32 { 1e-4 } else { 1e-12 };
            for (i, got) in dw.iter().enumerate() {
                let want: f64 = per_image.iter().map(|g| g[i]).sum();
                assert!(
                    (got - want).abs() <= tolerance * (1.0 + want.abs()),
                    "conv2d_backprop_filter, {dtype}, element {i}: {got} vs {want}"
                );
            }
        }
    });
}
