"""The adapters of :func:`sparknet.interop.to_torch`.

Each sparknet layer becomes an *adapter*: a small ``torch.nn.Module`` holding the standard
PyTorch module of that layer kind (``nn.Linear``, ``nn.Conv2d``, ``nn.LSTM``,
``nn.BatchNorm1d``, ...) with sparknet's weights, and doing what sparknet does around it:
channels-last tensors (a convolution permutes to channels-first and back), ``"same"``
padding (which may be one more at the end than at the start), step masks (a recurrent
layer packs each sequence's real steps, wherever the padding is, and puts the outputs
back in place).  :meth:`Adapter.store` writes the weights back into a sparknet layer.
"""

from __future__ import annotations

from typing import Any, Callable, Sequence

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn

from sparknet.layers import (
    GRU,
    LSTM,
    AvgPool1D,
    AvgPool2D,
    BatchNormalization,
    Bidirectional,
    Conv1D,
    Conv2D,
    Dense,
    Embedding,
    GlobalAveragePooling1D,
    GlobalMaxPooling1D,
    GlobalMaxPooling2D,
    Layer,
    LayerNormalization,
    MaxPool1D,
    MaxPool2D,
    RMSNormalization,
    SimpleRNN,
    ZeroPadding1D,
    ZeroPadding2D,
)
from sparknet.layers.conv import Padding, axis_paddings, out_and_pad, trailing_pad


def activation(name: str, dim: int = -1) -> nn.Module:
    """The ``torch.nn`` module of a sparknet activation name."""
    table: dict[str, Callable[[], nn.Module]] = {
        "identity": nn.Identity,
        "relu": nn.ReLU,
        "tanh": nn.Tanh,
        "sigmoid": nn.Sigmoid,
        "softmax": lambda: nn.Softmax(dim=dim),
        "gelu": nn.GELU,
        "gelu_tanh": lambda: nn.GELU(approximate="tanh"),
        "silu": nn.SiLU,
    }
    return table[name]()


def factory_kwargs(layer: Layer) -> dict[str, Any]:
    """The factory arguments of a torch module in ``layer``'s float type."""
    return {"dtype": torch.float64 if layer.dtype == np.float64 else torch.float32}


def _tensor(a: np.ndarray) -> torch.Tensor:
    return torch.from_numpy(np.array(a, copy=True))


def copy_in(param: Any, value: np.ndarray) -> None:
    """Copy ``value`` into the torch parameter or buffer ``param``, in its dtype."""
    with torch.no_grad():
        param.copy_(_tensor(np.asarray(value)).to(param.dtype))


def to_numpy(t: Any) -> np.ndarray:
    """The values of tensor ``t`` as a numpy array."""
    return t.detach().cpu().numpy()


class Adapter(nn.Module):
    """One sparknet layer in PyTorch: ``forward(x, mask) -> (y, mask)`` in sparknet's
    layout; :meth:`store` writes the torch module's weights into the sparknet layer."""

    def forward(self, x: torch.Tensor, mask: torch.Tensor | None) -> tuple[torch.Tensor, Any]:
        raise NotImplementedError

    def store(self, layer: Layer) -> None:
        """Copy this adapter's weights (and state) into ``layer``, built alike."""


class DenseAdapter(Adapter):
    """``nn.Linear`` on the last axis, then the activation."""

    def __init__(self, layer: Dense) -> None:
        super().__init__()
        self.linear = nn.Linear(layer.in_features, layer.units, bias=layer.use_bias,
                                **factory_kwargs(layer))
        copy_in(self.linear.weight, layer.params["kernel"])
        if layer.use_bias:
            copy_in(self.linear.bias, layer.params["bias"])
        self.act = activation(layer.activation)

    def forward(self, x: torch.Tensor, mask: torch.Tensor | None) -> tuple[torch.Tensor, Any]:
        return self.act(self.linear(x)), mask

    def store(self, layer: Layer) -> None:
        layer.params["kernel"][...] = to_numpy(self.linear.weight)
        if self.linear.bias is not None:
            layer.params["bias"][...] = to_numpy(self.linear.bias)


