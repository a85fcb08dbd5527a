"""TensorFlow side of `cargo xtask bench distribute`: Keras `fit` of the MNIST MLP
(784-256-128-10, Adam, batch 64 per worker) under tf.distribute.MultiWorkerMirroredStrategy,
one process per worker, started by `ferroflow launch` (which sets TF_CONFIG), as
distribute/examples/collective_bench.rs `fit mwms` does: a 50-step warm-up epoch, then one
full epoch timed. The chief prints `fit_tf samples_per_second` (over all workers).
Keras 2 (`tf_keras`, TF_USE_LEGACY_KERAS=1) where installed: Keras 3's fit fails under
MultiWorkerMirroredStrategy in TF 2.21 (it cannot convert the strategy's PerReplica losses).
Usage: tf_mwms_mnist.py MNIST_DIR BATCH_PER_WORKER"""
import json
import os
import sys
import time

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")
try:
    import tf_keras  # noqa: F401

    os.environ.setdefault("TF_USE_LEGACY_KERAS", "1")
except ImportError:
    pass
import numpy as np  # noqa: E402
import tensorflow as tf  # noqa: E402

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from tf_keras_mnist import idx  # noqa: E402  (the IDX reader the Keras benchmark uses)



def main():
    d, per_worker = sys.argv[1], int(sys.argv[2])
    strategy = tf.distribute.MultiWorkerMirroredStrategy()
    workers = strategy.num_replicas_in_sync
    x = idx(os.path.join(d, "train-images-idx3-ubyte.gz")).astype(np.float32)[..., None] / 255.0
    y = idx(os.path.join(d, "train-labels-idx1-ubyte.gz")).astype(np.int64)
    n = x.shape[0]
    options = tf.data.Options()
    options.experimental_distribute.auto_shard_policy = tf.data.experimental.AutoShardPolicy.DATA
    ds = tf.data.Dataset.from_tensor_slices((x, y)).batch(per_worker * workers)
    ds = ds.with_options(options).prefetch(2)
    L = tf.keras.layers
    with strategy.scope():
        model = tf.keras.Sequential([
            L.Flatten(input_shape=(28, 28, 1)),
            L.Dense(256, activation="relu"),
            L.Dense(128, activation="relu"),
            L.Dense(10)])
        model.compile(tf.keras.optimizers.Adam(1e-3),
                      tf.keras.losses.SparseCategoricalCrossentropy(from_logits=True),
                      metrics=["accuracy"])
    model.fit(ds.repeat(), epochs=1, steps_per_epoch=50, verbose=0)
    t = time.perf_counter()
    model.fit(ds, epochs=1, verbose=0)
    secs = time.perf_counter() - t
    task = json.loads(os.environ.get("TF_CONFIG", "{}")).get("task", {})
    if task.get("index", 0) == 0:
        print(f"fit_tf {n / secs:.6e}")
        sys.stdout.flush()


if __name__ == "__main__":
    main()
