"""Callbacks and learning-rate schedules in every trainer: one process, data parallel on
Spark (sync gradient, sync average, async), model parallel and the Spark ML Estimators."""
from __future__ import annotations

import math
import os

import numpy as np
import pytest

from helpers.models import mlp
from sparknet import Dense, RMSprop, Sequential
from sparknet.callbacks import (
    EarlyStopping,
    LambdaCallback,
    LearningRateScheduler,
    ModelCheckpoint,
    ReduceLROnPlateau,
)
from sparknet.schedules import Constant, CosineDecay, ExponentialDecay, LinearWarmup, StepDecay


class _Weights(LambdaCallback):
    """Records the weights (and the logs) at every epoch's end."""

    def __init__(self):
        super().__init__()
        self.weights, self.logs = [], []

    def on_epoch_end(self, epoch, logs):
        flat = self.model.to_sequential().params if hasattr(self.model, "to_sequential") else self.get_weights()
        self.weights.append(np.array(flat, copy=True))
        self.logs.append(dict(logs))


# ---------------------------------------------------------------------------- schedules
def test_schedules_match_their_closed_forms():
    steps = np.arange(0, 50, 0.5)
    s = StepDecay(0.1, step_size=7, gamma=0.5)
    assert [s(t) for t in steps] == [0.1 * 0.5 ** math.floor(t / 7) for t in steps]
    e = ExponentialDecay(0.1, decay_rate=0.9, decay_steps=4)
    np.testing.assert_allclose([e(t) for t in steps], 0.1 * 0.9 ** (steps / 4), rtol=1e-15)
    c = CosineDecay(0.1, decay_steps=30, min_lr=0.01)
    want = 0.01 + 0.09 * 0.5 * (1 + np.cos(np.pi * np.minimum(steps, 30) / 30))
    np.testing.assert_allclose([c(t) for t in steps], want, rtol=1e-14)
    assert c(30) == pytest.approx(0.01) and c(45) == pytest.approx(0.01) and c(0) == pytest.approx(0.1)
    w = LinearWarmup(c, warmup_steps=10, start_factor=0.2)
    ramp = [0.1 * (0.2 + 0.8 * t / 10) for t in steps if t < 10]
    np.testing.assert_allclose([w(t) for t in steps if t < 10], ramp, rtol=1e-14)
    np.testing.assert_allclose([w(t) for t in steps if t >= 10], [c(t - 10) for t in steps if t >= 10])
    assert LinearWarmup(0.5, 4)(2) == pytest.approx(0.5 * (0.1 + 0.9 * 0.5)) and Constant(0.3)(99) == 0.3
    import pickle
    assert pickle.loads(pickle.dumps(w)) == w   # schedules travel to the executors


@pytest.mark.parametrize("make, message", [
    (lambda: StepDecay(0.1, step_size=0), "StepDecay step_size must be a positive integer, got 0"),
    (lambda: ExponentialDecay(0.1, decay_rate=1.5), "ExponentialDecay decay_rate must be in (0, 1], got 1.5"),
    (lambda: CosineDecay(-1.0, 10), "CosineDecay initial_lr must be a positive finite number, got -1.0"),
    (lambda: CosineDecay(0.1, 10, min_lr=0.2), "CosineDecay min_lr must be in [0, 0.1), got 0.2"),
    (lambda: LinearWarmup(Constant(0.1), 0), "LinearWarmup warmup_steps must be a positive finite number, got 0"),
    (lambda: EarlyStopping(mode="up"), "EarlyStopping mode must be 'auto', 'min' or 'max', got 'up'"),
    (lambda: EarlyStopping(patience=-1), "EarlyStopping patience must be a non-negative integer, got -1"),
    (lambda: EarlyStopping(monitor=""), "EarlyStopping monitor must be a metric name"),
    (lambda: ReduceLROnPlateau(factor=1.5), "ReduceLROnPlateau factor must be in (0, 1), got 1.5"),
    (lambda: ReduceLROnPlateau(cooldown=0.5), "ReduceLROnPlateau cooldown must be a non-negative integer"),
    (lambda: LearningRateScheduler(StepDecay(0.1, 2), per="batch"),
     "LearningRateScheduler per must be 'step' or 'epoch', got 'batch'"),
    (lambda: LearningRateScheduler(0.1), "LearningRateScheduler schedule must be callable"),
    (lambda: ModelCheckpoint(3), "ModelCheckpoint path must be a file path, got 3"),
    (lambda: ModelCheckpoint("m-{epoch"), "ModelCheckpoint path='m-{epoch' is not a valid format string"),
    (lambda: LambdaCallback(on_epoch_end=5), "LambdaCallback on_epoch_end must be callable, got 5"),
])
def test_bad_arguments_raise_value_errors_naming_them(make, message):
    with pytest.raises(ValueError) as err:
        make()
    assert message in str(err.value)


