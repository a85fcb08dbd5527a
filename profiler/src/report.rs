//! A self-contained HTML report of a profile: the step-time breakdown per step as stacked
//! bars, memory in use over time as a line, and the top ops by self time as a table, drawn
//! as inline SVG (no JavaScript).

use crate::analysis::{summarize, ProfileSummary};
use crate::pod::{pod_view, PodCell, PodStep, PodView};
use crate::reader::{event_runs, latest_profile, read_event_files, read_xspace};
use ferroflow_tensor::fs::write_atomic;
use ferroflow_tensor::Result;
use std::fmt::Write as _;
use std::path::{Path, PathBuf};

fn escape(s: &str) -> String {
    s.replace('&', "&amp;")
        .replace('<', "&lt;")
        .replace('>', "&gt;")
        .replace('"', "&quot;")
}

const W: f64 = 760.0;
const H: f64 = 220.0;
const PAD: f64 = 40.0;

fn step_bars(s: &ProfileSummary) -> String {
    let mut svg = format!(
        r#"<svg xmlns="http://www.w3.org/2000/svg" width="{W}" height="{H}" role="img" aria-label="step time">"#
    );
    if s.steps.is_empty() {
        svg.push_str(r#"<text x="10" y="30">No steps marked (use profiler::Trace::new("train", step) or Keras fit).</text></svg>"#);
        return svg;
    }
    let max = s.steps.iter().map(|x| x.total_us).fold(1e-9, f64::max);
    let n = s.steps.len() as f64;
    let bw = ((W - 2.0 * PAD) / n).max(1.0);
    let scale = (H - 2.0 * PAD) / max;
    for (i, st) in s.steps.iter().enumerate() {
        let x = PAD + i as f64 * bw;
        let mut y = H - PAD;
        for (v, color, what) in [
            (st.input_us, "#e8710a", "input"),
            (st.compute_us, "#1a73e8", "compute"),
            (st.communication_us, "#d93025", "communication"),
            (st.other_us, "#9aa0a6", "other"),
        ] {
            let h = v * scale;
            y -= h;
            let _ = write!(
                svg,
                r#"<rect x="{x:.1}" y="{y:.1}" width="{:.1}" height="{h:.1}" fill="{color}"><title>{} {what}: {v:.0} µs</title></rect>"#,
                (bw * 0.8).max(0.5),
                escape(&st.name)
            );
        }
    }
    let _ = write!(
        svg,
        r#"<text x="{PAD}" y="16" font-size="12">max step {:.2} ms · orange input · blue compute · red communication · grey other</text><line x1="{PAD}" y1="{}" x2="{}" y2="{}" stroke="black"/></svg>"#,
        max / 1e3,
        H - PAD,
        W - PAD,
        H - PAD
    );
    svg
}

fn memory_line(s: &ProfileSummary) -> String {
    let mut svg = format!(
        r#"<svg xmlns="http://www.w3.org/2000/svg" width="{W}" height="{H}" role="img" aria-label="memory">"#
    );
    let points: Vec<&(f64, u64)> = s.memory.iter().flat_map(|m| m.points.iter()).collect();
    if points.is_empty() {
        svg.push_str(r#"<text x="10" y="30">No memory events (host_tracer_level 2 records them).</text></svg>"#);
        return svg;
    }
    let t0 = points.iter().map(|p| p.0).fold(f64::INFINITY, f64::min);
    let t1 = points
        .iter()
        .map(|p| p.0)
        .fold(f64::NEG_INFINITY, f64::max)
        .max(t0 + 1e-9);
    let peak = s
        .memory
        .iter()
        .map(|m| m.peak_bytes)
        .max()
        .unwrap_or(1)
        .max(1) as f64;
    for (k, m) in s.memory.iter().enumerate() {
        let color = ["#1a73e8", "#d93025", "#188038", "#f9ab00"][k % 4];
        let mut path = String::new();
        // At most ~2000 points drawn: keep each bucket's maximum.
        let stride = (m.points.len() / 2000).max(1);
        for (i, chunk) in m.points.chunks(stride).enumerate() {
            let t = chunk[0].0;
            let b = chunk.iter().map(|p| p.1).max().unwrap_or(0) as f64;
            let x = PAD + (t - t0) / (t1 - t0) * (W - 2.0 * PAD);
            let y = H - PAD - b / peak * (H - 2.0 * PAD);
            let _ = write!(path, "{}{x:.1},{y:.1} ", if i == 0 { "M" } else { "L" });
        }
        let _ = write!(
            svg,
            r#"<path d="{path}" fill="none" stroke="{color}"><title>{}</title></path>"#,
            escape(&m.allocator)
        );
    }
    let peaks: Vec<String> = s
        .memory
        .iter()
        .map(|m| {
            format!(
                "{} peak {:.2} MiB{}",
                m.allocator,
                m.peak_bytes as f64 / (1 << 20) as f64,
                m.peak_op
                    .as_deref()
                    .map(|o| format!(" ({o})"))
                    .unwrap_or_default()
            )
        })
        .collect();
    let _ = write!(
        svg,
        r#"<text x="{PAD}" y="16" font-size="12">{} · over {:.1} ms</text></svg>"#,
        escape(&peaks.join(" · ")),
        (t1 - t0) / 1e3
    );
    svg
}

fn op_table(s: &ProfileSummary, top: usize) -> String {
    let total: f64 = s.ops.iter().map(|o| o.self_us).sum::<f64>().max(1e-9);
    let mut t = String::from("<table><tr><th>#</th><th>Host/device</th><th>Type</th><th>Name</th><th>Count</th><th>Self time (µs)</th><th>Self %</th><th>Total (µs)</th><th>GFLOP/s</th></tr>");
    for (i, o) in s.ops.iter().take(top).enumerate() {
        let gflops = if o.self_us > 0.0 {
            o.flops as f64 / (o.self_us * 1e3)
        } else {
            0.0
        };
        let _ = write!(
            t,
            "<tr><td>{}</td><td>{}</td><td>{}</td><td>{}</td><td>{}</td><td>{:.1}</td><td>{:.1}</td><td>{:.1}</td><td>{:.2}</td></tr>",
            i + 1,
            escape(&o.host_or_device),
            escape(&o.op_type),
            escape(&o.name),
            o.count,
            o.self_us,
            100.0 * o.self_us / total,
            o.total_us,
            gflops
        );
    }
    t.push_str("</table>");
    t
}

/// A part of a worker's step in the Pod viewer's bars: its name, colour and value.
type PodPart = (&'static str, &'static str, fn(&PodCell) -> f64);

/// The Pod viewer's section: one step's breakdown per worker as stacked bars, and the step
/// time of every step on every worker as a heat map (the straggler of each step outlined).
/// `step`: the step to draw (default: the slowest).
pub fn pod_html(view: &PodView, step: Option<i64>) -> String {
    let mut html = String::new();
    let chosen = match step {
        Some(n) => view.step(n),
        None => view.steps.iter().max_by(|a, b| {
            let slowest = |s: &PodStep| s.workers.iter().map(|c| c.step_us).fold(0.0, f64::max);
            slowest(a).total_cmp(&slowest(b))
        }),
    };
    let Some(chosen) = chosen else {
        let _ = write!(
            html,
            "<h2>Pod viewer</h2><p>{}</p>",
            match step {
                Some(n) => format!("Step {n} is not in every worker's profile."),
                None => "No step is in every worker's profile.".into(),
            }
        );
        return html;
    };
    let parts: [PodPart; 6] = [
        ("compute", "#1a73e8", |c| c.compute_us),
        ("input", "#e8710a", |c| c.input_us),
        ("waiting for peers", "#d93025", |c| c.communication_wait_us),
        ("transfer", "#f28b82", |c| c.communication_transfer_us),
        ("host", "#9aa0a6", |c| c.host_us),
        ("idle", "#dadce0", |c| c.idle_us),
    ];
    let row_h = 22.0;
    let label_w = 180.0;
    let h = PAD + row_h * view.workers.len() as f64 + 20.0;
    let max = chosen
        .workers
        .iter()
        .map(|c| c.step_us)
        .fold(1e-9, f64::max);
    let scale = (W - label_w - PAD) / max;
    let _ = write!(
        html,
        r#"<h2>Pod viewer: step {} on {} workers (ms)</h2><svg xmlns="http://www.w3.org/2000/svg" width="{W}" height="{h}" role="img" aria-label="pod step">"#,
        chosen.step_num,
        view.workers.len()
    );
    for (i, (worker, c)) in view.workers.iter().zip(&chosen.workers).enumerate() {
        let y = PAD / 2.0 + i as f64 * row_h;
        let mark = if i == chosen.straggler {
            " (straggler)"
        } else {
            ""
        };
        let _ = write!(
            html,
            r#"<text x="4" y="{:.1}" font-size="12">{}{mark}</text>"#,
            y + 14.0,
            escape(worker)
        );
        let mut x = label_w;
        for (what, color, f) in parts {
            let w = f(c) * scale;
            let _ = write!(
                html,
                r#"<rect x="{x:.1}" y="{y:.1}" width="{w:.1}" height="{:.1}" fill="{color}"><title>{} {what}: {:.3} ms</title></rect>"#,
                row_h - 4.0,
                escape(worker),
                f(c) / 1e3
            );
            x += w;
        }
    }
    let legend: Vec<String> = parts
        .iter()
        .map(|(what, color, _)| format!(r#"<tspan fill="{color}">■</tspan> {what}"#))
        .collect();
    let _ = write!(
        html,
        r#"<text x="{label_w}" y="{:.1}" font-size="12">{} · longest {:.2} ms</text></svg>"#,
        h - 6.0,
        legend.join(" "),
        max / 1e3
    );
    // The heat map: workers × steps.
    let n = view.steps.len() as f64;
    let cell_w = ((W - label_w - PAD) / n).clamp(2.0, 24.0);
    let hh = PAD + row_h * view.workers.len() as f64;
    let longest = view
        .steps
        .iter()
        .flat_map(|s| s.workers.iter().map(|c| c.step_us))
        .fold(1e-9, f64::max);
    let shortest = view
        .steps
        .iter()
        .flat_map(|s| s.workers.iter().map(|c| c.step_us))
        .fold(f64::INFINITY, f64::min)
        .min(longest);
    let _ = write!(
        html,
        r#"<h2>Step time by worker and step ({:.2} to {:.2} ms; outlined: the straggler)</h2><svg xmlns="http://www.w3.org/2000/svg" width="{W}" height="{hh}" role="img" aria-label="pod heat map">"#,
        shortest / 1e3,
        longest / 1e3
    );
    for (i, worker) in view.workers.iter().enumerate() {
        let y = i as f64 * row_h;
        let _ = write!(
            html,
            r#"<text x="4" y="{:.1}" font-size="12">{}</text>"#,
            y + 14.0,
            escape(worker)
        );
        for (k, st) in view.steps.iter().enumerate() {
            let c = &st.workers[i];
            let t = ((c.step_us - shortest) / (longest - shortest).max(1e-9)).clamp(0.0, 1.0);
            let g = (255.0 * (1.0 - t)) as u8;
            let stroke = if st.straggler == i {
                r#" stroke="black" stroke-width="1.5""#
            } else {
                ""
            };
            let _ = write!(
                html,
                r##"<rect x="{:.1}" y="{y:.1}" width="{:.1}" height="{:.1}" fill="#ff{g:02x}{g:02x}"{stroke}><title>{} step {}: {:.3} ms</title></rect>"##,
                label_w + k as f64 * cell_w,
                cell_w - 1.0,
                row_h - 4.0,
                escape(worker),
                st.step_num,
                c.step_us / 1e3
            );
        }
    }
    html.push_str("</svg>");
    html
}

/// The report's HTML for a summary.
pub fn report_html(s: &ProfileSummary, title: &str) -> String {
    report_page(s, None, title)
}

fn report_page(s: &ProfileSummary, pod: Option<String>, title: &str) -> String {
    let avg = |f: fn(&crate::analysis::StepBreakdown) -> f64| {
        if s.steps.is_empty() {
            0.0
        } else {
            s.steps.iter().map(f).sum::<f64>() / s.steps.len() as f64
        }
    };
    format!(
        r#"<!DOCTYPE html><html><head><meta charset="utf-8"><title>{t}</title>
<style>body{{font-family:sans-serif;margin:2em}}table{{border-collapse:collapse}}td,th{{border:1px solid #ccc;padding:2px 6px;font-size:13px}}</style></head>
<body><h1>{t}</h1>
<h2>Step time ({n} steps; mean {st:.2} ms: input {inp:.2}, compute {cmp:.2}, communication {com:.2}, other {oth:.2})</h2>{bars}
<h2>Memory in use</h2>{mem}
<h2>Top ops by self time</h2>{table}
{pod}
</body></html>"#,
        t = escape(title),
        n = s.steps.len(),
        st = avg(|x| x.total_us) / 1e3,
        inp = avg(|x| x.input_us) / 1e3,
        cmp = avg(|x| x.compute_us) / 1e3,
        com = avg(|x| x.communication_us) / 1e3,
        oth = avg(|x| x.other_us) / 1e3,
        bars = step_bars(s),
        mem = memory_line(s),
        table = op_table(s, 25),
        pod = pod.unwrap_or_default(),
    )
}

/// The summary as text: the step-time breakdown and the top ops (what `ferroflow profile
/// summarize` prints).
pub fn summary_text(s: &ProfileSummary, top: usize) -> String {
    let mut out = String::new();
    let _ = writeln!(out, "Step-time breakdown ({} steps, ms):", s.steps.len());
    let _ = writeln!(
        out,
        "{:<16} {:>10} {:>10} {:>10} {:>10} {:>10}",
        "step", "total", "input", "compute", "comm", "other"
    );
    for st in &s.steps {
        let _ = writeln!(
            out,
            "{:<16} {:>10.3} {:>10.3} {:>10.3} {:>10.3} {:>10.3}",
            st.name,
            st.total_us / 1e3,
            st.input_us / 1e3,
            st.compute_us / 1e3,
            st.communication_us / 1e3,
            st.other_us / 1e3
        );
    }
    let total: f64 = s.ops.iter().map(|o| o.self_us).sum::<f64>().max(1e-9);
    let _ = writeln!(out, "\nTop ops by self time:");
    let _ = writeln!(
        out,
        "{:<28} {:<44} {:>7} {:>12} {:>7}",
        "type", "name", "count", "self (µs)", "self %"
    );
    for o in s.ops.iter().take(top) {
        let _ = writeln!(
            out,
            "{:<28} {:<44} {:>7} {:>12.1} {:>7.1}",
            o.op_type,
            o.name,
            o.count,
            o.self_us,
            100.0 * o.self_us / total
        );
    }
    for m in &s.memory {
        let _ = writeln!(
            out,
            "\nMemory ({}): peak {} bytes{} over {} events",
            m.allocator,
            m.peak_bytes,
            m.peak_op
                .as_deref()
                .map(|o| format!(" (at {o})"))
                .unwrap_or_default(),
            m.points.len()
        );
    }
    out
}

fn summary_of_run(planes: &[PathBuf]) -> Result<ProfileSummary> {
    let mut merged = ProfileSummary::default();
    for p in planes {
        let s = summarize(&read_xspace(p)?);
        merged.steps.extend(s.steps);
        merged.ops.extend(s.ops);
        merged.memory.extend(s.memory);
    }
    merged.ops.sort_by(|a, b| b.self_us.total_cmp(&a.self_us));
    Ok(merged)
}

/// Checks and summarizes a log folder: every event file of every run (each record's CRCs,
/// each event decoded; the tags and counts listed) and the newest profile, if any (every
/// metadata reference checked; the step breakdown and op table). `ferroflow profile
/// summarize <logdir>`.
pub fn summarize_logdir(logdir: impl AsRef<Path>) -> Result<String> {
    let logdir = logdir.as_ref();
    let mut out = String::new();
    let runs = event_runs(logdir);
    for run in &runs {
        let log = read_event_files(run)?;
        let _ = writeln!(out, "Run {} ({} events):", run.display(), log.events.len());
        for tag in log.tags() {
            let scalars = log.scalars(&tag);
            match scalars.last() {
                Some((step, v)) => {
                    let _ = writeln!(
                        out,
                        "  {tag}: {} values, last {} at step {step}",
                        scalars.len(),
                        *v as f32
                    );
                }
                None => {
                    let _ = writeln!(out, "  {tag}");
                }
            }
        }
    }
    match latest_profile(logdir) {
        Ok((run, planes)) => {
            let _ = writeln!(out, "\nProfile {}:", run.display());
            out.push_str(&summary_text(&summary_of_run(&planes)?, 20));
        }
        Err(e) if runs.is_empty() => return Err(e),
        Err(_) => {
            let _ = writeln!(out, "\n(no profile in this folder)");
        }
    }
    Ok(out)
}

/// Writes `<run>/report.html` for the newest profile under `logdir` and returns its path
/// (`ferroflow profile report <logdir>`). A run with several workers' profiles (a
/// capture by [`crate::client::trace`]) also gets the Pod viewer's section for its slowest
/// step ([`report_for_step`] chooses another).
pub fn report(logdir: impl AsRef<Path>) -> Result<PathBuf> {
    report_for_step(logdir, None)
}

/// [`report`], with the Pod viewer drawing step `step`.
pub fn report_for_step(logdir: impl AsRef<Path>, step: Option<i64>) -> Result<PathBuf> {
    let (run, planes) = latest_profile(&logdir)?;
    let merged = summary_of_run(&planes)?;
    let pod = if planes.len() > 1 {
        Some(pod_html(&pod_view(&run)?, step))
    } else {
        None
    };
    let title = format!("ferroflow profile {}", run.display());
    let path = run.join("report.html");
    write_atomic(&path, report_page(&merged, pod, &title).as_bytes())?;
    Ok(path)
}
