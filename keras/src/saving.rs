//! Weights as safetensors, and whole models as a folder (`config.json` + weights).
//!
//! Tensor names are the weights' paths, `"<layer>/<weight>"` (`"dense/kernel"`), readable
//! from Python with `safetensors.numpy.load_file`. Loading matches by name when every name
//! in the model is in the file, and by position otherwise (as Keras' `load_weights` does
//! for models whose layers were named differently); every weight is checked (shape, dtype)
//! before the first is assigned, so a mismatch leaves the model untouched.

use std::collections::HashMap;
use std::path::Path;

use ferroflow_tensor::{DType, Error, HostData, Result, Tensor, Variable};
use safetensors::tensor::{Dtype as StDtype, TensorView};

fn st_dtype(d: DType) -> Result<StDtype> {
    Ok(match d {
        DType::F16 => StDtype::F16,
        DType::BF16 => StDtype::BF16,
        DType::F32 => StDtype::F32,
        DType::F64 => StDtype::F64,
        DType::I8 => StDtype::I8,
        DType::I32 => StDtype::I32,
        DType::I64 => StDtype::I64,
        DType::U8 => StDtype::U8,
        DType::I16 => StDtype::I16,
        DType::U16 => StDtype::U16,
        DType::U32 => StDtype::U32,
        DType::U64 => StDtype::U64,
        DType::Bool => StDtype::BOOL,
        DType::C64 | DType::C128 => {
            return Err(Error::UnsupportedDType {
                op: "save_weights",
                dtype: d,
                expected: "a real dtype (safetensors has no complex numbers)",
            })
        }
    })
}

fn from_st_dtype(d: StDtype) -> Option<DType> {
    Some(match d {
        StDtype::F16 => DType::F16,
        StDtype::BF16 => DType::BF16,
        StDtype::F32 => DType::F32,
        StDtype::F64 => DType::F64,
        StDtype::I8 => DType::I8,
        StDtype::I32 => DType::I32,
        StDtype::I64 => DType::I64,
        StDtype::U8 => DType::U8,
        StDtype::I16 => DType::I16,
        StDtype::U16 => DType::U16,
        StDtype::U32 => DType::U32,
        StDtype::U64 => DType::U64,
        StDtype::BOOL => DType::Bool,
        _ => return None,
    })
}

/// Writes named tensors to a safetensors file; the order is kept in the metadata
/// (`"ferroflow.order"`, a JSON list) so a positional load can follow it. Crash-safe: the
/// file is written beside `path` and moved over it whole ([`ferroflow_tensor::fs`]).
pub fn save_tensors(path: impl AsRef<Path>, tensors: &[(String, Tensor)]) -> Result<()> {
    let path = path.as_ref();
    let mut seen = std::collections::HashSet::new();
    for (n, _) in tensors {
        if !seen.insert(n.as_str()) {
            return Err(Error::invalid(
                "save_weights",
                format!("two weights are named {n:?}; give the layers distinct names"),
            ));
        }
    }
    let bytes: Vec<(String, DType, Vec<usize>, Vec<u8>)> = tensors
        .iter()
        .map(|(n, t)| {
            Ok((
                n.clone(),
                t.dtype(),
                t.shape().to_vec(),
                t.to_host()?.to_le_bytes(),
            ))
        })
        .collect::<Result<_>>()?;
    let views = bytes
        .iter()
        .map(|(n, d, s, b)| {
            TensorView::new(st_dtype(*d)?, s.clone(), b)
                .map(|v| (n.clone(), v))
                .map_err(|e| Error::format(path.display().to_string(), e.to_string()))
        })
        .collect::<Result<Vec<_>>>()?;
    let order: Vec<&str> = tensors.iter().map(|(n, _)| n.as_str()).collect();
    let meta = HashMap::from([
        ("format".to_string(), "ferroflow".to_string()),
        (
            "ferroflow.order".to_string(),
            serde_json::to_string(&order).expect("a list of strings serializes"),
        ),
    ]);
    let bytes = safetensors::serialize(views, Some(meta))
        .map_err(|e| Error::format(path.display().to_string(), e.to_string()))?;
    ferroflow_tensor::fs::write_atomic(path, &bytes)
}

