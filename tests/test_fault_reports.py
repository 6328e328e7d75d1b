"""What a lost executor is told and costs, on a standalone cluster on 127.0.0.1 (2 workers x 1
core, ``kill -9`` of a worker with its executor and Python workers): an asynchronous fit logs
the lines a synchronous one does (which executor and partitions were lost, that their optimizer
state restarts), and a loss just after the last round does not hold the fit's clean-up for
``spark.locality.wait.process`` (set to 180 s here, so that a wait would be unmistakable)."""
from __future__ import annotations

import os
import time

import pytest

TRAIN_ROWS = 3000
LOCALITY_WAIT_S = 180
BASE_FIT = {"input": "numpy", "mode": "sync", "sync": "average", "local_steps": 25, "epochs": 3,
            "batch_size": 32}


@pytest.fixture(scope="module")
def faults(mnist_dir, _standalone):
    from helpers.faults_job import FaultDriver

    cluster = _standalone.ensure_workers()
    saved = os.environ.get("SPARKNET_FAULTS_LOCALITY_WAIT")
    os.environ["SPARKNET_FAULTS_LOCALITY_WAIT"] = f"{LOCALITY_WAIT_S}s"
    try:
        driver = FaultDriver(cluster.url, mnist_dir, TRAIN_ROWS, base=BASE_FIT)
    finally:
        if saved is None:
            os.environ.pop("SPARKNET_FAULTS_LOCALITY_WAIT", None)
        else:
            os.environ["SPARKNET_FAULTS_LOCALITY_WAIT"] = saved
    try:
        yield {"cluster": cluster, "driver": driver}
    finally:
        driver.close()


def _kill_worker_1(cluster, when: list[float]):
    def on_kill():
        assert cluster.executor_pids(1), "worker 1 runs no executor"
        cluster.kill_worker(1)
        when.append(time.time())
    return on_kill


@pytest.mark.standalone
@pytest.mark.slow
def test_async_fit_says_which_executor_was_lost_and_that_optimizer_state_restarts(faults):
    driver, cluster = faults["driver"], faults["cluster"].ensure_workers()
    killed: list[float] = []
    out = driver.fit(name="async-killed-report", mode="async", kill_after=2, epochs=4,
                     on_kill=_kill_worker_1(cluster, killed))
    assert killed and "error" not in out, out.get("trace")
    assert out["epochs_run"] == 4
    warnings = out["warnings"]
    # the line sync mode logs (Resident.rebuild): which executor, which partitions, rebuilt
    rebuilt = [w for w in warnings if "lost (partition(s)" in w and "rebuilt partition(s)" in w]
    assert len(rebuilt) == 1, warnings
    assert "executor" in rebuilt[0] and "(their optimizer state restarts)" in rebuilt[0]
    # and, as in sync mode, what became of the rebuilt partitions' optimizer state
    state = [w for w in warnings if "optimizer state of rebuilt partition(s)" in w]
    assert len(state) == 1 and "restarts from zero" in state[0], warnings
    print("\n".join(w for w in warnings if "lost" in w or "optimizer state" in w))


@pytest.mark.standalone
@pytest.mark.slow
def test_a_loss_just_after_the_last_round_does_not_hold_the_clean_up(faults):
    driver, cluster = faults["driver"], faults["cluster"].ensure_workers()
    killed: list[float] = []
    # the driver stops after the last epoch's last round until the worker is dead, then goes on
    # to the clean-up of the fit's shards, one of them on the dead executor
    out = driver.fit(name="sync-killed-at-end", kill_after=BASE_FIT["epochs"], hold_for_kill=True,
                     on_kill=_kill_worker_1(cluster, killed), timeout=600)
    assert killed and "error" not in out, out.get("trace")
    assert out["epochs_run"] == BASE_FIT["epochs"]
    after = out["returned"] - killed[0]
    print(f"fit returned {after:.1f} s after the kill (locality wait {LOCALITY_WAIT_S} s)")
    # a clean-up waiting for the dead executor would take the locality wait, or be cut by the
    # clean-up's own 60 s timeout: either is far past this bound
    assert after < 30, f"the fit returned {after:.1f} s after the executor was lost"
    assert out["persisted_left"] == 0
