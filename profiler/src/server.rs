//! The profiler server (`tf.profiler.experimental.server.start`): a gRPC service in the
//! training process that speaks TensorFlow's `ProfilerService` protocol (`Profile`,
//! `Terminate`, `Monitor`), so TensorBoard's *Capture Profile* dialog, TensorFlow's
//! `tf.profiler.experimental.client` and [`crate::client`] capture a running ferroflow job
//! on demand.
//!
//! A `Profile` call records for its `duration_ms` (from its `start_timestamp_ns` when it
//! gives one, so several workers start together) exactly what [`crate::start`] records, and
//! answers with the XSpace as the tool data `xplane.pb`; the client writes it into its own
//! log folder (as `<host>_<port>.xplane.pb`). The server writes no file: a remote caller
//! never chooses a path on the worker's disk. While no capture runs the server costs
//! nothing but its idle threads: no observer is registered.
//!
//! The cluster token (`FERROFLOW_CLUSTER_TOKEN`) is honoured when set: calls without it are
//! refused (TensorBoard's dialog cannot send one: leave the token unset to use it).
//!
//! ```
//! ferroflow::init();
//! let server = ferroflow_profiler::server::start(0)?; // port 0: the OS picks one
//! let addr = format!("grpc://{}", server.local_addr());
//! let dir = tempfile::tempdir()?;
//! let worker = std::thread::spawn(|| {
//!     let w = ferroflow::Tensor::ones(&[32, 32], ferroflow::DType::F32).unwrap();
//!     let end = std::time::Instant::now() + std::time::Duration::from_millis(600);
//!     let mut step = 0;
//!     while std::time::Instant::now() < end {
//!         let _s = ferroflow_profiler::Trace::new("train", step);
//!         let _ = w.matmul(&w).unwrap();
//!         step += 1;
//!     }
//! });
//! let capture = ferroflow_profiler::client::trace(&addr, dir.path(), 300, 3, Default::default())?;
//! worker.join().unwrap();
//! assert_eq!(capture.profiles.len(), 1);
//! # Ok::<(), Box<dyn std::error::Error>>(())
//! ```

use crate::analysis::{summarize, ProfileSummary};
use crate::export::{hostname, to_xspace};
use crate::proto::service as pb;
use crate::session::Capture;
use crate::ProfilerOptions;
use ferroflow_cluster::{token_from_env, TokenCheck, MAX_MESSAGE_BYTES};
use ferroflow_tensor::{Error, Result};
use prost::Message;
use std::collections::HashSet;
use std::fmt::Write as _;
use std::net::SocketAddr;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};
use tonic::{Request, Response, Status};

/// The environment variable `ferroflow launch --profile-ports` sets to each task's profiler
/// port, read by [`start_from_env`].
pub const PORT_ENV: &str = ferroflow_cluster::PROFILER_PORT_ENV;

/// The longest capture a `Profile` or `Monitor` call may ask for.
pub const MAX_DURATION_MS: u64 = 3_600_000;

/// How far ahead a synchronised start (`start_timestamp_ns`) may be.
const MAX_START_DELAY: Duration = Duration::from_secs(60);

/// A running profiler server; it serves until dropped (or [`ProfilerServer::stop`]).
pub struct ProfilerServer {
    runtime: Option<tokio::runtime::Runtime>,
    addr: SocketAddr,
    stop: Option<tokio::sync::oneshot::Sender<()>>,
}

impl ProfilerServer {
    /// The address it listens on (with the port the OS picked for port 0).
    pub fn local_addr(&self) -> SocketAddr {
        self.addr
    }

    /// Stops serving (a capture in progress ends without answering).
    pub fn stop(mut self) {
        self.shutdown();
    }

    fn shutdown(&mut self) {
        if let Some(stop) = self.stop.take() {
            let _ = stop.send(());
        }
        if let Some(runtime) = self.runtime.take() {
            runtime.shutdown_timeout(Duration::from_secs(1));
        }
    }
}

impl Drop for ProfilerServer {
    fn drop(&mut self) {
        self.shutdown();
    }
}

/// Starts the profiler server on loopback port `port` (0: the OS picks one; see
/// [`ProfilerServer::local_addr`]). TF's `tf.profiler.experimental.server.start(port)`;
/// use [`start_on`] to listen on another address (`0.0.0.0:6009` for remote clients).
pub fn start(port: u16) -> Result<ProfilerServer> {
    start_on(&format!("127.0.0.1:{port}"))
}

/// Starts the profiler server on the port [`PORT_ENV`] names, if it is set (what
/// `ferroflow launch --profile-ports` gives each task); `None` when unset.
///
/// ```
/// // Unset here: no server.
/// assert!(ferroflow_profiler::server::start_from_env()?.is_none());
/// # Ok::<(), ferroflow_tensor::Error>(())
/// ```
pub fn start_from_env() -> Result<Option<ProfilerServer>> {
    let Ok(port) = std::env::var(PORT_ENV) else {
        return Ok(None);
    };
    let port: u16 = port.trim().parse().map_err(|_| {
        Error::invalid(
            "profiler.server",
            format!("{PORT_ENV}={port:?} is not a port number"),
        )
    })?;
    start(port).map(Some)
}

