"""MLflow integration (sparknet.mlflow) against a local file store, on real data and local Spark."""
from __future__ import annotations

import os

import numpy as np
import pytest

mlflow = pytest.importorskip("mlflow", reason="sparknet.mlflow needs MLflow: pip install 'sparknet[mlflow]'")

import pandas as pd  # noqa: E402
from mlflow.tracking import MlflowClient  # noqa: E402

import sparknet.mlflow as snm  # noqa: E402
from sparknet import Dense, RMSprop, Sequential  # noqa: E402

COLUMNS = [f"f{i}" for i in range(64)]
# MLflow's advice to log an input example with every model
pytestmark = pytest.mark.filterwarnings("ignore:.*An input example was not provided:UserWarning")


@pytest.fixture
def client(tmp_path, monkeypatch):
    """A tracking store in ``tmp_path`` (MLflow's file store: it needs no database)."""
    uri = (tmp_path / "mlruns").as_uri()
    monkeypatch.setenv("MLFLOW_TRACKING_URI", uri)
    monkeypatch.setenv("MLFLOW_ALLOW_FILE_STORE", "true")
    monkeypatch.setenv("MLFLOW_ENABLE_ARTIFACTS_PROGRESS_BAR", "false")
    yield MlflowClient(uri)
    while mlflow.active_run() is not None:
        mlflow.end_run()


@pytest.fixture(scope="module")
def trained(digits):
    """A small classifier fitted on the digits (a fraction of a second)."""
    X_train, y_train, _, _ = digits
    model = Sequential([Dense(32, activation="relu"), Dense(10, activation="softmax")], seed=0)
    model.fit(X_train, y_train, epochs=3, verbose=0, optimizer=RMSprop(lr=3e-3))
    return model


def _by_step(client, run_id, key):
    """A metric's values by step (MLflow 3 writes a run's latest metrics again when a
    model is logged to it, so steps may repeat, with the same values)."""
    out: dict[int, float] = {}
    for m in client.get_metric_history(run_id, key):
        assert out.setdefault(m.step, m.value) == m.value
    return out


def test_logger_records_params_metrics_and_model_of_a_fit(client, digits):
    X_train, y_train, X_test, y_test = digits
    model = Sequential([Dense(16, activation="relu"), Dense(10, activation="softmax")], seed=1)
    logger = snm.MLflowLogger(run_name="digits-mlp", tags={"data": "digits"})
    history = model.fit(X_train, y_train, epochs=3, verbose=0, validation_data=(X_test, y_test),
                        optimizer=RMSprop(lr=2e-3), callbacks=[logger])

    run = client.get_run(logger.run_id)
    assert run.info.status == "FINISHED" and mlflow.active_run() is None  # the logger ended the run it started
    assert run.info.run_name == "digits-mlp" and run.data.tags["data"] == "digits"
    params = run.data.params
    assert params["optimizer.name"] == "RMSprop" and float(params["optimizer.lr"]) == 2e-3
    assert params["model.layers.0.class"] == "Dense" and params["model.layers.0.config.units"] == "16"
    assert params["model.n_params"] == str(model.n_params) and params["trainer.class"] == "Sequential.fit"
    for key in ("loss", "accuracy", "val_loss", "val_accuracy"):
        assert _by_step(client, logger.run_id, key) == pytest.approx(dict(enumerate(history.history[key])))

    assert "model.npz" in [a.path for a in client.list_artifacts(logger.run_id)]
    local = mlflow.artifacts.download_artifacts(run_id=logger.run_id, artifact_path="model.npz")
    np.testing.assert_array_equal(Sequential.load(local).params, model.params)
    np.testing.assert_array_equal(snm.load_model(logger.model_info.model_uri).params, model.params)


def test_logger_writes_to_the_active_run_and_leaves_it_open(client, trained, digits):
    X_train, y_train, _, _ = digits
    model = trained.clone()
    logger = snm.MLflowLogger(log_model=False)
    with mlflow.start_run() as run:
        model.fit(X_train, y_train, epochs=2, verbose=0, callbacks=[logger])
        assert logger.run_id == run.info.run_id and mlflow.active_run().info.run_id == run.info.run_id
    assert logger.model_info is None
    assert sorted(_by_step(client, run.info.run_id, "loss")) == [0, 1]
    assert [a.path for a in client.list_artifacts(run.info.run_id)] == ["model.npz"]
    assert client.search_logged_models([run.info.experiment_id]) == []


