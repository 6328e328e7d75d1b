"""Standard ``torch.nn`` modules as sparknet layers (``CONVERTERS``), and a
``torch.nn.Sequential`` of them as a sparknet model (:func:`from_sequential`).

PyTorch is channels-first, sparknet channels-last: the sparknet model reads images as
``(N, H, W, C)`` and 1-D signals as ``(N, T, C)`` where the torch module read ``(N, C, H, W)``
and ``(N, C, T)``; kernels are transposed accordingly, and a ``Linear`` after ``Flatten``
of a channels-first tensor gets its columns reordered, since the features it reads come in
``(H, W, C)`` order instead of ``(C, H, W)``.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Callable

import numpy as np
import torch
from torch import nn

from sparknet.activations import INPUT_ACTIVATIONS
from sparknet.interop._from_torch_messages import input_shape_of, not_sequential, where
from sparknet.interop._torch import RecurrentOutput
from sparknet.layers import (
    GRU,
    LSTM,
    Activation,
    AvgPool1D,
    AvgPool2D,
    BatchNormalization,
    Bidirectional,
    Conv1D,
    Conv2D,
    Dense,
    Dropout,
    Embedding,
    Flatten,
    GlobalAveragePooling1D,
    GlobalAveragePooling2D,
    GlobalMaxPooling1D,
    GlobalMaxPooling2D,
    Layer,
    LayerNormalization,
    LeakyReLU,
    MaxPool1D,
    MaxPool2D,
    RMSNormalization,
    SimpleRNN,
    TransformerEncoder,
    ZeroPadding1D,
    ZeroPadding2D,
)
from sparknet.layers.conv import Padding, axis_paddings, out_and_pad
from sparknet.model import Sequential

#: the modules that read channels-first input (the others read features on the last axis)
SPATIAL = (
    nn.Conv1d,
    nn.Conv2d,
    nn.MaxPool1d,
    nn.MaxPool2d,
    nn.AvgPool1d,
    nn.AvgPool2d,
    nn.AdaptiveAvgPool1d,
    nn.AdaptiveAvgPool2d,
    nn.AdaptiveMaxPool1d,
    nn.AdaptiveMaxPool2d,
    nn.BatchNorm2d,
    nn.ZeroPad1d,
    nn.ZeroPad2d,
    nn.ConstantPad1d,
    nn.ConstantPad2d,
)
_ACTIVATIONS: dict[type[nn.Module], str] = {
    nn.ReLU: "relu",
    nn.Tanh: "tanh",
    nn.Sigmoid: "sigmoid",
    nn.SiLU: "silu",
}


def numpy_of(t: torch.Tensor | None) -> np.ndarray | None:
    """``t`` as a float64 array (None stays None)."""
    return None if t is None else t.detach().cpu().numpy().astype(np.float64)


@dataclass
class Walk:
    """The conversion so far: sparknet layers, weight setters run after the build, and the
    current tensor's shape in torch's layout."""

    shape: tuple[int, ...]
    channels_first: bool
    layers: list[Layer] = field(default_factory=list)
    setters: list[Callable[[], None]] = field(default_factory=list)
    #: after Flatten of a channels-first tensor: sparknet feature j is torch feature perm[j]
    perm: np.ndarray | None = None
    #: a global pool's (C, 1, ...) output, which the next Flatten makes (C,)
    pooled: bool = False
    #: the last recurrent module's sparknet layers, waiting for a RecurrentOutput
    recurrent: list[Layer] | None = None

    def add(self, layer: Layer, setter: Callable[[], None] | None = None) -> None:
        self.layers.append(layer)
        if setter is not None:
            self.setters.append(setter)


def _padding(
    i: int | str,
    module: nn.Module,
    sizes: tuple[int, ...],
    extents: tuple[int, ...],
    strides: tuple[int, ...],
    pad: Any,
) -> Padding:
    """sparknet's padding for torch's symmetric ``padding``: ``"valid"`` for none,
    ``"same"`` where it places every window where torch does (the same lead padding and
    output size), else the same zeros on both sides of each axis."""
    if isinstance(pad, str):
        return pad
    pads = tuple(pad) if isinstance(pad, (tuple, list)) else (int(pad),) * len(sizes)
    if not any(pads):
        return "valid"
    if all(
        out_and_pad(size, extent, stride, "same") == out_and_pad(size, extent, stride, p)
        for size, extent, stride, p in zip(sizes, extents, strides, pads)
    ):
        return "same"
    return tuple(int(p) for p in pads)


def _outs(
    sizes: tuple[int, ...], extents: tuple[int, ...], strides: tuple[int, ...], pad: Padding
) -> list[int]:
    """The output size of each axis."""
    axes = zip(sizes, extents, strides, axis_paddings(pad, len(sizes)))
    return [out_and_pad(s, e, t, p)[0] for s, e, t, p in axes]


def _tuple(v: Any, n: int) -> tuple[int, ...]:
    return tuple(int(a) for a in v) if isinstance(v, (tuple, list)) else (int(v),) * n


def _linear(i: int | str, m: nn.Linear, w: Walk) -> None:
    if w.channels_first and len(w.shape) > 1:
        raise ValueError(
            f"{where(i, m)} reads the last axis of a channels-first tensor {w.shape}: "
            f"put nn.Flatten() before it"
        )
    layer = Dense(m.out_features, use_bias=m.bias is not None)
    perm = w.perm
    w.perm = None

    def setter() -> None:
        W = numpy_of(m.weight)
        assert W is not None
        layer.params["kernel"][...] = W if perm is None else W[:, perm]
        if m.bias is not None:
            layer.params["bias"][...] = numpy_of(m.bias)

    w.add(layer, setter)
    w.shape = w.shape[:-1] + (m.out_features,)


def _conv(i: int | str, m: nn.Conv1d | nn.Conv2d, w: Walk) -> None:
    n = 1 if isinstance(m, nn.Conv1d) else 2
    if m.groups != 1 or m.padding_mode != "zeros":
        raise ValueError(
            f"{where(i, m)}: groups={m.groups}, padding_mode={m.padding_mode!r}; sparknet "
            f"convolutions have groups=1 and zero padding"
        )
    sizes = w.shape[1:]
    ks, st, dl = _tuple(m.kernel_size, n), _tuple(m.stride, n), _tuple(m.dilation, n)
    extents = tuple(d * (k - 1) + 1 for k, d in zip(ks, dl))
    padding = _padding(i, m, sizes, extents, st, m.padding)
    kind: Any = Conv1D if n == 1 else Conv2D
    layer = kind(
        m.out_channels,
        ks if n == 2 else ks[0],
        strides=st if n == 2 else st[0],
        padding=padding,
        dilation=dl if n == 2 else dl[0],
        use_bias=m.bias is not None,
    )

    def setter() -> None:
        W = numpy_of(m.weight)
        assert W is not None
        layer.params["kernel"][...] = np.moveaxis(W, (0, 1), (-1, -2))
        if m.bias is not None:
            layer.params["bias"][...] = numpy_of(m.bias)

    w.add(layer, setter)
    outs = _outs(sizes, extents, st, padding)
    w.shape = (m.out_channels, *outs)


def _pool(i: int | str, m: nn.Module, w: Walk) -> None:
    n = 1 if isinstance(m, (nn.MaxPool1d, nn.AvgPool1d)) else 2
    is_max = isinstance(m, (nn.MaxPool1d, nn.MaxPool2d))
    if (
        getattr(m, "ceil_mode", False)
        or getattr(m, "return_indices", False)
        or _tuple(getattr(m, "dilation", 1), n) != (1,) * n
        or getattr(m, "divisor_override", None)
    ):
        raise ValueError(
            f"{where(i, m)}: ceil_mode, return_indices, dilation and divisor_override "
            f"have no sparknet equivalent"
        )
    ks = _tuple(m.kernel_size, n)
    st = _tuple(m.stride if m.stride is not None else m.kernel_size, n)
    padding = _padding(i, m, w.shape[1:], ks, st, m.padding)
    if padding != "valid" and not is_max and getattr(m, "count_include_pad", True):
        raise ValueError(
            f"{where(i, m)}: count_include_pad=True; sparknet's average pools leave the "
            f"padding out of the mean (count_include_pad=False)"
        )
    kind: Any = {
        (1, True): MaxPool1D,
        (2, True): MaxPool2D,
        (1, False): AvgPool1D,
        (2, False): AvgPool2D,
    }
    args = (ks, st) if n == 2 else (ks[0], st[0])
    w.add(kind[(n, is_max)](args[0], strides=args[1], padding=padding))
    outs = _outs(w.shape[1:], ks, st, padding)
    w.shape = (w.shape[0], *outs)


def _adaptive(i: int | str, m: nn.Module, w: Walk) -> None:
    n = 1 if isinstance(m, (nn.AdaptiveAvgPool1d, nn.AdaptiveMaxPool1d)) else 2
    if _tuple(m.output_size, n) != (1,) * n:
        raise ValueError(
            f"{where(i, m)}: output_size={m.output_size}; sparknet's global pools give one "
            f"value per channel (output_size=1)"
        )
    is_max = isinstance(m, (nn.AdaptiveMaxPool1d, nn.AdaptiveMaxPool2d))
    kind: Any = {
        (1, False): GlobalAveragePooling1D,
        (1, True): GlobalMaxPooling1D,
        (2, False): GlobalAveragePooling2D,
        (2, True): GlobalMaxPooling2D,
    }[(n, is_max)]
    w.add(kind())
    w.shape = (w.shape[0],) + (1,) * n
    w.pooled = True


def _flatten(i: int | str, m: nn.Flatten, w: Walk) -> None:
    if m.start_dim != 1 or m.end_dim != -1:
        raise ValueError(
            f"{where(i, m)}: start_dim={m.start_dim}, end_dim={m.end_dim}; sparknet's "
            f"Flatten keeps the batch axis and flattens the rest (1, -1)"
        )
    size = int(np.prod(w.shape))
    if w.pooled:  # (C, 1, ...) -> (C,): the global pool already gave (N, C)
        w.pooled = False
    elif w.channels_first and len(w.shape) > 1:
        C, *rest = w.shape
        w.perm = np.arange(size).reshape(w.shape).transpose(*range(1, len(w.shape)), 0).reshape(-1)
        w.add(Flatten())
    else:
        w.add(Flatten())
    w.shape, w.channels_first = (size,), False


def _recurrent(i: int | str, m: nn.RNNBase, w: Walk) -> None:
    if not m.batch_first or getattr(m, "proj_size", None):
        raise ValueError(
            f"{where(i, m)}: needs batch_first=True and no proj_size (sparknet sequences "
            f"are (N, T, F))"
        )
    if len(w.shape) != 2 or w.channels_first:
        raise ValueError(f"{where(i, m)} needs sequences (N, T, F), got {w.shape}")
    made: list[Layer] = []
    for layer_i in range(m.num_layers):

        def cell() -> Layer:
            if isinstance(m, nn.LSTM):
                return LSTM(m.hidden_size, return_sequences=True)
            if isinstance(m, nn.GRU):
                return GRU(m.hidden_size, return_sequences=True)
            act = "relu" if m.nonlinearity == "relu" else "tanh"
            return SimpleRNN(m.hidden_size, activation=act, return_sequences=True)

        fwd = cell()
        layer = Bidirectional(fwd) if m.bidirectional else fwd
        cells = (
            [layer.forward_layer, layer.backward_layer]
            if isinstance(layer, Bidirectional)
            else [layer]
        )

        def setter(cells: list[Any] = cells, k: int = layer_i) -> None:
            for c, suffix in zip(cells, ("", "_reverse")):
                for name in ("weight_ih", "weight_hh", "bias_ih", "bias_hh"):
                    t = getattr(m, f"{name}_l{k}{suffix}", None)
                    c.params[name][...] = 0 if t is None else numpy_of(t)

        w.add(layer, setter)
        made.append(layer)
    w.recurrent = made
    w.shape = (w.shape[0], m.hidden_size * (2 if m.bidirectional else 1))


def _recurrent_output(i: int | str, m: Any, w: Walk) -> None:
    if not w.recurrent:
        raise ValueError(f"{where(i, m)} must follow an nn.RNN, nn.LSTM or nn.GRU")
    if not m.return_sequences:
        last: Any = w.recurrent[-1]  # not built yet: its output can still change
        for c in [last] + (
            [last.forward_layer, last.backward_layer] if isinstance(last, Bidirectional) else []
        ):
            c.return_sequences = False
        w.shape = w.shape[1:]
    w.recurrent = None


def _batch_norm(i: int | str, m: nn.modules.batchnorm._BatchNorm, w: Walk) -> None:
    if m.momentum is None or not m.track_running_stats:
        raise ValueError(
            f"{where(i, m)}: momentum=None (a cumulative average) and "
            f"track_running_stats=False have no sparknet equivalent"
        )
    if isinstance(m, nn.BatchNorm1d) and len(w.shape) == 2 and not w.channels_first:
        raise ValueError(
            f"{where(i, m)} on (N, {w.shape[0]}, {w.shape[1]}) normalises axis 1 of a "
            f"sequence; sparknet normalises the last axis (use it on (N, F) or after Conv1d)"
        )
    layer = BatchNormalization(momentum=m.momentum, eps=m.eps, center=m.affine, scale=m.affine)

    def setter() -> None:
        if m.affine:
            layer.params["gamma"][...] = numpy_of(m.weight)
            layer.params["beta"][...] = numpy_of(m.bias)
        layer.state["running_mean"][...] = numpy_of(m.running_mean)
        layer.state["running_var"][...] = numpy_of(m.running_var)

    w.add(layer, setter)


def _layer_norm(i: int | str, m: nn.LayerNorm, w: Walk) -> None:
    if len(m.normalized_shape) != 1 or (w.channels_first and len(w.shape) > 1):
        raise ValueError(
            f"{where(i, m)}: normalized_shape={tuple(m.normalized_shape)} on {w.shape}; "
            f"sparknet normalises the last axis of channels-last tensors only"
        )
    layer = LayerNormalization(eps=m.eps, center=m.bias is not None, scale=m.weight is not None)

    def setter() -> None:
        if m.weight is not None:
            layer.params["gamma"][...] = numpy_of(m.weight)
        if m.bias is not None:
            layer.params["beta"][...] = numpy_of(m.bias)

    w.add(layer, setter)


def _rms_norm(i: int | str, m: nn.RMSNorm, w: Walk) -> None:
    if len(m.normalized_shape) != 1 or (w.channels_first and len(w.shape) > 1):
        raise ValueError(
            f"{where(i, m)}: normalized_shape={tuple(m.normalized_shape)} on {w.shape}; "
            f"sparknet normalises the last axis of channels-last tensors only"
        )
    # eps=None: PyTorch's default, the machine epsilon of the module's float type
    double = m.weight is not None and m.weight.dtype == torch.float64
    eps = m.eps if m.eps is not None else float(np.finfo(np.float64 if double else np.float32).eps)
    layer = RMSNormalization(eps=eps, scale=m.weight is not None)
    if m.weight is not None:
        w.add(layer, lambda: layer.params["gamma"].__setitem__(Ellipsis, numpy_of(m.weight)))
    else:
        w.add(layer)


def _embedding(i: int | str, m: nn.Embedding, w: Walk) -> None:
    if m.max_norm is not None:
        raise ValueError(f"{where(i, m)}: max_norm has no sparknet equivalent")
    layer = Embedding(m.num_embeddings, m.embedding_dim)
    w.add(layer, lambda: layer.params["embeddings"].__setitem__(Ellipsis, numpy_of(m.weight)))
    w.shape = w.shape + (m.embedding_dim,)


def _activation(i: int | str, m: nn.Module, w: Walk) -> None:
    if isinstance(m, nn.GELU):
        name = "gelu_tanh" if m.approximate == "tanh" else "gelu"
    elif isinstance(m, nn.Softmax):
        spatial = w.channels_first and len(w.shape) > 1
        if m.dim != 1 if spatial else m.dim not in (-1, len(w.shape)):
            raise ValueError(
                f"{where(i, m)}: dim={m.dim}; sparknet's softmax is over the features "
                f"(the last axis, or the channels)"
            )
        name = "softmax"
    else:
        name = _ACTIVATIONS[type(m)]
    prev = w.layers[-1] if w.layers else None
    fusable = Dense if name in INPUT_ACTIVATIONS else (Dense, Conv1D, Conv2D)
    if isinstance(prev, fusable) and prev.activation == "identity":
        prev._set_activation(name)  # fused, as sparknet's kernels apply it
    else:
        w.add(Activation(name))


def _leaky_relu(i: int | str, m: nn.LeakyReLU, w: Walk) -> None:
    if not 0.0 <= m.negative_slope <= 1.0:
        raise ValueError(
            f"{where(i, m)}: negative_slope={m.negative_slope}; sparknet's "
            f"LeakyReLU takes a slope in [0, 1]"
        )
    w.add(LeakyReLU(m.negative_slope))


def _zero_pad(i: int | str, m: nn.Module, w: Walk) -> None:
    """``nn.ZeroPad1d/2d`` (or ``ConstantPad`` with 0): torch's pads run from the last axis
    of its tensor backwards; the channel axis stays unpadded."""
    pads, n = list(m.padding), len(w.shape)
    sides = {n - 1 - j: (int(pads[2 * j]), int(pads[2 * j + 1])) for j in range(len(pads) // 2)}
    channel = 0 if w.channels_first else n - 1
    spatial = [a for a in range(n) if a != channel] if n > 1 else []
    if getattr(m, "value", 0) != 0 or any(sides.get(channel, (0, 0))) or len(spatial) not in (1, 2):
        raise ValueError(
            f"{where(i, m)}: pads {tuple(pads)} of {w.shape} (value {getattr(m, 'value', 0)}); "
            f"sparknet pads the steps or the pixels with zeros, not the channels"
        )
    padding = tuple(sides.get(a, (0, 0)) for a in spatial)
    w.add(ZeroPadding1D(padding[0]) if len(padding) == 1 else ZeroPadding2D(padding))
    w.shape = tuple(s + sum(sides.get(a, (0, 0))) for a, s in enumerate(w.shape))


def _transformer_name(torch_name: str) -> str:
    """sparknet's name of a ``TransformerEncoderLayer`` ``state_dict`` entry (the children's
    names are PyTorch's; the leaves are sparknet's: ``kernel``, ``gamma``, ``beta``,
    ``out_proj_weight``)."""
    head, leaf = torch_name.rsplit(".", 1)
    if head == "self_attn.out_proj":
        return f"self_attn.out_proj_{leaf}"
    if head.startswith("linear"):
        return f"{head}.{'kernel' if leaf == 'weight' else leaf}"
    if head.startswith("norm"):
        return f"{head}.{'gamma' if leaf == 'weight' else 'beta'}"
    return torch_name


def _transformer_layer(i: int | str, m: nn.TransformerEncoderLayer, w: Walk) -> None:
    act = {1: "relu", 2: "gelu"}.get(getattr(m, "activation_relu_or_gelu", 0))
    if not m.self_attn.batch_first:
        raise ValueError(
            f"{where(i, m)}: needs batch_first=True (sparknet's sequences are (N, T, D))"
        )
    if act is None:
        raise ValueError(
            f"{where(i, m)}: activation {m.activation!r}; sparknet's "
            f"TransformerEncoder takes relu or gelu"
        )
    parts = (m.self_attn.in_proj_bias, m.linear1.bias, m.linear2.bias, m.norm1.bias, m.norm2.bias)
    if any(p is None for p in parts) or m.norm1.eps != m.norm2.eps:
        raise ValueError(
            f"{where(i, m)}: bias=False (or two norm eps); sparknet's "
            f"TransformerEncoder has every bias and one eps"
        )
    layer = TransformerEncoder(
        m.self_attn.num_heads,
        m.linear1.out_features,
        dropout=m.dropout.p,
        activation=act,
        norm_first=m.norm_first,
        eps=m.norm1.eps,
    )

    def setter() -> None:
        for name, value in m.state_dict().items():
            layer.params[_transformer_name(name)][...] = numpy_of(value)

    w.add(layer, setter)


def _transformer_stack(i: int | str, m: nn.TransformerEncoder, w: Walk) -> None:
    for layer in m.layers:
        _transformer_layer(i, layer, w)
    if m.norm is not None:
        _layer_norm(i, m.norm, w)


def _dropout(i: int | str, m: nn.Dropout, w: Walk) -> None:
    w.add(Dropout(m.p))


CONVERTERS: dict[type[nn.Module], Callable[[int | str, Any, Walk], None]] = {
    nn.Linear: _linear,
    nn.Conv1d: _conv,
    nn.Conv2d: _conv,
    nn.MaxPool1d: _pool,
    nn.MaxPool2d: _pool,
    nn.AvgPool1d: _pool,
    nn.AvgPool2d: _pool,
    nn.AdaptiveAvgPool1d: _adaptive,
    nn.AdaptiveAvgPool2d: _adaptive,
    nn.AdaptiveMaxPool1d: _adaptive,
    nn.AdaptiveMaxPool2d: _adaptive,
    nn.Flatten: _flatten,
    nn.RNN: _recurrent,
    nn.LSTM: _recurrent,
    nn.GRU: _recurrent,
    RecurrentOutput: _recurrent_output,
    nn.BatchNorm1d: _batch_norm,
    nn.BatchNorm2d: _batch_norm,
    nn.LayerNorm: _layer_norm,
    nn.RMSNorm: _rms_norm,
    nn.Embedding: _embedding,
    nn.TransformerEncoderLayer: _transformer_layer,
    nn.TransformerEncoder: _transformer_stack,
    nn.Dropout: _dropout,
    nn.ReLU: _activation,
    nn.Tanh: _activation,
    nn.Sigmoid: _activation,
    nn.GELU: _activation,
    nn.SiLU: _activation,
    nn.LeakyReLU: _leaky_relu,
    nn.Softmax: _activation,
    nn.Identity: lambda i, m, w: None,
    nn.ZeroPad1d: _zero_pad,
    nn.ZeroPad2d: _zero_pad,
    nn.ConstantPad1d: _zero_pad,
    nn.ConstantPad2d: _zero_pad,
}


def sparknet_input_shape(shape: tuple[int, ...], channels_first: bool) -> tuple[int, ...]:
    """The per-sample shape sparknet reads for torch's ``shape``."""
    return (*shape[1:], shape[0]) if channels_first else shape


