"""Conv1D, MaxPool1D, AvgPool1D and the global pools: values and gradients against PyTorch
(float64) and numpy references, finite differences, masks (each sample's valid steps only,
a sample with none gives 0), the tie rule, float32, error messages, model files and
accuracy on digits read as 8 steps of 8 features."""
from __future__ import annotations

import itertools
import math
import time

import numpy as np
import pytest

from helpers.gradcheck import model_gradcheck
from sparknet import (
    AvgPool1D,
    Conv1D,
    Dense,
    Embedding,
    GlobalAveragePooling1D,
    GlobalAveragePooling2D,
    GlobalMaxPooling1D,
    GlobalMaxPooling2D,
    MaxPool1D,
    RMSprop,
    Sequential,
    load_model,
)
from sparknet.datasets import load_digits
from sparknet.layers import REGISTRY

TOL = 1e-6          # finite differences
EXACT = 1e-12       # against PyTorch in float64

ACTS = ["identity", "relu", "tanh", "sigmoid", "softmax"]
# (T, C, filters, k, strides, padding, dilation, activation): strides x padding x dilation,
# then even kernels (asymmetric "same" padding), a 1-wide kernel and stride > kernel
CONV_CASES = [(11, 3, 4, 3, s, p, d, ACTS[i % len(ACTS)])
              for i, (s, p, d) in enumerate(itertools.product((1, 2), ("valid", "same"), (1, 2)))]
CONV_CASES += [(10, 2, 3, 4, 1, "same", 1, "tanh"), (10, 2, 3, 2, 2, "same", 1, "relu"),
               (9, 3, 2, 4, 3, "same", 2, "sigmoid"), (6, 4, 5, 1, 1, "valid", 1, "identity"),
               (12, 2, 3, 2, 3, "valid", 1, "softmax")]


def _ids(cases):
    return ["-".join(str(v) for v in c) for c in cases]


def same_pad(T, extent, s):
    """Output length and (leading, trailing) zero padding of "same"."""
    out = math.ceil(T / s)
    total = max((out - 1) * s + extent - T, 0)
    return out, total // 2, total - total // 2


# ---------------------------------------------------------------- references
def torch_conv1d(torch, x, kernel, bias, s, padding, d, act):
    """PyTorch's conv1d on the transposed layout; returns (leaves, y) with y (N, T', F)."""
    F = torch.nn.functional
    xt = torch.tensor(x.transpose(0, 2, 1).copy(), requires_grad=True)
    w = torch.tensor(kernel.transpose(2, 1, 0).copy(), requires_grad=True)
    b = None if bias is None else torch.tensor(bias.copy(), requires_grad=True)
    if padding == "same" and s > 1:  # torch's "same" is stride 1 only: pad as sparknet does
        _, lo, hi = same_pad(x.shape[1], d * (kernel.shape[0] - 1) + 1, s)
        z = F.conv1d(F.pad(xt, (lo, hi)), w, b, stride=s, dilation=d)
    else:
        z = F.conv1d(xt, w, b, stride=s, padding=padding, dilation=d)
    y = {"identity": z, "relu": torch.relu(z), "tanh": torch.tanh(z),
         "sigmoid": torch.sigmoid(z), "softmax": torch.softmax(z, dim=1)}[act]
    return (xt, w, b), y.permute(0, 2, 1)


def naive_pool1d(x, k, s, padding, kind):
    """Max (first maximum wins) or mean over the taps inside the sequence; for max also
    the winning step of every output."""
    N, T, C = x.shape
    if padding == "valid":
        out, lo = (T - k) // s + 1, 0
    else:
        out, lo, _ = same_pad(T, k, s)
    y = np.zeros((N, out, C))
    win = np.zeros((N, out, C), dtype=int)
    for n, i, c in itertools.product(range(N), range(out), range(C)):
        taps = [t for t in range(i * s - lo, i * s - lo + k) if 0 <= t < T]
        vals = [x[n, t, c] for t in taps]
        if kind == "max":
            best = int(np.argmax(vals))  # numpy's argmax: the first maximum
            y[n, i, c], win[n, i, c] = vals[best], taps[best]
        else:
            y[n, i, c] = np.mean(vals)
    return y, win


