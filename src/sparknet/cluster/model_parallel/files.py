"""Files of a model-parallel model: block files, the manifest, checkpoints.

A saved folder holds

* ``layerIII_blockKKK.npz``: block ``KKK`` of layer ``III``, written by the executor that
  holds it, streamed from its mapped arrays (parameters, optimizer state and the
  ``[generation, step, busy]`` record), atomically;
* ``driver.npz``: the driver's layers and their optimizer state (each stage's
  :meth:`~sparknet.optim.Optimizer.state_arrays` under the prefix ``stage<j>.opt_``);
* ``manifest.json``, written last, so a folder with a manifest is complete.

The folder is built beside its final place and renamed into it (:func:`staged_folder`).
Checkpoints are :class:`~sparknet.checkpoint.CheckpointStore` folders holding the same
block files (:mod:`~sparknet.cluster.model_parallel.recovery`).
"""
from __future__ import annotations

import contextlib
import io
import json
import os
import shutil
import uuid
import zipfile
from typing import Any, Iterator, Sequence, cast

import numpy as np

from sparknet.cluster.blocks import BlockedLayer
from sparknet.cluster.model_parallel.executor import Arrays
from sparknet.io import _atomic_savez, atomic_write

FORMAT = "sparknet-model-parallel"
#: 2: driver optimizer state in the one serialised form (``stage<j>.opt_<key>``); 1 is still read
VERSION = 2
_READS = (1, 2)


# ----------------------------------------------------------------------- block files
def block_file(folder: str, layer: int, k: int) -> str:
    return os.path.join(folder, f"layer{layer:03d}_block{k:03d}.npz")


def save_block(arrays: Arrays, layer: BlockedLayer, k: int, folder: str, state_keys: Sequence[str]) -> int:
    """Write block ``k`` of a layer (params + optimizer state) as one ``.npz``, atomically;
    returns the bytes written."""
    i = layer.index
    total = 0
    with atomic_write(block_file(folder, i, k)) as out, \
            zipfile.ZipFile(out, "w", zipfile.ZIP_STORED, allowZip64=True) as zf:
        for pname in layer.param_shapes(k):
            for suffix in [""] + [f".{s}" for s in state_keys]:
                arr = arrays[f"{i}.{pname}{suffix}"]
                with zf.open(f"{pname}{suffix}.npy", "w", force_zip64=True) as fh:
                    np.lib.format.write_array(fh, np.asarray(arr), allow_pickle=False)
                total += arr.nbytes
        with zf.open("state.npy", "w") as fh:
            np.lib.format.write_array(fh, np.array(arrays[f"{i}.state"]), allow_pickle=False)
    return total


def _read_into(zf: zipfile.ZipFile, name: str, out: np.ndarray, path: str) -> None:
    """Stream one ``.npy`` member of a zip into ``out`` (checked shape and dtype)."""
    try:
        fh = zf.open(name + ".npy")
    except KeyError:
        raise ValueError(f"block file {path!r} lacks {name!r}") from None
    with fh:
        version = np.lib.format.read_magic(fh)
        if version == (1, 0):
            shape, fortran, dtype = np.lib.format.read_array_header_1_0(fh)
        else:
            shape, fortran, dtype = np.lib.format.read_array_header_2_0(fh)
        if tuple(shape) != out.shape or np.dtype(dtype) != out.dtype or fortran:
            raise ValueError(f"block file {path!r}: {name!r} is {tuple(shape)} {np.dtype(dtype)}, "
                             f"expected {out.shape} {out.dtype}")
        view = out.reshape(-1).view(np.uint8).data
        reader = cast(io.BufferedIOBase, fh)
        pos, n = 0, out.nbytes
        while pos < n:
            got = reader.readinto(view[pos:min(n, pos + (16 << 20))])
            if not got:
                raise ValueError(f"block file {path!r}: {name!r} is truncated")
            pos += got


def load_block(arrays: Arrays, layer: BlockedLayer, k: int, folder: str, state_keys: Sequence[str]) -> None:
    """Stream block ``k`` of a layer from its file into the slot's allocated arrays."""
    i = layer.index
    path = block_file(folder, i, k)
    if not os.path.isfile(path):
        raise FileNotFoundError(f"block file {path!r} is missing (layer {i}, block {k})")
    with zipfile.ZipFile(path) as zf:
        for pname in layer.param_shapes(k):
            _read_into(zf, pname, arrays[f"{i}.{pname}"], path)
            for s in state_keys:
                _read_into(zf, f"{pname}.{s}", arrays[f"{i}.{pname}.{s}"], path)


# -------------------------------------------------------------- driver arrays, manifest
def write_driver(folder: str, arrays: dict[str, np.ndarray]) -> None:
    _atomic_savez(os.path.join(folder, "driver.npz"), arrays)


def read_driver(folder: str, version: int) -> dict[str, np.ndarray]:
    """The driver's arrays of a saved folder, in the current form (version 1 named the
    optimizer state ``stage<j>.opt.<key>``; it is now ``stage<j>.opt_<key>``)."""
    with np.load(os.path.join(folder, "driver.npz"), allow_pickle=False) as data:
        out = {k: data[k] for k in data.files}
    if version == 1:
        out = {k.replace(".opt.", ".opt_", 1): v for k, v in out.items()}
    return out


@contextlib.contextmanager
def staged_folder(folder: str) -> Iterator[tuple[str, str]]:
    """``(final, staging)``: write a saved model into ``staging``, a hidden folder beside
    ``folder``; on success it replaces ``folder`` (a previous model there is removed only
    then), on an error it is deleted and ``folder`` is left as it was."""
    final = os.path.abspath(os.fspath(folder))
    parent = os.path.dirname(final)
    os.makedirs(parent, exist_ok=True)
    staging = os.path.join(parent, f".{os.path.basename(final)}.tmp-{uuid.uuid4().hex[:8]}")
    os.makedirs(staging)
    try:
        yield final, staging
        old = None
        if os.path.exists(final):
            old = os.path.join(parent, f".{os.path.basename(final)}.old-{uuid.uuid4().hex[:8]}")
            os.replace(final, old)
        os.replace(staging, final)
        if old is not None:
            shutil.rmtree(old, ignore_errors=True)
    except BaseException:
        shutil.rmtree(staging, ignore_errors=True)
        raise


def write_manifest(folder: str, manifest: dict[str, Any]) -> None:
    with atomic_write(os.path.join(folder, "manifest.json"), "w") as fh:
        json.dump({"format": FORMAT, "version": VERSION, **manifest}, fh)


def read_manifest(folder: str) -> dict[str, Any]:
    man = os.path.join(folder, "manifest.json")
    if not os.path.isfile(man):
        raise FileNotFoundError(f"{folder!r} holds no complete model-parallel model (no manifest.json)")
    with open(man) as fh:
        m = json.load(fh)
    if m.get("format") != FORMAT or m.get("version") not in _READS:
        raise ValueError(f"{folder!r} is not a {FORMAT} folder of version {', '.join(map(str, _READS))}")
    return m
