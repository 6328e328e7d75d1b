"""The outer optimizer of ``sync="average"``: a step on each round's averaged delta.

In averaged rounds every partition runs ``tau`` local optimizer steps from the same
parameters, and the driver averages the partitions' deltas ``delta``.  Plain averaging
adds ``delta`` to the parameters.  With ``P`` partitions the average moves about as far
as *one* partition's ``tau`` steps, while one process would have taken all ``P tau``
steps in the same epoch: averaged rounds learn less per epoch.  Treating ``-delta`` as
the gradient of an outer SGD step with momentum (block momentum, BMUF; Nesterov
momentum as in DiLoCo) carries the rounds' common direction forward:

    v = mu v + delta
    params += lr (mu v + delta)      (Nesterov, default)
    params += lr v                   (nesterov=False: heavy ball, BMUF's form)

In a steady direction a round moves ``lr / (1 - mu)`` times its averaged delta, so
``mu = 1 - 1/P`` makes up for the ``P``-fold shorter path.  ``momentum=0, lr=1`` is
plain averaging, bit for bit.

The step is :func:`sparknet.optim.sgd` on the outer gradient ``-delta`` (one place for
the maths), and the state is serialised the way every optimizer's is
(:meth:`OuterOptimizer.state_arrays`: ``outer_t`` and ``outer_momentum_buffer``, flat
arrays for a checkpoint).
"""
from __future__ import annotations

import math
from typing import Any, Mapping

import numpy as np

from sparknet import optim as optim_mod


class OuterOptimizer:
    """Outer SGD with (Nesterov) momentum on the averaged round delta, run on the driver.

    Args:
        momentum: ``mu``, in ``[0, 1)`` (0: no momentum).
        lr: outer learning rate, positive (1: the averaged delta at full length).
        nesterov: Nesterov momentum (default) or heavy ball; ignored when ``momentum`` is 0.

    Raises:
        ValueError: ``momentum`` outside ``[0, 1)``, ``lr`` not positive and finite.
    """

    name = "outer"

    def __init__(self, momentum: float = 0.5, lr: float = 1.0, nesterov: bool = True) -> None:
        mu, rate = _real(momentum, "momentum"), _real(lr, "lr")
        if not 0.0 <= mu < 1.0:
            raise ValueError(f"OuterOptimizer momentum must be in [0, 1), got momentum={momentum!r}")
        if not (rate > 0 and math.isfinite(rate)):
            raise ValueError(f"OuterOptimizer lr must be a positive finite number, got lr={lr!r}")
        self.momentum, self.lr, self.nesterov = mu, rate, bool(nesterov)
        self._sgd = optim_mod.SGD(lr=rate, momentum=mu, nesterov=self.nesterov and mu > 0)

    @property
    def t(self) -> int:
        """Outer steps taken (rounds applied)."""
        return self._sgd.t

    @property
    def is_plain(self) -> bool:
        """Whether the step is plain averaging (``momentum=0, lr=1``)."""
        return self.momentum == 0.0 and self.lr == 1.0

    def state_keys(self) -> tuple[str, ...]:
        """Names of the state arrays (``("momentum_buffer",)`` with momentum)."""
        return self._sgd.state_keys()

    def step(self, params: np.ndarray, delta: np.ndarray) -> None:
        """Move flat ``params`` in place by the outer step on the round's averaged ``delta``
        (same length and dtype)."""
        self._sgd.step(params, np.negative(delta))

    def reset(self) -> None:
        """Forget the momentum and the step count (a new run from other parameters)."""
        self._sgd.t = 0
        self._sgd.state = {}

    # -- state, for checkpoints ------------------------------------------
    def state_arrays(self, prefix: str = "outer_") -> dict[str, np.ndarray]:
        """The state as named arrays (copies): ``<prefix>t`` (int64, shape (1,)) and
        ``<prefix>momentum_buffer`` (holding ``-v``, SGD's buffer of the outer gradient)."""
        return self._sgd.state_arrays(prefix)

    def load_state_arrays(self, arrays: Mapping[str, np.ndarray], prefix: str = "outer_",
                          copy: bool = True) -> None:
        """Read state written by :meth:`state_arrays` (``copy=False`` binds to the arrays)."""
        self._sgd.load_state_arrays(arrays, prefix, copy=copy)

    def get_config(self) -> dict[str, Any]:
        return {"momentum": self.momentum, "lr": self.lr, "nesterov": self.nesterov}

    @classmethod
    def from_config(cls, config: Mapping[str, Any]) -> OuterOptimizer:
        return cls(**config)

    def __repr__(self) -> str:
        return f"OuterOptimizer({', '.join(f'{k}={v!r}' for k, v in self.get_config().items())})"


def _real(value: Any, what: str) -> float:
    """``value`` as a float, or ``ValueError`` naming ``what`` (bools and strings refused)."""
    if isinstance(value, bool) or not isinstance(value, (int, float, np.integer, np.floating)):
        raise ValueError(f"OuterOptimizer {what} must be a number, got {what}={value!r}")
    return float(value)


#: The outer optimizer of ``outer="auto"`` in synchronous average mode (``None``: plain
#: averaging); chosen by the measurements in ``benchmarks/README.md`` (time to accuracy).
DEFAULT_OUTER: dict[str, Any] | None = None


def resolve_outer(outer: "OuterOptimizer | str | None", *, mode: str, sync: str) -> OuterOptimizer | None:
    """The outer optimizer of a trainer: ``None`` or ``"none"`` (plain averaging),
    ``"nesterov"`` (:class:`OuterOptimizer` with its defaults), an instance, or
    ``"auto"``: :data:`DEFAULT_OUTER` in synchronous average mode, none otherwise.

    Raises:
        ValueError: an unknown value, or an outer optimizer where no averaged delta is
            applied by the driver (``mode="async"`` or ``sync="gradient"``).
    """
    plain = outer is None or (isinstance(outer, str) and outer.lower() == "none")
    averaged = mode == "sync" and sync == "average"
    if isinstance(outer, str) and outer.lower() == "auto":
        return OuterOptimizer(**DEFAULT_OUTER) if averaged and DEFAULT_OUTER is not None else None
    if plain:
        return None
    if isinstance(outer, str) and outer.lower() == "nesterov":
        outer = OuterOptimizer()
    if not isinstance(outer, OuterOptimizer):
        raise ValueError(f"outer must be 'auto', None, 'none', 'nesterov' or an OuterOptimizer, "
                         f"got outer={outer!r}")
    if not averaged:
        raise ValueError(f"outer={outer!r} needs mode='sync' and sync='average' (got mode={mode!r}, "
                         f"sync={sync!r}); pass outer=None")
    return outer
