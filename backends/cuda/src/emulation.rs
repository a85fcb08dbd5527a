//! The backend's CUDA C run on the host: each kernel source, with a shim for CUDA's built-ins,
//! compiled by the system's C++ compiler into a shared library and launched as a loop, while
//! everything else (views, window geometry, launch parameters, error words, the GEMM's
//! operand forms and leading dimensions, checked by a GEMM written from cuBLAS's definition)
//! is the backend's own code. It lets the conformance suite check the kernels and the
//! backend's logic on a machine without a GPU (`tests/emulated.rs`); what it cannot check is
//! CUDA itself: NVRTC's code, cuBLAS, the driver. A launch with one thread per block walks
//! the grid-stride loop in order; a block-level kernel (the reductions' shared-memory trees)
//! runs each block's threads as real threads meeting at a barrier, one block at a time (the
//! backend sends reductions with at most a few outputs there, to bound the threads).
//!
//! ```no_run
//! // Serves `/GPU:0` with the emulated device (needs a C++ compiler: `$CXX`, else `c++`).
//! if ferroflow_cuda::emulation::available() {
//!     ferroflow_cuda::emulation::register()?;
//! }
//! # Ok::<(), ferroflow_tensor::Error>(())
//! ```

use std::path::PathBuf;
use std::sync::{Arc, OnceLock};

use ferroflow_tensor::{DeviceKind, Error, Result};

use crate::exec::Gpu;
use crate::{Cuda, BACKEND};

/// Whether the emulated device runs convolutions through the backend's cuDNN path with a
/// host stand-in for cuDNN ([`set_cudnn_stand_in`]).
static CUDNN_STAND_IN: std::sync::atomic::AtomicBool = std::sync::atomic::AtomicBool::new(false);

/// Sends the emulated device's float convolutions down the backend's cuDNN path, with a
/// host stand-in computing cuDNN's convolutions by their definitions (NHWC data, KRSC
/// filters, padding alike on both sides) in float64: the conformance suite then checks what
/// the backend hands cuDNN and makes of its results (zeros appended where TF pads one more
/// after, the filter reordered, the gradients cut and transposed back) without a GPU. Off
/// by default (the emulation then checks the backend's own convolution kernels).
///
/// ```
/// ferroflow_cuda::emulation::set_cudnn_stand_in(true);
/// assert!(ferroflow_cuda::emulation::cudnn_stand_in());
/// ferroflow_cuda::emulation::set_cudnn_stand_in(false);
/// ```
pub fn set_cudnn_stand_in(enabled: bool) {
    CUDNN_STAND_IN.store(enabled, std::sync::atomic::Ordering::Relaxed);
}

/// Whether [`set_cudnn_stand_in`] is on.
///
/// ```
/// let _ = ferroflow_cuda::emulation::cudnn_stand_in();
/// ```
pub fn cudnn_stand_in() -> bool {
    CUDNN_STAND_IN.load(std::sync::atomic::Ordering::Relaxed)
}

/// The C++ compiler the emulation uses: `$CXX`, else `c++`.
///
/// ```
/// assert!(!ferroflow_cuda::emulation::compiler().as_os_str().is_empty());
/// ```
pub fn compiler() -> PathBuf {
    std::env::var_os("CXX")
        .filter(|c| !c.is_empty())
        .map_or_else(|| PathBuf::from("c++"), PathBuf::from)
}

/// True when [`compiler`] runs.
///
/// ```
/// let _ = ferroflow_cuda::emulation::available();
/// ```
pub fn available() -> bool {
    std::process::Command::new(compiler())
        .arg("--version")
        .output()
        .is_ok_and(|o| o.status.success())
}

/// The emulated device's backend: one per process (registering again is a no-op, as for a
/// real GPU).
static EMULATED: OnceLock<Arc<Cuda>> = OnceLock::new();

/// The emulated backend, once [`register`] made it.
pub(crate) fn emulated() -> Option<&'static Arc<Cuda>> {
    EMULATED.get()
}

/// Registers one emulated CUDA device as `/GPU:0` (backend name `cuda`, as a real one) and
/// returns 1 ([`register_devices`] with 1).
///
/// ```no_run
/// ferroflow_cuda::emulation::register()?;
/// # Ok::<(), ferroflow_tensor::Error>(())
/// ```
pub fn register() -> Result<usize> {
    register_devices(1)
}

/// Registers `count` emulated CUDA devices as `/GPU:0..` (for strategies over several
/// local GPUs) and returns how many there are: the process' first call fixes the count,
/// later calls return it. Each device compiles its kernels on first use in a folder of its
/// own under the system's temporary directory, removed once they are loaded. An error when
/// no C++ compiler runs.
///
/// ```no_run
/// assert_eq!(ferroflow_cuda::emulation::register_devices(2)?, 2);
/// # Ok::<(), ferroflow_tensor::Error>(())
/// ```
pub fn register_devices(count: usize) -> Result<usize> {
    if !available() {
        return Err(Error::Backend {
            backend: BACKEND,
            msg: format!(
                "the host emulation needs a C++ compiler ({} did not run; set CXX)",
                compiler().display()
            ),
        });
    }
    let cuda = EMULATED.get_or_init(|| {
        let gpus = (0..count.max(1))
            .map(|ordinal| {
                // Made while a library compiles, removed after it loads.
                let dir = std::env::temp_dir().join(format!(
                    "ferroflow-cuda-emulation-{}-{ordinal}",
                    std::process::id()
                ));
                Gpu::host(ordinal, dir)
            })
            .collect();
        Arc::new(Cuda { gpus })
    });
    ferroflow_tensor::register_backend(DeviceKind::Gpu, cuda.clone());
    // NCCL's stand-in serves the emulated devices.
    ferroflow_tensor::distribution::register_device_collectives(Arc::new(
        crate::nccl::NcclCollectives,
    ));
    Ok(cuda.gpus.len())
}
