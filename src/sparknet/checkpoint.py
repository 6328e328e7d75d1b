"""Checkpoints: folders of arrays and JSON, written atomically, verified when read.

Every trainer writes its checkpoints through a :class:`CheckpointStore`:

* a checkpoint is a folder ``<directory>/ckpt-<step>`` holding one ``.npy`` file per
  array (or any files its writer puts there, see :meth:`CheckpointStore.writing`) and
  ``manifest.json``, written last: format, version, step, wall time, the caller's
  ``meta`` (JSON) and, per file, its size and SHA-256;
* it is built in a hidden temporary folder (``.tmp-ckpt-...``) and renamed into place
  once complete, so a crash at any moment leaves either the whole checkpoint or none;
* the newest ``keep`` (default 3) are kept, older ones deleted after a new one is in place;
* :meth:`CheckpointStore.latest` returns the newest checkpoint whose files are all there
  with the sizes and checksums of its manifest; a partial or damaged one is skipped with
  a warning; :meth:`CheckpointStore.load` checks an array file's declared shape against
  its size *before* allocating it, and refuses pickled objects.

``directory`` is a local (or shared-filesystem) folder, or a Hadoop URI (``hdfs://``,
``s3a://``, ``file:``...) when a Spark session is given: the checkpoint is then built
locally and copied with Hadoop's ``FileSystem``, and renamed into place there.

Example::

    store = CheckpointStore("/tmp/run1", keep=3)
    store.save(10, {"params": w}, {"epoch": 2})
    ckpt = store.latest()                    # Checkpoint(path, step=10, meta={"epoch": 2}, ...)
    arrays = store.load(ckpt)                # {"params": array}
"""
from __future__ import annotations

import contextlib
import hashlib
import json
import logging
import os
import re
import shutil
import socket
import tempfile
import time
import uuid
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Iterator, Mapping

import numpy as np

from sparknet.errors import CheckpointError

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

log = logging.getLogger(__name__)

FORMAT = "sparknet-checkpoint"
VERSION = 1
MANIFEST = "manifest.json"
_PREFIX = "ckpt-"
_TMP = ".tmp-ckpt-"
_NAME = re.compile(r"^[A-Za-z0-9_.\-]+$")
_CHUNK = 1 << 22


@dataclass(frozen=True)
class Checkpoint:
    """One complete checkpoint.

    Attributes:
        path: its folder (or URI).
        step: the step it was written at (its name sorts by it).
        meta: the writer's JSON metadata.
        files: ``{file name: {"bytes": int, "sha256": str}}`` from the manifest.
        written: ``time.time()`` when it was written.
    """

    path: str
    step: int
    meta: dict[str, Any] = field(default_factory=dict)
    files: dict[str, dict[str, Any]] = field(default_factory=dict)
    written: float = 0.0

    @property
    def arrays(self) -> list[str]:
        """Names of the arrays it holds (its ``.npy`` files)."""
        return sorted(f[:-4] for f in self.files if f.endswith(".npy"))


def sha256_file(path: str) -> tuple[int, str]:
    """``(size in bytes, hex SHA-256)`` of a file, read in chunks."""
    h, n = hashlib.sha256(), 0
    with open(path, "rb") as fh:
        while True:
            chunk = fh.read(_CHUNK)
            if not chunk:
                break
            h.update(chunk)
            n += len(chunk)
    return n, h.hexdigest()


def _fsync_dir(path: str) -> None:
    try:
        fd = os.open(path, os.O_RDONLY)
    except OSError:  # pragma: no cover - platforms without directory fds
        return
    try:
        os.fsync(fd)
    except OSError:  # pragma: no cover
        pass
    finally:
        os.close(fd)


def _write_npy(path: str, arr: np.ndarray) -> None:
    arr = np.asarray(arr)
    if arr.dtype.hasobject:
        raise CheckpointError(f"cannot checkpoint an object array ({os.path.basename(path)!r})")
    with open(path, "wb") as fh:
        np.save(fh, np.ascontiguousarray(arr), allow_pickle=False)
        fh.flush()
        os.fsync(fh.fileno())


