"""``precision="bf16"`` in the trainers on Spark, and bfloat16 deltas on the wire.

Every data-parallel mode (synchronous exact and average, local steps sized by the trainer,
asynchronous; Classic and Spark Connect) trained in bf16 on digits reaches the float32 fit's
test accuracy within about a point, and its weights differ from the float32 weights: the
executors' products did run in bfloat16 (``history.precision`` says so).  Executors switched to
the fallback (``SPARKNET_BF16=fallback`` in their environment only) train exactly the float32
fit's weights and the driver warns once.  ``wire="bf16"`` halves the bytes each round sends back
and keeps the accuracy; its rounding error is fed back, so small deltas are not lost.
"""
from __future__ import annotations

import contextlib
import warnings

import numpy as np
import pytest

import sparknet._bf16 as _bf16
from helpers.models import mlp
from sparknet import Dense, RMSprop, Sequential
from sparknet.cluster import DataParallelTrainer
from sparknet.cluster.data_parallel import wire
from sparknet.precision import PrecisionFallbackWarning

pytestmark = pytest.mark.skipif(_bf16.backend() == "fallback",
                                reason="this CPU has no bfloat16 kernel (AVX512-BF16): precision='bf16' "
                                       "trains in float32 here, so there is no bf16 run to compare")

#: test accuracy a bf16 fit may lose against the same float32 fit (bf16's operand rounding)
ACC_POINTS = 0.011


def _digits_mlp(seed: int = 1, dtype: str = "float32") -> Sequential:
    return mlp(64, input_shape=(64,), dtype=dtype, seed=seed)


#: name -> (trainer options, fit options, whether two runs give the same weights)
MODES = {
    "sync-average": (dict(sync="average", local_steps=8), dict(epochs=6, batch_size=32), True),
    "sync-gradient": (dict(sync="gradient"), dict(epochs=12, batch_size=256), True),
    "local-steps-auto": (dict(sync="average"), dict(epochs=6, batch_size=32), False),
}


@contextlib.contextmanager
def _executor_env(spark, name: str, value: str):
    """``name=value`` in the environment of the Python workers the next jobs start (pyspark
    passes ``SparkContext.environment`` to them; a new environment gets new workers), not in
    the driver's."""
    env = spark.sparkContext.environment
    before = env.get(name)
    env[name] = value
    try:
        yield
    finally:
        if before is None:
            env.pop(name, None)
        else:
            env[name] = before


def _fit(spark, digits, mode_kw, fit_kw, **kw):
    X, y, Xt, yt = digits
    model = _digits_mlp()
    trainer = DataParallelTrainer(model, spark, num_partitions=2, optimizer=RMSprop(lr=3e-3), seed=2,
                                  **mode_kw, **kw)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        _, history = trainer.fit(X, y, verbose=0, **fit_kw)
    fallbacks = [w for w in caught if issubclass(w.category, PrecisionFallbackWarning)]
    acc = float((model.predict(Xt) == yt).mean())
    return model.params.copy(), acc, history, fallbacks


@pytest.mark.parametrize("mode", [pytest.param(m, marks=pytest.mark.slow) if m == "sync-gradient" else m
                                  for m in MODES])
def test_bf16_fit_matches_fp32_accuracy_and_runs_bf16_products(spark, digits, mode):
    mode_kw, fit_kw, exact = MODES[mode]
    w32, acc32, h32, warn32 = _fit(spark, digits, mode_kw, fit_kw)
    w16, acc16, h16, warn16 = _fit(spark, digits, mode_kw, fit_kw, precision="bf16")
    print(f"{mode}: test accuracy fp32 {acc32:.4f}, bf16 {acc16:.4f}; "
          f"max |w16 - w32| {np.abs(w16 - w32).max():.3g}")
    assert (h32.precision, h16.precision) == ("fp32", "bf16")
    assert not warn32 and not warn16
    assert acc32 > 0.93
    assert abs(acc16 - acc32) <= ACC_POINTS, (acc16, acc32)
    assert np.abs(w16 - w32).max() > 1e-4  # the products did run on bfloat16 operands
    if not exact:
        return
    # the same fit on executors without the bf16 kernel: float32 throughout, one warning
    with _executor_env(spark, "SPARKNET_BF16", "fallback"):
        wfb, accfb, hfb, warnfb = _fit(spark, digits, mode_kw, fit_kw, precision="bf16")
    assert hfb.precision == "fp32"
    assert len(warnfb) == 1 and "trained in float32 on some executors" in str(warnfb[0].message)
    np.testing.assert_array_equal(wfb, w32)


