"""Driver program for the JVM-engine test on a standalone cluster (run in its own process,
so it can own a SparkContext on the standalone master).

Usage: python tests/helpers/ml_jvm_standalone_job.py MASTER_URL

Scores scikit-learn's digits with a 64-32-10 network on the JVM engine (the executors, in
their own JVMs, fetch the jar the driver added) and on the Arrow engine; prints one JSON
line ``RESULT {...}``.
"""
from __future__ import annotations

import json
import os
import sys


def main() -> int:
    master = sys.argv[1]
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    import numpy as np
    from pyspark.ml.linalg import Vectors
    from pyspark.sql import SparkSession

    from sparknet import Dense, Sequential
    from sparknet.datasets import load_digits
    from sparknet.ml import SparkNetClassificationModel

    spark = (SparkSession.builder.master(master).appName("sparknet-ml-jvm-standalone")
             .config("spark.ui.enabled", "false")
             .config("spark.driver.host", "127.0.0.1").config("spark.driver.bindAddress", "127.0.0.1")
             .config("spark.executor.cores", "1").config("spark.executor.memory", "512m")
             .getOrCreate())
    spark.sparkContext.setLogLevel("ERROR")
    try:
        X, y, _, _ = load_digits()
        df = spark.createDataFrame([(Vectors.dense(x),) for x in X[:600].astype(float)],
                                   ["features"]).repartition(4).cache()
        df.count()
        net = Sequential([Dense(32, activation="relu"), Dense(10, activation="softmax")])
        net.build((64,))
        net.params[...] = np.random.default_rng(0).normal(0, 0.3, net.params.shape)
        model = SparkNetClassificationModel.from_network(net)
        out = {}
        for engine in ("jvm", "arrow"):
            m = model.copy({model.inferenceEngine: engine})
            rows = m.transform(df).select("rawPrediction", "prediction").collect()
            out[engine] = {"engine": m.lastInferenceEngine,
                           "raw": [r[0].toArray().tolist() for r in rows],
                           "pred": [r[1] for r in rows]}
        hosts = spark.sparkContext._jsc.sc().getExecutorMemoryStatus().size()
        print("RESULT " + json.dumps({"engines": [out[e]["engine"] for e in ("jvm", "arrow")],
                                      "raw_jvm": out["jvm"]["raw"], "raw_arrow": out["arrow"]["raw"],
                                      "pred_jvm": out["jvm"]["pred"], "pred_arrow": out["arrow"]["pred"],
                                      "block_managers": hosts}), flush=True)
    finally:
        spark.stop()
    return 0


if __name__ == "__main__":
    sys.exit(main())
