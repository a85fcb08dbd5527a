//! NumPy's `.npy` format, read and written as NumPy does (format versions 1.0, 2.0 and 3.0):
//! files written here load with `numpy.load`, files NumPy writes load here.
//!
//! | NumPy `descr` | ferroflow dtype |
//! |---|---|
//! | `<f2` `<f4` `<f8` | `F16` `F32` `F64` |
//! | `\|i1` `<i2` `<i4` `<i8` | `I8` `I16` `I32` `I64` |
//! | `\|u1` `<u2` `<u4` `<u8` | `U8` `U16` `U32` `U64` |
//! | `\|b1` | `Bool` |
//! | `<c8`, `<c16` | `C64`, `C128` |
//!
//! Big-endian (`>`) data is swapped on reading; Fortran-ordered arrays are transposed into
//! row-major tensors. `bfloat16` has no NumPy dtype: writing it is an error that says to cast.
//!
//! ```
//! ferroflow::init();
//! use ferroflow_data::npy;
//! let t = ferroflow_tensor::Tensor::from_vec(vec![1.0f32, 2.0, 3.0, 4.0, 5.0, 6.0], &[2, 3])?;
//! let path = std::env::temp_dir().join("ferroflow-doc.npy");
//! npy::write(&path, &t)?;
//! let back = npy::read(&path)?;
//! assert_eq!(back.shape(), &[2, 3]);
//! assert_eq!(back.to_vec::<f32>()?, t.to_vec::<f32>()?);
//! # Ok::<(), ferroflow_tensor::Error>(())
//! ```

use std::path::Path;

use ferroflow_tensor::{DType, Error, HostData, Result, Tensor};

use crate::dataset::Dataset;

const MAGIC: &[u8] = b"\x93NUMPY";

/// Reads a `.npy` file into a tensor.
pub fn read(path: impl AsRef<Path>) -> Result<Tensor> {
    let path = path.as_ref();
    let bytes = std::fs::read(path).map_err(|e| Error::io(path, &e))?;
    parse(&bytes).map_err(|m| Error::format(path.display().to_string(), m))
}

/// Writes `tensor` as a `.npy` file (format 1.0, or 2.0 for very long headers), crash-safely
/// (a new file moved into place).
pub fn write(path: impl AsRef<Path>, tensor: &Tensor) -> Result<()> {
    let path = path.as_ref();
    ferroflow_tensor::fs::write_atomic(path, &to_bytes(tensor)?)
}

/// The bytes of a `.npy` file holding `tensor`.
pub fn to_bytes(tensor: &Tensor) -> Result<Vec<u8>> {
    let descr = match tensor.dtype() {
        DType::F16 => "<f2",
        DType::F32 => "<f4",
        DType::F64 => "<f8",
        DType::I8 => "|i1",
        DType::I16 => "<i2",
        DType::I32 => "<i4",
        DType::I64 => "<i8",
        DType::U8 => "|u1",
        DType::U16 => "<u2",
        DType::U32 => "<u4",
        DType::U64 => "<u8",
        DType::Bool => "|b1",
        DType::C64 => "<c8",
        DType::C128 => "<c16",
        DType::BF16 => {
            return Err(Error::UnsupportedDType {
                op: "npy::write",
                dtype: DType::BF16,
                expected: "a dtype NumPy has (cast bfloat16 to float32 first)",
            })
        }
    };
    let shape = match tensor.shape() {
        [] => "()".to_string(),
        [n] => format!("({n},)"),
        s => format!(
            "({})",
            s.iter()
                .map(|d| d.to_string())
                .collect::<Vec<_>>()
                .join(", ")
        ),
    };
    let dict = format!("{{'descr': '{descr}', 'fortran_order': False, 'shape': {shape}, }}");
    // Pad with spaces so magic + version + length + header is a multiple of 64, ending in \n.
    let (version, len_bytes) = if dict.len() + 1 + 10 <= u16::MAX as usize {
        (1u8, 2)
    } else {
        (2u8, 4)
    };
    let unpadded = MAGIC.len() + 2 + len_bytes + dict.len() + 1;
    let header_len = dict.len() + 1 + (64 - unpadded % 64) % 64;
    let mut out = Vec::with_capacity(MAGIC.len() + 2 + len_bytes + header_len);
    out.extend_from_slice(MAGIC);
    out.extend_from_slice(&[version, 0]);
    if version == 1 {
        out.extend_from_slice(&(header_len as u16).to_le_bytes());
    } else {
        out.extend_from_slice(&(header_len as u32).to_le_bytes());
    }
    out.extend_from_slice(dict.as_bytes());
    out.resize(out.len() + header_len - dict.len() - 1, b' ');
    out.push(b'\n');
    tensor.extend_le_bytes(&mut out)?;
    Ok(out)
}

/// The value of `key` in NumPy's header dict (a Python literal), as text.
fn dict_value<'a>(header: &'a str, key: &str) -> std::result::Result<&'a str, String> {
    let pattern = format!("'{key}'");
    let at = header
        .find(&pattern)
        .ok_or_else(|| format!("the header has no {pattern}: {header:?}"))?;
    let rest = header[at + pattern.len()..].trim_start();
    let rest = rest
        .strip_prefix(':')
        .ok_or_else(|| format!("no ':' after {pattern}"))?
        .trim_start();
    let end = if rest.starts_with('(') {
        rest.find(')').map(|i| i + 1)
    } else if let Some(quote) = rest.chars().next().filter(|c| *c == '\'' || *c == '"') {
        rest[1..].find(quote).map(|i| i + 2)
    } else {
        rest.find([',', '}'])
    };
    let end = end.ok_or_else(|| format!("the value of {pattern} does not end"))?;
    Ok(rest[..end].trim())
}

