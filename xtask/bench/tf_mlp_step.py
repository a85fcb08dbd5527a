"""TensorFlow side of `cargo xtask bench autodiff`: forward + backward of an MLP
784-256-128-10 on a batch of 32 under a GradientTape, eager, in a tf.function and in
one with jit_compile=True (XLA).
Prints `name seconds` lines (median per-step time)."""
import os
import sys
import time

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")
import numpy as np  # noqa: E402
import tensorflow as tf  # noqa: E402


def median_step(fn, steps, repeats=5):
    fn()
    fn()
    times = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        for _ in range(steps):
            fn()
        times.append((time.perf_counter() - t0) / steps)
    times.sort()
    return times[len(times) // 2]


def main():
    rng = np.random.default_rng(0)
    x = tf.constant(rng.standard_normal((32, 784), dtype=np.float32))
    y = tf.one_hot(rng.integers(0, 10, 32), 10)
    sizes = [(784, 256), (256, 128), (128, 10)]
    ws = [tf.Variable(rng.standard_normal(s, dtype=np.float32) * 0.05) for s in sizes]
    bs = [tf.Variable(np.zeros(s[1], np.float32)) for s in sizes]
    params = ws + bs

    def step():
        with tf.GradientTape() as tape:
            h = tf.nn.relu(tf.matmul(x, ws[0]) + bs[0])
            h = tf.nn.relu(tf.matmul(h, ws[1]) + bs[1])
            logits = tf.matmul(h, ws[2]) + bs[2]
            loss = tf.reduce_mean(-tf.reduce_sum(y * tf.nn.log_softmax(logits), axis=-1))
        return tape.gradient(loss, params)

    graph_step = tf.function(step)
    print(f"mlp_step_tf_eager {median_step(step, 50):.9e}")
    print(f"mlp_step_tf_function {median_step(graph_step, 200):.9e}")
    try:
        xla_step = tf.function(step, jit_compile=True)
        print(f"mlp_step_tf_xla {median_step(xla_step, 200):.9e}")
    except Exception as e:  # XLA missing from this TensorFlow build
        print(f"# jit_compile unavailable: {e}", file=sys.stderr)
    sys.stdout.flush()


if __name__ == "__main__":
    main()
