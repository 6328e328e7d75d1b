"""The seam between the trainers and Spark: what a fit asks of a session.

A data-parallel fit needs few things from Spark: the session's settings, a description
on its jobs, a value every task of the next round reads (the parameters), resident
shards built from a DataFrame, one job per round over them summed on the driver, and
cancelling a fit's jobs.  :class:`Engine` names them; two implementations stand behind
it, chosen from the session's type by :func:`engine_for`:

* :class:`ClassicEngine` (this module): a session with a ``SparkContext`` on the
  driver.  Parameters go out as one ``Broadcast`` per round, rounds are RDD jobs over
  the anchor of :class:`~sparknet.cluster.resident.driver.Resident`, summed by
  ``treeAggregate`` (:class:`~sparknet.cluster.data_parallel.parameter_server.ParameterServer`).
* :class:`~sparknet.cluster.engine.connect.ConnectEngine`: a Spark Connect session
  (``SparkSession.builder.remote(...)``; Databricks serverless and shared clusters),
  which has no ``SparkContext``, RDD, broadcast or accumulator.  Resident shards are
  anchored on a checkpointed DataFrame with one row per partition, rounds are
  ``mapInArrow`` queries over it carrying the parameters in the query's function and
  bringing each task's result back as one Arrow binary row.

The round logic, the shards' executor side (:mod:`sparknet.cluster.resident.shards`), the
optimizer state and the checks are the same under both.
"""
from __future__ import annotations

import threading
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Callable, Generic, Protocol, TypeVar

from pyspark.accumulators import AccumulatorParam

if TYPE_CHECKING:
    from pyspark import Accumulator, SparkContext
    from pyspark.sql import DataFrame, SparkSession

#: what a round's tasks send back (the parameter server's
#: :class:`~sparknet.cluster.data_parallel.parameter_server.RoundResult`)
T = TypeVar("T")


class Shipped(Protocol):
    """A value sent to every task of the jobs that follow (read as ``.value`` there)."""

    @property
    def value(self) -> Any: ...

    def unpersist(self) -> None: ...

    def destroy(self, blocking: bool = False) -> None: ...


@dataclass(frozen=True)
class HadoopPath:
    """A path on the Hadoop ``FileSystem`` that holds it, reached from the driver through
    Py4J (:meth:`Engine.filesystem`).

    Attributes:
        jvm: the driver's JVM view (``jvm.org.apache.hadoop.fs.Path`` makes more paths).
        fs: the ``org.apache.hadoop.fs.FileSystem`` of the path.
        path: the path, qualified (scheme and authority) by ``fs``.
    """

    jvm: Any
    fs: Any
    path: Any


