//! Devices as TensorFlow names them, the device scope, and the backend registry.
//!
//! ```
//! use ferroflow_tensor::{Device, DeviceKind};
//! let d = Device::parse("/device:GPU:1").unwrap();
//! assert_eq!((d.kind(), d.index()), (DeviceKind::Gpu, 1));
//! assert_eq!(d.to_string(), "/device:GPU:1");
//! ```

use crate::backend::Backend;
use crate::error::{Error, Result};
use std::cell::RefCell;
use std::fmt;
use std::sync::{Arc, RwLock};

/// The kind of a local device.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[cfg_attr(feature = "serde", derive(serde::Serialize, serde::Deserialize))]
pub enum DeviceKind {
    /// The host CPU.
    Cpu,
    /// A GPU (served by the wgpu, CUDA or Metal backend, whichever is registered).
    Gpu,
}

impl DeviceKind {
    /// TensorFlow's spelling (`CPU`, `GPU`).
    pub fn as_str(self) -> &'static str {
        match self {
            DeviceKind::Cpu => "CPU",
            DeviceKind::Gpu => "GPU",
        }
    }
}

/// A local device: kind and ordinal, e.g. `/device:GPU:0`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[cfg_attr(feature = "serde", derive(serde::Serialize, serde::Deserialize))]
pub struct Device {
    kind: DeviceKind,
    index: usize,
}

impl Device {
    /// `/device:CPU:0`.
    pub const CPU: Device = Device {
        kind: DeviceKind::Cpu,
        index: 0,
    };
    /// A device from its parts.
    pub fn new(kind: DeviceKind, index: usize) -> Device {
        Device { kind, index }
    }
    /// `/device:GPU:index`.
    pub fn gpu(index: usize) -> Device {
        Device {
            kind: DeviceKind::Gpu,
            index,
        }
    }
    /// The kind.
    pub fn kind(self) -> DeviceKind {
        self.kind
    }
    /// The ordinal among devices of its kind.
    pub fn index(self) -> usize {
        self.index
    }
    /// Parses any TF device string; job/replica/task parts are accepted and dropped (see
    /// [`DeviceSpec`] to keep them). A spec without a device part means `/CPU:0`.
    pub fn parse(spec: &str) -> Result<Device> {
        Ok(DeviceSpec::parse(spec)?.device.unwrap_or(Device::CPU))
    }
}

impl fmt::Display for Device {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "/device:{}:{}", self.kind.as_str(), self.index)
    }
}

/// A full TF device specification: `/job:worker/replica:0/task:1/device:CPU:0`.
#[derive(Debug, Clone, PartialEq, Eq, Hash, Default)]
pub struct DeviceSpec {
    /// `job:` part.
    pub job: Option<String>,
    /// `replica:` part.
    pub replica: Option<u32>,
    /// `task:` part.
    pub task: Option<u32>,
    /// `device:` part (or the short `/CPU:0` form).
    pub device: Option<Device>,
}

impl DeviceSpec {
    /// Parses "/CPU:0", "/GPU:1", "/device:GPU:0", "/job:worker/replica:0/task:1/device:CPU:0",
    /// case-insensitive in the device kind, as TF does.
    pub fn parse(spec: &str) -> Result<DeviceSpec> {
        let bad = || Error::BadDeviceSpec {
            spec: spec.to_string(),
        };
        let mut out = DeviceSpec::default();
        let s = spec.trim();
        if s.is_empty() {
            return Err(bad());
        }
        let s = s.strip_prefix('/').unwrap_or(s);
        for part in s.split('/') {
            let (key, rest) = part.split_once(':').ok_or_else(bad)?;
            match key.to_ascii_lowercase().as_str() {
                "job" if !rest.is_empty() => out.job = Some(rest.to_string()),
                "replica" => out.replica = Some(rest.parse().map_err(|_| bad())?),
                "task" => out.task = Some(rest.parse().map_err(|_| bad())?),
                "device" => out.device = Some(parse_kind_index(rest).ok_or_else(bad)?),
                _ => out.device = Some(parse_kind_index(part).ok_or_else(bad)?),
            }
        }
        Ok(out)
    }
}

fn parse_kind_index(s: &str) -> Option<Device> {
    let (kind, index) = s.split_once(':')?;
    let kind = match kind.to_ascii_uppercase().as_str() {
        "CPU" => DeviceKind::Cpu,
        "GPU" => DeviceKind::Gpu,
        _ => return None,
    };
    let index = if index == "*" { 0 } else { index.parse().ok()? };
    Some(Device { kind, index })
}

thread_local! {
    static DEVICE_STACK: RefCell<Vec<Device>> = const { RefCell::new(Vec::new()) };
}

