//! The tasks of `cargo xtask bench ps`, started by `ferroflow launch --chief --workers N --ps
//! 2`: parameter servers serve, workers run the scheduled functions, and the chief measures
//! and prints one `NAME VALUE` line each:
//!
//! - `ps_steps` — steps/s of the MNIST MLP (784-256-128-10, Adam, batch 128 per step) the
//!   chief schedules on the workers (after 50 warm-up steps), as TF's parameter-server
//!   tutorial's custom loop does;
//! - `ps_roundtrip` — seconds for one empty function scheduled and its result fetched, one
//!   at a time (the median of 7 blocks of 100);
//! - `ps_tcp_roundtrip` — seconds for a bare TCP round trip of 64 bytes between the chief and a
//!   child process echoing them (`ps_bench --tcp-echo`), in blocks interleaved with the
//!   previous figure's: the floor under any scheduling round trip on this machine;
//! - `ps_push`, `ps_pull` — bytes/s of assigning and reading a 1 MiB variable on a ps from
//!   the chief.
//!
//! Usage: `ps_bench MNIST_DIR STEPS`.

use ferroflow::cluster::{ClusterResolver, TfConfigClusterResolver};
use ferroflow::data::Dataset;
use ferroflow::distribute::{
    ClusterCoordinator, Functions, MinSizePartitioner, ParameterServerStrategy, PerWorkerIterator,
    Server, Strategy, VariablePartitioner,
};
use ferroflow::keras::losses::{Loss, SparseCategoricalCrossentropy};
use ferroflow::keras::{applications, Layer, Sequential};
use ferroflow::optim::{Adam, Optimizer};
use ferroflow::prelude::{GradientTape, Source};
use ferroflow::{DType, Error, Result, Tensor, Variable};
use std::io::{BufRead, BufReader, Read, Write};
use std::net::{TcpListener, TcpStream};
use std::process::{Child, Command, Stdio};
use std::sync::Arc;
use std::time::{Duration, Instant};

const BATCH: usize = 128;
const WARM_UP: usize = 50;
const NUM_PS: usize = 2;

struct State {
    model: Sequential,
    optimizer: Adam,
}

fn bad(m: &str) -> Error {
    Error::invalid("ps_bench", m.to_string())
}

/// The tutorial's partitioner: shards of at least 256 KiB, at most one per ps.
fn partitioner() -> Arc<dyn VariablePartitioner> {
    Arc::new(MinSizePartitioner {
        min_shard_bytes: 256 << 10,
        max_shards: NUM_PS,
    })
}

fn functions(mnist: String) -> Functions<State> {
    Functions::new(|_ctx| {
        let mut model = applications::mnist_mlp();
        model.forward(&Tensor::zeros(&[1, 28, 28, 1], DType::F32)?, false)?;
        Ok(State {
            model,
            optimizer: Adam::new(1e-3),
        })
    })
    .dataset("mnist_train", move |ctx| {
        let (x, y) = ferroflow::data::idx::load_mnist(&mnist, "train")?;
        Ok(Dataset::from_tensor_slices((x, y))?
            .shuffle(60_000, Some(ctx.input_pipeline_id as u64), true)?
            .batch(BATCH, true)?
            .repeat(None)
            .prefetch(2))
    })
    .variable_partitioner(partitioner())
    .function("empty", |_s: &mut State, _ctx, _: ()| Ok(()))
    .function("train_step", |s: &mut State, ctx, it: PerWorkerIterator| {
        let (x, y): (Tensor, Tensor) = ctx.next(&it)?.ok_or_else(|| bad("the data ended"))?;
        let tape = GradientTape::new();
        let logits = s.model.forward(&x, true)?;
        let loss = SparseCategoricalCrossentropy::new(true).call(&y, &logits, None)?;
        let vars = s.model.trainable_weights();
        let sources: Vec<Source> = vars.iter().map(Source::from).collect();
        let grads = tape.gradient(&loss, &sources)?;
        s.optimizer
            .apply_gradients(grads.into_iter().zip(vars).collect(), true)?;
        loss.item::<f32>()
    })
}

/// The `--tcp-echo` child: listens on a loopback port the OS picks, prints it, and echoes
/// one connection's bytes until it closes (or 10 minutes pass).
fn tcp_echo() -> std::io::Result<()> {
    let listener = TcpListener::bind("127.0.0.1:0")?;
    println!("{}", listener.local_addr()?.port());
    std::io::stdout().flush()?;
    let (mut stream, _) = listener.accept()?;
    stream.set_nodelay(true)?;
    stream.set_read_timeout(Some(Duration::from_secs(600)))?;
    let mut bytes = [0u8; 64];
    loop {
        let n = stream.read(&mut bytes)?;
        if n == 0 {
            return Ok(());
        }
        stream.write_all(&bytes[..n])?;
    }
}

/// A child process echoing over TCP (killed when dropped) and the connection to it.
struct Echo {
    child: Child,
    stream: TcpStream,
}