def masks_for(N, T, rng):
    """Masks with prefixes, holes, a full row and an empty row."""
    m = rng.random((N, T)) < 0.6
    m[0] = True
    m[1] = False
    m[2] = np.arange(T) < 2
    return m


def one_layer(layer, in_shape, dtype="float64"):
    return Sequential([layer], input_shape=in_shape, dtype=dtype, seed=3)


# -------------------------------------------------------- Conv1D vs PyTorch
@pytest.mark.filterwarnings("ignore:Using padding='same' with even kernel lengths")
@pytest.mark.parametrize("case", CONV_CASES, ids=_ids(CONV_CASES))
def test_conv1d_forward_and_gradients_match_torch(case):
    torch = pytest.importorskip("torch", reason="torch not installed: torch comparison skipped")
    T, C, F, k, s, pad, d, act = case
    model = one_layer(Conv1D(F, k, strides=s, padding=pad, dilation=d, activation=act), (T, C))
    layer = model.layers[0]
    layer.emit_logits = False  # a trailing softmax is part of the layer here
    rng = np.random.default_rng(T * 7 + k)
    layer.params["bias"][...] = 0.3 * rng.standard_normal(F)
    x = rng.standard_normal((3, T, C))
    y = model.forward(x)
    (xt, w, b), yt = torch_conv1d(torch, x, layer.params["kernel"], layer.params["bias"],
                                  s, pad, d, act)
    assert y.shape == tuple(yt.shape)
    if pad == "same":
        assert y.shape[1] == math.ceil(T / s)
    np.testing.assert_allclose(y, yt.detach().numpy(), rtol=0, atol=EXACT)
    R = rng.standard_normal(y.shape)
    (yt * torch.from_numpy(R)).sum().backward()
    dx = model.backward(R.copy())
    np.testing.assert_allclose(dx, xt.grad.numpy().transpose(0, 2, 1), rtol=0, atol=EXACT)
    np.testing.assert_allclose(layer.grads["kernel"], w.grad.numpy().transpose(2, 1, 0),
                               rtol=0, atol=EXACT)
    np.testing.assert_allclose(layer.grads["bias"], b.grad.numpy(), rtol=0, atol=EXACT)


def test_conv1d_without_bias_matches_torch():
    torch = pytest.importorskip("torch", reason="torch not installed: torch comparison skipped")
    model = one_layer(Conv1D(3, 3, strides=2, padding="same", use_bias=False), (9, 2))
    layer = model.layers[0]
    assert [n for n, _ in layer.param_specs()] == ["kernel"]
    x = np.random.default_rng(1).standard_normal((2, 9, 2))
    (xt, w, _), yt = torch_conv1d(torch, x, layer.params["kernel"], None, 2, "same", 1,
                                  "identity")
    np.testing.assert_allclose(model.forward(x), yt.detach().numpy(), rtol=0, atol=EXACT)


def test_same_padding_puts_the_extra_step_after():
    # kernel of ones, 2 taps, "same": no padding before, one zero step after
    model = one_layer(Conv1D(1, 2, padding="same", use_bias=False), (3, 1))
    model.layers[0].params["kernel"][...] = 1.0
    x = np.array([1.0, 2.0, 4.0]).reshape(1, 3, 1)
    np.testing.assert_array_equal(model.forward(x)[0, :, 0], [3.0, 6.0, 4.0])
    shapes = {(T, k, s, p, d): Sequential([Conv1D(2, k, strides=s, padding=p, dilation=d)],
                                          input_shape=(T, 1)).output_shape
              for T, k, s, p, d in [(7, 3, 2, "same", 1), (7, 3, 1, "valid", 2),
                                    (8, 5, 3, "same", 2)]}
    assert shapes == {(7, 3, 2, "same", 1): (4, 2), (7, 3, 1, "valid", 2): (3, 2),
                      (8, 5, 3, "same", 2): (3, 2)}


