"""Learning-rate schedules: small picklable objects, ``schedule(step) -> lr``.

A schedule is a function of the **step**: the number of optimizer steps taken before
the one it sets, counted as one process counts them (``steps_per_epoch = ceil(N /
batch_size)`` steps per epoch of ``N`` rows).  With
:class:`~sparknet.callbacks.LearningRateScheduler` ``(per="epoch")`` the same objects
take the epoch index instead.

Where the steps run decides only *where* the schedule is evaluated, never its values:

* one process (:meth:`sparknet.model.Sequential.fit`), ``sync="gradient"`` on Spark
  (one driver step per global minibatch) and :class:`~sparknet.cluster.ModelParallel`:
  step ``k`` of epoch ``e`` gets ``schedule(e * steps_per_epoch + k)``; the lrs of
  the one-process and the ``sync="gradient"`` fits are equal step for step;
* local steps on the executors (``sync="average"``, ``mode="async"``): a partition's
  ``j``-th of its ``T`` local steps in its pass ``e`` over its shard gets
  ``schedule(e * steps_per_epoch + j * steps_per_epoch / T)`` -- the same fraction of
  the epoch, so every partition walks the one-process curve at its own resolution
  (each epoch starts at the same lr as one process's, and with one partition of whole
  minibatches the lrs are one process's).  :class:`ScheduledLR` is that rule, the one
  place it is written; the round tasks carry it.

Schedules compose: ``LinearWarmup(CosineDecay(1e-3, 1000), warmup_steps=100)``.

Example::

    from sparknet.callbacks import LearningRateScheduler
    from sparknet.schedules import CosineDecay, LinearWarmup
    sched = LinearWarmup(CosineDecay(3e-3, decay_steps=2000, min_lr=1e-5), warmup_steps=200)
    model.fit(X, y, epochs=20, callbacks=[LearningRateScheduler(sched)])
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, Callable

from sparknet._validation import check_float, positive_int

__all__ = ["Schedule", "Constant", "StepDecay", "ExponentialDecay", "CosineDecay", "LinearWarmup",
           "ScheduledLR"]


def _lr(value: Any, what: str) -> float:
    return check_float(value, what, 0.0, low_open=True)


class Schedule:
    """Base class: ``schedule(step)`` is the learning rate at ``step`` (a number >= 0,
    fractional for local steps on executors)."""

    def __call__(self, step: float) -> float:
        raise NotImplementedError

    def get_config(self) -> dict[str, Any]:
        """The constructor's arguments."""
        raise NotImplementedError

    def __repr__(self) -> str:
        args = ", ".join(f"{k}={v!r}" for k, v in self.get_config().items())
        return f"{type(self).__name__}({args})"

    def __eq__(self, other: object) -> bool:
        return (type(other) is type(self) and isinstance(other, Schedule)
                and other.get_config() == self.get_config())

    def __hash__(self) -> int:
        return hash((type(self).__name__, repr(self.get_config())))


class Constant(Schedule):
    """``lr`` at every step.

    Args:
        lr: the learning rate (positive).
    """

    def __init__(self, lr: float) -> None:
        self.lr = _lr(lr, "Constant lr")

    def __call__(self, step: float) -> float:
        return self.lr

    def get_config(self) -> dict[str, Any]:
        return {"lr": self.lr}


class StepDecay(Schedule):
    """``initial_lr * gamma ** floor(step / step_size)`` (PyTorch's ``StepLR``).

    Args:
        initial_lr: the learning rate of the first ``step_size`` steps.
        step_size: steps between decays (a positive integer).
        gamma: the factor of each decay, in (0, 1].
    """

    def __init__(self, initial_lr: float, step_size: int, gamma: float = 0.1) -> None:
        self.initial_lr = _lr(initial_lr, "StepDecay initial_lr")
        self.step_size = positive_int(step_size, "StepDecay step_size")
        self.gamma = check_float(gamma, "StepDecay gamma", 0.0, 1.0, low_open=True)

    def __call__(self, step: float) -> float:
        return self.initial_lr * self.gamma ** math.floor(max(step, 0.0) / self.step_size)

    def get_config(self) -> dict[str, Any]:
        return {"initial_lr": self.initial_lr, "step_size": self.step_size, "gamma": self.gamma}


class ExponentialDecay(Schedule):
    """``initial_lr * decay_rate ** (step / decay_steps)`` (smooth; Keras'
    ``ExponentialDecay`` without staircase).

    Args:
        initial_lr: the learning rate at step 0.
        decay_rate: the factor per ``decay_steps`` steps, in (0, 1].
        decay_steps: steps over which the rate falls by ``decay_rate`` (positive).
    """

    def __init__(self, initial_lr: float, decay_rate: float, decay_steps: float = 1.0) -> None:
        self.initial_lr = _lr(initial_lr, "ExponentialDecay initial_lr")
        self.decay_rate = check_float(decay_rate, "ExponentialDecay decay_rate", 0.0, 1.0,
                                      low_open=True)
        self.decay_steps = check_float(decay_steps, "ExponentialDecay decay_steps", 0.0,
                                       low_open=True)

    def __call__(self, step: float) -> float:
        return self.initial_lr * self.decay_rate ** (max(step, 0.0) / self.decay_steps)

    def get_config(self) -> dict[str, Any]:
        return {"initial_lr": self.initial_lr, "decay_rate": self.decay_rate,
                "decay_steps": self.decay_steps}


