//! Saving survives being killed: a child process saves over and over and is killed with
//! SIGKILL at random moments; every time, what is on disk loads as one whole save (the one
//! before the kill or the one it was writing), never a torn file or a folder mixing two.
//!
//! The child is the ignored test `crash_child`, started by the tests below as this same
//! test binary with `FERROFLOW_CRASH_CHILD` set; it is not meant to be run on its own.

use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use ferroflow_keras::layers::Dense;
use ferroflow_keras::losses::MeanSquaredError;
use ferroflow_keras::{sequential, FitConfig, Model};
use ferroflow_optim::Adam;
use ferroflow_tensor::testing::ChildProcess;
use ferroflow_tensor::{DType, Tensor};

const CHILD_ENV: &str = "FERROFLOW_CRASH_CHILD";
/// Kills per writer; the issue asks for at least 30.
const KILLS: usize = 32;

/// A model of ~1M weights (4 MB of float32), compiled with Adam and trained one step so
/// the optimizer has slots to save too.
fn model() -> Model {
    ferroflow::init();
    let mut m = Model::from(sequential![Dense::new(512), Dense::new(1000)]);
    m.compile(Adam::new(0.01), MeanSquaredError::new(), &[])
        .unwrap();
    let x = Tensor::zeros(&[4, 1000], DType::F32).unwrap();
    let y = Tensor::zeros(&[4, 1000], DType::F32).unwrap();
    m.fit(&x, &y, FitConfig::new().epochs(1).batch_size(4).verbose(0))
        .unwrap();
    m
}

/// Sets every model weight and every optimizer state tensor to `v`.
fn stamp(m: &mut Model, v: f64) {
    let weights = m
        .get_weights()
        .unwrap()
        .iter()
        .map(|t| t.full_like(v).unwrap())
        .collect();
    m.set_weights(weights).unwrap();
    let opt = m.optimizer_mut().unwrap();
    let state = opt
        .get_weights()
        .unwrap()
        .into_iter()
        .map(|(n, t)| (n, t.full_like(v).unwrap()))
        .collect();
    opt.set_weights(state).unwrap();
}

/// The single value every tensor holds, or a description of why not.
fn uniform_value(what: &str, tensors: &[Tensor]) -> Result<f64, String> {
    let mut seen = None;
    for t in tensors {
        for x in t.to_f64_vec().map_err(|e| e.to_string())? {
            match seen {
                None => seen = Some(x),
                Some(s) if s == x => {}
                Some(s) => return Err(format!("{what} mixes values {s} and {x}: a torn save")),
            }
        }
    }
    seen.ok_or_else(|| format!("{what} is empty"))
}

fn generation(dir: &Path) -> Option<u64> {
    let text = std::fs::read_to_string(dir.join("config.json")).ok()?;
    serde_json::from_str::<serde_json::Value>(&text).ok()?["generation"].as_u64()
}

/// The child: saves forever (bounded: 60 s), telling the parent on stdout when the first
/// save is about to start. `weights:<file>` stamps generation numbers into the weights
/// file; `model:<dir>` saves whole models whose weights and optimizer state all hold the
/// folder's generation number.
#[test]
#[ignore = "the child process of the crash tests below; started by them"]
fn crash_child() {
    let spec =
        std::env::var(CHILD_ENV).expect("run by the crash tests, with FERROFLOW_CRASH_CHILD");
    let (mode, path) = spec.split_once(':').expect("mode:path");
    let path = PathBuf::from(path);
    let mut m = model();
    let start = Instant::now();
    let mut v = 0.0;
    if mode == "weights" {
        // Continue from what is on disk so values only grow across kills.
        let mut probe = model();
        if probe.load_weights(&path).is_ok() {
            v = uniform_value("weights", &probe.get_weights().unwrap()).unwrap_or(0.0);
        }
    }
    println!("\nFERROFLOW_CHILD_READY");
    while start.elapsed() < Duration::from_secs(60) {
        match mode {
            "weights" => {
                v += 1.0;
                stamp(&mut m, v);
                m.save_weights(&path).unwrap();
            }
            "model" => {
                let g = generation(&path).unwrap_or(0) + 1;
                stamp(&mut m, g as f64);
                m.save(&path).unwrap();
            }
            other => panic!("unknown child mode {other:?}"),
        }
    }
}

/// Starts the child for `spec`, waits for its first save to begin (bounded), then kills it
/// after `delay`.
fn run_and_kill(spec: &str, delay: Duration) {
    let exe = std::env::current_exe().unwrap();
    let (mut child, _) = ChildProcess::start(
        Command::new(exe)
            .args([
                "--exact",
                "crash_child",
                "--ignored",
                "--nocapture",
                "--test-threads=1",
            ])
            .env(CHILD_ENV, spec)
            .stderr(Stdio::inherit()),
        "FERROFLOW_CHILD_READY",
        Duration::from_secs(60),
    )
    .expect("the child never became ready");
    std::thread::sleep(delay);
    assert!(
        child.try_wait().unwrap().is_none(),
        "the child exited before it was killed (a failed save?)"
    );
    drop(child); // SIGKILL
}

