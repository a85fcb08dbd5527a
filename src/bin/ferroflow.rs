//! The `ferroflow` command. `ferroflow launch --workers N [--ps M] [--chief] -- <program>
//! [args]` starts a training job's tasks on this machine (like `torchrun`): each process gets
//! its `TF_CONFIG` on free loopback ports, its output lines are prefixed with its task
//! (`[worker:1] ...`), and when one fails the others are stopped and the launcher exits
//! with the failing task's code. The same program runs unchanged on a real cluster whose
//! launcher (Kubeflow's TFJob, a Slurm script) sets `TF_CONFIG`.
//!
//! `ferroflow profile summarize <logdir>` checks a log folder's event files and newest
//! profile (every CRC, every metadata reference) and prints the scalars, the step-time
//! breakdown and the top ops; `ferroflow profile report <logdir>` writes the profile's HTML
//! report (step time, memory, top ops as SVG; the Pod viewer for a multi-worker capture);
//! `ferroflow profile capture --workers grpc://a:6009,grpc://b:6009 --duration 2s <logdir>`
//! captures from running workers' profiler servers; `ferroflow profile monitor` prints a
//! worker's step time; `ferroflow profile pod <logdir>` the Pod viewer's table.

use ferroflow::cluster::{LaunchSpec, LocalCluster};
use std::process::ExitCode;
use std::time::Duration;

const USAGE: &str = "usage: ferroflow launch --workers N [--ps M] [--chief] [--profile-ports] [--release-ports] [--timeout SECONDS] -- <program> [args...]
       ferroflow profile summarize <logdir>
       ferroflow profile report [--step N] <logdir>
       ferroflow profile capture --workers grpc://host:port[,grpc://host:port...] [--duration 2s] [--attempts 3] <logdir>
       ferroflow profile monitor [--duration 1s] [--level 1|2] grpc://host:port
       ferroflow profile pod [--step N] <logdir>
       ferroflow data-service dispatcher [--port P] [--bind HOST] [--work-dir DIR] [--fault-tolerant]
                                         [--worker-timeout DURATION]
       ferroflow data-service worker --dispatcher host:port [--port P] [--bind HOST]

  launch: starts N worker processes (and M parameter servers, and a chief) running <program>
  with TF_CONFIG filled in on free loopback ports; prefixes their output with the task name;
  stops the group when one fails; exits with the first failing task's code. Parameter
  servers are stopped once the chief and workers are done; --ps implies --chief (the chief
  coordinates a parameter-server job). --profile-ports gives each task a free port for its
  profiler server (FERROFLOW_PROFILER_PORT, read by profiler::server::start_from_env) and
  prints the addresses to capture from. Each task gets its port already listening (a
  ferroflow program takes the socket); --release-ports closes it first instead, for
  programs that bind their TF_CONFIG address themselves (TensorFlow).

  profile summarize: checks the event files and the newest profile under <logdir> and
  prints the scalars, the step-time breakdown and the top ops. profile report: writes
  report.html beside the newest profile (with the Pod viewer for a multi-worker capture)
  and prints its path. profile capture: captures from running workers' profiler servers
  into <logdir> (one .xplane.pb per worker; the duration in ms, or with s). profile
  monitor: a worker's step time over the duration. profile pod: the newest capture's
  per-worker step breakdown, with each step's straggler.

  data-service dispatcher: runs a tf.data service dispatcher (with --fault-tolerant, its
  journal in --work-dir, resumed on restart; a worker silent for --worker-timeout, 2s by
  default, is taken for dead). data-service worker: runs a worker serving
  the built-in pipelines (range, mnist); a program's own pipelines are served by a
  WorkerServer in that program. Both print `started on grpc://host:port` and serve until
  killed; the cluster token comes from FERROFLOW_CLUSTER_TOKEN.";

