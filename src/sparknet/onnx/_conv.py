"""Exporters of the convolution and pooling layers, 2-D and 1-D (``Conv``, ``MaxPool``,
``AveragePool``), and of the global pools (``GlobalAveragePool``, ``GlobalMaxPool``, or
masked reductions).  sparknet is channels-last and ONNX channels-first: a run of these
layers reads one transposed tensor and the next layer of another kind transposes back."""

from __future__ import annotations

from typing import Sequence, Union

import numpy as np

from sparknet.layers.conv import (
    AvgPool2D,
    Conv2D,
    MaxPool2D,
    Padding,
    axis_paddings,
    out_and_pad,
    trailing_pad,
)
from sparknet.layers.conv1d import AvgPool1D, Conv1D, MaxPool1D
from sparknet.layers.padding import ZeroPadding1D, ZeroPadding2D
from sparknet.layers.pooling import (
    GlobalAveragePooling1D,
    GlobalAveragePooling2D,
    GlobalMaxPooling1D,
    GlobalMaxPooling2D,
)
from sparknet.onnx._builder import Builder
from sparknet.onnx._registry import register_exporter

Conv = Union[Conv1D, Conv2D]
Pool = Union[MaxPool1D, AvgPool1D, MaxPool2D, AvgPool2D]


def explicit_pads(
    sizes: Sequence[int], extents: Sequence[int], strides: Sequence[int], padding: Padding
) -> list[int]:
    """ONNX's ``pads`` (all the leading pads, then all the trailing ones) for sparknet's
    padding: ``"valid"``, ``"same"`` (half before, the rest after) or explicit zeros."""
    begin, end = [], []
    pads = axis_paddings(padding, len(sizes))
    for size, extent, stride, pad in zip(sizes, extents, strides, pads):
        begin.append(out_and_pad(size, extent, stride, pad)[1])
        end.append(trailing_pad(size, extent, stride, pad))
    return begin + end


def _tuple(v: int | tuple[int, ...]) -> tuple[int, ...]:
    return tuple(v) if isinstance(v, (tuple, list)) else (int(v),)


def _no_mask(layer: Conv | Pool | ZeroPadding1D | ZeroPadding2D, b: Builder) -> None:
    """sparknet refuses a mask made by the model's layers at these layers; the graph's
    ``mask`` input simply stops here (the layer does not read it)."""
    if b.mask is not None and not b.mask_is_input:
        raise ValueError(
            f"{type(layer).__name__} {layer.name!r} does not support masking, but a mask made "
            f"by an earlier layer (Embedding(mask_zero=True) or SequenceMask) reaches it: "
            f"sparknet refuses to run this model, so it is not exported either"
        )
    b.mask, b.mask_is_input = None, False


@register_exporter(Conv2D, Conv1D, any_layout=True)
def conv(layer: Conv, b: Builder, x: str) -> str:
    """``Conv`` with the kernel ``(k..., C, F)`` laid out as ONNX's ``(F, C, k...)``, then
    the activation (a softmax over the channels)."""
    in_shape, _ = layer._shapes()
    sizes = in_shape[:-1]
    name = layer.name
    _no_mask(layer, b)
    x = b.channels_first_of(x, 1 + len(in_shape), f"{name}/to_channels_first")
    kernel = layer.params["kernel"]
    ks, strides, dil = _tuple(layer.kernel_size), _tuple(layer.strides), _tuple(layer.dilation)
    order = tuple(range(kernel.ndim))
    inputs = [x, b.const(kernel.transpose(order[-1], order[-2], *order[:-2]), f"{name}/kernel")]
    if layer.use_bias:
        inputs.append(b.const(layer.params["bias"], f"{name}/bias"))
    extents = [d * (k - 1) + 1 for k, d in zip(ks, dil)]
    y = b.op(
        "Conv",
        inputs,
        name,
        kernel_shape=list(ks),
        strides=list(strides),
        dilations=list(dil),
        pads=explicit_pads(sizes, extents, strides, layer.padding),
    )
    return b.activation(layer.activation, y, name, axis=1, layer=layer)


def _pool(op_type: str, layer: Pool, b: Builder, x: str, **attrs: int) -> str:
    in_shape, _ = layer._shapes()
    _no_mask(layer, b)
    x = b.channels_first_of(x, 1 + len(in_shape), f"{layer.name}/to_channels_first")
    ps, strides = _tuple(layer.pool_size), _tuple(layer.strides)
    return b.op(
        op_type,
        [x],
        layer.name,
        kernel_shape=list(ps),
        strides=list(strides),
        pads=explicit_pads(in_shape[:-1], ps, strides, layer.padding),
        **attrs,
    )


