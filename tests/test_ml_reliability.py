"""sparknet.ml under faults and bad input: checkpoints and resume of the Estimators, atomic
saves, tampered or truncated saved folders, and bad Params or DataFrames refused (naming
the Param or the column) before any training step.  Real local Spark, sklearn's digits."""
from __future__ import annotations

import math
import os
import signal
import subprocess
import sys
import time

import numpy as np
import pytest

pytest.importorskip("pyspark")

from pyspark.ml.feature import VectorAssembler  # noqa: E402
from pyspark.ml.linalg import Vectors  # noqa: E402
from pyspark.ml.param import Param, Params, TypeConverters  # noqa: E402
from pyspark.sql import types as T  # noqa: E402

from helpers.models import mlp  # noqa: E402
from sparknet import Dense, Sequential  # noqa: E402
from sparknet.layers import LSTM  # noqa: E402
from sparknet.ml import SparkNetClassifier, SparkNetRegressor  # noqa: E402

FAST = dict(numPartitions=2, localSteps=64, batchSize=32)


def _clf(**kw):
    return SparkNetClassifier(network=mlp(8), epochs=1, **dict(FAST, **kw))


def _reg(**kw):
    return SparkNetRegressor(network=Sequential([Dense(4, activation="relu"), Dense(1)]), epochs=1,
                             **dict(FAST, **kw))


@pytest.fixture(scope="module")
def small(digits):
    X, y, _, _ = digits
    return X[:60].astype(np.float64), y[:60].astype(np.float64)


def _rows(X, y):
    return [(Vectors.dense(x), float(t)) for x, t in zip(X, y)]


def _vec_df(spark, X, y):
    """Vector features (Python rows, so that NaN stays NaN) and a double label."""
    schema = T.StructType([T.StructField("features", Vectors.dense([0.0]).__UDT__, True),
                           T.StructField("label", T.DoubleType(), True)])
    return spark.createDataFrame(_rows(X, y), schema)


def _arr_df(spark, X, y, elem=None):
    elem = T.DoubleType() if elem is None else elem
    schema = T.StructType([T.StructField("features", T.ArrayType(elem, True), True),
                           T.StructField("label", T.DoubleType(), True)])
    return spark.createDataFrame([([None if v is None else v for v in x], None if t is None else float(t))
                                  for x, t in zip(X, y)], schema)


def _jobs_during(spark, fn):
    """Run ``fn()`` under a job group; returns (what it raised or None, Spark jobs it ran)."""
    sc = spark.sparkContext
    group = f"reliability-{time.monotonic_ns()}"
    sc.setJobGroup(group, "bad input")
    err = None
    try:
        fn()
    except Exception as exc:  # noqa: BLE001 -- the test inspects whatever was raised
        err = exc
    finally:
        sc.setLocalProperty("spark.jobGroup.id", None)
        sc.setLocalProperty("spark.job.description", None)
    return err, len(sc.statusTracker().getJobIdsForGroup(group))


# at most the data-loading jobs (the shard job and its shuffle): a fit runs its
# rounds after them, so 2 jobs or fewer means no training step;
# sequence columns take 2 more (their length statistics, an aggregation); a null vector
# is found by the shard job itself, which fails, and one job deletes what its finished
# tasks wrote
_MAX_JOBS = 2
_SEQUENCE_STATS_JOBS = 2