@pytest.mark.slow
def test_async_bf16_fit_matches_fp32_accuracy(spark, digits):
    """Asynchronous rounds arrive in a different order on each run, so the bound allows the
    run-to-run spread of async training on top of bf16's (see test_connect's async test)."""
    mode_kw, fit_kw = dict(mode="async", local_steps=5), dict(epochs=12, batch_size=32)
    w32, acc32, h32, _ = _fit(spark, digits, mode_kw, fit_kw)
    w16, acc16, h16, warn16 = _fit(spark, digits, mode_kw, fit_kw, precision="bf16")
    print(f"async: test accuracy fp32 {acc32:.4f}, bf16 {acc16:.4f}")
    assert (h32.precision, h16.precision) == ("fp32", "bf16") and not warn16
    assert acc32 > 0.93 and abs(acc16 - acc32) <= 0.02, (acc16, acc32)
    with _executor_env(spark, "SPARKNET_BF16", "fallback"):
        _, accfb, hfb, warnfb = _fit(spark, digits, mode_kw, fit_kw, precision="bf16")
    assert hfb.precision == "fp32" and len(warnfb) == 1  # once per fit, not once per task
    assert len(hfb.updates) > 2


@pytest.mark.slow
def test_bf16_under_connect_matches_fp32(connect_spark, digits):
    mode_kw, fit_kw, _ = MODES["sync-average"]
    w32, acc32, h32, _ = _fit(connect_spark, digits, mode_kw, fit_kw)
    w16, acc16, h16, warn16 = _fit(connect_spark, digits, mode_kw, fit_kw, precision="bf16")
    print(f"connect: test accuracy fp32 {acc32:.4f}, bf16 {acc16:.4f}")
    assert (h32.precision, h16.precision) == ("fp32", "bf16") and not warn16
    assert acc32 > 0.93 and abs(acc16 - acc32) <= ACC_POINTS
    assert np.abs(w16 - w32).max() > 1e-4


# ------------------------------------------------------------------------ bf16 on the wire
@pytest.mark.parametrize("mode", ["sync-average", pytest.param("async", marks=pytest.mark.slow)])
def test_wire_bf16_halves_the_bytes_back_and_keeps_accuracy(spark, digits, mode):
    if mode == "async":
        mode_kw, fit_kw = dict(mode="async", local_steps=5), dict(epochs=12, batch_size=32)
    else:
        mode_kw, fit_kw, _ = MODES[mode]
    n = _digits_mlp().n_params
    out = {}
    for w in ("fp32", "bf16"):
        params, acc, h, _ = _fit(spark, digits, mode_kw, fit_kw, wire=w)
        tasks = len(h.updates) if mode == "async" else 2 * round(sum(h["rounds"]))
        out[w] = params, acc, h.bytes_in / tasks
        assert h.bytes_in == tasks * n * (4 if w == "fp32" else 2)
    print(f"{mode}: test accuracy wire fp32 {out['fp32'][1]:.4f}, bf16 {out['bf16'][1]:.4f}; "
          f"bytes back per task {out['fp32'][2]:.0f} -> {out['bf16'][2]:.0f}")
    assert out["bf16"][2] == out["fp32"][2] / 2
    assert abs(out["bf16"][1] - out["fp32"][1]) <= (ACC_POINTS if mode != "async" else 0.02)
    assert not np.array_equal(out["bf16"][0], out["fp32"][0])


