"""Checkpoints of a data-parallel fit: what they hold, when they are written, how a fit
resumes from one, and where a round's timeout comes from.

:class:`~sparknet.cluster.data_parallel.trainer.DataParallelTrainer` gives every fit one
:class:`FitState` (``ctx.state``).  With ``checkpoint_dir`` set it writes checkpoints
through :class:`sparknet.checkpoint.CheckpointStore` (atomic folders, a manifest with a
SHA-256 per file written last, the newest ``checkpoint_keep`` kept).

What a checkpoint holds
-----------------------
Arrays:

* ``params`` -- the flat parameter vector;
* ``state`` -- the layers' untrained state (BatchNormalization's running statistics),
  when they keep any (:mod:`sparknet.cluster.data_parallel.layer_state`);
* ``opt_*`` -- the driver's optimizer state (``sync="gradient"``), in the one serialised
  form of :meth:`sparknet.optim.Optimizer.state_arrays`;
* ``outer_*`` -- the outer optimizer's state (``sync="average"`` with ``outer``);
* ``part<p>_*`` -- partition ``p``'s resident optimizer state (``sync="average"`` and
  ``mode="async"``: RMSprop's running averages, momentum buffers, its step count).  In
  synchronous rounds it comes back with the results of the round a checkpoint follows
  (the driver knows in advance which round that is), so a checkpoint costs no Spark job;
  ``mode="async"`` collects it with one small job at the epoch's end;
* ``partial_stats`` -- the loss/accuracy sums of the epoch so far (a checkpoint taken
  between two rounds of an epoch).

Metadata (JSON): the architecture (``model.get_config()``), the trainer's settings
(mode, sync, optimizer and its configuration, loss, seed, batch size, partitions and
their rows, outer optimizer, async options), the position in the data order (the epoch
and round the fit goes on with, rounds done), the round sizing (rounds per epoch, local
steps, epochs per round, the measured cost model), the async server's counters (updates
applied, rows dispatched, each partition's pass and chunk), the history so far, and the
random state.  Every random draw of a data-parallel fit -- the data split, each epoch's
permutations, dropout in each task -- is a pure function of the seed and these counters
(``default_rng([seed, epoch, partition])``, see :mod:`sparknet.cluster.data_parallel.trainer`),
so the seed plus the position *is* the random state; the model's own generator
(``Sequential._rng``, used by one-process ``fit``) is stored as well.

Resuming
--------
``fit(..., resume=True)`` loads the newest complete checkpoint (a partial or damaged one
is skipped with a warning by the store), checks that it belongs to the same network and
the same schedule (mode, sync, batch size, seed, partitions and their rows: otherwise a
``ValueError`` saying which differs), puts back the parameters, optimizer states and
history, and goes on from the stored position: ``epochs`` is the total the fit should
reach, as Keras's ``initial_epoch``.  The partitions' optimizer state is put back
under the new fit's key (each fit has its own) before the first round.  With
``sync="gradient"`` (and with a fixed ``local_steps`` and plain averaging) the resumed
fit computes exactly what the uninterrupted one would have, bit for bit.

When the training shards are rebuilt after an executor loss, every partition's
optimizer state is gone with them: it is restored from the newest checkpoint before the
next round when there is one; otherwise a warning says that it restarts from zero.

Round timeouts
--------------
:func:`job_timeout` turns ``round_timeout`` into seconds for one job: a number is used
as it is, ``None`` waits forever, ``"auto"`` is ``max(ROUND_TIMEOUT_FLOOR,
ROUND_TIMEOUT_FACTOR x the slowest measured job of that kind)`` (predicted from the
round cost model before one was measured).
"""
from __future__ import annotations

import logging
import math
import re
import time
import uuid
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Callable, Mapping

import numpy as np

from sparknet.checkpoint import Checkpoint, CheckpointStore
from sparknet.cluster.data_parallel import layer_state
from sparknet.cluster.data_parallel.parameter_server import STATS
from sparknet.cluster.data_parallel.round_task import STATE_PREFIX
from sparknet.errors import CheckpointError

