"""Spark ML Estimators and Models (implementation; import them from :mod:`sparknet.ml`)."""
from __future__ import annotations

import importlib
import json
import logging
import pkgutil
import uuid
import zlib
from typing import Any

import numpy as np
from pyspark import keyword_only
from pyspark.ml.classification import ProbabilisticClassificationModel, ProbabilisticClassifier
from pyspark.ml.linalg import DenseVector, Vector, Vectors
from pyspark.ml.param import Param, Params, TypeConverters
from pyspark.ml.param.shared import HasSeed
from pyspark.ml.regression import _PredictorParams
from pyspark.ml.util import MLReadable, MLWritable
from pyspark.ml.base import PredictionModel, Predictor

from sparknet.ml import _columns, _jvm
from sparknet.ml._inference import BatchPredictor, arrow_function, output_type
from sparknet.ml._persistence import SparkNetReader, SparkNetWriter
from sparknet.model import Sequential

_log = logging.getLogger("sparknet.ml")

__all__ = ["SparkNetClassifier", "SparkNetClassificationModel", "SparkNetRegressor",
           "SparkNetRegressionModel"]


# ------------------------------------------------------------------------------ params
def _to_network(value: Any) -> str:
    """Param converter: a Sequential, its config dict, or JSON text -> canonical JSON text."""
    if isinstance(value, Sequential):
        config = value.get_config()
    elif isinstance(value, dict):
        config = value
    elif isinstance(value, str):
        try:
            config = json.loads(value)
        except json.JSONDecodeError as exc:
            raise TypeError(f"network: not JSON text ({exc})") from exc
    else:
        raise TypeError(f"network must be a sparknet Sequential, its get_config() dict or that dict "
                        f"as JSON, got {type(value).__name__}")
    if not isinstance(config, dict) or not isinstance(config.get("layers"), list) or not config["layers"]:
        raise TypeError("network: a Sequential config needs a non-empty 'layers' list")
    try:
        Sequential.from_config(dict(config, input_shape=None))
    except (ValueError, TypeError, KeyError) as exc:
        raise TypeError(f"network: {exc}") from exc
    return json.dumps(config, sort_keys=True)


def _choice(name: str, options: tuple[str, ...]):
    def conv(value):
        v = TypeConverters.toString(value)
        if v not in options:
            raise TypeError(f"{name} must be one of {options}, got {v!r}")
        return v
    return conv


def _non_negative_int(name: str):
    def conv(value):
        v = TypeConverters.toInt(value)
        if v < 0:
            raise TypeError(f"{name} must be >= 0, got {v}")
        return v
    return conv


def _positive_int(name: str):
    def conv(value):
        v = TypeConverters.toInt(value)
        if v <= 0:
            raise TypeError(f"{name} must be > 0, got {v}")
        return v
    return conv


def _non_negative_float(name: str, positive: bool = False):
    def conv(value):
        v = TypeConverters.toFloat(value)
        if not np.isfinite(v) or v < 0 or (positive and v == 0):
            raise TypeError(f"{name} must be a finite number {'> 0' if positive else '>= 0'}, got {v}")
        return v
    return conv


def _shape(value):
    v = TypeConverters.toListInt(value)
    if any(d <= 0 for d in v):
        raise TypeError(f"inputShape must hold positive sizes, got {v}")
    return v


def _default_seed(cls) -> int:
    # MLlib seeds by the class name's hash; Python's str hash changes per process
    return zlib.crc32(cls.__name__.encode()) & 0x7FFFFFFF


