//! What the crate's source defines, for the coverage table and the differential tests'
//! check that every function ran against NumPy.

use std::collections::BTreeMap;
use std::path::Path;

/// The public functions of `src/`, by NumPy name (`where_` is `where`; `linalg`, `random`
/// and `fft` functions are `linalg.name` / `random.name` / `fft.name`), with their module. Functions a
/// macro defines are its invocation's `name => Op` entries.
pub fn public_functions() -> BTreeMap<String, String> {
    let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("src");
    let mut out = BTreeMap::new();
    let mut files: Vec<_> = std::fs::read_dir(&src)
        .expect("src")
        .map(|e| e.expect("entry").path())
        .collect();
    files.sort();
    for path in files {
        let module = path
            .file_stem()
            .and_then(|s| s.to_str())
            .unwrap_or("")
            .to_string();
        let text = std::fs::read_to_string(&path).expect("source");
        let mut in_macro_call = false;
        for line in text.lines() {
            let ident = |s: &str| -> String {
                s.chars()
                    .take_while(|c| c.is_alphanumeric() || *c == '_')
                    .collect()
            };
            let name = if let Some(rest) = line.strip_prefix("pub fn ") {
                Some(ident(rest))
            } else if line.ends_with("!(") && !line.starts_with(' ') {
                in_macro_call = true;
                None
            } else if line.starts_with(");") {
                in_macro_call = false;
                None
            } else if in_macro_call && line.contains(" => ") && !line.trim_start().starts_with("//")
            {
                Some(ident(line.trim_start()))
            } else {
                None
            };
            let Some(name) = name.filter(|n| !n.is_empty()) else {
                continue;
            };
            let name = name.trim_end_matches('_').to_string();
            let key = match module.as_str() {
                "linalg" | "random" | "fft" => format!("{module}.{name}"),
                _ => name,
            };
            out.insert(key, module.clone());
        }
    }
    out
}
