"""Driver side of one data-parallel fit: the round length (calibration and re-sizing),
the synchronous rounds and evaluation on the executors.

:class:`~sparknet.cluster.data_parallel.trainer.DataParallelTrainer` makes one
:class:`FitContext` per ``fit`` (or ``evaluate``); an asynchronous epoch
(:mod:`~sparknet.cluster.data_parallel.async_mode`) receives it too.
"""
from __future__ import annotations

import logging
import math
import time
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Callable

import numpy as np

from sparknet.cluster.data.sharding import ShardedData
from sparknet.cluster.data_parallel import guards, layer_state
from sparknet.cluster.data_parallel.parameter_server import (
    STATS,
    ParameterServer,
    RoundResult,
    stat_totals,
)
from sparknet.cluster.data_parallel.round_task import FitSpec, TaskKind, chunk_lrs, make_task
from sparknet.cluster.planning.cost import RoundCostModel
from sparknet.cluster.planning.rounds import (  # noqa: F401 - the sizing's constants, re-exported
    DROP_MARGIN,
    FIXED_S_PER_MIB,
    FIXED_WINDOW,
    MIN_FIXED_S,
    ROUND_SHARES,
    SIZED,
    RoundSize,
    choose_tau,
    measured_cost,
    nominal_cost,
    resize_rounds,
    size_rounds,
)
from sparknet.history import FitHistory
from sparknet.model import Sequential
from sparknet.schedules import ScheduledLR

if TYPE_CHECKING:
    from sparknet.callbacks import CallbackList
    from sparknet.cluster.data_parallel.checkpoints import FitState
    from sparknet.cluster.data_parallel.trainer import DataParallelTrainer
    from sparknet.cluster.engine.base import Engine
    from sparknet.cluster.resident.driver import Resident

log = logging.getLogger(__name__)

#: Round costs measured by the last fit on a set of (reused) training shards, for a
#: network, dtype, batch size and mode: a later fit there sizes its first rounds from
#: them instead of a probe round.  Keyed by :func:`_cost_key`; the newest 32 are kept.
_MEASURED: dict[tuple, RoundCostModel] = {}

#: Applications whose first shard job a fit of this process has estimated from: that
#: job's scheduling and results hold one-time costs of the session (0.40 s against 0.06 s
#: for the next one, ``benchmarks/README.md``, "fast AMD EPYC"), which, read as the
#: fixed cost of every round, made a first fit's rounds span several epochs.
_ESTIMATED_APPS: set[str] = set()


def _count(n: int, noun: str) -> str:
    """``"1 round"``, ``"4 rounds"``."""
    return f"{n} {noun}" if n == 1 else f"{n} {noun}s"


def run_action(resident: "Resident", action: Callable[[], Any], timeout: float | None) -> Any:
    """``resident.run_action(action, timeout=timeout)``: past ``timeout`` seconds the
    action's Spark job group is cancelled and :class:`~sparknet.errors.RoundTimeout` raised."""
    return resident.run_action(action, timeout=timeout)


@dataclass
class RoundLog:
    """What the rounds of one epoch (or of one multi-epoch round) add up to, in either mode."""

    wall: float = 0.0
    compute: float = 0.0
    rounds: int = 0
    stats: np.ndarray = field(default_factory=lambda: np.zeros(len(STATS)))
    #: each round's wall seconds less its slowest task's compute: Spark's fixed cost
    fixed: list[float] = field(default_factory=list)
    #: the mode's own figures for the epoch's history entry (async: staleness, updates...)
    logs: dict[str, float] = field(default_factory=dict)
    #: the epoch was cut short (async: interrupted): the fit ends after it, unvalidated
    stop: bool = False


