"""Divergence caught in one process: a non-finite loss, gradient or parameter stops
:meth:`~sparknet.model.Sequential.fit` with :class:`~sparknet.errors.TrainingDiverged`, and
the model keeps the last weights whose loss was finite.

How it works, per optimizer step ``k`` (:class:`StepGuard`):

1. the batch's loss, computed at the weights the step starts from, is checked; not finite:
   those weights are the result of step ``k - 1``'s update, so the model goes back to the
   weights, optimizer state and layer state of before step ``k - 1`` (whose loss was
   finite), and the error is raised;
2. the gradient's squared norm ``g . g`` (one BLAS dot) is checked; not finite (and some
   element truly is not): nothing is applied, the weights stay those whose loss was just
   found finite;
3. the parameters and the optimizer state are copied (one memory copy of each, small
   beside the step's matrix products): the copy that (1) or (4) goes back to;
4. the optimizer bounds what its step can compute (:meth:`~sparknet.optim.Optimizer.step_bound`:
   the decayed gradient, the momentum buffer, the change to the parameters) from the
   gradient's norm and a running bound on the parameters' norm.  Below :data:`SAFE_NORM`
   nothing can overflow, so the step is not checked and the parameter bound grows by the
   change's bound; a step beyond it (or an optimizer without a bound, as centered RMSprop)
   is *risky*: the parameters and the optimizer state are checked after the step (a dot,
   and the state); not finite: the copy of (3) is put back and the error raised.  The
   running bound is then reset to the measured norm.

So a healthy fit pays one dot and one copy per step; a diverging one stops with weights
whose loss on the last batch they saw was finite.  The layers' untrained state
(BatchNormalization's running statistics, updated by each step's forward pass before
anything above is checked) is copied after every step, a few values per layer, and put
back with the rest.
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

    ``where`` arguments (``epoch=``, ``step=``) name the place in the error message;
    ``state`` is the model's flat layer state (``None`` or empty: none).
    """

    def __init__(self, params: np.ndarray, grads: np.ndarray, optimizer: Optimizer,
                 state: np.ndarray | None = None) -> None:
        self.params, self.grads, self.opt = params, grads, optimizer
        self.state = state if state is not None and state.size else None
        self._state_before = None if self.state is None else self.state.copy()
        self._measure()
        if not np.isfinite(self._pnorm):
            raise TrainingDiverged.describe("parameters", "non-finite before training",
                                            lr=optimizer.lr)
        self._snap: _Snapshot | None = None  # the model as of before the last step (point 3)
        self._risky = False
        self._next: tuple[float, float] = (0.0, 0.0)

    def _measure(self) -> None:
        """Measure the parameters' norm and the momentum buffer's (the running bounds' start)."""
        self._pnorm = _norm(self.params)
        if not np.isfinite(self._pnorm) and np.isfinite(self.params).all():
            self._pnorm = float(np.finfo(np.float64).max)  # finite but too large to square
        # the state a step's bound carries: a momentum buffer, Adam's first moment
        state = self.opt.state
        buf = state.get("momentum_buffer", state.get("exp_avg"))
        self._carry = _norm(buf) if buf is not None else 0.0

    def _error(self, what: str, value: object, **where: int) -> TrainingDiverged:
        """The error to raise, once the layer state of before the step is put back."""
        if self.state is not None and self._state_before is not None:
            self.state[...] = self._state_before
        return TrainingDiverged.describe(what, value, lr=self.opt.lr, **where)

    def _keep_state(self) -> None:
        """A step went through: its layer state is the one a later failure goes back to."""
        if self.state is not None and self._state_before is not None:
            np.copyto(self._state_before, self.state)

    def check_loss(self, loss: float, **where: int) -> None:
        """Raise when the batch's loss is not finite, the model put back as it was before
        the last step (the weights this loss was computed at came from that step)."""
        if not np.isfinite(loss):
            if self._snap is not None:
                self._snap.restore(self)
                self._snap = None
            raise self._error("loss", loss, **where)

    def before_step(self, **where: int) -> None:
        """Check the gradient; copy the parameters and optimizer state (what a failure of
        this step, or a non-finite loss at the next one, goes back to)."""
        gnorm = _norm(self.grads)
        if not np.isfinite(gnorm):
            if not np.isfinite(self.grads).all():
                raise self._error("gradient", "non-finite", **where)
            gnorm = float("inf")  # finite, but too large to square: risky
        if self._snap is None:
            self._snap = _Snapshot(self)
        else:
            self._snap.take(self)
        n = self.params.shape[0]
        bound, carry = self.opt.step_bound(gnorm, self._pnorm, n, self._carry)
        if self._pnorm + bound > SAFE_NORM:
            self._measure()  # the running bound may only have drifted upwards: measure it
            bound, carry = self.opt.step_bound(gnorm, self._pnorm, n, self._carry)
        self._risky = not (gnorm <= SAFE_NORM and self._pnorm + bound <= SAFE_NORM)
        self._next = (bound, carry)

    def after_step(self, **where: int) -> None:
        """After a risky step, check the parameters and the optimizer state; not finite: put
        back what the step started from and raise.  After a safe one, grow the bounds."""
        if not self._risky:
            bound, self._carry = self._next
            self._pnorm += bound
            self._keep_state()
            return
        bad = not np.isfinite(self.params).all() or not all(np.isfinite(v).all()
                                                            for v in self.opt.state.values())
        if bad:
            assert self._snap is not None
            self._snap.restore(self)
            self._snap = None
            raise self._error("parameters", "non-finite", **where)
        self._risky = False
        self._measure()
        self._keep_state()


class _Snapshot:
    """The parameters, optimizer state and step count, and the layer state, of a model as
    of before one step, kept in buffers reused from step to step."""

    def __init__(self, guard: StepGuard) -> None:
        self.params = guard.params.copy()
        self.opt: dict[str, np.ndarray] = {k: v.copy() for k, v in guard.opt.state.items()}
        self.t = guard.opt.t
        before = guard._state_before
        self.state = None if before is None else before.copy()

    def take(self, guard: StepGuard) -> None:
        """Copy the model as it is now (before a step) into the buffers."""
        np.copyto(self.params, guard.params)
        for key, value in guard.opt.state.items():
            kept = self.opt.get(key)
            if kept is not None and kept.shape == value.shape and kept.dtype == value.dtype:
                np.copyto(kept, value)
            else:  # created by the optimizer's first step
                self.opt[key] = value.copy()
        for key in [k for k in self.opt if k not in guard.opt.state]:
            del self.opt[key]
        self.t = guard.opt.t
        if self.state is not None and guard._state_before is not None:
            np.copyto(self.state, guard._state_before)

    def restore(self, guard: StepGuard) -> None:
        """Put the model back as it was when this copy was taken."""
        guard.params[...] = self.params
        opt = guard.opt
        for key in list(opt.state):
            if key in self.opt:
                opt.state[key][...] = self.opt[key]
            else:  # created by a step after the copy
                del opt.state[key]
        opt.t = self.t
        if self.state is not None and guard._state_before is not None:
            np.copyto(guard._state_before, self.state)  # _error puts it into the layers
        guard._measure()
