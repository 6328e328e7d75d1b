"""LayerNormalization and BatchNormalization: forward, input and parameter gradients and
running statistics against PyTorch (float64), finite-difference gradients in training and
inference mode, masked statistics, the functional kernels, float32, model files, argument
errors, and an MLP with batch normalisation on digits."""
from __future__ import annotations

import numpy as np
import pytest

import sparknet
from helpers.gradcheck import model_gradcheck, rel_error
from sparknet import (
    Activation,
    BatchNormalization,
    Dense,
    LayerNormalization,
    Sequential,
    _norm,
)
from sparknet.datasets import load_digits

SHAPES = [(7, 5), (4, 3, 5), (3, 4, 2, 5)]  # (N, F), (N, T, F), (N, H, W, C)
AFFINE = [(True, True), (False, False), (True, False), (False, True)]  # (center, scale)


def norm_model(layer, sample_shape, dtype=np.float64):
    return Sequential([layer], input_shape=sample_shape, dtype=dtype)


def randomize_affine(layer, rng):
    for name in ("gamma", "beta"):
        if name in layer.params:
            layer.params[name][...] = rng.standard_normal(layer.params[name].shape)


def torch_affine(torch, layer):
    """``(weight, bias)`` tensors (or None) holding the layer's gamma and beta."""
    w = layer.params.get("gamma")
    b = layer.params.get("beta")
    w = None if w is None else torch.tensor(w, requires_grad=True)
    b = None if b is None else torch.tensor(b, requires_grad=True)
    return w, b


def channels_first(t):
    return t.movedim(-1, 1)


def channels_last(t):
    return t.movedim(1, -1)


def max_diff(a, b):
    return float(np.max(np.abs(np.asarray(a) - np.asarray(b))))


# ------------------------------------------------------------------ against PyTorch
@pytest.mark.parametrize("shape", SHAPES)
@pytest.mark.parametrize("center,scale", AFFINE)
def test_layer_norm_forward_and_gradients_match_torch(shape, center, scale):
    torch = pytest.importorskip("torch", reason="torch not installed: torch comparison skipped")
    rng = np.random.default_rng(1)
    layer = LayerNormalization(eps=1e-3, center=center, scale=scale)
    model = norm_model(layer, shape[1:])
    randomize_affine(layer, rng)
    x = 2.0 * rng.standard_normal(shape) + 0.5
    R = rng.standard_normal(shape)
    y = model.forward(x, training=True)
    dx = model.backward(R.copy())

    tx = torch.tensor(x, requires_grad=True)
    w, b = torch_affine(torch, layer)
    ty = torch.nn.functional.layer_norm(tx, (shape[-1],), w, b, 1e-3)
    ty.backward(torch.tensor(R))
    assert max_diff(y, ty.detach().numpy()) < 1e-12
    assert max_diff(dx, tx.grad.numpy()) < 1e-12
    if scale:
        assert max_diff(layer.grads["gamma"], w.grad.numpy()) < 1e-12
    if center:
        assert max_diff(layer.grads["beta"], b.grad.numpy()) < 1e-12
    assert model.n_params == (scale + center) * shape[-1]


def test_layer_norm_without_affine_is_torch_elementwise_affine_false():
    torch = pytest.importorskip("torch", reason="torch not installed: torch comparison skipped")
    x = np.random.default_rng(2).standard_normal((6, 3, 4))
    ln = torch.nn.LayerNorm(4, eps=1e-5, elementwise_affine=False, dtype=torch.float64)
    y = norm_model(LayerNormalization(center=False, scale=False), (3, 4)).forward(x)
    assert max_diff(y, ln(torch.tensor(x)).numpy()) < 1e-12


