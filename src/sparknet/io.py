"""Safe model files: ``.npz`` holding the flat weights and the JSON architecture.

Layout of a file (format ``sparknet-model``, version 1), all plain arrays:

- ``format``: the string ``"sparknet-model"``; ``version``: an int;
- ``architecture``: the model's :meth:`~sparknet.model.Sequential.get_config` as JSON text;
- ``params``: the flat parameter vector;
- ``state``, when the layers keep any: the flat vector of values they keep but do not train
  (BatchNormalization's running statistics), checked like ``params``;
- optionally ``optimizer``: JSON ``{"name", "config", "t"}`` and ``opt_<key>``: its state arrays;
- optionally ``extra``: JSON of caller metadata (checkpoints keep epoch/round here).

Files are written to a temporary file in the same folder, then renamed over the
target, so a crash never leaves a half-written model.  They are read member by member
without pickle (nothing in them can run code), and nothing is trusted before it is
checked: each ``.npy`` header's shape and dtype must match the bytes the member holds,
the parameter count the architecture declares must match the stored ``params`` before
the model is built (a small file cannot make the reader allocate a huge network), the
zip checksums must hold, and the weights and optimizer state must be finite.  A file
that fails raises :class:`~sparknet.errors.CheckpointError` naming the file and member.
"""
from __future__ import annotations

from typing import Any, Literal, overload

from sparknet import _model_file
from sparknet._model_file import (
    FORMAT,
    MAX_META_BYTES,
    VERSION,
    atomic_write,
    read_model_file,
    write_model,
)
from sparknet.model import Sequential
from sparknet.optim import Optimizer

__all__ = ["PathLike", "FORMAT", "VERSION", "MAX_META_BYTES", "atomic_write", "save_model",
           "load_model"]

#: a file path: a string or an ``os.PathLike``
PathLike = _model_file.PathLike


def save_model(model: Sequential, path: PathLike, optimizer: Optimizer | None = None,
               extra: dict[str, Any] | None = None) -> None:
    """Write ``model`` (built) and optionally ``optimizer`` state to ``path`` atomically.

    Raises ``ValueError`` (and leaves any existing file untouched) for a model that is not
    built or whose parameters are not finite, a folder or a missing folder as ``path``, a
    name of another tool's format (``.onnx``, ``.pt``, ``.keras``, ``.h5``...: the message
    names what writes it), or an ``extra`` that is not JSON."""
    write_model(model, path, optimizer, extra)


@overload
def load_model(path: PathLike, with_optimizer: Literal[False] = ...,
               with_extra: Literal[False] = ...) -> Sequential: ...
@overload
def load_model(path: PathLike, with_optimizer: bool = ..., with_extra: bool = ...
               ) -> Sequential | tuple[Any, ...]: ...


def load_model(path: PathLike, with_optimizer: bool = False, with_extra: bool = False
               ) -> Sequential | tuple[Any, ...]:
    """Load a model saved by :func:`save_model`.

    Returns the model, or a tuple ``(model, optimizer_or_None[, extra_dict])`` when
    ``with_optimizer`` / ``with_extra`` ask for them.

    Raises:
        FileNotFoundError: no file at ``path``.
        CheckpointError: a file that is not a model file, is truncated, damaged or tampered
            with, declares more (or less) than it holds, or holds non-finite weights or
            optimizer state; the message names the file and the member.
    """
    return read_model_file(path, Sequential.from_config, with_optimizer, with_extra)
