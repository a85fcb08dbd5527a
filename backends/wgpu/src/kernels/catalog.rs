//! Every shader the backend can build, named by its kernel key, with no GPU needed: the
//! test below parses and validates each with naga (the WGSL front end wgpu itself uses), so
//! a shader error fails `cargo test` on any machine, before a driver ever compiles it.

use super::elementwise::{binary_source, cast_source, unary_source};
use super::fused::{fused_reduce_source, fused_source};
use super::gemm::{self, conv_loaders, gemm_full_source, matmul_loaders, Reads, Tile};
use super::index::{
    gather_group_source, gather_source, scatter_add_sorted_source, scatter_add_source,
    scatter_keys_source, sparse_softmax_cross_entropy_source,
    sparse_softmax_cross_entropy_wide_source,
};
use super::movement::{concat_source, copy_source, pad_source, select_source};
use super::optimizer::optimizer_source;
use super::pool::{avg_pool_grad_source, max_pool_grad_source, pool2d_source};
use super::reduce::{arg_reduce_source, reduce_source};
use super::scan::{
    cumulative_source, sort_keys_source, sort_merge_source, sort_place_source, sort_source,
};
use crate::elem::Elem;
use ferroflow_tensor::{
    ArgReduceOp, BinaryOp, CumulativeOp, DType, FusedActivation, PoolKind, ReduceOp, UnaryOp,
};

/// Every storage type a kernel can see.
const ELEMS: [Elem; 6] = [
    Elem::F32,
    Elem::F16,
    Elem::I32,
    Elem::U32,
    Elem::Bool,
    Elem::I64,
];

/// The element type of `dtype` (the backend's mapping, without a device).
fn elem(dtype: DType) -> Option<Elem> {
    ELEMS.into_iter().find(|e| e.dtype() == dtype)
}

