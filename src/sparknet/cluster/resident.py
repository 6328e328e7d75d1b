"""Per-partition numpy state that stays resident on Spark executors across jobs.

This is the one residency mechanism of :mod:`sparknet.cluster`: data-parallel training
keeps each partition's training shard (and that partition's optimizer state) here, and
model-parallel training keeps its weight blocks here.  Nothing is re-read or
re-deserialised per job.

How it works
------------
* **Anchor RDD.**  :class:`Resident` runs ``build(index, iterator)`` once per partition
  of a source RDD (or a DataFrame through Arrow, see :meth:`Resident.from_dataframe`).
  The resulting RDD holds one tiny :class:`ShardInfo` per partition; it is persisted
  and materialised, so every later job over it has a ``PROCESS_LOCAL`` preference for
  the executor that built the shard (Spark's block manager remembers where the cached
  partition lives).  Raise ``spark.locality.wait.process`` (see
  :func:`sparknet.cluster.session.get_spark`) so a briefly busy home executor does not
  lose its task to another executor.
* **Module-global store.**  In the Python worker, the arrays live in a module-global
  dict keyed by ``(key, partition)``; Python workers are reused between jobs (tasks
  always drain their input iterator, which is what lets Spark reuse the worker).
* **Spill files, memory-mapped.**  Every array is also written once as ``.npy`` under
  ``/dev/shm`` (or, when shared memory is small, the executor's local directory) and
  the store holds the ``mmap_mode="r+"`` view of that file.  So the bytes exist once
  per host, writes made by one job (optimizer state, weight blocks) are seen by the
  next job whichever Python worker runs it, and a worker that Spark restarted (it kills
  Python workers idle for ~60 s) re-attaches in milliseconds.
* **Never silently missing.**  When a task finds neither the store entry nor the spill
  files (its executor host changed, or the files were removed) it raises an error
  tagged ``SPARKNET_RESIDENT_LOST``.  On the driver, :meth:`Resident.map` and
  :meth:`Resident.run_action` turn that into :class:`ResidentStateLost`, or, with
  ``on_lost="rebuild"``, re-run ``build`` from the source (right for data shards,
  whose source is the truth) and retry the job once.

Executor-side API
-----------------
A job function receives ``(index, shard)`` where ``shard`` is a :class:`Shard`:
``shard.arrays`` (dict of name -> ndarray, writable in place), ``shard.meta`` (the
dict ``build`` returned), ``shard.create(name, shape, dtype)`` to add a new resident
array (zero-filled, spilled like the others) and ``shard.ensure(...)`` to get-or-create.

Example::

    def build(index, rows):                      # runs once per partition
        x = np.asarray(list(rows), dtype=np.float64)
        return {"x": x}, {"rows": len(x)}        # arrays, and small picklable meta

    res = Resident(sc.parallelize(range(100), 4), build, name="demo")
    sums = res.map(lambda i, shard: float(shard.arrays["x"].sum()))   # one value per partition
    res.close()                                  # deletes the files, unpersists the anchor

The ``fn`` passed to :meth:`Resident.map` / :meth:`Resident.mapPartitions` travels
with the job (cloudpickle); keep big inputs in a ``Broadcast`` and read it inside.
"""
from __future__ import annotations

import atexit
import logging
import os
import shutil
import socket
import tempfile
import threading
import time
import uuid
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Callable, Iterable, Iterator

import numpy as np

if TYPE_CHECKING:
    import pyarrow as pa
    from pyspark import RDD
    from pyspark.sql import DataFrame

log = logging.getLogger(__name__)

#: Tag carried by the executor-side error when a shard's state is gone.
LOST_TAG = "SPARKNET_RESIDENT_LOST"
#: Spark's error when a locally checkpointed anchor block went with its executor.
_CHECKPOINT_LOST = "CHECKPOINT_RDD_BLOCK_ID_NOT_FOUND"


def lost_reason(exc: BaseException) -> str | None:
    """Why a job failed because resident state is gone (a shard's files or store entry,
    or the executor holding its anchor block), or None for any other failure."""
    text = str(exc)
    if LOST_TAG in text:
        line = next((ln for ln in text.splitlines() if LOST_TAG in ln), LOST_TAG)
        return line.strip().split(f"{LOST_TAG}: ", 1)[-1]
    if _CHECKPOINT_LOST in text or ("Checkpoint block" in text and "not found" in text):
        return "the executor holding a shard's anchor block is gone"
    return None

