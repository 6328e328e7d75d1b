"""The set-up of a data-parallel fit: its recorded breakdown, and the reuse of resident
shards by a later fit on the same cached data (never on changed data)."""
from __future__ import annotations

import os
import subprocess
import sys

import numpy as np
import pytest

from helpers.frames import row_frame
from helpers.models import mlp
from sparknet import Dense, RMSprop, Sequential
from sparknet.cluster.data import sharding as data_mod
from sparknet.cluster.data_parallel.trainer import DataParallelTrainer


def _fit(spark, df, val=None, reuse=True, sync="average"):
    """A deterministic fit (fixed local steps): its model, history and Spark job count."""
    model = mlp(32)
    trainer = DataParallelTrainer(model, spark, num_partitions=2, sync=sync, local_steps=6,
                                  optimizer=RMSprop(lr=3e-3), seed=1)
    sc = spark.sparkContext
    group = f"test-setup-{os.urandom(4).hex()}"
    sc.setJobGroup(group, "test_setup")
    try:
        _, history = trainer.fit(df, epochs=2, batch_size=32, validation_data=val, verbose=0,
                                 reuse_data=reuse)
    finally:
        sc.setLocalProperty("spark.jobGroup.id", None)
    return model, history, len(sc.statusTracker().getJobIdsForGroup(group))


@pytest.fixture()
def no_kept_shards():
    DataParallelTrainer.release_shards()
    yield
    DataParallelTrainer.release_shards()


@pytest.mark.slow
def test_second_fit_on_the_same_cached_dataframe_reuses_the_shards(spark, digits, no_kept_shards):
    """No job builds the shards of the second fit (training and validation data), and
    it trains exactly as a fit on freshly built shards: a reused shard carries no
    optimizer state of the earlier fit."""
    X, y, Xt, yt = digits
    df, val = row_frame(spark, X, y, 2, cache=True), row_frame(spark, Xt, yt, 2, cache=True)
    m1, h1, jobs1 = _fit(spark, df, val)
    m2, h2, jobs2 = _fit(spark, df, val)
    assert not h1.reused_shards and h2.reused_shards
    assert list(h2.setup_breakdown)[0] == "reuse lookup"
    assert jobs2 == jobs1 - 2, f"{jobs1} jobs, then {jobs2}: the two shard-building jobs should be gone"
    m3, h3, _ = _fit(spark, df, val, reuse=False)
    assert not h3.reused_shards
    np.testing.assert_array_equal(m2.params, m1.params)
    np.testing.assert_array_equal(m3.params, m1.params)
    assert h2["val_accuracy"] == h1["val_accuracy"]
    # evaluating the same cached data reuses the shards too, and agrees with the driver
    assert DataParallelTrainer(m2, spark, num_partitions=2).evaluate(val)["accuracy"] == \
        pytest.approx(m2.evaluate(Xt, yt)["accuracy"], abs=1e-12)


@pytest.mark.slow
def test_changed_or_uncached_data_is_never_reused(spark, digits, no_kept_shards):
    """Different rows are a different cache: the shards are built anew and the result
    equals a fresh fit on those rows; after ``unpersist()`` nothing is reused either."""
    X, y, _, _ = digits
    df = row_frame(spark, X[:800], y[:800], 2, cache=True)
    _fit(spark, df)
    changed = row_frame(spark, X[400:1200], y[400:1200], 2, cache=True)
    m, h, _ = _fit(spark, changed)
    fresh, _, _ = _fit(spark, changed, reuse=False)
    assert not h.reused_shards
    np.testing.assert_array_equal(m.params, fresh.params)
    df.unpersist()
    df.cache().count()  # cached again: a new cache, maybe of changed source data
    _, h2, _ = _fit(spark, df)
    assert not h2.reused_shards
    # an uncached DataFrame is never kept: its source may change
    uncached = row_frame(spark, X[:300], y[:300], 2, cache=True).unpersist()
    _, h3, _ = _fit(spark, uncached)
    _, h4, _ = _fit(spark, uncached)
    assert not h3.reused_shards and not h4.reused_shards


@pytest.mark.slow
def test_release_shards_deletes_the_kept_files(spark, digits, no_kept_shards):
    X, y, _, _ = digits
    df = row_frame(spark, X[:400], y[:400], 2, cache=True)
    _fit(spark, df, sync="gradient")
    kept = data_mod.kept_shards()
    assert len(kept) == 1
    dirs = [i.directory for i in kept[0].resident.infos]
    assert all(os.path.isdir(d) for d in dirs)
    assert DataParallelTrainer.release_shards() == 1
    assert not any(os.path.exists(d) for d in dirs)
    _, h, _ = _fit(spark, df, sync="gradient")
    assert not h.reused_shards


