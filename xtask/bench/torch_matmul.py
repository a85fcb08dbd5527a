"""Matmul GFLOP/s through PyTorch/cuBLAS, for `cargo xtask gpu` and `xtask gpu-cuda`.

Usage: torch_matmul.py [--mode float32|tf32|bfloat16] N...  (float32 with TF32 off by
default). Prints one `n GFLOPS` line per size: the median of three timed runs, each of
enough products to take a while, after warm-up.
"""
import sys
import time

import torch

args = sys.argv[1:]
mode = "float32"
if args[:1] == ["--mode"]:
    mode, args = args[1], args[2:]
if mode not in ("float32", "tf32", "bfloat16"):
    sys.exit(f"unknown mode {mode}")
torch.backends.cuda.matmul.allow_tf32 = mode == "tf32"
torch.backends.cudnn.allow_tf32 = mode == "tf32"
dtype = torch.bfloat16 if mode == "bfloat16" else torch.float32
if not torch.cuda.is_available():
    sys.exit("no CUDA device")
for n in [int(s) for s in args]:
    a = torch.rand(n, n, device="cuda").to(dtype)
    b = torch.rand(n, n, device="cuda").to(dtype)
    for _ in range(3):
        a @ b
    torch.cuda.synchronize()
    reps = max(5, min(200, int(8 * (8192 / n) ** 3)))
    times = []
    for _ in range(3):
        t = time.perf_counter()
        for _ in range(reps):
            a @ b
        torch.cuda.synchronize()
        times.append((time.perf_counter() - t) / reps)
    times.sort()
    print(n, 2 * n**3 / times[1] / 1e9)
