//! Elementwise programs ([`ElementwiseProgram`], what a graph function's fusion pass makes of
//! chains and trees of unary and binary ops) as one generated WGSL kernel: one thread per
//! output element reads each input through its broadcast layout, runs every step in
//! registers, and writes each output; intermediates never reach memory and the whole
//! program is one dispatch. Each step is the same WGSL expression as the op's own kernel
//! (`elementwise.rs`), as a function of its own.
//!
//! Shader compilers may rewrite float arithmetic within one kernel (reassociate
//! `(a + b) - a` to `b`, contract a product and a sum into a fused multiply-add); across
//! kernels they cannot. Each step's result passes through `opaque` (an exclusive-or of its
//! bits with a parameter word that is zero), which no rewrite sees through, so each step
//! rounds as the op's own kernel does and the program's results equal the ops' one by one,
//! bit for bit.
//!
//! A kernel binds its inputs and outputs as storage buffers; a program reading or writing
//! more than the adapter allows per kernel runs step by step through the ops' own kernels.

use super::elementwise::{binary_expr, unary_expr};
use super::reduce::{
    partial_pass, parts_of, reduce_partials, reduce_parts, reduced_value, MEAN_COUNT_SLOT,
};
use super::{output, run_map, same_gpu, In, MAIN};
use crate::buffer::WgpuBuffer;
use crate::elem::{descriptor, layout_descriptor, unsupported_on, Elem, Params};
use crate::gpu::{backend_error, groups_for};
use crate::shaders::{fill, kernel_source};
use ferroflow_tensor::{ElementwiseProgram, ElementwiseStep, Layout, ReduceOp, Result};

/// The first parameter slot holding an input's descriptor offset (slots 4..16 are free for
/// kernel scalars, so a fused kernel reads at most 12 inputs).
const FIRST_DESC_SLOT: usize = 4;
/// Inputs a fused kernel can address through its parameter block.
const MAX_DESC_INPUTS: usize = 16 - FIRST_DESC_SLOT;
/// The parameter word `opaque` mixes into each step's bits: zero (the kernel leaves the
/// third descriptor slot unused).
const ZERO_SLOT: usize = 3;

/// The WGSL of `program` on float32 registers, or `None` when a step has no float32
/// expression (`check` refuses such programs before they reach the backend).
pub(crate) fn fused_source(program: &ElementwiseProgram) -> Option<String> {
    let mut s = input_bindings(program.num_inputs);
    for k in 0..program.outputs.len() {
        s += &format!(
            "@group(0) @binding({}) var<storage, read_write> O{k}: array<f32>;\n",
            1 + program.num_inputs + k
        );
    }
    let (functions, mut body) = program_body(program, FIRST_DESC_SLOT, 0)?;
    for (k, r) in program.outputs.iter().enumerate() {
        body += &format!("    O{k}[i] = r{r};\n");
    }
    Some(kernel_source(
        false,
        &format!("{s}{functions}{MAIN}{body}}}\n"),
    ))
}

/// The bindings of a program's `n` inputs `X0..`, from binding 1.
pub(crate) fn input_bindings(n: usize) -> String {
    (0..n)
        .map(|k| {
            format!(
                "@group(0) @binding({}) var<storage, read> X{k}: array<f32>;\n",
                1 + k
            )
        })
        .collect()
}

/// The outputs of a program whose first output is reduced: the reduction `Y` at binding
/// `first`, the program's other outputs `O1..` after it.
pub(crate) fn reduction_output_bindings(first: usize, outputs: usize) -> String {
    let mut s = format!("@group(0) @binding({first}) var<storage, read_write> Y: array<f32>;\n");
    for k in 1..outputs {
        s += &format!(
            "@group(0) @binding({}) var<storage, read_write> O{k}: array<f32>;\n",
            first + k
        );
    }
    s
}

/// The program's functions (`opaque` and one per step) and the statements computing its
/// registers `r0..` at element `i`, input `k` read through the descriptor whose offset is
/// in parameter slot `first_slot + k`; inputs below `loaded_from` are not read (the caller
/// defines those registers: a GEMM's product).
pub(crate) fn program_body(
    program: &ElementwiseProgram,
    first_slot: usize,
    loaded_from: usize,
) -> Option<(String, String)> {
    let e = Elem::F32;
    let n_in = program.num_inputs;
    let mut s = format!(
        "fn opaque(x: f32) -> f32 {{ return bitcast<f32>(bitcast<u32>(x) ^ P[{ZERO_SLOT}]); }}\n"
    );
    let mut body = String::new();
    for k in loaded_from..n_in {
        body += &format!("    let r{k} = X{k}[at(P[{}], i)];\n", first_slot + k);
    }
    for (k, step) in program.steps.iter().enumerate() {
        let r = n_in + k;
        match *step {
            ElementwiseStep::Unary(op, a) => {
                s += &format!(
                    "fn step{k}(x: f32) -> f32 {{ return {}; }}\n",
                    unary_expr(op, e)?
                );
                body += &format!("    let r{r} = opaque(step{k}(r{a}));\n");
            }
            ElementwiseStep::Binary(op, a, b) => {
                let (expr, div_check, pow_check) = binary_expr(op, e)?;
                if div_check || pow_check {
                    return None;
                }
                s += &format!("fn step{k}(a: f32, b: f32) -> f32 {{ return {expr}; }}\n");
                body += &format!("    let r{r} = opaque(step{k}(r{a}, r{b}));\n");
            }
        }
    }
    Some((s, body))
}

