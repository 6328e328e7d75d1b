"""Divergence caught in one process: a non-finite loss, gradient or parameter stops
:meth:`~sparknet.model.Sequential.fit` with :class:`~sparknet.errors.TrainingDiverged`, and
the model keeps the weights the failing step started from.

How it works, per optimizer step (:class:`StepGuard`):

1. the loss of the batch is checked; not finite: nothing is applied;
2. the gradient's squared norm ``g . g`` (one BLAS dot) is checked; not finite (and some
   element truly is not): nothing is applied;
3. a step is *risky* when the learning rate times the gradient norm, or the parameter norm,
   is huge (beyond :data:`SAFE_NORM`).  Below that, neither optimizer can overflow: an SGD
   update is bounded by ``lr * |g|`` (and its momentum buffer by a geometric sum of those),
   an RMSprop update by ``lr / sqrt(1 - alpha)``, and ``g**2`` is finite when ``g . g`` is.
   Only a risky step pays for a copy of the parameters and the optimizer state first;
4. after the step the parameters' squared norm is checked; not finite: the copy is put back
   (a risky step) and the error raised.

So a healthy fit pays two dots per step and no copies; a diverging one is stopped with
the last finite weights, the optimizer state and step count of before the bad step.
"""
from __future__ import annotations

import numpy as np

from sparknet.errors import TrainingDiverged
from sparknet.optim import Optimizer

#: norms beyond which a step may overflow float32 (max 3.4e38) and so is backed up first:
#: 1e15 leaves a margin of 1e23 for the bounds in the module docstring
SAFE_NORM = 1e15


def _norm2(a: np.ndarray) -> float:
    """``a . a`` (NaN or infinity when an element is; may overflow for huge finite values)."""
    if not a.size:
        return 0.0
    with np.errstate(over="ignore", invalid="ignore"):
        return float(np.dot(a, a))


class StepGuard:
    """Checks around each optimizer step of one model; see the module docstring.

    ``where`` arguments (``epoch=``, ``step=``) name the place in the error message.
    """

    def __init__(self, params: np.ndarray, grads: np.ndarray, optimizer: Optimizer) -> None:
        self.params, self.grads, self.opt = params, grads, optimizer
        p2 = _norm2(params)
        if not np.isfinite(p2) and not np.isfinite(params).all():
            raise TrainingDiverged.describe("parameters", "non-finite before training", lr=optimizer.lr)
        self._pnorm = float(np.sqrt(p2))
        self._backup: tuple[np.ndarray, dict[str, np.ndarray], int] | None = None

    def _error(self, what: str, value: object, **where: int) -> TrainingDiverged:
        return TrainingDiverged.describe(what, value, lr=self.opt.lr, **where)

    def check_loss(self, loss: float, **where: int) -> None:
        """Raise when the batch's loss is not finite (before anything is applied)."""
        if not np.isfinite(loss):
            raise self._error("loss", loss, **where)

    def before_step(self, **where: int) -> None:
        """Check the gradient; back up parameters and optimizer state for a risky step."""
        g2 = _norm2(self.grads)
        if not np.isfinite(g2) and not np.isfinite(self.grads).all():
            raise self._error("gradient", "non-finite", **where)
        risky = not np.isfinite(g2) or self.opt.lr * np.sqrt(g2) > SAFE_NORM or self._pnorm > SAFE_NORM
        self._backup = None
        if risky:
            self._backup = (self.params.copy(), {k: v.copy() for k, v in self.opt.state.items()}, self.opt.t)

    def after_step(self, **where: int) -> None:
        """Check the new parameters (and, after a risky step, the optimizer state); not
        finite: put back what the step started from and raise."""
        p2 = _norm2(self.params)
        bad = not np.isfinite(p2) and not np.isfinite(self.params).all()
        if not bad and self._backup is not None:
            bad = not all(np.isfinite(v).all() for v in self.opt.state.values())
        if bad:
            restored = self._restore()
            err = self._error("parameters", "non-finite", **where)
            if not restored:  # cannot happen within the bounds above; say so rather than hide it
                err.args = (f"{err.args[0]} (could not put back the weights: the step was not backed up)",)
            raise err
        self._pnorm = float(np.sqrt(p2)) if np.isfinite(p2) else np.inf

    def _restore(self) -> bool:
        if self._backup is None:
            return False
        params, state, t = self._backup
        self.params[...] = params
        for key in list(self.opt.state):
            if key in state:
                self.opt.state[key][...] = state[key]
            else:  # created by the failed (first) step
                del self.opt.state[key]
        self.opt.t = t
        return True
