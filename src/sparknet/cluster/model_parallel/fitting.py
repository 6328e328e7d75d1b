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
"""
from __future__ import annotations

import logging
import time
from typing import TYPE_CHECKING, Any, NamedTuple

import numpy as np

from sparknet import losses as losses_mod
from sparknet.cluster.model_parallel.backends import BlockStateLost
from sparknet.cluster.model_parallel.recovery import FitPosition, check_resumable, data_settings
from sparknet.cluster.model_parallel.stages import HalfStep
from sparknet.errors import TrainingDiverged

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


def run_fit(mp: "ModelParallel", X: np.ndarray, y: np.ndarray, lo: losses_mod.Loss, *, epochs: int,
            batch_size: int, shuffle: bool, checkpoint_every: int, verbose: int, max_steps: int | None,
            lookahead: bool, resume: bool) -> dict[str, Any]:
    """The body of :meth:`ModelParallel.fit` (arguments checked there)."""
    settings = data_settings(X, y, batch_size, shuffle)
    pos = _resumed(mp, settings) if resume else None
    if pos is None:
        pos = FitPosition.start(mp.seed, settings)
        if checkpoint_every:
            mp._write_checkpoint(pos)     # the fit's starting point: a loss before step N replays from here
    last: tuple[int, int] = (-1, 0)       # (step of the checkpoint last restored, times in a row)
    run = _Plan(epochs, batch_size, shuffle, lookahead)
    while True:
        try:
            _run(mp, X, y, lo, pos, run, checkpoint_every=checkpoint_every, verbose=verbose, max_steps=max_steps)
            break
        except BlockStateLost as exc:
            pos, last = _recover(mp, pos, exc, last)
        except HalfStep as exc:
            raise _back_to_finite(mp, X, y, lo, pos, exc, run) from None
    hist = pos.history()
    hist["bytes_per_step"] = dict(mp.last_step_bytes)
    return hist


def _resumed(mp: "ModelParallel", settings: dict[str, Any]) -> FitPosition | None:
    """Restore the newest checkpoint and return its fit position (``None``: a fresh fit)."""
    store = mp._checkpoint_store()
    ckpt = store.latest()
    if ckpt is None:
        log.info("fit(resume=True): no complete checkpoint in %s; starting a fresh fit", store.directory)
        return None
    ckpt, pos = mp._restore(ckpt)
    if pos is None:
        log.info("fit(resume=True): checkpoint %s holds no fit position (written by checkpoint()); "
                 "starting a fresh fit from its weights", ckpt.path)
        return None
    check_resumable(pos, settings, ckpt.path)
    log.info("fit(resume=True): resuming from checkpoint %s (step %d, epoch %d, batch %d)", ckpt.path, ckpt.step,
             pos.epoch + 1, pos.batch)
    return pos


def _recover(mp: "ModelParallel", pos: FitPosition, exc: BlockStateLost,
             last: tuple[int, int]) -> tuple[FitPosition, tuple[int, int]]:
    """Restore the newest checkpoint of this fit after ``exc``; the position to go on from."""
    store = mp._checkpoint_store() if mp.checkpoint_dir else None
    ckpt = store.latest() if store is not None else None
    if ckpt is None:
        raise BlockStateLost(f"{exc}; no checkpoint to restore from (set checkpoint_dir and checkpoint_every), "
                             f"training stopped rather than going on with missing or stale weights") from None
    fit = ckpt.meta.get("fit") or {}
    if fit.get("fit_id") != pos.fit_id:
        raise BlockStateLost(f"{exc}; the newest checkpoint ({ckpt.path}, step {ckpt.step}) was not written by "
                             f"this fit, so the steps since it cannot be replayed; restore() it and fit again, "
                             f"or pass checkpoint_every") from None
    repeats = last[1] + 1 if last[0] == ckpt.step else 1
    if repeats > MAX_REPEATS:
        raise BlockStateLost(f"{exc}; block state was lost {MAX_REPEATS} times in a row after restoring checkpoint "
                             f"step {ckpt.step}: giving up") from None
    lost_at, t0 = mp.t, time.perf_counter()
    ckpt, restored = mp._restore(ckpt)
    assert restored is not None
    mp.restores += 1
    log.warning("block state lost at step %d (%s); restored checkpoint %s (step %d) in %.1f s and replaying its "
                "%d step(s) after it", lost_at, exc, ckpt.path, ckpt.step, time.perf_counter() - t0,
                pos.done - restored.done)
    return restored, (ckpt.step, repeats)


def _back_to_finite(mp: "ModelParallel", X: np.ndarray, y: np.ndarray, lo: losses_mod.Loss, pos: FitPosition,
                    exc: HalfStep, run: _Plan) -> TrainingDiverged:
    """After a step that left non-finite weights: restore the newest checkpoint of this fit
    and replay up to the step before, so the model holds its last finite weights; the
    error to raise."""
    ckpt = mp._store.latest() if mp._store is not None else None
    if ckpt is None or (ckpt.meta.get("fit") or {}).get("fit_id") != pos.fit_id:
        return TrainingDiverged(f"{exc}; no checkpoint of this fit to restore the last finite weights from (pass "
                                f"checkpoint_every): the model's weights are not finite",
                                epoch=exc.epoch, step=exc.step, what=exc.what)
    target = pos.done                      # the steps completed before the one that diverged
    ckpt, restored = mp._restore(ckpt)
    assert restored is not None
    replayed = target - restored.done
    _run(mp, X, y, lo, restored, run, checkpoint_every=0, verbose=0, max_steps=target)
    log.warning("training diverged at step %s; restored checkpoint %s (step %d) and replayed %d step(s): the model "
                "holds the weights of step %d", exc.step, ckpt.path, ckpt.step, replayed, mp.t)
    return TrainingDiverged(f"{exc}; the model holds its last finite weights (step {mp.t}: checkpoint {ckpt.step} "
                            f"and {replayed} replayed step(s))", epoch=exc.epoch, step=exc.step, what=exc.what)


def _run(mp: "ModelParallel", X: np.ndarray, y: np.ndarray, lo: losses_mod.Loss, pos: FitPosition, run: _Plan, *,
         checkpoint_every: int, verbose: int, max_steps: int | None) -> None:
    """Run epochs from ``pos`` (updated step by step) to the end, or to ``max_steps``."""
    from sparknet.progress import FitProgress

    n = X.shape[0]
    starts = list(range(0, n, run.batch_size))
    with FitProgress(run.epochs, verbose, step_unit="steps") as progress:
        progress.skip(pos.epoch)
        while pos.epoch < run.epochs:
            rng = pos.generator()
            order = rng.permutation(n) if run.shuffle else np.arange(n)
            bar = progress.rounds(len(starts), f"epoch {pos.epoch + 1}/{run.epochs}")
            bar.update(pos.batch)
            t0 = time.perf_counter()
            try:
                _epoch(mp, X, y, lo, pos, order, starts, batch_size=run.batch_size,
                       checkpoint_every=checkpoint_every, max_steps=max_steps, lookahead=run.lookahead, bar=bar)
            except _Stop:
                if pos.batch:
                    _close_epoch(pos, lo, rng)
                return
            _close_epoch(pos, lo, rng)
            logs = {"loss": pos.loss[-1], "time": time.perf_counter() - t0}
            if lo.is_classification:
                logs["accuracy"] = pos.accuracy[-1]
            progress.epoch_end(pos.epoch, logs)


def _epoch(mp: "ModelParallel", X: np.ndarray, y: np.ndarray, lo: losses_mod.Loss, pos: FitPosition,
           order: np.ndarray, starts: list[int], *, batch_size: int, checkpoint_every: int,
           max_steps: int | None, lookahead: bool, bar: Any = None) -> None:
    """The batches of one epoch from ``pos.batch`` on (``bar``: the console's, updated per step)."""
    if pos.batch >= len(starts):
        return
    xb = X[order[starts[pos.batch]:starts[pos.batch] + batch_size]]
    for bi in range(pos.batch, len(starts)):
        if max_steps is not None and pos.done >= max_steps:
            raise _Stop
        idx = order[starts[bi]:starts[bi] + batch_size]
        last = bi + 1 == len(starts) or (max_steps is not None and pos.done + 1 >= max_steps)
        following = None if last else X[order[starts[bi + 1]:starts[bi + 1] + batch_size]]
        s, w, c = mp._train_step(xb, y[idx], lo, following if lookahead else None, epoch=pos.epoch + 1)
        xb = following
        pos.tot = [pos.tot[0] + s, pos.tot[1] + w, pos.tot[2] + c]
        pos.batch, pos.done = bi + 1, pos.done + 1
        pos.step_time.append(mp.step_times[-1])
        if bar is not None:
            bar.update(1)
            bar.set_postfix({"loss": f"{pos.tot[0] / max(pos.tot[1], 1e-12):.4f}"}, refresh=False)
        if checkpoint_every and mp.t % checkpoint_every == 0:
            mp._write_checkpoint(pos)


def _close_epoch(pos: FitPosition, lo: losses_mod.Loss, rng: np.random.Generator) -> None:
    """Append the epoch's loss and accuracy; the position moves to the next epoch's start."""
    s, w, c = pos.tot
    pos.loss.append(s / max(w, 1e-12))
    pos.accuracy.append(c / max(w, 1e-12) if lo.is_classification else float("nan"))
    pos.epoch, pos.batch, pos.tot = pos.epoch + 1, 0, [0.0, 0.0, 0.0]
    pos.rng = dict(rng.bit_generator.state)