/// The device new tensors are created on: the innermost [`with_device`] scope of this
/// thread, else `/CPU:0`. (TF places on GPU:0 when one exists; ferroflow asks you to say so.)
pub fn current_device() -> Device {
    DEVICE_STACK.with(|s| s.borrow().last().copied().unwrap_or(Device::CPU))
}

/// Guard returned by [`device_scope`]; the scope ends when it drops.
#[must_use = "the device scope ends when the guard is dropped"]
pub struct DeviceScope {
    _not_send: std::marker::PhantomData<*const ()>,
}

impl Drop for DeviceScope {
    fn drop(&mut self) {
        DEVICE_STACK.with(|s| s.borrow_mut().pop());
    }
}

/// Enters a device scope until the guard drops (`with tf.device(...)`).
pub fn device_scope(spec: &str) -> Result<DeviceScope> {
    let device = Device::parse(spec)?;
    backend_for(device)?;
    DEVICE_STACK.with(|s| s.borrow_mut().push(device));
    Ok(DeviceScope {
        _not_send: std::marker::PhantomData,
    })
}

/// Runs `f` with new tensors placed on `spec` (`with tf.device(spec): f()`).
///
/// ```no_run
/// use ferroflow_tensor::{with_device, Tensor};
/// let t = with_device("/CPU:0", || Tensor::zeros(&[2], ferroflow_tensor::DType::F32)).unwrap().unwrap();
/// assert_eq!(t.device().to_string(), "/device:CPU:0");
/// ```
pub fn with_device<R>(spec: &str, f: impl FnOnce() -> R) -> Result<R> {
    let _scope = device_scope(spec)?;
    Ok(f())
}

struct Registered {
    kind: DeviceKind,
    backend: Arc<dyn Backend>,
}

static REGISTRY: RwLock<Vec<Registered>> = RwLock::new(Vec::new());

/// Registers a backend for a device kind. The first backend registered for a kind serves
/// it; registering the same backend name again is a no-op.
pub fn register_backend(kind: DeviceKind, backend: Arc<dyn Backend>) {
    let mut reg = REGISTRY.write().unwrap_or_else(|e| e.into_inner());
    if reg
        .iter()
        .any(|r| r.kind == kind && r.backend.name() == backend.name())
    {
        return;
    }
    reg.push(Registered { kind, backend });
}

thread_local! {
    static TENSOR_LIMIT: std::cell::Cell<u64> = const { std::cell::Cell::new(u64::MAX) };
}

/// Ends a [`tensor_limit_scope`] when dropped (restoring the limit before it).
#[must_use = "the limit is lifted when the guard is dropped"]
pub struct TensorLimitScope {
    previous: u64,
    _not_send: std::marker::PhantomData<*const ()>,
}

impl Drop for TensorLimitScope {
    fn drop(&mut self) {
        TENSOR_LIMIT.with(|l| l.set(self.previous));
    }
}

/// Until the guard drops, refuses on this thread every new tensor larger than `bytes`
/// (a [`Error::ResourceExhausted`] naming the limit), on top of the device's own limit.
/// Nested scopes keep the smaller limit. Loaders of untrusted files use it so that sizes
/// claimed by a file cannot make ferroflow allocate more than the file can justify
/// (`Model::load` bounds each tensor by what its weight files hold).
///
/// ```no_run
/// use ferroflow_tensor::{device::tensor_limit_scope, DType, Tensor};
/// let _limit = tensor_limit_scope(1 << 20);
/// assert!(Tensor::zeros(&[1024], DType::F32).is_ok());
/// assert!(Tensor::zeros(&[1 << 20], DType::F32).is_err()); // 4 MiB
/// ```
pub fn tensor_limit_scope(bytes: u64) -> TensorLimitScope {
    let previous = TENSOR_LIMIT.with(|l| l.replace(l.get().min(bytes)));
    TensorLimitScope {
        previous,
        _not_send: std::marker::PhantomData,
    }
}

/// Whether the host's allocator would grant `bytes` now: requests of 64 MiB and up are
/// reserved and released once (so a size the allocator refuses, an address-space limit or
/// strict overcommit, is an error before a kernel, not an abort in it); smaller ones are not
/// probed (the probe would cost more than the risk it removes). For backends whose memory
/// is the host's ([`Backend::can_allocate`]).
///
/// ```
/// assert!(ferroflow_tensor::device::host_can_allocate(1024));
/// assert!(!ferroflow_tensor::device::host_can_allocate(u64::MAX));
/// ```
pub fn host_can_allocate(bytes: u64) -> bool {
    const PROBED: u64 = 64 << 20;
    bytes < PROBED
        || usize::try_from(bytes).is_ok_and(|b| Vec::<u8>::new().try_reserve_exact(b).is_ok())
}

