"""Exporters of the core layers: Dense, Activation, LeakyReLU, Dropout, Flatten, and
ColumnEmbedding."""

from __future__ import annotations

import numpy as np

from sparknet.layers.core import Activation, Dense, Dropout, Flatten, LeakyReLU
from sparknet.layers.tabular import ColumnEmbedding
from sparknet.onnx._builder import INT64, Builder
from sparknet.onnx._registry import register_exporter


@register_exporter(Dense)
def dense(layer: Dense, b: Builder, x: str) -> str:
    """``Gemm`` (``x @ kernel.T + bias``) on a batch of vectors; ``MatMul`` and ``Add`` on
    the last axis of a longer input; then the activation."""
    in_shape, _ = layer._shapes()
    kernel = layer.params["kernel"]
    bias = layer.params.get("bias")
    name = layer.name
    if len(in_shape) == 1:
        inputs = [x, b.const(kernel, f"{name}/kernel")]
        if bias is not None:
            inputs.append(b.const(bias, f"{name}/bias"))
        y = b.op("Gemm", inputs, name, transB=1)
    else:
        y = b.op("MatMul", [x, b.const(kernel.T, f"{name}/kernel_t")], name)
        if bias is not None:
            y = b.op("Add", [y, b.const(bias, f"{name}/bias")], name)
    return b.activation(layer.activation, y, name, layer=layer)


@register_exporter(Activation, any_layout=True)
def activation(layer: Activation, b: Builder, x: str) -> str:
    """``Relu``, ``Tanh``, ``Sigmoid`` or ``Softmax`` (over the channel axis, wherever the
    current layout has it)."""
    return b.activation(
        layer.activation, x, layer.name, axis=1 if b.channels_first else -1, layer=layer
    )


@register_exporter(LeakyReLU, any_layout=True)
def leaky_relu(layer: LeakyReLU, b: Builder, x: str) -> str:
    """``LeakyRelu`` with ``alpha`` the layer's negative slope; a float64 graph whose slope
    has no exact float32 value (``alpha`` is a float32 attribute) writes it out,
    ``Where(x > 0, x, slope * x)``."""
    slope, name = float(layer.negative_slope), layer.name
    if b.dtype == np.float32 or float(np.float32(slope)) == slope:
        return b.op("LeakyRelu", [x], name, alpha=slope)
    positive = b.op("Greater", [x, b.const(0.0, f"{name}/zero")], name)
    scaled = b.op("Mul", [x, b.const(slope, f"{name}/slope")], name)
    return b.op("Where", [positive, x, scaled], name)


@register_exporter(Dropout, any_layout=True)
def dropout(layer: Dropout, b: Builder, x: str) -> str:
    """Nothing: dropout is the identity at inference."""
    return x


@register_exporter(Flatten)
def flatten(layer: Flatten, b: Builder, x: str) -> str:
    """``Flatten`` of the channels-last tensor (sparknet's feature order); ends the mask."""
    b.mask, b.mask_is_input = None, False
    return b.op("Flatten", [x], layer.name, axis=1)


@register_exporter(ColumnEmbedding)
def column_embedding(layer: ColumnEmbedding, b: Builder, x: str) -> str:
    """Per categorical position, ``Gather`` of its id's row of its table; ``Concat`` of
    those, then of the numeric positions (``Gather`` along the features)."""
    name = layer.name
    parts = []
    for k, column in enumerate(layer.columns):
        ids = b.cast(
            b.op(
                "Gather", [x, b.const(np.int64(column), f"{name}/column", np.int64)], name, axis=1
            ),
            INT64,
            f"{name}/ids",
        )
        table = b.const(layer.params[layer._table(k)], f"{name}/{layer._table(k)}")
        parts.append(b.op("Gather", [table, ids], name, axis=0))
    if layer.numeric_columns:
        positions = b.const(
            np.asarray(layer.numeric_columns, np.int64), f"{name}/numeric", np.int64
        )
        parts.append(b.op("Gather", [x, positions], name, axis=1))
    return b.op("Concat", parts, name, axis=1)
