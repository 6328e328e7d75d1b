"""ModelParallel checkpoints and recovery: CheckpointStore folders pruned to keep, lost blocks
restored with the steps since the checkpoint replayed, resume after the driver was killed,
divergence stopped with the last finite weights."""
from __future__ import annotations

import json
import logging
import os
import shutil
import signal
import subprocess
import sys
import time
from dataclasses import dataclass

import numpy as np
import pytest

from helpers.models import mp_layers
from sparknet import SGD, Dense, RMSprop
from sparknet.checkpoint import CheckpointStore
from sparknet.cluster.model_parallel import ModelParallel
from sparknet.cluster.model_parallel.block_partition import BlockPlan
from sparknet.cluster.model_parallel.jobs import BlockJob
from sparknet.errors import CheckpointError, RoundTimeout, TrainingDiverged

HERE = os.path.dirname(os.path.abspath(__file__))
LOG = "sparknet.cluster.model_parallel"


def make(spark=None, ckpt=None, name="rec", seed=2, **kw):
    return ModelParallel(mp_layers(), BlockPlan({0: 2, 1: 2}, pair=True), (64,), spark=spark,
                         dtype="float64", seed=seed,
                         optimizer=RMSprop(lr=2e-3), checkpoint_dir=None if ckpt is None else str(ckpt), name=name,
                         **kw)


def weights(mp):
    return mp.to_sequential().params


def lose_blocks_at(mp, step):
    """Make the blocks' resident state vanish inside step ``step`` (before its next job):
    in-process slots are emptied, on Spark the executors' files are deleted."""
    run, done = mp.backend.run, []

    def run_losing(job, data=None):
        if mp.t == step and not done:
            done.append(step)
            if hasattr(mp.backend, "stores"):
                for store in mp.backend.stores:
                    store.clear()
            else:
                for info in mp.backend.res.infos:
                    shutil.rmtree(info.directory)
        return run(job, data)
    mp.backend.run = run_losing
    return done


# ------------------------------------------------------------------ checkpoint folders
def test_fit_checkpoints_are_verified_store_folders_pruned_to_keep(digits_xy, tmp_path, caplog):
    X, y = digits_xy
    X, y = X[:300], y[:300]
    mp = make(ckpt=tmp_path / "ck")
    hist = mp.fit(X, y, epochs=2, batch_size=50, checkpoint_every=4)      # 12 steps: ckpts at 0, 4, 8, 12
    store = CheckpointStore(tmp_path / "ck")
    assert [c.step for c in store.checkpoints()] == [4, 8, 12]
    assert sorted(os.listdir(tmp_path / "ck")) == [f"ckpt-{s:012d}" for s in (4, 8, 12)]
    newest = store.latest()
    assert mp.latest_checkpoint() == newest.path and store.verify(newest) is None
    assert {"layer000_block000.npz", "layer000_block001.npz", "layer001_block000.npz",
            "layer001_block001.npz"} <= set(newest.files)
    assert any(f.startswith("driver.") and f.endswith(".npy") for f in newest.files)
    fit = newest.meta["fit"]
    assert (fit["epoch"], fit["batch"], fit["done"]) == (1, 6, 12) and fit["loss"] == hist["loss"][:1]
    assert newest.meta["model"]["t"] == 12
    # a checkpoint loads as a model with the same outputs
    back = ModelParallel.load(newest.path)
    np.testing.assert_array_equal(back.predict_output(X[:20]), mp.predict_output(X[:20]))
    assert back.t == 12
    # a damaged newest checkpoint is skipped, with a warning
    with open(os.path.join(newest.path, "layer000_block001.npz"), "r+b") as fh:
        fh.seek(200)
        fh.write(b"\0\1\2\3")
    with caplog.at_level(logging.WARNING):
        assert mp.latest_checkpoint() == store.get(8).path
    assert "damaged" in caplog.text
    with pytest.raises(CheckpointError, match="damaged"):
        mp.restore(newest.path)


def test_checkpoint_arguments_are_checked(digits_xy, tmp_path):
    X, y = digits_xy
    with pytest.raises(ValueError, match="checkpoint_dir=.*Hadoop URI"):
        make(ckpt="hdfs://namenode/ckpt")
    with pytest.raises(ValueError, match="checkpoint_keep"):
        make(ckpt=tmp_path / "k", checkpoint_keep=0)
    mp = make()
    with pytest.raises(ValueError, match="checkpoint_every needs a checkpoint_dir"):
        mp.fit(X, y, checkpoint_every=5)
    with pytest.raises(ValueError, match="resume=True needs a checkpoint_dir"):
        mp.fit(X, y, resume=True)
    with pytest.raises(ValueError, match="checkpoint_every must be a non-negative int"):
        make(ckpt=tmp_path / "k").fit(X, y, checkpoint_every=-1)


