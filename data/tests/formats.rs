//! File formats and persisted pipelines: TFRecord framing and corruption, CSV, `.npy` against
//! real NumPy, `cache_file`, and `snapshot` reuse across processes.

use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;

use ferroflow_data::csv::{CsvColumn, CsvOptions};
use ferroflow_data::tfrecord::{
    crc32c, masked_crc32c, Compression, TfRecordReader, TfRecordWriter,
};
use ferroflow_data::{npy, Dataset, SnapshotOptions};
use ferroflow_tensor::{Complex32, Complex64, DType, Error, HostData, Result, Tensor};

fn init() {
    ferroflow::init();
}

/// A fresh scratch directory, removed when the returned guard drops.
fn tmp(name: &str) -> tempfile::TempDir {
    tempfile::Builder::new()
        .prefix(&format!("ferroflow-data-{name}-"))
        .tempdir()
        .unwrap()
}

fn records(i: usize) -> Vec<u8> {
    (0..i * 7 % 50).map(|b| (b * 31 + i) as u8).collect()
}

fn write_records(path: &Path, n: usize, compression: Compression) {
    let mut w = TfRecordWriter::create(path, compression).unwrap();
    for i in 0..n {
        w.write(&records(i)).unwrap();
    }
    w.finish().unwrap();
}

#[test]
fn crc32c_matches_the_standard_check_value() {
    // RFC 3720's CRC-32C check value, and the empty string.
    assert_eq!(crc32c(b"123456789"), 0xE306_9283);
    assert_eq!(crc32c(b""), 0);
    // 32 zero bytes: RFC 3720 B.4.
    assert_eq!(crc32c(&[0u8; 32]), 0x8A91_36AA);
    assert_eq!(crc32c(&[0xffu8; 32]), 0x62A8_AB43);
    let ascending: Vec<u8> = (0..32).collect();
    assert_eq!(crc32c(&ascending), 0x46DD_794E);
    let c = crc32c(b"123456789");
    assert_eq!(
        masked_crc32c(b"123456789"),
        c.rotate_right(15).wrapping_add(0xa282_ead8)
    );
}

#[test]
fn tfrecord_round_trips_with_every_compression() {
    init();
    let scratch = tmp("tfrecord");
    let dir = scratch.path();
    for compression in [
        Compression::None,
        Compression::Gzip,
        Compression::Zlib,
        Compression::Snappy,
    ] {
        let a = dir.join(format!("a-{}.tfrecord", compression.name()));
        let b = dir.join(format!("b-{}.tfrecord", compression.name()));
        write_records(&a, 20, compression);
        write_records(&b, 3, compression);
        let got: Vec<Vec<u8>> = Dataset::tfrecord(&[&a, &b], compression)
            .iter()
            .collect::<Result<_>>()
            .unwrap();
        let want: Vec<Vec<u8>> = (0..20).chain(0..3).map(records).collect();
        assert_eq!(got, want, "{compression:?}");
    }
    // The plain layout, byte by byte: length, masked CRC of the length, data, masked CRC.
    let p = dir.join("layout.tfrecord");
    let mut w = TfRecordWriter::create(&p, Compression::None).unwrap();
    w.write(b"abc").unwrap();
    w.finish().unwrap();
    let bytes = std::fs::read(&p).unwrap();
    assert_eq!(bytes.len(), 8 + 4 + 3 + 4);
    assert_eq!(&bytes[..8], &3u64.to_le_bytes());
    assert_eq!(
        &bytes[8..12],
        &masked_crc32c(&3u64.to_le_bytes()).to_le_bytes()
    );
    assert_eq!(&bytes[12..15], b"abc");
    assert_eq!(&bytes[15..], &masked_crc32c(b"abc").to_le_bytes());
}

