"""sparknet.interop: models to and from PyTorch (float64, exact round trips) and from Keras 3
(float32, against Keras' predict; tested with the torch backend)."""

from __future__ import annotations

import numpy as np
import pytest

from sparknet import (
    GRU,
    LSTM,
    Activation,
    AvgPool2D,
    Conv2D,
    Dense,
    Dropout,
    Embedding,
    Flatten,
    Layer,
    LeakyReLU,
    MaxPool2D,
    Sequential,
    SimpleRNN,
)
from sparknet.layers import (
    AvgPool1D,
    BatchNormalization,
    Bidirectional,
    ColumnEmbedding,
    Conv1D,
    GlobalAveragePooling1D,
    GlobalAveragePooling2D,
    GlobalMaxPooling1D,
    GlobalMaxPooling2D,
    LayerNormalization,
    MaxPool1D,
    MultiHeadAttention,
    Parallel,
    PositionalEmbedding,
    Residual,
    RMSNormalization,
    SequenceMask,
    TransformerEncoder,
)

IMG = (7, 8, 2)
SEQ = (6, 4)
#: real steps: padding at the end, at the start, in between, an empty row, full rows
MASK = np.ones((7, SEQ[0]))
MASK[0, 4:] = 0
MASK[1, :3] = 0
MASK[2, [1, 3]] = 0
MASK[3, :] = 0


def randomize(model, seed=0):
    rng = np.random.default_rng(seed)
    model.params[...] = rng.standard_normal(model.params.shape) * 0.4
    model.state[...] = rng.uniform(0.5, 1.5, model.state.shape)
    return model


def rel(got, ref):
    ref = np.asarray(ref, np.float64)
    return float(np.abs(np.asarray(got, np.float64) - ref).max() / max(np.abs(ref).max(), 1e-300))


def _ids(rng, n):
    ids = rng.integers(1, 12, (n, SEQ[0]))
    ids[0, 4:] = 0
    ids[1, :2] = 0
    return ids


def _flagged(rng, n):
    return np.concatenate([rng.standard_normal((n,) + SEQ), MASK[:n, :, None]], axis=2)


