"""Conv2D, MaxPool2D and AvgPool2D: values against naive references, gradients against
finite differences (float64), float32 against float64, the tie rule of max pooling,
error messages, model files, the paper's CNN from the docs, and accuracy on digits."""
from __future__ import annotations

import math
import re
import time

import numpy as np
import pytest

import sparknet
from helpers.gradcheck import model_gradcheck
from sparknet import (
    AvgPool2D,
    Conv2D,
    Dense,
    Dropout,
    Flatten,
    MaxPool2D,
    RMSprop,
    Sequential,
    load_model,
)
from sparknet.datasets import load_digits

TOL = 1e-6


# ---------------------------------------------------------------- references
def ref_out_pad(size, k, s, d, padding):
    """Output size and leading padding of one axis ("same": ceil(size / s), pad split
    with the extra pixel after)."""
    eff = d * (k - 1) + 1
    if padding == "valid":
        return (size - eff) // s + 1, 0
    out = math.ceil(size / s)
    return out, max((out - 1) * s + eff - size, 0) // 2


def naive_conv(x, w, b, strides, padding, dilation):
    """Direct seven-loop convolution (cross-correlation), channels-last."""
    N, H, W, C = x.shape
    KH, KW, _, F = w.shape
    (sh, sw), (dh, dw) = strides, dilation
    OH, pt = ref_out_pad(H, KH, sh, dh, padding)
    OW, pl = ref_out_pad(W, KW, sw, dw, padding)
    y = np.zeros((N, OH, OW, F))
    for n in range(N):
        for i in range(OH):
            for j in range(OW):
                for f in range(F):
                    acc = b[f]
                    for p in range(KH):
                        for q in range(KW):
                            ih, iw = i * sh - pt + p * dh, j * sw - pl + q * dw
                            if 0 <= ih < H and 0 <= iw < W:
                                for c in range(C):
                                    acc += x[n, ih, iw, c] * w[p, q, c, f]
                    y[n, i, j, f] = acc
    return y


def naive_pool(x, k, s, padding, kind):
    """Max (first maximum in row-major window order wins) or mean over in-image taps.
    Returns the output and, for max, a (N, OH, OW, C, 2) array of winner positions."""
    N, H, W, C = x.shape
    OH, pt = ref_out_pad(H, k[0], s[0], 1, padding)
    OW, pl = ref_out_pad(W, k[1], s[1], 1, padding)
    y = np.zeros((N, OH, OW, C))
    win = np.zeros((N, OH, OW, C, 2), dtype=int)
    for n in range(N):
        for i in range(OH):
            for j in range(OW):
                for c in range(C):
                    taps = [(i * s[0] - pt + p, j * s[1] - pl + q)
                            for p in range(k[0]) for q in range(k[1])]
                    taps = [(a, b) for a, b in taps if 0 <= a < H and 0 <= b < W]
                    vals = [x[n, a, b, c] for a, b in taps]
                    if kind == "max":
                        best = 0
                        for t in range(1, len(vals)):
                            if vals[t] > vals[best]:
                                best = t
                        y[n, i, j, c] = vals[best]
                        win[n, i, j, c] = taps[best]
                    else:
                        y[n, i, j, c] = np.mean(vals)
    return y, win


# Conv2D configurations: (H, W, C, filters, kernel, strides, padding, dilation, activation)
CONV_CASES = [
    (7, 6, 3, 4, 3, 1, "valid", 1, "tanh"),
    (7, 8, 2, 3, (3, 2), 2, "same", 1, "identity"),
    (9, 7, 2, 3, 3, (2, 1), "same", 2, "tanh"),
    (9, 9, 3, 2, 3, 1, "valid", 2, "sigmoid"),
    (8, 7, 1, 5, 2, 2, "valid", 1, "relu"),
    (6, 5, 3, 2, 2, 1, "same", 1, "tanh"),
    (5, 5, 4, 3, 1, 1, "valid", 1, "tanh"),      # 1x1: the path without im2col
    (5, 6, 2, 2, 1, 2, "same", 1, "identity"),   # 1x1 strided
    (11, 10, 2, 2, 4, 2, "same", 2, "tanh"),
]


