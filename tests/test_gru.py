"""GRU layer: finite-difference gradients in float64 (masks, return_sequences, stacks, a carried
state), equality with ``torch.nn.GRU`` forward and backward (also on padded batches through
``pack_padded_sequence``), the float32 AVX-512 path against the BLAS path, padded batches
against each sequence alone, model files, and training on real data (scikit-learn's digits
read row by row).
"""
from __future__ import annotations

import time

import numpy as np
import pytest
from threadpoolctl import threadpool_limits

from helpers.gradcheck import model_gradcheck
from sparknet import GRU, LSTM, Dense, Embedding, Sequential, _recurrent
from sparknet.data import lengths_to_mask, pad_sequences
from sparknet.layers.recurrent import reset_states
from sparknet.optim import RMSprop

TOL = 1e-6
N, T, F, H = 3, 5, 4, 5
PARAMS = ("weight_ih", "weight_hh", "bias_ih", "bias_hh")


def _x(seed=0, shape=(N, T, F)):
    return np.random.default_rng(seed).standard_normal(shape)


def _mask(kind):
    return None if kind is None else lengths_to_mask(np.array([5, 3, 1]), T, padding=kind)


def _set_random_params(model, seed=1, scale=0.5):
    model.params[...] = np.random.default_rng(seed).uniform(-scale, scale, model.params.shape)


# --------------------------------------------------------------------------- gradients
@pytest.mark.parametrize("return_sequences", [True, False])
@pytest.mark.parametrize("mask_kind", [None, "post", "pre"])
def test_gradcheck_single_layer(return_sequences, mask_kind):
    model = Sequential([GRU(H, return_sequences=return_sequences)], input_shape=(T, F),
                       dtype="float64")
    _set_random_params(model)
    p_err, x_err = model_gradcheck(model, _x(), mask=_mask(mask_kind))
    print(f"GRU gradcheck return_sequences={return_sequences} mask={mask_kind}: "
          f"params {p_err:.1e}, input {x_err:.1e}")
    assert p_err <= TOL, p_err
    assert x_err <= TOL, x_err


@pytest.mark.parametrize("mask_kind", [None, "post", "pre"])
def test_gradcheck_stacked(mask_kind):
    model = Sequential([GRU(H, return_sequences=True), LSTM(4, return_sequences=True),
                        GRU(3, return_sequences=mask_kind != "pre"), Dense(2, activation="tanh")],
                       input_shape=(T, F), dtype="float64")
    _set_random_params(model, seed=3)
    p_err, x_err = model_gradcheck(model, _x(1), mask=_mask(mask_kind), max_params=600)
    assert p_err <= TOL, p_err
    assert x_err <= TOL, x_err


def test_gradcheck_embedding_gru():
    model = Sequential([Embedding(7, 3), GRU(H, return_sequences=True), Dense(7, activation="softmax")],
                       input_shape=(T,), dtype="float64")
    ids = np.random.default_rng(5).integers(0, 7, size=(N, T))
    p_err, x_err = model_gradcheck(model, ids, mask=_mask("post"), max_params=500)
    assert x_err is None
    assert p_err <= TOL, p_err


class _FixedStartModel(Sequential):
    """Resets its stateful layers to given states before every forward (for gradchecks)."""

    start: dict = {}

    def forward(self, x, training=False, mask=None):
        for layer, st in self.start.items():
            layer.reset_states(st)
        return super().forward(x, training, mask)


def test_gradcheck_stateful_truncated():
    """With a carried state, the gradient is that of the chunk with its start state held fixed."""
    layer = GRU(H, return_sequences=True, stateful=True)
    model = _FixedStartModel([layer], input_shape=(T, F), dtype="float64")
    _set_random_params(model, seed=6)
    model.start = {layer: np.random.default_rng(7).standard_normal((N, H)) * 0.5}
    p_err, x_err = model_gradcheck(model, _x(3), mask=_mask("post"))
    assert p_err <= TOL and x_err <= TOL, (p_err, x_err)


