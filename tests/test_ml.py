"""Spark ML integration (sparknet.ml) on real local Spark and scikit-learn's digits."""
from __future__ import annotations

import json
import os
import time

import numpy as np
import pytest

pytest.importorskip("pyspark")

from pyspark.ml import Pipeline, PipelineModel  # noqa: E402
from pyspark.ml.classification import LogisticRegression  # noqa: E402
from pyspark.ml.evaluation import (  # noqa: E402
    BinaryClassificationEvaluator,
    MulticlassClassificationEvaluator,
    RegressionEvaluator,
)
from pyspark.ml.feature import StandardScaler, VectorAssembler  # noqa: E402
from pyspark.ml.linalg import Vectors, VectorUDT  # noqa: E402
from pyspark.ml.tuning import CrossValidator, ParamGridBuilder  # noqa: E402
from pyspark.sql import types as T  # noqa: E402

from helpers.frames import array_frame, vector_frame  # noqa: E402
from helpers.models import mlp  # noqa: E402
from sparknet import Dense, Flatten, Sequential  # noqa: E402
from sparknet.layers import LSTM, Conv2D, MaxPool2D, SequenceMask  # noqa: E402
from sparknet.ml import (  # noqa: E402
    SparkNetClassificationModel,
    SparkNetClassifier,
    SparkNetRegressionModel,
    SparkNetRegressor,
)

# one round per epoch and partition keeps the number of Spark jobs (~130 ms each) small
FAST = dict(numPartitions=2, localSteps=64, batchSize=32)


@pytest.fixture(scope="module")
def frames(spark, digits):
    X, y, Xt, yt = digits
    return {"train": vector_frame(spark, X, y).cache(), "test": vector_frame(spark, Xt, yt).cache(),
            "test_array": array_frame(spark, Xt, yt),
            "test_float": array_frame(spark, Xt, yt, "float")}


@pytest.fixture(scope="module")
def fitted(frames):
    clf = SparkNetClassifier(network=mlp(128), epochs=12, learningRate=2e-3, seed=3, **FAST)
    t0 = time.perf_counter()
    model = clf.fit(frames["train"])
    print(f"digits MLP fit on Spark: {time.perf_counter() - t0:.1f} s")
    return model


def _col(df, name):
    return np.array([r[0] for r in df.select(name).collect()])


def _probs(df, name="probability"):
    return np.array([r[0].toArray() for r in df.select(name).collect()])


@pytest.mark.slow
def test_validation_indicator_col_holds_rows_out_and_evaluates_them_every_epoch(spark, digits):
    """MLlib's validationIndicatorCol: the flagged rows do not train (the weights are those
    of a fit on the other rows alone, bit for bit) and are evaluated after every epoch (the
    last val_loss and val_accuracy are the fitted network's on exactly those rows)."""
    from pyspark.sql import functions as F

    X, y, _, _ = digits
    df = vector_frame(spark, X, y).withColumn("is_val", F.rand(seed=1) < 0.2).cache()
    rows = df.collect()
    val = [r for r in rows if r.is_val]
    X_val = np.array([r.features.toArray() for r in val])
    y_val = np.array([r.label for r in val]).astype(np.int64)
    assert 200 < len(val) < 400

    def clf(**kw):  # one averaging round per epoch: the same shards give the same weights
        return SparkNetClassifier(network=mlp(32), epochs=3, learningRate=2e-3, seed=4,
                                  **dict(FAST, **kw))

    held = clf(validationIndicatorCol="is_val").fit(df)
    alone = clf().fit(df.filter(~F.col("is_val")))
    np.testing.assert_array_equal(held.network.params, alone.network.params)
    hist = held.history.history
    assert len(hist["val_loss"]) == len(hist["val_accuracy"]) == 3
    assert "val_loss" not in alone.history.history
    ev = held.network.evaluate(X_val, y_val)
    np.testing.assert_allclose(hist["val_loss"][-1], ev["loss"], rtol=1e-4)
    assert hist["val_accuracy"][-1] == pytest.approx(ev["accuracy"], abs=1e-9)
    assert ev["accuracy"] > 0.8
    df.unpersist()


