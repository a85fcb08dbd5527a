//! The one error type of ferroflow's tensor layer: every fallible call returns [`Result`].
//!
//! Messages start with the op, say what was expected and what came, lowercase, no final
//! period: `matmul: inner dimensions differ, lhs [2, 3], rhs [4, 5]`.

use crate::dtype::DType;

/// `Result` with ferroflow's [`Error`].
pub type Result<T, E = Error> = std::result::Result<T, E>;

/// Everything that can go wrong in a tensor operation.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
#[non_exhaustive]
pub enum Error {
    // ---- shapes ----
    /// Two shapes that must agree do not.
    #[error("{op}: {msg}, lhs {lhs:?}, rhs {rhs:?}")]
    ShapeMismatch {
        /// The op that checked.
        op: &'static str,
        /// What was expected.
        msg: &'static str,
        /// First shape.
        lhs: Vec<usize>,
        /// Second shape.
        rhs: Vec<usize>,
    },
    /// Shapes that cannot be broadcast together.
    #[error("{op}: shapes {lhs:?} and {rhs:?} cannot be broadcast together")]
    Broadcast {
        /// The op that checked.
        op: &'static str,
        /// First shape.
        lhs: Vec<usize>,
        /// Second shape.
        rhs: Vec<usize>,
    },
    /// An axis outside `-rank..rank`.
    #[error("{op}: axis {axis} is out of range for a tensor of rank {rank}")]
    AxisOutOfRange {
        /// The op that checked.
        op: &'static str,
        /// The axis given.
        axis: isize,
        /// The tensor's rank.
        rank: usize,
    },
    /// Any other invalid argument (bad shape for the op, bad attribute value).
    #[error("{op}: {msg}")]
    InvalidArgument {
        /// The op that checked.
        op: &'static str,
        /// What is wrong and what was given.
        msg: String,
    },
    /// An index (gather, scatter, one element read) outside its dimension.
    #[error("{op}: index {index} is out of range [0, {bound})")]
    IndexOutOfRange {
        /// The op that checked.
        op: &'static str,
        /// The bad index.
        index: i64,
        /// The dimension size.
        bound: usize,
    },

    // ---- dtypes ----
    /// Two inputs with different dtypes (ferroflow never promotes implicitly, like TF).
    #[error("{op}: dtypes differ, lhs {lhs}, rhs {rhs}; cast one explicitly with `cast`")]
    DTypeMismatch {
        /// The op that checked.
        op: &'static str,
        /// First dtype.
        lhs: DType,
        /// Second dtype.
        rhs: DType,
    },
    /// The op has no kernel for this dtype.
    #[error("{op}: dtype {dtype} is not supported, expected one of {expected}")]
    UnsupportedDType {
        /// The op that checked.
        op: &'static str,
        /// The dtype given.
        dtype: DType,
        /// What the op accepts, in words.
        expected: &'static str,
    },
    /// Host data of one element type was asked for as another.
    #[error("to_vec: tensor has dtype {actual}, asked for {requested}")]
    HostTypeMismatch {
        /// The tensor's dtype.
        actual: DType,
        /// The Rust type asked for.
        requested: DType,
    },

