//! The measuring side of `cargo xtask bench data-service`: MNIST's training split in
//! batches of 128 (`u8` images and `int64` labels: the built-in `mnist` pipeline, one
//! `from_tensor_slices` and a `batch`) read in this process, and read through the tf.data
//! service from 1 and 2 worker processes (`ferroflow data-service worker`, with a
//! `ferroflow data-service dispatcher`) on loopback ports the OS picked. Prints one `NAME
//! VALUE` line each:
//!
//! - `ds_local_rate`: batches/s of the pipeline in this process;
//! - `ds_rate_<N>` (`_none`): batches/s through the service from N workers, a distributed
//!   epoch (each batch once), with snappy compression (without: what the default `Auto`
//!   does for workers on loopback);
//!   `ds_rate_1_parallel`: one worker, parallel epochs (the worker reads it all: no
//!   splits);
//! - `ds_first_<N>`: seconds from the iteration's start to its first batch (the job's
//!   creation, the workers' learning of their task and building the pipeline);
//!
//! Rates count from the first batch to the last, so they measure the stream, not the
//! pipeline's building (the in-process pipeline is built before its clock starts).
//!
//! Usage: `service_bench FERROFLOW_BINARY MNIST_DIR`.

use ferroflow_data::service::{self, Compression, DistributeOptions, ProcessingMode};
use ferroflow_tensor::testing::ChildProcess;
use ferroflow_tensor::{Error, Result, Tensor};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

/// Starts `ferroflow data-service ARGS` and returns it (killed when dropped) with the
/// address it printed.
fn server(binary: &str, args: &[&str]) -> Result<(ChildProcess, String)> {
    let (child, line) = ChildProcess::start(
        Command::new(binary)
            .arg("data-service")
            .args(args)
            .stderr(Stdio::inherit()),
        "started on ",
        Duration::from_secs(60),
    )?;
    let address = line
        .split_once("started on ")
        .map(|(_, a)| a.trim().to_string())
        .unwrap_or_default();
    Ok((child, address))
}

/// Batches/s from the first batch to the last, and the seconds to the first.
fn rate(ds: &ferroflow_data::Dataset<(Tensor, Tensor)>) -> Result<(f64, f64)> {
    let start = Instant::now();
    let mut it = ds.iter();
    it.next().transpose()?;
    let first = start.elapsed().as_secs_f64();
    let from_first = Instant::now();
    let mut n = 0usize;
    for batch in it {
        batch?;
        n += 1;
    }
    Ok((n as f64 / from_first.elapsed().as_secs_f64(), first))
}

fn main() -> Result<()> {
    ferroflow::init();
    service::register_builtin_pipelines();
    let args: Vec<String> = std::env::args().skip(1).collect();
    let [binary, mnist] = &args[..] else {
        return Err(Error::invalid(
            "service_bench",
            "usage: service_bench FERROFLOW_BINARY MNIST_DIR",
        ));
    };
    let params = serde_json::json!({"dir": mnist, "split": "train", "batch_size": 128});
    let pipeline = service::pipeline::<(Tensor, Tensor)>("mnist", params)?;

    let (local, _) = rate(&pipeline)?;
    println!("ds_local_rate {local}");

    let (_dispatcher, target) = server(binary, &["dispatcher"])?;
    let dispatcher_address = target.trim_start_matches("grpc://").to_string();
    let mut workers = vec![];
    for n in [1, 2] {
        while workers.len() < n {
            workers.push(server(
                binary,
                &["worker", "--dispatcher", &dispatcher_address],
            )?);
        }
        // Let the new worker's first heartbeat register it.
        std::thread::sleep(Duration::from_millis(500));
        let mut runs = vec![
            (ProcessingMode::DistributedEpoch, Compression::Snappy, ""),
            (ProcessingMode::DistributedEpoch, Compression::None, "_none"),
        ];
        if n == 1 {
            runs.push((
                ProcessingMode::ParallelEpochs,
                Compression::Snappy,
                "_parallel",
            ));
        }
        for (mode, compression, suffix) in runs {
            let options = DistributeOptions {
                compression,
                ..Default::default()
            };
            let ds = pipeline.apply(service::distribute_with(mode, &target, options))?;
            let (r, first) = rate(&ds)?;
            println!("ds_rate_{n}{suffix} {r}");
            if suffix.is_empty() {
                println!("ds_first_{n} {first}");
            }
        }
    }
    Ok(())
}
