"""The jar of the package's Java classes (``sparknet/jvm/*.java``), built on first use and
added to a classic session.

The classes run inside the JVM: ``PackRows`` hands a DataFrame's training rows to the shard
build (:mod:`sparknet.cluster.data.packed_rows`), ``ScoreRows`` and ``DenseForward`` score
small dense networks (:mod:`sparknet.ml`'s ``"jvm"`` inference engine, ``sparknet.ml._jvm``),
and ``TaskErrorFilter`` keeps the traces of sparknet's failed tasks off the driver's console
(:func:`quiet_task_errors`).

The Java sources ship with the package and are compiled once per machine, Spark version
and source version with the JDK's ``javac`` against Spark's own jars, into a jar in the
user's cache folder (``$SPARKNET_CACHE_DIR``, else ``$XDG_CACHE_HOME/sparknet``, else
``~/.cache/sparknet``).  The jar joins the session with the same call as SQL's ``ADD
JAR``, so executors fetch it as they fetch any added jar.  Where there is no ``javac``
or no classic (non-Connect) session, :func:`unavailable` says why, and the callers take
their Arrow paths.
"""
from __future__ import annotations

import hashlib
import logging
import os
import shutil
import subprocess
import tempfile
import threading
import zipfile
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

log = logging.getLogger(__name__)

#: the Java sources of the jar (Java package ``sparknet.jvm``)
SOURCES = sorted((Path(__file__).resolve().parents[2] / "jvm").glob("*.java"))
FILTER_CLASS = "sparknet.jvm.TaskErrorFilter"

_LOCK = threading.Lock()
_JARS: dict[str, Path] = {}          # cache key -> built jar
_ADDED: dict[str, Any] = {}          # SparkContext -> its jar class loader (a Py4J object)
_FAILED: dict[str, str] = {}         # cache key -> why the build failed


def cache_dir() -> Path:
    """sparknet's folder in the user's cache: ``$SPARKNET_CACHE_DIR``, else
    ``$XDG_CACHE_HOME/sparknet``, else ``~/.cache/sparknet``."""
    base = os.environ.get("SPARKNET_CACHE_DIR")
    if base:
        return Path(base)
    xdg = os.environ.get("XDG_CACHE_HOME")
    return (Path(xdg) if xdg else Path.home() / ".cache") / "sparknet"


def javac() -> str | None:
    """The JDK's ``javac`` (``$JAVA_HOME/bin/javac``, else the one on the ``PATH``), or None."""
    home = os.environ.get("JAVA_HOME")
    if home and os.access(os.path.join(home, "bin", "javac"), os.X_OK):
        return os.path.join(home, "bin", "javac")
    return shutil.which("javac")


def _spark_jars() -> Path:
    """Spark's jars: ``$SPARK_HOME/jars`` when set, else the pyspark package's."""
    home = os.environ.get("SPARK_HOME")
    if home and os.path.isdir(os.path.join(home, "jars")):
        return Path(home) / "jars"
    import pyspark
    return Path(pyspark.__file__).parent / "jars"


def build_jar() -> Path:
    """The compiled jar, built on first use (a few seconds) and cached on disk.

    Raises:
        RuntimeError: no ``javac``, or it failed (its output is in the message).
    """
    jars = _spark_jars()
    import pyspark

    src = b"".join(p.name.encode() + p.read_bytes() for p in SOURCES)
    key = hashlib.sha256(src + pyspark.__version__.encode() + str(jars).encode()).hexdigest()[:20]
    with _LOCK:
        if key in _JARS and _JARS[key].exists():
            return _JARS[key]
        if key in _FAILED:
            raise RuntimeError(_FAILED[key])
        target = cache_dir() / "jvm" / key / "sparknet-jvm.jar"
        if target.exists():
            _JARS[key] = target
            return target
        compiler = javac()
        if compiler is None:
            _FAILED[key] = ("no javac found (install a JDK, or set JAVA_HOME to one); the JVM "
                            "inference engine is compiled on first use")
            raise RuntimeError(_FAILED[key])
        target.parent.mkdir(parents=True, exist_ok=True)
        log.info("compiling the JVM inference engine (once per Spark version) into %s", target)
        with tempfile.TemporaryDirectory(dir=target.parent) as tmp:
            cmd = [compiler, "--release", "17", "-nowarn", "-encoding", "UTF-8",
                   "-cp", str(jars / "*"), "-d", tmp, *map(str, SOURCES)]
            proc = subprocess.run(cmd, capture_output=True, text=True)
            if proc.returncode != 0:
                _FAILED[key] = f"javac failed ({' '.join(cmd)}):\n{proc.stderr.strip()}"
                raise RuntimeError(_FAILED[key])
            part = Path(tmp) / "sparknet-jvm.jar.part"
            with zipfile.ZipFile(part, "w", zipfile.ZIP_DEFLATED) as z:
                z.writestr("META-INF/MANIFEST.MF", "Manifest-Version: 1.0\r\n\r\n")
                for cls in sorted(Path(tmp).rglob("*.class")):
                    z.write(cls, cls.relative_to(tmp).as_posix())
            os.replace(part, target)          # readers never see a half-written jar
        _JARS[key] = target
        return target


