//! ferroflow: TensorFlow 2.4's feature set in Rust. This facade re-exports the micro-crates
//! and registers the backends compiled in.
//!
//! ```
//! ferroflow::init();
//! use ferroflow::{Tensor, DType};
//! let x = Tensor::from_vec(vec![1.0f32, 2.0, 3.0, 4.0], &[2, 2])?;
//! let p = x.softmax(-1)?;
//! let rows = p.reduce_sum(-1, false)?.to_vec::<f32>()?;
//! assert!(rows.iter().all(|s| (s - 1.0).abs() < 1e-6));
//! # Ok::<(), ferroflow::Error>(())
//! ```
//!
//! # Features
//! - `cpu` (default): the multi-threaded CPU backend, registered by [`init`] for `/CPU:0`.
//!
//! # Design
//! Backends register at run time ([`init`]) rather than through link-time magic: a crate that
//! is linked but never referenced may be dropped by the linker, so explicit registration is
//! the one approach that always works. Calling `init` twice is harmless.

#![warn(missing_docs)]

pub use ferroflow_tensor::*;

/// Automatic differentiation (`ferroflow-autodiff`): `GradientTape`, `custom_gradient`.
pub use ferroflow_autodiff as autodiff;

/// Optimizers and learning-rate schedules (`ferroflow-optim`).
pub use ferroflow_optim as optim;

/// Keras (`ferroflow-keras`): layers, models, `fit`, losses, metrics, callbacks.
pub use ferroflow_keras as keras;

/// Input pipelines (`ferroflow-data`, `tf.data`): `Dataset` and the file formats it reads
/// (TFRecord, CSV, `.npy`, IDX).
pub use ferroflow_data as data;

/// The NumPy API (`ferroflow-numpy`, `tf.experimental.numpy`): NumPy's functions and type
/// promotion over ferroflow tensors, `.npy`/`.npz`, `ndarray`/`nalgebra` interop.
pub use ferroflow_numpy as numpy;

/// The cluster layer (`ferroflow-cluster`): `ClusterSpec`, `TF_CONFIG` and the cluster
/// resolvers (`tf.distribute.cluster_resolver`).
pub use ferroflow_cluster as cluster;

/// Distribution (`ferroflow-distribute`, `tf.distribute`): the strategies (Mirrored,
/// MultiWorkerMirrored, ParameterServer with its `ClusterCoordinator`) and the collectives
/// across processes (`CollectiveGroup`: over gRPC or shared memory, MPI, or NCCL for GPU
/// tensors with the `cuda` feature).
pub use ferroflow_distribute as distribute;

/// The profiler (`ferroflow-profiler`, `tf.profiler` and `tf.summary`): traces, step time,
/// op stats and memory profiles in TensorFlow's file formats, which TensorBoard opens.
pub use ferroflow_profiler as profiler;

/// Graph functions (`ferroflow-function`, `tf.function`): closures traced into optimised
/// graphs, one per input signature.
pub use ferroflow_function as function;

/// The tensor core crate (`ferroflow-tensor`).
pub use ferroflow_tensor as tensor;

/// The CPU backend crate (`ferroflow-cpu`).
#[cfg(feature = "cpu")]
pub use ferroflow_cpu as cpu;
/// The native NVIDIA backend crate (`ferroflow-cuda`, features `cuda` for CUDA 12's
/// libraries or `cuda-13`), in progress: [`init`] registers it for NVIDIA GPUs, with NCCL
/// as its device collectives; its conformance suite passed on an H200 and passes on its
/// host emulation (the cuDNN and NCCL paths have run only there so far).
#[cfg(any(feature = "cuda", feature = "cuda-13"))]
pub use ferroflow_cuda as cuda;
#[cfg(feature = "wgpu")]
pub use ferroflow_wgpu as wgpu;

/// Registers every backend compiled in (idempotent). Call once at start-up.
///
/// GPUs: with the `cuda` (or `cuda-13`) feature, NVIDIA GPUs are `/GPU:0..` through the
/// CUDA backend and wgpu then serves none, so no GPU is listed twice (a process has one GPU
/// backend; another vendor's adapter beside an NVIDIA GPU needs a build without `cuda`).
/// Without a CUDA device, driver or library, the `wgpu` feature's adapters are the GPUs.
///
/// ```
/// ferroflow::init();
/// ferroflow::init(); // idempotent
/// assert!(!ferroflow::config::list_logical_devices(ferroflow::DeviceKind::Cpu).is_empty());
/// ```
pub fn init() {
    #[cfg(feature = "cpu")]
    ferroflow_cpu::register();
    #[cfg(any(feature = "cuda", feature = "cuda-13"))]
    let cuda_gpus = ferroflow_cuda::register();
    #[cfg(not(any(feature = "cuda", feature = "cuda-13")))]
    let cuda_gpus = 0;
    #[cfg(feature = "wgpu")]
    if cuda_gpus == 0 {
        ferroflow_wgpu::register();
    }
    let _ = cuda_gpus;
}

/// Device configuration, as `tf.config`.
pub mod config {
    use ferroflow_tensor::{Device, DeviceKind, Error, Result};

    /// Splits a physical device into `n` logical devices (TF's
    /// `tf.config.set_logical_device_configuration`). The CPU splits
    /// (`ferroflow_cpu::set_logical_devices`: `/CPU:0`..`/CPU:{n-1}`), so `MirroredStrategy`
    /// runs several replicas on a machine without GPUs; GPUs do not split here.
    ///
    /// ```
    /// ferroflow::init();
    /// use ferroflow::DeviceKind;
    /// ferroflow::config::set_logical_device_configuration(DeviceKind::Cpu, 2)?;
    /// assert_eq!(ferroflow::config::list_logical_devices(DeviceKind::Cpu).len(), 2);
    /// # Ok::<(), ferroflow::Error>(())
    /// ```
    pub fn set_logical_device_configuration(kind: DeviceKind, n: usize) -> Result<()> {
        match kind {
            #[cfg(feature = "cpu")]
            DeviceKind::Cpu => ferroflow_cpu::set_logical_devices(n),
            _ => Err(Error::invalid(
                "set_logical_device_configuration",
                format!(
                    "{} devices cannot be split into logical devices in this build{}",
                    kind.as_str(),
                    if kind == DeviceKind::Cpu {
                        " (the CPU needs the `cpu` cargo feature of ferroflow)"
                    } else {
                        ""
                    }
                ),
            )),
        }
    }

    /// The devices of `kind` the registered backends serve (`tf.config.list_logical_devices`).
    pub fn list_logical_devices(kind: DeviceKind) -> Vec<Device> {
        ferroflow_tensor::list_devices()
            .into_iter()
            .map(|(d, _)| d)
            .filter(|d| d.kind() == kind)
            .collect()
    }
}

/// Everything a typical program uses.
pub mod prelude {
    pub use ferroflow_autodiff::{GradientTape, Source};
    pub use ferroflow_data::{Dataset, AUTOTUNE};
    pub use ferroflow_tensor::{Axes, DType, Device, Padding, SliceSpec, Tensor, Variable};
}