def test_wire_error_feedback_loses_no_small_delta():
    """A delta bfloat16 rounds away (1 + 2**-10 rounds to 1) arrives over the rounds: what
    the driver sums differs from the float32 sum by one rounding at most, where plain rounding
    loses 2**-10 every round."""
    rng = np.random.default_rng(0)
    deltas = (1.0 + 2.0 ** -10 + rng.uniform(-1e-4, 1e-4, (200, 16))).astype(np.float32)
    residual = np.zeros(16, np.float32)
    fed = sum(wire.decode(wire.encode(d, residual)).astype(np.float64) for d in deltas)
    plain = sum(wire.decode(wire.encode(d)).astype(np.float64) for d in deltas)
    exact = deltas.astype(np.float64).sum(axis=0)
    assert np.abs(fed - exact).max() <= 2.0 ** -8 * 1.0001
    assert np.abs(plain - exact).min() > 0.1  # ~200 * 2**-10 lost without the feedback
    assert wire.encode(deltas[0]).dtype == np.uint16 and wire.encode(deltas[0]).nbytes == 32


# ------------------------------------------------------------------------ bad values
def test_bad_precision_or_wire_names_the_value():
    with pytest.raises(ValueError, match=r"precision must be 'fp32' or 'bf16', got 'fp16'"):
        DataParallelTrainer(_digits_mlp(), precision="fp16")
    with pytest.raises(ValueError, match=r"precision='bf16' trains float32 models; this model is "
                                         r"float64 \(build it with dtype='float32'\)"):
        DataParallelTrainer(_digits_mlp(dtype="float64"), precision="bf16")
    with pytest.raises(ValueError, match=r"wire must be 'fp32' or 'bf16', got 'int8'"):
        DataParallelTrainer(_digits_mlp(), wire="int8")
    with pytest.raises(ValueError, match=r"sync='gradient' \(exact minibatch SGD\) keeps float32"):
        DataParallelTrainer(_digits_mlp(), sync="gradient", wire="bf16")


# ------------------------------------------------------------------------ Spark ML Param
def test_estimator_precision_param_trains_bf16_and_round_trips(spark, digits, tmp_path):
    from pyspark.ml.linalg import Vectors

    from sparknet.ml import SparkNetClassificationModel, SparkNetClassifier

    X, y, Xt, yt = digits
    df = spark.createDataFrame([(Vectors.dense(x.astype(float)), float(t)) for x, t in zip(X, y)],
                               ["features", "label"]).repartition(2)
    acc, weights = {}, {}
    for p in ("fp32", "bf16"):
        clf = SparkNetClassifier(network=_digits_mlp(), epochs=8, learningRate=3e-3, numPartitions=2,
                                 localSteps=8, batchSize=32, verbose=0, seed=5, precision=p)
        model = clf.fit(df)
        assert model.getPrecision() == p and model.history.precision == p
        acc[p] = float((model.network.predict(Xt.astype(np.float32)) == yt).mean())
        weights[p] = model.network.params.copy()
    print(f"estimator: test accuracy fp32 {acc['fp32']:.4f}, bf16 {acc['bf16']:.4f}")
    assert acc["fp32"] > 0.93 and abs(acc["bf16"] - acc["fp32"]) <= ACC_POINTS
    assert np.abs(weights["bf16"] - weights["fp32"]).max() > 1e-4
    model.write().overwrite().save(str(tmp_path / "model"))
    assert SparkNetClassificationModel.load(str(tmp_path / "model")).getPrecision() == "bf16"
    clf.write().overwrite().save(str(tmp_path / "est"))
    assert SparkNetClassifier.load(str(tmp_path / "est")).getPrecision() == "bf16"
    assert SparkNetClassifier().getPrecision() == "fp32"
    with pytest.raises(TypeError, match=r"precision must be one of \('fp32', 'bf16'\), got 'fp16'"):
        SparkNetClassifier(precision="fp16")


