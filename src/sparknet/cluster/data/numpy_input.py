"""Numpy training data onto the executors: checked on the driver, split by a seeded
permutation, and shipped as one broadcast per partition.

A ``parallelize`` of the pieces would keep all the rows in the driver JVM's task
objects and serialise a partition's rows into each task that builds it: on a cluster
the driver JVM then needs several times the data (the task, its RPC message and their
buffers), and when it has less it dies of ``OutOfMemoryError`` in a scheduler thread
and the fit hangs.  Here each piece is a broadcast (held once, in 4 MiB blocks the
block manager may put on disk), read by the task of its own partition only: the source
of partition ``i`` is a one-element RDD whose function reads broadcast ``i``, and the
sources are united.  A shard rebuilt after an executor loss reads its piece again.
The driver's free heap is checked first (:func:`check_driver_memory`), with an error
saying what to change, never a hang.
"""
from __future__ import annotations

from typing import TYPE_CHECKING, Any, Iterable, Iterator

import numpy as np

from sparknet._validation import check_array, check_labels, refuse_pandas
from sparknet.cluster.data.shard_report import ShardReport

if TYPE_CHECKING:
    from pyspark import Broadcast, SparkContext

    from sparknet.cluster.resident.driver import Resident

#: Free heap the driver JVM keeps besides twice the largest piece.
HEAP_MARGIN = 64 << 20


class DriverMemoryError(MemoryError):
    """The driver JVM has too little free heap to ship numpy input to the executors."""


def split_indices(n: int, num_partitions: int, seed: int) -> list[np.ndarray]:
    """How numpy input is split: a seeded permutation of the ``n`` rows cut into
    ``num_partitions`` nearly equal, contiguous pieces (``np.array_split``); some pieces
    are empty when ``num_partitions > n``."""
    perm = np.random.default_rng([int(seed), 0x5A1D]).permutation(n)
    return np.array_split(perm, num_partitions)


def check_numpy(data: Any, y: Any, dtype: str, classification: bool, n_classes: int | None,
                sample_shape: tuple | None, what: str) -> tuple[np.ndarray, np.ndarray]:
    """Numpy input checked on the driver: ``(X flattened per row, labels or targets)``."""
    refuse_pandas(data, what)
    if y is None:
        raise ValueError(f"{what}: numpy input needs labels y (or pass a DataFrame / an RDD of (x, "
                         "y))")
    xname, yname = ("X", "y") if what == "training data" else ("X_val", "y_val")
    X = check_array(data, name=xname, dtype=dtype)
    if classification:
        Y = check_labels(y, X.shape[0], n_classes, name=yname)
    else:
        Y = check_array(y, name=yname, dtype=dtype)
        if Y.shape[0] != X.shape[0]:
            raise ValueError(f"X has {X.shape[0]} samples but {yname} has {Y.shape[0]}")
    if sample_shape is not None and int(np.prod(X.shape[1:])) != int(np.prod(sample_shape)):
        raise ValueError(f"{what}: {xname} has {int(np.prod(X.shape[1:]))} values per row, the "
                         f"model expects {int(np.prod(sample_shape))} (input_shape "
                         f"{tuple(sample_shape)})")
    return X.reshape(X.shape[0], -1), Y


def driver_heap(sc: SparkContext) -> tuple[int, int]:
    """``(max, free)`` bytes of the driver JVM's heap (free: not yet used of the max)."""
    jvm = sc._jvm
    assert jvm is not None  # a running context has its gateway
    rt = jvm.java.lang.Runtime.getRuntime()
    most = int(rt.maxMemory())
    return most, most - (int(rt.totalMemory()) - int(rt.freeMemory()))


def _mib(n: float) -> str:
    return f"{n / 2**20:,.0f} MiB"


def check_driver_memory(sc: SparkContext, piece_bytes: list[int],
                        what: str = "training data") -> None:
    """Raise :class:`DriverMemoryError` unless the driver JVM has free heap for the
    largest piece twice (its serialised form and its blocks) plus :data:`HEAP_MARGIN`.

    Raises:
        DriverMemoryError: with the sizes and what to change.
    """
    largest = max(piece_bytes, default=0)
    need = 2 * largest + HEAP_MARGIN
    most, free = driver_heap(sc)
    if free >= need:
        return
    setting = sc.getConf().get("spark.driver.memory", "1g (Spark's default)")
    raise DriverMemoryError(
        f"numpy {what}: the largest of its {len(piece_bytes)} pieces is {_mib(largest)} and goes "
        f"to the executors through the driver JVM, which needs about {_mib(need)} of free heap for "
        f"it but has {_mib(free)} free of {_mib(most)} (spark.driver.memory={setting}). Give the "
        "driver more memory (spark.driver.memory, set before its JVM starts: "
        f"get_spark(conf={{'spark.driver.memory': '4g'}}) or pyspark --driver-memory 4g), cut the "
        "data into more pieces (num_partitions), or pass a DataFrame or an RDD of (x, y) pairs, "
        "which the executors read themselves")


class _Piece:
    """The source of one partition: yields that partition's ``(x, y)`` from its broadcast."""

    def __init__(self, bc: Broadcast) -> None:
        self.bc = bc

    def __call__(self, it: Iterable) -> Iterator[tuple[np.ndarray, np.ndarray]]:
        for _ in it:
            pass
        yield self.bc.value


class _NumpyBuild:
    """Executor side: one pre-split numpy shard (already validated on the driver)."""

    def __call__(self, index: int, it: Iterator) -> tuple[dict, ShardReport]:
        items = list(it)
        if not items:
            return {"x": np.zeros((0, 0), np.float32), "y": np.zeros(0, np.int64)}, ShardReport()
        x, y = items[0]
        return {"x": x, "y": y}, ShardReport(rows=int(y.shape[0]),
                                             x_dim=int(x.shape[1]) if x.shape[0] else 0)


def from_numpy(sc: SparkContext, X: np.ndarray, Y: np.ndarray, num_partitions: int | None,
               seed: int, name: str, what: str = "training data") -> Resident:
    """The resident shards of checked numpy input (see the module docstring).

    Raises:
        DriverMemoryError: the driver JVM's free heap cannot take the largest piece.
    """
    from sparknet.cluster.resident.driver import Resident

    parts = int(num_partitions or sc.defaultParallelism)
    index = split_indices(X.shape[0], parts, seed)
    check_driver_memory(sc, [int(i.size) * (X.itemsize * int(np.prod(X.shape[1:])) + Y.itemsize *
                                            int(np.prod(Y.shape[1:]))) for i in index], what)
    broadcasts: list[Broadcast] = []
    try:
        for i in index:
            broadcasts.append(sc.broadcast((np.ascontiguousarray(X[i]),
                                            np.ascontiguousarray(Y[i]))))
        source = sc.union([sc.parallelize([0], 1).mapPartitions(_Piece(bc)) for bc in broadcasts])
        res = Resident(source, _NumpyBuild(), name=name, on_lost="rebuild")
    except BaseException:
        _destroy(broadcasts)
        raise
    res.on_close.append(lambda: _destroy(broadcasts))
    return res


def _destroy(broadcasts: list[Broadcast]) -> None:
    for bc in broadcasts:
        try:
            bc.destroy(blocking=False)
        except Exception:  # pragma: no cover - the context stopped
            pass
