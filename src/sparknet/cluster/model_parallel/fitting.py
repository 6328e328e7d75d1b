""":meth:`ModelParallel.fit <sparknet.cluster.model_parallel.ModelParallel.fit>`: the minibatch
loop, its checkpoints, resuming, and recovery that loses no step.

The loop runs from a :class:`~sparknet.cluster.model_parallel.recovery.FitPosition` (epoch,
batch, the shuffle generator's state at the epoch's start, the history so far).  With
``checkpoint_every=N`` the fit writes a checkpoint of its starting point and one every
``N`` steps, each holding the position.  When a block's resident state is lost, the
newest checkpoint of this fit is restored and the loop goes on *from its position*: the
minibatches between the checkpoint and the loss are run again, in the same order, so the
fit runs exactly the steps it was asked for and ends with the weights an undisturbed fit
would have.  ``fit(resume=True)`` starts from the newest checkpoint's position the same way
(after the driver itself was lost).

Callbacks (:mod:`sparknet.callbacks`) run on the driver: ``on_batch_end`` after every
step, a per-step schedule sets every step's rate (on the blocks' optimizer, which the
jobs carry, and the driver stages'), and ``EarlyStopping(restore_best_weights=True)``
keeps the best epoch's weights as a :meth:`~sparknet.cluster.ModelParallel.save` folder
and restores it (:class:`BlocksControl`).  A replay after a restore runs no callbacks.
"""
from __future__ import annotations

import copy
import logging
import math
import os
import shutil
import tempfile
import time
from typing import TYPE_CHECKING, Any, NamedTuple, Sequence

import numpy as np

from sparknet import precision as precision_mod
from sparknet._validation import check_float, positive_int
from sparknet.callbacks import CallbackList, FitControl
from sparknet.cluster.model_parallel import arguments
from sparknet.cluster.model_parallel.backends import BlockStateLost
from sparknet.cluster.model_parallel.recovery import FitPosition, check_resumable, data_settings
from sparknet.cluster.model_parallel.stages import HalfStep
from sparknet.errors import TrainingDiverged
from sparknet.losses import Loss

if TYPE_CHECKING:
    from sparknet.cluster.model_parallel import ModelParallel

log = logging.getLogger("sparknet.cluster.model_parallel")

#: restores of the same checkpoint in a row after which a fit gives up (BigDL retries 5 times)
MAX_REPEATS = 3


class _Stop(Exception):
    """``max_steps`` reached."""


class _Plan(NamedTuple):
    """The fit's arguments that every pass over its data shares."""

    epochs: int
    batch_size: int
    shuffle: bool
    lookahead: bool
    callbacks: CallbackList | None = None
    lrs: dict[int, float] | None = None       # epoch -> the rate of its first step
    started: dict[int, float] | None = None   # epoch -> perf_counter at its first start
    times: dict[int, float] | None = None     # epoch -> its seconds, restores and replays included