#: Executor side: (key, partition) -> {name: ndarray (memory-mapped view)}.
_STORE: dict[tuple[str, int], dict[str, np.ndarray]] = {}
_STORE_DIRS: dict[tuple[str, int], str] = {}
_STORE_LOCK = threading.Lock()

_SHM = "/dev/shm"
_SHM_HEADROOM = 256 << 20


class ResidentStateLost(RuntimeError):
    """A partition's resident state was found neither in its worker nor on disk."""


@dataclass
class ShardInfo:
    """What the anchor RDD holds for one partition (small, picklable).

    Attributes:
        key: the :class:`Resident`'s key (unique per instance).
        index: partition index.
        host: host name of the executor that built the shard.
        directory: folder of the shard's ``.npy`` files on that host.
        shapes: ``{name: (shape, dtype str)}`` of the arrays built.
        meta: the small dict returned by ``build`` (row counts, checks, ...).
        timing: where the building task spent its time: ``start`` (``time.time()`` when
            the builder was called: the worker had started and imported what it needs),
            ``build`` and ``spill`` (seconds of ``build`` and of writing the files).
    """

    key: str
    index: int
    host: str
    directory: str
    shapes: dict[str, tuple[tuple[int, ...], str]] = field(default_factory=dict)
    meta: dict[str, Any] = field(default_factory=dict)
    timing: dict[str, float] = field(default_factory=dict)


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
def _spill_base(nbytes: int) -> str:
    """Where to put spill files: /dev/shm when it has room, else the executor's local dir."""
    try:
        if os.path.isdir(_SHM) and shutil.disk_usage(_SHM).free > 2 * nbytes + _SHM_HEADROOM:
            return _SHM
    except OSError:  # pragma: no cover - exotic filesystems
        pass
    local = os.environ.get("SPARK_LOCAL_DIRS", "").split(",")[0]
    if local and os.path.isdir(local):
        return local
    return tempfile.gettempdir()


def _spill(directory: str, name: str, arr: np.ndarray) -> np.ndarray:
    """Write ``arr`` atomically as ``directory/name.npy`` and return its r+ memory map."""
    os.makedirs(directory, exist_ok=True)
    path = os.path.join(directory, name + ".npy")
    tmp = os.path.join(directory, f"{name}.{os.getpid()}.tmp.npy")
    np.save(tmp, np.ascontiguousarray(arr), allow_pickle=False)
    os.replace(tmp, path)
    return _open_npy(path)


def _open_npy(path: str) -> np.ndarray:
    """The ``.npy`` file at ``path`` memory-mapped read-write (``r+``), so in-place writes
    reach the file; an empty array is read into memory instead (there is nothing to map)."""
    if np.load(path, mmap_mode="r", allow_pickle=False).size == 0:
        return np.load(path, allow_pickle=False)
    return np.load(path, mmap_mode="r+", allow_pickle=False)


def _load_dir(directory: str) -> dict[str, np.ndarray] | None:
    if not os.path.isdir(directory):
        return None
    out = {}
    for fname in os.listdir(directory):
        if fname.endswith(".npy") and not fname.endswith(".tmp.npy"):
            out[fname[:-4]] = _open_npy(os.path.join(directory, fname))
    return out


def _evict_stale() -> None:
    """Drop store entries whose files were deleted (their Resident was closed)."""
    for k, d in list(_STORE_DIRS.items()):
        if not os.path.isdir(d):
            _STORE.pop(k, None)
            _STORE_DIRS.pop(k, None)


def attach(info: ShardInfo) -> Shard:
    """Executor side: the :class:`Shard` for ``info`` from this worker's store, or
    re-attached from its spill files; raises an error tagged ``SPARKNET_RESIDENT_LOST``
    when neither exists (never returns missing data)."""
    k = (info.key, info.index)
    with _STORE_LOCK:
        _evict_stale()
        arrays = _STORE.get(k)
        if arrays is None:
            arrays = _load_dir(info.directory)
            if arrays is None or not set(info.shapes) <= set(arrays):
                raise RuntimeError(
                    f"{LOST_TAG}: resident state {info.key!r} partition {info.index} is gone "
                    f"(built on host {info.host!r}, this task runs on {socket.gethostname()!r}; "
                    f"files {info.directory!r} missing)")
            _STORE[k] = arrays
            _STORE_DIRS[k] = info.directory
    return Shard(info, arrays)


