"""Driver program of the executor-loss tests and benchmark (run in its own process, so it can
own a SparkContext on a standalone master and be told when to lose an executor).

Usage: python _faults_job.py MASTER_URL DATASET [DRIVER_MEMORY]

DATASET is ``digits`` or the MNIST folder.  It reads one JSON object per line on stdin, a
fit to run::

    {"name": "sync-numpy", "input": "numpy"|"dataframe"|"rdd", "mode": "sync"|"async",
     "sync": "average", "epochs": 8, "kill_after": 2, "executors": 2, "timeout": 600}

and prints, per fit, ``KILL <name>`` when epoch ``kill_after`` ended (the test then kills a
worker), then ``RESULT {...}``: test accuracy, fit seconds, the recovery lines logged, the
executors the fit's shards lived on, the persisted RDDs left, or the error.  An empty
line or end of input ends the program.
"""
from __future__ import annotations

import json
import logging
import os
import sys
import time
import traceback


class _Events(logging.Handler):
    """Collects the warnings sparknet logs, and prints ``KILL`` after the chosen epoch."""

    def __init__(self) -> None:
        super().__init__(logging.INFO)
        self.fit: dict = {}
        self.warnings: list[str] = []
        self.placements: list[dict] = []
        self.t0 = time.time()

    def emit(self, record: logging.LogRecord) -> None:
        msg = record.getMessage()
        if record.levelno >= logging.WARNING:
            self.warnings.append(msg)
        want = self.fit.get("kill_after")
        if want and msg.startswith(f"epoch {want}/"):
            print(f"KILL {self.fit['name']}", flush=True)
        if msg.startswith("epoch "):
            from sparknet.cluster import resident
            for res in list(resident._OPEN):
                if res.key.startswith("train-"):
                    self.placements.append(dict(res.homes))
        if self.fit.get("verbose"):
            print(f"LOG {time.time() - self.t0:7.2f} {record.name}: {msg}", flush=True)


def _data(dataset: str):
    import numpy as np

    if dataset == "digits":
        from sparknet.datasets import load_digits
        X, y, Xt, yt = load_digits(test_size=0.25, seed=0)
    else:
        from sparknet.datasets import load_mnist
        X, y, Xt, yt = load_mnist(dataset)
    return X.astype(np.float32), y.astype(np.int64), Xt.astype(np.float32), yt.astype(np.int64)


def _wait_executors(sc, n: int, timeout: float = 90.0) -> int:
    deadline = time.time() + timeout
    while True:
        have = sc._jsc.sc().getExecutorMemoryStatus().size() - 1
        if have >= n or time.time() > deadline:
            return have
        time.sleep(0.2)


def main() -> int:
    master, dataset = sys.argv[1], sys.argv[2]
    driver_memory = sys.argv[3] if len(sys.argv) > 3 else "2g"
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")
    import numpy as np

    from sparknet import Dense, Sequential
    from sparknet.cluster.data_parallel import DataParallelTrainer
    from sparknet.cluster.session import get_spark

    spark = get_spark(master, app_name="sparknet-faults", warm_up=False, conf={
        "spark.ui.enabled": "false", "spark.driver.host": "127.0.0.1",
        "spark.driver.bindAddress": "127.0.0.1", "spark.driver.memory": driver_memory,
        "spark.executor.cores": "1", "spark.executor.memory": "1g",
        "spark.task.maxFailures": "4"})
    sc = spark.sparkContext
    sc.setLogLevel("ERROR")
    events = _Events()
    logging.getLogger("sparknet").addHandler(events)
    logging.getLogger("sparknet").setLevel(logging.INFO)
    X, y, Xt, yt = _data(dataset)
    hidden = 64 if dataset == "digits" else 128
    print("READY", flush=True)
    for line in sys.stdin:
        if not line.strip():
            break
        fit = json.loads(line)
        events.fit, events.warnings, events.placements, events.t0 = fit, [], [], time.time()
        out: dict = {"name": fit["name"]}
        out["executors_before"] = _wait_executors(sc, int(fit.get("executors", 2)),
                                                  float(fit.get("wait_executors", 90)))
        model = Sequential([Dense(hidden, activation="relu"), Dense(10, activation="softmax")],
                           input_shape=(X.shape[1],), seed=int(fit.get("seed", 0)))
        kw = {"mode": fit.get("mode", "sync"), "sync": fit.get("sync", "average"), "num_partitions": 2,
              "seed": 0}
        if fit.get("local_steps"):
            kw["local_steps"] = int(fit["local_steps"])
        trainer = DataParallelTrainer(model, spark, **kw)
        data, labels = X, y
        if fit["input"] == "dataframe":
            from pyspark.ml.linalg import Vectors
            rows = [(Vectors.dense(r.tolist()), int(c)) for r, c in zip(X, y)]
            data, labels = spark.createDataFrame(rows, ["features", "label"]).repartition(2), None
        elif fit["input"] == "rdd":
            data, labels = sc.parallelize(list(zip(X, y)), 2), None
        persisted = sc._jsc.getPersistentRDDs().size()
        t0 = time.perf_counter()
        try:
            _, hist = trainer.fit(data, labels, epochs=int(fit.get("epochs", 8)),
                                  batch_size=int(fit.get("batch_size", 32)), verbose=0, reuse_data=False)
            out["accuracy"] = float(np.mean(model.predict(Xt) == yt))
            out["epochs_run"] = len(hist["loss"])
        except BaseException as exc:  # noqa: BLE001 - reported to the test
            out["error"] = f"{type(exc).__name__}: {exc}"
            out["trace"] = traceback.format_exc()[-3000:]
        out["seconds"] = time.perf_counter() - t0
        out["warnings"] = events.warnings
        out["placements"] = events.placements
        out["persisted_left"] = sc._jsc.getPersistentRDDs().size() - persisted
        out["executors_after"] = sc._jsc.sc().getExecutorMemoryStatus().size() - 1
        print("RESULT " + json.dumps(out), flush=True)
    spark.stop()
    return 0


if __name__ == "__main__":
    sys.exit(main())
