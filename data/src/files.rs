//! File name patterns (`Dataset.list_files`).

use std::path::PathBuf;

use ferroflow_tensor::{Error, Result};

use crate::dataset::Dataset;

impl Dataset<PathBuf> {
    /// The files matching a glob `pattern` (`*`, `?`, `[a-z]`, `**`), sorted by name
    /// (`Dataset.list_files`). TF shuffles the names by default; here add
    /// [`shuffle`](Dataset::shuffle) when wanted, so the order is explicit. An error when
    /// nothing matches, as in TF.
    ///
    /// ```
    /// ferroflow::init();
    /// let dir = std::env::temp_dir().join(format!("ferroflow-doc-list-{}", std::process::id()));
    /// std::fs::create_dir_all(&dir)?;
    /// for name in ["b.tfrecord", "a.tfrecord", "notes.txt"] {
    ///     std::fs::write(dir.join(name), b"")?;
    /// }
    /// let files = ferroflow_data::Dataset::list_files(&format!("{}/*.tfrecord", dir.display()))?;
    /// let names: Vec<_> = files.iter().collect::<Result<_, _>>()?;
    /// assert_eq!(names, vec![dir.join("a.tfrecord"), dir.join("b.tfrecord")]);
    /// # std::fs::remove_dir_all(&dir)?;
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn list_files(pattern: &str) -> Result<Dataset<PathBuf>> {
        let bad = |msg: String| Error::InvalidArgument {
            op: "list_files",
            msg,
        };
        let entries =
            glob::glob(pattern).map_err(|e| bad(format!("bad pattern {pattern:?}: {e}")))?;
        let mut files = Vec::new();
        for entry in entries {
            let path = entry.map_err(|e| Error::io(e.path(), e.error()))?;
            if path.is_file() {
                files.push(path);
            }
        }
        files.sort();
        if files.is_empty() {
            return Err(bad(format!("the pattern {pattern:?} matches no file")));
        }
        let n = files.len() as u64;
        let listed = std::sync::Arc::new(files);
        let fp = listed.clone();
        let splits = crate::split::claim();
        Ok(Dataset::from_parts(
            crate::dataset::split_cardinality(n, &splits),
            move || {
                Ok(format!(
                    "list_files({})",
                    crate::tfrecord::files_identity(&fp)
                ))
            },
            move || {
                let files = listed.clone();
                crate::split::source_iter(n, splits.clone(), move |i| Ok(files[i as usize].clone()))
            },
        ))
    }
}