class ModuleAdapter(Adapter):
    """A module without weights that keeps the mask (activations, dropout)."""

    def __init__(self, module: nn.Module) -> None:
        super().__init__()
        self.module = module

    def forward(self, x: torch.Tensor, mask: torch.Tensor | None) -> tuple[torch.Tensor, Any]:
        return self.module(x), mask


class FlattenAdapter(Adapter):
    """``nn.Flatten`` of the channels-last tensor; ends the mask."""

    def __init__(self) -> None:
        super().__init__()
        self.flatten = nn.Flatten()

    def forward(self, x: torch.Tensor, mask: torch.Tensor | None) -> tuple[torch.Tensor, Any]:
        return self.flatten(x), None


class ZeroPaddingAdapter(Adapter):
    """``F.pad`` with zeros around the spatial axes of the channels-last tensor."""

    def __init__(self, layer: ZeroPadding1D | ZeroPadding2D) -> None:
        super().__init__()
        self.pads = [0, 0] + [p for side in reversed(layer.padding) for p in side]

    def forward(self, x: torch.Tensor, mask: torch.Tensor | None) -> tuple[torch.Tensor, Any]:
        return F.pad(x, self.pads), None


def same_pads(
    sizes: Sequence[int], extents: Sequence[int], strides: Sequence[int], padding: Padding
) -> list[int]:
    """``F.pad``'s list (last axis first, ``(before, after)`` each) for sparknet's padding."""
    pads: list[int] = []
    axes = list(zip(sizes, extents, strides, axis_paddings(padding, len(sizes))))
    for size, extent, stride, pad in reversed(axes):
        pads += [out_and_pad(size, extent, stride, pad)[1], trailing_pad(size, extent, stride, pad)]
    return pads


def _as_tuple(v: Any) -> tuple[int, ...]:
    return tuple(v) if isinstance(v, (tuple, list)) else (int(v),)


def _to_channels_first(x: torch.Tensor) -> torch.Tensor:
    return x.movedim(-1, 1)


def _to_channels_last(x: torch.Tensor) -> torch.Tensor:
    return x.movedim(1, -1)


class ConvAdapter(Adapter):
    """``nn.Conv1d`` / ``nn.Conv2d`` on the channels-first view, after ``F.pad`` for
    ``"same"`` padding; the activation over the channels."""

    def __init__(self, layer: Conv1D | Conv2D) -> None:
        super().__init__()
        in_shape, _ = layer._shapes()
        ks, st, dl = (  # torch's stubs want tuples of a fixed length
            _as_tuple(layer.kernel_size),
            _as_tuple(layer.strides),
            _as_tuple(layer.dilation),
        )
        kind: Any = nn.Conv1d if len(ks) == 1 else nn.Conv2d
        self.conv = kind(
            layer.in_channels,
            layer.filters,
            ks,
            stride=st,
            dilation=dl,
            bias=layer.use_bias,
            **factory_kwargs(layer),
        )
        kernel = layer.params["kernel"]
        copy_in(self.conv.weight, np.moveaxis(kernel, (-1, -2), (0, 1)))
        if layer.use_bias:
            copy_in(self.conv.bias, layer.params["bias"])
        self.pads = same_pads(
            in_shape[:-1], [d * (k - 1) + 1 for k, d in zip(ks, dl)], st, layer.padding
        )
        self.act = activation(layer.activation, dim=1)

    def forward(self, x: torch.Tensor, mask: torch.Tensor | None) -> tuple[torch.Tensor, Any]:
        x = _to_channels_first(x)
        if any(self.pads):
            x = F.pad(x, self.pads)
        return _to_channels_last(self.act(self.conv(x))), None

    def store(self, layer: Layer) -> None:
        layer.params["kernel"][...] = np.moveaxis(to_numpy(self.conv.weight), (0, 1), (-1, -2))
        if self.conv.bias is not None:
            layer.params["bias"][...] = to_numpy(self.conv.bias)