/// Starts the profiler server on `address` (`host:port`).
pub fn start_on(address: &str) -> Result<ProfilerServer> {
    let unavailable = |msg: String| Error::Unavailable {
        op: "start the profiler server".into(),
        peer: address.to_string(),
        msg,
    };
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(1)
        .max_blocking_threads(2)
        .thread_name("ferroflow-profiler-server")
        .enable_all()
        .build()
        .map_err(|e| unavailable(format!("cannot start the runtime: {e}")))?;
    // The socket a launcher handed over for this address, else one bound here.
    let listener = ferroflow_cluster::bind_listener(address)
        .and_then(|l| {
            let _entered = runtime.enter();
            tokio::net::TcpListener::from_std(l)
        })
        .map_err(|e| unavailable(format!("cannot listen: {e}")))?;
    let addr = listener
        .local_addr()
        .map_err(|e| unavailable(e.to_string()))?;
    let service = tonic::service::interceptor::InterceptedService::new(
        pb::profiler_service_server::ProfilerServiceServer::new(Service::default())
            .max_decoding_message_size(1 << 20)
            .max_encoding_message_size(MAX_MESSAGE_BYTES),
        TokenCheck::new(token_from_env().as_deref()),
    );
    let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
    let incoming = tonic::transport::server::TcpIncoming::from(listener).with_nodelay(Some(true));
    runtime.spawn(
        tonic::transport::Server::builder()
            .add_service(service)
            .serve_with_incoming_shutdown(incoming, async {
                let _ = stopped.await;
            }),
    );
    Ok(ProfilerServer {
        runtime: Some(runtime),
        addr,
        stop: Some(stop),
    })
}

#[derive(Default)]
struct Service {
    /// Sessions a `Terminate` call ended early.
    terminated: Arc<Mutex<HashSet<String>>>,
}

fn check_duration(duration_ms: u64) -> std::result::Result<Duration, Status> {
    if duration_ms == 0 {
        return Err(Status::invalid_argument(
            "duration_ms is 0: give how long to profile, in milliseconds",
        ));
    }
    if duration_ms > MAX_DURATION_MS {
        return Err(Status::invalid_argument(format!(
            "duration_ms {duration_ms} is longer than the longest capture ({MAX_DURATION_MS} ms)"
        )));
    }
    Ok(Duration::from_millis(duration_ms))
}

/// The session's options from TF's `ProfileOptions` (version 0: TF's defaults).
fn options_of(opts: Option<&pb::ProfileOptions>) -> ProfilerOptions {
    match opts {
        Some(o) if o.version > 0 => ProfilerOptions {
            host_tracer_level: o.host_tracer_level,
            device_tracer_level: o.device_tracer_level,
            delay_ms: 0,
        },
        _ => ProfilerOptions::default(),
    }
}

/// Waits until the wall clock reaches `start_timestamp_ns` (0 or past: at once).
async fn wait_for_start(start_timestamp_ns: u64) -> std::result::Result<(), Status> {
    let now = crate::session::wall_ns();
    if start_timestamp_ns <= now {
        return Ok(());
    }
    let wait = Duration::from_nanos(start_timestamp_ns - now);
    if wait > MAX_START_DELAY {
        return Err(Status::invalid_argument(format!(
            "start_timestamp_ns is {wait:?} away: at most {MAX_START_DELAY:?} ahead"
        )));
    }
    tokio::time::sleep(wait).await;
    Ok(())
}

/// Records for `duration` (less when `terminated` gets `session_id`) and returns the XSpace,
/// whether it is empty, and its summary when asked.
async fn record(
    options: ProfilerOptions,
    duration: Duration,
    session_id: &str,
    terminated: &Mutex<HashSet<String>>,
    summary: bool,
) -> std::result::Result<(Vec<u8>, bool, Option<ProfileSummary>), Status> {
    lock(terminated).remove(session_id);
    // Dropped unfinished (the client went away: this future is dropped), the capture ends.
    let capture =
        Capture::start(options).map_err(|e| Status::failed_precondition(e.to_string()))?;
    let end = Instant::now() + duration;
    loop {
        let now = Instant::now();
        if now >= end || (!session_id.is_empty() && lock(terminated).remove(session_id)) {
            break;
        }
        tokio::time::sleep((end - now).min(Duration::from_millis(10))).await;
    }
    let recording = capture
        .finish()
        .ok_or_else(|| Status::internal("the capture's session was ended elsewhere"))?;
    tokio::task::spawn_blocking(move || {
        let empty = recording.is_empty();
        let space = to_xspace(&recording, &hostname());
        let summary = summary.then(|| summarize(&space));
        (space.encode_to_vec(), empty, summary)
    })
    .await
    .map_err(|e| Status::internal(format!("encoding the profile failed: {e}")))
}

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|e| e.into_inner())
}