class _InferenceParams(Params):
    inferenceBatchSize = Param(Params._dummy(), "inferenceBatchSize",
                               "rows per forward pass when transforming (> 0)",
                               typeConverter=_positive_int("inferenceBatchSize"))
    inferenceEngine = Param(Params._dummy(), "inferenceEngine",
                            "where transform runs the network: 'arrow' (Python workers, Cython "
                            "kernels, Arrow batches), 'jvm' (Java over the rows; small dense "
                            "networks on Vector columns) or 'auto' (jvm where it can run and is faster)",
                            typeConverter=_choice("inferenceEngine", ("auto", "arrow", "jvm")))

    def __init__(self) -> None:
        super().__init__()
        self._setDefault(inferenceBatchSize=4096, inferenceEngine="auto")

    def getInferenceEngine(self) -> str:
        """Where ``transform`` runs the network: ``"auto"``, ``"arrow"`` or ``"jvm"``."""
        return self.getOrDefault(self.inferenceEngine)

    def setInferenceEngine(self, value: str):
        """Set :attr:`inferenceEngine` (``"auto"``, ``"arrow"`` or ``"jvm"``; anything else
        raises a TypeError naming the choices)."""
        return self._set(inferenceEngine=value)

    def getInferenceBatchSize(self) -> int:
        return self.getOrDefault(self.inferenceBatchSize)

    def setInferenceBatchSize(self, value: int):
        return self._set(inferenceBatchSize=value)


class _SparkNetParams(_PredictorParams, HasSeed, _InferenceParams):
    """Params shared by sparknet's Estimators (and kept on their Models)."""

    network = Param(Params._dummy(), "network",
                    "the network: a sparknet Sequential's architecture (get_config()) as JSON text; "
                    "a Sequential or its config dict may be passed and is converted",
                    typeConverter=_to_network)
    inputShape = Param(Params._dummy(), "inputShape",
                       "per-row input shape the flat features are reshaped to, e.g. [8, 8, 1] for a "
                       "conv net or [T, F] for a recurrent one; [] reads them flat",
                       typeConverter=_shape)
    epochs = Param(Params._dummy(), "epochs", "passes over the training data (> 0)",
                   typeConverter=_positive_int("epochs"))
    batchSize = Param(Params._dummy(), "batchSize", "rows per minibatch (> 0)",
                      typeConverter=_positive_int("batchSize"))
    learningRate = Param(Params._dummy(), "learningRate", "optimizer learning rate (> 0)",
                         typeConverter=_non_negative_float("learningRate", positive=True))
    optimizer = Param(Params._dummy(), "optimizer", "'rmsprop' or 'sgd'",
                      typeConverter=_choice("optimizer", ("rmsprop", "sgd")))
    momentum = Param(Params._dummy(), "momentum", "momentum factor (>= 0)",
                     typeConverter=_non_negative_float("momentum"))
    rho = Param(Params._dummy(), "rho", "RMSprop smoothing constant of the squared-gradient "
                "average, in [0, 1)", typeConverter=TypeConverters.toFloat)
    weightDecay = Param(Params._dummy(), "weightDecay", "L2 penalty added to the gradient (>= 0)",
                        typeConverter=_non_negative_float("weightDecay"))
    numPartitions = Param(Params._dummy(), "numPartitions",
                          "data shards (Spark partitions) to train on; 0 keeps the DataFrame's",
                          typeConverter=_non_negative_int("numPartitions"))
    mode = Param(Params._dummy(), "mode", "'sync' (synchronous rounds) or 'async' (asynchronous)",
                 typeConverter=_choice("mode", ("sync", "async")))
    syncMethod = Param(Params._dummy(), "syncMethod",
                       "synchronous rounds: 'average' (local steps, then average) or 'gradient' "
                       "(exact minibatch SGD)", typeConverter=_choice("syncMethod", ("average", "gradient")))
    localSteps = Param(Params._dummy(), "localSteps",
                       "local steps per round for syncMethod 'average'; 0 sizes rounds automatically",
                       typeConverter=_non_negative_int("localSteps"))
    maxSequenceLength = Param(Params._dummy(), "maxSequenceLength",
                              "sequence features: steps kept per row (longer sequences are cut, "
                              "shorter ones padded); 0 uses the longest training sequence",
                              typeConverter=_non_negative_int("maxSequenceLength"))
    verbose = Param(Params._dummy(), "verbose", "1 shows a progress bar on the driver",
                    typeConverter=TypeConverters.toInt)

    def __init__(self) -> None:
        super().__init__()
        self._setDefault(inputShape=[], epochs=10, batchSize=32, learningRate=1e-3,
                         optimizer="rmsprop", momentum=0.0, rho=0.99, weightDecay=0.0,
                         numPartitions=0, mode="sync", syncMethod="average", localSteps=0,
                         maxSequenceLength=0, verbose=0, seed=_default_seed(type(self)))

    # getters -------------------------------------------------------------------
    def getNetwork(self) -> Sequential:
        """The (untrained) network as a new Sequential."""
        if not self.isDefined(self.network):
            raise ValueError(f"{type(self).__name__}: set the network Param (a sparknet Sequential)")
        return Sequential.from_config(json.loads(self.getOrDefault(self.network)))

    def getInputShape(self) -> list[int]:
        return self.getOrDefault(self.inputShape)

    def getEpochs(self) -> int:
        return self.getOrDefault(self.epochs)

    def getBatchSize(self) -> int:
        return self.getOrDefault(self.batchSize)

    def getLearningRate(self) -> float:
        return self.getOrDefault(self.learningRate)

    def getOptimizer(self) -> str:
        return self.getOrDefault(self.optimizer)

    def getMomentum(self) -> float:
        return self.getOrDefault(self.momentum)

    def getRho(self) -> float:
        return self.getOrDefault(self.rho)

    def getWeightDecay(self) -> float:
        return self.getOrDefault(self.weightDecay)

    def getNumPartitions(self) -> int:
        return self.getOrDefault(self.numPartitions)

    def getMode(self) -> str:
        return self.getOrDefault(self.mode)

    def getSyncMethod(self) -> str:
        return self.getOrDefault(self.syncMethod)

    def getLocalSteps(self) -> int:
        return self.getOrDefault(self.localSteps)

    def getMaxSequenceLength(self) -> int:
        return self.getOrDefault(self.maxSequenceLength)

    def getVerbose(self) -> int:
        return self.getOrDefault(self.verbose)


