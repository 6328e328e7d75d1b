"""A DataFrame's rows handed to the shard build by the JVM through a local file
(``sparknet/jvm/PackRows.java``, ``cluster/data/packed_rows.py``): the same shards as the Arrow path,
bit for bit, the same errors for bad rows, and no file left behind."""
from __future__ import annotations

import glob
import os
import tempfile

import numpy as np
import pytest

from sparknet.cluster.data import packed_rows as packed
from sparknet.cluster.data import sharding as data_mod
from sparknet.ml import _jvm


@pytest.fixture(scope="module")
def jvm(spark):
    why = _jvm.unavailable(spark)
    if why is not None:
        pytest.skip(f"the JVM path needs javac: {why}")
    return spark


def _rows_files() -> set[str]:
    return set(glob.glob("/dev/shm/sparknet-rows-*"))


def _shards(spark, df, dtype, monkeypatch, pack: bool, classification=True):
    """The resident (x, y) of every partition, through the packed or the Arrow path."""
    monkeypatch.setenv("SPARKNET_PACK_ROWS", "1" if pack else "0")
    d = data_mod.shard_data(df, sc=spark.sparkContext, num_partitions=None, dtype=dtype,
                            classification=classification, name=f"packed-{pack}")
    try:
        return d.resident.map(lambda i, s: (i, np.array(s["x"]), np.array(s["y"])))
    finally:
        d.close()


def _frame(spark, rows, schema, partitions=3):
    return spark.createDataFrame(rows, schema).repartition(partitions).cache()


def _cases(spark, X, y):
    from pyspark.ml.linalg import Vectors, VectorUDT
    from pyspark.sql import types as T

    sparse = [Vectors.sparse(len(a), {j: float(v) for j, v in enumerate(a) if v}) for a in X]
    vec = T.StructType([T.StructField("features", VectorUDT()), T.StructField("label", T.LongType())])
    return {
        "dense vector": _frame(spark, [(Vectors.dense(a), int(b)) for a, b in zip(X, y)], vec),
        "sparse vector": _frame(spark, list(zip(sparse, map(int, y))), vec),
        "array<float>": _frame(spark, [(a.astype(np.float32).tolist(), float(b)) for a, b in zip(X, y)],
                               "features array<float>, label double"),
        "array<double>": _frame(spark, [(a.tolist(), int(b)) for a, b in zip(X, y)],
                                "features array<double>, label int"),
        "array<int>": _frame(spark, [(a.astype(int).tolist(), int(b)) for a, b in zip(X, y)],
                             "features array<int>, label bigint"),
    }


@pytest.mark.slow
def test_packed_shards_equal_the_arrow_paths(jvm, digits, monkeypatch):
    before = _rows_files()
    X, y, _, _ = digits
    X, y = X[:700] * 1.37, y[:700]          # not integers: float32 rounding shows
    for name, df in _cases(jvm, X, y).items():
        dtype = np.float64 if name == "array<double>" else np.float32
        a = _shards(jvm, df, dtype, monkeypatch, pack=False)
        b = _shards(jvm, df, dtype, monkeypatch, pack=True)
        assert [i for i, _, _ in a] == [i for i, _, _ in b] == [0, 1, 2], name
        for (_, xa, ya), (_, xb, yb) in zip(a, b):
            assert xb.dtype == xa.dtype == dtype and xb.shape == xa.shape and xa.shape[1] == 64, name
            np.testing.assert_array_equal(xb, xa, err_msg=name)
            np.testing.assert_array_equal(yb, ya, err_msg=name)
        assert sum(len(yb) for _, _, yb in b) == 700
        df.unpersist()
    assert _rows_files() <= before, "a rows file was left behind"