def _ids(cases):
    return ["x".join(map(str, c[:3])) + f"-f{c[3]}-k{c[4]}-s{c[5]}-{c[6]}-d{c[7]}-{c[8]}" for c in cases]


def _act(name, z):
    return {"identity": z, "tanh": np.tanh(z), "relu": np.maximum(z, 0),
            "sigmoid": 1 / (1 + np.exp(-z))}[name]


# ------------------------------------------------------------------ conv values
@pytest.mark.parametrize("case", CONV_CASES, ids=_ids(CONV_CASES))
def test_conv_forward_matches_naive_reference(case):
    H, W, C, F, k, s, pad, d, act = case
    model = Sequential([Conv2D(F, k, strides=s, padding=pad, dilation=d, activation=act)],
                       input_shape=(H, W, C), dtype="float64", seed=3)
    layer = model.layers[0]
    rng = np.random.default_rng(1)
    layer.params["bias"][...] = rng.standard_normal(F)
    x = rng.standard_normal((3, H, W, C))
    want = _act(act, naive_conv(x, layer.params["kernel"], layer.params["bias"],
                                layer.strides, pad, layer.dilation))
    got = model.forward(x)
    assert got.shape == want.shape
    np.testing.assert_allclose(got, want, rtol=1e-12, atol=1e-12)
    # training mode (columns kept for backward) computes the same thing
    np.testing.assert_allclose(model.forward(x, training=True), want, rtol=1e-12, atol=1e-12)


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_im2col_matches_naive_and_col2im_is_its_adjoint(dtype):
    from sparknet import _conv
    rng = np.random.default_rng(0)
    x = rng.standard_normal((2, 6, 7, 3)).astype(dtype)
    KH, KW, sh, sw, ph, pw, dh, dw = 3, 2, 2, 1, 1, 1, 1, 2
    OH, OW = (6 + 2 * ph - dh * (KH - 1) - 1) // sh + 1, (7 + 2 * pw - dw * (KW - 1) - 1) // sw + 1
    cols = np.empty((2 * OH * OW, KH * KW * 3), dtype)
    _conv.im2col(x, cols, KH, KW, OH, OW, sh, sw, ph, pw, dh, dw)
    xp = np.zeros((2, 6 + 2 * ph + 2, 7 + 2 * pw + 2, 3), dtype)
    xp[:, ph:ph + 6, pw:pw + 7] = x
    want = np.stack([xp[n, i * sh + p * dh, j * sw + q * dw]
                     for n in range(2) for i in range(OH) for j in range(OW)
                     for p in range(KH) for q in range(KW)]).reshape(cols.shape)
    np.testing.assert_array_equal(cols, want)
    c = rng.standard_normal(cols.shape).astype(dtype)
    back = np.empty_like(x)
    _conv.col2im(c, back, KH, KW, OH, OW, sh, sw, ph, pw, dh, dw)
    # <im2col(x), c> == <x, col2im(c)>
    np.testing.assert_allclose((cols * c).sum(), (x * back).sum(), rtol=1e-5)


def test_same_padding_sizes():
    # stride 1: output keeps the size; stride 2: ceil(size / 2); odd total padding goes after
    assert Sequential([Conv2D(2, 3, padding="same")], input_shape=(7, 6, 1)).output_shape == (7, 6, 2)
    assert Sequential([Conv2D(2, 4, padding="same")], input_shape=(7, 6, 1)).output_shape == (7, 6, 2)
    assert Sequential([Conv2D(2, 3, strides=2, padding="same")],
                      input_shape=(7, 6, 1)).output_shape == (4, 3, 2)
    assert Sequential([Conv2D(2, 3, dilation=2)], input_shape=(7, 6, 1)).output_shape == (3, 2, 2)
    # a 2x2 kernel with "same": no padding before, one row/column after
    m = Sequential([Conv2D(1, 2, padding="same", use_bias=False)], input_shape=(2, 2, 1), dtype="float64")
    m.layers[0].params["kernel"][...] = 1.0
    x = np.array([1.0, 2.0, 3.0, 4.0]).reshape(1, 2, 2, 1)
    np.testing.assert_array_equal(m.forward(x)[0, :, :, 0], [[10.0, 6.0], [7.0, 4.0]])


