"""Residual blocks: forward and gradients against hand-built PyTorch equivalents (float64),
central differences (nested blocks, masked sequences), the input-gradient protocol, a
child that overwrites its output gradient, shape errors naming the block, model files with
nested blocks, and a ResNet block with BatchNormalization (running statistics as state)."""
from __future__ import annotations

import json

import numpy as np
import pytest

from helpers.gradcheck import model_gradcheck
from sparknet import (
    LSTM,
    Activation,
    Conv2D,
    Dense,
    Embedding,
    Flatten,
    Layer,
    Residual,
    Sequential,
    SimpleRNN,
    load_model,
    save_model,
)
from sparknet.data import lengths_to_mask

TOL = 1e-6


def _randomize(model, seed=0):
    """Seeded N(0, 0.5^2) parameters, so that no bias sits at zero (a relu kink)."""
    model.params[...] = 0.5 * np.random.default_rng(seed).standard_normal(model.params.shape)


def _torch_params(torch, model):
    """``{(layer index, name): leaf tensor}`` holding copies of the model's parameters."""
    return {(i, name): torch.tensor(model.params[a:b].reshape(shape), requires_grad=True)
            for i, sl in enumerate(model.param_slices()) for name, (a, b, shape) in sl.items()}


def _compare_grads(model, P):
    """Largest |sparknet - torch| over every parameter gradient."""
    worst = 0.0
    for i, sl in enumerate(model.param_slices()):
        for name, (a, b, shape) in sl.items():
            ref = P[(i, name)].grad.detach().numpy()
            worst = max(worst, float(np.abs(model.grads[a:b].reshape(shape) - ref).max()))
    return worst


# ------------------------------------------------------------------ against PyTorch
def test_dense_blocks_nested_match_torch():
    torch = pytest.importorskip("torch", reason="torch not installed: torch comparison skipped")
    model = Sequential([
        Dense(6, activation="tanh"),
        Residual([Dense(8, activation="relu"), Dense(6)]),
        Residual([Dense(6, activation="tanh"), Residual([Dense(5, activation="relu"), Dense(6)]),
                  Dense(6)]),
        Dense(3),
    ], input_shape=(4,), dtype="float64")
    _randomize(model)
    rng = np.random.default_rng(1)
    x, R = rng.standard_normal((7, 4)), rng.standard_normal((7, 3))
    out = model.forward(x.copy(), training=True)
    dx = model.backward(R.copy())

    P = _torch_params(torch, model)
    xt = torch.tensor(x, requires_grad=True)

    def lin(h, i, pre):
        return h @ P[(i, pre + "kernel")].T + P[(i, pre + "bias")]

    h0 = torch.tanh(lin(xt, 0, ""))
    h1 = h0 + lin(torch.relu(lin(h0, 1, "0.")), 1, "1.")
    t = torch.tanh(lin(h1, 2, "0."))
    t = t + lin(torch.relu(lin(t, 2, "1.0.")), 2, "1.1.")   # the inner block
    h2 = h1 + lin(t, 2, "2.")
    ref = lin(h2, 3, "")
    (ref * torch.tensor(R)).sum().backward()

    assert np.abs(out - ref.detach().numpy()).max() < 1e-12
    assert _compare_grads(model, P) < 1e-11
    assert np.abs(dx - xt.grad.numpy()).max() < 1e-11


def test_conv_block_matches_torch():
    torch = pytest.importorskip("torch", reason="torch not installed: torch comparison skipped")
    F = torch.nn.functional
    model = Sequential([
        Conv2D(4, 3, padding="same", activation="relu"),
        Residual([Conv2D(5, 3, padding="same", activation="relu"), Conv2D(4, 3, padding="same")]),
        Flatten(), Dense(2),
    ], input_shape=(6, 5, 2), dtype="float64")
    _randomize(model, 3)
    rng = np.random.default_rng(4)
    x, R = rng.standard_normal((3, 6, 5, 2)), rng.standard_normal((3, 2))
    out = model.forward(x.copy(), training=True)
    dx = model.backward(R.copy())

    P = _torch_params(torch, model)
    xt = torch.tensor(x, requires_grad=True)

    def conv(h, i, pre):   # channels-last in and out; kernel (kh, kw, C, F) -> (F, C, kh, kw)
        y = F.conv2d(h.permute(0, 3, 1, 2), P[(i, pre + "kernel")].permute(3, 2, 0, 1),
                     P[(i, pre + "bias")], padding=1)
        return y.permute(0, 2, 3, 1)

    h0 = torch.relu(conv(xt, 0, ""))
    h1 = h0 + conv(torch.relu(conv(h0, 1, "0.")), 1, "1.")
    ref = h1.reshape(3, -1) @ P[(3, "kernel")].T + P[(3, "bias")]
    (ref * torch.tensor(R)).sum().backward()

    assert np.abs(out - ref.detach().numpy()).max() < 1e-12
    assert _compare_grads(model, P) < 1e-11
    assert np.abs(dx - xt.grad.numpy()).max() < 1e-11