# (id, layers, per-sample input shape, input maker, whether a mask input applies)
SPARKNET_CASES = [
    (
        "silu_leaky_relu",
        lambda: [
            Dense(8, activation="silu"),
            LeakyReLU(0.2),
            Dense(6),
            Activation("swish"),
            Conv1D(3, 2),
            LeakyReLU(),
            Flatten(),
            Dense(3, activation="softmax"),
        ],
        (4, 5),
        lambda r, n: r.standard_normal((n, 4, 5)),
        False,
    ),
    (
        "mlp",
        lambda: [
            Dense(8, activation="relu"),
            Dropout(0.3),
            Dense(6, activation="gelu"),
            Dense(4, activation="gelu_tanh"),
            Activation("sigmoid"),
            Dense(3, activation="softmax"),
        ],
        (5,),
        lambda r, n: r.standard_normal((n, 5)),
        False,
    ),
    (
        "cnn",
        lambda: [
            Conv2D(4, 3, padding="same", activation="relu"),
            BatchNormalization(),
            MaxPool2D(3, strides=2, padding="same"),
            Conv2D(5, (2, 3), strides=2, padding="same", dilation=1),
            AvgPool2D((3, 2), strides=(2, 1), padding="same"),
            Activation("softmax"),
            Flatten(),
            Dense(5, activation="softmax"),
        ],
        IMG,
        lambda r, n: r.random((n,) + IMG),
        False,
    ),
    (
        "cnn_global",
        lambda: [Conv2D(3, 2, dilation=2, activation="tanh"), GlobalMaxPooling2D()],
        IMG,
        lambda r, n: r.random((n,) + IMG),
        False,
    ),
    (
        "cnn_global_avg",
        lambda: [Conv2D(3, 2, activation="softmax"), GlobalAveragePooling2D()],
        IMG,
        lambda r, n: r.random((n,) + IMG),
        False,
    ),
    (
        "conv1d",
        lambda: [
            Conv1D(3, 2, strides=2, padding="same", dilation=2),
            MaxPool1D(2),
            AvgPool1D(2, padding="same"),
            GlobalMaxPooling1D(),
        ],
        (9, 4),
        lambda r, n: r.random((n, 9, 4)),
        False,
    ),
    (
        "recurrent",
        lambda: [
            LSTM(5, return_sequences=True),
            Bidirectional(GRU(3, return_sequences=True), merge_mode="sum"),
            LayerNormalization(),
            Bidirectional(SimpleRNN(4, activation="relu")),
            Dense(3, activation="softmax"),
        ],
        SEQ,
        lambda r, n: r.standard_normal((n,) + SEQ),
        True,
    ),
    (
        "lstm_state",
        lambda: [LSTM(5, return_state=True)],
        SEQ,
        lambda r, n: r.standard_normal((n,) + SEQ),
        True,
    ),
    (
        "bidirectional_sequences",
        lambda: [Bidirectional(LSTM(4, return_sequences=True)), GlobalAveragePooling1D()],
        SEQ,
        lambda r, n: r.standard_normal((n,) + SEQ),
        True,
    ),
    (
        "embedding",
        lambda: [
            Embedding(12, 4, mask_zero=True),
            GRU(3, return_sequences=True),
            GlobalMaxPooling1D(),
        ],
        (SEQ[0],),
        _ids,
        False,
    ),
    (
        "sequence_mask",
        lambda: [
            SequenceMask(),
            BatchNormalization(center=False),
            SimpleRNN(3, return_sequences=True),
            LayerNormalization(scale=False),
            GlobalAveragePooling1D(),
        ],
        (SEQ[0], SEQ[1] + 1),
        _flagged,
        False,
    ),
    (
        "attention",
        lambda: [
            PositionalEmbedding(8),
            MultiHeadAttention(2, causal=True),
            TransformerEncoder(2, 8, dropout=0.1),
            TransformerEncoder(1, 6, activation="gelu_tanh", norm_first=True),
            GlobalAveragePooling1D(),
            Dense(3, activation="softmax"),
        ],
        SEQ,
        lambda r, n: r.standard_normal((n,) + SEQ),
        True,
    ),
    (
        "residual",
        lambda: [
            Conv2D(4, 3, padding="same"),
            Residual(
                [
                    Conv2D(4, 3, padding="same", activation="relu"),
                    BatchNormalization(),
                    Residual([Conv2D(4, 1)]),
                ]
            ),
            GlobalMaxPooling2D(),
            Dense(2, activation="softmax"),
        ],
        IMG,
        lambda r, n: r.random((n,) + IMG),
        False,
    ),
    (
        "parallel",
        lambda: [
            Conv2D(3, 3, padding="same"),
            Parallel([[], [Conv2D(2, 3, padding="same", activation="relu")], [MaxPool2D(3, 1, padding=1)]]),
            Parallel([[Dense(4, activation="silu")], [Dense(4)]], merge="multiply"),
            GlobalAveragePooling2D(),
            Dense(2, activation="softmax"),
        ],
        IMG,
        lambda r, n: r.random((n,) + IMG),
        False,
    ),
    (
        "rms_norm",
        lambda: [Dense(6), RMSNormalization(eps=1e-5), Dense(3, activation="softmax")],
        SEQ,
        lambda r, n: r.standard_normal((n,) + SEQ),
        False,
    ),
    (
        "residual_shortcut",
        lambda: [
            Conv2D(3, 3, padding=(1, 2)),
            MaxPool2D(3, 2, padding=1),
            AvgPool2D(2, 1, padding=1),
            Residual(
                [Conv2D(4, 3, strides=2, padding="same", activation="relu"), Conv2D(4, 3, padding="same")],
                shortcut=[Conv2D(4, 1, strides=2), BatchNormalization()],
            ),
            GlobalAveragePooling2D(),
            Dense(2, activation="softmax"),
        ],
        IMG,
        lambda r, n: r.random((n,) + IMG),
        False,
    ),
    (
        "column_embedding",
        lambda: [ColumnEmbedding([0, 3], [5, 4], [3, 2]), Dense(3, activation="softmax")],
        (6,),
        lambda r, n: np.column_stack(
            [
                r.integers(0, 5, n),
                r.standard_normal((n, 2)),
                r.integers(0, 4, n),
                r.standard_normal((n, 2)),
            ]
        ),
        False,
    ),
]