@pytest.mark.parametrize("shape", SHAPES)
@pytest.mark.parametrize("center,scale", AFFINE)
def test_batch_norm_training_and_running_stats_match_torch(shape, center, scale):
    torch = pytest.importorskip("torch", reason="torch not installed: torch comparison skipped")
    tf = torch.nn.functional
    rng = np.random.default_rng(3)
    layer = BatchNormalization(momentum=0.3, eps=1e-3, center=center, scale=scale)
    model = norm_model(layer, shape[1:])
    randomize_affine(layer, rng)
    w, b = torch_affine(torch, layer)
    F = shape[-1]
    run_mean, run_var = torch.zeros(F, dtype=torch.float64), torch.ones(F, dtype=torch.float64)
    for step in range(4):  # training steps on different batches
        x = (1.5 + step) * rng.standard_normal(shape) + rng.standard_normal(F) * 3
        R = rng.standard_normal(shape)
        y = model.forward(x, training=True)
        dx = model.backward(R.copy())
        tx = torch.tensor(x, requires_grad=True)
        for t in (w, b):
            if t is not None:
                t.grad = None
        ty = tf.batch_norm(channels_first(tx), run_mean, run_var, w, b, True, 0.3, 1e-3)
        ty.backward(channels_first(torch.tensor(R)))
        assert max_diff(y, channels_last(ty).detach().numpy()) < 1e-12
        assert max_diff(dx, tx.grad.numpy()) < 1e-11
        if scale:
            assert max_diff(layer.grads["gamma"], w.grad.numpy()) < 1e-11
        if center:
            assert max_diff(layer.grads["beta"], b.grad.numpy()) < 1e-12
        assert max_diff(layer.state["running_mean"], run_mean.numpy()) < 1e-12
        assert max_diff(layer.state["running_var"], run_var.numpy()) < 1e-12

    # inference (eval mode): the running statistics normalise; gradients still flow
    x = rng.standard_normal(shape)
    R = rng.standard_normal(shape)
    state_before = model.state.copy()
    y = model.forward(x, training=False)
    dx = model.backward(R.copy())
    np.testing.assert_array_equal(model.state, state_before)
    tx = torch.tensor(x, requires_grad=True)
    for t in (w, b):
        if t is not None:
            t.grad = None
    ty = tf.batch_norm(channels_first(tx), run_mean, run_var, w, b, False, 0.3, 1e-3)
    ty.backward(channels_first(torch.tensor(R)))
    assert max_diff(y, channels_last(ty).detach().numpy()) < 1e-12
    assert max_diff(dx, tx.grad.numpy()) < 1e-12
    if scale:
        assert max_diff(layer.grads["gamma"], w.grad.numpy()) < 1e-12
    if center:
        assert max_diff(layer.grads["beta"], b.grad.numpy()) < 1e-12


def test_batch_norm_modules_match_torch_batchnorm1d_and_2d():
    torch = pytest.importorskip("torch", reason="torch not installed: torch comparison skipped")
    rng = np.random.default_rng(4)
    for shape, module in (((8, 3), torch.nn.BatchNorm1d(3, dtype=torch.float64)),
                          ((4, 5, 5, 3), torch.nn.BatchNorm2d(3, dtype=torch.float64))):
        model = norm_model(BatchNormalization(), shape[1:])
        for _ in range(3):
            x = rng.standard_normal(shape) + 2
            y = model.forward(x, training=True)
            ty = channels_last(module(channels_first(torch.tensor(x)))).detach().numpy()
            assert max_diff(y, ty) < 1e-12
        assert max_diff(model.state, np.concatenate([module.running_mean.numpy(),
                                                     module.running_var.numpy()])) < 1e-12
        module.eval()
        x = rng.standard_normal(shape)
        ty = channels_last(module(channels_first(torch.tensor(x)))).detach().numpy()
        assert max_diff(model.predict_output(x), ty) < 1e-12


# ------------------------------------------------------------------ without PyTorch
def numpy_batch_norm(x, gamma, beta, eps):
    x2 = x.reshape(-1, x.shape[-1])
    mu, var = x2.mean(0), x2.var(0)
    return ((x2 - mu) / np.sqrt(var + eps) * gamma + beta).reshape(x.shape), mu, var


def test_batch_norm_matches_numpy_formulas_and_momentum_rule():
    rng = np.random.default_rng(5)
    layer = BatchNormalization(momentum=0.25, eps=1e-2)
    model = norm_model(layer, (3, 4))
    randomize_affine(layer, rng)
    rm, rv = np.zeros(4), np.ones(4)
    for _ in range(3):
        x = rng.standard_normal((5, 3, 4)) * 4 - 1
        y = model.forward(x, training=True)
        ref, mu, var = numpy_batch_norm(x, layer.params["gamma"], layer.params["beta"], 1e-2)
        np.testing.assert_allclose(y, ref, rtol=1e-12, atol=1e-12)
        n = 15
        rm = 0.75 * rm + 0.25 * mu
        rv = 0.75 * rv + 0.25 * var * n / (n - 1)
        np.testing.assert_allclose(layer.state["running_mean"], rm, rtol=1e-12, atol=1e-14)
        np.testing.assert_allclose(layer.state["running_var"], rv, rtol=1e-12)
    x = rng.standard_normal((2, 3, 4))
    ref = (x - rm) / np.sqrt(rv + 1e-2) * layer.params["gamma"] + layer.params["beta"]
    np.testing.assert_allclose(model.forward(x, training=False), ref, rtol=1e-12, atol=1e-12)