def test_logger_logs_a_data_parallel_fit(client, spark, digits):
    from sparknet.cluster import DataParallelTrainer

    X_train, y_train, _, _ = digits
    model = Sequential([Dense(16, activation="relu"), Dense(10, activation="softmax")], seed=2)
    trainer = DataParallelTrainer(model, spark, num_partitions=2, sync="average", local_steps=21)
    logger = snm.MLflowLogger(log_model=False)
    _, history = trainer.fit(X_train, y_train, epochs=2, batch_size=32, verbose=0, callbacks=[logger])
    params = client.get_run(logger.run_id).data.params
    assert params["trainer.class"] == "DataParallelTrainer"
    assert (params["trainer.sync"], params["trainer.local_steps"], params["trainer.num_partitions"]) == ("average", "21", "2")
    assert _by_step(client, logger.run_id, "loss") == pytest.approx(dict(enumerate(history.history["loss"])))


def test_pyfunc_predicts_as_the_model(client, trained, digits, tmp_path):
    _, _, X_test, _ = digits
    frame = pd.DataFrame(X_test.astype(np.float64), columns=COLUMNS)
    with mlflow.start_run():
        info = snm.log_model(trained, "model", input_example=X_test[:3])
        tensor = snm.log_model(trained, "tensor", input_schema="tensor", output="proba")
    loaded = mlflow.pyfunc.load_model(info.model_uri)
    assert not loaded.metadata.signature.inputs.has_input_names()  # no invented f0..f63: by position
    np.testing.assert_array_equal(loaded.predict(frame), trained.predict(X_test))
    np.testing.assert_allclose(mlflow.pyfunc.load_model(tensor.model_uri).predict(X_test),
                               trained.predict_proba(X_test), rtol=1e-6)
    override = mlflow.pyfunc.load_model(info.model_uri, model_config={"output": "proba"})
    np.testing.assert_allclose(override.predict(frame), trained.predict_proba(X_test), rtol=1e-6)

    path = tmp_path / "saved"
    snm.save_model(trained, path, input_schema="array", output="proba", input_example=X_test[:2])
    assert (path / "data" / "model.npz").is_file() and not list(path.rglob("*.pkl"))
    reqs = (path / "requirements.txt").read_text()
    assert "sparknet==" in reqs and "numpy==" in reqs
    arrays = pd.DataFrame({"features": list(X_test.astype(np.float64))})
    np.testing.assert_allclose(mlflow.pyfunc.load_model(str(path)).predict(arrays), trained.predict_proba(X_test),
                               rtol=1e-6)


def test_the_default_signature_takes_numpy_arrays_and_dataframes_of_any_dtype(client, trained, digits, tmp_path):
    """A user's first calls: ``predict(X)`` and ``predict(pd.DataFrame(X))``, with float32 or
    float64 rows; named columns only when ``feature_names`` asks for them."""
    _, _, X_test, _ = digits
    want = trained.predict(X_test)
    snm.save_model(trained, tmp_path / "m", input_example=X_test[:2])
    scorer = mlflow.pyfunc.load_model(str(tmp_path / "m"))
    for x in (X_test, X_test.astype(np.float64), pd.DataFrame(X_test), pd.DataFrame(X_test.astype(np.float64)),
              pd.DataFrame(X_test, columns=[f"pixel{i}" for i in range(64)])):
        np.testing.assert_array_equal(np.asarray(scorer.predict(x)).reshape(-1), want)
    named = snm.model_signature(trained, feature_names=COLUMNS)
    assert named.inputs.input_names() == COLUMNS
    # images: a tensor of the network's shape
    conv = Sequential([Dense(3, activation="softmax")], input_shape=(4, 2), seed=0)
    sig = snm.model_signature(conv)
    assert sig.inputs.is_tensor_spec() and sig.inputs.inputs[0].shape == (-1, 4, 2)


