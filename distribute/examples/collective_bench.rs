//! The worker of `cargo xtask bench distribute`, started once per worker by `ferroflow
//! launch` (the gRPC ring) or by `mpirun` (MPI, with the `mpi` feature):
//!
//! - `allreduce MB,MB,.. REPEATS [grpc]`: all-reduces one f32 tensor of each size, `REPEATS`
//!   times after [`ALL_REDUCE_WARM_UP`] untimed calls; rank 0 prints `allreduce BYTES SECONDS` (the median).
//! - `fit none|mwms MNIST_DIR BATCH [grpc]`: Keras `fit` of the MNIST MLP for one epoch
//!   (after a 50-step warm-up) at `BATCH` examples per worker, with no strategy or under
//!   `MultiWorkerMirroredStrategy`; the chief prints `fit SAMPLES_PER_SECOND` over all
//!   workers.
//!
//! A trailing `grpc` turns the ring's shared memory off (`CommunicationOptions::
//! shared_memory`): the messages go over loopback gRPC even though the workers share a host.

use std::time::Instant;

use ferroflow::distribute::{
    CommunicationOptions, MultiWorkerMirroredStrategy, ReduceOp, Strategy,
};
use ferroflow::keras::losses::SparseCategoricalCrossentropy;
use ferroflow::keras::{applications, FitConfig, Model};
use ferroflow::optim::Adam;
use ferroflow::{DType, Error, Result, Tensor};

/// Untimed all-reduces per size before the timed ones (as `xtask/bench/mpi_allreduce.c`, the
/// reference, and OSU's benchmarks do): the first calls of a size pay for first-touch page
/// faults and the transport's setup (over MPI, the first 5-7 calls of 4 MB took twice as
/// long as the later ones: a fresh receive vector each call, until the allocator and MPI
/// settle on reusing its memory).
const ALL_REDUCE_WARM_UP: usize = 10;

fn main() -> Result<()> {
    ferroflow::init();
    let args: Vec<String> = std::env::args().skip(1).collect();
    let bad = || {
        Error::invalid(
            "collective_bench",
            "usage: collective_bench allreduce MB,MB,.. REPEATS [grpc] | fit none|mwms MNIST_DIR BATCH [grpc]",
        )
    };
    let mut args: Vec<&str> = args.iter().map(String::as_str).collect();
    let options = CommunicationOptions {
        shared_memory: args.last() != Some(&"grpc"),
        ..CommunicationOptions::default()
    };
    if !options.shared_memory {
        args.pop();
    }
    match args[..] {
        ["allreduce", sizes, repeats] => {
            let repeats: usize = repeats.parse().map_err(|_| bad())?;
            let strategy = MultiWorkerMirroredStrategy::new(options)?;
            let group = strategy.collectives();
            for mb in sizes.split(',') {
                let mb: f64 = mb.parse().map_err(|_| bad())?;
                let n = (mb * (1 << 20) as f64 / 4.0) as usize;
                let x = ferroflow::random::stateless_normal(&[n], [1, 2], 0.0, 1.0, DType::F32)?;
                for _ in 0..ALL_REDUCE_WARM_UP {
                    group.all_reduce(std::slice::from_ref(&x), ReduceOp::Sum)?;
                }
                let mut times = vec![];
                for _ in 0..repeats {
                    group.barrier()?;
                    let t = Instant::now();
                    group.all_reduce(std::slice::from_ref(&x), ReduceOp::Sum)?;
                    times.push(t.elapsed().as_secs_f64());
                }
                times.sort_by(f64::total_cmp);
                if group.rank() == 0 {
                    println!("allreduce {} {:.6e}", n * 4, times[times.len() / 2]);
                }
            }
            Ok(())
        }
        ["fit", which, dir, batch] => {
            let batch: usize = batch.parse().map_err(|_| bad())?;
            let read =
                |name: &str| ferroflow::data::idx::read(std::path::Path::new(dir).join(name));
            let images = read("train-images-idx3-ubyte.gz")?;
            let n = images.shape()[0];
            let x = images
                .cast(DType::F32)?
                .div(&Tensor::scalar(255.0f32)?)?
                .reshape_to(&[n, 28, 28, 1])?;
            let y = read("train-labels-idx1-ubyte.gz")?.cast(DType::I64)?;
            ferroflow::random::set_seed(1);
            let strategy = match which {
                "mwms" => Some(MultiWorkerMirroredStrategy::new(options)?),
                "none" => None,
                _ => return Err(bad()),
            };
            let workers = strategy.as_ref().map_or(1, |s| s.num_workers());
            let _scope = strategy.as_ref().map(|s| s.scope());
            let mut model = Model::from(applications::mnist_mlp());
            model.build(&[28, 28, 1])?;
            model.compile(
                Adam::new(1e-3),
                SparseCategoricalCrossentropy::new(true),
                &["accuracy"],
            )?;
            let global = batch * workers;
            let config = || FitConfig::new().epochs(1).batch_size(global).verbose(0);
            model.fit(&x, &y, config().steps_per_epoch(50))?;
            let t = Instant::now();
            model.fit(&x, &y, config())?;
            let secs = t.elapsed().as_secs_f64();
            if strategy.as_ref().is_none_or(|s| s.is_chief()) {
                println!("fit {:.6e}", n as f64 / secs);
            }
            Ok(())
        }
        _ => Err(bad()),
    }
}