/// `2s`, `1500ms` or `1500` (milliseconds).
fn duration_ms(v: &str) -> Result<u64, String> {
    let bad = || format!("{v:?} is not a duration (2s, 1500ms, 1500)");
    if let Some(s) = v.strip_suffix("ms") {
        s.parse().map_err(|_| bad())
    } else if let Some(s) = v.strip_suffix('s') {
        s.parse::<f64>()
            .ok()
            .filter(|s| s.is_finite() && *s >= 0.0)
            .map(|s| (s * 1000.0).round() as u64)
            .ok_or_else(bad)
    } else {
        v.parse().map_err(|_| bad())
    }
}

/// A `profile` action's flags (`--name value`) and its one positional argument.
type FlagsAndTarget<'a> = (Vec<(&'a str, &'a str)>, &'a str);

/// The flags (`--name value`) and the one positional argument of a `profile` action.
fn flags_and_target<'a>(
    args: &'a [String],
    known: &[&'static str],
) -> Result<FlagsAndTarget<'a>, String> {
    let mut flags = vec![];
    let mut target = None;
    let mut it = args.iter();
    while let Some(a) = it.next() {
        if let Some(name) = known.iter().find(|k| **k == a.as_str()) {
            let v = it.next().ok_or_else(|| format!("{name} needs a value"))?;
            flags.push((*name, v.as_str()));
        } else if a.starts_with("--") {
            return Err(format!("unknown option {a:?}"));
        } else if target.replace(a.as_str()).is_some() {
            return Err(format!("one target only; also got {a:?}"));
        }
    }
    Ok((flags, target.ok_or("a target is missing")?))
}

fn profile_action(what: &str, args: &[String]) -> Result<Result<(), ferroflow::Error>, String> {
    let flag = |flags: &[(&str, &str)], name: &str| {
        flags
            .iter()
            .rev()
            .find(|(n, _)| *n == name)
            .map(|(_, v)| v.to_string())
    };
    let step = |flags: &[(&str, &str)]| -> Result<Option<i64>, String> {
        flag(flags, "--step")
            .map(|v| {
                v.parse()
                    .map_err(|_| format!("--step needs a number, got {v:?}"))
            })
            .transpose()
    };
    Ok(match what {
        "summarize" => {
            let (_, logdir) = flags_and_target(args, &[])?;
            ferroflow::profiler::summarize_logdir(logdir).map(|s| print!("{s}"))
        }
        "report" => {
            let (flags, logdir) = flags_and_target(args, &["--step"])?;
            ferroflow::profiler::report_for_step(logdir, step(&flags)?)
                .map(|p| println!("{}", p.display()))
        }
        "pod" => {
            let (flags, logdir) = flags_and_target(args, &["--step"])?;
            let step = step(&flags)?;
            ferroflow::profiler::latest_profile(logdir)
                .and_then(|(run, _)| ferroflow::profiler::pod_view(run))
                .map(|view| print!("{}", ferroflow::profiler::pod_table(&view, step)))
        }
        "capture" => {
            let (flags, logdir) =
                flags_and_target(args, &["--workers", "--duration", "--attempts"])?;
            let workers = flag(&flags, "--workers").ok_or("--workers is missing")?;
            let ms = duration_ms(&flag(&flags, "--duration").unwrap_or_else(|| "2s".into()))?;
            let attempts: u32 = flag(&flags, "--attempts")
                .unwrap_or_else(|| "3".into())
                .parse()
                .map_err(|_| "--attempts needs a number".to_string())?;
            ferroflow::profiler::client::trace(&workers, logdir, ms, attempts, Default::default())
                .map(|c| {
                    for (worker, file) in &c.profiles {
                        println!("{worker}: {}", file.display());
                    }
                    for (worker, e) in &c.failures {
                        eprintln!("{worker}: no profile: {e}");
                    }
                })
        }
        "monitor" => {
            let (flags, addr) = flags_and_target(args, &["--duration", "--level"])?;
            let ms = duration_ms(&flag(&flags, "--duration").unwrap_or_else(|| "1s".into()))?;
            let level: i32 = flag(&flags, "--level")
                .unwrap_or_else(|| "1".into())
                .parse()
                .map_err(|_| "--level needs 1 or 2".to_string())?;
            ferroflow::profiler::client::monitor(addr, ms, level).map(|t| println!("{t}"))
        }
        other => return Err(format!("unknown action {other:?}")),
    })
}

