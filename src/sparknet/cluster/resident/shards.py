"""The executor side of resident state (:mod:`sparknet.cluster.resident.driver`): the per-worker
store of memory-mapped shards, the :class:`Shard` a job function receives, and the
functions the anchor RDD's tasks run (build, re-attach, delete).  The driver side, and
how it all works, is :mod:`sparknet.cluster.resident.driver`.
"""
from __future__ import annotations

import os
import shutil
import socket
import threading
import time
import uuid
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Callable, Iterable, Iterator

import numpy as np

from sparknet.cluster.resident import spill as _files

if TYPE_CHECKING:
    import pyarrow as pa

#: Tag carried by the executor-side error when a shard's state is gone.
LOST_TAG = "SPARKNET_RESIDENT_LOST"
#: Spark's error when a locally checkpointed anchor block went with its executor.
CHECKPOINT_LOST = "CHECKPOINT_RDD_BLOCK_ID_NOT_FOUND"
#: Executor side: (key, partition) -> {name: ndarray (memory-mapped view)}.
_STORE: dict[tuple[str, int], dict[str, np.ndarray]] = {}
_STORE_DIRS: dict[tuple[str, int], str] = {}
_STORE_STAMPS: dict[tuple[str, int], str] = {}
_STORE_LOCK = threading.Lock()


@dataclass
class ShardInfo:
    """What the anchor RDD holds for one partition (small, picklable).

    Attributes:
        key: the :class:`Resident`'s key (unique per instance).
        index: partition index.
        host: host name of the executor that built the shard.
        directory: folder of the shard's ``.npy`` files on that host.
        shapes: ``{name: (shape, dtype str)}`` of the arrays built.
        meta: the small picklable report returned by ``build`` (a frozen dataclass such as
            :class:`~sparknet.cluster.data.shard_report.ShardReport`, or a dict).
        timing: where the building task spent its time: ``start`` (``time.time()`` when
            the builder was called: the worker had started and imported what it needs),
            ``build`` and ``spill`` (seconds of ``build`` and of writing the files).
        stamp: unique per build of this partition (a worker's store entry of an older
            build of it is stale).
        reattached: this partition's files were kept from the previous build (a
            :meth:`Resident.rebuild` that kept the shards of live executors).
    """

    key: str
    index: int
    host: str
    directory: str
    shapes: dict[str, tuple[tuple[int, ...], str]] = field(default_factory=dict)
    meta: Any = field(default_factory=dict)
    timing: dict[str, float] = field(default_factory=dict)
    stamp: str = ""
    reattached: bool = False


class Shard:
    """Executor-side handle on one partition's resident arrays."""

    def __init__(self, info: ShardInfo, arrays: dict[str, np.ndarray]) -> None:
        self.info = info
        self.index = info.index
        self.arrays = arrays
        self.meta = info.meta

    def __getitem__(self, name: str) -> np.ndarray:
        return self.arrays[name]

    def __contains__(self, name: str) -> bool:
        return name in self.arrays

    def create(self, name: str, shape: Iterable[int], dtype: Any = np.float32) -> np.ndarray:
        """Add a new zero-filled resident array (spilled and memory-mapped like the rest);
        later jobs on this partition see it and any in-place writes to it."""
        arr = _spill(self.info.directory, name, np.zeros(tuple(shape), dtype=dtype))
        self.arrays[name] = arr
        return arr

    def ensure(self, name: str, shape: Iterable[int], dtype: Any = np.float32) -> np.ndarray:
        """The resident array ``name``, created zero-filled if absent or of another shape/dtype."""
        shape = tuple(int(s) for s in shape)
        cur = self.arrays.get(name)
        if cur is None:  # created by a job that ran in another Python worker?
            cur = self.get(name)
        if cur is not None and cur.shape == shape and cur.dtype == np.dtype(dtype):
            return cur
        return self.create(name, shape, dtype)

    def get(self, name: str) -> np.ndarray | None:
        """The resident array ``name``, re-attached from its file when a job in another
        Python worker created it after this worker attached; ``None`` if it exists nowhere."""
        cur = self.arrays.get(name)
        if cur is None:
            path = os.path.join(self.info.directory, name + ".npy")
            if os.path.exists(path):
                cur = _open_npy(path)
                self.arrays[name] = cur
        return cur

    def discard(self, name: str) -> None:
        """Forget the resident array ``name`` here and delete its file (other workers
        that mapped it keep a private view until they :meth:`discard` it too)."""
        self.arrays.pop(name, None)
        try:
            os.remove(os.path.join(self.info.directory, name + ".npy"))
        except FileNotFoundError:
            pass

    def names(self) -> set[str]:
        """Names of every resident array of this shard: attached here or created on disk
        by a job in another Python worker."""
        try:
            files = {f[:-4] for f in os.listdir(self.info.directory)
                     if f.endswith(".npy") and not f.endswith(".tmp.npy")}
        except FileNotFoundError:
            files = set()
        return files | set(self.arrays)

    def allocate(self, name: str, shape: Iterable[int], dtype: Any = np.float32) -> np.ndarray:
        """Like :meth:`create`, but the zero-filled ``.npy`` file is created and mapped
        directly, without an in-memory array of its size (for blocks close to the
        worker's memory limit).  Replaces an existing file of that name."""
        shape = tuple(int(s) for s in shape)
        if int(np.prod(shape)) == 0:
            return self.create(name, shape, dtype)
        os.makedirs(self.info.directory, exist_ok=True)
        path = os.path.join(self.info.directory, name + ".npy")
        tmp = f"{path}.{os.getpid()}.tmp.npy"
        mm = np.lib.format.open_memmap(tmp, mode="w+", dtype=np.dtype(dtype), shape=shape)
        del mm
        os.replace(tmp, path)
        arr = _open_npy(path)
        self.arrays[name] = arr
        return arr