#[test]
fn every_bit_flip_in_a_tfrecord_file_is_detected() {
    init();
    let scratch = tmp("bitflip");
    let dir = scratch.path();
    let path = dir.join("r.tfrecord");
    write_records(&path, 4, Compression::None);
    let good = std::fs::read(&path).unwrap();
    let bad = dir.join("bad.tfrecord");
    for byte in 0..good.len() {
        for bit in 0..8 {
            let mut b = good.clone();
            b[byte] ^= 1 << bit;
            std::fs::write(&bad, &b).unwrap();
            let items: Vec<_> = TfRecordReader::open(&bad, Compression::None)
                .unwrap()
                .collect();
            let err = items
                .iter()
                .find_map(|r| r.as_ref().err())
                .unwrap_or_else(|| panic!("flip of bit {bit} of byte {byte} went unnoticed"));
            let msg = err.to_string();
            assert!(
                msg.contains("CRC mismatch") || msg.contains("truncated"),
                "{msg}"
            );
            // Records before the damaged one still come out intact.
            for (i, r) in items.iter().enumerate() {
                if let Ok(data) = r {
                    assert_eq!(*data, records(i));
                }
            }
        }
    }
}

#[test]
fn a_truncated_tfrecord_file_is_an_error_not_a_short_read() {
    init();
    let scratch = tmp("truncate");
    let dir = scratch.path();
    let path = dir.join("r.tfrecord");
    write_records(&path, 3, Compression::None);
    let good = std::fs::read(&path).unwrap();
    let mut boundaries = vec![0usize];
    for i in 0..3 {
        boundaries.push(boundaries[i] + 16 + records(i).len());
    }
    let cut = dir.join("cut.tfrecord");
    for len in 0..good.len() {
        std::fs::write(&cut, &good[..len]).unwrap();
        let items: Vec<_> = Dataset::tfrecord(&[&cut], Compression::None)
            .iter()
            .collect();
        if boundaries.contains(&len) {
            assert!(
                items.iter().all(|r| r.is_ok()),
                "cut at a record boundary {len}"
            );
        } else {
            let last = items.last().unwrap();
            let msg = last.as_ref().unwrap_err().to_string();
            assert!(
                msg.contains("truncated") && msg.contains("TFRecordDataset: element"),
                "{msg}"
            );
        }
    }
    // A gzip file read as plain says how to read it; a gzip file cut short is an error.
    let gz = dir.join("r.tfrecord.gz");
    write_records(&gz, 30, Compression::Gzip);
    let msg = Dataset::tfrecord(&[&gz], Compression::None)
        .iter()
        .next()
        .unwrap()
        .unwrap_err()
        .to_string();
    assert!(msg.contains("Compression::Gzip"), "{msg}");
    let bytes = std::fs::read(&gz).unwrap();
    std::fs::write(&cut, &bytes[..bytes.len() / 2]).unwrap();
    let items: Vec<_> = Dataset::tfrecord(&[&cut], Compression::Gzip)
        .iter()
        .collect();
    assert!(items.last().unwrap().is_err());
    let missing = Dataset::tfrecord(&[dir.join("nope")], Compression::None);
    assert!(missing.iter().next().unwrap().is_err());
}

