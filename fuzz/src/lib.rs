//! Fuzz targets for every ferroflow reader of outside bytes, and the mutations the stable
//! runner applies.
//!
//! Each [`Target`] feeds one input to one reader the way a user's file reaches it (through
//! a file on disk where the reader takes a path), and checks only that the reader returns
//! `Ok` or `Err`: a panic, an abort (an allocation the memory limit refuses) or a hang is a
//! bug. Seeds are valid files made by ferroflow's own writers, so mutations start from
//! real structure.
//!
//! Two drivers share the targets:
//! - libFuzzer, on nightly Rust: `cargo fuzz run <target> --features libfuzzer` (the
//!   `fuzz_targets/` binaries);
//! - the stable runner `ferroflow-fuzz` (`cargo xtask fuzz`): seeds, then a fixed number of
//!   seeded random mutations per target, under an address-space limit and a per-input
//!   time limit, in CI.
//!
//! ```
//! ferroflow_fuzz::run_target("npy", b"\x93NUMPY\x01\x00garbage");
//! assert!(ferroflow_fuzz::TARGETS.iter().any(|t| t.name == "model_config"));
//! ```

#![warn(missing_docs)]

use std::path::{Path, PathBuf};
use std::sync::OnceLock;

use ferroflow_data::{npy, tfrecord, Dataset};
use ferroflow_keras::layers::Dense;
use ferroflow_keras::losses::MeanSquaredError;
use ferroflow_keras::{sequential, Model};
use ferroflow_tensor::{DType, Tensor};

/// One reader under test.
pub struct Target {
    /// The name the runners take (`npy`, `model_config`, ...).
    pub name: &'static str,
    /// Feeds one input to the reader; `Err` is a clean refusal.
    pub run: fn(&[u8]) -> Result<(), String>,
    /// Valid inputs made by ferroflow's writers (each must be read back `Ok`).
    pub seeds: fn() -> Vec<Vec<u8>>,
    /// Repairs checksums after a mutation (the runner applies it to half the inputs), so
    /// that mutated lengths get past the CRCs that guard them and reach the code behind.
    pub fixup: Option<fn(&mut [u8])>,
}

/// Every target.
pub const TARGETS: &[Target] = &[
    Target {
        name: "npy",
        run: |b| npy::parse(b).map(drop),
        seeds: npy_seeds,
        fixup: None,
    },
    Target {
        name: "npz",
        run: npz,
        seeds: npz_seeds,
        fixup: None,
    },
    Target {
        name: "safetensors",
        run: safetensors,
        seeds: safetensors_seeds,
        fixup: None,
    },
    Target {
        name: "model_config",
        run: model_config,
        seeds: model_config_seeds,
        fixup: None,
    },
    Target {
        name: "model_config_cnn",
        run: model_config_cnn,
        seeds: model_config_cnn_seeds,
        fixup: None,
    },
    Target {
        name: "idx",
        run: |b| ferroflow_data::idx::parse(b).map(drop),
        seeds: idx_seeds,
        fixup: None,
    },
    Target {
        name: "tfrecord",
        run: |b| tfrecord_read(b, tfrecord::Compression::None),
        seeds: || tfrecord_seeds(tfrecord::Compression::None),
        fixup: Some(fix_tfrecord_crcs),
    },
    Target {
        name: "tfrecord_gzip",
        run: |b| tfrecord_read(b, tfrecord::Compression::Gzip),
        seeds: || tfrecord_seeds(tfrecord::Compression::Gzip),
        fixup: None,
    },
    Target {
        name: "csv",
        run: csv,
        seeds: csv_seeds,
        fixup: None,
    },
    Target {
        name: "snapshot_shard",
        run: snapshot_shard,
        seeds: snapshot_shard_seeds,
        fixup: Some(fix_tfrecord_crcs),
    },
    Target {
        name: "element",
        run: |b| {
            ferroflow_data::decode_element::<Vec<Tensor>>(b, "element")
                .map(drop)
                .map_err(err)
        },
        seeds: element_seeds,
        fixup: None,
    },
];

/// Runs target `name` on `data` (the libFuzzer entry points call this). Unknown names panic:
/// that is a bug in the caller, not in a reader.
pub fn run_target(name: &str, data: &[u8]) {
    let target = TARGETS
        .iter()
        .find(|t| t.name == name)
        .unwrap_or_else(|| panic!("no fuzz target named {name}"));
    let _ = (target.run)(data);
}

