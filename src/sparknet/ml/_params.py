"""The Params of sparknet's Estimators and Models: declarations, converters, defaults,
getters and the Estimators' setters (pyspark's ``_...Params`` mixin pattern)."""
from __future__ import annotations

import json
import zlib
from typing import TYPE_CHECKING, Any, Callable, Dict, Sequence, Union

import numpy as np
from pyspark.ml.base import _PredictorParams
from pyspark.ml.param import Param, Params, TypeConverters
from pyspark.ml.param.shared import (
    HasCheckpointInterval,
    HasSeed,
    HasThresholds,
    HasValidationIndicatorCol,
)

from sparknet.layers.base import Layer
from sparknet.model import Sequential

if TYPE_CHECKING:
    from typing_extensions import Self

#: a ``network`` Param value: a Sequential, its get_config() dict, or that dict as JSON text
NetworkSpec = Union[Sequential, Sequence[Layer], Dict[str, Any], str]


# -------------------------------------------------------------------------- converters
# A Param's converter raises TypeError, which pyspark's ``Params._set`` reports under the
# Param's name (as pyspark's own TypeConverters do); ``sparknet._validation.positive_int``
# is for plain arguments and raises ValueError.
def _to_network(value: Any) -> str:
    """Param converter: a Sequential, a list of layers (as ``Sequential(layers)`` takes), its
    config dict, or JSON text -> canonical JSON text."""
    if isinstance(value, Sequential):
        config = value.get_config()
    elif isinstance(value, (list, tuple)) and value and all(isinstance(v, Layer) for v in value):
        config = Sequential(list(value)).get_config()
    elif isinstance(value, Layer):
        raise TypeError(f"network: one {type(value).__name__} layer was given; pass the "
                        f"network's layers as a list, [layer, ...], or a Sequential")
    elif isinstance(value, dict):
        config = value
    elif isinstance(value, str):
        try:
            config = json.loads(value)
        except json.JSONDecodeError as exc:
            raise TypeError(f"network: not JSON text ({exc})") from exc
    else:
        raise TypeError(f"network must be a sparknet Sequential, a list of its layers, its "
                        f"get_config() dict or that dict as JSON, got {type(value).__name__}"
                        + (" (an empty or mixed list)" if isinstance(value, (list, tuple)) else ""))
    if (not isinstance(config, dict) or not isinstance(config.get("layers"), list)
            or not config["layers"]):
        raise TypeError("network: a Sequential config needs a non-empty 'layers' list")
    try:
        Sequential.from_config(dict(config, input_shape=None))
    except (ValueError, TypeError, KeyError) as exc:
        raise TypeError(f"network: {exc}") from exc
    return json.dumps(config, sort_keys=True)


def _choice(name: str, options: tuple[str, ...]) -> Callable[[Any], str]:
    """Param converter: one of ``options``."""
    def conv(value: Any) -> str:
        v = TypeConverters.toString(value)
        if v not in options:
            raise TypeError(f"{name} must be one of {options}, got {v!r}")
        return v
    return conv


def _count(name: str, *, positive: bool) -> Callable[[Any], int]:
    """Param converter: an int ``> 0`` (``positive``) or ``>= 0``."""
    bound = "> 0" if positive else ">= 0"

    def conv(value: Any) -> int:
        v = TypeConverters.toInt(value)
        if v < 0 or (positive and v == 0):
            raise TypeError(f"{name} must be {bound}, got {v}")
        return v
    return conv


def _amount(name: str, *, positive: bool = False) -> Callable[[Any], float]:
    """Param converter: a finite float ``> 0`` (``positive``) or ``>= 0``."""
    bound = "> 0" if positive else ">= 0"

    def conv(value: Any) -> float:
        v = TypeConverters.toFloat(value)
        if not np.isfinite(v) or v < 0 or (positive and v == 0):
            raise TypeError(f"{name} must be a finite number {bound}, got {v}")
        return v
    return conv