def test_momentum_zero_keeps_and_one_replaces_the_running_statistics():
    x = np.random.default_rng(6).standard_normal((9, 2))
    keep = norm_model(BatchNormalization(momentum=0.0), (2,))
    keep.forward(x, training=True)
    np.testing.assert_array_equal(keep.state, [0, 0, 1, 1])
    replace = norm_model(BatchNormalization(momentum=1.0), (2,))
    replace.forward(x, training=True)
    np.testing.assert_allclose(replace.state, np.r_[x.mean(0), x.var(0, ddof=1)], rtol=1e-12)


def test_layer_norm_matches_numpy_formula():
    rng = np.random.default_rng(7)
    layer = LayerNormalization(eps=1e-4)
    model = norm_model(layer, (3, 6))
    randomize_affine(layer, rng)
    x = rng.standard_normal((4, 3, 6)) * 10 + 100  # a large offset: the variance must not cancel
    ref = ((x - x.mean(-1, keepdims=True)) / np.sqrt(x.var(-1, keepdims=True) + 1e-4)
           * layer.params["gamma"] + layer.params["beta"])
    np.testing.assert_allclose(model.forward(x), ref, rtol=1e-11, atol=1e-11)


@pytest.mark.parametrize("shape", SHAPES)
def test_finite_difference_gradients_inference_mode(shape):
    rng = np.random.default_rng(8)
    model = Sequential([Dense(6, activation="tanh"), LayerNormalization(),
                        BatchNormalization(), Dense(3)], input_shape=shape[1:], dtype=np.float64)
    model.state[...] = np.abs(rng.standard_normal(model.n_state)) + 0.5  # non-trivial statistics
    p_err, x_err = model_gradcheck(model, rng.standard_normal(shape))
    assert p_err < 1e-6 and x_err < 1e-6


def training_gradcheck(model, x, mask=None, eps=1e-6, seed=0):
    """Central differences of ``sum(R * forward(x, training=True))`` against the analytic
    gradients of every parameter and every input (the batch statistics move with x)."""
    rng = np.random.default_rng(seed)
    model.params[...] = 0.5 * rng.standard_normal(model.params.shape)
    state = model.state.copy()
    R = rng.standard_normal(model.forward(x, training=True, mask=mask).shape)

    def f():
        return float((model.forward(x, training=True, mask=mask) * R).sum())

    model.forward(x, training=True, mask=mask)
    dx = model.backward(R.copy())
    ga = model.grads.copy()
    num_p = np.empty(model.n_params)
    for i in range(model.n_params):
        old = model.params[i]
        model.params[i] = old + eps
        fp = f()
        model.params[i] = old - eps
        num_p[i] = (fp - f()) / (2 * eps)
        model.params[i] = old
    xf = x.reshape(-1)
    num_x = np.empty(xf.size)
    for j in range(xf.size):
        old = xf[j]
        xf[j] = old + eps
        fp = f()
        xf[j] = old - eps
        num_x[j] = (fp - f()) / (2 * eps)
        xf[j] = old
    model.state[...] = state
    return rel_error(ga, num_p), rel_error(dx, num_x)


@pytest.mark.parametrize("shape", SHAPES)
@pytest.mark.parametrize("center,scale", [(True, True), (False, False)])
def test_finite_difference_gradients_training_mode(shape, center, scale):
    model = Sequential([Dense(4, activation="tanh"),
                        BatchNormalization(center=center, scale=scale),
                        LayerNormalization(center=center, scale=scale), Dense(2)],
                       input_shape=shape[1:], dtype=np.float64)
    x = np.random.default_rng(9).standard_normal(shape)
    p_err, x_err = training_gradcheck(model, x)
    assert p_err < 1e-7 and x_err < 1e-7


