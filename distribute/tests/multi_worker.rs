//! MultiWorkerMirroredStrategy across real processes on loopback, started through the
//! launcher's `LocalCluster` (this test binary again, running the ignored `child` test with
//! `TF_CONFIG` on ports the OS picked; every task killed when the test ends, also on failure):
//! - N workers × batch B/N end with the weights of one process × batch B after 20 steps, and
//!   every worker's weights are bit-identical;
//! - a worker killed mid-training: the survivor fails naming the lost peer within the
//!   collective timeout; restarted with `BackupAndRestore`, the workers resume after the last
//!   backed-up epoch and end with the weights of a run never interrupted.

mod common;

use common::field;
use common::training::{
    data, f32_hex, from_hex, max_difference, model, reference_weights, train, GLOBAL_BATCH,
};
use ferroflow::cluster::{LaunchSpec, LocalCluster};
use ferroflow::distribute::{CommunicationOptions, MultiWorkerMirroredStrategy, Strategy};
use ferroflow::keras::callbacks::{BackupAndRestore, Callback, Logs};
use ferroflow::keras::{FitConfig, Model};
use ferroflow::Result;
use std::time::{Duration, Instant};

/// Prints each finished batch, so the parent knows when training is under way.
struct Progress;
impl Callback for Progress {
    fn on_train_batch_end(&mut self, batch: usize, _: &Logs, _: &mut Model) -> Result<()> {
        println!("batch {batch} done");
        use std::io::Write;
        std::io::stdout().flush().ok();
        Ok(())
    }
}

/// Prints each finished epoch and gives the parent time to act between epochs.
struct EpochProgress;
impl Callback for EpochProgress {
    fn on_epoch_end(&mut self, epoch: usize, _: &Logs, _: &mut Model) -> Result<()> {
        println!("epoch {epoch} done");
        use std::io::Write;
        std::io::stdout().flush().ok();
        std::thread::sleep(Duration::from_millis(150));
        Ok(())
    }
}

#[test]
#[ignore = "a worker process, started by the tests below"]
fn child() {
    ferroflow::init();
    let mode = std::env::var("FERROFLOW_MW_MODE").unwrap_or_default();
    let timeout = std::env::var("FERROFLOW_MW_TIMEOUT_S")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(60);
    let strategy = MultiWorkerMirroredStrategy::new(CommunicationOptions {
        timeout: Duration::from_secs(timeout),
        ..Default::default()
    })
    .unwrap();
    // Only the chief's seed matches the single-process reference: the others' initial
    // weights and shuffle seed must come from the chief.
    ferroflow::random::set_seed(3 + strategy.worker_index() as u64);
    let mut m = {
        let _scope = strategy.scope();
        model()
    };
    match mode.as_str() {
        "equivalence" => {
            let w = train(&mut m);
            println!("\nWEIGHTS {}", f32_hex(&w));
        }
        "long" => {
            let (x, y) = data();
            let r = m.fit(
                &x,
                &y,
                FitConfig::new()
                    .epochs(10_000)
                    .batch_size(GLOBAL_BATCH)
                    .verbose(0)
                    .callback(Progress),
            );
            match r {
                Ok(_) => println!("finished"),
                Err(e) => {
                    println!("ERROR {e}");
                    std::process::exit(3);
                }
            }
        }
        "backup" => {
            let dir = std::env::var("FERROFLOW_MW_BACKUP").expect("backup folder");
            m.build(&[5]).unwrap();
            let (x, y) = data();
            let r = m.fit(
                &x,
                &y,
                FitConfig::new()
                    .epochs(6)
                    .batch_size(GLOBAL_BATCH)
                    .shuffle(false)
                    .verbose(0)
                    .callback(BackupAndRestore::new(dir))
                    .callback(EpochProgress),
            );
            match r {
                Ok(h) => {
                    let w: Vec<f32> = m
                        .weights()
                        .iter()
                        .flat_map(|v| v.peek().to_vec::<f32>().unwrap())
                        .collect();
                    println!("\nEPOCHS {:?}", h.epoch);
                    println!("\nLOSSES {:?}", h.get("loss").unwrap());
                    println!("\nLOSS {}", h.get("loss").unwrap().last().unwrap());
                    println!("\nWEIGHTS {}", f32_hex(&w));
                }
                Err(e) => {
                    println!("ERROR {e}");
                    std::process::exit(3);
                }
            }
        }
        other => panic!("unknown mode {other:?}"),
    }
}