# --------------------------------------------------------------------------- vs PyTorch
def _torch():
    try:
        import torch
    except ImportError as exc:  # pragma: no cover - torch is installed here
        pytest.skip(f"PyTorch is not importable ({exc}); the comparison with torch.nn.GRU needs it")
    return torch


def _torch_gru(model, layer_index, dtype, torch):
    """A ``torch.nn.GRU`` holding the weights of ``model.layers[layer_index]``."""
    layer = model.layers[layer_index]
    mod = torch.nn.GRU(layer.in_features, layer.units, batch_first=True)
    mod = mod.double() if dtype == "float64" else mod.float()
    sl = model.param_slices()[layer_index]
    with torch.no_grad():
        for nm in PARAMS:
            a, b, shape = sl[nm]
            getattr(mod, nm + "_l0").copy_(torch.from_numpy(model.params[a:b].reshape(shape).copy()))
    return mod


def _max_diffs(model, mod, y, yt, dx, xt_grad):
    """Max abs differences: output, input gradient, each parameter gradient."""
    sl = model.param_slices()[0]
    out = {"y": float(np.abs(y - yt).max()), "dx": float(np.abs(dx - xt_grad).max())}
    for nm in PARAMS:
        a, b, shape = sl[nm]
        out[nm] = float(np.abs(model.grads[a:b].reshape(shape) - getattr(mod, nm + "_l0").grad.numpy()).max())
    return out


# (N, T, F, H): small, and shapes that cut the float32 kernel's 8-row and 32-column blocks
@pytest.mark.parametrize("shape", [(4, 7, 4, 5), (11, 9, 13, 37), (16, 6, 8, 64)])
@pytest.mark.parametrize("return_sequences", [True, False])
@pytest.mark.parametrize("dtype", ["float64", "float32"])
def test_equals_torch(shape, return_sequences, dtype):
    torch = _torch()
    n, t, f, h = shape
    model = Sequential([GRU(h, return_sequences=return_sequences)], input_shape=(t, f), dtype=dtype)
    _set_random_params(model, seed=8)
    mod = _torch_gru(model, 0, dtype, torch)
    x = _x(9, (n, t, f)).astype(dtype)
    y = model.forward(x.copy())
    R = np.random.default_rng(10).standard_normal(y.shape).astype(dtype)
    dx = model.backward(R.copy())
    xt = torch.from_numpy(x.copy()).requires_grad_(True)
    yt, hT = mod(xt)
    out = yt if return_sequences else hT[0]
    (out * torch.from_numpy(R)).sum().backward()
    d = _max_diffs(model, mod, y, out.detach().numpy(), dx, xt.grad.numpy())
    print(f"GRU vs torch.nn.GRU {dtype} {shape} return_sequences={return_sequences}: max abs diff "
          + ", ".join(f"{k} {v:.1e}" for k, v in d.items()))
    tol = dict(rtol=1e-10, atol=1e-12) if dtype == "float64" else dict(rtol=1e-4, atol=2e-5)
    np.testing.assert_allclose(y, out.detach().numpy(), **tol)
    np.testing.assert_allclose(dx, xt.grad.numpy(), **tol)
    sl = model.param_slices()[0]
    for nm in PARAMS:
        a, b, shp = sl[nm]
        np.testing.assert_allclose(model.grads[a:b].reshape(shp), getattr(mod, nm + "_l0").grad.numpy(),
                                   **tol)


