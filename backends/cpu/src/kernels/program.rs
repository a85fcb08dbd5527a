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
    let chunks = n.div_ceil(CHUNK);
    let chunk_layout = |len: usize| Layout::contiguous(&[len]);
    let per_chunk: Vec<Vec<Vec<T>>> = (0..chunks)
        .into_par_iter()
        .map(|c| {
            let (start, end) = (c * CHUNK, ((c + 1) * CHUNK).min(n));
            let len = end - start;
            let layout = chunk_layout(len);
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
                let v = T::vec_of(out).unwrap_or_default();
                registers.push(Cow::Owned(v));
            }
            program
                .outputs
                .iter()
                .map(|&r| registers[r].to_vec())
                .collect()
        })
        .collect();
    let mut outputs: Vec<Vec<T>> = program
        .outputs
        .iter()
        .map(|_| Vec::with_capacity(n))
        .collect();
    for chunk in per_chunk {
        for (o, part) in outputs.iter_mut().zip(chunk) {
            if part.len() > CHUNK {
                return Err(Error::Backend {
                    backend: "cpu",
                    msg: "fused_elementwise: a step returned the wrong length".into(),
                });
            }
            o.extend_from_slice(&part);
        }
    }
    if outputs.iter().any(|o| o.len() != n) {
        return Err(Error::Backend {
            backend: "cpu",
            msg: "fused_elementwise: a step returned the wrong length".into(),
        });
    }
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

pub(crate) fn fused_elementwise(
    program: &ElementwiseProgram,
    inputs: &[Operand<'_>],
    shape: &[usize],
) -> Result<Vec<HostData>> {
    let n: usize = shape.iter().product();
    let data = inputs.iter().map(host).collect::<Result<Vec<_>>>()?;
    match data.first() {
        Some(HostData::F32(_)) => {
            let v = data
                .iter()
                .zip(inputs)
                .map(|(d, x)| match d {
                    HostData::F32(v) => broadcast(v, x, shape),
                    _ => Err(unsupported("cpu", "fused_elementwise", x.dtype)),
                })
                .collect::<Result<Vec<_>>>()?;
            Ok(run(program, &v, n)?
                .into_iter()
                .map(HostData::F32)
                .collect())
        }
        Some(HostData::F64(_)) => {
            let v = data
                .iter()
                .zip(inputs)
                .map(|(d, x)| match d {
                    HostData::F64(v) => broadcast(v, x, shape),
                    _ => Err(unsupported("cpu", "fused_elementwise", x.dtype)),
                })
                .collect::<Result<Vec<_>>>()?;
            Ok(run(program, &v, n)?
                .into_iter()
                .map(HostData::F64)
                .collect())
        }
        _ => Err(unsupported(
            "cpu",
            "fused_elementwise",
            inputs
                .first()
                .map_or(ferroflow_tensor::DType::F32, |x| x.dtype),
        )),
    }
}