def _interval(value: Any) -> int:
    """Param converter: MLlib's checkpoint interval, an int ``>= 1`` or ``-1`` (disabled)."""
    v = TypeConverters.toInt(value)
    if v < 1 and v != -1:
        raise TypeError(f"checkpointInterval must be >= 1 (epochs) or -1 (no checkpoints), got {v}")
    return v


def _optional_folder(value: Any) -> str:
    """Param converter: a non-empty folder path or URI (``None`` is stored as it is)."""
    if not isinstance(value, str) or not value.strip():
        raise TypeError(f"checkpointDir must be a folder path or a Hadoop URI (str), got {value!r}")
    return value


def _optional_column(value: Any) -> str:
    """Param converter: a non-empty column name (``None`` is stored as it is)."""
    if not isinstance(value, str) or not value.strip():
        raise TypeError(f"validationIndicatorCol must be a column name (str), got {value!r}")
    return value


def _thresholds(value: Any) -> list[float]:
    """Param converter: MLlib's class thresholds, finite values ``>= 0``, at most one ``0``."""
    v = TypeConverters.toListFloat(value)
    if not v or any(not np.isfinite(t) or t < 0 for t in v) or sum(t == 0 for t in v) > 1:
        raise TypeError(f"thresholds must be finite values >= 0 with at most one 0 (one per "
                        f"class), got {v}")
    return v


def _shape(value: Any) -> list[int]:
    """Param converter: a list of positive sizes (``[]`` for flat features)."""
    v = TypeConverters.toListInt(value)
    if any(d <= 0 for d in v):
        raise TypeError(f"inputShape must hold positive sizes, got {v}")
    return v


def _default_seed(cls: type) -> int:
    # MLlib seeds by the class name's hash; Python's str hash changes per process
    return zlib.crc32(cls.__name__.encode()) & 0x7FFFFFFF


# ------------------------------------------------------------------------------ params
class _InferenceParams(Params):
    """How ``transform`` runs the network (set on Estimators and Models alike)."""

    inferenceBatchSize: Param[int] = Param(
        Params._dummy(), "inferenceBatchSize", "rows per forward pass when transforming (> 0)",
        typeConverter=_count("inferenceBatchSize", positive=True))
    inferenceEngine: Param[str] = Param(
        Params._dummy(), "inferenceEngine",
        "where transform runs the network: 'arrow' (Python workers, Cython kernels, Arrow "
        "batches), 'jvm' (Java over the rows; small dense networks on Vector columns) or 'auto' "
        "(jvm where it can run and is faster)",
        typeConverter=_choice("inferenceEngine", ("auto", "arrow", "jvm")))

    def __init__(self) -> None:
        super().__init__()
        self._setDefault(inferenceBatchSize=4096, inferenceEngine="auto")

    def getInferenceEngine(self) -> str:
        """Where ``transform`` runs the network: ``"auto"``, ``"arrow"`` or ``"jvm"``."""
        return self.getOrDefault(self.inferenceEngine)

    def setInferenceEngine(self, value: str) -> Self:
        """Set :attr:`inferenceEngine` (``"auto"``, ``"arrow"`` or ``"jvm"``; anything else
        raises a TypeError naming the choices)."""
        return self._set(inferenceEngine=value)

    def getInferenceBatchSize(self) -> int:
        """Rows per forward pass in ``transform``."""
        return self.getOrDefault(self.inferenceBatchSize)

    def setInferenceBatchSize(self, value: int) -> Self:
        """Set :attr:`inferenceBatchSize` (> 0)."""
        return self._set(inferenceBatchSize=value)