@pytest.mark.parametrize("dtype", ["float64", "float32"])
def test_masked_batch_equals_torch_packed_sequence(dtype):
    """Post-padded sequences with a mask give what ``torch.nn.GRU`` gives on the packed batch:
    the state at each sequence's last valid step, and the same gradients."""
    torch = _torch()
    lengths = np.array([9, 3, 6, 1, 9, 5, 2, 8, 7, 4, 9])
    n, t, f, h = len(lengths), 9, 6, 40
    model = Sequential([GRU(h)], input_shape=(t, f), dtype=dtype)
    _set_random_params(model, seed=11)
    mod = _torch_gru(model, 0, dtype, torch)
    x = _x(12, (n, t, f)).astype(dtype)
    mask = lengths_to_mask(lengths, t, padding="post")
    y = model.forward(x.copy(), mask=mask)
    R = np.random.default_rng(13).standard_normal(y.shape).astype(dtype)
    dx = model.backward(R.copy())
    xt = torch.from_numpy(x.copy()).requires_grad_(True)
    packed = torch.nn.utils.rnn.pack_padded_sequence(xt, torch.from_numpy(lengths), batch_first=True,
                                                     enforce_sorted=False)
    _, hT = mod(packed)
    (hT[0] * torch.from_numpy(R)).sum().backward()
    d = _max_diffs(model, mod, y, hT[0].detach().numpy(), dx, xt.grad.numpy())
    print(f"masked GRU vs packed torch.nn.GRU {dtype}: max abs diff "
          + ", ".join(f"{k} {v:.1e}" for k, v in d.items()))
    tol = 1e-12 if dtype == "float64" else 2e-5
    assert max(d.values()) <= tol, d
    np.testing.assert_array_equal(dx[~mask], 0.0)


def _need_step_kernel():
    if not _recurrent.step_kernel_available():
        pytest.skip("this CPU has neither AVX-512 nor AVX2 with FMA (or SPARKNET_STEP_ISA=blas): "
                    "the float32 step kernels are not used (BLAS is)")


def test_float32_step_kernel_equals_blas_path():
    _need_step_kernel()
    model = Sequential([GRU(40, return_sequences=True), GRU(33, return_sequences=True), GRU(24)],
                       input_shape=(9, 6), dtype="float32", seed=2)
    x = _x(60, (11, 9, 6)).astype(np.float32)
    mask = lengths_to_mask(np.array([9, 3, 5, 9, 1, 9, 2, 8, 9, 4, 6]), 9, padding="pre")
    R = np.random.default_rng(61).standard_normal((11, 24)).astype(np.float32)
    results = []
    try:
        for own in (True, False):
            _recurrent.use_step_kernel(own)
            y = model.forward(x, mask=mask)
            dx = model.backward(R.copy())
            results.append((y, dx, model.grads.copy()))
    finally:
        _recurrent.use_step_kernel(True)
    assert np.abs(results[0][2]).max() > 0, "no gradient flowed"
    for a, b in zip(results[0], results[1]):
        np.testing.assert_allclose(a, b, rtol=1e-4, atol=1e-5)


# --------------------------------------------------------------------------- masks / state
@pytest.mark.parametrize("padding", ["post", "pre"])
@pytest.mark.parametrize("return_sequences", [True, False])
def test_padded_batch_equals_each_sequence_alone(padding, return_sequences):
    lengths = [6, 2, 4, 1, 6]
    rng = np.random.default_rng(20)
    seqs = [rng.standard_normal((L, F)) for L in lengths]
    X, mask = pad_sequences(seqs, padding=padding, dtype=np.float64)
    layers = [GRU(H, return_sequences=True), GRU(4, return_sequences=return_sequences), Dense(3)]
    model = Sequential(layers, input_shape=(X.shape[1], F), dtype="float64")
    _set_random_params(model, seed=21)
    if return_sequences:   # the recurrent layers output zeros at padded steps
        np.testing.assert_array_equal(layers[0].forward(X, mask=mask)[~mask], 0.0)
    out = model.forward(X, mask=mask)
    R = np.random.default_rng(22).standard_normal(out.shape)
    if return_sequences:
        R *= mask[:, :, None]     # the loss of a padded step is zero (as Sequential weights it)
    dx = model.backward(R.copy())
    g_batch = model.grads.copy()
    g_sum = np.zeros_like(g_batch)
    for i, s in enumerate(seqs):
        valid = np.nonzero(mask[i])[0]
        o = model.forward(s[None])
        d = model.backward((R[i:i + 1, valid] if return_sequences else R[i:i + 1]).copy())
        g_sum += model.grads
        np.testing.assert_allclose(out[i, valid] if return_sequences else out[i], o[0],
                                   rtol=1e-12, atol=1e-14)
        np.testing.assert_allclose(dx[i, valid], d[0], rtol=1e-10, atol=1e-13)
        np.testing.assert_array_equal(dx[i, ~mask[i]], 0.0)
    np.testing.assert_allclose(g_batch, g_sum, rtol=1e-10, atol=1e-12)