def test_validation_indicator_col_must_name_a_boolean_column(spark, small):
    X, y = small
    df = vector_frame(spark, X, y)
    _fit_error(spark, _clf(validationIndicatorCol="held_out"), df,
               r"validationIndicatorCol: the DataFrame has no column 'held_out' \(its columns: ")
    _fit_error(spark, _clf(validationIndicatorCol="label"), df,
               r"validationIndicatorCol: column 'label' has type double; it must be boolean")
    with pytest.raises(TypeError, match="validationIndicatorCol must be a column name"):
        _clf(validationIndicatorCol="")


# --------------------------------------------------------------------------- classifier
@pytest.mark.slow
def test_classifier_accuracy_and_mllib_schema(frames, fitted, digits):
    """Vector features: >= 95 % test accuracy through MLlib's evaluator; output columns
    of MLlib's types; probabilities are the softmax of the raw predictions; the
    executors' predictions equal the network's own on the driver."""
    out = fitted.transform(frames["test"])
    acc = MulticlassClassificationEvaluator(metricName="accuracy").evaluate(out)
    f1 = MulticlassClassificationEvaluator(metricName="f1").evaluate(out)
    print(f"test accuracy {acc:.4f}, f1 {f1:.4f}")
    assert acc >= 0.95

    lr = LogisticRegression(maxIter=3).fit(frames["train"]).transform(frames["test"])
    for name in ("rawPrediction", "probability", "prediction"):
        assert out.schema[name].dataType == lr.schema[name].dataType, name
    assert isinstance(out.schema["probability"].dataType, VectorUDT)
    assert out.schema["prediction"].dataType == T.DoubleType()
    assert out.columns == lr.columns

    raw, prob = _probs(out, "rawPrediction"), _probs(out)
    e = np.exp(raw - raw.max(axis=1, keepdims=True))
    np.testing.assert_allclose(prob, e / e.sum(axis=1, keepdims=True), rtol=1e-6, atol=1e-9)
    pred = _col(out, "prediction")
    np.testing.assert_array_equal(pred, prob.argmax(axis=1))
    Xt = digits[2]
    np.testing.assert_array_equal(pred, fitted.network.predict(Xt))
    assert fitted.numClasses == 10 and fitted.numFeatures == 64
    assert fitted.predict(Vectors.dense(Xt[0])) == pred[0]


@pytest.mark.slow
def test_array_features_transform_and_fit(spark, frames, fitted, digits):
    """array<double> and array<float> columns score like Vector columns; a classifier
    also trains on an array column."""
    ref = _col(fitted.transform(frames["test"]), "prediction")
    for key in ("test_array", "test_float"):
        np.testing.assert_array_equal(_col(fitted.transform(frames[key]), "prediction"), ref)

    X, y, _, _ = digits
    train = array_frame(spark, X, y, "float")
    model = SparkNetClassifier(network=mlp(32), epochs=3, learningRate=3e-3, **FAST).fit(train)
    acc = MulticlassClassificationEvaluator(metricName="accuracy").evaluate(
        model.transform(frames["test_array"]))
    print(f"array features, 3 epochs: accuracy {acc:.4f}")
    assert acc > 0.85


@pytest.mark.slow
def test_async_mode_trains_on_the_asynchronous_trainer(frames):
    """mode='async' reaches the asynchronous parameter-server rounds (the trainer's mode
    resolution imports them on demand): the fit's history holds their applied updates,
    and the model learns digits."""
    clf = SparkNetClassifier(network=mlp(32), epochs=3, learningRate=3e-3, mode="async", seed=5,
                             **FAST)
    model = clf.fit(frames["train"])
    updates = model.history.updates
    assert updates and any(u["applied"] for u in updates)
    acc = MulticlassClassificationEvaluator(metricName="accuracy").evaluate(model.transform(frames["test"]))
    print(f"async mode, 3 epochs: accuracy {acc:.4f}")
    assert acc > 0.85


def test_output_columns_follow_params(frames, fitted):
    """Renamed output columns; an empty column name leaves that column out; thresholds
    change the prediction as in MLlib."""
    m = fitted.copy({fitted.predictionCol: "p", fitted.rawPredictionCol: "",
                     fitted.probabilityCol: "prob"})
    out = m.transform(frames["test"].limit(50))
    assert out.columns == ["features", "label", "prob", "p"]
    # a tiny threshold on class 3 makes it win wherever its probability is not tiny
    th = [1.0] * 10
    th[3] = 1e-9
    out = fitted.copy({fitted.thresholds: th}).transform(frames["test"].limit(200))
    prob, pred = _probs(out), _col(out, "prediction")
    np.testing.assert_array_equal(pred, (prob / np.array(th)).argmax(axis=1))
    assert (pred == 3).sum() > 20