/// The most one tensor may take while a target runs (refused above, cleanly): generous
/// for the seeds, small enough that decoding a hostile input stays fast.
pub const TENSOR_LIMIT_BYTES: u64 = 1 << 20;

fn err(e: ferroflow_tensor::Error) -> String {
    e.to_string()
}

/// This process's scratch folder (on `/dev/shm` where it exists: files are rewritten for
/// every input).
pub fn scratch() -> &'static Path {
    static DIR: OnceLock<PathBuf> = OnceLock::new();
    DIR.get_or_init(|| {
        ferroflow::init();
        let base = Path::new("/dev/shm");
        let base = if base.is_dir() {
            base.to_path_buf()
        } else {
            std::env::temp_dir()
        };
        let d = base.join(format!("ferroflow-fuzz-{}", std::process::id()));
        std::fs::create_dir_all(&d).expect("a scratch folder");
        d
    })
}

/// Writes `data` to the scratch file `name` (where the runner also finds the input that
/// killed the process) and returns its path.
fn input_file(name: &str, data: &[u8]) -> Result<PathBuf, String> {
    let p = scratch().join(name);
    std::fs::write(&p, data).map_err(|e| e.to_string())?;
    Ok(p)
}

fn small_tensors() -> Vec<Tensor> {
    ferroflow::init();
    vec![
        Tensor::from_vec(vec![1.5f32, -2.0, 3.25, 0.0, 7.0, 8.5], &[2, 3]).unwrap(),
        Tensor::from_vec(vec![1i64, 2, 3], &[3]).unwrap(),
        Tensor::from_vec(vec![true, false], &[2, 1]).unwrap(),
        Tensor::from_vec(vec![9u8], &[]).unwrap(),
        Tensor::zeros(&[0, 4], DType::F64).unwrap(),
        Tensor::from_vec(vec![1.0f32, 2.0], &[2])
            .unwrap()
            .cast(DType::F16)
            .unwrap(),
    ]
}

// ---- .npy / .npz --------------------------------------------------------------------

fn npy_seeds() -> Vec<Vec<u8>> {
    let mut seeds: Vec<Vec<u8>> = small_tensors()
        .iter()
        .map(|t| npy::to_bytes(t).unwrap())
        .collect();
    // What NumPy writes and ferroflow does not: big-endian, Fortran order, 16-bit ints.
    let header = |descr: &str, fortran: bool, shape: &str| {
        let mut h = format!(
            "{{'descr': '{descr}', 'fortran_order': {}, 'shape': {shape}, }}",
            if fortran { "True" } else { "False" }
        );
        while (h.len() + 11) % 64 != 0 {
            h.push(' ');
        }
        h.push('\n');
        let mut out = b"\x93NUMPY\x01\x00".to_vec();
        out.extend_from_slice(&(h.len() as u16).to_le_bytes());
        out.extend_from_slice(h.as_bytes());
        out
    };
    let mut be = header(">f8", false, "(2,)");
    be.extend_from_slice(&1.5f64.to_be_bytes());
    be.extend_from_slice(&(-3.0f64).to_be_bytes());
    let mut fortran = header("<i2", true, "(2, 2)");
    for v in [1i16, 2, 3, 4] {
        fortran.extend_from_slice(&v.to_le_bytes());
    }
    seeds.extend([be, fortran]);
    seeds
}

fn npz(data: &[u8]) -> Result<(), String> {
    let p = input_file("input.npz", data)?;
    ferroflow_numpy::load_npz_with_limit(&p, TENSOR_LIMIT_BYTES)
        .map(drop)
        .map_err(err)
}

fn npz_seeds() -> Vec<Vec<u8>> {
    let ts = small_tensors();
    let named: Vec<(String, &Tensor)> = ts
        .iter()
        .enumerate()
        .filter(|(_, t)| t.dtype() != DType::BF16)
        .map(|(i, t)| (format!("a{i}"), t))
        .collect();
    let refs: Vec<(&str, &Tensor)> = named.iter().map(|(n, t)| (n.as_str(), *t)).collect();
    let mut out = vec![];
    for compressed in [false, true] {
        let p = scratch().join(format!("seed-{compressed}.npz"));
        if compressed {
            ferroflow_numpy::savez_compressed(&p, &refs).unwrap();
        } else {
            ferroflow_numpy::savez(&p, &refs).unwrap();
        }
        out.push(std::fs::read(&p).unwrap());
    }
    out
}

