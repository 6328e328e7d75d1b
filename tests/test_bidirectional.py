"""Bidirectional recurrent layers: equality with ``torch.nn.RNN`` / ``nn.LSTM`` / ``nn.GRU``
(``bidirectional=True``) on packed variable-length batches in float64 and float32, both merge
modes, sequences and last states; finite-difference gradients with masks (padding on the
right, on the left, and gaps); padded batches against each sequence alone; the reversal
kernels against numpy; model files; errors; and training on real data (scikit-learn's digits
read row by row).
"""
from __future__ import annotations

import time

import numpy as np
import pytest
from threadpoolctl import threadpool_limits

from helpers.gradcheck import model_gradcheck
from sparknet import (
    GRU,
    LSTM,
    Bidirectional,
    Dense,
    Embedding,
    Sequential,
    SimpleRNN,
    _bidirectional,
)
from sparknet.data import lengths_to_mask
from sparknet.optim import RMSprop

TOL = 1e-6
N, T, F, H = 3, 5, 4, 3
KINDS = {"rnn": SimpleRNN, "lstm": LSTM, "gru": GRU}


def _x(seed=0, shape=(N, T, F)):
    return np.random.default_rng(seed).standard_normal(shape)


def _mask(kind, n=N, t=T):
    """None, or an (n, t) mask: lengths padded on the right ("post") or left ("pre"), or
    valid steps with gaps between them ("gaps")."""
    if kind is None:
        return None
    lengths = np.array([t, 3, 1, 4, 2, t][:n])
    if kind == "gaps":
        m = np.random.default_rng(99).random((n, t)) < 0.6
        m[:, 0] = True
        return m
    return lengths_to_mask(lengths, t, padding=kind)


def _set_random_params(model, seed=1, scale=0.5):
    model.params[...] = np.random.default_rng(seed).uniform(-scale, scale, model.params.shape)


def _bi(kind, merge_mode="concat", units=H, **kw):
    return Bidirectional(KINDS[kind](units, **kw), merge_mode=merge_mode)


# --------------------------------------------------------------------------- reversal kernels
def _reference_index(mask):
    """Each row's valid steps in reverse order, padded steps in place (plain numpy)."""
    idx = np.tile(np.arange(mask.shape[1]), (mask.shape[0], 1))
    for n, row in enumerate(mask):
        valid = np.nonzero(row)[0]
        idx[n, valid] = valid[::-1]
    return idx


def test_reversal_index_reverses_valid_steps_and_is_its_own_inverse():
    rng = np.random.default_rng(0)
    mask = rng.random((40, 9)) < 0.5
    mask[0] = False                      # a row with no valid step
    mask[1] = True
    idx = np.empty(mask.shape, dtype=np.intp)
    _bidirectional.reversal_index(mask.view(np.uint8), idx)
    np.testing.assert_array_equal(idx, _reference_index(mask))
    np.testing.assert_array_equal(np.take_along_axis(idx, idx, axis=1),
                                  np.tile(np.arange(9), (40, 1)))


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_reversal_kernels_equal_numpy(dtype):
    rng = np.random.default_rng(1)
    n, t, h = 6, 7, 5
    mask = rng.random((n, t)) < 0.7
    idx = np.empty((n, t), dtype=np.intp)
    _bidirectional.reversal_index(mask.view(np.uint8), idx)
    a, b = (rng.standard_normal((n, t, h)).astype(dtype) for _ in range(2))
    for ix in (idx, None):
        ref = idx if ix is not None else np.tile(np.arange(t)[::-1], (n, 1))
        rev = np.take_along_axis(b, ref[:, :, None], axis=1)
        out = np.empty_like(a)
        _bidirectional.reverse_steps(b, ix, out)
        np.testing.assert_array_equal(out, rev)
        cat = np.empty((n, t, 2 * h), dtype=dtype)
        _bidirectional.merge_sequences(a, b, ix, True, cat)
        np.testing.assert_array_equal(cat, np.concatenate([a, rev], axis=2))
        summed = np.empty_like(a)
        _bidirectional.merge_sequences(a, b, ix, False, summed)
        np.testing.assert_array_equal(summed, a + rev)
        dy_f, dy_b = np.empty_like(a), np.empty_like(a)
        _bidirectional.split_sequence_grad(cat, ix, dy_f, dy_b)
        np.testing.assert_array_equal(dy_f, a)
        np.testing.assert_array_equal(dy_b, np.take_along_axis(rev, ref[:, :, None], axis=1))
        acc = a.copy()
        _bidirectional.add_reversed(acc, b, ix)
        np.testing.assert_array_equal(acc, a + rev)