def _drop_local(key: str) -> int:
    """Executor side: forget and delete every shard of ``key`` on this host."""
    removed = 0
    with _STORE_LOCK:
        for k in [k for k in _STORE if k[0] == key]:
            _STORE.pop(k, None)
            d = _STORE_DIRS.pop(k, None)
            if d and os.path.isdir(d):
                shutil.rmtree(d, ignore_errors=True)
                removed += 1
    return removed


class _Builder:
    """The anchor RDD's partition function: build, spill, register, yield one ShardInfo."""

    def __init__(self, key: str, build: Callable, base: str | None) -> None:
        self.key, self.build, self.base = key, build, base

    def make(self, index: int, iterator: Iterable) -> ShardInfo:
        start, t0 = time.time(), time.perf_counter()
        out = self.build(index, iterator)
        for _ in iterator:  # drain, so the worker can be reused
            pass
        arrays, meta = (out if isinstance(out, tuple) else (out, {}))
        if not isinstance(arrays, dict):
            raise TypeError(f"build must return a dict of arrays (or (dict, meta)), got {type(arrays).__name__}")
        nbytes = sum(int(np.asarray(a).nbytes) for a in arrays.values())
        base = self.base or _spill_base(nbytes)
        directory = os.path.join(base, f"sparknet-resident-{self.key}", f"part-{index:05d}")
        shutil.rmtree(directory, ignore_errors=True)
        t1 = time.perf_counter()
        spilled = {name: _spill(directory, name, np.asarray(a)) for name, a in arrays.items()}
        with _STORE_LOCK:
            _STORE[(self.key, index)] = spilled
            _STORE_DIRS[(self.key, index)] = directory
        shapes = {n: (tuple(a.shape), a.dtype.str) for n, a in spilled.items()}
        timing = {"start": start, "build": t1 - t0, "spill": time.perf_counter() - t1}
        return ShardInfo(self.key, index, socket.gethostname(), directory, shapes, dict(meta), timing)

    def __call__(self, index: int, iterator: Iterable) -> Iterator[ShardInfo]:
        yield self.make(index, iterator)


def _arrow_builder(key: str, build: Callable, base: str | None) -> Callable[[Iterator], Iterator["pa.RecordBatch"]]:
    """A ``mapInArrow`` function that builds the shard of the task's partition from its
    record batches and emits one row holding the pickled :class:`ShardInfo`."""
    builder = _Builder(key, build, base)

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


class _Dropper:
    def __init__(self, key: str) -> None:
        self.key = key

    def __call__(self, iterator: Iterable) -> Iterator[int]:
        for _ in iterator:
            pass
        return iter([_drop_local(self.key)])


def _as_info(item: Any) -> ShardInfo:
    """An anchor record: a :class:`ShardInfo`, or the DataFrame row holding it pickled
    (what :meth:`Resident.from_dataframe`'s Arrow stage emits)."""
    if isinstance(item, ShardInfo):
        return item
    import pickle
    return pickle.loads(item[0])


class _Task:
    """Wraps a job function: drain the anchor iterator, attach, call ``fn``."""

    def __init__(self, fn: Callable, per_partition: bool) -> None:
        self.fn, self.per_partition = fn, per_partition

    def __call__(self, index: int, iterator: Iterable[ShardInfo]) -> Iterable:
        infos = [_as_info(item) for item in iterator]
        if len(infos) != 1:
            raise RuntimeError(f"anchor partition {index} holds {len(infos)} shard records, expected 1")
        shard = attach(infos[0])
        out = self.fn(index, shard)
        if self.per_partition:
            return out if out is not None else iter(())
        return iter([out])


# ---------------------------------------------------------------------------- driver side
_OPEN: "set[Resident]" = set()