if TYPE_CHECKING:
    from sparknet.cluster.data_parallel.fit_context import FitContext, RoundLog
    from sparknet.cluster.data_parallel.trainer import DataParallelTrainer
    from sparknet.cluster.resident.driver import Shard

log = logging.getLogger(__name__)

#: Kind of the checkpoints a data-parallel fit writes (their ``meta["kind"]``).
KIND = "sparknet-data-parallel"
#: Seconds below which an ``"auto"`` round timeout never goes: the first rounds of a fit
#: include the executors' worker start and model build, and a shared cluster stalls.
ROUND_TIMEOUT_FLOOR = 120.0
#: An ``"auto"`` timeout is this many times the slowest job of its kind measured so far.
ROUND_TIMEOUT_FACTOR = 20.0


# ------------------------------------------------------------------ arguments
def configure(trainer: DataParallelTrainer, checkpoint_dir: Any, checkpoint_every: Any, checkpoint_keep: Any,
              round_timeout: Any) -> None:
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
        raise ValueError("fit(resume=True) needs the trainer's checkpoint_dir: the folder to resume from")
    if trainer.checkpoint_dir is None:
        return None
    return CheckpointStore(trainer.checkpoint_dir, keep=trainer.checkpoint_keep, spark=trainer.spark)


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
        raise ValueError(f"checkpoint_every must be 'epoch', a positive int (rounds), 'N epochs' or "
                         f"'Ns' (seconds), got checkpoint_every={value!r}")

    def due(self, epochs: int, rounds: int, seconds: float) -> bool:
        """Whether a checkpoint is due after ``epochs`` whole epochs, ``rounds`` rounds and
        ``seconds`` since the last one."""
        if self.unit == "epochs":
            return epochs >= self.n
        if self.unit == "rounds":
            return rounds >= self.n
        return seconds >= self.n


def check_round_timeout(value: Any) -> "float | str | None":
    """``round_timeout`` validated: ``"auto"``, ``None`` or positive finite seconds."""
    if value is None or (isinstance(value, str) and value == "auto"):
        return value
    if isinstance(value, (int, float, np.integer, np.floating)) and not isinstance(value, bool):
        if math.isfinite(float(value)) and float(value) > 0:
            return float(value)
    raise ValueError(f"round_timeout must be 'auto', None or a positive number of seconds, "
                     f"got round_timeout={value!r}")


def job_timeout(setting: "float | str | None", slowest: float | None, predicted: float | None = None) -> float | None:
    """Seconds one job may run: ``setting`` when it is a number, ``None`` for ``None``;
    for ``"auto"`` ``max(ROUND_TIMEOUT_FLOOR, ROUND_TIMEOUT_FACTOR x slowest)`` with
    ``slowest`` the slowest job of its kind measured so far (or its ``predicted`` time
    before one was measured)."""
    if setting is None or isinstance(setting, (int, float)):
        return None if setting is None else float(setting)
    base = slowest if slowest is not None else predicted
    return max(ROUND_TIMEOUT_FLOOR, ROUND_TIMEOUT_FACTOR * (base or 0.0))


# ------------------------------------------------------------ partition state
def state_prefix(key: str) -> str:
    """Names of fit ``key``'s optimizer state next to each shard start with this."""
    return f"{STATE_PREFIX}{key}-"


class _CollectState:
    """Executor side: one partition's resident optimizer state of a fit, as copies."""

    def __init__(self, prefix: str) -> None:
        self.prefix = prefix

    def __call__(self, index: int, shard: "Shard") -> dict[str, np.ndarray]:
        out = {}
        for name in sorted(shard.names()):
            if name.startswith(self.prefix):
                arr = shard.get(name)
                if arr is not None:
                    out[name[len(self.prefix):]] = np.array(arr, copy=True)
        return out