# --------------------------------------------------------------------- bad Params
# (Estimator, Param, bad value); each must be refused when set or when fit starts, with
# a TypeError/ValueError naming the Param
PARAM_CASES = [
    ("clf", "learningRate", float("nan")), ("clf", "learningRate", -1e-3), ("clf", "learningRate", 0.0),
    ("clf", "learningRate", float("inf")), ("clf", "learningRate", "fast"),
    ("clf", "batchSize", 0), ("clf", "batchSize", -3), ("clf", "batchSize", 2.5), ("clf", "batchSize", True),
    ("clf", "epochs", 0), ("clf", "epochs", -1), ("clf", "epochs", 1.5), ("clf", "epochs", "ten"),
    ("clf", "momentum", -0.5), ("clf", "momentum", float("nan")),
    ("clf", "rho", 1.0), ("clf", "rho", -0.1), ("clf", "rho", float("nan")),
    ("clf", "weightDecay", -1.0), ("clf", "weightDecay", float("inf")),
    ("clf", "numPartitions", -1), ("clf", "localSteps", -2), ("clf", "maxSequenceLength", -1),
    ("clf", "inputShape", [0]), ("clf", "inputShape", [-2, 4]), ("clf", "inputShape", "8x8"),
    ("clf", "network", 42), ("clf", "network", "{oops"), ("clf", "network", {"layers": []}),
    ("clf", "network", {"layers": [{"class": "NoSuchLayer", "config": {}}]}),
    ("clf", "network", {"layers": [{"class": "Dense", "config": {"units": -3}}]}),
    ("clf", "mode", "fast"), ("clf", "syncMethod", "median"), ("clf", "optimizer", "adagrad"),
    ("clf", "inferenceBatchSize", 0), ("clf", "inferenceEngine", "gpu"),
    ("clf", "thresholds", [-1.0] + [1.0] * 9), ("clf", "thresholds", [0.0, 0.0] + [1.0] * 8),
    ("clf", "thresholds", [0.5, 0.5, 0.5]),
    ("clf", "seed", "abc"), ("clf", "seed", 1.5), ("clf", "verbose", "x"), ("clf", "verbose", -1),
    ("clf", "featuresCol", 5), ("clf", "labelCol", ""),
    ("clf", "checkpointInterval", 0), ("clf", "checkpointInterval", -2), ("clf", "checkpointInterval", 1.5),
    ("clf", "checkpointDir", 5), ("clf", "resume", "yes"), ("clf", "resume", 1),
    ("reg", "learningRate", float("nan")), ("reg", "batchSize", 0), ("reg", "epochs", -2),
]


def _param_id(case):
    return f"{case[0]}-{case[1]}={case[2]!r}"


@pytest.mark.parametrize("case", PARAM_CASES, ids=[_param_id(c) for c in PARAM_CASES])
def test_bad_param_refused_with_its_name(spark, small, case):
    which, name, value = case
    make = _clf if which == "clf" else _reg
    try:
        est = make(**{name: value})
    except (TypeError, ValueError) as exc:
        assert name in str(exc) and "unexpected keyword" not in str(exc), \
            f"refused, but the message does not name {name}: {exc}"
        return
    X, y = small
    df = _vec_df(spark, X, y)
    err, jobs = _jobs_during(spark, lambda: est.fit(df))
    assert err is not None, f"{name}={value!r} was accepted and trained on"
    assert isinstance(err, (TypeError, ValueError)), f"{name}={value!r}: {type(err).__name__}: {err}"
    assert name in str(err), f"refused, but the message does not name {name}: {err}"
    assert jobs <= _MAX_JOBS, f"{jobs} Spark jobs ran before {name}={value!r} was refused"


def test_resume_without_checkpoint_dir_is_refused(spark, small):
    X, y = small
    err, jobs = _jobs_during(spark, lambda: _clf(resume=True).fit(_vec_df(spark, X, y)))
    assert isinstance(err, ValueError) and "checkpointDir" in str(err), err
    assert jobs == 0
    err, jobs = _jobs_during(spark, lambda: _clf(resume=True, checkpointDir="/tmp/unused", checkpointInterval=-1)
                             .fit(_vec_df(spark, X, y)))
    assert isinstance(err, ValueError) and "checkpointInterval=-1" in str(err), err
    assert jobs == 0


# ----------------------------------------------------------------- bad DataFrames
def _seq_df(spark, rows):
    schema = T.StructType([T.StructField("features", T.ArrayType(T.ArrayType(T.DoubleType())), True),
                           T.StructField("label", T.DoubleType(), True)])
    return spark.createDataFrame(rows, schema)


def _with(X, y, i=7, j=3, x=None, t=None):
    """Copies of X, y (lists of lists / floats, None allowed) with one value changed."""
    Xl = [list(map(float, r)) for r in X]
    yl = [float(v) for v in y]
    if x is not None:
        Xl[i][j] = x
    if t is not None:
        yl[i] = t
    return Xl, yl


def _df_missing_features(spark, X, y):
    return _vec_df(spark, X, y).withColumnRenamed("features", "pixels")


def _df_missing_label(spark, X, y):
    return _vec_df(spark, X, y).withColumnRenamed("label", "digit")


def _df_string_features(spark, X, y):
    return spark.createDataFrame([("a", 1.0)] * 4, ["features", "label"])


def _df_array_of_strings(spark, X, y):
    return _arr_df(spark, [[str(v) for v in r] for r in X[:8]], y[:8], T.StringType())


