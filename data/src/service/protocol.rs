//! The messages the dispatcher, the workers and the consumers exchange: methods of the
//! cluster layer's task server (`Task.Call`), each a JSON request and reply, except the
//! element replies, which frame a JSON header and the element's bytes.

use bytes::Bytes;
use ferroflow_tensor::{Error, Result};
use serde::de::DeserializeOwned;
use serde::{Deserialize, Serialize};

use super::{Compression, ProcessingMode};

pub(crate) const REGISTER_DATASET: &str = "tf.data.Dispatcher/GetOrRegisterDataset";
pub(crate) const GET_DATASET: &str = "tf.data.Dispatcher/GetDatasetDef";
pub(crate) const CREATE_JOB: &str = "tf.data.Dispatcher/GetOrCreateJob";
pub(crate) const CLIENT_HEARTBEAT: &str = "tf.data.Dispatcher/ClientHeartbeat";
pub(crate) const WORKER_HEARTBEAT: &str = "tf.data.Dispatcher/WorkerHeartbeat";
pub(crate) const GET_SPLIT: &str = "tf.data.Dispatcher/GetSplit";
pub(crate) const GET_ELEMENT: &str = "tf.data.Worker/GetElement";

/// A registered pipeline and its parameters: what a dataset id stands for.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub(crate) struct DatasetDef {
    pub pipeline: String,
    /// The parameters as JSON text (compared as written: the consumer's own serialisation).
    pub params: String,
    /// The element's Rust type (a consumer of another type is refused).
    pub element_type: String,
}

#[derive(Serialize, Deserialize)]
pub(crate) struct RegisterDatasetReply {
    pub dataset_id: u64,
}

#[derive(Serialize, Deserialize)]
pub(crate) struct GetDatasetRequest {
    pub dataset_id: u64,
}

#[derive(Serialize, Deserialize)]
pub(crate) struct CreateJobRequest {
    pub dataset_id: u64,
    pub mode: ProcessingMode,
    pub job_name: Option<String>,
    pub compression: Compression,
}

#[derive(Serialize, Deserialize)]
pub(crate) struct CreateJobReply {
    pub job_id: u64,
}

#[derive(Serialize, Deserialize)]
pub(crate) struct ClientHeartbeatRequest {
    pub job_id: u64,
}

/// Where a task of a job stands, as the dispatcher knows it.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub(crate) enum TaskState {
    Running,
    Finished,
    /// Its worker stopped heartbeating: what it had not delivered is lost.
    Lost,
}

#[derive(Clone, Debug, Serialize, Deserialize)]
pub(crate) struct TaskInfo {
    pub task_id: u64,
    pub worker_address: String,
    pub state: TaskState,
    /// Source elements of the splits handed to this task (distributed epochs).
    pub split_elements: u64,
}

#[derive(Serialize, Deserialize)]
pub(crate) struct ClientHeartbeatReply {
    pub tasks: Vec<TaskInfo>,
    /// Every task is finished or lost and (distributed epochs) every split is handed out.
    pub finished: bool,
    /// Workers heartbeating now.
    pub live_workers: usize,
}

#[derive(Serialize, Deserialize)]
pub(crate) struct WorkerHeartbeatRequest {
    pub worker_address: String,
    /// Which start of the worker process this is: another value at the same address is a
    /// restarted worker, and the tasks the earlier one ran are lost.
    pub incarnation: u64,
    pub pipelines: Vec<String>,
    pub finished_tasks: Vec<u64>,
}

/// A task for a worker: produce the elements of one job's pipeline.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub(crate) struct TaskDef {
    pub task_id: u64,
    pub job_id: u64,
    pub dataset: DatasetDef,
    pub mode: ProcessingMode,
    pub compression: Compression,
}

#[derive(Serialize, Deserialize)]
pub(crate) struct WorkerHeartbeatReply {
    /// The worker's tasks that are still running, new ones included.
    pub tasks: Vec<TaskDef>,
}

#[derive(Serialize, Deserialize)]
pub(crate) struct GetSplitRequest {
    pub job_id: u64,
    pub task_id: u64,
    pub num_elements: u64,
    /// Which of the task's splits this is (0, 1, ...): asking again for the same index
    /// gives the same split, so a worker may retry a call whose reply it lost.
    pub split_index: u64,
    /// How many source elements the worker would like (0: the dispatcher's choice): what
    /// its pipeline reads in about `SPLIT_TIME` at the pace of its last split, so a fast
    /// pipeline does not wait on a dispatcher call every few elements.
    #[serde(default)]
    pub want: u64,
}

#[derive(Serialize, Deserialize)]
pub(crate) struct GetSplitReply {
    pub split: Option<(u64, u64)>,
}

#[derive(Serialize, Deserialize)]
pub(crate) struct GetElementRequest {
    pub task_id: u64,
    /// The reply carries every ready element up to about this many bytes (at least one).
    pub max_bytes: u64,
    /// Whether the consumer wants the elements compressed, under a job's
    /// [`Compression::Auto`](super::Compression::Auto) (the consumer knows where it is).
    #[serde(default = "compressed_by_default")]
    pub compressed: bool,
}

fn compressed_by_default() -> bool {
    true
}