def _sparknet_case(case_id, dtype="float64"):
    _, layers, shape, make, masked = next(c for c in SPARKNET_CASES if c[0] == case_id)
    model = randomize(
        Sequential(layers(), input_shape=shape, dtype=dtype, seed=1), seed=len(case_id)
    )
    return model, make(np.random.default_rng(3), 7), masked


# ------------------------------------------------------------------------------ PyTorch
@pytest.mark.parametrize("case_id", [c[0] for c in SPARKNET_CASES])
def test_to_torch_computes_the_same_function(torch, case_id):
    from sparknet.interop import to_torch

    model, x, masked = _sparknet_case(case_id)
    module = to_torch(model)
    assert not module.training
    with torch.no_grad():
        got = module(torch.from_numpy(x)).numpy()
    err = rel(got, model.predict_output(x))
    print(f"to_torch {case_id}: float64 rel {err:.2e}")
    assert got.dtype == np.float64 and err <= 1e-12
    if masked:
        with torch.no_grad():
            got = module(torch.from_numpy(x), mask=torch.from_numpy(MASK)).numpy()
        want = model.predict_output(x, mask=MASK)
        assert rel(got, want) <= 1e-12
        assert rel(got, model.predict_output(x)) > 1e-3, "the mask changed nothing"


@pytest.mark.parametrize("case_id", [c[0] for c in SPARKNET_CASES])
def test_round_trip_through_torch_is_exact(torch, case_id):
    """sparknet -> torch -> sparknet gives back every weight and running statistic bit for bit."""
    from sparknet.interop import from_torch, to_torch

    model, _, _ = _sparknet_case(case_id)
    back = from_torch(to_torch(model))
    assert back.get_config()["layers"] == model.get_config()["layers"]
    assert np.array_equal(back.params, model.params) and np.array_equal(back.state, model.state)


def _grads_as_sparknet(module, model_like):
    """The gradients of a to_torch module's parameters, laid out as the sparknet model's."""
    from sparknet.interop import from_torch

    saved = [p.data for p in module.parameters()]
    for p in module.parameters():
        p.data = p.grad if p.grad is not None else p.data.new_zeros(p.shape)
    try:
        return from_torch(module).params
    finally:
        for p, d in zip(module.parameters(), saved):
            p.data = d


@pytest.mark.parametrize(
    "case_id",
    ["mlp", "cnn", "recurrent", "attention", "residual", "residual_shortcut", "parallel", "column_embedding"],
)
def test_torch_gradients_equal_sparknet_gradients(torch, case_id):
    """The module computes the same function, so autograd through it gives sparknet's own
    gradients of the mean cross-entropy (float64; masked for the recurrent model)."""
    from sparknet.interop import to_torch

    model, x, masked = _sparknet_case(case_id)
    classes = model.output_shape[-1]
    y = np.arange(len(x)) % classes
    mask = MASK if masked else None
    model.loss_and_grad(x, y, mask=mask, training=False)
    module = to_torch(model)
    prob = module(torch.from_numpy(x), mask=None if mask is None else torch.from_numpy(mask))
    loss = torch.nn.functional.nll_loss(torch.log(prob), torch.from_numpy(y))
    loss.backward()
    err = rel(_grads_as_sparknet(module, model), model.grads)
    print(f"gradients {case_id}: float64 rel {err:.2e}")
    assert err <= 1e-10


def test_fine_tuned_in_torch_comes_back(torch, digits):
    """Train the to_torch module a few steps in PyTorch, read it back: the sparknet model
    predicts what the trained module predicts."""
    from sparknet.interop import from_torch, to_torch

    Xtr, ytr, Xte, _ = digits
    model = Sequential(
        [Dense(32, activation="relu"), BatchNormalization(), Dense(10, activation="softmax")],
        input_shape=(64,),
        dtype="float64",
        seed=0,
    )
    module = to_torch(model).train()
    opt = torch.optim.SGD(module.parameters(), lr=0.1)
    for s in range(5):
        xb = torch.from_numpy(Xtr[s * 64 : (s + 1) * 64].astype(np.float64))
        loss = torch.nn.functional.nll_loss(
            torch.log(module(xb)), torch.from_numpy(ytr[s * 64 : (s + 1) * 64])
        )
        opt.zero_grad()
        loss.backward()
        opt.step()
    module.eval()
    back = from_torch(module)
    assert rel(back.params, model.params) > 1e-3 and rel(back.state, model.state) > 1e-3
    with torch.no_grad():
        want = module(torch.from_numpy(Xte.astype(np.float64))).numpy()
    assert rel(back.predict_output(Xte.astype(np.float64)), want) <= 1e-12


