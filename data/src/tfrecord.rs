//! TFRecord files: TensorFlow's record framing, read and written byte for byte as TF does.
//!
//! Each record is `u64 length`, `u32 masked_crc32c(length)`, `length` bytes of data,
//! `u32 masked_crc32c(data)` (little endian), where `masked(c) = ((c >> 15) | (c << 17)) +
//! 0xa282ead8`. A file may be compressed as a whole ([`Compression`]). Reading checks both
//! CRCs: a truncated or corrupted file gives an error naming the record and byte offset,
//! never garbage. ferroflow's own record files (`cache_file`, `snapshot`) use the same framing.
//!
//! ```
//! ferroflow::init();
//! use ferroflow_data::tfrecord::{Compression, TfRecordWriter};
//! use ferroflow_data::Dataset;
//! let path = std::env::temp_dir().join("ferroflow-doc.tfrecord");
//! let mut w = TfRecordWriter::create(&path, Compression::None)?;
//! w.write(b"hello")?;
//! w.write(b"world")?;
//! w.finish()?;
//! let records: Vec<Vec<u8>> = Dataset::tfrecord(&[&path], Compression::None)
//!     .iter()
//!     .collect::<Result<_, _>>()?;
//! assert_eq!(records, vec![b"hello".to_vec(), b"world".to_vec()]);
//! # Ok::<(), ferroflow_tensor::Error>(())
//! ```

use std::fs::File;
use std::io::{BufRead, BufReader, Read, Write};
use std::path::{Path, PathBuf};

use ferroflow_tensor::fs::AtomicFile;
use ferroflow_tensor::{Error, Result};

use crate::dataset::{at_element, Cardinality, Dataset};

/// Whole-file compression of a record file (TF's `compression_type`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub enum Compression {
    /// Plain (`""`).
    #[default]
    None,
    /// `"GZIP"`.
    Gzip,
    /// `"ZLIB"`.
    Zlib,
    /// Snappy framing format (what `snapshot`'s `"AUTO"` means in TF; TF's TFRecord readers
    /// do not read it).
    Snappy,
}

impl Compression {
    /// TF's name for it.
    pub fn name(self) -> &'static str {
        match self {
            Compression::None => "",
            Compression::Gzip => "GZIP",
            Compression::Zlib => "ZLIB",
            Compression::Snappy => "SNAPPY",
        }
    }
    /// Parses TF's names (`""`, `"NONE"`, `"GZIP"`, `"ZLIB"`, `"SNAPPY"`, `"AUTO"` = Snappy).
    pub fn parse(name: &str) -> Result<Compression> {
        Ok(match name.to_ascii_uppercase().as_str() {
            "" | "NONE" => Compression::None,
            "GZIP" => Compression::Gzip,
            "ZLIB" => Compression::Zlib,
            "SNAPPY" | "AUTO" => Compression::Snappy,
            _ => {
                return Err(Error::InvalidArgument {
                    op: "compression",
                    msg: format!(
                        "unknown compression {name:?}, expected \"\", GZIP, ZLIB, SNAPPY or AUTO"
                    ),
                })
            }
        })
    }
}

// ---------------------------------------------------------------- CRC32C

/// CRC-32C (Castagnoli) of `data`, through the `crc32c` crate (the SSE4.2 and ARMv8 CRC
/// instructions where the CPU has them, a table elsewhere).
pub fn crc32c(data: &[u8]) -> u32 {
    crc32c::crc32c(data)
}

/// TFRecord's masked CRC: the CRC-32C rotated and offset, so CRCs of data holding CRCs stay
/// strong.
pub fn masked_crc32c(data: &[u8]) -> u32 {
    let c = crc32c(data);
    (c.rotate_right(15)).wrapping_add(0xa282_ead8)
}

// ---------------------------------------------------------------- writing

enum Sink {
    Plain(AtomicFile),
    Gzip(flate2::write::GzEncoder<AtomicFile>),
    Zlib(flate2::write::ZlibEncoder<AtomicFile>),
    Snappy(Box<snap::write::FrameEncoder<AtomicFile>>),
}

impl Sink {
    fn writer(&mut self) -> &mut dyn Write {
        match self {
            Sink::Plain(w) => w,
            Sink::Gzip(w) => w,
            Sink::Zlib(w) => w,
            Sink::Snappy(w) => w.as_mut(),
        }
    }
}

/// Writes records to a file (`tf.io.TFRecordWriter`). Call [`finish`](Self::finish) to
/// flush and see write errors; dropping it finishes too but loses them. The file appears
/// whole or not at all: records go to a temporary file that `finish` moves into place
/// (a process killed while writing leaves the previous file, if any, untouched).
pub struct TfRecordWriter {
    sink: Option<Sink>,
    path: PathBuf,
    bytes_written: u64,
}

