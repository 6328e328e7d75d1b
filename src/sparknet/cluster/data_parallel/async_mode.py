"""Asynchronous parameter-server rounds (Downpour SGD) through Spark alone.

``DataParallelTrainer(model, spark, mode="async")`` trains like the synchronous
``sync="average"`` rounds of :mod:`sparknet.cluster.data_parallel.trainer` -- each partition
runs ``tau`` local optimizer steps on its resident shard, with its own optimizer state
resident next to the shard, and returns its weight delta -- but the partitions no
longer wait for each other:

* the driver runs **one single-partition Spark job per partition**
  (``SparkContext.runJob(anchor, f, partitions=[i])`` over the resident anchor RDD;
  under Spark Connect one query per partition over the anchor DataFrame, whose other
  tasks return at once: :meth:`ConnectResident.run_partition
  <sparknet.cluster.engine.connect.ConnectResident.run_partition>`),
  each submitted from its own driver thread (:class:`pyspark.InheritableThread`, one
  Spark job group per partition, a session tag under Connect), so Spark itself runs them
  concurrently; there is no HTTP or socket server of ours, only Spark's task results and broadcasts;
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
A shard whose resident files vanished (``SPARKNET_RESIDENT_LOST``), or whose executor is
gone, is handled as in the synchronous rounds and reported with the same lines
(:mod:`~sparknet.cluster.data_parallel.async_recovery`): the driver cancels the other rounds,
rebuilds the shards from the source (twice per fit at most), restores their optimizer state
or says it restarts, and goes on; their rows return to the budget.
``KeyboardInterrupt`` on the driver (Ctrl-C, or raised by the ``on_update`` callback)
cancels every outstanding job (``SparkContext.cancelJobGroup`` with
``interruptOnCancel``), waits for the cancellations, and ``fit`` returns the model as
of the last applied update (the interrupted epoch is in the history, marked
``interrupted = 1``, without validation).

Testing and benchmark hooks
---------------------------
:func:`sparknet.cluster.testing.inject_faults` makes a partition slower (it sleeps
``factor`` times its compute time after each training round: ``factor=1`` is half
speed, as a busy or older machine would be; or a fixed number of seconds) or makes its
training task raise.  It applies to synchronous and asynchronous training alike, so
both are compared on the same straggler.

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
import time
import uuid
from typing import TYPE_CHECKING, Any

import numpy as np

from sparknet.cluster.data_parallel import async_recovery as recovery
from sparknet.cluster.data_parallel import guards, layer_state
from sparknet.cluster.data_parallel.async_options import (  # noqa: F401 - importable here too
    AsyncOptions,
    check_options,
)
from sparknet.cluster.data_parallel.async_recovery import AsyncPartitionError  # noqa: F401
from sparknet.cluster.data_parallel.async_threads import AsyncEpoch, Launch, PartitionThread
from sparknet.cluster.data_parallel.fit_context import FitContext, RoundLog
from sparknet.cluster.data_parallel.parameter_server import STATS, RoundResult
from sparknet.cluster.data_parallel.round_task import chunk_bounds, chunk_lrs
from sparknet.errors import RoundTimeout

if TYPE_CHECKING:
    from sparknet.cluster.data_parallel.trainer import DataParallelTrainer

log = logging.getLogger(__name__)

#: seconds the driver waits for cancelled jobs to end before giving up on them
CANCEL_TIMEOUT = 60.0


# ---------------------------------------------------------------------- driver side
class AsyncRun:
    """The asynchronous parameter server of one fit (lives across its epochs)."""

    def __init__(self, trainer: DataParallelTrainer, ctx: FitContext) -> None:
        self.trainer, self.ctx = trainer, ctx
        if trainer.mode_options is None:
            raise RuntimeError("an asynchronous epoch of a trainer built with mode="
                               f"{trainer.mode!r}")
        self.opts: AsyncOptions = trainer.mode_options
        self.model = ctx.model
        self.engine = ctx.engine
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
        self.version, self.dispatched = 0, 0  # updates applied so far, rows handed out (all epochs)
        self.cursor = {p: [0, 0] for p in range(self.P)}  # partition -> [pass, chunk]
        # EMA of a round's wall seconds
        self.est: dict[int, float | None] = dict.fromkeys(range(self.P))
        self._bcs: dict[int, list] = {}                  # version -> [broadcast, refs]
        self.rebuilds = 0
        self.layer_states = layer_state.LatestStates()  # each partition's newest running statistics
        saved = ctx.mode_resume  # the server's counters from the checkpoint resumed from
        if saved:
            self.version, self.dispatched = int(saved["version"]), int(saved["dispatched"])
            self.cursor = {int(p): [int(e), int(c)] for p, (e, c) in saved["cursor"].items()}
        self.results: "queue.Queue[tuple]" = queue.Queue()
        self.t_start = time.perf_counter()
        self.updates: list[dict] = ctx.history.updates
        log.info("sparknet async: %d partitions, %d chunks per pass, max_staleness=%d (%s)",
                 self.P, self.rounds, self.max_staleness, self.opts.stale)

    def _acquire(self) -> Any:
        ent = self._bcs.get(self.version)
        if ent is None:
            ent = [self.engine.ship(layer_state.shipped(self.model.params, self.model.state)), 0]
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
        for v in [v for v, ent in self._bcs.items() if ent[1] <= 0]:
            self._destroy(v)

    def checkpoint_meta(self) -> dict[str, Any]:
        """The server's counters a checkpoint holds (taken at an epoch's end, nothing in flight)."""
        return {"version": self.version, "dispatched": self.dispatched,
                "cursor": {str(p): list(c) for p, c in self.cursor.items()}}

    def _timeout(self, w: PartitionThread) -> float | None:
        """Seconds partition ``w``'s round may run (the fit's ``round_timeout``)."""
        done = [e for e in self.est.values() if e is not None]
        return self.ctx.state.timeout("async", max(done) if done else None)

    def _check_deadlines(self, st: AsyncEpoch) -> None:
        """``RoundTimeout`` when a partition's round has run past the round timeout (the
        epoch's ``finally`` cancels every job)."""
        now = time.perf_counter()
        for w in st.workers:
            limit = self._timeout(w) if w.busy is not None else None
            if w.busy is not None and limit is not None and now - w.busy.started > limit:
                raise RoundTimeout(f"asynchronous round of partition {w.index} (pass "
                                   f"{w.busy.epoch + 1}, chunk {w.busy.chunk + 1}/{self.rounds}) "
                                   f"ran past round_timeout={limit:.0f} s; its jobs were "
                                   "cancelled. Set DataParallelTrainer(round_timeout=...) to "
                                   "seconds, or None to wait forever")

    # -- scheduling -------------------------------------------------------
    def _chunk_rows(self, p: int, chunk: int) -> int:
        start, stop = chunk_bounds(self.rows[p], chunk, self.rounds)
        return stop - start

    def _launch(self, w: PartitionThread) -> None:
        p = w.index
        e, c = self.cursor[p]
        rows = self._chunk_rows(p, c)
        job = Launch(p, self.version, self._acquire(), e, c, rows, time.perf_counter(),
                     lr=float(self.trainer.optimizer.lr))
        c += 1
        if c >= self.rounds:
            e, c = e + 1, 0
        self.cursor[p] = [e, c]
        self.dispatched += rows
        w.submit(job)

    def _may_launch(self, w: PartitionThread, st: AsyncEpoch) -> bool:
        if self.rows[w.index] == 0:
            return False
        if self.dispatched < st.target:
            return True
        if st.last:
            return False
        # past the epoch's budget: one more round only if it should end before the
        # rounds still in flight (its rows count against the next epoch)
        now = time.perf_counter()
        ends = [x.busy.started + (self.est[x.index] or 0.0)
                for x in st.workers if x.busy is not None]
        mine = self.est[w.index]
        return bool(ends) and mine is not None and now + mine <= max(ends)

    def _launch_if_due(self, w: PartitionThread, st: AsyncEpoch) -> None:
        if self._may_launch(w, st):
            self._launch(w)

    # -- one epoch --------------------------------------------------------
    def epoch(self, epoch: int) -> RoundLog:
        """Run the rounds of ``epoch`` until its budget of rows is processed and every
        round in flight has come back (or the fit is interrupted)."""
        target = (epoch + 1) * self.total
        st = AsyncEpoch(epoch, epoch == self.ctx.epochs - 1, target,
                    [PartitionThread(self, p) for p in range(self.P)])
        bar = self.ctx.bar
        if bar is not None:
            with contextlib.suppress(Exception):
                bar.total = max(1, math.ceil(max(target - self.dispatched, 0) /
                                             max(1, self.total // (self.P * self.rounds))))
        t0 = time.perf_counter()
        failure: BaseException | None = None
        try:
            self.ctx.state.before_round(self.ctx, standalone=True)  # a resumed fit's partitions
            self._serve(st)
        except KeyboardInterrupt:
            n = self._cancel(st.workers)
            log.warning("sparknet async: interrupted; cancelled %d outstanding job(s); the model "
                        "is as of update %d", n, self.version)
            st.log.stop = True
        except BaseException as exc:
            failure = exc
            raise
        finally:
            self._end(st, cancel=failure is not None)
        st.log.wall = (time.perf_counter() - t0) * max(1, self.P)
        st.log.logs = self._epoch_logs(st)
        return st.log

    def _serve(self, st: AsyncEpoch) -> None:
        """The driver loop: launch, then take each arriving result until none is out."""
        for w in st.workers:
            self._launch_if_due(w, st)
        while st.busy():
            wait = 0.25
            if st.held:
                wait = max(0.0, min(min(d for d, _ in st.held.values()) - time.perf_counter(),
                                    wait))
            try:
                p, job, out, exc = self.results.get(timeout=wait)
            except queue.Empty:
                now = time.perf_counter()
                for q in [q for q, (d, _) in st.held.items() if d <= now]:
                    self._relaunch_held(st, q)
                self._check_threads(st.workers)
                self._check_deadlines(st)
                recovery.watch(self, st)  # an executor holding a shard gone: rebuild, relaunch
                continue
            st.workers[p].busy = None
            self._release(job.version)
            if exc is not None:
                self._recover(st, p, job, exc)
            else:
                self._arrive(st, p, job, self.ctx.ps.received(out[0]) if out else None)

    def _recover(self, st: AsyncEpoch, p: int, job: Launch, exc: BaseException) -> None:
        """A failed job (:func:`~sparknet.cluster.data_parallel.async_recovery.recover`)."""
        recovery.recover(self, st, p, job, exc)

    def _arrive(self, st: AsyncEpoch, p: int, job: Launch, res: RoundResult | None) -> None:
        """A partition's delta is back: weigh it by its staleness, apply it, record it,
        then relaunch the partition (now, or held for a round due soon)."""
        w = st.workers[p]
        wall = time.perf_counter() - job.started
        prev = self.est[p]
        self.est[p] = wall if prev is None else 0.5 * prev + 0.5 * wall
        staleness = self.version - job.version
        weight, ok = self._weigh(st, staleness)
        rows, loss = 0, float("nan")
        if res is not None:
            rows, loss, ok = self._apply(st, res, staleness, weight, ok, p)
        st.log.rounds += 1
        for q in list(st.held):  # a fresher model: the deferred relaunches go now
            self._relaunch_held(st, q)
        hold = self._hold(w, st.workers)
        rec = {"epoch": st.epoch, "partition": p, "version": job.version, "staleness": staleness,
               "weight": weight if ok else 0.0, "applied": ok, "rows": rows, "loss": loss,
               "time": time.perf_counter() - self.t_start, "update": self.version, "held": 0.0}
        self.updates.append(rec)
        if self.opts.on_update is not None:  # before its relaunch: it sees this update's model
            self.opts.on_update(dict(rec))
        self._callbacks(st, p, job, rec)
        if hold > 0:
            st.held[p] = (time.perf_counter() + hold, rec)
        else:
            self._launch_if_due(w, st)
        bar = self.ctx.bar
        if bar is not None:
            bar.update(1)
            w_sum = max(st.log.stats[1], 1e-12)
            bar.set_postfix({"loss": f"{st.log.stats[0] / w_sum:.4f}", "stale": staleness},
                            refresh=False)

    def _callbacks(self, st: AsyncEpoch, p: int, job: Launch, rec: dict) -> None:
        """The fit's callbacks hear of the update; the rates its local steps ran at are recorded."""
        cbl, schedule = self.ctx.callbacks, self.ctx.schedule
        if schedule is not None:
            cbl.record_steps(chunk_lrs(schedule, self.rows[p], self.ctx.batch_size, job.epoch,
                                       job.chunk, self.rounds), partition=p)
        logs = {k: float(v) for k, v in rec.items()}
        logs["rounds_done"] = float(self.ctx.state.rounds_done + st.log.rounds)
        cbl.on_round_end(st.log.rounds - 1, logs)

    def _weigh(self, st: AsyncEpoch, staleness: int) -> tuple[float, bool]:
        """(weight, whether to apply) of a delta ``staleness`` updates old."""
        if staleness <= self.max_staleness:
            return self.delta_weight, True
        if self.opts.stale == "reject":
            st.rejected += 1
            return 0.0, False
        st.downweighted += 1
        return self.delta_weight * (1.0 + self.max_staleness) / (1.0 + staleness), True

    def _apply(self, st: AsyncEpoch, res: RoundResult, staleness: int, weight: float,
               ok: bool, p: int) -> tuple[int, float, bool]:
        """``params += weight * delta / rows``, the layers' state from the partitions' newest,
        when ``ok`` and the round had rows; returns (rows, mean loss, whether it was applied).
        A non-finite delta or loss of partition ``p`` is never applied (``TrainingDiverged``)."""
        model = self.model
        st.log.stats += res.stats
        st.log.compute += max(res.times) if res.times else 0.0
        rows = int(res.stat("samples"))
        weight_sum = res.stat("weight_sum")
        loss = res.stat("loss_sum") / weight_sum if weight_sum > 0 else float("nan")
        where = {"lr": self.trainer.optimizer.lr, "epoch": st.epoch + 1, "round": st.log.rounds + 1,
                 "partition": p}
        guards.check_result(res, "delta", **where)
        if not (ok and res.vec is not None and rows > 0):
            return rows, loss, False  # rejected, or an empty round: nothing to apply
        before = np.array(model.params, copy=True)
        model.params += (res.vec * model.dtype.type(weight / rows)).astype(model.dtype, copy=False)
        guards.check_params(model.params, before, **where)
        self.layer_states.arrive(p, res, model)
        self.version += 1
        st.applied += 1
        st.staleness.append(staleness)
        if self.version - 1 in self._bcs and self._bcs[self.version - 1][1] <= 0:
            self._destroy(self.version - 1)
        return rows, loss, True

    def _relaunch_held(self, st: AsyncEpoch, q: int) -> None:
        """A deferred relaunch goes now; its update's record says how long it waited."""
        _deadline, rec = st.held.pop(q)
        rec["held"] = time.perf_counter() - self.t_start - rec["time"]
        self._launch_if_due(st.workers[q], st)

    def _end(self, st: AsyncEpoch, cancel: bool) -> None:
        if cancel:
            self._cancel(st.workers)
        for w in st.workers:
            w.stop()
        for w in st.workers:
            w.thread.join(timeout=5.0)
        self._drop_broadcasts()

    def _epoch_logs(self, st: AsyncEpoch) -> dict[str, float]:
        """The epoch's history entries besides the synchronous ones."""
        rl = st.log
        stats = dict(zip(STATS, rl.stats))
        seen = st.staleness
        return {
            "rounds": rl.rounds,
            "local_steps": stats["steps"] / max(rl.rounds, 1),
            "updates": st.applied, "rejected": st.rejected, "downweighted": st.downweighted,
            "staleness_mean": float(np.mean(seen)) if seen else 0.0,
            "staleness_max": float(max(seen)) if seen else 0.0,
            "max_staleness": self.max_staleness, "samples": stats["samples"],
            "rounds_per_pass": self.rounds,
            "interrupted": 1.0 if rl.stop else 0.0,
        }

    def _hold(self, w: PartitionThread, workers: list[PartitionThread]) -> float:
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

    def _check_threads(self, workers: list[PartitionThread]) -> None:
        for w in workers:
            if w.busy is not None and not w.thread.is_alive():
                raise AsyncPartitionError(w.index, f"the driver thread of partition {w.index} died "
                                                   f"without a result")

    def _cancel(self, workers: list[PartitionThread]) -> int:
        """Cancel every outstanding job and wait (bounded) until each has ended."""
        busy = [w for w in workers if w.busy is not None]
        for w in busy:
            self.engine.cancel_group(w.group)
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


def async_epoch(trainer: DataParallelTrainer, ctx: FitContext, epoch: int) -> RoundLog:
    """One epoch of ``mode="async"``, as the trainer runs it; the fit's asynchronous server
    lives in ``ctx.mode_state`` across its epochs."""
    if ctx.mode_state is None:
        ctx.mode_state = AsyncRun(trainer, ctx)
    return ctx.mode_state.epoch(epoch)