/// Checks that a new tensor of `shape` and `dtype` fits on `device` (served by `backend`):
/// its element count does not overflow, its bytes stay below `isize::MAX` and below what
/// the backend says the device holds ([`Backend::memory_bytes`]). Returns the element
/// count. Ops call it (through [`crate::dispatch::Placement::check_output`] inside a
/// dispatch) before allocating, so an impossible tensor is an error, never an abort.
pub fn check_allocation(
    op: &'static str,
    shape: &[usize],
    dtype: crate::DType,
    device: Device,
    backend: &dyn Backend,
) -> Result<usize> {
    let n = crate::layout::checked_num_elements(op, shape)?;
    let bytes = n as u128 * dtype.size_in_bytes() as u128;
    let limit = backend
        .memory_bytes(device.index)
        .unwrap_or(u64::MAX)
        .min(isize::MAX as u64)
        .min(TENSOR_LIMIT.with(|l| l.get()));
    let refuse = |reason: String| Error::ResourceExhausted {
        op,
        shape: shape.to_vec(),
        dtype,
        bytes,
        device: device.to_string(),
        reason,
    };
    if bytes > limit as u128 {
        return Err(refuse(format!(
            "a tensor there may take at most {limit} bytes"
        )));
    }
    if !backend.can_allocate(device.index, bytes as u64) {
        return Err(refuse("the allocator refused that many bytes".into()));
    }
    Ok(n)
}

/// The backend serving `device`, or an error saying how to get one.
pub fn backend_for(device: Device) -> Result<Arc<dyn Backend>> {
    let reg = REGISTRY.read().unwrap_or_else(|e| e.into_inner());
    let Some(r) = reg.iter().find(|r| r.kind == device.kind) else {
        let hint = match device.kind {
            DeviceKind::Cpu => "call `ferroflow::init()` (the facade's default `cpu` feature) or `ferroflow_cpu::register()`",
            DeviceKind::Gpu => "enable the `wgpu` or `cuda` cargo feature of ferroflow and call `ferroflow::init()`",
        };
        return Err(Error::BackendUnavailable {
            device: device.to_string(),
            hint: hint.into(),
        });
    };
    let count = r.backend.device_count();
    if device.index >= count {
        return Err(Error::BackendUnavailable {
            device: device.to_string(),
            hint: format!(
                "the {} backend has {count} {} device(s)",
                r.backend.name(),
                device.kind.as_str()
            ),
        });
    }
    Ok(r.backend.clone())
}

/// Every device of every registered backend with its description (`cpu`; for GPUs the
/// backend, adapter and API, e.g. `wgpu: NVIDIA H200 (Vulkan)`), like
/// `tf.config.list_logical_devices()`.
pub fn list_devices() -> Vec<(Device, String)> {
    let reg = REGISTRY.read().unwrap_or_else(|e| e.into_inner());
    let mut out = vec![];
    for r in reg.iter() {
        for i in 0..r.backend.device_count() {
            out.push((Device::new(r.kind, i), r.backend.device_description(i)));
        }
    }
    out
}

/// Whether `device` has a backend that stores and computes `dtype` (false when no backend
/// serves the device).
pub fn device_supports(device: Device, dtype: crate::DType) -> bool {
    backend_for(device).is_ok_and(|b| b.supports_dtype(device.index, dtype))
}

/// Waits until the work queued on `device` has finished (asynchronous backends queue
/// kernels; a no-op on the CPU): for timing, as TF's `context.async_wait()`.
pub fn synchronize(device: Device) -> crate::Result<()> {
    backend_for(device)?.synchronize(device.index)
}

/// Whether `device`'s backend has the fused kernel `kernel` for `dtype`
/// ([`Backend::has_fused`]; false when no backend serves the device).
pub fn device_has_fused(device: Device, kernel: crate::FusedKernel, dtype: crate::DType) -> bool {
    backend_for(device).is_ok_and(|b| b.has_fused(device.index, kernel, dtype))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_tf_device_strings() {
        assert_eq!(Device::parse("/CPU:0").unwrap(), Device::CPU);
        assert_eq!(Device::parse("/gpu:1").unwrap(), Device::gpu(1));
        assert_eq!(Device::parse("/device:GPU:0").unwrap(), Device::gpu(0));
        let s = DeviceSpec::parse("/job:worker/replica:0/task:1/device:CPU:0").unwrap();
        assert_eq!(s.job.as_deref(), Some("worker"));
        assert_eq!(
            (s.replica, s.task, s.device),
            (Some(0), Some(1), Some(Device::CPU))
        );
        for bad in ["", "/TPU:0", "/device:GPU", "/job", "/CPU:x"] {
            assert!(
                matches!(Device::parse(bad), Err(Error::BadDeviceSpec { .. })),
                "{bad}"
            );
        }
    }

    #[test]
    fn missing_backend_names_the_fix() {
        let e = backend_for(Device::gpu(7))
            .err()
            .map(|e| e.to_string())
            .unwrap_or_default();
        assert!(e.contains("GPU:7"), "{e}");
    }
}
