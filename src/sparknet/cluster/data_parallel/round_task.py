"""Executor side of data-parallel training: what one partition does in one round.

The driver (:mod:`sparknet.cluster.data_parallel.trainer`,
:mod:`sparknet.cluster.data_parallel.async_mode`) builds a :class:`RoundTask` per round with
:func:`make_task` and runs it over the resident training shards
(:meth:`sparknet.cluster.resident.driver.Resident.mapPartitions`).
A task has one :class:`TaskKind`:

* ``GRADIENT`` -- the gradient of the loss *sum* over this partition's chunk of the
  round's global minibatch (``sync="gradient"``);
* ``AVERAGE`` -- local optimizer steps over this partition's chunk (or whole epochs)
  with the partition's resident optimizer state, returning the row-weighted delta
  (``sync="average"`` and ``mode="async"``);
* ``EVAL`` -- loss and accuracy over the whole shard, no gradient.

Every kind returns one :class:`~sparknet.cluster.data_parallel.parameter_server.RoundResult`.
The minibatch schedule (:func:`round_rows`) is documented in
:mod:`sparknet.cluster.data_parallel.trainer`.

A training task of a fit with ``precision="bf16"`` runs its steps inside
:func:`sparknet.precision.autocast` (the layers' products in bfloat16, everything else float32),
or in float32 where its executor has no bfloat16 kernel, saying so in its result
(``fallback``; the driver warns once).  Evaluation runs in float32.  With ``wire="bf16"`` an
``AVERAGE`` task sends its delta as bfloat16 (:mod:`sparknet.cluster.data_parallel.wire`).

:func:`set_task_wrapper` is the one hook that changes what a driver ships: for
fault-injection in tests and benchmarks (:func:`sparknet.cluster.testing.inject_faults`).
"""
from __future__ import annotations

import enum
import math
import threading
import time
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Callable

import numpy as np

from sparknet import losses as losses_mod
from sparknet import optim as optim_mod
from sparknet import precision as precision_mod
from sparknet import threads
from sparknet.cluster.data_parallel import guards, layer_state, wire
from sparknet.cluster.data_parallel.parameter_server import STATS, RoundResult
from sparknet.cluster.engine import layer_classes
from sparknet.model import Sequential
from sparknet.optim import Optimizer
from sparknet.schedules import ScheduledLR

if TYPE_CHECKING:
    from sparknet.cluster.engine.base import Shipped
    from sparknet.cluster.resident.driver import Shard

#: Rows per minibatch of an evaluation task (memory only: the sums do not depend on it).
EVAL_BATCH = 1024
#: Names of a fit's optimizer state next to a shard start with this and the fit's key.
STATE_PREFIX = "fitstate-"


class TaskKind(enum.Enum):
    """What a round's task computes on its partition."""

    GRADIENT = "gradient"
    AVERAGE = "average"
    EVAL = "eval"

    @property
    def trains(self) -> bool:
        """Whether the task is a training round (the kinds faults are injected into)."""
        return self in (TaskKind.GRADIENT, TaskKind.AVERAGE)


@dataclass
class FitSpec:
    """What every task of a fit needs (small; travels with each task)."""

    key: str
    config: dict
    loss: str
    optimizer: tuple[str, dict]
    batch_size: int
    seed: int
    input_shape: tuple[int, ...]
    classification: bool
    int_input: bool
    y_shape: tuple[int, ...] = ()
    precision: str = "fp32"
    wire: str = "fp32"
    #: the user's own layer classes the network uses, pickled
    #: (:mod:`~sparknet.cluster.engine.layer_classes`)
    layer_classes: bytes = b""


#: fit key -> the worker's copy of the model (rebuilt from its config once per fit).
_MODELS: dict[str, Sequential] = {}


def worker_model(spec: FitSpec) -> Sequential:
    """This Python worker's model for the fit ``spec.key`` (built on first use)."""
    model = _MODELS.get(spec.key)
    if model is None:
        _MODELS.clear()  # one fit at a time per worker: free the previous fit's model
        layer_classes.register(spec.layer_classes)
        model = Sequential.from_config(spec.config)
        if not model.built:
            model.build(spec.input_shape)
        _MODELS[spec.key] = model
    return model