#[tonic::async_trait]
impl pb::profiler_service_server::ProfilerService for Service {
    async fn profile(
        &self,
        request: Request<pb::ProfileRequest>,
    ) -> std::result::Result<Response<pb::ProfileResponse>, Status> {
        let req = request.into_inner();
        let duration = check_duration(req.duration_ms)?;
        wait_for_start(req.opts.as_ref().map_or(0, |o| o.start_timestamp_ns)).await?;
        let (xspace, empty, _) = record(
            options_of(req.opts.as_ref()),
            duration,
            &req.session_id,
            &self.terminated,
            false,
        )
        .await?;
        Ok(Response::new(pb::ProfileResponse {
            tool_data: vec![pb::ProfileToolData {
                name: "xplane.pb".into(),
                data: xspace.into(),
            }],
            empty_trace: empty,
        }))
    }

    async fn terminate(
        &self,
        request: Request<pb::TerminateRequest>,
    ) -> std::result::Result<Response<pb::TerminateResponse>, Status> {
        lock(&self.terminated).insert(request.into_inner().session_id);
        Ok(Response::new(pb::TerminateResponse {}))
    }

    async fn monitor(
        &self,
        request: Request<pb::MonitorRequest>,
    ) -> std::result::Result<Response<pb::MonitorResponse>, Status> {
        let req = request.into_inner();
        let duration = check_duration(req.duration_ms)?;
        if !(1..=2).contains(&req.monitoring_level) {
            return Err(Status::invalid_argument(format!(
                "monitoring_level {} is not 1 (steps) or 2 (steps and their breakdown)",
                req.monitoring_level
            )));
        }
        // Level 1 records annotations only (steps, input, collectives): cheap.
        let options = ProfilerOptions {
            host_tracer_level: if req.monitoring_level >= 2 { 2 } else { 1 },
            device_tracer_level: 0,
            delay_ms: 0,
        };
        let (_, _, summary) = record(options, duration, "", &self.terminated, true).await?;
        let summary = summary.unwrap_or_default();
        let (data, monitor_result) = monitor_report(&summary, req.monitoring_level, req.timestamp);
        Ok(Response::new(pb::MonitorResponse {
            data,
            monitor_result: Some(monitor_result),
        }))
    }
}

/// The text and metrics a `Monitor` call answers: steps, step time (average, min, max),
/// the share of input; at level 2 also compute, communication and host time per step.
fn monitor_report(
    s: &ProfileSummary,
    level: i32,
    timestamp: bool,
) -> (String, pb::ProfilerServiceMonitorResult) {
    use pb::profiler_service_monitor_result::ResponseType;
    let mut text = String::new();
    if timestamp {
        let _ = write!(
            text,
            "{} ",
            crate::export::utc_timestamp(crate::session::wall_ns())
        );
    }
    if s.steps.is_empty() {
        text.push_str("No step completed during the monitoring window.");
        return (
            text,
            pb::ProfilerServiceMonitorResult {
                response_type: ResponseType::EmptyResult as i32,
                ..Default::default()
            },
        );
    }
    let times: Vec<f64> = s.steps.iter().map(|t| t.total_us / 1e3).collect();
    let infeed: Vec<f64> = s
        .steps
        .iter()
        .map(|t| 100.0 * t.input_us / t.total_us.max(1e-9))
        .collect();
    let mean = |v: &[f64]| v.iter().sum::<f64>() / v.len() as f64;
    let min = |v: &[f64]| v.iter().copied().fold(f64::INFINITY, f64::min);
    let max = |v: &[f64]| v.iter().copied().fold(f64::NEG_INFINITY, f64::max);
    let idle: f64 = s.steps.iter().map(|t| t.idle_us).sum::<f64>();
    let busy: f64 = s.steps.iter().map(|t| t.total_us).sum::<f64>();
    let result = pb::ProfilerServiceMonitorResult {
        response_type: ResponseType::UtilIdleStep as i32,
        device_idle_time_percent: 100.0 * idle / (idle + busy).max(1e-9),
        matrix_unit_utilization_percent: 0.0,
        step_time_ms_avg: mean(&times),
        step_time_ms_min: min(&times),
        step_time_ms_max: max(&times),
        infeed_percent_avg: mean(&infeed),
        infeed_percent_min: min(&infeed),
        infeed_percent_max: max(&infeed),
    };
    let _ = write!(
        text,
        "Steps: {}, step time: {:.3} ms avg ({:.3} min, {:.3} max), input: {:.1}% avg, \
         idle between steps: {:.1}%",
        times.len(),
        result.step_time_ms_avg,
        result.step_time_ms_min,
        result.step_time_ms_max,
        result.infeed_percent_avg,
        result.device_idle_time_percent
    );
    if level >= 2 {
        let total = |f: fn(&crate::StepBreakdown) -> f64| s.steps.iter().map(f).sum::<f64>() / 1e3;
        let _ = write!(
            text,
            "\nPer step (ms): compute {:.3}, input {:.3}, communication {:.3} (waiting for \
             peers {:.3}), host {:.3}",
            total(|t| t.compute_us) / times.len() as f64,
            total(|t| t.input_us) / times.len() as f64,
            total(|t| t.communication_us) / times.len() as f64,
            total(|t| t.communication_wait_us) / times.len() as f64,
            total(|t| t.other_us) / times.len() as f64,
        );
    }
    (text, result)
}