# ----------------------------------------------------------------------------- pipeline
@pytest.mark.slow
def test_pipeline_fit_save_load(spark, tmp_path, digits):
    """VectorAssembler -> StandardScaler -> SparkNetClassifier fits, transforms, and the
    PipelineModel saves and loads with identical predictions and probabilities."""
    X, y, Xt, yt = digits
    cols = [f"p{i}" for i in range(64)]
    schema = T.StructType([T.StructField(c, T.DoubleType()) for c in cols] +
                          [T.StructField("label", T.DoubleType())])
    import pandas as pd

    def frame(X, y):
        pdf = pd.DataFrame(np.asarray(X, dtype=np.float64), columns=cols)
        pdf["label"] = np.asarray(y, dtype=np.float64)
        return spark.createDataFrame(pdf, schema)

    train, test = frame(X, y), frame(Xt, yt)
    pipe = Pipeline(stages=[
        VectorAssembler(inputCols=cols, outputCol="raw"),
        StandardScaler(inputCol="raw", outputCol="features", withMean=True),
        SparkNetClassifier(network=mlp(64), epochs=4, learningRate=2e-3, **FAST)])
    model = pipe.fit(train)
    out = model.transform(test)
    acc = MulticlassClassificationEvaluator(metricName="accuracy").evaluate(out)
    print(f"pipeline accuracy {acc:.4f}")
    assert acc > 0.9

    path = str(tmp_path / "pipeline_model")
    model.write().overwrite().save(path)
    loaded = PipelineModel.load(path)
    stage = loaded.stages[-1]
    assert isinstance(stage, SparkNetClassificationModel)
    np.testing.assert_array_equal(stage.network.params, model.stages[-1].network.params)
    out2 = loaded.transform(test)
    np.testing.assert_array_equal(_col(out2, "prediction"), _col(out, "prediction"))
    np.testing.assert_array_equal(_probs(out2), _probs(out))

    # the unfitted pipeline (with the estimator and its Params) round-trips too
    pipe.write().overwrite().save(str(tmp_path / "pipeline"))
    est = Pipeline.load(str(tmp_path / "pipeline")).getStages()[-1]
    assert isinstance(est, SparkNetClassifier)
    assert est.getEpochs() == 4 and est.getLearningRate() == 2e-3
    assert est.getNetwork().get_config() == pipe.getStages()[-1].getNetwork().get_config()


@pytest.mark.slow
def test_cross_validator_picks_a_model(spark, digits):
    """CrossValidator over learning rate x epochs (2 x 1 grid, 2 folds) with MLlib's
    binary evaluator (areaUnderROC on the rawPrediction vectors)."""
    X, y, _, _ = digits
    df = vector_frame(spark, X[:500], (y[:500] >= 5).astype(float)).cache()
    clf = SparkNetClassifier(network=mlp(16, classes=2), **FAST)
    grid = (ParamGridBuilder().addGrid(clf.learningRate, [1e-4, 5e-3])
            .addGrid(clf.epochs, [2]).build())
    cv = CrossValidator(estimator=clf, estimatorParamMaps=grid, numFolds=2, seed=7,
                        evaluator=BinaryClassificationEvaluator())
    cvm = cv.fit(df)
    print(f"areaUnderROC per learning rate: {cvm.avgMetrics}")
    assert len(cvm.avgMetrics) == 2 and all(0.5 < m <= 1.0 for m in cvm.avgMetrics)
    best = cvm.bestModel
    assert isinstance(best, SparkNetClassificationModel)
    assert best.getLearningRate() == 5e-3, "the higher learning rate learns far more in 2 epochs"
    assert max(cvm.avgMetrics) == cvm.avgMetrics[1]
    df.unpersist()


