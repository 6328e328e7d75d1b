"""Safe model files: ``.npz`` holding the flat weights and the JSON architecture.

Layout of a file (format ``sparknet-model``, version 1), all plain arrays:

- ``format``: the string ``"sparknet-model"``; ``version``: an int;
- ``architecture``: the model's :meth:`~sparknet.model.Sequential.get_config` as JSON text;
- ``params``: the flat parameter vector;
- optionally ``optimizer``: JSON ``{"name", "config", "t"}`` and ``opt_<key>``: its state arrays;
- optionally ``extra``: JSON of caller metadata (checkpoints keep epoch/round here).

Files are read with ``allow_pickle=False`` (nothing in them can run code) and
written to a temporary file in the same folder, then renamed over the target,
so a crash never leaves a half-written model.
"""
from __future__ import annotations

import contextlib
import json
import os
import tempfile
import zipfile
from typing import IO, TYPE_CHECKING, Any, Iterator, Literal, Union, overload

import numpy as np

if TYPE_CHECKING:
    from sparknet.model import Sequential
    from sparknet.optim import Optimizer

#: a file path: a string or an ``os.PathLike``
PathLike = Union[str, "os.PathLike[str]"]

FORMAT = "sparknet-model"
VERSION = 1


@contextlib.contextmanager
def atomic_write(path: str, mode: str = "wb") -> Iterator[IO]:
    """Open a temporary file beside ``path`` for writing; on success it is flushed, synced
    and renamed over ``path``; on any error it is deleted and ``path`` is left as it was."""
    folder = os.path.dirname(os.path.abspath(path)) or "."
    if not os.path.isdir(folder):
        raise ValueError(f"cannot save to {path!r}: folder {folder!r} does not exist")
    fd, tmp = tempfile.mkstemp(prefix=".sparknet-", suffix=".tmp", dir=folder)
    try:
        with os.fdopen(fd, mode) as fh:
            yield fh
            fh.flush()
            os.fsync(fh.fileno())
        os.replace(tmp, path)
    except BaseException:
        try:
            os.unlink(tmp)
        except OSError:
            pass
        raise


def _atomic_savez(path: str, arrays: dict[str, np.ndarray]) -> None:
    # typed loosely: numpy's stubs would read a key named "allow_pickle" as that flag
    entries: dict[str, Any] = arrays
    with atomic_write(path) as fh:
        np.savez(fh, **entries)


def save_model(model: Sequential, path: PathLike, optimizer: Optimizer | None = None,
               extra: dict[str, Any] | None = None) -> None:
    """Write ``model`` (built) and optionally ``optimizer`` state to ``path`` atomically."""
    if not model.built:
        raise ValueError("cannot save a model that is not built (fit it or call build first)")
    path = os.fspath(path)
    arrays: dict[str, np.ndarray] = {
        "format": np.array(FORMAT),
        "version": np.array(VERSION, dtype=np.int64),
        "architecture": np.array(json.dumps(model.get_config())),
        "params": np.ascontiguousarray(model.params),
    }
    if optimizer is not None:
        arrays["optimizer"] = np.array(json.dumps(
            {"name": optimizer.name, "config": optimizer.get_config(), "t": int(optimizer.t)}))
        arrays.update(optimizer.state_arrays("opt_"))
    if extra is not None:
        arrays["extra"] = np.array(json.dumps(extra))
    _atomic_savez(path, arrays)


def _read(path: PathLike) -> dict[str, np.ndarray]:
    path = os.fspath(path)
    if not os.path.isfile(path):
        raise FileNotFoundError(f"no model file at {path!r}")
    if not zipfile.is_zipfile(path):
        raise ValueError(f"{path!r} is not a sparknet model file (not an npz archive)")
    out: dict[str, np.ndarray] = {}
    with np.load(path, allow_pickle=False) as data:
        for key in data.files:
            try:
                out[key] = data[key]
            except ValueError as exc:
                raise ValueError(f"{path!r}: entry {key!r} holds an object array; refusing to load it "
                                 f"(model files must not need pickle)") from exc
    if "format" not in out or str(out["format"]) != FORMAT:
        raise ValueError(f"{path!r} is not a sparknet model file (no '{FORMAT}' marker)")
    version = int(out.get("version", -1))
    if version != VERSION:
        raise ValueError(f"{path!r} has model-file version {version}; this sparknet reads version {VERSION}")
    for key in ("architecture", "params"):
        if key not in out:
            raise ValueError(f"{path!r} lacks its {key!r} entry")
    if out["params"].dtype.kind != "f":
        raise ValueError(f"{path!r}: params has dtype {out['params'].dtype}, expected floats")
    return out


@overload
def load_model(path: PathLike, with_optimizer: Literal[False] = ..., with_extra: Literal[False] = ...
               ) -> Sequential: ...
@overload
def load_model(path: PathLike, with_optimizer: bool = ..., with_extra: bool = ...
               ) -> Sequential | tuple[Any, ...]: ...


def load_model(path: PathLike, with_optimizer: bool = False, with_extra: bool = False
               ) -> Sequential | tuple[Any, ...]:
    """Load a model saved by :func:`save_model`.

    Returns the model, or a tuple ``(model, optimizer_or_None[, extra_dict])`` when
    ``with_optimizer`` / ``with_extra`` ask for them.
    """
    from sparknet import optim
    from sparknet.model import Sequential

    data = _read(path)
    try:
        config = json.loads(str(data["architecture"]))
        model = Sequential.from_config(config)
    except (json.JSONDecodeError, KeyError, TypeError) as exc:
        raise ValueError(f"{os.fspath(path)!r}: malformed architecture ({exc})") from exc
    if not model.built:
        raise ValueError(f"{os.fspath(path)!r}: architecture has no input shape")
    params = data["params"]
    if params.shape != model.params.shape:
        raise ValueError(f"{os.fspath(path)!r}: {params.shape[0] if params.ndim else 0} parameters stored, "
                         f"the architecture needs {model.params.shape[0]}")
    model.params[...] = params
    result: list[Any] = [model]
    if with_optimizer:
        opt = None
        if "optimizer" in data:
            meta = json.loads(str(data["optimizer"]))
            opt = optim.from_config(meta["name"], meta["config"])
            state = dict(data)
            state.setdefault("opt_t", np.array([meta.get("t", 0)], dtype=np.int64))
            opt.load_state_arrays(state, "opt_")
        result.append(opt)
    if with_extra:
        result.append(json.loads(str(data["extra"])) if "extra" in data else {})
    return result[0] if len(result) == 1 else tuple(result)
