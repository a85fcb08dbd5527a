//! The executables a cargo command built, as cargo reports them (`--message-format=json`).
//!
//! CI runs what `cargo test --workspace` built (the CPU backend's tests again under other
//! instruction sets, the examples, the launcher) instead of asking cargo again with `-p`:
//! cargo resolves features for the packages a command names, so `cargo test -p
//! ferroflow-cpu` or `cargo run --example mnist` unify features differently from the
//! workspace (`half` without `bytemuck`, the tensor crate without `serde`, ...) and compile
//! every crate below them a second time. Every cargo command of `xtask ci` names the whole
//! workspace, adding features with `--features package/feature`, so each crate compiles
//! once per feature set.
//!
//! Dev-dependencies count too: cargo unifies their features only in a command that builds
//! a test or an example. `cargo build --workspace --bin xtask` leaves out ferroflow-tensor's
//! `conformance` and serde_json's `float_roundtrip` and compiles every crate above them once
//! more than `cargo test --workspace` (5.5 of the clean build's 12 minutes here), so a build
//! of a program for CI names `--tests` (`.ci/run`: `--tests --examples --bin xtask`).

use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::Instant;

/// One executable cargo built (or found fresh).
#[derive(Debug, Clone)]
pub struct Executable {
    /// The package's name (`ferroflow-cpu`).
    pub package: String,
    /// The package's folder: a test runs there, as under `cargo test`.
    pub package_dir: PathBuf,
    /// The target's kind: `lib`, `bin`, `test`, `example`, ...
    pub kind: String,
    /// The target's name (`mnist`, `conformance`, `ferroflow`).
    pub name: String,
    /// Built as a test harness (a crate's unit tests or an integration test).
    pub test: bool,
    /// The file to run.
    pub path: PathBuf,
}

/// Runs `cargo <args> --message-format=json-render-diagnostics` (warnings and errors still
/// rendered on stderr) and returns the executables the command built or found up to date;
/// `None`, said on stderr, when cargo fails.
pub fn cargo_executables(args: &[&str]) -> Option<Vec<Executable>> {
    eprintln!("xtask: cargo {}", args.join(" "));
    let started = Instant::now();
    let output = Command::new("cargo")
        .args(args)
        .arg("--message-format=json-render-diagnostics")
        .stderr(Stdio::inherit())
        .output();
    let output = match output {
        Ok(o) => o,
        Err(e) => {
            eprintln!("xtask: cannot run cargo: {e}");
            return None;
        }
    };
    if !crate::said_how_long("cargo", args, output.status.success(), started) {
        return None;
    }
    Some(
        String::from_utf8_lossy(&output.stdout)
            .lines()
            .filter_map(executable_of)
            .collect(),
    )
}

/// The executable a `compiler-artifact` message names, if it names one.
fn executable_of(line: &str) -> Option<Executable> {
    let message: serde_json::Value = serde_json::from_str(line).ok()?;
    if message["reason"] != "compiler-artifact" {
        return None;
    }
    let path = PathBuf::from(message["executable"].as_str()?);
    let manifest = Path::new(message["manifest_path"].as_str()?);
    let target = &message["target"];
    Some(Executable {
        package: package_name(message["package_id"].as_str()?, manifest)?,
        package_dir: manifest.parent()?.to_path_buf(),
        kind: target["kind"][0].as_str()?.to_string(),
        name: target["name"].as_str()?.to_string(),
        test: message["profile"]["test"].as_bool()?,
        path,
    })
}

/// A package's name from its id: `path+file:///w/backends/cpu#ferroflow-cpu@0.1.0`, or
/// `path+file:///w/xtask#0.1.0` when the name is the folder's.
fn package_name(id: &str, manifest: &Path) -> Option<String> {
    let (_, fragment) = id.rsplit_once('#')?;
    match fragment.split_once('@') {
        Some((name, _)) => Some(name.to_string()),
        None => Some(manifest.parent()?.file_name()?.to_str()?.to_string()),
    }
}

/// The one executable of `package` with this kind and name that is not a test harness;
/// `None`, said on stderr, when the build did not make it.
pub fn find<'a>(
    built: &'a [Executable],
    package: &str,
    kind: &str,
    name: &str,
) -> Option<&'a Executable> {
    let found = built
        .iter()
        .find(|e| e.package == package && e.kind == kind && e.name == name && !e.test);
    if found.is_none() {
        eprintln!("xtask: the build made no {kind} `{name}` of {package}");
    }
    found
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_come_from_both_forms_of_package_id() {
        let cpu = Path::new("/w/backends/cpu/Cargo.toml");
        assert_eq!(
            package_name("path+file:///w/backends/cpu#ferroflow-cpu@0.1.0", cpu).as_deref(),
            Some("ferroflow-cpu")
        );
        let xtask = Path::new("/w/xtask/Cargo.toml");
        assert_eq!(
            package_name("path+file:///w/xtask#0.1.0", xtask).as_deref(),
            Some("xtask")
        );
        assert_eq!(package_name("no fragment", xtask), None);
    }

    #[test]
    fn an_artifact_message_gives_its_executable_and_others_none() {
        let line = r#"{"reason":"compiler-artifact","package_id":"path+file:///w#ferroflow@0.1.0","manifest_path":"/w/Cargo.toml","target":{"kind":["example"],"name":"mnist"},"profile":{"test":false},"executable":"/w/target/debug/examples/mnist","fresh":true}"#;
        let e = executable_of(line).expect("an executable");
        assert_eq!(
            (e.package.as_str(), e.kind.as_str(), e.name.as_str(), e.test),
            ("ferroflow", "example", "mnist", false)
        );
        assert_eq!(e.path, PathBuf::from("/w/target/debug/examples/mnist"));
        assert_eq!(e.package_dir, PathBuf::from("/w"));
        let library = line.replace(
            r#""executable":"/w/target/debug/examples/mnist""#,
            r#""executable":null"#,
        );
        assert!(executable_of(&library).is_none());
        assert!(executable_of(r#"{"reason":"build-finished","success":true}"#).is_none());
        assert!(executable_of("not json").is_none());
    }
}
