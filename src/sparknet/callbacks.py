"""One callback protocol for every trainer (Keras-like).

Every fit -- :meth:`sparknet.model.Sequential.fit`,
:meth:`sparknet.cluster.DataParallelTrainer.fit` (every mode),
:meth:`sparknet.cluster.ModelParallel.fit` and the Spark ML Estimators (their
``callbacks`` constructor argument) -- takes ``callbacks=[...]``: :class:`Callback`
objects, or plain callables ``f(epoch, logs)`` (run at each epoch's end; returning
``True`` stops the fit).  The trainer calls, on the driver:

* ``on_fit_begin(logs)`` once, before the first step;
* ``on_epoch_begin(epoch, logs)`` and ``on_epoch_end(epoch, logs)`` around every epoch
  (``epoch`` 0-based; ``logs`` of an epoch's end: ``loss``, ``accuracy``, ``val_*``
  when there is validation, ``time``, ``lr`` -- the rate of the epoch's first step --
  and the trainer's own figures);
* ``on_batch_end(batch, logs)`` after every step of a fit whose steps run on the driver
  (one process, model parallel: ``loss`` of the batch), or ``on_round_end(round, logs)``
  after every round of a data-parallel fit, and after the checkpoint written after it
  when one was due (``epoch``, running ``loss``, ``rounds_done`` -- the rounds the fit
  has run, resumed ones included -- and ``checkpoint``, that checkpoint's step; async
  mode: the arriving update's record).  Raising ``KeyboardInterrupt`` there interrupts
  the fit as Ctrl-C does: it returns the model of that round;
* ``on_fit_end(logs)`` once after the last epoch (not after an error).

**Stopping**: a callback sets ``self.stop_training = True``; the fit ends after the
epoch in which it was set (its history, validation and checkpoint included).

**What a callback may touch**: ``self.model`` (the :class:`~sparknet.model.Sequential`
or the :class:`~sparknet.cluster.ModelParallel` being trained), ``self.trainer`` (the
object running the fit: the model itself, or the ``DataParallelTrainer``),
:meth:`Callback.get_lr` / :meth:`Callback.set_lr` (the rate the next steps use, on
every optimizer the trainer steps: the driver's, the partitions' of the next rounds,
the model-parallel blocks') and :meth:`Callback.get_weights` / :meth:`Callback.set_weights`.

Built in: :class:`EarlyStopping`, :class:`ModelCheckpoint`,
:class:`LearningRateScheduler` (with :mod:`sparknet.schedules`),
:class:`ReduceLROnPlateau`, :class:`LambdaCallback`.
"""
from __future__ import annotations

import logging
import math
import os
import string
from typing import Any, Callable, Iterable

import numpy as np

from sparknet._validation import check_bool, check_float, non_negative_int
from sparknet.schedules import ScheduledLR

log = logging.getLogger(__name__)

__all__ = ["Callback", "CallbackList", "FitControl", "LambdaCallback", "EarlyStopping",
           "ModelCheckpoint", "LearningRateScheduler", "ReduceLROnPlateau"]

Logs = dict[str, float]


class FitControl:
    """What a trainer lends its callbacks: the learning rate and the weights.

    This one serves a model with a flat parameter buffer (``model.params``) stepped by
    ``optimizer`` (one process, and the driver's model of a data-parallel fit);
    :class:`~sparknet.cluster.ModelParallel` has its own.
    """

    def __init__(self, model: Any, optimizer: Any) -> None:
        self.model, self.optimizer = model, optimizer

    def get_lr(self) -> float:
        """The learning rate the next steps use."""
        return float(self.optimizer.lr)

    def set_lr(self, lr: float) -> None:
        """Set the learning rate of the next steps."""
        self.optimizer.lr = check_float(lr, "lr", 0.0, low_open=True)

    def get_weights(self) -> Any:
        """A copy of the weights (what :meth:`set_weights` takes back): the flat parameters,
        followed by the layers' state (running statistics) when they keep any."""
        model = self.model
        state = getattr(model, "state", None)
        if state is None or not state.size:
            return np.array(model.params, copy=True)
        return np.concatenate([model.params, state])

    def set_weights(self, weights: Any) -> None:
        """Put weights from :meth:`get_weights` back into the model."""
        n = self.model.params.shape[0]
        self.model.params[...] = weights[:n]
        if weights.shape[0] > n:
            self.model.state[...] = weights[n:]