# ------------------------------------------------------------ pools vs PyTorch
POOL_CASES = [(3, None, "valid", 10), (2, 1, "valid", 7), (3, 2, "valid", 10),
              (2, 3, "valid", 11), (3, 1, "same", 7), (3, 2, "same", 9)]


@pytest.mark.parametrize("kind", ["max", "avg"])
@pytest.mark.parametrize("case", POOL_CASES, ids=_ids(POOL_CASES))
def test_pool1d_matches_torch(case, kind):
    torch = pytest.importorskip("torch", reason="torch not installed: torch comparison skipped")
    k, s, pad, T = case
    layer = (MaxPool1D if kind == "max" else AvgPool1D)(k, strides=s, padding=pad)
    model = one_layer(layer, (T, 3))
    x = np.random.default_rng(k * 10 + T).standard_normal((2, T, 3))
    y = model.forward(x)
    xt = torch.tensor(x.transpose(0, 2, 1).copy(), requires_grad=True)
    lo = same_pad(T, k, s or k)[1] if pad == "same" else 0  # these cases pad symmetrically
    fn = torch.nn.functional
    if kind == "max":
        yt = fn.max_pool1d(xt, k, stride=s or k, padding=lo)
    else:
        yt = fn.avg_pool1d(xt, k, stride=s or k, padding=lo, count_include_pad=False)
    np.testing.assert_allclose(y, yt.detach().numpy().transpose(0, 2, 1), rtol=0, atol=EXACT)
    R = np.random.default_rng(5).standard_normal(y.shape)
    (yt * torch.from_numpy(R.transpose(0, 2, 1).copy())).sum().backward()
    dx = model.backward(R.copy())
    np.testing.assert_allclose(dx, xt.grad.numpy().transpose(0, 2, 1), rtol=0, atol=EXACT)


@pytest.mark.parametrize("kind", ["max", "avg"])
@pytest.mark.parametrize("k,s,T", [(2, 1, 8), (4, 3, 10), (3, 2, 8)])
def test_pool1d_same_padding_matches_numpy_reference(kind, k, s, T):
    """Asymmetric "same" padding (PyTorch pads symmetrically only): padding never wins a
    max and does not count in a mean."""
    x = np.random.default_rng(T + k).standard_normal((2, T, 3))
    model = one_layer((MaxPool1D if kind == "max" else AvgPool1D)(k, s, "same"), (T, 3))
    ref, _ = naive_pool1d(x, k, s, "same", kind)
    np.testing.assert_allclose(model.forward(x), ref, rtol=0, atol=EXACT)
    _, x_err = model_gradcheck(model, x)
    assert x_err <= TOL, x_err


def test_maxpool1d_ties_send_the_gradient_to_the_first_maximum():
    x = np.array([[1.0, 3.0, 3.0, 0.0, 2.0, 2.0, 2.0]]).reshape(1, 7, 1)
    model = one_layer(MaxPool1D(3, strides=2), (7, 1))
    np.testing.assert_array_equal(model.forward(x)[0, :, 0], [3.0, 3.0, 2.0])
    dx = model.backward(np.array([1.0, 10.0, 100.0]).reshape(1, 3, 1))
    # windows [1 3 3], [3 0 2], [2 2 2]: steps 1, 2 and 4 win
    np.testing.assert_array_equal(dx[0, :, 0], [0.0, 1.0, 10.0, 0.0, 100.0, 0.0, 0.0])
    _, win = naive_pool1d(x, 3, 2, "valid", "max")
    assert win[0, :, 0].tolist() == [1, 2, 4]


# ------------------------------------------------------- global pools, masks
def torch_masked(torch, x, mask, kind):
    """Per sample, PyTorch's mean or max over its valid steps (0 with none)."""
    xt = torch.tensor(x, requires_grad=True)
    rows = []
    for n in range(x.shape[0]):
        valid = xt[n][torch.from_numpy(mask[n])]
        if valid.shape[0] == 0:
            rows.append(xt[n].sum(0) * 0)  # output 0, gradient 0
        else:
            rows.append(valid.mean(0) if kind == "avg" else valid.max(0).values)
    return xt, torch.stack(rows)


