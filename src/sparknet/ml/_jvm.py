"""Small dense networks scored inside the JVM (``jvm/ScoreRows.java``,
``jvm/DenseForward.java``, in the jar :mod:`sparknet.cluster.engine.jar` builds).

For a small network, ``transform`` through Arrow spends most of its time handing rows
to a Python worker and back (about 1.5 microseconds a row on this project's benchmark
machine, against about half of one for the arithmetic of a 64-64-10 MLP).  A network
made only of dense, activation, dropout and flatten layers, scoring an ML ``Vector``
column, instead runs as a function over each partition's rows in Spark's internal row
format, on the executors' task threads: the ``"jvm"`` inference engine.  The output
DataFrame's plan is the input's, then that function (an RDD scan, as ``mapInArrow``
gives an opaque step too).

The Java classes are compiled on first use (:func:`~sparknet.cluster.engine.jar.build_jar`);
where there is no ``javac`` or no classic (non-Connect) session, :func:`unavailable` says
why and the ``"auto"`` engine uses Arrow.
"""
from __future__ import annotations

from typing import TYPE_CHECKING, Any, Sequence

import numpy as np

from sparknet.cluster.engine import jar
from sparknet.cluster.engine.jar import (  # noqa: F401 - the jar's helpers, used from here
    build_jar,
    describe,
    quiet_task_errors,
)

if TYPE_CHECKING:
    from pyspark.sql import DataFrame, SparkSession

    from sparknet.model import Sequential

NETWORK_CLASS = "sparknet.jvm.DenseForward"
SCORER_CLASS = "sparknet.jvm.ScoreRows"

#: ``"auto"`` picks the JVM for networks of at most this many multiply-adds per row.
#: Past it, the Cython kernels' batched matrix products in the Python workers win over
#: the JVM's one-row-at-a-time loops: on digits rows, local[2], 100k rows, the Arrow
#: engine took 1.91x the JVM's time at 4,736 multiply-adds, 1.25x at 18,944, 1.10x at
#: 37,888, 0.73x at 75,776 and 0.38x at 166,400 (benchmarks/README.md).
AUTO_MAX_MACS = 40_000

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
            if isinstance(layer, Flatten) and (layer.input_shape is None
                                               or len(layer.input_shape) != 1):
                raise Unsupported(f"layer {layer.name!r} flattens {layer.input_shape}-shaped rows")
            continue                       # identity at inference on flat rows
        else:
            raise Unsupported(f"layer {layer.name!r} ({type(layer).__name__}) has no JVM kernel")
    if not ops:
        raise Unsupported("the network has no dense layer")
    params = np.concatenate(parts).astype("<f8") if parts else np.zeros(0, "<f8")
    return ",".join(ops), params.tobytes(), macs


def unavailable(spark: SparkSession) -> str | None:
    """Why the JVM engine cannot run in ``spark`` (None when it can)."""
    return jar.unavailable(spark, SCORER_CLASS)


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
    net = jar.new_instance(spark, NETWORK_CLASS).configure(f"{dim};{ops}", bytearray(params))
    thr = "" if thresholds is None else ":".join(repr(float(t)) for t in thresholds)
    fields = ",".join(field for _, field, _ in specs)
    index = dataset.columns.index(column)
    scorer = jar.new_instance(spark, SCORER_CLASS).configure(
        net, f"{index};{mode};{thr};{fields};{column}")
    out_fields = list(dataset.schema.fields)
    for name, field, meta in specs:
        scalar = field == "pred" and mode != 2
        kind = T.DoubleType() if scalar else VectorUDT()
        out_fields.append(T.StructField(name, kind, True, meta))
    schema = T.StructType(out_fields)
    jss = spark._jsparkSession
    rdd = dataset._jdf.queryExecution().toRdd().toJavaRDD().mapPartitions(scorer).rdd()
    jdf = jss.internalCreateDataFrame(rdd, jss.parseDataType(schema.json()), False)
    return DataFrame(jdf, spark)
