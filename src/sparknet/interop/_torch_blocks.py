"""Adapters of the attention layers, the blocks made of layers and ColumnEmbedding (see
:mod:`sparknet.interop._torch_adapters`)."""

from __future__ import annotations

from typing import Any, Callable, cast

import torch
from torch import nn

from sparknet.interop._torch_adapters import Adapter, copy_in, factory_kwargs, to_numpy
from sparknet.layers import (
    ColumnEmbedding,
    Layer,
    MultiHeadAttention,
    Parallel,
    PositionalEmbedding,
    Residual,
    TransformerEncoder,
)

#: builds the adapter of a layer (the table of :mod:`sparknet.interop._torch`)
MakeAdapter = Callable[[Layer], Adapter]


class AttentionAdapter(Adapter):
    """``nn.MultiheadAttention`` as self-attention, ``key_padding_mask`` from the step mask
    (and ``attn_mask`` when causal); padded queries output 0, as in sparknet."""

    def __init__(self, layer: MultiHeadAttention) -> None:
        super().__init__()
        D, H = layer.width, layer.num_heads
        self.attn = nn.MultiheadAttention(
            D, H, dropout=layer.dropout, bias=layer.use_bias, batch_first=True,
            **factory_kwargs(layer),
        )
        p = layer.params
        copy_in(self.attn.in_proj_weight, p["in_proj_weight"])
        copy_in(self.attn.out_proj.weight, p["out_proj_weight"])
        if layer.use_bias:
            copy_in(self.attn.in_proj_bias, p["in_proj_bias"])
            copy_in(self.attn.out_proj.bias, p["out_proj_bias"])
        self.causal = layer.causal

    def forward(self, x: torch.Tensor, mask: torch.Tensor | None) -> tuple[torch.Tensor, Any]:
        T = x.shape[1]
        causal = torch.triu(torch.ones(T, T, dtype=torch.bool), 1) if self.causal else None
        # a row without real tokens attends to all (no NaN): its outputs are zeroed below
        pad = None if mask is None else ~mask & mask.any(dim=1, keepdim=True)
        y, _ = self.attn(x, x, x, key_padding_mask=pad, attn_mask=causal, need_weights=False)
        if mask is not None:
            y = torch.where(mask.unsqueeze(-1), y, torch.zeros((), dtype=y.dtype))
        return y, mask

    def store(self, layer: Layer) -> None:
        p = layer.params
        p["in_proj_weight"][...] = to_numpy(self.attn.in_proj_weight)
        p["out_proj_weight"][...] = to_numpy(self.attn.out_proj.weight)
        if "in_proj_bias" in p:
            p["in_proj_bias"][...] = to_numpy(self.attn.in_proj_bias)
            p["out_proj_bias"][...] = to_numpy(self.attn.out_proj.bias)


class PositionalAdapter(Adapter):
    """The learned positions as an ``nn.Embedding`` whose first ``T`` rows are added."""

    def __init__(self, layer: PositionalEmbedding) -> None:
        super().__init__()
        self.positions = nn.Embedding(layer.max_length, layer.width, **factory_kwargs(layer))
        copy_in(self.positions.weight, layer.params["embeddings"])

    def forward(self, x: torch.Tensor, mask: torch.Tensor | None) -> tuple[torch.Tensor, Any]:
        return x + self.positions.weight[: x.shape[1]], mask

    def store(self, layer: Layer) -> None:
        layer.params["embeddings"][...] = to_numpy(self.positions.weight)


class TransformerAdapter(Adapter):
    """``torch.nn.TransformerEncoderLayer``'s computation from its own submodules
    (``self_attn``, ``linear1``, ``linear2``, ``norm1``, ``norm2``), with sparknet's
    attention adapter, so that padded positions are what sparknet computes."""

    def __init__(self, layer: TransformerEncoder, make: MakeAdapter) -> None:
        super().__init__()
        c = layer.children
        self.self_attn = make(c["self_attn"])
        self.linear1, self.linear2 = make(c["linear1"]), make(c["linear2"])
        self.norm1, self.norm2 = make(c["norm1"]), make(c["norm2"])
        self.dropout, self.dropout1, self.dropout2 = (nn.Dropout(layer.dropout) for _ in range(3))
        self.norm_first = layer.norm_first

    def _sa(self, x: torch.Tensor, mask: torch.Tensor | None) -> torch.Tensor:
        return self.dropout1(self.self_attn(x, mask)[0])

    def _ff(self, x: torch.Tensor) -> torch.Tensor:
        h = self.dropout(self.linear1(x, None)[0])
        return self.dropout2(self.linear2(h, None)[0])

    def forward(self, x: torch.Tensor, mask: torch.Tensor | None) -> tuple[torch.Tensor, Any]:
        if self.norm_first:
            x = x + self._sa(self.norm1(x, None)[0], mask)
            return x + self._ff(self.norm2(x, None)[0]), mask
        x = self.norm1(x + self._sa(x, mask), None)[0]
        return self.norm2(x + self._ff(x), None)[0], mask

    def store(self, layer: Layer) -> None:
        children = cast(TransformerEncoder, layer).children
        for prefix in ("self_attn", "linear1", "linear2", "norm1", "norm2"):
            cast(Adapter, getattr(self, prefix)).store(children[prefix])