# ---------------------------------------------------------- finite differences
def test_nested_blocks_gradients_match_finite_differences():
    model = Sequential([
        Residual([Dense(7, activation="tanh"), Dense(4)]),
        Residual([Residual([Dense(4, activation="sigmoid")]), Dense(6, activation="relu"),
                  Residual([Dense(6, activation="tanh")]), Dense(4)]),
        Dense(3),
    ], input_shape=(4,), dtype="float64")
    x = np.random.default_rng(5).standard_normal((5, 4))
    p_err, x_err = model_gradcheck(model, x)
    assert p_err < TOL and x_err < TOL


def test_masked_sequences_gradients_and_mask_reaches_the_children():
    model = Sequential([
        Residual([LSTM(4, return_sequences=True)]),
        Residual([Residual([SimpleRNN(4, return_sequences=True)]), Dense(4, activation="tanh")]),
        LSTM(3),
    ], input_shape=(5, 4), dtype="float64")
    rng = np.random.default_rng(6)
    x = rng.standard_normal((3, 5, 4))
    mask = lengths_to_mask(np.array([5, 3, 2]), 5)
    p_err, x_err = model_gradcheck(model, x, mask=mask)
    assert p_err < TOL and x_err < TOL

    block, lstm = model.layers[0], model.layers[0].layers[0]
    y = block.forward(x, mask=mask)
    assert np.array_equal(y, x + lstm.forward(x, mask=mask))   # the child ran with the mask
    assert not np.allclose(y, block.forward(x))                # ... and the mask mattered
    assert block.compute_mask(mask) is mask                    # x's mask goes on


def test_masked_token_sequences_through_nested_blocks():
    model = Sequential([
        Embedding(9, 4, mask_zero=True),
        Residual([Residual([LSTM(4, return_sequences=True)]), Dense(4)]),
        SimpleRNN(3),
    ], input_shape=(6,), dtype="float64")
    ids = np.array([[3, 1, 4, 1, 0, 0], [5, 8, 2, 6, 5, 3], [2, 7, 0, 0, 0, 0]])
    p_err, x_err = model_gradcheck(model, ids)
    assert p_err < TOL and x_err is None
    # padding changes nothing: the same rows with more padding steps give the same outputs
    longer = Sequential.from_config(dict(model.get_config(), input_shape=[8]))
    longer.params[...] = model.params
    padded = np.pad(ids, ((0, 0), (0, 2)))
    assert np.abs(longer.forward(padded) - model.forward(ids)).max() < 1e-12


# ------------------------------------------------------------------- protocol
class _Spy(Layer):
    """The identity, recording ``need_input_grad`` at each backward."""

    def __init__(self, name=None):
        super().__init__(name)
        self.seen = []

    def forward(self, x, training=False):
        return x

    def backward(self, dy):
        self.seen.append(self.need_input_grad)
        return dy if self.need_input_grad else None


class _DoubleInPlace(Layer):
    """``f(x) = 2 x``, whose backward doubles ``dy`` in place (the protocol allows it)."""

    def forward(self, x, training=False):
        return 2 * x

    def backward(self, dy):
        dy *= 2
        return dy


def test_first_block_skips_its_first_childs_input_gradient():
    first, inner = _Spy("first"), _Spy("inner")
    model = Sequential([Residual([first, Dense(4, activation="tanh"), inner]), Dense(2)],
                       input_shape=(4,), dtype="float64")
    rng = np.random.default_rng(7)
    x, dout, y = (rng.standard_normal(shape) for shape in ((6, 4), (6, 2), (6, 2)))
    model.forward(x, training=True)
    assert model.backward(dout.copy(), input_grad=False) is None
    g_skip = model.grads.copy()
    assert first.seen == [False] and inner.seen == [True]   # only the first child may skip
    assert first.need_input_grad and model.layers[0].need_input_grad   # restored afterwards

    model.forward(x, training=True)
    dx = model.backward(dout.copy(), input_grad=True)
    assert first.seen == [False, True] and inner.seen == [True, True]
    assert dx is not None and dx.shape == x.shape
    assert np.array_equal(model.grads, g_skip)   # the same parameter gradients either way

    model.loss_and_grad(x, y)                    # a training step asks for no input gradient
    assert first.seen[-1] is False


