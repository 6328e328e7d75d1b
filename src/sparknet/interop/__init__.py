"""Weights in and out of PyTorch and Keras.

- :func:`to_torch`: a sparknet model as a ``torch.nn.Module`` computing the same function
  (in eval mode), made of the standard ``torch.nn`` module of each layer kind;
- :func:`from_torch`: a sparknet model from a ``torch.nn.Sequential`` of standard modules
  (or from what :func:`to_torch` made, after training in PyTorch);
- :func:`from_keras`: a sparknet model from a Keras 3 ``Sequential`` or functional model
  of the same kinds of layers.

PyTorch (``pip install "sparknet[torch]"``) and Keras (``pip install "sparknet[keras]"``,
with any backend) are imported only when these functions are called.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from torch import nn

    from sparknet.interop._torch import SparknetModule
    from sparknet.model import Sequential

__all__ = ["to_torch", "from_torch", "from_keras", "RecurrentOutput"]


def _needs(package: str, what: str) -> None:
    """Import ``package`` (``"torch"``, ``"keras"``), or say which extra installs it."""
    try:
        importlib.import_module(package)
    except ImportError as exc:
        raise ImportError(
            f"{what} needs {package}, which is not installed ({exc}): "
            f"pip install 'sparknet[{package}]'"
        ) from exc


def to_torch(model: Sequential) -> SparknetModule:
    """``model`` as a ``torch.nn.Module`` computing the same function, in eval mode and the
    model's float type: ``module(x, mask=None)`` takes what ``model.predict_output`` takes
    (as tensors, in sparknet's channels-last layout) and returns what it returns.  See
    :class:`sparknet.interop._torch.SparknetModule`.

    Raises:
        ValueError: a layer kind without a PyTorch equivalent (naming the layer), or a
            SimpleRNN whose activation ``torch.nn.RNN`` lacks (sigmoid, identity).
    """
    _needs("torch", "to_torch")
    from sparknet.interop._torch import to_torch as _to_torch

    return _to_torch(model)


def from_torch(module: nn.Module, input_shape: Any = None, dtype: Any = None) -> Sequential:
    """A sparknet model from a ``torch.nn.Sequential`` of standard modules, or from a module
    :func:`to_torch` made; see :func:`sparknet.interop._from_torch.from_torch`."""
    _needs("torch", "from_torch")
    from sparknet.interop._from_torch import from_torch as _from_torch

    return _from_torch(module, input_shape, dtype)


def from_keras(model: Any, dtype: Any = None) -> Sequential:
    """A sparknet model from a built Keras 3 model; see
    :func:`sparknet.interop._keras.from_keras`."""
    _needs("keras", "from_keras")
    from sparknet.interop._keras import from_keras as _from_keras

    return _from_keras(model, dtype)


def __getattr__(name: str) -> Any:
    if name == "RecurrentOutput":  # a torch.nn.Module: defined where torch is imported
        _needs("torch", "sparknet.interop.RecurrentOutput")
        from sparknet.interop._torch import RecurrentOutput

        return RecurrentOutput
    raise AttributeError(f"module 'sparknet.interop' has no attribute {name!r}")
