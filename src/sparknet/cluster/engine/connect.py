"""The Spark Connect side of the seam (:mod:`sparknet.cluster.engine.base`): resident shards,
rounds and the parameters with no ``SparkContext``, RDD, broadcast or accumulator.

* **Anchor.**  :class:`ConnectResident` builds each partition's shard with a
  ``mapInArrow`` over the source DataFrame (the same builder as on Classic,
  :class:`~sparknet.cluster.resident.shards.ShardBuilder`), which emits one row per partition: its
  pickled :class:`~sparknet.cluster.resident.shards.ShardInfo`.  That one-row-per-partition
  DataFrame is ``localCheckpoint`` ed (eagerly): the rows live in the executors' block
  managers, later queries over it do not run the build again, and their tasks prefer
  the executor holding each row, as the Classic anchor RDD's do.
* **Rounds.**  A job is a ``mapInArrow`` over the anchor.  Its task attaches the
  shard (the worker's store, else the host's memory-mapped spill files: the Python
  worker a partition's task runs in may change from job to job, the host's files do
  not) and returns each result as one pickled Arrow ``binary`` row, collected on the
  client and summed there.
* **Parameters.**  What Classic broadcasts travels inside the query's function
  (:class:`InClosure`).  A query is one gRPC message, limited by the server's
  ``spark.connect.grpc.maxInboundMessageSize`` (128 MiB by default):
  :data:`MAX_CLOSURE_BYTES` is what a query's function carries; a larger value goes as
  :class:`InRows`, :data:`CHUNK_BYTES` pieces broadcast by a join.
* **Cancelling.**  Jobs carry session tags (``SparkSession.addTag``); a round past its
  timeout, or a fit interrupted, is stopped with ``interruptTag``.
* **Asynchronous rounds** (:meth:`ConnectResident.run_partition`) are one query per
  partition, each from its own client thread under that partition's tag; **model-
  parallel block jobs** are queries over a one-row-per-slot anchor
  (:class:`~sparknet.cluster.model_parallel.SparkBlocks`).

Numpy input is cut on the client as on Classic (the same seeded split) and sent as a
local DataFrame of pickled chunks, ``repartitionByRange`` d by piece so that partition
``i`` gets piece ``i`` (checked: every shard says which piece it holds).
"""
from __future__ import annotations

import functools
import logging
import pickle
import threading
import time
import uuid
import weakref
from typing import TYPE_CHECKING, Any, Callable, Iterable, Iterator, TypeVar

from sparknet.cluster.engine.sizes import nbytes
from sparknet.cluster.resident.driver import (
    Resident,
    ResidentStateLost,
    lost_reason,
    track_open,
)
from sparknet.cluster.resident.shards import (
    ShardBuilder,
    ShardInfo,
    ShardTask,
    arrow_builder,
    as_info,
    drop_local,
)
from sparknet.errors import RoundTimeout

if TYPE_CHECKING:
    from pyspark.sql import DataFrame, SparkSession

log = logging.getLogger(__name__)

#: what a round's tasks send back (summed by the engine's ``gather``)
T = TypeVar("T")

#: Bytes a query's function may carry (parameters, optimizer state): under the default
#: 128 MiB gRPC message limit of a Connect server, with room for the rest of the plan.
MAX_CLOSURE_BYTES = 100 << 20
#: Bytes of numpy input per row of the local DataFrame that carries it to the server.
CHUNK_BYTES = 8 << 20


class InClosure:
    """A value carried inside the query's function (Connect has no broadcast)."""

    def __init__(self, value: Any) -> None:
        size = nbytes(value)
        if size > MAX_CLOSURE_BYTES:
            raise ValueError(f"{size / 2**20:.0f} MiB to send with every round is over what a "
                             f"Spark Connect query carries ({MAX_CLOSURE_BYTES >> 20} MiB under "
                             f"the server's spark.connect.grpc.maxInboundMessageSize of 128 MiB); "
                             f"use a Classic session (a SparkContext) for a model this large")
        self.value = value

    def unpersist(self) -> None:
        """Nothing to release: the value went with the query."""

    def destroy(self, blocking: bool = False) -> None:
        """Nothing to release: the value went with the query."""


