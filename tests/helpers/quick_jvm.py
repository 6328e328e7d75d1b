"""Quick JVM starts for the test run.

The suite starts many JVMs: a driver for every driver program a test runs, the standalone
master, workers and executors, Spark Connect servers, and Spark's small launcher JVM
before each of them.  On a two-core machine their start-up is a large share of the run's
CPU time: a local session's start and first jobs take ~29 CPU seconds, most of it the C2
JIT compiler and class loading.  Two JVM flags, which change nothing any test checks, cut
that to ~12 CPU seconds (and the wall time from ~17 to ~9 s):

- ``-XX:TieredStopAtLevel=1``: the quick C1 compiler only.  The JVMs of the tests do
  Spark's bookkeeping on small data; the optimising compiler never pays for itself there.
- ``-XX:SharedArchiveFile``: a class-data-sharing archive of the classes a Spark session
  loads, dumped once per machine (per JDK and pyspark) into the user's cache by a short
  Spark program run in the background at the run's start; JVMs started before it is ready
  go without it.  ``-Xlog:cds*=off`` keeps the JVM quiet when an archive does not fit (a
  different class path), which it then ignores.

Drivers take the flags from ``SPARK_SUBMIT_OPTS`` (read by ``spark-submit``, which PySpark
and the Connect server start through); the standalone cluster's daemons and the executors
they start from ``JAVA_TOOL_OPTIONS`` (their output goes to log files, so the JVM's note
that it picked the variable up reaches no console a test reads).  ``SPARKNET_TEST_QUICK_JVM=0``
turns all of this off.
"""
from __future__ import annotations

import hashlib
import os
import subprocess
import sys
from concurrent.futures import Future
from pathlib import Path

from helpers.early_job import in_background
from sparknet.cluster.engine.jar import cache_dir
from sparknet.cluster.engine.session import JavaNotFoundError, check_java

C1_ONLY = "-XX:TieredStopAtLevel=1"
QUIET_CDS = "-Xlog:cds*=off"

# What the archive holds: the classes of a local session's start and of its first RDD,
# DataFrame and Arrow jobs.
_DUMP_PROGRAM = r"""
from pyspark.sql import SparkSession
spark = (SparkSession.builder.master("local[2]").appName("sparknet-tests-cds")
         .config("spark.ui.enabled", "false")
         .config("spark.sql.execution.arrow.pyspark.enabled", "true").getOrCreate())
spark.sparkContext.parallelize(range(1000), 2).map(lambda x: x * x).sum()
spark.range(10000).selectExpr("id * 2 AS x", "id % 3 AS k").groupBy("k").sum("x").collect()
spark.range(100).mapInArrow(lambda it: it, "id long").toPandas()
jvm = spark.sparkContext._gateway.proc
spark.stop()
jvm.stdin.close()  # the JVM ends when its stdin does, and writes the archive as it ends
jvm.wait(timeout=240)
"""


def archive_path(java: str) -> Path:
    """The archive's place in sparknet's cache: one per JDK build (its ``java``, as installed)
    and pyspark (its jars).  An archive that does not fit its JVM is ignored by the JVM
    itself, so the key only has to change when they do."""
    import pyspark

    real = os.path.realpath(java)
    jars = Path(pyspark.__file__).parent / "jars"
    listing = "".join(f"{p.name}:{p.stat().st_size};" for p in sorted(jars.glob("*.jar")))
    ident = f"{real}:{os.stat(real).st_size}:{os.stat(real).st_mtime_ns};{pyspark.__version__};{listing}"
    key = hashlib.sha256(ident.encode()).hexdigest()[:16]
    return cache_dir() / "tests" / f"spark-classes-{key}.jsa"


def _dump(target: Path) -> Path | None:
    """Run the dump program; the archive appears at ``target`` whole or not at all."""
    target.parent.mkdir(parents=True, exist_ok=True)
    part = target.with_name(f"{target.name}.{os.getpid()}.part")
    env = dict(os.environ, SPARK_SUBMIT_OPTS=f"{C1_ONLY} -XX:ArchiveClassesAtExit={part} {QUIET_CDS}",
               PYSPARK_PYTHON=sys.executable, PYSPARK_DRIVER_PYTHON=sys.executable)
    try:
        subprocess.run([sys.executable, "-c", _DUMP_PROGRAM], env=env, timeout=300,
                       stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, check=True)
        if not part.exists() or part.stat().st_size == 0:
            return None
        os.replace(part, target)
        return target
    except (OSError, subprocess.SubprocessError):
        return None
    finally:
        part.unlink(missing_ok=True)


def _set(archive: Path | None) -> None:
    flags = f"{C1_ONLY} {QUIET_CDS}" + (f" -XX:SharedArchiveFile={archive}" if archive else "")
    os.environ["SPARK_SUBMIT_OPTS"] = flags
    os.environ.setdefault("SPARK_LAUNCHER_OPTS", C1_ONLY)  # spark-class's own small JVM
    os.environ["SPARKNET_TEST_JAVA_OPTIONS"] = flags  # what the standalone cluster passes on


def install() -> Future | None:
    """Set the flags for every JVM started from now on (called as conftest.py loads); when
    the archive is not in the cache yet, start its dump and return it (pass it to
    :func:`adopt` between tests)."""
    if os.environ.get("SPARKNET_TEST_QUICK_JVM", "1") == "0" or os.environ.get("SPARK_SUBMIT_OPTS"):
        return None  # off, or the caller's own driver options win
    try:
        java = check_java()
    except JavaNotFoundError:
        return None  # the tests that need Spark skip, saying why
    target = archive_path(java)
    if target.exists():
        _set(target)
        return None
    _set(None)
    return in_background(lambda: _dump(target), "spark-classes-dump")


def adopt(future: Future | None) -> Future | None:
    """Once the dump is done, JVMs started after this take the archive too; returns the
    future while it is still running (called from the main thread, between tests)."""
    if future is None or not future.done():
        return future
    try:
        archive = future.result()
    except Exception:  # noqa: BLE001 - no archive: the flags stay C1-only
        archive = None
    if archive is not None:
        _set(archive)
    return None