def test_resume_refuses_other_data_or_network_and_starts_fresh_without_checkpoint(digits_xy, tmp_path, caplog):
    X, y = digits_xy
    X, y = X[:256], y[:256]
    with caplog.at_level(logging.INFO, logger=LOG):
        fresh = make(ckpt=tmp_path / "new")
        hist = fresh.fit(X, y, epochs=1, batch_size=64, checkpoint_every=2, resume=True)
    assert "no complete checkpoint" in caplog.text
    plain = make()
    assert plain.fit(X, y, epochs=1, batch_size=64)["loss"] == hist["loss"]
    np.testing.assert_array_equal(weights(plain), weights(fresh))
    with pytest.raises(ValueError, match="batch_size=64.*batch_size=32"):
        make(ckpt=tmp_path / "new").fit(X, y, epochs=2, batch_size=32, resume=True)
    with pytest.raises(ValueError, match="the data"):
        make(ckpt=tmp_path / "new").fit(X, (y + 1) % 10, epochs=2, batch_size=64, resume=True)
    other = ModelParallel([Dense(40, activation="tanh"), Dense(24, activation="tanh"), Dense(10, activation="softmax")],
                          BlockPlan({0: 2, 1: 2}, pair=True), (64,), dtype="float64", seed=2,
                          optimizer=RMSprop(lr=2e-3), checkpoint_dir=str(tmp_path / "new"))
    with pytest.raises(CheckpointError, match="another network"):
        other.fit(X, y, epochs=2, batch_size=64, resume=True)


# ---------------------------------------------------------- lost blocks: exact replay
@pytest.mark.parametrize("where", ["in-process", "in-process-2-replicas",
                                   pytest.param("spark", marks=pytest.mark.slow)])
def test_lost_blocks_mid_fit_replay_the_steps_since_the_checkpoint(request, digits_xy, tmp_path, caplog, where):
    """Block state lost inside step 8 of 16 (checkpoints every 5): the fit restores step 5,
    replays 6..8 and ends with exactly the weights, steps and history of an undisturbed fit."""
    spark = request.getfixturevalue("spark") if where == "spark" else None
    X, y = digits_xy
    X, y = X[:256], y[:256]
    replicas = 2 if "replicas" in where else 1
    ref = make(spark, name="rec-ref", replicas=replicas)
    mp = make(spark, ckpt=tmp_path / "ck", name="rec-lost", replicas=replicas)
    try:
        want = ref.fit(X, y, epochs=2, batch_size=32)
        lost = lose_blocks_at(mp, 8)
        with caplog.at_level(logging.WARNING, logger=LOG):
            got = mp.fit(X, y, epochs=2, batch_size=32, checkpoint_every=5)
        assert lost == [8] and mp.restores == 1
        assert mp.t == ref.t == 16 and len(got["step_time"]) == 16
        np.testing.assert_array_equal(weights(mp), weights(ref))
        assert got["loss"] == want["loss"] and got["accuracy"] == want["accuracy"]
        lines = [r.getMessage() for r in caplog.records if "block state lost" in r.getMessage()]
        assert len(lines) == 1 and "restored checkpoint" in lines[0] and "(step 5)" in lines[0]
        assert "replaying its 2 step(s)" in lines[0]
        assert [c.step for c in CheckpointStore(tmp_path / "ck").checkpoints()] == [5, 10, 15]
    finally:
        ref.close()
        mp.close()


def test_lost_blocks_with_a_checkpoint_of_another_fit_stop_clearly(digits_xy, tmp_path):
    from sparknet.cluster.model_parallel import BlockStateLost

    X, y = digits_xy
    mp = make(ckpt=tmp_path / "ck")
    mp.train_on_batch(X[:32], y[:32])
    mp.checkpoint()
    lose_blocks_at(mp, 3)
    with pytest.raises(BlockStateLost, match="not written by this fit"):
        mp.fit(X[:320], y[:320], epochs=1, batch_size=32)