class _Persistable:
    """ML persistence shared by the Estimators and the Models (see :mod:`._persistence`)."""

    def write(self):
        return SparkNetWriter(self)

    @classmethod
    def read(cls):
        return SparkNetReader(cls)


class _EstimatorMixin(_Persistable):
    """The fit shared by the classifier and the regressor."""

    _classification = True
    #: the Model class ``fit`` returns (set below, once the Model classes exist)
    _model_class: type

    def _fit(self, dataset):
        model = self._model_class()
        model._set_network(self._train(dataset))
        model._history = self._history
        return self._copy_to_model(model)

    def _set_all(self, kwargs: dict):
        return self._set(**{k: v for k, v in kwargs.items() if v is not None})

    # setters -------------------------------------------------------------------
    def setNetwork(self, value):
        return self._set(network=value)

    def setInputShape(self, value):
        return self._set(inputShape=value)

    def setEpochs(self, value: int):
        return self._set(epochs=value)

    def setBatchSize(self, value: int):
        return self._set(batchSize=value)

    def setLearningRate(self, value: float):
        return self._set(learningRate=value)

    def setOptimizer(self, value: str):
        return self._set(optimizer=value)

    def setMomentum(self, value: float):
        return self._set(momentum=value)

    def setRho(self, value: float):
        return self._set(rho=value)

    def setWeightDecay(self, value: float):
        return self._set(weightDecay=value)

    def setNumPartitions(self, value: int):
        return self._set(numPartitions=value)

    def setMode(self, value: str):
        return self._set(mode=value)

    def setSyncMethod(self, value: str):
        return self._set(syncMethod=value)

    def setLocalSteps(self, value: int):
        return self._set(localSteps=value)

    def setMaxSequenceLength(self, value: int):
        return self._set(maxSequenceLength=value)

    def setSeed(self, value: int):
        return self._set(seed=value)

    def setVerbose(self, value: int):
        return self._set(verbose=value)

    # the optimizer -------------------------------------------------------------
    def _make_optimizer(self):
        from sparknet import optim

        lr, mom, wd = self.getLearningRate(), self.getMomentum(), self.getWeightDecay()
        if self.getOptimizer() == "sgd":
            return optim.SGD(lr=lr, momentum=mom, weight_decay=wd)
        rho = self.getRho()
        if not 0.0 <= rho < 1.0:
            raise ValueError(f"rho must be in [0, 1), got {rho}")
        return optim.RMSprop(lr=lr, alpha=rho, weight_decay=wd, momentum=mom)

    # the network and the data ----------------------------------------------------
    def _prepare(self, dataset):
        """Returns ``(model, data, features column, label column)`` for the trainer."""
        fcol, lcol = self.getFeaturesCol(), self.getLabelCol()
        config = json.loads(self.getOrDefault(self.network)) if self.isDefined(self.network) else None
        if config is None:
            raise ValueError(f"{type(self).__name__}: set the network Param (a sparknet Sequential)")
        config = dict(config, seed=int(self.getSeed()) & 0x7FFFFFFF, input_shape=None)
        kind = _columns.feature_kind(dataset, fcol)
        shape = tuple(self.getInputShape())
        if kind.kind == "sequence":
            if len(shape) not in (0, 2):
                raise ValueError(f"sequence features need inputShape [T, F] or [], got {list(shape)}")
            stats = _columns.sequence_stats(dataset, fcol)
            longest, feat = _columns.check_sequences(stats, fcol, shape[1] if shape else None,
                                                     "training data")
            T = self.getMaxSequenceLength() or (shape[0] if shape else longest)
            config["layers"] = [{"class": "SequenceMask", "config": {"name": "sequence_mask"}}] + \
                [ly for ly in config["layers"] if ly["class"] != "SequenceMask"]
            model = Sequential.from_config(dict(config, input_shape=[T, feat + 1]))
            data = dataset.select(_columns.flat_features(dataset, fcol, kind, model.dtype.name, (T, feat))
                                  .alias(fcol), dataset[lcol])
            return model, data
        model = Sequential.from_config(config)
        if shape:
            model.build(shape)
            _columns.vector_size_check(kind, fcol, int(np.prod(shape)), "training data")
        elif kind.size is not None:
            model.build((kind.size,))
        self._check_network(model)
        return model, dataset

    def _check_network(self, model: Sequential) -> None:
        from sparknet.cluster.data_parallel import _is_classifier

        if self._classification and not _is_classifier(model):
            raise ValueError("SparkNetClassifier needs a network whose last layer is "
                             "Dense(numClasses, activation='softmax') (cross-entropy loss)")

    def _trainer_mode(self) -> str:
        """The trainer's mode; modes registered by other modules are imported on demand."""
        from sparknet.cluster import data_parallel

        mode = self.getMode()
        if mode != "sync" and mode not in data_parallel.EPOCH_RUNNERS:
            import sparknet.cluster as pkg
            for info in pkgutil.iter_modules(pkg.__path__):
                if "async" in info.name:
                    importlib.import_module(f"sparknet.cluster.{info.name}")
        return mode

    def _train(self, dataset) -> Sequential:
        from sparknet.cluster.data_parallel import DataParallelTrainer

        model, data = self._prepare(dataset)
        self._check_network(model)
        trainer = DataParallelTrainer(
            model, dataset.sparkSession, num_partitions=self.getNumPartitions() or None,
            mode=self._trainer_mode(), sync=self.getSyncMethod(),
            local_steps=self.getLocalSteps() or "auto", optimizer=self._make_optimizer(),
            loss=None if self._classification else "mse", seed=int(self.getSeed()) & 0x7FFFFFFF)
        model, history = trainer.fit(data, epochs=self.getEpochs(), batch_size=self.getBatchSize(),
                                     features_col=self.getFeaturesCol(), label_col=self.getLabelCol(),
                                     verbose=self.getVerbose())
        self._history = history
        return model

    def _copy_to_model(self, model):
        """The Estimator's Params that the Model shares (columns, batch sizes, ...)."""
        for p in model.params:
            if self.hasParam(p.name) and self.isSet(self.getParam(p.name)):
                model._set(**{p.name: self.getOrDefault(self.getParam(p.name))})
        return model


