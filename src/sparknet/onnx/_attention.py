"""Exporters of the attention layers and the blocks made of layers: MultiHeadAttention
(written out with ``MatMul`` and ``Softmax``, standard from opset 13 on), PositionalEmbedding,
TransformerEncoder, Residual and Parallel (their children's exporters, composed)."""

from __future__ import annotations

import math

import numpy as np

from sparknet.layers.attention import MultiHeadAttention, PositionalEmbedding, TransformerEncoder
from sparknet.layers.base import Layer
from sparknet.layers.parallel import Parallel
from sparknet.layers.residual import Residual
from sparknet.onnx._builder import Builder
from sparknet.onnx._registry import export_layer, register_exporter


@register_exporter(MultiHeadAttention)
def multi_head_attention(layer: MultiHeadAttention, b: Builder, x: str) -> str:
    """Scaled dot-product attention per head: ``softmax(Q K^T / sqrt(d) + masks) V``, the
    heads side by side through the output projection.  Padded keys (and, ``causal``,
    later tokens) get no attention; a query that sees no key, and every padded query,
    gets zeros, as in sparknet."""
    T, D, H = layer.steps, layer.width, layer.num_heads
    d = layer.head_dim
    p, name = layer.params, layer.name
    qkv = b.op("MatMul", [x, b.const(p["in_proj_weight"].T, f"{name}/in_proj_t")], name)
    if layer.use_bias:
        qkv = b.op("Add", [qkv, b.const(p["in_proj_bias"], f"{name}/in_proj_bias")], name)

    def heads(k: int, perm: list[int]) -> str:  # (N, T, D) block k -> (N, H, T, d) or (N, H, d, T)
        part = b.slice(qkv, 2, k * D, (k + 1) * D, f"{name}/qkv{k}")
        split = b.op("Reshape", [part, b.ints([0, T, H, d], f"{name}/heads")], name)
        return b.op("Transpose", [split], name, perm=perm)

    q, kt, v = heads(0, [0, 2, 1, 3]), heads(1, [0, 2, 3, 1]), heads(2, [0, 2, 1, 3])
    scores = b.op(
        "Mul",
        [b.op("MatMul", [q, kt], f"{name}/scores"), b.const(1.0 / math.sqrt(d), f"{name}/scale")],
        f"{name}/scores",
    )
    mask = b.read_mask()
    allowed: str | None = None
    if mask is not None:  # (N, 1, 1, T): the real keys
        allowed = b.unsqueeze(mask, [1, 2], f"{name}/keys")
    if layer.causal:
        causal = b.const(np.tril(np.ones((T, T), dtype=bool)), f"{name}/causal", np.bool_)
        allowed = causal if allowed is None else b.op("And", [allowed, causal], f"{name}/allowed")
    if allowed is not None:
        scores = b.op(
            "Where", [allowed, scores, b.const(-np.inf, f"{name}/none")], f"{name}/masked"
        )
    weights = b.op("Softmax", [scores], f"{name}/weights", axis=-1)
    if allowed is not None:  # no key seen: zeros, not NaN
        weights = b.op("Where", [allowed, weights, b.const(0.0, f"{name}/zero")], f"{name}/weights")
    a = b.op("Transpose", [b.op("MatMul", [weights, v], f"{name}/mix")], name, perm=[0, 2, 1, 3])
    a = b.op("Reshape", [a, b.ints([0, T, D], f"{name}/merged")], name)
    y = b.op("MatMul", [a, b.const(p["out_proj_weight"].T, f"{name}/out_proj_t")], name)
    if layer.use_bias:
        y = b.op("Add", [y, b.const(p["out_proj_bias"], f"{name}/out_proj_bias")], name)
    if mask is not None:
        y = b.op(
            "Where",
            [b.unsqueeze(mask, [2], f"{name}/queries"), y, b.const(0.0, f"{name}/zero")],
            f"{name}/padded",
        )
    return y


@register_exporter(PositionalEmbedding)
def positional_embedding(layer: PositionalEmbedding, b: Builder, x: str) -> str:
    """``Add`` of the first ``T`` learned positions."""
    return b.op(
        "Add",
        [x, b.const(layer.params["embeddings"][: layer.steps], f"{layer.name}/positions")],
        layer.name,
    )


@register_exporter(TransformerEncoder)
def transformer_encoder(layer: TransformerEncoder, b: Builder, x: str) -> str:
    """Its children's operators, with the two residual ``Add``s, post-norm or pre-norm."""
    c = layer.children

    def run(prefixes: tuple[str, ...], h: str) -> str:
        for prefix in prefixes:
            h = export_layer(c[prefix], b, h)
        return h

    attention, ffn = ("self_attn", "dropout1"), ("linear1", "dropout", "linear2", "dropout2")
    name = layer.name
    if layer.norm_first:
        h = b.op("Add", [x, run(attention, export_layer(c["norm1"], b, x))], f"{name}/residual1")
        return b.op("Add", [h, run(ffn, export_layer(c["norm2"], b, h))], f"{name}/residual2")
    h = export_layer(c["norm1"], b, b.op("Add", [x, run(attention, x)], f"{name}/residual1"))
    return export_layer(c["norm2"], b, b.op("Add", [h, run(ffn, h)], f"{name}/residual2"))


def _stacks(block: Residual | Parallel, b: Builder, x: str, stacks: list[list[Layer]]) -> list[str]:
    """The outputs of ``stacks`` run on ``x``, each back in ``x``'s layout; the block's
    input mask is what each stack starts from and what goes on after the block."""
    _, out_shape = block._shapes()
    rank = 1 + len(out_shape)
    first, mask, mask_is_input = b.channels_first, b.mask, b.mask_is_input
    outs = []
    for layers in stacks:
        b.channels_first, b.mask, b.mask_is_input = first, mask, mask_is_input
        h = x
        for child in layers:
            h = export_layer(child, b, h)
        if b.channels_first != first:
            h = (b.channels_first_of if first else b.channels_last_of)(
                h, rank, f"{block.name}/layout"
            )
        outs.append(h)
    b.channels_first, b.mask, b.mask_is_input = first, mask, mask_is_input
    return outs


@register_exporter(Residual, any_layout=True)
def residual(layer: Residual, b: Builder, x: str) -> str:
    """``Add`` of the input (or of its shortcut's output) and its layers' output, in the
    input's layout; the input's mask goes on."""
    short = layer.shortcut
    outs = _stacks(layer, b, x, [layer.layers] + ([] if short is None else [short]))
    return b.op("Add", [x if short is None else outs[1], outs[0]], layer.name)


@register_exporter(Parallel, any_layout=True)
def parallel(layer: Parallel, b: Builder, x: str) -> str:
    """The branches' outputs (in the input's layout) joined by ``Concat`` on the channel
    axis, or by a chain of ``Mul`` or ``Add``; the input's mask goes on."""
    outs = _stacks(layer, b, x, layer.branches)
    if layer.merge == "concat":
        rank = 1 + len(layer._shapes()[1])
        axis = 1 if b.channels_first and rank > 2 else -1
        return b.op("Concat", outs, layer.name, axis=axis)
    y = outs[0]
    for h in outs[1:]:
        y = b.op("Mul" if layer.merge == "multiply" else "Add", [y, h], layer.name)
    return y
