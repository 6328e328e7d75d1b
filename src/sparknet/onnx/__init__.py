"""ONNX export: a :class:`~sparknet.model.Sequential` as a standard ONNX graph that ONNX
Runtime (or any ONNX runtime) runs without sparknet.

:func:`export` writes the file, :func:`to_onnx` returns the ``onnx.ModelProto``.  Needs
the optional ``onnx`` package (``pip install "sparknet[onnx]"``, which also brings
``onnxruntime`` to run the file).

The graph (opset ``DEFAULT_OPSET`` = 17 unless asked otherwise):

- input ``input``: ``(batch, *model.input_shape)``, of the model's float type
  (``tensor(float)`` for float32 models, ``tensor(double)`` for float64), or int64
  token ids when the model starts with an :class:`~sparknet.layers.Embedding`;
- input ``mask`` (recurrent models, see ``mask`` below): ``(batch, T)`` of the model's
  float type, nonzero at real steps, as ``Sequential.predict_output(X, mask=...)``;
- output ``output``: ``(batch, *model.output_shape)``, what
  :meth:`~sparknet.model.Sequential.predict_output` returns (probabilities when the
  model ends in softmax).

``batch`` is a symbolic axis: any number of rows.  Only standard ``ai.onnx`` operators
are used (``Gemm``/``MatMul``, ``Conv``, ``MaxPool``/``AveragePool``, ``RNN``/``LSTM``/
``GRU`` with ``sequence_lens``, ``Gather``, ``Softmax``, ``Relu``/``Tanh``/``Sigmoid``,
``Transpose``...), and the model passes ``onnx.checker.check_model(full_check=True)``.
Stateful recurrent layers are exported starting from zero states (as after
``reset_states()``).

Each layer class has one exporter (``EXPORTERS``, filled with
:func:`register_exporter`); a model holding a layer of a class without one cannot be
exported, and :func:`to_onnx` says which layer and class.

Example::

    from sparknet.onnx import export
    export(model, "model.onnx")

    import onnxruntime as ort
    session = ort.InferenceSession("model.onnx")
    probabilities = session.run(["output"], {"input": X.astype("float32")})[0]
"""

from __future__ import annotations

import json
import os
from typing import Any, Union

import numpy as np

try:
    import onnx
    from onnx import helper
except ImportError as exc:  # the optional dependency: say which extra brings it
    raise ImportError(
        f"sparknet.onnx needs the onnx package, which is not installed ({exc}): "
        "pip install 'sparknet[onnx]' (onnx, and onnxruntime to run the "
        "files)"
    ) from exc

from sparknet.activations import FusedActivation
from sparknet.model import Sequential

# the exporter modules register their functions when imported
from sparknet.onnx import _attention, _conv, _core, _norm, _recurrent  # noqa: F401
from sparknet.onnx._builder import BATCH, DEFAULT_OPSET, INT64, MIN_OPSET, Builder, check_opset
from sparknet.onnx._registry import EXPORTERS, Exporter, export_layer, register_exporter

__all__ = [
    "export",
    "to_onnx",
    "network_graph",
    "finish",
    "EXPORTERS",
    "Exporter",
    "register_exporter",
    "Builder",
    "DEFAULT_OPSET",
    "MIN_OPSET",
]

#: a file path
PathLike = Union[str, "os.PathLike[str]"]
#: above this many bytes of weights the file keeps them beside it (``path + ".data"``):
#: a protobuf message cannot exceed 2 GiB
EXTERNAL_DATA_BYTES = 1_800_000_000


def check_model(model: Any) -> Sequential:
    """``model`` if it is a built :class:`~sparknet.model.Sequential` (what every export
    takes); ``TypeError``/``ValueError`` naming what it is otherwise."""
    if not isinstance(model, Sequential):
        raise TypeError(f"export takes a sparknet Sequential, got {type(model).__name__}")
    if not model.built or model.input_shape is None or model.output_shape is None:
        raise ValueError(
            "the model is not built yet: call fit() or build(input_shape) before exporting it"
        )
    return model


def network_graph(model: Sequential, b: Builder, x: str, logits: bool = False) -> str:
    """Add the nodes of every layer of ``model`` to ``b``, reading tensor ``x`` (of shape
    ``(batch, *model.input_shape)``); returns the output tensor, channels-last.  With
    ``logits`` a trailing softmax is left out (the graph ends in what ``model.forward``
    returns)."""
    last = model.layers[-1]
    if logits and isinstance(last, FusedActivation) and last.activation == "softmax":
        b.logits_of = last
    for layer in model.layers:
        x = export_layer(layer, b, x)
    assert model.output_shape is not None
    return b.channels_last_of(x, 1 + len(model.output_shape), "output/to_channels_last")


def finish(
    b: Builder,
    inputs: list[onnx.ValueInfoProto],
    outputs: list[tuple[str, str, onnx.ValueInfoProto]],
    name: str,
    doc: str,
    metadata: dict[str, str],
) -> onnx.ModelProto:
    """The model of ``b``'s nodes: ``outputs`` are ``(tensor, graph output name, value info)``."""
    nodes = list(b.nodes)
    for tensor, out_name, _ in outputs:
        nodes.append(
            helper.make_node(
                "Identity", [tensor], [out_name], name=b.fresh(f"{out_name}/Identity_node")
            )
        )
    graph = helper.make_graph(
        nodes, name, inputs, [vi for _, _, vi in outputs], b.initializers, doc_string=doc
    )
    opset = [helper.make_opsetid("", b.opset)]
    from sparknet import __version__

    proto = helper.make_model(
        graph,
        opset_imports=opset,
        producer_name="sparknet",
        producer_version=__version__,
        ir_version=helper.find_min_ir_version_for(opset),
        doc_string=doc,
    )
    helper.set_model_props(proto, metadata)
    return proto


