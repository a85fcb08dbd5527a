//! Pipelines by name: Rust closures cannot travel, so every process of a tf.data service job
//! (workers and trainers run the same binary) registers the pipelines it may run, and the
//! dispatcher hands out a name and parameters.

use ferroflow_tensor::{Error, Result};
use std::any::Any;
use std::collections::BTreeMap;
use std::sync::{Arc, OnceLock, RwLock};

use crate::{encode_element, Dataset, Structure};

type Typed<T> = Arc<dyn Fn(&serde_json::Value) -> Result<Dataset<T>> + Send + Sync>;
type Encoded = Arc<dyn Fn(&serde_json::Value) -> Result<Dataset<Vec<u8>>> + Send + Sync>;

struct Entry {
    element_type: &'static str,
    typed: Arc<dyn Any + Send + Sync>,
    encoded: Encoded,
}

fn registry() -> &'static RwLock<BTreeMap<String, Entry>> {
    static R: OnceLock<RwLock<BTreeMap<String, Entry>>> = OnceLock::new();
    R.get_or_init(Default::default)
}

/// Registers the pipeline `name`: `build` makes its dataset from the parameters a trainer
/// gives ([`pipeline`]). Workers and trainers register the same pipelines (they run the same
/// binary) before they start; registering a name again replaces it.
///
/// For [`ProcessingMode::DistributedEpoch`](super::ProcessingMode), the dataset must begin
/// with one splittable source (`from_tensor_slices`, `range`, `list_files`): the dispatcher
/// hands its element ranges out among the workers.
///
/// ```
/// ferroflow::init();
/// use ferroflow_data::{service, Dataset};
/// service::register_pipeline("squares", |p: &serde_json::Value| {
///     let n = p["n"].as_i64().ok_or_else(|| ferroflow_tensor::Error::invalid("squares", "needs an integer n"))?;
///     Ok(Dataset::range(0, n, 1).map(|x| x.mul(&x)))
/// });
/// let ds = service::pipeline::<ferroflow_tensor::Tensor>("squares", serde_json::json!({"n": 4}))?;
/// let v: Vec<i64> = ds.iter().map(|x| x?.item::<i64>()).collect::<Result<_, _>>()?;
/// assert_eq!(v, vec![0, 1, 4, 9]);
/// # Ok::<(), ferroflow_tensor::Error>(())
/// ```
pub fn register_pipeline<T, F>(name: &str, build: F)
where
    T: Structure,
    F: Fn(&serde_json::Value) -> Result<Dataset<T>> + Send + Sync + 'static,
{
    let typed: Typed<T> = Arc::new(build);
    let inner = typed.clone();
    let encoded: Encoded =
        Arc::new(move |params| Ok(inner(params)?.map(|element: T| encode_element(&element))));
    registry()
        .write()
        .unwrap_or_else(|e| e.into_inner())
        .insert(
            name.to_string(),
            Entry {
                element_type: std::any::type_name::<T>(),
                typed: Arc::new(typed),
                encoded,
            },
        );
}

/// The names of the registered pipelines.
pub fn registered_pipelines() -> Vec<String> {
    registry()
        .read()
        .unwrap_or_else(|e| e.into_inner())
        .keys()
        .cloned()
        .collect()
}

fn unknown(name: &str) -> Error {
    let known = registered_pipelines();
    Error::invalid(
        "tf.data service",
        format!(
            "no pipeline named {name:?} is registered in this program (registered: {}); \
             register it with service::register_pipeline before starting workers and trainers",
            if known.is_empty() {
                "none".to_string()
            } else {
                known.join(", ")
            }
        ),
    )
}

/// The registered pipeline `name` built with `params`, to iterate in this process or to
/// hand to the service with [`distribute`](super::distribute) (which sends its name and
/// parameters). An error when no such pipeline is registered, when it yields elements of
/// another type than `T`, or when its builder refuses the parameters.
pub fn pipeline<T: Structure>(name: &str, params: serde_json::Value) -> Result<Dataset<T>> {
    let typed = {
        let r = registry().read().unwrap_or_else(|e| e.into_inner());
        let entry = r.get(name).ok_or_else(|| unknown(name))?;
        if entry.element_type != std::any::type_name::<T>() {
            return Err(Error::invalid(
                "tf.data service",
                format!(
                    "pipeline {name:?} yields {}, not {}",
                    entry.element_type,
                    std::any::type_name::<T>()
                ),
            ));
        }
        entry.typed.clone()
    };
    let build = typed
        .downcast_ref::<Typed<T>>()
        .ok_or_else(|| Error::invalid("tf.data service", "pipeline type mismatch"))?;
    let mut ds = build(&params)?;
    ds.pipeline = Some(Arc::new(super::protocol::DatasetDef {
        pipeline: name.to_string(),
        params: params.to_string(),
        element_type: std::any::type_name::<T>().to_string(),
    }));
    Ok(ds)
}