class _ModelMixin(_Persistable):
    """Transform shared by the classifier and regression models."""

    _has_network = True
    _network: Sequential | None = None
    _bc = None
    #: the engine the last ``transform`` used: ``"jvm"`` or ``"arrow"`` (None before one)
    lastInferenceEngine: str | None = None

    def _set_network(self, network: Sequential) -> None:
        if not isinstance(network, Sequential) or not network.built:
            raise ValueError("a sparknet Model needs a built Sequential")
        self._network = network
        self._key = uuid.uuid4().hex
        self._bc = None

    @property
    def network(self) -> Sequential:
        """The fitted network (a :class:`~sparknet.model.Sequential`)."""
        if self._network is None:
            raise ValueError(f"{type(self).__name__} holds no network (load or fit one)")
        return self._network

    @property
    def numFeatures(self) -> int:
        """Values per row the network reads (for sequences: ``T * (F + 1)``)."""
        return int(np.prod(self.network.input_shape))

    def _sequence_shape(self) -> tuple[int, int] | None:
        net = self.network
        if type(net.layers[0]).__name__ == "SequenceMask":
            T, F1 = net.input_shape
            return int(T), int(F1) - 1
        return None

    def _broadcast(self, spark):
        sc = spark.sparkContext
        if self._bc is None or getattr(self, "_bc_sc", None) is not sc:
            net = self.network
            self._bc = sc.broadcast((json.dumps(net.get_config()), np.ascontiguousarray(net.params)))
            self._bc_sc = sc
        return self._bc

    def _features(self, dataset):
        """The features as a flat float array Column, after the schema checks."""
        fcol = self.getFeaturesCol()
        kind = _columns.feature_kind(dataset, fcol)
        seq = self._sequence_shape()
        dtype = self.network.dtype.name
        if seq is not None:
            if kind.kind != "sequence":
                raise ValueError(f"features column {fcol!r}: this model reads sequences (arrays of "
                                 f"arrays), the column holds {kind.kind}s")
            return _columns.flat_features(dataset, fcol, kind, dtype, seq)
        if kind.kind == "sequence":
            raise ValueError(f"features column {fcol!r} holds sequences, but the network was not "
                             f"trained on sequences")
        _columns.vector_size_check(kind, fcol, self.numFeatures, "transform input")
        return _columns.flat_features(dataset, fcol, kind, dtype)

    def _predictor(self, spark, classification: bool, thresholds=None, vector_out=False):
        return arrow_function(BatchPredictor(
            self._key, self._broadcast(spark), self.getFeaturesCol(), classification, thresholds,
            self.getInferenceBatchSize(), vector_out))

    def _jvm_plan(self, dataset):
        """``(why not, plan)``: why the JVM engine cannot (or, under ``"auto"``, should
        not) score ``dataset`` (None when it will), and the network in its layout
        (:func:`sparknet.ml._jvm.plan`) when that far was reached."""
        if dataset.isStreaming:
            return "a streaming DataFrame (the JVM engine scores batch DataFrames)", None
        kind = _columns.feature_kind(dataset, self.getFeaturesCol())
        if kind.kind != "vector":
            return f"the features column holds {kind.kind}s, the JVM engine reads ML Vectors", None
        try:
            planned = _jvm.plan(self.network)
        except _jvm.Unsupported as exc:
            return str(exc), None
        macs = planned[2]
        if self.getInferenceEngine() == "auto" and macs > _jvm.AUTO_MAX_MACS:
            return (f"{macs:,} multiply-adds a row: past {_jvm.AUTO_MAX_MACS:,}, the Arrow engine's "
                    f"batched kernels are faster"), planned
        return _jvm.unavailable(dataset.sparkSession), planned

    def _score(self, dataset, mode: int, specs, thresholds=None):
        """``dataset`` plus the output columns ``specs`` (``(name, field, metadata)``,
        ``field`` one of ``raw``/``prob``/``pred``), on the engine ``inferenceEngine``
        picks (kept in :attr:`lastInferenceEngine`).  ``mode``: 0 classifier, 1
        regressor with one output, 2 with several."""
        from pyspark.sql import functions as F
        from pyspark.sql.functions import arrow_udf

        feats = self._features(dataset)          # the schema checks, for either engine
        engine = self.getInferenceEngine()
        if engine != "arrow":
            why, planned = self._jvm_plan(dataset)
            if why is None:
                try:
                    out = _jvm.score(dataset, self.network, self.getFeaturesCol(), mode,
                                     thresholds, specs, planned)
                except Exception as exc:   # noqa: BLE001 - e.g. another Spark's internals
                    if engine == "jvm":
                        raise
                    why = f"the JVM engine failed to set up ({_jvm.describe(exc)})"
                    _log.warning("transform falls back to the Arrow engine: %s", why)
                else:
                    self.lastInferenceEngine = "jvm"
                    return out
            if engine == "jvm":
                raise ValueError(f"inferenceEngine='jvm' cannot score this model: {why}")
            _log.debug("transform on the Arrow engine: %s", why)
        self.lastInferenceEngine = "arrow"
        fn = self._predictor(dataset.sparkSession, mode == 0, thresholds, vector_out=mode == 2)
        tmp = f"__sparknet_{self._key[:8]}"
        out = dataset.withColumn(tmp, arrow_udf(fn, output_type(mode == 0, mode == 2))(feats))
        cols = [F.col(_columns.quote(c)) for c in dataset.columns]
        cols += [F.col(f"{tmp}.{field}").alias(name, metadata=meta) for name, field, meta in specs]
        return out.select(*cols)

    def _local_output(self, value) -> np.ndarray:
        """The network's output for one feature vector, on the driver."""
        x = np.asarray(value.toArray() if isinstance(value, Vector) else value, dtype=np.float64)
        x = x.reshape(-1)
        if x.shape[0] != self.numFeatures:
            raise ValueError(f"got {x.shape[0]} features, the network expects {self.numFeatures}")
        p = BatchPredictor("local", None, self.getFeaturesCol(), False, None, 1)
        return p.forward(self.network, x.reshape(1, -1))[0]



