//! Every kernel of the CUDA backend compiles: NVRTC turns each source of the catalog (and
//! elementwise programs using every fusible op, as graph functions generate them) into
//! PTX for compute capability 8.0 (Ampere) and 9.0 (Hopper), and `ptxas` assembles the PTX
//! for sm_80 / sm_90. No GPU is needed: CI runs this with the NVRTC and nvcc wheels from
//! NVIDIA's Python packages (`nvidia-cuda-nvrtc-cu12`, `nvidia-cuda-nvcc-cu12`, installed by
//! `.ci/run`, which sets `FERROFLOW_REQUIRE_NVRTC=1`). Elsewhere the test skips loudly when
//! NVRTC or `ptxas` is not found.
//!
//! A failure names the kernel, the architecture, the source line and the compiler's message.

use std::path::PathBuf;
use std::process::Command;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Mutex;

use ferroflow_cuda::source::{catalog, optimizer_group_samples, program_samples, KernelSource};

/// Kernels compiled together: NVRTC's and ptxas' start-up dominates one small kernel, so the
/// catalog goes through in programs of this many kernels, each in a namespace of its own
/// (what it declares stays its own; the prelude is shared as at run time). A program that
/// fails is compiled again kernel by kernel, so the report names the kernel and its line.
const GROUP: usize = 48;

const ARCHS: [(&str, &str); 2] = [("compute_80", "sm_80"), ("compute_90", "sm_90")];

/// `ptxas`: `$FERROFLOW_PTXAS`, else the first on `PATH`.
fn ptxas() -> Option<PathBuf> {
    if let Some(p) = std::env::var_os("FERROFLOW_PTXAS") {
        return Some(PathBuf::from(p));
    }
    std::env::split_paths(&std::env::var_os("PATH")?)
        .map(|d| d.join("ptxas"))
        .find(|p| p.is_file())
}

fn check(kernel: &KernelSource, ptxas: &std::path::Path, dir: &std::path::Path) -> Vec<String> {
    let mut failures = vec![];
    for (virtual_arch, real_arch) in ARCHS {
        let ptx = match ferroflow_cuda::compile_ptx(kernel, virtual_arch) {
            Ok(p) => p,
            Err(e) => {
                failures.push(format!("{virtual_arch}: {e}"));
                continue;
            }
        };
        let file = dir.join(format!("{}_{real_arch}.ptx", kernel.name));
        if let Err(e) = std::fs::write(&file, ptx.to_src()) {
            failures.push(format!("writing {}: {e}", file.display()));
            continue;
        }
        // Unoptimised: what ptxas refuses (an instruction the architecture lacks, more
        // static shared memory than it has) does not depend on its optimisation, and -O3
        // took half again as long (the driver optimises when it loads the PTX on a GPU).
        let out = Command::new(ptxas)
            .arg("-O0")
            .arg(format!("-arch={real_arch}"))
            .arg(&file)
            .arg("-o")
            .arg(dir.join(format!("{}_{real_arch}.cubin", kernel.name)))
            .output();
        match out {
            Ok(o) if o.status.success() => {}
            Ok(o) => failures.push(format!(
                "ptxas -arch={real_arch} refused kernel {}: {}",
                kernel.name,
                String::from_utf8_lossy(&o.stderr).trim()
            )),
            Err(e) => failures.push(format!("running {}: {e}", ptxas.display())),
        }
        let _ = std::fs::remove_file(&file);
    }
    failures
}

/// One program holding `kernels`, each in its own namespace.
fn grouped(kernels: &[KernelSource]) -> KernelSource {
    let first = kernels.first().map_or("", |k| k.name.as_str());
    ferroflow_cuda::source::grouped(&format!("group_from_{first}"), kernels, |_| String::new())
}

#[test]
fn every_kernel_compiles_for_sm_80_and_sm_90() {
    if !ferroflow_cuda::nvrtc_available() {
        ferroflow_tensor::testing::skip(
            "FERROFLOW_REQUIRE_NVRTC",
            "NVRTC (libnvrtc.so.12) is not on the library path (pip install \
             nvidia-cuda-nvrtc-cu12 and add its nvidia/cuda_nvrtc/lib to LD_LIBRARY_PATH), the \
             CUDA kernels were not compiled",
        );
        return;
    }
    let Some(ptxas) = ptxas() else {
        ferroflow_tensor::testing::skip(
            "FERROFLOW_REQUIRE_NVRTC",
            "ptxas is not on PATH (pip install nvidia-cuda-nvcc-cu12 and add its \
             nvidia/cuda_nvcc/bin, or set FERROFLOW_PTXAS), the CUDA kernels were not assembled",
        );
        return;
    };
    let mut kernels = catalog();
    kernels.extend(program_samples());
    kernels.extend(optimizer_group_samples());
    let groups: Vec<&[KernelSource]> = kernels.chunks(GROUP).collect();
    let dir = std::env::temp_dir().join(format!("ferroflow-nvrtc-{}", std::process::id()));
    std::fs::create_dir_all(&dir).expect("a temporary folder");
    let next = AtomicUsize::new(0);
    let failures = Mutex::new(vec![]);
    let threads = std::thread::available_parallelism().map_or(2, |n| n.get());
    std::thread::scope(|s| {
        for _ in 0..threads {
            s.spawn(|| loop {
                let i = next.fetch_add(1, Ordering::Relaxed);
                let Some(group) = groups.get(i) else { break };
                let mut found = check(&grouped(group), &ptxas, &dir);
                if !found.is_empty() {
                    found = group.iter().flat_map(|k| check(k, &ptxas, &dir)).collect();
                }
                failures
                    .lock()
                    .unwrap_or_else(|e| e.into_inner())
                    .extend(found);
            });
        }
    });
    let _ = std::fs::remove_dir_all(&dir);
    let failures = failures.into_inner().unwrap_or_else(|e| e.into_inner());
    assert!(
        failures.is_empty(),
        "{} of {} kernel compilations failed:\n{}",
        failures.len(),
        kernels.len() * ARCHS.len(),
        failures.join("\n\n")
    );
    eprintln!(
        "{} CUDA kernels compiled by NVRTC and assembled by ptxas for sm_80 and sm_90",
        kernels.len()
    );
}

#[test]
fn a_broken_kernel_is_reported_with_its_name_and_line() {
    if !ferroflow_cuda::nvrtc_available() {
        ferroflow_tensor::testing::skip(
            "FERROFLOW_REQUIRE_NVRTC",
            "NVRTC (libnvrtc.so.12) is not on the library path, the compile-error test did not run",
        );
        return;
    }
    let kernel = KernelSource {
        name: "deliberately_broken".into(),
        code: "extern \"C\" __global__ void deliberately_broken(float* y) {\n    y[0] = undefined_name;\n}\n".into(),
    };
    let e = ferroflow_cuda::compile_ptx(&kernel, "compute_80").expect_err("it does not compile");
    let msg = e.to_string();
    assert!(msg.contains("kernel deliberately_broken, line 2"), "{msg}");
    assert!(msg.contains("undefined_name"), "{msg}");
}
