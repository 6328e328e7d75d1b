"""Explicit padding (PyTorch's ``padding=p``: ``p`` zeros on both sides of each axis) on the
convolutions and pools: equal to the same layer with ``"valid"`` padding on the input padded
by hand, gradients against central differences, the values refused, model files, and
against ``torch.nn.functional`` where PyTorch is installed."""
from __future__ import annotations

import numpy as np
import pytest

from helpers.gradcheck import model_gradcheck
from sparknet import (
    AvgPool2D,
    Conv1D,
    Conv2D,
    Dense,
    Flatten,
    MaxPool2D,
    Sequential,
    load_model,
    save_model,
)
from sparknet.layers import AvgPool1D, MaxPool1D


def _pair_of_models(layer, valid, shape, padded_shape, seed=0):
    """``layer`` and its ``"valid"`` twin (``valid``), float64, with the same weights."""
    model = Sequential([layer], input_shape=shape, dtype="float64", seed=seed)
    twin = Sequential([valid], input_shape=padded_shape, dtype="float64", seed=seed)
    twin.params[...] = model.params
    return model, twin


@pytest.mark.parametrize("strides, padding, dilation", [
    (1, 1, 1), (2, 1, 1), (2, (2, 1), 1), (1, 3, 2), (3, (0, 2), 1)])
def test_conv2d_padding_is_valid_convolution_of_the_zero_padded_image(strides, padding, dilation):
    ph, pw = padding if isinstance(padding, tuple) else (padding, padding)
    model, twin = _pair_of_models(
        Conv2D(4, 3, strides=strides, padding=padding, dilation=dilation, activation="tanh"),
        Conv2D(4, 3, strides=strides, dilation=dilation, activation="tanh"),
        (8, 7, 2), (8 + 2 * ph, 7 + 2 * pw, 2))
    x = np.random.default_rng(1).standard_normal((3, 8, 7, 2))
    want = twin.predict_output(np.pad(x, ((0, 0), (ph, ph), (pw, pw), (0, 0))))
    got = model.predict_output(x)
    assert got.shape == want.shape and np.abs(got - want).max() < 1e-12
    p_err, x_err = model_gradcheck(model, x)
    assert p_err < 1e-6 and x_err < 1e-6


@pytest.mark.parametrize("strides, padding", [(2, 1), (1, 1), (2, (1, 0))])
def test_pools_with_padding_are_pools_of_the_padded_image_over_its_real_taps(strides, padding):
    ph, pw = padding if isinstance(padding, tuple) else (padding, padding)
    x = np.random.default_rng(2).standard_normal((3, 6, 7, 2))
    pads = ((0, 0), (ph, ph), (pw, pw), (0, 0))
    shape, padded = (6, 7, 2), (6 + 2 * ph, 7 + 2 * pw, 2)
    mx, mx_valid = _pair_of_models(MaxPool2D(3, strides, padding=padding),
                                   MaxPool2D(3, strides), shape, padded)
    want = mx_valid.predict_output(np.pad(x, pads, constant_values=-1e300))
    assert np.array_equal(mx.predict_output(x), want)
    av, av_valid = _pair_of_models(AvgPool2D(3, strides, padding=padding),
                                   AvgPool2D(3, strides), shape, padded)
    sums = av_valid.predict_output(np.pad(x, pads))
    counts = av_valid.predict_output(np.pad(np.ones_like(x), pads))
    assert np.abs(av.predict_output(x) - sums / counts).max() < 1e-12
    model = Sequential([Conv2D(3, 2, activation="tanh"), MaxPool2D(3, strides, padding=padding),
                        AvgPool2D(2, 1, padding=1), Flatten(), Dense(2)],
                       input_shape=shape, dtype="float64")
    p_err, x_err = model_gradcheck(model, x)
    assert p_err < 1e-6 and x_err < 1e-6


