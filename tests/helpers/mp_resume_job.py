"""Driver program for the model-parallel resume test (its own process, so it can be killed).

Usage: python tests/helpers/mp_resume_job.py CKPT_DIR KILL_AT

Fits with checkpoints every 2 steps; the process SIGKILLs itself in the middle of step
KILL_AT (inside the step's first Spark job).  The test then resumes in another process
with :func:`make` and :func:`fit`.

The model: float64, a Megatron pair cut into K=2 blocks and a softmax head on the driver,
trained on the first 1,000 sklearn digits for 2 epochs of batch 128 on local[2] (8 steps an
epoch, the last of 104 rows: 16 steps).
"""
from __future__ import annotations

import os
import signal
import sys

ROWS, EPOCHS, BATCH, EVERY = 1000, 2, 128, 2


def make(spark, ckpt_dir, name):
    from sparknet import Dense, RMSprop
    from sparknet.cluster.model_parallel import ModelParallel
    from sparknet.cluster.model_parallel.block_partition import BlockPlan

    layers = [Dense(40, activation="tanh"), Dense(24, activation="relu"), Dense(10, activation="softmax")]
    return ModelParallel(layers, BlockPlan({0: 2, 1: 2}, pair=True), (64,), spark=spark, dtype="float64",
                         seed=3, optimizer=RMSprop(lr=2e-3), checkpoint_dir=ckpt_dir, name=name)


def fit(mp, X, y, **kw):
    """The fit of the job and of the test, on the first :data:`ROWS` rows of ``X``, ``y``."""
    return mp.fit(X[:ROWS], y[:ROWS], epochs=EPOCHS, batch_size=BATCH, checkpoint_every=EVERY, **kw)


def main() -> int:
    ckpt_dir, kill_at = sys.argv[1], int(sys.argv[2])
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    from pyspark.sql import SparkSession
    from sklearn.datasets import load_digits

    X, y = load_digits(return_X_y=True)
    spark = (SparkSession.builder.master("local[2]").appName("sparknet-mp-resume")
             .config("spark.ui.enabled", "false").config("spark.python.worker.reuse", "true").getOrCreate())
    spark.sparkContext.setLogLevel("ERROR")
    mp = make(spark, ckpt_dir, "mpresume")
    run = mp.backend.run

    def run_or_die(job, data=None):
        if mp.t == kill_at:
            print(f"KILLING at step {mp.t}", flush=True)
            os.kill(os.getpid(), signal.SIGKILL)
        return run(job, data)
    mp.backend.run = run_or_die
    fit(mp, X / 16.0, y)
    print("not killed", flush=True)
    return 1


if __name__ == "__main__":
    sys.exit(main())
