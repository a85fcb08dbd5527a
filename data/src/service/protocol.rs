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
}

#[derive(Serialize, Deserialize)]
pub(crate) struct GetSplitReply {
    pub split: Option<(u64, u64)>,
}

#[derive(Serialize, Deserialize)]
pub(crate) struct GetElementRequest {
    pub task_id: u64,
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

/// A `GetElement` reply: the element's bytes, the header, the header's length as a `u32`
/// (a trailer, so the element's own buffer takes it without a copy).
pub(crate) fn frame(header: &ElementHeader, mut body: Vec<u8>) -> Bytes {
    let h = serde_json::to_vec(header).unwrap_or_default();
    body.reserve(h.len() + 4);
    body.extend_from_slice(&h);
    body.extend_from_slice(&(h.len() as u32).to_le_bytes());
    Bytes::from(body)
}

/// The header and the body of a framed reply.
pub(crate) fn unframe(bytes: &Bytes) -> Result<(ElementHeader, Bytes)> {
    let bad = |msg: String| Error::format("tf.data service", format!("malformed element: {msg}"));
    let n = bytes.len();
    let len = n
        .checked_sub(4)
        .map(|at| {
            u32::from_le_bytes([bytes[at], bytes[at + 1], bytes[at + 2], bytes[at + 3]]) as usize
        })
        .ok_or_else(|| bad("shorter than its header length".into()))?;
    let start = (n - 4)
        .checked_sub(len)
        .ok_or_else(|| bad(format!("a header of {len} bytes in {n} bytes")))?;
    let header = from_bytes("element header", &bytes[start..n - 4])?;
    Ok((header, bytes.slice(..start)))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_frame_round_trips_and_a_truncated_one_is_an_error() {
        let h = ElementHeader {
            kind: ElementKind::ElementError("bad row".into()),
            compressed: true,
            source_read: 7,
        };
        let f = frame(&h, b"body".to_vec());
        let (back, body) = unframe(&f).unwrap();
        assert_eq!(back.kind, h.kind);
        assert_eq!((back.compressed, back.source_read), (true, 7));
        assert_eq!(&body[..], b"body");
        assert!(unframe(&f.slice(..6)).is_err());
        assert!(unframe(&Bytes::from_static(b"{}\xff\xff\xff\xff")).is_err());
    }
}