// ---- safetensors weights and whole models ---------------------------------------------

fn safetensors(data: &[u8]) -> Result<(), String> {
    let p = input_file("input.safetensors", data)?;
    let saved = ferroflow_keras::saving::load_tensors(&p).map_err(err)?;
    // And assigned to a model, as `load_weights` does.
    let mut m = seed_model();
    m.load_weights(&p).map_err(err)?;
    drop(saved);
    Ok(())
}

/// A small compiled model (Dense 3 → 4 → 2, Adam), trained one step so it has optimizer
/// state.
fn seed_model() -> Model {
    ferroflow::init();
    let mut m = Model::from(sequential![Dense::new(4), Dense::new(2)]);
    m.compile(
        ferroflow_optim::Adam::new(0.01),
        MeanSquaredError::new(),
        &[],
    )
    .unwrap();
    let x = Tensor::zeros(&[2, 3], DType::F32).unwrap();
    let y = Tensor::zeros(&[2, 2], DType::F32).unwrap();
    m.fit(
        &x,
        &y,
        ferroflow_keras::FitConfig::new().batch_size(2).verbose(0),
    )
    .unwrap();
    m
}

fn safetensors_seeds() -> Vec<Vec<u8>> {
    let p = scratch().join("seed.safetensors");
    seed_model().save_weights(&p).unwrap();
    vec![std::fs::read(&p).unwrap()]
}

/// The folder a saved seed model lives in; targets replace its `config.json`.
fn model_dir() -> &'static Path {
    static DIR: OnceLock<PathBuf> = OnceLock::new();
    DIR.get_or_init(|| {
        let d = scratch().join("model");
        seed_model().save(&d).unwrap();
        d
    })
}

/// Loads the saved model in `dir` with `data` as its `config.json`.
fn load_with_config(dir: &Path, data: &[u8]) -> Result<(), String> {
    std::fs::write(dir.join("config.json"), data).map_err(|e| e.to_string())?;
    Model::load(dir).map(drop).map_err(err)
}

/// The `config.json` the seed model in `dir` was saved with.
fn saved_config(dir: &Path) -> Vec<Vec<u8>> {
    vec![std::fs::read(dir.join("config.json")).unwrap()]
}

fn model_config(data: &[u8]) -> Result<(), String> {
    load_with_config(model_dir(), data)
}

fn model_config_seeds() -> Vec<Vec<u8>> {
    saved_config(model_dir())
}

/// A saved convolutional seed model (Conv2D, MaxPooling2D, Flatten, Dense on 6x6x1 images),
/// whose config names kernel, pool and stride sizes.
fn cnn_dir() -> &'static Path {
    static DIR: OnceLock<PathBuf> = OnceLock::new();
    DIR.get_or_init(|| {
        use ferroflow_keras::layers::{Conv2D, Flatten, MaxPooling2D};
        ferroflow::init();
        let mut m = Model::from(sequential![
            Conv2D::new(2, [3, 3]),
            MaxPooling2D::new([2, 2]),
            Flatten::new(),
            Dense::new(2),
        ]);
        m.build(&[6, 6, 1]).unwrap();
        let d = scratch().join("cnn");
        m.save(&d).unwrap();
        d
    })
}

fn model_config_cnn(data: &[u8]) -> Result<(), String> {
    load_with_config(cnn_dir(), data)
}

fn model_config_cnn_seeds() -> Vec<Vec<u8>> {
    saved_config(cnn_dir())
}

// ---- IDX, TFRecord, CSV ---------------------------------------------------------------

fn idx_seeds() -> Vec<Vec<u8>> {
    let ts = [
        Tensor::from_vec(vec![1u8, 2, 3, 4, 5, 6], &[2, 3]).unwrap(),
        Tensor::from_vec(vec![1.5f32, -2.0], &[2]).unwrap(),
        Tensor::from_vec(vec![7i32, 8, 9, 10], &[2, 1, 2]).unwrap(),
    ];
    ts.iter()
        .map(|t| {
            let p = scratch().join("seed.idx");
            ferroflow_data::idx::write(&p, t).unwrap();
            std::fs::read(&p).unwrap()
        })
        .collect()
}

