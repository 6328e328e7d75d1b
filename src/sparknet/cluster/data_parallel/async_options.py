"""The options of ``mode="async"`` (:class:`AsyncOptions`) and their checks
(:func:`check_options`), run when the trainer is built, before any Spark job: the rounds
themselves are in :mod:`sparknet.cluster.data_parallel.async_mode`."""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Callable

import numpy as np

if TYPE_CHECKING:
    from sparknet.cluster.data_parallel.trainer import DataParallelTrainer

_STALE = ("reject", "downweight")


@dataclass
class AsyncOptions:
    """Validated options of ``mode="async"`` (passed as keyword arguments of
    :class:`~sparknet.cluster.data_parallel.trainer.DataParallelTrainer`).

    Attributes:
        max_staleness: the staleness bound (``None``: ``2 * num_partitions``).
        stale: ``"reject"`` or ``"downweight"`` deltas past the bound.
        on_update: called on the driver after every arriving delta with a dict
            (``update`` = applied updates so far, ``partition``, ``staleness``,
            ``weight``, ``applied``, ``rows``, ``loss``, ``epoch``, ``time``,
            ``held``); raising
            ``KeyboardInterrupt`` from it interrupts the fit like Ctrl-C.
        delta_weight: weight of an on-time delta; ``None`` (default) is
            ``1 / num_partitions``, so that one delta from each partition moves the
            parameters as far as one synchronous averaged round.  ``1.0`` applies every
            delta in full (DistBelief's Downpour); with RMSprop's normalised steps that
            multiplies the effective learning rate by the number of partitions (on
            MNIST, 2 partitions: 95.5% test accuracy after 4 epochs against 97.7%).
        coalesce: when another partition's round is due within this fraction of a
            partition's own round time, that partition's relaunch waits for it, so
            both restart from the same parameters (see *Coalescing* in
            :mod:`~sparknet.cluster.data_parallel.async_mode`); ``0`` relaunches at once.  A
            fraction in [0, 1]; default 0.15.
    """

    max_staleness: int | None = None
    stale: str = "reject"
    on_update: Callable[[dict], Any] | None = None
    delta_weight: float | None = None
    coalesce: float = 0.15


def check_options(trainer: DataParallelTrainer, max_staleness: int | None = None,
                  stale: str = "reject", on_update: Callable[[dict], Any] | None = None,
                  delta_weight: float | None = None, coalesce: float = 0.15) -> AsyncOptions:
    """Validate the ``mode="async"`` keyword arguments of the trainer."""
    if max_staleness is not None and (isinstance(max_staleness, bool) or
                                      not isinstance(max_staleness, (int, np.integer)) or
                                      max_staleness < 0):
        raise ValueError("max_staleness must be a non-negative integer or None, got "
                         f"{max_staleness!r}")
    if stale not in _STALE:
        raise ValueError(f"stale must be 'reject' or 'downweight', got {stale!r}")
    if on_update is not None and not callable(on_update):
        raise ValueError(f"on_update must be callable, got {type(on_update).__name__}")
    w = None if delta_weight is None else float(delta_weight)
    if w is not None and not (math.isfinite(w) and w > 0):
        raise ValueError(f"delta_weight must be a positive number or None, got {delta_weight!r}")
    try:
        c = float(coalesce)
    except (TypeError, ValueError):
        c = math.nan
    if isinstance(coalesce, bool) or not (math.isfinite(c) and 0.0 <= c <= 1.0):
        raise ValueError(f"coalesce must be a fraction in [0, 1], got {coalesce!r}")
    if trainer.sync != "average":
        raise ValueError(f"mode='async' runs local steps then pushes deltas; it needs "
                         f"sync='average', got sync={trainer.sync!r}")
    return AsyncOptions(None if max_staleness is None else int(max_staleness), stale, on_update, w,
                        c)