class Callback:
    """Base class of the callbacks; override the hooks you need (see the module docstring).

    Attributes:
        model: the model being trained (set by :meth:`set_context`).
        trainer: the object running the fit.
        stop_training: set it to ``True`` to end the fit after the current epoch.
    """

    def __init__(self) -> None:
        self.model: Any = None
        self.trainer: Any = None
        self.stop_training = False
        self._control: FitControl | None = None

    def set_context(self, model: Any, trainer: Any) -> None:
        """Called by the trainer before ``on_fit_begin``."""
        self.model, self.trainer = model, trainer

    def _ctl(self) -> FitControl:
        if self._control is None:
            raise RuntimeError(f"{type(self).__name__} is not part of a running fit")
        return self._control

    def get_lr(self) -> float:
        """The learning rate the fit's next steps use."""
        return self._ctl().get_lr()

    def set_lr(self, lr: float) -> None:
        """Set the learning rate of the fit's next steps (on every optimizer it steps)."""
        self._ctl().set_lr(lr)

    def get_weights(self) -> Any:
        """A copy of the model's weights."""
        return self._ctl().get_weights()

    def set_weights(self, weights: Any) -> None:
        """Put weights from :meth:`get_weights` back."""
        self._ctl().set_weights(weights)

    def on_fit_begin(self, logs: Logs) -> None:
        """Before the first step."""

    def on_epoch_begin(self, epoch: int, logs: Logs) -> None:
        """Before epoch ``epoch`` (0-based)."""

    def on_epoch_end(self, epoch: int, logs: Logs) -> None:
        """After epoch ``epoch``, with its metrics."""

    def on_batch_end(self, batch: int, logs: Logs) -> None:
        """After step ``batch`` of the epoch (fits whose steps run on the driver)."""

    def on_round_end(self, round: int, logs: Logs) -> None:
        """After round ``round`` of the epoch (data-parallel fits) and its checkpoint, if one
        was due: ``logs`` holds ``epoch``, ``loss`` (running), ``rounds_done`` and, when a
        checkpoint was written after the round, its step as ``checkpoint``."""

    def on_fit_end(self, logs: Logs) -> None:
        """After the last epoch."""


class LambdaCallback(Callback):
    """A callback from functions, one per hook (each optional; arguments as the hooks').

    Example::

        LambdaCallback(on_epoch_end=lambda epoch, logs: print(epoch, logs["loss"]))
    """

    _HOOKS = ("on_fit_begin", "on_epoch_begin", "on_epoch_end", "on_batch_end", "on_round_end",
              "on_fit_end")

    def __init__(self, on_fit_begin: Callable | None = None, on_epoch_begin: Callable | None = None,
                 on_epoch_end: Callable | None = None, on_batch_end: Callable | None = None,
                 on_round_end: Callable | None = None, on_fit_end: Callable | None = None) -> None:
        super().__init__()
        given = dict(zip(self._HOOKS, (on_fit_begin, on_epoch_begin, on_epoch_end, on_batch_end,
                                       on_round_end, on_fit_end)))
        for name, fn in given.items():
            if fn is not None:
                if not callable(fn):
                    raise ValueError(f"LambdaCallback {name} must be callable, got {fn!r}")
                setattr(self, name, fn)


