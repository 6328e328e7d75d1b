"""The parameter server: the driver holds the flat parameter buffer, sends it out as one
``Broadcast`` per round, and sums what the partitions send back.

Each round's tasks return a :class:`RoundResult` (a flat vector -- a gradient sum or a
weighted weight delta -- plus a few float64 statistics and each task's compute time).
Two ways bring them back, chosen by ``reduce``:

* ``"tree"`` (default): ``RDD.treeAggregate`` -- each task's result is serialised
  once as its task result and the driver (or a shuffle level, for many partitions)
  adds them;
* ``"accumulator"``: a numpy ``AccumulatorParam`` filled by ``foreach``.

Both give the same sum.  ``benchmarks/bench_data_parallel.py --primitives`` measures
them on this machine; ``treeAggregate`` came out faster for parameter-sized vectors
(the numbers are in that benchmark's output and the package's benchmark notes), which
is why it is the default.  The broadcast of the previous round is unpersisted as soon
as a new one is made (it is stale), and destroyed when the server closes.
"""
from __future__ import annotations

import logging
import threading
import time
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import numpy as np

from sparknet import precision as precision_mod
from sparknet.cluster.data_parallel.layer_state import merge, shipped
from sparknet.cluster.data_parallel.wire import decode, is_encoded
from sparknet.cluster.engine.base import Engine, Shipped, engine_for

if TYPE_CHECKING:
    from pyspark import SparkContext

log = logging.getLogger(__name__)

#: Order of :attr:`RoundResult.stats`.
STATS = ("loss_sum", "weight_sum", "correct", "samples", "steps")


def stat_totals(stats: np.ndarray) -> dict[str, float]:
    """The statistics of :data:`STATS` by name, each summed over every row (every epoch of a
    round spanning several)."""
    return dict(zip(STATS, np.atleast_2d(stats).sum(axis=0).tolist()))


@dataclass
class RoundResult:
    """What one task (or a sum of tasks) sends back from a round.

    Attributes:
        vec: flat vector in the model's dtype, or ``None`` when the task had no rows.
        stats: float64 array, see :data:`STATS`; for a round spanning several epochs,
            one row per epoch (shape ``(epochs, len(STATS))``).
        times: compute seconds of each task (inside the task, excluding Spark's costs).
        nonfinite: ``(partition, what)`` of every task whose loss or vector was NaN or
            infinite (``what``: ``"loss"``, ``"gradient"``, ``"delta"``; see
            :mod:`sparknet.cluster.data_parallel.guards`).
        states: partition -> its resident optimizer state after the round (``{name:
            array}``), when the round was asked for it (a checkpoint follows it).
        state: the row-weighted mean of the training tasks' layer states after the round
            (BatchNormalization's running statistics;
            :mod:`sparknet.cluster.data_parallel.layer_state`), or ``None`` when the model
            keeps none.
        state_rows: the rows that mean is weighted by.
        wire_bytes: bytes of the vectors the training tasks sent back (halved with
            ``wire="bf16"``: :mod:`sparknet.cluster.data_parallel.wire`).
        fallback: some task was asked for ``precision="bf16"`` and ran its products in
            float32 (no bfloat16 kernel on its executor).
    """

    vec: np.ndarray | None = None
    stats: np.ndarray = field(default_factory=lambda: np.zeros(len(STATS)))
    times: list[float] = field(default_factory=list)
    nonfinite: list[tuple[int, str]] = field(default_factory=list)
    states: dict[int, dict[str, np.ndarray]] = field(default_factory=dict)
    state: np.ndarray | None = None
    state_rows: float = 0.0
    wire_bytes: int = 0
    fallback: bool = False

    def add(self, other: "RoundResult | None") -> "RoundResult":
        """In-place sum (vectors and statistics add, times concatenate); returns self."""
        if other is None:
            return self
        if other.vec is not None:
            if self.vec is None:  # kept as sent: a task's own result leaves it encoded
                self.vec = np.array(other.vec, copy=True)
            elif is_encoded(self.vec):  # the sum is float32
                self.vec = decode(self.vec) + decode(other.vec)
            else:
                self.vec += decode(other.vec)
        self.wire_bytes += other.wire_bytes
        self.fallback = self.fallback or other.fallback
        self.stats = self.stats + other.stats
        self.times = self.times + list(other.times)
        self.nonfinite = self.nonfinite + list(other.nonfinite)
        if other.states:
            self.states = {**self.states, **other.states}
        self.state, self.state_rows = merge(self.state, self.state_rows, other.state,
                                            other.state_rows)
        return self

    def stat(self, name: str) -> float:
        """A statistic summed over everything (all epochs of a multi-epoch round)."""
        return float(np.sum(self.stats[..., STATS.index(name)]))