def test_setup_breakdown_adds_up_to_setup_time(spark, digits, no_kept_shards):
    X, y, Xt, yt = digits
    df = row_frame(spark, X, y, 2, cache=True)
    for local_steps in ("auto", 6):
        model = mlp(32)
        trainer = DataParallelTrainer(model, spark, num_partitions=2, local_steps=local_steps,
                                      optimizer=RMSprop(lr=3e-3))
        _, h = trainer.fit(df, epochs=1, batch_size=32, validation_data=(Xt, yt), verbose=0)
        b = h.setup_breakdown
        assert all(v >= 0 for v in b.values())
        assert {"validation data", "calibration", "other"} <= set(b)
        assert sum(b.values()) == pytest.approx(h.setup_time, rel=1e-3, abs=1e-3)
        assert trainer.cost is not None and trainer.cost.t_fixed > 0  # measured by the rounds at the latest
    # a fresh build lists the steps of its shard job
    _, h, _ = _fit(spark, row_frame(spark, X[:500], y[:500], 2, cache=True))
    assert {"plan (driver)", "worker start, imports", "convert to numpy", "spill"} <= set(h.setup_breakdown)


def test_auto_round_sizing_of_a_per_step_sequence_classifier(spark, digits):
    """local_steps="auto" sizes the first rounds from a step timed on the driver, on random
    rows shaped as the fit's: per-step labels of a sequence output included."""
    from sparknet.layers import LSTM

    X, y, _, _ = digits
    Xs = X.reshape(-1, 8, 8)
    ys = np.repeat(y[:, None], 8, axis=1)  # every step labelled with the digit
    model = Sequential([LSTM(16, return_sequences=True), Dense(10, activation="softmax")], seed=0,
                       input_shape=(8, 8))
    trainer = DataParallelTrainer(model, spark, num_partitions=2, optimizer=RMSprop(lr=1e-2))
    _, h = trainer.fit(Xs, ys, epochs=3, batch_size=32, verbose=0)
    assert trainer.cost is not None and trainer.cost.t_step > 0
    assert h["loss"][-1] < h["loss"][0]


def _shm_names(prefix: str) -> set[str]:
    return {p for p in os.listdir("/dev/shm") if p.startswith(prefix)} if os.path.isdir("/dev/shm") else set()


def _resident_dirs():
    return _shm_names("sparknet-resident-")


def _training_data_dirs():
    """The shard folders of training and validation data (not another test's model blocks,
    whose clean-up may still be finishing on a loaded machine)."""
    return _shm_names("sparknet-resident-train-") | _shm_names("sparknet-resident-val-")


@pytest.mark.slow
def test_validation_data_loads_beside_the_training_data(spark, digits, no_kept_shards):
    """A built model's validation data loads in a second thread while the training data
    loads (its job in the caller's job group): the fit equals one whose model is built
    from the data, which loads its validation data after; a bad validation set, or a bad
    training set beside it, is refused naming the data that is wrong, with no shards left."""
    X, y, Xt, yt = digits
    df, dft = row_frame(spark, X, y, 2, cache=True), row_frame(spark, Xt, yt, 2, cache=True)
    sc = spark.sparkContext
    runs = []
    for shape in ((64,), None):
        model = Sequential([Dense(32, activation="relu"), Dense(10, activation="softmax")], seed=0,
                           input_shape=shape)
        trainer = DataParallelTrainer(model, spark, num_partitions=2, local_steps=6,
                                      optimizer=RMSprop(lr=3e-3), seed=1)
        group = f"test-setup-val-{os.urandom(4).hex()}"
        sc.setJobGroup(group, "test_setup")
        try:
            _, h = trainer.fit(df, epochs=2, batch_size=32, validation_data=dft, verbose=0, reuse_data=False)
        finally:
            sc.setLocalProperty("spark.jobGroup.id", None)
        runs.append((model.params.copy(), h.history["val_accuracy"], len(sc.statusTracker().getJobIdsForGroup(group))))
    (p_side, acc_side, jobs_side), (p_after, acc_after, jobs_after) = runs
    np.testing.assert_array_equal(p_side, p_after)
    assert acc_side == acc_after and acc_side[-1] > 0.8
    assert jobs_side == jobs_after

    before = _training_data_dirs()
    Xbad = Xt.copy()
    Xbad[3, 5] = np.nan
    bad = row_frame(spark, Xbad, yt, 2, cache=True)
    for train, val, what in ((df, bad, "validation data"), (bad, bad, "training data")):
        model = mlp(32)
        model.build((64,))
        trainer = DataParallelTrainer(model, spark, num_partitions=2, local_steps=6, optimizer=RMSprop(lr=3e-3))
        with pytest.raises(ValueError, match=f"^{what}: .*NaN or infinity"):
            trainer.fit(train, epochs=1, batch_size=32, validation_data=val, verbose=0, reuse_data=False)
    assert _training_data_dirs() <= before