def _df_string_label(spark, X, y):
    df = _vec_df(spark, X, y)
    return df.withColumn("label", df["label"].cast("string"))


def _df_null_vector(spark, X, y):
    rows = _rows(X, y)
    rows[5] = (None, rows[5][1])
    return spark.createDataFrame(rows, _vec_df(spark, X[:1], y[:1]).schema)


def _df_null_label(spark, X, y):
    rows = _rows(X, y)
    rows[5] = (rows[5][0], None)
    return spark.createDataFrame(rows, _vec_df(spark, X[:1], y[:1]).schema)


def _df_ragged_arrays(spark, X, y):
    Xl, yl = _with(X, y)
    Xl[9] = Xl[9][:50]
    return _arr_df(spark, Xl, yl)


def _df_ragged_vectors(spark, X, y):
    rows = _rows(X, y)
    rows[9] = (Vectors.dense(X[9][:50]), rows[9][1])
    return spark.createDataFrame(rows, _vec_df(spark, X[:1], y[:1]).schema)


def _df_null_element(spark, X, y):
    Xl, yl = _with(X, y)
    Xl[4][10] = None
    return _arr_df(spark, Xl, yl)


def _df_nan_vector(spark, X, y):
    Xn = X.copy()
    Xn[7, 3] = np.nan
    return _vec_df(spark, Xn, y)


def _df_inf_array(spark, X, y):
    return _arr_df(spark, *_with(X, y, x=math.inf))


def _df_neg_inf_vector(spark, X, y):
    Xn = X.copy()
    Xn[3, 0] = -np.inf
    return _vec_df(spark, Xn, y)


def _df_nan_sparse(spark, X, y):
    rows = [(Vectors.sparse(64, {0: 1.0}), float(t)) for t in y]
    rows[2] = (Vectors.sparse(64, {5: float("nan")}), rows[2][1])
    return spark.createDataFrame(rows, _vec_df(spark, X[:1], y[:1]).schema)


def _df_label(value):
    def make(spark, X, y):
        return _vec_df(spark, X, _with(X, y, i=5, t=value)[1])
    make.__name__ = f"_df_label_{value}"
    return make


def _df_empty(spark, X, y):
    return _vec_df(spark, X, y).limit(0)


def _df_seq_null_row(spark, X, y):
    return _seq_df(spark, [([[1.0, 2.0], [3.0, 4.0]], 0.0), (None, 1.0), ([[1.0, 2.0]], 1.0)])


def _df_seq_ragged(spark, X, y):
    return _seq_df(spark, [([[1.0, 2.0], [3.0, 4.0]], 0.0), ([[1.0, 2.0], [3.0]], 1.0)])


def _df_seq_nan(spark, X, y):
    return _seq_df(spark, [([[1.0, 2.0], [3.0, 4.0]], 0.0), ([[1.0, float("nan")]], 1.0)] * 4)


def _df_assembled_10(spark, X, y):
    df = spark.createDataFrame([tuple(map(float, r[:10])) + (float(t),) for r, t in zip(X, y)],
                               [f"c{i}" for i in range(10)] + ["label"])
    return VectorAssembler(inputCols=[f"c{i}" for i in range(10)], outputCol="features").transform(df)


def _df_reg_vector_label(spark, X, y):
    rows = [(Vectors.dense(x), Vectors.dense([float(t), 1.0])) for x, t in zip(X, y)]
    return spark.createDataFrame(rows, ["features", "label"])


_LSTM = dict(network=Sequential([LSTM(4), Dense(2, activation="softmax")]), numPartitions=2, batchSize=2)

