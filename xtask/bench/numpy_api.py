"""NumPy side of `cargo xtask bench numpy`: the NumPy-API kernels of the issue on a 1M float64
vector and a 1000x1000 float64 matrix (and the FFT of each, rows for the matrix), median of repeats, printed as `name seconds` lines."""
import sys

import numpy as np

from numpy_kernels import median_time  # one timing rule for both NumPy scripts


def main():
    rng = np.random.default_rng(0)
    out = []
    for label, x in (("vec1M", rng.standard_normal(1 << 20)), ("mat1000", rng.standard_normal((1000, 1000)))):
        reps = 11
        out.append((f"sum_{label}", median_time(lambda: np.sum(x), reps)))
        out.append((f"mean_axis0_{label}", median_time(lambda: np.mean(x, axis=0), reps)))
        out.append((f"exp_{label}", median_time(lambda: np.exp(x), reps)))
        out.append((f"clip_{label}", median_time(lambda: np.clip(x, -0.5, 0.5), reps)))
        out.append((f"dot_{label}", median_time(lambda: np.dot(x, x), 5 if x.ndim == 2 else reps)))
        out.append((f"argmax_{label}", median_time(lambda: np.argmax(x), reps)))
        out.append((f"sort_{label}", median_time(lambda: np.sort(x), 5)))
        out.append((f"cumsum_{label}", median_time(lambda: np.cumsum(x, axis=0), reps)))
        out.append((f"fft_{label}", median_time(lambda: np.fft.fft(x), 5)))
        out.append((f"rfft_{label}", median_time(lambda: np.fft.rfft(x), 5)))
    for name, secs in out:
        print(f"{name} {secs:.9e}")
    sys.stdout.flush()


if __name__ == "__main__":
    main()