# --------------------------------------------------------------- conv gradients
@pytest.mark.parametrize("case", CONV_CASES, ids=_ids(CONV_CASES))
def test_conv_gradients_match_finite_differences(case):
    H, W, C, F, k, s, pad, d, act = case
    model = Sequential([Conv2D(F, k, strides=s, padding=pad, dilation=d, activation=act)],
                       input_shape=(H, W, C), dtype="float64", seed=5)
    rng = np.random.default_rng(2)
    model.layers[0].params["bias"][...] = 0.1 * rng.standard_normal(F)
    x = rng.standard_normal((2, H, W, C))
    if act == "relu":  # keep pre-activations away from the kink
        x = x * 0.5
    p_err, x_err = model_gradcheck(model, x)
    assert p_err <= TOL, f"parameter gradient relative error {p_err:.3g}"
    assert x_err <= TOL, f"input gradient relative error {x_err:.3g}"


def test_conv_without_bias_gradients():
    model = Sequential([Conv2D(3, 3, strides=2, padding="same", use_bias=False, activation="tanh")],
                       input_shape=(7, 9, 2), dtype="float64")
    assert [n for n, _ in model.layers[0].param_specs()] == ["kernel"]
    x = np.random.default_rng(0).standard_normal((2, 7, 9, 2))
    p_err, x_err = model_gradcheck(model, x)
    assert p_err <= TOL and x_err <= TOL


def test_cnn_stack_gradients_match_finite_differences():
    model = Sequential([
        Conv2D(4, 3, padding="same", activation="tanh"),
        MaxPool2D(2),
        Conv2D(5, 3, strides=2, padding="same", dilation=1, activation="sigmoid"),
        AvgPool2D(2, strides=1),
        Conv2D(3, 1, activation="tanh"),
        Flatten(),
        Dense(4, activation="softmax"),
    ], input_shape=(9, 10, 2), dtype="float64", seed=11)
    x = np.random.default_rng(4).standard_normal((3, 9, 10, 2))
    p_err, x_err = model_gradcheck(model, x, max_params=500)
    assert p_err <= TOL, p_err
    assert x_err <= TOL, x_err


def test_backward_after_inference_forward_equals_training_forward():
    model = Sequential([Conv2D(4, 3, strides=2, padding="same", activation="tanh"), Flatten(),
                        Dense(3)], input_shape=(9, 8, 2), dtype="float64", seed=2)
    rng = np.random.default_rng(0)
    x = rng.standard_normal((4, 9, 8, 2))
    dout = rng.standard_normal((4, 3))
    model.forward(x, training=True)
    dx1 = model.backward(dout.copy())
    g1 = model.grads.copy()
    model.forward(x, training=False)  # no columns kept: backward rebuilds them
    dx2 = model.backward(dout.copy())
    np.testing.assert_array_equal(g1, model.grads)
    np.testing.assert_array_equal(dx1, dx2)


def test_first_layer_skips_input_gradient_with_identical_parameter_gradients():
    model = Sequential([Conv2D(4, 3, padding="same", activation="relu"), MaxPool2D(2),
                        Conv2D(3, 2, activation="tanh"), Flatten(), Dense(3)],
                       input_shape=(8, 8, 2), dtype="float64", seed=6)
    rng = np.random.default_rng(1)
    x = rng.standard_normal((4, 8, 8, 2))
    dout = rng.standard_normal((4, 3))
    model.forward(x, training=True)
    dx = model.backward(dout.copy())
    g = model.grads.copy()
    model.forward(x, training=True)
    assert model.backward(dout.copy(), input_grad=False) is None
    np.testing.assert_array_equal(model.grads, g)
    assert dx.shape == x.shape and model.layers[0].need_input_grad
    for first in (MaxPool2D(2), AvgPool2D(2)):
        m = Sequential([first, Flatten(), Dense(2)], input_shape=(4, 4, 1), dtype="float64")
        m.forward(x[:, :4, :4, :1], training=True)
        assert m.backward(np.ones((4, 2)), input_grad=False) is None