# (id, estimator factory, DataFrame builder, regex the message must match: the column named)
DF_CASES = [
    ("missing features", _clf, _df_missing_features, r"features column 'features'"),
    ("missing label", _clf, _df_missing_label, r"label column 'label'"),
    ("string features", _clf, _df_string_features, r"features column 'features' has type string"),
    ("array of strings", _clf, _df_array_of_strings, r"features column 'features' has type array<string>"),
    ("string label", _clf, _df_string_label, r"label column 'label' has type string"),
    ("null vector", _clf, _df_null_vector, r"features column 'features'.*null"),
    ("null label", _clf, _df_null_label, r"label column 'label'.*null"),
    ("ragged arrays", _clf, _df_ragged_arrays, r"features column 'features'.*(50|lengths|sizes)"),
    ("ragged vectors", _clf, _df_ragged_vectors, r"features column 'features'.*(50|lengths|sizes)"),
    # Arrow hands a null element to numpy as NaN: refused as such, with its row and element
    ("null element", _clf, _df_null_element, r"features column 'features'.*(null|nan).*element 10"),
    ("nan vector", _clf, _df_nan_vector, r"features column 'features'.*nan"),
    ("inf array", _clf, _df_inf_array, r"features column 'features'.*inf"),
    ("-inf vector", _clf, _df_neg_inf_vector, r"features column 'features'.*inf"),
    ("nan sparse vector", _clf, _df_nan_sparse, r"features column 'features'.*nan"),
    ("label 10", _clf, _df_label(10.0), r"label column 'label'.*10"),
    ("label -1", _clf, _df_label(-1.0), r"label column 'label'.*-1"),
    ("label 2.5", _clf, _df_label(2.5), r"label column 'label'.*2\.5"),
    ("label nan", _clf, _df_label(float("nan")), r"label column 'label'.*nan"),
    ("label inf", _clf, _df_label(float("inf")), r"label column 'label'.*inf"),
    ("empty", _clf, _df_empty, r"(empty|no rows)"),
    ("inputShape mismatch", lambda: _clf(inputShape=[65]), _vec_df,
     r"features column 'features'.*65"),
    ("assembled size 10 vs inputShape 64", lambda: _clf(inputShape=[64]), _df_assembled_10,
     r"features column 'features'.*10"),
    ("sequence null row", lambda: SparkNetClassifier(epochs=1, **_LSTM), _df_seq_null_row,
     r"column 'features'.*null"),
    ("sequence ragged steps", lambda: SparkNetClassifier(epochs=1, **_LSTM), _df_seq_ragged,
     r"column 'features'.*different lengths"),
    ("sequence nan", lambda: SparkNetClassifier(epochs=1, **_LSTM), _df_seq_nan,
     r"column 'features'.*nan"),
    ("regressor nan label", _reg, _df_label(float("nan")), r"label column 'label'.*nan"),
    ("regressor inf label", _reg, _df_label(float("inf")), r"label column 'label'.*inf"),
    ("regressor null label", _reg, _df_null_label, r"label column 'label'.*null"),
    ("regressor 2 targets, 1 output", _reg, _df_reg_vector_label, r"label column 'label'.*2"),
]


def _resident_folders() -> set[str]:
    """The resident-state folders on this host (every spill base)."""
    from sparknet.cluster.resident import spill

    return {os.path.join(b, n) for b in spill.candidate_bases(None) if os.path.isdir(b)
            for n in os.listdir(b) if n.startswith(spill.PREFIX)}


@pytest.mark.slow
@pytest.mark.parametrize("case", DF_CASES, ids=[c[0] for c in DF_CASES])
def test_bad_dataframe_refused_before_training(spark, small, case):
    _, make, build, match = case
    X, y = small
    df = build(spark, X, y)
    est = make()
    before = _resident_folders()
    err, jobs = _jobs_during(spark, lambda: est.fit(df))
    assert err is not None, "accepted and trained on"
    assert _resident_folders() - before == set(), "a refused fit left shards behind"
    assert isinstance(err, ValueError), f"{type(err).__name__}: {str(err)[:300]}"
    import re
    assert re.search(match, str(err), re.IGNORECASE | re.DOTALL), f"message does not name the column: {err}"
    allowed = _MAX_JOBS + (_SEQUENCE_STATS_JOBS if case[0].startswith("sequence") else 0)
    assert jobs <= allowed, f"{jobs} Spark jobs ran before the error"


# ------------------------------------------------------------------ atomic saves
def _model(hidden=8, seed=0):
    """A Model holding an untrained 64-hidden-10 network (saving needs no training)."""
    from sparknet.ml import SparkNetClassificationModel

    net = mlp(hidden, seed=seed)
    net.build((64,))
    return SparkNetClassificationModel.from_network(net)


def _listing(folder):
    return sorted(os.path.relpath(os.path.join(d, f), folder)
                  for d, _, files in os.walk(folder) for f in files)


class _FailingParquetWrites:
    """Every Parquet write of the session fails (a committer class that does not exist,
    read by Spark's Parquet writer from the Hadoop configuration; the metadata, a text
    write, still succeeds): a real failure of the data write half-way through a save."""

    KEY = "spark.sql.parquet.output.committer.class"

    def __init__(self, spark):
        self.conf = spark.sparkContext._jsc.hadoopConfiguration()

    def __enter__(self):
        self.conf.set(self.KEY, "org.example.NoSuchCommitter")

    def __exit__(self, *exc):
        self.conf.unset(self.KEY)


