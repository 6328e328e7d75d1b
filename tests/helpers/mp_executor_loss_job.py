"""Driver program for the model-parallel executor-loss test on a standalone cluster (its own
process, so it owns a SparkContext on the standalone master).

Usage: python tests/helpers/mp_executor_loss_job.py MASTER_URL CKPT_DIR PAUSE_AT

Fits a float64 network whose Megatron pair is cut into K=2 blocks (one per executor) on
the first 1,000 sklearn digits, 1 epoch of batch 64 (16 steps, the last of 40 rows),
checkpoints every 5 steps.  Inside step PAUSE_AT, before its first Spark job, it prints
``PAUSED <executor id of slot 0>`` and waits for a line on stdin (the test kills that
executor's worker meanwhile), then goes on.  Afterwards it fits the same network in this
process (the in-process backend, undisturbed) and prints one JSON line ``RESULT {...}``.
"""
from __future__ import annotations

import json
import logging
import os
import sys
import time

ROWS, EPOCHS, BATCH, EVERY = 1000, 1, 64, 5


class Lines(logging.Handler):
    def __init__(self) -> None:
        super().__init__(logging.WARNING)
        self.lines: list[str] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.lines.append(record.getMessage())


def main() -> int:
    master, ckpt_dir, pause_at = sys.argv[1], sys.argv[2], int(sys.argv[3])
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    import numpy as np
    from pyspark.sql import SparkSession
    from sklearn.datasets import load_digits

    from sparknet import Dense, RMSprop
    from sparknet.cluster.model_parallel import ModelParallel
    from sparknet.cluster.model_parallel.block_partition import BlockPlan

    X, y = load_digits(return_X_y=True)
    X, y = X[:ROWS] / 16.0, y[:ROWS]
    spark = (SparkSession.builder.master(master).appName("sparknet-mp-executor-loss")
             .config("spark.ui.enabled", "false")
             .config("spark.driver.host", "127.0.0.1").config("spark.driver.bindAddress", "127.0.0.1")
             .config("spark.executor.cores", "1").config("spark.executor.memory", "512m")
             .config("spark.python.worker.reuse", "true").getOrCreate())
    sc = spark.sparkContext
    sc.setLogLevel("ERROR")
    lines = Lines()
    logging.getLogger("sparknet").addHandler(lines)

    def make(spark, ckpt):
        layers = [Dense(40, activation="tanh"), Dense(24, activation="relu"), Dense(10, activation="softmax")]
        return ModelParallel(layers, BlockPlan({0: 2, 1: 2}, pair=True), (64,), spark=spark, dtype="float64",
                             seed=5, optimizer=RMSprop(lr=2e-3), checkpoint_dir=ckpt, name="mploss")
    out: dict = {}
    try:
        deadline = time.time() + 90
        while sc._jsc.sc().getExecutorMemoryStatus().size() < 3:   # driver + 2 executors
            if time.time() > deadline:
                raise TimeoutError("the 2 executors did not register within 90 s")
            time.sleep(0.2)
        mp = make(spark, ckpt_dir)
        out["homes"] = dict(mp.backend.res.homes)
        run = mp.backend.run

        def run_pausing(job, data=None):
            if mp.t == pause_at and "paused" not in out:
                out["paused"] = mp.t
                print(f"PAUSED {mp.backend.res.homes.get(0)}", flush=True)
                sys.stdin.readline()
            return run(job, data)
        mp.backend.run = run_pausing
        t0 = time.time()
        hist = mp.fit(X, y, epochs=EPOCHS, batch_size=BATCH, checkpoint_every=EVERY)
        out["fit_s"] = time.time() - t0
        out.update(t=mp.t, steps=len(hist["step_time"]), restores=mp.restores, accuracy=hist["accuracy"],
                   homes_after=dict(mp.backend.res.homes), lines=lines.lines)
        got = mp.to_sequential()
        mp.close()
        ref = make(None, None)
        t0 = time.time()
        ref_hist = ref.fit(X, y, epochs=EPOCHS, batch_size=BATCH)
        out["ref_fit_s"] = time.time() - t0
        want = ref.to_sequential()
        out.update(ref_t=ref.t, ref_accuracy=ref_hist["accuracy"],
                   max_rel=float(np.abs(got.params - want.params).max() / np.abs(want.params).max()),
                   test_accuracy=float(got.evaluate(X, y)["accuracy"]),
                   ref_test_accuracy=float(want.evaluate(X, y)["accuracy"]))
    except Exception as exc:
        out["error"] = f"{type(exc).__name__}: {exc}"[:4000]
    finally:
        print("RESULT " + json.dumps(out), flush=True)
        spark.stop()
    return 0


if __name__ == "__main__":
    sys.exit(main())
