"""Files of a model-parallel model: block files, the manifest, checkpoints.

A saved folder holds

* ``layerIII_blockKKK.npz``: block ``KKK`` of layer ``III``, written by the executor that
  holds it, streamed from its mapped arrays (parameters, optimizer state and the
  ``[generation, step, busy]`` record), atomically;
* ``driver.npz``: the driver's layers and their optimizer state (each stage's
  :meth:`~sparknet.optim.Optimizer.state_arrays` under the prefix ``stage<j>.opt_``);
* ``manifest.json``, written last, so a folder with a manifest is complete; it lists
  every other file with its size and SHA-256 (``"files"``).

The folder is built beside its final place and renamed into it (:func:`staged_folder`).
Loading checks every file before it is used (:func:`verify_folder`): the manifest's
structure, each file's size and checksum (a folder saved before the checksums were kept:
each block file's zip structure and CRCs), and the driver file's arrays (no object
arrays, sizes that match their headers); a file that fails raises
:class:`~sparknet.errors.CheckpointError` naming it.
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

from sparknet._model_file import ZIP_ERRORS, ModelFile, atomic_savez, atomic_write
from sparknet.cluster.model_parallel.block_partition import BlockedLayer
from sparknet.cluster.model_parallel.executor import Arrays
from sparknet.errors import CheckpointError

FORMAT = "sparknet-model-parallel"
#: 2: driver optimizer state in the one serialised form (``stage<j>.opt_<key>``); 1 is still read
VERSION = 2
_READS = (1, 2)


# ----------------------------------------------------------------------- block files
def block_file(folder: str, layer: int, k: int) -> str:
    return os.path.join(folder, f"layer{layer:03d}_block{k:03d}.npz")


def save_block(arrays: Arrays, layer: BlockedLayer, k: int, folder: str,
               state_keys: Sequence[str]) -> int:
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


def load_block(arrays: Arrays, layer: BlockedLayer, k: int, folder: str,
               state_keys: Sequence[str]) -> None:
    """Stream block ``k`` of a layer from its file into the slot's allocated arrays (the
    zip CRC of each member checked as it is read).

    Raises:
        FileNotFoundError: the file is missing.
        CheckpointError: the file is damaged, or holds other shapes than the layer's.
    """
    i = layer.index
    path = block_file(folder, i, k)
    if not os.path.isfile(path):
        raise FileNotFoundError(f"block file {path!r} is missing (layer {i}, block {k})")
    try:
        with zipfile.ZipFile(path) as zf:
            for pname in layer.param_shapes(k):
                _read_into(zf, pname, arrays[f"{i}.{pname}"], path)
                for s in state_keys:
                    _read_into(zf, f"{pname}.{s}", arrays[f"{i}.{pname}.{s}"], path)
    except CheckpointError:
        raise
    except ZIP_ERRORS as exc:
        raise CheckpointError(f"block file {path!r} (layer {i}, block {k}) is damaged "
                              f"({type(exc).__name__}: {exc})") from None


def check_block_file(path: str) -> None:
    """The structure of a block file: a zip archive whose members all pass their CRC
    check and are ``.npy`` arrays of plain numbers (read through once, nothing kept).

    Raises:
        CheckpointError: naming the file and what is wrong.
    """
    try:
        with zipfile.ZipFile(path) as zf:
            bad = zf.testzip()
            if bad is not None:
                raise CheckpointError(f"block file {path!r} is damaged: member {bad} fails its "
                                      f"CRC check")
            for info in zf.infolist():
                with zf.open(info) as fh:
                    version = np.lib.format.read_magic(fh)
                    read = np.lib.format.read_array_header_1_0 if version == (1, 0) else \
                        np.lib.format.read_array_header_2_0
                    dtype = read(fh)[2]
                if dtype.hasobject:
                    raise CheckpointError(f"block file {path!r}: {info.filename} holds an object "
                                          f"array; refused (nothing read may run code)")
    except CheckpointError:
        raise
    except ZIP_ERRORS as exc:
        raise CheckpointError(f"block file {path!r} is damaged ({type(exc).__name__}: "
                              f"{exc})") from None


# -------------------------------------------------------------- driver arrays, manifest
def write_driver(folder: str, arrays: dict[str, np.ndarray]) -> None:
    atomic_savez(os.path.join(folder, "driver.npz"), arrays)


def read_driver(folder: str, version: int) -> dict[str, np.ndarray]:
    """The driver's arrays of a saved folder, in the current form (version 1 named the
    optimizer state ``stage<j>.opt.<key>``; it is now ``stage<j>.opt_<key>``).

    Raises:
        CheckpointError: ``driver.npz`` is missing, damaged, or holds object arrays or
            arrays whose data do not match their headers (named in the message).
    """
    path = os.path.join(folder, "driver.npz")
    if not os.path.isfile(path):
        raise CheckpointError(f"{path!r} is missing: {folder!r} is not a complete model-parallel "
                              f"model")
    data = ModelFile(path)  # every member's header checked against its size; object arrays refused
    try:
        out = {k: data.read(k, large=True) for k in data.layouts}
    finally:
        data.close()
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
    """``manifest.json``, written last: ``manifest`` plus the size and SHA-256 of every
    file already in ``folder``."""
    from sparknet.checkpoint import sha256_file

    files = {}
    for name in sorted(os.listdir(folder)):
        size, digest = sha256_file(os.path.join(folder, name))
        files[name] = {"bytes": size, "sha256": digest}
    with atomic_write(os.path.join(folder, "manifest.json"), "w") as fh:
        json.dump({"format": FORMAT, "version": VERSION, **manifest, "files": files}, fh)


#: what a manifest must hold, and of which JSON type
_MANIFEST_KEYS = {"architecture": dict, "plan": dict, "optimizer": dict, "t": int}


def read_manifest(folder: str) -> dict[str, Any]:
    """The manifest of a saved folder, its structure checked.

    Raises:
        FileNotFoundError: there is none (an incomplete folder).
        CheckpointError: it is not JSON, not a model-parallel manifest of a version this
            sparknet reads, or lacks an entry.
    """
    man = os.path.join(folder, "manifest.json")
    if not os.path.isfile(man):
        raise FileNotFoundError(f"{folder!r} holds no complete model-parallel model (no "
                                f"manifest.json)")
    try:
        with open(man, encoding="utf-8") as fh:
            m = json.load(fh)
    except (ValueError, UnicodeDecodeError) as exc:  # JSONDecodeError is a ValueError
        raise CheckpointError(f"{man!r} is damaged: not JSON ({exc})") from None
    if not isinstance(m, dict) or m.get("format") != FORMAT:
        raise CheckpointError(f"{man!r} is not a {FORMAT} manifest")
    if m.get("version") not in _READS:
        raise CheckpointError(f"{man!r} has version {m.get('version')!r}; this sparknet reads "
                              f"{', '.join(map(str, _READS))}")
    for key, kind in _MANIFEST_KEYS.items():
        if not isinstance(m.get(key), kind) or isinstance(m.get(key), bool):
            raise CheckpointError(f"{man!r} is damaged: its {key!r} entry is missing or not a "
                                  f"JSON {'object' if kind is dict else 'integer'}")
    files = m.get("files")
    if files is not None and not (isinstance(files, dict) and all(
            isinstance(v, dict) and isinstance(v.get("bytes"), int)
            and isinstance(v.get("sha256"), str) for v in files.values())):
        raise CheckpointError(f"{man!r} is damaged: its 'files' entry is not a list of sizes and "
                              f"checksums")
    return m


def verify_folder(folder: str, manifest: dict[str, Any]) -> None:
    """Check every file of a saved folder before any is used: against the sizes and
    checksums of ``manifest`` (from :func:`read_manifest`), or, for a folder saved
    without them, each block file's structure and CRCs (:func:`check_block_file`).

    Raises:
        CheckpointError: naming the first file that is missing or fails.
    """
    from sparknet.checkpoint import sha256_file

    files = manifest.get("files")
    if files is None:
        for name in sorted(os.listdir(folder)):
            if name.startswith("layer") and name.endswith(".npz"):
                check_block_file(os.path.join(folder, name))
        return
    for name, want in files.items():
        path = os.path.join(folder, os.path.basename(name))
        if not os.path.isfile(path):
            raise CheckpointError(f"{path!r} is missing: the manifest of {folder!r} lists it")
        size, digest = sha256_file(path)
        if size != want["bytes"]:
            raise CheckpointError(f"{path!r} is damaged: {size:,} bytes, the manifest says "
                                  f"{want['bytes']:,} (truncated or padded)")
        if digest != want["sha256"]:
            raise CheckpointError(f"{path!r} is damaged: its SHA-256 differs from the manifest's "
                                  f"(altered bytes)")