# --------------------------------------------------------------------------- gradients
@pytest.mark.parametrize("kind, merge_mode",
                         [("lstm", "concat"), ("gru", "sum"), ("rnn", "concat")])
@pytest.mark.parametrize("return_sequences", [True, False])
@pytest.mark.parametrize("mask_kind", [None, "post", "pre", "gaps"])
def test_gradcheck_single_layer(kind, merge_mode, return_sequences, mask_kind):
    model = Sequential([_bi(kind, merge_mode, return_sequences=return_sequences)],
                       input_shape=(T, F), dtype="float64")
    p_err, x_err = model_gradcheck(model, _x(), mask=_mask(mask_kind))
    assert p_err <= TOL, p_err
    assert x_err <= TOL, x_err


@pytest.mark.parametrize("mask_kind", [None, "pre"])
def test_gradcheck_stacked(mask_kind):
    model = Sequential([_bi("lstm", return_sequences=True), _bi("gru", "sum", units=4),
                        Dense(2, activation="tanh")], input_shape=(T, F), dtype="float64")
    p_err, x_err = model_gradcheck(model, _x(1), mask=_mask(mask_kind), max_params=500)
    assert p_err <= TOL, p_err
    assert x_err <= TOL, x_err


def test_first_layer_without_input_gradient_gives_the_same_parameter_gradients():
    model = Sequential([_bi("lstm", return_sequences=True)], input_shape=(T, F), dtype="float64")
    _set_random_params(model)
    x, mask = _x(2), _mask("pre")
    y = model.forward(x, mask=mask)
    R = np.random.default_rng(3).standard_normal(y.shape)
    assert model.backward(R.copy()) is not None
    g = model.grads.copy()
    layer = model.layers[0]
    layer.need_input_grad = False
    layer.forward(x, mask=mask)
    assert layer.backward(R.copy()) is None
    np.testing.assert_array_equal(model.grads, g)


# --------------------------------------------------------------------------- vs PyTorch
def _torch_pair(kind, model, dtype, torch):
    """A bidirectional torch module holding the weights of ``model.layers[0]``."""
    layer = model.layers[0].forward_layer
    klass = {"rnn": torch.nn.RNN, "lstm": torch.nn.LSTM, "gru": torch.nn.GRU}[kind]
    mod = klass(layer.in_features, layer.units, batch_first=True, bidirectional=True)
    mod = mod.double() if dtype == "float64" else mod.float()
    with torch.no_grad():
        for name, (a, b, shape) in model.param_slices()[0].items():
            getattr(mod, _torch_name(name)).copy_(
                torch.from_numpy(model.params[a:b].reshape(shape).copy()))
    return mod


def _torch_name(name):
    """``forward.weight_ih`` -> ``weight_ih_l0``, ``backward.bias_hh`` -> ``bias_hh_l0_reverse``."""
    direction, param = name.split(".")
    return f"{param}_l0" + ("_reverse" if direction == "backward" else "")


def _compare_with_torch(kind, merge_mode, return_sequences, dtype, lengths, shape, seed):
    """Run the same batch through sparknet (with a mask, when not every length is T) and
    torch (packed); returns the max abs differences and their scale."""
    torch = pytest.importorskip("torch", reason="torch not installed: torch comparison skipped")
    n, t, f, h = shape
    model = Sequential([_bi(kind, merge_mode, units=h, return_sequences=return_sequences)],
                       input_shape=(t, f), dtype=dtype)
    _set_random_params(model, seed=seed)
    mod = _torch_pair(kind, model, dtype, torch)
    x = _x(seed + 1, (n, t, f)).astype(dtype)
    mask = lengths_to_mask(lengths, t)
    masked = not mask.all()
    y = model.forward(x.copy(), mask=mask if masked else None)
    R = np.random.default_rng(seed + 2).standard_normal(y.shape).astype(dtype)
    if return_sequences:
        R *= mask[:, :, None]    # as Sequential weights the loss: padded steps count for nothing
    dx = model.backward(R.copy())

    xt = torch.from_numpy(x.copy()).requires_grad_(True)
    inp = (torch.nn.utils.rnn.pack_padded_sequence(xt, torch.from_numpy(lengths), batch_first=True,
                                                   enforce_sorted=False) if masked else xt)
    out, hn = mod(inp)
    if kind == "lstm":
        hn = hn[0]
    if return_sequences:
        if masked:
            out, _ = torch.nn.utils.rnn.pad_packed_sequence(out, batch_first=True, total_length=t)
        ref = out if merge_mode == "concat" else out[..., :h] + out[..., h:]
    else:
        ref = torch.cat([hn[0], hn[1]], dim=1) if merge_mode == "concat" else hn[0] + hn[1]
    (ref * torch.from_numpy(R)).sum().backward()
    diffs = {"y": float(np.abs(y - ref.detach().numpy()).max()),
             "dx": float(np.abs(dx - xt.grad.numpy()).max())}
    scale = {"y": float(np.abs(y).max()), "dx": float(np.abs(dx).max())}
    for name, (a, b, shp) in model.param_slices()[0].items():
        tg = getattr(mod, _torch_name(name)).grad.numpy()
        diffs[name] = float(np.abs(model.grads[a:b].reshape(shp) - tg).max())
        scale[name] = float(np.abs(tg).max())
    print(f"Bidirectional({kind}) {merge_mode} return_sequences={return_sequences} {dtype} vs "
          f"torch: max abs diff " + ", ".join(f"{k} {v:.1e}" for k, v in diffs.items()))
    assert min(scale.values()) > 0, "a gradient is zero: the comparison would prove nothing"
    if masked:
        np.testing.assert_array_equal(dx[~mask], 0.0)
        if return_sequences:
            np.testing.assert_array_equal(y[~mask], 0.0)
    return diffs, scale