def read_npy(path: str, expect_bytes: int | None = None) -> np.ndarray:
    """An ``.npy`` file read safely: no pickles, and its header's shape and dtype checked
    against the file's size before anything of that size is allocated.

    Raises:
        CheckpointError: not an ``.npy`` file, an object dtype, or a declared size that
            does not match the file (truncated, padded or tampered).
    """
    name = os.path.basename(path)
    size = os.path.getsize(path)
    if expect_bytes is not None and size != expect_bytes:
        raise CheckpointError(f"{name}: {size} bytes on disk, the manifest says {expect_bytes}")
    with open(path, "rb") as fh:
        try:
            version = np.lib.format.read_magic(fh)
            if version == (1, 0):
                shape, fortran, dtype = np.lib.format.read_array_header_1_0(fh)
            else:
                shape, fortran, dtype = np.lib.format.read_array_header_2_0(fh)
        except (ValueError, OSError) as exc:
            raise CheckpointError(f"{name} is not a valid .npy file: {exc}") from None
        if dtype.hasobject:
            raise CheckpointError(f"{name} holds Python objects; refused (nothing read may run "
                                  "code)")
        offset = fh.tell()
        declared = int(np.prod(shape, dtype=np.int64)) * dtype.itemsize if shape else dtype.itemsize
        if size - offset != declared:
            raise CheckpointError(f"{name} declares shape {tuple(shape)} of {dtype} ({declared} "
                                  f"bytes) but holds {size - offset} bytes of data")
        arr = np.fromfile(fh, dtype=dtype, count=declared // max(dtype.itemsize, 1))
    return arr.reshape(shape, order="F" if fortran else "C")


class _Local:
    """Filesystem operations on a local (or shared) folder."""

    def __init__(self, root: str) -> None:
        self.root = os.path.abspath(os.path.expanduser(root))

    def join(self, *parts: str) -> str:
        return os.path.join(self.root, *parts)

    def makedirs(self) -> None:
        os.makedirs(self.root, exist_ok=True)

    def listdir(self) -> list[str]:
        try:
            return os.listdir(self.root)
        except FileNotFoundError:
            return []

    def publish(self, local_tmp: str, name: str) -> str:
        """Move a complete local folder into place as ``name``."""
        final = self.join(name)
        if os.path.exists(final):  # the same step written again: the new one wins
            old = self.join(f"{_TMP}old-{uuid.uuid4().hex[:8]}")
            os.replace(final, old)
            shutil.rmtree(old, ignore_errors=True)
        os.replace(local_tmp, final)
        _fsync_dir(self.root)
        return final

    def staging(self) -> str:
        """A new hidden folder next to the checkpoints (same filesystem: renames are atomic)."""
        self.makedirs()
        path = self.join(f"{_TMP}{socket.gethostname()}-{os.getpid()}-{uuid.uuid4().hex[:8]}")
        os.makedirs(path)
        return path

    def read_text(self, name: str, file: str) -> str | None:
        try:
            with open(self.join(name, file), encoding="utf-8") as fh:
                return fh.read()
        except (FileNotFoundError, NotADirectoryError):
            return None

    @contextlib.contextmanager
    def local_copy(self, name: str) -> Iterator[str]:
        yield self.join(name)

    def delete(self, name: str) -> None:
        shutil.rmtree(self.join(name), ignore_errors=True)

    def stale_staging(self, max_age: float) -> list[str]:
        """Staging folders left by a writer that died: this host's whose process is gone,
        or any older than ``max_age`` seconds."""
        out, host, now = [], socket.gethostname(), time.time()
        for n in self.listdir():
            if not n.startswith(_TMP):
                continue
            parts = n[len(_TMP):].rsplit("-", 2)
            try:
                age = now - os.path.getmtime(self.join(n))
            except OSError:
                continue
            dead = (len(parts) == 3 and parts[0] == host and parts[1].isdigit()
                    and not _pid_alive(int(parts[1])))
            if dead or age > max_age or parts[0] == "old":
                out.append(n)
        return out


class _Hadoop(_Local):
    """The same operations on a Hadoop ``FileSystem`` URI, through the session's JVM."""

    def __init__(self, root: str, spark: "SparkSession") -> None:
        self.root = root.rstrip("/")
        sc = spark.sparkContext
        assert sc._jvm is not None  # a live context
        self._jvm = sc._jvm
        self._conf = sc._jsc.hadoopConfiguration()
        self._fs = self._path(self.root).getFileSystem(self._conf)

    def _path(self, p: str) -> Any:
        return self._jvm.org.apache.hadoop.fs.Path(p)

    def join(self, *parts: str) -> str:
        return "/".join([self.root, *parts])

    def makedirs(self) -> None:
        self._fs.mkdirs(self._path(self.root))

    def listdir(self) -> list[str]:
        if not self._fs.exists(self._path(self.root)):
            return []
        return [s.getPath().getName() for s in self._fs.listStatus(self._path(self.root))]

    def publish(self, local_tmp: str, name: str) -> str:
        self.makedirs()
        staged = self.join(f"{_TMP}{socket.gethostname()}-{os.getpid()}-{uuid.uuid4().hex[:8]}")
        self._fs.copyFromLocalFile(False, True, self._path(local_tmp), self._path(staged))
        final = self.join(name)
        if self._fs.exists(self._path(final)):
            self._fs.delete(self._path(final), True)
        if not self._fs.rename(self._path(staged), self._path(final)):
            raise CheckpointError(f"could not rename {staged} to {final}")
        shutil.rmtree(local_tmp, ignore_errors=True)
        return final

    def staging(self) -> str:
        return tempfile.mkdtemp(prefix="sparknet-ckpt-")

    def read_text(self, name: str, file: str) -> str | None:
        p = self._path(self.join(name, file))
        if not self._fs.exists(p):
            return None
        with tempfile.TemporaryDirectory(prefix="sparknet-ckpt-") as tmp:
            dst = os.path.join(tmp, file)
            self._fs.copyToLocalFile(False, p, self._path("file://" + dst), True)
            with open(dst, encoding="utf-8") as fh:
                return fh.read()

    @contextlib.contextmanager
    def local_copy(self, name: str) -> Iterator[str]:
        with tempfile.TemporaryDirectory(prefix="sparknet-ckpt-") as tmp:
            dst = os.path.join(tmp, name)
            self._fs.copyToLocalFile(False, self._path(self.join(name)),
                                     self._path("file://" + dst), True)
            yield dst

    def delete(self, name: str) -> None:
        self._fs.delete(self._path(self.join(name)), True)

    def stale_staging(self, max_age: float) -> list[str]:
        now = time.time() * 1000
        out: list[str] = []
        if not self._fs.exists(self._path(self.root)):
            return out
        for s in self._fs.listStatus(self._path(self.root)):
            n = s.getPath().getName()
            if n.startswith(_TMP) and now - s.getModificationTime() > max_age * 1000:
                out.append(n)
        return out


def process_start(pid: int) -> int | None:
    """The start time of process ``pid`` (``/proc/<pid>/stat``), None when it does not run
    (or on systems without ``/proc``, where only :func:`os.kill` can tell)."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            return int(f.read().rsplit(")", 1)[1].split()[19])
    except FileNotFoundError:
        return None
    except (OSError, IndexError, ValueError):
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            return None
        except PermissionError:
            pass
        return 0


def _pid_alive(pid: int) -> bool:
    return process_start(pid) is not None   # the one liveness check (resident folders too)


def is_uri(directory: str) -> bool:
    """Whether ``directory`` is a URI (``scheme://...`` or ``file:``) rather than a local path."""
    return bool(re.match(r"^[A-Za-z][A-Za-z0-9+.\-]*://",
                         directory)) or directory.startswith("file:")


class CheckpointStore:
    """The checkpoints of one run, in one folder (see the module's docstring).

    Args:
        directory: a local or shared folder (created when needed), or a Hadoop URI
            (``hdfs://``, ``s3a://``, ``file:///``...) with ``spark`` given.
        keep: how many of the newest checkpoints to keep (a positive int).
        spark: the ``SparkSession`` whose Hadoop configuration reaches a URI ``directory``.
        stale_after: seconds after which a staging folder left by a dead writer is
            deleted by the next write (a live writer's is never older than one write).

    Raises:
        ValueError: ``keep`` not a positive int, or a URI with no ``spark``.
    """

    def __init__(self, directory: "str | os.PathLike[str]", keep: int = 3,
                 spark: "SparkSession | None" = None, stale_after: float = 3600.0) -> None:
        from sparknet._validation import positive_int

        directory = os.fspath(directory)
        if not isinstance(directory, str) or not directory:
            raise ValueError(f"checkpoint directory must be a non-empty path, got {directory!r}")
        self.keep = positive_int(keep, "keep")
        self.directory = directory
        self.stale_after = float(stale_after)
        if is_uri(directory):
            if spark is None:
                from pyspark.sql import SparkSession
                spark = SparkSession.getActiveSession()
            if spark is None:
                raise ValueError(f"checkpoint directory {directory!r} is a Hadoop URI: it needs an "
                                 "active SparkSession (pass spark=)")
            self._fs: _Local = _Hadoop(directory, spark)
        else:
            self._fs = _Local(directory)

    def __repr__(self) -> str:
        return f"CheckpointStore({self.directory!r}, keep={self.keep})"

    # -- writing -----------------------------------------------------------
    def save(self, step: int, arrays: Mapping[str, np.ndarray],
             meta: Mapping[str, Any] | None = None) -> Checkpoint:
        """Write ``arrays`` (name -> array; names of letters, digits, ``_.-``) and ``meta``
        (JSON-serialisable) as checkpoint ``step``, atomically; prune to ``keep``."""
        with self.writing(step, meta) as folder:
            for name, arr in arrays.items():
                if not _NAME.match(name):
                    raise CheckpointError(f"checkpoint array name {name!r}: use letters, digits, "
                                          "'_', '.', '-'")
                _write_npy(os.path.join(folder, name + ".npy"), arr)
        ckpt = self.get(step)
        assert ckpt is not None
        return ckpt

    @contextlib.contextmanager
    def writing(self, step: int, meta: Mapping[str, Any] | None = None) -> Iterator[str]:
        """A staging folder to write checkpoint ``step``'s files into (by the driver, or
        by executors when it is on a shared filesystem); on leaving the block the files
        are checksummed, the manifest written last, the folder put in place and older
        checkpoints pruned.  On an error nothing is published and the staging folder is
        deleted."""
        step = int(step)
        meta_json = json.loads(json.dumps(dict(meta or {})))  # fail early on non-JSON meta
        self._clean_stale()
        folder = self._fs.staging()
        try:
            yield folder
            files = {}
            for name in sorted(os.listdir(folder)):
                size, digest = sha256_file(os.path.join(folder, name))
                files[name] = {"bytes": size, "sha256": digest}
            manifest = {"format": FORMAT, "version": VERSION, "step": step, "written": time.time(),
                        "meta": meta_json, "files": files}
            tmp = os.path.join(folder, MANIFEST + ".tmp")
            with open(tmp, "w", encoding="utf-8") as fh:
                json.dump(manifest, fh, indent=1, sort_keys=True)
                fh.flush()
                os.fsync(fh.fileno())
            os.replace(tmp, os.path.join(folder, MANIFEST))
            _fsync_dir(folder)
            self._fs.publish(folder, self.name(step))
        except BaseException:
            shutil.rmtree(folder, ignore_errors=True)
            raise
        self.prune()

    @staticmethod
    def name(step: int) -> str:
        """The folder name of checkpoint ``step``."""
        return f"{_PREFIX}{int(step):012d}"

    def prune(self) -> list[str]:
        """Delete all but the newest ``keep`` checkpoints; returns the names deleted."""
        names = self._names()
        gone = names[:-self.keep] if len(names) > self.keep else []
        for n in gone:
            self._fs.delete(n)
        return gone

    def _clean_stale(self) -> None:
        for n in self._fs.stale_staging(self.stale_after):
            log.info("checkpoint store %s: removing %s left by a writer that stopped",
                     self.directory, n)
            self._fs.delete(n)

    # -- reading -----------------------------------------------------------
    def _names(self) -> list[str]:
        """Checkpoint folder names, oldest first."""
        names = [n for n in self._fs.listdir() if n.startswith(_PREFIX)
                 and n[len(_PREFIX):].isdigit()]
        return sorted(names, key=lambda n: int(n[len(_PREFIX):]))

    def _read_manifest(self, name: str) -> Checkpoint | None:
        text = self._fs.read_text(name, MANIFEST)
        if text is None:
            return None
        try:
            m = json.loads(text)
            if m.get("format") != FORMAT or int(m.get("version", 0)) > VERSION:
                raise ValueError(f"format {m.get('format')!r} version {m.get('version')!r}")
            files = {str(k): {"bytes": int(v["bytes"]), "sha256": str(v["sha256"])}
                     for k, v in m["files"].items()}
            return Checkpoint(self._fs.join(name), int(m["step"]), dict(m.get("meta") or {}), files,
                              float(m.get("written", 0.0)))
        except (ValueError, KeyError, TypeError, AttributeError) as exc:
            log.warning("checkpoint %s: unreadable manifest (%s); skipped", self._fs.join(name),
                        exc)
            return None

    def checkpoints(self) -> list[Checkpoint]:
        """Every checkpoint with a readable manifest, oldest first (files not verified)."""
        out = []
        for n in self._names():
            c = self._read_manifest(n)
            if c is not None:
                out.append(c)
        return out

    def get(self, step: int) -> Checkpoint | None:
        """Checkpoint ``step`` from its manifest, or ``None``."""
        return self._read_manifest(self.name(step))

    def verify(self, ckpt: Checkpoint) -> str | None:
        """Why ``ckpt`` cannot be trusted (a file missing, of another size or checksum),
        or ``None`` when every file matches its manifest."""
        name = os.path.basename(ckpt.path.rstrip("/"))
        with self._fs.local_copy(name) as folder:
            for f, want in ckpt.files.items():
                p = os.path.join(folder, f)
                if not os.path.isfile(p):
                    return f"{f} is missing"
                size, digest = sha256_file(p)
                if size != want["bytes"]:
                    return f"{f} has {size} bytes, the manifest says {want['bytes']}"
                if digest != want["sha256"]:
                    return f"{f} does not match its checksum"
        return None

    def latest(self, verify: bool = True) -> Checkpoint | None:
        """The newest checkpoint whose files match its manifest (``verify``), or ``None``;
        a newer partial or damaged one is skipped with a warning."""
        names = self._names()
        for n in reversed(names):
            c = self._read_manifest(n)
            if c is None:
                log.warning("checkpoint %s is incomplete (no manifest); skipped", self._fs.join(n))
                continue
            why = self.verify(c) if verify else None
            if why is not None:
                log.warning("checkpoint %s is damaged (%s); skipped", c.path, why)
                continue
            return c
        return None

    def load(self, ckpt: Checkpoint, names: "list[str] | None" = None) -> dict[str, np.ndarray]:
        """The arrays of ``ckpt`` (all, or ``names``), each checked against its manifest
        (size and checksum) and its header (shape against size) before it is read.

        Raises:
            CheckpointError: a file missing, damaged or not matching the manifest.
        """
        want = ckpt.arrays if names is None else list(names)
        out: dict[str, np.ndarray] = {}
        base = os.path.basename(ckpt.path.rstrip("/"))
        with self._fs.local_copy(base) as folder:
            for n in want:
                f = n + ".npy"
                if f not in ckpt.files:
                    raise CheckpointError(f"checkpoint {ckpt.path} has no array {n!r} (it has "
                                          f"{ckpt.arrays})")
                p = os.path.join(folder, f)
                if not os.path.isfile(p):
                    raise CheckpointError(f"checkpoint {ckpt.path}: {f} is missing")
                size, digest = sha256_file(p)
                if size != ckpt.files[f]["bytes"] or digest != ckpt.files[f]["sha256"]:
                    raise CheckpointError(f"checkpoint {ckpt.path}: {f} does not match its "
                                          "manifest (size or checksum): damaged or tampered")
                try:
                    out[n] = read_npy(p, expect_bytes=ckpt.files[f]["bytes"])
                # written so by its writer: named with its checkpoint
                except CheckpointError as exc:
                    raise CheckpointError(f"checkpoint {ckpt.path}: {exc}") from None
        return out
