"""ONNX export (sparknet.onnx): every layer kind and whole trained models, run by ONNX Runtime
against Sequential.predict_output; the checker's full check; errors; the CLI; models trained on
Spark (data parallel, model parallel); a Spark ML Model served with predict_batch_udf.

Differences are relative to the largest output: ``max |onnx - sparknet| / max |sparknet|``,
within 1e-5 in float32 and 1e-10 in float64.  ONNX Runtime's CPU provider has no float64
kernels for Conv, AveragePool, GlobalAveragePool, RNN, LSTM, GRU and Erf: float64 graphs
holding them run in ``onnx.reference`` (numpy) instead, which ignores ``sequence_lens``, so
masked float64 recurrences are checked by the checker only (their masking is proven in
float32).
"""

from __future__ import annotations

import numpy as np
import pytest

onnx = pytest.importorskip("onnx", reason="onnx not installed: pip install 'sparknet[onnx]'")
ort = pytest.importorskip(
    "onnxruntime", reason="onnxruntime not installed: pip install 'sparknet[onnx]'"
)

from helpers.frames import vector_frame  # noqa: E402
from sparknet import (  # noqa: E402
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
from sparknet.layers import (  # noqa: E402
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
from sparknet.onnx import export, to_onnx  # noqa: E402

#: operators ONNX Runtime's CPU provider runs in float32 only
ORT_FLOAT32_ONLY = {"Conv", "AveragePool", "GlobalAveragePool", "RNN", "LSTM", "GRU", "Erf"}
TOL = {"float32": 1e-5, "float64": 1e-10}


def session(proto):
    opts = ort.SessionOptions()
    opts.intra_op_num_threads = 1
    opts.inter_op_num_threads = 1
    return ort.InferenceSession(proto.SerializeToString(), opts, providers=["CPUExecutionProvider"])


def feeds_for(proto, x, mask=None):
    """``{"input": x}``, and ``mask`` (all ones when None) if the graph takes one."""
    feeds = {"input": x}
    for v in proto.graph.input[1:]:
        dtype = onnx.helper.tensor_dtype_to_np_dtype(v.type.tensor_type.elem_type)
        feeds[v.name] = np.ones(x.shape[:2], dtype) if mask is None else np.asarray(mask, dtype)
    return feeds


def _reference_ops():
    """onnx.reference's RNN knows Tanh and Affine only: Relu and Sigmoid added, as the
    ONNX specification defines them; its Erf returns float32 and its GlobalMaxPool reduces
    the channels of a 1-D input: ones that follow the specification."""
    from math import erf

    from onnx.reference.op_run import OpRun
    from onnx.reference.ops.op_erf import Erf as RefErf
    from onnx.reference.ops.op_rnn import RNN_14

    class Erf(RefErf):
        op_domain = ""

        def _run(self, x):
            return (np.vectorize(erf, otypes=[x.dtype])(x),)

    class RNN(RNN_14):
        op_domain = ""

        def choose_act(self, name, alpha, beta):
            if name == "Relu":
                return lambda x: np.maximum(x, 0)
            if name == "Sigmoid":
                return lambda x: 1 / (1 + np.exp(-x))
            return super().choose_act(name, alpha, beta)

    class GlobalMaxPool(OpRun):
        op_domain = ""

        def _run(self, x):
            return (x.max(axis=tuple(range(2, x.ndim)), keepdims=True),)

    return [RNN, Erf, GlobalMaxPool]


def run_onnx(proto, x, mask=None):
    """The graph's ``output`` for ``x``: by ONNX Runtime, or by onnx.reference for float64
    graphs holding operators ONNX Runtime runs in float32 only."""
    onnx.checker.check_model(proto, full_check=True)
    ops = {n.op_type for n in proto.graph.node}
    double = proto.graph.output[0].type.tensor_type.elem_type == onnx.TensorProto.DOUBLE
    feeds = feeds_for(proto, x, mask)
    if double and ops & ORT_FLOAT32_ONLY:
        from onnx.reference import ReferenceEvaluator

        return ReferenceEvaluator(proto, new_ops=_reference_ops()).run(["output"], feeds)[0]
    return session(proto).run(["output"], feeds)[0]


def rel(got, ref):
    ref = np.asarray(ref, np.float64)
    return float(np.abs(np.asarray(got, np.float64) - ref).max() / max(np.abs(ref).max(), 1e-300))


def randomize(model, seed=0, scale=0.4):
    """Non-zero weights everywhere (biases too) and running statistics away from 0 and 1,
    so that a wrong layout cannot pass."""
    rng = np.random.default_rng(seed)
    model.params[...] = rng.standard_normal(model.params.shape) * scale
    model.state[...] = rng.uniform(0.5, 1.5, model.state.shape)
    return model


# ------------------------------------------------------------------ every layer kind
IMG = (7, 8, 2)
SEQ = (6, 4)


def _images(rng, n):
    return rng.random((n,) + IMG)


def _seqs(rng, n):
    return rng.standard_normal((n,) + SEQ)


def _ids(rng, n):
    ids = rng.integers(1, 12, (n, 6))
    ids[0, 4:] = 0  # padding at the end, at the start, everywhere
    ids[1, :2] = 0
    ids[2, :] = 0
    return ids


def _tabular(rng, n):
    x = rng.standard_normal((n, 6))
    x[:, 0] = rng.integers(0, 5, n)
    x[:, 3] = rng.integers(0, 4, n)
    return x


def _flagged(rng, n):
    x = _seqs(rng, n)
    return np.concatenate([x, MASK[:n, :, None]], axis=2)


#: real steps: padding at the end, at the start, in between, an empty row, full rows
MASK = np.ones((9, SEQ[0]))
MASK[0, 4:] = 0
MASK[1, :3] = 0
MASK[2, [1, 3]] = 0
MASK[3, :] = 0
MASK[4, 0] = 0

# (id, layers, per-sample input shape, input maker, operators the graph must hold)
CASES = [
    (
        "dense",
        lambda: [Dense(7, activation="tanh")],
        (12,),
        lambda r, n: r.random((n, 12)),
        {"Gemm", "Tanh"},
    ),
    (
        "dense_nobias_relu",
        lambda: [Dense(7, activation="relu", use_bias=False)],
        (12,),
        lambda r, n: r.random((n, 12)),
        {"Gemm", "Relu"},
    ),
    (
        "dense_softmax",
        lambda: [Dense(5, activation="softmax")],
        (12,),
        lambda r, n: r.random((n, 12)),
        {"Gemm", "Softmax"},
    ),
    (
        "dense_on_steps",
        lambda: [Dense(6, activation="sigmoid"), Dense(3, activation="softmax")],
        SEQ,
        _seqs,
        {"MatMul", "Add", "Sigmoid", "Softmax"},
    ),
    *[
        (
            f"activation_{a}",
            (lambda a=a: [Dense(6), Activation(a)]),
            (5,),
            lambda r, n: r.standard_normal((n, 5)),
            {"Gemm"} | ({a.capitalize()} if a != "identity" else set()),
        )
        for a in ("relu", "tanh", "sigmoid", "softmax", "identity")
    ],
    (
        "dropout",
        lambda: [Dense(6), Dropout(0.5), Dense(3)],
        (5,),
        lambda r, n: r.random((n, 5)),
        {"Gemm"},
    ),
    (
        "flatten",
        lambda: [Flatten(), Dense(3)],
        (3, 4, 2),
        lambda r, n: r.random((n, 3, 4, 2)),
        {"Flatten"},
    ),
    ("conv2d", lambda: [Conv2D(4, 3, activation="relu")], IMG, _images, {"Conv", "Relu"}),
    (
        "conv2d_same_strided_dilated",
        lambda: [
            Conv2D(3, (3, 2), strides=(2, 1), padding="same", dilation=(2, 1), activation="tanh")
        ],
        IMG,
        _images,
        {"Conv", "Tanh"},
    ),
    (
        "conv2d_softmax_nobias",
        lambda: [Conv2D(3, 1, activation="softmax", use_bias=False)],
        IMG,
        _images,
        {"Conv", "Softmax"},
    ),
    ("maxpool2d", lambda: [MaxPool2D(2)], IMG, _images, {"MaxPool"}),
    (
        "maxpool2d_same_overlapping",
        lambda: [MaxPool2D(3, strides=2, padding="same")],
        IMG,
        _images,
        {"MaxPool"},
    ),
    ("avgpool2d", lambda: [AvgPool2D(2)], IMG, _images, {"AveragePool"}),
    (
        "avgpool2d_same",
        lambda: [AvgPool2D((3, 2), strides=(2, 1), padding="same")],
        IMG,
        _images,
        {"AveragePool"},
    ),
    (
        "cnn_chain",
        lambda: [
            Conv2D(4, 3, padding="same", activation="relu"),
            MaxPool2D(2, padding="same"),
            Activation("sigmoid"),
            Conv2D(5, 2),
            AvgPool2D(2, strides=1),
            Dropout(0.3),
            Activation("softmax"),
            Flatten(),
            Dense(4, activation="softmax"),
        ],
        IMG,
        _images,
        {"Conv", "MaxPool", "AveragePool", "Flatten", "Gemm"},
    ),
    *[
        (f"simple_rnn_{a}", (lambda a=a: [SimpleRNN(5, activation=a)]), SEQ, _seqs, {"RNN"})
        for a in ("tanh", "relu", "sigmoid", "identity")
    ],
    ("simple_rnn_sequences", lambda: [SimpleRNN(5, return_sequences=True)], SEQ, _seqs, {"RNN"}),
    ("lstm", lambda: [LSTM(5)], SEQ, _seqs, {"LSTM"}),
    ("lstm_sequences", lambda: [LSTM(5, return_sequences=True)], SEQ, _seqs, {"LSTM"}),
    ("lstm_state", lambda: [LSTM(5, return_state=True)], SEQ, _seqs, {"LSTM", "Concat"}),
    ("lstm_stateful", lambda: [LSTM(5, stateful=True)], SEQ, _seqs, {"LSTM"}),
    ("gru", lambda: [GRU(5)], SEQ, _seqs, {"GRU"}),
    (
        "gru_sequences",
        lambda: [GRU(5, return_sequences=True), Dense(3, activation="softmax")],
        SEQ,
        _seqs,
        {"GRU", "MatMul"},
    ),
    (
        "stacked_recurrent",
        lambda: [LSTM(5, return_sequences=True), SimpleRNN(4, return_sequences=True), GRU(3)],
        SEQ,
        _seqs,
        {"LSTM", "RNN", "GRU"},
    ),
    ("embedding", lambda: [Embedding(12, 4), Flatten(), Dense(3)], (6,), _ids, {"Gather", "Gemm"}),
    (
        "embedding_mask_zero",
        lambda: [Embedding(12, 4, mask_zero=True), LSTM(5, return_sequences=True), GRU(3)],
        (6,),
        _ids,
        {"Gather", "LSTM", "GRU", "TopK"},
    ),
    (
        "sequence_mask",
        lambda: [SequenceMask(), GRU(5, return_sequences=True), Dense(3, activation="softmax")],
        (SEQ[0], SEQ[1] + 1),
        _flagged,
        {"Slice", "GRU", "TopK"},
    ),
    *[
        (
            f"{kind.__name__.lower()}_bidirectional_{merge}{'_sequences' if seqs else ''}",
            (
                lambda kind=kind, merge=merge, seqs=seqs: [
                    Bidirectional(kind(4, return_sequences=seqs), merge_mode=merge)
                ]
            ),
            SEQ,
            _seqs,
            {kind.__name__.replace("SimpleRNN", "RNN")},
        )
        for kind in (SimpleRNN, LSTM, GRU)
        for merge in ("concat", "sum")
        for seqs in (False, True)
    ],
    (
        "bidirectional_own_mask",
        lambda: [
            SequenceMask(),
            Bidirectional(GRU(4, return_sequences=True)),
            GlobalMaxPooling1D(),
        ],
        (SEQ[0], SEQ[1] + 1),
        _flagged,
        {"GRU", "ReduceMax"},
    ),
    *[
        (
            f"activation_{a}",
            (lambda a=a: [Dense(6, activation=a), Activation(a)]),
            (5,),
            lambda r, n: r.standard_normal((n, 5)),
            {"Gemm"},
        )
        for a in ("gelu", "gelu_tanh")
    ],
    (
        "activation_silu",
        lambda: [Dense(6, activation="silu"), Dense(4), Activation("swish")],
        (5,),
        lambda r, n: r.standard_normal((n, 5)) * 3,
        {"Gemm", "Sigmoid", "Mul"},
    ),
    (
        "leaky_relu",
        # 0.25 is exact in float32, LeakyRelu's alpha type; in float64 graphs 0.01 is not,
        # and becomes Where(x > 0, x, 0.01 x)
        lambda: [Dense(6), LeakyReLU(0.25), Dense(3), LeakyReLU()],
        (5,),
        lambda r, n: r.standard_normal((n, 5)),
        {"Gemm", "LeakyRelu"},
    ),
    (
        "leaky_relu_images",
        lambda: [Conv2D(3, 2), LeakyReLU(0.125), MaxPool2D(2), Flatten(), Dense(2)],
        IMG,
        _images,
        {"Conv", "LeakyRelu"},
    ),
    (
        "batch_norm",
        lambda: [Dense(6), BatchNormalization()],
        (5,),
        lambda r, n: r.standard_normal((n, 5)),
        {"BatchNormalization"},
    ),
    (
        "batch_norm_no_affine_on_steps",
        lambda: [BatchNormalization(center=False, scale=False, eps=1e-3)],
        SEQ,
        _seqs,
        {"BatchNormalization", "Transpose"},
    ),
    (
        "batch_norm_in_cnn",
        lambda: [
            Conv2D(4, 3),
            BatchNormalization(),
            Activation("relu"),
            MaxPool2D(2),
            GlobalAveragePooling2D(),
        ],
        IMG,
        _images,
        {"Conv", "BatchNormalization"},
    ),
    ("layer_norm", lambda: [LayerNormalization(eps=1e-3)], SEQ, _seqs, {"LayerNormalization"}),
    (
        "layer_norm_no_affine",
        lambda: [Dense(6), LayerNormalization(center=False, scale=False)],
        (5,),
        lambda r, n: r.standard_normal((n, 5)),
        {"LayerNormalization"},
    ),
    ("conv1d", lambda: [Conv1D(5, 3, activation="relu")], SEQ, _seqs, {"Conv"}),
    (
        "conv1d_same_strided_dilated",
        lambda: [Conv1D(3, 2, strides=2, padding="same", dilation=2, activation="softmax")],
        SEQ,
        _seqs,
        {"Conv", "Softmax"},
    ),
    ("maxpool1d", lambda: [MaxPool1D(3, strides=2, padding="same")], SEQ, _seqs, {"MaxPool"}),
    ("avgpool1d", lambda: [AvgPool1D(2)], SEQ, _seqs, {"AveragePool"}),
    (
        "avgpool1d_same",
        lambda: [AvgPool1D(4, strides=3, padding="same")],
        SEQ,
        _seqs,
        {"AveragePool"},
    ),
    (
        "conv1d_chain",
        lambda: [
            Conv1D(6, 2, padding="same"),
            MaxPool1D(2),
            Conv1D(4, 2),
            GlobalAveragePooling1D(),
        ],
        SEQ,
        _seqs,
        {"Conv", "MaxPool", "GlobalAveragePool"},
    ),
    ("global_max_pool_1d", lambda: [GlobalMaxPooling1D()], SEQ, _seqs, {"ReduceMax", "Where"}),
    ("global_avg_pool_1d", lambda: [GlobalAveragePooling1D()], SEQ, _seqs, {"ReduceSum", "Div"}),
    (
        "conv1d_global_max_pool",
        lambda: [Conv1D(4, 2), GlobalMaxPooling1D()],
        SEQ,
        _seqs,
        {"GlobalMaxPool"},
    ),
    (
        "global_avg_pool_1d_own_mask",
        lambda: [SequenceMask(), GlobalAveragePooling1D()],
        (SEQ[0], SEQ[1] + 1),
        _flagged,
        {"ReduceSum", "Div"},
    ),
    (
        "global_pools_2d",
        lambda: [Conv2D(3, 2), GlobalMaxPooling2D()],
        IMG,
        _images,
        {"GlobalMaxPool"},
    ),
    ("global_avg_pool_2d", lambda: [GlobalAveragePooling2D()], IMG, _images, {"GlobalAveragePool"}),
    ("mha", lambda: [MultiHeadAttention(2)], SEQ, _seqs, {"MatMul", "Softmax"}),
    (
        "mha_causal_nobias",
        lambda: [MultiHeadAttention(2, causal=True, use_bias=False)],
        SEQ,
        _seqs,
        {"MatMul", "Softmax", "Where"},
    ),
    (
        "positional_embedding",
        lambda: [PositionalEmbedding(8), MultiHeadAttention(1)],
        SEQ,
        _seqs,
        {"Add", "Softmax"},
    ),
    (
        "transformer",
        lambda: [TransformerEncoder(2, 8, dropout=0.2), GlobalAveragePooling1D()],
        SEQ,
        _seqs,
        {"LayerNormalization", "Softmax", "Relu"},
    ),
    (
        "transformer_norm_first_gelu",
        lambda: [
            TransformerEncoder(2, 8, activation="gelu", norm_first=True, eps=1e-3),
            Dense(3, activation="softmax"),
        ],
        SEQ,
        _seqs,
        {"LayerNormalization", "Softmax", "Erf"},
    ),
    (
        "residual",
        lambda: [Dense(4), Residual([Dense(4, activation="relu"), Dropout(0.1), Dense(4)])],
        (5,),
        lambda r, n: r.standard_normal((n, 5)),
        {"Gemm", "Add"},
    ),
    (
        "residual_cnn",
        lambda: [
            Conv2D(4, 3, padding="same"),
            Residual(
                [
                    Conv2D(4, 3, padding="same", activation="relu"),
                    BatchNormalization(),
                    Conv2D(4, 3, padding="same"),
                ]
            ),
            Activation("relu"),
            Residual([Residual([BatchNormalization()]), LayerNormalization()]),
            GlobalAveragePooling2D(),
        ],
        IMG,
        _images,
        {"Conv", "Add", "LayerNormalization"},
    ),
    (
        "residual_shortcut",
        lambda: [
            Conv2D(3, 3, padding=(1, 2)),
            MaxPool2D(3, 1, padding=1),
            AvgPool2D(3, 1, padding=(0, 1)),
            Residual(
                [Conv2D(4, 3, strides=2, padding="same", activation="relu"), BatchNormalization()],
                shortcut=[Conv2D(4, 1, strides=2)],
            ),
            Residual([Dense(6, activation="relu")], shortcut=[Dense(6)]),
            GlobalAveragePooling2D(),
        ],
        IMG,
        _images,
        {"Conv", "Add", "MatMul", "MaxPool", "AveragePool"},
    ),
    (
        "rms_norm",
        lambda: [Dense(6), RMSNormalization(eps=1e-6), Residual([Dense(6), RMSNormalization()])],
        SEQ,
        _seqs,
        {"ReduceMean", "Sqrt", "Div"},
    ),
    (
        "parallel",
        lambda: [
            Conv2D(3, 3, padding="same"),
            Parallel([[], [Conv2D(2, 3, padding="same", activation="relu")], [MaxPool2D(3, 1, padding=1)]]),
            Parallel([[Dense(4, activation="silu")], [Dense(4)]], merge="multiply"),
            Parallel([[Dense(4)], [], [Dense(4, activation="tanh")]], merge="add"),
            GlobalAveragePooling2D(),
        ],
        IMG,
        _images,
        {"Concat", "Mul", "Add"},
    ),
    (
        "residual_recurrent",
        lambda: [Residual([LSTM(4, return_sequences=True)]), GRU(3)],
        SEQ,
        _seqs,
        {"LSTM", "GRU", "Add"},
    ),
    (
        "column_embedding",
        lambda: [ColumnEmbedding([0, 3], [5, 4], [3, 2]), Dense(3, activation="softmax")],
        (6,),
        _tabular,
        {"Gather", "Concat"},
    ),
]
#: cases whose layers read the graph's ``mask`` input
MASK_READERS = {
    "simple_rnn_tanh",
    "simple_rnn_relu",
    "simple_rnn_sequences",
    "lstm",
    "lstm_sequences",
    "lstm_state",
    "gru",
    "gru_sequences",
    "stacked_recurrent",
    "lstm_bidirectional_concat",
    "simplernn_bidirectional_sum_sequences",
    "gru_bidirectional_concat_sequences",
    "lstm_bidirectional_sum",
    "global_max_pool_1d",
    "global_avg_pool_1d",
}
#: cases whose own layers make a mask (the graph has no ``mask`` input)
OWN_MASK = {
    "embedding_mask_zero",
    "sequence_mask",
    "bidirectional_own_mask",
    "global_avg_pool_1d_own_mask",
}


def _case(case_id, dtype):
    _, layers, shape, make, ops = next(c for c in CASES if c[0] == case_id)
    model = randomize(
        Sequential(layers(), input_shape=shape, dtype=dtype, seed=1), seed=len(case_id)
    )
    x = make(np.random.default_rng(7), 9)
    return model, (x if x.dtype.kind == "i" else x.astype(dtype)), ops


@pytest.mark.parametrize("dtype", ["float32", "float64"])
@pytest.mark.parametrize("case_id", [c[0] for c in CASES])
def test_layer_kind_matches_onnx_runtime(case_id, dtype):
    """Each layer kind (and variant) gives sparknet's output through its standard operators."""
    model, x, ops = _case(case_id, dtype)
    proto = to_onnx(model)
    found = {n.op_type for n in proto.graph.node}
    if dtype == "float64":  # eps has no exact float32 value: the normalisations are written out
        ops = ops - {"BatchNormalization", "LayerNormalization", "Transpose"}
    assert ops <= found, f"expected operators {sorted(ops - found)} in {sorted(found)}"
    assert all(op.domain in ("", "ai.onnx") for op in proto.opset_import)
    if dtype == "float64" and case_id in OWN_MASK and found & ORT_FLOAT32_ONLY:
        onnx.checker.check_model(proto, full_check=True)
        pytest.skip(
            "float64 masked recurrence: ONNX Runtime has no double kernel and onnx.reference "
            "ignores sequence_lens (checked in float32)"
        )
    got = run_onnx(proto, x)
    err = rel(got, model.predict_output(x))
    print(f"{case_id} {dtype}: rel {err:.2e}")
    assert got.shape == (x.shape[0],) + model.output_shape
    assert err <= TOL[dtype], f"{case_id} {dtype}: relative difference {err:.2e}"


@pytest.mark.parametrize("case_id", sorted(MASK_READERS))
def test_masked_layers_match_onnx_runtime(case_id):
    """A mask with padding at the end, at the start, in between and an empty row: the graph
    gives each sequence the states and outputs sparknet's masked layers give (float32)."""
    model, x, _ = _case(case_id, "float32")
    proto = to_onnx(model)
    assert [i.name for i in proto.graph.input] == ["input", "mask"]
    got = session(proto).run(["output"], feeds_for(proto, x, MASK))[0]
    ref = model.predict_output(x, mask=MASK)
    err = rel(got, ref)
    print(f"{case_id} masked float32: rel {err:.2e}")
    assert err <= 1e-5, f"{case_id} masked: relative difference {err:.2e}"
    unmasked = session(proto).run(["output"], feeds_for(proto, x))[0]
    assert rel(unmasked, ref) > 1e-3, "the mask changed nothing: the check above proves nothing"


def test_float64_masked_recurrence_graph_is_valid_double():
    """Masked float64 recurrent graphs are double throughout and pass the full check."""
    model, _, _ = _case("stacked_recurrent", "float64")
    proto = to_onnx(model)
    onnx.checker.check_model(proto, full_check=True)
    assert {i.type.tensor_type.elem_type for i in proto.graph.input} == {onnx.TensorProto.DOUBLE}
    assert {t.data_type for t in proto.graph.initializer if t.data_type in (1, 11)} == {
        onnx.TensorProto.DOUBLE
    }


def test_transposes_only_at_the_ends_of_a_convolutional_run():
    """Consecutive Conv/pool/elementwise layers share one channels-first tensor: two
    Transposes in all (into the run, and back before Flatten)."""
    model, _, _ = _case("cnn_chain", "float32")
    assert [n.op_type for n in to_onnx(model).graph.node].count("Transpose") == 2


def test_mask_input_is_there_when_a_layer_reads_it():
    seq = Sequential([LSTM(4), Dense(2)], input_shape=SEQ)
    assert [i.name for i in to_onnx(seq).graph.input] == ["input", "mask"]
    assert [i.name for i in to_onnx(seq, mask=False).graph.input] == ["input"]
    mlp = Sequential([Dense(4)], input_shape=(3,))
    assert [i.name for i in to_onnx(mlp).graph.input] == ["input"]
    with pytest.raises(ValueError, match="mask=True: the model's input"):
        to_onnx(mlp, mask=True)
    own, _, _ = _case("embedding_mask_zero", "float32")
    assert [i.name for i in to_onnx(own).graph.input] == ["input"]
    forced = to_onnx(own, mask=True)
    assert [i.name for i in forced.graph.input] == ["input", "mask"]
    x = _ids(np.random.default_rng(3), 9)
    m = np.ones(x.shape)
    m[5, 2:] = 0
    got = session(forced).run(["output"], {"input": x, "mask": m.astype(np.float32)})[0]
    assert rel(got, own.predict_output(x, mask=m)) <= 1e-5
    assert forced.graph.input[0].type.tensor_type.elem_type == onnx.TensorProto.INT64


def test_io_names_shapes_and_dynamic_batch(tmp_path):
    model = randomize(
        Sequential([Conv2D(3, 2), Flatten(), Dense(4, activation="softmax")], input_shape=(5, 5, 1))
    )
    proto = export(model, tmp_path / "m.onnx")
    loaded = onnx.load(str(tmp_path / "m.onnx"))
    onnx.checker.check_model(loaded, full_check=True)

    def dims(v):
        return [d.dim_param or d.dim_value for d in v.type.tensor_type.shape.dim]

    assert [(v.name, dims(v)) for v in loaded.graph.input] == [("input", ["batch", 5, 5, 1])]
    assert [(v.name, dims(v)) for v in loaded.graph.output] == [("output", ["batch", 4])]
    assert loaded.producer_name == "sparknet" and "predict_output" in loaded.graph.doc_string
    sess = ort.InferenceSession(str(tmp_path / "m.onnx"), providers=["CPUExecutionProvider"])
    for n in (1, 3, 50):
        x = np.random.default_rng(n).random((n, 5, 5, 1)).astype(np.float32)
        assert rel(sess.run(["output"], {"input": x})[0], model.predict_output(x)) <= 1e-5
    assert proto.graph.output[0].name == "output"


@pytest.mark.parametrize("opset", [13, 15, 18, 21])
def test_every_opset_from_13_runs(opset):
    """Reductions and squeezes change form across opsets: a model holding all the existing
    kinds runs at the oldest opset written, the default's neighbours and a recent one."""
    for case_id in (
        "cnn_chain",
        "embedding_mask_zero",
        "lstm_state",
        "layer_norm",
        "activation_gelu",
        "activation_gelu_tanh",
        "activation_silu",
        "leaky_relu_images",
        "global_max_pool_1d",
        "gru_bidirectional_sum_sequences",
    ):
        model, x, _ = _case(case_id, "float32")
        proto = to_onnx(model, opset=opset)
        assert proto.opset_import[0].version == opset
        ops = {n.op_type for n in proto.graph.node}
        if case_id == "layer_norm":
            assert ("LayerNormalization" in ops) == (opset >= 17)
        if case_id.startswith("activation_gelu"):
            assert ("Gelu" in ops) == (opset >= 20)
        assert rel(run_onnx(proto, x), model.predict_output(x)) <= 1e-5, case_id


def test_leaky_relu_slope_without_an_exact_float32_value_is_written_out_in_float64():
    """LeakyRelu's alpha is a float32 attribute: a float64 graph with slope 0.01 computes
    ``Where(x > 0, x, 0.01 x)`` in float64 instead (exact to rounding), a float32 one uses
    the operator."""
    x = np.random.default_rng(0).standard_normal((6, 5))
    for dtype, want, other in (("float64", "Where", "LeakyRelu"), ("float32", "LeakyRelu", "Where")):
        model = randomize(Sequential([Dense(4), LeakyReLU(0.01)], input_shape=(5,), dtype=dtype))
        proto = to_onnx(model)
        ops = {n.op_type for n in proto.graph.node}
        assert want in ops and other not in ops, ops
        assert rel(run_onnx(proto, x.astype(dtype)), model.predict_output(x.astype(dtype))) <= TOL[dtype]


def test_norm_operators_and_their_float64_form():
    """float32 graphs use BatchNormalization and LayerNormalization; float64 ones too when
    eps has an exact float32 value, else they write the normalisation out in float64."""
    for eps, operators in ((2.0**-10, True), (1e-3, False)):
        model = randomize(
            Sequential(
                [
                    Conv2D(3, 2),
                    BatchNormalization(eps=eps),
                    Flatten(),
                    Dense(4),
                    LayerNormalization(eps=eps),
                ],
                input_shape=IMG,
                dtype="float64",
            )
        )
        ops = {n.op_type for n in to_onnx(model).graph.node}
        assert ({"BatchNormalization", "LayerNormalization"} <= ops) == operators
        x = _images(np.random.default_rng(0), 5)
        assert rel(run_onnx(to_onnx(model), x), model.predict_output(x)) <= 1e-10
        m32 = model.clone(dtype="float32")
        assert {"BatchNormalization", "LayerNormalization"} <= {
            n.op_type for n in to_onnx(m32).graph.node
        }


# ------------------------------------------------------------------------ whole models
def test_mlp_on_digits(digits):
    Xtr, ytr, Xte, yte = digits
    model = Sequential(
        [
            Dense(64, activation="relu"),
            Dropout(0.2),
            Dense(32, activation="tanh"),
            Dense(10, activation="softmax"),
        ],
        seed=0,
    )
    model.fit(Xtr, ytr, epochs=3, batch_size=64, verbose=0)
    err32 = rel(run_onnx(to_onnx(model), Xte), model.predict_output(Xte))
    m64 = model.clone(dtype="float64")
    X64 = Xte.astype(np.float64)
    err64 = rel(run_onnx(to_onnx(m64), X64), m64.predict_output(X64))
    print(f"digits MLP: float32 rel {err32:.2e}, float64 (ONNX Runtime) rel {err64:.2e}")
    assert err32 <= 1e-5 and err64 <= 1e-10
    acc = (session(to_onnx(model)).run(["output"], {"input": Xte})[0].argmax(1) == yte).mean()
    assert acc == pytest.approx(model.evaluate(Xte, yte)["accuracy"])


def test_cnn_on_digits(digits):
    Xtr, ytr, Xte, yte = digits
    Xtr, Xte = Xtr.reshape(-1, 8, 8, 1), Xte.reshape(-1, 8, 8, 1)
    model = Sequential(
        [
            Conv2D(8, 3, padding="same", activation="relu"),
            MaxPool2D(2),
            Conv2D(16, 3, activation="relu"),
            AvgPool2D(1),
            Flatten(),
            Dense(10, activation="softmax"),
        ],
        seed=0,
    )
    model.fit(Xtr, ytr, epochs=2, batch_size=64, verbose=0)
    err32 = rel(run_onnx(to_onnx(model), Xte), model.predict_output(Xte))
    m64 = model.clone(dtype="float64")
    X64 = Xte[:60].astype(np.float64)
    err64 = rel(run_onnx(to_onnx(m64), X64), m64.predict_output(X64))
    print(f"digits CNN: float32 rel {err32:.2e}, float64 (onnx.reference) rel {err64:.2e}")
    assert err32 <= 1e-5 and err64 <= 1e-10


def _digit_sequences(X, seed):
    """Each 8x8 digit as 8 steps of 8 pixels, cut to 3..8 real steps, padded at the end or
    (every third row) at the start."""
    rng = np.random.default_rng(seed)
    seqs = X.reshape(-1, 8, 8).copy()
    mask = np.zeros(seqs.shape[:2])
    for i, n in enumerate(rng.integers(3, 9, len(seqs))):
        if i % 3 == 2:
            mask[i, 8 - n :] = 1
        else:
            mask[i, :n] = 1
    seqs[mask == 0] = 0
    return seqs, mask


@pytest.mark.parametrize("kind", ["LSTM", "GRU"])
def test_masked_recurrent_models_on_digit_rows(digits, kind):
    Xtr, ytr, Xte, _ = digits
    str_, mtr = _digit_sequences(Xtr, 0)
    ste, mte = _digit_sequences(Xte, 1)
    cell = LSTM if kind == "LSTM" else GRU
    model = Sequential(
        [cell(24, return_sequences=True), cell(16), Dense(10, activation="softmax")], seed=0
    )
    model.fit(str_, ytr, mask=mtr, epochs=2, batch_size=64, verbose=0)
    proto = to_onnx(model)
    got = session(proto).run(["output"], {"input": ste, "mask": mte.astype(np.float32)})[0]
    err = rel(got, model.predict_output(ste, mask=mte))
    print(f"digit rows {kind} with masks: float32 rel {err:.2e}")
    assert err <= 1e-5


def test_char_model_on_shakespeare(shakespeare_path):
    """Embedding(mask_zero) + GRU + LSTM on variable-length character windows of the text."""
    with open(shakespeare_path, encoding="utf-8") as fh:
        text = fh.read(40_000)
    chars = sorted(set(text))
    ids = np.array([chars.index(c) + 1 for c in text])  # 0 is padding
    rng = np.random.default_rng(0)
    T, n = 24, 400
    starts = rng.integers(0, len(ids) - T - 1, n)
    X = np.zeros((n, T), np.int64)
    y = np.empty(n, np.int64)
    for i, (s, k) in enumerate(zip(starts, rng.integers(4, T + 1, n))):
        X[i, T - k :] = ids[s : s + k]  # left padded, as Keras pads
        y[i] = ids[s + k] - 1
    vocab = len(chars) + 1
    model = Sequential(
        [
            Embedding(vocab, 16, mask_zero=True),
            GRU(32, return_sequences=True),
            LSTM(32),
            Dense(len(chars), activation="softmax"),
        ],
        seed=0,
    )
    model.fit(X[:300], y[:300], epochs=1, batch_size=50, verbose=0)
    proto = to_onnx(model)
    assert [i.name for i in proto.graph.input] == ["input"]
    err = rel(session(proto).run(["output"], {"input": X[300:]})[0], model.predict_output(X[300:]))
    print(f"Shakespeare characters (Embedding mask_zero, GRU, LSTM): float32 rel {err:.2e}")
    assert err <= 1e-5


# ------------------------------------------------------------------------------ errors
class Mystery(Layer):
    """A layer kind sparknet.onnx has no exporter for."""

    def forward(self, x, training=False):
        return x


class WiderDense(Dense):
    """A subclass may compute something else: it needs an exporter of its own."""


def test_unsupported_layer_is_named():
    model = Sequential([Dense(4), Mystery(name="odd_one"), Dense(2)], input_shape=(3,))
    with pytest.raises(
        ValueError,
        match=r"layer 'odd_one' \(Mystery\) cannot be exported to ONNX: no exporter "
        r"for Mystery \(layers with one: .*Dense",
    ):
        to_onnx(model)
    with pytest.raises(ValueError, match=r"layer 'widerdense' \(WiderDense\)"):
        to_onnx(Sequential([WiderDense(3)], input_shape=(3,)))


def test_bad_arguments_are_refused(tmp_path):
    with pytest.raises(ValueError, match="not built yet"):
        to_onnx(Sequential([Dense(3)]))
    with pytest.raises(TypeError, match="takes a sparknet Sequential, got list"):
        to_onnx([Dense(3)])
    model = Sequential([Dense(3)], input_shape=(2,))
    for bad in (12, 10_000, "17", 17.0, True):
        with pytest.raises(ValueError, match=r"opset must be an integer from 13 to \d+ .*got"):
            to_onnx(model, opset=bad)
    with pytest.raises(ValueError, match="mask must be None, True or False, got 'yes'"):
        to_onnx(model, mask="yes")
    # a file name where the opset goes: to_onnx writes no file, export does
    for path in ("model.onnx", tmp_path / "m.onnx"):
        with pytest.raises(TypeError, match=r"to_onnx\(model\) returns the ONNX model and writes no "
                                            r"file: to write .*m(odel)?\.onnx', call "
                                            r"sparknet.onnx.export\(model, "):
            to_onnx(model, path)
    assert not (tmp_path / "m.onnx").exists()
    with pytest.raises(ValueError, match="folder .* does not exist"):
        export(model, tmp_path / "nowhere" / "m.onnx")


# ------------------------------------------------------------------------------- CLI
def test_cli_export(tmp_path, capsys):
    from sparknet.__main__ import main

    model = randomize(Sequential([SimpleRNN(4, return_sequences=True), LSTM(3)], input_shape=SEQ))
    model.save(tmp_path / "m.npz")
    assert main(["export", str(tmp_path / "m.npz"), str(tmp_path / "m.onnx"), "--opset", "18"]) == 0
    out = capsys.readouterr().out
    assert "wrote" in out and "opset 18" in out and "mask ('batch', 6)" in out
    proto = onnx.load(str(tmp_path / "m.onnx"))
    x = _seqs(np.random.default_rng(0), 5).astype(np.float32)
    assert rel(run_onnx(proto, x, MASK[:5]), model.predict_output(x, mask=MASK[:5])) <= 1e-5
    assert main(["export", str(tmp_path / "none.npz"), str(tmp_path / "x.onnx")]) == 2
    assert "no model file" in capsys.readouterr().err
    assert main(["export", str(tmp_path / "m.npz"), str(tmp_path / "x.onnx"), "--opset", "3"]) == 2
    assert "opset must be" in capsys.readouterr().err


# ------------------------------------------------------------------- trained on Spark
def test_data_parallel_trained_model_exports(spark, digits):
    from sparknet.cluster import DataParallelTrainer

    Xtr, ytr, Xte, _ = digits
    model = Sequential([Dense(32, activation="relu"), Dense(10, activation="softmax")], seed=0)
    DataParallelTrainer(model, spark, num_partitions=2, local_steps=8).fit(
        Xtr[:600], ytr[:600], epochs=1, batch_size=32, verbose=0
    )
    err = rel(run_onnx(to_onnx(model), Xte), model.predict_output(Xte))
    print(f"DataParallelTrainer MLP: float32 rel {err:.2e}")
    assert err <= 1e-5


def test_model_parallel_trained_model_exports(spark, digits_xy):
    from sparknet import RMSprop
    from sparknet.cluster.model_parallel import ModelParallel
    from sparknet.cluster.model_parallel.block_partition import BlockPlan

    X, y = digits_xy
    mp = ModelParallel(
        [Dense(24, activation="tanh"), Dense(10, activation="softmax")],
        BlockPlan({0: 2, 1: 2}),
        (64,),
        spark=spark,
        dtype="float64",
        seed=2,
        optimizer=RMSprop(lr=2e-3),
        name="onnx-mp",
    )
    try:
        for s in range(2):
            mp.train_on_batch(X[s * 64 : (s + 1) * 64], y[s * 64 : (s + 1) * 64])
        model = mp.to_sequential()
        err = rel(run_onnx(to_onnx(model), X[:200]), mp.predict_output(X[:200]))
    finally:
        mp.close()
    print(f"ModelParallel MLP: float64 rel {err:.2e}")
    assert err <= 1e-10


# ------------------------------------------------------- Spark ML Model, served by ORT
def test_spark_ml_model_served_by_predict_batch_udf(spark, digits, tmp_path):
    """exportOnnx, then a DataFrame scored by predict_batch_udf around an ONNX Runtime session:
    the Model's transform columns, without sparknet in the scoring function."""
    from pyspark.ml.functions import predict_batch_udf, vector_to_array
    from pyspark.sql import functions as F
    from pyspark.sql import types as T

    from sparknet.ml import SparkNetClassifier

    Xtr, ytr, Xte, yte = digits
    clf = SparkNetClassifier(
        network=Sequential([Dense(32, activation="relu"), Dense(10, activation="softmax")]),
        epochs=1,
        numPartitions=2,
        localSteps=16,
        batchSize=32,
        seed=1,
        thresholds=[1.0] * 9 + [0.5],
    )
    fitted = clf.fit(vector_frame(spark, Xtr[:400], ytr[:400]))
    path = str(tmp_path / "digits.onnx")
    fitted.exportOnnx(path)

    def make_predict_fn():
        import onnxruntime

        sess = onnxruntime.InferenceSession(path, providers=["CPUExecutionProvider"])

        def predict(features):
            prob, pred = sess.run(["probability", "prediction"], {"features": features})
            return {"probability": prob, "prediction": pred}

        return predict

    served = predict_batch_udf(
        make_predict_fn,
        return_type=T.StructType(
            [
                T.StructField("probability", T.ArrayType(T.DoubleType())),
                T.StructField("prediction", T.DoubleType()),
            ]
        ),
        batch_size=128,
        input_tensor_shapes=[[64]],
    )
    test = vector_frame(spark, Xte, yte).repartition(2)
    scored = fitted.transform(test).select(
        vector_to_array("probability").alias("p"),
        "prediction",
        served(vector_to_array("features")).alias("onnx"),
    )
    rows = scored.select(
        "p",
        "prediction",
        F.col("onnx.probability").alias("onnx_p"),
        F.col("onnx.prediction").alias("onnx_prediction"),
    ).toPandas()
    want_p, got_p = np.stack(rows["p"]), np.stack(rows["onnx_p"])
    err = rel(got_p, want_p)
    print(f"Spark ML Model served by predict_batch_udf + ONNX Runtime: probability rel {err:.2e}")
    assert err <= 1e-5
    assert (rows["onnx_prediction"].to_numpy() == rows["prediction"].to_numpy()).all()
    assert (rows["prediction"].to_numpy() != want_p.argmax(axis=1)).any(), (
        "the thresholds changed nothing"
    )

    proto = onnx.load(path)
    assert [i.name for i in proto.graph.input] == ["features"]
    assert [o.name for o in proto.graph.output] == ["rawPrediction", "probability", "prediction"]
    raw = session(proto).run(["rawPrediction"], {"features": Xte[:20].astype(np.float64)})[0]
    assert rel(raw, fitted.network.forward(Xte[:20])) <= 1e-5


def test_spark_ml_regression_and_sequence_models_export(tmp_path):
    """A regressor's one-value prediction, and a sequence classifier reading the flat padded
    steps with their mask values, as transform reads the features column."""
    pytest.importorskip("pyspark")
    from sparknet.ml import SparkNetClassificationModel, SparkNetRegressionModel

    net = randomize(
        Sequential([Dense(6, activation="tanh"), Dense(1)], input_shape=(4,), dtype="float64")
    )
    reg = SparkNetRegressionModel.from_network(net)
    reg.exportOnnx(str(tmp_path / "reg.onnx"))
    proto = onnx.load(str(tmp_path / "reg.onnx"))
    x = np.random.default_rng(0).random((7, 4))
    pred = session(proto).run(["prediction"], {"features": x})[0]
    assert pred.shape == (7,)
    assert rel(pred, np.array([reg.predict(v) for v in x])) <= 1e-10

    seq = SparkNetClassificationModel.from_network(
        randomize(
            Sequential(
                [SequenceMask(), LSTM(5), Dense(3, activation="softmax")],
                input_shape=(SEQ[0], SEQ[1] + 1),
            )
        )
    )
    seq.exportOnnx(str(tmp_path / "seq.onnx"))
    proto = onnx.load(str(tmp_path / "seq.onnx"))
    flat = _flagged(np.random.default_rng(1), 9).reshape(9, -1)
    prob = session(proto).run(["probability"], {"features": flat})[0]
    want = np.array([seq.predictProbability(v).toArray() for v in flat])
    assert rel(prob, want) <= 1e-5


def test_two_class_raw_prediction_follows_mllib(tmp_path):
    """Two classes: ``rawPrediction`` is MLlib's ``[-m, m]`` (margin ``m = z1 - z0``) as the
    Model's ``transform`` writes it, while ``probability`` stays the softmax of the logits."""
    pytest.importorskip("pyspark")
    from sparknet.ml import SparkNetClassificationModel

    net = randomize(
        Sequential([Dense(5, activation="relu"), Dense(2, activation="softmax")], input_shape=(4,),
                   dtype="float64")
    )
    stage = SparkNetClassificationModel.from_network(net)
    stage.exportOnnx(str(tmp_path / "binary.onnx"))
    x = np.random.default_rng(3).random((11, 4))
    raw, prob = session(onnx.load(str(tmp_path / "binary.onnx"))).run(
        ["rawPrediction", "probability"], {"features": x})
    want_raw = np.array([stage.predictRaw(v).toArray() for v in x])
    assert rel(raw, want_raw) <= 1e-10
    assert np.allclose(raw[:, 0], -raw[:, 1])
    assert rel(prob, net.predict_proba(x)) <= 1e-10
