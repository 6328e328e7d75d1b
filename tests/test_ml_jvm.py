"""The JVM inference engine (sparknet/jvm/DenseForward.java) against the Arrow engine,
on real local Spark and scikit-learn's digits."""
from __future__ import annotations

import zipfile

import numpy as np
import pytest

pytest.importorskip("pyspark")

from pyspark.ml.linalg import Vectors, VectorUDT  # noqa: E402
from pyspark.sql import types as T  # noqa: E402

from sparknet import Activation, Dense, Dropout, Sequential  # noqa: E402
from sparknet.cluster.engine import jar as engine_jar  # noqa: E402
from sparknet.datasets import load_digits  # noqa: E402
from sparknet.layers import Conv2D, Flatten  # noqa: E402
from sparknet.ml import SparkNetClassificationModel, SparkNetRegressionModel, _jvm  # noqa: E402

if engine_jar.javac() is None:
    pytest.skip("no javac on this machine: the JVM engine is compiled on first use, so only "
                "the Arrow engine runs here", allow_module_level=True)


@pytest.fixture(scope="module")
def digits_frames(spark):
    import pandas as pd
    from pyspark.ml.functions import array_to_vector

    X, y, Xt, yt = load_digits()
    pdf = pd.DataFrame({"features": list(Xt.astype(np.float64)), "label": yt.astype(np.float64)})
    arr = spark.createDataFrame(pdf).cache()
    vec = arr.select(array_to_vector("features").alias("features"), "label").cache()
    return vec, arr, Xt


def _model(cls, net, seed=0, **params):
    """A Model holding ``net`` built on 64 inputs with seeded random weights."""
    net.build((64,))
    rng = np.random.default_rng(seed)
    p = net.params
    p[...] = rng.normal(0, 0.3, size=p.shape).astype(p.dtype)
    m = cls.from_network(net)
    if params:
        m = m.copy({m.getParam(k): v for k, v in params.items()})
    return m


def _rows(df, cols):
    out = []
    for r in df.select(*cols).collect():
        out.append([np.asarray(v.toArray() if hasattr(v, "toArray") else v, dtype=np.float64)
                    for v in r])
    return [np.stack([row[i] for row in out]) for i in range(len(cols))]


def _both(model, df, cols):
    """``cols`` of ``model.transform(df)`` on the JVM and on the Arrow engine."""
    jvm = model.copy({model.inferenceEngine: "jvm"})
    arrow = model.copy({model.inferenceEngine: "arrow"})
    out_j, out_a = jvm.transform(df), arrow.transform(df)
    assert (jvm.lastInferenceEngine, arrow.lastInferenceEngine) == ("jvm", "arrow")
    # the same columns: names, types, nullability and MLlib's metadata
    assert out_j.schema == out_a.schema
    assert [f.metadata for f in out_j.schema.fields] == [f.metadata for f in out_a.schema.fields]
    return _rows(out_j, cols), _rows(out_a, cols)


NETS = {
    "relu-softmax": lambda: Sequential([Dense(32, activation="relu"),
                                        Dense(10, activation="softmax")]),
    "tanh-sigmoid-activation-dropout": lambda: Sequential([
        Dense(24, activation="tanh"), Dropout(0.5), Dense(16), Activation("sigmoid"),
        Dense(10, activation="softmax")]),
    "no-bias-identity-head": lambda: Sequential([Dense(20, activation="relu", use_bias=False),
                                                 Dense(10)]),
}


@pytest.mark.parametrize("name", sorted(NETS))
def test_classifier_engines_agree(digits_frames, name):
    """Logits, probabilities and predictions of the JVM engine equal the Arrow engine's
    (float32 network on the Arrow side, float64 arithmetic on the JVM side), and the
    JVM's logits equal the network's own forward pass on the driver."""
    vec, _, Xt = digits_frames
    model = _model(SparkNetClassificationModel, NETS[name]())
    (raw_j, prob_j, pred_j), (raw_a, prob_a, pred_a) = _both(
        model, vec, ["rawPrediction", "probability", "prediction"])
    scale = np.abs(raw_a).max()
    np.testing.assert_allclose(raw_j, raw_a, rtol=0, atol=2e-6 * scale)
    ref = model.network.forward(Xt.astype(np.float32)).astype(np.float64)
    np.testing.assert_allclose(raw_j, ref, rtol=0, atol=2e-6 * scale)
    np.testing.assert_allclose(prob_j, prob_a, rtol=0, atol=1e-6)
    np.testing.assert_allclose(prob_j.sum(axis=1), 1.0, atol=1e-12)
    # predictions agree wherever the top two probabilities are not a float32 tie
    top2 = np.sort(prob_a, axis=1)[:, -2:]
    clear = (top2[:, 1] - top2[:, 0]) > 1e-5
    assert clear.mean() > 0.98
    np.testing.assert_array_equal(pred_j[clear], pred_a[clear])


