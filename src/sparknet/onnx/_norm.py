"""Exporters of the normalisation layers: ``BatchNormalization`` (inference: the running
statistics), ``LayerNormalization`` (its operator from opset 17, its definition before) and
``RMSNormalization`` (its definition).

Both operators take ``epsilon`` as a float32 attribute.  A float64 model whose ``eps`` has no
exact float32 value (1e-3, 1e-5) would lose digits there (1e-10 of the output with
``eps=1e-3``), so its graph writes the normalisation out instead: BatchNormalization as one
``Mul`` and one ``Add`` by constants computed in float64, LayerNormalization as its
definition with ``ReduceMean``."""

from __future__ import annotations

import numpy as np

from sparknet.layers.normalization import (
    BatchNormalization,
    LayerNormalization,
    RMSNormalization,
)
from sparknet.onnx._builder import Builder
from sparknet.onnx._registry import register_exporter


def _affine(
    layer: BatchNormalization | LayerNormalization | RMSNormalization, b: Builder
) -> tuple[np.ndarray, np.ndarray]:
    """``gamma`` and ``beta``, ones and zeros where the layer learns none."""
    F = layer.features
    gamma = layer.params.get("gamma")
    beta = layer.params.get("beta")
    return (np.ones(F, b.dtype) if gamma is None else gamma), (
        np.zeros(F, b.dtype) if beta is None else beta
    )


def _exact_eps(layer: BatchNormalization | LayerNormalization, b: Builder) -> bool:
    """The operator's float32 ``epsilon`` is the layer's ``eps`` (or the graph is float32)."""
    return b.dtype == np.float32 or float(np.float32(layer.eps)) == layer.eps


@register_exporter(BatchNormalization, any_layout=True)
def batch_norm(layer: BatchNormalization, b: Builder, x: str) -> str:
    """``BatchNormalization`` (inference) over the channel axis, which ONNX wants at 1:
    convolutional runs stay channels-first, a batch of vectors needs nothing, sequences
    are transposed.  (Float64 with an ``eps`` float32 cannot hold: ``Mul`` and ``Add``.)"""
    in_shape, _ = layer._shapes()
    name = layer.name
    gamma, beta = _affine(layer, b)
    if not _exact_eps(layer, b):
        x = b.channels_last_of(x, 1 + len(in_shape), f"{name}/to_channels_last")
        scale = gamma / np.sqrt(layer.state["running_var"] + layer.eps)
        shift = beta - layer.state["running_mean"] * scale
        return b.op(
            "Add",
            [
                b.op("Mul", [x, b.const(scale, f"{name}/scale")], name),
                b.const(shift, f"{name}/shift"),
            ],
            name,
        )
    x = b.channels_first_of(x, 1 + len(in_shape), f"{name}/to_channels_first")
    return b.op(
        "BatchNormalization",
        [
            x,
            b.const(gamma, f"{name}/gamma"),
            b.const(beta, f"{name}/beta"),
            b.const(layer.state["running_mean"], f"{name}/running_mean"),
            b.const(layer.state["running_var"], f"{name}/running_var"),
        ],
        name,
        epsilon=float(layer.eps),
    )


@register_exporter(LayerNormalization)
def layer_norm(layer: LayerNormalization, b: Builder, x: str) -> str:
    """``LayerNormalization`` over the last axis (opset 17 on); before 17 (and for float64
    with an ``eps`` float32 cannot hold), ``(x - mean) / sqrt(var + eps) * gamma + beta``
    with ``ReduceMean``."""
    name = layer.name
    gamma, beta = _affine(layer, b)
    g, bt = b.const(gamma, f"{name}/gamma"), b.const(beta, f"{name}/beta")
    if b.opset >= 17 and _exact_eps(layer, b):
        return b.op("LayerNormalization", [x, g, bt], name, axis=-1, epsilon=float(layer.eps))
    d = b.op("Sub", [x, b.reduce("ReduceMean", x, [-1], f"{name}/mean")], name)
    var = b.reduce("ReduceMean", b.op("Mul", [d, d], name), [-1], f"{name}/var")
    std = b.op("Sqrt", [b.op("Add", [var, b.const(layer.eps, f"{name}/eps")], name)], name)
    return b.op("Add", [b.op("Mul", [b.op("Div", [d, std], name), g], name), bt], name)


@register_exporter(RMSNormalization)
def rms_norm(layer: RMSNormalization, b: Builder, x: str) -> str:
    """``x / sqrt(mean(x * x) + eps) * gamma`` over the last axis with ``ReduceMean`` (ONNX's
    ``RMSNormalization`` operator is opset 23 only)."""
    name = layer.name
    gamma, _ = _affine(layer, b)
    ms = b.reduce("ReduceMean", b.op("Mul", [x, x], name), [-1], f"{name}/mean_square")
    rms = b.op("Sqrt", [b.op("Add", [ms, b.const(layer.eps, f"{name}/eps")], name)], name)
    return b.op("Mul", [b.op("Div", [x, rms], name), b.const(gamma, f"{name}/gamma")], name)
