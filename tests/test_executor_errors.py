"""Errors that sparknet's code raises in tasks reach the user as themselves: one
:class:`sparknet.errors.DataError` (not a ``Py4JJavaError`` of a hundred lines, nor pyspark's
``PythonException``), raised by the action on the scored DataFrame, with Spark's traces of the
failed tasks kept off the console (logged at debug level), on the JVM and the Arrow engines."""
from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

pytest.importorskip("pyspark")

from pyspark.ml.linalg import Vectors, VectorUDT  # noqa: E402
from pyspark.sql import functions as F  # noqa: E402
from pyspark.sql import types as T  # noqa: E402

from sparknet import Dense, Sequential  # noqa: E402
from sparknet.cluster.engine import jar, task_errors  # noqa: E402
from sparknet.errors import DataError, TrainingDiverged  # noqa: E402
from sparknet.ml import SparkNetClassificationModel  # noqa: E402

HERE = Path(__file__).parent
HAS_JAVAC = jar.javac() is not None
ENGINES = ["jvm", "arrow"] if HAS_JAVAC else ["arrow"]
ROW_63 = (r"features column 'features' (has (a row|rows) of 63 values|holds rows of different "
          r"lengths \(63 and 64\)); the network expects 64")


def _model(engine: str) -> SparkNetClassificationModel:
    net = Sequential([Dense(16, activation="relu"), Dense(10, activation="softmax")])
    net.build((64,))
    net.params[...] = np.random.default_rng(0).normal(0, 0.3, net.params.shape)
    model = SparkNetClassificationModel.from_network(net)
    return model.copy({model.inferenceEngine: engine})


def _run_job(*args: str) -> subprocess.CompletedProcess[str]:
    # the installed sparknet, as a user's job has it (the README's test command installs it)
    return subprocess.run([sys.executable, str(HERE / "helpers" / "bad_row_job.py"), *args],
                          capture_output=True, text=True, timeout=300)


@pytest.fixture(scope="module")
def bad_row_job() -> tuple[subprocess.CompletedProcess[str], str, str, str]:
    """One run of the user's program (one Spark start for both console tests): the bad row
    scored on each engine at the default log level, the control UDF, then (with javac) the
    JVM engine again with ``sparknet.tasks`` at DEBUG.  Returns the process and its stderr
    cut into those three parts."""
    proc = _run_job(*ENGINES, *(["debug", "jvm"] if HAS_JAVAC else []))
    ours, rest = proc.stderr.split("CONTROL\n", 1) if "CONTROL\n" in proc.stderr else (proc.stderr, "")
    control, debug = rest.split("DEBUG\n", 1) if "DEBUG\n" in rest else (rest, "")
    return proc, ours, control, debug


@pytest.mark.slow
def test_a_bad_row_gives_one_sparknet_error_and_a_clean_console(bad_row_job):
    """The user's session, model and DataFrame with a 63-value row; transform + collect on
    each engine: one DataError naming the column, the row's length and the network's, and
    on the console neither a Java trace nor a Python worker's traceback.  A failure of the
    user's own UDF afterwards is still logged as Spark logs it (the filter is sparknet's)."""
    proc, ours, control, _ = bad_row_job
    assert proc.returncode == 0, proc.stderr[-3000:]
    for engine in ENGINES:
        line = next((ln for ln in proc.stdout.splitlines() if ln.startswith(f"CAUGHT {engine} ")),
                    None)
        assert line is not None, proc.stdout
        kind, message = line[len(f"CAUGHT {engine} "):].split(": ", 1)
        assert kind == "sparknet.errors.DataError"
        assert re.fullmatch(ROW_63, message), message
    assert "CAUGHT control pyspark.errors.exceptions.captured.PythonException" in proc.stdout
    if not HAS_JAVAC:
        pytest.skip("no javac: the filter of Spark's task-failure lines is compiled Java, so "
                    "Spark's traces stay on the console (the error raised is still DataError)")
    for noise in ("at org.apache.spark", "Traceback (most recent call last)", "PythonException",
                  "Exception in task", "Lost task", "aborting job", "features column"):
        assert noise not in ours, ours[-3000:]
    assert "Exception in task" in control and "ZeroDivisionError" in control


@pytest.mark.slow
@pytest.mark.skipif(not HAS_JAVAC, reason="no javac: no filter to log Spark's lines at debug level")
def test_the_failed_tasks_traces_are_logged_at_debug_level(bad_row_job):
    """With the log4j logger ``sparknet.tasks`` at DEBUG, the lines kept off the console
    are there, with the Java trace of the JVM engine's task."""
    proc, _, _, debug = bad_row_job
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "CAUGHT debug-jvm sparknet.errors.DataError" in proc.stdout, proc.stdout
    assert "DEBUG tasks:" in debug or "sparknet.tasks" in debug, debug[-3000:]
    assert "Exception in task" in debug and "at sparknet.jvm.ScoreRows" in debug


@pytest.mark.slow
@pytest.mark.parametrize("engine", ENGINES)
def test_bad_rows_raise_data_error_at_the_action(spark, engine):
    """NaN, 63 values, a null row: DataError (a ValueError) from collect, count and write,
    the message naming the column."""
    model = _model(engine)
    good = [float(i % 7) for i in range(64)]
    nan = list(good)
    nan[3] = float("nan")
    schema = T.StructType([T.StructField("features", VectorUDT(), True)])
    cases = [([good, good[:63]], ROW_63),
             ([good, nan], r"features column 'features' contains NaN or infinity"),
             ([good, None], r"features column 'features' has a null row")]
    for rows, match in cases:
        df = spark.createDataFrame([(None if r is None else Vectors.dense(r),) for r in rows],
                                   schema).coalesce(1)
        scored = model.transform(df)
        assert model.lastInferenceEngine == engine
        with pytest.raises(DataError, match=match) as info:
            scored.collect()
        assert isinstance(info.value, ValueError) and info.value.__suppress_context__
        with pytest.raises(DataError, match=match):
            scored.select("prediction").write.format("noop").mode("overwrite").save()


def test_other_failures_pass_through(spark):
    """A user's UDF raising ValueError stays pyspark's error, untranslated."""
    from pyspark.errors import PythonException

    def bad(v):
        raise ValueError("the user's own check")

    with pytest.raises(PythonException, match="the user's own check"):
        spark.range(1).select(F.udf(bad, "double")("id")).collect()


def test_a_sparknet_error_raised_in_a_python_task_crosses_by_its_class(spark):
    """Any of sparknet's errors raised in a Python task (here TrainingDiverged, in an RDD job
    as the training rounds run) is raised on the driver as itself."""
    task_errors.install()

    def diverge(_):
        raise TrainingDiverged("training diverged: the loss became nan in partition 0")

    with pytest.raises(TrainingDiverged, match=r"^training diverged: the loss became nan in "
                                               r"partition 0$"):
        spark.sparkContext.parallelize([0], 1).mapPartitions(diverge).collect()


def test_translate_reads_the_last_sparknet_error_of_a_traceback():
    text = ("Traceback (most recent call last):\n  File \"x.py\", line 1, in f\n"
            "sparknet.errors.DataError: features column 'f' has a null row\n SQLSTATE: 38000")
    err = task_errors.translate(RuntimeError(text))
    assert type(err) is DataError and str(err) == "features column 'f' has a null row"
    assert task_errors.translate(RuntimeError("sparknet.errors.NotOurs: x")) is None
    assert task_errors.translate(ValueError("features column 'f'")) is None
