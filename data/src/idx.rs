//! The IDX file format (LeCun's MNIST format): a big-endian header — two zero bytes, a type
//! code, the number of dimensions, one `u32` per dimension — then the row-major data.
//!
//! [`read`] accepts plain files and gzip-compressed ones (detected by their magic bytes, not
//! by the file name); [`write()`] writes plain IDX.
//!
//! | type code | IDX type | ferroflow dtype |
//! |---|---|---|
//! | 0x08 | unsigned byte | `U8` |
//! | 0x09 | signed byte | `I8` |
//! | 0x0B | i16 | `I16` |
//! | 0x0C | i32 | `I32` |
//! | 0x0D | f32 | `F32` |
//! | 0x0E | f64 | `F64` |
//!
//! ```
//! ferroflow::init();
//! use ferroflow_data::idx;
//! let labels = ferroflow_tensor::Tensor::from_vec(vec![5u8, 0, 4], &[3])?;
//! let path = std::env::temp_dir().join("ferroflow-idx-doc-labels.idx");
//! idx::write(&path, &labels)?;
//! assert_eq!(idx::read(&path)?.to_vec::<u8>()?, vec![5, 0, 4]);
//! # Ok::<(), ferroflow_tensor::Error>(())
//! ```

use std::io::Read;
use std::path::Path;

use ferroflow_tensor::{Error, HostData, Result, Tensor};

/// Reads an IDX file (plain or gzip) into a tensor of its shape.
pub fn read(path: impl AsRef<Path>) -> Result<Tensor> {
    let path = path.as_ref();
    let bytes = read_bytes(path)?;
    parse(&bytes).map_err(|msg| Error::format(path.display().to_string(), msg))
}

/// The file's bytes, gunzipped when they are gzip's.
fn read_bytes(path: &Path) -> Result<Vec<u8>> {
    let raw = std::fs::read(path).map_err(|e| Error::io(path, &e))?;
    let bytes = if raw.starts_with(&[0x1f, 0x8b]) {
        let mut out = Vec::with_capacity(raw.len() * 4);
        flate2::read::GzDecoder::new(&raw[..])
            .read_to_end(&mut out)
            .map_err(|e| {
                Error::format(path.display().to_string(), format!("bad gzip data: {e}"))
            })?;
        out
    } else {
        raw
    };
    Ok(bytes)
}

/// Parses IDX bytes (already decompressed).
pub fn parse(bytes: &[u8]) -> std::result::Result<Tensor, String> {
    let (code, shape, body) = split_idx(bytes)?;
    let data = match code {
        0x08 => HostData::U8(body.to_vec()),
        0x09 => HostData::I8(body.iter().map(|&b| b as i8).collect()),
        0x0B => HostData::I16(
            body.chunks_exact(2)
                .map(|c| i16::from_be_bytes([c[0], c[1]]))
                .collect(),
        ),
        0x0C => HostData::I32(
            body.chunks_exact(4)
                .map(|c| i32::from_be_bytes(c.try_into().unwrap()))
                .collect(),
        ),
        0x0D => HostData::F32(
            body.chunks_exact(4)
                .map(|c| f32::from_be_bytes(c.try_into().unwrap()))
                .collect(),
        ),
        _ => HostData::F64(
            body.chunks_exact(8)
                .map(|c| f64::from_be_bytes(c.try_into().unwrap()))
                .collect(),
        ),
    };
    Tensor::from_host(data, &shape).map_err(|e| e.to_string())
}

/// An IDX file's type code, shape and data bytes, checked against each other.
fn split_idx(bytes: &[u8]) -> std::result::Result<(u8, Vec<usize>, &[u8]), String> {
    if bytes.len() < 4 || bytes[0] != 0 || bytes[1] != 0 {
        return Err("not an IDX file: it must start with two zero bytes".into());
    }
    let code = bytes[2];
    let rank = bytes[3] as usize;
    let header = 4 + 4 * rank;
    if bytes.len() < header {
        return Err(format!(
            "truncated IDX header: {rank} dimensions need {header} bytes, the file has {}",
            bytes.len()
        ));
    }
    let shape: Vec<usize> = (0..rank)
        .map(|i| u32::from_be_bytes(bytes[4 + 4 * i..8 + 4 * i].try_into().unwrap()) as usize)
        .collect();
    let count = shape
        .iter()
        .try_fold(1usize, |a, &d| a.checked_mul(d))
        .ok_or("IDX dimensions overflow")?;
    let width = match code {
        0x08 | 0x09 => 1,
        0x0B => 2,
        0x0C | 0x0D => 4,
        0x0E => 8,
        c => {
            return Err(format!(
                "unknown IDX type code 0x{c:02X} (expected 0x08, 0x09, 0x0B-0x0E)"
            ))
        }
    };
    let body = &bytes[header..];
    let need = count.checked_mul(width).ok_or("IDX dimensions overflow")?;
    if body.len() != need {
        return Err(format!(
            "IDX header says shape {shape:?} ({need} data bytes) but the file has {} data bytes",
            body.len()
        ));
    }
    Ok((code, shape, body))
}