def loader(spark: SparkSession, check: str | None = None) -> Any:
    """The session's jar class loader, after adding the jar to the session once.  When the
    jar is added, the class ``check`` (the one the caller is about to use) is loaded through
    it, so that a Spark whose internals the class does not fit fails here, early."""
    jsc = spark.sparkContext._jsc
    ctx = f"{id(jsc)}:{spark.sparkContext.applicationId}"
    with _LOCK:
        found = _ADDED.get(ctx)
    if found is not None:
        return found
    jar = build_jar()
    jss = spark._jsparkSession
    jss.sessionState().resourceLoader().addJar(str(jar))   # what SQL's ADD JAR does
    found = jss.sharedState().jarClassLoader()
    if check is not None:
        _gateway(spark).jvm.java.lang.Class.forName(check, True, found)  # fails early
    _install_filter(spark, found)
    with _LOCK:
        _ADDED[ctx] = found
    return found


def quiet_task_errors(spark: SparkSession) -> None:
    """Keep the traces of tasks that failed in sparknet's code off the driver's console, and
    raise sparknet's errors from tasks as themselves
    (:mod:`sparknet.cluster.engine.task_errors`).

    Spark logs a failed task's trace on the driver two or three times ("Exception in task",
    "Lost task", "aborting job"), through log4j2, when the task fails: for a ``transform``,
    inside the user's action on the returned DataFrame, long after sparknet's call returned.
    A level raised on those loggers for the duration of sparknet's own calls would miss those
    failures, and a level is global to the JVM: it would also hide (or, restored by one of two
    overlapping fits, keep hidden) the failures of the user's other jobs running meanwhile.
    So the lines are filtered where they are written instead: ``TaskErrorFilter``
    (``jvm/TaskErrorFilter.java``), added once to the driver's log4j2 configuration, drops
    the events of a task that failed in sparknet's code and logs them at debug level under the
    log4j logger ``sparknet.tasks``; every other event passes untouched.  In a session
    sparknet starts, its log4j2 profile (``cluster/engine/log4j2.properties``) leaves those
    loggers as Spark has them, for the same reason.  To see the traces, set that logger to
    DEBUG (``logger.tasks.name = sparknet.tasks`` in a log4j2 profile, or
    ``Configurator.setLevel``).

    The filter is Java, in the jar compiled on first use: without ``javac`` (or in a Spark
    Connect session, whose JVM is the server's) Spark's lines stay, and the error raised on
    the driver is still sparknet's own.  Never fails: a reason is logged.
    """
    from sparknet.cluster.engine import task_errors

    task_errors.install()
    if not hasattr(spark, "_jsparkSession"):
        return
    try:
        loader(spark)                         # adds the jar once, which installs the filter
    except Exception as exc:  # noqa: BLE001 - the error still reaches the driver translated
        log.debug("Spark's task-failure lines stay on the console: %s", describe(exc))


def _install_filter(spark: SparkSession, jar_loader: Any) -> None:
    """``TaskErrorFilter.install()`` in the session's JVM (see :func:`quiet_task_errors`)."""
    gw = _gateway(spark)
    try:
        cls = gw.jvm.java.lang.Class.forName(FILTER_CLASS, True, jar_loader)
        method = cls.getMethod("install", gw.new_array(gw.jvm.java.lang.Class, 0))
        method.invoke(None, gw.new_array(gw.jvm.java.lang.Object, 0))
    except Exception as exc:  # noqa: BLE001 - another logging backend: Spark's lines stay
        log.debug("no filter for Spark's task-failure lines: %s", describe(exc))


def _gateway(spark: SparkSession) -> Any:
    """The Py4J gateway to the session's JVM."""
    gw = spark.sparkContext._gateway
    if gw is None:
        raise RuntimeError("the SparkContext has no JVM gateway (was it stopped?)")
    return gw


def new_instance(spark: SparkSession, name: str) -> Any:
    """A new instance of the jar's class ``name`` (through the session's jar loader)."""
    gw = _gateway(spark)
    cls = gw.jvm.java.lang.Class.forName(name, True, loader(spark, name))
    ctor = cls.getDeclaredConstructor(gw.new_array(gw.jvm.java.lang.Class, 0))
    return ctor.newInstance(gw.new_array(gw.jvm.java.lang.Object, 0))


def describe(exc: BaseException) -> str:
    """One line saying what went wrong (the Java exception itself, for a Py4J error)."""
    java = getattr(exc, "java_exception", None)
    if java is not None:
        try:
            return str(java.toString())
        except Exception:  # noqa: BLE001 - the gateway is gone: say what Python saw
            pass
    return (str(exc).strip().splitlines() or [type(exc).__name__])[0]


def unavailable(spark: SparkSession, check: str) -> str | None:
    """Why the jar's class ``check`` cannot run in ``spark`` (None when it can): a Spark
    Connect session, no ``javac``, a failed build, or a class this Spark cannot load."""
    if not hasattr(spark, "_jsparkSession"):
        return "a Spark Connect session has no JVM on the client"
    try:
        loader(spark, check)
    except Exception as exc:  # noqa: BLE001 - the reason is reported, Arrow takes over
        return describe(exc)
    return None