def test_one_dimensional_layers_take_padding_too():
    x = np.random.default_rng(3).standard_normal((3, 9, 2))
    conv, valid = _pair_of_models(Conv1D(4, 3, strides=2, padding=1), Conv1D(4, 3, strides=2),
                                  (9, 2), (11, 2))
    want = valid.predict_output(np.pad(x, ((0, 0), (1, 1), (0, 0))))
    assert np.abs(conv.predict_output(x) - want).max() < 1e-12
    mx, mx_valid = _pair_of_models(MaxPool1D(3, 2, padding=1), MaxPool1D(3, 2), (9, 2), (11, 2))
    padded = np.pad(x, ((0, 0), (1, 1), (0, 0)), constant_values=-1e300)
    assert np.array_equal(mx.predict_output(x), mx_valid.predict_output(padded))
    model = Sequential([Conv1D(3, 3, padding=2, activation="tanh"), AvgPool1D(3, 2, padding=1),
                        Flatten(), Dense(2)], input_shape=(9, 2), dtype="float64")
    p_err, x_err = model_gradcheck(model, x)
    assert p_err < 1e-6 and x_err < 1e-6


def test_bad_paddings_are_refused_naming_the_layer():
    for make, message in [
        (lambda: Conv2D(2, 3, padding=-1), r"Conv2D padding must be 'valid', 'same' or an "
                                           r"integer >= 0 or 2 of them .*got -1"),
        (lambda: Conv2D(2, 3, padding="full"), r"Conv2D padding .*got 'full'"),
        (lambda: Conv2D(2, 3, padding=(1, 1, 1)), r"got \(1, 1, 1\)"),
        (lambda: Conv1D(2, 3, padding=(1, 2)), r"Conv1D padding must be 'valid', 'same' or an "
                                               r"integer >= 0 \(zeros"),
        (lambda: MaxPool2D(3, padding=2), r"MaxPool2D padding \(2, 2\) must be at most half "
                                          r"the pool window \(3, 3\)"),
        (lambda: AvgPool1D(2, padding=2), r"AvgPool1D padding \(2,\) must be at most half"),
        (lambda: Conv2D(2, 3, padding=True), r"got True"),
    ]:
        with pytest.raises(ValueError, match=message):
            make()
    with pytest.raises(ValueError, match=r"Conv2D 'c': kernel extent 9x9 .*larger than the "
                                         r"padded input 6x6 \(padding \(1, 1\)\)"):
        Sequential([Conv2D(2, 9, padding=1, name="c")], input_shape=(4, 4, 1))


def test_explicit_padding_round_trips_through_a_model_file(tmp_path):
    model = Sequential([Conv2D(3, 3, strides=2, padding=(1, 2)), MaxPool2D(3, 2, padding=1),
                        Flatten(), Dense(2)], input_shape=(8, 8, 1), seed=0)
    save_model(model, tmp_path / "padded.npz")
    loaded = load_model(tmp_path / "padded.npz")
    assert loaded.layers[0].padding == (1, 2) and loaded.layers[1].padding == (1, 1)
    x = np.random.default_rng(4).standard_normal((2, 8, 8, 1)).astype(np.float32)
    assert np.array_equal(loaded.predict_output(x), model.predict_output(x))


def test_padding_matches_torch():
    torch = pytest.importorskip("torch", reason="torch not installed: torch comparison skipped")
    F = torch.nn.functional
    model = Sequential([Conv2D(4, 7, strides=2, padding=3), MaxPool2D(3, 2, padding=1)],
                       input_shape=(16, 16, 3), dtype="float64", seed=0)
    x = np.random.default_rng(5).standard_normal((2, 16, 16, 3))
    kernel, bias = model.layers[0].params["kernel"], model.layers[0].params["bias"]
    xt = torch.from_numpy(x).permute(0, 3, 1, 2)
    w = torch.from_numpy(np.ascontiguousarray(kernel.transpose(3, 2, 0, 1)))
    y = F.max_pool2d(F.conv2d(xt, w, torch.from_numpy(bias), stride=2, padding=3), 3, 2, 1)
    want = y.permute(0, 2, 3, 1).numpy()
    got = model.predict_output(x)
    assert got.shape == want.shape == (2, 4, 4, 4)
    assert np.abs(got - want).max() < 1e-12