class InRows:
    """A value past :data:`MAX_CLOSURE_BYTES`, too large for a query's function: sent once
    as a local DataFrame of :data:`CHUNK_BYTES` pieces of its pickle (pyspark uploads a
    local relation past ``spark.sql.session.localRelationCacheThreshold`` as a cached
    artifact, in chunks, and the plans refer to it by hash).  A job whose function holds
    one (:class:`ConnectJob`) cross-joins the anchor with those pieces under a broadcast
    hint: Spark broadcasts them to the executors and keeps the anchor's partitions, and
    each task reassembles the value before it runs."""

    def __init__(self, spark: "SparkSession", value: Any) -> None:
        from pyspark.sql.types import BinaryType, LongType, StringType, StructField, StructType

        self.key, self.value = uuid.uuid4().hex, value
        blob = pickle.dumps(value, protocol=pickle.HIGHEST_PROTOCOL)
        rows = [(self.key, i, blob[o:o + CHUNK_BYTES])
                for i, o in enumerate(range(0, len(blob), CHUNK_BYTES))]
        schema = StructType([StructField("key", StringType()), StructField("piece", LongType()),
                             StructField("blob", BinaryType())])
        self.frame: Any = spark.createDataFrame(rows, schema)
        _ALIVE.add(self)

    def __reduce__(self) -> tuple:
        found = getattr(_FOUND, "rows", None)
        if found is not None:
            found.append(self)
        return (_RowsValue, (self.key,))

    def unpersist(self) -> None:
        """Let the pieces go (the next jobs carry a newer value)."""
        self.frame = None
        _ALIVE.discard(self)

    def destroy(self, blocking: bool = False) -> None:
        self.unpersist()


class _RowsValue:
    """An :class:`InRows` on the executor: its value, reassembled by the task."""

    def __init__(self, key: str) -> None:
        self.key = key

    @property
    def value(self) -> Any:
        try:
            return _ROWS_VALUES[self.key]
        except KeyError:
            raise RuntimeError(f"a shipped value ({self.key}) did not reach this task: the job's "
                               f"query was not joined with its pieces") from None


_ALIVE: "weakref.WeakSet[InRows]" = weakref.WeakSet()
_FOUND = threading.local()
_ROWS_VALUES: dict[str, Any] = {}  # executor side: the values of the running task


def _rows_in(fn: Any) -> list[InRows]:
    """The :class:`InRows` values ``fn`` holds (found by pickling it, as the query will)."""
    if not _ALIVE:
        return []
    from pyspark import cloudpickle

    _FOUND.rows = []
    try:
        cloudpickle.dumps(fn)
        return list({id(r): r for r in _FOUND.rows}.values())
    finally:
        _FOUND.rows = None


class ConnectEngine:
    """:class:`~sparknet.cluster.engine.base.Engine` over a Spark Connect session."""

    kind = "connect"
    #: a Connect client has no SparkContext
    sc = None

    def __init__(self, spark: "SparkSession") -> None:
        self.spark = spark
        self._parallelism: int | None = None

    @functools.cached_property
    def app_id(self) -> str:
        """The server's application id (asked once: a round trip)."""
        return str(self.conf("spark.app.id") or f"connect-{id(self.spark):x}")

    @classmethod
    def of(cls, spark: "SparkSession") -> "ConnectEngine":
        """The engine of ``spark``, made once per session (what it learns from the server,
        a round trip each, it keeps)."""
        engine = _ENGINES.get(spark)
        if engine is None:
            engine = _ENGINES[spark] = cls(spark)
        return engine

    def default_parallelism(self) -> int:
        if self._parallelism is None:
            from pyspark.sql.connect.functions import spark_partition_id

            # the partitions of a range without a count are the server's default parallelism
            ids = self.spark.range(1 << 12).select(spark_partition_id().alias("p"))
            self._parallelism = int(ids.distinct().count())
        return self._parallelism

    def conf(self, key: str, default: str | None = None) -> str | None:
        try:
            return self.spark.conf.get(key, default)
        except Exception:  # a setting the server does not show to clients
            return default

    def describe(self, text: str | None) -> None:
        """Connect queries carry no job description (their tags name them)."""

    def ship(self, value: Any) -> "InClosure | InRows":
        """``value`` in the next queries' functions (:class:`InClosure`), or past
        :data:`MAX_CLOSURE_BYTES` as broadcast pieces (:class:`InRows`)."""
        if nbytes(value) <= MAX_CLOSURE_BYTES:
            return InClosure(value)
        return InRows(self.spark, value)

    def ship_to_udf(self, value: Any) -> InClosure:
        """``value`` inside the UDF that holds the returned object, with each query
        (:class:`InClosure`: a ``ValueError`` past :data:`MAX_CLOSURE_BYTES`)."""
        return InClosure(value)

    def filesystem(self, path: str) -> None:
        """None: a Connect client reaches no Hadoop ``FileSystem`` (the paths are the
        server's)."""
        return None

    def gather(self, job: Any, zero: Callable[[], T], add: Callable[[T, T], T], reduce: str,
               depth: int) -> T:
        out = zero()
        for r in job.collect():
            out = add(out, r)
        return out

    def add_tag(self, tag: str) -> None:
        self.spark.addTag(tag)

    def remove_tag(self, tag: str) -> None:
        self.spark.removeTag(tag)

    def cancel(self, tag: str) -> None:
        self.spark.interruptTag(tag)

    def join_group(self, group: str, description: str) -> None:
        self.spark.addTag(group)

    def cancel_group(self, group: str) -> None:
        self.spark.interruptTag(group)

    def resident_from_dataframe(self, df: "DataFrame", build: Callable, name: str, on_lost: str,
                                spill_dir: str | None) -> "ConnectResident":
        return ConnectResident(df, build, name=name, on_lost=on_lost, spill_dir=spill_dir,
                               engine=self)

    def resident_slots(self, n: int, build: Callable, name: str) -> "ConnectResident":
        # one row per slot; the anchor is the checkpointed one-row-per-slot DataFrame
        return ConnectResident(self.spark.range(n, numPartitions=n), build, name=name,
                               engine=self)

    def live_executors(self) -> set[str] | None:
        """Not known: a Connect client cannot list the executors."""
        return None

    def num_partitions(self, df: "DataFrame") -> int | None:
        """Not known before the query runs."""
        return None

    def thread(self, target: Callable[..., Any], name: str,
               args: tuple = ()) -> threading.Thread:
        return threading.Thread(target=target, args=args, name=name, daemon=True)