class BlocksControl(FitControl):
    """The learning rate and weights of a :class:`~sparknet.cluster.ModelParallel` for its
    callbacks: the rate goes to the optimizer the block jobs carry and to the driver
    stages' ones; weights are snapshot as :meth:`save` folders in a temporary folder
    (the executors must reach it: refused on a cluster that is not ``local``) and put
    back with :meth:`restore`."""

    def __init__(self, mp: "ModelParallel") -> None:
        super().__init__(mp, mp.job_optimizer)
        self.mp = mp
        self._root: str | None = None
        self._count = 0

    def set_lr(self, lr: float) -> None:
        lr = check_float(lr, "lr", 0.0, low_open=True)
        # a new object: a job deferred into the next step keeps its rate
        if lr != self.mp.job_optimizer.lr:
            self.mp.job_optimizer = copy.copy(self.mp.job_optimizer)
            self.mp.job_optimizer.lr = lr
        self.optimizer = self.mp.job_optimizer
        for stage in self.mp.stages:
            opt = getattr(stage, "opt", None)
            if opt is not None:
                opt.lr = lr

    def get_weights(self) -> str:
        spark = getattr(self.mp, "_spark", None)
        master = getattr(getattr(spark, "sparkContext", spark), "master", "local")
        if spark is not None and not str(master).startswith("local"):
            raise ValueError("restore_best_weights on a ModelParallel needs its weights saved "
                             f"where every executor reads them; on master={master!r} use "
                             "ModelCheckpoint(save_best_only=True) with a shared folder and "
                             "ModelParallel.load it instead")
        if self._root is None:
            self._root = tempfile.mkdtemp(prefix="sparknet-best-")
        self._count += 1
        folder = os.path.join(self._root, f"weights-{self._count}")
        self.mp.save(folder)
        old = os.path.join(self._root, f"weights-{self._count - 1}")
        shutil.rmtree(old, ignore_errors=True)
        return folder

    def set_weights(self, weights: Any) -> None:
        self.mp.restore(str(weights))

    def close(self) -> None:
        """Delete the snapshots."""
        if self._root is not None:
            shutil.rmtree(self._root, ignore_errors=True)
            self._root = None


def _checked(mp: "ModelParallel", epochs: Any, batch_size: Any, checkpoint_every: Any,
             max_steps: Any, resume: bool) -> tuple[int, int, int, int | None]:
    epochs, batch_size = positive_int(epochs, "epochs"), positive_int(batch_size, "batch_size")
    if isinstance(checkpoint_every, bool) or not isinstance(checkpoint_every, (int, np.integer)) \
            or checkpoint_every < 0:
        raise ValueError("checkpoint_every must be a non-negative int (steps; 0: never), got "
                         f"{checkpoint_every!r}")
    if max_steps is not None:
        max_steps = positive_int(max_steps, "max_steps")
    if (checkpoint_every or resume) and not mp.checkpoint_dir:
        raise ValueError(f"{'checkpoint_every' if checkpoint_every else 'resume=True'} needs a "
                         "checkpoint_dir")
    return epochs, batch_size, int(checkpoint_every), max_steps


def run_fit(mp: "ModelParallel", X: Any, y: Any, *, epochs: int, batch_size: int, shuffle: bool,
            checkpoint_every: int, verbose: int, max_steps: int | None, lookahead: bool,
            resume: bool, callbacks: Sequence[Any] = (), precision: str = "fp32") -> dict[str, Any]:
    """The body of :meth:`ModelParallel.fit` (its arguments checked here)."""
    epochs, batch_size, checkpoint_every, max_steps = _checked(mp, epochs, batch_size,
                                                               checkpoint_every, max_steps,
                                                               bool(resume))
    precision = fit_precision(mp, precision)
    resume, shuffle = bool(resume), bool(shuffle)
    lo = mp.loss
    X = arguments.check_inputs(X, mp.input_shape, mp.dtype)
    if y is None:
        raise TypeError("ModelParallel.fit needs y: the labels (class ids) or targets of X")
    y = arguments.check_outputs(y, X.shape[0], lo, mp.output_shape, mp.dtype)
    control = BlocksControl(mp)
    cbl = CallbackList(callbacks, mp, mp, control)
    try:
        with precision_mod.autocast(precision):
            hist = _fit(mp, X, y, lo, _Plan(epochs, batch_size, shuffle, lookahead, cbl, {}, {},
                                            {}),
                        checkpoint_every=checkpoint_every, verbose=verbose, max_steps=max_steps,
                        resume=resume)
        hist["precision"] = precision
        cbl.on_fit_end({k: v[-1] for k, v in hist.items() if isinstance(v, list) and v
                        and k != "step_time"})
    finally:
        control.close()
    return hist


