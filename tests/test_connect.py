"""sparknet from a Spark Connect client (the ``connect_spark`` fixture: a Connect server with
master local[2] on 127.0.0.1, no SparkContext on the client), against the Classic session
(``spark``) of the same run: the same weights in float64 with ``sync="gradient"`` (the
parameters in the query or as broadcast pieces), the same accuracy with ``sync="average"``
and ``mode="async"``, an async straggler and Ctrl-C, ModelParallel equal to one process,
DataFrame input, the same errors, the placement of the shards over many jobs, and rounds
past their timeout interrupted."""
from __future__ import annotations

import os
import time

import numpy as np
import pytest

from helpers.models import mlp
from sparknet import Dense, RMSprop, Sequential
from sparknet.cluster.data_parallel.trainer import DataParallelTrainer
from sparknet.cluster.engine.base import engine_for, is_connect
from sparknet.cluster.engine.connect import ConnectResident
from sparknet.errors import RoundTimeout

# every test here talks to a Spark Connect server this module starts (as a standalone cluster)
pytestmark = pytest.mark.slow


def _folders():
    from sparknet.cluster.resident import spill
    return {n for n in os.listdir(spill.SHM) if n.startswith(spill.PREFIX)} if os.path.isdir(spill.SHM) else set()


@pytest.fixture
def nothing_left():
    """Asserts that the test leaves no resident folder in /dev/shm."""
    before = _folders()
    yield
    assert not _folders() - before, f"left in /dev/shm: {sorted(_folders() - before)}"


def test_the_session_is_a_connect_one_with_no_spark_context(connect_spark):
    engine = engine_for(connect_spark)
    assert is_connect(connect_spark) and engine.kind == "connect" and engine_for(connect_spark) is engine
    assert engine.default_parallelism() == 2  # the server's local[2], asked from a process with a Classic session
    with pytest.raises(AttributeError, match="sparkContext"):
        connect_spark.sparkContext  # noqa: B018 - what Connect refuses, and sparknet never asks for


def test_saves_and_scoring_ask_a_connect_engine_no_filesystem_and_ship_in_the_udf(connect_spark, monkeypatch):
    """A Connect client reaches no Hadoop FileSystem (a save is Spark's own, not the atomic
    rename), and a scoring UDF carries its value itself: up to the closure limit, refused past it."""
    from sparknet.cluster.engine import connect as engine_connect

    engine = engine_for(connect_spark, fit=False)
    assert engine is engine_for(connect_spark) and engine.filesystem("/tmp/anything") is None
    vec = np.zeros(128)                                          # 1024 bytes
    shipped = engine.ship_to_udf(vec)
    assert isinstance(shipped, engine_connect.InClosure) and shipped.value is vec
    monkeypatch.setattr(engine_connect, "MAX_CLOSURE_BYTES", 1000)
    with pytest.raises(ValueError, match="Spark Connect query carries"):
        engine.ship_to_udf(vec)                                  # no InRows: a UDF is not joined


@pytest.mark.parametrize("carry", ["closure", "rows"])
@pytest.mark.parametrize("rows,epochs", [(600, 2)])
def test_gradient_sync_weights_equal_classic_float64(spark, connect_spark, digits, rows, epochs, carry,
                                                     monkeypatch, nothing_left):
    """The same fit (numpy input, float64, sync='gradient') under Classic and Connect ends
    with the same weights to 1e-12: the same split, the same steps, the same sums.  With
    ``carry="rows"`` the parameters are past the (lowered) closure limit and travel as
    broadcast pieces joined to the anchor (several 16 KiB pieces a round)."""
    from sparknet.cluster.engine import connect as engine_connect

    if carry == "rows":
        monkeypatch.setattr(engine_connect, "MAX_CLOSURE_BYTES", 1024)
        monkeypatch.setattr(engine_connect, "CHUNK_BYTES", 16 << 10)
        net = mlp(32, input_shape=(64,), dtype="float64", seed=1)
        shipped = engine_for(connect_spark).ship(net.params)
        assert isinstance(shipped, engine_connect.InRows) and shipped.frame.count() > 1
        shipped.destroy()
    X, y, _, _ = digits
    X, y = X[:rows].astype(np.float64), y[:rows]
    out = {}
    for name, session in (("classic", spark), ("connect", connect_spark)):
        model = mlp(32, input_shape=(64,), dtype="float64", seed=1)
        trainer = DataParallelTrainer(model, session, num_partitions=3, sync="gradient",
                                      optimizer=RMSprop(lr=1e-2), seed=5)
        _, history = trainer.fit(X, y, epochs=epochs, batch_size=100, verbose=0)
        out[name] = (model.params.copy(), history["loss"])
    start = mlp(32, input_shape=(64,), dtype="float64", seed=1).params
    ref, got = out["classic"][0], out["connect"][0]
    rel = np.linalg.norm(got - ref) / np.linalg.norm(ref)
    moved = np.linalg.norm(ref - start) / np.linalg.norm(start)
    print(f"Connect vs Classic: relative difference {rel:.3e}, moved {moved:.3f}; "
          f"losses {out['classic'][1]} / {out['connect'][1]}")
    assert moved > 0.01, "training did not move the parameters"
    assert rel <= 1e-12, f"Connect and Classic weights differ: {rel:.3e}"


