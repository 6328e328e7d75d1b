"""SiLU (swish) and leaky ReLU, the activations of PyTorch and Keras networks that come in.

- ``silu``: values and derivative against the formula and central differences (float64),
  the float32 kernels against float64 (Dense's fused kernel: in ``test_attention.py``, beside
  the gelus'), ``torch.nn.functional.silu`` and its autograd,
  finite-difference gradchecks through ``Dense`` and ``Activation`` (its derivative needs
  the pre-activation, which the other layers refuse to keep), the ``"swish"`` name.
- ``LeakyReLU``: values and derivative against numpy, gradchecks, float32 against float64,
  slope 0 as ``relu``, bad slopes refused, save and load, ``torch.nn.LeakyReLU``.
- Real data: an MLP using both learns scikit-learn's digits.
"""
from __future__ import annotations

import numpy as np
import pytest

from helpers.gradcheck import model_gradcheck, rel_error
from sparknet import Activation, Conv2D, Dense, LeakyReLU, Sequential, load_model
from sparknet.activations import apply, canonical_name, grad_from_input
from sparknet.datasets import load_digits

TOL = 1e-6


def _silu(z):
    return z / (1 + np.exp(-z))


def test_silu_values_and_derivative_match_the_formula_and_differences():
    rng = np.random.default_rng(0)
    z = rng.standard_normal((6, 9)) * 4
    np.testing.assert_allclose(apply("silu", z), _silu(z), rtol=1e-14, atol=1e-15)
    r = rng.standard_normal(z.shape)
    eps = 1e-6
    num = (_silu(z + eps) - _silu(z - eps)) / (2 * eps) * r
    assert rel_error(grad_from_input("silu", z, r), num) <= 1e-8
    assert canonical_name("swish") == "silu" and canonical_name("SiLU") == "silu"


def test_silu_float32_agrees_with_float64_out_to_large_inputs():
    """The float32 kernel's branch-free e^x is clamped past |z| ~ 88: the values stay z and 0
    there, and within float32 rounding everywhere."""
    z = np.concatenate([np.random.default_rng(2).standard_normal(2000) * 4,
                        [-200.0, -90.0, -30.0, 0.0, 30.0, 90.0, 200.0]]).reshape(1, -1)
    r = np.ones_like(z)
    np.testing.assert_allclose(apply("silu", z.astype(np.float32)), apply("silu", z),
                               rtol=2e-6, atol=2e-6)
    np.testing.assert_allclose(grad_from_input("silu", z.astype(np.float32), r.astype(np.float32)),
                               grad_from_input("silu", z, r), rtol=2e-6, atol=2e-6)


def test_silu_matches_torch():
    torch = pytest.importorskip("torch", reason="torch not installed: torch comparison skipped")
    z = np.random.default_rng(3).standard_normal((7, 11)) * 3
    r = np.random.default_rng(4).standard_normal(z.shape)
    zt = torch.tensor(z, requires_grad=True)
    yt = torch.nn.functional.silu(zt)
    yt.backward(torch.tensor(r))
    np.testing.assert_allclose(apply("silu", z), yt.detach().numpy(), rtol=1e-15, atol=1e-15)
    np.testing.assert_allclose(grad_from_input("silu", z, r), zt.grad.numpy(), rtol=1e-14,
                               atol=1e-14)


def test_dense_and_activation_silu_gradcheck():
    model = Sequential([Dense(6, activation="silu"), Dense(4), Activation("swish")],
                       input_shape=(5,), dtype="float64")
    assert [getattr(layer, "activation", None) for layer in model.layers] == ["silu", "identity", "silu"]
    p_err, x_err = model_gradcheck(model, np.random.default_rng(1).standard_normal((7, 5)))
    assert p_err <= TOL and x_err <= TOL, (p_err, x_err)


