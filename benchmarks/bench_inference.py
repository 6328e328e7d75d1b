"""Batch inference throughput: sparknet's ``SparkNetClassificationModel.transform`` against
MLlib's ``MultilayerPerceptronClassificationModel.transform``, same DataFrame, same run.

Two networks, each scored on a cached DataFrame of ``--rows`` rows (default 100,000)
with an ML Vector features column:

- the digits MLP 64-64-10 on scikit-learn's digits (1,797 images, repeated);
- an MNIST MLP 784-512-256-10 on MNIST images (``--mnist`` folder; repeated).

Both models are fitted briefly first (inference cost does not depend on the weights).
The sparknet model is timed on both inference engines: ``jvm`` (Java over the rows) and
``arrow`` (Python workers, Arrow batches, Cython kernels); the table marks the one
``inferenceEngine="auto"`` picks.  A transform is forced two ways: writing all its
columns (features, label, rawPrediction, probability, prediction) to Spark's ``noop``
sink, and summing the prediction column alone.  Each model is timed ``--repeats``
times per way after one warm-up, the models taking turns, and the median (and best)
rows/s are printed with the ratio sparknet / MLlib.

Usage::

    python benchmarks/bench_inference.py [--rows 100000] [--repeats 7] [--mnist DIR]

The session is ``local[2]``; the Python workers limit BLAS to one thread each (one per
task core).  The machine is shared: numbers are noisy.
"""
from __future__ import annotations

import argparse
import os
import statistics
import sys
import time

import numpy as np

HERE = os.path.dirname(os.path.abspath(__file__))
DEFAULT_MNIST = os.path.abspath(os.path.join(HERE, "..", "..", "shared", "data", "mnist"))


def _spark(master: str):
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    os.environ.setdefault("PYSPARK_DRIVER_PYTHON", sys.executable)
    from pyspark.sql import SparkSession

    from sparknet.cluster.engine.session import DEFAULT_CONF

    builder = SparkSession.builder
    for k, v in DEFAULT_CONF.items():  # the settings sparknet's own sessions get
        builder = builder.config(k, v)
    spark = (builder.master(master).appName("sparknet-bench-inference")
             .config("spark.ui.enabled", "false")
             .config("spark.ui.showConsoleProgress", "false")
             .config("spark.driver.memory", "6g")
             .config("spark.sql.shuffle.partitions", "2")
             .config("spark.python.worker.reuse", "true")
             .config("spark.sql.execution.arrow.pyspark.enabled", "true")
             .getOrCreate())
    spark.sparkContext.setLogLevel("ERROR")
    return spark


def _frame(spark, X: np.ndarray, y: np.ndarray, rows: int, partitions: int):
    """A cached DataFrame of ``rows`` rows (X repeated), Vector features + double label."""
    import pandas as pd
    from pyspark.ml.functions import array_to_vector
    from pyspark.sql import types as T

    idx = np.arange(rows) % X.shape[0]
    schema = T.StructType([T.StructField("features", T.ArrayType(T.DoubleType()), False),
                           T.StructField("label", T.DoubleType(), False)])
    chunks = []
    step = 20_000
    for lo in range(0, rows, step):
        sel = idx[lo:lo + step]
        pdf = pd.DataFrame({"features": list(X[sel].astype(np.float64)),
                            "label": y[sel].astype(np.float64)})
        chunks.append(spark.createDataFrame(pdf, schema))
    df = chunks[0]
    for c in chunks[1:]:
        df = df.union(c)
    df = df.select(array_to_vector("features").alias("features"), "label").repartition(partitions)
    df = df.cache()
    n = df.count()
    assert n == rows, (n, rows)
    return df


def _time_models(models: dict, df, repeats: int, force: str = "noop") -> dict[str, list[float]]:
    """Seconds per forced transform of each model: one warm-up each, then the models
    take turns, so a burst of load on the shared machine hits all alike.

    ``force="noop"`` writes every output column to the ``noop`` sink;
    ``force="prediction"`` sums the prediction column only (what scoring for accuracy
    needs; Spark then prunes the columns nothing reads)."""
    from pyspark.sql import functions as F

    def run(model):
        t0 = time.perf_counter()
        out = model.transform(df)
        if force == "noop":
            out.write.format("noop").mode("overwrite").save()
        else:
            out.select(F.sum("prediction")).collect()
        return time.perf_counter() - t0

    for m in models.values():
        run(m)
    times: dict[str, list[float]] = {k: [] for k in models}
    for _ in range(repeats):
        for k, m in models.items():
            times[k].append(run(m))
    return times


