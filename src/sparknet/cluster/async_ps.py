"""Asynchronous parameter-server rounds (Downpour SGD) through Spark alone.

``DataParallelTrainer(model, spark, mode="async")`` trains like the synchronous
``sync="average"`` rounds of :mod:`sparknet.cluster.data_parallel` -- each partition
runs ``tau`` local optimizer steps on its resident shard, with its own optimizer state
resident next to the shard, and returns its weight delta -- but the partitions no
longer wait for each other:

* the driver runs **one single-partition Spark job per partition**
  (``SparkContext.runJob(anchor, f, partitions=[i])`` over the resident anchor RDD),
  each submitted from its own driver thread (:class:`pyspark.InheritableThread`, one
  Spark job group per partition), so Spark itself runs them concurrently; there is no
  HTTP or socket server of ours, only Spark's task results and broadcasts;
* a job starts from the **freshest parameters** (a ``Broadcast`` of the server's
  parameters at launch, shared by the jobs launched at the same version);
* when a job's delta arrives, the driver **applies it at once**
  (``params += weight * delta``), counts one update, and **relaunches that partition
  immediately** with the newest parameters (or, when another partition's round is
  due within a small window, together with it: see *Coalescing*).  Fast partitions
  thus do more of the work and nobody waits for a straggler (DistBelief's Downpour
  SGD, with Spark's scheduler in the role of the parameter-server shards' network).
  ``weight`` defaults to ``1 / num_partitions`` (``delta_weight=``): one delta from
  every partition then moves the parameters as far as one synchronous averaged round.

Coalescing
----------
Partitions of equal speed finish their rounds a few milliseconds apart.  Relaunched
at once, the first always restarts without the second's delta, one update behind,
round after round; on MNIST (benchmarks/README.md) that systematic lag cost async a
tenth of the time to 97% against synchronous rounds.  So when a delta arrives while
another partition's round is due within ``coalesce`` (default 0.15) of this
partition's own round time, the relaunch waits for that round (at most that long);
when it arrives, both restart together from the parameters that hold both deltas,
as after a synchronous round but without its barrier.  A straggler is never waited
for: its round is due long after the window.  Every update's ``held`` field gives
the seconds its partition's relaunch then waited (filled in ``history.updates`` when
the relaunch goes, so ``on_update`` sees 0); ``coalesce=0`` relaunches every
partition the moment its delta is applied (DistBelief's Downpour as written).

Staleness
---------
A delta launched at server version ``v0`` (the number of updates applied so far) and
arriving at version ``v`` has staleness ``v - v0``: the number of updates the server
applied while it was being computed.  ``max_staleness`` bounds it.  A delta past the
bound is **rejected by default** (``stale="reject"``): the model then never absorbs an
update computed on parameters more than ``max_staleness`` updates old, so the bound is
a hard guarantee (the property the convergence results for bounded-delay / stale
synchronous SGD rest on), and the partition is relaunched at once from the newest
parameters, so the only cost is that partition's last round.  ``stale="downweight"``
instead applies it scaled by ``(1 + max_staleness) / (1 + staleness)`` (1 at the bound,
decaying like ``1/staleness`` as in staleness-aware async SGD): no work is thrown away,
at the price of letting old deltas in.  Every arriving delta is recorded in
``history.updates`` (epoch, partition, launch version, staleness, weight, whether it
was applied, rows, arrival time, seconds its relaunch was held), and each epoch's
history gets ``updates`` (applied), ``rejected``, ``downweighted``,
``staleness_mean`` and ``staleness_max`` (of the applied deltas).  The default bound
is ``2 * num_partitions``: a partition half as fast as the others sees about
``2 (P - 1)`` updates during one of its rounds, so it stays inside the bound.

Budget of samples
-----------------
An epoch is a budget of ``N`` rows processed (``N`` = rows of the training set), the
same as one synchronous epoch, but no longer split evenly: a partition twice as fast
processes about twice as many rows, cycling through its own shard (partition ``p``'s
``k``-th pass over its shard uses the permutation of
``numpy.random.default_rng([seed, k, p])`` cut into ``rounds`` chunks of ``tau``
minibatches, exactly as in the synchronous schedule).  A partition that finishes
while others still compute launches one more round if it should end before them
(so nobody idles at the end of an epoch); the rows it takes beyond the epoch's budget
are counted against the next epoch, and the last epoch stops at the budget, so a fit of
``E`` epochs processes ``E * N`` rows (to one round's rows), as a synchronous fit does.
Each epoch ends with the in-flight rounds drained, so validation sees a model that
includes every round computed in that epoch.

Failures and interruption
-------------------------
A partition's job that fails (after Spark's own task retries,
``spark.task.maxFailures``; in ``local[N]`` there are none unless you write
``local[N,F]``) cancels the other partitions' jobs and raises
:class:`AsyncPartitionError` naming the partition and the executor's exception; the
driver never waits on a dead job (it polls its result queue and checks its threads).
A shard whose resident files vanished (``SPARKNET_RESIDENT_LOST``) is handled as in the
synchronous rounds: the driver cancels the other rounds, rebuilds the shards from the
source (twice per fit at most) and goes on; their rows return to the budget.
``KeyboardInterrupt`` on the driver (Ctrl-C, or raised by the ``on_update`` callback)
cancels every outstanding job (``SparkContext.cancelJobGroup`` with
``interruptOnCancel``), waits for the cancellations, and ``fit`` returns the model as
of the last applied update (the interrupted epoch is in the history, marked
``interrupted = 1``, without validation).

Testing and benchmark hooks
---------------------------
:func:`inject_faults` makes a partition slower (it sleeps ``factor`` times its compute
time after each training round: ``factor=1`` is half speed, as a busy or older machine
would be; or a fixed number of seconds) or makes its training task raise.  It applies to synchronous and
asynchronous training alike, so both are compared on the same straggler.

Example::

    trainer = DataParallelTrainer(model, spark, num_partitions=2, mode="async",
                                  max_staleness=4, local_steps=20, coalesce=0.15)
    model, history = trainer.fit(X, y, epochs=5, batch_size=64)
    [u["staleness"] for u in history.updates if u["applied"]]
"""
from __future__ import annotations