def test_stateful_chunks_equal_the_whole_sequence():
    full = Sequential([GRU(H, return_sequences=True)], input_shape=(12, F), dtype="float64")
    chunked = Sequential([GRU(H, return_sequences=True, stateful=True)], input_shape=(4, F),
                         dtype="float64")
    _set_random_params(full, seed=40)
    chunked.params[...] = full.params
    x = _x(41, (3, 12, F))
    whole = full.forward(x)
    parts = [chunked.forward(x[:, k:k + 4]) for k in range(0, 12, 4)]
    np.testing.assert_allclose(np.concatenate(parts, axis=1), whole, rtol=1e-12, atol=1e-14)
    reset_states(chunked)
    np.testing.assert_allclose(chunked.forward(x[:, 4:8]), full.forward(x[:, 4:8]), rtol=1e-12, atol=1e-14)
    with pytest.raises(ValueError, match="fixed batch size"):
        chunked.forward(x[:2, :4])


# --------------------------------------------------------------------------- config, files, errors
def test_config_and_model_file_round_trip(tmp_path):
    layer = GRU(6, return_sequences=True, kernel_initializer="he_uniform", name="enc")
    cfg = layer.get_config()
    assert cfg == {"units": 6, "return_sequences": True, "stateful": False,
                   "kernel_initializer": "he_uniform", "recurrent_initializer": "orthogonal",
                   "name": "enc"}
    assert GRU(**cfg).get_config() == cfg
    model = Sequential([Embedding(6, 3, mask_zero=True), layer, GRU(4), Dense(2, activation="softmax")],
                       input_shape=(4,))
    X = np.array([[1, 2, 3, 0], [4, 5, 0, 0]])
    path = tmp_path / "gru.npz"
    model.save(path)
    again = Sequential.load(path)
    assert [type(l).__name__ for l in again.layers] == ["Embedding", "GRU", "GRU", "Dense"]
    assert again.layers[1].get_config() == cfg
    np.testing.assert_array_equal(again.predict_proba(X), model.predict_proba(X))


def test_argument_and_shape_errors():
    with pytest.raises(ValueError, match="GRU units"):
        GRU(0)
    with pytest.raises(ValueError, match="return_sequences"):
        GRU(3, return_sequences="yes")
    with pytest.raises(ValueError, match="takes sequences"):
        Sequential([GRU(3)], input_shape=(4,))
    model = Sequential([GRU(3)], input_shape=(T, F), dtype="float64")
    with pytest.raises(ValueError, match=r"expects input of shape \(N, T, 4\)"):
        model.forward(np.zeros((2, T, F + 1)))
    with pytest.raises(ValueError, match="mask has shape"):
        model.forward(_x(), mask=np.ones((N, T + 1)))
    with pytest.raises(ValueError, match="not stateful"):
        model.layers[0].reset_states(np.zeros((N, 3)))


# --------------------------------------------------------------------------- training on real data
def test_digits_as_sequences_reach_95_percent():
    from sparknet.datasets import load_digits

    Xtr, ytr, Xte, yte = load_digits()
    Xtr, Xte = Xtr.reshape(-1, 8, 8), Xte.reshape(-1, 8, 8)   # 8 steps of 8 pixels (rows)
    model = Sequential([GRU(64), Dense(10, activation="softmax")], input_shape=(8, 8), seed=0)
    t0 = time.perf_counter()
    with threadpool_limits(1):
        hist = model.fit(Xtr, ytr, epochs=30, batch_size=32, optimizer=RMSprop(lr=3e-3), verbose=0)
        acc = model.evaluate(Xte, yte)["accuracy"]
    print(f"GRU on digits as sequences: test accuracy {acc:.4f} after {time.perf_counter() - t0:.1f} s "
          f"(final train loss {hist['loss'][-1]:.4f})")
    assert acc >= 0.95
