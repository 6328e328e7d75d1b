"""Checkpoints of a data-parallel fit: what they hold, when they are written, how a fit
resumes from one.

:class:`~sparknet.cluster.data_parallel.trainer.DataParallelTrainer` gives every fit one
:class:`FitState` (``ctx.state``).  With ``checkpoint_dir`` set it writes checkpoints
through :class:`sparknet.checkpoint.CheckpointStore` (atomic folders, a manifest with a
SHA-256 per file written last, the newest ``checkpoint_keep`` kept).

What a checkpoint holds
-----------------------
A checkpoint is composed from the state of the fit's parts (:meth:`FitState.parts`,
:mod:`sparknet.stateful`): each gives its ``state_dict()`` and takes it back with
``load_state_dict``; its arrays go to the array file under the part's prefix, the rest to
the metadata under the part's name:

* ``model`` (no prefix) -- ``params``, the flat parameter vector; ``state``, the layers'
  running statistics when they keep any (:mod:`sparknet.cluster.data_parallel.layer_state`);
  the state of the generator one-process ``fit`` shuffles with;
* ``optimizer`` (``opt_``) -- the driver's optimizer state (``sync="gradient"``);
* ``outer`` (``outer_``) -- the outer optimizer's sizing and state (``sync="average"``
  with ``outer``);
* ``partitions`` (``part``) -- partition ``p``'s resident optimizer state as
  ``part<p>_<name>`` (``sync="average"`` and ``mode="async"``: RMSprop's running averages,
  momentum buffers, its step count).  In synchronous rounds it comes back with the
  results of the round a checkpoint follows (the driver knows in advance which round that
  is), so a checkpoint costs no Spark job; ``mode="async"`` collects it with one small job
  at the epoch's end;
* ``position`` (``partial_``) -- the epoch and round the fit goes on with, rounds done,
  and for a checkpoint taken between two rounds of an epoch the epoch so far
  (``partial_stats``: its loss/accuracy sums);
* ``sizing`` -- rounds per epoch, local steps, epochs per round, the measured cost model;
* ``async`` -- the async server's counters (updates applied, rows dispatched, each
  partition's pass and chunk);
* ``history`` -- the history so far.

Beside the parts, the metadata names the fit (``kind``, ``run``), its architecture
(``model.get_config()``) and the trainer's settings (mode, sync, optimizer and its
configuration, loss, seed, batch size, partitions and their rows, async options) that a
resume compares.  Every random draw of a data-parallel fit -- the data split, each epoch's
permutations, dropout in each task -- is a pure function of the seed and these counters
(``default_rng([seed, epoch, partition])``, see
:mod:`sparknet.cluster.data_parallel.trainer`),
so the seed plus the position *is* the random state; the model's own generator (used by
one-process ``fit``) is stored with the model's part.

Resuming
--------
``fit(..., resume=True)`` loads the newest complete checkpoint (a partial or damaged one
is skipped with a warning by the store), checks that it belongs to the same network and
the same schedule (mode, sync, batch size, seed, partitions and their rows: otherwise a
``ValueError`` saying which differs), gives every part its state back (a part that
refuses it: a ``CheckpointError`` naming the checkpoint and the part), and goes on
from the stored position: ``epochs`` is the total the fit should reach, as Keras's
``initial_epoch``.  The partitions' optimizer state is put back
under the new fit's key (each fit has its own) before the first round.  With
``sync="gradient"`` (and with a fixed ``local_steps`` and plain averaging) the resumed
fit computes exactly what the uninterrupted one would have, bit for bit.

When the training shards are rebuilt after an executor loss, every partition's
optimizer state is gone with them: it is restored from the newest checkpoint before the
next round when there is one; otherwise a warning says that it restarts from zero.
"""
from __future__ import annotations

import logging
import re
import time
import uuid
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Callable, Mapping

import numpy as np

from sparknet.checkpoint import Checkpoint, CheckpointStore
from sparknet.cluster.data_parallel.parameter_server import STATS
from sparknet.cluster.data_parallel.partition_state import (
    ARRAY_PREFIX,
    CollectState,
    PartitionStates,
    PushState,
    array_names,
    state_prefix,
)
from sparknet.cluster.data_parallel.timeouts import check_round_timeout, job_timeout
from sparknet.errors import CheckpointError, CheckpointMismatch
from sparknet.stateful import Part, compose, state_of

