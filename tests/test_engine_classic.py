"""What saving, loading and scoring ask of a Classic session's engine: the Hadoop
``FileSystem`` of a path, a value for a scoring UDF's tasks (a broadcast), and no job of the
engine's own (the executors' import check is a fit's)."""
from __future__ import annotations

import numpy as np
from pyspark import Broadcast

from sparknet.cluster.engine import workers
from sparknet.cluster.engine.base import engine_for


def test_a_save_or_a_transform_gets_the_engine_without_the_fits_worker_check(spark):
    app = str(spark.sparkContext.applicationId)
    workers._CHECKED.discard(app)                  # as in a new application
    engine = engine_for(spark, fit=False)
    assert engine.kind == "classic" and engine.sc is spark.sparkContext
    assert app not in workers._CHECKED
    engine_for(spark)                              # a fit's: checked once per application
    assert app in workers._CHECKED


def test_the_filesystem_of_a_path_and_a_value_for_a_udf(spark, tmp_path):
    engine = engine_for(spark, fit=False)
    where = engine.filesystem(str(tmp_path / "stage"))
    assert where is not None
    assert where.path.toString() == f"file:{tmp_path / 'stage'}"
    assert not where.fs.exists(where.path)
    (tmp_path / "stage").mkdir()
    assert where.fs.exists(where.path)
    assert where.jvm.org.apache.hadoop.fs.Path(where.path, "data").getName() == "data"
    vec = np.arange(5.0)
    shipped = engine.ship_to_udf(vec)
    try:
        assert isinstance(shipped, Broadcast)
        sums = spark.sparkContext.parallelize(range(2), 2).map(lambda _: float(shipped.value.sum()))
        assert sums.collect() == [10.0, 10.0]
    finally:
        shipped.destroy()
