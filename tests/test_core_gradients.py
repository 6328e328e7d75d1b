"""Finite-difference gradient checks (float64, relative error <= 1e-6) of the core layers and losses."""
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from helpers.gradcheck import model_gradcheck, rel_error
from sparknet import Activation, Dense, Dropout, Flatten, Sequential
from sparknet.losses import MeanSquaredError, SoftmaxCrossEntropy

ACTS = ["identity", "relu", "tanh", "sigmoid", "softmax"]
TOL = 1e-6


@settings(max_examples=30, deadline=None)
@given(n=st.integers(1, 6), i=st.integers(1, 9), h=st.integers(1, 8), o=st.integers(1, 7),
       act1=st.sampled_from(ACTS), act2=st.sampled_from(ACTS), bias=st.booleans(),
       seed=st.integers(0, 10_000))
def test_dense_stack_gradients(n, i, h, o, act1, act2, bias, seed):
    model = Sequential([Dense(h, activation=act1, use_bias=bias), Dense(o, activation=act2)],
                       input_shape=(i,), dtype="float64", seed=seed)
    x = np.random.default_rng(seed).standard_normal((n, i))
    p_err, x_err = model_gradcheck(model, x, seed=seed)
    assert p_err <= TOL and x_err <= TOL, (p_err, x_err)


@pytest.mark.parametrize("act", ACTS)
def test_activation_layer_gradients(act):
    model = Sequential([Dense(6), Activation(act), Dense(4), Activation(act)],
                       input_shape=(5,), dtype="float64", seed=7)
    x = np.random.default_rng(7).standard_normal((3, 5))
    p_err, x_err = model_gradcheck(model, x)
    assert p_err <= TOL and x_err <= TOL, (p_err, x_err)


def test_dense_on_a_time_axis_and_flatten_gradients():
    model = Sequential([Dense(4, activation="tanh"), Flatten(), Dense(3)],
                       input_shape=(5, 6), dtype="float64", seed=1)
    x = np.random.default_rng(1).standard_normal((2, 5, 6))
    assert model.forward(x).shape == (2, 3)
    p_err, x_err = model_gradcheck(model, x)
    assert p_err <= TOL and x_err <= TOL


def test_dropout_backward_uses_the_forward_mask():
    layer = Dropout(0.5)
    layer.build((1000,), np.float64)
    x = np.ones((4, 1000))
    y = layer.forward(x, training=True)
    kept = y != 0
    assert 0.4 < kept.mean() < 0.6
    np.testing.assert_allclose(y[kept], 2.0)  # inverted dropout scaling
    dy = np.random.default_rng(0).standard_normal(x.shape)
    np.testing.assert_array_equal(layer.backward(dy), dy * (y / x))
    # identity at inference
    np.testing.assert_array_equal(layer.forward(x, training=False), x)


def test_dropout_gradient_through_a_model_with_a_frozen_mask():
    model = Sequential([Dense(8, activation="tanh"), Dropout(0.3), Dense(3)],
                       input_shape=(4,), dtype="float64", seed=2)
    x = np.random.default_rng(2).standard_normal((5, 4))
    drop = model.layers[1]
    model.forward(x, training=True)
    mask = drop.backward(np.ones((5, 8)))   # dy * mask: the mask this forward drew
    orig = drop.forward
    drop.forward = lambda x_, training=False: (setattr(drop, "_mask", mask) or x_ * mask)
    try:
        p_err, x_err = model_gradcheck(model, x)
    finally:
        drop.forward = orig
    assert p_err <= TOL and x_err <= TOL


def _loss_fd(loss, out, target, weight):
    s, w, g = loss.value_and_grad(out, target, weight=weight)
    num = np.zeros_like(out)
    eps = 1e-6
    flat = out.reshape(-1)
    for j in range(flat.size):
        old = flat[j]
        flat[j] = old + eps
        sp = loss.value_and_grad(out, target, weight=weight, need_grad=False)[0]
        flat[j] = old - eps
        sm = loss.value_and_grad(out, target, weight=weight, need_grad=False)[0]
        flat[j] = old
        num.reshape(-1)[j] = (sp - sm) / (2 * eps) / w
    return rel_error(g, num)


@pytest.mark.parametrize("shape", [(5, 4), (3, 6, 7)])
@pytest.mark.parametrize("weighted", [False, True])
def test_cross_entropy_loss_gradient(shape, weighted):
    rng = np.random.default_rng(5)
    out = rng.standard_normal(shape) * 3
    target = rng.integers(0, shape[-1], shape[:-1])
    weight = (rng.random(shape[:-1]) > 0.3).astype(float) + 0.1 if weighted else None
    assert _loss_fd(SoftmaxCrossEntropy(), out, target, weight) <= TOL


@pytest.mark.parametrize("shape", [(5, 1), (4, 3), (2, 5, 3)])
@pytest.mark.parametrize("weighted", [False, True])
def test_mse_loss_gradient(shape, weighted):
    rng = np.random.default_rng(6)
    out = rng.standard_normal(shape)
    target = rng.standard_normal(shape)
    weight = rng.random(shape[:-1]) if weighted else None
    assert _loss_fd(MeanSquaredError(), out, target, weight) <= TOL


@pytest.mark.parametrize("loss", ["cross_entropy", "mse"])
def test_model_loss_and_grad_matches_finite_differences(loss):
    """End to end: d(mean loss)/d(params) from loss_and_grad, with a softmax head fused or not."""
    model = Sequential([Dense(6, activation="relu"), Dense(4, activation="softmax")],
                       input_shape=(3,), dtype="float64", seed=3, loss=loss)
    rng = np.random.default_rng(3)
    x = rng.standard_normal((7, 3))
    y = rng.integers(0, 4, 7) if loss == "cross_entropy" else rng.random((7, 4))
    s, w, _ = model.loss_and_grad(x, y, training=False)
    ga = model.grads.copy()
    num = np.zeros_like(ga)
    eps = 1e-6
    for i in range(model.params.size):
        old = model.params[i]
        model.params[i] = old + eps
        sp = model.loss_and_grad(x, y, need_grad=False, training=False)[0]
        model.params[i] = old - eps
        sm = model.loss_and_grad(x, y, need_grad=False, training=False)[0]
        model.params[i] = old
        num[i] = (sp - sm) / (2 * eps) / w
    assert rel_error(ga, num) <= TOL