def chunk_bounds(n: int, rnd: int, rounds: int) -> tuple[int, int]:
    """``[start, stop)`` of chunk ``rnd`` when a pass over ``n`` rows is cut into ``rounds``
    consecutive chunks (their lengths differ by at most one row): the one rule by which the
    synchronous and the asynchronous rounds split a partition's epoch."""
    return n * rnd // rounds, n * (rnd + 1) // rounds


def round_rows(n: int, seed: int, epoch: int, index: int, rnd: int, rounds: int) -> np.ndarray:
    """Rows of chunk ``rnd`` of ``rounds`` of partition ``index``'s permutation in ``epoch``."""
    perm = np.random.default_rng([seed, epoch, index]).permutation(n)
    start, stop = chunk_bounds(n, rnd, rounds)
    return perm[start:stop]


def chunk_steps(n: int, rnd: int, rounds: int, batch_size: int) -> tuple[int, int]:
    """``(steps before chunk rnd, steps of the whole pass)``: the local steps of ``batch_size``
    rows that a partition of ``n`` rows runs over the chunks of one pass (each chunk in
    whole minibatches, the last one short)."""
    per = [math.ceil((stop - start) / batch_size)
           for start, stop in (chunk_bounds(n, r, rounds) for r in range(rounds))]
    return sum(per[:rnd]), sum(per)


def chunk_lrs(schedule: ScheduledLR, n: int, batch_size: int, epoch: int, rnd: int, rounds: int,
              span: int = 1) -> list[float]:
    """The learning rates of the local steps of one ``AVERAGE`` task (chunk ``rnd`` of
    ``rounds`` of pass ``epoch``, or ``span`` whole passes), in order: step ``j`` of the
    ``T`` steps of a pass gets ``schedule.lr(pass, j, T)`` (see :mod:`sparknet.schedules`).
    The tasks apply these; the driver records them from the same call."""
    if span > 1:
        total = math.ceil(n / batch_size)
        return [schedule.lr(epoch + i, j, total) for i in range(span) for j in range(total)]
    first, total = chunk_steps(n, rnd, rounds, batch_size)
    start, stop = chunk_bounds(n, rnd, rounds)
    mine = math.ceil((stop - start) / batch_size)
    return [schedule.lr(epoch, first + j, total) for j in range(mine)]


def _stat_row(s: float, w: float, c: float, rows: int, steps: int) -> tuple[float, ...]:
    """One :data:`~sparknet.cluster.data_parallel.parameter_server.STATS` row (an undefined
    accuracy counts 0)."""
    return (s, w, 0.0 if math.isnan(c) else c, float(rows), float(steps))