def _torch_sequentials(nn, RecurrentOutput):
    """(id, module, torch per-sample input shape, token ids?)"""
    return [
        (
            "mlp_silu_leaky_relu",
            nn.Sequential(
                nn.Linear(5, 8),
                nn.SiLU(),
                nn.Linear(8, 6),
                nn.LeakyReLU(0.2),
                nn.Identity(),
                nn.SiLU(),
                nn.Linear(6, 3),
            ),
            (5,),
            False,
        ),
        (
            "transformer",
            nn.Sequential(
                nn.Linear(5, 8),
                nn.TransformerEncoderLayer(8, 2, 16, dropout=0.1, batch_first=True),
                nn.TransformerEncoder(
                    nn.TransformerEncoderLayer(
                        8, 4, 12, activation="gelu", batch_first=True, norm_first=True,
                        layer_norm_eps=1e-6,
                    ),
                    num_layers=2,
                    norm=nn.LayerNorm(8),
                    enable_nested_tensor=False,
                ),
                nn.Linear(8, 3),
            ),
            (6, 5),
            False,
        ),
        (
            "cnn_leaky_relu",
            nn.Sequential(
                nn.Conv2d(2, 4, 3, padding=1),
                nn.LeakyReLU(0.1),
                nn.SiLU(),
                nn.Flatten(),
                nn.Linear(4 * 7 * 8, 3),
            ),
            (2, 7, 8),
            False,
        ),
        (
            "mlp",
            nn.Sequential(
                nn.Linear(5, 8),
                nn.ReLU(),
                nn.Dropout(0.2),
                nn.Linear(8, 6),
                nn.GELU(approximate="tanh"),
                nn.LayerNorm(6),
                nn.Linear(6, 3),
                nn.Softmax(dim=-1),
            ),
            (5,),
            False,
        ),
        (
            "cnn",
            nn.Sequential(
                nn.Conv2d(2, 4, 3, padding=1),
                nn.ReLU(),
                nn.BatchNorm2d(4),
                nn.MaxPool2d(2),
                nn.Conv2d(4, 6, (3, 2), padding="same", dilation=(1, 2)),
                nn.Tanh(),
                nn.AvgPool2d(3, stride=1, padding=1, count_include_pad=False),
                nn.Flatten(),
                nn.Linear(6 * 3 * 4, 5),
                nn.Softmax(dim=1),
            ),
            (2, 7, 8),
            False,
        ),
        (
            "cnn_adaptive",
            nn.Sequential(
                nn.Conv2d(2, 4, 3, stride=2),
                nn.Softmax(dim=1),
                nn.AdaptiveMaxPool2d(1),
                nn.Flatten(),
                nn.Linear(4, 2),
            ),
            (2, 7, 8),
            False,
        ),
        (
            "conv1d",
            nn.Sequential(
                nn.Conv1d(4, 5, 3, padding=1),
                nn.BatchNorm1d(5),
                nn.Sigmoid(),
                nn.MaxPool1d(2),
                nn.AvgPool1d(2),
                nn.AdaptiveAvgPool1d(1),
                nn.Flatten(),
                nn.Linear(5, 3),
            ),
            (4, 9),
            False,
        ),
        (
            "conv1d_flatten",
            nn.Sequential(nn.Conv1d(4, 3, 2, stride=2), nn.Flatten(), nn.Linear(12, 2)),
            (4, 9),
            False,
        ),
        (
            "lstm_stack",
            nn.Sequential(
                nn.LSTM(4, 5, num_layers=2, batch_first=True, bidirectional=True),
                RecurrentOutput(),
                nn.Linear(10, 3),
                nn.Tanh(),
            ),
            (6, 4),
            False,
        ),
        (
            "gru_sequences",
            nn.Sequential(
                nn.GRU(4, 5, batch_first=True),
                RecurrentOutput(return_sequences=True),
                nn.LayerNorm(5, bias=False),
                nn.RNN(5, 3, batch_first=True, nonlinearity="relu"),
                RecurrentOutput(),
            ),
            (6, 4),
            False,
        ),
        (
            "embedding",
            nn.Sequential(
                nn.Embedding(12, 4),
                nn.GRU(4, 3, batch_first=True, bidirectional=True),
                RecurrentOutput(),
                nn.Linear(6, 2),
            ),
            (6,),
            True,
        ),
        (
            "embedding_flatten",
            nn.Sequential(nn.Embedding(12, 3), nn.Flatten(), nn.BatchNorm1d(18), nn.Linear(18, 2)),
            (6,),
            True,
        ),
    ]