if TYPE_CHECKING:
    from sparknet.cluster.data_parallel.fit_context import FitContext, RoundLog
    from sparknet.cluster.data_parallel.trainer import DataParallelTrainer

log = logging.getLogger(__name__)

#: Kind of the checkpoints a data-parallel fit writes (their ``meta["kind"]``).
KIND = "sparknet-data-parallel"
# ------------------------------------------------------------------ arguments
def configure(trainer: DataParallelTrainer, checkpoint_dir: Any, checkpoint_every: Any,
              checkpoint_keep: Any, round_timeout: Any) -> None:
    """Validate the trainer's checkpoint and timeout arguments and set them on it."""
    from sparknet._validation import positive_int

    if checkpoint_dir is not None and not (isinstance(checkpoint_dir, str) and checkpoint_dir):
        raise ValueError(f"checkpoint_dir must be a folder path or URI (str) or None, "
                         f"got checkpoint_dir={checkpoint_dir!r}")
    trainer.checkpoint_dir = checkpoint_dir
    trainer.checkpoint_every = CheckpointEvery.parse(checkpoint_every)
    trainer.checkpoint_keep = positive_int(checkpoint_keep, "checkpoint_keep")
    trainer.round_timeout = check_round_timeout(round_timeout)


def open_store(trainer: DataParallelTrainer, resume: bool) -> CheckpointStore | None:
    """The checkpoint store of a fit (``None`` without ``checkpoint_dir``)."""
    if resume and trainer.checkpoint_dir is None:
        raise ValueError("fit(resume=True) needs the trainer's checkpoint_dir: the folder to "
                         "resume from")
    if trainer.checkpoint_dir is None:
        return None
    return CheckpointStore(trainer.checkpoint_dir, keep=trainer.checkpoint_keep,
                           spark=trainer.spark)


@dataclass(frozen=True)
class CheckpointEvery:
    """When a fit writes a checkpoint: after every ``n`` epochs, ``n`` rounds, or at the
    first round end ``n`` seconds after the last checkpoint (``unit``)."""

    unit: str
    n: float

    @classmethod
    def parse(cls, value: Any) -> CheckpointEvery:
        """``"epoch"``, an int N (rounds), ``"N epochs"`` or ``"Ns"`` (seconds)."""
        if isinstance(value, CheckpointEvery):
            return value
        if isinstance(value, (int, np.integer)) and not isinstance(value, bool) and value > 0:
            return cls("rounds", int(value))
        if isinstance(value, str):
            s = value.strip().lower()
            if s == "epoch":
                return cls("epochs", 1)
            m = re.fullmatch(r"(\d+)\s*epochs?", s)
            if m and int(m.group(1)) > 0:
                return cls("epochs", int(m.group(1)))
            m = re.fullmatch(r"(\d+(?:\.\d*)?)\s*s", s)
            if m and float(m.group(1)) > 0:
                return cls("seconds", float(m.group(1)))
        raise ValueError("checkpoint_every must be 'epoch', a positive int (rounds), 'N epochs' "
                         f"or 'Ns' (seconds), got checkpoint_every={value!r}")

    def due(self, epochs: int, rounds: int, seconds: float) -> bool:
        """Whether a checkpoint is due after ``epochs`` whole epochs, ``rounds`` rounds and
        ``seconds`` since the last one."""
        if self.unit == "epochs":
            return epochs >= self.n
        if self.unit == "rounds":
            return rounds >= self.n
        return seconds >= self.n


# ------------------------------------------------------------------ one fit
@dataclass
class Position:
    """Where a fit goes on: ``epoch`` (0-based) and its next ``round``, ``rounds_done``
    (rounds run by the fit and the fits it resumed), and the epoch so far (mid-epoch)."""

    epoch: int = 0
    round: int = 0
    rounds_done: int = 0
    partial: dict[str, float] = field(default_factory=dict)   # wall, compute, rounds, elapsed
    partial_stats: np.ndarray | None = None

    def state_dict(self) -> dict[str, Any]:
        """The position for a checkpoint (:mod:`sparknet.stateful`); ``stats``: the loss
        and accuracy sums of the epoch so far (mid-epoch)."""
        out: dict[str, Any] = {"epoch": self.epoch, "round": self.round,
                               "rounds_done": self.rounds_done, "partial": dict(self.partial)}
        if self.partial_stats is not None:
            out["stats"] = np.asarray(self.partial_stats)
        return out

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        self.epoch, self.round = int(state["epoch"]), int(state["round"])
        self.rounds_done = int(state["rounds_done"])
        self.partial = {k: float(v) for k, v in (state.get("partial") or {}).items()}
        stats = state.get("stats")
        self.partial_stats = None if stats is None else np.asarray(stats, dtype=np.float64)