fn start(workers: usize, mode: &str, timeout_s: u64) -> LocalCluster {
    start_with(workers, mode, timeout_s, vec![])
}

fn start_with(
    workers: usize,
    mode: &str,
    timeout_s: u64,
    mut env: Vec<(String, String)>,
) -> LocalCluster {
    let exe = std::env::current_exe().expect("test binary");
    env.push(("FERROFLOW_MW_MODE".into(), mode.into()));
    env.push(("FERROFLOW_MW_TIMEOUT_S".into(), timeout_s.to_string()));
    LocalCluster::start(&LaunchSpec {
        workers,
        program: exe.to_string_lossy().into_owned(),
        args: [
            "--ignored",
            "--exact",
            "child",
            "--nocapture",
            "--test-threads=1",
        ]
        .map(String::from)
        .to_vec(),
        env,
        ..Default::default()
    })
    .expect("start the workers")
}

#[test]
fn workers_end_with_the_weights_of_one_process_with_the_global_batch() {
    let reference = reference_weights();
    for workers in [2, 3] {
        let mut cluster = start(workers, "equivalence", 60);
        let outcome = cluster
            .wait(Some(Duration::from_secs(240)))
            .expect("bounded");
        let outputs: Vec<String> = (0..workers).map(|i| cluster.output(i)).collect();
        assert!(
            outcome.first_failure.is_none(),
            "{outcome:?}\n{}",
            outputs.join("\n---\n")
        );
        let weights: Vec<Vec<f32>> = outputs
            .iter()
            .map(|o| {
                let line = o.lines().find_map(|l| l.split("WEIGHTS ").nth(1)).expect(o);
                from_hex(line)
            })
            .collect();
        for (i, w) in weights.iter().enumerate().skip(1) {
            assert_eq!(
                f32_hex(w),
                f32_hex(&weights[0]),
                "worker {i}'s weights differ from the chief's ({workers} workers)"
            );
        }
        let worst = max_difference(&weights[0], &reference);
        assert!(
            worst < 1e-5,
            "{workers} workers vs one process: max difference {worst}"
        );
        // Training moved the weights (the comparison is not of untouched initial values).
        let initial: Vec<f32> = ferroflow::testing::seeded(3, || {
            let mut fresh = model();
            fresh.build(&[5]).unwrap();
            fresh
                .weights()
                .iter()
                .flat_map(|v| v.peek().to_vec::<f32>().unwrap())
                .collect()
        });
        let moved = initial
            .iter()
            .zip(&reference)
            .map(|(a, b)| (a - b).abs())
            .fold(0.0f32, f32::max);
        assert!(moved > 1e-3, "the weights hardly moved: {moved}");
    }
}

#[test]
fn a_killed_worker_fails_the_survivor_within_the_timeout() {
    let timeout_s = 3;
    let mut cluster = start(2, "long", timeout_s);
    // Wait (bounded) until both train, then kill worker 1 as a lost machine dies.
    let begin = Instant::now();
    while !(cluster.output(0).contains("batch 3 done")
        && cluster.output(1).contains("batch 3 done"))
    {
        assert!(
            begin.elapsed() < Duration::from_secs(120),
            "training did not start:\n{}\n---\n{}",
            cluster.output(0),
            cluster.output(1)
        );
        assert!(
            cluster.try_code(0).unwrap().is_none(),
            "worker 0 ended early:\n{}",
            cluster.output(0)
        );
        std::thread::sleep(Duration::from_millis(20));
    }
    cluster.kill(1).unwrap();
    let killed = Instant::now();
    let code = loop {
        if let Some(code) = cluster.try_code(0).unwrap() {
            break code;
        }
        assert!(
            killed.elapsed() < Duration::from_secs(timeout_s * 4 + 10),
            "the survivor still runs {:?} after its peer died:\n{}",
            killed.elapsed(),
            cluster.output(0)
        );
        std::thread::sleep(Duration::from_millis(20));
    };
    let to_error = killed.elapsed();
    let out = cluster.output(0);
    assert_eq!(code, 3, "the survivor must fail with the error:\n{out}");
    let error = out.lines().find(|l| l.starts_with("ERROR")).expect(&out);
    assert!(
        error.contains("/job:worker/task:1"),
        "the error names the lost peer: {error}"
    );
    assert!(
        error.contains("all_reduce") || error.contains("broadcast"),
        "and the collective: {error}"
    );
    println!(
        "survivor failed {to_error:?} after its peer was killed (timeout {timeout_s} s): {error}"
    );
}

