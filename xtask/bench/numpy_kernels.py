"""NumPy side of `cargo xtask bench kernels`: the same kernels, same sizes, same timing rule
(median of repeats), printed as `name seconds` lines for the Rust side to compare."""
import sys
import time

import numpy as np


def median_time(fn, repeats):
    fn()  # warm up (page faults, thread pool start)
    times = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    times.sort()
    return times[len(times) // 2]


def main():
    rng = np.random.default_rng(0)
    out = []
    for n in (256, 512, 1024, 2048):
        a = rng.standard_normal((n, n), dtype=np.float32)
        b = rng.standard_normal((n, n), dtype=np.float32)
        out.append((f"matmul_{n}", median_time(lambda: a @ b, 9 if n <= 1024 else 5)))
    for size, label in ((1 << 20, "1M"), (1 << 24, "16M")):
        x = rng.standard_normal(size, dtype=np.float32)
        y = rng.standard_normal(size, dtype=np.float32)
        reps = 21 if size == (1 << 20) else 7
        out.append((f"add_{label}", median_time(lambda: np.add(x, y), reps)))
        out.append((f"exp_{label}", median_time(lambda: np.exp(x), reps)))
        out.append((f"sum_{label}", median_time(lambda: np.sum(x), reps)))
        out.append((f"argmax_{label}", median_time(lambda: np.argmax(x), reps)))
        out.append((f"cumsum_{label}", median_time(lambda: np.cumsum(x), reps)))
    one_a = np.ones(1, dtype=np.float32)
    one_b = np.ones(1, dtype=np.float32)

    def many_adds():
        for _ in range(10000):
            np.add(one_a, one_b)

    out.append(("dispatch_add_1", median_time(many_adds, 7) / 10000))
    for name, secs in out:
        print(f"{name} {secs:.9e}")
    sys.stdout.flush()


if __name__ == "__main__":
    main()
