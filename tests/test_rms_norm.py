"""RMSNormalization (``torch.nn.RMSNorm``, Keras' ``RMSNormalization``): the formula,
forward and gradients against PyTorch (float64), central differences, model files, the
arguments refused, and the same function in PyTorch (both ways) and Keras."""
from __future__ import annotations

import numpy as np
import pytest

from helpers.gradcheck import model_gradcheck, rel_error
from sparknet import Dense, RMSNormalization, Sequential, load_model, save_model

SHAPES = [(7, 5), (4, 3, 5), (3, 4, 2, 5)]  # (N, F), (N, T, F), (N, H, W, C)


def _model(layer, shape, seed=0):
    model = Sequential([layer], input_shape=shape, dtype="float64")
    if "gamma" in layer.params:
        layer.params["gamma"][...] = np.random.default_rng(seed).standard_normal(shape[-1])
    return model


@pytest.mark.parametrize("shape", SHAPES)
def test_the_formula_and_central_differences(shape):
    layer = RMSNormalization(eps=1e-4)
    model = _model(layer, shape[1:])
    x = np.random.default_rng(1).standard_normal(shape) * 3 + 1
    want = x / np.sqrt((x * x).mean(-1, keepdims=True) + 1e-4) * layer.params["gamma"]
    assert rel_error(model.predict_output(x), want) < 1e-14
    assert model.n_params == shape[-1] and [n for n, _ in layer.param_specs()] == ["gamma"]
    net = Sequential([Dense(6, activation="tanh"), RMSNormalization(), Dense(3)],
                     input_shape=shape[1:], dtype="float64")
    p_err, x_err = model_gradcheck(net, x)
    assert p_err < 1e-6 and x_err < 1e-6


@pytest.mark.parametrize("scale", [True, False])
@pytest.mark.parametrize("shape", SHAPES)
def test_forward_and_gradients_match_torch(shape, scale):
    torch = pytest.importorskip("torch", reason="torch not installed: torch comparison skipped")
    layer = RMSNormalization(eps=1e-5, scale=scale)
    model = _model(layer, shape[1:], seed=2)
    rng = np.random.default_rng(3)
    x, R = rng.standard_normal(shape), rng.standard_normal(shape)
    y = model.forward(x, training=True)
    dx = model.backward(R.copy())
    tx = torch.tensor(x, requires_grad=True)
    w = torch.tensor(layer.params["gamma"], requires_grad=True) if scale else None
    ty = torch.nn.functional.rms_norm(tx, (shape[-1],), w, 1e-5)
    ty.backward(torch.tensor(R))
    assert np.abs(y - ty.detach().numpy()).max() < 1e-12
    assert np.abs(dx - tx.grad.numpy()).max() < 1e-12
    if scale:
        assert np.abs(layer.grads["gamma"] - w.grad.numpy()).max() < 1e-12


def test_model_files_and_bad_arguments(tmp_path):
    model = Sequential([Dense(4), RMSNormalization(eps=1e-5, scale=False), Dense(2)],
                       input_shape=(3,), seed=0)
    save_model(model, tmp_path / "rms.npz")
    loaded = load_model(tmp_path / "rms.npz")
    layer = loaded.layers[1]
    assert isinstance(layer, RMSNormalization) and layer.eps == 1e-5 and not layer.scale
    x = np.random.default_rng(4).standard_normal((5, 3)).astype(np.float32)
    assert np.array_equal(loaded.predict_output(x), model.predict_output(x))
    with pytest.raises(ValueError, match=r"RMSNormalization eps"):
        RMSNormalization(eps=0)
    with pytest.raises(TypeError):
        RMSNormalization(center=True)  # no shift to learn


def test_rms_norm_in_and_out_of_torch_and_from_keras(torch, keras):
    from sparknet.interop import from_keras, from_torch, to_torch

    nn = torch.nn
    module = nn.Sequential(nn.Linear(4, 6), nn.RMSNorm(6), nn.SiLU(), nn.Linear(6, 2)).double()
    with torch.no_grad():
        module[1].weight.copy_(torch.rand(6, dtype=torch.float64) + 0.5)
    x = np.random.default_rng(5).standard_normal((7, 4))
    model = from_torch(module)
    assert model.layers[1].eps == np.finfo(np.float64).eps  # eps=None: the float type's
    with torch.no_grad():
        want = module(torch.from_numpy(x)).numpy()
        back = to_torch(model)(torch.from_numpy(x)).numpy()
    assert rel_error(model.predict_output(x), want) < 1e-13
    assert rel_error(back, model.predict_output(x)) < 1e-13
    L = keras.layers
    km = keras.Sequential([keras.Input((5, 4)), L.Dense(6), L.RMSNormalization(epsilon=1e-5)])
    km.layers[-1].scale.assign(np.linspace(0.5, 1.5, 6).astype(np.float32))
    xs = np.random.default_rng(6).standard_normal((3, 5, 4)).astype(np.float32)
    err = rel_error(from_keras(km).predict_output(xs), km.predict(xs, verbose=0))
    assert err < 1e-6