@dataclass
class FitContext:
    """The state of one fit on the driver: rounds, calibration, evaluation.

    Attributes:
        trainer: the trainer running the fit.
        spec: what every task of the fit needs.
        train: the resident training shards.
        val: the resident validation shards, if any.
        ps: the parameter server (broadcasts and sums).
        epochs: epochs of the fit.
        batch_size: the fit's ``batch_size``.
        history: the fit's history.
        state: checkpoints, resident optimizer state and job times of the fit
            (:class:`~sparknet.cluster.data_parallel.checkpoints.FitState`).
        callbacks: the fit's :class:`~sparknet.callbacks.CallbackList`.
        cost: the round cost model, once measured: by the probe round
            (``local_steps="timed"``), else from the first epoch's rounds.
        rounds: rounds per epoch.
        steps_per_round: local steps per partition in one round.
        epochs_per_round: epochs one round spans (``sync="average"``).
        bar: the progress bar of the running epoch (the async mode updates it).
        mode_state: what the async mode keeps across the epochs of the fit.
        mode_resume: what the async mode stored in the checkpoint the fit resumed from.
        schedule: the per-step learning-rate schedule of the fit, if any (set on the
            driver's steps with ``sync="gradient"``, carried by the tasks otherwise).
    """

    trainer: DataParallelTrainer
    spec: FitSpec
    train: ShardedData
    val: ShardedData | None
    ps: ParameterServer
    epochs: int
    batch_size: int
    history: FitHistory
    state: FitState
    callbacks: CallbackList
    cost: RoundCostModel | None = None
    rounds: int = 1
    steps_per_round: int = 1
    epochs_per_round: int = 1
    bar: Any = None
    progress: Any = None
    mode_state: Any = None
    mode_resume: Any = None
    schedule: ScheduledLR | None = None
    # the last measured rounds' fixed costs (resize)
    fixed_seen: list[float] = field(default_factory=list)

    @property
    def model(self) -> Sequential:
        return self.trainer.model

    @property
    def engine(self) -> "Engine":
        """The fit's engine (:mod:`sparknet.cluster.engine.base`)."""
        return self.ps.engine

    def describe_round(self, span: int | None = None) -> str:
        """The rounds as run: their steps, and how many an epoch holds (or how many epochs
        one spans).  ``span``: the epochs a round of several really spans (the fit's last
        epochs cut it short); default ``epochs_per_round``."""
        if self.trainer.sync == "gradient":
            return (f"rounds of 1 global step of {self.batch_size} rows, "
                    f"{_count(self.rounds, 'round')} per epoch")
        m = self.epochs_per_round if span is None else max(1, min(int(span), self.epochs_per_round))
        if m > 1:
            steps = self.steps_per_round // self.epochs_per_round * m
            return (f"rounds of {m} epochs (~{steps} local steps of {self.batch_size} rows), "
                    f"1 round per {m} epochs")
        return (f"rounds of ~{self.steps_per_round} local steps of {self.batch_size} rows, "
                f"{_count(self.rounds, 'round')} per epoch")

    def _size(self, steps_epoch: int, tau: int) -> None:
        """Rounds per epoch (or epochs per round) for ``tau`` local steps per round
        (:func:`~sparknet.cluster.planning.rounds.size_rounds`)."""
        tr = self.trainer
        sized = tr.local_steps in SIZED
        size = size_rounds(steps_epoch, tau, sized=sized, multi_epoch=tr.mode == "sync",
                           max_epochs_per_round=tr.max_epochs_per_round)
        self.rounds, self.epochs_per_round = size.rounds, size.epochs_per_round
        self.steps_per_round = size.steps_per_round

    def _run(self, data: ShardedData, task: Any, description: str,
             kind: str = "train") -> RoundResult:
        """One round: ``task`` over every shard of ``data``, summed by the server, within
        the fit's ``round_timeout`` (:mod:`sparknet.cluster.data_parallel.checkpoints`)."""
        state = self.state

        # built inside: a retry after a rebuild runs over the new anchor
        def action() -> RoundResult:
            if kind == "train":
                state.before_round(self)  # partition state after a resume or a rebuild
            self.engine.describe(description)
            return self.ps.gather(data.resident.mapPartitions(task))
        t0 = time.perf_counter()
        res = run_action(data.resident, action, state.timeout(kind, self._predicted(data, kind)))
        state.measured(kind, time.perf_counter() - t0)
        return res

    def _predicted(self, data: ShardedData, kind: str) -> float | None:
        """Seconds a job should take by the round cost model (``None`` before one exists)."""
        cost = self.cost
        if cost is None:
            return None
        if kind == "train":
            return cost.t_fixed + self.steps_per_round * cost.t_step
        steps = math.ceil(max(data.rows, default=0) / max(self.batch_size, 1))
        return cost.t_fixed + steps * cost.t_step

    # -- calibration ------------------------------------------------------
    def _estimate(self, steps: int = 3, budget: float = 0.25) -> RoundCostModel:
        """A first cost model without a probe job, to size the first epoch's rounds (the
        later ones are sized from the rounds measured, see :meth:`resize`): the compute of
        one local step timed here on the driver (a copy of the network, random rows of
        the fit's batch size, one BLAS thread per task as on the executors; ``steps``
        timed steps after an untimed one, fewer past ``budget`` seconds), and Spark's
        fixed cost taken from the shard job just run (its scheduling and results; at
        least :data:`MIN_FIXED_S`, which stands alone after the application's first shard
        job, see :data:`_ESTIMATED_APPS`) plus the parameters out and back at
        :data:`FIXED_S_PER_MIB`."""
        from sparknet import optim as optim_mod
        from sparknet.threads import blas_threads

        model, spec, b = self.model, self.spec, self.batch_size
        copy = model.clone()
        opt = optim_mod.from_config(*spec.optimizer)
        rng = np.random.default_rng([spec.seed, 98])
        shape = (b,) + tuple(spec.input_shape)
        x = (np.zeros(shape, np.int64) if spec.int_input
             else rng.standard_normal(shape).astype(model.dtype))
        try:
            model.layers[0].check_input(x)
        except ValueError:  # values the first layer refuses (category ids): zeros are valid ids
            x = np.zeros_like(x)
        if spec.classification:
            from sparknet.cluster.data.fit_inputs import n_outputs
            out = tuple(model.output_shape or ())  # per-step labels of a sequence output: (b, T)
            y: np.ndarray = rng.integers(0, n_outputs(model), size=(b,) + out[:-1])
        else:
            y = rng.standard_normal((b,) + tuple(spec.y_shape)).astype(model.dtype)
        times: list[float] = []
        with blas_threads(max(int(self.engine.conf("spark.task.cpus", "1") or 1), 1)):
            for k in range(steps + 1):
                t0 = time.perf_counter()
                copy.loss_and_grad(x, y, model.loss)
                opt.step(copy.params, copy.grads)
                if k:
                    times.append(time.perf_counter() - t0)
                if time.perf_counter() - t0 > budget / (steps + 1):
                    break
        t_step = min(times) if times else time.perf_counter() - t0
        phases = self.train.phases
        mib = model.params.nbytes / 2 ** 20
        app = str(self.engine.app_id)
        shard_job = (phases.get("shard job: scheduling, results", 0.0) if app in _ESTIMATED_APPS
                     else 0.0)
        _ESTIMATED_APPS.add(app)
        t_fixed = max(shard_job, MIN_FIXED_S) + 2 * mib * FIXED_S_PER_MIB
        return RoundCostModel(t_fixed, max(t_step, 1e-6), int(model.params.nbytes))

    def _cost_key(self) -> tuple:
        """What a round's cost depends on: the shards, the network (not its weights or
        seed), the batch size, the sync flavour and the training mode."""
        cfg = {k: v for k, v in self.spec.config.items() if k not in ("seed", "name")}
        tr = self.trainer
        return (self.train.resident.key, repr(cfg), self.batch_size, tr.sync, tr.mode, tr.precision)

    def calibrate(self) -> None:
        """Size the rounds: ``sync="gradient"`` and a fixed ``local_steps`` need no
        measurement (the cost model then comes from the first epoch's rounds, see
        :meth:`resize`); ``local_steps="auto"`` sizes them once from the nominal machine's
        costs (:func:`~sparknet.cluster.planning.rounds.nominal_cost`: no clock, so the same
        in every process); ``"timed"`` sizes the first epoch from an estimate
        (:meth:`_estimate`, no job), unless the shards are reused and an earlier fit there
        measured the same rounds, and re-sizes from the rounds run."""
        tr = self.trainer
        n_max = max(self.train.rows)
        if tr.sync == "gradient":
            self.rounds = math.ceil(self.train.total / self.batch_size)
            self.steps_per_round = 1
            return
        steps_epoch = max(1, math.ceil(n_max / self.batch_size))
        if tr.local_steps == "auto":
            from sparknet.cluster.planning.probes import network_shape

            model = self.model
            flops = network_shape(model)[0]
            layers, nbytes = len(model.layers), int(model.params.nbytes)
            nominal = nominal_cost(flops, layers, nbytes, self.batch_size)
            self._size(steps_epoch, self._tau(nominal, steps_epoch, ROUND_SHARES[0][0])[0])
            return
        if tr.local_steps != "timed":
            self._size(steps_epoch, int(tr.local_steps))
            return
        cost = _MEASURED.get(self._cost_key()) if self.train.reused else None
        if cost is None:
            cost = self._estimate()
        self.cost = cost
        self._size(steps_epoch, self._tau(cost, steps_epoch, ROUND_SHARES[0][0])[0])
        if cost.overhead(self.steps_per_round) > tr.max_overhead:
            log.info("a round of %d epoch(s) holds only %d local steps per partition (%.0f ms); "
                     "Spark's fixed cost of %.0f ms per round stays above %.0f%% of a round "
                     "(max_epochs_per_round=%d)", self.epochs_per_round, self.steps_per_round,
                     1e3 * self.steps_per_round * cost.t_step, 1e3 * cost.t_fixed,
                     100 * tr.max_overhead, tr.max_epochs_per_round)

    def _tau(self, cost: RoundCostModel, steps_epoch: int, current: int) -> tuple[int, float]:
        """Local steps per round and the share of Spark's fixed cost allowed
        (:func:`~sparknet.cluster.planning.rounds.choose_tau` at the trainer's ``max_overhead``)."""
        return choose_tau(cost, steps_epoch, self.trainer.max_overhead, current)

    def resize(self, rl: RoundLog, span: int = 1) -> None:
        """Measure the cost model from the rounds just run, and re-size the next rounds
        from it (``sync="average"`` with ``local_steps="timed"``): the first epoch's
        estimate timed one step on the driver, a round times them all on the executors.
        Other fits keep their rounds (the measured model sets the rounds' timeouts)."""
        tr = self.trainer
        if rl.rounds == 0 or rl.wall <= 0:
            return
        steps_epoch = max(1, math.ceil(max(self.train.rows) / self.batch_size))
        # local steps of one measured round (one global step for sync="gradient")
        steps = 1 if tr.sync == "gradient" else math.ceil(steps_epoch / self.rounds) * span
        # the fixed costs of the fit's last rounds (measured_cost takes their median)
        # (a resumed epoch whose rounds all ran before the checkpoint has only their sums)
        seen = self.fixed_seen + (rl.fixed or [max(rl.wall - rl.compute, 0.0) / rl.rounds])
        self.fixed_seen = seen[-FIXED_WINDOW:]
        if rl.compute <= 0:  # no local step's time to size by
            return
        first = self.cost is None
        cost = self.cost = measured_cost(self.fixed_seen, rl.compute, rl.rounds * steps,
                                         int(self.model.params.nbytes))
        _MEASURED[self._cost_key()] = cost
        while len(_MEASURED) > 32:
            del _MEASURED[next(iter(_MEASURED))]
        if tr.sync == "gradient":
            if first and cost.overhead(1) > tr.max_overhead:
                log.warning("sync='gradient': each round is one global step of %d rows (%.1f ms "
                            "of compute) against %.0f ms of Spark's fixed cost (measured share "
                            "%.0f%%); a larger batch_size or sync='average' amortises it",
                            self.batch_size,
                            1e3 * cost.t_step, 1e3 * cost.t_fixed, 100 * cost.overhead(1))
            return
        if tr.local_steps != "timed":
            return
        before = RoundSize(self.rounds, self.epochs_per_round, self.steps_per_round)
        size = resize_rounds(cost, steps_epoch, before, tr.max_overhead,
                             multi_epoch=tr.mode == "sync",
                             max_epochs_per_round=tr.max_epochs_per_round)
        self.rounds, self.epochs_per_round = size.rounds, size.epochs_per_round
        self.steps_per_round = size.steps_per_round
        if (self.rounds, self.epochs_per_round) != (before.rounds, before.epochs_per_round):
            log.info("measured round: %.0f ms fixed, %.2f ms per local step: %s from now on",
                     1e3 * cost.t_fixed, 1e3 * cost.t_step, self.describe_round())

    # -- rounds -----------------------------------------------------------
    def sync_epoch(self, epoch: int, bar: Any, span: int = 1, start: int = 0,
                   rl: RoundLog | None = None, t_epoch: float | None = None) -> RoundLog:
        """The rounds of epoch ``epoch`` (or one round of the ``span`` epochs from it), from
        round ``start`` on (a resumed epoch, ``rl`` holding its rounds so far; ``t_epoch``:
        when the epoch started by ``time.perf_counter``)."""
        rl = rl if rl is not None else RoundLog()
        t_epoch = time.perf_counter() if t_epoch is None else t_epoch
        E, R = self.epochs, (1 if span > 1 else self.rounds)
        which = f"epoch {epoch + 1}/{E}" if span == 1 else f"epochs {epoch + 1}-{epoch + span}/{E}"
        if start:
            bar.update(start)
        for r in range(start, R):
            t0 = time.perf_counter()
            collect = self.state.collects_after(r, R, epoch + span)
            local = self._round_lr(epoch, r, R)
            task = make_task(self.spec, self.ps.broadcast(), self.trainer.sync, epoch=epoch, rnd=r,
                             rounds=R, span=span, collect_state=collect, **local)
            res = self._run(self.train, task, f"sparknet {which} round {r + 1}/{R}")
            self._apply(res, epoch=epoch + 1, round=r + 1)
            self._record_lrs(epoch, r, R, span)
            # the partitions' state for the checkpoint after the round
            self.state.stash = res.states if collect else None
            wall, compute = time.perf_counter() - t0, max(res.times) if res.times else 0.0
            rl.wall += wall
            rl.compute += compute
            rl.fixed.append(max(wall - compute, 0.0))
            rl.rounds += 1
            rl.stats = rl.stats + res.stats
            bar.update(1)
            bar.set_postfix(self._running(rl.stats), refresh=False)
            step = self.state.round_end(self, epoch, r, R, rl, time.perf_counter() - t_epoch)
            # the callbacks after the round's checkpoint, when one was due
            run = stat_totals(rl.stats)
            logs = {"epoch": float(epoch), "rounds": float(R),
                    "loss": run["loss_sum"] / max(run["weight_sum"], 1e-12),
                    "rounds_done": float(self.state.rounds_done)}
            if step is not None:
                logs["checkpoint"] = float(step)
            self.callbacks.on_round_end(r, logs)
        return rl

    def _round_lr(self, epoch: int, r: int, R: int) -> dict[str, Any]:
        """The learning rate of round ``r``: set on the driver's optimizer for its one step
        (``sync="gradient"``, from the per-step schedule), or what the tasks carry for their
        local steps (the driver optimizer's rate and the schedule)."""
        opt = self.trainer.optimizer
        if self.trainer.sync == "gradient":
            if self.schedule is not None:
                opt.lr = self.schedule.lr(epoch, r, R)
            return {}
        return {"lr": float(opt.lr), "schedule": self.schedule}

    def _record_lrs(self, epoch: int, r: int, R: int, span: int) -> None:
        """Record the per-step rates the round just applied (the same rule as the tasks')."""
        if self.schedule is None:
            return
        if self.trainer.sync == "gradient":
            self.callbacks.record_steps((self.trainer.optimizer.lr,))
            return
        for p, n in enumerate(self.train.rows):
            if n > 0:
                lrs = chunk_lrs(self.schedule, n, self.batch_size, epoch, r, R, span)
                self.callbacks.record_steps(lrs, partition=p)

    def epoch_lr(self, epoch: int) -> float:
        """The rate of epoch ``epoch``'s first step (``lr`` in the history)."""
        if self.schedule is not None:
            return self.schedule.lr(epoch, 0, self.schedule.steps_per_epoch)
        return float(self.trainer.optimizer.lr)

    def _apply(self, res: RoundResult, **where: Any) -> None:
        """The round's sum into the parameters: one optimizer step on the mean gradient
        (``sync="gradient"``), or the row-weighted mean delta (``sync="average"``), added
        as it is or through the trainer's outer optimizer
        (:mod:`sparknet.cluster.data_parallel.outer_optimizer`);
        the layers' state becomes the partitions' row-weighted mean
        (:mod:`sparknet.cluster.data_parallel.layer_state`).
        A non-finite result, or parameters made non-finite by the step, raise
        :class:`~sparknet.errors.TrainingDiverged` with the parameters as before the
        round (``where``: the epoch and round, 1-based, for its message)."""
        model = self.model
        gradient = self.trainer.sync == "gradient"
        lr = self.trainer.optimizer.lr
        guards.check_result(res, "gradient" if gradient else "delta", lr=lr, **where)
        if res.vec is None:
            return
        before = np.array(model.params, copy=True)
        self._step(res)
        guards.check_params(model.params, before, lr=lr, **where)
        layer_state.take(model, res)  # the partitions' running statistics, row-weighted

    def _step(self, res: RoundResult) -> None:
        """Apply a checked round result (see :meth:`_apply`)."""
        model = self.model
        assert res.vec is not None
        if self.trainer.sync == "gradient":
            w = res.stat("weight_sum")
            grad = res.vec / model.dtype.type(w) if w > 0 else res.vec * 0
            self.trainer.optimizer.step(model.params, np.ascontiguousarray(grad, dtype=model.dtype))
            return
        rows = res.stat("samples")
        if rows <= 0:
            return
        delta = (res.vec / model.dtype.type(rows)).astype(model.dtype, copy=False)
        outer = self.trainer.outer
        if outer is None:
            model.params += delta
        else:
            outer.step(model.params, np.ascontiguousarray(delta),
                       partitions=sum(1 for n in self.train.rows if n > 0))

    def _running(self, stats: np.ndarray) -> dict[str, str]:
        """The progress bar's running loss (and accuracy) over the epoch(s) so far."""
        run = stat_totals(stats)
        w = max(run["weight_sum"], 1e-12)
        post = {"loss": f"{run['loss_sum'] / w:.4f}"}
        if self.spec.classification:
            post["acc"] = f"{run['correct'] / w:.4f}"
        return post

    def evaluate(self, data: ShardedData, description: str) -> dict[str, float]:
        """``val_loss`` (and ``val_accuracy``) of the current parameters on ``data``, within
        the fit's ``round_timeout``."""
        res = self._run(data, make_task(self.spec, self.ps.broadcast(), TaskKind.EVAL), description,
                        kind="eval")
        return eval_logs(self.spec, res)


def eval_logs(spec: FitSpec, res: RoundResult) -> dict[str, float]:
    """``val_loss`` (and ``val_accuracy``) from an evaluation job's sums."""
    w = max(res.stat("weight_sum"), 1e-12)
    out = {"val_loss": res.stat("loss_sum") / w}
    if spec.classification:
        out["val_accuracy"] = res.stat("correct") / w
    return out


def evaluate_once(spec: FitSpec, ps: ParameterServer, data: ShardedData,
                  description: str) -> dict[str, float]:
    """``val_loss`` (and ``val_accuracy``) of the server's parameters on ``data`` outside a
    fit (:meth:`DataParallelTrainer.evaluate
    <sparknet.cluster.data_parallel.trainer.DataParallelTrainer.evaluate>`): one job, no
    timeout."""
    task = make_task(spec, ps.broadcast(), TaskKind.EVAL)

    def action() -> RoundResult:  # built inside: a retry after a rebuild runs over the new anchor
        ps.engine.describe(description)
        return ps.gather(data.resident.mapPartitions(task))
    return eval_logs(spec, run_action(data.resident, action, None))