# -------------------------------------------------------------------------- classifier
class SparkNetClassifier(_EstimatorMixin, ProbabilisticClassifier, _SparkNetParams, MLReadable,
                         MLWritable):
    """Train a sparknet network as a Spark ML classifier (data parallel, on the cluster).

    The label column holds class ids ``0 .. numClasses - 1`` (index strings with
    ``StringIndexer``); ``numClasses`` is the size of the network's last
    ``Dense(..., activation="softmax")`` layer.  Features: an ML ``Vector`` column, an
    ``array<float|double>`` column (reshaped to ``inputShape`` when set), or an
    ``array<array<number>>`` column of variable-length sequences (padded, with the mask
    made for the network; see :class:`~sparknet.layers.SequenceMask`).

    Training runs through :class:`~sparknet.cluster.DataParallelTrainer` (``mode``
    ``"sync"`` by default).  Every check of the data (missing or wrongly typed columns,
    feature size, NaN, labels outside the classes) raises a ``ValueError`` naming the
    column before the first training round.

    Args:
        network: the network: a :class:`~sparknet.model.Sequential` (its architecture is
            kept; training starts from weights initialised with ``seed``).
        featuresCol: features column (default ``"features"``).
        labelCol: label column (default ``"label"``).
        predictionCol: output column of predicted class ids, double (``"prediction"``).
        probabilityCol: output column of class probabilities, Vector (``"probability"``).
        rawPredictionCol: output column of the network's logits, Vector (``"rawPrediction"``).
        inputShape: per-row shape the flat features are reshaped to (e.g. ``[8, 8, 1]``).
        epochs: passes over the data (10).
        batchSize: rows per minibatch (32).
        learningRate: learning rate (1e-3).
        optimizer: ``"rmsprop"`` (default) or ``"sgd"``.
        momentum: momentum (0).
        rho: RMSprop's smoothing constant (0.99).
        weightDecay: L2 penalty (0).
        numPartitions: data shards; 0 keeps the DataFrame's partitions.
        mode: ``"sync"`` or ``"async"``.
        syncMethod: ``"average"`` (local steps then average, default) or ``"gradient"``.
        localSteps: local steps per round for ``"average"``; 0 = sized automatically.
        maxSequenceLength: steps per sequence (0 = longest in the training data).
        seed: seeds the initial weights, the data split and the shuffles.
        thresholds: MLlib's per-class thresholds for the prediction.
        inferenceBatchSize: rows per forward pass in ``transform`` (4096).
        inferenceEngine: where ``transform`` runs the network: ``"arrow"`` (Python
            workers, the Cython kernels, Arrow batches), ``"jvm"`` (Java code over the
            rows, for networks of dense layers on a Vector column) or ``"auto"`` (default: the JVM
            for small dense networks, where it is faster; see :mod:`sparknet.ml`).
        verbose: 1 shows a progress bar.

    Example::

        from sparknet import Sequential, Dense
        from sparknet.ml import SparkNetClassifier
        net = Sequential([Dense(64, activation="relu"), Dense(10, activation="softmax")])
        clf = SparkNetClassifier(network=net, epochs=20, learningRate=2e-3)
        model = clf.fit(train_df)                  # a SparkNetClassificationModel
        model.transform(test_df).select("prediction", "probability")
    """

    _classification = True

    @keyword_only
    def __init__(self, *, network=None, featuresCol: str = "features", labelCol: str = "label",
                 predictionCol: str = "prediction", probabilityCol: str = "probability",
                 rawPredictionCol: str = "rawPrediction", inputShape=None, epochs=None,
                 batchSize=None, learningRate=None, optimizer=None, momentum=None, rho=None,
                 weightDecay=None, numPartitions=None, mode=None, syncMethod=None, localSteps=None,
                 maxSequenceLength=None, seed=None, thresholds=None, inferenceBatchSize=None,
                 inferenceEngine=None, verbose=None) -> None:
        super().__init__()
        self._set_all(self._input_kwargs)

    @keyword_only
    def setParams(self, *, network=None, featuresCol: str = "features", labelCol: str = "label",
                  predictionCol: str = "prediction", probabilityCol: str = "probability",
                  rawPredictionCol: str = "rawPrediction", inputShape=None, epochs=None,
                  batchSize=None, learningRate=None, optimizer=None, momentum=None, rho=None,
                  weightDecay=None, numPartitions=None, mode=None, syncMethod=None, localSteps=None,
                  maxSequenceLength=None, seed=None, thresholds=None, inferenceBatchSize=None,
                  inferenceEngine=None, verbose=None) -> "SparkNetClassifier":
        """Set several Params at once (keyword arguments as in the constructor)."""
        return self._set_all(self._input_kwargs)



