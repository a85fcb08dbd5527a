//! Elementwise programs ([`ElementwiseProgram`]) in one pass: the output is cut into
//! cache-sized chunks, threads take chunks, and each chunk runs every step on slices that
//! stay in cache, so intermediates never reach memory. Each step runs the same float kernel
//! as the op alone (`unary_float`, `binary_float`), so fused and unfused results are equal
//! bit for bit.

use super::binary::binary_float;
use super::unary::unary_float;
use crate::buffer::{dense, host};
use crate::num::FloatMath;
use ferroflow_tensor::{
    backend::unsupported, ElementwiseProgram, ElementwiseStep, Error, HostData, Layout, Operand,
    Result,
};
use rayon::prelude::*;
use std::borrow::Cow;

/// Elements per chunk: a few registers of it fit in L2.
const CHUNK: usize = 4096;

fn run<T: FloatMath>(
    program: &ElementwiseProgram,
    inputs: &[Cow<'_, [T]>],
    n: usize,
) -> Result<Vec<Vec<T>>> {
    let layout_of = |len: usize| Layout::contiguous(&[len]);
    // Each output written in place, chunk by chunk: `parts[c]` holds chunk c of every output.
    let mut outputs: Vec<Vec<T>> = program
        .outputs
        .iter()
        .map(|_| crate::block_cache::filled(n, T::ZERO))
        .collect();
    let mut parts: Vec<Vec<&mut [T]>> = (0..n.div_ceil(CHUNK)).map(|_| Vec::new()).collect();
    for o in outputs.iter_mut() {
        for (c, part) in o.chunks_mut(CHUNK).enumerate() {
            parts[c].push(part);
        }
    }
    parts
        .into_par_iter()
        .enumerate()
        .try_for_each(|(c, mut outs)| -> Result<()> {
            let (start, end) = (c * CHUNK, ((c + 1) * CHUNK).min(n));
            let layout = layout_of(end - start);
            let mut registers: Vec<Cow<'_, [T]>> = inputs
                .iter()
                .map(|v| Cow::Borrowed(&v[start..end]))
                .collect();
            for step in &program.steps {
                let out = match *step {
                    ElementwiseStep::Unary(op, a) => unary_float(op, &registers[a]),
                    ElementwiseStep::Binary(op, a, b) => {
                        binary_float(op, &registers[a], &layout, &registers[b], &layout)
                    }
                };
                registers.push(Cow::Owned(T::vec_of(out).unwrap_or_default()));
            }
            for (dst, &r) in outs.iter_mut().zip(&program.outputs) {
                let src = registers
                    .get(r)
                    .filter(|v| v.len() == dst.len())
                    .ok_or_else(|| Error::Backend {
                        backend: "cpu",
                        msg: format!(
                            "fused_elementwise: register {r} is not a chunk of the output"
                        ),
                    })?;
                dst.copy_from_slice(src);
            }
            Ok(())
        })?;
    Ok(outputs)
}

/// Each input's elements broadcast to `shape`, dense (borrowed when already so).
fn broadcast<'a, T: ferroflow_tensor::Element>(
    v: &'a [T],
    x: &Operand<'_>,
    shape: &[usize],
) -> Result<Cow<'a, [T]>> {
    if x.shape() == shape {
        return Ok(dense(v, x.layout));
    }
    let layout = x.layout.broadcast_to("fused_elementwise", shape)?;
    Ok(dense(v, &layout))
}

/// The program over inputs of one element type `T`, read out of `HostData` by `get`.
fn typed<T: FloatMath>(
    program: &ElementwiseProgram,
    data: &[&HostData],
    inputs: &[Operand<'_>],
    shape: &[usize],
    get: fn(&HostData) -> Option<&Vec<T>>,
) -> Result<Vec<Vec<T>>> {
    let v = data
        .iter()
        .zip(inputs)
        .map(|(d, x)| match get(d) {
            Some(v) => broadcast(v, x, shape),
            None => Err(unsupported("cpu", "fused_elementwise", x.dtype)),
        })
        .collect::<Result<Vec<_>>>()?;
    run(program, &v, shape.iter().product())
}

pub(crate) fn fused_elementwise(
    program: &ElementwiseProgram,
    inputs: &[Operand<'_>],
    shape: &[usize],
) -> Result<Vec<HostData>> {
    let data = inputs.iter().map(host).collect::<Result<Vec<_>>>()?;
    match data.first() {
        Some(HostData::F32(_)) => Ok(typed(program, &data, inputs, shape, |d| match d {
            HostData::F32(v) => Some(v),
            _ => None,
        })?
        .into_iter()
        .map(HostData::F32)
        .collect()),
        Some(HostData::F64(_)) => Ok(typed(program, &data, inputs, shape, |d| match d {
            HostData::F64(v) => Some(v),
            _ => None,
        })?
        .into_iter()
        .map(HostData::F64)
        .collect()),
        _ => Err(unsupported(
            "cpu",
            "fused_elementwise",
            inputs
                .first()
                .map_or(ferroflow_tensor::DType::F32, |x| x.dtype),
        )),
    }
}
