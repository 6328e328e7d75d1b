"""Driver program for the standalone model-parallel test (run in its own process, so it can
own a SparkContext on the standalone master without touching the test session's local one).

Usage: python tests/helpers/mp_standalone_job.py MASTER_URL IN_FEATURES UNITS LIMIT_MIB STEPS

Trains Dense(UNITS) on IN_FEATURES inputs (float32, SGD) cut into 2 blocks for STEPS steps
(one minibatch, repeated, so the loss must fall),
then tries the same layer in 1 block; prints one JSON line ``RESULT {...}``.
"""
from __future__ import annotations

import json
import os
import sys
import time


def main() -> int:
    master, n_in, units, limit_mib, steps = sys.argv[1], *map(int, sys.argv[2:6])
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    import numpy as np
    from pyspark.sql import SparkSession

    from sparknet import SGD, Dense
    from sparknet.cluster.model_parallel import BlockMemoryError, ModelParallel, vm_size
    from sparknet.cluster.model_parallel.block_partition import BlockPlan

    spark = (SparkSession.builder.master(master).appName("sparknet-mp-standalone")
             .config("spark.ui.enabled", "false")
             .config("spark.driver.host", "127.0.0.1").config("spark.driver.bindAddress", "127.0.0.1")
             .config("spark.executor.cores", "1").config("spark.executor.memory", "512m")
             .config("spark.executor.pyspark.memory", f"{limit_mib}m")
             .config("spark.locality.wait.process", "30s")
             .config("spark.task.maxFailures", "2")
             .config("spark.python.worker.reuse", "true").getOrCreate())
    sc = spark.sparkContext
    sc.setLogLevel("ERROR")
    out: dict = {"layer_mib": n_in * units * 4 / 2**20, "limit_mib": limit_mib}
    try:
        deadline = time.time() + 60
        while sc._jsc.sc().getExecutorMemoryStatus().size() < 3:   # driver + 2 executors
            if time.time() > deadline:
                raise TimeoutError("the 2 executors did not register within 60 s")
            time.sleep(0.2)

        def probe(_):
            import resource

            import sparknet.cluster.model_parallel as mpm
            return [(os.getppid(), mpm.vm_size(), resource.getrlimit(resource.RLIMIT_AS)[0])]
        out["worker_vm"] = sc.parallelize(range(2), 2).mapPartitions(probe).collect()

        rng = np.random.default_rng(0)
        X = rng.standard_normal((8 * steps, n_in)).astype(np.float32)
        y = rng.integers(0, 10, size=8 * steps)
        layers = [Dense(units, activation="relu"), Dense(10, activation="softmax")]
        t0 = time.time()
        mp = ModelParallel(layers, BlockPlan({0: 2}), (n_in,), spark=spark, seed=1,
                           optimizer=SGD(lr=1e-3), name="mpstandalone")
        out["init_s"] = time.time() - t0
        out["home"] = mp.backend.placement()
        losses = [mp.train_on_batch(X[:8], y[:8])[0] for _ in range(steps)]   # one batch, memorised
        out["k2_losses"] = losses
        out["k2_steps"] = mp.t
        out["k2_step_s"] = mp.step_times
        out["bytes_per_step"] = mp.last_step_bytes
        out["slots"] = mp.status()
        out["tasks"], out["moves"] = mp.backend.tasks, mp.backend.moves
        out["driver_vm_mib"] = vm_size() / 2**20
        mp.close()
        try:
            mp1 = ModelParallel([Dense(units, activation="relu"), Dense(10, activation="softmax")],
                                BlockPlan({0: 1}), (n_in,), spark=spark, seed=1,
                                optimizer=SGD(lr=0.01), name="mpstandalone1")
            mp1.fit(X, y, epochs=1, batch_size=8, max_steps=1)
            mp1.close()
            out["k1_error"] = None
        except BlockMemoryError as exc:
            out["k1_error"] = f"{type(exc).__name__}: {exc}"
    finally:
        print("RESULT " + json.dumps(out), flush=True)
        spark.stop()
    return 0


if __name__ == "__main__":
    sys.exit(main())