class Engine(Protocol):
    """What a fit asks of its Spark session (see the module docstring).

    Attributes:
        kind: ``"classic"`` or ``"connect"``.
    """

    kind: str

    @property
    def app_id(self) -> str:
        """The application's id (resident folders are named after it)."""
        ...

    @property
    def sc(self) -> "SparkContext | None":
        """The driver's ``SparkContext`` (Classic), or ``None`` where there is none (a Spark
        Connect client): what needs one (broadcasts, the executors' list, probes) asks here."""
        ...

    def default_parallelism(self) -> int:
        """Partitions of numpy input when none are asked for."""
        ...

    def num_partitions(self, df: "DataFrame") -> int | None:
        """``df``'s partitions, or ``None`` when they are known only once it runs (Connect)."""
        ...

    def thread(self, target: Callable[..., Any], name: str,
               args: tuple = ()) -> threading.Thread:
        """A daemon thread (not started) that submits jobs on the driver: Classic's carries
        the JVM thread's properties (``InheritableThread``: job group, description);
        Connect's queries carry their own thread's tags."""
        ...

    def conf(self, key: str, default: str | None = None) -> str | None:
        """A Spark setting of the session, or ``default``."""
        ...

    def describe(self, text: str | None) -> None:
        """The description the next jobs carry in Spark's UI (``None`` clears it)."""
        ...

    def ship(self, value: Any) -> Shipped:
        """``value`` for every task of the next jobs."""
        ...

    def ship_to_udf(self, value: Any) -> Shipped:
        """``value`` for the tasks of the queries whose UDF holds the returned object (a
        Model's scoring): a broadcast on Classic; under Spark Connect the value itself, inside
        the UDF (a UDF's query is not joined with pieces as a resident job's is).

        Raises:
            ValueError: under Spark Connect, ``value`` is past what a query's function carries.
        """
        ...

    def filesystem(self, path: str) -> HadoopPath | None:
        """``path`` on its Hadoop ``FileSystem`` as the driver reaches it, or ``None`` where
        this client reaches none (a Spark Connect client: the paths are the server's)."""
        ...

    def gather(self, job: Any, zero: Callable[[], T], add: Callable[[T, T], T], reduce: str,
               depth: int) -> T:
        """The sum of the results of ``job``'s tasks (a resident state's
        :meth:`mapPartitions`), started from ``zero()`` and summed in place by ``add(acc, r)``
        (which returns ``acc``), by ``reduce`` where the engine has a choice."""
        ...

    def add_tag(self, tag: str) -> None:
        """Tag the jobs this thread starts next (until :meth:`remove_tag`)."""
        ...

    def remove_tag(self, tag: str) -> None: ...

    def cancel(self, tag: str) -> None:
        """Cancel the running jobs tagged ``tag``."""
        ...

    def join_group(self, group: str, description: str) -> None:
        """Put the jobs this thread starts from now on into ``group`` (for the whole
        thread: an asynchronous partition's driver thread), interrupted when cancelled."""
        ...

    def cancel_group(self, group: str) -> None:
        """Cancel the running jobs of ``group``, interrupting their tasks."""
        ...

    def resident_from_dataframe(self, df: "DataFrame", build: Callable, name: str, on_lost: str,
                                spill_dir: str | None) -> Any:
        """Resident shards built from ``df``'s partitions through Arrow
        (:meth:`~sparknet.cluster.resident.driver.Resident.from_dataframe`'s contract)."""
        ...

    def resident_slots(self, n: int, build: Callable, name: str) -> Any:
        """A resident state of ``n`` slots, slot ``i`` built by ``build(i, ...)`` (the
        model-parallel blocks' home); rebuilt by Spark where the engine can."""
        ...

    def live_executors(self) -> set[str] | None:
        """The executors registered now, or ``None`` where that is not known (local mode, a
        Connect client)."""
        ...


def is_connect(spark: Any) -> bool:
    """Whether ``spark`` (a session or a DataFrame) is a Spark Connect one."""
    return type(spark).__module__.startswith("pyspark.sql.connect")


def functions_for(df: Any) -> tuple[Any, Callable]:
    """pyspark's SQL functions module and ``vector_to_array`` for ``df``'s kind of session.
    pyspark picks Classic or Connect functions by an environment variable the builder
    sets, not by the DataFrame: a process with a Classic session and a Connect client
    (a Connect session made from ``pyspark.sql.connect.session``) needs the right ones."""
    if is_connect(df):
        from pyspark.ml.connect.functions import vector_to_array
        from pyspark.sql.connect import functions as F
    else:
        from pyspark.ml.functions import vector_to_array
        from pyspark.sql import functions as F  # type: ignore[no-redef]
    return F, vector_to_array


def arrow_udf_for(df: Any, fn: Callable, return_type: Any) -> Any:
    """``pyspark.sql.functions.arrow_udf(fn, return_type)`` made for ``df``'s kind of
    session (see :func:`functions_for`): pyspark types the UDF from ``fn``'s hints, then
    a Connect DataFrame gets the Connect form of the same UDF."""
    from pyspark.sql.functions import arrow_udf

    # the stubs want a functionType, which pyspark deprecates
    udf = arrow_udf(fn, return_type)  # type: ignore[call-overload]
    if not is_connect(df):
        return udf
    from pyspark.sql.connect.udf import _create_udf

    return _create_udf(udf.func, udf.returnType, udf.evalType)


class SumParam(AccumulatorParam, Generic[T]):
    """An ``AccumulatorParam`` that sums with ``add(acc, r)`` from ``zero()`` (its zero is made
    on each executor, so nothing sized like the parameters travels with the task closure)."""

    def __init__(self, zero: Callable[[], T], add: Callable[[T, T], T]) -> None:
        self._zero, self._add = zero, add

    def zero(self, value: T) -> T:
        return self._zero()

    def addInPlace(self, value1: T, value2: T) -> T:
        return self._add(value1, value2)


class _Adder(Generic[T]):
    """``foreach``'s function: each task's result into the accumulator."""

    def __init__(self, acc: "Accumulator[T]") -> None:
        self.acc = acc

    def __call__(self, r: T) -> None:
        self.acc.add(r)