def fit_precision(mp: "ModelParallel", precision: Any) -> str:
    """The precision a fit's products run in: ``precision`` checked (a float32 model for
    ``"bf16"``), or ``"fp32"`` with one warning where the driver or a block's executor has no
    bfloat16 kernel (asked of the executors in one job)."""
    from sparknet.cluster.model_parallel.jobs import PrecisionJob

    value = precision_mod.resolve(precision_mod.check_model_precision(mp, precision))
    if value == "bf16" and not all(mp.backend.run(PrecisionJob(mp.layout, tuple(mp.blocked)))):
        precision_mod.warn_executor_fallback(where="the executors of some blocks")
        return "fp32"
    return value


def _fit(mp: "ModelParallel", X: np.ndarray, y: np.ndarray, lo: Loss, run: _Plan, *,
         checkpoint_every: int, verbose: int, max_steps: int | None,
         resume: bool) -> dict[str, Any]:
    settings = data_settings(X, y, run.batch_size, run.shuffle)
    pos = _resumed(mp, settings) if resume else None
    if pos is None:
        pos = FitPosition.start(mp.seed, settings)
        if checkpoint_every:
            # the fit's starting point: a loss before step N replays from here
            mp._write_checkpoint(pos)
    last: tuple[int, int] = (-1, 0)       # (step of the checkpoint last restored, times in a row)
    assert run.callbacks is not None and run.lrs is not None
    run.callbacks.on_fit_begin()
    while True:
        try:
            _run(mp, X, y, lo, pos, run, checkpoint_every=checkpoint_every, verbose=verbose,
                 max_steps=max_steps)
            break
        except BlockStateLost as exc:
            pos, last = _recover(mp, pos, exc, last)
        except HalfStep as exc:
            raise _back_to_finite(mp, X, y, lo, pos, exc, run) from None
    hist = pos.history()
    hist["lr"] = [run.lrs.get(e, math.nan) for e in range(len(hist["loss"]))]
    times = run.times or {}
    hist["time"] = [times.get(e, math.nan) for e in range(len(hist["loss"]))]
    hist["bytes_per_step"] = dict(mp.last_step_bytes)
    return hist


def _resumed(mp: "ModelParallel", settings: dict[str, Any]) -> FitPosition | None:
    """Restore the newest checkpoint and return its fit position (``None``: a fresh fit)."""
    store = mp._checkpoint_store()
    ckpt = store.latest()
    if ckpt is None:
        log.info("fit(resume=True): no complete checkpoint in %s; starting a fresh fit",
                 store.directory)
        return None
    ckpt, pos = mp._restore(ckpt)
    if pos is None:
        log.info("fit(resume=True): checkpoint %s holds no fit position (written by checkpoint()); "
                 "starting a fresh fit from its weights", ckpt.path)
        return None
    check_resumable(pos, settings, ckpt.path)
    log.info("fit(resume=True): resuming from checkpoint %s (step %d, epoch %d, batch %d)",
             ckpt.path, ckpt.step, pos.epoch + 1, pos.batch)
    return pos


def _recover(mp: "ModelParallel", pos: FitPosition, exc: BlockStateLost,
             last: tuple[int, int]) -> tuple[FitPosition, tuple[int, int]]:
    """Restore the newest checkpoint of this fit after ``exc``; the position to go on from."""
    store = mp._checkpoint_store() if mp.checkpoint_dir else None
    ckpt = store.latest() if store is not None else None
    if ckpt is None:
        raise BlockStateLost(f"{exc}; no checkpoint to restore from (set checkpoint_dir and "
                             "checkpoint_every), training stopped rather than going on with "
                             "missing or stale weights") from None
    fit = ckpt.meta.get("fit") or {}
    if fit.get("fit_id") != pos.fit_id:
        raise BlockStateLost(f"{exc}; the newest checkpoint ({ckpt.path}, step {ckpt.step}) was "
                             "not written by this fit, so the steps since it cannot be replayed; "
                             f"restore() it and fit again, or pass checkpoint_every") from None
    repeats = last[1] + 1 if last[0] == ckpt.step else 1
    if repeats > MAX_REPEATS:
        raise BlockStateLost(f"{exc}; block state was lost {MAX_REPEATS} times in a row after "
                             f"restoring checkpoint step {ckpt.step}: giving up") from None
    lost_at, t0 = mp.t, time.perf_counter()
    ckpt, restored = mp._restore(ckpt)
    assert restored is not None
    mp.restores += 1
    log.warning("block state lost at step %d (%s); restored checkpoint %s (step %d) in %.1f s and "
                "replaying its %d step(s) after it", lost_at, exc, ckpt.path, ckpt.step,
                time.perf_counter() - t0, pos.done - restored.done)
    return restored, (ckpt.step, repeats)


