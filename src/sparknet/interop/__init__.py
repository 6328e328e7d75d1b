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


def _load(module: str, package: str, what: str) -> Any:
    """sparknet's module ``module``, which imports ``package`` (``"torch"``, ``"keras"``); when
    that package is missing, an ``ImportError`` saying which extra installs it.  (A module
    already imported, such as under Sphinx's mocked imports, is returned as it is.)"""
    try:
        return importlib.import_module(module)
    except ImportError as exc:
        if exc.name != package and not (exc.name or "").startswith(package + "."):
            raise
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
    return _load("sparknet.interop._torch", "torch", "to_torch").to_torch(model)


def from_torch(module: nn.Module, input_shape: Any = None, dtype: Any = None) -> Sequential:
    """A sparknet model from a ``torch.nn.Sequential`` of standard modules, or from a module
    :func:`to_torch` made; see :func:`sparknet.interop._from_torch.from_torch`."""
    convert = _load("sparknet.interop._from_torch", "torch", "from_torch").from_torch
    return convert(module, input_shape, dtype)


def from_keras(model: Any, dtype: Any = None) -> Sequential:
    """A sparknet model from a built Keras 3 model; see
    :func:`sparknet.interop._keras.from_keras`."""
    # _keras imports keras inside its functions: ask for it first
    _load("keras", "keras", "from_keras")
    return _load("sparknet.interop._keras", "keras", "from_keras").from_keras(model, dtype)


def __getattr__(name: str) -> Any:
    if name == "RecurrentOutput":  # a torch.nn.Module: defined where torch is imported
        return _load("sparknet.interop._torch", "torch", f"sparknet.interop.{name}").RecurrentOutput
    raise AttributeError(f"module 'sparknet.interop' has no attribute {name!r}")