def test_child_overwriting_its_output_gradient_keeps_the_skip_path():
    model = Sequential([Residual([_DoubleInPlace()])], input_shape=(3,), dtype="float64")
    x = np.arange(6.0).reshape(2, 3)
    assert np.array_equal(model.forward(x), 3 * x)
    dy = np.ones((2, 3))
    assert np.array_equal(model.backward(dy.copy()), 3 * dy)   # dy + 2 dy, not 2 dy + 2 dy


def test_float32_block_agrees_with_float64():
    def layers():
        return [Dense(5, activation="relu"), Residual([Dense(9, activation="tanh"), Dense(5)])]

    m64 = Sequential(layers(), input_shape=(3,), dtype="float64")
    m32 = Sequential(layers(), input_shape=(3,), dtype="float32")
    m32.params[...] = m64.params
    x = np.random.default_rng(10).standard_normal((8, 3))
    assert m32.forward(x.astype(np.float32)).dtype == np.float32
    assert np.abs(m32.forward(x.astype(np.float32)) - m64.forward(x)).max() < 1e-5


# ---------------------------------------------------------------------- errors
def test_shape_change_is_refused_naming_the_block_and_both_shapes():
    model = Sequential([Dense(4), Residual([Dense(3)], name="block1")])
    with pytest.raises(ValueError, match=r"Residual 'block1'.*\(4,\) to \(3,\)"):
        model.build((2,))
    nested = Sequential([Residual([Dense(5), Residual([Dense(2)], name="inner")], name="outer")])
    with pytest.raises(ValueError, match=r"'outer'.*Residual 'inner'.*\(5,\) to \(2,\)"):
        nested.build((5,))
    conv = Sequential([Residual([Conv2D(3, 3)], name="convblock")])   # valid padding shrinks
    with pytest.raises(ValueError, match=r"'convblock'.*\(6, 6, 3\) to \(4, 4, 3\)"):
        conv.build((6, 6, 3))


def test_bad_layer_lists_are_refused():
    with pytest.raises(ValueError, match="at least one layer"):
        Residual([])
    with pytest.raises(ValueError, match="list of layers"):
        Residual(Dense(3))
    with pytest.raises(ValueError, match=r"layers\[1\] must be a sparknet Layer, got str"):
        Residual([Dense(3), "relu"])
    d = Dense(3)
    with pytest.raises(ValueError, match=r"layers\[1\].*appears twice"):
        Residual([d, d])


# --------------------------------------------------------------- save and load
def test_nested_configs_round_trip_through_a_model_file(tmp_path):
    model = Sequential([
        Dense(4),
        Residual([Dense(6, activation="relu"), Residual([Dense(6, activation="tanh")], name="in"),
                  Dense(4)], name="out"),
        Residual([Activation("tanh")]),
        Dense(2),
    ], input_shape=(3,), seed=4)
    config = model.get_config()
    again = Sequential.from_config(json.loads(json.dumps(config)))
    assert again.get_config() == config and np.array_equal(again.params, model.params)
    spec = config["layers"][1]
    assert spec["class"] == "Residual" and spec["config"]["layers"][1]["class"] == "Residual"

    model.fit(np.random.default_rng(0).standard_normal((32, 3)),
              np.random.default_rng(1).standard_normal((32, 2)), epochs=2, verbose=0)
    path = tmp_path / "res.npz"
    save_model(model, path)
    loaded = load_model(path)
    x = np.random.default_rng(2).standard_normal((5, 3))
    assert loaded.get_config() == model.get_config()
    assert np.array_equal(loaded.params, model.params)
    assert np.array_equal(loaded.forward(x), model.forward(x))
    names = [n for n, _ in loaded.layers[1].param_specs()]
    assert names == ["0.kernel", "0.bias", "1.0.kernel", "1.0.bias", "2.kernel", "2.bias"]


# ------------------------------------------------------- ResNet block with BatchNorm
def _batch_norm():
    try:
        from sparknet.layers.normalization import BatchNormalization
    except ImportError as exc:  # the layer family is not in this tree
        print(f"skipped: sparknet.layers.normalization is absent ({exc})")
        pytest.skip(f"BatchNormalization unavailable: {exc}")
    return BatchNormalization


def _resnet(BN, dtype="float64"):
    return Sequential([
        Conv2D(4, 3, padding="same"),
        Residual([Conv2D(4, 3, padding="same"), BN(), Activation("relu"),
                  Conv2D(4, 3, padding="same"), BN()], name="block"),
        Activation("relu"), Flatten(), Dense(3),
    ], input_shape=(5, 5, 2), dtype=dtype)