class _Sizing:
    """The fit's round sizing as a part of its checkpoints: rounds per epoch, local steps,
    epochs per round and the cost model they came from (a resumed fit keeps them)."""

    def __init__(self, ctx: FitContext) -> None:
        self.ctx = ctx

    def state_dict(self) -> dict[str, Any]:
        ctx = self.ctx
        return {"rounds": ctx.rounds, "steps_per_round": ctx.steps_per_round,
                "epochs_per_round": ctx.epochs_per_round,
                "cost": None if ctx.cost is None else [ctx.cost.t_fixed, ctx.cost.t_step]}

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        ctx = self.ctx
        ctx.rounds = int(state.get("rounds", ctx.rounds))
        ctx.steps_per_round = int(state.get("steps_per_round", ctx.steps_per_round))
        ctx.epochs_per_round = int(state.get("epochs_per_round", ctx.epochs_per_round))
        if state.get("cost"):
            from sparknet.cluster.planning.cost import RoundCostModel
            t_fixed, t_step = state["cost"]
            ctx.cost = RoundCostModel(float(t_fixed), float(t_step), int(ctx.model.params.nbytes))


class _ModeState:
    """The mode's own counters (``mode="async"``: updates applied, rows dispatched, each
    partition's pass and chunk) as a part of the fit's checkpoints."""

    def __init__(self, ctx: FitContext) -> None:
        self.ctx = ctx

    def state_dict(self) -> dict[str, Any]:
        meta = getattr(self.ctx.mode_state, "checkpoint_meta", None)
        return meta() if callable(meta) else {}

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        self.ctx.mode_resume = dict(state) or None