def _graph(model: Sequential, opset: int, with_mask: bool) -> tuple[onnx.ModelProto, bool]:
    """The model's graph; and whether a layer read the ``mask`` input."""
    in_shape, out_shape = model._built_shapes()
    b = Builder(model.dtype, opset)
    x = b.reserve("input")
    b.reserve("output")
    int_input = model.layers[0].accepts_int_input
    inputs = [b.value_info(x, INT64 if int_input else b.elem, [BATCH, *in_shape])]
    if int_input:
        b.int_tensors.add(x)
    if with_mask:
        m = b.reserve("mask")
        inputs.append(b.value_info(m, b.elem, [BATCH, in_shape[0]]))
        b.mask = b.op(
            "Not", [b.op("Equal", [m, b.const(np.zeros((), b.dtype), "mask/zero")], "mask")], "mask"
        )
        b.mask_is_input = True
    y = network_graph(model, b, x)
    outputs = [(y, "output", b.value_info("output", b.elem, [BATCH, *out_shape]))]
    doc = (
        f"sparknet Sequential {model.name!r} ({model.dtype.name}): "
        f"input 'input' {(BATCH, *in_shape)}"
        + (f", mask 'mask' {(BATCH, in_shape[0])} (nonzero at real steps)" if with_mask else "")
        + f"; output 'output' {(BATCH, *out_shape)}, as Sequential.predict_output"
    )
    meta = {"sparknet.architecture": json.dumps(model.get_config())}
    return finish(b, inputs, outputs, model.name, doc, meta), b.mask_read


def to_onnx(
    model: Sequential, opset: int | None = None, *, mask: bool | None = None
) -> onnx.ModelProto:
    """The ONNX model of a built ``model`` (see the module docstring for its inputs and output).

    Args:
        model: a built :class:`~sparknet.model.Sequential`.
        opset: the ``ai.onnx`` opset to write, from ``MIN_OPSET`` (13) to the newest the
            installed ``onnx`` knows (default ``DEFAULT_OPSET``, 17).
        mask: give the graph a ``mask`` input.  None (default): when a recurrent layer
            would read it, that is, when the model does not make its own mask
            (:class:`~sparknet.layers.SequenceMask`, ``Embedding(mask_zero=True)``) in front
            of it; True: always (combined with the model's own mask, as in sparknet);
            False: never (every step real).

    Raises:
        TypeError: ``model`` is not a Sequential.
        ValueError: an unbuilt model, a bad ``opset`` or ``mask``, or a layer of a class
            that has no exporter (the message names the layer and its class).
    """
    if isinstance(opset, os.PathLike) or (isinstance(opset, str) and not opset.strip().isdigit()):
        where = os.fspath(opset)
        raise TypeError(
            f"to_onnx(model) returns the ONNX model and writes no file: to write "
            f"{where!r}, call sparknet.onnx.export(model, {where!r})"
        )
    model = check_model(model)
    opset = check_opset(opset)
    if mask not in (None, True, False):
        raise ValueError(f"mask must be None, True or False, got {mask!r}")
    in_shape = model._built_shapes()[0]
    has_steps = len(in_shape) >= (1 if model.layers[0].accepts_int_input else 2)
    if mask is True and not has_steps:
        raise ValueError(
            f"mask=True: the model's input (per-sample shape {in_shape}) has no time axis to mask"
        )
    proto, read = _graph(model, opset, with_mask=has_steps and mask is not False)
    if mask is None and not read:
        proto, _ = _graph(model, opset, with_mask=False)
    return proto


def save(proto: onnx.ModelProto, path: PathLike) -> None:
    """Write ``proto`` to ``path`` (its weights beside it, in ``path + ".data"``, past
    ``EXTERNAL_DATA_BYTES``) and check the file with ``onnx.checker`` (full check)."""
    path = os.fspath(path)
    folder = os.path.dirname(os.path.abspath(path))
    if not os.path.isdir(folder):
        raise ValueError(f"cannot write {path!r}: folder {folder!r} does not exist")
    big = sum(len(t.raw_data) for t in proto.graph.initializer) > EXTERNAL_DATA_BYTES
    onnx.save_model(
        proto,
        path,
        save_as_external_data=big,
        location=os.path.basename(path) + ".data" if big else None,
    )
    onnx.checker.check_model(path if big else proto, full_check=True)


def export(
    model: Sequential, path: PathLike, opset: int | None = None, *, mask: bool | None = None
) -> onnx.ModelProto:
    """Write ``model`` to ``path`` as an ONNX file (checked with
    ``onnx.checker.check_model(full_check=True)``); returns the ``ModelProto``.

    Arguments and errors as :func:`to_onnx`.
    """
    proto = to_onnx(model, opset, mask=mask)
    save(proto, path)
    return proto
