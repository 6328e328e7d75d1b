"""The ONNX graph of a fitted Spark ML Model (``exportOnnx`` of
:class:`sparknet.ml.SparkNetClassificationModel` and
:class:`~sparknet.ml.SparkNetRegressionModel`): its network behind the reshaping the Model
applies to the features column, with the Model's output columns as graph outputs."""

from __future__ import annotations

import json
from typing import Any

import numpy as np
import onnx

from sparknet.onnx import PathLike, check_model, check_opset, finish, network_graph, save
from sparknet.onnx._builder import BATCH, DOUBLE, INT64, Builder


def spark_model_to_onnx(stage: Any, opset: int | None = None) -> onnx.ModelProto:
    """The ONNX model of a fitted sparknet Spark ML Model.

    Input ``features``: ``(batch, numFeatures)`` doubles, the features column's values
    as the Model reads them (an ML Vector's values; for sequences, the padded steps each
    followed by its mask value, see :class:`~sparknet.layers.SequenceMask`).  Outputs,
    doubles, as the columns ``transform`` adds: for a classifier ``rawPrediction``
    ``(batch, numClasses)`` (the network's output before its softmax; for two classes
    ``[-m, m]`` with the margin ``m = z1 - z0``, MLlib's convention), ``probability``
    ``(batch, numClasses)`` and ``prediction`` ``(batch,)`` (argmax of the probability,
    divided by ``thresholds`` when they are set); for a regressor ``prediction``, ``(batch,)``
    for a network of one output, ``(batch, k)`` for ``k``.
    """
    # a classifier by Spark ML's own type (the sparknet classifier Model is one)
    from pyspark.ml.classification import ProbabilisticClassificationModel

    model = check_model(stage.network)
    in_shape, out_shape = model._built_shapes()
    k = int(np.prod(out_shape))
    b = Builder(model.dtype, check_opset(opset))
    feats = b.reserve("features")
    classifier = isinstance(stage, ProbabilisticClassificationModel)
    names = ["rawPrediction", "probability", "prediction"] if classifier else ["prediction"]
    for n in names:
        b.reserve(n)
    x = b.op("Reshape", [feats, b.ints([-1, *in_shape], "features/shape")], "features")
    if model.layers[0].accepts_int_input:
        x = b.cast(x, INT64, "features/ids")
        b.int_tensors.add(x)
    else:
        x = b.to_float(x, "features")
    raw = network_graph(model, b, x, logits=classifier)
    raw = b.cast(
        b.op("Reshape", [raw, b.ints([-1, k], "output/shape")], "output"), DOUBLE, "output"
    )
    outputs: list[tuple[str, str, onnx.ValueInfoProto]] = []
    if classifier:
        prob = b.op("Softmax", [raw], "probability", axis=1)
        scores = prob
        if stage.isDefined(stage.thresholds):
            t = np.asarray(stage.getThresholds(), dtype=np.float64)
            if t.shape != (k,):
                raise ValueError(f"thresholds has {t.shape[0]} values, the model has {k} classes")
            # MLlib's rule: probability / threshold, a zero threshold winning outright
            inv = np.divide(1.0, t, out=np.zeros_like(t), where=t > 0)
            scores = b.op(
                "Add",
                [
                    b.op("Mul", [prob, b.const(inv, "thresholds/inverse", np.float64)], "scores"),
                    b.const(np.where(t > 0, 0.0, np.inf), "thresholds/zero", np.float64),
                ],
                "scores",
            )
        pred = b.op("ArgMax", [scores], "prediction", axis=1, keepdims=0)
        if k == 2:  # MLlib's two-class convention: [-m, m] with the margin m = z1 - z0
            margin = np.array([[1.0, -1.0], [-1.0, 1.0]])
            margin_c = b.const(margin, "rawPrediction/margin", np.float64)
            raw = b.op("MatMul", [raw, margin_c], "rawPrediction")
        outputs = [
            (raw, "rawPrediction", b.value_info("rawPrediction", DOUBLE, [BATCH, k])),
            (prob, "probability", b.value_info("probability", DOUBLE, [BATCH, k])),
            (
                b.cast(pred, DOUBLE, "prediction"),
                "prediction",
                b.value_info("prediction", DOUBLE, [BATCH]),
            ),
        ]
    else:
        pred = (
            b.op("Reshape", [raw, b.ints([-1], "prediction/shape")], "prediction")
            if k == 1
            else raw
        )
        outputs = [
            (
                pred,
                "prediction",
                b.value_info("prediction", DOUBLE, [BATCH] + ([] if k == 1 else [k])),
            )
        ]
    n_features = int(np.prod(in_shape))
    inputs = [b.value_info(feats, DOUBLE, [BATCH, n_features])]
    doc = (
        f"sparknet {type(stage).__name__} ({model.dtype.name} network): input 'features' "
        f"{(BATCH, n_features)} doubles; outputs {', '.join(repr(n) for n in names)}, "
        f"as transform's columns"
    )
    meta = {
        "sparknet.architecture": json.dumps(model.get_config()),
        "sparknet.stage": type(stage).__name__,
    }
    return finish(b, inputs, outputs, model.name, doc, meta)


def export_spark_model(stage: Any, path: PathLike, opset: int | None = None) -> onnx.ModelProto:
    """Write :func:`spark_model_to_onnx` to ``path``, checked as by :func:`sparknet.onnx.export`."""
    proto = spark_model_to_onnx(stage, opset)
    save(proto, path)
    return proto