# --------------------------------------------------------------------------- executor side
_spill = _files.spill
_open_npy = _files.open_npy
_load_dir = _files.load_dir


def _evict_stale() -> None:
    """Drop store entries whose files were deleted (their Resident was closed)."""
    for k, d in list(_STORE_DIRS.items()):
        if not os.path.isdir(d):
            _forget(k)


def _forget(k: tuple[str, int]) -> None:
    _STORE.pop(k, None)
    _STORE_DIRS.pop(k, None)
    _STORE_STAMPS.pop(k, None)


def _register(k: tuple[str, int], arrays: dict[str, np.ndarray], info: ShardInfo) -> None:
    _STORE[k], _STORE_DIRS[k], _STORE_STAMPS[k] = arrays, info.directory, info.stamp


def attach(info: ShardInfo) -> Shard:
    """Executor side: the :class:`Shard` for ``info`` from this worker's store, or
    re-attached from its spill files; raises an error tagged ``SPARKNET_RESIDENT_LOST``
    when neither exists (never returns missing data)."""
    k = (info.key, info.index)
    with _STORE_LOCK:
        _evict_stale()
        arrays = _STORE.get(k)
        if arrays is not None and _STORE_STAMPS.get(k) != info.stamp:  # an older build of it
            _forget(k)
            arrays = None
        if arrays is None:
            arrays = _load_dir(info.directory)
            if arrays is None or not set(info.shapes) <= set(arrays):
                raise RuntimeError(
                    f"{LOST_TAG}: resident state {info.key!r} partition {info.index} is gone "
                    f"(built on host {info.host!r}, this task runs on {socket.gethostname()!r}; "
                    f"files {info.directory!r} missing)")
            _register(k, arrays, info)
    _files.touch(os.path.dirname(info.directory))
    return Shard(info, arrays)


@dataclass(frozen=True)
class StoreEntry:
    """One shard held in a Python worker's store (see :func:`store_entries`).

    Attributes:
        directory: the folder of the shard's ``.npy`` files on this host.
        stamp: the build of the shard the entry is of (:attr:`ShardInfo.stamp`).
        names: the names of the arrays attached in this worker, sorted.
    """

    directory: str
    stamp: str
    names: tuple[str, ...]


def store_entries() -> dict[tuple[str, int], StoreEntry]:
    """Executor side: the shards this Python worker's store holds, ``(key, partition) ->``
    :class:`StoreEntry` (a copy: later jobs do not change it).  A job function finds its
    own shard there once :func:`attach` registered it."""
    with _STORE_LOCK:
        return {k: StoreEntry(_STORE_DIRS.get(k, ""), _STORE_STAMPS.get(k, ""),
                              tuple(sorted(arrays)))
                for k, arrays in _STORE.items()}


def clear_store() -> int:
    """Executor side: forget every shard this Python worker's store holds, as a Python
    worker that Spark restarted has none; the spill files stay, so the next job on each
    shard re-attaches from them.  Returns how many shards were forgotten."""
    with _STORE_LOCK:
        keys = list(_STORE)
        for k in keys:
            _forget(k)
    return len(keys)


def drop_local(key: str, base: str | None = None) -> int:
    """Executor side: forget and delete every shard of ``key`` on this host (the whole
    ``sparknet-resident-<key>`` folder under every spill base, so also the shards that
    an executor lost since built here)."""
    with _STORE_LOCK:
        for k in [k for k in _STORE if k[0] == key]:
            _forget(k)
        return _files.remove_key(key, base)