/// The line after `key ` in a worker's output.
#[test]
fn workers_restarted_after_a_loss_resume_from_the_backup() {
    let dir = std::env::temp_dir().join(format!("ferroflow-backup-test-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    let env =
        |d: &std::path::Path| vec![("FERROFLOW_MW_BACKUP".to_string(), d.display().to_string())];
    let finish = |cluster: &mut LocalCluster| -> Vec<String> {
        let outcome = cluster
            .wait(Some(Duration::from_secs(180)))
            .expect("bounded");
        let outs: Vec<String> = (0..2).map(|i| cluster.output(i)).collect();
        assert!(
            outcome.first_failure.is_none(),
            "{outcome:?}\n{}",
            outs.join("\n---\n")
        );
        outs
    };

    // A run never interrupted (its own backup folder, deleted at its end).
    let clean_dir = dir.join("clean");
    let clean = finish(&mut start_with(2, "backup", 10, env(&clean_dir)));
    assert!(
        !clean_dir.exists(),
        "the backup is deleted when training finishes"
    );

    // Worker 1 is killed after epoch 2; worker 0 fails.
    let lost_dir = dir.join("lost");
    let mut cluster = start_with(2, "backup", 3, env(&lost_dir));
    let begin = Instant::now();
    while !cluster.output(1).contains("epoch 2 done") {
        assert!(
            begin.elapsed() < Duration::from_secs(120),
            "no progress:\n{}",
            cluster.output(1)
        );
        assert!(
            cluster.try_code(1).unwrap().is_none(),
            "worker 1 ended early:\n{}",
            cluster.output(1)
        );
        std::thread::sleep(Duration::from_millis(5));
    }
    cluster.kill(1).unwrap();
    let code = loop {
        if let Some(c) = cluster.try_code(0).unwrap() {
            break c;
        }
        assert!(
            begin.elapsed() < Duration::from_secs(150),
            "the survivor hangs:\n{}",
            cluster.output(0)
        );
        std::thread::sleep(Duration::from_millis(20));
    };
    assert_eq!(code, 3, "the survivor fails:\n{}", cluster.output(0));
    drop(cluster);
    assert!(lost_dir.join("checkpoint.json").exists());

    // Both restarted: they resume after the last backed-up epoch and end where the clean
    // run ended, bit for bit.
    let resumed = finish(&mut start_with(2, "backup", 10, env(&lost_dir)));
    for out in &resumed {
        let epochs = field(out, "EPOCHS");
        assert!(
            !epochs.starts_with("[0"),
            "resumed, not restarted from epoch 0: {epochs}"
        );
        assert!(epochs.ends_with("5]"), "{epochs}");
        assert_eq!(
            field(out, "WEIGHTS"),
            field(&clean[0], "WEIGHTS"),
            "resumed weights differ from the clean run's (resumed epochs {}, losses {} vs {})",
            field(out, "EPOCHS"),
            field(out, "LOSS"),
            field(&clean[0], "LOSS")
        );
    }
    let loss: f64 = field(&resumed[0], "LOSS").parse().unwrap();
    let first_clean_loss = field(&clean[0], "LOSS").parse::<f64>().unwrap();
    assert!(
        (loss - first_clean_loss).abs() < 1e-9,
        "{loss} vs {first_clean_loss}"
    );
    let _ = std::fs::remove_dir_all(&dir);
}
