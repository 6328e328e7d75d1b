"""The driver's view of the executors while resident state is used: which are alive,
where each shard lives, and a guard around every job that stops waiting when waiting
cannot help.

:class:`JobGuard` runs a job with its own Spark job tag (the caller's job group, if
any, stays on the job) and watches it from a daemon thread (every :data:`POLL`
seconds, one cheap call into the driver JVM).  It cancels the tagged jobs when

* the job runs past its ``timeout`` (a task that never returns);
* an executor holding one of the job's shards is lost (``watch``): Spark would re-run
  that shard's task only after ``spark.locality.wait.process`` (sparknet sets 30 s, to
  keep placement sticky while executors live), and over state that is gone; the caller
  rebuilds the lost shards on the live executors instead;
* no executor has been left for :data:`NO_EXECUTOR_WAIT` seconds (a standalone or YARN
  application whose workers are all gone waits for resources forever).

The caller reads :attr:`JobGuard.reason` when the job fails.  In local mode the driver
is the executor: only the timeout applies.
"""
from __future__ import annotations

import itertools
import logging
import threading
import time
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from pyspark import SparkContext

log = logging.getLogger(__name__)

#: Seconds between two looks at the executors and the clock.
POLL = 0.25
#: Seconds an application may have no executor at all before its jobs fail.
NO_EXECUTOR_WAIT = 45.0
#: Local properties a guard sets for its job and restores afterwards.
_PROPS = ("spark.jobGroup.id", "spark.job.description", "spark.job.interruptOnCancel")
_ids = itertools.count()


def is_local(sc: SparkContext) -> bool:
    return (sc.master or "local").startswith("local")


def live_executors(sc: SparkContext) -> set[str] | None:
    """Ids of the executors registered with the driver now (not the driver); ``None`` in
    local mode, where the driver runs the tasks."""
    if is_local(sc):
        return None
    ids = sc._jsc.sc().getExecutorIds()
    return {str(ids.apply(i)) for i in range(ids.size())}


def block_homes(sc: SparkContext, rdd_id: int, partitions: int,
                wait: float = 3.0) -> dict[int, str]:
    """Partition -> id of the executor holding the persisted block of RDD ``rdd_id``
    (from the application's status store, which the listener bus fills a moment after
    the job ends: waits up to ``wait`` seconds for all ``partitions``).  Partitions
    whose block is nowhere are left out."""
    deadline = time.monotonic() + wait
    homes: dict[int, str] = {}
    while True:
        try:
            info = sc._jsc.sc().statusStore().rdd(int(rdd_id))
            parts = info.partitions()
            homes = {}
            seq = parts.get() if parts.isDefined() else None
            for p in (seq.apply(k) for k in range(seq.size())) if seq is not None else ():
                execs = p.executors()
                if execs.size():
                    homes[int(str(p.blockName()).rsplit("_", 1)[1])] = str(execs.apply(0))
        except Exception as exc:  # not in the store yet, or another Spark's internals
            log.debug("block locations of RDD %d: %s", rdd_id, exc)
        if len(homes) >= partitions or time.monotonic() > deadline:
            return homes
        time.sleep(0.05)


class JobGuard:
    """Context manager: the job(s) of the ``with`` block run with one new job tag (the
    caller's job group stays theirs), watched as the module docstring says.

    Args:
        sc: the SparkContext.
        what: what the job is, for messages (``"resident state train-..."``).
        timeout: seconds before the job is cancelled (``None``: no limit).
        watch: executor ids whose loss cancels the job (``None`` or empty: none).

    Attributes:
        group: the job tag (``SparkContext.cancelJobsWithTag`` cancels the block's jobs).
        reason: ``None``, or why the guard cancelled the job: ``"timeout"``,
            ``"lost"`` (then :attr:`lost` holds the executors) or ``"no executors"``.
        elapsed: seconds since the block began.
    """

    def __init__(self, sc: SparkContext, what: str, timeout: float | None = None,
                 watch: set[str] | None = None) -> None:
        if timeout is not None and not timeout > 0:
            raise ValueError("timeout must be a positive number of seconds or None, got "
                             f"{timeout!r}")
        self.sc, self.what, self.timeout = sc, what, timeout
        self.watch = set(watch or ())
        self.group = f"sparknet-{next(_ids)}-{what.split()[-1]}".replace(",", "_")
        self.reason: str | None = None
        self.lost: set[str] = set()
        self._done = threading.Event()
        self._saved: dict[str, Any] = {}
        self.description = f"sparknet: {what}"
        self._t0 = time.monotonic()
        self._thread: threading.Thread | None = None

    @property
    def elapsed(self) -> float:
        return time.monotonic() - self._t0

    def __enter__(self) -> "JobGuard":
        sc = self.sc
        self._saved = {k: sc.getLocalProperty(k) for k in _PROPS}
        self.description = self._saved.get("spark.job.description") or f"sparknet: {self.what}"
        # a job tag, not a job group: the caller's own job group (its UI grouping, its
        # cancelJobGroup) stays on the jobs
        sc.addJobTag(self.group)
        sc.setInterruptOnCancel(True)
        sc.setLocalProperty("spark.job.description", self.description)
        self._t0 = time.monotonic()
        cluster = not is_local(sc)
        if self.timeout is not None or cluster:
            self._thread = threading.Thread(target=self._watch, args=(cluster,), daemon=True,
                                            name=f"sparknet-guard-{self.group}")
            self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._done.set()
        if self._thread is not None:
            self._thread.join(timeout=5.0)
        self.sc.removeJobTag(self.group)
        for k, v in self._saved.items():
            self.sc.setLocalProperty(k, v)  # None removes it

    def cancel(self, reason: str) -> None:
        if self.reason is None:
            self.reason = reason
            log.debug("sparknet: cancelling the jobs tagged %s (%s)", self.group, reason)
        self.sc.cancelJobsWithTag(self.group)

    def _watch(self, cluster: bool) -> None:
        empty_since: float | None = None
        while not self._done.wait(POLL):
            try:
                if self.reason is not None:  # a job submitted after the first cancel
                    self.sc.cancelJobsWithTag(self.group)
                    continue
                if self.timeout is not None and self.elapsed > self.timeout:
                    self.cancel("timeout")
                    continue
                if not cluster:
                    continue
                live = live_executors(self.sc) or set()
                gone = self.watch - live
                if gone:
                    self.lost = gone
                    self.cancel("lost")
                    continue
                if live:
                    empty_since = None
                elif empty_since is None:
                    empty_since = time.monotonic()
                elif time.monotonic() - empty_since > NO_EXECUTOR_WAIT:
                    self.cancel("no executors")
            except Exception as exc:  # the context stopped under us: nothing left to guard
                log.debug("sparknet: job guard %s stops: %s", self.group, exc)
                return