class ShardBuilder:
    """The anchor RDD's partition function: build, spill, register, yield one ShardInfo.
    A partition in ``keep`` whose files are on this host is re-attached instead (its
    arrays, optimizer state included, stay as they were)."""

    def __init__(self, key: str, build: Callable, base: str | None, owner: _files.Owner,
                 keep: dict[int, ShardInfo] | None = None) -> None:
        self.key, self.build, self.base, self.owner = key, build, base, owner
        self.keep = dict(keep or {})

    def _reattach(self, index: int, iterator: Iterable) -> ShardInfo | None:
        old = self.keep.get(index)
        if old is None or old.host != socket.gethostname():
            return None
        arrays = _load_dir(old.directory)
        if arrays is None or not set(old.shapes) <= set(arrays):
            return None
        for _ in iterator:  # drain, so the worker can be reused
            pass
        info = ShardInfo(old.key, index, old.host, old.directory, dict(old.shapes), _own(old.meta),
                         {"start": time.time(), "build": 0.0, "spill": 0.0}, old.stamp, True)
        with _STORE_LOCK:
            _register((self.key, index), arrays, info)
        return info

    def make(self, index: int, iterator: Iterable) -> ShardInfo:
        _files.sweep_stale(self.owner.app_id, self.base)
        kept = self._reattach(index, iterator)
        if kept is not None:
            return kept
        start, t0 = time.time(), time.perf_counter()
        out = self.build(index, iterator)
        for _ in iterator:  # drain, so the worker can be reused
            pass
        arrays, meta = (out if isinstance(out, tuple) else (out, {}))
        if not isinstance(arrays, dict):
            raise TypeError("build must return a dict of arrays (or (dict, meta)), got "
                            f"{type(arrays).__name__}")
        nbytes = sum(int(np.asarray(a).nbytes) for a in arrays.values())
        base = self.base or _files.spill_base(nbytes)
        folder = os.path.join(base, _files.PREFIX + self.key)
        _files.write_owner(folder, self.owner)
        directory = os.path.join(folder, f"part-{index:05d}")
        shutil.rmtree(directory, ignore_errors=True)
        t1 = time.perf_counter()
        spilled = {name: _spill(directory, name, np.asarray(a)) for name, a in arrays.items()}
        shapes = {n: (tuple(a.shape), a.dtype.str) for n, a in spilled.items()}
        timing = {"start": start, "build": t1 - t0, "spill": time.perf_counter() - t1}
        info = ShardInfo(self.key, index, socket.gethostname(), directory, shapes, _own(meta),
                         timing, uuid.uuid4().hex[:12])
        with _STORE_LOCK:
            _register((self.key, index), spilled, info)
        return info

    def __call__(self, index: int, iterator: Iterable) -> Iterator[ShardInfo]:
        yield self.make(index, iterator)


def arrow_builder(builder: ShardBuilder) -> Callable[[Iterator], Iterator["pa.RecordBatch"]]:
    """A ``mapInArrow`` function that builds the shard of the task's partition from its
    record batches and emits one row holding the pickled :class:`ShardInfo`."""

    def run(batches: Iterator) -> Iterator["pa.RecordBatch"]:
        import pickle

        import pyarrow as pa
        from pyspark import TaskContext

        tc = TaskContext.get()
        if tc is None:  # pragma: no cover - only ever called inside a Spark task
            raise RuntimeError("the resident shard builder runs inside a Spark task")
        index = tc.partitionId()
        info = builder.make(index, batches)
        yield pa.RecordBatch.from_pydict({"info": [pickle.dumps(info)]},
                                         schema=pa.schema([("info", pa.binary())]))
    return run


class Dropper:
    """An executor job that deletes this host's shards of ``key`` (:func:`drop_local`)."""

    def __init__(self, key: str, base: str | None = None) -> None:
        self.key, self.base = key, base

    def __call__(self, iterator: Iterable) -> Iterator[int]:
        for _ in iterator:
            pass
        return iter([drop_local(self.key, self.base)])


def as_info(item: Any) -> ShardInfo:
    """An anchor record: a :class:`ShardInfo`, or the DataFrame row holding it pickled
    (what :meth:`Resident.from_dataframe`'s Arrow stage emits)."""
    if isinstance(item, ShardInfo):
        return item
    import pickle
    return pickle.loads(item[0])


class ShardTask:
    """Wraps a job function: drain the anchor iterator, attach, call ``fn``."""

    def __init__(self, fn: Callable, per_partition: bool) -> None:
        self.fn, self.per_partition = fn, per_partition

    def __call__(self, index: int, iterator: Iterable[ShardInfo]) -> Iterable:
        infos = [as_info(item) for item in iterator]
        if len(infos) != 1:
            raise RuntimeError(f"anchor partition {index} holds {len(infos)} shard records, "
                               "expected 1")
        shard = attach(infos[0])
        out = self.fn(index, shard)
        if self.per_partition:
            return out if out is not None else iter(())
        return iter([out])


def _own(meta: Any) -> Any:
    """A build's report kept by its shard: a dict copied, anything else (a frozen
    dataclass) as it is."""
    return dict(meta) if isinstance(meta, dict) else meta