@pytest.mark.parametrize(
    "case_id",
    [
        "mlp_silu_leaky_relu",
        "transformer",
        "cnn_leaky_relu",
        "mlp",
        "cnn",
        "cnn_adaptive",
        "conv1d",
        "conv1d_flatten",
        "lstm_stack",
        "gru_sequences",
        "embedding",
        "embedding_flatten",
    ],
)
def test_from_torch_sequential(torch, case_id):
    """A torch.nn.Sequential becomes a channels-last sparknet model computing the same
    function (float64), and goes back to torch with it."""
    from torch import nn

    from sparknet.interop import RecurrentOutput, from_torch, to_torch

    _, module, shape, ids = next(
        c for c in _torch_sequentials(nn, RecurrentOutput) if c[0] == case_id
    )
    gen = torch.Generator().manual_seed(0)
    module = module.double().eval()
    with torch.no_grad():
        for p in module.parameters():
            p.copy_(torch.randn(p.shape, generator=gen, dtype=torch.float64) * 0.4)
        for m in module.modules():
            if isinstance(m, (nn.BatchNorm1d, nn.BatchNorm2d)):
                m.running_mean.copy_(torch.rand(m.num_features, generator=gen, dtype=torch.float64))
                m.running_var.copy_(
                    torch.rand(m.num_features, generator=gen, dtype=torch.float64) + 0.5
                )
    rng = np.random.default_rng(1)
    x = rng.integers(0, 12, (7,) + shape) if ids else rng.standard_normal((7,) + shape)
    model = from_torch(module, shape)
    assert model.dtype == np.float64
    with torch.no_grad():
        want = module(torch.from_numpy(x)).numpy()
    x_last = (
        x
        if ids or len(shape) == 1 or isinstance(module[0], (nn.RNNBase, nn.Linear))
        else np.moveaxis(x, 1, -1)
    )
    err = rel(model.predict_output(x_last), want)
    print(f"from_torch {case_id}: float64 rel {err:.2e}")
    assert err <= 1e-12
    with torch.no_grad():
        again = to_torch(model)(torch.from_numpy(x_last)).numpy()
    assert rel(again, want) <= 1e-12


def test_from_torch_fuses_activations_and_reorders_flattened_features(torch):
    from torch import nn

    from sparknet.interop import from_torch

    model = from_torch(
        nn.Sequential(nn.Conv2d(1, 2, 3), nn.ReLU(), nn.Flatten(), nn.Linear(8, 3), nn.Softmax(-1)),
        (1, 4, 4),
    )
    assert [type(l).__name__ for l in model.layers] == ["Conv2D", "Flatten", "Dense"]
    assert model.layers[0].activation == "relu" and model.layers[2].activation == "softmax"
    assert model.input_shape == (4, 4, 1) and model.dtype == np.float32