class ClassicEngine:
    """:class:`Engine` over a ``SparkContext``."""

    kind = "classic"

    def __init__(self, sc: "SparkContext") -> None:
        self.sc = sc
        self.app_id = str(sc.applicationId)

    def num_partitions(self, df: "DataFrame") -> int | None:
        return int(df.rdd.getNumPartitions())

    def thread(self, target: Callable[..., Any], name: str,
               args: tuple = ()) -> threading.Thread:
        from pyspark import InheritableThread

        return InheritableThread(target=target, args=args, name=name, daemon=True)

    def default_parallelism(self) -> int:
        return int(self.sc.defaultParallelism)

    def conf(self, key: str, default: str | None = None) -> str | None:
        return self.sc.getConf().get(key, default)

    def describe(self, text: str | None) -> None:
        # None clears it; the stub says str
        self.sc.setJobDescription(text)  # type: ignore[arg-type]

    def ship(self, value: Any) -> Shipped:
        return self.sc.broadcast(value)

    def ship_to_udf(self, value: Any) -> Shipped:
        return self.sc.broadcast(value)

    def filesystem(self, path: str) -> HadoopPath:
        jvm: Any = self.sc._jvm  # (Optional in pyspark's hints; set while sc runs)
        hpath = jvm.org.apache.hadoop.fs.Path(path)
        fs = hpath.getFileSystem(self.sc._jsc.hadoopConfiguration())
        return HadoopPath(jvm, fs, fs.makeQualified(hpath))

    def gather(self, job: Any, zero: Callable[[], T], add: Callable[[T, T], T], reduce: str,
               depth: int) -> T:
        if reduce == "tree":
            return job.treeAggregate(zero(), add, add, depth=depth)
        acc = self.sc.accumulator(zero(), SumParam(zero, add))
        job.foreach(_Adder(acc))
        return acc.value

    def add_tag(self, tag: str) -> None:
        self.sc.addJobTag(tag)

    def remove_tag(self, tag: str) -> None:
        self.sc.removeJobTag(tag)

    def cancel(self, tag: str) -> None:
        self.sc.cancelJobsWithTag(tag)

    def join_group(self, group: str, description: str) -> None:
        self.sc.setJobGroup(group, description, interruptOnCancel=True)

    def cancel_group(self, group: str) -> None:
        self.sc.cancelJobGroup(group)

    def resident_from_dataframe(self, df: "DataFrame", build: Callable, name: str, on_lost: str,
                                spill_dir: str | None) -> Any:
        from sparknet.cluster.resident.driver import Resident

        return Resident.from_dataframe(df, build, name=name, on_lost=on_lost, spill_dir=spill_dir)

    def resident_slots(self, n: int, build: Callable, name: str) -> Any:
        from sparknet.cluster.resident.driver import Resident

        # the source is just the slot numbers: its lineage is kept, so that a slot whose anchor
        # block went with its executor is rebuilt by Spark and re-attaches its mapped files
        return Resident(self.sc.parallelize(range(n), n), build, name=name, cut_lineage=False)

    def live_executors(self) -> set[str] | None:
        from sparknet.cluster.resident.executors import live_executors

        try:
            return live_executors(self.sc)
        except Exception:  # pragma: no cover - context stopping
            return None


def engine_for(spark: "SparkSession | SparkContext | Engine", *, fit: bool = True) -> Engine:
    """The :class:`Engine` of a session (Classic or Connect by its type), of a
    ``SparkContext``, or ``spark`` itself when it is an engine already.

    Args:
        spark: the session, ``SparkContext`` or engine.
        fit: whether a fit will run on it: on Classic, sparknet's errors from tasks are then
            raised as themselves and the executors checked to import this sparknet (one
            task, once per application).  What saves, loads or scores asks with
            ``fit=False``: no job of its own.
    """
    if hasattr(spark, "kind") and hasattr(spark, "gather"):
        return spark  # type: ignore[return-value]
    if is_connect(spark):
        from sparknet.cluster.engine.connect import ConnectEngine

        return ConnectEngine.of(spark)  # type: ignore[arg-type]
    sc = getattr(spark, "sparkContext", spark)
    if fit:
        from sparknet.cluster.engine import task_errors
        from sparknet.cluster.engine.workers import check_workers

        task_errors.install()  # sparknet's errors from tasks, raised as themselves
        check_workers(sc)  # once per application: executors that cannot import sparknet say so
    return ClassicEngine(sc)  # type: ignore[arg-type]
