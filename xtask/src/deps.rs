//! `cargo xtask deps` (part of `ci`): the dependency direction between ferroflow's crates,
//! read from `cargo metadata`, every kind of dependency included (normal, build, dev).
//!
//! - `ferroflow-tensor` depends on no other ferroflow crate;
//! - a backend (`ferroflow-cpu`, `ferroflow-wgpu`, later `-cuda`, `-metal`) on
//!   `ferroflow-tensor` only (tests that need more live in `ferroflow-backend-tests`);
//! - `ferroflow-optim`, `ferroflow-data` and `ferroflow-numpy` never on `ferroflow-keras`;
//! - `ferroflow-keras` never on a backend crate;
//! - `ferroflow-function` never on keras, optim or a backend (it uses autodiff for
//!   control flow's gradients; autodiff never uses it);
//! - `ferroflow-cluster` and `ferroflow-distribute` never on keras, optim, autodiff or a
//!   backend (Keras and the optimizers build on the distribution seam, not the reverse).
//!
//! It also checks that no crate the workspace's `Cargo.toml` builds unoptimised (`opt-level
//! = 0`: proc macros, build scripts and what only they use) is linked into ferroflow's
//! code, which would then run unoptimised in the tests.
//!
//! Edges are the dependencies each crate declares. Crates above the tensor core reach a
//! backend in their tests and doc examples through the facade (`ferroflow::init()`), as a
//! user does.

use std::collections::{HashMap, HashSet};
use std::process::Command;

/// The backend crates (present and planned).
const BACKENDS: [&str; 4] = [
    "ferroflow-cpu",
    "ferroflow-wgpu",
    "ferroflow-cuda",
    "ferroflow-metal",
];

/// Why the edge `from → to` (both ferroflow crates) breaks the layering, or `None`.
pub fn forbidden(from: &str, to: &str) -> Option<&'static str> {
    if from == "ferroflow-tensor" {
        return Some("ferroflow-tensor depends on no other ferroflow crate");
    }
    if BACKENDS.contains(&from) && to != "ferroflow-tensor" {
        return Some("a backend depends on ferroflow-tensor only");
    }
    if ["ferroflow-optim", "ferroflow-data", "ferroflow-numpy"].contains(&from)
        && to == "ferroflow-keras"
    {
        return Some("optim, data and numpy-api never depend on keras");
    }
    if from == "ferroflow-keras" && BACKENDS.contains(&to) {
        return Some("keras never depends on a backend crate");
    }
    if from == "ferroflow-function"
        && (["ferroflow-keras", "ferroflow-optim"].contains(&to) || BACKENDS.contains(&to))
    {
        return Some("function sits above tensor and autodiff and below keras: never on keras, optim or a backend");
    }
    if from == "ferroflow-autodiff" && to == "ferroflow-function" {
        return Some("autodiff sits below function (control flow's gradients use tapes)");
    }
    if ["ferroflow-cluster", "ferroflow-distribute"].contains(&from)
        && (["ferroflow-keras", "ferroflow-optim", "ferroflow-autodiff"].contains(&to)
            || BACKENDS.contains(&to))
    {
        return Some("cluster and distribute never depend on keras, optim, autodiff or a backend");
    }
    None
}

/// One declared dependency between two ferroflow crates: (from, to, kind).
pub type Edge = (String, String, String);

/// The workspace's ferroflow → ferroflow dependencies, from its [`metadata`].
pub fn edges(meta: &serde_json::Value) -> Result<Vec<Edge>, String> {
    let packages = meta["packages"]
        .as_array()
        .ok_or("cargo metadata: no packages")?;
    let mut edges = vec![];
    for p in packages {
        let from = p["name"].as_str().unwrap_or_default();
        for d in p["dependencies"].as_array().into_iter().flatten() {
            let to = d["name"].as_str().unwrap_or_default();
            if to.starts_with("ferroflow") && to != from {
                let kind = d["kind"].as_str().unwrap_or("normal");
                edges.push((from.to_string(), to.to_string(), kind.to_string()));
            }
        }
    }
    Ok(edges)
}