class RoundTask:
    """One partition's part of a round (a ``Resident.mapPartitions`` function).

    Args:
        spec: the fit's :class:`FitSpec`.
        bc: ``Broadcast`` of the flat parameter vector the round starts from, followed by
            the layers' state if any (:mod:`sparknet.cluster.data_parallel.layer_state`; under Spark
            Connect, the vector the query carries; :mod:`sparknet.cluster.engine.base`).
        kind: what the task computes (:class:`TaskKind`, or its value).
        epoch: the (first) epoch of the round.
        rnd: the round's index in its epoch.
        rounds: rounds per epoch (chunks of each partition's permutation).
        span: whole epochs in one ``AVERAGE`` round (then ``rounds == 1``).
        collect_state: an ``AVERAGE`` task also returns the partition's optimizer state
            after its steps (:attr:`RoundResult.states`: a checkpoint follows the round).
        lr: the learning rate of an ``AVERAGE`` task's local steps (the driver
            optimizer's at the round's launch; ``None``: the fit's optimizer config's).
        schedule: a per-step schedule that sets each local step's rate instead
            (:func:`chunk_lrs`).
    """

    def __init__(self, spec: FitSpec, bc: "Shipped", kind: "TaskKind | str", epoch: int = 0,
                 rnd: int = 0, rounds: int = 1, span: int = 1, collect_state: bool = False,
                 lr: float | None = None, schedule: ScheduledLR | None = None) -> None:
        self.spec, self.bc, self.kind = spec, bc, TaskKind(kind)
        self.epoch, self.rnd, self.rounds = epoch, rnd, rounds
        self.span = max(1, int(span))
        self.collect_state = bool(collect_state)
        self.lr, self.schedule = lr, schedule

    def __call__(self, index: int, shard: "Shard") -> list[RoundResult]:
        from pyspark import TaskContext

        tc = TaskContext.get()
        threads.set_worker_threads(tc.cpus() if tc is not None else 1)
        if int(shard["y"].shape[0]) == 0:
            return [RoundResult(None, np.zeros(len(STATS)), [0.0])]
        t0 = time.perf_counter()
        model = worker_model(self.spec)
        layer_state.load(model, self.bc.value)  # the parameters, and the layers' state if any
        for i, layer in enumerate(model.layers):  # dropout & co: seeded per task
            layer.rng = np.random.default_rng([self.spec.seed, self.epoch, self.rnd, index, i, 7])
        run = _RUNNERS[self.kind]
        if not self.kind.trains:
            res = run(self, index, shard, model)
            res.times = [time.perf_counter() - t0]
            return [res]
        use, fallback = precision_mod.task_precision(self.spec.precision)
        with precision_mod.autocast(use):
            res = run(self, index, shard, model)
        # the driver must not apply a non-finite result (guards)
        layer_state.attach(res, model)
        what = "gradient" if self.kind is TaskKind.GRADIENT else "delta"
        res.nonfinite = guards.scan(index, res, what)
        if res.vec is not None and self.kind is TaskKind.AVERAGE and self.spec.wire == "bf16":
            residual = shard.ensure(f"{STATE_PREFIX}{self.spec.key}-{wire.RESIDUAL}",
                                    (res.vec.size,))
            res.vec = wire.encode(res.vec, residual)
        res.wire_bytes = 0 if res.vec is None else int(res.vec.nbytes)
        res.fallback = fallback
        res.times = [time.perf_counter() - t0]
        return [res]

    # -- one method per kind ------------------------------------------------
    def _evaluate(self, index: int, shard: "Shard", model: Sequential) -> RoundResult:
        x, y = shard["x"], shard["y"]
        n = int(y.shape[0])
        loss = losses_mod.get(self.spec.loss)
        stats = np.zeros(len(STATS))
        for lo in range(0, n, EVAL_BATCH):
            rows = np.arange(lo, min(n, lo + EVAL_BATCH))
            xb, yb = self._batch(x, y, rows)
            s, w, c = model.loss_and_grad(xb, yb, loss, need_grad=False, training=False)
            stats += _stat_row(s, w, c, len(rows), 0)
        return RoundResult(None, stats)

    def _gradient_round(self, index: int, shard: "Shard", model: Sequential) -> RoundResult:
        x, y = shard["x"], shard["y"]
        spec = self.spec
        rows = round_rows(int(y.shape[0]), spec.seed, self.epoch, index, self.rnd, self.rounds)
        if len(rows) == 0:
            return RoundResult(None, np.zeros(len(STATS)))
        xb, yb = self._batch(x, y, rows)
        s, w, c = model.loss_and_grad(xb, yb, losses_mod.get(spec.loss), scale=1.0)
        return RoundResult(np.array(model.grads, copy=True),
                           np.array(_stat_row(s, w, c, len(rows), 1)))

    def _average_round(self, index: int, shard: "Shard", model: Sequential) -> RoundResult:
        spec, n = self.spec, int(shard["y"].shape[0])
        if self.span > 1:  # whole epochs, one after the other
            segments = [round_rows(n, spec.seed, self.epoch + i, index, 0, 1)
                        for i in range(self.span)]
        else:
            segments = [round_rows(n, spec.seed, self.epoch, index, self.rnd, self.rounds)]
        if sum(len(r) for r in segments) == 0:
            return RoundResult(None, np.zeros(len(STATS)))
        opt = optim_mod.from_config(*spec.optimizer)
        if self.lr is not None:
            opt.lr = float(self.lr)
        # this partition's optimizer state, resident next to its shard across the rounds
        # of this fit (the shard may outlive the fit: a later fit starts afresh)
        prefix = f"{STATE_PREFIX}{spec.key}-"
        for stale in [n for n in shard.names()
                      if n.startswith(STATE_PREFIX) and not n.startswith(prefix)]:
            shard.discard(stale)
        layout = opt.state_layout(model.n_params, model.dtype, prefix)
        resident = {name: shard.ensure(name, shape, dt) for name, (shape, dt) in layout.items()}
        opt.load_state_arrays(resident, prefix, copy=False)
        lrs = None if self.schedule is None else chunk_lrs(self.schedule, n, spec.batch_size,
                                                            self.epoch, self.rnd, self.rounds,
                                                            self.span)
        res = self._local_steps(shard, model, opt, segments, lrs)
        opt.write_step(resident, prefix)
        if self.collect_state:  # for the checkpoint after this round: no job of its own
            res.states = {index: {name[len(prefix):]: np.array(arr, copy=True)
                                  for name, arr in resident.items()}}
        return res

    # -- shared steps ---------------------------------------------------------
    def _local_steps(self, shard: "Shard", model: Sequential, opt: Optimizer,
                     segments: list[np.ndarray], lrs: list[float] | None = None) -> RoundResult:
        """Optimizer steps of ``batch_size`` rows over each segment in turn (step ``i`` at
        rate ``lrs[i]`` when given; :func:`~sparknet.cluster.data_parallel.layer_state.minibatch`);
        the result holds the row-weighted delta (the driver divides the sum by all
        partitions' rows), one stats row per segment (epoch) and the seconds of one step."""
        n_rows = sum(len(r) for r in segments)
        if n_rows == 0:
            return RoundResult(None, np.zeros(len(STATS)))
        x, y = shard["x"], shard["y"]
        loss = losses_mod.get(self.spec.loss)
        b = self.spec.batch_size
        start = np.array(model.params, copy=True)
        per_epoch = np.zeros((len(segments), len(STATS)))
        n_steps = 0
        pairs = model.n_state > 0  # layers with batch statistics: no minibatch of one row
        for e, rows in enumerate(segments):
            for lo in range(0, len(rows), b):
                xb, yb = self._batch(x, y, layer_state.minibatch(rows, lo, b, pairs))
                s, w, c = model.loss_and_grad(xb, yb, loss)
                if lrs is not None:
                    opt.lr = lrs[n_steps]
                opt.step(model.params, model.grads)
                precision_mod.next_step()  # bf16 copies of the weights are stale
                per_epoch[e] += _stat_row(s, w, c, xb.shape[0], 1)
                n_steps += 1
        vec = (model.params - start) * model.dtype.type(n_rows)
        stats = per_epoch if self.span > 1 else per_epoch[0]
        return RoundResult(vec, stats)

    def _batch(self, x: np.ndarray, y: np.ndarray,
               rows: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        spec = self.spec
        xb = x[rows].reshape((len(rows),) + spec.input_shape)
        if spec.int_input:
            xb = xb.astype(np.int64)
        yb = y[rows]
        if spec.y_shape:
            yb = yb.reshape((len(rows),) + spec.y_shape)
        return xb, yb


_RUNNERS: dict[TaskKind, Callable[[RoundTask, int, "Shard", Sequential], RoundResult]] = {
    TaskKind.GRADIENT: RoundTask._gradient_round,
    TaskKind.AVERAGE: RoundTask._average_round,
    TaskKind.EVAL: RoundTask._evaluate,
}

# ------------------------------------------------------------------- the task hook
#: Signature of a task wrapper: the task in, a picklable ``(index, shard)`` callable out.
TaskWrapper = Callable[[RoundTask], Callable[[int, "Shard"], list[RoundResult]]]

_WRAPPER: TaskWrapper | None = None
_WRAPPER_LOCK = threading.Lock()


def set_task_wrapper(wrapper: TaskWrapper | None) -> TaskWrapper | None:
    """Install ``wrapper`` around every round task this driver builds from now on, or
    remove it (``None``); returns the wrapper it replaces.

    For fault-injection in tests and benchmarks
    (:func:`sparknet.cluster.testing.inject_faults` is the one user): ``wrapper(task)``
    returns a picklable callable with the task's ``(index, shard)`` signature, run on
    the executors in the task's place.  It is process-wide, so it applies to every fit
    this driver runs while it is installed.
    """
    global _WRAPPER
    with _WRAPPER_LOCK:
        previous, _WRAPPER = _WRAPPER, wrapper
    return previous


def make_task(spec: FitSpec, bc: "Shipped", kind: "TaskKind | str",
              **where: Any) -> Callable[[int, "Shard"], list[RoundResult]]:
    """A :class:`RoundTask` (``where``: its ``epoch``, ``rnd``, ``rounds``,
    ``span``, ``collect_state``, ``lr``, ``schedule``), passed through the
    installed task wrapper, if any."""
    task = RoundTask(spec, bc, kind, **where)
    wrapper = _WRAPPER
    return task if wrapper is None else wrapper(task)
