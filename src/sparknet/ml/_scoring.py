"""The ``transform`` shared by sparknet's Models: the features checked and flattened, the
engine picked (:mod:`._jvm` or :mod:`._inference`'s Arrow batches), the outputs added."""
from __future__ import annotations

import functools
import json
import logging
import uuid
from typing import TYPE_CHECKING, Any, Callable, Dict, Iterator, Sequence, Tuple, Union

import numpy as np
from pyspark.ml.base import PredictionModel
from pyspark.ml.linalg import Vector

from sparknet.layers import SequenceMask
from sparknet.ml import _columns, _jvm
from sparknet.ml._inference import (
    BatchPredictor,
    ShippedNetwork,
    arrow_function,
    built_shape,
    output_type,
    raw_prediction,
)
from sparknet.ml._params import SparkNetParams
from sparknet.ml._persistence import Persistable
from sparknet.model import History, Sequential

if TYPE_CHECKING:
    import pyarrow as pa
    from pyspark import SparkContext
    from pyspark.sql import Column, DataFrame, SparkSession
    from typing_extensions import Self

    from sparknet.cluster.engine.base import Shipped

_log = logging.getLogger("sparknet.ml")

#: an output column: ``(name, field, metadata)``, ``field`` one of ``raw``/``prob``/``pred``
OutputSpec = Tuple[str, str, Dict[str, Any]]
#: what a single-row ``predict`` takes: an ML Vector or the row's values
FeatureVector = Union[Vector, Sequence[float], np.ndarray]