class _FunctionCallback(Callback):
    """A plain ``f(epoch, logs)`` run at each epoch's end; returning ``True`` stops the fit."""

    def __init__(self, fn: Callable[[int, Logs], Any]) -> None:
        super().__init__()
        self.fn = fn

    def on_epoch_end(self, epoch: int, logs: Logs) -> None:
        if self.fn(epoch, dict(logs)) is True:
            self.stop_training = True


def check_callbacks(callbacks: Any) -> list[Any]:
    """``callbacks`` as a list of :class:`Callback` objects and plain callables
    ``f(epoch, logs)`` (checked before training starts)."""
    if (callable(callbacks) or isinstance(callbacks, Callback)
            or not isinstance(callbacks, (list, tuple))):
        raise ValueError(f"callbacks must be a list of callables f(epoch, logs) or Callback "
                         f"objects, got {callbacks!r}")
    for i, cb in enumerate(callbacks):
        if not (callable(cb) or isinstance(cb, Callback)):
            raise ValueError(f"callbacks must be a list of callables; item {i} is {cb!r} (pass a "
                             f"sparknet.callbacks.Callback or a function f(epoch, logs))")
    return list(callbacks)


class CallbackList:
    """The callbacks of one fit, called in order; what every trainer uses.

    Args:
        callbacks: :class:`Callback` objects or plain callables ``f(epoch, logs)``.
        model: the model being trained.
        trainer: the object running the fit.
        control: the learning rate and weights of the fit (:class:`FitControl`).
    """

    def __init__(self, callbacks: Iterable[Any], model: Any, trainer: Any,
                 control: FitControl) -> None:
        self.callbacks: list[Callback] = [cb if isinstance(cb, Callback) else _FunctionCallback(cb)
                                          for cb in check_callbacks(callbacks)]
        self.control = control
        steppers = [cb for cb in self.callbacks
                    if isinstance(cb, LearningRateScheduler) and cb.per == "step"]
        if len(steppers) > 1:
            raise ValueError("callbacks hold several LearningRateScheduler(per='step'); one sets "
                             "the rate of every step, keep one")
        self._stepper = steppers[0] if steppers else None
        for cb in self.callbacks:
            cb.set_context(model, trainer)
            cb._control = control
            cb.stop_training = False

    @property
    def stop_training(self) -> bool:
        """Whether a callback asked the fit to stop."""
        return any(cb.stop_training for cb in self.callbacks)

    def step_schedule(self, steps_per_epoch: int) -> ScheduledLR | None:
        """The per-step schedule of a ``LearningRateScheduler(per="step")``, placed on
        ``steps_per_epoch`` steps per epoch (``None`` without one)."""
        if self._stepper is None:
            return None
        return ScheduledLR(self._stepper.schedule, max(int(steps_per_epoch), 1))

    def record_steps(self, lrs: Iterable[float], partition: int | None = None) -> None:
        """Record the rates of steps just run (on the driver, or on partition ``partition``)."""
        if self._stepper is not None:
            self._stepper._record(lrs, partition)

    def on_fit_begin(self, logs: Logs | None = None) -> None:
        for cb in self.callbacks:
            cb.on_fit_begin(dict(logs or {}))

    def on_epoch_begin(self, epoch: int, logs: Logs | None = None) -> None:
        for cb in self.callbacks:
            cb.on_epoch_begin(epoch, dict(logs or {}))

    def on_epoch_end(self, epoch: int, logs: Logs) -> None:
        for cb in self.callbacks:
            cb.on_epoch_end(epoch, dict(logs))

    def on_batch_end(self, batch: int, logs: Logs) -> None:
        for cb in self.callbacks:
            cb.on_batch_end(batch, dict(logs))

    def on_round_end(self, round: int, logs: Logs) -> None:
        for cb in self.callbacks:
            cb.on_round_end(round, dict(logs))

    def on_fit_end(self, logs: Logs | None = None) -> None:
        for cb in self.callbacks:
            cb.on_fit_end(dict(logs or {}))


