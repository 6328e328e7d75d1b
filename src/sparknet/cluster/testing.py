"""Fault injection for tests and benchmarks of data-parallel training.

No production module imports this one.  It enters through the documented hook
:func:`sparknet.cluster.data_parallel.round_task.set_task_wrapper`: inside :func:`inject_faults`,
every training task a driver builds is wrapped by a :class:`FaultyTask`, which is pickled by
reference to this module, so the executors run the same code.

To act at a chosen round on the driver (interrupt a fit, kill the driver, kill a worker),
tests pass a callback, as users do: ``on_round_end`` runs after every round and its
checkpoint, with ``logs["rounds_done"]`` (:class:`sparknet.callbacks.Callback`).

Example::

    from sparknet.cluster.testing import inject_faults
    with inject_faults(slow={1: 1.0}):       # partition 1 at half speed
        trainer.fit(X, y, epochs=2)
"""
from __future__ import annotations

import contextlib
import math
import threading
import time
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Iterator

from sparknet.cluster.data_parallel import round_task as rounds
from sparknet.cluster.data_parallel.parameter_server import RoundResult

if TYPE_CHECKING:
    from sparknet.cluster.resident.driver import Shard

_LOCK = threading.Lock()


@dataclass
class FaultyTask:
    """A training task with faults: ``fail`` raises, ``hang`` never returns, ``slow`` and
    ``delay`` sleep after it (see :func:`inject_faults`)."""

    task: rounds.RoundTask
    slow: dict[int, float] = field(default_factory=dict)
    delay: dict[int, float] = field(default_factory=dict)
    fail: dict[int, str] = field(default_factory=dict)
    hang: frozenset[int] = frozenset()

    def __call__(self, index: int, shard: "Shard") -> list[RoundResult]:
        if index in self.fail:
            raise RuntimeError(self.fail[index])
        while index in self.hang:  # a task that never returns (until Spark kills its worker)
            time.sleep(1.0)
        t0 = time.perf_counter()
        out = self.task(index, shard)
        if index in self.slow or index in self.delay:
            spent = time.perf_counter() - t0
            extra = self.slow.get(index, 0.0) * spent + self.delay.get(index, 0.0)
            time.sleep(extra)
            for r in out:  # the sleep is the slow machine's compute
                r.times = [t + extra for t in r.times]
        return out


@dataclass
class _Faults:
    """The wrapper installed by :func:`inject_faults`: training tasks get the faults,
    evaluation passes through untouched."""

    slow: dict[int, float]
    delay: dict[int, float]
    fail: dict[int, str]
    hang: frozenset[int] = frozenset()
    after: int = 0
    built: int = 0

    def __call__(self, task: rounds.RoundTask) -> "rounds.RoundTask | FaultyTask":
        if not task.kind.trains:
            return task
        self.built += 1
        hang = self.hang if self.built > self.after else frozenset()
        return FaultyTask(task, dict(self.slow), dict(self.delay), dict(self.fail), hang)


@contextlib.contextmanager
def inject_faults(slow: dict[int, float] | None = None, delay: dict[int, float] | None = None,
                  fail: "dict[int, str] | list[int] | tuple[int, ...] | None" = None,
                  hang: "list[int] | tuple[int, ...] | None" = None,
                  hang_after: int = 0) -> Iterator[None]:
    """Inject a straggler or a failing task into data-parallel training (tests and
    benchmarks only).

    Inside the ``with`` block, the training tasks of every
    :class:`~sparknet.cluster.data_parallel.trainer.DataParallelTrainer` fit (synchronous and
    asynchronous; evaluation is untouched) built on this
    driver are wrapped so that:

    * for ``slow={p: factor}``, partition ``p`` sleeps ``factor`` times its own compute
      time after each training round (``factor=1.0``: the partition runs at half speed,
      as a busy or older machine would); the sleep counts as its compute time;
    * for ``delay={p: seconds}``, partition ``p`` sleeps that many seconds after each
      training round (a fixed slowdown, for tests that need a round to last long);
    * for ``fail={p: message}`` (or a list of partitions), partition ``p``'s training
      task raises ``RuntimeError(message)``;
    * for ``hang=[p, ...]``, partition ``p``'s training tasks never return (they sleep
      until Spark kills their worker), from the ``hang_after + 1``-th training task
      the driver builds on (so that rounds before it are measured).

    It installs a task wrapper with
    :func:`sparknet.cluster.data_parallel.round_task.set_task_wrapper` for the duration of the block
    (the previous wrapper comes back after it), so do not run other fits concurrently in the
    process.

    Args:
        slow: partition -> slowdown factor (>= 0).
        delay: partition -> extra seconds per training round (>= 0).
        fail: partitions whose training task raises, or partition -> message.
        hang: partitions whose training tasks never return.
        hang_after: training tasks built before the hanging ones start.

    Raises:
        ValueError: negative partition, factor or delay.
    """
    faults = _Faults({int(k): float(v) for k, v in (slow or {}).items()},
                     {int(k): float(v) for k, v in (delay or {}).items()}, _fail_messages(fail),
                     frozenset(int(p) for p in (hang or ())), int(hang_after))
    for what, d in (("slow", faults.slow), ("delay", faults.delay)):
        for k, v in d.items():
            if k < 0 or not (v >= 0 and math.isfinite(v)):
                raise ValueError(f"{what}: partition {k} value {v} (need partition >= 0 and a "
                                 f"finite value >= 0)")
    for what, keys in (("fail", faults.fail), ("hang", faults.hang)):
        for k in keys:
            if k < 0:
                raise ValueError(f"{what}: partition {k} must be >= 0")
    with _LOCK:
        previous = rounds.set_task_wrapper(faults)
    try:
        yield
    finally:
        with _LOCK:
            rounds.set_task_wrapper(previous)


def _fail_messages(fail: "dict[int, str] | list[int] | tuple[int, ...] | None") -> dict[int, str]:
    if isinstance(fail, (list, tuple)):
        return {int(p): f"injected failure in partition {int(p)} "
                        "(sparknet.cluster.testing.inject_faults)"
                for p in fail}
    return {int(k): str(v) for k, v in (fail or {}).items()}