class SparkNetModel(Persistable, SparkNetParams, PredictionModel[FeatureVector]):
    """Transform shared by the classifier and regression models."""

    _has_network = True
    _key: str
    _bc: Shipped | None = None
    _bc_sc: SparkContext | None = None
    #: the training history of the ``fit`` that made this Model (see :attr:`history`)
    _history: History | None = None
    #: the engine the last ``transform`` used: ``"jvm"`` or ``"arrow"`` (None before one)
    lastInferenceEngine: str | None = None

    @classmethod
    def from_network(cls, network: Sequential, history: History | None = None) -> Self:
        """A Model scoring with ``network``, trained without the Estimator (by
        :class:`~sparknet.cluster.DataParallelTrainer`, on one machine, or loaded with
        :func:`sparknet.io.load_model`), its Params at their defaults (set them with
        ``copy({...})`` or the setters); it transforms, saves, exports and logs as a Model
        that ``fit`` returned.

        Args:
            network: the built :class:`~sparknet.model.Sequential` (held, not copied).
            history: the training history to keep as :attr:`history` (saved with the Model).

        Raises:
            ValueError: ``network`` is not a built Sequential.
        """
        model = cls()
        model._set_network(network)
        model._history = history
        return model

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
    def history(self) -> History | None:
        """The per-epoch metrics of the ``fit`` that made this Model, as
        :meth:`sparknet.cluster.DataParallelTrainer.fit` returns them (``loss``,
        ``accuracy``, ``time``, ``lr``, ...; ``model.history["loss"][-1]``), like MLlib's
        ``model.summary``.  Saved with the Model (its per-epoch metrics) and loaded with
        it; ``None`` for a Model saved without one."""
        return self._history

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

    def _broadcast(self, spark: SparkSession) -> Shipped:
        """The network for the scoring UDF's tasks: broadcast once per ``SparkContext``
        (Classic); without one (Spark Connect) it goes inside the UDF, shipped anew."""
        from sparknet.cluster.engine.base import engine_for

        engine = engine_for(spark, fit=False)
        sc = engine.sc
        if sc is None:
            return engine.ship_to_udf(_shipped(self.network))
        if self._bc is None or self._bc_sc is not sc:
            self._bc = engine.ship_to_udf(_shipped(self.network))
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

    def _predictor(self, spark: SparkSession, classification: bool,
                   thresholds: list[float] | None = None, vector_out: bool = False
                   ) -> Callable[[Iterator[pa.Array]], Iterator[pa.Array]]:
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
            return (f"{macs:,} multiply-adds a row: past {_jvm.AUTO_MAX_MACS:,}, "
                    f"the Arrow engine's batched kernels are faster"), planned
        return _jvm.unavailable(dataset.sparkSession), planned

    def _score(self, dataset: DataFrame, mode: int, specs: Sequence[OutputSpec],
               thresholds: list[float] | None = None) -> DataFrame:
        """``dataset`` plus the output columns ``specs`` (``(name, field, metadata)``,
        ``field`` one of ``raw``/``prob``/``pred``), on the engine ``inferenceEngine``
        picks (kept in :attr:`lastInferenceEngine`).  ``mode``: 0 classifier, 1
        regressor with one output, 2 with several."""
        from sparknet.cluster.engine.base import arrow_udf_for, functions_for

        F, _ = functions_for(dataset)
        feats = self._features(dataset)          # the schema checks, for either engine
        _jvm.quiet_task_errors(dataset.sparkSession)  # a bad row's error, raised as itself
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
        tmp = f"__sparknet_{self._key[:8]}"
        if dataset.isStreaming:
            return self._score_stream(dataset, feats, tmp, mode, specs, thresholds)
        fn = self._predictor(dataset.sparkSession, mode == 0, thresholds, vector_out=mode == 2)
        # the iterator type hints of ``fn`` choose the kind of UDF
        udf = arrow_udf_for(dataset, fn, output_type(mode == 0, mode == 2))
        out = dataset.withColumn(tmp, udf(feats))
        cols = [F.col(_columns.quote(c)) for c in dataset.columns]
        cols += [F.col(f"{tmp}.{field}").alias(name, metadata=meta) for name, field, meta in specs]
        return out.select(*cols)

    def _score_stream(self, dataset: DataFrame, feats: Column, tmp: str, mode: int,
                      specs: Sequence[OutputSpec], thresholds: list[float] | None) -> DataFrame:
        """A streaming DataFrame scored through ``mapInArrow``: the rows pass through whole,
        the output columns appended.  An Arrow UDF would not do: under Spark's default
        ``spark.sql.execution.arrow.pythonUDF.columnarInput.enabled`` a streaming query
        turns the UDF's input rows into columnar batches, which refuses any UDT column
        (the features Vector, the Vectors the UDF returns).  The columns go in under
        plain names (pyspark's ``mapInArrow`` resolves them unquoted) and come out under
        their own."""
        from pyspark.sql import types as T

        from sparknet.cluster.engine.base import functions_for

        F, _ = functions_for(dataset)

        predictor = BatchPredictor(self._key, self._broadcast(dataset.sparkSession),
                                   self.getFeaturesCol(), mode == 0, thresholds,
                                   self.getInferenceBatchSize(), mode == 2)
        types = {f.name: f.dataType for f in output_type(mode == 0, mode == 2).fields}
        schema = T.StructType(list(dataset.schema.fields) +
                              [T.StructField(name, types[field], True, meta)
                               for name, field, meta in specs])
        fields = [(name, field) for name, field, _ in specs]
        plain = [F.col(_columns.quote(c)).alias(f"c{i}") for i, c in enumerate(dataset.columns)]
        return dataset.select(*plain, feats.alias(tmp)).mapInArrow(
            functools.partial(predictor.records, features=tmp, names=dataset.columns,
                              fields=fields), schema)

    def exportOnnx(self, path: str, opset: int | None = None) -> None:
        """Write the Model as an ONNX file that scores rows as :meth:`transform` does,
        without Spark or sparknet (needs the ``onnx`` package: ``pip install
        "sparknet[onnx]"``).

        The graph's input ``features`` is ``(batch, numFeatures)`` doubles (the features
        column's values); its outputs are ``rawPrediction``, ``probability`` and
        ``prediction`` for a classifier and ``prediction`` for a regressor, doubles, as the
        columns ``transform`` adds (see :func:`sparknet.onnx._spark.spark_model_to_onnx`).

        Args:
            path: the file to write (``.onnx``).
            opset: the ``ai.onnx`` opset (default 17).
        """
        from sparknet.onnx._spark import export_spark_model
        export_spark_model(self, path, opset)

    def _local_raw(self, value: FeatureVector) -> np.ndarray:
        """The ``rawPrediction`` of one feature vector (MLlib's convention,
        :func:`~sparknet.ml._inference.raw_prediction`), on the driver."""
        return raw_prediction(self._local_output(value)[None, :])[0]

    def _local_output(self, value: FeatureVector) -> np.ndarray:
        """The network's output for one feature vector, on the driver."""
        x = np.asarray(value.toArray() if isinstance(value, Vector) else value, dtype=np.float64)
        x = x.reshape(-1)
        if x.shape[0] != self.numFeatures:
            raise ValueError(f"got {x.shape[0]} features, the network expects {self.numFeatures}")
        p = BatchPredictor("local", None, self.getFeaturesCol(), False, None, 1)
        return p.forward(self.network, x.reshape(1, -1))[0]


def _shipped(net: Sequential) -> ShippedNetwork:
    """What the executors rebuild the network from: architecture, parameters, layer state,
    and the user's own layer classes it uses (:mod:`sparknet.cluster.engine.layer_classes`)."""
    from sparknet.cluster.engine import layer_classes

    config = net.get_config()
    return (json.dumps(config), np.ascontiguousarray(net.params),
            np.ascontiguousarray(net.state), layer_classes.ship(config))