class SparkNetParams(_PredictorParams, HasSeed, _InferenceParams):
    """Params shared by sparknet's Estimators and kept on their Models (as MLlib's
    Models keep their Estimator's)."""

    inputShape: Param[list[int]] = Param(
        Params._dummy(), "inputShape",
        "per-row input shape the flat features are reshaped to, e.g. [8, 8, 1] for a conv net or "
        "[T, F] for a recurrent one; [] reads them flat", typeConverter=_shape)
    epochs: Param[int] = Param(Params._dummy(), "epochs", "passes over the training data (> 0)",
                               typeConverter=_count("epochs", positive=True))
    batchSize: Param[int] = Param(Params._dummy(), "batchSize", "rows per minibatch (> 0)",
                                  typeConverter=_count("batchSize", positive=True))
    learningRate: Param[float] = Param(
        Params._dummy(), "learningRate", "optimizer learning rate (> 0)",
        typeConverter=_amount("learningRate", positive=True))
    optimizer: Param[str] = Param(
        Params._dummy(), "optimizer", "'rmsprop', 'sgd', 'adam' or 'adamw'",
        typeConverter=_choice("optimizer", ("rmsprop", "sgd", "adam", "adamw")))
    momentum: Param[float] = Param(Params._dummy(), "momentum", "momentum factor (>= 0)",
                                   typeConverter=_amount("momentum"))
    rho: Param[float] = Param(Params._dummy(), "rho", "RMSprop smoothing constant of the "
                              "squared-gradient average, in [0, 1)",
                              typeConverter=TypeConverters.toFloat)
    weightDecay: Param[float] = Param(Params._dummy(), "weightDecay",
                                      "L2 penalty added to the gradient (>= 0)",
                                      typeConverter=_amount("weightDecay"))
    clipNorm: Param[float] = Param(
        Params._dummy(), "clipNorm",
        "clip the gradient to this global L2 norm before each step (>= 0; 0: no clipping)",
        typeConverter=_amount("clipNorm"))
    clipValue: Param[float] = Param(
        Params._dummy(), "clipValue",
        "clamp each gradient element to [-clipValue, clipValue] before each step "
        "(>= 0; 0: no clamping)", typeConverter=_amount("clipValue"))
    numPartitions: Param[int] = Param(
        Params._dummy(), "numPartitions",
        "data shards (Spark partitions) to train on; 0 keeps the DataFrame's",
        typeConverter=_count("numPartitions", positive=False))
    mode: Param[str] = Param(
        Params._dummy(), "mode", "'sync' (synchronous rounds) or 'async' (asynchronous)",
        typeConverter=_choice("mode", ("sync", "async")))
    syncMethod: Param[str] = Param(
        Params._dummy(), "syncMethod",
        "synchronous rounds: 'average' (local steps, then average) or 'gradient' "
        "(exact minibatch SGD)",
        typeConverter=_choice("syncMethod", ("average", "gradient")))
    localSteps: Param[int] = Param(
        Params._dummy(), "localSteps",
        "local steps per round for syncMethod 'average'; 0 sizes rounds automatically",
        typeConverter=_count("localSteps", positive=False))
    maxSequenceLength: Param[int] = Param(
        Params._dummy(), "maxSequenceLength",
        "sequence features: steps kept per row (longer sequences are "
        "cut, shorter ones padded); 0 uses the longest training sequence",
        typeConverter=_count("maxSequenceLength", positive=False))
    precision: Param[str] = Param(
        Params._dummy(), "precision",
        "'fp32' (default) or 'bf16': the training steps' matrix products on "
        "bfloat16 operands with float32 accumulation (sparknet.precision)",
        typeConverter=_choice("precision", ("fp32", "bf16")))
    verbose: Param[int] = Param(
        Params._dummy(), "verbose",
        "0 nothing, 1 (default) a live progress bar and a line per epoch on the "
        "driver, 2 the lines alone",
        typeConverter=_count("verbose", positive=False))

    def __init__(self) -> None:
        super().__init__()
        self._setDefault(inputShape=[], epochs=10, batchSize=32, learningRate=1e-3,
                         optimizer="rmsprop", momentum=0.0, rho=0.99, weightDecay=0.0,
                         clipNorm=0.0, clipValue=0.0,
                         numPartitions=0, mode="sync", syncMethod="average", localSteps=0,
                         maxSequenceLength=0, verbose=1, seed=_default_seed(type(self)),
                         precision="fp32")

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

    def getClipNorm(self) -> float:
        return self.getOrDefault(self.clipNorm)

    def getClipValue(self) -> float:
        return self.getOrDefault(self.clipValue)

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

    def getPrecision(self) -> str:
        """``"fp32"`` or ``"bf16"``: the precision of the training steps' matrix products."""
        return self.getOrDefault(self.precision)