def test_resnet_block_with_batch_norm_matches_torch_with_running_statistics():
    BN = _batch_norm()
    torch = pytest.importorskip("torch", reason="torch not installed: torch comparison skipped")
    F = torch.nn.functional
    model = _resnet(BN)
    _randomize(model, 11)
    rng = np.random.default_rng(12)
    x, R = rng.standard_normal((4, 5, 5, 2)), rng.standard_normal((4, 3))
    assert [n for n, _ in model.layers[1].state_specs()] == [
        "1.running_mean", "1.running_var", "4.running_mean", "4.running_var"]
    state0 = model.state.copy()
    out = model.forward(x.copy(), training=True)
    dx = model.backward(R.copy())

    P = _torch_params(torch, model)
    running = {k: torch.tensor(v) for k, v in (("1m", np.zeros(4)), ("1v", np.ones(4)),
                                               ("4m", np.zeros(4)), ("4v", np.ones(4)))}
    xt = torch.tensor(x, requires_grad=True)

    def conv(h, i, pre):
        y = F.conv2d(h.permute(0, 3, 1, 2), P[(i, pre + "kernel")].permute(3, 2, 0, 1),
                     P[(i, pre + "bias")], padding=1)
        return y.permute(0, 2, 3, 1)

    def bn(h, k, training):
        y = F.batch_norm(h.permute(0, 3, 1, 2), running[k + "m"], running[k + "v"],
                         P[(1, k + ".gamma")], P[(1, k + ".beta")], training=training,
                         momentum=0.1, eps=1e-5)
        return y.permute(0, 2, 3, 1)

    def net(inp, training):
        h0 = conv(inp, 0, "")
        f = bn(conv(torch.relu(bn(conv(h0, 1, "0."), "1", training)), 1, "3."), "4", training)
        h = torch.relu(h0 + f).reshape(inp.shape[0], -1)
        return h @ P[(4, "kernel")].T + P[(4, "bias")]

    ref = net(xt, True)
    (ref * torch.tensor(R)).sum().backward()
    assert np.abs(out - ref.detach().numpy()).max() < 1e-11
    assert _compare_grads(model, P) < 1e-10
    assert np.abs(dx - xt.grad.numpy()).max() < 1e-10

    # the running statistics moved through the container's state views, as torch's buffers
    sl = model.state_slices()[1]
    for name, key in (("1.running_mean", "1m"), ("1.running_var", "1v"),
                      ("4.running_mean", "4m"), ("4.running_var", "4v")):
        a, b, _ = sl[name]
        assert np.abs(model.state[a:b] - running[key].numpy()).max() < 1e-12
    assert not np.array_equal(model.state, state0)
    # inference normalises with them
    x2 = rng.standard_normal((2, 5, 5, 2))
    with torch.no_grad():
        ref2 = net(torch.tensor(x2), False).numpy()
    assert np.abs(model.forward(x2) - ref2).max() < 1e-11


def test_resnet_block_with_batch_norm_gradients_trains_and_saves_its_state(tmp_path):
    BN = _batch_norm()
    model = _resnet(BN)
    x = np.random.default_rng(13).standard_normal((4, 5, 5, 2))
    # finite differences through batch statistics (training-mode forward)
    model.params[...] = 0.5 * np.random.default_rng(14).standard_normal(model.params.shape)
    R = np.random.default_rng(15).standard_normal((4, 3))
    model.forward(x, training=True)
    ga = model.backward(R.copy())
    g = model.grads.copy()
    eps, worst = 1e-6, 0.0
    saved_state = model.state.copy()

    def f():
        model.state[...] = saved_state
        return float((model.forward(x, training=True) * R).sum())

    for i in np.random.default_rng(16).choice(model.n_params, 60, replace=False):
        old = model.params[i]
        model.params[i] = old + eps
        fp = f()
        model.params[i] = old - eps
        fm = f()
        model.params[i] = old
        worst = max(worst, abs((fp - fm) / (2 * eps) - g[i]) / max(abs(g[i]), 1e-3))
    assert worst < 1e-5
    assert ga.shape == x.shape

    # a short fit in float32 moves the running statistics, which the model file keeps
    m32 = _resnet(BN, "float32")
    X = np.random.default_rng(17).standard_normal((32, 5, 5, 2)).astype(np.float32)
    y = np.random.default_rng(18).standard_normal((32, 3)).astype(np.float32)
    hist = m32.fit(X, y, epochs=3, batch_size=8, verbose=0)
    assert np.isfinite(hist.history["loss"]).all()
    a, b, _ = m32.state_slices()[1]["1.running_var"]
    assert not np.allclose(m32.state[a:b], 1.0)
    save_model(m32, tmp_path / "resnet.npz")
    loaded = load_model(tmp_path / "resnet.npz")
    assert np.array_equal(loaded.state, m32.state)
    assert np.array_equal(loaded.forward(X[:5]), m32.forward(X[:5]))
