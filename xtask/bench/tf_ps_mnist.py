"""TensorFlow side of `cargo xtask bench ps`: TF's "Parameter server training" tutorial's
custom loop (ParameterServerStrategy + ClusterCoordinator) on the MNIST MLP (784-256-128-10,
Adam, batch 128 per step), as distribute/examples/ps_bench.rs does: 2 parameter servers and
WORKERS workers as local processes on loopback ports the OS picked (this script starts them
as `tf.distribute.Server`s and kills them at the end), the chief in this process; 50
warm-up steps, then STEPS steps timed. Each process's intra-op threads are the machine's
cores shared out among the workers, as `ferroflow launch` shares them for ours
(RAYON_NUM_THREADS); TensorFlow's inter-op threads are left as they are. Prints `ps_tf_steps
STEPS_PER_SECOND`. Keras 2 (`tf_keras`) where installed.
Usage: tf_ps_mnist.py MNIST_DIR WORKERS STEPS"""
import json
import os
import socket
import subprocess
import sys
import time

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")
os.environ["GRPC_FAIL_FAST"] = "use_caller"
try:
    import tf_keras  # noqa: F401

    os.environ.setdefault("TF_USE_LEGACY_KERAS", "1")
except ImportError:
    pass

BATCH = 128
WARM_UP = 50
NUM_PS = 2


def free_ports(n):
    socks = [socket.socket() for _ in range(n)]
    for s in socks:
        s.bind(("127.0.0.1", 0))
    ports = [s.getsockname()[1] for s in socks]
    for s in socks:
        s.close()
    return ports


def threads_per_task(workers):
    # As `ferroflow launch` shares the cores for ours: among the workers (the chief only
    # coordinates a parameter-server job).
    return max(1, (os.cpu_count() or 1) // workers)


def serve(cluster, job, index, threads):
    import tensorflow as tf

    tf.config.threading.set_intra_op_parallelism_threads(threads)
    server = tf.distribute.Server(
        tf.train.ClusterSpec(cluster), job_name=job, task_index=index, protocol="grpc", start=True
    )
    server.join()


def chief(mnist_dir, workers, steps, cluster, threads):
    import numpy as np
    import tensorflow as tf

    sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
    from tf_keras_mnist import idx  # the IDX reader of the Keras benchmark

    tf.config.threading.set_intra_op_parallelism_threads(threads)
    resolver = tf.distribute.cluster_resolver.SimpleClusterResolver(
        tf.train.ClusterSpec(cluster), task_type="chief", task_id=0, rpc_layer="grpc"
    )
    strategy = tf.distribute.ParameterServerStrategy(resolver)
    coordinator = tf.distribute.coordinator.ClusterCoordinator(strategy)
    x = idx(os.path.join(mnist_dir, "train-images-idx3-ubyte.gz")).astype(np.float32)[..., None] / 255.0
    y = idx(os.path.join(mnist_dir, "train-labels-idx1-ubyte.gz")).astype(np.int64)

    def dataset_fn(_):
        return (
            tf.data.Dataset.from_tensor_slices((x, y)).shuffle(60000).batch(BATCH, drop_remainder=True).repeat().prefetch(2)
        )

    @tf.function
    def per_worker_dataset_fn():
        return strategy.distribute_datasets_from_function(dataset_fn)

    L = tf.keras.layers
    with strategy.scope():
        model = tf.keras.Sequential(
            [L.Flatten(input_shape=(28, 28, 1)), L.Dense(256, activation="relu"), L.Dense(128, activation="relu"), L.Dense(10)]
        )
        optimizer = tf.keras.optimizers.Adam(1e-3)
    loss_fn = tf.keras.losses.SparseCategoricalCrossentropy(from_logits=True, reduction="none")

    @tf.function
    def step_fn(iterator):
        def replica_fn(batch_data, labels):
            with tf.GradientTape() as tape:
                logits = model(batch_data, training=True)
                loss = tf.nn.compute_average_loss(loss_fn(labels, logits), global_batch_size=BATCH)
            grads = tape.gradient(loss, model.trainable_variables)
            optimizer.apply_gradients(zip(grads, model.trainable_variables))
            return loss

        batch_data, labels = next(iterator)
        losses = strategy.run(replica_fn, args=(batch_data, labels))
        return strategy.reduce(tf.distribute.ReduceOp.SUM, losses, axis=None)

    per_worker_dataset = coordinator.create_per_worker_dataset(per_worker_dataset_fn)
    iterator = iter(per_worker_dataset)
    for _ in range(WARM_UP):
        coordinator.schedule(step_fn, args=(iterator,))
    coordinator.join()
    t = time.perf_counter()
    last = None
    for _ in range(steps):
        last = coordinator.schedule(step_fn, args=(iterator,))
    coordinator.join()
    secs = time.perf_counter() - t
    print(f"ps_tf_steps {steps / secs:.6e}")
    print(f"last loss {last.fetch():.4f}", file=sys.stderr)
    sys.stdout.flush()


def main():
    if len(sys.argv) == 6 and sys.argv[1] == "--serve":
        _, _, cluster, job, index, threads = sys.argv
        serve(json.loads(cluster), job, int(index), int(threads))
        return
    mnist_dir, workers, steps = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
    ports = free_ports(1 + workers + NUM_PS)
    addr = [f"127.0.0.1:{p}" for p in ports]
    cluster = {"chief": addr[:1], "worker": addr[1 : 1 + workers], "ps": addr[1 + workers :]}
    threads = threads_per_task(workers)
    children = []
    try:
        for job in ("ps", "worker"):
            for i in range(len(cluster[job])):
                children.append(
                    subprocess.Popen(
                        [sys.executable, __file__, "--serve", json.dumps(cluster), job, str(i), str(threads)],
                        stdout=subprocess.DEVNULL,
                    )
                )
        chief(mnist_dir, workers, steps, cluster, threads)
    finally:
        for c in children:
            c.kill()
        for c in children:
            c.wait(timeout=30)


if __name__ == "__main__":
    main()