# ---------------------------------------------------------------------------- regressor
def test_regressor(spark, digits, tmp_path):
    """Regression of a real-valued target (the mean ink of the image's left half,
    scaled): RMSE far below the target's spread, via RegressionEvaluator;
    the model saves and loads."""
    X, y, Xt, yt = digits

    def target(X, y):
        return X.reshape(-1, 8, 8)[:, :, :4].mean(axis=(1, 2)) * 4 - 1

    train = vector_frame(spark, X, target(X, y))
    test = vector_frame(spark, Xt, target(Xt, yt))
    net = Sequential([Dense(32, activation="relu"), Dense(1)])
    reg = SparkNetRegressor(network=net, epochs=8, learningRate=2e-3, **FAST)
    model = reg.fit(train)
    out = model.transform(test)
    assert out.schema["prediction"].dataType == T.DoubleType()
    rmse = RegressionEvaluator(metricName="rmse").evaluate(out)
    spread = float(np.std(target(Xt, yt)))
    print(f"regression rmse {rmse:.4f}, target std {spread:.4f}")
    assert rmse < 0.5 * spread
    path = str(tmp_path / "reg")
    model.save(path)
    loaded = SparkNetRegressionModel.load(path)
    np.testing.assert_array_equal(_col(loaded.transform(test), "prediction"), _col(out, "prediction"))
    with pytest.raises(ValueError, match="holds a sparknet.ml.SparkNetRegressionModel"):
        SparkNetClassificationModel.load(path)


# ----------------------------------------------------------------- conv and recurrent
def test_conv_net_through_input_shape(spark, frames, digits):
    """Flat 64-value rows reshaped to inputShape (8, 8, 1) for a Conv2D network."""
    net = Sequential([Conv2D(8, 3, activation="relu", padding="same"), MaxPool2D(2), Flatten(),
                      Dense(10, activation="softmax")])
    clf = SparkNetClassifier(network=net, inputShape=[8, 8, 1], epochs=3, learningRate=5e-3, **FAST)
    model = clf.fit(frames["train"])
    assert model.network.input_shape == (8, 8, 1)
    out = model.transform(frames["test_array"])
    acc = MulticlassClassificationEvaluator(metricName="accuracy").evaluate(out)
    print(f"conv net, 3 epochs: accuracy {acc:.4f}")
    assert acc > 0.85
    np.testing.assert_array_equal(_col(out, "prediction"),
                                  model.network.predict(digits[2].reshape(-1, 8, 8, 1)))


def _sequences(X, rng):
    """Each digit as a sequence of its first 5-8 pixel rows (8 features per step)."""
    lengths = rng.integers(5, 9, size=len(X))
    return [x.reshape(8, 8)[:L].astype(np.float64) for x, L in zip(X, lengths)]


@pytest.mark.slow
def test_lstm_on_variable_length_sequences(spark, digits):
    """array<array<double>> rows of different lengths: padded, masked (SequenceMask in
    front of the LSTM), trained; a padded row scores exactly as the same sequence alone
    through the network without padding."""
    X, y, Xt, yt = digits
    rng = np.random.default_rng(0)
    seq_tr, seq_te = _sequences(X, rng), _sequences(Xt, rng)
    schema = T.StructType([T.StructField("features", T.ArrayType(T.ArrayType(T.DoubleType()))),
                           T.StructField("label", T.DoubleType())])
    train = spark.createDataFrame([(s.tolist(), float(t)) for s, t in zip(seq_tr, y)], schema)
    test = spark.createDataFrame([(s.tolist(), float(t)) for s, t in zip(seq_te, yt)], schema)
    net = Sequential([LSTM(32), Dense(10, activation="softmax")])
    model = SparkNetClassifier(network=net, epochs=4, learningRate=1e-2, **FAST).fit(train)
    assert isinstance(model.network.layers[0], SequenceMask)
    assert model.network.input_shape == (8, 9)  # longest sequence x (8 features + mask)
    out = model.transform(test)
    acc = MulticlassClassificationEvaluator(metricName="accuracy").evaluate(out)
    print(f"LSTM on sequences of 5-8 steps, 4 epochs: accuracy {acc:.4f}")
    assert acc > 0.6

    # padded-vs-alone: the network without SequenceMask on each unpadded sequence
    cfg = model.network.get_config()
    prob = _probs(out)
    for i in range(0, 40, 4):
        s = seq_te[i]
        alone = Sequential.from_config(dict(cfg, layers=cfg["layers"][1:], input_shape=list(s.shape)))
        alone.set_params(model.network.params)
        np.testing.assert_allclose(prob[i], alone.predict_proba(s[None])[0], rtol=1e-5, atol=1e-6)