/// Parses the bytes of a `.npy` file.
pub fn parse(bytes: &[u8]) -> std::result::Result<Tensor, String> {
    if !bytes.starts_with(MAGIC) || bytes.len() < MAGIC.len() + 4 {
        return Err("not a .npy file: it must start with \\x93NUMPY".into());
    }
    let major = bytes[6];
    let (header_len, start) = match major {
        1 => (u16::from_le_bytes([bytes[8], bytes[9]]) as usize, 10),
        2 | 3 if bytes.len() >= 12 => (
            u32::from_le_bytes(bytes[8..12].try_into().expect("4 bytes")) as usize,
            12,
        ),
        _ => {
            return Err(format!(
                "unsupported .npy format version {major}.{}",
                bytes[7]
            ))
        }
    };
    let header = bytes
        .get(start..start + header_len)
        .ok_or_else(|| format!("truncated header: {header_len} bytes announced"))?;
    let header = std::str::from_utf8(header).map_err(|_| "the header is not text".to_string())?;
    let descr = dict_value(header, "descr")?.trim_matches(['\'', '"']);
    let fortran = match dict_value(header, "fortran_order")? {
        "True" => true,
        "False" => false,
        v => return Err(format!("fortran_order must be True or False, got {v}")),
    };
    let shape_text = dict_value(header, "shape")?;
    let shape = shape_text
        .trim_start_matches('(')
        .trim_end_matches(')')
        .split(',')
        .map(str::trim)
        .filter(|s| !s.is_empty())
        .map(|s| s.trim_end_matches('L').parse::<usize>())
        .collect::<std::result::Result<Vec<_>, _>>()
        .map_err(|_| format!("bad shape {shape_text}"))?;
    // The header is text from the file: split at a character boundary (not byte 1).
    let (order, kind) = descr.split_at(descr.chars().next().map_or(0, char::len_utf8));
    let big = match order {
        "<" | "|" | "=" => false,
        ">" => true,
        _ => return Err(format!("unsupported dtype {descr:?}")),
    };
    let n = shape
        .iter()
        .try_fold(1usize, |a, &d| a.checked_mul(d))
        .ok_or_else(|| format!("shape {shape:?} overflows"))?;
    let data = &bytes[start + header_len..];
    let item = |size: usize| -> std::result::Result<Vec<u8>, String> {
        let need = n.checked_mul(size).ok_or("the data size overflows")?;
        if data.len() < need {
            return Err(format!(
                "truncated data: shape {shape:?} of {descr} needs {need} bytes, the file has {}",
                data.len()
            ));
        }
        let mut d = data[..need].to_vec();
        // A complex number is two floats, each swapped on its own.
        let number = if kind.starts_with('c') {
            size / 2
        } else {
            size
        };
        if big && number > 1 {
            d.chunks_exact_mut(number).for_each(|c| c.reverse());
        }
        Ok(d)
    };
    let host = |dtype: DType, size: usize| -> std::result::Result<HostData, String> {
        HostData::from_le_bytes(dtype, &item(size)?).ok_or_else(|| format!("bad {descr} data"))
    };
    let data = match kind {
        "f2" => host(DType::F16, 2)?,
        "f4" => host(DType::F32, 4)?,
        "f8" => host(DType::F64, 8)?,
        "i1" => host(DType::I8, 1)?,
        "i4" => host(DType::I32, 4)?,
        "i8" => host(DType::I64, 8)?,
        "i2" => host(DType::I16, 2)?,
        "u1" => host(DType::U8, 1)?,
        "u2" => host(DType::U16, 2)?,
        "u4" => host(DType::U32, 4)?,
        "u8" => host(DType::U64, 8)?,
        "b1" => host(DType::Bool, 1)?,
        "c8" => host(DType::C64, 8)?,
        "c16" => host(DType::C128, 16)?,
        _ => {
            return Err(format!(
                "dtype {descr:?} has no ferroflow equivalent (supported: f2 f4 f8 i1 i2 i4 i8 u1 u2 u4 u8 b1 c8 c16)"
            ))
        }
    };
    if fortran && shape.len() > 1 {
        let reversed: Vec<usize> = shape.iter().rev().copied().collect();
        let perm: Vec<usize> = (0..shape.len()).rev().collect();
        Tensor::from_host(data, &reversed)
            .and_then(|t| t.transpose(&perm))
            .and_then(|t| t.contiguous())
            .map_err(|e| e.to_string())
    } else {
        Tensor::from_host(data, &shape).map_err(|e| e.to_string())
    }
}

impl Dataset<Tensor> {
    /// The rows (slices along the first axis) of a `.npy` array.
    pub fn from_npy(path: impl AsRef<Path>) -> Result<Dataset<Tensor>> {
        Dataset::from_tensor_slices(read(path)?)
    }

    /// The rows (slices along the first axis) of an IDX file (MNIST's format).
    pub fn from_idx(path: impl AsRef<Path>) -> Result<Dataset<Tensor>> {
        Dataset::from_tensor_slices(crate::idx::read(path)?)
    }
}