/// The first parameter slot of a fused reduction's input descriptors (slots 4..7 hold the
/// reduction's scalars, slot 7 a mean's count).
const REDUCE_FIRST_DESC_SLOT: usize = MEAN_COUNT_SLOT + 1;
/// Inputs a fused reduction can address through its parameter block.
const REDUCE_MAX_DESC_INPUTS: usize = 16 - REDUCE_FIRST_DESC_SLOT;

/// The WGSL of `program` with reduction `op` of its first output in the loads of the
/// reduction kernel (`wgsl/reduce.wgsl`): the program runs once per element read, writes its
/// other outputs there (each element is read once), and the tree reduction folds the first
/// in the order the reduction kernel folds a stored tensor, so the bits are the same.
pub(crate) fn fused_reduce_source(program: &ElementwiseProgram, op: ReduceOp) -> Option<String> {
    let (init, combine) = reduce_parts(Elem::F32, op)?;
    let store = reduced_value(Elem::F32, op)?;
    let n_in = program.num_inputs;
    let mut s = input_bindings(n_in);
    s += &reduction_output_bindings(1 + n_in, program.outputs.len());
    let (functions, mut body) = program_body(program, REDUCE_FIRST_DESC_SLOT, 0)?;
    for (k, r) in program.outputs.iter().enumerate().skip(1) {
        body += &format!("    O{k}[i] = r{r};\n");
    }
    let value = format!(
        "fn program_value(i: u32) -> f32 {{\n{body}    return r{};\n}}\n",
        program.outputs[0]
    );
    let reduce = fill(
        include_str!("../wgsl/reduce.wgsl"),
        &[
            ("C", "f32"),
            ("INIT", init),
            ("COMBINE", combine),
            ("LOAD", "program_value(base + at(P[2], r))"),
            ("STORE", &store),
        ],
    );
    Some(kernel_source(
        false,
        &format!("{s}{functions}{value}{reduce}"),
    ))
}