def build_model(
    walk: Walk, shape: tuple[int, ...], channels_first: bool, module: nn.Module, dtype: Any
) -> Sequential:
    """The sparknet model of the layers ``walk`` made from the torch input ``shape``, in
    ``dtype`` (default: ``module``'s float type), holding ``module``'s weights."""
    if walk.perm is not None:
        raise ValueError(
            "nn.Flatten of a channels-first tensor (or torch.flatten, or x.view) must be "
            "followed by an nn.Linear (which absorbs the reordering of the features)"
        )
    params = list(module.parameters())
    if dtype is None:
        dtype = "float64" if params and params[0].dtype == torch.float64 else "float32"
    model = Sequential(
        walk.layers, input_shape=sparknet_input_shape(shape, channels_first), dtype=dtype
    )
    for setter in walk.setters:
        setter()
    return model


def from_sequential(module: nn.Module, input_shape: Any = None, dtype: Any = None) -> Sequential:
    """The sparknet model of an ``nn.Sequential`` of the modules of ``CONVERTERS``; the
    arguments are :func:`~sparknet.interop._from_torch.from_torch`'s."""
    if not isinstance(module, nn.Sequential):
        raise TypeError(not_sequential(module, type(module) in CONVERTERS))
    for i, m in enumerate(module):
        if type(m) not in CONVERTERS:
            raise ValueError(f"{where(i, m)} has no sparknet equivalent: {m!r}")
    first = next(
        (
            m
            for m in module
            if type(m) in CONVERTERS and not isinstance(m, (nn.Dropout, nn.Identity))
        ),
        None,
    )
    if input_shape is None:
        input_shape = input_shape_of(list(enumerate(module)), first, SPATIAL)
    shape = tuple(int(d) for d in input_shape)
    channels_first = isinstance(first, SPATIAL)
    walk = Walk(shape, channels_first)
    for i, m in enumerate(module):
        convert = CONVERTERS[type(m)]
        if walk.recurrent is not None and not isinstance(m, RecurrentOutput):
            raise ValueError(
                f"{where(i, m)} follows an nn.{type(module[i - 1]).__name__}, whose output is "
                f"a tuple: put sparknet.interop.RecurrentOutput(...) between them"
            )
        convert(i, m, walk)
    if walk.recurrent is not None:
        raise ValueError(
            "the module ends in a recurrent module: add sparknet.interop.RecurrentOutput(...)"
        )
    return build_model(walk, shape, channels_first, module, dtype)