@pytest.mark.parametrize("kind", ["rnn", "lstm", "gru"])
@pytest.mark.parametrize("merge_mode", ["concat", "sum"])
@pytest.mark.parametrize("return_sequences", [True, False])
def test_packed_batch_equals_torch_float64(kind, merge_mode, return_sequences):
    lengths = np.array([9, 3, 6, 1, 9, 5, 2, 8])
    diffs, scale = _compare_with_torch(kind, merge_mode, return_sequences, "float64", lengths,
                                       (8, 9, 5, 7), seed=10)
    for k, d in diffs.items():
        assert d <= 1e-12 * max(1.0, scale[k]), (k, d)


@pytest.mark.parametrize("return_sequences", [True, False])
def test_full_length_batch_equals_torch_float64(return_sequences):
    lengths = np.full(5, 6)
    diffs, scale = _compare_with_torch("lstm", "concat", return_sequences, "float64", lengths,
                                       (5, 6, 4, 8), seed=20)
    for k, d in diffs.items():
        assert d <= 1e-12 * max(1.0, scale[k]), (k, d)


@pytest.mark.parametrize("kind", ["lstm", "gru"])
def test_packed_batch_equals_torch_float32(kind):
    """Float32 (on AVX-512 CPUs the built-in step kernels), shapes that cut their 8-row and
    32-column blocks."""
    lengths = np.array([9, 3, 6, 1, 9, 5, 2, 8, 7, 4, 9])
    diffs, scale = _compare_with_torch(kind, "concat", True, "float32", lengths, (11, 9, 6, 37),
                                       seed=30)
    for k, d in diffs.items():
        assert d <= 2e-5 * max(1.0, scale[k]), (k, d)


# --------------------------------------------------------------------------- masks
@pytest.mark.parametrize("mask_kind", ["post", "pre", "gaps"])
@pytest.mark.parametrize("return_sequences", [True, False])
def test_padded_batch_equals_each_sequence_alone(mask_kind, return_sequences):
    """Wherever the padding is, a row's result is that of its valid steps run alone."""
    n, t = 5, 6
    mask = _mask(mask_kind, n, t)
    X = _x(40, (n, t, F))
    layer = _bi("lstm", return_sequences=return_sequences)
    model = Sequential([layer], input_shape=(t, F), dtype="float64")
    _set_random_params(model, seed=41)
    out = model.forward(X, mask=mask)
    if return_sequences:
        np.testing.assert_array_equal(out[~mask], 0.0)
        np.testing.assert_array_equal(layer.compute_mask(mask), mask)
    else:
        assert layer.compute_mask(mask) is None
    R = np.random.default_rng(42).standard_normal(out.shape)
    if return_sequences:
        R *= mask[:, :, None]
    dx = model.backward(R.copy())
    g_batch = model.grads.copy()
    g_sum = np.zeros_like(g_batch)
    for i in range(n):
        valid = np.nonzero(mask[i])[0]
        o = model.forward(X[i:i + 1, valid])
        d = model.backward((R[i:i + 1, valid] if return_sequences else R[i:i + 1]).copy())
        g_sum += model.grads
        np.testing.assert_allclose(out[i, valid] if return_sequences else out[i], o[0],
                                   rtol=1e-12, atol=1e-14)
        np.testing.assert_allclose(dx[i, valid], d[0], rtol=1e-10, atol=1e-13)
        np.testing.assert_array_equal(dx[i, ~mask[i]], 0.0)
    np.testing.assert_allclose(g_batch, g_sum, rtol=1e-10, atol=1e-12)