/// Reads every tensor of a safetensors file, in the saved order when the file has one
/// (`"ferroflow.order"`), else sorted by name.
pub fn load_tensors(path: impl AsRef<Path>) -> Result<Vec<(String, Tensor)>> {
    let path = path.as_ref();
    let what = || path.display().to_string();
    let buf = std::fs::read(path).map_err(|e| Error::io(path, &e))?;
    let (_, meta) = safetensors::SafeTensors::read_metadata(&buf)
        .map_err(|e| Error::format(what(), format!("not a safetensors file: {e}")))?;
    let st = safetensors::SafeTensors::deserialize(&buf)
        .map_err(|e| Error::format(what(), format!("not a safetensors file: {e}")))?;
    let mut names: Vec<String> = st.names().into_iter().map(String::from).collect();
    names.sort();
    if let Some(order) = meta
        .metadata()
        .as_ref()
        .and_then(|m| m.get("ferroflow.order"))
        .and_then(|o| serde_json::from_str::<Vec<String>>(o).ok())
    {
        if order.len() == names.len() && order.iter().all(|n| names.contains(n)) {
            names = order;
        }
    }
    names
        .into_iter()
        .map(|n| {
            let v = st
                .tensor(&n)
                .map_err(|e| Error::format(what(), e.to_string()))?;
            let dtype = from_st_dtype(v.dtype()).ok_or_else(|| {
                Error::format(
                    what(),
                    format!(
                        "tensor {n:?} has dtype {:?}, which ferroflow lacks",
                        v.dtype()
                    ),
                )
            })?;
            let data = HostData::from_le_bytes(dtype, v.data())
                .ok_or_else(|| Error::format(what(), format!("tensor {n:?}: bad {dtype} data")))?;
            let t = Tensor::from_host(data, v.shape())?;
            Ok((n, t))
        })
        .collect()
}

/// Assigns saved tensors to `weights` (name, variable), all or nothing: by name when every
/// weight's name is in `saved`, else by position. The error names the first weight that
/// does not match.
pub fn assign_weights(
    source: &str,
    weights: &[(String, Variable)],
    saved: Vec<(String, Tensor)>,
) -> Result<()> {
    let by_name: HashMap<&str, &Tensor> = saved.iter().map(|(n, t)| (n.as_str(), t)).collect();
    let all_named = weights
        .iter()
        .all(|(n, _)| by_name.contains_key(n.as_str()));
    if !all_named && saved.len() != weights.len() {
        let missing = weights
            .iter()
            .find(|(n, _)| !by_name.contains_key(n.as_str()))
            .map(|(n, _)| n.as_str())
            .unwrap_or("?");
        return Err(Error::format(
            source,
            format!(
                "the model has {} weights and the file {}; first weight not in the file: {missing:?}",
                weights.len(),
                saved.len()
            ),
        ));
    }
    let mut plan = Vec::with_capacity(weights.len());
    for (i, (name, var)) in weights.iter().enumerate() {
        let (saved_name, t) = if all_named {
            (name.as_str(), by_name[name.as_str()])
        } else {
            (saved[i].0.as_str(), &saved[i].1)
        };
        let cur = var.peek();
        if t.shape() != cur.shape() || t.dtype() != cur.dtype() {
            return Err(Error::format(
                source,
                format!(
                    "weight {name:?} is {:?} {} in the model but {saved_name:?} is {:?} {} in the file",
                    cur.shape(),
                    cur.dtype(),
                    t.shape(),
                    t.dtype()
                ),
            ));
        }
        plan.push((var, t.to_device(cur.device())?));
    }
    for (var, t) in plan {
        var.assign(&t)?;
    }
    Ok(())
}