@dataclass
class FitState:
    """What one data-parallel fit knows about its checkpoints, its partitions' resident
    optimizer state and the duration of its jobs (``ctx.state``).

    Attributes:
        store: the checkpoint store (``None``: no checkpoints).
        every: when to write one.
        start: where the fit starts (a resumed fit: the checkpoint's position).
        resumed_from: the checkpoint the fit resumed from, if any.
        pending: partition optimizer state to put next to the shards before the next round
            (after a resume or a rebuild).
        slowest: the slowest job measured so far, per kind (``"train"``, ``"eval"``, ...).
        stash: the partitions' optimizer state returned by the last round (when a
            checkpoint was due after it), or ``None``.
        run: the id of the run the fit belongs to (a resumed fit keeps its checkpoint's),
            so that a rebuild only restores state this run wrote.
        offset: checkpoint steps are ``offset + rounds_done``: a fresh fit in a folder
            holding an earlier run's checkpoints numbers its own after them (the newest
            stays the newest, and older ones are pruned as new ones come).
    """

    trainer: DataParallelTrainer
    store: CheckpointStore | None
    every: CheckpointEvery
    start: Position = field(default_factory=Position)
    resumed_from: Checkpoint | None = None
    pending: dict[int, dict[str, np.ndarray]] | None = None
    slowest: dict[str, float] = field(default_factory=dict)
    stash: dict[int, dict[str, np.ndarray]] | None = None
    rounds_done: int = 0
    run: str = field(default_factory=lambda: uuid.uuid4().hex[:12])
    offset: int = 0
    # epochs, rounds, perf_counter at the last checkpoint
    since: tuple[int, int, float] = (0, 0, 0.0)
    _built: float | None = None                       # the training shards' build stamp

    def __post_init__(self) -> None:
        self.since = (0, 0, time.perf_counter())  # "Ns" counts from the fit's start

    @property
    def keeps_partition_state(self) -> bool:
        """Whether the partitions hold optimizer state (average and async modes)."""
        return self.trainer.sync == "average"

    # -- timeouts --------------------------------------------------------
    def timeout(self, kind: str, predicted: float | None = None) -> float | None:
        """Seconds a job of ``kind`` may run (see :func:`job_timeout`)."""
        return job_timeout(self.trainer.round_timeout, self.slowest.get(kind), predicted)

    def measured(self, kind: str, seconds: float) -> None:
        self.slowest[kind] = max(self.slowest.get(kind, 0.0), float(seconds))

    # -- partition state -------------------------------------------------
    def before_round(self, ctx: FitContext, standalone: bool = False) -> None:
        """Before a training round (inside its Spark action): put pending partition state
        back, after a resume or after the shards were rebuilt (their state went with
        them: from the newest checkpoint, or a warning that it restarts)."""
        if not self.keeps_partition_state:
            return
        resident = ctx.train.resident
        if self._built is None:
            self._built = resident.build_started
        elif resident.build_started != self._built:  # rebuilt: re-attached shards kept their state
            self._built = resident.build_started
            fresh = [i.index for i in resident.infos if not getattr(i, "reattached", False)]
            self.pending = self._from_newest(ctx, fresh) if fresh else None
        if self.pending is None:
            return
        states, self.pending = self.pending, None
        bc = ctx.engine.ship(states)
        try:
            fn = PushState(state_prefix(ctx.spec.key), bc)
            if standalone:
                resident.map(fn, description="sparknet: restoring the partitions' optimizer state")
            else:  # inside the round's action: its job group, its retry
                resident.mapPartitions(fn).collect()
        finally:
            bc.destroy(blocking=False)

    def _from_newest(self, ctx: FitContext,
                     partitions: list[int]) -> dict[int, dict[str, np.ndarray]] | None:
        """The optimizer state of ``partitions`` (built anew) from this run's newest
        checkpoint, or ``None`` (logged) when there is none."""
        store = self.store
        ckpt = store.latest() if store is not None else None
        if ckpt is not None and ckpt.meta.get("run") != self.run:
            ckpt = None  # another run's: its optimizer state belongs to other parameters
        if store is None or ckpt is None:
            log.warning("sparknet: the optimizer state of rebuilt partition(s) %s restarts from "
                        "zero (no checkpoint of this fit to restore it from: set checkpoint_dir)",
                        partitions)
            return None
        want, part = array_names(partitions), PartitionStates()
        arrays = store.load(ckpt, [n for n in ckpt.arrays if n.startswith(want)])
        part.load_state_dict({n[len(ARRAY_PREFIX):]: a for n, a in arrays.items()})
        states = part.states
        log.warning("sparknet: the optimizer state of rebuilt partition(s) %s restored from "
                    "checkpoint %s",
                    sorted(states), ckpt.path)
        return states

    def collects_after(self, rnd: int, rounds: int, epochs_after: int) -> bool:
        """Whether round ``rnd`` of ``rounds`` should bring the partitions' optimizer state
        back: a checkpoint is due after it (``epochs_after``: whole epochs done when it is
        an epoch's last round; for ``"Ns"``, due by the slowest round so far)."""
        if self.store is None or not self.keeps_partition_state:
            return False
        e0, r0, t0 = self.since
        last = rnd + 1 >= rounds
        if self.every.unit == "epochs":
            return last and epochs_after - e0 >= self.every.n
        ahead = self.slowest.get("train", 0.0) if self.every.unit == "seconds" else 0.0
        return self.every.due(0, self.rounds_done + 1 - r0, time.perf_counter() - t0 + ahead)

    def collect(self, ctx: FitContext) -> dict[int, dict[str, np.ndarray]]:
        """Every partition's resident optimizer state: what the last round brought back,
        else one job (none without partition state)."""
        if not self.keeps_partition_state:
            return {}
        if self.stash is not None and len(self.stash) == sum(1 for n in ctx.train.rows if n > 0):
            stash, self.stash = self.stash, None
            return stash
        fn = CollectState(state_prefix(ctx.spec.key))
        resident = ctx.train.resident
        for _ in range(2):  # shards rebuilt by the collecting job: their state back, then again
            self.before_round(ctx, standalone=True)
            stamp = resident.build_started
            got = resident.map(fn, description="sparknet: collecting the partitions' optimizer "
                                               "state for a checkpoint")
            if resident.build_started == stamp:
                break
        return dict(enumerate(got))

    def parts(self, ctx: FitContext, pos: Position | None = None,
              partitions: PartitionStates | None = None) -> list[Part]:
        """The stateful parts of the fit's checkpoints, each with its metadata name and
        array prefix (:mod:`sparknet.stateful`)."""
        tr = self.trainer
        parts = [Part("model", "", ctx.model), Part("optimizer", "opt_", tr.optimizer),
                 Part("position", "partial_", pos if pos is not None else Position()),
                 Part("sizing", "sizing_", _Sizing(ctx)), Part("async", "async_", _ModeState(ctx))]
        if tr.outer is not None:
            parts.append(Part("outer", "outer_", tr.outer))
        parts.append(Part("history", "history_", ctx.history))
        if self.keeps_partition_state:
            parts.append(Part("partitions", ARRAY_PREFIX, partitions or PartitionStates()))
        return parts

    # -- writing ---------------------------------------------------------
    def round_end(self, ctx: FitContext, epoch: int, rnd: int, rounds: int, rl: RoundLog,
                  elapsed: float) -> int | None:
        """After round ``rnd`` of ``rounds`` of ``epoch`` (mid-epoch only: the epoch's end is
        :meth:`epochs_end`): write a checkpoint when one is due; returns its step."""
        self.rounds_done += 1
        if self.store is None or rnd + 1 >= rounds or self.every.unit == "epochs":
            return None
        e0, r0, t0 = self.since
        if not self.every.due(0, self.rounds_done - r0, time.perf_counter() - t0):
            return None
        pos = Position(epoch, rnd + 1, self.rounds_done,
                       {"wall": rl.wall, "compute": rl.compute, "rounds": rl.rounds,
                        "elapsed": elapsed},
                       np.atleast_2d(rl.stats).sum(axis=0))
        return self.write(ctx, pos)

    def epochs_end(self, ctx: FitContext, epochs_done: int, rounds: int = 0) -> int | None:
        """After whole epochs (``epochs_done`` in all; ``rounds`` more rounds run, the async
        epochs' count): write a checkpoint when one is due; returns its step."""
        self.rounds_done += rounds
        if self.store is None:
            return None
        e0, r0, t0 = self.since
        if not self.every.due(epochs_done - e0, self.rounds_done - r0, time.perf_counter() - t0):
            return None
        return self.write(ctx, Position(epochs_done, 0, self.rounds_done))

    def write(self, ctx: FitContext, pos: Position) -> int:
        """Write the checkpoint of the fit at ``pos`` (step: rounds done), composed from the
        state of its parts (:meth:`parts`); returns the step."""
        assert self.store is not None
        t0 = time.perf_counter()
        by_job = self.stash is None and self.keeps_partition_state
        partitions = PartitionStates(self.collect(ctx))
        t_collect = time.perf_counter() - t0
        arrays, meta = compose(self.parts(ctx, pos, partitions))
        meta = {"kind": KIND, "run": self.run, "architecture": ctx.model.get_config(),
                "settings": settings(self.trainer, ctx), **_jsonable(meta)}
        step = self.offset + pos.rounds_done
        self.store.save(step, arrays, meta)
        seconds = time.perf_counter() - t0
        ctx.history.checkpoints.append({"step": step, "seconds": seconds, "collect": t_collect,
                                        "job": by_job,
                                        "bytes": sum(a.nbytes for a in arrays.values())})
        self.since = (pos.epoch, pos.rounds_done, time.perf_counter())
        log.info("sparknet: checkpoint %d written in %.0f ms (goes on with epoch %d, round %d)",
                 step, 1e3 * seconds, pos.epoch + 1, pos.round + 1)
        return step


