"""Asynchronous parameter-server rounds (``mode="async"``) on real local Spark."""
from __future__ import annotations

import time

import numpy as np
import pytest

from helpers.jobs import wait_no_active_jobs
from helpers.models import mlp
from sparknet import RMSprop
from sparknet.cluster.data_parallel.async_mode import AsyncPartitionError
from sparknet.cluster.data_parallel.trainer import DataParallelTrainer
from sparknet.cluster.testing import inject_faults


@pytest.mark.slow
def test_async_matches_sync_accuracy_on_digits(spark, digits):
    """Same model, optimizer, local steps and budget of samples: async within 1 point of sync."""
    X, y, Xt, yt = digits
    epochs, kw = 8, dict(num_partitions=2, local_steps=5, optimizer=RMSprop(lr=2e-3))
    acc = {}
    for mode in ("sync", "async"):
        model = mlp(64)
        trainer = DataParallelTrainer(model, spark, mode=mode, **kw)
        _, h = trainer.fit(X, y, epochs=epochs, batch_size=32, verbose=0)
        acc[mode] = float(model.evaluate(Xt, yt)["accuracy"])
        if mode == "async":
            # the budget: epochs x rows in all, give or take the last round of each partition
            chunk = -(-len(y) // (2 * h["rounds_per_pass"][0]))
            assert 0 <= sum(h["samples"]) - epochs * len(y) <= 2 * chunk
            assert sum(h["updates"]) == sum(1 for u in h.updates if u["applied"]) > 0
    print(f"test accuracy: sync {acc['sync']:.4f}, async {acc['async']:.4f}")
    assert acc["sync"] > 0.9
    assert acc["async"] >= acc["sync"] - 0.01


@pytest.mark.slow
@pytest.mark.parametrize("stale", ["reject", "downweight"])
def test_staleness_bound_holds_in_history(spark, digits, stale):
    """A straggler (0.3 s more per round) makes stale deltas; the bound 1 is enforced."""
    X, y, _, _ = digits
    model = mlp(64)
    trainer = DataParallelTrainer(model, spark, num_partitions=2, mode="async", local_steps=3,
                                  optimizer=RMSprop(lr=2e-3), max_staleness=1, stale=stale)
    with inject_faults(delay={1: 0.3}):
        _, h = trainer.fit(X, y, epochs=1, batch_size=32, verbose=0)
    ups = h.updates
    assert len(ups) == sum(h["rounds"]) and all("staleness" in u for u in ups)
    late = [u for u in ups if u["staleness"] > 1]
    print(stale, "staleness seen:", np.bincount([u["staleness"] for u in ups]).tolist())
    assert late, "the straggler never produced a stale delta"
    assert all(u["partition"] == 1 for u in late)
    if stale == "reject":
        assert all(u["staleness"] <= 1 for u in ups if u["applied"])
        assert all(not u["applied"] and u["weight"] == 0 for u in late)
        assert sum(h["rejected"]) == len(late)
        assert sum(h["downweighted"]) == 0
    else:
        assert all(u["applied"] for u in ups)
        for u in late:
            assert u["weight"] == pytest.approx(0.5 * 2.0 / (1 + u["staleness"]))  # 1/P, scaled
        assert sum(h["downweighted"]) == len(late)
        assert sum(h["rejected"]) == 0
    assert sum(h["updates"]) == sum(1 for u in ups if u["applied"])
    assert max(h["staleness_max"]) <= (1 if stale == "reject" else max(u["staleness"] for u in ups))


@pytest.mark.slow
@pytest.mark.parametrize("coalesce", [0.0, 1.0])
def test_coalescing_restarts_close_partitions_together(spark, digits, coalesce):
    """Partition 1 ends each round 0.15 s after partition 0 (injected delays 0.25 s and
    0.4 s).  With ``coalesce=1`` partition 0's relaunch waits for partition 1's delta,
    so both restart from the same parameters (the same launch version) and partition 0
    is hardly ever stale; with ``coalesce=0`` it relaunches at once, one update behind."""
    X, y, _, _ = digits
    trainer = DataParallelTrainer(mlp(64), spark, num_partitions=2, mode="async", local_steps=3,
                                  optimizer=RMSprop(lr=2e-3), coalesce=coalesce)
    with inject_faults(delay={0: 0.25, 1: 0.4}):
        _, h = trainer.fit(X, y, epochs=2, batch_size=32, verbose=0)
    ups = h.updates
    p0 = [u for u in ups if u["partition"] == 0]
    p1_versions = {u["version"] for u in ups if u["partition"] == 1}
    together = sum(u["version"] in p1_versions for u in p0) / len(p0)
    print(f"coalesce={coalesce}: partition 0's launches shared with partition 1: {together:.0%}, "
          f"held {[round(u['held'], 3) for u in p0]}, staleness {[u['staleness'] for u in p0]}")
    assert len(p0) >= 4
    if coalesce:
        assert together >= 0.6  # all but the first round and the epochs' ends
        assert sum(u["held"] > 0 for u in p0) >= len(p0) // 2
        assert sum(u["staleness"] == 0 for u in p0) >= 0.6 * len(p0)
    else:
        assert all(u["held"] == 0 for u in ups)
        assert together <= 0.4  # only each epoch's first launch is shared
        assert sum(u["staleness"] >= 1 for u in p0) >= len(p0) // 2


def test_failing_partition_surfaces_as_error_naming_it(spark, digits):
    X, y, _, _ = digits
    model = mlp(64)
    trainer = DataParallelTrainer(model, spark, num_partitions=2, mode="async", local_steps=3)
    t0 = time.perf_counter()
    with inject_faults(fail={1: "disk on fire"}):
        with pytest.raises(AsyncPartitionError, match=r"partition 1.*RuntimeError: disk on fire") as err:
            trainer.fit(X, y, epochs=3, batch_size=32, verbose=0)
    assert err.value.partition == 1
    assert time.perf_counter() - t0 < 120
    assert wait_no_active_jobs(spark.sparkContext) == []


@pytest.mark.slow
@pytest.mark.parametrize("how", ["callback", "sigint"])
def test_keyboard_interrupt_cancels_jobs_and_returns_last_applied_model(spark, digits, how):
    """Interrupt after 3 updates while the straggler's job runs -- raised by the progress
    callback, or a real SIGINT (Ctrl-C) sent to the driver from another thread: the fit
    returns at once with the model of the last applied update, and no Spark job is left
    running."""
    import os
    import signal
    import threading

    X, y, Xt, yt = digits
    model = mlp(64)
    seen = {}
    snapshots = {}

    def on_update(info):
        snapshots[info["update"]] = model.params.copy()
        if info["applied"] and info["update"] == 3 and "t" not in seen:
            seen["t"] = time.perf_counter()
            if how == "callback":
                raise KeyboardInterrupt
            threading.Timer(0.05, os.kill, (os.getpid(), signal.SIGINT)).start()

    trainer = DataParallelTrainer(model, spark, num_partitions=2, mode="async", local_steps=3,
                                  on_update=on_update)
    with inject_faults(delay={1: 300.0}):  # partition 1's rounds take minutes
        out, h = trainer.fit(X, y, epochs=5, batch_size=32, validation_data=(Xt, yt), verbose=0)
    assert out is model
    assert time.perf_counter() - seen["t"] < 30, "the interrupt waited for the straggler"
    last = h.updates[-1]["update"]
    np.testing.assert_array_equal(model.params, snapshots[last])
    assert h["interrupted"] == [1.0] and h["updates"] == [float(last)] and last >= 3
    assert "val_accuracy" not in h
    assert all(u["partition"] == 0 for u in h.updates)
    sc = spark.sparkContext
    assert wait_no_active_jobs(sc) == []
    assert sc.statusTracker().getActiveStageIds() == []
    # the straggler's task (sleeping for minutes) no longer holds a core: two tasks run now
    t0 = time.perf_counter()
    assert sc.parallelize(range(2), 2).map(lambda v: v + 1).collect() == [1, 2]
    assert time.perf_counter() - t0 < 30


def test_bad_async_options(spark):
    with pytest.raises(ValueError, match="max_staleness"):
        DataParallelTrainer(mlp(64), spark, mode="async", max_staleness=-1)
    with pytest.raises(ValueError, match="stale"):
        DataParallelTrainer(mlp(64), spark, mode="async", stale="drop")
    with pytest.raises(ValueError, match="sync='average'"):
        DataParallelTrainer(mlp(64), spark, mode="async", sync="gradient")
    for bad in (-0.1, 1.5, "soon", True, float("nan")):
        with pytest.raises(ValueError, match="coalesce"):
            DataParallelTrainer(mlp(64), spark, mode="async", coalesce=bad)
    with pytest.raises(TypeError, match="max_staleness"):
        DataParallelTrainer(mlp(64), spark, mode="sync", max_staleness=2)
    with pytest.raises(ValueError, match="slow"):
        with inject_faults(slow={0: -1.0}):
            pass


@pytest.mark.slow
def test_lost_shard_files_are_rebuilt_and_training_goes_on(spark, digits):
    """The training shards' spill files vanish mid-fit (as when a worker's host changes):
    the driver stops the rounds, rebuilds the shards from the source and finishes."""
    import os
    import shutil

    from sparknet.cluster.resident import driver as resident

    X, y, Xt, yt = digits
    model = mlp(64)
    removed = []

    def on_update(info):
        if info["update"] == 2 and not removed:
            for res in resident.open_states():
                if res.key.startswith("train-"):
                    for shard in res.infos:
                        shutil.rmtree(shard.directory, ignore_errors=True)
                        removed.append(shard.directory)

    trainer = DataParallelTrainer(model, spark, num_partitions=2, mode="async", local_steps=5,
                                  optimizer=RMSprop(lr=2e-3), on_update=on_update)
    _, h = trainer.fit(X, y, epochs=3, batch_size=32, verbose=0)
    assert removed and not any(os.path.exists(d) for d in removed)
    assert len(h["updates"]) == 3
    assert sum(h["samples"]) >= 3 * len(y)
    acc = float(model.evaluate(Xt, yt)["accuracy"])
    print(f"accuracy after a rebuild: {acc:.4f}")
    assert acc > 0.85


@pytest.mark.slow
def test_fault_injection_enters_through_the_task_hook_and_leaves_with_the_block(spark, digits):
    """inject_faults wraps only the training tasks (calibration and evaluation run
    untouched), applies to synchronous rounds too, and is gone after its block."""
    from sparknet.cluster.data_parallel import round_task as rounds

    X, y, _, _ = digits
    trainer = DataParallelTrainer(mlp(64), spark, num_partitions=2, local_steps=3)
    with inject_faults(fail=[1]):
        with pytest.raises(Exception, match=r"injected failure in partition 1 \(sparknet.cluster.testing"):
            trainer.fit(X, y, epochs=1, batch_size=32, verbose=0)
        assert set(trainer.evaluate(X, y)) == {"loss", "accuracy"}
    assert rounds.set_task_wrapper(None) is None
    _, h = trainer.fit(X, y, epochs=1, batch_size=32, verbose=0)
    assert len(h["loss"]) == 1 and np.isfinite(h["loss"][0])