impl TfRecordWriter {
    /// Starts a new `path` (replacing any file there once finished).
    pub fn create(path: impl AsRef<Path>, compression: Compression) -> Result<TfRecordWriter> {
        let path = path.as_ref().to_path_buf();
        let file = AtomicFile::create(&path)?;
        let level = flate2::Compression::default();
        let sink = match compression {
            Compression::None => Sink::Plain(file),
            Compression::Gzip => Sink::Gzip(flate2::write::GzEncoder::new(file, level)),
            Compression::Zlib => Sink::Zlib(flate2::write::ZlibEncoder::new(file, level)),
            Compression::Snappy => Sink::Snappy(Box::new(snap::write::FrameEncoder::new(file))),
        };
        Ok(TfRecordWriter {
            sink: Some(sink),
            path,
            bytes_written: 0,
        })
    }

    /// Appends one record.
    pub fn write(&mut self, record: &[u8]) -> Result<()> {
        let len = (record.len() as u64).to_le_bytes();
        let mut header = [0u8; 12];
        header[..8].copy_from_slice(&len);
        header[8..].copy_from_slice(&masked_crc32c(&len).to_le_bytes());
        let footer = masked_crc32c(record).to_le_bytes();
        let sink = self.sink.as_mut().expect("finish consumes the writer");
        let w = sink.writer();
        w.write_all(&header)
            .and_then(|_| w.write_all(record))
            .and_then(|_| w.write_all(&footer))
            .map_err(|e| Error::io(&self.path, &e))?;
        self.bytes_written += 16 + record.len() as u64;
        Ok(())
    }

    /// Uncompressed bytes written so far (framing included).
    pub fn bytes_written(&self) -> u64 {
        self.bytes_written
    }

    /// Flushes everything (and the compressor's trailer) to disk.
    pub fn finish(mut self) -> Result<()> {
        self.finish_inner()
    }

    fn finish_inner(&mut self) -> Result<()> {
        let io = |e: std::io::Error| Error::io(&self.path, &e);
        let file = match self.sink.take() {
            None => return Ok(()),
            Some(Sink::Plain(w)) => w,
            Some(Sink::Gzip(w)) => w.finish().map_err(io)?,
            Some(Sink::Zlib(w)) => w.finish().map_err(io)?,
            Some(Sink::Snappy(w)) => w.into_inner().map_err(|e| io(e.into_error()))?,
        };
        file.commit()
    }
}

impl Drop for TfRecordWriter {
    fn drop(&mut self) {
        let _ = self.finish_inner();
    }
}

// ---------------------------------------------------------------- reading

/// Reads the records of one file in order (`tf.data.TFRecordDataset` over one file). Yields
/// an error for a truncated or corrupt record, then stops.
pub struct TfRecordReader {
    source: Box<dyn BufRead + Send>,
    path: PathBuf,
    record: u64,
    offset: u64,
    done: bool,
}

impl TfRecordReader {
    /// Opens `path`, decompressing as `compression` says.
    pub fn open(path: impl AsRef<Path>, compression: Compression) -> Result<TfRecordReader> {
        let path = path.as_ref().to_path_buf();
        let file = File::open(&path).map_err(|e| Error::io(&path, &e))?;
        let mut plain = BufReader::with_capacity(1 << 16, file);
        if compression == Compression::None {
            let head = plain.fill_buf().map_err(|e| Error::io(&path, &e))?;
            if head.starts_with(&[0x1f, 0x8b]) {
                // Looks compressed; a length read from it would be nonsense, so say so now.
                return Err(Error::format(
                    path.display().to_string(),
                    "the file starts with gzip's magic bytes; read it with Compression::Gzip",
                ));
            }
        }
        let source: Box<dyn BufRead + Send> = match compression {
            Compression::None => Box::new(plain),
            Compression::Gzip => Box::new(BufReader::new(flate2::read::MultiGzDecoder::new(plain))),
            Compression::Zlib => Box::new(BufReader::new(flate2::read::ZlibDecoder::new(plain))),
            Compression::Snappy => Box::new(BufReader::new(snap::read::FrameDecoder::new(plain))),
        };
        Ok(TfRecordReader {
            source,
            path,
            record: 0,
            offset: 0,
            done: false,
        })
    }

    fn corrupt(&self, msg: String) -> Error {
        Error::format(
            self.path.display().to_string(),
            format!("record {} at byte {}: {msg}", self.record, self.offset),
        )
    }

    /// Fills `buf` completely; `Ok(false)` at a clean end of file before the first byte.
    fn read_exact_or_eof(&mut self, buf: &mut [u8], what: &str) -> Result<bool> {
        let mut filled = 0;
        while filled < buf.len() {
            match self.source.read(&mut buf[filled..]) {
                Ok(0) if filled == 0 && what == "header" => return Ok(false),
                Ok(0) => {
                    return Err(self.corrupt(format!(
                        "truncated {what}: {} of {} bytes present",
                        filled,
                        buf.len()
                    )))
                }
                Ok(n) => filled += n,
                Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
                Err(e) => return Err(self.corrupt(format!("cannot read the {what}: {e}"))),
            }
        }
        Ok(true)
    }