def test_average_sync_reaches_classic_accuracy_on_digits(spark, connect_spark, digits, nothing_left):
    """sync='average' (local steps, averaged) on digits reaches the Classic run's test
    accuracy within 0.3 points, with DataFrame input under Connect."""
    from pyspark.ml.linalg import Vectors

    X, y, Xt, yt = digits
    acc = {}
    for name, session in (("classic", spark), ("connect", connect_spark)):
        model = mlp(32, input_shape=(64,), seed=3)
        df = session.createDataFrame([(Vectors.dense(x.astype(float)), float(t)) for x, t in zip(X, y)],
                                     ["features", "label"]).repartition(2)
        trainer = DataParallelTrainer(model, session, sync="average", local_steps=8,
                                      optimizer=RMSprop(lr=3e-3), seed=2)
        _, history = trainer.fit(df, epochs=8, batch_size=32, verbose=0)
        acc[name] = float((model.predict(Xt.astype(np.float32)) == yt).mean())
        assert history["loss"][-1] < history["loss"][0]
    print(f"test accuracy: Classic {acc['classic']:.4f}, Connect {acc['connect']:.4f}")
    assert acc["connect"] >= 0.93
    assert abs(acc["connect"] - acc["classic"]) <= 0.003 + 1e-9, acc


def test_bad_dataframe_input_names_the_column_under_connect(connect_spark, nothing_left):
    from pyspark.ml.linalg import Vectors

    df = connect_spark.createDataFrame([(Vectors.dense([1.0, 2.0]), 0.0), (Vectors.dense([1.0, float("nan")]), 1.0)],
                                       ["features", "label"])
    trainer = DataParallelTrainer(Sequential([Dense(2, activation="softmax")], dtype="float32"), connect_spark)
    with pytest.raises(ValueError, match=r"features column 'features' contains nan \(NaN or infinity\) "
                                         r"at partition \d+, row \d+, element 1"):
        trainer.fit(df, epochs=1, batch_size=2, verbose=0)
    with pytest.raises(ValueError, match="features column 'pixels'"):
        trainer.fit(df, features_col="pixels", epochs=1, verbose=0)


def test_a_null_vector_row_is_refused_by_the_estimator_under_connect(connect_spark, nothing_left):
    """A null Vector in the features is refused before training, with its column, its row and
    a hint to drop the null rows (Spark's vector_to_array never sees it)."""
    from pyspark.ml.linalg import Vectors, VectorUDT
    from pyspark.sql import types as T

    from sparknet.ml import SparkNetClassifier

    schema = T.StructType([T.StructField("features", VectorUDT()), T.StructField("label", T.DoubleType())])
    df = connect_spark.createDataFrame([(Vectors.dense([1.0, 2.0]), 0.0), (None, 1.0),
                                        (Vectors.dense([3.0, 4.0]), 1.0)], schema)
    est = SparkNetClassifier(network=Sequential([Dense(2, activation="softmax")]), epochs=1, verbose=0)
    with pytest.raises(ValueError, match=r"^training data: features column 'features' has a null vector "
                                         r"\(partition \d+, row \d+\); drop or fill the null rows first, "
                                         r"e\.g\. df\.na\.drop\(\)$"):
        est.fit(df)


