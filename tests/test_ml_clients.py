"""The Spark ML Models driven by the tools a Spark team already uses: dotted column names,
BinaryClassificationEvaluator on rawPrediction, a tuning run sharing one checkpointDir,
Structured Streaming with Spark's default settings; and the Estimators' console and history."""
from __future__ import annotations

import os

import numpy as np
import pytest

pytest.importorskip("pyspark")

from pyspark.ml.linalg import Vectors  # noqa: E402

from sparknet import Dense, Sequential  # noqa: E402

FEATURES = "pix.vec"   # a dot in the name: a column, not a struct field


def _binary_rows(n: int = 240, seed: int = 0):
    rng = np.random.default_rng(seed)
    X = rng.normal(size=(n, 6))
    y = (X[:, 0] + 0.5 * X[:, 1] + rng.normal(scale=0.8, size=n) > 0).astype(float)
    return X, y


@pytest.fixture(scope="module")
def binary_df(spark):
    X, y = _binary_rows()
    return spark.createDataFrame([(Vectors.dense(x), float(t)) for x, t in zip(X, y)], [FEATURES, "label"]).cache()


def _classifier(**kw):
    from sparknet.ml import SparkNetClassifier

    net = Sequential([Dense(8, activation="relu"), Dense(2, activation="softmax")], seed=0)
    return SparkNetClassifier(network=net, featuresCol=FEATURES, **{"epochs": 2, "numPartitions": 2, **kw})


@pytest.fixture(scope="module")
def fitted(binary_df):
    return _classifier(inferenceEngine="arrow", learningRate=1e-2).fit(binary_df)


def test_estimators_show_progress_by_default_and_keep_their_history(binary_df, capfd, tmp_path):
    from sparknet.ml import SparkNetClassificationModel

    est = _classifier()
    assert est.getVerbose() == 1
    model = est.fit(binary_df)                 # a dotted features column, in fit
    err = capfd.readouterr().err
    assert "epoch 2/2 - " in err and "loss: " in err and "accuracy: " in err, err[-2000:]
    assert model.history is not None and len(model.history["loss"]) == 2
    path = str(tmp_path / "m")
    model.write().save(path)
    loaded = SparkNetClassificationModel.load(path)
    assert loaded.history is not None and loaded.history["loss"] == model.history["loss"]
    _classifier(verbose=0).fit(binary_df)
    err = capfd.readouterr().err
    assert "epoch" not in err and "loss" not in err


def test_dotted_column_names_score_on_both_engines(fitted, binary_df):
    arrow = fitted.transform(binary_df).select("rawPrediction", "prediction").collect()
    assert fitted.lastInferenceEngine == "arrow"
    jvm = fitted.copy().setInferenceEngine("jvm")
    rows = jvm.transform(binary_df).select("rawPrediction", "prediction").collect()
    assert jvm.lastInferenceEngine == "jvm"
    # the JVM engine computes in float64, the Arrow engine in the network's float32
    np.testing.assert_allclose([r[0].toArray() for r in rows], [r[0].toArray() for r in arrow], rtol=1e-5,
                               atol=1e-6)
    assert [r[1] for r in rows] == [r[1] for r in arrow]


def test_binary_evaluator_ranks_by_the_margin(fitted, binary_df):
    """MLlib's convention: rawPrediction = [-m, m] with m the log-odds of class 1, so the
    evaluator's default (areaUnderROC on rawPrediction[1]) is the model's true AUC."""
    from pyspark.ml.evaluation import BinaryClassificationEvaluator

    out = fitted.transform(binary_df).select("label", "rawPrediction", "probability").toPandas()
    raw = np.stack([v.toArray() for v in out["rawPrediction"]])
    prob = np.stack([v.toArray() for v in out["probability"]])
    np.testing.assert_allclose(raw[:, 0], -raw[:, 1])
    np.testing.assert_allclose(raw[:, 1], np.log(prob[:, 1] / prob[:, 0]), rtol=1e-6, atol=1e-9)
    labels = out["label"].to_numpy()
    pos, neg = prob[labels == 1, 1], prob[labels == 0, 1]
    true_auc = ((pos[:, None] > neg[None, :]).sum() + 0.5 * (pos[:, None] == neg[None, :]).sum()) / (
        len(pos) * len(neg))
    auc = BinaryClassificationEvaluator(labelCol="label").evaluate(fitted.transform(binary_df))
    assert auc == pytest.approx(true_auc, abs=1e-9)
    np.testing.assert_allclose(fitted.predictRaw(Vectors.dense(_binary_rows()[0][0])).toArray(), raw[0],
                               rtol=1e-6)


def test_each_fit_of_a_tuning_run_gets_its_own_checkpoint_folder(binary_df, tmp_path):
    from pyspark.ml.evaluation import MulticlassClassificationEvaluator
    from pyspark.ml.tuning import ParamGridBuilder, TrainValidationSplit

    folder = str(tmp_path / "ckpt")
    est = _classifier(epochs=1, checkpointDir=folder, verbose=0)
    grid = ParamGridBuilder().addGrid(est.learningRate, [1e-3, 1e-2]).build()
    TrainValidationSplit(estimator=est, estimatorParamMaps=grid, evaluator=MulticlassClassificationEvaluator(),
                         parallelism=2, seed=0).fit(binary_df)
    subs = sorted(d for d in os.listdir(folder) if d.startswith(est.uid))
    assert subs == [f"{est.uid}_fit1_params0", f"{est.uid}_fit1_params1"]
    for d in subs:
        assert [f for f in os.listdir(os.path.join(folder, d)) if f.startswith("ckpt-")], d


def test_a_streaming_dataframe_is_scored_with_default_settings(spark, fitted, binary_df, tmp_path):
    """A file source stream with a Vector column, Spark's defaults (columnar Arrow input on),
    written to a memory sink: the scores equal those of the batch DataFrame."""
    assert spark.conf.get("spark.sql.execution.arrow.pythonUDF.columnarInput.enabled") == "true"
    src = str(tmp_path / "in")
    binary_df.write.parquet(src)
    stream = spark.readStream.schema(binary_df.schema).parquet(src)
    query = (fitted.transform(stream).select(f"`{FEATURES}`", "rawPrediction", "probability", "prediction")
             .writeStream.format("memory").queryName("sparknet_scored").trigger(availableNow=True).start())
    try:
        query.awaitTermination(300)
        assert query.exception() is None
        got = spark.sql("SELECT * FROM sparknet_scored").toPandas()
    finally:
        query.stop()
    want = fitted.transform(binary_df).select(f"`{FEATURES}`", "rawPrediction", "prediction").toPandas()
    assert len(got) == len(want)

    def by_row(df):
        order = np.lexsort(np.stack([v.toArray() for v in df[FEATURES]]).T)
        return np.stack([v.toArray() for v in df["rawPrediction"]])[order], df["prediction"].to_numpy()[order]
    (raw_got, pred_got), (raw_want, pred_want) = by_row(got), by_row(want)
    np.testing.assert_allclose(raw_got, raw_want, rtol=1e-12)
    np.testing.assert_array_equal(pred_got, pred_want)