def test_bad_callback_lists_and_missing_monitor_fail_clearly(digits):
    X, y, _, _ = digits
    with pytest.raises(ValueError, match="callbacks must be a list of callables; item 0 is 5"):
        mlp(16).fit(X[:64], y[:64], epochs=1, verbose=0, callbacks=[5])
    with pytest.raises(ValueError, match="callbacks must be a list"):
        mlp(16).fit(X[:64], y[:64], epochs=1, verbose=0, callbacks=EarlyStopping())
    with pytest.raises(ValueError, match="several LearningRateScheduler"):
        mlp(16).fit(X[:64], y[:64], epochs=1, verbose=0,
                    callbacks=[LearningRateScheduler(Constant(1e-3))] * 2)
    with pytest.raises(ValueError, match="returned lr=-1.0 at step 0"):
        mlp(16).fit(X[:64], y[:64], epochs=1, verbose=0,
                    callbacks=[LearningRateScheduler(lambda t: -1.0)])
    seen = []
    with pytest.raises(ValueError) as err:   # val_loss without validation data: at the first epoch's end
        mlp(16).fit(X[:64], y[:64], epochs=3, verbose=0,
                   callbacks=[LambdaCallback(on_epoch_begin=lambda e, logs: seen.append(e)), EarlyStopping()])
    assert "EarlyStopping monitor='val_loss' is not in the epoch's logs (accuracy, loss, lr, time)" in str(err.value)
    assert "pass validation data" in str(err.value) and seen == [0]


# --------------------------------------------------------------------------- one process
def _expected_stop(values, patience, min_delta):
    """(best epoch, epoch after which the fit stops or None) by EarlyStopping's rule, mode min."""
    best, best_epoch, wait = math.inf, None, 0
    for e, v in enumerate(values):
        if v < best - min_delta:
            best, best_epoch, wait = v, e, 0
        else:
            wait += 1
            if wait >= max(patience, 1):
                return best_epoch, e
    return best_epoch, None


def test_early_stopping_stops_at_the_right_epoch_and_restores_the_best_weights(digits):
    X, y, Xt, yt = digits
    kw = dict(epochs=12, batch_size=64, validation_data=(Xt, yt), verbose=0)
    ref = _Weights()
    mlp(16).fit(X, y, callbacks=[ref], optimizer=RMSprop(lr=0.02), **kw)
    val = [logs["val_loss"] for logs in ref.logs]
    best, stop = _expected_stop(val, patience=2, min_delta=0.005)
    assert stop is not None and stop < 11, f"the reference fit must stall: {val}"

    es, rec = EarlyStopping(patience=2, min_delta=0.005, restore_best_weights=True), _Weights()
    model = mlp(16)
    h = model.fit(X, y, callbacks=[rec, es], optimizer=RMSprop(lr=0.02), **kw)
    assert len(h.epoch) == stop + 1 and es.stopped_epoch == stop and es.best_epoch == best
    assert h["val_loss"] == val[:stop + 1]
    np.testing.assert_array_equal(model.params, ref.weights[best])        # restored
    np.testing.assert_array_equal(rec.weights[-1], ref.weights[stop])     # what it had when it stopped
    assert not np.array_equal(model.params, rec.weights[-1])

    # a plain callable returning True still stops, after that epoch
    h = mlp(16).fit(X, y, callbacks=[lambda epoch, logs: epoch == 1], optimizer=RMSprop(lr=0.02),
                    **kw)
    assert len(h.epoch) == 2


def test_model_checkpoint_writes_files_that_load(digits, tmp_path):
    X, y, Xt, yt = digits
    every = ModelCheckpoint(tmp_path / "all" / "m-{epoch:02d}-{val_loss:.3f}.npz")
    best = ModelCheckpoint(tmp_path / "best-{epoch}.npz", monitor="val_accuracy", save_best_only=True)
    rec = _Weights()
    model = mlp(16)
    h = model.fit(X, y, epochs=4, batch_size=64, validation_data=(Xt, yt), verbose=0, callbacks=[every, best, rec])
    names = sorted(os.listdir(tmp_path / "all"))
    assert names == [f"m-{e + 1:02d}-{h['val_loss'][e]:.3f}.npz" for e in range(4)]
    for e, name in enumerate(names):
        np.testing.assert_array_equal(Sequential.load(tmp_path / "all" / name).params, rec.weights[e])
    acc = h["val_accuracy"]
    improved = [e for e in range(4) if acc[e] > max(acc[:e], default=-1)]
    assert best.saved == [str(tmp_path / f"best-{e + 1}.npz") for e in improved]
    assert Sequential.load(best.saved[-1]).evaluate(Xt, yt)["accuracy"] == pytest.approx(max(acc))
    with pytest.raises(ValueError, match="names 'val_auc' that the epoch's logs do not hold"):
        mlp(16).fit(X, y, epochs=1, verbose=0,
                    callbacks=[ModelCheckpoint(tmp_path / "{val_auc}.npz")])


