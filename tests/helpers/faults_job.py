"""Driver program of the executor-loss tests and benchmark (run in its own process, so it can
own a SparkContext on a standalone master and be told when to lose an executor).

Usage: python tests/helpers/faults_job.py MASTER_URL DATASET [DRIVER_MEMORY [TRAIN_ROWS [warm]]]

DATASET is ``digits`` or the MNIST folder (the first TRAIN_ROWS training images, all test
images).  With ``warm``, one tiny fit of each input kind runs first (the first fit of a
driver pays for the first use of each code path, which would count as time lost).
It reads one JSON object per line on stdin, a fit to run::

    {"name": "sync-numpy", "input": "numpy"|"dataframe"|"rdd", "mode": "sync"|"async",
     "sync": "average", "local_steps": 20, "epochs": 8, "kill_after": 2, "executors": 2,
     "no_executor_wait": 10}

Numpy input is split by :func:`sparknet.cluster.data.sharding.split_indices`; the DataFrame and the
RDD hold the same two partitions in the same order, so that their fits compute the same.

and prints, per fit, ``KILL <name>`` when epoch ``kill_after`` ended (the test then kills a
worker), then ``RESULT {...}``: test accuracy, fit seconds, the recovery lines logged, the
executors the fit's shards lived on, the persisted RDDs left, or the error.  An empty
line or end of input ends the program.
"""
from __future__ import annotations

import json
import logging
import os
import queue
import subprocess
import sys
import threading
import time
import traceback
from typing import Any, Callable


class _Events(logging.Handler):
    """Collects the warnings sparknet logs, and prints ``KILL`` after the chosen epoch."""

    def __init__(self) -> None:
        super().__init__(logging.DEBUG)  # the per-epoch lines are debug records
        self.fit: dict = {}
        self.warnings: list[str] = []
        self.placements: list[dict] = []
        self.t0 = time.time()
        self.keys: set[str] = set()

    def emit(self, record: logging.LogRecord) -> None:
        msg = record.getMessage()
        if record.levelno >= logging.WARNING:
            self.warnings.append(msg)
        want = self.fit.get("kill_after")
        if want and msg.startswith(f"epoch {want}/"):
            print(f"KILL {self.fit['name']}", flush=True)
            if self.fit.get("hold_for_kill"):  # go on once the test says the worker is dead
                sys.stdin.readline()
        if msg.startswith("epoch "):
            from sparknet.cluster.resident import driver as resident
            for res in resident.open_states():
                self.keys.add(res.key)
                if res.key.startswith("train-"):
                    self.placements.append(dict(res.homes))
        if self.fit.get("verbose"):
            print(f"LOG {time.time() - self.t0:7.2f} {record.name}: {msg}", flush=True)


def _data(dataset: str) -> tuple[Any, Any, Any, Any]:
    import numpy as np

    if dataset == "digits":
        from sparknet.datasets import load_digits
        X, y, Xt, yt = load_digits(test_size=0.25, seed=0)
    else:
        from sparknet.datasets import load_mnist
        X, y, Xt, yt = load_mnist(dataset)
    return X.astype(np.float32), y.astype(np.int64), Xt.astype(np.float32), yt.astype(np.int64)


def _wait_executors(sc: Any, n: int, timeout: float = 90.0) -> int:
    deadline = time.time() + timeout
    while True:
        have = sc._jsc.sc().getExecutorMemoryStatus().size() - 1
        if have >= n or time.time() > deadline:
            return have
        time.sleep(0.2)


class FaultDriver:
    """This program, run as the driver of ``master``: one fit per :meth:`fit` call, whose
    ``on_kill`` is called on the program's ``KILL`` cue (for tests and benchmarks)."""

    def __init__(self, master: str, dataset: str, train_rows: int, base: dict | None = None,
                 driver_memory: str = "2g", ready_timeout: float = 300, warm: bool = False,
                 locality_wait: str | None = None) -> None:
        self.base = dict(base or {})
        self._hold = False
        env = {**os.environ, "OPENBLAS_NUM_THREADS": "1"}
        if locality_wait is not None:  # the driver's spark.locality.wait.process
            env["SPARKNET_FAULTS_LOCALITY_WAIT"] = locality_wait
        self.proc = subprocess.Popen([sys.executable, os.path.abspath(__file__), master, dataset, driver_memory,
                                      str(train_rows)] + (["warm"] if warm else []),
                                     stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                     text=True, env=env)
        assert self.proc.stdin is not None and self.proc.stdout is not None
        self.stdin, self.stdout = self.proc.stdin, self.proc.stdout
        self.lines: queue.Queue = queue.Queue()
        threading.Thread(target=self._read, daemon=True).start()
        self._expect("READY", ready_timeout)

    def _read(self) -> None:
        for line in self.stdout:
            self.lines.put(line.rstrip("\n"))
        self.lines.put(None)

    def _expect(self, prefix: str, timeout: float, on_kill: Callable[[], None] | None = None) -> str:
        deadline = time.monotonic() + timeout
        while True:
            try:
                line = self.lines.get(timeout=max(0.1, deadline - time.monotonic()))
            except queue.Empty:
                raise TimeoutError(f"the fault driver printed no {prefix!r} within {timeout:.0f} s") from None
            if line is None:
                raise RuntimeError(f"the fault driver exited ({self.proc.wait()}) before {prefix!r}")
            if line.startswith("KILL") and on_kill is not None:
                on_kill()
                if self._hold:
                    self.stdin.write("GO\n")
                    self.stdin.flush()
            if line.startswith(prefix):
                return line

    def fit(self, timeout: float = 300, on_kill: Callable[[], None] | None = None, **fit: Any) -> dict:
        """Run one fit (``self.base`` updated with ``fit``); its ``RESULT`` as a dict."""
        self._hold = bool(fit.get("hold_for_kill"))
        self.stdin.write(json.dumps({**self.base, **fit}) + "\n")
        self.stdin.flush()
        out = json.loads(self._expect("RESULT", timeout, on_kill)[len("RESULT "):])
        print(f"FIT {fit.get('name')}: {out.get('seconds', 0):.1f} s, accuracy {out.get('accuracy')}, "
              f"error {out.get('error', '')[:200]!r}")
        return out

    def close(self) -> None:
        try:
            self.stdin.write("\n")
            self.stdin.flush()
            self.proc.wait(timeout=60)
        except (OSError, subprocess.TimeoutExpired):
            self.proc.kill()
            self.proc.wait()