# ------------------------------------------------------------------------ monitors
def _check_mode(mode: Any, owner: str) -> str:
    if mode not in ("auto", "min", "max"):
        raise ValueError(f"{owner} mode must be 'auto', 'min' or 'max', got {mode!r}")
    return str(mode)


class _Monitor:
    """A metric watched for improvement (``mode``: which way is better)."""

    def __init__(self, owner: str, monitor: Any, mode: Any, min_delta: Any) -> None:
        if not isinstance(monitor, str) or not monitor:
            raise ValueError(f"{owner} monitor must be a metric name such as 'val_loss', "
                             f"got {monitor!r}")
        mode = _check_mode(mode, owner)
        if mode == "auto":
            mode = "max" if ("acc" in monitor or monitor.endswith("auc")) else "min"
        self.owner, self.monitor, self.mode = owner, monitor, mode
        self.min_delta = abs(check_float(min_delta, f"{owner} min_delta"))
        self.reset()

    def reset(self) -> None:
        self.best = math.inf if self.mode == "min" else -math.inf

    def value(self, logs: Logs) -> float | None:
        """The monitored value (``None`` when undefined this epoch: ``NaN``, e.g. inside a
        round of several epochs).  A metric the logs never hold raises ``ValueError``."""
        if self.monitor not in logs:
            hint = " or pass validation data" if self.monitor.startswith("val_") else ""
            raise ValueError(f"{self.owner} monitor={self.monitor!r} is not in the epoch's logs "
                             f"({', '.join(sorted(logs))}); monitor one of them{hint}")
        v = float(logs[self.monitor])
        return None if math.isnan(v) else v

    def improved(self, v: float) -> bool:
        if self.mode == "min":
            return v < self.best - self.min_delta
        return v > self.best + self.min_delta


class EarlyStopping(Callback):
    """Stop when ``monitor`` has not improved for ``patience`` epochs.

    Args:
        monitor: the metric of the epoch's logs to watch (``"val_loss"``: the fit needs
            validation data; ``"loss"`` otherwise).
        mode: ``"min"``, ``"max"`` or ``"auto"`` (``"max"`` for a name with ``acc``,
            ``"min"`` else).
        patience: epochs without improvement before the fit stops (0: at the first).
        min_delta: the least change that counts as an improvement.
        restore_best_weights: when the fit ends, put back the weights of the best epoch
            (the flat buffer ``model.params`` and the layers' ``model.state``; a
            model-parallel model through its save and restore files).

    Attributes:
        best: the best value seen; ``best_epoch``: its epoch; ``stopped_epoch``: the
            epoch after which the fit stopped (``None``: it ran to the end).
    """

    def __init__(self, monitor: str = "val_loss", mode: str = "auto", patience: int = 0,
                 min_delta: float = 0.0, restore_best_weights: bool = False) -> None:
        super().__init__()
        self._mon = _Monitor("EarlyStopping", monitor, mode, min_delta)
        self.monitor, self.mode = self._mon.monitor, self._mon.mode
        self.patience = non_negative_int(patience, "EarlyStopping patience")
        self.restore_best_weights = check_bool(restore_best_weights,
                                               "EarlyStopping restore_best_weights")
        self._reset()

    def _reset(self) -> None:
        self._mon.reset()
        self.wait = 0
        self.best_epoch: int | None = None
        self.stopped_epoch: int | None = None
        self.best_weights: Any = None
        self._last_epoch: int | None = None

    @property
    def best(self) -> float:
        return self._mon.best

    def on_fit_begin(self, logs: Logs) -> None:
        self._reset()

    def on_epoch_end(self, epoch: int, logs: Logs) -> None:
        self._last_epoch = epoch
        v = self._mon.value(logs)
        if v is None:
            return
        if self._mon.improved(v):
            self._mon.best, self.wait, self.best_epoch = v, 0, epoch
            if self.restore_best_weights:
                self.best_weights = self.get_weights()
            return
        self.wait += 1
        if self.wait >= max(self.patience, 1):
            self.stop_training = True
            self.stopped_epoch = epoch
            log.info("EarlyStopping: %s did not improve on %.6g (epoch %d) for %d epoch(s); "
                     "stopping after epoch %d", self.monitor, self.best,
                     (self.best_epoch or 0) + 1, self.wait, epoch + 1)

    def on_fit_end(self, logs: Logs) -> None:
        if (self.restore_best_weights and self.best_weights is not None
                and self.best_epoch != self._last_epoch):
            self.set_weights(self.best_weights)
            log.info("EarlyStopping: restored the weights of epoch %d", (self.best_epoch or 0) + 1)