#[test]
fn csv_reads_quoted_fields_defaults_and_selected_columns() {
    init();
    let scratch = tmp("csv");
    let dir = scratch.path();
    let a = dir.join("a.csv");
    std::fs::write(
        &a,
        "id,name,score,flag\r\n1,\"Smith, J\",2.5,true\n2,\"say \"\"hi\"\"\",,0\n\n3,\"two\nlines\",-1e3,1\n",
    )
    .unwrap();
    let b = dir.join("b.csv");
    std::fs::write(&b, "id,name,score,flag\n4,x,NA,false\n").unwrap();
    let options = CsvOptions {
        columns: vec![
            CsvColumn::required(DType::I64),
            CsvColumn::with_default(DType::F64, 9.0),
            CsvColumn::required(DType::Bool),
        ],
        header: true,
        select_cols: Some(vec![0, 2, 3]),
        na_value: "NA".into(),
        ..CsvOptions::default()
    };
    let rows: Vec<Vec<Tensor>> = Dataset::csv(&[&a, &b], options.clone())
        .iter()
        .collect::<Result<_>>()
        .unwrap();
    let decoded: Vec<(i64, f64, bool)> = rows
        .iter()
        .map(|r| {
            (
                r[0].item().unwrap(),
                r[1].item().unwrap(),
                r[2].item().unwrap(),
            )
        })
        .collect();
    assert_eq!(
        decoded,
        vec![
            (1, 2.5, true),
            (2, 9.0, false),
            (3, -1000.0, true),
            (4, 9.0, false)
        ]
    );
    assert_eq!(rows[0][0].dtype(), DType::I64);

    // Bad records are errors with file and line; the next records still come.
    let c = dir.join("c.csv");
    std::fs::write(
        &c,
        "1,2.0,true\nx,2.0,true\n3,,true\n4,1.0\n5,1.0,false\n\"open,1,1\n",
    )
    .unwrap();
    let options = CsvOptions {
        columns: vec![
            CsvColumn::required(DType::I32),
            CsvColumn::required(DType::F32),
            CsvColumn::required(DType::Bool),
        ],
        ..CsvOptions::default()
    };
    let items: Vec<_> = Dataset::csv(&[&c], options).iter().collect();
    assert_eq!(items.len(), 6);
    assert!(items[0].is_ok() && items[4].is_ok());
    let msg = |i: usize| items[i].as_ref().unwrap_err().to_string();
    assert!(
        msg(1).contains("line 2") && msg(1).contains("\"x\" is not a valid int32"),
        "{}",
        msg(1)
    );
    assert!(
        msg(2).contains("line 3") && msg(2).contains("no default"),
        "{}",
        msg(2)
    );
    assert!(
        msg(3).contains("3 fields selected") || msg(3).contains("2 fields selected"),
        "{}",
        msg(3)
    );
    assert!(msg(5).contains("never closed"), "{}", msg(5));
    assert!(msg(1).contains(&c.display().to_string()));
}

fn has_numpy() -> bool {
    let ok = Command::new("python3")
        .args(["-c", "import numpy"])
        .status()
        .map(|s| s.success())
        .unwrap_or(false);
    if !ok {
        ferroflow_tensor::testing::skip(
            "FERROFLOW_REQUIRE_NUMPY",
            "python3 with numpy is not installed (pip install numpy; .ci/run does)",
        );
    }
    ok
}

fn python(script: &str, args: &[&str]) -> String {
    let out = Command::new("python3")
        .arg("-c")
        .arg(script)
        .args(args)
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8(out.stdout).unwrap()
}

fn sample_tensors() -> Vec<Tensor> {
    vec![
        Tensor::from_vec(vec![1.5f32, -2.0, 3.25, 0.0, 1e-3, 7.0], &[2, 3]).unwrap(),
        Tensor::from_vec(vec![1.0f64 / 3.0, -1e300], &[2]).unwrap(),
        Tensor::from_host(
            HostData::from_f64_slice(DType::F16, &[0.5, -1.5, 65504.0]),
            &[3, 1, 1],
        )
        .unwrap(),
        Tensor::from_vec(vec![-128i8, 0, 127, 5], &[2, 2]).unwrap(),
        Tensor::from_vec(vec![i32::MIN, 0, i32::MAX], &[3]).unwrap(),
        Tensor::from_vec(vec![i64::MIN, 1 << 40], &[1, 2]).unwrap(),
        Tensor::from_vec(vec![0u8, 255, 17], &[3]).unwrap(),
        Tensor::from_vec(vec![i16::MIN, -1, i16::MAX], &[3]).unwrap(),
        Tensor::from_vec(vec![0u16, u16::MAX], &[2]).unwrap(),
        Tensor::from_vec(vec![0u32, u32::MAX, 7], &[3, 1]).unwrap(),
        Tensor::from_vec(vec![0u64, u64::MAX, 1 << 60], &[3]).unwrap(),
        Tensor::from_vec(vec![true, false, true, true], &[4]).unwrap(),
        Tensor::scalar(42i64).unwrap(),
        Tensor::zeros(&[0, 3], DType::F32).unwrap(),
    ]
}

