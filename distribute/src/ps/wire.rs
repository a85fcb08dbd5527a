//! The messages of the parameter-server protocol: a JSON header (the method's fields) and
//! the tensors it carries, each as dtype, shape and little-endian bytes.
//!
//! Layout: `u32` header length (little-endian), the header (`{"h": <fields>, "t":
//! [{"dtype": "float32", "shape": [..]}, ..]}`), then the tensors' bytes back to back. A
//! message that does not parse, or whose bytes do not match its header, is an error naming
//! what is wrong; nothing in it is trusted to size an allocation before it is checked
//! against the message's length.

use bytes::Bytes;
use ferroflow_tensor::{DType, Error, HostData, Result, Tensor};
use serde::de::DeserializeOwned;
use serde::{Deserialize, Serialize};

#[derive(Serialize, Deserialize)]
struct TensorMeta {
    dtype: String,
    shape: Vec<usize>,
}

#[derive(Serialize)]
struct HeaderOut<'a, H> {
    h: &'a H,
    t: Vec<TensorMeta>,
}

#[derive(Deserialize)]
struct HeaderIn<H> {
    h: H,
    t: Vec<TensorMeta>,
}

/// `header` and `tensors` as one message.
pub(crate) fn encode<H: Serialize>(header: &H, tensors: &[Tensor]) -> Result<Bytes> {
    let meta = tensors
        .iter()
        .map(|t| TensorMeta {
            dtype: t.dtype().to_string(),
            shape: t.shape().to_vec(),
        })
        .collect();
    let head = serde_json::to_vec(&HeaderOut { h: header, t: meta })
        .map_err(|e| Error::invalid("encode", format!("the message header: {e}")))?;
    let data: usize = tensors
        .iter()
        .map(|t| t.num_elements() * t.dtype().size_in_bytes())
        .sum();
    let mut out = Vec::with_capacity(4 + head.len() + data);
    out.extend_from_slice(&(head.len() as u32).to_le_bytes());
    out.extend_from_slice(&head);
    // Each tensor's bytes copied once, from a CPU tensor's storage (else its host copy).
    for t in tensors {
        t.extend_le_bytes(&mut out)?;
    }
    Ok(Bytes::from(out))
}

/// The header and tensors of a message made by [`encode`]; `what` names the message in
/// errors (`"ps.apply request"`).
pub(crate) fn decode<H: DeserializeOwned>(what: &str, bytes: &[u8]) -> Result<(H, Vec<Tensor>)> {
    let bad = |m: String| Error::invalid("decode", format!("malformed {what}: {m}"));
    if bytes.len() < 4 {
        return Err(bad(format!(
            "{} bytes, shorter than its length prefix",
            bytes.len()
        )));
    }
    let head_len = u32::from_le_bytes([bytes[0], bytes[1], bytes[2], bytes[3]]) as usize;
    let rest = &bytes[4..];
    if head_len > rest.len() {
        return Err(bad(format!(
            "the header claims {head_len} bytes, the message has {}",
            rest.len()
        )));
    }
    let header: HeaderIn<H> =
        serde_json::from_slice(&rest[..head_len]).map_err(|e| bad(format!("header: {e}")))?;
    let mut data = &rest[head_len..];
    let mut tensors = Vec::with_capacity(header.t.len().min(data.len() + 1));
    for (i, m) in header.t.iter().enumerate() {
        let dtype = DType::parse(&m.dtype).map_err(|e| bad(format!("tensor {i}: {e}")))?;
        let numel = m
            .shape
            .iter()
            .try_fold(1usize, |a, &d| a.checked_mul(d))
            .ok_or_else(|| bad(format!("tensor {i}: shape {:?} overflows", m.shape)))?;
        let len = numel
            .checked_mul(dtype.size_in_bytes())
            .filter(|&l| l <= data.len())
            .ok_or_else(|| {
                bad(format!(
                    "tensor {i} ({dtype} {:?}) needs more bytes than the {} left",
                    m.shape,
                    data.len()
                ))
            })?;
        let host = HostData::from_le_bytes(dtype, &data[..len])
            .ok_or_else(|| bad(format!("tensor {i}: its bytes are not {dtype} values")))?;
        tensors.push(Tensor::from_host(host, &m.shape)?);
        data = &data[len..];
    }
    if !data.is_empty() {
        return Err(bad(format!("{} bytes after the last tensor", data.len())));
    }
    Ok((header.h, tensors))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[derive(Serialize, Deserialize, PartialEq, Debug)]
    struct H {
        key: String,
    }

    #[test]
    fn messages_round_trip_and_damaged_ones_are_errors() {
        ferroflow::init();
        let a = Tensor::from_slice(&[1.5f32, -2.0, 3.25, 4.0])
            .unwrap()
            .reshape(&[2, 2])
            .unwrap();
        let b = Tensor::scalar(7i64).unwrap();
        let h = H { key: "0:w".into() };
        let m = encode(&h, &[a.clone(), b.clone()]).unwrap();
        let (h2, t): (H, _) = decode("test", &m).unwrap();
        assert_eq!(h2, h);
        assert_eq!(t[0].shape(), &[2, 2]);
        assert_eq!(t[0].to_vec::<f32>().unwrap(), a.to_vec::<f32>().unwrap());
        assert_eq!(t[1].item::<i64>().unwrap(), 7);
        for cut in [0, 3, 10, m.len() - 1] {
            let e = decode::<H>("test", &m[..cut]).unwrap_err().to_string();
            assert!(e.contains("malformed test"), "{e}");
        }
        let mut longer = m.to_vec();
        longer.push(0);
        assert!(decode::<H>("test", &longer).is_err());
        // A header that claims an enormous tensor is refused before anything is allocated.
        let huge = encode(&h, &[]).unwrap();
        let text = String::from_utf8_lossy(&huge[4..]).replace(
            "\"t\":[]",
            "\"t\":[{\"dtype\":\"float32\",\"shape\":[4294967296,4294967296]}]",
        );
        let mut forged = (text.len() as u32).to_le_bytes().to_vec();
        forged.extend_from_slice(text.as_bytes());
        let e = decode::<H>("test", &forged).unwrap_err().to_string();
        assert!(e.contains("tensor 0"), "{e}");
    }
}