fn tfrecord_read(data: &[u8], compression: tfrecord::Compression) -> Result<(), String> {
    let p = input_file(&format!("input-{}.tfrecord", compression.name()), data)?;
    let reader = tfrecord::TfRecordReader::open(&p, compression).map_err(err)?;
    for record in reader {
        record.map_err(err)?;
    }
    Ok(())
}

fn tfrecord_seeds(compression: tfrecord::Compression) -> Vec<Vec<u8>> {
    let p = scratch().join(format!("seed-{}.tfrecord", compression.name()));
    let mut w = tfrecord::TfRecordWriter::create(&p, compression).unwrap();
    for r in [&b"first record"[..], b"", &[0u8; 40], b"last"] {
        w.write(r).unwrap();
    }
    w.finish().unwrap();
    vec![std::fs::read(&p).unwrap()]
}

fn csv(data: &[u8]) -> Result<(), String> {
    use ferroflow_data::csv::{CsvColumn, CsvOptions};
    let p = input_file("input.csv", data)?;
    let options = CsvOptions {
        columns: vec![
            CsvColumn::with_default(DType::F32, 0.0),
            CsvColumn::required(DType::I32),
            CsvColumn::with_default(DType::I64, -1.0),
        ],
        header: true,
        ..CsvOptions::default()
    };
    for row in Dataset::csv(&[&p], options).iter() {
        row.map_err(err)?;
    }
    Ok(())
}

fn csv_seeds() -> Vec<Vec<u8>> {
    vec![
        b"x,label,id\n1.5,3,7\n,4,\n\"2.5\",5,9\n-1e3,0,100000\n".to_vec(),
        b"a,b,c\r\n0.25,1,2\r\n".to_vec(),
    ]
}

// ---- snapshots and encoded elements ---------------------------------------------------

/// A finished snapshot of a small dataset, and the path of its one shard file.
fn snapshot_parts() -> &'static (Dataset<Vec<Tensor>>, PathBuf) {
    static PARTS: OnceLock<(Dataset<Vec<Tensor>>, PathBuf)> = OnceLock::new();
    PARTS.get_or_init(|| {
        let root = scratch().join("snapshot");
        let elements = vec![
            Tensor::from_vec(vec![1.0f32, 2.0, 3.0, 4.0], &[4, 1]).unwrap(),
            Tensor::from_vec(vec![5i64, 6, 7, 8], &[4]).unwrap(),
        ];
        let ds = Dataset::from_tensor_slices(elements)
            .unwrap()
            .snapshot(&root, tfrecord::Compression::None);
        for e in ds.iter() {
            e.unwrap();
        }
        let shard = find_file(&root, "shard_00000.snapshot").expect("the snapshot wrote a shard");
        (ds, shard)
    })
}

fn find_file(dir: &Path, name: &str) -> Option<PathBuf> {
    for e in std::fs::read_dir(dir).ok()?.flatten() {
        let p = e.path();
        if p.is_dir() {
            if let Some(f) = find_file(&p, name) {
                return Some(f);
            }
        } else if e.file_name() == name {
            return Some(p);
        }
    }
    None
}

fn snapshot_shard(data: &[u8]) -> Result<(), String> {
    let (ds, shard) = snapshot_parts();
    std::fs::write(shard, data).map_err(|e| e.to_string())?;
    for e in ds.iter() {
        e.map_err(err)?;
    }
    Ok(())
}

fn snapshot_shard_seeds() -> Vec<Vec<u8>> {
    vec![std::fs::read(&snapshot_parts().1).unwrap()]
}

fn element_seeds() -> Vec<Vec<u8>> {
    let ts = small_tensors();
    vec![
        ferroflow_data::encode_element(&ts).unwrap(),
        ferroflow_data::encode_element(&ts[..1].to_vec()).unwrap(),
    ]
}

/// Recomputes the masked CRC-32C of every TFRecord length and of every record's data
/// that is wholly present, walking the records as a reader would.
pub fn fix_tfrecord_crcs(v: &mut [u8]) {
    let mut at = 0usize;
    while at + 12 <= v.len() {
        let len_bytes: [u8; 8] = v[at..at + 8].try_into().expect("8 bytes");
        let crc = tfrecord::masked_crc32c(&len_bytes).to_le_bytes();
        v[at + 8..at + 12].copy_from_slice(&crc);
        let len = u64::from_le_bytes(len_bytes);
        let Some(end) = usize::try_from(len)
            .ok()
            .and_then(|l| (at + 12).checked_add(l))
            .filter(|&e| e + 4 <= v.len())
        else {
            return;
        };
        let crc = tfrecord::masked_crc32c(&v[at + 12..end]).to_le_bytes();
        v[end..end + 4].copy_from_slice(&crc);
        at = end + 4;
    }
}

