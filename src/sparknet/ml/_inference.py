"""Batch inference on the executors, through Arrow.

The fitted network travels once as a Spark broadcast (its JSON architecture, its flat
parameter vector and its layers' flat state: BatchNormalization's running statistics);
each Python worker rebuilds it on first use and keeps it in a module-global cache, so
later batches, tasks and ``transform`` calls on that worker reuse it.  Rows arrive as
Arrow record batches (``spark.sql.execution.arrow.maxRecordsPerBatch`` rows, 10,000 by
default) of one flat ``array<float>`` column; the features of a whole batch become one
``(rows, *input_shape)`` array without a Python loop over rows, go through the network in
chunks of ``batch_size`` rows, and the outputs return as Arrow list arrays built from the
flat result buffers.
"""
from __future__ import annotations

import json
import threading
from collections import OrderedDict
from typing import TYPE_CHECKING, Any, Callable, Iterator, Sequence, Union

import numpy as np
import pyarrow as pa

if TYPE_CHECKING:
    from pyspark.sql.types import StructType

    from sparknet.cluster.engine.base import Shipped
    from sparknet.model import Sequential

#: model key -> the rebuilt network, most recently used last (a few per worker).
_CACHE: OrderedDict[str, Sequential] = OrderedDict()
_CACHE_SIZE = 4
#: what the broadcast holds: the architecture as JSON text, the flat parameters, the flat state
#: and the user's own layer classes, pickled (b"" when none)
ShippedNetwork = tuple[str, np.ndarray, np.ndarray, bytes]
_LOCK = threading.Lock()


def built_shape(shape: tuple[int, ...] | None) -> tuple[int, ...]:
    """A built network's input or output shape (None, for an unbuilt one, raises)."""
    if shape is None:
        raise ValueError("the network is not built (it has no input shape yet)")
    return shape


def _cached_model(key: str, bc: Shipped) -> Sequential:
    with _LOCK:
        model = _CACHE.get(key)
        if model is not None:
            _CACHE.move_to_end(key)
            return model
    from sparknet.cluster.engine import layer_classes
    from sparknet.model import Sequential

    config, params, state, classes = bc.value
    layer_classes.register(classes)
    model = Sequential.from_config(json.loads(config))
    model.set_params(params)
    model.set_state(state)
    with _LOCK:
        _CACHE[key] = model
        while len(_CACHE) > _CACHE_SIZE:
            _CACHE.popitem(last=False)
    return model


def _list_array(values: np.ndarray) -> pa.ListArray:
    """``(n, k)`` float64 -> an Arrow ``list<double>`` array without a row loop."""
    n, k = values.shape
    offsets = pa.array(np.arange(0, n * k + 1, k, dtype=np.int32))
    return pa.ListArray.from_arrays(offsets, pa.array(values.reshape(-1)))


def dense_vectors(values: np.ndarray) -> pa.StructArray:
    """``(n, k)`` float64 -> Arrow in the layout of Spark ML's ``VectorUDT``
    (``struct<type: tinyint, size: int, indices: array<int>, values: array<double>>``,
    type 1 = dense), so the JVM reads the column as ML Vectors without a conversion
    function per row."""
    n = values.shape[0]
    return pa.StructArray.from_arrays(
        [pa.array(np.ones(n, dtype=np.int8)), pa.nulls(n, pa.int32()),
         pa.nulls(n, pa.list_(pa.int32())), _list_array(values)],
        names=["type", "size", "indices", "values"])


def output_type(classification: bool, vector_out: bool = False) -> StructType:
    """The Spark type of :class:`BatchPredictor`'s output struct."""
    from pyspark.ml.linalg import VectorUDT
    from pyspark.sql import types as T

    if classification:
        return T.StructType([T.StructField("raw", VectorUDT()), T.StructField("prob", VectorUDT()),
                             T.StructField("pred", T.DoubleType())])
    return T.StructType([T.StructField("pred", VectorUDT() if vector_out else T.DoubleType())])


def raw_prediction(logits: np.ndarray) -> np.ndarray:
    """The ``rawPrediction`` of ``(rows, classes)`` logits, MLlib's convention: for two
    classes ``[-m, m]`` with the margin ``m = z1 - z0`` (the log-odds of class 1, as
    MLlib's binary logistic regression), so ``BinaryClassificationEvaluator``, which ranks
    rows by ``rawPrediction[1]``, ranks them as the probability of class 1 does; for more
    classes the logits themselves (as MLlib's multinomial models).  Either way the
    argmax is the predicted class."""
    if logits.ndim != 2 or logits.shape[1] != 2:
        return logits
    m = logits[:, 1] - logits[:, 0]
    return np.stack([-m, m], axis=1)


def features_to_numpy(arr: Union[pa.Array, pa.ChunkedArray], dim: int, column: str) -> np.ndarray:
    """An Arrow list array of equal-length float rows -> ``(rows, dim)`` numpy (no copy
    when the values are contiguous), through the trainer's own Arrow reader.

    Raises:
        sparknet.errors.DataError: null rows, rows of another length than ``dim``, NaN or
            infinity (raised on the driver as itself: :mod:`sparknet.cluster.engine.task_errors`).
    """
    from sparknet.cluster.data.sharding import list_column
    from sparknet.errors import DataError

    info: dict[str, Any] = {}          # the reader's notes: null rows, row lengths
    x = list_column(arr, "x", info)
    if "x_null" in info:
        raise DataError(f"features column {column!r} has a null row (row {info['x_null']} of a "
                         f"batch); fill or drop it first")
    if "x_lengths" in info:
        lo, hi, _ = info["x_lengths"]
        raise DataError(f"features column {column!r} holds rows of different lengths ({lo} and "
                         f"{hi}); the network expects {dim}")
    if len(x) and x.shape[1] != dim:
        raise DataError(f"features column {column!r} has rows of {x.shape[1]} values; the network "
                         f"expects {dim}")
    if not np.isfinite(x).all():
        r = int(np.argwhere(~np.isfinite(x))[0][0])
        raise DataError(f"features column {column!r} contains NaN or infinity (row {r} of a batch)")
    return x


