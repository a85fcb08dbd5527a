"""TensorFlow side of `cargo xtask bench keras`: Keras `fit` on the repository's MNIST copy,
the same MLP (784-256-128-10) and CNN (Conv32-Pool-Conv64-Pool-Dense128-Dense10) as
examples/mnist.rs, Adam, batch 128. Times the second epoch (the first includes tracing).
Usage: tf_keras_mnist.py MNIST_DIR CNN_SAMPLES
Prints `name samples_per_second` lines."""
import gzip
import os
import sys
import time

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")
import numpy as np  # noqa: E402
import tensorflow as tf  # noqa: E402


def idx(path):
    with gzip.open(path, "rb") as f:
        data = f.read()
    rank = data[3]
    dims = [int.from_bytes(data[4 + 4 * i: 8 + 4 * i], "big") for i in range(rank)]
    return np.frombuffer(data, np.uint8, offset=4 + 4 * rank).reshape(dims)


class EpochTimer(tf.keras.callbacks.Callback):
    def on_train_begin(self, logs=None):
        self.times = []

    def on_epoch_begin(self, epoch, logs=None):
        self.t0 = time.perf_counter()

    def on_epoch_end(self, epoch, logs=None):
        self.times.append(time.perf_counter() - self.t0)


def main():
    d, cnn_n = sys.argv[1], int(sys.argv[2])
    x = idx(os.path.join(d, "train-images-idx3-ubyte.gz")).astype(np.float32)[..., None] / 255.0
    y = idx(os.path.join(d, "train-labels-idx1-ubyte.gz")).astype(np.int64)
    L = tf.keras.layers
    models = {
        "mlp": (lambda: tf.keras.Sequential([
            L.Flatten(input_shape=(28, 28, 1)),
            L.Dense(256, activation="relu"),
            L.Dense(128, activation="relu"),
            L.Dense(10)]), x.shape[0]),
        "cnn": (lambda: tf.keras.Sequential([
            L.Conv2D(32, 3, activation="relu", input_shape=(28, 28, 1)),
            L.MaxPooling2D(),
            L.Conv2D(64, 3, activation="relu"),
            L.MaxPooling2D(),
            L.Flatten(),
            L.Dense(128, activation="relu"),
            L.Dense(10)]), cnn_n),
    }
    for name, (make, n) in models.items():
        model = make()
        model.compile(tf.keras.optimizers.Adam(1e-3),
                      tf.keras.losses.SparseCategoricalCrossentropy(from_logits=True),
                      metrics=["accuracy"])
        timer = EpochTimer()
        model.fit(x[:n], y[:n], batch_size=128, epochs=2, verbose=0, callbacks=[timer])
        print(f"keras_{name}_tf {n / timer.times[-1]:.6e}")
        sys.stdout.flush()


if __name__ == "__main__":
    main()