class ResidualAdapter(Adapter):
    """``x + f(x)`` (or ``g(x) + f(x)`` with a shortcut) over the adapters of the block's
    layers; the input's mask goes on."""

    def __init__(self, layer: Residual, make: MakeAdapter) -> None:
        super().__init__()
        self.block = nn.ModuleList([make(child) for child in layer.layers])
        short = layer.shortcut
        self.shortcut = None if short is None else nn.ModuleList([make(c) for c in short])

    def forward(self, x: torch.Tensor, mask: torch.Tensor | None) -> tuple[torch.Tensor, Any]:
        def run(adapters: nn.ModuleList) -> torch.Tensor:
            h, m = x, mask
            for adapter in adapters:
                h, m = adapter(h, m)
            return h

        skip = x if self.shortcut is None else run(self.shortcut)
        return skip + run(self.block), mask

    def store(self, layer: Layer) -> None:
        block = cast(Residual, layer)
        for adapter, child in zip(self.shortcut or [], block.shortcut or []):
            cast(Adapter, adapter).store(child)
        for adapter, child in zip(self.block, block.layers):
            cast(Adapter, adapter).store(child)


class ParallelAdapter(Adapter):
    """The branches' adapters on one input, merged (``torch.cat`` on the last axis, a
    product or a sum); the input's mask goes on."""

    def __init__(self, layer: Parallel, make: MakeAdapter) -> None:
        super().__init__()
        self.branches = nn.ModuleList(
            [nn.ModuleList([make(c) for c in branch]) for branch in layer.branches]
        )
        self.merge = layer.merge

    def forward(self, x: torch.Tensor, mask: torch.Tensor | None) -> tuple[torch.Tensor, Any]:
        outs = []
        for branch in self.branches:
            h, m = x, mask
            for adapter in branch:
                h, m = adapter(h, m)
            outs.append(h)
        if self.merge == "concat":
            return torch.cat(outs, dim=-1), mask
        y = outs[0]
        for h in outs[1:]:
            y = y * h if self.merge == "multiply" else y + h
        return y, mask

    def store(self, layer: Layer) -> None:
        for adapters, branch in zip(self.branches, cast(Parallel, layer).branches):
            for adapter, child in zip(adapters, branch):
                cast(Adapter, adapter).store(child)


class ColumnEmbeddingAdapter(Adapter):
    """One ``nn.Embedding`` per categorical position, then the numeric positions."""

    def __init__(self, layer: ColumnEmbedding) -> None:
        super().__init__()
        self.columns = list(layer.columns)
        self.numeric = list(layer.numeric_columns)
        self.tables = nn.ModuleList()
        for k in range(len(self.columns)):
            table = layer.params[layer._table(k)]
            emb = nn.Embedding(table.shape[0], table.shape[1], **factory_kwargs(layer))
            copy_in(emb.weight, table)
            self.tables.append(emb)

    def forward(self, x: torch.Tensor, mask: torch.Tensor | None) -> tuple[torch.Tensor, Any]:
        parts = [emb(x[:, c].long()) for emb, c in zip(self.tables, self.columns)]
        return torch.cat(parts + [x[:, self.numeric]], dim=1), mask

    def store(self, layer: Layer) -> None:
        table = cast(ColumnEmbedding, layer)._table
        for k, emb in enumerate(self.tables):
            layer.params[table(k)][...] = to_numpy(cast(nn.Embedding, emb).weight)


def block_adapters(make: MakeAdapter) -> dict[type[Layer], Callable[[Any], Adapter]]:
    """The table entries of this module's layers (``make`` builds the children's adapters)."""
    return {
        MultiHeadAttention: AttentionAdapter,
        PositionalEmbedding: PositionalAdapter,
        TransformerEncoder: lambda layer: TransformerAdapter(layer, make),
        Residual: lambda layer: ResidualAdapter(layer, make),
        Parallel: lambda layer: ParallelAdapter(layer, make),
        ColumnEmbedding: ColumnEmbeddingAdapter,
    }