def test_thresholds_on_the_jvm(digits_frames):
    """MLlib's thresholds rule (argmax of probability / threshold; a zero threshold wins
    outright) gives the same predictions on both engines."""
    vec, _, _ = digits_frames
    th = [1.0] * 10
    th[3] = 1e-3
    model = _model(SparkNetClassificationModel, NETS["relu-softmax"](), thresholds=th)
    (prob, pred), (_, pred_a) = _both(model, vec, ["probability", "prediction"])
    np.testing.assert_array_equal(pred, (prob / np.array(th)).argmax(axis=1))
    np.testing.assert_array_equal(pred, pred_a)
    assert 20 < (pred == 3).sum() < len(pred)
    th[7] = 0.0
    (pred,), _ = _both(model.copy({model.thresholds: th}), vec, ["prediction"])
    assert (pred == 7).all()


@pytest.mark.parametrize("outputs", [1, 3])
def test_regressor_engines_agree(digits_frames, outputs):
    """Regressors: one output gives a double column, several a Vector, on both engines."""
    vec, _, Xt = digits_frames
    model = _model(SparkNetRegressionModel, Sequential([Dense(16, activation="relu"),
                                                        Dense(outputs)]), seed=1)
    (pj,), (pa,) = _both(model, vec, ["prediction"])
    assert pj.shape == (len(Xt),) if outputs == 1 else (len(Xt), outputs)
    np.testing.assert_allclose(pj, pa, rtol=0, atol=2e-6 * np.abs(pa).max())


def test_auto_engine_choice(digits_frames):
    """``auto`` runs small dense networks on Vector columns in the JVM and everything
    else through Arrow; forcing ``jvm`` where it cannot run names the reason."""
    vec, arr, _ = digits_frames
    small = _model(SparkNetClassificationModel, NETS["relu-softmax"]())
    small.transform(vec)
    assert small.lastInferenceEngine == "jvm"
    small.transform(arr)
    assert small.lastInferenceEngine == "arrow"
    # 64*1024 + 1024*10 multiply-adds a row: past AUTO_MAX_MACS, Arrow's batched kernels win
    wide = _model(SparkNetClassificationModel, Sequential([Dense(1024, activation="relu"),
                                                          Dense(10, activation="softmax")]))
    assert 64 * 1024 + 1024 * 10 > _jvm.AUTO_MAX_MACS
    wide.transform(vec)
    assert wide.lastInferenceEngine == "arrow"
    forced = wide.copy({wide.inferenceEngine: "jvm"})
    forced.transform(vec)
    assert forced.lastInferenceEngine == "jvm"
    with pytest.raises(ValueError, match="inferenceEngine='jvm' cannot score this model: the "
                                         "features column holds arrays"):
        small.copy({small.inferenceEngine: "jvm"}).transform(arr)
    net = Sequential([Conv2D(4, 3, activation="relu"), Flatten(), Dense(10, activation="softmax")])
    net.build((8, 8, 1))
    conv = SparkNetClassificationModel.from_network(net)
    with pytest.raises(ValueError, match=r"layer '.*' \(Conv2D\) has no JVM kernel"):
        conv.copy({conv.inferenceEngine: "jvm"}).transform(vec)
    gelu = _model(SparkNetClassificationModel, Sequential([Dense(16, activation="gelu"),
                                                          Dense(10, activation="softmax")]))
    with pytest.raises(ValueError, match=r"layer '.*': activation 'gelu' has no JVM kernel"):
        gelu.copy({gelu.inferenceEngine: "jvm"}).transform(vec)
    gelu.transform(vec)  # "auto" scores it on the Arrow path
    assert gelu.lastInferenceEngine == "arrow"


