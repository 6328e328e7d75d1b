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

A new direction moves the parameters ``lr (1 + mu)`` times its averaged delta at once
(``lr`` for heavy ball), a direction kept round after round ``lr / (1 - mu)`` times.
Left unset, ``momentum`` and ``lr`` are sized from ``P`` on the first step so that the
first is 1 (a round's news is taken at face value, as plain averaging does) and the
second is ``P`` (a steady direction goes as far as one process's ``P tau`` steps):
``mu = sqrt(1 - 1/P), lr = 1 / (1 + mu)`` with Nesterov, BMUF's ``mu = 1 - 1/P, lr = 1``
without.  ``P = 1`` gives ``momentum=0, lr=1``: plain averaging, bit for bit.

The step is :func:`sparknet.optim.sgd` on the outer gradient ``-delta`` (one place for
the maths), and its state goes into a checkpoint as every part's does
(:meth:`OuterOptimizer.state_dict`: the sizing, ``t`` and ``momentum_buffer``).
"""
from __future__ import annotations

import math
from typing import Any, Mapping

import numpy as np

from sparknet import optim as optim_mod


def sized_for(partitions: int, nesterov: bool = True) -> tuple[float, float]:
    """``(momentum, lr)`` moving a new direction 1x and a kept one ``partitions`` x its
    averaged delta: ``(sqrt(1 - 1/P), 1 / (1 + mu))`` (Nesterov) or ``(1 - 1/P, 1)``."""
    if partitions < 1:
        raise ValueError(f"partitions must be at least 1, got partitions={partitions!r}")
    if not nesterov:
        return 1.0 - 1.0 / partitions, 1.0
    mu = math.sqrt(1.0 - 1.0 / partitions)
    return mu, 1.0 / (1.0 + mu)


class OuterOptimizer:
    """Outer SGD with (Nesterov) momentum on the averaged round delta, run on the driver.

    Args:
        momentum: ``mu``, in ``[0, 1)`` (0: no momentum); ``None`` (default): sized from
            the partitions on the first step (:func:`sized_for`).
        lr: outer learning rate, positive (1: the averaged delta at full length);
            ``None`` (default): sized with ``momentum`` (``1 / (1 + momentum)`` with
            Nesterov, 1 without), on the first step when ``momentum`` is ``None`` too.
        nesterov: Nesterov momentum (default) or heavy ball; ignored when ``momentum`` is 0.

    Raises:
        ValueError: ``momentum`` outside ``[0, 1)``, ``lr`` not positive and finite.
    """

    name = "outer"

    def __init__(self, momentum: float | None = None, lr: float | None = None,
                 nesterov: bool = True) -> None:
        self.nesterov = bool(nesterov)
        self._sgd: optim_mod.SGD | None = None
        self.momentum: float | None = None if momentum is None else _real(momentum, "momentum")
        self.lr: float | None = None if lr is None else _real(lr, "lr")
        if self.momentum is not None and not 0.0 <= self.momentum < 1.0:
            raise ValueError("OuterOptimizer momentum must be in [0, 1), "
                             f"got momentum={momentum!r}")
        if self.lr is not None and not (self.lr > 0 and math.isfinite(self.lr)):
            raise ValueError(f"OuterOptimizer lr must be a positive finite number, got lr={lr!r}")
        if self.momentum is not None:
            self._size(self.momentum, self.lr)

    def _size(self, momentum: float, lr: float | None) -> None:
        if lr is None:
            lr = 1.0 / (1.0 + momentum) if self.nesterov else 1.0
        self.momentum, self.lr = momentum, lr
        self._sgd = optim_mod.SGD(lr=lr, momentum=momentum, nesterov=self.nesterov and momentum > 0)

    @property
    def sized(self) -> bool:
        """Whether ``momentum`` and ``lr`` are set (given, or sized by a first step)."""
        return self._sgd is not None

    @property
    def t(self) -> int:
        """Outer steps taken (rounds applied)."""
        return 0 if self._sgd is None else self._sgd.t

    @property
    def is_plain(self) -> bool:
        """Whether the step is plain averaging (``momentum=0, lr=1``)."""
        return self.momentum == 0.0 and self.lr == 1.0

    def state_keys(self) -> tuple[str, ...]:
        """Names of the state arrays (``("momentum_buffer",)`` with momentum)."""
        return () if self._sgd is None else self._sgd.state_keys()

    def step(self, params: np.ndarray, delta: np.ndarray, partitions: int | None = None) -> None:
        """Move flat ``params`` in place by the outer step on the round's averaged ``delta``
        (same length and dtype); ``partitions`` (the partitions averaged) sizes an unset
        ``momentum`` and ``lr`` on the first step."""
        if self._sgd is None:
            if partitions is None:
                raise ValueError("OuterOptimizer(momentum=None) is sized from the number of "
                                 "partitions: pass partitions= to its first step, or give momentum")
            mu, lr = sized_for(partitions, self.nesterov)
            self._size(mu, self.lr if self.lr is not None else lr)
        assert self._sgd is not None
        self._sgd.step(params, np.negative(delta))

    def reset(self) -> None:
        """Forget the momentum and the step count (a new run from other parameters)."""
        if self._sgd is not None:
            self._sgd.t = 0
            self._sgd.state = {}

    # -- state, for checkpoints ------------------------------------------
    def state_dict(self) -> dict[str, Any]:
        """The state for a checkpoint (:mod:`sparknet.stateful`): ``momentum`` and ``lr`` as
        sized (``None`` before a first step sized them), the step count ``t`` and the
        ``momentum_buffer`` (copies)."""
        out: dict[str, Any] = {"momentum": self.momentum, "lr": self.lr, "t": self.t}
        if self._sgd is not None:
            out.update({k: np.array(v, copy=True) for k, v in self._sgd.state.items()})
        return out

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        """Take back what :meth:`state_dict` gave: sized as the saved optimizer was, its
        momentum and step count put back (an unsized state leaves this optimizer as it is)."""
        if state.get("momentum") is None:
            return
        lr = state.get("lr")
        self._size(_real(state["momentum"], "momentum"), None if lr is None else _real(lr, "lr"))
        assert self._sgd is not None
        self._sgd.load_state_dict({k: v for k, v in state.items() if k not in ("momentum", "lr")})

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


def resolve_outer(outer: "OuterOptimizer | str | None", *, mode: str, sync: str,
                  local_steps: "int | str" = "auto") -> OuterOptimizer | None:
    """The outer optimizer of a trainer: ``None`` or ``"none"`` (plain averaging),
    ``"nesterov"`` (:class:`OuterOptimizer`, sized from the partitions), an instance, or
    ``"auto"``: sized Nesterov when the trainer sizes the rounds too (synchronous
    average mode, ``local_steps="auto"`` or ``"timed"``: the fastest time to accuracy measured, see
    ``benchmarks/README.md``), else plain averaging (a given ``local_steps`` runs the
    documented schedule of :mod:`sparknet.cluster.data_parallel.trainer` exactly).

    Raises:
        ValueError: an unknown value, or an outer optimizer where no averaged delta is
            applied by the driver (``mode="async"`` or ``sync="gradient"``).
    """
    averaged = mode == "sync" and sync == "average"
    if isinstance(outer, str) and outer.lower() == "auto":
        return OuterOptimizer() if averaged and local_steps in ("auto", "timed") else None
    if outer is None or (isinstance(outer, str) and outer.lower() == "none"):
        return None
    if isinstance(outer, str) and outer.lower() == "nesterov":
        outer = OuterOptimizer()
    if not isinstance(outer, OuterOptimizer):
        raise ValueError(f"outer must be 'auto', None, 'none', 'nesterov' or an OuterOptimizer, "
                         f"got outer={outer!r}")
    if not averaged:
        raise ValueError(f"outer={outer!r} needs mode='sync' and sync='average' (got "
                         f"mode={mode!r}, sync={sync!r}); pass outer=None")
    return outer
