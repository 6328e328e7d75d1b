"""Driver threads of asynchronous training: each runs one partition's rounds as
single-partition Spark jobs, one at a time, in its own Spark job group.

Used by :mod:`sparknet.cluster.async_ps`: the driver loop there hands a thread a
:class:`Launch` and reads ``(partition, launch, result, exception)`` back from the
run's result queue.
"""
from __future__ import annotations

import queue
import re
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Iterable

from sparknet.cluster.rounds import TaskKind, make_task

if TYPE_CHECKING:
    from sparknet.cluster.async_ps import _AsyncRun


def _identity(it: Iterable) -> Iterable:
    return it


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




class PartitionThread:
    """A driver thread that runs one partition's single-partition jobs, one at a time,
    in its own Spark job group."""

    def __init__(self, run: "_AsyncRun", index: int) -> None:
        from pyspark import InheritableThread

        self.run, self.index = run, index
        self.group = f"{run.group}-p{index}"
        self.inbox: "queue.Queue[Launch | None]" = queue.Queue()
        self.busy: Launch | None = None
        self.thread = InheritableThread(target=self._loop, name=f"sparknet-async-p{index}", daemon=True)
        self.thread.start()

    def _loop(self) -> None:
        run = self.run
        sc = run.sc
        sc.setJobGroup(self.group, f"sparknet async rounds, partition {self.index}", interruptOnCancel=True)
        while True:
            job = self.inbox.get()
            if job is None:
                return
            try:
                task = make_task(run.ctx.spec, job.bc, TaskKind.AVERAGE, epoch=job.epoch, rnd=job.chunk,
                                 rounds=run.rounds)
                rdd = run.resident.mapPartitions(task)
                sc.setLocalProperty("spark.job.description",
                                    f"sparknet async: partition {self.index} pass {job.epoch + 1} "
                                    f"chunk {job.chunk + 1}/{run.rounds} at version {job.version}")
                out = sc.runJob(rdd, _identity, partitions=[self.index])
                run.results.put((self.index, job, out, None))
            except BaseException as exc:  # noqa: BLE001 - reported to the driver loop
                run.results.put((self.index, job, None, exc))

    def submit(self, job: Launch) -> None:
        self.busy = job
        self.inbox.put(job)

    def stop(self) -> None:
        self.inbox.put(None)