def test_masked_sequences_take_statistics_over_real_steps_only():
    rng = np.random.default_rng(10)
    x = rng.standard_normal((3, 5, 4))
    mask = np.array([[1, 1, 1, 0, 0], [1, 1, 1, 1, 1], [1, 1, 0, 0, 0]])
    layer = BatchNormalization(momentum=1.0)
    model = norm_model(layer, (5, 4))
    y = model.forward(x, training=True, mask=mask)
    real = x[mask.astype(bool)]  # (10, 4)
    mu, var = real.mean(0), real.var(0)
    np.testing.assert_allclose(y, (x - mu) / np.sqrt(var + 1e-5), rtol=1e-12, atol=1e-12)
    np.testing.assert_allclose(layer.state["running_var"], real.var(0, ddof=1), rtol=1e-12)
    x2 = x.copy()
    x2[~mask.astype(bool)] = 1e3  # padded values do not change the statistics
    np.testing.assert_allclose(model.forward(x2, training=True, mask=mask)[mask.astype(bool)],
                               y[mask.astype(bool)], rtol=1e-12, atol=1e-12)
    # gradients with a mask, where padded steps still pass their own output gradient
    gmodel = Sequential([Dense(3, activation="tanh"), BatchNormalization(), Dense(2)],
                        input_shape=(5, 4), dtype=np.float64)
    p_err, x_err = training_gradcheck(gmodel, x.copy(), mask=mask)
    assert p_err < 1e-7 and x_err < 1e-7


# ------------------------------------------------------------------ the functional kernels
def test_functional_kernels_work_in_place_and_without_gradients_asked():
    rng = np.random.default_rng(11)
    x = rng.standard_normal((6, 8))
    g, b = rng.standard_normal(8), rng.standard_normal(8)
    y = np.empty_like(x)
    mean, rstd = np.empty(6), np.empty(6)
    _norm.layer_norm_forward(x, g, b, 1e-5, y, mean, rstd)
    xi = x.copy()
    _norm.layer_norm_forward(xi, g, b, 1e-5, xi, mean, rstd)  # y written over x
    np.testing.assert_array_equal(xi, y)
    np.testing.assert_allclose(mean, x.mean(1), rtol=1e-13)
    np.testing.assert_allclose(rstd, 1 / np.sqrt(x.var(1) + 1e-5), rtol=1e-13)
    dy = rng.standard_normal((6, 8))
    dx, dg, db = np.empty_like(x), np.empty(8), np.empty(8)
    _norm.layer_norm_backward(dy, x, mean, rstd, g, dx, dg, db)
    d2 = dy.copy()
    _norm.layer_norm_backward(d2, x, mean, rstd, g, d2, None, None)  # dx over dy, no dgamma
    np.testing.assert_array_equal(d2, dx)
    np.testing.assert_allclose(db, dy.sum(0), rtol=1e-13)

    bmean, brstd = np.empty(8), np.empty(8)
    _norm.batch_norm_forward(x, g, b, None, None, 0.1, 1e-5, True, y, bmean, brstd)
    np.testing.assert_allclose(bmean, x.mean(0), rtol=1e-12)
    with pytest.raises(ValueError, match="shape mismatch"):
        _norm.batch_norm_forward(x, g[:3], b, None, None, 0.1, 1e-5, True, y, bmean, brstd)
    with pytest.raises(ValueError, match="inference needs running_mean"):
        _norm.batch_norm_forward(x, g, b, None, None, 0.1, 1e-5, False, y, bmean, brstd)
    with pytest.raises(ValueError, match="Expected more than 1 value per channel"):
        _norm.batch_norm_forward(x[:1], g, b, None, None, 0.1, 1e-5, True, y[:1], bmean, brstd)


# ------------------------------------------------------------------ float32
@pytest.mark.parametrize("kind", ["layer", "batch"])
def test_float32_agrees_with_float64(kind):
    rng = np.random.default_rng(12)
    x = rng.standard_normal((16, 3, 3, 8)) * 3 + 1
    R = rng.standard_normal(x.shape)
    out = {}
    for dtype in (np.float32, np.float64):
        layer = LayerNormalization() if kind == "layer" else BatchNormalization()
        model = Sequential([Dense(8), layer], input_shape=(3, 3, 8), dtype=dtype, seed=3)
        y = model.forward(x.astype(dtype), training=True)
        dx = model.backward(R.astype(dtype))
        assert y.dtype == dtype and dx.dtype == dtype and model.state.dtype == dtype
        out[dtype] = (y, dx, model.grads.copy(), model.state.copy())
    for a, b in zip(out[np.float32], out[np.float64]):
        if b.size:
            assert np.abs(a - b).max() <= 1e-4 * max(np.abs(b).max(), 1.0)