/// Runs `program` over float32 `inputs` broadcast to `shape` and reduces its first output
/// over `axes` (`Backend::fused_reduce`): one generated kernel (two for a long reduction
/// split in parts); `None` where the inputs do not fit one kernel's bindings (the backend
/// then runs the program, then the reduction).
pub(crate) fn fused_reduce(
    program: &ElementwiseProgram,
    inputs: &[In<'_>],
    shape: &[usize],
    op: ReduceOp,
    axes: &[usize],
) -> Result<Option<Vec<WgpuBuffer>>> {
    const OP: &str = "fused_reduce";
    let layouts = check_inputs(OP, program, inputs, shape)?;
    let gpu = inputs[0].gpu();
    let fits = program.num_inputs <= REDUCE_MAX_DESC_INPUTS
        && 1 + program.num_inputs + program.outputs.len() <= gpu.max_storage_buffers;
    if !fits || reduce_parts(Elem::F32, op).is_none() {
        return Ok(None);
    }
    // The program's first output as a dense tensor of `shape`: reduced axes and kept ones.
    let strides = Layout::contiguous(shape).strides().to_vec();
    let keep: Vec<usize> = (0..shape.len()).filter(|a| !axes.contains(a)).collect();
    let pick = |axes: &[usize]| -> (Vec<usize>, Vec<isize>) {
        (
            axes.iter().map(|&a| shape[a]).collect(),
            axes.iter().map(|&a| strides[a]).collect(),
        )
    };
    let (out_dims, out_strides) = pick(&keep);
    let (red_dims, red_strides) = pick(axes);
    let n_out: usize = out_dims.iter().product();
    let n_red: usize = red_dims.iter().product();
    let n: usize = shape.iter().product();
    let parts = parts_of(n_out, n_red);
    let per = n_red.div_ceil(parts).max(1);
    let first_op = if parts > 1 { partial_pass(op) } else { op };
    let k = gpu.kernel(
        &format!("fused_reduce_{}_{program:?}", first_op.name()),
        program.num_inputs,
        program.outputs.len(),
        || fused_reduce_source(program, first_op).unwrap_or_default(),
    )?;
    let out = output(gpu, Elem::F32, n_out)?;
    let extras = (1..program.outputs.len())
        .map(|_| output(gpu, Elem::F32, n))
        .collect::<Result<Vec<_>>>()?;
    let first = if parts == 1 {
        None
    } else {
        Some(output(gpu, Elem::F32, n_out * parts)?)
    };
    let mut params = Params::new(n_out * parts)
        .set(ZERO_SLOT, 0)
        .set(4, n_red as u32)
        .set(5, parts as u32)
        .set(6, per as u32)
        .set(MEAN_COUNT_SLOT, n_red as u32)
        .desc(0, descriptor(&out_dims, &out_strides, 0))
        .desc(1, descriptor(&red_dims, &red_strides, 0));
    for (k, l) in layouts.iter().enumerate() {
        params = params.table(REDUCE_FIRST_DESC_SLOT + k, &layout_descriptor(l));
    }
    let ins: Vec<&wgpu::Buffer> = inputs.iter().map(|x| x.buf.raw()).collect();
    let outs: Vec<&wgpu::Buffer> = std::iter::once(first.as_ref().unwrap_or(&out).raw())
        .chain(extras.iter().map(|o| o.raw()))
        .collect();
    if n_out > 0 {
        gpu.dispatch(&k, &params.0, &ins, &outs, groups_for(n_out * parts, 1)?)?;
        if let Some(partial) = &first {
            reduce_partials(gpu, op, Elem::F32, partial, (n_out, n_red), parts, &out)?;
        }
    }
    Ok(Some(std::iter::once(out).chain(extras).collect()))
}

/// Checks a program's float32 inputs (count, one GPU) and gives their layouts broadcast to
/// `shape`.
fn check_inputs(
    op: &'static str,
    program: &ElementwiseProgram,
    inputs: &[In<'_>],
    shape: &[usize],
) -> Result<Vec<Layout>> {
    program.check()?;
    let first = inputs
        .first()
        .ok_or_else(|| backend_error(format!("{op}: a program reads at least one input")))?;
    if inputs.len() != program.num_inputs {
        return Err(backend_error(format!(
            "{op}: the program reads {} inputs, got {}",
            program.num_inputs,
            inputs.len()
        )));
    }
    let gpu = first.gpu();
    for x in inputs {
        same_gpu(op, first, x)?;
        if x.elem() != Elem::F32 {
            return Err(unsupported_on(gpu, op, x.elem().dtype()));
        }
    }
    inputs
        .iter()
        .map(|x| x.op.layout.broadcast_to(op, shape))
        .collect()
}

/// Whether one kernel can run `program` on `gpu`: its inputs fit the parameter block and
/// its inputs, outputs and parameter block the adapter's storage-buffer bindings.
fn fits_one_kernel(program: &ElementwiseProgram, max_storage_buffers: usize) -> bool {
    program.num_inputs <= MAX_DESC_INPUTS
        && 1 + program.num_inputs + program.outputs.len() <= max_storage_buffers
}

/// Runs `program` over float32 `inputs` broadcast to `shape` (`Backend::fused_elementwise`)
/// as one generated kernel; `None` where the program binds more buffers than the adapter
/// allows (the backend then runs it op by op, `ElementwiseProgram::run_op_by_op`).
pub(crate) fn fused_elementwise(
    program: &ElementwiseProgram,
    inputs: &[In<'_>],
    shape: &[usize],
) -> Result<Option<Vec<WgpuBuffer>>> {
    const OP: &str = "fused_elementwise";
    let layouts = check_inputs(OP, program, inputs, shape)?;
    let gpu = inputs[0].gpu();
    if !fits_one_kernel(program, gpu.max_storage_buffers) {
        return Ok(None);
    }
    let source = fused_source(program)
        .ok_or_else(|| backend_error(format!("{OP}: no float32 kernel for {program:?}")))?;
    let k = gpu.kernel(
        &format!("fused_{program:?}"),
        program.num_inputs,
        program.outputs.len(),
        || source,
    )?;
    let n: usize = shape.iter().product();
    let outputs = program
        .outputs
        .iter()
        .map(|_| output(gpu, Elem::F32, n))
        .collect::<Result<Vec<_>>>()?;
    let mut params = Params::new(n).set(ZERO_SLOT, 0);
    for (k, l) in layouts.iter().enumerate() {
        params = params.table(FIRST_DESC_SLOT + k, &layout_descriptor(l));
    }
    let ins: Vec<&wgpu::Buffer> = inputs.iter().map(|x| x.buf.raw()).collect();
    let outs: Vec<&wgpu::Buffer> = outputs.iter().map(|o| o.raw()).collect();
    run_map(gpu, &k, params, &ins, &outs, false, n)?;
    Ok(Some(outputs))
}

#[cfg(test)]
mod tests {
    use super::*;
    use ferroflow_tensor::{BinaryOp, UnaryOp};

    #[test]
    fn a_program_binding_more_than_the_adapter_allows_runs_step_by_step() {
        let wide = ElementwiseProgram {
            num_inputs: 7,
            steps: (1..7)
                .map(|k| ElementwiseStep::Binary(BinaryOp::Add, if k == 1 { 0 } else { 5 + k }, k))
                .collect(),
            outputs: vec![12],
        };
        assert!(wide.check().is_ok());
        assert!(!fits_one_kernel(&wide, 8));
        assert!(fits_one_kernel(&wide, 16));
        let narrow = ElementwiseProgram {
            num_inputs: 1,
            steps: vec![ElementwiseStep::Unary(UnaryOp::Tanh, 0)],
            outputs: vec![1],
        };
        assert!(fits_one_kernel(&narrow, 8));
    }
}