@pytest.mark.parametrize("kind", ["avg", "max"])
def test_global_pool1d_with_mask_matches_torch_on_each_samples_valid_steps(kind):
    torch = pytest.importorskip("torch", reason="torch not installed: torch comparison skipped")
    rng = np.random.default_rng(7)
    x = rng.standard_normal((6, 9, 4))
    mask = masks_for(6, 9, rng)
    model = one_layer(GlobalAveragePooling1D() if kind == "avg" else GlobalMaxPooling1D(), (9, 4))
    y = model.forward(x, mask=mask)
    xt, yt = torch_masked(torch, x, mask, kind)
    np.testing.assert_allclose(y, yt.detach().numpy(), rtol=0, atol=EXACT)
    assert model.layers[0].compute_mask(mask) is None  # no time axis left: no mask goes further
    np.testing.assert_array_equal(y[1], 0.0)
    R = rng.standard_normal(y.shape)
    (yt * torch.from_numpy(R)).sum().backward()
    dx = model.backward(R.copy())
    np.testing.assert_allclose(dx, xt.grad.numpy(), rtol=0, atol=EXACT)
    np.testing.assert_array_equal(dx[1], 0.0)             # the sample with no valid step
    np.testing.assert_array_equal(dx[~mask], 0.0)         # masked steps get nothing
    # without a mask: every step counts
    y_all = model.forward(x)
    np.testing.assert_allclose(y_all, x.mean(1) if kind == "avg" else x.max(1), rtol=0, atol=EXACT)


@pytest.mark.parametrize("kind", ["avg", "max"])
def test_global_pool2d_matches_torch_adaptive_pool(kind):
    torch = pytest.importorskip("torch", reason="torch not installed: torch comparison skipped")
    x = np.random.default_rng(2).standard_normal((3, 5, 4, 6))
    pool = GlobalAveragePooling2D() if kind == "avg" else GlobalMaxPooling2D()
    model = one_layer(pool, (5, 4, 6))
    y = model.forward(x)
    assert model.layers[0].output_shape == (6,)
    xt = torch.tensor(x.transpose(0, 3, 1, 2).copy(), requires_grad=True)
    fn = torch.nn.functional
    pool = fn.adaptive_avg_pool2d if kind == "avg" else fn.adaptive_max_pool2d
    yt = pool(xt, 1).flatten(1)
    np.testing.assert_allclose(y, yt.detach().numpy(), rtol=0, atol=EXACT)
    R = np.random.default_rng(3).standard_normal(y.shape)
    (yt * torch.from_numpy(R)).sum().backward()
    np.testing.assert_allclose(model.backward(R.copy()), xt.grad.numpy().transpose(0, 2, 3, 1),
                               rtol=0, atol=EXACT)


def test_global_max_ties_go_to_the_first_step_and_pixel():
    x = np.array([[[1.0, 5.0], [4.0, 5.0], [4.0, 2.0], [0.0, 5.0]]])  # (1, 4, 2)
    model = one_layer(GlobalMaxPooling1D(), (4, 2))
    np.testing.assert_array_equal(model.forward(x), [[4.0, 5.0]])
    dx = model.backward(np.array([[1.0, 2.0]]))
    np.testing.assert_array_equal(dx[0], [[0.0, 2.0], [1.0, 0.0], [0.0, 0.0], [0.0, 0.0]])
    # masked: step 1 is padding, so the tie on channel 0 goes to step 2, on channel 1 to step 0
    mask = np.array([[False, False, True, True]])
    np.testing.assert_array_equal(model.forward(x, mask=mask), [[4.0, 5.0]])
    dx = model.backward(np.array([[1.0, 2.0]]))
    np.testing.assert_array_equal(dx[0], [[0.0, 0.0], [0.0, 0.0], [1.0, 0.0], [0.0, 2.0]])
    img = np.zeros((1, 2, 2, 1))
    img[0, 0, 1, 0] = img[0, 1, 0, 0] = 3.0  # equal maxima at (0, 1) and (1, 0)
    m2 = one_layer(GlobalMaxPooling2D(), (2, 2, 1))
    m2.forward(img)
    assert m2.backward(np.ones((1, 1)))[0, :, :, 0].tolist() == [[0.0, 1.0], [0.0, 0.0]]