def test_reduce_lr_on_plateau_lowers_the_rate_after_patience(digits):
    X, y, _, _ = digits
    # min_delta larger than any change: only the first epoch improves
    plateau = ReduceLROnPlateau(monitor="loss", factor=0.5, patience=2, cooldown=1, min_delta=100.0, min_lr=3e-4)
    h = mlp(16).fit(X, y, epochs=7, batch_size=128, verbose=0, optimizer=RMSprop(lr=2e-3),
                    callbacks=[plateau])
    assert h["lr"] == [2e-3, 2e-3, 2e-3, 1e-3, 1e-3, 5e-4, 5e-4]
    assert plateau.reductions == [(2, 1e-3), (4, 5e-4), (6, 3e-4)]   # the last one at min_lr


def test_per_epoch_schedule_sets_each_epochs_rate(digits):
    X, y, _, _ = digits
    sched = LearningRateScheduler(StepDecay(1e-2, step_size=2, gamma=0.1), per="epoch")
    h = mlp(16).fit(X, y, epochs=5, batch_size=128, verbose=0, callbacks=[sched])
    assert h["lr"] == sched.lrs == [1e-2, 1e-2, 1e-2 * 0.1, 1e-2 * 0.1, 1e-2 * 0.1 ** 2]


# ------------------------------------------------------------------------------- Spark
def _schedule():
    return LinearWarmup(ExponentialDecay(4e-3, decay_rate=0.5, decay_steps=6), warmup_steps=3)


def test_per_step_rates_one_process_equal_spark_sync_gradient_and_average(spark, digits):
    from sparknet.cluster import DataParallelTrainer

    X, y, _, _ = digits
    X, y = X[:200], y[:200]
    b, epochs, S = 50, 2, 4                  # 4 steps per epoch in one process
    one = LearningRateScheduler(_schedule())
    h1 = mlp(16).fit(X, y, epochs=epochs, batch_size=b, verbose=0, callbacks=[one])
    assert one.lrs == [_schedule()(t) for t in range(epochs * S)]

    grad = LearningRateScheduler(_schedule())
    tr = DataParallelTrainer(mlp(16), spark, num_partitions=2, sync="gradient",
                             optimizer=RMSprop(lr=4e-3))
    _, hg = tr.fit(X, y, epochs=epochs, batch_size=b, verbose=0, callbacks=[grad])
    assert grad.lrs == one.lrs                     # exactly, step for step
    assert hg["lr"] == h1["lr"] == [_schedule()(0), _schedule()(S)]

    avg = LearningRateScheduler(_schedule())
    tr = DataParallelTrainer(mlp(16), spark, num_partitions=2, sync="average", local_steps=2,
                             optimizer=RMSprop(lr=4e-3))
    _, ha = tr.fit(X, y, epochs=epochs, batch_size=b, verbose=0, callbacks=[avg])
    assert ha["lr"] == h1["lr"]
    assert sorted(avg.partition_lrs) == [0, 1]
    for lrs in avg.partition_lrs.values():
        T = len(lrs) // epochs                    # the partition's local steps per pass
        assert len(lrs) == epochs * T and 2 <= T < S
        # step j of T in pass e is at e*S + j*S/T: the same fraction of the epoch as one process's
        assert lrs == [_schedule()(e * S + j * S / T) for e in range(epochs) for j in range(T)]
        assert lrs[::T] == one.lrs[::S]           # each epoch starts at one process's rate


def test_average_mode_executors_apply_the_rates(spark, digits):
    """Per-step schedule on the executors and per-epoch rates from the driver give the same
    weights when they give the same rates, and other weights than a constant rate."""
    from sparknet.cluster import DataParallelTrainer

    X, y, _, _ = digits
    X, y = X[:200], y[:200]

    def fit(callbacks):
        tr = DataParallelTrainer(mlp(16), spark, num_partitions=2, sync="average", local_steps=2,
                                 optimizer=RMSprop(lr=4e-3))
        model, h = tr.fit(X, y, epochs=3, batch_size=50, verbose=0, callbacks=callbacks)
        return model.params.copy(), h

    steps_per_epoch = 4
    per_step, hs = fit([LearningRateScheduler(StepDecay(4e-3, steps_per_epoch, 0.3))])
    per_epoch, he = fit([LearningRateScheduler(StepDecay(4e-3, 1, 0.3), per="epoch")])
    constant, _ = fit([])
    assert hs["lr"] == he["lr"] == [4e-3, 4e-3 * 0.3, 4e-3 * 0.3 ** 2]
    np.testing.assert_array_equal(per_step, per_epoch)
    assert not np.allclose(per_step, constant)


