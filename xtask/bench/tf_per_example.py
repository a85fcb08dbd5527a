"""TensorFlow side of `cargo xtask bench function`'s per-example gradients: the gradients of
the MLP 784-256-128-10's loss for each of 128 examples, by a Python loop over the examples
(eager) and by tf.vectorized_map inside a tf.function (TF's pfor).
Prints `name seconds` lines (median time for the 128 examples)."""
import os
import sys
import time

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")
import numpy as np  # noqa: E402
import tensorflow as tf  # noqa: E402


def median_time(fn, repeats=5):
    fn()
    times = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    times.sort()
    return times[len(times) // 2]


def main():
    rng = np.random.default_rng(0)
    n = 128
    x = tf.constant(rng.standard_normal((n, 784), dtype=np.float32))
    y = tf.one_hot(rng.integers(0, 10, n), 10)
    sizes = [(784, 256), (256, 128), (128, 10)]
    ws = [tf.Variable(rng.standard_normal(s, dtype=np.float32) * 0.05) for s in sizes]
    bs = [tf.Variable(np.zeros(s[1], np.float32)) for s in sizes]
    params = ws + bs

    def grads(xe, ye):
        xe, ye = xe[None], ye[None]
        with tf.GradientTape() as tape:
            h = tf.nn.relu(tf.matmul(xe, ws[0]) + bs[0])
            h = tf.nn.relu(tf.matmul(h, ws[1]) + bs[1])
            logits = tf.matmul(h, ws[2]) + bs[2]
            loss = tf.reduce_mean(-tf.reduce_sum(ye * tf.nn.log_softmax(logits), axis=-1))
        return tape.gradient(loss, params)

    def loop():
        return [grads(x[i], y[i]) for i in range(n)]

    pfor = tf.function(lambda: tf.vectorized_map(lambda e: grads(e[0], e[1]), (x, y)))
    print(f"per_example_tf_loop {median_time(loop, 3):.9e}")
    print(f"per_example_tf_pfor {median_time(pfor):.9e}")
    sys.stdout.flush()


if __name__ == "__main__":
    main()