/// Writes `tensor` as a plain IDX file (u8, i8, i16, i32, f32 and f64 tensors).
pub fn write(path: impl AsRef<Path>, tensor: &Tensor) -> Result<()> {
    let path = path.as_ref();
    let (code, body): (u8, Vec<u8>) = match tensor.to_host()? {
        HostData::U8(v) => (0x08, v),
        HostData::I8(v) => (0x09, v.iter().map(|&b| b as u8).collect()),
        HostData::I16(v) => (0x0B, v.iter().flat_map(|x| x.to_be_bytes()).collect()),
        HostData::I32(v) => (0x0C, v.iter().flat_map(|x| x.to_be_bytes()).collect()),
        HostData::F32(v) => (0x0D, v.iter().flat_map(|x| x.to_be_bytes()).collect()),
        HostData::F64(v) => (0x0E, v.iter().flat_map(|x| x.to_be_bytes()).collect()),
        _ => {
            return Err(Error::UnsupportedDType {
                op: "idx::write",
                dtype: tensor.dtype(),
                expected: "uint8, int8, int16, int32, float32 or float64 (the IDX types)",
            })
        }
    };
    if tensor.rank() > 255 || tensor.shape().iter().any(|&d| d > u32::MAX as usize) {
        return Err(Error::invalid(
            "idx::write",
            format!("shape {:?} does not fit the IDX header", tensor.shape()),
        ));
    }
    let mut out = vec![0, 0, code, tensor.rank() as u8];
    for &d in tensor.shape() {
        out.extend_from_slice(&(d as u32).to_be_bytes());
    }
    out.extend_from_slice(&body);
    ferroflow_tensor::fs::write_atomic(path, &out)
}

/// One MNIST split (`"train"` or `"t10k"`) from the folder holding LeCun's four files
/// (`<split>-images-idx3-ubyte[.gz]`, `<split>-labels-idx1-ubyte[.gz]`), prepared as TF's
/// tutorials do: images as f32 in [0, 1], shape `[n, 28, 28, 1]`; labels as int64, `[n]`.
///
/// ```no_run
/// ferroflow::init();
/// let (x, y) = ferroflow_data::idx::load_mnist("datasets/mnist", "t10k")?;
/// assert_eq!(x.shape(), &[10_000, 28, 28, 1]);
/// # Ok::<(), ferroflow_tensor::Error>(())
/// ```
pub fn load_mnist(
    dir: impl AsRef<std::path::Path>,
    split: &str,
) -> ferroflow_tensor::Result<(ferroflow_tensor::Tensor, ferroflow_tensor::Tensor)> {
    use ferroflow_tensor::{DType, Tensor};
    let dir = dir.as_ref();
    let file = |kind: &str| mnist_file(dir, split, kind);
    let (n, pixels) = mnist_images(&file("images-idx3"), |b| b as f32 / 255.0)?;
    let x = Tensor::from_vec(pixels, &[n, 28, 28, 1])?;
    let labels = read(file("labels-idx1"))?;
    Ok((x, labels.cast(DType::I64)?))
}

/// One MNIST split as stored: images as `u8` pixels `[n, 28, 28, 1]` (a quarter of the
/// f32 memory: scale them in the model, e.g. Keras' `Rescaling(1/255)`); labels as int64.
///
/// ```no_run
/// ferroflow::init();
/// let (x, y) = ferroflow_data::idx::load_mnist_pixels("datasets/mnist", "t10k")?;
/// assert_eq!(x.dtype(), ferroflow_tensor::DType::U8);
/// # Ok::<(), ferroflow_tensor::Error>(())
/// ```
pub fn load_mnist_pixels(
    dir: impl AsRef<std::path::Path>,
    split: &str,
) -> ferroflow_tensor::Result<(ferroflow_tensor::Tensor, ferroflow_tensor::Tensor)> {
    use ferroflow_tensor::{DType, Tensor};
    let dir = dir.as_ref();
    let (n, pixels) = mnist_images(&mnist_file(dir, split, "images-idx3"), |b| b)?;
    let x = Tensor::from_vec(pixels, &[n, 28, 28, 1])?;
    let labels = read(mnist_file(dir, split, "labels-idx1"))?;
    Ok((x, labels.cast(DType::I64)?))
}

/// `<dir>/<split>-<kind>-ubyte`, or its `.gz` when the plain file is absent.
fn mnist_file(dir: &Path, split: &str, kind: &str) -> std::path::PathBuf {
    let plain = dir.join(format!("{split}-{kind}-ubyte"));
    if plain.exists() {
        plain
    } else {
        dir.join(format!("{split}-{kind}-ubyte.gz"))
    }
}

/// The images of an MNIST image file, each pixel mapped by `f` in one pass over the file's
/// bytes (no intermediate tensors: the training set is 188 MB as f32).
fn mnist_images<T>(path: &Path, f: impl Fn(u8) -> T) -> Result<(usize, Vec<T>)> {
    let bytes = read_bytes(path)?;
    let bad = |msg: String| Error::format(path.display().to_string(), msg);
    let (code, shape, body) = split_idx(&bytes).map_err(bad)?;
    if code != 0x08 || shape.len() != 3 || shape[1..] != [28, 28] {
        return Err(bad(format!(
            "MNIST images are uint8 [n, 28, 28] (type code 0x08); this file has type code \
             0x{code:02X} and shape {shape:?}"
        )));
    }
    Ok((shape[0], body.iter().map(|&b| f(b)).collect()))
}