def test_callbacks_stop_spark_fits_and_restore_the_drivers_weights(spark, digits):
    from sparknet.cluster import DataParallelTrainer

    X, y, Xt, yt = digits
    X, y = X[:400], y[:400]
    rounds = []
    rec = _Weights()
    rec.on_round_end = lambda r, logs: rounds.append((int(logs["epoch"]), r, logs["loss"]))
    es = EarlyStopping(monitor="loss", min_delta=100.0, restore_best_weights=True)   # stops after epoch 1
    tr = DataParallelTrainer(mlp(16), spark, num_partitions=2, sync="average", local_steps=2)
    model, h = tr.fit(X, y, epochs=5, batch_size=50, validation_data=(Xt, yt), verbose=0, callbacks=[rec, es])
    assert len(h.epoch) == 2 and es.stopped_epoch == 1 and es.best_epoch == 0
    assert [(e, r) for e, r, _ in rounds] == [(0, 0), (0, 1), (1, 0), (1, 1)]
    assert all(np.isfinite(v) for _, _, v in rounds)
    np.testing.assert_array_equal(model.params, rec.weights[0])

    # async: a user's callback stops the fit after its first epoch
    stopper = LambdaCallback()
    updates = []
    stopper.on_round_end = lambda r, logs: updates.append(logs["partition"])
    stopper.on_epoch_end = lambda e, logs: setattr(stopper, "stop_training", True)
    tr = DataParallelTrainer(mlp(16), spark, num_partitions=2, mode="async", local_steps=2)
    _, h = tr.fit(X, y, epochs=4, batch_size=50, verbose=0, callbacks=[stopper])
    assert len(h.epoch) == 1 and h["lr"] == [1e-3] and sorted(set(updates)) == [0.0, 1.0]


def test_model_parallel_schedule_and_early_stopping(digits):
    from sparknet.cluster import ModelParallel

    X, y, _, _ = digits
    S = math.ceil(X.shape[0] / 128)
    mp = ModelParallel([Dense(32, activation="relu"), Dense(10, activation="softmax")], {0: 2}, (64,), seed=0)
    sched = LearningRateScheduler(CosineDecay(1e-2, decay_steps=4 * S, min_lr=1e-4))
    one = LearningRateScheduler(CosineDecay(1e-2, decay_steps=4 * S, min_lr=1e-4))
    rec = _Weights()
    es = EarlyStopping(monitor="loss", min_delta=100.0, restore_best_weights=True)
    h = mp.fit(X, y, epochs=4, batch_size=128, callbacks=[sched, rec, es])
    mlp(32).fit(X, y, epochs=2, batch_size=128, verbose=0, callbacks=[one])
    assert sched.lrs == one.lrs and len(sched.lrs) == 2 * S          # the same steps as one process's
    assert h["lr"] == [sched.lrs[0], sched.lrs[S]] and len(h["loss"]) == 2
    assert mp.job_optimizer.lr == sched.lrs[-1]                      # what the block jobs carry
    np.testing.assert_array_equal(mp.to_sequential().params, rec.weights[0])   # epoch 0's, restored
    assert not np.array_equal(rec.weights[0], rec.weights[1])
    mp.close()


@pytest.mark.slow
def test_estimator_takes_callbacks_that_are_not_saved(spark, digits, tmp_path):
    import pandas as pd
    import pyspark.sql.types as T
    from pyspark.ml.functions import array_to_vector

    from sparknet.ml import SparkNetClassifier

    X, y, _, _ = digits
    schema = T.StructType([T.StructField("features", T.ArrayType(T.DoubleType()), False),
                           T.StructField("label", T.DoubleType(), False)])
    pdf = pd.DataFrame({"features": list(X[:400].astype(np.float64)), "label": y[:400].astype(np.float64)})
    df = spark.createDataFrame(pdf, schema).select(array_to_vector("features").alias("features"), "label")
    sched = LearningRateScheduler(StepDecay(3e-3, 1, 0.5), per="epoch")
    stop = LambdaCallback(on_epoch_end=lambda e, logs: setattr(stop, "stop_training", e == 2))
    clf = SparkNetClassifier(network=mlp(16), epochs=6, numPartitions=2, localSteps=4, batchSize=50,
                             callbacks=[sched, stop])
    assert clf.getCallbacks() == [sched, stop] and "callbacks" not in {p.name for p in clf.params}
    model = clf.fit(df)
    assert model.history["lr"] == [3e-3, 1.5e-3, 7.5e-4]
    clf.save(str(tmp_path / "clf"))
    assert SparkNetClassifier.load(str(tmp_path / "clf")).getCallbacks() == []
