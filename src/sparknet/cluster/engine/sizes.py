"""What a value weighs on the wire: the one size function of the package.

:func:`nbytes` sizes what the engine ships (a Spark Connect query carries at most
:data:`~sparknet.cluster.engine.connect.MAX_CLOSURE_BYTES` in its function) and what the
model-parallel driver counts as sent, moved and collected
(:mod:`~sparknet.cluster.model_parallel.messages`).
"""
from __future__ import annotations

import dataclasses
from typing import Any

import numpy as np


def nbytes(value: Any) -> int:
    """Bytes of the payload in ``value``: numpy arrays, ``bytes`` and ``bytearray`` (their
    length) and ``memoryview`` s, found through nested tuples, lists, dict values and
    dataclass instances (the typed messages); anything else (numbers, strings, ``None``)
    counts 0.

    Args:
        value: what is sized.

    Returns:
        The sum of the sizes of the arrays and buffers ``value`` holds.
    """
    if isinstance(value, np.ndarray):
        return int(value.nbytes)
    if isinstance(value, (bytes, bytearray)):
        return len(value)
    if isinstance(value, memoryview):
        return int(value.nbytes)
    if isinstance(value, dict):
        return sum(nbytes(v) for v in value.values())
    if isinstance(value, (tuple, list)):
        return sum(nbytes(v) for v in value)
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        return sum(nbytes(getattr(value, f.name)) for f in dataclasses.fields(value))
    return 0
