"""What asynchronous training does when a partition's shard or executor is lost.

Used by :mod:`sparknet.cluster.data_parallel.async_mode`.  The synchronous rounds run every
job under a guard that cancels it when an executor holding a shard goes
(:class:`~sparknet.cluster.resident.executors.JobGuard`); the asynchronous rounds are
single-partition jobs the driver loop watches instead: between arriving results it compares
the shards' executors with the live ones (:func:`watch`), and a job that failed on lost
state is recovered the same way (:func:`recover`).  Either way the other rounds are
cancelled, the lost shards rebuilt from the source on the live executors
(:meth:`Resident.rebuild <sparknet.cluster.resident.driver.Resident.rebuild>`, which logs the
line sync mode logs: which executor and partitions were lost, which were rebuilt and that
their optimizer state restarts), their optimizer state restored from the newest checkpoint
of the fit or said to restart from zero, and every partition relaunched; the rows of the lost
and cancelled rounds go back into the epoch's budget.  At most two rebuilds per fit.
"""
from __future__ import annotations

import logging
from typing import TYPE_CHECKING

from sparknet.cluster.data_parallel.async_threads import (
    AsyncEpoch,
    Launch,
    PartitionThread,
    executor_message,
)
from sparknet.cluster.resident.driver import ResidentStateLost, lost_reason
from sparknet.cluster.resident.executors import live_executors

if TYPE_CHECKING:
    from sparknet.cluster.data_parallel.async_mode import AsyncRun

log = logging.getLogger("sparknet.cluster.data_parallel.async_mode")


class AsyncPartitionError(RuntimeError):
    """A partition's job failed during asynchronous training.

    Attributes:
        partition: the partition whose job failed.
    """

    def __init__(self, partition: int, message: str) -> None:
        super().__init__(message)
        self.partition = partition


def lost_homes(run: "AsyncRun") -> set[str]:
    """Executors holding a training shard that are no longer registered (none in local mode
    or under Spark Connect, where the shards' executors are not known)."""
    homes = set(getattr(run.resident, "homes", {}).values())
    sc = getattr(run.resident, "sc", None)
    if not homes or sc is None:
        return set()
    live = live_executors(sc)
    return set() if live is None else homes - live


def watch(run: "AsyncRun", st: AsyncEpoch) -> None:
    """Between results: an executor holding a shard is gone, so its partition's round would
    wait for it (``spark.locality.wait.process``) and find its state gone: rebuild now."""
    gone = lost_homes(run)
    if not gone:
        return
    if not may_rebuild(run):
        who = ", ".join(sorted(gone))
        raise ResidentStateLost(f"executor {who} lost with training shards, and this fit has "
                                f"rebuilt its shards {run.rebuilds} times already")
    rebuild(run, st.workers, None, gone)
    relaunch(run, st)


def recover(run: "AsyncRun", st: AsyncEpoch, p: int, job: Launch, exc: BaseException) -> None:
    """A failed job: lost shards are rebuilt and every partition relaunched (at most twice per
    fit); anything else ends the fit."""
    if lost_reason(exc) is None or not may_rebuild(run):
        raise failure(run, p, job, exc)
    rebuild(run, st.workers, job, lost_homes(run))
    relaunch(run, st)


def relaunch(run: "AsyncRun", st: AsyncEpoch) -> None:
    st.held.clear()  # relaunched here with the others
    for x in st.workers:
        if x.busy is None:
            run._launch_if_due(x, st)


def failure(run: "AsyncRun", p: int, job: Launch, exc: BaseException) -> BaseException:
    """The error a failed job of partition ``p`` ends the fit with."""
    if isinstance(exc, KeyboardInterrupt):
        return exc
    reason = lost_reason(exc)
    if reason is not None:
        return ResidentStateLost(f"partition {p}: {reason}")
    return AsyncPartitionError(
        p, f"asynchronous training failed: partition {p}'s job (pass {job.epoch + 1}, chunk "
           f"{job.chunk + 1}/{run.rounds}, launched at update {job.version}) failed after "
           f"Spark's task retries: {executor_message(exc)}")


def may_rebuild(run: "AsyncRun") -> bool:
    return run.resident.on_lost == "rebuild" and run.rebuilds < 2


def rebuild(run: "AsyncRun", workers: list[PartitionThread], lost: Launch | None,
            gone: set[str]) -> None:
    """Stop the other rounds, rebuild the lost shards from the source (the others re-attach
    with their state), as the synchronous rounds do, and put the rebuilt partitions'
    optimizer state back from the newest checkpoint (or say that it restarts); the rows of
    the lost and cancelled rounds go back into the budget."""
    run.rebuilds += 1
    if lost is not None:
        run.dispatched -= lost.rows
    back = [w.busy for w in workers if w.busy is not None]
    run._cancel(workers)
    run.dispatched -= sum(j.rows for j in back)
    part = lost.partition if lost is not None else "?"
    where = f"executor {', '.join(sorted(gone))}" if gone else \
        f"the resident training data of partition {part}"
    log.warning("sparknet async: %s lost; cancelled the other rounds, rebuilding the lost shards",
                where)
    run.resident.rebuild(lost=gone)  # logs what was lost, rebuilt and re-attached
    # their optimizer state: the newest checkpoint's, or restarts
    run.ctx.state.before_round(run.ctx, standalone=True)