@pytest.mark.slow
def test_async_reaches_classic_accuracy_on_digits(spark, connect_spark, digits, nothing_left):
    """mode='async' under Connect (one query per partition, from its own client thread)
    spends the same budget of samples and reaches Classic's test accuracy within the run-
    to-run spread of asynchronous training: arrival order differs per run, and 17 runs of this
    fit on two machines ended between 93.8% and 95.1% (Classic and Connect alike), so the two
    single runs compared here may differ by 1.3 points with nothing wrong; 2 points allowed."""
    X, y, Xt, yt = digits
    epochs, acc = 8, {}
    for name, session in (("classic", spark), ("connect", connect_spark)):
        model = Sequential([Dense(64, activation="relu"), Dense(10, activation="softmax")], seed=0)
        trainer = DataParallelTrainer(model, session, num_partitions=2, mode="async", local_steps=5,
                                      optimizer=RMSprop(lr=2e-3))
        _, h = trainer.fit(X, y, epochs=epochs, batch_size=32, verbose=0)
        acc[name] = float(model.evaluate(Xt, yt)["accuracy"])
        chunk = -(-len(y) // (2 * h["rounds_per_pass"][0]))
        assert 0 <= sum(h["samples"]) - epochs * len(y) <= 2 * chunk
        assert {u["partition"] for u in h.updates} == {0, 1}
    print(f"async test accuracy: classic {acc['classic']:.4f}, connect {acc['connect']:.4f}")
    assert acc["classic"] > 0.92 and acc["connect"] > 0.92
    assert acc["connect"] >= acc["classic"] - 0.02


def test_async_under_connect_does_not_wait_for_a_straggler_and_stops_on_ctrl_c(connect_spark, digits,
                                                                               nothing_left):
    """Partition 1 slowed by 1 s a round: partition 0's queries run meanwhile and apply
    several times as many deltas (at 0.5 s a round, a 2-core machine whose Connect rounds
    took ~0.25 s gave 23 against 9, under the 3x asked); a KeyboardInterrupt from the update callback returns
    the last applied model while partition 1's query sleeps for minutes, and interrupts
    it (the next query runs at once)."""
    from sparknet.cluster.testing import inject_faults

    X, y, _, _ = digits
    model = mlp(32, input_shape=(64,), seed=1)
    trainer = DataParallelTrainer(model, connect_spark, num_partitions=2, mode="async", local_steps=3)
    with inject_faults(delay={1: 1.0}):
        _, h = trainer.fit(X, y, epochs=2, batch_size=32, verbose=0)
    per = [sum(1 for u in h.updates if u["partition"] == p) for p in (0, 1)]
    print(f"updates per partition with partition 1 slowed: {per}")
    assert per[1] >= 1 and per[0] >= 3 * per[1]

    seen, snapshots = {}, {}

    def on_update(info):
        snapshots[info["update"]] = model.params.copy()
        if info["applied"] and info["update"] == 3 and "t" not in seen:
            seen["t"] = time.perf_counter()
            raise KeyboardInterrupt

    trainer = DataParallelTrainer(model, connect_spark, num_partitions=2, mode="async", local_steps=3,
                                  on_update=on_update)
    with inject_faults(delay={1: 300.0}):
        _, h = trainer.fit(X, y, epochs=5, batch_size=32, verbose=0)
    assert time.perf_counter() - seen["t"] < 30, "the interrupt waited for the straggler"
    last = h.updates[-1]["update"]
    np.testing.assert_array_equal(model.params, snapshots[last])
    assert h["interrupted"] == [1.0] and all(u["partition"] == 0 for u in h.updates)
    t0 = time.perf_counter()
    assert sorted(r[0] for r in connect_spark.range(0, 2, 1, numPartitions=2).collect()) == [0, 1]
    assert time.perf_counter() - t0 < 30, "the straggler's query still held a core"


def test_shards_stay_on_their_host_and_in_the_workers_over_30_jobs(connect_spark, nothing_left):
    """Over 36 jobs every partition's task finds its shard on the host that built it, in
    the store of the Python worker it runs in (after at most one attach from the host's
    files per worker), and reads the same bytes."""
    df = connect_spark.range(0, 2000, 1, numPartitions=2).selectExpr("array(cast(id as float)) as x")

    def build(index, batches):
        x = np.concatenate([np.asarray(b.column(0).to_pylist(), np.float32) for b in batches])
        return {"x": x}, {"rows": len(x)}

    def where(index, shard):  # (defined here: the server's workers cannot import this module)
        from sparknet.cluster.resident import shards
        held = shards.store_entries().get((shard.info.key, index))
        stamp = held.stamp if held is not None else None
        return index, os.getpid(), shard.info.host, stamp == shard.info.stamp, float(shard.arrays["x"].sum())

    with ConnectResident(df, build, name="placement") as res:
        assert res.num_partitions == 2
        hosts = {i.index: i.host for i in res.infos}
        sums = None
        rows, t0 = [], time.perf_counter()
        for _ in range(36):
            rows.append(res.map(where))
        seconds = (time.perf_counter() - t0) / 36
    same_host = sum(all(r[2] == hosts[r[0]] for r in job) for job in rows)
    sums = {r[0]: r[4] for r in rows[0]}
    same_bytes = sum(all(r[4] == sums[r[0]] for r in job) for job in rows)
    workers = {r[1] for job in rows for r in job}
    in_store = sum(all(r[3] for r in job) for job in rows[len(workers):])
    print(f"placement: {same_host}/36 jobs on the building host, {in_store}/{36 - len(workers)} found "
          f"in the worker's store after the first attach, {len(workers)} Python workers, {seconds * 1000:.0f} ms/job")
    assert same_host == 36 and same_bytes == 36
    assert in_store == 36 - len(workers)


def test_a_job_past_its_timeout_is_interrupted_and_the_next_runs(connect_spark, nothing_left):
    df = connect_spark.range(0, 10, 1, numPartitions=2).selectExpr("array(cast(id as float)) as x")

    def build(index, batches):
        return {"x": np.concatenate([np.asarray(b.column(0).to_pylist(), np.float32) for b in batches])}

    def sleepy(index, shard):
        time.sleep(60)
        return [index]

    with ConnectResident(df, build, name="timeout") as res:
        t0 = time.perf_counter()
        with pytest.raises(RoundTimeout, match="ran longer than 3 s"):
            res.run_action(lambda: res.mapPartitions(sleepy).collect(), timeout=3.0)
        took = time.perf_counter() - t0
        assert took < 40, f"the interrupted job took {took:.0f} s"
        assert sorted(res.map(lambda i, s: i)) == [0, 1]


def test_estimator_fit_transform_save_load_under_connect(connect_spark, digits, tmp_path, nothing_left):
    """SparkNetClassifier on a Connect DataFrame: fit, transform (the Arrow engine; the
    JVM one needs a JVM on the client), save and load through the Connect session; the
    loaded model scores as the fitted one and as the network on the client."""
    from pyspark.ml.linalg import Vectors

    from sparknet.ml import SparkNetClassificationModel, SparkNetClassifier

    X, y, Xt, yt = digits
    train = connect_spark.createDataFrame([(Vectors.dense(x.astype(float)), float(t)) for x, t in zip(X, y)],
                                          ["features", "label"]).repartition(2)
    test = connect_spark.createDataFrame([(Vectors.dense(x.astype(float)), float(t)) for x, t in zip(Xt, yt)],
                                         ["features", "label"])
    net = Sequential([Dense(32, activation="relu"), Dense(10, activation="softmax")], seed=4)
    est = SparkNetClassifier(network=net, epochs=10, learningRate=1e-2, batchSize=32, seed=4)
    model = est.fit(train)
    rows = model.transform(test).select("prediction", "label").toPandas()
    acc = float((rows.prediction == rows.label).mean())
    assert model.lastInferenceEngine == "arrow"
    local = model.network.predict(Xt.astype(np.float32))
    np.testing.assert_array_equal(rows.prediction.to_numpy().astype(int), local)
    path = str(tmp_path / "model")
    model.write().session(connect_spark).save(path)
    loaded = SparkNetClassificationModel.read().session(connect_spark).load(path)
    np.testing.assert_array_equal(loaded.network.params, model.network.params)
    again = loaded.transform(test).select("prediction").toPandas().prediction.to_numpy()
    np.testing.assert_array_equal(again, rows.prediction.to_numpy())
    print(f"Estimator under Connect: test accuracy {acc:.4f}")
    assert acc >= 0.93


def test_demo_runs_from_a_connect_client(connect_server):
    """``python -m sparknet demo --remote sc://...`` trains on the digits from a Connect
    client (a process of its own, as a user runs it) and reports the accuracy."""
    import subprocess
    import sys

    proc = subprocess.run([sys.executable, "-m", "sparknet", "demo", "--remote", connect_server.url, "--quiet",
                           "--epochs", "20"], capture_output=True, text=True, timeout=600)
    lines = [ln for ln in proc.stdout.splitlines() if "test accuracy" in ln]
    assert lines, f"no result line (exit {proc.returncode}):\n{proc.stdout[-2000:]}\n{proc.stderr[-3000:]}"
    print(lines[-1])
    assert f"Spark Connect {connect_server.url}" in lines[-1]
    acc = float(lines[-1].split("test accuracy ")[1].split()[0])
    assert acc >= 0.95, lines[-1]


def test_a_failing_partition_and_ctrl_c_under_connect(connect_spark, digits, nothing_left):
    """A partition's task that raises fails the fit with its message; Ctrl-C after a round
    returns the model of the last applied round (``history.interrupted``); neither leaves
    a resident folder, and the next fit runs."""
    from sparknet.callbacks import LambdaCallback
    from sparknet.cluster.testing import inject_faults

    X, y, _, _ = digits

    def trainer():
        return DataParallelTrainer(mlp(32, input_shape=(64,), seed=1), connect_spark,
                                   num_partitions=2, sync="gradient", optimizer=RMSprop(lr=2e-3))

    with inject_faults(fail=[1]), pytest.raises(Exception, match="injected failure in partition 1"):
        trainer().fit(X, y, epochs=1, batch_size=256, verbose=0)
    t, seen = trainer(), []

    def interrupt(_round, logs):
        seen.append(t.model.params.copy())
        if logs["rounds_done"] == 3:
            raise KeyboardInterrupt

    model, h = t.fit(X, y, epochs=2, batch_size=256, verbose=0,
                     callbacks=[LambdaCallback(on_round_end=interrupt)])
    assert h.interrupted and h.epoch == []
    assert np.array_equal(model.params, seen[-1])
    _, h = trainer().fit(X, y, epochs=1, batch_size=256, verbose=0)
    assert len(h["loss"]) == 1 and np.isfinite(h["loss"][0])


@pytest.mark.parametrize("pair", [pytest.param(False, id="blocks", marks=pytest.mark.slow),
                                  pytest.param(True, id="paired")])
def test_model_parallel_under_connect_equals_one_process_float64(connect_spark, digits_xy, pair, nothing_left):
    """ModelParallel's block jobs as queries over a one-row-per-slot anchor: every layer
    of a 3-layer MLP cut into K = 1..3 blocks (paired: layers 0 and 1 as a Megatron pair)
    trains to the single-process weights within 1e-10 (float64)."""
    from helpers.models import mp_layers
    from sparknet.cluster import BlockPlan, ModelParallel
    from test_model_parallel import check_same

    X, y = digits_xy
    for K in (1, 2, 3):
        mp = ModelParallel(mp_layers(), BlockPlan({0: K, 1: K, 2: K}, pair=pair), (64,), spark=connect_spark,
                           dtype="float64", seed=K, optimizer=RMSprop(lr=2e-3), name=f"connect-{K}")
        try:
            assert isinstance(mp.backend.res, ConnectResident)
            check_same(mp, X, y, 1e-10)
        finally:
            mp.close()


def test_what_needs_a_spark_context_says_so_under_connect(connect_spark, digits):
    """The planners probe the executors through a SparkContext: under Connect
    num_partitions='auto' and plan='auto' fail at once with what to pass instead."""
    from sparknet.cluster import ModelParallel

    X, y, _, _ = digits
    with pytest.raises(NotImplementedError, match="num_partitions='auto'"):
        DataParallelTrainer(mlp(32, input_shape=(64,), seed=1), connect_spark,
                            num_partitions="auto").fit(X, y, epochs=1, verbose=0)
    with pytest.raises(NotImplementedError, match="plan='auto'.*pass a BlockPlan"):
        ModelParallel([Dense(32, activation="relu"), Dense(10, activation="softmax")], "auto",
                      input_shape=(64,), spark=connect_spark)