def test_failed_model_save_leaves_nothing(spark, tmp_path):
    target = tmp_path / "model"
    with _FailingParquetWrites(spark), pytest.raises(OSError, match=r"cannot save SparkNetClassificationModel "
                                                     r".*NoSuchCommitter.*nothing was left there"):
        _model().write().save(str(target))
    assert os.listdir(tmp_path) == [], "a failed save left files behind"


def test_failed_overwrite_keeps_the_old_model(spark, tmp_path):
    from sparknet.ml import SparkNetClassificationModel

    target = str(tmp_path / "model")
    old = _model(seed=1)
    old.write().save(target)
    before = _listing(target)
    with _FailingParquetWrites(spark), pytest.raises(OSError, match="the folder there is unchanged"):
        _model(seed=2).write().overwrite().save(target)
    assert os.listdir(tmp_path) == ["model"] and _listing(target) == before
    np.testing.assert_array_equal(SparkNetClassificationModel.load(target).network.params, old.network.params)
    # and a working overwrite replaces it whole
    new = _model(hidden=16, seed=3)
    new.write().overwrite().save(target)
    assert os.listdir(tmp_path) == ["model"]
    np.testing.assert_array_equal(SparkNetClassificationModel.load(target).network.params, new.network.params)


def test_save_over_a_leftover_folder_is_refused_before_writing(spark, tmp_path):
    """A folder already there (a crashed save's ``data/``, say) is refused whole, without
    overwrite(); before, the metadata was written into it and the data write then failed."""
    target = tmp_path / "model"
    (target / "data").mkdir(parents=True)
    with pytest.raises(ValueError, match="already exists; use write\\(\\).overwrite\\(\\)"):
        _model().write().save(str(target))
    assert _listing(str(target)) == [] and os.listdir(target) == ["data"]


class _LooseClassifier(SparkNetClassifier):
    """A subclass whose checkpointDir Param takes any value (no converter)."""

    checkpointDir = Param(Params._dummy(), "checkpointDir", "checkpoint folder",
                          typeConverter=TypeConverters.identity)


def test_estimator_save_refuses_a_param_json_cannot_hold(spark, tmp_path):
    est = _LooseClassifier(network=mlp(8), epochs=1, **FAST)
    est.set(est.checkpointDir, {1, 2})  # past the converter, as a subclass lets it
    assert est.getCheckpointDir() == {1, 2}
    target = tmp_path / "est"
    with pytest.raises(ValueError, match="Param checkpointDir holds .*JSON cannot store"):
        est.write().save(str(target))
    assert not target.exists() and os.listdir(tmp_path) == []
    est = _clf(checkpointDir=str(tmp_path / "ck"), checkpointInterval=2, resume=True)
    est.write().save(str(target))
    back = SparkNetClassifier.load(str(target))
    assert (back.getCheckpointDir(), back.getCheckpointInterval(), back.getResume()) == \
        (str(tmp_path / "ck"), 2, True)
    assert [n for n in os.listdir(tmp_path) if n.startswith(".")] == []


def test_a_killed_saves_leftovers(spark, tmp_path):
    """What a save killed mid-way leaves: its hidden temporary folder (deleted by the next
    save to that path once it is an hour old, never a younger, possibly live one) or, killed
    inside an overwrite, the old folder moved aside (named by the load error)."""
    from sparknet.ml import SparkNetClassificationModel

    stale, live = tmp_path / ".model.sparknet-tmp-dead", tmp_path / ".model.sparknet-tmp-live"
    for d in (stale, live):
        (d / "metadata").mkdir(parents=True)
    hours_ago = time.time() - 7200
    os.utime(stale, (hours_ago, hours_ago))
    target = str(tmp_path / "model")
    _model().write().save(target)
    assert sorted(os.listdir(tmp_path)) == [".model.sparknet-tmp-live", "model"]
    os.rename(target, str(tmp_path / ".model.sparknet-old-0123456789ab"))
    with pytest.raises(ValueError, match=r"an overwrite of it was interrupted, its previous version is at "
                                         r"\S*\.model\.sparknet-old-0123456789ab"):
        SparkNetClassificationModel.load(target)


