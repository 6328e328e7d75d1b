"""Padding.

- Explicit padding (PyTorch's ``padding=p``: ``p`` zeros on both sides of each axis) on the
  convolutions and pools: equal to the same layer with ``"valid"`` padding on the input
  padded by hand, gradients against central differences, the values refused, model files,
  and against ``torch.nn.functional`` where PyTorch is installed.
- ZeroPadding1D and ZeroPadding2D: the output is ``np.pad`` of the input, the gradient its
  slice, model files, the values refused, and the same function in ONNX Runtime, PyTorch
  (``to_torch``, ``nn.ZeroPad2d`` and ``F.pad`` in ``from_torch``) and Keras (Keras'
  ResNet50 application)."""
from __future__ import annotations

import numpy as np
import pytest

from helpers.gradcheck import model_gradcheck, rel_error
from sparknet import (
    AvgPool2D,
    Conv1D,
    Conv2D,
    Dense,
    Flatten,
    MaxPool2D,
    Sequential,
    ZeroPadding1D,
    ZeroPadding2D,
    load_model,
    save_model,
)
from sparknet.layers import AvgPool1D, Embedding, MaxPool1D


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


# ------------------------------------------------------------ padding layers
def _images_model(dtype="float64"):
    return Sequential([ZeroPadding2D(((0, 1), (2, 1))), Conv2D(3, 3, activation="tanh"),
                       ZeroPadding2D(1), MaxPool2D(3, 2), Flatten(), Dense(2)],
                      input_shape=(5, 6, 2), dtype=dtype, seed=0)


def test_the_output_is_the_zero_padded_input_and_the_gradient_its_slice():
    x = np.random.default_rng(0).standard_normal((3, 5, 6, 2))
    layer = Sequential([ZeroPadding2D(((0, 1), (2, 1)))], input_shape=(5, 6, 2),
                       dtype="float64")
    want = np.pad(x, ((0, 0), (0, 1), (2, 1), (0, 0)))
    assert np.array_equal(layer.predict_output(x), want)
    seq = Sequential([ZeroPadding1D((2, 0))], input_shape=(4, 3), dtype="float64")
    s = x[:, :4, :3, 0]
    assert np.array_equal(seq.predict_output(s), np.pad(s, ((0, 0), (2, 0), (0, 0))))
    assert ZeroPadding2D(2).padding == ((2, 2), (2, 2)) and ZeroPadding1D(1).padding == ((1, 1),)
    p_err, x_err = model_gradcheck(_images_model(), x)
    assert p_err < 1e-6 and x_err < 1e-6
    model = Sequential([Conv1D(3, 2, activation="tanh"), ZeroPadding1D((1, 2)), Flatten(),
                        Dense(2)], input_shape=(6, 2), dtype="float64")
    p_err, x_err = model_gradcheck(model, np.random.default_rng(5).standard_normal((3, 6, 2)))
    assert p_err < 1e-6 and x_err < 1e-6


def test_padding_layers_round_trip_and_refuse_bad_values(tmp_path):
    model = _images_model("float32")
    save_model(model, tmp_path / "pad.npz")
    loaded = load_model(tmp_path / "pad.npz")
    assert loaded.layers[0].padding == ((0, 1), (2, 1))
    x = np.random.default_rng(1).standard_normal((2, 5, 6, 2)).astype(np.float32)
    assert np.array_equal(loaded.predict_output(x), model.predict_output(x))
    for make, message in [
        (lambda: ZeroPadding2D(-1), r"ZeroPadding2D padding must be an integer >= 0 or a pair"),
        (lambda: ZeroPadding2D((1, 2, 3)), r"ZeroPadding2D padding must be an int, 2 of them"),
        (lambda: ZeroPadding1D((1, 2, 3)), r"ZeroPadding1D padding .*got \(1, 2, 3\)"),
        (lambda: Sequential([ZeroPadding2D(1)], input_shape=(5, 3)),
         r"ZeroPadding2D 'zeropadding2d' needs images \(H, W, C\), channels last, got "
         r"per-sample shape \(5, 3\)"),
        (lambda: Sequential([Embedding(10, 4, mask_zero=True), ZeroPadding1D(1)],
                            input_shape=(5,)).predict_output(np.ones((1, 5), np.int64)),
         r"ZeroPadding1D 'zeropadding1d' does not support masking"),
    ]:
        with pytest.raises(ValueError, match=message):
            make()