def test_mask_from_an_embedding_reaches_the_global_pool():
    ids = np.array([[3, 1, 0, 0], [0, 2, 2, 4], [0, 0, 0, 0]])
    model = Sequential([Embedding(5, 3, mask_zero=True), GlobalAveragePooling1D()],
                       input_shape=(4,), dtype="float64", seed=1)
    table = model.layers[0].params["embeddings"]
    y = model.forward(ids)
    np.testing.assert_allclose(y[0], table[[3, 1]].mean(0), rtol=0, atol=EXACT)
    np.testing.assert_allclose(y[1], table[[2, 2, 4]].mean(0), rtol=0, atol=EXACT)
    np.testing.assert_array_equal(y[2], 0.0)


# ------------------------------------------------------- finite differences
FD_CASES = CONV_CASES[:8] + CONV_CASES[-3:]


@pytest.mark.parametrize("case", FD_CASES, ids=_ids(FD_CASES))
def test_conv1d_gradients_match_finite_differences(case):
    T, C, F, k, s, pad, d, act = case
    model = one_layer(Conv1D(F, k, strides=s, padding=pad, dilation=d, activation=act), (T, C))
    x = np.random.default_rng(4).standard_normal((2, T, C))
    if act == "relu":  # keep pre-activations away from the kink
        x = x * 0.5
    p_err, x_err = model_gradcheck(model, x)
    assert p_err <= TOL, f"parameter gradient relative error {p_err:.3g}"
    assert x_err <= TOL, f"input gradient relative error {x_err:.3g}"


def test_sequence_cnn_stack_gradients_match_finite_differences():
    model = Sequential([
        Conv1D(4, 3, padding="same", activation="tanh"),
        MaxPool1D(2),
        Conv1D(5, 2, strides=2, padding="same", dilation=1, activation="sigmoid"),
        AvgPool1D(2, strides=1),
        Conv1D(3, 1, activation="tanh"),
        GlobalMaxPooling1D(),
        Dense(4, activation="softmax"),
    ], input_shape=(13, 2), dtype="float64", seed=11)
    x = np.random.default_rng(4).standard_normal((3, 13, 2))
    p_err, x_err = model_gradcheck(model, x, max_params=300)
    assert p_err <= TOL, p_err
    assert x_err <= TOL, x_err


@pytest.mark.parametrize("pool", [GlobalAveragePooling1D, GlobalMaxPooling1D])
def test_masked_global_pool_model_gradients_match_finite_differences(pool):
    rng = np.random.default_rng(6)
    model = Sequential([Dense(5, activation="tanh"), pool(), Dense(3, activation="softmax")],
                       input_shape=(7, 4), dtype="float64", seed=2)
    x = rng.standard_normal((5, 7, 4))
    mask = masks_for(5, 7, rng)
    p_err, x_err = model_gradcheck(model, x, mask=mask)
    assert p_err <= TOL and x_err <= TOL, (p_err, x_err)


@pytest.mark.parametrize("pool", [GlobalAveragePooling2D, GlobalMaxPooling2D])
def test_global_pool2d_model_gradients_match_finite_differences(pool):
    model = Sequential([pool(), Dense(3, activation="tanh")], input_shape=(3, 4, 5),
                       dtype="float64", seed=2)
    x = np.random.default_rng(8).standard_normal((2, 3, 4, 5))
    p_err, x_err = model_gradcheck(model, x)
    assert p_err <= TOL and x_err <= TOL, (p_err, x_err)


