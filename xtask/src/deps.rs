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
//! Edges are the dependencies each crate declares. Crates above the tensor core reach a
//! backend in their tests and doc examples through the facade (`ferroflow::init()`), as a
//! user does.

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

/// The workspace's ferroflow → ferroflow dependencies, from `cargo metadata`.
pub fn edges() -> Result<Vec<Edge>, String> {
    let out = Command::new(env!("CARGO"))
        .args(["metadata", "--format-version", "1", "--no-deps"])
        .output()
        .map_err(|e| format!("cannot run cargo metadata: {e}"))?;
    if !out.status.success() {
        return Err(format!(
            "cargo metadata failed: {}",
            String::from_utf8_lossy(&out.stderr)
        ));
    }
    let meta: serde_json::Value = serde_json::from_slice(&out.stdout)
        .map_err(|e| format!("cargo metadata printed no JSON: {e}"))?;
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

/// Checks every edge; prints each offending one. True when the layering holds.
pub fn run() -> bool {
    let edges = match edges() {
        Ok(e) => e,
        Err(e) => {
            eprintln!("xtask deps: {e}");
            return false;
        }
    };
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
        let edges = edges().expect("cargo metadata");
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
}