def main() -> int:
    master, dataset = sys.argv[1], sys.argv[2]
    driver_memory = sys.argv[3] if len(sys.argv) > 3 else "2g"
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")
    import numpy as np

    from sparknet import Dense, Sequential
    from sparknet.cluster.data_parallel.trainer import DataParallelTrainer
    from sparknet.cluster.engine.session import get_spark

    spark = get_spark(master, app_name="sparknet-faults", warm_up=False, conf={
        "spark.ui.enabled": "false", "spark.driver.host": "127.0.0.1",
        "spark.driver.bindAddress": "127.0.0.1", "spark.driver.memory": driver_memory,
        "spark.executor.cores": "1", "spark.executor.memory": "1g",
        "spark.task.maxFailures": "4",
        "spark.locality.wait.process": os.environ.get("SPARKNET_FAULTS_LOCALITY_WAIT", "30s")})
    sc = spark.sparkContext
    sc.setLogLevel("ERROR")
    events = _Events()
    logging.getLogger("sparknet").addHandler(events)
    logging.getLogger("sparknet").setLevel(logging.DEBUG)
    X, y, Xt, yt = _data(dataset)
    if len(sys.argv) > 4:
        X, y = X[:int(sys.argv[4])], y[:int(sys.argv[4])]
    from sparknet.cluster.data.sharding import split_indices
    parts = split_indices(len(y), 2, 0)
    hidden = 64 if dataset == "digits" else 128
    from sparknet.cluster.engine.session import start_python_workers
    start_python_workers(spark).join(timeout=120)
    from pyspark.ml.linalg import Vectors
    small = sc.parallelize([(Vectors.dense(X[i].tolist()), int(y[i])) for i in range(64)], 2).toDF(
        ["features", "label"])
    for data, labels in ((X[:64], y[:64]), (small, None)) if sys.argv[5:6] == ["warm"] else ():
        warm = Sequential([Dense(8, activation="relu"), Dense(10, activation="softmax")], input_shape=(X.shape[1],))
        DataParallelTrainer(warm, spark, num_partitions=2, local_steps=2).fit(data, labels, epochs=1, verbose=0,
                                                                             reuse_data=False)
    print("READY", flush=True)
    for line in sys.stdin:
        if not line.strip():
            break
        fit = json.loads(line)
        events.fit, events.warnings, events.placements, events.t0 = fit, [], [], time.time()
        events.keys = set()
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
            # one parallelize per partition: a single one cuts its batches of 1,024 rows, not the rows
            data = sc.union([sc.parallelize([(Vectors.dense(X[i].tolist()), int(y[i])) for i in part], 1)
                             for part in parts]).toDF(["features", "label"])
            labels = None
        elif fit["input"] == "rdd":
            data = sc.union([sc.parallelize([(X[i], int(y[i])) for i in part], 1) for part in parts])
            labels = None
        if fit.get("no_executor_wait"):
            from sparknet.cluster.resident import executors
            executors.NO_EXECUTOR_WAIT = float(fit["no_executor_wait"])
        persisted = sc._jsc.getPersistentRDDs().size()
        t0 = time.perf_counter()
        try:
            _, hist = trainer.fit(data, labels, epochs=int(fit.get("epochs", 8)),
                                  batch_size=int(fit.get("batch_size", 32)), verbose=0, reuse_data=False)
            out["returned"] = time.time()
            out["accuracy"] = float(np.mean(model.predict(Xt) == yt))
            out["epochs_run"] = len(hist["loss"])
        except BaseException as exc:  # noqa: BLE001 - reported to the test
            out["error"] = f"{type(exc).__name__}: {exc}"
            out["trace"] = traceback.format_exc()[-3000:]
        out["seconds"] = time.perf_counter() - t0
        out["warnings"] = events.warnings
        out["app_id"] = sc.applicationId
        out["keys"] = sorted(events.keys)
        out["placements"] = events.placements
        out["persisted_left"] = sc._jsc.getPersistentRDDs().size() - persisted
        out["executors_after"] = sc._jsc.sc().getExecutorMemoryStatus().size() - 1
        print("RESULT " + json.dumps(out), flush=True)
    spark.stop()
    return 0


if __name__ == "__main__":
    sys.exit(main())