#[test]
fn npy_round_trips_every_numpy_dtype() {
    init();
    let scratch = tmp("npy");
    let dir = scratch.path();
    for (i, t) in sample_tensors().iter().enumerate() {
        let p = dir.join(format!("{i}.npy"));
        npy::write(&p, t).unwrap();
        let back = npy::read(&p).unwrap();
        assert_eq!(back.dtype(), t.dtype());
        assert_eq!(back.shape(), t.shape());
        assert_eq!(back.to_host().unwrap(), t.to_host().unwrap());
        let data_len = t.num_elements() * t.dtype().size_in_bytes();
        assert_eq!(
            (std::fs::read(&p).unwrap().len() - data_len) % 64,
            0,
            "header aligned to 64"
        );
    }
    let bf = Tensor::zeros(&[2], DType::BF16).unwrap();
    assert!(npy::write(dir.join("bf.npy"), &bf)
        .unwrap_err()
        .to_string()
        .contains("cast bfloat16"));
    // Corrupt files: clear errors.
    let good = npy::to_bytes(&sample_tensors()[0]).unwrap();
    let cases: [(&[u8], &str); 3] = [
        (&good[..good.len() - 1], "truncated data"),
        (&good[..20], "truncated header"),
        (b"PK\x03\x04", "not a .npy file"),
    ];
    for (bytes, want) in cases {
        let msg = npy::parse(bytes).unwrap_err();
        assert!(msg.contains(want), "{msg}");
    }
    let mut swapped = good.clone();
    let at = swapped.windows(3).position(|w| w == b"<f4").unwrap();
    swapped[at..at + 3].copy_from_slice(b"<m8");
    assert!(npy::parse(&swapped)
        .unwrap_err()
        .contains("no ferroflow equivalent"));
    let ds = Dataset::from_npy(dir.join("0.npy")).unwrap();
    assert_eq!(ds.iter().count(), 2);
}

