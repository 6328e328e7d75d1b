"""Small dense networks scored inside the JVM (``jvm/ScoreRows.java``, ``jvm/DenseForward.java``),
and the jar of the package's Java classes (also ``jvm/PackRows.java``, which hands a
DataFrame's training rows to the shard build: ``sparknet.cluster.data.packed_rows``).

For a small network, ``transform`` through Arrow spends most of its time handing rows
to a Python worker and back (about 1.5 microseconds a row on this project's benchmark
machine, against about half of one for the arithmetic of a 64-64-10 MLP).  A network
made only of dense, activation, dropout and flatten layers, scoring an ML ``Vector``
column, instead runs as a function over each partition's rows in Spark's internal row
format, on the executors' task threads: the ``"jvm"`` inference engine.  The output
DataFrame's plan is the input's, then that function (an RDD scan, as ``mapInArrow``
gives an opaque step too).

The Java sources ship with the package and are compiled once per machine, Spark version
and source version with the JDK's ``javac`` against Spark's own jars, into a jar in the
user's cache folder (``$SPARKNET_CACHE_DIR``, else ``$XDG_CACHE_HOME/sparknet``, else
``~/.cache/sparknet``).  The jar joins the session with the same call as SQL's ``ADD
JAR``, so executors fetch it as they fetch any added jar.  Where there is no ``javac``
or no classic (non-Connect) session, :func:`unavailable` says why and the ``"auto"``
engine uses Arrow.
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
from typing import TYPE_CHECKING, Any, Sequence

import numpy as np

if TYPE_CHECKING:
    from pyspark.sql import DataFrame, SparkSession

    from sparknet.model import Sequential

log = logging.getLogger("sparknet.ml")

SOURCES = sorted((Path(__file__).with_name("jvm")).glob("*.java"))
NETWORK_CLASS = "sparknet.jvm.DenseForward"
SCORER_CLASS = "sparknet.jvm.ScoreRows"
FILTER_CLASS = "sparknet.jvm.TaskErrorFilter"

#: ``"auto"`` picks the JVM for networks of at most this many multiply-adds per row.
#: Past it, the Cython kernels' batched matrix products in the Python workers win over
#: the JVM's one-row-at-a-time loops: on digits rows, local[2], 100k rows, the Arrow
#: engine took 1.91x the JVM's time at 4,736 multiply-adds, 1.25x at 18,944, 1.10x at
#: 37,888, 0.73x at 75,776 and 0.38x at 166,400 (benchmarks/README.md).
AUTO_MAX_MACS = 40_000

_LOCK = threading.Lock()
_JARS: dict[str, Path] = {}          # cache key -> built jar
_ADDED: dict[str, Any] = {}          # SparkContext -> its jar class loader (a Py4J object)
_FAILED: dict[str, str] = {}         # cache key -> why the build failed


#: a network in :file:`DenseForward.java`'s layout: ``(ops spec, float64 parameters,
#: multiply-adds per row)``
Plan = tuple[str, bytes, int]


class Unsupported(ValueError):
    """The network (or the column) cannot run on the JVM engine; the message says why."""


def plan(network: Sequential) -> Plan:
    """The network as ``(ops spec, float64 parameters, multiply-adds per row)`` in
    :file:`DenseForward.java`'s layout.

    Raises:
        Unsupported: a layer other than Dense, Activation, Dropout or Flatten, an
            activation other than identity, relu, tanh, sigmoid or softmax, or an input
            that is not one flat vector.
    """
    from sparknet.layers.core import Activation, Dense, Dropout, Flatten

    ops: list[str] = []
    parts: list[np.ndarray] = []
    macs = 0
    for layer in network.layers:
        act = getattr(layer, "_kernel_act", 0)
        if act > 4:  # DenseForward.java knows identity, relu, tanh, sigmoid and softmax
            kind = getattr(layer, "activation", act)
            raise Unsupported(f"layer {layer.name!r}: activation {kind!r} has no JVM kernel")
        if isinstance(layer, Dense):
            if layer.input_shape is None or len(layer.input_shape) != 1:
                raise Unsupported(f"layer {layer.name!r} reads {layer.input_shape}-shaped rows")
            W = np.asarray(layer.params["kernel"], dtype=np.float64)
            b = layer.params.get("bias")
            b = np.zeros(W.shape[0]) if b is None else np.asarray(b, dtype=np.float64)
            ops.append(f"d{W.shape[0]}:{layer._kernel_act}")
            parts += [np.ascontiguousarray(W.T).reshape(-1), b]
            macs += W.size
        elif isinstance(layer, Activation):
            ops.append(f"a{layer._kernel_act}")
        elif isinstance(layer, (Dropout, Flatten)):
            if isinstance(layer, Flatten) and (layer.input_shape is None or len(layer.input_shape) != 1):
                raise Unsupported(f"layer {layer.name!r} flattens {layer.input_shape}-shaped rows")
            continue                       # identity at inference on flat rows
        else:
            raise Unsupported(f"layer {layer.name!r} ({type(layer).__name__}) has no JVM kernel")
    if not ops:
        raise Unsupported("the network has no dense layer")
    params = np.concatenate(parts).astype("<f8") if parts else np.zeros(0, "<f8")
    return ",".join(ops), params.tobytes(), macs


def _cache_dir() -> Path:
    base = os.environ.get("SPARKNET_CACHE_DIR")
    if base:
        return Path(base)
    xdg = os.environ.get("XDG_CACHE_HOME")
    return (Path(xdg) if xdg else Path.home() / ".cache") / "sparknet"


def _javac() -> str | None:
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
        target = _cache_dir() / "jvm" / key / "sparknet-jvm.jar"
        if target.exists():
            _JARS[key] = target
            return target
        javac = _javac()
        if javac is None:
            _FAILED[key] = ("no javac found (install a JDK, or set JAVA_HOME to one); the JVM "
                            "inference engine is compiled on first use")
            raise RuntimeError(_FAILED[key])
        target.parent.mkdir(parents=True, exist_ok=True)
        log.info("compiling the JVM inference engine (once per Spark version) into %s", target)
        with tempfile.TemporaryDirectory(dir=target.parent) as tmp:
            cmd = [javac, "--release", "17", "-nowarn", "-encoding", "UTF-8",
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


def _loader(spark: SparkSession) -> Any:
    """The session's jar class loader, after adding the jar to the session once."""
    jsc = spark.sparkContext._jsc
    ctx = f"{id(jsc)}:{spark.sparkContext.applicationId}"
    with _LOCK:
        loader = _ADDED.get(ctx)
    if loader is not None:
        return loader
    jar = build_jar()
    jss = spark._jsparkSession
    jss.sessionState().resourceLoader().addJar(str(jar))   # what SQL's ADD JAR does
    loader = jss.sharedState().jarClassLoader()
    _gateway(spark).jvm.java.lang.Class.forName(SCORER_CLASS, True, loader)  # fails early
    _install_filter(spark, loader)
    with _LOCK:
        _ADDED[ctx] = loader
    return loader


