"""Driver program of the resume tests: a data-parallel fit on local[2] that checkpoints and
kills its own process with SIGKILL at a chosen round, as a crashed driver would end.

Usage: python _resume_job.py MODE CHECKPOINT_DIR KILL_AT

MODE is ``gradient``, ``average`` or ``async`` (the settings are :data:`SETTINGS`, shared
with tests/test_resume.py, which runs the uninterrupted and the resumed fits); the process
SIGKILLs itself after round KILL_AT of the fit (counted over the whole fit), so it never
returns normally: its exit status is -9.
"""
from __future__ import annotations

import os
import signal
import sys
from typing import Any

#: Per mode: trainer arguments, fit arguments, and when checkpoints are written.
SETTINGS: dict[str, dict[str, Any]] = {
    # 1,347 rows in 256-row global minibatches: 6 rounds per epoch; a checkpoint every
    # 4 rounds, so the kill after round 10 leaves checkpoint 8 (epoch 2, before round 3)
    "gradient": {"trainer": {"sync": "gradient", "checkpoint_every": 4},
                 "fit": {"epochs": 3, "batch_size": 256}, "lr": 3e-3},
    # 7 local steps of 32 rows per round: 3 rounds per epoch; the outer Nesterov step
    # (its momentum is checkpointed too); the kill in epoch 6 leaves the epoch-5 checkpoint
    "average": {"trainer": {"sync": "average", "local_steps": 7, "outer": "nesterov"},
                "fit": {"epochs": 8, "batch_size": 32}, "lr": 2e-3},
    "async": {"trainer": {"mode": "async", "sync": "average", "local_steps": 7},
              "fit": {"epochs": 8, "batch_size": 32}, "lr": 2e-3},
}


def make_trainer(mode: str, spark: Any, checkpoint_dir: str | None) -> Any:
    """The trainer of ``mode``'s test fit (a new float64 64-32-10 MLP, seed 0)."""
    from sparknet import optim
    from sparknet.cluster import DataParallelTrainer
    from sparknet.layers import Dense
    from sparknet.model import Sequential

    cfg = SETTINGS[mode]
    model = Sequential([Dense(32, activation="relu"), Dense(10, activation="softmax")], seed=0,
                       dtype="float64")
    return DataParallelTrainer(model, spark, num_partitions=2, optimizer=optim.RMSprop(lr=cfg["lr"]),
                               checkpoint_dir=checkpoint_dir, seed=0, **cfg["trainer"])


def session() -> Any:
    """A local[2] session configured as the test fixture's."""
    from pyspark.sql import SparkSession

    spark = (SparkSession.builder.master("local[2]").appName("sparknet-resume-job")
             .config("spark.ui.enabled", "false")
             .config("spark.driver.memory", "1g")
             .config("spark.python.worker.reuse", "true")
             .config("spark.python.unix.domain.socket.enabled", "true")
             .getOrCreate())
    spark.sparkContext.setLogLevel("ERROR")
    return spark


def main() -> int:
    mode, directory, kill_at = sys.argv[1], sys.argv[2], int(sys.argv[3])
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    from sparknet.cluster.testing import on_round
    from sparknet.datasets import load_digits

    X, y, _Xt, _yt = load_digits(test_size=0.25, seed=0)
    spark = session()
    trainer = make_trainer(mode, spark, directory)

    def crash(event: Any) -> None:
        if event.rounds_done >= kill_at:
            from sparknet.cluster import resident
            for res in list(resident._OPEN):  # what the killed driver leaves behind, for the test to remove
                for info in res.infos:
                    sys.stdout.write(f"SHARD {os.path.dirname(info.directory)}\n")
            sys.stdout.write(f"KILLED at round {event.rounds_done} (epoch {event.epoch + 1})\n")
            sys.stdout.flush()
            os.kill(os.getpid(), signal.SIGKILL)

    with on_round(crash):
        trainer.fit(X, y, verbose=0, **SETTINGS[mode]["fit"])
    return 3  # not reached: the fit must have been killed


if __name__ == "__main__":
    sys.exit(main())
