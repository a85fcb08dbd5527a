//! TensorFlow's "tf.data: build input pipelines" and "TFRecord" tutorials, on MNIST:
//!
//! 1. write the training images as TFRecord shards (each record one encoded
//!    `(image, label)` element; TF would use `tf.train.Example` protos),
//! 2. read them back with `list_files` → `interleave` of TFRecord readers → parallel `map`
//!    (decode, scale to [0, 1]) → `cache` → `shuffle` → `batch` → `prefetch`,
//! 3. train the MNIST MLP with `fit` on that pipeline, evaluate on a test pipeline.
//!
//! Run: `cargo run --release --example data_pipeline [--epochs N] [--out DIR]`.
//! Exits non-zero when test accuracy ends below 97% after 2 epochs (the default) or below
//! 95% after one.

use std::path::{Path, PathBuf};

use ferroflow::data::tfrecord::{Compression, TfRecordWriter};
use ferroflow::data::{decode_element, encode_element, Dataset, AUTOTUNE};
use ferroflow::keras::losses::SparseCategoricalCrossentropy;
use ferroflow::keras::{applications, FitConfig, Model};
use ferroflow::optim::Adam;
use ferroflow::{DType, Error, Result, Tensor};

const SHARDS: usize = 4;

/// Writes `(image, label)` pairs as `SHARDS` TFRecord files, element `i` to shard `i % SHARDS`.
fn write_shards(images: &Tensor, labels: &Tensor, dir: &Path, split: &str) -> Result<()> {
    std::fs::create_dir_all(dir).map_err(|e| Error::io(dir, &e))?;
    let mut writers = (0..SHARDS)
        .map(|s| {
            TfRecordWriter::create(
                dir.join(format!("{split}-{s:02}-of-{SHARDS:02}.tfrecord")),
                Compression::Gzip,
            )
        })
        .collect::<Result<Vec<_>>>()?;
    let pairs = Dataset::from_tensor_slices((images.clone(), labels.clone()))?;
    for (i, pair) in pairs.iter().enumerate() {
        writers[i % SHARDS].write(&encode_element(&pair?)?)?;
    }
    writers.into_iter().try_for_each(TfRecordWriter::finish)
}

/// Record bytes → (image f32 [784] in [0, 1], label i64).
fn parse(record: Vec<u8>) -> Result<(Tensor, Tensor)> {
    let (image, label): (Tensor, Tensor) = decode_element(&record, "MNIST record")?;
    let x = image
        .reshape_to(&[784])?
        .cast(DType::F32)?
        .div(&Tensor::scalar(255.0f32)?)?;
    Ok((x, label.cast(DType::I64)?))
}

/// The input pipeline over the shards of one split.
fn pipeline(dir: &Path, split: &str, training: bool) -> Result<Dataset<(Tensor, Tensor)>> {
    let files = Dataset::list_files(&format!("{}/{split}-*.tfrecord", dir.display()))?;
    let files = if training {
        files.shuffle(SHARDS, Some(1), true)?
    } else {
        files
    };
    let records = files.interleave(
        |path| Ok(Dataset::tfrecord(&[path], Compression::Gzip)),
        SHARDS,
        16,
    )?;
    let examples = records.map_parallel(parse, AUTOTUNE, true).cache();
    let examples = if training {
        examples.shuffle(10_000, Some(2), true)?
    } else {
        examples
    };
    Ok(examples.batch(128, false)?.prefetch(AUTOTUNE))
}

fn main() -> Result<()> {
    ferroflow::init();
    ferroflow::random::set_seed(1);
    let mut epochs = 2;
    let mut out = PathBuf::from("target/data_pipeline");
    let mut args = std::env::args().skip(1);
    while let Some(a) = args.next() {
        let bad = |m: &str| Error::invalid("data_pipeline", m.to_string());
        match a.as_str() {
            "--epochs" => {
                epochs = args
                    .next()
                    .and_then(|v| v.parse().ok())
                    .ok_or_else(|| bad("--epochs needs a number"))?
            }
            "--out" => out = PathBuf::from(args.next().ok_or_else(|| bad("--out needs a path"))?),
            other => {
                return Err(bad(&format!(
                    "unknown argument {other:?}; usage: data_pipeline [--epochs N] [--out DIR]"
                )))
            }
        }
    }
    let mnist = Path::new(env!("CARGO_MANIFEST_DIR")).join("datasets/mnist");
    for split in ["train", "t10k"] {
        let images =
            ferroflow::data::idx::read(mnist.join(format!("{split}-images-idx3-ubyte.gz")))?;
        let labels =
            ferroflow::data::idx::read(mnist.join(format!("{split}-labels-idx1-ubyte.gz")))?;
        let start = std::time::Instant::now();
        write_shards(&images, &labels, &out, split)?;
        println!(
            "{split}: {} examples written to {SHARDS} gzip TFRecord shards in {:.1} s",
            images.shape()[0],
            start.elapsed().as_secs_f64()
        );
    }
    let train = pipeline(&out, "train", true)?;
    let test = pipeline(&out, "t10k", false)?;

    let mut model = Model::from(applications::mnist_mlp());
    model.compile(
        Adam::new(1e-3),
        SparseCategoricalCrossentropy::new(true),
        &["accuracy"],
    )?;
    let start = std::time::Instant::now();
    model.fit_dataset(
        &train,
        FitConfig::new().epochs(epochs).validation_dataset(&test),
    )?;
    let logs = model.evaluate_dataset(&test)?;
    let acc = logs.get("accuracy").unwrap_or(0.0);
    println!(
        "test accuracy {:.2}% after {epochs} epoch(s) on the TFRecord pipeline ({:.1} s)",
        acc * 100.0,
        start.elapsed().as_secs_f64()
    );
    let goal = if epochs >= 2 { 0.97 } else { 0.95 };
    if acc < goal {
        return Err(Error::invalid(
            "data_pipeline",
            format!(
                "test accuracy {:.2}% is below {:.0}%",
                acc * 100.0,
                goal * 100.0
            ),
        ));
    }
    Ok(())
}
