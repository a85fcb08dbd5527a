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
//! assert_eq!(back.files(), vec!["a", "b"]);
//! assert_eq!(back.array("b")?.to_vec::<f32>()?, vec![1.0; 4]);
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

/// The arrays of an `.npz` archive by name (NumPy's `NpzFile`): [`NpzFile::array`] (NumPy's
/// `npz["x"]`), [`NpzFile::get`], [`NpzFile::files`] and iteration in archive order.
///
/// ```
/// ferroflow::init();
/// use ferroflow_numpy as np;
/// let path = std::env::temp_dir().join("ferroflow-npzfile-doc.npz");
/// np::savez(&path, &[("x", &np::arange(0, 3, 1, None)?), ("y", &np::ones(&[2], None)?)])?;
/// let npz = np::load_npz(&path)?;
/// assert_eq!(npz.files(), vec!["x", "y"]);
/// assert_eq!(npz.array("x")?.to_vec::<i64>()?, vec![0, 1, 2]);
/// assert!(npz.get("z").is_none() && npz.array("z").is_err());
/// # std::fs::remove_file(&path).ok();
/// # Ok::<(), np::Error>(())
/// ```
#[derive(Debug, Clone, Default)]
pub struct NpzFile {
    arrays: Vec<(String, Tensor)>,
}

impl NpzFile {
    /// The array named `name`.
    pub fn get(&self, name: &str) -> Option<&Tensor> {
        self.arrays.iter().find(|(n, _)| n == name).map(|(_, t)| t)
    }
    /// The array named `name` (NumPy's `npz[name]`), or an error naming the ones there are
    /// (NumPy's `KeyError`).
    pub fn array(&self, name: &str) -> Result<&Tensor> {
        self.get(name).ok_or_else(|| {
            Error::invalid(
                "load_npz",
                format!(
                    "{name} is not a file in the archive (files: {:?})",
                    self.files()
                ),
            )
        })
    }
    /// The names, in archive order (NumPy's `files`).
    pub fn files(&self) -> Vec<&str> {
        self.arrays.iter().map(|(n, _)| n.as_str()).collect()
    }
    /// How many arrays.
    pub fn len(&self) -> usize {
        self.arrays.len()
    }
    /// No arrays.
    pub fn is_empty(&self) -> bool {
        self.arrays.is_empty()
    }
    /// (name, array) in archive order.
    pub fn iter(&self) -> impl Iterator<Item = (&str, &Tensor)> {
        self.arrays.iter().map(|(n, t)| (n.as_str(), t))
    }
    /// The (name, array) pairs, in archive order.
    pub fn into_vec(self) -> Vec<(String, Tensor)> {
        self.arrays
    }
}

impl IntoIterator for NpzFile {
    type Item = (String, Tensor);
    type IntoIter = std::vec::IntoIter<(String, Tensor)>;
    fn into_iter(self) -> Self::IntoIter {
        self.arrays.into_iter()
    }
}

/// `numpy.load` of an `.npz` archive: its arrays by name (named without `.npy`), in archive
/// order. A corrupt archive or member is an error naming the file and member. Sizes in the
/// archive are claims: memory grows with the bytes a member really holds, and a member larger
/// than [`NPZ_MEMBER_LIMIT`] is an error.
pub fn load_npz(path: impl AsRef<Path>) -> Result<NpzFile> {
    load_npz_with_limit(path, NPZ_MEMBER_LIMIT)
}

/// [`load_npz`] refusing members that decompress to more than `max_member_bytes`.
pub fn load_npz_with_limit(path: impl AsRef<Path>, max_member_bytes: u64) -> Result<NpzFile> {
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
    Ok(NpzFile { arrays: out })
}
