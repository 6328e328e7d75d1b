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
  :func:`sparknet.cluster.engine.session.get_spark`) so a briefly busy home executor does not
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
  ``on_lost="rebuild"``, rebuild (right for data shards, whose source is the truth)
  and retry the job once.
* **Every job guarded.**  :meth:`Resident.run_action` runs its job with its own job
  tag (the caller's job group stays on it), watched by
  :class:`~sparknet.cluster.resident.executors.JobGuard`: cancelled past its ``timeout``
  (:class:`~sparknet.errors.RoundTimeout`), when every executor has been gone for a while
  (:class:`NoExecutorsLeft`), and, with ``on_lost="rebuild"``, as soon as an executor holding a
  shard is lost: waiting would cost ``spark.locality.wait.process`` and end in lost state anyway.
  :meth:`Resident.rebuild` then builds the lost shards from the source on the live executors and
  re-attaches the others with their state, and logs one line saying which.  An executor that joins
  while another holds several shards gets some of them the same way.
* **Nothing left behind.**  :meth:`Resident.close` deletes the state's folder on every
  host; folders that killed drivers left are swept by the next Resident on that host
  (their owner files, see :mod:`sparknet.cluster.resident.spill`).

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
import time
import uuid
from typing import TYPE_CHECKING, Any, Callable, Iterable

from sparknet.cluster.resident import executors as _executors
from sparknet.cluster.resident import spill as _files
from sparknet.cluster.resident.executors import JobGuard, block_homes, live_executors
from sparknet.cluster.resident.shards import (  # noqa: F401 - the executor side, re-exported
    CHECKPOINT_LOST,
    LOST_TAG,
    Dropper,
    Shard,
    ShardBuilder,
    ShardInfo,
    ShardTask,
    arrow_builder,
    as_info,
    attach,
    drop_local,
)
from sparknet.errors import RoundTimeout

if TYPE_CHECKING:
    from pyspark import RDD
    from pyspark.sql import DataFrame

log = logging.getLogger(__name__)
#: Seconds the deletion job of :meth:`Resident.close` may take.
CLEANUP_TIMEOUT = 60.0
#: Seconds an executor that joined must have been up before shards are re-placed onto it.
JOIN_SETTLE = 3.0


def lost_reason(exc: BaseException) -> str | None:
    """Why a job failed because resident state is gone (a shard's files or store entry,
    or the executor holding its anchor block), or None for any other failure."""
    text = str(exc)
    if LOST_TAG in text:
        line = next((ln for ln in text.splitlines() if LOST_TAG in ln), LOST_TAG)
        return line.strip().split(f"{LOST_TAG}: ", 1)[-1]
    if CHECKPOINT_LOST in text or ("Checkpoint block" in text and "not found" in text):
        return "the executor holding a shard's anchor block is gone"
    return None


class ResidentStateLost(RuntimeError):
    """A partition's resident state was found neither in its worker nor on disk."""


class NoExecutorsLeft(ResidentStateLost):
    """Every executor of the application is gone, and none came back in time."""


# ---------------------------------------------------------------------------- driver side
_OPEN: "set[Resident]" = set()


def open_states() -> "list[Resident]":
    """The resident states this driver has open: built and not yet closed (a killed driver
    leaves their folders behind).  Each says its :attr:`~Resident.key`, its shards'
    :attr:`~Resident.infos` (host and folder of each) and :attr:`~Resident.homes`.  A
    snapshot, in no particular order: states opened or closed later do not change it."""
    return list(_OPEN)


def track_open(state: "Resident") -> None:
    """Count ``state`` among this driver's open states (:func:`open_states`) until it is
    closed: what a subclass built without ``Resident.__init__`` calls once it is built."""
    _OPEN.add(state)


#: the JVM logger of an anchor's RDD class (its unpersist warning is silenced, see _unpersist)
_ANCHOR_LOGGER = "org.apache.spark.api.python.PythonRDD"


def _unpersist(anchor: "RDD[Any]") -> None:
    """Unpersist an anchor.  Spark warns that a locally checkpointed RDD "cannot be
    recomputed after unpersisting": dropping it is what closing the state means, so
    that warning is not logged (the level of that one logger is raised for the call)."""
    jvm = getattr(anchor.context, "_jvm", None)
    saved = None
    try:
        if jvm is not None:
            log4j = jvm.org.apache.logging.log4j
            saved = log4j.LogManager.getLogger(_ANCHOR_LOGGER).getLevel()
            log4j.core.config.Configurator.setLevel(_ANCHOR_LOGGER, log4j.Level.ERROR)
    except Exception:  # pragma: no cover - another logging backend: keep Spark's warning
        saved = None
    try:
        anchor.unpersist()
    finally:
        if saved is not None and jvm is not None:
            jvm.org.apache.logging.log4j.core.config.Configurator.setLevel(_ANCHOR_LOGGER, saved)


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
            a shard gone; ``"rebuild"`` rebuilds the lost shards from ``rdd`` on the live
            executors and retries the job once (right when the source is the truth,
            e.g. training data; see :meth:`rebuild`).
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
        homes: partition -> id of the executor holding it (empty in local mode).
        recoveries: the line logged for each rebuild (what was lost, what was rebuilt).
    """

    def __init__(self, rdd: "RDD | None", build: Callable, name: str = "state",
                 on_lost: str = "raise", spill_dir: str | None = None, cut_lineage: bool = True,
                 _arrow_df: "DataFrame | None" = None) -> None:
        if rdd is not None:
            self.sc = rdd.context
        elif _arrow_df is not None:
            self.sc = _arrow_df.sparkSession.sparkContext
        else:
            raise ValueError("Resident needs a source: an RDD (or from_dataframe's DataFrame)")
        self._start(build, name, on_lost, spill_dir, str(self.sc.applicationId), rdd, _arrow_df,
                    cut_lineage)
        # what killed drivers left here
        _files.sweep_stale(self.owner.app_id, spill_dir, force=True)
        self._materialise()
        _OPEN.add(self)

    def _start(self, build: Callable, name: str, on_lost: str, spill_dir: str | None, app_id: str,
               rdd: "RDD | None", df: "DataFrame | None", cut_lineage: bool) -> None:
        """The state's attributes before its first build (shared with the Connect subclass)."""
        if on_lost not in ("raise", "rebuild"):
            raise ValueError(f"on_lost must be 'raise' or 'rebuild', got {on_lost!r}")
        self.key = f"{name}-{uuid.uuid4().hex[:12]}"
        self._rdd, self._df, self._build = rdd, df, build
        self.on_lost, self.spill_dir, self.cut_lineage = on_lost, spill_dir, bool(cut_lineage)
        self.anchor: Any = None
        self.infos: list[ShardInfo] = []
        self.homes: dict[int, str] = {}
        self.recoveries: list[str] = []
        # : called by :meth:`close` after the files are deleted (e.g. destroying the source's
        # broadcasts)
        self.on_close: list[Callable[[], None]] = []
        self._placed_on: set[str] = set()  # the live executors the shards were last placed among
        # executor -> [first seen (monotonic s), re-placements tried]
        self._joined: dict[str, list] = {}
        #: ``time.time()`` when the last build job was submitted, and its wall seconds.
        self.build_started, self.build_seconds = 0.0, 0.0
        self.owner = _files.Owner.this_driver(app_id)

    @classmethod
    def from_dataframe(cls, df: "DataFrame", build: Callable, name: str = "state",
                       on_lost: str = "raise", spill_dir: str | None = None) -> "Resident":
        """Build the shards from a DataFrame's partitions through Arrow (``mapInArrow``):
        ``build(index, batches)`` receives an iterator of ``pyarrow.RecordBatch``."""
        return cls(None, build, name=name, on_lost=on_lost, spill_dir=spill_dir, _arrow_df=df)

    # -- lifecycle ---------------------------------------------------------
    def _materialise(self, keep: dict[int, ShardInfo] | None = None) -> None:
        from pyspark import StorageLevel

        builder = ShardBuilder(self.key, self._build, self.spill_dir, self.owner, keep)
        anchor: RDD[Any]
        if self._df is not None:
            # the Python map behind the Arrow stage starts the executors' other Python
            # daemon (plain RDD tasks, as every later round is) alongside the Arrow one
            anchor = self._df.mapInArrow(arrow_builder(builder), "info binary").rdd.map(
                as_info, preservesPartitioning=True)
        else:
            assert self._rdd is not None  # __init__ took an RDD or a DataFrame
            anchor = self._rdd.mapPartitionsWithIndex(builder, preservesPartitioning=True)
        anchor.persist(StorageLevel.MEMORY_ONLY)
        if self._df is None and self.cut_lineage:
            # Cut the lineage: a ``parallelize`` source keeps its rows in its partition
            # objects, which every later task would otherwise carry (and the JVM
            # re-serialise) each round.  Lost blocks are then reported, not recomputed.
            anchor.localCheckpoint()
        anchor.setName(f"sparknet resident {self.key}")
        self.build_started, t0 = time.time(), time.perf_counter()
        try:
            with JobGuard(self.sc, f"building resident state {self.key}") as guard:
                try:
                    infos = [as_info(item) for item in anchor.collect()]
                except Exception:
                    anchor.unpersist()
                    if guard.reason == "no executors":
                        raise NoExecutorsLeft(self._no_executors("building resident state "
                                                                 f"{self.key}")) from None
                    raise
        except NoExecutorsLeft:
            drop_local(self.key, self.spill_dir)
            raise
        except Exception:  # bad data found by a task: nothing of the failed build stays behind
            self._discard_partial(anchor.getNumPartitions())
            raise
        self.infos, self.build_seconds, self.anchor = infos, time.perf_counter() - t0, anchor
        live = live_executors(self.sc)
        self.homes = {} if live is None else block_homes(self.sc, anchor.id(), len(infos))
        self._placed_on = live or set()
        log.debug("resident %s: %d shards on %s", self.key, len(self.infos),
                  sorted({i.host for i in self.infos}))

    def _discard_partial(self, parts: int) -> None:
        """After a failed build: delete the shards its finished tasks wrote, on the hosts
        one task per partition reaches and on this one."""
        try:
            with JobGuard(self.sc, f"deleting partial resident state {self.key}",
                          timeout=CLEANUP_TIMEOUT):
                self.sc.parallelize(range(parts), max(1, parts)).mapPartitions(
                    Dropper(self.key, self.spill_dir)).collect()
        # executors gone meanwhile: the owner files let a later sweep do it
        except Exception as exc:
            log.debug("resident %s: cleanup after a failed build failed: %s", self.key, exc)
        drop_local(self.key, self.spill_dir)

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
        tm = max(timed, key=lambda i: i.timing["start"] + i.timing["build"]
                 + i.timing["spill"]).timing
        start = min(max(tm["start"] - self.build_started, 0.0), self.build_seconds)
        rest = max(self.build_seconds - start - tm["build"] - tm["spill"], 0.0)
        return {"start": start, "build": tm["build"], "spill": tm["spill"], "rest": rest}

    def rebuild(self, lost: Iterable[str] = (), reason: str | None = None,
                joined: Iterable[str] = ()) -> str:
        """Build the shards again on the live executors: a shard whose executor lives and
        whose files are on the host its new task runs on is re-attached as it is (its
        in-place state, optimizer state included, kept); every other one is built from
        the source (its in-place state restarts).  Logs one line saying what was lost
        and what was rebuilt, and returns it.

        Args:
            lost: ids of executors known to be gone (their shards are built anew).
            reason: why, for the log line (an executor's lost-state error).
            joined: ids of executors that joined (a re-placement onto them).
        """
        lost, joined = sorted(set(lost)), sorted(set(joined))
        live = live_executors(self.sc)
        gone = {p for p, e in self.homes.items() if e in lost
                or (live is not None and e not in live)}
        lost = sorted(set(lost) | {self.homes[p] for p in gone})
        keep = {i.index: i for i in self.infos if i.index not in gone}
        old, t0 = self.anchor, time.perf_counter()
        self._materialise(keep)
        if old is not None:
            _unpersist(old)
        if lost:
            cause = f"executor {', '.join(lost)} lost (partition(s) {sorted(gone)})"
        elif joined:
            cause = f"executor {', '.join(joined)} joined; re-placing the shards"
        else:
            cause = f"state lost ({reason or 'rebuild asked for'})"
        return self._report(cause, t0)

    def _report(self, cause: str, t0: float) -> str:
        """Log and keep the line saying why shards were rebuilt (``cause``), which were
        built anew and which re-attached, where, and in how long since ``t0``."""
        fresh = [i.index for i in self.infos if not i.reattached]
        kept = [i.index for i in self.infos if i.reattached]
        homes = ", ".join(sorted(set(self.homes.values())))
        where = f" on executor(s) {homes}" if self.homes else ""
        rebuilt = (f"rebuilt partition(s) {fresh} from the source (their optimizer state restarts)"
                   if fresh
                   else "nothing rebuilt")
        line = (f"sparknet: resident state {self.key}: {cause}: {rebuilt}, re-attached "
                f"{kept or 'none'} with their state{where} in {time.perf_counter() - t0:.1f} s")
        log.warning(line)
        self.recoveries.append(line)
        return line

    def close(self) -> None:
        """Delete the spill files and store entries on every host, unpersist the anchor."""
        if self.anchor is None:
            return
        self._cleanup_files()
        _OPEN.discard(self)
        for fn in self.on_close:
            fn()
        self.on_close = []

    def _cleanup_files(self) -> None:
        key, anchor = self.key, self.anchor
        if anchor is None:
            return
        if getattr(self.sc, "_jsc", None) is None:  # its session was stopped: no executor to ask
            drop_local(key, self.spill_dir)  # (other hosts' files: their next sweep, owner gone)
            self.anchor = None
            return
        live = live_executors(self.sc)
        if live is None or live:  # with no executor left there is nobody to ask
            # over the anchor, its tasks go where the shards are; with one of those executors
            # gone they would wait for it (spark.locality.wait.process), so then over an RDD
            # without preferences, one task per shard: from the start when the loss is known,
            # else as soon as the guard sees it during the job
            healthy = live is None or set(self.homes.values()) <= live
            if not (healthy and self._drop_job(over_anchor=True)):
                self._drop_job(over_anchor=False)
        drop_local(key, self.spill_dir)
        try:
            _unpersist(anchor)
        except Exception:  # pragma: no cover - context stopped
            pass
        self.anchor = None

    def _drop_job(self, over_anchor: bool) -> bool:
        """One job deleting the state's files on the executors' hosts, over the anchor (its
        tasks where the shards live, cancelled when an executor holding one is lost) or
        over a plain RDD (no placement, nothing to wait for); ``False`` when cancelled for
        a lost executor."""
        n = len(self.infos)
        rdd = self.anchor if over_anchor else self.sc.parallelize(range(n), max(1, n))
        watch = set(self.homes.values()) if over_anchor else None
        guard = JobGuard(self.sc, f"deleting resident state {self.key}", CLEANUP_TIMEOUT, watch)
        try:
            with guard:
                rdd.mapPartitions(Dropper(self.key, self.spill_dir)).collect()
        except Exception as exc:  # executors gone meanwhile
            if guard.reason == "lost":
                log.info("resident %s: executor %s lost during the clean-up; deleting without "
                         "placement", self.key, ", ".join(sorted(guard.lost)))
                return False
            log.debug("resident %s: executor cleanup failed: %s", self.key, exc)
        return True

    def __enter__(self) -> "Resident":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # -- jobs --------------------------------------------------------------
    def mapPartitions(self, fn: Callable[[int, Shard], Iterable]) -> "RDD":
        """A lazy RDD running ``fn(index, shard) -> iterable`` on each partition's shard
        (use it with any action: ``collect``, ``treeAggregate``, ``foreach`` with an
        accumulator...).  Wrap the action in :meth:`run_action` for lost-state handling."""
        return self._live_anchor().mapPartitionsWithIndex(ShardTask(fn, per_partition=True),
                                                          preservesPartitioning=True)

    def _live_anchor(self) -> "RDD[Any]":
        if self.anchor is None:
            raise RuntimeError(f"resident state {self.key} is closed")
        return self.anchor

    def run_action(self, action: Callable[[], Any], retry: bool = True,
                   timeout: float | None = None) -> Any:
        """Run ``action()`` (a Spark action over :meth:`mapPartitions` RDDs, built inside
        it) with its own Spark job tag, and make every way it can fail clear.

        * Past ``timeout`` seconds the tagged jobs are cancelled and
          :class:`~sparknet.errors.RoundTimeout` raised.
        * A shard's lost state (an executor's lost-state error, or, with
          ``on_lost="rebuild"``, the loss of an executor holding a shard, seen by the
          driver within a second) raises :class:`ResidentStateLost`, or with
          ``on_lost="rebuild"`` rebuilds onto the live executors (:meth:`rebuild`) and
          runs ``action()`` once more (``retry``).  Before the action, shards of
          executors lost since are rebuilt, and shards are re-placed onto an executor
          that joined while another ran several.
        * With no executor left for :data:`~sparknet.cluster.resident.executors.NO_EXECUTOR_WAIT`
          seconds, :class:`NoExecutorsLeft`.
        """
        if timeout is not None and not (isinstance(timeout, (int, float)) and timeout > 0):
            raise ValueError("timeout must be a positive number of seconds or None, got "
                             f"{timeout!r}")
        self._check_placement()
        watch = set(self.homes.values()) if self.on_lost == "rebuild" else None
        error: Exception | None = None
        with JobGuard(self.sc, f"job on resident state {self.key}", timeout, watch) as guard:
            try:
                return action()
            except ResidentStateLost:
                raise
            except Exception as exc:
                error = exc
            what = self.sc.getLocalProperty("spark.job.description") or guard.description
            what = "a Spark job" if what == guard.description else repr(what)
        if guard.reason == "timeout":
            raise RoundTimeout(f"{what} (resident state {self.key}) ran longer than {timeout:g} s "
                               "and was cancelled: a task that never returns, or a round slower "
                               "than the timeout allows; pass a larger timeout (a trainer's "
                               f"round_timeout=..., or None to wait without limit)") from None
        if guard.reason == "no executors":
            raise NoExecutorsLeft(self._no_executors(what)) from None
        reason = (f"executor {', '.join(sorted(guard.lost))} lost" if guard.reason == "lost"
                  else lost_reason(error))
        if reason is None:
            raise error
        if self.on_lost == "rebuild" and retry:
            self.rebuild(lost=guard.lost, reason=reason)
            return self.run_action(action, retry=False, timeout=timeout)
        raise ResidentStateLost(reason) from None

    def _check_placement(self) -> None:
        """Before a job (``on_lost="rebuild"``): rebuild the shards of executors lost since,
        or re-place them when an executor joined while another holds several."""
        if self.on_lost != "rebuild" or not self.homes:
            return
        live = live_executors(self.sc)
        if live is None:
            return
        lost = {e for e in self.homes.values() if e not in live}
        if lost:
            self.rebuild(lost=lost)
            return
        now, crowded = time.monotonic(), max(list(self.homes.values()).count(e)
                                             for e in self.homes.values()) > 1
        for e in live - self._placed_on:
            self._joined.setdefault(e, [now, 0])
        # an executor is given shards once it has been up for JOIN_SETTLE seconds, at most twice
        joined = {e for e, (seen, tries) in self._joined.items()
                  if e in live and now - seen >= JOIN_SETTLE and tries < 2}
        if not crowded or not joined:
            if not crowded:
                self._placed_on |= live
            return
        for e in joined:
            self._joined[e][1] += 1
        self.rebuild(joined=joined)
        # got none: once more later
        self._placed_on -= {e for e in joined if e not in self.homes.values()}

    def _no_executors(self, what: str) -> str:
        return (f"no executor left: every executor of application {self.sc.applicationId} is gone "
                f"and none registered within {_executors.NO_EXECUTOR_WAIT:.0f} s, so {what} cannot "
                "run; start workers again (or check the cluster manager) and fit again "
                "(resume=True continues from a checkpoint)")

    def run_partition(self, fn: Callable[[int, Shard], Iterable], index: int) -> list:
        """Run ``fn(index, shard) -> iterable`` on partition ``index`` alone, as one job
        of one task, and return its results (an asynchronous round)."""
        return self.sc.runJob(self.mapPartitions(fn), _identity, partitions=[index])

    def map(self, fn: Callable[[int, Shard], Any], description: str | None = None) -> list:
        """Run ``fn(index, shard)`` once per partition and return the results in
        partition order (a ``collect``; results should be small or param-sized)."""
        def job() -> list:
            rdd = self._live_anchor().mapPartitionsWithIndex(ShardTask(fn, per_partition=False),
                                                             preservesPartitioning=True)
            if description:
                self.sc.setJobDescription(description)
            return rdd.collect()
        return self.run_action(job)


def _identity(it: Iterable) -> Iterable:
    return it


@atexit.register
def _close_all() -> None:  # pragma: no cover - interpreter shutdown
    for res in list(_OPEN):
        _files.remove_key(res.key, res.spill_dir)
