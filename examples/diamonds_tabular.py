"""Diamond prices on Spark: categorical columns embedded, one-hot, and gradient-boosted trees.

    python examples/diamonds_tabular.py [--csv ../shared/data/diamonds/diamonds.csv]
                                        [--epochs 20] [--master local[2]] [--quick]

Reads the diamonds CSV (53,940 rows: carat, cut, color, clarity, depth, table, price, x, y,
z) into a Spark DataFrame and predicts ``log(price)`` on a seeded 80/20 split
(``randomSplit``).  ``StringIndexer`` turns cut, color and clarity into category ids and
``StandardScaler`` standardises the six numeric columns; then three regressors are fitted
on the same training rows:

- ``embedding``: :class:`~sparknet.ml.SparkNetRegressor` with ``ColumnEmbedding`` (a
  4-wide learned vector per category) -> ``Dense(64, relu)`` -> ``Dense(1)``, reading the
  ``VectorAssembler`` vector ``[cut id, color id, clarity id, 6 scaled numbers]``;
- ``one-hot``: the same network after ``OneHotEncoder`` (``Dense(64, relu)`` ->
  ``Dense(1)`` on ``[one-hot cut, color, clarity, 6 scaled numbers]``);
- ``gbt``: MLlib's ``GBTRegressor`` on the id vector (the ids carry StringIndexer's nominal
  metadata, so the trees split on them as categories).

Prints the held-out RMSE of log price of each, and which wins by how much.  The labels
are centred on the training mean (RMSE does not change; the networks' last bias starts
near the answer).  ``--quick`` runs a 10% subsample for one epoch (and 10 boosting rounds):
a check that everything runs, not a comparison.
"""
from __future__ import annotations

import argparse
import os
import sys
import time
from pathlib import Path

DEFAULT_CSV = Path(__file__).resolve().parents[2] / "shared" / "data" / "diamonds" / "diamonds.csv"
CATEGORICAL = ["cut", "color", "clarity"]
NUMERIC = ["carat", "depth", "table", "x", "y", "z"]


def spark_session(master: str):
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)   # the workers run this Python
    from pyspark.sql import SparkSession

    spark = (SparkSession.builder.master(master).appName("diamonds-tabular")
             .config("spark.ui.enabled", "false")
             .config("spark.ui.showConsoleProgress", "false")
             .config("spark.sql.shuffle.partitions", "4")
             .config("spark.sql.execution.arrow.pyspark.enabled", "true")
             .getOrCreate())
    spark.sparkContext.setLogLevel("ERROR")
    return spark


def load(spark, csv: Path, fraction: float, seed: int):
    """``(train, test, train mean of log price)``: the rows with ``label = log(price) - mean``."""
    from pyspark.sql import functions as F

    df = spark.read.csv(str(csv), header=True, inferSchema=True)
    df = df.select(*CATEGORICAL, *(F.col(c).cast("double") for c in NUMERIC),
                   F.log(F.col("price").cast("double")).alias("log_price"))
    if fraction < 1.0:
        df = df.sample(withReplacement=False, fraction=fraction, seed=seed)
    train, test = df.randomSplit([0.8, 0.2], seed=seed)
    train, test = train.cache(), test.cache()
    mean = train.agg(F.avg("log_price")).first()[0]
    label = (F.col("log_price") - F.lit(mean)).alias("label")
    return train.select("*", label), test.select("*", label), mean


def features(train):
    """The fitted feature stages: ids, scaled numbers, the id vector and the one-hot vector,
    and the cardinality of each categorical column (unseen labels get one more id)."""
    from pyspark.ml import Pipeline
    from pyspark.ml.feature import OneHotEncoder, StandardScaler, StringIndexer, VectorAssembler

    ids = [f"{c}_id" for c in CATEGORICAL]
    onehot = [f"{c}_onehot" for c in CATEGORICAL]
    indexer = StringIndexer(inputCols=CATEGORICAL, outputCols=ids, handleInvalid="keep")
    stages = [
        indexer,
        VectorAssembler(inputCols=NUMERIC, outputCol="numeric_raw"),
        StandardScaler(inputCol="numeric_raw", outputCol="numeric", withMean=True, withStd=True),
        VectorAssembler(inputCols=[*ids, "numeric"], outputCol="features"),
        OneHotEncoder(inputCols=ids, outputCols=onehot, dropLast=False),
        VectorAssembler(inputCols=[*onehot, "numeric"], outputCol="features_onehot"),
    ]
    prep = Pipeline(stages=stages).fit(train)
    cards = [len(labels) + 1 for labels in prep.stages[0].labelsArray]
    return prep, cards