@pytest.mark.parametrize(
    "make, message",
    [
        (
            lambda nn, R: nn.Sequential(nn.Linear(4, 3), nn.Upsample(scale_factor=2)),
            r"module 1 \(Upsample\) has no sparknet equivalent",
        ),
        (
            lambda nn, R: nn.Sequential(nn.Conv2d(2, 4, 3, groups=2)),
            r"module 0 \(Conv2d\): groups=2",
        ),
        (
            lambda nn, R: nn.Sequential(nn.Conv2d(2, 4, 3, padding=2, padding_mode="reflect")),
            r"module 0 \(Conv2d\): groups=1, padding_mode='reflect'",
        ),
        (
            lambda nn, R: nn.Sequential(nn.LSTM(4, 3, batch_first=True), nn.Linear(3, 2)),
            r"module 1 \(Linear\) follows an nn.LSTM, whose output is a tuple: "
            r"put sparknet.interop.RecurrentOutput",
        ),
        (lambda nn, R: nn.Sequential(nn.GRU(4, 3)), r"module 0 \(GRU\): needs batch_first=True"),
        (
            lambda nn, R: nn.Sequential(nn.Conv2d(2, 3, 3), nn.Flatten()),
            r"Flatten of a channels-first tensor \(or torch.flatten, or x.view\) must be",
        ),
        (
            lambda nn, R: nn.Sequential(nn.Conv2d(2, 3, 3), nn.Linear(5, 2)),
            r"module 1 \(Linear\) reads the last axis",
        ),
        (lambda nn, R: nn.Sequential(nn.AvgPool2d(3, padding=1)), r"count_include_pad=True"),
        (
            lambda nn, R: nn.Sequential(nn.MaxPool2d(2, ceil_mode=True)),
            r"module 0 \(MaxPool2d\): ceil_mode",
        ),
    ],
)
def test_from_torch_names_the_first_module_it_cannot_convert(torch, make, message):
    from torch import nn

    from sparknet.interop import RecurrentOutput, from_torch

    with pytest.raises(ValueError, match=message):
        from_torch(
            make(nn, RecurrentOutput),
            (2, 5, 5)
            if "2d" in message.lower() or "Flatten" in message or "Linear\\) reads" in message
            else (6, 4),
        )


class Mystery(Layer):
    def forward(self, x, training=False):
        return x


def test_to_torch_errors(torch):
    from sparknet.interop import from_torch, to_torch

    with pytest.raises(ValueError, match=r"layer 'odd' \(Mystery\) has no PyTorch equivalent"):
        to_torch(Sequential([Dense(3), Mystery(name="odd")], input_shape=(2,)))
    with pytest.raises(ValueError, match="torch.nn.RNN has no 'sigmoid' nonlinearity"):
        to_torch(Sequential([SimpleRNN(3, activation="sigmoid")], input_shape=SEQ))
    with pytest.raises(ValueError, match="not built"):
        to_torch(Sequential([Dense(3)]))
    with pytest.raises(TypeError, match=r"takes a torch.nn.Module .*got Linear: wrap the one "
                                        r"module, from_torch\(nn.Sequential\(module\)"):
        from_torch(torch.nn.Linear(3, 2), (3,))


def test_from_torch_says_what_to_pass_instead_of_a_state_dict_a_path_or_a_module_list(torch):
    from sparknet.interop import from_torch

    cases = [
        (torch.nn.Sequential(torch.nn.Linear(4, 2)).state_dict(),
         r"takes a torch.nn.Module .*got OrderedDict: a state_dict holds the weights, not the "
         r"network; build the module, load_state_dict"),
        ("model.pt", r"got str 'model.pt': load the module first"),
        (torch.nn.ModuleList([torch.nn.Linear(4, 2)]),
         r"got ModuleList, which is not a network sparknet reads by itself: pass the "
         r"nn.Sequential or the module whose forward\(\) uses it"),
    ]
    for module, message in cases:
        with pytest.raises(TypeError, match=message):
            from_torch(module)


