"""``from_torch``: a PyTorch module as a sparknet model.

An ``nn.Sequential`` of standard modules is read module by module
(:mod:`sparknet.interop._from_torch_modules`); a module with its own ``forward()`` by
tracing it (:mod:`sparknet.interop._from_torch_graph`); a module :func:`to_torch` made is its
own sparknet model.

PyTorch is channels-first, sparknet channels-last: the sparknet model reads images as
``(N, H, W, C)`` and 1-D signals as ``(N, T, C)`` where the torch module read ``(N, C, H, W)``
and ``(N, C, T)``; kernels are transposed accordingly, and a ``Linear`` after a flatten of a
channels-first tensor gets its columns reordered, since the features it reads come in
``(H, W, C)`` order instead of ``(C, H, W)``.
"""

from __future__ import annotations

from typing import Any

from torch import nn

from sparknet.interop._from_torch_graph import from_graph, is_own_forward
from sparknet.interop._from_torch_modules import from_sequential
from sparknet.interop._torch import SparknetModule, from_sparknet_module
from sparknet.model import Sequential

__all__ = ["from_torch"]


def from_torch(module: nn.Module, input_shape: Any = None, dtype: Any = None) -> Sequential:
    """A sparknet model computing what ``module`` computes (in eval mode).

    Args:
        module: a ``torch.nn.Sequential`` of ``Linear``, ``Conv1d``, ``Conv2d``, ``MaxPool1d/2d``,
            ``AvgPool1d/2d``, ``AdaptiveAvgPool1d/2d`` and ``AdaptiveMaxPool1d/2d`` to 1,
            ``RNN``/``LSTM``/``GRU`` (``batch_first=True``, any ``num_layers``, bidirectional)
            each followed by :class:`~sparknet.interop.RecurrentOutput`, ``BatchNorm1d/2d``,
            ``LayerNorm``, ``Embedding``, ``TransformerEncoderLayer`` and ``TransformerEncoder``
            (``batch_first=True``), ``Dropout``, ``ReLU``, ``Tanh``, ``Sigmoid``, ``GELU``,
            ``SiLU``, ``LeakyReLU``, ``Softmax``, ``Flatten``, ``Identity``, ``ZeroPad1d/2d``
            (and ``ConstantPad`` with 0); or a module with its own ``forward()`` made of these,
            traced with ``torch.fx`` (skip connections ``x + f(x)`` and ``f(x) + g(x)``,
            ``F.relu``, ``F.pad``, ``torch.flatten``, ``F.max_pool2d``,
            ``x.view(x.size(0), -1)``, ``out, _ = lstm(x)`` and ``out[:, -1]``,
            ``attn(x, x, x)[0]`` of an ``nn.MultiheadAttention``, ``x.transpose(1, 2)``,
            ``x.mean(1)``: see :mod:`sparknet.interop._from_torch_graph`); or a module made by
            :func:`to_torch` (then ``input_shape`` is not needed: the model is its own
            architecture with the module's current weights).
        input_shape: the per-sample shape ``module`` reads, in PyTorch's layout (default:
            ``(in_features,)`` of a first ``nn.Linear``; needed for any other start): ``(C, H, W)``
            for images, ``(C, T)`` for 1-D convolutions, ``(T, F)`` for recurrent layers,
            ``(T,)`` for token ids, ``(F,)`` for vectors.  The sparknet model reads
            channels-last: ``(H, W, C)`` and ``(T, C)`` (transpose the data with
            ``x.transpose(0, 2, 3, 1)`` / ``x.transpose(0, 2, 1)``).
        dtype: the model's float type (default: the module's, float32 or float64).

    Raises:
        TypeError: ``module`` is not a module (the message says what to pass instead of a
            state_dict or a path), or is one standard module.
        ValueError: the first module sparknet has no equivalent for (named with its index, or
            its name in ``forward()``, and its settings), a missing ``input_shape`` (naming the
            shape the first module reads), or an arrangement it cannot express.
    """
    if isinstance(module, SparknetModule):
        return from_sparknet_module(module)
    if is_own_forward(module):
        return from_graph(module, input_shape, dtype)
    return from_sequential(module, input_shape, dtype)
