"""A DataFrame's training rows handed to the shard build through a local file the JVM
writes (``jvm/PackRows.java``, in the jar of :mod:`sparknet.cluster.engine.jar`), not
through Arrow.

Arrow's writer for a Vector (or array) column, then the socket to the Python worker,
cost about 30 ns an element: for MNIST's 47 million values most of a first fit's
set-up.  ``PackRows`` reads each row's values straight from Spark's internal row
format and writes one file a partition (little-endian features, then float64 labels)
on the executor's host, in ``/dev/shm`` where it can; the Python worker beside it
(:class:`PackedBuild`) reads the file into one ``(rows, features)`` array and deletes
it.  Rows, order and checks are those of the plain Arrow path (``data._ArrowBuild``),
whose arrays these equal bit for bit.

The path needs a classic session and a JDK's ``javac`` (the jar is compiled once per
machine and Spark version, as for the JVM inference engine); :func:`packed_columns`
returns None where either is missing, or where ``SPARKNET_PACK_ROWS=0``, and the
Arrow path takes over.
"""
from __future__ import annotations

import logging
import os
from dataclasses import replace
from typing import TYPE_CHECKING, Iterable

import numpy as np

from sparknet.cluster.data.shard_checks import finish, no_rows
from sparknet.cluster.data.shard_report import ShardReport, refused_by_jvm
from sparknet.cluster.engine import jar

if TYPE_CHECKING:
    from pyspark.sql import DataFrame

log = logging.getLogger("sparknet.cluster")

PACKER_CLASS = "sparknet.jvm.PackRows"
_KINDS = {"vector": 0, "double": 1, "float": 2}


def enabled() -> bool:
    """False when ``SPARKNET_PACK_ROWS`` is ``0`` (the plain Arrow path, for comparison)."""
    switch = os.environ.get("SPARKNET_PACK_ROWS", "1").strip().lower()
    return switch not in ("0", "false", "no", "off")


def packed_columns(df: DataFrame, features_kind: str, dtype: str,
                   folder: str = "") -> DataFrame | None:
    """``df`` (columns: features, label as double) as one row a partition naming the
    file its rows went to, or None where the JVM path is off or unavailable (why is
    logged at debug level).  ``folder``: where the files go (default: ``/dev/shm`` where
    writable, else the JVM's temporary folder)."""
    if not enabled():
        return None
    from pyspark.sql import DataFrame as _DataFrame
    from pyspark.sql import types as T

    spark = df.sparkSession
    why = jar.unavailable(spark, PACKER_CLASS)
    if why is not None:
        log.debug("rows not handed over by the JVM (%s): Arrow reads the columns", why)
        return None
    width = 4 if dtype == "float32" else 8
    packer = jar.new_instance(spark, PACKER_CLASS).configure(
        f"{_KINDS[features_kind]};{width};{folder}")
    schema = T.StructType([T.StructField("path", T.StringType()),
                           T.StructField("rows", T.IntegerType(), False),
                           T.StructField("dim", T.IntegerType(), False),
                           T.StructField("bad", T.StringType()),
                           T.StructField("seconds", T.DoubleType(), False)])
    jss = spark._jsparkSession
    rdd = df._jdf.queryExecution().toRdd().toJavaRDD().mapPartitions(packer).rdd()
    jdf = jss.internalCreateDataFrame(rdd, jss.parseDataType(schema.json()), False)
    return _DataFrame(jdf, spark)


def read_rows(path: str, rows: int, dim: int, dtype: str) -> tuple[np.ndarray, np.ndarray]:
    """The features ``(rows, dim)`` and labels of one ``PackRows`` file, which is deleted."""
    try:
        with open(path, "rb") as f:
            x = np.fromfile(f, np.dtype(dtype).newbyteorder("<"), rows * dim)
            y = np.fromfile(f, np.dtype("<f8"), rows)
    finally:
        try:
            os.unlink(path)
        except FileNotFoundError:
            pass
    if x.size != rows * dim or y.size != rows:
        raise OSError(f"the rows file {path} is short: {x.size} values and {y.size} labels, "
                      f"expected {rows * dim} and {rows}")
    return x.reshape(rows, dim), y


class PackedBuild:
    """Executor side: the file ``PackRows`` wrote for one partition -> contiguous x and y."""

    def __init__(self, classification: bool, dtype: str) -> None:
        self.classification, self.dtype = classification, dtype

    def __call__(self, index: int, batches: Iterable) -> tuple[dict, ShardReport]:
        rows = [r for b in batches for r in b.to_pylist()]   # one a partition
        jvm = sum(r["seconds"] for r in rows)
        bad = [r["bad"] for r in rows if r["bad"] is not None]
        if bad:                  # no file was written (the task's end deletes any other)
            return no_rows(self.dtype), replace(refused_by_jvm(bad[0]), jvm_seconds=jvm)
        parts = [read_rows(r["path"], r["rows"], r["dim"], self.dtype) for r in rows if r["rows"]]
        if not parts:
            return no_rows(self.dtype, np.int64 if self.classification else self.dtype), \
                ShardReport(jvm_seconds=jvm)
        x, y = parts[0] if len(parts) == 1 else (np.concatenate([p[0] for p in parts]),
                                                 np.concatenate([p[1] for p in parts]))
        return finish(x, y, self.classification, self.dtype,
                      {"jvm_seconds": jvm, "x_dim": int(x.shape[1])})
