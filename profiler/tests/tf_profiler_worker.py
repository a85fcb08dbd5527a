"""A TensorFlow "worker" for the capture tests: starts TF's profiler server on the port given
and runs marked training-like steps for at most a minute (the test kills it sooner).

usage: tf_profiler_worker.py <port>
"""

import sys
import time

import tensorflow as tf


def main():
    tf.profiler.experimental.server.start(int(sys.argv[1]))
    print("started", flush=True)
    x = tf.ones([64, 64])
    end = time.time() + 60
    step = 0
    while time.time() < end:
        with tf.profiler.experimental.Trace("train", step_num=step, _r=1):
            tf.tanh(tf.matmul(x, x))
        step += 1
        time.sleep(0.002)


if __name__ == "__main__":
    main()