def test_directions_have_their_own_parameters():
    layer = Bidirectional(LSTM(4, unit_forget_bias=True, name="enc"))
    model = Sequential([layer], input_shape=(T, F), seed=3)
    names = list(model.param_slices()[0])
    assert names == [f"{d}.{p}" for d in ("forward", "backward")
                     for p in ("weight_ih", "weight_hh", "bias_ih", "bias_hh")]
    fwd, bwd = layer.forward_layer, layer.backward_layer
    assert type(bwd) is LSTM and bwd.name == "backward_enc" and bwd.units == 4
    assert not np.array_equal(fwd.params["weight_ih"], bwd.params["weight_ih"])
    np.testing.assert_array_equal(bwd.params["bias_ih"][4:8], 1.0)   # config carried over
    assert model.output_shape == (8,)
    assert Sequential([Bidirectional(GRU(4, return_sequences=True), "sum")],
                      input_shape=(T, F)).output_shape == (T, 4)


# --------------------------------------------------------------------------- files, errors
def test_config_and_model_file_round_trip(tmp_path):
    layer = Bidirectional(LSTM(6, return_sequences=True, kernel_initializer="he_uniform"),
                          merge_mode="sum", name="bi")
    cfg = layer.get_config()
    assert cfg["merge_mode"] == "sum" and cfg["name"] == "bi"
    assert cfg["layer"]["class"] == "LSTM" and cfg["layer"]["config"]["units"] == 6
    assert Bidirectional.from_config(cfg).get_config() == cfg
    model = Sequential([Embedding(7, 3, mask_zero=True), layer, Bidirectional(SimpleRNN(4)),
                        Dense(2, activation="softmax")], input_shape=(5,), seed=4)
    X = np.array([[1, 2, 3, 0, 0], [4, 5, 6, 6, 1], [2, 0, 0, 0, 0]])
    path = tmp_path / "bi.npz"
    model.save(path)
    again = Sequential.load(path)
    assert [type(x).__name__ for x in again.layers] == ["Embedding", "Bidirectional",
                                                       "Bidirectional", "Dense"]
    assert again.layers[1].get_config() == cfg
    np.testing.assert_array_equal(again.params, model.params)
    np.testing.assert_array_equal(again.predict_proba(X), model.predict_proba(X))


def test_argument_errors_name_the_argument():
    with pytest.raises(ValueError, match="Bidirectional layer must be a SimpleRNN, LSTM or GRU, "
                                         "got Dense"):
        Bidirectional(Dense(3))
    with pytest.raises(ValueError, match="Bidirectional layer must be"):
        Bidirectional("lstm")
    with pytest.raises(ValueError, match="stateful=True"):
        Bidirectional(LSTM(3, stateful=True))
    with pytest.raises(ValueError, match="return_state=True"):
        Bidirectional(LSTM(3, return_state=True))
    with pytest.raises(ValueError, match="merge_mode must be 'concat' or 'sum', got 'mul'"):
        Bidirectional(GRU(3), merge_mode="mul")


def test_call_errors():
    model = Sequential([_bi("gru")], input_shape=(T, F), dtype="float64")
    layer = model.layers[0]
    with pytest.raises(RuntimeError, match="backward called before forward"):
        layer.backward(np.zeros((N, 2 * H)))
    with pytest.raises(ValueError, match=r"expects input of shape \(N, T, 4\)"):
        model.forward(np.zeros((2, T, F + 1)))
    with pytest.raises(ValueError, match="mask has shape"):
        model.forward(_x(), mask=np.ones((N, T + 1)))
    model.forward(_x())
    with pytest.raises(ValueError, match=r"output gradient has shape \(3, 3\), expected \(3, 6\)"):
        layer.backward(np.zeros((N, H)))
    with pytest.raises(ValueError, match="takes sequences"):
        Sequential([_bi("lstm")], input_shape=(4,))


# --------------------------------------------------------------------------- real data
def test_digits_as_sequences_reach_95_percent():
    from sparknet.datasets import load_digits

    Xtr, ytr, Xte, yte = load_digits()
    Xtr, Xte = Xtr.reshape(-1, 8, 8), Xte.reshape(-1, 8, 8)   # 8 steps of 8 pixels (rows)
    model = Sequential([Bidirectional(LSTM(32)), Dense(10, activation="softmax")],
                       input_shape=(8, 8), seed=0)
    t0 = time.perf_counter()
    with threadpool_limits(1):
        hist = model.fit(Xtr, ytr, epochs=15, batch_size=32, optimizer=RMSprop(lr=3e-3), verbose=0)
        acc = model.evaluate(Xte, yte)["accuracy"]
    print(f"Bidirectional(LSTM(32)) on digits as sequences: test accuracy {acc:.4f} after "
          f"{time.perf_counter() - t0:.1f} s (final train loss {hist['loss'][-1]:.4f})")
    assert acc >= 0.95
