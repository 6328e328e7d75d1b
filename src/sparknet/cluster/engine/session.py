"""Getting a SparkSession fit for sparknet (and failing clearly when Java is missing)."""
from __future__ import annotations

import logging
import os
import re
import shutil
import subprocess
import sys
import threading
import time
from typing import TYPE_CHECKING, Any, Iterator

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

log = logging.getLogger(__name__)

#: Settings sparknet's jobs rely on; applied when :func:`get_spark` creates a session.
DEFAULT_CONF = {
    # keep a resident shard's task on its home executor even when that executor is
    # briefly busy (Spark's default gives up after 3 s); a home executor that is lost is
    # not waited for: the job is cancelled and the shard rebuilt on a live one at once
    # (sparknet.cluster.resident.executors.JobGuard)
    "spark.locality.wait.process": "30s",
    "spark.python.worker.reuse": "true",
    # JVM <-> Python worker traffic over a Unix domain socket instead of TCP loopback:
    # each Python task's hand-back costs ~10 ms instead of ~55 ms here (an empty
    # two-task job: 84 -> 44 ms; see benchmarks/README.md)
    "spark.python.unix.domain.socket.enabled": "true",
    "spark.sql.execution.arrow.pyspark.enabled": "true",
    # every executor's Python daemon imports numpy, pyspark's worker and sparknet once,
    # before it forks the workers: a new worker then starts with them loaded instead of
    # importing them itself (a fit's first jobs start several workers at once)
    "spark.python.daemon.module": "sparknet.cluster.engine.session",
    # the trainers draw their own progress bar (sparknet.progress.FitProgress); Spark's
    # stage bar would be written over it on the same console line
    "spark.ui.showConsoleProgress": "false",
}

#: What the executors' Python daemon imports before forking workers (see
#: :data:`DEFAULT_CONF`).  Nothing here may start a thread (the daemon forks): pyarrow
#: and pandas do, so they stay out.
PRELOAD = ("numpy", "pyspark.worker", "sparknet", "sparknet.cluster.data_parallel.round_task",
           "sparknet.cluster.resident.driver", "sparknet.cluster.resident.shards",
           "sparknet.cluster.data.sharding")

JAVA_MISSING = ("sparknet needs Java 17 or newer for Spark, and no `java` was found on PATH "
                "or in JAVA_HOME: install a JDK 17+ (e.g. `apt-get install "
                "openjdk-17-jre-headless`)")


class JavaNotFoundError(RuntimeError):
    """Java (needed by Spark) is missing or too old."""


def java_version(java: str) -> int | None:
    """The major version reported by ``java -version`` (None when unreadable)."""
    try:
        out = subprocess.run([java, "-version"], capture_output=True, text=True, timeout=30)
    except (OSError, subprocess.SubprocessError):
        return None
    m = re.search(r'version "(\d+)(?:\.(\d+))?', out.stderr + out.stdout)
    if not m:
        return None
    major = int(m.group(1))
    return int(m.group(2)) if major == 1 and m.group(2) else major


def check_java(min_version: int = 17) -> str:
    """Return the path of a usable ``java``, or raise :class:`JavaNotFoundError` with a
    one-line explanation.

    Args:
        min_version: the lowest Java major version accepted (Spark 4 needs 17).

    Raises:
        JavaNotFoundError: no ``java`` in ``JAVA_HOME/bin`` or on ``PATH``, or too old.
    """
    home = os.environ.get("JAVA_HOME")
    java = None
    if home and os.path.isfile(os.path.join(home, "bin", "java")):
        java = os.path.join(home, "bin", "java")
    java = java or shutil.which("java")
    if java is None:
        raise JavaNotFoundError(JAVA_MISSING)
    version = java_version(java)
    if version is not None and version < min_version:
        raise JavaNotFoundError(f"sparknet needs Java {min_version}+ for Spark, but {java} is Java "
                                f"{version}: install a JDK {min_version}+ and set JAVA_HOME")
    return java


def get_spark(master: str | None = None, app_name: str = "sparknet",
              conf: dict | None = None, warm_up: bool = True) -> SparkSession:
    """The active SparkSession, or a new one (default master ``local[*]``).

    Sets ``PYSPARK_PYTHON`` to this interpreter (so executors import the same
    sparknet) unless already set, checks for Java first, and applies
    :data:`DEFAULT_CONF` plus ``conf`` to a new session.  An already running session
    is returned unchanged (a warning is logged when it keeps Spark's short
    ``spark.locality.wait.process``).

    Args:
        master: Spark master URL; ``None`` means ``local[*]`` for a new session.
        app_name: application name of a new session.
        conf: extra Spark settings for a new session.
        warm_up: start the executors' Python workers of a new session in the
            background (:func:`start_python_workers`), so that the first fit does not
            wait for them.

    Returns:
        a ``pyspark.sql.SparkSession``.

    Raises:
        JavaNotFoundError: Java 17+ is missing.
    """
    from pyspark.sql import SparkSession

    active = SparkSession.getActiveSession()
    if active is not None and master is None:
        _warn_settings(active)
        return active
    check_java()
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    os.environ.setdefault("PYSPARK_DRIVER_PYTHON", sys.executable)
    builder = SparkSession.builder.master(master or "local[*]").appName(app_name)
    for k, v in {**DEFAULT_CONF, **_quiet_logging(conf or {}), **(conf or {})}.items():
        builder = builder.config(k, v)
    spark = builder.getOrCreate()
    _warn_settings(spark)
    if warm_up and active is None:  # a running session (getOrCreate returned it) is warm already
        start_python_workers(spark)
    return spark


