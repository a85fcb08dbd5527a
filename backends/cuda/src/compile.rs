//! NVRTC: CUDA C to PTX, with errors that name the kernel and the line.

use crate::source::KernelSource;
use crate::BACKEND;
use ferroflow_tensor::{Error, Result};

/// The CUDA major version the bindings are built for (cargo feature `cuda-12` or
/// `cuda-13`), whose NVRTC and cuBLAS the backend loads.
pub const CUDA_MAJOR: u32 = if cfg!(feature = "cuda-13") { 13 } else { 12 };

/// The NVIDIA libraries the backend loads at run time, with what each is for.
pub const LIBRARIES: [(&str, &str); 3] = [
    (
        "libcuda (the NVIDIA driver)",
        "devices, memory and kernel launches",
    ),
    (
        if CUDA_MAJOR == 13 {
            "libnvrtc (NVRTC, CUDA 13)"
        } else {
            "libnvrtc (NVRTC, CUDA 12)"
        },
        "compiling the kernels at run time",
    ),
    (
        if CUDA_MAJOR == 13 {
            "libcublas (cuBLAS, CUDA 13)"
        } else {
            "libcublas (cuBLAS, CUDA 12)"
        },
        "matrix products",
    ),
];

/// Which of [`LIBRARIES`] the dynamic loader cannot find (searched by the names cudarc
/// knows, along `LD_LIBRARY_PATH` and the system's library paths). Empty when all load.
///
/// ```
/// // On a machine without NVIDIA's libraries every name is listed; never a panic.
/// let missing = ferroflow_cuda::missing_libraries();
/// assert!(missing.len() <= 3);
/// ```
pub fn missing_libraries() -> Vec<&'static str> {
    // SAFETY: each call only tries `dlopen` on the library names (libloading) and closes
    // what it opened; no symbol is called.
    let present = unsafe {
        [
            cudarc::driver::sys::is_culib_present(),
            cudarc::nvrtc::sys::is_culib_present(),
            cudarc::cublas::sys::is_culib_present(),
        ]
    };
    LIBRARIES
        .iter()
        .zip(present)
        .filter(|(_, here)| !here)
        .map(|((name, _), _)| *name)
        .collect()
}

/// The CUDA version the driver supports and NVRTC's, with the bindings' (for reports:
/// BENCHMARKS.md records them), or the error naming the libraries that do not load.
///
/// ```
/// match ferroflow_cuda::versions() {
///     Ok(v) => assert!(v.contains("NVRTC")),
///     Err(missing) => assert!(missing.contains("could not be loaded")),
/// }
/// ```
pub fn versions() -> std::result::Result<String, String> {
    let missing = missing_libraries();
    if missing.iter().any(|m| !m.starts_with("libcublas")) {
        return Err(library_missing(&missing.join(", ")).to_string());
    }
    let (mut driver, mut major, mut minor) = (0, 0, 0);
    // SAFETY: both libraries load (checked above); each call writes plain integers.
    let (d, n) = unsafe {
        (
            cudarc::driver::sys::cuDriverGetVersion(&mut driver),
            cudarc::nvrtc::sys::nvrtcVersion(&mut major, &mut minor),
        )
    };
    if d != cudarc::driver::sys::CUresult::CUDA_SUCCESS
        || n != cudarc::nvrtc::sys::nvrtcResult::NVRTC_SUCCESS
    {
        return Err(format!(
            "asking the versions failed: driver {d:?}, NVRTC {n:?}"
        ));
    }
    Ok(format!(
        "driver for CUDA {}.{}, NVRTC {major}.{minor}, bindings for CUDA {CUDA_MAJOR}",
        driver / 1000,
        (driver % 1000) / 10
    ))
}

/// True when NVRTC loads (kernels can be compiled, a GPU or not).
pub fn nvrtc_available() -> bool {
    // SAFETY: as in `missing_libraries`.
    unsafe { cudarc::nvrtc::sys::is_culib_present() }
}

/// The error for a library that is not there, naming it and how to get it.
pub(crate) fn library_missing(what: &str) -> Error {
    Error::Backend {
        backend: BACKEND,
        msg: format!(
            "{what} could not be loaded: install NVIDIA's driver and CUDA {CUDA_MAJOR} libraries \
             (or the pip wheels nvidia-cuda-nvrtc-cu{CUDA_MAJOR} and nvidia-cublas-cu{CUDA_MAJOR}) \
             and put their lib folders on LD_LIBRARY_PATH; the crate's feature `cuda-12` or \
             `cuda-13` picks the version"
        ),
    }
}

/// Compiles `kernel` to PTX for the virtual architecture `arch` (`compute_80`,
/// `compute_90`, ...). A compile error names the kernel, the first failing line of its
/// source and NVRTC's message.
pub fn compile_ptx(kernel: &KernelSource, arch: &'static str) -> Result<cudarc::nvrtc::Ptx> {
    if !nvrtc_available() {
        return Err(library_missing("libnvrtc (NVRTC)"));
    }
    let options = cudarc::nvrtc::CompileOptions {
        arch: Some(arch),
        name: Some(format!("{}.cu", kernel.name)),
        // IEEE division and square roots, no flush of subnormals: the CPU backend's numbers.
        ftz: Some(false),
        prec_div: Some(true),
        prec_sqrt: Some(true),
        fmad: Some(false),
        ..Default::default()
    };
    cudarc::nvrtc::compile_ptx_with_opts(&kernel.code, options).map_err(|e| Error::Backend {
        backend: BACKEND,
        msg: describe_compile_error(kernel, &e),
    })
}

/// "kernel K, line N: `source line`: NVRTC's log".
fn describe_compile_error(kernel: &KernelSource, e: &cudarc::nvrtc::CompileError) -> String {
    let log = match e {
        cudarc::nvrtc::CompileError::CompileError { log, .. } => log.to_string_lossy().into_owned(),
        other => format!("{other:?}"),
    };
    // NVRTC writes "NAME.cu(LINE): error: ..."
    let line = log.lines().find_map(|l| {
        let rest = l.split_once(".cu(")?.1;
        rest.split_once(')')?.0.parse::<usize>().ok()
    });
    let at = match line {
        Some(n) => format!(
            ", line {n}: `{}`",
            kernel
                .code
                .lines()
                .nth(n.saturating_sub(1))
                .unwrap_or("")
                .trim()
        ),
        None => String::new(),
    };
    format!(
        "NVRTC could not compile kernel {}{at}: {}",
        kernel.name,
        log.trim()
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn compile_errors_name_the_kernel_and_line() {
        let kernel = KernelSource {
            name: "broken".into(),
            code: "int ok;\nint bad = ;\n".into(),
        };
        let e = cudarc::nvrtc::CompileError::CompileError {
            nvrtc: cudarc::nvrtc::result::NvrtcError(
                cudarc::nvrtc::sys::nvrtcResult::NVRTC_ERROR_COMPILATION,
            ),
            options: vec![],
            log: std::ffi::CString::new("broken.cu(2): error: expected an expression\n")
                .expect("no NUL"),
        };
        let msg = describe_compile_error(&kernel, &e);
        assert!(
            msg.contains("kernel broken, line 2: `int bad = ;`"),
            "{msg}"
        );
        assert!(msg.contains("expected an expression"), "{msg}");
    }
}