class ThresholdsParams(HasThresholds):
    """MLlib's ``thresholds`` Param, its values checked when set (MLlib checks them in the
    JVM, which sparknet's Python stages never reach)."""

    thresholds: Param[list[float]] = Param(
        Params._dummy(), "thresholds",
        "per-class thresholds: the class with the largest probability / threshold is predicted; "
        "one finite value >= 0 per class, at most one of them 0", typeConverter=_thresholds)


class _CheckpointParams(HasCheckpointInterval):
    """Checkpoints of a fit and resuming from them (Estimators only).

    ``checkpointInterval`` keeps MLlib's name and meaning (every N iterations, here epochs;
    ``-1`` disables; ignored while no checkpoint folder is set), but the folder is the
    ``checkpointDir`` Param rather than ``SparkContext.setCheckpointDir``: a fit's
    checkpoints are sparknet's own (:class:`sparknet.checkpoint.CheckpointStore`), not RDD
    checkpoints."""

    checkpointInterval: Param[int] = Param(
        Params._dummy(), "checkpointInterval",
        "epochs between checkpoints of the fit (>= 1), or -1 for none; ignored while "
        "checkpointDir is not set", typeConverter=_interval)
    checkpointDir: Param[str] = Param(
        Params._dummy(), "checkpointDir",
        "folder (local, shared file system or Hadoop URI) the fit writes its checkpoints to and "
        "resumes from; None (default): no checkpoints", typeConverter=_optional_folder)
    resume: Param[bool] = Param(
        Params._dummy(), "resume",
        "continue from the newest complete checkpoint in checkpointDir (a fresh fit when there is "
        "none)", typeConverter=TypeConverters.toBoolean)

    def __init__(self) -> None:
        super().__init__()
        self._setDefault(checkpointInterval=1, checkpointDir=None, resume=False)

    def getCheckpointDir(self) -> str | None:
        """The checkpoint folder, or None (no checkpoints)."""
        return self.getOrDefault(self.checkpointDir)

    def getResume(self) -> bool:
        """Whether ``fit`` continues from the newest checkpoint in ``checkpointDir``."""
        return self.getOrDefault(self.resume)

    def setCheckpointInterval(self, value: int) -> Self:
        """Set :attr:`checkpointInterval` (epochs, >= 1; -1 disables checkpoints)."""
        return self._set(checkpointInterval=value)

    def setCheckpointDir(self, value: str | None) -> Self:
        """Set :attr:`checkpointDir` (None: no checkpoints)."""
        return self._set(checkpointDir=value)

    def setResume(self, value: bool) -> Self:
        """Set :attr:`resume`."""
        return self._set(resume=value)


class _ValidationParams(HasValidationIndicatorCol):
    """MLlib's ``validationIndicatorCol`` (as on ``GBTClassifier``): the rows where that
    boolean column is true are held out and evaluated after every epoch (``val_loss``,
    ``val_accuracy`` in the history; what ``EarlyStopping`` callbacks read)."""

    validationIndicatorCol: Param[str] = Param(
        Params._dummy(), "validationIndicatorCol",
        "boolean column: true marks a validation row (held out, evaluated after every epoch), "
        "false or null a training row; None (default): every row trains",
        typeConverter=_optional_column)

    def __init__(self) -> None:
        super().__init__()
        self._setDefault(validationIndicatorCol=None)

    def setValidationIndicatorCol(self, value: str | None) -> Self:
        """Set :attr:`validationIndicatorCol` (None: no validation rows)."""
        return self._set(validationIndicatorCol=value)