/// Deterministic pseudo-random delays (so a failure names its kill), 0-300 ms: one save of
/// this model takes tens of milliseconds, so kills land before, inside and between saves.
fn delays(seed: u64) -> impl Iterator<Item = Duration> {
    let mut s = seed;
    std::iter::repeat_with(move || {
        s = s
            .wrapping_mul(6364136223846793005)
            .wrapping_add(1442695040888963407);
        Duration::from_micros((s >> 33) % 300_000)
    })
}

/// Reports how many kills followed a completed save, and fails when too few did (then the
/// kills never met a save in progress either: the test would prove nothing).
fn saves_completed(writer: &str, advanced: usize) {
    println!("{writer}: {KILLS} kills, {advanced} of them after a new save completed");
    assert!(
        advanced >= KILLS / 4,
        "{writer}: saves rarely completed ({advanced} of {KILLS} runs)"
    );
}

#[test]
fn save_weights_killed_at_random_moments_leaves_a_whole_file() {
    let dir = tempfile::Builder::new()
        .prefix("ferroflow-crash-weights-")
        .tempdir()
        .unwrap();
    let path = dir.path().join("ckpt.safetensors");
    let mut probe = model();
    let mut last = 0.0;
    let mut advanced = 0;
    // Runs killed since the last one that completed a save: each may leave one temporary
    // file, which the next completed save removes.
    let mut since_a_save = 0;
    for (kill, delay) in delays(7).take(KILLS).enumerate() {
        run_and_kill(&format!("weights:{}", path.display()), delay);
        since_a_save += 1;
        if !path.exists() {
            assert_eq!(last, 0.0, "kill {kill}: the weights file vanished");
            continue;
        }
        probe
            .load_weights(&path)
            .unwrap_or_else(|e| panic!("kill {kill} after {delay:?}: the file does not load: {e}"));
        let v = uniform_value("weights", &probe.get_weights().unwrap())
            .unwrap_or_else(|e| panic!("kill {kill} after {delay:?}: {e}"));
        assert!(v >= last, "kill {kill}: went back from save {last} to {v}");
        advanced += usize::from(v > last);
        if v > last {
            since_a_save = 0;
        }
        last = v;
    }
    saves_completed("save_weights", advanced);
    let strays: Vec<_> = std::fs::read_dir(dir.path())
        .unwrap()
        .flatten()
        .map(|e| e.file_name())
        .filter(|n| n != "ckpt.safetensors")
        .collect();
    // A run that completed a save and was then killed mid-write leaves one; so may each run
    // after it that completed none (a loaded machine starts the children slowly).
    assert!(
        strays.len() <= since_a_save + 1,
        "temporary files pile up: {strays:?} ({since_a_save} runs since the last completed save)"
    );
}

#[test]
fn model_save_killed_at_random_moments_leaves_one_whole_version() {
    ferroflow::init();
    let dir = tempfile::Builder::new()
        .prefix("ferroflow-crash-model-")
        .tempdir()
        .unwrap();
    let path = dir.path().join("model");
    let mut last = 0;
    let mut advanced = 0;
    for (kill, delay) in delays(11).take(KILLS).enumerate() {
        run_and_kill(&format!("model:{}", path.display()), delay);
        let Some(g) = generation(&path) else {
            assert_eq!(last, 0, "kill {kill}: config.json vanished or is torn");
            continue;
        };
        let mut loaded = Model::load(&path).unwrap_or_else(|e| {
            panic!("kill {kill} after {delay:?}: generation {g} does not load: {e}")
        });
        let w = uniform_value("weights", &loaded.get_weights().unwrap())
            .unwrap_or_else(|e| panic!("kill {kill}: {e}"));
        let state: Vec<Tensor> = loaded
            .optimizer_mut()
            .expect("saved compiled")
            .get_weights()
            .unwrap()
            .into_iter()
            .map(|(_, t)| t)
            .collect();
        let o =
            uniform_value("optimizer state", &state).unwrap_or_else(|e| panic!("kill {kill}: {e}"));
        assert_eq!(
            (w, o),
            (g as f64, g as f64),
            "kill {kill} after {delay:?}: config generation {g} holds weights of save {w} and optimizer state of save {o}"
        );
        assert!(
            g >= last,
            "kill {kill}: went back from generation {last} to {g}"
        );
        advanced += usize::from(g > last);
        last = g;
    }
    saves_completed("Model::save", advanced);
    let files = std::fs::read_dir(&path).unwrap().count();
    assert!(
        files <= 6,
        "old generations or temporary files pile up: {files} files"
    );
}