    fn read_record(&mut self) -> Result<Option<Vec<u8>>> {
        let mut header = [0u8; 12];
        if !self.read_exact_or_eof(&mut header, "header")? {
            return Ok(None);
        }
        let len_bytes: [u8; 8] = header[..8].try_into().expect("8 bytes");
        let stored = u32::from_le_bytes(header[8..].try_into().expect("4 bytes"));
        let computed = masked_crc32c(&len_bytes);
        if stored != computed {
            return Err(self.corrupt(format!(
                "length CRC mismatch (stored {stored:#010x}, computed {computed:#010x}): the file is corrupt"
            )));
        }
        let len = u64::from_le_bytes(len_bytes);
        let len = usize::try_from(len)
            .ok()
            .filter(|&l| l <= (1 << 40))
            .ok_or_else(|| self.corrupt(format!("record length {len} is implausible")))?;
        // The length is a claim of the file: read what is there (memory grows with the bytes
        // actually present, not with the claim), then check it is all there.
        let mut data = Vec::new();
        if let Err(e) = (&mut self.source).take(len as u64).read_to_end(&mut data) {
            return Err(self.corrupt(format!("cannot read the data: {e}")));
        }
        if data.len() < len {
            return Err(self.corrupt(format!(
                "truncated data: {} of {len} bytes present",
                data.len()
            )));
        }
        let mut footer = [0u8; 4];
        self.read_exact_or_eof(&mut footer, "data CRC")?;
        let stored = u32::from_le_bytes(footer);
        let computed = masked_crc32c(&data);
        if stored != computed {
            return Err(self.corrupt(format!(
                "data CRC mismatch (stored {stored:#010x}, computed {computed:#010x}): the file is corrupt"
            )));
        }
        self.record += 1;
        self.offset += 16 + len as u64;
        Ok(Some(data))
    }
}

impl Iterator for TfRecordReader {
    type Item = Result<Vec<u8>>;
    fn next(&mut self) -> Option<Result<Vec<u8>>> {
        if self.done {
            return None;
        }
        match self.read_record() {
            Ok(Some(r)) => Some(Ok(r)),
            Ok(None) => {
                self.done = true;
                None
            }
            Err(e) => {
                self.done = true;
                Some(Err(e))
            }
        }
    }
}

/// The records of `paths`, file after file, each error marked with its overall record
/// position; iteration stops after an unreadable file or corrupt record.
pub(crate) fn read_files(
    stage: &'static str,
    paths: Vec<PathBuf>,
    compression: Compression,
) -> impl Iterator<Item = Result<Vec<u8>>> + Send {
    let mut files = paths.into_iter();
    let mut current: Option<TfRecordReader> = None;
    let mut index = 0u64;
    let mut failed = false;
    std::iter::from_fn(move || loop {
        if failed {
            return None;
        }
        if let Some(r) = &mut current {
            match r.next() {
                Some(Ok(x)) => {
                    index += 1;
                    return Some(Ok(x));
                }
                Some(Err(e)) => {
                    failed = true;
                    return Some(Err(at_element(stage, index, e)));
                }
                None => current = None,
            }
        }
        let path = files.next()?;
        match TfRecordReader::open(&path, compression) {
            Ok(r) => current = Some(r),
            Err(e) => {
                failed = true;
                return Some(Err(at_element(stage, index, e)));
            }
        }
    })
}

/// A fingerprint piece for files: each path with its size and modification time.
pub(crate) fn files_identity(paths: &[PathBuf]) -> String {
    paths
        .iter()
        .map(|p| crate::dataset::file_stamp(p))
        .collect::<Vec<_>>()
        .join(",")
}

impl Dataset<Vec<u8>> {
    /// The records of TFRecord files, file after file (`tf.data.TFRecordDataset`).
    pub fn tfrecord<P: AsRef<Path>>(paths: &[P], compression: Compression) -> Dataset<Vec<u8>> {
        let paths: Vec<PathBuf> = paths.iter().map(|p| p.as_ref().to_path_buf()).collect();
        let fp_paths = paths.clone();
        Dataset::from_parts(
            Cardinality::Unknown,
            move || {
                Ok(format!(
                    "tfrecord({},{})",
                    files_identity(&fp_paths),
                    compression.name()
                ))
            },
            move || Box::new(read_files("TFRecordDataset", paths.clone(), compression)),
        )
    }
}

#[cfg(test)]
mod tests {
    #[test]
    fn crc32c_gives_the_standard_check_values() {
        // The CRC-32C check value (RFC 3720's test vector "123456789"), the empty string,
        // and TFRecord's masked CRC of a zero length (what TF writes before an empty record;
        // computed by a plain bitwise CRC-32C in Python).
        assert_eq!(super::crc32c(b"123456789"), 0xE306_9283);
        assert_eq!(super::crc32c(b""), 0);
        assert_eq!(super::masked_crc32c(&0u64.to_le_bytes()), 0x0798_0329);
    }
}
