"""Exporters of the sequence layers: ``RNN``, ``LSTM`` and ``GRU`` (with ``sequence_lens``
when a step mask applies; Bidirectional as their ``direction="bidirectional"``),
``Gather`` for Embedding, and SequenceMask.

Masks.  sparknet's recurrent layers skip masked steps wherever they are (the state is
carried over them, their outputs are zeros); ONNX's recurrent operators take the number
of real steps of each sequence, ``sequence_lens``, and read the first ones.  So with a
mask the exported graph first moves each sequence's real steps to its front, in order
(``TopK`` of a key that ranks real steps by time before padded ones, then
``GatherElements``), runs the operator with ``sequence_lens`` = the real steps counted,
and, for ``return_sequences``, puts each output step back where its input step was
(``GatherElements`` by the running count of real steps), with zeros at masked steps.
The final state is then the state after each sequence's last real step, as in sparknet,
whether the padding is at the end, at the start or in between.
"""

from __future__ import annotations

from typing import Sequence, cast

import numpy as np

from sparknet.layers.base import Layer
from sparknet.layers.bidirectional import Bidirectional
from sparknet.layers.embedding import Embedding
from sparknet.layers.masking import SequenceMask
from sparknet.layers.recurrent import GRU, LSTM, SimpleRNN
from sparknet.onnx._builder import BOOL, INT32, INT64, Builder
from sparknet.onnx._registry import register_exporter

#: sparknet's gate blocks in the order ONNX wants them: LSTM (i, f, g, o) -> (i, o, f, c),
#: GRU (r, z, n) -> (z, r, h)
LSTM_ORDER = (0, 3, 1, 2)
GRU_ORDER = (1, 0, 2)

#: sparknet's SimpleRNN activations as ONNX RNN activations (identity: Affine 1 * x + 0)
RNN_ACTIVATIONS = {
    "tanh": ("Tanh", None),
    "relu": ("Relu", None),
    "sigmoid": ("Sigmoid", None),
    "identity": ("Affine", (1.0, 0.0)),
}


def _blocks(a: np.ndarray, order: tuple[int, ...], H: int) -> np.ndarray:
    """The gate blocks of ``H`` rows of ``a`` reordered."""
    return np.concatenate([a[k * H : (k + 1) * H] for k in order], axis=0)


def _weights(layers: Sequence[SimpleRNN | LSTM | GRU], b: Builder,
             order: tuple[int, ...]) -> list[str]:
    """ONNX's ``W``, ``R`` and ``B`` (``(D, G, F)``, ``(D, G, H)``, ``(D, 2G)``) of the
    ``D`` directions ``layers``."""
    Ws, Rs, Bs = [], [], []
    for layer in layers:
        p, H = layer.params, layer.units
        Ws.append(_blocks(p["weight_ih"], order, H))
        Rs.append(_blocks(p["weight_hh"], order, H))
        Bs.append(
            np.concatenate([_blocks(p["bias_ih"], order, H), _blocks(p["bias_hh"], order, H)])
        )
    name = layers[0].name
    return [
        b.const(np.stack(Ws), f"{name}/W"),
        b.const(np.stack(Rs), f"{name}/R"),
        b.const(np.stack(Bs), f"{name}/B"),
    ]


