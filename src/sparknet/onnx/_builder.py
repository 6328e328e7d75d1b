"""The graph under construction: nodes, initializers, fresh names, and what the layer
exporters share (the step mask, the layout of the current tensor)."""

from __future__ import annotations

from typing import Any, Sequence

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

#: the oldest opset the exporters write (the axes of ReduceSum became an input in 13)
MIN_OPSET = 13
#: the default: LayerNormalization is a standard operator from 17 on, and ONNX Runtime
#: releases from 1.13 on run every operator written here at 17
DEFAULT_OPSET = 17
#: the batch axis of every graph input and output
BATCH = "batch"


def check_opset(opset: Any) -> int:
    """``opset`` (None: ``DEFAULT_OPSET``) checked against what the installed ``onnx`` knows."""
    if opset is None:
        return DEFAULT_OPSET
    newest = onnx.defs.onnx_opset_version()
    if (
        isinstance(opset, bool)
        or not isinstance(opset, (int, np.integer))
        or not MIN_OPSET <= int(opset) <= newest
    ):
        raise ValueError(
            f"opset must be an integer from {MIN_OPSET} to {newest} (the newest the "
            f"installed onnx {onnx.__version__} knows), got {opset!r}"
        )
    return int(opset)


class Builder:
    """Collects one graph.  Exporters add nodes with :meth:`op` and constants with
    :meth:`const`; every name they get is fresh.

    Attributes shared by the exporters while they run, layer after layer:

    - ``mask``: the name of the ``(N, T)`` bool tensor of real steps that applies to the
      current tensor, or None (every step real);
    - ``mask_is_input``: ``mask`` is the graph's ``mask`` input as given, no layer having
      made a mask of its own (see :func:`sparknet.onnx.to_onnx`'s ``mask``);
    - ``mask_read``: a layer read ``mask`` while ``mask_is_input`` held;
    - ``channels_first``: the current tensor has sparknet's last (channel) axis moved to
      axis 1, as ONNX's Conv and pools want; consecutive convolutions and pools then need
      no transposes between them.
    """

    def __init__(self, dtype: Any, opset: int) -> None:
        self.dtype = np.dtype(dtype)
        self.elem = helper.np_dtype_to_tensor_dtype(self.dtype)
        self.opset = opset
        self.nodes: list[onnx.NodeProto] = []
        self.initializers: list[onnx.TensorProto] = []
        self._used: set[str] = set()
        self.mask: str | None = None
        self.mask_is_input = False
        self.mask_read = False
        self.channels_first = False
        #: tensors of int64 token ids (the graph input of a model that starts with an Embedding)
        self.int_tensors: set[str] = set()
        #: the layer whose trailing softmax is left out (the graph then ends in logits)
        self.logits_of: object | None = None

    # -- names and nodes --------------------------------------------------------
    def fresh(self, hint: str) -> str:
        """A name no tensor of the graph has yet, built from ``hint``."""
        base = "".join(c if c.isalnum() or c in "_./" else "_" for c in hint) or "t"
        name, i = base, 1
        while name in self._used:
            i += 1
            name = f"{base}_{i}"
        self._used.add(name)
        return name

    def reserve(self, name: str) -> str:
        """Claim an exact name (a graph input or output)."""
        if name in self._used:
            raise ValueError(f"tensor name {name!r} is used twice in the graph")
        self._used.add(name)
        return name

    def op(
        self,
        op_type: str,
        inputs: Sequence[str],
        hint: str,
        outputs: int | Sequence[str] = 1,
        **attrs: Any,
    ) -> Any:
        """Add one node; returns its output name (a list of names when ``outputs`` > 1 or
        names are given).  An empty string in ``inputs`` is an omitted optional input."""
        if isinstance(outputs, int):
            names = [
                self.fresh(f"{hint}/{op_type}" + (f":{k}" if outputs > 1 else ""))
                for k in range(outputs)
            ]
        else:
            names = [n if n == "" else self.fresh(n) for n in outputs]
        self.nodes.append(
            helper.make_node(
                op_type, list(inputs), names, name=self.fresh(f"{hint}/{op_type}_node"), **attrs
            )
        )
        return names[0] if isinstance(outputs, int) and outputs == 1 else names

    def const(self, value: Any, hint: str, dtype: Any = None) -> str:
        """An initializer holding ``value`` (in the graph's float type unless ``dtype``)."""
        arr = np.array(
            value, dtype=self.dtype if dtype is None else dtype, order="C"
        )  # 0-d stays 0-d
        name = self.fresh(hint)
        self.initializers.append(numpy_helper.from_array(arr, name))
        return name

    def ints(self, values: Sequence[int], hint: str) -> str:
        """An int64 vector constant (shapes, axes, indices)."""
        return self.const(np.asarray(values, dtype=np.int64), hint, np.int64)

    # -- small compositions -----------------------------------------------------
    def reduce(
        self, op_type: str, x: str, axes: Sequence[int], hint: str, keepdims: bool = True
    ) -> str:
        """``Reduce*`` over ``axes``: an attribute before the opset that made it an input
        (13 for ReduceSum, 18 for the others)."""
        as_input = self.opset >= (13 if op_type == "ReduceSum" else 18)
        if as_input:
            return self.op(
                op_type, [x, self.ints(axes, f"{hint}/axes")], hint, keepdims=int(keepdims)
            )
        return self.op(op_type, [x], hint, axes=list(axes), keepdims=int(keepdims))

    def slice(self, x: str, axis: int, start: int, end: int, hint: str) -> str:
        """``x[..., start:end, ...]`` along ``axis``."""
        return self.op(
            "Slice",
            [
                x,
                self.ints([start], f"{hint}/starts"),
                self.ints([end], f"{hint}/ends"),
                self.ints([axis], f"{hint}/axes"),
            ],
            hint,
        )

    def unsqueeze(self, x: str, axes: Sequence[int], hint: str) -> str:
        return self.op("Unsqueeze", [x, self.ints(axes, f"{hint}/axes")], hint)

    def squeeze(self, x: str, axes: Sequence[int], hint: str) -> str:
        return self.op("Squeeze", [x, self.ints(axes, f"{hint}/axes")], hint)

    def cast(self, x: str, to: int, hint: str) -> str:
        return self.op("Cast", [x], hint, to=to)

    def to_float(self, x: str, hint: str) -> str:
        """``x`` cast to the graph's float type."""
        return self.cast(x, self.elem, hint)

    def activation(self, name: str, x: str, hint: str, axis: int = -1, layer: object = None) -> str:
        """sparknet's activation ``name`` (:mod:`sparknet.activations`) on ``x``; softmax
        over ``axis``, left out when ``layer`` is ``logits_of``."""
        if name == "identity" or (
            name == "softmax" and layer is not None and layer is self.logits_of
        ):
            return x
        ops = {"relu": "Relu", "tanh": "Tanh", "sigmoid": "Sigmoid"}
        if name in ops:
            return self.op(ops[name], [x], hint)
        if name == "softmax":
            return self.op("Softmax", [x], hint, axis=axis)
        if name in ("gelu", "gelu_tanh"):
            return self.gelu(x, hint, approximate=name == "gelu_tanh")
        if name == "silu":  # x * sigmoid(x): no SiLU operator in ai.onnx
            return self.op("Mul", [x, self.op("Sigmoid", [x], hint)], hint)
        raise ValueError(f"no ONNX operator for the activation {name!r}")

    def gelu(self, x: str, hint: str, approximate: bool) -> str:
        """GELU: the ``Gelu`` operator from opset 20, before it its definition,
        ``x / 2 * (1 + erf(x / sqrt(2)))`` or, approximated,
        ``x / 2 * (1 + tanh(sqrt(2 / pi) * (x + 0.044715 x^3)))``."""
        if self.opset >= 20:
            return self.op("Gelu", [x], hint, approximate="tanh" if approximate else "none")
        if approximate:
            cube = self.op("Mul", [self.op("Mul", [x, x], hint), x], hint)
            inner = self.op(
                "Add", [x, self.op("Mul", [cube, self.const(0.044715, f"{hint}/c")], hint)], hint
            )
            t = self.op(
                "Tanh",
                [self.op("Mul", [inner, self.const(np.sqrt(2 / np.pi), f"{hint}/k")], hint)],
                hint,
            )
        else:
            t = self.op(
                "Erf", [self.op("Mul", [x, self.const(np.sqrt(0.5), f"{hint}/k")], hint)], hint
            )
        half_x = self.op("Mul", [x, self.const(0.5, f"{hint}/half")], hint)
        return self.op(
            "Mul", [half_x, self.op("Add", [t, self.const(1.0, f"{hint}/one")], hint)], hint
        )

    # -- layout -----------------------------------------------------------------
    def channels_last_of(self, x: str, rank: int, hint: str) -> str:
        """``x`` in sparknet's layout (channels last), transposed back if it is not."""
        if not self.channels_first or rank <= 2:
            self.channels_first = False
            return x
        self.channels_first = False
        return self.op("Transpose", [x], hint, perm=[0] + list(range(2, rank)) + [1])

    def channels_first_of(self, x: str, rank: int, hint: str) -> str:
        """``x`` with its channel axis at 1 (N, C, ...), transposed if it is not; sets
        ``channels_first`` (a batch of vectors, rank 2, is both)."""
        if rank <= 2:
            self.channels_first = False
            return x
        if self.channels_first:
            return x
        self.channels_first = True
        return self.op("Transpose", [x], hint, perm=[0, rank - 1] + list(range(1, rank - 1)))

    # -- masks ------------------------------------------------------------------
    def read_mask(self) -> str | None:
        """The current step mask, for a layer that uses it (records the read)."""
        if self.mask is not None and self.mask_is_input:
            self.mask_read = True
        return self.mask

    def add_mask(self, m: str, hint: str) -> None:
        """Combine a mask a layer makes with the current one (logical and)."""
        self.mask = m if self.mask is None else self.op("And", [self.mask, m], hint)
        self.mask_is_input = False

    def value_info(self, name: str, elem: int, shape: Sequence[Any]) -> onnx.ValueInfoProto:
        return helper.make_tensor_value_info(name, elem, list(shape))


INT64 = TensorProto.INT64
INT32 = TensorProto.INT32
BOOL = TensorProto.BOOL
DOUBLE = TensorProto.DOUBLE
