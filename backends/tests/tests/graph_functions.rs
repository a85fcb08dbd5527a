//! Graph functions on the wgpu backend: an elementwise composite traced into a graph runs as
//! one generated WGSL kernel, with the eager ops' results bit for bit, forward and gradient.

mod common;

use ferroflow_autodiff::GradientTape;
use ferroflow_function::Function;
use ferroflow_tensor::{random, with_device, DType, Tensor};

fn bits(t: &Tensor) -> Vec<u32> {
    t.to_vec::<f32>()
        .expect("read")
        .iter()
        .map(|v| v.to_bits())
        .collect()
}

#[test]
fn gelu_from_primitives_is_one_wgsl_kernel() {
    let Some(gpu) = common::wgpu_device() else {
        return;
    };
    with_device(&gpu.to_string(), || {
        let x = random::stateless_uniform(&[64, 33], [7, 8], -4.0, 4.0, DType::F32).expect("x");
        let gelu = Function::new(|a: &[Tensor]| Ok(vec![a[0].gelu()?]));
        let eager = x.gelu().expect("eager gelu");
        let traced = gelu.call(std::slice::from_ref(&x)).expect("trace");
        let (k0, _, _) = ferroflow_wgpu::counters();
        let replayed = gelu.call(std::slice::from_ref(&x)).expect("replay");
        let (k1, _, _) = ferroflow_wgpu::counters();
        assert_eq!(k1 - k0, 1, "the traced gelu runs as one kernel");
        assert_eq!(bits(&traced[0]), bits(&eager));
        assert_eq!(bits(&replayed[0]), bits(&eager));
        // The gradient through the fused op equals the eager one.
        let grad = |graph: bool| {
            let tape = GradientTape::new();
            tape.watch(&x);
            let y = if graph {
                gelu.call(std::slice::from_ref(&x)).expect("call").remove(0)
            } else {
                x.gelu().expect("gelu")
            };
            let g = tape.gradient(&y, &[(&x).into()]).expect("gradient");
            bits(g[0].as_ref().expect("a gradient"))
        };
        assert_eq!(grad(true), grad(false));
    })
    .expect("device scope");
}
