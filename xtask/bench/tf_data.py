"""tf.data reference for `cargo xtask bench data`: the same pipelines as xtask/src/bench_data.rs.

Prints `name value` lines:
  data_mnist_tf       elements/s of from_tensor_slices((x, y)).shuffle(10000).batch(128) over
                      the 60k MNIST training images (one full pass, the second one timed)
  data_map_seq_tf     elements/s of map(f) with f = 50 x (sin, multiply) on a 1024-vector
  data_map_par_tf     the same with num_parallel_calls=AUTOTUNE
"""
import os
import sys
import time

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")
import numpy as np
import tensorflow as tf

from tf_keras_mnist import idx  # the one IDX reader of the bench scripts


def elements_per_second(ds, n):
    for _ in ds:  # warm-up pass
        pass
    t = time.perf_counter()
    for _ in ds:
        pass
    return n / (time.perf_counter() - t)


def heavy(x):
    for _ in range(50):
        x = tf.math.sin(x) * 1.01
    return x


def main():
    mnist = sys.argv[1]
    x = idx(os.path.join(mnist, "train-images-idx3-ubyte.gz")).astype(np.float32) / 255.0
    y = idx(os.path.join(mnist, "train-labels-idx1-ubyte.gz")).astype(np.int64)
    ds = tf.data.Dataset.from_tensor_slices((x, y)).shuffle(10000, seed=1).batch(128)
    print("data_mnist_tf", elements_per_second(ds, len(x)))

    n = 2000
    rows = tf.random.stateless_normal([n, 1024], seed=[1, 2])
    src = tf.data.Dataset.from_tensor_slices(rows)
    print("data_map_seq_tf", elements_per_second(src.map(heavy), n))
    print("data_map_par_tf", elements_per_second(src.map(heavy, num_parallel_calls=tf.data.AUTOTUNE), n))


if __name__ == "__main__":
    main()