    // ---- devices and backends ----
    /// A device string that does not parse.
    #[error("unknown device {spec:?}: expected forms like \"/CPU:0\", \"/GPU:1\", \"/device:GPU:0\" or \"/job:worker/replica:0/task:1/device:CPU:0\"")]
    BadDeviceSpec {
        /// The string given.
        spec: String,
    },
    /// No backend serves this device kind.
    #[error("no backend for device {device}: {hint}")]
    BackendUnavailable {
        /// The device asked for.
        device: String,
        /// How to get one (the cargo feature to enable, the init call to make).
        hint: String,
    },
    /// Inputs live on different devices.
    #[error("{op}: inputs are on different devices, {lhs} and {rhs}; copy one with `to_device`")]
    DeviceMismatch {
        /// The op that checked.
        op: &'static str,
        /// First device.
        lhs: String,
        /// Second device.
        rhs: String,
    },
    /// The backend does not implement an op (or an op for a dtype).
    #[error("{op}: not supported by the {backend} backend{detail}")]
    NotSupportedByBackend {
        /// The op.
        op: &'static str,
        /// The backend's name.
        backend: &'static str,
        /// More detail (starts with ", " when not empty).
        detail: String,
    },
    /// A backend failed (out of memory, driver error).
    #[error("{backend} backend: {msg}")]
    Backend {
        /// The backend's name.
        backend: &'static str,
        /// What went wrong.
        msg: String,
    },
    /// A tensor larger than its device can hold, or an allocation the allocator refused
    /// (TF's `ResourceExhaustedError`, "OOM when allocating tensor with shape").
    #[error("{op}: out of memory allocating a tensor of shape {shape:?} and dtype {dtype} ({bytes} bytes) on {device}: {reason}")]
    ResourceExhausted {
        /// The op that would allocate.
        op: &'static str,
        /// The tensor's shape.
        shape: Vec<usize>,
        /// Its dtype.
        dtype: DType,
        /// The bytes asked for.
        bytes: u128,
        /// The device.
        device: String,
        /// Why: the most a tensor may take there (the device's memory, or a
        /// [`crate::device::tensor_limit_scope`]), or the allocator's refusal.
        reason: String,
    },
    // ---- gradients ----
    /// An op without a gradient function, reached by a backward pass that needs one.
    #[error("gradient: no gradient is defined for op {op}{detail}")]
    NoGradient {
        /// The op.
        op: &'static str,
        /// Why, or what to do instead (starts with ", " when not empty).
        detail: String,
    },
    /// Misuse of a gradient tape (second call on a non-persistent tape, unconnected target,
    /// output gradients of the wrong shape).
    #[error("GradientTape.{method}: {msg}")]
    Tape {
        /// The tape method called.
        method: &'static str,
        /// What is wrong.
        msg: String,
    },
    // ---- files and configuration ----
    /// Reading or writing a file failed.
    #[error("{path}: {msg}")]
    Io {
        /// The file.
        path: String,
        /// The operating system's message.
        msg: String,
    },
    /// A file or configuration is malformed, or does not match what it is loaded into.
    #[error("{what}: {msg}")]
    Format {
        /// The file, or the kind of configuration.
        what: String,
        /// What is wrong.
        msg: String,
    },
    /// One element of an input pipeline failed (a map function's error or panic, a corrupt
    /// record): the stage, the element's position in that stage's input, and the cause.
    #[error("{stage}: element {index}: {source}")]
    Pipeline {
        /// The transformation or reader (`map`, `TFRecordDataset`, ...).
        stage: String,
        /// The element's position (0-based) in the stage's input.
        index: u64,
        /// What went wrong.
        source: Box<Error>,
    },
    /// A peer of the cluster could not be reached, refused the call, or did not answer in time
    /// (TF's `UnavailableError` and `DeadlineExceededError`): names the operation and the
    /// peer, so a dead or hung worker is an error, never a hang.
    #[error("{op}: {peer}: {msg}")]
    Unavailable {
        /// The operation (`"all_reduce 3"`).
        op: String,
        /// The peer (`/job:worker/task:1 (127.0.0.1:2222)`).
        peer: String,
        /// What happened.
        msg: String,
    },
    /// A peer of the cluster ran the call and answered with an error (a parameter server
    /// that does not hold a variable, a worker whose function failed, a method the task does
    /// not serve): the peer was reached, so the call is not retried elsewhere.
    #[error("{op}: {peer} answered: {msg}")]
    Remote {
        /// The operation (`"ps.pull"`).
        op: String,
        /// The peer (`/job:ps/task:0 (127.0.0.1:2222)`).
        peer: String,
        /// The peer's error.
        msg: String,
    },
    /// A numeric error TensorFlow also reports (integer division by zero, ...).
    #[error("{op}: {msg}")]
    Arithmetic {
        /// The op.
        op: &'static str,
        /// What happened.
        msg: &'static str,
    },
    /// Something a graph function cannot record: a value read on the host while tracing
    /// (Python-style control flow on a tensor's value; use `cond`/`while_loop`), a host
    /// library call, an optimizer's host-side step counter.
    #[error("{op}: cannot run inside a traced function: {msg}")]
    NotTraceable {
        /// The op or call.
        op: &'static str,
        /// Why, and what to do instead.
        msg: String,
    },
}

impl Error {
    /// An [`Error::Io`] for `path` from an `std::io::Error`.
    pub fn io(path: impl AsRef<std::path::Path>, err: &std::io::Error) -> Self {
        Error::Io {
            path: path.as_ref().display().to_string(),
            msg: err.to_string(),
        }
    }
    /// Shorthand for [`Error::Format`].
    pub fn format(what: impl Into<String>, msg: impl Into<String>) -> Self {
        Error::Format {
            what: what.into(),
            msg: msg.into(),
        }
    }
    /// Shorthand for [`Error::InvalidArgument`].
    pub fn invalid(op: &'static str, msg: impl Into<String>) -> Self {
        Error::InvalidArgument {
            op,
            msg: msg.into(),
        }
    }
}