class PoolAdapter(Adapter):
    """``nn.MaxPool1d/2d`` (after padding with -inf) or ``nn.AvgPool1d/2d`` (the mean of
    the taps inside the input: padded sums over padded counts)."""

    def __init__(self, layer: MaxPool1D | MaxPool2D | AvgPool1D | AvgPool2D) -> None:
        super().__init__()
        in_shape, _ = layer._shapes()
        ps, st = _as_tuple(layer.pool_size), _as_tuple(layer.strides)
        self.is_max = isinstance(layer, (MaxPool1D, MaxPool2D))
        kind: Any = (
            {1: nn.MaxPool1d, 2: nn.MaxPool2d}
            if self.is_max
            else {1: nn.AvgPool1d, 2: nn.AvgPool2d}
        )[len(ps)]
        self.pool = kind(ps, stride=st)
        self.pads = same_pads(in_shape[:-1], ps, st, layer.padding)

    def forward(self, x: torch.Tensor, mask: torch.Tensor | None) -> tuple[torch.Tensor, Any]:
        x = _to_channels_first(x)
        if not any(self.pads):
            return _to_channels_last(self.pool(x)), None
        if self.is_max:
            return _to_channels_last(self.pool(F.pad(x, self.pads, value=-float("inf")))), None
        ones = torch.ones((1, 1) + tuple(x.shape[2:]), dtype=x.dtype)
        y = self.pool(F.pad(x, self.pads)) / self.pool(F.pad(ones, self.pads))
        return _to_channels_last(y), None


class GlobalPoolAdapter(Adapter):
    """The mean or maximum over the steps (pixels), over each sequence's real steps with a
    mask (0 for a sequence with none); ends the mask."""

    def __init__(self, layer: Layer) -> None:
        super().__init__()
        self.is_max = isinstance(layer, (GlobalMaxPooling1D, GlobalMaxPooling2D))
        self.masked = isinstance(layer, (GlobalAveragePooling1D, GlobalMaxPooling1D))

    def forward(self, x: torch.Tensor, mask: torch.Tensor | None) -> tuple[torch.Tensor, Any]:
        x = x.reshape(x.shape[0], -1, x.shape[-1])
        if mask is None or not self.masked:
            return (x.amax(dim=1) if self.is_max else x.mean(dim=1)), None
        m = mask.unsqueeze(-1)
        count = mask.sum(dim=1, keepdim=True)
        if self.is_max:
            top = torch.where(m, x, torch.tensor(-float("inf"), dtype=x.dtype)).amax(dim=1)
            return torch.where(count > 0, top, torch.zeros((), dtype=x.dtype)), None
        total = torch.where(m, x, torch.zeros((), dtype=x.dtype)).sum(dim=1)
        return total / count.clamp(min=1).to(x.dtype), None