def _data_file(folder):
    return next(os.path.join(folder, "data", f) for f in os.listdir(os.path.join(folder, "data"))
                if f.endswith(".parquet"))


def _drop_crc(folder):
    for f in os.listdir(folder):
        if f.endswith(".crc"):
            os.remove(os.path.join(folder, f))


def test_load_refuses_another_networks_weights(spark, tmp_path):
    import shutil

    from sparknet.ml import SparkNetClassificationModel

    a, b = str(tmp_path / "a"), str(tmp_path / "b")
    _model(hidden=8).write().save(a)
    _model(hidden=16).write().save(b)
    shutil.rmtree(os.path.join(a, "data"))
    shutil.copytree(os.path.join(b, "data"), os.path.join(a, "data"))
    with pytest.raises(ValueError, match=r"belong to another network: the metadata describes input "
                       r"\(64,\), Dense\(8\) -> Dense\(10\), 610 parameters, data/ holds input \(64,\), "
                       r"Dense\(16\) -> Dense\(10\), 1210 parameters"):
        SparkNetClassificationModel.load(a)
    # same architecture, other weights: the checksum tells
    c = str(tmp_path / "c")
    _model(hidden=16, seed=5).write().save(c)
    shutil.rmtree(os.path.join(c, "data"))
    shutil.copytree(os.path.join(b, "data"), os.path.join(c, "data"))
    with pytest.raises(ValueError, match="not the ones saved with its metadata \\(SHA-256 differs"):
        SparkNetClassificationModel.load(c)


