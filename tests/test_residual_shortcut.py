"""Residual blocks with a projection shortcut, ``y = g(x) + f(x)``, the blocks that halve an
image and widen it in a ResNet: against a hand-built PyTorch block (float64, BatchNorm in
training mode), central differences, the shapes they refuse, model files, and a ResNet with
a downsampling block trained on the digits."""
from __future__ import annotations

import numpy as np
import pytest

from helpers.gradcheck import model_gradcheck
from sparknet import (
    Activation,
    Adam,
    Conv2D,
    Dense,
    Residual,
    Sequential,
    load_model,
    save_model,
)
from sparknet.layers import BatchNormalization, GlobalAveragePooling2D


def _downsampling(dtype="float64", seed=0):
    """A stem, then a block that halves the image and widens it from 3 to 4 channels."""
    return Sequential([
        Conv2D(3, 3, padding="same", activation="relu"),
        Residual([Conv2D(4, 3, strides=2, padding="same", activation="relu"),
                  Conv2D(4, 3, padding="same")],
                 shortcut=[Conv2D(4, 1, strides=2), BatchNormalization()]),
        Activation("relu"), GlobalAveragePooling2D(), Dense(3),
    ], input_shape=(7, 7, 2), dtype=dtype, seed=seed)


def test_a_downsampling_block_matches_torch():
    torch = pytest.importorskip("torch", reason="torch not installed: torch comparison skipped")
    F = torch.nn.functional
    model = _downsampling()
    model.params[...] = 0.4 * np.random.default_rng(1).standard_normal(model.params.shape)
    rng = np.random.default_rng(2)
    x, R = rng.standard_normal((4, 7, 7, 2)), rng.standard_normal((4, 3))
    out = model.forward(x.copy(), training=True)
    dx = model.backward(R.copy())
    block = model.layers[1]
    assert [n for n, _ in block.param_specs()] == [
        "0.kernel", "0.bias", "1.kernel", "1.bias", "shortcut.0.kernel", "shortcut.0.bias",
        "shortcut.1.gamma", "shortcut.1.beta"]

    P = {(i, name): torch.tensor(model.params[a:b].reshape(shape), requires_grad=True)
         for i, sl in enumerate(model.param_slices()) for name, (a, b, shape) in sl.items()}
    xt = torch.tensor(x, requires_grad=True)

    def conv(h, i, pre, stride=1, pad=1):   # channels-last; sparknet's 'same' pads the end
        k = P[(i, pre + "kernel")].permute(3, 2, 0, 1)
        h = h.permute(0, 3, 1, 2)
        return F.conv2d(h, k, P[(i, pre + "bias")], stride=stride, padding=pad).permute(0, 2, 3, 1)

    h0 = torch.relu(conv(xt, 0, ""))
    f = conv(torch.relu(conv(h0, 1, "0.", stride=2)), 1, "1.")
    g = conv(h0, 1, "shortcut.0.", stride=2, pad=0)
    g = F.batch_norm(g.permute(0, 3, 1, 2), None, None, P[(1, "shortcut.1.gamma")],
                     P[(1, "shortcut.1.beta")], training=True, eps=1e-5).permute(0, 2, 3, 1)
    ref = torch.relu(f + g).mean(dim=(1, 2)) @ P[(4, "kernel")].T + P[(4, "bias")]
    (ref * torch.tensor(R)).sum().backward()

    assert np.abs(out - ref.detach().numpy()).max() < 1e-11
    for i, sl in enumerate(model.param_slices()):
        for name, (a, b, shape) in sl.items():
            want = P[(i, name)].grad.numpy()
            assert np.abs(model.grads[a:b].reshape(shape) - want).max() < 1e-10, (i, name)
    assert np.abs(dx - xt.grad.numpy()).max() < 1e-10


