"""Where block jobs run: in this process (:class:`LocalBlocks`) or on Spark (:class:`SparkBlocks`).

Both run the same executor code, :meth:`BlockJob.run
<sparknet.cluster.model_parallel.jobs.BlockJob.run>`, once per slot, and return the slots' results
in slot order.  Errors cross back typed:
:class:`BlockStateLost` when a block's resident state is gone or stale,
:class:`BlockMemoryError` when a block does not fit its Python worker's memory limit.
"""
from __future__ import annotations

import os
import time
from dataclasses import dataclass
from typing import Any, Iterable, Protocol

import numpy as np

from sparknet.cluster.model_parallel.executor import MEMORY_TAG, MemStore, mem_limit
from sparknet.cluster.model_parallel.jobs import BlockJob
from sparknet.cluster.model_parallel.messages import JobInputs, SlotReply
from sparknet.cluster.resident.driver import lost_reason


class BlockStateLost(RuntimeError):
    """A weight block's resident state is missing or stale and no checkpoint could restore it."""


class BlockMemoryError(MemoryError):
    """A weight block does not fit the executor's Python memory
    (``spark.executor.pyspark.memory``)."""


class Backend(Protocol):
    """What :class:`~sparknet.cluster.model_parallel.ModelParallel` needs of a backend."""

    n_slots: int
    jobs: int
    last_read_s: float
    last_compute_s: float

    def run(self, job: BlockJob, data: JobInputs | None = None) -> list: ...

    def placement(self) -> list: ...

    def close(self) -> None: ...


class _SlotTask:
    """The picklable job function shipped to the executors: read the broadcast (the job's
    encoded :class:`JobInputs`), run the job."""

    def __init__(self, job: BlockJob, broadcast: Any) -> None:
        self.job, self.broadcast = job, broadcast

    def __call__(self, index: int, shard: Any) -> SlotReply:
        t0 = time.perf_counter()
        data = JobInputs.decode(self.broadcast.value if self.broadcast is not None else None)
        t1 = time.perf_counter()
        what = type(self.job).__name__
        try:
            out = self.job.run(shard, index, data)
        except MemoryError as exc:
            msg = str(exc)
            if MEMORY_TAG not in msg:
                limit = (mem_limit() or 0) / 2**20
                msg = (f"{MEMORY_TAG}: slot {index} ran out of memory in {what} "
                       f"(limit {limit:.0f} MiB): {msg or type(exc).__name__}")
            raise MemoryError(msg) from None
        except OSError as exc:
            if exc.errno == 12:  # ENOMEM from mmap
                raise MemoryError(f"{MEMORY_TAG}: slot {index} could not map its block in {what} "
                                  f"(limit {(mem_limit() or 0) / 2**20:.0f} MiB): {exc}") from None
            raise
        return SlotReply(out, os.getppid(), t1 - t0, time.perf_counter() - t1)


class _One:
    """``fn(index, shard)`` as a :meth:`Resident.mapPartitions` function: one result per slot."""

    def __init__(self, fn: Any) -> None:
        self.fn = fn

    def __call__(self, index: int, shard: Any) -> list:
        return [self.fn(index, shard)]


@dataclass(frozen=True)
class SlotReport:
    """Where a slot was built: the Python worker's ``pid`` and its daemon's ``ppid`` (a
    block job answered by a worker of another daemon ran on another executor)."""

    pid: int
    ppid: int


def _build_slot(index: int, iterator: Iterable) -> tuple[dict, SlotReport]:
    """Resident build: a tiny marker array (so the slot's folder exists) and where it lives."""
    for _ in iterator:
        pass
    return {"slot": np.array([index], dtype=np.int64)}, SlotReport(os.getpid(), os.getppid())


