//! NumPy's files: `.npy` ([`save`], [`load`]; the format itself lives in
//! `ferroflow_data::npy`) and `.npz` archives ([`savez`], [`savez_compressed`], [`load_npz`]),
//! which are zip files of `.npy` members, stored or deflated, as `numpy.savez` writes them.
//!
//! ```
//! use ferroflow_numpy as np;
//! ferroflow::init();
//! let dir = std::env::temp_dir();
//! let a = np::arange(0, 6, 1, None)?;
//! let b = np::ones(&[2, 2], np::DType::F32)?;
//! let path = dir.join("ferroflow-doc.npz");
//! np::savez(&path, &[("a", &a), ("b", &b)])?;
//! let back = np::load_npz(&path)?;
//! assert_eq!(back[0].0, "a");
//! assert_eq!(back[1].1.to_vec::<f32>()?, vec![1.0; 4]);
//! # Ok::<(), np::Error>(())
//! ```

use std::io::{Read, Write};
use std::path::Path;

use ferroflow_data::npy;
use ferroflow_tensor::{Error, Result, Tensor};

/// `numpy.save(file, arr)`: one array as `.npy`.
pub fn save(path: impl AsRef<Path>, a: &Tensor) -> Result<()> {
    npy::write(path, a)
}

/// `numpy.load(file)` for `.npy` files (see [`load_npz`] for archives).
pub fn load(path: impl AsRef<Path>) -> Result<Tensor> {
    npy::read(path)
}

fn write_npz(path: &Path, arrays: &[(&str, &Tensor)], compressed: bool) -> Result<()> {
    // Crash-safe: the archive is assembled in memory and moved into place whole.
    let mut zip = zip::ZipWriter::new(std::io::Cursor::new(Vec::new()));
    let method = if compressed {
        zip::CompressionMethod::Deflated
    } else {
        zip::CompressionMethod::Stored
    };
    let options = zip::write::SimpleFileOptions::default()
        .compression_method(method)
        .large_file(true);
    let zerr = |e: zip::result::ZipError| Error::format(path.display().to_string(), e.to_string());
    for (name, a) in arrays {
        let bytes = npy::to_bytes(a)?;
        zip.start_file(format!("{name}.npy"), options)
            .map_err(zerr)?;
        zip.write_all(&bytes).map_err(|e| Error::io(path, &e))?;
    }
    let bytes = zip.finish().map_err(zerr)?.into_inner();
    ferroflow_tensor::fs::write_atomic(path, &bytes)
}

/// `numpy.savez(file, name=arr, ...)`: an uncompressed `.npz` archive of named arrays.
pub fn savez(path: impl AsRef<Path>, arrays: &[(&str, &Tensor)]) -> Result<()> {
    write_npz(path.as_ref(), arrays, false)
}

/// `numpy.savez_compressed`: a deflated `.npz` archive.
pub fn savez_compressed(path: impl AsRef<Path>, arrays: &[(&str, &Tensor)]) -> Result<()> {
    write_npz(path.as_ref(), arrays, true)
}

/// The largest `.npz` member [`load_npz`] decompresses (16 GiB); [`load_npz_with_limit`]
/// sets another.
pub const NPZ_MEMBER_LIMIT: u64 = 16 << 30;

/// `numpy.load` of an `.npz` archive: its arrays in archive order, named without `.npy`.
/// A corrupt archive or member is an error naming the file and member. Sizes in the archive
/// are claims: memory grows with the bytes a member really holds, and a member larger than
/// [`NPZ_MEMBER_LIMIT`] is an error.
pub fn load_npz(path: impl AsRef<Path>) -> Result<Vec<(String, Tensor)>> {
    load_npz_with_limit(path, NPZ_MEMBER_LIMIT)
}

/// [`load_npz`] refusing members that decompress to more than `max_member_bytes`.
pub fn load_npz_with_limit(
    path: impl AsRef<Path>,
    max_member_bytes: u64,
) -> Result<Vec<(String, Tensor)>> {
    let path = path.as_ref();
    let file = std::fs::File::open(path).map_err(|e| Error::io(path, &e))?;
    let what = path.display().to_string();
    let mut zip = zip::ZipArchive::new(file)
        .map_err(|e| Error::format(&what, format!("not a valid .npz (zip) archive: {e}")))?;
    let mut out = Vec::with_capacity(zip.len());
    for i in 0..zip.len() {
        let mut member = zip
            .by_index(i)
            .map_err(|e| Error::format(&what, format!("member {i}: {e}")))?;
        let name = member
            .name()
            .map(|n| n.to_string())
            .unwrap_or_else(|_| format!("member {i}"));
        let claimed = member.size();
        if claimed > max_member_bytes {
            return Err(Error::format(
                &what,
                format!(
                    "member {name} claims {claimed} bytes, over the limit of {max_member_bytes}"
                ),
            ));
        }
        let mut bytes = Vec::new();
        (&mut member)
            .take(claimed)
            .read_to_end(&mut bytes)
            .map_err(|e| Error::format(&what, format!("member {name}: {e}")))?;
        let t = npy::parse(&bytes).map_err(|m| Error::format(format!("{what}: {name}"), m))?;
        out.push((name.strip_suffix(".npy").unwrap_or(&name).to_string(), t));
    }
    Ok(out)
}
