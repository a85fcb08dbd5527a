//! TensorFlow's names for ferroflow's ops and dtypes, and the cost model (FLOPs, bytes) of
//! the op-stats tables.

use ferroflow_tensor::fused::UpdateRule;
use ferroflow_tensor::op::Op;
use ferroflow_tensor::{DType, Tensor};
use std::collections::HashMap;
use std::sync::{Mutex, OnceLock};

/// TF's op type for `op` (`MatMul`, `AddV2`, `Conv2D`), as TF's profiler shows it.
///
/// ```
/// use ferroflow_tensor::op::{BinaryOp, Op};
/// assert_eq!(ferroflow_profiler::tf_op_type(&Op::Binary(BinaryOp::Add)), "AddV2");
/// assert_eq!(ferroflow_profiler::tf_op_type(&Op::Binary(BinaryOp::SquaredDifference)), "SquaredDifference");
/// ```
pub fn tf_op_type(op: &Op) -> &'static str {
    match op {
        Op::OptimizerUpdate(UpdateRule::SgdMomentum { .. }) => "ResourceApplyKerasMomentum",
        Op::OptimizerUpdate(UpdateRule::Adam { .. }) => "ResourceApplyAdam",
        Op::OptimizerUpdate(UpdateRule::RmsProp { .. }) => "ResourceApplyRMSProp",
        // Several variables' updates in one kernel: TF runs one op per variable; the
        // group keeps the rule's name.
        Op::OptimizerUpdateGroup(rule) => tf_op_type(&Op::OptimizerUpdate(*rule)),
        Op::GatherGroup { axis } => tf_op_type(&Op::Gather { axis: *axis }),
        _ => tf_op_type_of_name(op.name()),
    }
}