/// `cargo metadata` of the workspace with every feature on, as JSON: what both checks read.
pub fn metadata() -> Result<serde_json::Value, String> {
    let out = Command::new(env!("CARGO"))
        .args(["metadata", "--format-version", "1", "--all-features"])
        .output()
        .map_err(|e| format!("cannot run cargo metadata: {e}"))?;
    if !out.status.success() {
        return Err(format!(
            "cargo metadata failed: {}",
            String::from_utf8_lossy(&out.stderr)
        ));
    }
    serde_json::from_slice(&out.stdout).map_err(|e| format!("cargo metadata printed no JSON: {e}"))
}

/// The crates a manifest builds unoptimised in the dev profile: each
/// `[profile.dev.package.NAME]` table whose `opt-level` is 0.
pub fn unoptimised_crates(manifest: &str) -> Vec<String> {
    let mut names = vec![];
    let mut table: Option<&str> = None;
    for line in manifest.lines().map(str::trim) {
        if line.starts_with('[') {
            table = line
                .strip_prefix("[profile.dev.package.")
                .and_then(|rest| rest.strip_suffix(']'));
        } else if let (Some(name), Some((key, value))) = (table, line.split_once('=')) {
            if key.trim() == "opt-level" && value.trim() == "0" {
                names.push(name.trim_matches('"').to_string());
            }
        }
    }
    names
}

/// The crates ferroflow's code links (libraries, binaries, tests, examples): the workspace's
/// normal and dev dependencies, every feature on, followed through everything but proc
/// macros (which run in the compiler).
pub fn linked_crates(meta: &serde_json::Value) -> Result<HashSet<String>, String> {
    let packages: HashMap<&str, &serde_json::Value> = meta["packages"]
        .as_array()
        .ok_or("cargo metadata: no packages")?
        .iter()
        .filter_map(|p| Some((p["id"].as_str()?, p)))
        .collect();
    let proc_macro = |id: &str| {
        packages.get(id).is_some_and(|p| {
            p["targets"].as_array().into_iter().flatten().any(|t| {
                t["kind"]
                    .as_array()
                    .into_iter()
                    .flatten()
                    .any(|k| k == "proc-macro")
            })
        })
    };
    let nodes: HashMap<&str, &serde_json::Value> = meta["resolve"]["nodes"]
        .as_array()
        .ok_or("cargo metadata: no resolve")?
        .iter()
        .filter_map(|n| Some((n["id"].as_str()?, n)))
        .collect();
    let mut todo: Vec<&str> = meta["workspace_members"]
        .as_array()
        .ok_or("cargo metadata: no workspace members")?
        .iter()
        .filter_map(|m| m.as_str())
        .collect();
    let mut seen: HashSet<&str> = HashSet::new();
    while let Some(id) = todo.pop() {
        if !seen.insert(id) {
            continue;
        }
        let deps = nodes.get(id).and_then(|n| n["deps"].as_array());
        for dep in deps.into_iter().flatten() {
            let Some(to) = dep["pkg"].as_str() else {
                continue;
            };
            let linked = dep["dep_kinds"]
                .as_array()
                .into_iter()
                .flatten()
                .any(|k| k["kind"].is_null() || k["kind"] == "dev");
            if linked && !proc_macro(to) {
                todo.push(to);
            }
        }
    }
    Ok(seen
        .iter()
        .filter_map(|id| Some(packages.get(id)?["name"].as_str()?.to_string()))
        .collect())
}

/// The crates built unoptimised that ferroflow's code links, or why they could not be read.
fn unoptimised_but_linked(meta: &serde_json::Value) -> Result<Vec<String>, String> {
    let manifest = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../Cargo.toml");
    let manifest = std::fs::read_to_string(&manifest)
        .map_err(|e| format!("cannot read {}: {e}", manifest.display()))?;
    let linked = linked_crates(meta)?;
    Ok(unoptimised_crates(&manifest)
        .into_iter()
        .filter(|name| linked.contains(name))
        .collect())
}