def _back_to_finite(mp: "ModelParallel", X: np.ndarray, y: np.ndarray, lo: Loss, pos: FitPosition,
                    exc: HalfStep, run: _Plan) -> TrainingDiverged:
    """After a step that left non-finite weights: restore the newest checkpoint of this fit
    and replay up to the step before, so the model holds its last finite weights; the
    error to raise."""
    ckpt = mp._store.latest() if mp._store is not None else None
    if ckpt is None or (ckpt.meta.get("fit") or {}).get("fit_id") != pos.fit_id:
        return TrainingDiverged(f"{exc}; no checkpoint of this fit to restore the last finite "
                                "weights from (pass checkpoint_every): the model's weights are "
                                "not finite",
                                epoch=exc.epoch, step=exc.step, what=exc.what)
    target = pos.done                      # the steps completed before the one that diverged
    ckpt, restored = mp._restore(ckpt)
    assert restored is not None
    replayed = target - restored.done
    _run(mp, X, y, lo, restored, run._replace(callbacks=None), checkpoint_every=0, verbose=0,
         max_steps=target)
    log.warning("training diverged at step %s; restored checkpoint %s (step %d) and replayed %d "
                "step(s): the model holds the weights of step %d", exc.step, ckpt.path, ckpt.step,
                replayed, mp.t)
    return TrainingDiverged(f"{exc}; the model holds its last finite weights (step {mp.t}: "
                            f"checkpoint {ckpt.step} and {replayed} replayed step(s))",
                            epoch=exc.epoch, step=exc.step, what=exc.what)


def _run(mp: "ModelParallel", X: np.ndarray, y: np.ndarray, lo: Loss, pos: FitPosition, run: _Plan,
         *, checkpoint_every: int, verbose: int, max_steps: int | None) -> None:
    """Run epochs from ``pos`` (updated step by step) to the end, or to ``max_steps``."""
    from sparknet.progress import FitProgress

    n = X.shape[0]
    starts = list(range(0, n, run.batch_size))
    cbl = run.callbacks
    schedule = None if cbl is None else cbl.step_schedule(len(starts))
    with FitProgress(run.epochs, verbose, step_unit="steps") as progress:
        progress.skip(pos.epoch)
        while pos.epoch < run.epochs:
            rng = pos.generator()
            order = rng.permutation(n) if run.shuffle else np.arange(n)
            bar = progress.rounds(len(starts), f"epoch {pos.epoch + 1}/{run.epochs}")
            bar.update(pos.batch)
            # an epoch restarted after a restore counts from its first start
            t0 = time.perf_counter()
            if run.started is not None:
                t0 = run.started.setdefault(pos.epoch, t0)
            if cbl is not None:
                cbl.on_epoch_begin(pos.epoch)
                assert run.lrs is not None
                run.lrs[pos.epoch] = (cbl.control.get_lr() if schedule is None
                                      else schedule.lr(pos.epoch, 0, len(starts)))
            try:
                _epoch(mp, X, y, lo, pos, order, starts, batch_size=run.batch_size,
                       checkpoint_every=checkpoint_every, max_steps=max_steps,
                       lookahead=run.lookahead, bar=bar, callbacks=cbl, schedule=schedule)
            except _Stop:
                if pos.batch:
                    _close_epoch(pos, lo, rng)
                    _epoch_end(pos, lo, t0, run, progress)
                return
            _close_epoch(pos, lo, rng)
            if _epoch_end(pos, lo, t0, run, progress):
                log.info("a callback stopped the fit after epoch %d", pos.epoch)
                return