def compact_steps(mask: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """``(order, lengths)``: per row, the real steps' indices in time order, then the padded
    ones (``(N, T)``); and the number of real steps (``(N,)``)."""
    T = mask.shape[1]
    steps = torch.arange(T, dtype=torch.float64)
    key = mask.to(torch.float64) * (2 * T) - steps  # real steps first, in order
    return torch.argsort(key, dim=1, descending=True), mask.sum(dim=1)


class RecurrentAdapter(Adapter):
    """``nn.RNN`` / ``nn.LSTM`` / ``nn.GRU`` (``batch_first=True``; bidirectional for
    :class:`~sparknet.layers.Bidirectional`).  With a mask, each row's real steps are
    packed (``pack_padded_sequence``) and the outputs put back at their steps."""

    def __init__(self, layer: SimpleRNN | LSTM | GRU | Bidirectional) -> None:
        super().__init__()
        cells = (
            [layer.forward_layer, layer.backward_layer]
            if isinstance(layer, Bidirectional)
            else [layer]
        )
        cell = cells[0]
        self.bidirectional = len(cells) == 2
        self.merge_sum = self.bidirectional and getattr(layer, "merge_mode", "") == "sum"
        self.return_sequences = cell.return_sequences
        self.return_state = bool(getattr(cell, "return_state", False))
        self.H = cell.units
        kw = dict(batch_first=True, bidirectional=self.bidirectional, **factory_kwargs(layer))
        if isinstance(cell, SimpleRNN):
            if cell.activation not in ("tanh", "relu"):
                raise ValueError(
                    f"SimpleRNN {cell.name!r}: torch.nn.RNN has no {cell.activation!r} "
                    f"nonlinearity (tanh or relu)"
                )
            self.rnn: nn.RNNBase = nn.RNN(
                cell.in_features, cell.units, nonlinearity=cell.activation, **kw
            )
        else:
            self.rnn = (nn.LSTM if isinstance(cell, LSTM) else nn.GRU)(
                cell.in_features, cell.units, **kw
            )
        for c, suffix in zip(cells, ("", "_reverse")):
            for name in ("weight_ih", "weight_hh", "bias_ih", "bias_hh"):
                copy_in(getattr(self.rnn, f"{name}_l0{suffix}"), c.params[name])

    def _states(self, x: torch.Tensor, lengths: torch.Tensor | None) -> tuple[Any, Any]:
        if lengths is None:
            return self.rnn(x)
        packed = nn.utils.rnn.pack_padded_sequence(
            x, lengths.clamp(min=1).cpu(), batch_first=True, enforce_sorted=False
        )
        out, states = self.rnn(packed)
        y, _ = nn.utils.rnn.pad_packed_sequence(out, batch_first=True, total_length=x.shape[1])
        return y, states

    def forward(self, x: torch.Tensor, mask: torch.Tensor | None) -> tuple[torch.Tensor, Any]:
        order = lengths = None
        if mask is not None and not bool(mask.all()):
            order, lengths = compact_steps(mask)
            x = torch.gather(x, 1, order.unsqueeze(-1).expand(-1, -1, x.shape[-1]))
        y, states = self._states(x, lengths)
        if self.return_sequences:
            if order is not None and mask is not None:
                back = (mask.long().cumsum(dim=1) - 1).clamp(min=0)
                y = torch.gather(y, 1, back.unsqueeze(-1).expand(-1, -1, y.shape[-1]))
                y = torch.where(mask.unsqueeze(-1), y, torch.zeros((), dtype=y.dtype))
            if self.merge_sum:
                y = y[..., : self.H] + y[..., self.H :]
            return y, mask
        hs = states if isinstance(states, tuple) else (states,)
        flat = [h.transpose(0, 1) for h in hs]  # (N, D, H)
        if lengths is not None:
            flat = [
                torch.where((lengths > 0).view(-1, 1, 1), h, torch.zeros((), dtype=h.dtype))
                for h in flat
            ]
        if self.merge_sum:
            return flat[0].sum(dim=1), None
        if self.return_state:
            return torch.cat([h.reshape(h.shape[0], -1) for h in flat], dim=1), None
        return flat[0].reshape(flat[0].shape[0], -1), None

    def store(self, layer: Layer) -> None:
        cells = (
            [layer.forward_layer, layer.backward_layer]
            if isinstance(layer, Bidirectional)
            else [layer]
        )
        for c, suffix in zip(cells, ("", "_reverse")):
            for name in ("weight_ih", "weight_hh", "bias_ih", "bias_hh"):
                c.params[name][...] = to_numpy(getattr(self.rnn, f"{name}_l0{suffix}"))


class EmbeddingAdapter(Adapter):
    """``nn.Embedding``; ``mask_zero``: the mask ``ids != 0``."""

    def __init__(self, layer: Embedding) -> None:
        super().__init__()
        self.embedding = nn.Embedding(layer.vocab, layer.dim, **factory_kwargs(layer))
        copy_in(self.embedding.weight, layer.params["embeddings"])
        self.mask_zero = layer.mask_zero

    def forward(self, x: torch.Tensor, mask: torch.Tensor | None) -> tuple[torch.Tensor, Any]:
        ids = x.long()
        if self.mask_zero:
            m = (ids != 0).reshape(ids.shape[0], ids.shape[1], -1).all(dim=2)
            mask = m if mask is None else mask & m
        return self.embedding(ids), mask

    def store(self, layer: Layer) -> None:
        layer.params["embeddings"][...] = to_numpy(self.embedding.weight)


class SequenceMaskAdapter(Adapter):
    """The features, and the mask ``last value > 0.5``."""

    def forward(self, x: torch.Tensor, mask: torch.Tensor | None) -> tuple[torch.Tensor, Any]:
        m = x[..., -1] > 0.5
        return x[..., :-1], (m if mask is None else mask & m)


class BatchNormAdapter(Adapter):
    """``nn.BatchNorm1d`` over the last axis (every other axis is the batch)."""

    def __init__(self, layer: BatchNormalization) -> None:
        super().__init__()
        self.bn = nn.BatchNorm1d(
            layer.features,
            eps=layer.eps,
            momentum=layer.momentum,
            affine=layer.center or layer.scale,
            **factory_kwargs(layer),
        )
        if self.bn.affine:
            copy_in(self.bn.weight, layer.params.get("gamma", np.ones(layer.features)))
            copy_in(self.bn.bias, layer.params.get("beta", np.zeros(layer.features)))
            self.bn.weight.requires_grad_(layer.scale)
            self.bn.bias.requires_grad_(layer.center)
        copy_in(self.bn.running_mean, layer.state["running_mean"])
        copy_in(self.bn.running_var, layer.state["running_var"])

    def forward(self, x: torch.Tensor, mask: torch.Tensor | None) -> tuple[torch.Tensor, Any]:
        return self.bn(x.reshape(-1, x.shape[-1])).reshape(x.shape), mask

    def store(self, layer: Layer) -> None:
        if "gamma" in layer.params:
            layer.params["gamma"][...] = to_numpy(self.bn.weight)
        if "beta" in layer.params:
            layer.params["beta"][...] = to_numpy(self.bn.bias)
        layer.state["running_mean"][...] = to_numpy(self.bn.running_mean)
        layer.state["running_var"][...] = to_numpy(self.bn.running_var)


class LayerNormAdapter(Adapter):
    """``nn.LayerNorm`` over the last axis."""

    def __init__(self, layer: LayerNormalization) -> None:
        super().__init__()
        self.ln = nn.LayerNorm(
            layer.features,
            eps=layer.eps,
            elementwise_affine=layer.center or layer.scale,
            bias=layer.center,
            **factory_kwargs(layer),
        )
        if self.ln.weight is not None:
            copy_in(self.ln.weight, layer.params.get("gamma", np.ones(layer.features)))
            self.ln.weight.requires_grad_(layer.scale)
        if self.ln.bias is not None:
            copy_in(self.ln.bias, layer.params["beta"])

    def forward(self, x: torch.Tensor, mask: torch.Tensor | None) -> tuple[torch.Tensor, Any]:
        return self.ln(x), mask

    def store(self, layer: Layer) -> None:
        if "gamma" in layer.params:
            layer.params["gamma"][...] = to_numpy(self.ln.weight)
        if "beta" in layer.params:
            layer.params["beta"][...] = to_numpy(self.ln.bias)


class RMSNormAdapter(Adapter):
    """``nn.RMSNorm`` over the last axis."""

    def __init__(self, layer: RMSNormalization) -> None:
        super().__init__()
        self.norm = nn.RMSNorm(
            layer.features, eps=layer.eps, elementwise_affine=layer.scale, **factory_kwargs(layer)
        )
        if layer.scale:
            copy_in(self.norm.weight, layer.params["gamma"])

    def forward(self, x: torch.Tensor, mask: torch.Tensor | None) -> tuple[torch.Tensor, Any]:
        return self.norm(x), mask

    def store(self, layer: Layer) -> None:
        if "gamma" in layer.params:
            layer.params["gamma"][...] = to_numpy(self.norm.weight)