_ENGINES: "weakref.WeakKeyDictionary[SparkSession, ConnectEngine]" = weakref.WeakKeyDictionary()


# ----------------------------------------------------------------------- executor side
def _schema(name: str, kind: str) -> Any:
    """A one-column ``StructType``: a DDL string would cost a round trip to the server
    (Connect parses it there) on every query."""
    from pyspark.sql.types import BinaryType, LongType, StructField, StructType

    return StructType([StructField(name, BinaryType() if kind == "binary" else LongType())])


class _ArrowTask:
    """A job's ``mapInArrow`` function: the anchor row of the task's partition in, each
    result of ``fn(index, shard)`` out as one pickled row."""

    def __init__(self, fn: Callable, per_partition: bool, only: int | None = None,
                 joined: bool = False) -> None:
        self.task, self.only = ShardTask(fn, per_partition), only
        self.joined = joined  # the anchor rows come cross-joined with InRows pieces

    def __call__(self, batches: Iterator[Any]) -> Iterator[Any]:
        import pyarrow as pa
        from pyspark import TaskContext

        tc = TaskContext.get()
        if tc is None:  # pragma: no cover - only ever called inside a Spark task
            raise RuntimeError("a resident job runs inside a Spark task")
        index = tc.partitionId()
        skip = self.only is not None and index != self.only
        infos: list[Any] = []
        pieces: dict[str, dict[int, bytes]] = {}
        for b in batches:
            info = b.column(0).to_pylist()
            if not self.joined:
                infos += info
                continue
            infos += [v for v in dict.fromkeys(info) if v not in infos]
            if not skip:
                cols = (b.column(1).to_pylist(), b.column(2).to_pylist(), b.column(3).to_pylist())
                for k, p, blob in zip(*cols):
                    pieces.setdefault(k, {})[p] = blob
        try:
            for k, parts in pieces.items():
                _ROWS_VALUES[k] = pickle.loads(b"".join(parts[i] for i in sorted(parts)))
            pieces.clear()
            anchor_rows: list[Any] = [(v,) for v in infos]  # read by as_info
            out = ([] if skip else [pickle.dumps(item, protocol=pickle.HIGHEST_PROTOCOL)
                                    for item in self.task(index, anchor_rows)])
        finally:
            _ROWS_VALUES.clear()
        yield pa.RecordBatch.from_pydict({"out": out}, schema=pa.schema([("out", pa.binary())]))


class _ArrowDrop:
    """Deletes a state's files and store entries on the host a task runs on."""

    def __init__(self, key: str, base: str | None) -> None:
        self.key, self.base = key, base

    def __call__(self, batches: Iterator[Any]) -> Iterator[Any]:
        import pyarrow as pa

        for _ in batches:
            pass
        yield pa.RecordBatch.from_pydict({"n": [int(drop_local(self.key, self.base))]})