# ------------------------------------------------------------------ the driver killed
@pytest.mark.slow
def test_resume_after_the_driver_is_killed_is_bit_identical(spark, digits_xy, tmp_path):
    """A driver SIGKILLed in the middle of step 7 (local[2], K=2, float64, checkpoints every
    2); another process resumes from step 6, across the end of the first epoch: the same 16
    steps, weights and history as an uninterrupted fit."""
    from helpers import mp_resume_job as job

    ckpt = tmp_path / "ck"
    env = dict(os.environ, PYSPARK_PYTHON=sys.executable, OPENBLAS_NUM_THREADS="1")
    proc = subprocess.Popen([sys.executable, job.__file__, str(ckpt), "7"],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env,
                            start_new_session=True)
    try:
        out, err = proc.communicate(timeout=240)
    finally:
        try:
            os.killpg(proc.pid, signal.SIGKILL)      # the killed driver's JVM, if still there
        except ProcessLookupError:
            pass
    assert proc.returncode == -signal.SIGKILL and "KILLING at step 7" in out, err[-3000:]
    assert [c.step for c in CheckpointStore(ckpt).checkpoints()] == [2, 4, 6]
    X, y = digits_xy
    mp = job.make(spark, str(ckpt), "mpresume")
    ref = job.make(spark, None, "mpresume-ref")
    try:
        got = job.fit(mp, X, y, resume=True)
        want = ref.fit(X[:job.ROWS], y[:job.ROWS], epochs=job.EPOCHS, batch_size=job.BATCH)
        assert mp.t == ref.t == 16 and len(got["step_time"]) == 16
        np.testing.assert_array_equal(weights(mp), weights(ref))
        assert got["loss"] == want["loss"] and got["accuracy"] == want["accuracy"]
    finally:
        mp.close()
        ref.close()


# ----------------------------------------------------------------------- divergence
@pytest.mark.parametrize("where", ["in-process", pytest.param("spark", marks=pytest.mark.slow)])
def test_divergence_stops_with_the_last_finite_weights(request, digits_xy, tmp_path, where):
    """SGD at lr 1 on a regression overflows: TrainingDiverged names the step, the model holds
    exactly the weights of the step before, and no checkpoint of the diverged state exists."""
    spark = request.getfixturevalue("spark") if where == "spark" else None
    X, _ = digits_xy
    X = X.astype(np.float32)
    y = np.arange(X.shape[0], dtype=np.float32).reshape(-1, 1) % 10

    def net(ckpt=None):
        return ModelParallel([Dense(32, activation="tanh"), Dense(1)], BlockPlan({0: 2, 1: 2}, pair=True), (64,),
                             spark=spark, dtype="float32", seed=1, optimizer=SGD(lr=1.0), loss="mse",
                             checkpoint_dir=ckpt, name="diverge")
    mp = net(str(tmp_path / "ck"))
    try:
        with pytest.raises(TrainingDiverged, match="lower the learning rate") as info:
            mp.fit(X, y, epochs=5, batch_size=64, checkpoint_every=4)
        exc = info.value
        assert isinstance(exc, FloatingPointError) and exc.step is not None and exc.epoch == 1
        assert f"step {exc.step}" in str(exc)
        assert mp.t == exc.step - 1 and np.isfinite(weights(mp)).all()
        steps = [c.step for c in CheckpointStore(tmp_path / "ck").checkpoints()]
        assert steps and max(steps) < exc.step
        assert CheckpointStore(tmp_path / "ck").latest().step == max(steps)
        before = net()
        try:
            before.fit(X, y, epochs=5, batch_size=64, max_steps=exc.step - 1)
            np.testing.assert_array_equal(weights(mp), weights(before))
        finally:
            before.close()
    finally:
        mp.close()


def test_non_finite_weights_are_never_saved(digits_xy, tmp_path):
    X, y = digits_xy
    mp = make(ckpt=tmp_path / "ck")
    mp.train_on_batch(X[:32], y[:32])
    mp.save(str(tmp_path / "good"))
    mp.backend.stores[1]["0.kernel"][0, 0] = np.nan
    with pytest.raises(TrainingDiverged, match="layer 0 block 1 kernel"):
        mp.checkpoint()
    with pytest.raises(TrainingDiverged, match="not finite"):
        mp.save(str(tmp_path / "good"))
    assert CheckpointStore(tmp_path / "ck").checkpoints() == []
    assert not [f for f in os.listdir(tmp_path / "ck") if not f.startswith(".")]
    assert sorted(os.listdir(tmp_path)) == ["ck", "good"]       # no staging folder left
    assert np.isfinite(ModelParallel.load(str(tmp_path / "good")).to_sequential().params).all()