class EstimatorParams(SparkNetParams, _CheckpointParams, _ValidationParams):
    """The Estimators' Params: the shared ones, the ``network`` Param (a fitted Model
    holds the trained network instead, as its ``network`` property), the checkpoint and
    validation Params and the setters."""

    network: Param[str] = Param(
        Params._dummy(), "network",
        "the network: a sparknet Sequential's architecture (get_config()) as JSON "
        "text; a Sequential, a list of layers or its config dict may be passed and is "
        "converted",
        typeConverter=_to_network)

    #: the keyword arguments of the last ``@keyword_only`` call (set by that decorator)
    _input_kwargs: dict[str, Any]

    def _network_config(self) -> dict[str, Any]:
        """The ``network`` Param as its architecture dict (ValueError when it is not set)."""
        if not self.isDefined(self.network):
            raise ValueError(f"{type(self).__name__}: set the network Param (a sparknet "
                             f"Sequential)")
        config: dict[str, Any] = json.loads(self.getOrDefault(self.network))
        return config

    def getNetwork(self) -> Sequential:
        """The (untrained) network as a new Sequential."""
        return Sequential.from_config(self._network_config())

    def _set_all(self, kwargs: dict[str, Any]) -> Self:
        kwargs = dict(kwargs)
        if kwargs.get("callbacks") is not None:  # not a Param: kept on the object, never saved
            self.setCallbacks(kwargs["callbacks"])
        kwargs.pop("callbacks", None)
        return self._set(**{k: v for k, v in kwargs.items() if v is not None})

    def setCallbacks(self, value: Sequence[Any]) -> Self:
        """The callbacks of the next ``fit`` (:mod:`sparknet.callbacks`; ``callbacks`` of
        :meth:`DataParallelTrainer.fit <sparknet.cluster.DataParallelTrainer.fit>`).  Not a
        Param: copies of the Estimator share them, saved Estimators and Models leave them out."""
        from sparknet.callbacks import check_callbacks

        self._callbacks = check_callbacks(value)
        return self

    def getCallbacks(self) -> list[Any]:
        """The callbacks set with :meth:`setCallbacks` (or the constructor)."""
        return list(getattr(self, "_callbacks", []))

    def setNetwork(self, value: NetworkSpec) -> Self:
        return self._set(network=value)

    def setInputShape(self, value: Sequence[int]) -> Self:
        return self._set(inputShape=value)

    def setEpochs(self, value: int) -> Self:
        return self._set(epochs=value)

    def setBatchSize(self, value: int) -> Self:
        return self._set(batchSize=value)

    def setLearningRate(self, value: float) -> Self:
        return self._set(learningRate=value)

    def setOptimizer(self, value: str) -> Self:
        return self._set(optimizer=value)

    def setMomentum(self, value: float) -> Self:
        return self._set(momentum=value)

    def setRho(self, value: float) -> Self:
        return self._set(rho=value)

    def setWeightDecay(self, value: float) -> Self:
        return self._set(weightDecay=value)

    def setClipNorm(self, value: float) -> Self:
        """Set :attr:`clipNorm` (0: no clipping)."""
        return self._set(clipNorm=value)

    def setClipValue(self, value: float) -> Self:
        """Set :attr:`clipValue` (0: no clamping)."""
        return self._set(clipValue=value)

    def setNumPartitions(self, value: int) -> Self:
        return self._set(numPartitions=value)

    def setMode(self, value: str) -> Self:
        return self._set(mode=value)

    def setSyncMethod(self, value: str) -> Self:
        return self._set(syncMethod=value)

    def setLocalSteps(self, value: int) -> Self:
        return self._set(localSteps=value)

    def setMaxSequenceLength(self, value: int) -> Self:
        return self._set(maxSequenceLength=value)

    def setSeed(self, value: int) -> Self:
        return self._set(seed=value)

    def setVerbose(self, value: int) -> Self:
        return self._set(verbose=value)
