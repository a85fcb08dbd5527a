"""TensorFlow side of `cargo xtask bench data-service`: the pipeline data/examples/service_bench.rs
measures, from_tensor_slices((x, y)).batch(128) over MNIST's 60k training images (uint8
images, int64 labels), read in this process and through TF's tf.data service
(`tf.data.experimental.service`) from 1 and 2 worker processes and a dispatcher process on
loopback ports the OS picked (this script starts them and kills them at the end), a
distributed epoch ("distributed_epoch": each batch once; TF's split provider for
from_tensor_slices hands out one element per split), with TF's default compression (AUTO:
snappy) and without, and with 1 worker "parallel_epochs" (the worker reads the whole
dataset: no splits). Rates count from the first batch to the last, as ours do.
Usage: tf_data_service.py MNIST_DIR
Prints `name batches_per_second` (and `ds_first_<N>_tf seconds`) lines."""
import os
import socket
import subprocess
import sys
import time

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")

SERVER = """
import os, sys, time
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")
import tensorflow as tf
role, port, dispatcher = sys.argv[1], int(sys.argv[2]), sys.argv[3]
if role == "dispatcher":
    s = tf.data.experimental.service.DispatchServer(
        tf.data.experimental.service.DispatcherConfig(port=port))
else:
    s = tf.data.experimental.service.WorkerServer(
        tf.data.experimental.service.WorkerConfig(dispatcher_address=dispatcher, port=port))
print("started", flush=True)
time.sleep(600)
"""


def free_port():
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    port = s.getsockname()[1]
    s.close()
    return port


def start(role, port, dispatcher=""):
    p = subprocess.Popen([sys.executable, "-c", SERVER, role, str(port), dispatcher],
                         stdout=subprocess.PIPE)
    line = p.stdout.readline()  # "started" (bounded: the server sleeps 600 s at most)
    if b"started" not in line:
        p.kill()
        raise RuntimeError(f"the {role} did not start")
    return p


def rate(ds):
    t = time.perf_counter()
    it = iter(ds)
    next(it)
    first = time.perf_counter() - t
    t = time.perf_counter()
    n = sum(1 for _ in it)
    return n / (time.perf_counter() - t), first


def main():
    import tensorflow as tf

    sys.path.insert(0, os.path.dirname(__file__))
    from tf_keras_mnist import idx  # the one IDX reader of the bench scripts

    d = sys.argv[1]
    x = idx(os.path.join(d, "train-images-idx3-ubyte.gz")).reshape(-1, 28, 28, 1)
    y = idx(os.path.join(d, "train-labels-idx1-ubyte.gz")).astype("int64")
    ds = tf.data.Dataset.from_tensor_slices((x, y)).batch(128)
    rate(ds)  # warm-up (tracing)
    print(f"ds_local_rate_tf {rate(ds)[0]}", flush=True)

    servers = []
    try:
        dport = free_port()
        servers.append(start("dispatcher", dport))
        target = f"grpc://localhost:{dport}"
        workers = 0
        for n in (1, 2):
            while workers < n:
                servers.append(start("worker", free_port(), f"localhost:{dport}"))
                workers += 1
            time.sleep(0.5)
            runs = [("distributed_epoch", "AUTO", ""), ("distributed_epoch", None, "_none")]
            if n == 1:
                runs.append(("parallel_epochs", "AUTO", "_parallel"))
            for mode, compression, suffix in runs:
                remote = ds.apply(tf.data.experimental.service.distribute(
                    processing_mode=mode, service=target, compression=compression))
                r, first = rate(remote)
                print(f"ds_rate_{n}{suffix}_tf {r}", flush=True)
                if not suffix:
                    print(f"ds_first_{n}_tf {first}", flush=True)
    finally:
        for p in servers:
            p.kill()
            p.wait()


if __name__ == "__main__":
    main()
