//! Test-suite support shared by every ferroflow crate: one rule for skipping, child
//! processes that never outlive their test ([`ChildProcess`]), and seeded runs that other
//! tests' threads cannot disturb ([`seeded`]).
//!
//! A test that cannot run here (no GPU, no NumPy, no AVX-512) calls [`skip`] with the
//! switch that would require it. Without the switch set it prints one loud `SKIPPED:` line
//! naming what is missing and returns, so the caller returns; with the switch set to `1`
//! (CI sets every switch its machine satisfies) it panics with the same words, so a skip
//! can never hide a test that CI believes ran.
//!
//! | switch | requires |
//! |---|---|
//! | `FERROFLOW_REQUIRE_WGPU` | a wgpu adapter (lavapipe in CI) |
//! | `FERROFLOW_REQUIRE_SHADER_F16` | a wgpu adapter with `SHADER_F16` (real GPUs; not lavapipe) |
//! | `FERROFLOW_REQUIRE_NUMPY` | `python3` with NumPy (and safetensors, for the weight files) |
//! | `FERROFLOW_REQUIRE_AVX512` | AVX-512F (and AVX512-BF16 for the bf16 kernels) |
//!
//! ```
//! fn needs_numpy(has_numpy: bool) {
//!     if !has_numpy {
//!         return ferroflow_tensor::testing::skip("FERROFLOW_REQUIRE_NUMPY", "python3 with NumPy is not installed (pip install numpy)");
//!     }
//!     // ... the test
//! }
//! # std::env::remove_var("FERROFLOW_REQUIRE_NUMPY");
//! needs_numpy(false);
//! ```

/// Skips the calling test loudly, or fails it when `switch` is set to `1` (see the
/// module docs). `missing` says what is absent and how to get it.
pub fn skip(switch: &str, missing: &str) {
    if std::env::var(switch).is_ok_and(|v| v == "1") {
        panic!("{switch}=1 requires this test to run, but {missing}");
    }
    eprintln!("SKIPPED: {missing} (set {switch}=1 to make this a failure)");
}

/// Runs `f` right after [`set_seed`](crate::random::set_seed)`(seed)`, alone among this
/// process's seeded runs, and returns what it returns.
///
/// The stateful generator is one per process (as TF's global seed), and a test binary runs
/// its tests on threads side by side: two tests that seed and then draw at once interleave
/// their numbers, and each one's values depend on the other's timing. Runs inside `seeded`
/// never overlap. A draw on another thread outside `seeded` still advances the
/// generator's operation counter, so a test binary whose values are checked under a seed
/// runs its other drawing tests inside `seeded` too, or keeps them in another binary.
/// Within `f`, seed again with `set_seed`: a `seeded` inside another waits for it forever.
///
/// ```
/// use ferroflow_tensor::testing::seeded;
/// let first = seeded(7, || ferroflow_tensor::random::get_seed(None));
/// let again = seeded(7, || ferroflow_tensor::random::get_seed(None));
/// assert_eq!(first, again);
/// ```
pub fn seeded<R>(seed: u64, f: impl FnOnce() -> R) -> R {
    static SEEDED_RUNS: std::sync::Mutex<()> = std::sync::Mutex::new(());
    let _alone = SEEDED_RUNS.lock().unwrap_or_else(|e| e.into_inner());
    crate::random::set_seed(seed);
    f()
}

/// A child process of a multi-process test or benchmark, killed and reaped when dropped —
/// also when the test fails first — so no run leaves a process behind.
///
/// ```no_run
/// use ferroflow_tensor::testing::ChildProcess;
/// use std::process::Command;
/// use std::time::Duration;
/// let (child, line) = ChildProcess::start(
///     Command::new("sh").args(["-c", "echo server started on 127.0.0.1:5050; sleep 30"]),
///     "started",
///     Duration::from_secs(10),
/// )?;
/// assert_eq!(line, "server started on 127.0.0.1:5050");
/// child.kill(); // or let it drop
/// # Ok::<(), ferroflow_tensor::Error>(())
/// ```
pub struct ChildProcess(std::process::Child);

impl ChildProcess {
    /// Starts `command` with its standard output read here (its standard error as the
    /// command sets it) and waits, at most `limit`, for a line containing `marker`: the
    /// process and that line. Later lines are read and dropped, so the child never blocks
    /// on a full pipe. An error names the command when it cannot start, or ends or stays
    /// silent past `limit` (the process is killed then).
    pub fn start(
        command: &mut std::process::Command,
        marker: &str,
        limit: std::time::Duration,
    ) -> crate::Result<(ChildProcess, String)> {
        use std::io::BufRead;
        let what = format!("{command:?}");
        let fail = |msg: String| crate::Error::invalid("start a child process", msg);
        let mut child = ChildProcess(
            command
                .stdout(std::process::Stdio::piped())
                .spawn()
                .map_err(|e| fail(format!("{what} cannot start: {e}")))?,
        );
        let stdout = child.0.stdout.take();
        let (tx, rx) = std::sync::mpsc::channel();
        let marker = marker.to_string();
        std::thread::spawn(move || {
            let mut told = false;
            for line in std::io::BufReader::new(stdout?).lines() {
                let line = line.ok()?;
                if !told && line.contains(&marker) {
                    told = true;
                    let _ = tx.send(line);
                }
            }
            Some(())
        });
        let line = rx.recv_timeout(limit).map_err(|_| {
            fail(format!(
                "{what} ended or printed no line with the marker within {limit:?}"
            ))
        })?;
        Ok((child, line))
    }

    /// The child's process id.
    pub fn id(&self) -> u32 {
        self.0.id()
    }

    /// The child's exit status if it has ended, without waiting.
    pub fn try_wait(&mut self) -> std::io::Result<Option<std::process::ExitStatus>> {
        self.0.try_wait()
    }

    /// Kills the child (SIGKILL) and reaps it.
    pub fn kill(self) {
        drop(self);
    }
}

impl Drop for ChildProcess {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}