def test_first_layer_skips_the_input_gradient_with_identical_parameter_gradients():
    model = Sequential([Conv1D(4, 3, strides=2, activation="relu"), MaxPool1D(2),
                        GlobalAveragePooling1D(), Dense(2)], input_shape=(15, 3),
                       dtype="float64", seed=1)
    x = np.random.default_rng(0).standard_normal((4, 15, 3))
    R = np.random.default_rng(1).standard_normal((4, 2))
    model.forward(x, training=True)
    dx = model.backward(R.copy())
    full = model.grads.copy()
    model.forward(x, training=True)
    assert dx is not None and model.backward(R.copy(), input_grad=False) is None
    np.testing.assert_array_equal(model.grads, full)
    for first in (MaxPool1D(2), AvgPool1D(2), GlobalMaxPooling1D(), GlobalAveragePooling2D()):
        shape = (6, 4, 3) if isinstance(first, GlobalAveragePooling2D) else (6, 3)
        m = Sequential([first, Dense(2)], input_shape=shape, dtype="float64")
        m.forward(np.ones((2,) + shape))
        assert m.backward(np.ones(m.forward(np.ones((2,) + shape)).shape),
                          input_grad=False) is None


# -------------------------------------------------------------- float32
def test_float32_agrees_with_float64():
    layers = lambda: [Conv1D(6, 3, padding="same", activation="relu"),  # noqa: E731
                      MaxPool1D(2), Conv1D(5, 2, strides=2, dilation=1, activation="tanh"),
                      AvgPool1D(2, strides=1), GlobalMaxPooling1D(), Dense(3)]
    m64 = Sequential(layers(), input_shape=(16, 4), dtype="float64", seed=5)
    m32 = Sequential(layers(), input_shape=(16, 4), dtype="float32", seed=5)
    m32.params[...] = m64.params
    rng = np.random.default_rng(0)
    x = rng.standard_normal((8, 16, 4))
    R = rng.standard_normal((8, 3))
    y64, y32 = m64.forward(x), m32.forward(x.astype(np.float32))
    assert y32.dtype == np.float32
    np.testing.assert_allclose(y32, y64, rtol=1e-5, atol=1e-5)
    d64, d32 = m64.backward(R.copy()), m32.backward(R.astype(np.float32))
    assert d32.dtype == np.float32 and m32.grads.dtype == np.float32
    np.testing.assert_allclose(d32, d64, rtol=1e-4, atol=1e-5)
    np.testing.assert_allclose(m32.grads, m64.grads, rtol=1e-4, atol=1e-4)
    mask = masks_for(8, 16, rng)
    g64 = Sequential([GlobalAveragePooling1D()], input_shape=(16, 4), dtype="float64")
    g32 = Sequential([GlobalAveragePooling1D()], input_shape=(16, 4), dtype="float32")
    np.testing.assert_allclose(g32.forward(x.astype(np.float32), mask=mask),
                               g64.forward(x, mask=mask), rtol=1e-6, atol=1e-6)


# ----------------------------------------------------- masks that cannot pass
@pytest.mark.parametrize("layer", [Conv1D(2, 3, padding="same"), MaxPool1D(2), AvgPool1D(2)])
def test_a_mask_reaching_a_convolution_or_local_pool_is_refused(layer):
    model = Sequential([Embedding(6, 3, mask_zero=True), layer, GlobalMaxPooling1D()],
                       input_shape=(8,), dtype="float64")
    name = type(layer).__name__
    with pytest.raises(ValueError, match=rf"{name} '{name.lower()}' does not support masking"):
        model.forward(np.array([[1, 2, 3, 0, 0, 0, 0, 0]]))
    plain = Sequential([layer.__class__(**layer.get_config())], input_shape=(8, 3))
    with pytest.raises(ValueError, match="does not support masking"):
        plain.forward(np.zeros((1, 8, 3), dtype=np.float32), mask=np.ones((1, 8)))