class LocalBlocks:
    """In-process block executor: every slot's arrays in this process (the reference backend).

    Runs exactly the executor code of :class:`SparkBlocks`, the job's inputs encoded and
    decoded as they would travel (the same arrays, no copy); useful to check the maths
    without Spark and as the single-machine fallback.
    """

    def __init__(self, n_slots: int) -> None:
        self.n_slots = int(n_slots)
        self.stores = [MemStore() for _ in range(self.n_slots)]
        self.jobs = 0
        self.last_read_s = self.last_compute_s = 0.0

    def run(self, job: BlockJob, data: JobInputs | None = None) -> list:
        self.jobs += 1
        t0 = time.perf_counter()
        inputs = JobInputs.decode(None if data is None else data.encode())
        try:
            return [job.run(self.stores[k], k, inputs) for k in range(self.n_slots)]
        except RuntimeError as exc:
            reason = lost_reason(exc)
            if reason is not None:
                raise BlockStateLost(reason) from None
            raise
        finally:
            self.last_compute_s = time.perf_counter() - t0

    def placement(self) -> list:
        return [os.getppid()] * self.n_slots

    def close(self) -> None:
        self.stores = [MemStore() for _ in range(self.n_slots)]


class SparkBlocks:
    """Block executor on Spark: one resident partition per slot (see
    :mod:`sparknet.cluster.resident.driver`; under Spark Connect
    :class:`~sparknet.cluster.engine.connect.ConnectResident`).

    Big inputs (layer inputs, deltas) travel as one broadcast per job, destroyed after it
    (under Connect inside the job's query, :class:`~sparknet.cluster.engine.connect.InClosure`);
    results come back with ``collect``.  ``home`` records the executor process
    (the Python daemon's parent id) that built each slot, and :attr:`moves` counts
    the tasks that ran anywhere else (their arrays were re-attached from the
    mapped files).
    """

    def __init__(self, spark: Any, n_slots: int, name: str = "blocks",
                 timeout: float | None = None) -> None:
        from sparknet.cluster.engine.base import engine_for

        self.engine = engine_for(spark)
        self.n_slots = int(n_slots)
        #: seconds a job may run before it is cancelled (:class:`~sparknet.errors.RoundTimeout`)
        self.timeout = timeout
        self.res: Any = self.engine.resident_slots(self.n_slots, _build_slot, name)
        self.home = [info.meta.ppid for info in self.res.infos]
        self.jobs = 0
        self.tasks = 0
        self.moves = 0
        self.last_read_s = self.last_compute_s = 0.0

    def run(self, job: BlockJob, data: JobInputs | None = None) -> list:
        from sparknet.cluster.resident.driver import ResidentStateLost

        # one broadcast for all of the job's arrays: one fetch per executor, not one per array
        # (under Connect: the arrays travel in the query's function)
        wire = None if data is None else data.encode()
        bc = self.engine.ship(wire) if wire else None
        task = _SlotTask(job, bc)

        # the RDD is built inside the action: a retry runs over a new anchor
        def action() -> list:
            return self.res.mapPartitions(_One(task)).collect()
        try:
            out = self.res.run_action(action, timeout=self.timeout)
        except ResidentStateLost as exc:
            raise BlockStateLost(self._lost_what(str(exc))) from None
        except Exception as exc:
            msg = str(exc)
            if MEMORY_TAG in msg:
                line = next((ln for ln in msg.splitlines() if MEMORY_TAG in ln), msg)
                raise BlockMemoryError(line.strip().split(f"{MEMORY_TAG}: ", 1)[-1]) from None
            raise
        finally:
            if bc is not None:
                try:
                    bc.destroy()
                except Exception:  # pragma: no cover - context stopped
                    pass
        self.jobs += 1
        replies: list[SlotReply] = out
        results = []
        for k, reply in enumerate(replies):
            self.tasks += 1
            if reply.ppid != self.home[k]:
                self.moves += 1
            results.append(reply.result)
        # the slowest slot's time reading its broadcasts and computing: the job's critical path
        self.last_read_s = max(r.read_s for r in replies)
        self.last_compute_s = max(r.compute_s for r in replies)
        return results

    def _lost_what(self, reason: str) -> str:
        """``reason``, prefixed with the executors gone and the slots they held (when known)."""
        live = self.engine.live_executors()
        homes = getattr(self.res, "homes", {}) or {}
        gone = sorted({e for e in homes.values() if live is not None and e not in live})
        if not gone:
            return reason
        slots = sorted(p for p, e in homes.items() if e in gone)
        return f"executor {', '.join(gone)} lost with slot(s) {slots}: {reason}"

    def placement(self) -> list:
        return list(self.home)

    def close(self) -> None:
        self.res.close()