#[test]
fn npy_files_agree_with_real_numpy_both_ways() {
    init();
    if !has_numpy() {
        return;
    }
    let scratch = tmp("npy-numpy");
    let dir = scratch.path();
    // ferroflow writes, NumPy reads and prints dtype, shape and values.
    let tensors = sample_tensors();
    let mut args = Vec::new();
    for (i, t) in tensors.iter().enumerate() {
        let p = dir.join(format!("ours{i}.npy"));
        npy::write(&p, t).unwrap();
        args.push(p.display().to_string());
    }
    let script = "import sys, numpy as np\nfor p in sys.argv[1:]:\n    a = np.load(p)\n    print(a.dtype.str, list(a.shape), [float(v) for v in a.ravel()])";
    let out = python(script, &args.iter().map(String::as_str).collect::<Vec<_>>());
    for (line, t) in out.lines().zip(&tensors) {
        let want_values: Vec<f64> = t.to_f64_vec().unwrap();
        let (descr, rest) = line.split_once(' ').unwrap();
        let want_descr = match t.dtype() {
            DType::F16 => "<f2",
            DType::F32 => "<f4",
            DType::F64 => "<f8",
            DType::I8 => "|i1",
            DType::I32 => "<i4",
            DType::I64 => "<i8",
            DType::U8 => "|u1",
            DType::I16 => "<i2",
            DType::U16 => "<u2",
            DType::U32 => "<u4",
            DType::U64 => "<u8",
            DType::Bool => "|b1",
            DType::C64 => "<c8",
            DType::C128 => "<c16",
            DType::BF16 => unreachable!(),
        };
        assert_eq!(descr, want_descr);
        let (shape, values) = rest.split_once("] ").unwrap();
        assert_eq!(format!("{shape}]"), format!("{:?}", t.shape()));
        let values: Vec<f64> = values
            .trim_matches(['[', ']'])
            .split(", ")
            .filter(|s| !s.is_empty())
            .map(|s| s.parse().unwrap())
            .collect();
        assert_eq!(values, want_values, "{descr}");
    }
    assert_eq!(out.lines().count(), tensors.len());

    // NumPy writes (other byte orders, Fortran order, 16-bit and unsigned types), we read.
    let script = r#"
import sys, numpy as np
d = sys.argv[1]
rng = np.random.default_rng(0)
cases = {
  "f4": rng.standard_normal((3, 4)).astype("<f4"),
  "f8be": rng.standard_normal((5,)).astype(">f8"),
  "fortran": np.asfortranarray(np.arange(24, dtype="<i4").reshape(2, 3, 4)),
  "i2": np.array([-32768, -1, 0, 32767], dtype="<i2"),
  "u2": np.array([0, 65535], dtype="<u2"),
  "u4": np.array([0, 4294967295], dtype="<u4"),
  "u8": np.array([0, 2**64 - 1, 2**60], dtype="<u8"),
  "u2be": np.array([1, 65534], dtype=">u2"),
  "i8be": np.array([[-5, 6]], dtype=">i8"),
  "b1": np.array([True, False]),
  "scalar": np.float32(2.5).reshape(()),
  "empty": np.zeros((0, 2), dtype="<f8"),
  "f2": np.array([1.5, -0.25], dtype="<f2"),
}
for name, a in cases.items():
    np.save(f"{d}/{name}.npy", a)
    print(name, list(a.shape), " ".join(repr(float(v)) for v in np.ascontiguousarray(a).ravel()))
"#;
    let out = python(script, &[&dir.display().to_string()]);
    for line in out.lines() {
        let (name, rest) = line.split_once(' ').unwrap();
        let (shape, values) = rest.split_once(']').unwrap();
        let t = npy::read(dir.join(format!("{name}.npy"))).unwrap();
        // Every integer type reads as itself (no widening).
        let want_dtype = match name {
            "i2" => Some(DType::I16),
            "u2" | "u2be" => Some(DType::U16),
            "u4" => Some(DType::U32),
            "u8" => Some(DType::U64),
            "i8be" => Some(DType::I64),
            _ => None,
        };
        if let Some(d) = want_dtype {
            assert_eq!(t.dtype(), d, "{name}");
        }
        assert_eq!(
            format!("{:?}", t.shape()),
            format!("{shape}]").replace(' ', "").replace(",", ", "),
            "{name}"
        );
        let want: Vec<f64> = values
            .split_whitespace()
            .map(|v| v.parse().unwrap())
            .collect();
        assert_eq!(t.to_f64_vec().unwrap(), want, "{name}");
    }
    assert_eq!(out.lines().count(), 13);
}

#[test]
fn cache_file_persists_after_a_complete_pass_only() {
    init();
    let scratch = tmp("cachefile");
    let dir = scratch.path();
    let calls = Arc::new(AtomicUsize::new(0));
    let c = calls.clone();
    let path = dir.join("cache.records");
    let ds = Dataset::range(0, 10, 1)
        .map(move |x: Tensor| {
            c.fetch_add(1, Ordering::SeqCst);
            Ok((x.clone(), x.cast(DType::F32)?))
        })
        .cache_file(&path);
    assert_eq!(ds.iter().take(4).count(), 4);
    assert!(!path.exists(), "a partial pass leaves no cache file");
    assert_eq!(
        std::fs::read_dir(dir).unwrap().count(),
        0,
        "nor a temporary file"
    );
    let first: Vec<(i64, f32)> = ds
        .iter()
        .map(|r| {
            let (a, b) = r.unwrap();
            (a.item().unwrap(), b.item().unwrap())
        })
        .collect();
    assert!(path.exists());
    let calls_after_write = calls.load(Ordering::SeqCst);
    assert_eq!(calls_after_write, 14);
    let second: Vec<(i64, f32)> = ds
        .iter()
        .map(|r| {
            let (a, b) = r.unwrap();
            (a.item().unwrap(), b.item().unwrap())
        })
        .collect();
    assert_eq!(first, second);
    assert_eq!(
        calls.load(Ordering::SeqCst),
        calls_after_write,
        "read from the file"
    );
    assert_eq!(second[3], (3, 3.0));
}