# ------------------------------------------------------------ bad input
def test_bad_constructor_arguments_name_the_layer_and_value():
    cases = [
        (lambda: Conv1D(0, 3), "Conv1D filters must be a positive integer, got 0"),
        (lambda: Conv1D(2.5, 3), "Conv1D filters must be a positive integer, got 2.5"),
        (lambda: Conv1D(4, (3, 3)), r"Conv1D kernel_size must be a positive integer \(or a "
                                    r"sequence of one\), got \(3, 3\)"),
        (lambda: Conv1D(4, 0), "Conv1D kernel_size must be a positive integer, got 0"),
        (lambda: Conv1D(4, 3, strides=0), "Conv1D strides must be a positive integer, got 0"),
        (lambda: Conv1D(4, 3, dilation=-1), "Conv1D dilation must be a positive integer, got -1"),
        (lambda: Conv1D(4, 3, padding="causal"),
         "Conv1D padding must be 'valid', 'same' or an integer >= 0 .*got 'causal'"),
        (lambda: Conv1D(4, 3, activation="mish"), "unknown activation 'mish'"),
        (lambda: Conv1D(4, 3, use_bias="yes"), "Conv1D use_bias must be True or False, got 'yes'"),
        (lambda: Conv1D(4, 3, kernel_initializer="ones"), "unknown initializer"),
        (lambda: MaxPool1D(0), "MaxPool1D pool_size must be a positive integer, got 0"),
        (lambda: AvgPool1D(2, strides=1.5),
         "AvgPool1D strides must be a positive integer, got 1.5"),
        (lambda: MaxPool1D(2, padding="full"),
         "MaxPool1D padding must be 'valid', 'same' or an integer >= 0 .*got 'full'"),
    ]
    for make, message in cases:
        with pytest.raises(ValueError, match=message):
            make()
    assert Conv1D(4, [3], strides=(2,)).kernel_size == 3


def test_bad_per_sample_shapes_name_the_layer_and_layout():
    with pytest.raises(ValueError, match=r"Conv1D 'conv1d' needs sequences of per-sample shape "
                                         r"\(T, C\).*got per-sample shape \(8, 8, 1\)"):
        Sequential([Conv1D(4, 3)], input_shape=(8, 8, 1))
    with pytest.raises(ValueError, match=r"MaxPool1D 'maxpool1d'.*\(T, C\).*\(8,\).*X.reshape"):
        Sequential([MaxPool1D(2)], input_shape=(8,))
    with pytest.raises(ValueError, match=r"Conv1D 'c': kernel extent 9 \(kernel_size 5, "
                                         r"dilation 2\) is larger than the padded input 8 "
                                         r"\(padding 'valid'\)"):
        Sequential([Conv1D(2, 5, dilation=2, name="c")], input_shape=(8, 1))
    with pytest.raises(ValueError, match=r"AvgPool1D 'avgpool1d': pool_size 5 is larger than "
                                         r"the padded input 4"):
        Sequential([AvgPool1D(5)], input_shape=(4, 2))
    assert Sequential([Conv1D(2, 5, padding="same")], input_shape=(3, 1)).output_shape == (3, 2)
    with pytest.raises(ValueError, match=r"GlobalMaxPooling1D 'globalmaxpooling1d' needs "
                                         r"per-sample shape \(T, C\).*\(4, 4, 1\)"):
        Sequential([GlobalMaxPooling1D()], input_shape=(4, 4, 1))
    with pytest.raises(ValueError, match=r"GlobalAveragePooling2D.*\(H, W, C\).*\(16, 3\)"):
        Sequential([GlobalAveragePooling2D()], input_shape=(16, 3))


def test_bad_batches_name_the_layer_and_shape():
    model = Sequential([Conv1D(4, 3), MaxPool1D(2), GlobalAveragePooling1D()],
                       input_shape=(10, 3))
    conv, pool, gap = model.layers
    with pytest.raises(ValueError, match=r"Conv1D 'conv1d' expects a batch of sequences "
                                         r"\(N, T, C\) = \(N, 10, 3\).*rank 2"):
        conv.forward(np.zeros((2, 10), dtype=np.float32))
    with pytest.raises(ValueError, match=r"expects 3 channels.*got 10.*channels-first.*"
                                         r"transpose\(0, 2, 1\)"):
        conv.forward(np.zeros((2, 3, 10), dtype=np.float32))
    with pytest.raises(ValueError, match=r"built for sequences of 10 steps, got 12"):
        conv.forward(np.zeros((2, 12, 3), dtype=np.float32))
    with pytest.raises(ValueError, match=r"MaxPool1D 'maxpool1d' expects 4 channels"):
        pool.forward(np.zeros((2, 8, 3), dtype=np.float32))
    with pytest.raises(ValueError, match=r"GlobalAveragePooling1D 'globalaveragepooling1d' "
                                         r"expects a batch of shape \(N, 4, 4\), "
                                         r"got .*\(2, 5, 4\)"):
        gap.forward(np.zeros((2, 5, 4), dtype=np.float32))
    with pytest.raises(ValueError, match=r"mask has shape \(2, 3\), expected \(N, T\) = \(2, 4\)"):
        gap.forward(np.zeros((2, 4, 4), dtype=np.float32), mask=np.ones((2, 3)))
    with pytest.raises(ValueError,
                       match=r"per-sample shape \(10, 2\), the model expects \(10, 3\)"):
        model.fit(np.zeros((4, 10, 2)), np.zeros(4), epochs=1, verbose=0)