def quiet_task_errors(spark: SparkSession) -> None:
    """Keep the traces of tasks that failed in sparknet's code off the driver's console, and
    raise sparknet's errors from tasks as themselves (:mod:`sparknet.cluster.engine.task_errors`).

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

    The filter is Java, in the jar the JVM engine compiles on first use: without ``javac``
    (or in a Spark Connect session, whose JVM is the server's) Spark's lines stay, and the
    error raised on the driver is still sparknet's own.  Never fails: a reason is logged.
    """
    from sparknet.cluster.engine import task_errors

    task_errors.install()
    if not hasattr(spark, "_jsparkSession"):
        return
    try:
        _loader(spark)                        # adds the jar once, which installs the filter
    except Exception as exc:  # noqa: BLE001 - the error still reaches the driver translated
        log.debug("Spark's task-failure lines stay on the console: %s", describe(exc))


def _install_filter(spark: SparkSession, loader: Any) -> None:
    """``TaskErrorFilter.install()`` in the session's JVM (see :func:`quiet_task_errors`)."""
    gw = _gateway(spark)
    try:
        cls = gw.jvm.java.lang.Class.forName(FILTER_CLASS, True, loader)
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


def _new(spark: SparkSession, name: str) -> Any:
    """A new instance of the jar's class ``name`` (through the session's jar loader)."""
    gw = _gateway(spark)
    cls = gw.jvm.java.lang.Class.forName(name, True, _loader(spark))
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


def unavailable(spark: SparkSession) -> str | None:
    """Why the JVM engine cannot run in ``spark`` (None when it can)."""
    if not hasattr(spark, "_jsparkSession"):
        return "a Spark Connect session has no JVM on the client"
    try:
        _loader(spark)
    except Exception as exc:  # noqa: BLE001 - the reason is reported, Arrow takes over
        return describe(exc)
    return None


def score(dataset: DataFrame, network: Sequential, column: str, mode: int,
          thresholds: Sequence[float] | None, specs: Sequence[tuple[str, str, dict[str, Any]]],
          planned: Plan | None = None) -> DataFrame:
    """``dataset`` with ``network``'s outputs for its Vector column ``column`` appended,
    computed on the executors by ``ScoreRows``.

    Args:
        mode: 0 classifier, 1 regressor with one output, 2 with several.
        thresholds: MLlib's per-class thresholds, or None.
        specs: the output columns, in order, as ``(name, field, metadata)``, ``field``
            one of ``raw`` (MLlib's raw scores of the network's outputs: see
            :func:`sparknet.ml._inference.raw_prediction`), ``prob`` (their softmax), ``pred``
            (MLlib's prediction rule; a regressor's output).
        planned: :func:`plan` of ``network``, if the caller has it already.
    """
    from pyspark.ml.linalg import VectorUDT
    from pyspark.sql import DataFrame
    from pyspark.sql import types as T

    spark = dataset.sparkSession
    if network.input_shape is None:
        raise Unsupported("the network is not built")
    ops, params, _ = planned if planned is not None else plan(network)
    dim = int(np.prod(network.input_shape))
    net = _new(spark, NETWORK_CLASS).configure(f"{dim};{ops}", bytearray(params))
    thr = "" if thresholds is None else ":".join(repr(float(t)) for t in thresholds)
    fields = ",".join(field for _, field, _ in specs)
    index = dataset.columns.index(column)
    scorer = _new(spark, SCORER_CLASS).configure(net, f"{index};{mode};{thr};{fields};{column}")
    out_fields = list(dataset.schema.fields)
    for name, field, meta in specs:
        scalar = field == "pred" and mode != 2
        out_fields.append(T.StructField(name, T.DoubleType() if scalar else VectorUDT(), True, meta))
    schema = T.StructType(out_fields)
    jss = spark._jsparkSession
    rdd = dataset._jdf.queryExecution().toRdd().toJavaRDD().mapPartitions(scorer).rdd()
    jdf = jss.internalCreateDataFrame(rdd, jss.parseDataType(schema.json()), False)
    return DataFrame(jdf, spark)