fn profile(args: &[String]) -> ExitCode {
    let Some((what, rest)) = args.split_first() else {
        eprintln!("ferroflow profile: give an action and its target\n\n{USAGE}");
        return ExitCode::from(2);
    };
    match profile_action(what, rest) {
        Err(usage) => {
            eprintln!("ferroflow profile {what}: {usage}\n\n{USAGE}");
            ExitCode::from(2)
        }
        Ok(Ok(())) => ExitCode::SUCCESS,
        Ok(Err(e)) => {
            eprintln!("ferroflow profile {what}: {e}");
            ExitCode::from(1)
        }
    }
}

fn parse(args: &[String]) -> Result<(LaunchSpec, Option<Duration>), String> {
    let mut spec = LaunchSpec {
        echo: true,
        ..Default::default()
    };
    let mut timeout = None;
    let mut it = args.iter();
    let number = |flag: &str, v: Option<&String>| -> Result<usize, String> {
        v.ok_or_else(|| format!("{flag} needs a number"))?
            .parse::<usize>()
            .map_err(|_| {
                format!(
                    "{flag} needs a number, got {:?}",
                    v.map(String::as_str).unwrap_or("")
                )
            })
    };
    while let Some(a) = it.next() {
        match a.as_str() {
            "--workers" => spec.workers = number("--workers", it.next())?,
            "--ps" => spec.ps = number("--ps", it.next())?,
            "--chief" => spec.chief = true,
            "--profile-ports" => spec.profile_ports = true,
            "--release-ports" => spec.release_ports = true,
            "--timeout" => {
                timeout = Some(Duration::from_secs(number("--timeout", it.next())? as u64))
            }
            "--" => {
                let program = it.next().ok_or("no program after --")?;
                spec.program = program.clone();
                spec.args = it.cloned().collect();
                break;
            }
            other => return Err(format!("unknown argument {other:?}")),
        }
    }
    if spec.program.is_empty() {
        return Err("no program: put it after --".into());
    }
    // A parameter-server job is coordinated by its chief (TF's ClusterCoordinator runs there).
    if spec.ps > 0 {
        spec.chief = true;
    }
    if spec.workers == 0 && !spec.chief {
        return Err("--workers must be at least 1 (or give --chief)".into());
    }
    Ok((spec, timeout))
}

/// Without the `data-service` feature: an error naming it.
#[cfg(not(feature = "data-service"))]
fn data_service(_args: &[String]) -> ExitCode {
    eprintln!(
        "ferroflow data-service: this build has no tf.data service; rebuild with \
         `--features data-service` (a default feature)"
    );
    ExitCode::from(2)
}