@pytest.mark.parametrize("first", [False, True])
def test_shortcut_gradients_match_finite_differences(first):
    """Dense stacks of two widths (``first``: the block is the model's first layer, which
    asks its stacks for no input gradient)."""
    layers = [Residual([Dense(7, activation="tanh"), Dense(6)], shortcut=[Dense(6)]),
              Residual([Dense(6, activation="relu")], shortcut=[Dense(6, activation="tanh")]),
              Dense(3)]
    if not first:
        layers.insert(0, Dense(5, activation="tanh"))
    model = Sequential(layers, input_shape=(4,), dtype="float64")
    p_err, x_err = model_gradcheck(model, np.random.default_rng(3).standard_normal((5, 4)))
    assert p_err < 1e-6 and x_err < 1e-6


def test_shapes_a_block_cannot_add_are_refused_naming_it():
    with pytest.raises(ValueError, match=r"Residual 'down' adds its input to the output of its "
                                         r"layers.*map \(6, 6, 2\) to \(3, 3, 4\) \(give the block "
                                         r"a shortcut=\[...\]"):
        Sequential([Residual([Conv2D(4, 3, strides=2, padding="same")], name="down")],
                   input_shape=(6, 6, 2))
    with pytest.raises(ValueError, match=r"Residual 'down' adds the outputs of its layers and of "
                                         r"its shortcut, which must have one shape: they map "
                                         r"\(6, 6, 2\) to \(3, 3, 4\) and \(6, 6, 4\)"):
        Sequential([Residual([Conv2D(4, 3, strides=2, padding="same")],
                             shortcut=[Conv2D(4, 1)], name="down")], input_shape=(6, 6, 2))
    d = Dense(3)
    for bad, message in [
        (lambda: Residual([Dense(3)], shortcut=[]), r"Residual shortcut must hold at least one"),
        (lambda: Residual([Dense(3)], shortcut=Dense(3)), r"Residual shortcut must be a list"),
        (lambda: Residual([d], shortcut=[d]), r"Residual shortcut\[0\] .* appears twice"),
    ]:
        with pytest.raises(ValueError, match=message):
            bad()


def test_a_block_with_a_shortcut_round_trips_through_a_model_file(tmp_path):
    model = _downsampling("float32", seed=4)
    X = np.random.default_rng(5).standard_normal((16, 7, 7, 2)).astype(np.float32)
    model.fit(X, np.random.default_rng(6).standard_normal((16, 3)).astype(np.float32),
              epochs=1, batch_size=8, loss="mse", verbose=0)
    save_model(model, tmp_path / "down.npz")
    loaded = load_model(tmp_path / "down.npz")
    assert repr(loaded.layers[1]) == repr(model.layers[1])
    assert loaded.layers[1].shortcut is not None and len(loaded.layers[1].shortcut) == 2
    assert np.array_equal(loaded.params, model.params)
    assert np.array_equal(loaded.state, model.state)
    assert np.array_equal(loaded.predict_output(X), model.predict_output(X))


def test_a_resnet_with_a_downsampling_block_learns_the_digits(digits):
    Xtr, ytr, Xte, yte = digits
    images = (Xtr.reshape(-1, 8, 8, 1), Xte.reshape(-1, 8, 8, 1))
    model = Sequential([
        Conv2D(8, 3, padding="same", activation="relu"),
        Residual([Conv2D(8, 3, padding="same"), BatchNormalization(), Activation("relu"),
                  Conv2D(8, 3, padding="same"), BatchNormalization()]),
        Activation("relu"),
        Residual([Conv2D(16, 3, strides=2, padding="same"), BatchNormalization(),
                  Activation("relu"), Conv2D(16, 3, padding="same"), BatchNormalization()],
                 shortcut=[Conv2D(16, 1, strides=2), BatchNormalization()]),
        Activation("relu"), GlobalAveragePooling2D(), Dense(10, activation="softmax"),
    ], input_shape=(8, 8, 1), seed=0)
    model.fit(images[0], ytr, epochs=6, batch_size=32, optimizer=Adam(lr=3e-3), verbose=0)
    accuracy = float((model.predict_output(images[1]).argmax(1) == yte).mean())
    print(f"ResNet with a downsampling block, 6 epochs on the digits: accuracy {accuracy:.3f}")
    assert accuracy >= 0.9