class ParameterServer:
    """The driver-side parameter server of a fit.

    Args:
        spark: the ``SparkContext``, or the fit's :class:`~sparknet.cluster.engine.base.Engine`
            (a Spark Connect session sends the parameters inside each round's query).
        params: the flat parameter buffer (the model's ``params``; read, not copied, at
            each :meth:`broadcast`).
        state: the model's flat layer state (``state``), sent after the parameters
            (:func:`sparknet.cluster.data_parallel.layer_state.shipped`); ``None``: none.
        reduce: ``"tree"`` (``treeAggregate``, default) or ``"accumulator"``.
        tree_depth: depth of ``treeAggregate``.

    Attributes:
        bytes_out: bytes of the parameters (and layer state) broadcast so far.
        bytes_in: bytes of the vectors the training tasks sent back so far (each task's
            delta or gradient as it crossed the network: half with ``wire="bf16"``).
        fell_back: whether a task asked for ``precision="bf16"`` ran in float32.

    Raises:
        ValueError: unknown ``reduce``.
    """

    def __init__(self, spark: "SparkContext | Engine", params: np.ndarray, reduce: str = "tree",
                 tree_depth: int = 2, state: np.ndarray | None = None) -> None:
        if reduce not in ("tree", "accumulator"):
            raise ValueError(f"reduce must be 'tree' or 'accumulator', got {reduce!r}")
        self.engine = engine_for(spark)
        self.params, self.reduce, self.tree_depth = params, reduce, int(tree_depth)
        self.state = np.zeros(0, dtype=params.dtype) if state is None else state
        self._bc: Shipped | None = None
        self.bytes_out = 0
        self.bytes_in = 0
        self.fell_back = False
        self._lock = threading.Lock()

    def broadcast(self) -> Shipped:
        """A ``Broadcast`` of the current parameters and layer state (under Spark Connect,
        the value the round's query carries); the previous one is unpersisted."""
        self._drop(destroy=False)
        vec = shipped(self.params, self.state)
        bc = self._bc = self.engine.ship(vec)
        self.bytes_out += int(vec.nbytes)
        return bc

    def gather(self, rdd: Any) -> RoundResult:
        """Sum the :class:`RoundResult` s of ``rdd`` (one per task; a resident state's
        ``mapPartitions``) with the chosen primitive."""
        total = self.engine.gather(rdd, RoundResult, RoundResult.add, self.reduce, self.tree_depth)
        return self.received(total)

    def received(self, res: RoundResult) -> RoundResult:
        """``res`` (a round's sum, or one asynchronous task's result) as the driver uses it:
        its vector float32 (:func:`~sparknet.cluster.data_parallel.wire.decode`), its bytes
        counted in :attr:`bytes_in`, and the fit's one warning when a task ran ``"bf16"`` in
        float32 (:func:`sparknet.precision.warn_executor_fallback`)."""
        res.vec = None if res.vec is None else decode(res.vec)
        with self._lock:
            self.bytes_in += int(res.wire_bytes)
            warn = res.fallback and not self.fell_back
            self.fell_back = self.fell_back or res.fallback
        if warn:
            precision_mod.warn_executor_fallback()
        return res

    def _drop(self, destroy: bool) -> None:
        if self._bc is not None:
            try:
                (self._bc.destroy if destroy else self._bc.unpersist)()
            except Exception as exc:  # pragma: no cover - context already stopped
                log.debug("broadcast cleanup failed: %s", exc)
            self._bc = None

    def close(self) -> None:
        """Destroy the last broadcast."""
        self._drop(destroy=True)


def measure_primitives(sc: SparkContext, n_params: int, partitions: int, repeats: int = 5,
                       dtype: Any = np.float32) -> dict[str, float]:
    """Median seconds of a round that broadcasts ``n_params`` values and brings one
    ``n_params`` vector back from each of ``partitions`` tasks, with each primitive.

    Returns:
        ``{"tree": s, "accumulator": s}``.
    """
    params = np.ones(n_params, dtype=dtype)
    out = {}
    for reduce in ("tree", "accumulator"):
        ps = ParameterServer(sc, params, reduce=reduce)
        times = []
        for _ in range(repeats + 1):
            t0 = time.perf_counter()
            bc = ps.broadcast()
            rdd = sc.parallelize(range(partitions), partitions).map(_Echo(bc))
            r = ps.gather(rdd)
            times.append(time.perf_counter() - t0)
            assert r.vec is not None and float(r.vec[0]) == partitions
        ps.close()
        out[reduce] = float(np.median(times[1:]))
    return out


class _Echo:
    def __init__(self, bc: Any) -> None:
        self.bc = bc

    def __call__(self, _: Any) -> RoundResult:
        return RoundResult(np.array(self.bc.value, copy=True), np.zeros(len(STATS)), [0.0])