class Resident:
    """Per-partition numpy state built once and kept on the executors across Spark jobs.

    Args:
        rdd: the source RDD; the state has one shard per partition of it.
        build: ``build(index, iterator) -> dict[str, ndarray]`` or
            ``-> (dict[str, ndarray], meta_dict)``, run once per partition on the
            executors; ``meta`` must be small and picklable (it comes back to the driver
            as :attr:`infos`).  It may leave the iterator undrained; it is drained for it.
        name: a readable prefix for the key and the spill folders.
        on_lost: ``"raise"`` (default) raises :class:`ResidentStateLost` when a job finds
            a shard gone; ``"rebuild"`` re-runs ``build`` from ``rdd`` and retries the
            job once (right when the source is the truth, e.g. training data).
        spill_dir: folder for the ``.npy`` files; default ``/dev/shm`` when it has room
            for twice the shard, else the executor's local directory.
        cut_lineage: for an RDD source, ``localCheckpoint`` the anchor (default): a
            ``parallelize`` source keeps its rows in its partitions, which every later
            task would carry.  A lost anchor block is then lost state (see ``on_lost``);
            with ``False`` Spark re-runs ``build`` for it wherever it is scheduled (for
            tiny sources whose shards re-attach from their host's files).

    Raises:
        TypeError: ``build`` returned something other than a dict of arrays.

    Attributes:
        key: unique key of this state in the executors' stores.
        infos: the :class:`ShardInfo` of every partition, in partition order.
        anchor: the persisted anchor RDD (one :class:`ShardInfo` per partition).
    """

    def __init__(self, rdd: "RDD | None", build: Callable, name: str = "state", on_lost: str = "raise",
                 spill_dir: str | None = None, cut_lineage: bool = True,
                 _arrow_df: "DataFrame | None" = None) -> None:
        if on_lost not in ("raise", "rebuild"):
            raise ValueError(f"on_lost must be 'raise' or 'rebuild', got {on_lost!r}")
        self.key = f"{name}-{uuid.uuid4().hex[:12]}"
        self._rdd, self._df, self._build = rdd, _arrow_df, build
        self.on_lost, self.spill_dir, self.cut_lineage = on_lost, spill_dir, bool(cut_lineage)
        if rdd is not None:
            self.sc = rdd.context
        elif _arrow_df is not None:
            self.sc = _arrow_df.sparkSession.sparkContext
        else:
            raise ValueError("Resident needs a source: an RDD (or from_dataframe's DataFrame)")
        self.anchor: RDD[Any] | None = None
        self.infos: list[ShardInfo] = []
        #: ``time.time()`` when the last build job was submitted, and its wall seconds.
        self.build_started, self.build_seconds = 0.0, 0.0
        self._materialise()
        _OPEN.add(self)

    @classmethod
    def from_dataframe(cls, df: "DataFrame", build: Callable, name: str = "state", on_lost: str = "raise",
                       spill_dir: str | None = None) -> "Resident":
        """Build the shards from a DataFrame's partitions through Arrow (``mapInArrow``):
        ``build(index, batches)`` receives an iterator of ``pyarrow.RecordBatch``."""
        return cls(None, build, name=name, on_lost=on_lost, spill_dir=spill_dir, _arrow_df=df)

    # -- lifecycle ---------------------------------------------------------
    def _materialise(self) -> None:
        from pyspark import StorageLevel

        anchor: RDD[Any]
        if self._df is not None:
            func = _arrow_builder(self.key, self._build, self.spill_dir)
            # the Python map behind the Arrow stage starts the executors' other Python
            # daemon (plain RDD tasks, as every later round is) alongside the Arrow one
            anchor = self._df.mapInArrow(func, "info binary").rdd.map(_as_info, preservesPartitioning=True)
        else:
            assert self._rdd is not None  # __init__ took an RDD or a DataFrame
            anchor = self._rdd.mapPartitionsWithIndex(_Builder(self.key, self._build, self.spill_dir),
                                                      preservesPartitioning=True)
        anchor.persist(StorageLevel.MEMORY_ONLY)
        if self._df is None and self.cut_lineage:
            # Cut the lineage: a ``parallelize`` source keeps its rows in its partition
            # objects, which every later task would otherwise carry (and the JVM
            # re-serialise) each round.  Lost blocks are then reported, not recomputed.
            anchor.localCheckpoint()
        anchor.setName(f"sparknet resident {self.key}")
        self.build_started, t0 = time.time(), time.perf_counter()
        self.infos = [_as_info(item) for item in anchor.collect()]
        self.build_seconds = time.perf_counter() - t0
        self.anchor = anchor
        log.debug("resident %s: %d shards on %s", self.key, len(self.infos),
                  sorted({i.host for i in self.infos}))

    @property
    def num_partitions(self) -> int:
        return len(self.infos)

    def build_phases(self) -> dict[str, float]:
        """The last build job's seconds, from its last task to finish: until that task's
        builder ran (``start``: scheduling, the Python worker's start and imports), in
        ``build``, in ``spill``, and the ``rest`` (results back, the job's end)."""
        timed = [i for i in self.infos if i.timing]
        if not timed:
            return {"rest": self.build_seconds}
        tm = max(timed, key=lambda i: i.timing["start"] + i.timing["build"] + i.timing["spill"]).timing
        start = min(max(tm["start"] - self.build_started, 0.0), self.build_seconds)
        rest = max(self.build_seconds - start - tm["build"] - tm["spill"], 0.0)
        return {"start": start, "build": tm["build"], "spill": tm["spill"], "rest": rest}

    def rebuild(self) -> None:
        """Drop every shard and build them again from the source."""
        log.warning("resident state %s: rebuilding all %d shards from the source", self.key,
                    len(self.infos))
        self._cleanup_files()
        self._materialise()

    def close(self) -> None:
        """Delete the spill files and store entries on every host, unpersist the anchor."""
        if self.anchor is None:
            return
        self._cleanup_files()
        _OPEN.discard(self)

    def _cleanup_files(self) -> None:
        key, anchor = self.key, self.anchor
        if anchor is None:
            return
        try:
            anchor.mapPartitions(_Dropper(key)).collect()
        except Exception as exc:  # pragma: no cover - executors already gone
            log.debug("resident %s: executor cleanup failed: %s", key, exc)
        _remove_driver_files(self.infos)
        _drop_local(key)
        try:
            anchor.unpersist()
        except Exception:  # pragma: no cover - context stopped
            pass
        self.anchor = None

    def __enter__(self) -> "Resident":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # -- jobs --------------------------------------------------------------
    def mapPartitions(self, fn: Callable[[int, Shard], Iterable]) -> "RDD":
        """A lazy RDD running ``fn(index, shard) -> iterable`` on each partition's shard
        (use it with any action: ``collect``, ``treeAggregate``, ``foreach`` with an
        accumulator...).  Wrap the action in :meth:`run_action` for lost-state handling."""
        return self._live_anchor().mapPartitionsWithIndex(_Task(fn, per_partition=True),
                                                          preservesPartitioning=True)

    def _live_anchor(self) -> "RDD[Any]":
        if self.anchor is None:
            raise RuntimeError(f"resident state {self.key} is closed")
        return self.anchor

    def run_action(self, action: Callable[[], Any], retry: bool = True) -> Any:
        """Run ``action()`` (a Spark action over :meth:`mapPartitions` RDDs), turning an
        executor's lost-state error into :class:`ResidentStateLost` or, with
        ``on_lost="rebuild"``, rebuilding and running ``action()`` once more."""
        try:
            return action()
        except ResidentStateLost:
            raise
        except Exception as exc:
            reason = lost_reason(exc)
            if reason is None:
                raise
            if self.on_lost == "rebuild" and retry:
                log.warning("resident state %s lost (%s); rebuilding", self.key, reason)
                self.rebuild()
                return self.run_action(action, retry=False)
            raise ResidentStateLost(reason) from None

    def map(self, fn: Callable[[int, Shard], Any], description: str | None = None) -> list:
        """Run ``fn(index, shard)`` once per partition and return the results in
        partition order (a ``collect``; results should be small or param-sized)."""
        def job() -> list:
            rdd = self._live_anchor().mapPartitionsWithIndex(_Task(fn, per_partition=False),
                                                             preservesPartitioning=True)
            if description:
                self.sc.setJobDescription(description)
            try:
                return rdd.collect()
            finally:
                if description:
                    self.sc.setJobDescription(None)  # type: ignore[arg-type]  # None clears it; the stub says str
        return self.run_action(job)


@atexit.register
def _close_all() -> None:  # pragma: no cover - interpreter shutdown
    for res in list(_OPEN):
        _remove_driver_files(res.infos)


def _remove_driver_files(infos: list[ShardInfo]) -> None:
    """Delete the spill folders of the shards built on this (the driver's) host (local mode)."""
    for info in infos:
        if info.host == socket.gethostname():
            shutil.rmtree(os.path.dirname(info.directory), ignore_errors=True)
