"""Recurrent layers: SimpleRNN, LSTM, Embedding, padding and masking, stateful truncated BPTT.

Gradients are checked against central differences (float64), the LSTM and the simple RNN
against ``torch.nn.LSTM`` / ``torch.nn.RNN`` with the same weights, padded batches against
each sequence run alone, and training on real data (scikit-learn's digits read row by row,
a slice of Shakespeare).
"""
from __future__ import annotations

import json
import os
import subprocess
import sys
import time

import numpy as np
import pytest
from threadpoolctl import threadpool_limits

from helpers.gradcheck import model_gradcheck
from sparknet import LSTM, Dense, Embedding, Sequential, SimpleRNN, _recurrent
from sparknet.data import bptt_batches, char_vocab, lengths_to_mask, pad_sequences
from sparknet.layers.recurrent import reset_states
from sparknet.optim import RMSprop

TOL = 1e-6
N, T, F, H = 3, 5, 4, 5


def _x(seed=0, shape=(N, T, F)):
    return np.random.default_rng(seed).standard_normal(shape)


def _mask(kind):
    if kind is None:
        return None
    lengths = np.array([5, 3, 1])
    return lengths_to_mask(lengths, T, padding=kind)


def _rnn(kind, **kw):
    if kind == "lstm":
        return LSTM(H, **kw)
    if kind == "rnn_relu":
        return SimpleRNN(H, activation="relu", **kw)
    return SimpleRNN(H, **kw)


def _set_random_params(model, seed=1, scale=0.5):
    model.params[...] = np.random.default_rng(seed).uniform(-scale, scale, model.params.shape)


# --------------------------------------------------------------------------- gradients
@pytest.mark.parametrize("kind", ["lstm", "rnn_tanh", "rnn_relu"])
@pytest.mark.parametrize("return_sequences", [True, False])
@pytest.mark.parametrize("mask_kind", [None, "post", "pre"])
def test_gradcheck_single_layer(kind, return_sequences, mask_kind):
    model = Sequential([_rnn(kind, return_sequences=return_sequences)], input_shape=(T, F),
                       dtype="float64")
    _set_random_params(model)
    p_err, x_err = model_gradcheck(model, _x(), mask=_mask(mask_kind))
    assert p_err <= TOL, p_err
    assert x_err <= TOL, x_err


@pytest.mark.parametrize("mask_kind", [None, "post", "pre"])
def test_gradcheck_stacked(mask_kind):
    model = Sequential([LSTM(H, return_sequences=True), SimpleRNN(4, return_sequences=True),
                        LSTM(3, return_sequences=mask_kind != "pre"), Dense(2, activation="tanh")],
                       input_shape=(T, F), dtype="float64")
    _set_random_params(model, seed=3)
    p_err, x_err = model_gradcheck(model, _x(1), mask=_mask(mask_kind), max_params=600)
    assert p_err <= TOL, p_err
    assert x_err <= TOL, x_err


def test_gradcheck_lstm_return_state():
    model = Sequential([LSTM(H, return_state=True)], input_shape=(T, F), dtype="float64")
    assert model.output_shape == (2 * H,)
    _set_random_params(model, seed=4)
    p_err, x_err = model_gradcheck(model, _x(2), mask=_mask("post"))
    assert p_err <= TOL and x_err <= TOL, (p_err, x_err)