def settings(tr: DataParallelTrainer, ctx: FitContext) -> dict[str, Any]:
    """The trainer's settings that a checkpoint records (and a resume compares)."""
    opts = tr.mode_options
    return {"mode": tr.mode, "sync": tr.sync, "local_steps": tr.local_steps,
            "optimizer": [tr.optimizer.name, tr.optimizer.get_config()],
            "loss": ctx.model.loss.name, "seed": tr.seed, "batch_size": ctx.batch_size,
            "epochs": ctx.epochs, "reduce": tr.reduce,
            "max_overhead": tr.max_overhead, "max_epochs_per_round": tr.max_epochs_per_round,
            "rows": [int(n) for n in ctx.train.rows], "dtype": ctx.model.dtype.name,
            "async": None if opts is None else {k: getattr(opts, k) for k in
                                                 ("max_staleness", "stale", "delta_weight",
                                                  "coalesce")}}


def _jsonable(x: Any) -> Any:
    if isinstance(x, dict):
        return {str(k): _jsonable(v) for k, v in x.items()}
    if isinstance(x, (list, tuple)):
        return [_jsonable(v) for v in x]
    if isinstance(x, np.integer):
        return int(x)
    return x


# ------------------------------------------------------------------ resuming
#: Settings that must match for a resume to go on with the same schedule.
_MUST_MATCH = ("mode", "sync", "seed", "batch_size", "rows", "dtype", "loss")