class _PushState:
    """Executor side: put a partition's optimizer state (from a ``Broadcast`` of
    ``{partition: {name: array}}``) back next to its shard under the fit's prefix."""

    def __init__(self, prefix: str, bc: Any) -> None:
        self.prefix, self.bc = prefix, bc

    def __call__(self, index: int, shard: "Shard") -> list[int]:
        if index not in self.bc.value:
            return [0]  # a partition whose state was kept
        mine = self.bc.value[index]
        for name in [n for n in shard.names() if n.startswith(STATE_PREFIX)]:
            shard.discard(name)  # another fit's, or a rebuilt shard's half-written state
        for name, arr in mine.items():
            dst = shard.ensure(self.prefix + name, arr.shape, arr.dtype)
            np.copyto(dst, arr)
        return [len(mine)]


def _partition_arrays(states: Mapping[int, Mapping[str, np.ndarray]]) -> dict[str, np.ndarray]:
    return {f"part{p:05d}_{name}": arr for p, d in states.items() for name, arr in d.items()}


def _partition_states(arrays: Mapping[str, np.ndarray]) -> dict[int, dict[str, np.ndarray]]:
    out: dict[int, dict[str, np.ndarray]] = {}
    for name, arr in arrays.items():
        m = re.fullmatch(r"part(\d{5})_(.+)", name)
        if m:
            out.setdefault(int(m.group(1)), {})[m.group(2)] = arr
    return out


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
        written: ``(step, seconds)`` of every checkpoint written by this fit.
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
    written: list[tuple[int, float]] = field(default_factory=list)
    stash: dict[int, dict[str, np.ndarray]] | None = None
    rounds_done: int = 0
    run: str = field(default_factory=lambda: uuid.uuid4().hex[:12])
    offset: int = 0
    _since: tuple[int, int, float] = (0, 0, 0.0)     # epochs, rounds, perf_counter at the last checkpoint
    _built: float | None = None                       # the training shards' build stamp

    def __post_init__(self) -> None:
        self._since = (0, 0, time.perf_counter())  # "Ns" counts from the fit's start

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
            fn = _PushState(state_prefix(ctx.spec.key), bc)
            if standalone:
                resident.map(fn, description="sparknet: restoring the partitions' optimizer state")
            else:  # inside the round's action: its job group, its retry
                resident.mapPartitions(fn).collect()
        finally:
            bc.destroy(blocking=False)

    def _from_newest(self, ctx: FitContext, partitions: list[int]) -> dict[int, dict[str, np.ndarray]] | None:
        """The optimizer state of ``partitions`` (built anew) from this run's newest
        checkpoint, or ``None`` (logged) when there is none."""
        store = self.store
        ckpt = store.latest() if store is not None else None
        if ckpt is not None and ckpt.meta.get("run") != self.run:
            ckpt = None  # another run's: its optimizer state belongs to other parameters
        if store is None or ckpt is None:
            log.warning("sparknet: the optimizer state of rebuilt partition(s) %s restarts from zero (no "
                        "checkpoint of this fit to restore it from: set checkpoint_dir)", partitions)
            return None
        want = tuple(f"part{p:05d}_" for p in partitions)
        states = _partition_states(store.load(ckpt, [n for n in ckpt.arrays if n.startswith(want)]))
        log.warning("sparknet: the optimizer state of rebuilt partition(s) %s restored from checkpoint %s",
                    sorted(states), ckpt.path)
        return states

    def collects_after(self, rnd: int, rounds: int, epochs_after: int) -> bool:
        """Whether round ``rnd`` of ``rounds`` should bring the partitions' optimizer state
        back: a checkpoint is due after it (``epochs_after``: whole epochs done when it is
        an epoch's last round; for ``"Ns"``, due by the slowest round so far)."""
        if self.store is None or not self.keeps_partition_state:
            return False
        e0, r0, t0 = self._since
        last = rnd + 1 >= rounds
        if self.every.unit == "epochs":
            return last and epochs_after - e0 >= self.every.n
        ahead = self.slowest.get("train", 0.0) if self.every.unit == "seconds" else 0.0
        return self.every.due(0, self.rounds_done + 1 - r0, time.perf_counter() - t0 + ahead)

    def collect(self, ctx: FitContext) -> dict[str, np.ndarray]:
        """Every partition's resident optimizer state, as checkpoint arrays: what the last
        round brought back, else one job."""
        if not self.keeps_partition_state:
            return {}
        if self.stash is not None and len(self.stash) == sum(1 for n in ctx.train.rows if n > 0):
            stash, self.stash = self.stash, None
            return _partition_arrays(stash)
        fn = _CollectState(state_prefix(ctx.spec.key))
        resident = ctx.train.resident
        for _ in range(2):  # shards rebuilt by the collecting job: their state back, then again
            self.before_round(ctx, standalone=True)
            stamp = resident.build_started
            got = resident.map(fn, description="sparknet: collecting the partitions' optimizer state for a "
                                               "checkpoint")
            if resident.build_started == stamp:
                break
        return _partition_arrays(dict(enumerate(got)))

    # -- writing ---------------------------------------------------------
    def round_end(self, ctx: FitContext, epoch: int, rnd: int, rounds: int, rl: RoundLog,
                  elapsed: float) -> int | None:
        """After round ``rnd`` of ``rounds`` of ``epoch`` (mid-epoch only: the epoch's end is
        :meth:`epochs_end`): write a checkpoint when one is due; returns its step."""
        self.rounds_done += 1
        if self.store is None or rnd + 1 >= rounds or self.every.unit == "epochs":
            return None
        e0, r0, t0 = self._since
        if not self.every.due(0, self.rounds_done - r0, time.perf_counter() - t0):
            return None
        pos = Position(epoch, rnd + 1, self.rounds_done,
                       {"wall": rl.wall, "compute": rl.compute, "rounds": rl.rounds, "elapsed": elapsed},
                       np.atleast_2d(rl.stats).sum(axis=0))
        return self.write(ctx, pos)

    def epochs_end(self, ctx: FitContext, epochs_done: int, rounds: int = 0) -> int | None:
        """After whole epochs (``epochs_done`` in all; ``rounds`` more rounds run, the async
        epochs' count): write a checkpoint when one is due; returns its step."""
        self.rounds_done += rounds
        if self.store is None:
            return None
        e0, r0, t0 = self._since
        if not self.every.due(epochs_done - e0, self.rounds_done - r0, time.perf_counter() - t0):
            return None
        return self.write(ctx, Position(epochs_done, 0, self.rounds_done))

    def write(self, ctx: FitContext, pos: Position) -> int:
        """Write the checkpoint of the fit at ``pos`` (step: rounds done); returns the step."""
        assert self.store is not None
        t0 = time.perf_counter()
        tr, model = self.trainer, ctx.model
        arrays: dict[str, np.ndarray] = {"params": np.array(model.params, copy=True),
                                         **layer_state.checkpoint_arrays(model)}
        arrays.update(tr.optimizer.state_arrays("opt_"))
        if tr.outer is not None:
            arrays.update(tr.outer.state_arrays("outer_"))
        t_collect, by_job = time.perf_counter(), self.stash is None and self.keeps_partition_state
        arrays.update(self.collect(ctx))
        t_collect = time.perf_counter() - t_collect
        if pos.partial_stats is not None:
            arrays["partial_stats"] = pos.partial_stats
        meta = self._meta(ctx, pos)
        step = self.offset + pos.rounds_done
        self.store.save(step, arrays, meta)
        seconds = time.perf_counter() - t0
        self.written.append((step, seconds))
        if ctx.history is not None:
            ctx.history.checkpoints.append({"step": step, "seconds": seconds, "collect": t_collect,
                                            "job": by_job, "bytes": sum(a.nbytes for a in arrays.values())})
        self._since = (pos.epoch, pos.rounds_done, time.perf_counter())
        log.info("sparknet: checkpoint %d written in %.0f ms (goes on with epoch %d, round %d)",
                 step, 1e3 * seconds, pos.epoch + 1, pos.round + 1)
        return step

    def _meta(self, ctx: FitContext, pos: Position) -> dict[str, Any]:
        tr, model, h = self.trainer, ctx.model, ctx.history
        mode_state = getattr(ctx.mode_state, "checkpoint_meta", None)
        return {
            "kind": KIND, "run": self.run,
            "architecture": model.get_config(),
            "settings": settings(tr, ctx),
            "position": {"epoch": pos.epoch, "round": pos.round, "rounds_done": pos.rounds_done,
                         "partial": pos.partial},
            "sizing": {"rounds": ctx.rounds, "steps_per_round": ctx.steps_per_round,
                       "epochs_per_round": ctx.epochs_per_round,
                       "cost": None if ctx.cost is None else [ctx.cost.t_fixed, ctx.cost.t_step]},
            "outer": None if tr.outer is None else tr.outer.get_config(),
            "async": mode_state() if callable(mode_state) else None,
            "history": None if h is None else {"epoch": list(h.epoch), "history": h.to_dict(),
                                               "updates": list(h.updates)},
            "rng": {"seed": tr.seed, "model": _jsonable(model._rng.bit_generator.state)},
        }


