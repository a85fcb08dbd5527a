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
//! report (step time, memory, top ops as SVG).

use ferroflow::cluster::{LaunchSpec, LocalCluster};
use std::process::ExitCode;
use std::time::Duration;

const USAGE: &str = "usage: ferroflow launch --workers N [--ps M] [--chief] [--timeout SECONDS] -- <program> [args...]
       ferroflow profile summarize <logdir>
       ferroflow profile report <logdir>

  Starts N worker processes (and M parameter servers, and a chief) running <program> with
  TF_CONFIG filled in on free loopback ports; prefixes their output with the task name;
  stops the group when one fails; exits with the first failing task's code. Parameter
  servers are stopped once the chief and workers are done; --ps implies --chief (the chief
  coordinates a parameter-server job).

  profile summarize: checks the event files and the newest profile under <logdir> and
  prints the scalars, the step-time breakdown and the top ops. profile report: writes
  report.html beside the newest profile and prints its path.";

fn profile(args: &[String]) -> ExitCode {
    let (what, logdir) = match args {
        [what, logdir] => (what.as_str(), logdir),
        _ => {
            eprintln!("ferroflow profile: give summarize or report and a log folder\n\n{USAGE}");
            return ExitCode::from(2);
        }
    };
    let result = match what {
        "summarize" => ferroflow::profiler::summarize_logdir(logdir).map(|s| print!("{s}")),
        "report" => ferroflow::profiler::report(logdir).map(|p| println!("{}", p.display())),
        other => {
            eprintln!("ferroflow profile: unknown action {other:?}\n\n{USAGE}");
            return ExitCode::from(2);
        }
    };
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
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

fn main() -> ExitCode {
    let args: Vec<String> = std::env::args().skip(1).collect();
    match args.first().map(String::as_str) {
        Some("launch") => {}
        Some("profile") => return profile(&args[1..]),
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
    let outcome = LocalCluster::start(&spec).and_then(|mut c| c.wait(timeout));
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