@pytest.mark.slow
def test_packed_partitions_larger_than_a_write_piece_equal_the_arrow_path(jvm, monkeypatch):
    """Partitions of 9.7-19 MB (several 4 MB pieces of PackRows' staging buffer, rows of 97
    values that do not divide a piece) in float32 and float64, from a Vector column as a
    user builds it (``array_to_vector``): the same values, bit for bit, as Arrow's."""
    import pyarrow as pa
    from pyspark.ml.functions import array_to_vector
    from pyspark.sql import functions as F

    before = _rows_files()
    rng = np.random.default_rng(7)
    n, dim = 50_000, 97
    X = rng.standard_normal((n, dim))
    flat = pa.FixedSizeListArray.from_arrays(pa.array(X.reshape(-1)), dim).cast(pa.list_(pa.float64()))
    df = jvm.createDataFrame(pa.table({"f": flat, "label": pa.array(rng.integers(0, 10, n).astype(np.float64))}))
    df = df.select(array_to_vector(F.col("f")).alias("features"), "label").repartition(2).cache()
    for dtype in (np.float32, np.float64):
        a = _shards(jvm, df, dtype, monkeypatch, pack=False)
        b = _shards(jvm, df, dtype, monkeypatch, pack=True)
        assert [len(ya) for _, _, ya in a] == [len(yb) for _, _, yb in b] and sum(len(yb) for _, _, yb in b) == n
        for (_, xa, ya), (_, xb, yb) in zip(a, b):
            assert xb.dtype == dtype and xb.nbytes > 2 * (4 << 20)
            np.testing.assert_array_equal(xb, xa)
            np.testing.assert_array_equal(yb, ya)
        rows = np.concatenate([xb for _, xb, _ in b]).astype(np.float64)
        ref = X.astype(dtype).astype(np.float64)
        key = lambda m: np.lexsort(m.T[::-1])  # noqa: E731 (the rows in any partition order)
        np.testing.assert_array_equal(rows[key(rows)], ref[key(ref)])
    df.unpersist()
    assert _rows_files() <= before, "a rows file was left behind"


def test_packed_regression_labels_and_order(jvm, monkeypatch):
    """Row order within a partition is kept, and float labels pass unchanged."""
    rows = [([float(i), -float(i)], i * 0.5) for i in range(50)]
    df = jvm.createDataFrame(rows, "features array<double>, label double").coalesce(1).cache()
    (i, x, y), = _shards(jvm, df, np.float64, monkeypatch, pack=True, classification=False)
    np.testing.assert_array_equal(x, np.array([r[0] for r in rows]))
    np.testing.assert_array_equal(y, np.arange(50) * 0.5)


@pytest.mark.parametrize("rows, message", [
    ([([1.0, 2.0], 0), (None, 1), ([3.0, 4.0], 1)], "has a null vector (partition 0, row 1)"),
    ([([1.0, 2.0], 0), ([1.0, 2.0], 1), ([3.0], 1)],
     "holds vectors of different lengths (1 and 2; first odd one at partition 0, row 2)"),
    ([([1.0, 2.0], 0), ([1.0, 2.0], None)], "label column 'label' has a null value (partition 0, row 1)"),
    ([([1.0, float("nan")], 0)], "contains nan (NaN or infinity) at partition 0, row 0, element 1"),
])
def test_packed_bad_rows_get_the_arrow_paths_errors(jvm, monkeypatch, rows, message):
    df = jvm.createDataFrame(rows, "features array<double>, label int").coalesce(1)
    before = _rows_files()
    for pack in (False, True):
        monkeypatch.setenv("SPARKNET_PACK_ROWS", "1" if pack else "0")
        with pytest.raises(ValueError) as err:
            data_mod.shard_data(df, sc=jvm.sparkContext, num_partitions=None, name="bad")
        assert message in str(err.value), (pack, str(err.value))
    assert _rows_files() <= before, "a rows file was left behind"