def settings(tr: DataParallelTrainer, ctx: FitContext) -> dict[str, Any]:
    """The trainer's settings that a checkpoint records (and a resume compares)."""
    opts = tr.mode_options
    return {"mode": tr.mode, "sync": tr.sync, "local_steps": tr.local_steps,
            "optimizer": [tr.optimizer.name, tr.optimizer.get_config()], "loss": ctx.model.loss.name,
            "seed": tr.seed, "batch_size": ctx.batch_size, "epochs": ctx.epochs, "reduce": tr.reduce,
            "max_overhead": tr.max_overhead, "max_epochs_per_round": tr.max_epochs_per_round,
            "rows": [int(n) for n in ctx.train.rows], "dtype": ctx.model.dtype.name,
            "async": None if opts is None else {k: getattr(opts, k) for k in
                                                 ("max_staleness", "stale", "delta_weight", "coalesce")}}


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
        log.warning("sparknet: checkpoint_dir %s already holds checkpoints (up to step %d) of an earlier "
                    "fit; this fit's follow them, and the older ones are pruned as they come (pass "
                    "resume=True to continue that fit instead)", store.directory, state.offset)


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
    arrays = store.load(ckpt)
    tr, model = state.trainer, ctx.model
    params = arrays["params"]
    if params.shape != model.params.shape or params.dtype != model.params.dtype:
        raise CheckpointError(f"checkpoint {ckpt.path}: params has shape {params.shape} of {params.dtype}, "
                              f"the model has {model.params.shape} of {model.params.dtype}")
    model.params[...] = params
    layer_state.restore(model, arrays, ckpt.path)
    saved_opt = meta["settings"]["optimizer"]
    if saved_opt != [tr.optimizer.name, tr.optimizer.get_config()]:
        log.warning("sparknet: resuming with optimizer %r; the checkpoint was written with %s %s",
                    tr.optimizer, *saved_opt)
    tr.optimizer.load_state_arrays(arrays, "opt_")
    if tr.outer is not None and meta.get("outer") is not None:
        saved = meta["outer"]
        if saved.get("momentum") is not None:
            tr.outer._size(float(saved["momentum"]), saved.get("lr"))
            tr.outer.load_state_arrays(arrays, "outer_")
    _restore_history(ctx, meta.get("history"))
    sizing = meta.get("sizing") or {}
    ctx.rounds = int(sizing.get("rounds", ctx.rounds))
    ctx.steps_per_round = int(sizing.get("steps_per_round", ctx.steps_per_round))
    ctx.epochs_per_round = int(sizing.get("epochs_per_round", ctx.epochs_per_round))
    if sizing.get("cost"):
        from sparknet.cluster.planning.cost import RoundCostModel
        t_fixed, t_step = sizing["cost"]
        ctx.cost = tr.cost = RoundCostModel(float(t_fixed), float(t_step), int(model.params.nbytes))
    rng = (meta.get("rng") or {}).get("model")
    if rng:
        model._rng.bit_generator.state = rng
    pos = meta["position"]
    state.start = Position(int(pos["epoch"]), int(pos["round"]), int(pos["rounds_done"]),
                           dict(pos.get("partial") or {}), arrays.get("partial_stats"))
    state.rounds_done = state.start.rounds_done
    state.run, state.offset = str(meta.get("run", state.run)), ckpt.step - state.start.rounds_done
    state._since = (state.start.epoch, state.start.rounds_done, time.perf_counter())
    if state.keeps_partition_state:
        state.pending = _partition_states(arrays) or None
    ctx.mode_resume = meta.get("async")
    state.resumed_from = ckpt
    if ctx.history is not None:
        ctx.history.resumed_from = ckpt.path
    log.info("sparknet: resuming from checkpoint %s (epoch %d, round %d)", ckpt.path,
             state.start.epoch + 1, state.start.round + 1)
    return True