// ---------------------------------------------------------------- snapshot

static SNAPSHOT_CALLS: AtomicUsize = AtomicUsize::new(0);

fn snapshot_pipeline(dir: &Path, options: SnapshotOptions) -> Dataset<(Tensor, Vec<Tensor>)> {
    Dataset::range(0, 40, 1)
        .map(|x: Tensor| {
            SNAPSHOT_CALLS.fetch_add(1, Ordering::SeqCst);
            let f = x.cast(DType::F32)?;
            Ok((
                x.clone(),
                vec![f.mul(&f)?, Tensor::fill(&[3], 0.5, DType::F64)?],
            ))
        })
        .snapshot_with(dir, options)
}

fn summarize(ds: &Dataset<(Tensor, Vec<Tensor>)>) -> Result<Vec<(i64, f32)>> {
    ds.iter()
        .map(|r| {
            let (a, v) = r?;
            Ok((a.item::<i64>()?, v[0].item::<f32>()?))
        })
        .collect()
}

/// The child half of the cross-process test: iterates the pipeline (all of it, or stops
/// the process in the middle of writing) and prints how many map calls it took.
#[test]
#[ignore = "the child process of the snapshot reuse test; started by it"]
fn snapshot_child_process() {
    let dir = std::env::var("FERROFLOW_SNAPSHOT_TEST_DIR")
        .expect("started by the snapshot reuse test, with FERROFLOW_SNAPSHOT_TEST_DIR");
    init();
    let ds = snapshot_pipeline(
        Path::new(&dir),
        SnapshotOptions {
            compression: Compression::Gzip,
            shard_size_bytes: 300,
        },
    );
    if std::env::var("FERROFLOW_SNAPSHOT_TEST_DIE").is_ok() {
        for (i, r) in ds.iter().enumerate() {
            r.unwrap();
            if i == 20 {
                // Killed mid-write: no destructor, no cleanup.
                std::process::exit(0);
            }
        }
    }
    let summary = summarize(&ds).unwrap();
    println!(
        "CALLS={} SUM={}",
        SNAPSHOT_CALLS.load(Ordering::SeqCst),
        summary.iter().map(|p| p.1).sum::<f32>()
    );
}

fn run_child(dir: &Path, die: bool) -> (usize, String) {
    let mut cmd = Command::new(std::env::current_exe().unwrap());
    cmd.args([
        "--exact",
        "snapshot_child_process",
        "--ignored",
        "--nocapture",
        "--test-threads=1",
    ])
    .env("FERROFLOW_SNAPSHOT_TEST_DIR", dir);
    if die {
        cmd.env("FERROFLOW_SNAPSHOT_TEST_DIE", "1");
    }
    let out = cmd.output().unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let text = String::from_utf8_lossy(&out.stdout).to_string();
    let Some(line) = text
        .lines()
        .find_map(|l| l.split_once("CALLS=").map(|p| p.1))
    else {
        return (usize::MAX, String::new());
    };
    let (calls, sum) = line.split_once(" SUM=").unwrap();
    (calls.parse().unwrap(), sum.to_string())
}

#[test]
fn snapshot_is_written_once_and_read_by_later_processes() {
    init();
    let scratch = tmp("snapshot-procs");
    let dir = scratch.path();
    // A writer killed in the middle leaves nothing that reads as complete.
    let (calls, _) = run_child(dir, true);
    assert_eq!(calls, usize::MAX, "the dying child prints nothing");
    let (calls, sum1) = run_child(dir, false);
    assert_eq!(
        calls, 40,
        "the killed run's files were not read as a snapshot"
    );
    let (calls, sum2) = run_child(dir, false);
    assert_eq!(
        calls, 0,
        "a later process reads the snapshot instead of recomputing"
    );
    assert_eq!(sum1, sum2);
    let fingerprints: Vec<_> = std::fs::read_dir(dir).unwrap().collect();
    assert_eq!(fingerprints.len(), 1);
    let fp_dir = fingerprints[0].as_ref().unwrap().path();
    assert!(fp_dir.join("snapshot.metadata").is_file());
}

