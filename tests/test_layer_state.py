"""The layers' untrained state (BatchNormalization's running statistics) in every trainer:
one process (checkpoint files, EarlyStopping's best weights, the divergence guard),
DataParallelTrainer (gradient mode equal to one process with one partition and to the
row-weighted mean of the partitions' states with two; average and async modes; Spark
Connect; exact resume), ModelParallel's driver stages, and the Spark ML Estimators."""
from __future__ import annotations

import math

import numpy as np
import pytest

from sparknet import SGD, Activation, Dense, RMSprop, Sequential
from sparknet.callbacks import EarlyStopping, LambdaCallback, ModelCheckpoint
from sparknet.cluster.data.sharding import split_indices
from sparknet.cluster.data_parallel.trainer import DataParallelTrainer
from sparknet.errors import TrainingDiverged
from sparknet.io import load_model
from sparknet.layers import BatchNormalization, LayerNormalization, Residual
from sparknet.threads import blas_threads


def _bn_net(dtype="float32", seed=0, hidden=32):
    """BatchNormalization on the input pixels (its running statistics are the data's) and
    on the hidden layer (they follow the training)."""
    layers = [BatchNormalization(), Dense(hidden), BatchNormalization(), Activation("relu"),
              Dense(10, activation="softmax")]
    return Sequential(layers, input_shape=(64,), dtype=dtype, seed=seed)


def _input_stats(model):
    """The first layer's running mean and variance."""
    sl = model.state_slices()[0]
    (a, b, _), (c, d, _) = sl["running_mean"], sl["running_var"]
    return model.state[a:b], model.state[c:d]


class _Record(LambdaCallback):
    """Copies of the parameters and state after every epoch (and the state after every step)."""

    def __init__(self):
        super().__init__()
        self.epochs, self.steps = [], []

    def on_batch_end(self, batch, logs):
        self.steps.append(self.model.state.copy())

    def on_epoch_end(self, epoch, logs):
        self.epochs.append((self.model.params.copy(), self.model.state.copy()))


# ------------------------------------------------------------------------- one process
def test_one_process_checkpoints_best_weights_and_divergence_keep_the_statistics(digits, tmp_path):
    X, y, Xt, yt = digits
    model = _bn_net()
    rec = _Record()
    saver = ModelCheckpoint(str(tmp_path / "epoch{epoch}.npz"))
    # the best "max" loss is the first epoch's: stops after the third, restores the first
    best = EarlyStopping(monitor="loss", mode="max", patience=2, restore_best_weights=True)
    model.fit(X, y, epochs=5, batch_size=64, verbose=0, callbacks=[rec, saver, best])
    assert len(rec.epochs) == 3 and best.best_epoch == 0
    assert not np.array_equal(rec.epochs[0][1], rec.epochs[-1][1])      # the statistics moved
    np.testing.assert_array_equal(model.params, rec.epochs[0][0])      # restored: params and state
    np.testing.assert_array_equal(model.state, rec.epochs[0][1])
    for path, (params, state) in zip(saver.saved, rec.epochs):
        loaded = load_model(path)
        np.testing.assert_array_equal(loaded.params, params)
        np.testing.assert_array_equal(loaded.state, state)
    np.testing.assert_array_equal(load_model(saver.saved[0]).predict(Xt), model.predict(Xt))

    # a step whose forward pass made the statistics NaN is undone: the state of the step before
    rec = _Record()
    diverging = _bn_net()
    starts, forward = [], diverging.loss_and_grad

    def recording(*args, **kw):  # the state each step starts from
        starts.append(diverging.state.copy())
        return forward(*args, **kw)

    diverging.loss_and_grad = recording
    with pytest.raises(TrainingDiverged, match="loss"):
        diverging.fit(X, y, epochs=2, batch_size=32, optimizer=SGD(lr=1e30), verbose=0,
                      callbacks=[rec])
    assert rec.steps and np.isfinite(diverging.state).all()
    # the non-finite loss came from the weights the last step made: back to before that step
    np.testing.assert_array_equal(diverging.state, starts[-2])