# -------------------------------------------------------------------- pooling
POOL_CASES = [
    ("max", 2, None, "valid", (6, 6, 3)),
    ("max", 3, 1, "valid", (6, 5, 2)),          # overlapping windows
    ("max", 3, 2, "valid", (7, 7, 2)),          # overlapping windows
    ("max", (2, 3), (1, 2), "same", (5, 7, 2)),
    ("max", 2, None, "same", (5, 5, 1)),
    ("avg", 2, None, "valid", (6, 6, 3)),
    ("avg", 3, 1, "valid", (6, 5, 2)),
    ("avg", 3, 2, "same", (7, 6, 2)),
    ("avg", (3, 2), (2, 1), "same", (5, 6, 2)),
]


def _pool_layer(kind, k, s, pad):
    cls = MaxPool2D if kind == "max" else AvgPool2D
    return cls(k, strides=s, padding=pad)


@pytest.mark.parametrize("case", POOL_CASES, ids=[f"{c[0]}-k{c[1]}-s{c[2]}-{c[3]}" for c in POOL_CASES])
def test_pool_forward_and_gradients(case):
    kind, k, s, pad, shape = case
    layer = _pool_layer(kind, k, s, pad)
    model = Sequential([layer], input_shape=shape, dtype="float64")
    rng = np.random.default_rng(7)
    x = rng.standard_normal((2,) + shape)  # continuous values: no ties
    want, _ = naive_pool(x, layer.pool_size, layer.strides, pad, kind)
    np.testing.assert_allclose(model.forward(x), want, rtol=1e-13, atol=1e-13)
    _, x_err = model_gradcheck(model, x)
    assert x_err <= TOL, f"input gradient relative error {x_err:.3g}"


@pytest.mark.parametrize("k,s", [(2, 2), (3, 1), (2, 1), ((3, 2), (2, 1))])
def test_maxpool_ties_first_in_row_major_order_takes_the_gradient(k, s):
    rng = np.random.default_rng(0)
    # few distinct values: many ties inside and across (overlapping) windows
    x = rng.integers(0, 3, size=(2, 6, 7, 3)).astype(np.float64)
    x[0, :, :, 0] = 1.0  # a constant channel: every window is one big tie
    layer = MaxPool2D(k, strides=s)
    model = Sequential([layer], input_shape=x.shape[1:], dtype="float64")
    y = model.forward(x)
    want_y, win = naive_pool(x, layer.pool_size, layer.strides, "valid", "max")
    np.testing.assert_array_equal(y, want_y)
    dy = rng.standard_normal(y.shape)
    dx = model.backward(dy.copy())
    want = np.zeros_like(x)
    N, OH, OW, C = y.shape
    for n in range(N):
        for i in range(OH):
            for j in range(OW):
                for c in range(C):
                    a, b = win[n, i, j, c]
                    want[n, a, b, c] += dy[n, i, j, c]
    np.testing.assert_allclose(dx, want, rtol=0, atol=1e-15)
    # on the constant channel each window's top-left tap wins
    if layer.strides == layer.pool_size:
        ph, pw = layer.pool_size
        top_left = np.zeros(x.shape[1:3], dtype=bool)
        top_left[0:OH * ph:ph, 0:OW * pw:pw] = True
        assert np.all((dx[0, :, :, 0] != 0) <= top_left)
        np.testing.assert_array_equal(dx[0, 0:OH * ph:ph, 0:OW * pw:pw, 0], dy[0, :, :, 0])


