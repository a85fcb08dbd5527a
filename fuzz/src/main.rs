//! `ferroflow-fuzz`: the stable-Rust fuzz runner (`cargo xtask fuzz` runs it in CI).
//!
//! For each target: every seed must read back `Ok`; the inputs of `fuzz/corpus/<target>/`
//! (ones that once broke a reader) must return `Ok` or `Err`; then `--mutations` seeded
//! random mutations of both must each return `Ok` or `Err`. A panic, a hang (over
//! `--time-limit-s` for one input) or an abort (an allocation over the `--memory-mb`
//! address-space limit) fails the run; the input that did it is saved under
//! `fuzz/artifacts/<target>/` (for an abort the runner cannot save, so it names the scratch
//! file holding it). Reproduce with the same `--seed`.
//!
//! ```text
//! cargo run --release -p ferroflow-fuzz -- npy tfrecord --mutations 100000 --seed 1
//! ```

use std::panic::AssertUnwindSafe;
use std::path::PathBuf;
use std::process::ExitCode;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use ferroflow_fuzz::{mutate, scratch, Rng, Target, TARGETS, TENSOR_LIMIT_BYTES};

struct Options {
    targets: Vec<&'static Target>,
    mutations: u64,
    seed: u64,
    memory_mb: u64,
    time_limit: Duration,
}

fn parse_args() -> Result<Options, String> {
    let mut o = Options {
        targets: vec![],
        mutations: 100_000,
        seed: 1,
        memory_mb: 4096,
        time_limit: Duration::from_secs(20),
    };
    let mut args = std::env::args().skip(1);
    while let Some(a) = args.next() {
        let mut value = |name: &str| -> Result<u64, String> {
            args.next()
                .and_then(|v| v.parse().ok())
                .ok_or_else(|| format!("{name} needs a number"))
        };
        match a.as_str() {
            "--mutations" => o.mutations = value("--mutations")?,
            "--seed" => o.seed = value("--seed")?,
            "--memory-mb" => o.memory_mb = value("--memory-mb")?,
            "--time-limit-s" => o.time_limit = Duration::from_secs(value("--time-limit-s")?),
            "--list" => {
                for t in TARGETS {
                    println!("{}", t.name);
                }
                std::process::exit(0);
            }
            "all" => o.targets.extend(TARGETS.iter()),
            name => o.targets.push(
                TARGETS
                    .iter()
                    .find(|t| t.name == name)
                    .ok_or_else(|| format!("no target {name:?} (--list names them)"))?,
            ),
        }
    }
    if o.targets.is_empty() {
        o.targets.extend(TARGETS.iter());
    }
    Ok(o)
}

/// Caps the address space, so an allocation bomb aborts the run instead of exhausting
/// the machine.
fn limit_memory(mb: u64) {
    #[cfg(unix)]
    {
        let bytes = mb.saturating_mul(1 << 20) as libc::rlim_t;
        let lim = libc::rlimit {
            rlim_cur: bytes,
            rlim_max: bytes,
        };
        // SAFETY: setrlimit reads a valid rlimit struct.
        if unsafe { libc::setrlimit(libc::RLIMIT_AS, &lim) } != 0 {
            eprintln!("ferroflow-fuzz: could not set the memory limit; running without");
        }
    }
    #[cfg(not(unix))]
    let _ = mb;
}

/// What the watchdog and the panic report need about the input in flight.
struct InFlight {
    target: Mutex<&'static str>,
    input: Mutex<Vec<u8>>,
    started_ms: AtomicU64,
    epoch: Instant,
}

fn save_artifact(target: &str, kind: &str, input: &[u8]) -> PathBuf {
    let dir = PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("artifacts")
        .join(target);
    let _ = std::fs::create_dir_all(&dir);
    let mut h: u64 = 0xcbf2_9ce4_8422_2325;
    for &b in input {
        h = (h ^ b as u64).wrapping_mul(0x100_0000_01b3);
    }
    let p = dir.join(format!("{kind}-{h:016x}"));
    let _ = std::fs::write(&p, input);
    p
}