# ------------------------------------------------------------------------ model parallelism
def _rel(a, b):
    return float(np.linalg.norm(np.asarray(a, np.float64) - b) / max(np.linalg.norm(b), 1e-300))


def _blocks(spark, plan):
    from sparknet.cluster.model_parallel import ModelParallel

    layers = [Dense(64, activation="relu"), Dense(32, activation="tanh"), Dense(10, activation="softmax")]
    return ModelParallel(layers, plan, (64,), spark=spark, seed=0, optimizer=RMSprop(lr=2e-3))


@pytest.mark.parametrize("where", ["in-process", "spark"])
@pytest.mark.parametrize("pair", [False, True], ids=["blocks", "pair"])
def test_model_parallel_bf16_equals_one_process_bf16(request, digits_xy, where, pair):
    """Blocks trained in bf16 (the executors' products and the driver layers') end with the
    weights of one process's bf16 steps from the same start: within 1e-5 relative per parameter
    (the blocks sum their products in another order; measured ~1e-7), where the float32 steps
    are ~1e-2 away."""
    from sparknet import precision
    from sparknet.cluster.model_parallel.block_partition import BlockPlan

    spark = request.getfixturevalue("spark") if where == "spark" else None
    X, y = digits_xy
    X = X.astype(np.float32)
    with _blocks(spark, BlockPlan({0: 2, 1: 2}, pair=pair)) as mp:
        ref16, ref32 = mp.to_sequential(), mp.to_sequential()
        opt16, opt32 = RMSprop(lr=2e-3), RMSprop(lr=2e-3)
        for s in range(6):
            xb, yb = X[s * 64:(s + 1) * 64], y[s * 64:(s + 1) * 64]
            with precision.autocast("bf16"):
                mp.train_on_batch(xb, yb)
                ref16.train_on_batch(xb, yb, optimizer=opt16)
            ref32.train_on_batch(xb, yb, optimizer=opt32)
        got = mp.to_sequential().params
    for i, sl in enumerate(ref16.param_slices()):
        for name, (a, b, _) in sl.items():
            assert _rel(got[a:b], ref16.params[a:b]) <= 1e-5, (i, name)
    assert _rel(got, ref32.params) > 1e-3  # the bf16 products did run


def test_model_parallel_fit_precision_and_executor_fallback(spark, digits_xy):
    X, y = digits_xy
    X, y = X[:512].astype(np.float32), y[:512]
    runs = {}
    for name, value, env in (("fp32", "fp32", None), ("bf16", "bf16", None),
                             ("fallback", "bf16", "fallback")):
        with _blocks(spark, {0: 2, 1: 2}) as mp, warnings.catch_warnings(record=True) as caught, \
                (_executor_env(spark, "SPARKNET_BF16", env) if env else contextlib.nullcontext()):
            warnings.simplefilter("always")
            hist = mp.fit(X, y, epochs=1, batch_size=128, precision=value)
            runs[name] = (mp.to_sequential().params, hist["precision"],
                          [w for w in caught if issubclass(w.category, PrecisionFallbackWarning)])
    assert [runs[n][1] for n in ("fp32", "bf16", "fallback")] == ["fp32", "bf16", "fp32"]
    assert not runs["bf16"][2] and len(runs["fallback"][2]) == 1
    assert _rel(runs["bf16"][0], runs["fp32"][0]) > 1e-4
    np.testing.assert_array_equal(runs["fallback"][0], runs["fp32"][0])
    with _blocks(None, {0: 2}) as mp, pytest.raises(ValueError, match="precision must be 'fp32' or 'bf16', got 'half'"):
        mp.fit(X, y, precision="half")