/// `ferroflow data-service dispatcher|worker [flags]`: serves until killed.
#[cfg(feature = "data-service")]
fn data_service(args: &[String]) -> ExitCode {
    use ferroflow::data::service;
    let fail = |e: String| {
        eprintln!("ferroflow data-service: {e}\n\n{USAGE}");
        ExitCode::from(2)
    };
    let Some(role) = args.first().map(String::as_str) else {
        return fail("dispatcher or worker?".into());
    };
    let mut port = 0u16;
    let mut bind = "127.0.0.1".to_string();
    let mut work_dir = None;
    let mut fault_tolerant = false;
    let mut dispatcher = None;
    let mut worker_timeout = service::DispatcherConfig::default().worker_timeout;
    let mut it = args[1..].iter();
    while let Some(a) = it.next() {
        let mut value = || it.next().cloned().ok_or(format!("{a} needs a value"));
        let parsed = match a.as_str() {
            "--port" => value().and_then(|v| {
                v.parse()
                    .map(|p| port = p)
                    .map_err(|_| format!("--port {v:?} is not a port"))
            }),
            "--bind" => value().map(|v| bind = v),
            "--work-dir" => value().map(|v| work_dir = Some(std::path::PathBuf::from(v))),
            "--dispatcher" => value().map(|v| dispatcher = Some(v)),
            "--worker-timeout" => value().and_then(|v| match duration_ms(&v)? {
                0 => Err("--worker-timeout must be longer than 0".into()),
                ms => {
                    worker_timeout = std::time::Duration::from_millis(ms);
                    Ok(())
                }
            }),
            "--fault-tolerant" => {
                fault_tolerant = true;
                Ok(())
            }
            other => Err(format!("unknown option {other:?}")),
        };
        if let Err(e) = parsed {
            return fail(e);
        }
    }
    ferroflow::init();
    let outcome = match role {
        "dispatcher" => {
            let mut d = service::DispatchServer::new(service::DispatcherConfig {
                port,
                bind_address: bind,
                work_dir,
                fault_tolerant_mode: fault_tolerant,
                worker_timeout,
                ..Default::default()
            });
            d.start().map(|()| {
                println!(
                    "ferroflow data-service dispatcher: started on {}",
                    d.target()
                );
                d.join();
            })
        }
        "worker" => {
            let Some(dispatcher) = dispatcher else {
                return fail("a worker needs --dispatcher host:port".into());
            };
            service::register_builtin_pipelines();
            let mut config = service::WorkerConfig::new(&dispatcher);
            config.port = port;
            config.bind_address = bind;
            let mut w = service::WorkerServer::new(config);
            w.start().map(|()| {
                println!(
                    "ferroflow data-service worker: started on grpc://{}",
                    w.address()
                );
                w.join();
            })
        }
        other => return fail(format!("unknown role {other:?}: dispatcher or worker")),
    };
    match outcome {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("ferroflow data-service {role}: {e}");
            ExitCode::from(1)
        }
    }
}

fn main() -> ExitCode {
    let args: Vec<String> = std::env::args().skip(1).collect();
    match args.first().map(String::as_str) {
        Some("launch") => {}
        Some("profile") => return profile(&args[1..]),
        Some("data-service") => return data_service(&args[1..]),
        Some("--help") | Some("-h") | None => {
            println!("{USAGE}");
            return ExitCode::SUCCESS;
        }
        Some(other) => {
            eprintln!("ferroflow: unknown command {other:?}\n\n{USAGE}");
            return ExitCode::from(2);
        }
    }
    let (spec, timeout) = match parse(&args[1..]) {
        Ok(s) => s,
        Err(e) => {
            eprintln!("ferroflow launch: {e}\n\n{USAGE}");
            return ExitCode::from(2);
        }
    };
    let outcome = LocalCluster::start(&spec).and_then(|mut c| {
        let profilers: Vec<String> = c
            .profiler_addresses()
            .into_iter()
            .filter(|(t, _)| t.task_type != "ps")
            .map(|(_, a)| format!("grpc://{a}"))
            .collect();
        if !profilers.is_empty() {
            println!(
                "ferroflow launch: profiler servers (capture with `ferroflow profile capture \
                 --workers {0} <logdir>` or TensorBoard's Capture Profile): {0}",
                profilers.join(",")
            );
        }
        c.wait(timeout)
    });
    match outcome {
        Ok(o) => match o.first_failure {
            None => ExitCode::SUCCESS,
            Some((task, code)) => {
                eprintln!("ferroflow launch: {task} failed with exit code {code}; the other tasks were stopped");
                ExitCode::from(u8::try_from(code).ok().filter(|c| *c != 0).unwrap_or(1))
            }
        },
        Err(e) => {
            eprintln!("ferroflow launch: {e}");
            ExitCode::from(1)
        }
    }
}
