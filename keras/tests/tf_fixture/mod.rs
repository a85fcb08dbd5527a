//! Reading TF's fixtures (`fixtures/*.json`): numbers, shapes and tensors as TF wrote them.

use ferroflow_tensor::{DType, HostData, Tensor};
use serde_json::Value;

/// A JSON list of numbers.
pub fn floats(v: &Value) -> Vec<f64> {
    v.as_array()
        .expect("numbers")
        .iter()
        .map(|x| x.as_f64().expect("a number"))
        .collect()
}

/// A JSON list of dimensions.
pub fn shape(v: &Value) -> Vec<usize> {
    v.as_array()
        .expect("a shape")
        .iter()
        .map(|x| x.as_u64().expect("a dimension") as usize)
        .collect()
}

/// A tensor from `{"dtype", "shape", "data"}`.
pub fn tensor(v: &Value) -> Tensor {
    let dtype = DType::parse(v["dtype"].as_str().unwrap()).unwrap();
    Tensor::from_host(
        HostData::from_f64_slice(dtype, &floats(&v["data"])),
        &shape(&v["shape"]),
    )
    .unwrap()
}
