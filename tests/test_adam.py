"""Adam and AdamW over the flat buffer: against an independent numpy re-implementation
of PyTorch's formulas, against torch.optim when torch is importable, their state through
checkpoints, their step bound, and training with them in one process and on Spark."""
import itertools

import numpy as np
import pytest

from helpers.models import mlp
from sparknet import Adam, AdamW, Dense, Sequential
from sparknet.optim import from_config, get


def ref_adam(p, grads, lr, betas, eps, wd, amsgrad, decoupled):
    """torch.optim.Adam / AdamW (single-tensor path), written out."""
    b1, b2 = betas
    p = p.copy()
    m, v, vmax = np.zeros_like(p), np.zeros_like(p), np.zeros_like(p)
    for t, g in enumerate(grads, start=1):
        if decoupled:
            p = p * (1 - lr * wd)
        elif wd:
            g = g + wd * p
        m = m + (1 - b1) * (g - m)
        v = b2 * v + (1 - b2) * g * g
        if amsgrad:
            vmax = np.maximum(vmax, v)
        den = np.sqrt(vmax if amsgrad else v) / np.sqrt(1 - b2 ** t) + eps
        p = p - lr / (1 - b1 ** t) * (m / den)
    return p


def _data(n=60, steps=9, seed=0):
    rng = np.random.default_rng(seed)
    return rng.standard_normal(n), [rng.standard_normal(n) * 10.0 ** rng.integers(-3, 2) for _ in range(steps)]


OPTIONS = list(itertools.product([(0.9, 0.999), (0.5, 0.9)], [1e-8, 1e-3], [0.0, 0.05], [False, True],
                                 [Adam, AdamW]))


@pytest.mark.parametrize("betas,eps,wd,amsgrad,klass", OPTIONS)
def test_adam_matches_numpy_reference(betas, eps, wd, amsgrad, klass):
    p0, grads = _data()
    opt = klass(lr=0.01, betas=betas, eps=eps, weight_decay=wd, amsgrad=amsgrad)
    p = p0.copy()
    for g in grads:
        opt.step(p, g.copy())
    want = ref_adam(p0, grads, 0.01, betas, eps, wd, amsgrad, decoupled=klass is AdamW)
    np.testing.assert_allclose(p, want, rtol=1e-13, atol=1e-15)


@pytest.mark.parametrize("betas,eps,wd,amsgrad,klass", OPTIONS[::3])
def test_adam_matches_torch_float64_and_float32(betas, eps, wd, amsgrad, klass):
    torch = pytest.importorskip("torch", reason="torch not installed: torch comparison skipped")
    p0, grads = _data(seed=2)
    for dtype, tdtype, tol in ((np.float64, torch.float64, 1e-12), (np.float32, torch.float32, 2e-6)):
        t = torch.tensor(p0.astype(dtype), dtype=tdtype, requires_grad=True)
        tklass = torch.optim.AdamW if klass is AdamW else torch.optim.Adam
        topt = tklass([t], lr=0.01, betas=betas, eps=eps, weight_decay=wd, amsgrad=amsgrad, foreach=False)
        opt = klass(lr=0.01, betas=betas, eps=eps, weight_decay=wd, amsgrad=amsgrad)
        p = p0.astype(dtype)
        for g in grads:
            t.grad = torch.tensor(g.astype(dtype), dtype=tdtype)
            topt.step()
            opt.step(p, g.astype(dtype))
        np.testing.assert_allclose(p, t.detach().numpy(), rtol=tol, atol=tol)


def test_adamw_defaults_are_pytorchs():
    a, w = Adam(), AdamW()
    assert (a.lr, a.betas, a.eps, a.weight_decay, a.amsgrad) == (1e-3, (0.9, 0.999), 1e-8, 0.0, False)
    assert (w.lr, w.betas, w.eps, w.weight_decay, w.amsgrad) == (1e-3, (0.9, 0.999), 1e-8, 1e-2, False)
    assert isinstance(get("adam"), Adam) and isinstance(get("AdamW"), AdamW)


def test_state_and_config_round_trip_continue_identically():
    p0, grads = _data(seed=4)
    a = AdamW(lr=0.02, betas=(0.8, 0.99), weight_decay=0.1, amsgrad=True)
    pa = p0.copy()
    for g in grads[:4]:
        a.step(pa, g.copy())
    b = from_config(a.name, a.get_config())
    assert isinstance(b, AdamW) and b.get_config() == a.get_config()
    b.load_state_arrays(a.state_arrays())
    assert b.t == 4 and set(b.state) == {"exp_avg", "exp_avg_sq", "max_exp_avg_sq"}
    pb = pa.copy()
    for g in grads[4:]:
        a.step(pa, g.copy())
        b.step(pb, g.copy())
    np.testing.assert_array_equal(pa, pb)


def test_step_bound_bounds_every_step():
    """The bound the divergence guard relies on holds for gradients of every scale."""
    rng = np.random.default_rng(5)
    for klass, amsgrad in ((Adam, False), (AdamW, True)):
        opt = klass(lr=0.05, weight_decay=0.1, amsgrad=amsgrad)
        p = rng.standard_normal(200)
        carry = 0.0
        for _ in range(40):
            g = rng.standard_normal(200) * 10.0 ** rng.integers(-6, 6)
            bound, carry = opt.step_bound(float(np.linalg.norm(g)), float(np.linalg.norm(p)), p.size, carry)
            before = p.copy()
            opt.step(p, g)
            assert np.linalg.norm(p - before) <= bound * (1 + 1e-9)
            assert np.linalg.norm(opt.state["exp_avg"]) <= carry * (1 + 1e-9) + 1e-300


