"""DataParallelTrainer checkpoints: a driver killed with SIGKILL mid-fit resumes from its
newest checkpoint (sync gradient bit-identical, average and async to the same accuracy);
divergence stops the fit with TrainingDiverged, the weights and the newest checkpoint
finite; a hung task ends the fit with RoundTimeout; Ctrl-C returns; partition optimizer
state comes back from the checkpoint after the shards are rebuilt."""
from __future__ import annotations

import logging
import os
import shutil
import signal
import subprocess
import sys
import time

import numpy as np
import pytest

from helpers import resume_job as job
from helpers.jobs import wait_no_active_jobs
from sparknet import optim
from sparknet.callbacks import LambdaCallback
from sparknet.checkpoint import CheckpointStore
from sparknet.cluster import DataParallelTrainer
from sparknet.cluster.data_parallel import checkpoints, timeouts
from sparknet.cluster.testing import inject_faults
from sparknet.errors import RoundTimeout, TrainingDiverged
from sparknet.layers import Dense
from sparknet.model import Sequential

JOB = job.__file__


class _Killed:
    """The driver of tests/helpers/resume_job.py (the gradient, average and async fits at once),
    started when the module's first test asks for it (it runs while the tests fit the
    uninterrupted runs), killed by itself with SIGKILL mid-fit."""

    def __init__(self, root: str) -> None:
        env = dict(os.environ, OPENBLAS_NUM_THREADS="1", PYSPARK_PYTHON=sys.executable)
        self.root, self.stdout = root, None
        self.proc = subprocess.Popen([sys.executable, JOB, root], stdout=subprocess.PIPE,
                                     stderr=subprocess.PIPE, text=True, env=env)

    def __getitem__(self, mode: str) -> str:
        """The checkpoint folder of ``mode``'s fit, once the driver is dead."""
        if self.stdout is None:
            stdout, stderr = self.proc.communicate(timeout=300)
            for line in stdout.splitlines():  # the shards the dead driver left in /dev/shm
                if line.startswith("SHARD "):
                    shutil.rmtree(line[6:], ignore_errors=True)
            assert self.proc.returncode == -signal.SIGKILL, f"exit {self.proc.returncode}\n{stderr[-3000:]}"
            self.stdout = stdout
        assert f"KILLED {mode} at round {job.SETTINGS[mode]['kill_at']}" in self.stdout
        return os.path.join(self.root, mode)

    def close(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
            self.proc.communicate()


@pytest.fixture(scope="module")
def killed(tmp_path_factory):
    k = _Killed(str(tmp_path_factory.mktemp("killed")))
    yield k
    k.close()


def _fit(mode, spark, digits, directory=None, resume=False):
    X, y, Xt, yt = digits
    trainer = job.make_trainer(mode, spark, directory)
    _, history = trainer.fit(X, y, verbose=0, resume=resume, **job.SETTINGS[mode]["fit"])
    return trainer.model, history, float(trainer.model.evaluate(Xt, yt)["accuracy"])


@pytest.mark.slow
def test_gradient_fit_killed_by_sigkill_resumes_to_bit_identical_weights(spark, digits, killed):
    full, h_full, _ = _fit("gradient", spark, digits)
    store = CheckpointStore(killed["gradient"])
    assert [c.step for c in store.checkpoints()] == [4]          # 4 rounds, then killed after 5
    pos = store.latest().meta["position"]
    assert (pos["epoch"], pos["round"], pos["rounds_done"]) == (0, 4, 4)   # mid-epoch 1
    resumed, h, _ = _fit("gradient", spark, digits, killed["gradient"], resume=True)
    assert h.resumed_from.endswith("ckpt-000000000004")
    assert resumed.params.dtype == np.float64
    assert np.array_equal(resumed.params, full.params)
    assert h.epoch == h_full.epoch == [0, 1]
    assert np.array_equal(h["loss"], h_full["loss"])             # the interrupted epoch's sums too
    assert [c["step"] for c in h.checkpoints] == [8, 12]


@pytest.mark.slow
def test_average_fit_killed_resumes_with_each_partitions_optimizer_state(spark, digits, killed):
    full, _, acc_full = _fit("average", spark, digits)
    ckpt = CheckpointStore(killed["average"]).latest()
    assert ckpt.step == 8 and ckpt.meta["position"]["epoch"] == 2
    assert {"part00000_t", "part00000_square_avg", "part00001_square_avg", "outer_momentum_buffer"} <= set(ckpt.arrays)
    resumed, h, acc = _fit("average", spark, digits, killed["average"], resume=True)
    assert abs(acc - acc_full) <= 0.003, (acc, acc_full)
    # plain schedule (fixed local_steps): with every partition's RMSprop state and the
    # outer momentum restored, the continuation is exact
    assert np.array_equal(resumed.params, full.params)
    assert h.epoch == [0, 1, 2, 3, 4]


@pytest.mark.slow
def test_async_fit_killed_resumes_to_the_same_accuracy(spark, digits, killed):
    full, h_full, acc_full = _fit("async", spark, digits)
    ckpt = CheckpointStore(killed["async"]).latest()
    assert ckpt.step == 14 and ckpt.meta["position"]["epoch"] == 2 and ckpt.meta["async"]["version"] == 14
    resumed, h, acc = _fit("async", spark, digits, killed["async"], resume=True)
    assert abs(acc - acc_full) <= 0.003, (acc, acc_full)
    assert acc > 0.85
    assert len(h.updates) == len(h_full.updates)                 # no round lost or run twice
    assert [c["job"] for c in h.checkpoints] == [True, True]     # async: one collect job per checkpoint
    assert np.array_equal(resumed.params, full.params)


@pytest.mark.slow
def test_resume_refuses_a_checkpoint_of_another_network(spark, digits, killed):
    X, y, _, _ = digits
    model = Sequential([Dense(16, activation="relu"), Dense(10, activation="softmax")], seed=0, dtype="float64")
    trainer = DataParallelTrainer(model, spark, num_partitions=2, sync="gradient",
                                  checkpoint_dir=killed["gradient"])
    with pytest.raises(ValueError, match="another network"):
        trainer.fit(X, y, epochs=2, batch_size=256, verbose=0, resume=True)


def test_a_fresh_fit_in_a_used_folder_numbers_its_checkpoints_after_the_earlier_ones(spark, digits, tmp_path):
    X, y, _, _ = digits
    steps = []
    for _ in range(2):  # 6 rounds per epoch, a checkpoint at its end
        trainer = job.make_trainer("gradient", spark, str(tmp_path))
        trainer.checkpoint_every = checkpoints.CheckpointEvery.parse("epoch")
        _, h = trainer.fit(X, y, epochs=1, batch_size=256, verbose=0)
        steps.append([c["step"] for c in h.checkpoints])
    assert steps == [[6], [12]]
    first, second = CheckpointStore(str(tmp_path)).checkpoints()
    assert first.meta["run"] != second.meta["run"]


def _diverging(spark, directory, **kw):
    """A 64-64-64-10 MLP with SGD(lr=1e3, momentum 0.9): non-finite within 5 steps."""
    model = Sequential([Dense(64, activation="relu"), Dense(64, activation="relu"),
                        Dense(10, activation="softmax")], seed=0, input_shape=(64,))
    return DataParallelTrainer(model, spark, num_partitions=2, optimizer=optim.SGD(lr=1e3, momentum=0.9),
                               checkpoint_dir=directory, seed=0, **kw)


def test_divergence_stops_sync_fit_with_finite_weights_and_newest_checkpoint_intact(spark, digits, tmp_path):
    X, y, _, _ = digits
    trainer = _diverging(spark, str(tmp_path), sync="gradient", checkpoint_every=1)
    with pytest.raises(TrainingDiverged, match=r"epoch 1, round \d+, partition [01]") as err:
        trainer.fit(X, y, epochs=3, batch_size=128, verbose=0)
    e = err.value
    assert isinstance(e, FloatingPointError) and e.epoch == 1 and e.partition in (0, 1)
    assert e.what in ("loss", "gradient")
    assert np.isfinite(trainer.model.params).all()
    store = CheckpointStore(str(tmp_path))
    newest = store.latest()
    assert newest.step == e.round - 1                            # every round before it, none after
    saved = store.load(newest, ["params"])["params"]
    assert np.isfinite(saved).all() and np.array_equal(saved, trainer.model.params)


def test_divergence_stops_async_fit_before_the_bad_delta_is_applied(spark, digits, tmp_path):
    X, y, _, _ = digits
    trainer = _diverging(spark, None, mode="async", sync="average", local_steps=7)
    applied = [trainer.model.params.copy()]   # the parameters after every applied delta
    record = LambdaCallback(on_round_end=lambda _r, _logs: applied.append(trainer.model.params.copy()))
    with pytest.raises(TrainingDiverged, match=r"epoch 1, round \d+, partition [01]") as err:
        trainer.fit(X, y, epochs=2, batch_size=128, verbose=0, callbacks=[record])
    assert err.value.epoch == 1 and err.value.what in ("loss", "delta")
    assert np.isfinite(trainer.model.params).all()
    assert np.array_equal(trainer.model.params, applied[-1])    # the bad delta never applied


def test_keyboard_interrupt_returns_the_model_of_the_last_round(spark, digits):
    X, y, _, _ = digits
    trainer = job.make_trainer("gradient", spark, None)
    seen = []

    def interrupt(_round, logs):
        seen.append(trainer.model.params.copy())
        if logs["rounds_done"] == 3:
            raise KeyboardInterrupt

    model, h = trainer.fit(X, y, epochs=2, batch_size=256, verbose=0,
                           callbacks=[LambdaCallback(on_round_end=interrupt)])
    assert h.interrupted and h.epoch == []
    assert np.array_equal(model.params, seen[-1])
    left = wait_no_active_jobs(spark.sparkContext, timeout=30.0)
    assert not left, f"jobs still active after the interrupted fit: {left}"


@pytest.mark.slow
def test_hung_async_task_fails_the_fit_with_round_timeout(spark, digits):
    X, y, _, _ = digits
    model = Sequential([Dense(32, activation="relu"), Dense(10, activation="softmax")], seed=0)
    trainer = DataParallelTrainer(model, spark, num_partitions=2, mode="async", sync="average",
                                  local_steps=7, round_timeout=4)
    t0 = time.perf_counter()
    with inject_faults(hang=[1], hang_after=4), pytest.raises(RoundTimeout, match="round_timeout=4 s"):
        trainer.fit(X, y, epochs=3, batch_size=32, verbose=0)
    assert time.perf_counter() - t0 < 80
    _assert_jobs_end(spark)


@pytest.mark.slow
def test_hung_sync_task_fails_the_fit_with_round_timeout(spark, digits):
    X, y, _, _ = digits
    trainer = job.make_trainer("gradient", spark, None)
    trainer.round_timeout = 4.0
    t0 = time.perf_counter()
    with inject_faults(hang=[0], hang_after=3), pytest.raises(RoundTimeout, match="longer than 4 s"):
        trainer.fit(X, y, epochs=2, batch_size=256, verbose=0)
    assert time.perf_counter() - t0 < 80
    _assert_jobs_end(spark)


@pytest.mark.slow
def test_lost_shards_get_their_optimizer_state_back_from_the_checkpoint(spark, digits, tmp_path, caplog):
    X, y, _, _ = digits
    trainer = job.make_trainer("average", spark, str(tmp_path))
    from sparknet.cluster.resident import driver as resident

    def lose(_round, logs):
        if logs["rounds_done"] == 4:  # epoch 1 done (its states came back with the round): delete the shards
            for res in resident.open_states():
                for info in res.infos:
                    if info.key.startswith("train-"):
                        shutil.rmtree(info.directory, ignore_errors=True)

    with caplog.at_level(logging.WARNING, logger="sparknet"):
        _, h = trainer.fit(X, y, epochs=2, batch_size=32, verbose=0,
                           callbacks=[LambdaCallback(on_round_end=lose)])
    assert any("partition(s) [0, 1] restored from checkpoint" in r.getMessage() for r in caplog.records), \
        [r.getMessage() for r in caplog.records]
    assert h.epoch == [0, 1]
    assert [c["job"] for c in h.checkpoints] == [False, False]   # the state came back with the rounds


def test_checkpoint_every_and_round_timeout_arguments():
    assert checkpoints.CheckpointEvery.parse("epoch") == checkpoints.CheckpointEvery("epochs", 1)
    assert checkpoints.CheckpointEvery.parse(10) == checkpoints.CheckpointEvery("rounds", 10)
    assert checkpoints.CheckpointEvery.parse("3 epochs") == checkpoints.CheckpointEvery("epochs", 3)
    assert checkpoints.CheckpointEvery.parse("90s") == checkpoints.CheckpointEvery("seconds", 90.0)
    for bad in (0, -1, True, "0 epochs", "often", 1.5, None):
        with pytest.raises(ValueError, match="checkpoint_every"):
            checkpoints.CheckpointEvery.parse(bad)
    for bad in (0, -3, float("nan"), float("inf"), "soon", True):
        with pytest.raises(ValueError, match="round_timeout"):
            timeouts.check_round_timeout(bad)
    floor, factor = timeouts.ROUND_TIMEOUT_FLOOR, timeouts.ROUND_TIMEOUT_FACTOR
    assert timeouts.job_timeout("auto", None) == floor
    assert timeouts.job_timeout("auto", 0.5) == floor
    assert timeouts.job_timeout("auto", 30.0) == factor * 30.0
    assert timeouts.job_timeout("auto", None, predicted=60.0) == factor * 60.0
    assert timeouts.job_timeout(5.0, 100.0) == 5.0 and timeouts.job_timeout(None, 100.0) is None
    model = Sequential([Dense(10, activation="softmax")])
    with pytest.raises(ValueError, match="checkpoint_keep"):
        DataParallelTrainer(model, checkpoint_dir="/tmp/x", checkpoint_keep=0)
    with pytest.raises(ValueError, match=r"resume=True\) needs"):
        DataParallelTrainer(model, spark=object()).fit(np.zeros((4, 3)), np.zeros(4), resume=True)


def _assert_jobs_end(spark, within: float = 30.0) -> None:
    """The cancelled fit's Spark jobs are all gone within ``within`` seconds."""
    left = wait_no_active_jobs(spark.sparkContext, timeout=within)
    assert not left, f"jobs still active {within:.0f} s after the fit ended: {left}"