class SparkNetClassificationModel(_ModelMixin, ProbabilisticClassificationModel, _SparkNetParams,
                                  MLReadable, MLWritable):
    """A fitted sparknet classifier (a Spark ML ``Transformer``).

    ``transform`` adds, like MLlib's probabilistic classifiers (column names are Params):

    - ``rawPredictionCol`` (``"rawPrediction"``): Vector, the network's logits;
    - ``probabilityCol`` (``"probability"``): Vector, their softmax;
    - ``predictionCol`` (``"prediction"``): double, the class id (argmax of
      ``probability / thresholds`` when ``thresholds`` is set).

    Set a column Param to ``""`` to leave that column out.  Scoring runs on the
    executors, on the engine ``inferenceEngine`` picks: Arrow batches through the
    Python workers (the network broadcast once), or Java code over the rows for
    small dense networks on a Vector column (see :mod:`sparknet.ml`); :attr:`lastInferenceEngine`
    says which one the last ``transform`` used.  :attr:`network` is the fitted
    :class:`~sparknet.model.Sequential`.
    """

    def __init__(self) -> None:
        super().__init__()

    @property
    def numClasses(self) -> int:
        """Number of classes (the network's outputs)."""
        return int(self.network.output_shape[-1])

    def predictRaw(self, value) -> DenseVector:
        """Logits for one feature vector (on the driver)."""
        return Vectors.dense(self._local_output(value))

    def predictProbability(self, value) -> DenseVector:
        """Class probabilities for one feature vector (on the driver)."""
        from sparknet.activations import softmax
        return Vectors.dense(softmax(self._local_output(value)[None, :])[0])

    def predict(self, value) -> float:
        """Predicted class id for one feature vector (on the driver)."""
        prob = self.predictProbability(value).toArray()[None, :]
        if self.isDefined(self.thresholds):
            from sparknet.ml._inference import _threshold_scores
            prob = _threshold_scores(prob, self.getThresholds())
        return float(prob.argmax())

    def _transform(self, dataset):
        k = self.numClasses
        thresholds = self.getThresholds() if self.isDefined(self.thresholds) else None
        if thresholds is not None and len(thresholds) != k:
            raise ValueError(f"thresholds has {len(thresholds)} values, the model has {k} classes")
        specs = []
        size_meta = {"ml_attr": {"num_attrs": k}}
        if self.getRawPredictionCol():
            specs.append((self.getRawPredictionCol(), "raw", size_meta))
        if self.getProbabilityCol():
            specs.append((self.getProbabilityCol(), "prob", size_meta))
        if self.getPredictionCol():
            specs.append((self.getPredictionCol(), "pred", {"ml_attr": {"type": "nominal", "num_vals": k}}))
        return self._score(dataset, 0, specs, thresholds)