def test_maxpool_tie_rule_small_example():
    x = np.array([[3.0, 5.0], [5.0, 1.0]]).reshape(1, 2, 2, 1)
    model = Sequential([MaxPool2D(2)], input_shape=(2, 2, 1), dtype="float64")
    assert model.forward(x).item() == 5.0
    dx = model.backward(np.array([[[[2.0]]]]))
    np.testing.assert_array_equal(dx[0, :, :, 0], [[0.0, 2.0], [0.0, 0.0]])


def test_avgpool_same_padding_counts_only_image_taps():
    x = np.arange(9.0).reshape(1, 3, 3, 1)
    model = Sequential([AvgPool2D(2, padding="same")], input_shape=(3, 3, 1), dtype="float64")
    np.testing.assert_allclose(model.forward(x)[0, :, :, 0],
                               [[(0 + 1 + 3 + 4) / 4, (2 + 5) / 2], [(6 + 7) / 2, 8.0]])


# ---------------------------------------------------------- float32 vs float64
def test_float32_agrees_with_float64():
    model64 = Sequential([
        Conv2D(8, 3, padding="same", activation="relu"), MaxPool2D(2),
        Conv2D(6, 3, strides=2, dilation=1, activation="tanh"), AvgPool2D(2, strides=1),
        Flatten(), Dense(5, activation="softmax"),
    ], input_shape=(12, 11, 3), dtype="float64", seed=9)
    model32 = model64.clone(dtype="float32")
    assert model32.params.dtype == np.float32
    rng = np.random.default_rng(3)
    x = rng.standard_normal((6, 12, 11, 3))
    y = rng.integers(0, 5, size=6)
    out64 = model64.forward(x)
    out32 = model32.forward(x.astype(np.float32))
    assert out32.dtype == np.float32
    np.testing.assert_allclose(out32, out64, rtol=1e-4, atol=1e-5)
    model64.loss_and_grad(x, y)
    model32.loss_and_grad(x.astype(np.float32), y)
    g64, g32 = model64.grads, model32.grads
    assert np.linalg.norm(g32 - g64) <= 1e-4 * np.linalg.norm(g64)


@pytest.mark.parametrize("shape,filters,k,s,pad,d", [
    ((13, 11, 3), 45, 3, 1, "same", 1),    # row and column tails in every GEMM
    ((9, 10, 7), 13, (2, 3), 2, "valid", 1),
    ((8, 8, 5), 33, 1, 1, "valid", 1),     # 1x1 path
    ((12, 9, 2), 17, 3, (1, 2), "same", 2),
])
def test_float32_avx512_gemm_matches_blas(shape, filters, k, s, pad, d):
    """float32 convolutions use the AVX-512 GEMM of csrc/sgemm_avx512.h when the CPU has
    it; it must agree with the BLAS path on forward and backward."""
    from sparknet import _conv
    if _conv.set_gemm_backend("auto") != "avx512":
        pytest.skip("this CPU has no AVX-512: float32 convolutions use BLAS only")
    model = Sequential([Conv2D(filters, k, strides=s, padding=pad, dilation=d, activation="relu")],
                       input_shape=shape, seed=1)
    rng = np.random.default_rng(5)
    x = rng.standard_normal((7,) + shape).astype(np.float32)
    dout = rng.standard_normal((7,) + model.output_shape).astype(np.float32)
    results = []
    try:
        for backend in ("avx512", "blas"):
            _conv.set_gemm_backend("auto" if backend == "avx512" else "blas")
            y = model.forward(x, training=True)
            dx = model.backward(dout.copy())
            results.append((y, dx, model.grads.copy()))
    finally:
        _conv.set_gemm_backend("auto")
    for a, b in zip(*results):
        assert np.linalg.norm(a - b) <= 1e-5 * np.linalg.norm(b)


