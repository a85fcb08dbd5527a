//! The profiler client (`tf.profiler.experimental.client`): captures profiles from running
//! workers' profiler servers ([`crate::server`], or TensorFlow's) on demand.
//!
//! [`trace`] asks every worker at once for `duration_ms` of profile (all starting at the same
//! wall-clock time) and writes one `<host>_<port>.xplane.pb` (and its Chrome trace) per
//! worker into one new run folder under `<logdir>/plugins/profile/`, where TensorBoard lists
//! every host of the run; a worker that does not answer is reported by address and the
//! others' profiles are still written. A TensorFlow worker's server writes its profile into
//! that folder itself (as TF's servers do: the log folder must be one it can reach, as with
//! TensorFlow's own client). [`monitor`] profiles one worker briefly and returns
//! its step-time summary as text.

use crate::export::{new_run_dir, write_run_files};
use crate::proto::service as pb;
use crate::proto::xplane::XSpace;
use crate::ProfilerOptions;
use ferroflow_cluster::{token_from_env, MAX_MESSAGE_BYTES, TOKEN_KEY};
use ferroflow_tensor::{Error, Result};
use prost::Message;
use std::path::{Path, PathBuf};
use std::time::Duration;
use tonic::Code;

/// How long a worker may take to answer beyond the capture's duration (connecting,
/// recording's end, encoding and sending the profile).
pub const ANSWER_GRACE: Duration = Duration::from_secs(20);

/// How long connecting to a worker may take.
const CONNECT_TIMEOUT: Duration = Duration::from_secs(5);

/// How long the workers are given to receive the request before the synchronised start.
const START_DELAY: Duration = Duration::from_millis(200);

/// What [`trace`] captured.
#[derive(Debug)]
pub struct CaptureReport {
    /// The run folder (`<logdir>/plugins/profile/<run>/`).
    pub run_dir: PathBuf,
    /// Each worker that answered, by address, and its `.xplane.pb`.
    pub profiles: Vec<(String, PathBuf)>,
    /// Each worker that did not, by address, and why.
    pub failures: Vec<(String, Error)>,
}

/// The worker addresses of `service_addrs`: comma-separated `host:port`, each optionally
/// `grpc://host:port`, as TensorBoard's dialog takes them.
fn addresses(service_addrs: &str) -> Result<Vec<String>> {
    let list: Vec<String> = service_addrs
        .split(',')
        .map(|a| a.trim().trim_start_matches("grpc://").to_string())
        .filter(|a| !a.is_empty())
        .collect();
    if list.is_empty() {
        return Err(Error::invalid(
            "profiler.client",
            "no worker address given (grpc://host:port, comma-separated)",
        ));
    }
    for a in &list {
        let port_ok = a
            .rsplit_once(':')
            .is_some_and(|(h, p)| !h.is_empty() && p.parse::<u16>().is_ok_and(|p| p > 0));
        if !port_ok {
            return Err(Error::invalid(
                "profiler.client",
                format!("{a:?} is not host:port (e.g. grpc://10.0.0.2:6009)"),
            ));
        }
    }
    Ok(list)
}

/// The file name TF's client gives a worker's profile: its address, `:` made `_`.
fn host_file_name(address: &str) -> String {
    address.replace([':', '/', '\\'], "_")
}

fn runtime() -> Result<tokio::runtime::Runtime> {
    tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .thread_name("ferroflow-profiler-client")
        .enable_all()
        .build()
        .map_err(|e| Error::io("starting the profiler client's runtime", &e))
}

/// An error about the call to `address`, saying what its status means.
fn call_error(address: &str, op: &str, status: &tonic::Status, timeout: Duration) -> Error {
    let msg = match status.code() {
        Code::Unimplemented => format!(
            "not a profiler server: it does not serve tensorflow.ProfilerService ({})",
            status.message()
        ),
        Code::Unavailable => format!(
            "no profiler server answers there (refused or unreachable): {}",
            status.message()
        ),
        Code::DeadlineExceeded | Code::Cancelled => {
            format!("did not answer within {timeout:?}")
        }
        Code::Unauthenticated => format!(
            "refused the call: the cluster tokens differ (FERROFLOW_CLUSTER_TOKEN): {}",
            status.message()
        ),
        Code::Internal | Code::Unknown => format!(
            "the call failed (is it a gRPC profiler server?): {}",
            status.message()
        ),
        _ => status.message().to_string(),
    };
    Error::Unavailable {
        op: op.to_string(),
        peer: address.to_string(),
        msg,
    }
}