def _action_error(df, match):
    with pytest.raises(Exception, match=match) as info:
        df.write.format("noop").mode("overwrite").save()
    return info


def test_bad_rows_on_the_jvm(spark):
    """NaN, a row of the wrong size (no size in the column's metadata, so only the rows
    can tell) and a null row: errors naming the column, from the executors."""
    model = _model(SparkNetClassificationModel, NETS["relu-softmax"](),
                   inferenceEngine="jvm")
    good = [float(i % 7) for i in range(64)]
    nan = list(good)
    nan[5] = float("nan")
    df = spark.createDataFrame([(Vectors.dense(good),), (Vectors.dense(nan),)], ["features"])
    _action_error(model.transform(df), r"features column 'features' contains NaN or infinity")
    df = spark.createDataFrame([(Vectors.dense(good),), (Vectors.dense(good + [1.0]),)],
                               ["features"])
    _action_error(model.transform(df), r"features column 'features' has a row of 65 values; "
                                       r"the network expects 64")
    schema = T.StructType([T.StructField("features", VectorUDT(), True)])
    df = spark.createDataFrame([(Vectors.dense(good),), (None,)], schema)
    _action_error(model.transform(df), r"features column 'features' has a null row")


@pytest.mark.slow
def test_jar_is_cached_and_complete(tmp_path, monkeypatch):
    """The jar is built once per source and Spark version, atomically, into the cache
    folder; without javac the build says so."""
    monkeypatch.setenv("SPARKNET_CACHE_DIR", str(tmp_path))
    monkeypatch.setattr(engine_jar, "_JARS", {})
    monkeypatch.setattr(engine_jar, "_FAILED", {})
    jar = _jvm.build_jar()
    assert jar.is_relative_to(tmp_path) and jar.name == "sparknet-jvm.jar"
    with zipfile.ZipFile(jar) as z:
        assert "sparknet/jvm/DenseForward.class" in z.namelist()
    assert not list(tmp_path.rglob("*.part"))
    mtime = jar.stat().st_mtime_ns
    monkeypatch.setattr(engine_jar, "_JARS", {})          # a new process finds it on disk
    assert _jvm.build_jar() == jar and jar.stat().st_mtime_ns == mtime

    monkeypatch.setenv("SPARKNET_CACHE_DIR", str(tmp_path / "empty"))
    monkeypatch.setattr(engine_jar, "_JARS", {})
    monkeypatch.delenv("JAVA_HOME", raising=False)
    monkeypatch.setenv("PATH", str(tmp_path / "no-bin"))
    with pytest.raises(RuntimeError, match="no javac found"):
        _jvm.build_jar()


def test_auto_falls_back_to_arrow_without_javac(spark, digits_frames, tmp_path, monkeypatch):
    """With no javac (and no jar built yet), ``auto`` scores through Arrow with the same
    results, and ``jvm`` raises a ValueError saying why."""
    vec, _, _ = digits_frames
    model = _model(SparkNetClassificationModel, NETS["relu-softmax"]())
    ref = _rows(model.copy({model.inferenceEngine: "arrow"}).transform(vec), ["prediction"])[0]
    monkeypatch.setenv("SPARKNET_CACHE_DIR", str(tmp_path))
    for name in ("_JARS", "_FAILED", "_ADDED"):
        monkeypatch.setattr(engine_jar, name, {})
    monkeypatch.delenv("JAVA_HOME", raising=False)
    monkeypatch.setenv("PATH", str(tmp_path / "no-bin"))
    np.testing.assert_array_equal(_rows(model.transform(vec), ["prediction"])[0], ref)
    assert model.lastInferenceEngine == "arrow"
    with pytest.raises(ValueError, match="inferenceEngine='jvm' cannot score this model: no javac"):
        model.copy({model.inferenceEngine: "jvm"}).transform(vec)