def _fit_pair(spark, X, y, layers, fit_rows: int):
    """A sparknet model and an MLlib perceptron with the same layer sizes, each fitted
    briefly on ``fit_rows`` rows."""
    from pyspark.ml.classification import MultilayerPerceptronClassifier

    from sparknet import Dense, Sequential
    from sparknet.ml import SparkNetClassifier

    small = _frame(spark, X[:fit_rows], y[:fit_rows], fit_rows, 2)
    net = Sequential([Dense(h, activation="relu") for h in layers[1:-1]] +
                     [Dense(layers[-1], activation="softmax")])
    ours = SparkNetClassifier(network=net, epochs=1, numPartitions=2, learningRate=1e-3).fit(small)
    mllib = MultilayerPerceptronClassifier(layers=list(layers), maxIter=2, seed=0).fit(small)
    small.unpersist()
    return ours, mllib


def bench(spark, name, X, y, layers, rows, repeats, partitions):
    ours, mllib = _fit_pair(spark, X, y, layers, min(2000, X.shape[0]))
    df = _frame(spark, X, y, rows, partitions)
    models = {"mllib": mllib}
    for engine in ("jvm", "arrow"):
        models[engine] = ours.copy({ours.inferenceEngine: engine})
    # the columns are there and typed alike (both argmax a softmax; only the weights
    # differ, so the values are not compared)
    a, b = ours.transform(df.limit(5)), mllib.transform(df.limit(5))
    auto = ours.lastInferenceEngine
    for col in ("rawPrediction", "probability", "prediction"):
        assert a.schema[col].dataType == b.schema[col].dataType, col
    t_all = _time_models(models, df, repeats)
    t_pred = _time_models(models, df, repeats, force="prediction")
    df.unpersist()
    med = {k: rows / statistics.median(v) for k, v in t_all.items()}
    best = {k: rows / min(v) for k, v in t_all.items()}
    pred = {k: rows / statistics.median(v) for k, v in t_pred.items()}
    res = {"name": name, "rows": rows, "auto": auto, "median": med, "best": best, "pred": pred}
    for engine in ("jvm", "arrow"):
        print(f"{name}, {engine} engine{' (auto picks it)' if engine == auto else ''}: "
              f"{med[engine]:,.0f} rows/s (best {best[engine]:,.0f}), MLlib {med['mllib']:,.0f} "
              f"rows/s (best {best['mllib']:,.0f}): ratio {med[engine] / med['mllib']:.2f}x "
              f"(best/best {best[engine] / best['mllib']:.2f}x); prediction only "
              f"{pred[engine] / pred['mllib']:.2f}x", flush=True)
    return res


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--rows", type=int, default=100_000)
    ap.add_argument("--repeats", type=int, default=7)
    ap.add_argument("--partitions", type=int, default=2)
    ap.add_argument("--master", default="local[2]")
    ap.add_argument("--mnist", default=DEFAULT_MNIST, help="folder of the MNIST IDX files")
    ap.add_argument("--only", choices=("digits", "mnist"), default=None)
    args = ap.parse_args(argv)
    from _machine import machine_header  # benchmarks/_machine.py, next to this script
    print(machine_header(), flush=True)

    from sparknet.datasets import load_digits, load_mnist

    print(f"OPENBLAS_CORETYPE={os.environ.get('OPENBLAS_CORETYPE', '(unset)')} "
          f"OPENBLAS_L2_SIZE={os.environ.get('OPENBLAS_L2_SIZE', '(unset)')} "
          f"OPENBLAS_NUM_THREADS={os.environ.get('OPENBLAS_NUM_THREADS', '(unset)')}", flush=True)
    spark = _spark(args.master)
    results = []
    try:
        if args.only in (None, "digits"):
            X, y, _, _ = load_digits(test_size=0.01)
            results.append(bench(spark, "digits MLP 64-64-10", X, y, (64, 64, 10), args.rows,
                                 args.repeats, args.partitions))
        if args.only in (None, "mnist"):
            if os.path.isdir(args.mnist):
                X, y, _, _ = load_mnist(args.mnist)
                results.append(bench(spark, "MNIST MLP 784-512-256-10", X, y, (784, 512, 256, 10),
                                     args.rows, args.repeats, args.partitions))
            else:
                print(f"MNIST not found at {args.mnist}: skipping the 784-512-256-10 case "
                      f"(pass --mnist DIR)")
    finally:
        spark.stop()
    print()
    print("| network | engine | rows/s (median / best) | MLlib rows/s (median / best) "
          "| ratio (median) | prediction only: ratio |")
    print("|---|---|---:|---:|---:|---:|")
    for r in results:
        med, best, pred = r["median"], r["best"], r["pred"]
        for engine in ("jvm", "arrow"):
            tag = f"{engine} (auto)" if engine == r["auto"] else engine
            print(f"| {r['name']} | {tag} | {med[engine]:,.0f} / {best[engine]:,.0f} | "
                  f"{med['mllib']:,.0f} / {best['mllib']:,.0f} | {med[engine] / med['mllib']:.2f}x "
                  f"| {pred[engine] / pred['mllib']:.2f}x |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
