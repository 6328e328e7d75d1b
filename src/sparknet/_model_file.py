"""The model file format: a checked ``.npz`` of plain arrays, written atomically.

What :mod:`sparknet.io` (``save_model``, ``load_model``) and :meth:`Sequential.save
<sparknet.model.Sequential.save>` / :meth:`~sparknet.model.Sequential.load` stand on; the
layout and the checks are described in :mod:`sparknet.io`.  Nothing here imports the model:
the reader is given the constructor that builds one from its architecture.
"""
from __future__ import annotations

import contextlib
import json
import math
import os
import tempfile
import zipfile
from typing import IO, TYPE_CHECKING, Any, Callable, Iterator, Union

import numpy as np

from sparknet.errors import CheckpointError

if TYPE_CHECKING:
    from sparknet.model import Sequential
    from sparknet.optim import Optimizer

__all__ = ["PathLike", "FORMAT", "VERSION", "MAX_META_BYTES", "ZIP_ERRORS", "ModelFile",
           "atomic_write", "atomic_savez", "check_path", "write_model", "read_model_file"]

#: a file path: a string or an ``os.PathLike``
PathLike = Union[str, "os.PathLike[str]"]

FORMAT = "sparknet-model"
VERSION = 1
#: members other than ``params`` and the optimizer state (JSON text, markers, the step
#: count) are small; larger ones are refused before they are read
MAX_META_BYTES = 64 * 2 ** 20


@contextlib.contextmanager
def atomic_write(path: str, mode: str = "wb") -> Iterator[IO]:
    """Open a temporary file beside ``path`` for writing; on success it is flushed, synced
    and renamed over ``path``; on any error it is deleted and ``path`` is left as it was."""
    folder = os.path.dirname(os.path.abspath(path)) or "."
    if not os.path.isdir(folder):
        raise ValueError(f"cannot save to {path!r}: folder {folder!r} does not exist")
    if os.path.isdir(path):
        raise ValueError(f"cannot save to {path!r}: it is a folder; give a file name such as "
                         f"{os.path.join(path, 'model.npz')!r}")
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


def check_path(path: Any) -> str:
    """``path`` as a string (a string or an ``os.PathLike`` of one), else ``TypeError``."""
    if not isinstance(path, (str, os.PathLike)):
        raise TypeError(f"path must be a string or os.PathLike, got {path!r}")
    out = os.fspath(path)
    if not isinstance(out, str):
        raise TypeError(f"path must be a string or os.PathLike of str, got {path!r}")
    return out


def atomic_savez(path: str, arrays: dict[str, np.ndarray]) -> None:
    """``np.savez`` of ``arrays`` to ``path`` through :func:`atomic_write`."""
    # typed loosely: numpy's stubs would read a key named "allow_pickle" as that flag
    entries: dict[str, Any] = arrays
    with atomic_write(path) as fh:
        np.savez(fh, **entries)


def _first_bad(a: np.ndarray) -> tuple[int, int]:
    """``(number of non-finite entries, flat index of the first)`` of a float array."""
    bad = ~np.isfinite(a.reshape(-1))
    count = int(bad.sum())
    return count, (int(np.argmax(bad)) if count else -1)


#: file-name suffixes of other tools' formats, which a sparknet model file must not take
#: (the file would hold sparknet's archive under a name that promises another format):
#: the format, and what writes it
_KERAS = ("a Keras file", "sparknet writes no Keras file; sparknet.onnx.export(model, path) "
          "writes ONNX, which most tools read")
OTHER_FORMATS = {
    ".onnx": ("an ONNX file", "sparknet.onnx.export(model, path) writes ONNX"),
    ".pt": ("a PyTorch file", "sparknet.interop.to_torch(model) gives a torch.nn.Module to "
                              "torch.save"),
    ".pth": ("a PyTorch file", "sparknet.interop.to_torch(model) gives a torch.nn.Module to "
                               "torch.save"),
    ".keras": _KERAS,
    ".h5": _KERAS,
    ".hdf5": _KERAS,
    ".safetensors": ("a safetensors file", "the state_dict() of sparknet.interop.to_torch(model) "
                                           "is what safetensors saves"),
}


