"""Driver threads of asynchronous training: each runs one partition's rounds as
single-partition Spark jobs, one at a time, in its own Spark job group.

Used by :mod:`sparknet.cluster.data_parallel.async_mode`: the driver loop there hands a thread a
:class:`Launch` and reads ``(partition, launch, result, exception)`` back from the
run's result queue, keeping one :class:`AsyncEpoch` per epoch.
"""
from __future__ import annotations

import queue
import re
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from sparknet.cluster.data_parallel.fit_context import RoundLog
from sparknet.cluster.data_parallel.round_task import TaskKind, make_task

if TYPE_CHECKING:
    from sparknet.cluster.data_parallel.async_mode import AsyncRun


def executor_message(exc: BaseException) -> str:
    """The executor's Python exception line (``RuntimeError: ...``) out of a PySpark or
    Py4J error, plus how many times Spark tried the task when it says so."""
    text = str(exc)
    head = text.split("\n\tat ", 1)[0]  # drop the Java frames
    lines = [ln.strip() for ln in head.splitlines() if ln.strip()]
    line = next((ln for ln in reversed(lines)
                 if re.match(r"^[A-Za-z_][\w.]*(Error|Exception|Interrupt|Exit)\b", ln)
                 and not ln.startswith(("org.apache.", "py4j.", "java."))), None)
    if line is None:
        line = (lines[-1] if lines else type(exc).__name__)
    tries = re.search(r"failed (\d+) times", text)
    if tries:
        line += f" (Spark ran the task {tries.group(1)} time{'s' if tries.group(1) != '1' else ''})"
    return line[:1000]


@dataclass
class Launch:
    """One asynchronous round of one partition."""

    partition: int
    version: int
    bc: Any
    epoch: int          # the partition's own pass over its shard
    chunk: int
    rows: int
    started: float = 0.0
    lr: float | None = None      # the driver optimizer's rate at launch (the local steps')


@dataclass
class AsyncEpoch:
    """The state of one asynchronous epoch on the driver."""

    epoch: int
    last: bool                       # the fit's last epoch: stop at the budget
    target: int                      # rows dispatched by the end of this epoch
    workers: list[PartitionThread]
    log: RoundLog = field(default_factory=RoundLog)
    applied: int = 0
    rejected: int = 0
    downweighted: int = 0
    staleness: list[int] = field(default_factory=list)       # of the applied deltas
    # partition -> (deadline, record)
    held: dict[int, tuple[float, dict]] = field(default_factory=dict)

    def busy(self) -> bool:
        return bool(self.held) or any(w.busy is not None for w in self.workers)


class PartitionThread:
    """A driver thread that runs one partition's single-partition jobs, one at a time,
    in its own Spark job group."""

    def __init__(self, run: "AsyncRun", index: int) -> None:
        self.run, self.index = run, index
        self.group = f"{run.group}-p{index}"
        self.inbox: "queue.Queue[Launch | None]" = queue.Queue()
        self.busy: Launch | None = None
        self.thread = run.engine.thread(self._loop, f"sparknet-async-p{index}")
        self.thread.start()

    def _loop(self) -> None:
        run = self.run
        engine = run.engine
        engine.join_group(self.group, f"sparknet async rounds, partition {self.index}")
        while True:
            job = self.inbox.get()
            if job is None:
                return
            try:
                task = make_task(run.ctx.spec, job.bc, TaskKind.AVERAGE, epoch=job.epoch,
                                 rnd=job.chunk, rounds=run.rounds, lr=job.lr,
                                 schedule=run.ctx.schedule)
                engine.describe(f"sparknet async: partition {self.index} pass {job.epoch + 1} "
                                f"chunk {job.chunk + 1}/{run.rounds} at version {job.version}")
                out = run.resident.run_partition(task, self.index)
                run.results.put((self.index, job, out, None))
            except BaseException as exc:  # noqa: BLE001 - reported to the driver loop
                run.results.put((self.index, job, None, exc))

    def submit(self, job: Launch) -> None:
        self.busy = job
        self.inbox.put(job)

    def stop(self) -> None:
        self.inbox.put(None)