/// What a `GetElement` reply carries.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub(crate) enum ElementKind {
    /// An element follows the header.
    Element,
    /// Nothing yet: ask again.
    NotReady,
    /// The task's pipeline is exhausted.
    End,
    /// This element failed in the pipeline (the next may not): the message names why.
    ElementError(String),
    /// The task cannot run at all (an unknown pipeline, bad parameters): it ends.
    TaskError(String),
    /// The worker runs no such task (it restarted, or the dispatcher gave it up).
    UnknownTask,
}

#[derive(Serialize, Deserialize)]
pub(crate) struct ElementHeader {
    pub kind: ElementKind,
    pub compressed: bool,
    /// Source elements the worker's pipeline had read when this element left it.
    pub source_read: u64,
}

/// `value` as a request or reply payload.
pub(crate) fn to_bytes<T: Serialize>(value: &T) -> Bytes {
    Bytes::from(serde_json::to_vec(value).unwrap_or_default())
}

/// A payload read as `T`; `what` names the message in the error.
pub(crate) fn from_bytes<T: DeserializeOwned>(what: &str, bytes: &[u8]) -> Result<T> {
    serde_json::from_slice(bytes)
        .map_err(|e| Error::format("tf.data service", format!("malformed {what}: {e}")))
}

/// A `GetElement` reply: one or more framed elements, each its bytes, its header, and the
/// header's length as a `u32` (a trailer, so the first element's own buffer takes the
/// reply without a copy), with the body's length in front of that: `body | header |
/// body_len: u64 | header_len: u32`, read from the end.
pub(crate) struct Frames(Vec<u8>);

impl Frames {
    /// A reply whose first element is `body` (its buffer becomes the reply's).
    pub fn new(header: &ElementHeader, body: Vec<u8>) -> Frames {
        let mut f = Frames(body);
        let len = f.0.len();
        f.trail(header, len);
        f
    }

    /// Appends another element.
    pub fn push(&mut self, header: &ElementHeader, body: &[u8]) {
        self.0.extend_from_slice(body);
        self.trail(header, body.len());
    }

    fn trail(&mut self, header: &ElementHeader, body_len: usize) {
        let h = serde_json::to_vec(header).unwrap_or_default();
        self.0.extend_from_slice(&h);
        self.0.extend_from_slice(&(body_len as u64).to_le_bytes());
        self.0.extend_from_slice(&(h.len() as u32).to_le_bytes());
    }

    pub fn into_bytes(self) -> Bytes {
        Bytes::from(self.0)
    }
}

/// A reply of one element.
pub(crate) fn frame(header: &ElementHeader, body: Vec<u8>) -> Bytes {
    Frames::new(header, body).into_bytes()
}

/// The elements of a framed reply, in order: each header with its body (a view into
/// `bytes`, not a copy).
pub(crate) fn unframe(bytes: &Bytes) -> Result<Vec<(ElementHeader, Bytes)>> {
    let bad = |msg: String| Error::format("tf.data service", format!("malformed element: {msg}"));
    let word = |at: usize, n: usize| -> u64 {
        let mut w = [0u8; 8];
        w[..n].copy_from_slice(&bytes[at..at + n]);
        u64::from_le_bytes(w)
    };
    let mut out = vec![];
    let mut end = bytes.len();
    while end > 0 {
        let (header_len, body_len) = match end.checked_sub(12) {
            Some(at) => (word(at + 8, 4) as usize, word(at, 8)),
            None => return Err(bad(format!("{end} bytes cannot hold a frame's trailer"))),
        };
        let header_at = (end - 12)
            .checked_sub(header_len)
            .ok_or_else(|| bad(format!("a header of {header_len} bytes in {end} bytes")))?;
        let body_at = usize::try_from(body_len)
            .ok()
            .and_then(|b| header_at.checked_sub(b))
            .ok_or_else(|| bad(format!("a body of {body_len} bytes in {header_at} bytes")))?;
        let header = from_bytes("element header", &bytes[header_at..end - 12])?;
        out.push((header, bytes.slice(body_at..header_at)));
        end = body_at;
    }
    if out.is_empty() {
        return Err(bad("an empty reply".into()));
    }
    out.reverse();
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn frames_round_trip_and_a_truncated_one_is_an_error() {
        let h = |kind: ElementKind, source_read| ElementHeader {
            kind,
            compressed: true,
            source_read,
        };
        let mut f = Frames::new(
            &h(ElementKind::ElementError("bad row".into()), 7),
            b"body".to_vec(),
        );
        f.push(&h(ElementKind::Element, 8), b"");
        f.push(&h(ElementKind::Element, 9), b"third");
        let f = f.into_bytes();
        let back = unframe(&f).unwrap();
        assert_eq!(back.len(), 3);
        assert_eq!(back[0].0.kind, ElementKind::ElementError("bad row".into()));
        assert_eq!((back[0].0.compressed, back[0].0.source_read), (true, 7));
        assert_eq!(&back[0].1[..], b"body");
        assert_eq!((&back[1].1[..], back[1].0.source_read), (&b""[..], 8));
        assert_eq!((&back[2].1[..], back[2].0.source_read), (&b"third"[..], 9));
        for cut in [1, 6, 12, f.len() - 1] {
            assert!(unframe(&f.slice(cut..)).is_err() || cut == 0, "cut {cut}");
            assert!(unframe(&f.slice(..f.len() - cut)).is_err(), "cut {cut}");
        }
        assert!(unframe(&Bytes::new()).is_err());
        assert!(unframe(&Bytes::from_static(
            b"{}\xff\xff\xff\xff\xff\xff\xff\xff\x02\0\0\0"
        ))
        .is_err());
    }
}
