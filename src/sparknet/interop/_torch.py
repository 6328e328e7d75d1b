"""A sparknet model as a ``torch.nn.Module`` (:func:`to_torch`), and back (:func:`from_torch`
of what :func:`to_torch` made); :class:`RecurrentOutput`, the module that lets a recurrent
module sit inside an ``nn.Sequential``.

The module is a chain of *adapters* (:mod:`sparknet.interop._torch_adapters`,
:mod:`sparknet.interop._torch_blocks`), one per sparknet layer, each holding the standard
``torch.nn`` module of its kind.  It keeps the model's architecture, so after training
in PyTorch :func:`from_torch` reads the weights back into a sparknet model.
"""

from __future__ import annotations

from typing import Any, Callable, cast

import numpy as np
import torch
from torch import nn

from sparknet.interop._torch_adapters import (
    Adapter,
    BatchNormAdapter,
    ConvAdapter,
    DenseAdapter,
    EmbeddingAdapter,
    FlattenAdapter,
    GlobalPoolAdapter,
    LayerNormAdapter,
    ModuleAdapter,
    PoolAdapter,
    RecurrentAdapter,
    RMSNormAdapter,
    SequenceMaskAdapter,
    ZeroPaddingAdapter,
    activation,
)
from sparknet.interop._torch_blocks import block_adapters
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
    SequenceMask,
    SimpleRNN,
    ZeroPadding1D,
    ZeroPadding2D,
)
from sparknet.model import Sequential


class RecurrentOutput(nn.Module):
    """What an ``nn.RNN`` / ``nn.LSTM`` / ``nn.GRU`` hands to the next module of an
    ``nn.Sequential``: its ``output`` (every step, ``return_sequences=True``) or its last
    layer's final state, both directions side by side (forward first) when bidirectional,
    ``(N, D * H)`` (``return_sequences=False``).  :func:`from_torch` reads it as the
    recurrent layer's ``return_sequences``."""

    def __init__(self, return_sequences: bool = False) -> None:
        super().__init__()
        self.return_sequences = bool(return_sequences)

    def forward(self, out: tuple[torch.Tensor, Any]) -> torch.Tensor:
        output, h = out
        if self.return_sequences:
            return output
        h = h[0] if isinstance(h, tuple) else h  # an LSTM's (h, c)
        D = output.shape[-1] // h.shape[-1]
        return h[-D:].transpose(0, 1).reshape(h.shape[1], -1)

    def extra_repr(self) -> str:
        return f"return_sequences={self.return_sequences}"


def make_adapter(layer: Layer) -> Adapter:
    """The adapter running ``layer`` in PyTorch.

    Raises:
        ValueError: a layer kind without one (naming the layer and its class).
    """
    make = ADAPTERS.get(type(layer))
    if make is None:
        known = ", ".join(sorted(c.__name__ for c in ADAPTERS))
        raise ValueError(
            f"layer {layer.name!r} ({type(layer).__name__}) has no PyTorch equivalent in "
            f"sparknet.interop (layers with one: {known})"
        )
    return make(layer)


#: layer class -> the adapter that runs it in PyTorch
ADAPTERS: dict[type[Layer], Callable[[Any], Adapter]] = {
    Dense: DenseAdapter,
    Activation: lambda layer: ModuleAdapter(activation(layer.activation)),
    LeakyReLU: lambda layer: ModuleAdapter(nn.LeakyReLU(layer.negative_slope)),
    Dropout: lambda layer: ModuleAdapter(nn.Dropout(layer.rate)),
    Flatten: lambda layer: FlattenAdapter(),
    Conv2D: ConvAdapter,
    Conv1D: ConvAdapter,
    MaxPool2D: PoolAdapter,
    MaxPool1D: PoolAdapter,
    AvgPool2D: PoolAdapter,
    AvgPool1D: PoolAdapter,
    GlobalAveragePooling1D: GlobalPoolAdapter,
    GlobalMaxPooling1D: GlobalPoolAdapter,
    GlobalAveragePooling2D: GlobalPoolAdapter,
    GlobalMaxPooling2D: GlobalPoolAdapter,
    SimpleRNN: RecurrentAdapter,
    LSTM: RecurrentAdapter,
    GRU: RecurrentAdapter,
    Bidirectional: RecurrentAdapter,
    Embedding: EmbeddingAdapter,
    SequenceMask: lambda layer: SequenceMaskAdapter(),
    BatchNormalization: BatchNormAdapter,
    LayerNormalization: LayerNormAdapter,
    RMSNormalization: RMSNormAdapter,
    ZeroPadding1D: ZeroPaddingAdapter,
    ZeroPadding2D: ZeroPaddingAdapter,
    **block_adapters(make_adapter),
}


class SparknetModule(nn.Module):
    """A sparknet :class:`~sparknet.model.Sequential` as a ``torch.nn.Module`` (made by
    :func:`to_torch`).

    ``forward(x, mask=None)`` takes what ``Sequential.predict_output`` takes, as tensors:
    ``x`` in sparknet's layout (channels-last images ``(N, H, W, C)``, sequences
    ``(N, T, F)``, token ids ``(N, T)``), ``mask`` an optional ``(N, T)`` tensor (nonzero at
    real steps); it returns what ``predict_output`` returns (probabilities when the model
    ends in softmax).  ``layers`` holds one adapter per sparknet layer, each holding the
    standard ``torch.nn`` module of its kind; :attr:`config` is the sparknet architecture
    :func:`from_torch` rebuilds.
    """

    def __init__(self, model: Sequential) -> None:
        super().__init__()
        self.config = model.get_config()
        self.layers = nn.ModuleList([make_adapter(layer) for layer in model.layers])

    def forward(self, x: torch.Tensor, mask: torch.Tensor | None = None) -> torch.Tensor:
        m = None if mask is None else (mask != 0)
        for adapter in self.layers:
            x, m = adapter(x, m)
        return x


def to_torch(model: Sequential) -> SparknetModule:
    """``model`` as a ``torch.nn.Module`` computing the same function, in eval mode, in the
    model's float type (see :class:`SparknetModule`)."""
    if not isinstance(model, Sequential):
        raise TypeError(f"to_torch takes a sparknet Sequential, got {type(model).__name__}")
    if not model.built:
        raise ValueError("the model is not built yet: call fit() or build(input_shape) first")
    module = SparknetModule(model)
    module.to(torch.float64 if model.dtype == np.float64 else torch.float32)
    return module.eval()


def from_sparknet_module(module: SparknetModule) -> Sequential:
    """The sparknet model of a :class:`SparknetModule`, with its current weights."""
    model = Sequential.from_config(module.config)
    for layer, adapter in zip(model.layers, module.layers):
        cast(Adapter, adapter).store(layer)
    return model
