"""Parallel branches merged by concatenation, product or sum: central differences (an
identity branch, the block as the first layer), a SwiGLU gate against PyTorch autograd
(float64), the shapes refused, model files, and an Inception-style CNN on the digits."""
from __future__ import annotations

import numpy as np
import pytest

from helpers.gradcheck import model_gradcheck
from sparknet import (
    Activation,
    Adam,
    Conv2D,
    Dense,
    Flatten,
    MaxPool2D,
    Parallel,
    Residual,
    RMSNormalization,
    Sequential,
    load_model,
    save_model,
)
from sparknet.layers import GlobalAveragePooling2D


def _branches(merge):
    if merge == "concat":
        return [[Dense(3, activation="tanh")], [], [Dense(2), Activation("sigmoid")]]
    return [[Dense(5, activation="silu")], [Dense(5), Activation("tanh")], []]


@pytest.mark.parametrize("first", [False, True])
@pytest.mark.parametrize("merge", ["concat", "multiply", "add"])
def test_gradients_match_central_differences(merge, first):
    layers = [Parallel(_branches(merge), merge=merge), Dense(2)]
    if not first:
        layers.insert(0, Dense(5, activation="tanh"))
    model = Sequential(layers, input_shape=(5,), dtype="float64")
    assert model.layers[-2].output_shape == ((10,) if merge == "concat" else (5,))
    p_err, x_err = model_gradcheck(model, np.random.default_rng(0).standard_normal((4, 5)))
    assert p_err < 1e-6 and x_err < 1e-6
    images = Sequential([
        Conv2D(4, 3, padding="same"),
        Parallel([[], [Conv2D(3, 3, padding="same", activation="relu")], [MaxPool2D(3, 1, padding=1)]]),
        GlobalAveragePooling2D(), Dense(2),
    ], input_shape=(5, 5, 2), dtype="float64")
    assert images.layers[1].output_shape == (5, 5, 11)
    p_err, x_err = model_gradcheck(images, np.random.default_rng(1).standard_normal((3, 5, 5, 2)))
    assert p_err < 1e-6 and x_err < 1e-6


def test_a_swiglu_block_matches_torch_autograd():
    torch = pytest.importorskip("torch", reason="torch not installed: torch comparison skipped")
    F = torch.nn.functional
    model = Sequential([Residual([
        RMSNormalization(),
        Parallel([[Dense(12, activation="silu", use_bias=False)], [Dense(12, use_bias=False)]],
                 merge="multiply"),
        Dense(6, use_bias=False)])], input_shape=(4, 6), dtype="float64")
    model.params[...] = 0.5 * np.random.default_rng(2).standard_normal(model.params.shape)
    rng = np.random.default_rng(3)
    x, R = rng.standard_normal((3, 4, 6)), rng.standard_normal((3, 4, 6))
    y = model.forward(x, training=True)
    dx = model.backward(R.copy())
    block = model.layers[0]
    norm, gate, down = block.layers
    w1, w3 = (torch.tensor(b[0].params["kernel"], requires_grad=True) for b in gate.branches)
    w2 = torch.tensor(down.params["kernel"], requires_grad=True)
    g = torch.tensor(norm.params["gamma"], requires_grad=True)
    xt = torch.tensor(x, requires_grad=True)
    h = F.rms_norm(xt, (6,), g, 1e-6)
    ref = xt + (F.silu(h @ w1.T) * (h @ w3.T)) @ w2.T
    (ref * torch.tensor(R)).sum().backward()
    assert np.abs(y - ref.detach().numpy()).max() < 1e-12
    assert np.abs(dx - xt.grad.numpy()).max() < 1e-12
    for layer, t in [(gate.branches[0][0], w1), (gate.branches[1][0], w3), (down, w2)]:
        assert np.abs(layer.grads["kernel"] - t.grad.numpy()).max() < 1e-12
    assert np.abs(norm.grads["gamma"] - g.grad.numpy()).max() < 1e-12
    assert [n for n, _ in block.param_specs()] == [
        "0.gamma", "1.0.0.kernel", "1.1.0.kernel", "2.kernel"]


def test_shapes_and_arguments_refused_naming_the_block():
    for branches, merge, message in [
        ([[Dense(3)], [Dense(4)]], "multiply",
         r"Parallel 'p': its branches' outputs, \(3,\), \(4,\), multiply element by element"),
        ([[Conv2D(2, 3)], []], "concat",
         r"Parallel 'p': its branches' outputs, \(3, 3, 2\), \(5, 5, 2\), join on the last axis"),
    ]:
        with pytest.raises(ValueError, match=message):
            shape = (5, 5, 2) if merge == "concat" else (2,)
            Sequential([Parallel(branches, merge=merge, name="p")], input_shape=shape)
    d = Dense(2)
    for make, message in [
        (lambda: Parallel([[Dense(2)]]), r"two or more lists of layers"),
        (lambda: Parallel([[Dense(2)], []], merge="max"), r"merge must be one of 'concat', "
                                                          r"'multiply', 'add', got 'max'"),
        (lambda: Parallel([[d], [d]]), r"branches\[1\]\[0\] \(Dense 'dense\w*'\) appears twice"),
        (lambda: Parallel([Dense(2), []]), r"branches\[0\] must be a list of layers"),
    ]:
        with pytest.raises(ValueError, match=message):
            make()


def test_a_parallel_block_round_trips_through_a_model_file(tmp_path):
    model = Sequential([Dense(4), Parallel([[Dense(3)], [], [Dense(2, activation="relu")]]),
                        Parallel([[Dense(5)], [Dense(5, activation="sigmoid")]], merge="multiply"),
                        Dense(2)], input_shape=(3,), seed=0)
    save_model(model, tmp_path / "parallel.npz")
    loaded = load_model(tmp_path / "parallel.npz")
    assert repr(loaded.layers[1]) == repr(model.layers[1]) and loaded.layers[2].merge == "multiply"
    x = np.random.default_rng(4).standard_normal((6, 3)).astype(np.float32)
    assert np.array_equal(loaded.predict_output(x), model.predict_output(x))


def test_an_inception_style_cnn_learns_the_digits(digits):
    Xtr, ytr, Xte, yte = digits
    model = Sequential([
        Conv2D(8, 3, padding="same", activation="relu"),
        Parallel([[Conv2D(8, 1, activation="relu")],
                  [Conv2D(8, 3, padding="same", activation="relu")],
                  [MaxPool2D(3, 1, padding=1), Conv2D(8, 1, activation="relu")]]),
        MaxPool2D(2), Flatten(), Dense(10, activation="softmax"),
    ], input_shape=(8, 8, 1), seed=0)
    model.fit(Xtr.reshape(-1, 8, 8, 1), ytr, epochs=8, batch_size=32, optimizer=Adam(lr=3e-3),
              verbose=0)
    accuracy = float((model.predict_output(Xte.reshape(-1, 8, 8, 1)).argmax(1) == yte).mean())
    print(f"Inception-style CNN, 8 epochs on the digits: accuracy {accuracy:.3f}")
    assert accuracy >= 0.9