// ---- mutations -------------------------------------------------------------------------

/// A small deterministic generator (splitmix64): the same seed gives the same inputs.
pub struct Rng(u64);

impl Rng {
    /// A generator from a seed.
    pub fn new(seed: u64) -> Rng {
        Rng(seed)
    }
    /// The next 64 random bits.
    pub fn next_u64(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }
    /// A number below `n` (0 when `n` is 0).
    pub fn below(&mut self, n: usize) -> usize {
        if n == 0 {
            0
        } else {
            (self.next_u64() % n as u64) as usize
        }
    }
}

/// Integers that sit on size and sign boundaries: where length checks go wrong.
const INTERESTING: [u64; 14] = [
    0,
    1,
    0x7f,
    0xff,
    0xffff,
    0x7fff_ffff,
    0x8000_0000,
    0xffff_ffff,
    1 << 32,
    1 << 40,
    1 << 62,
    1 << 63,
    u64::MAX - 1,
    u64::MAX,
];

/// Text that breaks numbers and names in headers, JSON and CSV.
const TOKENS: [&str; 12] = [
    "99999999999999999999",
    "4294967296",
    "9223372036854775808",
    "-1",
    "1e308",
    "NaN",
    "é",
    "\u{1F600}",
    "\"",
    "}",
    "[",
    "(18446744073709551615,)",
];

/// `input` changed by one to four random edits (bit flips, boundary integers in 1/2/4/8
/// bytes of either order, insertions, deletions, truncation, duplication, splices with
/// `other`, hostile text tokens).
pub fn mutate(rng: &mut Rng, input: &[u8], other: &[u8]) -> Vec<u8> {
    let mut v = input.to_vec();
    for _ in 0..1 + rng.below(4) {
        let at = rng.below(v.len() + 1);
        match rng.below(10) {
            0 if !v.is_empty() => {
                let i = rng.below(v.len());
                v[i] ^= 1 << rng.below(8);
            }
            1 if !v.is_empty() => {
                let i = rng.below(v.len());
                v[i] = rng.next_u64() as u8;
            }
            2 | 3 => {
                let width = [1, 2, 4, 8][rng.below(4)];
                let value = INTERESTING[rng.below(INTERESTING.len())];
                let bytes = if rng.below(2) == 0 {
                    value.to_le_bytes()
                } else {
                    value.to_be_bytes()
                };
                let bytes = if rng.below(2) == 0 {
                    &bytes[..width]
                } else {
                    &bytes[8 - width..]
                };
                let end = (at + width).min(v.len());
                v.splice(at..end, bytes.iter().copied());
            }
            4 => {
                let n = 1 + rng.below(16);
                let bytes: Vec<u8> = (0..n).map(|_| rng.next_u64() as u8).collect();
                v.splice(at..at, bytes);
            }
            5 if !v.is_empty() => {
                let end = (at + 1 + rng.below(32)).min(v.len());
                v.drain(at.min(end)..end);
            }
            6 => v.truncate(at),
            7 if !v.is_empty() => {
                let start = rng.below(v.len());
                let end = (start + 1 + rng.below(64)).min(v.len());
                let chunk = v[start..end].to_vec();
                v.splice(at..at, chunk);
            }
            8 if !other.is_empty() => {
                let from = rng.below(other.len());
                v.truncate(at);
                v.extend_from_slice(&other[from..]);
            }
            _ => {
                // Replace a run of digits (a size in text) with a hostile token.
                let token = TOKENS[rng.below(TOKENS.len())].as_bytes();
                let start = (at..v.len())
                    .find(|&i| v[i].is_ascii_digit())
                    .unwrap_or(at.min(v.len()));
                let end = (start..v.len())
                    .find(|&i| !v[i].is_ascii_digit())
                    .unwrap_or(v.len());
                v.splice(start..end, token.iter().copied());
            }
        }
    }
    v
}