/// Whether a failed attempt is worth repeating (the worker may answer next time).
fn retryable(status: &tonic::Status) -> bool {
    matches!(
        status.code(),
        Code::Unavailable | Code::DeadlineExceeded | Code::Cancelled | Code::Unknown
    )
}

async fn connect(
    address: &str,
    timeout: Duration,
) -> std::result::Result<
    pb::profiler_service_client::ProfilerServiceClient<tonic::transport::Channel>,
    tonic::Status,
> {
    let endpoint = tonic::transport::Endpoint::from_shared(format!("http://{address}"))
        .map_err(|e| tonic::Status::invalid_argument(e.to_string()))?
        .connect_timeout(CONNECT_TIMEOUT)
        .timeout(timeout);
    let channel = endpoint
        .connect()
        .await
        .map_err(|e| tonic::Status::unavailable(format!("cannot connect: {e}")))?;
    Ok(
        pb::profiler_service_client::ProfilerServiceClient::new(channel)
            .max_decoding_message_size(MAX_MESSAGE_BYTES)
            .max_encoding_message_size(MAX_MESSAGE_BYTES),
    )
}

fn with_token<T>(message: T) -> std::result::Result<tonic::Request<T>, tonic::Status> {
    let mut request = tonic::Request::new(message);
    if let Some(token) = token_from_env() {
        let value = tonic::metadata::MetadataValue::try_from(token.as_str())
            .map_err(|_| tonic::Status::invalid_argument("the cluster token is not valid ASCII"))?;
        request.metadata_mut().insert(TOKEN_KEY, value);
    }
    Ok(request)
}

/// What a worker's server gave.
enum Captured {
    /// The profile, sent back (ferroflow's server; TF's newer ones for tool data).
    Sent(XSpace),
    /// A non-empty profile the server wrote itself under the request's `repository_root`
    /// (TensorFlow's servers do: the caller's log folder must be one they share).
    WrittenByServer,
}

/// One worker's capture: up to `attempts` tries; the profile, or why not.
async fn capture_one(
    address: String,
    request: pb::ProfileRequest,
    attempts: u32,
    timeout: Duration,
) -> std::result::Result<Captured, Error> {
    let mut last = None;
    for _ in 0..attempts.max(1) {
        let answer = async {
            let mut client = connect(&address, timeout).await?;
            client.profile(with_token(request.clone())?).await
        }
        .await;
        match answer {
            Ok(response) => {
                let response = response.into_inner();
                let data = response.tool_data.iter().find(|t| t.name == "xplane.pb");
                match data {
                    None if !response.empty_trace => return Ok(Captured::WrittenByServer),
                    Some(data) if !response.empty_trace => {
                        let space = XSpace::decode(&data.data[..]).map_err(|e| {
                            Error::format(
                                address.clone(),
                                format!("the profile does not decode: {e}"),
                            )
                        })?;
                        return Ok(Captured::Sent(space));
                    }
                    _ => {}
                }
                last = Some(Error::Unavailable {
                    op: "profile capture".into(),
                    peer: address.clone(),
                    msg: "the capture recorded no events (nothing ran while it lasted)".into(),
                });
            }
            Err(status) => {
                let error = call_error(&address, "profile capture", &status, timeout);
                if !retryable(&status) {
                    return Err(error);
                }
                last = Some(error);
            }
        }
    }
    Err(last.unwrap_or_else(|| Error::invalid("profile capture", "no attempt was made")))
}