fn main() -> ExitCode {
    let o = match parse_args() {
        Ok(o) => o,
        Err(e) => {
            eprintln!("ferroflow-fuzz: {e}");
            return ExitCode::FAILURE;
        }
    };
    let current = scratch().join("current-input");
    println!(
        "ferroflow-fuzz: seed {}, {} mutations per target, {} MiB address space, {:?} per input; the input in flight is kept in {}",
        o.seed,
        o.mutations,
        o.memory_mb,
        o.time_limit,
        current.display()
    );
    // Seeds (and the models they need) are made before the limit applies.
    let seeds: Vec<Vec<Vec<u8>>> = o.targets.iter().map(|t| (t.seeds)()).collect();
    limit_memory(o.memory_mb);

    let flight = Arc::new(InFlight {
        target: Mutex::new(""),
        input: Mutex::new(vec![]),
        started_ms: AtomicU64::new(u64::MAX),
        epoch: Instant::now(),
    });
    let watch = flight.clone();
    let limit = o.time_limit;
    std::thread::spawn(move || loop {
        std::thread::sleep(Duration::from_millis(200));
        let started = watch.started_ms.load(Ordering::Acquire);
        let now = watch.epoch.elapsed().as_millis() as u64;
        if started != u64::MAX && now.saturating_sub(started) > limit.as_millis() as u64 {
            let target = *watch.target.lock().unwrap_or_else(|e| e.into_inner());
            let input = watch
                .input
                .lock()
                .unwrap_or_else(|e| e.into_inner())
                .clone();
            let p = save_artifact(target, "hang", &input);
            eprintln!(
                "ferroflow-fuzz: {target}: one input ran over {limit:?} (a hang); saved as {}",
                p.display()
            );
            std::process::exit(1);
        }
    });
    let message: Arc<Mutex<String>> = Arc::default();
    let sink = message.clone();
    std::panic::set_hook(Box::new(move |info| {
        *sink.lock().unwrap_or_else(|e| e.into_inner()) = info.to_string();
    }));

    let mut rng = Rng::new(o.seed);
    for (target, seeds) in o.targets.iter().zip(&seeds) {
        // Inputs that once broke a reader (fuzz/corpus/<target>/), replayed first and then
        // mutated like the seeds; they may be refused, never panic.
        let corpus_dir = PathBuf::from(env!("CARGO_MANIFEST_DIR"))
            .join("corpus")
            .join(target.name);
        let mut corpus: Vec<Vec<u8>> = std::fs::read_dir(&corpus_dir)
            .map(|d| {
                d.flatten()
                    .filter_map(|e| std::fs::read(e.path()).ok())
                    .collect()
            })
            .unwrap_or_default();
        corpus.sort();
        let mut bases = seeds.clone();
        bases.extend(corpus.iter().cloned());
        *flight.target.lock().unwrap() = target.name;
        let start = Instant::now();
        let (mut ok, mut refused) = (0u64, 0u64);
        let total = bases.len() as u64 + o.mutations;
        for i in 0..total {
            let input = if (i as usize) < bases.len() {
                bases[i as usize].clone()
            } else {
                let a = &bases[rng.below(bases.len())];
                let b = &bases[rng.below(bases.len())];
                let mut m = mutate(&mut rng, a, b);
                if let Some(fix) = target.fixup.filter(|_| rng.below(2) == 0) {
                    fix(&mut m);
                }
                m
            };
            let _ = std::fs::write(&current, &input);
            flight.input.lock().unwrap().clone_from(&input);
            flight
                .started_ms
                .store(flight.epoch.elapsed().as_millis() as u64, Ordering::Release);
            let result = std::panic::catch_unwind(AssertUnwindSafe(|| {
                let _limit = ferroflow_tensor::device::tensor_limit_scope(TENSOR_LIMIT_BYTES);
                (target.run)(&input)
            }));
            flight.started_ms.store(u64::MAX, Ordering::Release);
            match result {
                Ok(Ok(())) => ok += 1,
                Ok(Err(e)) if (i as usize) < seeds.len() => {
                    eprintln!(
                        "ferroflow-fuzz: {}: seed {i} does not read back: {e}",
                        target.name
                    );
                    return ExitCode::FAILURE;
                }
                Ok(Err(_)) => refused += 1,
                Err(_) => {
                    let p = save_artifact(target.name, "panic", &input);
                    eprintln!(
                        "ferroflow-fuzz: {}: input {i} panicked: {}\n  saved as {}",
                        target.name,
                        message.lock().unwrap(),
                        p.display()
                    );
                    return ExitCode::FAILURE;
                }
            }
        }
        println!(
            "fuzz {:<15} {total:>7} inputs: {ok:>6} read, {refused:>7} refused with an error, 0 panics, 0 hangs, 0 aborts ({:.1} s)",
            target.name,
            start.elapsed().as_secs_f64()
        );
    }
    let _ = std::fs::remove_dir_all(scratch());
    ExitCode::SUCCESS
}