# -------------------------------------------------------------- data-parallel, gradient
def _gradient_reference(make, X, y, P, seed, B, epochs, lr):
    """One process following sync='gradient''s documented schedule: each round, every
    partition's slice runs forward and backward from the driver's parameters and state; one
    step on the summed gradient; the state becomes the row-weighted mean of the slices'."""
    ref, opt = make(), RMSprop(lr=lr)
    shards = [(X[i], y[i]) for i in split_indices(len(y), P, seed)]
    R = math.ceil(len(y) / B)
    for e in range(epochs):
        perms = [np.random.default_rng([seed, e, p]).permutation(len(sy))
                 for p, (_, sy) in enumerate(shards)]
        for r in range(R):
            start, grad, w_sum, states = ref.state.copy(), np.zeros_like(ref.params), 0.0, []
            for (sx, sy), perm in zip(shards, perms):
                n = len(sy)
                sel = perm[n * r // R: n * (r + 1) // R]
                ref.set_state(start)
                _, w, _ = ref.loss_and_grad(sx[sel], sy[sel], ref.loss, scale=1.0)
                grad += ref.grads
                w_sum += w
                states.append((len(sel), ref.state.copy()))
            opt.step(ref.params, np.ascontiguousarray(grad / ref.dtype.type(w_sum)))
            rows = sum(n for n, _ in states)
            ref.state[...] = sum((n / rows) * s for n, s in states)
    return ref, [s for _, s in states]


@pytest.mark.parametrize("P", [1, 2])
def test_gradient_sync_state_is_one_process_or_the_partitions_row_weighted_mean(spark, digits, P):
    """With one partition the fit equals one process bit for bit, running statistics
    included; with two, each partition normalises its slice by its own batch statistics
    (DDP without SyncBatchNorm) and the driver's state is the row-weighted mean of theirs."""
    X, y, _, _ = digits
    X, y = X[:500].astype(np.float64), y[:500]
    seed, B, epochs, lr = 5, 100, 2, 1e-2
    model = _bn_net("float64", seed=1)
    trainer = DataParallelTrainer(model, spark, num_partitions=P, sync="gradient",
                                  optimizer=RMSprop(lr=lr), seed=seed)
    trainer.fit(X, y, epochs=epochs, batch_size=B, verbose=0)
    with blas_threads(1):
        ref, last = _gradient_reference(lambda: _bn_net("float64", seed=1), X, y, P, seed, B,
                                        epochs, lr)
    mean, var = _input_stats(model)
    assert np.abs(mean).max() > 0.1 and np.abs(var - 1).max() > 0.1   # moved from the start
    if P == 1:
        np.testing.assert_array_equal(model.params, ref.params)
        np.testing.assert_array_equal(model.state, ref.state)
        return
    rel = np.linalg.norm(model.params - ref.params) / np.linalg.norm(ref.params)
    assert rel <= 1e-10, rel
    np.testing.assert_allclose(model.state, ref.state, rtol=1e-10, atol=1e-12)
    # the mean of the two partitions' states, which differ from each other and from it
    assert np.abs(last[0] - last[1]).max() > 1e-3
    assert min(np.abs(model.state - s).max() for s in last) > 1e-4


# ------------------------------------------------------------------ average and async
@pytest.mark.slow
@pytest.mark.parametrize("mode", ["average", "async"])
def test_average_and_async_modes_learn_digits_and_keep_the_datas_statistics(spark, digits, mode):
    X, y, Xt, yt = digits
    model = _bn_net(seed=2)
    options = {"mode": "async"} if mode == "async" else {}
    trainer = DataParallelTrainer(model, spark, num_partitions=2, sync="average", local_steps=10,
                                  optimizer=RMSprop(lr=3e-3), seed=2, **options)
    trainer.fit(X, y, epochs=8, batch_size=32, verbose=0)
    acc = float(model.evaluate(Xt, yt)["accuracy"])
    mean, var = _input_stats(model)
    err_mean = np.abs(mean - X.mean(axis=0)).mean()     # over the 64 pixels
    err_var = np.abs(var - X.var(axis=0, ddof=1)).mean()
    print(f"{mode}: test accuracy {acc:.4f}; input statistics off by {err_mean:.4f} (mean), "
          f"{err_var:.4f} (variance)")
    assert acc >= 0.94
    if mode == "average":  # evaluation tasks normalise with the driver's running statistics
        remote = trainer.evaluate(Xt, yt)
        assert remote["accuracy"] == pytest.approx(acc, abs=1e-9)
        assert remote["loss"] == pytest.approx(model.evaluate(Xt, yt)["loss"], rel=1e-5)
    assert np.isfinite(model.state).all()
    assert err_mean <= 0.02 and err_var <= 0.01


# ------------------------------------------------------------------------ Spark Connect
@pytest.mark.slow
def test_gradient_sync_under_connect_carries_the_state_as_classic_does(spark, connect_spark,
                                                                       digits):
    """The same BatchNormalization fit (sync='gradient', float64, 2 partitions) under
    Classic and Connect: the same parameters and running statistics to 1e-12."""
    X, y, _, _ = digits
    X, y = X[:400].astype(np.float64), y[:400]
    out = {}
    for name, session in (("classic", spark), ("connect", connect_spark)):
        model = _bn_net("float64", seed=3)
        trainer = DataParallelTrainer(model, session, num_partitions=2, sync="gradient",
                                      optimizer=RMSprop(lr=1e-2), seed=4)
        trainer.fit(X, y, epochs=1, batch_size=100, verbose=0)
        out[name] = model
    ref, got = out["classic"], out["connect"]
    assert np.abs(ref.state - _bn_net("float64", seed=3).state).max() > 0.1
    np.testing.assert_allclose(got.params, ref.params, rtol=1e-12, atol=1e-12)
    np.testing.assert_allclose(got.state, ref.state, rtol=1e-12, atol=1e-12)


# ------------------------------------------------------------------------------ resume
@pytest.mark.slow
def test_interrupted_gradient_fit_resumes_bit_identically_state_included(spark, digits, tmp_path):
    from sparknet.callbacks import LambdaCallback
    from sparknet.checkpoint import CheckpointStore

    X, y, _, _ = digits

    def trainer(directory=None):
        return DataParallelTrainer(_bn_net("float64", seed=6), spark, num_partitions=2,
                                   sync="gradient", optimizer=RMSprop(lr=1e-2), seed=6,
                                   checkpoint_dir=directory, checkpoint_every=4)

    full = trainer()
    full.fit(X, y, epochs=2, batch_size=256, verbose=0)

    def interrupt(_round, logs):
        if logs["rounds_done"] == 6:
            raise KeyboardInterrupt

    first = trainer(str(tmp_path))
    _, h = first.fit(X, y, epochs=2, batch_size=256, verbose=0,
                     callbacks=[LambdaCallback(on_round_end=interrupt)])
    assert h.interrupted
    ckpt = CheckpointStore(str(tmp_path)).latest()
    assert ckpt.step == 4 and "state" in ckpt.arrays
    resumed = trainer(str(tmp_path))
    _, h = resumed.fit(X, y, epochs=2, batch_size=256, verbose=0, resume=True)
    assert h.resumed_from.endswith("ckpt-000000000004")
    assert not np.array_equal(resumed.model.state, _bn_net("float64", seed=6).state)
    np.testing.assert_array_equal(resumed.model.params, full.model.params)
    np.testing.assert_array_equal(resumed.model.state, full.model.state)


# ---------------------------------------------------------------------- model parallel
def test_model_parallel_keeps_the_state_on_the_driver_stage_as_one_process(spark, digits_xy,
                                                                           tmp_path):
    from sparknet.cluster.model_parallel import ModelParallel
    from sparknet.cluster.model_parallel.block_partition import BlockPlan

    X, y = digits_xy
    layers = [Dense(32), BatchNormalization(), Activation("relu"), Dense(10, activation="softmax")]
    mp = ModelParallel(layers, BlockPlan({0: 2}), input_shape=(64,), spark=spark, dtype="float64",
                       seed=0, optimizer=RMSprop(lr=2e-3), checkpoint_dir=str(tmp_path / "ckpt"))
    try:
        ref, opt = mp.to_sequential(), RMSprop(lr=2e-3)
        init = ref.state.copy()
        for s in range(4):
            xb, yb = X[s * 64:(s + 1) * 64], y[s * 64:(s + 1) * 64]
            mp.train_on_batch(xb, yb)
            ref.train_on_batch(xb, yb, optimizer=opt)
        got = mp.to_sequential()
        assert np.abs(ref.state - init).max() > 0.1
        # (the blocked layer's bias, ahead of a BatchNormalization, only gathers rounding: norms)
        assert np.linalg.norm(got.params - ref.params) <= 1e-10 * np.linalg.norm(ref.params)
        np.testing.assert_allclose(got.state, ref.state, rtol=1e-9, atol=1e-10)
        np.testing.assert_allclose(mp.predict_output(X[:200]), ref.predict_output(X[:200]),
                                   rtol=1e-9, atol=1e-12)

        mp.save(str(tmp_path / "saved"))
        ckpt = mp.checkpoint()
        state = got.state.copy()
        mp.train_on_batch(X[256:320], y[256:320])
        assert not np.array_equal(mp.to_sequential().state, state)
        mp.restore(ckpt)
        np.testing.assert_array_equal(mp.to_sequential().state, state)
        loaded = ModelParallel.load(str(tmp_path / "saved"), spark=spark)
        try:
            np.testing.assert_array_equal(loaded.to_sequential().state, state)
            np.testing.assert_array_equal(loaded.predict(X[:200]), mp.predict(X[:200]))
        finally:
            loaded.close()
    finally:
        mp.close()


# ---------------------------------------------------------------------------- Spark ML
@pytest.mark.slow
def test_estimator_with_normalisation_and_residual_layers_round_trips(spark, digits, tmp_path):
    import pandas as pd
    from pyspark.ml.functions import array_to_vector
    from pyspark.sql import types as T

    from sparknet.ml import SparkNetClassificationModel, SparkNetClassifier

    X, y, Xt, yt = digits

    def frame(X, y):
        schema = T.StructType([T.StructField("features", T.ArrayType(T.DoubleType()), False),
                               T.StructField("label", T.DoubleType(), False)])
        pdf = pd.DataFrame({"features": list(np.asarray(X, np.float64)),
                            "label": np.asarray(y, np.float64)})
        df = spark.createDataFrame(pdf, schema)
        return df.select(array_to_vector("features").alias("features"), "label")

    block = Residual([Dense(64, activation="relu"), BatchNormalization(), Dense(64)])
    net = Sequential([BatchNormalization(), block, LayerNormalization(),
                      Dense(10, activation="softmax")], seed=1)
    est = SparkNetClassifier(network=net, epochs=4, learningRate=2e-3, seed=1, numPartitions=2,
                             localSteps=32, batchSize=32)
    est.write().save(str(tmp_path / "estimator"))
    assert SparkNetClassifier.load(str(tmp_path / "estimator")).getNetwork().get_config() == \
        est.getNetwork().get_config()
    model = est.fit(frame(X, y))
    network = model.network
    assert network.n_state == 2 * 64 + 2 * 64 and np.isfinite(network.state).all()
    test = frame(Xt, yt)
    pred = np.array([r[0] for r in model.transform(test).select("prediction").collect()])
    # the running statistics reached the workers: the same predictions as on the driver
    np.testing.assert_array_equal(pred, network.predict(Xt.astype(network.dtype)))
    acc = float((pred == yt).mean())
    print(f"Estimator with BatchNormalization and a residual block: test accuracy {acc:.4f}")
    assert acc >= 0.9
    model.write().save(str(tmp_path / "model"))
    loaded = SparkNetClassificationModel.load(str(tmp_path / "model"))
    np.testing.assert_array_equal(loaded.network.params, network.params)
    np.testing.assert_array_equal(loaded.network.state, network.state)
    again = np.array([r[0] for r in loaded.transform(test).select("prediction").collect()])
    np.testing.assert_array_equal(again, pred)