/// What a worker runs for a task: the pipeline's elements, encoded.
pub(crate) fn build_encoded(def: &super::protocol::DatasetDef) -> Result<Dataset<Vec<u8>>> {
    let (element_type, encoded) = {
        let r = registry().read().unwrap_or_else(|e| e.into_inner());
        let entry = r.get(&def.pipeline).ok_or_else(|| unknown(&def.pipeline))?;
        (entry.element_type, entry.encoded.clone())
    };
    if element_type != def.element_type {
        return Err(Error::invalid(
            "tf.data service",
            format!(
                "pipeline {:?} yields {element_type} in this worker, the trainer wants {}",
                def.pipeline, def.element_type
            ),
        ));
    }
    let params: serde_json::Value = serde_json::from_str(&def.params).map_err(|e| {
        Error::invalid(
            "tf.data service",
            format!(
                "the parameters of pipeline {:?} are not JSON: {e}",
                def.pipeline
            ),
        )
    })?;
    encoded(&params)
}

/// Registers the pipelines every worker of the `ferroflow data-service worker` command
/// serves (a program's own pipelines need a [`WorkerServer`](super::WorkerServer) in that
/// program):
/// - `"range"`, `{"start": 0, "stop": n, "step": 1}`: `Dataset::range` (a tensor each);
/// - `"mnist"`, `{"dir": "datasets/mnist", "split": "train", "batch_size": 128,
///   "drop_remainder": false}`: MNIST's images (`u8`, `[28, 28, 1]`) and labels (`i64`) from
///   IDX files, batched when `batch_size` is given (a `(images, labels)` tuple each).
///
/// ```
/// ferroflow::init();
/// use ferroflow_data::service;
/// service::register_builtin_pipelines();
/// let ds = service::pipeline::<ferroflow_tensor::Tensor>("range", serde_json::json!({"stop": 3}))?;
/// assert_eq!(ds.iter().count(), 3);
/// # Ok::<(), ferroflow_tensor::Error>(())
/// ```
pub fn register_builtin_pipelines() {
    fn int(p: &serde_json::Value, key: &str, default: Option<i64>) -> Result<i64> {
        match p.get(key) {
            None | Some(serde_json::Value::Null) => default.ok_or_else(|| {
                Error::invalid("tf.data service", format!("parameter {key:?} is required"))
            }),
            Some(v) => v.as_i64().ok_or_else(|| {
                Error::invalid(
                    "tf.data service",
                    format!("parameter {key:?} must be an integer, got {v}"),
                )
            }),
        }
    }
    register_pipeline("range", |p| {
        Ok(Dataset::range(
            int(p, "start", Some(0))?,
            int(p, "stop", None)?,
            int(p, "step", Some(1))?,
        ))
    });
    register_pipeline("mnist", |p| {
        let text = |key: &str, default: &str| -> Result<String> {
            match p.get(key) {
                None | Some(serde_json::Value::Null) => Ok(default.to_string()),
                Some(v) => v.as_str().map(str::to_string).ok_or_else(|| {
                    Error::invalid(
                        "tf.data service",
                        format!("parameter {key:?} must be a string, got {v}"),
                    )
                }),
            }
        };
        let (x, y) = crate::idx::load_mnist_pixels(
            text("dir", "datasets/mnist")?,
            &text("split", "train")?,
        )?;
        let ds = Dataset::from_tensor_slices((x, y))?;
        match int(p, "batch_size", Some(0))? {
            0 => Ok(ds),
            b if b > 0 => ds.batch(
                b as usize,
                p.get("drop_remainder")
                    .and_then(|v| v.as_bool())
                    .unwrap_or(false),
            ),
            b => Err(Error::invalid(
                "tf.data service",
                format!("batch_size must be positive, got {b}"),
            )),
        }
    });
}