def test_padding_layers_in_onnx_runtime():
    pytest.importorskip("onnxruntime", reason="onnxruntime not installed: ONNX comparison skipped")
    from sparknet.onnx import to_onnx

    for model, x in [
        (_images_model("float32"),
         np.random.default_rng(2).standard_normal((3, 5, 6, 2)).astype(np.float32)),
        (Sequential([Conv1D(3, 2), ZeroPadding1D((1, 2)), Conv1D(2, 3), Flatten()],
                    input_shape=(6, 2), seed=0),
         np.random.default_rng(3).standard_normal((3, 6, 2)).astype(np.float32)),
    ]:
        import onnxruntime as ort

        proto = to_onnx(model)
        assert "Pad" in {n.op_type for n in proto.graph.node}
        session = ort.InferenceSession(proto.SerializeToString(),
                                       providers=["CPUExecutionProvider"])
        got = session.run(None, {session.get_inputs()[0].name: x})[0]
        assert rel_error(got, model.predict_output(x)) < 1e-6


def test_padding_in_and_out_of_pytorch(torch):
    from sparknet.interop import from_torch, to_torch

    nn, F = torch.nn, torch.nn.functional
    model = _images_model()
    x = np.random.default_rng(4).standard_normal((3, 5, 6, 2))
    with torch.no_grad():
        assert rel_error(to_torch(model)(torch.from_numpy(x)).numpy(), model.predict_output(x)) < 1e-13

    class Net(nn.Module):
        def __init__(self):
            super().__init__()
            self.pad, self.conv = nn.ZeroPad2d((2, 1, 0, 1)), nn.Conv2d(2, 3, 3)
            self.fc = nn.Linear(3 * 2 * 4, 2)

        def forward(self, x):
            x = F.max_pool2d(F.pad(torch.relu(self.conv(self.pad(x))), (1, 1, 1, 1)), 3, 2)
            return self.fc(torch.flatten(F.pad(x, (0, 0, 0, 0)), 1))

    net = Net().double().eval()
    images = np.moveaxis(x, -1, 1)
    with torch.no_grad():
        want = net(torch.from_numpy(images)).numpy()
    sk = from_torch(net, (2, 5, 6))
    kinds = [type(layer).__name__ for layer in sk.layers]
    assert kinds[:3] == ["ZeroPadding2D", "Conv2D", "ZeroPadding2D"]
    assert sk.layers[0].padding == ((0, 1), (2, 1))
    assert rel_error(sk.predict_output(x), want) < 1e-13
    with pytest.raises(ValueError, match=r"module 1 \(ConstantPad1d\): pads \(1, 1\) of \(3,\) .*not the channels"):
        from_torch(nn.Sequential(nn.Linear(4, 3), nn.ConstantPad1d(1, 0.0)))
    with pytest.raises(ValueError, match=r"value 1\.0"):
        from_torch(nn.Sequential(nn.Conv2d(2, 3, 3), nn.ConstantPad2d(1, 1.0)), (2, 5, 5))


def test_keras_resnet50_comes_in_with_its_zero_padding(keras):
    """Keras' ResNet50 application (random weights, 23.5M parameters): ZeroPadding2D, the
    bottleneck blocks with their projection shortcuts, predicting as Keras."""
    from sparknet.interop import from_keras

    km = keras.applications.ResNet50(weights=None, input_shape=(32, 32, 3), classes=10)
    rng = np.random.default_rng(0)
    for w in km.weights:
        v = keras.ops.convert_to_numpy(w)
        if "variance" in w.path:
            w.assign(rng.uniform(0.5, 1.5, v.shape).astype(v.dtype))
        elif "mean" in w.path or "beta" in w.path:
            w.assign((rng.standard_normal(v.shape) * 0.1).astype(v.dtype))
    model = from_keras(km)
    kinds = [type(layer).__name__ for layer in model.layers]
    assert kinds.count("ZeroPadding2D") == 2 and kinds.count("Residual") == 16
    assert sum(layer.shortcut is not None for layer in model.layers
               if type(layer).__name__ == "Residual") == 4
    x = rng.standard_normal((2, 32, 32, 3)).astype(np.float32)
    err = rel_error(model.predict_output(x), km.predict(x, verbose=0))
    print(f"Keras ResNet50 ({model.params.size:,} parameters): float32 rel {err:.1e}")
    assert err < 1e-5