def test_silu_is_refused_where_the_pre_activation_is_not_kept():
    with pytest.raises(ValueError, match=r"Conv2D activation 'silu' is not available.*Activation\('silu'\)"):
        Conv2D(4, 3, activation="silu")
    with pytest.raises(ValueError, match=r"unknown activation 'leaky_relu'; choose one of: .*silu "
                                         r"\(leaky ReLU is a layer of its own: LeakyReLU\(negative_slope\)\)"):
        Dense(3, activation="leaky_relu")


# ======================================================================== LeakyReLU
def test_leaky_relu_values_and_gradient():
    z = np.random.default_rng(5).standard_normal((4, 3, 5))
    layer = LeakyReLU(0.2)
    model = Sequential([layer], input_shape=(3, 5), dtype="float64")
    y = model.predict_output(z)
    np.testing.assert_array_equal(y, np.where(z > 0, z, 0.2 * z))
    dy = np.random.default_rng(6).standard_normal(z.shape)
    model.forward(z, training=True)
    np.testing.assert_array_equal(layer.backward(dy), np.where(z > 0, dy, 0.2 * dy))
    # slope 0 is relu
    relu = Sequential([Activation("relu")], input_shape=(3, 5), dtype="float64")
    np.testing.assert_array_equal(Sequential([LeakyReLU(0.0)], input_shape=(3, 5),
                                             dtype="float64").predict_output(z),
                                  relu.predict_output(z))


def test_leaky_relu_gradcheck_and_float32():
    model = Sequential([Dense(6), LeakyReLU(0.1), Dense(4, activation="tanh"), LeakyReLU()],
                       input_shape=(5,), dtype="float64")
    x = np.random.default_rng(1).standard_normal((7, 5))
    p_err, x_err = model_gradcheck(model, x)
    assert p_err <= TOL and x_err <= TOL, (p_err, x_err)
    f32 = model.clone(dtype="float32")
    np.testing.assert_allclose(f32.predict_output(x.astype(np.float32)), model.predict_output(x),
                               rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("bad", [-0.1, 1.5, float("nan"), "0.2", None])
def test_leaky_relu_refuses_a_slope_outside_zero_to_one(bad):
    with pytest.raises(ValueError, match=r"LeakyReLU negative_slope must be in \[0, 1\], got"):
        LeakyReLU(bad)


def test_leaky_relu_and_silu_save_and_load(tmp_path):
    model = Sequential([Dense(6, activation="swish"), LeakyReLU(0.3), Dense(3)], input_shape=(5,),
                       seed=2)
    model.save(tmp_path / "m.npz")
    back = load_model(tmp_path / "m.npz")
    assert back.get_config() == model.get_config()
    assert back.layers[0].activation == "silu" and back.layers[1].negative_slope == pytest.approx(0.3)
    x = np.random.default_rng(0).standard_normal((4, 5)).astype(np.float32)
    np.testing.assert_array_equal(back.predict_output(x), model.predict_output(x))


def test_leaky_relu_matches_torch():
    torch = pytest.importorskip("torch", reason="torch not installed: torch comparison skipped")
    z = np.random.default_rng(3).standard_normal((7, 11)) * 3
    r = np.random.default_rng(4).standard_normal(z.shape)
    model = Sequential([LeakyReLU(0.05)], input_shape=(11,), dtype="float64")
    zt = torch.tensor(z, requires_grad=True)
    yt = torch.nn.LeakyReLU(0.05)(zt)
    yt.backward(torch.tensor(r))
    np.testing.assert_array_equal(model.forward(z, training=True), yt.detach().numpy())
    np.testing.assert_array_equal(model.layers[0].backward(r), zt.grad.numpy())


def test_an_mlp_with_silu_and_leaky_relu_learns_the_digits():
    X, y, Xt, yt = load_digits()
    model = Sequential([Dense(64, activation="silu"), Dense(32), LeakyReLU(0.1),
                        Dense(10, activation="softmax")], seed=0)
    model.fit(X, y, epochs=15, batch_size=32, verbose=0)
    acc = model.evaluate(Xt, yt)["accuracy"]
    print(f"digits test accuracy {acc:.4f}")
    assert acc >= 0.95