@pytest.mark.slow
def test_executor_daemon_preloads_sparknet():
    """``get_spark`` makes the executors' Python daemon import sparknet before forking
    workers (``spark.python.daemon.module``): a task finds it loaded."""
    code = (
        "import sys\n"
        "from sparknet.cluster.engine.session import get_spark\n"
        "spark = get_spark('local[1]', conf={'spark.ui.enabled': 'false'})\n"
        "seen = spark.sparkContext.parallelize([0], 1).map(\n"
        "    lambda _: __import__('sys').modules.get('sparknet.cluster.data_parallel.round_task') is not None).collect()\n"
        "print('PRELOADED', seen)\n"
        "spark.stop()\n")
    env = dict(os.environ, PYSPARK_PYTHON=sys.executable, PYSPARK_DRIVER_PYTHON=sys.executable)
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300, env=env)
    assert "PRELOADED [True]" in out.stdout, out.stdout[-2000:] + out.stderr[-2000:]


def test_session_warm_up_builds_shards_and_leaves_nothing_behind(spark):
    """The session's background warm-up ends with a small shard build through a fit's
    DataFrame path (``warm_shard_path``): its jobs succeed, and it leaves no resident
    folder, rows file, persisted RDD or kept shards behind."""
    from sparknet.cluster.engine.session import warm_shard_path

    sc = spark.sparkContext
    dirs, rows, rdds = _resident_dirs(), _shm_names("sparknet-rows-"), set(sc._jsc.getPersistentRDDs().keys())
    kept = len(data_mod.kept_shards())
    group = f"test-warm-up-{os.urandom(4).hex()}"
    sc.setJobGroup(group, "test_setup warm-up")
    try:
        warm_shard_path(spark, 2)
    finally:
        sc.setLocalProperty("spark.jobGroup.id", None)
    jobs = sc.statusTracker().getJobIdsForGroup(group)
    assert jobs, "the warm-up ran no Spark job"
    assert all(sc.statusTracker().getJobInfo(j).status == "SUCCEEDED" for j in jobs)
    assert _resident_dirs() <= dirs
    assert _shm_names("sparknet-rows-") <= rows
    assert set(sc._jsc.getPersistentRDDs().keys()) <= rdds
    assert len(data_mod.kept_shards()) == kept
    with pytest.raises(ValueError, match="tasks must be a positive integer, got 0"):
        warm_shard_path(spark, 0)


@pytest.mark.slow
def test_shards_kept_from_a_stopped_session_are_released_by_the_next_one(tmp_path, standalone_cluster):
    """Shards kept for reuse by a session that was then stopped are deleted (this host's
    files) when a new session's fit looks for reusable shards, without asking the stopped
    context for its executors (the first session on a standalone cluster, where it would;
    the next one local, which is quicker to start)."""
    code = (
        "import os\n"
        "import numpy as np\n"
        "from pyspark.ml.linalg import Vectors\n"
        "from pyspark.sql import SparkSession\n"
        "from sparknet.cluster.data.sharding import kept_shards, shard_data\n"
        "def session(master):\n"
        "    return (SparkSession.builder.master(master).config('spark.ui.enabled', 'false')\n"
        "            .config('spark.executor.memory', '1g').getOrCreate())\n"
        "def frame(spark, seed):\n"
        "    r = np.random.default_rng(seed)\n"
        "    df = spark.createDataFrame([(Vectors.dense(r.standard_normal(4)), float(i % 2)) for i in range(40)],\n"
        "                               ['features', 'label']).repartition(2).cache()\n"
        "    df.count()\n"
        "    return df\n"
        "def dirs():\n"
        "    return {p for p in os.listdir('/dev/shm') if p.startswith('sparknet-resident-')}\n"
        "spark = session(os.environ['TEST_MASTER'])\n"
        "d = shard_data(frame(spark, 0), sc=spark.sparkContext, num_partitions=None, reuse=True)\n"
        "d.close()  # given back: kept for reuse\n"
        "kept = {p for p in dirs() if d.resident.key in p}\n"
        "print('KEPT', len(kept_shards()), len(kept))\n"
        "spark.stop()\n"
        "spark = session('local[1]')\n"
        "d2 = shard_data(frame(spark, 1), sc=spark.sparkContext, num_partitions=None, reuse=True)\n"
        "print('AFTER', len(kept_shards()), len(kept & dirs()), d2.total)\n"
        "d2.close()\n"
        "spark.stop()\n")
    env = dict(os.environ, PYSPARK_PYTHON=sys.executable, PYSPARK_DRIVER_PYTHON=sys.executable,
               SPARK_LOCAL_IP="127.0.0.1", TEST_MASTER=standalone_cluster.url)
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300, env=env,
                         cwd=tmp_path)
    assert out.returncode == 0, out.stdout[-2000:] + out.stderr[-3000:]
    kept = next(line for line in out.stdout.splitlines() if line.startswith("KEPT")).split()
    after = next(line for line in out.stdout.splitlines() if line.startswith("AFTER")).split()
    assert kept[1] == "1" and int(kept[2]) >= 1, out.stdout   # one set kept, its files on this host
    assert after[1:] == ["1", "0", "40"], out.stdout