class ModelCheckpoint(Callback):
    """Save the model at epoch ends through its own (atomic) ``save``.

    Args:
        path: file (or, for a model-parallel model, folder) to write; ``str.format``
            fields take ``epoch`` (1-based) and the epoch's metrics:
            ``"ckpt-{epoch:02d}-{val_loss:.3f}.npz"``.
        monitor: the metric ``save_best_only`` compares.
        save_best_only: write only when ``monitor`` improved on the best so far.
        mode: ``"min"``, ``"max"`` or ``"auto"`` (as :class:`EarlyStopping`).

    Attributes:
        saved: the paths written, in order.
    """

    def __init__(self, path: "str | os.PathLike[str]", monitor: str = "val_loss",
                 save_best_only: bool = False, mode: str = "auto") -> None:
        super().__init__()
        if not isinstance(path, (str, os.PathLike)) or not os.fspath(path):
            raise ValueError(f"ModelCheckpoint path must be a file path, got {path!r}")
        self.path = os.fspath(path)
        try:
            self._fields = {f for _, f, _, _ in string.Formatter().parse(self.path)
                            if f is not None}
        except ValueError as exc:
            raise ValueError(f"ModelCheckpoint path={self.path!r} is not a valid format string: "
                             f"{exc}") from None
        self.save_best_only = check_bool(save_best_only, "ModelCheckpoint save_best_only")
        self._mon = _Monitor("ModelCheckpoint", monitor, mode, 0.0)
        self.monitor = self._mon.monitor
        self.saved: list[str] = []

    def on_fit_begin(self, logs: Logs) -> None:
        self._mon.reset()

    def on_epoch_end(self, epoch: int, logs: Logs) -> None:
        if self.save_best_only:
            v = self._mon.value(logs)
            if v is None or not self._mon.improved(v):
                return
            self._mon.best = v
        try:
            target = self.path.format(epoch=epoch + 1, **logs)
        except (KeyError, IndexError) as exc:
            raise ValueError(f"ModelCheckpoint path={self.path!r} names {exc} that the epoch's "
                             f"logs do not hold ({', '.join(sorted(logs))}, and epoch)") from None
        folder = os.path.dirname(target)
        if folder:
            os.makedirs(folder, exist_ok=True)
        self.model.save(target)
        self.saved.append(target)