class CosineDecay(Schedule):
    """Half a cosine from ``initial_lr`` down to ``min_lr``, then ``min_lr``:
    ``min_lr + (initial_lr - min_lr) * (1 + cos(pi * min(step, decay_steps) / decay_steps)) / 2``.

    Args:
        initial_lr: the learning rate at step 0.
        decay_steps: steps of the decay (positive).
        min_lr: the floor, in [0, initial_lr); a floor of 0 reaches 0 only at
            ``decay_steps`` (the optimizers take positive rates: give a positive
            floor when training runs past it).
    """

    def __init__(self, initial_lr: float, decay_steps: float, min_lr: float = 0.0) -> None:
        self.initial_lr = _lr(initial_lr, "CosineDecay initial_lr")
        self.decay_steps = check_float(decay_steps, "CosineDecay decay_steps", 0.0, low_open=True)
        self.min_lr = check_float(min_lr, "CosineDecay min_lr", 0.0, self.initial_lr,
                                  high_open=True)

    def __call__(self, step: float) -> float:
        frac = min(max(step, 0.0), self.decay_steps) / self.decay_steps
        span = self.initial_lr - self.min_lr
        return self.min_lr + span * 0.5 * (1.0 + math.cos(math.pi * frac))

    def get_config(self) -> dict[str, Any]:
        return {"initial_lr": self.initial_lr, "decay_steps": self.decay_steps,
                "min_lr": self.min_lr}


class LinearWarmup(Schedule):
    """A linear ramp over the first ``warmup_steps`` steps, then ``after``.

    For ``step < warmup_steps`` the rate is ``after(0) * (start_factor + (1 - start_factor)
    * step / warmup_steps)``; from then on ``after(step - warmup_steps)`` (the wrapped
    schedule starts when the warm-up ends).

    Args:
        after: the schedule after the warm-up, or a constant learning rate.
        warmup_steps: steps of the ramp (positive).
        start_factor: the ramp's first rate as a fraction of ``after(0)``, in (0, 1].
    """

    def __init__(self, after: "Schedule | float", warmup_steps: float,
                 start_factor: float = 0.1) -> None:
        if not isinstance(after, Schedule):
            after = Constant(_lr(after, "LinearWarmup after (a Schedule or a learning rate)"))
        self.after = after
        self.warmup_steps = check_float(warmup_steps, "LinearWarmup warmup_steps", 0.0,
                                        low_open=True)
        self.start_factor = check_float(start_factor, "LinearWarmup start_factor", 0.0, 1.0,
                                        low_open=True)

    def __call__(self, step: float) -> float:
        if step < self.warmup_steps:
            frac = max(step, 0.0) / self.warmup_steps
            return self.after(0.0) * (self.start_factor + (1.0 - self.start_factor) * frac)
        return self.after(step - self.warmup_steps)

    def get_config(self) -> dict[str, Any]:
        return {"after": self.after, "warmup_steps": self.warmup_steps,
                "start_factor": self.start_factor}


@dataclass(frozen=True)
class ScheduledLR:
    """A per-step schedule placed on a fit's steps (what a round task carries).

    Attributes:
        schedule: ``schedule(step) -> lr`` (picklable: it travels to the executors).
        steps_per_epoch: one process's steps per epoch, ``ceil(N / batch_size)``.
    """

    schedule: Callable[[float], float]
    steps_per_epoch: int

    def lr(self, epoch: int, k: int, steps: int) -> float:
        """The rate of the ``k``-th (0-based) of ``steps`` steps of pass ``epoch``:
        ``schedule(epoch * S + k * S / steps)`` with ``S = steps_per_epoch`` (``steps == S``
        gives ``schedule(epoch * S + k)`` exactly).

        Raises:
            ValueError: the schedule returned a rate that is not a positive finite number.
        """
        s = self.steps_per_epoch
        at = epoch * s + (k if steps == s else k * s / max(steps, 1))
        value = self.schedule(at)
        if (isinstance(value, bool) or not isinstance(value, (int, float))
                or not (math.isfinite(value) and value > 0)):
            try:
                value = float(value)  # numpy scalars
            except (TypeError, ValueError):
                value = math.nan
            if not (math.isfinite(value) and value > 0):
                raise ValueError(f"schedule {self.schedule!r} returned lr={value!r} "
                                 f"at step {at!r}; a learning rate must be a positive finite "
                                 f"number")
        return float(value)
