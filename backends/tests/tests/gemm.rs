//! The tiled GEMM's paths (vec4 loads, scalar strided loads; each tile size; batches) against
//! the CPU backend on shapes large enough to reach them.

mod common;

use ferroflow_tensor::{random, DType, Device};

fn check(m: usize, k: usize, n: usize, batch: usize, ta: bool, tb: bool) {
    let Some(gpu) = common::wgpu_device() else {
        return;
    };
    let mk = |rows: usize, cols: usize, t: bool, seed: u64| {
        let shape = if t {
            [batch, cols, rows]
        } else {
            [batch, rows, cols]
        };
        let x = random::stateless_uniform(&shape, [seed, 1], -1.0, 1.0, DType::F32).expect("draw");
        if t {
            x.transpose(&[0, 2, 1]).expect("transpose")
        } else {
            x
        }
    };
    let (a, b) = (mk(m, k, ta, 1), mk(k, n, tb, 2));
    let want = a.matmul(&b).expect("cpu").to_vec::<f32>().expect("read");
    let (ga, gb) = (a.to_device(gpu).expect("up"), b.to_device(gpu).expect("up"));
    let got = ga.matmul(&gb).expect("wgpu");
    assert_eq!(got.shape(), &[batch, m, n]);
    let got = got.to_vec::<f32>().expect("read");
    let tol = 1e-5 * (k as f32).sqrt() * 4.0;
    for (i, (g, w)) in got.iter().zip(&want).enumerate() {
        assert!(
            (g - w).abs() <= tol * (1.0 + w.abs()),
            "[{batch}x{m}x{k}x{n} ta={ta} tb={tb}] element {i}: wgpu {g}, cpu {w}"
        );
    }
    assert_eq!(Device::CPU, a.device());
}

#[test]
fn big_tiles_with_vec4_loads() {
    check(1536, 68, 1536, 1, false, false);
}

#[test]
fn big_tiles_with_ragged_edges() {
    check(1410, 37, 1411, 1, false, false);
}

#[test]
fn mid_and_small_tiles_vec4_and_scalar() {
    check(260, 64, 300, 1, false, false);
    check(100, 36, 44, 1, false, false);
    check(33, 17, 20, 1, false, false);
}

#[test]
fn transposed_operands_and_batches() {
    check(130, 45, 70, 3, true, false);
    check(64, 40, 72, 2, false, true);
    check(96, 33, 80, 2, true, true);
}

#[test]
fn split_k_for_few_tiles_and_a_long_k() {
    check(40, 3000, 24, 1, false, false);
    check(72, 2050, 36, 1, true, false);
}

/// A convolution filter gradient deep enough to be split along K, against the CPU.
#[test]
fn conv_filter_gradient_with_split_k() {
    use ferroflow_tensor::{Padding, Tensor};
    let Some(gpu) = common::wgpu_device() else {
        return;
    };
    let x = random::stateless_uniform(&[16, 20, 20, 3], [5, 1], -1.0, 1.0, DType::F32).expect("x");
    let f = random::stateless_uniform(&[3, 3, 3, 8], [6, 1], -1.0, 1.0, DType::F32).expect("f");
    let grads = |x: &Tensor, f: &Tensor| {
        let y = x.conv2d(f, [1, 1], Padding::Same, [1, 1]).expect("conv");
        let dy = y.mul(&y).expect("dy");
        let dw = x
            .conv2d_backprop_filter([3, 3, 3, 8], &dy, [1, 1], Padding::Same, [1, 1])
            .expect("dw");
        (
            y.to_vec::<f32>().expect("y"),
            dw.to_vec::<f32>().expect("dw"),
        )
    };
    let (want_y, want_dw) = grads(&x, &f);
    let (got_y, got_dw) = grads(&x.to_device(gpu).expect("x"), &f.to_device(gpu).expect("f"));
    for (g, w) in got_y.iter().zip(&want_y).chain(got_dw.iter().zip(&want_dw)) {
        assert!((g - w).abs() <= 1e-3 * (1.0 + w.abs()), "wgpu {g} cpu {w}");
    }
}
