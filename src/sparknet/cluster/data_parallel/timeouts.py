"""How long a data-parallel job may run: ``round_timeout`` checked, and turned into
seconds for one job (:func:`job_timeout`)."""
from __future__ import annotations

import math
from typing import Any

import numpy as np

#: Seconds below which an ``"auto"`` round timeout never goes: the first rounds of a fit
#: include the executors' worker start and model build, and a shared cluster stalls.
ROUND_TIMEOUT_FLOOR = 120.0
#: An ``"auto"`` timeout is this many times the slowest job of its kind measured so far.
ROUND_TIMEOUT_FACTOR = 20.0



def check_round_timeout(value: Any) -> "float | str | None":
    """``round_timeout`` validated: ``"auto"``, ``None`` or positive finite seconds."""
    if value is None or (isinstance(value, str) and value == "auto"):
        return value
    if isinstance(value, (int, float, np.integer, np.floating)) and not isinstance(value, bool):
        if math.isfinite(float(value)) and float(value) > 0:
            return float(value)
    raise ValueError(f"round_timeout must be 'auto', None or a positive number of seconds, "
                     f"got round_timeout={value!r}")


def job_timeout(setting: "float | str | None", slowest: float | None,
                predicted: float | None = None) -> float | None:
    """Seconds one job may run: ``setting`` when it is a number, ``None`` for ``None``;
    for ``"auto"`` ``max(ROUND_TIMEOUT_FLOOR, ROUND_TIMEOUT_FACTOR x slowest)`` with
    ``slowest`` the slowest job of its kind measured so far (or its ``predicted`` time
    before one was measured)."""
    if setting is None or isinstance(setting, (int, float)):
        return None if setting is None else float(setting)
    base = slowest if slowest is not None else predicted
    return max(ROUND_TIMEOUT_FLOOR, ROUND_TIMEOUT_FACTOR * (base or 0.0))