def fresh(state: FitState) -> None:
    """A fit that does not resume: when its folder holds checkpoints already, number its
    own after the newest (logged), so that they are the newest from its first on."""
    store = state.store
    earlier = store.checkpoints() if store is not None else []
    if store is not None and earlier:
        state.offset = max(c.step for c in earlier)
        log.warning("sparknet: checkpoint_dir %s already holds checkpoints (up to step %d) of an "
                    "earlier fit; this fit's follow them, and the older ones are pruned as they "
                    "come (pass resume=True to continue that fit instead)", store.directory,
                    state.offset)


def resume(state: FitState, ctx: FitContext) -> bool:
    """Put the newest checkpoint of ``state.store`` into the fit ``ctx`` (parameters,
    optimizer states, history, position, sizing); ``False`` when there is none (a fresh
    fit, logged).

    Raises:
        ValueError: the checkpoint belongs to another network or another schedule.
        CheckpointError: its files cannot be read safely.
    """
    store = state.store
    assert store is not None
    ckpt = store.latest()
    if ckpt is None:
        log.info("sparknet: resume=True but %s holds no complete checkpoint; starting a fresh fit",
                 store.directory)
        return False
    meta = ckpt.meta
    if meta.get("kind") != KIND:
        raise CheckpointError(f"checkpoint {ckpt.path} is a {meta.get('kind')!r} checkpoint, not a "
                              f"data-parallel one ({KIND!r})")
    _check_same(ckpt, ctx, state.trainer)
    tr = state.trainer
    arrays = store.load(ckpt)
    saved_opt = meta["settings"]["optimizer"]
    if saved_opt != [tr.optimizer.name, tr.optimizer.get_config()]:
        log.warning("sparknet: resuming with optimizer %r; the checkpoint was written with %s %s",
                    tr.optimizer, *saved_opt)
    pos, partitions = Position(), PartitionStates()
    parts = state.parts(ctx, pos, partitions)
    for part in parts:
        try:
            part.obj.load_state_dict(state_of(part, arrays, meta, parts))
        except (ValueError, KeyError, TypeError) as e:
            raise CheckpointError(f"checkpoint {ckpt.path}: its {part.name} state cannot be put "
                                  f"back: {e}") from None
    state.start = pos
    state.rounds_done = pos.rounds_done
    state.run, state.offset = str(meta.get("run", state.run)), ckpt.step - pos.rounds_done
    state.since = (pos.epoch, pos.rounds_done, time.perf_counter())
    state.pending = partitions.states or None
    state.resumed_from = ckpt
    ctx.history.resumed_from = ckpt.path
    log.info("sparknet: resuming from checkpoint %s (epoch %d, round %d)", ckpt.path,
             pos.epoch + 1, pos.round + 1)
    return True


def _check_same(ckpt: Checkpoint, ctx: FitContext, tr: DataParallelTrainer) -> None:
    """:class:`~sparknet.errors.CheckpointMismatch` naming the first setting of ``ckpt`` that
    differs from this fit's."""
    meta = ckpt.meta
    arch = meta.get("architecture") or {}
    mine = ctx.model.get_config()
    if arch.get("layers") != mine.get("layers"):
        raise CheckpointMismatch(ckpt.path, "layers", arch.get("layers"), mine.get("layers"))
    saved, now = meta.get("settings") or {}, settings(tr, ctx)
    for k in _MUST_MATCH:
        if saved.get(k) != now[k]:
            raise CheckpointMismatch(ckpt.path, k, saved.get(k), now[k])
    if saved.get("optimizer", [None])[0] != now["optimizer"][0]:
        raise CheckpointMismatch(ckpt.path, "optimizer", saved.get("optimizer", [None])[0],
                                 now["optimizer"][0])
    if int(meta["position"]["epoch"]) > ctx.epochs:
        raise CheckpointMismatch(ckpt.path, "epochs", meta["position"]["epoch"], ctx.epochs)


def epoch_carry(pos: Position, rl_factory: Callable[[], RoundLog]) -> RoundLog:
    """The :class:`~sparknet.cluster.data_parallel.fit_context.RoundLog` of the epoch a mid-epoch
    checkpoint was taken in, as far as it had got."""
    rl = rl_factory()
    rl.wall = float(pos.partial.get("wall", 0.0))
    rl.compute = float(pos.partial.get("compute", 0.0))
    rl.rounds = int(pos.partial.get("rounds", 0))
    if pos.partial_stats is not None:
        rl.stats = np.array(pos.partial_stats, dtype=np.float64).reshape(len(STATS))
    return rl