def networks(cards: list[int], seed: int):
    from sparknet import ColumnEmbedding, Dense, Sequential

    embedded = Sequential([ColumnEmbedding([0, 1, 2], cards, 4),     # ids at positions 0, 1, 2
                           Dense(64, activation="relu"), Dense(1)], seed=seed)
    onehot = Sequential([Dense(64, activation="relu"), Dense(1)], seed=seed)
    return embedded, onehot


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--csv", type=Path, default=DEFAULT_CSV, help="the diamonds CSV file")
    ap.add_argument("--epochs", type=int, default=20)
    ap.add_argument("--batch-size", type=int, default=64)
    ap.add_argument("--lr", type=float, default=3e-3)
    ap.add_argument("--gbt-iters", type=int, default=100, help="GBTRegressor boosting rounds")
    ap.add_argument("--partitions", type=int, default=2)
    ap.add_argument("--local-steps", type=int, default=0,
                    help="local steps per round of model averaging (0: sized automatically)")
    ap.add_argument("--master", default="local[2]")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--quick", action="store_true",
                    help="a 10%% subsample, 1 epoch, 10 boosting rounds: checks that it runs")
    args = ap.parse_args(argv)
    if not args.csv.exists():
        sys.exit(f"{args.csv} not found: pass the diamonds CSV with --csv PATH")
    fraction, epochs, iters = (0.1, 1, 10) if args.quick else (1.0, args.epochs, args.gbt_iters)

    from pyspark.ml.evaluation import RegressionEvaluator
    from pyspark.ml.regression import GBTRegressor

    from sparknet.ml import SparkNetRegressor

    spark = spark_session(args.master)
    train, test, mean = load(spark, args.csv, fraction, args.seed)
    prep, cards = features(train)
    train_f, test_f = prep.transform(train).cache(), prep.transform(test).cache()
    print(f"{train_f.count():,} training rows, {test_f.count():,} held out; "
          f"categories per column (+1 unseen): {dict(zip(CATEGORICAL, cards))}; "
          f"mean log price {mean:.3f}")

    embedded, onehot = networks(cards, args.seed)
    common = dict(labelCol="label", epochs=epochs, batchSize=args.batch_size, learningRate=args.lr,
                  optimizer="adam", numPartitions=args.partitions, localSteps=args.local_steps,
                  seed=args.seed)
    regressors = {
        "embedding": SparkNetRegressor(network=embedded, featuresCol="features",
                                       predictionCol="pred_embedding", **common),
        "one-hot": SparkNetRegressor(network=onehot, featuresCol="features_onehot",
                                     predictionCol="pred_onehot", **common),
        "gbt": GBTRegressor(featuresCol="features", labelCol="label", predictionCol="pred_gbt",
                            maxIter=iters, maxDepth=6, seed=args.seed),
    }
    rmse: dict[str, float] = {}
    for name, reg in regressors.items():
        t0 = time.perf_counter()
        model = reg.fit(train_f)
        elapsed = time.perf_counter() - t0
        evaluator = RegressionEvaluator(labelCol="label", predictionCol=reg.getPredictionCol(),
                                        metricName="rmse")
        rmse[name] = evaluator.evaluate(model.transform(test_f))
        print(f"{name:>10}: held-out RMSE of log price {rmse[name]:.4f} (fit {elapsed:.1f} s)")

    ranked = sorted(rmse, key=rmse.__getitem__)
    best, second = ranked[0], ranked[1]
    gap = rmse[second] - rmse[best]
    print(f"{best} wins: RMSE {rmse[best]:.4f}, {gap:.4f} below {second} "
          f"({100 * gap / rmse[second]:.1f}% lower), {rmse[ranked[2]] - rmse[best]:.4f} below "
          f"{ranked[2]}")
    if args.quick:
        print("(--quick: a subsample and one epoch; run without it for the comparison)")
    spark.stop()


if __name__ == "__main__":
    main()