def test_gradcheck_embedding_lstm():
    model = Sequential([Embedding(7, 3), LSTM(H, return_sequences=True), Dense(7, activation="softmax")],
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


@pytest.mark.parametrize("kind", ["lstm", "rnn_tanh"])
def test_gradcheck_stateful_truncated(kind):
    """With a carried state, the gradient is that of the chunk with its start state held fixed."""
    layer = _rnn(kind, return_sequences=True, stateful=True)
    model = _FixedStartModel([layer], input_shape=(T, F), dtype="float64")
    _set_random_params(model, seed=6)
    rng = np.random.default_rng(7)
    start = tuple(rng.standard_normal((N, H)) * 0.5 for _ in range(2 if kind == "lstm" else 1))
    model.start = {layer: start}
    p_err, x_err = model_gradcheck(model, _x(3))
    assert p_err <= TOL and x_err <= TOL, (p_err, x_err)


def test_fast_float32_activations():
    x = np.linspace(-20, 20, 400001, dtype=np.float32)
    t = np.empty_like(x)
    s = np.empty_like(x)
    _recurrent.fast_tanh_f32(x, t)
    _recurrent.fast_sigmoid_f32(x, s)
    x64 = x.astype(np.float64)
    assert np.abs(t - np.tanh(x64)).max() < 5e-7
    assert np.abs(s - 1 / (1 + np.exp(-x64))).max() < 5e-7


# --------------------------------------------------------------------------- vs PyTorch
def _torch():
    try:
        import torch
    except ImportError as exc:  # pragma: no cover - torch is installed here
        pytest.skip(f"PyTorch is not importable ({exc}); the comparison with torch.nn.LSTM needs it")
    return torch


def _copy_to_torch(model, module, torch):
    sl = model.param_slices()[0]
    with torch.no_grad():
        for nm in ("weight_ih", "weight_hh", "bias_ih", "bias_hh"):
            a, b, shape = sl[nm]
            getattr(module, nm + "_l0").copy_(torch.from_numpy(model.params[a:b].reshape(shape).copy()))


@pytest.mark.parametrize("kind", ["lstm", "rnn_tanh", "rnn_relu"])
@pytest.mark.parametrize("dtype", ["float64", "float32"])
def test_equals_torch(kind, dtype):
    torch = _torch()
    model = Sequential([_rnn(kind, return_sequences=True)], input_shape=(7, F), dtype=dtype)
    _set_random_params(model, seed=8)
    if kind == "lstm":
        mod = torch.nn.LSTM(F, H, batch_first=True)
    else:
        mod = torch.nn.RNN(F, H, batch_first=True, nonlinearity="relu" if kind == "rnn_relu" else "tanh")
    mod = mod.double() if dtype == "float64" else mod.float()
    _copy_to_torch(model, mod, torch)
    x = _x(9, (4, 7, F)).astype(dtype)
    y = model.forward(x.copy())
    R = np.random.default_rng(10).standard_normal(y.shape).astype(dtype)
    dx = model.backward(R.copy())
    xt = torch.from_numpy(x.copy()).requires_grad_(True)
    yt, _ = mod(xt)
    (yt * torch.from_numpy(R)).sum().backward()
    tol = dict(rtol=1e-10, atol=1e-12) if dtype == "float64" else dict(rtol=1e-4, atol=2e-5)
    np.testing.assert_allclose(y, yt.detach().numpy(), **tol)
    np.testing.assert_allclose(dx, xt.grad.numpy(), **tol)
    sl = model.param_slices()[0]
    for nm in ("weight_ih", "weight_hh", "bias_ih", "bias_hh"):
        a, b, shape = sl[nm]
        np.testing.assert_allclose(model.grads[a:b].reshape(shape),
                                   getattr(mod, nm + "_l0").grad.numpy(), **tol)


def test_float32_agrees_with_float64():
    m64 = Sequential([LSTM(8, return_sequences=True), LSTM(6)], input_shape=(6, F), dtype="float64")
    m32 = m64.clone(dtype="float32")
    x = _x(11, (5, 6, F))
    mask = lengths_to_mask(np.array([6, 4, 2, 6, 1]), 6, padding="pre")
    y64 = m64.forward(x, mask=mask)
    y32 = m32.forward(x.astype(np.float32), mask=mask)
    assert y32.dtype == np.float32
    np.testing.assert_allclose(y32, y64, rtol=1e-4, atol=1e-5)
    R = np.random.default_rng(12).standard_normal(y64.shape)
    dx64 = m64.backward(R.copy())
    dx32 = m32.backward(R.astype(np.float32))
    np.testing.assert_allclose(dx32, dx64, rtol=1e-3, atol=1e-5)
    np.testing.assert_allclose(m32.grads, m64.grads, rtol=1e-3, atol=1e-5)


# --------------------------------------------------------------------------- padding / masking
def _ragged(seed, lengths, feat=F):
    rng = np.random.default_rng(seed)
    return [rng.standard_normal((L, feat)) for L in lengths]


@pytest.mark.parametrize("kind", ["lstm", "rnn_tanh"])
@pytest.mark.parametrize("padding", ["post", "pre"])
@pytest.mark.parametrize("return_sequences", [True, False])
def test_padded_batch_equals_each_sequence_alone(kind, padding, return_sequences):
    lengths = [6, 2, 4, 1, 6]
    seqs = _ragged(20, lengths)
    X, mask = pad_sequences(seqs, padding=padding, dtype=np.float64)
    Tm = X.shape[1]
    layers = [LSTM(H, return_sequences=True), _rnn(kind, return_sequences=return_sequences),
              Dense(3)]
    model = Sequential(layers, input_shape=(Tm, F), dtype="float64")
    _set_random_params(model, seed=21)
    if return_sequences:   # the recurrent layers output zeros at padded steps
        h1 = layers[0].forward(X, mask=mask)
        np.testing.assert_array_equal(h1[~mask], 0.0)
        np.testing.assert_array_equal(layers[1].forward(h1, mask=mask)[~mask], 0.0)
    out = model.forward(X, mask=mask)
    rng = np.random.default_rng(22)
    R = rng.standard_normal(out.shape)
    if return_sequences:
        R *= mask[:, :, None]     # the loss of a padded step is zero (as Sequential weights it)
    dx = model.backward(R.copy())
    g_batch = model.grads.copy()
    g_sum = np.zeros_like(g_batch)
    for i, s in enumerate(seqs):
        valid = np.nonzero(mask[i])[0]
        o = model.forward(s[None])
        Ri = R[i:i + 1, valid] if return_sequences else R[i:i + 1]
        d = model.backward(Ri.copy())
        g_sum += model.grads
        if return_sequences:
            np.testing.assert_allclose(out[i, valid], o[0], rtol=1e-12, atol=1e-14)
        else:
            np.testing.assert_allclose(out[i], o[0], rtol=1e-12, atol=1e-14)
        np.testing.assert_allclose(dx[i, valid], d[0], rtol=1e-10, atol=1e-13)
        np.testing.assert_array_equal(dx[i, ~mask[i]], 0.0)
    np.testing.assert_allclose(g_batch, g_sum, rtol=1e-10, atol=1e-12)


@pytest.mark.parametrize("padding", ["post", "pre"])
def test_padded_loss_and_gradient_through_sequential(padding):
    """Per-step cross-entropy: Sequential weights the loss by the mask, so padded steps add
    nothing; the batch's loss sum and gradient equal the sums over the sequences alone."""
    lengths = [5, 3, 1, 4]
    rng = np.random.default_rng(30)
    ids = [rng.integers(1, 9, size=L) for L in lengths]
    labels = [rng.integers(0, 4, size=L) for L in lengths]
    X, mask = pad_sequences(ids, padding=padding)
    Y, _ = pad_sequences(labels, padding=padding)
    model = Sequential([Embedding(9, 4), LSTM(H, return_sequences=True), Dense(4, activation="softmax")],
                       input_shape=(X.shape[1],), dtype="float64")
    s, w, _ = model.loss_and_grad(X, Y, mask=mask, scale=1.0)
    g_batch = model.grads.copy()
    assert w == sum(lengths)
    s_sum, g_sum = 0.0, np.zeros_like(g_batch)
    for x_i, y_i in zip(ids, labels):
        si, wi, _ = model.loss_and_grad(x_i[None], y_i[None], scale=1.0)
        s_sum += si
        g_sum += model.grads
    assert s == pytest.approx(s_sum, rel=1e-12)
    np.testing.assert_allclose(g_batch, g_sum, rtol=1e-10, atol=1e-12)


def test_embedding_mask_zero_equals_explicit_mask():
    X, mask = pad_sequences([[3, 1, 4, 1], [5, 9], [2, 6, 5]], padding="pre")
    base = Sequential([Embedding(10, 3), LSTM(4)], input_shape=(4,), dtype="float64")
    auto = Sequential([Embedding(10, 3, mask_zero=True), LSTM(4)], input_shape=(4,), dtype="float64")
    auto.params[...] = base.params
    np.testing.assert_allclose(auto.forward(X), base.forward(X, mask=mask), rtol=0, atol=0)
    assert not np.allclose(base.forward(X), base.forward(X, mask=mask))


# --------------------------------------------------------------------------- stateful / TBPTT
@pytest.mark.parametrize("kind", ["lstm", "rnn_tanh"])
def test_stateful_chunks_equal_the_whole_sequence(kind):
    full = Sequential([_rnn(kind, return_sequences=True)], input_shape=(12, F), dtype="float64")
    chunked = Sequential([_rnn(kind, return_sequences=True, stateful=True)], input_shape=(4, F),
                         dtype="float64")
    _set_random_params(full, seed=40)
    chunked.params[...] = full.params
    x = _x(41, (3, 12, F))
    whole = full.forward(x)
    parts = [chunked.forward(x[:, k:k + 4]) for k in range(0, 12, 4)]
    np.testing.assert_allclose(np.concatenate(parts, axis=1), whole, rtol=1e-12, atol=1e-14)
    # after reset_states() the layer starts from zeros again
    reset_states(chunked)
    np.testing.assert_allclose(chunked.forward(x[:, 4:8]), full.forward(x[:, 4:8]), rtol=1e-12, atol=1e-14)
    with pytest.raises(ValueError, match="fixed batch size"):
        chunked.forward(x[:2, :4])


def test_stateful_fit_carries_state_in_order_like_a_hand_loop():
    text = np.random.default_rng(50).integers(0, 6, size=2000)
    X, Y = bptt_batches(text, batch_size=4, seq_len=10)
    # rows of batch k+1 continue the rows of batch k
    np.testing.assert_array_equal(X[4:8, 0], Y[0:4, -1])

    def make():
        return Sequential([Embedding(6, 5), LSTM(8, return_sequences=True, stateful=True),
                           Dense(6, activation="softmax")], input_shape=(10,), seed=3)

    fitted = make()
    fitted.fit(X, Y, epochs=1, batch_size=4, shuffle=False, optimizer=RMSprop(lr=0.01), verbose=0)

    loop, opt = make(), RMSprop(lr=0.01)
    for k in range(0, X.shape[0], 4):
        loop.loss_and_grad(X[k:k + 4], Y[k:k + 4])
        opt.step(loop.params, loop.grads)
    np.testing.assert_allclose(fitted.params, loop.params, rtol=1e-6, atol=1e-7)

    # the same loop that forgets the state between batches ends elsewhere
    forget, opt = make(), RMSprop(lr=0.01)
    for k in range(0, X.shape[0], 4):
        reset_states(forget)
        forget.loss_and_grad(X[k:k + 4], Y[k:k + 4])
        opt.step(forget.params, forget.grads)
    assert np.abs(forget.params - loop.params).max() > 1e-4


# --------------------------------------------------------------------------- training on real data
def test_digits_as_sequences_reach_95_percent():
    from sparknet.datasets import load_digits

    Xtr, ytr, Xte, yte = load_digits()
    Xtr, Xte = Xtr.reshape(-1, 8, 8), Xte.reshape(-1, 8, 8)   # 8 steps of 8 pixels (rows)
    model = Sequential([LSTM(64), Dense(10, activation="softmax")], input_shape=(8, 8), seed=0)
    t0 = time.perf_counter()
    with threadpool_limits(1):
        hist = model.fit(Xtr, ytr, epochs=40, batch_size=32, optimizer=RMSprop(lr=3e-3), verbose=0)
        acc = model.evaluate(Xte, yte)["accuracy"]
    print(f"digits as sequences: test accuracy {acc:.4f} after {time.perf_counter() - t0:.1f} s "
          f"(final train loss {hist['loss'][-1]:.4f})")
    assert acc >= 0.95


def test_char_lstm_on_shakespeare_lowers_loss(shakespeare_path):
    from sparknet.datasets import load_text

    text = load_text(shakespeare_path)[:60000]
    chars, ids = char_vocab(text)
    V = len(chars)
    B, S, steps = 32, 50, 100
    X, Y = bptt_batches(ids, batch_size=B, seq_len=S)
    model = Sequential([Embedding(V, 32), LSTM(128, return_sequences=True, stateful=True),
                        Dense(V, activation="softmax")], input_shape=(S,), seed=0)
    opt = RMSprop(lr=3e-3)
    losses = []
    t0 = time.perf_counter()
    with threadpool_limits(1):
        for step in range(steps):
            k = (step * B) % X.shape[0]
            if k == 0:
                reset_states(model)
            s, w, _ = model.loss_and_grad(X[k:k + B], Y[k:k + B])
            opt.step(model.params, model.grads)
            losses.append(s / w)
    first, last = np.mean(losses[:5]), np.mean(losses[-10:])
    print(f"char LSTM: {steps} steps in {time.perf_counter() - t0:.1f} s, loss {first:.3f} -> "
          f"{last:.3f} nats/char ({last / np.log(2):.3f} bits/char)")
    assert last <= 0.7 * first


# --------------------------------------------------------------------------- bad input
def test_ragged_input_without_padding_is_refused():
    model = Sequential([LSTM(4), Dense(2, activation="softmax")], input_shape=(3, 2))
    ragged = [np.zeros((3, 2)), np.zeros((2, 2))]
    with pytest.raises(ValueError, match="ragged|pad_sequences"):
        model.fit(ragged, [0, 1], epochs=1, verbose=0)
    tok = Sequential([Embedding(5, 2), LSTM(3)], input_shape=(3,))
    with pytest.raises(ValueError, match="ragged|pad_sequences"):
        tok.predict([[1, 2, 3], [1]])


def test_mask_of_wrong_shape_is_refused():
    model = Sequential([LSTM(4, return_sequences=True), Dense(2, activation="softmax")],
                       input_shape=(3, 2))
    X = np.zeros((4, 3, 2), dtype=np.float32)
    y = np.zeros((4, 3), dtype=np.int64)
    with pytest.raises(ValueError, match=r"mask has shape \(4, 2\)"):
        model.fit(X, y, mask=np.ones((4, 2)), epochs=1, verbose=0)
    with pytest.raises(ValueError, match=r"mask has shape \(3, 3\)"):
        model.layers[0].forward(X, mask=np.ones((3, 3)))


def test_token_ids_out_of_range_are_refused():
    model = Sequential([Embedding(5, 2), LSTM(3), Dense(2, activation="softmax")], input_shape=(3,))
    with pytest.raises(ValueError, match=r"token id 5 at index \(1, 2\) is outside \[0, 5\)"):
        model.predict(np.array([[0, 1, 2], [3, 4, 5]]))
    with pytest.raises(ValueError, match=r"token id -1"):
        model.predict(np.array([[0, -1, 2]]))
    with pytest.raises(ValueError, match="non-integer"):
        model.layers[0].forward(np.array([[0.5, 1, 2]]))


def test_layer_argument_and_shape_errors():
    with pytest.raises(ValueError, match="return_state"):
        LSTM(4, return_sequences=True, return_state=True)
    with pytest.raises(ValueError, match="units"):
        LSTM(0)
    with pytest.raises(ValueError, match="softmax"):
        SimpleRNN(3, activation="softmax")
    with pytest.raises(ValueError, match=r"\(N, T, features\)"):
        Sequential([LSTM(4)], input_shape=(5,))
    model = Sequential([LSTM(4)], input_shape=(3, 2))
    with pytest.raises(ValueError, match=r"expects input of shape \(N, T, 2\)"):
        model.layers[0].forward(np.zeros((1, 3, 5)))
    with pytest.raises(ValueError, match="not stateful"):
        model.layers[0].reset_states((np.zeros((2, 4)), np.zeros((2, 4))))
    stateful = Sequential([LSTM(4, stateful=True)], input_shape=(3, 2))
    with pytest.raises(ValueError, match="state must have shape"):
        stateful.layers[0].reset_states((np.zeros((2, 4)), np.zeros((2, 5))))
    with pytest.raises(ValueError, match="2 state array"):
        stateful.layers[0].reset_states(np.zeros((2, 4)))


def test_pad_sequences():
    X, m = pad_sequences([[1, 2, 3], [4], []])
    np.testing.assert_array_equal(X, [[1, 2, 3], [4, 0, 0], [0, 0, 0]])
    np.testing.assert_array_equal(m, [[1, 1, 1], [1, 0, 0], [0, 0, 0]])
    assert X.dtype == np.int64
    X, m = pad_sequences([[1, 2, 3], [4]], maxlen=2, padding="pre", truncating="pre", value=-1)
    np.testing.assert_array_equal(X, [[2, 3], [-1, 4]])
    np.testing.assert_array_equal(m, [[1, 1], [0, 1]])
    X, m = pad_sequences([[1, 2, 3]], maxlen=2)
    np.testing.assert_array_equal(X, [[1, 2]])
    X, m = pad_sequences([np.ones((2, 3)), np.ones((1, 3)) * 2])
    assert X.shape == (2, 2, 3) and X.dtype == np.float32
    np.testing.assert_array_equal(X[1, 1], 0)
    np.testing.assert_array_equal(lengths_to_mask(np.array([2, 0]), 3, padding="pre"), [[0, 1, 1], [0, 0, 0]])
    with pytest.raises(ValueError, match="sequence 1 has steps of shape"):
        pad_sequences([np.ones((2, 3)), np.ones((1, 4))])
    with pytest.raises(ValueError, match="padding"):
        pad_sequences([[1]], padding="middle")
    with pytest.raises(ValueError, match="no sequences"):
        pad_sequences([])


def test_save_and_load_round_trip(tmp_path):
    model = Sequential([Embedding(6, 3, mask_zero=True), LSTM(5, return_sequences=True),
                        SimpleRNN(4, activation="relu"), Dense(2, activation="softmax")],
                       input_shape=(4,))
    X = np.array([[1, 2, 3, 0], [4, 5, 0, 0]])
    path = tmp_path / "rnn.npz"
    model.save(path)
    again = Sequential.load(path)
    assert [type(l).__name__ for l in again.layers] == ["Embedding", "LSTM", "SimpleRNN", "Dense"]
    np.testing.assert_array_equal(again.predict_proba(X), model.predict_proba(X))


# --------------------------------------------------------------------------- float32 step kernels
def _need_step_kernel():
    if not _recurrent.step_kernel_available():
        pytest.skip("this CPU has neither AVX-512 nor AVX2 with FMA (or SPARKNET_STEP_ISA=blas): "
                    "the float32 step kernels are not used (BLAS is)")


@pytest.mark.parametrize("M,K,Nc", [(1, 1, 1), (3, 7, 5), (8, 128, 512), (9, 33, 17), (17, 512, 128),
                                    (128, 28, 100), (13, 64, 31), (5, 0, 19)])
@pytest.mark.parametrize("accumulate", [False, True])
def test_float32_step_kernels_match_numpy(M, K, Nc, accumulate):
    _need_step_kernel()
    rng = np.random.default_rng(M * 1000 + K)
    A = rng.standard_normal((M, K)).astype(np.float32)
    At = np.ascontiguousarray(A.T)
    B = rng.standard_normal((K, Nc)).astype(np.float32)
    C0 = rng.standard_normal((M, Nc)).astype(np.float32)
    ref = A.astype(np.float64) @ B + (C0 if accumulate else 0)
    for fn, a in ((_recurrent.sgemm_step, A), (_recurrent.sgemm_tn_step, At)):
        C = C0.copy()
        fn(a, B, C, accumulate)
        np.testing.assert_allclose(C, ref, rtol=1e-5, atol=1e-5 * np.sqrt(max(K, 1)))


def test_float32_step_kernel_equals_blas_path():
    _need_step_kernel()
    model = Sequential([LSTM(40, return_sequences=True), SimpleRNN(33, return_sequences=True), LSTM(24)],
                       input_shape=(9, 6), dtype="float32")
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
    for a, b in zip(results[0], results[1]):
        np.testing.assert_allclose(a, b, rtol=1e-4, atol=1e-5)


# One LSTM-GRU-RNN stack's float32 forward and backward, and the step products against
# numpy, in a process whose SPARKNET_STEP_ISA the test sets (read once per process).
_ISA_PROGRAM = r"""
import json, sys
import numpy as np
from sparknet import GRU, LSTM, Sequential, SimpleRNN, _recurrent
from sparknet.data import lengths_to_mask
model = Sequential([LSTM(37, return_sequences=True), GRU(21, return_sequences=True),
                    SimpleRNN(19)], input_shape=(9, 6), dtype="float32", seed=4)
rng = np.random.default_rng(5)
x = rng.standard_normal((13, 9, 6)).astype(np.float32)
mask = lengths_to_mask(np.array([9, 3, 5, 9, 1, 9, 2, 8, 9, 4, 6, 7, 9]), 9, padding="post")
y = model.forward(x, mask=mask)
dx = model.backward(rng.standard_normal(y.shape).astype(np.float32))
worst = 0.0
if _recurrent.step_kernel_available():
    for M, K, Nc in ((1, 1, 1), (7, 33, 17), (13, 64, 31), (128, 156, 512), (17, 300, 40), (5, 0, 19)):
        A = rng.standard_normal((M, K)).astype(np.float32)
        B = rng.standard_normal((K, Nc)).astype(np.float32)
        C0 = rng.standard_normal((M, Nc)).astype(np.float32)
        for acc in (True, False):
            ref = A.astype(np.float64) @ B + (C0 if acc else 0)
            for fn, a in ((_recurrent.sgemm_step, A), (_recurrent.sgemm_tn_step, np.ascontiguousarray(A.T))):
                C = C0.copy()
                fn(a, B, C, acc)
                worst = max(worst, float(np.abs(C - ref).max() / np.sqrt(max(K, 1))))
np.savez(sys.argv[1], y=y, dx=dx, grads=model.grads)
print(json.dumps({"isa": _recurrent.step_kernel_isa(), "worst": worst}))
"""


@pytest.mark.parametrize("isa", ["avx2", "blas"])
def test_narrower_step_kernels_agree_with_the_cpus_best(isa, tmp_path):
    """SPARKNET_STEP_ISA=avx2 runs the AVX2 step products and LSTM rows on an AVX-512 CPU too
    (so that they are tested there), =blas the BLAS; both give the default path's results."""
    results = {}
    for name, value in (("best", None), (isa, isa)):
        env = {k: v for k, v in os.environ.items() if k != "SPARKNET_STEP_ISA"}
        if value:
            env["SPARKNET_STEP_ISA"] = value
        out = tmp_path / f"{name}.npz"
        run = subprocess.run([sys.executable, "-c", _ISA_PROGRAM, str(out)], env=env,
                             capture_output=True, text=True, timeout=300)
        assert run.returncode == 0, run.stderr
        results[name] = (json.loads(run.stdout.strip().splitlines()[-1]), np.load(out))
    best_isa = results["best"][0]["isa"]
    assert best_isa == _recurrent.step_kernel_isa()
    expected = None if isa == "blas" or best_isa is None else "avx2"
    info, arrays = results[isa]
    assert info["isa"] == expected
    assert info["worst"] < 1e-5, info          # the step products against float64 numpy
    for key in ("y", "dx", "grads"):
        a, b = arrays[key], results["best"][1][key]
        assert np.abs(a).max() > 0, key
        np.testing.assert_allclose(a, b, rtol=1e-4, atol=1e-5, err_msg=key)


def test_float32_step_by_step_order_equals_whole_sequence_order():
    """The LSTM's products one time step at a time (the default on AVX-512) and over whole
    sequences give the same forward output, input delta and weight gradients."""
    _need_step_kernel()
    model = Sequential([LSTM(40, return_sequences=True), LSTM(24, return_sequences=True), LSTM(16)],
                       input_shape=(12, 7), dtype="float32", seed=3)
    x = _x(70, (13, 12, 7)).astype(np.float32)
    mask = lengths_to_mask(np.array([12, 3, 5, 12, 1, 12, 2, 8, 12, 4, 6, 11, 7]), 12, padding="post")
    R = np.random.default_rng(71).standard_normal((13, 16)).astype(np.float32)
    results = []
    try:
        for fused in (True, False):
            _recurrent.use_fused_steps(fused)
            y = model.forward(x, mask=mask)
            dx = model.backward(R.copy())
            results.append((y, dx, model.grads.copy()))
    finally:
        _recurrent.use_fused_steps(True)
    assert np.abs(results[0][2]).max() > 0, "no gradient flowed"
    for a, b in zip(results[0], results[1]):
        np.testing.assert_allclose(a, b, rtol=1e-4, atol=1e-5)


@pytest.mark.parametrize("T,stateful", [(1, False), (2, False), (5, False), (5, True)])
def test_float32_lstm_weight_gradients_with_zero_and_carried_initial_state(T, stateful):
    """The step-by-step float32 backward skips step 0's share of dW_hh when the initial state
    is zero (it adds nothing); a stateful layer's carried state is not zero, so nothing is
    skipped there.  Both orders agree; with one step (whole-sequence order either way) dW_hh is
    zero."""
    _need_step_kernel()
    rng = np.random.default_rng(T)
    layer = LSTM(20, stateful=stateful)
    model = Sequential([layer], input_shape=(T, 6), dtype="float32", seed=5)
    x = [rng.standard_normal((4, T, 6)).astype(np.float32) for _ in range(2)]
    R = rng.standard_normal((4, 20)).astype(np.float32)
    results = []
    try:
        for fused in (True, False):
            _recurrent.use_fused_steps(fused)
            layer.reset_states()
            model.forward(x[0])          # a stateful layer now carries a non-zero state
            model.backward(R.copy())
            model.forward(x[1])
            layer.grads["weight_hh"][...] = 7.0   # gradients are overwritten, never added to
            model.backward(R.copy())
            results.append((model.grads.copy(), layer.grads["weight_hh"].copy()))
    finally:
        _recurrent.use_fused_steps(True)
    dw_hh = results[0][1]
    if T == 1 and not stateful:
        assert not dw_hh.any(), "one step from a zero state: dW_hh must be zero"
    else:
        assert np.abs(dw_hh).max() > 0
    np.testing.assert_allclose(results[0][0], results[1][0], rtol=1e-4, atol=1e-5)
