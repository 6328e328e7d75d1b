""":meth:`sparknet.Sequential.fit` on one process: its arguments and data checked, the optimizer,
divergence guard, callbacks and progress bar set up (:func:`fit_one_process`), then the epoch loop
(:func:`run_epochs`): minibatches, steps, validation."""
from __future__ import annotations

import time
from typing import TYPE_CHECKING, Any, Sequence

import numpy as np

from sparknet import losses as losses_mod
from sparknet import precision as precision_mod
from sparknet._validation import (
    check_bool,
    check_float,
    check_mask,
    check_not_class_labels,
    check_sample_weight,
    positive_int,
)
from sparknet.callbacks import CallbackList, FitControl, check_callbacks
from sparknet.divergence import StepGuard
from sparknet.history import History
from sparknet.losses import Loss
from sparknet.model_inputs import prepare_validation, prepare_x, prepare_y
from sparknet.optim import Optimizer
from sparknet.progress import FitProgress, check_verbose

if TYPE_CHECKING:
    from sparknet.model import Callback, Sequential, ValidationData


def fit_one_process(model: Sequential, X: Any, y: Any, epochs: int, batch_size: int,
                    validation_data: ValidationData | None, optimizer: Optimizer | str | None,
                    loss: Loss | str | None, shuffle: bool, mask: Any, sample_weight: Any,
                    verbose: int, callbacks: Sequence[Callback],
                    validation_split: float = 0.0) -> History:
    """:meth:`Sequential.fit <sparknet.model.Sequential.fit>` within its BLAS threads and
    precision (its arguments described there): every argument and the data checked, the
    optimizer, divergence guard, callbacks and progress bar set up, then :func:`run_epochs`."""
    validation_split = check_float(validation_split, "validation_split", 0.0, 1.0, high_open=True)
    if validation_split and validation_data is not None:
        raise ValueError("give validation_data or validation_split, not both (validation_split "
                         "holds out the last part of X and y)")
    epochs = positive_int(epochs, "epochs")
    batch_size = positive_int(batch_size, "batch_size")
    shuffle = check_bool(shuffle, "shuffle")
    verbose = check_verbose(int(verbose) if isinstance(verbose, np.integer) else verbose)
    callbacks = check_callbacks(callbacks)
    lo = losses_mod.get(loss) if loss is not None else None
    was_built = model.built
    X = prepare_x(model, X)
    model._ensure_built(X)
    if not was_built:
        model.layers[0].check_input(X)
    if lo is None and model._loss is None and not model._softmax_head:
        check_not_class_labels(y, model.layers[-1])  # the default loss would be mse
    lo = lo or model.loss
    y = prepare_y(model, y, X.shape[0], lo)
    mask = check_mask(mask, X.shape)
    if mask is not None and not mask.any():
        raise ValueError("mask is all zero: every time step is padding, no step would count")
    if sample_weight is not None:
        sample_weight = check_sample_weight(sample_weight, X.shape[0], model.dtype)
    if validation_split:
        X, y, mask, sample_weight, validation_data = split_tail(X, y, mask, sample_weight,
                                                                validation_split)
    val = prepare_validation(model, validation_data, lo)
    opt = model._get_optimizer(optimizer)
    opt.bind_owner(model)  # an optimizer that stepped for another model fails here
    opt.init_state(model.n_params, model.dtype)  # loaded state of another model fails here
    model._loss = lo if loss is not None else model._loss
    guard = StepGuard(model.params, model.grads, opt, model.state)
    history = History()
    cbl = CallbackList(callbacks, model, model, FitControl(model, opt))
    cbl.on_fit_begin()
    with FitProgress(epochs, verbose, step_unit="batches") as progress:
        run_epochs(model, X, y, epochs, batch_size, shuffle, mask, sample_weight, lo, val, opt,
                   guard, history, cbl, progress)
    cbl.on_fit_end({k: v[-1] for k, v in history.history.items() if v})
    return history


def split_tail(X: np.ndarray, y: np.ndarray, mask: np.ndarray | None,
               sample_weight: np.ndarray | None, fraction: float
               ) -> tuple[np.ndarray, np.ndarray, np.ndarray | None, np.ndarray | None, tuple]:
    """Keras's ``validation_split``: the last ``fraction`` of the samples (before any
    shuffling) held out as validation data ``(X, y[, mask])``, the rest returned to train on.
    The validation samples are evaluated unweighted, as ``validation_data`` is."""
    n = X.shape[0]
    cut = int(np.floor(n * (1.0 - fraction)))
    if cut == 0 or cut == n:
        raise ValueError(f"validation_split={fraction:g} of {n} samples leaves "
                         f"{'no sample to train on' if cut == 0 else 'no validation sample'}")
    val = (X[cut:], y[cut:]) if mask is None else (X[cut:], y[cut:], mask[cut:])
    return (X[:cut], y[:cut], None if mask is None else mask[:cut],
            None if sample_weight is None else sample_weight[:cut], val)


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
