//! The op counts the crate documentation states are the real ones: a new primitive must
//! update the docs (and CONTRIBUTING.md's table of places) in the same change.

use ferroflow_tensor::{
    ArgReduceOp, BinaryOp, CumulativeOp, FusedKernel, PoolKind, ReduceOp, UnaryOp,
};

const LIB_DOC: &str = include_str!("../src/lib.rs");
const BACKEND: &str = include_str!("../src/backend.rs");

/// The number written before `what` in the crate doc (`"29 unary"` → 29).
fn stated(what: &str) -> usize {
    let doc: String = LIB_DOC
        .lines()
        .filter_map(|l| l.strip_prefix("//!"))
        .collect::<Vec<_>>()
        .join(" ");
    let words: Vec<&str> = doc.split_whitespace().collect();
    let at = words
        .windows(2)
        .find(|w| w[1].trim_end_matches(',') == what && w[0].parse::<usize>().is_ok())
        .unwrap_or_else(|| panic!("the crate doc states no count of {what:?}"));
    at[0].parse().unwrap()
}

/// The methods of the `Backend` trait, in order.
fn backend_methods() -> Vec<String> {
    let start = BACKEND
        .find("pub trait Backend")
        .expect("the Backend trait");
    let body = &BACKEND[start..];
    let mut depth = 0;
    let mut end = 0;
    for (i, c) in body.char_indices() {
        match c {
            '{' => depth += 1,
            '}' => {
                depth -= 1;
                if depth == 0 {
                    end = i;
                    break;
                }
            }
            _ => {}
        }
    }
    body[..end]
        .lines()
        .filter_map(|l| l.strip_prefix("    fn "))
        .map(|l| l.split(['(', '<']).next().unwrap_or_default().to_string())
        .collect()
}

#[test]
fn the_op_counts_in_the_crate_doc_are_current() {
    assert_eq!(stated("unary"), UnaryOp::ALL.len(), "unary ops");
    assert_eq!(stated("binary"), BinaryOp::ALL.len(), "binary ops");
    assert_eq!(stated("reduce"), ReduceOp::ALL.len(), "reduce ops");
    assert_eq!(
        stated("arg-reduce"),
        ArgReduceOp::ALL.len(),
        "arg-reduce ops"
    );
    assert_eq!(stated("scan"), CumulativeOp::ALL.len(), "scans");
    assert_eq!(stated("pool"), PoolKind::ALL.len(), "pool kinds");
    // Every Backend method is a primitive kernel, except the fused kernels and these (a new
    // method that computes nothing, or that a backend may leave out, is added here).
    let not_kernels = [
        "name",
        "device_count",
        "upload",
        "download",
        "device_description",
        "supports_dtype",
        "has_fused",
        "memory_bytes",
        "can_allocate",
        "synchronize",
        // Optional: a backend without a generator has the host draw the numbers.
        "random",
    ];
    let methods = backend_methods();
    let fused: Vec<&str> = FusedKernel::ALL.iter().map(|k| k.name()).collect();
    for name in &fused {
        assert!(
            methods.iter().any(|m| m == name),
            "fused kernel {name} is no Backend method: {methods:?}"
        );
    }
    // `fused_reduce` is the elementwise program's kernel with a reduction: declared by
    // `FusedKernel::Elementwise`, no kind of its own; `optimizer_update_group` is the
    // optimizer update of several variables, declared by `FusedKernel::OptimizerUpdate`;
    // `gather_group` is `gather` of several tensors, which every backend has by default.
    let fused_methods: Vec<&str> = fused
        .iter()
        .copied()
        .chain(["fused_reduce", "optimizer_update_group", "gather_group"])
        .collect();
    let kernels = methods
        .iter()
        .filter(|m| !not_kernels.contains(&m.as_str()) && !fused_methods.contains(&m.as_str()))
        .count();
    assert_eq!(
        stated("primitive"),
        kernels,
        "primitive kernels: {methods:?}"
    );
    assert_eq!(stated("fused"), fused.len(), "fused kernels");
}

/// The sources that define `Tensor`'s op methods.
const OP_METHODS: [&str; 9] = [
    include_str!("../src/ops/complex.rs"),
    include_str!("../src/ops/elementwise.rs"),
    include_str!("../src/ops/fused.rs"),
    include_str!("../src/ops/index.rs"),
    include_str!("../src/ops/linalg.rs"),
    include_str!("../src/ops/nn.rs"),
    include_str!("../src/ops/reduce.rs"),
    include_str!("../src/ops/shape.rs"),
    include_str!("../src/ops/sort.rs"),
];

/// One spelling per op: a primitive's `name()` is the `Tensor` method that runs it, and its
/// enum variant is the same words in CamelCase, so `rg -i 'floor_?mod'` finds the method, the
/// variant, the gradient arm, every kernel and every test of `floormod`.
#[test]
fn every_primitive_is_spelled_one_way() {
    fn check<T: Copy + std::fmt::Debug>(all: &[T], name: impl Fn(T) -> &'static str) {
        for &v in all {
            let variant = format!("{v:?}");
            let name = name(v);
            assert_eq!(
                variant.to_lowercase(),
                name.replace('_', ""),
                "variant {variant} is spelled differently from its name {name:?}"
            );
            let defined = OP_METHODS.iter().any(|src| {
                src.contains(&format!("pub fn {name}("))
                    || src.contains(&format!("pub fn {name}<"))
                    || src.contains(&format!("    {name} => {variant},"))
            });
            assert!(defined, "no Tensor method named {name:?} (for {variant})");
        }
    }
    check(UnaryOp::ALL, UnaryOp::name);
    check(BinaryOp::ALL, BinaryOp::name);
    check(ReduceOp::ALL, ReduceOp::name);
    check(ArgReduceOp::ALL, ArgReduceOp::name);
    check(CumulativeOp::ALL, CumulativeOp::name);
    check(PoolKind::ALL, PoolKind::name);
}