def test_from_torch_reads_the_input_shape_of_a_first_linear_and_names_the_shape_otherwise(torch):
    from sparknet.interop import RecurrentOutput, from_torch

    nn = torch.nn
    torch.manual_seed(0)
    module = nn.Sequential(nn.Dropout(0.1), nn.Linear(3, 5), nn.ReLU(), nn.Linear(5, 4)).eval()
    model = from_torch(module)  # no input_shape: the first Linear's in_features
    assert model.input_shape == (3,)
    x = np.random.default_rng(0).standard_normal((6, 3)).astype(np.float32)
    with torch.no_grad():
        want = module(torch.from_numpy(x)).numpy()
    np.testing.assert_allclose(model.predict_output(x), want, rtol=1e-5, atol=1e-6)

    for start, message in [
        (nn.Sequential(nn.Conv2d(3, 4, 3)),
         r"needs input_shape: module 0 \(Conv2d\) reads images \(C, H, W\).*input_shape=\(3, 28, 28\)"),
        (nn.Sequential(nn.Dropout(0.1), nn.BatchNorm2d(2)),
         r"module 1 \(BatchNorm2d\) reads images \(C, H, W\).*input_shape=\(2, 28, 28\)"),
        (nn.Sequential(nn.Conv1d(2, 4, 3)), r"module 0 \(Conv1d\) reads series \(C, T\).*input_shape=\(2, 100\)"),
        (nn.Sequential(nn.LSTM(5, 3, batch_first=True), RecurrentOutput()),
         r"module 0 \(LSTM\) reads sequences \(T, F\).*input_shape=\(28, 5\)"),
        (nn.Sequential(nn.Embedding(10, 4)), r"module 0 \(Embedding\) reads token ids \(T,\)"),
        (nn.Sequential(nn.Flatten(), nn.Linear(784, 10)),
         r"module 0 \(Flatten\) reads any shape and flattens it.*input_shape=\(784,\) or an image shape"),
        (nn.Sequential(nn.Linear(3, 2), nn.Upsample(scale_factor=2)),
         r"module 1 \(Upsample\) has no sparknet equivalent"),  # before any shape question
    ]:
        with pytest.raises(ValueError, match=message):
            from_torch(start)


# -------------------------------------------------------------------------------- Keras
def _randomize_keras(keras, km, seed=0):
    rng = np.random.default_rng(seed)
    for w in km.weights:
        v = keras.ops.convert_to_numpy(w)
        if "variance" in w.path:
            w.assign(rng.uniform(0.5, 1.5, v.shape).astype(v.dtype))
        else:
            w.assign((rng.standard_normal(v.shape) * 0.4).astype(v.dtype))


def _keras_models(keras):
    L = keras.layers
    ids = np.random.default_rng(2).integers(0, 12, (7, 6))
    ids[0, 4:] = 0
    ids[1, :2] = 0
    return [
        (
            "cnn",
            [
                keras.Input(IMG),
                L.Conv2D(4, 3, padding="same", activation="relu"),
                L.BatchNormalization(momentum=0.9),
                L.MaxPooling2D(3, strides=2, padding="same"),
                L.Conv2D(5, (2, 3), strides=2, padding="same"),
                L.AveragePooling2D(2, strides=1, padding="same"),
                L.Flatten(),
                L.Dropout(0.5),
                L.Dense(6, activation="softmax"),
            ],
            np.random.default_rng(0).random((7,) + IMG),
        ),
        (
            "cnn_global",
            [
                keras.Input(IMG),
                L.Conv2D(3, 2, dilation_rate=2),
                L.ReLU(),
                L.GlobalAveragePooling2D(),
                L.Dense(2),
                L.Softmax(),
            ],
            np.random.default_rng(0).random((7,) + IMG),
        ),
        (
            "conv1d",
            [
                keras.Input((9, 4)),
                L.Conv1D(3, 2, strides=2, padding="same", activation="tanh"),
                L.MaxPooling1D(2),
                L.AveragePooling1D(2, padding="same"),
                L.GlobalMaxPooling1D(),
            ],
            np.random.default_rng(0).random((7, 9, 4)),
        ),
        (
            "recurrent",
            [
                keras.Input(SEQ),
                L.LSTM(5, return_sequences=True),
                L.Bidirectional(L.GRU(3, return_sequences=True), merge_mode="sum"),
                L.LayerNormalization(),
                L.Bidirectional(L.SimpleRNN(4)),
                L.Dense(3, activation="gelu"),
                L.Activation("sigmoid"),
            ],
            np.random.default_rng(0).random((7,) + SEQ),
        ),
        (
            "silu_leaky_relu",
            [
                keras.Input((5,)),
                L.Dense(8, activation="silu"),
                L.LeakyReLU(negative_slope=0.3),
                L.Dense(6, activation="swish"),
                L.ReLU(negative_slope=0.1),
                L.Dense(3),
            ],
            np.random.default_rng(0).standard_normal((7, 5)),
        ),
        (
            "conv_silu_gelu",  # the convolution's silu/gelu becomes an Activation after it
            [
                keras.Input(IMG),
                L.Conv2D(4, 3, padding="same", activation="silu"),
                L.Conv2D(3, 2, activation="gelu"),
                L.Flatten(),
                L.Dense(2),
            ],
            np.random.default_rng(0).random((7,) + IMG),
        ),
        (
            "embedding",
            [
                keras.Input((6,), dtype="int32"),
                L.Embedding(12, 4, mask_zero=True),
                L.GRU(3, return_sequences=True),
                L.GlobalAveragePooling1D(),
            ],
            ids,
        ),
        (
            "embedding_lstm",
            [
                keras.Input((6,), dtype="int32"),
                L.Embedding(12, 4, mask_zero=True),
                L.Bidirectional(L.LSTM(3)),
                L.BatchNormalization(center=False),
            ],
            ids,
        ),
    ]


