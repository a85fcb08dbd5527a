//! CPU kernels, one module per op family.

pub(crate) mod bf16_gemm;
pub(crate) mod bias;
pub(crate) mod binary;
pub(crate) mod cast;
pub(crate) mod complex;
pub(crate) mod conv;
pub(crate) mod f32_conv;
pub(crate) mod f32_gemm;
pub(crate) mod f32_winograd;
pub(crate) mod fused;
pub(crate) mod index;
pub(crate) mod matmul;
pub(crate) mod max_pool;
pub(crate) mod program;
pub(crate) mod reduce;
pub(crate) mod scan;
pub(crate) mod unary;
pub(crate) mod xent;