@pytest.mark.slow
def test_spark_udf_scores_a_dataframe_as_the_model(client, spark, trained, digits):
    """A sparknet.ml Model, logged through its network: the UDF's scores of a
    DataFrame's feature columns equal the network's predict on the same rows."""
    from pyspark.sql import functions as F

    from sparknet.ml import SparkNetClassificationModel

    _, _, X_test, _ = digits
    ml_model = SparkNetClassificationModel.from_network(trained)  # as fit makes one of it
    with mlflow.start_run():
        info = snm.log_model(ml_model, "model")
    # one task: each Python worker that runs the UDF imports MLflow and loads the model (seconds of CPU)
    df = spark.createDataFrame(pd.DataFrame(X_test.astype(np.float64), columns=COLUMNS)).coalesce(1)
    udf = mlflow.pyfunc.spark_udf(spark, info.model_uri)
    rows = df.withColumn("i", F.monotonically_increasing_id()).withColumn("udf", udf(*COLUMNS)).toPandas()
    assert len(rows) == len(X_test) and rows["udf"].dtype == np.int64
    np.testing.assert_array_equal(rows["udf"].to_numpy(), trained.predict(rows[COLUMNS].to_numpy(np.float32)))


def test_non_sparknet_models_and_bad_options_fail_clearly(client, trained, tmp_path):
    from sklearn.linear_model import LogisticRegression

    with pytest.raises(TypeError, match="sparknet Sequential .*got sklearn.linear_model.*LogisticRegression"):
        snm.log_model(LogisticRegression(), "model")
    from sparknet.ml import SparkNetClassifier

    with pytest.raises(TypeError, match="SparkNetClassifier.*fit it first"):
        snm.save_model(SparkNetClassifier(network=trained), tmp_path / "f")
    with pytest.raises(ValueError, match="not built"):
        snm.save_model(Sequential([Dense(3)]), tmp_path / "a")
    with pytest.raises(ValueError, match="output=.*'probs'"):
        snm.save_model(trained, tmp_path / "b", output="probs")
    with pytest.raises(ValueError, match="feature_names has 2 names, the network reads 64"):
        snm.save_model(trained, tmp_path / "c", feature_names=["a", "b"])
    regression = Sequential([Dense(1)], input_shape=(4,), loss="mse")
    with pytest.raises(ValueError, match="output='proba' needs a classifier"):
        snm.save_model(regression, tmp_path / "d", output="proba")
    snm.save_model(trained, tmp_path / "e")
    with pytest.raises(ValueError, match="path=.* exists"):
        snm.save_model(trained, tmp_path / "e")
    pyfunc = mlflow.pyfunc.load_model(str(tmp_path / "e"))
    with pytest.raises(Exception, match="declares 64 inputs .* only has 63"):  # MLflow's schema check
        pyfunc.predict(pd.DataFrame(np.zeros((2, 63)), columns=COLUMNS[:63]))
    with pytest.raises(ValueError, match="model_input has shape \\(2, 5\\)"):
        snm.features_array(np.zeros((2, 5)), trained)
    with pytest.raises(ValueError, match="artifact_path"):
        snm.MLflowLogger(artifact_path="a/b")
    assert not os.path.exists(tmp_path / "b") and not os.path.exists(tmp_path / "f")


def test_a_run_left_by_a_failed_fit_is_ended_as_failed_by_the_next_fit(client, trained, digits):
    from sparknet.callbacks import LambdaCallback

    X_train, y_train, _, _ = digits
    model = trained.clone()
    logger = snm.MLflowLogger(log_model=False)

    def fail(epoch, logs):
        raise RuntimeError("stop here")

    with pytest.raises(RuntimeError, match="stop here"):
        model.fit(X_train, y_train, epochs=2, verbose=0, callbacks=[logger, LambdaCallback(on_epoch_end=fail)])
    first = logger.run_id
    assert mlflow.active_run().info.run_id == first and sorted(_by_step(client, first, "loss")) == [0]
    model.fit(X_train, y_train, epochs=1, verbose=0, callbacks=[logger])
    assert client.get_run(first).info.status == "FAILED"
    assert logger.run_id != first and client.get_run(logger.run_id).info.status == "FINISHED"
    assert mlflow.active_run() is None
