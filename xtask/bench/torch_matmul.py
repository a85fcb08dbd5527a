"""float32 matmul GFLOP/s through PyTorch/cuBLAS (TF32 off), for `cargo xtask gpu`.

Prints one `n GFLOPS` line per size given on the command line: the median of three timed
runs, each of enough products to take a while, after warm-up.
"""
import sys
import time

import torch

torch.backends.cuda.matmul.allow_tf32 = False
torch.backends.cudnn.allow_tf32 = False
if not torch.cuda.is_available():
    sys.exit("no CUDA device")
for n in [int(s) for s in sys.argv[1:]]:
    a = torch.rand(n, n, device="cuda")
    b = torch.rand(n, n, device="cuda")
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
