"""The epoch loop of :meth:`sparknet.Sequential.fit`, one process: minibatches, steps,
validation."""
from __future__ import annotations

import time
from typing import TYPE_CHECKING, Any

import numpy as np

from sparknet import precision as precision_mod
from sparknet.callbacks import CallbackList
from sparknet.divergence import StepGuard
from sparknet.history import History
from sparknet.losses import Loss
from sparknet.optim import Optimizer
from sparknet.progress import FitProgress

if TYPE_CHECKING:
    from sparknet.model import Sequential


def run_epochs(model: Sequential, X: np.ndarray, y: np.ndarray, epochs: int, batch_size: int,
               shuffle: bool, mask: Any, sample_weight: Any, lo: Loss, val: Any, opt: Optimizer,
               guard: StepGuard, history: History, cbl: CallbackList,
               progress: FitProgress) -> None:
    """The epochs of :meth:`Sequential.fit` on one process: shuffled minibatches, one optimizer
    step each (guarded against divergence), the per-step schedule, validation after every epoch,
    the progress bar and the callbacks."""
    n = X.shape[0]
    n_batches = (n + batch_size - 1) // batch_size
    step = 0
    schedule = cbl.step_schedule(n_batches)
    for epoch in range(epochs):
        cbl.on_epoch_begin(epoch)
        lr0 = opt.lr
        t0 = time.perf_counter()
        order = model._rng.permutation(n) if shuffle else np.arange(n)
        tot_s = tot_w = tot_c = 0.0
        bar = progress.rounds(n_batches, f"epoch {epoch + 1}/{epochs}")
        packed_fresh = False
        for b in range(n_batches):
            idx = order[b * batch_size:(b + 1) * batch_size]
            xb, yb = X[idx], y[idx]
            mb = None if mask is None else mask[idx]
            swb = None if sample_weight is None else sample_weight[idx]
            if schedule is not None:
                opt.lr = schedule.lr(epoch, b, n_batches)
                cbl.record_steps((opt.lr,))
                lr0 = opt.lr if b == 0 else lr0
            if not packed_fresh:
                precision_mod.next_step()  # weights may have changed: bf16 copies are stale
            s, w, c = model.loss_and_grad(xb, yb, lo, mask=mb, sample_weight=swb)
            step += 1
            guard.check_loss(s, epoch=epoch + 1, step=step)
            guard.before_step(epoch=epoch + 1, step=step)
            # in bf16 the update also refills the packed weights; a callback may change them
            packed_fresh = precision_mod.optimizer_step(model, opt) and not cbl.callbacks
            guard.after_step(epoch=epoch + 1, step=step)
            tot_s += s
            tot_w += w
            tot_c += c
            cbl.on_batch_end(b, {"loss": s / max(w, 1e-12), "size": float(len(idx))})
            bar.update(1)
            if b % 10 == 0 or b == n_batches - 1:
                post = {"loss": f"{tot_s / max(tot_w, 1e-12):.4f}"}
                if lo.is_classification:
                    post["accuracy"] = f"{tot_c / max(tot_w, 1e-12):.4f}"
                bar.set_postfix(post, refresh=False)
        logs = {"loss": tot_s / max(tot_w, 1e-12)}
        if lo.is_classification:
            logs["accuracy"] = tot_c / max(tot_w, 1e-12)
        if val is not None:
            ev = model.evaluate(val[0], val[1], mask=val[2], loss=lo, _validated=True)
            logs.update({f"val_{k}": v for k, v in ev.items()})
        logs["time"] = time.perf_counter() - t0
        logs["lr"] = lr0
        history.append(epoch, **logs)
        progress.epoch_end(epoch + 1, logs)
        cbl.on_epoch_end(epoch, logs)
        if cbl.stop_training:
            break