def check_model_suffix(path: str) -> None:
    """Refuse a file name whose suffix promises another tool's format (``model.onnx``),
    saying what writes that format."""
    suffix = os.path.splitext(path)[1].lower()
    if suffix in OTHER_FORMATS:
        kind, how = OTHER_FORMATS[suffix]
        raise ValueError(
            f"cannot save to {path!r}: save() writes sparknet's own model file (an .npz "
            f"archive), not {kind}: {how}. For sparknet's file, give a name "
            f"such as {os.path.splitext(path)[0] + '.npz'!r}")


def write_model(model: Sequential, path: PathLike, optimizer: Optimizer | None = None,
                extra: dict[str, Any] | None = None) -> None:
    """:func:`sparknet.io.save_model`: ``model`` (and ``optimizer``'s state, and ``extra``)
    written to ``path`` atomically, after its checks."""
    path = check_path(path)
    check_model_suffix(path)
    if not model.built:
        raise ValueError("cannot save a model that is not built (fit it or call build first)")
    count, first = _first_bad(model.params)
    if count:
        raise ValueError(f"cannot save {path!r}: the model's params hold NaN or infinity "
                         f"({count} value(s), first at index {first}); such a file could not "
                         f"be loaded")
    arrays: dict[str, np.ndarray] = {
        "format": np.array(FORMAT),
        "version": np.array(VERSION, dtype=np.int64),
        "architecture": np.array(json.dumps(model.get_config())),
        "params": np.ascontiguousarray(model.params),
    }
    if model.n_state:
        count, first = _first_bad(model.state)
        if count:
            raise ValueError(f"cannot save {path!r}: the model's state (running statistics) "
                             f"holds NaN or infinity ({count} value(s), first at index {first})")
        arrays["state"] = np.ascontiguousarray(model.state)
    if optimizer is not None:
        arrays["optimizer"] = np.array(json.dumps(
            {"name": optimizer.name, "config": optimizer.get_config(), "t": int(optimizer.t)}))
        arrays.update(optimizer.state_arrays("opt_"))
    if extra is not None:
        try:
            arrays["extra"] = np.array(json.dumps(extra))
        except (TypeError, ValueError) as exc:
            raise ValueError(f"cannot save {path!r}: extra is not JSON-serialisable "
                             f"({exc})") from None
    atomic_savez(path, arrays)


# --------------------------------------------------------------------------- reading
#: what zipfile and numpy's .npy reader raise for a damaged archive or member (a flipped
#: byte can name an unknown compression method, a zip version or encryption)
ZIP_ERRORS = (zipfile.BadZipFile, EOFError, OSError, ValueError, NotImplementedError, RuntimeError)


