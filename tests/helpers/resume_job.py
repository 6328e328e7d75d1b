"""Driver program of the resume tests: a data-parallel fit on local[2] that checkpoints and
kills its own process with SIGKILL at a chosen round, as a crashed driver would end.

Usage: python tests/helpers/resume_job.py CHECKPOINT_DIR

Runs the fits of every mode of :data:`SETTINGS` (``gradient``, ``average``, ``async``;
shared with tests/test_resume.py, which runs the uninterrupted and the resumed fits) at
the same time, one driver thread each, checkpointing into ``CHECKPOINT_DIR/<mode>`` (one
Spark start for the three).  Each fit stops in its round hook after its round
``kill_at`` (counted over the whole fit) until every fit got to its own; then the process
SIGKILLs itself, so it never returns normally: its exit status is -9.  Before it dies it
prints the folders of the resident shards it leaves behind (``SHARD <folder>``), for the
test to remove.
"""
from __future__ import annotations

import os
import signal
import sys
import threading
from typing import Any

#: Per mode: trainer arguments, fit arguments, the learning rate and the round after which
#: the driver kills itself (rounds counted over the whole fit).
SETTINGS: dict[str, dict[str, Any]] = {
    # 1,347 rows in 256-row global minibatches: 6 rounds per epoch; a checkpoint every
    # 4 rounds, so the kill after round 5 leaves checkpoint 4 (epoch 1, before round 5)
    "gradient": {"trainer": {"sync": "gradient", "checkpoint_every": 4, "num_partitions": 2},
                 "fit": {"epochs": 2, "batch_size": 256}, "lr": 3e-3, "kill_at": 5},
    # 7 local steps of 32 rows per round: 4 rounds per epoch (22 steps), with the outer
    # Nesterov step (its momentum is checkpointed too); killed in epoch 3, after the
    # epoch-2 checkpoint (8)
    "average": {"trainer": {"sync": "average", "local_steps": 7, "outer": "nesterov", "num_partitions": 2},
                "fit": {"epochs": 5, "batch_size": 32}, "lr": 2e-3, "kill_at": 10},
    # one partition: its rounds arrive in one order, so two runs can be compared (with two,
    # the arrival order changes from run to run); 7 steps per round, 7 rounds per epoch
    # (43 steps), killed in epoch 3, after the epoch-2 checkpoint (14)
    "async": {"trainer": {"mode": "async", "sync": "average", "local_steps": 7, "num_partitions": 1},
              "fit": {"epochs": 4, "batch_size": 32}, "lr": 2e-3, "kill_at": 16},
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
    return DataParallelTrainer(model, spark, optimizer=optim.RMSprop(lr=cfg["lr"]),
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
    directory = sys.argv[1]
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    from sparknet.callbacks import LambdaCallback
    from sparknet.datasets import load_digits

    X, y, _Xt, _yt = load_digits(test_size=0.25, seed=0)
    spark = session()
    modes = list(SETTINGS)
    at_kill: dict[str, threading.Event] = {m: threading.Event() for m in modes}
    errors: list[BaseException] = []

    def crash(mode: str, logs: dict[str, Any]) -> None:
        """After each round (and its checkpoint) of ``mode``'s fit."""
        done = int(logs["rounds_done"])
        if done < SETTINGS[mode]["kill_at"]:
            return
        sys.stdout.write(f"KILLED {mode} at round {done} (epoch {int(logs['epoch']) + 1})\n")
        at_kill[mode].set()
        for ev in at_kill.values():   # the first fits to get there wait for the others
            ev.wait(timeout=600)
        from sparknet.cluster.resident import driver as resident
        for res in resident.open_states():  # what the killed driver leaves behind, for the test to remove
            for info in res.infos:
                sys.stdout.write(f"SHARD {os.path.dirname(info.directory)}\n")
        sys.stdout.flush()
        os.kill(os.getpid(), signal.SIGKILL)

    def run(mode: str) -> None:
        try:
            trainer = make_trainer(mode, spark, os.path.join(directory, mode))
            kill = LambdaCallback(on_round_end=lambda _r, logs: crash(mode, logs))
            trainer.fit(X, y, verbose=0, callbacks=[kill], **SETTINGS[mode]["fit"])
        except BaseException as exc:  # noqa: BLE001 - reported below
            errors.append(exc)
            at_kill[mode].set()

    from pyspark import InheritableThread

    threads = [InheritableThread(target=run, args=(m,), daemon=True) for m in modes]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    sys.stderr.write(f"not killed: {errors!r}\n")
    return 3  # not reached: the fits must have been killed


if __name__ == "__main__":
    sys.exit(main())
