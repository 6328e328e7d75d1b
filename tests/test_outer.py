"""The outer optimizer of sync='average' (sparknet.cluster.data_parallel.outer_optimizer): its maths against numpy,
plain averaging as its momentum-0 / lr-1 case, its checks, its state, and digits fits."""
from __future__ import annotations

import numpy as np
import pytest

from sparknet import Dense, RMSprop, Sequential
from sparknet.cluster.data_parallel.outer_optimizer import OuterOptimizer, resolve_outer, sized_for
from sparknet.cluster.data_parallel.trainer import DataParallelTrainer


def _reference(params, deltas, mu, lr, nesterov):
    """v = mu v + delta; params += lr (mu v + delta) (Nesterov) or lr v, in float64."""
    p, v = params.astype(np.float64), np.zeros(params.shape)
    for d in deltas:
        v = mu * v + d
        p = p + lr * (mu * v + d if nesterov else v)
    return p


@pytest.mark.parametrize("dtype", [np.float64, np.float32])
@pytest.mark.parametrize("mu,lr,nesterov", [(0.5, 1.0, True), (0.9, 0.7, True), (0.6, 0.8, False),
                                            (0.0, 2.0, True)])
def test_outer_step_equals_the_numpy_formula(dtype, mu, lr, nesterov):
    rng = np.random.default_rng(3)
    params = rng.standard_normal(1000).astype(dtype)
    deltas = [rng.standard_normal(1000).astype(dtype) * 0.1 for _ in range(6)]
    want = _reference(params, deltas, mu, lr, nesterov)
    outer, got = OuterOptimizer(momentum=mu, lr=lr, nesterov=nesterov), params.copy()
    for d in deltas:
        outer.step(got, d)
    assert outer.t == 6 and got.dtype == dtype
    np.testing.assert_allclose(got, want, rtol=1e-12 if dtype == np.float64 else 2e-5, atol=1e-6)
    assert outer.state_keys() == (("momentum_buffer",) if mu > 0 else ())


def test_momentum_0_lr_1_is_plain_averaging_bit_for_bit():
    rng = np.random.default_rng(0)
    for dtype in (np.float32, np.float64):
        params = rng.standard_normal(4096).astype(dtype)
        outer, got, want = OuterOptimizer(momentum=0.0, lr=1.0), params.copy(), params.copy()
        assert outer.is_plain
        for _ in range(3):
            d = rng.standard_normal(4096).astype(dtype)
            outer.step(got, d)
            want += d
        np.testing.assert_array_equal(got, want)


def test_state_dict_resumes_the_momentum_exactly():
    rng = np.random.default_rng(1)
    deltas = [rng.standard_normal(300).astype(np.float32) for _ in range(5)]
    whole, p_whole = OuterOptimizer(momentum=0.7, lr=0.9), np.zeros(300, np.float32)
    for d in deltas:
        whole.step(p_whole, d)
    first, p = OuterOptimizer(momentum=0.7, lr=0.9), np.zeros(300, np.float32)
    for d in deltas[:2]:
        first.step(p, d)
    saved = first.state_dict()
    assert sorted(saved) == ["lr", "momentum", "momentum_buffer", "t"]
    assert (saved["momentum"], saved["lr"], saved["t"]) == (0.7, 0.9, 2)
    resumed = OuterOptimizer()  # unsized: the state sizes it as the saved one was
    resumed.load_state_dict({k: (v.copy() if isinstance(v, np.ndarray) else v) for k, v in saved.items()})
    for d in deltas[2:]:
        resumed.step(p, d)
    np.testing.assert_array_equal(p, p_whole)
    resumed.reset()
    assert resumed.t == 0 and resumed.state_dict() == {"momentum": 0.7, "lr": 0.9, "t": 0}


@pytest.mark.parametrize("nesterov", [True, False])
def test_unset_momentum_and_lr_are_sized_from_the_partitions(nesterov):
    """Sized for P on the first step: a new direction moves 1x the averaged delta, one kept
    round after round P x; one partition is plain averaging, bit for bit."""
    assert sized_for(1, nesterov) == (0.0, 1.0)
    for P in (2, 4):
        mu, lr = sized_for(P, nesterov)
        assert lr * (1 + mu if nesterov else 1) == pytest.approx(1.0)
        assert lr / (1 - mu) == pytest.approx(P)
        outer, p = OuterOptimizer(nesterov=nesterov), np.zeros(50)
        assert not outer.sized and outer.state_dict() == {"momentum": None, "lr": None, "t": 0}
        outer.step(p, np.ones(50), partitions=P)
        np.testing.assert_allclose(p, 1.0)
        assert (outer.momentum, outer.lr) == (mu, lr)
        for _ in range(200):
            before = p.copy()
            outer.step(p, np.ones(50), partitions=P)
        np.testing.assert_allclose(p - before, P, rtol=1e-6)
    one, p, want = OuterOptimizer(nesterov=nesterov), np.full(20, 0.1, np.float32), np.full(20, 0.1, np.float32)
    for d in np.random.default_rng(5).standard_normal((4, 20)).astype(np.float32):
        one.step(p, d, partitions=1)
        want += d
    assert one.is_plain
    np.testing.assert_array_equal(p, want)
    with pytest.raises(ValueError, match="pass partitions= to its first step"):
        OuterOptimizer(nesterov=nesterov).step(np.zeros(3), np.ones(3))
    with pytest.raises(ValueError, match="partitions=0"):
        sized_for(0)