import contextlib
import logging
import math
import queue
import re
import threading
import time
import uuid
from dataclasses import dataclass, field
from typing import Any, Callable, Iterator

import numpy as np

from sparknet.cluster import data_parallel as dp
from sparknet.cluster.params import STATS
from sparknet.cluster.resident import ResidentStateLost, lost_reason

log = logging.getLogger(__name__)

_STALE = ("reject", "downweight")
#: seconds the driver waits for cancelled jobs to end before giving up on them
CANCEL_TIMEOUT = 60.0


class AsyncPartitionError(RuntimeError):
    """A partition's job failed during asynchronous training.

    Attributes:
        partition: the partition whose job failed.
    """

    def __init__(self, partition: int, message: str) -> None:
        super().__init__(message)
        self.partition = partition


# ---------------------------------------------------------------------------- options
@dataclass
class AsyncOptions:
    """Validated options of ``mode="async"`` (passed as keyword arguments of
    :class:`~sparknet.cluster.data_parallel.DataParallelTrainer`).

    Attributes:
        max_staleness: the staleness bound (``None``: ``2 * num_partitions``).
        stale: ``"reject"`` or ``"downweight"`` deltas past the bound.
        on_update: called on the driver after every arriving delta with a dict
            (``update`` = applied updates so far, ``partition``, ``staleness``,
            ``weight``, ``applied``, ``rows``, ``loss``, ``epoch``, ``time``,
            ``held``); raising
            ``KeyboardInterrupt`` from it interrupts the fit like Ctrl-C.
        delta_weight: weight of an on-time delta; ``None`` (default) is
            ``1 / num_partitions``, so that one delta from each partition moves the
            parameters as far as one synchronous averaged round.  ``1.0`` applies every
            delta in full (DistBelief's Downpour); with RMSprop's normalised steps that
            multiplies the effective learning rate by the number of partitions (on
            MNIST, 2 partitions: 95.5% test accuracy after 4 epochs against 97.7%).
        coalesce: when another partition's round is due within this fraction of a
            partition's own round time, that partition's relaunch waits for it, so
            both restart from the same parameters (see *Coalescing* above); ``0``
            relaunches at once.  A fraction in [0, 1]; default 0.15.
    """

    max_staleness: int | None = None
    stale: str = "reject"
    on_update: Callable[[dict], Any] | None = None
    delta_weight: float | None = None
    coalesce: float = 0.15


