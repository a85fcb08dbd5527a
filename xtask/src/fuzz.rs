//! `cargo xtask fuzz [--mutations N] [--seed S] [TARGET ...]`: every fuzz target of the
//! `ferroflow-fuzz` crate under the stable runner, one process per target, so an abort
//! (an allocation over the runner's memory limit) names its target and keeps its input.
//!
//! The runner is built in the dev profile: it keeps overflow checks (a release build would
//! wrap a hostile size silently instead of failing), with the features `cargo test
//! --workspace` resolves (`--workspace --tests`: the test targets bring in the
//! dev-dependencies' features), so the crates below it are those the test build made
//! (optimised) and CI compiles only the runner for it.

use std::path::PathBuf;
use std::process::Command;

pub fn run(args: &[String]) -> bool {
    let mut mutations = "100000".to_string();
    let mut seed = "1".to_string();
    let mut targets: Vec<String> = vec![];
    let mut it = args.iter();
    while let Some(a) = it.next() {
        match a.as_str() {
            "--mutations" => mutations = it.next().cloned().unwrap_or(mutations),
            "--seed" => seed = it.next().cloned().unwrap_or(seed),
            t => targets.push(t.to_string()),
        }
    }
    // The feature set `cargo test --workspace` built the crates below the runner with (see
    // `built`): without `--tests`, the dev-dependencies' features drop out and every crate
    // above ferroflow-tensor compiles again.
    let build = ["build", "--workspace", "--tests", "--bin", "ferroflow-fuzz"];
    let Some(built) = crate::built::cargo_executables(&build) else {
        return false;
    };
    let Some(runner) = crate::built::find(&built, "ferroflow-fuzz", "bin", "ferroflow-fuzz") else {
        return false;
    };
    let exe = &runner.path;
    if targets.is_empty() {
        let Ok(out) = Command::new(exe).arg("--list").output() else {
            eprintln!("xtask: cannot run {}", exe.display());
            return false;
        };
        targets = String::from_utf8_lossy(&out.stdout)
            .lines()
            .map(String::from)
            .collect();
    }
    let mut failed = vec![];
    for t in &targets {
        let child = Command::new(exe)
            .args([t.as_str(), "--mutations", &mutations, "--seed", &seed])
            .spawn();
        let Ok(mut child) = child else {
            eprintln!("xtask: cannot run {}", exe.display());
            return false;
        };
        let pid = child.id();
        let status = match child.wait() {
            Ok(s) => s,
            Err(e) => {
                eprintln!("xtask: waiting for the fuzz runner: {e}");
                return false;
            }
        };
        if status.success() {
            continue;
        }
        // An abort leaves the runner's scratch folder, with the input that killed it.
        let scratch = ["/dev/shm".into(), std::env::temp_dir()]
            .into_iter()
            .map(|b: PathBuf| b.join(format!("ferroflow-fuzz-{pid}")))
            .find(|p| p.exists());
        if let Some(dir) = scratch {
            let kept = PathBuf::from("fuzz/artifacts").join(t);
            let _ = std::fs::create_dir_all(&kept);
            let to = kept.join(format!("abort-seed{seed}"));
            if std::fs::copy(dir.join("current-input"), &to).is_ok() {
                eprintln!(
                    "xtask: fuzz target {t} died ({status}); its input is {}",
                    to.display()
                );
            }
            let _ = std::fs::remove_dir_all(dir);
        }
        failed.push(t.clone());
    }
    if failed.is_empty() {
        println!(
            "xtask fuzz: {} targets, {mutations} mutations each: no panic, abort or hang",
            targets.len()
        );
        true
    } else {
        eprintln!("xtask fuzz: failed: {}", failed.join(", "));
        false
    }
}