/// Checks every edge, and that nothing linked is built unoptimised; prints each offence.
/// True when both hold.
pub fn run() -> bool {
    let read = metadata().and_then(|meta| Ok((edges(&meta)?, unoptimised_but_linked(&meta)?)));
    let (edges, unoptimised) = match read {
        Ok(read) => read,
        Err(e) => {
            eprintln!("xtask deps: {e}");
            return false;
        }
    };
    if !unoptimised.is_empty() {
        eprintln!(
            "xtask deps: Cargo.toml builds {} unoptimised (opt-level = 0) but ferroflow's \
             code links them: remove their tables",
            unoptimised.join(", ")
        );
        return false;
    }
    let mut ok = true;
    for (from, to, kind) in &edges {
        if let Some(why) = forbidden(from, to) {
            eprintln!("xtask deps: {from} → {to} ({kind} dependency): {why}");
            ok = false;
        }
    }
    if ok {
        eprintln!(
            "xtask deps: {} dependencies between ferroflow crates, all pointing the right way",
            edges.len()
        );
    }
    ok
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_rules_name_the_edges_the_architecture_forbids() {
        assert!(forbidden("ferroflow-tensor", "ferroflow").is_some());
        assert!(forbidden("ferroflow-tensor", "ferroflow-cpu").is_some());
        assert!(forbidden("ferroflow-wgpu", "ferroflow-cpu").is_some());
        assert!(forbidden("ferroflow-wgpu", "ferroflow-keras").is_some());
        assert!(forbidden("ferroflow-data", "ferroflow-keras").is_some());
        assert!(forbidden("ferroflow-keras", "ferroflow-wgpu").is_some());
        assert!(forbidden("ferroflow-distribute", "ferroflow-keras").is_some());
        assert!(forbidden("ferroflow-cluster", "ferroflow-cpu").is_some());
        assert!(forbidden("ferroflow-keras", "ferroflow-distribute").is_none());
        assert!(forbidden("ferroflow-function", "ferroflow-keras").is_some());
        assert!(forbidden("ferroflow-keras", "ferroflow-function").is_none());
        assert!(forbidden("ferroflow-function", "ferroflow-autodiff").is_none());
        assert!(forbidden("ferroflow-autodiff", "ferroflow-function").is_some());
        assert!(forbidden("ferroflow-wgpu", "ferroflow-tensor").is_none());
        assert!(forbidden("ferroflow-keras", "ferroflow-optim").is_none());
        assert!(forbidden("ferroflow-backend-tests", "ferroflow-keras").is_none());
    }

    #[test]
    fn the_workspace_keeps_the_layering() {
        let edges = edges(&metadata().expect("cargo metadata")).expect("the edges");
        assert!(
            edges
                .iter()
                .any(|(f, t, _)| f == "ferroflow-cpu" && t == "ferroflow-tensor"),
            "cargo metadata lists the edges: {edges:?}"
        );
        let bad: Vec<_> = edges
            .iter()
            .filter(|(f, t, _)| forbidden(f, t).is_some())
            .collect();
        assert!(bad.is_empty(), "edges against the layering: {bad:?}");
    }

    #[test]
    fn unoptimised_crates_are_read_from_the_profile_tables() {
        let manifest = "[profile.dev.package.\"*\"]\nopt-level = 3\n[profile.dev.package.syn]\n\
                        opt-level = 0\n[profile.dev.package.half]\nopt-level = 2\n\
                        [dependencies]\nopt-level = 0\n[profile.dev.package.quote]\nopt-level=0\n";
        assert_eq!(unoptimised_crates(manifest), ["syn", "quote"]);
    }

    #[test]
    fn what_runs_only_in_the_compiler_is_what_is_built_unoptimised() {
        let meta = metadata().expect("cargo metadata");
        let linked = linked_crates(&meta).expect("the linked crates");
        // Linked: what the kernels and the transports are made of.
        for name in ["ferroflow-tensor", "gemm", "half", "tonic", "prost"] {
            assert!(linked.contains(name), "{name} not found among {linked:?}");
        }
        // Not linked: proc macros and build-time code generators.
        for name in ["syn", "serde_derive", "prost-build"] {
            assert!(!linked.contains(name), "{name} found linked");
        }
        assert_eq!(unoptimised_but_linked(&meta), Ok(vec![]));
    }
}