@register_exporter(MaxPool2D, MaxPool1D, any_layout=True)
def max_pool(layer: MaxPool2D | MaxPool1D, b: Builder, x: str) -> str:
    """``MaxPool`` (padded taps never win, as in sparknet)."""
    return _pool("MaxPool", layer, b, x)


@register_exporter(AvgPool2D, AvgPool1D, any_layout=True)
def avg_pool(layer: AvgPool2D | AvgPool1D, b: Builder, x: str) -> str:
    """``AveragePool`` with ``count_include_pad=0`` (the mean of the taps inside the input)."""
    return _pool("AveragePool", layer, b, x, count_include_pad=0)


def _global(op_type: str, layer: GlobalPool, b: Builder, x: str) -> str:
    """``GlobalAveragePool`` / ``GlobalMaxPool`` on the channels-first tensor, flattened
    to ``(N, C)``."""
    in_shape, _ = layer._shapes()
    x = b.channels_first_of(x, 1 + len(in_shape), f"{layer.name}/to_channels_first")
    y = b.op("Flatten", [b.op(op_type, [x], layer.name)], layer.name, axis=1)
    b.channels_first = False
    return y


def _masked(
    layer: GlobalAveragePooling1D | GlobalMaxPooling1D, b: Builder, x: str, mask: str
) -> str:
    """The mean or maximum over each sample's real steps (0 for a sample with none)."""
    name = layer.name
    m3 = b.unsqueeze(mask, [2], f"{name}/mask")
    count = b.reduce("ReduceSum", b.to_float(mask, f"{name}/mask_f"), [1], f"{name}/count")
    if isinstance(layer, GlobalAveragePooling1D):
        total = b.reduce(
            "ReduceSum",
            b.op("Where", [m3, x, b.const(0.0, f"{name}/zero")], name),
            [1],
            name,
            keepdims=False,
        )
        return b.op("Div", [total, b.op("Max", [count, b.const(1.0, f"{name}/one")], name)], name)
    low = b.op("Where", [m3, x, b.const(-np.inf, f"{name}/low")], name)
    top = b.reduce("ReduceMax", low, [1], name, keepdims=False)
    some = b.op("Greater", [count, b.const(0.0, f"{name}/zero")], name)
    return b.op("Where", [some, top, b.const(0.0, f"{name}/zero")], name)


GlobalPool = Union[
    GlobalAveragePooling1D, GlobalMaxPooling1D, GlobalAveragePooling2D, GlobalMaxPooling2D
]


@register_exporter(GlobalAveragePooling1D, GlobalMaxPooling1D, any_layout=True)
def global_pool_1d(layer: GlobalAveragePooling1D | GlobalMaxPooling1D, b: Builder, x: str) -> str:
    """``GlobalAveragePool`` / ``GlobalMaxPool``; with a step mask, ``ReduceSum`` /
    ``ReduceMax`` over the real steps.  Ends the mask."""
    mask = b.read_mask()
    b.mask, b.mask_is_input = None, False
    if mask is None:
        op = "GlobalAveragePool" if isinstance(layer, GlobalAveragePooling1D) else "GlobalMaxPool"
        return _global(op, layer, b, x)
    return _masked(layer, b, b.channels_last_of(x, 3, f"{layer.name}/to_channels_last"), mask)


@register_exporter(GlobalAveragePooling2D, any_layout=True)
def global_avg_pool_2d(layer: GlobalAveragePooling2D, b: Builder, x: str) -> str:
    """``GlobalAveragePool``, flattened to ``(N, C)``."""
    return _global("GlobalAveragePool", layer, b, x)


@register_exporter(GlobalMaxPooling2D, any_layout=True)
def global_max_pool_2d(layer: GlobalMaxPooling2D, b: Builder, x: str) -> str:
    """``GlobalMaxPool``, flattened to ``(N, C)``."""
    return _global("GlobalMaxPool", layer, b, x)


@register_exporter(ZeroPadding1D, ZeroPadding2D, any_layout=True)
def zero_padding(layer: ZeroPadding1D | ZeroPadding2D, b: Builder, x: str) -> str:
    """``Pad`` with zeros around the spatial axes, in the input's layout."""
    _no_mask(layer, b)
    first = 2 if b.channels_first else 1
    rank = len(layer.padding) + 2
    begin, end = [0] * rank, [0] * rank
    for k, (before, after) in enumerate(layer.padding):
        begin[first + k], end[first + k] = before, after
    pads = b.const(np.array(begin + end, dtype=np.int64), f"{layer.name}/pads", np.int64)
    return b.op("Pad", [x, pads], layer.name)