# --------------------------------------------------------------- bad input
def test_bad_constructor_arguments_name_the_problem():
    with pytest.raises(ValueError, match="filters must be a positive integer"):
        Conv2D(0, 3)
    with pytest.raises(ValueError, match="filters must be a positive integer"):
        Conv2D(2.5, 3)
    with pytest.raises(ValueError, match="kernel_size must be a positive integer or a pair"):
        Conv2D(4, (3,))
    with pytest.raises(ValueError, match="kernel_size"):
        Conv2D(4, 0)
    with pytest.raises(ValueError, match="strides"):
        Conv2D(4, 3, strides=0)
    with pytest.raises(ValueError, match="dilation"):
        Conv2D(4, 3, dilation=(1, -1))
    with pytest.raises(ValueError, match="padding must be 'valid', 'same' or an integer"):
        Conv2D(4, 3, padding="full")
    with pytest.raises(ValueError, match="unknown activation 'mish'"):
        Conv2D(4, 3, activation="mish")
    with pytest.raises(ValueError, match="unknown initializer"):
        Conv2D(4, 3, kernel_initializer="ones")
    with pytest.raises(ValueError, match="MaxPool2D pool_size"):
        MaxPool2D(0)
    with pytest.raises(ValueError, match="AvgPool2D strides"):
        AvgPool2D(2, strides=(2, 0))
    with pytest.raises(ValueError, match="MaxPool2D padding"):
        MaxPool2D(2, padding="causal")


def test_wrong_rank_at_build_names_the_layout():
    with pytest.raises(ValueError, match=r"per-sample shape \(H, W, C\).*got per-sample shape \(64,\)"):
        Sequential([Conv2D(4, 3)], input_shape=(64,))
    with pytest.raises(ValueError, match=r"MaxPool2D.*\(H, W, C\).*\(8, 8\)"):
        Sequential([MaxPool2D(2)], input_shape=(8, 8))


def test_kernel_larger_than_padded_input():
    with pytest.raises(ValueError, match=r"kernel extent 5x5.*larger than the padded input 4x4"):
        Sequential([Conv2D(2, 5)], input_shape=(4, 4, 1))
    with pytest.raises(ValueError, match=r"kernel extent 5x3 \(kernel 3x2, dilation 2x2\).*6x2"):
        Sequential([Conv2D(2, (3, 2), dilation=2)], input_shape=(6, 2, 1))
    with pytest.raises(ValueError, match=r"pool window 3x3 is larger than the padded input 2x2"):
        Sequential([AvgPool2D(3)], input_shape=(2, 2, 1))
    # "same" padding makes room for any kernel
    assert Sequential([Conv2D(2, 5, padding="same")], input_shape=(4, 4, 1)).output_shape == (4, 4, 2)


def test_wrong_batch_rank_and_channels_in_forward():
    model = Sequential([Conv2D(4, 3), MaxPool2D(2)], input_shape=(8, 8, 3))
    with pytest.raises(ValueError, match=r"batch of images \(N, H, W, C\).*rank 3"):
        model.forward(np.zeros((2, 8, 8), dtype=np.float32))
    with pytest.raises(ValueError, match=r"expects 3 channels.*got 1"):
        model.forward(np.zeros((2, 8, 8, 1), dtype=np.float32))
    with pytest.raises(ValueError, match=r"channels-first.*transpose\(0, 2, 3, 1\)"):
        model.forward(np.zeros((2, 3, 8, 8), dtype=np.float32))
    with pytest.raises(ValueError, match=r"built for 8x8 images, got 9x8"):
        model.forward(np.zeros((2, 9, 8, 3), dtype=np.float32))
    with pytest.raises(ValueError, match=r"MaxPool2D.*expects 4 channels"):
        model.layers[1].forward(np.zeros((2, 6, 6, 3), dtype=np.float32))
    # through fit: the model's own input check names the per-sample shape
    with pytest.raises(ValueError, match=r"per-sample shape \(8, 8, 1\), the model expects \(8, 8, 3\)"):
        model.fit(np.zeros((4, 8, 8, 1)), np.zeros(4), epochs=1, verbose=0)