# ------------------------------------------------------------------ model files
def test_save_and_load_restore_the_running_statistics(tmp_path):
    rng = np.random.default_rng(13)
    X = rng.standard_normal((64, 6)).astype(np.float32) * 2 + 1
    y = (X[:, 0] > 1).astype(np.int64)
    model = Sequential([Dense(8), BatchNormalization(momentum=0.2), Activation("relu"),
                        LayerNormalization(eps=1e-3), Dense(2, activation="softmax")],
                       input_shape=(6,))
    model.fit(X, y, epochs=2, batch_size=16, verbose=0)
    assert not np.array_equal(model.state, np.r_[np.zeros(8), np.ones(8)])
    path = tmp_path / "bn.sparknet"
    model.save(path)
    loaded = sparknet.load_model(path)
    np.testing.assert_array_equal(loaded.state, model.state)
    np.testing.assert_array_equal(loaded.params, model.params)
    bn = loaded.layers[1]
    assert isinstance(bn, BatchNormalization) and bn.momentum == 0.2
    assert loaded.layers[3].eps == 1e-3
    np.testing.assert_array_equal(loaded.predict_proba(X), model.predict_proba(X))


# ------------------------------------------------------------------ errors
@pytest.mark.parametrize("kwargs,message", [
    ({"momentum": -0.1}, r"BatchNormalization momentum must be in \[0, 1\], got -0.1"),
    ({"momentum": 1.5}, r"BatchNormalization momentum must be in \[0, 1\], got 1.5"),
    ({"momentum": None}, r"BatchNormalization momentum must be in \[0, 1\], got None"),
    ({"eps": 0}, r"BatchNormalization eps must be a positive finite number, got 0"),
    ({"eps": float("nan")}, r"BatchNormalization eps must be a positive finite number, got nan"),
    ({"center": "yes"}, r"BatchNormalization center must be True or False, got 'yes'"),
    ({"scale": 2}, r"BatchNormalization scale must be True or False, got 2"),
])
def test_batch_norm_bad_arguments_are_named(kwargs, message):
    with pytest.raises(ValueError, match=message):
        BatchNormalization(**kwargs)


@pytest.mark.parametrize("kwargs,message", [
    ({"eps": -1e-5}, r"LayerNormalization eps must be a positive finite number, got -1e-05"),
    ({"eps": "small"}, r"LayerNormalization eps must be a positive finite number, got 'small'"),
    ({"center": None}, r"LayerNormalization center must be True or False, got None"),
    ({"scale": "no"}, r"LayerNormalization scale must be True or False, got 'no'"),
])
def test_layer_norm_bad_arguments_are_named(kwargs, message):
    with pytest.raises(ValueError, match=message):
        LayerNormalization(**kwargs)


def test_training_on_one_value_per_channel_raises_like_torch():
    model = norm_model(BatchNormalization(name="bn"), (4,))
    with pytest.raises(ValueError, match=r"'bn': Expected more than 1 value per channel when "
                                         r"training, got input shape \(1, 4\)"):
        model.forward(np.ones((1, 4)), training=True)
    model.forward(np.ones((1, 4)), training=False)  # inference takes a single sample
    seq = norm_model(BatchNormalization(), (3, 4))
    seq.forward(np.random.default_rng(0).standard_normal((1, 3, 4)), training=True)  # 3 values
    with pytest.raises(ValueError, match="Expected more than 1 value per channel"):
        seq.forward(np.ones((2, 3, 4)), training=True, mask=np.array([[1, 0, 0], [0, 0, 0]]))


def test_wrong_feature_count_is_reported():
    model = norm_model(LayerNormalization(name="ln"), (3, 4))
    with pytest.raises(ValueError, match=r"LayerNormalization 'ln' expects a batch \(N, ..., 4\)"):
        model.layers[0].forward(np.ones((2, 3, 5)))


# ------------------------------------------------------------------ real data
def test_mlp_with_batch_norm_learns_digits_and_predicts_with_running_statistics():
    Xtr, ytr, Xte, yte = load_digits()
    model = Sequential([Dense(128), BatchNormalization(), Activation("relu"),
                        Dense(64), BatchNormalization(), Activation("relu"),
                        Dense(10, activation="softmax")], input_shape=(64,), seed=1)
    model.fit(Xtr, ytr, epochs=12, batch_size=32, optimizer="adam", verbose=0)
    accuracy = float((model.predict(Xte) == yte).mean())
    assert accuracy >= 0.95, accuracy
    # inference uses the running statistics: a sample's output does not depend on its batch
    one = np.concatenate([model.predict_proba(Xte[i:i + 1]) for i in range(5)])
    np.testing.assert_allclose(one, model.predict_proba(Xte)[:5], rtol=1e-5, atol=1e-6)
    # and they are not the initial ones
    assert np.abs(model.layers[1].state["running_mean"]).max() > 0.1
