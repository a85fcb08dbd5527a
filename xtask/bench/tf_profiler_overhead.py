"""TensorFlow side of `cargo xtask bench profiler`: the cost of TensorFlow's profiler on a
Keras training step of the main job's MNIST CNN (Adam, batch 128, `train_on_batch`):
pairs of short blocks without a profiler and with `tf.profiler.experimental.start` running,
in turn (each trace written between blocks, untimed). Usage:
tf_profiler_overhead.py MNIST_DIR N [PAIRS STEPS]. Prints `name value` lines: seconds per
step off and on (medians) and each pair's overhead (`tf_cnn_pair_<i>`; the caller takes
their median and its interval)."""
import os
import sys
import tempfile
import time

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")
import numpy as np  # noqa: E402
import tensorflow as tf  # noqa: E402
from tf_keras_mnist import idx  # noqa: E402  (the same IDX reader, beside this script)


def main():
    d, n = sys.argv[1], int(sys.argv[2])
    blocks = int(sys.argv[3]) if len(sys.argv) > 3 else BLOCKS
    steps = int(sys.argv[4]) if len(sys.argv) > 4 else STEPS
    x = idx(os.path.join(d, "train-images-idx3-ubyte.gz")).astype(np.float32)[:n, ..., None] / 255.0
    y = idx(os.path.join(d, "train-labels-idx1-ubyte.gz")).astype(np.int64)[:n]
    L = tf.keras.layers
    model = tf.keras.Sequential([
        L.Input((28, 28, 1)),
        L.Conv2D(32, 3, activation="relu"), L.MaxPooling2D(),
        L.Conv2D(64, 3, activation="relu"), L.MaxPooling2D(),
        L.Flatten(), L.Dense(128, activation="relu"), L.Dense(10)])
    model.compile(tf.keras.optimizers.Adam(1e-3),
                  tf.keras.losses.SparseCategoricalCrossentropy(from_logits=True),
                  metrics=["accuracy"])
    bx, by = x[:128], y[:128]
    for _ in range(10):
        model.train_on_batch(bx, by)  # tracing and warm-up
    # Blocks of `steps` steps, unprofiled and profiled in turn; the traces are written
    # between blocks, untimed. The paired ratios' median is the overhead.
    offs, ons = [], []
    with tempfile.TemporaryDirectory() as logdir:
        def block(profiled, b):
            if profiled:
                tf.profiler.experimental.start(os.path.join(logdir, str(b)))
            t0 = time.perf_counter()
            for _ in range(steps):
                model.train_on_batch(bx, by)
            t = (time.perf_counter() - t0) / steps
            if profiled:
                tf.profiler.experimental.stop()
            return t

        for b in range(blocks):
            # Which block of the pair goes first alternates (no position bias).
            if b % 2 == 0:
                offs.append(block(False, b))
                ons.append(block(True, b))
            else:
                ons.append(block(True, b))
                offs.append(block(False, b))
    for i, (a, b) in enumerate(zip(ons, offs)):
        print(f"tf_cnn_pair_{i} {a / b - 1:.6e}")
    print(f"tf_cnn_step_off {sorted(offs)[len(offs) // 2]:.6e}")
    print(f"tf_cnn_step_on {sorted(ons)[len(ons) // 2]:.6e}")


BLOCKS = 30
STEPS = 4

if __name__ == "__main__":
    main()
