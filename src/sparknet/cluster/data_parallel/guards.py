"""Divergence guards of data-parallel training: a NaN or infinite loss, gradient, delta,
layer state (running statistics) or parameter stops the fit with
:class:`sparknet.errors.TrainingDiverged` before it is applied, so the model keeps its last finite
weights and no checkpoint of the diverged state is written.

Each task checks its own result on the executor (:func:`scan`) and names itself in
:attr:`~sparknet.cluster.data_parallel.parameter_server.RoundResult.nonfinite`; the driver raises
from the summed result (:func:`check_result`) before applying it, and checks the parameters after
the step (:func:`check_params`), putting the previous ones back if the step itself overflowed.

A vector is finite exactly when its float64 sum is (no allocation: one pass): a float64
sum of float32 values cannot overflow, and float64 values whose sum overflows are
diverged anyway.
"""
from __future__ import annotations

import math
from typing import Any

import numpy as np

from sparknet.cluster.data_parallel.parameter_server import STATS, RoundResult
from sparknet.errors import TrainingDiverged


def is_finite(vec: np.ndarray | None) -> bool:
    """Whether every value of ``vec`` is finite (``None``: nothing to check)."""
    if vec is None or vec.size == 0:
        return True
    return math.isfinite(float(np.add.reduce(vec.reshape(-1), dtype=np.float64)))


def scan(index: int, res: RoundResult, vec_name: str) -> list[tuple[int, str]]:
    """Executor side: ``[(partition, what)]`` for a task result whose loss, vector
    (``vec_name``: ``"gradient"`` or ``"delta"``) or layer state is not finite."""
    bad = []
    loss = np.asarray(res.stats)[..., STATS.index("loss_sum")]
    if not np.isfinite(loss).all():
        bad.append((index, "loss"))
    if not is_finite(res.vec):
        bad.append((index, vec_name))
    if not is_finite(res.state):
        bad.append((index, "layer state"))
    return bad


def check_result(res: RoundResult, vec_name: str, lr: float | None = None, **where: Any) -> None:
    """Driver side: raise :class:`TrainingDiverged` when a task reported a non-finite
    result, or the summed loss or vector is not finite (``where``: epoch, round)."""
    if res.nonfinite:
        part, what = res.nonfinite[0]
        raise TrainingDiverged.describe(what, _value(res, what), lr=lr,
                                        **{**where, "partition": part})
    if not np.isfinite(np.asarray(res.stats)[..., STATS.index("loss_sum")]).all():
        raise TrainingDiverged.describe("loss", _value(res, "loss"), lr=lr, **where)
    if not is_finite(res.vec):
        raise TrainingDiverged.describe(vec_name, None, lr=lr, **where)
    if not is_finite(res.state):
        raise TrainingDiverged.describe("layer state", None, lr=lr, **where)


def check_params(params: np.ndarray, before: np.ndarray, lr: float | None = None,
                 **where: Any) -> None:
    """Driver side, after a step: when ``params`` are not finite, put ``before`` back
    into them and raise :class:`TrainingDiverged`."""
    if is_finite(params):
        return
    params[...] = before
    raise TrainingDiverged.describe("parameters", None, lr=lr, **where)


def _value(res: RoundResult, what: str) -> Any:
    if what == "loss":
        s = float(np.sum(np.asarray(res.stats)[..., STATS.index("loss_sum")]))
        return s if not math.isfinite(s) else None
    return None