# --------------------------------------------------------------------- safe loading
class _Marker:
    """Unpickling this object would create the file ``path``."""

    def __init__(self, path):
        self.path = path

    def __reduce__(self):
        return (open, (self.path, "w"))


def test_load_refuses_planted_pickle(spark, fitted, tmp_path):
    """A saved model whose weights blob is replaced by an npz holding an object array
    (a pickle whose loading would create a marker file) is refused, and the marker is
    never created."""
    import io

    path = str(tmp_path / "model")
    fitted.write().save(path)
    meta = json.loads(spark.read.text(os.path.join(path, "metadata")).first()[0])
    assert meta["class"] == "sparknet.ml.SparkNetClassificationModel"
    ok = SparkNetClassificationModel.load(path)
    np.testing.assert_array_equal(ok.network.params, fitted.network.params)

    marker = tmp_path / "PWNED"
    buf = io.BytesIO()
    params = np.empty(1, dtype=object)
    params[0] = _Marker(str(marker))
    np.savez(buf, format=np.array("sparknet-model"), version=np.array(1),
             architecture=np.array(json.dumps(fitted.network.get_config())), params=params)
    schema = T.StructType([T.StructField("model", T.BinaryType(), False)])
    spark.createDataFrame([(bytearray(buf.getvalue()),)], schema).coalesce(1) \
        .write.mode("overwrite").parquet(os.path.join(path, "data"))
    with pytest.raises(ValueError, match="object array"):
        SparkNetClassificationModel.load(path)
    assert not marker.exists()
    # control: the payload is live (unpickling it does create the marker)
    with np.load(io.BytesIO(buf.getvalue()), allow_pickle=True) as z:
        z["params"]
    assert marker.exists()


def test_load_refuses_foreign_class(spark, fitted, tmp_path):
    """Metadata naming a class outside sparknet's ML stages is refused before import."""
    path = str(tmp_path / "model")
    fitted.write().save(path)
    mdir = os.path.join(path, "metadata")
    part = [f for f in os.listdir(mdir) if f.startswith("part-")][0]
    with open(os.path.join(mdir, part)) as fh:
        meta = json.loads(fh.read())
    meta["class"] = "os.system"
    with open(os.path.join(mdir, part), "w") as fh:
        fh.write(json.dumps(meta))
    for f in os.listdir(mdir):  # the edited file no longer matches its checksum
        if f.endswith(".crc"):
            os.remove(os.path.join(mdir, f))
    with pytest.raises(ValueError, match="not a sparknet ML stage"):
        SparkNetClassificationModel.load(path)


# ------------------------------------------------------------------------- bad input
@pytest.fixture(scope="module")
def small(spark, digits):
    X, y, _, _ = digits
    return X[:60].astype(np.float64), y[:60].astype(np.float64)


def _clf(**kw):
    return SparkNetClassifier(network=mlp(8), epochs=1, **dict(FAST, **kw))


def test_bad_columns(spark, small):
    """Missing or wrongly typed columns: a ValueError naming the column, before any
    training round."""
    X, y = small
    df = vector_frame(spark, X, y)
    _fit_error(spark, _clf(featuresCol="pixels"), df, "no features column 'pixels'")
    _fit_error(spark, _clf(labelCol="digit"), df, "no label column 'digit'")
    strs = spark.createDataFrame([("a", 1.0)], ["features", "label"])
    _fit_error(spark, _clf(), strs, "features column 'features' has type string")
    lab = df.withColumn("label", df["label"].cast("string"))
    _fit_error(spark, _clf(), lab, "label column 'label' has type string")
    with pytest.raises(ValueError, match="features column 'features' has type string"):
        _untrained_model().transform(strs)


def _untrained_model():
    """A Model holding an untrained 64-8-10 network (transform checks need no training)."""
    net = mlp(8)
    net.build((64,))
    return SparkNetClassificationModel.from_network(net)