@pytest.mark.parametrize("kwargs,match", [
    ({"momentum": 1.0}, "momentum=1.0"), ({"momentum": -0.1}, "momentum=-0.1"),
    ({"momentum": "0.5"}, "momentum='0.5'"), ({"momentum": True}, "momentum=True"),
    ({"lr": 0.0}, "lr=0.0"), ({"lr": -1.0}, "lr=-1.0"), ({"lr": float("inf")}, "lr=inf"),
    ({"lr": float("nan")}, "lr=nan"), ({"lr": "1"}, "lr='1'"),
])
def test_bad_outer_values_raise_naming_them(kwargs, match):
    with pytest.raises(ValueError, match=match):
        OuterOptimizer(**kwargs)


def test_outer_choice_of_the_trainer(spark):
    model = Sequential([Dense(4, activation="softmax")], input_shape=(3,))
    assert resolve_outer(None, mode="sync", sync="average") is None
    assert resolve_outer("none", mode="sync", sync="average") is None
    assert resolve_outer("auto", mode="sync", sync="gradient") is None
    assert resolve_outer("auto", mode="async", sync="average") is None
    assert resolve_outer("auto", mode="sync", sync="average", local_steps=8) is None
    assert isinstance(resolve_outer("nesterov", mode="sync", sync="average", local_steps=8), OuterOptimizer)
    default = DataParallelTrainer(model, spark).outer  # the trainer sizes rounds and outer step
    assert isinstance(default, OuterOptimizer) and not default.sized and default.nesterov
    assert DataParallelTrainer(model, spark, local_steps=5).outer is None
    mine = OuterOptimizer(momentum=0.3)
    assert DataParallelTrainer(model, spark, outer=mine).outer is mine
    with pytest.raises(ValueError, match="outer must be .*got outer='bogus'"):
        DataParallelTrainer(model, spark, outer="bogus")
    with pytest.raises(ValueError, match="needs mode='sync' and sync='average'.*sync='gradient'"):
        DataParallelTrainer(model, spark, sync="gradient", outer="nesterov")
    with pytest.raises(ValueError, match="needs mode='sync' and sync='average'.*mode='async'"):
        DataParallelTrainer(model, spark, mode="async", outer=OuterOptimizer())


def _digits_fit(spark, digits, outer, epochs=12, local_steps=10, seed=0):
    X, y, Xt, yt = digits
    model = Sequential([Dense(128, activation="relu"), Dense(10, activation="softmax")], seed=seed)
    trainer = DataParallelTrainer(model, spark, num_partitions=2, sync="average", local_steps=local_steps,
                                  optimizer=RMSprop(lr=3e-3), outer=outer, seed=seed)
    _, history = trainer.fit(X, y, epochs=epochs, batch_size=16, verbose=0, validation_data=(Xt, yt))
    return model, history


@pytest.mark.slow
def test_fit_with_momentum_0_lr_1_equals_plain_averaging(spark, digits):
    """Same data, schedule and seeds: the outer step with momentum 0 and lr 1 leaves the
    very parameters plain averaging leaves."""
    plain, _ = _digits_fit(spark, digits, None, epochs=3)
    outer, _ = _digits_fit(spark, digits, OuterOptimizer(momentum=0.0, lr=1.0), epochs=3)
    np.testing.assert_array_equal(outer.params, plain.params)


@pytest.mark.slow
def test_fit_with_nesterov_outer_reaches_plain_averaging_accuracy(spark, digits):
    """Digits on local Spark, 2 partitions, rounds of 10 local steps (5 per epoch): the
    outer Nesterov step (the default one, sized from the 2 partitions) reaches the test
    accuracy plain averaging reaches, and its momentum is live state after the fit."""
    _, h_plain = _digits_fit(spark, digits, None)
    outer = OuterOptimizer()
    model, h_outer = _digits_fit(spark, digits, outer)
    plain_acc, outer_acc = h_plain["val_accuracy"][-1], h_outer["val_accuracy"][-1]
    print(f"digits, 12 epochs: plain averaging {plain_acc:.4f}, outer Nesterov {outer_acc:.4f}")
    assert (outer.momentum, outer.lr) == sized_for(2)
    assert plain_acc >= 0.95
    assert outer_acc >= plain_acc - 0.01
    assert outer.t == sum(h_outer["rounds"]) and outer.t > 12
    buf = outer.state_dict()["momentum_buffer"]
    assert buf.shape == model.params.shape and np.abs(buf).max() > 0