/// (name, WGSL) of every kernel variant the backend can build.
pub(crate) fn all_shaders() -> Vec<(String, String)> {
    let mut out: Vec<(String, String)> = vec![];
    let mut add = |name: String, source: Option<String>| {
        if let Some(s) = source {
            if !out.iter().any(|(n, _)| *n == name) {
                out.push((name, s));
            }
        }
    };
    for e in ELEMS {
        add(format!("copy_{e:?}"), Some(copy_source(e)));
        add(format!("select_{e:?}"), Some(select_source(e)));
        add(format!("concat_{e:?}"), Some(concat_source(e)));
        add(format!("pad_{e:?}"), Some(pad_source(e)));
        for &op in UnaryOp::ALL {
            if let Some(oe) = elem(op.output_dtype(e.dtype())) {
                add(
                    format!("unary_{}_{e:?}", op.name()),
                    unary_source(op, e, oe),
                );
            }
        }
        for &op in BinaryOp::ALL {
            if let Some(oe) = elem(op.output_dtype(e.dtype())) {
                add(
                    format!("binary_{}_{e:?}", op.name()),
                    binary_source(op, e, oe),
                );
            }
        }
        for to in ELEMS {
            add(format!("cast_{e:?}_{to:?}"), cast_source(e, to));
        }
        for &op in ReduceOp::ALL {
            let partial = if e == Elem::F16 { Elem::F32 } else { e };
            for (i, o) in [(e, e), (e, partial), (partial, e)] {
                add(
                    format!("reduce_{}_{i:?}_{o:?}", op.name()),
                    reduce_source(op, e, i, o),
                );
            }
        }
        for &op in ArgReduceOp::ALL {
            add(format!("{}_{e:?}", op.name()), arg_reduce_source(op, e));
        }
        for &op in CumulativeOp::ALL {
            add(format!("{}_{e:?}", op.name()), cumulative_source(op, e));
        }
        for descending in [false, true] {
            add(
                format!("sort_{e:?}_{descending}"),
                sort_source(e, descending),
            );
        }
        add(format!("sort_keys_{e:?}"), sort_keys_source(e));
        add(format!("sort_place_{e:?}"), sort_place_source(e));
        add(
            format!("scatter_add_sorted_{e:?}"),
            scatter_add_sorted_source(e),
        );
        for ie in [Elem::I32, Elem::I64] {
            add(format!("gather_{e:?}_{ie:?}"), gather_source(e, ie));
            // With a batch's targets (int64) and weights (float32) beside it.
            add(
                format!("gather_group_{e:?}_{ie:?}"),
                gather_group_source(&[e, Elem::I64, Elem::F32], ie),
            );
            add(
                format!("sparse_softmax_xent_{ie:?}"),
                sparse_softmax_cross_entropy_source(ie),
            );
            add(
                format!("sparse_softmax_xent_wide_{ie:?}"),
                sparse_softmax_cross_entropy_wide_source(ie),
            );
            add(
                format!("scatter_add_{e:?}_{ie:?}"),
                scatter_add_source(e, ie),
            );
            add(format!("scatter_keys_{ie:?}"), scatter_keys_source(ie));
        }
        for &kind in PoolKind::ALL {
            add(format!("{}_{e:?}", kind.name()), pool2d_source(kind, e));
        }
        add(format!("max_pool_grad_{e:?}"), max_pool_grad_source(e));
        add(format!("avg_pool_grad_{e:?}"), avg_pool_grad_source(e));
    }
    add("sort_merge".into(), Some(sort_merge_source()));
    // One rule of each kind (the conformance suite's: centered RMSprop included).
    for rule in ferroflow_tensor::conformance::fused::rules() {
        add(format!("optimizer_{rule:?}"), Some(optimizer_source(&rule)));
    }
    // Elementwise programs: every fusible unary op in one chain, every fusible binary op in
    // another, with two outputs (the kernel's WGSL is generated per program).
    {
        use ferroflow_tensor::{ElementwiseProgram, ElementwiseStep};
        let unary: Vec<ElementwiseStep> = UnaryOp::ALL
            .iter()
            .filter(|&&op| ElementwiseProgram::fusible_unary(op))
            .enumerate()
            .map(|(k, &op)| ElementwiseStep::Unary(op, k))
            .collect();
        let binary: Vec<ElementwiseStep> = BinaryOp::ALL
            .iter()
            .filter(|&&op| ElementwiseProgram::fusible_binary(op))
            .enumerate()
            .map(|(k, &op)| ElementwiseStep::Binary(op, 1 + k, 0))
            .collect();
        for steps in [unary, binary] {
            let end = steps.len();
            let program = ElementwiseProgram {
                num_inputs: 1 + usize::from(matches!(steps[0], ElementwiseStep::Binary(..))),
                steps,
                outputs: vec![],
            };
            let last = program.num_inputs + end - 1;
            let program = ElementwiseProgram {
                outputs: vec![last, program.num_inputs],
                ..program
            };
            assert!(program.check().is_ok(), "{program:?}");
            add(format!("fused_{program:?}"), fused_source(&program));
            for op in [
                ReduceOp::ReduceSum,
                ReduceOp::ReduceMean,
                ReduceOp::ReduceProd,
                ReduceOp::ReduceMax,
                ReduceOp::ReduceMin,
            ] {
                add(
                    format!("fused_reduce_{}_{program:?}", op.name()),
                    fused_reduce_source(&program, op),
                );
            }
        }
    }
    let tiles: [Tile; 3] = [gemm::BIG, gemm::MID, gemm::SMALL];
    for t in tiles {
        for e in [Elem::F32, Elem::F16, Elem::I32] {
            let outs: &[Elem] = if e.is_float() { &[e, Elem::F32] } else { &[e] };
            let mut reads: Vec<Reads> = [false, true]
                .into_iter()
                .flat_map(|a| {
                    [false, true].into_iter().map(move |b| Reads::Scalar {
                        a_m_fast: a,
                        b_k_fast: b,
                    })
                })
                .collect();
            if e == Elem::F32 {
                reads.push(Reads::Vec4);
            }
            for &o in outs {
                for &r in &reads {
                    add(
                        format!("matmul_{t:?}_{e:?}_{o:?}_{r:?}"),
                        Some(gemm_full_source(t, (e, e, o), r, &matmul_loaders(e, r))),
                    );
                    if e == Elem::F32 {
                        for a in [FusedActivation::Linear, FusedActivation::Relu] {
                            add(
                                format!("fused_matmul_{a:?}_{t:?}_{r:?}"),
                                Some(gemm::gemm_epilogue_source(t, r, &matmul_loaders(e, r), a)),
                            );
                        }
                        // A Dense layer's backward: the ReLU gradient of the product and
                        // the layer's output, returned too, its column sums the bias's.
                        let relu_grad = ferroflow_tensor::ElementwiseProgram {
                            num_inputs: 2,
                            steps: vec![ferroflow_tensor::ElementwiseStep::Binary(
                                BinaryOp::ReluGrad,
                                0,
                                1,
                            )],
                            outputs: vec![2, 2],
                        };
                        add(
                            format!("fused_matmul_reduce_{t:?}_{r:?}"),
                            gemm::gemm_column_sums_source(t, r, &matmul_loaders(e, r), &relu_grad),
                        );
                    }
                }
                if e.is_float() {
                    for (name, readers) in [
                        ("conv2d", include_str!("../wgsl/conv2d.wgsl")),
                        (
                            "conv2d_backprop_input",
                            include_str!("../wgsl/conv2d_backprop_input.wgsl"),
                        ),
                        (
                            "conv2d_backprop_filter",
                            include_str!("../wgsl/conv2d_backprop_filter.wgsl"),
                        ),
                    ] {
                        let r = Reads::Scalar {
                            a_m_fast: false,
                            b_k_fast: false,
                        };
                        add(
                            format!("{name}_{t:?}_{e:?}_{o:?}"),
                            Some(gemm_full_source(t, (e, e, o), r, &conv_loaders(e, readers))),
                        );
                    }
                }
            }
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Every shader parses and validates as WGSL (with float16 enabled, as on an adapter
    /// with `SHADER_F16`): no GPU, no driver, any machine.
    #[test]
    fn every_shader_is_valid_wgsl() {
        let shaders = all_shaders();
        // Every family is in the catalog (a family left out would go unchecked).
        for family in [
            "copy_",
            "select_",
            "concat_",
            "pad_",
            "unary_",
            "binary_",
            "cast_",
            "reduce_",
            "argmax_",
            "argmin_",
            "cumsum_",
            "cumprod_",
            "sort_",
            "sort_keys_",
            "sort_merge",
            "sort_place_",
            "gather_",
            "scatter_add_",
            "scatter_keys_",
            "scatter_add_sorted_",
            "max_pool2d_",
            "avg_pool2d_",
            "max_pool_grad_",
            "avg_pool_grad_",
            "optimizer_",
            "fused_",
            "matmul_",
            "conv2d_",
            "conv2d_backprop_input_",
            "conv2d_backprop_filter_",
        ] {
            assert!(
                shaders.iter().any(|(n, _)| n.starts_with(family)),
                "no {family} kernel in the catalog"
            );
        }
        let mut failures = vec![];
        for (name, source) in &shaders {
            let module = match naga::front::wgsl::parse_str(source) {
                Ok(m) => m,
                Err(e) => {
                    failures.push(format!("{name}: {}", e.emit_to_string(source)));
                    continue;
                }
            };
            let mut validator = naga::valid::Validator::new(
                naga::valid::ValidationFlags::all(),
                naga::valid::Capabilities::all(),
            );
            if let Err(e) = validator.validate(&module) {
                failures.push(format!("{name}: {}", e.emit_to_string(source)));
            }
        }
        assert!(
            failures.is_empty(),
            "{} of {} shaders are invalid:\n{}",
            failures.len(),
            shaders.len(),
            failures.join("\n")
        );
        eprintln!("{} shaders valid", shaders.len());
    }
}