def _check_same(ckpt: Checkpoint, ctx: FitContext, tr: DataParallelTrainer) -> None:
    """``ValueError`` naming the first setting of ``ckpt`` that differs from this fit's."""
    meta = ckpt.meta
    arch = meta.get("architecture") or {}
    mine = ctx.model.get_config()
    if arch.get("layers") != mine.get("layers"):
        raise ValueError(f"checkpoint {ckpt.path} belongs to another network (its layers differ from "
                         f"the model's); resume with the same architecture or a new checkpoint_dir")
    saved, now = meta.get("settings") or {}, settings(tr, ctx)
    for k in _MUST_MATCH:
        if saved.get(k) != now[k]:
            raise ValueError(f"checkpoint {ckpt.path} was written with {k}={saved.get(k)!r}, this fit has "
                             f"{k}={now[k]!r}: resume with the same setting (and data), or a new checkpoint_dir")
    if saved.get("optimizer", [None])[0] != now["optimizer"][0]:
        raise ValueError(f"checkpoint {ckpt.path} holds {saved['optimizer'][0]!r} optimizer state, this "
                         f"trainer's optimizer is {now['optimizer'][0]!r}")
    if int(meta["position"]["epoch"]) > ctx.epochs:
        raise ValueError(f"checkpoint {ckpt.path} is at epoch {meta['position']['epoch']}, past "
                         f"epochs={ctx.epochs}: epochs is the total to reach, pass a larger one")


def _restore_history(ctx: FitContext, saved: Mapping[str, Any] | None) -> None:
    h = ctx.history
    if h is None or not saved:
        return
    h.epoch = [int(e) for e in saved.get("epoch", [])]
    h.history = {k: [float(v) for v in vals] for k, vals in (saved.get("history") or {}).items()}
    h.updates = [dict(u) for u in saved.get("updates", [])]


def epoch_carry(pos: Position, rl_factory: Callable[[], RoundLog]) -> RoundLog:
    """The :class:`~sparknet.cluster.data_parallel.fit_context.RoundLog` of the epoch a mid-epoch checkpoint
    was taken in, as far as it had got."""
    rl = rl_factory()
    rl.wall = float(pos.partial.get("wall", 0.0))
    rl.compute = float(pos.partial.get("compute", 0.0))
    rl.rounds = int(pos.partial.get("rounds", 0))
    if pos.partial_stats is not None:
        rl.stats = np.array(pos.partial_stats, dtype=np.float64).reshape(len(STATS))
    return rl