@pytest.mark.parametrize(
    "case_id",
    [
        "cnn",
        "cnn_global",
        "conv1d",
        "recurrent",
        "silu_leaky_relu",
        "conv_silu_gelu",
        "embedding",
        "embedding_lstm",
    ],
)
def test_from_keras_matches_keras_predict(keras, case_id):
    _, layers, x = next(c for c in _keras_models(keras) if c[0] == case_id)
    km = keras.Sequential(layers)
    _randomize_keras(keras, km)
    from sparknet.interop import from_keras

    model = from_keras(km)
    assert model.dtype == np.float32
    x = x if x.dtype.kind == "i" else x.astype(np.float32)
    err = rel(model.predict_output(x), km.predict(x, verbose=0))
    print(f"from_keras {case_id} ({keras.backend.backend()} backend): float32 rel {err:.2e}")
    assert err <= 1e-5


def test_from_keras_trained_functional_model(keras, digits):
    """A functional Keras model trained on digits: BatchNormalization's momentum becomes
    1 - momentum, and sparknet predicts what Keras predicts."""
    from sparknet.interop import from_keras

    Xtr, ytr, Xte, _ = digits
    L = keras.layers
    inp = keras.Input((64,))
    h = L.Dense(32, activation="relu")(inp)
    h = L.BatchNormalization(momentum=0.95)(h)
    out = L.Dense(10, activation="softmax")(h)
    km = keras.Model(inp, out)
    km.compile(optimizer="adam", loss="sparse_categorical_crossentropy")
    km.fit(Xtr, ytr, epochs=1, batch_size=64, verbose=0)
    model = from_keras(km)
    assert model.layers[1].momentum == pytest.approx(0.05)
    err = rel(model.predict_output(Xte), km.predict(Xte, verbose=0))
    print(f"from_keras trained digits MLP: float32 rel {err:.2e}")
    assert err <= 1e-5


@pytest.mark.parametrize(
    "make, message",
    [
        (lambda L: L.GRU(3, reset_after=False), r"'gru_x' \(GRU\): reset_after=False"),
        (lambda L: L.LSTM(3, activation="relu"), r"'gru_x' \(LSTM\): sparknet's gates use sigmoid"),
        (lambda L: L.Masking(), r"'gru_x' \(Masking\) has no sparknet equivalent"),
        (lambda L: L.Bidirectional(L.GRU(3), merge_mode="mul"), r"merge_mode='mul'"),
        (lambda L: L.LayerNormalization(rms_scaling=True), "rms_scaling"),
    ],
)
def test_from_keras_names_the_layer_it_cannot_convert(keras, make, message):
    from sparknet.interop import from_keras

    layer = make(keras.layers)
    layer.name = "gru_x"
    km = keras.Sequential([keras.Input(SEQ), layer])
    with pytest.raises(ValueError, match=message):
        from_keras(km)


def test_from_torch_names_what_a_transformer_layer_cannot_bring(torch):
    from torch import nn

    from sparknet.interop import from_torch

    for layer, message in [
        (nn.TransformerEncoderLayer(8, 2, 16), r"module 0 \(TransformerEncoderLayer\): needs batch_first=True"),
        (nn.TransformerEncoderLayer(8, 2, 16, batch_first=True, bias=False),
         r"bias=False .*sparknet's TransformerEncoder has every bias"),
        (nn.TransformerEncoderLayer(8, 2, 16, batch_first=True, activation=nn.functional.silu),
         r"activation .*silu.*takes relu or gelu"),
    ]:
        with pytest.raises(ValueError, match=message):
            from_torch(nn.Sequential(layer), (5, 8))