class ModelFile:
    """An opened model file: its members' ``.npy`` layouts, checked against their sizes,
    read one at a time on request."""

    def __init__(self, path: str) -> None:
        self.path = path
        try:
            self.zip = zipfile.ZipFile(path)
        except ZIP_ERRORS:
            with open(path, "rb") as fh:
                head = fh.read(4)
            if head == b"PK\x03\x04":
                raise self.error("is truncated or damaged (a zip archive without its "
                                 "directory)") from None
            raise self.error("is not a sparknet model file (not an npz archive)") from None
        self.size = os.path.getsize(path)
        self.layouts: dict[str, tuple[tuple[int, ...], bool, np.dtype, zipfile.ZipInfo]] = {}
        try:
            for info in self.zip.infolist():
                if info.filename.endswith(".npy"):
                    self.layouts[info.filename[:-4]] = self._layout(info)
        except BaseException:
            self.zip.close()
            raise

    def error(self, what: str) -> CheckpointError:
        return CheckpointError(f"{self.path!r} {what}")

    def _layout(self, info: zipfile.ZipInfo
                ) -> tuple[tuple[int, ...], bool, np.dtype, zipfile.ZipInfo]:
        """The member's declared shape and dtype, checked against its size (before reading
        data)."""
        key = info.filename[:-4]
        if info.header_offset + info.compress_size > self.size:
            raise self.error(f"is truncated: member {info.filename} declares "
                             f"{info.compress_size:,} bytes beyond the end of the file")
        try:
            with self.zip.open(info) as fh:
                version = np.lib.format.read_magic(fh)
                reader = np.lib.format.read_array_header_1_0 if version == (1, 0) else \
                    np.lib.format.read_array_header_2_0
                shape, fortran, dtype = reader(fh)
                offset = fh.tell()
        except ZIP_ERRORS as exc:
            raise self.error(f"is damaged: member {info.filename} is not a valid .npy array "
                             f"({exc})") from None
        if dtype.hasobject:
            raise self.error(f"is refused: entry {key!r} holds an object array; refusing to "
                             f"load it (model files must not need pickle)")
        declared = math.prod(int(d) for d in shape) * dtype.itemsize
        if declared != info.file_size - offset:
            raise self.error(f"is refused: {info.filename} declares shape {tuple(shape)} of "
                             f"{dtype} ({declared:,} bytes) but holds "
                             f"{info.file_size - offset:,} bytes of data")
        return tuple(int(d) for d in shape), bool(fortran), dtype, info

    def __contains__(self, key: str) -> bool:
        return key in self.layouts

    def read(self, key: str, large: bool = False) -> np.ndarray:
        """Member ``key`` as an array (its layout already checked; the zip CRC checked here).
        Only a ``large`` member (weights, optimizer state: sizes checked by the caller) may
        exceed :data:`MAX_META_BYTES`."""
        if key not in self.layouts:
            raise self.error(f"lacks its {key!r} entry")
        shape, fortran, dtype, info = self.layouts[key]
        if not large and info.file_size > MAX_META_BYTES:
            raise self.error(f"is refused: entry {key!r} declares {info.file_size:,} bytes "
                             f"(at most {MAX_META_BYTES:,} expected)")
        try:
            with self.zip.open(info) as fh:
                np.lib.format.read_magic(fh)
                fh.seek(info.file_size - math.prod(shape) * dtype.itemsize)
                data = fh.read()
        except ZIP_ERRORS as exc:
            raise self.error(f"is damaged: member {info.filename} failed its CRC check "
                             f"({exc})") from None
        return np.frombuffer(data, dtype=dtype).reshape(shape, order="F" if fortran else "C")

    def text(self, key: str) -> str:
        return str(self.read(key).reshape(-1)[0]) if key in self else ""

    def json(self, key: str) -> Any:
        try:
            return json.loads(self.text(key))
        except json.JSONDecodeError as exc:
            raise self.error(f"holds a malformed {key} entry ({exc})") from None

    def close(self) -> None:
        self.zip.close()


def _check_header(f: ModelFile) -> None:
    if "format" not in f or f.text("format") != FORMAT:
        raise f.error(f"is not a sparknet model file (no '{FORMAT}' marker)")
    raw = f.read("version").reshape(-1)[0].item() if "version" in f else -1
    if isinstance(raw, bool) or not isinstance(raw, int) or raw != VERSION:
        raise f.error(f"has model-file version {raw!r}; this sparknet reads version {VERSION}")
    for key in ("architecture", "params"):
        if key not in f:
            raise f.error(f"lacks its {key!r} entry")


def _declared_params(f: ModelFile, config: Any) -> int:
    """The parameter count the architecture declares, from layer shapes alone (nothing
    allocated)."""
    from sparknet._validation import check_shape
    from sparknet.layers.base import layers_from_config

    try:
        layers = layers_from_config(config["layers"])
        if config.get("input_shape") is None:
            raise f.error("is refused: its architecture has no input shape")
        shape = check_shape(config["input_shape"], "input_shape")
        dtype = np.dtype(config.get("dtype", "float32"))
        n = 0
        for layer in layers:
            shape = layer.build(shape, dtype)
            n += sum(math.prod(s) for _, s in layer.param_specs())
        return n
    except CheckpointError:
        raise
    except (KeyError, TypeError, ValueError, AttributeError, IndexError) as exc:
        raise f.error(f"holds a malformed architecture ({type(exc).__name__}: {exc})") from None


def _read_model(f: ModelFile, build: Callable[[dict[str, Any]], Sequential]) -> Sequential:
    """The model ``build`` makes from the file's architecture, with the file's weights."""
    _check_header(f)
    config = f.json("architecture")
    need = _declared_params(f, config)
    shape, _, dtype, _ = f.layouts["params"]
    if dtype.kind != "f":
        raise f.error(f"is refused: params has dtype {dtype}, expected floats")
    if len(shape) != 1:
        raise f.error(f"is refused: params must be 1-D, got shape {shape}")
    if shape[0] != need:
        raise f.error(f"is refused: {shape[0]:,} parameters stored, the architecture declares "
                      f"{need:,} (checked before building it: a file of another network, or a "
                      f"damaged one)")
    params = f.read("params", large=True)
    count, first = _first_bad(params)
    if count:
        raise f.error(f"is refused: params holds {count} NaN or infinite "
                      f"value{'s' if count > 1 else ''} (first at index {first}); a model with "
                      f"them cannot predict")
    try:
        model = build(config)
    except (KeyError, TypeError, ValueError) as exc:
        raise f.error(f"holds a malformed architecture ({exc})") from None
    model.params[...] = params
    _read_state(f, model)
    return model