def test_load_refuses_a_truncated_weights_file(spark, tmp_path):
    from sparknet.ml import SparkNetClassificationModel

    a = str(tmp_path / "a")
    _model().write().save(a)
    f = _data_file(a)
    with open(f, "rb") as fh:
        blob = fh.read()
    with open(f, "wb") as fh:
        fh.write(blob[: len(blob) // 2])
    _drop_crc(os.path.join(a, "data"))
    with pytest.raises(ValueError, match=r"stored network \(data/\) cannot be read"):
        SparkNetClassificationModel.load(a)
    with pytest.raises(ValueError, match="holds no readable saved stage"):
        SparkNetClassificationModel.load(str(tmp_path / "nothing-here"))


# ------------------------------------------------------------- checkpoints, resume
# float64, exact minibatch SGD: 1,347 digits in 256-row global minibatches, 6 rounds an
# epoch; a checkpoint after every epoch
RESUME = dict(syncMethod="gradient", numPartitions=2, batchSize=256, learningRate=3e-3, seed=0,
              checkpointInterval=1)
RESUME_EPOCHS = 3
KILL_AT_ROUND = 10  # in epoch 2: the newest checkpoint is epoch 1's


def _resume_clf(**kw):
    net = Sequential([Dense(32, activation="relu"), Dense(10, activation="softmax")], seed=0, dtype="float64")
    return SparkNetClassifier(network=net, **dict(RESUME, **kw))


def _digits_df(spark, X, y):
    """The training DataFrame, built the same way in the test and in the killed driver."""
    schema = T.StructType([T.StructField("features", Vectors.dense([0.0]).__UDT__, False),
                           T.StructField("label", T.DoubleType(), False)])
    return spark.createDataFrame(_rows(X, y), schema)


def _killed_driver(directory, kill_at):
    """Driver program (run as ``python test_ml_reliability.py resume-job DIR ROUND``): the
    Estimator fit with checkpoints, SIGKILLed after round ``kill_at``, as a crashed driver."""
    from pyspark.sql import SparkSession

    from sparknet.callbacks import LambdaCallback
    from sparknet.cluster.resident import driver as resident
    from sparknet.datasets import load_digits

    X, y, _, _ = load_digits(test_size=0.25, seed=0)
    spark = (SparkSession.builder.master("local[2]").appName("sparknet-ml-resume-job")
             .config("spark.ui.enabled", "false").config("spark.driver.memory", "1g")
             .config("spark.python.worker.reuse", "true").getOrCreate())
    spark.sparkContext.setLogLevel("ERROR")

    def crash(_round, logs):  # after each round and its checkpoint
        if logs["rounds_done"] >= kill_at:
            for res in resident.open_states():  # what the killed driver leaves, for the test to remove
                for info in res.infos:
                    print(f"SHARD {os.path.dirname(info.directory)}", flush=True)
            print(f"KILLED at round {int(logs['rounds_done'])} (epoch {int(logs['epoch']) + 1})",
                  flush=True)
            os.kill(os.getpid(), signal.SIGKILL)

    _resume_clf(epochs=RESUME_EPOCHS, checkpointDir=directory,
                callbacks=[LambdaCallback(on_round_end=crash)]).fit(_digits_df(spark, X, y))
    return 3  # not reached


@pytest.fixture(scope="module")
def digits_train(spark, digits):
    X, y, _, _ = digits
    return _digits_df(spark, X, y).cache()


@pytest.fixture(scope="module")
def uninterrupted(digits_train):
    return _resume_clf(epochs=RESUME_EPOCHS).fit(digits_train)


@pytest.mark.slow
def test_estimator_resumes_a_killed_fit_bit_identically(spark, digits_train, uninterrupted, tmp_path, monkeypatch):
    import shutil

    from sparknet.checkpoint import CheckpointStore

    folder = str(tmp_path / "ckpt")
    env = dict(os.environ, PYSPARK_PYTHON=sys.executable, OPENBLAS_NUM_THREADS="1")
    t0 = time.perf_counter()
    out = subprocess.run([sys.executable, os.path.abspath(__file__), "resume-job", folder, str(KILL_AT_ROUND)],
                         capture_output=True, text=True, env=env, timeout=600)
    for line in out.stdout.splitlines():
        if line.startswith("SHARD "):
            shutil.rmtree(line[6:], ignore_errors=True)
    assert out.returncode == -signal.SIGKILL, out.stdout + out.stderr[-3000:]
    assert f"KILLED at round {KILL_AT_ROUND} (epoch 2)" in out.stdout
    store = CheckpointStore(folder)
    latest = store.latest()
    assert latest is not None and [c.step for c in store.checkpoints()] == [latest.step]
    print(f"killed driver: {time.perf_counter() - t0:.1f} s; newest checkpoint {latest.meta}")

    t0 = time.perf_counter()
    resumed = _resume_clf(epochs=RESUME_EPOCHS, checkpointDir=folder, resume=True).fit(digits_train)
    print(f"resumed fit: {time.perf_counter() - t0:.1f} s")
    np.testing.assert_array_equal(resumed.network.params, uninterrupted.network.params)
    assert resumed.history["loss"] == uninterrupted.history["loss"]
    assert len(store.checkpoints()) == RESUME_EPOCHS  # epochs 1 (the killed fit's), 2 and 3
    # what the killed driver left in /dev/shm is swept (here at once, not after the grace period)
    from sparknet.cluster.resident import spill
    monkeypatch.setattr(spill, "GRACE", 0.0)
    app = spark.sparkContext.applicationId
    spill.sweep_stale(app, force=True)
    left = [n for n in os.listdir(spill.SHM) if n.startswith(spill.PREFIX)
            and spill.stale_reason(os.path.join(spill.SHM, n), app) is not None]
    assert left == []


def test_estimator_resume_with_more_epochs_continues_a_finished_fit(digits_train, uninterrupted, tmp_path):
    folder = str(tmp_path / "ckpt")
    first = _resume_clf(epochs=RESUME_EPOCHS - 1, checkpointDir=folder).fit(digits_train)
    from sparknet.checkpoint import CheckpointStore

    assert len(CheckpointStore(folder).checkpoints()) == RESUME_EPOCHS - 1
    more = _resume_clf(epochs=RESUME_EPOCHS, checkpointDir=folder, resume=True).fit(digits_train)
    np.testing.assert_array_equal(more.network.params, uninterrupted.network.params)
    assert not np.array_equal(first.network.params, more.network.params)
    # the checkpoints of another network are refused, the Param named
    other = SparkNetClassifier(network=mlp(16, dtype="float64"), epochs=RESUME_EPOCHS,
                               checkpointDir=folder,
                               resume=True, **{k: v for k, v in RESUME.items() if k != "checkpointInterval"})
    with pytest.raises(ValueError, match="belongs to another network.*new checkpointDir"):
        other.fit(digits_train)
    # checkpointInterval=-1 writes none, even with a folder
    none = str(tmp_path / "none")
    _resume_clf(epochs=1, checkpointDir=none, checkpointInterval=-1).fit(digits_train)
    assert not os.path.exists(none) or os.listdir(none) == []


if __name__ == "__main__" and sys.argv[1:2] == ["resume-job"]:
    sys.exit(_killed_driver(sys.argv[2], int(sys.argv[3])))
