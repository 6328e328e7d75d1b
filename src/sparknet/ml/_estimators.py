"""Spark ML Estimators and Models (implementation; import them from :mod:`sparknet.ml`).

The Params live in :mod:`._params`, ``fit`` in :mod:`._training`, ``transform`` in
:mod:`._scoring`; the classes here put them together with pyspark's bases."""
from __future__ import annotations

from typing import TYPE_CHECKING, Any, Sequence

import numpy as np
from pyspark import keyword_only
from pyspark.ml.classification import ProbabilisticClassificationModel, ProbabilisticClassifier
from pyspark.ml.linalg import DenseVector, Vectors

from sparknet.ml._params import NetworkSpec, ThresholdsParams
from sparknet.ml._scoring import FeatureVector, OutputSpec, SparkNetModel
from sparknet.ml._training import SparkNetEstimator

if TYPE_CHECKING:
    from pyspark.sql import DataFrame

__all__ = ["SparkNetClassifier", "SparkNetClassificationModel", "SparkNetRegressor",
           "SparkNetRegressionModel"]


# -------------------------------------------------------------------------- classifier
class SparkNetClassifier(SparkNetEstimator["SparkNetClassificationModel"], ThresholdsParams,
                         ProbabilisticClassifier):
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
        rawPredictionCol: output column of raw scores, Vector (``"rawPrediction"``): the
            network's logits, or ``[-m, m]`` with the margin ``m`` for two classes.
        inputShape: per-row shape the flat features are reshaped to (e.g. ``[8, 8, 1]``).
        epochs: passes over the data (10).
        batchSize: rows per minibatch (32).
        learningRate: learning rate (1e-3).
        optimizer: ``"rmsprop"`` (default), ``"sgd"``, ``"adam"`` or ``"adamw"``
            (``weightDecay`` as given: L2 for Adam, decoupled for AdamW).
        momentum: momentum (0).
        rho: RMSprop's smoothing constant (0.99).
        weightDecay: L2 penalty (0).
        clipNorm: clip each step's gradient to this global L2 norm (0: off), as
            ``torch.nn.utils.clip_grad_norm_`` (the optimizer's ``clipnorm``).
        clipValue: clamp each gradient element to ``[-clipValue, clipValue]`` (0: off).
        numPartitions: data shards; 0 keeps the DataFrame's partitions.
        mode: ``"sync"`` or ``"async"``.
        syncMethod: ``"average"`` (local steps then average, default) or ``"gradient"``.
        localSteps: local steps per round for ``"average"``; 0 = sized automatically.
        precision: ``"fp32"`` (default) or ``"bf16"``: the training steps' matrix products take
            bfloat16 operands and accumulate in float32 (``DataParallelTrainer``'s
            ``precision``); weights, optimizer state, losses and scoring stay float32.
        maxSequenceLength: steps per sequence (0 = longest in the training data).
        seed: seeds the initial weights, the data split and the shuffles.
        thresholds: MLlib's per-class thresholds for the prediction.
        inferenceBatchSize: rows per forward pass in ``transform`` (4096).
        inferenceEngine: where ``transform`` runs the network: ``"arrow"`` (Python
            workers, the Cython kernels, Arrow batches), ``"jvm"`` (Java code over the
            rows, for networks of dense layers on a Vector column) or ``"auto"`` (default: the JVM
            for small dense networks, where it is faster; see :mod:`sparknet.ml`).
        verbose: 1 (default, as Keras) a progress bar and a line per epoch on the driver's
            console; 2 the lines alone; 0 nothing.  The fitted Model keeps the per-epoch
            figures as its ``history``.
        checkpointInterval: epochs between checkpoints (1); -1 writes none.  Ignored
            while ``checkpointDir`` is not set.
        checkpointDir: folder (local, shared or a Hadoop URI) for the fit's checkpoints
            (:class:`~sparknet.checkpoint.CheckpointStore`: the newest 3 kept); None
            (default): none.  The fits of a tuning run (``CrossValidator``,
            ``TrainValidationSplit``: :meth:`fitMultiple`) each write into their own
            subfolder, ``<uid>_fit<n>_params<i>``.
        resume: continue from the newest complete checkpoint in ``checkpointDir`` (a fresh
            fit when there is none); with ``syncMethod="gradient"`` and the same Params and
            data the resumed fit ends with the weights of an uninterrupted one.
        callbacks: :mod:`sparknet.callbacks` run by every ``fit`` (early stopping,
            schedules, ...): a constructor argument, not a Param (``setCallbacks``), so
            copies share them and saved Estimators and Models leave them out.
        validationIndicatorCol: MLlib's name (``GBTClassifier``): a boolean column whose
            true rows are held out of training and evaluated after every epoch
            (``val_loss``, ``val_accuracy`` in ``model.history``; what
            ``EarlyStopping(monitor="val_loss")`` reads).  None (default): every row trains.

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
    def __init__(self, *, network: NetworkSpec | None = None, featuresCol: str = "features",
                 labelCol: str = "label", predictionCol: str = "prediction",
                 probabilityCol: str = "probability", rawPredictionCol: str = "rawPrediction",
                 inputShape: Sequence[int] | None = None, epochs: int | None = None,
                 batchSize: int | None = None, learningRate: float | None = None,
                 optimizer: str | None = None, momentum: float | None = None,
                 rho: float | None = None, weightDecay: float | None = None,
                 clipNorm: float | None = None, clipValue: float | None = None,
                 numPartitions: int | None = None, mode: str | None = None,
                 syncMethod: str | None = None, localSteps: int | None = None,
                 maxSequenceLength: int | None = None, seed: int | None = None,
                 thresholds: list[float] | None = None, inferenceBatchSize: int | None = None,
                 inferenceEngine: str | None = None, verbose: int | None = None,
                 checkpointInterval: int | None = None, checkpointDir: str | None = None,
                 resume: bool | None = None, callbacks: Sequence[Any] | None = None,
                 precision: str | None = None,
                 validationIndicatorCol: str | None = None) -> None:
        super().__init__()
        self._set_all(self._input_kwargs)

    @keyword_only
    def setParams(self, *, network: NetworkSpec | None = None, featuresCol: str = "features",
                  labelCol: str = "label", predictionCol: str = "prediction",
                  probabilityCol: str = "probability", rawPredictionCol: str = "rawPrediction",
                  inputShape: Sequence[int] | None = None, epochs: int | None = None,
                  batchSize: int | None = None, learningRate: float | None = None,
                  optimizer: str | None = None, momentum: float | None = None,
                  rho: float | None = None, weightDecay: float | None = None,
                  clipNorm: float | None = None, clipValue: float | None = None,
                  numPartitions: int | None = None, mode: str | None = None,
                  syncMethod: str | None = None, localSteps: int | None = None,
                  maxSequenceLength: int | None = None, seed: int | None = None,
                  thresholds: list[float] | None = None, inferenceBatchSize: int | None = None,
                  inferenceEngine: str | None = None, verbose: int | None = None,
                  checkpointInterval: int | None = None, checkpointDir: str | None = None,
                  resume: bool | None = None, callbacks: Sequence[Any] | None = None,
                  precision: str | None = None,
                  validationIndicatorCol: str | None = None) -> SparkNetClassifier:
        """Set several Params at once (keyword arguments as in the constructor)."""
        return self._set_all(self._input_kwargs)

    def _new_model(self) -> SparkNetClassificationModel:
        return SparkNetClassificationModel()


class SparkNetClassificationModel(SparkNetModel, ThresholdsParams,
                                  ProbabilisticClassificationModel):
    """A fitted sparknet classifier (a Spark ML ``Transformer``).

    ``transform`` adds, like MLlib's probabilistic classifiers (column names are Params):

    - ``rawPredictionCol`` (``"rawPrediction"``): Vector, MLlib's raw scores: the
      network's logits ``z``, and for two classes ``[-m, m]`` with the margin ``m = z1 -
      z0`` (the log-odds of class 1, as MLlib's binary ``LogisticRegressionModel``), so
      that ``BinaryClassificationEvaluator`` (which ranks rows by ``rawPrediction[1]``)
      measures the model's true AUC by default;
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
        return int(self._output_shape()[-1])

    def predictRaw(self, value: FeatureVector) -> DenseVector:
        """``rawPrediction`` for one feature vector (on the driver): the network's logits,
        or for two classes ``[-m, m]`` with the margin ``m = z1 - z0``, as MLlib's binary
        logistic regression."""
        return Vectors.dense(self._local_raw(value))

    def predictProbability(self, value: FeatureVector) -> DenseVector:
        """Class probabilities for one feature vector (on the driver)."""
        from sparknet.activations import softmax
        return Vectors.dense(softmax(self._local_output(value)[None, :])[0])

    def predict(self, value: FeatureVector) -> float:
        """Predicted class id for one feature vector (on the driver)."""
        prob = self.predictProbability(value).toArray()[None, :]
        if self.isDefined(self.thresholds):
            from sparknet.ml._inference import threshold_scores
            prob = threshold_scores(prob, self.getThresholds())
        return float(prob.argmax())

    def _transform(self, dataset: DataFrame) -> DataFrame:
        k = self.numClasses
        thresholds = self.getThresholds() if self.isDefined(self.thresholds) else None
        if thresholds is not None and len(thresholds) != k:
            raise ValueError(f"thresholds has {len(thresholds)} values, the model has {k} classes")
        specs: list[OutputSpec] = []
        size_meta: dict[str, Any] = {"ml_attr": {"num_attrs": k}}
        if self.getRawPredictionCol():
            specs.append((self.getRawPredictionCol(), "raw", size_meta))
        if self.getProbabilityCol():
            specs.append((self.getProbabilityCol(), "prob", size_meta))
        if self.getPredictionCol():
            nominal = {"ml_attr": {"type": "nominal", "num_vals": k}}
            specs.append((self.getPredictionCol(), "pred", nominal))
        return self._score(dataset, 0, specs, thresholds)


# --------------------------------------------------------------------------- regressor
class SparkNetRegressor(SparkNetEstimator["SparkNetRegressionModel"]):
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
    def __init__(self, *, network: NetworkSpec | None = None, featuresCol: str = "features",
                 labelCol: str = "label", predictionCol: str = "prediction",
                 inputShape: Sequence[int] | None = None, epochs: int | None = None,
                 batchSize: int | None = None, learningRate: float | None = None,
                 optimizer: str | None = None, momentum: float | None = None,
                 rho: float | None = None, weightDecay: float | None = None,
                 clipNorm: float | None = None, clipValue: float | None = None,
                 numPartitions: int | None = None, mode: str | None = None,
                 syncMethod: str | None = None, localSteps: int | None = None,
                 maxSequenceLength: int | None = None, seed: int | None = None,
                 inferenceBatchSize: int | None = None, inferenceEngine: str | None = None,
                 verbose: int | None = None, checkpointInterval: int | None = None,
                 checkpointDir: str | None = None, resume: bool | None = None,
                 callbacks: Sequence[Any] | None = None, precision: str | None = None,
                 validationIndicatorCol: str | None = None) -> None:
        super().__init__()
        self._set_all(self._input_kwargs)

    @keyword_only
    def setParams(self, *, network: NetworkSpec | None = None, featuresCol: str = "features",
                  labelCol: str = "label", predictionCol: str = "prediction",
                  inputShape: Sequence[int] | None = None, epochs: int | None = None,
                  batchSize: int | None = None, learningRate: float | None = None,
                  optimizer: str | None = None, momentum: float | None = None,
                  rho: float | None = None, weightDecay: float | None = None,
                  clipNorm: float | None = None, clipValue: float | None = None,
                  numPartitions: int | None = None, mode: str | None = None,
                  syncMethod: str | None = None, localSteps: int | None = None,
                  maxSequenceLength: int | None = None, seed: int | None = None,
                  inferenceBatchSize: int | None = None, inferenceEngine: str | None = None,
                  verbose: int | None = None, checkpointInterval: int | None = None,
                  checkpointDir: str | None = None, resume: bool | None = None,
                  callbacks: Sequence[Any] | None = None,
                  precision: str | None = None,
                  validationIndicatorCol: str | None = None) -> SparkNetRegressor:
        """Set several Params at once (keyword arguments as in the constructor)."""
        return self._set_all(self._input_kwargs)

    def _new_model(self) -> SparkNetRegressionModel:
        return SparkNetRegressionModel()


class SparkNetRegressionModel(SparkNetModel):
    """A fitted sparknet regressor (a Spark ML ``Transformer``).

    ``transform`` adds ``predictionCol`` (``"prediction"``): a double, as MLlib's
    regressors, for a network with one output; a Vector for several outputs.
    """

    def __init__(self) -> None:
        super().__init__()

    # a network with several outputs predicts a Vector, which MLlib's one-value
    # PredictionModel.predict (-> float) does not foresee
    def predict(self, value: FeatureVector) -> float | DenseVector:  # type: ignore[override]
        """The prediction for one feature vector (on the driver)."""
        out = self._local_output(value)
        return float(out[0]) if out.shape[0] == 1 else Vectors.dense(out)

    def _transform(self, dataset: DataFrame) -> DataFrame:
        k = int(np.prod(self._output_shape()))
        specs: list[OutputSpec] = []
        if self.getPredictionCol():
            specs.append((self.getPredictionCol(), "pred", {}))
        return self._score(dataset, 2 if k > 1 else 1, specs)


for _cls in (SparkNetClassifier, SparkNetClassificationModel, SparkNetRegressor,
             SparkNetRegressionModel):
    _cls.__module__ = "sparknet.ml"
