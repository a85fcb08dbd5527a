//! ferroflow's profiler (`tf.profiler`, `tf.summary`): records every op through the
//! dispatcher, the [`Trace`] / [`trace!`] spans of host code (training steps, the input
//! pipeline's `IteratorGetNext`) and every tensor allocation and free, and writes them as
//! TensorFlow does, so TensorBoard opens them:
//!
//! - `<logdir>/plugins/profile/<run>/<host>.xplane.pb`: TF's XSpace (trace viewer,
//!   overview page with the step-time breakdown, framework op stats, memory profile,
//!   input-pipeline analysis);
//! - `<logdir>/plugins/profile/<run>/<host>.trace.json.gz`: Chrome trace events (Perfetto);
//! - `events.out.tfevents.*` through [`summary`] (scalars, histograms, text, images);
//! - `report.html` ([`report`]): step-time bars, memory over time, the top ops, as SVG.
//!
//! ```
//! ferroflow::init();
//! let dir = tempfile::tempdir()?;
//! let profile = ferroflow_profiler::Profile::start(dir.path(), Default::default())?;
//! let w = ferroflow::Tensor::ones(&[64, 64], ferroflow::DType::F32)?;
//! for step in 0..3i64 {
//!     let _step = ferroflow_profiler::Trace::new("train", step);
//!     let _ = w.matmul(&w)?.relu()?;
//! }
//! let files = profile.finish()?;
//! let summary = ferroflow_profiler::summarize(&ferroflow_profiler::read_xspace(&files.xplane)?);
//! assert_eq!(summary.steps.len(), 3);
//! assert!(summary.ops.iter().any(|o| o.op_type == "MatMul"));
//! # Ok::<(), Box<dyn std::error::Error>>(())
//! ```
//!
//! Profiling off costs nothing beyond what the dispatcher already pays: no observer is
//! registered and the trace hooks are one atomic load.

#![warn(missing_docs)]

mod analysis;
pub mod client;
mod export;
mod names;
mod png;
mod pod;
mod reader;
mod report;
pub mod server;
mod session;
pub mod summary;

/// The protobuf messages of the files written (TF's field numbers).
pub mod proto {
    /// XSpace (`tensorflow.profiler`).
    #[allow(missing_docs, clippy::all)]
    pub mod xplane {
        include!(concat!(env!("OUT_DIR"), "/tensorflow.profiler.rs"));
    }
    /// Event files (`tensorboard`).
    #[allow(missing_docs, clippy::all)]
    pub mod event {
        include!(concat!(env!("OUT_DIR"), "/tensorboard.rs"));
    }
    /// TF's profiler service (`tensorflow.ProfilerService`) and its messages, with their
    /// gRPC server and client.
    #[allow(missing_docs, clippy::all)]
    pub mod service {
        include!(concat!(env!("OUT_DIR"), "/tensorflow.rs"));
    }
}

pub use analysis::{summarize, MemoryTimeline, OpRow, ProfileSummary, StepBreakdown};
pub use export::{allocator_name, chrome_trace_json, hostname, HOST_PLANE, TASK_ENVIRONMENT_PLANE};
pub use names::{cost, tf_datatype, tf_dtype_name, tf_op_type, tf_op_type_of_name};
pub use pod::{pod_table, pod_view, pod_view_of, PodCell, PodStep, PodView};
pub use reader::{
    event_runs, latest_profile, read_event_file, read_event_files, read_xspace, EventLog,
};
pub use report::{pod_html, report, report_for_step, report_html, summarize_logdir, summary_text};
pub use session::{is_running, start, stop, Profile, ProfileFiles, ProfilerOptions, Trace};

#[doc(hidden)]
pub mod __private {
    pub use ferroflow_tensor::trace::{StatValue, TraceMe};

    /// Values the [`trace!`](crate::trace) macro accepts as statistics.
    pub trait IntoStat {
        fn into_stat(self) -> StatValue;
    }
    macro_rules! ints {
        ($($t:ty),*) => {$(impl IntoStat for $t { fn into_stat(self) -> StatValue { StatValue::I64(self as i64) } })*};
    }
    ints!(i8, i16, i32, i64, u8, u16, u32, isize);
    impl IntoStat for u64 {
        fn into_stat(self) -> StatValue {
            StatValue::U64(self)
        }
    }
    impl IntoStat for usize {
        fn into_stat(self) -> StatValue {
            StatValue::U64(self as u64)
        }
    }
    impl IntoStat for f64 {
        fn into_stat(self) -> StatValue {
            StatValue::F64(self)
        }
    }
    impl IntoStat for f32 {
        fn into_stat(self) -> StatValue {
            StatValue::F64(self as f64)
        }
    }
    impl IntoStat for &str {
        fn into_stat(self) -> StatValue {
            StatValue::Str(self.to_string().into())
        }
    }
    impl IntoStat for String {
        fn into_stat(self) -> StatValue {
            StatValue::Str(self.into())
        }
    }
}
