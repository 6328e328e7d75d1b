"""The ``transform`` shared by sparknet's Models: the features checked and flattened, the
engine picked (:mod:`._jvm` or :mod:`._inference`'s Arrow batches), the outputs added."""
from __future__ import annotations

import json
import logging
import uuid
from typing import TYPE_CHECKING, Any, Callable, Dict, Iterator, Sequence, Tuple, Union

import numpy as np
from pyspark.ml.base import PredictionModel
from pyspark.ml.linalg import Vector

from sparknet.layers import SequenceMask
from sparknet.ml import _columns, _jvm
from sparknet.ml._inference import BatchPredictor, arrow_function, built_shape, output_type
from sparknet.ml._params import _SparkNetParams
from sparknet.ml._persistence import Persistable
from sparknet.model import History, Sequential

if TYPE_CHECKING:
    import pyarrow as pa
    from pyspark import Broadcast, SparkContext
    from pyspark.sql import Column, DataFrame, SparkSession

_log = logging.getLogger("sparknet.ml")

#: an output column: ``(name, field, metadata)``, ``field`` one of ``raw``/``prob``/``pred``
OutputSpec = Tuple[str, str, Dict[str, Any]]
#: what a single-row ``predict`` takes: an ML Vector or the row's values
FeatureVector = Union[Vector, Sequence[float], np.ndarray]


class _SparkNetModel(Persistable, _SparkNetParams, PredictionModel[FeatureVector]):
    """Transform shared by the classifier and regression models."""

    _has_network = True
    _key: str
    _bc: Broadcast[tuple[str, np.ndarray]] | None = None
    _bc_sc: SparkContext | None = None
    #: the training history of the ``fit`` that made this Model (None when loaded)
    _history: History | None = None
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
        return int(np.prod(self._input_shape()))

    def _input_shape(self) -> tuple[int, ...]:
        """The network's per-row input shape."""
        return built_shape(self.network.input_shape)

    def _output_shape(self) -> tuple[int, ...]:
        """The network's per-row output shape."""
        return built_shape(self.network.output_shape)

    def _sequence_shape(self) -> tuple[int, int] | None:
        """``(T, F)`` when the network reads sequences (a :class:`SequenceMask` first)."""
        if isinstance(self.network.layers[0], SequenceMask):
            T, F1 = self._input_shape()
            return int(T), int(F1) - 1
        return None

    def _broadcast(self, spark: SparkSession) -> Broadcast[tuple[str, np.ndarray]]:
        from sparknet.cluster.engine import is_connect

        if is_connect(spark):  # no broadcasts: the network goes with the query
            from sparknet.cluster.engine_connect import InClosure

            net = self.network
            return InClosure((json.dumps(net.get_config()), np.ascontiguousarray(net.params)))  # type: ignore[return-value]
        sc = spark.sparkContext
        if self._bc is None or self._bc_sc is not sc:
            net = self.network
            self._bc = sc.broadcast((json.dumps(net.get_config()), np.ascontiguousarray(net.params)))
            self._bc_sc = sc
        return self._bc

    def _features(self, dataset: DataFrame) -> Column:
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

    def _predictor(self, spark: SparkSession, classification: bool, thresholds: list[float] | None = None,
                   vector_out: bool = False) -> Callable[[Iterator[pa.Array]], Iterator[pa.Array]]:
        return arrow_function(BatchPredictor(
            self._key, self._broadcast(spark), self.getFeaturesCol(), classification, thresholds,
            self.getInferenceBatchSize(), vector_out))

    def _jvm_plan(self, dataset: DataFrame) -> tuple[str | None, _jvm.Plan | None]:
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

    def _score(self, dataset: DataFrame, mode: int, specs: Sequence[OutputSpec],
               thresholds: list[float] | None = None) -> DataFrame:
        """``dataset`` plus the output columns ``specs`` (``(name, field, metadata)``,
        ``field`` one of ``raw``/``prob``/``pred``), on the engine ``inferenceEngine``
        picks (kept in :attr:`lastInferenceEngine`).  ``mode``: 0 classifier, 1
        regressor with one output, 2 with several."""
        from sparknet.cluster.engine import arrow_udf_for, functions_for

        F, _ = functions_for(dataset)
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
        # the iterator type hints of ``fn`` choose the kind of UDF
        udf = arrow_udf_for(dataset, fn, output_type(mode == 0, mode == 2))
        out = dataset.withColumn(tmp, udf(feats))
        cols = [F.col(_columns.quote(c)) for c in dataset.columns]
        cols += [F.col(f"{tmp}.{field}").alias(name, metadata=meta) for name, field, meta in specs]
        return out.select(*cols)

    def _local_output(self, value: FeatureVector) -> np.ndarray:
        """The network's output for one feature vector, on the driver."""
        x = np.asarray(value.toArray() if isinstance(value, Vector) else value, dtype=np.float64)
        x = x.reshape(-1)
        if x.shape[0] != self.numFeatures:
            raise ValueError(f"got {x.shape[0]} features, the network expects {self.numFeatures}")
        p = BatchPredictor("local", None, self.getFeaturesCol(), False, None, 1)
        return p.forward(self.network, x.reshape(1, -1))[0]