def _options(trainer, max_staleness: int | None = None, stale: str = "reject",
             on_update: Callable[[dict], Any] | None = None,
             delta_weight: float | None = None, coalesce: float = 0.15) -> AsyncOptions:
    """Validate the ``mode="async"`` keyword arguments of the trainer."""
    if max_staleness is not None and (isinstance(max_staleness, bool) or
                                      not isinstance(max_staleness, (int, np.integer)) or
                                      max_staleness < 0):
        raise ValueError(f"max_staleness must be a non-negative integer or None, got {max_staleness!r}")
    if stale not in _STALE:
        raise ValueError(f"stale must be 'reject' or 'downweight', got {stale!r}")
    if on_update is not None and not callable(on_update):
        raise ValueError(f"on_update must be callable, got {type(on_update).__name__}")
    w = None if delta_weight is None else float(delta_weight)
    if w is not None and not (math.isfinite(w) and w > 0):
        raise ValueError(f"delta_weight must be a positive number or None, got {delta_weight!r}")
    try:
        c = float(coalesce)
    except (TypeError, ValueError):
        c = math.nan
    if isinstance(coalesce, bool) or not (math.isfinite(c) and 0.0 <= c <= 1.0):
        raise ValueError(f"coalesce must be a fraction in [0, 1], got {coalesce!r}")
    if trainer.sync != "average":
        raise ValueError(f"mode='async' runs local steps then pushes deltas; it needs "
                         f"sync='average', got sync={trainer.sync!r}")
    return AsyncOptions(None if max_staleness is None else int(max_staleness), stale, on_update, w, c)