/// Captures `duration_ms` of profile from every worker of `service_addrs` at once
/// (`tf.profiler.experimental.client.trace`): comma-separated `grpc://host:port` (the
/// scheme optional), as TensorBoard's *Capture Profile* dialog takes them. Each worker's
/// profile is written to `<logdir>/plugins/profile/<run>/<host>_<port>.xplane.pb` (one run
/// folder for all, with each one's `.trace.json.gz`); an empty event file is made in
/// `logdir` when it has none, so TensorBoard lists the run.
///
/// A worker is tried up to `num_tracing_attempts` times while it is unreachable, does not
/// answer within the duration and [`ANSWER_GRACE`], or records nothing. `options` are the
/// workers' tracer levels; `options.delay_ms` delays the common start.
///
/// Errors: bad arguments (no address, a duration of 0); every worker failing (the error
/// names each). When some workers answer, the others are in [`CaptureReport::failures`].
///
/// ```no_run
/// let capture = ferroflow_profiler::client::trace(
///     "grpc://10.0.0.2:6009,grpc://10.0.0.3:6009", "logs", 2000, 3, Default::default())?;
/// for (worker, file) in &capture.profiles {
///     println!("{worker}: {}", file.display());
/// }
/// # Ok::<(), ferroflow_tensor::Error>(())
/// ```
pub fn trace(
    service_addrs: &str,
    logdir: impl AsRef<Path>,
    duration_ms: u64,
    num_tracing_attempts: u32,
    options: ProfilerOptions,
) -> Result<CaptureReport> {
    let logdir = logdir.as_ref();
    let list = addresses(service_addrs)?;
    if duration_ms == 0 {
        return Err(Error::invalid(
            "profiler.client.trace",
            "duration_ms is 0: give how long to profile, in milliseconds",
        ));
    }
    if duration_ms > crate::server::MAX_DURATION_MS {
        return Err(Error::invalid(
            "profiler.client.trace",
            format!(
                "duration_ms {duration_ms} is longer than the longest capture ({} ms)",
                crate::server::MAX_DURATION_MS
            ),
        ));
    }
    std::fs::create_dir_all(logdir).map_err(|e| Error::io(logdir, &e))?;
    let begin = crate::session::wall_ns();
    // The run folder first: a TensorFlow server writes into it itself (its
    // `repository_root`/`session_id`), ferroflow's sends the profile back.
    let run_dir = new_run_dir(logdir, begin)?;
    let run_dir = run_dir.canonicalize().unwrap_or(run_dir);
    let session_id = run_dir
        .file_name()
        .map_or_else(String::new, |n| n.to_string_lossy().into_owned());
    let repository_root = run_dir
        .parent()
        .map_or_else(String::new, |p| p.to_string_lossy().into_owned());
    let start_ns =
        begin + (START_DELAY + Duration::from_millis(options.delay_ms)).as_nanos() as u64;
    let timeout = Duration::from_millis(duration_ms)
        + START_DELAY
        + Duration::from_millis(options.delay_ms)
        + ANSWER_GRACE;
    let runtime = runtime()?;
    let tasks: Vec<_> = list
        .iter()
        .map(|address| {
            let request = pb::ProfileRequest {
                duration_ms,
                max_events: 0,
                tools: vec!["xplane.pb".into()],
                opts: Some(pb::ProfileOptions {
                    include_dataset_ops: true,
                    host_tracer_level: options.host_tracer_level,
                    device_tracer_level: options.device_tracer_level,
                    version: 1,
                    start_timestamp_ns: start_ns,
                    duration_ms,
                    ..Default::default()
                }),
                repository_root: repository_root.clone(),
                session_id: session_id.clone(),
                host_name: host_file_name(address),
                tool_options: Default::default(),
            };
            runtime.spawn(capture_one(
                address.clone(),
                request,
                num_tracing_attempts,
                timeout,
            ))
        })
        .collect();
    let mut report = CaptureReport {
        run_dir: run_dir.clone(),
        profiles: Vec::new(),
        failures: Vec::new(),
    };
    let answers: Vec<(&String, std::result::Result<Captured, Error>)> = list
        .iter()
        .zip(tasks)
        .map(|(address, task)| {
            let answer = runtime.block_on(task).unwrap_or_else(|e| {
                Err(Error::invalid(
                    "profile capture",
                    format!("the capture task failed: {e}"),
                ))
            });
            (address, answer)
        })
        .collect();
    // Each worker's files written on a thread of their own (the Chrome trace of a large
    // profile takes a while to make).
    let written: Vec<(String, Result<PathBuf>)> = std::thread::scope(|scope| {
        let writers: Vec<_> = answers
            .into_iter()
            .map(|(address, answer)| {
                let run_dir = &run_dir;
                scope.spawn(move || {
                    let host = host_file_name(address);
                    let path = answer.and_then(|captured| match captured {
                        Captured::Sent(space) => {
                            write_run_files(run_dir, &host, &space).map(|f| f.xplane)
                        }
                        Captured::WrittenByServer => {
                            let path = run_dir.join(format!("{host}.xplane.pb"));
                            if path.exists() {
                                Ok(path)
                            } else {
                                Err(Error::Unavailable {
                                    op: "profile capture".into(),
                                    peer: address.clone(),
                                    msg: format!(
                                        "the server saved its profile on its own disk, under {} \
                                         there (TensorFlow's servers do): capture into a folder \
                                         both machines share",
                                        run_dir.display()
                                    ),
                                })
                            }
                        }
                    });
                    (address.clone(), path)
                })
            })
            .collect();
        writers
            .into_iter()
            .map(|w| {
                w.join().unwrap_or_else(|_| {
                    (
                        String::new(),
                        Err(Error::invalid(
                            "profile capture",
                            "writing a profile panicked",
                        )),
                    )
                })
            })
            .collect()
    });
    for (address, path) in written {
        match path {
            Ok(path) => report.profiles.push((address, path)),
            Err(e) => report.failures.push((address, e)),
        }
    }
    if report.profiles.is_empty() {
        // Nothing to show: no empty run folder left behind.
        let _ = std::fs::remove_dir(&run_dir);
        let why: Vec<String> = report.failures.iter().map(|(_, e)| e.to_string()).collect();
        return Err(Error::Unavailable {
            op: "profile capture".into(),
            peer: list.join(", "),
            msg: format!("no worker gave a profile: {}", why.join("; ")),
        });
    }
    ensure_event_file(logdir)?;
    Ok(report)
}

