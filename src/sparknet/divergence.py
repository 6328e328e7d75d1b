"""Divergence caught in one process: a non-finite loss, gradient or parameter stops
:meth:`~sparknet.model.Sequential.fit` with :class:`~sparknet.errors.TrainingDiverged`, and
the model keeps the weights the failing step started from.

How it works, per optimizer step (:class:`StepGuard`):

1. the batch's loss is checked; not finite: nothing is applied;
2. the gradient's squared norm ``g . g`` (one BLAS dot) is checked; not finite (and some
   element truly is not): nothing is applied;
3. the optimizer bounds what its step can compute (:meth:`~sparknet.optim.Optimizer.step_bound`:
   the decayed gradient, the momentum buffer, the change to the parameters) from the
   gradient's norm and a running bound on the parameters' norm.  Below :data:`SAFE_NORM`
   nothing can overflow, so the step runs unguarded and the parameter bound grows by the
   change's bound;
4. a step beyond it (or an optimizer without a bound, as centered RMSprop) is *risky*: the
   parameters and optimizer state are copied first, and checked after the step (a dot, and
   the state); not finite: the copy is put back and the error raised.  The running bound is
   then reset to the measured norm.

So a healthy fit pays one dot per step and no copies; a diverging one stops with the
weights, optimizer state and step count of before the bad step.
"""
from __future__ import annotations

import numpy as np

from sparknet.errors import TrainingDiverged
from sparknet.optim import Optimizer

#: 2-norms beyond which a step is backed up and checked: float32 overflows at 3.4e38, and
#: every bound of :meth:`~sparknet.optim.Optimizer.step_bound` staying below 1e15 leaves a
#: margin of 1e23 (squares of values below 1e15 stay finite too)
SAFE_NORM = 1e15


def _norm(a: np.ndarray) -> float:
    """``sqrt(a . a)``: NaN or infinity when an element is (or, rarely, when huge finite
    values overflow the dot; callers then check the elements)."""
    if not a.size:
        return 0.0
    with np.errstate(over="ignore", invalid="ignore"):
        return float(np.sqrt(np.dot(a, a)))


class StepGuard:
    """Checks around each optimizer step of one model; see the module docstring.

    ``where`` arguments (``epoch=``, ``step=``) name the place in the error message.
    """

    def __init__(self, params: np.ndarray, grads: np.ndarray, optimizer: Optimizer) -> None:
        self.params, self.grads, self.opt = params, grads, optimizer
        self._measure()
        if not np.isfinite(self._pnorm):
            raise TrainingDiverged.describe("parameters", "non-finite before training", lr=optimizer.lr)
        self._backup: tuple[np.ndarray, dict[str, np.ndarray], int] | None = None
        self._next: tuple[float, float] = (0.0, 0.0)

    def _measure(self) -> None:
        """Measure the parameters' norm and the momentum buffer's (the running bounds' start)."""
        self._pnorm = _norm(self.params)
        if not np.isfinite(self._pnorm) and np.isfinite(self.params).all():
            self._pnorm = float(np.finfo(np.float64).max)  # finite but too large to square
        state = self.opt.state  # the state a step's bound carries: a momentum buffer, Adam's first moment
        buf = state.get("momentum_buffer", state.get("exp_avg"))
        self._carry = _norm(buf) if buf is not None else 0.0

    def _error(self, what: str, value: object, **where: int) -> TrainingDiverged:
        return TrainingDiverged.describe(what, value, lr=self.opt.lr, **where)

    def check_loss(self, loss: float, **where: int) -> None:
        """Raise when the batch's loss is not finite (before anything is applied)."""
        if not np.isfinite(loss):
            raise self._error("loss", loss, **where)

    def before_step(self, **where: int) -> None:
        """Check the gradient; back up parameters and optimizer state for a risky step."""
        gnorm = _norm(self.grads)
        if not np.isfinite(gnorm):
            if not np.isfinite(self.grads).all():
                raise self._error("gradient", "non-finite", **where)
            gnorm = float("inf")  # finite, but too large to square: risky
        n = self.params.shape[0]
        bound, carry = self.opt.step_bound(gnorm, self._pnorm, n, self._carry)
        if self._pnorm + bound > SAFE_NORM:
            self._measure()  # the running bound may only have drifted upwards: measure it
            bound, carry = self.opt.step_bound(gnorm, self._pnorm, n, self._carry)
        risky = not (gnorm <= SAFE_NORM and self._pnorm + bound <= SAFE_NORM)
        self._backup = None
        if risky:
            self._backup = (self.params.copy(), {k: v.copy() for k, v in self.opt.state.items()}, self.opt.t)
        self._next = (bound, carry)

    def after_step(self, **where: int) -> None:
        """After a risky step, check the parameters and the optimizer state; not finite: put
        back what the step started from and raise.  After a safe one, grow the bounds."""
        if self._backup is None:
            bound, self._carry = self._next
            self._pnorm += bound
            return
        bad = not np.isfinite(self.params).all() or not all(np.isfinite(v).all() for v in self.opt.state.values())
        if bad:
            self._restore()
            raise self._error("parameters", "non-finite", **where)
        self._backup = None
        self._measure()

    def _restore(self) -> None:
        assert self._backup is not None
        params, state, t = self._backup
        self.params[...] = params
        for key in list(self.opt.state):
            if key in state:
                self.opt.state[key][...] = state[key]
            else:  # created by the failed (first) step
                del self.opt.state[key]
        self.opt.t = t
        self._backup = None