#[test]
fn snapshot_reads_back_the_same_elements_and_detects_corruption() {
    init();
    let scratch = tmp("snapshot-corrupt");
    let dir = scratch.path();
    let options = SnapshotOptions {
        compression: Compression::None,
        shard_size_bytes: 256,
    };
    let ds = snapshot_pipeline(dir, options);
    let first = summarize(&ds).unwrap();
    let second = summarize(&ds).unwrap();
    assert_eq!(first, second);
    assert_eq!(first[7], (7, 49.0));
    // Several shards, listed by the metadata.
    let fp_dir = std::fs::read_dir(dir)
        .unwrap()
        .next()
        .unwrap()
        .unwrap()
        .path();
    let run = std::fs::read_dir(&fp_dir)
        .unwrap()
        .map(|e| e.unwrap().path())
        .find(|p| p.is_dir())
        .unwrap();
    let mut shards: Vec<PathBuf> = std::fs::read_dir(&run)
        .unwrap()
        .map(|e| e.unwrap().path())
        .collect();
    shards.sort();
    assert!(shards.len() > 3, "{} shards", shards.len());
    // Cut the last shard short: an error, then the intact file reads again.
    let last = shards.last().unwrap().clone();
    let whole = std::fs::read(&last).unwrap();
    std::fs::write(&last, &whole[..whole.len() - 5]).unwrap();
    let msg = summarize(&ds).unwrap_err().to_string();
    assert!(msg.contains("truncated"), "{msg}");
    std::fs::write(&last, &whole).unwrap();
    assert_eq!(summarize(&ds).unwrap(), first);
    // Flip one bit in the middle of the second shard: an error naming the CRC, not garbage.
    let mut bytes = std::fs::read(&shards[1]).unwrap();
    let mid = bytes.len() / 2;
    bytes[mid] ^= 0x10;
    std::fs::write(&shards[1], &bytes).unwrap();
    let err = summarize(&ds).unwrap_err();
    let msg = err.to_string();
    assert!(
        msg.contains("CRC mismatch") && msg.contains("snapshot: element"),
        "{msg}"
    );
    assert!(matches!(err, Error::Pipeline { .. }));
    // A missing shard is an error too.
    std::fs::remove_file(&shards[2]).unwrap();
    assert!(summarize(&ds).is_err());
}

#[test]
fn a_different_pipeline_gets_its_own_snapshot() {
    init();
    let scratch = tmp("snapshot-keys");
    let dir = scratch.path();
    let a = Dataset::range(0, 5, 1).snapshot(dir, Compression::Snappy);
    let b = Dataset::range(0, 6, 1).snapshot(dir, Compression::Snappy);
    let x = Tensor::from_slice(&[1.0f32, 2.0]).unwrap();
    let c = Dataset::from_tensor_slices(x)
        .unwrap()
        .snapshot(dir, Compression::None);
    let y = Tensor::from_slice(&[1.0f32, 3.0]).unwrap();
    let d = Dataset::from_tensor_slices(y)
        .unwrap()
        .snapshot(dir, Compression::None);
    assert_eq!(a.iter().count(), 5);
    assert_eq!(b.iter().count(), 6);
    assert_eq!(
        c.iter()
            .map(|t| t.unwrap().item::<f32>().unwrap())
            .collect::<Vec<_>>(),
        vec![1.0, 2.0]
    );
    assert_eq!(
        d.iter()
            .map(|t| t.unwrap().item::<f32>().unwrap())
            .collect::<Vec<_>>(),
        vec![1.0, 3.0]
    );
    assert_eq!(
        std::fs::read_dir(dir).unwrap().count(),
        4,
        "four pipelines, four fingerprints"
    );
    assert_eq!(a.iter().count(), 5);
    assert_eq!(b.iter().count(), 6);
    // A pass stopped early publishes nothing and cleans up its run.
    let upstream = Dataset::range(0, 50, 1);
    let scratch = tmp("snapshot-early");
    let e = upstream.snapshot(scratch.path(), Compression::None);
    assert_eq!(e.iter().take(3).count(), 3);
    let fp = upstream.fingerprint().unwrap();
    let fp_dir = scratch.path().join(fp);
    assert!(!fp_dir.join("snapshot.metadata").exists());
    assert_eq!(std::fs::read_dir(&fp_dir).unwrap().count(), 0);
}