class _Compacted:
    """A batch with each sequence's real steps moved to its front (see the module docstring)."""

    def __init__(self, b: Builder, x: str, mask: str, T: int, name: str) -> None:
        self.b, self.mask, self.name = b, mask, name
        # key: 2T - t for a real step, -t for a padded one: real steps first, in time order
        mf = b.to_float(mask, f"{name}/mask_f")
        key = b.op(
            "Sub",
            [
                b.op("Mul", [mf, b.const(2 * T, f"{name}/two_t")], f"{name}/key"),
                b.const(np.arange(T)[None], f"{name}/steps"),
            ],
            f"{name}/key",
        )
        _, order = b.op(
            "TopK",
            [key, b.ints([T], f"{name}/k")],
            f"{name}/order",
            outputs=2,
            axis=1,
            largest=1,
            sorted=1,
        )
        self.x = self._gather(x, order, "compact")
        self.lens = b.reduce(
            "ReduceSum", b.cast(mask, INT32, f"{name}/mask_i"), [1], f"{name}/lens", keepdims=False
        )

    def _gather(self, t: str, index: str, hint: str) -> str:
        """``t[n, index[n, s], :]`` for a ``(N, T, K)`` tensor ``t`` and ``(N, T)`` ``index``."""
        b, name = self.b, self.name
        full = b.op(
            "Expand",
            [b.unsqueeze(index, [2], f"{name}/{hint}"), b.op("Shape", [t], f"{name}/{hint}")],
            f"{name}/{hint}",
        )
        return b.op("GatherElements", [t, full], f"{name}/{hint}", axis=1)

    def restore(self, y: str) -> str:
        """Output steps ``(N, T, H)`` back at their input steps, zeros at masked ones."""
        b, name = self.b, self.name
        count = b.op(
            "CumSum",
            [
                b.cast(self.mask, INT64, f"{name}/mask_l"),
                b.const(np.int64(1), f"{name}/axis", np.int64),
            ],
            f"{name}/count",
        )
        pos = b.op(
            "Max",
            [
                b.op("Sub", [count, b.const(np.int64(1), f"{name}/one", np.int64)], f"{name}/pos"),
                b.const(np.int64(0), f"{name}/zero", np.int64),
            ],
            f"{name}/pos",
        )
        back = self._gather(y, pos, "restore")
        return b.op(
            "Where",
            [
                b.unsqueeze(self.mask, [2], f"{name}/mask3"),
                back,
                b.const(np.zeros((), b.dtype), f"{name}/zeros"),
            ],
            f"{name}/restore",
        )


def _recurrent(
    layer: Layer,
    b: Builder,
    x: str,
    cells: Sequence[SimpleRNN | LSTM | GRU],
    return_sequences: bool,
    **attrs: object,
) -> list[str]:
    """The operator of ``cells`` (one per direction: forward, then backward) over a
    batch-major ``x``; returns ``[y (N, T, D, H) or "", h (N, D, H) [, c (N, D, H)]]``.
    ``layer``: the exported layer (its name, its input shape)."""
    (T, _), _ = layer._shapes()
    name, H, D = layer.name, cells[0].units, len(cells)
    op_type = {SimpleRNN: "RNN", LSTM: "LSTM", GRU: "GRU"}[type(cells[0])]
    order = {"RNN": (0,), "LSTM": LSTM_ORDER, "GRU": GRU_ORDER}[op_type]
    if op_type == "RNN":
        act, ab = RNN_ACTIVATIONS[cast(SimpleRNN, cells[0]).activation]
        attrs["activations"] = [act] * D
        if ab is not None:
            attrs.update(activation_alpha=[ab[0]] * D, activation_beta=[ab[1]] * D)
    elif op_type == "GRU":
        attrs["linear_before_reset"] = 1
    mask = b.read_mask()
    seq: _Compacted | None = None
    lens = ""
    if mask is not None:
        seq = _Compacted(b, x, mask, T, name)
        x, lens = seq.x, seq.lens
    xt = b.op("Transpose", [x], f"{name}/time_major", perm=[1, 0, 2])
    n_states = 2 if op_type == "LSTM" else 1
    outs = b.op(
        op_type,
        [xt] + _weights(cells, b, order) + [lens],
        name,
        outputs=[f"{name}/Y" if return_sequences else ""]
        + [f"{name}/Y_h", f"{name}/Y_c"][:n_states],
        hidden_size=H,
        direction="bidirectional" if D == 2 else "forward",
        **attrs,
    )
    states = [b.op("Transpose", [s], f"{name}/state", perm=[1, 0, 2]) for s in outs[1:]]
    y = ""
    if return_sequences:  # (T, D, N, H) -> (N, T, D * H), then each step back in place
        y = b.op(
            "Reshape",
            [
                b.op("Transpose", [outs[0]], f"{name}/batch_major", perm=[2, 0, 1, 3]),
                b.ints([0, 0, D * H], f"{name}/merged"),
            ],
            f"{name}/Y",
        )
        if seq is not None:
            y = seq.restore(y)
    else:
        b.mask, b.mask_is_input = None, False
    return [y] + states


