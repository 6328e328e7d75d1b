"""A lost executor under Spark Connect: a Connect server whose master is the run's
standalone cluster (two one-core workers on 127.0.0.1), a client in this process, and
worker 1 killed with ``kill -9`` (its executor JVM and Python workers) in the middle of
a fit.  The fit rebuilds the lost shard and ends as an undisturbed one does; never a
hang."""
from __future__ import annotations

import logging
import threading
import time

import numpy as np
import pytest

from sparknet import Dense, RMSprop, Sequential
from sparknet.cluster.data_parallel.trainer import DataParallelTrainer


@pytest.fixture(scope="module")
def connect_standalone(_standalone):
    """(cluster, session): a Connect server over the standalone cluster, both executors up."""
    try:
        import grpc  # noqa: F401
    except ImportError as exc:
        pytest.skip(f"the Spark Connect client is not installed ({exc}): pip install '.[test]'")
    from pyspark.sql.connect.session import SparkSession as RemoteSession

    from helpers.connect_server import ConnectServer
    from sparknet.cluster.engine.session import DEFAULT_CONF

    conf = {k: v for k, v in DEFAULT_CONF.items() if k != "spark.ui.showConsoleProgress"}
    conf.update({"spark.ui.enabled": "false", "spark.executor.cores": "1", "spark.cores.max": "2",
                 "spark.executor.memory": "1g", "spark.driver.memory": "1g",
                 "spark.sql.shuffle.partitions": "2"})
    cluster = _standalone.ensure_workers()
    with ConnectServer(cluster.url, conf) as server:
        session = RemoteSession.builder.remote(server.url).create()
        try:
            _wait_for_executors(session, 2)
            yield cluster, session
        finally:
            session.stop()


def _wait_for_executors(session, n: int, timeout: float = 120.0) -> None:
    """Until ``n`` executors run this application's tasks (told apart by their Python
    daemon, the parent of every Python worker of an executor)."""
    def daemons(batches):
        import os as _os

        import pyarrow as pa
        for _ in batches:
            pass
        yield pa.RecordBatch.from_pydict({"d": [_os.getppid()]})

    deadline, seen = time.monotonic() + timeout, set()
    while len(seen) < n:
        if time.monotonic() > deadline:
            raise TimeoutError(f"{len(seen)} of {n} executors up after {timeout:.0f} s")
        seen |= {r[0] for r in session.range(0, 8, 1, numPartitions=8).mapInArrow(daemons, "d long").collect()}
        time.sleep(0.5)


def _fit(session, X, y, on_round=None):
    """The test's fit: one epoch of 22 rounds (1,347 rows in global minibatches of 64);
    ``on_round(logs)`` runs after each of its rounds."""
    from sparknet.callbacks import LambdaCallback

    model = Sequential([Dense(64, activation="relu"), Dense(10, activation="softmax")], input_shape=(64,),
                       seed=3)
    trainer = DataParallelTrainer(model, session, num_partitions=2, sync="gradient",
                                  optimizer=RMSprop(lr=2e-3), seed=7)
    t0 = time.monotonic()
    callbacks = [] if on_round is None else [LambdaCallback(on_round_end=lambda _r, logs: on_round(logs))]
    trainer.fit(X, y, epochs=1, batch_size=64, verbose=0, callbacks=callbacks)
    return model, time.monotonic() - t0


@pytest.mark.standalone
@pytest.mark.slow
def test_a_lost_executor_under_connect_is_rebuilt_and_the_fit_ends_as_undisturbed(connect_standalone, digits,
                                                                                  caplog):
    """Worker 1 killed after the third round: the next round's task finds its anchor
    block gone, the shards are rebuilt (the lost one from the source, on the executor
    left) and the fit goes on; with sync='gradient' it ends with the undisturbed fit's
    weights (the same steps on the same rows), in bounded time."""
    cluster, session = connect_standalone
    X, y, Xt, yt = digits
    ref, ref_s = _fit(session, X, y)
    killed = []

    def kill(logs):
        if logs["rounds_done"] == 3 and not killed:
            assert cluster.executor_pids(1), "worker 1 runs no executor"
            killed.append(cluster.kill_worker(1))
            threading.Thread(target=cluster.restart_worker, args=(1,), daemon=True).start()

    with caplog.at_level(logging.WARNING, logger="sparknet"):
        got, got_s = _fit(session, X, y, on_round=kill)
    assert killed, "the fit ended before the kill"
    rebuilt = [r.getMessage() for r in caplog.records if "rebuilt" in r.getMessage()]
    assert rebuilt, [r.getMessage() for r in caplog.records]
    rel = float(np.linalg.norm(got.params - ref.params) / np.linalg.norm(ref.params))
    acc_ref, acc_got = (float(m.evaluate(Xt, yt)["accuracy"]) for m in (ref, got))
    print(f"lost executor under Connect: accuracy {acc_got:.4f} (undisturbed {acc_ref:.4f}), weights rel. "
          f"diff {rel:.1e}, time lost {got_s - ref_s:.1f} s; {rebuilt[0]}")
    assert rel <= 1e-5 and acc_got == acc_ref
    assert got_s - ref_s < 90, "a dead executor must cost seconds, not a hang"