class BatchPredictor:
    """The function of the Arrow UDF: ``Iterator[pa.Array] -> Iterator[pa.StructArray]``.

    Args:
        key: identifies the fitted network (its cache entry on the workers).
        bc: the shipped ``(architecture JSON, flat parameters, flat layer state)``
            (:meth:`Engine.ship_to_udf <sparknet.cluster.engine.base.Engine.ship_to_udf>`:
            a broadcast on Classic, the value itself under Spark Connect).
        column: features column name (for messages).
        classification: emit ``raw``/``prob``/``pred`` (classifier) or ``pred`` (regressor).
        thresholds: MLlib's per-class thresholds (prediction = argmax of
            ``probability / threshold``), or None.
        batch_size: rows per forward pass.
        vector_out: regressor with several outputs: ``pred`` is a list, not a double.
    """

    def __init__(self, key: str, bc: Shipped | None, column: str,
                 classification: bool, thresholds: list[float] | None, batch_size: int,
                 vector_out: bool = False) -> None:
        self.key, self.bc, self.column = key, bc, column
        self.classification, self.thresholds = classification, thresholds
        self.batch_size, self.vector_out = int(batch_size), bool(vector_out)

    def forward(self, model: Sequential, x: np.ndarray) -> np.ndarray:
        """``model``'s outputs for the flat rows ``x``, as ``(rows, outputs)`` float64."""
        shape = built_shape(model.input_shape)
        int_input = bool(getattr(model.layers[0], "accepts_int_input", False))
        outs = []
        for lo in range(0, x.shape[0], self.batch_size):
            xb = x[lo:lo + self.batch_size].reshape((-1,) + shape)
            xb = xb.astype(np.int64) if int_input else np.ascontiguousarray(xb, dtype=model.dtype)
            outs.append(np.asarray(model.forward(xb, training=False), dtype=np.float64))
        k = int(np.prod(built_shape(model.output_shape)))
        return np.concatenate(outs, axis=0).reshape(-1, k) if outs else np.zeros((0, k))

    def outputs(self, model: Sequential, x: np.ndarray) -> pa.StructArray:
        """Output arrays for one batch: a StructArray."""
        from sparknet.activations import softmax

        out = self.forward(model, x)
        if not self.classification:
            if self.vector_out:
                return pa.StructArray.from_arrays([dense_vectors(out)], names=["pred"])
            return pa.StructArray.from_arrays([pa.array(out[:, 0])], names=["pred"])
        prob = softmax(out) if len(out) else out
        scores = prob if self.thresholds is None else threshold_scores(prob, self.thresholds)
        pred = scores.argmax(axis=1).astype(np.float64)
        return pa.StructArray.from_arrays([dense_vectors(raw_prediction(out)), dense_vectors(prob),
                                           pa.array(pred)],
                                          names=["raw", "prob", "pred"])

    def _worker_model(self) -> tuple[Sequential, int]:
        """On a worker: the network (rebuilt once per worker) and its flat row length."""
        from pyspark import TaskContext

        from sparknet import threads

        tc = TaskContext.get()
        threads.set_worker_threads(tc.cpus() if tc is not None else 1)
        if self.bc is None:
            raise ValueError("BatchPredictor: no broadcast network to run on the workers")
        model = _cached_model(self.key, self.bc)
        return model, int(np.prod(built_shape(model.input_shape)))

    def __call__(self, batches: Iterator[pa.Array]) -> Iterator[pa.StructArray]:
        model, dim = self._worker_model()
        for arr in batches:
            yield self.outputs(model, features_to_numpy(arr, dim, self.column))

    def records(self, batches: Iterator[pa.RecordBatch], features: str, names: Sequence[str],
                fields: Sequence[tuple[str, str]]) -> Iterator[pa.RecordBatch]:
        """The ``mapInArrow`` form (a streaming DataFrame's): each batch's columns but
        ``features`` (the flat features, added for this), named ``names``, then the output
        columns ``fields`` (``(name, field)``, ``field`` one of the output struct's)."""
        model, dim = self._worker_model()
        for batch in batches:
            i = batch.schema.get_field_index(features)
            out = self.outputs(model, features_to_numpy(batch.column(i), dim, self.column))
            keep = [j for j in range(batch.num_columns) if j != i]
            yield pa.RecordBatch.from_arrays(
                [batch.column(j) for j in keep] + [out.field(field) for _, field in fields],
                names=list(names) + [name for name, _ in fields])


def threshold_scores(prob: np.ndarray, thresholds: list[float]) -> np.ndarray:
    """MLlib's rule: ``probability / threshold``, a zero threshold winning outright."""
    t = np.asarray(thresholds, dtype=np.float64)
    with np.errstate(divide="ignore", invalid="ignore"):
        s = prob / t
    s[:, t == 0] = np.inf
    return s


def arrow_function(predictor: BatchPredictor) -> Callable[[Iterator[pa.Array]], Iterator[pa.Array]]:
    """``predictor`` as a type-hinted function, the form ``arrow_udf`` takes for an
    iterator of batches."""
    def predict_batches(batches: Iterator[pa.Array]) -> Iterator[pa.Array]:
        yield from predictor(batches)

    return predict_batches