def test_a_null_vector_row_is_named_by_its_row_on_both_paths(jvm, monkeypatch):
    """A null Vector (features, or a regressor's label) is refused with its column, partition
    and row and a hint to drop the null rows, on the Arrow path (where Spark's
    ``vector_to_array`` would fail on it) as on the packed one; no rows file is left."""
    from pyspark.ml.linalg import Vectors, VectorUDT
    from pyspark.sql import types as T

    vec = T.StructType([T.StructField("features", VectorUDT()), T.StructField("label", T.DoubleType())])
    df = jvm.createDataFrame([(Vectors.dense([1.0, 2.0]), 0.0), (None, 1.0),
                              (Vectors.dense([3.0, 4.0]), 1.0)], vec).coalesce(1)
    before = _rows_files()
    for pack in (False, True):
        monkeypatch.setenv("SPARKNET_PACK_ROWS", "1" if pack else "0")
        with pytest.raises(ValueError) as err:
            data_mod.shard_data(df, sc=jvm.sparkContext, num_partitions=None, name="null-vector")
        assert str(err.value) == ("training data: features column 'features' has a null vector "
                                  "(partition 0, row 1); drop or fill the null rows first, "
                                  "e.g. df.na.drop()"), pack
    labels = T.StructType([T.StructField("features", VectorUDT()), T.StructField("label", VectorUDT())])
    df = jvm.createDataFrame([(Vectors.dense([1.0, 2.0]), Vectors.dense([0.5, 1.0])),
                              (Vectors.dense([3.0, 4.0]), None)], labels).coalesce(1)
    with pytest.raises(ValueError, match=r"^training data: label column 'label' has a null value "
                                         r"\(partition 0, row 1\); drop or fill .*df\.na\.drop\(\)$"):
        data_mod.shard_data(df, sc=jvm.sparkContext, num_partitions=None, classification=False,
                            name="null-label")
    assert _rows_files() <= before, "a rows file was left behind"


def test_read_rows_deletes_its_file_and_refuses_a_short_one():
    with tempfile.NamedTemporaryFile(delete=False, suffix=".bin") as f:
        np.arange(6, dtype="<f4").tofile(f)
        np.array([1.0, 2.0], "<f8").tofile(f)
    x, y = packed.read_rows(f.name, 2, 3, "float32")
    np.testing.assert_array_equal(x, np.arange(6, dtype=np.float32).reshape(2, 3))
    np.testing.assert_array_equal(y, [1.0, 2.0])
    assert not os.path.exists(f.name)
    with tempfile.NamedTemporaryFile(delete=False, suffix=".bin") as f:
        np.arange(5, dtype="<f4").tofile(f)
    with pytest.raises(OSError, match="is short: 5 values and 0 labels, expected 6 and 2"):
        packed.read_rows(f.name, 2, 3, "float32")
    assert not os.path.exists(f.name)


def test_switched_off_or_without_a_jvm_there_is_no_packing(jvm, monkeypatch):
    df = jvm.createDataFrame([([1.0], 0)], "features array<double>, label int")
    monkeypatch.setenv("SPARKNET_PACK_ROWS", "0")
    assert packed.packed_columns(df, "double", "float32") is None
    monkeypatch.setenv("SPARKNET_PACK_ROWS", "1")
    assert packed.packed_columns(df, "double", "float32") is not None


def test_a_task_that_fails_before_reading_leaves_no_rows_file(jvm):
    """The Python side dies before reading the file: the end of the task deletes it."""
    df = jvm.createDataFrame([([1.0, 2.0], 0), ([3.0, 4.0], 1)], "features array<double>, label int")
    sel = df.coalesce(1).selectExpr("features as x", "cast(label as double) as y")  # as a fit selects
    rows = packed.packed_columns(sel, "double", "float32")

    def fail(batches):
        for b in batches:
            raise RuntimeError(f"failed with the file unread: {b.column(0)[0]}")
        yield from ()

    before = _rows_files()
    with pytest.raises(Exception, match="failed with the file unread: /"):
        rows.mapInArrow(fail, "x long").collect()
    assert _rows_files() <= before, "the failed task's rows file was left behind"
