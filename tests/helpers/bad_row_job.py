"""What a user does with a bad row, as a program of its own (so that its console can be read):
a session built by hand, a fitted classifier's Model, a DataFrame with one row of 63 values
where the network takes 64, ``transform`` then ``collect``.

Usage: python bad_row_job.py ENGINE [ENGINE ...] [debug ENGINE [ENGINE ...]]
(``jvm``, ``arrow``)

For each engine before ``debug`` it prints to stdout ``CAUGHT <engine> <module.Class>:
<message>`` (or ``NO ERROR <engine>``).  Then, as a control, a user's own UDF fails: the line
``CONTROL`` is written to stderr first, so that what Spark prints about that failure can be
told apart from the rest, and ``CAUGHT control <module.Class>`` goes to stdout.

With ``debug``, the line ``DEBUG`` is written to stderr next, the log4j logger
``sparknet.tasks`` (where the traces of the failed tasks go) is set to DEBUG, and the engines
after ``debug`` score the bad row again (``CAUGHT debug-<engine> ...`` on stdout): the same
session, so one Spark start serves both the console check and the debug-level one.
"""
from __future__ import annotations

import sys

import numpy as np
from pyspark.ml.linalg import Vectors
from pyspark.sql import SparkSession
from pyspark.sql import functions as F

from sparknet import Dense, Sequential
from sparknet.ml import SparkNetClassificationModel


def _score(model: SparkNetClassificationModel, df, engine: str, label: str) -> None:
    scored = model.copy({model.inferenceEngine: engine}).transform(df)
    try:
        scored.collect()
    except Exception as exc:  # noqa: BLE001 - what reached the user is the result
        kind = f"{type(exc).__module__}.{type(exc).__qualname__}"
        print(f"CAUGHT {label} {kind}: {exc}", flush=True)
    else:
        print(f"NO ERROR {label}", flush=True)


def main(args: list[str]) -> None:
    engines, debug = (args[:args.index("debug")], args[args.index("debug") + 1:]) \
        if "debug" in args else (args, [])
    spark = (SparkSession.builder.master("local[2]").appName("bad-row")
             .config("spark.ui.enabled", "false").config("spark.ui.showConsoleProgress", "false")
             .getOrCreate())
    net = Sequential([Dense(16, activation="relu"), Dense(10, activation="softmax")])
    net.build((64,))
    net.params[...] = np.random.default_rng(0).normal(0, 0.3, net.params.shape)
    model = SparkNetClassificationModel.from_network(net)
    good = [float(i % 7) for i in range(64)]
    df = spark.createDataFrame([(Vectors.dense(good),), (Vectors.dense(good[:63]),)], ["features"])
    for engine in engines:
        _score(model, df, engine, engine)

    def fails(v):
        raise ZeroDivisionError(f"the user's own UDF failed on {v}")

    print("CONTROL", file=sys.stderr, flush=True)
    try:
        spark.range(2).select(F.udf(fails, "double")("id")).collect()
    except Exception as exc:  # noqa: BLE001 - an error of the user's code: pyspark's own
        print(f"CAUGHT control {type(exc).__module__}.{type(exc).__qualname__}", flush=True)
    if debug:
        print("DEBUG", file=sys.stderr, flush=True)
        log4j = spark.sparkContext._jvm.org.apache.logging.log4j
        log4j.core.config.Configurator.setLevel("sparknet.tasks", log4j.Level.DEBUG)
        for engine in debug:
            _score(model, df, engine, f"debug-{engine}")
    spark.stop()


if __name__ == "__main__":
    main(sys.argv[1:])
