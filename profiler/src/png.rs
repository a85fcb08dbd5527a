//! A minimal PNG encoder (8-bit grey, RGB or RGBA; zlib through flate2), for image
//! summaries.

use ferroflow_tensor::{Error, Result};
use std::io::Write;

fn chunk(out: &mut Vec<u8>, kind: &[u8; 4], data: &[u8]) {
    out.extend_from_slice(&(data.len() as u32).to_be_bytes());
    let mut crc = crc32fast::Hasher::new();
    crc.update(kind);
    crc.update(data);
    out.extend_from_slice(kind);
    out.extend_from_slice(data);
    out.extend_from_slice(&crc.finalize().to_be_bytes());
}

/// PNG bytes of `pixels` (row-major `h × w × channels`, channels 1, 3 or 4).
pub fn encode(pixels: &[u8], width: usize, height: usize, channels: usize) -> Result<Vec<u8>> {
    let color = match channels {
        1 => 0u8,
        3 => 2,
        4 => 6,
        c => {
            return Err(Error::invalid(
                "png",
                format!("1, 3 or 4 channels, not {c}"),
            ))
        }
    };
    if pixels.len() != width * height * channels || width == 0 || height == 0 {
        return Err(Error::invalid(
            "png",
            format!(
                "{} bytes do not make a {width}×{height}×{channels} image",
                pixels.len()
            ),
        ));
    }
    let (w32, h32) = match (u32::try_from(width), u32::try_from(height)) {
        (Ok(w), Ok(h)) => (w, h),
        _ => return Err(Error::invalid("png", "image too large for PNG")),
    };
    let mut out = b"\x89PNG\r\n\x1a\n".to_vec();
    let mut header = Vec::with_capacity(13);
    header.extend_from_slice(&w32.to_be_bytes());
    header.extend_from_slice(&h32.to_be_bytes());
    header.extend_from_slice(&[8, color, 0, 0, 0]);
    chunk(&mut out, b"IHDR", &header);
    // Filter type 0 (none) before every row.
    let mut raw = Vec::with_capacity(height * (width * channels + 1));
    for row in pixels.chunks(width * channels) {
        raw.push(0);
        raw.extend_from_slice(row);
    }
    let mut z = flate2::write::ZlibEncoder::new(Vec::new(), flate2::Compression::default());
    z.write_all(&raw)
        .map_err(|e| Error::invalid("png", e.to_string()))?;
    let compressed = z
        .finish()
        .map_err(|e| Error::invalid("png", e.to_string()))?;
    chunk(&mut out, b"IDAT", &compressed);
    chunk(&mut out, b"IEND", &[]);
    Ok(out)
}