#: the driver's log4j configuration in sessions sparknet starts (:func:`get_spark`)
LOG4J_CONF = os.path.join(os.path.dirname(os.path.abspath(__file__)), "log4j2.properties")


def _quiet_logging(conf: dict) -> dict:
    """Driver JVM options that point log4j at :data:`LOG4J_CONF` (warnings on stderr, no
    banner), unless the caller sets the driver's Java options or ``SPARK_CONF_DIR`` holds a
    log4j configuration of its own."""
    conf_dir = os.environ.get("SPARK_CONF_DIR")
    if "spark.driver.extraJavaOptions" in conf or not os.path.exists(LOG4J_CONF) or (
            conf_dir and os.path.exists(os.path.join(conf_dir, "log4j2.properties"))):
        return {}
    return {"spark.driver.extraJavaOptions": f"-Dlog4j2.configurationFile=file:{LOG4J_CONF}"}


def start_python_workers(spark: SparkSession, wait: float = 30.0) -> threading.Thread:
    """Start every executor's two Python daemons (the one of plain RDD tasks and the one
    of Arrow tasks; each imports sparknet once, see :data:`DEFAULT_CONF`) and one worker
    of each per core, in a background job (job group ``sparknet-warm-up``), then run a
    small shard build (:func:`warm_shard_path`): the first fit then finds the workers
    running and the shard path warm instead of waiting for them.

    Args:
        spark: the session.
        wait: seconds to wait for executors to register (standalone, YARN, k8s) before
            the job; it starts once their number has been steady for a second.

    Returns:
        the background thread (``join()`` it to wait for the workers).
    """
    def run() -> None:
        sc = spark.sparkContext
        try:
            sc.setJobGroup("sparknet-warm-up", "sparknet: starting the executors' Python workers")
            deadline, seen, steady = time.time() + wait, -1, time.time()
            while time.time() < deadline and not (sc.master or "local").startswith("local"):
                n = sc._jsc.sc().getExecutorMemoryStatus().size() - 1  # less the driver
                if n != seen:
                    seen, steady = n, time.time()
                elif n > 0 and time.time() - steady >= 1.0:
                    break
                time.sleep(0.1)
            tasks = max(sc.defaultParallelism, seen)
            spark.range(tasks, numPartitions=tasks).mapInArrow(_arrow_noop,
                                                               "id long").rdd.map(_noop).count()
            warm_shard_path(spark, tasks)
        except Exception as exc:  # a stopped session: nothing to warm
            log.debug("sparknet: warming up the Python workers failed: %s", exc)

    thread = threading.Thread(target=run, name="sparknet-warm-up", daemon=True)
    thread.start()
    return thread


def warm_shard_path(spark: SparkSession, tasks: int) -> None:
    """Build and delete a few rows' shards the way a fit loads a DataFrame (an ML Vector
    column handed over by the JVM, read by the Python workers, spilled, collected).

    A session's first shard job pays once for what every later one finds ready: the
    executors loading sparknet's jar, Spark generating and compiling the job's code, the
    workers' first imports of the shard build, the first spill and result hand-back.
    In a first fit these came to 0.7-1.7 s of its set-up (``benchmarks/README.md``, "A
    warm shard path, steady round costs and four rounds per epoch"); here they are paid in
    the background while the user builds the data.

    Args:
        spark: the session.
        tasks: partitions of the build (one task each), a positive integer.

    Raises:
        ValueError: ``tasks`` is not a positive integer.
    """
    from pyspark.ml.functions import array_to_vector
    from pyspark.sql import functions as F

    from sparknet._validation import positive_int
    from sparknet.cluster.data.sharding import shard_data

    tasks = positive_int(tasks, "tasks")
    rows = spark.range(16 * tasks, numPartitions=tasks).select(
        array_to_vector(F.array_repeat((F.col("id") % 3).cast("double"), 8)).alias("features"),
        (F.col("id") % 2).cast("double").alias("label"))
    shard_data(rows, sc=spark.sparkContext, num_partitions=None, name="warm-up",
               what="warm-up data").close()


def _arrow_noop(batches: Iterator[Any]) -> Iterator[Any]:
    yield from batches


def _noop(row: Any) -> int:
    return 0


def preload(modules: tuple[str, ...] = PRELOAD) -> list[str]:
    """Import ``modules`` (the executors' Python daemon does, before forking workers);
    returns the ones that failed (the workers then import them themselves).  Output goes
    to stderr: the daemon's stdout tells the JVM its port."""
    import contextlib
    import importlib

    failed = []
    with contextlib.redirect_stdout(sys.stderr):
        for name in modules:
            try:
                importlib.import_module(name)
            except Exception as exc:  # pragma: no cover - a broken install: workers report it
                failed.append(name)
                print(f"sparknet daemon: preloading {name} failed: {exc!r}", file=sys.stderr)
    return failed


def _warn_settings(spark: SparkSession) -> None:
    sc = spark.sparkContext
    wait = sc.getConf().get("spark.locality.wait.process")
    if wait is None and sc.master and not sc.master.startswith("local"):
        log.warning("spark.locality.wait.process is not set: resident shards may move between "
                    "executors when one is busy for 3 s; set it to e.g. 30s")


if __name__ == "__main__":  # the executors' Python daemon (spark.python.daemon.module)
    preload()
    from pyspark import daemon

    daemon.manager()