# --------------------------------------------------------------------------- regressor
class SparkNetRegressor(_EstimatorMixin, Predictor, _SparkNetParams, MLReadable, MLWritable):
    """Train a sparknet network as a Spark ML regressor (mean squared error).

    The label column holds the numeric target (a Vector or array column when the
    network has several outputs).  Features, Params and checks as in
    :class:`SparkNetClassifier` (without the probability columns and thresholds).

    Example::

        net = Sequential([Dense(32, activation="relu"), Dense(1)])
        model = SparkNetRegressor(network=net, epochs=30).fit(df)
        model.transform(df).select("prediction")
    """

    _classification = False

    @keyword_only
    def __init__(self, *, network=None, featuresCol: str = "features", labelCol: str = "label",
                 predictionCol: str = "prediction", inputShape=None, epochs=None, batchSize=None,
                 learningRate=None, optimizer=None, momentum=None, rho=None, weightDecay=None,
                 numPartitions=None, mode=None, syncMethod=None, localSteps=None,
                 maxSequenceLength=None, seed=None, inferenceBatchSize=None,
                 inferenceEngine=None, verbose=None) -> None:
        super().__init__()
        self._set_all(self._input_kwargs)

    @keyword_only
    def setParams(self, *, network=None, featuresCol: str = "features", labelCol: str = "label",
                  predictionCol: str = "prediction", inputShape=None, epochs=None, batchSize=None,
                  learningRate=None, optimizer=None, momentum=None, rho=None, weightDecay=None,
                  numPartitions=None, mode=None, syncMethod=None, localSteps=None,
                  maxSequenceLength=None, seed=None, inferenceBatchSize=None,
                  inferenceEngine=None, verbose=None) -> "SparkNetRegressor":
        """Set several Params at once (keyword arguments as in the constructor)."""
        return self._set_all(self._input_kwargs)



class SparkNetRegressionModel(_ModelMixin, PredictionModel, _SparkNetParams, MLReadable, MLWritable):
    """A fitted sparknet regressor (a Spark ML ``Transformer``).

    ``transform`` adds ``predictionCol`` (``"prediction"``): a double, as MLlib's
    regressors, for a network with one output; a Vector for several outputs.
    """

    def __init__(self) -> None:
        super().__init__()

    def predict(self, value):
        """The prediction for one feature vector (on the driver)."""
        out = self._local_output(value)
        return float(out[0]) if out.shape[0] == 1 else Vectors.dense(out)

    def _transform(self, dataset):
        k = int(np.prod(self.network.output_shape))
        specs = [(self.getPredictionCol(), "pred", {})] if self.getPredictionCol() else []
        return self._score(dataset, 2 if k > 1 else 1, specs)


for _cls in (SparkNetClassifier, SparkNetClassificationModel, SparkNetRegressor, SparkNetRegressionModel):
    _cls.__module__ = "sparknet.ml"


SparkNetClassifier._model_class = SparkNetClassificationModel
SparkNetRegressor._model_class = SparkNetRegressionModel
