#!/bin/bash
# One call of the device tool for issue #23 (CONTRIBUTING.md, "A borrowed NVIDIA machine"):
# the CUDA conformance suite, then the CUDA rows of `xtask gpu` (matmul against PyTorch,
# the host's cost per op, the ResNet-style step and its device profile, MNIST fit), each
# under a timeout, with the CUDA 13 libraries of the machine's Python wheels. Run from the
# checkout, with `gpu-bundle/` (xtask, cuda_conformance) carried:
#   CONF_S=130 ROWS_S=175 EPOCHS=3 bash xtask/gpu_device.sh
# Knobs: CASES (property cases, 32), THREADS (test threads, 16), CONF_S / ROWS_S (seconds),
# SIZES (matmul n, 2048,8192), EPOCHS (MNIST, 1). Everything is also written to $OUT.
cd "$(dirname "$0")/.." || exit 1
OUT=${OUT:-/tmp}
exec > >(tee "$OUT/run.log") 2>&1
date; uname -r; nvidia-smi --query-gpu=name,driver_version,memory.total,clocks.max.sm --format=csv
SP=$(python3 -c "import site;print(site.getsitepackages()[0])")
LIBS=$(find "$SP/nvidia" /usr/local/cuda/lib64 -maxdepth 4 \( -name 'libnvrtc.so.13*' -o -name 'libcublas.so.13*' -o -name 'libcublasLt.so.13*' -o -name 'libcudnn.so.9*' -o -name 'libnccl.so.2*' \) 2>/dev/null | xargs -r -n1 dirname | sort -u | paste -sd:)
echo "libraries: $LIBS"
export LD_LIBRARY_PATH="$LIBS:${LD_LIBRARY_PATH:-}" RUST_BACKTRACE=1 FERROFLOW_REQUIRE_CUDA=1
export FERROFLOW_CONFORMANCE_CASES=${CASES:-32}
# cuDNN found with the other libraries: the suite must use it (convolutions_run_through_cudnn…).
if [ -n "$LIBS" ] && find ${LIBS//:/ } -maxdepth 1 -name 'libcudnn.so.9*' 2>/dev/null | grep -q .; then
  export FERROFLOW_REQUIRE_CUDNN=1
fi
# NCCL found likewise: its collectives must run (nccl_collectives_on_every_gpu).
if [ -n "$LIBS" ] && find ${LIBS//:/ } -maxdepth 1 -name 'libnccl.so.2*' 2>/dev/null | grep -q .; then
  export FERROFLOW_REQUIRE_NCCL=1
fi
echo "=== conformance (cases $FERROFLOW_CONFORMANCE_CASES)"
t0=$(date +%s)
# cuDNN's heuristics pick the suite's algorithms (timing each of its hundreds of random
# shapes would take the suite's time); the rows below autotune, as TF does.
TF_CUDNN_USE_AUTOTUNE=0 timeout ${CONF_S:-200} gpu-bundle/cuda_conformance --test-threads=${THREADS:-16} 2>&1 | tee "$OUT/conformance.log" | grep -E -A3 "panicked|test result" | head -120
echo "conformance exit ${PIPESTATUS[0]} in $(( $(date +%s) - t0 )) s"
echo "=== gpu-cuda rows"
timeout ${ROWS_S:-250} gpu-bundle/xtask gpu-cuda --sizes ${SIZES:-2048,8192} --epochs ${EPOCHS:-1}
echo "gpu-cuda exit $? at $(( $(date +%s) - t0 )) s"