/// A snapshot's metadata is a claim: a shard count the run folder cannot back is an error
/// naming it, before a list of that many shard paths is made (2^32 used to abort).
#[test]
fn snapshot_metadata_with_an_impossible_shard_count_is_an_error() {
    init();
    let dir = tmp("snapshot-claims");
    let options = SnapshotOptions {
        compression: Compression::None,
        shard_size_bytes: 300,
    };
    summarize(&snapshot_pipeline(dir.path(), options)).unwrap();
    let meta = std::fs::read_dir(dir.path())
        .unwrap()
        .flatten()
        .map(|e| e.path().join("snapshot.metadata"))
        .find(|p| p.exists())
        .expect("the snapshot wrote its metadata");
    let text = std::fs::read_to_string(&meta).unwrap();
    for claim in ["4294967296", "18446744073709551615", "1000000"] {
        let mut v: serde_json::Value = serde_json::from_str(&text).unwrap();
        v["num_shards"] = serde_json::Value::Number(claim.parse().unwrap());
        std::fs::write(&meta, v.to_string()).unwrap();
        let e = summarize(&snapshot_pipeline(dir.path(), options)).unwrap_err();
        assert!(e.to_string().contains("num_shards"), "{claim}: {e}");
    }
}

#[test]
fn npy_complex_numbers_round_trip_with_real_numpy() {
    init();
    if !has_numpy() {
        return;
    }
    let scratch = tmp("npy-complex");
    let dir = scratch.path();
    // NumPy writes complex64 (little-endian) and complex128 (big-endian: each part swapped
    // on its own), we read; we write them back and NumPy compares.
    let script = r#"
import sys, numpy as np
d = sys.argv[1]
a = (np.arange(6).reshape(2, 3) + 1j * np.arange(6, 12).reshape(2, 3)).astype("<c8")
b = np.array([1.5 - 2.25j, -0.0 + 3e300j], dtype=">c16")
np.save(f"{d}/c8.npy", a)
np.save(f"{d}/c16be.npy", b)
"#;
    python(script, &[&dir.display().to_string()]);
    let a = npy::read(dir.join("c8.npy")).unwrap();
    assert_eq!((a.dtype(), a.shape()), (DType::C64, &[2usize, 3][..]));
    let want: Vec<Complex32> = (0..6)
        .map(|i| Complex32::new(i as f32, (i + 6) as f32))
        .collect();
    assert_eq!(a.to_vec::<Complex32>().unwrap(), want);
    let b = npy::read(dir.join("c16be.npy")).unwrap();
    assert_eq!(b.dtype(), DType::C128);
    assert_eq!(
        b.to_vec::<Complex64>().unwrap(),
        [Complex64::new(1.5, -2.25), Complex64::new(-0.0, 3e300)]
    );
    npy::write(dir.join("ours_c8.npy"), &a).unwrap();
    npy::write(dir.join("ours_c16.npy"), &b).unwrap();
    let check = r#"
import sys, numpy as np
d = sys.argv[1]
a, b = np.load(f"{d}/ours_c8.npy"), np.load(f"{d}/ours_c16.npy")
assert a.dtype == np.complex64 and b.dtype == np.complex128, (a.dtype, b.dtype)
assert (a == np.load(f"{d}/c8.npy")).all() and (b == np.load(f"{d}/c16be.npy")).all()
print("ok")
"#;
    assert_eq!(python(check, &[&dir.display().to_string()]).trim(), "ok");
}