class LearningRateScheduler(Callback):
    """Set the learning rate from a schedule (see :mod:`sparknet.schedules`).

    Args:
        schedule: ``schedule(x) -> lr``, a :class:`~sparknet.schedules.Schedule` or any
            picklable callable (a module-level function: with local steps on Spark it
            travels to the executors).
        per: ``"step"`` (default: ``x`` is the step, as :mod:`sparknet.schedules`
            defines it for every trainer, and every step gets its rate) or ``"epoch"``
            (``x`` is the 0-based epoch, set before each epoch; a data-parallel round of
            several epochs runs at its last epoch's rate).

    Attributes:
        lrs: the rates applied, one per step (``per="step"``: steps run on the driver)
            or per epoch (``per="epoch"``).
        partition_lrs: ``per="step"`` with local steps on Spark: partition -> the rates
            of its steps, in order, as the round tasks applied them (the driver records
            them from the rule the tasks carry, :class:`~sparknet.schedules.ScheduledLR`).
    """

    def __init__(self, schedule: Callable[[float], float], per: str = "step") -> None:
        super().__init__()
        if not callable(schedule):
            raise ValueError(f"LearningRateScheduler schedule must be callable, schedule(step) "
                             f"-> lr, got {schedule!r}")
        if per not in ("step", "epoch"):
            raise ValueError(f"LearningRateScheduler per must be 'step' or 'epoch', got {per!r}")
        self.schedule, self.per = schedule, per
        self.lrs: list[float] = []
        self.partition_lrs: dict[int, list[float]] = {}

    def _record(self, lrs: Iterable[float], partition: int | None) -> None:
        if partition is None:
            self.lrs.extend(float(v) for v in lrs)
        else:
            self.partition_lrs.setdefault(int(partition), []).extend(float(v) for v in lrs)

    def on_fit_begin(self, logs: Logs) -> None:
        self.lrs, self.partition_lrs = [], {}
        ScheduledLR(self.schedule, 1).lr(0, 0, 1)  # a bad schedule fails before the first step

    def on_epoch_begin(self, epoch: int, logs: Logs) -> None:
        if self.per == "epoch":
            lr = ScheduledLR(self.schedule, 1).lr(epoch, 0, 1)
            self.set_lr(lr)
            self.lrs.append(lr)


class ReduceLROnPlateau(Callback):
    """Multiply the learning rate by ``factor`` when ``monitor`` stalls for ``patience`` epochs.

    Args:
        monitor: the metric to watch.
        factor: the multiplier, in (0, 1).
        patience: epochs without improvement before a reduction.
        min_lr: the rate never goes below this.
        cooldown: epochs after a reduction during which the count does not run.
        min_delta: the least change that counts as an improvement.
        mode: ``"min"``, ``"max"`` or ``"auto"``.

    Attributes:
        reductions: ``(epoch, new lr)`` of every reduction.
    """

    def __init__(self, monitor: str = "val_loss", factor: float = 0.1, patience: int = 10,
                 min_lr: float = 0.0, cooldown: int = 0, min_delta: float = 1e-4,
                 mode: str = "auto") -> None:
        super().__init__()
        self._mon = _Monitor("ReduceLROnPlateau", monitor, mode, min_delta)
        self.monitor = self._mon.monitor
        self.factor = check_float(factor, "ReduceLROnPlateau factor", 0.0, 1.0, low_open=True,
                                  high_open=True)
        self.patience = non_negative_int(patience, "ReduceLROnPlateau patience")
        self.min_lr = check_float(min_lr, "ReduceLROnPlateau min_lr", 0.0)
        self.cooldown = non_negative_int(cooldown, "ReduceLROnPlateau cooldown")
        self.reductions: list[tuple[int, float]] = []
        self.wait = self.cooldown_counter = 0

    def on_fit_begin(self, logs: Logs) -> None:
        self._mon.reset()
        self.wait = self.cooldown_counter = 0
        self.reductions = []

    def on_epoch_end(self, epoch: int, logs: Logs) -> None:
        v = self._mon.value(logs)
        if v is None:
            return
        if self.cooldown_counter > 0:
            self.cooldown_counter -= 1
            self.wait = 0
        if self._mon.improved(v):
            self._mon.best, self.wait = v, 0
            return
        if self.cooldown_counter > 0:
            return
        self.wait += 1
        if self.wait >= max(self.patience, 1):
            old = self.get_lr()
            new = max(old * self.factor, self.min_lr)
            if new < old and new > 0:
                self.set_lr(new)
                self.reductions.append((epoch, new))
                log.info("ReduceLROnPlateau: %s stalled at %.6g; lr %.3g -> %.3g after epoch %d",
                         self.monitor, self.best, old, new, epoch + 1)
            self.cooldown_counter, self.wait = self.cooldown, 0

    @property
    def best(self) -> float:
        return self._mon.best
