"""DataFrames of features and labels, in the column types Spark users bring to sparknet.

- :func:`array_frame`: ``array<double>`` (or ``array<float>``) features and a double label,
  built through Arrow (the fast path for thousands of rows).
- :func:`vector_frame`: ML ``Vector`` features (as MLlib's stages make them) and a double label.
- :func:`row_frame`: Python rows of ``Vectors.dense`` (or lists, ``array<double>``) and integer
  labels, repartitioned, optionally cached.
"""
from __future__ import annotations

from typing import Any

import numpy as np


def array_frame(spark: Any, X: Any, y: Any, elem: str = "double") -> Any:
    """An ``array<elem>`` features column (``elem``: ``"double"`` or ``"float"``) and a double
    label, both non-null, built through Arrow."""
    import pandas as pd
    from pyspark.sql import types as T

    item = T.FloatType() if elem == "float" else T.DoubleType()
    schema = T.StructType([T.StructField("features", T.ArrayType(item), False),
                           T.StructField("label", T.DoubleType(), False)])
    dt = np.float32 if elem == "float" else np.float64
    pdf = pd.DataFrame({"features": list(np.asarray(X, dtype=dt)),
                        "label": np.asarray(y, dtype=np.float64)})
    return spark.createDataFrame(pdf, schema)


def vector_frame(spark: Any, X: Any, y: Any) -> Any:
    """An ML Vector features column and a double label (:func:`array_frame`, then
    ``array_to_vector``)."""
    from pyspark.ml.functions import array_to_vector

    df = array_frame(spark, X, y)
    return df.select(array_to_vector("features").alias("features"), "label")


def row_frame(spark: Any, X: Any, y: Any, partitions: int, array: bool = False,
              cache: bool = False) -> Any:
    """Python rows: ``Vectors.dense`` features (``array<double>`` with ``array=True``) and
    integer labels (``long``), in ``partitions`` partitions; with ``cache=True`` cached and
    counted, so that the rows are in memory before the test times or counts jobs."""
    from pyspark.ml.linalg import Vectors

    rows = [([float(v) for v in x] if array else Vectors.dense(x), int(t)) for x, t in zip(X, y)]
    if array:
        df = spark.createDataFrame(rows, schema="features array<double>, label long")
    else:
        df = spark.createDataFrame(rows, ["features", "label"])
    df = df.repartition(partitions)
    if cache:
        df = df.cache()
        df.count()
    return df