def test_engine_param_saves_and_loads(digits_frames, tmp_path):
    vec, _, _ = digits_frames
    model = _model(SparkNetClassificationModel, NETS["relu-softmax"](), inferenceEngine="arrow")
    model.write().save(str(tmp_path / "m"))
    loaded = SparkNetClassificationModel.load(str(tmp_path / "m"))
    assert loaded.getInferenceEngine() == "arrow"
    loaded.transform(vec)
    assert loaded.lastInferenceEngine == "arrow"
    with pytest.raises(TypeError, match="inferenceEngine must be one of"):
        model.copy({model.inferenceEngine: "gpu"})


def test_sparse_vectors_on_the_jvm(spark, digits_frames):
    """Sparse Vectors (VectorAssembler makes them when most values are zero) score as
    their dense equivalents."""
    from pyspark.ml.linalg import SparseVector

    _, _, Xt = digits_frames
    X = Xt[:200]
    rows = [(SparseVector(64, {int(j): float(x[j]) for j in np.flatnonzero(x)}),) for x in X]
    sparse = spark.createDataFrame(rows, ["features"])
    dense = spark.createDataFrame([(Vectors.dense(x),) for x in X], ["features"])
    model = _model(SparkNetClassificationModel, NETS["relu-softmax"](), inferenceEngine="jvm")
    (raw_s,) = _rows(model.transform(sparse), ["rawPrediction"])
    (raw_d,) = _rows(model.transform(dense), ["rawPrediction"])
    np.testing.assert_array_equal(raw_s, raw_d)


@pytest.fixture(scope="module", autouse=True)
def _jvm_standalone_job(request):
    """The standalone test's driver program, started as the module's first test starts
    (when the standalone test is selected and Java is there): it runs on the standalone
    cluster while the module's other tests run here (``None`` otherwise)."""
    from helpers.early_job import start_for

    yield from start_for(request, "test_jvm_engine_on_a_standalone_cluster",
                         "ml_jvm_standalone_job.py")


@pytest.mark.slow
def test_jvm_engine_on_a_standalone_cluster(standalone_cluster, _jvm_standalone_job):
    """Executors in their own JVMs (a master and 2 one-core workers on 127.0.0.1) fetch the
    jar the driver added and score as the Arrow engine does."""
    import json

    stdout, stderr = _jvm_standalone_job.communicate(timeout=240)
    proc = _jvm_standalone_job
    lines = [ln for ln in stdout.splitlines() if ln.startswith("RESULT ")]
    assert proc.returncode == 0 and lines, f"job failed ({proc.returncode}):\n{stderr[-4000:]}"
    out = json.loads(lines[-1][len("RESULT "):])
    assert out["engines"] == ["jvm", "arrow"]
    assert out["block_managers"] == 3          # the driver and two executors
    raw_j, raw_a = np.array(out["raw_jvm"]), np.array(out["raw_arrow"])
    assert raw_j.shape == (600, 10)
    np.testing.assert_allclose(raw_j, raw_a, rtol=0, atol=2e-6 * np.abs(raw_a).max())
    pj, pa = np.array(out["pred_jvm"]), np.array(out["pred_arrow"])
    assert (pj == pa).mean() > 0.99


def test_auto_falls_back_when_the_jvm_engine_fails_to_set_up(digits_frames, monkeypatch, caplog):
    """If the JVM side cannot be set up (here: a class the jar does not have, as another
    Spark's internals might), ``auto`` logs why and scores through Arrow; ``jvm`` raises."""
    vec, _, _ = digits_frames
    model = _model(SparkNetClassificationModel, NETS["relu-softmax"]())
    ref = _rows(model.copy({model.inferenceEngine: "arrow"}).transform(vec), ["prediction"])[0]
    assert _jvm.unavailable(vec.sparkSession) is None      # the jar is built and added
    monkeypatch.setattr(_jvm, "SCORER_CLASS", "sparknet.jvm.NoSuchScorer")
    with caplog.at_level("WARNING", logger="sparknet.ml"):
        out = model.transform(vec)
    assert model.lastInferenceEngine == "arrow"
    assert "falls back to the Arrow engine" in caplog.text and "NoSuchScorer" in caplog.text
    np.testing.assert_array_equal(_rows(out, ["prediction"])[0], ref)
    with pytest.raises(Exception, match="NoSuchScorer"):
        model.copy({model.inferenceEngine: "jvm"}).transform(vec)