def _epoch_end(pos: FitPosition, lo: Loss, t0: float, run: _Plan, progress: Any) -> bool:
    """The epoch just closed: the console's line, the callbacks; whether one stops the fit."""
    logs = {"loss": pos.loss[-1], "time": time.perf_counter() - t0}
    if run.times is not None:
        run.times[pos.epoch - 1] = logs["time"]
    if lo.is_classification:
        logs["accuracy"] = pos.accuracy[-1]
    if run.lrs is not None and pos.epoch - 1 in run.lrs:
        logs["lr"] = run.lrs[pos.epoch - 1]
    progress.epoch_end(pos.epoch, logs)
    if run.callbacks is None:
        return False
    run.callbacks.on_epoch_end(pos.epoch - 1, logs)
    return run.callbacks.stop_training


def _epoch(mp: "ModelParallel", X: np.ndarray, y: np.ndarray, lo: Loss, pos: FitPosition,
           order: np.ndarray, starts: list[int], *, batch_size: int, checkpoint_every: int,
           max_steps: int | None, lookahead: bool, bar: Any = None,
           callbacks: CallbackList | None = None, schedule: Any = None) -> None:
    """The batches of one epoch from ``pos.batch`` on (``bar``: the console's, updated per step;
    ``schedule``: the per-step rate, set before each step)."""
    if pos.batch >= len(starts):
        return
    xb = X[order[starts[pos.batch]:starts[pos.batch] + batch_size]]
    for bi in range(pos.batch, len(starts)):
        if max_steps is not None and pos.done >= max_steps:
            raise _Stop
        idx = order[starts[bi]:starts[bi] + batch_size]
        last = bi + 1 == len(starts) or (max_steps is not None and pos.done + 1 >= max_steps)
        following = None if last else X[order[starts[bi + 1]:starts[bi + 1] + batch_size]]
        if schedule is not None and callbacks is not None:
            lr = schedule.lr(pos.epoch, bi, len(starts))
            callbacks.control.set_lr(lr)
            callbacks.record_steps((lr,))
        s, w, c = mp._train_step(xb, y[idx], lo, following if lookahead else None, epoch=pos.epoch
                                 + 1)
        xb = following
        pos.tot = [pos.tot[0] + s, pos.tot[1] + w, pos.tot[2] + c]
        pos.batch, pos.done = bi + 1, pos.done + 1
        pos.step_time.append(mp.step_times[-1])
        if bar is not None:
            bar.update(1)
            bar.set_postfix({"loss": f"{pos.tot[0] / max(pos.tot[1], 1e-12):.4f}"}, refresh=False)
        if callbacks is not None:
            callbacks.on_batch_end(bi, {"loss": s / max(w, 1e-12), "size": float(len(idx))})
        if checkpoint_every and mp.t % checkpoint_every == 0:
            mp._write_checkpoint(pos)


def _close_epoch(pos: FitPosition, lo: Loss, rng: np.random.Generator) -> None:
    """Append the epoch's loss and accuracy; the position moves to the next epoch's start."""
    s, w, c = pos.tot
    pos.loss.append(s / max(w, 1e-12))
    pos.accuracy.append(c / max(w, 1e-12) if lo.is_classification else float("nan"))
    pos.epoch, pos.batch, pos.tot = pos.epoch + 1, 0, [0.0, 0.0, 0.0]
    pos.rng = dict(rng.bit_generator.state)