@pytest.mark.parametrize("bad,match", [
    (dict(betas=(0.9,)), "betas must be a pair"),
    (dict(betas=(1.0, 0.999)), "beta1"),
    (dict(betas=(0.9, -0.1)), "beta2"),
    (dict(eps=0.0), "eps"),
    (dict(weight_decay=float("nan")), "weight_decay"),
    (dict(amsgrad="yes"), "amsgrad"),
    (dict(lr=-1.0), "learning rate"),
])
def test_bad_arguments_name_the_value(bad, match):
    for klass in (Adam, AdamW):
        with pytest.raises(ValueError, match=match):
            klass(**bad)


def test_one_process_fit_with_adam_learns_digits(digits):
    X, y, Xt, yt = digits
    for opt in (Adam(lr=2e-3), AdamW(lr=2e-3, amsgrad=True)):
        model = Sequential([Dense(64, activation="relu"), Dense(10, activation="softmax")], seed=0)
        model.fit(X, y, epochs=15, batch_size=32, optimizer=opt, verbose=0)
        assert model.evaluate(Xt, yt)["accuracy"] > 0.94


@pytest.mark.slow
def test_data_parallel_adam_gradient_mode_equals_one_process_and_average_mode_learns(spark, digits):
    """sync='gradient' applies the driver's AdamW to the exact global minibatch gradient:
    float64 weights equal one process taking the documented global batches; in average
    mode each partition keeps its own Adam state resident and the fit learns digits."""
    from sparknet.cluster.data.sharding import split_indices
    from sparknet.cluster.data_parallel.trainer import DataParallelTrainer

    X, y, Xt, yt = digits
    rows, P, B, seed = 600, 3, 100, 5
    X64, y64 = X[:rows].astype(np.float64), y[:rows]

    model, ref = (mlp(16, seed=1, input_shape=(64,), dtype="float64") for _ in range(2))
    trainer = DataParallelTrainer(model, spark, num_partitions=P, sync="gradient",
                                  optimizer=AdamW(lr=1e-2, amsgrad=True), seed=seed)
    trainer.fit(X64, y64, epochs=2, batch_size=B, verbose=0)
    opt = AdamW(lr=1e-2, amsgrad=True)
    shards = [(X64[i], y64[i]) for i in split_indices(rows, P, seed)]
    R = -(-rows // B)
    for e in range(2):
        perms = [np.random.default_rng([seed, e, p]).permutation(len(sy)) for p, (_, sy) in enumerate(shards)]
        for r in range(R):
            sel = [perm[len(sy) * r // R: len(sy) * (r + 1) // R] for (_, sy), perm in zip(shards, perms)]
            xb = np.concatenate([sx[s_] for (sx, _), s_ in zip(shards, sel)])
            yb = np.concatenate([sy[s_] for (_, sy), s_ in zip(shards, sel)])
            ref.loss_and_grad(xb, yb, ref.loss)
            opt.step(ref.params, ref.grads)
    rel = np.linalg.norm(model.params - ref.params) / np.linalg.norm(ref.params)
    assert rel <= 1e-10, f"distributed and single-process AdamW differ: {rel:.3e}"

    avg = Sequential([Dense(64, activation="relu"), Dense(10, activation="softmax")], seed=0)
    DataParallelTrainer(avg, spark, num_partitions=2, optimizer=Adam(lr=3e-3), local_steps=11).fit(
        X, y, epochs=8, batch_size=32, verbose=0)
    assert avg.evaluate(Xt, yt)["accuracy"] > 0.93


@pytest.mark.parametrize("pair", [False, True], ids=["blocks", "paired"])
def test_model_parallel_blocks_apply_adam_as_one_process(digits_xy, pair):
    """Each block applies AdamW (amsgrad) to its rows chunk by chunk with its state beside
    it: the blocked network's weights equal one process's to 1e-10 (float64, K = 2)."""
    from sparknet.cluster.model_parallel import ModelParallel
    from sparknet.cluster.model_parallel.block_partition import BlockPlan

    X, y = digits_xy
    layers = [Dense(40, activation="tanh"), Dense(24, activation="relu"), Dense(10, activation="softmax")]
    mp = ModelParallel(layers, BlockPlan({0: 2, 1: 2, 2: 2}, pair=pair), (64,), spark=None, dtype="float64",
                       seed=11, optimizer=AdamW(lr=3e-3, amsgrad=True))
    try:
        ref = mp.to_sequential()
        init = ref.params.copy()
        mp.fit(X[:350], y[:350], epochs=2, batch_size=100, shuffle=False)
        ref.fit(X[:350], y[:350], epochs=2, batch_size=100, shuffle=False, optimizer=AdamW(lr=3e-3, amsgrad=True),
                verbose=0)
        got = mp.to_sequential().params
        assert np.linalg.norm(ref.params - init) / np.linalg.norm(init) > 1e-3
        np.testing.assert_allclose(got, ref.params, rtol=1e-10, atol=1e-12)
    finally:
        mp.close()