impl Echo {
    fn start() -> std::io::Result<Echo> {
        let mut child = Command::new(std::env::current_exe()?)
            .arg("--tcp-echo")
            .stdout(Stdio::piped())
            .spawn()?;
        let port = child
            .stdout
            .take()
            .and_then(|out| BufReader::new(out).lines().next())
            .and_then(|line| line.ok()?.trim().parse::<u16>().ok());
        let stream = match port {
            Some(port) => TcpStream::connect(("127.0.0.1", port)),
            None => Err(std::io::Error::other(
                "the echo process did not say its port",
            )),
        };
        let stream = match stream {
            Ok(s) => s,
            Err(e) => {
                let _ = child.kill();
                let _ = child.wait();
                return Err(e);
            }
        };
        stream.set_nodelay(true)?;
        stream.set_read_timeout(Some(Duration::from_secs(10)))?;
        Ok(Echo { child, stream })
    }

    /// Seconds per round trip of 64 bytes, over `n`.
    fn round_trips(&mut self, n: usize) -> std::io::Result<f64> {
        let mut bytes = [7u8; 64];
        let t = Instant::now();
        for _ in 0..n {
            self.stream.write_all(&bytes)?;
            self.stream.read_exact(&mut bytes)?;
        }
        Ok(t.elapsed().as_secs_f64() / n as f64)
    }
}

impl Drop for Echo {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(f64::total_cmp);
    v[v.len() / 2]
}

fn main() -> Result<()> {
    let args: Vec<String> = std::env::args().skip(1).collect();
    if args.first().map(String::as_str) == Some("--tcp-echo") {
        return tcp_echo().map_err(|e| Error::io("the TCP echo process", &e));
    }
    ferroflow::init();
    let [mnist, steps] = &args[..] else {
        return Err(bad("usage: ps_bench MNIST_DIR STEPS"));
    };
    let steps: usize = steps.parse().map_err(|_| bad("STEPS is a number"))?;
    let resolver = TfConfigClusterResolver::from_env()?;
    let role = resolver.task().ok_or_else(|| bad("no task in TF_CONFIG"))?;
    match role.task_type.as_str() {
        "ps" => return Server::new(&resolver)?.run(),
        "worker" => return Server::new(&resolver)?.run_worker(functions(mnist.clone())),
        _ => {}
    }
    let strategy = ParameterServerStrategy::new(&resolver, Some(partitioner()))?;
    let mut f = functions(mnist.clone());
    let _state = f.build_state(&strategy)?;
    let coordinator = ClusterCoordinator::new(&strategy)?;
    let iterator = coordinator
        .create_per_worker_dataset("mnist_train")?
        .iter()?;
    let run = |n: usize| -> Result<f32> {
        let mut last = None;
        for _ in 0..n {
            last = Some(coordinator.schedule::<_, f32>("train_step", &iterator)?);
        }
        coordinator.join()?;
        last.map_or(Ok(f32::NAN), |l| l.fetch())
    };
    run(WARM_UP)?;
    let t = Instant::now();
    let loss = run(steps)?;
    println!("ps_steps {:.6e}", steps as f64 / t.elapsed().as_secs_f64());
    eprintln!("last loss {loss}");
    let mut echo = Echo::start().map_err(|e| Error::io("starting the TCP echo process", &e))?;
    let echo_error = |e: std::io::Error| Error::io("the TCP round trips", &e);
    for _ in 0..20 {
        coordinator.schedule::<_, ()>("empty", &())?.fetch()?;
    }
    echo.round_trips(20).map_err(echo_error)?;
    let (mut ours, mut tcp) = (vec![], vec![]);
    let n = 100;
    for _ in 0..7 {
        let t = Instant::now();
        for _ in 0..n {
            coordinator.schedule::<_, ()>("empty", &())?.fetch()?;
        }
        ours.push(t.elapsed().as_secs_f64() / n as f64);
        tcp.push(echo.round_trips(n).map_err(echo_error)?);
    }
    drop(echo);
    println!("ps_roundtrip {:.6e}", median(ours));
    println!("ps_tcp_roundtrip {:.6e}", median(tcp));
    // 1 MiB of f32 on a ps, written and read from the chief.
    let elements = 1 << 18;
    let v = {
        let _scope = strategy.scope();
        Variable::new("bench_1mib", Tensor::zeros(&[elements], DType::F32)?)
    };
    let value = Tensor::ones(&[elements], DType::F32)?;
    strategy.create_variables()?;
    let repeats = 50;
    v.assign(&value)?;
    let t = Instant::now();
    for _ in 0..repeats {
        v.assign(&value)?;
    }
    println!(
        "ps_push {:.6e}",
        (repeats * elements * 4) as f64 / t.elapsed().as_secs_f64()
    );
    let _ = v.value();
    let t = Instant::now();
    let mut sum = 0.0;
    for _ in 0..repeats {
        sum += v.value().to_vec::<f32>()?[elements - 1];
    }
    println!(
        "ps_pull {:.6e}",
        (repeats * elements * 4) as f64 / t.elapsed().as_secs_f64()
    );
    if sum != repeats as f32 {
        return Err(bad("the pulled values are not the pushed ones"));
    }
    drop(coordinator);
    strategy.shut_down_cluster()
}