# ----------------------------------------------------- model files, the docs
def test_save_and_load_round_trip(tmp_path):
    model = Sequential([Conv2D(3, 3, strides=2, padding="same", dilation=1, activation="relu"),
                        MaxPool2D(2, strides=1), AvgPool2D((1, 2)), Flatten(),
                        Dense(4, activation="softmax")], input_shape=(9, 9, 2), seed=4)
    x = np.random.default_rng(0).random((5, 9, 9, 2), dtype=np.float32)
    path = tmp_path / "cnn.npz"
    model.save(path)
    again = load_model(path)
    assert [type(l).__name__ for l in again.layers] == ["Conv2D", "MaxPool2D", "AvgPool2D",
                                                        "Flatten", "Dense"]
    assert again.layers[0].strides == (2, 2) and again.layers[1].strides == (1, 1)
    np.testing.assert_array_equal(again.predict_proba(x), model.predict_proba(x))


def _doc_snippet() -> str:
    doc = sparknet.layers.conv.__doc__
    block = doc.split("::\n\n", 1)[1]
    lines = []
    for line in block.splitlines():
        if line and not line.startswith("    "):
            break
        lines.append(line[4:])
    return "\n".join(lines)


def test_paper_cnn_from_the_docs_builds_and_trains():
    snippet = _doc_snippet()
    assert len([ln for ln in snippet.splitlines() if ln.strip()]) <= 10
    scope: dict = {}
    exec(snippet, scope)  # the documented code, verbatim
    model = scope["paper_cnn"]
    shapes = [l.output_shape for l in model.layers]
    assert shapes == [(24, 24, 6), (12, 12, 6), (8, 8, 12), (4, 4, 12), (1, 1, 12), (12,), (10,)]
    assert re.search(r"AvgPool2D", snippet) and model.layers[1].pool_size == (2, 2)
    rng = np.random.default_rng(0)
    x = rng.random((32, 28, 28, 1), dtype=np.float32)
    y = rng.integers(0, 10, size=32)
    opt = RMSprop(lr=1e-3)
    before = model.params.copy()
    loss0, _ = model.train_on_batch(x, y, optimizer=opt)
    assert np.isfinite(loss0) and not np.array_equal(before, model.params)
    for _ in range(15):
        loss, _ = model.train_on_batch(x, y, optimizer=opt)
    assert loss < loss0  # it learns the batch


# ------------------------------------------------------------------ accuracy
@pytest.mark.slow
def test_cnn_reaches_98_percent_on_digits_within_60_seconds():
    Xtr, ytr, Xte, yte = load_digits(flat=False)  # fixed seeded stratified 25% test split
    assert Xtr.shape[1:] == (8, 8, 1) and len(Xte) == 450
    t0 = time.perf_counter()
    model = Sequential([
        Conv2D(32, 3, padding="same", activation="relu"),
        Conv2D(32, 3, padding="same", activation="relu"),
        MaxPool2D(2),
        Conv2D(64, 3, padding="same", activation="relu"),
        MaxPool2D(2),
        Flatten(),
        Dropout(0.3),
        Dense(64, activation="relu"),
        Dense(10, activation="softmax"),
    ], input_shape=(8, 8, 1), seed=0)
    opt = RMSprop(lr=1e-3)
    model.fit(Xtr, ytr, epochs=14, batch_size=32, optimizer=opt, verbose=0)
    opt.lr = 3e-4
    model.fit(Xtr, ytr, epochs=6, batch_size=32, optimizer=opt, verbose=0)
    acc = model.evaluate(Xte, yte)["accuracy"]
    elapsed = time.perf_counter() - t0
    print(f"digits CNN: test accuracy {acc:.4f} in {elapsed:.1f} s")
    assert acc >= 0.98, f"test accuracy {acc:.4f}"
    assert elapsed < 60, f"took {elapsed:.1f} s"