def _flat_state(b: Builder, s: str, layer: Layer) -> str:
    """A ``(N, D, H)`` state as ``(N, D * H)``."""
    return b.op("Flatten", [s], f"{layer.name}/state", axis=1)


@register_exporter(SimpleRNN)
def simple_rnn(layer: SimpleRNN, b: Builder, x: str) -> str:
    """``RNN`` (``Tanh``, ``Relu``, ``Sigmoid``, or ``Affine`` 1, 0 for the identity)."""
    y, h = _recurrent(layer, b, x, [layer], layer.return_sequences)
    return y or _flat_state(b, h, layer)


@register_exporter(LSTM)
def lstm(layer: LSTM, b: Builder, x: str) -> str:
    """``LSTM`` (gates reordered i, o, f, c); ``return_state``: ``Concat`` of ``h`` and ``c``."""
    y, h, c = _recurrent(layer, b, x, [layer], layer.return_sequences)
    if layer.return_state:
        return b.op(
            "Concat",
            [_flat_state(b, h, layer), _flat_state(b, c, layer)],
            f"{layer.name}/state",
            axis=1,
        )
    return y or _flat_state(b, h, layer)


@register_exporter(GRU)
def gru(layer: GRU, b: Builder, x: str) -> str:
    """``GRU`` with ``linear_before_reset=1`` (the reset gate on the recurrent product plus
    its bias, as sparknet and PyTorch; gates reordered z, r, h)."""
    y, h = _recurrent(layer, b, x, [layer], layer.return_sequences)
    return y or _flat_state(b, h, layer)


@register_exporter(Bidirectional)
def bidirectional(layer: Bidirectional, b: Builder, x: str) -> str:
    """The wrapped kind's operator with ``direction="bidirectional"``: with
    ``sequence_lens`` the reverse direction starts at each sequence's last real step, as
    sparknet's.  ``concat``: forward features first; ``sum``: ``ReduceSum`` over the
    directions."""
    cells = [layer.forward_layer, layer.backward_layer]
    outs = _recurrent(layer, b, x, cells, layer.return_sequences)
    H, name = cells[0].units, layer.name
    if layer.return_sequences:
        y = outs[0]
        if layer.merge_mode == "sum":
            y = b.op("Reshape", [y, b.ints([0, 0, 2, H], f"{name}/directions")], name)
            y = b.reduce("ReduceSum", y, [2], name, keepdims=False)
        return y
    h = outs[1]
    if layer.merge_mode == "sum":
        return b.reduce("ReduceSum", h, [1], name, keepdims=False)
    return _flat_state(b, h, layer)


@register_exporter(Embedding)
def embedding(layer: Embedding, b: Builder, x: str) -> str:
    """``Gather`` of the rows of the embedding matrix; ``mask_zero``: the mask ``ids != 0``."""
    name = layer.name
    if x not in b.int_tensors:
        x = b.cast(x, INT64, f"{name}/ids")
    if layer.mask_zero:
        m = b.op(
            "Not", [b.op("Equal", [x, b.const(np.int64(0), f"{name}/pad", np.int64)], name)], name
        )
        in_shape, _ = layer._shapes()
        if len(in_shape) > 1:  # a step is real when all of its ids are
            flat = b.op(
                "Reshape",
                [b.cast(m, INT32, f"{name}/mask_i"), b.ints([0, in_shape[0], -1], f"{name}/steps")],
                name,
            )
            m = b.cast(b.reduce("ReduceMin", flat, [2], f"{name}/all", keepdims=False), BOOL, name)
        b.add_mask(m, name)
    return b.op(
        "Gather", [b.const(layer.params["embeddings"], f"{name}/embeddings"), x], name, axis=0
    )


@register_exporter(SequenceMask)
def sequence_mask(layer: SequenceMask, b: Builder, x: str) -> str:
    """``Slice`` the features off; the mask ``last value > 0.5``."""
    (_, F1), _ = layer._shapes()
    name = layer.name
    last = b.squeeze(b.slice(x, 2, F1 - 1, F1, f"{name}/flag"), [2], f"{name}/flag")
    b.add_mask(
        b.op("Greater", [last, b.const(np.asarray(0.5, b.dtype), f"{name}/half")], name), name
    )
    return b.slice(x, 2, 0, F1 - 1, name)