# ------------------------------------------------------ an executor lost (standalone)
def _worker_of_executor(cluster, executor_id):
    for i in list(cluster.workers):
        for pid in cluster.executor_pids(i):
            with open(f"/proc/{pid}/cmdline", "rb") as fh:
                args = fh.read().decode(errors="replace").split("\0")
            if "--executor-id" in args and args[args.index("--executor-id") + 1] == str(executor_id):
                return i
    raise AssertionError(f"no worker runs executor {executor_id}")


@pytest.fixture(scope="module", autouse=True)
def _executor_loss_job(request, tmp_path_factory):
    """The executor-loss test's driver program, started as the module's first test starts
    (when that test is selected and Java is there): it starts Spark on the standalone
    cluster and fits up to its pause while the module's other tests run here (``None``
    otherwise)."""
    from helpers.early_job import start_for

    yield from start_for(request, "test_executor_killed_mid_fit_restores_blocks_and_runs_the_exact_steps",
                         "mp_executor_loss_job.py", [str(tmp_path_factory.mktemp("mploss") / "ck"), "12"],
                         env={"OPENBLAS_NUM_THREADS": "1"}, stdin=True)


@pytest.mark.standalone
@pytest.mark.slow
def test_executor_killed_mid_fit_restores_blocks_and_runs_the_exact_steps(standalone_cluster, _executor_loss_job):
    """Master + 2 one-core workers on 127.0.0.1; inside step 12 of 16 (checkpoints every 5)
    the worker holding block 0 and its executor are killed with SIGKILL: the fit restores
    step 10 onto the surviving executor, replays 11..12 and ends with the weights of an
    undisturbed fit, saying in one log line what was lost and what was restored."""
    cluster, job = standalone_cluster, _executor_loss_job
    proc = job.proc
    try:
        line = proc.stdout.readline()
        while line and not line.startswith("PAUSED"):
            line = proc.stdout.readline()
        assert line.startswith("PAUSED"), proc.stderr.read()[-4000:]
        killed = cluster.kill_worker(_worker_of_executor(cluster, line.split()[1]))
        assert killed
        proc.stdin.write("go\n")
        proc.stdin.flush()
        stdout, stderr = job.communicate(timeout=180)
    finally:
        job.kill()
    results = [ln for ln in stdout.splitlines() if ln.startswith("RESULT ")]
    assert results, f"job failed ({proc.returncode}):\n{stderr[-4000:]}"
    out = json.loads(results[-1][len("RESULT "):])
    print("executor loss:", {k: v for k, v in out.items() if k != "lines"})
    assert "error" not in out, out.get("error")
    assert len(set(out["homes"].values())) == 2, "the two blocks must start on two executors"
    assert out["restores"] == 1 and out["t"] == out["ref_t"] == 16 and out["steps"] == 16
    assert out["max_rel"] <= 1e-12
    assert out["accuracy"] == pytest.approx(out["ref_accuracy"], abs=1e-12)
    lost = [ln for ln in out["lines"] if "block state lost" in ln]
    assert len(lost) == 1, out["lines"]
    assert "step 12" in lost[0] and "(step 10)" in lost[0] and "replaying its 1 step(s)" in lost[0]
    print("log:", lost[0])


# ------------------------------------------------------------------------ a hung job
@dataclass(frozen=True)
class _Hang(BlockJob):
    """A block job whose slot 0 never returns (well: not within the test)."""

    def run(self, store, slot, data):
        if slot == 0:
            time.sleep(120)
        return slot


@pytest.mark.slow
def test_a_hung_block_job_is_cancelled_after_job_timeout(spark, digits_xy):
    from pyspark import cloudpickle

    cloudpickle.register_pickle_by_value(sys.modules[__name__])
    X, y = digits_xy
    mp = make(spark, name="rec-hang", job_timeout=4)
    try:
        mp.train_on_batch(X[:32], y[:32])
        t0 = time.perf_counter()
        with pytest.raises(RoundTimeout, match="ran longer than 4 s and was cancelled"):
            mp.backend.run(_Hang(mp.layout, tuple(mp.blocked)))
        assert time.perf_counter() - t0 < 40
        mp.train_on_batch(X[32:64], y[32:64])          # the model goes on
        assert mp.t == 2
    finally:
        mp.close()
        cloudpickle.unregister_pickle_by_value(sys.modules[__name__])
    with pytest.raises(ValueError, match="job_timeout"):
        make(job_timeout=-1)