/// Makes an event file in `logdir` when it has none, as TF's client does, so TensorBoard
/// shows the folder as a run with a profile.
fn ensure_event_file(logdir: &Path) -> Result<()> {
    let has_events = std::fs::read_dir(logdir)
        .map_err(|e| Error::io(logdir, &e))?
        .filter_map(|e| e.ok())
        .any(|e| {
            e.file_name()
                .to_string_lossy()
                .starts_with("events.out.tfevents.")
        });
    if !has_events {
        crate::summary::create_file_writer(logdir)?.flush()?;
    }
    Ok(())
}

/// Profiles the worker at `service_addr` for `duration_ms` and returns what it measured as
/// text (`tf.profiler.experimental.client.monitor`): level 1, the steps and their time
/// (average, min, max) and the share of input; level 2, also each step's compute,
/// communication and host time.
///
/// ```no_run
/// let text = ferroflow_profiler::client::monitor("grpc://10.0.0.2:6009", 1000, 1)?;
/// println!("{text}");
/// # Ok::<(), ferroflow_tensor::Error>(())
/// ```
pub fn monitor(service_addr: &str, duration_ms: u64, level: i32) -> Result<String> {
    let list = addresses(service_addr)?;
    let [address] = &list[..] else {
        return Err(Error::invalid(
            "profiler.client.monitor",
            "monitor one worker at a time (one address)",
        ));
    };
    if duration_ms == 0 || duration_ms > crate::server::MAX_DURATION_MS {
        return Err(Error::invalid(
            "profiler.client.monitor",
            format!(
                "duration_ms must be 1 to {} (got {duration_ms})",
                crate::server::MAX_DURATION_MS
            ),
        ));
    }
    if !(1..=2).contains(&level) {
        return Err(Error::invalid(
            "profiler.client.monitor",
            format!("level {level} is not 1 (steps) or 2 (steps and their breakdown)"),
        ));
    }
    let timeout = Duration::from_millis(duration_ms) + ANSWER_GRACE;
    let runtime = runtime()?;
    runtime.block_on(async {
        let answer = async {
            let mut client = connect(address, timeout).await?;
            client
                .monitor(with_token(pb::MonitorRequest {
                    duration_ms,
                    monitoring_level: level,
                    timestamp: false,
                })?)
                .await
        }
        .await;
        answer
            .map(|r| r.into_inner().data)
            .map_err(|s| call_error(address, "profile monitor", &s, timeout))
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn addresses_take_tensorboards_form() {
        assert_eq!(
            addresses("grpc://a:6009, b:7000").unwrap(),
            vec!["a:6009".to_string(), "b:7000".to_string()]
        );
        for bad in ["", " , ", "grpc://a", "a:0", "a:port", ":6009"] {
            assert!(addresses(bad).is_err(), "{bad:?} accepted");
        }
        assert_eq!(host_file_name("10.0.0.2:6009"), "10.0.0.2_6009");
    }
}
