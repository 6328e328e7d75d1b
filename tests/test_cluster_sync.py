"""Data-parallel training on real local Spark (the session-scoped ``spark`` fixture)."""
from __future__ import annotations

import logging
import math
import os
import time

import numpy as np
import pytest

from helpers.frames import row_frame
from helpers.models import mlp
from sparknet import Dense, RMSprop, Sequential
from sparknet.cluster.data.sharding import split_indices
from sparknet.cluster.data_parallel.trainer import DataParallelTrainer


def _conv(seed):
    from sparknet.layers import Conv2D, Flatten, MaxPool2D
    return Sequential([Conv2D(4, 3, activation="relu"), MaxPool2D(2), Flatten(),
                       Dense(10, activation="softmax")], input_shape=(8, 8, 1), dtype="float64", seed=seed)


def _lstm(seed):
    from sparknet.layers import LSTM
    return Sequential([LSTM(12), Dense(10, activation="softmax")], input_shape=(8, 8),
                      dtype="float64", seed=seed)


@pytest.mark.parametrize("kind,rows,epochs", [("dense", 600, 2), ("conv", 300, 1), ("lstm", 300, 1)])
def test_gradient_sync_equals_single_process_float64(spark, digits, kind, rows, epochs):
    """sync='gradient' = single-process RMSprop on the same global minibatches (float64),
    for dense, convolutional and recurrent models alike (flat rows reshaped to the input)."""
    X, y, _, _ = digits
    X = X[:rows].astype(np.float64)
    y = y[:rows]
    P, B, seed = 3, 100, 5
    make = {"dense": lambda s: mlp(32, dtype="float64", seed=s, input_shape=(64,)),
            "conv": _conv, "lstm": _lstm}[kind]
    model = make(1)
    start = model.params.copy()
    trainer = DataParallelTrainer(model, spark, num_partitions=P, sync="gradient",
                                  optimizer=RMSprop(lr=1e-2), seed=seed)
    trained, history = trainer.fit(X, y, epochs=epochs, batch_size=B, verbose=0)
    assert trained is model
    R = math.ceil(rows / B)
    assert history["rounds"] == [R] * epochs

    # the reference: one process, the documented schedule, no Spark
    ref = make(1)
    np.testing.assert_array_equal(ref.params, start)
    opt = RMSprop(lr=1e-2)
    shards = [(X[i], y[i]) for i in split_indices(rows, P, seed)]
    for e in range(epochs):
        perms = [np.random.default_rng([seed, e, p]).permutation(len(sy)) for p, (_, sy) in enumerate(shards)]
        for r in range(R):
            xs, ys = [], []
            for (sx, sy), perm in zip(shards, perms):
                n = len(sy)
                sel = perm[n * r // R: n * (r + 1) // R]
                xs.append(sx[sel])
                ys.append(sy[sel])
            xb = np.concatenate(xs).reshape((-1,) + ref.input_shape)
            ref.loss_and_grad(xb, np.concatenate(ys), ref.loss)
            opt.step(ref.params, ref.grads)
    rel = np.linalg.norm(model.params - ref.params) / np.linalg.norm(ref.params)
    moved = np.linalg.norm(ref.params - start) / np.linalg.norm(start)
    print(f"{kind}: relative difference {rel:.3e}, moved {moved:.3f}")
    assert moved > 0.01, "training did not move the parameters"
    assert rel <= 1e-10, f"distributed and single-process parameters differ: {rel:.3e}"


def test_rounds_of_several_epochs_follow_the_documented_schedule_float64(spark, digits):
    """sync='average' with more local steps than an epoch holds: each round runs whole
    epochs on every partition (its own RMSprop state kept across rounds), then the
    row-weighted mean delta is applied -- equal to a numpy re-run of that schedule, and
    validation runs only when a round ends (NaN inside a round)."""
    X, y, Xt, yt = digits
    rows, P, B, seed, epochs = 600, 3, 50, 11, 5
    X, y = X[:rows].astype(np.float64), y[:rows]
    model = mlp(16, dtype="float64", seed=2, input_shape=(64,))
    start = model.params.copy()
    trainer = DataParallelTrainer(model, spark, num_partitions=P, sync="average", local_steps=8,
                                  optimizer=RMSprop(lr=5e-3), seed=seed)
    _, history = trainer.fit(X, y, epochs=epochs, batch_size=B, verbose=0,
                             validation_data=(Xt, yt))
    # 200 rows per partition = 4 steps per epoch: rounds of 2 epochs, then the last epoch alone
    assert history["rounds"] == [0.5, 0.5, 0.5, 0.5, 1.0]
    assert history["local_steps"] == [8, 8, 8, 8, 4]
    val = history["val_accuracy"]
    assert np.isnan(val[0]) and np.isnan(val[2]) and all(np.isfinite([val[1], val[3], val[4]]))
    assert val[4] == pytest.approx(model.evaluate(Xt, yt)["accuracy"], abs=1e-12)

    ref = mlp(16, dtype="float64", seed=2, input_shape=(64,))
    np.testing.assert_array_equal(ref.params, start)
    shards = [(X[i], y[i]) for i in split_indices(rows, P, seed)]
    opts = [RMSprop(lr=5e-3) for _ in shards]
    for group in ([0, 1], [2, 3], [4]):
        begin = ref.params.copy()
        delta, weight = np.zeros_like(begin), 0
        for p, ((sx, sy), opt) in enumerate(zip(shards, opts)):
            ref.set_params(begin)
            for e in group:
                perm = np.random.default_rng([seed, e, p]).permutation(len(sy))
                for lo in range(0, len(perm), B):
                    sel = perm[lo:lo + B]
                    ref.loss_and_grad(sx[sel], sy[sel], ref.loss)
                    opt.step(ref.params, ref.grads)
            delta += (ref.params - begin) * (len(sy) * len(group))
            weight += len(sy) * len(group)
        ref.set_params(begin + delta / weight)
    rel = np.linalg.norm(model.params - ref.params) / np.linalg.norm(ref.params)
    assert np.linalg.norm(ref.params - start) / np.linalg.norm(start) > 0.01
    assert rel <= 1e-10, f"distributed and re-run parameters differ: {rel:.3e}"


def test_auto_rounds_grow_past_one_epoch_when_an_epoch_is_short(spark, digits):
    """local_steps='auto' on a tiny epoch: rounds span several epochs (capped by
    max_epochs_per_round), so Spark's share of a round falls."""
    X, y, _, _ = digits
    model = mlp(16, seed=0)
    trainer = DataParallelTrainer(model, spark, num_partitions=2, optimizer=RMSprop(lr=3e-3),
                                  max_epochs_per_round=3)
    _, history = trainer.fit(X[:400], y[:400], epochs=7, batch_size=50, verbose=0)
    assert len(history["loss"]) == 7
    # 200 rows per partition = 4 steps, far below what pays for a round: after the first
    # measured round, every round is 3 epochs long
    assert min(history["rounds"]) == pytest.approx(1 / 3)
    with pytest.raises(ValueError, match="max_epochs_per_round must be a positive integer"):
        DataParallelTrainer(model, spark, max_epochs_per_round=0)


@pytest.mark.slow
@pytest.mark.parametrize("partitions", [2, 4])
def test_tau_averaging_reaches_97_percent_on_digits(spark, digits, partitions):
    X, y, Xt, yt = digits
    model = mlp(128, seed=0)
    trainer = DataParallelTrainer(model, spark, num_partitions=partitions, sync="average",
                                  optimizer=RMSprop(lr=3e-3))
    t0 = time.perf_counter()
    _, history = trainer.fit(X, y, epochs=35, batch_size=16, verbose=0)
    elapsed = time.perf_counter() - t0
    acc = model.evaluate(Xt, yt)["accuracy"]
    print(f"{partitions} partitions: test accuracy {acc:.4f} in {elapsed:.1f} s, "
          f"{history['rounds'][-1]:.2g} rounds/epoch, Spark share {history['spark_overhead'][-1]:.2f}")
    assert acc >= 0.97
    assert len(history["loss"]) == 35 and history["loss"][-1] < history["loss"][0]
    assert all(0.0 <= f <= 1.0 for f in history["spark_overhead"])
    assert trainer.cost is not None and trainer.cost.t_fixed > 0 and trainer.cost.t_step > 0


@pytest.mark.slow
@pytest.mark.parametrize("kind", ["vector_df", "array_df", "rdd", "numpy"])
def test_input_kinds_train_and_arrive_intact(spark, digits, kind):
    X, y, Xt, yt = digits
    if kind == "vector_df":
        data, labels, val = row_frame(spark, X, y, 2), None, row_frame(spark, Xt, yt, 2)
    elif kind == "array_df":
        data, labels = row_frame(spark, X, y, 2, array=True), None
        val = row_frame(spark, Xt, yt, 2, array=True)
    elif kind == "rdd":
        data = spark.sparkContext.parallelize(list(zip(X, y)), 2)
        labels, val = None, spark.sparkContext.parallelize(list(zip(Xt, yt)), 2)
    else:
        data, labels, val = X, y, (Xt, yt)
    model = mlp(64, seed=3)
    trainer = DataParallelTrainer(model, spark, num_partitions=2, optimizer=RMSprop(lr=3e-3))
    _, history = trainer.fit(data, labels, epochs=4, batch_size=16, validation_data=val, verbose=0)
    local = model.evaluate(Xt, yt)
    # the validation numbers computed on the executors equal the driver's on the same rows
    assert history["val_accuracy"][-1] == pytest.approx(local["accuracy"], abs=1e-12)
    assert history["val_loss"][-1] == pytest.approx(local["loss"], rel=1e-5)
    assert local["accuracy"] >= 0.9, f"{kind}: test accuracy {local['accuracy']:.3f}"
    # and evaluating the training data on the executors equals evaluating it locally
    dist = trainer.evaluate(data, labels)
    assert dist["accuracy"] == pytest.approx(model.evaluate(X, y)["accuracy"], abs=1e-12)


@pytest.mark.slow
def test_more_partitions_than_rows_and_empty_partitions(spark, digits, caplog):
    """Empty partitions train, and the fit warns that they cost a task per round each."""
    X, y, _, _ = digits
    caplog.set_level(logging.WARNING, logger="sparknet.cluster.data_parallel.trainer")
    model = mlp(16, seed=0)
    trainer = DataParallelTrainer(model, spark, num_partitions=8, sync="gradient",
                                  optimizer=RMSprop(lr=1e-2))
    before = model.params.copy()
    _, history = trainer.fit(X[:5], y[:5], epochs=2, batch_size=2, verbose=0)
    assert np.isfinite(history["loss"]).all() and not np.array_equal(before, model.params)
    assert history["rounds"] == [3, 3]
    warned = [r.getMessage() for r in caplog.records if "partitions for" in r.getMessage()]
    assert warned == ["sparknet: 8 partitions for 5 training rows: 3 or more of them hold no "
                      "row, and every round still runs a task for each; fewer partitions train "
                      "faster (num_partitions='auto' chooses)"], warned
    # a DataFrame whose partitions are partly empty (3 rows in 6 partitions)
    caplog.clear()
    df = row_frame(spark, X[:3], y[:3], 1).repartition(6)
    model2 = mlp(16, seed=0)
    trainer2 = DataParallelTrainer(model2, spark, sync="average", optimizer=RMSprop(lr=1e-2))
    _, h2 = trainer2.fit(df, epochs=1, batch_size=4, verbose=0)
    assert np.isfinite(h2["loss"]).all()
    assert any("6 partitions for 3 training rows" in r.getMessage() for r in caplog.records)
    # as many partitions as rows or fewer: no warning
    caplog.clear()
    DataParallelTrainer(mlp(16, seed=0), spark, num_partitions=5, sync="gradient").fit(
        X[:5], y[:5], epochs=1, batch_size=2, verbose=0)
    assert not [r for r in caplog.records if "partitions for" in r.getMessage()]
    assert trainer2.evaluate(df)["accuracy"] == pytest.approx(model2.evaluate(X[:3], y[:3])["accuracy"])


def _bad_fit(spark, data, y=None, match="", **kw):
    model = mlp(8, seed=0, input_shape=(64,))
    before = model.params.copy()
    trainer = DataParallelTrainer(model, spark, num_partitions=2, optimizer=RMSprop(lr=1e-2))
    with pytest.raises(ValueError, match=match):
        trainer.fit(data, y, epochs=1, batch_size=8, verbose=0, **kw)
    # no round ran: no round sizing, parameters untouched
    assert trainer.cost is None
    np.testing.assert_array_equal(model.params, before)


@pytest.mark.slow
def test_bad_input_fails_before_any_round(spark, digits):
    from pyspark.ml.linalg import Vectors
    X, y, _, _ = digits
    good = row_frame(spark, X[:40], y[:40], 2)
    _bad_fit(spark, good, match="no label column 'target'", label_col="target")
    _bad_fit(spark, good, match="no features column 'pixels'", features_col="pixels")
    ragged = spark.createDataFrame([(Vectors.dense(X[i]), int(y[i])) for i in range(10)]
                                   + [(Vectors.dense(X[10][:63]), int(y[10]))], ["features", "label"])
    _bad_fit(spark, ragged, match=r"features column 'features' holds vectors of different lengths \(63 and 64")
    ragged_arr = spark.createDataFrame([([1.0] * 64, 1), ([1.0] * 60, 2)], "features array<double>, label int")
    _bad_fit(spark, ragged_arr, match="different lengths")
    Xn = X[:20].copy()
    Xn[7, 5] = np.nan
    nan_df = spark.createDataFrame([(Vectors.dense(a), int(b)) for a, b in zip(Xn, y[:20])], ["features", "label"])
    _bad_fit(spark, nan_df, match="features column 'features' contains nan")
    _bad_fit(spark, Xn, y[:20], match="NaN")
    out = spark.createDataFrame([(Vectors.dense(X[i]), 12 if i == 3 else int(y[i])) for i in range(20)],
                                ["features", "label"])
    _bad_fit(spark, out, match=r"label column 'label' holds the label 12, outside \[0, 10\)")
    _bad_fit(spark, X[:20], np.where(np.arange(20) == 4, -1, y[:20]), match="label -1 outside")
    frac = spark.createDataFrame([(Vectors.dense(X[0]), 1.5)], ["features", "label"])
    _bad_fit(spark, frac, match="non-integer label 1.5")
    empty = spark.createDataFrame([], "features array<double>, label int")
    _bad_fit(spark, empty, match="training data is empty: the DataFrame has no rows")
    _bad_fit(spark, spark.createDataFrame([("a", 1)], "features string, label int"),
             match="features column 'features' has type string")
    _bad_fit(spark, X[:20, :60], y[:20], match="X has 60 values per row, the model expects 64")
    _bad_fit(spark, spark.sparkContext.parallelize([(X[0], 1), (X[1][:10], 2)], 1), match="different lengths")
    _bad_fit(spark, good, validation_data=(X[:5, :10], y[:5]), match="X_val has 10 values per row")


@pytest.mark.slow
def test_resident_state_reattaches_and_never_goes_missing(spark):
    import shutil

    from sparknet.cluster.resident.driver import Resident, ResidentStateLost

    sc = spark.sparkContext

    def _forget_all(_):
        """Executor side: what a restarted Python worker looks like (empty module store)."""
        from sparknet.cluster.resident import shards
        shards.clear_store()
        assert shards.store_entries() == {}
        return 0

    def build(index, rows):
        return {"x": np.asarray(list(rows), dtype=np.float64)}, {"rows": index}

    def bump(index, shard):  # in-place state that must persist across jobs and workers
        c = shard.ensure("count", (1,), np.int64)
        c[0] += 1
        return (float(shard["x"].sum()), int(c[0]))

    res = Resident(sc.parallelize(range(40), 4), build, name="test")
    try:
        assert [i.meta["rows"] for i in res.infos] == [0, 1, 2, 3]
        sums = [float(sum(range(10 * p, 10 * p + 10))) for p in range(4)]
        assert res.map(bump) == [(s, 1) for s in sums]
        sc.parallelize(range(8), 8).map(_forget_all).collect()  # workers "restarted"
        assert res.map(bump) == [(s, 2) for s in sums]
        shutil.rmtree(res.infos[2].directory)  # partition 2's files gone
        sc.parallelize(range(8), 8).map(_forget_all).collect()
        with pytest.raises(ResidentStateLost, match="partition 2 is gone"):
            res.map(bump)
    finally:
        res.close()
    assert not any(os.path.exists(i.directory) for i in res.infos)
    rebuilt = Resident(sc.parallelize(range(40), 4), build, name="test", on_lost="rebuild")
    try:
        shutil.rmtree(rebuilt.infos[1].directory)
        sc.parallelize(range(8), 8).map(_forget_all).collect()
        assert [v for v, _ in rebuilt.map(bump)] == sums  # rebuilt from the source
    finally:
        rebuilt.close()


def test_rounds_do_not_carry_the_source_rows(spark):
    """A ``parallelize`` source keeps its rows in its partition objects; the anchor's
    lineage is cut so that the tasks of later jobs do not carry them, and a lost anchor
    block is reported as lost state (rebuilt from the source when asked)."""
    from sparknet.cluster.resident.driver import Resident, ResidentStateLost

    sc = spark.sparkContext
    big = [np.full(1000, float(p)) for p in range(4)]

    def build(index, rows):
        return {"x": np.concatenate(list(rows))}, {"rows": index}

    def total(index, shard):
        return float(shard["x"].sum())

    for on_lost in ("raise", "rebuild"):
        res = Resident(sc.parallelize(big, 4), build, name="lineage", on_lost=on_lost)
        try:
            assert "ParallelCollectionRDD" not in res.anchor.toDebugString().decode()
            assert res.map(total) == [1000.0 * p for p in range(4)]
            # drop the anchor's blocks in the JVM: what the loss of their executor leaves
            sc._jsc.sc().unpersistRDD(res.anchor.id(), True)
            if on_lost == "raise":
                with pytest.raises(ResidentStateLost, match="anchor block is gone"):
                    res.map(total)
            else:
                assert res.map(total) == [1000.0 * p for p in range(4)]
        finally:
            res.close()


def test_a_layer_class_of_the_users_own_trains_and_scores_on_the_executors(spark, digits):
    """A layer class written in the driver's own code (registered with ``@register``, not
    importable by the executors) travels with the network: the trainer's fit and evaluate
    and a Spark ML Model's transform rebuild it on the executors, and they compute what the
    driver computes (before, the executors failed with "unknown layer class")."""
    from pyspark.ml.linalg import Vectors

    from sparknet.layers.base import REGISTRY, Layer, register
    from sparknet.ml import SparkNetClassificationModel

    class HalfForTest(Layer):  # defined in a function: pickled by value
        def _build(self, input_shape):
            return tuple(input_shape)

        def forward(self, x, training=False):
            return x * 0.5

        def backward(self, dy):
            return dy * 0.5

        def get_config(self):
            return {}

    register(HalfForTest)
    try:
        X, y, Xt, yt = digits
        model = Sequential([HalfForTest(), Dense(16, activation="relu"),
                            Dense(10, activation="softmax")], input_shape=(64,), seed=0)
        trainer = DataParallelTrainer(model, spark, num_partitions=2, optimizer=RMSprop(lr=1e-2))
        _, history = trainer.fit(X[:400], y[:400], epochs=2, batch_size=32, verbose=0)
        assert np.isfinite(history["loss"]).all() and history["accuracy"][-1] > 0.5
        on_executors, on_driver = trainer.evaluate(Xt, yt), model.evaluate(Xt, yt)
        assert on_executors["loss"] == pytest.approx(on_driver["loss"], rel=1e-5)
        assert on_executors["accuracy"] == pytest.approx(on_driver["accuracy"])
        df = spark.createDataFrame([(Vectors.dense(r),) for r in Xt[:40]], ["features"])
        scored = SparkNetClassificationModel.from_network(model).transform(df)
        assert [int(r.prediction) for r in scored.collect()] == model.predict(Xt[:40]).tolist()
    finally:
        REGISTRY.pop("HalfForTest", None)


def test_a_layer_module_the_executors_cannot_import_is_named_with_the_fix(spark, digits,
                                                                        tmp_path, monkeypatch):
    """A layer class from a module only the driver can import: the fit fails with one
    WorkerSetupError naming the module and ``addPyFile``, nothing trained; after
    ``addPyFile`` the same fit runs."""
    import importlib
    import sys
    import uuid

    from sparknet.errors import WorkerSetupError
    from sparknet.layers.base import REGISTRY

    name = f"layers_{uuid.uuid4().hex[:8]}"
    path = tmp_path / f"{name}.py"
    path.write_text(
        "from sparknet.layers.base import Layer, register\n\n\n"
        "@register\nclass TwiceForTest(Layer):\n"
        "    def _build(self, input_shape):\n        return tuple(input_shape)\n\n"
        "    def forward(self, x, training=False):\n        return x * 2.0\n\n"
        "    def backward(self, dy):\n        return dy * 2.0\n\n"
        "    def get_config(self):\n        return {}\n", encoding="utf-8")
    monkeypatch.syspath_prepend(str(tmp_path))      # the driver's path only
    module = importlib.import_module(name)
    try:
        X, y, _, _ = digits
        model = Sequential([module.TwiceForTest(), Dense(10, activation="softmax")],
                           input_shape=(64,), seed=0)
        before = model.params.copy()
        trainer = DataParallelTrainer(model, spark, num_partitions=2)
        with pytest.raises(WorkerSetupError, match=rf"cannot load the network's own layer classes "
                                                   rf"\(ModuleNotFoundError: No module named "
                                                   rf"'{name}'\).*addPyFile"):
            trainer.fit(X[:100], y[:100], epochs=1, verbose=0)
        np.testing.assert_array_equal(model.params, before)
        spark.sparkContext.addPyFile(str(path))
        _, history = trainer.fit(X[:100], y[:100], epochs=1, verbose=0)
        assert np.isfinite(history["loss"]).all()
    finally:
        REGISTRY.pop("TwiceForTest", None)
        sys.modules.pop(name, None)