# ------------------------------------------------------------- model files
def test_save_and_load_round_trip(tmp_path):
    names = ["Conv1D", "MaxPool1D", "AvgPool1D", "GlobalAveragePooling1D",
             "GlobalMaxPooling1D", "GlobalAveragePooling2D", "GlobalMaxPooling2D"]
    assert all(REGISTRY[n].__name__ == n for n in names)
    seq = Sequential([Conv1D(4, 3, strides=2, padding="same", dilation=2, activation="relu",
                             use_bias=False, name="c1"),
                      MaxPool1D(2, strides=1, padding="same"), AvgPool1D(2), Conv1D(3, 2),
                      GlobalMaxPooling1D(), Dense(3, activation="softmax")],
                     input_shape=(19, 2), seed=4)
    img = Sequential([GlobalAveragePooling2D(), Dense(2)], input_shape=(4, 4, 3), seed=1)
    img2 = Sequential([GlobalMaxPooling2D(), Dense(2)], input_shape=(4, 4, 3), seed=1)
    avg = Sequential([Dense(3), GlobalAveragePooling1D()], input_shape=(5, 2), seed=1)
    rng = np.random.default_rng(0)
    for i, (model, x) in enumerate([(seq, rng.random((5, 19, 2), dtype=np.float32)),
                                    (img, rng.random((3, 4, 4, 3), dtype=np.float32)),
                                    (img2, rng.random((3, 4, 4, 3), dtype=np.float32)),
                                    (avg, rng.random((3, 5, 2), dtype=np.float32))]):
        path = tmp_path / f"m{i}.npz"
        model.save(path)
        again = load_model(path)
        assert [type(a).__name__ for a in again.layers] == [type(b).__name__ for b in model.layers]
        assert [a.get_config() for a in again.layers] == [b.get_config() for b in model.layers]
        np.testing.assert_array_equal(again.predict_output(x), model.predict_output(x))
    conv = load_model(tmp_path / "m0.npz").layers[0]
    assert (conv.strides, conv.dilation, conv.padding, conv.use_bias, conv.name) == (2, 2, "same",
                                                                                     False, "c1")


# ------------------------------------------------------------------ accuracy
def test_conv1d_global_max_pool_reaches_93_percent_on_digits_rows_as_steps():
    """Digits as sequences: 8 steps (rows) of 8 features (columns)."""
    Xtr, ytr, Xte, yte = load_digits()
    Xtr, Xte = Xtr.reshape(-1, 8, 8), Xte.reshape(-1, 8, 8)
    t0 = time.perf_counter()
    model = Sequential([Conv1D(64, 5, activation="relu"), GlobalMaxPooling1D(),
                        Dense(10, activation="softmax")], input_shape=(8, 8), seed=0)
    model.fit(Xtr, ytr, epochs=20, batch_size=32, optimizer=RMSprop(lr=1e-3), verbose=0)
    acc = model.evaluate(Xte, yte)["accuracy"]
    elapsed = time.perf_counter() - t0
    print(f"digits Conv1D: test accuracy {acc:.4f} in {elapsed:.1f} s")
    assert acc >= 0.93, f"test accuracy {acc:.4f}"
    assert elapsed < 20, f"took {elapsed:.1f} s"