# ------------------------------------------------------------------ fault injection
class _FaultyRoundTask(dp._RoundTask):
    """A training task with injected faults (see :func:`inject_faults`); pickled by
    reference to this module, so the executors run the same code."""

    def __init__(self, *args, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        self._slow = dict(_FAULTS["slow"])
        self._delay = dict(_FAULTS["delay"])
        self._fail = dict(_FAULTS["fail"])

    def __call__(self, index: int, shard):
        training = self.kind in ("average", "gradient")
        if training and index in self._fail:
            raise RuntimeError(self._fail[index])
        t0 = time.perf_counter()
        out = super().__call__(index, shard)
        if training and (index in self._slow or index in self._delay):
            spent = time.perf_counter() - t0
            extra = self._slow.get(index, 0.0) * spent + self._delay.get(index, 0.0)
            time.sleep(extra)
            for r in out:  # the sleep is the slow machine's compute
                r.times = [t + extra for t in r.times]
        return out


_FAULTS: dict[str, dict] = {"slow": {}, "delay": {}, "fail": {}}
_FAULT_LOCK = threading.Lock()


@contextlib.contextmanager
def inject_faults(slow: dict[int, float] | None = None, delay: dict[int, float] | None = None,
                  fail: "dict[int, str] | list[int] | tuple[int, ...] | None" = None) -> Iterator[None]:
    """Inject a straggler or a failing task into data-parallel training (tests and
    benchmarks only).

    Inside the ``with`` block, the training tasks of every
    :class:`~sparknet.cluster.data_parallel.DataParallelTrainer` fit (synchronous and
    asynchronous; calibration probes and evaluation are untouched) built on this
    driver are replaced by a subclass that:

    * for ``slow={p: factor}``, sleeps ``factor`` times its own compute time after each
      training round of partition ``p`` (``factor=1.0``: the partition runs at half
      speed, as a busy or older machine would); the sleep counts as its compute time;
    * for ``delay={p: seconds}``, sleeps that many seconds after each training round of
      partition ``p`` (a fixed slowdown, for tests that need a round to last long);
    * for ``fail={p: message}`` (or a list of partitions), raises ``RuntimeError(message)``
      in partition ``p``'s training task.

    It works by swapping ``sparknet.cluster.data_parallel._RoundTask`` on the driver for
    the duration of the block, so do not run other fits concurrently in the process.

    Args:
        slow: partition -> slowdown factor (>= 0).
        delay: partition -> extra seconds per training round (>= 0).
        fail: partitions whose training task raises, or partition -> message.

    Raises:
        ValueError: negative partition, factor or delay.
    """
    slow = {int(k): float(v) for k, v in (slow or {}).items()}
    delay = {int(k): float(v) for k, v in (delay or {}).items()}
    if isinstance(fail, (list, tuple)):
        fail = {int(p): f"injected failure in partition {int(p)} (sparknet.cluster.async_ps.inject_faults)"
                for p in fail}
    fail = {int(k): str(v) for k, v in (fail or {}).items()}
    for what, d in (("slow", slow), ("delay", delay)):
        for k, v in d.items():
            if k < 0 or not (v >= 0 and math.isfinite(v)):
                raise ValueError(f"{what}: partition {k} value {v} (need partition >= 0 and a finite "
                                 f"value >= 0)")
    for k in fail:
        if k < 0:
            raise ValueError(f"fail: partition {k} must be >= 0")
    with _FAULT_LOCK:
        saved_cls, saved = dp._RoundTask, dict(_FAULTS)
        _FAULTS.update(slow=slow, delay=delay, fail=fail)
        dp._RoundTask = _FaultyRoundTask
    try:
        yield
    finally:
        with _FAULT_LOCK:
            dp._RoundTask = saved_cls
            _FAULTS.clear()
            _FAULTS.update(saved)


def _task_class():
    """The training task class in force (the data-parallel one, or the faulty one)."""
    return dp._RoundTask


# ---------------------------------------------------------------------- driver side
def _identity(it):
    return it


def _executor_message(exc: BaseException) -> str:
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
class _Launch:
    """One asynchronous round of one partition."""

    partition: int
    version: int
    bc: Any
    epoch: int          # the partition's own pass over its shard
    chunk: int
    rows: int
    started: float = 0.0


@dataclass
class _AsyncLog(dp._RoundLog):
    """What one asynchronous epoch returns to the trainer (see ``register_mode``): the
    synchronous epoch's log plus history entries and whether the fit was interrupted."""

    logs: dict = field(default_factory=dict)
    stop: bool = False


class _PartitionThread:
    """A driver thread that runs one partition's single-partition jobs, one at a time,
    in its own Spark job group."""

    def __init__(self, run: "_AsyncRun", index: int) -> None:
        from pyspark import InheritableThread

        self.run, self.index = run, index
        self.group = f"{run.group}-p{index}"
        self.inbox: "queue.Queue[_Launch | None]" = queue.Queue()
        self.busy: _Launch | None = None
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
                task = _task_class()(run.ctx.spec, job.bc, "average", epoch=job.epoch, rnd=job.chunk,
                                     rounds=run.rounds)
                rdd = run.resident.mapPartitions(task)
                sc.setLocalProperty("spark.job.description",
                                    f"sparknet async: partition {self.index} pass {job.epoch + 1} "
                                    f"chunk {job.chunk + 1}/{run.rounds} at version {job.version}")
                out = sc.runJob(rdd, _identity, partitions=[self.index])
                run.results.put((self.index, job, out, None))
            except BaseException as exc:  # noqa: BLE001 - reported to the driver loop
                run.results.put((self.index, job, None, exc))

    def submit(self, job: _Launch) -> None:
        self.busy = job
        self.inbox.put(job)

    def stop(self) -> None:
        self.inbox.put(None)


class _AsyncRun:
    """The asynchronous parameter server of one fit (lives across its epochs)."""

    def __init__(self, trainer, ctx) -> None:
        self.trainer, self.ctx = trainer, ctx
        self.opts: AsyncOptions = trainer.mode_options
        self.model = ctx.model
        self.sc = ctx.sc
        self.resident = ctx.train.resident
        self.rows = list(ctx.train.rows)
        self.P = len(self.rows)
        self.rounds = max(1, int(ctx.rounds))
        self.total = int(sum(self.rows))
        self.max_staleness = (2 * self.P if self.opts.max_staleness is None
                              else int(self.opts.max_staleness))
        self.delta_weight = (1.0 / self.P if self.opts.delta_weight is None
                             else float(self.opts.delta_weight))
        self.group = f"sparknet-async-{uuid.uuid4().hex[:8]}"
        self.version = 0            # updates applied so far
        self.dispatched = 0         # rows handed out, all epochs
        self.cursor = {p: [0, 0] for p in range(self.P)}  # partition -> [pass, chunk]
        self.est = {p: None for p in range(self.P)}       # EMA of a round's wall seconds
        self._bcs: dict[int, list] = {}                  # version -> [broadcast, refs]
        self.rebuilds = 0
        self.results: "queue.Queue[tuple]" = queue.Queue()
        self.t_start = time.perf_counter()
        self.updates: list[dict] = []
        history = getattr(ctx, "history", None)
        if history is not None:
            history.updates = self.updates
        log.info("sparknet async: %d partitions, %d chunks per pass, max_staleness=%d (%s)",
                 self.P, self.rounds, self.max_staleness, self.opts.stale)

    # -- broadcasts -------------------------------------------------------
    def _acquire(self) -> Any:
        ent = self._bcs.get(self.version)
        if ent is None:
            ent = [self.sc.broadcast(np.ascontiguousarray(self.model.params)), 0]
            self._bcs[self.version] = ent
        ent[1] += 1
        return ent[0]

    def _release(self, version: int) -> None:
        ent = self._bcs.get(version)
        if ent is None:
            return
        ent[1] -= 1
        if ent[1] <= 0 and version != self.version:
            self._destroy(version)

    def _destroy(self, version: int) -> None:
        ent = self._bcs.pop(version, None)
        if ent is not None:
            try:
                ent[0].destroy(blocking=False)
            except Exception as exc:  # pragma: no cover - context stopped
                log.debug("broadcast cleanup failed: %s", exc)

    def _drop_broadcasts(self) -> None:
        for v in list(self._bcs):
            if self._bcs[v][1] <= 0:
                self._destroy(v)

    # -- scheduling -------------------------------------------------------
    def _chunk_rows(self, p: int, chunk: int) -> int:
        n = self.rows[p]
        return n * (chunk + 1) // self.rounds - n * chunk // self.rounds

    def _launch(self, w: _PartitionThread) -> None:
        p = w.index
        e, c = self.cursor[p]
        rows = self._chunk_rows(p, c)
        job = _Launch(p, self.version, self._acquire(), e, c, rows, time.perf_counter())
        c += 1
        if c >= self.rounds:
            e, c = e + 1, 0
        self.cursor[p] = [e, c]
        self.dispatched += rows
        w.submit(job)

    def _may_launch(self, w: _PartitionThread, target: int, last: bool, workers) -> bool:
        if self.rows[w.index] == 0:
            return False
        if self.dispatched < target:
            return True
        if last:
            return False
        # past the epoch's budget: one more round only if it should end before the
        # rounds still in flight (its rows count against the next epoch)
        now = time.perf_counter()
        ends = [x.busy.started + (self.est[x.index] or 0.0) for x in workers if x.busy is not None]
        mine = self.est[w.index]
        return bool(ends) and mine is not None and now + mine <= max(ends)

    # -- one epoch --------------------------------------------------------
    def epoch(self, epoch: int) -> _AsyncLog:
        ctx, model, opts = self.ctx, self.model, self.opts
        last = epoch == ctx.epochs - 1
        target = (epoch + 1) * self.total
        rl = _AsyncLog()
        bar = getattr(ctx, "bar", None)
        if bar is not None:
            with contextlib.suppress(Exception):
                bar.total = max(1, math.ceil(max(target - self.dispatched, 0) /
                                             max(1, self.total // (self.P * self.rounds))))
        t0 = time.perf_counter()
        workers = [_PartitionThread(self, p) for p in range(self.P)]
        applied = rejected = down = 0
        stale_seen: list[int] = []
        held: dict[int, tuple[float, dict]] = {}  # partition -> (deadline, its update's record)

        def release(q: int) -> None:  # a deferred relaunch goes now; record how long it waited
            _deadline, rec = held.pop(q)
            rec["held"] = time.perf_counter() - self.t_start - rec["time"]
            if self._may_launch(workers[q], target, last, workers):
                self._launch(workers[q])

        failure: BaseException | None = None
        try:
            for w in workers:
                if self._may_launch(w, target, last, workers):
                    self._launch(w)
            while held or any(w.busy is not None for w in workers):
                wait = 0.25
                if held:
                    wait = max(0.0, min(min(d for d, _ in held.values()) - time.perf_counter(), wait))
                try:
                    p, job, out, exc = self.results.get(timeout=wait)
                except queue.Empty:
                    now = time.perf_counter()
                    for q in [q for q, (d, _) in held.items() if d <= now]:
                        release(q)
                    self._check_threads(workers)
                    continue
                w = workers[p]
                w.busy = None
                self._release(job.version)
                if exc is not None:
                    if lost_reason(exc) is not None and self._may_rebuild():
                        self._rebuild(workers, job)
                        held.clear()  # relaunched here with the others
                        for x in workers:
                            if x.busy is None and self._may_launch(x, target, last, workers):
                                self._launch(x)
                        continue
                    raise self._failure(p, job, exc)
                res = out[0] if out else None
                wall = time.perf_counter() - job.started
                self.est[p] = wall if self.est[p] is None else 0.5 * self.est[p] + 0.5 * wall
                staleness = self.version - job.version
                weight, ok = self.delta_weight, True
                if staleness > self.max_staleness:
                    if opts.stale == "reject":
                        weight, ok = 0.0, False
                        rejected += 1
                    else:
                        weight *= (1.0 + self.max_staleness) / (1.0 + staleness)
                        down += 1
                rows = 0
                loss = float("nan")
                if res is not None:
                    rl.stats += res.stats
                    rl.compute += max(res.times) if res.times else 0.0
                    rows = int(res.stat("samples"))
                    if res.stat("weight_sum") > 0:
                        loss = res.stat("loss_sum") / res.stat("weight_sum")
                    if ok and res.vec is not None and rows > 0:
                        model.params += (res.vec * model.dtype.type(weight / rows)).astype(
                            model.dtype, copy=False)
                        self.version += 1
                        applied += 1
                        stale_seen.append(staleness)
                        if self.version - 1 in self._bcs and self._bcs[self.version - 1][1] <= 0:
                            self._destroy(self.version - 1)
                    elif ok:
                        ok = False  # an empty round: nothing to apply
                rl.rounds += 1
                for q in list(held):  # a fresher model: the deferred relaunches go now
                    release(q)
                hold = self._hold(w, workers)
                rec = {"epoch": epoch, "partition": p, "version": job.version, "staleness": staleness,
                       "weight": weight if ok else 0.0, "applied": ok, "rows": rows, "loss": loss,
                       "time": time.perf_counter() - self.t_start, "update": self.version,
                       "held": 0.0}
                self.updates.append(rec)
                if opts.on_update is not None:  # before its relaunch: it sees this update's model
                    opts.on_update(dict(rec))
                if hold > 0:
                    held[p] = (time.perf_counter() + hold, rec)
                elif self._may_launch(w, target, last, workers):
                    self._launch(w)
                if bar is not None:
                    bar.update(1)
                    w_sum = max(rl.stats[1], 1e-12)
                    post = {"loss": f"{rl.stats[0] / w_sum:.4f}", "stale": staleness}
                    bar.set_postfix(post, refresh=False)
        except KeyboardInterrupt:
            n = self._cancel(workers)
            log.warning("sparknet async: interrupted; cancelled %d outstanding job(s); the model is "
                        "as of update %d", n, self.version)
            rl.stop = True
        except BaseException as exc:
            failure = exc
            raise
        finally:
            if failure is not None:
                self._cancel(workers)
            for w in workers:
                w.stop()
            for w in workers:
                w.thread.join(timeout=5.0)
            self._drop_broadcasts()
        rl.wall = (time.perf_counter() - t0) * max(1, self.P)
        st = dict(zip(STATS, rl.stats))
        rl.logs = {
            "rounds": rl.rounds,
            "local_steps": st["steps"] / max(rl.rounds, 1),
            "updates": applied, "rejected": rejected, "downweighted": down,
            "staleness_mean": float(np.mean(stale_seen)) if stale_seen else 0.0,
            "staleness_max": float(max(stale_seen)) if stale_seen else 0.0,
            "max_staleness": self.max_staleness, "samples": st["samples"],
            "rounds_per_pass": self.rounds,
            "interrupted": 1.0 if rl.stop else 0.0,
        }
        return rl

    def _hold(self, w: _PartitionThread, workers) -> float:
        """Seconds ``w``'s relaunch may wait (0: relaunch now): the whole window,
        ``coalesce`` x ``w``'s own round time, when another partition's round is due
        within it (or overdue, or has no finished round to predict it by).  Any
        arriving delta ends the wait, so both restart from the same parameters.
        Only rounds launched before the latest update count: one launched since
        already starts where ``w`` would."""
        frac, mine = self.opts.coalesce, self.est[w.index]
        if frac <= 0 or mine is None:
            return 0.0
        now = time.perf_counter()
        window = frac * mine
        for x in workers:
            if x is w or x.busy is None or x.busy.version >= self.version:
                continue
            est = self.est[x.index]
            if est is None or x.busy.started + est - now <= window:
                return window
        return 0.0

    def _check_threads(self, workers) -> None:
        for w in workers:
            if w.busy is not None and not w.thread.is_alive():
                raise AsyncPartitionError(w.index, f"the driver thread of partition {w.index} died "
                                                   f"without a result")

    def _failure(self, p: int, job: _Launch, exc: BaseException) -> BaseException:
        if isinstance(exc, KeyboardInterrupt):
            return exc
        msg = _executor_message(exc)
        reason = lost_reason(exc)
        if reason is not None:
            return ResidentStateLost(f"partition {p}: {reason}")
        return AsyncPartitionError(
            p, f"asynchronous training failed: partition {p}'s job (pass {job.epoch + 1}, chunk "
               f"{job.chunk + 1}/{self.rounds}, launched at update {job.version}) failed after "
               f"Spark's task retries: {msg}")

    def _may_rebuild(self) -> bool:
        return self.resident.on_lost == "rebuild" and self.rebuilds < 2

    def _rebuild(self, workers, lost: _Launch) -> None:
        """A shard's files vanished (its executor's host changed or they were deleted):
        stop the other rounds, rebuild every shard from the source, as the synchronous
        rounds do; the rows of the lost and cancelled rounds go back into the budget."""
        self.rebuilds += 1
        self.dispatched -= lost.rows
        back = [w.busy for w in workers if w.busy is not None]
        self._cancel(workers)
        self.dispatched -= sum(j.rows for j in back)
        log.warning("sparknet async: resident training data of partition %d lost; rebuilding all "
                    "shards (partition optimizer state restarts from zero)", lost.partition)
        self.resident.rebuild()

    def _cancel(self, workers) -> int:
        """Cancel every outstanding job and wait (bounded) until each has ended."""
        busy = [w for w in workers if w.busy is not None]
        for w in busy:
            self.sc.cancelJobGroup(w.group)
        deadline = time.monotonic() + CANCEL_TIMEOUT
        while any(w.busy is not None for w in workers) and time.monotonic() < deadline:
            try:
                p, job, _out, _exc = self.results.get(timeout=0.25)
            except queue.Empty:
                if not any(w.thread.is_alive() for w in workers if w.busy is not None):
                    break
                continue
            workers[p].busy = None
            self._release(job.version)
        left = [w.index for w in workers if w.busy is not None]
        if left:
            log.warning("sparknet async: jobs of partitions %s did not end within %.0f s of "
                        "cancellation", left, CANCEL_TIMEOUT)
        return len(busy)


def async_epoch(trainer, ctx, epoch: int) -> _AsyncLog:
    """The epoch runner of ``mode="async"`` (registered with
    :func:`~sparknet.cluster.data_parallel.register_mode`)."""
    run = getattr(ctx, "_async_run", None)
    if run is None:
        run = _AsyncRun(trainer, ctx)
        ctx._async_run = run
    return run.epoch(epoch)


dp.register_mode("async", async_epoch, options=_options)