# ------------------------------------------------------------------------- driver side
class ConnectJob:
    """A lazy job over a :class:`ConnectResident` (what :meth:`Resident.mapPartitions`
    returns on Classic): :meth:`collect` runs it."""

    def __init__(self, res: "ConnectResident", fn: Callable, per_partition: bool,
                 only: int | None = None) -> None:
        self.res, self.fn, self.per_partition, self.only = res, fn, per_partition, only

    def collect(self) -> list:
        """Every result of every partition (of partition ``only`` alone, when given: the
        other partitions' tasks return nothing and do not touch their shards), in
        partition order."""
        anchor, rows = self.res._live_anchor(), _rows_in(self.fn)
        if rows:
            from pyspark.sql.connect import functions as F

            frames = [r.frame for r in rows if r.frame is not None]
            if len(frames) != len(rows):
                raise RuntimeError("a job holds a shipped value that was already released")
            side = frames[0]
            for f in frames[1:]:
                side = side.unionByName(f)
            anchor = anchor.crossJoin(F.broadcast(side))
        task = _ArrowTask(self.fn, self.per_partition, self.only, joined=bool(rows))
        df = anchor.mapInArrow(task, _schema("out", "binary"))
        return [pickle.loads(r[0]) for r in df.collect()]


class ConnectResident(Resident):
    """:class:`~sparknet.cluster.resident.driver.Resident` under Spark Connect: the same
    executor side and driver API, anchored on a checkpointed one-row-per-partition
    DataFrame (see the module docstring).  ``homes`` stays empty: a Connect client
    cannot list the executors, so a lost executor shows as a lost shard (rebuilt with
    ``on_lost="rebuild"``)."""

    def __init__(self, df: "DataFrame", build: Callable, name: str = "state",
                 on_lost: str = "raise", spill_dir: str | None = None,
                 engine: "ConnectEngine | None" = None) -> None:
        self.spark = df.sparkSession
        self.engine = engine if engine is not None else ConnectEngine.of(self.spark)
        self._start(build, name, on_lost, spill_dir, self.engine.app_id, None, df, cut_lineage=True)
        self._jobs = 0
        self._materialise()
        track_open(self)

    def _materialise(self, keep: dict[int, ShardInfo] | None = None) -> None:
        builder = ShardBuilder(self.key, self._build, self.spill_dir, self.owner, keep)
        assert self._df is not None
        built = self._df.mapInArrow(arrow_builder(builder), _schema("info", "binary"))
        self.build_started, t0 = time.time(), time.perf_counter()
        try:
            anchor = self._tagged(f"building resident state {self.key}", None,
                                  lambda: _checkpoint(built))
            infos = sorted((as_info(r) for r in anchor.collect()), key=lambda i: i.index)
        except BaseException:  # bad data found by a task: nothing of the failed build stays behind
            self._discard_partial(0)
            raise
        if [i.index for i in infos] != list(range(len(infos))):
            raise RuntimeError(f"resident state {self.key}: the anchor holds partitions "
                               f"{[i.index for i in infos]}, expected one row for each of "
                               f"0..{len(infos) - 1}")
        self.infos, self.build_seconds, self.anchor = infos, time.perf_counter() - t0, anchor

    def _discard_partial(self, parts: int) -> None:
        """After a failed build: delete what its tasks wrote on this host (the client's
        host is the server's in a local deployment; elsewhere the owner files let the
        executors' sweep do it once this client is gone)."""
        drop_local(self.key, self.spill_dir)

    def _cleanup_files(self) -> None:
        anchor = self.anchor
        if anchor is None:
            return
        try:
            drop = _ArrowDrop(self.key, self.spill_dir)
            self._tagged(f"deleting resident state {self.key}", 60.0,
                         lambda: anchor.mapInArrow(drop, _schema("n", "long")).collect())
        except Exception as exc:  # the server is gone meanwhile
            log.debug("resident %s: executor cleanup failed: %s", self.key, exc)
        drop_local(self.key, self.spill_dir)
        try:
            anchor.unpersist()
        except Exception:  # pragma: no cover - the session stopped
            pass
        self.anchor = None

    def _live_anchor(self) -> Any:
        if self.anchor is None:
            raise RuntimeError(f"resident state {self.key} is closed")
        return self.anchor

    def mapPartitions(  # type: ignore[override]
            self, fn: Callable[[int, Any], Iterable]) -> ConnectJob:
        """A lazy :class:`ConnectJob` running ``fn(index, shard) -> iterable`` on each
        partition's shard (run it with ``collect()``, inside :meth:`run_action`)."""
        return ConnectJob(self, fn, per_partition=True)

    def run_partition(self, fn: Callable[[int, Any], Iterable], index: int) -> list:
        """``fn(index, shard) -> iterable`` on partition ``index`` (an asynchronous round):
        a query over the whole anchor whose other tasks return at once, since a
        DataFrame cannot be cut to one of its partitions; the task of ``index`` still
        prefers the executor holding its anchor row."""
        return ConnectJob(self, fn, per_partition=True, only=index).collect()

    def map(self, fn: Callable[[int, Any], Any], description: str | None = None) -> list:
        return self.run_action(lambda: ConnectJob(self, fn, per_partition=False).collect())

    def _tagged(self, what: str, timeout: float | None, action: Callable[[], Any]) -> Any:
        """``action()`` with this state's next tag on its queries; past ``timeout`` the
        tagged queries are interrupted and :class:`~sparknet.errors.RoundTimeout` raised."""
        self._jobs += 1
        tag = f"sparknet-{self.key}-{self._jobs}"
        fired = threading.Event()

        def expire() -> None:
            fired.set()
            try:
                self.spark.interruptTag(tag)
            except Exception as exc:  # pragma: no cover - the session stopped
                log.debug("interrupting %s failed: %s", tag, exc)

        timer = threading.Timer(timeout, expire) if timeout is not None else None
        self.spark.addTag(tag)
        if timer is not None:
            timer.daemon = True
            timer.start()
        try:
            return action()
        except Exception:
            if fired.is_set():
                raise RoundTimeout(f"{what} ran longer than {timeout:g} s and was interrupted: a "
                                   f"task that never returns, or a round slower than the timeout "
                                   f"allows; pass a larger timeout (a trainer's round_timeout=..., "
                                   f"or None to wait without limit)") from None
            raise
        finally:
            if timer is not None:
                timer.cancel()
            self.spark.removeTag(tag)

    def run_action(self, action: Callable[[], Any], retry: bool = True,
                   timeout: float | None = None) -> Any:
        """Run ``action()`` (jobs over :meth:`mapPartitions`, built inside it) under its
        own tag: past ``timeout`` it is interrupted (:class:`~sparknet.errors.RoundTimeout`);
        a lost shard raises :class:`~sparknet.cluster.resident.driver.ResidentStateLost`, or
        with ``on_lost="rebuild"`` is rebuilt and the action run once more."""
        if timeout is not None and not (isinstance(timeout, (int, float)) and timeout > 0):
            raise ValueError(f"timeout must be a positive number of seconds or None, "
                             f"got {timeout!r}")
        try:
            return self._tagged(f"a job on resident state {self.key}", timeout, action)
        except (ResidentStateLost, RoundTimeout):
            raise
        except Exception as exc:
            reason = lost_reason(exc)
            if reason is None:
                raise
        if self.on_lost == "rebuild" and retry:
            self.rebuild(reason=reason)
            return self.run_action(action, retry=False, timeout=timeout)
        raise ResidentStateLost(reason)

    def rebuild(self, lost: Iterable[str] = (), reason: str | None = None,
                joined: Iterable[str] = ()) -> str:
        """Build the shards again: those whose files are on the host their new task runs
        on are re-attached with their state, the others built from the source."""
        old, t0 = self.anchor, time.perf_counter()
        self._materialise({i.index: i for i in self.infos})
        if old is not None:
            try:
                old.unpersist()
            except Exception:  # pragma: no cover - the session stopped
                pass
        return self._report(f"state lost ({reason or 'rebuild asked for'})", t0)

    def _check_placement(self) -> None:
        """Nothing to check: a Connect client cannot see the executors."""


def _checkpoint(df: "DataFrame") -> "DataFrame":
    """``df.localCheckpoint(eager=True)`` in ``df``'s own session.  pyspark (4.0 to 4.3)
    binds the checkpointed DataFrame to the thread's *active* Connect session
    (``pyspark.sql.connect.conversion.proto_to_remote_cached_dataframe``): in a process
    with two Connect sessions, queries over it would go to the other server, which has no
    such DataFrame (``DATAFRAME_NOT_FOUND``), and releasing it would too."""
    out = df.localCheckpoint(eager=True)
    session, relation = df.sparkSession, getattr(out, "_plan", None)
    if getattr(relation, "_spark_session", session) is not session:
        relation._spark_session = session  # type: ignore[union-attr]
        out._session = session
    return out