def _read_state(f: ModelFile, model: Sequential) -> None:
    """The layers' untrained state (running statistics): checked, then copied in."""
    if "state" not in f:
        if model.n_state:
            raise f.error(f"is refused: the architecture keeps {model.n_state:,} state values "
                          f"(running statistics) and the file stores none")
        return
    shape, _, dtype, _ = f.layouts["state"]
    if dtype.kind != "f" or shape != (model.n_state,):
        raise f.error(f"is refused: state has shape {shape} and dtype {dtype}, the architecture "
                      f"keeps {model.n_state:,} float values")
    state = f.read("state", large=True)
    count, first = _first_bad(state)
    if count:
        raise f.error(f"is refused: state holds {count} NaN or infinite "
                      f"value{'s' if count > 1 else ''} (first at index {first})")
    model.state[...] = state


def _read_optimizer(f: ModelFile, model: Sequential) -> Optimizer | None:
    from sparknet import optim

    if "optimizer" not in f:
        return None
    meta = f.json("optimizer")
    if not isinstance(meta, dict) or "name" not in meta or not isinstance(meta.get("config"), dict):
        raise f.error(f"holds a malformed optimizer entry (expected {{'name', 'config', 't'}}, "
                      f"got {meta!r})")
    try:
        opt = optim.from_config(meta["name"], meta["config"])
        state: dict[str, np.ndarray] = {}
        for key in opt.state_keys():
            name = f"opt_{key}"
            if name not in f:
                continue
            shape, _, dtype, _ = f.layouts[name]
            if dtype.kind != "f":
                raise ValueError(f"optimizer state {key} has dtype {dtype}, expected floats")
            if shape != (model.n_params,):
                n = shape[0] if len(shape) == 1 else shape
                raise ValueError(f"optimizer state {key} has {n} entries, the model has "
                                 f"{model.n_params} parameters")
            state[name] = f.read(name, large=True)
        state["opt_t"] = f.read("opt_t") if "opt_t" in f else np.array([meta.get("t", 0)])
        opt.load_state_arrays(state, "opt_")
    except ValueError as exc:
        raise f.error(f"is refused: its optimizer: {exc}") from None
    return opt


def read_model_file(path: PathLike, build: Callable[[dict[str, Any]], Sequential],
                    with_optimizer: bool = False, with_extra: bool = False
                    ) -> Sequential | tuple[Any, ...]:
    """The model in the file at ``path``, made by ``build`` from its architecture (a
    :meth:`Sequential.from_config <sparknet.model.Sequential.from_config>`); what
    :func:`sparknet.io.load_model` returns and raises."""
    path = check_path(path)
    if os.path.isdir(path):
        raise IsADirectoryError(f"{path!r} is a folder; load_model reads one .npz model file. "
                                + _folder_hint(path))
    if not os.path.isfile(path):
        raise FileNotFoundError(f"no model file at {path!r}")
    f = ModelFile(path)
    try:
        model = _read_model(f, build)
        result: list[Any] = [model]
        if with_optimizer:
            result.append(_read_optimizer(f, model))
        if with_extra:
            result.append(f.json("extra") if "extra" in f else {})
    finally:
        f.close()
    return result[0] if len(result) == 1 else tuple(result)


def _folder_hint(path: str) -> str:
    """What a folder given to :func:`load_model` probably holds, and what loads it."""
    if os.path.isfile(os.path.join(path, "manifest.json")):
        return ("It holds a model-parallel model: load it with "
                "sparknet.cluster.ModelParallel.load(folder).")
    if os.path.isdir(os.path.join(path, "metadata")):
        return ("It holds a saved Spark ML stage: load it with its class, e.g. "
                "sparknet.ml.SparkNetClassificationModel.load(folder).")
    found = sorted(f for f in os.listdir(path) if f.endswith(".npz"))
    if found:
        return (f"It holds {len(found)} .npz file(s), e.g. {os.path.join(path, found[-1])!r}: "
                f"pass one of them.")
    return "It holds no model file."