def test_a_model_from_a_network_holds_it_and_needs_it_built():
    net = mlp(8)
    with pytest.raises(ValueError, match="a sparknet Model needs a built Sequential"):
        SparkNetClassificationModel.from_network(net)
    net.build((64,))
    m = SparkNetClassificationModel.from_network(net)
    assert m.network is net and m.history is None and m.numFeatures == 64 and m.numClasses == 10


def _fit_error(spark, clf, df, match):
    """``clf.fit(df)`` raises a ValueError matching ``match`` after at most the jobs that
    load (and check) the data: a fit runs its training rounds after loading, so 2 jobs
    or fewer means no training round ran."""
    sc = spark.sparkContext
    group = f"bad-input-{time.monotonic_ns()}"
    sc.setJobGroup(group, "bad input")
    try:
        with pytest.raises(ValueError, match=match):
            clf.fit(df)
    finally:
        sc.setLocalProperty("spark.jobGroup.id", None)
        sc.setLocalProperty("spark.job.description", None)
    jobs = sc.statusTracker().getJobIdsForGroup(group)
    assert len(jobs) <= 2, f"{len(jobs)} Spark jobs ran before the error"


def test_bad_values(spark, small):
    """Wrong feature size, NaN, labels outside the classes: a ValueError naming the
    column, raised after the data-loading job and before any training round."""
    X, y = small
    # feature size differs from the network's declared input
    _fit_error(spark, _clf(inputShape=[65]), vector_frame(spark, X, y),
               r"features column 'features' has 64 values per row, the model expects 65")
    Xn = X.copy()
    Xn[7, 3] = np.nan
    rows = [(Vectors.dense(x), float(t)) for x, t in zip(Xn, y)]  # (pandas would make NaN null)
    _fit_error(spark, _clf(), spark.createDataFrame(rows, ["features", "label"]),
               r"features column 'features' contains nan")
    yb = y.copy()
    yb[5] = 10
    _fit_error(spark, _clf(), vector_frame(spark, X, yb),
               r"label column 'label' holds the label 10, outside \[0, 10\)")
    yb[5] = -1
    _fit_error(spark, _clf(), vector_frame(spark, X, yb),
               r"label column 'label' holds the label -1")
    # VectorAssembler metadata gives the size before any job
    df = spark.createDataFrame([tuple(map(float, r[:10])) + (float(t),) for r, t in zip(X[:5], y)],
                               [f"c{i}" for i in range(10)] + ["label"])
    va = VectorAssembler(inputCols=[f"c{i}" for i in range(10)], outputCol="features").transform(df)
    with pytest.raises(ValueError, match="vectors of size 10 .* the network expects 64"):
        _untrained_model().transform(va)


def test_bad_params():
    with pytest.raises(TypeError, match="network must be a sparknet Sequential"):
        SparkNetClassifier(network=42)
    with pytest.raises(TypeError, match="mode must be one of"):
        SparkNetClassifier(mode="fast")
    with pytest.raises(TypeError, match="epochs must be > 0"):
        SparkNetClassifier(epochs=0)
    with pytest.raises(ValueError, match="set the network Param"):
        SparkNetClassifier().getNetwork()


def test_classifier_needs_softmax_head(spark, small):
    """A classifier whose network does not end in softmax is refused before training."""
    X, y = small
    with pytest.raises(ValueError, match="Dense\\(numClasses, activation='softmax'\\)"):
        SparkNetClassifier(network=Sequential([Dense(10)]), epochs=1,
                           **FAST).fit(vector_frame(spark, X, y))


def test_sequence_errors(spark):
    schema = T.StructType([T.StructField("features", T.ArrayType(T.ArrayType(T.DoubleType()))),
                           T.StructField("label", T.DoubleType())])
    df = spark.createDataFrame([([[1.0, 2.0], [3.0, 4.0]], 0.0), ([[1.0, 2.0], [3.0]], 1.0)], schema)
    net = Sequential([LSTM(4), Dense(2, activation="softmax")])
    with pytest.raises(ValueError, match="sequence column 'features' has steps of different lengths"):
        SparkNetClassifier(network=net, epochs=1).fit(df)


def test_import_sparknet_does_not_import_pyspark():
    import subprocess
    import sys

    code = "import sys, sparknet; print('pyspark' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "False"