/// TF's op type for an op known by its ferroflow name ([`Op::name`]: `"matmul"`).
pub fn tf_op_type_of_name(name: &'static str) -> &'static str {
    let fixed = match name {
        "constant" => "Const",
        "matmul" => "MatMul",
        "cast" => "Cast",
        "select" => "SelectV2",
        "gather" => "GatherV2",
        "scatter_add" => "UnsortedSegmentSum",
        "concat" => "ConcatV2",
        "pad" => "PadV2",
        "copy" => "Identity",
        "to_device" => "CopyToDevice",
        "to_host" => "CopyToHost",
        "conv2d" => "Conv2D",
        "fused_conv2d" => "_FusedConv2D",
        "bias_activation_grad" => "BiasAddGrad",
        "sparse_softmax_cross_entropy_with_logits" => "SparseSoftmaxCrossEntropyWithLogits",
        "fused_matmul" => "_FusedMatMul",
        "fused_matmul_reduce" => "_FusedMatMulReduce",
        "max_pool_bias_activation_grad" => "_FusedMaxPoolGradBiasAddGrad",
        "fused_conv2d_max_pool" => "_FusedConv2DMaxPool",
        "conv2d_backprop_input" => "Conv2DBackpropInput",
        "conv2d_backprop_filter" => "Conv2DBackpropFilter",
        "clip_scalar" => "ClipByValue",
        "optimizer_update" => "ResourceApplyOptimizer",
        "add" => "AddV2",
        "div" => "RealDiv",
        "floordiv" => "FloorDiv",
        "floormod" => "FloorMod",
        "reduce_sum" => "Sum",
        "reduce_mean" => "Mean",
        "reduce_prod" => "Prod",
        "reduce_max" => "Max",
        "reduce_min" => "Min",
        "reduce_any" => "Any",
        "reduce_all" => "All",
        "argmax" => "ArgMax",
        "argmin" => "ArgMin",
        "max_pool2d" => "MaxPool",
        "avg_pool2d" => "AvgPool",
        "is_finite" => "IsFinite",
        "is_nan" => "IsNan",
        _ => "",
    };
    if !fixed.is_empty() {
        return fixed;
    }
    camel_case(name)
}

/// `snake_case` (or `linalg.inv`) as `CamelCase`, interned (op names are a finite set).
fn camel_case(name: &'static str) -> &'static str {
    static CACHE: OnceLock<Mutex<HashMap<&'static str, &'static str>>> = OnceLock::new();
    let mut cache = CACHE
        .get_or_init(Default::default)
        .lock()
        .unwrap_or_else(|e| e.into_inner());
    cache.entry(name).or_insert_with(|| {
        let camel: String = name
            .split(['_', '.'])
            .map(|part| {
                let mut c = part.chars();
                match c.next() {
                    Some(first) => first.to_uppercase().chain(c).collect::<String>(),
                    None => String::new(),
                }
            })
            .collect();
        Box::leak(camel.into_boxed_str())
    })
}

/// TF's name of a dtype (`float`, `half`, `int64`), as in its profiles.
pub fn tf_dtype_name(dtype: DType) -> &'static str {
    match dtype {
        DType::F16 => "half",
        DType::BF16 => "bfloat16",
        DType::F32 => "float",
        DType::F64 => "double",
        DType::I8 => "int8",
        DType::I32 => "int32",
        DType::I64 => "int64",
        DType::U8 => "uint8",
        DType::I16 => "int16",
        DType::U16 => "uint16",
        DType::U32 => "uint32",
        DType::U64 => "uint64",
        DType::Bool => "bool",
        DType::C64 => "complex64",
        DType::C128 => "complex128",
    }
}

/// TF's `DataType` enum value of a dtype (`DT_FLOAT` = 1).
pub fn tf_datatype(dtype: DType) -> i32 {
    match dtype {
        DType::F32 => 1,
        DType::F64 => 2,
        DType::I32 => 3,
        DType::U8 => 4,
        DType::I8 => 6,
        DType::I64 => 9,
        DType::Bool => 10,
        DType::C64 => 8,
        DType::C128 => 18,
        DType::BF16 => 14,
        DType::F16 => 19,
        DType::I16 => 5,
        DType::U16 => 17,
        DType::U32 => 22,
        DType::U64 => 23,
    }
}

fn elements(t: &Tensor) -> u64 {
    t.shape().iter().map(|&d| d as u64).product()
}

/// Estimated floating-point operations and bytes touched by one op (TF's cost model in
/// spirit: 2·m·n·k for a product, 2 per tap for convolutions, one per output element for
/// elementwise ops, one per input element for reductions; bytes = inputs + outputs).
pub fn cost(op: &Op, inputs: &[&Tensor], outputs: &[Tensor]) -> (u64, u64) {
    let bytes: u64 = inputs
        .iter()
        .map(|t| elements(t) * t.dtype().size_in_bytes() as u64)
        .chain(
            outputs
                .iter()
                .map(|t| elements(t) * t.dtype().size_in_bytes() as u64),
        )
        .sum();
    let out_elems: u64 = outputs.iter().map(elements).sum();
    let flops = match op {
        Op::MatMul { transpose_a, .. } => match (inputs.first(), outputs.first()) {
            (Some(a), Some(out)) => {
                let s = a.shape();
                let k = if s.len() < 2 {
                    s.last().copied().unwrap_or(1)
                } else if *transpose_a {
                    s[s.len() - 2]
                } else {
                    s[s.len() - 1]
                };
                2 * elements(out) * k as u64
            }
            _ => 0,
        },
        // The product's multiply-adds, then the bias add and activation per output.
        Op::FusedMatMul(_) => match (inputs.first(), outputs.first()) {
            (Some(a), Some(out)) => {
                let k = a.shape().last().copied().unwrap_or(1) as u64;
                2 * elements(out) * k + 2 * elements(out)
            }
            _ => 0,
        },
        // The product's multiply-adds, then the program and the row sum per element.
        Op::FusedMatMulReduce {
            program,
            transpose_a,
            transpose_b,
        } => match (inputs.first(), inputs.get(1)) {
            (Some(a), Some(b)) if a.rank() == 2 && b.rank() == 2 => {
                let (sa, sb) = (a.shape(), b.shape());
                let (m, k) = if *transpose_a {
                    (sa[1], sa[0])
                } else {
                    (sa[0], sa[1])
                };
                let n = if *transpose_b { sb[0] } else { sb[1] };
                let mn = (m * n) as u64;
                2 * mn * k as u64 + mn * (program.steps.len() as u64 + 1)
            }
            _ => 0,
        },
        Op::Conv2d(w) | Op::FusedConv2d(w, _) => {
            let cin = w.input[3] as u64;
            2 * out_elems * (w.kernel[0] * w.kernel[1]) as u64 * cin
        }
        Op::Conv2dBackpropInput(w) | Op::Conv2dBackpropFilter(w) => {
            // As many multiply-adds as the forward convolution.
            let out: u64 = w.input[0] as u64 * (w.output[0] * w.output[1]) as u64;
            let cout = inputs
                .iter()
                .map(|t| t.shape().last().copied().unwrap_or(1) as u64)
                .max()
                .unwrap_or(1);
            2 * out * cout * (w.kernel[0] * w.kernel[1]) as u64 * w.input[3] as u64
        }
        // The convolution's multiply-adds over `y`, then the pooling's comparisons.
        Op::FusedConv2dMaxPool(w, _, pool) => {
            let y: u64 = (w.input[0] * w.output[0] * w.output[1]) as u64 * pool.input[3] as u64;
            let pooled: u64 = (pool.input[0] * pool.output[0] * pool.output[1]) as u64;
            2 * y * (w.kernel[0] * w.kernel[1] * w.input[3]) as u64
                + pooled * pool.input[3] as u64 * (pool.kernel[0] * pool.kernel[1]) as u64
        }
        Op::Reduce { .. } | Op::ArgReduce { .. } | Op::Cumulative { .. } => {
            inputs.first().map_or(0, |t| elements(t))
        }
        Op::Pool2d(_, w) | Op::MaxPoolGrad(w) | Op::AvgPoolGrad(w) => {
            let out: u64 = (w.input[0] * w.output[0] * w.output[1] * w.input[3]) as u64;
            out * (w.kernel[0] * w.kernel[1]) as u64
        }
        Op::Unary(_) | Op::Binary(_) | Op::Select | Op::ClipScalar { .. } => out_elems,
        Op::OptimizerUpdate(_) => 8 * out_elems,
        // Each variable's value is the first of its `2 + slots` inputs.
        Op::OptimizerUpdateGroup(rule) => {
            8 * inputs
                .iter()
                .step_by(2 + rule.num_slots())
                .map(|t| elements(t))
                .sum::<u64>()
        }
        Op::BiasActivationGrad(_) => inputs.first().map_or(0, |t| 2 * elements(t)),
        // The pooling gradient's window comparisons, then the mask and the sum per input.
        Op::MaxPoolBiasActivationGrad(w, _) => {
            let out: u64 = (w.input[0] * w.output[0] * w.output[1] * w.input[3]) as u64;
            out * (w.kernel[0] * w.kernel[1]) as u64 + inputs.first().map_or(0, |t| 2 * elements(t))
        }
        // max, exp and sum, the loss, the softmax and its one-hot difference per logit.
        Op::SparseSoftmaxCrossEntropy => inputs.first().map_or(0, |t| 5 * elements(t)),
        _ => 0,
    };
    (flops, bytes)
}

#[cfg(test)]
mod tests {
    use super::*;
    use ferroflow_tensor::op::{BinaryOp, ReduceOp, UnaryOp};

    #[test]
    fn op_types_are_tensorflows() {
        assert_eq!(tf_op_type(&Op::Unary(UnaryOp::Relu)), "Relu");
        assert_eq!(tf_op_type(&Op::Unary(UnaryOp::Log1p)), "Log1p");
        assert_eq!(tf_op_type(&Op::Binary(BinaryOp::Mul)), "Mul");
        assert_eq!(
            tf_op_type(&Op::SparseSoftmaxCrossEntropy),
            "SparseSoftmaxCrossEntropyWithLogits"
        );
        assert_eq!(
            tf_op_type(&Op::Binary(BinaryOp::GreaterEqual)),
            "GreaterEqual"
        );
        assert_eq!(
            tf_op_type(&Op::Reduce {
                op: ReduceOp::ReduceSum,
                axes: vec![0],
                keepdims: false
            }),
            "Sum"
        );
        assert_eq!(
            tf_op_type(&Op::HostFunction { name: "linalg.inv" }),
            "LinalgInv"
        );
    }
}
